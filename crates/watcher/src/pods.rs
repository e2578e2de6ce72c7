//! Whether a workload's new pods are healthy, as a progressive wave judges them: the pods whose
//! template carries the stamp the workload was rolled to are all Ready, and none of their
//! containers has restarted or is held by a config error.
//!
//! Plain data, tested without a client: the watcher lists the workload's pods by its selector
//! ([`crate::run`]) and hands them here. Pods of the stamp are found by the stamp annotation
//! their template gave them, so one rule serves every kind whose pods it makes; pods being
//! deleted are left out (an old replica's pods go, the new ones are judged).

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

use confighash_core::names::CHECKSUM_ANNOTATION;

/// What the new pods of a workload show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodsVerdict {
    /// Every pod of the stamp is Ready, none restarted (no pod of it at all counts as ready:
    /// a workload scaled to zero).
    Ready { pods: usize },
    /// Some are not Ready yet.
    NotReady { pods: usize, ready: usize },
    /// A pod of the stamp restarted a container, crash-loops, or cannot start for its config:
    /// what and where, for the Event.
    Failing(String),
}

/// Waiting reasons that say a container cannot run on its config, without a restart to count:
/// a missing key or object (`CreateContainerConfigError`), a command or mount the runtime
/// refused. A crash loop is counted by its restarts, and named by its reason.
const FAILING_REASONS: [&str; 4] = [
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

/// Judges the pods of the workload whose template carries `stamp`.
pub fn judge(stamp: &str, pods: &[Pod]) -> PodsVerdict {
    let mut judged = 0;
    let mut ready = 0;
    for pod in pods {
        let carries = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(CHECKSUM_ANNOTATION))
            .is_some_and(|s| s == stamp);
        if !carries || pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        judged += 1;
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let Some(status) = &pod.status else {
            continue;
        };
        if status.phase.as_deref() == Some("Failed") {
            return PodsVerdict::Failing(format!("pod {name} failed"));
        }
        let containers = status
            .init_container_statuses
            .iter()
            .chain(status.container_statuses.iter())
            .flatten();
        for c in containers {
            if let Some(why) = failing(c) {
                return PodsVerdict::Failing(format!("pod {name}: container {} {why}", c.name));
            }
        }
        let is_ready = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        if is_ready {
            ready += 1;
        }
    }
    if ready == judged {
        PodsVerdict::Ready { pods: judged }
    } else {
        PodsVerdict::NotReady {
            pods: judged,
            ready,
        }
    }
}

/// Why a container counts as failing, if it does: only fixed words and its restart count reach
/// the text, never what the container printed.
fn failing(c: &ContainerStatus) -> Option<String> {
    let waiting = c
        .state
        .as_ref()
        .and_then(|s| s.waiting.as_ref())
        .and_then(|w| w.reason.as_deref())
        .and_then(|r| FAILING_REASONS.iter().find(|known| **known == r));
    if c.restart_count > 0 {
        let times = if c.restart_count == 1 {
            "once".to_owned()
        } else {
            format!("{} times", c.restart_count)
        };
        return Some(match waiting {
            Some(reason) => format!("restarted {times} ({reason})"),
            None => format!("restarted {times}"),
        });
    }
    let exited = c
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .is_some_and(|t| t.exit_code != 0);
    match (waiting, exited) {
        (Some(reason), _) => Some(format!("is waiting: {reason}")),
        (None, true) => Some("exited with an error".to_owned()),
        (None, false) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, stamp: &str, status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": {CHECKSUM_ANNOTATION: stamp}},
            "status": status,
        }))
        .unwrap()
    }

    fn running(restarts: i32, ready: bool) -> serde_json::Value {
        json!({
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            "containerStatuses": [{"name": "app", "image": "app", "imageID": "", "ready": ready,
                "restartCount": restarts, "state": {"running": {}}}],
        })
    }

    #[test]
    fn ready_pods_of_the_stamp_are_ready_and_others_are_not_judged() {
        let pods = [
            pod("web-a", "v1:new", running(0, true)),
            pod("web-b", "v1:new", running(0, true)),
            pod("web-old", "v1:old", running(4, false)),
        ];
        assert_eq!(judge("v1:new", &pods), PodsVerdict::Ready { pods: 2 });
        assert_eq!(judge("v1:new", &[]), PodsVerdict::Ready { pods: 0 });
    }

    #[test]
    fn a_pod_not_ready_yet_is_not_ready() {
        let pods = [
            pod("web-a", "v1:new", running(0, true)),
            pod("web-b", "v1:new", json!({"phase": "Pending"})),
        ];
        assert_eq!(
            judge("v1:new", &pods),
            PodsVerdict::NotReady { pods: 2, ready: 1 }
        );
    }

    #[test]
    fn a_restart_or_a_crash_loop_fails_even_while_ready() {
        let pods = [pod("web-a", "v1:new", running(1, true))];
        assert_eq!(
            judge("v1:new", &pods),
            PodsVerdict::Failing("pod web-a: container app restarted once".into())
        );
        let looping = json!({"phase": "Running", "containerStatuses": [{"name": "app",
            "image": "app", "imageID": "", "ready": false, "restartCount": 3,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "secret words"}}}]});
        let verdict = judge("v1:new", &[pod("web-a", "v1:new", looping)]);
        assert_eq!(
            verdict,
            PodsVerdict::Failing(
                "pod web-a: container app restarted 3 times (CrashLoopBackOff)".into()
            )
        );
    }

    #[test]
    fn a_config_error_or_a_failed_exit_fails_without_a_restart() {
        let config_error = json!({"phase": "Pending", "containerStatuses": [{"name": "app",
            "image": "app", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "CreateContainerConfigError"}}}]});
        assert_eq!(
            judge("s", &[pod("p", "s", config_error)]),
            PodsVerdict::Failing(
                "pod p: container app is waiting: CreateContainerConfigError".into()
            )
        );
        let init_failed = json!({"phase": "Pending", "initContainerStatuses": [{"name": "init",
            "image": "app", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 3}}}]});
        assert_eq!(
            judge("s", &[pod("p", "s", init_failed)]),
            PodsVerdict::Failing("pod p: container init exited with an error".into())
        );
        let failed = json!({"phase": "Failed"});
        assert_eq!(
            judge("s", &[pod("p", "s", failed)]),
            PodsVerdict::Failing("pod p failed".into())
        );
        // An image that is not there yet is a wait, not a config error: the timeout judges it.
        let pulling = json!({"phase": "Pending", "containerStatuses": [{"name": "app",
            "image": "app", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff"}}}]});
        assert_eq!(
            judge("s", &[pod("p", "s", pulling)]),
            PodsVerdict::NotReady { pods: 1, ready: 0 }
        );
    }

    #[test]
    fn pods_being_deleted_are_not_judged() {
        let mut going = pod("web-a", "s", running(2, false));
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-01-01T00:00:00Z".parse().unwrap(),
            ));
        assert_eq!(judge("s", &[going]), PodsVerdict::Ready { pods: 0 });
    }
}

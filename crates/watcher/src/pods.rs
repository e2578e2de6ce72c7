//! Whether a workload's new pods are healthy, as a progressive wave judges them: the pods of
//! its current revision, those whose template carries the stamp the workload was rolled to and
//! that its controller owns, are all Ready, and none of their containers has failed since the
//! judgement began or is held by a config error.
//!
//! Plain data, tested without a client: the watcher hands the pods of the workload's namespace
//! here ([`crate::run`]). Pods of the stamp are found by the stamp annotation their template
//! gave them, so one rule serves every kind whose pods it makes, and by their controller: a
//! canary Deployment whose selector overlaps and whose template carries the same stamp is not
//! the main one. Pods being deleted are left out (an old replica's pods go, the new ones are
//! judged), and so are pods a node evicted or shut down: that is the node's doing, not the
//! config's. Only what happened since the judgement began counts: a container that restarted
//! last week, before the touch, says nothing of this change.

use std::time::SystemTime;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use confighash_core::names::CHECKSUM_ANNOTATION;
use confighash_core::workload::WorkloadKind;

/// What the new pods of a workload show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodsVerdict {
    /// Every pod of the stamp is Ready, none failed (no pod of it at all counts as ready:
    /// a workload scaled to zero).
    Ready { pods: usize },
    /// Some are not Ready yet.
    NotReady { pods: usize, ready: usize },
    /// A pod of the stamp restarted a container, crash-loops, or cannot start for its config:
    /// what and where, for the Event.
    Failing(String),
}

impl PodsVerdict {
    /// How many of the new pods are Ready.
    pub fn ready(&self) -> usize {
        match self {
            PodsVerdict::Ready { pods } => *pods,
            PodsVerdict::NotReady { ready, .. } => *ready,
            PodsVerdict::Failing(_) => 0,
        }
    }
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

/// `status.reason` of a pod that failed for its node, not for itself: the kubelet evicted it
/// under pressure, or the node shut down (graceful node shutdown).
const NODE_REASONS: [&str; 4] = ["Evicted", "Shutdown", "NodeShutdown", "Terminated"];

/// The workload whose pods are judged, as its pods' controller references name it.
#[derive(Debug, Clone, Copy)]
pub struct Owner<'a> {
    pub kind: WorkloadKind,
    pub name: &'a str,
    /// Its uid; empty when unknown (then its kind and name identify it).
    pub uid: &'a str,
}

/// The label a ReplicaSet's pods carry, with which their ReplicaSet is named after the
/// workload: `pod-template-hash` (Deployment), `rollouts-pod-template-hash` (Argo Rollout).
fn replica_set_hash_label(kind: WorkloadKind) -> Option<&'static str> {
    match kind {
        WorkloadKind::DEPLOYMENT => Some("pod-template-hash"),
        WorkloadKind::ROLLOUT => Some("rollouts-pod-template-hash"),
        _ => None,
    }
}

impl Owner<'_> {
    /// Whether `owner`'s controller owns `pod`: a Deployment's or Rollout's through the
    /// ReplicaSet it names `<name>-<pod-template-hash>`, a StatefulSet's or DaemonSet's
    /// directly. Pods of other kinds (their controllers' own objects) are not told apart.
    pub fn owns(&self, pod: &Pod) -> bool {
        let controller = pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|r| r.controller == Some(true));
        if let Some(label) = replica_set_hash_label(self.kind) {
            let Some(c) = controller.filter(|c| c.kind == "ReplicaSet") else {
                return false;
            };
            let hash = pod.metadata.labels.as_ref().and_then(|l| l.get(label));
            return hash.is_some_and(|hash| {
                c.name.len() == self.name.len() + 1 + hash.len()
                    && c.name.starts_with(self.name)
                    && c.name[self.name.len()..].starts_with('-')
                    && c.name.ends_with(hash.as_str())
            });
        }
        match self.kind {
            WorkloadKind::STATEFUL_SET | WorkloadKind::DAEMON_SET => controller.is_some_and(|c| {
                c.kind == self.kind.kind()
                    && if self.uid.is_empty() {
                        c.name == self.name
                    } else {
                        c.uid == self.uid
                    }
            }),
            _ => true,
        }
    }
}

/// Whether a Kubernetes time is at or after `since` (unknown times are not).
fn at_or_after(time: Option<&Time>, since: SystemTime) -> bool {
    time.is_some_and(|t| SystemTime::from(t.0) >= since)
}

/// Judges the pods of `owner` whose template carries `stamp`, counting only failures at or
/// after `since`: the touch, or for a judgement that did not see the touch (a new leader),
/// `--progressive-settle` before the first look.
pub fn judge(stamp: &str, owner: Owner<'_>, since: SystemTime, pods: &[Pod]) -> PodsVerdict {
    let pods: Vec<&Pod> = pods.iter().collect();
    judge_refs(stamp, owner, since, &pods)
}

/// As [`judge`], over borrowed pods (a store's, without copying them).
pub fn judge_refs(stamp: &str, owner: Owner<'_>, since: SystemTime, pods: &[&Pod]) -> PodsVerdict {
    let mut judged = 0;
    let mut ready = 0;
    for pod in pods.iter().copied() {
        let carries = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(CHECKSUM_ANNOTATION))
            .is_some_and(|s| s == stamp);
        if !carries || pod.metadata.deletion_timestamp.is_some() || !owner.owns(pod) {
            continue;
        }
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let Some(status) = &pod.status else {
            judged += 1;
            continue;
        };
        let for_its_node = status
            .reason
            .as_deref()
            .is_some_and(|r| NODE_REASONS.contains(&r));
        if status.phase.as_deref() == Some("Failed") {
            if for_its_node {
                // Its controller replaces it; the replacement is judged.
                continue;
            }
            let containers = all_containers(status);
            let lately = at_or_after(pod.metadata.creation_timestamp.as_ref(), since)
                || containers.clone().any(|c| finished_since(c, since));
            if lately {
                return PodsVerdict::Failing(format!("pod {name} failed"));
            }
            continue;
        }
        judged += 1;
        for c in all_containers(status) {
            if let Some(why) = failing(c, since) {
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

fn all_containers(
    status: &k8s_openapi::api::core::v1::PodStatus,
) -> impl Iterator<Item = &ContainerStatus> + Clone {
    status
        .init_container_statuses
        .iter()
        .chain(status.container_statuses.iter())
        .flatten()
}

/// Whether a container's last run ended at or after `since`.
fn finished_since(c: &ContainerStatus, since: SystemTime) -> bool {
    let last = c.last_state.as_ref().and_then(|s| s.terminated.as_ref());
    let now = c.state.as_ref().and_then(|s| s.terminated.as_ref());
    [last, now]
        .into_iter()
        .flatten()
        .any(|t| at_or_after(t.finished_at.as_ref(), since))
}

/// Why a container counts as failing, if it does: held by a config error now, or restarted
/// or exited with an error at or after `since` (a restart count alone is cumulative: a
/// restart before the touch says nothing of this change). Only fixed words and its restart
/// count reach the text, never what the container printed.
fn failing(c: &ContainerStatus, since: SystemTime) -> Option<String> {
    let waiting = c
        .state
        .as_ref()
        .and_then(|s| s.waiting.as_ref())
        .and_then(|w| w.reason.as_deref())
        .and_then(|r| FAILING_REASONS.iter().find(|known| **known == r));
    let last_finished = c
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .and_then(|t| t.finished_at.as_ref());
    if c.restart_count > 0 && at_or_after(last_finished, since) {
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
        .is_some_and(|t| t.exit_code != 0 && at_or_after(t.finished_at.as_ref(), since));
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

    /// Judged as for a workload of a kind whose pods are not told apart, with everything
    /// since the epoch counting.
    fn judge_any(stamp: &str, pods: &[Pod]) -> PodsVerdict {
        let owner = Owner {
            kind: WorkloadKind::CRON_JOB,
            name: "web",
            uid: "",
        };
        judge(stamp, owner, SystemTime::UNIX_EPOCH, pods)
    }

    fn pod(name: &str, stamp: &str, status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": {CHECKSUM_ANNOTATION: stamp}},
            "status": status,
        }))
        .unwrap()
    }

    /// A running pod whose last restart (if any) ended at 2026-06-01T12:00:00Z.
    fn running(restarts: i32, ready: bool) -> serde_json::Value {
        let last = if restarts > 0 {
            json!({"terminated": {"exitCode": 1, "finishedAt": "2026-06-01T12:00:00Z"}})
        } else {
            json!({})
        };
        json!({
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            "containerStatuses": [{"name": "app", "image": "app", "imageID": "", "ready": ready,
                "restartCount": restarts, "state": {"running": {}}, "lastState": last}],
        })
    }

    fn at(time: &str) -> SystemTime {
        let time: Time = serde_json::from_value(json!(time)).unwrap();
        SystemTime::from(time.0)
    }

    /// A pod of `owner_kind` `owner` (the ReplicaSet's name for a Deployment), labelled with
    /// `hash` as its `pod-template-hash`.
    fn owned(name: &str, owner_kind: &str, owner: &str, uid: &str, hash: &str) -> Pod {
        let mut p = pod(name, "s", running(0, false));
        p.metadata.labels = Some([("pod-template-hash".to_owned(), hash.to_owned())].into());
        p.metadata.owner_references = Some(vec![
            serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": owner_kind, "name": owner, "uid": uid,
                "controller": true,
            }))
            .unwrap(),
        ]);
        p
    }

    #[test]
    fn only_what_failed_since_the_touch_counts() {
        let owner = Owner {
            kind: WorkloadKind::CRON_JOB,
            name: "web",
            uid: "",
        };
        // Restarted once, at noon: a look whose judgement began after that sees nothing.
        let pods = [pod("web-a", "s", running(1, true))];
        assert_eq!(
            judge("s", owner, at("2026-06-01T12:00:01Z"), &pods),
            PodsVerdict::Ready { pods: 1 }
        );
        assert_eq!(
            judge("s", owner, at("2026-06-01T11:59:59Z"), &pods),
            PodsVerdict::Failing("pod web-a: container app restarted once".into())
        );
        // A pod the node evicted, and one that failed before: neither decides.
        let mut evicted = pod(
            "web-b",
            "s",
            json!({"phase": "Failed", "reason": "Evicted"}),
        );
        evicted.metadata.creation_timestamp =
            Some(serde_json::from_value(json!("2026-06-01T13:00:00Z")).unwrap());
        let mut old = pod("web-c", "s", json!({"phase": "Failed"}));
        old.metadata.creation_timestamp =
            Some(serde_json::from_value(json!("2026-05-01T00:00:00Z")).unwrap());
        assert_eq!(
            judge(
                "s",
                owner,
                at("2026-06-01T12:30:00Z"),
                &[evicted, old.clone()]
            ),
            PodsVerdict::Ready { pods: 0 }
        );
        assert_eq!(
            judge("s", owner, at("2026-04-01T00:00:00Z"), &[old]),
            PodsVerdict::Failing("pod web-c failed".into())
        );
    }

    #[test]
    fn only_the_workloads_own_pods_are_judged() {
        let web = Owner {
            kind: WorkloadKind::DEPLOYMENT,
            name: "web",
            uid: "uid-web",
        };
        let pods = [
            owned("web-7d9f-a", "ReplicaSet", "web-7d9f", "rs-1", "7d9f"),
            // The canary's ReplicaSet: `web-canary-7d9f`, same stamp and selector.
            owned(
                "web-canary-7d9f-b",
                "ReplicaSet",
                "web-canary-7d9f",
                "rs-2",
                "7d9f",
            ),
            // A Deployment named `web-7d9f` has ReplicaSets `web-7d9f-<hash>`.
            owned(
                "web-7d9f-11aa-c",
                "ReplicaSet",
                "web-7d9f-11aa",
                "rs-3",
                "11aa",
            ),
        ];
        let since = SystemTime::UNIX_EPOCH;
        assert_eq!(
            judge("s", web, since, &pods),
            PodsVerdict::NotReady { pods: 1, ready: 0 }
        );
        let db = Owner {
            kind: WorkloadKind::STATEFUL_SET,
            name: "db",
            uid: "uid-db",
        };
        let pods = [
            owned("db-0", "StatefulSet", "db", "uid-db", ""),
            owned("db-1", "StatefulSet", "db", "uid-of-an-older-db", ""),
            owned("other-0", "StatefulSet", "other", "uid-other", ""),
        ];
        assert_eq!(
            judge("s", db, since, &pods),
            PodsVerdict::NotReady { pods: 1, ready: 0 }
        );
    }

    #[test]
    fn ready_pods_of_the_stamp_are_ready_and_others_are_not_judged() {
        let pods = [
            pod("web-a", "v1:new", running(0, true)),
            pod("web-b", "v1:new", running(0, true)),
            pod("web-old", "v1:old", running(4, false)),
        ];
        assert_eq!(judge_any("v1:new", &pods), PodsVerdict::Ready { pods: 2 });
        assert_eq!(judge_any("v1:new", &[]), PodsVerdict::Ready { pods: 0 });
    }

    #[test]
    fn a_pod_not_ready_yet_is_not_ready() {
        let pods = [
            pod("web-a", "v1:new", running(0, true)),
            pod("web-b", "v1:new", json!({"phase": "Pending"})),
        ];
        assert_eq!(
            judge_any("v1:new", &pods),
            PodsVerdict::NotReady { pods: 2, ready: 1 }
        );
    }

    #[test]
    fn a_restart_or_a_crash_loop_fails_even_while_ready() {
        let pods = [pod("web-a", "v1:new", running(1, true))];
        assert_eq!(
            judge_any("v1:new", &pods),
            PodsVerdict::Failing("pod web-a: container app restarted once".into())
        );
        let looping = json!({"phase": "Running", "containerStatuses": [{"name": "app",
            "image": "app", "imageID": "", "ready": false, "restartCount": 3,
            "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2026-06-01T12:00:00Z"}},
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "secret words"}}}]});
        let verdict = judge_any("v1:new", &[pod("web-a", "v1:new", looping)]);
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
            judge_any("s", &[pod("p", "s", config_error)]),
            PodsVerdict::Failing(
                "pod p: container app is waiting: CreateContainerConfigError".into()
            )
        );
        let init_failed = json!({"phase": "Pending", "initContainerStatuses": [{"name": "init",
            "image": "app", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 3, "finishedAt": "2026-06-01T12:00:00Z"}}}]});
        assert_eq!(
            judge_any("s", &[pod("p", "s", init_failed)]),
            PodsVerdict::Failing("pod p: container init exited with an error".into())
        );
        let failed = json!({"phase": "Failed"});
        let mut failed = pod("p", "s", failed);
        failed.metadata.creation_timestamp =
            Some(serde_json::from_value(json!("2026-06-01T12:00:00Z")).unwrap());
        assert_eq!(
            judge_any("s", &[failed]),
            PodsVerdict::Failing("pod p failed".into())
        );
        // An image that is not there yet is a wait, not a config error: the timeout judges it.
        let pulling = json!({"phase": "Pending", "containerStatuses": [{"name": "app",
            "image": "app", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff"}}}]});
        assert_eq!(
            judge_any("s", &[pod("p", "s", pulling)]),
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
        assert_eq!(judge_any("s", &[going]), PodsVerdict::Ready { pods: 0 });
    }
}

//! How a workload's rollout stands, as its controller reports it in `status`: the verdict of
//! `kubectl rollout status` (and of `kubectl argo rollouts status` for Argo Rollouts), read from a
//! few fields of the object on every watch event.
//!
//! Plain data, tested without a client. Reading it allocates nothing and the verdict is one byte,
//! so reading it for every workload event costs little, and keeping it costs nothing: the watcher
//! acts on it only for the workloads whose rollout it follows after a touch.

use serde_json::Value;

use confighash_core::workload::WorkloadKind;

/// Where a rollout stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Not done yet: the controller has not seen the latest spec, or pods of the latest template
    /// are still being created, made ready or made available, or old ones still run.
    Rolling,
    /// Every pod runs the latest template and is available (ready, for a StatefulSet).
    Complete,
    /// The controller gave up on it: a Deployment's `Progressing` condition with reason
    /// `ProgressDeadlineExceeded`, an Argo Rollout `Degraded`.
    Stalled,
}

/// The reason of a Deployment's `Progressing` condition once its progress deadline passed.
pub const PROGRESS_DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";

/// Where the rollout of `obj`, a workload of `kind`, stands; `None` for kinds that do not roll
/// pods (CronJobs). A configured kind says "done" its own way: it is read by the conventions
/// most controllers keep, `status.observedGeneration` against `metadata.generation` and a
/// `Ready` (Knative) or `Available` condition where it has one; without `observedGeneration`
/// (a CRD whose controller writes none, or none running) `None`: it counts as done when stamped.
pub fn progress(kind: WorkloadKind, obj: &Value) -> Option<Progress> {
    let status = obj.get("status").unwrap_or(&Value::Null);
    let generation = int(obj.pointer("/metadata/generation"));
    let spec_replicas = obj
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let count = |field: &str| int(status.get(field));
    let rolling_unless = |done: bool| {
        if done {
            Progress::Complete
        } else {
            Progress::Rolling
        }
    };
    Some(match kind {
        WorkloadKind::CRON_JOB => return None,
        // kubectl's DeploymentStatusViewer.
        WorkloadKind::DEPLOYMENT => {
            if generation > count("observedGeneration") {
                Progress::Rolling
            } else if condition(status, "Progressing")
                .is_some_and(|c| text(c.get("reason")) == PROGRESS_DEADLINE_EXCEEDED)
            {
                Progress::Stalled
            } else {
                let updated = count("updatedReplicas");
                rolling_unless(
                    updated >= spec_replicas
                        && count("replicas") <= updated
                        && count("availableReplicas") >= updated,
                )
            }
        }
        // kubectl's StatefulSetStatusViewer (RollingUpdate only: OnDelete is not followed).
        WorkloadKind::STATEFUL_SET => {
            let observed = count("observedGeneration");
            if observed == 0 || generation > observed || count("readyReplicas") < spec_replicas {
                Progress::Rolling
            } else {
                let partition = obj
                    .pointer("/spec/updateStrategy/rollingUpdate/partition")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                let updated = count("updatedReplicas");
                if partition > 0 {
                    rolling_unless(updated >= spec_replicas - partition)
                } else {
                    rolling_unless(
                        updated >= spec_replicas
                            && text(status.get("updateRevision"))
                                == text(status.get("currentRevision")),
                    )
                }
            }
        }
        // kubectl's DaemonSetStatusViewer.
        WorkloadKind::DAEMON_SET => {
            let desired = count("desiredNumberScheduled");
            rolling_unless(
                generation <= count("observedGeneration")
                    && count("updatedNumberScheduled") >= desired
                    && count("numberAvailable") >= desired,
            )
        }
        // Argo Rollouts: `status.phase` for the generation it has observed (a string there).
        WorkloadKind::ROLLOUT => {
            if generation > count("observedGeneration") {
                Progress::Rolling
            } else {
                match status.get("phase").and_then(Value::as_str) {
                    Some("Healthy") => Progress::Complete,
                    Some("Degraded") => Progress::Stalled,
                    Some(_) => Progress::Rolling,
                    // Releases before `phase`: the conditions say the same.
                    None => {
                        let is_true = |type_: &str| {
                            condition(status, type_)
                                .is_some_and(|c| text(c.get("status")) == "True")
                        };
                        if condition(status, "Progressing")
                            .is_some_and(|c| text(c.get("reason")) == PROGRESS_DEADLINE_EXCEEDED)
                        {
                            Progress::Stalled
                        } else {
                            rolling_unless(is_true("Healthy") || is_true("Completed"))
                        }
                    }
                }
            }
        }
        // Configured kinds.
        _ => {
            let observed = status.get("observedGeneration")?;
            if generation > int(Some(observed)) {
                Progress::Rolling
            } else {
                match condition(status, "Ready").or_else(|| condition(status, "Available")) {
                    Some(c) => rolling_unless(text(c.get("status")) == "True"),
                    None => Progress::Complete,
                }
            }
        }
    })
}

/// Whether an Argo Rollout waits at a canary `pause` step, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pause {
    /// Not paused at a step.
    None,
    /// At a step `pause: {duration: ...}`: part of its rollout, which goes on by itself.
    Timed,
    /// At a step `pause: {}`: it waits for a person to promote it, however long.
    Indefinite,
}

/// Where an Argo Rollout stands against the pause steps of its canary strategy: paused by its
/// controller (`status.pauseConditions` with reason `CanaryPauseStep`) at the step
/// `status.currentStepIndex`, whose `pause` has a `duration` or not. Other kinds: never.
pub fn pause(kind: WorkloadKind, obj: &Value) -> Pause {
    if kind != WorkloadKind::ROLLOUT {
        return Pause::None;
    }
    let status = obj.get("status").unwrap_or(&Value::Null);
    let at_step = status
        .get("pauseConditions")
        .and_then(Value::as_array)
        .is_some_and(|c| c.iter().any(|c| text(c.get("reason")) == "CanaryPauseStep"));
    if !at_step {
        return Pause::None;
    }
    let step = status
        .get("currentStepIndex")
        .and_then(Value::as_u64)
        .and_then(|i| usize::try_from(i).ok())
        .and_then(|i| {
            obj.pointer("/spec/strategy/canary/steps")?
                .as_array()?
                .get(i)
        });
    let duration = step
        .and_then(|s| s.pointer("/pause/duration"))
        .is_some_and(|d| match d {
            Value::String(s) => !s.is_empty(),
            Value::Number(_) => true,
            _ => false,
        });
    if duration {
        Pause::Timed
    } else {
        Pause::Indefinite
    }
}

/// An integer field: a JSON number, or a string of digits (Argo Rollouts' `observedGeneration`);
/// 0 when absent or anything else.
fn int(v: Option<&Value>) -> i64 {
    match v {
        Some(Value::Number(n)) => n.as_i64().unwrap_or(0),
        Some(Value::String(s)) => s.parse().unwrap_or(0),
        _ => 0,
    }
}

fn text(v: Option<&Value>) -> &str {
    v.and_then(Value::as_str).unwrap_or_default()
}

/// The status condition of `type_`, if any.
fn condition<'v>(status: &'v Value, type_: &str) -> Option<&'v Value> {
    status
        .get("conditions")?
        .as_array()?
        .iter()
        .find(|c| text(c.get("type")) == type_)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(spec: Value, generation: i64, status: Value) -> Value {
        json!({"metadata": {"name": "web", "generation": generation}, "spec": spec, "status": status})
    }

    fn deployment(status: Value) -> Value {
        object(json!({"replicas": 3}), 2, status)
    }

    #[test]
    fn an_argo_rollout_at_a_pause_step_waits_for_its_duration_or_for_a_person() {
        let steps = json!({"strategy": {"canary": {"steps": [
            {"setWeight": 20}, {"pause": {"duration": "10m"}}, {"setWeight": 50}, {"pause": {}}
        ]}}});
        let at = |index: u64, reason: &str| {
            let status = json!({"phase": "Paused", "currentStepIndex": index,
                "pauseConditions": [{"reason": reason, "startTime": "2026-06-01T12:00:00Z"}]});
            pause(WorkloadKind::ROLLOUT, &object(steps.clone(), 1, status))
        };
        assert_eq!(at(1, "CanaryPauseStep"), Pause::Timed);
        assert_eq!(at(3, "CanaryPauseStep"), Pause::Indefinite);
        assert_eq!(at(1, "InconclusiveAnalysis"), Pause::None);
        let running = object(
            steps,
            1,
            json!({"phase": "Progressing", "currentStepIndex": 2}),
        );
        assert_eq!(pause(WorkloadKind::ROLLOUT, &running), Pause::None);
        assert_eq!(
            pause(
                WorkloadKind::DEPLOYMENT,
                &deployment(json!({"pauseConditions": [
                {"reason": "CanaryPauseStep"}]}))
            ),
            Pause::None
        );
    }

    #[test]
    fn a_configured_kind_is_read_by_observed_generation_and_its_ready_condition() {
        let service = confighash_core::workload::WorkloadKind::parse(
            "serving.knative.dev/v1/Service=/spec/template",
        )
        .unwrap();
        let at = |status: Value| progress(service, &object(json!({}), 3, status));
        assert_eq!(
            at(json!(null)),
            None,
            "no controller writes its status: by the stamp"
        );
        assert_eq!(at(json!({"conditions": []})), None);
        assert_eq!(
            at(json!({"observedGeneration": 2})),
            Some(Progress::Rolling)
        );
        assert_eq!(
            at(json!({"observedGeneration": 3})),
            Some(Progress::Complete)
        );
        let ready = |s: &str| json!({"observedGeneration": 3, "conditions": [{"type": "Ready", "status": s}]});
        assert_eq!(at(ready("True")), Some(Progress::Complete));
        assert_eq!(at(ready("False")), Some(Progress::Rolling));
        assert_eq!(at(ready("Unknown")), Some(Progress::Rolling));
        let available = json!({"observedGeneration": 3,
            "conditions": [{"type": "Available", "status": "False"}]});
        assert_eq!(at(available), Some(Progress::Rolling));
    }

    #[test]
    fn a_deployment_is_complete_once_every_replica_is_updated_and_available() {
        let at = |status: Value| progress(WorkloadKind::DEPLOYMENT, &deployment(status));
        assert_eq!(at(json!(null)), Some(Progress::Rolling), "no status yet");
        let done = json!({"observedGeneration": 2, "replicas": 3, "updatedReplicas": 3,
                          "availableReplicas": 3});
        assert_eq!(at(done.clone()), Some(Progress::Complete));
        let mut unobserved = done.clone();
        unobserved["observedGeneration"] = json!(1);
        assert_eq!(
            at(unobserved),
            Some(Progress::Rolling),
            "the new spec not seen"
        );
        let mut old_left = done.clone();
        old_left["replicas"] = json!(4);
        assert_eq!(
            at(old_left),
            Some(Progress::Rolling),
            "an old pod still runs"
        );
        let mut unavailable = done.clone();
        unavailable["availableReplicas"] = json!(2);
        assert_eq!(at(unavailable), Some(Progress::Rolling));
        let mut partly = done;
        partly["updatedReplicas"] = json!(2);
        assert_eq!(at(partly), Some(Progress::Rolling));
        // No spec.replicas: one.
        let single = object(
            json!({}),
            1,
            json!({"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                   "availableReplicas": 1}),
        );
        assert_eq!(
            progress(WorkloadKind::DEPLOYMENT, &single),
            Some(Progress::Complete)
        );
    }

    #[test]
    fn a_deployment_past_its_progress_deadline_is_stalled() {
        let status = json!({"observedGeneration": 2, "replicas": 4, "updatedReplicas": 1,
        "availableReplicas": 3, "conditions": [
            {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
            {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"},
        ]});
        assert_eq!(
            progress(WorkloadKind::DEPLOYMENT, &deployment(status.clone())),
            Some(Progress::Stalled)
        );
        // Of an older generation: the new spec is not judged yet.
        let mut old = status;
        old["observedGeneration"] = json!(1);
        assert_eq!(
            progress(WorkloadKind::DEPLOYMENT, &deployment(old)),
            Some(Progress::Rolling)
        );
    }

    #[test]
    fn a_stateful_set_is_complete_once_its_revisions_agree_and_replicas_are_ready() {
        let sts = |status: Value| {
            progress(
                WorkloadKind::STATEFUL_SET,
                &object(json!({"replicas": 2}), 3, status),
            )
        };
        let done = json!({"observedGeneration": 3, "replicas": 2, "readyReplicas": 2,
            "updatedReplicas": 2, "currentRevision": "web-2", "updateRevision": "web-2"});
        assert_eq!(sts(done.clone()), Some(Progress::Complete));
        let mut rolling = done.clone();
        rolling["currentRevision"] = json!("web-1");
        assert_eq!(sts(rolling), Some(Progress::Rolling));
        let mut unready = done.clone();
        unready["readyReplicas"] = json!(1);
        assert_eq!(sts(unready), Some(Progress::Rolling));
        let mut unobserved = done;
        unobserved["observedGeneration"] = json!(2);
        assert_eq!(sts(unobserved), Some(Progress::Rolling));
        // A partition: done once the pods above it are updated.
        let partitioned = object(
            json!({"replicas": 4, "updateStrategy": {"type": "RollingUpdate",
                   "rollingUpdate": {"partition": 2}}}),
            3,
            json!({"observedGeneration": 3, "replicas": 4, "readyReplicas": 4,
                   "updatedReplicas": 2, "currentRevision": "web-1", "updateRevision": "web-2"}),
        );
        assert_eq!(
            progress(WorkloadKind::STATEFUL_SET, &partitioned),
            Some(Progress::Complete)
        );
    }

    #[test]
    fn a_daemon_set_is_complete_once_every_node_runs_an_available_updated_pod() {
        let ds = |status: Value| progress(WorkloadKind::DAEMON_SET, &object(json!({}), 5, status));
        let done = json!({"observedGeneration": 5, "desiredNumberScheduled": 3,
                          "updatedNumberScheduled": 3, "numberAvailable": 3});
        assert_eq!(ds(done.clone()), Some(Progress::Complete));
        let mut updating = done.clone();
        updating["updatedNumberScheduled"] = json!(2);
        assert_eq!(ds(updating), Some(Progress::Rolling));
        let mut unavailable = done.clone();
        unavailable["numberAvailable"] = json!(2);
        assert_eq!(ds(unavailable), Some(Progress::Rolling));
        let mut unobserved = done;
        unobserved["observedGeneration"] = json!(4);
        assert_eq!(ds(unobserved), Some(Progress::Rolling));
    }

    #[test]
    fn an_argo_rollout_is_judged_by_its_phase_for_the_observed_generation() {
        let rollout = |status: Value| {
            progress(
                WorkloadKind::ROLLOUT,
                &object(json!({"replicas": 2}), 7, status),
            )
        };
        // Argo Rollouts writes observedGeneration as a string.
        for (phase, expected) in [
            ("Healthy", Progress::Complete),
            ("Degraded", Progress::Stalled),
            ("Progressing", Progress::Rolling),
            ("Paused", Progress::Rolling),
        ] {
            let status = json!({"observedGeneration": "7", "phase": phase});
            assert_eq!(rollout(status), Some(expected), "{phase}");
        }
        assert_eq!(
            rollout(json!({"observedGeneration": "6", "phase": "Healthy"})),
            Some(Progress::Rolling),
            "healthy, but of the generation before"
        );
        // Without a phase, the conditions.
        assert_eq!(
            rollout(json!({"observedGeneration": 7, "conditions": [
                {"type": "Healthy", "status": "True"}]})),
            Some(Progress::Complete)
        );
        assert_eq!(
            rollout(json!({"observedGeneration": 7, "conditions": [
                {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]})),
            Some(Progress::Stalled)
        );
    }

    #[test]
    fn a_cron_job_has_no_rollout() {
        assert_eq!(
            progress(WorkloadKind::CRON_JOB, &object(json!({}), 1, json!({}))),
            None
        );
    }
}

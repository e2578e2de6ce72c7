//! How each rollout ended: after a touch that a config change caused, the leader follows the
//! workload through the watch it already has, until its controller reports the rollout complete
//! or stalled, and records that on the workload as an Event.
//!
//! Only what this needs is kept, and only for the rollouts followed: the touch's stamp, what
//! changed and when, and a deadline. Where a rollout stands comes with every watch event of the
//! workload ([`WorkloadEntry::rollout`], one byte read from its `status`), and is looked at only
//! for the workloads in [`Rollouts`].
//!
//! - The watch events of the workload that carry the touch's stamp judge it: `Complete` records
//!   a Normal `RolloutComplete`, `Stalled` (a Deployment past its progress deadline, an Argo
//!   Rollout `Degraded`) a Warning `RolloutStalled`. Events that carry another stamp and come
//!   before the touch's own are older than it and ignored; one that comes after it is a newer
//!   write of the template (another touch, an update): the followed rollout was superseded.
//! - A StatefulSet or a DaemonSet, whose controllers report no failure, that is not complete
//!   within `--rollout-timeout` of the touch gets `RolloutStalled`. A Deployment or an Argo
//!   Rollout is judged by its own controller (`progressDeadlineSeconds`); one that reports
//!   neither within [`FOLLOW_AT_MOST`] is let go without an Event.
//! - Touches of reconcile (stale stamps, markers) are not followed: no change is known to name.
//!   Nor are workloads whose pods do not roll by themselves (`OnDelete`, paused; a workload paused
//!   while followed is let go), nor CronJobs, which have no rollout.
//! - A workload deleted while followed (its namespace terminating included) is let go without an
//!   Event; a new touch of it replaces what was followed, so the Event names the newest change.
//! - Only the leader follows. A replica that stops leading lets go of everything: a new leader
//!   does not know what the old one followed, and records no outcome for those rollouts.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::runtime::events::EventType;

use super::{InFlight, WorkloadEvent, config_names, format_delay};
use crate::index::{WorkloadEntry, WorkloadKey};
use crate::rollout::Progress;
use confighash_core::workload::WorkloadKind;
use confighash_metrics::Metrics;

use confighash_core::names::{ROLLOUT_COMPLETE_REASON, ROLLOUT_STALLED_REASON};
/// A Deployment or an Argo Rollout whose controller reports neither completion nor a stall
/// within this of the touch is no longer followed (no Event): its controller may not be running,
/// or the rollout waits for a person (an Argo Rollout paused at a step).
pub const FOLLOW_AT_MOST: Duration = Duration::from_secs(24 * 3600);

/// A rollout the leader follows.
#[derive(Debug)]
pub(super) struct Following {
    uid: String,
    /// The stamp the touch left on the pod template.
    stamp: String,
    /// Whether the watch has shown the touch's write: before it, events with another stamp are
    /// older than the touch.
    seen: bool,
    /// What changed: `ConfigMap web-config`, ...
    what: String,
    /// When the first change behind the touch was seen on the watch, if known.
    changed_at: Option<Instant>,
    touched_at: Instant,
    /// Judged stalled (StatefulSets and DaemonSets) or let go (the others) at this time.
    deadline: Instant,
}

/// What a touch in flight has seen of its workload on the watch: the last event's stamp and
/// rollout, to judge the rollout from once the touch's result is in (the events of the write and
/// of the controller's work may come before it).
pub(super) type WatchedInFlight = (Option<String>, Option<Progress>);

/// How a followed rollout ended, as `confighash_rollouts_total{outcome}` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Complete,
    Stalled,
    /// The workload went (deleted, or its namespace terminating).
    Gone,
    /// A newer write of the template (another touch, an update) replaced what was followed.
    Superseded,
    /// Let go without an outcome: paused, no outcome reported in time, or leadership lost.
    Abandoned,
}

impl Ended {
    #[cfg(test)]
    pub const ALL: [Ended; 5] = [
        Ended::Complete,
        Ended::Stalled,
        Ended::Gone,
        Ended::Superseded,
        Ended::Abandoned,
    ];

    /// The metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            Ended::Complete => "complete",
            Ended::Stalled => "stalled",
            Ended::Gone => "gone",
            Ended::Superseded => "superseded",
            Ended::Abandoned => "abandoned",
        }
    }
}

/// The rollouts the leader follows, each until its outcome is known: a part of [`State`](super::State) that
/// owns its records. What it has to say comes out as Events for the caller to record and as
/// outcomes counted in `confighash_rollouts_total`.
pub(super) struct Rollouts {
    following: HashMap<WorkloadKey, Following>,
    /// `--rollout-timeout`.
    rollout_timeout: Duration,
    metrics: Arc<Metrics>,
}

impl Rollouts {
    pub(super) fn new(rollout_timeout: Duration, metrics: Arc<Metrics>) -> Self {
        Rollouts {
            following: HashMap::new(),
            rollout_timeout,
            metrics,
        }
    }

    /// How many rollouts are followed.
    pub(super) fn len(&self) -> usize {
        self.following.len()
    }

    /// A touch of the leader took, leaving `stamp`: follows its rollout, if a config change
    /// caused it and the workload's pods roll by themselves. It replaces what was followed of
    /// the workload.
    pub(super) fn follow(
        &mut self,
        key: &WorkloadKey,
        touch: &InFlight,
        stamp: &str,
        now: Instant,
        events: &mut Vec<WorkloadEvent>,
    ) {
        let kind = key.kind.kind();
        self.stop(key, Ended::Superseded);
        if touch.pending.changed.is_empty() || !touch.rolls_by_itself || !has_rollout(kind) {
            return;
        }
        let wait = match kind {
            WorkloadKind::STATEFUL_SET | WorkloadKind::DAEMON_SET => self.rollout_timeout,
            _ => FOLLOW_AT_MOST,
        };
        let following = Following {
            uid: touch.uid.clone(),
            stamp: stamp.to_owned(),
            seen: false,
            what: config_names(&touch.pending.changed),
            changed_at: touch.pending.seen,
            touched_at: now,
            deadline: now + wait,
        };
        tracing::debug!(workload = %key, "following its rollout");
        self.following.insert(key.clone(), following);
        if let Some((Some(seen), progress)) = &touch.watched
            && seen == stamp
        {
            self.seen(key, *progress, now, events);
        }
    }

    /// A watch event of a workload: how its followed rollout stands.
    pub(super) fn watched(
        &mut self,
        key: &WorkloadKey,
        entry: &WorkloadEntry,
        now: Instant,
        events: &mut Vec<WorkloadEvent>,
    ) {
        let Some(following) = self.following.get(key) else {
            return;
        };
        if entry.stamp.as_deref() != Some(following.stamp.as_str()) {
            if following.seen {
                // The template was written again since the touch: its rollout is not the one
                // followed any more (a new touch of ours follows its own).
                tracing::debug!(workload = %key, "its template changed again: rollout no longer followed");
                self.stop(key, Ended::Superseded);
            }
            return;
        }
        if !entry.rolls_by_itself {
            tracing::debug!(workload = %key, "paused: rollout no longer followed");
            self.stop(key, Ended::Abandoned);
            return;
        }
        self.seen(key, entry.rollout, now, events);
    }

    /// The followed rollout of `key` as an event with the touch's stamp shows it.
    fn seen(
        &mut self,
        key: &WorkloadKey,
        progress: Option<Progress>,
        now: Instant,
        events: &mut Vec<WorkloadEvent>,
    ) {
        let Some(following) = self.following.get_mut(key) else {
            return;
        };
        following.seen = true;
        match progress {
            Some(Progress::Complete) => {
                let Some(f) = self.following.remove(key) else {
                    return;
                };
                self.metrics.rollout_outcome(Ended::Complete.as_str());
                if let Some(changed_at) = f.changed_at {
                    self.metrics.observe_rollout_latency(
                        now.saturating_duration_since(changed_at).as_secs_f64(),
                    );
                }
                tracing::info!(workload = %key, changed = f.what, "rollout complete");
                let note = format!("pods now run the config of {}, {}", f.what, f.ago(now));
                events.push(WorkloadEvent {
                    workload: key.clone(),
                    uid: f.uid,
                    type_: EventType::Normal,
                    reason: ROLLOUT_COMPLETE_REASON,
                    action: "Rollout",
                    note,
                });
            }
            Some(Progress::Stalled) => {
                let Some(f) = self.following.remove(key) else {
                    return;
                };
                let why = match key.kind.kind() {
                    WorkloadKind::ROLLOUT => "the Argo Rollout is Degraded".to_owned(),
                    _ => format!(
                        "it exceeded its progress deadline ({})",
                        crate::rollout::PROGRESS_DEADLINE_EXCEEDED
                    ),
                };
                events.push(self.stalled(key, f, &why, now));
            }
            Some(Progress::Rolling) | None => {}
        }
    }

    /// The Warning `RolloutStalled` for a rollout no longer followed.
    fn stalled(&self, key: &WorkloadKey, f: Following, why: &str, now: Instant) -> WorkloadEvent {
        self.metrics.rollout_outcome(Ended::Stalled.as_str());
        tracing::warn!(workload = %key, changed = f.what, why, "rollout stalled");
        WorkloadEvent {
            workload: key.clone(),
            uid: f.uid.clone(),
            type_: EventType::Warning,
            reason: ROLLOUT_STALLED_REASON,
            action: "Rollout",
            note: format!(
                "the rollout of the config of {} ({}) stalled: {why}; pods may still run the \
                 previous config (kubectl rollout status shows where it stands)",
                f.what,
                f.ago(now),
            ),
        }
    }

    /// Rollouts whose deadline passed: StatefulSets and DaemonSets stalled, others let go.
    pub(super) fn due(&mut self, now: Instant, events: &mut Vec<WorkloadEvent>) {
        let due: Vec<WorkloadKey> = self
            .following
            .iter()
            .filter(|(_, f)| f.deadline <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            let Some(f) = self.following.remove(&key) else {
                continue;
            };
            match key.kind.kind() {
                WorkloadKind::STATEFUL_SET | WorkloadKind::DAEMON_SET => {
                    let why = format!(
                        "it is not complete {} after the touch (--rollout-timeout)",
                        format_delay(self.rollout_timeout)
                    );
                    events.push(self.stalled(&key, f, &why, now));
                }
                _ => {
                    tracing::info!(workload = %key, "no rollout outcome reported in time: no longer followed");
                    self.metrics.rollout_outcome(Ended::Abandoned.as_str());
                }
            }
        }
    }

    /// When the next followed rollout's deadline passes.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.following.values().map(|f| f.deadline).min()
    }

    /// Lets go of a workload's followed rollout, if any, counting how it ended.
    pub(super) fn stop(&mut self, key: &WorkloadKey, outcome: Ended) {
        if self.following.remove(key).is_some() {
            self.metrics.rollout_outcome(outcome.as_str());
        }
    }

    /// Lets go of the followed rollouts `drop` selects, counting them as `outcome`.
    pub(super) fn stop_all(&mut self, outcome: Ended, mut drop: impl FnMut(&WorkloadKey) -> bool) {
        let before = self.following.len();
        self.following.retain(|k, _| !drop(k));
        for _ in self.following.len()..before {
            self.metrics.rollout_outcome(outcome.as_str());
        }
    }
}

impl Following {
    /// `changed 41s earlier` (or `re-stamped ...` when the change's time is unknown).
    fn ago(&self, now: Instant) -> String {
        match self.changed_at {
            Some(at) => format!(
                "changed {} earlier",
                format_delay(now.saturating_duration_since(at))
            ),
            None => format!(
                "re-stamped {} earlier",
                format_delay(now.saturating_duration_since(self.touched_at))
            ),
        }
    }
}

/// Whether a workload kind rolls pods when its template changes (a CronJob's next Jobs just use
/// the new one).
fn has_rollout(kind: WorkloadKind) -> bool {
    kind != WorkloadKind::CRON_JOB
}

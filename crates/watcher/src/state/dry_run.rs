//! A dry run: the touches that would have been made, recorded as `WouldRoll` Events.

use super::*;

impl State {
    /// A dry run's touch: nothing is written; the stamp it would set is remembered, counted and
    /// recorded as a `WouldRoll` Event.
    pub(super) fn would_touch(&mut self, key: WorkloadKey, expected: String, pending: Pending) {
        let Some(entry) = self.workloads.get(&key) else {
            return;
        };
        let (uid, rolls_by_itself) = (entry.uid.clone(), entry.rolls_by_itself);
        let over = entry.stamp.clone();
        self.metrics.touch(Touched::WouldRoll.as_str());
        tracing::info!(workload = %key, stamp = %expected, changed = ?pending.changed,
            "dry run: would re-stamp the pod template");
        self.workload_state(&key).would_roll = Some(WouldRoll {
            stamp: expected,
            over,
        });
        self.record(would_roll(&key, &uid, &pending.changed, rolls_by_itself));
    }

    /// In a dry run, a workload as its touch would have left it: with the stamp the touch would
    /// have set (and, as the webhook would, without the marker), while it still carries the stamp
    /// it carried then. Otherwise `current` as it is.
    pub(super) fn as_if_touched<'a>(
        &'a self,
        key: &WorkloadKey,
        entry: &WorkloadEntry,
        current: Current<'a>,
    ) -> Current<'a> {
        match self
            .per_workload
            .get(key)
            .and_then(|w| w.would_roll.as_ref())
        {
            Some(would) if would.over == entry.stamp => Current {
                stamp: Some(&would.stamp),
                marker: false,
            },
            _ => current,
        }
    }

    /// Forgets what a dry run would have set on a workload that no longer carries the stamp it
    /// carried then: something else wrote it.
    pub(super) fn forget_would_roll_unless_over(
        &mut self,
        key: &WorkloadKey,
        stamp: &Option<String>,
    ) {
        if let Some(w) = self.per_workload.get_mut(key)
            && w.would_roll.as_ref().is_some_and(|w| w.over != *stamp)
        {
            w.would_roll = None;
        }
    }
}

//! Content changes, their windows, and the decisions by the core's rules.

use super::*;

impl State {
    /// A referenced object's content changed (or it appeared or went away).
    pub(super) fn content_changed(&mut self, key: ConfigKey, now: Instant) {
        // Before the first sync every object is new; reconcile compares stamps afterwards.
        // Whether the namespace is opted in is checked when the window closes: its Namespace
        // event may come later than this change, on another watch.
        if !self.is_synced() || !self.workloads.is_referenced(&key) {
            tracing::debug!(object = %key.1, namespace = key.0, synced = self.is_synced(),
                "change to an object nothing references yet, or before the first sync");
            return;
        }
        if self.namespaces.is_terminating(&key.0) {
            // Its objects are being deleted with it: no change to roll for, even with
            // `--roll-on-delete`.
            tracing::debug!(object = %key.1, namespace = key.0, "change in a terminating namespace");
            return;
        }
        self.metrics.change_seen(key.1.kind.as_str());
        match self.flaps.change(&key, now, !self.window.contains(&key)) {
            Seen::Pass => {}
            Seen::Tripped => self.flapping(&key),
            Seen::Held => {
                tracing::debug!(object = %key.1, namespace = key.0,
                    "change of a flapping object held until its interval ends");
                return;
            }
        }
        self.window.record(now, key);
    }

    /// An object started flapping: its dependents get a Warning Event, once per episode.
    pub(super) fn flapping(&mut self, key: &ConfigKey) {
        self.metrics.set_config_flapping(self.flaps.flapping());
        tracing::warn!(object = %key.1, namespace = key.0,
            threshold = self.config.flap_threshold, period = ?self.config.flap_period,
            "the object's content changes too often: its dependents roll at most once per interval");
        if !self.leader {
            return;
        }
        let note = format!(
            "{} {} changed in more than {} change windows within {}: its changes now roll this \
             workload at most once per interval (1 minute, doubling up to 15), always to its \
             latest content, until a whole interval passes with no change",
            key.1.kind.as_str(),
            key.1.name,
            self.config.flap_threshold,
            format_delay(self.config.flap_period),
        );
        let dependents: Vec<WorkloadKey> = self.workloads.dependents(key).collect();
        for workload in dependents {
            let Some(entry) = self.workloads.get(&workload) else {
                continue;
            };
            let uid = entry.uid.clone();
            self.record(WorkloadEvent {
                workload,
                uid,
                type_: EventType::Warning,
                reason: CONFIG_FLAPPING_REASON,
                action: "Restamp",
                note: note.clone(),
            });
        }
    }

    /// Ends the flap guard's intervals due by `now`: the changes held during an interval are
    /// handled now, as a window of their own that closed; objects quiet for a whole interval
    /// stop flapping.
    pub(super) fn flap_intervals_due(&mut self, now: Instant) {
        if self.flaps.next_end().is_none_or(|end| end > now) {
            return;
        }
        let (released, lifted) = self.flaps.end_due(now);
        for key in &lifted {
            tracing::info!(object = %key.1, namespace = key.0,
                "the object no longer flaps: its changes roll as usual");
        }
        self.metrics.set_config_flapping(self.flaps.flapping());
        if !released.is_empty() {
            self.window_closed(released.into_iter().collect(), None, now);
        }
    }

    /// When a touch of `key` waits for the flap guard: its pending changes are all of objects
    /// whose changes are held (none at all for a reconcile check) and it references such an
    /// object, until the first of their intervals ends. A change of another reference is not
    /// held.
    pub(super) fn held_until(&self, key: &WorkloadKey, pending: &Pending) -> Option<Instant> {
        if pending
            .changed
            .iter()
            .any(|changed| self.flaps.holds(changed).is_none())
        {
            return None;
        }
        let entry = self.workloads.get(key)?;
        entry
            .refs
            .iter()
            .filter_map(|(r, _)| self.flaps.holds(&(key.namespace.clone(), r.clone())))
            .min()
    }

    /// Compares a namespace's workloads' stamps a window from now, by reconcile's rules: it
    /// opted in (or was seen) after changes there may have been passed over.
    pub(super) fn compare_namespace(&mut self, namespace: &str, now: Instant) {
        let due = now + self.config.debounce;
        let keys: Vec<WorkloadKey> = self
            .workloads
            .iter()
            .filter(|(k, _)| k.namespace == namespace)
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            if self.decide(&key, Trigger::Reconcile).is_some() {
                self.touches.check(key, due);
            }
        }
    }

    pub(super) fn tick(&mut self, now: Instant) {
        if self.lists.reconcile_due(now) {
            self.reconcile(now);
        }
        if let Some((opened, changes)) = self.window.take_if_closed(now) {
            tracing::debug!(changes = changes.len(), "change window closed");
            self.window_closed(changes, Some(opened), now);
        }
        self.flap_intervals_due(now);
        self.waves_due(now);
        self.touch_due(now);
        if self.waves.has_dirty() {
            // Touches due just started waves (or started them over): their first batches go now.
            self.waves_due(now);
            self.touch_due(now);
        }
        let mut events = Vec::new();
        self.rollouts.due(now, &mut events);
        self.record_all(events);
        self.touches.forget_old(now);
    }

    /// Decides the stamp a workload should carry now, by the shared rules; `None` when it
    /// should not be touched. A workload whose references hold more than
    /// `--max-reference-bytes` gets a Warning Event each time it goes over.
    pub(super) fn decide(&mut self, key: &WorkloadKey, trigger: Trigger<'_>) -> Option<String> {
        if !self.handles(key) {
            return None;
        }
        let entry = self.workloads.get(key)?;
        let stamp_key = &self.key;
        let current = Current {
            stamp: entry.stamp.as_deref(),
            marker: entry.marker,
        };
        let current = self.as_if_touched(key, entry, current);
        let with_v1 = rules::needs_v1(trigger, current, stamp_key.id());
        let lookup = self.configs.lookup(
            stamp_key,
            &key.namespace,
            &entry.refs,
            with_v1,
            self.config.max_reference_bytes,
        );
        let decision = rules::decide(
            trigger,
            current,
            entry.opted_out,
            &lookup,
            stamp_key.id(),
            self.config.rules,
        );
        let stamp = if decision.changes(current) {
            decision.stamp
        } else {
            None
        };
        let too_large = match lookup {
            rules::Lookup::TooLarge { bytes } if !entry.opted_out => {
                Some((bytes, entry.uid.clone()))
            }
            _ => None,
        };
        match too_large {
            Some((bytes, uid)) => {
                let warned = &mut self.workload_state(key).warned_too_large;
                if !std::mem::replace(warned, true) {
                    self.warn_too_large(key, &uid, bytes);
                }
            }
            None => {
                if let Some(w) = self.per_workload.get_mut(key) {
                    w.warned_too_large = false;
                }
            }
        }
        stamp
    }

    /// Whether the watcher handles `key` now: it is known, its namespace (or the workload
    /// itself) opted in, and its namespace is neither being listed nor terminating.
    pub(super) fn handles(&self, key: &WorkloadKey) -> bool {
        (self.workloads.get(key)).is_some_and(|entry| {
            (self.namespaces).decides_in(&key.namespace, self.opts_in(key, entry))
        })
    }

    pub(super) fn window_closed(
        &mut self,
        changes: BTreeSet<ConfigKey>,
        seen: Option<Instant>,
        now: Instant,
    ) {
        tracing::debug!(?changes, "window");
        self.start_waves(&changes);
        let mut affected: BTreeMap<WorkloadKey, BTreeSet<ConfigKey>> = BTreeMap::new();
        for change in &changes {
            for w in self.workloads.dependents(change) {
                affected.entry(w).or_default().insert(change.clone());
            }
        }
        for (workload, why) in affected {
            // Decided once the namespace's objects are all in, when they are being listed.
            let Some(why) = self.namespaces.defer(&workload.namespace, why) else {
                continue;
            };
            if self.decide(&workload, Trigger::ConfigChange).is_none() {
                continue;
            }
            let p = self.touches.want(workload);
            p.changed.extend(why);
            p.due.get_or_insert(now);
            if p.seen.is_none() {
                p.seen = seen;
            }
        }
    }

    pub(super) fn reconcile(&mut self, now: Instant) {
        self.lists.reconciled(now);
        self.flaps.forget_old(now);
        if !self.leader {
            return;
        }
        let keys: Vec<WorkloadKey> = self.workloads.iter().map(|(k, _)| k.clone()).collect();
        let mut mismatches = 0;
        for key in keys {
            if self.decide(&key, Trigger::Reconcile).is_some() {
                mismatches += 1;
                self.touches.check(key, now);
            }
        }
        self.metrics.reconcile_mismatches(mismatches);
        if mismatches > 0 {
            tracing::info!(mismatches, "reconcile found stale stamps");
        }
    }
}

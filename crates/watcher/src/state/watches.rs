//! What the watches report: config, namespaces and workloads, as inputs to the state.

use super::*;

impl State {
    /// A ConfigMap or Secret watch's change; `scope`: the namespace of a namespace's own watch.
    pub(super) fn config_watched(
        &mut self,
        kind: ObjectKind,
        scope: Option<String>,
        change: Watched<ConfigKey, Option<StoredConfig>>,
        now: Instant,
    ) {
        match change {
            Watched::Applied(key, stored) => self.config(key, stored, now),
            Watched::Deleted(key) => self.config(key, None, now),
            Watched::Relisted(seen) => {
                let gone: Vec<ConfigKey> = self
                    .configs
                    .keys()
                    .filter(|(ns, k, _)| *k == kind && scope.as_deref().is_none_or(|s| s == *ns))
                    .map(|(ns, k, name)| {
                        (
                            ns.to_owned(),
                            confighash_core::refs::ObjectRef::new(k, name),
                        )
                    })
                    .filter(|k| !seen.contains(k))
                    .collect();
                for key in gone {
                    let before = self.configs.get(&key).map(|s| s.record);
                    self.configs.remove(&key);
                    self.waves.note_before(&key, before);
                    self.waves.object_changed(&key);
                    self.content_changed(key, now);
                }
                self.listed(Stream::from_kind(kind), scope);
            }
        }
    }

    pub(super) fn config(&mut self, key: ConfigKey, state: Option<StoredConfig>, now: Instant) {
        if !self.namespaces.keeps_configs(&key.0) {
            // Not opted in, nor any workload there: nothing of it is kept (filtered in memory).
            return;
        }
        self.namespaces.config_seen(&key);
        // What it held before: a progressive wave's members are the dependents whose stamp
        // this change changes.
        let before = (self.is_synced() && self.workloads.is_referenced(&key))
            .then(|| self.configs.get(&key).map(|s| s.record));
        let changed = match state {
            Some(s) => self.configs.upsert(key.clone(), s),
            None => self.configs.remove(&key),
        };
        self.metrics
            .set_watched(key.1.kind.as_str(), self.configs.count(key.1.kind));
        // Its wave ends when it goes, its content changes or it is no longer progressive.
        self.waves.object_changed(&key);
        if changed {
            if let Some(before) = before {
                self.waves.note_before(&key, before);
            }
            self.content_changed(key, now);
        }
    }

    /// The list of a namespace that opted in: kept aside until it ends, then what the watches
    /// have not reported since goes in, and the namespace's workloads are compared.
    pub(super) fn namespace_listed(
        &mut self,
        namespace: String,
        generation: u64,
        change: Watched<ConfigKey, Option<StoredConfig>>,
        now: Instant,
    ) {
        let Some(listed) = self.namespaces.list_showed(&namespace, generation, change) else {
            return; // More to come, or given up (opted out, or in again, since it started).
        };
        tracing::debug!(namespace, objects = listed.count, "namespace listed");
        for (key, stored) in listed.objects {
            self.configs.upsert(key, stored);
        }
        self.count_all_configs();
        self.effects.push(Effect::ReleaseMemory);
        if self.is_synced() {
            if !listed.deferred.is_empty() {
                self.window_closed(listed.deferred, None, now);
            }
            self.compare_namespace(&namespace, now);
        }
    }

    pub(super) fn namespace_watched(
        &mut self,
        change: Watched<String, NamespaceSeen>,
        now: Instant,
    ) {
        let (name, seen) = match change {
            Watched::Applied(name, seen) => (name, Some(seen)),
            Watched::Deleted(name) => (name, None),
            Watched::Relisted(seen) => {
                self.namespaces.relisted(&seen);
                self.listed(Stream::Namespaces, None);
                return;
            }
        };
        if (self.namespaces).terminates(&name, seen.is_some_and(|s| s.terminating)) {
            self.terminate(&name);
        }
        // An excluded namespace, or one outside `--watch-namespaces`, is never opted in,
        // whatever its labels say.
        let opted_in = seen.map(|s| {
            (
                s.opted_in
                    && !self.config.excluded_namespaces.contains(&name)
                    && self.config.watches(&name),
                s.at,
            )
        });
        let step = self.namespaces.seen(&name, opted_in);
        self.namespace_step(name, step, now);
    }

    /// Does what a namespace's news asks for.
    fn namespace_step(&mut self, namespace: String, step: namespaces::Step, now: Instant) {
        match step {
            namespaces::Step::Nothing => {}
            namespaces::Step::List(generation) => self.effects.push(Effect::Backfill {
                namespace,
                generation,
            }),
            namespaces::Step::Compare => {
                if self.is_synced() {
                    self.compare_namespace(&namespace, now);
                }
            }
            namespaces::Step::DropConfigs => {
                self.configs.remove_namespace(&namespace);
                self.count_all_configs();
            }
        }
    }

    /// A namespace is being deleted: what was pending there is dropped, and from now on nothing
    /// there is decided on (its workloads and config go one by one, which is no change to roll
    /// for). A touch in flight there ends without an Event or a retry.
    pub(super) fn terminate(&mut self, namespace: &str) {
        let dropped = self.touches.terminate(namespace);
        self.rollouts
            .stop_all(follow::Ended::Gone, |k| k.namespace == namespace);
        tracing::info!(
            namespace,
            dropped,
            "namespace terminating: nothing in it is touched any more"
        );
    }

    /// A workload watch's change; `scope`: the namespace of a namespace's own watch.
    pub(super) fn workload_watched(
        &mut self,
        kind: WorkloadKind,
        scope: Option<String>,
        change: Watched<WorkloadKey, Option<WorkloadEntry>>,
        now: Instant,
    ) {
        match change {
            Watched::Applied(key, Some(entry)) => {
                if let Some(known) = self.workloads.get(&key)
                    && known.uid == entry.uid
                    && (entry.generation < known.generation
                        || crate::index::older_revision(
                            &entry.resource_version,
                            &known.resource_version,
                        ))
                {
                    // Older than what is known: the watch is behind a touch's response, or a
                    // touch's response arrives after the watch delivered its controller's
                    // later status (the rollout complete before the answer was handled).
                    tracing::debug!(workload = %key, generation = entry.generation,
                        known = known.generation, resource_version = entry.resource_version,
                        "an older state of the workload; ignored");
                    return;
                }
                if entry.too_many_references
                    && self.leader
                    && !self.namespaces.is_terminating(&key.namespace)
                    && !std::mem::replace(&mut self.workload_state(&key).warned_too_many, true)
                {
                    self.warn_too_many_references(&key, &entry.uid);
                }
                self.count_if_bypassed(&key, &entry);
                self.touches.stamp_seen(&key, &entry.stamp);
                self.forget_would_roll_unless_over(&key, &entry.stamp);
                let opts_in = self.opts_in(&key, &entry);
                (self.touches).watched(&key, entry.stamp.clone(), entry.rollout);
                let mut events = Vec::new();
                self.rollouts.watched(&key, &entry, now, &mut events);
                self.record_all(events);
                self.workloads.upsert(key.clone(), entry);
                self.waves.member_changed(&key);
                self.metrics
                    .set_watched(kind.kind(), self.workloads.count_of(kind));
                self.workload_opt_in(&key, opts_in, now);
                // A workload whose stamp is stale when it arrives (its ConfigMap's event came
                // first, on another watch, and found nothing referencing it) is checked again
                // once a window has passed, by reconcile's rules.
                if self.is_synced() && self.decide(&key, Trigger::Reconcile).is_some() {
                    let due = now + self.config.debounce;
                    self.touches.check(key, due);
                }
            }
            Watched::Applied(key, None) | Watched::Deleted(key) => {
                self.waves.member_changed(&key);
                self.forget(&key);
                self.workloads.remove(&key);
                self.metrics
                    .set_watched(kind.kind(), self.workloads.count_of(kind));
                self.workload_opt_in(&key, false, now);
            }
            Watched::Relisted(seen) => {
                if scope.is_none() {
                    self.metrics.set_kind_unlistable(kind.kind(), false);
                }
                for key in self.workloads.keys_of(kind) {
                    let in_scope = scope.as_deref().is_none_or(|s| s == key.namespace);
                    if in_scope && !seen.contains(&key) {
                        self.forget(&key);
                        self.workloads.remove(&key);
                        self.workload_opt_in(&key, false, now);
                    }
                }
                self.metrics
                    .set_watched(kind.kind(), self.workloads.count_of(kind));
                self.listed(Stream::Workloads(kind), scope);
            }
        }
    }

    /// Whether a workload is handled wherever its namespace stands: labelled
    /// `confighash.dev/enabled=true`, outside the excluded namespaces.
    pub(super) fn opts_in(&self, key: &WorkloadKey, entry: &WorkloadEntry) -> bool {
        entry.opted_in
            && !self.config.excluded_namespaces.contains(&key.namespace)
            && self.config.watches(&key.namespace)
    }

    /// Records whether a workload is opted in by its label ([`namespaces::Namespaces::workload_opted_in`]).
    pub(super) fn workload_opt_in(&mut self, key: &WorkloadKey, opted_in: bool, now: Instant) {
        let step = self.namespaces.workload_opted_in(key, opted_in);
        self.namespace_step(key.namespace.clone(), step, now);
    }

    /// A watch's list is in (or there is nothing to list).
    pub(super) fn listed(&mut self, stream: Stream, scope: Option<String>) {
        if matches!(stream, Stream::ConfigMaps | Stream::Secrets) {
            // A whole list of the cluster's config passed through; only digests stay.
            self.effects.push(Effect::ReleaseMemory);
        }
        let (synced, of) = self.lists.listed(stream, scope);
        tracing::debug!(?stream, synced, of, "listed");
        self.metrics.set_synced(self.is_synced());
    }

    pub(super) fn leadership(&mut self, leader: bool, now: Instant) {
        if leader == self.leader {
            return;
        }
        self.leader = leader;
        self.metrics.set_leader(leader);
        self.waves_leadership(leader);
        if !leader {
            // A new leader does not know what this one followed.
            self.rollouts.stop_all(follow::Ended::Abandoned, |_| true);
            self.touches.leadership_lost();
        }
        if leader && self.is_synced() {
            // A new leader compares everything: changes may have passed while another replica
            // led, or none did.
            self.reconcile(now);
        }
    }

    pub(super) fn count_all_configs(&self) {
        for kind in [ObjectKind::ConfigMap, ObjectKind::Secret] {
            self.metrics
                .set_watched(kind.as_str(), self.configs.count(kind));
        }
    }

    /// Records that a workload over `--max-references` is never stamped or rolled.
    pub(super) fn warn_too_many_references(&mut self, key: &WorkloadKey, uid: &str) {
        self.record(WorkloadEvent {
            workload: key.clone(),
            uid: uid.to_owned(),
            type_: EventType::Warning,
            reason: TOO_MANY_REFERENCES_REASON,
            action: "Skip",
            note: format!(
                "it references more than {} ConfigMaps and Secrets (--max-references): \
                 confighash does not read them, stamp it or roll it on config changes",
                self.config.max_references
            ),
        });
    }

    /// Records that a workload's references hold more than `--max-reference-bytes`: it keeps
    /// its stamp (or its marker) until they shrink.
    pub(super) fn warn_too_large(&mut self, key: &WorkloadKey, uid: &str, bytes: u64) {
        tracing::warn!(workload = %key, bytes, max = self.config.max_reference_bytes,
            "the workload's references hold more than --max-reference-bytes; it is not rolled");
        self.record(WorkloadEvent {
            workload: key.clone(),
            uid: uid.to_owned(),
            type_: EventType::Warning,
            reason: REFERENCES_TOO_LARGE_REASON,
            action: "Skip",
            note: format!(
                "its ConfigMaps and Secrets hold {bytes} bytes of values, more than {} \
                 (--max-reference-bytes): confighash keeps its stamp and does not roll it until \
                 they shrink",
                self.config.max_reference_bytes
            ),
        });
    }

    /// Counts a workload that did not pass through the webhook: created in an opted-in
    /// namespace after the watcher started and the namespace opted in (with [`BYPASS_GRACE`]),
    /// or labelled `confighash.dev/enabled=true` when first seen and created after the watcher
    /// started, not opted out, and carrying neither a stamp nor the unstamped marker. Each uid
    /// once.
    pub(super) fn count_if_bypassed(&mut self, key: &WorkloadKey, entry: &WorkloadEntry) {
        if self.config.dry_run {
            // A dry run's webhook stamps nothing: every new workload would count.
            return;
        }
        let Some(grace) = self.config.bypass_grace else {
            return;
        };
        if entry.stamp.is_some() || entry.marker || entry.opted_out || entry.uid.is_empty() {
            return;
        }
        let opted_in = self.namespaces.opted_in_at(&key.namespace).or_else(|| {
            // Opted in by its own label when first seen: the webhook was called for its CREATE.
            // (A workload seen before the label was added was not stamped by the write that
            // added it, and is not counted.)
            (self.opts_in(key, entry) && self.workloads.get(key).is_none()).then_some(self.started)
        });
        let (Some(opted_in), Some(created)) = (opted_in, entry.created) else {
            return;
        };
        let counted = self.per_workload.get(key).and_then(|w| w.bypassed.as_ref());
        if counted == Some(&entry.uid) {
            return;
        }
        // creationTimestamp has whole seconds.
        let after = unix_seconds(self.started.max(opted_in) + grace);
        if created < after {
            return;
        }
        self.workload_state(key).bypassed = Some(entry.uid.clone());
        self.metrics.workload_bypassed();
        tracing::warn!(workload = %key, "an opted-in workload carries neither a stamp nor the unstamped marker: the API server did not call the webhook when it was written");
    }
}

//! Touches: pacing, the read before replacing a stamp, results, retries and their Events.

use super::*;

impl State {
    pub(super) fn touch_due(&mut self, now: Instant) {
        if !self.leader {
            // The leader does this; a replica that becomes leader reconciles, afresh.
            self.touches.not_leading();
            return;
        }
        for key in self.touches.due_in_turns(now) {
            if self.touches.is_in_flight(&key) || self.touches.is_reading(&key) {
                // Parked until its touch or read in flight is done (`Input::Touched`,
                // `Input::Rechecked`).
                if let Some(p) = self.touches.pending_mut(&key) {
                    p.due = None;
                }
                continue;
            }
            if let Some(until) = (self.touches.pending(&key)).and_then(|p| self.held_until(&key, p))
                && let Some(p) = self.touches.pending_mut(&key)
            {
                p.due = Some(until);
                continue;
            }
            if self.wave_holds(&key) {
                // Its wave releases it in its batch, with a pending touch of its own.
                self.touches.drop_pending(&key);
                continue;
            }
            // Recomputed now: the webhook or another change may already have set it.
            let trigger = match self.touches.pending(&key) {
                Some(p) if p.changed.is_empty() => Trigger::Reconcile,
                _ => Trigger::ConfigChange,
            };
            let Some(expected) = self.decide(&key, trigger) else {
                // Nothing to do any more, nor to back off from.
                self.touches.done(&key);
                continue;
            };
            // Just read afresh: decided on what was read, and that read took this touch's turn
            // of the pacer already.
            let fresh = self.touches.just_read(&key);
            let paced = if fresh {
                Ok(())
            } else {
                self.touches.pace(now, &key)
            };
            match paced {
                Ok(()) => {
                    if !fresh && let Some(configs) = self.needs_recheck(&key) {
                        self.touches.reading(&key);
                        self.effects.push(Effect::Recheck {
                            workload: key,
                            configs,
                        });
                        continue;
                    }
                    let Some(p) = self.touches.take_to_send(&key) else {
                        continue;
                    };
                    if let Some(seen) = p.seen {
                        self.metrics.observe_touch_latency(
                            now.saturating_duration_since(seen).as_secs_f64(),
                        );
                    }
                    self.waves.touch_sent(&key, now);
                    self.start_touch(key, expected, p);
                }
                Err(wait) => {
                    if let Wait::RateLimited(_) = wait {
                        self.metrics.touch_rate_limited();
                    }
                    if let Some(p) = self.touches.pending_mut(&key) {
                        p.due = Some(wait.until());
                    }
                }
            }
        }
    }

    /// The references to read afresh before a touch of `key` that would replace a stamp this
    /// watcher did not write (one the webhook computed, maybe from config newer than this
    /// watcher's copy: its watches can lag behind a drop, a 429 or a relist); `None` when the
    /// touch may go ahead: the stamp is its own, the workload has no stamp to replace, or no
    /// references to read.
    pub(super) fn needs_recheck(&self, key: &WorkloadKey) -> Option<Vec<ConfigKey>> {
        let entry = self.workloads.get(key)?;
        let stamp = entry.stamp.as_ref()?;
        if self.touches.written(key) == Some(stamp) {
            return None;
        }
        let configs: Vec<ConfigKey> = entry
            .refs
            .iter()
            .map(|(r, _)| (key.namespace.clone(), r.clone()))
            .collect();
        (!configs.is_empty()).then_some(configs)
    }

    /// The references of a workload were read afresh: what was read goes into the store (an
    /// object older than the one held is refused there), and the touch that waited is decided
    /// again at once, on what is now known.
    pub(super) fn rechecked(
        &mut self,
        key: WorkloadKey,
        result: Result<Vec<(ConfigKey, Option<StoredConfig>)>, TouchError>,
        now: Instant,
    ) {
        if !self.leader {
            self.touches.leadership_lost();
        }
        let waited = self.touches.read(&key);
        match result {
            Ok(configs) => {
                for (config, stored) in configs {
                    tracing::debug!(workload = %key, object = %config.1,
                        resource_version = stored.as_ref().map_or("(absent)", |s| &*s.resource_version),
                        held = self.configs.get(&config).map_or_else(|| "(none)".into(), |s| s.resource_version),
                        "read afresh before a touch");
                    self.config(config, stored, now);
                }
                if waited {
                    self.touches.decide_on_read(&key, now);
                }
            }
            Err(e) => {
                if !waited {
                    return;
                }
                let (TouchError::Forbidden(error) | TouchError::Other(error)) = &e;
                tracing::warn!(workload = %key, error = %error,
                    "cannot read the references afresh before a touch");
                let what = match &e {
                    TouchError::Forbidden(error) => format!(
                        "reading its ConfigMaps and Secrets was refused ({error}): confighash's \
                         RBAC must allow get on them"
                    ),
                    TouchError::Other(error) => {
                        format!("reading its ConfigMaps and Secrets failed ({error})")
                    }
                };
                let Some(entry) = self.workloads.get(&key) else {
                    return;
                };
                let failed = InFlight {
                    expected: String::new(),
                    old: entry.stamp.clone(),
                    uid: entry.uid.clone(),
                    rolls_by_itself: entry.rolls_by_itself,
                    pending: self.touches.drop_pending(&key).unwrap_or_default(),
                    watched: None,
                };
                self.retry(&key, failed, what, now);
            }
        }
    }

    pub(super) fn start_touch(&mut self, key: WorkloadKey, expected: String, pending: Pending) {
        if self.config.dry_run {
            return self.would_touch(key, expected, pending);
        }
        let Some(entry) = self.workloads.get(&key) else {
            return;
        };
        let why = what_changed(&pending.changed);
        let believed = match &entry.stamp {
            Some(stamp) => Believed::Stamp(stamp.clone()),
            None => Believed::ResourceVersion(entry.resource_version.clone()),
        };
        self.effects.push(Effect::Touch(Touch {
            workload: key.clone(),
            stamp: expected.clone(),
            why,
            attempt: self.touches.failures(&key),
            believed,
        }));
        let in_flight = InFlight {
            expected,
            old: entry.stamp.clone(),
            uid: entry.uid.clone(),
            rolls_by_itself: entry.rolls_by_itself,
            pending,
            watched: None,
        };
        self.touches.sent(key, in_flight);
    }

    /// A touch ended: judge it, back off and retry it if it did not take, and let the workload be
    /// touched again.
    pub(super) fn touched(&mut self, key: WorkloadKey, result: TouchResult, now: Instant) {
        if !self.leader {
            self.touches.leadership_lost();
        }
        let Some(touch) = self.touches.answered(&key) else {
            return;
        };
        match result {
            TouchResult::Patched(stamp)
                if stamp != touch.old || stamp.as_deref() == Some(&touch.expected) =>
            {
                self.metrics.touch(Touched::Touched.as_str());
                let wrote = stamp.as_deref() == Some(&touch.expected);
                (self.touches).took(&key, wrote.then_some(touch.expected.as_str()));
                if wrote {
                    self.waves.touch_took(&key, &touch.expected, now);
                }
                tracing::info!(
                    stamp = stamp.as_deref().unwrap_or(""),
                    sent = %touch.expected,
                    replaced = touch.old.as_deref().unwrap_or(""),
                    "touched"
                );
                self.record(config_changed(
                    &key,
                    &touch.uid,
                    &touch.pending.changed,
                    touch.rolls_by_itself,
                ));
                if let (Some(stamp), true) = (stamp.as_deref(), self.leader) {
                    let mut events = Vec::new();
                    self.rollouts.follow(&key, &touch, stamp, now, &mut events);
                    self.record_all(events);
                }
            }
            TouchResult::Patched(_) => {
                // The webhook turned the touch back: its lookup failed, it may not read the
                // references, or it decided otherwise. The write was still stored (its watch
                // event comes like any other), but the pod template did not change.
                self.metrics.touch(Touched::KeptByWebhook.as_str());
                tracing::warn!("the webhook kept the old stamp");
                let what = "the webhook kept the old stamp (it could not read the referenced \
                            ConfigMaps and Secrets, or decided otherwise), so the pod template \
                            was not changed and its pods have not rolled";
                self.retry(&key, touch, what.to_owned(), now);
            }
            TouchResult::Stale => {
                // The workload changed since the watcher last saw it (a touch by another leader,
                // a write the webhook stamped): nothing was written, no Event. The workload as
                // it is now was reported before this result, and is decided again on it.
                self.metrics.touch(Touched::Stale.as_str());
                tracing::info!(
                    "the workload no longer carried what the touch expected; deciding again"
                );
                let p = self.touches.want(key.clone());
                p.changed.extend(touch.pending.changed);
                p.seen = p.seen.or(touch.pending.seen);
                p.due = Some(now);
            }
            TouchResult::Gone => {
                self.metrics.touch(Touched::Gone.as_str());
                self.touches.end_backoff(&key);
            }
            TouchResult::Failed(e) => {
                self.metrics.touch(Touched::Error.as_str());
                let (TouchError::Forbidden(error) | TouchError::Other(error)) = &e;
                tracing::warn!(error = %error, "touch failed");
                let what = match &e {
                    TouchError::Forbidden(error) => format!(
                        "the patch was refused ({error}): confighash's RBAC must allow patch on {}",
                        api_resource(key.kind.kind()).plural
                    ),
                    TouchError::Other(error) => format!("the patch failed ({error})"),
                };
                self.retry(&key, touch, what, now);
            }
        }
        // Whatever became due meanwhile is decided now (held back by a backoff, if any).
        if let Some(p) = self.touches.pending_mut(&key) {
            p.due.get_or_insert(now);
        }
    }

    /// A touch that did not take: back off (the delay doubles with each such touch in a row, from
    /// `retry_base` up to `resync`) and try again then, for the same changes.
    pub(super) fn retry(
        &mut self,
        key: &WorkloadKey,
        failed: InFlight,
        what: String,
        now: Instant,
    ) {
        if self.namespaces.is_terminating(&key.namespace) {
            tracing::info!("not retried: its namespace is terminating");
            return;
        }
        let (failures, retry_in) = self.touches.back_off(key, failed.old, now);
        self.metrics.touch_retry();
        tracing::info!(
            failures,
            retry_in = %format_delay(retry_in),
            "retrying"
        );
        // Due at once, so held back by the backoff alone: a check a watch event asked for a
        // window from now is superseded.
        let p = self.touches.want(key.clone());
        p.due = Some(now);
        // Keep what the touch was for, so the retry is the same kind of touch (a config change
        // replaces a foreign stamp; reconcile would not) and its Event names it.
        p.changed.extend(failed.pending.changed);
        p.seen = p.seen.or(failed.pending.seen);
        self.touch_failed(key, &what, retry_in, failures, now);
    }

    /// Records a Warning Event saying what failed and when it is retried, once a workload's touch
    /// has failed [`TOUCH_FAILED_AFTER`] times in a row, at most once per [`TOUCH_FAILED_EVERY`].
    pub(super) fn touch_failed(
        &mut self,
        key: &WorkloadKey,
        what: &str,
        retry_in: Duration,
        failures: u32,
        now: Instant,
    ) {
        if failures < TOUCH_FAILED_AFTER || !self.leader {
            return;
        }
        let Some(entry) = self.workloads.get(key) else {
            return;
        };
        let uid = entry.uid.clone();
        if !self.touches.tell_failure(key, now, TOUCH_FAILED_EVERY) {
            return;
        }
        let why = match self.touches.pending(key) {
            Some(p) if !p.changed.is_empty() => format!("after {}", changed_names(&p.changed)),
            _ => "(its stamp is stale)".to_owned(),
        };
        self.record(WorkloadEvent {
            workload: key.clone(),
            uid,
            type_: EventType::Warning,
            reason: TOUCH_FAILED_REASON,
            action: "Restamp",
            note: format!(
                "re-stamping the pod template {why} failed {failures} times in a row: {what}; \
                 retrying in {}",
                format_delay(retry_in)
            ),
        });
    }

    /// Records an Event on a workload, unless its namespace is terminating (creates there are
    /// refused, and nobody is left to read it).
    pub(super) fn record(&mut self, event: WorkloadEvent) {
        if self.namespaces.is_terminating(&event.workload.namespace) {
            tracing::debug!(workload = %event.workload, reason = event.reason,
                "Event not recorded: its namespace is terminating");
            return;
        }
        self.effects.push(Effect::Event(event));
    }

    /// Records each of `events` ([`State::record`]).
    pub(super) fn record_all(&mut self, events: Vec<WorkloadEvent>) {
        for event in events {
            self.record(event);
        }
    }
}

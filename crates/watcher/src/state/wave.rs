//! Progressive waves: a content change of a ConfigMap or Secret marked
//! `confighash.dev/rollout: progressive` (or with more than `--progressive-dependents`
//! dependents) touches its dependents in batches of 1, 2, 4, 8, ..., each batch only once every
//! workload of the batches before it finished its rollout healthy.
//!
//! The wave's progress is what the cluster says, never only memory: its dependents, in the
//! order touches are made (kind, then name), and whether each one's stamp is current. The batch
//! under way is the first one holding a dependent whose stamp is not current; the workloads
//! before it (all current) are the gate. So a new leader, or a restarted one, resumes where the
//! stamps say the wave is, judging afresh the health of the workloads already rolled, and never
//! touches one whose stamp is current; a new content change makes every stamp stale again and
//! starts the wave over from the first dependent.
//!
//! Healthy, for a workload the gate holds: its rollout complete by its status
//! ([`crate::rollout`]) and its new pods (those carrying its stamp) Ready and not restarted
//! ([`crate::pods`]), still so `--progressive-settle` later (a container that crashes on its
//! config a moment after it starts can be Ready for that moment). Kinds confighash cannot
//! judge (CronJobs, configured kinds) and workloads whose pods do not roll by themselves
//! (`OnDelete`, paused) count as healthy once stamped. Unhealthy: a pod of the new stamp
//! restarted, crash-looping or held by a config error, the rollout stalled
//! (`ProgressDeadlineExceeded`, an Argo Rollout `Degraded`), or not healthy within
//! `--progressive-timeout` of its touch (or of this leader's first look at it). Then the wave
//! halts: no dependent of the object is touched for this content, a Warning `WaveHalted` is
//! recorded on the object and on the workload, and `confighash_waves_halted` counts it until
//! the object's next content change (or its deletion).
//!
//! The wave holds only the watcher's touches for the object's change, as the flap guard does:
//! a touch for the change of another, not progressive, reference goes ahead (and carries the
//! object's content with it), and the webhook stamps every other write as always. A dry run
//! has no waves: nothing it does rolls, so no batch could ever finish.

use super::*;
use crate::pods::PodsVerdict;
use confighash_core::names::WAVE_HALTED_REASON;
use confighash_core::record::ObjectRecord;

/// The default of `--progressive-timeout`.
pub const DEFAULT_PROGRESSIVE_TIMEOUT: Duration = Duration::from_secs(300);
/// The default of `--progressive-settle`.
pub const DEFAULT_PROGRESSIVE_SETTLE: Duration = Duration::from_secs(10);
/// How often the pods of a workload whose health a wave judges are looked at.
pub const WAVE_CHECK_EVERY: Duration = Duration::from_secs(3);

/// The wave of one object's content.
#[derive(Debug)]
pub(super) struct Wave {
    /// The content it rolls out: a change of it starts a new wave.
    content: ObjectRecord,
    /// The object's resourceVersion when the wave started, to name the change in Events.
    resource_version: Box<str>,
    /// Dependents the wave let the watcher touch, and when.
    released: HashMap<WorkloadKey, Instant>,
    /// Dependents whose health is being judged.
    judging: HashMap<WorkloadKey, Judge>,
    /// Dependents judged healthy, with the stamp they were judged on.
    healthy: HashMap<WorkloadKey, Option<String>>,
    /// Why it halted, once it has.
    halted: Option<Halt>,
}

impl Wave {
    /// When the dependents released but not re-stamped yet were released.
    fn unjudged_released(&self) -> impl Iterator<Item = Instant> + '_ {
        self.released
            .iter()
            .filter(|(k, _)| !self.judging.contains_key(*k) && !self.healthy.contains_key(*k))
            .map(|(_, t)| *t)
    }
}

/// Where and why a wave halted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Halt {
    pub workload: WorkloadKey,
    pub why: String,
    /// Dependents not touched for this content.
    pub waiting: usize,
}

/// The health of one workload, being judged.
#[derive(Debug)]
struct Judge {
    /// The stamp judged: a new one starts the judgement over.
    stamp: Option<String>,
    /// When the judgement started: its timeout runs from here.
    since: Instant,
    /// When its pods are looked at next; `None` while a look is under way.
    next_check: Option<Instant>,
    /// What its pods showed last.
    verdict: Option<PodsVerdict>,
    /// Since when its rollout has been complete and its pods clean, by the looks since.
    clean_since: Option<Instant>,
}

/// How a workload of a wave stands.
enum Health {
    Healthy,
    Pending,
    Unhealthy(String),
}

/// Where batch `b` starts in the wave's order: batches of 1, 2, 4, ... (2^b - 1).
fn batch_start(b: u32) -> usize {
    (1usize << b.min(usize::BITS - 1)) - 1
}

/// The batch of the dependent at `position`.
fn batch_of(position: usize) -> u32 {
    (position + 1).ilog2()
}

impl State {
    /// Whether `config`'s content changes roll in progressive waves: its annotation, or more
    /// dependents than `--progressive-dependents`. Never in a dry run.
    pub(super) fn is_progressive(&self, config: &ConfigKey) -> bool {
        if self.config.dry_run {
            return false;
        }
        if self.configs.is_progressive(config) {
            return true;
        }
        self.config
            .progressive_dependents
            .is_some_and(|n| self.workloads.dependents(config).nth(n).is_some())
    }

    /// Whether a wave holds the pending touch of `key`: all that it is for is progressive (the
    /// changes of progressive objects, or reconcile's check of a workload that references one),
    /// and none of those objects' waves has released it. The waves are started here when they
    /// are not under way, or started over when their object's content is new.
    pub(super) fn wave_holds(&mut self, key: &WorkloadKey) -> bool {
        let Some(pending) = self.pending.get(key) else {
            return false;
        };
        let objects: Vec<ConfigKey> = if pending.changed.is_empty() {
            let Some(entry) = self.workloads.get(key) else {
                return false;
            };
            entry
                .refs
                .iter()
                .map(|(r, _)| (key.namespace.clone(), r.clone()))
                .filter(|c| self.is_progressive(c))
                .collect()
        } else {
            if pending.changed.iter().any(|c| !self.is_progressive(c)) {
                return false;
            }
            pending.changed.iter().cloned().collect()
        };
        if objects.is_empty() {
            return false;
        }
        let mut released = false;
        for object in objects {
            self.start_wave(&object);
            // An object that is gone has no wave to wait for (its deletion rolls as usual).
            released |= self
                .waves
                .get(&object)
                .is_none_or(|w| w.halted.is_none() && w.released.contains_key(key));
        }
        !released
    }

    /// Starts the wave of `object`'s content, unless it is under way; a wave of other content
    /// is dropped (and its halt ended).
    fn start_wave(&mut self, object: &ConfigKey) {
        let Some(stored) = self.configs.get(object) else {
            return;
        };
        if let Some(wave) = self.waves.get(object) {
            if wave.content == stored.record {
                return;
            }
            tracing::info!(object = %object.1, namespace = object.0,
                resource_version = %stored.resource_version,
                "new content: the progressive wave starts over from the first dependent");
            self.end_wave(object);
        } else {
            tracing::info!(object = %object.1, namespace = object.0,
                resource_version = %stored.resource_version, "progressive wave started");
        }
        self.waves.insert(
            object.clone(),
            Wave {
                content: stored.record,
                resource_version: stored.resource_version,
                released: HashMap::new(),
                judging: HashMap::new(),
                healthy: HashMap::new(),
                halted: None,
            },
        );
        self.waves_dirty.insert(object.clone());
    }

    /// A workload changed: the waves of its namespace look again.
    pub(super) fn wave_member_changed(&mut self, key: &WorkloadKey) {
        for object in self.waves.keys() {
            if object.0 == key.namespace {
                self.waves_dirty.insert(object.clone());
            }
        }
    }

    /// Forgets a wave, ending its halt.
    fn end_wave(&mut self, object: &ConfigKey) {
        if self
            .waves
            .remove(object)
            .is_some_and(|w| w.halted.is_some())
        {
            self.set_waves_halted();
        }
    }

    fn set_waves_halted(&self) {
        let halted = self.waves.values().filter(|w| w.halted.is_some()).count();
        self.metrics.set_waves_halted(halted);
    }

    /// The halt of `object`'s wave, if it halted: for `explain` and the tests.
    pub fn wave_halted(&self, object: &ConfigKey) -> Option<&Halt> {
        self.waves.get(object)?.halted.as_ref()
    }

    /// Steps the waves something happened to, or whose time came.
    pub(super) fn waves_due(&mut self, now: Instant) {
        if !self.leader {
            if !self.waves.is_empty() {
                // A new leader resumes them from the stamps.
                self.waves.clear();
                self.waves_dirty.clear();
                self.pod_checks.clear();
                self.set_waves_halted();
            }
            return;
        }
        let due: Vec<ConfigKey> = self
            .waves
            .iter()
            .filter(|(k, w)| {
                let timer_due = w.judging.values().any(|j| {
                    j.next_check.is_some_and(|t| t <= now)
                        || j.since + self.config.progressive_timeout <= now
                        || j.clean_since
                            .is_some_and(|t| t + self.config.progressive_settle <= now)
                }) || w
                    .unjudged_released()
                    .any(|t| t + self.config.progressive_timeout <= now);
                self.waves_dirty.contains(*k) || (w.halted.is_none() && timer_due)
            })
            .map(|(k, _)| k.clone())
            .collect();
        self.waves_dirty.clear();
        for object in due {
            self.step_wave(&object, now);
        }
    }

    /// When a wave has something to do next.
    pub(super) fn next_wave_wake(&self) -> Option<Instant> {
        let timeout = self.config.progressive_timeout;
        let settle = self.config.progressive_settle;
        self.waves
            .values()
            .filter(|w| w.halted.is_none())
            .flat_map(|w| {
                w.judging
                    .values()
                    .flat_map(move |j| {
                        [
                            j.next_check,
                            Some(j.since + timeout),
                            j.clean_since.map(|t| t + settle),
                        ]
                    })
                    .chain(w.unjudged_released().map(move |t| Some(t + timeout)))
            })
            .flatten()
            .min()
    }

    /// The dependents of `object` the watcher handles, in the wave's order.
    fn wave_members(&self, object: &ConfigKey) -> Vec<WorkloadKey> {
        let mut members: Vec<WorkloadKey> = self
            .workloads
            .dependents(object)
            .filter(|k| self.handles(k))
            .collect();
        members.sort();
        members
    }

    /// Where the wave of `object` stands: judges the workloads it has rolled, halts it, releases
    /// the next batch, or ends it once every dependent is current and healthy.
    fn step_wave(&mut self, object: &ConfigKey, now: Instant) {
        match self.configs.get(object) {
            None => {
                tracing::info!(object = %object.1, namespace = object.0,
                    "the object is gone: its progressive wave ends");
                return self.end_wave(object);
            }
            Some(stored) => {
                if self
                    .waves
                    .get(object)
                    .is_some_and(|w| w.content != stored.record)
                {
                    // New content: its touches start the new wave when its window closes.
                    tracing::info!(object = %object.1, namespace = object.0,
                        "new content: the progressive wave of the old one ends");
                    return self.end_wave(object);
                }
            }
        }
        if self.waves.get(object).is_none_or(|w| w.halted.is_some()) {
            return;
        }
        let members = self.wave_members(object);
        let current: Vec<bool> = members
            .iter()
            .map(|m| self.decide(m, Trigger::ConfigChange).is_none())
            .collect();
        let batch = current.iter().position(|c| !c).map(batch_of);
        let gate_end = batch.map_or(members.len(), batch_start);
        let batch_end = batch.map_or(members.len(), |b| batch_start(b + 1).min(members.len()));
        let waiting = current.iter().filter(|c| !**c).count();
        if let Some(wave) = self.waves.get_mut(object) {
            // Only the workloads up to the batch under way are judged or wait to be re-stamped:
            // what is kept of others (gone, or behind a batch that went back) is dropped, so no
            // deadline of theirs is waited for.
            let within = |k: &WorkloadKey| members[..batch_end].binary_search(k).is_ok();
            wave.judging.retain(|k, _| within(k));
            wave.released.retain(|k, _| within(k));
        }
        let mut gate_healthy = true;
        for (i, member) in members[..batch_end].iter().enumerate() {
            match self.judge(object, member, current[i], now) {
                Health::Healthy => {}
                Health::Pending => gate_healthy &= i >= gate_end,
                Health::Unhealthy(why) => {
                    let waiting = waiting - usize::from(!current[i]);
                    return self.halt(object, member, why, waiting);
                }
            }
        }
        let Some(wave) = self.waves.get_mut(object) else {
            return;
        };
        match batch {
            None if gate_healthy => {
                tracing::info!(object = %object.1, namespace = object.0,
                    dependents = members.len(), "progressive wave complete: every dependent rolled healthy");
                self.end_wave(object);
            }
            Some(_) if gate_healthy => {
                let mut released = 0;
                for (i, member) in members.iter().enumerate().take(batch_end).skip(gate_end) {
                    if current[i] || wave.released.contains_key(member) {
                        continue;
                    }
                    released += 1;
                    wave.released.insert(member.clone(), now);
                    let p = self.pending.entry(member.clone()).or_default();
                    p.changed.insert(object.clone());
                    p.due.get_or_insert(now);
                }
                if released > 0 {
                    tracing::info!(object = %object.1, namespace = object.0,
                        batch = batch.map_or(0, |b| b + 1), from = gate_end + 1, to = batch_end,
                        of = members.len(), released, "progressive wave: batch released");
                }
            }
            _ => {}
        }
    }

    /// The health of one workload of a wave; asks for a look at its pods when one is due.
    fn judge(
        &mut self,
        object: &ConfigKey,
        member: &WorkloadKey,
        current: bool,
        now: Instant,
    ) -> Health {
        let timeout = self.config.progressive_timeout;
        let settle = self.config.progressive_settle;
        let Some(wave) = self.waves.get_mut(object) else {
            return Health::Pending;
        };
        if !current {
            return match wave.released.get(member) {
                Some(at) if *at + timeout <= now => Health::Unhealthy(format!(
                    "it was not re-stamped within {} (--progressive-timeout)",
                    format_delay(timeout)
                )),
                _ => Health::Pending,
            };
        }
        let Some(entry) = self.workloads.get(member) else {
            return Health::Healthy;
        };
        if wave.healthy.get(member) == Some(&entry.stamp) {
            return Health::Healthy;
        }
        let judged_by_stamp = entry.stamp.is_none()
            || !entry.rolls_by_itself
            || member.kind.kind() == WorkloadKind::CRON_JOB
            || !member.kind.kind().is_built_in();
        if judged_by_stamp {
            wave.healthy.insert(member.clone(), entry.stamp.clone());
            wave.judging.remove(member);
            return Health::Healthy;
        }
        let since = wave.released.get(member).copied().unwrap_or(now);
        let judge = wave.judging.entry(member.clone()).or_insert_with(|| Judge {
            stamp: entry.stamp.clone(),
            since,
            next_check: Some(now),
            verdict: None,
            clean_since: None,
        });
        if judge.stamp != entry.stamp {
            *judge = Judge {
                stamp: entry.stamp.clone(),
                since: now,
                next_check: Some(now),
                verdict: None,
                clean_since: None,
            };
        }
        let complete = entry.rollout == Some(Progress::Complete);
        if !complete {
            judge.clean_since = None;
        }
        let health = if entry.rollout == Some(Progress::Stalled) {
            Health::Unhealthy(match member.kind.kind() {
                WorkloadKind::ROLLOUT => "the Argo Rollout is Degraded".to_owned(),
                _ => format!(
                    "it exceeded its progress deadline ({})",
                    crate::rollout::PROGRESS_DEADLINE_EXCEEDED
                ),
            })
        } else if let Some(PodsVerdict::Failing(why)) = &judge.verdict {
            Health::Unhealthy(why.clone())
        } else if judge.clean_since.is_some_and(|t| t + settle <= now) {
            Health::Healthy
        } else if judge.since + timeout <= now {
            Health::Unhealthy(format!(
                "its rollout did not finish healthy within {} (--progressive-timeout)",
                format_delay(timeout)
            ))
        } else {
            Health::Pending
        };
        match health {
            Health::Healthy => {
                wave.judging.remove(member);
                wave.healthy.insert(member.clone(), entry.stamp.clone());
                tracing::info!(workload = %member, object = %object.1,
                    "progressive wave: rolled healthy");
            }
            Health::Pending => {
                if judge.next_check.is_some_and(|t| t <= now)
                    && let Some(stamp) = judge.stamp.clone()
                {
                    judge.next_check = None;
                    if self.pod_checks.insert(member.clone()) {
                        self.effects.push(Effect::CheckPods {
                            workload: member.clone(),
                            stamp,
                        });
                    }
                }
            }
            Health::Unhealthy(_) => {}
        }
        health
    }

    /// A look at a workload's pods came back: every wave judging it on that stamp takes it.
    pub(super) fn pods_checked(
        &mut self,
        key: WorkloadKey,
        stamp: String,
        result: Result<PodsVerdict, TouchError>,
        now: Instant,
    ) {
        self.pod_checks.remove(&key);
        let complete = self.workloads.get(&key).is_some_and(|e| {
            e.rollout == Some(Progress::Complete) && e.stamp.as_deref() == Some(&stamp)
        });
        if let Err(TouchError::Forbidden(error) | TouchError::Other(error)) = &result {
            tracing::warn!(workload = %key, error = %error,
                "cannot read the pods of a workload a progressive wave waits for");
        }
        for (object, wave) in &mut self.waves {
            let Some(judge) = wave.judging.get_mut(&key) else {
                continue;
            };
            judge.next_check = Some(now + WAVE_CHECK_EVERY);
            if judge.stamp.as_deref() != Some(stamp.as_str()) {
                continue;
            }
            let Ok(verdict) = &result else {
                continue;
            };
            match verdict {
                PodsVerdict::Ready { .. } if complete => {
                    judge.clean_since.get_or_insert(now);
                }
                PodsVerdict::Failing(_) => {}
                _ => judge.clean_since = None,
            }
            judge.verdict = Some(verdict.clone());
            self.waves_dirty.insert(object.clone());
        }
    }

    /// A workload of a wave did not finish healthy: the wave halts, loudly.
    fn halt(&mut self, object: &ConfigKey, member: &WorkloadKey, why: String, waiting: usize) {
        let Some(wave) = self.waves.get_mut(object) else {
            return;
        };
        let change = format!(
            "{} {} (resourceVersion {})",
            object.1.kind.as_str(),
            object.1.name,
            wave.resource_version
        );
        wave.halted = Some(Halt {
            workload: member.clone(),
            why: why.clone(),
            waiting,
        });
        wave.judging.clear();
        self.set_waves_halted();
        tracing::warn!(object = %object.1, namespace = object.0, workload = %member, why,
            waiting, "progressive wave halted");
        if self.terminating.contains(&object.0) {
            return;
        }
        let uid = self
            .workloads
            .get(member)
            .map(|e| e.uid.clone())
            .unwrap_or_default();
        let dependents = if waiting == 1 {
            "dependent"
        } else {
            "dependents"
        };
        self.effects.push(Effect::ConfigEvent(ConfigEvent {
            config: object.clone(),
            type_: EventType::Warning,
            reason: WAVE_HALTED_REASON,
            action: "Rollout",
            note: format!(
                "the progressive wave of the change of {change} halted at {member}: {why}; \
                 {waiting} {dependents} wait, untouched, for the next change of its content"
            ),
        }));
        self.record(WorkloadEvent {
            workload: member.clone(),
            uid,
            type_: EventType::Warning,
            reason: WAVE_HALTED_REASON,
            action: "Rollout",
            note: format!(
                "the progressive wave of the change of {change} halted here: {why}; {waiting} \
                 other {dependents} of it wait, untouched, for the next change of its content"
            ),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_double() {
        let sizes: Vec<usize> = (0..6)
            .map(|b| batch_start(b + 1) - batch_start(b))
            .collect();
        assert_eq!(sizes, [1, 2, 4, 8, 16, 32]);
        let batches: Vec<u32> = (0..16).map(batch_of).collect();
        assert_eq!(batches, [0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 4]);
        for position in 0..1000 {
            let b = batch_of(position);
            assert!(batch_start(b) <= position && position < batch_start(b + 1));
        }
    }
}

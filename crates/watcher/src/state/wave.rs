//! Progressive waves: a content change of a ConfigMap or Secret marked
//! `confighash.dev/rollout: progressive` (or with more than `--progressive-dependents`
//! dependents) touches the dependents **that change re-stamps** in batches of 1, 2, 4, 8, ...,
//! each batch only once every workload of the batches before it finished its rollout healthy.
//!
//! **Who is in a wave** is decided once, when the change's window closes: the dependents whose
//! expected stamp differs between the object's content before the change and after it, and
//! whose stamp is not current yet ([`Waves::start`]). The content before is what the watcher
//! held when the window's first change of the object arrived; while a wave of the object is
//! under way (or halted) a newer change starts it over from the same content before, so a
//! dependent the halted change never reached is still in the new wave. Dependents the change
//! does not affect (they use another key, opted out, already current) are neither counted nor
//! judged: the first batch is the first affected dependent, alone.
//!
//! **Only a content change starts a wave.** Reconcile, a new leader or an opt-in never start
//! one: a workload they find stale goes as it would without waves, unless it is a member of a
//! wave under way and not released yet. Every replica keeps the waves' members (it saw the
//! change too); the leader alone releases and judges, so a standby that takes over resumes
//! the wave where the stamps say it is, judging the gate afresh by its pods as they are now.
//! A replica that never saw the change (every replica restarted in the middle of a wave)
//! cannot tell the wave's members from workloads stale for another reason, and starts no
//! wave: the remaining dependents are rolled by reconcile at once, as without waves, and it
//! says so in its log (see docs/serve.md).
//!
//! **Healthy**, for a workload the gate holds: its rollout complete by its status
//! ([`crate::rollout`]) and the pods of its current revision (those carrying its stamp, owned
//! by it: [`crate::pods`]) Ready, none failed since its touch, still so `--progressive-settle`
//! later. Kinds confighash cannot judge (CronJobs, configured kinds) and workloads whose pods
//! do not roll by themselves (`OnDelete`, paused) count as healthy once stamped.
//! **Unhealthy**: a new pod failed (restarted, crash-looping, held by a config error), the
//! rollout stalled (`ProgressDeadlineExceeded`, an Argo Rollout `Degraded`), it made no
//! progress (no new pod Ready) for `--progressive-timeout` counted from its touch, or its
//! touch was tried and did not take for `--progressive-timeout`. A workload released but
//! still queued behind the touch rate has no clock running. Then the wave halts: no dependent
//! of the object is touched for this content, a Warning `WaveHalted` is recorded on the
//! object and on the workload, and `confighash_waves_halted` counts it until the object's next
//! content change, its deletion, or the loss of its progressive status (which releases the
//! rest at once).
//!
//! A workload two waves share is released when both release it, and when it fails, it halts
//! both, its Event naming both objects. The wave holds only the watcher's touches for its
//! members, as the flap guard does: a touch for the change of another, not progressive,
//! reference goes ahead (and carries the object's content with it), and the webhook stamps
//! every other write as always. A dry run has no waves: nothing it does rolls, so no batch
//! could ever finish.
//!
//! Cost: at most [`MAX_POD_CHECKS`] looks at pods in flight, whatever the size of the batch.

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
/// The most looks at pods in flight at once, for every wave together: a batch of a thousand
/// workloads is looked at a few at a time, never with a thousand reads at once.
pub const MAX_POD_CHECKS: usize = 8;

/// The progressive waves of every object, and what they need: owned here, decided with the
/// rest of the state by [`State`]'s methods below.
#[derive(Debug, Default)]
pub(super) struct Waves {
    /// The waves under way (or halted), by object.
    by_object: HashMap<ConfigKey, Wave>,
    /// What referenced objects held before the first change in the change window now open
    /// (`None`: absent): a wave's content before. Taken when the window closes.
    before: HashMap<ConfigKey, Option<ObjectRecord>>,
    /// Waves to look at again at the next tick: something of theirs changed.
    dirty: HashSet<ConfigKey>,
    /// Workloads whose pods are being looked at.
    pod_checks: HashSet<WorkloadKey>,
    /// Whether this replica said that pods may not be read (once).
    said_pods_forbidden: bool,
    /// A look at pods was refused (403): the waves judge by rollout status alone, until a new
    /// wave starts and looks again.
    pods_forbidden: bool,
}

impl Waves {
    /// An object changed: what it held before, if this is the first change of it since the
    /// window opened.
    pub(super) fn note_before(&mut self, object: &ConfigKey, before: Option<ObjectRecord>) {
        if !self.before.contains_key(object) {
            self.before.insert(object.clone(), before);
        }
    }

    /// Something of `object`'s wave changed: it is looked at at the next tick.
    pub(super) fn object_changed(&mut self, object: &ConfigKey) {
        if self.by_object.contains_key(object) {
            self.dirty.insert(object.clone());
        }
    }

    /// A workload changed: the waves it is a member of look again.
    pub(super) fn member_changed(&mut self, key: &WorkloadKey) {
        for (object, wave) in &self.by_object {
            if wave.is_member(key) {
                self.dirty.insert(object.clone());
            }
        }
    }

    /// Whether any wave holds `key`: a member it has not released, or one of a halted wave.
    fn holds(&self, key: &WorkloadKey) -> bool {
        self.by_object.values().any(|w| w.holds(key))
    }

    /// A touch of `key` is being sent: the waves that released it start their clock for the
    /// touch's taking, if they have not yet.
    pub(super) fn touch_sent(&mut self, key: &WorkloadKey, now: Instant) {
        for wave in self.by_object.values_mut() {
            if let Some(r) = wave.released.get_mut(key) {
                r.tried.get_or_insert(now);
            }
        }
    }

    /// A touch of `key` took (the webhook confirmed `stamp`): its rollout's clock starts.
    pub(super) fn touch_took(&mut self, key: &WorkloadKey, stamp: &str, now: Instant) {
        for (object, wave) in &mut self.by_object {
            if let Some(r) = wave.released.get_mut(key) {
                // Its touch took: a later one's clock starts at its own sending.
                r.tried = None;
                r.touched = Some((now, stamp.into()));
                self.dirty.insert(object.clone());
            }
        }
    }

    pub(super) fn has_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    fn halted(&self) -> usize {
        self.by_object
            .values()
            .filter(|w| w.halted.is_some())
            .count()
    }

    /// This replica no longer leads: what it judged goes (a new leader judges afresh), what
    /// the waves are (their members) stays.
    fn step_down(&mut self) {
        for wave in self.by_object.values_mut() {
            wave.upto = None;
            wave.released.clear();
            wave.judging.clear();
            wave.healthy.clear();
            wave.halted = None;
        }
        self.pod_checks.clear();
        self.dirty.clear();
    }

    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.by_object.is_empty()
    }

    #[cfg(test)]
    pub(super) fn members(&self, object: &ConfigKey) -> Option<&[WorkloadKey]> {
        self.by_object.get(object).map(|w| w.members.as_slice())
    }
}

/// The wave of one object's content.
#[derive(Debug)]
struct Wave {
    /// The content it rolls out: a change of it starts a new wave.
    content: ObjectRecord,
    /// What the object held before the change (`None`: absent).
    before: Option<ObjectRecord>,
    /// The object's resourceVersion when the wave started, to name the change in Events.
    resource_version: Box<str>,
    /// The dependents its change re-stamps, in touch order (kind, then name), fixed when it
    /// started.
    members: Vec<WorkloadKey>,
    /// How many members (from the first) the wave released: the batches so far. `None` for a
    /// wave this replica resumes, found from the stamps at its first step.
    upto: Option<usize>,
    /// Members the wave let the watcher touch.
    released: HashMap<WorkloadKey, Released>,
    /// Members whose health is being judged.
    judging: HashMap<WorkloadKey, Judge>,
    /// Members judged healthy, with the stamp they were judged on.
    healthy: HashMap<WorkloadKey, Option<String>>,
    /// Why it halted, once it has.
    halted: Option<Halt>,
}

impl Wave {
    fn is_member(&self, key: &WorkloadKey) -> bool {
        self.members.binary_search(key).is_ok()
    }

    fn holds(&self, key: &WorkloadKey) -> bool {
        self.is_member(key) && (self.halted.is_some() || !self.released.contains_key(key))
    }

    /// When the touches of members released, tried and not taken yet, were first tried.
    fn untaken_tries(&self) -> impl Iterator<Item = Instant> + '_ {
        self.released
            .iter()
            .filter(|(k, r)| r.touched.is_none() && !self.judging.contains_key(*k))
            .filter_map(|(_, r)| r.tried)
    }
}

/// A member the wave released.
#[derive(Debug, Clone)]
struct Released {
    /// When its first touch for the wave was sent: a touch that does not take within the
    /// timeout from here halts the wave. A touch queued behind the touch rate has no clock.
    tried: Option<Instant>,
    /// When a touch of it took, and the stamp it set: the rollout of that stamp is judged
    /// from here.
    touched: Option<(Instant, Box<str>)>,
}

/// Where and why a wave halted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Halt {
    pub workload: WorkloadKey,
    pub why: String,
    /// Members not touched for this content.
    pub waiting: usize,
}

/// The health of one workload, being judged.
#[derive(Debug)]
struct Judge {
    /// The stamp judged: a new one starts the judgement over.
    stamp: Option<String>,
    /// When the judgement started: the touch, or the first look of a judgement that did not
    /// see the touch (a new leader, a stamp the webhook set).
    since: Instant,
    /// Whether `since` is the touch: otherwise only what happened within
    /// `--progressive-settle` before a look counts.
    saw_touch: bool,
    /// When it last made progress (a new pod Ready, its rollout complete): its no-progress
    /// deadline runs from here.
    progress_at: Instant,
    /// The most new pods seen Ready.
    ready: usize,
    /// When its pods are looked at next; `None` while a look is under way.
    next_check: Option<Instant>,
    /// What its pods showed last.
    verdict: Option<PodsVerdict>,
    /// Since when its rollout has been complete and its pods clean, by the looks since.
    clean_since: Option<Instant>,
    /// Its pods may not be read (the RBAC grants no list or watch of pods): judged by its
    /// rollout status alone.
    by_status: bool,
}

impl Judge {
    fn new(stamp: Option<String>, since: Instant, saw_touch: bool, now: Instant) -> Self {
        Judge {
            stamp,
            since,
            saw_touch,
            progress_at: since,
            ready: 0,
            next_check: Some(now),
            verdict: None,
            clean_since: None,
            by_status: false,
        }
    }
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

/// The batch of the member at `position`.
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

    /// Whether a wave holds the pending touch of `key`: a wave has it as a member and has not
    /// released it (or halted), and the touch is not for the change of a reference that is
    /// not progressive (that one goes ahead, as the flap guard lets it).
    pub(super) fn wave_holds(&mut self, key: &WorkloadKey) -> bool {
        let Some(pending) = self.touches.pending(key) else {
            return false;
        };
        if pending
            .changed
            .iter()
            .any(|c| !self.waves.by_object.contains_key(c) && !self.is_progressive(c))
        {
            return false;
        }
        self.waves.holds(key)
    }

    /// The window closed on these changes: each progressive object's content change starts
    /// its wave (or starts it over), its members fixed now. Every replica does this, so a
    /// standby knows the waves it may have to resume.
    pub(super) fn start_waves(&mut self, changes: &BTreeSet<ConfigKey>) {
        let mut before = std::mem::take(&mut self.waves.before);
        for object in changes {
            let noted = before.remove(object);
            if !self.is_progressive(object) {
                continue;
            }
            let Some(stored) = self.configs.get(object) else {
                // Gone: a deletion rolls as usual; a wave of it ends at its next step.
                self.waves.object_changed(object);
                continue;
            };
            let (prior, under_way) = match self.waves.by_object.get(object) {
                Some(wave) if wave.content == stored.record => continue,
                Some(wave) => (Some(wave.before.clone()), true),
                None => (noted, false),
            };
            let mut members: Vec<WorkloadKey> = self
                .workloads
                .dependents(object)
                .filter(|k| self.handles(k))
                .collect();
            members.sort();
            members.retain(|k| {
                self.affects(k, object, prior.as_ref())
                    && self.decide(k, Trigger::ConfigChange).is_some()
            });
            if under_way {
                tracing::info!(object = %object.1, namespace = object.0,
                    resource_version = %stored.resource_version, members = members.len(),
                    "new content: the progressive wave starts over from the first dependent");
                self.end_wave(object, None);
            } else {
                tracing::info!(object = %object.1, namespace = object.0,
                    resource_version = %stored.resource_version, members = members.len(),
                    "progressive wave started");
            }
            if members.is_empty() {
                continue;
            }
            // A new wave looks at pods again: access may have been granted since.
            self.waves.pods_forbidden = false;
            self.waves.by_object.insert(
                object.clone(),
                Wave {
                    content: stored.record,
                    before: prior.flatten(),
                    resource_version: stored.resource_version,
                    members,
                    upto: Some(0),
                    released: HashMap::new(),
                    judging: HashMap::new(),
                    healthy: HashMap::new(),
                    halted: None,
                },
            );
            self.waves.dirty.insert(object.clone());
        }
    }

    /// Whether the change of `object` from `before` (`None` not known: every dependent it
    /// makes stale counts; `Some(None)`: it was absent) to what it holds now changes the
    /// expected stamp of `key`.
    fn affects(
        &self,
        key: &WorkloadKey,
        object: &ConfigKey,
        before: Option<&Option<ObjectRecord>>,
    ) -> bool {
        let Some(before) = before else {
            return true;
        };
        let Some(entry) = self.workloads.get(key) else {
            return false;
        };
        let stamp_key = &self.key;
        let max = self.config.max_reference_bytes;
        let now = self
            .configs
            .lookup(stamp_key, &key.namespace, &entry.refs, false, max);
        let then = self.configs.lookup_as_if(
            stamp_key,
            &key.namespace,
            &entry.refs,
            false,
            max,
            &object.1,
            before.as_ref(),
        );
        now != then
    }

    /// Forgets a wave, ending its halt. `release`: its members it held go now, as without
    /// waves (it lost its progressive status, or its object went).
    fn end_wave(&mut self, object: &ConfigKey, release: Option<Instant>) {
        let Some(wave) = self.waves.by_object.remove(object) else {
            return;
        };
        if wave.halted.is_some() {
            self.set_waves_halted();
        }
        if let Some(now) = release.filter(|_| self.leader) {
            for member in wave.members {
                if (wave.halted.is_some() || !wave.released.contains_key(&member))
                    && !self.waves.holds(&member)
                {
                    let p = self.touches.want(member);
                    p.changed.insert(object.clone());
                    p.due = Some(p.due.map_or(now, |d| d.min(now)));
                }
            }
        }
    }

    fn set_waves_halted(&self) {
        self.metrics.set_waves_halted(self.waves.halted());
    }

    /// The halt of `object`'s wave, if it halted: for `explain` and the tests.
    pub fn wave_halted(&self, object: &ConfigKey) -> Option<&Halt> {
        self.waves.by_object.get(object)?.halted.as_ref()
    }

    /// The namespaces where a wave judges now (its members' pods are watched there): those of
    /// the waves under way and not halted, while leading. A wave's members are in its object's
    /// namespace.
    pub fn pod_namespaces(&self) -> Vec<&str> {
        if !self.leader {
            return Vec::new();
        }
        let mut namespaces: Vec<&str> = self
            .waves
            .by_object
            .iter()
            .filter(|(_, w)| w.halted.is_none())
            .map(|(k, _)| k.0.as_str())
            .collect();
        namespaces.sort_unstable();
        namespaces.dedup();
        namespaces
    }

    /// Leadership changed: a replica that no longer leads keeps the waves' members only.
    pub(super) fn waves_leadership(&mut self, leader: bool) {
        if !leader {
            self.waves.step_down();
            self.set_waves_halted();
        } else {
            let objects: Vec<ConfigKey> = self.waves.by_object.keys().cloned().collect();
            self.waves.dirty.extend(objects);
        }
    }

    /// Steps the waves something happened to, or whose time came.
    pub(super) fn waves_due(&mut self, now: Instant) {
        let timeout = self.config.progressive_timeout;
        let settle = self.config.progressive_settle;
        let room = self.waves.pod_checks.len() < MAX_POD_CHECKS;
        let due: Vec<ConfigKey> = self
            .waves
            .by_object
            .iter()
            .filter(|(k, w)| {
                let timer_due = self.leader
                    && w.halted.is_none()
                    && (w.judging.values().any(|j| {
                        (room && j.next_check.is_some_and(|t| t <= now))
                            || j.progress_at + timeout <= now
                            || j.clean_since.is_some_and(|t| t + settle <= now)
                    }) || w.untaken_tries().any(|t| t + timeout <= now));
                self.waves.dirty.contains(*k) || timer_due
            })
            .map(|(k, _)| k.clone())
            .collect();
        self.waves.dirty.clear();
        for object in due {
            self.step_wave(&object, now);
        }
    }

    /// When a wave has something to do next.
    pub(super) fn next_wave_wake(&self) -> Option<Instant> {
        if !self.leader {
            return None;
        }
        let timeout = self.config.progressive_timeout;
        let settle = self.config.progressive_settle;
        let room = self.waves.pod_checks.len() < MAX_POD_CHECKS;
        self.waves
            .by_object
            .values()
            .filter(|w| w.halted.is_none())
            .flat_map(|w| {
                w.judging
                    .values()
                    .flat_map(move |j| {
                        [
                            j.next_check.filter(|_| room),
                            Some(j.progress_at + timeout),
                            j.clean_since.map(|t| t + settle),
                        ]
                    })
                    .chain(w.untaken_tries().map(move |t| Some(t + timeout)))
            })
            .flatten()
            .min()
    }

    /// Where the wave of `object` stands: ends it when its object went, lost its progressive
    /// status or every member rolled healthy; otherwise (leader only) judges the members it has
    /// released, halts it, or releases the next batch once every one of them is healthy.
    fn step_wave(&mut self, object: &ConfigKey, now: Instant) {
        let Some(stored) = self.configs.get(object) else {
            tracing::info!(object = %object.1, namespace = object.0,
                "the object is gone: its progressive wave ends");
            return self.end_wave(object, Some(now));
        };
        if !self.is_progressive(object) {
            tracing::info!(object = %object.1, namespace = object.0,
                "no longer progressive: its wave ends and the dependents it held go now");
            return self.end_wave(object, Some(now));
        }
        let Some(wave) = self.waves.by_object.get_mut(object) else {
            return;
        };
        if wave.content != stored.record {
            // New content: its window's close starts the wave over; until then it holds its
            // members, and judges nothing.
            wave.judging.clear();
            wave.released.clear();
            wave.upto = Some(0);
            return;
        }
        if wave.halted.is_some() || !self.leader {
            return;
        }
        let members = wave.members.clone();
        let current: Vec<bool> = members
            .iter()
            .map(|m| !self.handles(m) || self.decide(m, Trigger::ConfigChange).is_none())
            .collect();
        let Some(wave) = self.waves.by_object.get_mut(object) else {
            return;
        };
        // A wave resumed by a new leader: the members before the batch of the first stale one
        // were rolled by the leader before; they are judged (as they are now) before the next
        // batch goes.
        let upto = *wave.upto.get_or_insert_with(|| {
            current
                .iter()
                .position(|c| !c)
                .map_or(members.len(), |p| batch_start(batch_of(p)))
        });
        let mut all_healthy = true;
        for (i, member) in members[..upto].iter().enumerate() {
            match self.judge(object, member, current[i], now) {
                Health::Healthy => {}
                Health::Pending => all_healthy = false,
                Health::Unhealthy(why) => return self.halt(member, why),
            }
        }
        if !all_healthy {
            return;
        }
        if upto >= members.len() {
            tracing::info!(object = %object.1, namespace = object.0,
                dependents = members.len(),
                "progressive wave complete: every dependent it re-stamps rolled healthy");
            return self.end_wave(object, None);
        }
        let batch = batch_of(upto);
        let next = batch_start(batch + 1).min(members.len());
        let Some(wave) = self.waves.by_object.get_mut(object) else {
            return;
        };
        wave.upto = Some(next);
        let mut released = 0;
        for (i, member) in members.iter().enumerate().take(next).skip(upto) {
            wave.released.insert(
                member.clone(),
                Released {
                    tried: None,
                    touched: None,
                },
            );
            if current[i] {
                continue;
            }
            released += 1;
            let p = self.touches.want(member.clone());
            p.changed.insert(object.clone());
            p.due.get_or_insert(now);
        }
        tracing::info!(object = %object.1, namespace = object.0, batch = batch + 1,
            from = upto + 1, to = next, of = members.len(), released,
            "progressive wave: batch released");
        // Its members already current are judged at once.
        self.waves.dirty.insert(object.clone());
    }

    /// The health of one member of a wave; asks for a look at its pods when one is due.
    fn judge(
        &mut self,
        object: &ConfigKey,
        member: &WorkloadKey,
        current: bool,
        now: Instant,
    ) -> Health {
        let timeout = self.config.progressive_timeout;
        let settle = self.config.progressive_settle;
        let handled = self.handles(member);
        let Some(wave) = self.waves.by_object.get_mut(object) else {
            return Health::Pending;
        };
        if current && !handled {
            return Health::Healthy;
        }
        if !current {
            return match wave.released.get(member).and_then(|r| r.tried) {
                Some(at) if at + timeout <= now => Health::Unhealthy(format!(
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
        // A configured kind is judged by its status alone (its pods' owners are its controller's
        // own objects), and by its stamp where its status says nothing.
        let by_status = !member.kind.kind().is_built_in();
        let judged_by_stamp = entry.stamp.is_none()
            || !entry.rolls_by_itself
            || member.kind.kind() == WorkloadKind::CRON_JOB
            || (by_status && entry.rollout.is_none());
        if judged_by_stamp {
            wave.healthy.insert(member.clone(), entry.stamp.clone());
            wave.judging.remove(member);
            return Health::Healthy;
        }
        // From the touch, if the stamp judged is the one it set; a stamp set since (the
        // webhook, another reference's change) is judged from now.
        let touched = wave
            .released
            .get(member)
            .and_then(|r| r.touched.as_ref())
            .filter(|(_, stamp)| entry.stamp.as_deref() == Some(&**stamp))
            .map(|(at, _)| *at);
        let judge = wave.judging.entry(member.clone()).or_insert_with(|| {
            Judge::new(
                entry.stamp.clone(),
                touched.unwrap_or(now),
                touched.is_some(),
                now,
            )
        });
        if judge.stamp != entry.stamp {
            // Re-stamped since (another reference's change): judged afresh from now.
            let pods_unreadable = judge.by_status;
            *judge = Judge::new(entry.stamp.clone(), now, false, now);
            judge.by_status = pods_unreadable;
        }
        judge.by_status |= self.waves.pods_forbidden;
        if entry.timed_pause {
            // An Argo Rollout's timed pause step is part of its rollout: no progress is due.
            judge.progress_at = now;
        }
        let by_status = by_status || judge.by_status;
        let complete = entry.rollout == Some(Progress::Complete);
        if !complete {
            judge.clean_since = None;
        } else if by_status && judge.clean_since.is_none() {
            judge.clean_since = Some(now);
            judge.progress_at = now;
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
        } else if judge.progress_at + timeout <= now {
            Health::Unhealthy(format!(
                "its rollout made no progress (no new pod became Ready) for {} \
                 (--progressive-timeout)",
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
            Health::Pending if by_status => judge.next_check = None,
            Health::Pending => {
                if judge.next_check.is_some_and(|t| t <= now)
                    && self.waves.pod_checks.len() < MAX_POD_CHECKS
                    && let Some(stamp) = judge.stamp.clone()
                {
                    judge.next_check = None;
                    // What happened since the touch counts; without the touch seen, what
                    // happened within the settle time.
                    let since = if judge.saw_touch {
                        now.saturating_duration_since(judge.since)
                    } else {
                        settle
                    };
                    if self.waves.pod_checks.insert(member.clone()) {
                        self.effects.push(Effect::CheckPods {
                            workload: member.clone(),
                            uid: entry.uid.clone(),
                            stamp,
                            since,
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
        self.waves.pod_checks.remove(&key);
        let complete = self.workloads.get(&key).is_some_and(|e| {
            e.rollout == Some(Progress::Complete) && e.stamp.as_deref() == Some(&stamp)
        });
        let forbidden = matches!(result, Err(TouchError::Forbidden(_)));
        match &result {
            Err(TouchError::Forbidden(_)) => {
                self.waves.pods_forbidden = true;
                if !std::mem::replace(&mut self.waves.said_pods_forbidden, true) {
                    tracing::warn!(
                        namespace = key.namespace,
                        "pods may not be listed or watched (the chart's watcher.progressiveWavePods is false): progressive waves judge workloads by their rollout status alone"
                    );
                }
            }
            Err(TouchError::Other(error)) => {
                tracing::warn!(workload = %key, error = %error,
                    "cannot read the pods of a workload a progressive wave waits for");
            }
            Ok(_) => {}
        }
        // A check waiting for room may go now.
        let waiting: Vec<ConfigKey> = self
            .waves
            .by_object
            .iter()
            .filter(|(_, w)| {
                w.judging
                    .values()
                    .any(|j| j.next_check.is_some_and(|t| t <= now))
            })
            .map(|(k, _)| k.clone())
            .collect();
        self.waves.dirty.extend(waiting);
        for (object, wave) in &mut self.waves.by_object {
            let Some(judge) = wave.judging.get_mut(&key) else {
                continue;
            };
            judge.next_check = Some(now + WAVE_CHECK_EVERY);
            if forbidden {
                judge.by_status = true;
                self.waves.dirty.insert(object.clone());
                continue;
            }
            if judge.stamp.as_deref() != Some(stamp.as_str()) {
                continue;
            }
            let Ok(verdict) = &result else {
                continue;
            };
            if verdict.ready() > judge.ready || (complete && judge.clean_since.is_none()) {
                judge.ready = judge.ready.max(verdict.ready());
                judge.progress_at = now;
            }
            match verdict {
                PodsVerdict::Ready { .. } if complete => {
                    judge.clean_since.get_or_insert(now);
                }
                PodsVerdict::Failing(_) => {}
                _ => judge.clean_since = None,
            }
            judge.verdict = Some(verdict.clone());
            self.waves.dirty.insert(object.clone());
        }
    }

    /// A member of a wave did not finish healthy: every wave that released it or judges it
    /// (a wave resumed by a new leader judges the members the old one released) halts, loudly.
    fn halt(&mut self, member: &WorkloadKey, why: String) {
        let objects: Vec<ConfigKey> = self
            .waves
            .by_object
            .iter()
            .filter(|(_, w)| {
                w.halted.is_none()
                    && (w.released.contains_key(member) || w.judging.contains_key(member))
            })
            .map(|(k, _)| k.clone())
            .collect();
        let mut changes = Vec::new();
        for object in &objects {
            let waiting = self.waiting_in(object, member);
            let Some(wave) = self.waves.by_object.get_mut(object) else {
                continue;
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
            tracing::warn!(object = %object.1, namespace = object.0, workload = %member, why,
                waiting, "progressive wave halted");
            changes.push((object.clone(), change, waiting));
        }
        self.set_waves_halted();
        let Some((first, _, _)) = changes.first() else {
            return;
        };
        if self.namespaces.is_terminating(&first.0) {
            return;
        }
        for (object, change, waiting) in &changes {
            let dependents = if *waiting == 1 {
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
        }
        let uid = self
            .workloads
            .get(member)
            .map(|e| e.uid.clone())
            .unwrap_or_default();
        let note = match changes.as_slice() {
            [(_, change, waiting)] => {
                let dependents = if *waiting == 1 {
                    "dependent"
                } else {
                    "dependents"
                };
                format!(
                    "the progressive wave of the change of {change} halted here: {why}; \
                     {waiting} other {dependents} of it wait, untouched, for the next change of \
                     its content"
                )
            }
            many => {
                let named: Vec<&str> = many.iter().map(|(_, c, _)| c.as_str()).collect();
                let waiting: usize = many.iter().map(|(_, _, w)| w).sum();
                format!(
                    "the progressive waves of the changes of {} halted here: {why}; {waiting} \
                     other dependents of them wait, untouched, for the next change of their \
                     content",
                    named.join(" and ")
                )
            }
        };
        self.record(WorkloadEvent {
            workload: member.clone(),
            uid,
            type_: EventType::Warning,
            reason: WAVE_HALTED_REASON,
            action: "Rollout",
            note,
        });
    }

    /// How many members of `object`'s wave wait untouched, `member` aside.
    fn waiting_in(&mut self, object: &ConfigKey, member: &WorkloadKey) -> usize {
        let members = match self.waves.by_object.get(object) {
            Some(w) => w.members.clone(),
            None => return 0,
        };
        members
            .iter()
            .filter(|m| *m != member)
            .filter(|m| self.handles(m) && self.decide(m, Trigger::ConfigChange).is_some())
            .count()
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

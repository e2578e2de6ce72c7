//! The touches: pending, in flight, their pacing, and what each workload's last touches left
//! (a backoff, the stamp written, a read afresh): a part of [`State`](super::State) that owns
//! them. It says what is due and in which turn, and keeps the books; what a touch decides (the
//! stamp, whether to read afresh, whether a wave or the flap guard holds it) is the state's.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::follow::WatchedInFlight;
use super::{TOUCH_BURST, WatcherConfig};
use crate::index::{ConfigKey, WorkloadKey};
use crate::pace::{Pacer, Wait};
use crate::rollout::Progress;

pub(super) struct Touches {
    pending: BTreeMap<WorkloadKey, Pending>,
    /// Workloads with a touch in flight. A touch can be held up for seconds (kube's client
    /// retries a 429 after its Retry-After); a second touch sent meanwhile could land first and
    /// the older one after it, putting back the stamp of an older config when the webhook is not
    /// there to recompute it. So each workload has one touch in flight at most, and what became
    /// due meanwhile is decided again once it is done.
    in_flight: HashMap<WorkloadKey, InFlight>,
    /// What each workload's last touches left.
    records: HashMap<WorkloadKey, Record>,
    pacer: Pacer<WorkloadKey>,
    /// What caused the touch that went last: the next touches go round the causes from the one
    /// after it.
    last_cause: Option<Cause>,
    /// The first retry delay of a touch that did not take (`retry_base`); it doubles up to
    /// `retry_max` (`--resync`).
    retry_base: Duration,
    retry_max: Duration,
    /// Not leading, with backoffs or reads afresh possibly left over (leadership just lost, or a
    /// result came back after it was): cleared when next not leading, which a new leader starts
    /// without.
    stale: bool,
}

/// What a workload's last touches left.
#[derive(Debug, Default)]
struct Record {
    /// Its touches did not take lately: when it may be touched again.
    backoff: Option<Backoff>,
    /// When its last `TouchFailed` Event was recorded.
    failure_told: Option<Instant>,
    /// The stamp this watcher's last touch set (the webhook confirmed it). Replacing any other
    /// stamp is preceded by a read afresh: another stamp was computed by the webhook, possibly
    /// from newer config than this watcher's copy.
    written: Option<String>,
    /// Where the read afresh of its references stands.
    recheck: Recheck,
}

/// A touch waiting for its time.
#[derive(Debug, Default)]
pub(super) struct Pending {
    /// When it may be sent, at the earliest; `None` while parked behind a touch in flight. The
    /// workload's [`Backoff`] holds it back further.
    pub(super) due: Option<Instant>,
    /// What changed, for the Event; empty for reconcile.
    pub(super) changed: BTreeSet<ConfigKey>,
    /// When the first change behind this touch was seen, for the latency metric.
    pub(super) seen: Option<Instant>,
}

/// A workload whose last touches did not take (the webhook kept the old stamp, or the patch
/// failed). Its next touch waits until `not_before`, whatever asks for it sooner: the write of a
/// touch the webhook turned back is still stored (its managedFields change), so its own watch
/// event arrives like any other change, before or after the result, and must not bring the retry
/// forward; nor does a new config change while the webhook keeps failing.
#[derive(Debug)]
struct Backoff {
    /// Touches of the workload that did not take, in a row.
    failures: u32,
    /// No touch of the workload before this.
    not_before: Instant,
    /// The stamp the workload kept: a watch event showing another one means a write took, and
    /// the backoff is over.
    stamp: Option<String>,
}

/// A touch in flight: what it was for, to judge its result.
#[derive(Debug)]
pub(super) struct InFlight {
    pub(super) expected: String,
    /// The stamp before the touch.
    pub(super) old: Option<String>,
    pub(super) uid: String,
    pub(super) rolls_by_itself: bool,
    pub(super) pending: Pending,
    /// What the watch showed of the workload meanwhile, to judge its rollout from.
    pub(super) watched: Option<WatchedInFlight>,
}

/// Where the read afresh of a workload's references ([`Effect::Recheck`]) stands.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Recheck {
    /// None under way.
    #[default]
    None,
    /// Its references are being read; its pending touch waits.
    Reading,
    /// They were just read: its next decision may replace the stamp without another read, and
    /// has already had its turn of the pacer.
    Read,
}

/// What caused a touch, for the turns touches take ([`Touches::due_in_turns`]): reconcile (nothing
/// changed), or a change, named by the first object it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Cause {
    Reconcile,
    Change(ConfigKey),
}

impl Cause {
    fn of(changed: &BTreeSet<ConfigKey>) -> Self {
        changed
            .first()
            .map_or(Cause::Reconcile, |c| Cause::Change(c.clone()))
    }

    /// The object that names it: reconcile's turn comes before every change's.
    fn object(&self) -> Option<&ConfigKey> {
        match self {
            Cause::Reconcile => None,
            Cause::Change(c) => Some(c),
        }
    }
}

impl Touches {
    pub(super) fn new(config: &WatcherConfig) -> Self {
        Touches {
            pending: BTreeMap::new(),
            in_flight: HashMap::new(),
            records: HashMap::new(),
            pacer: Pacer::new(config.debounce, config.max_touches_per_second, TOUCH_BURST),
            last_cause: None,
            retry_base: config.retry_base,
            retry_max: config.resync,
            stale: false,
        }
    }

    /// Touches pending and in flight, for the gauges.
    pub(super) fn counts(&self) -> (usize, usize) {
        (self.pending.len(), self.in_flight.len())
    }

    // ----- pending -----

    /// The pending touch of `key`.
    pub(super) fn pending(&self, key: &WorkloadKey) -> Option<&Pending> {
        self.pending.get(key)
    }

    /// The pending touch of `key`, to change when it is due.
    pub(super) fn pending_mut(&mut self, key: &WorkloadKey) -> Option<&mut Pending> {
        self.pending.get_mut(key)
    }

    /// The pending touch of `key`, made if there is none (due at no time yet).
    pub(super) fn want(&mut self, key: WorkloadKey) -> &mut Pending {
        self.pending.entry(key).or_default()
    }

    /// Checks `key` at `due` unless it is due sooner: a check by reconcile's rules.
    pub(super) fn check(&mut self, key: WorkloadKey, due: Instant) {
        self.want(key).due.get_or_insert(due);
    }

    /// Drops the pending touch of `key`, if any.
    pub(super) fn drop_pending(&mut self, key: &WorkloadKey) -> Option<Pending> {
        self.pending.remove(key)
    }

    /// When the pending touch of `key` may be sent: its own time, held back by the workload's
    /// backoff.
    fn due_at(&self, key: &WorkloadKey, pending: &Pending) -> Option<Instant> {
        let due = pending.due?;
        Some(
            match self.records.get(key).and_then(|r| r.backoff.as_ref()) {
                Some(b) => due.max(b.not_before),
                None => due,
            },
        )
    }

    /// When the next pending touch may be sent.
    pub(super) fn next_due(&self) -> Option<Instant> {
        (self.pending.iter())
            .filter_map(|(k, p)| self.due_at(k, p))
            .min()
    }

    /// The workloads whose touch is due at `now`, taken in turns across what caused them (the
    /// first changed object, or reconcile), so that the bucket's tokens go round the changes: a
    /// change used by a few workloads is not queued behind a wave of thousands, in whatever
    /// order their names sort. The turn goes on from the cause after the one whose touch went
    /// last, across ticks: with one token a tick, starting each round at the first cause in
    /// order would serve that cause alone.
    pub(super) fn due_in_turns(&self, now: Instant) -> Vec<WorkloadKey> {
        let mut by_cause: BTreeMap<Option<&ConfigKey>, VecDeque<&WorkloadKey>> = BTreeMap::new();
        for (key, pending) in &self.pending {
            if self.due_at(key, pending).is_some_and(|d| d <= now) {
                by_cause
                    .entry(pending.changed.first())
                    .or_default()
                    .push_back(key);
            }
        }
        let last = self.last_cause.as_ref().map(Cause::object);
        let mut causes: Vec<_> = by_cause.into_iter().collect();
        let after = causes
            .iter()
            .position(|(cause, _)| last.is_some_and(|last| *cause > last))
            .unwrap_or(0);
        causes.rotate_left(after);
        let mut due: Vec<WorkloadKey> = Vec::new();
        while !causes.is_empty() {
            causes.retain_mut(|(_, keys)| match keys.pop_front() {
                Some(key) => {
                    due.push(key.clone());
                    true
                }
                None => false,
            });
        }
        due
    }

    /// Takes the pending touch of `key` to send it now: its cause's turn went.
    pub(super) fn take_to_send(&mut self, key: &WorkloadKey) -> Option<Pending> {
        let pending = self.pending.remove(key)?;
        self.last_cause = Some(Cause::of(&pending.changed));
        Some(pending)
    }

    /// The pacing of touches: the per-workload interval and the global rate.
    pub(super) fn pace(&mut self, now: Instant, key: &WorkloadKey) -> Result<(), Wait> {
        self.pacer.allow(now, key)
    }

    /// Forgets pacing older than it can matter.
    pub(super) fn forget_old(&mut self, now: Instant) {
        self.pacer.forget_old(now);
    }

    // ----- in flight -----

    pub(super) fn is_in_flight(&self, key: &WorkloadKey) -> bool {
        self.in_flight.contains_key(key)
    }

    /// A touch was sent.
    pub(super) fn sent(&mut self, key: WorkloadKey, touch: InFlight) {
        self.in_flight.insert(key, touch);
    }

    /// A touch's result came back: the touch it was for.
    pub(super) fn answered(&mut self, key: &WorkloadKey) -> Option<InFlight> {
        self.in_flight.remove(key)
    }

    /// What the watch showed of a workload with a touch in flight, to judge the rollout from
    /// once its result is in.
    pub(super) fn watched(
        &mut self,
        key: &WorkloadKey,
        stamp: Option<String>,
        rollout: Option<Progress>,
    ) {
        if let Some(touch) = self.in_flight.get_mut(key) {
            touch.watched = Some((stamp, rollout));
        }
    }

    // ----- what touches left -----

    fn record(&mut self, key: &WorkloadKey) -> &mut Record {
        self.records.entry(key.clone()).or_default()
    }

    /// The stamp this watcher's last touch of `key` set.
    pub(super) fn written(&self, key: &WorkloadKey) -> Option<&String> {
        self.records.get(key).and_then(|r| r.written.as_ref())
    }

    /// A touch of `key` took: its backoff ends; `written` when it set the stamp it sent.
    pub(super) fn took(&mut self, key: &WorkloadKey, written: Option<&str>) {
        let record = self.record(key);
        record.backoff = None;
        if let Some(stamp) = written {
            record.written = Some(stamp.to_owned());
        }
    }

    /// How many touches of `key` in a row did not take.
    pub(super) fn failures(&self, key: &WorkloadKey) -> u32 {
        (self.records.get(key))
            .and_then(|r| r.backoff.as_ref())
            .map_or(0, |b| b.failures)
    }

    /// Ends the backoff of `key`, if any.
    pub(super) fn end_backoff(&mut self, key: &WorkloadKey) {
        if let Some(r) = self.records.get_mut(key) {
            r.backoff = None;
        }
    }

    /// The watch shows `key` carrying `stamp`: a stamp other than the one it kept when its
    /// touch did not take means a write took since (another touch's, or an update the webhook
    /// stamped), and the backoff is over.
    pub(super) fn stamp_seen(&mut self, key: &WorkloadKey, stamp: &Option<String>) {
        if let Some(r) = self.records.get_mut(key)
            && r.backoff.as_ref().is_some_and(|b| b.stamp != *stamp)
        {
            r.backoff = None;
        }
    }

    /// A touch of `key` did not take, leaving `kept`: the delay doubles with each such touch in
    /// a row, from `--retry-base` up to `--resync`. Returns how many in a row, and the delay.
    pub(super) fn back_off(
        &mut self,
        key: &WorkloadKey,
        kept: Option<String>,
        now: Instant,
    ) -> (u32, Duration) {
        let (base, max) = (self.retry_base, self.retry_max);
        let backoff = self.record(key).backoff.get_or_insert(Backoff {
            failures: 0,
            not_before: now,
            stamp: None,
        });
        backoff.failures = backoff.failures.saturating_add(1);
        let failures = backoff.failures;
        let retry_in = base.saturating_mul(1 << (failures - 1).min(16)).min(max);
        backoff.not_before = now + retry_in;
        backoff.stamp = kept;
        (failures, retry_in)
    }

    /// Whether a `TouchFailed` Event of `key` may be recorded at `now` (none within `every`);
    /// if so, it is taken as recorded.
    pub(super) fn tell_failure(
        &mut self,
        key: &WorkloadKey,
        now: Instant,
        every: Duration,
    ) -> bool {
        let record = self.record(key);
        if record
            .failure_told
            .is_some_and(|at| now.saturating_duration_since(at) < every)
        {
            return false;
        }
        record.failure_told = Some(now);
        true
    }

    /// Whether the references of `key` are being read afresh.
    pub(super) fn is_reading(&self, key: &WorkloadKey) -> bool {
        self.records
            .get(key)
            .is_some_and(|r| r.recheck == Recheck::Reading)
    }

    /// The references of `key` are being read afresh; its pending touch waits.
    pub(super) fn reading(&mut self, key: &WorkloadKey) {
        if let Some(p) = self.pending.get_mut(key) {
            p.due = None;
        }
        self.record(key).recheck = Recheck::Reading;
    }

    /// The read afresh of `key` came back; whether its touch waited for it.
    pub(super) fn read(&mut self, key: &WorkloadKey) -> bool {
        (self.records.get_mut(key))
            .filter(|r| r.recheck == Recheck::Reading)
            .map(|r| r.recheck = Recheck::None)
            .is_some()
    }

    /// The read afresh of `key` is in and its touch that waited is decided again now, without
    /// another read and its turn of the pacer taken.
    pub(super) fn decide_on_read(&mut self, key: &WorkloadKey, now: Instant) {
        if let Some(p) = self.pending.get_mut(key) {
            p.due = Some(now);
            self.record(key).recheck = Recheck::Read;
        }
    }

    /// Whether `key`'s references were just read afresh (and takes that).
    pub(super) fn just_read(&mut self, key: &WorkloadKey) -> bool {
        (self.records.get_mut(key))
            .filter(|r| r.recheck == Recheck::Read)
            .map(|r| r.recheck = Recheck::None)
            .is_some()
    }

    /// `key` has nothing to do any more: its pending touch, backoff and read go.
    pub(super) fn done(&mut self, key: &WorkloadKey) {
        self.pending.remove(key);
        if let Some(r) = self.records.get_mut(key) {
            r.backoff = None;
            r.recheck = Recheck::None;
        }
    }

    // ----- scope and leadership -----

    /// `namespace` is terminating: its pending touches and backoffs go. Returns how many
    /// pending touches went.
    pub(super) fn terminate(&mut self, namespace: &str) -> usize {
        let before = self.pending.len();
        self.pending.retain(|k, _| k.namespace != namespace);
        for (_, r) in (self.records.iter_mut()).filter(|(k, _)| k.namespace == namespace) {
            r.backoff = None;
        }
        before - self.pending.len()
    }

    /// Leadership was lost, or a result came back without it: what leading left is cleared
    /// when next not leading ([`Touches::not_leading`]).
    pub(super) fn leadership_lost(&mut self) {
        self.stale = true;
    }

    /// Not leading: nothing is pending, and what leading left is cleared.
    pub(super) fn not_leading(&mut self) {
        self.pending.clear();
        if std::mem::take(&mut self.stale) {
            for r in self.records.values_mut() {
                r.backoff = None;
                r.recheck = Recheck::None;
            }
        }
    }

    /// A workload is gone: its pending touch and record go with it (a touch in flight stays
    /// until its result comes back).
    pub(super) fn forget(&mut self, key: &WorkloadKey) {
        self.records.remove(key);
        self.pending.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use confighash_core::refs::{ObjectKind, ObjectRef};
    use confighash_core::workload::WorkloadKind;

    fn touches() -> Touches {
        Touches::new(&WatcherConfig {
            retry_base: Duration::from_secs(1),
            resync: Duration::from_secs(10),
            ..Default::default()
        })
    }

    fn workload(name: &str) -> WorkloadKey {
        WorkloadKey::new(WorkloadKind::DEPLOYMENT, "shop", name)
    }

    fn config(name: &str) -> ConfigKey {
        (
            "shop".to_owned(),
            ObjectRef::new(ObjectKind::ConfigMap, name.to_owned()),
        )
    }

    #[test]
    fn due_touches_take_turns_across_their_causes_from_the_one_after_the_last() {
        let mut t = touches();
        let now = Instant::now();
        // Three of change a, one of change b, two of reconcile.
        for (name, cause) in [
            ("a1", Some("a")),
            ("a2", Some("a")),
            ("a3", Some("a")),
            ("b1", Some("b")),
            ("r1", None),
            ("r2", None),
        ] {
            let p = t.want(workload(name));
            p.changed.extend(cause.map(config));
            p.due = Some(now);
        }
        t.check(workload("later"), now + Duration::from_secs(1));
        let names = |t: &Touches| -> Vec<String> {
            t.due_in_turns(now).iter().map(|k| k.name.clone()).collect()
        };
        assert_eq!(names(&t), ["r1", "a1", "b1", "r2", "a2", "a3"]);
        // a1 went: the next round starts at the cause after a.
        assert!(t.take_to_send(&workload("a1")).is_some());
        assert_eq!(names(&t), ["b1", "r1", "a2", "r2", "a3"]);
        assert_eq!(t.next_due(), Some(now));
    }

    #[test]
    fn a_touch_that_does_not_take_backs_off_doubling_until_a_write_takes() {
        let mut t = touches();
        let now = Instant::now();
        let web = workload("web");
        t.check(web.clone(), now);
        let kept = Some("v1-old".to_owned());
        let delays: Vec<u64> = (0..6)
            .map(|_| t.back_off(&web, kept.clone(), now).1.as_secs())
            .collect();
        assert_eq!(delays, [1, 2, 4, 8, 10, 10], "up to --resync");
        assert_eq!(t.failures(&web), 6);
        assert_eq!(t.next_due(), Some(now + Duration::from_secs(10)));
        // The watch shows the stamp it kept: still backing off; another one: a write took.
        t.stamp_seen(&web, &kept);
        assert_eq!(t.failures(&web), 6);
        t.stamp_seen(&web, &Some("v1-new".to_owned()));
        assert_eq!(t.failures(&web), 0);
        assert_eq!(t.next_due(), Some(now));
        // One failure Event per period.
        assert!(t.tell_failure(&web, now, Duration::from_secs(600)));
        assert!(!t.tell_failure(
            &web,
            now + Duration::from_secs(599),
            Duration::from_secs(600)
        ));
        assert!(t.tell_failure(
            &web,
            now + Duration::from_secs(600),
            Duration::from_secs(600)
        ));
    }

    #[test]
    fn a_read_afresh_parks_the_touch_and_lets_it_go_at_once_without_another() {
        let mut t = touches();
        let now = Instant::now();
        let web = workload("web");
        t.check(web.clone(), now);
        t.reading(&web);
        assert!(t.is_reading(&web));
        assert_eq!(t.next_due(), None, "parked");
        assert!(t.read(&web), "it waited");
        assert!(!t.read(&web), "a second answer waited for nothing");
        t.decide_on_read(&web, now);
        assert!(t.just_read(&web));
        assert!(!t.just_read(&web), "taken once");
    }

    #[test]
    fn leadership_lost_and_a_terminating_namespace_leave_nothing_behind() {
        let mut t = touches();
        let now = Instant::now();
        let (web, other) = (
            workload("web"),
            WorkloadKey::new(WorkloadKind::DEPLOYMENT, "b", "x"),
        );
        t.check(web.clone(), now);
        t.check(other.clone(), now);
        t.back_off(&web, None, now);
        assert_eq!(t.terminate("shop"), 1);
        assert_eq!(t.failures(&web), 0);
        assert_eq!(t.counts(), (1, 0));
        t.back_off(&other, None, now);
        t.reading(&other);
        t.not_leading();
        assert_eq!(t.counts(), (0, 0));
        assert_eq!(t.failures(&other), 1, "kept until leadership was lost");
        t.leadership_lost();
        t.not_leading();
        assert_eq!(t.failures(&other), 0);
        assert!(!t.is_reading(&other));
    }
}

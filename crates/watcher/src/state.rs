//! The watcher's state machine: what it knows (the digest store, the workload index, the
//! namespaces, the change window, the pacer, the touches pending and in flight, the backoff of
//! those that did not take) and what it decides, as plain data.
//!
//! [`State::handle`] takes one [`Input`] (what a watch said, what a touch or a list came back
//! with, a change of leadership or key, or just time passing) at an instant the caller gives,
//! and returns the [`Effect`]s to carry out: touches, Events, namespace lists. Nothing here reads
//! a clock, talks to the API server or spawns a task: [`run()`](super::run()) does, and feeds the
//! results back as inputs. Wall time enters as values of inputs (when a namespace was seen
//! opting in) and of [`State::new`] (when the watcher started). Metrics are counters it bumps and
//! gauges it sets (the touches pending and in flight, after each input).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use kube::api::{ApiResource, GroupVersionKind};
use kube::runtime::events::EventType;

use crate::flap::{FlapGuard, Seen};
use crate::index::{
    ConfigKey, ConfigStore, StoredConfig, WorkloadEntry, WorkloadIndex, WorkloadKey,
};
use crate::pace::{ChangeWindow, Pacer, Wait};
use confighash_cluster::watch::Watched;
use confighash_core::checksum::StampKey;
use confighash_core::refs::ObjectKind;
use confighash_core::rules::{self, Current, Trigger};
use confighash_core::workload::WorkloadKind;
use confighash_metrics::Metrics;

mod follow;
pub use follow::{FOLLOW_AT_MOST, ROLLOUT_COMPLETE_REASON, ROLLOUT_STALLED_REASON};

pub use confighash_core::names::{
    CONFIG_CHANGED_REASON, CONFIG_FLAPPING_REASON, REFERENCES_TOO_LARGE_REASON,
    TOO_MANY_REFERENCES_REASON, TOUCH_FAILED_REASON, WOULD_ROLL_REASON,
};

/// Global token bucket burst.
pub const TOUCH_BURST: u32 = 20;
/// A touch that failed this many times in a row gets a `TouchFailed` Event (one failure alone is
/// usually gone at the first retry).
pub const TOUCH_FAILED_AFTER: u32 = 2;
/// At most one `TouchFailed` Event per workload this often. Longer than kube's Event recorder
/// keeps an Event to count repeats (6 minutes), so each one is a new Event whose message has the
/// error and retry delay of its time, not those of the first.
pub const TOUCH_FAILED_EVERY: Duration = Duration::from_secs(600);
/// The touch outcome a dry run counts instead of a touch.
pub const WOULD_ROLL_OUTCOME: &str = "would-roll";
/// Workloads created within this of the watcher's start (or of their namespace opting in) are
/// not counted as bypassing the webhook: the webhook may not have been reachable yet (readiness,
/// endpoints), and the clocks of the node and the API server may differ a little.
pub const BYPASS_GRACE: Duration = Duration::from_secs(30);

/// The default of `--flap-threshold`.
pub const DEFAULT_FLAP_THRESHOLD: u32 = 5;
/// The default of `--flap-period`.
pub const DEFAULT_FLAP_PERIOD: Duration = Duration::from_secs(600);

/// How the watcher behaves.
#[derive(Debug, Clone)]
pub struct WatcherConfig {
    /// The change window (`--debounce`), also the minimum interval between touches of a workload.
    pub debounce: Duration,
    /// Reconcile period (`--resync`).
    pub resync: Duration,
    /// Global touch rate (`--max-touches-per-second`).
    pub max_touches_per_second: f64,
    pub rules: rules::Options,
    /// List page size: small, so a page of large Secrets stays a few MiB.
    pub page_size: u32,
    /// How often kinds the cluster does not serve (no Argo Rollouts CRD) are looked for again.
    pub kind_recheck: Duration,
    /// First retry delay of a touch the webhook did not confirm; doubles up to `resync`.
    pub retry_base: Duration,
    /// Name of this replica in Events.
    pub identity: String,
    /// `--max-references`: workloads over it are never touched.
    pub max_references: usize,
    /// `--max-reference-bytes`: the decoded bytes the recipe may read for one workload.
    pub max_reference_bytes: u64,
    /// Namespaces never touched whatever their labels: `kube-system`, confighash's own and
    /// `--exclude-namespaces`.
    pub excluded_namespaces: HashSet<String>,
    /// Count workloads that did not pass through the webhook
    /// (`confighash_workloads_bypassed_total`) when created this long after the watcher started
    /// and their namespace opted in; `None` counts none.
    pub bypass_grace: Option<Duration>,
    /// `--dry-run`: decide everything as usual (windows, pacing, reconcile), but record a
    /// `WouldRoll` Event instead of touching, once per workload and stamp it would set.
    pub dry_run: bool,
    /// `--rollout-timeout`: a StatefulSet or DaemonSet whose rollout after a config change is not
    /// complete this long after its touch gets a `RolloutStalled` Event.
    pub rollout_timeout: Duration,
    /// `--flap-threshold`: an object whose change windows open more often than this within
    /// `flap_period` flaps ([`flap`](super::flap)).
    pub flap_threshold: u32,
    /// `--flap-period`.
    pub flap_period: Duration,
    /// `--watch-namespaces`: the only namespaces read, stamped or touched, each watched on its
    /// own ([`Input::WorkloadIn`], [`ConfigSource::WatchIn`]); `None`: the whole cluster.
    pub watch_namespaces: Option<BTreeSet<String>>,
}

impl Default for WatcherConfig {
    fn default() -> Self {
        WatcherConfig {
            debounce: Duration::from_secs(5),
            resync: Duration::from_secs(600),
            max_touches_per_second: 5.0,
            rules: rules::Options::default(),
            page_size: 50,
            kind_recheck: Duration::from_secs(60),
            retry_base: Duration::from_secs(1),
            identity: "confighash".to_owned(),
            max_references: confighash_core::names::DEFAULT_MAX_REFERENCES,
            max_reference_bytes: confighash_core::names::DEFAULT_MAX_REFERENCE_BYTES,
            excluded_namespaces: HashSet::from([confighash_core::names::KUBE_SYSTEM.to_owned()]),
            bypass_grace: Some(BYPASS_GRACE),
            dry_run: false,
            rollout_timeout: Duration::from_secs(600),
            flap_threshold: DEFAULT_FLAP_THRESHOLD,
            flap_period: DEFAULT_FLAP_PERIOD,
            watch_namespaces: None,
        }
    }
}

impl WatcherConfig {
    /// Whether `namespace` is inside `--watch-namespaces` (always, without it).
    pub fn watches(&self, namespace: &str) -> bool {
        self.watch_namespaces
            .as_ref()
            .is_none_or(|list| list.contains(namespace))
    }
}

/// What the state machine is told.
#[derive(Debug)]
pub enum Input {
    /// A ConfigMap or Secret, with what the digest store keeps of it (`None`: it cannot be kept,
    /// as if absent).
    Config(ConfigSource, Watched<ConfigKey, Option<StoredConfig>>),
    /// A Namespace.
    Namespace(Watched<String, NamespaceSeen>),
    /// A workload of one kind, with what the index keeps of it (`None`: nothing confighash
    /// stamps, as if deleted).
    Workload(WorkloadKind, Watched<WorkloadKey, Option<WorkloadEntry>>),
    /// As [`Input::Workload`], from the watch of one namespace (`--watch-namespaces`): its
    /// `Relisted` covers the kind in that namespace only.
    WorkloadIn(
        WorkloadKind,
        String,
        Watched<WorkloadKey, Option<WorkloadEntry>>,
    ),
    /// The watch of one namespace (`--watch-namespaces`) may not list it (403: the RBAC does not
    /// grant it). It counts as listed, empty, so the other namespaces are reconciled; its watch
    /// keeps trying and its first list counts as any other.
    Forbidden(WatchOf, String),
    /// The cluster does not serve this workload kind (no Argo Rollouts CRD): there is nothing to
    /// list, so it counts as listed.
    NotServed(WorkloadKind),
    /// Whether this replica leads, now. Only the leader touches; a new leader reconciles.
    Leader(bool),
    /// The stamp key in use from now on.
    Key(Arc<StampKey>),
    /// A touch ([`Effect::Touch`]) ended.
    Touched(WorkloadKey, TouchResult),
    /// The references of a workload were read afresh ([`Effect::Recheck`]): each object as a
    /// consistent GET found it (`None`: NotFound), or why they could not be read.
    Rechecked(
        WorkloadKey,
        Result<Vec<(ConfigKey, Option<StoredConfig>)>, TouchError>,
    ),
    /// Nothing new: do what is due ([`State::next_wake`]).
    Wake,
}

/// Where a ConfigMap or Secret was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigSource {
    /// The cluster-wide watch of this kind; its `Relisted` covers the kind everywhere.
    Watch(ObjectKind),
    /// The watch of this kind in one namespace (`--watch-namespaces`); its `Relisted` covers
    /// the kind in that namespace only.
    WatchIn(ObjectKind, String),
    /// The list of a namespace that opted in after its objects were left out
    /// ([`Effect::Backfill`]); its `Relisted` covers both kinds in that namespace.
    Backfill { namespace: String, generation: u64 },
}

/// A Namespace as the watcher sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceSeen {
    /// It carries `confighash.dev/enabled=true`.
    pub opted_in: bool,
    /// It is being deleted (`metadata.deletionTimestamp` set, phase `Terminating`): its objects
    /// go one by one, creates in it (Events included) are refused, and nothing in it is touched.
    pub terminating: bool,
    /// When (wall clock) the watcher saw this: workloads created before its opt-in plus
    /// [`BYPASS_GRACE`] are not counted as bypassing the webhook.
    pub at: SystemTime,
}

/// How a touch ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TouchResult {
    /// The patch was applied: the stamp the stored workload carries afterwards.
    Patched(Option<String>),
    /// Nothing was written: the workload no longer carried what the touch believed it carried
    /// (its `test` or resourceVersion precondition failed). The workload as read afterwards has
    /// been reported before this, so it is decided again on it.
    Stale,
    /// The workload no longer exists.
    Gone,
    /// The patch failed.
    Failed(TouchError),
}

/// Why a patch failed, with the error as it may be shown (redacted: never content).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TouchError {
    /// Refused (403): confighash's RBAC does not allow it.
    Forbidden(String),
    Other(String),
}

/// What the state machine asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Set the workload's stamp by a patch conditional on [`Touch::believed`]; report with
    /// [`Input::Touched`]. Never two in flight for one workload.
    Touch(Touch),
    /// Read these references of a workload with consistent GETs before replacing a stamp this
    /// watcher did not write (the webhook may have computed it from newer config than the
    /// watches have shown); report with [`Input::Rechecked`].
    Recheck {
        workload: WorkloadKey,
        configs: Vec<ConfigKey>,
    },
    /// Record a Kubernetes Event on a workload.
    Event(WorkloadEvent),
    /// List the ConfigMaps and Secrets of a namespace; report with [`Input::Config`] from
    /// [`ConfigSource::Backfill`], ending with `Relisted`.
    Backfill { namespace: String, generation: u64 },
    /// A list of many ConfigMaps or Secrets passed through and only digests stayed: give the
    /// free heap back.
    ReleaseMemory,
}

/// A touch to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Touch {
    pub workload: WorkloadKey,
    /// The stamp to set (the webhook confirms or corrects it).
    pub stamp: String,
    /// What changed, for logs: `ConfigMap app-env changed`, or `its stamp was stale`.
    pub why: String,
    /// How many touches of the workload in a row did not take before this one.
    pub attempt: u32,
    /// What the workload carries as far as the watcher knows: the patch writes only if it
    /// still does.
    pub believed: Believed,
}

/// The precondition of a touch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Believed {
    /// The pod template carries this stamp: a JSON patch `test`s it before replacing it.
    Stamp(String),
    /// No stamp: the patch carries this resourceVersion, which the API server checks.
    ResourceVersion(String),
}

/// A Kubernetes Event on a workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadEvent {
    pub workload: WorkloadKey,
    /// The workload's uid, empty when unknown.
    pub uid: String,
    pub type_: EventType,
    pub reason: &'static str,
    pub action: &'static str,
    pub note: String,
}

/// The watch streams whose first list must finish before reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Stream {
    ConfigMaps,
    Secrets,
    Namespaces,
    Workloads(WorkloadKind),
}

/// What one namespace's watch reads (`--watch-namespaces`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WatchOf {
    Config(ObjectKind),
    Workloads(WorkloadKind),
}

impl WatchOf {
    fn stream(self) -> Stream {
        match self {
            WatchOf::Config(kind) => Stream::from_kind(kind),
            WatchOf::Workloads(kind) => Stream::Workloads(kind),
        }
    }
}

/// Per kind of object: the Namespaces, ConfigMaps and Secrets, and each workload kind.
const STREAMS: usize = 3 + WorkloadKind::ALL.len();

impl Stream {
    fn from_kind(kind: ObjectKind) -> Self {
        match kind {
            ObjectKind::ConfigMap => Stream::ConfigMaps,
            ObjectKind::Secret => Stream::Secrets,
        }
    }
}

/// A namespace's objects being listed after it opted in.
#[derive(Debug, Default)]
struct Backfill {
    generation: u64,
    /// Objects the watches reported since the opt-in: what they said is at least as new as the
    /// list, so the list does not overwrite them.
    seen: HashSet<ConfigKey>,
    /// Changes whose window closed during the list, decided once it is in.
    deferred: BTreeSet<ConfigKey>,
    /// What the list showed so far; kept once it ends.
    listed: HashMap<ConfigKey, StoredConfig>,
}

/// A touch waiting for its time.
#[derive(Debug, Default)]
struct Pending {
    /// When it may be sent, at the earliest; `None` while parked behind a touch in flight. The
    /// workload's [`Backoff`] holds it back further.
    due: Option<Instant>,
    /// What changed, for the Event; empty for reconcile.
    changed: BTreeSet<ConfigKey>,
    /// When the first change behind this touch was seen, for the latency metric.
    seen: Option<Instant>,
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
struct InFlight {
    expected: String,
    /// The stamp before the touch.
    old: Option<String>,
    uid: String,
    rolls_by_itself: bool,
    pending: Pending,
    /// What the watch showed of the workload meanwhile, to judge its rollout from.
    watched: Option<follow::WatchedInFlight>,
}

/// The stamp a dry run would have set on a workload, in place of the one it carries.
#[derive(Debug)]
struct WouldRoll {
    /// The stamp the touch would have set.
    stamp: String,
    /// The stamp the workload carried then: once it carries another, something else wrote it,
    /// and what it carries counts again.
    over: Option<String>,
}

/// Everything the watcher knows and decides.
pub struct State {
    config: WatcherConfig,
    key: Arc<StampKey>,
    metrics: Arc<Metrics>,
    leader: bool,
    configs: ConfigStore,
    workloads: WorkloadIndex,
    /// Namespaces opted in, with when this watcher saw them opt in.
    namespaces: HashMap<String, SystemTime>,
    /// Namespaces known not to be opted in: their ConfigMaps and Secrets are not kept.
    excluded: HashSet<String>,
    /// Namespaces that opted in after being excluded, while their objects are listed.
    backfills: HashMap<String, Backfill>,
    backfill_generation: u64,
    /// Workloads labelled `confighash.dev/enabled=true`, by namespace (excluded namespaces left
    /// out): handled wherever they are, so their namespaces' ConfigMaps and Secrets are kept,
    /// opted in or not.
    opted_in_workloads: HashMap<String, HashSet<WorkloadKey>>,
    window: ChangeWindow<ConfigKey>,
    window_seen: Option<Instant>,
    /// Objects whose change windows open too often: their changes are held ([`flap`](super::flap)).
    flaps: FlapGuard<ConfigKey>,
    pacer: Pacer<WorkloadKey>,
    pending: BTreeMap<WorkloadKey, Pending>,
    /// Workloads with a touch in flight. A touch can be held up for seconds (kube's client
    /// retries a 429 after its Retry-After); a second touch sent meanwhile could land first and
    /// the older one after it, putting back the stamp of an older config when the webhook is not
    /// there to recompute it. So each workload has one touch in flight at most, and what became
    /// due meanwhile is decided again once it is done.
    in_flight: HashMap<WorkloadKey, InFlight>,
    /// The streams listed, with the namespace of a namespace's own watch.
    synced: HashSet<(Stream, Option<String>)>,
    reconciled: bool,
    next_resync: Option<Instant>,
    /// Workloads over `--max-references` whose Warning Event this replica has recorded.
    warned_too_many: HashSet<WorkloadKey>,
    /// What caused the touch that went last (a changed object, or `None`: reconcile): the next
    /// touches go round the causes from the one after it.
    last_cause: Option<Option<ConfigKey>>,
    /// Workloads over `--max-reference-bytes` whose Warning Event this replica has recorded
    /// since they last fitted.
    warned_too_large: HashSet<WorkloadKey>,
    /// When the watcher started: workloads created before it are not counted as bypassing.
    started: SystemTime,
    /// Workloads counted as bypassing the webhook, with the uid counted (each uid once).
    bypassed: HashMap<WorkloadKey, String>,
    /// When each workload's last `TouchFailed` Event was recorded.
    touch_failed_at: HashMap<WorkloadKey, Instant>,
    /// Workloads whose touches did not take lately: when each may be touched again.
    backoff: HashMap<WorkloadKey, Backoff>,
    /// Namespaces being deleted: nothing in them is touched and no Event is recorded there.
    terminating: HashSet<String>,
    /// The rollouts after config changes the leader follows ([`follow`]).
    following: HashMap<WorkloadKey, follow::Following>,
    /// What the input being handled asks for.
    effects: Vec<Effect>,
    /// In a dry run, the stamp each workload would carry had its touch been made: decisions
    /// start from it, so one change is recorded once however often it is decided on. Dropped
    /// with the workload.
    would_roll: HashMap<WorkloadKey, WouldRoll>,
    /// The stamp this watcher's last touch of each workload set (the webhook confirmed it).
    /// Replacing any other stamp is preceded by a [`Effect::Recheck`]: another stamp was
    /// computed by the webhook, possibly from newer config than this watcher's copy.
    written: HashMap<WorkloadKey, String>,
    /// Workloads whose references are being read afresh; their pending touch waits.
    rechecking: HashSet<WorkloadKey>,
    /// Workloads whose references were just read afresh: their next decision may replace the
    /// stamp without another read, and has already had its turn of the pacer.
    rechecked: HashSet<WorkloadKey>,
}

impl State {
    /// A watcher that knows nothing yet, not leading, started at `started` (wall clock).
    pub fn new(
        config: WatcherConfig,
        key: Arc<StampKey>,
        metrics: Arc<Metrics>,
        started: SystemTime,
    ) -> Self {
        metrics.set_synced(false);
        metrics.set_leader(false);
        State {
            window: ChangeWindow::new(config.debounce),
            flaps: FlapGuard::new(config.flap_threshold, config.flap_period),
            pacer: Pacer::new(config.debounce, config.max_touches_per_second, TOUCH_BURST),
            config,
            key,
            metrics,
            leader: false,
            configs: ConfigStore::default(),
            workloads: WorkloadIndex::default(),
            namespaces: HashMap::new(),
            excluded: HashSet::new(),
            backfills: HashMap::new(),
            backfill_generation: 0,
            opted_in_workloads: HashMap::new(),
            window_seen: None,
            pending: BTreeMap::new(),
            in_flight: HashMap::new(),
            synced: HashSet::new(),
            reconciled: false,
            next_resync: None,
            warned_too_many: HashSet::new(),
            last_cause: None,
            warned_too_large: HashSet::new(),
            started,
            bypassed: HashMap::new(),
            touch_failed_at: HashMap::new(),
            backoff: HashMap::new(),
            terminating: HashSet::new(),
            following: HashMap::new(),
            effects: Vec::new(),
            would_roll: HashMap::new(),
            written: HashMap::new(),
            rechecking: HashSet::new(),
            rechecked: HashSet::new(),
        }
    }

    /// Whether this replica leads, as last told.
    pub fn is_leader(&self) -> bool {
        self.leader
    }

    /// The stamp key in use.
    pub fn key(&self) -> &Arc<StampKey> {
        &self.key
    }

    /// Whether every watch has listed.
    pub fn is_synced(&self) -> bool {
        self.synced.len() == self.streams()
    }

    /// How many streams must list: every kind once, or every kind but the Namespaces once per
    /// namespace watched (`--watch-namespaces`).
    fn streams(&self) -> usize {
        match &self.config.watch_namespaces {
            None => STREAMS,
            Some(list) => 1 + (STREAMS - 1) * list.len(),
        }
    }

    /// When something is due next: hand [`Input::Wake`] then.
    pub fn next_wake(&self) -> Option<Instant> {
        let pending = self
            .pending
            .iter()
            .filter_map(|(k, p)| self.due_at(k, p))
            .min();
        // The deadline of a followed rollout wakes it too.
        let pending = pending.into_iter().chain(self.next_follow_deadline()).min();
        [
            self.window.closes_at(),
            pending,
            self.next_resync,
            self.flaps.next_end(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Takes one input at `now`, does what is due by then, and says what to do.
    pub fn handle(&mut self, input: Input, now: Instant) -> Vec<Effect> {
        match input {
            Input::Config(ConfigSource::Watch(kind), change) => {
                self.config_watched(kind, None, change, now)
            }
            Input::Config(ConfigSource::WatchIn(kind, namespace), change) => {
                self.config_watched(kind, Some(namespace), change, now)
            }
            Input::Config(
                ConfigSource::Backfill {
                    namespace,
                    generation,
                },
                change,
            ) => self.namespace_listed(namespace, generation, change, now),
            Input::Namespace(change) => self.namespace_watched(change, now),
            Input::Workload(kind, change) => self.workload_watched(kind, None, change, now),
            Input::WorkloadIn(kind, namespace, change) => {
                self.workload_watched(kind, Some(namespace), change, now)
            }
            Input::Forbidden(what, namespace) => {
                if !self
                    .synced
                    .contains(&(what.stream(), Some(namespace.clone())))
                {
                    tracing::debug!(?what, namespace, "may not list: counted as listed, empty");
                    self.listed(what.stream(), Some(namespace));
                }
            }
            Input::NotServed(kind) => match self.config.watch_namespaces.clone() {
                None => self.listed(Stream::Workloads(kind), None),
                Some(list) => {
                    for namespace in list {
                        self.listed(Stream::Workloads(kind), Some(namespace));
                    }
                }
            },
            Input::Leader(leader) => self.leadership(leader, now),
            Input::Key(key) => self.key = key,
            Input::Touched(key, result) => self.touched(key, result, now),
            Input::Rechecked(key, result) => self.rechecked(key, result, now),
            Input::Wake => {}
        }
        self.tick(now);
        self.metrics
            .set_touches(self.pending.len(), self.in_flight.len());
        self.metrics
            .set_touch_wave_eta(self.pending.len(), self.config.max_touches_per_second);
        self.metrics.set_rollouts_followed(self.following.len());
        std::mem::take(&mut self.effects)
    }

    /// When a pending touch may be sent: its own time, held back by the workload's backoff.
    fn due_at(&self, key: &WorkloadKey, pending: &Pending) -> Option<Instant> {
        let due = pending.due?;
        Some(match self.backoff.get(key) {
            Some(b) => due.max(b.not_before),
            None => due,
        })
    }

    // ----- watches -----

    /// A ConfigMap or Secret watch's change; `scope`: the namespace of a namespace's own watch.
    fn config_watched(
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
                    self.configs.remove(&key);
                    self.content_changed(key, now);
                }
                self.listed(Stream::from_kind(kind), scope);
            }
        }
    }

    fn config(&mut self, key: ConfigKey, state: Option<StoredConfig>, now: Instant) {
        if !self.keeps_configs(&key.0) {
            // Not opted in, nor any workload there: nothing of it is kept (filtered in memory).
            return;
        }
        if let Some(backfill) = self.backfills.get_mut(&key.0) {
            backfill.seen.insert(key.clone());
        }
        let changed = match state {
            Some(s) => self.configs.upsert(key.clone(), s),
            None => self.configs.remove(&key),
        };
        self.metrics
            .set_watched(key.1.kind.as_str(), self.configs.count(key.1.kind));
        if changed {
            self.content_changed(key, now);
        }
    }

    /// The list of a namespace that opted in: kept aside until it ends, then what the watches
    /// have not reported since goes in, and the namespace's workloads are compared.
    fn namespace_listed(
        &mut self,
        namespace: String,
        generation: u64,
        change: Watched<ConfigKey, Option<StoredConfig>>,
        now: Instant,
    ) {
        let Some(backfill) = self
            .backfills
            .get_mut(&namespace)
            .filter(|b| b.generation == generation)
        else {
            return; // Opted out (or in again) since it started.
        };
        let all = match change {
            Watched::Applied(key, Some(stored)) => {
                backfill.listed.insert(key, stored);
                return;
            }
            Watched::Applied(key, None) | Watched::Deleted(key) => {
                backfill.listed.remove(&key);
                return;
            }
            Watched::Relisted(all) => all,
        };
        let Some(backfill) = self.backfills.remove(&namespace) else {
            return;
        };
        tracing::debug!(namespace, objects = all.len(), "namespace listed");
        for (key, stored) in backfill.listed {
            // What a watch reported since the opt-in is at least as new as the list.
            if all.contains(&key) && !backfill.seen.contains(&key) {
                self.configs.upsert(key, stored);
            }
        }
        self.count_all_configs();
        self.effects.push(Effect::ReleaseMemory);
        if self.is_synced() {
            if !backfill.deferred.is_empty() {
                self.window_closed(backfill.deferred, None, now);
            }
            self.compare_namespace(&namespace, now);
        }
    }

    fn namespace_watched(&mut self, change: Watched<String, NamespaceSeen>, now: Instant) {
        let (name, seen) = match change {
            Watched::Applied(name, seen) => (name, Some(seen)),
            Watched::Deleted(name) => (name, None),
            Watched::Relisted(seen) => {
                self.namespaces.retain(|n, _| seen.contains(n));
                self.excluded.retain(|n| seen.contains(n));
                self.backfills.retain(|n, _| seen.contains(n));
                self.terminating.retain(|n| seen.contains(n));
                self.listed(Stream::Namespaces, None);
                return;
            }
        };
        match seen {
            Some(s) if s.terminating => self.terminate(&name),
            // A namespace never stops terminating; one of the same name is a new namespace.
            _ => {
                self.terminating.remove(&name);
            }
        }
        // An excluded namespace, or one outside `--watch-namespaces`, is never opted in,
        // whatever its labels say.
        match seen.map(|s| {
            (
                s.opted_in
                    && !self.config.excluded_namespaces.contains(&name)
                    && self.config.watches(&name),
                s.at,
            )
        }) {
            Some((true, at)) => {
                let was_excluded = self.excluded.remove(&name);
                if self.namespaces.contains_key(&name) {
                    return;
                }
                self.namespaces.insert(name.clone(), at);
                if self.terminating.contains(&name) {
                    return; // Nothing there is decided on: no list, no comparison.
                }
                if was_excluded && !self.opted_in_workloads.contains_key(&name) {
                    // Its objects were left out: list them; compare once they are in.
                    self.start_backfill(name);
                } else if self.is_synced() {
                    self.compare_namespace(&name, now);
                }
            }
            Some((false, _)) => {
                self.namespaces.remove(&name);
                if self.opted_in_workloads.contains_key(&name) {
                    // Workloads there opted in by their label: its objects are still kept (and a
                    // list in progress goes on); the others are no longer decided on.
                    self.excluded.insert(name);
                    return;
                }
                self.backfills.remove(&name);
                self.configs.remove_namespace(&name);
                self.excluded.insert(name);
                self.count_all_configs();
            }
            None => {
                // Deleted: its objects' own deletions follow on their watches.
                self.namespaces.remove(&name);
                self.backfills.remove(&name);
                self.excluded.remove(&name);
            }
        }
    }

    /// A namespace is being deleted: what was pending there is dropped, and from now on nothing
    /// there is decided on (its workloads and config go one by one, which is no change to roll
    /// for). A touch in flight there ends without an Event or a retry.
    fn terminate(&mut self, namespace: &str) {
        if !self.terminating.insert(namespace.to_owned()) {
            return;
        }
        let before = self.pending.len();
        self.pending.retain(|k, _| k.namespace != namespace);
        self.backoff.retain(|k, _| k.namespace != namespace);
        self.stop_following_all("gone", |k| k.namespace == namespace);
        tracing::info!(
            namespace,
            dropped = before - self.pending.len(),
            "namespace terminating: nothing in it is touched any more"
        );
    }

    /// A workload watch's change; `scope`: the namespace of a namespace's own watch.
    fn workload_watched(
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
                    && entry.generation < known.generation
                {
                    // Older than what a touch's response already showed: the watch is behind.
                    tracing::debug!(workload = %key, generation = entry.generation,
                        known = known.generation, "an older state of the workload; ignored");
                    return;
                }
                if entry.too_many_references
                    && self.leader
                    && !self.terminating.contains(&key.namespace)
                    && self.warned_too_many.insert(key.clone())
                {
                    self.warn_too_many_references(&key, &entry.uid);
                }
                self.count_if_bypassed(&key, &entry);
                if self
                    .backoff
                    .get(&key)
                    .is_some_and(|b| b.stamp != entry.stamp)
                {
                    // Its stamp changed since the last touch that did not take: a write took
                    // (another touch's, or an update the webhook stamped).
                    self.backoff.remove(&key);
                }
                self.forget_would_roll_unless_over(&key, &entry.stamp);
                let opts_in = self.opts_in(&key, &entry);
                self.follow_watched(&key, &entry, now);
                self.workloads.upsert(key.clone(), entry);
                self.workload_opt_in(&key, opts_in);
                // A workload whose stamp is stale when it arrives (its ConfigMap's event came
                // first, on another watch, and found nothing referencing it) is checked again
                // once a window has passed, by reconcile's rules.
                if self.is_synced() && self.decide(&key, Trigger::Reconcile).is_some() {
                    let due = now + self.config.debounce;
                    self.pending.entry(key).or_default().due.get_or_insert(due);
                }
            }
            Watched::Applied(key, None) | Watched::Deleted(key) => {
                self.warned_too_many.remove(&key);
                self.warned_too_large.remove(&key);
                self.bypassed.remove(&key);
                self.forget_touches(&key);
                self.workloads.remove(&key);
                self.workload_opt_in(&key, false);
            }
            Watched::Relisted(seen) => {
                for key in self.workloads.keys_of(kind) {
                    let in_scope = scope.as_deref().is_none_or(|s| s == key.namespace);
                    if in_scope && !seen.contains(&key) {
                        self.bypassed.remove(&key);
                        self.forget_touches(&key);
                        self.workloads.remove(&key);
                        self.workload_opt_in(&key, false);
                    }
                }
                self.metrics
                    .set_watched(kind.kind(), self.workloads.keys_of(kind).len());
                self.listed(Stream::Workloads(kind), scope);
            }
        }
    }

    /// Whether a workload is handled wherever its namespace stands: labelled
    /// `confighash.dev/enabled=true`, outside the excluded namespaces.
    fn opts_in(&self, key: &WorkloadKey, entry: &WorkloadEntry) -> bool {
        entry.opted_in
            && !self.config.excluded_namespaces.contains(&key.namespace)
            && self.config.watches(&key.namespace)
    }

    /// Whether the ConfigMaps and Secrets of a namespace are kept: it is not known to be left
    /// out (opted in, or not seen yet), or a workload there opted in by its label.
    fn keeps_configs(&self, namespace: &str) -> bool {
        !self.excluded.contains(namespace) || self.opted_in_workloads.contains_key(namespace)
    }

    /// Records whether a workload is opted in by its label, and keeps its namespace's
    /// ConfigMaps and Secrets while one is: the first such workload of a namespace whose objects
    /// were left out has them listed (the namespace's workloads are decided once they are in),
    /// and once the last is gone (deleted, or relabelled) from a namespace that is not opted in
    /// they are dropped.
    fn workload_opt_in(&mut self, key: &WorkloadKey, opted_in: bool) {
        let namespace = &key.namespace;
        if opted_in {
            let workloads = self
                .opted_in_workloads
                .entry(namespace.clone())
                .or_default();
            if !workloads.insert(key.clone()) || workloads.len() > 1 {
                return;
            }
            if self.excluded.contains(namespace)
                && !self.terminating.contains(namespace)
                && !self.backfills.contains_key(namespace)
            {
                tracing::info!(workload = %key, "a workload opted in by its label: listing the ConfigMaps and Secrets of its namespace");
                self.start_backfill(namespace.clone());
            }
        } else {
            let Some(workloads) = self.opted_in_workloads.get_mut(namespace) else {
                return;
            };
            if !workloads.remove(key) || !workloads.is_empty() {
                return;
            }
            self.opted_in_workloads.remove(namespace);
            if self.excluded.contains(namespace) {
                tracing::info!(
                    namespace,
                    "no workload there is opted in any more: its ConfigMaps and Secrets are no longer kept"
                );
                self.backfills.remove(namespace);
                self.configs.remove_namespace(namespace);
                self.count_all_configs();
            }
        }
    }

    /// A workload is gone: what was pending for it goes too, and its backoff with it.
    fn forget_touches(&mut self, key: &WorkloadKey) {
        self.touch_failed_at.remove(key);
        self.pending.remove(key);
        self.backoff.remove(key);
        self.would_roll.remove(key);
        self.written.remove(key);
        self.rechecking.remove(key);
        self.rechecked.remove(key);
        self.stop_following(key, "gone");
    }

    /// A watch's list is in (or there is nothing to list).
    fn listed(&mut self, stream: Stream, scope: Option<String>) {
        if matches!(stream, Stream::ConfigMaps | Stream::Secrets) {
            // A whole list of the cluster's config passed through; only digests stay.
            self.effects.push(Effect::ReleaseMemory);
        }
        self.synced.insert((stream, scope));
        tracing::debug!(
            ?stream,
            synced = self.synced.len(),
            of = self.streams(),
            "listed"
        );
        self.metrics.set_synced(self.is_synced());
    }

    fn leadership(&mut self, leader: bool, now: Instant) {
        if leader == self.leader {
            return;
        }
        self.leader = leader;
        self.metrics.set_leader(leader);
        if !leader {
            // A new leader does not know what this one followed.
            self.stop_following_all("abandoned", |_| true);
        }
        if leader && self.is_synced() {
            // A new leader compares everything: changes may have passed while another replica
            // led, or none did.
            self.reconcile(now);
        }
    }

    fn count_all_configs(&self) {
        for kind in [ObjectKind::ConfigMap, ObjectKind::Secret] {
            self.metrics
                .set_watched(kind.as_str(), self.configs.count(kind));
        }
    }

    /// Lists the ConfigMaps and Secrets of a namespace that opted in after they were left out.
    /// Until the list is in, its workloads are not decided on: their digests are incomplete.
    fn start_backfill(&mut self, namespace: String) {
        self.backfill_generation += 1;
        let generation = self.backfill_generation;
        self.backfills.insert(
            namespace.clone(),
            Backfill {
                generation,
                ..Backfill::default()
            },
        );
        self.effects.push(Effect::Backfill {
            namespace,
            generation,
        });
    }

    /// Records that a workload over `--max-references` is never stamped or rolled.
    fn warn_too_many_references(&mut self, key: &WorkloadKey, uid: &str) {
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
    fn warn_too_large(&mut self, key: &WorkloadKey, uid: &str, bytes: u64) {
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
    fn count_if_bypassed(&mut self, key: &WorkloadKey, entry: &WorkloadEntry) {
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
        let opted_in = self.namespaces.get(&key.namespace).copied().or_else(|| {
            // Opted in by its own label when first seen: the webhook was called for its CREATE.
            // (A workload seen before the label was added was not stamped by the write that
            // added it, and is not counted.)
            (self.opts_in(key, entry) && self.workloads.get(key).is_none()).then_some(self.started)
        });
        let (Some(opted_in), Some(created)) = (opted_in, entry.created) else {
            return;
        };
        if self.bypassed.get(key) == Some(&entry.uid) {
            return;
        }
        // creationTimestamp has whole seconds.
        let after = unix_seconds(self.started.max(opted_in) + grace);
        if created < after {
            return;
        }
        self.bypassed.insert(key.clone(), entry.uid.clone());
        self.metrics.workload_bypassed();
        tracing::warn!(workload = %key, "an opted-in workload carries neither a stamp nor the unstamped marker: the API server did not call the webhook when it was written");
    }

    // ----- changes and decisions -----

    /// A referenced object's content changed (or it appeared or went away).
    fn content_changed(&mut self, key: ConfigKey, now: Instant) {
        // Before the first sync every object is new; reconcile compares stamps afterwards.
        // Whether the namespace is opted in is checked when the window closes: its Namespace
        // event may come later than this change, on another watch.
        if !self.is_synced() || !self.workloads.is_referenced(&key) {
            tracing::debug!(object = %key.1, namespace = key.0, synced = self.is_synced(),
                "change to an object nothing references yet, or before the first sync");
            return;
        }
        if self.terminating.contains(&key.0) {
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
        self.window_seen.get_or_insert(now);
        self.window.record(now, key);
    }

    /// An object started flapping: its dependents get a Warning Event, once per episode.
    fn flapping(&mut self, key: &ConfigKey) {
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
    fn flap_intervals_due(&mut self, now: Instant) {
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
    fn held_until(&self, key: &WorkloadKey, pending: &Pending) -> Option<Instant> {
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
    fn compare_namespace(&mut self, namespace: &str, now: Instant) {
        let due = now + self.config.debounce;
        let keys: Vec<WorkloadKey> = self
            .workloads
            .iter()
            .filter(|(k, _)| k.namespace == namespace)
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            if self.decide(&key, Trigger::Reconcile).is_some() {
                self.pending.entry(key).or_default().due.get_or_insert(due);
            }
        }
    }

    fn tick(&mut self, now: Instant) {
        if self.is_synced() && !self.reconciled {
            self.reconciled = true;
            self.reconcile(now);
        }
        if self.next_resync.is_some_and(|t| now >= t) {
            self.reconcile(now);
        }
        if let Some(changes) = self.window.take_if_closed(now) {
            tracing::debug!(changes = changes.len(), "change window closed");
            let seen = self.window_seen.take();
            self.window_closed(changes, seen, now);
        }
        self.flap_intervals_due(now);
        self.touch_due(now);
        self.follow_due(now);
        self.pacer.forget_old(now);
    }

    /// Decides the stamp a workload should carry now, by the shared rules; `None` when it
    /// should not be touched. A workload whose references hold more than
    /// `--max-reference-bytes` gets a Warning Event each time it goes over.
    fn decide(&mut self, key: &WorkloadKey, trigger: Trigger<'_>) -> Option<String> {
        let entry = self.workloads.get(key)?;
        if !(self.namespaces.contains_key(&key.namespace) || self.opts_in(key, entry))
            || self.backfills.contains_key(&key.namespace)
            || self.terminating.contains(&key.namespace)
        {
            return None;
        }
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
            Some((bytes, uid)) if self.warned_too_large.insert(key.clone()) => {
                self.warn_too_large(key, &uid, bytes);
            }
            Some(_) => {}
            None if !self.warned_too_large.is_empty() => {
                self.warned_too_large.remove(key);
            }
            None => {}
        }
        stamp
    }

    fn window_closed(&mut self, changes: BTreeSet<ConfigKey>, seen: Option<Instant>, now: Instant) {
        tracing::debug!(?changes, "window");
        let mut affected: BTreeMap<WorkloadKey, BTreeSet<ConfigKey>> = BTreeMap::new();
        for change in &changes {
            for w in self.workloads.dependents(change) {
                affected.entry(w).or_default().insert(change.clone());
            }
        }
        for (workload, why) in affected {
            if let Some(backfill) = self.backfills.get_mut(&workload.namespace) {
                // Decided once the namespace's objects are all in.
                backfill.deferred.extend(why);
                continue;
            }
            if self.decide(&workload, Trigger::ConfigChange).is_none() {
                continue;
            }
            let p = self.pending.entry(workload).or_default();
            p.changed.extend(why);
            p.due.get_or_insert(now);
            if p.seen.is_none() {
                p.seen = seen;
            }
        }
    }

    fn reconcile(&mut self, now: Instant) {
        self.next_resync = Some(now + self.config.resync);
        self.flaps.forget_old(now);
        if !self.leader {
            return;
        }
        let keys: Vec<WorkloadKey> = self.workloads.iter().map(|(k, _)| k.clone()).collect();
        let mut mismatches = 0;
        for key in keys {
            if self.decide(&key, Trigger::Reconcile).is_some() {
                mismatches += 1;
                self.pending.entry(key).or_default().due.get_or_insert(now);
            }
        }
        self.metrics.reconcile_mismatches(mismatches);
        if mismatches > 0 {
            tracing::info!(mismatches, "reconcile found stale stamps");
        }
    }

    // ----- touches -----

    fn touch_due(&mut self, now: Instant) {
        if !self.leader {
            // The leader does this; a replica that becomes leader reconciles, afresh.
            self.pending.clear();
            self.backoff.clear();
            self.rechecking.clear();
            self.rechecked.clear();
            return;
        }
        // Taken in turns across what caused them (the first changed object, or reconcile), so
        // that the bucket's tokens go round the changes: a change used by a few workloads is
        // not queued behind a wave of thousands, in whatever order their names sort.
        let mut by_cause: BTreeMap<Option<&ConfigKey>, std::collections::VecDeque<&WorkloadKey>> =
            BTreeMap::new();
        for (key, pending) in &self.pending {
            if self.due_at(key, pending).is_some_and(|d| d <= now) {
                by_cause
                    .entry(pending.changed.iter().next())
                    .or_default()
                    .push_back(key);
            }
        }
        // The turn goes on from the cause after the one whose touch went last, across ticks:
        // with one token a tick, starting each round at the first cause in order would serve
        // that cause alone.
        let last = self.last_cause.as_ref().map(Option::as_ref);
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
        for key in due {
            if self.in_flight.contains_key(&key) || self.rechecking.contains(&key) {
                // Parked until its touch or read in flight is done (`Input::Touched`,
                // `Input::Rechecked`).
                if let Some(p) = self.pending.get_mut(&key) {
                    p.due = None;
                }
                continue;
            }
            if let Some(until) = self
                .pending
                .get(&key)
                .and_then(|p| self.held_until(&key, p))
                && let Some(p) = self.pending.get_mut(&key)
            {
                p.due = Some(until);
                continue;
            }
            // Recomputed now: the webhook or another change may already have set it.
            let trigger = match self.pending.get(&key) {
                Some(p) if p.changed.is_empty() => Trigger::Reconcile,
                _ => Trigger::ConfigChange,
            };
            let Some(expected) = self.decide(&key, trigger) else {
                // Nothing to do any more, nor to back off from.
                self.pending.remove(&key);
                self.backoff.remove(&key);
                self.rechecked.remove(&key);
                continue;
            };
            // Just read afresh: decided on what was read, and that read took this touch's turn
            // of the pacer already.
            let fresh = self.rechecked.remove(&key);
            let paced = if fresh {
                Ok(())
            } else {
                self.pacer.allow(now, &key)
            };
            match paced {
                Ok(()) => {
                    if !fresh && let Some(configs) = self.needs_recheck(&key) {
                        if let Some(p) = self.pending.get_mut(&key) {
                            p.due = None;
                        }
                        self.rechecking.insert(key.clone());
                        self.effects.push(Effect::Recheck {
                            workload: key,
                            configs,
                        });
                        continue;
                    }
                    let Some(p) = self.pending.remove(&key) else {
                        continue;
                    };
                    if let Some(seen) = p.seen {
                        self.metrics.observe_touch_latency(
                            now.saturating_duration_since(seen).as_secs_f64(),
                        );
                    }
                    self.last_cause = Some(p.changed.iter().next().cloned());
                    self.start_touch(key, expected, p);
                }
                Err(wait) => {
                    if let Wait::RateLimited(_) = wait {
                        self.metrics.touch_rate_limited();
                    }
                    if let Some(p) = self.pending.get_mut(&key) {
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
    fn needs_recheck(&self, key: &WorkloadKey) -> Option<Vec<ConfigKey>> {
        let entry = self.workloads.get(key)?;
        let stamp = entry.stamp.as_ref()?;
        if self.written.get(key) == Some(stamp) {
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
    fn rechecked(
        &mut self,
        key: WorkloadKey,
        result: Result<Vec<(ConfigKey, Option<StoredConfig>)>, TouchError>,
        now: Instant,
    ) {
        let waited = self.rechecking.remove(&key);
        match result {
            Ok(configs) => {
                for (config, stored) in configs {
                    tracing::debug!(workload = %key, object = %config.1,
                        resource_version = stored.as_ref().map_or("(absent)", |s| &*s.resource_version),
                        held = self.configs.get(&config).map_or_else(|| "(none)".into(), |s| s.resource_version),
                        "read afresh before a touch");
                    self.config(config, stored, now);
                }
                if waited && let Some(p) = self.pending.get_mut(&key) {
                    self.rechecked.insert(key);
                    p.due = Some(now);
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
                    pending: self.pending.remove(&key).unwrap_or_default(),
                    watched: None,
                };
                self.retry(&key, failed, what, now);
            }
        }
    }

    fn start_touch(&mut self, key: WorkloadKey, expected: String, pending: Pending) {
        if self.config.dry_run {
            return self.would_touch(key, expected, pending);
        }
        let Some(entry) = self.workloads.get(&key) else {
            return;
        };
        let why = if pending.changed.is_empty() {
            STALE.to_owned()
        } else {
            changed_names(&pending.changed)
        };
        let believed = match &entry.stamp {
            Some(stamp) => Believed::Stamp(stamp.clone()),
            None => Believed::ResourceVersion(entry.resource_version.clone()),
        };
        self.effects.push(Effect::Touch(Touch {
            workload: key.clone(),
            stamp: expected.clone(),
            why,
            attempt: self.backoff.get(&key).map_or(0, |b| b.failures),
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
        self.in_flight.insert(key, in_flight);
    }

    /// A touch ended: judge it, back off and retry it if it did not take, and let the workload be
    /// touched again.
    fn touched(&mut self, key: WorkloadKey, result: TouchResult, now: Instant) {
        let Some(touch) = self.in_flight.remove(&key) else {
            return;
        };
        match result {
            TouchResult::Patched(stamp)
                if stamp != touch.old || stamp.as_deref() == Some(&touch.expected) =>
            {
                self.metrics.touch("touched");
                self.backoff.remove(&key);
                if stamp.as_deref() == Some(&touch.expected) {
                    self.written.insert(key.clone(), touch.expected.clone());
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
                self.follow(&key, &touch, stamp.as_deref(), now);
            }
            TouchResult::Patched(_) => {
                // The webhook turned the touch back: its lookup failed, it may not read the
                // references, or it decided otherwise. The write was still stored (its watch
                // event comes like any other), but the pod template did not change.
                self.metrics.touch("kept-by-webhook");
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
                self.metrics.touch("stale");
                tracing::info!(
                    "the workload no longer carried what the touch expected; deciding again"
                );
                let p = self.pending.entry(key.clone()).or_default();
                p.changed.extend(touch.pending.changed);
                p.seen = p.seen.or(touch.pending.seen);
                p.due = Some(now);
            }
            TouchResult::Gone => {
                self.metrics.touch("gone");
                self.backoff.remove(&key);
            }
            TouchResult::Failed(e) => {
                self.metrics.touch("error");
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
        if let Some(p) = self.pending.get_mut(&key) {
            p.due.get_or_insert(now);
        }
    }

    /// A touch that did not take: back off (the delay doubles with each such touch in a row, from
    /// `retry_base` up to `resync`) and try again then, for the same changes.
    fn retry(&mut self, key: &WorkloadKey, failed: InFlight, what: String, now: Instant) {
        if self.terminating.contains(&key.namespace) {
            tracing::info!("not retried: its namespace is terminating");
            return;
        }
        let backoff = self.backoff.entry(key.clone()).or_insert(Backoff {
            failures: 0,
            not_before: now,
            stamp: None,
        });
        backoff.failures = backoff.failures.saturating_add(1);
        let failures = backoff.failures;
        let retry_in = self
            .config
            .retry_base
            .saturating_mul(1 << (failures - 1).min(16))
            .min(self.config.resync);
        backoff.not_before = now + retry_in;
        backoff.stamp = failed.old;
        self.metrics.touch_retry();
        tracing::info!(
            failures,
            retry_in = %format_delay(retry_in),
            "retrying"
        );
        // Due at once, so held back by the backoff alone: a check a watch event asked for a
        // window from now is superseded.
        let p = self.pending.entry(key.clone()).or_default();
        p.due = Some(now);
        // Keep what the touch was for, so the retry is the same kind of touch (a config change
        // replaces a foreign stamp; reconcile would not) and its Event names it.
        p.changed.extend(failed.pending.changed);
        p.seen = p.seen.or(failed.pending.seen);
        self.touch_failed(key, &what, retry_in, failures, now);
    }

    /// Records a Warning Event saying what failed and when it is retried, once a workload's touch
    /// has failed [`TOUCH_FAILED_AFTER`] times in a row, at most once per [`TOUCH_FAILED_EVERY`].
    fn touch_failed(
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
        let recent = |at: &Instant| now.saturating_duration_since(*at) < TOUCH_FAILED_EVERY;
        if self.touch_failed_at.get(key).is_some_and(recent) {
            return;
        }
        let uid = entry.uid.clone();
        self.touch_failed_at.retain(|_, at| recent(at));
        self.touch_failed_at.insert(key.clone(), now);
        let why = match self.pending.get(key) {
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
    fn record(&mut self, event: WorkloadEvent) {
        if self.terminating.contains(&event.workload.namespace) {
            tracing::debug!(workload = %event.workload, reason = event.reason,
                "Event not recorded: its namespace is terminating");
            return;
        }
        self.effects.push(Effect::Event(event));
    }

    // ----- dry run -----

    /// A dry run's touch: nothing is written; the stamp it would set is remembered, counted and
    /// recorded as a `WouldRoll` Event.
    fn would_touch(&mut self, key: WorkloadKey, expected: String, pending: Pending) {
        let Some(entry) = self.workloads.get(&key) else {
            return;
        };
        let (uid, rolls_by_itself) = (entry.uid.clone(), entry.rolls_by_itself);
        let over = entry.stamp.clone();
        self.metrics.touch(WOULD_ROLL_OUTCOME);
        tracing::info!(workload = %key, stamp = %expected, changed = ?pending.changed,
            "dry run: would re-stamp the pod template");
        self.would_roll.insert(
            key.clone(),
            WouldRoll {
                stamp: expected,
                over,
            },
        );
        self.record(would_roll(&key, &uid, &pending.changed, rolls_by_itself));
    }

    /// In a dry run, a workload as its touch would have left it: with the stamp the touch would
    /// have set (and, as the webhook would, without the marker), while it still carries the stamp
    /// it carried then. Otherwise `current` as it is.
    fn as_if_touched<'a>(
        &'a self,
        key: &WorkloadKey,
        entry: &WorkloadEntry,
        current: Current<'a>,
    ) -> Current<'a> {
        match self.would_roll.get(key) {
            Some(would) if would.over == entry.stamp => Current {
                stamp: Some(&would.stamp),
                marker: false,
            },
            _ => current,
        }
    }

    /// Forgets what a dry run would have set on a workload that no longer carries the stamp it
    /// carried then: something else wrote it.
    fn forget_would_roll_unless_over(&mut self, key: &WorkloadKey, stamp: &Option<String>) {
        if self.would_roll.get(key).is_some_and(|w| w.over != *stamp) {
            self.would_roll.remove(key);
        }
    }
}

/// What a touch is for when nothing changed: reconcile found the stamp stale.
const STALE: &str = "its stamp was stale";

/// The `ConfigChanged` Event of a touch that took: what changed, and whether the pods roll.
fn config_changed(
    key: &WorkloadKey,
    uid: &str,
    changed: &BTreeSet<ConfigKey>,
    rolls_by_itself: bool,
) -> WorkloadEvent {
    let what = if changed.is_empty() {
        STALE.to_owned()
    } else {
        changed
            .iter()
            .map(|(_, r)| r.to_string())
            .collect::<Vec<_>>()
            .join(", ")
            + " changed"
    };
    let (type_, note) = if rolls_by_itself {
        (
            EventType::Normal,
            format!("{what}; the pod template was re-stamped and its pods roll"),
        )
    } else {
        (
            EventType::Warning,
            format!(
                "{what}; the pod template was re-stamped, but pods will not roll by themselves \
                 (OnDelete update strategy or paused): delete or resume them to apply the new config"
            ),
        )
    };
    WorkloadEvent {
        workload: key.clone(),
        uid: uid.to_owned(),
        type_,
        reason: CONFIG_CHANGED_REASON,
        action: "Restamp",
        note,
    }
}

/// The `WouldRoll` Event of a dry run's touch: what changed, and what the touch would do.
fn would_roll(
    key: &WorkloadKey,
    uid: &str,
    changed: &BTreeSet<ConfigKey>,
    rolls_by_itself: bool,
) -> WorkloadEvent {
    let what = if changed.is_empty() {
        STALE.to_owned()
    } else {
        changed_names(changed)
    };
    let note = if rolls_by_itself {
        format!(
            "{what}; confighash would re-stamp the pod template and its pods would roll (dry run)"
        )
    } else {
        format!(
            "{what}; confighash would re-stamp the pod template, but its pods would not roll by \
             themselves (OnDelete update strategy or paused) (dry run)"
        )
    };
    WorkloadEvent {
        workload: key.clone(),
        uid: uid.to_owned(),
        type_: EventType::Normal,
        reason: WOULD_ROLL_REASON,
        action: "DryRun",
        note,
    }
}

/// The API resource of a workload kind.
pub fn api_resource(kind: WorkloadKind) -> ApiResource {
    let version = if kind == WorkloadKind::Rollout {
        "v1alpha1"
    } else {
        "v1"
    };
    ApiResource::from_gvk(&GroupVersionKind::gvk(kind.group(), version, kind.kind()))
}

/// "ConfigMap a changed", "ConfigMap a, Secret b changed"; the first few of many, so an Event's
/// note stays short.
fn changed_names(changed: &BTreeSet<ConfigKey>) -> String {
    const SHOWN: usize = 3;
    let names: Vec<String> = changed
        .iter()
        .take(SHOWN)
        .map(|(_, r)| r.to_string())
        .collect();
    let mut text = names.join(", ");
    if changed.len() > SHOWN {
        text += &format!(" and {} more", changed.len() - SHOWN);
    }
    text + " changed"
}

/// A retry delay as people read it: milliseconds under a second, else whole seconds (`40s`,
/// `10m`).
fn format_delay(delay: Duration) -> String {
    if delay < Duration::from_secs(1) {
        format!("{}ms", delay.as_millis().max(1))
    } else {
        let seconds = Duration::from_secs(delay.as_secs_f64().round() as u64);
        humantime::format_duration(seconds).to_string()
    }
}

/// Whole seconds since the Unix epoch, as Kubernetes timestamps have them.
fn unix_seconds(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs_f64().ceil() as u64).unwrap_or(i64::MAX),
    }
}

#[cfg(test)]
mod tests;

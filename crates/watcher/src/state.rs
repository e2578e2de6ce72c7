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

use kube::runtime::events::EventType;

use crate::flap::{FlapGuard, Seen};
use crate::index::{
    ConfigKey, ConfigStore, StoredConfig, WorkloadEntry, WorkloadIndex, WorkloadKey,
};
use crate::pace::{ChangeWindow, Wait};
use crate::pods::PodsVerdict;
use crate::rollout::Progress;
use confighash_cluster::watch::Watched;
use confighash_core::checksum::StampKey;
use confighash_core::refs::ObjectKind;
use confighash_core::rules::{self, Current, Trigger};
use confighash_core::workload::{Kinds, WorkloadKind};
use confighash_metrics::Metrics;

mod decide;
mod dry_run;
mod follow;
mod namespaces;
mod sync;
mod touch;
mod touches;
mod watches;
use touches::{InFlight, Pending};
mod wave;
pub use follow::FOLLOW_AT_MOST;
pub use wave::{
    DEFAULT_PROGRESSIVE_SETTLE, DEFAULT_PROGRESSIVE_TIMEOUT, Halt, MAX_POD_CHECKS, WAVE_CHECK_EVERY,
};

use confighash_core::names::{
    CONFIG_CHANGED_REASON, CONFIG_FLAPPING_REASON, REFERENCES_TOO_LARGE_REASON,
    TOO_MANY_REFERENCES_REASON, TOUCH_FAILED_REASON, WOULD_ROLL_REASON,
};

/// How many failed lists in a row make a workload kind count as listed, empty
/// ([`Input::Unlistable`]): with kube's default backoff, a few seconds of trying.
pub const UNLISTABLE_AFTER: u32 = 4;

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
pub const WOULD_ROLL_OUTCOME: &str = Touched::WouldRoll.as_str();

/// How a touch ended, as `confighash_touches_total{outcome}` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Touched {
    /// The patch took: the template carries the stamp.
    Touched,
    /// The webhook kept the old stamp.
    KeptByWebhook,
    /// The workload no longer carried what the touch expected: nothing written.
    Stale,
    Error,
    Gone,
    /// A dry run's touch, not made.
    WouldRoll,
}

impl Touched {
    pub const ALL: [Touched; 6] = [
        Touched::Touched,
        Touched::KeptByWebhook,
        Touched::Stale,
        Touched::Error,
        Touched::Gone,
        Touched::WouldRoll,
    ];

    /// The metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            Touched::Touched => "touched",
            Touched::KeptByWebhook => "kept-by-webhook",
            Touched::Stale => "stale",
            Touched::Error => "error",
            Touched::Gone => "gone",
            Touched::WouldRoll => "would-roll",
        }
    }
}
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
    /// The kinds watched and touched: the built-in kinds and `--workload-kind`.
    pub kinds: Kinds,
    /// `--progressive-dependents`: objects with more dependents than this roll in progressive
    /// waves as if annotated ([`wave`]); `None`: only annotated ones.
    pub progressive_dependents: Option<usize>,
    /// `--progressive-timeout`: how long a workload of a wave may take to finish its rollout
    /// healthy before the wave halts.
    pub progressive_timeout: Duration,
    /// `--progressive-settle`: how long a workload's new pods must stay Ready, not restarted,
    /// after its rollout completed, before the wave goes on.
    pub progressive_settle: Duration,
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
            kinds: Kinds::built_in(),
            progressive_dependents: None,
            progressive_timeout: DEFAULT_PROGRESSIVE_TIMEOUT,
            progressive_settle: DEFAULT_PROGRESSIVE_SETTLE,
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
    /// The cluster-wide list of this workload kind failed [`UNLISTABLE_AFTER`] times in a row
    /// before it ever listed (403, a broken conversion webhook of its CRD): it counts as listed
    /// and empty, so the other kinds are reconciled and roll; its watch keeps trying, and its
    /// first list counts as any other.
    Unlistable(WorkloadKind),
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
    /// The pods of a workload a progressive wave judges were looked at ([`Effect::CheckPods`]):
    /// on the stamp asked about, what they showed, or why they could not be read.
    PodsChecked(WorkloadKey, String, Result<PodsVerdict, TouchError>),
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
    /// Look at the pods of a workload whose template carries `stamp` ([`crate::pods`]),
    /// counting only what happened within `since` before the look; report with
    /// [`Input::PodsChecked`].
    CheckPods {
        workload: WorkloadKey,
        /// The workload's uid (empty when unknown): its pods' controller.
        uid: String,
        stamp: String,
        since: Duration,
    },
    /// Record a Kubernetes Event on a ConfigMap or Secret.
    ConfigEvent(ConfigEvent),
}

/// A Kubernetes Event on a ConfigMap or Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigEvent {
    pub config: ConfigKey,
    pub type_: EventType,
    pub reason: &'static str,
    pub action: &'static str,
    pub note: String,
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

/// The streams of kinds other than workloads: the Namespaces, ConfigMaps and Secrets.
const OTHER_STREAMS: usize = 3;

impl Stream {
    fn from_kind(kind: ObjectKind) -> Self {
        match kind {
            ObjectKind::ConfigMap => Stream::ConfigMaps,
            ObjectKind::Secret => Stream::Secrets,
        }
    }
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

/// What the watcher holds for one workload besides its index entry ([`WorkloadIndex`]). The work
/// under way for a workload is in the state's queues instead (a pending touch, a touch in flight,
/// a rollout followed): each is walked in its own order, and a touch in flight outlives its
/// workload (its result still comes back).
#[derive(Debug, Default)]
struct WorkloadState {
    /// In a dry run, the stamp it would carry had its touch been made: decisions start from it,
    /// so one change is recorded once however often it is decided on.
    would_roll: Option<WouldRoll>,
    /// Counted as bypassing the webhook, with the uid counted (each uid once).
    bypassed: Option<String>,
    /// Over `--max-references`, and its Warning Event recorded by this replica.
    warned_too_many: bool,
    /// Over `--max-reference-bytes`, and its Warning Event recorded by this replica since it
    /// last fitted.
    warned_too_large: bool,
}

/// Everything the watcher knows and decides.
pub struct State {
    config: WatcherConfig,
    key: Arc<StampKey>,
    metrics: Arc<Metrics>,
    leader: bool,
    configs: ConfigStore,
    workloads: WorkloadIndex,
    /// Which namespaces the watcher decides in ([`namespaces`]).
    namespaces: namespaces::Namespaces,
    window: ChangeWindow<ConfigKey>,
    /// Objects whose change windows open too often: their changes are held ([`flap`](super::flap)).
    flaps: FlapGuard<ConfigKey>,
    /// The touches pending and in flight, and what each workload's last touches left
    /// ([`touches`]).
    touches: touches::Touches,
    /// Which watches have listed, and when reconcile is due ([`sync`]).
    lists: sync::Lists,
    /// When the watcher started: workloads created before it are not counted as bypassing.
    started: SystemTime,
    /// The rollouts after config changes the leader follows ([`follow`]).
    rollouts: follow::Rollouts,
    /// What the input being handled asks for.
    effects: Vec<Effect>,
    /// What is known of each workload besides its index entry, one record each: forgetting a
    /// workload is one `remove` ([`State::forget`]).
    per_workload: HashMap<WorkloadKey, WorkloadState>,
    /// The progressive waves under way ([`wave`]).
    waves: wave::Waves,
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
            touches: touches::Touches::new(&config),
            rollouts: follow::Rollouts::new(config.rollout_timeout, metrics.clone()),
            lists: sync::Lists::new(&config),
            config,
            key,
            metrics,
            leader: false,
            configs: ConfigStore::default(),
            workloads: WorkloadIndex::default(),
            namespaces: namespaces::Namespaces::default(),
            started,
            effects: Vec::new(),
            per_workload: HashMap::new(),
            waves: wave::Waves::default(),
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
        self.lists.is_synced()
    }

    /// When something is due next: hand [`Input::Wake`] then.
    pub fn next_wake(&self) -> Option<Instant> {
        let pending = self.touches.next_due();
        // The deadline of a followed rollout wakes it too.
        let pending = pending
            .into_iter()
            .chain(self.rollouts.next_deadline())
            .min();
        let pending = pending.into_iter().chain(self.next_wave_wake()).min();
        [
            self.window.closes_at(),
            pending,
            self.lists.next_resync(),
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
                    .lists
                    .has_listed(what.stream(), Some(namespace.clone()))
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
            Input::Unlistable(kind) => {
                if !self.lists.has_listed(Stream::Workloads(kind), None) {
                    tracing::warn!(
                        kind = kind.kind(),
                        api_version = kind.api_version(),
                        "cannot list this workload kind: it counts as listed and empty, so the \
                         other kinds roll; its watch keeps trying"
                    );
                    self.metrics.set_kind_unlistable(kind.kind(), true);
                    self.listed(Stream::Workloads(kind), None);
                }
            }
            Input::Leader(leader) => self.leadership(leader, now),
            Input::Key(key) => self.key = key,
            Input::Touched(key, result) => self.touched(key, result, now),
            Input::Rechecked(key, result) => self.rechecked(key, result, now),
            Input::PodsChecked(key, stamp, result) => self.pods_checked(key, stamp, result, now),
            Input::Wake => {}
        }
        self.tick(now);
        let (pending, in_flight) = self.touches.counts();
        self.metrics.set_touches(pending, in_flight);
        self.metrics
            .set_touch_wave_eta(pending, self.config.max_touches_per_second);
        self.metrics.set_rollouts_followed(self.rollouts.len());
        std::mem::take(&mut self.effects)
    }

    /// The record of `key`, made empty if it has none.
    fn workload_state(&mut self, key: &WorkloadKey) -> &mut WorkloadState {
        self.per_workload.entry(key.clone()).or_default()
    }

    /// A workload is gone: its record, its pending touch and the rollout followed go with it.
    /// (A touch in flight stays until its result comes back.)
    fn forget(&mut self, key: &WorkloadKey) {
        self.per_workload.remove(key);
        self.touches.forget(key);
        self.rollouts.stop(key, follow::Ended::Gone);
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
    let what = what_changed(changed);
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
                 (OnDelete or in-place update strategy, or paused): delete or resume them to apply the new config"
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
    let what = what_changed(changed);
    let note = if rolls_by_itself {
        format!(
            "{what}; confighash would re-stamp the pod template and its pods would roll (dry run)"
        )
    } else {
        format!(
            "{what}; confighash would re-stamp the pod template, but its pods would not roll by \
             themselves (OnDelete or in-place update strategy, or paused) (dry run)"
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

/// The API resource of a workload kind, its plural as kube makes one from the kind's name
/// (discovery's, where known, is the watcher's to prefer).
pub use confighash_cluster::discover::named_resource as api_resource;

/// What a touch is for, in its log line and Events: the objects that changed, or, when none did,
/// that reconcile found the stamp stale.
fn what_changed(changed: &BTreeSet<ConfigKey>) -> String {
    if changed.is_empty() {
        STALE.to_owned()
    } else {
        changed_names(changed)
    }
}

/// "ConfigMap a changed", "ConfigMap a, Secret b changed"; the first few of many, so an Event's
/// note stays short.
fn changed_names(changed: &BTreeSet<ConfigKey>) -> String {
    config_names(changed) + " changed"
}

/// "ConfigMap a", "ConfigMap a, Secret b", "ConfigMap a, ConfigMap b, ConfigMap c and 4 more":
/// the first few of many, so every Event that names changed objects names a few.
fn config_names(changed: &BTreeSet<ConfigKey>) -> String {
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
    text
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

//! The watcher: when the content of a ConfigMap or Secret changes, re-touch every workload that
//! references it, so the API server sends it through the webhook again.
//!
//! Watch tasks turn API events into [`Input`]s for one task that owns all state (the digest store,
//! the workload index, the change window, the pacer); touches run as their own tasks and report
//! back. Only the leader touches; every replica watches, so a new leader starts with warm caches.
//!
//! Must not reach: the webhook's code (the two agree only through the core's rules) or the content
//! of any object beyond its digests.

pub mod index;
pub mod leader;
pub mod memory;
pub mod pace;

use crate::core::names::FIELD_MANAGER;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ObjectReference, Secret};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher::{self, Event};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::admin::metrics::Metrics;
use crate::certs::key::KeyStore;
use crate::core::names::{CHECKSUM_ANNOTATION, ENABLED_LABEL};
use crate::core::refs::{ObjectKind, ObjectRef};
use crate::core::rules::{self, Current, Trigger};
use crate::core::workload::WorkloadKind;
use crate::watcher::index::{
    ConfigKey, ConfigStore, StoredConfig, WorkloadEntry, WorkloadIndex, WorkloadKey,
};
use crate::watcher::leader::Leadership;
use crate::watcher::pace::{ChangeWindow, Pacer, Wait};

/// Secrets that are never configuration: Helm release records and service-account tokens.
pub const SECRET_FIELD_SELECTOR: &str =
    "type!=helm.sh/release.v1,type!=kubernetes.io/service-account-token";
/// Global token bucket burst.
pub const TOUCH_BURST: u32 = 20;
/// The reason of the Warning Event on a workload over `--max-references`.
pub const TOO_MANY_REFERENCES_REASON: &str = "TooManyReferences";
/// The reason of the Warning Event on a workload whose touch keeps failing.
pub const TOUCH_FAILED_REASON: &str = "TouchFailed";
/// A touch that failed this many times in a row gets a `TouchFailed` Event (one failure alone is
/// usually gone at the first retry).
pub const TOUCH_FAILED_AFTER: u32 = 2;
/// At most one `TouchFailed` Event per workload this often. Longer than kube's Event recorder
/// keeps an Event to count repeats (6 minutes), so each one is a new Event whose message has the
/// error and retry delay of its time, not those of the first.
pub const TOUCH_FAILED_EVERY: Duration = Duration::from_secs(600);
/// Workloads created within this of the watcher's start (or of their namespace opting in) are
/// not counted as bypassing the webhook: the webhook may not have been reachable yet (readiness,
/// endpoints), and the clocks of the node and the API server may differ a little.
pub const BYPASS_GRACE: Duration = Duration::from_secs(30);

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
    /// Namespaces never touched whatever their labels: `kube-system`, confighash's own and
    /// `--exclude-namespaces`.
    pub excluded_namespaces: HashSet<String>,
    /// Count workloads that did not pass through the webhook
    /// (`confighash_workloads_bypassed_total`) when created this long after the watcher started
    /// and their namespace opted in; `None` counts none.
    pub bypass_grace: Option<Duration>,
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
            max_references: crate::webhook::admission::DEFAULT_MAX_REFERENCES,
            excluded_namespaces: HashSet::from([crate::webhook::admission::KUBE_SYSTEM.to_owned()]),
            bypass_grace: Some(BYPASS_GRACE),
        }
    }
}

/// What the watch tasks tell the state task.
#[derive(Debug)]
enum Input {
    Config(ConfigKey, Option<StoredConfig>),
    /// After a (re-)list: every object of this kind that exists.
    ConfigRelist(ObjectKind, HashSet<ConfigKey>),
    Namespace(String, Option<bool>),
    NamespaceRelist(HashSet<String>),
    /// The ConfigMaps and Secrets of a namespace that opted in after they were left out.
    Backfill {
        namespace: String,
        generation: u64,
        objects: Vec<(ConfigKey, StoredConfig)>,
    },
    Workload(WorkloadKey, Option<WorkloadEntry>),
    WorkloadRelist(WorkloadKind, HashSet<WorkloadKey>),
    Synced(Stream),
    /// A touch that did not take: try again at this time, for the same changes.
    Retry(WorkloadKey, Instant, Pending, TouchFailure),
    /// A touch task ended (whatever its outcome): the workload may be touched again.
    TouchDone(WorkloadKey),
}

/// Why a touch did not take, for its Event.
#[derive(Debug)]
struct TouchFailure {
    /// What failed (redacted: never content).
    what: String,
    /// When it is retried, from the failure.
    retry_in: Duration,
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
}

/// The watch streams whose first list must finish before reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Stream {
    ConfigMaps,
    Secrets,
    Namespaces,
    Workloads(WorkloadKind),
}

/// Runs the watcher until the task is dropped.
pub async fn run(
    client: kube::Client,
    keys: Arc<KeyStore>,
    leadership: Leadership,
    metrics: Arc<Metrics>,
    config: WatcherConfig,
) {
    metrics.set_synced(false);
    let (tx, rx) = mpsc::channel(1024);
    let mut tasks = vec![
        tokio::spawn(watch_configs::<ConfigMap>(
            client.clone(),
            tx.clone(),
            config.page_size,
            None,
        )),
        tokio::spawn(watch_configs::<Secret>(
            client.clone(),
            tx.clone(),
            config.page_size,
            Some(SECRET_FIELD_SELECTOR),
        )),
        tokio::spawn(watch_namespaces(client.clone(), tx.clone())),
        tokio::spawn(watch_workload_kinds(
            client.clone(),
            tx.clone(),
            config.clone(),
        )),
    ];
    let state = State::new(client, keys, leadership, metrics, config, tx);
    state.run(rx).await;
    for t in tasks.drain(..) {
        t.abort();
    }
}

/// A ConfigMap or Secret as the store keeps it.
trait ConfigObject:
    kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
    const KIND: ObjectKind;
    fn stored(&self) -> Option<StoredConfig>;
}

impl ConfigObject for ConfigMap {
    const KIND: ObjectKind = ObjectKind::ConfigMap;
    fn stored(&self) -> Option<StoredConfig> {
        match StoredConfig::from_config_map(self) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "ConfigMap left out of the digest store");
                None
            }
        }
    }
}

impl ConfigObject for Secret {
    const KIND: ObjectKind = ObjectKind::Secret;
    fn stored(&self) -> Option<StoredConfig> {
        Some(StoredConfig::from_secret(self))
    }
}

fn config_key<K: kube::Resource>(obj: &K, kind: ObjectKind) -> Option<ConfigKey> {
    let meta = obj.meta();
    Some((
        meta.namespace.clone()?,
        ObjectRef::new(kind, meta.name.clone()?),
    ))
}

async fn watch_configs<K: ConfigObject>(
    client: kube::Client,
    tx: mpsc::Sender<Input>,
    page_size: u32,
    fields: Option<&'static str>,
) {
    let api: Api<K> = Api::all(client);
    let mut cfg = watcher::Config::default().page_size(page_size);
    if let Some(f) = fields {
        cfg = cfg.fields(f);
    }
    let stream = Stream::from_kind(K::KIND);
    let mut relist: Option<HashSet<ConfigKey>> = None;
    let mut events = std::pin::pin!(watcher::watcher(api, cfg).default_backoff());
    loop {
        let event = match events.try_next().await {
            Ok(Some(e)) => e,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(kind = K::KIND.as_str(), error = %crate::cluster::redact::watcher_error(&e), "watch error; retrying");
                continue;
            }
        };
        let input = match event {
            Event::Init => {
                relist = Some(HashSet::new());
                continue;
            }
            Event::InitApply(obj) => {
                let Some(key) = config_key(&obj, K::KIND) else {
                    continue;
                };
                if let Some(seen) = relist.as_mut() {
                    seen.insert(key.clone());
                }
                Input::Config(key, obj.stored())
            }
            Event::InitDone => {
                let seen = relist.take().unwrap_or_default();
                if tx.send(Input::ConfigRelist(K::KIND, seen)).await.is_err() {
                    return;
                }
                Input::Synced(stream)
            }
            Event::Apply(obj) => {
                let Some(key) = config_key(&obj, K::KIND) else {
                    continue;
                };
                Input::Config(key, obj.stored())
            }
            Event::Delete(obj) => {
                let Some(key) = config_key(&obj, K::KIND) else {
                    continue;
                };
                Input::Config(key, None)
            }
        };
        if tx.send(input).await.is_err() {
            return;
        }
    }
}

impl Stream {
    fn from_kind(kind: ObjectKind) -> Self {
        match kind {
            ObjectKind::ConfigMap => Stream::ConfigMaps,
            ObjectKind::Secret => Stream::Secrets,
        }
    }
}

fn opted_in(ns: &Namespace) -> bool {
    ns.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(ENABLED_LABEL))
        .is_some_and(|v| v == "true")
}

async fn watch_namespaces(client: kube::Client, tx: mpsc::Sender<Input>) {
    let api: Api<Namespace> = Api::all(client);
    let mut relist: Option<HashSet<String>> = None;
    let mut events =
        std::pin::pin!(watcher::watcher(api, watcher::Config::default()).default_backoff());
    loop {
        let event = match events.try_next().await {
            Ok(Some(e)) => e,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %crate::cluster::redact::watcher_error(&e), "namespace watch error; retrying");
                continue;
            }
        };
        let input = match event {
            Event::Init => {
                relist = Some(HashSet::new());
                continue;
            }
            Event::InitApply(ns) => {
                let Some(name) = ns.metadata.name.clone() else {
                    continue;
                };
                if let Some(seen) = relist.as_mut() {
                    seen.insert(name.clone());
                }
                Input::Namespace(name, Some(opted_in(&ns)))
            }
            Event::InitDone => {
                let seen = relist.take().unwrap_or_default();
                if tx.send(Input::NamespaceRelist(seen)).await.is_err() {
                    return;
                }
                Input::Synced(Stream::Namespaces)
            }
            Event::Apply(ns) => {
                let Some(name) = ns.metadata.name.clone() else {
                    continue;
                };
                Input::Namespace(name, Some(opted_in(&ns)))
            }
            Event::Delete(ns) => {
                let Some(name) = ns.metadata.name.clone() else {
                    continue;
                };
                Input::Namespace(name, None)
            }
        };
        if tx.send(input).await.is_err() {
            return;
        }
    }
}

fn api_resource(kind: WorkloadKind) -> ApiResource {
    let version = if kind == WorkloadKind::Rollout {
        "v1alpha1"
    } else {
        "v1"
    };
    ApiResource::from_gvk(&GroupVersionKind::gvk(kind.group(), version, kind.kind()))
}

/// Watches every workload kind the cluster serves; kinds it does not serve are looked for again
/// every `kind_recheck` (and count as synced meanwhile, so reconcile is not held up).
async fn watch_workload_kinds(
    client: kube::Client,
    tx: mpsc::Sender<Input>,
    config: WatcherConfig,
) {
    let mut watching: BTreeMap<&'static str, tokio::task::JoinHandle<()>> = BTreeMap::new();
    let mut reported_absent: HashSet<&'static str> = HashSet::new();
    loop {
        for kind in WorkloadKind::ALL {
            if watching.contains_key(kind.kind()) {
                continue;
            }
            let version = if kind == WorkloadKind::Rollout {
                "v1alpha1"
            } else {
                "v1"
            };
            let gvk = GroupVersionKind::gvk(kind.group(), version, kind.kind());
            match kube::discovery::oneshot::pinned_kind(&client, &gvk).await {
                Ok(_) => {
                    tracing::info!(kind = kind.kind(), "watching");
                    watching.insert(
                        kind.kind(),
                        tokio::spawn(watch_workloads(
                            client.clone(),
                            tx.clone(),
                            kind,
                            config.page_size,
                            config.max_references,
                        )),
                    );
                }
                Err(e) => {
                    if reported_absent.insert(kind.kind()) {
                        tracing::info!(kind = kind.kind(), error = %crate::cluster::redact::kube_error(&e), "not served by this cluster; looking again later");
                        if tx
                            .send(Input::Synced(Stream::Workloads(kind)))
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                }
            }
        }
        tokio::time::sleep(config.kind_recheck).await;
    }
}

async fn watch_workloads(
    client: kube::Client,
    tx: mpsc::Sender<Input>,
    kind: WorkloadKind,
    page_size: u32,
    max_references: usize,
) {
    let api: Api<DynamicObject> = Api::all_with(client, &api_resource(kind));
    let mut relist: Option<HashSet<WorkloadKey>> = None;
    let cfg = watcher::Config::default().page_size(page_size);
    let mut events = std::pin::pin!(watcher::watcher(api, cfg).default_backoff());
    let read = |obj: &DynamicObject| -> Option<(WorkloadKey, Option<WorkloadEntry>)> {
        let ns = obj.metadata.namespace.clone()?;
        let name = obj.metadata.name.clone()?;
        let key = WorkloadKey::new(kind, &ns, &name);
        let value = serde_json::to_value(obj).ok()?;
        match WorkloadEntry::from_object(kind, &value) {
            Ok(entry) => Some((key, entry.map(|e| e.limit_references(max_references)))),
            Err(e) => {
                tracing::warn!(kind = kind.kind(), namespace = ns, name, error = %e, "workload left out");
                Some((key, None))
            }
        }
    };
    loop {
        let event = match events.try_next().await {
            Ok(Some(e)) => e,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(kind = kind.kind(), error = %crate::cluster::redact::watcher_error(&e), "watch error; retrying");
                continue;
            }
        };
        let input = match event {
            Event::Init => {
                relist = Some(HashSet::new());
                continue;
            }
            Event::InitApply(obj) => {
                let Some((key, entry)) = read(&obj) else {
                    continue;
                };
                if let Some(seen) = relist.as_mut() {
                    seen.insert(key.clone());
                }
                Input::Workload(key, entry)
            }
            Event::InitDone => {
                let seen = relist.take().unwrap_or_default();
                if tx.send(Input::WorkloadRelist(kind, seen)).await.is_err() {
                    return;
                }
                Input::Synced(Stream::Workloads(kind))
            }
            Event::Apply(obj) => {
                let Some((key, entry)) = read(&obj) else {
                    continue;
                };
                Input::Workload(key, entry)
            }
            Event::Delete(obj) => {
                let Some((key, _)) = read(&obj) else { continue };
                Input::Workload(key, None)
            }
        };
        if tx.send(input).await.is_err() {
            return;
        }
    }
}

/// A touch waiting for its time.
#[derive(Debug, Default)]
struct Pending {
    due: Option<Instant>,
    /// What changed, for the Event; empty for reconcile.
    changed: BTreeSet<ConfigKey>,
    attempt: u32,
    /// When the first change behind this touch was seen, for the latency metric.
    seen: Option<Instant>,
}

struct State {
    client: kube::Client,
    keys: Arc<KeyStore>,
    leadership: Leadership,
    metrics: Arc<Metrics>,
    config: WatcherConfig,
    tx: mpsc::Sender<Input>,
    configs: ConfigStore,
    workloads: WorkloadIndex,
    /// Namespaces opted in, with when this watcher saw them opt in.
    namespaces: HashMap<String, SystemTime>,
    /// Namespaces known not to be opted in: their ConfigMaps and Secrets are not kept.
    excluded: HashSet<String>,
    /// Namespaces that opted in after being excluded, while their objects are listed.
    backfills: HashMap<String, Backfill>,
    backfill_generation: u64,
    window: ChangeWindow<ConfigKey>,
    window_seen: Option<Instant>,
    pacer: Pacer<WorkloadKey>,
    pending: BTreeMap<WorkloadKey, Pending>,
    /// Workloads with a touch in flight. A touch can be held up for seconds (kube's client
    /// retries a 429 after its Retry-After); a second touch sent meanwhile could land first and
    /// the older one after it, putting back the stamp of an older config when the webhook is not
    /// there to recompute it. So each workload has one touch in flight at most, and what became
    /// due meanwhile is decided again once it is done.
    in_flight: HashSet<WorkloadKey>,
    synced: HashSet<Stream>,
    reconciled: bool,
    next_resync: Option<Instant>,
    recorder: Recorder,
    /// Workloads over `--max-references` whose Warning Event this replica has recorded.
    warned_too_many: HashSet<WorkloadKey>,
    /// When the watcher started: workloads created before it are not counted as bypassing.
    started: SystemTime,
    /// Workloads counted as bypassing the webhook, with the uid counted (each uid once).
    bypassed: HashMap<WorkloadKey, String>,
    /// When each workload's last `TouchFailed` Event was recorded.
    touch_failed_at: HashMap<WorkloadKey, Instant>,
}

const STREAMS: usize = 3 + WorkloadKind::ALL.len();

impl State {
    fn new(
        client: kube::Client,
        keys: Arc<KeyStore>,
        leadership: Leadership,
        metrics: Arc<Metrics>,
        config: WatcherConfig,
        tx: mpsc::Sender<Input>,
    ) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.to_owned(),
                instance: Some(config.identity.clone()),
            },
        );
        State {
            window: ChangeWindow::new(config.debounce),
            pacer: Pacer::new(config.debounce, config.max_touches_per_second, TOUCH_BURST),
            client,
            keys,
            leadership,
            metrics,
            config,
            tx,
            configs: ConfigStore::default(),
            workloads: WorkloadIndex::default(),
            namespaces: HashMap::new(),
            excluded: HashSet::new(),
            backfills: HashMap::new(),
            backfill_generation: 0,
            window_seen: None,
            pending: BTreeMap::new(),
            in_flight: HashSet::new(),
            synced: HashSet::new(),
            reconciled: false,
            next_resync: None,
            recorder,
            warned_too_many: HashSet::new(),
            started: SystemTime::now(),
            bypassed: HashMap::new(),
            touch_failed_at: HashMap::new(),
        }
    }

    /// Records that a workload over `--max-references` is never stamped or rolled.
    fn warn_too_many_references(&self, key: &WorkloadKey, uid: &str) {
        let recorder = self.recorder.clone();
        let reference = workload_reference(key, uid);
        let event = KubeEvent {
            type_: EventType::Warning,
            reason: TOO_MANY_REFERENCES_REASON.to_owned(),
            note: Some(format!(
                "it references more than {} ConfigMaps and Secrets (--max-references): \
                 confighash does not read them, stamp it or roll it on config changes",
                self.config.max_references
            )),
            action: "Skip".to_owned(),
            secondary: None,
        };
        let key = key.clone();
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&event, &reference).await {
                tracing::warn!(workload = %key, error = %e, "cannot record the Event");
            }
        });
    }

    /// Counts a workload that did not pass through the webhook: created in an opted-in
    /// namespace after the watcher started and the namespace opted in (with [`BYPASS_GRACE`]),
    /// not opted out, and carrying neither a stamp nor the unstamped marker. Each uid once.
    fn count_if_bypassed(&mut self, key: &WorkloadKey, entry: &WorkloadEntry) {
        let Some(grace) = self.config.bypass_grace else {
            return;
        };
        if entry.stamp.is_some() || entry.marker || entry.opted_out || entry.uid.is_empty() {
            return;
        }
        let (Some(&opted_in), Some(created)) = (self.namespaces.get(&key.namespace), entry.created)
        else {
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
        tracing::warn!(workload = %key, "a workload in an opted-in namespace carries neither a stamp nor the unstamped marker: the API server did not call the webhook when it was written");
    }

    /// Records a Warning Event saying what failed and when it is retried, once a workload's touch
    /// has failed [`TOUCH_FAILED_AFTER`] times in a row, at most once per [`TOUCH_FAILED_EVERY`].
    fn touch_failed(
        &mut self,
        key: &WorkloadKey,
        failure: &TouchFailure,
        failures: u32,
        now: Instant,
    ) {
        if failures < TOUCH_FAILED_AFTER || !self.leadership.is_leader() {
            return;
        }
        let Some(entry) = self.workloads.get(key) else {
            return;
        };
        let recent = |at: &Instant| now.saturating_duration_since(*at) < TOUCH_FAILED_EVERY;
        if self.touch_failed_at.get(key).is_some_and(recent) {
            return;
        }
        self.touch_failed_at.retain(|_, at| recent(at));
        self.touch_failed_at.insert(key.clone(), now);
        let why = match self.pending.get(key) {
            Some(p) if !p.changed.is_empty() => format!("after {}", changed_names(&p.changed)),
            _ => "(its stamp is stale)".to_owned(),
        };
        let note = format!(
            "re-stamping the pod template {why} failed {failures} times in a row: {}; \
             retrying in {}",
            failure.what,
            format_delay(failure.retry_in)
        );
        let event = KubeEvent {
            type_: EventType::Warning,
            reason: TOUCH_FAILED_REASON.to_owned(),
            note: Some(note),
            action: "Restamp".to_owned(),
            secondary: None,
        };
        let reference = workload_reference(key, &entry.uid);
        let recorder = self.recorder.clone();
        let key = key.clone();
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&event, &reference).await {
                tracing::warn!(workload = %key, error = %crate::cluster::redact::kube_error(&e), "cannot record the Event");
            }
        });
    }

    fn is_synced(&self) -> bool {
        self.synced.len() == STREAMS
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Input>) {
        let mut leader = self.leadership.changes();
        self.metrics.set_leader(self.leadership.is_leader());
        loop {
            let wake = self.next_wake();
            tokio::select! {
                input = rx.recv() => match input {
                    Some(input) => self.handle(input, Instant::now()),
                    None => return,
                },
                changed = leader.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let is_leader = *leader.borrow_and_update();
                    self.metrics.set_leader(is_leader);
                    if is_leader && self.is_synced() {
                        // A new leader compares everything: changes may have passed while
                        // another replica led, or none did.
                        self.reconcile(Instant::now());
                    }
                }
                _ = sleep_until(wake) => {}
            }
            self.tick(Instant::now());
        }
    }

    /// The earliest time something is due.
    fn next_wake(&self) -> Option<Instant> {
        let pending = self.pending.values().filter_map(|p| p.due).min();
        [self.window.closes_at(), pending, self.next_resync]
            .into_iter()
            .flatten()
            .min()
    }

    fn handle(&mut self, input: Input, now: Instant) {
        match input {
            Input::Config(key, state) => {
                if self.excluded.contains(&key.0) {
                    // Not opted in: nothing of it is kept (filtered in memory).
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
            Input::ConfigRelist(kind, seen) => {
                let gone: Vec<ConfigKey> = self
                    .configs
                    .keys()
                    .filter(|(_, r)| r.kind == kind)
                    .map(|(ns, r)| (ns.to_owned(), r.clone()))
                    .filter(|k| !seen.contains(k))
                    .collect();
                for key in gone {
                    self.configs.remove(&key);
                    self.content_changed(key, now);
                }
            }
            Input::Namespace(name, state) => match state.map(|opted_in| {
                // An excluded namespace is never opted in, whatever its labels say.
                opted_in && !self.config.excluded_namespaces.contains(&name)
            }) {
                Some(true) => {
                    let was_excluded = self.excluded.remove(&name);
                    if self.namespaces.contains_key(&name) {
                        return;
                    }
                    self.namespaces.insert(name.clone(), SystemTime::now());
                    if was_excluded {
                        // Its objects were left out: list them; compare once they are in.
                        self.start_backfill(name);
                    } else if self.is_synced() {
                        self.compare_namespace(&name, now);
                    }
                }
                Some(false) => {
                    self.namespaces.remove(&name);
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
            },
            Input::NamespaceRelist(seen) => {
                self.namespaces.retain(|n, _| seen.contains(n));
                self.excluded.retain(|n| seen.contains(n));
                self.backfills.retain(|n, _| seen.contains(n));
            }
            Input::Backfill {
                namespace,
                generation,
                objects,
            } => {
                if self
                    .backfills
                    .get(&namespace)
                    .is_none_or(|b| b.generation != generation)
                {
                    return; // Opted out (or in again) since it started.
                }
                let Some(backfill) = self.backfills.remove(&namespace) else {
                    return;
                };
                tracing::debug!(namespace, objects = objects.len(), "namespace listed");
                for (key, stored) in objects {
                    // What a watch reported since the opt-in is at least as new as the list.
                    if !backfill.seen.contains(&key) {
                        self.configs.upsert(key, stored);
                    }
                }
                self.count_all_configs();
                crate::watcher::memory::release_free_heap();
                if self.is_synced() {
                    if !backfill.deferred.is_empty() {
                        self.window_closed(backfill.deferred, None, now);
                    }
                    self.compare_namespace(&namespace, now);
                }
            }
            Input::Workload(key, entry) => match entry {
                Some(entry) => {
                    if entry.too_many_references
                        && self.leadership.is_leader()
                        && self.warned_too_many.insert(key.clone())
                    {
                        self.warn_too_many_references(&key, &entry.uid);
                    }
                    self.count_if_bypassed(&key, &entry);
                    self.workloads.upsert(key.clone(), entry);
                    // A workload whose stamp is stale when it arrives (its ConfigMap's event came
                    // first, on another watch, and found nothing referencing it) is checked again
                    // once a window has passed, by reconcile's rules.
                    if self.is_synced() && self.decide(&key, Trigger::Reconcile).is_some() {
                        let due = now + self.config.debounce;
                        self.pending.entry(key).or_default().due.get_or_insert(due);
                    }
                }
                None => {
                    self.warned_too_many.remove(&key);
                    self.bypassed.remove(&key);
                    self.touch_failed_at.remove(&key);
                    self.workloads.remove(&key);
                    self.pending.remove(&key);
                }
            },
            Input::WorkloadRelist(kind, seen) => {
                for key in self.workloads.keys_of(kind) {
                    if !seen.contains(&key) {
                        self.bypassed.remove(&key);
                        self.touch_failed_at.remove(&key);
                        self.workloads.remove(&key);
                        self.pending.remove(&key);
                    }
                }
                self.metrics
                    .set_watched(kind.kind(), self.workloads.keys_of(kind).len());
            }
            Input::Synced(stream) => {
                if matches!(stream, Stream::ConfigMaps | Stream::Secrets) {
                    // A whole list of the cluster's config passed through; only digests stay.
                    crate::watcher::memory::release_free_heap();
                }
                self.synced.insert(stream);
                tracing::debug!(?stream, synced = self.synced.len(), of = STREAMS, "listed");
                self.metrics.set_synced(self.is_synced());
            }
            Input::TouchDone(key) => {
                self.in_flight.remove(&key);
                if let Some(p) = self.pending.get_mut(&key) {
                    p.due.get_or_insert(now);
                }
            }
            Input::Retry(key, at, failed, failure) => {
                self.metrics.touch_retry();
                let failures = failed.attempt + 1;
                let p = self.pending.entry(key.clone()).or_default();
                p.due = Some(p.due.map_or(at, |d| d.min(at)));
                // Keep what the touch was for, so the retry is the same kind of touch (a config
                // change replaces a foreign stamp; reconcile would not) and its Event names it.
                p.changed.extend(failed.changed);
                p.attempt = p.attempt.max(failures);
                p.seen = p.seen.or(failed.seen);
                self.touch_failed(&key, &failure, failures, now);
            }
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
        tokio::spawn(backfill(
            self.client.clone(),
            self.tx.clone(),
            namespace,
            generation,
            self.config.page_size,
            self.config.retry_base,
        ));
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
        self.metrics.change_seen(key.1.kind.as_str());
        self.window_seen.get_or_insert(now);
        self.window.record(now, key);
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
        self.touch_due(now);
        self.pacer.forget_old(now);
    }

    /// Decides the stamp a workload should carry now, by the shared rules.
    fn decide(&self, key: &WorkloadKey, trigger: Trigger<'_>) -> Option<String> {
        let entry = self.workloads.get(key)?;
        if !self.namespaces.contains_key(&key.namespace)
            || self.backfills.contains_key(&key.namespace)
        {
            return None;
        }
        let stamp_key = self.keys.current();
        let current = Current {
            stamp: entry.stamp.as_deref(),
            marker: entry.marker,
        };
        let with_v1 = rules::needs_v1(trigger, current, stamp_key.id());
        let lookup = self
            .configs
            .lookup(&stamp_key, &key.namespace, &entry.refs, with_v1);
        let decision = rules::decide(
            trigger,
            current,
            entry.opted_out,
            &lookup,
            stamp_key.id(),
            self.config.rules,
        );
        if decision.changes(current) {
            decision.stamp
        } else {
            None
        }
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
        if !self.leadership.is_leader() {
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

    fn touch_due(&mut self, now: Instant) {
        if !self.leadership.is_leader() {
            // The leader does this; a replica that becomes leader reconciles.
            self.pending.clear();
            return;
        }
        let due: Vec<WorkloadKey> = self
            .pending
            .iter()
            .filter(|(_, p)| p.due.is_some_and(|d| d <= now))
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            if self.in_flight.contains(&key) {
                // Parked until its touch in flight is done (`Input::TouchDone`).
                if let Some(p) = self.pending.get_mut(&key) {
                    p.due = None;
                }
                continue;
            }
            // Recomputed now: the webhook or another change may already have set it.
            let trigger = match self.pending.get(&key) {
                Some(p) if p.changed.is_empty() => Trigger::Reconcile,
                _ => Trigger::ConfigChange,
            };
            let Some(expected) = self.decide(&key, trigger) else {
                self.pending.remove(&key);
                continue;
            };
            match self.pacer.allow(now, &key) {
                Ok(()) => {
                    let Some(p) = self.pending.remove(&key) else {
                        continue;
                    };
                    if let Some(seen) = p.seen {
                        self.metrics.observe_touch_latency(
                            now.saturating_duration_since(seen).as_secs_f64(),
                        );
                    }
                    self.spawn_touch(key, expected, p);
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

    fn spawn_touch(&mut self, key: WorkloadKey, expected: String, pending: Pending) {
        let Some(entry) = self.workloads.get(&key) else {
            return;
        };
        let client = self.client.clone();
        let metrics = self.metrics.clone();
        let tx = self.tx.clone();
        let recorder = self.recorder.clone();
        let old = entry.stamp.clone();
        let uid = entry.uid.clone();
        let rolls = entry.rolls_by_itself;
        let retry_base = self.config.retry_base;
        let max_retry = self.config.resync;
        self.in_flight.insert(key.clone());
        let done_tx = self.tx.clone();
        let done_key = key.clone();
        let task = tokio::spawn(async move {
            let outcome = touch(&client, &key, &expected).await;
            let backoff = |attempt: u32| {
                retry_base
                    .saturating_mul(1 << attempt.min(16))
                    .min(max_retry)
            };
            match outcome {
                Ok(stamp)
                    if stamp.as_deref() != old.as_deref()
                        || stamp.as_deref() == Some(&expected) =>
                {
                    metrics.touch("touched");
                    tracing::info!(workload = %key, stamp = stamp.as_deref().unwrap_or(""), "touched");
                    record_event(&recorder, &key, &uid, &pending.changed, rolls).await;
                }
                Ok(_) => {
                    // The webhook kept the old stamp: its lookup failed. Try again later.
                    metrics.touch("kept-by-webhook");
                    tracing::warn!(workload = %key, "the webhook kept the old stamp; retrying");
                    let retry_in = backoff(pending.attempt);
                    let failure = TouchFailure {
                        what: "the webhook kept the old stamp (it could not read the referenced \
                               ConfigMaps and Secrets)"
                            .to_owned(),
                        retry_in,
                    };
                    let at = Instant::now() + retry_in;
                    let _ = tx.send(Input::Retry(key, at, pending, failure)).await;
                }
                Err(TouchError::Gone) => metrics.touch("gone"),
                Err(TouchError::Api(e)) => {
                    metrics.touch("error");
                    let error = crate::cluster::redact::kube_error(&e);
                    tracing::warn!(workload = %key, error = %error, "touch failed; retrying");
                    let retry_in = backoff(pending.attempt);
                    let what = match &e {
                        kube::Error::Api(s) if s.code == 403 => format!(
                            "the patch was refused ({error}): confighash's RBAC must allow \
                             patch on {}",
                            api_resource(key.kind.kind()).plural
                        ),
                        _ => format!("the patch failed ({error})"),
                    };
                    let at = Instant::now() + retry_in;
                    let failure = TouchFailure { what, retry_in };
                    let _ = tx.send(Input::Retry(key, at, pending, failure)).await;
                }
            }
        });
        tokio::spawn(async move {
            // Reported however the touch ended, a panic included.
            let _ = task.await;
            let _ = done_tx.send(Input::TouchDone(done_key)).await;
        });
    }
}

/// Lists a namespace's ConfigMaps and Secrets (small pages), retrying with backoff until it
/// succeeds or the watcher is gone.
async fn backfill(
    client: kube::Client,
    tx: mpsc::Sender<Input>,
    namespace: String,
    generation: u64,
    page_size: u32,
    retry_base: Duration,
) {
    let mut delay = retry_base;
    loop {
        let mut objects = Vec::new();
        let listed = async {
            list_namespace::<ConfigMap>(&client, &namespace, page_size, None, &mut objects).await?;
            list_namespace::<Secret>(
                &client,
                &namespace,
                page_size,
                Some(SECRET_FIELD_SELECTOR),
                &mut objects,
            )
            .await
        }
        .await;
        match listed {
            Ok(()) => {
                let _ = tx
                    .send(Input::Backfill {
                        namespace,
                        generation,
                        objects,
                    })
                    .await;
                return;
            }
            Err(e) => {
                tracing::warn!(namespace, error = %crate::cluster::redact::kube_error(&e), "listing an opted-in namespace failed; retrying");
                if tx.is_closed() {
                    return;
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(60));
            }
        }
    }
}

async fn list_namespace<K: ConfigObject>(
    client: &kube::Client,
    namespace: &str,
    page_size: u32,
    fields: Option<&str>,
    out: &mut Vec<(ConfigKey, StoredConfig)>,
) -> Result<(), kube::Error> {
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let mut params = ListParams::default().limit(page_size);
    if let Some(f) = fields {
        params = params.fields(f);
    }
    loop {
        let page = api.list(&params).await?;
        for obj in &page.items {
            if let (Some(key), Some(stored)) = (config_key(obj, K::KIND), obj.stored()) {
                out.push((key, stored));
            }
        }
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(()),
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

#[derive(Debug)]
enum TouchError {
    Gone,
    Api(kube::Error),
}

/// The merge patch that sets the pod template's stamp to `expected`; the API server sends it
/// through the webhook, which re-reads and confirms or corrects it. Returns the stamp the stored
/// workload carries afterwards.
async fn touch(
    client: &kube::Client,
    key: &WorkloadKey,
    expected: &str,
) -> Result<Option<String>, TouchError> {
    let kind = key.kind.kind();
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &key.namespace, &api_resource(kind));
    let mut patch = json!({});
    let mut here = &mut patch;
    for token in kind.template_path() {
        here = &mut here[*token];
    }
    *here = json!({"metadata": {"annotations": {CHECKSUM_ANNOTATION: expected}}});
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    };
    match api.patch(&key.name, &params, &Patch::Merge(&patch)).await {
        Ok(obj) => {
            let value = serde_json::to_value(&obj).unwrap_or(Value::Null);
            let (stamp, _) = crate::core::workload::stamp_and_marker(kind, &value);
            Ok(stamp.map(str::to_owned))
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Err(TouchError::Gone),
        Err(e) => Err(TouchError::Api(e)),
    }
}

async fn record_event(
    recorder: &Recorder,
    key: &WorkloadKey,
    uid: &str,
    changed: &BTreeSet<ConfigKey>,
    rolls_by_itself: bool,
) {
    let what = if changed.is_empty() {
        "its stamp was stale".to_owned()
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
    let reference = workload_reference(key, uid);
    let event = KubeEvent {
        type_,
        reason: "ConfigChanged".to_owned(),
        note: Some(note),
        action: "Restamp".to_owned(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &reference).await {
        tracing::warn!(workload = %key, error = %crate::cluster::redact::kube_error(&e), "cannot record the Event");
    }
}

/// What an Event on a workload regards.
fn workload_reference(key: &WorkloadKey, uid: &str) -> ObjectReference {
    let kind = key.kind.kind();
    ObjectReference {
        api_version: Some(api_resource(kind).api_version),
        kind: Some(kind.kind().to_owned()),
        name: Some(key.name.clone()),
        namespace: Some(key.namespace.clone()),
        uid: (!uid.is_empty()).then(|| uid.to_owned()),
        ..Default::default()
    }
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
mod tests {
    use super::*;

    #[test]
    fn retry_delays_read_as_people_write_them() {
        assert_eq!(format_delay(Duration::from_millis(200)), "200ms");
        assert_eq!(format_delay(Duration::ZERO), "1ms");
        assert_eq!(format_delay(Duration::from_millis(40_400)), "40s");
        assert_eq!(format_delay(Duration::from_secs(600)), "10m");
    }

    #[test]
    fn changed_names_stay_short() {
        let key = |kind, name: &str| ("shop".to_owned(), ObjectRef::new(kind, name.to_owned()));
        let one = BTreeSet::from([key(ObjectKind::ConfigMap, "app-env")]);
        assert_eq!(changed_names(&one), "ConfigMap app-env changed");
        let many: BTreeSet<ConfigKey> = (0..5)
            .map(|i| key(ObjectKind::Secret, &format!("s{i}")))
            .collect();
        assert_eq!(
            changed_names(&many),
            "Secret s0, Secret s1, Secret s2 and 2 more changed"
        );
    }

    #[test]
    fn unix_seconds_are_whole_seconds_rounded_down() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(10_900);
        assert_eq!(unix_seconds(t), 10);
        assert_eq!(unix_seconds(SystemTime::UNIX_EPOCH), 0);
    }
}

//! The watcher's shell around its [`State`]: watch tasks feed what they see into one loop that
//! owns the state, the loop carries out the effects the state asks for (patches, Events,
//! namespace lists) and feeds their results back, and sleeps until the state's next wake-up.
//! Everything decided is decided in [`State`]; nothing here keeps state of its own but the
//! tracing span of each touch in flight.

use confighash_metrics::throttle::Throttle;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ObjectReference, Secret};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Event as KubeEvent, Recorder, Reporter};
use kube::runtime::watcher::{self, Event};
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::{Instrument, Span};

use crate::index::{ConfigKey, StoredConfig, WorkloadEntry, WorkloadKey};
use crate::leader::Leadership;
use crate::state::{
    Believed, ConfigEvent, ConfigSource, Effect, Input, NamespaceSeen, State, Touch, TouchError,
    TouchResult, WatchOf, WatcherConfig, WorkloadEvent, api_resource,
};
use confighash_cluster::redact;
use confighash_cluster::watch::{Adapter, StreamingLists, Watched, changes, events};
use confighash_core::checksum::KeyStore;
use confighash_core::names::{ENABLED_LABEL, FIELD_MANAGER};
use confighash_core::refs::{ObjectKind, ObjectRef};
use confighash_core::workload::WorkloadKind;
use confighash_metrics::Metrics;

/// The most Secrets in one list page (when `WatcherConfig::page_size` is not smaller).
///
/// Secrets of every type are watched, as the webhook reads any Secret a workload uses; among
/// them are Helm release records of up to 1 MiB each. A page is held whole while it is read and
/// decoded, about 2.8 times its data, so its size bounds the watcher's peak memory during a
/// list. Ten keeps a page of the largest Secrets to 10 MiB of data: with 1,000 release records
/// among 10,000 other Secrets the peak was 36 MiB at 500 KiB a record (the same as without
/// them) and 49 MiB at 1 MiB, against 92 and 162 MiB with pages of 50, for no measurable
/// difference in sync time (BENCHMARKS.md section 5).
pub const SECRET_PAGE_SIZE: u32 = 10;

/// Runs the watcher until the task is dropped.
pub async fn run(
    client: kube::Client,
    keys: Arc<KeyStore>,
    leadership: Leadership,
    metrics: Arc<Metrics>,
    config: WatcherConfig,
) {
    run_with_secret_page_size(client, keys, leadership, metrics, config, SECRET_PAGE_SIZE).await;
}

/// [`run`], listing Secrets `secret_page_size` at a time (at most `config.page_size`) instead of
/// [`SECRET_PAGE_SIZE`]: for measuring that choice.
pub async fn run_with_secret_page_size(
    client: kube::Client,
    keys: Arc<KeyStore>,
    leadership: Leadership,
    metrics: Arc<Metrics>,
    config: WatcherConfig,
    secret_page_size: u32,
) {
    let pages = Pages::new(config.page_size, secret_page_size);
    metrics.prepare_kinds(&config.kinds);
    if let Some(list) = &config.watch_namespaces {
        metrics.prepare_watch_namespaces(list, &config.kinds);
    }
    let served = Served::default();
    let state = State::new(
        config.clone(),
        keys.current(),
        metrics.clone(),
        SystemTime::now(),
    );
    let (tx, rx) = mpsc::channel(1024);
    let mut tasks = Vec::new();
    for scope in scopes(&config) {
        let errors = |what| WatchErrors::new(what, scope.clone(), &tx, &metrics);
        tasks.push(tokio::spawn(watch_configs::<ConfigMap>(
            client.clone(),
            tx.clone(),
            pages,
            scope.clone(),
            errors(WatchOf::Config(ObjectKind::ConfigMap)),
        )));
        tasks.push(tokio::spawn(watch_configs::<Secret>(
            client.clone(),
            tx.clone(),
            pages,
            scope.clone(),
            errors(WatchOf::Config(ObjectKind::Secret)),
        )));
    }
    tasks.push(tokio::spawn(watch_namespaces(
        client.clone(),
        tx.clone(),
        streaming_lists(&metrics),
    )));
    tasks.push(tokio::spawn(watch_workload_kinds(
        client.clone(),
        tx.clone(),
        config.clone(),
        metrics.clone(),
        served.clone(),
    )));
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: FIELD_MANAGER.to_owned(),
            instance: Some(config.identity.clone()),
        },
    );
    let shell = Shell {
        client,
        keys,
        leadership,
        config,
        pages,
        tx,
        recorder,
        spans: HashMap::new(),
        state,
        served,
        pod_watches: crate::pod_watch::PodWatches::new(streaming_lists(&metrics)),
    };
    shell.run(rx).await;
    for t in tasks.drain(..) {
        t.abort();
    }
}

/// The loop around the state.
struct Shell {
    client: kube::Client,
    keys: Arc<KeyStore>,
    leadership: Leadership,
    config: WatcherConfig,
    pages: Pages,
    tx: mpsc::Sender<Input>,
    recorder: Recorder,
    /// The span of each touch in flight: its result is handled inside it.
    spans: HashMap<WorkloadKey, Span>,
    state: State,
    served: Served,
    /// The pods of the namespaces where a progressive wave judges.
    pod_watches: crate::pod_watch::PodWatches,
}

/// The API resource of each workload kind the cluster serves, as discovery said (a CRD's plural
/// is its own, not always the kind's name with an `s`). Filled as kinds are found.
#[derive(Debug, Clone, Default)]
struct Served(Arc<std::sync::RwLock<HashMap<WorkloadKind, ApiResource>>>);

impl Served {
    fn insert(&self, kind: WorkloadKind, resource: ApiResource) {
        self.0
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(kind, resource);
    }

    /// The kind's resource as discovered; before that, as its name says.
    fn resource(&self, kind: WorkloadKind) -> ApiResource {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&kind)
            .cloned()
            .unwrap_or_else(|| api_resource(kind))
    }
}

impl Shell {
    async fn run(mut self, mut rx: mpsc::Receiver<Input>) {
        let mut leader = self.leadership.changes();
        self.catch_up(Instant::now());
        loop {
            let wake = self.state.next_wake();
            let input = tokio::select! {
                input = rx.recv() => match input {
                    Some(input) => input,
                    None => return,
                },
                changed = leader.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    // Read by `catch_up` from the authority, which also ends leadership at the
                    // renew deadline by itself.
                    leader.borrow_and_update();
                    Input::Wake
                }
                _ = sleep_until(wake) => Input::Wake,
            };
            let now = Instant::now();
            self.catch_up(now);
            let span = match &input {
                Input::Touched(key, _) => self.spans.remove(key),
                _ => None,
            };
            match span {
                Some(span) => {
                    let _inside = span.enter();
                    let effects = self.state.handle(input, now);
                    self.perform(effects, true);
                }
                None => {
                    let effects = self.state.handle(input, now);
                    self.perform(effects, false);
                }
            }
        }
    }

    /// Tells the state what changed outside it: leadership (checked right before acting) and
    /// the stamp key.
    fn catch_up(&mut self, now: Instant) {
        let leader = self.leadership.is_leader();
        if leader != self.state.is_leader() {
            let effects = self.state.handle(Input::Leader(leader), now);
            self.perform(effects, false);
        }
        let key = self.keys.current();
        if !Arc::ptr_eq(&key, self.state.key()) {
            let effects = self.state.handle(Input::Key(key), now);
            self.perform(effects, false);
        }
    }

    /// Carries out what the state asked for; `in_touch` when inside a touch's span (which names
    /// the workload already).
    fn perform(&mut self, effects: Vec<Effect>, in_touch: bool) {
        // The pods of the namespaces where a wave judges, watched before any look at them.
        let namespaces = self.state.pod_namespaces();
        if !(namespaces.is_empty() && self.pod_watches.is_empty()) {
            self.pod_watches
                .keep(&self.client, self.config.page_size, &namespaces);
        }
        for effect in effects {
            match effect {
                Effect::Touch(touch) => self.touch(touch),
                Effect::Recheck { workload, configs } => self.recheck(workload, configs),
                Effect::Event(event) => self.publish(event, in_touch),
                Effect::Backfill {
                    namespace,
                    generation,
                } => {
                    tokio::spawn(backfill(
                        self.client.clone(),
                        self.tx.clone(),
                        namespace,
                        generation,
                        self.pages,
                        self.config.retry_base,
                    ));
                }
                Effect::ReleaseMemory => crate::memory::release_free_heap(),
                Effect::CheckPods {
                    workload,
                    uid,
                    stamp,
                    since,
                } => self.check_pods(workload, uid, stamp, since),
                Effect::ConfigEvent(event) => self.publish_on_config(event),
            }
        }
    }

    /// Looks at the pods of a workload a progressive wave judges, in a task of its own; the
    /// result comes back as [`Input::PodsChecked`].
    fn check_pods(&mut self, workload: WorkloadKey, uid: String, stamp: String, since: Duration) {
        let tx = self.tx.clone();
        // Wall time here: what the pods' timestamps are compared with.
        let since = SystemTime::now()
            .checked_sub(since)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let look = self.pod_watches.look(&workload.namespace);
        tokio::spawn(async move {
            let owner = crate::pods::Owner {
                kind: workload.kind.kind(),
                name: &workload.name,
                uid: &uid,
            };
            let result = match look {
                Some(look) => look.judge(&stamp, owner, since).await.map_err(|e| match e {
                    crate::pod_watch::LookError::Forbidden => {
                        TouchError::Forbidden("pods may not be listed or watched".to_owned())
                    }
                    crate::pod_watch::LookError::Other(e) => TouchError::Other(e),
                }),
                None => Err(TouchError::Other(
                    "the namespace's pods are not watched".to_owned(),
                )),
            };
            let _ = tx.send(Input::PodsChecked(workload, stamp, result)).await;
        });
    }

    /// Records an Event on a ConfigMap or Secret, with its uid (read from its metadata alone: a
    /// Secret's data is never fetched for it), so `kubectl describe` shows it.
    fn publish_on_config(&self, event: ConfigEvent) {
        let recorder = self.recorder.clone();
        let client = self.client.clone();
        tokio::spawn(async move {
            let (namespace, object) = &event.config;
            let uid = match object.kind {
                ObjectKind::ConfigMap => Api::<ConfigMap>::namespaced(client, namespace)
                    .get_metadata_opt(&object.name)
                    .await
                    .map(|m| m.and_then(|m| m.metadata.uid)),
                ObjectKind::Secret => Api::<Secret>::namespaced(client, namespace)
                    .get_metadata_opt(&object.name)
                    .await
                    .map(|m| m.and_then(|m| m.metadata.uid)),
            }
            .ok()
            .flatten();
            let reference = ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some(object.kind.as_str().to_owned()),
                name: Some(object.name.clone()),
                namespace: Some(namespace.clone()),
                uid,
                ..Default::default()
            };
            let kube_event = KubeEvent {
                type_: event.type_,
                reason: event.reason.to_owned(),
                note: Some(within_note_limit(event.note)),
                action: event.action.to_owned(),
                secondary: None,
            };
            if let Err(e) = recorder.publish(&kube_event, &reference).await {
                let error = redact::kube_error(&e);
                tracing::warn!(object = %object, namespace, reason = event.reason,
                    error = %error, "cannot record the Event");
            }
        });
    }

    /// Patches the workload in its own task, inside one span that names it and what changed;
    /// the result comes back as [`Input::Touched`].
    fn touch(&mut self, touch: Touch) {
        let Touch {
            workload,
            stamp,
            why,
            attempt,
            believed,
        } = touch;
        // A root span: a touch started while another one's result is handled is not part of it.
        let span = tracing::info_span!(
            parent: None,
            "touch",
            kind = workload.kind.kind().kind(),
            namespace = %workload.namespace,
            name = %workload.name,
            changed = %why,
            attempt,
        );
        self.spans.insert(workload.clone(), span.clone());
        let client = self.client.clone();
        let key = workload.clone();
        let max_references = self.config.max_references;
        let resource = self.served.resource(workload.kind.kind());
        let task = tokio::spawn(
            async move { patch(&client, &resource, &key, &stamp, &believed, max_references).await }
                .instrument(span),
        );
        let tx = self.tx.clone();
        tokio::spawn(async move {
            // Reported however the touch ended, a panic included.
            let (result, stored) = task.await.unwrap_or_else(|_| {
                let error = "the touch ended unexpectedly".to_owned();
                (TouchResult::Failed(TouchError::Other(error)), None)
            });
            // The response is the workload as stored by the touch, usually newer than what the
            // watch may still deliver: the state machine knows it before deciding again (and
            // ignores it where the watch already delivered a later resourceVersion).
            if let Some(entry) = stored {
                let kind = workload.kind.kind();
                let change = Watched::Applied(workload.clone(), Some(entry));
                let _ = tx.send(Input::Workload(kind, change)).await;
            }
            let _ = tx.send(Input::Touched(workload, result)).await;
        });
    }

    /// Reads a workload's references with consistent GETs in a task of its own, and the
    /// workload itself: the result comes back as [`Input::Rechecked`], after the workload as
    /// read (as a watch event, newer than what the watch may still deliver). A write of the
    /// workload the webhook stamped from the same new config (a config and its workload changed
    /// in one apply) is then seen before the touch, which has nothing left to do, even when the
    /// workload's watch lags behind the change window.
    fn recheck(&mut self, workload: WorkloadKey, configs: Vec<ConfigKey>) {
        let client = self.client.clone();
        let tx = self.tx.clone();
        let resource = self.served.resource(workload.kind.kind());
        let max_references = self.config.max_references;
        let span = tracing::debug_span!(parent: None, "recheck", workload = %workload,
            references = configs.len());
        tokio::spawn(
            async move {
                let kind = workload.kind.kind();
                let api: Api<DynamicObject> =
                    Api::namespaced_with(client.clone(), &workload.namespace, &resource);
                // The workload first: whatever config it was stamped from, the references read
                // after it are at least as new.
                if let Ok(Some(obj)) = api.get_opt(&workload.name).await {
                    let value = serde_json::to_value(&obj).unwrap_or(Value::Null);
                    if let Ok(entry) =
                        WorkloadEntry::from_object_within(kind, &value, max_references)
                    {
                        let change = Watched::Applied(workload.clone(), entry);
                        let _ = tx.send(Input::Workload(kind, change)).await;
                    }
                }
                let result = read_afresh(&client, configs).await;
                let _ = tx.send(Input::Rechecked(workload, result)).await;
            }
            .instrument(span),
        );
    }

    fn publish(&self, event: WorkloadEvent, in_touch: bool) {
        let recorder = self.recorder.clone();
        let reference = workload_reference(&event.workload, &event.uid);
        let workload = event.workload;
        let reason = event.reason;
        let event = KubeEvent {
            type_: event.type_,
            reason: reason.to_owned(),
            note: Some(within_note_limit(event.note)),
            action: event.action.to_owned(),
            secondary: None,
        };
        tokio::spawn(
            async move {
                if let Err(e) = recorder.publish(&event, &reference).await {
                    let error = redact::kube_error(&e);
                    if in_touch {
                        tracing::warn!(reason, error = %error, "cannot record the Event");
                    } else {
                        tracing::warn!(workload = %workload, reason, error = %error, "cannot record the Event");
                    }
                }
            }
            .in_current_span(),
        );
    }
}

/// The longest Event note the API server takes (`events.k8s.io/v1`, in bytes): a longer one is
/// refused, and the Event with it.
pub const EVENT_NOTE_MAX: usize = 1024;

/// `note`, cut at a character boundary to fit [`EVENT_NOTE_MAX`] with "..." at its end when it
/// did not fit.
fn within_note_limit(mut note: String) -> String {
    const MORE: &str = "...";
    if note.len() <= EVENT_NOTE_MAX {
        return note;
    }
    let mut end = EVENT_NOTE_MAX - MORE.len();
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    note.truncate(end);
    note.push_str(MORE);
    note
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

// ----- watches -----

/// List page sizes: Secrets get their own, as their pages can be the largest by far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pages {
    /// ConfigMaps (and workloads, which use `WatcherConfig::page_size` directly).
    config_maps: u32,
    secrets: u32,
}

impl Pages {
    /// `page_size` for ConfigMaps, the smaller of it and `secret_page_size` for Secrets. 0 is
    /// "no limit" to the API server: Secrets always have one.
    fn new(page_size: u32, secret_page_size: u32) -> Pages {
        let most = if page_size == 0 { u32::MAX } else { page_size };
        Pages {
            config_maps: page_size,
            secrets: secret_page_size.clamp(1, most),
        }
    }

    fn of(&self, kind: ObjectKind) -> u32 {
        match kind {
            ObjectKind::Secret => self.secrets,
            ObjectKind::ConfigMap => self.config_maps,
        }
    }

    /// The cluster-wide watch of `kind`: every object of every type, `of(kind)` a page.
    fn watch_config(&self, kind: ObjectKind) -> watcher::Config {
        watcher::Config::default().page_size(self.of(kind))
    }

    /// A list of `kind` in one namespace: every object of every type, `of(kind)` a page.
    fn list_params(&self, kind: ObjectKind) -> ListParams {
        ListParams::default().limit(self.of(kind))
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

/// Where the watches look: the whole cluster, or each namespace of `--watch-namespaces`.
fn scopes(config: &WatcherConfig) -> Vec<Option<String>> {
    match &config.watch_namespaces {
        None => vec![None],
        Some(list) => list.iter().cloned().map(Some).collect(),
    }
}

/// What a watch does with its errors. A 403 of a namespace's own watch (`--watch-namespaces`
/// wider than the Roles granted) is counted in `confighash_watch_forbidden_total`, logged at most
/// once a minute, and tells the state that the namespace cannot be listed (so the others are
/// reconciled); any other error is logged as it comes (kube-runtime's backoff paces them).
struct WatchErrors {
    what: WatchOf,
    scope: Option<String>,
    tx: mpsc::Sender<Input>,
    metrics: Arc<Metrics>,
    logged: Throttle,
    /// Errors of a cluster-wide workload watch, counted until [`Input::Unlistable`] is sent.
    failures: u32,
    unlistable_sent: bool,
    /// When the watch gives up streaming lists (counted in the metrics).
    lists: StreamingLists,
}

/// When watches give up streaming lists: the defaults, counted in
/// `confighash_streaming_list_fallbacks_total`.
pub(crate) fn streaming_lists(metrics: &Arc<Metrics>) -> StreamingLists {
    let metrics = metrics.clone();
    StreamingLists::telling(move |why| metrics.streaming_list_fallback(why.as_str()))
}

impl WatchErrors {
    fn new(
        what: WatchOf,
        scope: Option<String>,
        tx: &mpsc::Sender<Input>,
        metrics: &Arc<Metrics>,
    ) -> Self {
        WatchErrors {
            what,
            scope,
            tx: tx.clone(),
            metrics: metrics.clone(),
            logged: Throttle::default(),
            failures: 0,
            unlistable_sent: false,
            lists: streaming_lists(metrics),
        }
    }

    fn kind(&self) -> &'static str {
        match self.what {
            WatchOf::Config(kind) => kind.as_str(),
            WatchOf::Workloads(kind) => kind.kind(),
        }
    }

    fn report(&mut self, e: &watcher::Error) {
        let kind = self.kind();
        let namespace = self.scope.as_deref().unwrap_or("");
        if let (WatchOf::Workloads(workload_kind), None) = (self.what, &self.scope)
            && !self.unlistable_sent
        {
            // A kind that cannot be listed (403, a broken conversion webhook) must not keep the
            // others from ever counting as synced: after a few tries it counts as listed, empty.
            self.failures += 1;
            if self.failures >= crate::state::UNLISTABLE_AFTER {
                self.unlistable_sent = true;
                // A full channel drops it: the next failure sends it again.
                if self.tx.try_send(Input::Unlistable(workload_kind)).is_err() {
                    self.unlistable_sent = false;
                }
            }
        }
        if let Some(ns) = &self.scope
            && redact::is_forbidden(e)
        {
            self.metrics.watch_forbidden(kind, ns);
            // A full channel drops it: the next retry sends it again.
            let _ = self.tx.try_send(Input::Forbidden(self.what, ns.clone()));
            let Some(unlogged) = self.logged.allow() else {
                return;
            };
            tracing::warn!(kind, namespace, error = %redact::watcher_error(e), unlogged,
                "may not list or watch in a namespace of --watch-namespaces (no Role grants it?); nothing there is read or touched; retrying");
            return;
        }
        tracing::warn!(kind, namespace, error = %redact::watcher_error(e), "watch error; retrying");
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
    pages: Pages,
    scope: Option<String>,
    mut errors: WatchErrors,
) {
    let api: Api<K> = match scope.as_deref() {
        None => Api::all(client),
        Some(namespace) => Api::namespaced(client, namespace),
    };
    let cfg = pages.watch_config(K::KIND);
    let adapter = Adapter::new(
        |obj: &K| config_key(obj, K::KIND),
        |_: &ConfigKey, obj: K| obj.stored(),
    );
    let changes = changes(
        events(api, cfg, &errors.lists).default_backoff(),
        adapter,
        |e| errors.report(e),
    );
    let source = match scope {
        None => ConfigSource::Watch(K::KIND),
        Some(namespace) => ConfigSource::WatchIn(K::KIND, namespace),
    };
    feed(changes, &tx, |change| Input::Config(source.clone(), change)).await;
}

/// Sends a watch's changes to the state until the state is gone.
async fn feed<K: Eq + std::hash::Hash, V>(
    changes: impl Stream<Item = Watched<K, V>>,
    tx: &mpsc::Sender<Input>,
    input: impl Fn(Watched<K, V>) -> Input,
) {
    let mut changes = std::pin::pin!(changes);
    while let Some(change) = changes.next().await {
        if tx.send(input(change)).await.is_err() {
            return;
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

/// Whether the namespace is being deleted: `metadata.deletionTimestamp` is set first (with
/// phase `Terminating`), then its objects go, then the Namespace itself.
fn terminating(ns: &Namespace) -> bool {
    ns.metadata.deletion_timestamp.is_some()
        || ns
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Terminating")
}

async fn watch_namespaces(client: kube::Client, tx: mpsc::Sender<Input>, lists: StreamingLists) {
    let api: Api<Namespace> = Api::all(client);
    let adapter = Adapter::new(
        |ns: &Namespace| ns.metadata.name.clone(),
        |_: &String, ns: Namespace| NamespaceSeen {
            opted_in: opted_in(&ns),
            terminating: terminating(&ns),
            at: SystemTime::now(),
        },
    );
    let changes = changes(
        events(api, watcher::Config::default(), &lists).default_backoff(),
        adapter,
        |e| tracing::warn!(error = %redact::watcher_error(e), "namespace watch error; retrying"),
    );
    feed(changes, &tx, Input::Namespace).await;
}

/// Watches every workload kind the cluster serves; kinds it does not serve are looked for again
/// every `kind_recheck` (and count as listed meanwhile, so reconcile is not held up).
async fn watch_workload_kinds(
    client: kube::Client,
    tx: mpsc::Sender<Input>,
    config: WatcherConfig,
    metrics: Arc<Metrics>,
    served: Served,
) {
    let mut watching: HashMap<WorkloadKind, Vec<tokio::task::JoinHandle<()>>> = HashMap::new();
    let mut reported_absent: HashSet<WorkloadKind> = HashSet::new();
    loop {
        for kind in config.kinds.iter() {
            if watching.contains_key(&kind) {
                continue;
            }
            match confighash_cluster::discover::workload_resource(&client, kind).await {
                Ok(resource) => {
                    tracing::info!(kind = kind.kind(), plural = resource.plural, "watching");
                    served.insert(kind, resource.clone());
                    let tasks = scopes(&config)
                        .into_iter()
                        .map(|scope| {
                            let errors = WatchErrors::new(
                                WatchOf::Workloads(kind),
                                scope.clone(),
                                &tx,
                                &metrics,
                            );
                            tokio::spawn(watch_workloads(
                                client.clone(),
                                tx.clone(),
                                (kind, resource.clone()),
                                scope,
                                errors,
                                config.page_size,
                                config.max_references,
                            ))
                        })
                        .collect();
                    watching.insert(kind, tasks);
                }
                Err(e) => {
                    if reported_absent.insert(kind) {
                        tracing::info!(kind = kind.kind(), api_version = kind.api_version(), error = %e, "not served by this cluster; looking again later");
                        if tx.send(Input::NotServed(kind)).await.is_err() {
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
    (kind, resource): (WorkloadKind, ApiResource),
    scope: Option<String>,
    mut errors: WatchErrors,
    page_size: u32,
    max_references: usize,
) {
    let api: Api<DynamicObject> = match scope.as_deref() {
        None => Api::all_with(client, &resource),
        Some(namespace) => Api::namespaced_with(client, namespace, &resource),
    };
    let cfg = watcher::Config::default().page_size(page_size);
    let adapter = Adapter::new(
        |obj: &DynamicObject| {
            let ns = obj.metadata.namespace.as_deref()?;
            let name = obj.metadata.name.as_deref()?;
            Some(WorkloadKey::new(kind, ns, name))
        },
        |key: &WorkloadKey, obj: DynamicObject| {
            let value = serde_json::to_value(&obj).ok()?;
            match WorkloadEntry::from_object_within(kind, &value, max_references) {
                Ok(entry) => entry,
                Err(e) => {
                    tracing::warn!(kind = kind.kind(), namespace = key.namespace, name = key.name, error = %e, "workload left out");
                    None
                }
            }
        },
    );
    let changes = changes(
        events(api, cfg, &errors.lists).default_backoff(),
        adapter,
        |e| errors.report(e),
    );
    match scope {
        None => feed(changes, &tx, |change| Input::Workload(kind, change)).await,
        Some(namespace) => {
            feed(changes, &tx, |change| {
                Input::WorkloadIn(kind, namespace.clone(), change)
            })
            .await
        }
    }
}

// ----- namespace lists -----

/// Lists a namespace's ConfigMaps and Secrets (small pages) as one list through the watches'
/// adapter, retrying with backoff until it succeeds or the watcher is gone.
async fn backfill(
    client: kube::Client,
    tx: mpsc::Sender<Input>,
    namespace: String,
    generation: u64,
    pages: Pages,
    retry_base: Duration,
) {
    let source = ConfigSource::Backfill {
        namespace: namespace.clone(),
        generation,
    };
    let mut adapter = Adapter::new(
        |listed: &Listed| Some(listed.0.clone()),
        |_: &ConfigKey, listed: Listed| listed.1,
    );
    let mut delay = retry_base;
    loop {
        let mut list = Vec::new();
        let listed = async {
            list_namespace::<ConfigMap>(&client, &namespace, pages, &mut list).await?;
            list_namespace::<Secret>(&client, &namespace, pages, &mut list).await
        }
        .await;
        match listed {
            Ok(()) => {
                // Sent once all is in, as a watch's list: the state takes it as a whole.
                let _ = adapter.feed(Event::Init);
                for listed in list {
                    if let Some(change) = adapter.feed(Event::InitApply(listed))
                        && tx
                            .send(Input::Config(source.clone(), change))
                            .await
                            .is_err()
                    {
                        return;
                    }
                }
                if let Some(done) = adapter.feed(Event::InitDone) {
                    let _ = tx.send(Input::Config(source, done)).await;
                }
                return;
            }
            Err(e) => {
                tracing::warn!(namespace, error = %redact::kube_error(&e), "listing an opted-in namespace failed; retrying");
                if tx.is_closed() {
                    return;
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(60));
            }
        }
    }
}

/// A listed ConfigMap or Secret, as the store keeps it.
type Listed = (ConfigKey, Option<StoredConfig>);

/// Lists one kind of a namespace, page by page, into `out`.
async fn list_namespace<K: ConfigObject>(
    client: &kube::Client,
    namespace: &str,
    pages: Pages,
    out: &mut Vec<Listed>,
) -> Result<(), kube::Error> {
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let mut params = pages.list_params(K::KIND);
    loop {
        let page = api.list(&params).await?;
        for obj in &page.items {
            if let Some(key) = config_key(obj, K::KIND) {
                out.push((key, obj.stored()));
            }
        }
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(()),
        }
    }
}

// ----- touches and Events -----

/// How many references of one workload are read at once by a recheck.
const RECHECK_READS: usize = 8;

/// Reads each object with a consistent GET (no resourceVersion: a quorum read of etcd), as the
/// digest store keeps it; `None` for one that does not exist (or cannot be kept, as the watches
/// treat it). The first error ends the read. Only digests leave this function.
async fn read_afresh(
    client: &kube::Client,
    configs: Vec<ConfigKey>,
) -> Result<Vec<(ConfigKey, Option<StoredConfig>)>, TouchError> {
    futures::stream::iter(configs)
        .map(|key| async move {
            let stored = match key.1.kind {
                ObjectKind::ConfigMap => Api::<ConfigMap>::namespaced(client.clone(), &key.0)
                    .get_opt(&key.1.name)
                    .await
                    .map(|o| o.and_then(|o| o.stored())),
                ObjectKind::Secret => Api::<Secret>::namespaced(client.clone(), &key.0)
                    .get_opt(&key.1.name)
                    .await
                    .map(|o| o.and_then(|o| o.stored())),
            };
            stored.map(|s| (key, s)).map_err(|e| touch_error(&e))
        })
        .buffered(RECHECK_READS)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

/// A failed request as a touch's error: refused (403) or anything else, redacted.
fn touch_error(e: &kube::Error) -> TouchError {
    let error = redact::kube_error(e);
    match e {
        kube::Error::Api(s) if s.code == 403 => TouchError::Forbidden(error),
        _ => TouchError::Other(error),
    }
}

/// The conditional touch of [`confighash_core::patch::touch`], as the client sends it.
fn touch_patch(kind: WorkloadKind, expected: &str, believed: &Believed) -> Patch<Value> {
    let touch = match believed {
        Believed::Stamp(stamp) => confighash_core::patch::touch(kind, expected, Some(stamp), ""),
        Believed::ResourceVersion(rv) => confighash_core::patch::touch(kind, expected, None, rv),
    };
    match touch {
        confighash_core::patch::Touch::Json(patch) => Patch::Json(patch),
        confighash_core::patch::Touch::Merge(patch) => Patch::Merge(patch),
    }
}

/// Sets the pod template's stamp to `expected` by [`touch_patch`]. Says the stamp the stored
/// workload carries afterwards, and what the index keeps of the stored workload. When the
/// precondition failed (422 from a failed `test`, 409 from the resourceVersion), the workload is
/// read: if it no longer carries what the watcher believed, the touch is `Stale` and the read
/// is what the index keeps; if it still does, the refusal had another cause and is an error.
async fn patch(
    client: &kube::Client,
    resource: &ApiResource,
    key: &WorkloadKey,
    expected: &str,
    believed: &Believed,
    max_references: usize,
) -> (TouchResult, Option<WorkloadEntry>) {
    let kind = key.kind.kind();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &key.namespace, resource);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    };
    let entry = |value: &Value| {
        WorkloadEntry::from_object_within(kind, value, max_references)
            .ok()
            .flatten()
    };
    let refused = match api
        .patch(&key.name, &params, &touch_patch(kind, expected, believed))
        .await
    {
        Ok(obj) => {
            let value = serde_json::to_value(&obj).unwrap_or(Value::Null);
            let (stamp, _) = confighash_core::workload::stamp_and_marker(kind, &value);
            tracing::debug!(
                stamp = stamp.unwrap_or(""),
                generation = obj.metadata.generation.unwrap_or(0),
                resource_version = obj.metadata.resource_version.as_deref().unwrap_or(""),
                "the PATCH's response"
            );
            return (
                TouchResult::Patched(stamp.map(str::to_owned)),
                entry(&value),
            );
        }
        Err(kube::Error::Api(s)) if s.code == 404 => return (TouchResult::Gone, None),
        Err(e) => {
            let precondition_failed = match (&e, believed) {
                (kube::Error::Api(s), Believed::Stamp(_)) => s.code == 422,
                (kube::Error::Api(s), Believed::ResourceVersion(_)) => s.code == 409,
                _ => false,
            };
            if !precondition_failed {
                return (TouchResult::Failed(touch_error(&e)), None);
            }
            e
        }
    };
    match api.get_opt(&key.name).await {
        Ok(None) => (TouchResult::Gone, None),
        Ok(Some(obj)) => {
            let value = serde_json::to_value(&obj).unwrap_or(Value::Null);
            let (stamp, _) = confighash_core::workload::stamp_and_marker(kind, &value);
            let holds = match believed {
                Believed::Stamp(believed) => stamp == Some(believed.as_str()),
                Believed::ResourceVersion(rv) => {
                    obj.metadata.resource_version.as_deref() == Some(rv.as_str())
                }
            };
            if holds {
                (TouchResult::Failed(touch_error(&refused)), None)
            } else {
                (TouchResult::Stale, entry(&value))
            }
        }
        Err(e) => (TouchResult::Failed(touch_error(&e)), None),
    }
}

/// What an Event on a workload regards.
fn workload_reference(key: &WorkloadKey, uid: &str) -> ObjectReference {
    let kind = key.kind.kind();
    ObjectReference {
        api_version: Some(kind.api_version()),
        kind: Some(kind.kind().to_owned()),
        name: Some(key.name.clone()),
        namespace: Some(key.namespace.clone()),
        uid: (!uid.is_empty()).then(|| uid.to_owned()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn namespace(object: Value) -> Namespace {
        serde_json::from_value(object).unwrap()
    }

    #[test]
    fn event_notes_are_cut_to_what_the_api_server_takes() {
        let short = "ConfigMap app-env changed".to_owned();
        assert_eq!(within_note_limit(short.clone()), short);
        let exact = "x".repeat(EVENT_NOTE_MAX);
        assert_eq!(within_note_limit(exact.clone()), exact);
        let long = "ConfigMap a-very-long-name changed; ".repeat(200);
        let cut = within_note_limit(long.clone());
        assert_eq!(cut.len(), EVENT_NOTE_MAX);
        assert!(cut.ends_with("...") && long.starts_with(&cut[..EVENT_NOTE_MAX - 3]));
        // Never inside a character: four-byte ones from the start.
        let wide = "\u{1F600}".repeat(EVENT_NOTE_MAX);
        let cut = within_note_limit(wide);
        assert!(
            cut.len() <= EVENT_NOTE_MAX && cut.ends_with("..."),
            "{}",
            cut.len()
        );
        assert!(
            cut.trim_end_matches("...")
                .chars()
                .all(|c| c == '\u{1F600}')
        );
    }

    #[test]
    fn every_streaming_list_fallback_is_counted_under_a_label_the_metrics_declare() {
        use confighash_cluster::watch::Fallback;
        let metrics = Arc::new(Metrics::new());
        let lists = streaming_lists(&metrics);
        let tell = lists.on_fallback.expect("told");
        let all = [
            Fallback::Refused,
            Fallback::Quiet,
            Fallback::Broken,
            Fallback::Closed,
        ];
        for why in all {
            tell(why);
        }
        let labels: Vec<_> = all.iter().map(|w| w.as_str()).collect();
        assert_eq!(labels, confighash_metrics::STREAMING_LIST_FALLBACK_REASONS);
        for why in all {
            assert_eq!(metrics.streaming_list_fallbacks(why.as_str()), 1);
        }
    }

    #[test]
    fn a_namespace_terminates_once_it_has_a_deletion_timestamp_or_the_phase() {
        let labels = json!({ENABLED_LABEL: "true"});
        let live = namespace(json!({
            "metadata": {"name": "shop", "labels": labels},
            "status": {"phase": "Active"},
        }));
        assert!(!terminating(&live));
        assert!(opted_in(&live));
        let deleted = namespace(json!({
            "metadata": {"name": "shop", "labels": labels,
                         "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"phase": "Terminating"},
        }));
        assert!(terminating(&deleted));
        assert!(opted_in(&deleted), "its labels are kept");
        let phase_only = namespace(json!({
            "metadata": {"name": "shop"},
            "status": {"phase": "Terminating"},
        }));
        assert!(terminating(&phase_only));
        let timestamp_only = namespace(json!({
            "metadata": {"name": "shop", "deletionTimestamp": "2026-01-01T00:00:00Z"},
        }));
        assert!(terminating(&timestamp_only));
    }

    #[test]
    fn secrets_of_every_type_are_watched_and_listed() {
        let pages = Pages::new(WatcherConfig::default().page_size, SECRET_PAGE_SIZE);
        for kind in ObjectKind::ALL {
            let watch = pages.watch_config(kind);
            assert_eq!(watch.field_selector, None, "{kind:?}");
            assert_eq!(watch.label_selector, None, "{kind:?}");
            let list = pages.list_params(kind);
            assert_eq!(list.field_selector, None, "{kind:?}");
            assert_eq!(list.label_selector, None, "{kind:?}");
        }
    }

    #[test]
    fn secrets_are_paged_smaller_than_config_maps() {
        let page_size = WatcherConfig::default().page_size;
        let pages = Pages::new(page_size, SECRET_PAGE_SIZE);
        assert!(SECRET_PAGE_SIZE < page_size);
        assert_eq!(
            pages.watch_config(ObjectKind::Secret).page_size,
            Some(SECRET_PAGE_SIZE)
        );
        assert_eq!(
            pages.list_params(ObjectKind::Secret).limit,
            Some(SECRET_PAGE_SIZE)
        );
        assert_eq!(
            pages.watch_config(ObjectKind::ConfigMap).page_size,
            Some(page_size)
        );
        assert_eq!(
            pages.list_params(ObjectKind::ConfigMap).limit,
            Some(page_size)
        );
    }

    #[test]
    fn a_secret_page_is_never_larger_than_the_page_size_nor_unlimited() {
        assert_eq!(Pages::new(4, SECRET_PAGE_SIZE).of(ObjectKind::Secret), 4);
        assert_eq!(Pages::new(50, 500).of(ObjectKind::Secret), 50);
        // 0 is "no limit" to the API server.
        assert_eq!(Pages::new(50, 0).of(ObjectKind::Secret), 1);
        assert_eq!(
            Pages::new(0, SECRET_PAGE_SIZE),
            Pages {
                config_maps: 0,
                secrets: SECRET_PAGE_SIZE
            }
        );
    }
}

//! End-to-end support: the in-memory API server with confighash (`confighash::app::App`, as
//! `confighash serve` runs it) in-process, its webhook registered in the admission chain and the
//! watcher running, or a real cluster when `CONFIGHASH_E2E_KUBECONFIG` is set (with confighash
//! installed there).
//!
//! Scenarios that start with [`Env::start`] use only its `kube::Client`, the namespaces it maps
//! ([`Env::ns`]) and rollout counts, so they run the same against both. Scenarios that need
//! anything of the in-memory server or of confighash in-process (faults, RBAC changes, stopping
//! or restarting the webhook or the watcher, the key store, metrics, their own [`Setup`]) start
//! with [`Env::stand_in`] or [`Env::stand_in_with`], which skip them on a real cluster.
//!
//! On a real cluster every namespace a scenario names gets a suffix of its own, `-` and six hex
//! digits, and the label [`RUN_LABEL`] with that suffix: scenarios running at once, or a run
//! after one that failed, never share a namespace. The namespaces are deleted when the `Env` is
//! dropped, unless the test failed (kept for a look; `kubectl delete namespace -l
//! confighash-e2e-run` removes whatever is left).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use crate::apiserver::{ApiServer, TestCerts};
use base64::Engine;
use confighash::app::{self, App};
use confighash::certs::key::KeyStore;
use confighash::core::checksum::{ObjectView, RefState, StampKey, compute_stamp, is_ignored};
use confighash::core::refs::{ObjectKind, ObjectRef, References};
use confighash::metrics::Metrics;
use confighash::watcher::leader::Leadership;
use confighash::watcher::{self, WatcherConfig};
use confighash::webhook::server::RunningWebhook;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::{ControllerRevision, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

pub const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";
pub const STAMP: &str = "confighash.dev/checksum";
/// The change window the scenarios run with (the default is 5 s; ratios are what matter).
pub const WINDOW: Duration = Duration::from_millis(400);
pub const DEADLINE: Duration = Duration::from_secs(20);
/// How long a replica may take to lead: the Lease's duration (15 s) after a replica that did not
/// give it up, the retry period and some room.
pub const LEADER_DEADLINE: Duration = Duration::from_secs(45);
/// How long confighash may take to watch a kind whose CRD was applied after it started: it looks
/// for such kinds every minute, then lists them.
pub const KIND_RECHECK_DEADLINE: Duration = Duration::from_secs(100);
/// The scenarios' `--flap-threshold`: high enough that no barrier ever flaps.
pub const FLAP_THRESHOLD: u32 = 10_000;
/// On a real cluster, the label of every namespace a test creates; its value is the suffix of
/// their names ([`Env::ns`]).
pub const RUN_LABEL: &str = "confighash-e2e-run";
/// What points the scenarios at a real cluster.
const KUBECONFIG: &str = "CONFIGHASH_E2E_KUBECONFIG";
/// On a real cluster: the API server's audit log (JSON lines) that records confighash's
/// requests, so its writes are counted, not guessed (`scripts/real-tier.sh` sets it).
const AUDIT_LOG: &str = "CONFIGHASH_E2E_AUDIT_LOG";
/// On a real cluster: the user confighash runs as, in the audit log
/// (`system:serviceaccount:confighash:confighash` by default).
const CONFIGHASH_USER: &str = "CONFIGHASH_E2E_USER";
/// On a real cluster: the metrics URLs of confighash's replicas (comma separated), read only to
/// wait until their watchers have no touch pending ([`Env::settled`]).
const METRICS_URL: &str = "CONFIGHASH_E2E_METRICS_URL";
/// On a real cluster: confighash's change window (`--debounce`), when it is [`WINDOW`], so
/// scenarios that time their writes against the window run there too.
const DEBOUNCE: &str = "CONFIGHASH_E2E_DEBOUNCE";
/// On a real cluster: the real tier's `serve.sh`, which starts, stops and kills replicas of
/// confighash (`serve.sh start|stop|kill N`; replica 0 is the one the webhook configuration
/// calls), for scenarios that stop, restart or add one.
const SERVE: &str = "CONFIGHASH_E2E_SERVE";
/// Where the user stories record what they measured (JSON lines), for the real tier's table.
const STORIES: &str = "CONFIGHASH_E2E_STORIES";
/// The workload resources confighash touches.
const WORKLOAD_RESOURCES: [&str; 9] = [
    "deployments",
    "statefulsets",
    "daemonsets",
    "cronjobs",
    "rollouts",
    // The scenarios' configured kinds (tests/data/crds/kinds.json).
    "clonesets",
    "services",
    "scaledjobs",
    "broadcastjobs",
];

/// Where scenarios run.
pub struct Env {
    /// The test's own client (cluster admin).
    pub client: kube::Client,
    /// The client confighash runs with: the ServiceAccount of deploy/, whose RBAC the stand-in
    /// enforces, so a request the code makes that deploy/ does not allow fails the scenario.
    pub confighash: kube::Client,
    /// The webhook's lookups read through it, with the same credentials.
    getter: confighash::cluster::get::Getter,
    /// The in-memory API server (None against a real cluster).
    pub api: Option<ApiServer>,
    /// The running watcher's metrics: at start the app's, which the webhook shares; a watcher
    /// started again gets its own. On a real cluster an unused placeholder: confighash runs
    /// there, not here (scenarios that read it start with [`Env::stand_in`]).
    pub metrics: Arc<Metrics>,
    /// The in-process confighash's keys (on a real cluster an unused placeholder).
    pub keys: Arc<KeyStore>,
    webhook: Option<RunningWebhook>,
    watcher: Option<tokio::task::JoinHandle<()>>,
    /// What confighash was started with, and its namespace (None against a real cluster).
    app: Option<(app::Config, String)>,
    /// The parts of `app` other than the webhook and the watcher (none as configured here).
    background: Vec<tokio::task::JoinHandle<()>>,
    certs: Option<TestCerts>,
    webhook_url: String,
    /// The in-process watcher's settings (on a real cluster an unused placeholder).
    pub config: WatcherConfig,
    /// Whether Argo Rollouts are served (in the stand-in, as [`Setup`] says).
    rollouts_served: bool,
    /// On a real cluster: this Env's suffix of namespace names ([`Env::ns`]), and the cluster
    /// to delete its namespaces from when it is dropped.
    run: Option<(String, kube::Config)>,
    /// On a real cluster with [`SERVE`]: this Env's hold on the lock that serialises scenarios
    /// stopping or adding confighash replicas against every other scenario (shared by the
    /// others, exclusive for those: [`Env::controlling`]).
    _lock: Option<std::fs::File>,
    /// Whether `_lock` is the exclusive one ([`Env::controlling`]).
    exclusive: bool,
    _dir: Option<tempfile::TempDir>,
}

/// What [`Env::mark`] saw.
pub struct Mark {
    /// As the scenario names it (not mapped).
    namespace: String,
    touches: u64,
    barrier_rollouts: u64,
}

/// Options for the stand-in environment (a real cluster runs confighash as installed there, so
/// scenarios that need other options start with [`Env::stand_in_with`]).
#[derive(Clone)]
pub struct Setup {
    pub rollouts_served: bool,
    pub watcher: WatcherConfig,
    pub start_watcher: bool,
    pub lookup_deadline: Duration,
    /// `serve --dry-run`: the webhook and the watcher write no workload.
    pub dry_run: bool,
    /// Whether the stand-in serves streaming lists (kube-apiserver's `WatchList` feature gate).
    pub watch_list: bool,
    /// Whether a watch resumed from a compacted version ends at once with no event
    /// (`apiserver::Options::silent_expired_watches`).
    pub silent_expired_watches: bool,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            rollouts_served: true,
            watcher: WatcherConfig {
                debounce: WINDOW,
                resync: Duration::from_secs(3600),
                retry_base: Duration::from_millis(100),
                kind_recheck: Duration::from_millis(500),
                // A barrier changes its ConfigMap at every call, many times a minute: the flap
                // guard would hold it. The scenarios of the guard set their own threshold; the
                // real tier installs confighash with this one (scripts/real-tier.sh).
                flap_threshold: FLAP_THRESHOLD,
                ..Default::default()
            },
            start_watcher: true,
            lookup_deadline: Duration::from_secs(2),
            dry_run: false,
            watch_list: true,
            silent_expired_watches: false,
        }
    }
}

impl Env {
    /// The environment for this run: a real cluster when `CONFIGHASH_E2E_KUBECONFIG` is set,
    /// else the in-memory API server with confighash running in-process.
    pub async fn start() -> Env {
        Self::start_with(Setup::default()).await
    }

    /// As [`Env::start`]; `setup` applies to the stand-in only (a real cluster runs confighash as
    /// installed there), so scenarios that need it start with [`Env::stand_in_with`].
    pub async fn start_with(setup: Setup) -> Env {
        if let Some(path) = std::env::var_os(KUBECONFIG) {
            return Self::real_cluster(path).await;
        }
        let api = ApiServer::start_with(crate::apiserver::Options {
            rollouts_served: setup.rollouts_served,
            watch_list: setup.watch_list,
            silent_expired_watches: setup.silent_expired_watches,
            ..Default::default()
        })
        .await;
        let client = api.client();
        // deploy/'s RBAC, and what the chart's workloadKinds adds for the scenarios' kinds.
        let rbac = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/base/rbac.yaml"
        ))
        .expect("deploy/base/rbac.yaml")
            + &super::kinds::rbac_yaml();
        api.set_authorizer(Some(
            crate::apiserver::rbac::Authorizer::from_yaml(&rbac).expect("deploy/ RBAC parses"),
        ));
        api.add_token(
            "confighash-token",
            crate::apiserver::user::UserInfo::service_account("confighash", "confighash"),
        );
        // As `serve` builds it: behind the layer that withholds what the API server sent, in the
        // ServiceAccount's namespace.
        let mut config = api.config_with_token("confighash-token");
        config.default_namespace = "confighash".into();
        let cluster = confighash::cluster::Cluster::new(config, confighash::app::READS).unwrap();
        let confighash = cluster.client.clone();
        let getter = cluster.getter.clone();
        let certs = TestCerts::generate();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tls.crt"), &certs.cert_pem).unwrap();
        std::fs::write(dir.path().join("tls.key"), &certs.key_pem).unwrap();
        std::fs::write(dir.path().join("key"), KEY).unwrap();
        // `confighash serve`, as the command line configures it, on loopback.
        let watcher = &setup.watcher;
        let config = app::Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            admin_listen: "127.0.0.1:0".parse().unwrap(),
            key: app::KeySource::File(dir.path().join("key")),
            certs: app::CertSource {
                cert: dir.path().join("tls.crt"),
                key: dir.path().join("tls.key"),
                self_signed: None,
            },
            lookup_deadline: setup.lookup_deadline,
            max_references: watcher.max_references,
            exclude_namespaces: {
                let mut excluded: Vec<String> = watcher
                    .excluded_namespaces
                    .iter()
                    .filter(|ns| *ns != "kube-system")
                    .cloned()
                    .collect();
                excluded.sort();
                excluded
            },
            rules: watcher.rules,
            watcher: app::WatcherSettings {
                debounce: watcher.debounce,
                resync: watcher.resync,
                max_touches_per_second: watcher.max_touches_per_second,
                page_size: watcher.page_size,
                kind_recheck: watcher.kind_recheck,
                retry_base: watcher.retry_base,
                bypass_grace: watcher.bypass_grace,
                rollout_timeout: watcher.rollout_timeout,
                flap_threshold: watcher.flap_threshold,
                flap_period: watcher.flap_period,
                progressive_dependents: watcher.progressive_dependents,
                progressive_timeout: watcher.progressive_timeout,
                progressive_settle: watcher.progressive_settle,
            },
            identity: Some(watcher.identity.clone()),
            cert_poll: Duration::from_secs(60),
            header_read_timeout: Duration::from_secs(5),
            drain_timeout: Duration::from_secs(5),
            dry_run: setup.dry_run,
            kinds: super::kinds::kinds(),
            ..app::Config::default()
        };
        let mut serving = App::from_config(config, cluster)
            .await
            .unwrap()
            .start_without_watcher()
            .await
            .unwrap();
        let mut env = Env {
            client,
            confighash,
            getter,
            api: Some(api),
            metrics: serving.metrics().clone(),
            keys: serving.keys().clone(),
            webhook: None,
            watcher: None,
            app: Some((serving.config().clone(), serving.namespace().to_owned())),
            background: Vec::new(),
            certs: Some(certs),
            webhook_url: format!("https://127.0.0.1:{}/mutate", serving.webhook_addr().port()),
            config: App::watcher_config(serving.config(), serving.namespace()),
            rollouts_served: setup.rollouts_served,
            run: None,
            _lock: None,
            exclusive: false,
            _dir: Some(dir),
        };
        env.register_webhook("Ignore").await;
        if setup.start_watcher {
            serving.start_watcher();
        }
        let parts = serving.into_parts();
        env.webhook = Some(parts.server);
        env.watcher = parts.watcher;
        env.background = parts.background;
        env
    }

    /// The in-memory API server with confighash in-process, for a scenario that needs it (`why`
    /// says what for); on a real cluster the scenario is skipped: None, and it says so.
    pub async fn stand_in(test: &str, why: &str) -> Option<Env> {
        Self::stand_in_with(test, why, Setup::default()).await
    }

    /// As [`Env::stand_in`], set up as `setup` says.
    pub async fn stand_in_with(test: &str, why: &str, setup: Setup) -> Option<Env> {
        if std::env::var_os(KUBECONFIG).is_some() {
            eprintln!("skipped: {test} needs the in-memory API server ({why})");
            return None;
        }
        Some(Self::start_with(setup).await)
    }

    /// For a scenario that counts confighash's writes and times its own writes against the change
    /// window: the stand-in, or a real cluster whose audit log is given and whose confighash runs
    /// with the scenarios' window ([`DEBOUNCE`]); elsewhere it is skipped, and says so.
    pub async fn counted(test: &str) -> Option<Env> {
        if std::env::var_os(KUBECONFIG).is_some() {
            let window = std::env::var(DEBOUNCE).ok();
            let ms = window
                .as_deref()
                .and_then(|w| w.strip_suffix("ms"))
                .and_then(|n| n.parse::<u128>().ok());
            if std::env::var_os(AUDIT_LOG).is_none() || ms != Some(WINDOW.as_millis()) {
                eprintln!(
                    "skipped: {test} needs {AUDIT_LOG} and confighash's --debounce in {DEBOUNCE} \
                     equal to the scenarios' window ({}ms) on a real cluster",
                    WINDOW.as_millis()
                );
                return None;
            }
        }
        Some(Self::start().await)
    }

    /// For a scenario that stops, restarts or adds confighash replicas: the stand-in, or a real
    /// cluster with the real tier's `serve.sh` ([`SERVE`]), where it waits until no other
    /// scenario runs (of any test binary) and keeps them waiting until it ends; elsewhere it is
    /// skipped, and says so.
    pub async fn controlling(test: &str, setup: Setup) -> Option<Env> {
        if std::env::var_os(KUBECONFIG).is_none() {
            return Some(Self::start_with(setup).await);
        }
        if std::env::var_os(SERVE).is_none() {
            eprintln!(
                "skipped: {test} stops or adds confighash replicas: on a real cluster it needs \
                 {SERVE} (the real tier's serve.sh)"
            );
            return None;
        }
        let lock = scenario_lock(true).await;
        let mut env = CONTROLLING.scope(true, Self::start_with(setup)).await;
        env._lock = lock;
        env.exclusive = true;
        Some(env)
    }

    async fn real_cluster(path: std::ffi::OsString) -> Env {
        let lock = if CONTROLLING.try_with(|c| *c).unwrap_or(false) {
            None
        } else {
            scenario_lock(false).await
        };
        let kubeconfig = kube::config::Kubeconfig::read_from(&path)
            .expect("CONFIGHASH_E2E_KUBECONFIG is readable");
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("a usable kubeconfig");
        let client = kube::Client::try_from(config.clone()).expect("a client");
        let rollouts_served = client
            .list_api_group_resources("argoproj.io/v1alpha1")
            .await
            .is_ok_and(|list| list.resources.iter().any(|r| r.name == "rollouts"));
        let suffix = format!("{:06x}", rand::random::<u32>() & 0xff_ffff);
        eprintln!(
            "real cluster: this test's namespaces end in -{suffix} and carry the label \
             {RUN_LABEL}={suffix}; they are deleted if it passes \
             (`kubectl delete namespace -l {RUN_LABEL}` removes any left)"
        );
        Env {
            confighash: confighash::cluster::client::build(config.clone(), confighash::app::READS)
                .expect("a client"),
            getter: confighash::cluster::get::Getter::new(&config).expect("a getter"),
            client,
            api: None,
            metrics: Arc::new(Metrics::new()),
            keys: Arc::new(KeyStore::new(StampKey::new(KEY.to_vec()).unwrap())),
            webhook: None,
            watcher: None,
            app: None,
            background: Vec::new(),
            certs: None,
            webhook_url: String::new(),
            config: WatcherConfig::default(),
            rollouts_served,
            run: Some((suffix, config)),
            _lock: lock,
            exclusive: false,
            _dir: None,
        }
    }

    /// The real cluster's client configuration (None in the stand-in), for work that must run
    /// outside the test's runtime, such as clean-up in `drop` (a [`kube::Client`] is bound to
    /// the runtime that made it).
    pub fn real_config(&self) -> Option<kube::Config> {
        self.run.as_ref().map(|(_, config)| config.clone())
    }

    /// Whether this is the in-memory API server with confighash in-process, not a real cluster
    /// (true even once a caller has taken the server out of `api`, as the fault run does).
    pub fn is_stand_in(&self) -> bool {
        self.run.is_none()
    }

    /// The namespace a scenario calls `name`: on a real cluster `name` with this Env's suffix
    /// (a name that already carries it is returned as it is), in the stand-in `name` itself.
    /// Every method of `Env` that takes a namespace maps it; a scenario that builds an `Api` of
    /// its own maps the name with this.
    pub fn ns(&self, name: &str) -> String {
        match &self.run {
            Some((suffix, _)) if !name.ends_with(&format!("-{suffix}")) => {
                format!("{name}-{suffix}")
            }
            _ => name.to_owned(),
        }
    }

    /// Whether the workloads of `kind` are served (Argo Rollouts may not be installed).
    pub fn serves(&self, kind: &str) -> bool {
        kind != "Rollout" || self.rollouts_served
    }

    /// Applies the CRD of a configured kind of the scenarios ([`super::kinds`]) and waits until
    /// the API server serves it: in the stand-in it starts serving the resource; on a real
    /// cluster the CRD (`tests/data/crds/`) is applied server-side and waited for until
    /// Established. Whether it was served before.
    pub async fn apply_crd(&self, kind: &str) -> bool {
        let test_kind = super::kinds::test_kind(kind);
        let served = || async {
            self.client
                .list_api_group_resources(&test_kind.api_version())
                .await
                .is_ok_and(|list| list.resources.iter().any(|r| r.name == test_kind.resource))
        };
        let before = served().await;
        if let Some(api) = &self.api {
            api.set_crd_served(&test_kind.group, &test_kind.resource, true);
        } else {
            let crd = test_kind.crd();
            let name = crd["metadata"]["name"].as_str().unwrap().to_owned();
            let api: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
                Api::all(self.client.clone());
            api.patch(
                &name,
                &PatchParams::apply("confighash-tests").force(),
                &Patch::Apply(crd),
            )
            .await
            .unwrap_or_else(|e| panic!("applying the CRD {name}: {e}"));
        }
        self.eventually(&format!("{} served", test_kind.resource), || async {
            served().await
        })
        .await;
        before
    }

    /// Whether [`Env::rollouts`] can count the rollouts of `kind` here: a CronJob keeps no
    /// revision in Kubernetes, so on a real cluster its rollouts cannot be counted (its job
    /// template's stamp still shows a change).
    pub fn counts_rollouts(&self, kind: &str) -> bool {
        self.is_stand_in() || kind != "CronJob"
    }

    /// Fails a scenario that uses `what`, which only the stand-in has, on a real cluster (it
    /// should have started with [`Env::stand_in`]), rather than letting it check nothing.
    fn in_process(&self, what: &str) {
        assert!(
            self.is_stand_in(),
            "{what} needs the in-memory API server: start the scenario with Env::stand_in"
        );
    }

    /// The stand-in, for fault injection (scenarios that need it start with [`Env::stand_in`]).
    pub fn api(&self) -> &ApiServer {
        self.api
            .as_ref()
            .expect("this scenario needs the in-memory API server: start it with Env::stand_in")
    }

    /// Starts the webhook again as the app started it, on the same port, as a restarted pod
    /// behind its Service.
    async fn start_webhook(&mut self) {
        self.in_process("starting the webhook");
        let (config, namespace) = self.app.as_ref().expect("confighash runs in-process");
        let webhook = Arc::new(App::webhook(
            config,
            namespace,
            self.getter.clone(),
            self.keys.clone(),
            self.metrics.clone(),
        ));
        let (certs, client_ca) = App::certificates(config).unwrap();
        let port: u16 = self
            .webhook_url
            .rsplit(':')
            .next()
            .unwrap()
            .trim_end_matches("/mutate")
            .parse()
            .unwrap();
        let config = app::Config {
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            ..config.clone()
        };
        let running = App::start_server(&config, certs, client_ca, webhook)
            .await
            .unwrap();
        self.webhook = Some(running);
    }

    /// Stops the webhook (the API server then follows the failure policy). On a real cluster,
    /// in a scenario started with [`Env::controlling`], the webhook configuration's entries are
    /// pointed at a closed port of loopback instead, until [`Env::restart_webhook`]: to the API
    /// server that is a webhook that is down, while the watcher runs on.
    pub async fn stop_webhook(&mut self) {
        if !self.is_stand_in() {
            self.redirect_webhook(true).await;
            return;
        }
        if let Some(w) = self.webhook.take() {
            w.shutdown().await;
        }
    }

    pub async fn restart_webhook(&mut self) {
        if !self.is_stand_in() {
            self.redirect_webhook(false).await;
            return;
        }
        self.stop_webhook().await;
        self.start_webhook().await;
    }

    /// On a real cluster: points both entries of the chart's webhook configuration at a closed
    /// port (`away`) or back at the URL they had, then polls until the API server's admission
    /// follows (a dry-run CREATE in an opted-in namespace of this Env's comes back unstamped, or
    /// stamped).
    async fn redirect_webhook(&mut self, away: bool) {
        assert!(
            self.exclusive,
            "the webhook of a real cluster is shared: start the scenario with Env::controlling"
        );
        let api: Api<MutatingWebhookConfiguration> = Api::all(self.client.clone());
        let live = api.get("confighash").await.unwrap();
        let entries = live.webhooks.unwrap_or_default();
        if away {
            self.webhook_url = entries[0].client_config.url.clone().expect(
                "the chart's webhook configuration calls a URL (the real tier's webhook.url)",
            );
        }
        let url = if away {
            "https://127.0.0.1:9/mutate".to_owned()
        } else {
            self.webhook_url.clone()
        };
        let patch: Vec<Value> = (0..entries.len())
            .map(|i| json!({"op": "replace", "path": format!("/webhooks/{i}/clientConfig/url"), "value": url}))
            .collect();
        api.patch(
            "confighash",
            &PatchParams::default(),
            &Patch::<()>::Json(serde_json::from_value(Value::Array(patch)).unwrap()),
        )
        .await
        .unwrap();
        let probe = "webhook-probe";
        if Api::<Namespace>::all(self.client.clone())
            .get_opt(&self.ns(probe))
            .await
            .unwrap()
            .is_none()
        {
            self.namespace(probe, true).await;
        }
        let deployments: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &self.ns(probe),
            &api_resource("Deployment"),
        );
        let object: DynamicObject =
            serde_json::from_value(workload_object("Deployment", "probe", &[], json!({}))).unwrap();
        let dry_run = PostParams {
            dry_run: true,
            ..Default::default()
        };
        self.eventually_with(
            || async {
                let created = deployments.create(&dry_run, &object).await.unwrap();
                let stamped = created
                    .data
                    .pointer("/spec/template/metadata/annotations")
                    .and_then(|a| a.get(STAMP))
                    .is_some();
                stamped != away
            },
            || format!("the API server to call the webhook at {url}"),
        )
        .await;
    }

    /// Registers confighash's MutatingWebhookConfiguration, as deploy/ does: the entry for
    /// opted-in namespaces, and the entry for workloads labelled `confighash.dev/enabled=true`
    /// in the other namespaces but the excluded ones.
    pub async fn register_webhook(&self, failure_policy: &str) {
        self.in_process("registering the in-process webhook");
        let ca = &self.certs.as_ref().unwrap().ca_pem;
        let mut excluded: Vec<&String> = self.config.excluded_namespaces.iter().collect();
        excluded.sort();
        let rules = |mut rules: Vec<Value>| {
            rules.extend(super::kinds::webhook_rules());
            rules
        };
        let built_in = vec![
            json!({"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                   "resources": ["deployments", "statefulsets", "daemonsets"], "scope": "Namespaced"}),
            json!({"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                   "resources": ["cronjobs"], "scope": "Namespaced"}),
            json!({"apiGroups": ["argoproj.io"], "apiVersions": ["v1alpha1"], "operations": ["CREATE", "UPDATE"],
                   "resources": ["rollouts"], "scope": "Namespaced"}),
        ];
        let configuration: MutatingWebhookConfiguration = serde_json::from_value(json!({
            "metadata": {"name": "confighash"},
            "webhooks": [{
                "name": "stamp.confighash.dev",
                "clientConfig": {"url": self.webhook_url, "caBundle": base64::engine::general_purpose::STANDARD.encode(ca)},
                "rules": rules(built_in.clone()),
                "namespaceSelector": {"matchLabels": {"confighash.dev/enabled": "true"}},
                "objectSelector": {"matchExpressions": [{"key": "confighash.dev/enabled", "operator": "NotIn", "values": ["false"]}]},
                "failurePolicy": failure_policy,
                "sideEffects": "None",
                "timeoutSeconds": 5,
                "reinvocationPolicy": "IfNeeded",
                "admissionReviewVersions": ["v1"]
            }, {
                "name": "workload.confighash.dev",
                "clientConfig": {"url": self.webhook_url, "caBundle": base64::engine::general_purpose::STANDARD.encode(ca)},
                "rules": rules(built_in.clone()),
                "namespaceSelector": {"matchExpressions": [
                    {"key": "confighash.dev/enabled", "operator": "NotIn", "values": ["true"]},
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": excluded}
                ]},
                "objectSelector": {"matchLabels": {"confighash.dev/enabled": "true"}},
                "failurePolicy": failure_policy,
                "sideEffects": "None",
                "timeoutSeconds": 5,
                "reinvocationPolicy": "IfNeeded",
                "admissionReviewVersions": ["v1"]
            }]
        }))
        .unwrap();
        let api: Api<MutatingWebhookConfiguration> = Api::all(self.client.clone());
        match api.get_opt("confighash").await.unwrap() {
            Some(old) => {
                let mut c = configuration;
                c.metadata.resource_version = old.metadata.resource_version;
                api.replace("confighash", &PostParams::default(), &c)
                    .await
                    .unwrap();
            }
            None => {
                api.create(&PostParams::default(), &configuration)
                    .await
                    .unwrap();
            }
        }
    }

    /// Starts (or restarts) the watcher as the leader.
    pub fn start_watcher(&mut self) {
        self.start_watcher_with(Leadership::always());
    }

    pub fn start_watcher_with(&mut self, leadership: Leadership) {
        self.in_process("starting the watcher");
        self.stop_watcher();
        // Each watcher gets its own metrics, so `wait_synced` never reads an old watcher's.
        self.metrics = Arc::new(Metrics::new());
        self.watcher = Some(tokio::spawn(watcher::run(
            self.confighash.clone(),
            self.keys.clone(),
            leadership,
            self.metrics.clone(),
            self.config.clone(),
        )));
    }

    /// A leader election on the `confighash` Lease for a replica run in-process, with short
    /// periods (lease 1.5 s, renew deadline 1 s, retry 0.2 s) so a handover fits a scenario.
    pub fn elect(&self, identity: &str) -> (Leadership, tokio::task::JoinHandle<()>) {
        let mut config = confighash::watcher::leader::LeaderConfig::new("confighash", identity);
        config.lease_duration = Duration::from_millis(1500);
        config.renew_deadline = Duration::from_millis(1000);
        config.retry_period = Duration::from_millis(200);
        confighash::watcher::leader::spawn(self.confighash.clone(), config)
    }

    /// A watcher replica in-process beside the Env's own: `identity`, led by `leadership`, with
    /// metrics of its own.
    pub fn spawn_watcher(
        &self,
        identity: &str,
        leadership: Leadership,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(watcher::run(
            self.confighash.clone(),
            self.keys.clone(),
            leadership,
            Arc::new(Metrics::new()),
            WatcherConfig {
                identity: identity.to_owned(),
                ..self.config.clone()
            },
        ))
    }

    /// Changes the image of a workload's container `app` with a strategic merge patch, as an
    /// apply of a new manifest changes its pod template.
    pub async fn set_image(&self, namespace: &str, name: &str, image: &str) {
        Api::<Deployment>::namespaced(self.client.clone(), &self.ns(namespace))
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [
                    {"name": "app", "image": image}
                ]}}}})),
            )
            .await
            .unwrap();
    }

    pub fn stop_watcher(&mut self) {
        self.in_process("stopping the watcher");
        if let Some(w) = self.watcher.take() {
            w.abort();
        }
    }

    /// Pod-template transitions of a workload so far (0 for one that does not exist).
    ///
    /// The stand-in counts them as it stores the objects. A real cluster keeps a revision per
    /// template, first 1, raised at each transition (a return to an earlier template too):
    /// for a Deployment its `deployment.kubernetes.io/revision` annotation (it outlives the
    /// ReplicaSets `revisionHistoryLimit` prunes), for a StatefulSet or a DaemonSet the highest
    /// `.revision` of the ControllerRevisions it owns, for an Argo Rollout its
    /// `rollout.argoproj.io/revision` annotation. A CronJob keeps none: on a real cluster this
    /// panics for it, so scenarios check [`Env::counts_rollouts`] first.
    pub async fn rollouts(&self, namespace: &str, kind: &str, name: &str) -> u64 {
        if let Some(api) = &self.api {
            return api.rollouts(namespace, kind, name);
        }
        self.revision(namespace, kind, name).await.saturating_sub(1)
    }

    /// On a real cluster, the highest revision the cluster keeps of a workload (0 before its
    /// controller has made the first); see [`Env::rollouts`].
    async fn revision(&self, namespace: &str, kind: &str, name: &str) -> u64 {
        match kind {
            "Deployment" => {
                self.revision_annotation(namespace, kind, name, "deployment.kubernetes.io/revision")
                    .await
            }
            "Rollout" => {
                self.revision_annotation(namespace, kind, name, "rollout.argoproj.io/revision")
                    .await
            }
            "StatefulSet" | "DaemonSet" => self.controller_revision(namespace, kind, name).await,
            // A custom resource of the scenarios has no controller and keeps no revision: its
            // CRD serves a status subresource, so only a change of `spec` raises its generation,
            // and the scenarios change nothing in it but the pod template.
            kind if super::kinds::test_kinds().iter().any(|k| k.kind == kind) => self
                .get_workload(namespace, kind, name)
                .await
                .and_then(|o| o.pointer("/metadata/generation").and_then(Value::as_u64))
                .unwrap_or(0),
            "CronJob" => panic!(
                "CronJob {}/{name}: a CronJob keeps no revision in Kubernetes, so its rollouts \
                 cannot be counted on a real cluster (check Env::counts_rollouts first)",
                self.ns(namespace)
            ),
            other => panic!("no workload kind {other}"),
        }
    }

    /// The revision a workload's annotation `annotation` holds (0 while it has none).
    async fn revision_annotation(
        &self,
        namespace: &str,
        kind: &str,
        name: &str,
        annotation: &str,
    ) -> u64 {
        let Some(object) = self.get_workload(namespace, kind, name).await else {
            return 0;
        };
        let Some(value) = object
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(annotation))
            .and_then(Value::as_str)
        else {
            return 0;
        };
        value.parse().unwrap_or_else(|_| {
            panic!(
                "{kind} {}/{name}: {annotation} is {value:?}, not a number",
                self.ns(namespace)
            )
        })
    }

    /// The highest revision of the ControllerRevisions the workload owns (0 while it has none).
    async fn controller_revision(&self, namespace: &str, kind: &str, name: &str) -> u64 {
        let Some(object) = self.get_workload(namespace, kind, name).await else {
            return 0;
        };
        let uid = object["metadata"]["uid"].as_str().unwrap_or_default();
        Api::<ControllerRevision>::namespaced(self.client.clone(), &self.ns(namespace))
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|r| r.owner_references().iter().any(|o| o.uid == uid))
            .map(|r| u64::try_from(r.revision).unwrap_or(0))
            .max()
            .unwrap_or(0)
    }

    /// Every touch confighash has made, whatever its outcome: its own writes to workloads (every
    /// PATCH, UPDATE or CREATE of a workload by confighash's user, whatever its answer), as the API
    /// server recorded them: the stand-in's record of requests, or on a real cluster its audit log
    /// (in this Env's namespaces), which needs [`AUDIT_LOG`].
    pub fn touches(&self) -> u64 {
        match &self.run {
            // The stand-in's record of requests: the in-process watcher's metrics start again
            // with each watcher a scenario starts, the API server's record does not.
            None => self
                .api()
                .audit()
                .iter()
                .filter(|r| {
                    r.user == "system:serviceaccount:confighash:confighash"
                        && matches!(r.verb.as_str(), "create" | "update" | "patch")
                        && WORKLOAD_RESOURCES.contains(&r.resource.as_str())
                })
                .count() as u64,
            Some((suffix, _)) => audit()
                .expect(
                    "counting confighash's writes on a real cluster needs CONFIGHASH_E2E_AUDIT_LOG",
                )
                .workload_writes(suffix)
                .len() as u64,
        }
    }

    /// The touches by outcome, for messages (on a real cluster: each write from the audit log).
    pub fn touch_outcomes(&self) -> String {
        match &self.run {
            None => ["touched", "kept-by-webhook", "gone", "error"]
                .into_iter()
                .map(|outcome| format!("{outcome} {}", self.metrics.touches(outcome)))
                .collect::<Vec<_>>()
                .join(", "),
            Some((suffix, _)) => audit()
                .map(|log| {
                    log.workload_writes(suffix)
                        .iter()
                        .map(|w| w.to_string())
                        .collect::<Vec<_>>()
                        .join("; ")
                })
                .unwrap_or_default(),
        }
    }

    /// confighash's writes (create, update, patch, delete) to objects in `namespace` so far, as
    /// the API server recorded them: the stand-in's record of its requests, or the real API
    /// server's audit log (whatever its answer). Needs [`Env::counts_writes`].
    pub fn confighash_writes(&self, namespace: &str) -> Vec<Audited> {
        let namespace = self.ns(namespace);
        let writes = |verb: &str| matches!(verb, "create" | "update" | "patch" | "delete");
        match &self.api {
            Some(api) => api
                .audit()
                .into_iter()
                .filter(|r| {
                    r.user == "system:serviceaccount:confighash:confighash"
                        && r.namespace == namespace
                        && writes(&r.verb)
                })
                .map(|r| Audited {
                    verb: r.verb,
                    resource: r.resource,
                    namespace: r.namespace,
                    name: r.name,
                    code: 0,
                    stored_stamp: None,
                    received_us: 0,
                    completed_us: 0,
                    user_agent: String::new(),
                })
                .collect(),
            None => audit()
                .expect(
                    "counting confighash's writes on a real cluster needs CONFIGHASH_E2E_AUDIT_LOG",
                )
                .requests()
                .into_iter()
                .filter(|r| r.namespace == namespace && writes(&r.verb))
                .collect(),
        }
    }

    /// Stops confighash, the webhook and the watcher (the API server then follows the failure
    /// policy, `Ignore`): in the stand-in both in-process parts, on a real cluster replica 0's
    /// process (SIGTERM; `kill: true` for SIGKILL).
    pub async fn stop_confighash(&mut self, kill: bool) {
        if self.is_stand_in() {
            self.stop_webhook().await;
            self.stop_watcher();
            return;
        }
        serve_sh(if kill { "kill" } else { "stop" }, 0).await;
    }

    /// Starts confighash again as it was started: in the stand-in the webhook on its port and the
    /// watcher as the leader, on a real cluster replica 0's process, returning once it is ready
    /// and its caches are synced.
    pub async fn start_confighash(&mut self) {
        if self.is_stand_in() {
            self.start_webhook().await;
            self.start_watcher();
            return;
        }
        serve_sh("start", 0).await;
        self.wait_leader().await;
    }

    /// On a real cluster: restarts replica 0 with `args` after the chart's own (a scenario of
    /// [`Env::controlling`] that needs other settings), returning once it leads; the returned
    /// guard restarts it as installed when dropped, also when the scenario fails. In the stand-in
    /// nothing happens: its settings are [`Setup`]'s.
    #[must_use = "dropping the guard restarts confighash as installed"]
    pub async fn restart_confighash_with(&mut self, args: &[&str]) -> Restored {
        if self.is_stand_in() {
            return Restored(false);
        }
        assert!(
            self.exclusive,
            "restarting confighash with other settings needs Env::controlling"
        );
        serve_sh("stop", 0).await;
        serve_sh_with("start", 0, args).await;
        self.wait_leader().await;
        Restored(true)
    }

    /// On a real cluster: polls until a replica of confighash leads ([`METRICS_URL`]'s
    /// `confighash_leader`). A replica that ended without giving the Lease up holds it until it
    /// expires (15 s after the others last saw it renewed), so a scenario that goes on at once
    /// would race the election with its own deadline. The stand-in's watcher always leads.
    pub async fn wait_leader(&self) {
        if self.is_stand_in() {
            return;
        }
        let Ok(urls) = std::env::var(METRICS_URL) else {
            return;
        };
        let start = tokio::time::Instant::now();
        loop {
            let mut seen = Vec::new();
            for url in urls.split(',') {
                match remote_gauge(url, "confighash_leader").await {
                    Ok(1) => return,
                    other => seen.push(format!("{url}: {other:?}")),
                }
            }
            assert!(
                start.elapsed() < LEADER_DEADLINE,
                "no replica of confighash leads after {LEADER_DEADLINE:?}: {seen:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Polls until confighash's watcher (on a real cluster: the leading replica's, read at
    /// [`METRICS_URL`]) keeps at least `at_least` objects of `kind`: it watches the kind. A kind
    /// it did not find at start (no CRD yet) is looked for again every minute
    /// ([`KIND_RECHECK_DEADLINE`]).
    pub async fn wait_watching(&self, kind: &str, at_least: u64) {
        let label = format!("confighash_watched_objects{{kind=\"{kind}\"}}");
        let watching = || async {
            if self.is_stand_in() {
                let kind = crate::e2e::kinds::kinds()
                    .iter()
                    .find(|k| k.kind() == kind)
                    .expect("a workload kind");
                return self.metrics.watched(kind.kind()) >= at_least;
            }
            let Ok(urls) = std::env::var(METRICS_URL) else {
                panic!("waiting for confighash to watch {kind} needs {METRICS_URL}");
            };
            for url in urls.split(',') {
                if remote_gauge(url, "confighash_leader").await == Ok(1) {
                    return remote_gauge(url, &label).await.unwrap_or(0) >= at_least;
                }
            }
            false
        };
        let start = tokio::time::Instant::now();
        while !watching().await {
            assert!(
                start.elapsed() < KIND_RECHECK_DEADLINE,
                "confighash does not watch {at_least} or more {kind} objects after {KIND_RECHECK_DEADLINE:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Replaces confighash's HMAC key with `bytes` and restarts its watcher, so reconcile runs
    /// with the new key: in the stand-in the key store takes it; on a real cluster (in a
    /// scenario started with [`Env::controlling`]) the key Secret of the chart's release is
    /// patched and confighash restarted.
    pub async fn replace_key(&mut self, bytes: &[u8]) {
        if self.is_stand_in() {
            self.keys
                .set(confighash::core::checksum::StampKey::new(bytes.to_vec()).unwrap());
            self.stop_watcher();
            self.start_watcher();
            return;
        }
        assert!(
            self.exclusive,
            "the key of a real cluster is shared: start the scenario with Env::controlling"
        );
        Api::<Secret>::namespaced(self.client.clone(), "confighash")
            .patch(
                "confighash-key",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {
                    "key": base64::engine::general_purpose::STANDARD.encode(bytes)
                }})),
            )
            .await
            .unwrap();
        self.stop_confighash(false).await;
        self.start_confighash().await;
    }

    /// Records what a user story measured, for the real tier's table ([`STORIES`]).
    pub fn record_story(&self, story: &str, expected: &str, measured: &str, test: &str) {
        let Some(path) = std::env::var_os(STORIES) else {
            return;
        };
        use std::io::Write;
        let line = json!({
            "story": story,
            "expected": expected,
            "measured": measured,
            "test": test,
            "server": if self.is_stand_in() { "stand-in" } else { "kube-apiserver" },
        });
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        // One write of the whole line: scenarios run in parallel, and appends of one write each
        // do not interleave, where `writeln!`'s several writes would.
        file.write_all(format!("{line}\n").as_bytes()).unwrap();
    }

    /// Whether confighash's writes are counted here: always in the stand-in, with the audit log
    /// on a real cluster.
    pub fn counts_writes(&self) -> bool {
        self.is_stand_in() || audit().is_some()
    }

    /// Where `namespace` stands now, for [`Env::assert_quiet_since`].
    pub async fn mark(&self, namespace: &str) -> Mark {
        Mark {
            namespace: namespace.to_owned(),
            // Not counted on a real cluster without its audit log (see `assert_quiet_since`).
            touches: if self.counts_writes() {
                self.touches()
            } else {
                0
            },
            barrier_rollouts: self.rollouts(namespace, "Deployment", "barrier").await,
        }
    }

    /// Asserts that since `mark` confighash wrote to no workload in its namespace but the
    /// barrier's, and recorded no `ConfigChanged` Event on `workload` (a touch the webhook turns
    /// back rolls nothing, so rollout counts alone cannot show it). Call it after a barrier.
    ///
    /// confighash's touches are counted by its metrics in the stand-in and from the audit log on
    /// a real cluster; without the audit log, this checks the Events alone.
    pub async fn assert_quiet_since(&self, mark: &Mark, workload: &str, what: &str) {
        if self.counts_writes() {
            let barrier = self
                .rollouts(&mark.namespace, "Deployment", "barrier")
                .await
                - mark.barrier_rollouts;
            assert_eq!(
                self.touches() - mark.touches,
                barrier,
                "{what}: confighash touched workloads besides the barrier's {barrier} touch(es) \
                 ({})",
                self.touch_outcomes()
            );
        }
        assert_eq!(
            self.events(&mark.namespace, workload, "ConfigChanged")
                .await,
            0,
            "{what}: a ConfigChanged Event on {workload}"
        );
    }

    /// How many Events with `reason` are recorded on the object `name` in `namespace`.
    pub async fn events(&self, namespace: &str, name: &str, reason: &str) -> usize {
        self.recorded_events(namespace, name, reason).await.len()
    }

    /// The Events of `reason` recorded on the workload `name` in `namespace`.
    pub async fn recorded_events(
        &self,
        namespace: &str,
        name: &str,
        reason: &str,
    ) -> Vec<k8s_openapi::api::events::v1::Event> {
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(
            self.client.clone(),
            &self.ns(namespace),
        )
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .collect()
    }

    /// Polls until the workload has rolled `n` times.
    pub async fn wait_rollouts(&self, namespace: &str, kind: &str, name: &str, n: u64) {
        let start = tokio::time::Instant::now();
        loop {
            let now = self.rollouts(namespace, kind, name).await;
            if now == n {
                return;
            }
            assert!(
                now < n,
                "{kind} {}/{name} rolled {now} times, more than {n}",
                self.ns(namespace)
            );
            assert!(
                start.elapsed() < DEADLINE,
                "{kind} {}/{name} rolled {now} times, not {n}",
                self.ns(namespace)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Polls until `check` holds; on timeout the message is `what()` at that time.
    pub async fn eventually_with<F, Fut>(&self, mut check: F, what: impl Fn() -> String)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let start = tokio::time::Instant::now();
        while !check().await {
            assert!(
                start.elapsed() < DEADLINE,
                "timed out waiting for {}",
                what()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Polls until `check` holds.
    pub async fn eventually<F, Fut>(&self, what: &str, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let start = tokio::time::Instant::now();
        while !check().await {
            assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A barrier: changes a sentinel ConfigMap in `namespace` and waits for its sentinel
    /// Deployment to roll. Watch events are handled in order, so everything written before the
    /// barrier has been handled by the watcher once it returns (including deciding not to act).
    ///
    /// In the stand-in it then waits for the watcher to settle ([`Env::settled`]). On a real
    /// cluster that cannot be observed, so there the barrier proves ordering only: a touch the
    /// watcher scheduled before it and had not sent yet may still land after it.
    pub async fn barrier(&self, namespace: &str) {
        self.roll_barrier(namespace).await;
        self.settled().await;
    }

    /// Changes the sentinel ConfigMap and waits for the sentinel Deployment to roll.
    async fn roll_barrier(&self, namespace: &str) {
        self.wait_synced().await;
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.ns(namespace));
        let deploys: Api<Deployment> = Api::namespaced(self.client.clone(), &self.ns(namespace));
        if deploys.get_opt("barrier").await.unwrap().is_none() {
            self.config_map(namespace, "barrier", &[("n", "0")]).await;
            self.deployment(namespace, "barrier", &[("envFrom", "barrier")])
                .await;
        }
        let before = self.rollouts(namespace, "Deployment", "barrier").await;
        let n = cms.get("barrier").await.unwrap().data.unwrap()["n"]
            .parse::<u64>()
            .unwrap()
            + 1;
        cms.patch(
            "barrier",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"n": n.to_string()}})),
        )
        .await
        .unwrap();
        self.wait_rollouts(namespace, "Deployment", "barrier", before + 1)
            .await;
    }

    /// Polls until the watcher has no touch pending or in flight (its own metrics say so), so a
    /// touch due later cannot land after an "exactly once" check.
    ///
    /// On a real cluster this reads confighash's metrics at [`METRICS_URL`] (its watcher has no
    /// touch pending or in flight, in any namespace); without it, it returns at once, and there a
    /// [`Env::barrier`] proves ordering only.
    pub async fn settled(&self) {
        if !self.is_stand_in() {
            let Ok(urls) = std::env::var(METRICS_URL) else {
                return;
            };
            let start = tokio::time::Instant::now();
            loop {
                // Every replica that answers has nothing pending; one that does not answer is
                // not running (stopped by a scenario), so it has nothing pending either, but
                // one replica at least must answer.
                let mut answered = 0;
                let mut busy = Vec::new();
                let mut errors = Vec::new();
                for url in urls.split(',') {
                    match remote_outstanding(url).await {
                        Ok((0, 0)) => answered += 1,
                        Ok(outstanding) => {
                            answered += 1;
                            busy.push(format!("{url}: (pending, in flight) {outstanding:?}"));
                        }
                        Err(e) => errors.push(e),
                    }
                }
                if answered > 0 && busy.is_empty() {
                    return;
                }
                let last = format!("{busy:?} {errors:?}");
                assert!(
                    start.elapsed() < DEADLINE,
                    "timed out waiting for confighash to settle: {last}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        self.eventually_with(
            || async { self.metrics.touches_outstanding() == (0, 0) },
            || {
                format!(
                    "the watcher to settle: (pending, in flight) {:?}",
                    self.metrics.touches_outstanding()
                )
            },
        )
        .await;
    }

    /// Polls until the in-process watcher has listed everything (changes made before that are
    /// left to reconcile, which does not replace foreign stamps). A real cluster is assumed
    /// synced.
    pub async fn wait_synced(&self) {
        if self.watcher.is_none() {
            return;
        }
        let metrics = self.metrics.clone();
        self.eventually("the watcher's caches to sync", || {
            let synced = metrics
                .encode()
                .lines()
                .any(|l| l == "confighash_watcher_cache_synced 1");
            async move { synced }
        })
        .await;
    }

    /// Creates a namespace, opted in or not (on a real cluster, named and labelled as
    /// [`Env::ns`] says).
    pub async fn namespace(&self, name: &str, opted_in: bool) {
        let mut labels = BTreeMap::new();
        if opted_in {
            labels.insert("confighash.dev/enabled".to_owned(), "true".to_owned());
        }
        if let Some((suffix, _)) = &self.run {
            labels.insert(RUN_LABEL.to_owned(), suffix.clone());
        }
        let ns = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(self.ns(name)),
                labels: Some(labels),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
    }

    /// Creates or replaces a ConfigMap's data.
    pub async fn config_map(&self, namespace: &str, name: &str, data: &[(&str, &str)]) {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.ns(namespace));
        let data: BTreeMap<String, String> = data
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        match api.get_opt(name).await.unwrap() {
            Some(mut cm) => {
                cm.data = Some(data);
                api.replace(name, &PostParams::default(), &cm)
                    .await
                    .unwrap();
            }
            None => {
                let cm = ConfigMap {
                    metadata: kube::api::ObjectMeta {
                        name: Some(name.to_owned()),
                        ..Default::default()
                    },
                    data: Some(data),
                    ..Default::default()
                };
                api.create(&PostParams::default(), &cm).await.unwrap();
            }
        }
    }

    /// Creates or replaces a Secret's data (as stringData).
    pub async fn secret(&self, namespace: &str, name: &str, data: &[(&str, &str)]) {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.ns(namespace));
        let string_data: BTreeMap<String, String> = data
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        match api.get_opt(name).await.unwrap() {
            Some(mut s) => {
                s.data = None;
                s.string_data = Some(string_data);
                api.replace(name, &PostParams::default(), &s).await.unwrap();
            }
            None => {
                let s = Secret {
                    metadata: kube::api::ObjectMeta {
                        name: Some(name.to_owned()),
                        ..Default::default()
                    },
                    string_data: Some(string_data),
                    ..Default::default()
                };
                api.create(&PostParams::default(), &s).await.unwrap();
            }
        }
    }

    pub async fn delete_config_map(&self, namespace: &str, name: &str) {
        Api::<ConfigMap>::namespaced(self.client.clone(), &self.ns(namespace))
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }

    /// Creates a Deployment whose single container uses `refs`: ("envFrom", cm), ("secretEnvFrom",
    /// secret), ("key", "cm/key"), ("secretKey", "secret/key"), ("volume", cm) (mounted).
    pub async fn deployment(&self, namespace: &str, name: &str, refs: &[(&str, &str)]) -> Value {
        self.workload(namespace, "Deployment", name, refs, json!({}))
            .await
    }

    /// Creates a workload of `kind` (Deployment, StatefulSet, DaemonSet, CronJob, Rollout).
    pub async fn workload(
        &self,
        namespace: &str,
        kind: &str,
        name: &str,
        refs: &[(&str, &str)],
        labels: Value,
    ) -> Value {
        let obj = workload_object(kind, name, refs, labels);
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &self.ns(namespace),
            &api_resource(kind),
        );
        let dynamic: DynamicObject = serde_json::from_value(obj).unwrap();
        let created = api.create(&PostParams::default(), &dynamic).await.unwrap();
        self.wait_first_revision(namespace, kind, name).await;
        serde_json::to_value(created).unwrap()
    }

    /// On a real cluster, polls until the workload's controller has seen it and made its first
    /// revision (a ReplicaSet, a ControllerRevision). A template changed before that is folded
    /// into the first revision by the real controller (one ReplicaSet from the latest template),
    /// so a rollout counted from revisions would not be seen; the stand-in counts every
    /// transition as it stores it. CronJobs and Rollouts (their own controller, maybe absent)
    /// are not waited for.
    pub async fn wait_first_revision(&self, namespace: &str, kind: &str, name: &str) {
        if self.is_stand_in() || !matches!(kind, "Deployment" | "StatefulSet" | "DaemonSet") {
            return;
        }
        self.eventually_with(
            || async {
                self.observed_latest(namespace, kind, name).await
                    && self.revision(namespace, kind, name).await >= 1
            },
            || {
                format!(
                    "the controller's first revision of {kind} {}/{name}",
                    self.ns(namespace)
                )
            },
        )
        .await;
    }

    /// Whether the workload's controller has seen its latest generation (on a real cluster: its
    /// last template has a revision); false while the workload does not exist.
    pub async fn observed_latest(&self, namespace: &str, kind: &str, name: &str) -> bool {
        let Some(object) = self.get_workload(namespace, kind, name).await else {
            return false;
        };
        let generation = object
            .pointer("/metadata/generation")
            .and_then(Value::as_i64);
        let observed = object
            .pointer("/status/observedGeneration")
            .and_then(Value::as_i64);
        observed >= generation
    }

    /// The stamp on a workload's pod template, read from the API server.
    pub async fn stamp(&self, namespace: &str, kind: &str, name: &str) -> Option<String> {
        let obj = self.get_workload(namespace, kind, name).await?;
        let configured = super::kinds::test_kinds().iter().find(|k| k.kind == kind);
        let template = match configured {
            Some(k) => k.template.as_str(),
            None if kind == "CronJob" => "/spec/jobTemplate/spec/template",
            None => "/spec/template",
        };
        obj.pointer(&format!("{template}/metadata/annotations"))?
            .get(STAMP)?
            .as_str()
            .map(str::to_owned)
    }

    pub async fn get_workload(&self, namespace: &str, kind: &str, name: &str) -> Option<Value> {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &self.ns(namespace),
            &api_resource(kind),
        );
        api.get_opt(name)
            .await
            .unwrap()
            .map(|o| serde_json::to_value(o).unwrap())
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(w) = self.watcher.take() {
            w.abort();
        }
        for task in self.background.drain(..) {
            task.abort();
        }
        if let Some((suffix, config)) = self.run.take() {
            if std::thread::panicking() {
                eprintln!(
                    "real cluster: kept the namespaces labelled {RUN_LABEL}={suffix} to look at"
                );
            } else {
                delete_namespaces(config, &suffix);
            }
        }
    }
}

/// Runs `clean` against a real cluster from a `drop`: on a thread with a runtime and a client of
/// its own (a [`kube::Client`] is bound to the runtime that made it, and the dropped value's
/// runtime cannot be awaited), and waits for it. A failure is printed with `what`, not raised:
/// a drop may run while a test panics.
pub fn clean_up<F, Fut>(config: kube::Config, what: &str, clean: F)
where
    F: FnOnce(kube::Client) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let done = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        // The client's worker task needs the runtime: it is made inside it.
        runtime.block_on(async move {
            let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
            clean(client).await
        })
    })
    .join();
    match done {
        Ok(Ok(())) => {}
        Ok(Err(e)) => eprintln!("real cluster: {what}: {e}"),
        Err(_) => eprintln!("real cluster: {what} panicked"),
    }
}

/// Deletes the namespaces labelled [`RUN_LABEL`]`=suffix`, best effort: the dropped `Env`'s
/// runtime cannot be awaited from `drop`, so this runs on a thread of its own with a client of
/// its own, for up to 30 s.
fn delete_namespaces(config: kube::Config, suffix: &str) {
    let selector = format!("{RUN_LABEL}={suffix}");
    let (done, outcome) = std::sync::mpsc::channel();
    let labels = selector.clone();
    std::thread::spawn(move || {
        let deleted = async move {
            let api = Api::<Namespace>::all(kube::Client::try_from(config)?);
            for namespace in api.list(&ListParams::default().labels(&labels)).await? {
                api.delete(&namespace.name_any(), &DeleteParams::default())
                    .await?;
            }
            Ok::<_, kube::Error>(())
        };
        let result = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime.block_on(deleted).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let _ = done.send(result);
    });
    match outcome.recv_timeout(Duration::from_secs(30)) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => eprintln!("real cluster: could not delete the namespaces {selector}: {e}"),
        Err(_) => eprintln!("real cluster: timed out deleting the namespaces {selector}"),
    }
}

/// The API of a workload kind by its name (Deployment, StatefulSet, DaemonSet, CronJob, Rollout,
/// or a configured kind of the scenarios: [`super::kinds`]).
pub fn api_resource(kind: &str) -> kube::api::ApiResource {
    if let Some(test_kind) = super::kinds::test_kinds().iter().find(|k| k.kind == kind) {
        return test_kind.api_resource();
    }
    let (group, version, plural) = match kind {
        "CronJob" => ("batch", "v1", "cronjobs"),
        "Rollout" => ("argoproj.io", "v1alpha1", "rollouts"),
        "StatefulSet" => ("apps", "v1", "statefulsets"),
        "DaemonSet" => ("apps", "v1", "daemonsets"),
        _ => ("apps", "v1", "deployments"),
    };
    kube::api::ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: format!("{group}/{version}"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// A workload object of `kind` whose container uses `refs` (see [`Env::deployment`]).
pub fn workload_object(kind: &str, name: &str, refs: &[(&str, &str)], labels: Value) -> Value {
    let mut env_from = Vec::new();
    let mut env = Vec::new();
    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    for (i, (how, what)) in refs.iter().enumerate() {
        match *how {
            "envFrom" => env_from.push(json!({"configMapRef": {"name": what}})),
            "optionalEnvFrom" => {
                env_from.push(json!({"configMapRef": {"name": what, "optional": true}}))
            }
            "secretEnvFrom" => env_from.push(json!({"secretRef": {"name": what}})),
            "key" | "secretKey" => {
                let (obj, key) = what.split_once('/').unwrap();
                let selector = if *how == "key" {
                    "configMapKeyRef"
                } else {
                    "secretKeyRef"
                };
                env.push(json!({"name": format!("V{i}"), "valueFrom": {selector: {"name": obj, "key": key}}}));
            }
            "volume" => {
                volumes.push(json!({"name": format!("v{i}"), "configMap": {"name": what}}));
                mounts.push(json!({"name": format!("v{i}"), "mountPath": format!("/etc/v{i}")}));
            }
            other => panic!("unknown reference form {other}"),
        }
    }
    let template = json!({
        "metadata": {"labels": {"app": name}},
        "spec": {
            "restartPolicy": if kind == "CronJob" { "OnFailure" } else { "Always" },
            "containers": [{"name": "app", "image": "example/app:1", "envFrom": env_from, "env": env, "volumeMounts": mounts}],
            "volumes": volumes
        }
    });
    if let Some(test_kind) = super::kinds::test_kinds().iter().find(|k| k.kind == kind) {
        // A custom resource: its spec's required fields, and the template at its pointer.
        let mut spec = match kind {
            "CloneSet" => json!({"replicas": 1, "selector": {"matchLabels": {"app": name}}}),
            "ScaledJob" => json!({"pollingInterval": 30, "triggers": [
                {"type": "cron", "metadata": {"timezone": "Etc/UTC", "start": "0 1 * * *",
                 "end": "0 2 * * *", "desiredReplicas": "1"}}]}),
            _ => json!({}),
        };
        let mut object = json!({"spec": {}});
        let tokens: Vec<&str> = test_kind
            .template
            .trim_start_matches('/')
            .split('/')
            .collect();
        let mut here = &mut object;
        for token in &tokens[..tokens.len() - 1] {
            here = here
                .as_object_mut()
                .unwrap()
                .entry(token.to_string())
                .or_insert_with(|| json!({}));
        }
        here[tokens[tokens.len() - 1]] = template;
        merge(&mut spec, object["spec"].take());
        return json!({
            "apiVersion": test_kind.api_version(),
            "kind": kind,
            "metadata": {"name": name, "labels": labels},
            "spec": spec
        });
    }
    let (api_version, spec) = match kind {
        // Suspended: on a real cluster no Job starts, so any Job there is one confighash made.
        "CronJob" => (
            "batch/v1",
            json!({"schedule": "*/5 * * * *", "suspend": true, "jobTemplate": {"spec": {"template": template}}}),
        ),
        // Argo Rollouts' controller takes no Rollout without a strategy.
        "Rollout" => (
            "argoproj.io/v1alpha1",
            json!({"selector": {"matchLabels": {"app": name}}, "strategy": {"canary": {}}, "template": template}),
        ),
        "StatefulSet" => (
            "apps/v1",
            json!({"serviceName": name, "selector": {"matchLabels": {"app": name}}, "template": template}),
        ),
        _ => (
            "apps/v1",
            json!({"selector": {"matchLabels": {"app": name}}, "template": template}),
        ),
    };
    json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "labels": labels},
        "spec": spec
    })
}

/// Adds `from`'s members to `into` (objects merged member by member).
fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(into), Value::Object(from)) => {
            for (key, value) in from {
                merge(into.entry(key).or_insert(Value::Null), value);
            }
        }
        (into, from) => *into = from,
    }
}

/// confighash's touches pending and in flight, read from its metrics at `url` (plain HTTP on
/// loopback, as `scripts/real-tier.sh` runs it).
async fn remote_outstanding(url: &str) -> Result<(u64, u64), String> {
    Ok((
        remote_gauge(url, "confighash_touches_pending").await?,
        remote_gauge(url, "confighash_touches_in_flight").await?,
    ))
}

/// The metrics text at `url` (plain HTTP on loopback, `/metrics` when the URL has no path),
/// with the response head.
pub async fn remote_metrics(url: &str) -> Result<String, String> {
    let address = url
        .strip_prefix("http://")
        .and_then(|rest| rest.split('/').next())
        .ok_or_else(|| format!("{METRICS_URL}={url} is not an http:// URL"))?;
    let path = &url["http://".len() + address.len()..];
    tokio::time::timeout(Duration::from_secs(5), async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(address)
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        let request = format!(
            "GET {} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n",
            if path.is_empty() { "/metrics" } else { path }
        );
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        let mut body = String::new();
        stream
            .read_to_string(&mut body)
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        Ok::<_, String>(body)
    })
    .await
    .map_err(|_| format!("{url}: no answer in 5 s"))?
}

/// The value of an unlabelled gauge in the metrics at `url`.
async fn remote_gauge(url: &str, name: &str) -> Result<u64, String> {
    let text = remote_metrics(url).await?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(' ')?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map(|v| v as u64)
        .ok_or_else(|| format!("{url} has no {name}"))
}

/// One request of confighash's in the API server's audit log.
#[derive(Debug, Clone)]
pub struct Audited {
    pub verb: String,
    pub resource: String,
    pub namespace: String,
    pub name: String,
    pub code: u16,
    /// For a write to a workload: the stamp of the pod template the API server stored, as its
    /// answer says (the audit policy records answers of workload writes).
    pub stored_stamp: Option<String>,
    /// When the API server received the request and when it finished answering it
    /// (`requestReceivedTimestamp`, `stageTimestamp` of the final stage), in microseconds since
    /// the epoch; 0 when the log has none.
    pub received_us: i64,
    pub completed_us: i64,
    pub user_agent: String,
}

impl std::fmt::Display for Audited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} {}/{} -> {}",
            self.verb, self.resource, self.namespace, self.name, self.code
        )
    }
}

/// The API server's audit log, read as it grows: only confighash's requests are kept, parsed once.
pub struct AuditLog {
    path: std::path::PathBuf,
    user: String,
    read: std::sync::Mutex<(u64, Vec<Audited>)>,
}

/// The audit log named by [`AUDIT_LOG`], shared by the tests of this binary.
pub fn audit() -> Option<&'static AuditLog> {
    static LOG: std::sync::OnceLock<Option<AuditLog>> = std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        let path = std::env::var_os(AUDIT_LOG)?;
        Some(AuditLog {
            path: path.into(),
            user: std::env::var(CONFIGHASH_USER)
                .unwrap_or_else(|_| "system:serviceaccount:confighash:confighash".into()),
            read: std::sync::Mutex::new((0, Vec::new())),
        })
    })
    .as_ref()
}

impl AuditLog {
    /// The audit log named by [`AUDIT_LOG`], read for the requests of `user` (another
    /// installation's ServiceAccount); None without the log.
    pub fn of_user(user: &str) -> Option<AuditLog> {
        Some(AuditLog {
            path: std::env::var_os(AUDIT_LOG)?.into(),
            user: user.to_owned(),
            read: std::sync::Mutex::new((0, Vec::new())),
        })
    }

    /// The user confighash runs as (`system:serviceaccount:NS:NAME`).
    pub fn user(&self) -> &str {
        &self.user
    }

    /// Every request of confighash's recorded so far (its final stage), in order.
    pub fn requests(&self) -> Vec<Audited> {
        use std::io::{BufRead, Seek};
        let mut read = self.read.lock().unwrap();
        let mut file = std::fs::File::open(&self.path)
            .unwrap_or_else(|e| panic!("{}: {e}", self.path.display()));
        let len = file.metadata().map_or(0, |m| m.len());
        assert!(
            len >= read.0,
            "{} is shorter ({len} bytes) than what was read of it ({} bytes): it was rotated, \
             and the requests written to the file rotated away would not be counted",
            self.path.display(),
            read.0
        );
        file.seek(std::io::SeekFrom::Start(read.0)).unwrap();
        let mut reader = std::io::BufReader::new(file);
        let needle = format!("\"username\":\"{}\"", self.user);
        let mut line = String::new();
        loop {
            line.clear();
            let n = reader.read_line(&mut line).unwrap();
            // A line still being written is read again next time.
            if n == 0 || !line.ends_with('\n') {
                break;
            }
            read.0 += n as u64;
            if !line.contains(&needle) {
                continue;
            }
            let entry: Value = serde_json::from_str(&line).expect("an audit log line is JSON");
            if entry["stage"] != "ResponseComplete" || entry["user"]["username"] != *self.user {
                continue;
            }
            let field = |pointer: &str| {
                entry
                    .pointer(pointer)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned()
            };
            let micros = |pointer: &str| {
                entry
                    .pointer(pointer)
                    .and_then(Value::as_str)
                    .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
                    .map_or(0, |t| t.as_microsecond())
            };
            read.1.push(Audited {
                received_us: micros("/requestReceivedTimestamp"),
                completed_us: micros("/stageTimestamp"),
                user_agent: field("/userAgent"),
                verb: field("/verb"),
                resource: match field("/objectRef/subresource") {
                    sub if sub.is_empty() => field("/objectRef/resource"),
                    sub => format!("{}/{sub}", field("/objectRef/resource")),
                },
                namespace: field("/objectRef/namespace"),
                name: field("/objectRef/name"),
                code: entry
                    .pointer("/responseStatus/code")
                    .and_then(Value::as_u64)
                    .unwrap_or(0) as u16,
                stored_stamp: [
                    "/responseObject/spec/template",
                    "/responseObject/spec/jobTemplate/spec/template",
                ]
                .iter()
                .find_map(|template| {
                    entry
                        .pointer(&format!(
                            "{template}/metadata/annotations/{}",
                            STAMP.replace('/', "~1")
                        ))
                        .and_then(Value::as_str)
                })
                .map(str::to_owned),
            });
        }
        read.1.clone()
    }

    /// confighash's writes (create, update, patch, delete) in the namespaces ending in
    /// `-suffix`.
    pub fn writes(&self, suffix: &str) -> Vec<Audited> {
        let tail = format!("-{suffix}");
        self.requests()
            .into_iter()
            .filter(|r| {
                r.namespace.ends_with(&tail)
                    && matches!(r.verb.as_str(), "create" | "update" | "patch" | "delete")
            })
            .collect()
    }

    /// confighash's writes to workloads (its touches) in the namespaces ending in `-suffix`.
    pub fn workload_writes(&self, suffix: &str) -> Vec<Audited> {
        self.writes(suffix)
            .into_iter()
            .filter(|r| WORKLOAD_RESOURCES.contains(&r.resource.as_str()))
            .collect()
    }
}

/// The recipe over objects a run knows (its model, or what it read back) of namespace `ns`: the stamp, and whether a
/// required reference is absent.
pub fn recipe(
    key: &StampKey,
    ns: &str,
    refs: &References,
    cms: &BTreeMap<String, ConfigMap>,
    secrets: &BTreeMap<String, Secret>,
) -> Result<(String, bool), String> {
    let mut views: HashMap<ObjectRef, Option<ObjectView<'_>>> = HashMap::new();
    let mut required_absent = false;
    for (r, spec) in refs.iter() {
        let found = match r.kind {
            ObjectKind::ConfigMap => cms.get(&r.name).map(|cm| {
                (
                    is_ignored(cm.metadata.annotations.as_ref()),
                    ObjectView::config_map(cm).map_err(|e| e.to_string()),
                )
            }),
            ObjectKind::Secret => secrets.get(&r.name).map(|s| {
                (
                    is_ignored(s.metadata.annotations.as_ref()),
                    Ok(ObjectView::secret(s)),
                )
            }),
        };
        match found {
            None => required_absent |= !spec.optional,
            Some((true, _)) => {
                views.insert(r.clone(), None);
            }
            Some((false, view)) => {
                views.insert(r.clone(), Some(view?));
            }
        }
    }
    let stamp = compute_stamp(Some(key), ns, refs, |r| match views.get(r) {
        None => RefState::Absent,
        Some(None) => RefState::Ignored,
        Some(Some(v)) => RefState::Present(v),
    });
    Ok((String::from(stamp), required_absent))
}

/// The replica of the real tier's `serve.sh` that holds confighash's Lease (its identity is
/// `confighash-local-N`), if any.
pub async fn leader_replica(env: &Env) -> Option<u8> {
    let lease = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
        env.client.clone(),
        "confighash",
    )
    .get_opt("confighash")
    .await
    .unwrap()?;
    let holder = lease.spec?.holder_identity?;
    let rest = holder.strip_prefix("confighash-local-")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Replica 0 restarted with other settings ([`Env::restart_confighash_with`]): restarted as
/// installed when dropped.
pub struct Restored(bool);

impl Drop for Restored {
    fn drop(&mut self) {
        if !self.0 {
            return;
        }
        let Some(script) = std::env::var_os(SERVE) else {
            return;
        };
        for verb in ["stop", "start"] {
            let status = std::process::Command::new(&script)
                .arg(verb)
                .arg("0")
                .status();
            if !status.as_ref().is_ok_and(|s| s.success()) {
                eprintln!("serve.sh {verb} 0 failed while restoring confighash: {status:?}");
            }
        }
    }
}

/// Runs the real tier's `serve.sh VERB N` ([`SERVE`]) and fails the scenario if it fails.
pub async fn serve_sh(verb: &str, replica: u8) {
    serve_sh_with(verb, replica, &[]).await;
}

/// As [`serve_sh`], with arguments for `confighash serve` after the chart's (`start` only).
pub async fn serve_sh_with(verb: &str, replica: u8, args: &[&str]) {
    let script = std::env::var_os(SERVE)
        .expect("stopping or starting confighash on a real cluster needs CONFIGHASH_E2E_SERVE");
    let status = tokio::process::Command::new(&script)
        .arg(verb)
        .arg(replica.to_string())
        .args(args)
        .status()
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", std::path::Path::new(&script).display()));
    assert!(status.success(), "serve.sh {verb} {replica}: {status}");
}

tokio::task_local! {
    /// Set while [`Env::controlling`] builds its Env, which holds the exclusive lock already.
    static CONTROLLING: bool;
}

/// The lock beside the real tier's `serve.sh` ([`SERVE`]): shared by every real-cluster scenario,
/// exclusive for one that stops or adds confighash replicas. None without `serve.sh`.
async fn scenario_lock(exclusive: bool) -> Option<std::fs::File> {
    let script = std::env::var_os(SERVE)?;
    let path = std::path::PathBuf::from(script).with_extension("lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    tokio::task::spawn_blocking(move || {
        if exclusive {
            file.lock()
        } else {
            file.lock_shared()
        }
        .map(|()| file)
    })
    .await
    .unwrap()
    .map(Some)
    .unwrap_or_else(|e| panic!("locking {}: {e}", path.display()))
}

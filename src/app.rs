//! The composition root: `confighash serve` wired from its [`Config`], the one place where the
//! parts meet (the client, the key, the certificates, the webhook, the watcher, leader election
//! and the admin port).
//!
//! [`cli`](crate::cli) turns the flags into a [`Config`]; `main` fits it under the open-file
//! limit ([`Config::fit_open_files`]), builds the Kubernetes client, then [`App::from_config`]
//! loads and builds every part and [`App::run_until`] serves until SIGTERM or SIGINT
//! ([`shutdown_signal`]). Each part is built by one associated function ([`App::webhook`],
//! [`App::watcher_config`], [`App::leader_config`], [`App::certificates`], [`App::start_server`],
//! ...), which harnesses that restart a single part call too.

use std::collections::BTreeSet;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::certs::key::KeyStore;
use crate::certs::selfsigned::SelfSignedConfig;
use crate::cluster::Cluster;
use crate::cluster::get::Getter;
use crate::metrics::Metrics;
use crate::serving::health::Health;
use crate::serving::server::Limits as ConnectionLimits;
use crate::serving::server::{
    AdminLimits, Fit, NoRoom, RESERVED_FILES, ServeError, fit_max_connections, open_file_limit,
    raise_open_file_limit,
};
use crate::serving::tls::{CertStore, ClientCaStore};
use crate::watcher::WatcherConfig;
use crate::watcher::leader::{LeaderConfig, Leadership};
use crate::webhook::admission::{self, Webhook};
use crate::webhook::server::{RunningWebhook, WebhookLimits, WebhookServeConfig, start_with};

/// Why `confighash serve` stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot reach the Kubernetes API (in-cluster config or KUBECONFIG): {0}")]
    Client(#[source] kube::Error),
    #[error(transparent)]
    Key(#[from] crate::certs::key::KeyLoadError),
    #[error(transparent)]
    Tls(#[from] crate::serving::tls::TlsError),
    #[error(transparent)]
    SelfSigned(#[from] crate::certs::selfsigned::SelfSignedError),
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error("leader election: {0}")]
    Leader(String),
    #[error("cannot listen for signals: {0}")]
    Signal(#[source] std::io::Error),
    #[error(transparent)]
    OpenFiles(#[from] NoRoom),
    #[error(
        "--watch-namespaces may not list {0}: confighash never reads or touches kube-system or its own namespace"
    )]
    WatchNamespace(String),
}

/// What `confighash serve`'s client reads: what its parts declare, together.
pub const READS: crate::cluster::client::Reads = crate::watcher::READS
    .and(crate::webhook::READS)
    .and(crate::certs::READS);

/// How often the certificate files are re-read.
pub const CERT_POLL: Duration = Duration::from_secs(10);
/// From accept, a client must finish its TLS handshake and send its first request head within
/// this; also each later HTTP/1.1 request head.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// A review must be received and answered within this from its head (more when
/// `--lookup-deadline` needs it). The API server gives up after the configuration's
/// `timeoutSeconds` (5 s in `deploy/`) anyway; this bounds what a client that is not the API
/// server can hold.
const REQUEST_TIMEOUT: Duration = crate::serving::server::DEFAULT_REQUEST_TIMEOUT;
/// The lookups must fit in the request timeout, with this to spare for the body.
const REQUEST_SLACK: Duration = Duration::from_secs(5);
/// In-flight requests get this long at shutdown (below the pod's 30 s grace period, with
/// [`SHUTDOWN_DELAY`]).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);
/// In a cluster, a replica told to stop goes on accepting for this long: its Service endpoint is
/// removed (EndpointSlice, then kube-proxy's rules) only after the pod is marked terminating, and
/// until then kube-apiserver's new connections still reach it. A replica that stopped listening
/// at once failed the reviews sent in that gap, and with `failurePolicy: Ignore` their workloads
/// were admitted unstamped (seen on the real-node tier during `helm upgrade`).
pub const SHUTDOWN_DELAY: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------------------
// The configuration

/// Everything `confighash serve` runs with, in plain types. [`Config::default`] is what the
/// command line gives without flags outside a cluster (leader election off).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Address of the webhook (HTTPS), `--listen`.
    pub listen: SocketAddr,
    /// Address of the admin port (plain HTTP: /livez, /readyz, /metrics), `--admin-listen`.
    pub admin_listen: SocketAddr,
    /// Where the stamp key comes from.
    pub key: KeySource,
    /// Where the serving certificate comes from.
    pub certs: CertSource,
    /// With a CA file, the webhook requires client certificates it signed (`--client-ca-file`).
    pub client_ca_file: Option<PathBuf>,
    /// Webhook connections served at once (`--max-connections`); [`Config::fit_open_files`]
    /// lowers it to fit under the open-file limit.
    pub max_connections: usize,
    /// One deadline for all lookups of a review (`--lookup-deadline`).
    pub lookup_deadline: Duration,
    /// Distinct ConfigMaps and Secrets a workload may reference (`--max-references`).
    pub max_references: usize,
    /// The decoded bytes the recipe may read for one workload (`--max-reference-bytes`).
    pub max_reference_bytes: u64,
    /// Namespaces never read or touched besides `kube-system` and the pod's own
    /// (`--exclude-namespaces`).
    pub exclude_namespaces: Vec<String>,
    /// `--watch-namespaces`: the only namespaces read, stamped or touched (`None`: the whole
    /// cluster). Neither `kube-system` nor the pod's own may be in it.
    pub watch_namespaces: Option<BTreeSet<String>>,
    /// `--roll-on-delete` and `--stamp-existing`.
    pub rules: crate::core::rules::Options,
    /// The watcher's pace.
    pub watcher: WatcherSettings,
    /// Whether one leader is elected among replicas, and on which Lease.
    pub leader_election: LeaderElection,
    /// This replica's name in the Lease and in Events; `None`: the pod name (or host name) plus
    /// a random suffix ([`LeaderConfig::default_identity`]), chosen once by
    /// [`App::from_config`].
    pub identity: Option<String>,
    /// How often the certificate files (and the client CA) are re-read.
    pub cert_poll: Duration,
    /// From accept, the TLS handshake and the first request head must arrive within this.
    pub header_read_timeout: Duration,
    /// How long in-flight requests get to finish at shutdown.
    pub drain_timeout: Duration,
    /// At shutdown, how long the replica goes on serving as usual (new connections included)
    /// after `/readyz` turns 503, before it stops accepting and drains: the time the cluster
    /// takes to stop sending it new connections ([`SHUTDOWN_DELAY`] in a cluster, 0 outside).
    pub shutdown_delay: Duration,
    /// `--dry-run`: the webhook allows every review without a patch and the watcher records
    /// `WouldRoll` Events instead of touching; no workload is written.
    pub dry_run: bool,
    /// The kinds stamped and watched: the built-in kinds and `--workload-kind`.
    pub kinds: crate::core::workload::Kinds,
}

/// Where the stamp key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// A file: its bytes exactly as they are (`--key-file`).
    File(PathBuf),
    /// Data key `key` of this Secret in the pod's namespace, created when absent and reloaded
    /// when it changes (`--key-secret`).
    Secret(String),
}

/// Where the serving certificate comes from: files, re-read when they change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertSource {
    /// The serving certificate (PEM), `--tls-cert`.
    pub cert: PathBuf,
    /// Its private key (PEM), `--tls-key`.
    pub key: PathBuf,
    /// Made and kept by confighash itself, and written to the two files
    /// (`--self-signed-certs`); `None`: written by something else (cert-manager, a Secret
    /// volume).
    pub self_signed: Option<SelfSigned>,
}

/// The names `--self-signed-certs` works with, all in the pod's namespace but the cluster-wide
/// webhook configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelfSigned {
    /// The Secret that holds the CA and the serving pair (`--certs-secret`).
    pub secret: String,
    /// The webhook's Service, whose DNS names the certificate carries (`--service`).
    pub service: String,
    /// The MutatingWebhookConfiguration whose caBundle is kept current
    /// (`--webhook-configuration`).
    pub webhook_configuration: String,
    /// More names the serving certificate carries besides the Service's (`--self-signed-name`):
    /// host names, or IP addresses (IP SANs), for an API server that calls the webhook by URL.
    pub extra_names: Vec<String>,
}

/// The watcher's pace.
#[derive(Debug, Clone, PartialEq)]
pub struct WatcherSettings {
    /// The change window (`--debounce`).
    pub debounce: Duration,
    /// Reconcile period (`--resync`).
    pub resync: Duration,
    /// Cluster-wide touch rate (`--max-touches-per-second`).
    pub max_touches_per_second: f64,
    /// List page size.
    pub page_size: u32,
    /// How often kinds the cluster does not serve are looked for again.
    pub kind_recheck: Duration,
    /// First retry delay of a touch the webhook did not confirm.
    pub retry_base: Duration,
    /// How long after start (and after its namespace opted in) a workload seen without stamp or
    /// marker counts as bypassed; `None` counts none.
    pub bypass_grace: Option<Duration>,
    /// How long a StatefulSet's or DaemonSet's rollout after a config change may take before it
    /// is reported stalled (`--rollout-timeout`).
    pub rollout_timeout: Duration,
    /// The flap guard's threshold (`--flap-threshold`) and period (`--flap-period`).
    pub flap_threshold: u32,
    pub flap_period: Duration,
    /// Progressive waves: `--progressive-dependents`, `--progressive-timeout`,
    /// `--progressive-settle`.
    pub progressive_dependents: Option<usize>,
    pub progressive_timeout: Duration,
    pub progressive_settle: Duration,
}

/// Leader election among replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderElection {
    /// Elect one leader to touch workloads (`--leader-elect`); off, this replica always leads.
    pub enabled: bool,
    /// The Lease in the pod's namespace (`--lease`).
    pub lease: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 8443)),
            admin_listen: SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 8080)),
            key: KeySource::Secret(DEFAULT_KEY_SECRET.to_owned()),
            certs: CertSource {
                cert: PathBuf::from(DEFAULT_TLS_CERT),
                key: PathBuf::from(DEFAULT_TLS_KEY),
                self_signed: None,
            },
            client_ca_file: None,
            max_connections: crate::serving::server::DEFAULT_MAX_CONNECTIONS,
            lookup_deadline: admission::DEFAULT_LOOKUP_DEADLINE,
            max_references: crate::core::names::DEFAULT_MAX_REFERENCES,
            max_reference_bytes: crate::core::names::DEFAULT_MAX_REFERENCE_BYTES,
            exclude_namespaces: Vec::new(),
            watch_namespaces: None,
            rules: crate::core::rules::Options::default(),
            watcher: WatcherSettings::default(),
            leader_election: LeaderElection {
                enabled: false,
                lease: crate::watcher::leader::DEFAULT_LEASE_NAME.to_owned(),
            },
            identity: None,
            kinds: crate::core::workload::Kinds::built_in(),
            cert_poll: CERT_POLL,
            header_read_timeout: HEADER_READ_TIMEOUT,
            drain_timeout: DRAIN_TIMEOUT,
            shutdown_delay: Duration::ZERO,
            dry_run: false,
        }
    }
}

/// The default of `--key-secret`.
pub const DEFAULT_KEY_SECRET: &str = "confighash-key";
/// The default of `--tls-cert`.
pub const DEFAULT_TLS_CERT: &str = "/var/run/confighash/tls.crt";
/// The default of `--tls-key`.
pub const DEFAULT_TLS_KEY: &str = "/var/run/confighash/tls.key";

impl Default for WatcherSettings {
    fn default() -> Self {
        let defaults = WatcherConfig::default();
        WatcherSettings {
            debounce: defaults.debounce,
            resync: defaults.resync,
            max_touches_per_second: defaults.max_touches_per_second,
            page_size: defaults.page_size,
            kind_recheck: defaults.kind_recheck,
            retry_base: defaults.retry_base,
            bypass_grace: defaults.bypass_grace,
            rollout_timeout: defaults.rollout_timeout,
            flap_threshold: defaults.flap_threshold,
            flap_period: defaults.flap_period,
            progressive_dependents: defaults.progressive_dependents,
            progressive_timeout: defaults.progressive_timeout,
            progressive_settle: defaults.progressive_settle,
        }
    }
}

impl SelfSigned {
    /// The default names (those of `deploy/`).
    pub fn defaults() -> Self {
        SelfSigned {
            secret: crate::certs::selfsigned::DEFAULT_SECRET_NAME.to_owned(),
            service: crate::certs::selfsigned::DEFAULT_SERVICE.to_owned(),
            webhook_configuration: crate::certs::selfsigned::DEFAULT_WEBHOOK_CONFIGURATION
                .to_owned(),
            extra_names: Vec::new(),
        }
    }
}

impl Config {
    /// Raises the soft open-file limit to the hard limit and logs it, then fits
    /// [`max_connections`](Config::max_connections) under it ([`fit_max_connections`]): lowered
    /// with a warning when it does not fit, an error when not even one webhook connection would.
    /// Where the limit cannot be read, it is taken as it is. Call it first, before anything
    /// opens files or connections.
    pub fn fit_open_files(&mut self) -> Result<(), RunError> {
        self.max_connections = size_connections(self.max_connections, AdminLimits::default())?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// The parts

/// `confighash serve` built from its [`Config`], not started yet: the key loaded (and watched
/// when it comes from a Secret), the certificates made (with `--self-signed-certs`) and loaded,
/// the webhook built, and leader election running when on. Dropping it stops what it started.
pub struct App {
    shared: Shared,
    certs: Arc<CertStore>,
    client_ca: Option<Arc<ClientCaStore>>,
    webhook: Arc<Webhook>,
    background: Tasks,
}

/// What [`App`] and [`Serving`] both hold and show (they dereference to it): the configuration,
/// the client, the pod's namespace, the key, the metrics and leader election.
pub struct Shared {
    config: Config,
    client: kube::Client,
    namespace: String,
    keys: Arc<KeyStore>,
    metrics: Arc<Metrics>,
    leadership: Leadership,
    leader: LeaderConfig,
}

impl Shared {
    /// The configuration, with the identity chosen.
    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The pod's namespace: the client's default namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn keys(&self) -> &Arc<KeyStore> {
        &self.keys
    }

    /// The webhook's and the watcher's metrics, served on the admin port.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn leadership(&self) -> &Leadership {
        &self.leadership
    }

    fn spawn_watcher(&self) -> JoinHandle<()> {
        spawn_watcher(
            &self.config,
            &self.namespace,
            &self.client,
            &self.keys,
            &self.leadership,
            &self.metrics,
        )
    }
}

impl std::ops::Deref for App {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.shared
    }
}

impl std::ops::Deref for Serving {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.shared
    }
}

impl App {
    /// Builds every part from `config`, with `cluster`'s client (whose default namespace is the
    /// pod's) and its getter for the webhook's lookups:
    /// loads the key, makes (with `--self-signed-certs`) and loads the certificates, builds the
    /// webhook, and starts leader election when it is on. Serves nothing yet: see
    /// [`App::start`].
    pub async fn from_config(mut config: Config, cluster: Cluster) -> Result<App, RunError> {
        let Cluster { client, getter } = cluster;
        let namespace = client.default_namespace().to_owned();
        if let Some(list) = &config.watch_namespaces
            && let Some(refused) = list
                .iter()
                .find(|n| *n == crate::core::names::KUBE_SYSTEM || **n == namespace)
        {
            return Err(RunError::WatchNamespace(refused.clone()));
        }
        let mut background = Tasks::default();
        let keys = match &config.key {
            KeySource::File(path) => crate::certs::key::from_file(path)?,
            KeySource::Secret(name) => {
                let keys = crate::certs::key::from_secret(client.clone(), &namespace, name).await?;
                background.push(tokio::spawn(crate::certs::key::watch_secret(
                    keys.clone(),
                    client.clone(),
                    namespace.clone(),
                    name.clone(),
                )));
                keys
            }
        };
        tracing::info!(key_id = keys.current().id(), "checksum key loaded");
        if config.dry_run {
            tracing::info!(
                "dry run: no workload is written; the webhook allows reviews without a patch and \
                 the watcher records WouldRoll Events instead of touching"
            );
        }
        if let Some(self_signed) = Self::self_signed_config(&config, &namespace) {
            crate::certs::selfsigned::ensure(&client, &self_signed).await?;
            background.push(tokio::spawn(crate::certs::selfsigned::run(
                client.clone(),
                self_signed,
            )));
        }
        let (certs, client_ca) = Self::certificates(&config)?;
        let metrics = Arc::new(Metrics::new());
        let webhook = Arc::new(Self::webhook(
            &config,
            &namespace,
            getter,
            keys.clone(),
            metrics.clone(),
        ));
        // One identity for the Lease and the Events.
        config
            .identity
            .get_or_insert_with(LeaderConfig::default_identity);
        let leader = Self::leader_config(&config, &namespace);
        leader
            .validate()
            .map_err(|e| RunError::Leader(e.to_string()))?;
        let leadership = if config.leader_election.enabled {
            let (leadership, task) = crate::watcher::leader::spawn(client.clone(), leader.clone());
            background.push(task);
            leadership
        } else {
            Leadership::always()
        };
        Ok(App {
            shared: Shared {
                config,
                client,
                namespace,
                keys,
                metrics,
                leadership,
                leader,
            },
            certs,
            client_ca,
            webhook,
            background,
        })
    }

    /// Starts the watcher and serves the webhook and the admin port.
    pub async fn start(self) -> Result<Serving, RunError> {
        self.start_parts(true).await
    }

    /// [`App::start`] without the watcher, for a harness that starts it later
    /// ([`Serving::start_watcher`]) or runs its own.
    pub async fn start_without_watcher(self) -> Result<Serving, RunError> {
        self.start_parts(false).await
    }

    /// Starts, serves until `shutdown` completes, then shuts down gracefully
    /// ([`Serving::shutdown`]). An error from `shutdown` is returned at once, without the graceful
    /// shutdown, as by a process that exits.
    pub async fn run_until(
        self,
        shutdown: impl Future<Output = Result<(), RunError>>,
    ) -> Result<(), RunError> {
        let serving = self.start().await?;
        shutdown.await?;
        serving.shutdown().await;
        Ok(())
    }

    async fn start_parts(self, watcher: bool) -> Result<Serving, RunError> {
        let App {
            shared,
            certs,
            client_ca,
            webhook,
            background,
        } = self;
        let mut tasks = Tasks::default();
        if watcher {
            tasks.push(shared.spawn_watcher());
        }
        let server = Self::start_server(&shared.config, certs, client_ca, webhook).await?;
        tracing::info!(webhook = %server.webhook_addr, admin = %server.admin_addr, "serving");
        Ok(Serving {
            shared,
            server,
            watcher: tasks,
            background,
        })
    }

    // ----- each part from the configuration -----

    /// The webhook's handler: lookups through `getter`, the lookup deadline, the rules, the
    /// reference bound, and `namespace` (the pod's) and `--exclude-namespaces` never read.
    pub fn webhook(
        config: &Config,
        namespace: &str,
        getter: Getter,
        keys: Arc<KeyStore>,
        metrics: Arc<Metrics>,
    ) -> Webhook {
        Webhook::new(
            Arc::new(crate::webhook::lookup::KubeSource::new(getter)),
            keys,
            metrics,
        )
        .with_lookup_deadline(config.lookup_deadline)
        .with_options(config.rules)
        .with_max_references(config.max_references)
        .with_max_reference_bytes(config.max_reference_bytes)
        .with_excluded_namespaces(excluded_namespaces(config, namespace))
        .with_watch_namespaces(config.watch_namespaces.clone())
        .with_dry_run(config.dry_run)
        .with_kinds(config.kinds.clone())
    }

    /// The watcher's configuration: its pace, the rules, the reference bound, this replica's
    /// identity, and `kube-system`, `namespace` (the pod's) and `--exclude-namespaces` never
    /// touched.
    pub fn watcher_config(config: &Config, namespace: &str) -> WatcherConfig {
        let watcher = &config.watcher;
        WatcherConfig {
            debounce: watcher.debounce,
            resync: watcher.resync,
            max_touches_per_second: watcher.max_touches_per_second,
            rules: config.rules,
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
            identity: identity(config),
            max_references: config.max_references,
            max_reference_bytes: config.max_reference_bytes,
            excluded_namespaces: excluded_namespaces(config, namespace)
                .chain([crate::core::names::KUBE_SYSTEM.to_owned()])
                .collect(),
            dry_run: config.dry_run,
            watch_namespaces: config.watch_namespaces.clone(),
            kinds: config.kinds.clone(),
        }
    }

    /// Leader election on the Lease `--lease` in `namespace` (the pod's), the default timings.
    pub fn leader_config(config: &Config, namespace: &str) -> LeaderConfig {
        LeaderConfig {
            lease_name: config.leader_election.lease.clone(),
            ..LeaderConfig::new(namespace, identity(config))
        }
    }

    /// With `--self-signed-certs`: the certificates kept in `namespace` (the pod's) under the
    /// configured names, written to the certificate files.
    pub fn self_signed_config(config: &Config, namespace: &str) -> Option<SelfSignedConfig> {
        let names = config.certs.self_signed.as_ref()?;
        Some(SelfSignedConfig {
            secret_name: names.secret.clone(),
            service: names.service.clone(),
            webhook_configuration: names.webhook_configuration.clone(),
            extra_names: names.extra_names.clone(),
            ..SelfSignedConfig::new(
                namespace,
                config.certs.cert.clone(),
                config.certs.key.clone(),
            )
        })
    }

    /// The serving pair and, with a client CA file, the client CA, loaded from their files.
    pub fn certificates(
        config: &Config,
    ) -> Result<(Arc<CertStore>, Option<Arc<ClientCaStore>>), RunError> {
        let certs = CertStore::load(&config.certs.cert, &config.certs.key)?;
        let client_ca = match &config.client_ca_file {
            Some(path) => {
                let ca = ClientCaStore::load(path)?;
                tracing::info!(path = %path.display(), certificates = ca.certificates(), "client certificates required, signed by this CA");
                Some(ca)
            }
            None => None,
        };
        Ok((certs, client_ca))
    }

    /// The bounds of the two ports: `--max-connections`, and a request timeout the lookup
    /// deadline fits in.
    pub fn limits(config: &Config) -> WebhookLimits {
        let defaults = WebhookLimits::default();
        WebhookLimits {
            connections: ConnectionLimits {
                max_connections: config.max_connections,
                // The lookups must fit, with time to spare for the body.
                request_timeout: REQUEST_TIMEOUT.max(config.lookup_deadline + REQUEST_SLACK),
                ..defaults.connections
            },
            ..defaults
        }
    }

    /// What the server of `webhook` needs, on the configured addresses and timings.
    pub fn serve_config(
        config: &Config,
        certs: Arc<CertStore>,
        client_ca: Option<Arc<ClientCaStore>>,
        webhook: Arc<Webhook>,
    ) -> WebhookServeConfig {
        WebhookServeConfig {
            listen: config.listen,
            admin_listen: config.admin_listen,
            certs,
            client_ca,
            webhook,
            health: Arc::new(Health::default()),
            cert_poll: config.cert_poll,
            header_read_timeout: config.header_read_timeout,
            drain_timeout: config.drain_timeout,
        }
    }

    /// Binds the webhook and admin ports and serves `webhook` within [`App::limits`].
    pub async fn start_server(
        config: &Config,
        certs: Arc<CertStore>,
        client_ca: Option<Arc<ClientCaStore>>,
        webhook: Arc<Webhook>,
    ) -> Result<RunningWebhook, RunError> {
        Ok(start_with(
            Self::serve_config(config, certs, client_ca, webhook),
            Self::limits(config),
        )
        .await?)
    }
}

/// The watcher of `config`, on its own task.
fn spawn_watcher(
    config: &Config,
    namespace: &str,
    client: &kube::Client,
    keys: &Arc<KeyStore>,
    leadership: &Leadership,
    metrics: &Arc<Metrics>,
) -> JoinHandle<()> {
    tokio::spawn(crate::watcher::run(
        client.clone(),
        keys.clone(),
        leadership.clone(),
        metrics.clone(),
        App::watcher_config(config, namespace),
    ))
}

/// The pod's namespace, then `--exclude-namespaces`.
fn excluded_namespaces<'a>(
    config: &'a Config,
    namespace: &str,
) -> impl Iterator<Item = String> + 'a {
    std::iter::once(namespace.to_owned()).chain(config.exclude_namespaces.iter().cloned())
}

fn identity(config: &Config) -> String {
    config
        .identity
        .clone()
        .unwrap_or_else(LeaderConfig::default_identity)
}

// ---------------------------------------------------------------------------------------------
// Running

/// `confighash serve` running: what [`App::start`] returns. Dropping it stops the watcher and
/// the background tasks (the key watch, the certificate upkeep, leader election) but not the
/// server: see [`Serving::shutdown`].
pub struct Serving {
    shared: Shared,
    server: RunningWebhook,
    watcher: Tasks,
    background: Tasks,
}

/// The tasks of a [`Serving`], for a harness that stops and restarts them one by one.
pub struct Parts {
    /// The webhook and admin ports.
    pub server: RunningWebhook,
    /// The watcher, unless started [without it](App::start_without_watcher).
    pub watcher: Option<JoinHandle<()>>,
    /// The key watch, the certificate upkeep and leader election, as configured: abort them to
    /// stop them.
    pub background: Vec<JoinHandle<()>>,
}

impl Serving {
    pub fn webhook_addr(&self) -> SocketAddr {
        self.server.webhook_addr
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.server.admin_addr
    }

    /// The webhook and admin ports.
    pub fn server(&self) -> &RunningWebhook {
        &self.server
    }

    /// Starts the watcher, unless it runs already.
    pub fn start_watcher(&mut self) {
        if self.watcher.0.is_empty() {
            let task = self.shared.spawn_watcher();
            self.watcher.push(task);
        }
    }

    /// Stops the watcher (the webhook keeps serving).
    #[cfg(feature = "testkit")]
    pub fn stop_watcher(&mut self) {
        self.watcher.abort_all();
    }

    /// Stops the watcher and the background tasks, releases the Lease when this replica leads
    /// (so that another takes over at once instead of when it expires), and stops the server
    /// gracefully ([`RunningWebhook::shutdown`]).
    pub async fn shutdown(self) {
        let Serving {
            shared:
                Shared {
                    config,
                    client,
                    leadership,
                    leader,
                    ..
                },
            server,
            mut watcher,
            mut background,
        } = self;
        if !config.shutdown_delay.is_zero() {
            // Not ready from now on, and serving as usual until the cluster has stopped sending
            // new connections here.
            server.health.set_shutting_down();
            tracing::info!(delay = ?config.shutdown_delay, "not ready; serving on until the endpoint is removed");
            tokio::time::sleep(config.shutdown_delay).await;
        }
        watcher.abort_all();
        background.abort_all();
        if leadership.is_leader() && config.leader_election.enabled {
            // Hand over at once instead of letting the lease run out.
            match crate::watcher::leader::release(client, &leader).await {
                Ok(_) => {}
                // An uninstall removes the Role (and with kubectl, the namespace) before the
                // pods stop: nothing is wrong, the Lease runs out.
                Err(crate::watcher::leader::ReleaseError(kube::Error::Api(status)))
                    if status.code == 403 || status.code == 404 =>
                {
                    tracing::info!(
                        code = status.code,
                        "the leader lease could not be released (its Role or namespace is gone, as in an uninstall); it will expire"
                    );
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not release the leader lease; it will expire");
                }
            }
        }
        server.shutdown().await;
        tracing::info!("stopped");
    }

    /// The running tasks, which the caller stops from now on.
    #[cfg(feature = "testkit")]
    pub fn into_parts(self) -> Parts {
        let Serving {
            server,
            mut watcher,
            mut background,
            ..
        } = self;
        Parts {
            server,
            watcher: watcher.0.pop(),
            background: std::mem::take(&mut background.0),
        }
    }
}

/// Tasks aborted when dropped.
#[derive(Default)]
struct Tasks(Vec<JoinHandle<()>>);

impl Tasks {
    fn push(&mut self, task: JoinHandle<()>) {
        self.0.push(task);
    }

    fn abort_all(&mut self) {
        for task in self.0.drain(..) {
            task.abort();
        }
    }
}

impl Drop for Tasks {
    fn drop(&mut self) {
        self.abort_all();
    }
}

/// SIGTERM or SIGINT, logged; listens from when it is first polled.
pub async fn shutdown_signal() -> Result<(), RunError> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(RunError::Signal)?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
    }
    Ok(())
}

/// Raises the soft open-file limit to the hard limit and logs it, then fits `--max-connections`
/// under it ([`fit_max_connections`]): lowered with a warning when it does not fit, an error when
/// not even one webhook connection would. Where the limit cannot be read, the flag is taken as
/// it is.
fn size_connections(requested: usize, admin: AdminLimits) -> Result<usize, RunError> {
    let limit = match raise_open_file_limit() {
        Ok(limit) => {
            if limit.soft > limit.before {
                tracing::info!(
                    soft = limit.soft,
                    hard = limit.hard,
                    before = limit.before,
                    "raised the open-file limit to the hard limit"
                );
            } else {
                tracing::info!(soft = limit.soft, hard = limit.hard, "open-file limit");
            }
            Some(limit.soft)
        }
        Err(e) => {
            let soft = open_file_limit().ok().map(|(soft, _)| soft);
            tracing::warn!(error = %e, ?soft, "cannot raise the open-file limit");
            soft
        }
    };
    let Some(limit) = limit else {
        return Ok(requested);
    };
    match fit_max_connections(requested, admin.max_connections, limit)? {
        Fit::Fits(n) => Ok(n),
        Fit::Lowered { requested, to } => {
            tracing::warn!(
                requested,
                max_connections = to,
                open_file_limit = limit,
                admin_connections = admin.max_connections,
                reserved = RESERVED_FILES,
                "--max-connections does not fit under the open-file limit; lowered"
            );
            Ok(to)
        }
    }
}

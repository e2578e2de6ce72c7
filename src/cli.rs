//! The command line: flags (each also read from `CONFIGHASH_<FLAG>`) and the `stamp` command's
//! input handling.

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::app::{CertSource, Config, KeySource, LeaderElection, SelfSigned, WatcherSettings};
use crate::core::checksum::{KeyError, StampKey};
use crate::core::workload::{KindError, Kinds, WorkloadKind};
use crate::offline::{self, InputError, Output, Source};

#[derive(Debug, Parser)]
#[command(
    name = "confighash",
    version,
    about = "Roll Kubernetes workloads when their ConfigMaps and Secrets change"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// One value per process, read once at start: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Stamp the workloads of Kubernetes YAML offline, resolving references within the input.
    Stamp(StampArgs),
    /// Serve the mutating admission webhook and the watcher, with an admin port.
    Serve(ServeArgs),
    /// Write a local CA and a serving certificate for the webhook's Service (for local runs and
    /// clusters without cert-manager).
    Certs(CertsArgs),
    /// Explain a workload's stamp in the live cluster (or list every workload's verdict): opt-in,
    /// webhook selection, references, expected stamp, verdict, Events and rollout state.
    Explain(ExplainArgs),
    /// Which workloads a change to rendered manifests will roll: the base and head revisions,
    /// each as `helm template` or `kustomize build` prints it. Exit 0 when no existing workload
    /// rolls, 1 when one does, 2 on errors.
    Diff(DiffArgs),
}

/// `--workload-kind`, on every command that reads workloads.
#[derive(Debug, Clone, Default, Args)]
pub struct KindArgs {
    /// One more kind of workload whose objects carry a pod template, and where:
    /// GROUP/VERSION/KIND=POINTER, POINTER a JSON pointer to the pod template (as
    /// apps.kruise.io/v1alpha1/CloneSet=/spec/template). Stamped, watched and explained as the
    /// built-in kinds (Deployment, StatefulSet, DaemonSet, CronJob, Argo Rollout), with the same
    /// recipe. Repeatable; comma separated in the environment.
    #[arg(
        long = "workload-kind",
        env = "CONFIGHASH_WORKLOAD_KIND",
        value_name = "GROUP/VERSION/KIND=POINTER",
        value_delimiter = ',',
        value_parser = parse_workload_kind
    )]
    pub workload_kinds: Vec<WorkloadKind>,
}

/// A `--workload-kind` set that cannot be used together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--workload-kind: {0}")]
pub struct KindsError(#[source] pub KindError);

impl KindArgs {
    /// The built-in kinds and those of the flags.
    pub fn kinds(&self) -> Result<Kinds, KindsError> {
        Kinds::with_configured(self.workload_kinds.iter().copied()).map_err(KindsError)
    }
}

fn parse_workload_kind(s: &str) -> Result<WorkloadKind, String> {
    WorkloadKind::parse(s).map_err(|e| e.to_string())
}

#[derive(Debug, Clone, Args)]
pub struct ExplainArgs {
    /// The workload: KIND/NAME, KIND one of deploy, sts, ds, cj, rollout (or kubectl's long
    /// names). Without it, every workload of the namespace is listed.
    #[arg(value_name = "KIND/NAME", value_parser = crate::explain::parse_workload)]
    pub workload: Option<crate::explain::WorkloadArg>,
    /// The namespace (default: the kubeconfig context's).
    #[arg(short = 'n', long, value_name = "NS", value_parser = parse_namespace)]
    pub namespace: Option<String>,
    /// List every workload of every opted-in namespace.
    #[arg(short = 'A', long, conflicts_with_all = ["namespace", "workload"])]
    pub all_namespaces: bool,
    /// Output format: text, or one JSON document.
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    pub output: crate::explain::Format,
    /// The kubeconfig file (default: KUBECONFIG, then ~/.kube/config, then the in-cluster
    /// config).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: its current context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// The namespace confighash is installed in: where its key Secret is.
    #[arg(
        long,
        env = "CONFIGHASH_INSTALL_NAMESPACE",
        value_name = "NS",
        default_value = "confighash",
        value_parser = parse_namespace
    )]
    pub install_namespace: String,
    /// The key Secret in --install-namespace (data key `key`); reading it needs get access.
    #[arg(
        long,
        env = "CONFIGHASH_KEY_SECRET",
        value_name = "NAME",
        default_value = crate::app::DEFAULT_KEY_SECRET,
        value_parser = parse_object_name
    )]
    pub key_secret: String,
    /// The installation's key from a file instead (its bytes exactly, as `serve --key-file`).
    #[arg(
        long,
        env = "CONFIGHASH_KEY_FILE",
        value_name = "FILE",
        conflicts_with = "key_secret"
    )]
    pub key_file: Option<PathBuf>,
    /// The MutatingWebhookConfiguration confighash is installed with (as `serve` names it).
    #[arg(
        long,
        env = "CONFIGHASH_WEBHOOK_CONFIGURATION",
        value_name = "NAME",
        default_value = crate::certs::selfsigned::DEFAULT_WEBHOOK_CONFIGURATION,
        value_parser = parse_object_name
    )]
    pub webhook_configuration: String,
    #[command(flatten)]
    pub kinds: KindArgs,
}

impl ExplainArgs {
    /// What `confighash explain` runs with (the kubeconfig flags are for the client); why not,
    /// when the workload's kind or `--workload-kind` is wrong.
    pub fn to_request(&self) -> Result<crate::explain::Request, String> {
        use crate::explain::{KeyChoice, Request, Target};
        let kinds = self.kinds.kinds().map_err(|e| e.to_string())?;
        let target = match (&self.workload, self.all_namespaces) {
            (_, true) => Target::AllNamespaces,
            (Some(w), false) => Target::Workload {
                kind: crate::explain::resolve_kind(&kinds, w)?,
                name: w.name.clone(),
                namespace: self.namespace.clone(),
            },
            (None, false) => Target::Namespace(self.namespace.clone()),
        };
        Ok(Request {
            target,
            format: self.output,
            install_namespace: self.install_namespace.clone(),
            key: match &self.key_file {
                Some(path) => KeyChoice::File(path.clone()),
                None => KeyChoice::Secret(self.key_secret.clone()),
            },
            webhook_configuration: self.webhook_configuration.clone(),
            kinds,
        })
    }
}

#[derive(Debug, Args)]
pub struct CertsArgs {
    /// Directory to write ca.crt, ca.key, tls.crt and tls.key to (existing files are refused).
    #[arg(
        long,
        env = "CONFIGHASH_DIR",
        value_name = "DIR",
        default_value = "certs/local"
    )]
    pub dir: PathBuf,
    /// The webhook's Service name.
    #[arg(long, env = "CONFIGHASH_SERVICE", default_value = "confighash")]
    pub service: String,
    /// The Service's namespace.
    #[arg(long, env = "CONFIGHASH_NAMESPACE", default_value = "confighash")]
    pub namespace: String,
    /// Another DNS name or IP address for the certificate (repeatable), e.g. 127.0.0.1.
    #[arg(
        long = "name",
        env = "CONFIGHASH_NAME",
        value_name = "NAME",
        value_delimiter = ','
    )]
    pub names: Vec<String>,
}

/// Runs `confighash certs`: the paths written.
pub fn certs(args: &CertsArgs) -> Result<Vec<PathBuf>, crate::certs::certificates::CertsError> {
    let mut names = crate::certs::certificates::service_names(&args.service, &args.namespace);
    names.extend(args.names.iter().cloned());
    let generated = crate::certs::certificates::generate(&names, 3650, 365)?;
    crate::certs::certificates::write(&args.dir, &generated)
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address of the webhook (HTTPS). `[::]` listens on IPv6 and IPv4 alike, and on IPv4 alone
    /// (`0.0.0.0`, same port) where the host has no IPv6; any other address is used as it is.
    #[arg(long, env = "CONFIGHASH_LISTEN", default_value = "[::]:8443")]
    pub listen: SocketAddr,
    /// Address of the admin port (plain HTTP: /livez, /readyz, /metrics); `[::]` as for
    /// --listen.
    #[arg(long, env = "CONFIGHASH_ADMIN_LISTEN", default_value = "[::]:8080")]
    pub admin_listen: SocketAddr,
    /// Serving certificate (PEM), re-read when it changes (with --self-signed-certs, written
    /// there).
    #[arg(
        long,
        env = "CONFIGHASH_TLS_CERT",
        value_name = "FILE",
        default_value = crate::app::DEFAULT_TLS_CERT
    )]
    pub tls_cert: PathBuf,
    /// Serving certificate's private key (PEM), re-read when it changes (with
    /// --self-signed-certs, written there).
    #[arg(
        long,
        env = "CONFIGHASH_TLS_KEY",
        value_name = "FILE",
        default_value = crate::app::DEFAULT_TLS_KEY
    )]
    pub tls_key: PathBuf,
    /// Make and keep a CA and serving certificate in the Secret --certs-secret, shared by all
    /// replicas, and keep the caBundle of the MutatingWebhookConfiguration
    /// --webhook-configuration current (for the Service --service in the pod's namespace).
    #[arg(long, env = "CONFIGHASH_SELF_SIGNED_CERTS")]
    pub self_signed_certs: bool,
    /// With --self-signed-certs, one more name the serving certificate carries besides the
    /// Service's: a DNS name, or an IP address (an IP SAN), for an API server that calls the
    /// webhook at a URL (the chart's `webhook.url`). Repeatable; comma separated in the
    /// environment.
    #[arg(
        long = "self-signed-name",
        env = "CONFIGHASH_SELF_SIGNED_NAME",
        value_name = "NAME",
        value_delimiter = ',',
        requires = "self_signed_certs",
        value_parser = parse_certificate_name
    )]
    pub self_signed_names: Vec<String>,
    /// HMAC key file: its bytes exactly as they are (at least 16).
    #[arg(
        long,
        env = "CONFIGHASH_KEY_FILE",
        value_name = "FILE",
        conflicts_with = "key_secret"
    )]
    pub key_file: Option<PathBuf>,
    /// Secret in the pod's namespace whose data key `key` is the HMAC key; created with 32 random
    /// bytes when absent, and reloaded when it changes.
    #[arg(
        long,
        env = "CONFIGHASH_KEY_SECRET",
        value_name = "NAME",
        default_value = crate::app::DEFAULT_KEY_SECRET
    )]
    pub key_secret: String,
    /// Webhook connections served at once; at the limit new connections wait until one closes.
    /// Lowered at start, with a warning, when it does not fit under the open-file limit (raised
    /// to the hard limit first) with the admin port's 64 connections and 256 files kept aside.
    /// With --client-ca-file, half of it is reserved for clients with a valid certificate.
    #[arg(long, env = "CONFIGHASH_MAX_CONNECTIONS", value_name = "N", default_value_t = crate::serving::server::DEFAULT_MAX_CONNECTIONS, value_parser = parse_max_connections)]
    pub max_connections: usize,
    /// Require of the webhook's clients a certificate signed by this CA (PEM; several
    /// certificates are all trusted), re-read when it changes. Clients with one get connection
    /// slots of their own that others cannot take.
    #[arg(long, env = "CONFIGHASH_CLIENT_CA_FILE", value_name = "FILE")]
    pub client_ca_file: Option<PathBuf>,
    /// One deadline for all lookups of a review, well below the webhook's timeoutSeconds.
    #[arg(long, env = "CONFIGHASH_LOOKUP_DEADLINE", value_name = "DUR", default_value = "2s", value_parser = parse_duration)]
    pub lookup_deadline: Duration,
    /// Distinct ConfigMaps and Secrets a workload may reference. Over it nothing is read and the
    /// workload is marked `confighash.dev/unstamped: too-many-references` (never retried).
    #[arg(long, env = "CONFIGHASH_MAX_REFERENCES", value_name = "N", default_value_t = crate::core::names::DEFAULT_MAX_REFERENCES, value_parser = parse_max_references)]
    pub max_references: usize,
    /// The decoded bytes of ConfigMap and Secret values the recipe may read for one workload
    /// (a number of bytes, or with Ki, Mi or Gi). Over it the webhook stops reading, keeps the
    /// stamp (a new workload is marked `confighash.dev/unstamped: too-large`, which reconcile
    /// retries) and the watcher does not roll it.
    #[arg(long, env = "CONFIGHASH_MAX_REFERENCE_BYTES", value_name = "SIZE", default_value = "16Mi", value_parser = parse_size)]
    pub max_reference_bytes: u64,
    /// Namespaces whose objects the webhook never reads and the watcher never touches, besides
    /// `kube-system` and confighash's own (comma separated; the webhook configuration should
    /// exclude them too).
    #[arg(
        long,
        env = "CONFIGHASH_EXCLUDE_NAMESPACES",
        value_name = "NS,...",
        value_delimiter = ',',
        value_parser = parse_namespace
    )]
    pub exclude_namespaces: Vec<String>,
    /// Least-privilege mode: the only namespaces whose ConfigMaps, Secrets and workloads are
    /// read, stamped or touched (comma separated), each watched on its own, so Roles in them
    /// are all the RBAC needed. Inside the list the opt-in labels keep their meaning. Neither
    /// `kube-system` nor confighash's own namespace may be listed. Without it: the whole cluster.
    #[arg(
        long,
        env = "CONFIGHASH_WATCH_NAMESPACES",
        value_name = "NS,...",
        value_delimiter = ',',
        num_args = 1..,
        value_parser = parse_namespace
    )]
    pub watch_namespaces: Option<Vec<String>>,
    /// The change window: the first content change of a referenced object opens it, and when it
    /// closes every change seen in it is handled; also the minimum interval between two touches
    /// of one workload.
    #[arg(long, env = "CONFIGHASH_DEBOUNCE", value_name = "DUR", default_value = "5s", value_parser = parse_duration)]
    pub debounce: Duration,
    /// How often every workload's stamp is compared with its expected stamp.
    #[arg(long, env = "CONFIGHASH_RESYNC", value_name = "DUR", default_value = "10m", value_parser = parse_duration)]
    pub resync: Duration,
    /// Cluster-wide bound on workload touches (burst 20).
    #[arg(long, env = "CONFIGHASH_MAX_TOUCHES_PER_SECOND", value_name = "N", default_value = "5", value_parser = parse_rate)]
    pub max_touches_per_second: f64,
    /// How long a StatefulSet's or DaemonSet's rollout after a config change may take before a
    /// Warning Event `RolloutStalled` says so (Deployments and Argo Rollouts are judged by their
    /// own progress deadline).
    #[arg(long, env = "CONFIGHASH_ROLLOUT_TIMEOUT", value_name = "DUR", default_value = "10m", value_parser = parse_duration)]
    pub rollout_timeout: Duration,
    /// The flap guard: a ConfigMap or Secret whose change windows open more than N times within
    /// `--flap-period` rolls its dependents at most once per interval (1 minute, doubling up to
    /// 15), always to its latest content, until a whole interval passes with no change.
    #[arg(long, env = "CONFIGHASH_FLAP_THRESHOLD", value_name = "N", default_value_t = crate::watcher::state::DEFAULT_FLAP_THRESHOLD, value_parser = parse_flap_threshold)]
    pub flap_threshold: u32,
    /// The period over which `--flap-threshold` counts an object's change windows.
    #[arg(long, env = "CONFIGHASH_FLAP_PERIOD", value_name = "DUR", default_value = "10m", value_parser = parse_duration)]
    pub flap_period: Duration,
    /// Progressive waves for every ConfigMap or Secret with more than N dependents, as if it
    /// were annotated `confighash.dev/rollout: progressive` (off by default: only annotated
    /// objects).
    #[arg(long, env = "CONFIGHASH_PROGRESSIVE_DEPENDENTS", value_name = "N")]
    pub progressive_dependents: Option<usize>,
    /// How long a workload of a progressive wave may take to finish its rollout healthy (new
    /// pods Ready, none restarted) before the wave halts.
    #[arg(long, env = "CONFIGHASH_PROGRESSIVE_TIMEOUT", value_name = "DUR", default_value = "5m", value_parser = parse_duration)]
    pub progressive_timeout: Duration,
    /// How long a workload's new pods must stay Ready, none restarted, after its rollout
    /// completed before a progressive wave goes on (a container that crashes on its config a
    /// moment after it starts can look Ready for that moment).
    #[arg(long, env = "CONFIGHASH_PROGRESSIVE_SETTLE", value_name = "DUR", default_value = "10s", value_parser = parse_duration)]
    pub progressive_settle: Duration,
    /// Roll workloads when a required ConfigMap or Secret is deleted (by default the stamp is
    /// kept: new pods could not start anyway).
    #[arg(long, env = "CONFIGHASH_ROLL_ON_DELETE")]
    pub roll_on_delete: bool,
    /// Stamp workloads that predate confighash at reconcile (each rolls once).
    #[arg(long, env = "CONFIGHASH_STAMP_EXISTING")]
    pub stamp_existing: bool,
    /// Elect one leader among replicas to touch workloads (default: true in a cluster, false
    /// outside).
    #[arg(long, env = "CONFIGHASH_LEADER_ELECT", value_name = "BOOL", action = clap::ArgAction::Set)]
    pub leader_elect: Option<bool>,
    /// Log format.
    #[arg(
        long,
        env = "CONFIGHASH_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
    /// Log level or filter (`info`, `debug`, `confighash=debug,kube=warn`).
    #[arg(
        long,
        env = "CONFIGHASH_LOG_LEVEL",
        value_name = "LEVEL",
        default_value = "info"
    )]
    pub log_level: String,
    /// The MutatingWebhookConfiguration whose caBundle --self-signed-certs keeps current.
    #[arg(
        long,
        env = "CONFIGHASH_WEBHOOK_CONFIGURATION",
        value_name = "NAME",
        default_value = crate::certs::selfsigned::DEFAULT_WEBHOOK_CONFIGURATION,
        value_parser = parse_object_name
    )]
    pub webhook_configuration: String,
    /// The webhook's Service in the pod's namespace, whose DNS names the certificate
    /// --self-signed-certs makes carries.
    #[arg(
        long,
        env = "CONFIGHASH_SERVICE",
        value_name = "NAME",
        default_value = crate::certs::selfsigned::DEFAULT_SERVICE,
        value_parser = parse_object_name
    )]
    pub service: String,
    /// The Secret in the pod's namespace where --self-signed-certs keeps its CA and serving
    /// pair (created when absent).
    #[arg(
        long,
        env = "CONFIGHASH_CERTS_SECRET",
        value_name = "NAME",
        default_value = crate::certs::selfsigned::DEFAULT_SECRET_NAME,
        value_parser = parse_object_name
    )]
    pub certs_secret: String,
    /// The Lease in the pod's namespace that elects the leader (created when absent).
    #[arg(
        long,
        env = "CONFIGHASH_LEASE",
        value_name = "NAME",
        default_value = crate::watcher::leader::DEFAULT_LEASE_NAME,
        value_parser = parse_object_name
    )]
    pub lease: String,
    /// Write no workload: the webhook allows every review without a patch (counted in
    /// confighash_webhook_dry_run_total) and the watcher records a WouldRoll Event where it would
    /// touch. Leader election, the key and certificates, and Events work as usual.
    #[arg(long, env = "CONFIGHASH_DRY_RUN")]
    pub dry_run: bool,
    #[command(flatten)]
    pub kinds: KindArgs,
}

impl ServeArgs {
    /// What `confighash serve` runs with. `--leader-elect` unset means on in a cluster
    /// (`KUBERNETES_SERVICE_HOST` set), off outside; the log flags are `main`'s.
    pub fn to_config(&self) -> Result<Config, KindsError> {
        let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
        Ok(Config {
            listen: self.listen,
            admin_listen: self.admin_listen,
            key: match &self.key_file {
                Some(path) => KeySource::File(path.clone()),
                None => KeySource::Secret(self.key_secret.clone()),
            },
            certs: CertSource {
                cert: self.tls_cert.clone(),
                key: self.tls_key.clone(),
                self_signed: self.self_signed_certs.then(|| SelfSigned {
                    secret: self.certs_secret.clone(),
                    service: self.service.clone(),
                    webhook_configuration: self.webhook_configuration.clone(),
                    extra_names: self.self_signed_names.clone(),
                }),
            },
            client_ca_file: self.client_ca_file.clone(),
            max_connections: self.max_connections,
            lookup_deadline: self.lookup_deadline,
            max_references: self.max_references,
            max_reference_bytes: self.max_reference_bytes,
            exclude_namespaces: self.exclude_namespaces.clone(),
            watch_namespaces: self
                .watch_namespaces
                .as_ref()
                .map(|list| list.iter().cloned().collect()),
            rules: crate::core::rules::Options {
                roll_on_delete: self.roll_on_delete,
                stamp_existing: self.stamp_existing,
            },
            watcher: WatcherSettings {
                debounce: self.debounce,
                resync: self.resync,
                max_touches_per_second: self.max_touches_per_second,
                rollout_timeout: self.rollout_timeout,
                flap_threshold: self.flap_threshold,
                flap_period: self.flap_period,
                progressive_dependents: self.progressive_dependents,
                progressive_timeout: self.progressive_timeout,
                progressive_settle: self.progressive_settle,
                ..WatcherSettings::default()
            },
            leader_election: LeaderElection {
                enabled: self.leader_elect.unwrap_or(in_cluster),
                lease: self.lease.clone(),
            },
            dry_run: self.dry_run,
            shutdown_delay: if in_cluster {
                crate::app::SHUTDOWN_DELAY
            } else {
                Duration::ZERO
            },
            kinds: self.kinds.kinds()?,
            ..Config::default()
        })
    }
}

impl TryFrom<ServeArgs> for Config {
    type Error = KindsError;

    fn try_from(args: ServeArgs) -> Result<Self, Self::Error> {
        args.to_config()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(n) if n.is_finite() && n > 0.0 => Ok(n),
        _ => Err(format!("{s:?} is not a positive number")),
    }
}

fn parse_max_connections(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=1_000_000).contains(&n) => Ok(n),
        _ => Err(format!("{s:?} is not a number from 1 to 1000000")),
    }
}

fn parse_flap_threshold(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if (1..=10_000).contains(&n) => Ok(n),
        _ => Err(format!("{s:?} is not a number from 1 to 10000")),
    }
}

fn parse_max_references(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=100_000).contains(&n) => Ok(n),
        _ => Err(format!("{s:?} is not a number from 1 to 100000")),
    }
}

/// A size in bytes: a number, or a number followed by `Ki`, `Mi` or `Gi`; from 1 byte to 4Gi.
fn parse_size(s: &str) -> Result<u64, String> {
    let err =
        || format!("{s:?} is not a size from 1 to 4Gi (bytes, or a number with Ki, Mi or Gi)");
    let (number, shift) = match s.len().checked_sub(2).map(|i| s.split_at(i)) {
        Some((n, "Ki")) => (n, 10),
        Some((n, "Mi")) => (n, 20),
        Some((n, "Gi")) => (n, 30),
        _ => (s, 0),
    };
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err());
    }
    match number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_shl(shift).filter(|v| v >> shift == n))
    {
        Some(n) if (1..=4 << 30).contains(&n) => Ok(n),
        _ => Err(err()),
    }
}

fn parse_namespace(s: &str) -> Result<String, String> {
    let s = s.trim();
    if crate::core::refs::is_namespace_name(s) {
        Ok(s.to_owned())
    } else {
        Err(format!("{s:?} is not a namespace name (a DNS-1123 label)"))
    }
}

/// A name for the self-signed serving certificate: an IP address, or a DNS name (lowercase
/// RFC 1123 labels, a leading `*.` allowed, at most 253 characters).
fn parse_certificate_name(s: &str) -> Result<String, String> {
    let s = s.trim();
    if s.parse::<std::net::IpAddr>().is_ok() {
        return Ok(s.to_owned());
    }
    let host = s.strip_prefix("*.").unwrap_or(s);
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if !host.is_empty() && s.len() <= 253 && host.split('.').all(label_ok) {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "{s:?} is neither an IP address nor a DNS name (lowercase labels of letters, digits and '-')"
        ))
    }
}

/// The name of an object confighash writes: a DNS-1123 subdomain, which every kind it writes
/// (Secret, Lease, Service, MutatingWebhookConfiguration) accepts.
fn parse_object_name(s: &str) -> Result<String, String> {
    if crate::core::refs::is_object_name(s) {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "{s:?} is not an object name (lowercase letters, digits, '-' and '.', starting and \
             ending with a letter or digit, at most 253 characters)"
        ))
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration such as 2s or 500ms: {e}"))?;
    if d.is_zero() {
        return Err("the duration must be more than zero".into());
    }
    Ok(d)
}

#[derive(Debug, Args)]
pub struct StampArgs {
    /// A YAML file, a directory of them (.yaml, .yml, .json) or `-` for standard input;
    /// repeatable, or comma separated.
    #[arg(
        short = 'f',
        long = "filename",
        env = "CONFIGHASH_FILENAME",
        value_delimiter = ',',
        value_name = "PATH",
        required = true
    )]
    pub files: Vec<PathBuf>,
    /// The namespace of documents that name none. The namespace enters every stamp, so a
    /// ConfigMap, Secret or workload with no metadata.namespace is an error without it.
    #[arg(long, env = "CONFIGHASH_STAMP_NAMESPACE")]
    pub namespace: Option<String>,
    /// HMAC key file: its bytes exactly as they are (at least 16). Without it stamps are plain.
    #[arg(long, env = "CONFIGHASH_KEY_FILE")]
    pub key_file: Option<PathBuf>,
    /// Print each workload's references, whether they were found, and its stamp, instead of
    /// the documents.
    #[arg(long, env = "CONFIGHASH_EXPLAIN")]
    pub explain: bool,
    #[command(flatten)]
    pub kinds: KindArgs,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The manifests before the change: a YAML file, a directory of them, or `-` (standard
    /// input, for one side only).
    #[arg(long, value_name = "PATH")]
    pub base: PathBuf,
    /// The manifests after the change, as `--base`.
    #[arg(long, value_name = "PATH")]
    pub head: PathBuf,
    /// The namespace of documents that name none (it enters every stamp).
    #[arg(long, env = "CONFIGHASH_DIFF_NAMESPACE")]
    pub namespace: Option<String>,
    /// How to print the report: text, json, or markdown (for a pull-request comment).
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    pub output: DiffFormat,
    #[command(flatten)]
    pub kinds: KindArgs,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum DiffFormat {
    Text,
    Json,
    Markdown,
}

/// Runs `confighash diff`; `stdin` is read when a side is `-`.
pub fn diff(args: &DiffArgs, stdin: impl Read) -> Result<offline::diff::Report, StampError> {
    if args.base.as_os_str() == "-" && args.head.as_os_str() == "-" {
        return Err(StampError::StdinTwice);
    }
    let mut stdin = Some(stdin);
    let mut side = |path: &PathBuf| -> Result<Vec<Source>, StampError> {
        if path.as_os_str() == "-" {
            let input = stdin.take().ok_or(StampError::StdinTwice)?;
            read_sources(std::slice::from_ref(path), input)
        } else {
            read_sources(std::slice::from_ref(path), std::io::empty())
        }
    };
    let base = side(&args.base)?;
    let head = side(&args.head)?;
    let options = offline::Options {
        namespace: args.namespace.clone(),
        key: None,
        explain: false,
        kinds: args.kinds.kinds()?,
    };
    Ok(offline::diff::diff(&base, &head, &options)?)
}

/// Why `stamp` stopped.
#[derive(Debug, thiserror::Error)]
pub enum StampError {
    #[error("{path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not UTF-8 text")]
    NotText { path: String },
    #[error("{path}: no .yaml, .yml or .json files in this directory")]
    EmptyDir { path: String },
    #[error("standard input (-) given more than once")]
    StdinTwice,
    #[error("{path}: {source}")]
    Key {
        path: String,
        #[source]
        source: KeyError,
    },
    #[error(transparent)]
    Input(#[from] InputError),
    #[error(transparent)]
    Kinds(#[from] KindsError),
}

/// Runs `confighash stamp`; `stdin` is read when a path is `-`.
pub fn stamp(args: &StampArgs, stdin: impl Read) -> Result<Output, StampError> {
    let key = match &args.key_file {
        Some(path) => {
            let bytes = std::fs::read(path).map_err(|source| StampError::Read {
                path: path.display().to_string(),
                source,
            })?;
            Some(StampKey::new(bytes).map_err(|source| StampError::Key {
                path: path.display().to_string(),
                source,
            })?)
        }
        None => None,
    };
    let sources = read_sources(&args.files, stdin)?;
    let options = offline::Options {
        namespace: args.namespace.clone(),
        key,
        explain: args.explain,
        kinds: args.kinds.kinds()?,
    };
    Ok(offline::run(&sources, &options)?)
}

/// Reads every input: files as given, directories' YAML and JSON files in name order, `-` once.
pub fn read_sources(paths: &[PathBuf], mut stdin: impl Read) -> Result<Vec<Source>, StampError> {
    let mut sources = Vec::new();
    let mut stdin_used = false;
    for path in paths {
        if path.as_os_str() == "-" {
            if std::mem::replace(&mut stdin_used, true) {
                return Err(StampError::StdinTwice);
            }
            let mut bytes = Vec::new();
            stdin
                .read_to_end(&mut bytes)
                .map_err(|source| StampError::Read {
                    path: "standard input".into(),
                    source,
                })?;
            sources.push(source("standard input".into(), bytes)?);
        } else if path.is_dir() {
            let files = dir_files(path)?;
            if files.is_empty() {
                return Err(StampError::EmptyDir {
                    path: path.display().to_string(),
                });
            }
            for file in files {
                sources.push(read_file(&file)?);
            }
        } else {
            sources.push(read_file(path)?);
        }
    }
    Ok(sources)
}

fn dir_files(dir: &Path) -> Result<Vec<PathBuf>, StampError> {
    let err = |source| StampError::Read {
        path: dir.display().to_string(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(err)? {
        let path = entry.map_err(err)?.path();
        let yaml = path
            .extension()
            .is_some_and(|e| e == "yaml" || e == "yml" || e == "json");
        if yaml && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

fn read_file(path: &Path) -> Result<Source, StampError> {
    let bytes = std::fs::read(path).map_err(|source| StampError::Read {
        path: path.display().to_string(),
        source,
    })?;
    source(path.display().to_string(), bytes)
}

fn source(name: String, bytes: Vec<u8>) -> Result<Source, StampError> {
    match String::from_utf8(bytes) {
        Ok(text) => Ok(Source { name, text }),
        Err(_) => Err(StampError::NotText { path: name }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve(flags: &[&str]) -> ServeArgs {
        let args = ["confighash", "serve"].iter().chain(flags);
        match Cli::try_parse_from(args).unwrap().command {
            Command::Serve(args) => args,
            other => panic!("not serve: {other:?}"),
        }
    }

    fn explain(flags: &[&str]) -> Result<crate::explain::Request, clap::Error> {
        let args = ["confighash", "explain"].iter().chain(flags);
        match Cli::try_parse_from(args)?.command {
            Command::Explain(args) => args
                .to_request()
                .map_err(|e| clap::Error::raw(clap::error::ErrorKind::ValueValidation, e)),
            other => panic!("not explain: {other:?}"),
        }
    }

    #[test]
    fn explain_flags_reach_the_request() {
        use crate::core::workload::WorkloadKind;
        use crate::explain::{Format, KeyChoice, Request, Target};
        assert_eq!(
            explain(&["-n", "shop", "sts/db", "-o", "json", "--key-file", "/k"]).unwrap(),
            Request {
                target: Target::Workload {
                    kind: WorkloadKind::STATEFUL_SET,
                    name: "db".into(),
                    namespace: Some("shop".into()),
                },
                format: Format::Json,
                install_namespace: "confighash".into(),
                key: KeyChoice::File("/k".into()),
                webhook_configuration: "confighash".into(),
                kinds: crate::core::workload::Kinds::built_in(),
            }
        );
        let all = explain(&["-A", "--install-namespace", "ops", "--key-secret", "k"]).unwrap();
        assert_eq!(all.target, Target::AllNamespaces);
        assert_eq!(all.format, Format::Text);
        assert_eq!(all.install_namespace, "ops");
        assert_eq!(all.key, KeyChoice::Secret("k".into()));
        assert_eq!(explain(&[]).unwrap().target, Target::Namespace(None));
        for bad in [
            &["-A", "-n", "shop"][..],
            &["-A", "deploy/web"],
            &["job/x"],
            &["-n", "Shop", "deploy/web"],
            &["deploy/web", "-o", "yaml"],
            &["deploy/web", "--key-file", "/k", "--key-secret", "s"],
        ] {
            assert!(explain(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sizes_take_binary_suffixes_and_refuse_the_rest() {
        assert_eq!(parse_size("1"), Ok(1));
        assert_eq!(parse_size("512Ki"), Ok(512 << 10));
        assert_eq!(parse_size("16Mi"), Ok(16 << 20));
        assert_eq!(parse_size("4Gi"), Ok(4 << 30));
        for bad in [
            "",
            "0",
            "Mi",
            "16M",
            "16 Mi",
            "-1",
            "1.5Mi",
            "5Gi",
            "99999999999999999999Ki",
            "16mi",
        ] {
            let error = parse_size(bad).unwrap_err();
            assert!(error.contains("not a size from 1 to 4Gi"), "{bad}: {error}");
        }
    }

    #[test]
    fn serve_without_flags_runs_with_the_default_config() {
        let mut config = Config::try_from(serve(&[])).unwrap();
        // Unset, it depends on where the test runs.
        config.leader_election.enabled = false;
        assert_eq!(config, Config::default());
    }

    #[test]
    fn serve_flags_reach_the_config() {
        let config = serve(&[
            "--listen=127.0.0.1:9443",
            "--key-file=/k",
            "--self-signed-certs",
            "--certs-secret=c",
            "--service=s",
            "--webhook-configuration=w",
            "--self-signed-name=127.0.0.1",
            "--self-signed-name=hook.example.test",
            "--tls-cert=/t.crt",
            "--tls-key=/t.key",
            "--client-ca-file=/ca.crt",
            "--max-connections=7",
            "--lookup-deadline=3s",
            "--max-references=9",
            "--max-reference-bytes=3Mi",
            "--exclude-namespaces=a,b",
            "--debounce=1s",
            "--resync=2m",
            "--max-touches-per-second=0.5",
            "--rollout-timeout=15m",
            "--flap-threshold=3",
            "--flap-period=20m",
            "--roll-on-delete",
            "--stamp-existing",
            "--leader-elect=true",
            "--lease=l",
        ])
        .to_config()
        .unwrap();
        assert_eq!(
            config,
            Config {
                listen: "127.0.0.1:9443".parse().unwrap(),
                key: KeySource::File("/k".into()),
                certs: CertSource {
                    cert: "/t.crt".into(),
                    key: "/t.key".into(),
                    self_signed: Some(SelfSigned {
                        secret: "c".into(),
                        service: "s".into(),
                        webhook_configuration: "w".into(),
                        extra_names: vec!["127.0.0.1".into(), "hook.example.test".into()],
                    }),
                },
                client_ca_file: Some("/ca.crt".into()),
                max_connections: 7,
                lookup_deadline: Duration::from_secs(3),
                max_references: 9,
                max_reference_bytes: 3 << 20,
                exclude_namespaces: vec!["a".into(), "b".into()],
                rules: crate::core::rules::Options {
                    roll_on_delete: true,
                    stamp_existing: true,
                },
                watcher: WatcherSettings {
                    debounce: Duration::from_secs(1),
                    resync: Duration::from_secs(120),
                    max_touches_per_second: 0.5,
                    rollout_timeout: Duration::from_secs(900),
                    flap_threshold: 3,
                    flap_period: Duration::from_secs(1200),
                    ..WatcherSettings::default()
                },
                leader_election: LeaderElection {
                    enabled: true,
                    lease: "l".into(),
                },
                ..Config::default()
            }
        );
        let off = serve(&["--leader-elect=false", "--key-secret=k"])
            .to_config()
            .unwrap();
        assert!(!off.leader_election.enabled);
        assert_eq!(off.key, KeySource::Secret("k".into()));
    }

    #[test]
    fn workload_kinds_reach_every_command_and_bad_ones_name_the_flag() {
        let clone_set =
            WorkloadKind::parse("apps.kruise.io/v1alpha1/CloneSet=/spec/template").unwrap();
        let config = serve(&[
            "--workload-kind=apps.kruise.io/v1alpha1/CloneSet=/spec/template",
            "--workload-kind",
            "keda.sh/v1alpha1/ScaledJob=/spec/jobTargetRef/template",
        ])
        .to_config()
        .unwrap();
        let configured: Vec<String> = config.kinds.configured().map(WorkloadKind::flag).collect();
        assert_eq!(
            configured,
            [
                "apps.kruise.io/v1alpha1/CloneSet=/spec/template",
                "keda.sh/v1alpha1/ScaledJob=/spec/jobTargetRef/template"
            ]
        );
        assert_eq!(serve(&[]).to_config().unwrap().kinds, Kinds::built_in());

        // A malformed value is refused by the parser, naming the flag and what is wrong.
        let bad = Cli::try_parse_from(["confighash", "serve", "--workload-kind=CloneSet"])
            .unwrap_err()
            .to_string();
        assert!(
            bad.contains("--workload-kind") && bad.contains("GROUP/VERSION/KIND=POINTER"),
            "{bad}"
        );
        let built_in = Cli::try_parse_from([
            "confighash",
            "serve",
            "--workload-kind=apps/v1/Deployment=/spec/template",
        ])
        .unwrap_err()
        .to_string();
        assert!(built_in.contains("is built in"), "{built_in}");
        // One group and kind at two pointers: refused when the config is made.
        let twice = serve(&[
            "--workload-kind=apps.kruise.io/v1alpha1/CloneSet=/spec/template",
            "--workload-kind=apps.kruise.io/v1alpha1/CloneSet=/spec/other",
        ])
        .to_config()
        .unwrap_err();
        assert_eq!(
            twice.to_string(),
            "--workload-kind: apps.kruise.io/CloneSet is configured twice"
        );

        let request = explain(&[
            "cloneset/web",
            "--workload-kind=apps.kruise.io/v1alpha1/CloneSet=/spec/template",
        ])
        .unwrap();
        assert_eq!(
            request.target,
            crate::explain::Target::Workload {
                kind: clone_set,
                name: "web".into(),
                namespace: None
            }
        );
        for command in ["stamp", "diff"] {
            let mut args = vec!["confighash", command];
            args.extend(if command == "stamp" {
                &["-f", "-"][..]
            } else {
                &["--base", "a", "--head", "b"][..]
            });
            args.push("--workload-kind=apps.kruise.io/v1alpha1/CloneSet=/spec/template");
            let kinds = match Cli::try_parse_from(args).unwrap().command {
                Command::Stamp(a) => a.kinds.kinds().unwrap(),
                Command::Diff(a) => a.kinds.kinds().unwrap(),
                other => panic!("{other:?}"),
            };
            assert!(kinds.contains(clone_set), "{command}");
        }
    }

    #[test]
    fn serve_dry_run_reaches_the_config() {
        assert!(serve(&["--dry-run"]).to_config().unwrap().dry_run);
        assert!(!serve(&[]).to_config().unwrap().dry_run);
    }

    #[test]
    fn self_signed_names_are_checked_and_need_self_signed_certs() {
        let parse = |flags: &[&str]| {
            Cli::try_parse_from(["confighash", "serve"].iter().chain(flags)).map(|_| ())
        };
        for good in [
            "127.0.0.1",
            "::1",
            "hook.example.test",
            "*.example.test",
            "a-b",
        ] {
            let flag = format!("--self-signed-name={good}");
            assert!(
                parse(&["--self-signed-certs", &flag]).is_ok(),
                "{good} is refused"
            );
        }
        for bad in [
            "",
            "Hook.example",
            "-a.b",
            "a..b",
            "a/b",
            "127.0.0.1:8443",
            "*.",
        ] {
            let flag = format!("--self-signed-name={bad}");
            let error = parse(&["--self-signed-certs", &flag])
                .unwrap_err()
                .to_string();
            assert!(error.contains("--self-signed-name"), "{bad:?}: {error}");
        }
        let alone = parse(&["--self-signed-name=127.0.0.1"])
            .unwrap_err()
            .to_string();
        assert!(alone.contains("--self-signed-certs"), "{alone}");
    }
}

//! The composition root: `confighash serve` wired from its configuration, the one place where
//! the parts meet (the client, the key, the certificates, the webhook, the watcher, leader
//! election and the admin port).

use std::sync::Arc;
use std::time::Duration;

use crate::admin::health::Health;
use crate::admin::metrics::Metrics;
use crate::webhook::admission::{self, Webhook};
use crate::webhook::server::{
    AdminLimits, Fit, Limits, NoRoom, RESERVED_FILES, ServeConfig, ServeError, fit_max_connections,
    open_file_limit, raise_open_file_limit, start_with,
};
use crate::webhook::tls::{CertStore, ClientCaStore};

/// Why `confighash serve` stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot reach the Kubernetes API (in-cluster config or KUBECONFIG): {0}")]
    Client(#[source] kube::Error),
    #[error(transparent)]
    Key(#[from] crate::certs::key::KeyLoadError),
    #[error(transparent)]
    Tls(#[from] crate::webhook::tls::TlsError),
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
}

/// How often the certificate files are re-read.
const CERT_POLL: Duration = Duration::from_secs(10);
/// From accept, a client must finish its TLS handshake and send its first request head within
/// this; also each later HTTP/1.1 request head.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// A review must be received and answered within this from its head (more when
/// `--lookup-deadline` needs it). The API server gives up after the configuration's
/// `timeoutSeconds` (5 s in `deploy/`) anyway; this bounds what a client that is not the API
/// server can hold.
const REQUEST_TIMEOUT: Duration = admission::DEFAULT_REQUEST_TIMEOUT;
/// In-flight requests get this long at shutdown (below the pod's 30 s grace period).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs `confighash serve` until SIGTERM or SIGINT, then shuts down gracefully.
pub async fn run(args: crate::cli::ServeArgs) -> Result<(), RunError> {
    // Before anything opens files or connections.
    let max_connections = size_connections(args.max_connections, AdminLimits::default())?;
    let config = kube::Config::infer()
        .await
        .map_err(|e| RunError::Client(kube::Error::InferConfig(e)))?;
    let client = crate::cluster::client::build(config).map_err(RunError::Client)?;
    let namespace = client.default_namespace().to_owned();
    let mut background = Vec::new();
    let keys = match &args.key_file {
        Some(path) => crate::certs::key::from_file(path)?,
        None => {
            let keys = crate::certs::key::from_secret(client.clone(), &namespace, &args.key_secret)
                .await?;
            background.push(tokio::spawn(crate::certs::key::watch_secret(
                keys.clone(),
                client.clone(),
                namespace.clone(),
                args.key_secret.clone(),
            )));
            keys
        }
    };
    tracing::info!(key_id = keys.current().id(), "checksum key loaded");
    if args.self_signed_certs {
        let config = crate::certs::selfsigned::SelfSignedConfig {
            secret_name: args.certs_secret.clone(),
            service: args.service.clone(),
            webhook_configuration: args.webhook_configuration.clone(),
            ..crate::certs::selfsigned::SelfSignedConfig::new(
                &namespace,
                args.tls_cert.clone(),
                args.tls_key.clone(),
            )
        };
        crate::certs::selfsigned::ensure(&client, &config).await?;
        background.push(tokio::spawn(crate::certs::selfsigned::run(
            client.clone(),
            config,
        )));
    }
    let certs = CertStore::load(&args.tls_cert, &args.tls_key)?;
    let client_ca = match &args.client_ca_file {
        Some(path) => {
            let ca = ClientCaStore::load(path)?;
            tracing::info!(path = %path.display(), certificates = ca.certificates(), "client certificates required, signed by this CA");
            Some(ca)
        }
        None => None,
    };
    let metrics = Arc::new(Metrics::new());
    let rules = crate::core::rules::Options {
        roll_on_delete: args.roll_on_delete,
        stamp_existing: args.stamp_existing,
    };
    let excluded: Vec<String> = std::iter::once(namespace.clone())
        .chain(args.exclude_namespaces.iter().cloned())
        .collect();
    let webhook = Arc::new(
        Webhook::new(
            Arc::new(crate::webhook::lookup::KubeSource::new(client.clone())),
            keys.clone(),
            metrics.clone(),
        )
        .with_lookup_deadline(args.lookup_deadline)
        .with_options(rules)
        .with_max_references(args.max_references)
        .with_excluded_namespaces(excluded.iter().cloned()),
    );
    let identity = crate::watcher::leader::LeaderConfig::default_identity();
    let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    let leader_config = crate::watcher::leader::LeaderConfig {
        lease_name: args.lease.clone(),
        ..crate::watcher::leader::LeaderConfig::new(namespace.clone(), identity.clone())
    };
    leader_config
        .validate()
        .map_err(|e| RunError::Leader(e.to_string()))?;
    let leadership = if args.leader_elect.unwrap_or(in_cluster) {
        let (leadership, task) =
            crate::watcher::leader::spawn(client.clone(), leader_config.clone());
        background.push(task);
        leadership
    } else {
        crate::watcher::leader::Leadership::always()
    };
    let watcher_config = crate::watcher::WatcherConfig {
        debounce: args.debounce,
        resync: args.resync,
        max_touches_per_second: args.max_touches_per_second,
        rules,
        identity: identity.clone(),
        max_references: args.max_references,
        excluded_namespaces: excluded
            .iter()
            .cloned()
            .chain(["kube-system".to_owned()])
            .collect(),
        ..Default::default()
    };
    background.push(tokio::spawn(crate::watcher::run(
        client.clone(),
        keys,
        leadership.clone(),
        metrics,
        watcher_config,
    )));
    let limits = Limits {
        max_connections,
        // The lookups must fit, with time to spare for the body.
        request_timeout: REQUEST_TIMEOUT.max(args.lookup_deadline + Duration::from_secs(5)),
        ..Limits::default()
    };
    let running = start_with(
        ServeConfig {
            listen: args.listen,
            admin_listen: args.admin_listen,
            certs,
            client_ca,
            webhook,
            health: Arc::new(Health::default()),
            cert_poll: CERT_POLL,
            header_read_timeout: HEADER_READ_TIMEOUT,
            drain_timeout: DRAIN_TIMEOUT,
        },
        limits,
    )
    .await?;
    tracing::info!(webhook = %running.webhook_addr, admin = %running.admin_addr, "serving");

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(RunError::Signal)?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
    }
    for task in background {
        task.abort();
    }
    if leadership.is_leader() && args.leader_elect.unwrap_or(in_cluster) {
        // Hand over at once instead of letting the lease run out.
        if let Err(e) = crate::watcher::leader::release(client, &leader_config).await {
            tracing::warn!(error = %e, "could not release the leader lease; it will expire");
        }
    }
    running.shutdown().await;
    tracing::info!("stopped");
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

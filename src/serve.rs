//! `confighash serve`: the webhook over TLS and the admin port, with graceful shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::admin::{self, Health};
use crate::admission::{self, Webhook};
use crate::tls::CertStore;

/// Everything a running server needs.
pub struct ServeConfig {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub certs: Arc<CertStore>,
    pub webhook: Arc<Webhook>,
    pub health: Arc<Health>,
    /// How often the certificate files are re-read.
    pub cert_poll: Duration,
    /// A client that has not sent its request headers by then is cut off.
    pub header_read_timeout: Duration,
    /// How long in-flight requests get to finish at shutdown.
    pub drain_timeout: Duration,
}

/// A started server.
pub struct Running {
    pub webhook_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub health: Arc<Health>,
    stop: watch::Sender<bool>,
    stop_admin: watch::Sender<bool>,
    webhook_task: JoinHandle<()>,
    admin_task: JoinHandle<()>,
    reload_task: JoinHandle<()>,
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Binds both ports and starts serving.
pub async fn start(config: ServeConfig) -> Result<Running, ServeError> {
    let bind = |addr: SocketAddr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Listen { addr, source })
    };
    let listener = bind(config.listen).await?;
    let admin_listener = bind(config.admin_listen).await?;
    let webhook_addr = listener.local_addr().unwrap_or(config.listen);
    let admin_addr = admin_listener.local_addr().unwrap_or(config.admin_listen);
    let (stop, stopped) = watch::channel(false);
    let (stop_admin, admin_stopped) = watch::channel(false);

    let metrics = config.webhook.metrics.clone();
    metrics.set_cert_expiry(config.certs.not_after());
    config.health.set_certificate_loaded();
    let reload_task = {
        let certs = config.certs.clone();
        let metrics = metrics.clone();
        tokio::spawn(certs.clone().poll(config.cert_poll, move |result| match result {
            Ok(false) => {}
            Ok(true) => {
                metrics.cert_reload(true);
                metrics.set_cert_expiry(certs.not_after());
                tracing::info!("loaded a new serving certificate");
            }
            Err(e) => {
                metrics.cert_reload(false);
                tracing::error!(error = %e, "the new serving certificate cannot be used; the old one stays in service");
            }
        }))
    };

    let acceptor = TlsAcceptor::from(Arc::new(config.certs.server_config()));
    let router = admission::router(config.webhook.clone());
    let webhook_task = tokio::spawn(serve_tls(
        listener,
        acceptor,
        router,
        config.header_read_timeout,
        config.drain_timeout,
        stopped,
    ));

    let admin_router = admin::router(config.health.clone(), metrics);
    let mut admin_stopped = admin_stopped;
    let admin_task = tokio::spawn(async move {
        let shutdown = async move {
            let _ = admin_stopped.changed().await;
        };
        if let Err(e) = axum::serve(admin_listener, admin_router)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!(error = %e, "the admin server stopped");
        }
    });
    Ok(Running {
        webhook_addr,
        admin_addr,
        health: config.health,
        stop,
        stop_admin,
        webhook_task,
        admin_task,
        reload_task,
    })
}

impl Running {
    /// Stops being ready, stops accepting, lets in-flight requests finish (bounded), and stops.
    /// The admin port answers (`/readyz` with 503) until the webhook has drained.
    pub async fn shutdown(self) {
        self.health.set_shutting_down();
        let _ = self.stop.send(true);
        let _ = self.webhook_task.await;
        let _ = self.stop_admin.send(true);
        let _ = self.admin_task.await;
        self.reload_task.abort();
    }
}

async fn serve_tls(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    router: axum::Router,
    header_read_timeout: Duration,
    drain_timeout: Duration,
    mut stopped: watch::Receiver<bool>,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    builder.http2().timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stopped.changed() => break,
        };
        // Reviews are small request/response exchanges: Nagle's algorithm would hold replies
        // back waiting for the client's delayed ACK.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
        }
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(router.clone());
        let builder = builder.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            // The handshake gets the same bound as the headers.
            let tls = match tokio::time::timeout(header_read_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let conn = builder
                .serve_connection_with_upgrades(TokioIo::new(tls), service)
                .into_owned();
            if let Err(e) = watcher.watch(conn).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(drain_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(?drain_timeout, "in-flight requests did not finish in time");
    }
}

/// Why `confighash serve` stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot reach the Kubernetes API (in-cluster config or KUBECONFIG): {0}")]
    Client(#[source] kube::Error),
    #[error(transparent)]
    Key(#[from] crate::key::KeyLoadError),
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    #[error(transparent)]
    SelfSigned(#[from] crate::selfsigned::SelfSignedError),
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error("leader election: {0}")]
    Leader(String),
    #[error("cannot listen for signals: {0}")]
    Signal(#[source] std::io::Error),
}

/// How often the certificate files are re-read.
const CERT_POLL: Duration = Duration::from_secs(10);
/// A client must send its request headers within this.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// In-flight requests get this long at shutdown (below the pod's 30 s grace period).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs `confighash serve` until SIGTERM or SIGINT, then shuts down gracefully.
pub async fn run(args: crate::cli::ServeArgs) -> Result<(), RunError> {
    let client = kube::Client::try_default()
        .await
        .map_err(RunError::Client)?;
    let namespace = client.default_namespace().to_owned();
    let mut background = Vec::new();
    let keys = match &args.key_file {
        Some(path) => crate::key::from_file(path)?,
        None => {
            let keys =
                crate::key::from_secret(client.clone(), &namespace, &args.key_secret).await?;
            background.push(tokio::spawn(crate::key::watch_secret(
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
        let config = crate::selfsigned::SelfSignedConfig::new(
            &namespace,
            args.tls_cert.clone(),
            args.tls_key.clone(),
        );
        crate::selfsigned::ensure(&client, &config).await?;
        background.push(tokio::spawn(crate::selfsigned::run(client.clone(), config)));
    }
    let certs = CertStore::load(&args.tls_cert, &args.tls_key)?;
    let metrics = Arc::new(crate::metrics::Metrics::new());
    let rules = crate::rules::Options {
        roll_on_delete: args.roll_on_delete,
        stamp_existing: args.stamp_existing,
    };
    let webhook = Arc::new(Webhook {
        source: Arc::new(crate::lookup::KubeSource::new(client.clone())),
        keys: keys.clone(),
        metrics: metrics.clone(),
        lookup_deadline: args.lookup_deadline,
        options: rules,
    });
    let identity = crate::leader::LeaderConfig::default_identity();
    let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    let leader_config = crate::leader::LeaderConfig::new(namespace.clone(), identity.clone());
    leader_config
        .validate()
        .map_err(|e| RunError::Leader(e.to_string()))?;
    let leadership = if args.leader_elect.unwrap_or(in_cluster) {
        let (leadership, task) = crate::leader::spawn(client.clone(), leader_config.clone());
        background.push(task);
        leadership
    } else {
        crate::leader::Leadership::always()
    };
    let watcher_config = crate::watcher::WatcherConfig {
        debounce: args.debounce,
        resync: args.resync,
        max_touches_per_second: args.max_touches_per_second,
        rules,
        identity: identity.clone(),
        ..Default::default()
    };
    background.push(tokio::spawn(crate::watcher::run(
        client.clone(),
        keys,
        leadership.clone(),
        metrics,
        watcher_config,
    )));
    let running = start(ServeConfig {
        listen: args.listen,
        admin_listen: args.admin_listen,
        certs,
        webhook,
        health: Arc::new(Health::default()),
        cert_poll: CERT_POLL,
        header_read_timeout: HEADER_READ_TIMEOUT,
        drain_timeout: DRAIN_TIMEOUT,
    })
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
        if let Err(e) = crate::leader::release(client, &leader_config).await {
            tracing::warn!(error = %e, "could not release the leader lease; it will expire");
        }
    }
    running.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

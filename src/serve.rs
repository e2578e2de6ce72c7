//! `confighash serve`: the webhook over TLS and the admin port, with graceful shutdown.
//!
//! Every connection to the webhook port is bounded in time and in number ([`Limits`]):
//!
//! - at most [`Limits::max_connections`] are served at once; further ones are not accepted (they
//!   wait in the listen backlog) until one closes; `confighash_webhook_connections` and
//!   `confighash_webhook_connection_limit_reached_total` show it;
//! - from accept, the TLS handshake, the protocol detection (HTTP/2 preface or HTTP/1.1) and the
//!   first complete request head must all arrive within [`ServeConfig::header_read_timeout`];
//!   later HTTP/1.1 request heads, and the idle time between HTTP/1.1 requests, get the same bound;
//! - each review must be received and answered within [`Limits::request_timeout`]
//!   ([`admission::ReviewLimits`]);
//! - a connection with no request in flight for [`Limits::idle_timeout`] is closed gracefully
//!   (HTTP/2: GOAWAY), and HTTP/2 peers must answer keep-alive pings.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use crate::admin::{self, Health};
use crate::admission::{self, ReviewLimits, Webhook};
use crate::metrics::Metrics;
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
    /// From accept, the TLS handshake and the first complete request head (HTTP/1.1 or HTTP/2)
    /// must arrive within this, or the connection is closed. Also bounds each later HTTP/1.1
    /// request head and the idle time between HTTP/1.1 requests.
    pub header_read_timeout: Duration,
    /// How long in-flight requests get to finish at shutdown.
    pub drain_timeout: Duration,
}

/// Bounds on the webhook port's connections and requests; [`Limits::default`] is what
/// `confighash serve` uses (with `--max-connections`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once (TLS handshakes included). At the cap no connection is
    /// accepted until one closes: new ones wait in the listen backlog. At least 1.
    pub max_connections: usize,
    /// A review must be received (body included) and answered within this from its request
    /// head: a slower body gets 408, a slower answer 503.
    pub request_timeout: Duration,
    /// A connection with no request in flight for this long is closed gracefully (HTTP/2:
    /// GOAWAY, so the client retries nothing). HTTP/1.1 connections idle only up to the header
    /// timeout anyway.
    pub idle_timeout: Duration,
    /// How often an HTTP/2 connection is pinged.
    pub http2_keep_alive_interval: Duration,
    /// An HTTP/2 connection whose ping is not answered within this is closed.
    pub http2_keep_alive_timeout: Duration,
    /// Streams (requests) open at once on one HTTP/2 connection.
    pub http2_max_concurrent_streams: u32,
    /// Memory reviews may hold at once, all connections together: their body buffers, what
    /// parsing them takes, and an allowance each ([`ReviewLimits`]). A review that finds no room
    /// gets 503. At least [`admission::MIN_REVIEW_MEMORY`].
    pub review_memory: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            request_timeout: REQUEST_TIMEOUT,
            idle_timeout: Duration::from_secs(60),
            http2_keep_alive_interval: Duration::from_secs(20),
            http2_keep_alive_timeout: Duration::from_secs(10),
            http2_max_concurrent_streams: 100,
            review_memory: admission::DEFAULT_REVIEW_MEMORY,
        }
    }
}

/// The default of `--max-connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// HTTP/2 flow-control windows: what one connection (and one stream) may have sent that the
/// webhook has not read yet. The API server multiplexes its calls on one connection, so a small
/// connection window throttles it: at 64/128 KiB an open loop of 1,000 reviews of 21 KiB/s had a
/// p99 of 239 ms against 2.4 ms at 1 MiB (benches/webhook_tls.rs). Review bodies are read as they
/// arrive and counted in the review memory, so what a window lets a client park is short-lived.
const H2_STREAM_WINDOW: u32 = 1024 * 1024;
const H2_CONNECTION_WINDOW: u32 = 1024 * 1024;
/// HTTP/1.1 read buffer: the largest request head, and the most of a body read ahead.
const H1_MAX_BUF: usize = 64 * 1024;
/// How much longer than the request timeout a connection closed for idleness may take to close.
const CLOSE_SLACK: Duration = Duration::from_secs(1);
/// The connection-limit warning is logged at most this often.
const CAP_LOG_INTERVAL: Duration = Duration::from_secs(60);

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
    open: Arc<AtomicUsize>,
    reviews: ReviewLimits,
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

/// Binds both ports and starts serving, with the default [`Limits`].
pub async fn start(config: ServeConfig) -> Result<Running, ServeError> {
    start_with(config, Limits::default()).await
}

/// Binds both ports and starts serving within `limits`.
pub async fn start_with(config: ServeConfig, limits: Limits) -> Result<Running, ServeError> {
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

    let metrics = config.webhook.metrics().clone();
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

    let max_connections = limits.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let open = Arc::new(AtomicUsize::new(0));
    let acceptor = TlsAcceptor::from(Arc::new(config.certs.server_config()));
    let reviews = ReviewLimits::new(limits.request_timeout, limits.review_memory);
    let router = admission::router_with(config.webhook.clone(), reviews.clone());
    let webhook_task = tokio::spawn(serve_tls(
        Listener {
            listener,
            slots: Arc::new(Semaphore::new(max_connections)),
            max_connections,
            open: open.clone(),
            metrics: metrics.clone(),
        },
        Connections {
            acceptor,
            router,
            builder: http_builder(config.header_read_timeout, &limits),
            header_read_timeout: config.header_read_timeout,
            limits,
        },
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
        open,
        reviews,
    })
}

impl Running {
    /// Connections of the webhook port open now (TLS handshakes included).
    pub fn connections(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Bytes of the review memory budget ([`Limits::review_memory`]) held now.
    pub fn review_memory_in_use(&self) -> usize {
        self.reviews.memory_in_use()
    }

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

fn http_builder(header_read_timeout: Duration, limits: &Limits) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        // hyper restarts this timer whenever a connection waits for a request head, so it also
        // closes HTTP/1.1 connections left idle between requests.
        .header_read_timeout(header_read_timeout)
        .max_buf_size(H1_MAX_BUF);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.http2_keep_alive_interval)
        .keep_alive_timeout(limits.http2_keep_alive_timeout)
        .max_concurrent_streams(limits.http2_max_concurrent_streams)
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONNECTION_WINDOW);
    builder
}

/// The webhook port and its connection slots.
struct Listener {
    listener: TcpListener,
    slots: Arc<Semaphore>,
    max_connections: usize,
    /// Connections open now, on this server ([`Running::connections`]).
    open: Arc<AtomicUsize>,
    /// The same count for `/metrics`; the metrics may be shared by servers (as across a restart).
    metrics: Arc<Metrics>,
}

/// An accepted connection's place under the connection limit, given back when dropped.
struct Slot {
    _permit: OwnedSemaphorePermit,
    open: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
}

impl Slot {
    fn new(permit: OwnedSemaphorePermit, open: Arc<AtomicUsize>, metrics: Arc<Metrics>) -> Self {
        open.fetch_add(1, Ordering::Relaxed);
        metrics.connection(true);
        Slot {
            _permit: permit,
            open,
            metrics,
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
        self.metrics.connection(false);
    }
}

/// What each connection is served with.
#[derive(Clone)]
struct Connections {
    acceptor: TlsAcceptor,
    router: axum::Router,
    builder: auto::Builder<TokioExecutor>,
    header_read_timeout: Duration,
    limits: Limits,
}

async fn serve_tls(
    port: Listener,
    connections: Connections,
    drain_timeout: Duration,
    mut stopped: watch::Receiver<bool>,
) {
    let Listener {
        listener,
        slots,
        max_connections,
        open,
        metrics,
    } = port;
    let mut tasks = JoinSet::new();
    // Each connection gets its own receiver, to finish when the server stops.
    let stop_connections = stopped.clone();
    // A slot first, then a connection: at the cap, new connections stay in the listen backlog.
    let mut slot: Option<OwnedSemaphorePermit> = None;
    let mut cap = CapLog::default();
    loop {
        if slot.is_none() {
            match slots.clone().try_acquire_owned() {
                Ok(permit) => slot = Some(permit),
                Err(_) => {
                    metrics.connection_limit_reached();
                    cap.reached(max_connections);
                }
            }
        }
        tokio::select! {
            () = stop_requested(&mut stopped) => break,
            Some(joined) = tasks.join_next() => {
                if let Err(e) = joined
                    && e.is_panic()
                {
                    tracing::error!(error = %e, "a connection task panicked");
                }
            }
            permit = slots.clone().acquire_owned(), if slot.is_none() => slot = permit.ok(),
            accepted = listener.accept(), if slot.is_some() => match accepted {
                Ok((tcp, peer)) => {
                    let accepted_at = Instant::now();
                    // Reviews are small request/response exchanges: Nagle's algorithm would hold
                    // replies back waiting for the client's delayed ACK.
                    if let Err(e) = tcp.set_nodelay(true) {
                        tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
                    }
                    let permit = slot.take().expect("accepted only with a free slot");
                    let permit = Slot::new(permit, open.clone(), metrics.clone());
                    tasks.spawn(serve_connection(
                        connections.clone(),
                        tcp,
                        peer,
                        accepted_at,
                        stop_connections.clone(),
                        permit,
                    ));
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    drop(slot);
    // Every connection was told to finish (see `serve_connection`); wait for them, bounded.
    let drained = tokio::time::timeout(drain_timeout, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            ?drain_timeout,
            connections = tasks.len(),
            "in-flight requests did not finish in time; closing their connections"
        );
        tasks.shutdown().await;
    }
}

/// Resolves once the server is told to stop (or its handle is gone).
async fn stop_requested(stopped: &mut watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

/// Logs that the connection limit was reached, at most once per [`CAP_LOG_INTERVAL`].
#[derive(Default)]
struct CapLog {
    last: Option<Instant>,
    since_last: u64,
}

impl CapLog {
    fn reached(&mut self, max_connections: usize) {
        self.since_last += 1;
        if self.last.is_some_and(|at| at.elapsed() < CAP_LOG_INTERVAL) {
            return;
        }
        tracing::warn!(
            max_connections,
            times = self.since_last,
            "connection limit reached; new connections wait until one closes"
        );
        self.last = Some(Instant::now());
        self.since_last = 0;
    }
}

/// What a connection's requests are doing; the connection's driver watches it.
#[derive(Debug, Clone, Copy)]
struct Activity {
    /// Requests whose head has arrived, since the connection opened.
    requests: u64,
    /// Requests being answered now.
    in_flight: usize,
    /// When `in_flight` last became 0 (or the connection opened).
    idle_since: Instant,
}

/// The webhook's router as a hyper service that reports each request's start and end.
#[derive(Clone)]
struct Tracked {
    router: axum::Router,
    activity: Arc<watch::Sender<Activity>>,
}

/// Marks a request in flight until dropped (answered, or its connection gone).
struct InFlight(Arc<watch::Sender<Activity>>);

impl InFlight {
    fn start(activity: Arc<watch::Sender<Activity>>) -> Self {
        activity.send_modify(|a| {
            a.requests += 1;
            a.in_flight += 1;
        });
        InFlight(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.send_modify(|a| {
            a.in_flight -= 1;
            if a.in_flight == 0 {
                a.idle_since = Instant::now();
            }
        });
    }
}

impl hyper::service::Service<hyper::Request<Incoming>> for Tracked {
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn call(&self, request: hyper::Request<Incoming>) -> Self::Future {
        // hyper calls the service once a request head is complete (HTTP/1.1) or a stream's
        // headers have arrived (HTTP/2).
        let in_flight = InFlight::start(self.activity.clone());
        let router = self.router.clone();
        Box::pin(async move {
            let response = router.oneshot(request.map(Body::new)).await;
            drop(in_flight);
            response
        })
    }
}

/// Why a connection's timer is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timer {
    /// No complete request head yet: the header deadline from accept.
    FirstRequest,
    /// No request in flight: the idle limit.
    Idle,
    /// Asked to close because idle, and not closed yet.
    Closing,
}

/// Serves one accepted connection: TLS handshake, then HTTP until the client closes, a deadline
/// passes or the server stops. `_slot` is the connection's place under the connection limit.
async fn serve_connection(
    connections: Connections,
    tcp: TcpStream,
    peer: SocketAddr,
    accepted_at: Instant,
    mut stopped: watch::Receiver<bool>,
    _slot: Slot,
) {
    let Connections {
        acceptor,
        router,
        builder,
        header_read_timeout,
        limits,
    } = connections;
    // One deadline from accept to the first complete request head: the handshake, the protocol
    // detection (which waits for the HTTP/2 preface) and the head itself.
    let first_deadline = accepted_at + header_read_timeout;
    let tls = match tokio::time::timeout_at(first_deadline, acceptor.accept(tcp)).await {
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
    let (activity, mut watched) = watch::channel(Activity {
        requests: 0,
        in_flight: 0,
        idle_since: Instant::now(),
    });
    let service = Tracked {
        router,
        activity: Arc::new(activity),
    };
    let mut conn = pin!(builder.serve_connection_with_upgrades(TokioIo::new(tls), service));
    let mut closing_since: Option<Instant> = None;
    let mut stopping = false;
    loop {
        let now = *watched.borrow_and_update();
        let mut timer: Option<(Instant, Timer)> = None;
        let mut consider = |at: Instant, why: Timer| {
            if timer.is_none_or(|(t, _)| at < t) {
                timer = Some((at, why));
            }
        };
        if now.requests == 0 {
            consider(first_deadline, Timer::FirstRequest);
        }
        if let Some(since) = closing_since {
            // A graceful close needs the requests in flight answered (each bounded by the request
            // timeout, and none older than the close) and, on HTTP/2, a ping answered.
            consider(since + limits.request_timeout + CLOSE_SLACK, Timer::Closing);
        } else if !stopping && now.requests > 0 && now.in_flight == 0 {
            consider(now.idle_since + limits.idle_timeout, Timer::Idle);
        }
        let sleep = async {
            match timer {
                Some((at, _)) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            Ok(()) = watched.changed() => {}
            () = stop_requested(&mut stopped), if !stopping => {
                // Finish what is in flight, then close; the drain timeout bounds the wait.
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
            () = sleep => match timer.map(|(_, why)| why) {
                Some(Timer::FirstRequest) => {
                    tracing::debug!(%peer, ?header_read_timeout, "no complete request head in time; closed");
                    return;
                }
                Some(Timer::Idle) => {
                    tracing::debug!(%peer, idle_timeout = ?limits.idle_timeout, "idle; closing");
                    closing_since = Some(Instant::now());
                    conn.as_mut().graceful_shutdown();
                }
                Some(Timer::Closing) | None => {
                    tracing::debug!(%peer, "did not close in time; dropped");
                    return;
                }
            },
        }
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
    let config = kube::Config::infer()
        .await
        .map_err(|e| RunError::Client(kube::Error::InferConfig(e)))?;
    let client = crate::client::build(config).map_err(RunError::Client)?;
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
    let metrics = Arc::new(Metrics::new());
    let rules = crate::rules::Options {
        roll_on_delete: args.roll_on_delete,
        stamp_existing: args.stamp_existing,
    };
    let excluded: Vec<String> = std::iter::once(namespace.clone())
        .chain(args.exclude_namespaces.iter().cloned())
        .collect();
    let webhook = Arc::new(
        Webhook::new(
            Arc::new(crate::lookup::KubeSource::new(client.clone())),
            keys.clone(),
            metrics.clone(),
        )
        .with_lookup_deadline(args.lookup_deadline)
        .with_options(rules)
        .with_max_references(args.max_references)
        .with_excluded_namespaces(excluded.iter().cloned()),
    );
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
    let limits = Limits {
        max_connections: args.max_connections,
        // The lookups must fit, with time to spare for the body.
        request_timeout: REQUEST_TIMEOUT.max(args.lookup_deadline + Duration::from_secs(5)),
        ..Limits::default()
    };
    let running = start_with(
        ServeConfig {
            listen: args.listen,
            admin_listen: args.admin_listen,
            certs,
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
        if let Err(e) = crate::leader::release(client, &leader_config).await {
            tracing::warn!(error = %e, "could not release the leader lease; it will expire");
        }
    }
    running.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

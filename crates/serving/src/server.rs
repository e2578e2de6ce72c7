//! `confighash serve`: the webhook over TLS and the admin port, with graceful shutdown.
//!
//! Every connection to the webhook port is bounded in time and in number ([`Limits`]):
//!
//! - at most [`Limits::max_connections`] are served at once; further ones are not accepted (they
//!   wait in the listen backlog) until one closes; `confighash_webhook_connections` and
//!   `confighash_webhook_connection_limit_reached_total` show it. With a client CA
//!   ([`ServeConfig::client_ca`]) the slots are split instead: see [`Limits::max_connections`];
//! - from accept, the TLS handshake, the protocol detection (HTTP/2 preface or HTTP/1.1) and the
//!   first complete request head must all arrive within [`ServeConfig::header_read_timeout`];
//!   later HTTP/1.1 request heads, and the idle time between HTTP/1.1 requests, are bounded by the
//!   idle limit below (kube-apiserver keeps idle webhook connections for 90 s and reuses them:
//!   closing one sooner races its next review);
//! - each request must be answered within [`Limits::request_timeout`] (the router enforces its
//!   own bounds on reading the body);
//! - a connection with no request in flight for [`Limits::idle_timeout`] is closed gracefully
//!   (HTTP/2: GOAWAY), and HTTP/2 peers must answer keep-alive pings.
//!
//! The admin port is served by the same machinery over plain HTTP, with its own smaller bounds
//! ([`AdminLimits`]), so that neither port can use up the file descriptors the other needs
//! ([`open_files`]).

mod connection;
mod limits;
mod listen;
mod open_files;
mod pool;

use confighash_metrics::throttle::Throttle;
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

use axum::Router;
use confighash_metrics::Metrics;

use crate::health::{self, Health};
use crate::held;
use crate::tls::{CertStore, ClientCaStore};

use connection::serve_connection;
pub use limits::{
    API_SERVER_IDLE, AdminLimits, DEFAULT_ADMIN_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS, Limits,
    reserved_connections,
};
pub use listen::{ipv4_fallback, listen};
pub use open_files::{
    Fit, NoRoom, OpenFileLimit, RESERVED_FILES, fit_max_connections, open_file_limit,
    raise_open_file_limit,
};
use pool::{EvictingPool, Ticket, evicted};

/// A request must be answered within this from its request head, by default
/// ([`Limits::request_timeout`]).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything a running server needs.
pub struct ServeConfig {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub certs: Arc<CertStore>,
    /// With a CA, the webhook requires a client certificate it signed (`--client-ca-file`), and
    /// connections that present one get slots of their own ([`Limits::max_connections`]).
    pub client_ca: Option<Arc<ClientCaStore>>,
    /// What the webhook port serves: one router, its requests bounded by
    /// [`Limits::request_timeout`] here and by whatever else the router itself enforces.
    pub router: Router,
    /// What every part records into; the admin port serves it.
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    /// How often the certificate files (and the client CA) are re-read.
    pub cert_poll: Duration,
    /// From accept, the TLS handshake and the first complete request head (HTTP/1.1 or HTTP/2)
    /// must arrive within this, or the connection is closed. Also bounds each later HTTP/1.1
    /// request head and the idle time between HTTP/1.1 requests.
    pub header_read_timeout: Duration,
    /// How long in-flight requests get to finish at shutdown.
    pub drain_timeout: Duration,
}

/// HTTP/2 flow-control windows: what one connection (and one stream) may have sent that the
/// webhook has not read yet. The API server multiplexes its calls on one connection, so a small
/// connection window throttles it: at 64/128 KiB an open loop of 1,000 reviews of 21 KiB/s had a
/// p99 of 239 ms against 2.4 ms at 1 MiB (benches/webhook_tls.rs). Review bodies are read as they
/// arrive and counted in the review memory, so what a window lets a client park is short-lived.
/// The admin port takes no bodies and keeps the protocol's default windows.
const H2_STREAM_WINDOW: u32 = 1024 * 1024;
const H2_CONNECTION_WINDOW: u32 = 1024 * 1024;
/// Streams open at once on one HTTP/2 connection to the admin port.
const ADMIN_H2_STREAMS: u32 = 8;
/// HTTP/1.1 read buffer: the largest request head, and the most of a body read ahead.
const H1_MAX_BUF: usize = 64 * 1024;
/// How much longer than the request timeout a connection closed for idleness may take to close.
const CLOSE_SLACK: Duration = Duration::from_secs(1);
/// The admin port's answers are ready at once: a connection closed for idleness gets this long
/// to send what it has.
const ADMIN_CLOSE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long an answer that is made may wait for its client to take it before its connection is
/// closed. kube-apiserver reads its answers as they come (a 1 MiB window holds a thousand of
/// them); only a client that keeps its window shut, or stops reading its socket, waits this long.
const UNSENT_AFTER_MADE: Duration = Duration::from_secs(2);

/// A started server.
pub struct Running {
    pub webhook_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub health: Arc<Health>,
    stop: watch::Sender<bool>,
    stop_admin: watch::Sender<bool>,
    webhook_task: JoinHandle<()>,
    admin_task: JoinHandle<()>,
    reload_tasks: Vec<JoinHandle<()>>,
    open: Arc<AtomicUsize>,
    admin_open: Arc<AtomicUsize>,
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

/// The tasks that reload the serving certificate, and the client CA if there is one, when they
/// change on disk.
fn reload_tasks(config: &ServeConfig, metrics: &Arc<Metrics>) -> Vec<JoinHandle<()>> {
    let mut tasks = vec![{
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
    }];
    if let Some(ca) = &config.client_ca {
        let path = ca.path().to_owned();
        tasks.push(tokio::spawn(ca.clone().poll(
            config.cert_poll,
            move |result| match result {
                Ok(false) => {}
                Ok(true) => tracing::info!(path = %path.display(), "loaded a new client CA"),
                Err(e) => tracing::error!(
                    error = %e,
                    "the new client CA cannot be used; the old one stays in service"
                ),
            },
        )));
    }
    tasks
}

/// How the webhook port admits connections. Without a client CA one pool, where new
/// connections wait in the backlog; with one, a handshake pool that makes room for new
/// connections and a pool reserved for connections with a valid client certificate.
fn webhook_admission(
    max_connections: usize,
    client_ca: bool,
) -> (Admission, Option<Arc<Semaphore>>) {
    if client_ca {
        let (handshakes, reserved) = reserved_connections(max_connections);
        (
            Admission::Evict(EvictingPool::new(handshakes)),
            Some(Arc::new(Semaphore::new(reserved))),
        )
    } else {
        (
            Admission::Queue {
                slots: Arc::new(Semaphore::new(max_connections)),
                max_connections,
            },
            None,
        )
    }
}

/// Binds both ports and starts serving within `limits`.
pub async fn start_with(config: ServeConfig, limits: Limits) -> Result<Running, ServeError> {
    let bind =
        |addr: SocketAddr| listen(addr).map_err(|source| ServeError::Listen { addr, source });
    let listener = bind(config.listen)?;
    let admin_listener = bind(config.admin_listen)?;
    let webhook_addr = listener.local_addr().unwrap_or(config.listen);
    let admin_addr = admin_listener.local_addr().unwrap_or(config.admin_listen);
    let (stop, stopped) = watch::channel(false);
    let (stop_admin, admin_stopped) = watch::channel(false);

    let metrics = config.metrics.clone();
    metrics.set_cert_expiry(config.certs.not_after());
    config.health.set_certificate_loaded();
    let reload_tasks = reload_tasks(&config, &metrics);
    let max_connections = limits.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let open = Arc::new(AtomicUsize::new(0));
    let acceptor = TlsAcceptor::from(Arc::new(
        config.certs.server_config_with(config.client_ca.as_ref()),
    ));
    let (admission, reserved) = webhook_admission(max_connections, config.client_ca.is_some());
    let webhook_task = tokio::spawn(serve_port(
        Port {
            name: "webhook",
            listener,
            at_cap: match admission {
                Admission::Queue { .. } => "new connections wait until one closes",
                Admission::Evict(_) => {
                    "the connection longest in its TLS handshake was closed to make room"
                }
            },
            admission,
            open: open.clone(),
            metrics: Some(metrics.clone()),
        },
        Connections {
            security: Security::Tls { acceptor, reserved },
            router: config.router,
            builder: http_builder(
                config.header_read_timeout,
                limits.idle_timeout,
                &H2Settings {
                    keep_alive_interval: limits.http2_keep_alive_interval,
                    keep_alive_timeout: limits.http2_keep_alive_timeout,
                    max_concurrent_streams: limits.http2_max_concurrent_streams,
                    windows: Some((H2_STREAM_WINDOW, H2_CONNECTION_WINDOW)),
                },
            ),
            header_read_timeout: config.header_read_timeout,
            idle_timeout: limits.idle_timeout,
            close_timeout: limits.request_timeout + CLOSE_SLACK,
            answer_deadline: limits.request_timeout + CLOSE_SLACK,
            metrics: Some(metrics.clone()),
            unsent_log: unsent_log(),
            error_log: error_log(),
        },
        config.drain_timeout,
        stopped,
    ));

    let admin_limits = limits.admin;
    let admin_open = Arc::new(AtomicUsize::new(0));
    let admin_task = tokio::spawn(serve_port(
        Port {
            name: "admin",
            listener: admin_listener,
            admission: Admission::Evict(EvictingPool::new(admin_limits.max_connections)),
            at_cap: "the oldest connection was closed to make room",
            open: admin_open.clone(),
            metrics: None,
        },
        Connections {
            security: Security::Plain,
            router: health::router(config.health.clone(), metrics),
            builder: http_builder(
                admin_limits.header_read_timeout,
                admin_limits.idle_timeout,
                &H2Settings {
                    keep_alive_interval: limits.http2_keep_alive_interval,
                    keep_alive_timeout: limits.http2_keep_alive_timeout,
                    max_concurrent_streams: ADMIN_H2_STREAMS,
                    windows: None,
                },
            ),
            header_read_timeout: admin_limits.header_read_timeout,
            idle_timeout: admin_limits.idle_timeout,
            close_timeout: ADMIN_CLOSE_TIMEOUT,
            answer_deadline: DEFAULT_REQUEST_TIMEOUT + CLOSE_SLACK,
            metrics: None,
            unsent_log: unsent_log(),
            error_log: error_log(),
        },
        config.drain_timeout,
        admin_stopped,
    ));
    Ok(Running {
        webhook_addr,
        admin_addr,
        health: config.health,
        stop,
        stop_admin,
        webhook_task,
        admin_task,
        reload_tasks,
        open,
        admin_open,
    })
}

impl Running {
    /// Connections of the webhook port open now (TLS handshakes included).
    pub fn connections(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Connections of the admin port open now.
    pub fn admin_connections(&self) -> usize {
        self.admin_open.load(Ordering::Relaxed)
    }

    /// Stops being ready, stops accepting, lets in-flight requests finish (bounded), and stops.
    /// The admin port answers (`/readyz` with 503) until the webhook has drained.
    pub async fn shutdown(self) {
        self.health.set_shutting_down();
        let _ = self.stop.send(true);
        let _ = self.webhook_task.await;
        let _ = self.stop_admin.send(true);
        let _ = self.admin_task.await;
        for task in self.reload_tasks {
            task.abort();
        }
    }
}

/// A port's HTTP/2 settings.
struct H2Settings {
    keep_alive_interval: Duration,
    keep_alive_timeout: Duration,
    max_concurrent_streams: u32,
    /// Flow-control windows (stream, connection); `None`: the protocol's defaults.
    windows: Option<(u32, u32)>,
}

/// `idle_timeout` bounds the wait for every HTTP/1.1 request head after the first (whose bound is
/// [`serve_connection`]'s header deadline): [`drive`]'s idle timer closes the connection
/// gracefully at `idle_timeout`, before hyper's own header timer (set later here) could end it
/// with an error.
fn http_builder(
    header_read_timeout: Duration,
    idle_timeout: Duration,
    h2: &H2Settings,
) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        // hyper restarts this timer whenever a connection waits for a request head, idle time
        // between requests included.
        .header_read_timeout(idle_timeout + header_read_timeout)
        .max_buf_size(H1_MAX_BUF);
    let mut http2 = builder.http2();
    http2
        .timer(TokioTimer::new())
        .keep_alive_interval(h2.keep_alive_interval)
        .keep_alive_timeout(h2.keep_alive_timeout)
        .max_concurrent_streams(h2.max_concurrent_streams);
    if let Some((stream, connection)) = h2.windows {
        http2
            .initial_stream_window_size(stream)
            .initial_connection_window_size(connection);
    }
    builder
}

/// A listening port and its connection slots.
struct Port {
    /// For logs: `webhook` or `admin`.
    name: &'static str,
    listener: TcpListener,
    admission: Admission,
    /// For the log: what happens to new connections at the cap.
    at_cap: &'static str,
    /// Connections open now, on this server ([`Running::connections`]).
    open: Arc<AtomicUsize>,
    /// The webhook's count for `/metrics`; the metrics may be shared by servers (as across a
    /// restart).
    metrics: Option<Arc<Metrics>>,
}

/// How a port keeps to its cap.
enum Admission {
    /// At the cap no connection is accepted until one closes: new ones wait in the backlog.
    Queue {
        slots: Arc<Semaphore>,
        max_connections: usize,
    },
    /// Every connection is accepted; at the cap the oldest member is closed to make room.
    Evict(Arc<EvictingPool>),
}

impl Admission {
    fn max_connections(&self) -> usize {
        match self {
            Admission::Queue {
                max_connections, ..
            } => *max_connections,
            Admission::Evict(pool) => pool.capacity(),
        }
    }
}

/// Waits for a slot of a queue; never for an evicting pool, which needs none.
async fn queue_slot(admission: &Admission) -> Option<OwnedSemaphorePermit> {
    match admission {
        Admission::Queue { slots, .. } => slots.clone().acquire_owned().await.ok(),
        Admission::Evict(_) => std::future::pending().await,
    }
}

/// An accepted connection, counted until dropped; on a queue, its slot.
struct Slot {
    _permit: Option<OwnedSemaphorePermit>,
    open: Arc<AtomicUsize>,
    metrics: Option<Arc<Metrics>>,
}

impl Slot {
    fn new(
        permit: Option<OwnedSemaphorePermit>,
        open: Arc<AtomicUsize>,
        metrics: Option<Arc<Metrics>>,
    ) -> Self {
        open.fetch_add(1, Ordering::Relaxed);
        if let Some(metrics) = &metrics {
            metrics.connection(true);
        }
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
        if let Some(metrics) = &self.metrics {
            metrics.connection(false);
        }
    }
}

/// How a port's connections begin before HTTP.
#[derive(Clone)]
enum Security {
    /// Plain HTTP (the admin port).
    Plain,
    /// A TLS handshake first (the webhook). With `reserved`, the handshake requires a client
    /// certificate, and a connection that completes it moves to those slots.
    Tls {
        acceptor: TlsAcceptor,
        reserved: Option<Arc<Semaphore>>,
    },
}

/// What each connection of a port is served with.
#[derive(Clone)]
struct Connections {
    security: Security,
    router: axum::Router,
    builder: auto::Builder<TokioExecutor>,
    header_read_timeout: Duration,
    idle_timeout: Duration,
    /// How long a connection asked to close because idle may take: what is in flight must be
    /// answered and, on HTTP/2, a ping answered.
    close_timeout: Duration,
    /// From a request's head, its answer must be sent in full within this, or its connection is
    /// closed.
    answer_deadline: Duration,
    metrics: Option<Arc<Metrics>>,
    /// The warnings for connections closed with answers unsent, and for connections that ended
    /// in a protocol error (the HTTP/2 library's own warnings are filtered out), rate-limited.
    unsent_log: Arc<RateLog>,
    error_log: Arc<RateLog>,
}

fn unsent_log() -> Arc<RateLog> {
    Arc::new(RateLog::new(
        "closed connections whose answers were still unsent at their deadline (the client did not read them)",
    ))
}

fn error_log() -> Arc<RateLog> {
    Arc::new(RateLog::new(
        "connections ended with an error (HTTP/2 streams reset too often, a malformed frame, a reset connection)",
    ))
}

/// A warning about connections logged at most once a minute, with how many since the last
/// line: a client can make one a millisecond.
struct RateLog {
    what: &'static str,
    throttle: Throttle,
}

impl RateLog {
    fn new(what: &'static str) -> Self {
        RateLog {
            what,
            throttle: Throttle::default(),
        }
    }

    fn record(&self, peer: SocketAddr) {
        if let Some(held) = self.throttle.allow() {
            tracing::warn!(%peer, connections = held + 1, "{}", self.what);
        }
    }
}

async fn serve_port(
    port: Port,
    connections: Connections,
    drain_timeout: Duration,
    mut stopped: watch::Receiver<bool>,
) {
    let Port {
        name,
        listener,
        admission,
        at_cap,
        open,
        metrics,
    } = port;
    let max_connections = admission.max_connections();
    let mut tasks = JoinSet::new();
    // Each connection gets its own receiver, to finish when the server stops.
    let stop_connections = stopped.clone();
    // On a queue, a slot first, then a connection: at the cap, new connections stay in the
    // listen backlog.
    let mut slot: Option<OwnedSemaphorePermit> = None;
    let mut cap = CapLog::new(name, at_cap);
    loop {
        if let Admission::Queue { slots, .. } = &admission
            && slot.is_none()
        {
            match slots.clone().try_acquire_owned() {
                Ok(permit) => slot = Some(permit),
                Err(_) => {
                    if let Some(metrics) = &metrics {
                        metrics.connection_limit_reached();
                    }
                    cap.reached(max_connections);
                }
            }
        }
        let waiting = matches!(admission, Admission::Queue { .. }) && slot.is_none();
        tokio::select! {
            () = stop_requested(&mut stopped) => break,
            Some(joined) = tasks.join_next() => {
                if let Err(e) = joined
                    && e.is_panic()
                {
                    tracing::error!(port = name, error = %e, "a connection task panicked");
                }
            }
            permit = queue_slot(&admission), if waiting => slot = permit,
            accepted = listener.accept(), if !waiting => match accepted {
                Ok((tcp, peer)) => {
                    let accepted_at = Instant::now();
                    // Small request/response exchanges: Nagle's algorithm would hold replies
                    // back waiting for the client's delayed ACK.
                    if let Err(e) = tcp.set_nodelay(true) {
                        tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
                    }
                    let ticket = match &admission {
                        Admission::Queue { .. } => None,
                        Admission::Evict(pool) => {
                            let (ticket, full) = pool.admit();
                            if full {
                                if let Some(metrics) = &metrics {
                                    metrics.connection_limit_reached();
                                }
                                cap.reached(max_connections);
                            }
                            Some(ticket)
                        }
                    };
                    let slot = Slot::new(slot.take(), open.clone(), metrics.clone());
                    tasks.spawn(serve_connection(
                        connections.clone(),
                        tcp,
                        peer,
                        accepted_at,
                        stop_connections.clone(),
                        slot,
                        ticket,
                    ));
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(port = name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    drop(slot);
    // Every connection was told to finish (see `drive`); wait for them, bounded.
    let drained = tokio::time::timeout(drain_timeout, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            port = name,
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

/// Logs that a port's connection limit was reached, at most once per [`CAP_LOG_INTERVAL`].
struct CapLog {
    port: &'static str,
    /// What happens at the cap.
    then: &'static str,
    throttle: Throttle,
}

impl CapLog {
    fn new(port: &'static str, then: &'static str) -> Self {
        CapLog {
            port,
            then,
            throttle: Throttle::default(),
        }
    }

    fn reached(&mut self, max_connections: usize) {
        let Some(held) = self.throttle.allow() else {
            return;
        };
        tracing::warn!(
            port = self.port,
            max_connections,
            times = held + 1,
            "connection limit reached; {}",
            self.then
        );
    }
}

#[cfg(test)]
mod tests;

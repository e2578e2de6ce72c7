//! Bounds on the two ports' connections and requests, and their defaults.

use std::time::Duration;

use super::DEFAULT_REQUEST_TIMEOUT;

/// Bounds on the two ports' connections and requests; [`Limits::default`] is what
/// `confighash serve` uses (with `--max-connections`, lowered to fit the open-file limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Webhook connections served at once (TLS handshakes included). At least 1.
    ///
    /// Without a client CA, at the cap no connection is accepted until one closes: new ones wait
    /// in the listen backlog, so whoever holds every slot (handshakes that never finish,
    /// connections kept busy) makes everyone else wait.
    ///
    /// With a client CA ([`ServeConfig::client_ca`]) a connection that has not finished its
    /// handshake has not shown a certificate, and once it has, it has shown a valid one (the
    /// handshake fails otherwise). So the slots are split ([`reserved_connections`]):
    /// - handshakes in progress take a slot of the *handshake pool*. Accepting never stops: when
    ///   that pool is full, the connection that has been in its handshake longest is closed to
    ///   make room. A handshake of the API server takes a round trip or two, so to push it out
    ///   others must open a whole pool's worth of connections within those milliseconds;
    /// - a connection whose handshake verified its client certificate moves to the *reserved
    ///   pool*, which nothing else can take. When it is full, the connection waits (still in the
    ///   handshake pool) until a slot frees or its first-request deadline passes.
    pub max_connections: usize,
    /// A review must be received (body included) and answered within this from its request
    /// head: a slower body gets 408, a slower answer 503.
    pub request_timeout: Duration,
    /// A connection with no request in flight for this long is closed gracefully (HTTP/2:
    /// GOAWAY, so the client retries nothing; HTTP/1.1: closed between requests, without an
    /// error). Longer than the API server keeps an idle connection ([`API_SERVER_IDLE`]), so
    /// that it is the client that closes an idle connection, never the server just as the client
    /// sends a review on it.
    pub idle_timeout: Duration,
    /// How often an HTTP/2 connection is pinged.
    pub http2_keep_alive_interval: Duration,
    /// An HTTP/2 connection whose ping is not answered within this is closed.
    pub http2_keep_alive_timeout: Duration,
    /// Streams (requests) open at once on one HTTP/2 connection.
    pub http2_max_concurrent_streams: u32,
    /// The admin port's bounds.
    pub admin: AdminLimits,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            idle_timeout: API_SERVER_IDLE + Duration::from_secs(30),
            http2_keep_alive_interval: Duration::from_secs(20),
            http2_keep_alive_timeout: Duration::from_secs(10),
            http2_max_concurrent_streams: 100,
            admin: AdminLimits::default(),
        }
    }
}

/// With a client CA, how [`Limits::max_connections`] is split: (handshake pool, reserved pool for
/// connections that showed a valid client certificate). Half each, the reserved pool taking the
/// odd one; at least one each.
pub fn reserved_connections(max_connections: usize) -> (usize, usize) {
    let reserved = max_connections.div_ceil(2).max(1);
    (max_connections.saturating_sub(reserved).max(1), reserved)
}

/// Bounds on the plain-HTTP admin port (`/livez`, `/readyz`, `/metrics`).
///
/// What must keep working there are kubelet's probes, under any load of other clients. A probe
/// opens a new TCP connection every time (kubelet's HTTP prober disables keep-alive), sends one
/// `GET` at once, and fails if the answer has not come within the probe's `timeoutSeconds`
/// (1 s by default, and in `deploy/`); failed liveness probes restart the pod, failed readiness
/// probes take it out of the webhook's Service. So a probe needs a slot *at once*, not after the
/// connections ahead of it in the listen backlog. The admin port therefore never stops
/// accepting: at [`AdminLimits::max_connections`] the connection admitted longest ago is closed
/// to make room for the new one. A probe is answered within a millisecond or so of its
/// connection; to push it out before that, a flood must open `max_connections` connections in
/// that time. Every connection is also cut off when its first request head is not complete
/// within [`AdminLimits::header_read_timeout`], and when idle (below), so the slots of an
/// abandoned flood come back by themselves too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdminLimits {
    /// Connections open at once; at the cap the oldest is closed to make room. At least 1.
    pub max_connections: usize,
    /// From accept, the first complete request head must arrive within this; also each later
    /// HTTP/1.1 request head, and so the idle time between HTTP/1.1 requests.
    pub header_read_timeout: Duration,
    /// An HTTP/2 connection with no request in flight for this long is closed gracefully.
    pub idle_timeout: Duration,
}

impl Default for AdminLimits {
    fn default() -> Self {
        AdminLimits {
            max_connections: DEFAULT_ADMIN_MAX_CONNECTIONS,
            header_read_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
        }
    }
}

/// The default of `--max-connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Connections the admin port holds at once: probes and a few scrapers need a handful.
pub const DEFAULT_ADMIN_MAX_CONNECTIONS: usize = 64;

/// How long kube-apiserver keeps an idle connection to a webhook: its webhook clients take
/// Go's default transport's `IdleConnTimeout` (`k8s.io/apimachinery/pkg/util/net`
/// `SetTransportDefaults`, used by `k8s.io/apiserver/pkg/util/webhook`).
pub const API_SERVER_IDLE: Duration = Duration::from_secs(90);

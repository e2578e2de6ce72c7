//! `confighash serve`'s two ports: the webhook's router ([`admission`]) served by the hardened
//! server of the serving crate, with the memory the reviews share ([`ReviewLimits`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use confighash_serving::health::Health;
use confighash_serving::server as serving;
use confighash_serving::tls::{CertStore, ClientCaStore};

use crate::admission::{self, ReviewLimits, Webhook};

// The server's own names (its limits, errors, listening and open-file helpers) are reached at
// `confighash_serving::server`; this module adds only what serving the webhook takes.
use serving::ServeError;

/// Everything a running webhook needs.
pub struct WebhookServeConfig {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub certs: Arc<CertStore>,
    /// With a CA, the webhook requires a client certificate it signed (`--client-ca-file`), and
    /// connections that present one get slots of their own
    /// ([`Limits::max_connections`](serving::Limits::max_connections)).
    pub client_ca: Option<Arc<ClientCaStore>>,
    pub webhook: Arc<Webhook>,
    pub health: Arc<Health>,
    /// How often the certificate files (and the client CA) are re-read.
    pub cert_poll: Duration,
    /// From accept, the TLS handshake and the first complete request head must arrive within
    /// this ([`serving::ServeConfig::header_read_timeout`]).
    pub header_read_timeout: Duration,
    /// How long in-flight requests get to finish at shutdown.
    pub drain_timeout: Duration,
}

/// The connection bounds of both ports, and the memory the reviews may hold at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WebhookLimits {
    pub connections: serving::Limits,
    /// Memory reviews may hold at once, all connections together: their body buffers, what
    /// parsing them takes, and an allowance each ([`ReviewLimits`]). A review that finds no room
    /// gets 503. At least [`admission::MIN_REVIEW_MEMORY`].
    pub review_memory: usize,
}

impl Default for WebhookLimits {
    fn default() -> Self {
        WebhookLimits {
            connections: serving::Limits::default(),
            review_memory: admission::DEFAULT_REVIEW_MEMORY,
        }
    }
}

/// A started webhook: the server, and the review budget it serves with.
pub struct RunningWebhook {
    server: serving::Running,
    #[cfg(feature = "testkit")]
    reviews: ReviewLimits,
}

impl std::ops::Deref for RunningWebhook {
    type Target = serving::Running;

    fn deref(&self) -> &serving::Running {
        &self.server
    }
}

impl RunningWebhook {
    /// Bytes of the review memory budget ([`WebhookLimits::review_memory`]) held now.
    #[cfg(feature = "testkit")]
    pub fn review_memory_in_use(&self) -> usize {
        self.reviews.memory_in_use()
    }

    /// Stops being ready, stops accepting, lets in-flight reviews finish (bounded), and stops
    /// ([`serving::Running::shutdown`]).
    pub async fn shutdown(self) {
        self.server.shutdown().await;
    }
}

/// Binds both ports and starts serving, with the default [`WebhookLimits`].
pub async fn start(config: WebhookServeConfig) -> Result<RunningWebhook, ServeError> {
    start_with(config, WebhookLimits::default()).await
}

/// Binds both ports and starts serving within `limits`.
pub async fn start_with(
    config: WebhookServeConfig,
    limits: WebhookLimits,
) -> Result<RunningWebhook, ServeError> {
    let reviews = ReviewLimits::new(limits.connections.request_timeout, limits.review_memory);
    let server = serving::start_with(
        serving::ServeConfig {
            listen: config.listen,
            admin_listen: config.admin_listen,
            certs: config.certs,
            client_ca: config.client_ca,
            router: admission::router_with(config.webhook.clone(), reviews.clone()),
            metrics: config.webhook.metrics().clone(),
            health: config.health,
            cert_poll: config.cert_poll,
            header_read_timeout: config.header_read_timeout,
            drain_timeout: config.drain_timeout,
        },
        limits.connections,
    )
    .await?;
    Ok(RunningWebhook {
        server,
        #[cfg(feature = "testkit")]
        reviews,
    })
}

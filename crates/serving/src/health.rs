//! The plain-HTTP admin port: `/livez`, `/readyz` and `/metrics`.
//!
//! Readiness is the webhook's own: a serving certificate is loaded and the process is not
//! shutting down. Cache sync and leadership are not conditions (they are metrics), so a restart
//! never leaves the webhook out of its Service.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use confighash_metrics::Metrics;

/// What `/readyz` reports.
#[derive(Debug, Default)]
pub struct Health {
    certificate_loaded: AtomicBool,
    shutting_down: AtomicBool,
}

impl Health {
    pub fn set_certificate_loaded(&self) {
        self.certificate_loaded.store(true, Ordering::SeqCst);
    }

    pub fn set_shutting_down(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    pub fn is_ready(&self) -> bool {
        self.certificate_loaded.load(Ordering::SeqCst) && !self.shutting_down.load(Ordering::SeqCst)
    }

    fn why_not_ready(&self) -> &'static str {
        if self.shutting_down.load(Ordering::SeqCst) {
            "shutting down\n"
        } else {
            "no serving certificate loaded\n"
        }
    }
}

#[derive(Clone)]
struct AdminState {
    health: Arc<Health>,
    metrics: Arc<Metrics>,
}

/// The admin router.
pub fn router(health: Arc<Health>, metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(AdminState { health, metrics })
}

async fn readyz(State(s): State<AdminState>) -> Response {
    if s.health.is_ready() {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, s.health.why_not_ready()).into_response()
    }
}

async fn metrics_text(State(s): State<AdminState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
        .into_response()
}

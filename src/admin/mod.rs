//! The admin port's content: liveness and readiness, and the Prometheus metrics every part
//! records into.
//!
//! Must not reach: the API server. Metrics carry counts and names of outcomes, never object
//! names from a review or any config content.
//!
//! As paths, checked by [`crate::contracts`]: no `crate::app`, `crate::certs`, `crate::cli`,
//! `crate::cluster`, `crate::explain`, `crate::offline`, `crate::watcher`, `crate::webhook`.

pub mod health;
pub mod metrics;

//! The hardened HTTPS server for one router: the webhook port over TLS and the plain admin port,
//! each with its connection slots and pools, deadlines, HTTP/2 windows and graceful drain
//! ([`server`]); the serving certificate and client CA, re-read from disk ([`tls`]); the admin
//! port's health and metrics routes ([`health`]); bodies that hold a resource until sent
//! ([`held`]).
//!
//! It knows nothing of admission reviews: the webhook crate hands it a router. Its Cargo.toml
//! keeps it so: of confighash's crates it depends on the metrics alone, and it has no Kubernetes
//! client.

pub mod health;
pub mod held;
pub mod server;
pub mod tls;

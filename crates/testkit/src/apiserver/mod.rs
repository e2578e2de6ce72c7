//! An in-memory Kubernetes API server for end-to-end tests.
//!
//! It serves the REST subset confighash uses to a real `kube::Client` over HTTP on loopback, runs
//! the mutating admission chain against webhooks over HTTPS, and counts rollouts. Each part says
//! which Kubernetes behaviour it mimics.

pub mod admission;
pub mod https;
pub mod managed;
pub mod patches;
pub mod rbac;
pub mod resources;
pub mod schema;
pub mod selectors;
pub mod server;
pub mod store;
pub mod testwebhook;
pub mod user;

pub use https::HttpsClient;
pub use server::{ApiServer, Options};
pub use testwebhook::{ServingPair, TestCa, TestCerts, TestWebhook};

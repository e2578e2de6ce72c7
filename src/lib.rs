//! confighash: roll Kubernetes workloads when the ConfigMaps and Secrets they use change.
//!
//! One folder per part; each part's `mod.rs` says what it does and what it must not reach:
//!
//! - [`core`]: reference discovery, the checksum recipe, the stamp rules, the patch and the
//!   contract's names. Pure: no Kubernetes client, no clock, no I/O. Every other part calls it.
//! - [`offline`]: `confighash stamp`, the core over YAML files.
//! - [`explain`]: `confighash explain`, the core over what the live cluster shows.
//! - [`webhook`]: the mutating admission webhook: reviews, lookups, TLS and the connection limits.
//! - [`watcher`]: re-touches workloads when their config changes; leader election.
//! - [`certs`]: the stamp key and the webhook's certificates.
//! - [`admin`]: the admin port (health) and the metrics.
//! - [`cluster`]: the Kubernetes client every part that talks to the API server uses, and the
//!   redaction of what it answers.
//! - [`app`]: the composition root: `confighash serve` wired from its configuration.
//! - [`cli`]: the command line.

pub mod admin;
pub mod app;
pub mod certs;
pub mod cli;
pub mod cluster;
pub mod contracts;
pub mod core;
pub mod explain;
pub mod offline;
pub mod watcher;
pub mod webhook;

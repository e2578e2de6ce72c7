//! confighash: roll Kubernetes workloads when the ConfigMaps and Secrets they use change.
//!
//! The binary crate: the command line and what only it does. The parts are crates of their own
//! under `crates/` (docs/development.md has the map), re-exported here under their short names:
//!
//! - [`core`]: reference discovery, the checksum recipe, the stamp rules, the patch and the
//!   contract's names. Pure: no Kubernetes client, no clock, no I/O. Every other part calls it.
//! - [`cluster`]: the Kubernetes client every part that talks to the API server uses, and the
//!   redaction of what it answers.
//! - [`metrics`]: the Prometheus metrics every part records into.
//! - [`serving`]: the hardened HTTPS server for one router, and the admin port.
//! - [`webhook`]: the mutating admission webhook: reviews, lookups, the decision, the patch.
//! - [`watcher`]: re-touches workloads when their config changes; leader election.
//!
//! And in this crate:
//!
//! - [`offline`]: `confighash stamp`, the core over YAML files.
//! - [`explain`]: `confighash explain`, the core over what the live cluster shows.
//! - [`certs`]: the stamp key and the webhook's certificates.
//! - [`app`]: the composition root: `confighash serve` wired from its configuration.
//! - [`cli`]: the command line.

pub use confighash_cluster as cluster;
pub use confighash_core as core;
pub use confighash_metrics as metrics;
pub use confighash_serving as serving;
pub use confighash_watcher as watcher;
pub use confighash_webhook as webhook;

pub mod app;
pub mod certs;
pub mod cli;
pub mod explain;
pub mod offline;

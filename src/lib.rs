//! confighash: roll Kubernetes workloads when the ConfigMaps and Secrets they use change.
//!
//! The pure core (reference discovery, the checksum recipe, the stamp rules and the patch) has no
//! Kubernetes client in it; the webhook, the watcher and the offline `stamp` command all call it.

pub mod admin;
pub mod admission;
pub mod certs;
pub mod checksum;
pub mod cli;
pub mod client;
pub mod index;
pub mod key;
pub mod leader;
pub mod lookup;
pub mod memory;
pub mod metrics;
pub mod offline;
pub mod pace;
pub mod patch;
pub mod redact;
pub mod refs;
pub mod rules;
pub mod selfsigned;
pub mod serve;
pub mod tls;
pub mod watcher;
pub mod workload;

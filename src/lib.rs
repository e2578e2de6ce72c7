//! confighash: roll Kubernetes workloads when the ConfigMaps and Secrets they use change.
//!
//! The pure core (reference discovery, the checksum recipe, the stamp rules and the patch) has no
//! Kubernetes client in it; the webhook, the watcher and the offline `stamp` command all call it.

pub mod checksum;
pub mod cli;
pub mod offline;
pub mod patch;
pub mod refs;
pub mod rules;
pub mod workload;

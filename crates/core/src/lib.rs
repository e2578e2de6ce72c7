//! The core: what a pod template references, the checksum over it, when a stamp changes, and the
//! patch that writes it. Shared by the webhook, the watcher and offline stamping, so the three
//! can never disagree.
//!
//! Must not reach: a Kubernetes client, the network, the file system, a clock or a task runtime.
//! Everything here is a function of its arguments and is tested without a cluster. Its
//! Cargo.toml keeps it so: no kube, no tokio, no other confighash crate.

#![forbid(unsafe_code)]

pub mod checksum;
pub mod json;
pub mod kind;
pub mod names;
pub mod patch;
pub mod record;
pub mod refs;
pub mod rules;
pub mod workload;

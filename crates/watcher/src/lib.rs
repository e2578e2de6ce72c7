//! The watcher: when the content of a ConfigMap or Secret changes, re-touch every workload that
//! references it, so the API server sends it through the webhook again.
//!
//! Two halves. [`state`] is a state machine with no client, clock or task inside: the digest
//! store and workload index ([`index`]), the change window and pacing ([`pace`]), the flap guard
//! ([`flap`]), the decisions
//! by the core's rules, touches pending and in flight, retries, Events and namespace lists, all
//! as [`Input`]s in and [`Effect`]s out at instants it is given. [`run()`] is its shell: watch
//! tasks turn API events into inputs (through the one adapter of
//! [`cluster::watch`](confighash_cluster::watch)), one task owns the state, carries out its effects
//! (patches, Events, lists) and feeds their results back. Only the leader touches
//! ([`leader`]); every replica watches, so a new leader starts with warm caches.
//!
//! Must not reach: the webhook's code (the two agree only through the core's rules) or the content
//! of any object beyond its digests. Its Cargo.toml keeps the first: of confighash's crates it
//! depends on the core, the cluster edge and the metrics.

use confighash_cluster::client::{Reads, Resource};

/// What the watcher reads through the client: the config it digests, namespaces, the workloads
/// it touches, the Events it records, the Lease of its election and the pods of the workloads a
/// progressive wave judges.
pub const READS: Reads = Reads::of(&[
    Resource::ConfigMaps,
    Resource::Secrets,
    Resource::Namespaces,
    Resource::Events,
    Resource::Leases,
    Resource::Workloads,
    Resource::Pods,
]);

pub mod flap;
pub mod index;
pub mod leader;
pub mod memory;
pub mod pace;
pub mod pod_watch;
pub mod pods;
pub mod rollout;
mod run;
pub mod state;

// What a caller needs to run the watcher; the rest is reached by its module's path
// (`state::TOUCH_BURST`), and the names users see by the core's (`confighash_core::names`).
pub use run::{SECRET_PAGE_SIZE, run, run_with_secret_page_size};
pub use state::{ConfigSource, Effect, Input, State, WatcherConfig};

//! The mutating admission webhook: a review in, the objects it references looked up, the core's
//! decision, the stamp patch out ([`admission`], [`lookup`], [`pruned`]); the memory the reviews
//! share ([`budget`]); and [`server`], which hands that router to the hardened server.
//!
//! Every field of a review is attacker input: it is validated before it reaches a request path,
//! a log line or a loop bound. It only reads the API server, never writes. Its Cargo.toml keeps
//! it apart from the watcher: the two agree only through the core's rules.

#![forbid(unsafe_code)]

use confighash_cluster::client::{Reads, Resource};

/// What the webhook reads: the ConfigMaps and Secrets a review references (through the lean
/// getter, which reads the bodies itself; through the client when a proxy is configured).
pub const READS: Reads = Reads::of(&[Resource::ConfigMaps, Resource::Secrets]);

pub mod admission;
pub mod budget;
pub mod lookup;
pub mod pruned;
pub mod server;

//! The mutating admission webhook: decoding a review, looking up the objects it references,
//! answering with the stamp patch, serving it over TLS within connection and time limits.
//!
//! Every field of a review is attacker input: it is validated before it reaches a request path,
//! a log line or a loop bound. Must not reach: the watcher's state (the two agree only through
//! the core's rules), or any write to the API server (the webhook only reads).
//!
//! As paths, checked by [`crate::contracts`]: no `crate::app`, `crate::cli`, `crate::explain`,
//! `crate::offline`, `crate::watcher`.

pub mod admission;
pub mod budget;
pub mod held;
pub mod lookup;
pub mod pruned;
pub mod server;
pub mod tls;

//! The edge to the Kubernetes API server: the client every part uses (a layer that checks and
//! sanitises what the server answers), the lean getter of the webhook's lookups, the redaction of
//! client errors for logs, and the one adapter that turns a watch into "applied", "deleted" and
//! "relisted" changes.
//!
//! Must not reach: confighash's own logic. Nothing here may put the content of an object it read
//! into an error or a log line.
//!
//! Its Cargo.toml keeps it so: of confighash's crates it depends on the core alone.

#![forbid(unsafe_code)]

pub mod client;
pub mod discover;
pub mod get;
pub mod redact;
pub mod watch;

use get::Getter;

/// How `confighash serve` reaches the API server, both from one kube configuration: the client
/// every part uses ([`client::build`]), and the getter of the webhook's lookups ([`Getter`]).
#[derive(Clone)]
pub struct Cluster {
    pub client: kube::Client,
    pub getter: Getter,
}

impl Cluster {
    /// The client lets through answers about the resources of `reads` (what the parts declare).
    pub fn new(config: kube::Config, reads: client::Reads) -> Result<Cluster, kube::Error> {
        let getter = Getter::new(&config)?;
        Ok(Cluster {
            client: client::build(config, reads)?,
            getter,
        })
    }
}

//! The edge to the Kubernetes API server: the client every part uses (a layer that checks and
//! sanitises what the server answers), the redaction of client errors for logs, and the one
//! adapter that turns a watch into "applied", "deleted" and "relisted" changes.
//!
//! Must not reach: confighash's own logic. Nothing here may put the content of an object it read
//! into an error or a log line.

pub mod client;
pub mod redact;
pub mod watch;

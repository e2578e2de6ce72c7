//! Keys and certificates: the HMAC key stamps are made with (from a file or a Secret, watched
//! for rotation), the local CA and serving pair of `confighash certs`, and `--self-signed-certs`
//! (a CA and serving pair kept in a Secret, its CA published in the webhook configuration).
//!
//! Must not reach: the webhook's or the watcher's logic; key material never reaches a log line.

use crate::cluster::client::{Reads, Resource};

/// What the key and the self-signed certificates read: their Secrets, and the webhook
/// configuration the CA is published in.
pub const READS: Reads = Reads::of(&[Resource::Secrets, Resource::MutatingWebhookConfigurations]);

pub mod certificates;
pub mod key;
pub mod selfsigned;

//! The webhook and the admin port as `serve` runs them: reviews, forged reviews and their bounds,
//! connections and TLS, certificates and the key, lookups and their credentials.

use confighash_testkit::{build, harness, kubelet_volume, ports, process, wait};

mod admin_port;
mod canary;
mod client_auth;
mod hardening;
mod key;
mod limits;
mod lookup_credentials;
mod reviews;
mod selfsigned;
mod tls_reload;

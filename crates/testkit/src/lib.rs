//! What confighash's tests, benches and demo share: the in-memory Kubernetes API server
//! ([`apiserver`]), builders of objects and stamps ([`build`]), the webhook served in process
//! ([`harness`], [`ports`]) or as a process ([`process`]), the install manifests read as
//! Kubernetes reads them ([`manifests`]), the end-to-end environment on the stand-in or a real
//! cluster ([`e2e`]), and the benches' shared parts ([`bench`]).
//!
//! Never a dependency of the product: only of tests, benches and examples.

pub mod apiserver;
pub mod bench;
pub mod build;
pub mod e2e;
pub mod harness;
pub mod kubelet_volume;
pub mod manifests;
pub mod ports;
pub mod process;
pub mod wait;

/// The repository's top directory, where the tests find `deploy/`, `charts/`, `examples/` and
/// the scripts.
pub const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

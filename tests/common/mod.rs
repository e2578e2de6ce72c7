//! Fixtures and helpers shared by the test crates.

pub mod build;
pub mod harness;
pub mod kubelet_volume;
pub mod manifests;
pub mod ports;
pub mod process;
pub mod wait;

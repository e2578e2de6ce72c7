//! The installation: `deploy/` and the Helm chart, checked as objects, as RBAC and as arguments.

// Fixtures shared by the test crates; each uses some of them.
#[allow(dead_code)]
mod common;
use common::manifests;

mod chart;
mod deploy;
mod image;

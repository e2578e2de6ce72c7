//! The installation: `deploy/` and the Helm chart, checked as objects, as RBAC and as arguments.

use confighash_testkit::manifests;

mod chart;
mod deploy;
mod image;

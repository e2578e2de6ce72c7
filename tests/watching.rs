//! Leader election, and the in-memory API server the other tests stand on, held to kube-apiserver's
//! behaviour.

// Fixtures shared by the test crates; each uses some of them.
#[allow(dead_code)]
mod common;
use common::{build, wait};

mod leader;
mod standin;

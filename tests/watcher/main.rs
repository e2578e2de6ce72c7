//! Leader election, and the in-memory API server the other tests stand on, held to kube-apiserver's
//! behaviour.

use confighash_testkit::{build, wait};

mod index;
mod leader;
mod standin;

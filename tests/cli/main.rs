//! The offline commands: `stamp`, `diff` and `explain`.

use confighash_testkit::e2e::support;

mod diff;
mod explain;
mod stamp;

//! The offline commands: `stamp`, `diff` and `explain`.

#[allow(dead_code)]
mod e2e;
use e2e::support;

mod diff_cli;
mod explain;
mod stamp_cli;

//! End to end: confighash as users run it, on the in-memory API server or, with the real tier's
//! environment (`scripts/real-tier.sh`), on a real control plane. The environment and the
//! fixtures are the testkit's (`confighash_testkit::e2e`, `build`, `harness`).

use confighash_testkit::e2e::{real, support};
use confighash_testkit::{build, harness};

mod changes;
mod configured_kinds;
mod differential;
mod dry_run;
mod flap;
mod gitops;
mod lifecycle;
mod namespaces;
mod operators;
mod real_fault_run;
mod real_faults;
mod replace;
mod rollout_outcomes;
mod scenarios;
mod security;
mod stories;
mod typed_secrets;
mod upgrade;
mod watcher_faults;
mod waves;
mod workload_opt_in;

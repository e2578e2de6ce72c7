//! End to end: confighash as users run it, on the in-memory API server or, with the real tier's
//! environment (`scripts/real-tier.sh`), on a real control plane. One module per former test
//! binary; the helpers are `tests/e2e/` (scenarios) and `tests/common/` (fixtures).

// Fixtures shared by the test crates; each uses some of them.
#[allow(dead_code)]
mod common;
use common::{build, harness};
#[allow(dead_code)]
mod e2e;
use e2e::{real, real_fault_run, support};

mod differential;
mod e2e_changes;
mod e2e_dry_run;
mod e2e_flap;
mod e2e_gitops;
mod e2e_lifecycle;
mod e2e_namespaces;
mod e2e_real_fault_run;
mod e2e_real_faults;
mod e2e_replace;
mod e2e_rollout_outcomes;
mod e2e_scenarios;
mod e2e_typed_secrets;
mod e2e_upgrade;
mod e2e_watcher_faults;
mod e2e_workload_opt_in;
mod security;
mod stories;

//! The fault run's real-cluster mode at the real tier's size (`confighash_testkit::e2e::fault_run` says
//! what it does and checks; `cargo bench --bench fault_run` with the real tier's environment runs
//! it bigger). The stand-in's fault run, with the faults only it can make at will (injected 429s
//! on any request, dropped watches, a webhook outage), is `benches/fault_run.rs`.

use crate::support;
use confighash_testkit::e2e::fault_run;

use support::{Env, Setup};

#[tokio::test]
async fn the_fault_run_on_the_real_control_plane_rolls_each_workload_once_per_change_and_never_back()
 {
    const TEST: &str = "the_fault_run_on_the_real_control_plane_rolls_each_workload_once_per_change_and_never_back";
    if std::env::var_os("CONFIGHASH_E2E_KUBECONFIG").is_none() || support::audit().is_none() {
        eprintln!(
            "skipped: {TEST} needs a real control plane and its audit log (the real tier, \
             scripts/real-tier.sh); the stand-in's fault run is benches/fault_run.rs"
        );
        return;
    }
    let Some(env) = Env::controlling(TEST, Setup::default()).await else {
        return;
    };
    let seed = std::env::var("CONFIGHASH_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("{TEST}: seed {seed} (CONFIGHASH_FAULT_SEED replays the changes)");
    let report = fault_run::run(&env, &fault_run::Size::tier(), seed).await;
    println!("{}", report.table);
    assert!(
        report.violations.is_empty(),
        "{} violations:\n{}\n{}",
        report.violations.len(),
        report.violations.join("\n"),
        report.table
    );
}

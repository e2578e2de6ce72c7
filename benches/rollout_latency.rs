//! Rollout latency: from a ConfigMap change to the workload's new revision, and (on a real
//! cluster) to confighash's `RolloutComplete` Event, over N changes of one ConfigMap used by one
//! Deployment, each change made once the previous one completed.
//!
//! Runs where `crates/testkit/src/e2e/support.rs` runs: on the in-memory API server with confighash in-process
//! by default, or on a real cluster with the variables the real tier writes
//! (`source target/control-plane/e2e.env` after `CONFIGHASH_REAL_KEEP=1 scripts/real-tier.sh --
//! none`). On the stand-in a new revision is its count of template transitions, and no
//! Deployment controller runs, so `RolloutComplete` is not measured there. Both servers run
//! confighash with the scenarios' change window (400 ms), which is most of each figure: compare
//! the two side by side, as ratios.
//!
//!   cargo bench --bench rollout_latency                  # CONFIGHASH_LATENCY_CHANGES=50
use confighash_testkit::e2e::support;

use std::time::{Duration, Instant};

use support::Env;

const NS: &str = "latency";

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn summary(what: &str, mut values: Vec<Duration>) {
    values.sort();
    println!(
        "| {what} | {} | {:.0} ms | {:.0} ms | {:.0} ms |",
        values.len(),
        percentile(&values, 0.5).as_secs_f64() * 1000.0,
        percentile(&values, 0.99).as_secs_f64() * 1000.0,
        values.last().unwrap().as_secs_f64() * 1000.0
    );
}

async fn completions(env: &Env) -> i64 {
    env.recorded_events(NS, "web", "RolloutComplete")
        .await
        .iter()
        .map(|e| e.series.as_ref().map_or(1, |s| i64::from(s.count)))
        .sum()
}

async fn run() {
    let changes: u64 = std::env::var("CONFIGHASH_LATENCY_CHANGES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(50);
    let env = Env::start().await;
    let server = if env.is_stand_in() {
        "the stand-in"
    } else {
        "kube-apiserver"
    };
    env.namespace(NS, true).await;
    env.config_map(NS, "app-env", &[("N", "0")]).await;
    env.deployment(NS, "web", &[("envFrom", "app-env")]).await;
    env.barrier(NS).await;
    let mut to_revision = Vec::new();
    let mut to_complete = Vec::new();
    let poll = Duration::from_millis(2);
    for i in 1..=changes {
        let done_before = if env.is_stand_in() {
            0
        } else {
            completions(&env).await
        };
        let start = Instant::now();
        env.config_map(NS, "app-env", &[("N", &i.to_string())])
            .await;
        while env.rollouts(NS, "Deployment", "web").await < i {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "change {i}: no rollout"
            );
            tokio::time::sleep(poll).await;
        }
        to_revision.push(start.elapsed());
        if !env.is_stand_in() {
            while completions(&env).await <= done_before {
                assert!(
                    start.elapsed() < Duration::from_secs(60),
                    "change {i}: no RolloutComplete"
                );
                tokio::time::sleep(poll).await;
            }
            to_complete.push(start.elapsed());
        }
    }
    println!("rollout latency on {server}, change window 400 ms");
    println!();
    println!("| from a ConfigMap change to | changes | p50 | p99 | max |");
    println!("|---|---|---|---|---|");
    summary("the new revision", to_revision);
    if !to_complete.is_empty() {
        summary("confighash's RolloutComplete Event", to_complete);
    }
}

fn main() {
    // `cargo bench` passes `--bench`; this binary takes no arguments.
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run());
}

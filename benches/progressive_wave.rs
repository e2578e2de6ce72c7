//! The cost of a progressive wave's health judgement, side by side with the same wave without
//! it, on the real control plane with kwok's nodes: `CONFIGHASH_PWAVE_WORKLOADS` (2,000)
//! Deployments of one replica each use one ConfigMap. Its content changes twice: first as a
//! plain ConfigMap (every dependent touched at `--max-touches-per-second`, nothing judged),
//! then marked `confighash.dev/rollout: progressive` (batches of 1, 2, 4, ..., each judged by its
//! rollout and its pods, from one watch of the namespace's pods).
//!
//! Measured for each wave, from the change to the last dependent rolled: confighash's requests
//! to the API server (the audit log: every request of its ServiceAccount), per second and by
//! verb; confighash's resident memory (the highest seen, sampled every second) and CPU time
//! (`/proc` of replica 0, the leader: the only one running); confighash's writes per workload,
//! which must be exactly one in each wave.
//!
//! On the real control plane: `CONFIGHASH_REAL_KEEP=1 scripts/real-tier.sh -- none`, then
//! `source target/control-plane/e2e.env` and
//!
//!   cargo bench --bench progressive_wave
//!
//! Without `--bench` (as `cargo test --benches` runs it) on the real control plane: 20
//! workloads. In the stand-in there are no controllers or pods to judge, so it says so and
//! measures nothing.
use confighash_testkit::bench::mode;
use confighash_testkit::e2e::support;

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use support::Env;

const NS: &str = "pwave";
const SHARED: &str = "ca-bundle";

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// Replica 0's pid, from the real tier's `serve.sh` folder.
fn confighash_pid() -> Option<u32> {
    let serve = std::env::var_os("CONFIGHASH_E2E_SERVE")?;
    let dir = std::path::Path::new(&serve).parent()?.to_owned();
    std::fs::read_to_string(dir.join("confighash-0.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Resident memory (bytes) and CPU time (seconds) of `pid`.
fn usage(pid: u32) -> Option<(u64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name's closing parenthesis: state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // SAFETY-free: the clock tick is 100 on every Linux this runs on (USER_HZ).
    Some((rss_kb * 1024, ticks / 100.0))
}

async fn create(env: &Env, name: &str) {
    let mut object = support::workload_object(
        "Deployment",
        name,
        &[("volume", SHARED)],
        json!({"confighash-bench": "pwave"}),
    );
    object["spec"]["replicas"] = json!(1);
    let api: Api<DynamicObject> = Api::namespaced_with(
        env.client.clone(),
        &env.ns(NS),
        &support::api_resource("Deployment"),
    );
    api.create(
        &PostParams::default(),
        &serde_json::from_value(object).unwrap(),
    )
    .await
    .unwrap();
}

/// What one wave cost.
struct Cost {
    seconds: f64,
    requests: usize,
    by_verb: BTreeMap<String, usize>,
    rss_max: u64,
    cpu: f64,
    writes_once: usize,
    writes_more: usize,
    halted: usize,
}

/// Changes the ConfigMap to `value` and measures until every Deployment rolled once more.
async fn wave(env: &Env, names: &[String], value: &str, pid: u32) -> Cost {
    let audit = support::audit().expect("the audit log (CONFIGHASH_E2E_AUDIT_LOG)");
    let requests_before = audit.requests().len();
    let writes_before = env.confighash_writes(NS).len();
    let mut rollouts_before = BTreeMap::new();
    for name in names {
        rollouts_before.insert(name.clone(), env.rollouts(NS, "Deployment", name).await);
    }
    let (_, cpu_before) = usage(pid).expect("confighash's /proc");
    let t0 = tokio::time::Instant::now();
    env.config_map(NS, SHARED, &[("ca.crt", value)]).await;
    let mut rss_max = 0;
    let deadline = Duration::from_secs(names.len() as u64 + 900);
    loop {
        if let Some((rss, _)) = usage(pid) {
            rss_max = rss_max.max(rss);
        }
        let mut behind = 0;
        for name in names {
            if env.rollouts(NS, "Deployment", name).await <= rollouts_before[name] {
                behind += 1;
            }
        }
        if behind == 0 {
            break;
        }
        assert!(
            t0.elapsed() < deadline,
            "{behind} of {} not rolled after {deadline:?}",
            names.len()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let seconds = t0.elapsed().as_secs_f64();
    let (_, cpu_after) = usage(pid).expect("confighash's /proc");
    let requests: Vec<support::Audited> =
        audit.requests().into_iter().skip(requests_before).collect();
    let mut by_verb = BTreeMap::new();
    for r in &requests {
        *by_verb
            .entry(format!("{} {}", r.verb, r.resource))
            .or_default() += 1;
    }
    let mut per_workload: BTreeMap<String, usize> = BTreeMap::new();
    for w in env
        .confighash_writes(NS)
        .into_iter()
        .skip(writes_before)
        .filter(|w| w.resource == "deployments")
    {
        *per_workload.entry(w.name).or_default() += 1;
    }
    Cost {
        seconds,
        requests: requests.len(),
        by_verb,
        rss_max,
        cpu: cpu_after - cpu_before,
        writes_once: per_workload.values().filter(|&&c| c == 1).count(),
        writes_more: per_workload.values().filter(|&&c| c > 1).count(),
        halted: env.events(NS, SHARED, "WaveHalted").await,
    }
}

fn report(what: &str, n: usize, c: &Cost) {
    println!(
        "{what}: {n} rolled in {:.0} s; confighash's requests {} ({:.2}/s); RSS at most {:.1} MiB; \
         CPU {:.1} s; written once {}, more than once {}; WaveHalted {}",
        c.seconds,
        c.requests,
        c.requests as f64 / c.seconds,
        c.rss_max as f64 / 1048576.0,
        c.cpu,
        c.writes_once,
        c.writes_more,
        c.halted
    );
    println!("{what}: requests by verb: {:?}", c.by_verb);
}

async fn run(mode: mode::Mode) -> bool {
    let n = match mode {
        mode::Mode::Full => env_u64("CONFIGHASH_PWAVE_WORKLOADS", 2000) as usize,
        mode::Mode::Smoke => 20,
    };
    let env = Env::start().await;
    if env.is_stand_in() {
        println!(
            "progressive_wave: skipped: it needs controllers and pods (a progressive wave waits \
             for rollouts): run it on the real control plane (see its header)"
        );
        return true;
    }
    let Some(pid) = confighash_pid() else {
        println!("progressive_wave: NOT run: no confighash pid beside CONFIGHASH_E2E_SERVE");
        return false;
    };
    // kwok's nodes for the pods: 250 each, room for every Deployment's pod and a surge of one
    // for each of a batch.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.client.clone());
    for i in 0..(n * 2).div_ceil(250) {
        let node = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": format!("pwave-node-{i}"),
                "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {"kubernetes.io/hostname": format!("pwave-node-{i}"),
                    "kubernetes.io/os": "linux", "type": "kwok"}},
            "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "250"},
                "capacity": {"cpu": "32", "memory": "256Gi", "pods": "250"}},
        });
        let node = serde_json::from_value(node).unwrap();
        if let Err(e) = nodes.create(&PostParams::default(), &node).await {
            assert!(matches!(&e, kube::Error::Api(s) if s.code == 409), "{e}");
        }
    }
    env.namespace(NS, true).await;
    env.config_map(NS, SHARED, &[("ca.crt", "0")]).await;
    let names: Vec<String> = (0..n).map(|i| format!("app-{i:04}")).collect();
    futures::stream::iter(names.clone())
        .for_each_concurrent(16, |name| {
            let env = &env;
            async move { create(env, &name).await }
        })
        .await;
    // Every Deployment's first revision made and rolled out before the waves.
    for name in &names {
        env.wait_first_revision(NS, "Deployment", name).await;
    }
    env.settled().await;

    let plain = wave(&env, &names, "1", pid).await;
    report("plain wave (no judgement)", n, &plain);
    Api::<ConfigMap>::namespaced(env.client.clone(), &env.ns(NS))
        .patch(
            SHARED,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"confighash.dev/rollout": "progressive"}}}),
            ),
        )
        .await
        .unwrap();
    env.settled().await;
    let progressive = wave(&env, &names, "2", pid).await;
    report("progressive wave", n, &progressive);
    let ratio = |a: f64, b: f64| a / b;
    let requests_ratio = ratio(
        progressive.requests as f64 / progressive.seconds,
        plain.requests as f64 / plain.seconds,
    );
    let rss_ratio = ratio(progressive.rss_max as f64, plain.rss_max as f64);
    println!(
        "progressive / plain: requests per second {requests_ratio:.2}x, RSS {rss_ratio:.2}x, CPU \
         {:.2}x, time {:.2}x",
        ratio(progressive.cpu, plain.cpu),
        ratio(progressive.seconds, plain.seconds)
    );
    let exact = [&plain, &progressive]
        .iter()
        .all(|c| c.writes_once == n && c.writes_more == 0 && c.halted == 0);
    let held = exact && requests_ratio <= 1.2 && rss_ratio <= 1.2;
    println!(
        "RESULT: {n} dependents, each written once per wave, no halt: {}; requests per second \
         and RSS within 1.2x of the plain wave: {}",
        if exact { "met" } else { "NOT met" },
        if requests_ratio <= 1.2 && rss_ratio <= 1.2 {
            "met"
        } else {
            "NOT met"
        }
    );
    // The smoke run checks exactness; the ratios are for the full run to report.
    match mode {
        mode::Mode::Smoke => exact,
        mode::Mode::Full => held,
    }
}

fn main() {
    let mode = mode::from_args();
    let held = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run(mode));
    if !held {
        std::process::exit(1);
    }
}

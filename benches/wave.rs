//! A rollout wave on an API server: one ConfigMap used by `CONFIGHASH_WAVE_WORKLOADS` (2,000)
//! Deployments changes, and confighash's touch bucket (5/s, burst 20) spreads their touches over
//! about 400 s. During the wave an unrelated ConfigMap changes in the same namespace and in
//! another; each is used by one Deployment (`bystander`), whose touch must not wait behind the
//! wave (touches are taken round-robin across the changes that armed them).
//!
//! Measured, by polling the Deployments every second: when each got its new stamp (from the
//! change); the touches per second; the bystanders' time from their change to their new stamp;
//! confighash's writes per workload (its own PATCHes, from the stand-in's record or the real
//! audit log) and its `ConfigChanged` Events per workload, which must both be exactly one; the
//! wave's ETA gauge (`confighash_touch_wave_eta_seconds`) and pending touches at the start.
//!
//! On the stand-in (confighash in-process, its 400 ms test window):
//!
//!   cargo bench --bench wave
//!
//! On the real control plane: `source target/control-plane/e2e.env` after `CONFIGHASH_REAL_KEEP=1
//! scripts/real-tier.sh -- none`, then the same command. `CONFIGHASH_WAVE_BYSTANDER_AFTER` (30)
//! is the second of the wave at which the bystanders' ConfigMaps change.
//!
//! Without `--bench` (as `cargo test --benches` runs it): 20 workloads, the bystanders changed
//! 2 s in, the same checks; about half a minute on the stand-in.
use confighash_testkit::bench::mode;
use confighash_testkit::e2e::support;

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::json;
use support::Env;

const NS: &str = "wave";
const OTHER_NS: &str = "wave-other";
const SHARED: &str = "flags";
const UNRELATED: &str = "other";
const BYSTANDER: &str = "bystander";
const LABEL: &str = "confighash-bench";

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// A gauge or counter of confighash's metrics: the in-process one's, or on a real cluster the
/// first replica's that answers.
async fn metric(env: &Env, name: &str) -> Option<f64> {
    let text = if env.is_stand_in() {
        env.metrics.encode()
    } else {
        let urls = std::env::var("CONFIGHASH_E2E_METRICS_URL").ok()?;
        let mut text = None;
        for url in urls.split(',') {
            if let Ok(t) = support::remote_metrics(url).await {
                text = Some(t);
                break;
            }
        }
        text?
    };
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The stamp of every Deployment in `namespace` with the bench's label.
async fn stamps(env: &Env, namespace: &str) -> BTreeMap<String, Option<String>> {
    let api: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns(namespace));
    api.list(&ListParams::default().labels(&format!("{LABEL}=wave")))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|d| {
            let stamp = d
                .spec
                .and_then(|s| s.template.metadata)
                .and_then(|m| m.annotations)
                .and_then(|a| a.get(support::STAMP).cloned());
            (d.metadata.name.unwrap_or_default(), stamp)
        })
        .collect()
}

async fn create(env: &Env, namespace: &str, name: &str, config_map: &str) {
    let mut object = support::workload_object(
        "Deployment",
        name,
        &[("envFrom", config_map)],
        json!({LABEL: "wave"}),
    );
    object["spec"]["replicas"] = json!(0);
    let api: Api<DynamicObject> = Api::namespaced_with(
        env.client.clone(),
        &env.ns(namespace),
        &support::api_resource("Deployment"),
    );
    api.create(
        &PostParams::default(),
        &serde_json::from_value(object).unwrap(),
    )
    .await
    .unwrap();
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

async fn run(mode: mode::Mode) -> bool {
    let (n, bystander_after) = match mode {
        mode::Mode::Full => (
            env_u64("CONFIGHASH_WAVE_WORKLOADS", 2000) as usize,
            Duration::from_secs(env_u64("CONFIGHASH_WAVE_BYSTANDER_AFTER", 30)),
        ),
        mode::Mode::Smoke => (20, Duration::from_secs(2)),
    };
    let env = Env::start().await;
    let started = tokio::time::Instant::now();
    env.namespace(NS, true).await;
    env.namespace(OTHER_NS, true).await;
    env.config_map(NS, SHARED, &[("FEATURE", "off")]).await;
    env.config_map(NS, UNRELATED, &[("LEVEL", "1")]).await;
    env.config_map(OTHER_NS, UNRELATED, &[("LEVEL", "1")]).await;
    futures::stream::iter(0..n)
        .for_each_concurrent(16, |i| {
            let env = &env;
            async move { create(env, NS, &format!("app-{i:04}"), SHARED).await }
        })
        .await;
    create(&env, NS, BYSTANDER, UNRELATED).await;
    create(&env, OTHER_NS, BYSTANDER, UNRELATED).await;
    env.wait_synced().await;
    env.settled().await;
    let before = stamps(&env, NS).await;
    let before_other = stamps(&env, OTHER_NS).await;
    let unstamped = before.values().filter(|s| s.is_none()).count();
    println!(
        "wave: {} {}, {n} Deployments using {NS}/{SHARED} and one bystander in each of {NS} and \
         {OTHER_NS}; set up in {:.1} s; {unstamped} created without a stamp",
        if env.is_stand_in() {
            "stand-in"
        } else {
            "kube-apiserver"
        },
        env.ns(NS),
        started.elapsed().as_secs_f64()
    );
    // confighash's writes so far in each namespace: only those after them are the wave's.
    let writes_before = [NS, OTHER_NS].map(|ns| env.confighash_writes(ns).len());

    // The wave.
    let t0 = tokio::time::Instant::now();
    env.config_map(NS, SHARED, &[("FEATURE", "on")]).await;
    let mut touched: BTreeMap<String, f64> = BTreeMap::new();
    let mut bystanders: BTreeMap<&str, f64> = BTreeMap::new();
    let mut bystanders_changed = None;
    let mut eta_first = None;
    let mut pending_most = 0.0f64;
    let deadline = Duration::from_secs_f64(n as f64 / 5.0 + 180.0);
    loop {
        if bystanders_changed.is_none() && t0.elapsed() >= bystander_after {
            env.config_map(NS, UNRELATED, &[("LEVEL", "2")]).await;
            env.config_map(OTHER_NS, UNRELATED, &[("LEVEL", "2")]).await;
            bystanders_changed = Some(t0.elapsed().as_secs_f64());
        }
        if let Some(eta) = metric(&env, "confighash_touch_wave_eta_seconds").await
            && eta > 0.0
            && eta_first.is_none()
        {
            eta_first = Some((t0.elapsed().as_secs_f64(), eta));
        }
        if let Some(pending) = metric(&env, "confighash_touches_pending").await {
            pending_most = pending_most.max(pending);
        }
        let now = t0.elapsed().as_secs_f64();
        for (name, stamp) in stamps(&env, NS).await {
            if stamp != before.get(&name).cloned().flatten() && !touched.contains_key(&name) {
                if name == BYSTANDER {
                    bystanders.entry(NS).or_insert(now);
                } else {
                    touched.insert(name, now);
                }
            }
        }
        for (name, stamp) in stamps(&env, OTHER_NS).await {
            if name == BYSTANDER && stamp != before_other.get(&name).cloned().flatten() {
                bystanders.entry(OTHER_NS).or_insert(now);
            }
        }
        if touched.len() >= n && bystanders.len() == 2 {
            break;
        }
        if t0.elapsed() > deadline {
            println!(
                "wave: NOT finished within {:.0} s: {} of {n} touched, bystanders {bystanders:?}",
                deadline.as_secs_f64(),
                touched.len()
            );
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    env.settled().await;

    // Exactness: confighash's own writes and Events, per workload.
    let writes: Vec<support::Audited> = [NS, OTHER_NS]
        .iter()
        .zip(writes_before)
        .flat_map(|(ns, before)| env.confighash_writes(ns).into_iter().skip(before))
        .collect();
    let mut per_workload: BTreeMap<String, usize> = BTreeMap::new();
    for w in writes
        .iter()
        .filter(|w| w.resource == "deployments" && w.namespace == env.ns(NS) && w.name != BYSTANDER)
    {
        *per_workload.entry(w.name.clone()).or_default() += 1;
    }
    let once = per_workload.values().filter(|&&c| c == 1).count();
    let more = per_workload.values().filter(|&&c| c > 1).count();
    let bystander_writes = writes.iter().filter(|w| w.name == BYSTANDER).count();
    let events =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(env.client.clone(), &env.ns(NS))
            .list(&Default::default())
            .await
            .unwrap()
            .items;
    let mut events_per: BTreeMap<String, usize> = BTreeMap::new();
    for e in events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("ConfigChanged"))
    {
        if let Some(name) = e.regarding.as_ref().and_then(|r| r.name.clone()) {
            *events_per.entry(name).or_default() += 1;
        }
    }
    let events_once = (0..n)
        .filter(|i| events_per.get(&format!("app-{i:04}")) == Some(&1))
        .count();

    // The pace: touches seen per second (by the poll) after the burst.
    let mut times: Vec<f64> = touched.values().copied().collect();
    times.sort_by(f64::total_cmp);
    let mut per_second: BTreeMap<u64, usize> = BTreeMap::new();
    for t in &times {
        *per_second.entry(*t as u64).or_default() += 1;
    }
    let steady_max = per_second
        .iter()
        .filter(|(s, _)| **s >= 10)
        .map(|(_, c)| *c)
        .max()
        .unwrap_or(0);
    let last = times.last().copied().unwrap_or(f64::NAN);
    println!(
        "wave: {} of {n} touched, first {:.1} s, median {:.1} s, last {last:.1} s after the change; \
         most seen in one second after the 10th: {steady_max} (polled once a second)",
        touched.len(),
        percentile(&times, 0.0),
        percentile(&times, 50.0)
    );
    println!(
        "confighash's writes to the wave's Deployments: {} PATCHes, {once} workloads written \
         once, {more} more than once; ConfigChanged Events: {} in all, {events_once} of {n} \
         workloads with exactly one; the two bystanders: {bystander_writes} PATCHes",
        per_workload.values().sum::<usize>(),
        events_per.values().sum::<usize>()
    );
    println!(
        "wave ETA gauge: {}; most touches pending seen: {pending_most:.0}",
        eta_first.map_or("never above 0".to_owned(), |(at, eta)| format!(
            "{eta:.0} s, read {at:.1} s after the change (the wave ended {last:.1} s after it)"
        ))
    );
    let changed = bystanders_changed.unwrap_or(f64::NAN);
    let late = |ns: &str| bystanders.get(ns).map(|t| t - changed);
    println!(
        "bystanders, changed {changed:.1} s into the wave: {NS} touched {} after its change, \
         {OTHER_NS} {}",
        late(NS).map_or("never".to_owned(), |d| format!("{d:.1} s")),
        late(OTHER_NS).map_or("never".to_owned(), |d| format!("{d:.1} s"))
    );
    let counted = env.counts_writes();
    let held = touched.len() == n
        && (!counted || (once == n && more == 0 && bystander_writes == 2))
        && events_once == n
        && late(NS).is_some_and(|d| d < 15.0)
        && late(OTHER_NS).is_some_and(|d| d < 15.0);
    println!(
        "RESULT: wave of {n}: every one touched{}; bystanders within 15 s of their change in \
         both namespaces: {}",
        if counted {
            " exactly once (writes and Events)"
        } else {
            " (Events counted; writes not counted here)"
        },
        if held { "met" } else { "NOT met" }
    );
    held
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

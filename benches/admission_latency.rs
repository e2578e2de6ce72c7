//! Admission latency as kube-apiserver sees it: the share of confighash's webhook calls that
//! finish within 25 ms (kube-apiserver's `apiserver_admission_webhook_admission_duration_seconds`
//! bucket `le="0.025"`), beside a no-op webhook registered on the same rules for the same writes
//! in the same run (served by this process on loopback, answering `allowed` without a patch).
//!
//! Two scenarios (`CONFIGHASH_ADMISSION_SCENARIO`: `steady`, `mass-sync`, or both, the default):
//!
//! - **steady**: `CONFIGHASH_ADMISSION_WRITES` (1,000) writes, half CREATEs of Deployments that
//!   reference a ConfigMap and a Secret, half UPDATEs of their pod templates, in one opted-in
//!   namespace, sent 8 at a time. Real cluster only.
//! - **mass-sync**: what Argo CD does when it syncs many applications at once:
//!   `CONFIGHASH_ADMISSION_APPS` (500) applications of 4 workloads each (two Deployments, a
//!   StatefulSet, a CronJob; no replicas, suspended, so no controller runs a pod), 10 per
//!   opted-in namespace, each workload referencing its application's ConfigMap and Secret
//!   (created before). The 2,000 CREATEs are sent open loop, each at its scheduled time, evenly
//!   over `CONFIGHASH_ADMISSION_SYNC_SECS` (10) seconds, however long the earlier ones take.
//!   Measured: every write's result and latency from its scheduled time; every webhook call's
//!   duration per webhook (kube-apiserver's histogram on a real cluster; on the stand-in, the
//!   duration its admission chain measured around each call); the calls that failed (failing
//!   open); that every workload was stored stamped, without an `unstamped` marker; and, on a
//!   real cluster, the most lookups (GETs with confighash's webhook User-Agent) the API server
//!   held at once, from the audit log's received and completed times, against the webhook's cap
//!   of reads in flight.
//!
//! On a real cluster: `source target/control-plane/e2e.env` after `CONFIGHASH_REAL_KEEP=1
//! scripts/real-tier.sh -- none`, then `cargo bench --bench admission_latency`. Without it the
//! mass sync runs on the stand-in (confighash in-process; the steady scenario is skipped).
//!
//! Without `--bench` (as `cargo test --benches` runs it): a mass sync of 10 applications over
//! 1 s on the stand-in, with the same checks.
use confighash_testkit::bench::mode;
use confighash_testkit::bench::prom;
use confighash_testkit::e2e::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use confighash_testkit::apiserver::TestWebhook;
use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::Env;

const NS: &str = "admission";
const BUCKET: &str = "0.025";
/// The bucket's bound, for the durations the stand-in measured.
const WITHIN: Duration = Duration::from_millis(25);
/// The webhook names of confighash's entry for opted-in namespaces and of the no-op.
const CONFIGHASH_HOOK: &str = "stamp.confighash.dev";
const NOOP_HOOK: &str = "noop.example.test";
/// The workloads of one application in the mass sync: (kind, name suffix).
const APP_WORKLOADS: [(&str, &str); 4] = [
    ("Deployment", "web"),
    ("Deployment", "worker"),
    ("StatefulSet", "db"),
    ("CronJob", "report"),
];
/// Applications per namespace in the mass sync.
const APPS_PER_NAMESPACE: usize = 10;
/// The label of every mass-sync workload, to list them back.
const SYNC_LABEL: &str = "confighash-bench";
/// The webhook's cap of reads in flight (`lookup::DEFAULT_MAX_READS_IN_FLIGHT`), which the
/// real tier's replica runs with.
const READ_CAP: usize = confighash::webhook::lookup::DEFAULT_MAX_READS_IN_FLIGHT;

/// Bounds of kube-apiserver's admission histogram reported beside 25 ms, in seconds.
const WIDER: [&str; 3] = ["0.1", "0.5", "1"];

const ADMISSION: &str = "apiserver_admission_webhook_admission_duration_seconds";

/// `hook`'s admit calls within `le` seconds (a bucket bound of kube-apiserver's admission
/// histogram), summed over operations.
fn bucket(metrics: &str, hook: &str, le: &str) -> f64 {
    prom::samples(metrics, &format!("{ADMISSION}_bucket"))
        .filter(|(labels, _)| {
            prom::label(labels, "name") == Some(hook)
                && prom::label(labels, "type") == Some("admit")
                && prom::label(labels, "le") == Some(le)
        })
        .map(|(_, v)| v)
        .sum()
}

/// (calls within 25 ms, calls) per webhook name, summed over operations, from kube-apiserver's
/// metrics text.
fn shares(metrics: &str) -> BTreeMap<String, (f64, f64)> {
    let mut out: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    let admits = |metric: String| {
        prom::samples(metrics, &metric)
            .filter(|(labels, _)| prom::label(labels, "type") == Some("admit"))
            .filter_map(|(labels, v)| {
                Some((prom::label(labels, "name")?, prom::label(labels, "le"), v))
            })
            .collect::<Vec<_>>()
    };
    for (name, le, v) in admits(format!("{ADMISSION}_bucket")) {
        if le == Some(BUCKET) {
            out.entry(name.to_owned()).or_default().0 += v;
        }
    }
    for (name, _, v) in admits(format!("{ADMISSION}_count")) {
        out.entry(name.to_owned()).or_default().1 += v;
    }
    out
}

async fn apiserver_metrics(env: &Env) -> String {
    env.client
        .request_text(http::Request::get("/metrics").body(Vec::new()).unwrap())
        .await
        .expect("kube-apiserver's /metrics (the admin user may read it)")
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// The no-op webhook, registered on the same rules as confighash's for `namespaces`; its
/// configuration's name.
async fn register_noop(env: &Env, noop: &TestWebhook, namespaces: &[String]) -> String {
    let name = env.ns("zz-noop");
    let mut configuration = noop.configuration(&name, "Ignore");
    configuration["webhooks"][0]["name"] = json!(NOOP_HOOK);
    configuration["webhooks"][0]["namespaceSelector"] = json!({"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}
    ]});
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(env.client.clone());
    configurations
        .create(
            &PostParams::default(),
            &serde_json::from_value(configuration).unwrap(),
        )
        .await
        .unwrap();
    name
}

async fn unregister(env: &Env, name: &str) {
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(env.client.clone());
    configurations
        .delete(name, &Default::default())
        .await
        .unwrap();
}

/// The steady scenario (real cluster only).
async fn steady(env: &Env) {
    let writes = env_usize("CONFIGHASH_ADMISSION_WRITES", 1000);
    env.namespace(NS, true).await;
    env.config_map(NS, "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.secret(NS, "db", &[("password", "x")]).await;

    // The no-op webhook, on the same rules, for this namespace only.
    let noop = TestWebhook::start(|_| json!({"allowed": true})).await;
    let name = register_noop(env, &noop, &[env.ns(NS)]).await;

    let before = shares(&apiserver_metrics(env).await);
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns(NS));
    let n = writes / 2;
    futures::stream::iter(0..n)
        .for_each_concurrent(8, |i| {
            let deployments = deployments.clone();
            async move {
                let object = support::workload_object(
                    "Deployment",
                    &format!("web-{i}"),
                    &[("envFrom", "app-env"), ("secretEnvFrom", "db")],
                    json!({}),
                );
                deployments
                    .create(
                        &PostParams::default(),
                        &serde_json::from_value(object).unwrap(),
                    )
                    .await
                    .unwrap();
            }
        })
        .await;
    futures::stream::iter(0..n)
        .for_each_concurrent(8, |i| {
            let deployments = deployments.clone();
            async move {
                deployments
                    .patch(
                        &format!("web-{i}"),
                        &PatchParams::default(),
                        &Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [
                            {"name": "app", "image": "example/app:2"}
                        ]}}}})),
                    )
                    .await
                    .unwrap();
            }
        })
        .await;
    let after = shares(&apiserver_metrics(env).await);
    unregister(env, &name).await;

    println!("admission calls within 25 ms, {writes} writes (CREATE and UPDATE), 8 at a time");
    println!();
    println!("| webhook | calls | within 25 ms | share |");
    println!("|---|---|---|---|");
    for hook in [CONFIGHASH_HOOK, NOOP_HOOK] {
        let (fast, count) = after.get(hook).copied().unwrap_or_default();
        let (fast0, count0) = before.get(hook).copied().unwrap_or_default();
        let (fast, count) = (fast - fast0, count - count0);
        println!(
            "| {hook} | {count:.0} | {fast:.0} | {:.1} % |",
            if count > 0.0 {
                100.0 * fast / count
            } else {
                0.0
            }
        );
    }
    println!();
    println!(
        "Both counted as the difference of two readings of kube-apiserver's /metrics around the \
         writes; the no-op webhook answered {} reviews.",
        noop.calls()
    );
}

/// Per webhook: (calls within 25 ms, calls) of the calls after the first `skip`, from the
/// stand-in's timed record of its admission chain.
fn stand_in_shares(env: &Env, skip: usize) -> BTreeMap<String, (f64, f64)> {
    let mut out: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for (call, took) in env.api().timed_webhook_calls().into_iter().skip(skip) {
        let entry = out.entry(call.webhook).or_default();
        entry.1 += 1.0;
        if took <= WITHIN {
            entry.0 += 1.0;
        }
    }
    out
}

/// Calls that failed open, per webhook: kube-apiserver's
/// `apiserver_admission_webhook_fail_open_count`.
fn failed_open(metrics: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (labels, v) in prom::samples(metrics, "apiserver_admission_webhook_fail_open_count") {
        if let Some(name) = prom::label(labels, "name") {
            *out.entry(name.to_owned()).or_default() += v;
        }
    }
    out
}

/// The most intervals of `spans` (start, end; microseconds) open at one instant.
fn most_at_once(spans: &[(i64, i64)]) -> usize {
    let mut edges: Vec<(i64, i32)> = spans
        .iter()
        .flat_map(|&(start, end)| [(start, 1), (end, -1)])
        .collect();
    // An end before a start at the same instant: touching intervals do not overlap.
    edges.sort();
    let (mut open, mut most) = (0i32, 0i32);
    for (_, step) in edges {
        open += step;
        most = most.max(open);
    }
    most.max(0) as usize
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

/// The mass sync: 4 workloads per application created open loop over the sync's seconds.
async fn mass_sync(env: &Env, mode: mode::Mode) -> bool {
    let (apps, secs) = match mode {
        mode::Mode::Full => (
            env_usize("CONFIGHASH_ADMISSION_APPS", 500).max(1),
            env_usize("CONFIGHASH_ADMISSION_SYNC_SECS", 10).max(1),
        ),
        mode::Mode::Smoke => (10, 1),
    };
    let real = !env.is_stand_in();
    let namespaces: Vec<String> = (0..apps.div_ceil(APPS_PER_NAMESPACE))
        .map(|n| format!("sync-{n:03}"))
        .collect();
    let started = Instant::now();
    for ns in &namespaces {
        env.namespace(ns, true).await;
    }
    futures::stream::iter(0..apps)
        .for_each_concurrent(16, |app| {
            let ns = &namespaces[app / APPS_PER_NAMESPACE];
            async move {
                env.config_map(ns, &format!("app-{app}-config"), &[("MODE", "sync")])
                    .await;
                env.secret(ns, &format!("app-{app}-secret"), &[("token", "t")])
                    .await;
            }
        })
        .await;
    let mapped: Vec<String> = namespaces.iter().map(|n| env.ns(n)).collect();
    let noop = TestWebhook::start(|_| json!({"allowed": true})).await;
    let noop_name = register_noop(env, &noop, &mapped).await;
    println!(
        "mass sync: {apps} applications x {} workloads = {} CREATEs over {secs} s, {} \
         namespaces; set up in {:.1} s",
        APP_WORKLOADS.len(),
        apps * APP_WORKLOADS.len(),
        namespaces.len(),
        started.elapsed().as_secs_f64()
    );

    let (before, calls_before, open_before, text_before) = if real {
        let text = apiserver_metrics(env).await;
        (shares(&text), 0, failed_open(&text), text)
    } else {
        (
            BTreeMap::new(),
            env.api().webhook_calls().len(),
            BTreeMap::new(),
            String::new(),
        )
    };
    let writes = apps * APP_WORKLOADS.len();
    let gap = Duration::from_secs(secs as u64).div_f64(writes as f64);
    let t0 = tokio::time::Instant::now();
    let wall0 = std::time::SystemTime::now();
    let results = Arc::new(std::sync::Mutex::new(Vec::with_capacity(writes)));
    let mut tasks = Vec::with_capacity(writes);
    for i in 0..writes {
        let (app, (kind, suffix)) = (
            i / APP_WORKLOADS.len(),
            APP_WORKLOADS[i % APP_WORKLOADS.len()],
        );
        let ns = env.ns(&namespaces[app / APPS_PER_NAMESPACE]);
        let mut object = support::workload_object(
            kind,
            &format!("app-{app}-{suffix}"),
            &[
                ("envFrom", &format!("app-{app}-config")),
                ("secretEnvFrom", &format!("app-{app}-secret")),
            ],
            json!({SYNC_LABEL: "mass-sync"}),
        );
        if kind != "CronJob" {
            object["spec"]["replicas"] = json!(0);
        }
        let api: Api<DynamicObject> =
            Api::namespaced_with(env.client.clone(), &ns, &support::api_resource(kind));
        let object: DynamicObject = serde_json::from_value(object).unwrap();
        let results = results.clone();
        let at = t0 + gap.mul_f64(i as f64);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            let result = api.create(&PostParams::default(), &object).await;
            let took = at.elapsed();
            results
                .lock()
                .unwrap()
                .push((took, result.err().map(|e| e.to_string())));
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let burst = t0.elapsed();
    let wall1 = std::time::SystemTime::now();
    let (after, open_after, text_after) = if real {
        let text = apiserver_metrics(env).await;
        (shares(&text), failed_open(&text), text)
    } else {
        (
            stand_in_shares(env, calls_before),
            BTreeMap::new(),
            String::new(),
        )
    };
    unregister(env, &noop_name).await;

    let results = std::mem::take(&mut *results.lock().unwrap());
    let failed: Vec<&String> = results.iter().filter_map(|(_, e)| e.as_ref()).collect();
    let mut latencies: Vec<Duration> = results.iter().map(|(d, _)| *d).collect();
    latencies.sort();
    println!(
        "writes: {} sent in {:.1} s, {} failed{}; latency from the scheduled time p50 {} ms, \
         p99 {} ms, max {} ms",
        results.len(),
        burst.as_secs_f64(),
        failed.len(),
        failed
            .first()
            .map(|e| format!(" (first: {e})"))
            .unwrap_or_default(),
        ms(percentile(&latencies, 50.0)),
        ms(percentile(&latencies, 99.0)),
        ms(percentile(&latencies, 100.0))
    );

    // Every workload stored stamped, none marked unstamped.
    let (mut stamped, mut marked, mut listed) = (0, 0, 0);
    for kind in ["Deployment", "StatefulSet", "CronJob"] {
        for ns in &mapped {
            let api: Api<DynamicObject> =
                Api::namespaced_with(env.client.clone(), ns, &support::api_resource(kind));
            let list = api
                .list(&ListParams::default().labels(&format!("{SYNC_LABEL}=mass-sync")))
                .await
                .unwrap();
            for object in list.items {
                listed += 1;
                let value = serde_json::to_value(&object).unwrap();
                let template = if kind == "CronJob" {
                    &value["spec"]["jobTemplate"]["spec"]["template"]
                } else {
                    &value["spec"]["template"]
                };
                let annotations = &template["metadata"]["annotations"];
                if annotations
                    .get(support::STAMP)
                    .and_then(|v| v.as_str())
                    .is_some()
                {
                    stamped += 1;
                }
                if annotations.get("confighash.dev/unstamped").is_some() {
                    marked += 1;
                }
            }
        }
    }
    println!("stored: {listed} workloads, {stamped} stamped, {marked} marked unstamped");

    println!();
    println!(
        "| webhook | calls | within 25 ms | share | within 100 ms / 500 ms / 1 s | failed open |"
    );
    println!("|---|---|---|---|---|---|");
    let mut share_of = BTreeMap::new();
    for hook in [CONFIGHASH_HOOK, NOOP_HOOK] {
        let (fast, count) = after.get(hook).copied().unwrap_or_default();
        let (fast0, count0) = before.get(hook).copied().unwrap_or_default();
        let (fast, count) = (fast - fast0, count - count0);
        let share = if count > 0.0 {
            100.0 * fast / count
        } else {
            0.0
        };
        share_of.insert(hook, share);
        let failed_open = if real {
            format!(
                "{:.0}",
                open_after.get(hook).copied().unwrap_or(0.0)
                    - open_before.get(hook).copied().unwrap_or(0.0)
            )
        } else {
            env.api()
                .webhook_calls()
                .iter()
                .skip(calls_before)
                .filter(|c| {
                    c.webhook == hook
                        && matches!(
                            c.result,
                            confighash_testkit::apiserver::admission::CallResult::FailedIgnored(_)
                        )
                })
                .count()
                .to_string()
        };
        let wider: Vec<String> = WIDER
            .iter()
            .map(|le| {
                let within = if real {
                    bucket(&text_after, hook, le) - bucket(&text_before, hook, le)
                } else {
                    let bound = Duration::from_secs_f64(le.parse().unwrap_or(0.0));
                    env.api()
                        .timed_webhook_calls()
                        .iter()
                        .skip(calls_before)
                        .filter(|(c, took)| c.webhook == hook && *took <= bound)
                        .count() as f64
                };
                format!(
                    "{:.1} %",
                    if count > 0.0 {
                        100.0 * within / count
                    } else {
                        0.0
                    }
                )
            })
            .collect();
        println!(
            "| {hook} | {count:.0} | {fast:.0} | {share:.1} % | {} | {failed_open} |",
            wider.join(" / ")
        );
    }
    println!(
        "(durations: {}; the no-op webhook answered {} reviews)",
        if real {
            "kube-apiserver's admission duration histogram, read before and after"
        } else {
            "measured by the stand-in's admission chain around each call"
        },
        noop.calls()
    );

    // The lookups the API server held at once.
    let mut reads_ok = true;
    if real {
        match support::audit() {
            Some(log) => {
                let from = wall0
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_micros() as i64;
                let to = wall1
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_micros() as i64;
                let spans: Vec<(i64, i64)> = log
                    .requests()
                    .into_iter()
                    .filter(|r| {
                        r.verb == "get"
                            && r.user_agent.starts_with("confighash-webhook/")
                            && r.received_us >= from
                            && r.received_us <= to
                    })
                    .map(|r| (r.received_us, r.completed_us))
                    .collect();
                let most = most_at_once(&spans);
                reads_ok = most <= READ_CAP;
                println!(
                    "lookups during the sync: {} GETs ({:.2} per write), at most {most} held by \
                     the API server at once (audit log); cap of reads in flight {READ_CAP}: {}",
                    spans.len(),
                    spans.len() as f64 / writes as f64,
                    if reads_ok { "kept" } else { "EXCEEDED" }
                );
            }
            None => println!("lookups in flight: not measured (no CONFIGHASH_E2E_AUDIT_LOG)"),
        }
    } else {
        println!(
            "lookups in flight: not measured on the stand-in (its audit record has no times; \
             the cap is asserted by webhook::lookup's tests)"
        );
    }
    let (ours, noop_share) = (share_of[CONFIGHASH_HOOK], share_of[NOOP_HOOK]);
    let held = failed.is_empty() && stamped == writes && marked == 0 && reads_ok;
    println!(
        "RESULT: mass sync: {} of {writes} writes failed, {stamped} stamped, {marked} marked; \
         confighash {ours:.1} % within 25 ms vs the no-op's {noop_share:.1} % ({:+.1} points; \
         target within 10): {}",
        failed.len(),
        ours - noop_share,
        if held && noop_share - ours <= 10.0 {
            "met"
        } else {
            "NOT met"
        }
    );
    held
}

async fn run(mode: mode::Mode) {
    let scenario =
        std::env::var("CONFIGHASH_ADMISSION_SCENARIO").unwrap_or_else(|_| "both".to_owned());
    if !matches!(scenario.as_str(), "both" | "steady" | "mass-sync") {
        eprintln!("CONFIGHASH_ADMISSION_SCENARIO={scenario:?}: use steady, mass-sync or both");
        std::process::exit(2);
    }
    let env = Env::start().await;
    if mode == mode::Mode::Smoke && !env.is_stand_in() {
        eprintln!("admission_latency: the smoke run is for the stand-in");
        std::process::exit(2);
    }
    if scenario != "mass-sync" && mode == mode::Mode::Full {
        if env.is_stand_in() {
            println!(
                "steady: skipped, it reads kube-apiserver's histogram (source \
                 target/control-plane/e2e.env for a real cluster)"
            );
        } else {
            steady(&env).await;
            println!();
        }
    }
    if scenario != "steady" && !mass_sync(&env, mode).await {
        std::process::exit(1);
    }
}

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run(mode::from_args()));
}

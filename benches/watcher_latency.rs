//! Watcher latency: a ConfigMap change seen on the watch, to the touch of its one dependent.
//!
//! Everything runs in this process, wired as `crates/testkit/src/e2e/support.rs` does it: the in-memory API
//! server, and confighash started by `confighash::app::App` (its webhook over HTTPS registered in
//! the admission chain, and the watcher: leader, change window 1 ms, token bucket not limiting,
//! long resync). 2,000 Deployments each
//! reference their own ConfigMap; then `CHANGES` of those ConfigMaps are changed one by one at a
//! steady pace.
//!
//! Measured in the same run:
//!
//! - baseline: the stand-in's own watch delivery, from a ConfigMap write returning to a kube watch
//!   on ConfigMaps (in this process) receiving the new content;
//! - end to end: from the ConfigMap write returning to a kube watch on Deployments receiving the
//!   dependent's new stamp (watch delivery to the watcher, window, touch PATCH, admission webhook,
//!   watch delivery of the Deployment);
//! - `confighash_change_to_touch_seconds` from `metrics.encode()` (change seen on the watch to
//!   touch sent; percentiles interpolated inside the histogram's buckets).
//!
//! Environment: `CONFIGHASH_BENCH_SCALE` (fraction of the counts, default 1;
//! `CONFIGHASH_BENCH_QUICK=1` means 0.1), `CONFIGHASH_BENCH_PACE_MS` (default 20).
//!
//! `cargo bench --bench watcher_latency`. Without `--bench` (as `cargo test --benches` runs it):
//! scale 0.01 (20 Deployments, 5 changes), and every change must have touched its dependent
//! and been seen on both watches; `--list` lists nothing.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use confighash::app::{self, App};
use confighash::metrics::Metrics;
use confighash_testkit::apiserver::{ApiServer, TestCerts};
use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher::Event;
use serde_json::json;

use confighash_testkit::bench::mode;
use mode::Mode;

const KEY: &[u8] = b"bench-key-0123456789abcdef-0123456789";
const STAMP: &str = "confighash.dev/checksum";
const WORKLOADS: usize = 2_000;
const CHANGES: usize = 500;
const NAMESPACES: usize = 4;
const LOAD_CONCURRENCY: usize = 16;
const TARGET_P99: Duration = Duration::from_millis(50);
/// Sequential requests per kind in the round-trip diagnosis.
const ROUND_TRIPS: usize = 100;
const DEADLINE: Duration = Duration::from_secs(120);

/// When each object's awaited event arrived on the observing watches ("namespace/name").
type Arrivals = Arc<Mutex<HashMap<String, Instant>>>;

fn main() {
    let mode = mode::from_args();
    let quick = std::env::var("CONFIGHASH_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let fraction = match mode {
        // Without `--bench`: 20 Deployments, 5 changes.
        Mode::Smoke => 0.01,
        Mode::Full => std::env::var("CONFIGHASH_BENCH_SCALE")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|f| *f > 0.0 && *f <= 1.0)
            .unwrap_or(if quick { 0.1 } else { 1.0 }),
    };
    let pace = Duration::from_millis(
        std::env::var("CONFIGHASH_BENCH_PACE_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20u64)
            .clamp(1, 1000),
    );
    let workloads = ((WORKLOADS as f64 * fraction).round() as usize).max(NAMESPACES);
    let changes = ((CHANGES as f64 * fraction).round() as usize).clamp(1, workloads);
    // One TLS implementation for the webhook and the client, as `confighash serve` installs it.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    rt.block_on(run(fraction, workloads, changes, pace, mode));
}

fn namespace_of(i: usize) -> String {
    format!("lat-{}", i % NAMESPACES)
}

fn key_of(i: usize, prefix: &str) -> String {
    format!("{}/{prefix}-{i}", namespace_of(i))
}

async fn run(fraction: f64, workloads: usize, changes: usize, pace: Duration, mode: Mode) {
    println!(
        "watcher_latency: scale {fraction} ({workloads} Deployments, each with its own ConfigMap; \
         {changes} changes, one every {} ms)",
        pace.as_millis()
    );
    if fraction < 1.0 {
        println!("NOTE: not full scale; figures are not the recorded ones");
    }
    let api = ApiServer::start().await;
    let cluster =
        confighash::cluster::Cluster::new(api.config(), confighash::app::READS).expect("a client");
    let client = cluster.client.clone();
    // confighash, as `confighash serve` starts it, with the webhook registered as
    // crates/testkit/src/e2e/support.rs does; the watcher starts once the objects exist.
    let certs = TestCerts::generate();
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join("tls.crt"), &certs.cert_pem).expect("write the certificate");
    std::fs::write(dir.path().join("tls.key"), &certs.key_pem).expect("write the key");
    std::fs::write(dir.path().join("key"), KEY).expect("write the stamp key");
    let config = app::Config {
        listen: "127.0.0.1:0".parse().expect("an address"),
        admin_listen: "127.0.0.1:0".parse().expect("an address"),
        key: app::KeySource::File(dir.path().join("key")),
        certs: app::CertSource {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
            self_signed: None,
        },
        watcher: app::WatcherSettings {
            // The smallest window the CLI allows is > 0.
            debounce: Duration::from_millis(1),
            resync: Duration::from_secs(3600),
            max_touches_per_second: 1e9,
            retry_base: Duration::from_millis(100),
            ..Default::default()
        },
        cert_poll: Duration::from_secs(60),
        header_read_timeout: Duration::from_secs(5),
        drain_timeout: Duration::from_secs(5),
        ..app::Config::default()
    };
    let mut serving = App::from_config(config, cluster)
        .await
        .expect("confighash starts")
        .start_without_watcher()
        .await
        .expect("the webhook serves");
    let metrics = serving.metrics().clone();
    let webhook_port = serving.webhook_addr().port();
    register_webhook(
        &client,
        &format!("https://127.0.0.1:{webhook_port}/mutate"),
        &certs.ca_pem,
    )
    .await;

    // The objects: Deployment app-i uses ConfigMap cfg-i (envFrom), all namespaces opted in.
    let load_start = Instant::now();
    for n in 0..NAMESPACES {
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(namespace_of(n)),
                labels: Some(BTreeMap::from([(
                    "confighash.dev/enabled".to_owned(),
                    "true".to_owned(),
                )])),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("create a namespace");
    }
    let pp = PostParams::default();
    futures::stream::iter(0..workloads)
        .for_each_concurrent(LOAD_CONCURRENCY, |i| {
            let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace_of(i));
            let pp = &pp;
            async move {
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(format!("cfg-{i}")),
                        ..Default::default()
                    },
                    data: Some(BTreeMap::from([
                        ("v".to_owned(), "0".to_owned()),
                        (
                            "app.conf".to_owned(),
                            format!("listen = 8080\nshard = {i}\n"),
                        ),
                    ])),
                    ..Default::default()
                };
                cms.create(pp, &cm).await.expect("create a ConfigMap");
            }
        })
        .await;
    futures::stream::iter(0..workloads)
        .for_each_concurrent(LOAD_CONCURRENCY, |i| {
            let deploys: Api<Deployment> = Api::namespaced(client.clone(), &namespace_of(i));
            let pp = &pp;
            async move {
                deploys
                    .create(pp, &deployment(i))
                    .await
                    .expect("create a Deployment");
            }
        })
        .await;
    println!(
        "created {workloads} ConfigMaps and Deployments in {:.1} s",
        load_start.elapsed().as_secs_f64()
    );

    // The watcher.
    let sync_start = Instant::now();
    serving.start_watcher();
    while !metrics
        .encode()
        .lines()
        .any(|l| l == "confighash_watcher_cache_synced 1")
    {
        assert!(sync_start.elapsed() < DEADLINE, "the watcher did not sync");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!(
        "watcher synced in {:.2} s",
        sync_start.elapsed().as_secs_f64()
    );

    // The observing watches.
    let cm_arrivals: Arrivals = Arc::default();
    let deploy_arrivals: Arrivals = Arc::default();
    let (cm_ready_tx, cm_ready) = tokio::sync::oneshot::channel();
    let (deploy_ready_tx, deploy_ready) = tokio::sync::oneshot::channel();
    let cm_observer = tokio::spawn(observe_config_maps(
        client.clone(),
        cm_arrivals.clone(),
        cm_ready_tx,
    ));
    let deploy_observer = tokio::spawn(observe_deployments(
        client.clone(),
        deploy_arrivals.clone(),
        deploy_ready_tx,
    ));
    cm_ready.await.expect("the ConfigMap observer lists");
    let stamped = deploy_ready.await.expect("the Deployment observer lists");
    assert_eq!(
        stamped, workloads,
        "every Deployment carries a stamp from the webhook"
    );
    // Let reconcile after sync settle (nothing should be stale).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let observed = Observed {
        cms: cm_arrivals,
        deploys: deploy_arrivals,
    };

    // Phase A: as deployed, every touch goes through the admission webhook. Phase B: the same
    // with the webhook unregistered, so the touch PATCH goes straight in; the touches' ConfigMaps
    // are disjoint (every other of the spread-out Deployments).
    let step = (workloads / changes / 2).max(1);
    let a: Vec<usize> = (0..changes).map(|k| 2 * k * step).collect();
    let b: Vec<usize> = (0..changes).map(|k| (2 * k + 1) * step).collect();
    let phase_a = phase(&client, &metrics, &observed, &a, pace).await;
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .delete("confighash", &Default::default())
        .await
        .expect("unregister the webhook");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let phase_b = phase(&client, &metrics, &observed, &b, pace).await;
    serving.stop_watcher();
    cm_observer.abort();
    deploy_observer.abort();
    // Registered again for the diagnosis.
    register_webhook(
        &client,
        &format!("https://127.0.0.1:{webhook_port}/mutate"),
        &certs.ca_pem,
    )
    .await;
    let mut round_trips = diagnose_round_trips(&client).await;
    round_trips.extend(diagnose_webhook_connections(&client, webhook_port, &certs.ca_pem).await);
    let encoded = metrics.encode();
    serving.shutdown().await;

    let counter = |name: &str| -> f64 {
        encoded
            .lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    println!(
        "touches over the run: touched {}, kept-by-webhook {}, error {}, gone {}; rate limited {}; \
         retries {}",
        metrics.touches("touched"),
        metrics.touches("kept-by-webhook"),
        metrics.touches("error"),
        metrics.touches("gone"),
        counter("confighash_touches_rate_limited_total"),
        counter("confighash_touch_retries_total"),
    );
    for (name, p) in [
        ("A (webhook in the path)", &phase_a),
        ("B (webhook unregistered)", &phase_b),
    ] {
        println!(
            "phase {name}: {} ConfigMap writes in {:.2} s ({:.1}/s), write time p50 {:.2} ms p99 \
             {:.2} ms; touched {}; missing ConfigMap events {}, missing stamp events {}; ConfigMap \
             events before the write returned {}",
            p.changes,
            p.writing.as_secs_f64(),
            p.changes as f64 / p.writing.as_secs_f64(),
            pct(&p.write_time, 50.0),
            pct(&p.write_time, 99.0),
            p.touched,
            p.missing_cm,
            p.missing_deploy,
            p.early
        );
    }
    if mode == Mode::Smoke {
        for (name, p) in [("A", &phase_a), ("B", &phase_b)] {
            assert!(
                p.changes == changes
                    && p.touched == changes as u64
                    && p.missing_cm == 0
                    && p.missing_deploy == 0
                    && p.end_to_end.len() == changes,
                "phase {name}: {} changes, touched {}, missing ConfigMap events {}, missing \
                 stamp events {}, {} end-to-end latencies",
                p.changes,
                p.touched,
                p.missing_cm,
                p.missing_deploy,
                p.end_to_end.len()
            );
        }
        println!("watcher_latency: smoke run held, every change touched its dependent once");
    }
    println!();
    println!("| Measure | n | p50 | p90 | p99 | max |");
    println!("|---|---|---|---|---|---|");
    let row = |name: &str, v: &[f64]| {
        println!(
            "| {name} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms |",
            v.len(),
            pct(v, 50.0),
            pct(v, 90.0),
            pct(v, 99.0),
            pct(v, 100.0)
        );
    };
    let hist_row = |name: &str, h: &Histogram| {
        println!(
            "| {name}, interpolated | {} | {:.2} ms | {:.2} ms | {:.2} ms | (bucket <= {}) |",
            h.count,
            h.quantile(0.5) * 1e3,
            h.quantile(0.9) * 1e3,
            h.quantile(0.99) * 1e3,
            h.upper_bucket_ms()
        );
    };
    for (name, p) in [("A", &phase_a), ("B", &phase_b)] {
        row(
            &format!("{name}: baseline, stand-in watch delivery (write sent -> ConfigMap event)"),
            &p.delivery,
        );
        hist_row(
            &format!("{name}: `change_to_touch_seconds` (change seen -> touch sent)"),
            &p.hist,
        );
        row(
            &format!("{name}: ConfigMap event -> Deployment event with the new stamp"),
            &p.after_seen,
        );
        row(
            &format!("{name}: end to end (write sent -> Deployment event with the new stamp)"),
            &p.end_to_end,
        );
    }
    hist_row(
        "A: `webhook_request_duration_seconds` (handler time, all reviews)",
        &phase_a.webhook_hist,
    );
    for (name, p) in [("A", &phase_a), ("B", &phase_b)] {
        println!(
            "{name}: `change_to_touch_seconds` mean {:.2} ms; buckets: {}",
            p.hist.sum / p.hist.count.max(1) as f64 * 1e3,
            p.hist.describe()
        );
    }
    println!();
    println!(
        "Diagnosis after the run: sequential round trips from a kube::Client to the stand-in, and \
         AdmissionReviews POSTed straight to the webhook over HTTP/1.1 with TLS:"
    );
    println!();
    println!("| Request | n | p50 | p90 | p99 | max |");
    println!("|---|---|---|---|---|---|");
    for (name, v) in &round_trips {
        row(name, v);
    }
    println!();
    println!("| Ratio to the stand-in's watch delivery (same phase) | p50 | p99 |");
    println!("|---|---|---|");
    for (name, p) in [("A", &phase_a), ("B", &phase_b)] {
        let d50 = pct(&p.delivery, 50.0);
        let d99 = pct(&p.delivery, 99.0);
        println!(
            "| {name}: `change_to_touch_seconds` / delivery | {:.2} | {:.2} |",
            p.hist.quantile(0.5) * 1e3 / d50,
            p.hist.quantile(0.99) * 1e3 / d99
        );
        println!(
            "| {name}: end to end / delivery | {:.2} | {:.2} |",
            pct(&p.end_to_end, 50.0) / d50,
            pct(&p.end_to_end, 99.0) / d99
        );
    }
    println!();
    let target = ms(TARGET_P99);
    for (name, p) in [("A", &phase_a), ("B", &phase_b)] {
        let hist_p99 = p.hist.quantile(0.99) * 1e3;
        let e99 = pct(&p.end_to_end, 99.0);
        println!(
            "phase {name}, target p99 < {target:.0} ms: change seen -> touch sent (histogram) \
             {hist_p99:.2} ms: {}; end to end, stamp observed {e99:.2} ms: {}",
            verdict(hist_p99 < target && p.hist.count as usize >= p.changes),
            verdict(e99 < target && p.missing_deploy == 0)
        );
    }
}

/// What the observing watches saw.
struct Observed {
    cms: Arrivals,
    deploys: Arrivals,
}

/// The readings of one sequence of changes.
struct PhaseResult {
    changes: usize,
    writing: Duration,
    write_time: Vec<f64>,
    delivery: Vec<f64>,
    end_to_end: Vec<f64>,
    after_seen: Vec<f64>,
    early: usize,
    missing_cm: usize,
    missing_deploy: usize,
    touched: u64,
    /// This phase's observations only.
    hist: Histogram,
    webhook_hist: Histogram,
}

/// Changes the ConfigMaps of `picked` one by one, one every `pace`, and waits for their
/// Deployments' new stamps.
async fn phase(
    client: &kube::Client,
    metrics: &Metrics,
    observed: &Observed,
    picked: &[usize],
    pace: Duration,
) -> PhaseResult {
    let before = metrics.encode();
    let touched_before = metrics.touches("touched");
    let mut written: Vec<(Instant, Instant)> = Vec::with_capacity(picked.len());
    let mut ticker = tokio::time::interval(pace);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let run_start = Instant::now();
    for &i in picked {
        ticker.tick().await;
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace_of(i));
        let start = Instant::now();
        cms.patch(
            &format!("cfg-{i}"),
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"v": "1"}})),
        )
        .await
        .expect("change a ConfigMap");
        written.push((start, Instant::now()));
    }
    let writing = run_start.elapsed();
    let all_seen = || {
        let deploys = observed.deploys.lock().expect("lock");
        picked
            .iter()
            .all(|&i| deploys.contains_key(&key_of(i, "app")))
    };
    let wait_start = Instant::now();
    while !all_seen() && wait_start.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = metrics.encode();

    // Measured from the write being sent: the stand-in broadcasts a write to its watches before
    // it answers the write, so most events arrive before the write returns.
    let cms = observed.cms.lock().expect("lock").clone();
    let deploys = observed.deploys.lock().expect("lock").clone();
    let mut r = PhaseResult {
        changes: picked.len(),
        writing,
        write_time: Vec::new(),
        delivery: Vec::new(),
        end_to_end: Vec::new(),
        after_seen: Vec::new(),
        early: 0,
        missing_cm: 0,
        missing_deploy: 0,
        touched: metrics.touches("touched") - touched_before,
        hist: Histogram::parse(&after, "confighash_change_to_touch_seconds").minus(
            &Histogram::parse(&before, "confighash_change_to_touch_seconds"),
        ),
        webhook_hist: Histogram::parse(&after, "confighash_webhook_request_duration_seconds")
            .minus(&Histogram::parse(
                &before,
                "confighash_webhook_request_duration_seconds",
            )),
    };
    for (&i, &(start, returned)) in picked.iter().zip(&written) {
        r.write_time.push(ms(returned - start));
        let cm = cms.get(&key_of(i, "cfg")).copied();
        let deploy = deploys.get(&key_of(i, "app")).copied();
        match cm {
            Some(t) => {
                if t < returned {
                    r.early += 1;
                }
                r.delivery.push(ms(t.saturating_duration_since(start)));
            }
            None => r.missing_cm += 1,
        }
        match deploy {
            Some(t) => r.end_to_end.push(ms(t.saturating_duration_since(start))),
            None => r.missing_deploy += 1,
        }
        if let (Some(c), Some(d)) = (cm, deploy) {
            r.after_seen.push(ms(d.saturating_duration_since(c)));
        }
    }
    r
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Nearest-rank percentile (100: the maximum).
fn pct(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

fn verdict(ok: bool) -> &'static str {
    if ok { "MET" } else { "MISSED" }
}

/// A Prometheus histogram read back from the text exposition.
struct Histogram {
    /// (upper bound, cumulative count), ascending, `+Inf` last.
    buckets: Vec<(f64, u64)>,
    count: u64,
    sum: f64,
}

impl Histogram {
    fn parse(text: &str, name: &str) -> Histogram {
        let bucket = format!("{name}_bucket{{le=\"");
        let mut buckets = Vec::new();
        let mut count = 0;
        let mut sum = 0.0;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix(&bucket) {
                if let Some((le, n)) = rest.split_once("\"} ") {
                    let le = if le == "+Inf" {
                        f64::INFINITY
                    } else {
                        le.parse().unwrap_or(f64::NAN)
                    };
                    buckets.push((le, n.trim().parse().unwrap_or(0)));
                }
            } else if let Some(n) = line.strip_prefix(&format!("{name}_count ")) {
                count = n.trim().parse().unwrap_or(0);
            } else if let Some(n) = line.strip_prefix(&format!("{name}_sum ")) {
                sum = n.trim().parse().unwrap_or(0.0);
            }
        }
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        Histogram {
            buckets,
            count,
            sum,
        }
    }

    /// The observations of `self` that `earlier` (the same histogram, read before) had not.
    fn minus(&self, earlier: &Histogram) -> Histogram {
        let before: HashMap<u64, u64> = earlier
            .buckets
            .iter()
            .map(|(le, n)| (le.to_bits(), *n))
            .collect();
        Histogram {
            buckets: self
                .buckets
                .iter()
                .map(|(le, n)| (*le, n - before.get(&le.to_bits()).copied().unwrap_or(0)))
                .collect(),
            count: self.count - earlier.count,
            sum: self.sum - earlier.sum,
        }
    }

    /// Linear interpolation inside the bucket holding the quantile (Prometheus'
    /// `histogram_quantile`; the first bucket starts at 0).
    fn quantile(&self, q: f64) -> f64 {
        if self.count == 0 {
            return f64::NAN;
        }
        let rank = q * self.count as f64;
        let mut lower = (0.0, 0u64);
        for &(le, n) in &self.buckets {
            if n as f64 >= rank {
                if le.is_infinite() {
                    return lower.0;
                }
                let inside = (n - lower.1) as f64;
                let into = rank - lower.1 as f64;
                return lower.0 + (le - lower.0) * if inside > 0.0 { into / inside } else { 1.0 };
            }
            lower = (le, n);
        }
        f64::NAN
    }

    /// Upper bound (ms) of the highest bucket that holds an observation.
    fn upper_bucket_ms(&self) -> String {
        let mut prev = 0;
        let mut top = None;
        for &(le, n) in &self.buckets {
            if n > prev {
                top = Some(le);
            }
            prev = n;
        }
        match top {
            Some(le) if le.is_infinite() => "+Inf".to_owned(),
            Some(le) => format!("{:.0} ms", le * 1e3),
            None => "-".to_owned(),
        }
    }

    /// Non-empty buckets as `(lower, upper] ms: count`.
    fn describe(&self) -> String {
        let mut out = Vec::new();
        let mut lower = (0.0, 0u64);
        for &(le, n) in &self.buckets {
            if n > lower.1 {
                out.push(format!(
                    "({:.0}, {}] ms: {}",
                    lower.0 * 1e3,
                    if le.is_infinite() {
                        "+Inf".to_owned()
                    } else {
                        format!("{:.0}", le * 1e3)
                    },
                    n - lower.1
                ));
            }
            lower = (le, n);
        }
        out.join(", ")
    }
}

fn deployment(i: usize) -> Deployment {
    let name = format!("app-{i}");
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{
                    "name": "app",
                    "image": "example/app:1",
                    "envFrom": [{"configMapRef": {"name": format!("cfg-{i}")}}]
                }]}
            }
        }
    }))
    .expect("a valid Deployment")
}

/// Registers confighash's MutatingWebhookConfiguration, as deploy/ and the e2e support do.
async fn register_webhook(client: &kube::Client, url: &str, ca_pem: &str) {
    let configuration: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": "confighash"},
        "webhooks": [{
            "name": "stamp.confighash.dev",
            "clientConfig": {"url": url, "caBundle": base64::engine::general_purpose::STANDARD.encode(ca_pem)},
            "rules": [
                {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                 "resources": ["deployments", "statefulsets", "daemonsets"], "scope": "Namespaced"},
                {"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                 "resources": ["cronjobs"], "scope": "Namespaced"},
                {"apiGroups": ["argoproj.io"], "apiVersions": ["v1alpha1"], "operations": ["CREATE", "UPDATE"],
                 "resources": ["rollouts"], "scope": "Namespaced"}
            ],
            "namespaceSelector": {"matchLabels": {"confighash.dev/enabled": "true"}},
            "objectSelector": {"matchExpressions": [{"key": "confighash.dev/enabled", "operator": "NotIn", "values": ["false"]}]},
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "timeoutSeconds": 5,
            "reinvocationPolicy": "IfNeeded",
            "admissionReviewVersions": ["v1"]
        }]
    }))
    .expect("a valid MutatingWebhookConfiguration");
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &configuration)
        .await
        .expect("register the webhook");
}

fn object_key<K: kube::Resource>(obj: &K) -> String {
    format!(
        "{}/{}",
        obj.meta().namespace.as_deref().unwrap_or(""),
        obj.meta().name.as_deref().unwrap_or("")
    )
}

/// Records when each ConfigMap's changed content (`v` = "1") first arrives.
async fn observe_config_maps(
    client: kube::Client,
    arrivals: Arrivals,
    ready: tokio::sync::oneshot::Sender<()>,
) {
    let mut ready = Some(ready);
    let mut events = std::pin::pin!(kube::runtime::watcher(
        Api::<ConfigMap>::all(client),
        Default::default()
    ));
    while let Some(event) = events.next().await {
        let now = Instant::now();
        match event {
            Ok(Event::InitDone) => {
                if let Some(r) = ready.take() {
                    let _ = r.send(());
                }
            }
            Ok(Event::Apply(cm))
                if cm
                    .data
                    .as_ref()
                    .and_then(|d| d.get("v"))
                    .map(String::as_str)
                    == Some("1") =>
            {
                arrivals
                    .lock()
                    .expect("lock")
                    .entry(object_key(&cm))
                    .or_insert(now);
            }
            _ => {}
        }
    }
}

fn stamp_of(d: &Deployment) -> Option<String> {
    d.spec
        .as_ref()?
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(STAMP)
        .cloned()
}

/// Records when each Deployment's stamp first changes; sends how many carry a stamp once listed.
async fn observe_deployments(
    client: kube::Client,
    arrivals: Arrivals,
    ready: tokio::sync::oneshot::Sender<usize>,
) {
    let mut ready = Some(ready);
    let mut initial: HashMap<String, Option<String>> = HashMap::new();
    let mut events = std::pin::pin!(kube::runtime::watcher(
        Api::<Deployment>::all(client),
        Default::default()
    ));
    while let Some(event) = events.next().await {
        let now = Instant::now();
        match event {
            Ok(Event::InitApply(d)) => {
                initial.entry(object_key(&d)).or_insert(stamp_of(&d));
            }
            Ok(Event::InitDone) => {
                if let Some(r) = ready.take() {
                    let _ = r.send(initial.values().filter(|s| s.is_some()).count());
                }
            }
            Ok(Event::Apply(d)) => {
                let key = object_key(&d);
                let stamp = stamp_of(&d);
                if initial.get(&key).is_some_and(|s| *s != stamp) {
                    arrivals.lock().expect("lock").entry(key).or_insert(now);
                }
            }
            _ => {}
        }
    }
}

/// Round trips of single requests, to locate time spent outside the watcher: a GET, a
/// ConfigMap PATCH (no admission webhook), a Deployment PATCH in a namespace that is not opted in
/// (the webhook is not called) and one in an opted-in namespace (the API server calls the webhook,
/// which reads the ConfigMap back from the API server), like the watcher's touch.
async fn diagnose_round_trips(client: &kube::Client) -> Vec<(&'static str, Vec<f64>)> {
    let out_ns = "lat-out";
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(out_ns.to_owned()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .expect("create a namespace");
    let in_ns = namespace_of(0);
    let out_cms: Api<ConfigMap> = Api::namespaced(client.clone(), out_ns);
    let mut cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some("cfg-0".to_owned()),
            ..Default::default()
        },
        ..Default::default()
    };
    cm.data = Some(BTreeMap::from([("v".to_owned(), "0".to_owned())]));
    out_cms
        .create(&PostParams::default(), &cm)
        .await
        .expect("create a ConfigMap");
    let out_deploys: Api<Deployment> = Api::namespaced(client.clone(), out_ns);
    out_deploys
        .create(&PostParams::default(), &deployment(0))
        .await
        .expect("create a Deployment");
    let in_deploys: Api<Deployment> = Api::namespaced(client.clone(), &in_ns);
    let in_cms: Api<ConfigMap> = Api::namespaced(client.clone(), &in_ns);
    let poke = |n: usize| json!({"spec": {"template": {"metadata": {"annotations": {"bench/poke": n.to_string()}}}}});
    let mut get = Vec::new();
    let mut cm_patch = Vec::new();
    let mut plain = Vec::new();
    let mut admitted = Vec::new();
    for n in 0..ROUND_TRIPS {
        let t = Instant::now();
        in_cms.get("cfg-0").await.expect("a GET");
        get.push(ms(t.elapsed()));
        let t = Instant::now();
        out_cms
            .patch(
                "cfg-0",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"v": n.to_string()}})),
            )
            .await
            .expect("a ConfigMap PATCH");
        cm_patch.push(ms(t.elapsed()));
        let t = Instant::now();
        out_deploys
            .patch("app-0", &PatchParams::default(), &Patch::Merge(poke(n)))
            .await
            .expect("a Deployment PATCH");
        plain.push(ms(t.elapsed()));
        let t = Instant::now();
        in_deploys
            .patch("app-0", &PatchParams::default(), &Patch::Merge(poke(n)))
            .await
            .expect("a Deployment PATCH");
        admitted.push(ms(t.elapsed()));
    }
    vec![
        ("GET ConfigMap", get),
        ("PATCH ConfigMap (no webhook)", cm_patch),
        (
            "PATCH Deployment template, namespace not opted in (webhook not called)",
            plain,
        ),
        (
            "PATCH Deployment template, opted in (webhook called, as a touch)",
            admitted,
        ),
    ]
}

/// AdmissionReviews (UPDATE of an opted-in Deployment, as a touch sends) POSTed straight to the
/// webhook: on a new TCP and TLS connection per review (as the stand-in calls webhooks), with and
/// without TCP_NODELAY on the client socket, and on one kept-alive connection.
async fn diagnose_webhook_connections(
    client: &kube::Client,
    port: u16,
    ca_pem: &str,
) -> Vec<(&'static str, Vec<f64>)> {
    use rustls_pki_types::ServerName;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let ns = namespace_of(0);
    let old: serde_json::Value = serde_json::to_value(
        Api::<Deployment>::namespaced(client.clone(), &ns)
            .get("app-0")
            .await
            .expect("the Deployment"),
    )
    .expect("JSON");
    let mut new = old.clone();
    new["spec"]["template"]["metadata"]["annotations"]["bench/poke"] = json!("review");
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
            "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
            "namespace": ns,
            "name": "app-0",
            "operation": "UPDATE",
            "userInfo": {"username": "system:serviceaccount:confighash:confighash"},
            "object": new,
            "oldObject": old,
            "dryRun": false
        }
    })
    .to_string();
    let request = format!(
        "POST /mutate?timeout=5s HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Accept: application/json\r\nContent-Length: {}\r\n\r\n{review}",
        review.len()
    );
    let tls = Arc::new(confighash_testkit::apiserver::https::client_config(
        ca_pem,
        &[],
    ));
    let connector = tokio_rustls::TlsConnector::from(tls);
    let server = ServerName::try_from("127.0.0.1").expect("a server name");
    let connect = |nodelay: bool| {
        let connector = connector.clone();
        let server = server.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .expect("connect to the webhook");
            tcp.set_nodelay(nodelay).expect("set TCP_NODELAY");
            connector
                .connect(server, tcp)
                .await
                .expect("a TLS handshake")
        }
    };
    // One review: the request in one write, then the response head and its Content-Length body.
    async fn exchange<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
        stream: &mut S,
        request: &[u8],
    ) {
        stream.write_all(request).await.expect("send the review");
        stream.flush().await.expect("flush");
        let mut buf = Vec::with_capacity(4096);
        let mut chunk = [0u8; 4096];
        loop {
            let n = stream.read(&mut chunk).await.expect("read the answer");
            assert!(n > 0, "the webhook closed the connection");
            buf.extend_from_slice(&chunk[..n]);
            let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            assert!(
                head.starts_with("http/1.1 200"),
                "the webhook answered {head}"
            );
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .expect("a Content-Length");
            while buf.len() < end + 4 + length {
                let n = stream.read(&mut chunk).await.expect("read the answer");
                assert!(n > 0, "the webhook closed the connection");
                buf.extend_from_slice(&chunk[..n]);
            }
            return;
        }
    }
    let mut fresh = Vec::new();
    let mut fresh_nodelay = Vec::new();
    let mut kept = Vec::new();
    let mut alive = connect(false).await;
    for _ in 0..ROUND_TRIPS {
        let t = Instant::now();
        let mut s = connect(false).await;
        exchange(&mut s, request.as_bytes()).await;
        fresh.push(ms(t.elapsed()));
        let t = Instant::now();
        let mut s = connect(true).await;
        exchange(&mut s, request.as_bytes()).await;
        fresh_nodelay.push(ms(t.elapsed()));
        let t = Instant::now();
        exchange(&mut alive, request.as_bytes()).await;
        kept.push(ms(t.elapsed()));
    }
    vec![
        (
            "review to the webhook, new TCP+TLS connection each (as the stand-in calls it)",
            fresh,
        ),
        (
            "review to the webhook, new connection each, TCP_NODELAY on the client",
            fresh_nodelay,
        ),
        ("review to the webhook, one kept-alive connection", kept),
    ]
}

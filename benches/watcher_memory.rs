//! Memory and initial sync time of confighash's watcher, versus a full-object reflector.
//!
//! RSS is a property of a process, so this bench re-executes itself (`std::env::current_exe`)
//! with `CONFIGHASH_BENCH_ROLE` selecting what the child does:
//!
//! - `server`: the in-memory API server (`apiserver::ApiServer`) on 127.0.0.1; it prints its URL
//!   on stdout and runs until its stdin is closed. The parent loads it over HTTP with Secrets,
//!   Helm release records (Secrets of type `helm.sh/release.v1`, about 500 KiB each), ConfigMaps
//!   and Deployments (16 requests in flight).
//! - `watcher`: `confighash::watcher::run_with_secret_page_size` (leader, default
//!   `WatcherConfig` with a long resync; Secret pages of `watcher::SECRET_PAGE_SIZE` unless the
//!   parent says otherwise) until `confighash_watcher_cache_synced 1`, then a few seconds of
//!   steady state, then VmRSS and VmHWM from `/proc/self/status`.
//! - `reflector`: the baseline, kube-runtime reflectors (`reflector::store()` writers, default
//!   `watcher::Config`) for Secrets, ConfigMaps and Deployments, as Reloader/Wave-style controllers
//!   keep them; same readings.
//! - `list`: the sync-time baseline, a bare `Api::list` of all Secrets, ConfigMaps and Deployments
//!   (the three kinds at once), paged with kube-runtime's default page size (500).
//!
//! The parent runs the measured children one after the other, `ROUNDS` times, and prints a table.
//! Each watcher variant (below) runs once a round, between the list and the reflectors.
//!
//! Environment:
//! - `CONFIGHASH_BENCH_SCALE`: fraction of the full object counts (default 1; for quick runs while
//!   developing, e.g. 0.05). `CONFIGHASH_BENCH_QUICK=1` means 0.05. Recorded figures are at 1.
//! - `CONFIGHASH_BENCH_HELM_RELEASES`: Helm release records at full scale (default 1,000; 0 loads
//!   the population of the figures recorded before they were added);
//!   `CONFIGHASH_BENCH_HELM_RELEASE_KIB`: the size of each (default 500; Secrets hold at most
//!   1 MiB).
//! - `CONFIGHASH_BENCH_ROUNDS`: rounds of (list, watchers, reflector) (default 3).
//! - `CONFIGHASH_BENCH_STEADY_SECS`: steady-state wait after sync (default 5).
//! - `CONFIGHASH_BENCH_SECRET_PAGES`: Secret page sizes to run this build's watcher with, side by
//!   side, e.g. `10,5,20,50` (default: `watcher::SECRET_PAGE_SIZE`). The targets are judged for
//!   each; the first is the one recorded.
//! - `CONFIGHASH_BENCH_OTHER_EXE`: the bench binary of another build (e.g. of an older commit)
//!   whose watcher also runs each round, with its own defaults; `CONFIGHASH_BENCH_OTHER_LABEL`
//!   names it in the tables.
//!
//! `cargo bench --bench watcher_memory`. Without `--bench` (as `cargo test --benches` runs it):
//! one object of each kind per namespace, one round, 1 s of steady state, and the readings
//! checked for sense (every child synced, saw every object, reported its memory); `--list` lists
//! nothing.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use confighash::admin::metrics::Metrics;
use confighash::certs::key::KeyStore;
use confighash::core::checksum::StampKey;
use confighash::watcher::leader::Leadership;
use confighash::watcher::{self, WatcherConfig};
use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, reflector};
use serde_json::{Value, json};

#[path = "common/mode.rs"]
mod mode;
use mode::Mode;

const ROLE_ENV: &str = "CONFIGHASH_BENCH_ROLE";
const URL_ENV: &str = "CONFIGHASH_BENCH_URL";
/// A kubeconfig of a real cluster to load and measure against instead of the in-memory API
/// server (`target/control-plane/admin.kubeconfig` of `scripts/control-plane.sh up`).
const KUBECONFIG_ENV: &str = "CONFIGHASH_BENCH_KUBECONFIG";
/// What `URL_ENV` starts with when the children read a kubeconfig instead.
const KUBECONFIG_URL: &str = "kubeconfig:";
/// The Secret page size of a `watcher` child (absent: `watcher::SECRET_PAGE_SIZE`).
const SECRET_PAGE_ENV: &str = "CONFIGHASH_BENCH_SECRET_PAGE";

/// Full-scale counts.
const SECRETS: usize = 10_000;
const CONFIG_MAPS: usize = 5_000;
const DEPLOYMENTS: usize = 2_000;
const NAMESPACES: usize = 20;
/// Helm release records, spread over every namespace as the other objects are.
const HELM_RELEASES: usize = 1_000;
/// The size of the one key of a release record, `release`: base64 text (of the gzipped release,
/// in Helm).
const HELM_RELEASE_KIB: usize = 500;
/// 4 keys of 16 KiB: 64 KiB of data per Secret.
const SECRET_KEYS: usize = 4;
const SECRET_KEY_BYTES: usize = 16 * 1024;
/// 2 keys of 8 KiB: 16 KiB of data per ConfigMap.
const CM_KEYS: usize = 2;
const CM_KEY_BYTES: usize = 8 * 1024;
/// Requests in flight while loading.
const LOAD_CONCURRENCY: usize = 16;
/// kube-runtime's default `watcher::Config` page size, used for the bare list.
const LIST_PAGE: u32 = 500;

/// Targets.
const TARGET_STEADY_KIB: u64 = 32 * 1024;
const TARGET_PEAK_KIB: u64 = 96 * 1024;
const TARGET_RATIO: f64 = 0.1;
const TARGET_SYNC_RATIO: f64 = 1.5;

const KEY: &[u8] = b"bench-key-0123456789abcdef-0123456789";

fn main() {
    match std::env::var(ROLE_ENV).as_deref() {
        Ok("server") => child_server(),
        Ok("watcher") => child_watcher(),
        Ok("reflector") => child_reflector(),
        Ok("list") => child_list(),
        Ok("index") => child_index(),
        Ok(other) => panic!("unknown {ROLE_ENV} {other:?}"),
        Err(_) => parent(mode::from_args()),
    }
}

// ----- sizes -----

#[derive(Debug, Clone, Copy)]
struct Scale {
    fraction: f64,
    secrets_per_ns: usize,
    /// Helm release records at full scale, as `CONFIGHASH_BENCH_HELM_RELEASES` says.
    helm_full_scale: usize,
    helm_per_ns: usize,
    helm_release_bytes: usize,
    cms_per_ns: usize,
    deploys_per_ns: usize,
}

impl Scale {
    fn from_env() -> Scale {
        Scale::from_env_with(HELM_RELEASES)
    }

    /// As [`Scale::from_env`], with `helm_default` Helm release records at full scale unless
    /// `CONFIGHASH_BENCH_HELM_RELEASES` says otherwise.
    fn from_env_with(helm_default: usize) -> Scale {
        let quick =
            std::env::var("CONFIGHASH_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        let fraction = std::env::var("CONFIGHASH_BENCH_SCALE")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|f| *f > 0.0 && *f <= 1.0)
            .unwrap_or(if quick { 0.05 } else { 1.0 });
        let helm = env_u64("CONFIGHASH_BENCH_HELM_RELEASES", helm_default as u64) as usize;
        let kib = env_u64("CONFIGHASH_BENCH_HELM_RELEASE_KIB", HELM_RELEASE_KIB as u64);
        Scale {
            helm_release_bytes: kib.clamp(1, 1024) as usize * 1024,
            ..Scale::from_fraction(fraction, helm)
        }
    }

    fn from_fraction(fraction: f64, helm_releases: usize) -> Scale {
        let per_ns =
            |total: usize| ((total as f64 * fraction / NAMESPACES as f64).round() as usize).max(1);
        Scale {
            fraction,
            secrets_per_ns: per_ns(SECRETS),
            helm_full_scale: helm_releases,
            helm_per_ns: if helm_releases == 0 {
                0
            } else {
                per_ns(helm_releases)
            },
            helm_release_bytes: HELM_RELEASE_KIB * 1024,
            cms_per_ns: per_ns(CONFIG_MAPS),
            deploys_per_ns: per_ns(DEPLOYMENTS),
        }
    }

    /// Without `--bench`: one object of each kind per namespace.
    fn smoke() -> Scale {
        Scale::from_fraction(0.0001, HELM_RELEASES)
    }

    /// Opaque Secrets.
    fn secrets(&self) -> usize {
        self.secrets_per_ns * NAMESPACES
    }

    fn helm_releases(&self) -> usize {
        self.helm_per_ns * NAMESPACES
    }

    fn cms(&self) -> usize {
        self.cms_per_ns * NAMESPACES
    }

    fn deploys(&self) -> usize {
        self.deploys_per_ns * NAMESPACES
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn namespace_name(n: usize) -> String {
    format!("team-{n:02}")
}

// ----- object generation -----

/// splitmix64: deterministic filler, different for every object and key.
struct Filler(u64);

impl Filler {
    fn new(seed: u64) -> Self {
        Filler(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            out.extend_from_slice(&self.next().to_le_bytes());
        }
        out.truncate(len);
        out
    }

    fn text(&mut self, len: usize) -> String {
        const ALPHABET: &[u8] =
            b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789=\n _-";
        self.bytes(len)
            .into_iter()
            .map(|b| ALPHABET[b as usize % ALPHABET.len()] as char)
            .collect()
    }
}

fn meta(name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        labels: Some(BTreeMap::from([(
            "app.kubernetes.io/part-of".to_owned(),
            "bench".to_owned(),
        )])),
        ..Default::default()
    }
}

fn secret(ns: usize, k: usize) -> Secret {
    let mut fill = Filler::new(((ns as u64) << 32) | k as u64);
    Secret {
        metadata: meta(format!("secret-{k}")),
        type_: Some("Opaque".to_owned()),
        data: Some(
            (0..SECRET_KEYS)
                .map(|i| (format!("key-{i}"), ByteString(fill.bytes(SECRET_KEY_BYTES))))
                .collect(),
        ),
        ..Default::default()
    }
}

/// Release record `k` of a namespace, as Helm 3 writes them: type `helm.sh/release.v1`, Helm's
/// labels, and the key `release`.
fn helm_release(scale: &Scale, ns: usize, k: usize) -> Secret {
    use base64::Engine;
    let mut fill = Filler::new((1 << 61) | ((ns as u64) << 32) | k as u64);
    let release = base64::engine::general_purpose::STANDARD
        .encode(fill.bytes(scale.helm_release_bytes / 4 * 3));
    let name = format!("app-{k}");
    let mut metadata = meta(format!("sh.helm.release.v1.{name}.v1"));
    metadata.labels = Some(BTreeMap::from(
        [
            ("name", name.as_str()),
            ("owner", "helm"),
            ("status", "deployed"),
            ("version", "1"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned())),
    ));
    Secret {
        metadata,
        type_: Some("helm.sh/release.v1".to_owned()),
        data: Some(BTreeMap::from([(
            "release".to_owned(),
            ByteString(release.into_bytes()),
        )])),
        ..Default::default()
    }
}

fn config_map(ns: usize, k: usize) -> ConfigMap {
    let mut fill = Filler::new((1 << 62) | ((ns as u64) << 32) | k as u64);
    ConfigMap {
        metadata: meta(format!("cm-{k}")),
        data: Some(
            (0..CM_KEYS)
                .map(|i| (format!("file-{i}.conf"), fill.text(CM_KEY_BYTES)))
                .collect(),
        ),
        ..Default::default()
    }
}

/// Deployment `k` of a namespace references two ConfigMaps (envFrom, volume) and two Secrets
/// (envFrom, one key) of its namespace. It carries the status its controller writes once rolled
/// out (the stand-in keeps it), so the watcher reads where its rollout stands as in a cluster.
fn deployment(scale: &Scale, k: usize) -> Deployment {
    let cm_a = format!("cm-{}", (2 * k) % scale.cms_per_ns);
    let cm_b = format!("cm-{}", (2 * k + 1) % scale.cms_per_ns);
    let secret_a = format!("secret-{}", (5 * k) % scale.secrets_per_ns);
    let secret_b = format!("secret-{}", (5 * k + 1) % scale.secrets_per_ns);
    let name = format!("app-{k}");
    let v: Value = json!({
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [{
                        "name": "app",
                        "image": "registry.example/app:1.2.3",
                        "args": ["--config", "/etc/app/file-0.conf"],
                        "ports": [{"containerPort": 8080, "name": "http"}],
                        "envFrom": [{"configMapRef": {"name": cm_a}}, {"secretRef": {"name": secret_a}}],
                        "env": [
                            {"name": "LOG_LEVEL", "value": "info"},
                            {"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": secret_b, "key": "key-0"}}}
                        ],
                        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
                        "volumeMounts": [{"name": "config", "mountPath": "/etc/app"}]
                    }],
                    "volumes": [{"name": "config", "configMap": {"name": cm_b}}]
                }
            }
        },
        "status": {
            "observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2,
            "availableReplicas": 2,
            "conditions": [
                {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                 "message": "Deployment has minimum availability.",
                 "lastUpdateTime": "2026-01-01T00:00:00Z",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
                 "message": format!("ReplicaSet \"{name}-7d9f8b6c5\" has successfully progressed."),
                 "lastUpdateTime": "2026-01-01T00:00:00Z",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}
            ]
        }
    });
    serde_json::from_value(v).expect("a valid Deployment")
}

// ----- parent -----

struct Reading {
    /// Seconds from start to synced (for `list`: to the last page).
    sync_secs: f64,
    rss_kib: u64,
    hwm_kib: u64,
    detail: Value,
}

/// A watcher to measure: this build's with Secret pages of a size, or another build's.
struct Variant {
    label: String,
    exe: PathBuf,
    /// `None`: the build's own default.
    secret_page: Option<u32>,
}

impl Variant {
    fn env(&self) -> Vec<(&'static str, String)> {
        self.secret_page
            .map(|p| (SECRET_PAGE_ENV, p.to_string()))
            .into_iter()
            .collect()
    }
}

/// The watchers to measure, this build's default first.
fn variants(exe: &Path, mode: Mode) -> Vec<Variant> {
    let mut pages: Vec<u32> = match (mode, std::env::var("CONFIGHASH_BENCH_SECRET_PAGES")) {
        (Mode::Full, Ok(list)) => list
            .split(',')
            .map(|p| {
                p.trim()
                    .parse()
                    .expect("CONFIGHASH_BENCH_SECRET_PAGES: page sizes")
            })
            .collect(),
        _ => Vec::new(),
    };
    if pages.is_empty() {
        pages.push(watcher::SECRET_PAGE_SIZE);
    }
    let mut variants: Vec<Variant> = pages
        .into_iter()
        .map(|p| Variant {
            label: format!("confighash watcher, Secret page {p}"),
            exe: exe.to_owned(),
            secret_page: Some(p),
        })
        .collect();
    if mode == Mode::Full
        && let Some(other) = std::env::var_os("CONFIGHASH_BENCH_OTHER_EXE")
    {
        let label = std::env::var("CONFIGHASH_BENCH_OTHER_LABEL")
            .unwrap_or_else(|_| "watcher of another build".to_owned());
        variants.push(Variant {
            label,
            exe: PathBuf::from(other),
            secret_page: None,
        });
    }
    variants
}

fn parent(mode: Mode) {
    let real = match mode {
        Mode::Full => std::env::var(KUBECONFIG_ENV).ok().filter(|p| !p.is_empty()),
        Mode::Smoke => None,
    };
    let (scale, rounds, steady) = match mode {
        // A real cluster gets the population: no Helm release records unless asked.
        Mode::Full => (
            Scale::from_env_with(if real.is_some() { 0 } else { HELM_RELEASES }),
            env_u64("CONFIGHASH_BENCH_ROUNDS", 3).clamp(1, 10),
            env_u64("CONFIGHASH_BENCH_STEADY_SECS", 5).clamp(1, 60),
        ),
        Mode::Smoke => (Scale::smoke(), 1, 1),
    };
    println!(
        "watcher_memory: scale {} ({} Secrets x 64 KiB, {} Helm release records x {} KiB, \
         {} ConfigMaps x 16 KiB, {} Deployments, {NAMESPACES} namespaces, half opted in), \
         {rounds} rounds, {steady} s steady state",
        scale.fraction,
        scale.secrets(),
        scale.helm_releases(),
        scale.helm_release_bytes / 1024,
        scale.cms(),
        scale.deploys()
    );
    if scale.fraction < 1.0 {
        println!("NOTE: not full scale; figures are not the recorded ones");
    }
    println!(
        "load average at start: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );

    let exe = std::env::current_exe().expect("the bench binary's path");
    let variants = variants(&exe, mode);
    match real {
        Some(path) => {
            println!("API server: the real cluster of {path} ({KUBECONFIG_ENV})");
            let url = format!("{KUBECONFIG_URL}{path}");
            measure_all(mode, &exe, &variants, &url, &scale, rounds, steady, None);
        }
        None => {
            let mut server = Command::new(&exe)
                .env(ROLE_ENV, "server")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("start the API server child");
            let server_pid = server.id();
            let mut lines = BufReader::new(server.stdout.take().expect("server stdout"));
            let mut url = String::new();
            lines.read_line(&mut url).expect("the server's URL");
            let url = url.trim().to_owned();
            assert!(
                url.starts_with("http://127.0.0.1:"),
                "unexpected server URL {url:?}"
            );
            println!("API server child (pid {server_pid}) at {url}");

            measure_all(
                mode,
                &exe,
                &variants,
                &url,
                &scale,
                rounds,
                steady,
                Some(server_pid),
            );
            // Closing its stdin ends the server child.
            drop(server.stdin.take());
            wait_or_kill(&mut server, Duration::from_secs(10));
        }
    }
}

/// Loads the objects through `url`, runs the rounds, reports. `server_pid`: the in-memory API
/// server child's, for its memory figures.
#[allow(clippy::too_many_arguments)]
fn measure_all(
    mode: Mode,
    exe: &Path,
    variants: &[Variant],
    url: &str,
    scale: &Scale,
    rounds: u64,
    steady: u64,
    server_pid: Option<u32>,
) {
    let server_rss = || match server_pid {
        Some(pid) => format!(
            "server child VmRSS {} MiB",
            proc_status(&format!("/proc/{pid}/status")).0 / 1024
        ),
        None => "the server is the real cluster's".to_owned(),
    };
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let load_start = Instant::now();
    rt.block_on(load(url, scale));
    println!(
        "loaded in {:.1} s; {}",
        load_start.elapsed().as_secs_f64(),
        server_rss()
    );
    drop(rt);

    let mut list = Vec::new();
    let mut ours: Vec<Vec<Reading>> = variants.iter().map(|_| Vec::new()).collect();
    let mut refl = Vec::new();
    let mut loads = Vec::new();
    for round in 1..=rounds {
        let measure = |name: &str, exe: &Path, role: &str, env: &[(&str, String)]| {
            let r = run_child(exe, role, url, scale, steady, env);
            println!(
                "round {round} {name}: sync {:>7.3} s  VmRSS {:>8.1} MiB  VmHWM {:>8.1} MiB  {}",
                r.sync_secs,
                mib(r.rss_kib),
                mib(r.hwm_kib),
                r.detail
            );
            r
        };
        list.push(measure("list", exe, "list", &[]));
        for (variant, out) in variants.iter().zip(&mut ours) {
            out.push(measure(
                &variant.label,
                &variant.exe,
                "watcher",
                &variant.env(),
            ));
        }
        refl.push(measure("reflector", exe, "reflector", &[]));
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        println!("round {round} load average: {}", load.trim());
        loads.push(load);
    }
    if let Some(pid) = server_pid {
        println!(
            "server child VmHWM {} MiB",
            proc_status(&format!("/proc/{pid}/status")).1 / 1024
        );
    }

    let ours: Vec<(&str, &[Reading])> = variants
        .iter()
        .zip(&ours)
        .map(|(v, r)| (v.label.as_str(), r.as_slice()))
        .collect();
    report(scale, steady, &list, &ours, &refl);
    if mode == Mode::Smoke {
        smoke_check(scale, &list, ours[0].1, &refl);
    }

    // Diagnosis: the heap of the watcher's own index for these objects, built without a client.
    let index = run_child(exe, "index", url, scale, steady, &[]);
    println!();
    println!(
        "diagnosis, heap of confighash's ConfigStore + WorkloadIndex for these objects: {}",
        index.detail
    );
}

/// Without `--bench`: every child synced and reported its memory, the list and the reflectors
/// saw every object loaded, and the watcher watched some.
fn smoke_check(scale: &Scale, list: &[Reading], ours: &[Reading], refl: &[Reading]) {
    let mut failures = Vec::new();
    for (role, r) in [
        ("list", &list[0]),
        ("watcher", &ours[0]),
        ("reflector", &refl[0]),
    ] {
        if r.sync_secs.is_nan() || r.sync_secs <= 0.0 || r.rss_kib == 0 || r.hwm_kib < r.rss_kib {
            failures.push(format!(
                "{role}: sync {} s, VmRSS {} KiB, VmHWM {} KiB",
                r.sync_secs, r.rss_kib, r.hwm_kib
            ));
        }
    }
    let loaded = json!({
        "Secret": scale.secrets() + scale.helm_releases(),
        "ConfigMap": scale.cms(),
        "Deployment": scale.deploys(),
    });
    if list[0].detail["listed"] != loaded || refl[0].detail["stored"] != loaded {
        failures.push(format!(
            "loaded {loaded}, listed {}, stored by the reflectors {}",
            list[0].detail["listed"], refl[0].detail["stored"]
        ));
    }
    // Every Secret of the opted-in namespaces (the even ones), Helm's records included.
    let opted_in = NAMESPACES.div_ceil(2);
    let secrets = (scale.secrets_per_ns + scale.helm_per_ns) * opted_in;
    let watched = &ours[0].detail["watched"];
    if watched["Secret"] != json!(secrets)
        || watched["ConfigMap"] != json!(scale.cms_per_ns * opted_in)
    {
        failures.push(format!(
            "the watcher watched {watched}, not the {secrets} Secrets and {} ConfigMaps of \
             opted-in namespaces",
            scale.cms_per_ns * opted_in
        ));
    }
    if !failures.is_empty() {
        eprintln!("watcher_memory FAILED: {}", failures.join("; "));
        std::process::exit(1);
    }
    println!(
        "watcher_memory: smoke run held (run `cargo bench --bench watcher_memory` for the figures)"
    );
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok { "MET" } else { "MISSED" }
}

fn report(
    scale: &Scale,
    steady: u64,
    list: &[Reading],
    ours: &[(&str, &[Reading])],
    refl: &[Reading],
) {
    let med = |rs: &[Reading], f: fn(&Reading) -> f64| median(rs.iter().map(f).collect());
    let rss = |r: &Reading| mib(r.rss_kib);
    let hwm = |r: &Reading| mib(r.hwm_kib);
    let sync = |r: &Reading| r.sync_secs;
    let rounds = |rs: &[Reading], f: fn(&Reading) -> f64| {
        rs.iter()
            .map(|r| format!("{:.1}", f(r)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let row = |name: &str, rs: &[Reading]| {
        println!(
            "| {name} | {:.3} s [{}] | {:.1} MiB [{}] | {:.1} MiB [{}] |",
            med(rs, sync),
            rs.iter()
                .map(|r| format!("{:.3}", r.sync_secs))
                .collect::<Vec<_>>()
                .join(", "),
            med(rs, rss),
            rounds(rs, rss),
            med(rs, hwm),
            rounds(rs, hwm)
        );
    };
    let fmt = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.3}"))
            .collect::<Vec<_>>()
            .join(", ")
    };

    println!();
    println!(
        "== watcher_memory, scale {} ({} Secrets, {} Helm release records, {} ConfigMaps, {} Deployments), medians of {} rounds, steady state {steady} s ==",
        scale.fraction,
        scale.secrets(),
        scale.helm_releases(),
        scale.cms(),
        scale.deploys(),
        list.len()
    );
    println!("| Process | Initial sync [per round] | VmRSS steady | VmHWM peak |");
    println!("|---|---|---|---|");
    row("bare `Api::list`, page 500 (sync baseline)", list);
    row(
        "kube-runtime reflectors, full objects (memory baseline)",
        refl,
    );
    for (name, rs) in ours {
        row(name, rs);
    }
    println!();
    let heap_of = |rs: &[Reading], field: &str| {
        median(
            rs.iter()
                .map(|r| r.detail["heap"][field].as_f64().unwrap_or(f64::NAN))
                .collect(),
        )
    };
    println!(
        "Diagnosis (glibc `mallinfo2` after the steady-state reading, then `malloc_trim(0)`), medians:"
    );
    println!();
    println!("| Process | Heap in use | Free heap held by malloc | VmRSS after malloc_trim |");
    println!("|---|---|---|---|");
    for (name, rs) in [("bare list", list), ("reflectors", refl)]
        .into_iter()
        .chain(ours.iter().copied())
    {
        println!(
            "| {name} | {:.1} MiB | {:.1} MiB | {:.1} MiB |",
            heap_of(rs, "in_use_mib"),
            heap_of(rs, "free_held_mib"),
            heap_of(rs, "rss_after_trim_mib")
        );
    }
    println!();
    println!("| Watcher | Ratio | Median | Per round | Target | Verdict |");
    println!("|---|---|---|---|---|---|");
    for (name, rs) in ours {
        // Per-round ratios: each watcher run against the baseline of its own round.
        let ratio_rss: Vec<f64> = rs.iter().zip(refl).map(|(o, r)| rss(o) / rss(r)).collect();
        let ratio_hwm: Vec<f64> = rs.iter().zip(refl).map(|(o, r)| hwm(o) / hwm(r)).collect();
        let ratio_sync: Vec<f64> = rs
            .iter()
            .zip(list)
            .map(|(o, l)| o.sync_secs / l.sync_secs)
            .collect();
        let worst_rss = rs.iter().map(rss).fold(0.0, f64::max);
        let worst_hwm = rs.iter().map(hwm).fold(0.0, f64::max);
        println!(
            "| {name} | VmRSS steady / reflector | {:.3} | {} | <= 0.1 | {} |",
            median(ratio_rss.clone()),
            fmt(&ratio_rss),
            verdict(ratio_rss.iter().all(|r| *r <= TARGET_RATIO))
        );
        println!(
            "| {name} | VmHWM peak / reflector | {:.3} | {} | <= 0.1 | {} |",
            median(ratio_hwm.clone()),
            fmt(&ratio_hwm),
            verdict(ratio_hwm.iter().all(|r| *r <= TARGET_RATIO))
        );
        println!(
            "| {name} | sync / bare list | {:.3} | {} | <= 1.5 | {} |",
            median(ratio_sync.clone()),
            fmt(&ratio_sync),
            verdict(ratio_sync.iter().all(|r| *r <= TARGET_SYNC_RATIO))
        );
        println!(
            "| {name} | VmRSS steady (worst round) | {worst_rss:.1} MiB | | < 32 MiB | {} |",
            verdict(worst_rss < mib(TARGET_STEADY_KIB))
        );
        println!(
            "| {name} | VmHWM peak (worst round) | {worst_hwm:.1} MiB | | < 96 MiB | {} |",
            verdict(worst_hwm < mib(TARGET_PEAK_KIB))
        );
    }
}

fn run_child(
    exe: &Path,
    role: &str,
    url: &str,
    scale: &Scale,
    steady: u64,
    env: &[(&str, String)],
) -> Reading {
    let mut child = Command::new(exe)
        .env(ROLE_ENV, role)
        .env(URL_ENV, url)
        .env("CONFIGHASH_BENCH_SCALE", scale.fraction.to_string())
        .env(
            "CONFIGHASH_BENCH_HELM_RELEASES",
            scale.helm_full_scale.to_string(),
        )
        .env(
            "CONFIGHASH_BENCH_HELM_RELEASE_KIB",
            (scale.helm_release_bytes / 1024).to_string(),
        )
        .env("CONFIGHASH_BENCH_STEADY_SECS", steady.to_string())
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start a measured child");
    let mut out = String::new();
    child
        .stdout
        .take()
        .expect("child stdout")
        .read_to_string(&mut out)
        .expect("read the child's report");
    let status = wait_or_kill(&mut child, Duration::from_secs(30));
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("child {role} ({status:?}) reported nothing: {out}"));
    let v: Value = serde_json::from_str(line).expect("a JSON report");
    Reading {
        sync_secs: v["sync_secs"].as_f64().unwrap_or(f64::NAN),
        rss_kib: v["rss_kib"].as_u64().unwrap_or(0),
        hwm_kib: v["hwm_kib"].as_u64().unwrap_or(0),
        detail: v["detail"].clone(),
    }
}

fn wait_or_kill(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return child.wait().ok();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

async fn load(url: &str, scale: &Scale) {
    let client = client_for(url).await;
    let real = url.starts_with(KUBECONFIG_URL);
    for n in 0..NAMESPACES {
        let mut labels = BTreeMap::new();
        if n % 2 == 0 {
            labels.insert("confighash.dev/enabled".to_owned(), "true".to_owned());
        }
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(namespace_name(n)),
                labels: Some(labels),
                ..Default::default()
            },
            ..Default::default()
        };
        created(
            "a namespace",
            Api::<Namespace>::all(client.clone())
                .create(&PostParams::default(), &ns)
                .await,
        );
    }
    let pp = PostParams::default();
    let jobs = (0..NAMESPACES).flat_map(|n| (0..scale.secrets_per_ns).map(move |k| (n, k)));
    futures::stream::iter(jobs)
        .for_each_concurrent(LOAD_CONCURRENCY, |(n, k)| {
            let api: Api<Secret> = Api::namespaced(client.clone(), &namespace_name(n));
            let pp = &pp;
            async move {
                created("a Secret", api.create(pp, &secret(n, k)).await);
            }
        })
        .await;
    let jobs = (0..NAMESPACES).flat_map(|n| (0..scale.helm_per_ns).map(move |k| (n, k)));
    futures::stream::iter(jobs)
        .for_each_concurrent(LOAD_CONCURRENCY, |(n, k)| {
            let api: Api<Secret> = Api::namespaced(client.clone(), &namespace_name(n));
            let pp = &pp;
            async move {
                created(
                    "a Helm release record",
                    api.create(pp, &helm_release(scale, n, k)).await,
                );
            }
        })
        .await;
    let jobs = (0..NAMESPACES).flat_map(|n| (0..scale.cms_per_ns).map(move |k| (n, k)));
    futures::stream::iter(jobs)
        .for_each_concurrent(LOAD_CONCURRENCY, |(n, k)| {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace_name(n));
            let pp = &pp;
            async move {
                created("a ConfigMap", api.create(pp, &config_map(n, k)).await);
            }
        })
        .await;
    let jobs = (0..NAMESPACES).flat_map(|n| (0..scale.deploys_per_ns).map(move |k| (n, k)));
    futures::stream::iter(jobs)
        .for_each_concurrent(LOAD_CONCURRENCY, |(n, k)| {
            let api: Api<Deployment> = Api::namespaced(client.clone(), &namespace_name(n));
            let pp = &pp;
            async move {
                let mut d = deployment(scale, k);
                if real {
                    // The controllers keep their pods away: no pods for kwok to run, no
                    // ReplicaSet churn while the watcher is measured.
                    if let Some(spec) = d.spec.as_mut() {
                        spec.replicas = Some(0);
                    }
                }
                created("a Deployment", api.create(pp, &d).await);
            }
        })
        .await;
}

// ----- children -----

/// A client of the in-memory API server at `url`, or of the cluster of the kubeconfig that
/// `url` names after [`KUBECONFIG_URL`].
async fn client_for(url: &str) -> kube::Client {
    let config = match url.strip_prefix(KUBECONFIG_URL) {
        Some(path) => {
            let kubeconfig =
                kube::config::Kubeconfig::read_from(path).expect("a readable kubeconfig");
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .expect("a usable kubeconfig")
        }
        None => {
            let mut config = kube::Config::new(url.parse().expect("a valid URL"));
            config.default_namespace = "default".into();
            config
        }
    };
    kube::Client::try_from(config).expect("a client")
}

/// A create that already happened (a real cluster kept from an earlier run holds the same
/// objects: they are generated from their names) counts as done.
fn created<K>(what: &str, result: Result<K, kube::Error>) {
    match result {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("create {what}: {e}"),
    }
}

/// (VmRSS, VmHWM) in KiB.
fn proc_status(path: &str) -> (u64, u64) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn child_runtime() -> tokio::runtime::Runtime {
    // As `confighash serve` starts: the allocator set up, the ring provider, then a default
    // multi-threaded runtime. Every child starts this way, the baselines included.
    confighash::watcher::memory::tune_allocator();
    let _ = rustls::crypto::ring::default_provider().install_default();
    tokio::runtime::Runtime::new().expect("a runtime")
}

fn report_and_exit(sync: Duration, mut detail: Value) {
    let (rss, hwm) = proc_status("/proc/self/status");
    // Diagnosis only, after the recorded readings: how much of the RSS is live heap.
    detail["heap"] = heap::diagnose();
    let line = json!({
        "sync_secs": sync.as_secs_f64(),
        "rss_kib": rss,
        "hwm_kib": hwm,
        "detail": detail,
    });
    println!("RESULT {line}");
    let _ = std::io::stdout().flush();
    // Exit at once: no teardown that could be mistaken for the measured work.
    std::process::exit(0);
}

fn child_url() -> String {
    std::env::var(URL_ENV).expect("the API server URL")
}

fn steady_wait() -> Duration {
    Duration::from_secs(env_u64("CONFIGHASH_BENCH_STEADY_SECS", 5))
}

/// Sync deadline for every measured child.
const SYNC_DEADLINE: Duration = Duration::from_secs(600);

fn child_server() {
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    rt.block_on(async {
        let api = apiserver::ApiServer::start().await;
        println!("{}", api.url());
        let _ = std::io::stdout().flush();
        // Runs until the parent closes stdin (or goes away).
        let _ = tokio::task::spawn_blocking(|| {
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
        })
        .await;
        drop(api);
    });
}

fn child_watcher() {
    let rt = child_runtime();
    rt.block_on(async {
        let client = client_for(&child_url()).await;
        let metrics = Arc::new(Metrics::new());
        let keys = Arc::new(KeyStore::new(
            StampKey::new(KEY.to_vec()).expect("a stamp key"),
        ));
        let config = WatcherConfig {
            resync: Duration::from_secs(3600),
            ..Default::default()
        };
        let secret_page = std::env::var(SECRET_PAGE_ENV)
            .ok()
            .and_then(|p| p.parse().ok())
            .unwrap_or(watcher::SECRET_PAGE_SIZE);
        let start = Instant::now();
        let _task = tokio::spawn(watcher::run_with_secret_page_size(
            client,
            keys,
            Leadership::always(),
            metrics.clone(),
            config,
            secret_page,
        ));
        loop {
            if metrics
                .encode()
                .lines()
                .any(|l| l == "confighash_watcher_cache_synced 1")
            {
                break;
            }
            assert!(start.elapsed() < SYNC_DEADLINE, "the watcher did not sync");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let sync = start.elapsed();
        let (_, hwm_at_sync) = proc_status("/proc/self/status");
        tokio::time::sleep(steady_wait()).await;
        let watched: BTreeMap<String, Value> = metrics
            .encode()
            .lines()
            .filter_map(|l| l.strip_prefix("confighash_watched_objects{kind=\""))
            .filter_map(|l| l.split_once("\"} "))
            .map(|(k, v)| (k.to_owned(), json!(v.parse::<u64>().unwrap_or(0))))
            .collect();
        report_and_exit(
            sync,
            json!({"watched": watched, "secret_page": secret_page, "hwm_at_sync_mib": hwm_at_sync / 1024}),
        );
    });
}

fn child_reflector() {
    let rt = child_runtime();
    rt.block_on(async {
        let client = client_for(&child_url()).await;
        let start = Instant::now();
        let (secrets, w) = reflector::store::<Secret>();
        tokio::spawn(
            reflector::reflector(
                w,
                kube::runtime::watcher(Api::<Secret>::all(client.clone()), Default::default())
                    .default_backoff(),
            )
            .for_each(|_| futures::future::ready(())),
        );
        let (cms, w) = reflector::store::<ConfigMap>();
        tokio::spawn(
            reflector::reflector(
                w,
                kube::runtime::watcher(Api::<ConfigMap>::all(client.clone()), Default::default())
                    .default_backoff(),
            )
            .for_each(|_| futures::future::ready(())),
        );
        let (deploys, w) = reflector::store::<Deployment>();
        tokio::spawn(
            reflector::reflector(
                w,
                kube::runtime::watcher(Api::<Deployment>::all(client.clone()), Default::default())
                    .default_backoff(),
            )
            .for_each(|_| futures::future::ready(())),
        );
        let ready = async {
            let (a, b, c) = tokio::join!(
                secrets.wait_until_ready(),
                cms.wait_until_ready(),
                deploys.wait_until_ready()
            );
            a.and(b).and(c).expect("the reflectors run");
        };
        tokio::time::timeout(SYNC_DEADLINE, ready)
            .await
            .expect("the reflectors did not sync");
        let sync = start.elapsed();
        let (_, hwm_at_sync) = proc_status("/proc/self/status");
        tokio::time::sleep(steady_wait()).await;
        report_and_exit(
            sync,
            json!({
                "stored": {"Secret": secrets.len(), "ConfigMap": cms.len(), "Deployment": deploys.len()},
                "hwm_at_sync_mib": hwm_at_sync / 1024,
            }),
        );
    });
}

async fn list_all<K>(api: Api<K>) -> usize
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut params = ListParams::default().limit(LIST_PAGE);
    let mut n = 0;
    loop {
        let page = api.list(&params).await.expect("a list page");
        n += page.items.len();
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return n,
        }
    }
}

fn child_list() {
    let rt = child_runtime();
    rt.block_on(async {
        let client = client_for(&child_url()).await;
        let start = Instant::now();
        let all = async {
            tokio::join!(
                list_all(Api::<Secret>::all(client.clone())),
                list_all(Api::<ConfigMap>::all(client.clone())),
                list_all(Api::<Deployment>::all(client.clone()))
            )
        };
        let (s, c, d) = tokio::time::timeout(SYNC_DEADLINE, all)
            .await
            .expect("the lists did not finish");
        let sync = start.elapsed();
        report_and_exit(
            sync,
            json!({"listed": {"Secret": s, "ConfigMap": c, "Deployment": d}}),
        );
    });
}

/// glibc's view of the heap, to tell live data from freed memory the allocator keeps.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod heap {
    use serde_json::{Value, json};

    #[repr(C)]
    struct MallInfo2 {
        arena: usize,
        ordblks: usize,
        smblks: usize,
        hblks: usize,
        hblkhd: usize,
        usmblks: usize,
        fsmblks: usize,
        uordblks: usize,
        fordblks: usize,
        keepcost: usize,
    }

    unsafe extern "C" {
        fn mallinfo2() -> MallInfo2;
        fn malloc_trim(pad: usize) -> i32;
    }

    /// Bytes of heap in use.
    pub fn in_use() -> usize {
        // SAFETY: a plain glibc call without preconditions.
        let info = unsafe { mallinfo2() };
        info.uordblks + info.hblkhd
    }

    /// Heap in use (`uordblks + hblkhd`), free heap the allocator holds (`fordblks`), and VmRSS
    /// after `malloc_trim(0)` hands free pages back, all in MiB. Called after the readings.
    pub fn diagnose() -> Value {
        // SAFETY: both are plain glibc calls without preconditions.
        let info = unsafe { mallinfo2() };
        let mib = |b: usize| (b as f64 / 1048576.0 * 10.0).round() / 10.0;
        // SAFETY: as above.
        unsafe {
            malloc_trim(0);
        }
        let (rss, _) = super::proc_status("/proc/self/status");
        json!({
            "in_use_mib": mib(info.uordblks + info.hblkhd),
            "free_held_mib": mib(info.fordblks),
            "arena_mib": mib(info.arena),
            "rss_after_trim_mib": (rss as f64 / 1024.0 * 10.0).round() / 10.0,
        })
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod heap {
    pub fn diagnose() -> serde_json::Value {
        serde_json::Value::Null
    }

    pub fn in_use() -> usize {
        0
    }
}

/// Diagnosis: the heap that confighash's own index takes for the generated objects, built
/// without a client (each object is generated, digested and dropped): once with the
/// ConfigMaps and Secrets of opted-in namespaces only, once with all of them, as the watcher
/// keeps them.
fn child_index() {
    use confighash::core::refs::{ObjectKind, ObjectRef};
    use confighash::core::workload::WorkloadKind;
    use confighash::watcher::index::{
        ConfigStore, StoredConfig, WorkloadEntry, WorkloadIndex, WorkloadKey,
    };

    let scale = Scale::from_env();
    let build = |namespaces: &[usize]| {
        let mut configs = ConfigStore::default();
        let mut workloads = WorkloadIndex::default();
        for &n in namespaces {
            let ns = namespace_name(n);
            for k in 0..scale.secrets_per_ns {
                let s = secret(n, k);
                let key = (
                    ns.clone(),
                    ObjectRef::new(ObjectKind::Secret, format!("secret-{k}")),
                );
                configs.upsert(key, StoredConfig::from_secret(&s));
            }
            for k in 0..scale.helm_per_ns {
                let s = helm_release(&scale, n, k);
                let key = (
                    ns.clone(),
                    ObjectRef::new(ObjectKind::Secret, s.metadata.name.clone().expect("a name")),
                );
                configs.upsert(key, StoredConfig::from_secret(&s));
            }
            for k in 0..scale.cms_per_ns {
                let c = config_map(n, k);
                let key = (
                    ns.clone(),
                    ObjectRef::new(ObjectKind::ConfigMap, format!("cm-{k}")),
                );
                configs.upsert(
                    key,
                    StoredConfig::from_config_map(&c).expect("a ConfigMap digest"),
                );
            }
        }
        for n in 0..NAMESPACES {
            let ns = namespace_name(n);
            for k in 0..scale.deploys_per_ns {
                let mut v = serde_json::to_value(deployment(&scale, k)).expect("JSON");
                v["metadata"]["namespace"] = json!(ns);
                v["metadata"]["resourceVersion"] = json!("123456");
                v["metadata"]["uid"] = json!("705ab4f5-6393-11e8-b7cc-42010a800002");
                if let Some(entry) =
                    WorkloadEntry::from_object(WorkloadKind::Deployment, &v).expect("a workload")
                {
                    workloads.upsert(
                        WorkloadKey::new(WorkloadKind::Deployment, &ns, &format!("app-{k}")),
                        entry,
                    );
                }
            }
        }
        (configs, workloads)
    };
    let mib = |b: usize| (b as f64 / 1048576.0 * 10.0).round() / 10.0;
    let before = heap::in_use();
    let opted_in: Vec<usize> = (0..NAMESPACES).step_by(2).collect();
    let half = build(&opted_in);
    let half_bytes = heap::in_use().saturating_sub(before);
    let half_objects = half.0.len();
    drop(half);
    let before = heap::in_use();
    let all: Vec<usize> = (0..NAMESPACES).collect();
    let full = build(&all);
    let full_bytes = heap::in_use().saturating_sub(before);
    let line = json!({
        "sync_secs": 0.0,
        "rss_kib": 0,
        "hwm_kib": 0,
        "detail": {
            "all_namespaces": {"configs": full.0.len(), "workloads": full.1.len(), "heap_mib": mib(full_bytes),
                "bytes_per_config_and_workload": full_bytes / (full.0.len() + full.1.len()).max(1)},
            "opted_in_configs_only": {"configs": half_objects, "workloads": full.1.len(), "heap_mib": mib(half_bytes)},
        },
    });
    println!("RESULT {line}");
}

//! Memory and initial sync time of confighash's watcher, versus a full-object reflector.
//!
//! RSS is a property of a process, so this bench re-executes itself (`std::env::current_exe`)
//! with `CONFIGHASH_BENCH_ROLE` selecting what the child does:
//!
//! - `server`: the in-memory API server (`confighash_testkit::apiserver::ApiServer`) on 127.0.0.1; it prints its URL
//!   on stdout and runs until its stdin is closed. The parent loads it over HTTP with Secrets,
//!   Helm release records (Secrets of type `helm.sh/release.v1`, about 500 KiB each), ConfigMaps
//!   and Deployments (16 requests in flight).
//! - `watcher`: `confighash::watcher::run_with_secret_page_size` (leader, default
//!   `WatcherConfig` with a long resync) until `confighash_watcher_cache_synced 1`, then a few
//!   seconds of steady state, then VmRSS and VmHWM from `/proc/self/status`. Its lists are
//!   streaming lists, which both servers serve; the Secret page size
//!   (`watcher::SECRET_PAGE_SIZE` unless the parent says otherwise) applies only where a server
//!   refuses them.
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

use confighash::certs::key::KeyStore;
use confighash::core::checksum::StampKey;
use confighash::metrics::Metrics;
use confighash::watcher::leader::Leadership;
use confighash::watcher::{self, WatcherConfig};
use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::CronJob;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, reflector};
use serde_json::{Value, json};

use confighash_testkit::bench::mode;
use confighash_testkit::bench::prom;
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

/// What a population holds at full scale, and the targets for it.
#[derive(Debug)]
struct Shape {
    name: &'static str,
    namespaces: usize,
    /// Opaque Secrets of `secret_keys` keys of `secret_key_bytes`.
    secrets: usize,
    secret_keys: usize,
    secret_key_bytes: usize,
    /// ServiceAccount token Secrets (type `kubernetes.io/service-account-token`).
    tokens: usize,
    /// Helm release records, spread over every namespace as the other objects are, unless
    /// `CONFIGHASH_BENCH_HELM_RELEASES` says otherwise; the size of the one key of each,
    /// `release` (base64 text of the gzipped release, in Helm), unless
    /// `CONFIGHASH_BENCH_HELM_RELEASE_KIB` says otherwise.
    helm_releases: usize,
    helm_release_kib: usize,
    /// ConfigMaps of `cm_keys` keys of `cm_key_bytes`.
    config_maps: usize,
    cm_keys: usize,
    cm_key_bytes: usize,
    deployments: usize,
    /// Of each other workload kind: StatefulSets, DaemonSets and CronJobs.
    other_workloads: usize,
    target_steady_kib: u64,
    target_peak_kib: u64,
    target_sync_ratio: f64,
}

/// The mid-size cluster of the figures recorded first: 10,000 Secrets of 64 KiB, 1,000 Helm
/// release records of 500 KiB, 5,000 ConfigMaps of 16 KiB, 2,000 Deployments, 20 namespaces.
const MID: Shape = Shape {
    name: "mid",
    namespaces: 20,
    secrets: 10_000,
    secret_keys: 4,
    secret_key_bytes: 16 * 1024,
    tokens: 0,
    helm_releases: 1_000,
    helm_release_kib: 500,
    config_maps: 5_000,
    cm_keys: 2,
    cm_key_bytes: 8 * 1024,
    deployments: 2_000,
    other_workloads: 0,
    target_steady_kib: 32 * 1024,
    target_peak_kib: 96 * 1024,
    target_sync_ratio: 1.5,
};

/// A big cluster (`CONFIGHASH_BENCH_POPULATION=big`): 100,000 Secrets of 4 KiB, a tenth of them
/// typed (5,000 ServiceAccount tokens, 5,000 Helm release records), 50,000 ConfigMaps of 2 KiB,
/// 20,000 workloads of every kind confighash stamps (14,000 Deployments, 2,000 each of
/// StatefulSets, DaemonSets and CronJobs), over 500 namespaces.
const BIG: Shape = Shape {
    name: "big",
    namespaces: 500,
    secrets: 90_000,
    secret_keys: 2,
    secret_key_bytes: 2 * 1024,
    tokens: 5_000,
    helm_releases: 5_000,
    helm_release_kib: 4,
    config_maps: 50_000,
    cm_keys: 2,
    cm_key_bytes: 1024,
    deployments: 14_000,
    other_workloads: 2_000,
    target_steady_kib: 64 * 1024,
    target_peak_kib: 160 * 1024,
    target_sync_ratio: 1.2,
};

/// The kinds of workload besides Deployments that confighash stamps, in the order they are
/// generated (Argo Rollouts, a custom resource, are left out: neither API server here serves
/// them unless installed).
const OTHER_KINDS: [&str; 3] = ["StatefulSet", "DaemonSet", "CronJob"];
/// Requests in flight while loading.
const LOAD_CONCURRENCY: usize = 16;
/// kube-runtime's default `watcher::Config` page size, used for the bare list.
const LIST_PAGE: u32 = 500;

/// The memory target against the reflectors, for every population.
const TARGET_RATIO: f64 = 0.1;

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
    shape: &'static Shape,
    fraction: f64,
    secrets_per_ns: usize,
    tokens_per_ns: usize,
    /// Helm release records at full scale, as `CONFIGHASH_BENCH_HELM_RELEASES` says.
    helm_full_scale: usize,
    helm_per_ns: usize,
    helm_release_bytes: usize,
    cms_per_ns: usize,
    deploys_per_ns: usize,
    /// Of each of [`OTHER_KINDS`].
    others_per_ns: usize,
}

impl Scale {
    fn from_env() -> Scale {
        Scale::from_env_with(shape_from_env().helm_releases)
    }

    /// As [`Scale::from_env`], with `helm_default` Helm release records at full scale unless
    /// `CONFIGHASH_BENCH_HELM_RELEASES` says otherwise.
    fn from_env_with(helm_default: usize) -> Scale {
        let shape = shape_from_env();
        let quick =
            std::env::var("CONFIGHASH_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        let fraction = std::env::var("CONFIGHASH_BENCH_SCALE")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|f| *f > 0.0 && *f <= 1.0)
            .unwrap_or(if quick { 0.05 } else { 1.0 });
        let helm = env_u64("CONFIGHASH_BENCH_HELM_RELEASES", helm_default as u64) as usize;
        let kib = env_u64(
            "CONFIGHASH_BENCH_HELM_RELEASE_KIB",
            shape.helm_release_kib as u64,
        );
        Scale {
            helm_release_bytes: kib.clamp(1, 1024) as usize * 1024,
            ..Scale::from_fraction(shape, fraction, helm)
        }
    }

    fn from_fraction(shape: &'static Shape, fraction: f64, helm_releases: usize) -> Scale {
        let per_ns = |total: usize| {
            ((total as f64 * fraction / shape.namespaces as f64).round() as usize).max(1)
        };
        let per_ns_or_none = |total: usize| if total == 0 { 0 } else { per_ns(total) };
        Scale {
            shape,
            fraction,
            secrets_per_ns: per_ns(shape.secrets),
            tokens_per_ns: per_ns_or_none(shape.tokens),
            helm_full_scale: helm_releases,
            helm_per_ns: per_ns_or_none(helm_releases),
            helm_release_bytes: shape.helm_release_kib * 1024,
            cms_per_ns: per_ns(shape.config_maps),
            deploys_per_ns: per_ns(shape.deployments),
            others_per_ns: per_ns_or_none(shape.other_workloads),
        }
    }

    /// Without `--bench`: one object of each kind per namespace, of the mid-size shape with one
    /// of each other workload kind too.
    fn smoke() -> Scale {
        Scale {
            others_per_ns: 1,
            tokens_per_ns: 1,
            ..Scale::from_fraction(&MID, 0.0001, MID.helm_releases)
        }
    }

    fn namespaces(&self) -> usize {
        self.shape.namespaces
    }

    /// Opaque Secrets.
    fn secrets(&self) -> usize {
        self.secrets_per_ns * self.namespaces()
    }

    fn tokens(&self) -> usize {
        self.tokens_per_ns * self.namespaces()
    }

    fn helm_releases(&self) -> usize {
        self.helm_per_ns * self.namespaces()
    }

    fn cms(&self) -> usize {
        self.cms_per_ns * self.namespaces()
    }

    fn deploys(&self) -> usize {
        self.deploys_per_ns * self.namespaces()
    }

    /// Of each of [`OTHER_KINDS`].
    fn others(&self) -> usize {
        self.others_per_ns * self.namespaces()
    }

    /// Every kind's count, as the list and the reflectors report theirs.
    fn loaded(&self) -> Value {
        let mut loaded = json!({
            "Secret": self.secrets() + self.tokens() + self.helm_releases(),
            "ConfigMap": self.cms(),
            "Deployment": self.deploys(),
        });
        for kind in OTHER_KINDS {
            loaded[kind] = json!(self.others());
        }
        loaded
    }
}

/// `CONFIGHASH_BENCH_POPULATION`: `mid` (the default) or `big`.
fn shape_from_env() -> &'static Shape {
    match std::env::var("CONFIGHASH_BENCH_POPULATION").as_deref() {
        Ok("big") => &BIG,
        Ok("mid") | Ok("") | Err(_) => &MID,
        Ok(other) => {
            eprintln!("CONFIGHASH_BENCH_POPULATION={other:?}: use mid or big");
            std::process::exit(2);
        }
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

fn secret(scale: &Scale, ns: usize, k: usize) -> Secret {
    let mut fill = Filler::new(((ns as u64) << 32) | k as u64);
    let shape = scale.shape;
    Secret {
        metadata: meta(format!("secret-{k}")),
        type_: Some("Opaque".to_owned()),
        data: Some(
            (0..shape.secret_keys)
                .map(|i| {
                    (
                        format!("key-{i}"),
                        ByteString(fill.bytes(shape.secret_key_bytes)),
                    )
                })
                .collect(),
        ),
        ..Default::default()
    }
}

/// ServiceAccount token `k` of a namespace, as the token controller fills them: about 4 KiB of
/// `ca.crt`, `namespace` and `token`, for the namespace's `default` ServiceAccount.
fn token(ns: usize, k: usize) -> Secret {
    let mut fill = Filler::new((3 << 60) | ((ns as u64) << 32) | k as u64);
    let mut metadata = meta(format!("token-{k}"));
    metadata.annotations = Some(BTreeMap::from([(
        "kubernetes.io/service-account.name".to_owned(),
        "default".to_owned(),
    )]));
    Secret {
        metadata,
        type_: Some("kubernetes.io/service-account-token".to_owned()),
        data: Some(BTreeMap::from([
            (
                "ca.crt".to_owned(),
                ByteString(fill.text(2600).into_bytes()),
            ),
            (
                "namespace".to_owned(),
                ByteString(namespace_name(ns).into_bytes()),
            ),
            ("token".to_owned(), ByteString(fill.text(1400).into_bytes())),
        ])),
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

fn config_map(scale: &Scale, ns: usize, k: usize) -> ConfigMap {
    let mut fill = Filler::new((1 << 62) | ((ns as u64) << 32) | k as u64);
    let shape = scale.shape;
    ConfigMap {
        metadata: meta(format!("cm-{k}")),
        data: Some(
            (0..shape.cm_keys)
                .map(|i| (format!("file-{i}.conf"), fill.text(shape.cm_key_bytes)))
                .collect(),
        ),
        ..Default::default()
    }
}

/// The pod template of workload `k` of a namespace named `name`: it references two ConfigMaps
/// (envFrom, volume) and two Secrets (envFrom, one key) of its namespace.
fn pod_template(scale: &Scale, k: usize, name: &str) -> Value {
    let cm_a = format!("cm-{}", (2 * k) % scale.cms_per_ns);
    let cm_b = format!("cm-{}", (2 * k + 1) % scale.cms_per_ns);
    let secret_a = format!("secret-{}", (5 * k) % scale.secrets_per_ns);
    let secret_b = format!("secret-{}", (5 * k + 1) % scale.secrets_per_ns);
    json!({
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
    })
}

/// Deployment `k` of a namespace. It carries the status its controller writes once rolled out
/// (the stand-in keeps it), so the watcher reads where its rollout stands as in a cluster.
fn deployment(scale: &Scale, k: usize) -> Deployment {
    let name = format!("app-{k}");
    let v: Value = json!({
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": pod_template(scale, k, &name)
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

/// Workload `k` of one of [`OTHER_KINDS`] in a namespace, made so that a real cluster runs no
/// pod for it: no replicas, a node selector no node has, suspended.
fn other_workload(scale: &Scale, kind: &str, k: usize) -> Value {
    let name = format!("{}-{k}", kind.to_ascii_lowercase());
    // Its references: the Deployments' pattern, continued past them kind after kind.
    let position = OTHER_KINDS.iter().position(|o| *o == kind).unwrap_or(0);
    let shift = scale.deploys_per_ns + position * scale.others_per_ns + k;
    let mut template = pod_template(scale, shift, &name);
    let selector = json!({"matchLabels": {"app": name}});
    let spec = match kind {
        "StatefulSet" => json!({
            "replicas": 0, "serviceName": name, "selector": selector, "template": template
        }),
        "DaemonSet" => {
            template["spec"]["nodeSelector"] = json!({"confighash.dev/bench-no-node": "true"});
            json!({"selector": selector, "template": template})
        }
        _ => {
            template["spec"]["restartPolicy"] = json!("Never");
            json!({"schedule": "17 3 * * *", "suspend": true,
                "jobTemplate": {"spec": {"template": template}}})
        }
    };
    let api_version = if kind == "CronJob" {
        "batch/v1"
    } else {
        "apps/v1"
    };
    json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": spec
    })
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
            label: format!("confighash watcher (streaming lists; Secret page {p} if paged)"),
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
        // A real cluster gets the mid-size population without Helm release records unless
        // asked (their issue's); the big one keeps its small records.
        Mode::Full => (
            Scale::from_env_with(match shape_from_env() {
                shape if real.is_some() && shape.name == MID.name => 0,
                shape => shape.helm_releases,
            }),
            env_u64("CONFIGHASH_BENCH_ROUNDS", 3).clamp(1, 10),
            env_u64("CONFIGHASH_BENCH_STEADY_SECS", 5).clamp(1, 60),
        ),
        Mode::Smoke => (Scale::smoke(), 1, 1),
    };
    let shape = scale.shape;
    println!(
        "watcher_memory: population {}, scale {} ({} Secrets x {} KiB, {} ServiceAccount tokens \
         x 4 KiB, {} Helm release records x {} KiB, {} ConfigMaps x {} KiB, {} Deployments, {} \
         each of {}, {} namespaces, half opted in), {rounds} rounds, {steady} s steady state",
        shape.name,
        scale.fraction,
        scale.secrets(),
        shape.secret_keys * shape.secret_key_bytes / 1024,
        scale.tokens(),
        scale.helm_releases(),
        scale.helm_release_bytes / 1024,
        scale.cms(),
        shape.cm_keys * shape.cm_key_bytes / 1024,
        scale.deploys(),
        scale.others(),
        OTHER_KINDS.join(", "),
        scale.namespaces()
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

    // On a real cluster: the requests each child made, by verb, from kube-apiserver's counters.
    let requests = url.starts_with(KUBECONFIG_URL).then(|| Requests::new(url));
    let mut list = Vec::new();
    let mut ours: Vec<Vec<Reading>> = variants.iter().map(|_| Vec::new()).collect();
    let mut refl = Vec::new();
    let mut loads = Vec::new();
    for round in 1..=rounds {
        let measure = |name: &str, exe: &Path, role: &str, env: &[(&str, String)]| {
            let before = requests.as_ref().map(|r| r.read());
            let r = run_child(exe, role, url, scale, steady, env);
            let counted = match (&requests, before) {
                (Some(r), Some(before)) => format!("  API requests: {}", r.since(&before)),
                _ => String::new(),
            };
            println!(
                "round {round} {name}: sync {:>7.3} s  VmRSS {:>8.1} MiB  VmHWM {:>8.1} MiB  {}{counted}",
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
    let loaded = scale.loaded();
    if list[0].detail["listed"] != loaded || refl[0].detail["stored"] != loaded {
        failures.push(format!(
            "loaded {loaded}, listed {}, stored by the reflectors {}",
            list[0].detail["listed"], refl[0].detail["stored"]
        ));
    }
    // Every Secret of the opted-in namespaces (the even ones), typed ones included.
    let opted_in = scale.namespaces().div_ceil(2);
    let secrets = (scale.secrets_per_ns + scale.tokens_per_ns + scale.helm_per_ns) * opted_in;
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
    let shape = scale.shape;
    let fmt = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.3}"))
            .collect::<Vec<_>>()
            .join(", ")
    };

    println!();
    println!(
        "== watcher_memory, population {}, scale {} ({} Secrets, {} ServiceAccount tokens, {} Helm release records, {} ConfigMaps, {} Deployments, {} each of {}), medians of {} rounds, steady state {steady} s ==",
        scale.shape.name,
        scale.fraction,
        scale.secrets(),
        scale.tokens(),
        scale.helm_releases(),
        scale.cms(),
        scale.deploys(),
        scale.others(),
        OTHER_KINDS.join(", "),
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
            "| {name} | sync / bare list | {:.3} | {} | <= {} | {} |",
            median(ratio_sync.clone()),
            fmt(&ratio_sync),
            shape.target_sync_ratio,
            verdict(ratio_sync.iter().all(|r| *r <= shape.target_sync_ratio))
        );
        println!(
            "| {name} | VmRSS steady (worst round) | {worst_rss:.1} MiB | | < {} MiB | {} |",
            shape.target_steady_kib / 1024,
            verdict(worst_rss < mib(shape.target_steady_kib))
        );
        println!(
            "| {name} | VmHWM peak (worst round) | {worst_hwm:.1} MiB | | < {} MiB | {} |",
            shape.target_peak_kib / 1024,
            verdict(worst_hwm < mib(shape.target_peak_kib))
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
        .env("CONFIGHASH_BENCH_POPULATION", scale.shape.name)
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

/// kube-apiserver's `apiserver_request_total`, read around a child: the requests of the kinds the
/// watcher reads, by verb. Controllers read the same kinds, but through informers that have
/// listed long before and only watch; a LIST counted here is the child's.
struct Requests {
    rt: tokio::runtime::Runtime,
    client: kube::Client,
}

/// The resources counted.
const COUNTED: [&str; 7] = [
    "secrets",
    "configmaps",
    "namespaces",
    "deployments",
    "statefulsets",
    "daemonsets",
    "cronjobs",
];

impl Requests {
    fn new(url: &str) -> Requests {
        let rt = tokio::runtime::Runtime::new().expect("a runtime");
        let client = rt.block_on(client_for(url));
        Requests { rt, client }
    }

    /// (verb, resource) -> requests so far.
    fn read(&self) -> BTreeMap<(String, String), f64> {
        let text = self
            .rt
            .block_on(
                self.client
                    .request_text(http::Request::get("/metrics").body(Vec::new()).unwrap()),
            )
            .expect("kube-apiserver's /metrics");
        let mut out = BTreeMap::new();
        for (labels, value) in prom::samples(&text, "apiserver_request_total") {
            let label = |key| prom::label(labels, key).unwrap_or_default().to_owned();
            let resource = label("resource");
            if !COUNTED.contains(&resource.as_str()) || !label("subresource").is_empty() {
                continue;
            }
            *out.entry((label("verb"), resource)).or_default() += value;
        }
        out
    }

    /// What was made since `before`: "LIST 12 (secrets 10, ...), WATCH 7, GET 0".
    fn since(&self, before: &BTreeMap<(String, String), f64>) -> String {
        let now = self.read();
        let mut by_verb: BTreeMap<&str, (f64, Vec<String>)> = BTreeMap::new();
        for ((verb, resource), n) in &now {
            let d = n - before
                .get(&(verb.clone(), resource.clone()))
                .unwrap_or(&0.0);
            if d > 0.0 {
                let entry = by_verb.entry(verb).or_default();
                entry.0 += d;
                entry.1.push(format!("{resource} {d:.0}"));
            }
        }
        for verb in ["LIST", "WATCH", "GET"] {
            by_verb.entry(verb).or_default();
        }
        by_verb
            .iter()
            .map(|(verb, (n, parts))| {
                if parts.is_empty() {
                    format!("{verb} {n:.0}")
                } else {
                    format!("{verb} {n:.0} ({})", parts.join(", "))
                }
            })
            .collect::<Vec<_>>()
            .join("; ")
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
    for n in 0..scale.namespaces() {
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
    let started = Instant::now();
    let done = |what: &str| {
        println!(
            "  loaded {what} at {:.1} s",
            started.elapsed().as_secs_f64()
        )
    };
    create_each(&client, scale, "a Secret", scale.secrets_per_ns, |n, k| {
        secret(scale, n, k)
    })
    .await;
    create_each(&client, scale, "a token Secret", scale.tokens_per_ns, token).await;
    create_each(
        &client,
        scale,
        "a Helm release record",
        scale.helm_per_ns,
        |n, k| helm_release(scale, n, k),
    )
    .await;
    done("the Secrets");
    create_each(&client, scale, "a ConfigMap", scale.cms_per_ns, |n, k| {
        config_map(scale, n, k)
    })
    .await;
    done("the ConfigMaps");
    create_each(
        &client,
        scale,
        "a Deployment",
        scale.deploys_per_ns,
        |_, k| {
            let mut d = deployment(scale, k);
            if real {
                // The controllers keep their pods away: no pods for kwok to run, no ReplicaSet
                // churn while the watcher is measured.
                if let Some(spec) = d.spec.as_mut() {
                    spec.replicas = Some(0);
                }
            }
            d
        },
    )
    .await;
    let per_ns = scale.others_per_ns;
    create_each::<StatefulSet>(&client, scale, "a StatefulSet", per_ns, |_, k| {
        parsed(other_workload(scale, "StatefulSet", k))
    })
    .await;
    create_each::<DaemonSet>(&client, scale, "a DaemonSet", per_ns, |_, k| {
        parsed(other_workload(scale, "DaemonSet", k))
    })
    .await;
    create_each::<CronJob>(&client, scale, "a CronJob", per_ns, |_, k| {
        parsed(other_workload(scale, "CronJob", k))
    })
    .await;
    done("the workloads");
}

fn parsed<K: serde::de::DeserializeOwned>(v: Value) -> K {
    serde_json::from_value(v).expect("a valid workload")
}

/// Creates `per_ns` objects in every namespace, [`LOAD_CONCURRENCY`] at a time: `make(n, k)` is
/// object `k` of namespace `n`.
async fn create_each<K>(
    client: &kube::Client,
    scale: &Scale,
    what: &str,
    per_ns: usize,
    make: impl Fn(usize, usize) -> K,
) where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let pp = PostParams::default();
    let jobs = (0..scale.namespaces()).flat_map(|n| (0..per_ns).map(move |k| (n, k)));
    futures::stream::iter(jobs)
        .for_each_concurrent(LOAD_CONCURRENCY, |(n, k)| {
            let api: Api<K> = Api::namespaced(client.clone(), &namespace_name(n));
            let object = make(n, k);
            let pp = &pp;
            async move {
                created(what, api.create(pp, &object).await);
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
        let api = confighash_testkit::apiserver::ApiServer::start().await;
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
        // Every kind the watcher watches, each in a store of full objects.
        let (secrets, a) = reflect::<Secret>(&client);
        let (cms, b) = reflect::<ConfigMap>(&client);
        let (deploys, c) = reflect::<Deployment>(&client);
        let (sts, d) = reflect::<StatefulSet>(&client);
        let (dss, e) = reflect::<DaemonSet>(&client);
        let (cjs, f) = reflect::<CronJob>(&client);
        let ready = async {
            let all = futures::future::join_all([a, b, c, d, e, f]).await;
            assert!(all.into_iter().all(|ok| ok), "the reflectors run");
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
                "stored": {"Secret": secrets.len(), "ConfigMap": cms.len(),
                    "Deployment": deploys.len(), "StatefulSet": sts.len(), "DaemonSet": dss.len(),
                    "CronJob": cjs.len()},
                "hwm_at_sync_mib": hwm_at_sync / 1024,
            }),
        );
    });
}

/// A reflector of every `K` into a store of full objects, as Reloader/Wave-style controllers
/// keep them: the store, and a future that ends true once it has listed.
fn reflect<K>(
    client: &kube::Client,
) -> (
    reflector::Store<K>,
    futures::future::BoxFuture<'static, bool>,
)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store::<K>();
    tokio::spawn(
        reflector::reflector(
            writer,
            kube::runtime::watcher(Api::<K>::all(client.clone()), Default::default())
                .default_backoff(),
        )
        .for_each(|_| futures::future::ready(())),
    );
    let ready = store.clone();
    let ready = Box::pin(async move { ready.wait_until_ready().await.is_ok() });
    (store, ready)
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
        // Every kind the watcher lists, all at once.
        let all = async {
            tokio::join!(
                list_all(Api::<Secret>::all(client.clone())),
                list_all(Api::<ConfigMap>::all(client.clone())),
                list_all(Api::<Deployment>::all(client.clone())),
                list_all(Api::<StatefulSet>::all(client.clone())),
                list_all(Api::<DaemonSet>::all(client.clone())),
                list_all(Api::<CronJob>::all(client.clone())),
            )
        };
        let (s, c, d, st, ds, cj) = tokio::time::timeout(SYNC_DEADLINE, all)
            .await
            .expect("the lists did not finish");
        let sync = start.elapsed();
        report_and_exit(
            sync,
            json!({"listed": {"Secret": s, "ConfigMap": c, "Deployment": d, "StatefulSet": st,
                "DaemonSet": ds, "CronJob": cj}}),
        );
    });
}

/// glibc's view of the heap, to tell live data from freed memory the allocator keeps.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)] // a C call: see its SAFETY comment
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
                let s = secret(&scale, n, k);
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
                let c = config_map(&scale, n, k);
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
        for n in 0..scale.namespaces() {
            let ns = namespace_name(n);
            for k in 0..scale.deploys_per_ns {
                let mut v = serde_json::to_value(deployment(&scale, k)).expect("JSON");
                v["metadata"]["namespace"] = json!(ns);
                v["metadata"]["resourceVersion"] = json!("123456");
                v["metadata"]["uid"] = json!("705ab4f5-6393-11e8-b7cc-42010a800002");
                if let Some(entry) =
                    WorkloadEntry::from_object(WorkloadKind::DEPLOYMENT, &v).expect("a workload")
                {
                    workloads.upsert(
                        WorkloadKey::new(WorkloadKind::DEPLOYMENT, &ns, &format!("app-{k}")),
                        entry,
                    );
                }
            }
        }
        (configs, workloads)
    };
    let mib = |b: usize| (b as f64 / 1048576.0 * 10.0).round() / 10.0;
    let before = heap::in_use();
    let opted_in: Vec<usize> = (0..scale.namespaces()).step_by(2).collect();
    let half = build(&opted_in);
    let half_bytes = heap::in_use().saturating_sub(before);
    let half_objects = half.0.len();
    drop(half);
    let before = heap::in_use();
    let all: Vec<usize> = (0..scale.namespaces()).collect();
    let full = build(&all);
    let full_bytes = heap::in_use().saturating_sub(before);
    drop(full);
    let before = heap::in_use();
    let full = build(&[]);
    let workload_bytes = heap::in_use().saturating_sub(before);
    drop(full);
    let full = build(&all);
    let line = json!({
        "sync_secs": 0.0,
        "rss_kib": 0,
        "hwm_kib": 0,
        "detail": {
            "all_namespaces": {"configs": full.0.len(), "workloads": full.1.len(), "heap_mib": mib(full_bytes),
                "bytes_per_config_and_workload": full_bytes / (full.0.len() + full.1.len()).max(1)},
            "opted_in_configs_only": {"configs": half_objects, "workloads": full.1.len(), "heap_mib": mib(half_bytes)},
            "workloads_only": {"workloads": full.1.len(), "heap_mib": mib(workload_bytes),
                "bytes_per_workload": workload_bytes / full.1.len().max(1)},
        },
    });
    println!("RESULT {line}");
}

//! Fault run: the whole system under faults, checked workload by workload.
//!
//! Everything runs in this process, wired by `crates/testkit/src/e2e/support.rs`: the in-memory API server
//! (with deploy/'s RBAC enforced on confighash's ServiceAccount), confighash's webhook over HTTPS
//! in its admission chain (failurePolicy Ignore), and TWO watcher replicas doing leader election on
//! the `confighash` Lease (only the leader touches).
//!
//! 1. Setup: opted-in namespaces, a pool of ConfigMaps and Secrets per namespace, and workloads
//!    (mostly Deployments, some StatefulSets and DaemonSets) referencing a few of them in every
//!    form the README lists: envFrom, key references, mounted volumes (whole or `items`), projected
//!    volumes, initContainers, the extra-configmaps annotation, optional references (to objects
//!    that exist and to objects that never do), and volumes declared but not mounted (no
//!    reference). Every workload is stamped by the webhook at CREATE; then the replicas start.
//! 2. Changes, in a random order from a seeded RNG, spread over several change windows: content
//!    changes (a new value, or a new key), content-identical rewrites (the same data re-applied
//!    with a new sync annotation, or the object deleted and re-created with the same content),
//!    label-only changes, and changes to keys no key reference selects, in objects only referenced
//!    by key.
//! 3. Faults injected while the changes run: dropped watches, compactions (watches resuming from
//!    before them get 410 Gone), 429s (with Retry-After) on watches, lists, touch PATCHes and the
//!    webhook's lookups, a webhook outage (stopped, then restarted on the same port; touch PATCHes
//!    get 429s again just before it, so some touches are still being retried when it starts), and
//!    a leader change (the leading replica is killed, the other takes over; a new replica starts
//!    later).
//! 4. Quiescence: polls, under a deadline, until every stamp equals its expected stamp, then runs
//!    barriers (a sentinel ConfigMap and Secret whose sentinel Deployment must roll).
//! 5. Checks, per workload: the stamp equals the expected stamp, computed here with
//!    `confighash::core::checksum::compute_stamp` over the objects read back from the API server and the
//!    references `confighash::core::refs::discover` finds in the read-back pod template; a workload whose
//!    config really changed rolled at least once and at most once per change window in which it
//!    changed (see [`allowed_rollouts`]); every other workload rolled zero times (the stand-in's
//!    rollout accounting: pod-template transitions); and every rollout, as an in-process observer
//!    of that accounting saw it, landed on a stamp the workload's config really had, newer than
//!    the one before (never back to an older config).
//!
//! Prints the figures as a Markdown table and exits 1 on any violation, listing each one.
//!
//! Environment: `CONFIGHASH_FAULT_SEED` (u64; random when unset, printed either way; it replays
//! the same objects, changes and fault schedule; the interleaving with the system's own timing is
//! not replayable), `CONFIGHASH_BENCH_QUICK=1` (100 workloads, 200 changes), `RUST_LOG` (the
//! system's logs, e.g. `confighash=info`), `CONFIGHASH_FAULT_SKIP` (comma-separated fault names as
//! printed in the schedule, e.g. `Patch429,Lookup429`, to leave out while narrowing a finding
//! down; a run that skips any is not a recorded run).
//!
//! **Real-cluster mode.** With the real tier's environment (`CONFIGHASH_E2E_KUBECONFIG` and the
//! rest: `CONFIGHASH_REAL_KEEP=1 scripts/real-tier.sh`, then `source <dir>/e2e.env`), this runs
//! `crates/testkit/src/e2e/fault_run.rs` instead: the faults a real control plane makes (a leader killed,
//! etcd compacted and kube-apiserver restarted, reads refused by API Priority and Fairness,
//! kube-controller-manager restarted), checked from the revisions, the audit log's stored stamps
//! and the Events. The real tier runs it at its own size on every CI run
//! (`crates/testkit/src/e2e/fault_run.rs`).
//!
//! `cargo bench --bench fault_run`. Without `--bench` (as `cargo test --benches` runs it): 12
//! workloads, 24 changes over 3 s, every check, and every fault but the touch PATCH 429s (their
//! retries would hold quiescence for most of a minute); `--list` lists nothing.

use confighash_testkit::bench::mode;
use confighash_testkit::e2e::fault_run as real_fault_run;
use confighash_testkit::e2e::support;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use confighash::core::checksum::StampKey;
use confighash::core::refs::{self, ObjectKind, References, Selection};
use confighash::metrics::Metrics;
use confighash::watcher::leader::{self, LeaderConfig, Leadership};
use confighash::watcher::{self, WatcherConfig};
use confighash_testkit::apiserver::ApiServer;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PodSpec, PodTemplateSpec, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use mode::Mode;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use support::{Env, Setup};

/// The change window (`--debounce`) of both replicas: the e2e scenarios' window.
const WINDOW: Duration = support::WINDOW;
/// How much earlier than a full window after the previous one a workload's next rollout may read
/// its config (see [`allowed_rollouts`]): the touch PATCH's time from send to the webhook's reads.
const LATENCY_MARGIN: Duration = Duration::from_millis(100);
/// So high that the global token bucket (burst 20) refills within nanoseconds and never holds a
/// touch back noticeably. The default, 5/s, would stretch this run's ~2,000 touches over about
/// seven minutes and coalesce most windows: a different run.
const TOUCHES_PER_SECOND: f64 = 1e9;
const OPTED_IN: usize = 4;
const BARRIER_NS: &str = "fault-barrier";
const LEASE_NS: &str = "confighash";
const CREATE_CONCURRENCY: usize = 16;
const QUIESCENCE_DEADLINE: Duration = Duration::from_secs(120);
const BARRIER_DEADLINE: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(200);
const SYNC_ANNOTATION: &str = "fault-run.example.com/synced";
const REV_LABEL: &str = "fault-run.example.com/rev";

const CM_KEYS: [&str; 5] = ["LOG_LEVEL", "PORT", "TIMEOUT", "FEATURES", "app.yaml"];
const SECRET_KEYS: [&str; 3] = ["username", "password", "token"];
/// Keys of the ConfigMaps that are only referenced by key; the `UNUSED_` ones are never selected.
const KEYED_CM_KEYS: [&str; 3] = ["DB_HOST", "DB_PORT", "CACHE_TTL"];
const KEYED_CM_UNUSED: [&str; 2] = ["UNUSED_A", "UNUSED_B"];
const KEYED_SECRET_KEYS: [&str; 2] = ["api-key", "signing-key"];
const KEYED_SECRET_UNUSED: [&str; 1] = ["unused-key"];

struct Size {
    quick: bool,
    workloads: usize,
    changes: usize,
    /// How long the changes are spread over.
    duration: Duration,
    /// Faults left out besides `CONFIGHASH_FAULT_SKIP`'s.
    skip: &'static [&'static str],
}

fn main() {
    let mode = mode::from_args();
    let quick = std::env::var("CONFIGHASH_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let size = if mode == Mode::Smoke {
        // Without `--bench`: every change kind at a tenth of the quick size, and every fault but
        // the touch PATCH 429s, whose retries alone would keep quiescence waiting for most of a
        // minute after so short a change phase.
        Size {
            quick: true,
            workloads: 12,
            changes: 24,
            duration: Duration::from_secs(3),
            skip: &["Patch429", "Patch429BeforeOutage"],
        }
    } else if quick {
        Size {
            quick,
            workloads: 100,
            changes: 200,
            duration: Duration::from_secs(15),
            skip: &[],
        }
    } else {
        Size {
            quick,
            workloads: 500,
            changes: 1000,
            duration: Duration::from_secs(30),
            skip: &[],
        }
    };
    let seed = match std::env::var("CONFIGHASH_FAULT_SEED") {
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(s) => s,
            Err(_) => {
                eprintln!("CONFIGHASH_FAULT_SEED must be an unsigned 64-bit integer, not {v:?}");
                std::process::exit(2);
            }
        },
        Err(_) => rand::random::<u64>(),
    };
    if std::env::var_os("CONFIGHASH_E2E_KUBECONFIG").is_some() {
        std::process::exit(run_real(mode, seed));
    }
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    // One TLS implementation for the webhook and the stand-in's webhook client.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let ok = rt.block_on(run(size, seed));
    // The replicas' and servers' tasks are not waited for.
    std::process::exit(if ok { 0 } else { 1 });
}

/// The real-cluster mode (`crates/testkit/src/e2e/fault_run.rs`), on the control plane the real tier's
/// environment names (`CONFIGHASH_REAL_KEEP=1 scripts/real-tier.sh`, then
/// `source $CONFIGHASH_CONTROL_PLANE_DIR/e2e.env`): its bench size with `--bench`, the real
/// tier's without. Returns the exit code.
fn run_real(mode: Mode, seed: u64) -> i32 {
    let size = match mode {
        Mode::Full => real_fault_run::Size::bench(),
        Mode::Smoke => real_fault_run::Size::tier(),
    };
    println!("fault run on a real control plane: seed {seed}, {size:?}");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        if support::audit().is_none() {
            eprintln!("the real-cluster fault run needs CONFIGHASH_E2E_AUDIT_LOG (the real tier's e2e.env)");
            return 2;
        }
        let Some(env) = Env::controlling("fault_run", Setup::default()).await else {
            return 2;
        };
        let report = real_fault_run::run(&env, &size, seed).await;
        println!("{}", report.table);
        for v in &report.violations {
            println!("VIOLATION: {v}");
        }
        i32::from(!report.violations.is_empty())
    })
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

// ----- the objects -----

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Kind {
    Deployment,
    StatefulSet,
    DaemonSet,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Deployment, Kind::StatefulSet, Kind::DaemonSet];

    fn as_str(self) -> &'static str {
        match self {
            Kind::Deployment => "Deployment",
            Kind::StatefulSet => "StatefulSet",
            Kind::DaemonSet => "DaemonSet",
        }
    }

    fn plural(self) -> &'static str {
        match self {
            Kind::Deployment => "deployments",
            Kind::StatefulSet => "statefulsets",
            Kind::DaemonSet => "daemonsets",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Kind::Deployment => "web",
            Kind::StatefulSet => "db",
            Kind::DaemonSet => "agent",
        }
    }
}

/// How a ConfigMap or Secret of the pool is referenced, which decides which changes apply to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pool {
    /// Referenced as a whole or by key, never optionally.
    Shared,
    /// Only referenced by key (env key references, `items`); has keys nothing selects.
    Keyed,
    /// Only referenced optionally.
    Optional,
}

/// One ConfigMap or Secret of the pool (those that exist at the start).
#[derive(Debug, Clone)]
struct PoolObject {
    ns: String,
    kind: ObjectKind,
    name: String,
    pool: Pool,
}

/// The names of one namespace's pool.
struct Names {
    cms: Vec<String>,
    secrets: Vec<String>,
    keyed_cms: Vec<String>,
    keyed_secrets: Vec<String>,
    /// Optional ConfigMaps that exist, then ones that never do.
    opt_cms: Vec<String>,
    opt_missing: Vec<String>,
    opt_secrets: Vec<String>,
}

impl Names {
    fn new(per_ns: usize) -> Self {
        let n = |prefix: &str, count: usize| -> Vec<String> {
            (0..count).map(|i| format!("{prefix}-{i}")).collect()
        };
        Names {
            cms: n("cm", (per_ns / 8).max(4)),
            secrets: n("sec", (per_ns / 12).max(3)),
            keyed_cms: n("keyed-cm", (per_ns / 25).max(2)),
            keyed_secrets: n("keyed-sec", (per_ns / 40).max(1)),
            opt_cms: n("opt-cm", 2),
            opt_missing: n("opt-missing", 2),
            opt_secrets: n("opt-sec", 1),
        }
    }
}

/// The local model of the config: what this bench wrote, as the API server returned it.
#[derive(Default)]
struct NsConfig {
    cms: BTreeMap<String, ConfigMap>,
    secrets: BTreeMap<String, Secret>,
}

struct Workload {
    ns: String,
    kind: Kind,
    name: String,
    manifest: Value,
    /// The references of the manifest, as confighash::core::refs finds them.
    refs: References,
    /// The stamp the recipe gives at CREATE (model), and the one the webhook put on it.
    initial: String,
    created_stamp: Option<String>,
    /// The stamp the rules decide now (model): the recipe, or the previous one while a required
    /// reference is absent (rule 2).
    decided: String,
    /// When a write changed `decided`: (sent, answered), seconds since the changes started.
    points: Vec<(f64, f64)>,
    /// `initial`, then the stamp each point changed `decided` to.
    stamps: Vec<String>,
}

fn object_key(ns: &str, kind: ObjectKind, name: &str) -> (String, ObjectKind, String) {
    (ns.to_owned(), kind, name.to_owned())
}

fn cm_data(name: &str, keys: &[&str], binary: bool) -> ConfigMap {
    let data = keys
        .iter()
        .map(|k| {
            let v = match *k {
                "LOG_LEVEL" => "info".to_owned(),
                "PORT" => "8080".to_owned(),
                "TIMEOUT" => "30s".to_owned(),
                "FEATURES" => "search,cart".to_owned(),
                "app.yaml" => format!("server:\n  name: {name}\n  port: 8080\n"),
                other => format!("{other}-initial"),
            };
            ((*k).to_owned(), v)
        })
        .collect();
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/part-of".to_owned(),
                "shop".to_owned(),
            )])),
            ..Default::default()
        },
        data: Some(data),
        binary_data: binary.then(|| {
            BTreeMap::from([(
                "logo.png".to_owned(),
                ByteString(vec![0x89, 0x50, 0x4e, 0x47, name.len() as u8]),
            )])
        }),
        ..Default::default()
    }
}

fn secret_data(name: &str, keys: &[&str]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        type_: Some("Opaque".to_owned()),
        data: Some(
            keys.iter()
                .map(|k| {
                    (
                        (*k).to_owned(),
                        ByteString(format!("{name}/{k}/initial").into_bytes()),
                    )
                })
                .collect(),
        ),
        ..Default::default()
    }
}

/// Builds one workload's pod template from random references to its namespace's pool.
struct SpecBuilder {
    env: Vec<Value>,
    env_from: Vec<Value>,
    init_env: Vec<Value>,
    mounts: Vec<Value>,
    volumes: Vec<Value>,
    extra_cms: Vec<String>,
    n: usize,
}

/// An index into `len` items, skewed towards the first ones (a few popular shared objects).
fn skewed(rng: &mut StdRng, len: usize) -> usize {
    let u: f64 = rng.random();
    ((u * u * len as f64) as usize).min(len - 1)
}

fn pick<'a>(rng: &mut StdRng, items: &'a [String]) -> &'a str {
    &items[rng.random_range(0..items.len())]
}

fn pick_key<'a>(rng: &mut StdRng, keys: &[&'a str]) -> &'a str {
    keys[rng.random_range(0..keys.len())]
}

impl SpecBuilder {
    fn new() -> Self {
        SpecBuilder {
            env: Vec::new(),
            env_from: Vec::new(),
            init_env: Vec::new(),
            mounts: Vec::new(),
            volumes: Vec::new(),
            extra_cms: Vec::new(),
            n: 0,
        }
    }

    fn next(&mut self) -> usize {
        self.n += 1;
        self.n
    }

    fn mount(&mut self, volume: Value) {
        let n = self.next();
        let mut volume = volume;
        volume["name"] = json!(format!("v{n}"));
        self.volumes.push(volume);
        self.mounts
            .push(json!({"name": format!("v{n}"), "mountPath": format!("/etc/config/v{n}")}));
    }

    fn items(rng: &mut StdRng, keys: &[&str]) -> Value {
        let first = pick_key(rng, keys);
        let mut chosen = vec![first];
        if rng.random_bool(0.4) {
            let second = pick_key(rng, keys);
            if second != first {
                chosen.push(second);
            }
        }
        Value::Array(
            chosen
                .into_iter()
                .map(|k| json!({"key": k, "path": k}))
                .collect(),
        )
    }

    /// One reference of a random form.
    fn add_reference(&mut self, rng: &mut StdRng, names: &Names) {
        let cm = names.cms[skewed(rng, names.cms.len())].clone();
        let secret = names.secrets[skewed(rng, names.secrets.len())].clone();
        let form = rng.random_range(0..100);
        match form {
            0..15 => self.env_from.push(json!({"configMapRef": {"name": cm}})),
            15..24 => self.env_from.push(json!({"secretRef": {"name": secret}})),
            24..38 => {
                let (name, key) = if rng.random_bool(0.5) {
                    (cm, pick_key(rng, &CM_KEYS))
                } else {
                    (
                        pick(rng, &names.keyed_cms).to_owned(),
                        pick_key(rng, &KEYED_CM_KEYS),
                    )
                };
                let n = self.next();
                self.env.push(json!({"name": format!("CFG_{n}"), "valueFrom": {"configMapKeyRef": {"name": name, "key": key}}}));
            }
            38..48 => {
                let (name, key) = if rng.random_bool(0.5) {
                    (secret, pick_key(rng, &SECRET_KEYS))
                } else {
                    (
                        pick(rng, &names.keyed_secrets).to_owned(),
                        pick_key(rng, &KEYED_SECRET_KEYS),
                    )
                };
                let n = self.next();
                self.env.push(json!({"name": format!("SECRET_{n}"), "valueFrom": {"secretKeyRef": {"name": name, "key": key}}}));
            }
            48..56 => self.mount(json!({"configMap": {"name": cm}})),
            56..64 => {
                let v = if rng.random_bool(0.5) {
                    json!({"configMap": {"name": cm, "items": Self::items(rng, &CM_KEYS)}})
                } else {
                    let name = pick(rng, &names.keyed_cms).to_owned();
                    json!({"configMap": {"name": name, "items": Self::items(rng, &KEYED_CM_KEYS)}})
                };
                self.mount(v);
            }
            64..70 => {
                let v = if rng.random_bool(0.5) {
                    json!({"secret": {"secretName": secret, "items": Self::items(rng, &SECRET_KEYS)}})
                } else {
                    let name = pick(rng, &names.keyed_secrets).to_owned();
                    json!({"secret": {"secretName": name, "items": Self::items(rng, &KEYED_SECRET_KEYS)}})
                };
                self.mount(v);
            }
            70..75 => {
                let items = Self::items(rng, &SECRET_KEYS);
                self.mount(json!({"projected": {"sources": [
                    {"configMap": {"name": cm}},
                    {"secret": {"name": secret, "items": items}}
                ]}}));
            }
            75..83 => {
                if rng.random_bool(0.25) {
                    let name = pick(rng, &names.opt_secrets).to_owned();
                    self.env_from
                        .push(json!({"secretRef": {"name": name, "optional": true}}));
                } else {
                    let name = if rng.random_bool(0.6) {
                        pick(rng, &names.opt_cms).to_owned()
                    } else {
                        pick(rng, &names.opt_missing).to_owned()
                    };
                    self.env_from
                        .push(json!({"configMapRef": {"name": name, "optional": true}}));
                }
            }
            83..89 => {
                let name = if rng.random_bool(0.7) {
                    pick(rng, &names.opt_cms).to_owned()
                } else {
                    pick(rng, &names.opt_missing).to_owned()
                };
                // Sometimes a key the object does not have ("absent-key" in the recipe).
                let key = if rng.random_bool(0.8) {
                    pick_key(rng, &CM_KEYS)
                } else {
                    "MAYBE"
                };
                let n = self.next();
                self.env.push(json!({"name": format!("OPT_{n}"), "valueFrom": {"configMapKeyRef": {"name": name, "key": key, "optional": true}}}));
            }
            89..95 => {
                let (name, key) = if rng.random_bool(0.5) {
                    (cm, pick_key(rng, &CM_KEYS))
                } else {
                    (
                        pick(rng, &names.keyed_cms).to_owned(),
                        pick_key(rng, &KEYED_CM_KEYS),
                    )
                };
                let n = self.next();
                self.init_env.push(json!({"name": format!("INIT_{n}"), "valueFrom": {"configMapKeyRef": {"name": name, "key": key}}}));
            }
            _ => self.extra_cms.push(cm),
        }
    }

    fn build(self, kind: Kind, name: &str, unmounted: Option<&str>) -> Value {
        let mut volumes = self.volumes;
        if let Some(cm) = unmounted {
            // Declared, never mounted: not a reference.
            volumes.push(json!({"name": "unmounted", "configMap": {"name": cm}}));
        }
        let mut spec = json!({
            "containers": [{
                "name": "app",
                "image": "example/app:1",
                "env": self.env,
                "envFrom": self.env_from,
                "volumeMounts": self.mounts
            }],
            "volumes": volumes
        });
        if !self.init_env.is_empty() {
            spec["initContainers"] =
                json!([{"name": "init", "image": "example/init:1", "env": self.init_env}]);
        }
        let mut annotations = serde_json::Map::new();
        if !self.extra_cms.is_empty() {
            // As users write it: spaces, a trailing comma, duplicates.
            let mut list = self.extra_cms.join(" , ");
            list.push(',');
            annotations.insert("confighash.dev/extra-configmaps".into(), json!(list));
        }
        let template = json!({"metadata": {"labels": {"app": name}}, "spec": spec});
        let mut wspec = json!({"selector": {"matchLabels": {"app": name}}, "template": template});
        if kind == Kind::StatefulSet {
            wspec["serviceName"] = json!(name);
        }
        let api_version = "apps/v1";
        json!({
            "apiVersion": api_version,
            "kind": kind.as_str(),
            "metadata": {"name": name, "labels": {"app": name}, "annotations": annotations},
            "spec": wspec
        })
    }
}

fn template_refs(manifest: &Value) -> Result<References, String> {
    let spec: PodSpec = serde_json::from_value(manifest["spec"]["template"]["spec"].clone())
        .map_err(|e| format!("pod spec: {e}"))?;
    let annotations: Option<BTreeMap<String, String>> =
        serde_json::from_value(manifest["metadata"]["annotations"].clone()).ok();
    Ok(refs::discover(&spec, annotations.as_ref()))
}

// ----- replicas and leadership -----

struct Replica {
    identity: String,
    leadership: Leadership,
    election: tokio::task::JoinHandle<()>,
    watcher: tokio::task::JoinHandle<()>,
    metrics: Arc<Metrics>,
    stopped: bool,
}

impl Replica {
    fn start(env: &Env, identity: &str) -> Replica {
        let mut config = LeaderConfig::new(LEASE_NS, identity);
        // The e2e scenarios' timings.
        config.lease_duration = Duration::from_millis(1500);
        config.renew_deadline = Duration::from_millis(1000);
        config.retry_period = Duration::from_millis(200);
        let (leadership, election) = leader::spawn(env.confighash.clone(), config);
        let metrics = Arc::new(Metrics::new());
        let watcher = tokio::spawn(watcher::run(
            env.confighash.clone(),
            env.keys.clone(),
            leadership.clone(),
            metrics.clone(),
            WatcherConfig {
                identity: identity.to_owned(),
                ..env.config.clone()
            },
        ));
        Replica {
            identity: identity.to_owned(),
            leadership,
            election,
            watcher,
            metrics,
            stopped: false,
        }
    }

    /// Kills the replica, as a deleted pod: its election and watcher stop (touches already sent
    /// finish).
    fn stop(&mut self) {
        self.watcher.abort();
        self.election.abort();
        self.stopped = true;
    }

    fn synced(&self) -> bool {
        self.metrics
            .encode()
            .lines()
            .any(|l| l == "confighash_watcher_cache_synced 1")
    }
}

/// Who led when, polled every 10 ms.
#[derive(Default)]
struct LeaderLog {
    /// (seconds since the changes started, who leads now or None).
    transitions: Vec<(f64, Option<String>)>,
    /// Polls that saw two replicas leading at once.
    overlaps: u64,
}

fn watch_leaders(
    replicas: Arc<Mutex<Vec<(String, Leadership)>>>,
    log: Arc<Mutex<LeaderLog>>,
    start: Instant,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut last: Option<Option<String>> = None;
        loop {
            let leading: Vec<String> = replicas
                .lock()
                .expect("lock")
                .iter()
                .filter(|(_, l)| l.is_leader())
                .map(|(n, _)| n.clone())
                .collect();
            let now = leading.first().cloned();
            {
                let mut log = log.lock().expect("lock");
                if leading.len() > 1 {
                    log.overlaps += 1;
                }
                if last.as_ref() != Some(&now) {
                    log.transitions.push((secs(start.elapsed()), now.clone()));
                    last = Some(now);
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
}

// ----- rollouts as they happen -----

/// Rollouts of a workload found by one poll of the stand-in's accounting.
#[derive(Debug, Clone)]
struct Rollout {
    /// Seconds since the changes started.
    at: f64,
    /// Pod-template transitions since the previous poll (more than 1: not seen one by one).
    count: u64,
    /// The stamp after them.
    stamp: Option<String>,
}

fn stored_stamp(api: &ApiServer, kind: Kind, ns: &str, name: &str) -> Option<String> {
    api.object(kind.plural(), ns, name)?
        .pointer("/spec/template/metadata/annotations")?
        .get(support::STAMP)?
        .as_str()
        .map(str::to_owned)
}

/// Polls the stand-in's rollout accounting (in process, no requests: injected faults do not
/// touch it) every 20 ms and records each workload's rollouts with the stamp they left.
fn observe_rollouts(
    api: Arc<ApiServer>,
    targets: Vec<(String, Kind, String)>,
    out: Arc<Mutex<Vec<Vec<Rollout>>>>,
    start: Instant,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut last: Vec<u64> = targets
            .iter()
            .map(|(ns, kind, name)| api.rollouts(ns, kind.as_str(), name))
            .collect();
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            for (i, (ns, kind, name)) in targets.iter().enumerate() {
                // The stamp read before and after the count, until they agree, so that it is
                // the stamp of the last counted transition.
                let (n, stamp) = loop {
                    let before = stored_stamp(&api, *kind, ns, name);
                    let n = api.rollouts(ns, kind.as_str(), name);
                    if stored_stamp(&api, *kind, ns, name) == before {
                        break (n, before);
                    }
                };
                if n > last[i] {
                    out.lock().expect("lock")[i].push(Rollout {
                        at: secs(start.elapsed()),
                        count: n - last[i],
                        stamp,
                    });
                    last[i] = n;
                }
            }
        }
    })
}

/// The last 8 hex digits of a stamp, to tell stamps apart in reports.
fn short(stamp: &str) -> &str {
    &stamp[stamp.len().saturating_sub(8)..]
}

/// A workload's expected-stamp history and its rollouts, for a violation report.
fn timeline(w: &Workload, rollouts: &[Rollout]) -> String {
    let mut out = format!("expected {}", short(&w.stamps[0]));
    for (p, s) in w.points.iter().zip(w.stamps.iter().skip(1)) {
        out.push_str(&format!(", {}@{:.3}-{:.3}s", short(s), p.0, p.1));
    }
    out.push_str("; rolled ");
    if rollouts.is_empty() {
        out.push_str("never");
    }
    for (i, r) in rollouts.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&format!(
            "{}{}@{:.3}s",
            if r.count > 1 {
                format!("{}x to ", r.count)
            } else {
                String::new()
            },
            r.stamp.as_deref().map(short).unwrap_or("(none)"),
            r.at
        ));
    }
    out
}

// ----- faults -----

#[derive(Debug, Clone, Copy)]
enum Fault {
    WatchDrop,
    WatchDrop429,
    Compact,
    CompactList429,
    Patch429,
    Lookup429,
    Patch429BeforeOutage,
    WebhookDown,
    WebhookUp,
    LeaderKill,
    ReplicaStart,
    WorkloadCompact429,
}

/// When each fault fires, as a fraction of the change phase (and see [`PATCH_429_LEAD`]).
const FAULTS: [(f64, Fault); 12] = [
    (0.06, Fault::WatchDrop),
    (0.14, Fault::WatchDrop429),
    (0.22, Fault::Compact),
    (0.30, Fault::CompactList429),
    (0.38, Fault::Patch429),
    (0.44, Fault::Lookup429),
    (0.50, Fault::WebhookDown),
    (0.60, Fault::WebhookUp),
    (0.68, Fault::LeaderKill),
    (0.80, Fault::ReplicaStart),
    (0.86, Fault::WorkloadCompact429),
    (0.93, Fault::WatchDrop),
];

/// How long before the webhook outage touch PATCHes get 429s again: the touches sent next (at the
/// next window's close) are retried by kube's client after `Retry-After: 1` and so reach the API
/// server while the webhook is down. Touches in flight across the start of an outage, as when the
/// API server throttles and the webhook's pods go away at once.
const PATCH_429_LEAD: Duration = Duration::from_millis(600);

/// A `fail_next` armed during the run.
struct Armed {
    verb: &'static str,
    resource: &'static str,
    count: u32,
    /// Length of the stand-in's request log when armed.
    from: usize,
}

#[derive(Default)]
struct FaultLog {
    watch_drops: u32,
    compactions: u32,
    armed: Vec<Armed>,
    webhook_down: Option<f64>,
    webhook_outage: f64,
    webhook_outages: u32,
    leader_kill: Option<(f64, String)>,
    events: Vec<String>,
}

impl FaultLog {
    fn arm(&mut self, api: &ApiServer, verb: &'static str, resource: &'static str, count: u32) {
        let from = api.requests().len();
        api.fail_next(Some(verb), Some(resource), count, 429);
        self.armed.push(Armed {
            verb,
            resource,
            count,
            from,
        });
    }

    /// How many requests each armed fault failed, replaying the stand-in's request log: faults
    /// are matched in the order they were armed, as the stand-in does.
    fn hits(&self, log: &[(String, String)]) -> Vec<u32> {
        let mut remaining: Vec<u32> = self.armed.iter().map(|a| a.count).collect();
        let mut hits = vec![0; self.armed.len()];
        let start = self.armed.iter().map(|a| a.from).min().unwrap_or(log.len());
        for (i, (verb, resource)) in log.iter().enumerate().skip(start) {
            if let Some(j) = (0..self.armed.len()).find(|&j| {
                let a = &self.armed[j];
                a.from <= i && remaining[j] > 0 && a.verb == verb && a.resource == resource
            }) {
                remaining[j] -= 1;
                hits[j] += 1;
            }
        }
        hits
    }
}

// ----- changes -----

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum ChangeType {
    Content,
    NewKey,
    Reapply,
    Recreate,
    LabelOnly,
    UnusedKey,
}

impl ChangeType {
    fn describe(self) -> &'static str {
        match self {
            ChangeType::Content => "content (a key's value)",
            ChangeType::NewKey => "content (a new key)",
            ChangeType::Reapply => "identical rewrite (same data re-applied, new sync annotation)",
            ChangeType::Recreate => "identical rewrite (deleted and re-created, same content)",
            ChangeType::LabelOnly => "label-only",
            ChangeType::UnusedKey => "unreferenced key of an object referenced only by key",
        }
    }
}

/// The written object, as the API server returned it (None: deleted).
enum Written {
    Cm(ConfigMap),
    Secret(Secret),
}

struct Run {
    env: Env,
    /// The stand-in, taken out of `env` so that the rollout observer can share it.
    api: Arc<ApiServer>,
    /// Per workload (same order), every rollout seen by the observer.
    rollouts: Arc<Mutex<Vec<Vec<Rollout>>>>,
    key: StampKey,
    size: Size,
    config: BTreeMap<String, NsConfig>,
    pool: Vec<PoolObject>,
    workloads: Vec<Workload>,
    /// (namespace, kind, name) of a ConfigMap or Secret -> the workloads referencing it.
    dependents: HashMap<(String, ObjectKind, String), Vec<usize>>,
    changes: BTreeMap<ChangeType, u32>,
    /// Writes that changed at least one workload's decided stamp, (sent, answered).
    effective: Vec<(f64, f64)>,
    faults: FaultLog,
    replicas: Vec<Replica>,
    leader_handles: Arc<Mutex<Vec<(String, Leadership)>>>,
    leader_log: Arc<Mutex<LeaderLog>>,
    start: Instant,
    barrier_n: u64,
}

impl Run {
    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    async fn write_patch(&self, obj: &PoolObject, patch: Value) -> Result<Written, String> {
        let pp = PatchParams::default();
        match obj.kind {
            ObjectKind::ConfigMap => Api::<ConfigMap>::namespaced(self.env.client.clone(), &obj.ns)
                .patch(&obj.name, &pp, &Patch::Merge(&patch))
                .await
                .map(Written::Cm),
            ObjectKind::Secret => Api::<Secret>::namespaced(self.env.client.clone(), &obj.ns)
                .patch(&obj.name, &pp, &Patch::Merge(&patch))
                .await
                .map(Written::Secret),
        }
        .map_err(|e| format!("patch {} {}/{}: {e}", obj.kind.as_str(), obj.ns, obj.name))
    }

    fn store(&mut self, ns: &str, written: Option<Written>, kind: ObjectKind, name: &str) {
        let model = self.config.entry(ns.to_owned()).or_default();
        match (written, kind) {
            (Some(Written::Cm(cm)), _) => {
                model.cms.insert(name.to_owned(), cm);
            }
            (Some(Written::Secret(s)), _) => {
                model.secrets.insert(name.to_owned(), s);
            }
            (None, ObjectKind::ConfigMap) => {
                model.cms.remove(name);
            }
            (None, ObjectKind::Secret) => {
                model.secrets.remove(name);
            }
        }
    }

    /// Recomputes the decided stamps of the object's dependents after a write sent at `sent`
    /// and answered at `answered`; returns how many changed.
    fn recompute(
        &mut self,
        ns: &str,
        kind: ObjectKind,
        name: &str,
        sent: f64,
        answered: f64,
    ) -> usize {
        let Some(deps) = self.dependents.get(&object_key(ns, kind, name)).cloned() else {
            return 0;
        };
        let model = &self.config[ns];
        let mut changed = 0;
        for w in deps {
            let wl = &mut self.workloads[w];
            let (stamp, required_absent) =
                support::recipe(&self.key, ns, &wl.refs, &model.cms, &model.secrets)
                    .expect("the recipe");
            // Rule 2: while a required reference is absent the stamp is kept.
            if !required_absent && stamp != wl.decided {
                wl.decided = stamp.clone();
                wl.stamps.push(stamp);
                wl.points.push((sent, answered));
                changed += 1;
            }
        }
        if changed > 0 {
            self.effective.push((sent, answered));
        }
        changed
    }

    fn now(&self) -> f64 {
        secs(self.start.elapsed())
    }

    /// One random change.
    async fn change(&mut self, rng: &mut StdRng, n: usize) -> Result<(), String> {
        let roll = rng.random_range(0..100);
        let ty = match roll {
            0..44 => ChangeType::Content,
            44..50 => ChangeType::NewKey,
            50..64 => ChangeType::Reapply,
            64..70 => ChangeType::Recreate,
            70..85 => ChangeType::LabelOnly,
            _ => ChangeType::UnusedKey,
        };
        let candidates: Vec<usize> = (0..self.pool.len())
            .filter(|&i| {
                let p = self.pool[i].pool;
                match ty {
                    ChangeType::Recreate => p != Pool::Optional,
                    ChangeType::UnusedKey => p == Pool::Keyed,
                    ChangeType::NewKey => p != Pool::Keyed,
                    _ => true,
                }
            })
            .collect();
        let obj = self.pool[candidates[rng.random_range(0..candidates.len())]].clone();
        let value = format!("v{n}-{:08x}", rng.random::<u32>());
        let model = &self.config[&obj.ns];
        let existing_keys: Vec<String> = match obj.kind {
            ObjectKind::ConfigMap => {
                let cm = &model.cms[&obj.name];
                cm.data
                    .iter()
                    .flat_map(|d| d.keys().cloned())
                    .chain(cm.binary_data.iter().flat_map(|d| d.keys().cloned()))
                    .collect()
            }
            ObjectKind::Secret => model.secrets[&obj.name]
                .data
                .iter()
                .flat_map(|d| d.keys().cloned())
                .collect(),
        };
        let is_binary = |k: &str| -> bool {
            obj.kind == ObjectKind::ConfigMap
                && model.cms[&obj.name]
                    .binary_data
                    .as_ref()
                    .is_some_and(|b| b.contains_key(k))
        };
        let set_key = |key: &str, binary: bool| -> Value {
            match (obj.kind, binary) {
                (ObjectKind::ConfigMap, false) => json!({"data": {key: value}}),
                (ObjectKind::ConfigMap, true) => {
                    json!({"binaryData": {key: Self::b64(value.as_bytes())}})
                }
                (ObjectKind::Secret, _) => json!({"data": {key: Self::b64(value.as_bytes())}}),
            }
        };
        let sent = self.now();
        match ty {
            ChangeType::Content | ChangeType::UnusedKey | ChangeType::NewKey => {
                let patch = match ty {
                    ChangeType::Content => {
                        let selectable: Vec<&str> = existing_keys
                            .iter()
                            .map(String::as_str)
                            .filter(|k| {
                                !KEYED_CM_UNUSED.contains(k) && !KEYED_SECRET_UNUSED.contains(k)
                            })
                            .collect();
                        let key = pick_key(rng, &selectable);
                        set_key(key, is_binary(key))
                    }
                    ChangeType::UnusedKey => {
                        let key = match obj.kind {
                            ObjectKind::ConfigMap => pick_key(rng, &KEYED_CM_UNUSED),
                            ObjectKind::Secret => pick_key(rng, &KEYED_SECRET_UNUSED),
                        };
                        set_key(key, false)
                    }
                    _ => set_key(&format!("NEW_{n}"), false),
                };
                let written = self.write_patch(&obj, patch).await?;
                let answered = self.now();
                self.store(&obj.ns, Some(written), obj.kind, &obj.name);
                self.recompute(&obj.ns, obj.kind, &obj.name, sent, answered);
            }
            ChangeType::Reapply => {
                // A GitOps re-sync: every key sent again with its current value.
                let mut patch =
                    json!({"metadata": {"annotations": {SYNC_ANNOTATION: n.to_string()}}});
                match obj.kind {
                    ObjectKind::ConfigMap => {
                        let cm = &model.cms[&obj.name];
                        patch["data"] = json!(cm.data.clone().unwrap_or_default());
                        if let Some(b) = &cm.binary_data {
                            let b: BTreeMap<&String, String> =
                                b.iter().map(|(k, v)| (k, Self::b64(&v.0))).collect();
                            patch["binaryData"] = json!(b);
                        }
                    }
                    ObjectKind::Secret => {
                        let s = &model.secrets[&obj.name];
                        let d: BTreeMap<&String, String> = s
                            .data
                            .iter()
                            .flatten()
                            .map(|(k, v)| (k, Self::b64(&v.0)))
                            .collect();
                        patch["data"] = json!(d);
                    }
                }
                let written = self.write_patch(&obj, patch).await?;
                let answered = self.now();
                self.store(&obj.ns, Some(written), obj.kind, &obj.name);
                self.recompute(&obj.ns, obj.kind, &obj.name, sent, answered);
            }
            ChangeType::LabelOnly => {
                let patch = json!({"metadata": {"labels": {REV_LABEL: n.to_string()}}});
                let written = self.write_patch(&obj, patch).await?;
                let answered = self.now();
                self.store(&obj.ns, Some(written), obj.kind, &obj.name);
                self.recompute(&obj.ns, obj.kind, &obj.name, sent, answered);
            }
            ChangeType::Recreate => {
                let client = self.env.client.clone();
                let dp = DeleteParams::default();
                let pp = PostParams::default();
                let fresh = |meta: &ObjectMeta| ObjectMeta {
                    name: meta.name.clone(),
                    labels: meta.labels.clone(),
                    annotations: meta.annotations.clone(),
                    ..Default::default()
                };
                let what = format!("{} {}/{}", obj.kind.as_str(), obj.ns, obj.name);
                match obj.kind {
                    ObjectKind::ConfigMap => {
                        let api = Api::<ConfigMap>::namespaced(client, &obj.ns);
                        let old = model.cms[&obj.name].clone();
                        api.delete(&obj.name, &dp)
                            .await
                            .map_err(|e| format!("delete {what}: {e}"))?;
                        let deleted = self.now();
                        self.store(&obj.ns, None, obj.kind, &obj.name);
                        self.recompute(&obj.ns, obj.kind, &obj.name, sent, deleted);
                        let again = ConfigMap {
                            metadata: fresh(&old.metadata),
                            data: old.data,
                            binary_data: old.binary_data,
                            ..Default::default()
                        };
                        let sent = self.now();
                        let created = api
                            .create(&pp, &again)
                            .await
                            .map_err(|e| format!("re-create {what}: {e}"))?;
                        let answered = self.now();
                        self.store(&obj.ns, Some(Written::Cm(created)), obj.kind, &obj.name);
                        self.recompute(&obj.ns, obj.kind, &obj.name, sent, answered);
                    }
                    ObjectKind::Secret => {
                        let api = Api::<Secret>::namespaced(client, &obj.ns);
                        let old = model.secrets[&obj.name].clone();
                        api.delete(&obj.name, &dp)
                            .await
                            .map_err(|e| format!("delete {what}: {e}"))?;
                        let deleted = self.now();
                        self.store(&obj.ns, None, obj.kind, &obj.name);
                        self.recompute(&obj.ns, obj.kind, &obj.name, sent, deleted);
                        let again = Secret {
                            metadata: fresh(&old.metadata),
                            type_: old.type_,
                            data: old.data,
                            ..Default::default()
                        };
                        let sent = self.now();
                        let created = api
                            .create(&pp, &again)
                            .await
                            .map_err(|e| format!("re-create {what}: {e}"))?;
                        let answered = self.now();
                        self.store(&obj.ns, Some(Written::Secret(created)), obj.kind, &obj.name);
                        self.recompute(&obj.ns, obj.kind, &obj.name, sent, answered);
                    }
                }
            }
        }
        *self.changes.entry(ty).or_default() += 1;
        Ok(())
    }

    async fn fault(&mut self, fault: Fault) {
        let t = self.now();
        let note = match fault {
            Fault::WatchDrop => {
                self.api.close_watches();
                self.faults.watch_drops += 1;
                "every watch dropped".to_owned()
            }
            Fault::WatchDrop429 => {
                self.faults.arm(&self.api, "watch", "configmaps", 2);
                self.faults.arm(&self.api, "watch", "secrets", 2);
                self.api.close_watches();
                self.faults.watch_drops += 1;
                "every watch dropped; the next 2 ConfigMap and 2 Secret watches get 429".to_owned()
            }
            Fault::Compact => {
                self.api.compact();
                self.api.close_watches();
                self.faults.compactions += 1;
                self.faults.watch_drops += 1;
                "history compacted and every watch dropped (resuming watches get 410)".to_owned()
            }
            Fault::CompactList429 => {
                self.faults.arm(&self.api, "list", "configmaps", 2);
                self.faults.arm(&self.api, "list", "secrets", 1);
                self.api.compact();
                self.api.close_watches();
                self.faults.compactions += 1;
                self.faults.watch_drops += 1;
                "compacted, watches dropped; the re-lists get 429 (2 ConfigMap, 1 Secret)"
                    .to_owned()
            }
            Fault::Patch429 | Fault::Patch429BeforeOutage => {
                self.faults.arm(&self.api, "patch", "deployments", 6);
                self.faults.arm(&self.api, "patch", "statefulsets", 2);
                self.faults.arm(&self.api, "patch", "daemonsets", 2);
                "the next 10 touch PATCHes get 429".to_owned()
            }
            Fault::Lookup429 => {
                self.faults.arm(&self.api, "get", "configmaps", 4);
                self.faults.arm(&self.api, "get", "secrets", 2);
                "the webhook's next 6 lookups get 429".to_owned()
            }
            Fault::WebhookDown => {
                self.env.stop_webhook().await;
                self.faults.webhook_down = Some(t);
                "webhook stopped (failurePolicy Ignore)".to_owned()
            }
            Fault::WebhookUp => {
                self.env.restart_webhook().await;
                if let Some(down) = self.faults.webhook_down.take() {
                    self.faults.webhook_outage += t - down;
                    self.faults.webhook_outages += 1;
                }
                "webhook restarted on the same port".to_owned()
            }
            Fault::LeaderKill => {
                let leader = self
                    .replicas
                    .iter()
                    .position(|r| !r.stopped && r.leadership.is_leader())
                    .or_else(|| self.replicas.iter().position(|r| !r.stopped));
                match leader {
                    Some(i) => {
                        let was = self.replicas[i].leadership.is_leader();
                        self.replicas[i].stop();
                        let id = self.replicas[i].identity.clone();
                        self.faults.leader_kill = Some((t, id.clone()));
                        format!(
                            "replica {id} killed ({})",
                            if was {
                                "it led"
                            } else {
                                "no replica led at that moment"
                            }
                        )
                    }
                    None => "no replica to kill".to_owned(),
                }
            }
            Fault::ReplicaStart => {
                let replica = Replica::start(&self.env, "replica-c");
                self.leader_handles
                    .lock()
                    .expect("lock")
                    .push((replica.identity.clone(), replica.leadership.clone()));
                self.replicas.push(replica);
                "a new replica (replica-c) started, as the killed pod's replacement".to_owned()
            }
            Fault::WorkloadCompact429 => {
                self.faults.arm(&self.api, "watch", "deployments", 2);
                self.faults.arm(&self.api, "list", "deployments", 1);
                self.api.compact();
                self.api.close_watches();
                self.faults.compactions += 1;
                self.faults.watch_drops += 1;
                "compacted, watches dropped; the next 2 Deployment watches and 1 list get 429"
                    .to_owned()
            }
        };
        tracing::info!(target: "fault_run", at = t, "fault: {note}");
        self.faults
            .events
            .push(format!("{t:6.2} s  {fault:?}: {note}"));
    }

    /// Changes the sentinel ConfigMap, then the sentinel Secret, each time waiting for the
    /// sentinel Deployment to roll: every event of both streams written before has then been
    /// handled by the leader's watcher.
    async fn barrier(&mut self) -> Result<(), String> {
        let api = self.api.clone();
        for kind in [ObjectKind::ConfigMap, ObjectKind::Secret] {
            let before = api.rollouts(BARRIER_NS, "Deployment", "barrier");
            self.barrier_n += 1;
            let n = self.barrier_n.to_string();
            let pp = PatchParams::default();
            let result = match kind {
                ObjectKind::ConfigMap => {
                    Api::<ConfigMap>::namespaced(self.env.client.clone(), BARRIER_NS)
                        .patch("barrier", &pp, &Patch::Merge(json!({"data": {"n": n}})))
                        .await
                        .map(|_| ())
                }
                ObjectKind::Secret => {
                    Api::<Secret>::namespaced(self.env.client.clone(), BARRIER_NS)
                        .patch(
                            "barrier",
                            &pp,
                            &Patch::Merge(json!({"data": {"n": Self::b64(n.as_bytes())}})),
                        )
                        .await
                        .map(|_| ())
                }
            };
            result.map_err(|e| format!("barrier write: {e}"))?;
            let start = Instant::now();
            while api.rollouts(BARRIER_NS, "Deployment", "barrier") <= before {
                if start.elapsed() > BARRIER_DEADLINE {
                    return Err(format!(
                        "barrier: the sentinel Deployment did not roll within {BARRIER_DEADLINE:?} after a {} change",
                        kind.as_str()
                    ));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Ok(())
    }

    async fn wait_synced(&self) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let live: Vec<&Replica> = self.replicas.iter().filter(|r| !r.stopped).collect();
            let leads = live.iter().any(|r| r.leadership.is_leader());
            if leads && live.iter().all(|r| r.synced()) {
                return Ok(());
            }
            if start.elapsed() > BARRIER_DEADLINE {
                return Err("the replicas did not sync and elect a leader in time".to_owned());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

// ----- reading back -----

/// One workload as read back from the API server.
struct Observed {
    stamp: Option<String>,
    /// The expected stamp over the read-back objects, or why there is none.
    expected: Result<String, String>,
}

async fn list_retrying<K>(api: Api<K>) -> Result<Vec<K>, String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut attempt = 0;
    loop {
        match api.list(&ListParams::default()).await {
            Ok(list) => return Ok(list.items),
            // A 429 left armed: retried, as a client would after Retry-After.
            Err(e) if attempt < 10 => {
                attempt += 1;
                tracing::debug!(error = %e, "list failed; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

fn observe(
    key: &StampKey,
    meta: &ObjectMeta,
    template: Option<&PodTemplateSpec>,
    config: &NsConfig,
) -> Observed {
    let stamp = template
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(support::STAMP))
        .cloned();
    let expected = match template.and_then(|t| t.spec.as_ref()) {
        None => Err("no pod spec".to_owned()),
        Some(spec) => {
            let refs = refs::discover(spec, meta.annotations.as_ref());
            let ns = meta.namespace.as_deref().unwrap_or_default();
            match support::recipe(key, ns, &refs, &config.cms, &config.secrets) {
                Ok((_, true)) => Err("a required reference is absent".to_owned()),
                Ok((s, false)) => Ok(s),
                Err(e) => Err(e),
            }
        }
    };
    Observed { stamp, expected }
}

async fn read_back(
    env: &Env,
    key: &StampKey,
    namespaces: &[String],
) -> Result<HashMap<(String, Kind, String), Observed>, String> {
    let mut out = HashMap::new();
    for ns in namespaces {
        let client = env.client.clone();
        let config = NsConfig {
            cms: list_retrying(Api::<ConfigMap>::namespaced(client.clone(), ns))
                .await?
                .into_iter()
                .map(|c| (c.metadata.name.clone().unwrap_or_default(), c))
                .collect(),
            secrets: list_retrying(Api::<Secret>::namespaced(client.clone(), ns))
                .await?
                .into_iter()
                .map(|s| (s.metadata.name.clone().unwrap_or_default(), s))
                .collect(),
        };
        for d in list_retrying(Api::<Deployment>::namespaced(client.clone(), ns)).await? {
            let o = observe(
                key,
                &d.metadata,
                d.spec.as_ref().map(|s| &s.template),
                &config,
            );
            out.insert(
                (
                    ns.clone(),
                    Kind::Deployment,
                    d.metadata.name.unwrap_or_default(),
                ),
                o,
            );
        }
        for s in list_retrying(Api::<StatefulSet>::namespaced(client.clone(), ns)).await? {
            let o = observe(
                key,
                &s.metadata,
                s.spec.as_ref().map(|s| &s.template),
                &config,
            );
            out.insert(
                (
                    ns.clone(),
                    Kind::StatefulSet,
                    s.metadata.name.unwrap_or_default(),
                ),
                o,
            );
        }
        for d in list_retrying(Api::<DaemonSet>::namespaced(client.clone(), ns)).await? {
            let o = observe(
                key,
                &d.metadata,
                d.spec.as_ref().map(|s| &s.template),
                &config,
            );
            out.insert(
                (
                    ns.clone(),
                    Kind::DaemonSet,
                    d.metadata.name.unwrap_or_default(),
                ),
                o,
            );
        }
    }
    Ok(out)
}

// ----- the bound -----

/// The most rollouts a workload may make: how many change windows its config changed in.
///
/// `points` are the writes that changed the workload's expected stamp, as (sent, answered) in
/// seconds, in the order they were made. The watcher's windows are global (the first change of any
/// referenced object opens one, it closes `WINDOW` later, the next opens at the next change), and
/// they are not observable here, so this counts the most windows the workload's changes can fall
/// into, over every way the windows could lie:
///
/// - Buckets: a bucket opens at the first change after the previous bucket's start `s` and
///   `L` later, i.e. at `max(s + L, sent)`, and it counts once. A change answered after `s` can
///   still be in a window after the one that holds the bucket's first change (windows are global,
///   so one may close right after it), which is why a new bucket opens as soon as a change is
///   answered after the previous bucket *starts*, not after it ends: at most two buckets per `L`
///   of dense changes, which is what two adjacent windows can hold.
/// - The same count, seen from the rollouts: every rollout after the first needs a change that
///   its predecessor's stamp did not include (the webhook stamps from fresh reads; stamps are
///   compared, not replayed), and a replica touches a workload at most once per `WINDOW`. A new
///   leader starts touching only after the lease duration (1.5 s, longer than `WINDOW`).
/// - `L = WINDOW - LATENCY_MARGIN`: touches are paced by when they are sent, the config is read
///   by the webhook a little later; the margin covers that latency, so the bound errs high. (A
///   touch that kube's client retries after a 429 reads a second later still; it could only
///   make two rollouts closer than `L` if changes came closer than `L` too, which the count
///   then allows. What such late touches can really do wrong, land an older stamp, is checked
///   per rollout: see the ordering check in `run_inner`.)
/// - A change counts from when its request was sent, and is "after" a bucket start if it was
///   answered after it, so any instant inside the request is allowed for its commit.
fn allowed_rollouts(points: &[(f64, f64)]) -> usize {
    let spacing = secs(WINDOW.saturating_sub(LATENCY_MARGIN));
    let mut sorted = points.to_vec();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut bucket: Option<f64> = None;
    let mut count = 0;
    for (sent, answered) in sorted {
        match bucket {
            None => {
                bucket = Some(sent);
                count += 1;
            }
            Some(start) if answered > start => {
                bucket = Some((start + spacing).max(sent));
                count += 1;
            }
            Some(_) => {}
        }
    }
    count
}

/// How many windows the watcher opened if it saw every input-changing write when it was sent
/// (informational: the run's figure of "change windows").
fn windows_estimate(effective: &[(f64, f64)]) -> usize {
    let w = secs(WINDOW);
    let mut sorted: Vec<f64> = effective.iter().map(|p| p.0).collect();
    sorted.sort_by(f64::total_cmp);
    let mut closes: Option<f64> = None;
    let mut count = 0;
    for t in sorted {
        if closes.is_none_or(|c| t >= c) {
            closes = Some(t + w);
            count += 1;
        }
    }
    count
}

// ----- the run -----

fn counter(encoded: &str, name: &str) -> f64 {
    encoded
        .lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn run(size: Size, seed: u64) -> bool {
    match run_inner(size, seed).await {
        Ok(ok) => ok,
        Err(e) => {
            println!("FAILED: {e}");
            println!("seed: CONFIGHASH_FAULT_SEED={seed}");
            false
        }
    }
}

async fn run_inner(size: Size, seed: u64) -> Result<bool, String> {
    let total_start = Instant::now();
    println!(
        "fault_run: seed {seed} (CONFIGHASH_FAULT_SEED={seed} replays the objects, changes and fault schedule){}",
        if size.quick {
            "; QUICK mode, not the recorded figures"
        } else {
            ""
        }
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let setup = Setup {
        watcher: WatcherConfig {
            debounce: WINDOW,
            max_touches_per_second: TOUCHES_PER_SECOND,
            ..Setup::default().watcher
        },
        start_watcher: false,
        ..Default::default()
    };
    let env = Env::start_with(setup).await;
    let key = StampKey::new(support::KEY.to_vec()).map_err(|e| e.to_string())?;

    // Namespaces: the Lease's, the opted-in ones, the barrier's.
    let namespaces: Vec<String> = (0..OPTED_IN).map(|i| format!("fault-{i}")).collect();
    Api::<Namespace>::all(env.client.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(LEASE_NS.to_owned()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .map_err(|e| format!("create the Lease namespace: {e}"))?;
    for ns in namespaces.iter().map(String::as_str).chain([BARRIER_NS]) {
        env.namespace(ns, true).await;
    }

    // The pool.
    let per_ns = size.workloads.div_ceil(OPTED_IN);
    let names = Names::new(per_ns);
    let mut pool = Vec::new();
    let mut config: BTreeMap<String, NsConfig> = BTreeMap::new();
    let setup_start = Instant::now();
    for ns in &namespaces {
        let mut to_create: Vec<(Pool, Result<ConfigMap, Secret>)> = Vec::new();
        for (i, n) in names.cms.iter().enumerate() {
            to_create.push((Pool::Shared, Ok(cm_data(n, &CM_KEYS, i % 4 == 0))));
        }
        for n in &names.secrets {
            to_create.push((Pool::Shared, Err(secret_data(n, &SECRET_KEYS))));
        }
        for n in &names.keyed_cms {
            let keys: Vec<&str> = KEYED_CM_KEYS
                .iter()
                .chain(&KEYED_CM_UNUSED)
                .copied()
                .collect();
            to_create.push((Pool::Keyed, Ok(cm_data(n, &keys, false))));
        }
        for n in &names.keyed_secrets {
            let keys: Vec<&str> = KEYED_SECRET_KEYS
                .iter()
                .chain(&KEYED_SECRET_UNUSED)
                .copied()
                .collect();
            to_create.push((Pool::Keyed, Err(secret_data(n, &keys))));
        }
        for n in &names.opt_cms {
            to_create.push((Pool::Optional, Ok(cm_data(n, &CM_KEYS, false))));
        }
        for n in &names.opt_secrets {
            to_create.push((Pool::Optional, Err(secret_data(n, &SECRET_KEYS))));
        }
        let model = config.entry(ns.clone()).or_default();
        let pp = PostParams::default();
        for (p, obj) in to_create {
            match obj {
                Ok(cm) => {
                    let name = cm.metadata.name.clone().unwrap_or_default();
                    let created = Api::<ConfigMap>::namespaced(env.client.clone(), ns)
                        .create(&pp, &cm)
                        .await
                        .map_err(|e| format!("create ConfigMap {ns}/{name}: {e}"))?;
                    model.cms.insert(name.clone(), created);
                    pool.push(PoolObject {
                        ns: ns.clone(),
                        kind: ObjectKind::ConfigMap,
                        name,
                        pool: p,
                    });
                }
                Err(s) => {
                    let name = s.metadata.name.clone().unwrap_or_default();
                    let created = Api::<Secret>::namespaced(env.client.clone(), ns)
                        .create(&pp, &s)
                        .await
                        .map_err(|e| format!("create Secret {ns}/{name}: {e}"))?;
                    model.secrets.insert(name.clone(), created);
                    pool.push(PoolObject {
                        ns: ns.clone(),
                        kind: ObjectKind::Secret,
                        name,
                        pool: p,
                    });
                }
            }
        }
    }

    // The workloads.
    let mut workloads = Vec::new();
    let mut per_kind: BTreeMap<Kind, usize> = BTreeMap::new();
    for i in 0..size.workloads {
        let ns = namespaces[i % OPTED_IN].clone();
        let kind = match rng.random_range(0..100) {
            0..80 => Kind::Deployment,
            80..92 => Kind::StatefulSet,
            _ => Kind::DaemonSet,
        };
        let index = per_kind.entry(kind).or_default();
        let name = format!("{}-{index}", kind.prefix());
        *index += 1;
        let count = match rng.random_range(0..100) {
            0..4 => 0,
            4..29 => 1,
            29..64 => 2,
            64..88 => 3,
            88..96 => 4,
            _ => 5,
        };
        let mut b = SpecBuilder::new();
        for _ in 0..count {
            b.add_reference(&mut rng, &names);
        }
        let unmounted = rng
            .random_bool(0.1)
            .then(|| names.cms[rng.random_range(0..names.cms.len())].clone());
        let manifest = b.build(kind, &name, unmounted.as_deref());
        let refs = template_refs(&manifest)?;
        let model = &config[&ns];
        let (stamp, required_absent) =
            support::recipe(&key, &ns, &refs, &model.cms, &model.secrets)?;
        if required_absent {
            return Err(format!(
                "bench bug: {ns}/{name} has a required reference that is absent"
            ));
        }
        workloads.push(Workload {
            ns,
            kind,
            name,
            manifest,
            refs,
            initial: stamp.clone(),
            created_stamp: None,
            decided: stamp.clone(),
            points: Vec::new(),
            stamps: vec![stamp],
        });
    }
    let created: Vec<Result<(usize, Option<String>), String>> = {
        use futures::StreamExt;
        futures::stream::iter(workloads.iter().enumerate())
            .map(|(i, w)| {
                let api: Api<DynamicObject> = Api::namespaced_with(
                    env.client.clone(),
                    &w.ns,
                    &support::api_resource(w.kind.as_str()),
                );
                let obj: Result<DynamicObject, _> = serde_json::from_value(w.manifest.clone());
                let what = format!("{} {}/{}", w.kind.as_str(), w.ns, w.name);
                async move {
                    let obj = obj.map_err(|e| format!("{what}: {e}"))?;
                    let created = api
                        .create(&PostParams::default(), &obj)
                        .await
                        .map_err(|e| format!("create {what}: {e}"))?;
                    let stamp = serde_json::to_value(&created).ok().and_then(|v| {
                        v.pointer("/spec/template/metadata/annotations")?
                            .get(support::STAMP)?
                            .as_str()
                            .map(str::to_owned)
                    });
                    Ok((i, stamp))
                }
            })
            .buffer_unordered(CREATE_CONCURRENCY)
            .collect()
            .await
    };
    for c in created {
        let (i, stamp) = c?;
        workloads[i].created_stamp = stamp;
    }
    // The barrier's sentinel objects.
    env.config_map(BARRIER_NS, "barrier", &[("n", "0")]).await;
    env.secret(BARRIER_NS, "barrier", &[("n", "0")]).await;
    env.workload(
        BARRIER_NS,
        "Deployment",
        "barrier",
        &[("envFrom", "barrier"), ("secretEnvFrom", "barrier")],
        json!({}),
    )
    .await;
    let setup_objects = secs(setup_start.elapsed());

    let mut dependents: HashMap<(String, ObjectKind, String), Vec<usize>> = HashMap::new();
    let mut ref_stats: BTreeMap<&'static str, usize> = BTreeMap::new();
    for (i, w) in workloads.iter().enumerate() {
        for (r, spec) in w.refs.iter() {
            dependents
                .entry(object_key(&w.ns, r.kind, &r.name))
                .or_default()
                .push(i);
            *ref_stats
                .entry(match (&spec.selection, spec.optional) {
                    (_, true) => "optional",
                    (Selection::Whole, false) => "whole object",
                    (Selection::Keys(_), false) => "key-level",
                })
                .or_default() += 1;
        }
        if w.refs.is_empty() {
            *ref_stats.entry("workloads without references").or_default() += 1;
        }
    }
    // Objects of the pool (the optional references to objects that never exist are left out).
    let pool_dependents = |o: &PoolObject| {
        dependents
            .get(&object_key(&o.ns, o.kind, &o.name))
            .map_or(0, Vec::len)
    };
    let shared_objects = pool.iter().filter(|o| pool_dependents(o) > 1).count();
    let most_shared = pool.iter().map(pool_dependents).max().unwrap_or(0);

    let mut env = env;
    let api = Arc::new(env.api.take().ok_or("no stand-in")?);
    let rollouts = Arc::new(Mutex::new(vec![Vec::new(); workloads.len()]));
    let mut run = Run {
        env,
        api,
        rollouts,
        key,
        size,
        config,
        pool,
        workloads,
        dependents,
        changes: BTreeMap::new(),
        effective: Vec::new(),
        faults: FaultLog::default(),
        replicas: Vec::new(),
        leader_handles: Arc::new(Mutex::new(Vec::new())),
        leader_log: Arc::new(Mutex::new(LeaderLog::default())),
        start: Instant::now(),
        barrier_n: 0,
    };
    let mut violations: Vec<String> = Vec::new();
    for w in &run.workloads {
        if w.created_stamp.as_deref() != Some(w.initial.as_str()) {
            violations.push(format!(
                "{} {}/{}: stamped {:?} at CREATE, the recipe gives {}",
                w.kind.as_str(),
                w.ns,
                w.name,
                w.created_stamp,
                w.initial
            ));
        }
    }
    println!(
        "setup: {} workloads ({}), {} ConfigMaps and Secrets in {} namespaces, created in {:.1} s",
        run.workloads.len(),
        Kind::ALL
            .iter()
            .map(|k| format!(
                "{} {}",
                run.workloads.iter().filter(|w| w.kind == *k).count(),
                k.as_str()
            ))
            .collect::<Vec<_>>()
            .join(", "),
        run.pool.len(),
        OPTED_IN,
        setup_objects
    );

    // The replicas.
    for id in ["replica-a", "replica-b"] {
        let r = Replica::start(&run.env, id);
        run.leader_handles
            .lock()
            .expect("lock")
            .push((r.identity.clone(), r.leadership.clone()));
        run.replicas.push(r);
    }
    let sync_start = Instant::now();
    run.wait_synced().await?;
    run.barrier().await?;
    println!(
        "replicas synced, a leader elected and a barrier passed in {:.1} s",
        secs(sync_start.elapsed())
    );
    let api_rollouts = |run: &Run, w: &Workload| run.api.rollouts(&w.ns, w.kind.as_str(), &w.name);
    let setup_rolled: Vec<usize> = (0..run.workloads.len())
        .filter(|&i| api_rollouts(&run, &run.workloads[i]) > 0)
        .collect();
    for &i in &setup_rolled {
        let w = &run.workloads[i];
        violations.push(format!(
            "{} {}/{}: rolled {} time(s) before any change",
            w.kind.as_str(),
            w.ns,
            w.name,
            api_rollouts(&run, w)
        ));
    }

    // The schedule.
    let duration = run.size.duration;
    let mut times = Vec::with_capacity(run.size.changes);
    let mut t = 0.0;
    for _ in 0..run.size.changes {
        // Bursts (several writes of one sync) and pauses.
        t += if rng.random_bool(0.25) {
            rng.random::<f64>() * 0.003
        } else {
            rng.random::<f64>() * 2.0
        };
        times.push(t);
    }
    let scale = secs(duration) * 0.97 / t.max(f64::MIN_POSITIVE);
    enum Step {
        Change(usize),
        Fault(Fault),
    }
    let skip: Vec<String> = std::env::var("CONFIGHASH_FAULT_SKIP")
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().to_owned())
        .chain(run.size.skip.iter().map(|s| s.to_string()))
        .filter(|s| !s.is_empty())
        .collect();
    if !skip.is_empty() {
        println!(
            "NOTE: faults left out (CONFIGHASH_FAULT_SKIP, or the smoke run): {}",
            skip.join(", ")
        );
    }
    let mut steps: Vec<(f64, Step)> = times
        .into_iter()
        .enumerate()
        .map(|(i, t)| (t * scale, Step::Change(i)))
        .chain(
            FAULTS
                .iter()
                .map(|(f, fault)| (f * secs(duration), *fault))
                .chain(
                    FAULTS
                        .iter()
                        .filter(|(_, fault)| matches!(fault, Fault::WebhookDown))
                        .map(|(f, _)| {
                            (
                                f * secs(duration) - secs(PATCH_429_LEAD),
                                Fault::Patch429BeforeOutage,
                            )
                        }),
                )
                .filter(|(_, fault)| !skip.iter().any(|s| *s == format!("{fault:?}")))
                .map(|(t, fault)| (t, Step::Fault(fault))),
        )
        .collect();
    steps.sort_by(|a, b| a.0.total_cmp(&b.0));

    println!(
        "changes: {} over {:.0} s, change window {} ms",
        run.size.changes,
        secs(duration),
        WINDOW.as_millis()
    );
    run.start = Instant::now();
    tracing::info!(target: "fault_run", "changes start");
    // The leader log's clock starts with the changes too.
    let leader_watch = watch_leaders(
        run.leader_handles.clone(),
        run.leader_log.clone(),
        run.start,
    );
    let observer = observe_rollouts(
        run.api.clone(),
        run.workloads
            .iter()
            .map(|w| (w.ns.clone(), w.kind, w.name.clone()))
            .collect(),
        run.rollouts.clone(),
        run.start,
    );
    let mut late = 0.0f64;
    for (at, step) in steps {
        let due = run.start + Duration::from_secs_f64(at);
        // Pacing of the generated load, not waiting for a condition.
        tokio::time::sleep_until(due.into()).await;
        late = late.max(secs(Instant::now().saturating_duration_since(due)));
        match step {
            Step::Change(n) => run.change(&mut rng, n).await?,
            Step::Fault(f) => run.fault(f).await,
        }
    }
    let change_phase = run.now();
    println!(
        "changes done in {change_phase:.1} s (at most {:.0} ms behind schedule)",
        late * 1e3
    );
    for e in &run.faults.events {
        println!("  fault at {e}");
    }

    // Quiescence: every stamp equals its expected stamp.
    let quiesce_start = Instant::now();
    let mut mismatched;
    loop {
        let observed = read_back(&run.env, &run.key, &namespaces).await?;
        mismatched = run
            .workloads
            .iter()
            .filter(|w| {
                observed
                    .get(&(w.ns.clone(), w.kind, w.name.clone()))
                    .is_none_or(|o| o.expected.as_ref().ok() != o.stamp.as_ref())
            })
            .count();
        if mismatched == 0 || quiesce_start.elapsed() > QUIESCENCE_DEADLINE {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    let quiesced = secs(quiesce_start.elapsed());
    if mismatched > 0 {
        println!(
            "NOT QUIESCENT: {mismatched} stamps still differ from their expected stamps after {quiesced:.0} s"
        );
    } else {
        println!("every stamp matched its expected stamp {quiesced:.2} s after the last change");
    }
    // Barriers: everything the replicas were going to do about the changes is done; a second
    // one shows nothing rolls any more.
    run.wait_synced().await?;
    run.barrier().await?;
    let rollouts_now: Vec<u64> = run
        .workloads
        .iter()
        .map(|w| api_rollouts(&run, w))
        .collect();
    run.barrier().await?;
    let observed = read_back(&run.env, &run.key, &namespaces).await?;
    // The touches that took, per workload: each records one ConfigChanged Event (repeats of one
    // Event are counted in its series).
    let mut took: Vec<u64> = Vec::with_capacity(run.workloads.len());
    for w in &run.workloads {
        let events = run
            .env
            .recorded_events(&w.ns, &w.name, "ConfigChanged")
            .await;
        took.push(
            events
                .iter()
                .map(|e| {
                    e.series
                        .as_ref()
                        .map_or(1, |s| u64::try_from(s.count).unwrap_or(1))
                })
                .sum(),
        );
    }
    leader_watch.abort();
    observer.abort();
    let seen_rollouts = run.rollouts.lock().expect("lock").clone();

    // The checks.
    let mut should_roll = 0;
    let mut rolled = 0;
    let mut rolled_should = 0;
    let mut total_rollouts = 0;
    let mut total_allowed = 0;
    let mut max_rollouts = (0u64, 0usize);
    let mut max_allowed = 0usize;
    let mut tightest: Option<(u64, usize, String)> = None;
    let mut stamp_mismatches = 0;
    let mut model_mismatches = 0;
    let mut changed_inputs = 0;
    let mut out_of_order = 0;
    let mut rolled_nothing: Vec<String> = Vec::new();
    for (i, w) in run.workloads.iter().enumerate() {
        let id = format!("{} {}/{}", w.kind.as_str(), w.ns, w.name);
        let rolls = &seen_rollouts[i];
        let n = api_rollouts(&run, w);
        // A touch that took stored a new stamp, so it rolled (a touch in flight when its replica
        // was killed may have rolled with no Event: rollouts may exceed touches, never the
        // reverse).
        if took[i] > n {
            rolled_nothing.push(format!("{id} {} of {}", took[i] - n, took[i]));
            violations.push(format!(
                "{id}: {} touches took (ConfigChanged Events) but it rolled {n} times: a touch \
                 that rolled nothing ({})",
                took[i],
                timeline(w, rolls)
            ));
        }
        if n != rollouts_now[i] {
            violations.push(format!(
                "{id}: still rolling after quiescence ({} then {n})",
                rollouts_now[i]
            ));
        }
        let allowed = allowed_rollouts(&w.points);
        let obs = observed.get(&(w.ns.clone(), w.kind, w.name.clone()));
        let (stamp, expected) = match obs {
            Some(o) => (o.stamp.clone(), o.expected.clone()),
            None => (None, Err("not found".to_owned())),
        };
        match &expected {
            Ok(e) if stamp.as_ref() == Some(e) => {}
            Ok(e) => {
                stamp_mismatches += 1;
                violations.push(format!(
                    "{id}: stamp {} but expected {} ({})",
                    stamp.as_deref().map(short).unwrap_or("(none)"),
                    short(e),
                    timeline(w, rolls)
                ));
            }
            Err(why) => {
                stamp_mismatches += 1;
                violations.push(format!("{id}: no expected stamp: {why}"));
            }
        }
        if let Ok(e) = &expected
            && *e != w.decided
        {
            model_mismatches += 1;
            violations.push(format!(
                "{id}: bench model says {} but the read-back objects give {} (a bug in this bench)",
                short(&w.decided),
                short(e)
            ));
        }
        if !w.points.is_empty() {
            changed_inputs += 1;
        }
        let must = expected.as_ref().is_ok_and(|e| *e != w.initial);
        if must {
            should_roll += 1;
            if n > 0 {
                rolled_should += 1;
            } else {
                violations.push(format!(
                    "{id}: its config changed but it never rolled ({})",
                    timeline(w, rolls)
                ));
            }
        }
        if n > 0 {
            rolled += 1;
        }
        if n as usize > allowed {
            violations.push(format!(
                "{id}: rolled {n} times, at most {allowed} allowed ({})",
                timeline(w, rolls)
            ));
        }
        // Each rollout must land on a stamp the workload's config really had, later than the
        // one it had: never an older config, never a mix that never existed.
        let mut at = 0;
        for r in rolls {
            let Some(s) = &r.stamp else { continue };
            match w.stamps.iter().rposition(|x| x == s) {
                None => {
                    out_of_order += 1;
                    violations.push(format!(
                        "{id}: rolled at {:.3} s to {}, a stamp its config never had ({})",
                        r.at,
                        short(s),
                        timeline(w, rolls)
                    ));
                }
                Some(k) if k <= at => {
                    out_of_order += 1;
                    violations.push(format!(
                        "{id}: rolled at {:.3} s to {}, not a newer config than its previous stamp ({})",
                        r.at,
                        short(s),
                        timeline(w, rolls)
                    ));
                    at = k;
                }
                Some(k) => at = k,
            }
        }
        total_rollouts += n;
        total_allowed += allowed;
        if n > max_rollouts.0 || (n == max_rollouts.0 && allowed < max_rollouts.1) {
            max_rollouts = (n, allowed);
        }
        max_allowed = max_allowed.max(allowed);
        if n > 0 {
            let closer = match &tightest {
                None => true,
                Some((tn, ta, _)) => (allowed as f64 / n as f64) < (*ta as f64 / *tn as f64),
            };
            if closer {
                tightest = Some((n, allowed, id.clone()));
            }
        }
    }

    // Figures.
    let replicas_metrics: Vec<Arc<Metrics>> =
        run.replicas.iter().map(|r| r.metrics.clone()).collect();
    let touches = |outcome: &'static str| -> u64 {
        replicas_metrics.iter().map(|m| m.touches(outcome)).sum()
    };
    let metric_sum = |name: &str| -> f64 {
        replicas_metrics
            .iter()
            .map(|m| counter(&m.encode(), name))
            .sum()
    };
    let log = run.api.requests();
    let hits = run.faults.hits(&log);
    let mut armed_summary: BTreeMap<String, (u32, u32)> = BTreeMap::new();
    for (a, h) in run.faults.armed.iter().zip(&hits) {
        let e = armed_summary
            .entry(format!("{} {}", a.verb, a.resource))
            .or_default();
        e.0 += a.count;
        e.1 += h;
    }
    let leader_log = run.leader_log.lock().expect("lock");
    let takeover = run.faults.leader_kill.as_ref().and_then(|(t, id)| {
        leader_log
            .transitions
            .iter()
            .find(|(at, who)| *at >= *t && who.as_ref().is_some_and(|w| w != id))
            .map(|(at, who)| (at - t, who.clone().unwrap_or_default()))
    });
    let leader_changes = leader_log
        .transitions
        .iter()
        .filter(|(_, who)| who.is_some())
        .count()
        .saturating_sub(1);
    if leader_log.overlaps > 0 {
        violations.push(format!(
            "two replicas led at once in {} polls (10 ms apart)",
            leader_log.overlaps
        ));
    }
    let transitions: Vec<String> = leader_log
        .transitions
        .iter()
        .map(|(t, who)| format!("{t:.2} s: {}", who.as_deref().unwrap_or("none")))
        .collect();
    drop(leader_log);
    let changes_total: u32 = run.changes.values().sum();
    let total_time = secs(total_start.elapsed());

    println!();
    println!("leadership: {}", transitions.join("; "));
    println!();
    println!(
        "### Fault run ({} workloads, {} changes, seed {seed})",
        run.workloads.len(),
        changes_total
    );
    println!();
    println!("| Measure | Value |");
    println!("|---|---|");
    println!(
        "| workloads | {} in {} opted-in namespaces: {} |",
        run.workloads.len(),
        OPTED_IN,
        Kind::ALL
            .iter()
            .map(|k| format!(
                "{} {}s",
                run.workloads.iter().filter(|w| w.kind == *k).count(),
                k.as_str()
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "| config objects | {} ConfigMaps and Secrets ({} referenced by more than one workload, the most by {}), plus {} optional references to objects that never exist |",
        run.pool.len(),
        shared_objects,
        most_shared,
        run.workloads
            .iter()
            .flat_map(|w| w.refs.iter())
            .filter(|(r, _)| r.name.starts_with("opt-missing"))
            .count()
    );
    println!(
        "| references | {} |",
        ref_stats
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "| config changes | {changes_total} over {change_phase:.1} s: {} |",
        run.changes
            .iter()
            .map(|(k, v)| format!("{} {v}", k.describe()))
            .collect::<Vec<_>>()
            .join("; ")
    );
    println!(
        "| writes that changed some workload's expected stamp | {} |",
        run.effective.len()
    );
    println!(
        "| change window | {} ms; about {} windows opened by those writes |",
        WINDOW.as_millis(),
        windows_estimate(&run.effective)
    );
    println!(
        "| faults: watch drops | {} (every open watch ended) |",
        run.faults.watch_drops
    );
    println!(
        "| faults: compactions (410 Gone for watches resuming from before) | {} |",
        run.faults.compactions
    );
    println!(
        "| faults: 429 with Retry-After (armed / hit) | {} |",
        armed_summary
            .iter()
            .map(|(k, (a, h))| format!("{k} {a}/{h}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "| faults: webhook outage | {} ({:.1} s in all, failurePolicy Ignore) |",
        run.faults.webhook_outages, run.faults.webhook_outage
    );
    println!(
        "| faults: leader change | {} ({}); leader transitions seen {} |",
        u32::from(run.faults.leader_kill.is_some()),
        match (&run.faults.leader_kill, &takeover) {
            (Some((_, id)), Some((after, who))) =>
                format!("{id} killed, {who} led {after:.2} s later"),
            (Some((_, id)), None) => format!("{id} killed, no takeover seen"),
            _ => "none".to_owned(),
        },
        leader_changes
    );
    println!(
        "| touches (all replicas, the barriers' included) | touched {}, kept by the webhook {}, stale (nothing written: the workload had changed) {}, failed {}, gone {}; retries {}; re-queued by the token bucket's burst of 20 {} (for nanoseconds at this rate; kube's client retries a 429 after its Retry-After, so 429s show as delays, not failures) |",
        touches("touched"),
        touches("kept-by-webhook"),
        touches("stale"),
        touches("error"),
        touches("gone"),
        metric_sum("confighash_touch_retries_total"),
        metric_sum("confighash_touches_rate_limited_total")
    );
    // Per workload: its touches that took (ConfigChanged Events) beyond its rollouts. The
    // barrier's workloads are not among them (each barrier rolls its own Deployment).
    println!(
        "| touches that took but rolled nothing (per workload) | {} ({}) |",
        rolled_nothing.len(),
        if rolled_nothing.is_empty() {
            "none".to_owned()
        } else {
            rolled_nothing.join(", ")
        }
    );
    println!(
        "| touches that took, all workloads | {} ConfigChanged Events; the scenario's workloads rolled {} times |",
        took.iter().sum::<u64>(),
        total_rollouts
    );
    println!("| workloads whose inputs changed | {changed_inputs} |");
    println!(
        "| workloads that should roll (expected stamp differs from the first) | {should_roll} |"
    );
    println!(
        "| rolled | {rolled} ({rolled_should} of those that should; {} that should not) |",
        rolled - rolled_should.min(rolled)
    );
    println!(
        "| rollouts | {total_rollouts} in all, {total_allowed} allowed by the per-workload window bound |"
    );
    println!(
        "| max rollouts per workload vs allowed | {} (allowed {} for that workload); the most any workload was allowed {}; closest to its bound: {} |",
        max_rollouts.0,
        max_rollouts.1,
        max_allowed,
        tightest
            .map(|(n, a, id)| format!("{id} {n} of {a}"))
            .unwrap_or_else(|| "-".to_owned())
    );
    println!("| mismatched stamps | {stamp_mismatches} |");
    println!("| rollouts to a stamp the config never had, or to an older one | {out_of_order} |");
    println!("| bench model mismatches | {model_mismatches} |");
    println!("| violations | {} |", violations.len());
    println!(
        "| time | {total_time:.1} s in all: setup {setup_objects:.1} s, changes {change_phase:.1} s, quiescence {quiesced:.2} s |"
    );
    println!();
    if violations.is_empty() {
        println!("OK: no violations");
    } else {
        println!("VIOLATIONS ({}):", violations.len());
        for v in &violations {
            println!("  {v}");
        }
        println!("seed: CONFIGHASH_FAULT_SEED={seed}");
    }
    for r in &mut run.replicas {
        r.stop();
    }
    Ok(violations.is_empty())
}

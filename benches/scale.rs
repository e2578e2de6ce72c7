//! Big clusters, through the watcher's state machine (`crates/watcher/src/state.rs`) with time
//! simulated: what the decisions cost and in what order touches go, without an API server.
//!
//! - **Reconcile at 150,000 objects**: 500 opted-in namespaces holding 100,000 Secrets of 4 KiB
//!   (a tenth of them typed: ServiceAccount tokens and Helm release records), 50,000 ConfigMaps
//!   and 20,000 workloads of every kind (each referencing two ConfigMaps and a Secret), all
//!   stamped as the webhook stamps them. After the initial sync the state's periodic reconcile
//!   (`--resync`) runs over the 20,000 with nothing changed: it must ask for 0 touches. Its CPU
//!   time is given beside the least any reconcile must do, the expected stamp of every workload
//!   computed from the same store, measured the same way in the same run.
//! - **A ConfigMap used by 2,000 workloads** (`ca-bundle` in namespace `wave`) changes, with the
//!   default pace (5 touches/s, burst 20, `--debounce 5s`). 100 s into the wave, `flags`
//!   changes in `wave` (3 workloads) and in `other` (3 workloads). Every touch is answered as
//!   taken at once. Reported: touches per workload (exactly 1 each), the longest gap the bucket
//!   allows and the rate it keeps, `confighash_touch_wave_eta_seconds` when the wave starts, when
//!   the wave ends, and how long after their change window closed `flags`' 6 workloads were
//!   touched (the touches are taken in turns across the changes that armed them).
//!
//! `cargo bench --bench scale`; `cargo test --benches` (no `--bench`) runs it at a hundredth of
//! the objects and the full wave, asserting the same.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use confighash::cluster::watch::Watched;
use confighash::core::checksum::StampKey;
use confighash::core::names::CHECKSUM_ANNOTATION;
use confighash::core::refs::{ObjectKind, ObjectRef};
use confighash::core::rules::Lookup;
use confighash::core::workload::WorkloadKind;
use confighash::metrics::Metrics;
use confighash::watcher::index::{
    ConfigKey, ConfigStore, StoredConfig, WorkloadEntry, WorkloadKey,
};
use confighash::watcher::state::{
    ConfigSource, Effect, Input, NamespaceSeen, State, TouchResult, WatcherConfig,
};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use serde_json::{Value, json};

const KEY: &[u8] = b"scale bench key of 32 bytes!!!!!";

fn key() -> StampKey {
    StampKey::new(KEY.to_vec()).expect("a key")
}

/// CPU time of this thread.
#[allow(unsafe_code)] // a C call: see its SAFETY comment
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn config_map(ns: &str, name: &str, value: &str) -> (ConfigKey, StoredConfig) {
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "resourceVersion": "1"},
        "data": {"config.yaml": value},
    }))
    .expect("a ConfigMap");
    (
        (ns.to_owned(), ObjectRef::new(ObjectKind::ConfigMap, name)),
        StoredConfig::from_config_map(&cm).expect("stored"),
    )
}

fn secret(ns: &str, name: &str, type_: &str, bytes: usize) -> (ConfigKey, StoredConfig) {
    let value = vec![b's'; bytes];
    let s: Secret = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "resourceVersion": "1"},
        "type": type_,
        "data": {"value": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, value)},
    }))
    .expect("a Secret");
    (
        (ns.to_owned(), ObjectRef::new(ObjectKind::Secret, name)),
        StoredConfig::from_secret(&s),
    )
}

/// A workload of `kind` using ConfigMaps and Secrets through `envFrom`, stamped with `stamp`.
fn workload(
    kind: WorkloadKind,
    ns: &str,
    name: &str,
    uses: &[(&str, &str)],
    stamp: Option<&str>,
) -> Value {
    let env_from: Vec<Value> = uses
        .iter()
        .map(|(how, n)| match *how {
            "configMap" => json!({"configMapRef": {"name": n}}),
            _ => json!({"secretRef": {"name": n}}),
        })
        .collect();
    let mut annotations = json!({});
    if let Some(stamp) = stamp {
        annotations[CHECKSUM_ANNOTATION] = json!(stamp);
    }
    let pod = json!({
        "metadata": {"labels": {"app": name}, "annotations": annotations},
        "spec": {"containers": [{"name": "app", "image": "registry.invalid/app", "envFrom": env_from}]},
    });
    let mut obj = json!({
        "apiVersion": if kind == WorkloadKind::CRON_JOB { "batch/v1" } else { "apps/v1" },
        "kind": kind.kind(),
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{ns}-{name}"),
                     "resourceVersion": "1", "generation": 1},
    });
    match kind {
        WorkloadKind::CRON_JOB => {
            obj["spec"] =
                json!({"schedule": "* * * * *", "jobTemplate": {"spec": {"template": pod}}});
        }
        _ => obj["spec"] = json!({"selector": {"matchLabels": {"app": name}}, "template": pod}),
    }
    obj
}

/// The simulated watcher: its state, the store it is fed from, and the time origin.
struct Sim {
    state: State,
    metrics: Arc<Metrics>,
    store: ConfigStore,
    t0: Instant,
}

impl Sim {
    fn new(config: WatcherConfig) -> Sim {
        let metrics = Arc::new(Metrics::new());
        let mut state = State::new(
            config,
            Arc::new(key()),
            metrics.clone(),
            SystemTime::UNIX_EPOCH,
        );
        let t0 = Instant::now();
        state.handle(Input::Leader(true), t0);
        Sim {
            state,
            metrics,
            store: ConfigStore::default(),
            t0,
        }
    }

    fn at(&self, seconds: f64) -> Instant {
        self.t0 + Duration::from_secs_f64(seconds)
    }

    /// Hands `input` to the state; reads afresh it asks for are answered from the store.
    fn feed(&mut self, seconds: f64, input: Input) -> Vec<Effect> {
        let now = self.at(seconds);
        let mut out = Vec::new();
        for effect in self.state.handle(input, now) {
            match effect {
                Effect::Recheck { workload, configs } => {
                    let read = configs
                        .into_iter()
                        .map(|k| {
                            let stored = self.store.get(&k);
                            (k, stored)
                        })
                        .collect();
                    out.extend(self.feed(seconds, Input::Rechecked(workload, Ok(read))));
                }
                other => out.push(other),
            }
        }
        out
    }

    fn config(&mut self, seconds: f64, (key, stored): (ConfigKey, StoredConfig)) -> Vec<Effect> {
        self.store.upsert(key.clone(), stored.clone());
        let source = ConfigSource::Watch(key.1.kind);
        self.feed(
            seconds,
            Input::Config(source, Watched::Applied(key, Some(stored))),
        )
    }

    /// The stamp a workload using `uses` in `ns` should carry now.
    fn expected(&self, ns: &str, kind: WorkloadKind, uses: &[(&str, &str)]) -> String {
        let entry = entry(kind, &workload(kind, ns, "x", uses, None));
        match self.store.lookup(&key(), ns, &entry.refs, false, u64::MAX) {
            Lookup::Resolved { expected, .. } => expected.to_string(),
            other => panic!("{other:?}"),
        }
    }

    /// Lists everything at time 0: the namespaces (opted in), the objects, the workloads.
    fn sync(
        &mut self,
        namespaces: &[String],
        configs: Vec<(ConfigKey, StoredConfig)>,
        workloads: Vec<(WorkloadKey, WorkloadKind, WorkloadEntry)>,
    ) {
        for name in namespaces {
            let seen = NamespaceSeen {
                opted_in: true,
                terminating: false,
                at: SystemTime::UNIX_EPOCH,
            };
            self.feed(0.0, Input::Namespace(Watched::Applied(name.clone(), seen)));
        }
        let names = namespaces.iter().cloned().collect();
        self.feed(0.0, Input::Namespace(Watched::Relisted(names)));
        for kind in [ObjectKind::ConfigMap, ObjectKind::Secret] {
            let mut listed = HashSet::new();
            for (k, stored) in configs.iter().filter(|(k, _)| k.1.kind == kind) {
                listed.insert(k.clone());
                self.config(0.0, (k.clone(), stored.clone()));
            }
            self.feed(
                0.0,
                Input::Config(ConfigSource::Watch(kind), Watched::Relisted(listed)),
            );
        }
        for kind in WorkloadKind::BUILT_IN {
            let mut listed = HashSet::new();
            for (k, _, e) in workloads.iter().filter(|(_, wk, _)| *wk == kind) {
                listed.insert(k.clone());
                self.feed(
                    0.0,
                    Input::Workload(kind, Watched::Applied(k.clone(), Some(e.clone()))),
                );
            }
            self.feed(0.0, Input::Workload(kind, Watched::Relisted(listed)));
        }
        assert!(self.state.is_synced(), "synced after every list");
    }

    fn gauge(&self, name: &str) -> f64 {
        self.metrics
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(f64::NAN)
    }
}

fn entry(kind: WorkloadKind, obj: &Value) -> WorkloadEntry {
    WorkloadEntry::from_object(kind, obj)
        .expect("a workload")
        .expect("stamped by confighash")
}

fn workload_key(kind: WorkloadKind, ns: &str, name: &str) -> WorkloadKey {
    WorkloadKey {
        kind: kind.into(),
        namespace: ns.to_owned(),
        name: name.to_owned(),
    }
}

// ---------------------------------------------------------------------------------------------

struct ReconcileFigures {
    objects: usize,
    workloads: usize,
    load: Duration,
    touches_after_sync: usize,
    touches_at_resync: usize,
    reconcile_cpu: Duration,
    baseline_cpu: Duration,
}

/// 150,000 objects at `scale` 1.
fn reconcile(scale: f64) -> ReconcileFigures {
    let namespaces = ((500.0 * scale).round() as usize).max(2);
    let n = |full: usize| (full / 500).max(1);
    let (secrets, config_maps, workloads) = (n(100_000), n(50_000), n(20_000));
    let started = Instant::now();
    let mut sim = Sim::new(WatcherConfig::default());
    let ns_names: Vec<String> = (0..namespaces).map(|i| format!("ns-{i:03}")).collect();
    let mut configs = Vec::new();
    for ns in &ns_names {
        for i in 0..secrets {
            // A tenth typed: ServiceAccount tokens and Helm release records.
            let type_ = match i % 20 {
                0 => "kubernetes.io/service-account-token",
                1 => "helm.sh/release.v1",
                _ => "Opaque",
            };
            configs.push(secret(ns, &format!("secret-{i:03}"), type_, 4096));
        }
        for i in 0..config_maps {
            configs.push(config_map(
                ns,
                &format!("config-{i:03}"),
                &format!("value {ns} {i}"),
            ));
        }
    }
    for (k, v) in &configs {
        sim.store.upsert(k.clone(), v.clone());
    }
    let kinds = [
        WorkloadKind::DEPLOYMENT,
        WorkloadKind::STATEFUL_SET,
        WorkloadKind::DAEMON_SET,
        WorkloadKind::CRON_JOB,
    ];
    let mut listed = Vec::new();
    for ns in &ns_names {
        for i in 0..workloads {
            let kind = kinds[i % kinds.len()];
            let uses = [
                ("configMap", format!("config-{:03}", i % config_maps)),
                ("configMap", format!("config-{:03}", (i + 1) % config_maps)),
                ("secret", format!("secret-{:03}", i % secrets)),
            ];
            let uses: Vec<(&str, &str)> = uses.iter().map(|(h, n)| (*h, n.as_str())).collect();
            let stamp = sim.expected(ns, kind, &uses);
            let name = format!("app-{i:03}");
            let obj = workload(kind, ns, &name, &uses, Some(&stamp));
            listed.push((workload_key(kind, ns, &name), kind, entry(kind, &obj)));
        }
    }
    let objects = configs.len();
    let total_workloads = listed.len();
    sim.sync(&ns_names, configs, listed.clone());
    // The first tick after the sync reconciles once.
    let touches = |effects: &[Effect]| {
        effects
            .iter()
            .filter(|e| matches!(e, Effect::Touch(_)))
            .count()
    };
    let touches_after_sync = touches(&sim.feed(0.0, Input::Wake));
    let load = started.elapsed();

    // The periodic reconcile, nothing changed.
    let resync = WatcherConfig::default().resync.as_secs_f64();
    let cpu = thread_cpu();
    let effects = sim.feed(resync, Input::Wake);
    let reconcile_cpu = thread_cpu() - cpu;
    let touches_at_resync = touches(&effects);

    // The least a reconcile does: every workload's expected stamp from the same store.
    let cpu = thread_cpu();
    let mut stamps = 0usize;
    for (k, _, e) in &listed {
        if let Lookup::Resolved { .. } =
            sim.store
                .lookup(&key(), &k.namespace, &e.refs, false, u64::MAX)
        {
            stamps += 1;
        }
    }
    let baseline_cpu = thread_cpu() - cpu;
    assert_eq!(stamps, total_workloads);
    ReconcileFigures {
        objects,
        workloads: total_workloads,
        load,
        touches_after_sync,
        touches_at_resync,
        reconcile_cpu,
        baseline_cpu,
    }
}

// ---------------------------------------------------------------------------------------------

struct WaveFigures {
    wave: usize,
    touched_once: usize,
    touched_more: usize,
    first_touch: f64,
    last_touch: f64,
    eta_at_start: f64,
    most_in_a_second: usize,
    /// Seconds from the close of `flags`' change window to each of its 6 touches: same
    /// namespace, then the other.
    flags_same: Vec<f64>,
    flags_other: Vec<f64>,
}

fn wave(size: usize) -> WaveFigures {
    let config = WatcherConfig::default();
    let debounce = config.debounce.as_secs_f64();
    let mut sim = Sim::new(config);
    let namespaces = vec!["other".to_owned(), "wave".to_owned()];
    let configs = vec![
        config_map("wave", "ca-bundle", "v1"),
        config_map("wave", "flags", "v1"),
        config_map("other", "flags", "v1"),
    ];
    for (k, v) in &configs {
        sim.store.upsert(k.clone(), v.clone());
    }
    let kind = WorkloadKind::DEPLOYMENT;
    let mut listed = Vec::new();
    let mut uses_of: BTreeMap<WorkloadKey, &'static str> = BTreeMap::new();
    let mut add = |sim: &Sim, ns: &str, name: String, uses: &[(&str, &'static str)]| {
        let stamp = sim.expected(ns, kind, uses);
        let obj = workload(kind, ns, &name, uses, Some(&stamp));
        let key = workload_key(kind, ns, &name);
        uses_of.insert(key.clone(), uses[0].1);
        listed.push((key, kind, entry(kind, &obj)));
    };
    for i in 0..size {
        add(
            &sim,
            "wave",
            format!("web-{i:04}"),
            &[("configMap", "ca-bundle")],
        );
    }
    for i in 0..3 {
        // Names that sort after the wave's, in the same namespace.
        add(
            &sim,
            "wave",
            format!("zz-flags-{i}"),
            &[("configMap", "flags")],
        );
        add(
            &sim,
            "other",
            format!("flags-{i}"),
            &[("configMap", "flags")],
        );
    }
    sim.sync(&namespaces, configs, listed);
    sim.feed(0.0, Input::Wake);

    let changed_at = 1.0;
    sim.config(changed_at, config_map("wave", "ca-bundle", "v2"));
    let flags_at = 100.0;
    let mut flags_changed = false;
    let mut touches: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut eta_at_start = f64::NAN;
    let mut now = changed_at;
    let mut revision = 1u64;
    // Effects of every input go through here: each touch is recorded, taken at once, and its
    // watch event follows with the new stamp (which may start the next touch).
    let mut queue: std::collections::VecDeque<Effect> = std::collections::VecDeque::new();
    while let Some(next) = sim.state.next_wake() {
        let next = next.duration_since(sim.t0).as_secs_f64();
        if !flags_changed && next >= flags_at {
            now = flags_at;
            queue.extend(sim.config(now, config_map("wave", "flags", "v2")));
            queue.extend(sim.config(now, config_map("other", "flags", "v2")));
            flags_changed = true;
        } else if next > 2_000.0 {
            break;
        } else {
            now = next.max(now);
            queue.extend(sim.feed(now, Input::Wake));
        }
        while let Some(effect) = queue.pop_front() {
            let Effect::Touch(t) = effect else {
                continue;
            };
            let name = format!("{}/{}", t.workload.namespace, t.workload.name);
            touches.entry(name).or_default().push(now);
            if eta_at_start.is_nan() {
                eta_at_start = sim.gauge("confighash_touch_wave_eta_seconds");
            }
            let (key, stamp) = (t.workload, t.stamp);
            let result = TouchResult::Patched(Some(stamp.clone()));
            queue.extend(sim.feed(now, Input::Touched(key.clone(), result)));
            let uses = [("configMap", uses_of[&key])];
            let mut obj = workload(kind, &key.namespace, &key.name, &uses, Some(&stamp));
            revision += 1;
            obj["metadata"]["resourceVersion"] = json!(revision.to_string());
            obj["metadata"]["generation"] = json!(2);
            let watched = Watched::Applied(key, Some(entry(kind, &obj)));
            queue.extend(sim.feed(now, Input::Workload(kind, watched)));
        }
    }
    let wave_times: Vec<f64> = touches
        .iter()
        .filter(|(k, _)| k.starts_with("wave/web-"))
        .flat_map(|(_, t)| t.iter().copied())
        .collect();
    let mut per_second: BTreeMap<i64, usize> = BTreeMap::new();
    for t in &wave_times {
        *per_second.entry(t.floor() as i64).or_default() += 1;
    }
    let window_closed = flags_at + debounce;
    let after = |prefix: &str| -> Vec<f64> {
        touches
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .flat_map(|(_, t)| t.iter().map(|t| t - window_closed))
            .collect()
    };
    WaveFigures {
        wave: size,
        touched_once: touches
            .iter()
            .filter(|(k, t)| k.starts_with("wave/web-") && t.len() == 1)
            .count(),
        touched_more: touches.values().filter(|t| t.len() > 1).count(),
        first_touch: wave_times.iter().copied().fold(f64::INFINITY, f64::min),
        last_touch: wave_times.iter().copied().fold(0.0, f64::max),
        eta_at_start,
        most_in_a_second: per_second
            .iter()
            .filter(|(s, _)| **s as f64 > changed_at + debounce + 1.0)
            .map(|(_, n)| *n)
            .max()
            .unwrap_or(0),
        flags_same: after("wave/zz-flags-"),
        flags_other: after("other/flags-"),
    }
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let scale = if full { 1.0 } else { 0.01 };
    let r = reconcile(scale);
    println!(
        "reconcile: {} objects, {} workloads in {} namespaces loaded into the state in {:.1} s; \
         touches after the sync {}, at the resync {}; the resync's reconcile took {:.3} s of CPU, \
         the expected stamps alone {:.3} s ({:.2}x)",
        r.objects,
        r.workloads,
        ((500.0 * scale).round() as usize).max(2),
        r.load.as_secs_f64(),
        r.touches_after_sync,
        r.touches_at_resync,
        r.reconcile_cpu.as_secs_f64(),
        r.baseline_cpu.as_secs_f64(),
        r.reconcile_cpu.as_secs_f64() / r.baseline_cpu.as_secs_f64().max(1e-9),
    );
    assert_eq!(
        r.touches_after_sync, 0,
        "nothing changed: no touch after the sync"
    );
    assert_eq!(
        r.touches_at_resync, 0,
        "nothing changed: no touch at the resync"
    );
    let w = wave(2_000);
    let summary = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        format!(
            "{:?}",
            v.iter()
                .map(|t| (t * 10.0).round() / 10.0)
                .collect::<Vec<_>>()
        )
    };
    println!(
        "wave: {} workloads of one ConfigMap touched once each: {} (more than once: {}); first \
         touch {:.1} s, last {:.1} s after the change ({:.0} s of wave), at most {} touches in a \
         second after the burst; touch_wave_eta_seconds at the start {}; flags changed 100 s in: \
         touched {} s (same namespace) and {} s (other namespace) after their window closed",
        w.wave,
        w.touched_once,
        w.touched_more,
        w.first_touch - 1.0,
        w.last_touch - 1.0,
        w.last_touch - w.first_touch,
        w.most_in_a_second,
        w.eta_at_start,
        summary(&w.flags_same),
        summary(&w.flags_other),
    );
    assert_eq!(
        w.touched_once, w.wave,
        "every workload of the wave touched exactly once"
    );
    assert_eq!(w.touched_more, 0, "no workload touched twice");
    assert!(
        w.most_in_a_second <= 6,
        "the bucket's 5 a second (one more at a second's edge)"
    );
    assert_eq!(
        w.flags_same.len() + w.flags_other.len(),
        6,
        "flags' six workloads touched"
    );
    for t in w.flags_same.iter().chain(&w.flags_other) {
        assert!(
            *t < 5.0,
            "flags' workloads are not queued behind the wave: {t} s"
        );
    }
}

//! [`State::handle`] under a fake clock: `Instant`s the tests advance by hand, and wall times
//! made up from a fixed start. One test per scenario of the end-to-end tests, each asserting the
//! exact effects; they run in milliseconds.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};

use super::*;
use confighash_core::names::{CHECKSUM_ANNOTATION, ENABLED_LABEL, UNSTAMPED_ANNOTATION};
use confighash_core::names::{ROLLOUT_COMPLETE_REASON, ROLLOUT_STALLED_REASON};
use confighash_core::refs::ObjectRef;
use confighash_core::rules::Lookup;

const NS: &str = "shop";
const WINDOW: Duration = Duration::from_secs(5);

/// When the watcher under test started, on the wall clock.
fn wall0() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

fn config() -> WatcherConfig {
    WatcherConfig {
        debounce: WINDOW,
        resync: Duration::from_secs(600),
        max_touches_per_second: 5.0,
        retry_base: Duration::from_secs(1),
        ..WatcherConfig::default()
    }
}

fn key_a() -> StampKey {
    StampKey::new(b"0123456789abcdef0123456789abcdef".to_vec()).unwrap()
}

fn key_b() -> StampKey {
    StampKey::new(b"fedcba9876543210fedcba9876543210".to_vec()).unwrap()
}

// ----- objects -----

fn config_map(ns: &str, name: &str, data: &[(&str, &str)]) -> (ConfigKey, StoredConfig) {
    config_map_annotated(ns, name, data, json!({}))
}

fn config_map_annotated(
    ns: &str,
    name: &str,
    data: &[(&str, &str)],
    annotations: Value,
) -> (ConfigKey, StoredConfig) {
    let data: BTreeMap<&str, &str> = data.iter().copied().collect();
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "resourceVersion": "1", "annotations": annotations},
        "data": data,
    }))
    .unwrap();
    (
        (
            ns.to_owned(),
            ObjectRef::new(ObjectKind::ConfigMap, name.to_owned()),
        ),
        StoredConfig::from_config_map(&cm).unwrap(),
    )
}

fn secret(ns: &str, name: &str, data: &[(&str, &str)]) -> (ConfigKey, StoredConfig) {
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(ns.to_owned()),
            resource_version: Some("1".to_owned()),
            ..ObjectMeta::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Secret::default()
    };
    (
        (
            ns.to_owned(),
            ObjectRef::new(ObjectKind::Secret, name.to_owned()),
        ),
        StoredConfig::from_secret(&secret),
    )
}

/// A workload as its watch reports it.
#[derive(Debug, Clone)]
struct W {
    kind: WorkloadKind,
    ns: String,
    name: String,
    uid: String,
    /// (how, name): `configMap`, `optionalConfigMap` or `secret` in `envFrom`; `configMapKey`
    /// with `name/key`, one key in `env`.
    uses: Vec<(&'static str, String)>,
    stamp: Option<String>,
    labels: Value,
    annotations: Value,
    on_delete: bool,
    created: Option<SystemTime>,
    /// `metadata.generation`, when set.
    generation: Option<i64>,
}

fn deployment(ns: &str, name: &str, uses: &[(&'static str, &str)]) -> W {
    W {
        kind: WorkloadKind::DEPLOYMENT,
        ns: ns.to_owned(),
        name: name.to_owned(),
        uid: format!("uid-{name}"),
        uses: uses
            .iter()
            .map(|(how, n)| (*how, (*n).to_owned()))
            .collect(),
        stamp: None,
        labels: json!({}),
        annotations: json!({}),
        on_delete: false,
        created: None,
        generation: None,
    }
}

impl W {
    fn stamped(mut self, stamp: &str) -> Self {
        self.stamp = Some(stamp.to_owned());
        self
    }

    fn key(&self) -> WorkloadKey {
        WorkloadKey::new(self.kind, &self.ns, &self.name)
    }

    fn generation(mut self, generation: i64) -> Self {
        self.generation = Some(generation);
        self
    }

    fn object(&self) -> Value {
        let env_from: Vec<Value> = self
            .uses
            .iter()
            .filter(|(how, _)| *how != "configMapKey")
            .map(|(how, name)| match *how {
                "configMap" => json!({"configMapRef": {"name": name}}),
                "optionalConfigMap" => json!({"configMapRef": {"name": name, "optional": true}}),
                "secret" => json!({"secretRef": {"name": name}}),
                other => panic!("unknown use {other}"),
            })
            .collect();
        // `configMapKey`, `name/key`: one key, as an environment variable.
        let env: Vec<Value> = self
            .uses
            .iter()
            .filter(|(how, _)| *how == "configMapKey")
            .enumerate()
            .map(|(i, (_, name))| {
                let (name, key) = name.split_once('/').expect("configMapKey uses name/key");
                json!({"name": format!("V{i}"),
                       "valueFrom": {"configMapKeyRef": {"name": name, "key": key}}})
            })
            .collect();
        let mut template_annotations = json!({});
        if let Some(stamp) = &self.stamp {
            template_annotations[CHECKSUM_ANNOTATION] = json!(stamp);
        }
        let mut obj = json!({
            "apiVersion": "apps/v1",
            "kind": self.kind.kind(),
            "metadata": {
                "name": self.name,
                "namespace": self.ns,
                "uid": self.uid,
                "resourceVersion": "1",
                "labels": self.labels,
                "annotations": self.annotations,
            },
            "spec": {},
        });
        // The pod template where the kind has it (`spec.template`, a CronJob's
        // `spec.jobTemplate.spec.template`).
        let mut template = json!({
            "metadata": {"annotations": template_annotations},
            "spec": {"containers": [{"name": "app", "image": "app", "envFrom": env_from,
                                     "env": env}]},
        });
        for token in self.kind.template_path().iter().skip(1).rev() {
            template = json!({ *token: template });
        }
        obj["spec"] = template;
        if self.on_delete {
            obj["spec"]["updateStrategy"] = json!({"type": "OnDelete"});
        }
        if let Some(generation) = self.generation {
            obj["metadata"]["generation"] = json!(generation);
        }
        if let Some(created) = self.created {
            let seconds = unix_seconds(created);
            obj["metadata"]["creationTimestamp"] = json!(
                k8s_openapi::jiff::Timestamp::from_second(seconds)
                    .unwrap()
                    .to_string()
            );
        }
        obj
    }

    fn entry(&self, max_references: usize) -> Option<WorkloadEntry> {
        WorkloadEntry::from_object(self.kind, &self.object())
            .unwrap()
            .map(|e| e.limit_references(max_references))
    }
}

// ----- the test bench -----

struct Test {
    state: State,
    metrics: Arc<Metrics>,
    key: Arc<StampKey>,
    max_references: usize,
    /// The kinds watched (`WatcherConfig::kinds`): each lists at the start.
    kinds: Kinds,
    t0: Instant,
    /// The ConfigMaps and Secrets as the cluster has them, for the stamps the tests expect.
    cluster: BTreeMap<ConfigKey, StoredConfig>,
}

impl Test {
    /// A replica that leads (as with `--leader-elect=false`), nothing listed yet.
    fn leader(config: WatcherConfig) -> Self {
        let mut t = Test::follower(config);
        assert_eq!(t.feed(0.0, Input::Leader(true)), []);
        t
    }

    /// A replica that does not lead.
    fn follower(config: WatcherConfig) -> Self {
        let metrics = Arc::new(Metrics::new());
        let key = Arc::new(key_a());
        let max_references = config.max_references;
        let kinds = config.kinds.clone();
        Test {
            state: State::new(config, key.clone(), metrics.clone(), wall0()),
            metrics,
            key,
            max_references,
            kinds,
            t0: Instant::now(),
            cluster: BTreeMap::new(),
        }
    }

    fn at(&self, seconds: f64) -> Instant {
        self.t0 + Duration::from_secs_f64(seconds)
    }

    /// Hands `input` to the state at `seconds`. A read afresh it asks for ([`Effect::Recheck`])
    /// is answered at once from [`Test::cluster`], as the API server would, and what that
    /// answer brings takes its place; [`Test::feed_raw`] shows the read itself.
    fn feed(&mut self, seconds: f64, input: Input) -> Vec<Effect> {
        let mut effects = Vec::new();
        for effect in self.feed_raw(seconds, input) {
            match effect {
                Effect::Recheck { workload, configs } => {
                    let read = configs
                        .into_iter()
                        .map(|k| {
                            let stored = self.cluster.get(&k).cloned();
                            (k, stored)
                        })
                        .collect();
                    effects.extend(self.feed(seconds, Input::Rechecked(workload, Ok(read))));
                }
                other => effects.push(other),
            }
        }
        effects
    }

    /// Hands `input` to the state at `seconds`, and returns what it asks for as it is.
    fn feed_raw(&mut self, seconds: f64, input: Input) -> Vec<Effect> {
        let now = self.at(seconds);
        self.state.handle(input, now)
    }

    fn wake(&mut self, seconds: f64) -> Vec<Effect> {
        self.feed(seconds, Input::Wake)
    }

    /// Seconds from the start to the next wake-up.
    fn next_wake(&self) -> Option<f64> {
        self.state
            .next_wake()
            .map(|t| t.duration_since(self.t0).as_secs_f64())
    }

    /// Every watch lists at time 0: these namespaces (name, opted in), ConfigMaps and Secrets,
    /// and workloads. The effects of the whole list, reconcile at the end of it included.
    fn start(
        &mut self,
        namespaces: &[(&str, bool)],
        configs: &[(ConfigKey, StoredConfig)],
        workloads: &[&W],
    ) -> Vec<Effect> {
        let mut effects = Vec::new();
        for (name, opted_in) in namespaces {
            effects.extend(self.namespace(0.0, name, *opted_in));
        }
        let names = namespaces.iter().map(|(n, _)| (*n).to_owned()).collect();
        effects.extend(self.feed(0.0, Input::Namespace(Watched::Relisted(names))));
        for kind in [ObjectKind::ConfigMap, ObjectKind::Secret] {
            let mut listed = HashSet::new();
            for (key, stored) in configs.iter().filter(|(k, _)| k.1.kind == kind) {
                listed.insert(key.clone());
                effects.extend(self.config(0.0, (key.clone(), stored.clone())));
            }
            let relisted = Watched::Relisted(listed);
            effects.extend(self.feed(0.0, Input::Config(ConfigSource::Watch(kind), relisted)));
        }
        for kind in self.kinds.clone().iter() {
            let mut listed = HashSet::new();
            for w in workloads.iter().filter(|w| w.kind == kind) {
                listed.insert(w.key());
                effects.extend(self.workload(0.0, w));
            }
            let relisted = Watched::Relisted(listed);
            effects.extend(self.feed(0.0, Input::Workload(kind, relisted)));
        }
        assert!(self.state.is_synced());
        effects
    }

    fn namespace(&mut self, seconds: f64, name: &str, opted_in: bool) -> Vec<Effect> {
        self.namespace_seen(seconds, name, opted_in, false)
    }

    /// A namespace is being deleted: its Namespace gets a deletionTimestamp, labels kept.
    fn terminate(&mut self, seconds: f64, name: &str, opted_in: bool) -> Vec<Effect> {
        self.namespace_seen(seconds, name, opted_in, true)
    }

    fn namespace_seen(
        &mut self,
        seconds: f64,
        name: &str,
        opted_in: bool,
        terminating: bool,
    ) -> Vec<Effect> {
        let at = wall0() + Duration::from_secs_f64(seconds);
        let seen = NamespaceSeen {
            opted_in,
            terminating,
            at,
        };
        self.feed(
            seconds,
            Input::Namespace(Watched::Applied(name.to_owned(), seen)),
        )
    }

    /// A ConfigMap or Secret is written, and its watch reports it.
    fn config(&mut self, seconds: f64, (key, stored): (ConfigKey, StoredConfig)) -> Vec<Effect> {
        self.cluster.insert(key.clone(), stored.clone());
        let source = ConfigSource::Watch(key.1.kind);
        self.feed(
            seconds,
            Input::Config(source, Watched::Applied(key, Some(stored))),
        )
    }

    fn delete_config(&mut self, seconds: f64, key: &ConfigKey) -> Vec<Effect> {
        self.cluster.remove(key);
        let source = ConfigSource::Watch(key.1.kind);
        self.feed(
            seconds,
            Input::Config(source, Watched::Deleted(key.clone())),
        )
    }

    fn workload(&mut self, seconds: f64, w: &W) -> Vec<Effect> {
        let entry = w.entry(self.max_references);
        self.feed(
            seconds,
            Input::Workload(w.kind, Watched::Applied(w.key(), entry)),
        )
    }

    fn touched(&mut self, seconds: f64, w: &W, result: TouchResult) -> Vec<Effect> {
        self.feed(seconds, Input::Touched(w.key(), result))
    }

    /// The stamp `w` should carry now, by the cluster's config and the current key.
    fn expected(&self, w: &W) -> String {
        let mut store = ConfigStore::default();
        for (k, s) in &self.cluster {
            store.upsert(k.clone(), s.clone());
        }
        let entry = w.entry(usize::MAX).unwrap();
        match store.lookup(&self.key, &w.ns, &entry.refs, false, u64::MAX) {
            Lookup::Resolved { expected, .. } => expected.into(),
            Lookup::Failed | Lookup::TooLarge { .. } => unreachable!("the store never fails"),
        }
    }

    /// The value of an unlabelled metric.
    fn metric(&self, name: &str) -> f64 {
        self.metrics
            .encode()
            .lines()
            .find_map(|line| {
                let (n, v) = line.split_once(' ')?;
                (n == name).then(|| v.trim().parse::<f64>().ok())?
            })
            .unwrap_or(0.0)
    }
}

fn touch(w: &W, stamp: &str, why: &str, attempt: u32) -> Effect {
    Effect::Touch(Touch {
        workload: w.key(),
        stamp: stamp.to_owned(),
        why: why.to_owned(),
        attempt,
        believed: match &w.stamp {
            Some(stamp) => Believed::Stamp(stamp.clone()),
            None => Believed::ResourceVersion("1".to_owned()),
        },
    })
}

fn event(
    w: &W,
    type_: EventType,
    reason: &'static str,
    action: &'static str,
    note: &str,
) -> Effect {
    Effect::Event(WorkloadEvent {
        workload: w.key(),
        uid: w.uid.clone(),
        type_,
        reason,
        action,
        note: note.to_owned(),
    })
}

fn config_changed(w: &W, what: &str) -> Effect {
    event(
        w,
        EventType::Normal,
        CONFIG_CHANGED_REASON,
        "Restamp",
        &format!("{what}; the pod template was re-stamped and its pods roll"),
    )
}

/// The two lists of ConfigMaps and Secrets passed through.
fn listed() -> Vec<Effect> {
    vec![Effect::ReleaseMemory, Effect::ReleaseMemory]
}

const STALE_WHY: &str = "its stamp was stale";
const APP_ENV_CHANGED: &str = "ConfigMap app-env changed";

/// The usual start: `shop` opted in, ConfigMap `app-env` and Deployment `web` using it, stamped
/// by the webhook at CREATE.
fn shop(t: &mut Test) -> W {
    let app_env = config_map(NS, "app-env", &[("LOG_LEVEL", "info")]);
    t.cluster.insert(app_env.0.clone(), app_env.1.clone());
    let web = deployment(NS, "web", &[("configMap", "app-env")]);
    let web = web.clone().stamped(&t.expected(&web));
    assert_eq!(t.start(&[(NS, true)], &[app_env], &[&web]), listed());
    web
}

fn app_env(level: &str) -> (ConfigKey, StoredConfig) {
    config_map(NS, "app-env", &[("LOG_LEVEL", level)])
}

mod configured_kinds;
mod dry_run;
mod events;
mod flap;
mod leadership;
mod max_reference_bytes;
mod namespaces;
mod opted_in_workloads;
mod opting_in;
mod races;
mod retries;
mod rollouts;
mod scope;
mod terminating;
mod waves;
mod windows;

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
    /// (how, name): `configMap`, `optionalConfigMap` or `secret` in `envFrom`.
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
        kind: WorkloadKind::Deployment,
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
            .map(|(how, name)| match *how {
                "configMap" => json!({"configMapRef": {"name": name}}),
                "optionalConfigMap" => json!({"configMapRef": {"name": name, "optional": true}}),
                "secret" => json!({"secretRef": {"name": name}}),
                other => panic!("unknown use {other}"),
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
            "spec": {"template": {
                "metadata": {"annotations": template_annotations},
                "spec": {"containers": [{"name": "app", "image": "app", "envFrom": env_from}]},
            }},
        });
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
        Test {
            state: State::new(config, key.clone(), metrics.clone(), wall0()),
            metrics,
            key,
            max_references,
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
        for kind in WorkloadKind::ALL {
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

// ----- change windows -----

#[test]
fn one_change_touches_once_when_its_window_closes() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    assert_eq!(t.next_wake(), Some(600.0), "only the resync is due");

    assert_eq!(t.config(1.0, app_env("debug")), []);
    assert_eq!(
        t.next_wake(),
        Some(6.0),
        "the window closes a debounce later"
    );
    assert_eq!(t.wake(5.999), []);
    let stamp = t.expected(&web);
    assert_eq!(t.wake(6.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);
    assert_eq!(t.next_wake(), Some(600.0));

    let web = web.stamped(&stamp);
    assert_eq!(
        t.touched(6.1, &web, TouchResult::Patched(Some(stamp.clone()))),
        [config_changed(&web, APP_ENV_CHANGED)]
    );
    // The watch then shows the new stamp: nothing more to do.
    assert_eq!(t.workload(6.2, &web), []);
    assert_eq!(t.next_wake(), Some(600.0));
    assert_eq!(t.metrics.touches("touched"), 1);
    assert_eq!(t.metric("confighash_touch_retries_total"), 0.0);
}

#[test]
fn a_burst_in_one_window_is_one_touch_to_the_final_content() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    for (at, level) in [(1.0, "1"), (2.0, "2"), (3.0, "3"), (5.9, "4")] {
        assert_eq!(t.config(at, app_env(level)), []);
        assert_eq!(t.next_wake(), Some(6.0), "later changes do not extend it");
    }
    let stamp = t.expected(&web);
    assert_eq!(t.wake(6.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);
}

#[test]
fn changes_in_two_windows_touch_twice() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    let first = t.expected(&web);
    assert_eq!(t.wake(6.0), [touch(&web, &first, APP_ENV_CHANGED, 0)]);
    let web = web.stamped(&first);
    t.touched(6.1, &web, TouchResult::Patched(Some(first.clone())));
    t.workload(6.2, &web);

    assert_eq!(t.config(7.0, app_env("trace")), []);
    assert_eq!(t.next_wake(), Some(12.0));
    let second = t.expected(&web);
    assert_ne!(first, second);
    assert_eq!(t.wake(12.0), [touch(&web, &second, APP_ENV_CHANGED, 0)]);
}

#[test]
fn a_metadata_only_write_opens_no_window() {
    let mut t = Test::leader(config());
    shop(&mut t);
    let relabelled = config_map_annotated(
        NS,
        "app-env",
        &[("LOG_LEVEL", "info")],
        json!({"team": "shop"}),
    );
    assert_eq!(t.config(1.0, relabelled), []);
    assert_eq!(t.next_wake(), Some(600.0));
}

#[test]
fn a_change_during_a_touch_in_flight_waits_for_it() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    let first = t.expected(&web);
    assert_eq!(t.wake(6.0), [touch(&web, &first, APP_ENV_CHANGED, 0)]);

    // Another window closes while the touch is held up: parked, not sent.
    t.config(7.0, app_env("trace"));
    assert_eq!(t.wake(12.0), []);
    assert_eq!(t.next_wake(), Some(600.0));

    // Once it is done, the parked one is decided again, at once.
    let second = t.expected(&web);
    assert_eq!(
        t.touched(13.0, &web, TouchResult::Patched(Some(first.clone()))),
        [
            config_changed(&web, APP_ENV_CHANGED),
            touch(&web, &second, APP_ENV_CHANGED, 0)
        ]
    );
}

#[test]
fn a_workload_that_arrives_stale_is_touched_a_window_later() {
    let mut t = Test::leader(config());
    shop(&mut t);
    // Its ConfigMap's change came first and found nothing referencing it.
    let old = deployment(NS, "api", &[("configMap", "api-env")]);
    let old_stamp = t.expected(&old);
    assert_eq!(t.config(1.0, config_map(NS, "api-env", &[("A", "1")])), []);
    assert_eq!(t.next_wake(), Some(600.0));
    let api = old.stamped(&old_stamp);
    assert_eq!(t.workload(1.5, &api), []);
    assert_eq!(t.next_wake(), Some(6.5));
    let stamp = t.expected(&api);
    assert_eq!(t.wake(6.5), [touch(&api, &stamp, STALE_WHY, 0)]);
}

// ----- pacing -----

#[test]
fn a_burst_across_many_workloads_is_paced_by_the_token_bucket() {
    let mut t = Test::leader(WatcherConfig {
        max_touches_per_second: 2.0,
        ..config()
    });
    let shared = config_map(NS, "shared", &[("LOG_LEVEL", "info")]);
    t.cluster.insert(shared.0.clone(), shared.1.clone());
    let workloads: Vec<W> = (0..30)
        .map(|i| {
            let w = deployment(NS, &format!("web-{i:02}"), &[("configMap", "shared")]);
            let stamp = t.expected(&w);
            w.stamped(&stamp)
        })
        .collect();
    let refs: Vec<&W> = workloads.iter().collect();
    assert_eq!(t.start(&[(NS, true)], &[shared], &refs), listed());

    t.config(1.0, config_map(NS, "shared", &[("LOG_LEVEL", "debug")]));
    let stamp = t.expected(&workloads[0]);
    let why = "ConfigMap shared changed";
    let burst: Vec<Effect> = workloads[..20]
        .iter()
        .map(|w| touch(w, &stamp, why, 0))
        .collect();
    assert_eq!(t.wake(6.0), burst, "the bucket's burst");
    assert_eq!(t.metric("confighash_touches_rate_limited_total"), 10.0);

    // Then one every half second (2 a second), in order.
    let mut last = 6.0;
    for w in &workloads[20..] {
        let next = t.next_wake().unwrap();
        assert!((next - last - 0.5).abs() < 1e-3, "{next} after {last}");
        last = next;
        assert_eq!(t.wake(next), [touch(w, &stamp, why, 0)]);
    }
    assert_eq!(t.next_wake(), Some(600.0));
}

// ----- retries -----

#[test]
fn a_stamp_kept_by_the_webhook_is_retried_for_the_same_change() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    let old = web.stamp.clone();
    t.config(1.0, app_env("debug"));
    let stamp = t.expected(&web);
    assert_eq!(t.wake(6.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);

    // The webhook's lookup failed: it kept the old stamp.
    assert_eq!(t.touched(6.1, &web, TouchResult::Patched(old)), []);
    assert_eq!(t.metrics.touches("kept-by-webhook"), 1);
    assert_eq!(t.metric("confighash_touch_retries_total"), 1.0);
    assert_eq!(t.next_wake(), Some(7.1), "retried after retry_base");
    // At most one touch per workload per debounce: held until 11.
    assert_eq!(t.wake(7.1), []);
    assert_eq!(t.next_wake(), Some(11.0));
    assert_eq!(
        t.wake(11.0),
        [touch(&web, &stamp, APP_ENV_CHANGED, 1)],
        "the retry names the change, as its Event will"
    );
    assert_eq!(
        t.touched(11.1, &web, TouchResult::Patched(Some(stamp.clone()))),
        [config_changed(&web, APP_ENV_CHANGED)]
    );
}

#[test]
fn a_touch_that_keeps_failing_records_one_touch_failed_event_per_ten_minutes() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    let stamp = t.expected(&web);
    let forbidden = || {
        TouchResult::Failed(TouchError::Forbidden(
            "the API server answered 403 Forbidden".to_owned(),
        ))
    };
    assert_eq!(t.wake(6.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);
    assert_eq!(
        t.touched(6.0, &web, forbidden()),
        [],
        "one failure: no Event yet"
    );
    assert_eq!(t.next_wake(), Some(7.0));
    assert_eq!(t.wake(7.0), []);
    assert_eq!(t.wake(11.0), [touch(&web, &stamp, APP_ENV_CHANGED, 1)]);
    let note = "re-stamping the pod template after ConfigMap app-env changed failed 2 times in a \
                row: the patch was refused (the API server answered 403 Forbidden): confighash's \
                RBAC must allow patch on deployments; retrying in 2s";
    assert_eq!(
        t.touched(11.0, &web, forbidden()),
        [event(
            &web,
            EventType::Warning,
            TOUCH_FAILED_REASON,
            "Restamp",
            note
        )]
    );

    // It goes on failing, with backoff: one more Event once ten minutes have passed.
    let mut touches = vec![];
    let mut events = vec![];
    while let Some(next) = t.next_wake().filter(|n| *n < 1100.0) {
        for effect in t.wake(next) {
            let Effect::Touch(touch) = effect else {
                panic!("{effect:?}");
            };
            touches.push((next, touch.attempt));
            for effect in t.touched(next, &web, forbidden()) {
                events.push((next, effect));
            }
        }
    }
    assert_eq!(
        touches,
        [
            (16.0, 2),
            (21.0, 3),
            (29.0, 4),
            (45.0, 5),
            (77.0, 6),
            (141.0, 7),
            (269.0, 8),
            (525.0, 9),
            (1037.0, 10)
        ]
    );
    let note = "re-stamping the pod template after ConfigMap app-env changed failed 11 times in a \
                row: the patch was refused (the API server answered 403 Forbidden): confighash's \
                RBAC must allow patch on deployments; retrying in 10m";
    assert_eq!(
        events,
        [(
            1037.0,
            event(
                &web,
                EventType::Warning,
                TOUCH_FAILED_REASON,
                "Restamp",
                note
            )
        )]
    );
    assert_eq!(t.metrics.touches("error"), 11);

    // The resync finds it pending and leaves its time alone.
    assert_eq!(t.wake(1200.0), []);
    assert_eq!(t.next_wake(), Some(1637.0));
    // Allowed again: it lands, and its Event names the change.
    assert_eq!(t.wake(1637.0), [touch(&web, &stamp, APP_ENV_CHANGED, 11)]);
    assert_eq!(
        t.touched(1637.0, &web, TouchResult::Patched(Some(stamp.clone()))),
        [config_changed(&web, APP_ENV_CHANGED)]
    );
}

#[test]
fn other_failures_are_retried_and_named_as_they_are() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    let stamp = t.expected(&web);
    let failed =
        || TouchResult::Failed(TouchError::Other("the API server answered 500".to_owned()));
    t.wake(6.0);
    assert_eq!(t.touched(6.0, &web, failed()), []);
    assert_eq!(t.wake(11.0), [touch(&web, &stamp, APP_ENV_CHANGED, 1)]);
    let note = "re-stamping the pod template after ConfigMap app-env changed failed 2 times in a \
                row: the patch failed (the API server answered 500); retrying in 2s";
    assert_eq!(
        t.touched(11.5, &web, failed()),
        [event(
            &web,
            EventType::Warning,
            TOUCH_FAILED_REASON,
            "Restamp",
            note
        )]
    );
}

#[test]
fn a_workload_gone_before_its_touch_is_not_retried() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    t.wake(6.0);
    assert_eq!(t.touched(6.1, &web, TouchResult::Gone), []);
    assert_eq!(t.metrics.touches("gone"), 1);
    assert_eq!(t.next_wake(), Some(600.0));
    // A result for a touch not in flight is ignored.
    assert_eq!(t.touched(6.2, &web, TouchResult::Gone), []);
    assert_eq!(t.metrics.touches("gone"), 1);
}

// ----- backoff of touches that do not take -----

/// When a touch's own watch event (the write of a touch the webhook turned back is still stored,
/// so the workload comes back with its old stamp) arrives, relative to the touch's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Echo {
    Never,
    Before,
    After,
}

/// The webhook turns back every touch of `w` sent before `until` (seconds), each touch's own
/// watch event arriving as `echo` says, at the same instant. The touches sent (when, attempt)
/// and every other effect, in order.
fn revert_until(t: &mut Test, w: &W, until: f64, echo: Echo) -> (Vec<(f64, u32)>, Vec<Effect>) {
    let mut touches = vec![];
    let mut others = vec![];
    while let Some(next) = t.next_wake().filter(|n| *n < until) {
        for effect in t.wake(next) {
            let Effect::Touch(touch) = effect else {
                others.push(effect);
                continue;
            };
            assert_eq!(touch.workload, w.key());
            touches.push((next, touch.attempt));
            if echo == Echo::Before {
                others.extend(t.workload(next, w));
            }
            others.extend(t.touched(next, w, TouchResult::Patched(w.stamp.clone())));
            if echo == Echo::After {
                others.extend(t.workload(next, w));
            }
        }
    }
    (touches, others)
}

/// The touches of a change whose touches the webhook keeps turning back, from a first touch at
/// 6 s: the per-workload interval (5 s) first, then the backoff doubling from 1 s.
const REVERTED: [(f64, u32); 11] = [
    (6.0, 0),
    (11.0, 1),
    (16.0, 2),
    (21.0, 3),
    (29.0, 4),
    (45.0, 5),
    (77.0, 6),
    (141.0, 7),
    (269.0, 8),
    (525.0, 9),
    (1037.0, 10),
];

fn kept_by_webhook_note(failures: u32, retry_in: &str) -> String {
    format!(
        "re-stamping the pod template after ConfigMap app-env changed failed {failures} times in \
         a row: the webhook kept the old stamp (it could not read the referenced ConfigMaps and \
         Secrets, or decided otherwise), so the pod template was not changed and its pods have \
         not rolled; retrying in {retry_in}"
    )
}

fn touch_failed(w: &W, note: &str) -> Effect {
    event(w, EventType::Warning, TOUCH_FAILED_REASON, "Restamp", note)
}

#[test]
fn a_reverted_touch_backs_off_whenever_its_own_watch_event_arrives() {
    for echo in [Echo::Never, Echo::Before, Echo::After] {
        let mut t = Test::leader(config());
        let web = shop(&mut t);
        t.config(1.0, app_env("debug"));
        let (touches, others) = revert_until(&mut t, &web, 1100.0, echo);
        assert_eq!(touches, REVERTED, "{echo:?}");
        assert_eq!(
            others,
            [
                touch_failed(&web, &kept_by_webhook_note(2, "2s")),
                touch_failed(&web, &kept_by_webhook_note(11, "10m")),
            ],
            "{echo:?}: the second failure, then once per ten minutes"
        );
        assert_eq!(t.metrics.touches("kept-by-webhook"), 11, "{echo:?}");
        assert_eq!(t.metric("confighash_touch_retries_total"), 11.0);
        assert_eq!(t.next_wake(), Some(1200.0), "{echo:?}: the resync first");
        assert_eq!(
            t.wake(1200.0),
            [],
            "{echo:?}: which leaves the backoff alone"
        );
        assert_eq!(t.next_wake(), Some(1637.0), "{echo:?}: capped at --resync");
    }
}

#[test]
fn an_echo_before_the_result_no_longer_caps_the_backoff_at_the_window() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    let (touches, _) = revert_until(&mut t, &web, 45.0, Echo::Before);
    assert_eq!(touches, REVERTED[..5]);
    // The touch at 29 came back as a watch event, asking for a check a window later (34), then
    // as a result: the retry waits for the backoff.
    assert_eq!(t.next_wake(), Some(45.0));
    assert_eq!(t.wake(34.0), []);
}

#[test]
fn watch_events_and_resyncs_during_a_backoff_do_not_shorten_it() {
    let mut t = Test::leader(WatcherConfig {
        resync: Duration::from_secs(60),
        ..config()
    });
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    let (touches, _) = revert_until(&mut t, &web, 78.0, Echo::After);
    assert_eq!(
        touches,
        REVERTED[..7],
        "the touch at 77 waits 64 s, capped at 60"
    );
    for second in 78..137 {
        if second == 120 {
            assert_eq!(t.wake(120.0), [], "the resync");
        }
        assert_eq!(t.workload(f64::from(second), &web), [], "at {second}");
        let next = if second < 120 { 120.0 } else { 137.0 };
        assert_eq!(t.next_wake(), Some(next), "at {second}");
    }
    let stamp = t.expected(&web);
    assert_eq!(t.wake(137.0), [touch(&web, &stamp, APP_ENV_CHANGED, 7)]);
    t.touched(137.0, &web, TouchResult::Patched(web.stamp.clone()));
    assert_eq!(
        t.next_wake(),
        Some(180.0),
        "the resync at 180, the retry at 197"
    );
    assert_eq!(t.wake(180.0), []);
    assert_eq!(t.wake(197.0), [touch(&web, &stamp, APP_ENV_CHANGED, 8)]);
}

#[test]
fn a_failed_touch_whose_event_comes_first_backs_off_too() {
    // A patch stored but answered with an error (a timeout on the way back): the watch shows
    // the write before the error comes back.
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    let failed = || TouchResult::Failed(TouchError::Other("timed out".to_owned()));
    let mut touches = vec![];
    while let Some(next) = t.next_wake().filter(|n| *n < 100.0) {
        for effect in t.wake(next) {
            if let Effect::Touch(touch) = effect {
                touches.push((next, touch.attempt));
                t.workload(next, &web);
                t.touched(next, &web, failed());
            }
        }
    }
    assert_eq!(touches, REVERTED[..7]);
    assert_eq!(t.metrics.touches("error"), 7);
}

#[test]
fn a_touch_that_takes_ends_the_backoff() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    let (touches, _) = revert_until(&mut t, &web, 30.0, Echo::After);
    assert_eq!(touches, REVERTED[..5]);
    // The webhook reads again: the retry at 45 takes.
    let stamp = t.expected(&web);
    assert_eq!(t.wake(45.0), [touch(&web, &stamp, APP_ENV_CHANGED, 5)]);
    assert_eq!(
        t.touched(45.0, &web, TouchResult::Patched(Some(stamp.clone()))),
        [config_changed(&web, APP_ENV_CHANGED)]
    );
    let web = web.stamped(&stamp);
    assert_eq!(t.workload(45.0, &web), []);

    // The next change is touched when its window closes, as a first attempt.
    t.config(60.0, app_env("trace"));
    let next = t.expected(&web);
    assert_eq!(t.wake(65.0), [touch(&web, &next, APP_ENV_CHANGED, 0)]);
    // And a failure now starts from the first delay again.
    t.touched(65.0, &web, TouchResult::Patched(web.stamp.clone()));
    assert_eq!(t.next_wake(), Some(66.0));
}

#[test]
fn a_stamp_written_by_someone_else_ends_the_backoff() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    revert_until(&mut t, &web, 30.0, Echo::After);
    assert_eq!(t.next_wake(), Some(45.0));
    // An update of the workload that the webhook stamped: the stamp is right, nothing pending.
    let stamp = t.expected(&web);
    let web = web.stamped(&stamp);
    assert_eq!(t.workload(31.0, &web), []);
    assert_eq!(t.wake(45.0), []);
    assert_eq!(t.metric("confighash_touches_pending"), 0.0);

    t.config(50.0, app_env("trace"));
    let next = t.expected(&web);
    assert_eq!(t.wake(55.0), [touch(&web, &next, APP_ENV_CHANGED, 0)]);
}

#[test]
fn a_deleted_workload_loses_its_backoff() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    revert_until(&mut t, &web, 30.0, Echo::After);
    assert_eq!(t.next_wake(), Some(45.0));
    let deleted = Watched::Deleted(web.key());
    assert_eq!(
        t.feed(31.0, Input::Workload(WorkloadKind::Deployment, deleted)),
        []
    );
    assert_eq!(t.next_wake(), Some(600.0));

    // Created again (another uid, stamped by the webhook): a change touches it at once.
    let web = W {
        uid: "uid-web-2".to_owned(),
        ..web.clone().stamped(&t.expected(&web))
    };
    assert_eq!(t.workload(32.0, &web), []);
    t.config(33.0, app_env("trace"));
    let stamp = t.expected(&web);
    assert_eq!(t.wake(38.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);
}

#[test]
fn a_new_change_during_a_backoff_waits_for_it_and_is_named_by_the_retry() {
    let mut t = Test::leader(config());
    let app = app_env("info");
    let db = secret(NS, "db", &[("password", "one")]);
    for (k, v) in [&app, &db] {
        t.cluster.insert(k.clone(), v.clone());
    }
    let web = deployment(NS, "web", &[("configMap", "app-env"), ("secret", "db")]);
    let web = web.clone().stamped(&t.expected(&web));
    t.start(&[(NS, true)], &[app, db], &[&web]);
    t.config(1.0, app_env("debug"));
    let (touches, _) = revert_until(&mut t, &web, 30.0, Echo::After);
    assert_eq!(touches, REVERTED[..5]);
    assert_eq!(t.next_wake(), Some(45.0));

    // The Secret changes: its window closes at 36, and the touch still waits for 45.
    assert_eq!(t.config(31.0, secret(NS, "db", &[("password", "two")])), []);
    assert_eq!(t.next_wake(), Some(36.0));
    assert_eq!(t.wake(36.0), []);
    assert_eq!(t.next_wake(), Some(45.0));
    let stamp = t.expected(&web);
    let both = "ConfigMap app-env, Secret db changed";
    assert_eq!(t.wake(45.0), [touch(&web, &stamp, both, 5)]);
    assert_eq!(
        t.touched(45.0, &web, TouchResult::Patched(Some(stamp))),
        [config_changed(&web, both)]
    );
}

#[test]
fn leadership_lost_ends_the_backoff_and_a_new_leader_reconciles_afresh() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    revert_until(&mut t, &web, 30.0, Echo::After);
    assert_eq!(t.next_wake(), Some(45.0));
    assert_eq!(t.feed(31.0, Input::Leader(false)), []);
    assert_eq!(t.next_wake(), Some(600.0));
    assert_eq!(t.feed(32.0, Input::Leader(true)), []);
    assert_eq!(t.next_wake(), Some(34.0), "a window after the last touch");
    let stamp = t.expected(&web);
    assert_eq!(t.wake(34.0), [touch(&web, &stamp, STALE_WHY, 0)]);
}

// ----- terminating namespaces -----

fn roll_on_delete() -> WatcherConfig {
    WatcherConfig {
        rules: rules::Options {
            roll_on_delete: true,
            ..rules::Options::default()
        },
        ..config()
    }
}

#[test]
fn a_terminating_namespace_drops_what_is_pending_and_its_deletions_roll_nothing() {
    for config in [config(), roll_on_delete()] {
        let roll = config.rules.roll_on_delete;
        let mut t = Test::leader(config);
        let web = shop(&mut t);
        t.config(1.0, app_env("debug"));
        // A touch the webhook turned back: retried at 11.
        let (touches, _) = revert_until(&mut t, &web, 7.0, Echo::After);
        assert_eq!(touches, REVERTED[..1]);
        assert_eq!(t.metric("confighash_touches_pending"), 1.0);

        assert_eq!(t.terminate(8.0, NS, true), [], "roll_on_delete {roll}");
        assert_eq!(t.metric("confighash_touches_pending"), 0.0);
        assert_eq!(t.next_wake(), Some(600.0), "roll_on_delete {roll}");
        // Its objects go: deletions of ConfigMaps look like changes, but roll nothing.
        assert_eq!(t.delete_config(9.0, &app_env("info").0), []);
        assert_eq!(
            t.next_wake(),
            Some(600.0),
            "roll_on_delete {roll}: no window"
        );
        assert_eq!(t.workload(9.5, &web), [], "its own deletion's MODIFIED");
        assert_eq!(t.wake(14.0), []);
        assert_eq!(t.wake(600.0), [], "nor does the resync");
        let deleted = Watched::Deleted(web.key());
        t.feed(601.0, Input::Workload(WorkloadKind::Deployment, deleted));
        let deleted = Watched::Deleted(NS.to_owned());
        assert_eq!(t.feed(602.0, Input::Namespace(deleted)), []);
        assert_eq!(t.metric("confighash_touches_pending"), 0.0);
        assert_eq!(t.metric("confighash_touches_in_flight"), 0.0);
    }
}

#[test]
fn a_namespace_that_terminates_while_a_window_is_open_is_left_alone() {
    for config in [config(), roll_on_delete()] {
        let roll = config.rules.roll_on_delete;
        let mut t = Test::leader(config);
        shop(&mut t);
        t.config(1.0, app_env("debug"));
        assert_eq!(t.terminate(2.0, NS, true), []);
        assert_eq!(t.delete_config(3.0, &app_env("info").0), []);
        assert_eq!(t.next_wake(), Some(6.0), "roll_on_delete {roll}");
        assert_eq!(t.wake(6.0), [], "roll_on_delete {roll}");
        assert_eq!(t.next_wake(), Some(600.0));
    }
}

#[test]
fn a_touch_in_flight_when_its_namespace_terminates_records_no_event_and_is_not_retried() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    let stamp = t.expected(&web);
    assert_eq!(t.wake(6.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);
    assert_eq!(t.terminate(6.05, NS, true), []);
    assert_eq!(
        t.touched(6.1, &web, TouchResult::Patched(Some(stamp.clone()))),
        [],
        "no ConfigChanged Event: creates in the namespace are refused"
    );
    assert_eq!(t.metrics.touches("touched"), 1);

    // One that failed once before: its second failure would record a TouchFailed Event.
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    let (touches, _) = revert_until(&mut t, &web, 7.0, Echo::After);
    assert_eq!(touches, REVERTED[..1]);
    assert_eq!(t.wake(11.0), [touch(&web, &stamp, APP_ENV_CHANGED, 1)]);
    assert_eq!(t.metric("confighash_touches_in_flight"), 1.0);
    assert_eq!(t.terminate(11.05, NS, true), []);
    let forbidden = TouchResult::Failed(TouchError::Forbidden("403".to_owned()));
    assert_eq!(t.touched(11.1, &web, forbidden), []);
    assert_eq!(t.metrics.touches("error"), 1);
    assert_eq!(t.next_wake(), Some(600.0), "not retried");
    assert_eq!(t.metric("confighash_touches_pending"), 0.0);
    assert_eq!(t.metric("confighash_touches_in_flight"), 0.0);
}

#[test]
fn a_terminating_namespace_gets_no_event_and_no_touch_from_a_new_leader() {
    let mut t = Test::follower(WatcherConfig {
        max_references: 1,
        ..config()
    });
    let app = app_env("info");
    t.cluster.insert(app.0.clone(), app.1.clone());
    let big = deployment(NS, "big", &[("configMap", "a"), ("configMap", "b")]);
    let stale = deployment(NS, "stale", &[("configMap", "app-env")]);
    let stale = stale.clone().stamped(&t.expected(&stale));
    let changed = app_env("debug");
    t.cluster.insert(changed.0.clone(), changed.1.clone());
    // A stale stamp and a workload over --max-references.
    assert_eq!(
        t.start(&[(NS, true)], &[changed], &[&big, &stale]),
        listed()
    );
    assert_eq!(t.terminate(0.5, NS, true), []);
    assert_eq!(t.feed(1.0, Input::Leader(true)), [], "reconcile skips it");
    assert_eq!(t.workload(2.0, &big), [], "no TooManyReferences Event");
    assert_eq!(t.wake(600.0), []);

    // Deleted, and a namespace of the same name made again: a namespace like any other.
    let deleted = Watched::Deleted(NS.to_owned());
    t.feed(601.0, Input::Namespace(deleted));
    t.namespace(602.0, NS, true);
    let note = "it references more than 1 ConfigMaps and Secrets (--max-references): confighash \
                does not read them, stamp it or roll it on config changes";
    let big = W {
        uid: "uid-big-2".to_owned(),
        ..big
    };
    let deleted = Watched::Deleted(big.key());
    t.feed(603.0, Input::Workload(WorkloadKind::Deployment, deleted));
    assert_eq!(
        t.workload(603.0, &big),
        [event(
            &big,
            EventType::Warning,
            TOO_MANY_REFERENCES_REASON,
            "Skip",
            note
        )]
    );
}

// ----- touches pending and in flight -----

#[test]
fn touches_pending_and_in_flight_are_gauged() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    let gauges = |t: &Test| {
        (
            t.metric("confighash_touches_pending"),
            t.metric("confighash_touches_in_flight"),
        )
    };
    assert_eq!(gauges(&t), (0.0, 0.0));
    t.config(1.0, app_env("debug"));
    assert_eq!(gauges(&t), (0.0, 0.0), "a window is no touch yet");
    let first = t.expected(&web);
    assert_eq!(t.wake(6.0), [touch(&web, &first, APP_ENV_CHANGED, 0)]);
    assert_eq!(gauges(&t), (0.0, 1.0));
    // Another change while it is in flight: parked.
    t.config(7.0, app_env("trace"));
    t.wake(12.0);
    assert_eq!(gauges(&t), (1.0, 1.0));
    assert_eq!(t.metrics.touches_outstanding(), (1, 1));
    let second = t.expected(&web);
    let effects = t.touched(13.0, &web, TouchResult::Patched(Some(first.clone())));
    assert_eq!(effects[1], touch(&web, &second, APP_ENV_CHANGED, 0));
    assert_eq!(gauges(&t), (0.0, 1.0));
    // Turned back (the watch has not shown the first stamp yet): pending on its backoff.
    t.touched(13.1, &web, TouchResult::Patched(web.stamp.clone()));
    assert_eq!(gauges(&t), (1.0, 0.0));
    assert_eq!(t.wake(18.0), [touch(&web, &second, APP_ENV_CHANGED, 1)]);
    assert_eq!(gauges(&t), (0.0, 1.0));
    t.touched(18.1, &web, TouchResult::Patched(Some(second)));
    assert_eq!(gauges(&t), (0.0, 0.0));
    assert_eq!(t.metrics.touches_outstanding(), (0, 0));

    // Scheduled a window ahead: a workload that arrives stale.
    let api = deployment(NS, "api", &[("configMap", "app-env")]).stamped("v2:x:stale");
    let api = W {
        stamp: Some(first.clone()),
        ..api
    };
    t.workload(20.0, &api);
    assert_eq!(gauges(&t), (1.0, 0.0));
    assert_eq!(t.feed(21.0, Input::Leader(false)), []);
    assert_eq!(gauges(&t), (0.0, 0.0), "a follower has nothing pending");
}

// ----- leadership -----

#[test]
fn only_the_leader_touches_and_a_new_leader_reconciles() {
    let mut t = Test::follower(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    assert_eq!(t.wake(6.0), [], "a follower only watches");
    assert_eq!(t.next_wake(), Some(600.0));
    assert_eq!(t.metric("confighash_leader"), 0.0);

    let stamp = t.expected(&web);
    assert_eq!(
        t.feed(7.0, Input::Leader(true)),
        [touch(&web, &stamp, STALE_WHY, 0)],
        "it compares every stamp at once"
    );
    assert_eq!(t.metric("confighash_leader"), 1.0);
    assert_eq!(t.metric("confighash_reconcile_mismatches_total"), 1.0);
    assert_eq!(
        t.feed(7.5, Input::Leader(true)),
        [],
        "no change, no reconcile"
    );
    let web = web.stamped(&stamp);
    t.touched(7.6, &web, TouchResult::Patched(Some(stamp)));
    t.workload(7.7, &web);

    // Leadership lost with a change pending: dropped.
    t.config(8.0, app_env("trace"));
    assert_eq!(t.feed(9.0, Input::Leader(false)), []);
    assert_eq!(t.wake(13.0), []);
    assert_eq!(t.metric("confighash_leader"), 0.0);
}

// ----- restarts -----

#[test]
fn a_restart_with_nothing_changed_touches_nothing() {
    let mut t = Test::leader(config());
    shop(&mut t);
    assert_eq!(t.wake(600.0), [], "nor does the resync");
    assert_eq!(t.next_wake(), Some(1200.0));
}

#[test]
fn a_restart_touches_stale_stamps_and_markers_once_and_leaves_the_unstamped() {
    let mut t = Test::leader(config());
    let app = app_env("info");
    t.cluster.insert(app.0.clone(), app.1.clone());
    let uses = [("configMap", "app-env")];
    // Stamped before the ConfigMap changed, while the watcher was down.
    let stale_stamp = t.expected(&deployment(NS, "stale", &uses));
    let changed = app_env("debug");
    t.cluster.insert(changed.0.clone(), changed.1.clone());
    let fresh = deployment(NS, "fresh", &uses);
    let fresh = fresh.clone().stamped(&t.expected(&fresh));
    let stale = deployment(NS, "stale", &uses).stamped(&stale_stamp);
    let mut marked = deployment(NS, "marked", &uses);
    marked.annotations = json!({UNSTAMPED_ANNOTATION: "lookup-failed"});
    let unstamped = deployment(NS, "unstamped", &uses);
    let stamp = t.expected(&fresh);

    let effects = t.start(
        &[(NS, true)],
        &[changed],
        &[&fresh, &stale, &marked, &unstamped],
    );
    let mut expected = listed();
    expected.extend([
        touch(&marked, &stamp, STALE_WHY, 0),
        touch(&stale, &stamp, STALE_WHY, 0),
    ]);
    assert_eq!(effects, expected);
    assert_eq!(t.metric("confighash_reconcile_mismatches_total"), 2.0);
}

#[test]
fn stamp_existing_stamps_the_unstamped_at_start() {
    let mut t = Test::leader(WatcherConfig {
        rules: rules::Options {
            stamp_existing: true,
            ..rules::Options::default()
        },
        ..config()
    });
    let app = app_env("info");
    t.cluster.insert(app.0.clone(), app.1.clone());
    let unstamped = deployment(NS, "unstamped", &[("configMap", "app-env")]);
    let stamp = t.expected(&unstamped);
    let mut expected = listed();
    expected.push(touch(&unstamped, &stamp, STALE_WHY, 0));
    assert_eq!(t.start(&[(NS, true)], &[app], &[&unstamped]), expected);
}

#[test]
fn a_dropped_watch_relisting_a_change_touches_once() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    // The watch broke (410) across a change: the re-list shows it.
    let (key, stored) = app_env("debug");
    t.cluster.insert(key.clone(), stored.clone());
    let source = || ConfigSource::Watch(ObjectKind::ConfigMap);
    let applied = Watched::Applied(key.clone(), Some(stored));
    assert_eq!(t.feed(1.0, Input::Config(source(), applied)), []);
    let relisted = Watched::Relisted(HashSet::from([key]));
    assert_eq!(
        t.feed(1.1, Input::Config(source(), relisted)),
        [Effect::ReleaseMemory]
    );
    let stamp = t.expected(&web);
    assert_eq!(t.wake(6.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);
}

#[test]
fn a_relist_removes_what_vanished_meanwhile() {
    let mut t = Test::leader(config());
    let maybe = config_map(NS, "maybe", &[("FEATURE", "on")]);
    t.cluster.insert(maybe.0.clone(), maybe.1.clone());
    let opt = deployment(NS, "opt", &[("optionalConfigMap", "maybe")]);
    let opt = opt.clone().stamped(&t.expected(&opt));
    assert_eq!(
        t.start(&[(NS, true)], std::slice::from_ref(&maybe), &[&opt]),
        listed()
    );

    // Deleted while the watch was down: the re-list does not show it.
    t.cluster.remove(&maybe.0);
    let relisted = Watched::Relisted(HashSet::new());
    let source = ConfigSource::Watch(ObjectKind::ConfigMap);
    assert_eq!(
        t.feed(1.0, Input::Config(source, relisted)),
        [Effect::ReleaseMemory]
    );
    let stamp = t.expected(&opt);
    assert_ne!(Some(&stamp), opt.stamp.as_ref());
    assert_eq!(
        t.wake(6.0),
        [touch(&opt, &stamp, "ConfigMap maybe changed", 0)]
    );

    // A workload gone meanwhile is forgotten, with what was pending for it.
    t.config(7.0, config_map(NS, "maybe", &[("FEATURE", "off")]));
    let relisted = Watched::Relisted(HashSet::new());
    assert_eq!(
        t.feed(8.0, Input::Workload(WorkloadKind::Deployment, relisted)),
        []
    );
    assert_eq!(t.wake(12.0), []);
    assert_eq!(t.next_wake(), Some(600.0));
    assert!(
        t.metrics
            .encode()
            .contains("confighash_watched_objects{kind=\"Deployment\"} 0")
    );
}

#[test]
fn a_kind_the_cluster_does_not_serve_counts_as_listed() {
    let mut t = Test::leader(config());
    for input in [
        Input::Namespace(Watched::Relisted(HashSet::new())),
        Input::Config(
            ConfigSource::Watch(ObjectKind::ConfigMap),
            Watched::Relisted(HashSet::new()),
        ),
        Input::Config(
            ConfigSource::Watch(ObjectKind::Secret),
            Watched::Relisted(HashSet::new()),
        ),
    ] {
        t.feed(0.0, input);
    }
    for kind in WorkloadKind::ALL {
        assert!(!t.state.is_synced());
        let input = if kind == WorkloadKind::Rollout {
            Input::NotServed(kind)
        } else {
            Input::Workload(kind, Watched::Relisted(HashSet::new()))
        };
        t.feed(0.0, input);
    }
    assert!(t.state.is_synced());
    assert_eq!(t.metric("confighash_watcher_cache_synced"), 1.0);
}

// ----- what is left alone -----

#[test]
fn opted_out_workloads_and_namespaces_not_opted_in_are_left_alone() {
    let mut t = Test::leader(config());
    let uses = [("configMap", "app-env")];
    let mut opted_out = deployment(NS, "opted-out", &uses);
    opted_out.labels = json!({ENABLED_LABEL: "false"});
    let plain = deployment("plain", "web", &uses);
    let effects = t.start(
        &[(NS, true), ("plain", false)],
        &[
            app_env("info"),
            config_map("plain", "app-env", &[("A", "1")]),
        ],
        &[&opted_out, &plain],
    );
    assert_eq!(effects, listed());
    assert!(
        t.metrics
            .encode()
            .contains("confighash_watched_objects{kind=\"ConfigMap\"} 1"),
        "only the opted-in namespace's ConfigMap is kept"
    );

    assert_eq!(t.config(1.0, app_env("debug")), []);
    assert_eq!(
        t.config(1.0, config_map("plain", "app-env", &[("A", "2")])),
        []
    );
    assert_eq!(t.wake(6.0), []);
}

#[test]
fn an_excluded_namespace_is_never_opted_in() {
    let mut t = Test::leader(config());
    let uses = [("configMap", "app-env")];
    let system = deployment("kube-system", "dns", &uses);
    let config = config_map("kube-system", "app-env", &[("A", "1")]);
    let stale = system.clone().stamped("v2:00000000:stale");
    t.start(&[("kube-system", true)], &[config], &[&stale]);
    assert_eq!(
        t.config(1.0, config_map("kube-system", "app-env", &[("A", "2")])),
        []
    );
    assert_eq!(t.wake(6.0), []);
    assert_eq!(t.wake(600.0), []);
}

#[test]
fn the_ignore_annotation_changes_the_stamp_once_and_then_content_rolls_nothing() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    let ignore = json!({"confighash.dev/ignore": "true"});
    let ignored =
        |level| config_map_annotated(NS, "app-env", &[("LOG_LEVEL", level)], ignore.clone());
    t.config(1.0, ignored("info"));
    let stamp = t.expected(&web);
    let no_refs = t.expected(&deployment(NS, "no-refs", &[]));
    assert_eq!(stamp, no_refs, "left out as if unreferenced");
    assert_eq!(t.wake(6.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);
    let web = web.stamped(&stamp);
    t.touched(6.1, &web, TouchResult::Patched(Some(stamp.clone())));
    t.workload(6.2, &web);

    // A content change of an ignored ConfigMap: a window, and nothing to touch.
    assert_eq!(t.config(7.0, ignored("debug")), []);
    assert_eq!(t.wake(12.0), []);
}

#[test]
fn an_optional_reference_that_appears_touches_once() {
    let mut t = Test::leader(config());
    let opt = deployment(NS, "opt", &[("optionalConfigMap", "maybe")]);
    let opt = opt.clone().stamped(&t.expected(&opt));
    assert_eq!(t.start(&[(NS, true)], &[], &[&opt]), listed());
    t.config(1.0, config_map(NS, "maybe", &[("FEATURE", "on")]));
    let stamp = t.expected(&opt);
    assert_eq!(
        t.wake(6.0),
        [touch(&opt, &stamp, "ConfigMap maybe changed", 0)]
    );
}

// ----- deletes -----

#[test]
fn a_deleted_required_config_map_touches_nothing_until_new_content() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    let (key, _) = app_env("info");
    assert_eq!(t.delete_config(1.0, &key), []);
    assert_eq!(t.next_wake(), Some(6.0));
    assert_eq!(t.wake(6.0), [], "new pods could not start anyway");

    assert_eq!(t.config(7.0, app_env("info")), []);
    assert_eq!(t.wake(12.0), [], "re-created with the same content");

    t.config(13.0, app_env("debug"));
    let stamp = t.expected(&web);
    assert_eq!(t.wake(18.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);
}

#[test]
fn roll_on_delete_touches_when_a_required_config_map_goes() {
    let mut t = Test::leader(WatcherConfig {
        rules: rules::Options {
            roll_on_delete: true,
            ..rules::Options::default()
        },
        ..config()
    });
    let web = shop(&mut t);
    t.delete_config(1.0, &app_env("info").0);
    let stamp = t.expected(&web);
    assert_eq!(t.wake(6.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);
}

#[test]
fn a_deleted_workload_is_forgotten() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    let deleted = Watched::Deleted(web.key());
    assert_eq!(
        t.feed(2.0, Input::Workload(WorkloadKind::Deployment, deleted)),
        []
    );
    assert_eq!(t.wake(6.0), [], "nothing references the change any more");
}

// ----- too many references -----

#[test]
fn a_workload_over_max_references_is_frozen_with_one_event() {
    let mut t = Test::leader(WatcherConfig {
        max_references: 2,
        ..config()
    });
    let big = deployment(
        NS,
        "big",
        &[("configMap", "a"), ("configMap", "b"), ("configMap", "c")],
    );
    let note = "it references more than 2 ConfigMaps and Secrets (--max-references): confighash \
                does not read them, stamp it or roll it on config changes";
    let warning = event(
        &big,
        EventType::Warning,
        TOO_MANY_REFERENCES_REASON,
        "Skip",
        note,
    );
    let mut expected = listed();
    expected.push(warning.clone());
    assert_eq!(
        t.start(&[(NS, true)], &[config_map(NS, "a", &[])], &[&big]),
        expected
    );
    assert_eq!(t.workload(1.0, &big), [], "one Event per workload");
    assert_eq!(t.config(2.0, config_map(NS, "a", &[("X", "1")])), []);
    assert_eq!(t.next_wake(), Some(600.0), "its references are not kept");
    assert_eq!(t.wake(600.0), []);

    // Deleted and created again: another workload, another Event.
    let deleted = Watched::Deleted(big.key());
    t.feed(601.0, Input::Workload(WorkloadKind::Deployment, deleted));
    assert_eq!(t.workload(602.0, &big), [warning]);
}

#[test]
fn a_follower_records_no_too_many_references_event() {
    let mut t = Test::follower(WatcherConfig {
        max_references: 0,
        ..config()
    });
    let big = deployment(NS, "big", &[("configMap", "a")]);
    assert_eq!(t.start(&[(NS, true)], &[], &[&big]), listed());
}

// ----- namespaces opting in -----

#[test]
fn a_namespace_opting_in_is_listed_then_its_changes_touch_with_every_reference() {
    let mut t = Test::leader(config());
    let uses = [("configMap", "app-env"), ("secret", "db")];
    let web = deployment("late", "web", &uses);
    let app_env_late = |level| config_map("late", "app-env", &[("LOG_LEVEL", level)]);
    let db = secret("late", "db", &[("password", "one")]);
    let effects = t.start(
        &[(NS, true), ("late", false)],
        &[app_env_late("info"), db.clone()],
        &[&web],
    );
    assert_eq!(effects, listed());
    assert!(
        t.metrics
            .encode()
            .contains("confighash_watched_objects{kind=\"Secret\"} 0"),
        "left out while not opted in"
    );

    assert_eq!(
        t.namespace(1.0, "late", true),
        [Effect::Backfill {
            namespace: "late".to_owned(),
            generation: 1
        }]
    );
    // A change seen on the watch during the list: its window closes before the list is in.
    t.config(2.0, app_env_late("debug"));
    assert_eq!(t.wake(7.0), [], "decided once the list is in");

    // The list (older than the watch for app-env) arrives.
    let source = || ConfigSource::Backfill {
        namespace: "late".to_owned(),
        generation: 1,
    };
    for (key, stored) in [app_env_late("info"), db.clone()] {
        let applied = Watched::Applied(key, Some(stored));
        assert_eq!(t.feed(8.0, Input::Config(source(), applied)), []);
    }
    let all = HashSet::from([app_env_late("info").0, db.0.clone()]);
    let stamp = t.expected(&web);
    assert_eq!(
        t.feed(8.0, Input::Config(source(), Watched::Relisted(all))),
        [
            Effect::ReleaseMemory,
            touch(&web, &stamp, APP_ENV_CHANGED, 0)
        ],
        "the stamp covers the Secret too, which did not change"
    );
}

#[test]
fn a_list_of_an_earlier_opt_in_is_dropped() {
    let mut t = Test::leader(config());
    t.start(&[("late", false)], &[], &[]);
    t.namespace(1.0, "late", true);
    t.namespace(2.0, "late", false);
    assert_eq!(
        t.namespace(3.0, "late", true),
        [Effect::Backfill {
            namespace: "late".to_owned(),
            generation: 2
        }]
    );
    let old = ConfigSource::Backfill {
        namespace: "late".to_owned(),
        generation: 1,
    };
    let (key, stored) = config_map("late", "app-env", &[]);
    let applied = Watched::Applied(key.clone(), Some(stored));
    assert_eq!(t.feed(4.0, Input::Config(old.clone(), applied)), []);
    let relisted = Watched::Relisted(HashSet::from([key]));
    assert_eq!(t.feed(4.0, Input::Config(old, relisted)), []);
    assert!(
        t.metrics
            .encode()
            .contains("confighash_watched_objects{kind=\"ConfigMap\"} 0")
    );
}

#[test]
fn a_change_made_while_opted_out_touches_once_when_the_namespace_opts_back_in() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.namespace(1.0, NS, false);
    assert_eq!(t.config(2.0, app_env("debug")), [], "not kept meanwhile");
    assert_eq!(t.wake(7.0), []);

    let backfill = Effect::Backfill {
        namespace: NS.to_owned(),
        generation: 1,
    };
    assert_eq!(t.namespace(8.0, NS, true), [backfill]);
    let source = || ConfigSource::Backfill {
        namespace: NS.to_owned(),
        generation: 1,
    };
    let (key, stored) = app_env("debug");
    let applied = Watched::Applied(key.clone(), Some(stored));
    t.feed(9.0, Input::Config(source(), applied));
    let relisted = Watched::Relisted(HashSet::from([key]));
    assert_eq!(
        t.feed(9.0, Input::Config(source(), relisted)),
        [Effect::ReleaseMemory]
    );
    assert_eq!(t.next_wake(), Some(14.0), "compared a window later");
    let stamp = t.expected(&web);
    assert_eq!(t.wake(14.0), [touch(&web, &stamp, STALE_WHY, 0)]);
}

#[test]
fn a_namespace_seen_for_the_first_time_is_compared_a_window_later() {
    let mut t = Test::leader(config());
    t.start(&[], &[], &[]);
    let stale = deployment("new", "web", &[]).stamped("v2:00000000:other-key");
    let uses = [("configMap", "app-env")];
    let web = deployment("new", "api", &uses);
    let old_stamp = t.expected(&web);
    let web = web.stamped(&old_stamp);
    t.config(1.0, config_map("new", "app-env", &[("A", "1")]));
    t.workload(1.0, &stale);
    t.workload(1.0, &web);
    assert_eq!(t.namespace(2.0, "new", true), []);
    assert_eq!(t.next_wake(), Some(7.0));
    let stamp = t.expected(&web);
    assert_eq!(
        t.wake(7.0),
        [touch(&web, &stamp, STALE_WHY, 0)],
        "the foreign stamp is left alone"
    );
}

// ----- the key -----

#[test]
fn a_replaced_key_touches_nothing_until_a_real_change() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    let old = web.stamp.clone();
    t.key = Arc::new(key_b());
    assert_eq!(t.feed(1.0, Input::Key(t.key.clone())), []);
    assert_eq!(t.wake(600.0), [], "reconcile leaves the foreign stamp");
    assert_eq!(t.feed(601.0, Input::Leader(false)), []);
    assert_eq!(
        t.feed(602.0, Input::Leader(true)),
        [],
        "as does a new leader"
    );

    t.config(603.0, app_env("debug"));
    let stamp = t.expected(&web);
    assert!(stamp.starts_with(&format!("v2:{}:", key_b().id())));
    assert_eq!(t.wake(608.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);
    // The webhook kept the foreign stamp: the retry is still a config change and replaces it.
    assert_eq!(t.touched(608.1, &web, TouchResult::Patched(old)), []);
    assert_eq!(t.wake(613.0), [touch(&web, &stamp, APP_ENV_CHANGED, 1)]);
}

// ----- Events -----

#[test]
fn an_on_delete_workload_is_told_its_pods_do_not_roll() {
    let mut t = Test::leader(config());
    let app = app_env("info");
    t.cluster.insert(app.0.clone(), app.1.clone());
    let mut db = deployment(NS, "db", &[("configMap", "app-env")]);
    db.kind = WorkloadKind::StatefulSet;
    db.on_delete = true;
    let db = db.clone().stamped(&t.expected(&db));
    t.start(&[(NS, true)], &[app], &[&db]);
    t.config(1.0, app_env("debug"));
    let stamp = t.expected(&db);
    assert_eq!(t.wake(6.0), [touch(&db, &stamp, APP_ENV_CHANGED, 0)]);
    let note = "ConfigMap app-env changed; the pod template was re-stamped, but pods will not \
                roll by themselves (OnDelete update strategy or paused): delete or resume them to \
                apply the new config";
    assert_eq!(
        t.touched(6.1, &db, TouchResult::Patched(Some(stamp))),
        [event(
            &db,
            EventType::Warning,
            CONFIG_CHANGED_REASON,
            "Restamp",
            note
        )]
    );
}

// ----- workloads that bypassed the webhook -----

#[test]
fn a_workload_created_past_the_webhook_is_counted_once() {
    let mut t = Test::leader(config());
    t.start(&[(NS, true)], &[], &[]);
    let created = |w: W, seconds| W {
        created: Some(wall0() + Duration::from_secs(seconds)),
        ..w
    };
    let early = created(deployment(NS, "early", &[]), 20);
    assert_eq!(t.workload(20.0, &early), []);
    assert_eq!(t.metrics.workloads_bypassed(), 0, "within the grace");

    let web = created(deployment(NS, "web", &[]), 40);
    t.workload(40.0, &web);
    t.workload(41.0, &web);
    assert_eq!(t.metrics.workloads_bypassed(), 1, "each workload once");
    let stamped = created(deployment(NS, "stamped", &[]), 40).stamped("v2:x:y");
    let mut opted_out = created(deployment(NS, "opted-out", &[]), 40);
    opted_out.labels = json!({ENABLED_LABEL: "false"});
    let other = created(deployment("other", "web", &[]), 40);
    for w in [&stamped, &opted_out, &other] {
        t.workload(42.0, w);
    }
    assert_eq!(t.metrics.workloads_bypassed(), 1);

    // The same name again is another workload (another uid).
    let again = W {
        uid: "uid-web-2".to_owned(),
        ..web
    };
    t.workload(50.0, &again);
    assert_eq!(t.metrics.workloads_bypassed(), 2);

    // A namespace that opts in later: its grace starts then.
    t.namespace(100.0, "later", true);
    t.workload(110.0, &created(deployment("later", "a", &[]), 110));
    assert_eq!(t.metrics.workloads_bypassed(), 2);
    t.workload(131.0, &created(deployment("later", "b", &[]), 131));
    assert_eq!(t.metrics.workloads_bypassed(), 3);
}

// ----- text -----

#[test]
fn retry_delays_read_as_people_write_them() {
    assert_eq!(format_delay(Duration::from_millis(200)), "200ms");
    assert_eq!(format_delay(Duration::ZERO), "1ms");
    assert_eq!(format_delay(Duration::from_millis(40_400)), "40s");
    assert_eq!(format_delay(Duration::from_secs(600)), "10m");
}

#[test]
fn changed_names_stay_short() {
    let key = |kind, name: &str| ("shop".to_owned(), ObjectRef::new(kind, name.to_owned()));
    let one = BTreeSet::from([key(ObjectKind::ConfigMap, "app-env")]);
    assert_eq!(changed_names(&one), "ConfigMap app-env changed");
    let many: BTreeSet<ConfigKey> = (0..5)
        .map(|i| key(ObjectKind::Secret, &format!("s{i}")))
        .collect();
    assert_eq!(
        changed_names(&many),
        "Secret s0, Secret s1, Secret s2 and 2 more changed"
    );
}

#[test]
fn unix_seconds_are_whole_seconds_rounded_down() {
    let t = SystemTime::UNIX_EPOCH + Duration::from_millis(10_900);
    assert_eq!(unix_seconds(t), 10);
    assert_eq!(unix_seconds(SystemTime::UNIX_EPOCH), 0);
}

/// The touch's response (the workload as stored after it) reaches the state machine before the
/// watch delivers the touch's own event; the watch, behind, may first deliver an older state of
/// the workload. That older state must not bring the old stamp back, or the next decision would
/// touch the workload again for a stamp it already carries: a write that rolls nothing and an
/// Event that says it did.
#[test]
fn a_watch_event_older_than_a_touchs_response_does_not_bring_the_old_stamp_back() {
    let mut t = Test::leader(config());
    let web = shop(&mut t).generation(1);
    assert_eq!(t.workload(0.5, &web), []);
    let before = web.clone();
    assert_eq!(t.config(1.0, app_env("debug")), []);
    let stamp = t.expected(&web);
    assert_eq!(t.wake(6.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);

    let web = web.stamped(&stamp).generation(2);
    assert_eq!(
        t.workload(6.1, &web),
        [],
        "the response, fed as the workload"
    );
    assert_eq!(
        t.touched(6.1, &web, TouchResult::Patched(Some(stamp.clone()))),
        [config_changed(&web, APP_ENV_CHANGED)]
    );
    assert_eq!(t.workload(6.2, &before), [], "an older state, late");
    assert_eq!(
        t.next_wake(),
        Some(600.0),
        "nothing to do: its stamp is right"
    );
    assert_eq!(t.wake(20.0), []);
    assert_eq!(t.workload(6.3, &web), [], "the touch's own event");
    assert_eq!(t.metrics.touches("touched"), 1);

    // A newer generation is taken as usual: someone put the old stamp back.
    let old_stamp = before.stamp.clone().unwrap();
    let restamped = web.clone().stamped(&old_stamp).generation(3);
    assert_eq!(t.workload(21.0, &restamped), []);
    assert_eq!(
        t.next_wake(),
        Some(26.0),
        "a stale stamp is checked a window later"
    );
}

// ----- workloads opted in by their label -----

/// `w` labelled `confighash.dev/enabled=value`.
fn enabled(w: W, value: &str) -> W {
    W {
        labels: json!({ENABLED_LABEL: value}),
        ..w
    }
}

/// The list of `namespace`'s ConfigMaps and Secrets (an [`Effect::Backfill`] of `generation`)
/// comes back with what the cluster has: the effects of its end.
fn list_namespace(t: &mut Test, seconds: f64, namespace: &str, generation: u64) -> Vec<Effect> {
    let source = || ConfigSource::Backfill {
        namespace: namespace.to_owned(),
        generation,
    };
    let objects: Vec<(ConfigKey, StoredConfig)> = t
        .cluster
        .iter()
        .filter(|(k, _)| k.0 == namespace)
        .map(|(k, s)| (k.clone(), s.clone()))
        .collect();
    for (key, stored) in objects.clone() {
        let applied = Watched::Applied(key, Some(stored));
        assert_eq!(t.feed(seconds, Input::Config(source(), applied)), []);
    }
    let all = objects.into_iter().map(|(k, _)| k).collect();
    t.feed(seconds, Input::Config(source(), Watched::Relisted(all)))
}

fn backfill(namespace: &str, generation: u64) -> Effect {
    Effect::Backfill {
        namespace: namespace.to_owned(),
        generation,
    }
}

fn kept_config_maps(t: &Test) -> usize {
    t.state.configs.count(ObjectKind::ConfigMap)
}

const PLAIN: &str = "plain";

fn plain_app_env(level: &str) -> (ConfigKey, StoredConfig) {
    config_map(PLAIN, "app-env", &[("LOG_LEVEL", level)])
}

/// `plain`, not opted in, listed before its workloads: `web` (labelled true) and `other` (not
/// labelled) use `app-env`, both stamped. The first labelled workload has the namespace's
/// objects listed; returns (web, other) once the list is in.
fn plain(t: &mut Test) -> (W, W) {
    let (key, stored) = plain_app_env("info");
    t.cluster.insert(key, stored);
    let uses = [("configMap", "app-env")];
    let web = enabled(deployment(PLAIN, "web", &uses), "true");
    let web = web.clone().stamped(&t.expected(&web));
    let other = deployment(PLAIN, "other", &uses);
    let other = other.clone().stamped(&t.expected(&other));
    let effects = t.start(&[(PLAIN, false)], &[plain_app_env("info")], &[&web, &other]);
    let mut expected = listed();
    expected.push(backfill(PLAIN, 1));
    assert_eq!(effects, expected, "its objects were left out: listed");
    assert_eq!(kept_config_maps(t), 0);
    assert_eq!(
        list_namespace(t, 0.5, PLAIN, 1),
        [Effect::ReleaseMemory],
        "both stamps are current"
    );
    assert_eq!(kept_config_maps(t), 1);
    (web, other)
}

#[test]
fn a_workload_labelled_true_in_a_plain_namespace_rolls_and_its_neighbour_does_not() {
    let mut t = Test::leader(config());
    let (web, other) = plain(&mut t);

    assert_eq!(t.config(1.0, plain_app_env("debug")), []);
    let stamp = t.expected(&web);
    assert_eq!(t.wake(6.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);
    let web = web.stamped(&stamp);
    assert_eq!(
        t.touched(6.1, &web, TouchResult::Patched(Some(stamp.clone()))),
        [config_changed(&web, APP_ENV_CHANGED)]
    );
    assert_eq!(t.workload(6.2, &web), []);
    // Reconcile leaves the unlabelled one alone too, stale as it is.
    assert_ne!(other.stamp, Some(t.expected(&other)));
    assert_eq!(t.wake(600.0), []);
    assert_eq!(t.metrics.touches("touched"), 1);
}

#[test]
fn a_labelled_workload_seen_before_its_namespace_keeps_the_objects_without_a_list() {
    let mut t = Test::leader(config());
    t.start(&[], &[], &[]);
    let uses = [("configMap", "app-env")];
    assert_eq!(t.config(1.0, plain_app_env("info")), []);
    let web = enabled(deployment(PLAIN, "web", &uses), "true");
    let web = web.clone().stamped(&t.expected(&web));
    let other = deployment(PLAIN, "other", &uses);
    let other = other.clone().stamped(&t.expected(&other));
    assert_eq!(t.workload(1.0, &web), []);
    assert_eq!(t.workload(1.0, &other), []);

    // The Namespace comes later and is not opted in: the objects stay, for `web`.
    assert_eq!(t.namespace(2.0, PLAIN, false), []);
    assert_eq!(kept_config_maps(&t), 1);
    assert_eq!(t.config(3.0, plain_app_env("debug")), []);
    let stamp = t.expected(&web);
    assert_eq!(t.wake(8.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);
}

#[test]
fn the_last_labelled_workload_going_drops_the_objects_and_relabelling_lists_them_again() {
    let mut t = Test::leader(config());
    let (web, other) = plain(&mut t);

    // Relabelled (the label removed): nothing there is handled, nothing of it is kept.
    let unlabelled = W {
        labels: json!({}),
        ..web.clone()
    };
    assert_eq!(t.workload(1.0, &unlabelled), []);
    assert_eq!(kept_config_maps(&t), 0);
    assert_eq!(t.config(2.0, plain_app_env("debug")), []);
    assert_eq!(t.wake(7.0), []);

    // Labelled true again: listed again, and compared once the list is in (the change made
    // meanwhile makes its stamp stale).
    assert_eq!(t.workload(8.0, &web), [backfill(PLAIN, 2)]);
    assert_eq!(t.wake(20.0), [], "not decided before the list is in");
    assert_eq!(
        list_namespace(&mut t, 21.0, PLAIN, 2),
        [Effect::ReleaseMemory]
    );
    assert_eq!(t.next_wake(), Some(26.0), "compared a window later");
    let stamp = t.expected(&web);
    assert_eq!(t.wake(26.0), [touch(&web, &stamp, STALE_WHY, 0)]);
    let web = web.stamped(&stamp);
    t.touched(26.1, &web, TouchResult::Patched(Some(stamp)));
    t.workload(26.2, &web);

    // Labelled false: opted out, and nothing is kept.
    assert_eq!(t.workload(30.0, &enabled(web.clone(), "false")), []);
    assert_eq!(kept_config_maps(&t), 0);
    assert_eq!(t.workload(31.0, &web), [backfill(PLAIN, 3)]);
    assert_eq!(
        list_namespace(&mut t, 32.0, PLAIN, 3),
        [Effect::ReleaseMemory]
    );
    assert_eq!(kept_config_maps(&t), 1);

    // Deleted: the same.
    let deleted = Watched::Deleted(web.key());
    assert_eq!(t.feed(33.0, Input::Workload(web.kind, deleted)), []);
    assert_eq!(kept_config_maps(&t), 0);
    assert_eq!(t.config(34.0, plain_app_env("trace")), []);
    assert_eq!(t.wake(40.0), []);
    assert_eq!(t.wake(700.0), [], "{other:?} is never touched");
}

#[test]
fn a_list_for_a_labelled_workload_that_lost_its_label_meanwhile_is_dropped() {
    let mut t = Test::leader(config());
    let uses = [("configMap", "app-env")];
    let web = enabled(deployment(PLAIN, "web", &uses), "true");
    let effects = t.start(&[(PLAIN, false)], &[plain_app_env("info")], &[&web]);
    assert!(effects.contains(&backfill(PLAIN, 1)), "{effects:?}");
    let unlabelled = W {
        labels: json!({}),
        ..web.clone()
    };
    assert_eq!(t.workload(1.0, &unlabelled), []);
    assert_eq!(list_namespace(&mut t, 2.0, PLAIN, 1), []);
    assert_eq!(kept_config_maps(&t), 0);
}

#[test]
fn a_namespace_opting_out_keeps_the_objects_its_labelled_workloads_use() {
    let mut t = Test::leader(config());
    let (key, stored) = app_env("info");
    t.cluster.insert(key, stored);
    let uses = [("configMap", "app-env")];
    let web = enabled(deployment(NS, "web", &uses), "true");
    let web = web.clone().stamped(&t.expected(&web));
    let api = deployment(NS, "api", &uses);
    let api = api.clone().stamped(&t.expected(&api));
    assert_eq!(
        t.start(&[(NS, true)], &[app_env("info")], &[&web, &api]),
        listed()
    );

    assert_eq!(t.namespace(1.0, NS, false), []);
    assert_eq!(kept_config_maps(&t), 1, "kept for web");
    assert_eq!(t.config(2.0, app_env("debug")), []);
    let stamp = t.expected(&web);
    assert_eq!(
        t.wake(7.0),
        [touch(&web, &stamp, APP_ENV_CHANGED, 0)],
        "web only"
    );
    let web = web.stamped(&stamp);
    t.touched(7.1, &web, TouchResult::Patched(Some(stamp)));
    assert_eq!(t.workload(7.2, &web), []);

    // Opting back in lists nothing (its objects were kept); api, stale since, is compared a
    // window later.
    assert_eq!(t.namespace(10.0, NS, true), []);
    assert_eq!(t.next_wake(), Some(15.0));
    let stamp = t.expected(&api);
    assert_eq!(t.wake(15.0), [touch(&api, &stamp, STALE_WHY, 0)]);
}

#[test]
fn a_namespace_opting_in_while_its_objects_are_listed_for_a_labelled_workload_waits_for_the_list() {
    let mut t = Test::leader(config());
    let (key, stored) = plain_app_env("info");
    t.cluster.insert(key, stored);
    let uses = [("configMap", "app-env")];
    let web = enabled(deployment(PLAIN, "web", &uses), "true");
    let web = web.clone().stamped(&t.expected(&web));
    let other = deployment(PLAIN, "other", &uses);
    let other = other.clone().stamped(&t.expected(&other));
    let effects = t.start(&[(PLAIN, false)], &[plain_app_env("info")], &[&web, &other]);
    assert!(effects.contains(&backfill(PLAIN, 1)), "{effects:?}");

    assert_eq!(
        t.namespace(1.0, PLAIN, true),
        [],
        "the list in progress serves"
    );
    assert_eq!(t.config(2.0, plain_app_env("debug")), []);
    assert_eq!(t.wake(7.0), [], "decided once the list is in");
    let web_stamp = t.expected(&web);
    let other_stamp = t.expected(&other);
    assert_eq!(
        list_namespace(&mut t, 8.0, PLAIN, 1),
        [
            Effect::ReleaseMemory,
            touch(&other, &other_stamp, APP_ENV_CHANGED, 0),
            touch(&web, &web_stamp, APP_ENV_CHANGED, 0),
        ]
    );
}

#[test]
fn a_namespace_opting_in_and_out_while_listed_for_a_labelled_workload_keeps_the_list() {
    let mut t = Test::leader(config());
    let (key, stored) = plain_app_env("info");
    t.cluster.insert(key, stored);
    let uses = [("configMap", "app-env")];
    let web = enabled(deployment(PLAIN, "web", &uses), "true");
    let web = web.clone().stamped(&t.expected(&web));
    let other = deployment(PLAIN, "other", &uses);
    let other = other.clone().stamped(&t.expected(&other));
    t.start(&[(PLAIN, false)], &[plain_app_env("info")], &[&web, &other]);

    assert_eq!(t.namespace(1.0, PLAIN, true), []);
    assert_eq!(t.namespace(2.0, PLAIN, false), []);
    assert_eq!(t.config(3.0, plain_app_env("debug")), []);
    assert_eq!(t.wake(8.0), []);
    let stamp = t.expected(&web);
    assert_eq!(
        list_namespace(&mut t, 9.0, PLAIN, 1),
        [
            Effect::ReleaseMemory,
            touch(&web, &stamp, APP_ENV_CHANGED, 0)
        ],
        "web only: the namespace is not opted in"
    );
}

#[test]
fn a_workload_labelled_true_in_an_excluded_namespace_is_left_alone() {
    let mut t = Test::leader(config());
    let uses = [("configMap", "app-env")];
    let dns = enabled(deployment("kube-system", "dns", &uses), "true").stamped("v2:00000000:stale");
    let cm = |v| config_map("kube-system", "app-env", &[("A", v)]);
    assert_eq!(
        t.start(&[("kube-system", false)], &[cm("1")], &[&dns]),
        listed(),
        "nothing listed"
    );
    assert_eq!(kept_config_maps(&t), 0);
    assert_eq!(t.config(1.0, cm("2")), []);
    assert_eq!(t.wake(6.0), []);
    assert_eq!(t.wake(600.0), []);
}

#[test]
fn a_workload_created_labelled_true_past_the_webhook_is_counted() {
    let mut t = Test::leader(config());
    t.start(&[(PLAIN, false)], &[], &[]);
    let created = |w: W, seconds| W {
        created: Some(wall0() + Duration::from_secs(seconds)),
        ..w
    };
    let early = enabled(created(deployment(PLAIN, "early", &[]), 20), "true");
    t.workload(20.0, &early);
    assert_eq!(t.metrics.workloads_bypassed(), 0, "within the grace");

    let web = enabled(created(deployment(PLAIN, "web", &[]), 40), "true");
    t.workload(40.0, &web);
    t.workload(41.0, &web);
    assert_eq!(t.metrics.workloads_bypassed(), 1, "once");

    // Created without the label, labelled later: the write that added it was sent to the
    // webhook, which leaves a workload never stamped as it is.
    let later = created(deployment(PLAIN, "later", &[]), 40);
    t.workload(40.0, &later);
    t.workload(50.0, &enabled(later, "true"));
    assert_eq!(t.metrics.workloads_bypassed(), 1);

    // In a namespace not opted in, without the label: not confighash's.
    t.workload(60.0, &created(deployment(PLAIN, "plain", &[]), 60));
    assert_eq!(t.metrics.workloads_bypassed(), 1);
}

// ----- how each rollout ended -----

/// `w` as its watch reports it once its controller wrote `status` for `generation`.
fn with_status(t: &mut Test, seconds: f64, w: &W, generation: i64, status: Value) -> Vec<Effect> {
    let mut obj = w.object();
    obj["metadata"]["generation"] = json!(generation);
    obj["status"] = status;
    let entry = WorkloadEntry::from_object_within(w.kind, &obj, t.max_references).unwrap();
    t.feed(
        seconds,
        Input::Workload(w.kind, Watched::Applied(w.key(), entry)),
    )
}

/// What each kind's controller reports of a rollout of generation 2 that is not done, and done.
fn statuses(kind: WorkloadKind) -> (Value, Value) {
    match kind {
        WorkloadKind::Deployment => (
            json!({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 1,
                   "availableReplicas": 1}),
            json!({"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1,
                   "availableReplicas": 1}),
        ),
        WorkloadKind::StatefulSet => (
            json!({"observedGeneration": 2, "replicas": 1, "readyReplicas": 1,
                   "updatedReplicas": 0, "currentRevision": "r1", "updateRevision": "r2"}),
            json!({"observedGeneration": 2, "replicas": 1, "readyReplicas": 1,
                   "updatedReplicas": 1, "currentRevision": "r2", "updateRevision": "r2"}),
        ),
        WorkloadKind::DaemonSet => (
            json!({"observedGeneration": 2, "desiredNumberScheduled": 3,
                   "updatedNumberScheduled": 2, "numberAvailable": 3}),
            json!({"observedGeneration": 2, "desiredNumberScheduled": 3,
                   "updatedNumberScheduled": 3, "numberAvailable": 3}),
        ),
        WorkloadKind::Rollout => (
            json!({"observedGeneration": "2", "phase": "Progressing"}),
            json!({"observedGeneration": "2", "phase": "Healthy"}),
        ),
        WorkloadKind::CronJob => (json!({}), json!({})),
    }
}

fn rollout_complete(w: &W, note: &str) -> Effect {
    event(
        w,
        EventType::Normal,
        ROLLOUT_COMPLETE_REASON,
        "Rollout",
        note,
    )
}

fn rollout_stalled(w: &W, note: &str) -> Effect {
    event(
        w,
        EventType::Warning,
        ROLLOUT_STALLED_REASON,
        "Rollout",
        note,
    )
}

/// `shop` opted in with ConfigMaps `app-env` and `app-flags` and `w`, stamped, using them.
fn shop_with(t: &mut Test, w: W) -> W {
    let configs = [app_env("info"), config_map(NS, "app-flags", &[("F", "1")])];
    for (k, s) in &configs {
        t.cluster.insert(k.clone(), s.clone());
    }
    let w = w.clone().stamped(&t.expected(&w));
    assert_eq!(t.start(&[(NS, true)], &configs, &[&w]), listed());
    w
}

/// A workload of `kind` named `web`, using `app-env` and `app-flags`.
fn web_of(kind: WorkloadKind) -> W {
    W {
        kind,
        ..deployment(
            NS,
            "web",
            &[("configMap", "app-env"), ("configMap", "app-flags")],
        )
    }
}

/// `app-env` changes at `at`; its window closes and the touch of `w` takes a tenth of a second
/// later. `w` with its new stamp.
fn change_and_touch(t: &mut Test, w: &W, at: f64) -> W {
    assert_eq!(t.config(at, app_env(&format!("level-{at}"))), []);
    let stamp = t.expected(w);
    assert_eq!(t.wake(at + 5.0), [touch(w, &stamp, APP_ENV_CHANGED, 0)]);
    assert_eq!(
        t.touched(at + 5.1, w, TouchResult::Patched(Some(stamp.clone()))),
        [config_changed(w, APP_ENV_CHANGED)]
    );
    w.clone().stamped(&stamp)
}

/// The value of a series with labels, as the text format writes it.
fn series(t: &Test, name: &str) -> f64 {
    t.metrics
        .encode()
        .lines()
        .find_map(|line| {
            let (n, v) = line.rsplit_once(' ')?;
            (n == name).then(|| v.trim().parse::<f64>().ok())?
        })
        .unwrap_or(0.0)
}

#[test]
fn a_deployment_rollout_is_reported_complete_with_how_long_it_took() {
    let mut t = Test::leader(config());
    let old = shop_with(&mut t, web_of(WorkloadKind::Deployment));
    let web = change_and_touch(&mut t, &old, 1.0);
    assert_eq!(t.metrics.rollouts_followed(), 1);
    let (rolling, done) = statuses(WorkloadKind::Deployment);

    // An event from before the touch (its stamp the old one) comes after the touch's result:
    // older, whatever its status says.
    assert_eq!(with_status(&mut t, 6.2, &old, 1, done.clone()), []);
    // The touch's own write: a new generation, not observed yet.
    assert_eq!(with_status(&mut t, 6.3, &web, 2, json!({})), []);
    assert_eq!(with_status(&mut t, 20.0, &web, 2, rolling), []);
    assert_eq!(t.metrics.rollouts_followed(), 1);
    assert_eq!(
        with_status(&mut t, 47.0, &web, 2, done.clone()),
        [rollout_complete(
            &web,
            "pods now run the config of ConfigMap app-env, changed 46s earlier"
        )]
    );
    assert_eq!(t.metrics.rollouts_followed(), 0);
    assert_eq!(t.metrics.rollout_outcomes("complete"), 1);
    assert_eq!(
        t.metric("confighash_config_change_to_rollout_complete_seconds_count"),
        1.0
    );
    assert_eq!(
        t.metric("confighash_config_change_to_rollout_complete_seconds_sum"),
        46.0
    );
    // Once.
    assert_eq!(with_status(&mut t, 48.0, &web, 2, done), []);
    assert_eq!(t.next_wake(), Some(600.0));
}

#[test]
fn every_kind_with_a_rollout_is_reported_complete_by_its_own_status() {
    for kind in [
        WorkloadKind::StatefulSet,
        WorkloadKind::DaemonSet,
        WorkloadKind::Rollout,
    ] {
        let mut t = Test::leader(config());
        let old = shop_with(&mut t, web_of(kind));
        let web = change_and_touch(&mut t, &old, 1.0);
        let (rolling, done) = statuses(kind);
        assert_eq!(with_status(&mut t, 6.3, &web, 2, rolling), [], "{kind}");
        // Done, but for the generation before the touch: not yet.
        let mut stale = done.clone();
        stale["observedGeneration"] = if kind == WorkloadKind::Rollout {
            json!("1")
        } else {
            json!(1)
        };
        assert_eq!(with_status(&mut t, 7.0, &web, 2, stale), [], "{kind}");
        assert_eq!(
            with_status(&mut t, 31.0, &web, 2, done),
            [rollout_complete(
                &web,
                "pods now run the config of ConfigMap app-env, changed 30s earlier"
            )],
            "{kind}"
        );
        assert_eq!(t.metrics.rollout_outcomes("complete"), 1, "{kind}");
    }
}

#[test]
fn a_rollout_done_before_the_touch_result_is_reported_with_it() {
    let mut t = Test::leader(config());
    let old = shop_with(&mut t, web_of(WorkloadKind::Deployment));
    t.config(1.0, app_env("debug"));
    let stamp = t.expected(&old);
    assert_eq!(t.wake(6.0), [touch(&old, &stamp, APP_ENV_CHANGED, 0)]);
    let web = old.stamped(&stamp);
    // The write and the controller's whole rollout show on the watch before the result.
    let (_, done) = statuses(WorkloadKind::Deployment);
    assert_eq!(with_status(&mut t, 6.5, &web, 2, done), []);
    assert_eq!(
        t.touched(9.0, &web, TouchResult::Patched(Some(stamp))),
        [
            config_changed(&web, APP_ENV_CHANGED),
            rollout_complete(
                &web,
                "pods now run the config of ConfigMap app-env, changed 8s earlier"
            )
        ]
    );
    assert_eq!(t.metrics.rollouts_followed(), 0);
}

#[test]
fn a_deployment_past_its_progress_deadline_is_reported_stalled() {
    let mut t = Test::leader(config());
    let old = shop_with(&mut t, web_of(WorkloadKind::Deployment));
    let web = change_and_touch(&mut t, &old, 1.0);
    let stalled = json!({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 1,
        "availableReplicas": 1, "conditions": [
            {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
            {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
             "message": "ReplicaSet \"web-7d9\" has timed out progressing."}]});
    assert_eq!(
        with_status(&mut t, 121.0, &web, 2, stalled.clone()),
        [rollout_stalled(
            &web,
            "the rollout of the config of ConfigMap app-env (changed 2m earlier) stalled: it \
             exceeded its progress deadline (ProgressDeadlineExceeded); pods may still run the \
             previous config (kubectl rollout status shows where it stands)"
        )]
    );
    assert_eq!(t.metrics.rollout_outcomes("stalled"), 1);
    assert_eq!(
        series(&t, "confighash_rollouts_total{outcome=\"stalled\"}"),
        1.0
    );
    assert_eq!(t.metrics.rollouts_followed(), 0, "no longer followed");
    assert_eq!(with_status(&mut t, 122.0, &web, 2, stalled), []);
}

#[test]
fn a_stateful_set_or_daemon_set_not_done_within_the_rollout_timeout_is_reported_stalled() {
    for kind in [WorkloadKind::StatefulSet, WorkloadKind::DaemonSet] {
        let mut t = Test::leader(WatcherConfig {
            rollout_timeout: Duration::from_secs(300),
            ..config()
        });
        let old = shop_with(&mut t, web_of(kind));
        let web = change_and_touch(&mut t, &old, 1.0);
        let (rolling, _) = statuses(kind);
        assert_eq!(with_status(&mut t, 100.0, &web, 2, rolling), []);
        assert_eq!(
            t.next_wake(),
            Some(306.1),
            "{kind}: the timeout after the touch"
        );
        assert_eq!(t.wake(306.0), [], "{kind}");
        assert_eq!(
            t.wake(306.1),
            [rollout_stalled(
                &web,
                "the rollout of the config of ConfigMap app-env (changed 5m 5s earlier) stalled: \
                 it is not complete 5m after the touch (--rollout-timeout); pods may still run \
                 the previous config (kubectl rollout status shows where it stands)"
            )],
            "{kind}"
        );
        assert_eq!(t.next_wake(), Some(600.0), "{kind}");
        assert_eq!(t.metrics.rollouts_followed(), 0, "{kind}");
    }
}

#[test]
fn a_degraded_argo_rollout_is_reported_stalled() {
    let mut t = Test::leader(config());
    let old = shop_with(&mut t, web_of(WorkloadKind::Rollout));
    let web = change_and_touch(&mut t, &old, 1.0);
    assert_eq!(
        with_status(
            &mut t,
            61.0,
            &web,
            2,
            json!({"observedGeneration": "2", "phase": "Degraded"})
        ),
        [rollout_stalled(
            &web,
            "the rollout of the config of ConfigMap app-env (changed 1m earlier) stalled: the \
             Argo Rollout is Degraded; pods may still run the previous config (kubectl rollout \
             status shows where it stands)"
        )]
    );
}

#[test]
fn a_deployment_whose_controller_reports_nothing_is_let_go_after_a_day() {
    let mut t = Test::leader(WatcherConfig {
        resync: FOLLOW_AT_MOST * 2,
        ..config()
    });
    let old = shop_with(&mut t, web_of(WorkloadKind::Deployment));
    change_and_touch(&mut t, &old, 1.0);
    let deadline = 6.1 + FOLLOW_AT_MOST.as_secs_f64();
    assert_eq!(t.next_wake(), Some(deadline));
    assert_eq!(t.wake(deadline), [], "no Event");
    assert_eq!(t.metrics.rollout_outcomes("abandoned"), 1);
    assert_eq!(t.metrics.rollouts_followed(), 0);
}

#[test]
fn a_workload_deleted_mid_rollout_is_let_go_without_an_event() {
    for kind in [WorkloadKind::Deployment, WorkloadKind::StatefulSet] {
        let mut t = Test::leader(config());
        let old = shop_with(&mut t, web_of(kind));
        let web = change_and_touch(&mut t, &old, 1.0);
        let (rolling, done) = statuses(kind);
        assert_eq!(with_status(&mut t, 10.0, &web, 2, rolling), []);
        assert_eq!(
            t.feed(20.0, Input::Workload(kind, Watched::Deleted(web.key()))),
            []
        );
        assert_eq!(t.metrics.rollout_outcomes("gone"), 1, "{kind}");
        assert_eq!(t.metrics.rollouts_followed(), 0, "{kind}");
        // One of the same name, created again, is not the one followed.
        let again = W {
            uid: "uid-web-2".to_owned(),
            ..web.clone()
        };
        assert_eq!(with_status(&mut t, 30.0, &again, 1, done), [], "{kind}");
        assert_eq!(t.wake(606.1), [], "{kind}: no timeout either");
    }
}

#[test]
fn a_second_touch_during_a_followed_rollout_replaces_it() {
    let mut t = Test::leader(config());
    let old = shop_with(&mut t, web_of(WorkloadKind::Deployment));
    let first = change_and_touch(&mut t, &old, 1.0);
    let (rolling, done) = statuses(WorkloadKind::Deployment);
    assert_eq!(with_status(&mut t, 6.3, &first, 2, rolling.clone()), []);

    // app-flags changes while the first rollout goes on.
    let flags = config_map(NS, "app-flags", &[("F", "2")]);
    assert_eq!(t.config(10.0, flags), []);
    let stamp = t.expected(&first);
    let why = "ConfigMap app-flags changed";
    assert_eq!(t.wake(15.0), [touch(&first, &stamp, why, 0)]);
    let second = first.clone().stamped(&stamp);
    // The second write shows on the watch before its result: the first rollout is superseded.
    assert_eq!(
        with_status(&mut t, 15.05, &second, 3, json!({"observedGeneration": 2})),
        []
    );
    assert_eq!(t.metrics.rollout_outcomes("superseded"), 1);
    assert_eq!(
        t.touched(15.1, &second, TouchResult::Patched(Some(stamp))),
        [config_changed(&second, why)]
    );
    let _ = done;
    let mut done = statuses(WorkloadKind::Deployment).1;
    done["observedGeneration"] = json!(3);
    assert_eq!(
        with_status(&mut t, 40.0, &second, 3, done),
        [rollout_complete(
            &second,
            "pods now run the config of ConfigMap app-flags, changed 30s earlier"
        )]
    );
    assert_eq!(t.metrics.rollout_outcomes("complete"), 1);
    assert_eq!(t.metrics.rollout_outcomes("superseded"), 1);
}

#[test]
fn a_second_touch_whose_result_comes_first_replaces_it_too() {
    let mut t = Test::leader(config());
    let old = shop_with(&mut t, web_of(WorkloadKind::StatefulSet));
    let first = change_and_touch(&mut t, &old, 1.0);
    let (rolling, done) = statuses(WorkloadKind::StatefulSet);
    assert_eq!(with_status(&mut t, 6.3, &first, 2, rolling.clone()), []);
    let second = change_and_touch(&mut t, &first, 20.0);
    assert_eq!(t.metrics.rollout_outcomes("superseded"), 1);
    // Its write shows on the watch after the result.
    assert_eq!(with_status(&mut t, 25.2, &second, 3, rolling), []);
    assert_eq!(t.metrics.rollouts_followed(), 1);
    // The timeout runs from the second touch.
    assert_eq!(t.next_wake(), Some(600.0));
    assert_eq!(t.wake(600.0), []);
    assert_eq!(t.next_wake(), Some(625.1));
    let mut done = done;
    done["observedGeneration"] = json!(3);
    assert_eq!(
        with_status(&mut t, 30.0, &second, 3, done),
        [rollout_complete(
            &second,
            "pods now run the config of ConfigMap app-env, changed 10s earlier"
        )]
    );
}

#[test]
fn workloads_whose_pods_do_not_roll_by_themselves_are_not_followed() {
    // OnDelete.
    let mut t = Test::leader(config());
    let mut db = web_of(WorkloadKind::StatefulSet);
    db.on_delete = true;
    let db = shop_with(&mut t, db);
    t.config(1.0, app_env("debug"));
    let stamp = t.expected(&db);
    assert_eq!(t.wake(6.0), [touch(&db, &stamp, APP_ENV_CHANGED, 0)]);
    let effects = t.touched(6.1, &db, TouchResult::Patched(Some(stamp.clone())));
    assert!(
        matches!(&effects[..], [Effect::Event(e)] if e.reason == CONFIG_CHANGED_REASON),
        "{effects:?}"
    );
    assert_eq!(t.metrics.rollouts_followed(), 0);
    let (_, done) = statuses(WorkloadKind::StatefulSet);
    assert_eq!(with_status(&mut t, 7.0, &db.stamped(&stamp), 2, done), []);
    assert_eq!(t.wake(606.1), []);

    // A Deployment paused while followed is let go.
    let mut t = Test::leader(config());
    let old = shop_with(&mut t, web_of(WorkloadKind::Deployment));
    let web = change_and_touch(&mut t, &old, 1.0);
    let mut paused = web.object();
    paused["spec"]["paused"] = json!(true);
    let entry = WorkloadEntry::from_object(web.kind, &paused).unwrap();
    assert_eq!(
        t.feed(
            8.0,
            Input::Workload(web.kind, Watched::Applied(web.key(), entry))
        ),
        []
    );
    assert_eq!(t.metrics.rollout_outcomes("abandoned"), 1);
    assert_eq!(t.metrics.rollouts_followed(), 0);
}

#[test]
fn a_touch_of_reconcile_is_not_followed() {
    let mut t = Test::leader(config());
    shop(&mut t);
    let old = deployment(NS, "api", &[("configMap", "api-env")]);
    let old_stamp = t.expected(&old);
    t.config(1.0, config_map(NS, "api-env", &[("A", "1")]));
    let api = old.stamped(&old_stamp);
    t.workload(1.5, &api);
    let stamp = t.expected(&api);
    assert_eq!(t.wake(6.5), [touch(&api, &stamp, STALE_WHY, 0)]);
    t.touched(6.6, &api, TouchResult::Patched(Some(stamp)));
    assert_eq!(t.metrics.rollouts_followed(), 0);
}

#[test]
fn losing_leadership_lets_go_of_followed_rollouts() {
    let mut t = Test::leader(config());
    let old = shop_with(&mut t, web_of(WorkloadKind::StatefulSet));
    let web = change_and_touch(&mut t, &old, 1.0);
    assert_eq!(t.metrics.rollouts_followed(), 1);
    assert_eq!(t.feed(10.0, Input::Leader(false)), []);
    assert_eq!(t.metrics.rollouts_followed(), 0);
    assert_eq!(t.metrics.rollout_outcomes("abandoned"), 1);
    let (_, done) = statuses(WorkloadKind::StatefulSet);
    assert_eq!(with_status(&mut t, 20.0, &web, 2, done.clone()), []);
    // Leading again, it does not know what it followed before.
    assert_eq!(t.feed(30.0, Input::Leader(true)), []);
    assert_eq!(with_status(&mut t, 31.0, &web, 2, done), []);
    assert_eq!(t.wake(606.1), [], "no timeout");

    // A touch whose result comes after leadership was lost is not followed either.
    let mut t = Test::leader(config());
    let old = shop_with(&mut t, web_of(WorkloadKind::Deployment));
    t.config(1.0, app_env("debug"));
    let stamp = t.expected(&old);
    assert_eq!(t.wake(6.0), [touch(&old, &stamp, APP_ENV_CHANGED, 0)]);
    t.feed(6.05, Input::Leader(false));
    t.touched(6.1, &old, TouchResult::Patched(Some(stamp)));
    assert_eq!(t.metrics.rollouts_followed(), 0);
}

#[test]
fn a_namespace_terminating_mid_rollout_lets_go_without_an_event() {
    let mut t = Test::leader(config());
    let old = shop_with(&mut t, web_of(WorkloadKind::DaemonSet));
    change_and_touch(&mut t, &old, 1.0);
    assert_eq!(t.terminate(10.0, NS, true), []);
    assert_eq!(t.metrics.rollout_outcomes("gone"), 1);
    assert_eq!(t.wake(606.1), []);
}

mod dry_run;
mod flap;
mod namespaces;
mod races;

// ----- --max-reference-bytes -----

#[test]
fn references_over_max_reference_bytes_roll_nothing_warn_once_and_roll_once_they_fit() {
    let mut t = Test::leader(WatcherConfig {
        max_reference_bytes: 10,
        ..config()
    });
    let web = shop(&mut t);
    let note = |bytes: u64| {
        format!(
            "its ConfigMaps and Secrets hold {bytes} bytes of values, more than 10 \
             (--max-reference-bytes): confighash keeps its stamp and does not roll it until \
             they shrink"
        )
    };
    let first = web.clone();
    let too_large = |bytes| {
        event(
            &first,
            EventType::Warning,
            REFERENCES_TOO_LARGE_REASON,
            "Skip",
            &note(bytes),
        )
    };
    // Grown past the limit: no touch (the webhook would keep the stamp), one Warning Event.
    let big = "x".repeat(20);
    assert_eq!(t.config(1.0, app_env(&big)), []);
    assert_eq!(t.wake(6.0), [too_large(20)]);
    let bigger = "y".repeat(30);
    assert_eq!(t.config(7.0, app_env(&bigger)), []);
    assert_eq!(t.wake(12.0), [], "one Event while it stays over");
    assert_eq!(t.wake(600.0), [], "reconcile keeps it too");
    // Back under the limit: the content differs from what the stamp was made of, one touch.
    assert_eq!(t.config(601.0, app_env("debug")), []);
    let stamp = t.expected(&web);
    assert_eq!(t.wake(606.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);
    // Over again later: a new Event.
    let web = web.stamped(&stamp);
    t.touched(606.1, &web, TouchResult::Patched(Some(stamp.clone())));
    t.workload(606.2, &web);
    assert_eq!(t.config(700.0, app_env(&big)), []);
    assert_eq!(t.wake(705.0), [too_large(20)]);
}

#[test]
fn a_workload_marked_too_large_is_left_until_it_fits_then_stamped_once() {
    let mut t = Test::leader(WatcherConfig {
        max_reference_bytes: 10,
        ..config()
    });
    let big = app_env(&"x".repeat(20));
    t.cluster.insert(big.0.clone(), big.1.clone());
    let mut marked = deployment(NS, "marked", &[("configMap", "app-env")]);
    marked.annotations = json!({UNSTAMPED_ANNOTATION: "too-large"});
    let effects = t.start(&[(NS, true)], &[big], &[&marked]);
    let mut expected = listed();
    expected.push(event(
        &marked,
        EventType::Warning,
        REFERENCES_TOO_LARGE_REASON,
        "Skip",
        "its ConfigMaps and Secrets hold 20 bytes of values, more than 10 \
         (--max-reference-bytes): confighash keeps its stamp and does not roll it until they \
         shrink",
    ));
    assert_eq!(effects, expected, "reconcile leaves the marker");
    assert_eq!(t.wake(600.0), []);
    // The Secret shrinks without any workload write: the change stamps it.
    assert_eq!(t.config(601.0, app_env("info")), []);
    let stamp = t.expected(&marked);
    assert_eq!(t.wake(606.0), [touch(&marked, &stamp, APP_ENV_CHANGED, 0)]);
}

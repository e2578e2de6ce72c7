//! The security properties SECURITY.md states that no other test covers: what a stamp, the
//! webhook's replies, confighash's logs, Events and metrics reveal about Secret values; that the
//! webhook never serves an unkeyed stamp; that a touch changes nothing but the stamp; that
//! references resolve in the workload's own namespace only; the TLS parameters; the size and time
//! limits of the webhook port; and what the admin port serves.

use crate::build;
use crate::harness;
use crate::support;

use std::io::Write;
use std::net::SocketAddr;
use std::ops::Deref;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use build::{Review, config_map, patch_of, secret, stamp_of};
use confighash::certs::key;
use confighash::core::checksum::{self, ObjectView, RefState, StampKey};
use confighash::core::names::CHECKSUM_ANNOTATION as STAMP;
use confighash::core::refs::ObjectKind;
use confighash::core::workload::{self, Analysis, WorkloadKind};
use confighash::serving::tls::CertStore;
use confighash::webhook::admission::MAX_BODY;
use confighash_testkit::apiserver::TestCerts;
use confighash_testkit::apiserver::https::Reply;
use harness::{Harness, ServeSettings, Served};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams};
use rustls::{CipherSuite, NamedGroup};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The installation's key in the webhook tests below.
const KEY: &[u8] = b"security.rs: a key of 32 bytes!!";
/// The namespace of the webhook tests' workloads. It carries no opt-in label: the webhook does
/// not read labels, the API server's namespaceSelector does.
const NS: &str = "vault";
/// The header and handshake bound of the webhook tests' server (10 s in `confighash serve`).
const HEADER_TIMEOUT: Duration = Duration::from_secs(1);
/// How long any one wait below may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// The webhook over TLS, with referenced objects in the in-memory API server

/// The in-memory API server with namespaces `vault` and `elsewhere`, and a webhook reading it
/// served over TLS.
struct Setup {
    cluster: Harness,
    served: Served,
}

impl Deref for Setup {
    type Target = Served;

    fn deref(&self) -> &Served {
        &self.served
    }
}

async fn harness() -> Setup {
    let cluster = Harness::start(&[NS, "elsewhere"], KEY).await;
    let webhook = cluster
        .webhook()
        .with_lookup_deadline(Duration::from_secs(2));
    let served = harness::serve(
        webhook,
        ServeSettings {
            header_read_timeout: HEADER_TIMEOUT,
            ..ServeSettings::default()
        },
    )
    .await;
    Setup { cluster, served }
}

impl Setup {
    /// Creates or replaces Secret `name` in `namespace` with `data` (decoded bytes).
    async fn secret(&self, namespace: &str, name: &str, data: &[(&str, &[u8])]) {
        self.cluster.put(namespace, secret(name, data)).await;
    }
}

/// A Deployment in `namespace` whose container reads key `password` of Secret `db`, with these
/// pod-template annotations.
fn deployment(namespace: &str, template_annotations: Value) -> Value {
    deployment_reading(namespace, "db", "password", template_annotations)
}

/// A Deployment in `namespace` whose container reads key `key` of Secret `secret`.
fn deployment_reading(
    namespace: &str,
    secret: &str,
    key: &str,
    template_annotations: Value,
) -> Value {
    build::deployment("web")
        .in_namespace(namespace)
        .secret_key("DB_PASSWORD", secret, key)
        .template_annotations(template_annotations)
        .json()
}

/// The object of `body` with the reply's patch applied, and the decoded patch's bytes.
fn patched(body: &Value, reply: &Reply) -> (Value, Vec<u8>) {
    let reply = reply.json();
    assert_eq!(reply["response"]["allowed"], true);
    (
        build::patched(&body["request"]["object"], &reply),
        patch_of(&reply).unwrap_or_default(),
    )
}

/// The stamp of `object` (a Deployment) with `key`, Secret `db` as given and nothing else present.
fn stamp_for(key: Option<&StampKey>, object: &Value, db: &Secret) -> String {
    let Analysis::Workload(info) = workload::analyze(WorkloadKind::DEPLOYMENT, object).unwrap()
    else {
        panic!("not a workload")
    };
    let view = ObjectView::secret(db);
    let namespace = object["metadata"]["namespace"].as_str().unwrap();
    checksum::compute_stamp(key, namespace, &info.refs, |r| {
        if r.kind == ObjectKind::Secret && r.name == "db" {
            RefState::Present(&view)
        } else {
            RefState::Absent
        }
    })
    .to_string()
}

fn digest_of(stamp: &str) -> &str {
    stamp.rsplit(':').next().unwrap()
}

/// How a value could show up in text: as it is, base64 (as Secrets carry it), the hex and the
/// byte-list forms of its SHA-256 (the recipe's input, which the watcher keeps).
fn renderings(value: &[u8]) -> Vec<String> {
    let digest: [u8; 32] = Sha256::digest(value).into();
    let mut out = vec![
        base64::engine::general_purpose::STANDARD.encode(value),
        hex::encode(digest),
        format!("{digest:?}"),
        hex::encode(value),
    ];
    if let Ok(text) = std::str::from_utf8(value) {
        out.push(text.to_owned());
    }
    out
}

fn assert_reveals_none(what: &str, haystack: &[u8], values: &[&[u8]]) {
    let text = String::from_utf8_lossy(haystack);
    for value in values {
        for needle in renderings(value) {
            assert!(
                !text.contains(&needle),
                "{what} shows {needle:?}, a rendering of {:?}:\n{text}",
                String::from_utf8_lossy(value)
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// What a stamp reveals

/// The stamp is HMAC-SHA256 with the installation's key over a message that holds only SHA-256
/// digests of the values: the reply shows no value, no digest of one, and no part of the key;
/// recomputing the public recipe without the key, even over the right value, does not give the
/// stamp, while the key's holder can tell a right guess from a wrong one.
#[tokio::test]
async fn a_stamp_shows_no_value_and_only_the_keys_holder_can_test_a_guess() {
    let h = harness().await;
    let value: &[u8] = b"hunter2-correct-horse";
    let db = secret("db", &[("password", value), ("user", b"app")]);
    h.secret(NS, "db", &[("password", value), ("user", b"app")])
        .await;
    let object = deployment(NS, json!({}));
    let body = Review::create(&object).json();
    let reply = h.post(&body).await;
    let (stamped, patch) = patched(&body, &reply);
    let stamp = stamp_of(&stamped).expect("stamped at CREATE");
    assert_reveals_none("the reply", &reply.body, &[value, b"app", KEY]);
    assert_reveals_none("the patch", &patch, &[value, b"app", KEY]);

    let key = StampKey::new(KEY.to_vec()).unwrap();
    assert_eq!(key.id(), hex::encode(&Sha256::digest(KEY)[..4]));
    assert!(stamp.starts_with(&format!("v2:{}:", key.id())), "{stamp}");
    assert_eq!(stamp, stamp_for(Some(&key), &object, &db));

    // Without the key: the recipe over the right value gives another digest, and so does another key.
    let plain = stamp_for(None, &object, &db);
    assert!(plain.starts_with("v2:plain:"), "{plain}");
    assert_ne!(digest_of(&plain), digest_of(&stamp));
    let other = StampKey::new(b"another key, also 32 bytes long!".to_vec()).unwrap();
    assert_ne!(
        digest_of(&stamp_for(Some(&other), &object, &db)),
        digest_of(&stamp)
    );
    // With the key, a wrong guess gives another stamp.
    let guess = secret("db", &[("password", b"hunter3-correct-horse")]);
    assert_ne!(stamp_for(Some(&key), &object, &guess), stamp);

    // What a stamp does show: that a referenced value changed.
    let changed: &[u8] = b"rotated-password-2";
    h.secret(NS, "db", &[("password", changed), ("user", b"app")])
        .await;
    let body = Review::create(&object).json();
    let reply = h.post(&body).await;
    let again = stamp_of(&patched(&body, &reply).0).unwrap();
    assert_ne!(again, stamp);
    assert_reveals_none("the reply", &reply.body, &[changed, value]);
}

/// `confighash serve` stamps with its key only: a `v2:plain:` stamp (what `confighash stamp`
/// writes without --key-file) sent to the webhook, at CREATE or by an UPDATE that puts it back,
/// is replaced by the keyed stamp.
#[tokio::test]
async fn the_webhook_replaces_an_unkeyed_stamp_it_is_sent() {
    let h = harness().await;
    let value: &[u8] = b"s3cret";
    let db = secret("db", &[("password", value)]);
    h.secret(NS, "db", &[("password", value)]).await;
    let key = StampKey::new(KEY.to_vec()).unwrap();
    let keyed = stamp_for(Some(&key), &deployment(NS, json!({})), &db);
    let plain = stamp_for(None, &deployment(NS, json!({})), &db);
    assert!(plain.starts_with("v2:plain:"), "{plain}");

    let object = deployment(NS, json!({ STAMP: plain }));
    let body = Review::create(&object).json();
    let (created, _) = patched(&body, &h.post(&body).await);
    assert_eq!(stamp_of(&created).as_deref(), Some(keyed.as_str()));

    // A sync of a manifest that carries the offline stamp, template otherwise unchanged.
    let body = Review::update(&object, &created).json();
    let (updated, patch) = patched(&body, &h.post(&body).await);
    assert!(!patch.is_empty(), "the plain stamp is replaced");
    assert_eq!(stamp_of(&updated).as_deref(), Some(keyed.as_str()));
}

/// The stamp the webhook gives a CREATE of `object`.
async fn webhook_stamp(h: &Setup, object: &Value) -> String {
    let body = Review::create(object).json();
    stamp_of(&patched(&body, &h.post(&body).await).0).expect("stamped at CREATE")
}

/// Issue 12's guessing oracle, replayed: Secret `vault/db` holds a password; someone who can
/// write Secret `elsewhere/db` and send reviews tries guesses, comparing the webhook's stamp of
/// their own Deployment with the stamp of one in `vault`. Recipe v2 binds the namespace, so no
/// guess, the right one included, gives `vault`'s stamp. Under recipe v1 the right guess would
/// have matched (checked below), which is what the oracle used.
#[tokio::test]
async fn the_same_secret_value_in_two_namespaces_gives_different_stamps() {
    let h = harness().await;
    let value: &[u8] = b"hunter2";
    h.secret(NS, "db", &[("password", value)]).await;
    let target = webhook_stamp(&h, &deployment(NS, json!({}))).await;
    let mine = deployment("elsewhere", json!({}));
    let guesses: [&[u8]; 5] = [b"password", b"letmein", b"hunter2", b"123456", b"qwerty"];
    let mut seen = std::collections::BTreeSet::new();
    for guess in guesses {
        h.secret("elsewhere", "db", &[("password", guess)]).await;
        let stamp = webhook_stamp(&h, &mine).await;
        assert_ne!(
            stamp,
            target,
            "guess {:?} confirmed",
            String::from_utf8_lossy(guess)
        );
        assert!(seen.insert(stamp), "two guesses gave one stamp");
    }

    // The same inputs under recipe v1: equal for the right guess (the old oracle).
    let key = StampKey::new(KEY.to_vec()).unwrap();
    let v1 = |object: &Value, db: &Secret| {
        let Analysis::Workload(info) = workload::analyze(WorkloadKind::DEPLOYMENT, object).unwrap()
        else {
            panic!("not a workload")
        };
        let view = ObjectView::secret(db);
        checksum::compute_stamp_v1(Some(&key), &info.refs, |_| RefState::Present(&view))
    };
    let db = secret("db", &[("password", value)]);
    assert_eq!(v1(&deployment(NS, json!({})), &db), v1(&mine, &db));
    // And v2 over the same inputs is what the webhook gave.
    assert_eq!(
        stamp_for(Some(&key), &deployment(NS, json!({})), &db),
        target
    );
}

/// Recipe v1 hashed an absent object the same whatever keys were selected, so two reviews that
/// selected different keys of one object told whether it exists (equal stamps: absent). v2
/// names the selected keys of an absent object: different selections give different stamps,
/// whether the object exists or not.
#[tokio::test]
async fn absent_objects_with_different_key_selections_give_different_stamps() {
    let h = harness().await;
    h.secret(NS, "present", &[("other", b"x")]).await;
    for secret in ["missing", "present"] {
        let a = webhook_stamp(&h, &deployment_reading(NS, secret, "a", json!({}))).await;
        let b = webhook_stamp(&h, &deployment_reading(NS, secret, "b", json!({}))).await;
        assert_ne!(a, b, "Secret {secret}: keys a and b give one stamp");
    }
    // Under v1 the absent Secret's two selections were equal: the old way to tell.
    let key = StampKey::new(KEY.to_vec()).unwrap();
    let v1 = |selected: &str| {
        let object = deployment_reading(NS, "missing", selected, json!({}));
        let Analysis::Workload(info) =
            workload::analyze(WorkloadKind::DEPLOYMENT, &object).unwrap()
        else {
            panic!("not a workload")
        };
        checksum::compute_stamp_v1(Some(&key), &info.refs, |_| RefState::Absent)
    };
    assert_eq!(v1("a"), v1("b"));
}

/// What remains of the oracle while workloads carry `v1:` stamps of an earlier release: a v1
/// stamp made with the current key is checked under recipe v1, which has no namespace, and whether
/// it is kept tells whether it is right. A review for a namespace of the sender's that carries
/// another namespace's v1 stamp as its old stamp therefore tests a guess of the value behind it:
/// kept (no patch) for the right guess, replaced for a wrong one. SECURITY.md ("Known
/// limitations") says how to retire v1 stamps.
#[tokio::test]
async fn a_kept_v1_stamp_still_answers_guesses_until_it_is_replaced() {
    let h = harness().await;
    let value: &[u8] = b"hunter2";
    let key = StampKey::new(KEY.to_vec()).unwrap();
    // The v1 stamp an earlier release put on the Deployment in `vault`.
    let victim = deployment(NS, json!({}));
    let Analysis::Workload(info) = workload::analyze(WorkloadKind::DEPLOYMENT, &victim).unwrap()
    else {
        panic!("not a workload")
    };
    let db = secret("db", &[("password", value)]);
    let view = ObjectView::secret(&db);
    let v1 = checksum::compute_stamp_v1(Some(&key), &info.refs, |_| RefState::Present(&view))
        .to_string();

    let mine = deployment("elsewhere", json!({ STAMP: v1 }));
    for (guess, right) in [(&b"letmein"[..], false), (value, true)] {
        h.secret("elsewhere", "db", &[("password", guess)]).await;
        let body = Review::update(&mine, &mine).json();
        let (after, patch) = patched(&body, &h.post(&body).await);
        assert_eq!(
            patch.is_empty(),
            right,
            "guess {:?}",
            String::from_utf8_lossy(guess)
        );
        assert_eq!(stamp_of(&after).as_deref() == Some(v1.as_str()), right);
    }
}

// ---------------------------------------------------------------------------------------------
// Logs, Events and metrics

/// A log sink for the test's subscriber.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    fn bytes(&self) -> Vec<u8> {
        self.0.lock().unwrap().clone()
    }
}

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The whole system (webhook, watcher, key Secret) at confighash's most verbose log level, its
/// libraries at debug: a Secret's values, their SHA-256 and the key never reach the logs, the
/// Events or the metrics, through stamping, a config change, a failed lookup and a retried touch.
#[tokio::test]
async fn logs_events_and_metrics_never_carry_secret_values() {
    let logs = Logs::default();
    let subscriber = {
        let logs = logs.clone();
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_env_filter(tracing_subscriber::EnvFilter::new("debug,confighash=trace"))
            .with_writer(move || logs.clone())
            .finish()
    };
    // tracing caches, per callsite, whether any subscriber wants its events. While only one
    // subscriber is registered it asks just the default of the thread that reaches the callsite
    // first, which for another test's thread is none: a second registered subscriber makes it
    // ask this one too. Then the test's runtime has one thread, so every task confighash spawns
    // logs through this thread's default.
    let _second = tracing::Dispatch::new(tracing_subscriber::registry());
    let _guard = tracing::subscriber::set_default(subscriber);
    tracing::callsite::rebuild_interest_cache();
    let Some(env) = support::Env::stand_in(
        "logs_events_and_metrics_never_carry_secret_values",
        "reads confighash's logs, fails a lookup, reads metrics",
    )
    .await
    else {
        return;
    };
    let first: &[u8] = b"first-password-0451";
    let second: &[u8] = b"second-password-9913";
    env.namespace("vault", true).await;
    env.namespace("confighash", false).await;
    env.secret("vault", "db", &[("password", "first-password-0451")])
        .await;
    env.config_map("vault", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.deployment(
        "vault",
        "web",
        &[("secretKey", "db/password"), ("envFrom", "app-env")],
    )
    .await;
    assert!(env.stamp("vault", "Deployment", "web").await.is_some());
    env.barrier("vault").await;

    // A change of the Secret: the webhook's first lookup for the touch fails (and is logged),
    // the touch is retried and lands.
    env.secret("vault", "db", &[("password", "second-password-9913")])
        .await;
    env.api().fail_next_from(
        confighash::cluster::get::LOOKUP_USER_AGENT,
        Some("get"),
        Some("secrets"),
        1,
        500,
    );
    env.wait_rollouts("vault", "Deployment", "web", 1).await;
    env.barrier("vault").await;

    // The key Secret, created with random bytes by confighash under deploy/'s RBAC.
    let keys = key::from_secret(env.confighash.clone(), "confighash", "confighash-key")
        .await
        .unwrap();
    let generated = Api::<Secret>::namespaced(env.client.clone(), "confighash")
        .get("confighash-key")
        .await
        .unwrap()
        .data
        .unwrap()["key"]
        .0
        .clone();
    assert_eq!(generated.len(), key::GENERATED_KEY_LEN);

    let events = Api::<Event>::namespaced(env.client.clone(), &env.ns("vault"))
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let notes: Vec<String> = events.into_iter().filter_map(|e| e.note).collect();
    assert!(
        notes.iter().any(|n| n.contains("Secret db changed")),
        "{notes:?}"
    );
    let metrics = env.metrics.encode();
    drop(_guard);

    let text = logs.bytes();
    let lines = String::from_utf8_lossy(&text);
    // The capture saw every part: the webhook deciding and failing a lookup, the watcher
    // touching, the key being created.
    for needle in [
        "decided",
        "lookup failed",
        "touched",
        "created the checksum key Secret",
        keys.current().id(),
    ] {
        assert!(
            lines.contains(needle),
            "no {needle:?} in the logs:\n{lines}"
        );
    }
    let values: [&[u8]; 4] = [first, second, support::KEY, &generated];
    assert_reveals_none("the logs", &text, &values);
    assert_reveals_none("the Events", notes.join("\n").as_bytes(), &values);
    assert_reveals_none("the metrics", metrics.as_bytes(), &values);
}

/// The workload as stored, without its stamp and the fields the API server and, on a real
/// cluster, the Deployment controller keep (its status and revision).
fn without_stamp(mut object: Value) -> Value {
    if let Some(annotations) = object
        .pointer_mut("/spec/template/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        annotations.remove(STAMP);
    }
    object.as_object_mut().unwrap().remove("status");
    let metadata = object["metadata"].as_object_mut().unwrap();
    for field in ["resourceVersion", "generation", "managedFields"] {
        metadata.remove(field);
    }
    if let Some(annotations) = metadata
        .get_mut("annotations")
        .and_then(Value::as_object_mut)
    {
        annotations.remove("deployment.kubernetes.io/revision");
    }
    object
}

/// What confighash writes to a workload when its config changes (the watcher's touch, then the
/// webhook's patch of that UPDATE) is the pod template's stamp and nothing else.
#[tokio::test]
async fn a_config_change_changes_nothing_on_a_workload_but_its_stamp() {
    let env = support::Env::start().await;
    env.namespace("shop", true).await;
    env.config_map("shop", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.workload(
        "shop",
        "Deployment",
        "web",
        &[("envFrom", "app-env"), ("volume", "app-env")],
        json!({"team": "shop"}),
    )
    .await;
    env.barrier("shop").await;
    let before = env.get_workload("shop", "Deployment", "web").await.unwrap();

    env.config_map("shop", "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.wait_rollouts("shop", "Deployment", "web", 1).await;
    env.barrier("shop").await;
    let after = env.get_workload("shop", "Deployment", "web").await.unwrap();
    assert_ne!(stamp_of(&after), stamp_of(&before), "the stamp changed");
    assert_eq!(without_stamp(after), without_stamp(before));
}

// ---------------------------------------------------------------------------------------------
// Namespaces

/// A workload's references are read in its own namespace: an object of the same name in another
/// namespace neither enters its stamp nor, when it changes, rolls it; nor does an extra-reference
/// annotation that names another namespace.
#[tokio::test]
async fn references_resolve_in_the_workloads_own_namespace_only() {
    let env = support::Env::start().await;
    env.namespace("team-a", true).await;
    env.namespace("team-b", true).await;
    for ns in ["team-a", "team-b"] {
        env.config_map(ns, "app-env", &[("LOG_LEVEL", "info")])
            .await;
    }
    env.secret("team-b", "only-in-b", &[("token", "b's token")])
        .await;
    for ns in ["team-a", "team-b"] {
        env.deployment(
            ns,
            "web",
            &[("envFrom", "app-env"), ("secretEnvFrom", "only-in-b")],
        )
        .await;
    }
    let a_first = env.stamp("team-a", "Deployment", "web").await.unwrap();
    let b_first = env.stamp("team-b", "Deployment", "web").await.unwrap();
    assert_ne!(a_first, b_first, "only-in-b is present for team-b only");
    if env.is_stand_in() {
        // team-a's stamp is the one of only-in-b absent.
        let object = env
            .get_workload("team-a", "Deployment", "web")
            .await
            .unwrap();
        let Analysis::Workload(info) =
            workload::analyze(WorkloadKind::DEPLOYMENT, &object).unwrap()
        else {
            panic!("not a workload")
        };
        let cm = config_map("app-env", &[("LOG_LEVEL", "info")]);
        let view = ObjectView::config_map(&cm).unwrap();
        let key = StampKey::new(support::KEY.to_vec()).unwrap();
        let team_a = env.ns("team-a");
        let absent = checksum::compute_stamp(Some(&key), &team_a, &info.refs, |r| match r.kind {
            ObjectKind::ConfigMap => RefState::Present(&view),
            ObjectKind::Secret => RefState::Absent,
        });
        assert_eq!(a_first, absent.to_string());
    }
    // team-a names team-b's ConfigMap in an extra-reference annotation: not an object name, left out.
    let team_b = env.ns("team-b");
    Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(
        env.client.clone(),
        &env.ns("team-a"),
    )
    .patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {
            "confighash.dev/extra-configmaps": format!("{team_b}/app-env, {team_b}.app-env")
        }}})),
    )
    .await
    .unwrap();
    env.barrier("team-a").await;
    env.barrier("team-b").await;
    assert_eq!(
        env.stamp("team-a", "Deployment", "web").await.as_deref(),
        Some(a_first.as_str())
    );

    // team-b changes both objects: its own workload rolls, team-a's does not.
    env.config_map("team-b", "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.wait_rollouts("team-b", "Deployment", "web", 1).await;
    env.barrier("team-b").await;
    env.secret("team-b", "only-in-b", &[("token", "b's new token")])
        .await;
    env.wait_rollouts("team-b", "Deployment", "web", 2).await;
    env.barrier("team-b").await;
    env.barrier("team-a").await;
    assert_eq!(env.rollouts("team-a", "Deployment", "web").await, 0);
    assert_eq!(
        env.stamp("team-a", "Deployment", "web").await.as_deref(),
        Some(a_first.as_str())
    );
}

// ---------------------------------------------------------------------------------------------
// TLS

/// The webhook port's rustls configuration: the ring provider's AEAD suites only (TLS 1.3, and
/// TLS 1.2 with ECDHE), ephemeral key exchange on X25519, P-256 and P-384, ALPN h2 and
/// http/1.1, no session cache, no tickets, no 0-RTT data.
#[test]
fn tls_configuration_is_aead_with_ephemeral_keys_and_no_resumption() {
    let certs = TestCerts::generate();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tls.crt"), &certs.cert_pem).unwrap();
    std::fs::write(dir.path().join("tls.key"), &certs.key_pem).unwrap();
    let store = CertStore::load(dir.path().join("tls.crt"), dir.path().join("tls.key")).unwrap();
    let config = store.server_config();
    let suites: Vec<CipherSuite> = config
        .crypto_provider()
        .cipher_suites
        .iter()
        .map(|s| s.suite())
        .collect();
    assert_eq!(
        suites,
        [
            CipherSuite::TLS13_AES_256_GCM_SHA384,
            CipherSuite::TLS13_AES_128_GCM_SHA256,
            CipherSuite::TLS13_CHACHA20_POLY1305_SHA256,
            CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
            CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
            CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
            CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
            CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
            CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
        ]
    );
    let groups: Vec<NamedGroup> = config
        .crypto_provider()
        .kx_groups
        .iter()
        .map(|g| g.name())
        .collect();
    assert_eq!(
        groups,
        [
            NamedGroup::X25519,
            NamedGroup::secp256r1,
            NamedGroup::secp384r1
        ]
    );
    assert_eq!(
        config.alpn_protocols,
        [b"h2".to_vec(), b"http/1.1".to_vec()]
    );
    assert!(!config.session_storage.can_cache(), "no session cache");
    assert!(!config.ticketer.enabled(), "no TLS 1.2 session tickets");
    assert_eq!(config.send_tls13_tickets, 0, "no TLS 1.3 tickets");
    assert_eq!(config.max_early_data_size, 0, "no 0-RTT data");
}

/// A TLS 1.2 ClientHello offering `suites`, with the extensions an ECDHE handshake needs.
fn tls12_client_hello(suites: &[u16]) -> Vec<u8> {
    fn extension(kind: u16, data: &[u8]) -> Vec<u8> {
        let mut ext = kind.to_be_bytes().to_vec();
        ext.extend_from_slice(&(data.len() as u16).to_be_bytes());
        ext.extend_from_slice(data);
        ext
    }
    fn list16(items: &[u16]) -> Vec<u8> {
        let mut out = ((items.len() * 2) as u16).to_be_bytes().to_vec();
        for item in items {
            out.extend_from_slice(&item.to_be_bytes());
        }
        out
    }
    let mut body = vec![0x03, 0x03]; // client_version TLS 1.2
    body.extend_from_slice(&[0x5a; 32]); // random
    body.push(0); // session id
    body.extend_from_slice(&list16(suites));
    body.extend_from_slice(&[0x01, 0x00]); // compression: null
    let mut extensions = Vec::new();
    extensions.extend(extension(0x000a, &list16(&[0x001d, 0x0017]))); // x25519, secp256r1
    extensions.extend(extension(0x000b, &[0x01, 0x00])); // ec_point_formats: uncompressed
    // ecdsa_secp256r1_sha256, rsa_pss_rsae_sha256, rsa_pkcs1_sha256
    extensions.extend(extension(0x000d, &list16(&[0x0403, 0x0804, 0x0401])));
    body.extend_from_slice(&(extensions.len() as u16).to_be_bytes());
    body.extend_from_slice(&extensions);
    let mut handshake = vec![0x01]; // ClientHello
    handshake.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    handshake.extend_from_slice(&body);
    let mut record = vec![0x16, 0x03, 0x01];
    record.extend_from_slice(&(handshake.len() as u16).to_be_bytes());
    record.extend_from_slice(&handshake);
    record
}

/// The first 7 bytes the webhook port answers `hello` with.
async fn first_answer(addr: SocketAddr, hello: &[u8]) -> [u8; 7] {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(hello).await.unwrap();
    let mut answer = [0u8; 7];
    tokio::time::timeout(DEADLINE, tcp.read_exact(&mut answer))
        .await
        .expect("an answer in time")
        .expect("seven bytes of answer");
    answer
}

/// Over a real socket: a TLS 1.2 client that offers only CBC, static-RSA, 3DES or RC4 suites gets
/// a fatal handshake_failure alert; the same hello with an ECDHE AEAD suite gets a ServerHello.
#[tokio::test]
async fn tls12_clients_without_an_aead_ecdhe_suite_are_refused() {
    let h = harness().await;
    let answer = first_answer(h.addr, &tls12_client_hello(&[0xc02b, 0xc02f])).await;
    assert_eq!(answer[0], 0x16, "a handshake record: {answer:?}");
    assert_eq!(answer[5], 0x02, "a ServerHello: {answer:?}");

    let weak = [
        0xc009, 0xc00a, 0xc023, 0xc024, // ECDHE_ECDSA with CBC
        0xc013, 0xc014, 0xc027, 0xc028, // ECDHE_RSA with CBC
        0x009c, 0x009d, 0x002f, 0x0035, 0x003c, // static RSA key exchange
        0x000a, 0x0005, // 3DES, RC4
    ];
    let answer = first_answer(h.addr, &tls12_client_hello(&weak)).await;
    assert_eq!(answer[0], 0x15, "an alert record: {answer:?}");
    assert_eq!(answer[5], 2, "fatal: {answer:?}");
    assert_eq!(answer[6], 40, "handshake_failure: {answer:?}");
}

// ---------------------------------------------------------------------------------------------
// Size and time limits of the webhook port

/// Reads an HTTP/1.1 response head from `stream` and returns its status code.
async fn read_status(stream: &mut (impl AsyncRead + Unpin)) -> u16 {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(DEADLINE, stream.read(&mut buf))
            .await
            .expect("a response in time")
            .expect("a readable connection");
        assert!(n > 0, "closed before a response: {head:?}");
        head.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&head);
    head.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"))
}

/// A body over 7 MiB is refused with 413: at once when its Content-Length says so (nothing of it
/// is read), and after 7 MiB when it is streamed in chunks with no length (the server answers
/// without waiting for the end, which never comes here).
#[tokio::test]
async fn oversized_bodies_are_refused_declared_or_streamed() {
    let h = harness().await;

    let mut tls = h.tls(&[b"http/1.1"]).await;
    let head = format!(
        "POST /mutate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        MAX_BODY + 1
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    assert_eq!(read_status(&mut tls).await, 413);

    let tls = h.tls(&[b"http/1.1"]).await;
    let (mut read, mut write) = tokio::io::split(tls);
    let writer = tokio::spawn(async move {
        write
            .write_all(
                b"POST /mutate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
                  transfer-encoding: chunked\r\n\r\n",
            )
            .await?;
        let chunk = vec![b' '; 64 * 1024];
        let mut sent = 0;
        while sent <= MAX_BODY {
            write
                .write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                .await?;
            write.write_all(&chunk).await?;
            write.write_all(b"\r\n").await?;
            sent += chunk.len();
        }
        // No last chunk: only the limit can end this request.
        std::future::pending::<()>().await;
        Ok::<_, std::io::Error>(())
    });
    assert_eq!(read_status(&mut read).await, 413);
    writer.abort();
}

/// A client that has finished its TLS handshake but stops in the middle of its request headers
/// is disconnected once the header timeout passes.
#[tokio::test]
async fn a_client_that_stops_inside_its_request_headers_is_cut_off() {
    let h = harness().await;
    let mut tls = h.tls(&[b"http/1.1"]).await;
    tls.write_all(b"POST /mutate HTTP/1.1\r\nhost: localhost\r\n")
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(DEADLINE, tls.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "the server must close the connection: {read:?}"
    );
    assert!(
        started.elapsed() >= HEADER_TIMEOUT / 2,
        "closed after {:?}, not by the header timeout",
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// The admin port

/// The plain-HTTP admin port answers GET /livez, /readyz and /metrics and nothing else.
#[tokio::test]
async fn the_admin_port_serves_only_health_and_metrics() {
    let h = harness().await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<String>();
    let status = async |method: &str, path: &str| {
        let req = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", h.admin))
            .body(String::new())
            .unwrap();
        client.request(req).await.unwrap().status().as_u16()
    };
    for path in ["/livez", "/readyz", "/metrics"] {
        assert_eq!(status("GET", path).await, 200, "{path}");
        assert_eq!(status("POST", path).await, 405, "{path}");
    }
    for path in ["/", "/mutate", "/debug/pprof", "/config", "/key"] {
        assert_eq!(status("GET", path).await, 404, "{path}");
    }
}

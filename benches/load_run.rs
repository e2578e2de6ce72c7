//! The load run: confighash's webhook over TLS at a fixed open-loop rate while its serving
//! certificate is renewed twice and the API server fails a share of its lookups.
//!
//! Everything runs in this process, on one tokio runtime, on a shared machine:
//! - the in-memory API server of `crates/testkit/src/apiserver`, with `NAMESPACES` opted-in namespaces that
//!   each hold the 10 ConfigMaps and Secrets of the webhook benchmarks' Deployment, and the RBAC
//!   of `deploy/` enforced on confighash's ServiceAccount token;
//! - confighash's webhook, started with `serve::start` as `confighash serve` starts it (TLS from
//!   a kubelet-style Secret volume, `KubeSource` lookups through a `kube::Client` to the stand-in);
//! - an open-loop load generator: `CONFIGHASH_LOAD_RATE` reviews/s (300) for
//!   `CONFIGHASH_LOAD_SECS` (60), each send spawned at its scheduled time (never waiting for
//!   earlier replies), latency from the scheduled time to the end of the reply body. Requests go
//!   over `CLIENT_SLOTS` HTTPS clients (kept-alive HTTP/2, as kube-apiserver's webhook client);
//!   every second one of them is replaced by a fresh client, so new TLS handshakes happen all
//!   through the run, before and after each renewal.
//!
//! Three phases of the same length, one after the other, after a short warm-up:
//! 1. **baseline**: the same load, no faults, no renewals;
//! 2. **faults**: the stand-in fails `CONFIGHASH_LOAD_FAULT_FRACTION` (1 %) of GETs of
//!    ConfigMaps and Secrets at random with a 500 (`ApiServer::fail_fraction`), and the serving
//!    pair is renewed at 1/3 and 2/3 of the phase, as kubelet projects a renewed cert-manager
//!    Secret (new dated directory, `..data` symlink swapped). After each renewal a fresh TLS
//!    connection must be presented the new certificate within the reload interval, and a review
//!    over a fresh client must be answered;
//! 3. **baseline again**, as phase 1: on a shared machine the two baselines show how much the
//!    conditions moved while phase 2 ran. The report gives phase 2's percentiles as ratios to
//!    each baseline's.
//!
//! Every reply is checked after the phase, against what the stamp rules (README, "When a stamp changes") require. To know
//! which reviews saw a lookup error, each review in flight uses a namespace no other review in
//! flight uses (a free one is picked at send time); the stand-in records the namespace, name and
//! time of every request it failed, and each failure is matched to the one review of that
//! namespace in flight at that time. Then, with the patch applied to the submitted object:
//! - a review that saw a lookup error must leave the pod template as rule 1 says: on UPDATE the
//!   stamp `oldObject` carried (re-added when the request dropped it), on CREATE no stamp and the
//!   `confighash.dev/unstamped: lookup-failed` marker; nothing else may change;
//! - every other review must carry the expected stamp (the recipe over the objects, computed
//!   here with `lookup::resolve` over the fixture's in-memory source), nothing else changed.
//!
//! The process exits non-zero when an exchange failed, a template changed on a lookup error, an
//! answer was wrong, an injected failure could not be matched to exactly one review, or a renewed
//! certificate was not served.
//!
//! `cargo bench --bench load_run`. `CONFIGHASH_BENCH_QUICK=1` (or `-- --quick`) runs 10 s phases
//! with a 1 s reload interval; `CONFIGHASH_LOAD_BASELINE=0` skips the baseline phases. Without
//! `--bench` (as `cargo test --benches` runs it) only the fault phase runs, for 2 s at 50
//! reviews/s, with all its checks; `--list` lists nothing.
//!
//! Everything here shares the machine: the figures include the stand-in API server's and the
//! load generator's work (each review makes 10 GETs through `kube::Client` to the stand-in over
//! loopback HTTP), and the report gives this process's CPU use and how busy the whole machine
//! was, so a run on a machine other work kept busy can be told from a slow webhook.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use confighash::certs::key::KeyStore;
use confighash::core::checksum::StampKey;
use confighash::core::names::{CHECKSUM_ANNOTATION, UNSTAMPED_ANNOTATION, UNSTAMPED_LOOKUP_FAILED};
use confighash::core::rules::Lookup;
use confighash::core::workload::{self, Analysis, WorkloadKind};
use confighash::metrics::Metrics;
use confighash::serving::health::Health;
use confighash::serving::tls::CertStore;
use confighash::webhook::admission::Webhook;
use confighash::webhook::lookup::{self, Fetched, KubeSource};
use confighash::webhook::server::{self as serve, RunningWebhook, WebhookServeConfig};
use confighash_testkit::apiserver::server::InjectedFault;
use confighash_testkit::apiserver::{ApiServer, HttpsClient, TestCa};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::Api;
use kube::api::PostParams;
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};

use confighash_testkit::bench::fixture;
use confighash_testkit::bench::mode;
use confighash_testkit::bench::serve as procs;
use confighash_testkit::kubelet_volume;
use kubelet_volume::SecretVolume;
use mode::Mode;

/// Opted-in namespaces the load uses, each with its own copy of the 10 referenced objects.
const NAMESPACES: usize = 256;
/// One more namespace (the last, `team-256`), for the checks made while the load runs.
const CHECK_NAMESPACE: usize = NAMESPACES;
/// HTTPS clients the load is spread over (one connection each); one is replaced every second.
const CLIENT_SLOTS: usize = 4;
/// Namespace names are `team-000` ... : fixed width, so a review body is patched in place.
const NS_PLACEHOLDER: &str = "@@ns@@@@";
const UID_PLACEHOLDER: &str = "@@@@@@@@-@@@@-@@@@-@@@@-@@@@@@@@@@@@";
/// Where a review carries the expected stamp: recipe v2 binds the namespace, so each namespace
/// has its own, written in place like the namespace (`v2:<key id>:<64 hex digits>`).
const STAMP_PLACEHOLDER: &str =
    "@@:@@@@@@@@:@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@";
/// How long the webhook's lookups may take (`--lookup-deadline` default).
const LOOKUP_DEADLINE: Duration = Duration::from_secs(2);
/// `confighash serve`'s certificate reload interval (`serve::CERT_POLL`).
const CERT_POLL: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Options

#[derive(Clone, Copy)]
struct Options {
    rate: u32,
    duration: Duration,
    fraction: f64,
    baseline: bool,
    quick: bool,
    warm_up: Duration,
    cert_poll: Duration,
}

fn env_parse<T: std::str::FromStr>(name: &str) -> Option<T> {
    let value = std::env::var(name).ok().filter(|v| !v.is_empty())?;
    match value.parse() {
        Ok(v) => Some(v),
        Err(_) => {
            eprintln!("{name}={value:?} is not a valid value");
            std::process::exit(2);
        }
    }
}

impl Options {
    fn from_env_and_args() -> Self {
        let quick = std::env::args().any(|a| a == "--quick")
            || std::env::var("CONFIGHASH_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        let rate: u32 = env_parse("CONFIGHASH_LOAD_RATE").unwrap_or(300);
        let secs: f64 =
            env_parse("CONFIGHASH_LOAD_SECS").unwrap_or(if quick { 10.0 } else { 60.0 });
        let fraction: f64 = env_parse("CONFIGHASH_LOAD_FAULT_FRACTION").unwrap_or(0.01);
        let baseline = std::env::var("CONFIGHASH_LOAD_BASELINE").map_or(true, |v| v != "0");
        if rate == 0 || !secs.is_finite() || secs <= 0.0 || !(0.0..=1.0).contains(&fraction) {
            eprintln!(
                "need CONFIGHASH_LOAD_RATE > 0, CONFIGHASH_LOAD_SECS > 0, fraction in [0, 1]"
            );
            std::process::exit(2);
        }
        Options {
            rate,
            duration: Duration::from_secs_f64(secs),
            fraction,
            baseline,
            quick,
            warm_up: if quick {
                Duration::from_secs(1)
            } else {
                Duration::from_secs(3)
            },
            cert_poll: if quick {
                Duration::from_secs(1)
            } else {
                CERT_POLL
            },
        }
    }
}

impl Options {
    /// Without `--bench`: one short fault phase at a low rate, every check of the full run.
    fn smoke() -> Self {
        Options {
            rate: 50,
            duration: Duration::from_secs(2),
            fraction: 0.05,
            baseline: false,
            quick: true,
            warm_up: Duration::from_millis(200),
            cert_poll: Duration::from_millis(200),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Certificates: a CA, serving pairs it issues, a kubelet-style Secret volume

/// The names of the serving certificate: the webhook Service's, and 127.0.0.1 the bench dials.
const SERVING_NAMES: &[&str] = &["confighash.confighash.svc", "localhost", "127.0.0.1"];

/// The leaf certificate presented on a fresh TLS connection.
async fn presented_certificate(
    addr: SocketAddr,
    ca_pem: &str,
) -> Result<CertificateDer<'static>, String> {
    let config = confighash_testkit::apiserver::https::client_config(ca_pem, &[b"h2", b"http/1.1"]);
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from("confighash.confighash.svc").expect("a server name");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tls.get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|c| c.clone().into_owned())
        .ok_or_else(|| "no certificate presented".to_owned())
}

// ---------------------------------------------------------------------------------------------
// Reviews

/// The kinds of review sent, in the order of `MIX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum ReviewKind {
    /// A new Deployment, no stamp yet.
    Create,
    /// An UPDATE that changes the pod template (an env value); both objects carry a stamp of
    /// this key over older content.
    UpdateChanged,
    /// The same, but the request dropped the stamp (an apply of a manifest without it).
    UpdateDropped,
    /// The watcher's touch: the template is otherwise unchanged, the request sets a new
    /// current-key stamp that the webhook must recompute.
    UpdateTouch,
    /// A scale (spec.replicas); both carry the up-to-date stamp: no patch either way.
    UpdateScale,
}

/// The review kind of send `i`: 20 % CREATE, 40 % template changes, 10 % each of dropped stamps
/// and touches, 20 % scales.
const MIX: [ReviewKind; 10] = [
    ReviewKind::Create,
    ReviewKind::UpdateChanged,
    ReviewKind::UpdateScale,
    ReviewKind::UpdateChanged,
    ReviewKind::UpdateDropped,
    ReviewKind::Create,
    ReviewKind::UpdateChanged,
    ReviewKind::UpdateScale,
    ReviewKind::UpdateChanged,
    ReviewKind::UpdateTouch,
];

impl ReviewKind {
    fn name(self) -> &'static str {
        match self {
            ReviewKind::Create => "CREATE",
            ReviewKind::UpdateChanged => "UPDATE template changed",
            ReviewKind::UpdateDropped => "UPDATE stamp dropped",
            ReviewKind::UpdateTouch => "UPDATE touch",
            ReviewKind::UpdateScale => "UPDATE scale",
        }
    }
}

/// One kind of review: its body with placeholders, and what the object must look like after
/// the webhook's patch.
struct Template {
    kind: ReviewKind,
    body: Vec<u8>,
    ns_offsets: Vec<usize>,
    stamp_offsets: Vec<usize>,
    uid_offset: usize,
    /// `request.object`. It, and the two below, hold `STAMP_PLACEHOLDER` where the namespace's
    /// expected stamp goes.
    object: Value,
    /// The object as it must be when every lookup succeeded.
    expect_ok: Value,
    /// The object as rule 1 (lookup failed) wants it.
    expect_failed: Value,
}

impl Template {
    /// The review for `namespace`, whose expected stamp is `stamp`.
    fn body_for(&self, namespace: &str, stamp: &str, uid: &str) -> Vec<u8> {
        let mut body = self.body.clone();
        for &at in &self.ns_offsets {
            body[at..at + NS_PLACEHOLDER.len()].copy_from_slice(namespace.as_bytes());
        }
        for &at in &self.stamp_offsets {
            body[at..at + STAMP_PLACEHOLDER.len()].copy_from_slice(stamp.as_bytes());
        }
        body[self.uid_offset..self.uid_offset + UID_PLACEHOLDER.len()]
            .copy_from_slice(uid.as_bytes());
        body
    }
}

fn namespace_name(i: usize) -> String {
    let name = format!("team-{i:03}");
    assert_eq!(name.len(), NS_PLACEHOLDER.len());
    name
}

fn review_uid(phase: u8, i: usize) -> String {
    let uid = format!("00000000-0000-4000-80{phase:02x}-{i:012x}");
    assert_eq!(uid.len(), UID_PLACEHOLDER.len());
    uid
}

fn template_annotations(obj: &mut Value) -> &mut serde_json::Map<String, Value> {
    obj.pointer_mut("/spec/template/metadata/annotations")
        .and_then(Value::as_object_mut)
        .expect("the fixture's pod template has annotations")
}

fn set_stamp(obj: &mut Value, stamp: Option<&str>) {
    let annotations = template_annotations(obj);
    match stamp {
        Some(s) => {
            annotations.insert(CHECKSUM_ANNOTATION.to_owned(), json!(s));
        }
        None => {
            annotations.remove(CHECKSUM_ANNOTATION);
        }
    }
}

/// A Deployment of the fixture in the placeholder namespace.
fn deployment(log_level: &str, stamp: Option<&str>) -> Value {
    let mut obj = fixture::deployment(log_level, "placeholder");
    set_stamp(&mut obj, stamp);
    obj["metadata"]["namespace"] = json!(NS_PLACEHOLDER);
    obj
}

/// `value` with `stamp` where it holds `STAMP_PLACEHOLDER`.
fn with_stamp(value: &Value, stamp: &str) -> Value {
    let text = value.to_string().replace(STAMP_PLACEHOLDER, stamp);
    serde_json::from_str(&text).expect("JSON")
}

fn templates() -> Vec<Template> {
    let expected = STAMP_PLACEHOLDER;
    let key = StampKey::new(fixture::KEY.to_vec()).expect("a long enough key");
    let stale = fixture::stale_stamp();
    let touch = format!("v2:{}:{}", key.id(), "1".repeat(64));
    let kinds = [
        ReviewKind::Create,
        ReviewKind::UpdateChanged,
        ReviewKind::UpdateDropped,
        ReviewKind::UpdateTouch,
        ReviewKind::UpdateScale,
    ];
    kinds
        .into_iter()
        .map(|kind| {
            let (object, old) = match kind {
                ReviewKind::Create => {
                    let mut obj = deployment("info", None);
                    // What a client sends: no server-set fields.
                    let meta = obj["metadata"].as_object_mut().expect("metadata");
                    for field in ["uid", "resourceVersion", "generation", "creationTimestamp"] {
                        meta.remove(field);
                    }
                    meta["annotations"]
                        .as_object_mut()
                        .expect("annotations")
                        .remove("deployment.kubernetes.io/revision");
                    obj.as_object_mut().expect("an object").remove("status");
                    (obj, None)
                }
                ReviewKind::UpdateChanged => (
                    deployment("debug", Some(&stale)),
                    Some(deployment("info", Some(&stale))),
                ),
                ReviewKind::UpdateDropped => (
                    deployment("debug", None),
                    Some(deployment("info", Some(&stale))),
                ),
                ReviewKind::UpdateTouch => (
                    deployment("info", Some(&touch)),
                    Some(deployment("info", Some(&stale))),
                ),
                ReviewKind::UpdateScale => {
                    let mut obj = deployment("info", Some(expected));
                    obj["spec"]["replicas"] = json!(4);
                    (obj, Some(deployment("info", Some(expected))))
                }
            };
            let mut expect_ok = object.clone();
            set_stamp(&mut expect_ok, Some(expected));
            let mut expect_failed = object.clone();
            match &old {
                None => {
                    expect_failed["metadata"]["annotations"][UNSTAMPED_ANNOTATION] =
                        json!(UNSTAMPED_LOOKUP_FAILED);
                }
                Some(old) => {
                    let kept = old
                        .pointer("/spec/template/metadata/annotations")
                        .and_then(|a| a.get(CHECKSUM_ANNOTATION))
                        .and_then(Value::as_str);
                    set_stamp(&mut expect_failed, kept);
                }
            }
            let (operation, options) = match old {
                None => ("CREATE", "CreateOptions"),
                Some(_) => ("UPDATE", "UpdateOptions"),
            };
            let review = json!({
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": {
                    "uid": UID_PLACEHOLDER,
                    "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
                    "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
                    "requestKind": {"group": "apps", "version": "v1", "kind": "Deployment"},
                    "requestResource": {"group": "apps", "version": "v1", "resource": "deployments"},
                    "name": "storefront",
                    "namespace": NS_PLACEHOLDER,
                    "operation": operation,
                    "userInfo": {
                        "username": "system:serviceaccount:argocd:argocd-application-controller",
                        "uid": "0b6a4a3e-3d1f-4c43-9b0e-6f3b2a1d9e77",
                        "groups": ["system:serviceaccounts", "system:serviceaccounts:argocd", "system:authenticated"]
                    },
                    "object": object,
                    "oldObject": old,
                    "dryRun": false,
                    "options": {"apiVersion": "meta.k8s.io/v1", "kind": options, "fieldManager": "argocd-controller"}
                }
            });
            let body = serde_json::to_vec(&review).expect("JSON");
            let find = |needle: &str| -> Vec<usize> {
                body.windows(needle.len())
                    .enumerate()
                    .filter(|(_, w)| *w == needle.as_bytes())
                    .map(|(i, _)| i)
                    .collect()
            };
            let ns_offsets = find(NS_PLACEHOLDER);
            let stamp_offsets = find(STAMP_PLACEHOLDER);
            let uid_offsets = find(UID_PLACEHOLDER);
            assert_eq!(uid_offsets.len(), 1);
            assert!(!ns_offsets.is_empty());
            Template {
                kind,
                ns_offsets,
                stamp_offsets,
                uid_offset: uid_offsets[0],
                body,
                object,
                expect_ok,
                expect_failed,
            }
        })
        .collect()
}

/// The expected stamp of the fixture's Deployment in `namespace` over the fixture's objects,
/// computed with the recipe over an in-memory source.
async fn expected_stamp(key: &StampKey, namespace: &str) -> String {
    fixture::check_references();
    let obj = fixture::deployment("info", "");
    let Ok(Analysis::Workload(info)) = workload::analyze(WorkloadKind::DEPLOYMENT, &obj) else {
        panic!("the fixture is not a workload");
    };
    let resolved = lookup::Lookups::new(Arc::new(fixture::MemorySource::new()), 16)
        .resolve(
            fixture::NAMESPACE,
            &info.refs,
            LOOKUP_DEADLINE,
            &Metrics::new(),
            &confighash::webhook::budget::MemoryBudget::new(1 << 26),
            u64::MAX,
        )
        .await
        .expect("the in-memory lookup");
    match resolved.lookup(key, namespace, &info.refs, false, u64::MAX) {
        Lookup::Resolved {
            expected,
            required_absent: false,
            ..
        } => expected.as_str().to_owned(),
        other => panic!("unexpected lookup {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// The environment

struct Env {
    api: ApiServer,
    running: RunningWebhook,
    metrics: Arc<Metrics>,
    url: String,
    addr: SocketAddr,
    ca: TestCa,
    volume: Mutex<SecretVolume>,
    templates: Arc<Vec<Template>>,
    /// The expected stamp in each namespace, by its number.
    expected: Arc<Vec<String>>,
}

async fn start(options: &Options) -> Env {
    let key = StampKey::new(fixture::KEY.to_vec()).expect("a long enough key");
    let mut expected = Vec::new();
    for i in 0..=CHECK_NAMESPACE {
        expected.push(expected_stamp(&key, &namespace_name(i)).await);
    }
    assert_eq!(expected[0].len(), STAMP_PLACEHOLDER.len());

    let api = ApiServer::start().await;
    let admin = api.client();
    let rbac = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/base/rbac.yaml"
    ))
    .expect("deploy/base/rbac.yaml");
    api.set_authorizer(Some(
        confighash_testkit::apiserver::rbac::Authorizer::from_yaml(&rbac)
            .expect("deploy/ RBAC parses"),
    ));
    api.add_token(
        "confighash-token",
        confighash_testkit::apiserver::user::UserInfo::service_account("confighash", "confighash"),
    );
    // The webhook's lookups, as `serve` reads them.
    let confighash =
        confighash::cluster::get::Getter::new(&api.config_with_token("confighash-token"))
            .expect("a getter");

    // Namespaces, then each one's copy of the objects.
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    for i in 0..=CHECK_NAMESPACE {
        let ns: Namespace = serde_json::from_value(json!({
            "metadata": {"name": namespace_name(i), "labels": {"confighash.dev/enabled": "true"}}
        }))
        .expect("a Namespace");
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .expect("create a namespace");
    }
    let objects = fixture::objects();
    let creates = (0..=CHECK_NAMESPACE).flat_map(|i| {
        let ns = namespace_name(i);
        let admin = admin.clone();
        objects.clone().into_iter().map(move |object| {
            let (ns, admin) = (ns.clone(), admin.clone());
            async move {
                match object {
                    Fetched::ConfigMap(mut cm) => {
                        cm.metadata.namespace = Some(ns.clone());
                        cm.metadata.resource_version = None;
                        Api::<ConfigMap>::namespaced(admin, &ns)
                            .create(&PostParams::default(), &cm)
                            .await
                            .map(drop)
                    }
                    Fetched::Secret(mut s) => {
                        s.metadata.namespace = Some(ns.clone());
                        s.metadata.resource_version = None;
                        Api::<Secret>::namespaced(admin, &ns)
                            .create(&PostParams::default(), &s)
                            .await
                            .map(drop)
                    }
                    Fetched::Entry(_) => unreachable!("the fixture holds whole objects"),
                }
            }
        })
    });
    let created: Vec<_> = futures::stream::iter(creates)
        .buffer_unordered(16)
        .collect()
        .await;
    for result in &created {
        result.as_ref().expect("create a referenced object");
    }

    // The webhook, as `confighash serve` starts it.
    let ca = TestCa::new("load_run CA");
    let volume = {
        let pair = ca.issue(SERVING_NAMES);
        SecretVolume::new(&pair.cert_pem, &pair.key_pem)
    };
    let metrics = Arc::new(Metrics::new());
    let webhook = Arc::new(
        Webhook::new(
            Arc::new(KubeSource::new(confighash)),
            Arc::new(KeyStore::new(key)),
            metrics.clone(),
        )
        .with_lookup_deadline(LOOKUP_DEADLINE),
    );
    let running = serve::start(WebhookServeConfig {
        listen: "127.0.0.1:0".parse().expect("an address"),
        admin_listen: "127.0.0.1:0".parse().expect("an address"),
        certs: CertStore::load(volume.cert(), volume.key()).expect("the serving pair"),
        client_ca: None,
        webhook,
        health: Arc::new(Health::default()),
        cert_poll: options.cert_poll,
        header_read_timeout: Duration::from_secs(10),
        drain_timeout: Duration::from_secs(20),
    })
    .await
    .expect("the webhook starts");
    let addr = running.webhook_addr;
    Env {
        api,
        running,
        metrics,
        url: format!("https://127.0.0.1:{}/mutate", addr.port()),
        addr,
        ca,
        volume: Mutex::new(volume),
        templates: Arc::new(templates()),
        expected: Arc::new(expected),
    }
}

// ---------------------------------------------------------------------------------------------
// Checking a reply

/// What a reply did to the submitted object.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Effect {
    /// The expected stamp, nothing else changed.
    Stamped,
    /// What rule 1 wants (the old stamp kept, or the marker on CREATE), nothing else changed.
    Kept,
    /// Both of the above (a scale: no patch either way).
    Either,
    /// Anything else; `template_kept` says whether the pod template is still what rule 1 wants.
    Other { template_kept: bool, what: String },
}

/// The effects of patches already checked, by review kind, expected stamp and patch.
type Effects = HashMap<(ReviewKind, String, Option<String>), Effect>;

/// Checks a reply to review `uid` in a namespace whose expected stamp is `expected`: 200, a
/// well-formed allowed AdmissionReview response for that uid, and what its patch does. `cache`
/// memoizes the patch's effect per review kind and expected stamp.
fn effect_of(
    template: &Template,
    expected: &str,
    uid: &str,
    status: u16,
    body: &[u8],
    cache: &mut Effects,
) -> Result<Effect, String> {
    if status != 200 {
        return Err(format!(
            "status {status}: {}",
            String::from_utf8_lossy(body)
        ));
    }
    let review: Value =
        serde_json::from_slice(body).map_err(|e| format!("not JSON ({e}): {body:?}"))?;
    if review["apiVersion"] != "admission.k8s.io/v1" || review["kind"] != "AdmissionReview" {
        return Err(format!("not an AdmissionReview: {review}"));
    }
    let response = &review["response"];
    if response["uid"] != uid {
        return Err(format!("uid {} for review {uid}", response["uid"]));
    }
    if response["allowed"] != true {
        return Err(format!("not allowed: {review}"));
    }
    let patch = response["patch"].as_str().map(str::to_owned);
    if patch.is_some() && response["patchType"] != "JSONPatch" {
        return Err(format!("patchType {}", response["patchType"]));
    }
    let key = (template.kind, expected.to_owned(), patch);
    if let Some(effect) = cache.get(&key) {
        return Ok(effect.clone());
    }
    let patch = &key.2;
    let mut result = with_stamp(&template.object, expected);
    if let Some(p) = patch {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(p)
            .map_err(|e| format!("patch is not base64: {e}"))?;
        let ops: json_patch::Patch =
            serde_json::from_slice(&bytes).map_err(|e| format!("not a JSONPatch: {e}"))?;
        json_patch::patch(&mut result, &ops).map_err(|e| format!("patch does not apply: {e}"))?;
    }
    let expect_failed = with_stamp(&template.expect_failed, expected);
    let effect = match (
        result == with_stamp(&template.expect_ok, expected),
        result == expect_failed,
    ) {
        (true, true) => Effect::Either,
        (true, false) => Effect::Stamped,
        (false, true) => Effect::Kept,
        (false, false) => Effect::Other {
            template_kept: result.pointer("/spec/template")
                == expect_failed.pointer("/spec/template"),
            what: format!(
                "stamp {:?}, marker {:?}",
                result
                    .pointer("/spec/template/metadata/annotations")
                    .and_then(|a| a.get(CHECKSUM_ANNOTATION)),
                result["metadata"]["annotations"].get(UNSTAMPED_ANNOTATION)
            ),
        },
    };
    cache.insert(key, effect.clone());
    Ok(effect)
}

// ---------------------------------------------------------------------------------------------
// The open loop

/// One send.
struct Sent {
    kind: usize,
    namespace: usize,
    uid: String,
    /// The scheduled time.
    at: Instant,
    done: Instant,
    status: u16,
    body: Vec<u8>,
    error: Option<String>,
}

/// What a phase measured, before checking.
struct Raw {
    sent: Vec<Sent>,
    lags: Vec<Duration>,
    /// Sends to a namespace that still had a review in flight (none free).
    shared_namespace: u64,
    start: Instant,
    sending: Duration,
    finished: Duration,
    clients_created: u64,
}

async fn open_loop(env: &Env, options: &Options, phase: u8, duration: Duration) -> Raw {
    let count = (f64::from(options.rate) * duration.as_secs_f64()).round() as usize;
    let rate = f64::from(options.rate);
    let runtime = tokio::runtime::Handle::current();
    let clients: Arc<Mutex<Vec<HttpsClient>>> = Arc::new(Mutex::new(
        (0..CLIENT_SLOTS)
            .map(|_| HttpsClient::new(&env.ca.pem))
            .collect(),
    ));
    let created = Arc::new(AtomicU64::new(CLIENT_SLOTS as u64));
    // Every second, one client is replaced by a fresh one (a new connection, a new handshake).
    let rotation = tokio::spawn({
        let (clients, created, ca) = (clients.clone(), created.clone(), env.ca.pem.clone());
        async move {
            let mut slot = 0;
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let fresh = HttpsClient::new(&ca);
                clients.lock().expect("clients")[slot % CLIENT_SLOTS] = fresh;
                created.fetch_add(1, Ordering::Relaxed);
                slot += 1;
            }
        }
    });
    let in_flight: Arc<Vec<AtomicU32>> =
        Arc::new((0..NAMESPACES).map(|_| AtomicU32::new(0)).collect());
    let names: Arc<Vec<String>> = Arc::new((0..NAMESPACES).map(namespace_name).collect());
    let templates = env.templates.clone();
    let stamps = env.expected.clone();
    let url = Arc::new(env.url.clone());
    let (tasks, lags, shared_namespace, start, sending) = tokio::task::spawn_blocking(move || {
        let start = Instant::now() + Duration::from_millis(5);
        let mut tasks = Vec::with_capacity(count);
        let mut lags = Vec::with_capacity(count);
        let mut cursor = 0usize;
        let mut shared = 0u64;
        for i in 0..count {
            let at = start + Duration::from_secs_f64(i as f64 / rate);
            let now = Instant::now();
            if at > now {
                std::thread::sleep(at - now);
            }
            lags.push(Instant::now().saturating_duration_since(at));
            let kind = match MIX[i % MIX.len()] {
                ReviewKind::Create => 0,
                ReviewKind::UpdateChanged => 1,
                ReviewKind::UpdateDropped => 2,
                ReviewKind::UpdateTouch => 3,
                ReviewKind::UpdateScale => 4,
            };
            // A namespace with no review in flight, so a failed lookup names its review.
            let free = (0..NAMESPACES)
                .map(|k| (cursor + k) % NAMESPACES)
                .find(|&n| in_flight[n].load(Ordering::Acquire) == 0);
            let namespace = free.unwrap_or_else(|| {
                shared += 1;
                cursor % NAMESPACES
            });
            cursor = namespace + 1;
            in_flight[namespace].fetch_add(1, Ordering::AcqRel);
            let client = clients.lock().expect("clients")[i % CLIENT_SLOTS].clone();
            let (templates, names, stamps, in_flight, url) = (
                templates.clone(),
                names.clone(),
                stamps.clone(),
                in_flight.clone(),
                url.clone(),
            );
            tasks.push(runtime.spawn(async move {
                let uid = review_uid(phase, i);
                let body = templates[kind].body_for(&names[namespace], &stamps[namespace], &uid);
                let reply = client.post(&url, body).await;
                let done = Instant::now();
                in_flight[namespace].fetch_sub(1, Ordering::AcqRel);
                let (status, body, error) = match reply {
                    Ok(r) => (r.status, r.body, None),
                    Err(e) => (0, Vec::new(), Some(e)),
                };
                Sent {
                    kind,
                    namespace,
                    uid,
                    at,
                    done,
                    status,
                    body,
                    error,
                }
            }));
        }
        let sending = Instant::now().saturating_duration_since(start);
        (tasks, lags, shared, start, sending)
    })
    .await
    .expect("the sender thread");
    let mut sent = Vec::with_capacity(count);
    // Every exchange is bounded by the client's own 10 s timeout.
    for task in tasks {
        sent.push(task.await.expect("a send task"));
    }
    let finished = start.elapsed();
    rotation.abort();
    Raw {
        sent,
        lags,
        shared_namespace,
        start,
        sending,
        finished,
        clients_created: created.load(Ordering::Relaxed),
    }
}

// ---------------------------------------------------------------------------------------------
// Renewals

struct Renewal {
    /// Seconds into the phase.
    at: f64,
    /// From writing the files to a fresh connection being presented the new certificate.
    served_after: Option<Duration>,
    /// A review over a fresh client after that: 200 with the expected stamp, or (when a
    /// lookup failed) kept as rule 1 says.
    review_ok: Result<Effect, String>,
}

/// Renews the serving pair at `offsets` from `start`, and checks each is served.
async fn renewals(
    env: &Env,
    start: Instant,
    offsets: [Duration; 2],
    cert_poll: Duration,
) -> Vec<Renewal> {
    let mut out = Vec::new();
    for (n, offset) in offsets.into_iter().enumerate() {
        tokio::time::sleep_until((start + offset).into()).await;
        let pair = env.ca.issue(SERVING_NAMES);
        let written = Instant::now();
        env.volume
            .lock()
            .expect("the volume")
            .update(&pair.cert_pem, &pair.key_pem);
        let deadline = written + cert_poll + Duration::from_secs(10);
        let mut served_after = None;
        while Instant::now() < deadline {
            if presented_certificate(env.addr, &env.ca.pem).await.as_ref() == Ok(&pair.der) {
                served_after = Some(written.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let review_ok = match served_after {
            None => Err("the new certificate was not served".to_owned()),
            Some(_) => check_one(env, &HttpsClient::new(&env.ca.pem), 0xff, n).await,
        };
        out.push(Renewal {
            at: written.duration_since(start).as_secs_f64(),
            served_after,
            review_ok,
        });
    }
    out
}

/// One CREATE review in the check namespace (which the load does not use): 200 and the stamp,
/// or the marker if the lookup failed (faults are being injected).
async fn check_one(env: &Env, client: &HttpsClient, phase: u8, i: usize) -> Result<Effect, String> {
    let template = &env.templates[0];
    let uid = review_uid(phase, i);
    let reply = client
        .post(
            &env.url,
            template.body_for(
                &namespace_name(CHECK_NAMESPACE),
                &env.expected[CHECK_NAMESPACE],
                &uid,
            ),
        )
        .await?;
    match effect_of(
        template,
        &env.expected[CHECK_NAMESPACE],
        &uid,
        reply.status,
        &reply.body,
        &mut HashMap::new(),
    )? {
        Effect::Other { what, .. } => Err(format!("unexpected answer: {what}")),
        effect => Ok(effect),
    }
}

// ---------------------------------------------------------------------------------------------
// Checking a phase

#[derive(Default)]
struct Tally {
    scheduled: usize,
    ok: usize,
    failed: usize,
    failures: Vec<String>,
    latencies: Vec<Duration>,
    lags: Vec<Duration>,
    sending: Duration,
    finished: Duration,
    shared_namespace: u64,
    clients_created: u64,
    /// Stand-in GETs of ConfigMaps and Secrets during the phase.
    lookups: usize,
    injected: usize,
    /// Injected failures that matched no review, or more than one.
    unattributed: usize,
    ambiguous: usize,
    /// Reviews that saw at least one injected failure, by kind.
    with_errors: HashMap<ReviewKind, usize>,
    changed_on_error: usize,
    wrong_on_error: usize,
    wrong_on_success: usize,
    /// Reviews with no injected failure answered as rule 1 (deadline passed).
    kept_without_fault: usize,
    examples: Vec<String>,
    /// From the webhook's metrics, over the phase.
    metric_kept_on_error: u64,
    metric_lookup_errors: u64,
    metric_lookup_deadline: u64,
    /// Failures injected into, and reviews kept by, the renewal checks' reviews.
    check_injected: usize,
    check_kept: usize,
    /// CPU time of this process (server, stand-in and load generator) over the phase.
    cpu: Duration,
    /// Share of the machine's CPU time (all cores) that was busy over the phase, by anyone.
    machine_busy: f64,
}

impl Tally {
    fn reviews_with_errors(&self) -> usize {
        self.with_errors.values().sum()
    }

    fn p(&self, pct: f64) -> Duration {
        percentile(&self.latencies, pct)
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    // Nearest rank.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Webhook metric snapshot: kept-on-error reviews, lookups by outcome error and deadline.
fn metric_snapshot(metrics: &Metrics) -> (u64, u64, u64) {
    let kept = ["CREATE", "UPDATE"]
        .into_iter()
        .map(|op| metrics.requests("Deployment", op, "kept-on-error"))
        .sum();
    let text = metrics.encode();
    let lookups = |outcome: &str| -> u64 {
        text.lines()
            .filter(|l| {
                l.starts_with("confighash_webhook_lookups_total{")
                    && l.contains(&format!("outcome=\"{outcome}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    };
    (kept, lookups("error"), lookups("deadline"))
}

fn tally(
    env: &Env,
    raw: Raw,
    faults: &[InjectedFault],
    lookups: usize,
    metrics: ((u64, u64, u64), (u64, u64, u64)),
) -> Tally {
    let mut t = Tally {
        scheduled: raw.sent.len(),
        sending: raw.sending,
        finished: raw.finished,
        shared_namespace: raw.shared_namespace,
        clients_created: raw.clients_created,
        lookups,
        injected: faults.len(),
        ..Default::default()
    };
    let mut lags = raw.lags;
    lags.sort_unstable();
    t.lags = lags;

    // Match each injected failure to the review of its namespace in flight at that time.
    let mut by_namespace: HashMap<usize, Vec<usize>> = HashMap::new();
    for (i, s) in raw.sent.iter().enumerate() {
        by_namespace.entry(s.namespace).or_default().push(i);
    }
    let index: HashMap<String, usize> = (0..NAMESPACES).map(|i| (namespace_name(i), i)).collect();
    let mut saw_error = vec![false; raw.sent.len()];
    let mut maybe_error = vec![false; raw.sent.len()];
    for f in faults {
        let candidates: Vec<usize> = f
            .namespace
            .as_ref()
            .and_then(|ns| index.get(ns))
            .and_then(|n| by_namespace.get(n))
            .map(|reviews| {
                reviews
                    .iter()
                    .copied()
                    .filter(|&i| raw.sent[i].at <= f.at && f.at <= raw.sent[i].done)
                    .collect()
            })
            .unwrap_or_default();
        match candidates.as_slice() {
            [one] => saw_error[*one] = true,
            [] => {
                t.unattributed += 1;
                if t.examples.len() < 10 {
                    t.examples.push(format!(
                        "injected failure of {} {:?}/{:?} matches no review in flight",
                        f.resource, f.namespace, f.name
                    ));
                }
            }
            many => {
                t.ambiguous += 1;
                for &i in many {
                    maybe_error[i] = true;
                }
            }
        }
    }

    let mut cache = HashMap::new();
    for (i, s) in raw.sent.iter().enumerate() {
        let template = &env.templates[s.kind];
        let effect = match &s.error {
            Some(e) => Err(e.clone()),
            None => effect_of(
                template,
                &env.expected[s.namespace],
                &s.uid,
                s.status,
                &s.body,
                &mut cache,
            ),
        };
        let effect = match effect {
            Ok(effect) => {
                t.ok += 1;
                t.latencies.push(s.done.duration_since(s.at));
                effect
            }
            Err(e) => {
                t.failed += 1;
                if t.failures.len() < 10 {
                    t.failures.push(format!(
                        "{} in {} at {:.3} s: {e}",
                        template.kind.name(),
                        namespace_name(s.namespace),
                        s.at.duration_since(raw.start).as_secs_f64()
                    ));
                }
                continue;
            }
        };
        let example = |t: &mut Tally, what: &str| {
            if t.examples.len() < 10 {
                t.examples.push(format!(
                    "{} (uid {}, {}): {what}: {effect:?}",
                    template.kind.name(),
                    s.uid,
                    namespace_name(s.namespace)
                ));
            }
        };
        if saw_error[i] {
            *t.with_errors.entry(template.kind).or_default() += 1;
            match &effect {
                Effect::Kept | Effect::Either => {}
                Effect::Stamped
                | Effect::Other {
                    template_kept: false,
                    ..
                } => {
                    t.changed_on_error += 1;
                    example(&mut t, "template changed on a lookup error");
                }
                Effect::Other { .. } => {
                    t.wrong_on_error += 1;
                    example(&mut t, "wrong marker on a lookup error");
                }
            }
        } else if maybe_error[i] {
            if let Effect::Other { .. } = effect {
                t.wrong_on_success += 1;
                example(&mut t, "neither outcome");
            }
        } else {
            match &effect {
                Effect::Stamped | Effect::Either => {}
                Effect::Kept => t.kept_without_fault += 1,
                Effect::Other { .. } => {
                    t.wrong_on_success += 1;
                    example(&mut t, "wrong answer without a lookup error");
                }
            }
        }
    }
    t.latencies.sort_unstable();
    let ((k0, e0, d0), (k1, e1, d1)) = metrics;
    t.metric_kept_on_error = k1 - k0;
    t.metric_lookup_errors = e1 - e0;
    t.metric_lookup_deadline = d1 - d0;
    t
}

/// Stand-in GETs of ConfigMaps and Secrets so far.
fn lookup_gets(api: &ApiServer) -> usize {
    api.requests()
        .iter()
        .filter(|(verb, resource)| {
            verb == "get" && (resource == "configmaps" || resource == "secrets")
        })
        .count()
}

/// Runs one phase and checks it.
async fn phase(env: &Env, options: &Options, number: u8, faults: bool) -> (Tally, Vec<Renewal>) {
    let faults_before = env.api.injected_faults().len();
    let gets_before = lookup_gets(&env.api);
    let metrics_before = metric_snapshot(&env.metrics);
    if faults {
        for resource in ["configmaps", "secrets"] {
            env.api
                .fail_fraction(Some("get"), Some(resource), options.fraction, 500);
        }
    }
    let start = Instant::now();
    let cpu_before = process_cpu();
    let machine_before = procs::machine_cpu();
    let renew = async {
        if faults {
            let third = options.duration / 3;
            renewals(env, start, [third, third * 2], options.cert_poll).await
        } else {
            Vec::new()
        }
    };
    let (raw, renewed) = tokio::join!(open_loop(env, options, number, options.duration), renew);
    env.api.clear_faults();
    let cpu = process_cpu().saturating_sub(cpu_before);
    let machine_after = procs::machine_cpu();
    let metrics_after = metric_snapshot(&env.metrics);
    let check = namespace_name(CHECK_NAMESPACE);
    let (checks, load): (Vec<_>, Vec<_>) = env.api.injected_faults()[faults_before..]
        .iter()
        .cloned()
        .partition(|f| f.namespace.as_deref() == Some(check.as_str()));
    let gets = lookup_gets(&env.api) - gets_before;
    let mut t = tally(env, raw, &load, gets, (metrics_before, metrics_after));
    // The renewal checks' reviews, for the comparison with the webhook's metrics.
    t.check_injected = checks.len();
    t.check_kept = renewed
        .iter()
        .filter(|r| matches!(r.review_ok, Ok(Effect::Kept)))
        .count();
    t.cpu = cpu;
    let (busy, total) = (
        machine_after.0.saturating_sub(machine_before.0),
        machine_after.1.saturating_sub(machine_before.1),
    );
    t.machine_busy = busy as f64 / total.max(1) as f64;
    (t, renewed)
}

/// User and system CPU time of this process so far (all threads).
fn process_cpu() -> Duration {
    procs::process_cpu(std::process::id())
}

// ---------------------------------------------------------------------------------------------
// Report

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

fn row(name: &str, t: &Tally) -> String {
    format!(
        "| {name} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {} / {} | {:.0} % ({:.2} ms/review); {:.0} % |",
        t.scheduled,
        t.ok,
        t.failed,
        ms(t.p(50.0)),
        ms(t.p(90.0)),
        ms(t.p(99.0)),
        ms(t.latencies.last().copied().unwrap_or_default()),
        t.scheduled as f64 / t.sending.as_secs_f64(),
        t.ok as f64 / t.finished.as_secs_f64(),
        ms(percentile(&t.lags, 50.0)),
        ms(percentile(&t.lags, 99.0)),
        100.0 * t.cpu.as_secs_f64() / t.finished.as_secs_f64(),
        t.cpu.as_secs_f64() * 1000.0 / t.scheduled.max(1) as f64,
        t.machine_busy * 100.0,
    )
}

async fn run(options: Options) -> Vec<String> {
    let setup = Instant::now();
    let env = start(&options).await;
    let sizes: Vec<String> = env
        .templates
        .iter()
        .map(|t| format!("{} {} B", t.kind.name(), t.body.len()))
        .collect();
    println!(
        "load_run{}: {} reviews/s for {:.0} s per phase, {:.1} % of ConfigMap/Secret GETs failed \
         with 500 in the fault phase, certificate reload interval {:.0} s",
        if options.quick { " (quick)" } else { "" },
        options.rate,
        options.duration.as_secs_f64(),
        options.fraction * 100.0,
        options.cert_poll.as_secs_f64(),
    );
    println!(
        "setup: {NAMESPACES} namespaces x {} objects in the stand-in in {:.1} s; review bodies: {}",
        fixture::REFERENCES,
        setup.elapsed().as_secs_f64(),
        sizes.join(", ")
    );
    println!(
        "expected stamp in {}: {}",
        namespace_name(0),
        env.expected[0]
    );

    let mut failures = Vec::new();
    // The initial certificate, and one review of each kind answered as expected.
    let initial = presented_certificate(env.addr, &env.ca.pem).await;
    if initial.is_err() {
        failures.push(format!("initial handshake: {initial:?}"));
    }
    {
        let client = HttpsClient::new(&env.ca.pem);
        for (k, template) in env.templates.iter().enumerate() {
            let uid = review_uid(0xfe, k);
            let reply = client
                .post(
                    &env.url,
                    template.body_for(&namespace_name(k), &env.expected[k], &uid),
                )
                .await;
            let effect = reply.and_then(|r| {
                effect_of(
                    template,
                    &env.expected[k],
                    &uid,
                    r.status,
                    &r.body,
                    &mut HashMap::new(),
                )
            });
            if !matches!(effect, Ok(Effect::Stamped | Effect::Either)) {
                failures.push(format!(
                    "check before the run, {}: {effect:?}",
                    template.kind.name()
                ));
            }
        }
    }
    if !failures.is_empty() {
        return failures;
    }

    // Warm-up: connections, allocator, caches.
    let warm = Options {
        duration: options.warm_up,
        ..options
    };
    let _ = open_loop(&env, &warm, 0xfd, warm.duration).await;

    // Baseline, faults, baseline again: on a shared machine, the two baselines show how much
    // the conditions moved while the fault phase ran.
    let mut baselines = Vec::new();
    if options.baseline {
        println!("phase 1: baseline (no faults, no renewals)");
        baselines.push(phase(&env, &options, 1, false).await.0);
    }
    println!("phase 2: faults and renewals");
    let (faulted, renewed) = phase(&env, &options, 2, true).await;
    if options.baseline {
        println!("phase 3: baseline again");
        baselines.push(phase(&env, &options, 3, false).await.0);
    }

    let reloads = env
        .metrics
        .encode()
        .lines()
        .find(|l| l.starts_with("confighash_certificate_reloads_total"))
        .map(str::to_owned)
        .unwrap_or_default();
    env.running.shutdown().await;

    // Report.
    println!();
    println!(
        "Open loop, {} reviews/s for {:.0} s per phase; latency from the scheduled send to the end \
         of the reply (ms); each phase's reviews: 20 % CREATE, 80 % UPDATE of a {}-reference \
         Deployment in one of {NAMESPACES} namespaces",
        options.rate,
        options.duration.as_secs_f64(),
        fixture::REFERENCES
    );
    println!(
        "| phase | sent | ok | failed | p50 | p90 | p99 | max | sent/s | replies/s | sender lag p50 / p99 | CPU: this process (100 % = 1 core); whole machine busy |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    if let Some(b) = baselines.first() {
        println!("{}", row("1. baseline: no faults, no renewals", b));
    }
    println!(
        "{}",
        row(
            &format!(
                "2. faults: {:.1} % of lookups fail, 2 renewals",
                options.fraction * 100.0
            ),
            &faulted
        )
    );
    if let Some(b) = baselines.get(1) {
        println!("{}", row("3. baseline again", b));
    }
    for (which, b) in ["before", "after"].iter().zip(&baselines) {
        let ratio = |p: f64| faulted.p(p).as_secs_f64() / b.p(p).as_secs_f64();
        println!(
            "faults / baseline {which}: p50 {:.2}x, p90 {:.2}x, p99 {:.2}x ({} ms vs {} ms)",
            ratio(50.0),
            ratio(90.0),
            ratio(99.0),
            ms(faulted.p(99.0)),
            ms(b.p(99.0))
        );
    }
    println!();
    let kinds = [
        ReviewKind::Create,
        ReviewKind::UpdateChanged,
        ReviewKind::UpdateDropped,
        ReviewKind::UpdateTouch,
        ReviewKind::UpdateScale,
    ];
    let by_kind: Vec<String> = kinds
        .iter()
        .map(|k| {
            format!(
                "{} {}",
                k.name(),
                faulted.with_errors.get(k).copied().unwrap_or(0)
            )
        })
        .collect();
    println!("Fault phase counts");
    println!("| count | value |\n|---|---|");
    for (what, value) in [
        ("reviews sent", faulted.scheduled.to_string()),
        (
            "HTTP exchanges ok (200, valid AdmissionReview for its uid)",
            faulted.ok.to_string(),
        ),
        ("HTTP exchanges failed", faulted.failed.to_string()),
        (
            "ConfigMap/Secret GETs at the stand-in",
            faulted.lookups.to_string(),
        ),
        (
            "lookup errors injected (500)",
            format!(
                "{} ({:.2} % of GETs)",
                faulted.injected,
                100.0 * faulted.injected as f64 / faulted.lookups.max(1) as f64
            ),
        ),
        (
            "reviews with lookup errors",
            format!("{} ({})", faulted.reviews_with_errors(), by_kind.join(", ")),
        ),
        (
            "template changed on a lookup error",
            faulted.changed_on_error.to_string(),
        ),
        (
            "wrong marker on a lookup error (template kept)",
            faulted.wrong_on_error.to_string(),
        ),
        (
            "wrong answers without a lookup error",
            faulted.wrong_on_success.to_string(),
        ),
        (
            "kept without an injected error (lookup deadline)",
            faulted.kept_without_fault.to_string(),
        ),
        (
            "injected errors matched to no review / to several",
            format!("{} / {}", faulted.unattributed, faulted.ambiguous),
        ),
        (
            "sends to a namespace with a review in flight",
            faulted.shared_namespace.to_string(),
        ),
        (
            "webhook metrics: kept-on-error reviews, lookup errors, deadline lookups",
            format!(
                "{}, {}, {}",
                faulted.metric_kept_on_error,
                faulted.metric_lookup_errors,
                faulted.metric_lookup_deadline
            ),
        ),
        (
            "HTTPS clients (fresh connections)",
            faulted.clients_created.to_string(),
        ),
    ] {
        println!("| {what} | {value} |");
    }
    for (n, r) in renewed.iter().enumerate() {
        println!(
            "| renewal {} at {:.1} s: new certificate on a fresh connection after | {} |",
            n + 1,
            r.at,
            match (r.served_after, &r.review_ok) {
                (Some(d), Ok(effect)) => format!(
                    "{:.2} s, review over it ok ({})",
                    d.as_secs_f64(),
                    if *effect == Effect::Kept {
                        "lookup failed, marker"
                    } else {
                        "stamped"
                    }
                ),
                (Some(d), Err(e)) =>
                    format!("{:.2} s, review over it FAILED: {e}", d.as_secs_f64()),
                (None, _) => "NOT SERVED".to_owned(),
            }
        );
    }
    println!("{reloads}");

    // Assertions.
    let check = |failures: &mut Vec<String>, phase: &str, t: &Tally| {
        if t.failed > 0 {
            failures.push(format!(
                "{phase}: {} failed HTTP exchanges, e.g. {:?}",
                t.failed, t.failures
            ));
        }
        if t.changed_on_error > 0 || t.wrong_on_error > 0 || t.wrong_on_success > 0 {
            failures.push(format!(
                "{phase}: {} templates changed on a lookup error, {} wrong markers, {} wrong \
                 answers; e.g. {:?}",
                t.changed_on_error, t.wrong_on_error, t.wrong_on_success, t.examples
            ));
        }
        if t.unattributed > 0 || t.ambiguous > 0 {
            failures.push(format!(
                "{phase}: {} injected failures matched no review and {} several; e.g. {:?}",
                t.unattributed, t.ambiguous, t.examples
            ));
        }
        // The webhook's own counts must agree with the stand-in's and ours when every exchange
        // completed, every failure was matched, and no deadline passed (a deadline drops the
        // lookups' own results).
        let injected = t.injected + t.check_injected;
        let kept = t.reviews_with_errors() + t.check_kept;
        if t.metric_lookup_deadline == 0
            && t.failed == 0
            && t.unattributed == 0
            && t.ambiguous == 0
            && (t.metric_lookup_errors != injected as u64 || t.metric_kept_on_error != kept as u64)
        {
            failures.push(format!(
                "{phase}: the webhook counted {} lookup errors and {} kept-on-error reviews; the \
                 stand-in injected {injected} and {kept} reviews saw one",
                t.metric_lookup_errors, t.metric_kept_on_error,
            ));
        }
    };
    for (which, b) in ["baseline before", "baseline after"].iter().zip(&baselines) {
        check(&mut failures, which, b);
        if b.injected > 0 {
            failures.push(format!("{which}: {} failures injected", b.injected));
        }
    }
    check(&mut failures, "faults", &faulted);
    if options.fraction > 0.0 && faulted.reviews_with_errors() == 0 {
        failures.push("faults: no review saw a lookup error".to_owned());
    }
    if renewed.len() != 2 {
        failures.push(format!("{} renewals instead of 2", renewed.len()));
    }
    for (n, r) in renewed.iter().enumerate() {
        if r.served_after.is_none() || r.review_ok.is_err() {
            failures.push(format!(
                "renewal {}: served after {:?}, review {:?}",
                n + 1,
                r.served_after,
                r.review_ok
            ));
        }
    }
    failures
}

fn main() {
    let options = match mode::from_args() {
        Mode::Full => Options::from_env_and_args(),
        Mode::Smoke => Options::smoke(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let started = Instant::now();
    let failures = runtime.block_on(run(options));
    runtime.shutdown_timeout(Duration::from_secs(2));
    println!("total {:.1} s", started.elapsed().as_secs_f64());
    if failures.is_empty() {
        println!("RESULT: all assertions held");
    } else {
        for f in &failures {
            println!("ASSERTION FAILED: {f}");
        }
        std::process::exit(1);
    }
}

//! No Secret byte reaches a log line, whatever the API server answers.
//!
//! A hostile API server (plain HTTP, started here) answers every request of the real
//! `confighash serve` binary, in rotation per kind of request, in every malformed and mistyped
//! way below, each answer carrying a canary value (raw, and base64-encoded where a Secret holds
//! it); every other answer is a valid one, also carrying the canary, so the watcher and the key
//! and certificate loading get far enough to make the next request. The webhook is sent reviews
//! over HTTPS that reference ConfigMaps and Secrets, so its lookups meet the same answers. Once
//! every variant has been served to every kind of request the test waits for, serve is stopped
//! and all of its output, at `--log-level trace`, is searched for the canary.
//!
//! Pass 1 runs with `--key-file`; pass 2 with `--key-secret` and `--self-signed-certs`, so the
//! key Secret and the certificate Secret (which holds a CA private key) are read from the
//! hostile server too. Several serve processes run at once: the watcher backs off after each
//! error, and more processes meet more variants in the same time.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use base64::Engine;
use confighash_testkit::apiserver::TestCerts;
use confighash_testkit::apiserver::https::HttpsClient;
use serde_json::{Value, json};
use sha2::Digest;

/// The planted value: not a word (digits and a dash), so no rule that keeps reason words keeps it.
const CANARY: &str = "c4n4ry-Zq81Xw";
/// A planted value that is a plain word, sent where a Status reason goes.
const CANARY_WORD: &str = "Kanariewoordzeta";
/// The checksum key the hostile key Secret holds (32 bytes, the canary among them).
const KEY: &[u8; 32] = b"c4n4ry-Zq81Xw:0123456789abcdef!!";

/// The namespace serve runs in (its kubeconfig context).
const INSTALL_NS: &str = "confighash";
/// The namespace of the reviewed workloads and their ConfigMaps and Secrets.
const APP_NS: &str = "shop";

fn b64(bytes: impl AsRef<[u8]>) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Every form of a planted value that must not appear in the output.
fn needles() -> Vec<String> {
    let mut needles = Vec::new();
    for value in [CANARY.as_bytes(), CANARY_WORD.as_bytes(), KEY.as_slice()] {
        needles.push(String::from_utf8_lossy(value).into_owned());
        needles.push(b64(value));
        // As Debug prints bytes (`ByteString([99, 52, ...])`), the first eight.
        let bytes: Vec<String> = value[..8].iter().map(u8::to_string).collect();
        needles.push(bytes.join(", "));
    }
    needles
}

// ---------------------------------------------------------------------------------------------
// What the hostile server answers

/// The kinds of request the server tells apart; each has its own rotation of answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Class {
    /// The webhook's reads of one ConfigMap or Secret.
    LookupConfigMap,
    LookupSecret,
    ListConfigMaps,
    ListSecrets,
    WatchConfigMaps,
    WatchSecrets,
    /// Namespaces and workloads.
    ListOther,
    WatchOther,
    Discovery,
    /// The checksum key Secret (`--key-secret`).
    KeySecret,
    /// The certificate Secret (`--self-signed-certs`).
    CertsSecret,
    /// Creating or replacing a Secret.
    SecretWrite,
    WebhookConfiguration,
    /// Patching it (its own rotation: it follows a read at once).
    WebhookConfigurationWrite,
    /// Everything else: workload patches, Events.
    Other,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Object,
    List,
    Watch,
    Discovery,
}

impl Class {
    fn shape(self) -> Shape {
        match self {
            Class::ListConfigMaps | Class::ListSecrets | Class::ListOther => Shape::List,
            Class::WatchConfigMaps | Class::WatchSecrets | Class::WatchOther => Shape::Watch,
            Class::Discovery => Shape::Discovery,
            _ => Shape::Object,
        }
    }

    fn of(method: &str, path: &str, watch: bool) -> Class {
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let (group, rest): (&str, &[&str]) = match segments.as_slice() {
            ["api"] | ["apis"] | ["version"] | ["api", _] | ["apis", _] | ["apis", _, _] => {
                return Class::Discovery;
            }
            ["api", _, rest @ ..] => ("", rest),
            ["apis", group, _, rest @ ..] => (group, rest),
            _ => return Class::Other,
        };
        if group == "admissionregistration.k8s.io" {
            return if method == "GET" {
                Class::WebhookConfiguration
            } else {
                Class::WebhookConfigurationWrite
            };
        }
        let (namespace, resource, name) = match rest {
            ["namespaces", ns, resource, tail @ ..] => (Some(*ns), *resource, tail.first()),
            [resource, tail @ ..] => (None, *resource, tail.first()),
            [] => return Class::Other,
        };
        let list = name.is_none();
        match (method, resource, list) {
            ("GET", "configmaps", true) if watch => Class::WatchConfigMaps,
            ("GET", "configmaps", true) => Class::ListConfigMaps,
            ("GET", "secrets", true) if watch => Class::WatchSecrets,
            ("GET", "secrets", true) => Class::ListSecrets,
            ("GET", "configmaps", false) => Class::LookupConfigMap,
            ("GET", "secrets", false) => match name.copied() {
                Some("confighash-key") if namespace == Some(INSTALL_NS) => Class::KeySecret,
                Some("confighash-certs") if namespace == Some(INSTALL_NS) => Class::CertsSecret,
                _ => Class::LookupSecret,
            },
            ("POST" | "PUT" | "PATCH", "secrets", _) => Class::SecretWrite,
            ("GET", _, true) if watch => Class::WatchOther,
            ("GET", _, true) => Class::ListOther,
            _ => Class::Other,
        }
    }
}

/// One way of answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum V {
    /// A good answer, carrying the canary where content goes.
    Valid,
    NotJson,
    TruncatedJson,
    JsonString,
    /// An error Status with the canary in message, details and (for some codes) reason.
    Status(u16),
    PlainText500,
    Html500,
    /// A redirect whose body is a Secret.
    Redirect,
    // Objects (alone, as a list item, or in a watch event).
    SecretDataString,
    SecretDataList,
    SecretDataNotBase64,
    SecretDataNumbers,
    /// A Secret where a ConfigMap was asked for, a ConfigMap anywhere else.
    WrongKind,
    ConfigMapMistyped,
    // Lists.
    ItemsString,
    // Watch streams.
    MalformedLine,
    ErrorEvent,
    ErrorEvent410,
    UnknownEventType,
    RawStatusLine,
    TruncatedLine,
    // Discovery.
    BadGroupVersion,
    ResourcesString,
    // The certificate Secret.
    TlsKeyCanary,
    CaKeyCanary,
}

const OBJECT_VARIANTS: [V; 6] = [
    V::SecretDataString,
    V::SecretDataList,
    V::SecretDataNotBase64,
    V::SecretDataNumbers,
    V::WrongKind,
    V::ConfigMapMistyped,
];

const STATUS_CODES: [u16; 7] = [403, 404, 409, 410, 422, 429, 500];

/// The bad answers of `class`, in rotation order.
fn variants(class: Class) -> Vec<V> {
    let mut v = vec![V::NotJson, V::TruncatedJson, V::JsonString];
    v.extend(STATUS_CODES.map(V::Status));
    v.extend([V::PlainText500, V::Html500, V::Redirect]);
    match class.shape() {
        Shape::Object => v.extend(OBJECT_VARIANTS),
        Shape::List => {
            v.extend(OBJECT_VARIANTS);
            v.push(V::ItemsString);
        }
        Shape::Watch => {
            v.extend(OBJECT_VARIANTS);
            v.extend([
                V::MalformedLine,
                V::ErrorEvent,
                V::ErrorEvent410,
                V::UnknownEventType,
                V::RawStatusLine,
                V::TruncatedLine,
            ]);
        }
        Shape::Discovery => v.extend([V::BadGroupVersion, V::ResourcesString]),
    }
    if class == Class::CertsSecret {
        v.extend([V::TlsKeyCanary, V::CaKeyCanary]);
    }
    v
}

/// Certificate Secret contents the server hands out.
struct CertStates {
    /// Current and valid.
    good: BTreeMap<String, String>,
    /// Valid certificates, a private key whose BEGIN line is the canary.
    tls_key_canary: BTreeMap<String, String>,
    /// A serving certificate due for renewal, and a CA key that is the canary.
    ca_key_canary: BTreeMap<String, String>,
}

impl CertStates {
    fn new() -> Self {
        let names = confighash::certs::certificates::service_names("confighash", INSTALL_NS);
        let state = |days: u32| {
            let g = confighash::certs::certificates::generate(&names, 3650, days)
                .expect("certificates");
            let issuer = hex::encode(sha2::Sha256::digest(g.ca_cert_pem.trim().as_bytes()));
            BTreeMap::from([
                ("ca.crt".to_owned(), g.ca_cert_pem.clone()),
                ("ca.key".to_owned(), g.ca_key_pem),
                ("ca-bundle.crt".to_owned(), g.ca_cert_pem),
                ("tls.crt".to_owned(), g.cert_pem),
                ("tls.key".to_owned(), g.key_pem),
                ("tls-issuer".to_owned(), issuer),
            ])
        };
        let canary_pem = format!(
            "-----BEGIN {CANARY}-----\n{CANARY} is not base64\n-----END {CANARY_WORD}-----\n"
        );
        let good = state(90);
        let mut tls_key_canary = good.clone();
        tls_key_canary.insert("tls.key".into(), canary_pem.clone());
        let mut ca_key_canary = state(10);
        ca_key_canary.insert("ca.key".into(), canary_pem);
        CertStates {
            good,
            tls_key_canary,
            ca_key_canary,
        }
    }
}

/// What the server has done so far.
#[derive(Default)]
struct Served {
    next: BTreeMap<Class, usize>,
    served: BTreeMap<Class, BTreeSet<V>>,
    requests: usize,
    /// Webhook configuration requests still to answer validly, so that a certificate Secret
    /// with a planted key gets as far as being parsed.
    let_certs_through: usize,
}

struct Hostile {
    served: Mutex<Served>,
    certs: CertStates,
}

impl Hostile {
    /// The classes in `wanted` that have not yet been served every variant (and a valid answer).
    fn missing(&self, wanted: &[Class]) -> Vec<(Class, Vec<V>)> {
        let served = self.served.lock().unwrap();
        wanted
            .iter()
            .filter_map(|class| {
                let seen = served.served.get(class);
                let missing: Vec<V> = variants(*class)
                    .into_iter()
                    .chain([V::Valid])
                    .filter(|v| !seen.is_some_and(|s| s.contains(v)))
                    .collect();
                (!missing.is_empty()).then_some((*class, missing))
            })
            .collect()
    }

    fn summary(&self) -> String {
        let served = self.served.lock().unwrap();
        let mut out = format!("{} requests;", served.requests);
        for (class, seen) in &served.served {
            out += &format!(" {class:?} {}/{},", seen.len(), variants(*class).len() + 1);
        }
        out
    }
}

/// The kind of object a path is about, for valid answers and wrong-kind ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    ConfigMap,
    Secret,
    Namespace,
    Workload(&'static str),
    Event,
    WebhookConfiguration,
}

fn kind_of(path: &str) -> Kind {
    let has = |s: &str| path.split('/').any(|p| p == s);
    if has("configmaps") {
        Kind::ConfigMap
    } else if has("secrets") {
        Kind::Secret
    } else if has("events") {
        Kind::Event
    } else if path.contains("mutatingwebhookconfigurations") {
        Kind::WebhookConfiguration
    } else if has("deployments") {
        Kind::Workload("Deployment")
    } else if has("statefulsets") {
        Kind::Workload("StatefulSet")
    } else if has("daemonsets") {
        Kind::Workload("DaemonSet")
    } else if has("cronjobs") {
        Kind::Workload("CronJob")
    } else if has("rollouts") {
        Kind::Workload("Rollout")
    } else if has("namespaces") {
        Kind::Namespace
    } else {
        Kind::Secret
    }
}

fn meta(name: &str, namespace: &str) -> Value {
    json!({"name": name, "namespace": namespace, "resourceVersion": "7", "uid": "0a0a"})
}

fn config_map(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(name, APP_NS),
        "data": {"k": CANARY, "w": CANARY_WORD}, "binaryData": {"b": b64(CANARY)}})
}

fn secret(name: &str, namespace: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta(name, namespace), "type": "Opaque",
        "data": {"k": b64(CANARY), "w": b64(CANARY_WORD), "key": b64(KEY)}})
}

fn workload(kind: &str, name: &str) -> Value {
    let pod = json!({
        // A stale stamp made with pass 1's key (id 3eb1bd43): reconcile may patch the workload.
        "metadata": {"annotations": {"confighash.dev/checksum": format!("v2:3eb1bd43:{}", "0".repeat(64))}},
        "spec": {"containers": [{"name": "c", "image": "i",
            "env": [{"name": "E", "value": CANARY}],
            "envFrom": [{"configMapRef": {"name": "cfg"}}, {"secretRef": {"name": "db"}}]}]}
    });
    let spec = if kind == "CronJob" {
        json!({"schedule": "* * * * *", "jobTemplate": {"spec": {"template": pod}}})
    } else {
        json!({"selector": {"matchLabels": {"app": name}}, "template": pod})
    };
    let api_version = match kind {
        "CronJob" => "batch/v1",
        "Rollout" => "argoproj.io/v1alpha1",
        _ => "apps/v1",
    };
    json!({"apiVersion": api_version, "kind": kind, "metadata": meta(name, APP_NS), "spec": spec})
}

fn webhook_configuration() -> Value {
    json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "confighash", "resourceVersion": "7"},
        "webhooks": [{"name": "stamp.confighash.dev", "admissionReviewVersions": ["v1"],
            "sideEffects": "None", "clientConfig": {"caBundle": b64(CANARY)}}]})
}

fn event() -> Value {
    json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": meta("e", APP_NS),
        "eventTime": "2025-01-01T00:00:00.000000Z", "note": CANARY})
}

/// A valid object for `path` (of `class`).
fn valid_object(class: Class, path: &str, certs: &CertStates) -> Value {
    // In lists and watches, the objects the workloads reference.
    let name = match (class.shape(), kind_of(path)) {
        (Shape::Object, _) => path.rsplit('/').next().unwrap_or("x"),
        (_, Kind::ConfigMap) => "cfg",
        _ => "db",
    };
    match (class, kind_of(path)) {
        (Class::KeySecret, _) => secret("confighash-key", INSTALL_NS),
        (Class::CertsSecret, _) => certs_secret(&certs.good),
        (_, Kind::ConfigMap) => config_map(name),
        (_, Kind::Secret) => secret(name, APP_NS),
        (_, Kind::Namespace) => json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": APP_NS, "resourceVersion": "7",
                "labels": {"confighash.dev/enabled": "true"}}}),
        (_, Kind::Workload(kind)) => workload(kind, "web"),
        (_, Kind::Event) => event(),
        (_, Kind::WebhookConfiguration) => webhook_configuration(),
    }
}

fn certs_secret(state: &BTreeMap<String, String>) -> Value {
    let data: serde_json::Map<String, Value> = state
        .iter()
        .map(|(k, v)| (k.clone(), Value::from(b64(v))))
        .collect();
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta("confighash-certs", INSTALL_NS),
        "data": data})
}

/// A malformed or mistyped object, for `path`.
fn bad_object(v: V, path: &str) -> Value {
    let m = meta("bad", APP_NS);
    match v {
        V::SecretDataString => json!({"apiVersion": "v1", "kind": "Secret", "metadata": m,
            "data": b64(CANARY)}),
        V::SecretDataList => json!({"apiVersion": "v1", "kind": "Secret", "metadata": m,
            "data": [b64(CANARY), CANARY]}),
        V::SecretDataNotBase64 => json!({"apiVersion": "v1", "kind": "Secret", "metadata": m,
            "data": {"k": CANARY, "w": CANARY_WORD}}),
        V::SecretDataNumbers => json!({"apiVersion": "v1", "kind": "Secret", "metadata": m,
            "data": {"a": 12345, "k": b64(CANARY)}}),
        V::WrongKind if kind_of(path) == Kind::ConfigMap => secret("bad", APP_NS),
        V::WrongKind => config_map("bad"),
        V::ConfigMapMistyped => json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": m,
            "data": {"k": [CANARY]}, "binaryData": {"b": CANARY}}),
        _ => unreachable!("{v:?} is not an object variant"),
    }
}

fn status(code: u16) -> Value {
    let reason = match code {
        404 => "NotFound",
        409 => "Conflict",
        410 => "Expired",
        _ => CANARY_WORD,
    };
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("{CANARY} ({}) is invalid", b64(CANARY)), "reason": reason,
        "details": {"name": CANARY, "kind": CANARY_WORD,
            "causes": [{"reason": CANARY_WORD, "message": CANARY, "field": b64(CANARY)}]},
        "code": code})
}

fn list_of(path: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "9"},
        "items": items, "note": path})
}

fn event_line(kind: &str, object: &Value) -> String {
    format!("{}\n", json!({"type": kind, "object": object}))
}

fn discovery(path: &str) -> Value {
    let resource = |name: &str, kind: &str| {
        json!({"name": name, "singularName": "", "namespaced": true, "kind": kind,
            "verbs": ["get", "list", "watch", "patch"]})
    };
    match path {
        "/apis/apps/v1" => json!({"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": "apps/v1", "resources": [resource("deployments", "Deployment"),
                resource("statefulsets", "StatefulSet"), resource("daemonsets", "DaemonSet")]}),
        "/apis/batch/v1" => json!({"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": "batch/v1", "resources": [resource("cronjobs", "CronJob")]}),
        "/apis/argoproj.io/v1alpha1" => json!({"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": "argoproj.io/v1alpha1", "resources": [resource("rollouts", "Rollout")]}),
        "/api" => json!({"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": []}),
        "/apis" => json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []}),
        "/version" => json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0",
            "gitCommit": "", "gitTreeState": "", "buildDate": "", "goVersion": "",
            "compiler": "", "platform": ""}),
        _ => json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "v1",
            "resources": [resource("configmaps", "ConfigMap"), resource("secrets", "Secret")]}),
    }
}

/// Status, content type and body of answer `v` to a request of `class` for `path`.
fn render(v: V, class: Class, path: &str, certs: &CertStates) -> (u16, &'static str, String) {
    const JSON: &str = "application/json";
    let valid = || valid_object(class, path, certs);
    match v {
        V::NotJson => (
            200,
            "text/plain",
            format!("not JSON: {CANARY} {}", b64(CANARY)),
        ),
        V::TruncatedJson => (
            200,
            JSON,
            format!(
                r#"{{"kind":"Secret","apiVersion":"v1","data":{{"k":"{}"#,
                b64(CANARY)
            ),
        ),
        V::JsonString => (200, JSON, Value::from(CANARY).to_string()),
        V::Status(code) => (code, JSON, status(code).to_string()),
        V::PlainText500 => (500, "text/plain", format!("internal error: {CANARY}\n")),
        V::Html500 => (
            500,
            "text/html",
            format!(
                "<html><body><h1>{CANARY}</h1><p>{}</p></body></html>",
                b64(CANARY)
            ),
        ),
        V::Redirect => (302, JSON, secret("moved", APP_NS).to_string()),
        V::TlsKeyCanary => (200, JSON, certs_secret(&certs.tls_key_canary).to_string()),
        V::CaKeyCanary => (200, JSON, certs_secret(&certs.ca_key_canary).to_string()),
        V::BadGroupVersion => (
            200,
            JSON,
            json!({"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": format!("{CANARY}/v1/{CANARY_WORD}"),
                "resources": [{"name": "deployments", "singularName": "", "namespaced": true,
                    "kind": "Deployment", "verbs": ["get"]}]})
            .to_string(),
        ),
        V::ResourcesString => (
            200,
            JSON,
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "apps/v1",
                "resources": CANARY})
            .to_string(),
        ),
        V::Valid => match class.shape() {
            Shape::Object => (200, JSON, valid().to_string()),
            Shape::List => (200, JSON, list_of(path, vec![valid()]).to_string()),
            Shape::Discovery => (200, JSON, discovery(path).to_string()),
            Shape::Watch => (
                200,
                JSON,
                // Then a 410, so that the watcher lists again.
                event_line("ADDED", &valid())
                    + &event_line(
                        "BOOKMARK",
                        &json!({"kind": "Secret", "apiVersion": "v1",
                        "metadata": {"resourceVersion": "8"}}),
                    )
                    + &event_line("ERROR", &status(410)),
            ),
        },
        V::ItemsString => (
            200,
            JSON,
            json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "9"},
                "items": CANARY})
            .to_string(),
        ),
        V::MalformedLine => (
            200,
            JSON,
            event_line("ADDED", &valid())
                + &format!("not JSON: {CANARY}\n")
                + &event_line("ADDED", &valid()),
        ),
        V::ErrorEvent => (
            200,
            JSON,
            event_line("ERROR", &status(500)) + &event_line("ADDED", &valid()),
        ),
        V::ErrorEvent410 => (
            200,
            JSON,
            event_line("ADDED", &valid()) + &event_line("ERROR", &status(410)),
        ),
        V::UnknownEventType => (200, JSON, event_line(CANARY, &valid())),
        V::RawStatusLine => (200, JSON, format!("{}\n", status(500))),
        V::TruncatedLine => (
            200,
            JSON,
            event_line("ADDED", &valid())
                + &format!(
                    r#"{{"type":"ADDED","object":{{"kind":"Secret","data":{{"k":"{}"#,
                    b64(CANARY)
                ),
        ),
        object => {
            let bad = bad_object(object, path);
            match class.shape() {
                Shape::List => (200, JSON, list_of(path, vec![valid(), bad]).to_string()),
                Shape::Watch => (
                    200,
                    JSON,
                    event_line("ADDED", &valid())
                        + &event_line("MODIFIED", &bad)
                        + &event_line("ADDED", &valid()),
                ),
                _ => (200, JSON, bad.to_string()),
            }
        }
    }
}

async fn answer(State(hostile): State<Arc<Hostile>>, request: Request) -> Response {
    let method = request.method().as_str().to_owned();
    let path = request.uri().path().to_owned();
    let query = request.uri().query().unwrap_or("").to_owned();
    let watch = query
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1" || p.starts_with("sendInitialEvents=true"));
    let class = Class::of(&method, &path, watch);
    let v = {
        let mut served = hostile.served.lock().unwrap();
        served.requests += 1;
        let n = {
            let next = served.next.entry(class).or_default();
            *next += 1;
            *next - 1
        };
        let webhook_configuration = matches!(
            class,
            Class::WebhookConfiguration | Class::WebhookConfigurationWrite
        );
        // Every other answer is a valid one, so that the client gets on to its next request.
        let v = if webhook_configuration && served.let_certs_through > 0 {
            served.let_certs_through -= 1;
            V::Valid
        } else if n % 2 == 1 {
            V::Valid
        } else {
            let all = variants(class);
            all[(n / 2) % all.len()]
        };
        if matches!(v, V::TlsKeyCanary | V::CaKeyCanary) {
            // The read of the webhook configuration and its patch come next.
            served.let_certs_through = 2;
        }
        served.served.entry(class).or_default().insert(v);
        v
    };
    let (code, content_type, body) = render(v, class, &path, &hostile.certs);
    Response::builder()
        .status(code)
        .header("content-type", content_type)
        .header("x-canary", CANARY)
        .header("warning", format!("299 - \"{CANARY}\""))
        .header("location", format!("http://127.0.0.1:1/{CANARY}"))
        .body(Body::from(body))
        .unwrap()
}

/// Starts the hostile server; returns its URL.
async fn start_hostile(hostile: Arc<Hostile>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().fallback(answer).with_state(hostile);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

// ---------------------------------------------------------------------------------------------
// Running serve

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn write_kubeconfig(dir: &Path, server: &str) -> PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: hostile\n  cluster:\n    server: {server}\n\
             contexts:\n- name: hostile\n  context:\n    cluster: hostile\n    user: nobody\n    namespace: {INSTALL_NS}\n\
             current-context: hostile\nusers:\n- name: nobody\n  user: {{}}\n"
        ),
    )
    .unwrap();
    path
}

struct Serve {
    child: Child,
    log: PathBuf,
    webhook: u16,
    started: Instant,
}

impl Serve {
    /// `confighash serve` against the kubeconfig in `dir`, at trace level, output to a file.
    fn start(dir: &Path, n: usize, args: &[String]) -> Serve {
        let log = dir.join(format!("serve-{n}.log"));
        let out = File::create(&log).unwrap();
        let err = out.try_clone().unwrap();
        let webhook = free_port();
        let mut command = Command::new(env!("CARGO_BIN_EXE_confighash"));
        command
            .arg("serve")
            .args(["--log-level", "trace", "--log-format", "text"])
            .args(["--leader-elect", "false"])
            .arg("--listen")
            .arg(format!("127.0.0.1:{webhook}"))
            .arg("--admin-listen")
            .arg(format!("127.0.0.1:{}", free_port()))
            .args(args)
            .env("KUBECONFIG", dir.join("kubeconfig"))
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err));
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy().into_owned();
            if name.starts_with("CONFIGHASH_")
                || name.starts_with("KUBERNETES_")
                || name == "RUST_LOG"
                || name.to_ascii_lowercase().ends_with("_proxy")
            {
                command.env_remove(&name);
            }
        }
        Serve {
            child: command.spawn().expect("confighash serve starts"),
            log,
            webhook,
            started: Instant::now(),
        }
    }

    fn exited(&mut self) -> bool {
        self.child.try_wait().unwrap().is_some()
    }

    /// SIGTERM, then SIGKILL if it has not stopped within a few seconds.
    async fn stop(mut self) -> PathBuf {
        if !self.exited() {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(25);
            while !self.exited() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if !self.exited() {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
        self.log
    }
}

/// A review of a Deployment in [`APP_NS`] that references `n` ConfigMaps and `n` Secrets.
fn review(uid: usize, n: usize) -> Vec<u8> {
    let names = |prefix: &str| {
        (0..n)
            .map(|i| format!("{prefix}-{i}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let object = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": APP_NS,
            "annotations": {"confighash.dev/extra-configmaps": names("cm"),
                "confighash.dev/extra-secrets": names("s")}},
        "spec": {"selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "example/web:1",
                    "env": [{"name": "P", "valueFrom": {"secretKeyRef": {"name": "db", "key": "k"}}}]}]}}}
    });
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": format!("uid-{uid}"),
            "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
            "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
            "name": "web", "namespace": APP_NS, "operation": "CREATE",
            "userInfo": {"username": "someone"}, "object": object, "oldObject": null,
            "dryRun": false}})
    .to_string()
    .into_bytes()
}

/// Reads every log, checks it holds none of the planted values, and returns it.
fn check_logs(logs: &[PathBuf]) -> String {
    let mut all = String::new();
    for log in logs {
        all += &String::from_utf8_lossy(&std::fs::read(log).unwrap());
    }
    let needles = needles();
    let mut leaks = Vec::new();
    for line in all.lines() {
        if let Some(needle) = needles.iter().find(|n| line.contains(n.as_str())) {
            leaks.push(format!("[{needle}] {line}"));
        }
    }
    assert!(
        leaks.is_empty(),
        "{} log lines hold a planted value, for example:\n{}",
        leaks.len(),
        leaks
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    all
}

/// The output is what a trace-level run looks like: kube's and confighash's lines, including
/// the layer's.
fn assert_non_trivial(all: &str, targets: &[&str]) {
    assert!(
        all.lines().count() > 200,
        "only {} lines",
        all.lines().count()
    );
    for target in targets {
        assert!(
            all.lines().any(|l| l.contains(target)),
            "no line from {target} in the output"
        );
    }
    assert!(all.contains("TRACE"), "no TRACE line in the output");
}

const DEADLINE: Duration = Duration::from_secs(300);

/// What serve logs when the CA key of the certificate Secret does not parse.
const PLANTED_CA_KEY_PARSED: &str = "holds a CA certificate or key that does not parse";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_byte_reaches_a_log_line_whatever_the_api_server_answers() {
    // ---- Pass 1: --key-file; the watcher and the webhook's lookups. ----
    let hostile = Arc::new(Hostile {
        served: Mutex::new(Served::default()),
        certs: CertStates::new(),
    });
    let server = start_hostile(hostile.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    write_kubeconfig(dir.path(), &server);
    let certs = TestCerts::generate();
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&cert, &certs.cert_pem).unwrap();
    std::fs::write(&key, &certs.key_pem).unwrap();
    let key_file = dir.path().join("checksum.key");
    std::fs::write(&key_file, b"0123456789abcdef0123456789abcdef").unwrap();
    let args: Vec<String> = [
        "--key-file",
        key_file.to_str().unwrap(),
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ]
    .map(str::to_owned)
    .to_vec();
    let mut serves: Vec<Serve> = (0..4).map(|n| Serve::start(dir.path(), n, &args)).collect();
    let https = HttpsClient::new(&certs.ca_pem);
    let wanted = [
        Class::LookupConfigMap,
        Class::LookupSecret,
        Class::ListConfigMaps,
        Class::ListSecrets,
        Class::WatchConfigMaps,
        Class::WatchSecrets,
    ];
    let started = Instant::now();
    let mut uid = 0;
    let mut answered = 0;
    while !hostile.missing(&wanted).is_empty() {
        assert!(
            started.elapsed() < DEADLINE,
            "not every variant was served in time: missing {:?}; {}",
            hostile.missing(&wanted),
            hostile.summary()
        );
        for s in &mut serves {
            assert!(!s.exited(), "serve exited early; see {}", s.log.display());
        }
        let lookups = [Class::LookupConfigMap, Class::LookupSecret];
        if hostile.missing(&lookups).is_empty() && answered > 0 {
            // Only the watcher's requests are still wanted: they come at its own pace.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        for s in &serves {
            uid += 1;
            let url = format!("https://127.0.0.1:{}/mutate", s.webhook);
            if let Ok(reply) = https.post(&url, review(uid, 12)).await {
                assert_eq!(
                    reply.status,
                    200,
                    "{}",
                    String::from_utf8_lossy(&reply.body)
                );
                answered += 1;
            }
        }
    }
    assert!(answered > 0, "the webhook answered no review");
    eprintln!(
        "pass 1 after {:?}: {}",
        started.elapsed(),
        hostile.summary()
    );
    let mut logs = Vec::new();
    for s in serves {
        logs.push(s.stop().await);
    }
    let all = check_logs(&logs);
    assert_non_trivial(
        &all,
        &[
            "kube_client",
            "kube_runtime::watcher",
            "confighash_watcher",
            "confighash_webhook::admission",
            "confighash_cluster::client",
        ],
    );

    // ---- Pass 2: --key-secret and --self-signed-certs: the key and certificate Secrets. ----
    let wanted = [Class::KeySecret, Class::CertsSecret];
    let started = Instant::now();
    let mut running: Vec<Serve> = Vec::new();
    let mut logs = Vec::new();
    let mut n = 100;
    // Whether a run got as far as parsing the planted CA key, and the planted serving key.
    let (mut planted_ca_key_parsed, mut planted_tls_key_parsed) = (false, false);
    while !hostile.missing(&wanted).is_empty() || !planted_ca_key_parsed || !planted_tls_key_parsed
    {
        assert!(
            started.elapsed() < DEADLINE,
            "not every variant was served and used in time: missing {:?}; CA key parsed: \
             {planted_ca_key_parsed}, serving key parsed: {planted_tls_key_parsed}; {}",
            hostile.missing(&wanted),
            hostile.summary()
        );
        // Runs end by themselves (a refused key or certificate) or after a while.
        let mut still = Vec::new();
        for mut s in running.drain(..) {
            if s.exited() || s.started.elapsed() > Duration::from_secs(10) {
                let log = s.stop().await;
                let text = String::from_utf8_lossy(&std::fs::read(&log).unwrap()).into_owned();
                planted_ca_key_parsed |= text.contains(PLANTED_CA_KEY_PARSED);
                planted_tls_key_parsed |= text
                    .lines()
                    .any(|l| l.contains("serve failed") && l.contains("tls.key"));
                logs.push(log);
            } else {
                still.push(s);
            }
        }
        running = still;
        while running.len() < 3 {
            n += 1;
            let tls = dir.path().join(format!("self-signed-{n}"));
            let args: Vec<String> = vec![
                "--key-secret".into(),
                "confighash-key".into(),
                "--self-signed-certs".into(),
                "--tls-cert".into(),
                tls.join("tls.crt").to_string_lossy().into_owned(),
                "--tls-key".into(),
                tls.join("tls.key").to_string_lossy().into_owned(),
            ];
            running.push(Serve::start(dir.path(), n, &args));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "pass 2 after {:?}, {} runs: {}",
        started.elapsed(),
        n - 100,
        hostile.summary()
    );
    for s in running {
        logs.push(s.stop().await);
    }
    let all = check_logs(&logs);
    assert_non_trivial(
        &all,
        &[
            "kube_client",
            "confighash::certs::key",
            "confighash_cluster::client",
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// A conforming API server

/// Everything serve asks a conforming API server (the in-memory stand-in) passes the layer as
/// kube expects: objects, lists, watches, Statuses of deletes, 404/409 errors, discovery and
/// Events, with no answer withheld.
#[tokio::test]
async fn a_conforming_api_servers_answers_pass_the_layer() {
    use futures::{StreamExt, TryStreamExt};
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
    use kube::Api;
    use kube::api::{
        ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
    };
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    use kube::runtime::{WatchStreamExt, watcher};

    #[derive(Clone)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let logs = Arc::new(Mutex::new(Vec::new()));
    let sink = Sink(logs.clone());
    let _guard = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(move || sink.clone())
            .finish(),
    );

    let server = confighash_testkit::apiserver::ApiServer::start().await;
    let admin = server.client();
    let post = PostParams::default();
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": APP_NS}})).unwrap();
    Api::<Namespace>::all(admin.clone())
        .create(&post, &ns)
        .await
        .unwrap();
    let mut config = server.config();
    config.default_namespace = APP_NS.into();
    let client = confighash::cluster::client::build(config, confighash::app::READS).unwrap();

    // Secrets: create, get, create again (409), replace, list, delete, absent.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), APP_NS);
    let secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": "db"}, "data": {"k": b64(CANARY)}}))
            .unwrap();
    secrets.create(&post, &secret).await.unwrap();
    let err = secrets.create(&post, &secret).await.unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists"),
        "{err:?}"
    );
    let read = secrets.get("db").await.unwrap();
    assert_eq!(read.data.as_ref().unwrap()["k"].0, CANARY.as_bytes());
    secrets.replace("db", &post, &read).await.unwrap();
    assert_eq!(
        secrets
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    secrets
        .delete("db", &DeleteParams::default())
        .await
        .unwrap();
    assert!(secrets.get_opt("db").await.unwrap().is_none());

    // A ConfigMap seen through kube-runtime's watcher: list, then watch.
    let maps: Api<ConfigMap> = Api::all(client.clone());
    let mut events = std::pin::pin!(watcher(maps, watcher::Config::default()).applied_objects());
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "cfg"}, "data": {"k": CANARY}}))
            .unwrap();
    Api::<ConfigMap>::namespaced(admin.clone(), APP_NS)
        .create(&post, &cm)
        .await
        .unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(10), events.try_next())
        .await
        .expect("the watcher delivers the ConfigMap")
        .unwrap()
        .unwrap();
    assert_eq!(seen.metadata.name.as_deref(), Some("cfg"));

    // A Lease, a webhook configuration, a workload patch, discovery and an Event.
    let leases: Api<Lease> = Api::namespaced(client.clone(), APP_NS);
    let lease: Lease =
        serde_json::from_value(json!({"metadata": {"name": "l"}, "spec": {}})).unwrap();
    let lease = leases.create(&post, &lease).await.unwrap();
    leases.replace("l", &post, &lease).await.unwrap();
    let mwc: MutatingWebhookConfiguration =
        serde_json::from_value(json!({"metadata": {"name": "confighash"}, "webhooks": []}))
            .unwrap();
    Api::<MutatingWebhookConfiguration>::all(admin.clone())
        .create(&post, &mwc)
        .await
        .unwrap();
    let mwcs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    mwcs.get("confighash").await.unwrap();
    mwcs.patch(
        "confighash",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
    )
    .await
    .unwrap();
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "example/web:1"}]}}}}))
    .unwrap();
    let deployment = Api::<Deployment>::namespaced(admin.clone(), APP_NS)
        .create(&post, &deployment)
        .await
        .unwrap();
    let (resource, _) = kube::discovery::oneshot::pinned_kind(
        &client,
        &kube::api::GroupVersionKind::gvk("apps", "v1", "Deployment"),
    )
    .await
    .unwrap();
    let workloads: Api<DynamicObject> = Api::namespaced_with(client.clone(), APP_NS, &resource);
    let patch = json!({"spec": {"template": {"metadata": {"annotations": {"a": "b"}}}}});
    workloads
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let mut listed = std::pin::pin!(
        watcher(
            Api::<DynamicObject>::all_with(client.clone(), &ApiResource::erase::<Deployment>(&())),
            watcher::Config::default()
        )
        .applied_objects()
    );
    let seen = tokio::time::timeout(Duration::from_secs(10), listed.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(seen.metadata.name.as_deref(), Some("web"));
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "confighash".into(),
            instance: None,
        },
    );
    recorder
        .publish(
            &Event {
                type_: EventType::Normal,
                reason: "ConfigChanged".into(),
                note: Some("n".into()),
                action: "Restamp".into(),
                secondary: None,
            },
            &kube::Resource::object_ref(&deployment, &()),
        )
        .await
        .unwrap();

    drop(_guard);
    let logs = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    let withheld: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("confighash_cluster::client"))
        .collect();
    assert!(withheld.is_empty(), "answers were withheld:\n{withheld:#?}");
    assert!(
        logs.contains("confighash_cluster::client"),
        "the layer saw the 404 and 409 answers"
    );
}

//! The attack run: what a client that reaches the webhook port can make `confighash serve` do to
//! the API server and to its own memory, measured from outside the process (issue 12, findings 2
//! and 3: lookup amplification and lookup memory).
//!
//! - The in-memory API server of `crates/testkit/src/apiserver` runs in this process (no admission chain), with
//!   deploy/'s RBAC enforced on confighash's ServiceAccount token. Namespace `shop` (opted in)
//!   holds 3 ConfigMaps and 2 Secrets; namespace `confighash` is serve's own. The stand-in records
//!   every request it serves (`ApiServer::requests`); GETs of ConfigMaps and of Secrets are counted
//!   from that record.
//! - The **release** binary `confighash serve` runs as a child process, one fresh process per
//!   scenario (so its VmHWM is that scenario's peak): `KUBECONFIG` points it at the stand-in with
//!   the ServiceAccount's token, `--key-file`, `--leader-elect false`, a serving pair issued by a
//!   test CA, `--listen` and `--admin-listen` on free loopback ports; no other flag unless
//!   `CONFIGHASH_ATTACK_SERVE_ARGS` adds some. Before the first scenario the binary is built as the
//!   Dockerfile builds it, `cargo build --release --locked --bin confighash`, in its own target
//!   directory `target/attack-run` (sharing target/release with `cargo bench` would rebuild ring,
//!   rustls and kube in both on every run); `CONFIGHASH_ATTACK_BINARY` names a binary to use
//!   instead. The bench waits for `/readyz` and for the watcher's initial sync.
//! - **Attack**: N forged AdmissionReviews at once, each a CREATE of a Deployment in `shop` whose
//!   `confighash.dev/extra-configmaps` annotation names R distinct ConfigMaps: the namespace's 3
//!   plus R - 3 names that exist nowhere and that no other review names (so no two reviews could
//!   share a read). R = 10,000 makes a 90 KB review. Each review goes over its own HTTPS
//!   connection (HTTP/1.1), opened before the attack; all N are sent when a barrier opens.
//! - **Normal reviews**: a CREATE of a Deployment with 2 references (both Secrets, so their GETs
//!   are told apart from the attack's ConfigMap GETs), sent every `CONFIGHASH_ATTACK_PROBE_MS`
//!   (50) ms on a schedule (never waiting for earlier replies) over two kept-alive HTTP/2
//!   connections, as kube-apiserver's webhook client: first for 2 s before the attack (the
//!   baseline of the same scenario), then for as long as an attack review is unanswered.
//!
//! Reported per scenario: ConfigMap GETs the stand-in served while the attack was in flight, per
//! second and per review; what the attack reviews were answered (stamp, marker, status); their
//! latency p50 and max; the normal reviews' latency p50/p99/max before and during the attack and
//! how many were stamped; serve's VmRSS (idle, the peak of samples every 10 ms, VmHWM at the end,
//! 1 s after), its CPU time and open files; the machine's load average and how busy all cores
//! were. Everything shares a 2-core machine with other work: the stand-in and the clients run in
//! this process beside serve, so compare figures within one run.
//!
//! Environment: `CONFIGHASH_ATTACK_N` (comma-separated, default `10,100,200`),
//! `CONFIGHASH_ATTACK_R` (default `10000,256`), `CONFIGHASH_ATTACK_SERVE_ARGS` (extra serve
//! arguments, split on whitespace), `CONFIGHASH_ATTACK_BINARY` (use this binary, no build),
//! `CONFIGHASH_ATTACK_PROBE_MS` (50), `CONFIGHASH_BENCH_QUICK=1` or `-- --quick` (N = 10,
//! R = 10000 and 256, 1 s baseline), `CONFIGHASH_ATTACK_ORDER=descending` (the names that exist
//! nowhere in descending order, so that each sorts before every name seen so far).
//!
//! **Zero-window attack** (after the others; `CONFIGHASH_ATTACK_ZERO_WINDOW` connections, 970 by
//! default, 100 quick, 0 for none; `CONFIGHASH_ATTACK_ONLY=zero-window` runs it alone): HTTP/2
//! connections that set `SETTINGS_INITIAL_WINDOW_SIZE` to 0, each sending 100 small reviews whose
//! answers can then never be sent, while normal reviews go on over a connection of their own.
//! Reported: serve's peak VmRSS, when the connections were closed, the normal reviews' answers
//! and latency, and `confighash_webhook_unsent_answers_closed_total`.
//!
//! **Big-Secret attack** (after the first two; `CONFIGHASH_ATTACK_BIG_N`, default `16,32`, quick
//! `16`, `0` for none; `CONFIGHASH_ATTACK_ONLY=big-secrets` runs it alone): namespace `shop`
//! gains 256 Secrets of 1 MiB (`big-000`...), and N forged reviews at once each name all 256
//! through `confighash.dev/extra-secrets` (about 4 KB each), while normal reviews go on. Run twice
//! side by side: serve's default `--max-reference-bytes` (16Mi) and `--max-reference-bytes=4Gi`
//! (no limit in practice). Reported: the attack's Secret GETs (all Secret GETs less the normal
//! reviews' two each) and the bytes the API server sent for them, the attack's answers, the
//! normal reviews' latency before and during, and serve's peak VmRSS.
//!
//! `--list` prints nothing and exits. Without `--bench` (as `cargo test --benches` runs it) the
//! binary only checks its own setup (the stand-in, the reviews, the token's RBAC, the GET count)
//! in about a second, and starts no serve process.

use confighash_testkit::bench::mode;
use confighash_testkit::bench::serve;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use base64::Engine;
use confighash::core::names::{CHECKSUM_ANNOTATION, ENABLED_LABEL, UNSTAMPED_ANNOTATION};
use confighash::core::names::{EXTRA_CONFIGMAPS_ANNOTATION, EXTRA_SECRETS_ANNOTATION};
use confighash_testkit::apiserver::{ApiServer, HttpsClient, TestCa};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::Api;
use kube::api::PostParams;
use mode::Mode;
use rustls_pki_types::ServerName;
use serde_json::{Value, json};
use serve::{
    Files, SERVER_NAME, Serve, load_average, machine_cpu, open_files_limit, process_cpu, status_kib,
};

/// The namespace of every review, opted in.
const NAMESPACE: &str = "shop";
/// serve's own namespace (the kubeconfig context's), as in deploy/.
const OWN_NAMESPACE: &str = "confighash";
const TOKEN: &str = "confighash-attack-token";
/// The ConfigMaps of `shop`; every attack review names them first.
const CONFIG_MAPS: [&str; 3] = ["app-config", "feature-flags", "nginx-conf"];
/// The Secrets of `shop`; the normal review references both.
const SECRETS: [&str; 2] = ["api-keys", "db-credentials"];
/// 32 bytes of HMAC key.
const KEY: &[u8] = b"attack-run-key-0123456789abcdef!";
/// Each attack review is answered or given up on within this.
const ATTACK_TIMEOUT: Duration = Duration::from_secs(60);
/// RSS sampling interval.
const SAMPLE_EVERY: Duration = Duration::from_millis(10);
/// The targets of issue 12 once fixed: serve's RSS and a normal review's latency under attack.
const TARGET_RSS_KIB: u64 = 128 * 1024;
const TARGET_NORMAL: Duration = Duration::from_millis(100);

// ---------------------------------------------------------------------------------------------
// Options

#[derive(Debug, Clone)]
struct Options {
    quick: bool,
    ns: Vec<usize>,
    rs: Vec<usize>,
    serve_args: Vec<String>,
    binary: Option<PathBuf>,
    probe_every: Duration,
    baseline: Duration,
    /// Connections of the zero-window attack (0: none).
    zero_window: usize,
    /// Reviews at once of the big-Secret attack (empty: none).
    big_ns: Vec<usize>,
}

fn env_list(name: &str, default: &[usize]) -> Vec<usize> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .split(',')
            .map(|s| match s.trim().replace('_', "").parse::<usize>() {
                Ok(n) if n > 0 => n,
                _ => {
                    eprintln!("{name}={v:?}: need positive integers separated by commas");
                    std::process::exit(2);
                }
            })
            .collect(),
        _ => default.to_vec(),
    }
}

impl Options {
    fn from_env_and_args() -> Self {
        let quick = std::env::args().any(|a| a == "--quick")
            || std::env::var("CONFIGHASH_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        let ns = env_list(
            "CONFIGHASH_ATTACK_N",
            if quick { &[10] } else { &[10, 100, 200] },
        );
        let rs = env_list("CONFIGHASH_ATTACK_R", &[10_000, 256]);
        if ns.iter().any(|&n| n > 999) || rs.iter().any(|&r| r < CONFIG_MAPS.len()) {
            eprintln!(
                "CONFIGHASH_ATTACK_N must be at most 999, CONFIGHASH_ATTACK_R at least {}",
                CONFIG_MAPS.len()
            );
            std::process::exit(2);
        }
        let probe_ms = env_list("CONFIGHASH_ATTACK_PROBE_MS", &[50])[0];
        Options {
            quick,
            ns,
            rs,
            serve_args: std::env::var("CONFIGHASH_ATTACK_SERVE_ARGS")
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_owned)
                .collect(),
            binary: std::env::var_os("CONFIGHASH_ATTACK_BINARY")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            probe_every: Duration::from_millis(probe_ms as u64),
            baseline: Duration::from_secs(if quick { 1 } else { 2 }),
            big_ns: match std::env::var("CONFIGHASH_ATTACK_BIG_N") {
                Ok(v) if v.trim() == "0" => Vec::new(),
                _ => env_list(
                    "CONFIGHASH_ATTACK_BIG_N",
                    if quick { &[16] } else { &[16, 32] },
                ),
            },
            zero_window: match std::env::var("CONFIGHASH_ATTACK_ZERO_WINDOW") {
                Ok(v) if v.trim() == "0" => 0,
                _ => env_list(
                    "CONFIGHASH_ATTACK_ZERO_WINDOW",
                    &[if quick { 100 } else { 970 }],
                )[0],
            },
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Reviews

/// An AdmissionReview of a CREATE of `object` in `shop`.
fn review(uid: &str, object: &Value) -> Vec<u8> {
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
            "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
            "requestKind": {"group": "apps", "version": "v1", "kind": "Deployment"},
            "requestResource": {"group": "apps", "version": "v1", "resource": "deployments"},
            "name": object["metadata"]["name"],
            "namespace": NAMESPACE,
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:argocd:argocd-application-controller",
                "groups": ["system:serviceaccounts", "system:authenticated"]
            },
            "object": object,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    });
    serde_json::to_vec(&review).expect("JSON")
}

fn deployment(name: &str, annotations: Value, container: Value) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"app": name, ENABLED_LABEL: "true"},
            "annotations": annotations
        },
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [container]}
            }
        }
    })
}

/// The names attack review `k` gives: the namespace's ConfigMaps, then `r - 3` names of its own
/// (`c` + 3 digits of `k` + at least 4 of the index: 8 characters below 10,000).
fn attack_names(k: usize, r: usize) -> String {
    let mut names: Vec<String> = CONFIG_MAPS.iter().map(|s| (*s).to_owned()).collect();
    let absent = (0..r - CONFIG_MAPS.len()).map(|i| format!("c{k:03}{i:04}"));
    if std::env::var("CONFIGHASH_ATTACK_ORDER").is_ok_and(|o| o == "descending") {
        names.extend(absent.rev());
    } else {
        names.extend(absent);
    }
    names.join(",")
}

/// Attack review `k` naming `r` ConfigMaps: the object, and the review's body.
fn attack_review(k: usize, r: usize) -> (Value, Vec<u8>) {
    let object = deployment(
        &format!("attack-{k:03}"),
        json!({ EXTRA_CONFIGMAPS_ANNOTATION: attack_names(k, r) }),
        json!({"name": "app", "image": "nginx:1.27"}),
    );
    let body = review(&format!("a77ac000-0000-4000-8000-{k:012x}"), &object);
    (object, body)
}

/// Secrets of the big-Secret attack, and the bytes of each one's value.
const BIG_SECRETS: usize = 256;
const BIG_SECRET_BYTES: usize = 1 << 20;

fn big_secret_name(i: usize) -> String {
    format!("big-{i:03}")
}

/// Big-Secret attack review `k`: a Deployment naming every big Secret.
fn big_review(k: usize) -> (Value, Vec<u8>) {
    let names: Vec<String> = (0..BIG_SECRETS).map(big_secret_name).collect();
    let object = deployment(
        &format!("big-{k:03}"),
        json!({ EXTRA_SECRETS_ANNOTATION: names.join(",") }),
        json!({"name": "app", "image": "nginx:1.27"}),
    );
    let body = review(&format!("b16ac000-0000-4000-8000-{k:012x}"), &object);
    (object, body)
}

/// A normal Deployment: 2 references, both Secrets.
fn normal_object() -> Value {
    deployment(
        "storefront",
        json!({}),
        json!({
            "name": "app",
            "image": "nginx:1.27",
            "env": [{"name": "DB_PASSWORD",
                     "valueFrom": {"secretKeyRef": {"name": SECRETS[1], "key": "password"}}}],
            "envFrom": [{"secretRef": {"name": SECRETS[0]}}]
        }),
    )
}

/// What an answer did to the submitted object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Answer {
    /// A stamp on the pod template.
    Stamped,
    /// The `confighash.dev/unstamped` marker with this value, no stamp.
    Marker(String),
    /// Allowed, no change.
    Unchanged,
    /// Anything else: a status other than 200, a malformed answer, no answer.
    Failed(String),
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answer::Stamped => write!(f, "stamped"),
            Answer::Marker(m) => write!(f, "marker {m}"),
            Answer::Unchanged => write!(f, "unchanged"),
            Answer::Failed(why) => write!(f, "{why}"),
        }
    }
}

fn answer_of(object: &Value, status: u16, body: &[u8]) -> Answer {
    if status != 200 {
        let text = String::from_utf8_lossy(body);
        let first = text.lines().next().unwrap_or("").chars().take(40);
        return Answer::Failed(format!("HTTP {status} {}", first.collect::<String>()));
    }
    let Ok(review) = serde_json::from_slice::<Value>(body) else {
        return Answer::Failed("not JSON".to_owned());
    };
    if review["response"]["allowed"] != true {
        return Answer::Failed("not allowed".to_owned());
    }
    let Some(patch) = review["response"]["patch"].as_str() else {
        return Answer::Unchanged;
    };
    let patched = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<json_patch::Patch>(&bytes).ok())
        .and_then(|ops| {
            let mut result = object.clone();
            json_patch::patch(&mut result, &ops).ok().map(|()| result)
        });
    let Some(result) = patched else {
        return Answer::Failed("a patch that does not apply".to_owned());
    };
    let stamp = result
        .pointer("/spec/template/metadata/annotations")
        .and_then(|a| a.get(CHECKSUM_ANNOTATION));
    let marker = result
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(UNSTAMPED_ANNOTATION))
        .and_then(Value::as_str);
    match (stamp, marker) {
        (Some(_), None) => Answer::Stamped,
        (None, Some(m)) => Answer::Marker(m.to_owned()),
        (None, None) => Answer::Unchanged,
        (Some(_), Some(m)) => Answer::Failed(format!("stamp and marker {m}")),
    }
}

/// "3 stamped, 7 marker lookup-failed".
fn summarize(answers: &[Answer]) -> String {
    let mut counts: BTreeMap<&Answer, usize> = BTreeMap::new();
    for a in answers {
        *counts.entry(a).or_default() += 1;
    }
    counts
        .iter()
        .map(|(a, n)| format!("{n} {a}"))
        .collect::<Vec<_>>()
        .join(", ")
}

// ---------------------------------------------------------------------------------------------
// The stand-in

struct Standin {
    api: ApiServer,
}

impl Standin {
    async fn start() -> Self {
        let api = ApiServer::start().await;
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
            TOKEN,
            confighash_testkit::apiserver::user::UserInfo::service_account(
                OWN_NAMESPACE,
                "confighash",
            ),
        );
        let admin = api.client();
        let namespaces: Api<Namespace> = Api::all(admin.clone());
        for (name, opted_in) in [(OWN_NAMESPACE, false), (NAMESPACE, true)] {
            let labels = if opted_in {
                json!({ ENABLED_LABEL: "true" })
            } else {
                json!({})
            };
            let ns: Namespace =
                serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))
                    .expect("a Namespace");
            namespaces
                .create(&PostParams::default(), &ns)
                .await
                .expect("create a namespace");
        }
        let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), NAMESPACE);
        for (i, name) in CONFIG_MAPS.iter().enumerate() {
            // 1 KiB, 4 KiB and 16 KiB of data.
            let value = "x".repeat(1024 << (2 * i));
            let cm: ConfigMap = serde_json::from_value(json!({
                "metadata": {"name": name},
                "data": {"config.yaml": value, "LOG_LEVEL": "info"}
            }))
            .expect("a ConfigMap");
            config_maps
                .create(&PostParams::default(), &cm)
                .await
                .expect("create a ConfigMap");
        }
        let secrets: Api<Secret> = Api::namespaced(admin, NAMESPACE);
        for name in SECRETS {
            let secret: Secret = serde_json::from_value(json!({
                "metadata": {"name": name},
                "stringData": {"password": "hunter2", "token": "t0k3n"}
            }))
            .expect("a Secret");
            secrets
                .create(&PostParams::default(), &secret)
                .await
                .expect("create a Secret");
        }
        Standin { api }
    }

    /// Adds the big-Secret attack's [`BIG_SECRETS`] Secrets of [`BIG_SECRET_BYTES`] to `shop`.
    async fn add_big_secrets(&self) {
        let secrets: Api<Secret> = Api::namespaced(self.api.client(), NAMESPACE);
        let value = base64::engine::general_purpose::STANDARD.encode(vec![b'x'; BIG_SECRET_BYTES]);
        for i in 0..BIG_SECRETS {
            let secret: Secret = serde_json::from_value(json!({
                "metadata": {"name": big_secret_name(i)},
                "data": {"blob": value}
            }))
            .expect("a Secret");
            secrets
                .create(&PostParams::default(), &secret)
                .await
                .expect("create a big Secret");
        }
    }

    /// GETs of ConfigMaps and of Secrets served so far.
    fn gets(&self) -> (usize, usize) {
        let requests = self.api.requests();
        let count = |plural: &str| {
            requests
                .iter()
                .filter(|(verb, resource)| verb == "get" && resource == plural)
                .count()
        };
        (count("configmaps"), count("secrets"))
    }

    /// A kubeconfig for confighash's ServiceAccount, in its own namespace.
    fn kubeconfig(&self) -> String {
        serve::kubeconfig(&self.api.url(), TOKEN, OWN_NAMESPACE)
    }
}

// ---------------------------------------------------------------------------------------------
// The serve process: `serve::Serve`, `serve::Files` and `serve::release_binary` (crates/testkit/src/bench/serve.rs)

/// Samples VmRSS every 10 ms (and open files every 100 ms) until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(u64, Duration, usize, usize)>,
}

impl Sampler {
    fn start(pid: u32, from: Instant) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let (mut peak, mut at, mut fds, mut samples) = (0u64, Duration::ZERO, 0usize, 0);
                while !stop.load(Ordering::Relaxed) {
                    if let Some(rss) = status_kib(pid, "VmRSS:") {
                        if rss > peak {
                            peak = rss;
                            at = from.elapsed();
                        }
                        samples += 1;
                    }
                    if samples % 10 == 1
                        && let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd"))
                    {
                        fds = fds.max(dir.count());
                    }
                    std::thread::sleep(SAMPLE_EVERY);
                }
                (peak, at, fds, samples)
            }
        });
        Sampler { stop, thread }
    }

    /// Peak VmRSS (KiB), when it was seen, peak open files, samples taken.
    fn finish(self) -> (u64, Duration, usize, usize) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the sampler")
    }
}

// ---------------------------------------------------------------------------------------------
// Clients

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// A new HTTPS connection (HTTP/1.1) to the webhook, handshake done.
async fn connect(addr: SocketAddr, tls: Arc<rustls::ClientConfig>) -> Result<Sender, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(ServerName::try_from(SERVER_NAME).expect("a name"), tcp)
        .await
        .map_err(|e| format!("TLS handshake: {e}"))?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP handshake: {e}"))?;
    tokio::spawn(connection);
    Ok(sender)
}

/// Sends one review over `sender`: status and body.
async fn post(sender: &mut Sender, body: Vec<u8>) -> Result<(u16, Vec<u8>), String> {
    let request = hyper::Request::post("/mutate")
        .header("host", SERVER_NAME)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("{e}"))?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes()
        .to_vec();
    Ok((status, body))
}

/// Normal reviews, one every `every` on a schedule, until `stop(i, scheduled time)` says so:
/// latency from the scheduled send to the end of the reply, and the answer.
async fn probe(
    clients: &[HttpsClient],
    url: &str,
    every: Duration,
    stop: impl Fn(usize, Instant) -> bool,
) -> Vec<(Duration, Answer)> {
    let object = Arc::new(normal_object());
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0.. {
        let at = start + every * i as u32;
        tokio::time::sleep_until(at.into()).await;
        if stop(i, at) {
            break;
        }
        let (client, url, object) = (
            clients[i % clients.len()].clone(),
            url.to_owned(),
            object.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let body = review(&format!("0e11a1a1-0000-4000-8000-{i:012x}"), &object);
            let reply = client.post(&url, body).await;
            let latency = at.elapsed();
            let answer = match reply {
                Ok(r) => answer_of(&object, r.status, &r.body),
                Err(e) => Answer::Failed(e),
            };
            (latency, answer)
        }));
    }
    let mut out = Vec::with_capacity(tasks.len());
    for task in tasks {
        out.push(task.await.expect("a probe"));
    }
    out
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

// ---------------------------------------------------------------------------------------------
// A scenario

struct Figures {
    n: usize,
    r: usize,
    body_bytes: usize,
    attack_secs: f64,
    cm_gets: usize,
    cm_gets_after: usize,
    secret_gets: usize,
    attack_latency: Vec<Duration>,
    attack_answers: Vec<Answer>,
    normal_before: Vec<Duration>,
    normal_during: Vec<Duration>,
    normal_answers: Vec<Answer>,
    rss_idle: u64,
    rss_peak: u64,
    rss_peak_at: Duration,
    hwm: u64,
    rss_after: u64,
    samples: usize,
    fds: usize,
    cpu: Duration,
    machine_busy: f64,
    load_before: String,
    load_after: String,
    lookups: BTreeMap<String, u64>,
    log_lines: (usize, usize),
    open_files: String,
}

fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms >= 100.0 {
        thousands(ms.round() as u64)
    } else {
        format!("{ms:.1}")
    }
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Latencies as "p50 / p99 / max (n=...)", in ms.
fn p50_p99_max(sorted: &[Duration]) -> String {
    format!(
        "{} / {} / {} (n={})",
        ms(percentile(sorted, 50.0)),
        ms(percentile(sorted, 99.0)),
        ms(percentile(sorted, 100.0)),
        sorted.len()
    )
}

fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

/// The attack of one scenario: N reviews made by `make`, serve run with `extra` arguments.
struct Attack<'a> {
    n: usize,
    r: usize,
    make: &'a dyn Fn(usize) -> (Value, Vec<u8>),
    extra: Vec<String>,
    tag: String,
}

async fn scenario(
    standin: &Standin,
    binary: &Path,
    files: &Files,
    ca: &TestCa,
    options: &Options,
    attack: Attack<'_>,
) -> Result<Figures, String> {
    let Attack {
        n,
        r,
        make,
        extra,
        tag,
    } = attack;
    let reviews: Vec<(Value, Vec<u8>)> = (0..n).map(make).collect();
    let body_bytes = reviews[0].1.len();
    let mut args = options.serve_args.clone();
    args.extend(extra);
    let serve = Serve::start(binary, files, &args, &tag).await?;
    let open_files = open_files_limit(serve.pid);
    let url = format!("https://127.0.0.1:{}/mutate", serve.webhook.port());

    // Two kept-alive HTTP/2 connections for the normal reviews, warmed up by the baseline.
    let clients = [HttpsClient::new(&ca.pem), HttpsClient::new(&ca.pem)];
    let baseline_until = Instant::now() + options.baseline;
    let before = probe(&clients, &url, options.probe_every, |i, at| {
        i >= 2 && at >= baseline_until
    })
    .await;
    // The first two opened the connections.
    let mut normal_before: Vec<Duration> = before[2.min(before.len())..]
        .iter()
        .map(|(d, _)| *d)
        .collect();
    normal_before.sort_unstable();
    let mut normal_answers: Vec<Answer> = before.iter().map(|(_, a)| a.clone()).collect();
    if let Some(bad) = normal_answers.iter().find(|a| **a != Answer::Stamped) {
        return Err(format!("a normal review before the attack: {bad}"));
    }
    normal_answers.clear();

    tokio::time::sleep(Duration::from_millis(300)).await;
    let rss_idle = status_kib(serve.pid, "VmRSS:").unwrap_or(0);

    // One connection per attack review, all open before the attack.
    let tls = Arc::new(confighash_testkit::apiserver::https::client_config(
        &ca.pem,
        &[b"http/1.1"],
    ));
    let mut senders = Vec::with_capacity(n);
    for _ in 0..n {
        senders.push(connect(serve.webhook, tls.clone()).await?);
    }

    let lookups_before = serve.lookups().await;
    let load_before = load_average();
    let (cm_before, secret_before) = standin.gets();
    let cpu_before = process_cpu(serve.pid);
    let machine_before = machine_cpu();
    // Every attack review waits at the gate on its own connection; all go when it opens.
    let gate = Arc::new(tokio::sync::Barrier::new(n + 1));
    let mut tasks = Vec::with_capacity(n);
    for ((object, body), mut sender) in reviews.into_iter().zip(senders) {
        let gate = gate.clone();
        tasks.push(tokio::spawn(async move {
            gate.wait().await;
            let sent = Instant::now();
            let reply = tokio::time::timeout(ATTACK_TIMEOUT, post(&mut sender, body)).await;
            let done = Instant::now();
            let answer = match reply {
                Ok(Ok((status, body))) => answer_of(&object, status, &body),
                Ok(Err(e)) => Answer::Failed(e),
                Err(_) => Answer::Failed("no answer within 60 s".to_owned()),
            };
            (done - sent, done, answer)
        }));
    }
    let sampler = Sampler::start(serve.pid, Instant::now());
    let in_flight = Arc::new(Mutex::new(n));
    let attack = {
        let in_flight = in_flight.clone();
        async move {
            gate.wait().await;
            let start = Instant::now();
            let mut results = Vec::with_capacity(n);
            for task in tasks {
                results.push(task.await.expect("an attack review"));
                *in_flight.lock().expect("count") -= 1;
            }
            (start, results)
        }
    };
    // Normal reviews for as long as an attack review is unanswered.
    let during = async {
        // Let the gate open first.
        tokio::task::yield_now().await;
        probe(&clients, &url, options.probe_every, |_, _| {
            *in_flight.lock().expect("count") == 0
        })
        .await
    };
    let ((start, results), during) = tokio::join!(attack, during);
    let end = results
        .iter()
        .map(|(_, done, _)| *done)
        .max()
        .unwrap_or(start);
    let (cm_end, secret_end) = standin.gets();
    let cpu = process_cpu(serve.pid).saturating_sub(cpu_before);
    let machine_after = machine_cpu();
    let load_after = load_average();
    let (rss_peak, rss_peak_at, fds, samples) = sampler.finish();
    let hwm = status_kib(serve.pid, "VmHWM:").unwrap_or(0);
    let lookups_after = serve.lookups().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_after = status_kib(serve.pid, "VmRSS:").unwrap_or(0);
    let (cm_later, _) = standin.gets();
    let log_lines = serve.log_counts();
    drop(serve);

    let mut attack_latency: Vec<Duration> = results.iter().map(|(d, _, _)| *d).collect();
    attack_latency.sort_unstable();
    let mut normal_during: Vec<Duration> = during.iter().map(|(d, _)| *d).collect();
    normal_during.sort_unstable();
    normal_answers.extend(during.into_iter().map(|(_, a)| a));
    let lookups = lookups_after
        .iter()
        .map(|(k, v)| (k.clone(), v - lookups_before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect();
    let (busy, total) = (
        machine_after.0.saturating_sub(machine_before.0),
        machine_after.1.saturating_sub(machine_before.1),
    );
    Ok(Figures {
        n,
        r,
        body_bytes,
        attack_secs: end.duration_since(start).as_secs_f64(),
        cm_gets: cm_end - cm_before,
        cm_gets_after: cm_later - cm_end,
        secret_gets: secret_end - secret_before,
        attack_latency,
        attack_answers: results.into_iter().map(|(_, _, a)| a).collect(),
        normal_before,
        normal_during,
        normal_answers,
        rss_idle,
        rss_peak,
        rss_peak_at,
        hwm,
        rss_after,
        samples,
        fds,
        cpu,
        machine_busy: busy as f64 / total.max(1) as f64,
        load_before,
        load_after,
        lookups,
        log_lines,
        open_files,
    })
}

// ---------------------------------------------------------------------------------------------
// Report

fn report(figures: &[Figures]) {
    println!();
    println!(
        "Lookup amplification: ConfigMap GETs the stand-in served from the attack's start until \
         its last answer (the normal reviews read Secrets only)"
    );
    println!(
        "| N at once | R per review | review size | ConfigMap GETs | GETs/s | GETs/review | after the last answer | attack answers | attack latency p50 / max (ms) | serve CPU, machine busy, load avg 1 min before / after |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for f in figures {
        println!(
            "| {} | {} | {:.1} KB | {} | {} | {} | {} | {} | {} / {} | {:.2} s in {:.2} s, {:.0} %, {} / {} |",
            f.n,
            thousands(f.r as u64),
            f.body_bytes as f64 / 1000.0,
            thousands(f.cm_gets as u64),
            thousands((f.cm_gets as f64 / f.attack_secs.max(1e-3)).round() as u64),
            thousands((f.cm_gets as f64 / f.n as f64).round() as u64),
            f.cm_gets_after,
            summarize(&f.attack_answers),
            ms(percentile(&f.attack_latency, 50.0)),
            ms(percentile(&f.attack_latency, 100.0)),
            f.cpu.as_secs_f64(),
            f.attack_secs,
            f.machine_busy * 100.0,
            f.load_before,
            f.load_after,
        );
    }
    println!();
    println!(
        "Memory and the normal review (CREATE, 2 Secret references, one every probe interval): \
         before the attack (same serve process) and while an attack review was unanswered"
    );
    println!(
        "| N | R | serve VmRSS idle (MiB) | peak VmRSS, 10 ms samples (MiB) | VmHWM (MiB) | 1 s after (MiB) | normal before p50 / p99 / max (ms) | normal during p50 / p99 / max (ms) | p99 during / before | normal during: answers | RSS < 128 MiB, normal < 100 ms |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for f in figures {
        let p = p50_p99_max;
        let ratio = percentile(&f.normal_during, 99.0).as_secs_f64()
            / percentile(&f.normal_before, 99.0).as_secs_f64().max(1e-9);
        let rss_ok = f.hwm.max(f.rss_peak) < TARGET_RSS_KIB;
        let normal_ok = !f.normal_during.is_empty()
            && percentile(&f.normal_during, 100.0) < TARGET_NORMAL
            && f.normal_answers.iter().all(|a| *a == Answer::Stamped);
        println!(
            "| {} | {} | {} | {} (at {:.2} s) | {} | {} | {} | {} | {:.1}x | {} | {} / {} |",
            f.n,
            thousands(f.r as u64),
            mib(f.rss_idle),
            mib(f.rss_peak),
            f.rss_peak_at.as_secs_f64(),
            mib(f.hwm),
            mib(f.rss_after),
            p(&f.normal_before),
            p(&f.normal_during),
            ratio,
            if f.normal_answers.is_empty() {
                "none sent".to_owned()
            } else {
                summarize(&f.normal_answers)
            },
            if rss_ok { "met" } else { "NOT met" },
            if normal_ok { "met" } else { "NOT met" },
        );
    }
    println!();
    println!("Details");
    for f in figures {
        let lookups: Vec<String> = f.lookups.iter().map(|(k, v)| format!("{k} {v}")).collect();
        println!(
            "- N={} R={}: serve counted lookups {}; Secret GETs (normal reviews) {}; {} RSS \
             samples, peak open files {} (limit {}); serve logged {} lines, {} at WARN/ERROR",
            f.n,
            f.r,
            if lookups.is_empty() {
                "none".to_owned()
            } else {
                lookups.join(", ")
            },
            f.secret_gets,
            f.samples,
            f.fds,
            f.open_files,
            f.log_lines.0,
            f.log_lines.1,
        );
    }
}

async fn run(options: Options) -> Result<(), String> {
    let (binary, how) = tokio::task::spawn_blocking({
        let options = options.clone();
        move || serve::release_binary(options.binary.as_deref(), "CONFIGHASH_ATTACK_BINARY")
    })
    .await
    .expect("the build")?;
    let standin = Standin::start().await;
    let ca = TestCa::new("attack_run CA");
    let files = Files::write("attack-run", &standin.kubeconfig(), &ca, KEY);
    let modified = serve::modified_ago(&binary);
    println!(
        "attack_run{}: binary {} ({how}; modified {modified})",
        if options.quick { " (quick)" } else { "" },
        binary.display()
    );
    println!(
        "serve arguments: --listen/--admin-listen 127.0.0.1:<free>, --tls-cert, --tls-key, \
         --key-file, --leader-elect false{}",
        if options.serve_args.is_empty() {
            String::new()
        } else {
            format!(", and {}", options.serve_args.join(" "))
        }
    );
    println!(
        "scenarios: N {:?} x R {:?}; normal review every {} ms; machine: {} cores, load average {}",
        options.ns,
        options.rs,
        options.probe_every.as_millis(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    let mut figures = Vec::new();
    let only = std::env::var("CONFIGHASH_ATTACK_ONLY").ok();
    let only_zero_window = only.as_deref() == Some("zero-window");
    let only_big = only.as_deref() == Some("big-secrets");
    for &r in if only_zero_window || only_big {
        &[][..]
    } else {
        &options.rs[..]
    } {
        for &n in &options.ns {
            let make = |k| attack_review(k, r);
            let attack = Attack {
                n,
                r,
                make: &make,
                extra: Vec::new(),
                tag: format!("{n}x{r}"),
            };
            let f = scenario(&standin, &binary, &files, &ca, &options, attack).await?;
            println!(
                "N={n} R={r}: {} ConfigMap GETs in {:.2} s; attack {}; peak VmRSS {} MiB, VmHWM \
                 {} MiB; normal during p50/max {} / {} ms (n={}); load average {}",
                f.cm_gets,
                f.attack_secs,
                summarize(&f.attack_answers),
                mib(f.rss_peak),
                mib(f.hwm),
                ms(percentile(&f.normal_during, 50.0)),
                ms(percentile(&f.normal_during, 100.0)),
                f.normal_during.len(),
                f.load_after
            );
            figures.push(f);
        }
    }
    if !figures.is_empty() {
        report(&figures);
    }
    if !options.big_ns.is_empty() && !only_zero_window {
        big_secrets(&standin, &binary, &files, &ca, &options).await?;
    }
    if options.zero_window > 0 && !only_big {
        zero_window(&binary, &files, &ca, &options, options.zero_window).await?;
    }
    Ok(())
}

/// The big-Secret attack, with serve's default `--max-reference-bytes` and with 4Gi, side by side.
async fn big_secrets(
    standin: &Standin,
    binary: &Path,
    files: &Files,
    ca: &TestCa,
    options: &Options,
) -> Result<(), String> {
    let started = Instant::now();
    standin.add_big_secrets().await;
    println!(
        "big-Secret attack: {BIG_SECRETS} Secrets of {} MiB added in {:.1} s",
        BIG_SECRET_BYTES >> 20,
        started.elapsed().as_secs_f64()
    );
    // What the API server sends for one big Secret: its value in base64, and the envelope.
    let per_get = BIG_SECRET_BYTES.div_ceil(3) * 4 + 300;
    let mut rows = Vec::new();
    for (limit, extra) in [
        ("16Mi (default)", Vec::new()),
        ("4Gi", vec!["--max-reference-bytes=4Gi".to_owned()]),
    ] {
        for &n in &options.big_ns {
            let attack = Attack {
                n,
                r: BIG_SECRETS,
                make: &big_review,
                extra: extra.clone(),
                tag: format!("big-{n}-{}", if extra.is_empty() { "16Mi" } else { "4Gi" }),
            };
            let f = scenario(standin, binary, files, ca, options, attack).await?;
            let normal = f.normal_before.len() + f.normal_during.len() + 2;
            let attack_gets = f.secret_gets.saturating_sub(2 * f.normal_during.len());
            println!(
                "big-Secret N={n} limit {limit}: {attack_gets} attack GETs in {:.2} s; attack {}; \
                 normal during p50/max {} / {} ms (n={}, {normal} in all); peak VmRSS {} MiB",
                f.attack_secs,
                summarize(&f.attack_answers),
                ms(percentile(&f.normal_during, 50.0)),
                ms(percentile(&f.normal_during, 100.0)),
                f.normal_during.len(),
                mib(f.rss_peak.max(f.hwm)),
            );
            rows.push((limit, attack_gets, f));
        }
    }
    println!();
    println!(
        "Big Secrets: N forged reviews at once, each naming {BIG_SECRETS} Secrets of {} MiB; \
         normal reviews (2 Secret references) every {} ms before and during",
        BIG_SECRET_BYTES >> 20,
        options.probe_every.as_millis()
    );
    println!(
        "| --max-reference-bytes | N | attack Secret GETs (per review) | MB the API server sent | attack answers | attack p50 / max (ms) | normal before p50 / p99 / max (ms) | normal during p50 / p99 / max (ms) | normal during: answers | serve peak VmRSS (MiB) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (limit, gets, f) in &rows {
        let p = p50_p99_max;
        println!(
            "| {limit} | {} | {} ({:.0}) | {} | {} | {} / {} | {} | {} | {} | {} |",
            f.n,
            thousands(*gets as u64),
            *gets as f64 / f.n as f64,
            thousands((*gets * per_get / 1_000_000) as u64),
            summarize(&f.attack_answers),
            ms(percentile(&f.attack_latency, 50.0)),
            ms(percentile(&f.attack_latency, 100.0)),
            p(&f.normal_before),
            p(&f.normal_during),
            if f.normal_answers.is_empty() {
                "none sent".to_owned()
            } else {
                summarize(&f.normal_answers)
            },
            mib(f.rss_peak.max(f.hwm)),
        );
    }
    Ok(())
}

/// Reviews per zero-window connection: the webhook's stream cap.
const ZERO_WINDOW_STREAMS: usize = 100;

/// The zero-window attack: `connections` HTTP/2 connections that set
/// `SETTINGS_INITIAL_WINDOW_SIZE` to 0, each sending [`ZERO_WINDOW_STREAMS`] small reviews and
/// never opening a stream window, so no answer can be sent; normal reviews every
/// `probe_every` on a connection of their own meanwhile. Reports serve's peak VmRSS, when the
/// attack's connections were closed, the normal reviews' latency and failures, and
/// `confighash_webhook_unsent_answers_closed_total`.
async fn zero_window(
    binary: &Path,
    files: &Files,
    ca: &TestCa,
    options: &Options,
    connections: usize,
) -> Result<(), String> {
    let serve = Serve::start(binary, files, &options.serve_args, "zero-window").await?;
    let url = format!("https://127.0.0.1:{}/mutate", serve.webhook.port());
    let clients = [HttpsClient::new(&ca.pem)];
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rss_idle = status_kib(serve.pid, "VmRSS:").unwrap_or(0);
    let tls = Arc::new(confighash_testkit::apiserver::https::client_config(
        &ca.pem,
        &[b"h2"],
    ));
    let started = Instant::now();
    let sampler = Sampler::start(serve.pid, started);
    let object = Arc::new(normal_object());
    let mut attackers = Vec::with_capacity(connections);
    for c in 0..connections {
        let (tls, object, addr) = (tls.clone(), object.clone(), serve.webhook);
        attackers.push(tokio::spawn(async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
            let stream = tokio_rustls::TlsConnector::from(tls)
                .connect(ServerName::try_from(SERVER_NAME).ok()?, tcp)
                .await
                .ok()?;
            let (mut sender, connection) =
                hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .initial_stream_window_size(0)
                    .handshake::<_, Full<Bytes>>(TokioIo::new(stream))
                    .await
                    .ok()?;
            let driver = tokio::spawn(connection);
            let mut heads = Vec::new();
            for i in 0..ZERO_WINDOW_STREAMS {
                if sender.ready().await.is_err() {
                    break;
                }
                let body = review(&format!("2e10a1a1-{c:04x}-4000-8000-{i:012x}"), &object);
                let request = hyper::Request::post("/mutate")
                    .header("host", SERVER_NAME)
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(body)))
                    .ok()?;
                heads.push(sender.send_request(request));
            }
            // The answers' heads arrive; their bodies never can. Held until the server closes.
            let mut held = Vec::new();
            for head in heads {
                if let Ok(response) = head.await {
                    held.push(response);
                }
            }
            let answered = held.len();
            let _ = driver.await;
            Some((answered, started.elapsed()))
        }));
    }
    let done = Arc::new(AtomicBool::new(false));
    let probing = {
        let done = done.clone();
        let clients = clients.clone();
        let url = url.clone();
        let every = options.probe_every;
        tokio::spawn(async move {
            probe(&clients, &url, every, |_, _| done.load(Ordering::Relaxed)).await
        })
    };
    let mut answered = 0;
    let mut closed_by = Duration::ZERO;
    let mut failed = 0;
    for a in attackers {
        match tokio::time::timeout(ATTACK_TIMEOUT, a).await {
            Ok(Ok(Some((n, at)))) => {
                answered += n;
                closed_by = closed_by.max(at);
            }
            _ => failed += 1,
        }
    }
    done.store(true, Ordering::Relaxed);
    let normal = probing.await.map_err(|e| e.to_string())?;
    let (rss_peak, peak_at, _, _) = sampler.finish();
    let closed = serve::admin_get(serve.admin, "/metrics")
        .await
        .ok()
        .and_then(|(_, text)| {
            text.lines()
                .find_map(|l| l.strip_prefix("confighash_webhook_unsent_answers_closed_total "))
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .unwrap_or(0.0);
    let mut latencies: Vec<Duration> = normal.iter().map(|(d, _)| *d).collect();
    latencies.sort_unstable();
    let stamped = normal.iter().filter(|(_, a)| *a == Answer::Stamped).count();
    let normal_answers: Vec<Answer> = normal.iter().map(|(_, a)| a.clone()).collect();
    println!(
        "zero-window attack: {connections} connections x {ZERO_WINDOW_STREAMS} reviews, \
         {answered} answer heads received, {failed} connections that did not open or end; \
         all closed by {:.1} s; serve closed {closed} for answers unsent; VmRSS idle {} MiB, \
         peak {} MiB at {:.1} s; normal reviews during: {stamped} of {} stamped ({}), p50 {} ms, \
         p99 {} ms, max {} ms; load average {}",
        closed_by.as_secs_f64(),
        mib(rss_idle),
        mib(rss_peak),
        peak_at.as_secs_f64(),
        normal.len(),
        summarize(&normal_answers),
        ms(percentile(&latencies, 50.0)),
        ms(percentile(&latencies, 99.0)),
        ms(percentile(&latencies, 100.0)),
        load_average()
    );
    Ok(())
}

/// Without `--bench`: the stand-in, the reviews, the token's RBAC and the GET count, no serve.
async fn smoke() -> Result<(), String> {
    let started = Instant::now();
    let standin = Standin::start().await;
    let (_, body) = attack_review(7, 10_000);
    if !(85_000..100_000).contains(&body.len()) {
        return Err(format!("an R=10,000 review is {} bytes", body.len()));
    }
    let (object, body) = attack_review(7, 256);
    let names = object["metadata"]["annotations"][EXTRA_CONFIGMAPS_ANNOTATION]
        .as_str()
        .unwrap_or_default();
    let unique: std::collections::BTreeSet<&str> = names.split(',').collect();
    if unique.len() != 256 || serde_json::from_slice::<Value>(&body).is_err() {
        return Err(format!(
            "{} distinct names in an R=256 review",
            unique.len()
        ));
    }
    let (object, body) = big_review(3);
    let named = object["metadata"]["annotations"][EXTRA_SECRETS_ANNOTATION]
        .as_str()
        .unwrap_or_default()
        .split(',')
        .count();
    if named != BIG_SECRETS || body.len() > 8_000 {
        return Err(format!(
            "a big-Secret review names {named} Secrets in {} bytes",
            body.len()
        ));
    }
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&standin.kubeconfig())
        .map_err(|e| format!("the kubeconfig: {e}"))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| format!("the kubeconfig: {e}"))?;
    let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
    let before = standin.gets();
    let found = Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE)
        .get_opt(CONFIG_MAPS[0])
        .await
        .map_err(|e| format!("GET as confighash: {e}"))?;
    let absent = Api::<Secret>::namespaced(client, NAMESPACE)
        .get_opt("nothing")
        .await
        .map_err(|e| format!("GET as confighash: {e}"))?;
    let after = standin.gets();
    if found.is_none() || absent.is_some() || after != (before.0 + 1, before.1 + 1) {
        return Err(format!("GET counts {before:?} -> {after:?}"));
    }
    println!(
        "attack_run: setup checked in {:.2} s (run with `cargo bench --bench attack_run` for the \
         attack)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn main() {
    let mode = mode::from_args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let result = match mode {
        Mode::Full => runtime.block_on(run(Options::from_env_and_args())),
        Mode::Smoke => runtime.block_on(smoke()),
    };
    runtime.shutdown_timeout(Duration::from_secs(2));
    if let Err(e) = result {
        eprintln!("attack_run FAILED: {e}");
        std::process::exit(1);
    }
}

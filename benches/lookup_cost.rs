//! Lookup cost measured from outside: the CPU the release `confighash serve` spends per review,
//! against a bare TLS server's, with every reference read from an API server over HTTP, as a
//! cluster sees it.
//!
//! Three kinds of process; the two helpers are this binary started again with
//! `CONFIGHASH_LOOKUP_COST_ROLE` set, so everything lives in this file and `crates/testkit/src/bench/`:
//!
//! 1. **The responder** (`role=responder`): a small plain-HTTP/1.1 keep-alive API server (hyper)
//!    that answers `GET /api/v1/namespaces/{ns}/configmaps/{name}` and `.../secrets/{name}` from
//!    the 10 objects of the webhook benches' fixture, each serialised once at start as
//!    kube-apiserver serialises it (kind, apiVersion, metadata with name, namespace, uid,
//!    resourceVersion, creationTimestamp, labels and a managedFields entry; data; type), with
//!    `Content-Length` and `application/json`; a `NotFound` Status for anything else it does not
//!    hold. It answers what `confighash serve` asks at startup so that its watcher starts
//!    quietly: API discovery (`/apis/apps/v1`, `/apis/batch/v1`; 404 for
//!    `/apis/argoproj.io/v1alpha1`), empty lists (with a resourceVersion) of ConfigMaps,
//!    Secrets and the workload kinds, the Namespaces `shop` (labelled
//!    `confighash.dev/enabled: "true"`) and `confighash`, and watches held open with nothing
//!    sent (the initial-events-end BOOKMARK first if a watch asks for `sendInitialEvents`). It
//!    counts the GETs of ConfigMaps and Secrets it answered (`/_count`) and records every other
//!    request (`/_requests`), so the report lists what serve asked for at startup.
//! 2. **The servers under test**, each its own process:
//!    - `confighash serve`, the release binary (built as `attack_run` builds it, in
//!      `target/attack-run`), with `--leader-elect false`, `--key-file`, `--tls-cert`/`--tls-key`
//!      issued by a test CA, `KUBECONFIG` pointing at the responder over `http://`, everything
//!      else default and the environment scrubbed of `CONFIGHASH_*` and `KUBERNETES_*`; the
//!      bench waits for `/readyz` and the watcher's sync;
//!    - **the bare server** (`role=bare`): rustls (ring) + tokio-rustls + axum with the same
//!      certificate, TLS 1.3 and 1.2, ALPN `h2` and `http/1.1`, no session resumption and
//!      TCP_NODELAY as serve; `POST /mutate` parses the body into a `serde_json::Value` and
//!      answers the AdmissionReview confighash answers (the same bytes) with the review's uid
//!      copied in.
//!    - **the fair baseline** (`bare+gets`: `role=bare` with `CONFIGHASH_LOOKUP_COST_BARE_GETS`
//!      set to the responder's address): the same bare server, which before it answers reads
//!      the fixture's 10 objects from the responder, all at once, through hyper's plain pooled
//!      client (`hyper_util::client::legacy`, HTTP/1.1 keep-alive, TCP_NODELAY), each body read
//!      to its end and its status checked, nothing decoded.
//! 3. **The client**, this process: the 21 KiB UPDATE review of the webhook benches (the
//!    Deployment with 10 references, 6 ConfigMaps and 4 Secrets, in the opted-in namespace
//!    `shop`, with `oldObject`, a stale stamp so that the answer carries a patch), each with its
//!    own uid, over 4 kept-alive HTTPS clients (HTTP/2, as kube-apiserver's webhook client).
//!    Every answer is checked: status 200, and the bytes of `Webhook::answer` over the same
//!    objects with the review's uid (or, if the bytes differ, `allowed`, the uid and a patch that
//!    sets the expected stamp). A wrong answer fails the run.
//!
//! Measured for each server, in the same run, after a warm-up, in `ROUNDS` rounds of bare,
//! confighash, then the fair baseline (closed loops side by side, then open loops):
//! - **closed loop**: `REVIEWS` reviews from 8 concurrent senders; the server's CPU (utime +
//!   stime of `/proc/<pid>/stat`) per review, and the responder's for confighash; reviews/s;
//!   GETs per review (the responder's count);
//! - **open loop**: `RATE` reviews/s for `SECS` s, each send spawned at its scheduled time,
//!   latency from the scheduled time to the end of the reply; p50/p99/max, wrong, failed and
//!   unanswered (the client gives up after 10 s); CPU and GETs per review again.
//!
//! The headline is confighash against the fair baseline: CPU per review (closed and open loops),
//! open-loop p50 and p99, each as a ratio per round and the median of the ratios (targets ≤
//! 1.5x). Beside it, as before, confighash CPU per review / the bare server's (target ≤ 2.5) and
//! confighash's open-loop p99 (target < 10 ms).
//! Everything shares the machine (2 cores here), so every phase also gives how busy all cores
//! were: by `/proc/stat` (as the other benches), by the CPU times of every process (which, unlike
//! `/proc/stat`'s ticks on a tickless kernel, also see work done in bursts shorter than a tick),
//! the share used by processes outside this run, and the host's steal time; with the load
//! average. For the open loops, the seconds of the schedule whose p99 reached 10 ms or that had
//! an exchange that was not right are listed, and failed exchanges by kind (a 503 from serve's
//! review memory budget, ...).
//!
//! Environment: `CONFIGHASH_LOOKUP_COST_RATE` (1000), `CONFIGHASH_LOOKUP_COST_SECS` (10),
//! `CONFIGHASH_LOOKUP_COST_REVIEWS` (closed loop, 5000), `CONFIGHASH_LOOKUP_COST_ROUNDS` (5),
//! `CONFIGHASH_LOOKUP_COST_BINARY` (use this confighash binary, no build: to compare two builds),
//! `CONFIGHASH_LOOKUP_COST_SERVE_ARGS` (extra serve arguments, split on whitespace).
//!
//! `cargo bench --bench lookup_cost`. Without `--bench` (as `cargo test --benches` runs it): one
//! round of 200 closed-loop reviews and 2 s at 50/s against the debug binary cargo built for the
//! tests (the knobs but `_BINARY` are ignored), with every check, asserting right answers, no
//! failed exchange and 10 GETs per review from both servers that read; a few seconds. `--list` lists nothing.

use confighash_testkit::bench::fixture;
use confighash_testkit::bench::mode;
use confighash_testkit::bench::serve;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use confighash::certs::key::KeyStore;
use confighash::core::checksum::StampKey;
use confighash::metrics::Metrics;
use confighash::webhook::admission::Webhook;
use confighash_testkit::apiserver::{HttpsClient, TestCa};
use mode::Mode;
use rustls_pki_types::ServerName;
use serde_json::Value;
use serve::{Files, SERVER_NAME, Serve};

/// The variable that makes this binary a helper process.
const ROLE_VAR: &str = "CONFIGHASH_LOOKUP_COST_ROLE";
/// The bare server's files, set by the client.
const BARE_CERT_VAR: &str = "CONFIGHASH_LOOKUP_COST_BARE_CERT";
const BARE_KEY_VAR: &str = "CONFIGHASH_LOOKUP_COST_BARE_KEY";
const BARE_REPLY_VAR: &str = "CONFIGHASH_LOOKUP_COST_BARE_REPLY";
/// Set for the fair baseline: the responder's address, whose 10 objects the bare server reads
/// for every review before it answers.
const BARE_GETS_VAR: &str = "CONFIGHASH_LOOKUP_COST_BARE_GETS";
/// What a helper prints first on stdout, followed by its address.
const LISTENING: &str = "LISTENING ";
/// Where the reply template holds the review's uid.
const UID_MARK: &str = "@@uid@@";

/// serve's own namespace (the kubeconfig context's), as in deploy/.
const OWN_NAMESPACE: &str = "confighash";
const TOKEN: &str = "lookup-cost-token";
/// Concurrent senders of the closed loop.
const SENDERS: u64 = 8;
/// Kept-alive HTTPS clients (one HTTP/2 connection each) per server.
const CONNECTIONS: usize = 4;
/// The targets: confighash's CPU per review at most this many times the bare server's, and its
/// open-loop p99 under this.
const TARGET_RATIO: f64 = 2.5;
const TARGET_P99: Duration = Duration::from_millis(10);
/// The targets against the fair baseline (the bare server that also reads the 10 objects):
/// confighash's p50, p99 and CPU per review each at most this many times its.
const TARGET_FAIR_RATIO: f64 = 1.5;
/// The servers, by the names the tables use.
const BARE: &str = "bare";
const BARE_GETS: &str = "bare+gets";
const CONFIGHASH: &str = "confighash";
/// Kinds of failed exchanges told apart in a phase's tally.
const MAX_FAILURE_KINDS: usize = 20;
/// How long a helper may take to print its address.
const HELPER_READY_WITHIN: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Options

#[derive(Debug, Clone)]
struct Options {
    rate: u32,
    duration: Duration,
    reviews: u64,
    rounds: usize,
    warm_up: u64,
    binary: Option<PathBuf>,
    serve_args: Vec<String>,
}

fn env_parse<T: std::str::FromStr>(name: &str) -> Option<T> {
    let value = std::env::var(name).ok().filter(|v| !v.trim().is_empty())?;
    match value.trim().replace('_', "").parse() {
        Ok(v) => Some(v),
        Err(_) => {
            eprintln!("{name}={value:?} is not a valid value");
            std::process::exit(2);
        }
    }
}

/// `CONFIGHASH_LOOKUP_COST_BINARY`: a confighash binary to use instead of building one.
fn binary_from_env() -> Option<PathBuf> {
    std::env::var_os("CONFIGHASH_LOOKUP_COST_BINARY")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

impl Options {
    /// The full run, with the environment's knobs.
    fn from_env() -> Self {
        let rate: u32 = env_parse("CONFIGHASH_LOOKUP_COST_RATE").unwrap_or(1000);
        let secs: f64 = env_parse("CONFIGHASH_LOOKUP_COST_SECS").unwrap_or(10.0);
        let reviews: u64 = env_parse("CONFIGHASH_LOOKUP_COST_REVIEWS").unwrap_or(5000);
        let rounds: usize = env_parse("CONFIGHASH_LOOKUP_COST_ROUNDS").unwrap_or(5);
        if rate == 0 || !secs.is_finite() || secs <= 0.0 || reviews == 0 || rounds == 0 {
            eprintln!(
                "need CONFIGHASH_LOOKUP_COST_RATE, _SECS, _REVIEWS and _ROUNDS greater than 0"
            );
            std::process::exit(2);
        }
        Options {
            rate,
            duration: Duration::from_secs_f64(secs),
            reviews,
            rounds,
            warm_up: 500,
            binary: binary_from_env(),
            serve_args: std::env::var("CONFIGHASH_LOOKUP_COST_SERVE_ARGS")
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_owned)
                .collect(),
        }
    }

    /// Without `--bench`: one short round at a low rate, whatever the environment says (but
    /// the binary to use).
    fn smoke() -> Self {
        Options {
            rate: 50,
            duration: Duration::from_secs(2),
            reviews: 200,
            rounds: 1,
            warm_up: 20,
            binary: binary_from_env(),
            serve_args: Vec::new(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The responder: a reference API server

mod responder {
    use std::collections::{BTreeMap, HashMap};
    use std::convert::Infallible;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use axum::body::Bytes;
    use futures::StreamExt;
    use http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
    use http::{Method, Request, Response, StatusCode};
    use http_body_util::combinators::UnsyncBoxBody;
    use http_body_util::{BodyExt, Full, StreamBody};
    use hyper::body::{Frame, Incoming};
    use hyper_util::rt::TokioIo;
    use serde_json::{Value, json};

    use super::fixture;
    use confighash::webhook::lookup::Fetched;

    type Body = UnsyncBoxBody<Bytes, Infallible>;

    /// The resourceVersion of every list, and of the watches' bookmarks.
    const LIST_VERSION: &str = "1000";
    const CREATED: &str = "2025-11-03T09:12:44Z";
    /// Distinct requests recorded for `/_requests`, at most.
    const MAX_RECORDED: usize = 1000;

    /// A resource the responder serves: (group, version, plural, kind, namespaced).
    type Resource = (&'static str, &'static str, &'static str, &'static str, bool);
    const RESOURCES: &[Resource] = &[
        ("", "v1", "configmaps", "ConfigMap", true),
        ("", "v1", "secrets", "Secret", true),
        ("", "v1", "namespaces", "Namespace", false),
        ("apps", "v1", "deployments", "Deployment", true),
        ("apps", "v1", "statefulsets", "StatefulSet", true),
        ("apps", "v1", "daemonsets", "DaemonSet", true),
        ("batch", "v1", "cronjobs", "CronJob", true),
        ("batch", "v1", "jobs", "Job", true),
    ];

    struct Api {
        /// The answers to GETs of the fixture's objects, serialised once, by path.
        objects: HashMap<String, Bytes>,
        /// The Namespaces, as list items.
        namespaces: Vec<Value>,
        config_maps: AtomicU64,
        secrets: AtomicU64,
        absent: AtomicU64,
        audit: AtomicU64,
        /// Every other request: "METHOD path?query" and how many times.
        requests: Mutex<BTreeMap<String, u64>>,
    }

    /// Serves until stdin closes (the client is gone) or the process is killed.
    pub fn main() -> Result<(), String> {
        std::thread::spawn(|| {
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            std::process::exit(0);
        });
        let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
        runtime.block_on(serve())
    }

    async fn serve() -> Result<(), String> {
        let api = std::sync::Arc::new(Api::new());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        super::announce(addr);
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let api = api.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let response = api.handle(&req);
                    async move { Ok::<_, Infallible>(response) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    }

    /// An object of the fixture as kube-apiserver serialises it: its path and its bytes.
    fn api_object(fetched: &Fetched, index: usize) -> Option<(String, Bytes)> {
        let (kind, plural, meta, data, extra) = match fetched {
            Fetched::ConfigMap(c) => (
                "ConfigMap",
                "configmaps",
                &c.metadata,
                serde_json::to_value(&c.data).ok()?,
                c.binary_data
                    .as_ref()
                    .and_then(|b| serde_json::to_value(b).ok())
                    .map(|b| ("binaryData", b)),
            ),
            Fetched::Secret(s) => (
                "Secret",
                "secrets",
                &s.metadata,
                serde_json::to_value(&s.data).ok()?,
                s.type_.as_ref().map(|t| ("type", Value::from(t.as_str()))),
            ),
            Fetched::Entry(_) => return None,
        };
        let name = meta.name.clone()?;
        let namespace = meta.namespace.clone()?;
        let field_set = |map: &Value| -> Value {
            map.as_object()
                .map(|m| {
                    m.keys()
                        .map(|k| (format!("f:{k}"), json!({})))
                        .collect::<serde_json::Map<_, _>>()
                        .into()
                })
                .unwrap_or_else(|| json!({}))
        };
        let labels = serde_json::to_value(&meta.labels).ok()?;
        let mut fields = json!({
            "f:data": field_set(&data),
            "f:metadata": {"f:labels": field_set(&labels)}
        });
        if let Some((key, _)) = &extra {
            fields[format!("f:{key}")] = json!({});
        }
        let mut object = json!({
            "kind": kind,
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": format!("5f1e0c6a-9a2b-4c1d-8e3f-{index:012x}"),
                "resourceVersion": meta.resource_version.clone().unwrap_or_else(|| "1".into()),
                "creationTimestamp": CREATED,
                "labels": labels,
                "managedFields": [{
                    "manager": "kubectl-client-side-apply",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": CREATED,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": fields
                }]
            },
            "data": data
        });
        if let Some((key, value)) = extra {
            object[key] = value;
        }
        let mut bytes = serde_json::to_vec(&object).ok()?;
        bytes.push(b'\n');
        Some((
            format!("/api/v1/namespaces/{namespace}/{plural}/{name}"),
            Bytes::from(bytes),
        ))
    }

    fn namespace(name: &str, index: usize, opted_in: bool) -> Value {
        let mut labels = json!({"kubernetes.io/metadata.name": name});
        if opted_in {
            labels[confighash::core::names::ENABLED_LABEL] = json!("true");
        }
        json!({
            "metadata": {
                "name": name,
                "uid": format!("0a4c5e2b-1d3f-4e6a-8b7c-{index:012x}"),
                "resourceVersion": "900",
                "creationTimestamp": CREATED,
                "labels": labels
            },
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"}
        })
    }

    fn to_bytes(value: &Value) -> Bytes {
        let mut bytes = serde_json::to_vec(value).unwrap_or_default();
        bytes.push(b'\n');
        Bytes::from(bytes)
    }

    fn respond(status: StatusCode, body: Bytes) -> Response<Body> {
        let mut response = Response::new(Full::new(body).boxed_unsync());
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
        response
    }

    fn not_found(what: &str, name: &str) -> Response<Body> {
        let message = if name.is_empty() {
            "the server could not find the requested resource".to_owned()
        } else {
            format!("{what} \"{name}\" not found")
        };
        respond(
            StatusCode::NOT_FOUND,
            to_bytes(&json!({
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": message,
                "reason": "NotFound",
                "details": {"name": name, "kind": what},
                "code": 404
            })),
        )
    }

    fn query_param<'a>(query: &'a str, key: &str) -> Option<&'a str> {
        query
            .split('&')
            .filter_map(|pair| pair.split_once('='))
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v)
    }

    fn group_version(group: &str, version: &str) -> String {
        if group.is_empty() {
            version.to_owned()
        } else {
            format!("{group}/{version}")
        }
    }

    fn resource(group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
        RESOURCES
            .iter()
            .find(|(g, v, p, _, _)| *g == group && *v == version && *p == plural)
    }

    /// `/api/v1`, `/apis/<group>/<version>`: the resources served there.
    fn discovery(group: &str, version: &str) -> Option<Value> {
        let resources: Vec<Value> = RESOURCES
            .iter()
            .filter(|(g, v, _, _, _)| *g == group && *v == version)
            .map(|(_, _, plural, kind, namespaced)| {
                json!({
                    "name": plural,
                    "singularName": kind.to_lowercase(),
                    "namespaced": namespaced,
                    "kind": kind,
                    "verbs": ["create", "delete", "deletecollection", "get", "list", "patch",
                              "update", "watch"]
                })
            })
            .collect();
        (!resources.is_empty()).then(|| {
            json!({
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": group_version(group, version),
                "resources": resources
            })
        })
    }

    /// A watch that sends nothing (but the initial-events-end bookmark, when the initial
    /// events are asked for) and ends after its `timeoutSeconds`.
    fn watch(query: &str, resource: &Resource) -> Response<Body> {
        let (group, version, _, kind, _) = resource;
        let timeout = query_param(query, "timeoutSeconds")
            .and_then(|t| t.parse::<u64>().ok())
            .unwrap_or(1800)
            .min(3600);
        let bookmark = (query_param(query, "sendInitialEvents") == Some("true")).then(|| {
            to_bytes(&json!({
                "type": "BOOKMARK",
                "object": {
                    "kind": kind,
                    "apiVersion": group_version(group, version),
                    "metadata": {
                        "resourceVersion": LIST_VERSION,
                        "annotations": {"k8s.io/initial-events-end": "true"}
                    }
                }
            }))
        });
        let frames = futures::stream::iter(bookmark.map(|b| Ok::<_, Infallible>(Frame::data(b))))
            .chain(
                futures::stream::once(tokio::time::sleep(Duration::from_secs(timeout)))
                    .filter_map(|()| futures::future::ready(None)),
            );
        let mut response = Response::new(StreamBody::new(frames).boxed_unsync());
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        response
    }

    impl Api {
        fn new() -> Self {
            let objects = fixture::objects()
                .iter()
                .enumerate()
                .filter_map(|(i, f)| api_object(f, i))
                .collect();
            Api {
                objects,
                namespaces: vec![
                    namespace(super::OWN_NAMESPACE, 0, false),
                    namespace(fixture::NAMESPACE, 1, true),
                ],
                config_maps: AtomicU64::new(0),
                secrets: AtomicU64::new(0),
                absent: AtomicU64::new(0),
                audit: AtomicU64::new(0),
                requests: Mutex::new(BTreeMap::new()),
            }
        }

        fn handle(&self, req: &Request<Incoming>) -> Response<Body> {
            let path = req.uri().path();
            let query = req.uri().query().unwrap_or("");
            let single = (req.method() == Method::GET)
                .then(|| single_object(path))
                .flatten();
            let mut response = match (req.method(), path, single) {
                (&Method::GET, "/_count", _) => respond(
                    StatusCode::OK,
                    Bytes::from(format!(
                        "configmaps {}\nsecrets {}\nabsent {}\n",
                        self.config_maps.load(Ordering::Relaxed),
                        self.secrets.load(Ordering::Relaxed),
                        self.absent.load(Ordering::Relaxed)
                    )),
                ),
                (&Method::GET, "/_requests", _) => {
                    let text = self
                        .requests
                        .lock()
                        .map(|r| {
                            r.iter()
                                .map(|(k, n)| format!("{n} {k}\n"))
                                .collect::<String>()
                        })
                        .unwrap_or_default();
                    respond(StatusCode::OK, Bytes::from(text))
                }
                (_, _, Some((plural, name))) => {
                    let counter = if plural == "configmaps" {
                        &self.config_maps
                    } else {
                        &self.secrets
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    match self.objects.get(path) {
                        Some(bytes) => respond(StatusCode::OK, bytes.clone()),
                        None => {
                            self.absent.fetch_add(1, Ordering::Relaxed);
                            not_found(plural, name)
                        }
                    }
                }
                _ => {
                    self.record(req.method(), path, query);
                    self.other(req.method(), path, query)
                }
            };
            let n = self.audit.fetch_add(1, Ordering::Relaxed);
            if let Ok(id) = HeaderValue::from_str(&format!("6b1f0d3e-4c2a-4f5b-9e8d-{n:012x}")) {
                response.headers_mut().insert("audit-id", id);
            }
            response
        }

        fn record(&self, method: &Method, path: &str, query: &str) {
            let key = if query.is_empty() {
                format!("{method} {path}")
            } else {
                format!("{method} {path}?{query}")
            };
            if let Ok(mut requests) = self.requests.lock() {
                if let Some(n) = requests.get_mut(&key) {
                    *n += 1;
                } else if requests.len() < MAX_RECORDED {
                    requests.insert(key, 1);
                }
            }
        }

        /// Everything but the GET of one ConfigMap or Secret.
        fn other(&self, method: &Method, path: &str, query: &str) -> Response<Body> {
            let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
            let (group, version, rest) = match segments.as_slice() {
                ["version"] => {
                    return respond(
                        StatusCode::OK,
                        to_bytes(&json!({
                            "major": "1", "minor": "33", "gitVersion": "v1.33.0",
                            "gitCommit": "60a317eadfcb839692a68eab88b2096f4d708f4f",
                            "gitTreeState": "clean", "buildDate": "2025-04-23T13:01:09Z",
                            "goVersion": "go1.24.2", "compiler": "gc", "platform": "linux/amd64"
                        })),
                    );
                }
                ["api"] => {
                    return respond(
                        StatusCode::OK,
                        to_bytes(&json!({
                            "kind": "APIVersions",
                            "versions": ["v1"],
                            "serverAddressByClientCIDRs": [
                                {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}
                            ]
                        })),
                    );
                }
                ["apis"] => {
                    let groups: Vec<Value> = ["apps", "batch"]
                        .iter()
                        .map(|g| {
                            let gv = json!({"groupVersion": format!("{g}/v1"), "version": "v1"});
                            json!({"name": g, "versions": [gv.clone()], "preferredVersion": gv})
                        })
                        .collect();
                    return respond(
                        StatusCode::OK,
                        to_bytes(&json!({
                            "kind": "APIGroupList", "apiVersion": "v1", "groups": groups
                        })),
                    );
                }
                ["api", version, rest @ ..] => ("", *version, rest),
                ["apis", group, version, rest @ ..] => (*group, *version, rest),
                _ => return not_found("", ""),
            };
            if method != Method::GET {
                return not_found("", "");
            }
            // (plural, namespace, name)
            let (plural, namespace, name) = match rest {
                [] => {
                    return match discovery(group, version) {
                        Some(list) => respond(StatusCode::OK, to_bytes(&list)),
                        None => not_found("", ""),
                    };
                }
                [plural] => (*plural, None, None),
                ["namespaces", namespace, plural] => (*plural, Some(*namespace), None),
                [plural, name] => (*plural, None, Some(*name)),
                ["namespaces", namespace, plural, name] => (*plural, Some(*namespace), Some(*name)),
                _ => return not_found("", ""),
            };
            let Some(resource) = resource(group, version, plural) else {
                return not_found(plural, name.unwrap_or(""));
            };
            if let Some(name) = name {
                // One object: only Namespaces are held besides the fixture's.
                let held = (plural == "namespaces" && namespace.is_none())
                    .then(|| {
                        self.namespaces
                            .iter()
                            .find(|ns| ns["metadata"]["name"] == name)
                    })
                    .flatten();
                return match held {
                    Some(ns) => {
                        let mut ns = ns.clone();
                        if let Some(object) = ns.as_object_mut() {
                            object.insert("kind".into(), json!("Namespace"));
                            object.insert("apiVersion".into(), json!("v1"));
                        }
                        respond(StatusCode::OK, to_bytes(&ns))
                    }
                    None => not_found(plural, name),
                };
            }
            if matches!(query_param(query, "watch"), Some("true" | "1")) {
                return watch(query, resource);
            }
            let (_, _, _, kind, _) = resource;
            let items: Vec<Value> = if plural == "namespaces" && namespace.is_none() {
                self.namespaces.clone()
            } else {
                Vec::new()
            };
            respond(
                StatusCode::OK,
                to_bytes(&json!({
                    "kind": format!("{kind}List"),
                    "apiVersion": group_version(group, version),
                    "metadata": {"resourceVersion": LIST_VERSION},
                    "items": items
                })),
            )
        }
    }

    /// `/api/v1/namespaces/{ns}/configmaps/{name}` or `.../secrets/{name}`: the plural and name.
    fn single_object(path: &str) -> Option<(&str, &str)> {
        let rest = path.strip_prefix("/api/v1/namespaces/")?;
        let mut parts = rest.split('/');
        let (namespace, plural, name) = (parts.next()?, parts.next()?, parts.next()?);
        (parts.next().is_none()
            && !namespace.is_empty()
            && !name.is_empty()
            && matches!(plural, "configmaps" | "secrets"))
        .then_some((plural, name))
    }
}

// ---------------------------------------------------------------------------------------------
// The bare server: rustls + axum, parse and answer

mod bare {
    use std::hint::black_box;
    use std::sync::Arc;

    use axum::body::Bytes;
    use axum::http::Uri;
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    use axum::routing::post;
    use confighash::serving::tls::ALPN_PROTOCOLS;
    use confighash::webhook::lookup::Fetched;
    use http_body_util::{BodyExt, Empty};
    use hyper_util::client::legacy::Client;
    use hyper_util::client::legacy::connect::HttpConnector;
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto;
    use hyper_util::service::TowerToHyperService;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    use serde_json::Value;
    use tokio_rustls::TlsAcceptor;

    /// The fair baseline's reads: the fixture's 10 objects from the responder, all at once,
    /// through hyper's plain pooled client (HTTP/1.1 keep-alive, TCP_NODELAY), each answer's body
    /// read to its end and its status checked, nothing decoded.
    struct Gets {
        client: Client<HttpConnector, Empty<Bytes>>,
        uris: Vec<Uri>,
    }

    impl Gets {
        fn new(addr: &str) -> Result<Self, String> {
            let uris = super::fixture::objects()
                .iter()
                .map(|fetched| {
                    let (plural, meta) = match fetched {
                        Fetched::ConfigMap(c) => ("configmaps", &c.metadata),
                        Fetched::Secret(s) => ("secrets", &s.metadata),
                        Fetched::Entry(_) => return Err("an object without metadata".to_owned()),
                    };
                    let (Some(ns), Some(name)) = (&meta.namespace, &meta.name) else {
                        return Err("an object without a namespace or name".to_owned());
                    };
                    format!("http://{addr}/api/v1/namespaces/{ns}/{plural}/{name}")
                        .parse::<Uri>()
                        .map_err(|e| e.to_string())
                })
                .collect::<Result<Vec<_>, _>>()?;
            let mut http = HttpConnector::new();
            http.set_nodelay(true);
            let client = Client::builder(TokioExecutor::new()).build(http);
            Ok(Gets { client, uris })
        }

        async fn read_all(&self) -> Result<(), String> {
            let reads = self.uris.iter().map(|uri| async move {
                let response = self
                    .client
                    .get(uri.clone())
                    .await
                    .map_err(|e| e.to_string())?;
                let status = response.status();
                let body = response
                    .into_body()
                    .collect()
                    .await
                    .map_err(|e| e.to_string())?
                    .to_bytes();
                if status != StatusCode::OK {
                    return Err(format!("{uri} answered {status}"));
                }
                black_box(body);
                Ok(())
            });
            futures::future::try_join_all(reads).await.map(|_| ())
        }
    }

    fn read(var: &str) -> Result<Vec<u8>, String> {
        let path = std::env::var_os(var).ok_or_else(|| format!("{var} is not set"))?;
        std::fs::read(&path).map_err(|e| format!("{}: {e}", path.to_string_lossy()))
    }

    /// Serves until stdin closes (the client is gone) or the process is killed.
    pub fn main() -> Result<(), String> {
        std::thread::spawn(|| {
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            std::process::exit(0);
        });
        let cert = read(super::BARE_CERT_VAR)?;
        let key = read(super::BARE_KEY_VAR)?;
        let template = read(super::BARE_REPLY_VAR)?;
        let (prefix, suffix) =
            super::split_template(&template).ok_or("the reply template holds no uid mark")?;
        let chain = CertificateDer::pem_slice_iter(&cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("the certificate: {e}"))?;
        let key = PrivateKeyDer::from_pem_slice(&key).map_err(|e| format!("the key: {e}"))?;
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| e.to_string())?;
        // As serve: ALPN h2 then http/1.1, no session resumption.
        config.alpn_protocols = ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect();
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        config.send_tls13_tickets = 0;
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let gets = match std::env::var(super::BARE_GETS_VAR) {
            Ok(addr) => Some(Arc::new(Gets::new(&addr)?)),
            Err(_) => None,
        };
        let (prefix, suffix) = (Bytes::from(prefix), Bytes::from(suffix));
        let router = axum::Router::new().route(
            "/mutate",
            post(move |body: Bytes| {
                let (prefix, suffix) = (prefix.clone(), suffix.clone());
                let gets = gets.clone();
                async move {
                    let review = match serde_json::from_slice::<Value>(&body) {
                        Ok(review) => review,
                        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
                    };
                    if let Some(gets) = gets
                        && let Err(e) = gets.read_all().await
                    {
                        return (StatusCode::BAD_GATEWAY, e).into_response();
                    }
                    let Some(uid) = review.pointer("/request/uid").and_then(Value::as_str) else {
                        return (StatusCode::BAD_REQUEST, "no request.uid").into_response();
                    };
                    let uid = serde_json::to_string(uid).unwrap_or_default();
                    let mut reply = Vec::with_capacity(prefix.len() + uid.len() + suffix.len());
                    reply.extend_from_slice(&prefix);
                    reply.extend_from_slice(uid.as_bytes());
                    reply.extend_from_slice(&suffix);
                    black_box(review);
                    ([(header::CONTENT_TYPE, "application/json")], reply).into_response()
                }
            }),
        );
        let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(|e| e.to_string())?;
            super::announce(listener.local_addr().map_err(|e| e.to_string())?);
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder.http1().timer(TokioTimer::new());
            builder.http2().timer(TokioTimer::new());
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                // As serve does.
                let _ = tcp.set_nodelay(true);
                let acceptor = acceptor.clone();
                let service = TowerToHyperService::new(router.clone());
                let builder = builder.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let _ = builder
                        .serve_connection_with_upgrades(TokioIo::new(tls), service)
                        .await;
                });
            }
        })
    }
}

/// A helper's first line on stdout: where it listens.
fn announce(addr: SocketAddr) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{LISTENING}{addr}");
    let _ = stdout.flush();
}

/// The reply template's bytes before and after the quoted uid mark.
fn split_template(template: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    let mark = format!("\"{UID_MARK}\"");
    let at = template
        .windows(mark.len())
        .position(|w| w == mark.as_bytes())?;
    Some((
        template[..at].to_vec(),
        template[at + mark.len()..].to_vec(),
    ))
}

// ---------------------------------------------------------------------------------------------
// Helper processes, as the client starts them

/// A helper process (this binary with a role); killed on drop. Its stdin is a pipe the helper
/// reads to its end: if this process dies, the helper exits too.
struct Helper {
    child: Child,
    _stdin: Option<ChildStdin>,
    pid: u32,
    addr: SocketAddr,
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Helper {
    /// Starts `role` with `envs`, its stderr into `log`, and waits (within
    /// [`HELPER_READY_WITHIN`]) for the address it listens on.
    fn start(role: &str, envs: &[(&str, &OsStr)], log: &Path) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| format!("this executable: {e}"))?;
        let mut command = Command::new(exe);
        command
            .env(ROLE_VAR, role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(
                std::fs::File::create(log).map_err(|e| e.to_string())?,
            ));
        for (name, value) in envs {
            command.env(name, value);
        }
        let mut child = command
            .spawn()
            .map_err(|e| format!("spawning the {role}: {e}"))?;
        let stdout = child.stdout.take();
        let mut helper = Helper {
            _stdin: child.stdin.take(),
            pid: child.id(),
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let Some(stdout) = stdout else { return };
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(first)) = lines.next() {
                let _ = tx.send(first);
            }
            // Drain whatever else it prints.
            for _ in lines {}
        });
        let line = rx.recv_timeout(HELPER_READY_WITHIN).map_err(|_| {
            format!(
                "the {role} printed no address within {} s: {}",
                HELPER_READY_WITHIN.as_secs(),
                std::fs::read_to_string(log).unwrap_or_default()
            )
        })?;
        helper.addr = line
            .strip_prefix(LISTENING)
            .and_then(|a| a.trim().parse().ok())
            .ok_or_else(|| format!("the {role} printed {line:?}"))?;
        Ok(helper)
    }
}

/// The responder's counts: GETs of ConfigMaps, of Secrets, and how many found nothing.
async fn responder_counts(addr: SocketAddr) -> Result<(u64, u64, u64), String> {
    let (status, body) = serve::admin_get(addr, "/_count").await?;
    if status != 200 {
        return Err(format!("/_count answered {status}"));
    }
    let value = |key: &str| {
        body.lines()
            .find_map(|l| l.strip_prefix(key)?.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    Ok((value("configmaps "), value("secrets "), value("absent ")))
}

/// The requests the responder answered other than GETs of ConfigMaps and Secrets.
async fn responder_requests(addr: SocketAddr) -> BTreeMap<String, u64> {
    let Ok((200, body)) = serve::admin_get(addr, "/_requests").await else {
        return BTreeMap::new();
    };
    body.lines()
        .filter_map(|l| {
            let (n, request) = l.split_once(' ')?;
            Some((request.to_owned(), n.parse().ok()?))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The review and the answers

/// The fixture's review body, and where its uid is, so that each send has its own.
struct Review {
    body: Vec<u8>,
    uid_at: usize,
}

impl Review {
    fn new(body: Vec<u8>) -> Self {
        let uid = fixture::UID.as_bytes();
        let mut at = body
            .windows(uid.len())
            .enumerate()
            .filter(|(_, w)| *w == uid);
        let (uid_at, _) = at.next().expect("the review holds its uid");
        assert!(at.next().is_none(), "the review's uid is written once");
        Review { body, uid_at }
    }

    /// The body with uid number `i`, and that uid.
    fn with_uid(&self, i: u64) -> (Vec<u8>, String) {
        let uid = format!("{}{:012x}", &fixture::UID[..24], i & 0xffff_ffff_ffff);
        let mut body = self.body.clone();
        body[self.uid_at..self.uid_at + uid.len()].copy_from_slice(uid.as_bytes());
        (body, uid)
    }
}

/// The right answer: `Webhook::answer`'s bytes over the fixture's objects, around the uid.
struct Expected {
    prefix: Vec<u8>,
    suffix: Vec<u8>,
    stamp: String,
}

/// What an exchange came to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// Byte for byte the expected answer.
    Exact,
    /// Other bytes, but allowed, the uid and the expected stamp patch.
    Equivalent,
    /// A 200 that is not the right answer.
    Wrong(String),
    /// A status other than 200, or a transport error.
    Failed(String),
    /// No reply within the client's 10 s.
    Unanswered,
}

impl Expected {
    fn outcome(
        &self,
        reply: Result<confighash_testkit::apiserver::https::Reply, String>,
        uid: &str,
    ) -> Outcome {
        let reply = match reply {
            Ok(r) => r,
            Err(e) if e.contains("no reply within") => return Outcome::Unanswered,
            Err(e) => return Outcome::Failed(e),
        };
        if reply.status != 200 {
            let text = String::from_utf8_lossy(&reply.body);
            let first: String = text.lines().next().unwrap_or("").chars().take(60).collect();
            return Outcome::Failed(format!("HTTP {} {first}", reply.status));
        }
        let body = &reply.body;
        let quoted_len = uid.len() + 2;
        if body.len() == self.prefix.len() + quoted_len + self.suffix.len()
            && body.starts_with(&self.prefix)
            && body.ends_with(&self.suffix)
            && body[self.prefix.len() + 1..self.prefix.len() + 1 + uid.len()] == *uid.as_bytes()
        {
            return Outcome::Exact;
        }
        let Ok(answer) = serde_json::from_slice::<Value>(body) else {
            return Outcome::Wrong("not JSON".to_owned());
        };
        let response = &answer["response"];
        if response["allowed"] != true {
            return Outcome::Wrong(format!("not allowed: {}", response["status"]));
        }
        if response["uid"] != uid {
            return Outcome::Wrong(format!("uid {} for {uid}", response["uid"]));
        }
        match patched_stamp(&answer) {
            Some(stamp) if stamp == self.stamp => Outcome::Equivalent,
            Some(stamp) => Outcome::Wrong(format!("stamp {stamp}, expected {}", self.stamp)),
            None => Outcome::Wrong("no stamp patch".to_owned()),
        }
    }
}

/// The stamp an answer's patch sets, if it has one; nothing on anything malformed.
fn patched_stamp(answer: &Value) -> Option<String> {
    let patch = answer["response"]["patch"].as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .ok()?;
    let ops: Value = serde_json::from_slice(&bytes).ok()?;
    ops.as_array()?.iter().find_map(|op| {
        (op["path"].as_str()?.ends_with("confighash.dev~1checksum"))
            .then(|| op["value"].as_str().map(str::to_owned))
            .flatten()
    })
}

/// Counts of outcomes.
#[derive(Debug, Default, Clone)]
struct Tally {
    exact: u64,
    equivalent: u64,
    wrong: u64,
    failed: u64,
    unanswered: u64,
    /// The first wrong answer and the first failure, to show.
    first_wrong: Option<String>,
    first_failure: Option<String>,
    /// Failed exchanges by what they came to, at most [`MAX_FAILURE_KINDS`] kinds.
    failure_kinds: BTreeMap<String, u64>,
}

impl Tally {
    fn add(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Exact => self.exact += 1,
            Outcome::Equivalent => self.equivalent += 1,
            Outcome::Wrong(why) => {
                self.wrong += 1;
                self.first_wrong.get_or_insert(why);
            }
            Outcome::Failed(why) => {
                self.failed += 1;
                let known = self.failure_kinds.len() < MAX_FAILURE_KINDS
                    || self.failure_kinds.contains_key(&why);
                let kind = if known {
                    why.clone()
                } else {
                    "other".to_owned()
                };
                *self.failure_kinds.entry(kind).or_default() += 1;
                self.first_failure.get_or_insert(why);
            }
            Outcome::Unanswered => self.unanswered += 1,
        }
    }

    fn merge(&mut self, other: Tally) {
        self.exact += other.exact;
        self.equivalent += other.equivalent;
        self.wrong += other.wrong;
        self.failed += other.failed;
        self.unanswered += other.unanswered;
        if self.first_wrong.is_none() {
            self.first_wrong = other.first_wrong;
        }
        if self.first_failure.is_none() {
            self.first_failure = other.first_failure;
        }
        for (kind, n) in other.failure_kinds {
            *self.failure_kinds.entry(kind).or_default() += n;
        }
    }

    fn right(&self) -> u64 {
        self.exact + self.equivalent
    }

    fn all(&self) -> u64 {
        self.right() + self.wrong + self.failed + self.unanswered
    }
}

// ---------------------------------------------------------------------------------------------
// Load

/// A server under test, as the client sees it.
struct Target {
    name: &'static str,
    pid: u32,
    url: String,
    clients: Vec<HttpsClient>,
    /// The responder, for confighash: its CPU and GET count go with this server's figures.
    responder: Option<(u32, SocketAddr)>,
}

/// Uids are never reused within a run.
static NEXT_UID: AtomicU64 = AtomicU64::new(1);

fn take_uids(n: u64) -> u64 {
    NEXT_UID.fetch_add(n, Ordering::Relaxed)
}

/// `reviews` reviews from [`SENDERS`] senders, each sending the next as soon as its last was
/// answered.
async fn closed_loop(
    target: &Target,
    review: &Arc<Review>,
    expected: &Arc<Expected>,
    reviews: u64,
) -> Tally {
    let first = take_uids(reviews);
    let next = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..SENDERS)
        .map(|_| {
            let (next, review, expected) = (next.clone(), review.clone(), expected.clone());
            let clients = target.clients.clone();
            let url = target.url.clone();
            tokio::spawn(async move {
                let mut tally = Tally::default();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= reviews {
                        break;
                    }
                    let (body, uid) = review.with_uid(first + i);
                    let client = &clients[i as usize % clients.len()];
                    let reply = client.post(&url, body).await;
                    tally.add(expected.outcome(reply, &uid));
                }
                tally
            })
        })
        .collect();
    let mut tally = Tally::default();
    for task in tasks {
        tally.merge(task.await.expect("a sender"));
    }
    tally
}

/// What an open loop measured.
struct Open {
    scheduled: u64,
    tally: Tally,
    /// Scheduled time to the end of the reply, right answers only, sorted.
    latencies: Vec<Duration>,
    /// Scheduled time to the send being spawned, sorted: the client's own lateness.
    lags: Vec<Duration>,
    /// Each second of the schedule: its p99 (right answers) and its exchanges that were not
    /// right.
    seconds: Vec<(Duration, u64)>,
}

impl Open {
    /// The seconds of the schedule whose p99 reached `limit` or that had an exchange that was
    /// not right: "s3 p99 160 ms, 81 not right".
    fn slow_seconds(&self, limit: Duration) -> Vec<String> {
        self.seconds
            .iter()
            .enumerate()
            .filter(|(_, (p99, bad))| *p99 >= limit || *bad > 0)
            .map(|(s, (p99, bad))| {
                let mut text = format!("s{s} p99 {} ms", ms(*p99));
                if *bad > 0 {
                    text += &format!(", {bad} not right");
                }
                text
            })
            .collect()
    }
}

/// `rate` reviews/s for `duration`, each spawned at its scheduled time by a blocking thread
/// (`std::thread::sleep` keeps the schedule to tens of microseconds, tokio's timer to 1 ms), never
/// waiting for earlier replies.
async fn open_loop(
    target: &Target,
    review: &Arc<Review>,
    expected: &Arc<Expected>,
    rate: u32,
    duration: Duration,
) -> Open {
    let count = (f64::from(rate) * duration.as_secs_f64()).round() as u64;
    let first = take_uids(count);
    let runtime = tokio::runtime::Handle::current();
    let (clients, url) = (target.clients.clone(), target.url.clone());
    let (review, expected) = (review.clone(), expected.clone());
    let (tasks, mut lags) = tokio::task::spawn_blocking(move || {
        let start = Instant::now() + Duration::from_millis(5);
        let mut tasks = Vec::with_capacity(count as usize);
        let mut lags = Vec::with_capacity(count as usize);
        for i in 0..count {
            let at = start + Duration::from_secs_f64(i as f64 / f64::from(rate));
            let now = Instant::now();
            if at > now {
                std::thread::sleep(at - now);
            }
            lags.push(Instant::now().saturating_duration_since(at));
            let client = clients[i as usize % clients.len()].clone();
            let (url, review, expected) = (url.clone(), review.clone(), expected.clone());
            tasks.push(runtime.spawn(async move {
                let (body, uid) = review.with_uid(first + i);
                let reply = client.post(&url, body).await;
                let latency = at.elapsed();
                (latency, expected.outcome(reply, &uid))
            }));
        }
        (tasks, lags)
    })
    .await
    .expect("the sender thread");
    let mut tally = Tally::default();
    let mut latencies = Vec::with_capacity(tasks.len());
    let per_second = u64::from(rate).max(1);
    let mut seconds: Vec<(Vec<Duration>, u64)> = Vec::new();
    // Every exchange is bounded by the client's own 10 s timeout.
    for (i, task) in tasks.into_iter().enumerate() {
        let (latency, outcome) = task.await.expect("a send");
        let second = (i as u64 / per_second) as usize;
        if seconds.len() <= second {
            seconds.resize_with(second + 1, Default::default);
        }
        if matches!(outcome, Outcome::Exact | Outcome::Equivalent) {
            latencies.push(latency);
            seconds[second].0.push(latency);
        } else {
            seconds[second].1 += 1;
        }
        tally.add(outcome);
    }
    latencies.sort_unstable();
    lags.sort_unstable();
    let seconds = seconds
        .into_iter()
        .map(|(mut l, bad)| {
            l.sort_unstable();
            (percentile(&l, 99.0), bad)
        })
        .collect();
    Open {
        scheduled: count,
        tally,
        latencies,
        lags,
        seconds,
    }
}

/// CPU times, GET count and machine counters at one instant.
struct Snapshot {
    at: Instant,
    server: Duration,
    responder: Duration,
    client: Duration,
    gets: u64,
    machine: (u64, u64),
    steal: (u64, u64),
    /// Every process's CPU, and this run's processes' (the helpers, serve, this one).
    all: Duration,
    ours: Duration,
}

async fn snapshot(target: &Target, ours: &[u32]) -> Result<Snapshot, String> {
    let (responder, gets) = match target.responder {
        Some((pid, addr)) => {
            let (c, s, _) = responder_counts(addr).await?;
            (serve::process_cpu(pid), c + s)
        }
        None => (Duration::ZERO, 0),
    };
    Ok(Snapshot {
        at: Instant::now(),
        server: serve::process_cpu(target.pid),
        responder,
        client: serve::process_cpu(std::process::id()),
        gets,
        machine: serve::machine_cpu(),
        steal: serve::machine_steal(),
        all: serve::all_processes_cpu(),
        ours: ours.iter().map(|&pid| serve::process_cpu(pid)).sum(),
    })
}

/// One measured phase.
struct Phase {
    round: usize,
    server: &'static str,
    /// Reviews answered right (the denominator of every "per review").
    answered: u64,
    tally: Tally,
    elapsed: Duration,
    server_cpu: Duration,
    responder_cpu: Duration,
    client_cpu: Duration,
    gets: u64,
    /// Busy share of all cores: from /proc/stat, and from every process's CPU.
    busy: f64,
    all_busy: f64,
    /// The share of all cores other processes than this run's used.
    others: f64,
    /// The share of all cores' time the host took (steal).
    steal: f64,
    load: String,
    /// Open loops only.
    open: Option<Open>,
}

impl Phase {
    fn measured(
        round: usize,
        target: &Target,
        tally: Tally,
        before: &Snapshot,
        after: &Snapshot,
        open: Option<Open>,
    ) -> Self {
        Phase {
            round,
            server: target.name,
            answered: tally.right(),
            tally,
            elapsed: after.at - before.at,
            server_cpu: after.server.saturating_sub(before.server),
            responder_cpu: after.responder.saturating_sub(before.responder),
            client_cpu: after.client.saturating_sub(before.client),
            gets: after.gets.saturating_sub(before.gets),
            busy: serve::busy_share(before.machine, after.machine),
            steal: serve::busy_share(before.steal, after.steal),
            all_busy: share(after.all.saturating_sub(before.all), after.at - before.at),
            others: share(
                after
                    .all
                    .saturating_sub(before.all)
                    .saturating_sub(after.ours.saturating_sub(before.ours)),
                after.at - before.at,
            ),
            load: serve::load_average(),
            open,
        }
    }

    fn per_review(&self, d: Duration) -> f64 {
        d.as_secs_f64() * 1000.0 / self.answered.max(1) as f64
    }

    fn server_ms(&self) -> f64 {
        self.per_review(self.server_cpu)
    }

    fn gets_per_review(&self) -> f64 {
        self.gets as f64 / self.answered.max(1) as f64
    }

    fn p(&self, pct: f64) -> Duration {
        self.open
            .as_ref()
            .map_or(Duration::ZERO, |o| percentile(&o.latencies, pct))
    }
}

/// `cpu` as a share of all cores over `wall`.
fn share(cpu: Duration, wall: Duration) -> f64 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cpu.as_secs_f64() / (wall.as_secs_f64() * cores as f64).max(1e-9)
}

/// "95 % / 97 % / 3 % / 0 %": busy by /proc/stat, by every process's CPU, others' share, and
/// steal.
fn machine(p: &Phase) -> String {
    format!(
        "{:.0} % / {:.0} % / {:.0} % / {:.0} %",
        p.busy * 100.0,
        p.all_busy * 100.0,
        p.others * 100.0,
        p.steal * 100.0
    )
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    // Nearest rank.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

/// The protocol a fresh TLS connection to `addr` negotiates when offered `h2` and `http/1.1`.
async fn negotiated_alpn(addr: SocketAddr, ca_pem: &str) -> Result<String, String> {
    let config = confighash_testkit::apiserver::https::client_config(ca_pem, &[b"h2", b"http/1.1"]);
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from(SERVER_NAME).map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS handshake: {e}"))?;
    Ok(tls.get_ref().1.alpn_protocol().map_or_else(
        || "none".to_owned(),
        |p| String::from_utf8_lossy(p).into_owned(),
    ))
}

// ---------------------------------------------------------------------------------------------
// The run

/// What the run found that fails it.
struct Failures(Vec<String>);

async fn run(mode: Mode, options: Options) -> Result<Failures, String> {
    let started = Instant::now();
    let mut failures = Vec::new();
    // The binary first: building it may take minutes, and nothing should run meanwhile.
    let (binary, how) = match (&options.binary, mode) {
        (Some(path), _) => (
            path.clone(),
            "CONFIGHASH_LOOKUP_COST_BINARY, not built".to_owned(),
        ),
        (None, Mode::Smoke) => (
            PathBuf::from(env!("CARGO_BIN_EXE_confighash")),
            "built by cargo for this target's profile".to_owned(),
        ),
        (None, Mode::Full) => tokio::task::spawn_blocking(|| {
            serve::release_binary(None, "CONFIGHASH_LOOKUP_COST_BINARY")
        })
        .await
        .expect("the build")?,
    };

    // The review and the answer both servers must give.
    fixture::check_references();
    let review = fixture::review(&fixture::stale_stamp());
    let review_len = review.body.len();
    let webhook = Webhook::new(
        Arc::new(fixture::MemorySource::new()),
        Arc::new(KeyStore::new(
            StampKey::new(fixture::KEY.to_vec()).expect("a long enough key"),
        )),
        Arc::new(Metrics::new()),
    );
    let mut answer = webhook
        .answer(&review.body)
        .await
        .map_err(|e| format!("Webhook::answer: {e:?}"))?;
    if answer["response"]["allowed"] != true {
        return Err(format!(
            "Webhook::answer does not allow the review: {answer}"
        ));
    }
    let stamp = patched_stamp(&answer).ok_or("Webhook::answer sets no stamp")?;
    answer["response"]["uid"] = Value::from(UID_MARK);
    let template = serde_json::to_vec(&answer).map_err(|e| e.to_string())?;
    let (prefix, suffix) = split_template(&template).ok_or("no uid in the answer")?;
    let expected = Arc::new(Expected {
        prefix,
        suffix,
        stamp,
    });
    let review = Arc::new(Review::new(review.body));

    // The processes.
    let ca = TestCa::new("lookup_cost CA");
    let logs = tempfile::tempdir().map_err(|e| e.to_string())?;
    let responder = Helper::start("responder", &[], &logs.path().join("responder.log"))?;
    let files = Files::write(
        "lookup-cost",
        &serve::kubeconfig(&format!("http://{}", responder.addr), TOKEN, OWN_NAMESPACE),
        &ca,
        fixture::KEY,
    );
    let reply_path = files.dir.join("bare-reply.json");
    std::fs::write(&reply_path, &template).map_err(|e| e.to_string())?;
    let bare_files = [
        (BARE_CERT_VAR, files.cert.as_os_str()),
        (BARE_KEY_VAR, files.key.as_os_str()),
        (BARE_REPLY_VAR, reply_path.as_os_str()),
    ];
    let bare = Helper::start("bare", &bare_files, &logs.path().join("bare.log"))?;
    let responder_addr = responder.addr.to_string();
    let mut gets_env = bare_files.to_vec();
    gets_env.push((BARE_GETS_VAR, OsStr::new(&responder_addr)));
    let bare_gets = Helper::start("bare", &gets_env, &logs.path().join("bare-gets.log"))?;
    let serve = Serve::start(&binary, &files, &options.serve_args, "lookup-cost").await?;
    let startup = responder_requests(responder.addr).await;
    let ours = [
        responder.pid,
        bare.pid,
        bare_gets.pid,
        serve.pid,
        std::process::id(),
    ];

    println!(
        "lookup_cost{}: binary {} ({how}; modified {})",
        if mode == Mode::Smoke { " (smoke)" } else { "" },
        binary.display(),
        serve::modified_ago(&binary)
    );
    println!(
        "review: UPDATE of a Deployment in {}, {review_len} bytes, {} references (stale stamp: \
         the answer carries a patch); {SENDERS} closed-loop senders, {CONNECTIONS} HTTPS clients \
         per server; closed loop {} reviews, open loop {}/s for {:.0} s, {} round(s); machine: \
         {} cores, load average {}",
        fixture::NAMESPACE,
        fixture::REFERENCES,
        options.reviews,
        options.rate,
        options.duration.as_secs_f64(),
        options.rounds,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        serve::load_average()
    );
    println!(
        "processes: responder pid {} on {}, bare pid {} on {}, bare+gets pid {} on {}, serve \
         pid {} on {} (admin {}); serve arguments: --listen, --admin-listen, --tls-cert, \
         --tls-key, --key-file, --leader-elect false{}",
        responder.pid,
        responder.addr,
        bare.pid,
        bare.addr,
        bare_gets.pid,
        bare_gets.addr,
        serve.pid,
        serve.webhook,
        serve.admin,
        if options.serve_args.is_empty() {
            String::new()
        } else {
            format!(", {}", options.serve_args.join(" "))
        }
    );
    println!("requests serve made at startup (until ready and synced), besides lookups:");
    for (request, n) in &startup {
        println!("  {n:>3} {request}");
    }

    let connect = |port: u16| -> (String, Vec<HttpsClient>) {
        (
            format!("https://127.0.0.1:{port}/mutate"),
            (0..CONNECTIONS)
                .map(|_| HttpsClient::new(&ca.pem))
                .collect(),
        )
    };
    let target = |name, pid, addr: SocketAddr, reads: bool| {
        let (url, clients) = connect(addr.port());
        Target {
            name,
            pid,
            url,
            clients,
            responder: reads.then_some((responder.pid, responder.addr)),
        }
    };
    // confighash right after the bare server, and the fair baseline last: at 1,000/s the
    // baseline runs the machine to its limit, and what it leaves behind (the responder's
    // connections, a loaded run queue) should fall on no one's phase but its own.
    let targets = [
        target(BARE, bare.pid, bare.addr, false),
        target(CONFIGHASH, serve.pid, serve.webhook, true),
        target(BARE_GETS, bare_gets.pid, bare_gets.addr, true),
    ];

    // Checks: the protocol, one review each, its GETs.
    for (target, addr) in targets
        .iter()
        .zip([bare.addr, serve.webhook, bare_gets.addr])
    {
        let alpn = negotiated_alpn(addr, &ca.pem).await?;
        if alpn != "h2" {
            failures.push(format!("{} negotiated {alpn}, not h2", target.name));
        }
        let before = snapshot(target, &ours).await?;
        let tally = closed_loop(target, &review, &expected, 1).await;
        let after = snapshot(target, &ours).await?;
        if tally.right() != 1 {
            return Err(format!(
                "{}'s first answer: {:?}",
                target.name,
                tally.first_wrong.or(tally.first_failure)
            ));
        }
        println!(
            "check {}: ALPN {alpn}, first answer {} the expected bytes{}",
            target.name,
            if tally.exact == 1 { "is" } else { "is NOT" },
            if target.responder.is_some() {
                format!(", {} GETs", after.gets - before.gets)
            } else {
                String::new()
            }
        );
    }

    // Warm-up.
    for target in &targets {
        let tally = closed_loop(target, &review, &expected, options.warm_up).await;
        if tally.wrong > 0 {
            failures.push(format!(
                "{} warm-up: {} wrong answers, first: {:?}",
                target.name, tally.wrong, tally.first_wrong
            ));
        }
    }

    // The rounds.
    let mut closed: Vec<Phase> = Vec::new();
    let mut open: Vec<Phase> = Vec::new();
    let (run_machine, run_steal) = (serve::machine_cpu(), serve::machine_steal());
    let run_started = Instant::now();
    let ours_cpu = || -> Duration { ours.iter().map(|&pid| serve::process_cpu(pid)).sum() };
    let (run_all, run_ours) = (serve::all_processes_cpu(), ours_cpu());
    let run_load = serve::load_average();
    for round in 1..=options.rounds {
        for target in &targets {
            let before = snapshot(target, &ours).await?;
            let tally = closed_loop(target, &review, &expected, options.reviews).await;
            let after = snapshot(target, &ours).await?;
            let phase = Phase::measured(round, target, tally, &before, &after, None);
            println!(
                "round {round} closed {:<10} {} right, {} wrong, {} failed in {:.2} s: {:.0}/s, \
                 {:.3} ms CPU/review, {:.2} GETs/review, machine busy {}",
                target.name,
                phase.answered,
                phase.tally.wrong,
                phase.tally.failed + phase.tally.unanswered,
                phase.elapsed.as_secs_f64(),
                phase.answered as f64 / phase.elapsed.as_secs_f64(),
                phase.server_ms(),
                phase.gets_per_review(),
                machine(&phase)
            );
            closed.push(phase);
        }
        for target in &targets {
            let before = snapshot(target, &ours).await?;
            let result =
                open_loop(target, &review, &expected, options.rate, options.duration).await;
            let after = snapshot(target, &ours).await?;
            let tally = result.tally.clone();
            let phase = Phase::measured(round, target, tally, &before, &after, Some(result));
            println!(
                "round {round} open   {:<10} {} right, {} wrong, {} failed, {} unanswered: p50 \
                 {} ms, p99 {} ms, {:.3} ms CPU/review, machine busy {}",
                target.name,
                phase.answered,
                phase.tally.wrong,
                phase.tally.failed,
                phase.tally.unanswered,
                ms(phase.p(50.0)),
                ms(phase.p(99.0)),
                phase.server_ms(),
                machine(&phase)
            );
            open.push(phase);
        }
    }
    let run_busy = serve::busy_share(run_machine, serve::machine_cpu());
    let run_steal = serve::busy_share(run_steal, serve::machine_steal());
    let run_wall = run_started.elapsed();
    let run_all = serve::all_processes_cpu().saturating_sub(run_all);
    let run_others = run_all.saturating_sub(ours_cpu().saturating_sub(run_ours));
    let later = responder_requests(responder.addr).await;
    let lookups = serve.lookups().await;
    let (log_lines, log_warnings) = serve.log_counts();
    drop(serve);
    drop(bare);
    drop(bare_gets);
    drop(responder);

    report(mode, &options, &closed, &open);
    report_fair(mode, &options, &closed, &open);
    println!();
    let failed: Vec<String> = closed
        .iter()
        .chain(&open)
        .filter(|p| !p.tally.failure_kinds.is_empty())
        .map(|p| {
            let kinds: Vec<String> = p
                .tally
                .failure_kinds
                .iter()
                .map(|(kind, n)| format!("{n} {kind}"))
                .collect();
            format!(
                "round {} {} {}: {}",
                p.round,
                if p.open.is_some() { "open" } else { "closed" },
                p.server,
                kinds.join("; ")
            )
        })
        .collect();
    let slow: Vec<String> = open
        .iter()
        .filter_map(|p| {
            let seconds = p.open.as_ref()?.slow_seconds(TARGET_P99);
            (!seconds.is_empty())
                .then(|| format!("round {} {}: {}", p.round, p.server, seconds.join("; ")))
        })
        .collect();
    println!(
        "open-loop seconds with p99 >= {} ms or an exchange not right: {}",
        TARGET_P99.as_millis(),
        if slow.is_empty() {
            "none".to_owned()
        } else {
            slow.join(" | ")
        }
    );
    println!(
        "failed exchanges: {}",
        if failed.is_empty() {
            "none".to_owned()
        } else {
            failed.join(" | ")
        }
    );
    let mut new_requests: Vec<String> = later
        .iter()
        .filter(|(request, n)| startup.get(*request) != Some(n))
        .map(|(request, n)| format!("{request} ({n} in all)"))
        .collect();
    if new_requests.is_empty() {
        new_requests.push("none".to_owned());
    }
    println!(
        "requests the responder answered after startup, other than lookups: {}",
        new_requests.join("; ")
    );
    println!(
        "serve's lookups by outcome: {}; serve logged {log_lines} lines, {log_warnings} at \
         WARN/ERROR",
        lookups
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "machine over the rounds: {:.0} % of all cores busy by /proc/stat, {:.0} % by every \
         process's CPU, of which {:.0} % by processes outside this run; {:.1} % stolen by the \
         host; load average {} at the start of the rounds, {} at the end; total {:.1} s",
        run_busy * 100.0,
        share(run_all, run_wall) * 100.0,
        share(run_others, run_wall) * 100.0,
        run_steal * 100.0,
        run_load,
        serve::load_average(),
        started.elapsed().as_secs_f64()
    );

    for phase in closed.iter().chain(&open) {
        let kind = if phase.open.is_some() {
            "open"
        } else {
            "closed"
        };
        if phase.tally.wrong > 0 {
            failures.push(format!(
                "round {} {kind} {}: {} wrong answers, first: {}",
                phase.round,
                phase.server,
                phase.tally.wrong,
                phase.tally.first_wrong.as_deref().unwrap_or("?")
            ));
        }
        if mode == Mode::Smoke {
            if phase.tally.failed + phase.tally.unanswered > 0 {
                failures.push(format!(
                    "round {} {kind} {}: {} failed, {} unanswered, first: {}",
                    phase.round,
                    phase.server,
                    phase.tally.failed,
                    phase.tally.unanswered,
                    phase.tally.first_failure.as_deref().unwrap_or("?")
                ));
            }
            if phase.server != BARE && phase.gets != fixture::REFERENCES as u64 * phase.tally.all()
            {
                failures.push(format!(
                    "round {} {kind} {}: {} GETs for {} reviews, not {} each",
                    phase.round,
                    phase.server,
                    phase.gets,
                    phase.tally.all(),
                    fixture::REFERENCES
                ));
            }
        }
    }
    Ok(Failures(failures))
}

fn report(mode: Mode, options: &Options, closed: &[Phase], open: &[Phase]) {
    let verdict = |met: bool| match (mode, met) {
        (Mode::Smoke, _) => "not judged (smoke run: debug builds)",
        (Mode::Full, true) => "met",
        (Mode::Full, false) => "NOT met",
    };
    let cpu = |p: &Phase, d: Duration| format!("{:.3}", p.per_review(d));
    println!();
    println!(
        "Closed loop: {} reviews from {SENDERS} senders; CPU per review from /proc/<pid>/stat \
         (utime + stime)",
        options.reviews
    );
    println!(
        "| round | server | right (exact bytes) | wrong | failed / unanswered | s | reviews/s | server CPU ms/review | responder CPU ms/review | GETs/review | client CPU ms/review | machine busy: /proc/stat / all processes / others / steal | load avg |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for p in closed {
        println!(
            "| {} | {} | {} ({}) | {} | {} / {} | {:.2} | {:.0} | {} | {} | {} | {} | {} | {} |",
            p.round,
            p.server,
            p.answered,
            p.tally.exact,
            p.tally.wrong,
            p.tally.failed,
            p.tally.unanswered,
            p.elapsed.as_secs_f64(),
            p.answered as f64 / p.elapsed.as_secs_f64(),
            cpu(p, p.server_cpu),
            if p.server != BARE {
                cpu(p, p.responder_cpu)
            } else {
                "-".to_owned()
            },
            if p.server != BARE {
                format!("{:.2}", p.gets_per_review())
            } else {
                "-".to_owned()
            },
            cpu(p, p.client_cpu),
            machine(p),
            p.load
        );
    }
    println!();
    println!(
        "Open loop: {}/s for {:.0} s, each send spawned at its scheduled time; latency from the \
         scheduled time to the end of the reply (ms)",
        options.rate,
        options.duration.as_secs_f64()
    );
    println!(
        "| round | server | scheduled | right | wrong | failed | unanswered | p50 | p90 | p99 | max | sender lag p99 | server CPU ms/review | responder CPU ms/review | GETs/review | machine busy: /proc/stat / all processes / others / steal | load avg |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for p in open {
        let lag = p
            .open
            .as_ref()
            .map_or(Duration::ZERO, |o| percentile(&o.lags, 99.0));
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            p.round,
            p.server,
            p.open.as_ref().map_or(0, |o| o.scheduled),
            p.answered,
            p.tally.wrong,
            p.tally.failed,
            p.tally.unanswered,
            ms(p.p(50.0)),
            ms(p.p(90.0)),
            ms(p.p(99.0)),
            ms(p.p(100.0)),
            ms(lag),
            cpu(p, p.server_cpu),
            if p.server != BARE {
                cpu(p, p.responder_cpu)
            } else {
                "-".to_owned()
            },
            if p.server != BARE {
                format!("{:.2}", p.gets_per_review())
            } else {
                "-".to_owned()
            },
            machine(p),
            p.load
        );
    }

    println!();
    println!("CPU per review, confighash / bare (the headline: the closed loops)");
    println!(
        "| round | closed: bare ms | confighash ms | **ratio** | (confighash + responder) / bare | open: bare ms | confighash ms | ratio | open-loop p99 bare / confighash (ms) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut columns: [Vec<f64>; 9] = Default::default();
    for round in 1..=options.rounds {
        let (Some((cb, cc)), Some((ob, oc))) = (pair(closed, round), pair(open, round)) else {
            continue;
        };
        let values = [
            cb.server_ms(),
            cc.server_ms(),
            cc.server_ms() / cb.server_ms(),
            (cc.server_ms() + cc.per_review(cc.responder_cpu)) / cb.server_ms(),
            ob.server_ms(),
            oc.server_ms(),
            oc.server_ms() / ob.server_ms(),
            ob.p(99.0).as_secs_f64() * 1000.0,
            oc.p(99.0).as_secs_f64() * 1000.0,
        ];
        for (column, v) in columns.iter_mut().zip(values) {
            column.push(v);
        }
        println!("{}", ratio_row(&round.to_string(), &values));
    }
    let medians: Vec<f64> = columns.iter().map(|c| median(c.clone())).collect();
    let medians: [f64; 9] = medians.try_into().unwrap_or([f64::NAN; 9]);
    println!("{}", ratio_row("median", &medians));
    println!();
    let ratio = medians[2];
    let p99 = medians[8];
    let open_failed: u64 = open
        .iter()
        .filter(|p| p.server == CONFIGHASH)
        .map(|p| p.tally.failed + p.tally.unanswered + p.tally.wrong)
        .sum();
    println!(
        "RESULT: confighash CPU per review / bare's: median {ratio:.2}x (rounds {}); target ≤ \
         {TARGET_RATIO}x: {}",
        columns[2]
            .iter()
            .map(|r| format!("{r:.2}x"))
            .collect::<Vec<_>>()
            .join(", "),
        verdict(ratio <= TARGET_RATIO)
    );
    println!(
        "RESULT: confighash open-loop p99 at {}/s: median {p99:.2} ms (rounds {}), {open_failed} \
         failed, unanswered or wrong; target < {} ms with none failed: {}",
        options.rate,
        columns[8]
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(", "),
        TARGET_P99.as_millis(),
        verdict(p99 < TARGET_P99.as_secs_f64() * 1000.0 && open_failed == 0)
    );
}

/// Round `round`'s bare and confighash phases.
fn pair(phases: &[Phase], round: usize) -> Option<(&Phase, &Phase)> {
    pair_of(phases, round, BARE)
}

/// Round `round`'s phases of `baseline` and of confighash.
fn pair_of<'a>(
    phases: &'a [Phase],
    round: usize,
    baseline: &str,
) -> Option<(&'a Phase, &'a Phase)> {
    let find = |name: &str| phases.iter().find(|p| p.round == round && p.server == name);
    Some((find(baseline)?, find(CONFIGHASH)?))
}

/// confighash against the fair baseline, per round and the medians: CPU per review in the
/// closed and the open loops, the open loops' p50 and p99, each baseline / confighash / ratio;
/// the verdict on each against [`TARGET_FAIR_RATIO`].
fn report_fair(mode: Mode, options: &Options, closed: &[Phase], open: &[Phase]) {
    println!();
    println!(
        "confighash / {BARE_GETS}, the fair baseline: the bare server that also reads the 10 \
         objects from the same responder, all at once, through hyper's pooled client"
    );
    println!(
        "| round | closed CPU ms/review: {BARE_GETS} / confighash | **ratio** | open CPU ms/review | \
         **ratio** | open p50 ms | **ratio** | open p99 ms | **ratio** |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut ratios: [Vec<f64>; 4] = Default::default();
    let mut values: [Vec<f64>; 8] = Default::default();
    for round in 1..=options.rounds {
        let (Some((cb, cc)), Some((ob, oc))) = (
            pair_of(closed, round, BARE_GETS),
            pair_of(open, round, BARE_GETS),
        ) else {
            continue;
        };
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let row = [
            cb.server_ms(),
            cc.server_ms(),
            ob.server_ms(),
            oc.server_ms(),
            ms(ob.p(50.0)),
            ms(oc.p(50.0)),
            ms(ob.p(99.0)),
            ms(oc.p(99.0)),
        ];
        for (column, v) in values.iter_mut().zip(row) {
            column.push(v);
        }
        for (i, column) in ratios.iter_mut().enumerate() {
            column.push(row[2 * i + 1] / row[2 * i]);
        }
        println!("{}", fair_row(&round.to_string(), &row));
    }
    let medians =
        |columns: &[Vec<f64>]| -> Vec<f64> { columns.iter().map(|c| median(c.clone())).collect() };
    let (value_medians, ratio_medians) = (medians(&values), medians(&ratios));
    if let Ok(row) = <[f64; 8]>::try_from(value_medians) {
        println!("{}", fair_row("median of the values", &row));
    }
    println!(
        "| median of the ratios | | **{:.2}x** | | **{:.2}x** | | **{:.2}x** | | **{:.2}x** |",
        ratio_medians[0], ratio_medians[1], ratio_medians[2], ratio_medians[3]
    );
    println!();
    let verdict = |r: f64| match mode {
        Mode::Smoke => "not judged (smoke run: debug builds)",
        Mode::Full if r <= TARGET_FAIR_RATIO => "met",
        Mode::Full => "NOT met",
    };
    for (i, what) in [
        "CPU per review, closed loop",
        "CPU per review, open loop",
        "open-loop p50",
        "open-loop p99",
    ]
    .iter()
    .enumerate()
    {
        println!(
            "RESULT: confighash / {BARE_GETS}, {what}: median {:.2}x (rounds {}); target ≤ \
             {TARGET_FAIR_RATIO}x: {}",
            ratio_medians[i],
            ratios[i]
                .iter()
                .map(|r| format!("{r:.2}x"))
                .collect::<Vec<_>>()
                .join(", "),
            verdict(ratio_medians[i])
        );
    }
}

fn fair_row(label: &str, v: &[f64; 8]) -> String {
    format!(
        "| {label} | {:.3} / {:.3} | **{:.2}x** | {:.3} / {:.3} | **{:.2}x** | {:.2} / {:.2} | \
         **{:.2}x** | {:.2} / {:.2} | **{:.2}x** |",
        v[0],
        v[1],
        v[1] / v[0],
        v[2],
        v[3],
        v[3] / v[2],
        v[4],
        v[5],
        v[5] / v[4],
        v[6],
        v[7],
        v[7] / v[6]
    )
}

fn ratio_row(label: &str, v: &[f64; 9]) -> String {
    format!(
        "| {label} | {:.3} | {:.3} | **{:.2}x** | {:.2}x | {:.3} | {:.3} | {:.2}x | {:.2} / {:.2} |",
        v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8]
    )
}

fn main() {
    // A helper process: its role, nothing else.
    if let Ok(role) = std::env::var(ROLE_VAR) {
        let result = match role.as_str() {
            "responder" => responder::main(),
            BARE => bare::main(),
            other => Err(format!("unknown role {other:?}")),
        };
        if let Err(e) = result {
            eprintln!("lookup_cost {role}: {e}");
            std::process::exit(1);
        }
        return;
    }
    let mode = mode::from_args();
    let options = match mode {
        Mode::Full => Options::from_env(),
        Mode::Smoke => Options::smoke(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    // Every process the run started is killed when `run` returns or unwinds.
    let result = runtime.block_on(run(mode, options));
    runtime.shutdown_timeout(Duration::from_secs(2));
    match result {
        Ok(Failures(failures)) if failures.is_empty() => {}
        Ok(Failures(failures)) => {
            for f in &failures {
                eprintln!("lookup_cost FAILED: {f}");
            }
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("lookup_cost FAILED: {e}");
            std::process::exit(1);
        }
    }
}

//! A small HTTPS admission webhook for tests, with its own CA.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use base64::Engine;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{Value, json};
use tokio_rustls::TlsAcceptor;

type Handler = dyn Fn(&Value) -> Value + Send + Sync;

/// A test CA that issues serving pairs, as cert-manager's CA issuer would.
pub struct TestCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    /// The CA certificate, PEM: what clients trust.
    pub pem: String,
}

/// A serving certificate and its key, issued by a [`TestCa`].
pub struct ServingPair {
    pub cert_pem: String,
    pub key_pem: String,
    /// The leaf certificate, DER: what a server presents.
    pub der: CertificateDer<'static>,
    key_der: Vec<u8>,
}

impl TestCa {
    /// A new self-signed CA named `common_name`.
    pub fn new(common_name: &str) -> Self {
        let key = rcgen::KeyPair::generate().expect("a CA key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        let cert = params.self_signed(&key).expect("a CA certificate");
        TestCa {
            pem: cert.pem(),
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// A serving pair for `names` (DNS names or IP addresses), valid for 30 days, with a new key.
    pub fn issue(&self, names: &[&str]) -> ServingPair {
        self.issue_until(
            names,
            std::time::SystemTime::now() + std::time::Duration::from_secs(30 * 86_400),
        )
    }

    /// A serving pair for `names` that expires at `not_after`, with a new key.
    pub fn issue_until(&self, names: &[&str], not_after: std::time::SystemTime) -> ServingPair {
        let key = rcgen::KeyPair::generate().expect("a serving key");
        let mut params = rcgen::CertificateParams::new(
            names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>(),
        )
        .expect("serving params");
        params.not_after = not_after.into();
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("a serving certificate");
        ServingPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
            key_der: key.serialize_der(),
        }
    }
}

/// A CA and a serving certificate for `127.0.0.1` and `localhost`.
pub struct TestCerts {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
    cert_der: CertificateDer<'static>,
    key_der: Vec<u8>,
}

impl TestCerts {
    pub fn generate() -> Self {
        let ca = TestCa::new("stand-in test CA");
        let pair = ca.issue(&["localhost", "127.0.0.1"]);
        TestCerts {
            ca_pem: ca.pem,
            cert_pem: pair.cert_pem,
            key_pem: pair.key_pem,
            cert_der: pair.der,
            key_der: pair.key_der,
        }
    }

    /// The CA as a MutatingWebhookConfiguration's `caBundle` wants it: base64 of the PEM.
    pub fn ca_bundle(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(&self.ca_pem)
    }
}

/// A running HTTPS webhook on 127.0.0.1 that answers `POST /mutate` with `handler`'s response.
pub struct TestWebhook {
    pub url: String,
    pub certs: TestCerts,
    calls: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestWebhook {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct HookState {
    handler: Box<Handler>,
    calls: Arc<AtomicUsize>,
    /// How long each answer waits before it is sent.
    delay: Duration,
}

impl TestWebhook {
    /// `handler` gets the AdmissionReview's `request` and returns the `response` fields besides
    /// `uid` (for example `{"allowed": true, "patchType": "JSONPatch", "patch": ...}`).
    pub async fn start(handler: impl Fn(&Value) -> Value + Send + Sync + 'static) -> Self {
        Self::start_delayed(handler, Duration::ZERO).await
    }

    /// A webhook that allows everything after `delay`: the API server's request waits that long
    /// in admission (up to the configuration's `timeoutSeconds`), holding its seat of API
    /// Priority and Fairness all the while.
    pub async fn delaying(delay: Duration) -> Self {
        Self::start_delayed(|_| json!({"allowed": true}), delay).await
    }

    /// As [`TestWebhook::start`], each answer sent `delay` after its request came.
    pub async fn start_delayed(
        handler: impl Fn(&Value) -> Value + Send + Sync + 'static,
        delay: Duration,
    ) -> Self {
        let certs = TestCerts::generate();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![certs.cert_der.clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certs.key_der.clone())),
            )
            .expect("a serving configuration");
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let url = format!(
            "https://127.0.0.1:{}/mutate",
            listener.local_addr().expect("address").port()
        );
        let calls = Arc::new(AtomicUsize::new(0));
        let state = Arc::new(HookState {
            handler: Box::new(handler),
            calls: calls.clone(),
            delay,
        });
        let app = Router::new()
            .route("/mutate", post(mutate))
            .with_state(state);
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                // As webhooks serve in production (confighash does): without it, an answer
                // written in two segments waits for the caller's delayed ACK, some 40 ms.
                let _ = tcp.set_nodelay(true);
                let acceptor = acceptor.clone();
                let app = app.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper_util::service::TowerToHyperService::new(app);
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        TestWebhook {
            url,
            certs,
            calls,
            task,
        }
    }

    /// A webhook that adds `key: value` to the pod template's annotations.
    pub async fn annotating(key: &'static str, value: &'static str) -> Self {
        Self::start(move |request| {
            let kind = request.pointer("/kind/kind").and_then(Value::as_str).unwrap_or("");
            let template = if kind == "CronJob" {
                "/spec/jobTemplate/spec/template"
            } else {
                "/spec/template"
            };
            let object = &request["object"];
            let mut ops = Vec::new();
            let meta = object.pointer(&format!("{template}/metadata"));
            if meta.is_none_or(Value::is_null) {
                ops.push(json!({"op": "add", "path": format!("{template}/metadata"), "value": {}}));
            }
            if meta.and_then(|m| m.get("annotations")).is_none_or(Value::is_null) {
                ops.push(json!({"op": "add", "path": format!("{template}/metadata/annotations"), "value": {}}));
            }
            let escaped = key.replace('~', "~0").replace('/', "~1");
            ops.push(json!({"op": "add", "path": format!("{template}/metadata/annotations/{escaped}"), "value": value}));
            let patch = base64::engine::general_purpose::STANDARD.encode(Value::Array(ops).to_string());
            json!({"allowed": true, "patchType": "JSONPatch", "patch": patch})
        })
        .await
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// A MutatingWebhookConfiguration for this webhook: CREATE and UPDATE of the workload kinds,
    /// in namespaces labelled `confighash.dev/enabled=true`.
    pub fn configuration(&self, name: &str, failure_policy: &str) -> Value {
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [{
                "name": "stamp.confighash.dev",
                "clientConfig": {"url": self.url, "caBundle": self.certs.ca_bundle()},
                "rules": [
                    {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                     "resources": ["deployments", "statefulsets", "daemonsets"]},
                    {"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                     "resources": ["cronjobs"]}
                ],
                "namespaceSelector": {"matchLabels": {"confighash.dev/enabled": "true"}},
                "failurePolicy": failure_policy,
                "sideEffects": "None",
                "timeoutSeconds": 5,
                "admissionReviewVersions": ["v1"]
            }]
        })
    }
}

async fn mutate(State(state): State<Arc<HookState>>, body: axum::Json<Value>) -> axum::Json<Value> {
    state.calls.fetch_add(1, Ordering::SeqCst);
    if !state.delay.is_zero() {
        tokio::time::sleep(state.delay).await;
    }
    let request = &body.0["request"];
    let mut response = (state.handler)(request);
    response["uid"] = request["uid"].clone();
    axum::Json(json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response
    }))
}

//! An in-process `confighash serve` (the webhook and the admin port, no watcher) on loopback,
//! and the raw clients the tests of the two ports' connection handling need. Shared by
//! `tests/webhook/admin_port.rs` and `tests/webhook/client_auth.rs`. Every wait polls towards a deadline.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::apiserver::TestCa;
use confighash::certs::key::KeyStore;
use confighash::core::checksum::StampKey;
use confighash::core::refs::ObjectRef;
use confighash::metrics::Metrics;
use confighash::serving::health::Health;
use confighash::serving::tls::{CertStore, ClientCaStore};
use confighash::webhook::admission::Webhook;
use confighash::webhook::budget::MemoryBudget;
use confighash::webhook::lookup::{Fetched, ObjectSource, ReadError};
use confighash::webhook::server::{
    self as serve, RunningWebhook, WebhookLimits, WebhookServeConfig,
};
use futures::future::BoxFuture;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long any one wait may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// Every referenced object is absent: the reviews need no API server.
struct NoObjects;

impl ObjectSource for NoObjects {
    fn fetch<'a>(
        &'a self,
        _namespace: &'a str,
        _object: &'a ObjectRef,
        _budget: &'a MemoryBudget,
    ) -> BoxFuture<'a, Result<Option<Fetched>, ReadError>> {
        Box::pin(async { Ok(None) })
    }
}

pub struct Server {
    pub running: RunningWebhook,
    /// The CA of the serving certificate: what clients trust.
    pub ca_pem: String,
    pub metrics: Arc<Metrics>,
    _dir: tempfile::TempDir,
}

/// Starts the webhook (serving certificate for `localhost` from a new CA) and the admin port
/// within `limits`, with `header_read_timeout` on the webhook port, requiring client
/// certificates signed by `client_ca` if given.
pub async fn start(
    limits: WebhookLimits,
    header_read_timeout: Duration,
    client_ca: Option<Arc<ClientCaStore>>,
) -> Server {
    start_polling(
        limits,
        header_read_timeout,
        client_ca,
        Duration::from_secs(60),
    )
    .await
}

/// [`start`], re-reading the certificate files and the client CA every `cert_poll`.
pub async fn start_polling(
    limits: WebhookLimits,
    header_read_timeout: Duration,
    client_ca: Option<Arc<ClientCaStore>>,
    cert_poll: Duration,
) -> Server {
    let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
    start_at(
        loopback,
        loopback,
        limits,
        header_read_timeout,
        client_ca,
        cert_poll,
    )
    .await
}

/// [`start_polling`], listening on these addresses.
pub async fn start_at(
    listen: SocketAddr,
    admin_listen: SocketAddr,
    limits: WebhookLimits,
    header_read_timeout: Duration,
    client_ca: Option<Arc<ClientCaStore>>,
    cert_poll: Duration,
) -> Server {
    let ca = TestCa::new("ports test CA");
    let pair = ca.issue(&["localhost", "127.0.0.1"]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tls.crt"), &pair.cert_pem).unwrap();
    std::fs::write(dir.path().join("tls.key"), &pair.key_pem).unwrap();
    let store = CertStore::load(dir.path().join("tls.crt"), dir.path().join("tls.key")).unwrap();
    let metrics = Arc::new(Metrics::new());
    let webhook = Arc::new(Webhook::new(
        Arc::new(NoObjects),
        Arc::new(KeyStore::new(
            StampKey::new(b"ports.rs: a key of 32 bytes!!!!!".to_vec()).unwrap(),
        )),
        metrics.clone(),
    ));
    let running = serve::start_with(
        WebhookServeConfig {
            listen,
            admin_listen,
            certs: store,
            client_ca,
            webhook,
            health: Arc::new(Health::default()),
            cert_poll,
            header_read_timeout,
            drain_timeout: Duration::from_secs(1),
        },
        limits,
    )
    .await
    .unwrap();
    Server {
        running,
        ca_pem: ca.pem,
        metrics,
        _dir: dir,
    }
}

impl Server {
    /// Polls until `count()` is `n`.
    pub async fn wait_for(&self, what: &str, n: usize, count: impl Fn(&RunningWebhook) -> usize) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let now = count(&self.running);
            if now == n {
                return;
            }
            assert!(Instant::now() < deadline, "expected {n} {what}, have {now}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Polls until the webhook port has `n` connections open.
    pub async fn wait_connections(&self, n: usize) {
        self.wait_for("webhook connections", n, |r: &RunningWebhook| {
            r.connections()
        })
        .await;
    }

    /// Polls until the admin port has `n` connections open.
    pub async fn wait_admin_connections(&self, n: usize) {
        self.wait_for("admin connections", n, |r: &RunningWebhook| {
            r.admin_connections()
        })
        .await;
    }
}

/// A rustls client configuration that trusts `ca_pem`, offers `alpn`, and presents
/// `client_cert` (certificate PEM, key PEM) if given.
pub fn client_config(
    ca_pem: &str,
    alpn: &[&[u8]],
    client_cert: Option<(&str, &str)>,
) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let mut config = match client_cert {
        Some((cert_pem, key_pem)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert_pem.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap(),
                PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// A TLS connection to `addr` (as `localhost`) with `config`: the handshake's result.
pub async fn tls(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    tokio_rustls::TlsConnector::from(config)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
}

/// A review of a Deployment that references nothing.
pub fn review(uid: &str) -> Vec<u8> {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
            "namespace": "shop",
            "name": "web",
            "operation": "CREATE",
            "object": {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "web", "namespace": "shop"},
                "spec": {"template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "web", "image": "nginx"}]}
                }}
            }
        }
    })
    .to_string()
    .into_bytes()
}

enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

/// One HTTP client connection (HTTP/2 if `h2`, else HTTP/1.1) over any stream; `task` drives it
/// and ends when the connection does.
pub struct Http {
    sender: Sender,
    pub task: JoinHandle<()>,
}

impl Http {
    pub async fn over<S>(io: S, h2: bool) -> Self
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let io = TokioIo::new(io);
        if h2 {
            let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .expect("an HTTP/2 connection");
            let task = tokio::spawn(async move {
                let _ = conn.await;
            });
            Http {
                sender: Sender::H2(sender),
                task,
            }
        } else {
            let (sender, conn) = hyper::client::conn::http1::handshake(io)
                .await
                .expect("an HTTP/1.1 connection");
            let task = tokio::spawn(async move {
                let _ = conn.await;
            });
            Http {
                sender: Sender::H1(sender),
                task,
            }
        }
    }

    /// Sends `method` `path` with `body`; the status and the body, or why there is none.
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        body: Vec<u8>,
    ) -> Result<(u16, Vec<u8>), String> {
        let request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let exchange = async {
            let response = match &mut self.sender {
                Sender::H1(s) => {
                    s.ready().await.map_err(|e| e.to_string())?;
                    s.send_request(request).await
                }
                Sender::H2(s) => {
                    s.ready().await.map_err(|e| e.to_string())?;
                    s.send_request(request).await
                }
            }
            .map_err(|e| e.to_string())?;
            let status = response.status().as_u16();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok((status, body.to_vec()))
        };
        tokio::time::timeout(DEADLINE, exchange)
            .await
            .map_err(|_| format!("no answer within {DEADLINE:?}"))?
    }

    /// POSTs a review to /mutate and checks that it is answered and allowed.
    pub async fn review(&mut self, uid: &str) {
        let (status, body) = self
            .send("POST", "/mutate", review(uid))
            .await
            .expect("an answer");
        let reply: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        assert_eq!(status, 200, "{reply}");
        assert_eq!(reply["response"]["uid"], uid, "{reply}");
        assert_eq!(reply["response"]["allowed"], true, "{reply}");
    }

    /// Polls until the connection has ended; how long that took.
    pub async fn wait_closed(&self) -> Duration {
        let started = Instant::now();
        while !self.task.is_finished() {
            assert!(
                started.elapsed() < DEADLINE,
                "the server never closed the connection"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        started.elapsed()
    }
}

/// Reads until the server closes the connection (end of stream or an error), within DEADLINE;
/// what it sent before.
pub async fn read_to_close(stream: &mut (impl AsyncRead + Unpin)) -> Vec<u8> {
    let mut seen = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match tokio::time::timeout(DEADLINE, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return seen,
            Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
            Err(_) => panic!("the server did not close the connection within {DEADLINE:?}"),
        }
    }
}

/// Whether the server has closed `stream` (end of stream or an error) within `within`; bytes
/// it sends meanwhile are read and dropped.
pub async fn closed_within(stream: &mut (impl AsyncRead + Unpin), within: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
}

/// `GET path` over a new plain-HTTP/1.1 connection to `addr`, as kubelet's prober does (no
/// keep-alive): the status and body, and how long it took from connect.
pub async fn probe(addr: SocketAddr, path: &str) -> Result<(u16, String, Duration), String> {
    let started = Instant::now();
    let exchange = async {
        let mut tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        tcp.write_all(
            format!(
                "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: kube-probe/1.33\r\n\
                 Accept: */*\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .map_err(|e| e.to_string())?;
        let mut answer = Vec::new();
        tcp.read_to_end(&mut answer)
            .await
            .map_err(|e| e.to_string())?;
        let answer = String::from_utf8_lossy(&answer).into_owned();
        let status = answer
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("no status in {answer:?}"))?;
        let body = answer
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        Ok((status, body, started.elapsed()))
    };
    tokio::time::timeout(DEADLINE, exchange)
        .await
        .map_err(|_| format!("no answer within {DEADLINE:?}"))?
}

/// Opens `n` TCP connections to `addr` that send `bytes` and then nothing.
pub async fn open_silent(addr: SocketAddr, n: usize, bytes: &[u8]) -> Vec<TcpStream> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let mut tcp = TcpStream::connect(addr).await.expect("connect");
        if !bytes.is_empty() {
            tcp.write_all(bytes).await.expect("write");
        }
        out.push(tcp);
    }
    out
}

//! The webhook as the webhook tests set it up (it uses [`build`](crate::build)).
//!
//! - [`Harness`]: the in-memory API server with namespaces, and webhooks that read it with a key.
//! - [`webhook`], [`NoObjects`]: a webhook over any source; a source in which nothing exists.
//! - [`serve`] ([`ServeSettings`], [`Served`]): a webhook served over TLS on loopback with its
//!   admin port, a client that trusts it, and raw TLS connections to it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::apiserver::https::Reply;
use crate::apiserver::{ApiServer, HttpsClient, TestCerts};
use confighash::certs::key::KeyStore;
use confighash::core::checksum::{Recipe, StampKey};
use confighash::core::refs::ObjectRef;
use confighash::metrics::Metrics;
use confighash::serving::health::Health;
use confighash::serving::tls::CertStore;
use confighash::webhook::admission::Webhook;
use confighash::webhook::budget::MemoryBudget;
use confighash::webhook::lookup::{Fetched, KubeSource, ObjectSource, ReadError};
use confighash::webhook::server::{
    self as serve, RunningWebhook, WebhookLimits, WebhookServeConfig,
};
use futures::future::BoxFuture;
use k8s_openapi::NamespaceResourceScope;
use rustls::pki_types::ServerName;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::build;

/// How long a TLS handshake may take before the test fails.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// Every referenced object is absent: reviews need no API server.
pub struct NoObjects;

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

/// A webhook that reads referenced objects from `source` and stamps with `key`, with metrics of
/// its own (`webhook.metrics()`).
pub fn webhook(source: Arc<dyn ObjectSource>, key: &[u8]) -> Webhook {
    Webhook::new(
        source,
        Arc::new(KeyStore::new(StampKey::new(key.to_vec()).unwrap())),
        Arc::new(Metrics::new()),
    )
}

/// The in-memory API server with some namespaces, and webhooks that read it.
pub struct Harness {
    pub api: ApiServer,
    pub client: kube::Client,
    /// The webhook's lookups read through it.
    pub getter: confighash::cluster::get::Getter,
    key: Vec<u8>,
}

impl Harness {
    /// Starts the API server and creates `namespaces` (unlabelled); webhooks stamp with `key`.
    pub async fn start(namespaces: &[&str], key: &[u8]) -> Harness {
        let api = ApiServer::start().await;
        let client = api.client();
        for ns in namespaces {
            build::create_namespace(&client, ns, &[]).await;
        }
        let getter = confighash::cluster::get::Getter::new(&api.config()).unwrap();
        Harness {
            api,
            client,
            getter,
            key: key.to_vec(),
        }
    }

    /// The key webhooks stamp with.
    pub fn key(&self) -> StampKey {
        StampKey::new(self.key.clone()).unwrap()
    }

    /// A webhook reading the API server (add options with its `with_*` methods).
    pub fn webhook(&self) -> Webhook {
        webhook(Arc::new(KubeSource::new(self.getter.clone())), &self.key)
    }

    /// Creates `object` in `namespace`, or replaces the object of that name.
    pub async fn put<K>(&self, namespace: &str, object: K)
    where
        K: kube::Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + Clone
            + std::fmt::Debug
            + Serialize
            + DeserializeOwned,
    {
        build::put(&self.client, namespace, object).await;
    }

    /// GETs of ConfigMaps and Secrets the API server has served.
    pub fn reads(&self) -> usize {
        self.api
            .requests()
            .iter()
            .filter(|(verb, resource)| {
                verb == "get" && (resource == "configmaps" || resource == "secrets")
            })
            .count()
    }

    /// The stamp a webhook should give `object` (a workload in its own namespace) under
    /// `recipe`, from what the API server holds now.
    pub async fn expected(&self, recipe: Recipe, object: &Value) -> String {
        let namespace = object["metadata"]["namespace"]
            .as_str()
            .expect("a namespace");
        build::expected_stamp(&self.client, &self.key(), recipe, namespace, object)
            .await
            .to_string()
    }
}

/// How [`serve`] runs the webhook port.
pub struct ServeSettings {
    pub header_read_timeout: Duration,
    pub cert_poll: Duration,
    pub drain_timeout: Duration,
    pub limits: WebhookLimits,
}

impl Default for ServeSettings {
    fn default() -> Self {
        ServeSettings {
            header_read_timeout: Duration::from_secs(2),
            cert_poll: Duration::from_secs(60),
            drain_timeout: Duration::from_secs(1),
            limits: WebhookLimits::default(),
        }
    }
}

/// A webhook served over TLS on loopback, and what a test reaches it with.
pub struct Served {
    /// `None` once a test has taken it to shut it down.
    pub running: Option<RunningWebhook>,
    /// The webhook port.
    pub addr: SocketAddr,
    /// `https://127.0.0.1:<port>/mutate`.
    pub url: String,
    /// `http://<admin address>`.
    pub admin: String,
    /// The CA of the serving certificate: what clients trust.
    pub ca_pem: String,
    /// An HTTPS client that trusts the CA.
    pub https: HttpsClient,
    pub metrics: Arc<Metrics>,
    _dir: tempfile::TempDir,
}

/// Serves `webhook` on loopback with a certificate for `localhost` and `127.0.0.1` from a new
/// test CA, and its admin port, as `settings` say.
pub async fn serve(webhook: Webhook, settings: ServeSettings) -> Served {
    let certs = TestCerts::generate();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tls.crt"), &certs.cert_pem).unwrap();
    std::fs::write(dir.path().join("tls.key"), &certs.key_pem).unwrap();
    let store = CertStore::load(dir.path().join("tls.crt"), dir.path().join("tls.key")).unwrap();
    let metrics = webhook.metrics().clone();
    let running = serve::start_with(
        WebhookServeConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            admin_listen: "127.0.0.1:0".parse().unwrap(),
            certs: store,
            client_ca: None,
            webhook: Arc::new(webhook),
            health: Arc::new(Health::default()),
            cert_poll: settings.cert_poll,
            header_read_timeout: settings.header_read_timeout,
            drain_timeout: settings.drain_timeout,
        },
        settings.limits,
    )
    .await
    .unwrap();
    Served {
        addr: running.webhook_addr,
        url: format!("https://127.0.0.1:{}/mutate", running.webhook_addr.port()),
        admin: format!("http://{}", running.admin_addr),
        https: HttpsClient::new(&certs.ca_pem),
        ca_pem: certs.ca_pem,
        metrics,
        running: Some(running),
        _dir: dir,
    }
}

impl Served {
    /// The running server (unless a test has taken it).
    pub fn running(&self) -> &RunningWebhook {
        self.running.as_ref().expect("the server is running")
    }

    /// POSTs `body` to /mutate and checks that it is answered with 200.
    pub async fn post(&self, body: &Value) -> Reply {
        let reply = self
            .https
            .post(&self.url, body.to_string().into_bytes())
            .await
            .unwrap();
        assert_eq!(
            reply.status,
            200,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
        reply
    }

    /// A GET on the plain-HTTP admin port: the status and the body.
    pub async fn admin_get(&self, path: &str) -> (u16, String) {
        use http_body_util::BodyExt;
        let request = http::Request::get(format!("{}{path}", self.admin))
            .body(String::new())
            .unwrap();
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<String>();
        let response = client.request(request).await.unwrap();
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// A rustls client configuration that trusts the CA and offers `alpn`.
    pub fn client_config(&self, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
        Arc::new(crate::apiserver::https::client_config(&self.ca_pem, alpn))
    }

    /// A TLS connection to the webhook port that has finished its handshake, offering `alpn`.
    pub async fn tls(&self, alpn: &[&[u8]]) -> TlsStream<TcpStream> {
        let tcp = TcpStream::connect(self.addr).await.unwrap();
        // As the API server's client (Go) does; with Nagle's algorithm each HTTP/2 flow-control
        // round trip of a large body would wait for a delayed ACK.
        tcp.set_nodelay(true).unwrap();
        tokio::time::timeout(
            HANDSHAKE,
            tokio_rustls::TlsConnector::from(self.client_config(alpn))
                .connect(ServerName::try_from("localhost").unwrap(), tcp),
        )
        .await
        .expect("a handshake in time")
        .expect("a TLS handshake")
    }
}

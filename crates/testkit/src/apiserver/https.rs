//! An HTTPS client for tests that trusts only the CA it is given.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

/// A rustls client configuration that trusts only the certificates in `ca_pem`, with rustls'
/// default TLS versions and `alpn` offered (none if empty).
///
/// # Panics
/// If `ca_pem` holds no usable certificate: the tests generate it.
pub fn client_config(ca_pem: &str, alpn: &[&[u8]]) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.expect("a PEM CA")).expect("a usable CA");
    }
    assert!(!roots.is_empty(), "no CA certificate in the PEM");
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config
}

/// A pooled HTTP/1.1 and HTTP/2 client over TLS.
#[derive(Clone)]
pub struct HttpsClient {
    inner: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
}

/// A response: status, headers and body.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

impl HttpsClient {
    /// Trusts only the certificates in `ca_pem`.
    pub fn new(ca_pem: &str) -> Self {
        Self::with_config(client_config(ca_pem, &[]))
    }

    /// A client with its own rustls configuration (for protocol-version tests).
    pub fn with_config(tls: rustls::ClientConfig) -> Self {
        // As Go's net/http (kube-apiserver's client) does: no Nagle delay on small requests.
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_only()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        HttpsClient {
            inner: Client::builder(TokioExecutor::new()).build(connector),
        }
    }

    /// Sends one request and reads the whole reply, within 10 seconds.
    pub async fn send(&self, method: &str, url: &str, body: Vec<u8>) -> Result<Reply, String> {
        let req = hyper::Request::builder()
            .method(method)
            .uri(url)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let exchange = async {
            let resp = self
                .inner
                .request(req)
                .await
                .map_err(|e| format!("{e:?}"))?;
            let status = resp.status().as_u16();
            let headers = resp.headers().clone();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes()
                .to_vec();
            Ok(Reply {
                status,
                headers,
                body,
            })
        };
        tokio::time::timeout(Duration::from_secs(10), exchange)
            .await
            .map_err(|_| "no reply within 10 s".to_owned())?
    }

    pub async fn post(&self, url: &str, body: Vec<u8>) -> Result<Reply, String> {
        self.send("POST", url, body).await
    }
}

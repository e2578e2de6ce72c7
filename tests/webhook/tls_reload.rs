//! The serving certificate store over real sockets: protocol versions, ALPN, hot reload from a
//! kubelet-style Secret volume, bad new pairs, and the local CA from `confighash certs`.

use crate::wait;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use confighash::certs::certificates;
use confighash::serving::tls::{CertStore, TlsError, load_pair};
use confighash_testkit::apiserver::{ServingPair, TestCa};
use hyper::body::{Body as _, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ProtocolVersion, RootCertStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::client::TlsStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};
use wait::DEADLINE;

// ---------------------------------------------------------------------------------------------
// Certificates

/// The names the serving certificates are for: what the tests connect to.
const NAMES: &[&str] = &["127.0.0.1", "localhost"];

/// A CA that issues serving certificates for [`NAMES`].
fn test_ca() -> TestCa {
    TestCa::new("tls_reload test CA")
}

fn issue(ca: &TestCa) -> ServingPair {
    ca.issue(NAMES)
}

fn write_pair(dir: &Path, pair: &ServingPair) -> (PathBuf, PathBuf) {
    write_pem(dir, &pair.cert_pem, &pair.key_pem)
}

fn write_pem(dir: &Path, cert_pem: &str, key_pem: &str) -> (PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).expect("create dir");
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&cert, cert_pem).expect("write tls.crt");
    std::fs::write(&key, key_pem).expect("write tls.key");
    (cert, key)
}

// ---------------------------------------------------------------------------------------------
// Server and client

/// An HTTPS server on 127.0.0.1 answering every request with "ok <protocol>".
struct Server {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    async fn start(store: &Arc<CertStore>) -> Self {
        let acceptor = TlsAcceptor::from(Arc::new(store.server_config()));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                        let body = format!("ok {:?}", req.version());
                        Ok::<_, Infallible>(Response::new(body))
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Server { addr, task }
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A client trusting only `ca_pem`, offering `versions` and `alpn`.
fn client_config(
    ca_pem: &str,
    versions: &[&'static rustls::SupportedProtocolVersion],
    alpn: &[&[u8]],
) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.expect("CA PEM")).expect("a CA certificate");
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

fn default_client(ca_pem: &str) -> Arc<ClientConfig> {
    client_config(ca_pem, rustls::ALL_VERSIONS, &[b"h2", b"http/1.1"])
}

async fn connect(
    addr: SocketAddr,
    config: Arc<ClientConfig>,
    name: &str,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(name.to_owned()).expect("a server name");
    TlsConnector::from(config).connect(name, tcp).await
}

fn peer_leaf(tls: &TlsStream<TcpStream>) -> CertificateDer<'static> {
    tls.get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .expect("the server sent a certificate")
        .clone()
        .into_owned()
}

/// An HTTP connection over TLS, speaking whatever ALPN chose.
enum Http {
    H1(hyper::client::conn::http1::SendRequest<String>),
    H2(hyper::client::conn::http2::SendRequest<String>),
}

impl Http {
    async fn over(tls: TlsStream<TcpStream>) -> Self {
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        let io = TokioIo::new(tls);
        if h2 {
            let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .expect("an h2 connection");
            tokio::spawn(conn);
            Http::H2(send)
        } else {
            let (send, conn) = hyper::client::conn::http1::handshake(io)
                .await
                .expect("an HTTP/1.1 connection");
            tokio::spawn(conn);
            Http::H1(send)
        }
    }

    /// GET / and return the body; any failure is an error.
    async fn get(&mut self) -> Result<String, String> {
        let req = Request::get("https://localhost/")
            .header("host", "localhost")
            .body(String::new())
            .expect("a request");
        let resp = match self {
            Http::H1(send) => {
                send.ready().await.map_err(|e| e.to_string())?;
                send.send_request(req).await
            }
            Http::H2(send) => {
                send.ready().await.map_err(|e| e.to_string())?;
                send.send_request(req).await
            }
        }
        .map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            return Err(format!("status {}", resp.status()));
        }
        let mut body = resp.into_body();
        let mut bytes = Vec::new();
        while let Some(frame) =
            std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await
        {
            if let Ok(data) = frame.map_err(|e| e.to_string())?.into_data() {
                bytes.extend_from_slice(&data);
            }
        }
        String::from_utf8(bytes).map_err(|e| e.to_string())
    }
}

/// One fresh connection, one request; the leaf certificate the server presented.
async fn fetch_once(
    addr: SocketAddr,
    config: Arc<ClientConfig>,
) -> Result<CertificateDer<'static>, String> {
    let tls = connect(addr, config, "localhost")
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let leaf = peer_leaf(&tls);
    let body = Http::over(tls).await.get().await?;
    if !body.starts_with("ok") {
        return Err(format!("unexpected body {body:?}"));
    }
    Ok(leaf)
}

// ---------------------------------------------------------------------------------------------
// Protocols

#[tokio::test]
async fn alpn_negotiates_h2_and_http11() {
    // The stand-in API server's certificates load as they are.
    let test_certs = confighash_testkit::apiserver::TestCerts::generate();
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = write_pem(dir.path(), &test_certs.cert_pem, &test_certs.key_pem);
    let store = CertStore::load(&cert, &key).expect("load");
    let server = Server::start(&store).await;
    let ca = &test_certs.ca_pem;

    // (client offers, server picks, the server saw)
    type Case = (
        &'static [&'static [u8]],
        Option<&'static [u8]>,
        &'static str,
    );
    let cases: [Case; 4] = [
        (&[b"h2", b"http/1.1"], Some(b"h2"), "ok HTTP/2.0"),
        (&[b"http/1.1", b"h2"], Some(b"h2"), "ok HTTP/2.0"),
        (&[b"http/1.1"], Some(b"http/1.1"), "ok HTTP/1.1"),
        (&[], None, "ok HTTP/1.1"),
    ];
    for (offered, negotiated, body) in cases {
        let config = client_config(ca, rustls::ALL_VERSIONS, offered);
        let tls = connect(server.addr, config, "localhost")
            .await
            .expect("handshake");
        assert_eq!(tls.get_ref().1.alpn_protocol(), negotiated, "{offered:?}");
        let got = Http::over(tls).await.get().await.expect("a response");
        assert_eq!(got, body, "{offered:?}");
    }

    // A protocol the server does not speak is refused, not ignored.
    let config = client_config(ca, rustls::ALL_VERSIONS, &[b"spdy/3"]);
    assert!(connect(server.addr, config, "localhost").await.is_err());
}

#[tokio::test]
async fn only_tls12_and_tls13_are_offered() {
    let ca = test_ca();
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = write_pair(dir.path(), &issue(&ca));
    let store = CertStore::load(&cert, &key).expect("load");
    let server = Server::start(&store).await;

    let tls = connect(server.addr, default_client(&ca.pem), "localhost")
        .await
        .expect("handshake");
    assert_eq!(
        tls.get_ref().1.protocol_version(),
        Some(ProtocolVersion::TLSv1_3)
    );

    let tls12 = client_config(&ca.pem, &[&rustls::version::TLS12], &[b"h2"]);
    let tls = connect(server.addr, tls12, "localhost")
        .await
        .expect("a TLS 1.2 handshake");
    assert_eq!(
        tls.get_ref().1.protocol_version(),
        Some(ProtocolVersion::TLSv1_2)
    );
    assert_eq!(
        Http::over(tls).await.get().await.expect("a response"),
        "ok HTTP/2.0"
    );

    // rustls clients cannot speak TLS 1.1, so send TLS 1.1 ClientHellos by hand: the server
    // must answer with a fatal alert, never a ServerHello. With signature_algorithms (which a
    // TLS 1.1 client would not send) the hello gets as far as the version check: protocol_version.
    // Without it, as a real TLS 1.1 client sends it, it fails earlier: handshake_failure.
    for (with_sig_algs, alert) in [(true, 70), (false, 40)] {
        let answer = send_raw(server.addr, &tls11_client_hello(with_sig_algs)).await;
        assert!(answer.len() >= 7, "answer {answer:?}");
        assert_eq!(
            answer[0], 0x15,
            "an alert record, not a handshake: {answer:?}"
        );
        assert_eq!(answer[5], 2, "a fatal alert: {answer:?}");
        assert_eq!(answer[6], alert, "alert description: {answer:?}");
    }
}

/// Send `bytes` and read until the server closes.
async fn send_raw(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(bytes).await.expect("send");
    let mut answer = Vec::new();
    tokio::time::timeout(DEADLINE, tcp.read_to_end(&mut answer))
        .await
        .expect("the server answers and closes")
        .expect("read the answer");
    answer
}

/// A TLS 1.1 ClientHello (no supported_versions extension) offering suites that exist in
/// TLS 1.2 too, optionally with a signature_algorithms extension.
fn tls11_client_hello(with_sig_algs: bool) -> Vec<u8> {
    let mut body = vec![0x03, 0x02]; // client_version TLS 1.1
    body.extend_from_slice(&[0x5a; 32]); // random
    body.push(0); // session id
    body.extend_from_slice(&[0x00, 0x06, 0xc0, 0x2b, 0xc0, 0x13, 0x00, 0x2f]); // cipher suites
    body.extend_from_slice(&[0x01, 0x00]); // compression: null
    if with_sig_algs {
        // ecdsa_secp256r1_sha256, rsa_pss_rsae_sha256, rsa_pkcs1_sha256
        let schemes = [0x04, 0x03, 0x08, 0x04, 0x04, 0x01];
        let mut ext = vec![0x00, 0x0d]; // signature_algorithms
        ext.extend_from_slice(&((schemes.len() + 2) as u16).to_be_bytes());
        ext.extend_from_slice(&(schemes.len() as u16).to_be_bytes());
        ext.extend_from_slice(&schemes);
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(&ext);
    }
    let mut handshake = vec![0x01]; // ClientHello
    handshake.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    handshake.extend_from_slice(&body);
    let mut record = vec![0x16, 0x03, 0x01]; // handshake record, TLS 1.0 framing
    record.extend_from_slice(&(handshake.len() as u16).to_be_bytes());
    record.extend_from_slice(&handshake);
    record
}

#[tokio::test]
async fn every_handshake_is_a_full_one() {
    // A resumed session would skip the certificate, so a replaced pair could live on in it.
    let ca = test_ca();
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = write_pair(dir.path(), &issue(&ca));
    let store = CertStore::load(&cert, &key).expect("load");
    let server = Server::start(&store).await;
    for versions in [&[&rustls::version::TLS13][..], &[&rustls::version::TLS12]] {
        // One client config, so its session cache is shared between the connections.
        let config = client_config(&ca.pem, versions, &[b"h2"]);
        for _ in 0..3 {
            let tls = connect(server.addr, config.clone(), "localhost")
                .await
                .expect("handshake");
            assert_eq!(
                tls.get_ref().1.handshake_kind(),
                Some(rustls::HandshakeKind::Full)
            );
            // Let TLS 1.3 tickets, if any were sent, reach the client's cache.
            Http::over(tls).await.get().await.expect("a request");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Reload

#[cfg(unix)]
use crate::kubelet_volume;

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubelet_secret_rotation_is_served_without_failed_requests() {
    let ca = test_ca();
    let old = issue(&ca);
    let new = issue(&ca);
    let mut volume = kubelet_volume::SecretVolume::new(&old.cert_pem, &old.key_pem);
    let store = CertStore::load(volume.cert(), volume.key()).expect("load");
    assert_eq!(store.current().cert[0], old.der.clone());
    let server = Server::start(&store).await;

    let swaps = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let poller = tokio::spawn(store.clone().poll(Duration::from_millis(20), {
        let (swaps, failures) = (swaps.clone(), failures.clone());
        move |result| match result {
            Ok(true) => {
                swaps.fetch_add(1, Ordering::SeqCst);
            }
            Ok(false) => {}
            Err(e) => failures.lock().expect("lock").push(e.to_string()),
        }
    }));

    // A client sending requests on fresh connections in a loop, recording which pair it saw.
    let stop = Arc::new(AtomicBool::new(false));
    let seen_old = Arc::new(AtomicUsize::new(0));
    let seen_new = Arc::new(AtomicUsize::new(0));
    let client = tokio::spawn({
        let (stop, seen_old, seen_new) = (stop.clone(), seen_old.clone(), seen_new.clone());
        let (old_der, new_der) = (old.der.clone(), new.der.clone());
        let config = default_client(&ca.pem);
        let addr = server.addr;
        async move {
            let mut errors = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                match fetch_once(addr, config.clone()).await {
                    Ok(leaf) if leaf == old_der => seen_old.fetch_add(1, Ordering::SeqCst),
                    Ok(leaf) if leaf == new_der => seen_new.fetch_add(1, Ordering::SeqCst),
                    Ok(_) => {
                        errors.push("an unknown certificate".to_owned());
                        0
                    }
                    Err(e) => {
                        errors.push(e);
                        0
                    }
                };
            }
            errors
        }
    });

    wait::eventually("requests with the old certificate", async || {
        seen_old.load(Ordering::SeqCst) >= 5
    })
    .await;
    volume.update(&new.cert_pem, &new.key_pem);
    wait::eventually("the new certificate to be served", async || {
        seen_new.load(Ordering::SeqCst) >= 5
    })
    .await;

    stop.store(true, Ordering::SeqCst);
    let errors = client.await.expect("the client loop");
    poller.abort();
    assert!(errors.is_empty(), "failed requests: {errors:?}");
    assert_eq!(swaps.load(Ordering::SeqCst), 1);
    assert!(
        failures.lock().expect("lock").is_empty(),
        "reload failures: {:?}",
        failures.lock().expect("lock")
    );
    assert_eq!(store.current().cert[0], new.der.clone());
}

#[tokio::test]
async fn a_bad_new_pair_keeps_the_old_one_in_service() {
    let ca = test_ca();
    let old = issue(&ca);
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = write_pair(dir.path(), &old);
    let store = CertStore::load(&cert, &key).expect("load");
    let old_not_after = store.not_after();
    let server = Server::start(&store).await;
    let client = default_client(&ca.pem);
    let served = async || {
        fetch_once(server.addr, client.clone())
            .await
            .expect("a request")
    };

    // Garbage in the certificate file.
    std::fs::write(&cert, "this is not a certificate\n").expect("write");
    let err = store.reload().expect_err("garbage is refused");
    assert!(matches!(err, TlsError::NoCertificate { .. }), "{err}");
    assert!(
        err.to_string().contains(&cert.display().to_string()),
        "{err}"
    );
    assert_eq!(served().await, old.der.clone());

    // A good certificate with somebody else's key.
    let other = issue(&ca);
    std::fs::write(&cert, &other.cert_pem).expect("write");
    let err = store.reload().expect_err("a mismatched key is refused");
    assert!(matches!(err, TlsError::KeyMismatch { .. }), "{err}");
    assert!(
        err.to_string().contains(&key.display().to_string()),
        "{err}"
    );
    assert!(err.to_string().contains("does not match"), "{err}");
    assert_eq!(served().await, old.der.clone());

    // A truncated key.
    std::fs::write(&cert, &old.cert_pem).expect("write");
    std::fs::write(&key, &old.key_pem[..old.key_pem.len() / 2]).expect("write");
    let err = store.reload().expect_err("a truncated key is refused");
    assert!(
        err.to_string().contains(&key.display().to_string()),
        "{err}"
    );
    assert_eq!(served().await, old.der.clone());

    // A missing file.
    std::fs::remove_file(&key).expect("remove");
    let err = store.reload().expect_err("a missing key is refused");
    assert!(matches!(err, TlsError::Read { .. }), "{err}");
    assert_eq!(served().await, old.der.clone());
    assert_eq!(store.not_after(), old_not_after);

    // Fixed: the new pair goes into service, and reloading the same files changes nothing.
    write_pair(dir.path(), &other);
    assert!(store.reload().expect("a good pair"));
    assert_eq!(served().await, other.der.clone());
    assert!(!store.reload().expect("unchanged"));
}

#[tokio::test]
async fn an_open_connection_survives_a_swap() {
    let ca = test_ca();
    let old = issue(&ca);
    let new = issue(&ca);
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = write_pair(dir.path(), &old);
    let store = CertStore::load(&cert, &key).expect("load");
    let server = Server::start(&store).await;

    let mut open = Vec::new();
    for alpn in [&b"h2"[..], b"http/1.1"] {
        let config = client_config(&ca.pem, rustls::ALL_VERSIONS, &[alpn]);
        let tls = connect(server.addr, config, "localhost")
            .await
            .expect("handshake");
        assert_eq!(peer_leaf(&tls), old.der.clone());
        let mut http = Http::over(tls).await;
        http.get().await.expect("a request before the swap");
        open.push(http);
    }

    write_pair(dir.path(), &new);
    assert!(store.reload().expect("a new pair"));

    for http in &mut open {
        for _ in 0..3 {
            http.get().await.expect("a request after the swap");
        }
    }
    let fresh = fetch_once(server.addr, default_client(&ca.pem))
        .await
        .expect("a new connection");
    assert_eq!(fresh, new.der.clone());
}

#[tokio::test]
async fn not_after_is_the_leafs() {
    let ca = test_ca();
    let first_expiry = std::time::UNIX_EPOCH + Duration::from_secs(1_900_000_000);
    let second_expiry = std::time::UNIX_EPOCH + Duration::from_secs(2_000_000_000);
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = write_pair(dir.path(), &ca.issue_until(NAMES, first_expiry));

    let pair = load_pair(&cert, &key).expect("load_pair");
    assert_eq!(pair.not_after, 1_900_000_000);
    let store = CertStore::load(&cert, &key).expect("load");
    assert_eq!(store.not_after(), 1_900_000_000);

    write_pair(dir.path(), &ca.issue_until(NAMES, second_expiry));
    assert!(store.reload().expect("reload"));
    assert_eq!(store.not_after(), 2_000_000_000);
}

// ---------------------------------------------------------------------------------------------
// `confighash certs`

#[tokio::test]
async fn generated_certificates_verify_for_every_service_name() {
    let mut names = certificates::service_names("confighash", "confighash");
    names.push("127.0.0.1".to_owned());
    let generated = certificates::generate(&names, 30, 7).expect("generate");
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("local");
    let written = certificates::write(&out, &generated).expect("write");
    let file_names: Vec<_> = written
        .iter()
        .map(|p| {
            p.file_name()
                .expect("a file name")
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(file_names, ["ca.crt", "ca.key", "tls.crt", "tls.key"]);

    let pair = load_pair(&out.join("tls.crt"), &out.join("tls.key")).expect("load_pair");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs() as i64;
    let days = (pair.not_after - now) as f64 / 86_400.0;
    assert!((6.9..=7.01).contains(&days), "{days} days");

    let store = CertStore::load(out.join("tls.crt"), out.join("tls.key")).expect("load");
    let server = Server::start(&store).await;
    let ca_pem = std::fs::read_to_string(out.join("ca.crt")).expect("ca.crt");
    let client = default_client(&ca_pem);
    for name in &names {
        let tls = connect(server.addr, client.clone(), name)
            .await
            .unwrap_or_else(|e| panic!("{name} does not verify: {e}"));
        Http::over(tls).await.get().await.expect("a request");
    }
    let err = connect(server.addr, client.clone(), "other.confighash.svc")
        .await
        .expect_err("a name not in the certificate");
    assert!(err.to_string().contains("certificate"), "{err}");

    // A client trusting another CA refuses the server.
    let stranger = certificates::generate(&names, 30, 7).expect("generate");
    let err = connect(
        server.addr,
        default_client(&stranger.ca_cert_pem),
        "127.0.0.1",
    )
    .await
    .expect_err("an unknown CA");
    assert!(err.to_string().contains("certificate"), "{err}");
}

#[test]
fn write_refuses_to_overwrite() {
    let names = certificates::service_names("confighash", "confighash");
    let first = certificates::generate(&names, 30, 7).expect("generate");
    let second = certificates::generate(&names, 30, 7).expect("generate");
    let dir = tempfile::tempdir().expect("tempdir");

    certificates::write(dir.path(), &first).expect("the first write");
    let err = certificates::write(dir.path(), &second).expect_err("a second write");
    assert!(
        matches!(err, certificates::CertsError::Exists { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("ca.crt"), "{err}");
    assert!(err.to_string().contains("already exists"), "{err}");
    let on_disk = std::fs::read_to_string(dir.path().join("tls.key")).expect("tls.key");
    assert_eq!(on_disk, first.key_pem);

    // One file in the way: nothing at all is written.
    let other = tempfile::tempdir().expect("tempdir");
    std::fs::write(other.path().join("tls.key"), "mine").expect("write");
    let err = certificates::write(other.path(), &second).expect_err("tls.key is in the way");
    assert!(err.to_string().contains("tls.key"), "{err}");
    for name in ["ca.crt", "ca.key", "tls.crt"] {
        assert!(!other.path().join(name).exists(), "{name} was written");
    }
    let kept = std::fs::read_to_string(other.path().join("tls.key")).expect("tls.key");
    assert_eq!(kept, "mine");
}

/// The openssl recipe in certs/README.md, run as it is written: its output loads, serves, and
/// verifies for every name it promises.
#[tokio::test]
async fn openssl_recipe_in_certs_readme_works() {
    if std::process::Command::new("openssl")
        .arg("version")
        .output()
        .is_err()
    {
        eprintln!("SKIPPED openssl_recipe_in_certs_readme_works: needs `openssl` on PATH");
        return;
    }
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("certs/README.md");
    let readme = std::fs::read_to_string(&readme).expect("certs/README.md");
    let marker = "<!-- tls_reload: openssl recipe -->\n```sh\n";
    let start = readme.find(marker).expect("the recipe marker") + marker.len();
    let len = readme[start..]
        .find("\n```")
        .expect("the end of the recipe");
    let recipe = &readme[start..start + len];

    let dir = tempfile::tempdir().expect("tempdir");
    let out = std::process::Command::new("sh")
        .args(["-e", "-c", recipe])
        .current_dir(dir.path())
        .output()
        .expect("run sh");
    assert!(
        out.status.success(),
        "the recipe failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("certs/local/tls.crt: OK"));

    let local = dir.path().join("certs/local");
    let mut files: Vec<_> = std::fs::read_dir(&local)
        .expect("certs/local")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(files, ["ca.crt", "ca.key", "tls.crt", "tls.key"]);

    let store = CertStore::load(local.join("tls.crt"), local.join("tls.key")).expect("load");
    let server = Server::start(&store).await;
    let ca_pem = std::fs::read_to_string(local.join("ca.crt")).expect("ca.crt");
    let client = default_client(&ca_pem);
    let mut names = certificates::service_names("confighash", "confighash");
    names.push("127.0.0.1".to_owned());
    for name in &names {
        let tls = connect(server.addr, client.clone(), name)
            .await
            .unwrap_or_else(|e| panic!("{name} does not verify: {e}"));
        Http::over(tls).await.get().await.expect("a request");
    }
}

//! `--client-ca-file`: the webhook requires a client certificate signed by that CA, re-reads the
//! CA when it changes, and gives connections with a valid certificate slots of their own. With
//! every slot open to others held by connections that never finish their TLS handshake, a client
//! with a certificate still gets a review answered within 100 ms. Without a client CA the same
//! connections make a new client wait (the documented limit). Every wait polls towards a
//! deadline; none is a fixed sleep.

use crate::ports;
use crate::wait;

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use confighash::cli::{Cli, Command};
use confighash::serving::server::{Limits as ConnectionLimits, reserved_connections};
use confighash::serving::tls::{ClientCaStore, TlsError};
use confighash::webhook::server::WebhookLimits;
use confighash_testkit::apiserver::{ServingPair, TestCa};
use ports::{DEADLINE, Http, Server, closed_within, open_silent, read_to_close};
use tokio::time::Instant;

/// The bound the issue sets on an authenticated review while unauthenticated connections hold
/// every slot they can.
const AUTHENTICATED_REVIEW: Duration = Duration::from_millis(100);

/// The start of a TLS record carrying a ClientHello: a handshake that stops here never ends.
const PARTIAL_CLIENT_HELLO: &[u8] = &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc];

/// A client CA in a file, and a client certificate it signed (as kube-apiserver's would be).
struct ClientCa {
    ca: TestCa,
    file: tempfile::NamedTempFile,
    store: Arc<ClientCaStore>,
}

impl ClientCa {
    fn new(name: &str) -> Self {
        let ca = TestCa::new(name);
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), &ca.pem).unwrap();
        let store = ClientCaStore::load(file.path()).unwrap();
        ClientCa { ca, file, store }
    }

    fn client(&self) -> ServingPair {
        self.ca.issue(&["kube-apiserver"])
    }
}

async fn start(max_connections: usize, client_ca: Option<&ClientCa>) -> Server {
    ports::start(
        WebhookLimits {
            connections: ConnectionLimits {
                max_connections,
                ..WebhookLimits::default().connections
            },
            ..WebhookLimits::default()
        },
        // Longer than any test: connections that stall stay until something closes them.
        Duration::from_secs(60),
        client_ca.map(|ca| ca.store.clone()),
    )
    .await
}

/// A client presenting `pair` (none if `None`), offering `alpn`.
fn config(server: &Server, pair: Option<&ServingPair>, alpn: &[u8]) -> Arc<rustls::ClientConfig> {
    ports::client_config(
        &server.ca_pem,
        &[alpn],
        pair.map(|p| (p.cert_pem.as_str(), p.key_pem.as_str())),
    )
}

/// Connects with `pair` over HTTP/2 (or HTTP/1.1) and has one review answered.
async fn connect_and_review(server: &Server, pair: &ServingPair, h2: bool, uid: &str) -> Http {
    let alpn: &[u8] = if h2 { b"h2" } else { b"http/1.1" };
    let tls = ports::tls(
        server.running.webhook_addr,
        config(server, Some(pair), alpn),
    )
    .await
    .expect("a TLS handshake");
    let mut http = Http::over(tls, h2).await;
    http.review(uid).await;
    http
}

/// Whether a client presenting `pair` gets a review answered. In TLS 1.3 the client finishes
/// its side of the handshake before the server has checked its certificate, so a refusal shows
/// as the first exchange failing.
async fn accepted(server: &Server, pair: Option<&ServingPair>) -> bool {
    let Ok(tls) = ports::tls(
        server.running.webhook_addr,
        config(server, pair, b"http/1.1"),
    )
    .await
    else {
        return false;
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake::<
        _,
        http_body_util::Full<hyper::body::Bytes>,
    >(hyper_util::rt::TokioIo::new(tls))
    .await
    .expect("HTTP/1.1");
    tokio::spawn(conn);
    let request = hyper::Request::post("/mutate")
        .header("host", "localhost")
        .body(ports::review("accepted").into())
        .unwrap();
    match tokio::time::timeout(DEADLINE, sender.send_request(request)).await {
        Ok(Ok(response)) => response.status() == 200,
        Ok(Err(_)) => false,
        Err(_) => panic!("neither an answer nor a refusal within {DEADLINE:?}"),
    }
}

/// The headline case of finding 6. Eight slots, so four take handshakes in progress and four are
/// reserved. Sixteen connections that stop inside their ClientHello hold every handshake slot
/// (the first twelve were closed to make room for later ones); a client with a certificate
/// then connects, completes its handshake and has a review answered within 100 ms, over HTTP/2
/// and over HTTP/1.1, and the four reserved slots all serve clients with a certificate while
/// the handshake pool stays full.
#[tokio::test]
async fn with_a_client_ca_a_review_completes_while_handshakes_hold_every_open_slot() {
    let client_ca = ClientCa::new("apiserver client CA");
    let apiserver = client_ca.client();
    let server = start(8, Some(&client_ca)).await;
    assert_eq!(reserved_connections(8), (4, 4));
    let addr = server.running.webhook_addr;

    let mut stalled = open_silent(addr, 4, PARTIAL_CLIENT_HELLO).await;
    server.wait_connections(4).await;
    stalled.extend(open_silent(addr, 12, PARTIAL_CLIENT_HELLO).await);
    // Each of the twelve made room by closing the oldest handshake.
    for (i, tcp) in stalled[..12].iter_mut().enumerate() {
        assert!(closed_within(tcp, DEADLINE).await, "stalled handshake {i}");
    }
    server.wait_connections(4).await;
    assert!(server.metrics.connection_limit_hits() >= 12);

    let mut reviewers = Vec::new();
    for (i, h2) in [true, false, true, false].into_iter().enumerate() {
        let started = Instant::now();
        let http = connect_and_review(&server, &apiserver, h2, &format!("reserved-{i}")).await;
        let took = started.elapsed();
        eprintln!("h2 {h2}: connect, handshake and review in {took:?}");
        assert!(
            took < AUTHENTICATED_REVIEW,
            "h2 {h2}: the review took {took:?} with every handshake slot held"
        );
        reviewers.push(http);
    }
    // The handshake pool is full again (each authenticated handshake took the place of a
    // stalled one), and the four reserved slots hold the four clients with a certificate.
    stalled.extend(open_silent(addr, 4, PARTIAL_CLIENT_HELLO).await);
    server.wait_connections(8).await;
    for (i, http) in reviewers.iter_mut().enumerate() {
        http.review(&format!("again-{i}")).await;
    }
    // The last four stalled handshakes hold the handshake slots; nothing else got one.
    let newest = stalled.len() - 4;
    for (i, tcp) in stalled[newest..].iter_mut().enumerate() {
        assert!(!closed_within(tcp, Duration::from_millis(1)).await, "{i}");
    }
}

/// A client whose certificate found every reserved slot taken waits, its handshake done, until
/// one frees; it is then served. (Two slots: one for handshakes, one reserved.)
#[tokio::test]
async fn a_client_waits_for_a_reserved_slot_to_free() {
    let client_ca = ClientCa::new("apiserver client CA");
    let apiserver = client_ca.client();
    let server = start(2, Some(&client_ca)).await;
    assert_eq!(reserved_connections(2), (1, 1));
    let mut first = connect_and_review(&server, &apiserver, true, "first").await;

    let second = {
        let config = config(&server, Some(&apiserver), b"h2");
        let addr = server.running.webhook_addr;
        tokio::spawn(async move {
            let tls = ports::tls(addr, config).await.expect("a TLS handshake");
            let mut http = Http::over(tls, true).await;
            http.review("second").await;
            http
        })
    };
    // Not served while the reserved slot is taken: a bounded check for something that must not
    // happen, not a wait.
    wait::throughout(
        "the second client waiting for a reserved slot",
        Duration::from_millis(300),
        async || !second.is_finished(),
    )
    .await;
    first.review("first-again").await;
    first.task.abort();
    drop(first);
    let _second = tokio::time::timeout(DEADLINE, second)
        .await
        .expect("served once the reserved slot is free")
        .unwrap();
}

/// Without a client CA the slots are one pool: connections that stop inside their handshake
/// and hold every slot make a new client wait until one of them goes (here: until the test
/// closes one; in production the 10 s header timeout). This is the limit SECURITY.md states.
#[tokio::test]
async fn without_a_client_ca_stalled_handshakes_make_new_clients_wait() {
    let client_ca = ClientCa::new("unused");
    let server = start(4, None).await;
    let addr = server.running.webhook_addr;
    let mut stalled = open_silent(addr, 4, PARTIAL_CLIENT_HELLO).await;
    server.wait_connections(4).await;

    let client = {
        let config = config(&server, None, b"h2");
        tokio::spawn(async move {
            let tls = ports::tls(addr, config).await.expect("a TLS handshake");
            let mut http = Http::over(tls, true).await;
            http.review("waited").await;
        })
    };
    wait::throughout(
        "the client waiting while every slot is held",
        AUTHENTICATED_REVIEW * 3,
        async || !client.is_finished(),
    )
    .await;
    drop(stalled.remove(0));
    tokio::time::timeout(DEADLINE, client)
        .await
        .expect("served once a slot is free")
        .unwrap();
    // A client certificate is neither asked for nor needed.
    assert!(accepted(&server, None).await);
    assert!(accepted(&server, Some(&client_ca.client())).await);
}

/// With a client CA, a client without a certificate, or with one from another CA, is refused;
/// one with a certificate the CA signed is served.
#[tokio::test]
async fn only_clients_with_a_certificate_from_the_ca_are_served() {
    let client_ca = ClientCa::new("apiserver client CA");
    let other = TestCa::new("another CA").issue(&["kube-apiserver"]);
    let server = start(16, Some(&client_ca)).await;
    assert!(!accepted(&server, None).await, "no certificate");
    assert!(!accepted(&server, Some(&other)).await, "another CA");
    assert!(accepted(&server, Some(&client_ca.client())).await);
    // A serving certificate of the CA is no help to a client of another CA: what counts is who
    // signed the certificate the client presents.
    let mut refused = ports::tls(
        server.running.webhook_addr,
        config(&server, Some(&other), b"http/1.1"),
    )
    .await
    .expect("TLS 1.3: the client's side of the handshake completes");
    read_to_close(&mut refused).await;
    server.wait_connections(0).await;
}

/// A new CA in the file is used from the next handshake on; connections already open stay; a
/// file that is no CA is refused and the CA in service stays.
#[tokio::test]
async fn a_new_client_ca_is_used_from_the_next_handshake() {
    let client_ca = ClientCa::new("first client CA");
    let first = client_ca.client();
    let server = start(16, Some(&client_ca)).await;
    let mut open = connect_and_review(&server, &first, true, "open").await;

    let next = TestCa::new("next client CA");
    std::fs::write(client_ca.file.path(), &next.pem).unwrap();
    assert!(client_ca.store.reload().expect("a new CA"));
    assert!(!client_ca.store.reload().expect("nothing new"));
    assert!(!accepted(&server, Some(&first)).await, "the replaced CA");
    assert!(accepted(&server, Some(&next.issue(&["kube-apiserver"]))).await);
    open.review("still-open").await;

    // Both CAs in one file: both trusted, as during a rotation.
    std::fs::write(
        client_ca.file.path(),
        format!("{}{}", client_ca.ca.pem, next.pem),
    )
    .unwrap();
    assert!(client_ca.store.reload().unwrap());
    assert_eq!(client_ca.store.certificates(), 2);
    assert!(accepted(&server, Some(&first)).await);
    assert!(accepted(&server, Some(&next.issue(&["kube-apiserver"]))).await);

    std::fs::write(client_ca.file.path(), "not a CA\n").unwrap();
    assert!(matches!(
        client_ca.store.reload(),
        Err(TlsError::NoCertificate { .. })
    ));
    assert!(client_ca.store.refused());
    assert!(
        !client_ca
            .store
            .reload()
            .expect("the same bad file is reported once")
    );
    assert!(
        accepted(&server, Some(&first)).await,
        "the CA in service stays"
    );
    std::fs::remove_file(client_ca.file.path()).unwrap();
    assert!(matches!(
        client_ca.store.reload(),
        Err(TlsError::Read { .. })
    ));
    assert!(accepted(&server, Some(&first)).await);
}

/// The server re-reads the CA file on the certificate interval.
#[tokio::test]
async fn the_client_ca_file_is_polled() {
    let client_ca = ClientCa::new("first client CA");
    let server = ports::start_polling(
        WebhookLimits::default(),
        Duration::from_secs(10),
        Some(client_ca.store.clone()),
        Duration::from_millis(20),
    )
    .await;
    let next = TestCa::new("next client CA");
    std::fs::write(client_ca.file.path(), &next.pem).unwrap();
    let pair = next.issue(&["kube-apiserver"]);
    wait::eventually("the new CA to be used", async || {
        accepted(&server, Some(&pair)).await
    })
    .await;
    assert!(!accepted(&server, Some(&client_ca.client())).await);
}

/// A CA file must hold a CA certificate.
#[test]
fn a_client_ca_file_without_a_certificate_is_refused() {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), "").unwrap();
    let err = ClientCaStore::load(file.path()).unwrap_err();
    assert!(matches!(err, TlsError::NoCertificate { .. }), "{err}");
    assert!(
        err.to_string().contains(&file.path().display().to_string()),
        "{err}"
    );
    let err = ClientCaStore::load(file.path().with_extension("missing")).unwrap_err();
    assert!(matches!(err, TlsError::Read { .. }), "{err}");
}

/// `--client-ca-file` (and `CONFIGHASH_CLIENT_CA_FILE`) is optional, and how the slots split.
#[test]
fn client_ca_file_flag_and_the_split() {
    let parse = |extra: &[&str]| match Cli::try_parse_from(
        ["confighash", "serve"].iter().chain(extra).copied(),
    )
    .unwrap()
    .command
    {
        Command::Serve(serve) => serve.client_ca_file,
        other => panic!("not serve: {other:?}"),
    };
    assert_eq!(parse(&[]), None);
    assert_eq!(
        parse(&["--client-ca-file", "/etc/ca.crt"]),
        Some("/etc/ca.crt".into())
    );
    assert_eq!(reserved_connections(1024), (512, 512));
    assert_eq!(reserved_connections(7), (3, 4));
    assert_eq!(reserved_connections(1), (1, 1));
}

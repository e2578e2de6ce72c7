//! The webhook port's bounds, over real TLS on loopback, with short limits so that every test
//! finishes in about a second: the deadline from accept to the first request head (for HTTP/1.1
//! and HTTP/2 alike, protocol detection included), the review timeout, the idle limit, HTTP/2
//! keep-alive pings and the stream cap, the connection cap, and the review memory budget.
//! Every wait polls towards a deadline; none is a fixed sleep. The server is
//! `crates/testkit/src/harness.rs`'s, the review and `read_to_close` are `crates/testkit/src/ports.rs`'s.

use crate::harness;
use crate::ports;
use crate::wait;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use confighash::cli::{Cli, Command};
use confighash::core::refs::ObjectRef;
use confighash::serving::server::Limits as ConnectionLimits;
use confighash::webhook::admission::{MAX_BODY, REVIEW_ALLOWANCE};
use confighash::webhook::budget::MemoryBudget;
use confighash::webhook::lookup::{Fetched, ObjectSource, ReadError};
use confighash::webhook::server::WebhookLimits;
use futures::future::BoxFuture;
use harness::{NoObjects, ServeSettings, Served};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame};
use hyper_util::rt::{TokioExecutor, TokioIo};
use ports::{DEADLINE, read_to_close, review};
use rustls::pki_types::ServerName;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_rustls::client::TlsStream;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const KEY: &[u8] = b"limits.rs: a key of 32 bytes!!!!";

/// WebhookLimits for tests: generous, except where a test shortens one.
fn limits() -> WebhookLimits {
    WebhookLimits {
        connections: ConnectionLimits {
            max_connections: 64,
            request_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
            http2_keep_alive_interval: Duration::from_secs(30),
            http2_keep_alive_timeout: Duration::from_secs(10),
            http2_max_concurrent_streams: 16,
            ..WebhookLimits::default().connections
        },
        review_memory: 64 * 1024 * 1024,
    }
}

/// [`limits`] with these connection bounds.
fn with_connections(connections: ConnectionLimits) -> WebhookLimits {
    WebhookLimits {
        connections,
        ..limits()
    }
}

async fn start(header_read_timeout: Duration, limits: WebhookLimits) -> Served {
    start_with_source(header_read_timeout, limits, Arc::new(NoObjects)).await
}

async fn start_with_source(
    header_read_timeout: Duration,
    limits: WebhookLimits,
    source: Arc<dyn ObjectSource>,
) -> Served {
    let webhook = harness::webhook(source, KEY).with_lookup_deadline(Duration::from_secs(2));
    harness::serve(
        webhook,
        ServeSettings {
            header_read_timeout,
            limits,
            ..ServeSettings::default()
        },
    )
    .await
}

/// What the tests below do with a server.
trait Port {
    /// An HTTP connection over TLS: HTTP/2 if `h2`, else HTTP/1.1.
    async fn http(&self, h2: bool) -> Http;
    /// Polls until the server has `n` connections open.
    async fn wait_connections(&self, n: usize);
}

impl Port for Served {
    async fn http(&self, h2: bool) -> Http {
        let alpn: &[u8] = if h2 { b"h2" } else { b"http/1.1" };
        Http::over(self.tls(&[alpn]).await).await
    }

    async fn wait_connections(&self, n: usize) {
        wait::eventually(&format!("{n} connections"), async || {
            self.running().connections() == n
        })
        .await;
    }
}

type ReqBody = BoxBody<Bytes, Infallible>;

enum Sender {
    H1(hyper::client::conn::http1::SendRequest<ReqBody>),
    H2(hyper::client::conn::http2::SendRequest<ReqBody>),
}

/// One client connection; `task` drives it and ends when the connection does.
struct Http {
    sender: Sender,
    task: JoinHandle<()>,
}

impl Http {
    async fn over(tls: TlsStream<TcpStream>) -> Self {
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        let io = TokioIo::new(tls);
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

    /// POSTs `body` to /mutate; the status and the JSON reply.
    async fn post(&mut self, body: ReqBody) -> (u16, Value) {
        let request = hyper::Request::post("https://localhost/mutate")
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(body)
            .unwrap();
        let exchange = async {
            let response = match &mut self.sender {
                Sender::H1(s) => {
                    s.ready().await.expect("a usable connection");
                    s.send_request(request).await
                }
                Sender::H2(s) => {
                    s.ready().await.expect("a usable connection");
                    s.send_request(request).await
                }
            }
            .expect("a response");
            let status = response.status().as_u16();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
        };
        tokio::time::timeout(DEADLINE, exchange)
            .await
            .expect("a response in time")
    }

    /// POSTs a review and checks that it is answered and allowed.
    async fn review(&mut self, uid: &str) {
        let (status, reply) = self.post(full(review(uid))).await;
        assert_eq!(status, 200, "{reply}");
        assert_eq!(reply["response"]["uid"], uid, "{reply}");
        assert_eq!(reply["response"]["allowed"], true, "{reply}");
    }

    /// Polls until the connection has ended; how long that took.
    async fn wait_closed(&self) -> Duration {
        wait::eventually("the server to close the connection", async || {
            self.task.is_finished()
        })
        .await
    }
}

fn full(bytes: Vec<u8>) -> ReqBody {
    Full::new(Bytes::from(bytes)).boxed()
}

/// A body that sends one byte every 50 ms, for ever.
fn trickle() -> ReqBody {
    let stream = futures::stream::unfold((), |()| async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        Some((
            Ok::<_, Infallible>(Frame::data(Bytes::from_static(b" "))),
            (),
        ))
    });
    BodyExt::boxed(StreamBody::new(stream))
}

/// Writes `head`, then one byte of body every 50 ms, until the connection fails.
async fn trickle_raw(
    mut write: impl tokio::io::AsyncWrite + Unpin,
    head: &'static [u8],
) -> std::io::Result<()> {
    write.write_all(head).await?;
    loop {
        write.write_all(b" ").await?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An HTTP/2 frame.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

const SETTINGS: u8 = 0x4;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const PING: u8 = 0x6;
const WINDOW_UPDATE: u8 = 0x8;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// An HPACK header block for `method` (static-table `:method` index: 2 GET, 3 POST) on
/// https://localhost/mutate, without Huffman coding.
fn request_headers(method: u8) -> Vec<u8> {
    let mut block = vec![0x80 | method, 0x87]; // :method, :scheme https
    block.extend_from_slice(&[0x04, 7]); // :path, literal value
    block.extend_from_slice(b"/mutate");
    block.extend_from_slice(&[0x01, 9]); // :authority, literal value
    block.extend_from_slice(b"localhost");
    block
}

/// Splits HTTP/2 frames off the front of `bytes`: (kind, flags, stream, payload).
fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
    let mut out = Vec::new();
    while bytes.len() >= 9 {
        let len = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize;
        if bytes.len() < 9 + len {
            break;
        }
        let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff;
        out.push((bytes[3], bytes[4], stream, bytes[9..9 + len].to_vec()));
        bytes = &bytes[9 + len..];
    }
    out
}

/// The value of setting `id` in a SETTINGS payload.
fn setting(payload: &[u8], id: u16) -> Option<u32> {
    payload.chunks_exact(6).find_map(|s| {
        (u16::from_be_bytes([s[0], s[1]]) == id)
            .then(|| u32::from_be_bytes([s[2], s[3], s[4], s[5]]))
    })
}

/// Reads an HTTP/1.1 response head: the status and the head's text.
async fn read_head(stream: &mut (impl AsyncRead + Unpin)) -> (u16, String) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(DEADLINE, stream.read(&mut byte))
            .await
            .expect("a response in time")
            .expect("a readable connection");
        assert!(n > 0, "closed before a response: {head:?}");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_lowercase();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    (status, head)
}

// ---------------------------------------------------------------------------------------------
// From accept to the first request head

/// A client that completes its TLS handshake and then sends nothing is disconnected once the
/// header timeout (counted from accept) has passed, whatever protocol ALPN chose: h2, http/1.1,
/// or none (then the server detects the protocol from the first bytes, which never come).
#[tokio::test]
async fn a_client_that_sends_nothing_after_the_handshake_is_cut_off() {
    let timeout = Duration::from_millis(500);
    let server = start(timeout, limits()).await;
    for alpn in [&[b"h2".as_slice()][..], &[b"http/1.1"], &[]] {
        let started = Instant::now();
        let mut tls = server.tls(alpn).await;
        let sent = read_to_close(&mut tls).await;
        let elapsed = started.elapsed();
        assert!(
            elapsed >= timeout,
            "{alpn:?}: closed after {elapsed:?}, before the header timeout"
        );
        // An HTTP/2 server may have sent its SETTINGS; no response to anything.
        assert!(!sent.starts_with(b"HTTP/"), "{alpn:?}: {sent:?}");
    }
    server.wait_connections(0).await;
}

/// A prefix of the HTTP/2 preface, the whole preface with no request after it, or one byte that
/// could still be either protocol: each is disconnected by the header timeout.
#[tokio::test]
async fn a_partial_http2_preface_or_no_request_after_it_is_cut_off() {
    let timeout = Duration::from_millis(500);
    let server = start(timeout, limits()).await;
    let whole = [PREFACE, &frame(SETTINGS, 0, 0, &[])].concat();
    // (what, ALPN offered, bytes sent)
    type Case<'a> = (&'a str, &'a [&'a [u8]], &'a [u8]);
    let cases: [Case; 5] = [
        ("half the preface, ALPN h2", &[b"h2"], &PREFACE[..16]),
        ("half the preface, no ALPN", &[], &PREFACE[..16]),
        ("one byte, no ALPN", &[], b"P"),
        ("the preface and SETTINGS, no request", &[b"h2"], &whole),
        ("the preface and SETTINGS, no ALPN", &[], &whole),
    ];
    for (name, alpn, bytes) in cases {
        let started = Instant::now();
        let mut tls = server.tls(alpn).await;
        tls.write_all(bytes).await.unwrap();
        read_to_close(&mut tls).await;
        assert!(
            started.elapsed() >= timeout,
            "{name}: closed after {:?}, before the header timeout",
            started.elapsed()
        );
    }
    server.wait_connections(0).await;
}

/// An HTTP/1.1 request head that fills the 64 KiB read buffer is refused (431) and the
/// connection closed.
#[tokio::test]
async fn an_http11_request_head_of_64_kib_is_refused() {
    let server = start(Duration::from_secs(5), limits()).await;
    let mut tls = server.tls(&[b"http/1.1"]).await;
    // Exactly 64 KiB and no end of head: the server reads all of it (so it closes without unread
    // bytes, and the answer cannot be lost to a reset) and finds no room for more.
    let mut head = b"POST /mutate HTTP/1.1\r\nhost: localhost\r\nx-filler: ".to_vec();
    head.resize(64 * 1024, b'a');
    tls.write_all(&head).await.unwrap();
    let answer = read_to_close(&mut tls).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
}

// ---------------------------------------------------------------------------------------------
// Reviews

/// A body that trickles in is cut off when the review timeout passes: 408 with a JSON error, and
/// over HTTP/1.1 the connection is closed after it (its body is unread); over HTTP/2 only the
/// stream ends, and the connection goes on serving reviews.
#[tokio::test]
async fn a_trickled_body_is_cut_off_with_408() {
    let request_timeout = Duration::from_millis(500);
    let server = start(
        Duration::from_secs(5),
        with_connections(ConnectionLimits {
            request_timeout,
            ..limits().connections
        }),
    )
    .await;

    let tls = server.tls(&[b"http/1.1"]).await;
    let (mut read, write) = tokio::io::split(tls);
    let started = Instant::now();
    let writer = tokio::spawn(trickle_raw(
        write,
        b"POST /mutate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
          content-length: 100000\r\n\r\n",
    ));
    let (status, head) = read_head(&mut read).await;
    assert_eq!(status, 408, "{head}");
    assert!(
        started.elapsed() >= request_timeout,
        "{:?}",
        started.elapsed()
    );
    assert!(head.contains("connection: close"), "{head}");
    let body = read_to_close(&mut read).await;
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("not received within"), "{body}");
    writer.abort();

    let mut h2 = server.http(true).await;
    let started = Instant::now();
    let (status, reply) = h2.post(trickle()).await;
    assert_eq!(status, 408, "{reply}");
    assert!(
        started.elapsed() >= request_timeout,
        "{:?}",
        started.elapsed()
    );
    assert!(
        reply["error"]
            .as_str()
            .unwrap()
            .contains("not received within"),
        "{reply}"
    );
    h2.review("after-a-timeout").await;
    assert_eq!(server.metrics.requests("", "", "timeout"), 2);
}

/// Every read takes longer than any test waits.
struct SlowObjects;

impl ObjectSource for SlowObjects {
    fn fetch<'a>(
        &'a self,
        _namespace: &'a str,
        _object: &'a ObjectRef,
        _budget: &'a MemoryBudget,
    ) -> BoxFuture<'a, Result<Option<Fetched>, ReadError>> {
        Box::pin(async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(None)
        })
    }
}

/// A review received in time but not answered within the review timeout (here shorter than the
/// lookup deadline) gets 503 with a JSON error.
#[tokio::test]
async fn a_review_not_answered_in_time_gets_503() {
    let request_timeout = Duration::from_millis(300);
    let server = start_with_source(
        Duration::from_secs(5),
        with_connections(ConnectionLimits {
            request_timeout,
            ..limits().connections
        }),
        Arc::new(SlowObjects),
    )
    .await;
    let mut review: Value = serde_json::from_slice(&review("slow")).unwrap();
    review["request"]["object"]["spec"]["template"]["spec"]["containers"][0]["envFrom"] =
        json!([{"configMapRef": {"name": "app-env"}}]);
    let mut http = server.http(true).await;
    let started = Instant::now();
    let (status, reply) = http.post(full(serde_json::to_vec(&review).unwrap())).await;
    assert_eq!(status, 503, "{reply}");
    assert!(
        started.elapsed() >= request_timeout,
        "{:?}",
        started.elapsed()
    );
    assert!(
        reply["error"]
            .as_str()
            .unwrap()
            .contains("not answered within"),
        "{reply}"
    );
    assert_eq!(server.metrics.requests("", "", "timeout"), 1);
}

/// Reviews go on being answered on one kept-alive connection; once it has had no request for the
/// idle limit (HTTP/2 and HTTP/1.1 alike, not the shorter header timeout), the server closes it,
/// and counts no connection error.
#[tokio::test]
async fn a_kept_alive_connection_serves_reviews_until_it_is_idle() {
    let header_timeout = Duration::from_millis(300);
    let idle_timeout = Duration::from_millis(900);
    let server = start(
        header_timeout,
        with_connections(ConnectionLimits {
            idle_timeout,
            ..limits().connections
        }),
    )
    .await;
    for h2 in [true, false] {
        let errors = server.metrics.connection_errors();
        let mut http = server.http(h2).await;
        for i in 0..3 {
            http.review(&format!("kept-alive-{h2}-{i}")).await;
        }
        assert!(
            !http.task.is_finished(),
            "h2 {h2}: still open after reviews"
        );
        let idle = http.wait_closed().await;
        assert!(
            idle >= idle_timeout / 2,
            "h2 {h2}: closed {idle:?} after the last review, limit {idle_timeout:?}"
        );
        // The server counts how a connection ended before it lets the connection go, so the
        // next round's count starts only after this one is settled.
        server.wait_connections(0).await;
        if !h2 {
            // kube-apiserver's connections to a webhook behind a Service are HTTP/1.1.
            assert_eq!(
                server.metrics.connection_errors(),
                errors,
                "an idle HTTP/1.1 connection closed is no error"
            );
        }
    }
}

/// A review whose annotation is `filler` bytes long.
fn review_with_filler(uid: &str, filler: usize) -> Vec<u8> {
    let mut review: Value = serde_json::from_slice(&review(uid)).unwrap();
    review["request"]["object"]["metadata"]["annotations"] = json!({"filler": "x".repeat(filler)});
    serde_json::to_vec(&review).unwrap()
}

/// Polls until the reviews in flight hold `bytes` of the memory budget.
async fn wait_review_memory(server: &Served, bytes: usize) {
    wait::eventually(&format!("reviews to hold {bytes} bytes"), async || {
        server.running().review_memory_in_use() == bytes
    })
    .await;
}

/// Reviews share one memory budget (here its least, two of the largest bodies and a MiB). A
/// review that finds it used up gets 503 at once; when the body holding it goes away, the same
/// review is served.
#[tokio::test]
async fn reviews_beyond_the_memory_budget_get_503() {
    let server = start(
        Duration::from_secs(5),
        WebhookLimits {
            connections: ConnectionLimits {
                request_timeout: Duration::from_secs(30),
                ..limits().connections
            },
            review_memory: 0,
        },
    )
    .await;
    // A body of 6 MiB of which 5 MiB arrive: its buffer has grown to the largest a review gets.
    let mut tls = server.tls(&[b"http/1.1"]).await;
    tls.write_all(
        format!(
            "POST /mutate HTTP/1.1\r\nhost: localhost\r\ncontent-length: {}\r\n\r\n",
            6 * 1024 * 1024
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    tls.write_all(&vec![b' '; 5 * 1024 * 1024]).await.unwrap();
    tls.flush().await.unwrap();
    wait_review_memory(&server, MAX_BODY + REVIEW_ALLOWANCE).await;

    // 4 MiB more: its buffer fits, its parsed copy does not.
    let big = review_with_filler("no-room", 4 * 1024 * 1024);
    let mut http = server.http(true).await;
    let (status, reply) = http.post(full(big.clone())).await;
    assert_eq!(status, 503, "{reply}");
    assert!(
        reply["error"].as_str().unwrap().contains("try again"),
        "{reply}"
    );
    assert_eq!(server.metrics.requests("", "", "busy"), 1);

    drop(tls);
    wait_review_memory(&server, 0).await;
    let (status, reply) = http.post(full(big)).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["response"]["allowed"], true, "{reply}");
    wait_review_memory(&server, 0).await;
}

/// A review made of so many small JSON values that parsing it would take more than the whole
/// budget (1.5 MiB of one-member objects would take some 250 MiB) is refused with 413 before it
/// is parsed.
#[tokio::test]
async fn a_review_too_dense_to_parse_within_the_budget_is_refused() {
    let server = start(Duration::from_secs(5), limits()).await;
    let values = format!("[{}{{}}]", "{\"a\":0},".repeat(192 * 1024));
    let body = String::from_utf8(review("dense")).unwrap().replacen(
        "\"spec\":{",
        &format!("\"spec\":{{\"values\":{values},"),
        1,
    );
    assert!(body.len() > 1024 * 1024 && body.len() < MAX_BODY);
    let mut http = server.http(true).await;
    let (status, reply) = http.post(full(body.into_bytes())).await;
    assert_eq!(status, 413, "{reply}");
    assert!(
        reply["error"]
            .as_str()
            .unwrap()
            .contains("too many JSON values"),
        "{reply}"
    );
    wait_review_memory(&server, 0).await;
    http.review("sparse").await;
}

// ---------------------------------------------------------------------------------------------
// HTTP/2

/// An HTTP/2 connection advertises the stream cap and refuses a stream beyond it, and offers
/// flow-control windows of 1 MiB per stream and per connection; it is pinged,
/// and a client that does not answer the ping is disconnected after the keep-alive timeout, long
/// before the idle limit.
#[tokio::test]
async fn http2_caps_streams_and_cuts_off_a_client_that_does_not_answer_pings() {
    let server = start(
        Duration::from_secs(5),
        with_connections(ConnectionLimits {
            http2_max_concurrent_streams: 3,
            http2_keep_alive_interval: Duration::from_millis(300),
            http2_keep_alive_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(30),
            ..limits().connections
        }),
    )
    .await;
    let mut tls = server.tls(&[b"h2"]).await;
    let mut hello = PREFACE.to_vec();
    hello.extend(frame(SETTINGS, 0, 0, &[]));
    // Four POSTs whose bodies never come: three streams stay open, the fourth is one too many.
    for stream in [1, 3, 5, 7] {
        hello.extend(frame(HEADERS, END_HEADERS, stream, &request_headers(3)));
    }
    tls.write_all(&hello).await.unwrap();
    let started = Instant::now();
    // From here on nothing is sent: no SETTINGS acknowledgement, no PING answer.
    let received = frames(&read_to_close(&mut tls).await);
    let elapsed = started.elapsed();

    let settings = received
        .iter()
        .find(|(kind, flags, _, _)| *kind == SETTINGS && flags & 1 == 0)
        .expect("the server's SETTINGS");
    assert_eq!(setting(&settings.3, 0x3), Some(3), "MAX_CONCURRENT_STREAMS");
    // Flow control: 1 MiB per stream, and the connection's window raised from the protocol's
    // 65535 bytes to 1 MiB, no more.
    assert_eq!(
        setting(&settings.3, 0x4),
        Some(1024 * 1024),
        "INITIAL_WINDOW_SIZE"
    );
    let connection_window: u32 = received
        .iter()
        .filter(|(kind, _, stream, _)| *kind == WINDOW_UPDATE && *stream == 0)
        .map(|(_, _, _, payload)| u32::from_be_bytes(payload[..4].try_into().unwrap()))
        .sum();
    assert_eq!(connection_window, 1024 * 1024 - 65_535, "{received:?}");
    let refused: Vec<u32> = received
        .iter()
        .filter(|(kind, _, _, payload)| *kind == RST_STREAM && payload[..] == [0, 0, 0, 7])
        .map(|(_, _, stream, _)| *stream)
        .collect();
    assert_eq!(
        refused,
        [7],
        "only the fourth stream is refused: {received:?}"
    );
    assert!(
        received
            .iter()
            .any(|(kind, flags, _, _)| *kind == PING && flags & 1 == 0),
        "the server pings: {received:?}"
    );
    assert!(
        elapsed < Duration::from_secs(5),
        "cut off by the ping timeout, not a later limit: {elapsed:?}"
    );
}

/// An HTTP/2 request head counts only once its header block is complete: HEADERS without
/// END_HEADERS, and no CONTINUATION after it, is cut off by the header timeout.
#[tokio::test]
async fn an_unfinished_http2_header_block_is_cut_off() {
    let timeout = Duration::from_millis(500);
    let server = start(timeout, limits()).await;
    let mut tls = server.tls(&[b"h2"]).await;
    let started = Instant::now();
    let mut hello = PREFACE.to_vec();
    hello.extend(frame(SETTINGS, 0, 0, &[]));
    hello.extend(frame(HEADERS, END_STREAM, 1, &request_headers(2)));
    tls.write_all(&hello).await.unwrap();
    read_to_close(&mut tls).await;
    assert!(started.elapsed() >= timeout / 2, "{:?}", started.elapsed());
}

// ---------------------------------------------------------------------------------------------
// Connections

/// With a cap of two connections, a third is not served (its TLS handshake does not even start)
/// until one of the two closes; then it is.
#[tokio::test]
async fn the_connection_cap_holds_until_a_connection_closes() {
    let server = start(
        Duration::from_secs(5),
        with_connections(ConnectionLimits {
            max_connections: 2,
            ..limits().connections
        }),
    )
    .await;
    let mut first = server.http(true).await;
    let mut second = server.http(true).await;
    first.review("first").await;
    second.review("second").await;
    server.wait_connections(2).await;

    let config = server.client_config(&[b"h2"]);
    let addr = server.addr;
    let third = tokio::spawn(async move {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        tokio_rustls::TlsConnector::from(config)
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
    });
    // Not served while both slots are taken: give it a fair chance to be (a bounded check for
    // something that must not happen, not a wait).
    wait::throughout(
        "the third connection waiting",
        Duration::from_millis(300),
        async || !third.is_finished(),
    )
    .await;
    assert_eq!(server.running().connections(), 2);
    // The cap shows in the metrics: two open, and the port filled up at least once.
    assert!(server.metrics.connection_limit_hits() >= 1);
    let text = server.metrics.encode();
    assert!(
        text.lines()
            .any(|l| l == "confighash_webhook_connections 2"),
        "{text}"
    );

    first.task.abort();
    drop(first);
    let tls = tokio::time::timeout(DEADLINE, third)
        .await
        .expect("the third connection is served once a slot is free")
        .unwrap()
        .expect("a TLS handshake");
    let mut third = Http::over(tls).await;
    third.review("third").await;
    second.review("second-again").await;
    assert_eq!(server.running().connections(), 2);
    assert!(
        server
            .metrics
            .encode()
            .lines()
            .any(|l| l == "confighash_webhook_connections 2")
    );
}

/// `--max-connections` (and `CONFIGHASH_MAX_CONNECTIONS`) defaults to 1024 and takes 1 to a
/// million.
#[test]
fn max_connections_flag() {
    let parse = |extra: &[&str]| {
        let mut args = vec!["confighash", "serve"];
        args.extend_from_slice(extra);
        Cli::try_parse_from(args).map(|cli| match cli.command {
            Command::Serve(serve) => serve.max_connections,
            other => panic!("not serve: {other:?}"),
        })
    };
    assert_eq!(parse(&[]).unwrap(), 1024);
    assert_eq!(WebhookLimits::default().connections.max_connections, 1024);
    assert_eq!(parse(&["--max-connections", "16"]).unwrap(), 16);
    for bad in ["0", "-1", "many", "1000001"] {
        assert!(parse(&["--max-connections", bad]).is_err(), "{bad}");
    }
}

/// A client that opens no stream window (`SETTINGS_INITIAL_WINDOW_SIZE` 0) and sends reviews:
/// their answers are made but cannot be sent. They stay counted in the review memory while
/// unsent, and once one has waited 2 s after it was made (or a second past the request timeout,
/// whichever comes first), the connection is closed: its streams are reset and their answers'
/// bytes given back, by that deadline plus a second. A normal review on a fresh connection is
/// answered meanwhile and after.
#[tokio::test]
async fn answers_a_client_never_reads_are_released_with_its_connection_at_the_deadline() {
    // Longer than the wait after an answer is made, which then decides.
    let request_timeout = Duration::from_secs(5);
    let server = start(
        Duration::from_secs(5),
        with_connections(ConnectionLimits {
            request_timeout,
            ..limits().connections
        }),
    )
    .await;
    let io = TokioIo::new(server.tls(&[b"h2"]).await);
    let (mut sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(0)
        .handshake::<_, ReqBody>(io)
        .await
        .expect("an HTTP/2 connection");
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let started = Instant::now();
    let mut held = Vec::new();
    for i in 0..10 {
        sender.ready().await.expect("a usable connection");
        let request = hyper::Request::post("https://localhost/mutate")
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(full(review(&format!("stuck-{i}"))))
            .unwrap();
        held.push(sender.send_request(request));
    }
    // The heads come back (HEADERS are not flow-controlled); the bodies cannot.
    let mut responses = Vec::new();
    for pending in held {
        let response = tokio::time::timeout(DEADLINE, pending)
            .await
            .expect("the answer's head in time")
            .expect("a response");
        assert_eq!(response.status(), 200);
        responses.push(response);
    }
    assert!(
        server.running().review_memory_in_use()
            >= 10 * confighash::webhook::admission::ANSWER_ALLOWANCE,
        "unsent answers stay counted: {} bytes",
        server.running().review_memory_in_use()
    );
    // Meanwhile a normal review on a fresh connection is answered.
    server.http(true).await.review("while-stuck").await;

    // Closed (its streams reset) 2 s after the answers were made, plus a second at most.
    let made_wait = Duration::from_secs(2);
    tokio::time::timeout(made_wait + Duration::from_secs(1), driver)
        .await
        .expect("the stuck connection is closed by its deadline + 1 s")
        .unwrap();
    assert!(
        started.elapsed() >= made_wait,
        "closed after {:?}, before its answers had waited 2 s",
        started.elapsed()
    );
    for response in responses {
        assert!(
            response.into_body().collect().await.is_err(),
            "an unsent answer's stream ends in an error, not in a body"
        );
    }
    assert_eq!(server.metrics.unsent_answers_closed(), 1);
    wait::eventually("the unsent answers' memory given back", async || {
        server.running().review_memory_in_use() == 0
    })
    .await;
    server.http(true).await.review("after").await;
}

/// A rapid-reset client (CVE-2023-44487): streams opened and reset at once, many times. The
/// HTTP/2 library ends such a connection (GOAWAY `ENHANCE_YOUR_CALM`); each one is counted in
/// `confighash_webhook_connection_errors_total` (its own per-connection warning is filtered out
/// of `serve`'s logs, and confighash logs these at most once a minute), and a normal review is
/// still answered.
#[tokio::test]
async fn rapid_reset_connections_are_ended_and_counted() {
    let server = start(Duration::from_secs(5), limits()).await;
    for _ in 0..3 {
        let mut tls = server.tls(&[b"h2"]).await;
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        for i in 0..200u32 {
            let stream = 2 * i + 1;
            hello.extend(frame(HEADERS, END_HEADERS, stream, &request_headers(3)));
            hello.extend(frame(RST_STREAM, 0, stream, &8u32.to_be_bytes())); // CANCEL
        }
        // The server may close before it has read all of it.
        let _ = tls.write_all(&hello).await;
        let received = frames(&read_to_close(&mut tls).await);
        let goaway = received
            .iter()
            .find(|(kind, _, _, _)| *kind == 0x7)
            .unwrap_or_else(|| panic!("no GOAWAY: {received:?}"));
        assert_eq!(
            goaway.3[4..8],
            11u32.to_be_bytes(),
            "GOAWAY ENHANCE_YOUR_CALM: {goaway:?}"
        );
    }
    wait::eventually("three connection errors counted", async || {
        server.metrics.connection_errors() >= 3
    })
    .await;
    server.http(true).await.review("after-the-resets").await;
}

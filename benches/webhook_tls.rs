//! The webhook over real TLS on 127.0.0.1, against a bare rustls + axum server that only parses
//! the review into a `serde_json::Value` and returns a fixed AdmissionReview.
//!
//! Both servers use the same certificate, the ring provider, the same ALPN (`h2`, `http/1.1`)
//! and the same hyper connection builder; the client (the stand-in API server's `HttpsClient`,
//! which trusts only the test CA) is shared by all tasks, so requests go over one kept-alive
//! HTTP/2 connection per server. Both servers and the load generator run in this process, on
//! one tokio runtime, on a shared 2-core machine: only figures measured side by side in the
//! same run are compared.
//!
//! - Closed loop: `CLIENTS` tasks send the review back to back for a fixed time, against the
//!   baseline and ours alternately (baseline, ours, baseline, ours).
//! - Open loop: `RATE` reviews/s for a fixed time, each send spawned at its scheduled time
//!   (never waiting for earlier replies); latency runs from the scheduled time to the end of the
//!   reply body, so a late sender counts against the server, not in its favour.
//!
//! `cargo bench --bench webhook_tls -- --quick` (or `CONFIGHASH_BENCH_QUICK=1`) shortens every
//! phase for a smoke run. `-- --tcp-nodelay-check` runs only a diagnostic of what Nagle's
//! algorithm costs here (see [`nodelay_check`]). Without `--bench` (as `cargo test --benches`
//! runs it) every phase runs for a fraction of a second and a failed exchange fails the run;
//! `--list` lists nothing.
//!
//! The fixture (Deployment, review body, the 10 referenced objects, the in-memory source) is the
//! one in `benches/webhook.rs`; keep the two copies the same.

use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{StatusCode, Version, header};
use axum::response::IntoResponse;
use axum::routing::post;
use confighash::certs::key::KeyStore;
use confighash::core::checksum::StampKey;
use confighash::metrics::Metrics;
use confighash::serving::health::Health;
use confighash::serving::tls::{ALPN_PROTOCOLS, CertStore};
use confighash::webhook::admission::Webhook;
use confighash::webhook::server::{self as serve, RunningWebhook, WebhookServeConfig};
use confighash_testkit::apiserver::{HttpsClient, TestCerts};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::Value;
use tokio_rustls::TlsAcceptor;

use fixture::{KEY, MemorySource, ReviewFixture};

/// Concurrent clients in the closed loop.
const CLIENTS: usize = 8;
/// Reviews per second in the open loop.
const RATE: u32 = 1_000;
/// Closed-loop target: ours at least this share of the baseline's requests/s.
const CLOSED_TARGET: f64 = 0.70;
/// Open-loop target: ours' p99 below this.
const P99_TARGET: Duration = Duration::from_millis(5);

use confighash_testkit::bench::fixture;
use confighash_testkit::bench::mode;
use mode::Mode;

/// How long each phase runs, and what to run.
struct Options {
    warm_up: Duration,
    closed: Duration,
    open: Duration,
    quick: bool,
    /// `--tcp-nodelay-check`: run only the TCP_NODELAY diagnostic ([`nodelay_check`]).
    nodelay_check: bool,
}

impl Options {
    /// Without `--bench`: every phase, each a fraction of a second.
    fn smoke() -> Self {
        Options {
            warm_up: Duration::from_millis(100),
            closed: Duration::from_millis(300),
            open: Duration::from_millis(500),
            quick: true,
            nodelay_check: false,
        }
    }

    fn from_env_and_args() -> Self {
        let quick = std::env::args().any(|a| a == "--quick")
            || std::env::var("CONFIGHASH_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        let nodelay_check = std::env::args().any(|a| a == "--tcp-nodelay-check");
        let (warm_up, closed, open) = if quick {
            (
                Duration::from_millis(300),
                Duration::from_secs(1),
                Duration::from_secs(2),
            )
        } else {
            (
                Duration::from_secs(1),
                Duration::from_secs(5),
                Duration::from_secs(10),
            )
        };
        Options {
            warm_up,
            closed,
            open,
            quick,
            nodelay_check,
        }
    }
}

/// One server under test.
struct Target {
    name: &'static str,
    url: String,
    client: HttpsClient,
}

/// The bare baseline: rustls (ring) + axum; `POST /mutate` parses the body into a `Value` and
/// returns `reply`. Counts the requests it answers, and those that came over HTTP/2.
///
/// Like ours it leaves accepted sockets as they come (Nagle's algorithm on), unless `nodelay`
/// (only for [`nodelay_check`]).
async fn start_baseline(
    certs: &TestCerts,
    reply: Bytes,
    counts: Arc<Counts>,
    nodelay: bool,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let chain = CertificateDer::pem_slice_iter(certs.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("a PEM certificate");
    let key = PrivateKeyDer::from_pem_slice(certs.key_pem.as_bytes()).expect("a PEM key");
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
    .expect("TLS versions")
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .expect("a serving configuration");
    // As ours: ALPN h2 then http/1.1, no session resumption.
    config.alpn_protocols = ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect();
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    let acceptor = TlsAcceptor::from(Arc::new(config));

    let router = axum::Router::new().route(
        "/mutate",
        post(move |version: Version, body: Bytes| {
            let reply = reply.clone();
            let counts = counts.clone();
            async move {
                counts.all.fetch_add(1, Ordering::Relaxed);
                if version == Version::HTTP_2 {
                    counts.h2.fetch_add(1, Ordering::Relaxed);
                }
                match serde_json::from_slice::<Value>(&body) {
                    Ok(review) => {
                        black_box(review);
                        ([(header::CONTENT_TYPE, "application/json")], reply).into_response()
                    }
                    Err(e) => (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("a local address");
    let task = tokio::spawn(async move {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder.http1().timer(TokioTimer::new());
        builder.http2().timer(TokioTimer::new());
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            if nodelay {
                let _ = tcp.set_nodelay(true);
            }
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
    });
    (addr, task)
}

/// Requests the baseline answered.
#[derive(Default)]
struct Counts {
    all: AtomicU64,
    h2: AtomicU64,
}

/// Checks that a target answers the review with `expected`, byte for byte.
async fn check(target: &Target, body: &[u8], expected: &[u8]) {
    let reply = target
        .client
        .post(&target.url, body.to_vec())
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", target.name));
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let review = reply.json();
    assert_eq!(
        review["response"]["allowed"], true,
        "{}: {review}",
        target.name
    );
    assert_eq!(review["response"]["uid"], fixture::UID, "{}", target.name);
    assert_eq!(
        reply.body, expected,
        "{}: a different answer than Webhook::answer's",
        target.name
    );
}

/// What a closed-loop run counted.
struct Closed {
    ok: u64,
    errors: u64,
    elapsed: Duration,
}

impl Closed {
    fn per_second(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64()
    }
}

/// `clients` tasks sending back to back for `duration`.
async fn closed_loop(
    target: &Target,
    body: &Arc<Vec<u8>>,
    duration: Duration,
    clients: usize,
) -> Closed {
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let client = target.client.clone();
            let url = target.url.clone();
            let body = body.clone();
            tokio::spawn(async move {
                let (mut ok, mut errors) = (0u64, 0u64);
                while started.elapsed() < duration {
                    match client.post(&url, body.to_vec()).await {
                        Ok(reply) if reply.status == 200 => ok += 1,
                        _ => errors += 1,
                    }
                }
                (ok, errors)
            })
        })
        .collect();
    let mut result = Closed {
        ok: 0,
        errors: 0,
        elapsed: Duration::ZERO,
    };
    for task in tasks {
        let (ok, errors) = task.await.expect("a client task");
        result.ok += ok;
        result.errors += errors;
    }
    result.elapsed = started.elapsed();
    result
}

/// What an open-loop run measured.
struct Open {
    scheduled: usize,
    ok: usize,
    errors: usize,
    /// Scheduled time to the end of the reply, successful exchanges only, sorted.
    latencies: Vec<Duration>,
    /// Scheduled time to the send being spawned, sorted: the load generator's own lateness.
    lags: Vec<Duration>,
    /// First scheduled send to the last one spawned.
    sending: Duration,
    /// First scheduled send to the last reply.
    finished: Duration,
}

impl Open {
    /// Replies per second over the whole run.
    fn throughput(&self) -> f64 {
        self.ok as f64 / self.finished.as_secs_f64()
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    // Nearest rank.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `RATE` sends per second for `duration`, each spawned at its scheduled time.
///
/// The schedule is kept by a blocking thread with `std::thread::sleep` (tens of microseconds of
/// slack on Linux) rather than a tokio timer (1 ms granularity); each send is spawned onto the
/// runtime, so the sender never waits for a reply.
async fn open_loop(target: &Target, body: &Arc<Vec<u8>>, duration: Duration) -> Open {
    let count = (u128::from(RATE) * duration.as_millis() / 1000) as usize;
    let period = Duration::from_secs(1) / RATE;
    let runtime = tokio::runtime::Handle::current();
    let client = target.client.clone();
    let url = target.url.clone();
    let body = body.clone();
    let (tasks, mut lags, start, sending) = tokio::task::spawn_blocking(move || {
        let start = Instant::now() + Duration::from_millis(5);
        let mut tasks = Vec::with_capacity(count);
        let mut lags = Vec::with_capacity(count);
        for i in 0..count {
            let at = start + period * i as u32;
            let now = Instant::now();
            if at > now {
                std::thread::sleep(at - now);
            }
            lags.push(Instant::now().saturating_duration_since(at));
            let client = client.clone();
            let url = url.clone();
            let body = body.clone();
            tasks.push(runtime.spawn(async move {
                match client.post(&url, body.to_vec()).await {
                    Ok(reply) if reply.status == 200 => Some(at.elapsed()),
                    _ => None,
                }
            }));
        }
        (
            tasks,
            lags,
            start,
            Instant::now().saturating_duration_since(start),
        )
    })
    .await
    .expect("the sender thread");
    let mut latencies = Vec::with_capacity(count);
    let mut errors = 0;
    // Every exchange is bounded by the client's own 10 s timeout.
    for task in tasks {
        match task.await.expect("a send task") {
            Some(latency) => latencies.push(latency),
            None => errors += 1,
        }
    }
    let finished = start.elapsed();
    latencies.sort_unstable();
    lags.sort_unstable();
    Open {
        scheduled: count,
        ok: latencies.len(),
        errors,
        latencies,
        lags,
        sending,
        finished,
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

fn verdict(met: bool) -> &'static str {
    if met { "MET" } else { "MISSED" }
}

/// `--tcp-nodelay-check`: how much Nagle's algorithm costs on these exchanges. Neither our
/// server nor the test client (`confighash_testkit::apiserver::HttpsClient`) sets TCP_NODELAY. This compares, side
/// by side, the baseline as measured (Nagle on, like ours), the same baseline with TCP_NODELAY
/// on its accepted sockets, and ours: closed loops of 1 and `CLIENTS` clients (3 rounds of 1 s
/// each, rotating the servers), then `RATE`/s open loops of 3 s. About 30 s.
async fn nodelay_check(
    certs: &TestCerts,
    expected: &Bytes,
    baseline: &Target,
    ours: &Target,
    body: &Arc<Vec<u8>>,
) {
    let (addr, task) =
        start_baseline(certs, expected.clone(), Arc::new(Counts::default()), true).await;
    let nodelay = Target {
        name: "baseline+nodelay",
        url: format!("https://127.0.0.1:{}/mutate", addr.port()),
        client: HttpsClient::new(&certs.ca_pem),
    };
    check(&nodelay, body, expected).await;
    let targets = [baseline, &nodelay, ours];
    println!("TCP_NODELAY check, closed loop, 1 s per run: req/s (mean ms per request)");
    println!("| clients | round | baseline | baseline+nodelay | ours |\n|---|---|---|---|---|");
    for clients in [1, CLIENTS] {
        for round in 1..=3 {
            let mut cells = Vec::new();
            for target in targets {
                let r = closed_loop(target, body, Duration::from_secs(1), clients).await;
                let mean = clients as f64 / r.per_second() * 1000.0;
                cells.push(format!(
                    "{:.1} ({mean:.2}){}",
                    r.per_second(),
                    if r.errors > 0 { " ERRORS" } else { "" }
                ));
            }
            println!("| {clients} | {round} | {} |", cells.join(" | "));
        }
    }
    println!("TCP_NODELAY check, open loop {RATE}/s for 3 s (ms from the scheduled send)");
    println!("| server | ok | errors | p50 | p90 | p99 | max |\n|---|---|---|---|---|---|---|");
    for target in targets {
        let r = open_loop(target, body, Duration::from_secs(3)).await;
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            target.name,
            r.ok,
            r.errors,
            ms(percentile(&r.latencies, 50.0)),
            ms(percentile(&r.latencies, 90.0)),
            ms(percentile(&r.latencies, 99.0)),
            ms(r.latencies.last().copied().unwrap_or_default()),
        );
    }
    drop(nodelay);
    task.abort();
}

/// Runs the phases and prints the report; the number of failed exchanges.
async fn run(options: Options) -> u64 {
    fixture::check_references();
    let review = fixture::review(&fixture::stale_stamp());
    let ReviewFixture { body, object_len } = review;

    // Ours: the real server, on a fresh key store and the in-memory source.
    let certs = TestCerts::generate();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let cert_path = dir.path().join("tls.crt");
    let key_path = dir.path().join("tls.key");
    std::fs::write(&cert_path, &certs.cert_pem).expect("write tls.crt");
    std::fs::write(&key_path, &certs.key_pem).expect("write tls.key");
    let webhook = Arc::new(
        Webhook::new(
            Arc::new(MemorySource::new()),
            Arc::new(KeyStore::new(
                StampKey::new(KEY.to_vec()).expect("a long enough key"),
            )),
            Arc::new(Metrics::new()),
        )
        .with_lookup_deadline(Duration::from_secs(2)),
    );
    // The answer both servers must send: the handler's own, serialised as axum's Json does.
    let expected = webhook.answer(&body).await.expect("a review");
    assert_eq!(expected["response"]["allowed"], true, "{expected}");
    assert!(
        fixture::patched_stamp(&expected).is_some(),
        "the stale stamp is replaced: {expected}"
    );
    let expected = Bytes::from(serde_json::to_vec(&expected).expect("JSON"));
    let running: RunningWebhook = serve::start(WebhookServeConfig {
        listen: "127.0.0.1:0".parse().expect("an address"),
        admin_listen: "127.0.0.1:0".parse().expect("an address"),
        certs: CertStore::load(&cert_path, &key_path).expect("the serving pair"),
        client_ca: None,
        webhook,
        health: Arc::new(Health::default()),
        cert_poll: Duration::from_secs(60),
        header_read_timeout: Duration::from_secs(10),
        drain_timeout: Duration::from_secs(5),
    })
    .await
    .expect("our server starts");

    let counts = Arc::new(Counts::default());
    let (baseline_addr, baseline_task) =
        start_baseline(&certs, expected.clone(), counts.clone(), false).await;

    let baseline = Target {
        name: "baseline",
        url: format!("https://127.0.0.1:{}/mutate", baseline_addr.port()),
        client: HttpsClient::new(&certs.ca_pem),
    };
    let ours = Target {
        name: "ours",
        url: format!("https://127.0.0.1:{}/mutate", running.webhook_addr.port()),
        client: HttpsClient::new(&certs.ca_pem),
    };
    check(&baseline, &body, &expected).await;
    check(&ours, &body, &expected).await;
    let body = Arc::new(body);

    if options.nodelay_check {
        nodelay_check(&certs, &expected, &baseline, &ours, &body).await;
        drop(baseline);
        drop(ours);
        running.shutdown().await;
        baseline_task.abort();
        return 0;
    }

    println!(
        "webhook_tls{}: review body {} bytes (object {} bytes, {} references), \
         {CLIENTS} closed-loop clients, open loop {RATE}/s",
        if options.quick { " (quick)" } else { "" },
        body.len(),
        object_len,
        fixture::REFERENCES,
    );

    // Warm-up: connections, allocator, caches.
    for target in [&baseline, &ours] {
        closed_loop(target, &body, options.warm_up, CLIENTS).await;
    }

    // (a) Closed loop, ABAB.
    let mut closed = Vec::new();
    for target in [&baseline, &ours, &baseline, &ours] {
        let result = closed_loop(target, &body, options.closed, CLIENTS).await;
        println!(
            "  closed {:<8} {:>7} ok {:>3} errors in {:.2} s: {:>8.1} req/s",
            target.name,
            result.ok,
            result.errors,
            result.elapsed.as_secs_f64(),
            result.per_second()
        );
        closed.push((target.name, result));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // (b) Open loop: the baseline, then ours.
    let mut open = Vec::new();
    for target in [&baseline, &ours] {
        let result = open_loop(target, &body, options.open).await;
        println!(
            "  open   {:<8} {:>7} ok {:>3} errors, p99 {} ms",
            target.name,
            result.ok,
            result.errors,
            ms(percentile(&result.latencies, 99.0))
        );
        open.push((target.name, result));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let baseline_requests = counts.all.load(Ordering::Relaxed);
    let h2 = counts.h2.load(Ordering::Relaxed);

    drop(baseline);
    drop(ours);
    running.shutdown().await;
    baseline_task.abort();

    // Summary.
    println!();
    println!(
        "(a) closed loop: {CLIENTS} clients, {:.0} s per run, alternating baseline/ours",
        options.closed.as_secs_f64()
    );
    println!(
        "| run | server   | ok      | errors | seconds | req/s    |\n|-----|----------|---------|--------|---------|----------|"
    );
    for (i, (name, r)) in closed.iter().enumerate() {
        println!(
            "| {:<3} | {:<8} | {:>7} | {:>6} | {:>7.2} | {:>8.1} |",
            i + 1,
            name,
            r.ok,
            r.errors,
            r.elapsed.as_secs_f64(),
            r.per_second()
        );
    }
    let rate = |name: &str| {
        let (ok, secs) = closed
            .iter()
            .filter(|(n, _)| *n == name)
            .fold((0u64, 0f64), |(ok, s), (_, r)| {
                (ok + r.ok, s + r.elapsed.as_secs_f64())
            });
        ok as f64 / secs
    };
    let pair = |i: usize| closed[i + 1].1.per_second() / closed[i].1.per_second();
    let ratio = rate("ours") / rate("baseline");
    let closed_errors: u64 = closed.iter().map(|(_, r)| r.errors).sum();
    println!(
        "ours/baseline: pair 1 {:.1} %, pair 2 {:.1} %, overall {:.1} % ({:.1} vs {:.1} req/s); \
         target >= {:.0} %: {}; failed exchanges: {closed_errors}",
        pair(0) * 100.0,
        pair(2) * 100.0,
        ratio * 100.0,
        rate("ours"),
        rate("baseline"),
        CLOSED_TARGET * 100.0,
        verdict(ratio >= CLOSED_TARGET)
    );
    println!(
        "protocol: {h2} of the {baseline_requests} requests the baseline answered came over HTTP/2 \
         (same client and ALPN for ours)"
    );

    println!();
    println!(
        "(b) open loop: {RATE} reviews/s for {:.0} s; latency from the scheduled send to the end of the reply (ms)",
        options.open.as_secs_f64()
    );
    println!(
        "| server   | scheduled | ok    | errors | p50   | p90   | p99   | max    | sender lag p50/p99 | sending s | replies/s |\n|----------|-----------|-------|--------|-------|-------|-------|--------|--------------------|-----------|-----------|"
    );
    for (name, r) in &open {
        println!(
            "| {:<8} | {:>9} | {:>5} | {:>6} | {:>5} | {:>5} | {:>5} | {:>6} | {:>18} | {:>9.2} | {:>9.1} |",
            name,
            r.scheduled,
            r.ok,
            r.errors,
            ms(percentile(&r.latencies, 50.0)),
            ms(percentile(&r.latencies, 90.0)),
            ms(percentile(&r.latencies, 99.0)),
            ms(r.latencies.last().copied().unwrap_or_default()),
            format!(
                "{} / {}",
                ms(percentile(&r.lags, 50.0)),
                ms(percentile(&r.lags, 99.0))
            ),
            r.sending.as_secs_f64(),
            r.throughput()
        );
    }
    let ours_open = &open[1].1;
    let p99 = percentile(&ours_open.latencies, 99.0);
    let open_errors: usize = open.iter().map(|(_, r)| r.errors).sum();
    println!(
        "ours p99 {} ms vs baseline p99 {} ms; target p99 < {} ms: {}; failed exchanges: {open_errors}",
        ms(p99),
        ms(percentile(&open[0].1.latencies, 99.0)),
        P99_TARGET.as_millis(),
        verdict(p99 < P99_TARGET && ours_open.errors == 0)
    );
    if closed_errors > 0 || open_errors > 0 {
        println!("FAILED EXCHANGES: {}", closed_errors + open_errors as u64);
    }
    closed_errors + open_errors as u64
}

fn main() {
    let mode = mode::from_args();
    let options = match mode {
        Mode::Full => Options::from_env_and_args(),
        Mode::Smoke => Options::smoke(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let started = Instant::now();
    let failed = runtime.block_on(run(options));
    runtime.shutdown_timeout(Duration::from_secs(2));
    println!("total {:.1} s", started.elapsed().as_secs_f64());
    if mode == Mode::Smoke && failed > 0 {
        eprintln!("webhook_tls FAILED: {failed} failed exchanges");
        std::process::exit(1);
    }
}

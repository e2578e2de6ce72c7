//! The admin port's bounds (`/livez`, `/readyz`, `/metrics` over plain HTTP): a header timeout
//! and an idle timeout, and a small connection cap at which the oldest connection makes room,
//! so kubelet's probes are answered whatever other clients do; and, with the real binary under a
//! small open-file limit, that a flood of the admin port leaves the webhook's accept working.
//! Every wait polls towards a deadline; none is a fixed sleep.

use crate::ports;
use crate::process;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use confighash::serving::server::{AdminLimits, Limits as ConnectionLimits};
use confighash::webhook::server::WebhookLimits;
use confighash_testkit::apiserver::ApiServer;
use ports::{DEADLINE, Http, closed_within, open_silent, probe, read_to_close};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Webhook limits as `serve` has them, with these admin limits.
fn limits(admin: AdminLimits) -> WebhookLimits {
    WebhookLimits {
        connections: ConnectionLimits {
            admin,
            ..WebhookLimits::default().connections
        },
        ..WebhookLimits::default()
    }
}

/// A probe's answer must come within kubelet's default `timeoutSeconds`.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

async fn probe_ok(addr: SocketAddr, path: &str) -> Duration {
    let (status, body, took) = probe(addr, path).await.expect("an answer");
    assert_eq!((status, body.as_str()), (200, "ok\n"), "{path}");
    assert!(took < PROBE_TIMEOUT, "{path} took {took:?}");
    took
}

/// Idle connections, connections that stop inside their request head (HTTP/1.1, or HTTP/2 with
/// prior knowledge after the preface) are closed once the header timeout has passed from
/// accept, and `/livez` and `/readyz` answer while they are open.
#[tokio::test]
async fn idle_and_partial_header_connections_are_closed_within_the_header_timeout() {
    let timeout = Duration::from_millis(500);
    let server = ports::start(
        limits(AdminLimits {
            max_connections: 64,
            header_read_timeout: timeout,
            idle_timeout: Duration::from_secs(30),
        }),
        Duration::from_secs(10),
        None,
    )
    .await;
    let addr = server.running.admin_addr;
    let started = Instant::now();
    let mut open = Vec::new();
    for bytes in [
        &b""[..],
        b"GET /livez HTTP/1.1\r\nHost: x\r\n",
        b"GET /metr",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    ] {
        open.extend(open_silent(addr, 10, bytes).await);
    }
    server.wait_admin_connections(40).await;
    probe_ok(addr, "/livez").await;
    probe_ok(addr, "/readyz").await;
    for (i, tcp) in open.iter_mut().enumerate() {
        read_to_close(tcp).await;
        let elapsed = started.elapsed();
        assert!(
            elapsed >= timeout && elapsed < timeout + Duration::from_secs(3),
            "connection {i} closed after {elapsed:?}, timeout {timeout:?}"
        );
    }
    server.wait_admin_connections(0).await;
}

/// A kept-alive connection is closed once idle, gracefully: HTTP/1.1 and HTTP/2 alike after the
/// idle timeout (not the shorter header timeout, which bounds only the first request head).
#[tokio::test]
async fn a_kept_alive_connection_is_closed_once_idle() {
    let header_read_timeout = Duration::from_millis(400);
    let idle_timeout = Duration::from_millis(600);
    let server = ports::start(
        limits(AdminLimits {
            max_connections: 64,
            header_read_timeout,
            idle_timeout,
        }),
        Duration::from_secs(10),
        None,
    )
    .await;
    for h2 in [false, true] {
        let tcp = TcpStream::connect(server.running.admin_addr).await.unwrap();
        let mut http = Http::over(tcp, h2).await;
        for path in ["/livez", "/readyz", "/metrics"] {
            let (status, _) = http.send("GET", path, Vec::new()).await.unwrap();
            assert_eq!(status, 200, "h2 {h2}: {path}");
        }
        let idle = http.wait_closed().await;
        assert!(
            idle > header_read_timeout && idle < idle_timeout + Duration::from_secs(3),
            "h2 {h2}: closed {idle:?} after the last request, idle limit {idle_timeout:?}"
        );
    }
    server.wait_admin_connections(0).await;
}

/// At the cap every new connection is still accepted, and the oldest one is closed to make room:
/// a flood of 300 connections that send nothing (their header timeout far away) leaves the
/// port holding at most its cap, and probes are answered at once all along.
#[tokio::test]
async fn at_the_cap_the_oldest_connection_makes_room_and_probes_are_answered() {
    let cap = 8;
    let server = ports::start(
        limits(AdminLimits {
            max_connections: cap,
            header_read_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(60),
        }),
        Duration::from_secs(10),
        None,
    )
    .await;
    let addr = server.running.admin_addr;
    let mut first = open_silent(addr, cap, b"GET /livez HTTP/1.1\r\n").await;
    server.wait_admin_connections(cap).await;
    // Nothing has to make room yet.
    for tcp in &mut first {
        assert!(!closed_within(tcp, Duration::from_millis(1)).await);
    }

    // One probe makes room by closing the oldest connection, and is answered.
    probe_ok(addr, "/livez").await;
    assert!(closed_within(&mut first[0], DEADLINE).await);
    server.wait_admin_connections(cap - 1).await;

    let mut flood = Vec::new();
    let mut slowest = Duration::ZERO;
    for round in 0..10 {
        flood.extend(open_silent(addr, 30, b"").await);
        let took = probe_ok(addr, "/livez").await;
        slowest = slowest.max(took);
        assert!(
            server.running.admin_connections() <= cap + 1,
            "round {round}: {} admin connections, cap {cap}",
            server.running.admin_connections()
        );
    }
    // Everything from before the flood has been closed to make room, and all but the newest of
    // the flood too.
    for (i, tcp) in first.iter_mut().enumerate() {
        assert!(closed_within(tcp, DEADLINE).await, "connection {i}");
    }
    let closed = {
        let mut closed = 0;
        for tcp in &mut flood {
            if closed_within(tcp, Duration::from_millis(1)).await {
                closed += 1;
            }
        }
        closed
    };
    assert!(
        closed >= flood.len() - cap,
        "{closed} of {} closed",
        flood.len()
    );
    assert!(server.running.admin_connections() <= cap);
    eprintln!("slowest probe under the flood: {slowest:?}");
}

// ---------------------------------------------------------------------------------------------
// The binary under a small open-file limit

/// `confighash serve` started with a soft open-file limit of 256 and a hard one of 512 (as a
/// container runtime might set them) raises the soft limit to 512, lowers `--max-connections`
/// from its default 1024 to fit (512 - 64 admin - 1 - 256 reserved - 1 = 190), and when 1,000
/// connections flood the admin port (idle ones and ones stopped inside a request head) it keeps
/// at most 64 of them, its accept keeps working on both ports: a review over TLS and `/livez` are
/// answered meanwhile, and the process never holds more file descriptors than the limit allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_accepts_while_the_admin_port_is_flooded() {
    let api = ApiServer::start().await;
    let serve = process::start(Path::new(env!("CARGO_BIN_EXE_confighash")), &api, 256, 512).await;
    let logs = serve.logs.clone();
    let raised = logs
        .wait_for("raised the open-file limit to the hard limit")
        .await;
    assert_eq!(raised["fields"]["before"], 256, "{raised}");
    assert_eq!(raised["fields"]["soft"], 512, "{raised}");
    let lowered = logs
        .wait_for("--max-connections does not fit under the open-file limit; lowered")
        .await;
    assert_eq!(lowered["fields"]["requested"], 1024, "{lowered}");
    assert_eq!(lowered["fields"]["max_connections"], 190, "{lowered}");
    let (webhook, admin) = (serve.webhook, serve.admin);

    // The flood: half idle, half stopped inside a request head; far more than the 512 files
    // the process may have.
    let mut flood = open_silent(admin, 500, b"").await;
    flood.extend(open_silent(admin, 500, b"GET /livez HTTP/1.1\r\nHost: x\r\n").await);
    let files_under_flood = serve.open_files();
    assert!(
        files_under_flood < 512,
        "the process holds {files_under_flood} files"
    );

    // The webhook still accepts, handshakes and answers.
    let config = ports::client_config(&serve.ca_pem, &[b"h2"], None);
    let started = Instant::now();
    let tls = ports::tls(webhook, config).await.expect("a TLS handshake");
    let mut http = Http::over(tls, true).await;
    http.review("during-the-flood").await;
    let review_took = started.elapsed();
    // And so does the admin port.
    let (status, _, livez_took) = probe(admin, "/livez").await.expect("/livez answers");
    assert_eq!(status, 200);
    assert!(livez_took < PROBE_TIMEOUT, "{livez_took:?}");
    // Most of the flood was closed to make room.
    let mut closed = 0;
    for tcp in &mut flood {
        if closed_within(tcp, Duration::from_millis(1)).await {
            closed += 1;
        }
    }
    assert!(
        closed >= flood.len() - 64,
        "{closed} of {} closed",
        flood.len()
    );
    eprintln!(
        "files: {files_under_flood} under the flood; review {review_took:?}, /livez {livez_took:?}; {closed} of {} flood connections closed",
        flood.len()
    );
    drop(flood);

    let logs = serve.stop().await;
    let warnings: Vec<_> = logs
        .lines()
        .into_iter()
        .filter(|l| l["fields"]["message"] == "accept failed")
        .collect();
    assert!(warnings.is_empty(), "{warnings:#?}");
}

/// The admin port's defaults: 64 connections, a 5 s header timeout, 30 s idle.
#[test]
fn admin_defaults() {
    let admin = WebhookLimits::default().connections.admin;
    assert_eq!(admin.max_connections, 64);
    assert_eq!(admin.header_read_timeout, Duration::from_secs(5));
    assert_eq!(admin.idle_timeout, Duration::from_secs(30));
}

/// `serve` listens on `[::]` by default, on both stacks: the webhook and the admin port at the
/// default addresses (on free ports) accept clients on 127.0.0.1 and, where the host has IPv6,
/// on ::1.
#[tokio::test]
async fn the_default_addresses_accept_ipv4_and_ipv6_clients() {
    use clap::Parser;
    use confighash::cli::{Cli, Command};
    let Command::Serve(args) = Cli::try_parse_from(["confighash", "serve"])
        .unwrap()
        .command
    else {
        panic!("not serve");
    };
    assert_eq!(args.listen, "[::]:8443".parse::<SocketAddr>().unwrap());
    assert_eq!(
        args.admin_listen,
        "[::]:8080".parse::<SocketAddr>().unwrap()
    );
    let server = ports::start_at(
        SocketAddr::new(args.listen.ip(), 0),
        SocketAddr::new(args.admin_listen.ip(), 0),
        WebhookLimits::default(),
        Duration::from_secs(10),
        None,
        Duration::from_secs(60),
    )
    .await;
    let mut clients = vec![IpAddr::from(Ipv4Addr::LOCALHOST)];
    if std::net::TcpListener::bind((Ipv6Addr::LOCALHOST, 0)).is_ok() {
        clients.push(IpAddr::from(Ipv6Addr::LOCALHOST));
    } else {
        eprintln!("this host has no IPv6: IPv4 clients only");
    }
    for ip in clients {
        probe_ok(
            SocketAddr::new(ip, server.running.admin_addr.port()),
            "/livez",
        )
        .await;
        let webhook = SocketAddr::new(ip, server.running.webhook_addr.port());
        let config = ports::client_config(&server.ca_pem, &[b"h2"], None);
        let tls = ports::tls(webhook, config)
            .await
            .unwrap_or_else(|e| panic!("a TLS handshake on {webhook}: {e}"));
        Http::over(tls, true)
            .await
            .review(&format!("from-{ip}"))
            .await;
    }
}

/// `serve::listen` on `[::]` takes IPv4 clients too (IPV6_V6ONLY off), as IPv4 addresses do.
#[tokio::test]
async fn listen_takes_ipv4_clients_on_the_unspecified_ipv6_address() {
    for addr in ["[::]:0", "0.0.0.0:0", "127.0.0.1:0"] {
        let listener = confighash::serving::server::listen(addr.parse().unwrap()).unwrap();
        let local = listener.local_addr().unwrap();
        if local.is_ipv6() {
            // Whatever the host's net.ipv6.bindv6only says.
            assert!(!socket2::SockRef::from(&listener).only_v6().unwrap());
        }
        let port = local.port();
        let (client, accepted) = tokio::join!(
            TcpStream::connect((Ipv4Addr::LOCALHOST, port)),
            listener.accept()
        );
        client.unwrap_or_else(|e| panic!("{addr}: {e}"));
        let (_, peer) = accepted.unwrap();
        assert_eq!(
            peer.ip().to_canonical(),
            IpAddr::from(Ipv4Addr::LOCALHOST),
            "{addr}"
        );
    }
}

/// A scrape of the admin port right after start has the build information and every series
/// whose labels are known in advance, at 0, so alerts on `increase()` see the first one counted.
#[tokio::test]
async fn a_scrape_right_after_start_shows_the_build_and_every_known_series_at_zero() {
    let server = ports::start(WebhookLimits::default(), Duration::from_secs(10), None).await;
    let (status, body, _) = probe(server.running.admin_addr, "/metrics")
        .await
        .expect("an answer");
    assert_eq!(status, 200);
    let value = |series: &str| -> Option<f64> {
        body.lines().find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok())?
        })
    };
    assert_eq!(
        value(&format!(
            "confighash_build_info{{version=\"{}\"}}",
            env!("CARGO_PKG_VERSION")
        )),
        Some(1.0),
        "{body}"
    );
    let mut zero = vec![
        "confighash_workloads_bypassed_total".to_owned(),
        "confighash_touch_retries_total".to_owned(),
        "confighash_webhook_requests_total{kind=\"\",operation=\"\",outcome=\"busy\"}".to_owned(),
        "confighash_webhook_requests_total{kind=\"\",operation=\"\",outcome=\"timeout\"}".to_owned(),
        "confighash_webhook_requests_total{kind=\"Deployment\",operation=\"UPDATE\",outcome=\"stamped\"}"
            .to_owned(),
        "confighash_webhook_requests_total{kind=\"Rollout\",operation=\"CREATE\",outcome=\"kept-on-error\"}"
            .to_owned(),
    ];
    for outcome in ["touched", "kept-by-webhook", "error", "gone"] {
        zero.push(format!("confighash_touches_total{{outcome=\"{outcome}\"}}"));
    }
    for outcome in ["found", "absent", "error", "deadline"] {
        zero.push(format!(
            "confighash_webhook_lookups_total{{kind=\"Secret\",outcome=\"{outcome}\"}}"
        ));
    }
    for kind in ["ConfigMap", "Secret"] {
        zero.push(format!(
            "confighash_config_changes_total{{kind=\"{kind}\"}}"
        ));
    }
    for series in &zero {
        assert_eq!(value(series), Some(0.0), "{series} in\n{body}");
    }
}

//! Admin-port flood: what idle and partial-header connections to the plain-HTTP admin port
//! (`/livez`, `/readyz`, `/metrics`) can hold, measured on the real binary.
//!
//! Runs `confighash serve` (the binary of this build, or `CONFIGHASH_BIN`, e.g. one built from
//! an older commit) against the in-memory API server, with its open-file limit set to a soft
//! and hard 1,024 (`CONFIGHASH_NOFILE`), and measures:
//!
//! 1. how long an idle connection, and one stopped inside its request head, stay open (up to
//!    `CONFIGHASH_HOLD_SECS`, 100 s);
//! 2. in a second process: how many of 1,010 idle connections the process holds (its open file
//!    descriptors, and how many of the connections are still open a second later), whether the
//!    webhook then still completes a TLS handshake and answers a review, and whether `/livez`
//!    answers within kubelet's 1 s probe timeout; and whether the process logged a failed accept.
//!
//! `cargo bench --bench admin_flood`. Prints a Markdown table. Without `--bench` (as `cargo test
//! --benches` runs it): 100 connections, a 7 s hold, and the outcome asserted (both single
//! connections closed by the header timeout, at most 64 of the flood open, the review and
//! `/livez` answered, no failed accept); `--list` lists nothing.

use confighash_testkit::bench::mode;
use confighash_testkit::ports;
use confighash_testkit::process;

use std::path::PathBuf;
use std::time::Duration;

use confighash_testkit::apiserver::ApiServer;
use mode::Mode;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// How long `tcp` stays open, up to `hold`: `None` if still open then.
async fn open_for(mut tcp: TcpStream, hold: Duration) -> Option<Duration> {
    let started = Instant::now();
    ports::closed_within(&mut tcp, hold)
        .await
        .then(|| started.elapsed())
}

fn show(d: Option<Duration>, hold: Duration) -> String {
    match d {
        Some(d) => format!("closed after {:.2} s", d.as_secs_f64()),
        None => format!("still open after {} s", hold.as_secs()),
    }
}

/// What a run floods and for how long it watches.
struct Sizes {
    /// The process's soft and hard open-file limit.
    nofile: u64,
    /// How long the two single connections are watched.
    hold: Duration,
    /// Idle connections opened against the second process.
    flood: usize,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mode = mode::from_args();
    let bin: PathBuf = std::env::var_os("CONFIGHASH_BIN")
        .map(Into::into)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_confighash").into());
    let env_u64 = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let Sizes {
        nofile,
        hold,
        flood,
    } = match mode {
        Mode::Full => Sizes {
            nofile: env_u64("CONFIGHASH_NOFILE", 1024),
            hold: Duration::from_secs(env_u64("CONFIGHASH_HOLD_SECS", 100)),
            flood: env_u64("CONFIGHASH_FLOOD", 1010) as usize,
        },
        // Past the admin port's 64 connections and its 5 s header timeout, no further.
        Mode::Smoke => Sizes {
            nofile: 1024,
            hold: Duration::from_secs(7),
            flood: 100,
        },
    };
    let api = ApiServer::start().await;

    // 1. Lifetimes of an idle and a partial-header connection.
    let timing = process::start(&bin, &api, nofile, nofile).await;
    let idle = TcpStream::connect(timing.admin).await.unwrap();
    let partial = ports::open_silent(timing.admin, 1, b"GET /livez HTTP/1.1\r\nHost: x\r\n")
        .await
        .remove(0);
    let lifetimes =
        tokio::spawn(async move { tokio::join!(open_for(idle, hold), open_for(partial, hold)) });

    // 2. A flood, in a second process.
    let flooded = process::start(&bin, &api, nofile, nofile).await;
    let files_before = flooded.open_files();
    let mut conns = Vec::new();
    let mut refused = 0;
    for _ in 0..flood {
        match tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(flooded.admin)).await
        {
            Ok(Ok(tcp)) => conns.push(tcp),
            _ => refused += 1,
        }
    }
    let settle = Instant::now() + Duration::from_secs(1);
    while Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let files_flooded = flooded.open_files();
    let mut still_open = 0;
    for tcp in &mut conns {
        if !ports::closed_within(tcp, Duration::from_millis(1)).await {
            still_open += 1;
        }
    }
    let started = Instant::now();
    let review = async {
        let config = ports::client_config(&flooded.ca_pem, &[b"h2"], None);
        let tls = ports::tls(flooded.webhook, config)
            .await
            .map_err(|e| e.to_string())?;
        let mut http = ports::Http::over(tls, true).await;
        let (status, _) = http.send("POST", "/mutate", ports::review("flood")).await?;
        Ok::<_, String>(status)
    };
    let review = match tokio::time::timeout(Duration::from_secs(5), review).await {
        Ok(Ok(status)) => Ok((status, started.elapsed())),
        Ok(Err(e)) => Err(format!("failed: {e}")),
        Err(_) => Err("no answer within 5 s".to_owned()),
    };
    let livez = match tokio::time::timeout(
        Duration::from_secs(1),
        ports::probe(flooded.admin, "/livez"),
    )
    .await
    {
        Ok(Ok((status, _, took))) => Ok((status, took)),
        Ok(Err(e)) => Err(format!("failed: {e}")),
        Err(_) => Err("no answer within 1 s (a failed probe)".to_owned()),
    };
    let accept_failed = flooded.logs.count("accept failed");
    drop(conns);

    let (idle, partial) = lifetimes.await.unwrap();
    let answered = |r: &Result<(u16, Duration), String>| match r {
        Ok((status, took)) => format!("{status} after {:.1} ms", took.as_secs_f64() * 1e3),
        Err(e) => e.clone(),
    };
    println!("binary: {}", bin.display());
    println!("open-file limit: soft and hard {nofile}\n");
    println!("| measurement | result |");
    println!("|---|---|");
    println!("| idle admin connection | {} |", show(idle, hold));
    println!(
        "| admin connection stopped inside its request head | {} |",
        show(partial, hold)
    );
    println!("| {flood} idle admin connections: connects refused or timed out | {refused} |");
    println!("| ... still open 1 s later | {still_open} |");
    println!(
        "| ... the process's open files (before the flood: {files_before}) | {files_flooded} |"
    );
    println!(
        "| ... a new webhook connection: TLS handshake and review | {} |",
        answered(&review)
    );
    println!(
        "| ... `/livez` on a new connection | {} |",
        answered(&livez)
    );
    println!("| ... `accept failed` log lines | {accept_failed} |");
    timing.stop().await;
    flooded.stop().await;

    if mode == Mode::Smoke {
        // The admin port's bounds, as tests/webhook/admin_port.rs states them, at the smoke run's sizes.
        let mut failures = Vec::new();
        if idle.is_none() || partial.is_none() {
            failures.push(format!(
                "the header timeout closed neither connection within {hold:?}: {idle:?}, {partial:?}"
            ));
        }
        if still_open > 64 {
            failures.push(format!("{still_open} flood connections still open"));
        }
        if !matches!(review, Ok((200, _))) || !matches!(livez, Ok((200, _))) {
            failures.push(format!("review {review:?}, /livez {livez:?}"));
        }
        if accept_failed > 0 {
            failures.push(format!("{accept_failed} accept failures"));
        }
        if !failures.is_empty() {
            eprintln!("admin_flood FAILED: {}", failures.join("; "));
            std::process::exit(1);
        }
        println!(
            "admin_flood: smoke run held (run `cargo bench --bench admin_flood` for the figures)"
        );
    }
}

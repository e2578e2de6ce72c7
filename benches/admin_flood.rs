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
//! `cargo bench --bench admin_flood`. Prints a Markdown table.

#[path = "../tests/common/ports.rs"]
mod ports;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use apiserver::{ApiServer, TestCa};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::time::Instant;

struct Serve {
    child: tokio::process::Child,
    logs: Arc<Mutex<Vec<String>>>,
    webhook: SocketAddr,
    admin: SocketAddr,
    ca_pem: String,
    _dir: tempfile::TempDir,
}

impl Serve {
    fn pid(&self) -> u32 {
        self.child.id().unwrap()
    }

    fn open_files(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    fn logged(&self, message: &str) -> usize {
        self.logs
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(message))
            .count()
    }
}

async fn serve(bin: &Path, api: &ApiServer, nofile: u64) -> Serve {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("admin_flood CA");
    let pair = ca.issue(&["localhost", "127.0.0.1"]);
    let path = |name: &str| dir.path().join(name);
    std::fs::write(path("tls.crt"), &pair.cert_pem).unwrap();
    std::fs::write(path("tls.key"), &pair.key_pem).unwrap();
    std::fs::write(path("hmac.key"), b"admin_flood.rs: 32 bytes of key!").unwrap();
    std::fs::write(
        path("kubeconfig"),
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: s\n  cluster:\n    server: {}\n\
             users:\n- name: a\n  user: {{}}\ncontexts:\n- name: s\n  context:\n    cluster: s\n    \
             user: a\n    namespace: confighash\ncurrent-context: s\n",
            api.url()
        ),
    )
    .unwrap();
    let mut command = tokio::process::Command::new(bin);
    command
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .arg("--tls-cert")
        .arg(path("tls.crt"))
        .arg("--tls-key")
        .arg(path("tls.key"))
        .arg("--key-file")
        .arg(path("hmac.key"))
        .args(["--leader-elect", "false", "--log-format", "json"])
        .env("KUBECONFIG", path("kubeconfig"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // SAFETY: setrlimit is async-signal-safe, and the closure touches nothing else.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: nofile,
                rlim_max: nofile,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().expect("confighash serve");
    let logs = Arc::new(Mutex::new(Vec::new()));
    let stderr = child.stderr.take().unwrap().into_owned_fd().unwrap();
    {
        let logs = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(std::fs::File::from(stderr)).lines() {
                let Ok(line) = line else { break };
                logs.lock().unwrap().push(line);
            }
        });
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let serving: Value = loop {
        let found = logs
            .lock()
            .unwrap()
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|l| l["fields"]["message"] == "serving");
        if let Some(line) = found {
            break line;
        }
        assert!(Instant::now() < deadline, "{:#?}", logs.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let addr = |f: &str| serving["fields"][f].as_str().unwrap().parse().unwrap();
    Serve {
        child,
        logs,
        webhook: addr("webhook"),
        admin: addr("admin"),
        ca_pem: ca.pem,
        _dir: dir,
    }
}

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

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let bin: PathBuf = std::env::var_os("CONFIGHASH_BIN")
        .map(Into::into)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_confighash").into());
    let env_u64 = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let nofile = env_u64("CONFIGHASH_NOFILE", 1024);
    let hold = Duration::from_secs(env_u64("CONFIGHASH_HOLD_SECS", 100));
    let flood = env_u64("CONFIGHASH_FLOOD", 1010) as usize;
    let api = ApiServer::start().await;

    // 1. Lifetimes of an idle and a partial-header connection.
    let timing = serve(&bin, &api, nofile).await;
    let idle = TcpStream::connect(timing.admin).await.unwrap();
    let partial = ports::open_silent(timing.admin, 1, b"GET /livez HTTP/1.1\r\nHost: x\r\n")
        .await
        .remove(0);
    let lifetimes =
        tokio::spawn(async move { tokio::join!(open_for(idle, hold), open_for(partial, hold)) });

    // 2. A flood, in a second process.
    let flooded = serve(&bin, &api, nofile).await;
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
        Ok(Ok(status)) => format!(
            "{status} after {:.1} ms",
            started.elapsed().as_secs_f64() * 1e3
        ),
        Ok(Err(e)) => format!("failed: {e}"),
        Err(_) => "no answer within 5 s".to_owned(),
    };
    let livez = match tokio::time::timeout(
        Duration::from_secs(1),
        ports::probe(flooded.admin, "/livez"),
    )
    .await
    {
        Ok(Ok((status, _, took))) => format!("{status} after {:.1} ms", took.as_secs_f64() * 1e3),
        Ok(Err(e)) => format!("failed: {e}"),
        Err(_) => "no answer within 1 s (a failed probe)".to_owned(),
    };
    let accept_failed = flooded.logged("accept failed");
    drop(conns);

    let (idle, partial) = lifetimes.await.unwrap();
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
    println!("| ... a new webhook connection: TLS handshake and review | {review} |");
    println!("| ... `/livez` on a new connection | {livez} |");
    println!("| ... `accept failed` log lines | {accept_failed} |");
    let mut timing = timing;
    let mut flooded = flooded;
    let _ = timing.child.start_kill();
    let _ = flooded.child.start_kill();
}

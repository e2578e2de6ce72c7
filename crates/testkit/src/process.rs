//! `confighash serve` as a process, as `tests/webhook/admin_port.rs` and `benches/admin_flood.rs`
//! run it: against the in-memory API server, both ports on loopback, a serving certificate from a
//! new test CA, a key file, no leader election, JSON logs, under a given open-file limit.
//!
//! - [`start`]: starts it and waits until it serves; [`Serve`] holds its addresses, its CA, its
//!   process (open files) and its [`Logs`].
//! - [`Logs`]: its log lines as they come, to find or wait for by message.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::apiserver::{ApiServer, TestCa};
use serde_json::Value;
use tokio::time::Instant;

/// How long the process may take to log a line a test waits for.
const STARTUP: Duration = Duration::from_secs(60);

/// The lines a process writes to standard error, as they come: JSON log lines parsed, other
/// lines as strings.
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<Value>>>);

impl Logs {
    /// Every line so far.
    pub fn lines(&self) -> Vec<Value> {
        self.0.lock().unwrap().clone()
    }

    /// The first line with `message`.
    pub fn find(&self, message: &str) -> Option<Value> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .find(|l| is(l, message))
            .cloned()
    }

    /// How many lines have `message`.
    pub fn count(&self, message: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|l| is(l, message))
            .count()
    }

    /// Polls until a line with `message` has come; that line.
    pub async fn wait_for(&self, message: &str) -> Value {
        let deadline = Instant::now() + STARTUP;
        loop {
            if let Some(line) = self.find(message) {
                return line;
            }
            assert!(
                Instant::now() < deadline,
                "no log line {message:?} in {:#?}",
                self.lines()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Whether log line `line` has `message` (a line that is not JSON: contains it).
fn is(line: &Value, message: &str) -> bool {
    match line {
        Value::String(text) => text.contains(message),
        _ => line["fields"]["message"].as_str() == Some(message),
    }
}

/// A running `confighash serve`.
pub struct Serve {
    pub child: tokio::process::Child,
    pub logs: Logs,
    /// The webhook port (TLS).
    pub webhook: SocketAddr,
    /// The admin port (plain HTTP).
    pub admin: SocketAddr,
    /// The CA of the serving certificate: what clients trust.
    pub ca_pem: String,
    reader: Option<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

/// Starts `bin serve` against `api` with a soft open-file limit of `soft` and a hard one of
/// `hard`, and waits until it logs that it serves.
#[allow(unsafe_code)] // a C call: see its SAFETY comment
pub async fn start(bin: &Path, api: &ApiServer, soft: u64, hard: u64) -> Serve {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("serve process test CA");
    let pair = ca.issue(&["localhost", "127.0.0.1"]);
    let path = |name: &str| dir.path().join(name);
    std::fs::write(path("tls.crt"), &pair.cert_pem).unwrap();
    std::fs::write(path("tls.key"), &pair.key_pem).unwrap();
    std::fs::write(path("hmac.key"), b"process.rs: 32 bytes of the key!").unwrap();
    std::fs::write(
        path("kubeconfig"),
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster:\n    server: {}\n\
             users:\n- name: admin\n  user: {{}}\ncontexts:\n- name: standin\n  context:\n    \
             cluster: standin\n    user: admin\n    namespace: confighash\n\
             current-context: standin\n",
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
                rlim_cur: soft,
                rlim_max: hard,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().expect("confighash serve");
    let logs = Logs::default();
    let stderr = child.stderr.take().unwrap().into_owned_fd().unwrap();
    let reader = {
        let logs = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(std::fs::File::from(stderr)).lines() {
                let Ok(line) = line else { break };
                let value = serde_json::from_str(&line).unwrap_or(Value::String(line));
                logs.0.lock().unwrap().push(value);
            }
        })
    };
    let serving = logs.wait_for("serving").await;
    let addr = |field: &str| -> SocketAddr {
        serving["fields"][field]
            .as_str()
            .unwrap_or_else(|| panic!("{serving}"))
            .parse()
            .unwrap()
    };
    Serve {
        webhook: addr("webhook"),
        admin: addr("admin"),
        child,
        logs,
        ca_pem: ca.pem,
        reader: Some(reader),
        _dir: dir,
    }
}

impl Serve {
    pub fn pid(&self) -> u32 {
        self.child.id().expect("a running process")
    }

    /// The process's open file descriptors.
    pub fn open_files(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// Kills the process and waits until it and its log reader have ended; its logs.
    pub async fn stop(mut self) -> Logs {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        self.logs.clone()
    }
}

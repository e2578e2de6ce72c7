//! `confighash serve` as a child process, for the benches that measure it from outside
//! (`attack_run`, `lookup_cost`): the release binary, the files it is started with, the process
//! and its admin port; and what `/proc` says about a process and about the machine.

// Each bench that includes this file uses a different part of it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::apiserver::TestCa;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The names the serving certificate is for.
pub const SERVING_NAMES: &[&str] = &["confighash.confighash.svc", "localhost", "127.0.0.1"];
/// The name clients verify the serving certificate against (the webhook Service's).
pub const SERVER_NAME: &str = "confighash.confighash.svc";
/// How long serve may take to be ready and to have its watcher synced.
pub const READY_WITHIN: Duration = Duration::from_secs(30);

/// The release binary: `given` (named by the environment variable `variable`), or built now as
/// the Dockerfile builds it, `cargo build --release --locked --bin confighash`, in its own target
/// directory `target/attack-run` (`cargo bench` and this build would otherwise rebuild each
/// other's units of ring, rustls and kube in target/release on every run). Returns the path and
/// how it was found. Blocking: call it from a blocking thread.
pub fn release_binary(given: Option<&Path>, variable: &str) -> Result<(PathBuf, String), String> {
    if let Some(path) = given {
        return Ok((path.to_owned(), format!("{variable}, not built")));
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| Path::new(crate::ROOT).join("target"), PathBuf::from)
        .join("attack-run");
    let started = Instant::now();
    let output = Command::new(cargo)
        .args([
            "build",
            "--release",
            "--locked",
            "--bin",
            "confighash",
            "--message-format=json-render-diagnostics",
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        .current_dir(crate::ROOT)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !output.status.success() {
        return Err(format!("cargo build --release failed: {}", output.status));
    }
    let executable = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "confighash")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .ok_or("cargo named no confighash executable")?;
    Ok((
        executable,
        format!(
            "built by cargo build --release --locked --bin confighash --target-dir {} in {:.1} s",
            target_dir.display(),
            started.elapsed().as_secs_f64()
        ),
    ))
}

/// How long ago `binary` was written, as "12 s ago".
pub fn modified_ago(binary: &Path) -> String {
    std::fs::metadata(binary)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .map(|d| format!("{:.0} s ago", d.as_secs_f64()))
        .unwrap_or_default()
}

/// The files serve is started with, in a temporary directory removed on drop.
pub struct Files {
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub hmac_key: PathBuf,
}

impl Files {
    /// Writes `kubeconfig`, a serving pair `ca` issues for [`SERVING_NAMES`] and the HMAC key
    /// into `$TMPDIR/confighash-<tag>-<pid>`.
    pub fn write(tag: &str, kubeconfig: &str, ca: &TestCa, hmac_key: &[u8]) -> Self {
        let dir = std::env::temp_dir().join(format!("confighash-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let pair = ca.issue(SERVING_NAMES);
        let files = Files {
            kubeconfig: dir.join("kubeconfig"),
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
            hmac_key: dir.join("hmac.key"),
            dir,
        };
        std::fs::write(&files.kubeconfig, kubeconfig).expect("write the kubeconfig");
        std::fs::write(&files.cert, &pair.cert_pem).expect("write tls.crt");
        std::fs::write(&files.key, &pair.key_pem).expect("write tls.key");
        std::fs::write(&files.hmac_key, hmac_key).expect("write the key");
        files
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A kubeconfig for `server` with a bearer token, its context's namespace `namespace` (serve's
/// own).
pub fn kubeconfig(server: &str, token: &str, namespace: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: bench\n  cluster:\n    server: {server}\n\
         users:\n- name: confighash\n  user:\n    token: {token}\ncontexts:\n- name: bench\n  \
         context:\n    cluster: bench\n    user: confighash\n    namespace: {namespace}\n\
         current-context: bench\n"
    )
}

/// `confighash serve` running; killed on drop.
pub struct Serve {
    child: Child,
    pub pid: u32,
    pub webhook: SocketAddr,
    pub admin: SocketAddr,
    log: PathBuf,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free loopback port (free when asked; the caller binds it soon after).
pub fn free_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    listener.local_addr().expect("its address")
}

/// A plain HTTP/1.0 GET: status and body, within 5 s.
pub async fn admin_get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| e.to_string())?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut buf = Vec::new();
        stream
            .read_to_end(&mut buf)
            .await
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("no status line in {text:?}"))?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        Ok((status, body))
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .map_err(|_| "no answer within 5 s".to_owned())?
}

impl Serve {
    /// Starts `binary serve` with `--listen`/`--admin-listen` on free loopback ports, the
    /// serving pair and HMAC key of `files`, `--leader-elect false` and `extra`, `KUBECONFIG` set
    /// to `files.kubeconfig` and no `CONFIGHASH_*` or `KUBERNETES_*` variable of this process;
    /// its output goes to `serve-<tag>.log` in `files.dir`. Waits (polling, within
    /// [`READY_WITHIN`]) for `/readyz` and for `confighash_watcher_cache_synced 1`.
    pub async fn start(
        binary: &Path,
        files: &Files,
        extra: &[String],
        tag: &str,
    ) -> Result<Self, String> {
        let (webhook, admin) = (free_port(), free_port());
        let log = files.dir.join(format!("serve-{tag}.log"));
        let mut command = Command::new(binary);
        command
            .arg("serve")
            .arg("--listen")
            .arg(webhook.to_string())
            .arg("--admin-listen")
            .arg(admin.to_string())
            .arg("--tls-cert")
            .arg(&files.cert)
            .arg("--tls-key")
            .arg(&files.key)
            .arg("--key-file")
            .arg(&files.hmac_key)
            .args(["--leader-elect", "false"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::from(
                std::fs::File::create(&log).map_err(|e| e.to_string())?,
            ))
            .stderr(Stdio::from(
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(&log)
                    .map_err(|e| e.to_string())?,
            ));
        // Only what is set here reaches it: no flag from this shell's CONFIGHASH_* variables,
        // and no in-cluster configuration.
        for (name, _) in std::env::vars_os() {
            let name_str = name.to_string_lossy();
            if name_str.starts_with("CONFIGHASH_") || name_str.starts_with("KUBERNETES_") {
                command.env_remove(&name);
            }
        }
        command.env("KUBECONFIG", &files.kubeconfig);
        let child = command
            .spawn()
            .map_err(|e| format!("spawning serve: {e}"))?;
        let pid = child.id();
        let mut serve = Serve {
            child,
            pid,
            webhook,
            admin,
            log,
        };
        let deadline = Instant::now() + READY_WITHIN;
        let mut ready = false;
        let mut synced = false;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = serve.child.try_wait() {
                return Err(format!("serve exited with {status}: {}", serve.log_tail()));
            }
            if !ready {
                ready = matches!(admin_get(admin, "/readyz").await, Ok((200, _)));
            }
            if ready {
                synced = matches!(admin_get(admin, "/metrics").await,
                    Ok((200, m)) if m.lines().any(|l| l.trim() == "confighash_watcher_cache_synced 1"));
                if synced {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if !ready || !synced {
            return Err(format!(
                "serve not ready (readyz {ready}, watcher synced {synced}) within {} s: {}",
                READY_WITHIN.as_secs(),
                serve.log_tail()
            ));
        }
        Ok(serve)
    }

    /// The last 10 lines serve logged.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }

    /// Lines serve logged, and how many of them at WARN or ERROR.
    pub fn log_counts(&self) -> (usize, usize) {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let warn = text
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .count();
        (text.lines().count(), warn)
    }

    /// `confighash_webhook_lookups_total` summed by outcome.
    pub async fn lookups(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        if let Ok((200, text)) = admin_get(self.admin, "/metrics").await {
            for line in text
                .lines()
                .filter(|l| l.starts_with("confighash_webhook_lookups_total{"))
            {
                let outcome = line
                    .split("outcome=\"")
                    .nth(1)
                    .and_then(|s| s.split('"').next())
                    .unwrap_or("?");
                let value = line
                    .rsplit(' ')
                    .next()
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(0.0);
                *out.entry(outcome.to_owned()).or_default() += value as u64;
            }
        }
        out
    }
}

// ---------------------------------------------------------------------------------------------
// /proc

/// A `/proc/<pid>/status` field in KiB.
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Clock ticks per second of `/proc`'s CPU times (`USER_HZ`), 100 if it cannot be read.
#[allow(unsafe_code)] // a C call: see its SAFETY comment
pub fn clock_ticks() -> u64 {
    // SAFETY: sysconf reads a configuration value and touches no memory of ours.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 { hz as u64 } else { 100 }
}

/// User + system CPU time of a process (all its threads), from `/proc/<pid>/stat` fields 14
/// and 15; zero if it cannot be read.
pub fn process_cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which is in parentheses): state is field 3.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i - 3)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let hz = clock_ticks();
    let total = ticks(14) + ticks(15);
    Duration::from_nanos(total.saturating_mul(1_000_000_000) / hz)
}

/// Busy and total jiffies of all cores so far, from the first line of /proc/stat.
pub fn machine_cpu() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = fields.iter().take(8).sum();
    // idle and iowait
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// CPU time of every process on the machine so far: utime + stime + cutime + cstime of each
/// `/proc/<pid>/stat` (a child's time moves into its parent's cutime/cstime when it is reaped,
/// so processes that ended are still counted). Unlike `/proc/stat`'s per-core ticks, a
/// process's times are its precise runtime split by sampled ticks: on a tickless kernel, work
/// in bursts shorter than a tick (a server at 1,000 small requests a second) is missed by
/// `/proc/stat` but not here. Interrupt time outside any process is not counted.
pub fn all_processes_cpu() -> Duration {
    let mut ticks = 0u64;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Duration::ZERO;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        // Fields 14 to 17, after the command name (field 3 is the first after it).
        ticks += rest
            .split_whitespace()
            .skip(11)
            .take(4)
            .filter_map(|f| f.parse::<i64>().ok())
            .map(|t| t.max(0) as u64)
            .sum::<u64>();
    }
    Duration::from_nanos(ticks.saturating_mul(1_000_000_000) / clock_ticks())
}

/// Steal and total jiffies of all cores so far, from the first line of /proc/stat: the time a
/// virtual machine's cores were ready to run but its host ran something else.
pub fn machine_steal() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = fields.iter().take(8).sum();
    (fields.get(7).copied().unwrap_or(0), total)
}

/// The share of all cores' time that was busy between two [`machine_cpu`] readings.
pub fn busy_share(before: (u64, u64), after: (u64, u64)) -> f64 {
    let busy = after.0.saturating_sub(before.0);
    let total = after.1.saturating_sub(before.1);
    busy as f64 / total.max(1) as f64
}

/// The 1-minute load average.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .next()
        .unwrap_or("?")
        .to_owned()
}

/// The soft open-file limit of a process.
pub fn open_files_limit(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/limits"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3).map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

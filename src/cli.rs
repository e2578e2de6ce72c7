//! The command line: flags (each also read from `CONFIGHASH_<FLAG>`) and the `stamp` command's
//! input handling.

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::checksum::{KeyError, StampKey};
use crate::offline::{self, InputError, Output, Source};

#[derive(Debug, Parser)]
#[command(
    name = "confighash",
    version,
    about = "Roll Kubernetes workloads when their ConfigMaps and Secrets change"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Stamp the workloads of Kubernetes YAML offline, resolving references within the input.
    Stamp(StampArgs),
    /// Serve the mutating admission webhook over TLS, with an admin port.
    Serve(ServeArgs),
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address of the webhook (HTTPS).
    #[arg(long, env = "CONFIGHASH_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// Address of the admin port (plain HTTP: /livez, /readyz, /metrics).
    #[arg(long, env = "CONFIGHASH_ADMIN_LISTEN", default_value = "0.0.0.0:8080")]
    pub admin_listen: SocketAddr,
    /// Serving certificate (PEM), re-read when it changes.
    #[arg(long, env = "CONFIGHASH_TLS_CERT", value_name = "FILE")]
    pub tls_cert: PathBuf,
    /// Serving certificate's private key (PEM), re-read when it changes.
    #[arg(long, env = "CONFIGHASH_TLS_KEY", value_name = "FILE")]
    pub tls_key: PathBuf,
    /// HMAC key file: its bytes exactly as they are (at least 16).
    #[arg(
        long,
        env = "CONFIGHASH_KEY_FILE",
        value_name = "FILE",
        conflicts_with = "key_secret"
    )]
    pub key_file: Option<PathBuf>,
    /// Secret in the pod's namespace whose data key `key` is the HMAC key; created with 32 random
    /// bytes when absent, and reloaded when it changes.
    #[arg(
        long,
        env = "CONFIGHASH_KEY_SECRET",
        value_name = "NAME",
        default_value = "confighash-key"
    )]
    pub key_secret: String,
    /// One deadline for all lookups of a review, well below the webhook's timeoutSeconds.
    #[arg(long, env = "CONFIGHASH_LOOKUP_DEADLINE", value_name = "DUR", default_value = "2s", value_parser = parse_duration)]
    pub lookup_deadline: Duration,
    /// Log format.
    #[arg(
        long,
        env = "CONFIGHASH_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
    /// Log level or filter (`info`, `debug`, `confighash=debug,kube=warn`).
    #[arg(
        long,
        env = "CONFIGHASH_LOG_LEVEL",
        value_name = "LEVEL",
        default_value = "info"
    )]
    pub log_level: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration such as 2s or 500ms: {e}"))?;
    if d.is_zero() {
        return Err("the duration must be more than zero".into());
    }
    Ok(d)
}

#[derive(Debug, Args)]
pub struct StampArgs {
    /// A YAML file, a directory of them (.yaml, .yml, .json) or `-` for standard input;
    /// repeatable, or comma separated.
    #[arg(
        short = 'f',
        long = "filename",
        env = "CONFIGHASH_FILENAME",
        value_delimiter = ',',
        value_name = "PATH",
        required = true
    )]
    pub files: Vec<PathBuf>,
    /// The namespace of documents that name none.
    #[arg(long, env = "CONFIGHASH_NAMESPACE", default_value = "default")]
    pub namespace: String,
    /// HMAC key file: its bytes exactly as they are (at least 16). Without it stamps are plain.
    #[arg(long, env = "CONFIGHASH_KEY_FILE")]
    pub key_file: Option<PathBuf>,
    /// Print each workload's references, whether they were found, and its stamp, instead of
    /// the documents.
    #[arg(long, env = "CONFIGHASH_EXPLAIN")]
    pub explain: bool,
}

/// Why `stamp` stopped.
#[derive(Debug, thiserror::Error)]
pub enum StampError {
    #[error("{path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not UTF-8 text")]
    NotText { path: String },
    #[error("{path}: no .yaml, .yml or .json files in this directory")]
    EmptyDir { path: String },
    #[error("standard input (-) given more than once")]
    StdinTwice,
    #[error("{path}: {source}")]
    Key {
        path: String,
        #[source]
        source: KeyError,
    },
    #[error(transparent)]
    Input(#[from] InputError),
}

/// Runs `confighash stamp`; `stdin` is read when a path is `-`.
pub fn stamp(args: &StampArgs, stdin: impl Read) -> Result<Output, StampError> {
    let key = match &args.key_file {
        Some(path) => {
            let bytes = std::fs::read(path).map_err(|source| StampError::Read {
                path: path.display().to_string(),
                source,
            })?;
            Some(StampKey::new(bytes).map_err(|source| StampError::Key {
                path: path.display().to_string(),
                source,
            })?)
        }
        None => None,
    };
    let sources = read_sources(&args.files, stdin)?;
    let options = offline::Options {
        namespace: args.namespace.clone(),
        key,
        explain: args.explain,
    };
    Ok(offline::run(&sources, &options)?)
}

/// Reads every input: files as given, directories' YAML and JSON files in name order, `-` once.
pub fn read_sources(paths: &[PathBuf], mut stdin: impl Read) -> Result<Vec<Source>, StampError> {
    let mut sources = Vec::new();
    let mut stdin_used = false;
    for path in paths {
        if path.as_os_str() == "-" {
            if std::mem::replace(&mut stdin_used, true) {
                return Err(StampError::StdinTwice);
            }
            let mut bytes = Vec::new();
            stdin
                .read_to_end(&mut bytes)
                .map_err(|source| StampError::Read {
                    path: "standard input".into(),
                    source,
                })?;
            sources.push(source("standard input".into(), bytes)?);
        } else if path.is_dir() {
            let files = dir_files(path)?;
            if files.is_empty() {
                return Err(StampError::EmptyDir {
                    path: path.display().to_string(),
                });
            }
            for file in files {
                sources.push(read_file(&file)?);
            }
        } else {
            sources.push(read_file(path)?);
        }
    }
    Ok(sources)
}

fn dir_files(dir: &Path) -> Result<Vec<PathBuf>, StampError> {
    let err = |source| StampError::Read {
        path: dir.display().to_string(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(err)? {
        let path = entry.map_err(err)?.path();
        let yaml = path
            .extension()
            .is_some_and(|e| e == "yaml" || e == "yml" || e == "json");
        if yaml && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

fn read_file(path: &Path) -> Result<Source, StampError> {
    let bytes = std::fs::read(path).map_err(|source| StampError::Read {
        path: path.display().to_string(),
        source,
    })?;
    source(path.display().to_string(), bytes)
}

fn source(name: String, bytes: Vec<u8>) -> Result<Source, StampError> {
    match String::from_utf8(bytes) {
        Ok(text) => Ok(Source { name, text }),
        Err(_) => Err(StampError::NotText { path: name }),
    }
}

//! `confighash explain`: why a workload in a live cluster carries the stamp it carries, and what
//! happens next.
//!
//! With the user's kubeconfig it reads the workload, its Namespace, the installed
//! MutatingWebhookConfiguration, the installation's key (the key Secret, or `--key-file`), every
//! referenced ConfigMap and Secret and the Events confighash recorded, and says: whether the
//! namespace is opted in and the webhook selects the workload, what the stamp is (current, foreign,
//! none, the unstamped marker), each reference as read, the expected stamp, and the verdict by the
//! core's rules. `-A` (or `-n NS` alone) does the same for every workload, one line each.
//!
//! Two halves: [`model`] (and [`select`], [`observed`], [`render`]) turn what was read into the explanation and
//! its text, without a client, and are unit-tested; [`fetch`] reads through the sanitising client.
//!
//! Must not reach: any write to the API server (it only reads), the running watcher's or webhook's
//! state (it says only what the API shows), or the content of a Secret beyond the digests the
//! recipe takes: no value, and no per-key digest, reaches the output.

use crate::cluster::client::{Reads, Resource};

/// What `explain` reads: the workload, its config, namespaces, the webhook configuration and
/// the workload's Events.
pub const READS: Reads = Reads::of(&[
    Resource::ConfigMaps,
    Resource::Secrets,
    Resource::Namespaces,
    Resource::Events,
    Resource::MutatingWebhookConfigurations,
    Resource::Workloads,
]);

pub mod fetch;
pub mod model;
pub mod observed;
pub mod render;
pub mod select;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::PathBuf;

use crate::core::workload::{Kinds, WorkloadKind};
use crate::explain::fetch::ClusterReader;
use crate::explain::model::{Explanation, Facts, KeyFacts, Read, Verdict};
use crate::explain::render::Row;

/// Exit status: everything is up to date.
pub const EXIT_UP_TO_DATE: u8 = 0;
/// Exit status: stale, unstamped, foreign, not selected, opted out, or a required reference is
/// missing.
pub const EXIT_ATTENTION: u8 = 1;
/// Exit status: an error, or a verdict that could not be told.
pub const EXIT_ERROR: u8 = 2;

/// What to explain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One workload, in the given namespace or the kubeconfig context's.
    Workload {
        kind: WorkloadKind,
        name: String,
        namespace: Option<String>,
    },
    /// Every workload of a namespace (the kubeconfig context's when `None`).
    Namespace(Option<String>),
    /// Every workload of every opted-in namespace.
    AllNamespaces,
}

/// Output form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
}

/// Where the installation's key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyChoice {
    /// `--key-file`: its bytes exactly.
    File(PathBuf),
    /// `--key-secret` in `--install-namespace`, data key `key`.
    Secret(String),
}

/// A `confighash explain` run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub target: Target,
    pub format: Format,
    /// The namespace confighash is installed in.
    pub install_namespace: String,
    pub key: KeyChoice,
    /// The MutatingWebhookConfiguration's name.
    pub webhook_configuration: String,
    /// The kinds explained: the built-in kinds and `--workload-kind`.
    pub kinds: Kinds,
}

/// What a run printed and its exit status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// For standard output.
    pub text: String,
    /// For standard error, one message each.
    pub errors: Vec<String>,
    /// [`EXIT_UP_TO_DATE`], [`EXIT_ATTENTION`] or [`EXIT_ERROR`].
    pub code: u8,
}

impl Report {
    fn error(message: String) -> Self {
        Report {
            text: String::new(),
            errors: vec![message],
            code: EXIT_ERROR,
        }
    }
}

/// A workload named on the command line: `KIND/NAME`, its kind as typed (resolved with the
/// configured kinds by [`parse_kind`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadArg {
    pub kind: String,
    pub name: String,
}

/// The kind kubectl's short or long names (any case, with or without the group) name, among the
/// built-in kinds and those of `kinds`: a configured kind by its kind or plural
/// (`cloneset`, `clonesets.apps.kruise.io`).
pub fn parse_kind(kinds: &Kinds, s: &str) -> Option<WorkloadKind> {
    let lower = s.to_ascii_lowercase();
    let (name, group) = match lower.split_once('.') {
        Some((name, group)) => (name, Some(group)),
        None => (lower.as_str(), None),
    };
    let built_in = match name {
        "deploy" | "deployment" | "deployments" => Some(WorkloadKind::DEPLOYMENT),
        "sts" | "statefulset" | "statefulsets" => Some(WorkloadKind::STATEFUL_SET),
        "ds" | "daemonset" | "daemonsets" => Some(WorkloadKind::DAEMON_SET),
        "cj" | "cronjob" | "cronjobs" => Some(WorkloadKind::CRON_JOB),
        "ro" | "rollout" | "rollouts" => Some(WorkloadKind::ROLLOUT),
        _ => None,
    };
    // `deployments.apps` and `deployments.v1.apps` name the group (and version) too.
    let group_ok = |kind: WorkloadKind| {
        group.is_none_or(|g| {
            g == kind.group() || g == format!("{}.{}", kind.version(), kind.group())
        })
    };
    if let Some(kind) = built_in {
        return group_ok(kind).then_some(kind);
    }
    let mut named = kinds.configured().filter(|&kind| {
        (name == kind.kind().to_ascii_lowercase() || name == select::plural(kind)) && group_ok(kind)
    });
    match (named.next(), named.next()) {
        (Some(kind), None) => Some(kind),
        _ => None,
    }
}

/// Parses `KIND/NAME`; the kind is resolved later, once the configured kinds are known.
pub fn parse_workload(s: &str) -> Result<WorkloadArg, String> {
    let Some((kind, name)) = s.split_once('/') else {
        return Err(format!(
            "{s:?} is not KIND/NAME (for example deploy/web, sts/db, cj/backup, rollout/api)"
        ));
    };
    if kind.is_empty() {
        return Err(format!("{s:?} names no kind (for example deploy/web)"));
    }
    if !crate::core::refs::is_object_name(name) {
        return Err(format!(
            "{name:?} is not an object name (lowercase letters, digits, '-' and '.', starting and \
             ending with a letter or digit, at most 253 characters)"
        ));
    }
    Ok(WorkloadArg {
        kind: kind.to_owned(),
        name: name.to_owned(),
    })
}

/// The kind of `arg` among the built-in kinds and `kinds`, or why it is none.
pub fn resolve_kind(kinds: &Kinds, arg: &WorkloadArg) -> Result<WorkloadKind, String> {
    parse_kind(kinds, &arg.kind).ok_or_else(|| {
        let configured: Vec<String> = kinds
            .configured()
            .map(|k| k.kind().to_ascii_lowercase())
            .collect();
        let configured = if configured.is_empty() {
            String::new()
        } else {
            format!(", or a configured kind: {}", configured.join(", "))
        };
        // Quoted with escapes: it is what was typed.
        format!(
            "{:?} is not a kind confighash stamps: deploy (deployment), sts (statefulset), ds \
             (daemonset), cj (cronjob), rollout (argoproj.io Rollout){configured}; more with \
             --workload-kind",
            arg.kind
        )
    })
}

/// A client for the user's kubeconfig (`kubeconfig`, else `KUBECONFIG` or `~/.kube/config`, else
/// the in-cluster config), in `context` if given, behind the sanitising layer.
pub async fn connect(
    kubeconfig: Option<&std::path::Path>,
    context: Option<&str>,
) -> Result<kube::Client, String> {
    let options = kube::config::KubeConfigOptions {
        context: context.map(str::to_owned),
        ..Default::default()
    };
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?
        }
        None if context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| format!("kubeconfig: {e}"))?,
        None => kube::Config::infer()
            .await
            .map_err(|e| format!("no usable kubeconfig or in-cluster config: {e}"))?,
    };
    crate::cluster::client::build(config, READS).map_err(|e| kube_message(&e))
}

fn kube_message(e: &kube::Error) -> String {
    crate::cluster::redact::kube_error(e)
}

/// Runs `confighash explain` with `client` (whose default namespace is the kubeconfig
/// context's).
pub async fn run(client: kube::Client, request: &Request) -> Report {
    for (what, ns) in [
        (
            "--install-namespace",
            Some(request.install_namespace.as_str()),
        ),
        (
            "-n",
            match &request.target {
                Target::Workload { namespace, .. } | Target::Namespace(namespace) => {
                    namespace.as_deref()
                }
                Target::AllNamespaces => None,
            },
        ),
    ] {
        if let Some(ns) = ns
            && !crate::core::refs::is_namespace_name(ns)
        {
            return Report::error(format!(
                "{what} {ns:?} is not a namespace name (a DNS-1123 label)"
            ));
        }
    }
    let default_namespace = client.default_namespace().to_owned();
    let cluster = ClusterReader::new(client);
    let common = Common::read(&cluster, request).await;
    match &request.target {
        Target::Workload {
            kind,
            name,
            namespace,
        } => {
            let namespace = namespace.clone().unwrap_or(default_namespace);
            one(&cluster, &common, request, *kind, &namespace, name).await
        }
        Target::Namespace(namespace) => {
            let namespace = namespace.clone().unwrap_or(default_namespace);
            many(&cluster, &common, request, vec![namespace]).await
        }
        Target::AllNamespaces => match cluster.opted_in_namespaces().await {
            Read::Found(namespaces) => many(&cluster, &common, request, namespaces).await,
            Read::Forbidden => Report::error(
                "listing Namespaces is forbidden: -A needs list access to namespaces; give a \
                 namespace with -n instead"
                    .to_owned(),
            ),
            Read::Absent => Report::error("the API server does not serve Namespaces".to_owned()),
            Read::Failed(e) => Report::error(format!("listing Namespaces: {e}")),
        },
    }
}

/// What every workload's explanation shares: the key and the webhook configuration.
struct Common {
    key: KeyFacts,
    webhook: Read<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration>,
}

impl Common {
    async fn read(cluster: &ClusterReader, request: &Request) -> Self {
        let key = match &request.key {
            KeyChoice::File(path) => fetch::key_file(path),
            KeyChoice::Secret(name) => cluster.key_secret(&request.install_namespace, name).await,
        };
        let webhook = cluster
            .webhook_configuration(&request.webhook_configuration)
            .await;
        Common { key, webhook }
    }
}

/// The facts of one workload whose object was read.
#[allow(clippy::too_many_arguments)]
async fn facts(
    cluster: &ClusterReader,
    common: &Common,
    request: &Request,
    kind: WorkloadKind,
    namespace: &str,
    name: &str,
    object: serde_json::Value,
    namespace_labels: Read<std::collections::BTreeMap<String, String>>,
    cache: &mut HashMap<crate::core::refs::ObjectRef, Read<model::RefObject>>,
    events: Read<Vec<k8s_openapi::api::events::v1::Event>>,
) -> Result<Facts, String> {
    let refs = model::references(kind, namespace, name, &object).map_err(|e| e.to_string())?;
    let references = cluster.references(namespace, &refs, cache).await;
    Ok(Facts {
        kind,
        resource: cluster.resource(kind).await.plural,
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        object,
        namespace_labels,
        install_namespace: request.install_namespace.clone(),
        webhook_name: request.webhook_configuration.clone(),
        webhook: common.webhook.clone(),
        key: common.key.clone(),
        references,
        events,
    })
}

async fn one(
    cluster: &ClusterReader,
    common: &Common,
    request: &Request,
    kind: WorkloadKind,
    namespace: &str,
    name: &str,
) -> Report {
    let object = match cluster.workload(kind, namespace, name).await {
        Read::Found(object) => object,
        Read::Absent => {
            let hint = if kind == WorkloadKind::ROLLOUT {
                " (or the cluster does not serve argoproj.io/v1alpha1 Rollouts)".to_owned()
            } else if !kind.is_built_in() {
                format!(" (or the cluster does not serve {})", kind.api_version())
            } else {
                String::new()
            };
            return Report::error(format!("{kind} {namespace}/{name} does not exist{hint}"));
        }
        Read::Forbidden => {
            return Report::error(format!(
                "reading {kind} {namespace}/{name} is forbidden (get {} in namespace {namespace})",
                cluster.resource(kind).await.plural
            ));
        }
        Read::Failed(e) => return Report::error(format!("reading {kind} {namespace}/{name}: {e}")),
    };
    let labels = cluster.namespace_labels(namespace).await;
    let events = cluster.events(namespace).await;
    let mut cache = HashMap::new();
    let facts = match facts(
        cluster, common, request, kind, namespace, name, object, labels, &mut cache, events,
    )
    .await
    {
        Ok(f) => f,
        Err(e) => return Report::error(e),
    };
    match model::explain(&facts) {
        Ok(explanation) => single_report(&explanation, request.format),
        Err(e) => Report::error(e.to_string()),
    }
}

fn single_report(e: &Explanation, format: Format) -> Report {
    let text = match format {
        Format::Text => render::text(e),
        Format::Json => json(e),
    };
    Report {
        text,
        errors: Vec::new(),
        code: e.verdict.exit_code(),
    }
}

fn json(value: &impl serde::Serialize) -> String {
    match serde_json::to_string_pretty(value) {
        Ok(mut s) => {
            s.push('\n');
            s
        }
        // Only strings, numbers and booleans: serializing cannot fail.
        Err(e) => format!("{{\"error\": {:?}}}\n", e.to_string()),
    }
}

/// The JSON document of a table run.
#[derive(serde::Serialize)]
struct Table<'a> {
    workloads: &'a [Row],
    errors: &'a [String],
}

async fn many(
    cluster: &ClusterReader,
    common: &Common,
    request: &Request,
    namespaces: Vec<String>,
) -> Report {
    let mut rows = Vec::new();
    let mut errors = Vec::new();
    for namespace in &namespaces {
        let labels = cluster.namespace_labels(namespace).await;
        let mut cache = HashMap::new();
        for kind in request.kinds.iter() {
            let objects = match cluster.workloads(kind, namespace).await {
                Read::Found(objects) => objects,
                // Not served (Rollouts without Argo Rollouts).
                Read::Absent => continue,
                Read::Forbidden => {
                    errors.push(format!(
                        "listing {} in namespace {namespace} is forbidden",
                        cluster.resource(kind).await.plural
                    ));
                    continue;
                }
                Read::Failed(e) => {
                    errors.push(format!(
                        "listing {} in namespace {namespace}: {e}",
                        cluster.resource(kind).await.plural
                    ));
                    continue;
                }
            };
            for object in objects {
                let Some(name) = object
                    .pointer("/metadata/name")
                    .and_then(serde_json::Value::as_str)
                    .map(str::to_owned)
                else {
                    continue;
                };
                let facts = facts(
                    cluster,
                    common,
                    request,
                    kind,
                    namespace,
                    &name,
                    object,
                    labels.clone(),
                    &mut cache,
                    Read::Found(Vec::new()),
                )
                .await;
                match facts.and_then(|f| model::explain(&f).map_err(|e| e.to_string())) {
                    Ok(e) => rows.push(Row::of(&e)),
                    Err(e) => errors.push(e),
                }
            }
        }
    }
    let order = |kind: &str| request.kinds.iter().position(|k| k.kind() == kind);
    rows.sort_by(|a, b| {
        (&a.namespace, order(a.kind), &a.name).cmp(&(&b.namespace, order(b.kind), &b.name))
    });
    let code = if !errors.is_empty() || rows.iter().any(|r| r.verdict == Verdict::Unknown) {
        EXIT_ERROR
    } else if rows.iter().all(|r| r.verdict == Verdict::UpToDate) {
        EXIT_UP_TO_DATE
    } else {
        EXIT_ATTENTION
    };
    let text = match request.format {
        Format::Json => json(&Table {
            workloads: &rows,
            errors: &errors,
        }),
        Format::Text if rows.is_empty() => {
            let place = match &request.target {
                Target::AllNamespaces if namespaces.is_empty() => {
                    "no namespace is opted in".to_owned()
                }
                Target::AllNamespaces => "no workloads in the opted-in namespaces".to_owned(),
                _ => format!("no workloads in namespace {}", namespaces.join(", ")),
            };
            format!("{place}\n")
        }
        Format::Text => render::table(&rows),
    };
    Report { text, errors, code }
}

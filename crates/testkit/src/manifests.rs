//! What an installation of confighash must be, checked the same way whether it comes from
//! `deploy/` (tests/install/deploy.rs) or from the Helm chart (tests/install/chart.rs):
//!
//! - every object parses into its k8s-openapi type and serialises back without losing a field
//!   (a misspelt field fails here, not in a cluster); cert-manager and Prometheus Operator kinds,
//!   which have no k8s-openapi type, have their field names checked;
//! - the webhook configuration selects opted-in namespaces only, never the installation's own,
//!   `kube-system` or the extra excluded ones, names exactly the workload kinds the code handles,
//!   and reaches the webhook through the Service;
//! - the Deployment's arguments parse with the code's command line and name the installation's
//!   objects; the Deployment, Service, budget and webhook configuration agree on names, labels
//!   and ports;
//! - the RBAC allows every request the code makes and denies what it must not, as a table and by
//!   running the key, leader election, certificate, lookup and watcher code as the
//!   installation's ServiceAccount against the in-memory API server with that RBAC enforced.

use crate::wait;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::apiserver::ApiServer;
use crate::apiserver::rbac::{Authorizer, RequestAttributes};
use crate::apiserver::selectors::LabelSelector;
use crate::apiserver::user::UserInfo;
use clap::Parser;
use confighash::app::{self, App};
use confighash::certs::key;
use confighash::certs::selfsigned;
use confighash::cli::{Cli, Command, ServeArgs};
use confighash::core::names::{CHECKSUM_ANNOTATION, ENABLED_LABEL};
use confighash::core::refs::{ObjectKind, ObjectRef};
use confighash::core::workload::WorkloadKind;
use confighash::metrics::Metrics;
use confighash::watcher::leader::{self, LeaderConfig};
use confighash::watcher::{self, WatcherConfig};
use confighash::webhook::lookup::{KubeSource, ObjectSource};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// The user confighash's pods run as (nobody), in the manifests and the image.
pub const UID: i64 = 65534;
/// An opted-in application namespace.
pub const APP: &str = "shop";

/// The names an installation gives its objects.
#[derive(Debug, Clone)]
pub struct Install {
    /// The namespace confighash runs in.
    pub namespace: String,
    /// The ServiceAccount, Deployment, Service, Lease, webhook configuration and RBAC objects.
    pub name: String,
    /// The checksum key Secret (`--key-secret`).
    pub key_secret: String,
    /// The Secret `--self-signed-certs` keeps its CA and serving pair in (`--certs-secret`).
    pub certs_secret: String,
    /// Namespaces the webhook excludes besides its own and `kube-system`.
    pub excluded: Vec<String>,
    /// Least-privilege mode (`--watch-namespaces`): the only namespaces read and touched, with
    /// a Role in each; empty: the whole cluster.
    pub watched: Vec<String>,
    /// Configured workload kinds (`--workload-kind`, the chart's `workloadKinds`).
    pub workload_kinds: Vec<ConfiguredKind>,
}

/// A configured workload kind as the chart's `workloadKinds` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfiguredKind {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    /// The plural.
    pub resource: &'static str,
    /// The pod template's JSON pointer.
    pub template: &'static str,
}

impl ConfiguredKind {
    /// Its `--workload-kind` value.
    pub fn flag(&self) -> String {
        format!(
            "{}/{}/{}={}",
            self.group, self.version, self.kind, self.template
        )
    }
}

impl Install {
    /// An installation in `namespace` whose objects are `name`, `name-key` and `name-certs`.
    pub fn new(namespace: &str, name: &str) -> Install {
        Install {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            key_secret: format!("{name}-key"),
            certs_secret: format!("{name}-certs"),
            excluded: Vec::new(),
            watched: Vec::new(),
            workload_kinds: Vec::new(),
        }
    }

    /// (group, plural) of every workload kind the installation handles: the built-in kinds and
    /// its configured ones.
    pub fn workload_resources(&self) -> Vec<(&'static str, &'static str)> {
        workload_resources()
            .into_iter()
            .chain(self.workload_kinds.iter().map(|k| (k.group, k.resource)))
            .collect()
    }
}

// ----- documents -----

pub fn root() -> PathBuf {
    PathBuf::from(crate::ROOT)
}

pub fn deploy_dir() -> PathBuf {
    root().join("deploy")
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The base's documents, from the files deploy/base/kustomization.yaml lists, in order.
pub fn base_objects() -> Vec<Value> {
    let dir = deploy_dir().join("base");
    let kustomization = documents("base kustomization", &read(&dir.join("kustomization.yaml")));
    let mut objects = Vec::new();
    for entry in kustomization[0]["resources"].as_array().unwrap() {
        let path = dir.join(entry.as_str().unwrap());
        objects.extend(documents(&path.display().to_string(), &read(&path)));
    }
    objects
}

pub fn documents(what: &str, text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap_or_else(|e| panic!("{what}: not valid YAML: {e}"))
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

pub fn type_of(doc: &Value) -> (&str, &str) {
    (
        doc["apiVersion"].as_str().unwrap_or(""),
        doc["kind"].as_str().unwrap_or(""),
    )
}

pub fn name_of(doc: &Value) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or("")
}

/// "Kind namespace/name", for messages.
pub fn describe(doc: &Value) -> String {
    let (_, kind) = type_of(doc);
    match doc["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{kind} {ns}/{}", name_of(doc)),
        None => format!("{kind} {}", name_of(doc)),
    }
}

fn via<K: DeserializeOwned + Serialize>(doc: &Value) -> Result<Value, String> {
    let typed: K = serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
    serde_json::to_value(&typed).map_err(|e| e.to_string())
}

/// Parses a document into its k8s-openapi type and serialises it back.
pub fn typed_round_trip(doc: &Value) -> Result<Value, String> {
    match type_of(doc) {
        ("v1", "Namespace") => via::<Namespace>(doc),
        ("v1", "ServiceAccount") => via::<ServiceAccount>(doc),
        ("v1", "Service") => via::<Service>(doc),
        ("v1", "ConfigMap") => via::<ConfigMap>(doc),
        ("networking.k8s.io/v1", "NetworkPolicy") => via::<NetworkPolicy>(doc),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => via::<ClusterRole>(doc),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => via::<ClusterRoleBinding>(doc),
        ("rbac.authorization.k8s.io/v1", "Role") => via::<Role>(doc),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => via::<RoleBinding>(doc),
        ("apps/v1", "Deployment") => via::<Deployment>(doc),
        ("policy/v1", "PodDisruptionBudget") => via::<PodDisruptionBudget>(doc),
        ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration") => {
            via::<MutatingWebhookConfiguration>(doc)
        }
        (api_version, kind) => Err(format!(
            "no k8s-openapi type for {api_version} {kind} in this test: add it"
        )),
    }
}

/// Where `after` differs from `before`: fields lost or changed, and with `exact` fields added.
/// Without `exact` (strategic-merge patches, whose required fields k8s-openapi fills in), a
/// `null` in `before` is a deletion directive and is not looked for.
pub fn differences(before: &Value, after: &Value, path: &str, exact: bool, out: &mut Vec<String>) {
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => {
            for (k, bv) in b {
                let here = format!("{path}/{k}");
                match a.get(k) {
                    _ if bv.is_null() && !exact => {}
                    None => out.push(format!("lost {here}")),
                    Some(av) => differences(bv, av, &here, exact, out),
                }
            }
            if exact {
                for k in a.keys().filter(|k| !b.contains_key(*k)) {
                    out.push(format!("added {path}/{k}"));
                }
            }
        }
        (Value::Array(b), Value::Array(a)) if b.len() == a.len() => {
            for (i, (bv, av)) in b.iter().zip(a).enumerate() {
                differences(bv, av, &format!("{path}/{i}"), exact, out);
            }
        }
        _ if before == after => {}
        _ => out.push(format!("changed {path}: {before} became {after}")),
    }
}

/// Asserts that `doc` survives its typed round trip: exactly, or (for patches) without losing
/// anything it says.
pub fn assert_round_trips(what: &str, doc: &Value, exact: bool) {
    let after = typed_round_trip(doc).unwrap_or_else(|e| panic!("{what}: {}: {e}", describe(doc)));
    let mut diffs = Vec::new();
    differences(doc, &after, "", exact, &mut diffs);
    assert!(
        diffs.is_empty(),
        "{what}: {} does not survive its k8s-openapi type (a misspelt or misplaced field?):\n  {}",
        describe(doc),
        diffs.join("\n  ")
    );
}

/// The cert-manager kinds have no k8s-openapi type: they are compared as plain values, and their
/// field names are checked against cert-manager.io/v1 (the subset a typo would hit).
pub fn check_cert_manager(what: &str, doc: &Value) {
    let keys_within = |v: &Value, at: &str, allowed: &[&str]| {
        let Some(map) = v.as_object() else {
            panic!("{what}: {}: {at} must be a mapping", describe(doc));
        };
        for k in map.keys() {
            assert!(
                allowed.contains(&k.as_str()),
                "{what}: {}: unknown field {at}.{k} (known: {allowed:?})",
                describe(doc)
            );
        }
    };
    keys_within(
        doc,
        "",
        &["apiVersion", "kind", "metadata", "spec", "status"],
    );
    let spec = &doc["spec"];
    match type_of(doc) {
        ("cert-manager.io/v1", "Issuer" | "ClusterIssuer") => {
            keys_within(
                spec,
                "spec",
                &["selfSigned", "ca", "acme", "vault", "venafi"],
            );
            if let Some(ca) = spec.get("ca") {
                keys_within(
                    ca,
                    "spec.ca",
                    &[
                        "secretName",
                        "crlDistributionPoints",
                        "ocspServers",
                        "issuingCertificateURLs",
                    ],
                );
            }
        }
        ("cert-manager.io/v1", "Certificate") => {
            keys_within(
                spec,
                "spec",
                &[
                    "secretName",
                    "secretTemplate",
                    "issuerRef",
                    "commonName",
                    "dnsNames",
                    "ipAddresses",
                    "uris",
                    "emailAddresses",
                    "otherNames",
                    "subject",
                    "literalSubject",
                    "duration",
                    "renewBefore",
                    "renewBeforePercentage",
                    "usages",
                    "isCA",
                    "privateKey",
                    "keystores",
                    "revisionHistoryLimit",
                    "additionalOutputFormats",
                    "encodeUsagesInRequest",
                    "nameConstraints",
                ],
            );
            keys_within(
                &spec["issuerRef"],
                "spec.issuerRef",
                &["name", "kind", "group"],
            );
            if let Some(key) = spec.get("privateKey") {
                keys_within(
                    key,
                    "spec.privateKey",
                    &["algorithm", "encoding", "size", "rotationPolicy"],
                );
            }
            assert!(
                spec["secretName"].is_string(),
                "{what}: {}: spec.secretName is required",
                describe(doc)
            );
        }
        (api_version, kind) => panic!("{what}: unexpected {api_version} {kind}"),
    }
}

/// The Prometheus Operator kinds have no k8s-openapi type: their field names are checked against
/// monitoring.coreos.com/v1 (the subset a typo would hit), and every alert has an expression.
pub fn check_prometheus_operator(what: &str, doc: &Value) {
    let keys_within = |v: &Value, at: &str, allowed: &[&str]| {
        let Some(map) = v.as_object() else {
            panic!("{what}: {}: {at} must be a mapping", describe(doc));
        };
        for k in map.keys() {
            assert!(
                allowed.contains(&k.as_str()),
                "{what}: {}: unknown field {at}.{k} (known: {allowed:?})",
                describe(doc)
            );
        }
    };
    keys_within(doc, "", &["apiVersion", "kind", "metadata", "spec"]);
    let spec = &doc["spec"];
    let endpoint_fields = [
        "port",
        "targetPort",
        "path",
        "scheme",
        "interval",
        "scrapeTimeout",
        "honorLabels",
        "honorTimestamps",
        "relabelings",
        "metricRelabelings",
        "params",
        "tlsConfig",
        "bearerTokenSecret",
        "authorization",
        "basicAuth",
        "oauth2",
        "followRedirects",
        "enableHttp2",
        "filterRunning",
        "proxyUrl",
        "trackTimestampsStaleness",
    ];
    let monitor_fields = [
        "selector",
        "namespaceSelector",
        "jobLabel",
        "podTargetLabels",
        "targetLabels",
        "sampleLimit",
        "targetLimit",
        "labelLimit",
        "attachMetadata",
        "scrapeProtocols",
    ];
    match type_of(doc) {
        ("monitoring.coreos.com/v1", kind @ ("PodMonitor" | "ServiceMonitor")) => {
            let list = if kind == "PodMonitor" {
                "podMetricsEndpoints"
            } else {
                "endpoints"
            };
            let allowed: Vec<&str> = monitor_fields.iter().copied().chain([list]).collect();
            keys_within(spec, "spec", &allowed);
            keys_within(
                &spec["selector"],
                "spec.selector",
                &["matchLabels", "matchExpressions"],
            );
            let endpoints = spec[list].as_array().expect("scrape endpoints");
            assert!(
                !endpoints.is_empty(),
                "{what}: {}: no endpoints",
                describe(doc)
            );
            for endpoint in endpoints {
                keys_within(endpoint, &format!("spec.{list}[]"), &endpoint_fields);
            }
        }
        ("monitoring.coreos.com/v1", "PrometheusRule") => {
            keys_within(spec, "spec", &["groups"]);
            for group in spec["groups"].as_array().expect("spec.groups") {
                keys_within(
                    group,
                    "spec.groups[]",
                    &[
                        "name",
                        "interval",
                        "rules",
                        "limit",
                        "partial_response_strategy",
                        "labels",
                    ],
                );
                for rule in group["rules"].as_array().expect("rules") {
                    keys_within(
                        rule,
                        "spec.groups[].rules[]",
                        &[
                            "alert",
                            "record",
                            "expr",
                            "for",
                            "keep_firing_for",
                            "labels",
                            "annotations",
                        ],
                    );
                    assert!(
                        rule["expr"].as_str().is_some_and(|e| !e.trim().is_empty()),
                        "{what}: {}: a rule without an expression: {rule}",
                        describe(doc)
                    );
                }
            }
        }
        (api_version, kind) => panic!("{what}: unexpected {api_version} {kind}"),
    }
}

/// Checks a document: its typed round trip (exact, or for patches without losing anything it
/// says), or the field names of kinds without a k8s-openapi type.
pub fn check_document(what: &str, doc: &Value, exact: bool) {
    match type_of(doc).0 {
        v if v.starts_with("cert-manager.io/") => check_cert_manager(what, doc),
        v if v.starts_with("monitoring.coreos.com/") => check_prometheus_operator(what, doc),
        _ => assert_round_trips(what, doc, exact),
    }
}

pub fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| type_of(o).1 == kind && name_of(o) == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

pub fn typed<K: DeserializeOwned>(doc: &Value) -> K {
    serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{}: {e}", describe(doc)))
}

/// `kubectl kustomize` of `deploy/` with the components under `deploy/components/` named, or
/// None when kubectl is not on PATH. (A copy of `deploy/`, because kustomize takes no absolute
/// paths and a kustomization cannot be written inside `deploy/` without becoming part of it.)
pub fn kustomize_with_components(components: &[&str]) -> Option<String> {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&deploy_dir(), &dir.path().join("deploy"));
    let components: Vec<String> = components
        .iter()
        .map(|c| format!("deploy/components/{c}"))
        .collect();
    let kustomization = json!({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["deploy"],
        "components": components,
    });
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        serde_json::to_string(&kustomization).unwrap(),
    )
    .unwrap();
    kustomize(dir.path())
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

/// `kubectl kustomize DIR`, or None when kubectl is not on PATH.
pub fn kustomize(dir: &Path) -> Option<String> {
    let output = match std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
    {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => panic!("running kubectl: {e}"),
    };
    assert!(
        output.status.success(),
        "kubectl kustomize {} failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    Some(String::from_utf8(output.stdout).expect("UTF-8 output"))
}

/// `confighash ARGS...` as the command line reads it; the arguments must be `serve ...`.
pub fn parse_serve(args: &[String]) -> Result<ServeArgs, clap::Error> {
    let cli = Cli::try_parse_from(std::iter::once("confighash".to_owned()).chain(args.to_vec()))?;
    match cli.command {
        Command::Serve(serve) => Ok(serve),
        other => panic!("the container runs {other:?}, not serve"),
    }
}

// ----- the webhook configuration -----

/// As Kubernetes labels Namespaces: kubernetes.io/metadata.name is always its name.
fn namespace_labels(name: &str, labels: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut l: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    l.insert("kubernetes.io/metadata.name".into(), name.into());
    l
}

/// The webhook matches opted-in namespaces only, never the installation's own, `kube-system` or
/// the excluded ones, and leaves workloads labelled `confighash.dev/enabled=false` alone; its
/// second entry matches workloads labelled `confighash.dev/enabled=true` in the namespaces the
/// first does not match, but the excluded ones, so no write is sent to both.
pub fn check_webhook_selects(objects: &[Value], install: &Install) {
    let configuration: MutatingWebhookConfiguration =
        typed(find(objects, "MutatingWebhookConfiguration", &install.name));
    assert_eq!(configuration.webhooks.as_ref().map(Vec::len), Some(2));
    let webhooks = configuration.webhooks.unwrap();
    let webhook = &webhooks[0];
    let selector = |s: &Option<_>| {
        let value = serde_json::to_value(s).unwrap();
        LabelSelector::from_object(&value).expect("a valid selector")
    };
    let namespaces = selector(&webhook.namespace_selector);
    let objects_selector = selector(&webhook.object_selector);

    let opted_in = [(ENABLED_LABEL, "true")];
    let namespace = namespace_labels;
    assert!(namespaces.matches(&namespace(APP, &opted_in)));
    let watched = |ns: &str| install.watched.is_empty() || install.watched.iter().any(|w| w == ns);
    assert_eq!(
        namespaces.matches(&namespace("team-a", &[(ENABLED_LABEL, "true"), ("x", "y")])),
        watched("team-a")
    );
    assert!(!namespaces.matches(&namespace(APP, &[])));
    assert!(!namespaces.matches(&namespace(APP, &[(ENABLED_LABEL, "false")])));
    assert!(!namespaces.matches(&namespace(APP, &[(ENABLED_LABEL, "True")])));
    assert!(!namespaces.matches(&namespace(APP, &[("confighash.dev/enable", "true")])));
    let never = [install.namespace.as_str(), "kube-system"]
        .into_iter()
        .chain(install.excluded.iter().map(String::as_str));
    for own in never {
        assert!(
            !namespaces.matches(&namespace(own, &opted_in)),
            "{own} must never be matched"
        );
    }

    let labels = |l: &[(&str, &str)]| -> BTreeMap<String, String> {
        l.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert!(objects_selector.matches(&labels(&[])));
    assert!(objects_selector.matches(&labels(&[("app", "web")])));
    assert!(objects_selector.matches(&labels(&[(ENABLED_LABEL, "true")])));
    assert!(!objects_selector.matches(&labels(&[(ENABLED_LABEL, "false")])));

    // The second entry: workloads labelled exactly `true`, in every namespace the first does not
    // select for the label (absent, or any other value), never the excluded ones.
    let second = &webhooks[1];
    assert_eq!(second.name, "workload.confighash.dev");
    let second_namespaces = selector(&second.namespace_selector);
    let second_objects = selector(&second.object_selector);
    for plain in [
        vec![],
        vec![(ENABLED_LABEL, "false")],
        vec![(ENABLED_LABEL, "True")],
        vec![(ENABLED_LABEL, "")],
        vec![("x", "y")],
    ] {
        assert!(
            second_namespaces.matches(&namespace(APP, &plain)),
            "{plain:?}"
        );
    }
    assert!(!second_namespaces.matches(&namespace(APP, &opted_in)));
    assert!(second_objects.matches(&labels(&[(ENABLED_LABEL, "true"), ("app", "web")])));
    for other in [
        vec![],
        vec![(ENABLED_LABEL, "false")],
        vec![(ENABLED_LABEL, "True")],
        vec![("app", "web")],
    ] {
        assert!(!second_objects.matches(&labels(&other)), "{other:?}");
    }

    // Every write, as the API server matches it: an entry is called when its namespaceSelector
    // selects the namespace and its objectSelector the new object or (UPDATE) the old one. No
    // write is sent to both entries, and one is sent exactly when confighash handles it.
    let never: Vec<&str> = [install.namespace.as_str(), "kube-system"]
        .into_iter()
        .chain(install.excluded.iter().map(String::as_str))
        .collect();
    let values = [None, Some("true"), Some("false"), Some("True"), Some("")];
    let with = |value: Option<&'static str>| -> Vec<(&'static str, &'static str)> {
        value.map(|v| vec![(ENABLED_LABEL, v)]).unwrap_or_default()
    };
    for name in std::iter::once(APP).chain(never.iter().copied()) {
        for ns_value in values {
            let ns = namespace(name, &with(ns_value));
            // `None` for the old object: a CREATE.
            for old in std::iter::once(None).chain(values.map(Some)) {
                for new in values {
                    let objects: Vec<BTreeMap<String, String>> = old
                        .into_iter()
                        .chain([new])
                        .map(|v| labels(&with(v)))
                        .collect();
                    let called = |ns_sel: &LabelSelector, obj_sel: &LabelSelector| {
                        ns_sel.matches(&ns) && objects.iter().any(|o| obj_sel.matches(o))
                    };
                    let first = called(&namespaces, &objects_selector);
                    let second = called(&second_namespaces, &second_objects);
                    let what = format!("namespace {name} {ns_value:?}, old {old:?}, new {new:?}");
                    assert!(!(first && second), "{what}: sent to both entries");
                    let handled = !never.contains(&name)
                        && if ns_value == Some("true") {
                            objects
                                .iter()
                                .any(|o| o.get(ENABLED_LABEL).map(String::as_str) != Some("false"))
                        } else {
                            objects
                                .iter()
                                .any(|o| o.get(ENABLED_LABEL).map(String::as_str) == Some("true"))
                        };
                    assert_eq!(first || second, handled, "{what}");
                }
            }
        }
    }
}

/// The webhook names exactly the kinds the code stamps, never blocks a deploy, and reaches the
/// container's webhook port through the installation's Service.
pub fn check_webhook_configuration(objects: &[Value], install: &Install) {
    let configuration: MutatingWebhookConfiguration =
        typed(find(objects, "MutatingWebhookConfiguration", &install.name));
    let webhooks = configuration.webhooks.unwrap();
    let webhook = &webhooks[0];
    assert_eq!(webhook.name, "stamp.confighash.dev");
    assert_eq!(webhook.failure_policy.as_deref(), Some("Ignore"));
    assert_eq!(webhook.side_effects, "None");
    assert_eq!(webhook.reinvocation_policy.as_deref(), Some("IfNeeded"));
    assert_eq!(webhook.admission_review_versions, ["v1"]);
    assert!(
        webhook.client_config.ca_bundle.is_none(),
        "filled in at run time"
    );

    // Exactly the kinds the code stamps: (group, version, plural), CREATE and UPDATE, the main
    // resource only, namespaced.
    let mut expected = BTreeSet::new();
    for kind in WorkloadKind::BUILT_IN {
        let plural = format!("{}s", kind.kind().to_lowercase());
        expected.insert((kind.group().to_owned(), kind.version().to_owned(), plural));
    }
    for kind in &install.workload_kinds {
        expected.insert((
            kind.group.to_owned(),
            kind.version.to_owned(),
            kind.resource.to_owned(),
        ));
    }
    let mut named = BTreeSet::new();
    for rule in webhook.rules.as_ref().unwrap() {
        assert_eq!(
            rule.operations.as_deref(),
            Some(&["CREATE", "UPDATE"].map(String::from)[..])
        );
        assert_eq!(rule.scope.as_deref(), Some("Namespaced"));
        for group in rule.api_groups.as_ref().unwrap() {
            for version in rule.api_versions.as_ref().unwrap() {
                for resource in rule.resources.as_ref().unwrap() {
                    assert!(!resource.contains('/'), "{resource}: main resources only");
                    assert!(
                        named.insert((group.clone(), version.clone(), resource.clone())),
                        "{group}/{version} {resource} named twice"
                    );
                }
            }
        }
    }
    assert_eq!(named, expected);

    // The Service's port 443 targets the container's webhook port, the one serve listens on
    // (`check_deployment`). The client config reaches the webhook through that Service, port
    // 443, /mutate; or, with the chart's webhook.url (development), at an HTTPS URL, a path
    // that skips the Service, which must still reach serve for every other installation.
    let service: Service = typed(find(objects, "Service", &install.name));
    let port = service
        .spec
        .unwrap()
        .ports
        .unwrap()
        .into_iter()
        .find(|p| p.port == 443)
        .expect("the Service has the webhook's port 443");
    let container_port = container_port(objects, install, port.target_port.as_ref().unwrap());
    assert_eq!(container_port, 8443);
    match (&webhook.client_config.service, &webhook.client_config.url) {
        (Some(service_ref), None) => {
            assert_eq!(
                (service_ref.namespace.as_str(), service_ref.name.as_str()),
                (install.namespace.as_str(), install.name.as_str())
            );
            assert_eq!(service_ref.path.as_deref(), Some("/mutate"));
            assert_eq!(service_ref.port, Some(443));
        }
        (None, Some(url)) => {
            assert!(
                url.starts_with("https://") && url.ends_with("/mutate"),
                "webhook.url {url}"
            );
        }
        other => panic!("the client config names a Service or a URL, not {other:?}"),
    }

    // The entry for workloads opted in by their own label is the first but for its name and
    // selectors: the same kinds, Service, timeout and policies.
    assert_eq!(webhooks.len(), 2);
    let mut second = webhooks[1].clone();
    assert_eq!(second.name, "workload.confighash.dev");
    second.name.clone_from(&webhook.name);
    second
        .namespace_selector
        .clone_from(&webhook.namespace_selector);
    second.object_selector.clone_from(&webhook.object_selector);
    assert_eq!(&second, webhook);
}

// ----- the Deployment -----

/// The Deployment's single container.
pub fn container(objects: &[Value], install: &Install) -> Container {
    let deployment: Deployment = typed(find(objects, "Deployment", &install.name));
    let mut containers = deployment.spec.unwrap().template.spec.unwrap().containers;
    assert_eq!(containers.len(), 1);
    containers.remove(0)
}

/// The number of a container port given by number or name.
fn container_port(objects: &[Value], install: &Install, port: &IntOrString) -> i32 {
    match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => {
            container(objects, install)
                .ports
                .unwrap()
                .into_iter()
                .find(|p| p.name.as_deref() == Some(name))
                .unwrap_or_else(|| panic!("no container port named {name}"))
                .container_port
        }
    }
}

/// The Deployment runs `confighash serve` with the installation's names, as the objects around
/// it expect: the ServiceAccount the bindings name, pods the budget and the Service select,
/// ports the probes and the Service use, a lookup deadline well below the webhook's timeout, the
/// serving pair where the certificates are. Returns the parsed arguments.
pub fn check_deployment(objects: &[Value], install: &Install) -> ServeArgs {
    let deployment: Deployment = typed(find(objects, "Deployment", &install.name));
    assert_eq!(
        deployment.metadata.namespace.as_deref(),
        Some(install.namespace.as_str())
    );
    let spec = deployment.spec.clone().unwrap();
    let replicas = spec.replicas.unwrap_or(1);
    let pod_labels = spec.template.metadata.clone().unwrap().labels.unwrap();
    let selects_pods = |selector: &Value| {
        LabelSelector::from_object(selector)
            .unwrap()
            .matches(&pod_labels)
    };
    assert!(selects_pods(&serde_json::to_value(&spec.selector).unwrap()));
    let pod = spec.template.spec.clone().unwrap();
    assert_eq!(pod.termination_grace_period_seconds, Some(30));
    assert_eq!(pod.enable_service_links, Some(false));
    for constraint in pod.topology_spread_constraints.clone().unwrap_or_default() {
        assert!(
            selects_pods(&serde_json::to_value(&constraint.label_selector).unwrap()),
            "{constraint:?} does not select confighash's pods"
        );
    }

    // The ServiceAccount is the one the bindings name.
    let sa = pod.service_account_name.clone().unwrap();
    assert_eq!(sa, name_of(find(objects, "ServiceAccount", &install.name)));
    for kind in ["ClusterRoleBinding", "RoleBinding"] {
        let subjects = &find(objects, kind, &install.name)["subjects"];
        assert_eq!(subjects[0]["name"], sa, "{kind}");
        assert_eq!(
            subjects[0]["namespace"],
            install.namespace.as_str(),
            "{kind}"
        );
    }

    // The budget (when there is one) and the Service select these pods; the budget lets a node
    // that runs a replica be drained.
    if let Some(pdb) = objects
        .iter()
        .find(|o| type_of(o).1 == "PodDisruptionBudget")
    {
        assert_eq!(name_of(pdb), install.name);
        assert!(selects_pods(&pdb["spec"]["selector"]));
        if let Some(min) = pdb["spec"]["minAvailable"].as_i64() {
            assert!(
                min < i64::from(replicas),
                "minAvailable {min} with {replicas} replicas blocks every drain"
            );
        }
    }
    let service = find(objects, "Service", &install.name);
    assert!(selects_pods(
        &json!({"matchLabels": service["spec"]["selector"]})
    ));

    let container = container(objects, install);
    // The arguments are those of `confighash serve`, naming the installation's objects.
    let args = container.args.clone().unwrap();
    let serve = parse_serve(&args)
        .unwrap_or_else(|e| panic!("the Deployment's arguments do not parse: {e}"));
    assert_eq!(serve.key_file, None);
    assert_eq!(
        serve.key_secret, install.key_secret,
        "the name the Role allows"
    );
    assert_eq!(
        serve.certs_secret, install.certs_secret,
        "the name the Role allows"
    );
    assert_eq!(serve.lease, install.name, "the name the Role allows");
    assert_eq!(serve.service, name_of(service));
    assert_eq!(
        serve.webhook_configuration,
        name_of(find(objects, "MutatingWebhookConfiguration", &install.name))
    );
    // The ports the probes and the Service use are the ones serve listens on.
    let ports: BTreeMap<String, i32> = container
        .ports
        .clone()
        .unwrap()
        .into_iter()
        .map(|p| (p.name.unwrap(), p.container_port))
        .collect();
    assert_eq!(ports["webhook"], i32::from(serve.listen.port()));
    assert_eq!(ports["admin"], i32::from(serve.admin_listen.port()));
    assert_eq!((ports["webhook"], ports["admin"]), (8443, 8080));
    for (probe, path) in [
        (container.liveness_probe.clone(), "/livez"),
        (container.readiness_probe.clone(), "/readyz"),
    ] {
        let get = probe.and_then(|p| p.http_get).expect("an HTTP probe");
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(container_port(objects, install, &get.port), 8080, "{path}");
    }
    // The lookups' deadline stays well below the webhook's timeout.
    let configuration: MutatingWebhookConfiguration =
        typed(find(objects, "MutatingWebhookConfiguration", &install.name));
    let timeout = configuration.webhooks.unwrap()[0].timeout_seconds.unwrap();
    assert!(serve.lookup_deadline * 2 <= Duration::from_secs(u64::try_from(timeout).unwrap()));
    if replicas > 1 {
        assert_ne!(
            serve.leader_elect,
            Some(false),
            "several replicas need a leader"
        );
    }

    // The serving pair: written by --self-signed-certs into a writable emptyDir (the root
    // filesystem is read-only), or read from cert-manager's Secret.
    let mount = container
        .volume_mounts
        .clone()
        .unwrap()
        .into_iter()
        .find(|m| m.mount_path == "/var/run/confighash")
        .expect("a mount at /var/run/confighash");
    let volume = pod
        .volumes
        .clone()
        .unwrap()
        .into_iter()
        .find(|v| v.name == mount.name)
        .unwrap();
    if serve.self_signed_certs {
        assert!(volume.empty_dir.is_some(), "{volume:?}");
    } else {
        assert!(volume.secret.is_some(), "{volume:?}");
    }
    assert_eq!(serve.tls_cert, Path::new("/var/run/confighash/tls.crt"));
    assert_eq!(serve.tls_key, Path::new("/var/run/confighash/tls.key"));

    // The leader election identity.
    let env = container.env.clone().unwrap();
    let pod_name = env.iter().find(|e| e.name == "POD_NAME").expect("POD_NAME");
    assert_eq!(
        pod_name
            .value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str()),
        Some("metadata.name")
    );

    // The security context of the issue, matching the image's user.
    let security = serde_json::to_value(container.security_context.clone().unwrap()).unwrap();
    assert_eq!(
        security,
        json!({
            "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": true,
            "runAsGroup": UID,
            "runAsNonRoot": true,
            "runAsUser": UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        })
    );
    serve
}

/// With cert-manager: the Deployment serves the Certificate's Secret, cert-manager injects the
/// CA of a Certificate for the Service's DNS name, and confighash may write no certificates.
pub fn check_cert_manager_install(objects: &[Value], install: &Install) {
    // The Certificate the CA injector reads names the Service's DNS name.
    let webhook = find(objects, "MutatingWebhookConfiguration", &install.name);
    let inject = webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        .as_str()
        .expect("the CA injection annotation");
    let (ns, certificate) = inject.split_once('/').expect("namespace/name");
    assert_eq!(ns, install.namespace);
    let certificate = find(objects, "Certificate", certificate);
    let service = &webhook["webhooks"][0]["clientConfig"]["service"];
    let dns = format!(
        "{}.{}.svc",
        service["name"].as_str().unwrap(),
        service["namespace"].as_str().unwrap()
    );
    let names: Vec<&str> = certificate["spec"]["dnsNames"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(names.contains(&dns.as_str()), "{names:?} lack {dns}");
    // Its issuer, when the installation makes it, is a CA Issuer whose CA is a Certificate
    // from a self-signed Issuer; otherwise it is the administrator's, and none is made.
    let issuer_ref = &certificate["spec"]["issuerRef"];
    let own = objects.iter().find(|o| {
        type_of(o).1 == "Issuer"
            && issuer_ref["kind"] == "Issuer"
            && o["metadata"]["name"] == issuer_ref["name"]
    });
    match own {
        Some(issuer) => {
            let ca_secret = issuer["spec"]["ca"]["secretName"]
                .as_str()
                .expect("a CA issuer");
            let ca = objects
                .iter()
                .find(|o| type_of(o).1 == "Certificate" && o["spec"]["secretName"] == ca_secret)
                .expect("the CA Certificate");
            assert_eq!(ca["spec"]["isCA"], true);
            let root_issuer = find(
                objects,
                "Issuer",
                ca["spec"]["issuerRef"]["name"].as_str().unwrap(),
            );
            assert!(root_issuer["spec"]["selfSigned"].is_object());
        }
        None => {
            assert!(
                !objects.iter().any(|o| type_of(o).1 == "Issuer"),
                "an issuer of the administrator's, yet Issuers are made"
            );
            assert_eq!(
                objects
                    .iter()
                    .filter(|o| type_of(o).1 == "Certificate")
                    .count(),
                1,
                "only the serving Certificate"
            );
        }
    }

    // The Deployment mounts the Certificate's Secret and serves the pair from it.
    let deployment: Deployment = typed(find(objects, "Deployment", &install.name));
    let pod = deployment.spec.unwrap().template.spec.unwrap();
    let container = &pod.containers[0];
    let args = container.args.clone().unwrap();
    assert!(!args.iter().any(|a| a == "--self-signed-certs"), "{args:?}");
    let serve = parse_serve(&args).expect("the arguments parse");
    let secret_name = certificate["spec"]["secretName"].as_str().unwrap();
    let volume = pod
        .volumes
        .unwrap()
        .into_iter()
        .find(|v| v.secret.as_ref().and_then(|s| s.secret_name.as_deref()) == Some(secret_name))
        .expect("a volume of the Certificate's Secret");
    assert!(volume.empty_dir.is_none(), "{volume:?}");
    let mount = container
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| m.name == volume.name)
        .expect("the Secret is mounted");
    for file in [&serve.tls_cert, &serve.tls_key] {
        assert_eq!(
            file.parent(),
            Some(Path::new(&mount.mount_path)),
            "{file:?}"
        );
    }
    assert_eq!(serve.tls_cert.file_name().unwrap(), "tls.crt");
    assert_eq!(serve.tls_key.file_name().unwrap(), "tls.key");
}

// ----- RBAC -----

/// A request the code makes, or must never be allowed to.
#[derive(Debug, Clone)]
pub struct Req {
    verb: &'static str,
    group: &'static str,
    /// resource[/subresource]
    resource: &'static str,
    namespace: Option<String>,
    name: Option<String>,
}

impl Req {
    fn attributes(&self) -> RequestAttributes<'_> {
        let (resource, subresource) = self.resource.split_once('/').unwrap_or((self.resource, ""));
        RequestAttributes {
            verb: self.verb,
            api_group: self.group,
            resource,
            subresource,
            namespace: self.namespace.as_deref(),
            name: self.name.as_deref(),
            path: "",
            resource_request: true,
        }
    }
}

fn req(
    verb: &'static str,
    group: &'static str,
    resource: &'static str,
    namespace: Option<&str>,
    name: Option<&str>,
) -> Req {
    Req {
        verb,
        group,
        resource,
        namespace: namespace.map(str::to_owned),
        name: name.map(str::to_owned),
    }
}

const LEASES: &str = "coordination.k8s.io";
const ADMISSION: &str = "admissionregistration.k8s.io";
const WEBHOOKS: &str = "mutatingwebhookconfigurations";
const RBAC: &str = "rbac.authorization.k8s.io";
const EVENTS: &str = "events.k8s.io";

/// Every request `confighash serve` makes, read from the code, but those of
/// `--self-signed-certs`.
pub fn code_requests(install: &Install) -> Vec<Req> {
    let own = Some(install.namespace.as_str());
    let app = Some(APP);
    let key = Some(install.key_secret.as_str());
    let lease = Some(install.name.as_str());
    let mut reqs = vec![
        // src/certs/key.rs: read the key Secret, create it when absent, watch it by name (list and
        // watch with a metadata.name field selector carry that name).
        req("get", "", "secrets", own, key),
        req("create", "", "secrets", own, None),
        req("list", "", "secrets", own, key),
        req("watch", "", "secrets", own, key),
        // crates/watcher/src/leader.rs: read the Lease, create it, renew, take over and release it by update.
        req("get", LEASES, "leases", own, lease),
        req("create", LEASES, "leases", own, None),
        req("update", LEASES, "leases", own, lease),
        // crates/webhook/src/lookup.rs: the webhook reads referenced objects.
        req("get", "", "configmaps", app, Some("app-env")),
        req("get", "", "secrets", app, Some("db")),
        // crates/watcher/src/run.rs: watches of Namespaces, cluster-wide.
        req("list", "", "namespaces", None, None),
        req("watch", "", "namespaces", None, None),
        // crates/watcher/src/pod_watch.rs: a progressive wave watches the pods of a namespace.
        req("list", "", "pods", app, None),
        req("watch", "", "pods", app, None),
        // kube's Recorder: an events.k8s.io Event, patched when it repeats.
        req("create", EVENTS, "events", app, None),
        req("patch", EVENTS, "events", app, Some("web.17a2b3c4d5e6f708")),
    ];
    // crates/watcher/src/run.rs: watch ConfigMaps, Secrets and every workload kind, cluster-wide or in
    // each namespace of --watch-namespaces; touch a workload with a patch, read it when the
    // patch's condition fails.
    let scopes: Vec<Option<&str>> = if install.watched.is_empty() {
        vec![None]
    } else {
        install.watched.iter().map(|n| Some(n.as_str())).collect()
    };
    for scope in scopes {
        for resource in ["configmaps", "secrets"] {
            reqs.push(req("list", "", resource, scope, None));
            reqs.push(req("watch", "", resource, scope, None));
        }
        for (group, resource) in install.workload_resources() {
            reqs.push(req("list", group, resource, scope, None));
            reqs.push(req("watch", group, resource, scope, None));
        }
    }
    for (group, resource) in install.workload_resources() {
        reqs.push(req("get", group, resource, app, Some("web")));
        reqs.push(req("patch", group, resource, app, Some("web")));
    }
    reqs
}

/// A namespace outside every `--watch-namespaces` list of the tests.
pub const UNWATCHED: &str = "payroll";

/// What least-privilege mode must not be allowed: reading ConfigMaps and Secrets of the whole
/// cluster, or of a namespace outside the list, and touching workloads there.
pub fn unwatched_requests(install: &Install) -> Vec<Req> {
    let other = Some(UNWATCHED);
    let mut reqs = vec![
        req("list", "", "secrets", None, None),
        req("watch", "", "secrets", None, None),
        req("list", "", "configmaps", None, None),
        req("get", "", "secrets", other, Some("db")),
        req("list", "", "secrets", other, None),
        req("get", "", "configmaps", other, Some("app-env")),
        req("create", EVENTS, "events", other, None),
    ];
    for (group, resource) in install.workload_resources() {
        reqs.push(req("list", group, resource, None, None));
        reqs.push(req("patch", group, resource, other, Some("web")));
    }
    reqs
}

/// The requests of `--self-signed-certs` (src/certs/selfsigned.rs): read, create (as the key does)
/// and replace its Secret; read the webhook configuration and JSON-patch its caBundle.
pub fn self_signed_requests(install: &Install) -> Vec<Req> {
    let own = Some(install.namespace.as_str());
    let certs = Some(install.certs_secret.as_str());
    let configuration = Some(install.name.as_str());
    vec![
        req("get", "", "secrets", own, certs),
        req("create", "", "secrets", own, None),
        req("update", "", "secrets", own, certs),
        req("get", ADMISSION, WEBHOOKS, None, configuration),
        req("patch", ADMISSION, WEBHOOKS, None, configuration),
    ]
}

/// (group, plural) of the workload kinds the code handles without configuration.
fn workload_resources() -> Vec<(&'static str, &'static str)> {
    WorkloadKind::BUILT_IN
        .into_iter()
        .zip([
            "deployments",
            "statefulsets",
            "daemonsets",
            "cronjobs",
            "rollouts",
        ])
        .map(|(kind, plural)| (kind.group(), plural))
        .collect()
}

/// Requests confighash must never be allowed.
pub fn forbidden_requests(install: &Install) -> Vec<Req> {
    let own = Some(install.namespace.as_str());
    let app = Some(APP);
    let system = Some("kube-system");
    let name = Some(install.name.as_str());
    let key = Some(install.key_secret.as_str());
    let certs = Some(install.certs_secret.as_str());
    let mut reqs = vec![
        // Config is read, never written.
        req("update", "", "configmaps", app, Some("app-env")),
        req("patch", "", "configmaps", app, Some("app-env")),
        req("create", "", "configmaps", app, None),
        req("delete", "", "configmaps", app, Some("app-env")),
        req("deletecollection", "", "configmaps", app, None),
        // Secrets outside its namespace, and its own but for the certificate Secret, are
        // read-only.
        req("create", "", "secrets", app, None),
        req("update", "", "secrets", app, Some("db")),
        req(
            "patch",
            "",
            "secrets",
            system,
            Some("bootstrap-token-abcdef"),
        ),
        req("delete", "", "secrets", app, Some("db")),
        req("update", "", "secrets", own, Some("someone-else")),
        req("patch", "", "secrets", own, Some("someone-else")),
        // It never rewrites or deletes its key (a replaced key is reloaded, not written).
        req("update", "", "secrets", own, key),
        req("patch", "", "secrets", own, key),
        req("delete", "", "secrets", own, key),
        req("delete", "", "secrets", own, certs),
        // Pods, anywhere: nothing but list and watch (progressive waves watch the pods of a
        // namespace while they judge there; a ClusterRole that grants that in every namespace
        // grants the cluster-wide list too, which shows no more than listing the workloads does).
        req("get", "", "pods", app, Some("web-abc")),
        req("create", "", "pods", app, None),
        req("delete", "", "pods", app, Some("web-abc")),
        req("create", "", "pods/eviction", app, Some("web-abc")),
        req("create", "", "pods/exec", app, Some("web-abc")),
        // Namespaces: followed, never read by name or changed.
        req("get", "", "namespaces", None, Some(APP)),
        req("patch", "", "namespaces", None, Some(APP)),
        req("delete", "", "namespaces", None, Some(APP)),
        // Jobs are passed through, not touched.
        req("patch", "batch", "jobs", app, Some("migrate")),
        // Other webhook configurations, and its own beyond the caBundle patch.
        req("list", ADMISSION, WEBHOOKS, None, None),
        req("watch", ADMISSION, WEBHOOKS, None, None),
        req("patch", ADMISSION, WEBHOOKS, None, Some("other")),
        req("update", ADMISSION, WEBHOOKS, None, name),
        req("delete", ADMISSION, WEBHOOKS, None, name),
        req("create", ADMISSION, WEBHOOKS, None, None),
        req(
            "patch",
            ADMISSION,
            "validatingwebhookconfigurations",
            None,
            name,
        ),
        // Leases of others, or deleting its own.
        req(
            "update",
            LEASES,
            "leases",
            system,
            Some("kube-controller-manager"),
        ),
        req("update", LEASES, "leases", own, Some("other")),
        req("delete", LEASES, "leases", own, name),
        // Core Events (the Recorder writes events.k8s.io), and reading Events.
        req("create", "", "events", app, None),
        req("list", EVENTS, "events", None, None),
        // No escalation.
        req("create", RBAC, "clusterrolebindings", None, None),
        req("bind", RBAC, "clusterroles", None, Some("cluster-admin")),
        req("escalate", RBAC, "roles", own, name),
        req("create", "", "serviceaccounts/token", own, name),
        req("impersonate", "", "users", None, Some("admin")),
    ];
    for (group, resource) in install.workload_resources() {
        reqs.push(req("create", group, resource, app, None));
        reqs.push(req("update", group, resource, app, Some("web")));
        reqs.push(req("delete", group, resource, app, Some("web")));
        reqs.push(req("deletecollection", group, resource, app, None));
    }
    for sub in ["deployments/scale", "deployments/status"] {
        reqs.push(req("patch", "apps", sub, app, Some("web")));
    }
    reqs
}

/// The RBAC documents among `objects`, as multi-document YAML.
pub fn rbac_yaml(objects: &[Value]) -> String {
    objects
        .iter()
        .filter(|o| type_of(o).0 == "rbac.authorization.k8s.io/v1")
        .map(|o| serde_saphyr::to_string(o).unwrap())
        .collect::<Vec<_>>()
        .join("---\n")
}

/// The installation's RBAC allows every request the code makes (with `--self-signed-certs`,
/// those too, and without it not its writes) and denies what it must not, to its own
/// ServiceAccount only.
pub fn check_rbac(rbac: &str, install: &Install, self_signed: bool) {
    let authz = Authorizer::from_yaml(rbac).expect("valid RBAC");
    let sa = UserInfo::service_account(&install.namespace, &install.name);
    let needed: Vec<Req> = if self_signed {
        code_requests(install)
            .into_iter()
            .chain(self_signed_requests(install))
            .collect()
    } else {
        code_requests(install)
    };
    for r in &needed {
        assert!(authz.allows(&sa, &r.attributes()), "denied: {r:?}");
    }
    let mut forbidden = forbidden_requests(install);
    if !install.watched.is_empty() {
        forbidden.extend(unwatched_requests(install));
    }
    if !self_signed {
        // confighash writes no certificates then, so it may not. (Reading and creating
        // Secrets stay allowed: the watcher reads them all, and the key Secret is created
        // when absent.)
        forbidden.extend(
            self_signed_requests(install)
                .into_iter()
                .filter(|r| r.resource == WEBHOOKS || r.verb == "update"),
        );
    }
    for r in &forbidden {
        assert!(!authz.allows(&sa, &r.attributes()), "allowed: {r:?}");
    }
    // Discovery of the workload kinds is a non-resource request every user may make.
    for path in [
        "/apis/apps/v1",
        "/apis/batch/v1",
        "/apis/argoproj.io/v1alpha1",
    ] {
        let req = RequestAttributes {
            verb: "get",
            api_group: "",
            resource: "",
            subresource: "",
            namespace: None,
            name: None,
            path,
            resource_request: false,
        };
        assert!(authz.allows(&sa, &req), "{path}");
    }
    // The grants are the ServiceAccount's own: the same name in another namespace gets nothing.
    let impostor = UserInfo::service_account(APP, &install.name);
    for r in &needed {
        assert!(
            !authz.allows(&impostor, &r.attributes()),
            "allowed to {APP}/{}: {r:?}",
            install.name
        );
    }
}

// ----- the code under the RBAC, against the in-memory API server -----

const DEADLINE: Duration = Duration::from_secs(20);

async fn eventually(what: &str, check: impl AsyncFnMut() -> bool) {
    wait::eventually_within(what, DEADLINE, check).await;
}

async fn create_namespace(admin: &kube::Client, name: &str, labels: &[(&str, &str)]) {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(namespace_labels(name, labels)),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("namespace created");
}

async fn set_config(admin: &kube::Client, value: &str) {
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), APP);
    let patch = json!({"data": {"LOG_LEVEL": value}});
    cms.patch("app-env", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("ConfigMap changed");
}

async fn template_stamp(admin: &kube::Client) -> Option<String> {
    let deploys: Api<Deployment> = Api::namespaced(admin.clone(), APP);
    let d = deploys.get("web").await.ok()?;
    d.spec?
        .template
        .metadata?
        .annotations?
        .get(CHECKSUM_ANNOTATION)
        .cloned()
}

/// Runs the code that talks to the API server as the installation's ServiceAccount, with the
/// names its Deployment passes (`serve`, through the `app::Config` it makes and the App's
/// constructors of each part), the installation's self-signed webhook configuration and its RBAC
/// enforced: a request it does not allow is answered 403, which would stop each step below.
pub async fn run_code_under_rbac(
    install: &Install,
    rbac: &str,
    configuration: &MutatingWebhookConfiguration,
    serve: &ServeArgs,
) {
    let own = install.namespace.as_str();
    let app_config = serve
        .to_config()
        .expect("the chart's --workload-kind flags are valid");
    let app::KeySource::Secret(key_secret) = &app_config.key else {
        panic!(
            "the installation reads the key from a Secret: {:?}",
            app_config.key
        );
    };
    let server = ApiServer::start().await;
    let admin = server.client();
    create_namespace(&admin, own, &[]).await;
    create_namespace(&admin, APP, &[(ENABLED_LABEL, "true")]).await;
    server.add_token(
        "confighash-token",
        UserInfo::service_account(own, &install.name),
    );
    server.set_authorizer(Some(Authorizer::from_yaml(rbac).unwrap()));
    let mut config = server.config_with_token("confighash-token");
    config.default_namespace = own.into();
    // As `serve` builds it.
    let getter = confighash::cluster::get::Getter::new(&config).unwrap();
    let client = confighash::cluster::client::build(config, confighash::app::READS).unwrap();

    // RBAC is enforced: confighash may not write config.
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), APP);
    let mut cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some("app-env".into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("LOG_LEVEL".into(), "info".into())])),
        ..Default::default()
    };
    match Api::<ConfigMap>::namespaced(client.clone(), APP)
        .create(&PostParams::default(), &cm)
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("expected 403 Forbidden, got {other:?}"),
    }
    cms.create(&PostParams::default(), &cm).await.unwrap();
    cm.metadata.name = Some("unrelated".into());
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let db = Secret {
        metadata: ObjectMeta {
            name: Some("db".into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "password".into(),
            ByteString(b"s3cret".to_vec()),
        )])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(admin.clone(), APP)
        .create(&PostParams::default(), &db)
        .await
        .unwrap();

    // The key: created when absent, then watched by name; a replaced key is reloaded.
    let keys = key::from_secret(client.clone(), own, key_secret)
        .await
        .expect("the key Secret is created under the RBAC");
    let key_watch = tokio::spawn(key::watch_secret(
        keys.clone(),
        client.clone(),
        own.into(),
        key_secret.clone(),
    ));
    let first_id = keys.current().id().to_owned();
    let replaced = json!({"data": {"key": "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="}});
    Api::<Secret>::namespaced(admin.clone(), own)
        .patch(
            key_secret,
            &PatchParams::default(),
            &Patch::Merge(&replaced),
        )
        .await
        .unwrap();
    eventually("the replaced key to be reloaded", || {
        let changed = keys.current().id() != first_id;
        async move { changed }
    })
    .await;

    // Leader election on the Lease --lease names: create, renew, release.
    let leader_config = LeaderConfig {
        retry_period: Duration::from_millis(100),
        renew_deadline: Duration::from_secs(2),
        lease_duration: Duration::from_secs(3),
        ..App::leader_config(
            &app::Config {
                identity: Some("replica-a".into()),
                ..app_config.clone()
            },
            own,
        )
    };
    assert_eq!(leader_config.lease_name, serve.lease);
    let (leadership, election) = leader::spawn(client.clone(), leader_config.clone());
    eventually("leadership", || {
        let leading = leadership.is_leader();
        async move { leading }
    })
    .await;
    // Renewals (updates) keep it: wait for two of them, then check it still leads.
    eventually("two Lease renewals", || {
        let renewals = server
            .requests()
            .iter()
            .filter(|(verb, resource)| verb == "update" && resource == "leases")
            .count();
        async move { renewals >= 2 }
    })
    .await;
    assert!(leadership.is_leader(), "renewing the Lease failed");

    // --self-signed-certs: the CA and serving pair in the Secret --certs-secret names, the CA in
    // the caBundle of the installation's webhook configuration.
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(admin.clone());
    configurations
        .create(&PostParams::default(), configuration)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let certs = App::self_signed_config(
        &app::Config {
            certs: app::CertSource {
                cert: dir.path().join("tls.crt"),
                key: dir.path().join("tls.key"),
                ..app_config.certs.clone()
            },
            ..app_config.clone()
        },
        own,
    )
    .expect("the installation makes its own certificates");
    assert_eq!(certs.secret_name, serve.certs_secret);
    selfsigned::ensure(&client, &certs)
        .await
        .expect("the certificates are made under the RBAC");
    let ca_bundle = || async {
        configurations
            .get(&serve.webhook_configuration)
            .await
            .unwrap()
            .webhooks
            .unwrap()[0]
            .client_config
            .ca_bundle
            .clone()
    };
    assert!(ca_bundle().await.is_some(), "the caBundle is published");
    // A CA rotation's first steps: the Secret is updated, the two-CA bundle patched in.
    let first_bundle = ca_bundle().await;
    let mut rotate = certs.clone();
    rotate.rotate_ca_before = rotate.ca_validity * 2;
    rotate.check_interval = Duration::from_secs(3600);
    selfsigned::ensure(&client, &rotate)
        .await
        .expect("the CA is rotated under the RBAC");
    assert_ne!(ca_bundle().await, first_bundle, "the new CA is published");

    // The webhook's lookups.
    let source = KubeSource::new(getter);
    for object in [
        ObjectRef::new(ObjectKind::ConfigMap, "app-env"),
        ObjectRef::new(ObjectKind::Secret, "db"),
    ] {
        let budget = confighash::webhook::budget::MemoryBudget::new(1 << 20);
        let fetched = source.fetch(APP, &object, &budget).await;
        assert!(matches!(fetched, Ok(Some(_))), "{object}: {fetched:?}");
    }

    // The watcher: watches every kind, touches a workload whose ConfigMap changed, and records
    // (then, when it repeats, patches) its Event.
    let web: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{
                    "name": "web",
                    "image": "nginx",
                    "envFrom": [{"configMapRef": {"name": "app-env"}}, {"secretRef": {"name": "db"}}],
                }]},
            },
        },
    }))
    .unwrap();
    Api::<Deployment>::namespaced(admin.clone(), APP)
        .create(&PostParams::default(), &web)
        .await
        .unwrap();
    let metrics = Arc::new(Metrics::new());
    let watcher_task = tokio::spawn(watcher::run(
        client.clone(),
        keys.clone(),
        leadership.clone(),
        metrics.clone(),
        WatcherConfig {
            debounce: Duration::from_millis(100),
            retry_base: Duration::from_millis(100),
            kind_recheck: Duration::from_millis(500),
            identity: "replica-a".into(),
            ..Default::default()
        },
    ));
    eventually("the watcher's caches to sync", || {
        let synced = metrics
            .encode()
            .lines()
            .any(|l| l == "confighash_watcher_cache_synced 1");
        async move { synced }
    })
    .await;
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(admin.clone(), APP);
    let config_changed = || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("ConfigChanged"))
            .collect::<Vec<_>>()
    };
    for (round, value) in ["debug", "warn"].into_iter().enumerate() {
        let before = template_stamp(&admin).await;
        set_config(&admin, value).await;
        eventually("the touch", || async {
            let now = template_stamp(&admin).await;
            now.is_some() && now != before
        })
        .await;
        // The Event: created the first time, patched (a series) the second.
        eventually("the ConfigChanged Event", || async {
            let found = config_changed().await;
            let count = found
                .first()
                .map(|e| e.series.as_ref().map_or(1, |s| s.count));
            found.len() == 1 && count == Some(i32::try_from(round).unwrap() + 1)
        })
        .await;
    }
    assert_eq!(metrics.touches("touched"), 2);
    assert_eq!(metrics.touches("error"), 0);
    // Stamped with the key read under the RBAC (whatever the recipe version).
    let stamp = template_stamp(&admin).await.unwrap();
    assert!(
        stamp.contains(&format!(":{}:", keys.current().id())),
        "{stamp}"
    );

    // Releasing the Lease at shutdown.
    election.abort();
    let _ = election.await;
    assert!(
        leader::release(client.clone(), &leader_config)
            .await
            .expect("the Lease is released under the RBAC")
    );

    watcher_task.abort();
    key_watch.abort();
    // Deleting is the administrator's business: the ServiceAccount may not.
    match Api::<Secret>::namespaced(client.clone(), own)
        .delete(key_secret, &DeleteParams::default())
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("expected 403 Forbidden, got {other:?}"),
    }
}

// ----- which entry the API server calls -----

/// The installation's webhook configuration in the in-memory API server (its admission
/// evaluates namespaceSelector and objectSelector as kube-apiserver does), each entry pointed at
/// a webhook that changes nothing: every write, CREATE or UPDATE (a merge patch), calls exactly
/// the entries it should, counted per entry, and never both. An UPDATE that adds or removes a
/// label is matched on the old object and the new one.
pub async fn check_webhook_calls(configuration: &MutatingWebhookConfiguration, install: &Install) {
    const STAMP: &str = "stamp.confighash.dev";
    const WORKLOAD: &str = "workload.confighash.dev";
    let hook = crate::apiserver::TestWebhook::start(|_| json!({"allowed": true})).await;
    let mut configuration = serde_json::to_value(configuration).unwrap();
    for entry in configuration["webhooks"].as_array_mut().unwrap() {
        entry["clientConfig"] = json!({"url": hook.url, "caBundle": hook.certs.ca_bundle()});
    }
    let server = ApiServer::start().await;
    let admin = server.client();
    Api::<MutatingWebhookConfiguration>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(configuration).unwrap(),
        )
        .await
        .expect("the webhook configuration is accepted");

    // Writes one workload and returns the entries called, in order.
    let write = async |ns: &str, name: &str, labels: Value| -> Vec<String> {
        let before = server.webhook_calls().len();
        let deploys: Api<Deployment> = Api::namespaced(admin.clone(), ns);
        if deploys.get_opt(name).await.unwrap().is_some() {
            let patch = json!({"metadata": {"labels": labels}});
            deploys
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .expect("workload updated");
        } else {
            let mut labels = labels;
            labels["app"] = json!("web");
            let d: Deployment = serde_json::from_value(json!({
                "metadata": {"name": name, "labels": labels},
                "spec": {
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {
                        "metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{"name": "web", "image": "nginx"}]},
                    },
                },
            }))
            .unwrap();
            deploys
                .create(&PostParams::default(), &d)
                .await
                .expect("workload created");
        }
        server.webhook_calls()[before..]
            .iter()
            .map(|c| {
                assert_eq!(c.configuration, install.name);
                c.webhook.clone()
            })
            .collect()
    };
    let set = |value: &str| json!({ENABLED_LABEL: value});
    let unset = || json!({ENABLED_LABEL: null});
    let other = |n: u32| json!({"touched": n.to_string()});

    // An opted-in namespace: the first entry, for everything not labelled false (old or new).
    create_namespace(&admin, APP, &[(ENABLED_LABEL, "true")]).await;
    let steps: [(&str, Value, &[&str]); 10] = [
        ("plain", json!({}), &[STAMP]),
        ("labelled", set("true"), &[STAMP]),
        ("out", set("false"), &[]),
        ("plain", set("true"), &[STAMP]),
        ("labelled", set("false"), &[STAMP]),
        ("labelled", other(1), &[]),
        ("out", unset(), &[STAMP]),
        ("out", set("false"), &[STAMP]),
        ("out", other(2), &[]),
        ("plain", unset(), &[STAMP]),
    ];
    for (i, (name, labels, expected)) in steps.into_iter().enumerate() {
        let called = write(APP, name, labels.clone()).await;
        assert_eq!(called, expected, "{APP} step {i}: {name} {labels}");
    }

    // Namespaces not opted in (no label, or another value): the second entry, for workloads
    // labelled true (old or new), so once per write.
    for (ns, ns_labels) in [
        ("plain", vec![]),
        ("off", vec![(ENABLED_LABEL, "false")]),
        ("capital", vec![(ENABLED_LABEL, "True")]),
    ] {
        create_namespace(&admin, ns, &ns_labels).await;
        let steps: [(&str, Value, &[&str]); 11] = [
            ("plain", json!({}), &[]),
            ("labelled", set("true"), &[WORKLOAD]),
            ("out", set("false"), &[]),
            ("labelled", other(1), &[WORKLOAD]),
            ("plain", set("true"), &[WORKLOAD]),
            ("plain", unset(), &[WORKLOAD]),
            ("plain", other(2), &[]),
            ("labelled", set("false"), &[WORKLOAD]),
            ("labelled", other(3), &[]),
            ("out", set("true"), &[WORKLOAD]),
            ("out", set("True"), &[WORKLOAD]),
        ];
        for (i, (name, labels, expected)) in steps.into_iter().enumerate() {
            let called = write(ns, name, labels.clone()).await;
            assert_eq!(called, expected, "{ns} step {i}: {name} {labels}");
        }
    }

    // The excluded namespaces, opted in or not: neither entry, whatever the workload says.
    let excluded = [install.namespace.as_str(), "kube-system"]
        .into_iter()
        .chain(install.excluded.iter().map(String::as_str));
    for ns in excluded {
        let namespaces: Api<Namespace> = Api::all(admin.clone());
        if namespaces.get_opt(ns).await.unwrap().is_none() {
            create_namespace(&admin, ns, &[]).await;
        }
        for (ns_label, round) in [(json!("true"), 0), (Value::Null, 1), (json!("false"), 2)] {
            let patch = json!({"metadata": {"labels": {ENABLED_LABEL: ns_label}}});
            namespaces
                .patch(ns, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
            for (name, labels) in [
                (format!("plain-{round}"), json!({})),
                (format!("labelled-{round}"), set("true")),
                (format!("plain-{round}"), set("true")),
                (format!("labelled-{round}"), unset()),
                (format!("labelled-{round}"), set("false")),
            ] {
                let called = write(ns, &name, labels.clone()).await;
                assert!(
                    called.is_empty(),
                    "excluded {ns} (label {ns_label}): {name} {labels} called {called:?}"
                );
            }
        }
    }
    assert_eq!(
        hook.calls(),
        server.webhook_calls().len(),
        "every call counted reached the webhook"
    );
}

//! What a platform engineer installs, checked against the code:
//!
//! - every document under `deploy/` parses into its k8s-openapi type and serialises back without
//!   losing a field (so a misspelt field fails here, not in a cluster), and so do the documents
//!   `kubectl kustomize` renders for `deploy/` and `deploy/cert-manager/` when kubectl is on PATH;
//! - the webhook configuration selects opted-in namespaces only, never `confighash` or
//!   `kube-system`, and names exactly the workload kinds the code handles;
//! - the Deployment's arguments parse with the code's command line, and the Deployment, Service,
//!   budget and webhook configuration agree on names, labels and ports;
//! - the RBAC allows every request the code makes and denies what it must not, as a table and by
//!   running the key, leader election, lookup and watcher code as the ServiceAccount against the
//!   in-memory API server with that RBAC enforced;
//! - the Dockerfile names the same user and ports as the manifests and builds as CI does.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use apiserver::ApiServer;
use apiserver::rbac::{Authorizer, RequestAttributes};
use apiserver::selectors::LabelSelector;
use apiserver::user::UserInfo;
use clap::Parser;
use confighash::cli::{Cli, Command, ServeArgs};
use confighash::key;
use confighash::leader::{self, LeaderConfig};
use confighash::lookup::{ConfigSource, KubeSource};
use confighash::metrics::Metrics;
use confighash::refs::{ObjectKind, ObjectRef};
use confighash::selfsigned::{self, SelfSignedConfig};
use confighash::watcher::{self, WatcherConfig};
use confighash::workload::{CHECKSUM_ANNOTATION, ENABLED_LABEL, WorkloadKind};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// confighash's namespace, ServiceAccount, Service, Lease and webhook configuration name.
const NAME: &str = "confighash";
/// The checksum key Secret (`--key-secret` default).
const KEY_SECRET: &str = "confighash-key";
/// The Secret `--self-signed-certs` keeps its CA and serving pair in.
const CERTS_SECRET: &str = "confighash-certs";
/// The user confighash's pods run as (nobody), in the manifests and the image.
const UID: i64 = 65534;
/// An opted-in application namespace.
const APP: &str = "shop";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn deploy_dir() -> PathBuf {
    root().join("deploy")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every `.yaml` and `.yml` file under `dir`, recursively, in path order.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_owned()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The documents of a multi-document YAML text (empty documents left out).
fn documents(what: &str, text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap_or_else(|e| panic!("{what}: not valid YAML: {e}"))
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

fn type_of(doc: &Value) -> (&str, &str) {
    (
        doc["apiVersion"].as_str().unwrap_or(""),
        doc["kind"].as_str().unwrap_or(""),
    )
}

fn name_of(doc: &Value) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or("")
}

/// "Kind namespace/name", for messages.
fn describe(doc: &Value) -> String {
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
fn typed_round_trip(doc: &Value) -> Result<Value, String> {
    match type_of(doc) {
        ("v1", "Namespace") => via::<Namespace>(doc),
        ("v1", "ServiceAccount") => via::<ServiceAccount>(doc),
        ("v1", "Service") => via::<Service>(doc),
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
fn differences(before: &Value, after: &Value, path: &str, exact: bool, out: &mut Vec<String>) {
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
fn assert_round_trips(what: &str, doc: &Value, exact: bool) {
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
fn check_cert_manager(what: &str, doc: &Value) {
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

fn is_cert_manager(doc: &Value) -> bool {
    type_of(doc).0.starts_with("cert-manager.io/")
}

/// What kustomization files say: the files they include and the patch files they apply.
#[derive(Debug, Default)]
struct Kustomizations {
    resources: BTreeSet<PathBuf>,
    patches: BTreeSet<PathBuf>,
}

fn kustomizations(files: &[PathBuf]) -> Kustomizations {
    let mut k = Kustomizations::default();
    for file in files.iter().filter(|f| f.ends_with("kustomization.yaml")) {
        let dir = file.parent().unwrap();
        let what = file.display().to_string();
        let docs = documents(&what, &read(file));
        assert_eq!(docs.len(), 1, "{what}: one document");
        let doc = &docs[0];
        assert_eq!(
            type_of(doc),
            ("kustomize.config.k8s.io/v1beta1", "Kustomization"),
            "{what}"
        );
        for key in doc.as_object().unwrap().keys() {
            assert!(
                ["apiVersion", "kind", "resources", "patches", "images"].contains(&key.as_str()),
                "{what}: {key}: only resources, patches and images are used here"
            );
        }
        for entry in doc["resources"].as_array().expect("resources") {
            let path = dir.join(entry.as_str().expect("a path"));
            assert!(path.exists(), "{what}: {} does not exist", path.display());
            if path.is_dir() {
                assert!(
                    path.join("kustomization.yaml").is_file(),
                    "{what}: {} has no kustomization.yaml",
                    path.display()
                );
            } else {
                k.resources.insert(path.canonicalize().unwrap());
            }
        }
        for patch in doc["patches"].as_array().into_iter().flatten() {
            if let Some(p) = patch["path"].as_str() {
                let path = dir.join(p);
                assert!(path.is_file(), "{what}: {} does not exist", path.display());
                k.patches.insert(path.canonicalize().unwrap());
            } else {
                assert!(
                    patch["patch"].is_string() && patch["target"]["kind"].is_string(),
                    "{what}: an inline patch needs a target kind"
                );
            }
        }
    }
    k
}

/// The base's documents, from the files deploy/base/kustomization.yaml lists, in order.
fn base_objects() -> Vec<Value> {
    let dir = deploy_dir().join("base");
    let kustomization = documents("base kustomization", &read(&dir.join("kustomization.yaml")));
    let mut objects = Vec::new();
    for entry in kustomization[0]["resources"].as_array().unwrap() {
        let path = dir.join(entry.as_str().unwrap());
        objects.extend(documents(&path.display().to_string(), &read(&path)));
    }
    objects
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| type_of(o).1 == kind && name_of(o) == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn typed<K: DeserializeOwned>(doc: &Value) -> K {
    serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{}: {e}", describe(doc)))
}

/// `kubectl kustomize DIR`, or None when kubectl is not on PATH.
fn kustomize(dir: &Path) -> Option<String> {
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

#[test]
fn every_document_under_deploy_survives_its_type() {
    let files = yaml_files(&deploy_dir());
    let k = kustomizations(&files);
    let mut kinds = BTreeSet::new();
    for file in &files {
        if file.ends_with("kustomization.yaml") {
            continue;
        }
        let what = file.strip_prefix(root()).unwrap().display().to_string();
        let canonical = file.canonicalize().unwrap();
        let patch = k.patches.contains(&canonical);
        assert!(
            patch || k.resources.contains(&canonical),
            "{what} is listed by no kustomization.yaml: it would never be applied"
        );
        let docs = documents(&what, &read(file));
        assert!(!docs.is_empty(), "{what}: no documents");
        for doc in &docs {
            if is_cert_manager(doc) {
                check_cert_manager(&what, doc);
            } else {
                assert_round_trips(&what, doc, !patch);
            }
            if !patch {
                kinds.insert(type_of(doc).1.to_owned());
            }
        }
    }
    for kind in [
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "MutatingWebhookConfiguration",
        "Issuer",
        "Certificate",
    ] {
        assert!(kinds.contains(kind), "no {kind} under deploy/");
    }
    // Every namespaced object names its namespace: RBAC and the tests read the files as they are.
    for doc in base_objects() {
        let cluster_scoped = matches!(
            type_of(&doc).1,
            "Namespace" | "ClusterRole" | "ClusterRoleBinding" | "MutatingWebhookConfiguration"
        );
        assert_eq!(
            doc["metadata"]["namespace"].as_str(),
            (!cluster_scoped).then_some(NAME),
            "{}",
            describe(&doc)
        );
    }
}

/// Sorts documents by kind, namespace and name.
fn by_identity(docs: &[Value]) -> BTreeMap<String, Value> {
    docs.iter().map(|d| (describe(d), d.clone())).collect()
}

#[test]
fn rendered_overlays_survive_their_types() {
    let Some(base) = kustomize(&deploy_dir()) else {
        println!("skipped: rendering deploy/ and deploy/cert-manager/ needs kubectl on PATH");
        return;
    };
    let base = documents("kubectl kustomize deploy/", &base);
    for doc in &base {
        assert_round_trips("kubectl kustomize deploy/", doc, true);
    }
    // What is applied is exactly what the files say: no generator or transformer changes it
    // (but `images:`, which sets the image of a build pushed to your registry).
    let rendered = by_identity(&base);
    let files = by_identity(&base_objects());
    assert_eq!(
        rendered.keys().collect::<Vec<_>>(),
        files.keys().collect::<Vec<_>>()
    );
    for (id, doc) in &files {
        let mut diffs = Vec::new();
        differences(doc, &rendered[id], "", true, &mut diffs);
        diffs.retain(|d| !d.starts_with("changed /spec/template/spec/containers/0/image:"));
        assert!(diffs.is_empty(), "{id} is rendered differently: {diffs:?}");
    }

    let overlay = kustomize(&deploy_dir().join("cert-manager")).unwrap();
    let overlay = documents("kubectl kustomize deploy/cert-manager/", &overlay);
    for doc in &overlay {
        if is_cert_manager(doc) {
            check_cert_manager("kubectl kustomize deploy/cert-manager/", doc);
        } else {
            assert_round_trips("kubectl kustomize deploy/cert-manager/", doc, true);
        }
    }
    check_cert_manager_overlay(&overlay);
}

/// The overlay serves cert-manager's certificate and lets cert-manager inject its CA.
fn check_cert_manager_overlay(objects: &[Value]) {
    // The Certificate the CA injector reads names the Service's DNS name.
    let webhook = find(objects, "MutatingWebhookConfiguration", NAME);
    let inject = webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        .as_str()
        .expect("the CA injection annotation");
    let (ns, certificate) = inject.split_once('/').expect("namespace/name");
    assert_eq!(ns, NAME);
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
    // Its issuer is a CA Issuer whose CA is a Certificate from a self-signed Issuer.
    let issuer = find(
        objects,
        "Issuer",
        certificate["spec"]["issuerRef"]["name"].as_str().unwrap(),
    );
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

    // The Deployment mounts the Certificate's Secret and serves the pair from it.
    let deployment: Deployment = typed(find(objects, "Deployment", NAME));
    let pod = deployment.spec.unwrap().template.spec.unwrap();
    let container = &pod.containers[0];
    let args = container.args.clone().unwrap();
    assert!(!args.iter().any(|a| a == "--self-signed-certs"), "{args:?}");
    let serve = parse_serve(&args).expect("the overlay's arguments parse");
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

    // confighash writes no certificates here, so it may not.
    let rbac = rbac_yaml(objects);
    let authz = Authorizer::from_yaml(&rbac).expect("the overlay's RBAC is valid");
    let sa = UserInfo::service_account(NAME, NAME);
    for (verb, group, resource, namespace, name) in code_requests() {
        let req = request(verb, group, resource, namespace, name);
        assert!(authz.allows(&sa, &req), "the overlay denies {req:?}");
    }
    // (Reading and creating Secrets stay allowed: the watcher reads them all, and the key
    // Secret is created when absent.)
    let self_signed_writes = self_signed_requests()
        .into_iter()
        .filter(|(verb, _, resource, _, _)| *resource == WEBHOOKS || *verb == "update");
    for (verb, group, resource, namespace, name) in
        forbidden_requests().into_iter().chain(self_signed_writes)
    {
        let req = request(verb, group, resource, namespace, name);
        assert!(!authz.allows(&sa, &req), "the overlay allows {req:?}");
    }
}

/// `confighash ARGS...` as the command line reads it; the arguments must be `serve ...`.
fn parse_serve(args: &[String]) -> Result<ServeArgs, clap::Error> {
    let cli = Cli::try_parse_from(std::iter::once("confighash".to_owned()).chain(args.to_vec()))?;
    match cli.command {
        Command::Serve(serve) => Ok(serve),
        other => panic!("the container runs {other:?}, not serve"),
    }
}

#[test]
fn webhook_selects_opted_in_namespaces_only() {
    let objects = base_objects();
    let configuration: MutatingWebhookConfiguration =
        typed(find(&objects, "MutatingWebhookConfiguration", NAME));
    assert_eq!(configuration.webhooks.as_ref().map(Vec::len), Some(1));
    let webhook = &configuration.webhooks.unwrap()[0];
    let selector = |s: &Option<_>| {
        let value = serde_json::to_value(s).unwrap();
        LabelSelector::from_object(&value).expect("a valid selector")
    };
    let namespaces = selector(&webhook.namespace_selector);
    let objects_selector = selector(&webhook.object_selector);

    // As Kubernetes labels Namespaces: kubernetes.io/metadata.name is always its name.
    let namespace = |name: &str, labels: &[(&str, &str)]| {
        let mut l: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        l.insert("kubernetes.io/metadata.name".into(), name.into());
        l
    };
    let opted_in = [(ENABLED_LABEL, "true")];
    assert!(namespaces.matches(&namespace(APP, &opted_in)));
    assert!(namespaces.matches(&namespace("team-a", &[(ENABLED_LABEL, "true"), ("x", "y")])));
    assert!(!namespaces.matches(&namespace(APP, &[])));
    assert!(!namespaces.matches(&namespace(APP, &[(ENABLED_LABEL, "false")])));
    assert!(!namespaces.matches(&namespace(APP, &[(ENABLED_LABEL, "True")])));
    assert!(!namespaces.matches(&namespace(APP, &[("confighash.dev/enable", "true")])));
    for own in [NAME, "kube-system"] {
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
}

#[test]
fn webhook_configuration_names_the_code_kinds_and_the_service() {
    let objects = base_objects();
    let configuration: MutatingWebhookConfiguration =
        typed(find(&objects, "MutatingWebhookConfiguration", NAME));
    let webhook = &configuration.webhooks.unwrap()[0];
    assert_eq!(webhook.name, "stamp.confighash.dev");
    assert_eq!(webhook.failure_policy.as_deref(), Some("Ignore"));
    assert_eq!(webhook.side_effects, "None");
    assert_eq!(webhook.timeout_seconds, Some(5));
    assert_eq!(webhook.reinvocation_policy.as_deref(), Some("IfNeeded"));
    assert_eq!(webhook.admission_review_versions, ["v1"]);
    assert!(
        webhook.client_config.ca_bundle.is_none(),
        "filled in at run time"
    );

    // Exactly the kinds the code stamps: (group, version, plural), CREATE and UPDATE, the main
    // resource only, namespaced.
    let mut expected = BTreeSet::new();
    for kind in WorkloadKind::ALL {
        let version = if kind == WorkloadKind::Rollout {
            "v1alpha1"
        } else {
            "v1"
        };
        let plural = format!("{}s", kind.kind().to_lowercase());
        expected.insert((kind.group().to_owned(), version.to_owned(), plural));
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

    // The client config reaches the webhook: Service confighash/confighash port 443, /mutate,
    // which targets the container's webhook port.
    let service_ref = webhook.client_config.service.as_ref().expect("a Service");
    assert_eq!(
        (service_ref.namespace.as_str(), service_ref.name.as_str()),
        (NAME, NAME)
    );
    assert_eq!(service_ref.path.as_deref(), Some("/mutate"));
    let service: Service = typed(find(&objects, "Service", NAME));
    let port = service
        .spec
        .unwrap()
        .ports
        .unwrap()
        .into_iter()
        .find(|p| Some(p.port) == service_ref.port)
        .expect("the Service has the webhook's port");
    assert_eq!(port.port, 443);
    let container_port = container_port(&objects, port.target_port.as_ref().unwrap());
    assert_eq!(container_port, 8443);
}

/// The Deployment's single container.
fn container(objects: &[Value]) -> k8s_openapi::api::core::v1::Container {
    let deployment: Deployment = typed(find(objects, "Deployment", NAME));
    let mut containers = deployment.spec.unwrap().template.spec.unwrap().containers;
    assert_eq!(containers.len(), 1);
    containers.remove(0)
}

/// The number of a container port given by number or name.
fn container_port(
    objects: &[Value],
    port: &k8s_openapi::apimachinery::pkg::util::intstr::IntOrString,
) -> i32 {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => {
            container(objects)
                .ports
                .unwrap()
                .into_iter()
                .find(|p| p.name.as_deref() == Some(name))
                .unwrap_or_else(|| panic!("no container port named {name}"))
                .container_port
        }
    }
}

#[test]
fn deployment_runs_serve_as_the_issue_asks() {
    let objects = base_objects();
    let deployment: Deployment = typed(find(&objects, "Deployment", NAME));
    let spec = deployment.spec.clone().unwrap();
    assert_eq!(spec.replicas, Some(2));
    let pod_labels = spec.template.metadata.clone().unwrap().labels.unwrap();
    let selects_pods = |selector: &Value| {
        LabelSelector::from_object(selector)
            .unwrap()
            .matches(&pod_labels)
    };
    assert!(selects_pods(&serde_json::to_value(&spec.selector).unwrap()));
    let pod = spec.template.spec.clone().unwrap();
    assert_eq!(pod.termination_grace_period_seconds, Some(30));
    let spread = pod.topology_spread_constraints.clone().unwrap();
    assert!(
        spread
            .iter()
            .any(|c| c.topology_key == "kubernetes.io/hostname"
                && selects_pods(&serde_json::to_value(&c.label_selector).unwrap())),
        "{spread:?}"
    );

    // The ServiceAccount is the one the bindings name.
    let sa = pod.service_account_name.clone().unwrap();
    assert_eq!(sa, name_of(find(&objects, "ServiceAccount", NAME)));
    for kind in ["ClusterRoleBinding", "RoleBinding"] {
        let subjects = &find(&objects, kind, NAME)["subjects"];
        assert_eq!(subjects[0]["name"], sa, "{kind}");
        assert_eq!(subjects[0]["namespace"], NAME, "{kind}");
    }

    // The budget and the Service select these pods.
    let pdb = find(&objects, "PodDisruptionBudget", NAME);
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert!(selects_pods(&pdb["spec"]["selector"]));
    let service = find(&objects, "Service", NAME);
    assert!(selects_pods(
        &json!({"matchLabels": service["spec"]["selector"]})
    ));

    let container = container(&objects);
    // The arguments are those of `confighash serve`, with its own certificates.
    let args = container.args.clone().unwrap();
    let serve = parse_serve(&args)
        .unwrap_or_else(|e| panic!("the Deployment's arguments do not parse: {e}"));
    assert!(serve.self_signed_certs, "{args:?}");
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
        assert_eq!(container_port(&objects, &get.port), 8080, "{path}");
    }
    // The lookups' deadline stays well below the webhook's timeout.
    let configuration: MutatingWebhookConfiguration =
        typed(find(&objects, "MutatingWebhookConfiguration", NAME));
    let timeout = configuration.webhooks.unwrap()[0].timeout_seconds.unwrap();
    assert!(serve.lookup_deadline * 2 <= Duration::from_secs(u64::try_from(timeout).unwrap()));
    assert_ne!(
        serve.leader_elect,
        Some(false),
        "two replicas need a leader"
    );
    assert_eq!(serve.key_file, None);
    assert_eq!(serve.key_secret, KEY_SECRET, "the name the Role allows");
    // The serving pair lives in the writable emptyDir (the root filesystem is read-only).
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
    assert!(volume.empty_dir.is_some(), "{volume:?}");
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

    // The security context and resources of the issue.
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
    let resources = serde_json::to_value(container.resources.clone().unwrap()).unwrap();
    assert_eq!(
        resources,
        json!({
            "limits": {"memory": "256Mi"},
            "requests": {"cpu": "20m", "memory": "32Mi"},
        }),
        "no CPU limit: throttling would add admission latency"
    );
}

// ----- RBAC -----

/// (verb, API group, resource[/subresource], namespace, name) of a request.
type Req = (
    &'static str,
    &'static str,
    &'static str,
    Option<&'static str>,
    Option<&'static str>,
);

fn request(
    verb: &'static str,
    group: &'static str,
    resource: &'static str,
    namespace: Option<&'static str>,
    name: Option<&'static str>,
) -> RequestAttributes<'static> {
    let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
    RequestAttributes {
        verb,
        api_group: group,
        resource,
        subresource,
        namespace,
        name,
        path: "",
        resource_request: true,
    }
}

const LEASES: &str = "coordination.k8s.io";
const ADMISSION: &str = "admissionregistration.k8s.io";
const WEBHOOKS: &str = "mutatingwebhookconfigurations";
const RBAC: &str = "rbac.authorization.k8s.io";
const EVENTS: &str = "events.k8s.io";

/// Every request `confighash serve` makes, read from the code, but those of
/// `--self-signed-certs`.
fn code_requests() -> Vec<Req> {
    let own = Some(NAME);
    let app = Some(APP);
    let mut reqs: Vec<Req> = vec![
        // src/key.rs: read the key Secret, create it when absent, watch it by name (list and
        // watch with a metadata.name field selector carry that name).
        ("get", "", "secrets", own, Some(KEY_SECRET)),
        ("create", "", "secrets", own, None),
        ("list", "", "secrets", own, Some(KEY_SECRET)),
        ("watch", "", "secrets", own, Some(KEY_SECRET)),
        // src/leader.rs: read the Lease, create it, renew, take over and release it by update.
        ("get", LEASES, "leases", own, Some(NAME)),
        ("create", LEASES, "leases", own, None),
        ("update", LEASES, "leases", own, Some(NAME)),
        // src/lookup.rs: the webhook reads referenced objects.
        ("get", "", "configmaps", app, Some("app-env")),
        ("get", "", "secrets", app, Some("db")),
        // src/watcher.rs: cluster-wide watches of ConfigMaps, Secrets and Namespaces.
        ("list", "", "configmaps", None, None),
        ("watch", "", "configmaps", None, None),
        ("list", "", "secrets", None, None),
        ("watch", "", "secrets", None, None),
        ("list", "", "namespaces", None, None),
        ("watch", "", "namespaces", None, None),
        // kube's Recorder: an events.k8s.io Event, patched when it repeats.
        ("create", EVENTS, "events", app, None),
        ("patch", EVENTS, "events", app, Some("web.17a2b3c4d5e6f708")),
    ];
    // src/watcher.rs: watch every workload kind, touch one with a merge patch.
    for (group, resource) in workload_resources() {
        reqs.push(("list", group, resource, None, None));
        reqs.push(("watch", group, resource, None, None));
        reqs.push(("patch", group, resource, app, Some("web")));
    }
    reqs
}

/// The requests of `--self-signed-certs` (src/selfsigned.rs): read, create (as the key does)
/// and replace its Secret; read the webhook configuration and JSON-patch its caBundle.
fn self_signed_requests() -> Vec<Req> {
    let own = Some(NAME);
    vec![
        ("get", "", "secrets", own, Some(CERTS_SECRET)),
        ("create", "", "secrets", own, None),
        ("update", "", "secrets", own, Some(CERTS_SECRET)),
        ("get", ADMISSION, WEBHOOKS, None, Some(NAME)),
        ("patch", ADMISSION, WEBHOOKS, None, Some(NAME)),
    ]
}

/// (group, plural) of the workload kinds the code handles.
fn workload_resources() -> Vec<(&'static str, &'static str)> {
    WorkloadKind::ALL
        .into_iter()
        .map(|kind| {
            let plural = match kind {
                WorkloadKind::Deployment => "deployments",
                WorkloadKind::StatefulSet => "statefulsets",
                WorkloadKind::DaemonSet => "daemonsets",
                WorkloadKind::CronJob => "cronjobs",
                WorkloadKind::Rollout => "rollouts",
            };
            (kind.group(), plural)
        })
        .collect()
}

/// Requests confighash must never be allowed.
fn forbidden_requests() -> Vec<Req> {
    let own = Some(NAME);
    let app = Some(APP);
    let system = Some("kube-system");
    let mut reqs: Vec<Req> = vec![
        // Config is read, never written.
        ("update", "", "configmaps", app, Some("app-env")),
        ("patch", "", "configmaps", app, Some("app-env")),
        ("create", "", "configmaps", app, None),
        ("delete", "", "configmaps", app, Some("app-env")),
        ("deletecollection", "", "configmaps", app, None),
        // Secrets outside its namespace, and its own but for the certificate Secret, are
        // read-only.
        ("create", "", "secrets", app, None),
        ("update", "", "secrets", app, Some("db")),
        (
            "patch",
            "",
            "secrets",
            system,
            Some("bootstrap-token-abcdef"),
        ),
        ("delete", "", "secrets", app, Some("db")),
        ("update", "", "secrets", own, Some("someone-else")),
        ("patch", "", "secrets", own, Some("someone-else")),
        // It never rewrites or deletes its key (a replaced key is reloaded, not written).
        ("update", "", "secrets", own, Some(KEY_SECRET)),
        ("patch", "", "secrets", own, Some(KEY_SECRET)),
        ("delete", "", "secrets", own, Some(KEY_SECRET)),
        ("delete", "", "secrets", own, Some(CERTS_SECRET)),
        // Pods, anywhere.
        ("list", "", "pods", None, None),
        ("get", "", "pods", app, Some("web-abc")),
        ("create", "", "pods", app, None),
        ("delete", "", "pods", app, Some("web-abc")),
        ("create", "", "pods/eviction", app, Some("web-abc")),
        ("create", "", "pods/exec", app, Some("web-abc")),
        // Namespaces: followed, never read by name or changed.
        ("get", "", "namespaces", None, Some(APP)),
        ("patch", "", "namespaces", None, Some(APP)),
        ("delete", "", "namespaces", None, Some(APP)),
        // Jobs are passed through, not touched.
        ("patch", "batch", "jobs", app, Some("migrate")),
        // Other webhook configurations, and its own beyond the caBundle patch.
        ("list", ADMISSION, WEBHOOKS, None, None),
        ("watch", ADMISSION, WEBHOOKS, None, None),
        ("patch", ADMISSION, WEBHOOKS, None, Some("other")),
        ("update", ADMISSION, WEBHOOKS, None, Some(NAME)),
        ("delete", ADMISSION, WEBHOOKS, None, Some(NAME)),
        ("create", ADMISSION, WEBHOOKS, None, None),
        (
            "patch",
            ADMISSION,
            "validatingwebhookconfigurations",
            None,
            Some(NAME),
        ),
        // Leases of others, or deleting its own.
        (
            "update",
            LEASES,
            "leases",
            system,
            Some("kube-controller-manager"),
        ),
        ("update", LEASES, "leases", own, Some("other")),
        ("delete", LEASES, "leases", own, Some(NAME)),
        // Core Events (the Recorder writes events.k8s.io), and reading Events.
        ("create", "", "events", app, None),
        ("list", EVENTS, "events", None, None),
        // No escalation.
        ("create", RBAC, "clusterrolebindings", None, None),
        ("bind", RBAC, "clusterroles", None, Some("cluster-admin")),
        ("escalate", RBAC, "roles", own, Some(NAME)),
        ("create", "", "serviceaccounts/token", own, Some(NAME)),
        ("impersonate", "", "users", None, Some("admin")),
    ];
    for (group, resource) in workload_resources() {
        reqs.push(("create", group, resource, app, None));
        reqs.push(("update", group, resource, app, Some("web")));
        reqs.push(("delete", group, resource, app, Some("web")));
        reqs.push(("deletecollection", group, resource, app, None));
    }
    for sub in ["deployments/scale", "deployments/status"] {
        reqs.push(("patch", "apps", sub, app, Some("web")));
    }
    reqs
}

/// The RBAC documents among `objects`, as multi-document YAML.
fn rbac_yaml(objects: &[Value]) -> String {
    objects
        .iter()
        .filter(|o| type_of(o).0 == "rbac.authorization.k8s.io/v1")
        .map(|o| serde_saphyr::to_string(o).unwrap())
        .collect::<Vec<_>>()
        .join("---\n")
}

fn base_rbac() -> String {
    read(&deploy_dir().join("base").join("rbac.yaml"))
}

#[test]
fn rbac_allows_exactly_the_requests_the_code_makes() {
    // The base's RBAC is all in rbac.yaml.
    let in_base = base_objects()
        .iter()
        .filter(|o| type_of(o).0 == "rbac.authorization.k8s.io/v1")
        .count();
    assert_eq!(documents("rbac.yaml", &base_rbac()).len(), in_base);
    assert_eq!(in_base, 4);

    let authz = Authorizer::from_yaml(&base_rbac()).expect("valid RBAC");
    let sa = UserInfo::service_account(NAME, NAME);
    for (verb, group, resource, namespace, name) in
        code_requests().into_iter().chain(self_signed_requests())
    {
        let req = request(verb, group, resource, namespace, name);
        assert!(authz.allows(&sa, &req), "denied: {req:?}");
    }
    for (verb, group, resource, namespace, name) in forbidden_requests() {
        let req = request(verb, group, resource, namespace, name);
        assert!(!authz.allows(&sa, &req), "allowed: {req:?}");
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
    let impostor = UserInfo::service_account(APP, NAME);
    for (verb, group, resource, namespace, name) in
        code_requests().into_iter().chain(self_signed_requests())
    {
        let req = request(verb, group, resource, namespace, name);
        assert!(
            !authz.allows(&impostor, &req),
            "allowed to {APP}/{NAME}: {req:?}"
        );
    }
}

// ----- the code under the RBAC, against the in-memory API server -----

const DEADLINE: Duration = Duration::from_secs(20);

async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = tokio::time::Instant::now();
    while !check().await {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn create_namespace(admin: &kube::Client, name: &str, labels: &[(&str, &str)]) {
    let mut l: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    l.insert("kubernetes.io/metadata.name".into(), name.into());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(l),
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

/// Runs the code that talks to the API server as `system:serviceaccount:confighash:confighash`,
/// with deploy/'s RBAC enforced: a request it does not allow is answered 403, which would stop
/// each step below.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_code_runs_under_the_deploy_rbac() {
    let server = ApiServer::start().await;
    let admin = server.client();
    create_namespace(&admin, NAME, &[]).await;
    create_namespace(&admin, APP, &[(ENABLED_LABEL, "true")]).await;
    server.add_token("confighash-token", UserInfo::service_account(NAME, NAME));
    server.set_authorizer(Some(Authorizer::from_yaml(&base_rbac()).unwrap()));
    let mut config = server.config_with_token("confighash-token");
    config.default_namespace = NAME.into();
    // As `serve` builds it.
    let client = confighash::client::build(config).unwrap();

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
    let keys = key::from_secret(client.clone(), NAME, KEY_SECRET)
        .await
        .expect("the key Secret is created under the RBAC");
    let key_watch = tokio::spawn(key::watch_secret(
        keys.clone(),
        client.clone(),
        NAME.into(),
        KEY_SECRET.into(),
    ));
    let first_id = keys.current().id().to_owned();
    let replaced = json!({"data": {"key": "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="}});
    Api::<Secret>::namespaced(admin.clone(), NAME)
        .patch(
            KEY_SECRET,
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

    // Leader election: create, renew, release.
    let leader_config = LeaderConfig {
        retry_period: Duration::from_millis(100),
        renew_deadline: Duration::from_secs(2),
        lease_duration: Duration::from_secs(3),
        ..LeaderConfig::new(NAME, "replica-a")
    };
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

    // --self-signed-certs: the CA and serving pair in their Secret, the CA in the caBundle of
    // the webhook configuration deploy/ installs.
    let configuration: MutatingWebhookConfiguration =
        typed(find(&base_objects(), "MutatingWebhookConfiguration", NAME));
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(admin.clone());
    configurations
        .create(&PostParams::default(), &configuration)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let certs = SelfSignedConfig::new(NAME, dir.path().join("tls.crt"), dir.path().join("tls.key"));
    assert_eq!(certs.secret_name, CERTS_SECRET, "the name the Role allows");
    assert_eq!(certs.webhook_configuration, NAME);
    selfsigned::ensure(&client, &certs)
        .await
        .expect("the certificates are made under the RBAC");
    let ca_bundle = || async {
        configurations.get(NAME).await.unwrap().webhooks.unwrap()[0]
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
    let source = KubeSource::new(client.clone());
    for object in [
        ObjectRef::new(ObjectKind::ConfigMap, "app-env"),
        ObjectRef::new(ObjectKind::Secret, "db"),
    ] {
        let budget = confighash::lookup::MemoryBudget::new(1 << 20);
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
    let stamp = template_stamp(&admin).await.unwrap();
    assert!(
        stamp.starts_with(&format!("v1:{}:", keys.current().id())),
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
    match Api::<Secret>::namespaced(client.clone(), NAME)
        .delete(KEY_SECRET, &DeleteParams::default())
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("expected 403 Forbidden, got {other:?}"),
    }
}

// ----- the image -----

/// The instructions of the Dockerfile (continuation lines joined, comments left out).
fn dockerfile() -> Vec<String> {
    let text = read(&root().join("Dockerfile"));
    let mut instructions = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || trimmed.is_empty() {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part.trim());
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                instructions.push(std::mem::take(&mut current));
            }
        }
    }
    instructions
}

#[test]
fn dockerfile_matches_the_manifests_and_ci() {
    let instructions = dockerfile();
    let with = |word: &str| -> Vec<&str> {
        instructions
            .iter()
            .filter_map(|i| i.strip_prefix(word).map(str::trim))
            .collect()
    };
    // Multi-stage: a Rust builder, a distroless runtime without a shell.
    let stages = with("FROM ");
    assert_eq!(stages.len(), 2, "{stages:?}");
    assert!(stages[0].contains("rust:"), "{}", stages[0]);
    assert!(
        stages[1].starts_with("gcr.io/distroless/"),
        "the runtime image: {}",
        stages[1]
    );
    // Built the way CI builds it (.ci/run: `cargo run --release --locked`, `cargo test --locked`).
    let ci = read(&root().join(".ci/run"));
    assert!(ci.contains("cargo run --release --locked"), "{ci}");
    let runs = with("RUN ");
    assert!(
        runs.iter()
            .any(|r| r.contains("cargo build --release --locked")),
        "{runs:?}"
    );
    // The same user and ports as the Deployment.
    let objects = base_objects();
    let container = container(&objects);
    let security = container.security_context.unwrap();
    assert_eq!(
        with("USER "),
        [format!(
            "{}:{}",
            security.run_as_user.unwrap(),
            security.run_as_group.unwrap()
        )]
    );
    assert_eq!(security.run_as_user, Some(UID));
    let exposed: BTreeSet<i32> = with("EXPOSE ")
        .iter()
        .flat_map(|e| e.split_whitespace())
        .map(|p| p.trim_end_matches("/tcp").parse().expect("a port"))
        .collect();
    let ports: BTreeSet<i32> = container
        .ports
        .unwrap()
        .iter()
        .map(|p| p.container_port)
        .collect();
    assert_eq!(exposed, ports);
    assert_eq!(exposed, BTreeSet::from([8080, 8443]));
    // The binary is the entrypoint, run in exec form (there is no shell).
    assert_eq!(with("ENTRYPOINT "), [r#"["/confighash"]"#]);
    assert_eq!(
        container.command, None,
        "the manifests rely on the image's entrypoint"
    );

    // The build context keeps what cargo needs and leaves out keys and build output.
    let ignored: Vec<String> = read(&root().join(".dockerignore"))
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.trim_start_matches('/').trim_end_matches('/').to_owned())
        .collect();
    for needed in ["Cargo.toml", "Cargo.lock", "src", "tests", "benches"] {
        assert!(
            !ignored.iter().any(|p| p == needed || p == "*"),
            ".dockerignore leaves out {needed}, which the build needs"
        );
    }
    for left_out in ["target", ".git", "certs"] {
        assert!(
            ignored.iter().any(|p| p == left_out),
            ".dockerignore should leave out {left_out}"
        );
    }
}

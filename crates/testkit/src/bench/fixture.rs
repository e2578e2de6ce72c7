//! The review, the objects it references and an in-memory `ObjectSource` serving them.

use std::collections::{BTreeMap, HashMap};

use base64::Engine;
use confighash::core::checksum::StampKey;
use confighash::core::refs::{ObjectKind, ObjectRef};
use confighash::core::workload::{self, Analysis, WorkloadKind};
use confighash::webhook::budget::MemoryBudget;
use confighash::webhook::lookup::{Fetched, ObjectSource, ReadError};
use futures::future::BoxFuture;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};

/// The HMAC key of the bench installation.
pub const KEY: &[u8] = b"bench-key-0123456789abcdef-0123456789";
pub const NAMESPACE: &str = "shop";
pub const UID: &str = "705ab4f5-6393-11e8-b7cc-42010a800002";
const STAMP_ANNOTATION: &str = "confighash.dev/checksum";
/// Distinct objects the Deployment references.
pub const REFERENCES: usize = 10;

/// Serves the referenced objects from a map; every fetch is a ready future.
pub struct MemorySource {
    objects: HashMap<ObjectRef, Fetched>,
}

impl Default for MemorySource {
    fn default() -> Self {
        Self::new()
    }
}

impl MemorySource {
    pub fn new() -> Self {
        MemorySource {
            objects: objects()
                .into_iter()
                .map(|f| {
                    let r = match &f {
                        Fetched::ConfigMap(c) => ObjectRef::new(
                            ObjectKind::ConfigMap,
                            c.metadata.name.clone().unwrap_or_default(),
                        ),
                        Fetched::Secret(s) => ObjectRef::new(
                            ObjectKind::Secret,
                            s.metadata.name.clone().unwrap_or_default(),
                        ),
                        Fetched::Entry(_) => unreachable!("the fixture holds whole objects"),
                    };
                    (r, f)
                })
                .collect(),
        }
    }
}

impl ObjectSource for MemorySource {
    fn fetch<'a>(
        &'a self,
        _namespace: &'a str,
        object: &'a ObjectRef,
        _budget: &'a MemoryBudget,
    ) -> BoxFuture<'a, Result<Option<Fetched>, ReadError>> {
        Box::pin(futures::future::ready(Ok(self
            .objects
            .get(object)
            .cloned())))
    }
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(NAMESPACE.to_owned()),
        resource_version: Some("4821337".to_owned()),
        labels: Some(BTreeMap::from([
            ("app.kubernetes.io/name".to_owned(), "shop".to_owned()),
            (
                "app.kubernetes.io/part-of".to_owned(),
                "storefront".to_owned(),
            ),
        ])),
        ..ObjectMeta::default()
    }
}

fn config_map(name: &str, data: &[(&str, String)]) -> Fetched {
    Fetched::ConfigMap(ConfigMap {
        metadata: meta(name),
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
        ),
        ..ConfigMap::default()
    })
}

fn secret(name: &str, data: &[(&str, &str)]) -> Fetched {
    Fetched::Secret(Secret {
        metadata: meta(name),
        type_: Some("Opaque".to_owned()),
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Secret::default()
    })
}

/// The 10 objects the Deployment references: 6 ConfigMaps and 4 Secrets.
pub fn objects() -> Vec<Fetched> {
    let nginx_conf = (0..12)
        .map(|i| {
            format!(
                "location /api/v{i}/ {{\n  proxy_pass http://127.0.0.1:8080;\n  \
                 proxy_set_header Host $host;\n  proxy_read_timeout 30s;\n}}\n"
            )
        })
        .collect::<String>();
    let fluent = (0..8)
        .map(|i| {
            format!(
                "[INPUT]\n    Name tail\n    Path /var/log/app/{i}.log\n    Tag app.{i}\n\
                 [FILTER]\n    Name modify\n    Match app.{i}\n    Add shard {i}\n"
            )
        })
        .collect::<String>();
    vec![
        config_map(
            "app-config",
            &[
                ("LOG_FORMAT", "json".into()),
                ("HTTP_PORT", "8080".into()),
                ("GRPC_PORT", "9090".into()),
                ("CACHE_TTL", "300s".into()),
                ("MAX_CONNECTIONS", "512".into()),
                ("REGION", "eu-west-1".into()),
            ],
        ),
        config_map(
            "feature-flags",
            &[
                ("checkout-v2", "true".into()),
                ("recommendations", "false".into()),
                ("search-backend", "opensearch".into()),
            ],
        ),
        config_map(
            "service-endpoints",
            &[
                ("payments", "http://payments.shop.svc:8080".into()),
                ("inventory", "http://inventory.shop.svc:8080".into()),
                ("search", "http://search.shop.svc:9200".into()),
            ],
        ),
        config_map(
            "nginx-conf",
            &[
                (
                    "nginx.conf",
                    format!("events {{}}\nhttp {{\n{nginx_conf}}}\n"),
                ),
                ("mime.types", "types { text/html html; }\n".into()),
            ],
        ),
        config_map(
            "logging-config",
            &[
                ("fluent-bit.conf", fluent),
                (
                    "parsers.conf",
                    "[PARSER]\n    Name json\n    Format json\n".into(),
                ),
            ],
        ),
        config_map(
            "ca-bundle",
            &[(
                "ca.crt",
                format!(
                    "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
                    "MIIDdzCCAl+gAwIBAgIEAgAAuTANBgkqhkiG9w0BAQUFADBaMQswCQYDVQQGEwJJ\n".repeat(20)
                ),
            )],
        ),
        secret(
            "db-credentials",
            &[
                ("username", "shop_app"),
                ("password", "c0rrect-h0rse-battery-staple"),
                ("host", "postgres.shop.svc"),
            ],
        ),
        secret(
            "api-keys",
            &[
                ("STRIPE_KEY", "sk_test_51H8wQ2eZvKYlo2C0000000000"),
                (
                    "SENDGRID_KEY",
                    "SG.aaaaaaaaaaaaaaaaaaaaaa.bbbbbbbbbbbbbbbbbbbbbbbbbb",
                ),
            ],
        ),
        secret(
            "tls-cert",
            &[
                (
                    "tls.crt",
                    "-----BEGIN CERTIFICATE-----\nMIIB...\n-----END CERTIFICATE-----\n",
                ),
                (
                    "tls.key",
                    "-----BEGIN PRIVATE KEY-----\nMIIE...\n-----END PRIVATE KEY-----\n",
                ),
            ],
        ),
        secret(
            "oauth-client",
            &[
                ("client-id", "storefront"),
                ("client-secret", "s3cr3t-oauth-value"),
            ],
        ),
    ]
}

fn probe(path: &str, port: u16, initial_delay: u32) -> Value {
    json!({
        "httpGet": {"path": path, "port": port, "scheme": "HTTP"},
        "initialDelaySeconds": initial_delay,
        "periodSeconds": 10,
        "timeoutSeconds": 2,
        "successThreshold": 1,
        "failureThreshold": 3
    })
}

fn resources(cpu: &str, memory: &str) -> Value {
    json!({
        "requests": {"cpu": cpu, "memory": memory},
        "limits": {"cpu": cpu, "memory": memory, "ephemeral-storage": "1Gi"}
    })
}

fn security_context() -> Value {
    json!({
        "allowPrivilegeEscalation": false,
        "readOnlyRootFilesystem": true,
        "runAsNonRoot": true,
        "runAsUser": 10001,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"}
    })
}

fn plain_env(pairs: &[(&str, &str)]) -> Vec<Value> {
    pairs
        .iter()
        .map(|(k, v)| json!({"name": k, "value": v}))
        .collect()
}

fn cm_key(name: &str, cm: &str, key: &str) -> Value {
    json!({"name": name, "valueFrom": {"configMapKeyRef": {"name": cm, "key": key}}})
}

fn secret_key(name: &str, secret: &str, key: &str) -> Value {
    json!({"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
}

fn field_env(name: &str, path: &str) -> Value {
    json!({"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}})
}

/// A Deployment of 4 containers and an init container that references the 10 objects
/// through envFrom, configMapKeyRef/secretKeyRef and mounted (also projected) volumes.
/// `log_level` is the one env value an UPDATE changes; `stamp` goes on the pod template.
pub fn deployment(log_level: &str, stamp: &str) -> Value {
    let mut api_env = plain_env(&[
        ("LOG_LEVEL", log_level),
        ("RUST_BACKTRACE", "1"),
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://otel-collector.observability:4317",
        ),
        ("OTEL_SERVICE_NAME", "storefront-api"),
        ("GOMAXPROCS", "2"),
    ]);
    api_env.extend([
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_IP", "status.podIP"),
        cm_key("CHECKOUT_V2", "feature-flags", "checkout-v2"),
        cm_key("RECOMMENDATIONS", "feature-flags", "recommendations"),
        cm_key("PAYMENTS_URL", "service-endpoints", "payments"),
        cm_key("INVENTORY_URL", "service-endpoints", "inventory"),
        secret_key("DB_USER", "db-credentials", "username"),
        secret_key("DB_PASSWORD", "db-credentials", "password"),
        secret_key("DB_HOST", "db-credentials", "host"),
        secret_key("OAUTH_CLIENT_ID", "oauth-client", "client-id"),
    ]);
    let mut worker_env = plain_env(&[
        ("LOG_LEVEL", "info"),
        ("WORKER_CONCURRENCY", "8"),
        ("QUEUE", "orders"),
    ]);
    worker_env.extend([
        field_env("POD_NAME", "metadata.name"),
        cm_key("SEARCH_URL", "service-endpoints", "search"),
        cm_key("SEARCH_BACKEND", "feature-flags", "search-backend"),
        secret_key("DB_USER", "db-credentials", "username"),
        secret_key("DB_PASSWORD", "db-credentials", "password"),
    ]);
    let api = json!({
        "name": "api",
        "image": "registry.example.com/shop/storefront-api:2.14.3@sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        "imagePullPolicy": "IfNotPresent",
        "args": ["serve", "--config=/etc/app/config.yaml", "--listen=0.0.0.0:8080"],
        "ports": [
            {"name": "http", "containerPort": 8080, "protocol": "TCP"},
            {"name": "grpc", "containerPort": 9090, "protocol": "TCP"},
            {"name": "metrics", "containerPort": 9100, "protocol": "TCP"}
        ],
        "envFrom": [
            {"configMapRef": {"name": "app-config"}},
            {"secretRef": {"name": "api-keys"}, "prefix": "KEYS_"}
        ],
        "env": api_env,
        "resources": resources("500m", "512Mi"),
        "livenessProbe": probe("/livez", 8080, 10),
        "readinessProbe": probe("/readyz", 8080, 5),
        "startupProbe": probe("/livez", 8080, 0),
        "volumeMounts": [
            {"name": "tls", "mountPath": "/etc/tls", "readOnly": true},
            {"name": "trust", "mountPath": "/etc/ssl/certs/shop", "readOnly": true},
            {"name": "tmp", "mountPath": "/tmp"}
        ],
        "securityContext": security_context(),
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File"
    });
    let worker = json!({
        "name": "worker",
        "image": "registry.example.com/shop/storefront-worker:2.14.3",
        "imagePullPolicy": "IfNotPresent",
        "command": ["/usr/local/bin/worker"],
        "args": ["--queue=orders", "--metrics=0.0.0.0:9101"],
        "ports": [{"name": "metrics", "containerPort": 9101, "protocol": "TCP"}],
        "envFrom": [{"configMapRef": {"name": "app-config"}}],
        "env": worker_env,
        "resources": resources("250m", "256Mi"),
        "livenessProbe": probe("/healthz", 9101, 15),
        "volumeMounts": [
            {"name": "trust", "mountPath": "/etc/ssl/certs/shop", "readOnly": true},
            {"name": "tmp", "mountPath": "/tmp"}
        ],
        "securityContext": security_context(),
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File"
    });
    let nginx = json!({
        "name": "nginx",
        "image": "nginx:1.27.3-alpine",
        "imagePullPolicy": "IfNotPresent",
        "ports": [{"name": "https", "containerPort": 8443, "protocol": "TCP"}],
        "env": plain_env(&[("NGINX_ENTRYPOINT_QUIET_LOGS", "1"), ("NGINX_WORKER_PROCESSES", "2")]),
        "resources": resources("100m", "64Mi"),
        "readinessProbe": {"tcpSocket": {"port": 8443}, "periodSeconds": 5, "timeoutSeconds": 1},
        "livenessProbe": {"tcpSocket": {"port": 8443}, "periodSeconds": 10, "timeoutSeconds": 1},
        "volumeMounts": [
            {"name": "nginx-conf", "mountPath": "/etc/nginx/nginx.conf", "subPath": "nginx.conf", "readOnly": true},
            {"name": "tls", "mountPath": "/etc/nginx/tls", "readOnly": true},
            {"name": "nginx-cache", "mountPath": "/var/cache/nginx"}
        ],
        "securityContext": security_context(),
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File"
    });
    let log_shipper = json!({
        "name": "log-shipper",
        "image": "cr.fluentbit.io/fluent/fluent-bit:3.1.9",
        "imagePullPolicy": "IfNotPresent",
        "args": ["--config=/fluent-bit/etc/fluent-bit.conf"],
        "env": [
            field_env("NODE_NAME", "spec.nodeName"),
            field_env("POD_NAMESPACE", "metadata.namespace")
        ],
        "resources": resources("50m", "64Mi"),
        "livenessProbe": probe("/api/v1/health", 2020, 10),
        "volumeMounts": [
            {"name": "logging-config", "mountPath": "/fluent-bit/etc", "readOnly": true},
            {"name": "app-logs", "mountPath": "/var/log/app", "readOnly": true}
        ],
        "securityContext": security_context(),
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File"
    });
    let migrate = json!({
        "name": "migrate",
        "image": "registry.example.com/shop/storefront-api:2.14.3",
        "imagePullPolicy": "IfNotPresent",
        "args": ["migrate", "--wait-for-db=60s"],
        "env": [
            secret_key("DB_USER", "db-credentials", "username"),
            secret_key("DB_PASSWORD", "db-credentials", "password"),
            secret_key("DB_HOST", "db-credentials", "host")
        ],
        "resources": resources("100m", "128Mi"),
        "securityContext": security_context(),
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File"
    });
    let volumes = json!([
        {"name": "nginx-conf", "configMap": {"name": "nginx-conf", "defaultMode": 420,
            "items": [{"key": "nginx.conf", "path": "nginx.conf"}]}},
        {"name": "logging-config", "configMap": {"name": "logging-config", "defaultMode": 420}},
        {"name": "tls", "secret": {"secretName": "tls-cert", "defaultMode": 256}},
        {"name": "trust", "projected": {"defaultMode": 420, "sources": [
            {"configMap": {"name": "ca-bundle", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"secret": {"name": "oauth-client", "items": [{"key": "client-secret", "path": "oauth/client-secret"}]}}
        ]}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "nginx-cache", "emptyDir": {"sizeLimit": "256Mi"}},
        {"name": "app-logs", "emptyDir": {}}
    ]);
    let status = json!({
        "observedGeneration": 16,
        "replicas": 3,
        "updatedReplicas": 3,
        "readyReplicas": 3,
        "availableReplicas": 3,
        "conditions": [
            {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
             "message": "Deployment has minimum availability.",
             "lastUpdateTime": "2025-11-03T09:13:40Z", "lastTransitionTime": "2025-11-03T09:13:40Z"},
            {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
             "message": "ReplicaSet \"storefront-6d4cf56db6\" has successfully progressed.",
             "lastUpdateTime": "2026-01-12T15:02:11Z", "lastTransitionTime": "2025-11-03T09:12:44Z"}
        ]
    });
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "storefront",
            "namespace": NAMESPACE,
            "uid": "1c0e8a4e-8a56-4b4a-9d7e-2f1a3d6c5b10",
            "resourceVersion": "4821399",
            "generation": 17,
            "creationTimestamp": "2025-11-03T09:12:44Z",
            "labels": {
                "app.kubernetes.io/name": "storefront",
                "app.kubernetes.io/part-of": "shop",
                "app.kubernetes.io/version": "2.14.3",
                "app.kubernetes.io/managed-by": "argocd",
                "team": "checkout"
            },
            "annotations": {
                "deployment.kubernetes.io/revision": "17",
                "argocd.argoproj.io/tracking-id": "shop:apps/Deployment:shop/storefront",
                "owner": "checkout-team@example.com",
                "runbook": "https://runbooks.example.com/shop/storefront"
            }
        },
        "spec": {
            "replicas": 3,
            "revisionHistoryLimit": 5,
            "progressDeadlineSeconds": 600,
            "selector": {"matchLabels": {"app.kubernetes.io/name": "storefront"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}},
            "template": {
                "metadata": {
                    "labels": {
                        "app.kubernetes.io/name": "storefront",
                        "app.kubernetes.io/part-of": "shop",
                        "app.kubernetes.io/version": "2.14.3"
                    },
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": "9100",
                        "kubectl.kubernetes.io/default-container": "api",
                        STAMP_ANNOTATION: stamp
                    }
                },
                "spec": {
                    "serviceAccountName": "storefront",
                    "automountServiceAccountToken": false,
                    "terminationGracePeriodSeconds": 45,
                    "dnsPolicy": "ClusterFirst",
                    "restartPolicy": "Always",
                    "schedulerName": "default-scheduler",
                    "securityContext": {"fsGroup": 10001, "runAsNonRoot": true},
                    "topologySpreadConstraints": [{
                        "maxSkew": 1,
                        "topologyKey": "topology.kubernetes.io/zone",
                        "whenUnsatisfiable": "ScheduleAnyway",
                        "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "storefront"}}
                    }],
                    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "shop", "effect": "NoSchedule"}],
                    "initContainers": [migrate],
                    "containers": [api, worker, nginx, log_shipper],
                    "volumes": volumes
                }
            }
        },
        "status": status
    })
}

/// The review body, and the sizes of its parts.
pub struct ReviewFixture {
    pub body: Vec<u8>,
    pub object_len: usize,
}

/// An UPDATE review: `object` changes one env value of `oldObject` (LOG_LEVEL) and both
/// carry `stamp` on the pod template.
pub fn review(stamp: &str) -> ReviewFixture {
    let old = deployment("info", stamp);
    let object = deployment("debug", stamp);
    let body = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": UID,
            "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
            "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
            "requestKind": {"group": "apps", "version": "v1", "kind": "Deployment"},
            "requestResource": {"group": "apps", "version": "v1", "resource": "deployments"},
            "name": "storefront",
            "namespace": NAMESPACE,
            "operation": "UPDATE",
            "userInfo": {
                "username": "system:serviceaccount:argocd:argocd-application-controller",
                "uid": "0b6a4a3e-3d1f-4c43-9b0e-6f3b2a1d9e77",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:argocd", "system:authenticated"]
            },
            "object": object,
            "oldObject": old,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "UpdateOptions", "fieldManager": "argocd-controller"}
        }
    });
    let object_len = serde_json::to_vec(&object).expect("JSON").len();
    ReviewFixture {
        body: serde_json::to_vec(&body).expect("JSON"),
        object_len,
    }
}

/// A stamp made with the bench key over content that is no longer current: the UPDATE
/// must replace it, so the handler goes all the way to a patch.
pub fn stale_stamp() -> String {
    let key = StampKey::new(KEY.to_vec()).expect("a long enough key");
    format!("v2:{}:{}", key.id(), "0".repeat(64))
}

/// Checks the fixture: the Deployment references exactly the 10 objects served.
pub fn check_references() {
    let object = deployment("debug", &stale_stamp());
    let Ok(Analysis::Workload(info)) = workload::analyze(WorkloadKind::DEPLOYMENT, &object) else {
        panic!("the fixture is not a workload");
    };
    assert_eq!(info.refs.len(), REFERENCES, "{:?}", info.refs);
    let served = MemorySource::new();
    for (r, _) in info.refs.iter() {
        assert!(served.objects.contains_key(r), "{r} is not served");
    }
}

/// The stamp a review answer's patch sets, if it has one.
pub fn patched_stamp(answer: &Value) -> Option<String> {
    let patch = answer["response"]["patch"].as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .expect("base64 patch");
    let ops: Value = serde_json::from_slice(&bytes).expect("JSON patch");
    ops.as_array()?.iter().find_map(|op| {
        (op["path"].as_str()?.ends_with("confighash.dev~1checksum"))
            .then(|| op["value"].as_str().map(str::to_owned))
            .flatten()
    })
}

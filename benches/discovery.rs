//! Reference discovery on a 10-container pod spec with 40 references, versus serde_json
//! deserialising the same pod spec from a JSON string into a `PodSpec`.
//!
//! The machine these run on is shared, so only the ratio between the `serde_json` baseline and
//! `discover`, measured in the same group of the same run, is meaningful. The baseline is
//! registered first.

use std::collections::BTreeSet;
use std::hint::black_box;

use confighash::core::refs::{ObjectKind, ObjectRef, Selection, discover};
use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::PodSpec;
use serde_json::{Value, json};

/// Containers in the pod spec, init containers included.
const CONTAINERS: usize = 10;
/// Of which init containers.
const INIT_CONTAINERS: usize = 2;
/// Reference sites (env valueFrom, envFrom, mounted volume sources) in the pod spec.
const REFERENCES: usize = 40;
/// Distinct objects those references name, after merging:
/// ConfigMaps app-config, svc-0-config..svc-3-config, shared-settings, ca-bundle, oauth-config (8),
/// Secrets db-credentials, api-keys, service-token, tls-cert, oauth-client (5).
const DISTINCT_OBJECTS: usize = 13;

/// Builds the pod spec as JSON and counts the references it writes into it.
struct SpecBuilder {
    references: usize,
}

impl SpecBuilder {
    fn config_map_key_env(&mut self, name: &str, cm: &str, key: &str) -> Value {
        self.references += 1;
        json!({
            "name": name,
            "valueFrom": { "configMapKeyRef": { "name": cm, "key": key } }
        })
    }

    fn secret_key_env(&mut self, name: &str, secret: &str, key: &str, optional: bool) -> Value {
        self.references += 1;
        json!({
            "name": name,
            "valueFrom": {
                "secretKeyRef": { "name": secret, "key": key, "optional": optional }
            }
        })
    }

    fn container(&mut self, i: usize) -> Value {
        let init = i < INIT_CONTAINERS;
        let name = if init {
            format!("init-{i}")
        } else {
            format!("app-{i}")
        };
        let port = 8080 + i as u16;

        let mut env = vec![
            json!({ "name": "SERVICE_NAME", "value": name }),
            json!({ "name": "RUST_LOG", "value": "info,hyper=warn" }),
            json!({ "name": "GOMAXPROCS", "value": "2" }),
            // A valueFrom that is not a ConfigMap or Secret reference: discovery must skip it.
            json!({
                "name": "POD_NAME",
                "valueFrom": { "fieldRef": { "apiVersion": "v1", "fieldPath": "metadata.name" } }
            }),
        ];
        // Every container reads one key of app-config: ten references that merge into one.
        env.push(self.config_map_key_env("LOG_LEVEL", "app-config", "log-level"));
        // Four per-service ConfigMaps shared round robin: key sets union on merge.
        env.push(self.config_map_key_env(
            "UPSTREAM_ENDPOINT",
            &format!("svc-{}-config", i % 4),
            &format!("endpoint-{i}"),
        ));
        env.push(if i.is_multiple_of(2) {
            self.secret_key_env("DB_USER", "db-credentials", "username", false)
        } else {
            self.secret_key_env(
                "API_KEY",
                "api-keys",
                &format!("svc-{i}"),
                i.is_multiple_of(3),
            )
        });

        let mut env_from = Vec::new();
        if i == 0 {
            self.references += 1;
            env_from.push(json!({ "configMapRef": { "name": "shared-settings" } }));
        }
        if i == 5 {
            self.references += 1;
            env_from.push(json!({ "prefix": "TOKEN_", "secretRef": { "name": "service-token" } }));
        }

        let mut mounts = vec![json!({ "name": "scratch", "mountPath": "/tmp" })];
        if !init {
            mounts.push(json!({ "name": "app-config", "mountPath": "/etc/app", "readOnly": true }));
            mounts.push(json!({ "name": "bundle", "mountPath": "/etc/bundle", "readOnly": true }));
        }
        if i.is_multiple_of(3) {
            mounts.push(json!({ "name": "tls", "mountPath": "/etc/tls", "readOnly": true }));
        }
        if i == 1 || i == 7 {
            mounts.push(json!({
                "name": "shared-settings",
                "mountPath": "/etc/shared",
                "readOnly": true
            }));
        }
        if i == 4 {
            mounts
                .push(json!({ "name": "oauth", "mountPath": "/var/run/oauth", "readOnly": true }));
        }

        let probe = |path: &str, delay: u32| {
            json!({
                "httpGet": { "path": path, "port": port, "scheme": "HTTP" },
                "initialDelaySeconds": delay,
                "periodSeconds": 10,
                "timeoutSeconds": 2,
                "failureThreshold": 3,
                "successThreshold": 1
            })
        };

        let mut c = json!({
            "name": name,
            "image": format!("registry.example.com/team/{name}:1.{i}.3@sha256:{:064x}", i + 1),
            "imagePullPolicy": "IfNotPresent",
            "command": ["/usr/local/bin/server"],
            "args": ["--config=/etc/app/app.yaml", format!("--listen=0.0.0.0:{port}")],
            "ports": [
                { "name": "http", "containerPort": port, "protocol": "TCP" },
                { "name": "metrics", "containerPort": 9090 + i, "protocol": "TCP" }
            ],
            "env": env,
            "resources": {
                "requests": { "cpu": "100m", "memory": "128Mi" },
                "limits": { "cpu": "1", "memory": "512Mi", "ephemeral-storage": "1Gi" }
            },
            "volumeMounts": mounts,
            "securityContext": {
                "runAsNonRoot": true,
                "runAsUser": 10001,
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "capabilities": { "drop": ["ALL"] }
            },
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File"
        });
        if !env_from.is_empty() {
            c["envFrom"] = Value::Array(env_from);
        }
        if !init {
            c["livenessProbe"] = probe("/healthz", 10);
            c["readinessProbe"] = probe("/ready", 5);
            c["startupProbe"] = probe("/healthz", 0);
        }
        c
    }

    fn volumes(&mut self) -> Value {
        // 1 + 1 + 3 + 1 + 2 = 8 references, all in mounted volumes.
        self.references += 8;
        json!([
            { "name": "scratch", "emptyDir": { "sizeLimit": "64Mi" } },
            {
                "name": "app-config",
                "configMap": {
                    "name": "app-config",
                    "defaultMode": 420,
                    "items": [
                        { "key": "app.yaml", "path": "app.yaml" },
                        { "key": "logging.yaml", "path": "logging.yaml", "mode": 292 }
                    ]
                }
            },
            { "name": "tls", "secret": { "secretName": "tls-cert", "defaultMode": 256 } },
            {
                "name": "bundle",
                "projected": {
                    "defaultMode": 420,
                    "sources": [
                        {
                            "configMap": {
                                "name": "app-config",
                                "items": [{ "key": "feature-flags.yaml", "path": "flags.yaml" }]
                            }
                        },
                        { "configMap": { "name": "ca-bundle" } },
                        {
                            "secret": {
                                "name": "db-credentials",
                                "items": [{ "key": "ca.crt", "path": "db/ca.crt" }]
                            }
                        },
                        {
                            "serviceAccountToken": {
                                "audience": "vault",
                                "expirationSeconds": 3600,
                                "path": "vault-token"
                            }
                        }
                    ]
                }
            },
            {
                "name": "shared-settings",
                "configMap": { "name": "shared-settings", "optional": true }
            },
            {
                "name": "oauth",
                "projected": {
                    "sources": [
                        { "secret": { "name": "oauth-client" } },
                        {
                            "configMap": {
                                "name": "oauth-config",
                                "items": [{ "key": "issuer", "path": "issuer" }],
                                "optional": true
                            }
                        }
                    ]
                }
            }
        ])
    }

    fn pod_spec(&mut self) -> Value {
        let containers: Vec<Value> = (0..CONTAINERS).map(|i| self.container(i)).collect();
        let (init, main) = containers.split_at(INIT_CONTAINERS);
        json!({
            "serviceAccountName": "app",
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "restartPolicy": "Always",
            "schedulerName": "default-scheduler",
            "securityContext": { "fsGroup": 10001, "seccompProfile": { "type": "RuntimeDefault" } },
            "nodeSelector": { "kubernetes.io/os": "linux" },
            "tolerations": [
                { "key": "dedicated", "operator": "Equal", "value": "app", "effect": "NoSchedule" }
            ],
            "imagePullSecrets": [{ "name": "registry-pull" }],
            "initContainers": init,
            "containers": main,
            "volumes": self.volumes()
        })
    }
}

fn discovery(c: &mut Criterion) {
    let mut builder = SpecBuilder { references: 0 };
    let json = serde_json::to_string(&builder.pod_spec()).expect("a Value serialises");
    assert_eq!(builder.references, REFERENCES);

    let spec: PodSpec = serde_json::from_str(&json).expect("the pod spec deserialises");
    assert_eq!(
        spec.containers.len() + spec.init_containers.as_ref().map_or(0, Vec::len),
        CONTAINERS
    );

    // Outside the timed loop: discovery finds every distinct object, and merging happened.
    let refs = discover(&spec, None);
    assert!(
        refs.len() == DISTINCT_OBJECTS,
        "expected {DISTINCT_OBJECTS} distinct objects, discover found {}",
        refs.len()
    );
    let app_config = refs
        .get(&ObjectRef::new(ObjectKind::ConfigMap, "app-config"))
        .expect("app-config is referenced");
    let expected_keys: BTreeSet<String> = [
        "app.yaml",
        "feature-flags.yaml",
        "log-level",
        "logging.yaml",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    assert!(app_config.selection == Selection::Keys(expected_keys.into()));
    let db = refs
        .get(&ObjectRef::new(ObjectKind::Secret, "db-credentials"))
        .expect("db-credentials is referenced");
    assert!(matches!(&db.selection, Selection::Keys(k) if k.len() == 2));

    let mut group = c.benchmark_group("discovery_10_containers_40_refs");
    group.bench_function("serde_json_from_str", |b| {
        b.iter(|| serde_json::from_str::<PodSpec>(black_box(&json)).expect("deserialises"))
    });
    group.bench_function("discover", |b| b.iter(|| discover(black_box(&spec), None)));
    group.finish();
}

criterion_group!(benches, discovery);
criterion_main!(benches);

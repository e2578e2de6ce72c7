//! Reference discovery (README, "Workloads and references"): one test per reference path, the
//! merge rules, the extra-reference annotations, and discovery through every workload kind.

use crate::build;

use std::collections::{BTreeMap, BTreeSet};

use build::workload;
use confighash::core::names::{EXTRA_CONFIGMAPS_ANNOTATION, EXTRA_SECRETS_ANNOTATION};
use confighash::core::refs::{self, ObjectKind, ObjectRef, References, Selection};
use confighash::core::workload::{self, Analysis, WorkloadInfo, WorkloadKind};
use k8s_openapi::api::core::v1::{
    CSIVolumeSource, ConfigMapEnvSource, ConfigMapKeySelector, ConfigMapProjection,
    ConfigMapVolumeSource, Container, DownwardAPIVolumeFile, DownwardAPIVolumeSource,
    EnvFromSource, EnvVar, EnvVarSource, KeyToPath, LocalObjectReference, ObjectFieldSelector,
    PodSpec, ProjectedVolumeSource, SecretEnvSource, SecretKeySelector, SecretProjection,
    SecretVolumeSource, ServiceAccountTokenProjection, Volume, VolumeMount, VolumeProjection,
};
use serde_json::{Value, json};

use ObjectKind::{ConfigMap as CM, Secret as SECRET};

// ---------------------------------------------------------------------------------------------
// Builders
// ---------------------------------------------------------------------------------------------

/// `items` for a volume source: an empty slice means "no items field at all".
fn items(keys: &[&str]) -> Option<Vec<KeyToPath>> {
    (!keys.is_empty()).then(|| {
        keys.iter()
            .map(|k| KeyToPath {
                key: k.to_string(),
                path: format!("files/{k}"),
                ..Default::default()
            })
            .collect()
    })
}

/// A container builder.
#[derive(Clone)]
struct Ctr(Container);

fn container(name: &str) -> Ctr {
    Ctr(Container {
        name: name.to_owned(),
        image: Some("busybox".to_owned()),
        ..Default::default()
    })
}

impl Ctr {
    fn env(mut self, var: EnvVar) -> Self {
        self.0.env.get_or_insert_with(Vec::new).push(var);
        self
    }

    fn env_from(mut self, from: EnvFromSource) -> Self {
        self.0.env_from.get_or_insert_with(Vec::new).push(from);
        self
    }

    /// `env[].valueFrom.configMapKeyRef`.
    fn env_config_map_key_opt(self, name: &str, key: &str, optional: Option<bool>) -> Self {
        self.env(EnvVar {
            name: format!("V_{}", key.to_uppercase()),
            value_from: Some(EnvVarSource {
                config_map_key_ref: Some(ConfigMapKeySelector {
                    name: name.to_owned(),
                    key: key.to_owned(),
                    optional,
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn env_config_map_key(self, name: &str, key: &str) -> Self {
        self.env_config_map_key_opt(name, key, None)
    }

    /// `env[].valueFrom.secretKeyRef`.
    fn env_secret_key_opt(self, name: &str, key: &str, optional: Option<bool>) -> Self {
        self.env(EnvVar {
            name: format!("S_{}", key.to_uppercase()),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: name.to_owned(),
                    key: key.to_owned(),
                    optional,
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn env_secret_key(self, name: &str, key: &str) -> Self {
        self.env_secret_key_opt(name, key, None)
    }

    /// A plain `env[].value` and a downward-API `fieldRef`: neither is a reference.
    fn env_plain(self) -> Self {
        self.env(EnvVar {
            name: "PLAIN".to_owned(),
            value: Some("x".to_owned()),
            ..Default::default()
        })
        .env(EnvVar {
            name: "POD_NAME".to_owned(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "metadata.name".to_owned(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    /// `envFrom[].configMapRef`.
    fn env_from_config_map_opt(self, name: &str, optional: Option<bool>) -> Self {
        self.env_from(EnvFromSource {
            config_map_ref: Some(ConfigMapEnvSource {
                name: name.to_owned(),
                optional,
            }),
            ..Default::default()
        })
    }

    fn env_from_config_map(self, name: &str) -> Self {
        self.env_from_config_map_opt(name, None)
    }

    /// `envFrom[].secretRef`.
    fn env_from_secret_opt(self, name: &str, optional: Option<bool>) -> Self {
        self.env_from(EnvFromSource {
            secret_ref: Some(SecretEnvSource {
                name: name.to_owned(),
                optional,
            }),
            ..Default::default()
        })
    }

    fn env_from_secret(self, name: &str) -> Self {
        self.env_from_secret_opt(name, None)
    }

    /// A `volumeMounts[]` entry for volume `vol`.
    fn mount(mut self, vol: &str) -> Self {
        self.0
            .volume_mounts
            .get_or_insert_with(Vec::new)
            .push(VolumeMount {
                name: vol.to_owned(),
                mount_path: format!("/mnt/{vol}"),
                ..Default::default()
            });
        self
    }
}

/// A pod spec builder: one main container `app` that the shorthand methods act on, plus
/// whatever containers, initContainers and volumes are added, and the workload's annotations.
struct Pod {
    app: Ctr,
    containers: Vec<Container>,
    init_containers: Vec<Container>,
    volumes: Vec<Volume>,
    image_pull_secrets: Vec<LocalObjectReference>,
    service_account: Option<String>,
    annotations: Option<BTreeMap<String, String>>,
}

fn pod() -> Pod {
    Pod {
        app: container("app"),
        containers: Vec::new(),
        init_containers: Vec::new(),
        volumes: Vec::new(),
        image_pull_secrets: Vec::new(),
        service_account: None,
        annotations: None,
    }
}

impl Pod {
    /// Changes the main container.
    fn app(mut self, f: impl FnOnce(Ctr) -> Ctr) -> Self {
        self.app = f(self.app);
        self
    }

    fn container(mut self, c: Ctr) -> Self {
        self.containers.push(c.0);
        self
    }

    fn init_container(mut self, c: Ctr) -> Self {
        self.init_containers.push(c.0);
        self
    }

    fn env_config_map_key(self, name: &str, key: &str) -> Self {
        self.app(|c| c.env_config_map_key(name, key))
    }

    fn env_secret_key(self, name: &str, key: &str) -> Self {
        self.app(|c| c.env_secret_key(name, key))
    }

    fn env_from_config_map(self, name: &str) -> Self {
        self.app(|c| c.env_from_config_map(name))
    }

    fn env_from_secret(self, name: &str) -> Self {
        self.app(|c| c.env_from_secret(name))
    }

    fn volume(mut self, v: Volume) -> Self {
        self.volumes.push(v);
        self
    }

    /// A `configMap` volume, not mounted by anyone.
    fn config_map_volume_opt(
        self,
        vol: &str,
        name: &str,
        keys: &[&str],
        optional: Option<bool>,
    ) -> Self {
        self.volume(Volume {
            name: vol.to_owned(),
            config_map: Some(ConfigMapVolumeSource {
                name: name.to_owned(),
                items: items(keys),
                optional,
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn config_map_volume(self, vol: &str, name: &str, keys: &[&str]) -> Self {
        self.config_map_volume_opt(vol, name, keys, None)
    }

    /// A `secret` volume, not mounted by anyone.
    fn secret_volume_opt(
        self,
        vol: &str,
        name: &str,
        keys: &[&str],
        optional: Option<bool>,
    ) -> Self {
        self.volume(Volume {
            name: vol.to_owned(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(name.to_owned()),
                items: items(keys),
                optional,
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn secret_volume(self, vol: &str, name: &str, keys: &[&str]) -> Self {
        self.secret_volume_opt(vol, name, keys, None)
    }

    /// A `projected` volume with the given sources, not mounted by anyone.
    fn projected_volume(self, vol: &str, sources: Vec<VolumeProjection>) -> Self {
        self.volume(Volume {
            name: vol.to_owned(),
            projected: Some(ProjectedVolumeSource {
                sources: Some(sources),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    /// A `configMap` volume mounted by the main container.
    fn mount_config_map(self, vol: &str, name: &str, keys: &[&str]) -> Self {
        self.config_map_volume(vol, name, keys)
            .app(|c| c.mount(vol))
    }

    /// A `secret` volume mounted by the main container.
    fn mount_secret(self, vol: &str, name: &str, keys: &[&str]) -> Self {
        self.secret_volume(vol, name, keys).app(|c| c.mount(vol))
    }

    /// A `projected` volume mounted by the main container.
    fn mount_projected(self, vol: &str, sources: Vec<VolumeProjection>) -> Self {
        self.projected_volume(vol, sources).app(|c| c.mount(vol))
    }

    fn annotate(mut self, key: &str, value: &str) -> Self {
        self.annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    fn spec(&self) -> PodSpec {
        let mut containers = vec![self.app.0.clone()];
        containers.extend(self.containers.iter().cloned());
        PodSpec {
            containers,
            init_containers: (!self.init_containers.is_empty())
                .then(|| self.init_containers.clone()),
            volumes: (!self.volumes.is_empty()).then(|| self.volumes.clone()),
            image_pull_secrets: (!self.image_pull_secrets.is_empty())
                .then(|| self.image_pull_secrets.clone()),
            service_account_name: self.service_account.clone(),
            ..Default::default()
        }
    }

    fn discover(&self) -> References {
        refs::discover(&self.spec(), self.annotations.as_ref())
    }
}

fn projected_config_map(name: &str, keys: &[&str], optional: Option<bool>) -> VolumeProjection {
    VolumeProjection {
        config_map: Some(ConfigMapProjection {
            name: name.to_owned(),
            items: items(keys),
            optional,
        }),
        ..Default::default()
    }
}

fn projected_secret(name: &str, keys: &[&str], optional: Option<bool>) -> VolumeProjection {
    VolumeProjection {
        secret: Some(SecretProjection {
            name: name.to_owned(),
            items: items(keys),
            optional,
        }),
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Expectations
// ---------------------------------------------------------------------------------------------

fn whole() -> Selection {
    Selection::Whole
}

fn keys(keys: &[&str]) -> Selection {
    Selection::Keys(keys.iter().map(|k| k.to_string()).collect())
}

type Row = (ObjectKind, String, Selection, bool);

/// Every reference in iteration order, as (kind, name, selection, optional).
fn rows(refs: &References) -> Vec<Row> {
    refs.iter()
        .map(|(o, s)| (o.kind, o.name.clone(), s.selection.clone(), s.optional))
        .collect()
}

/// A required reference.
fn req(kind: ObjectKind, name: &str, sel: Selection) -> Row {
    (kind, name.to_owned(), sel, false)
}

/// An optional reference.
fn opt(kind: ObjectKind, name: &str, sel: Selection) -> Row {
    (kind, name.to_owned(), sel, true)
}

#[track_caller]
fn assert_refs(refs: &References, expected: &[Row]) {
    assert_eq!(rows(refs), expected, "references differ");
    assert_eq!(refs.len(), expected.len());
    assert_eq!(refs.is_empty(), expected.is_empty());
}

// ---------------------------------------------------------------------------------------------
// One test per reference path
// ---------------------------------------------------------------------------------------------

#[test]
fn env_config_map_key_ref_is_that_one_key() {
    let refs = pod().env_config_map_key("cfg", "LOG_LEVEL").discover();
    assert_refs(&refs, &[req(CM, "cfg", keys(&["LOG_LEVEL"]))]);
}

#[test]
fn env_secret_key_ref_is_that_one_key() {
    let refs = pod().env_secret_key("db", "password").discover();
    assert_refs(&refs, &[req(SECRET, "db", keys(&["password"]))]);
}

#[test]
fn env_from_config_map_ref_is_the_whole_object() {
    let refs = pod().env_from_config_map("app-env").discover();
    assert_refs(&refs, &[req(CM, "app-env", whole())]);
}

#[test]
fn env_from_secret_ref_is_the_whole_object() {
    let refs = pod().env_from_secret("app-secrets").discover();
    assert_refs(&refs, &[req(SECRET, "app-secrets", whole())]);
}

#[test]
fn config_map_volume_without_items_is_the_whole_object() {
    let refs = pod().mount_config_map("conf", "web", &[]).discover();
    assert_refs(&refs, &[req(CM, "web", whole())]);
}

#[test]
fn config_map_volume_with_items_is_only_those_keys() {
    let refs = pod()
        .mount_config_map("conf", "web", &["nginx.conf", "mime.types"])
        .discover();
    assert_refs(
        &refs,
        &[req(CM, "web", keys(&["mime.types", "nginx.conf"]))],
    );
}

#[test]
fn secret_volume_without_items_is_the_whole_object() {
    let refs = pod().mount_secret("tls", "web-tls", &[]).discover();
    assert_refs(&refs, &[req(SECRET, "web-tls", whole())]);
}

#[test]
fn secret_volume_with_items_is_only_those_keys() {
    let refs = pod()
        .mount_secret("tls", "web-tls", &["tls.crt"])
        .discover();
    assert_refs(&refs, &[req(SECRET, "web-tls", keys(&["tls.crt"]))]);
}

#[test]
fn secret_volume_without_secret_name_is_no_reference() {
    let refs = pod()
        .volume(Volume {
            name: "nameless".to_owned(),
            secret: Some(SecretVolumeSource::default()),
            ..Default::default()
        })
        .app(|c| c.mount("nameless"))
        .env_from_config_map("marker")
        .discover();
    assert_refs(&refs, &[req(CM, "marker", whole())]);
}

#[test]
fn projected_config_map_source_whole_and_items() {
    let refs = pod()
        .mount_projected(
            "all",
            vec![
                projected_config_map("whole-cm", &[], None),
                projected_config_map("some-cm", &["a", "b"], None),
            ],
        )
        .discover();
    assert_refs(
        &refs,
        &[
            req(CM, "some-cm", keys(&["a", "b"])),
            req(CM, "whole-cm", whole()),
        ],
    );
}

#[test]
fn projected_secret_source_whole_and_items() {
    let refs = pod()
        .mount_projected(
            "all",
            vec![
                projected_secret("whole-s", &[], None),
                projected_secret("some-s", &["token"], None),
            ],
        )
        .discover();
    assert_refs(
        &refs,
        &[
            req(SECRET, "some-s", keys(&["token"])),
            req(SECRET, "whole-s", whole()),
        ],
    );
}

#[test]
fn projected_volume_mixes_kinds_and_ignores_other_sources() {
    let refs = pod()
        .mount_projected(
            "mixed",
            vec![
                projected_secret("s", &[], None),
                VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        path: "token".to_owned(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                projected_config_map("c", &["k"], None),
            ],
        )
        .discover();
    assert_refs(
        &refs,
        &[req(CM, "c", keys(&["k"])), req(SECRET, "s", whole())],
    );
}

#[test]
fn empty_items_list_is_the_whole_object() {
    // `items: []` projects every key, as no `items` does (the kubelet treats them alike).
    let refs = pod()
        .volume(Volume {
            name: "cm".to_owned(),
            config_map: Some(ConfigMapVolumeSource {
                name: "cfg".to_owned(),
                items: Some(Vec::new()),
                ..Default::default()
            }),
            ..Default::default()
        })
        .volume(Volume {
            name: "sec".to_owned(),
            secret: Some(SecretVolumeSource {
                secret_name: Some("sec".to_owned()),
                items: Some(Vec::new()),
                ..Default::default()
            }),
            ..Default::default()
        })
        .mount_projected(
            "proj",
            vec![
                VolumeProjection {
                    config_map: Some(ConfigMapProjection {
                        name: "pcfg".to_owned(),
                        items: Some(Vec::new()),
                        optional: None,
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    secret: Some(SecretProjection {
                        name: "psec".to_owned(),
                        items: Some(Vec::new()),
                        optional: None,
                    }),
                    ..Default::default()
                },
            ],
        )
        .app(|c| c.mount("cm").mount("sec"))
        .discover();
    assert_refs(
        &refs,
        &[
            req(CM, "cfg", whole()),
            req(CM, "pcfg", whole()),
            req(SECRET, "psec", whole()),
            req(SECRET, "sec", whole()),
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// Mounted volumes only; initContainers and every container count
// ---------------------------------------------------------------------------------------------

#[test]
fn volumes_not_mounted_by_any_container_are_not_references() {
    let refs = pod()
        .config_map_volume("unused-cm", "cm-unused", &[])
        .secret_volume("unused-secret", "secret-unused", &["k"])
        .projected_volume(
            "unused-proj",
            vec![
                projected_config_map("proj-cm-unused", &[], None),
                projected_secret("proj-secret-unused", &[], None),
            ],
        )
        .mount_config_map("used", "cm-used", &[])
        .discover();
    assert_refs(&refs, &[req(CM, "cm-used", whole())]);
}

#[test]
fn a_mount_naming_no_volume_is_harmless() {
    let refs = pod()
        .app(|c| c.mount("no-such-volume"))
        .config_map_volume("other", "cfg", &[])
        .discover();
    assert_refs(&refs, &[]);
}

#[test]
fn volumes_mounted_only_by_an_init_container_are_references() {
    let refs = pod()
        .config_map_volume("init-conf", "init-cfg", &[])
        .secret_volume("init-sec", "init-secret", &["k"])
        .projected_volume(
            "init-proj",
            vec![projected_secret("init-proj-s", &[], None)],
        )
        .init_container(
            container("init")
                .mount("init-conf")
                .mount("init-sec")
                .mount("init-proj"),
        )
        .discover();
    assert_refs(
        &refs,
        &[
            req(CM, "init-cfg", whole()),
            req(SECRET, "init-proj-s", whole()),
            req(SECRET, "init-secret", keys(&["k"])),
        ],
    );
}

#[test]
fn init_container_env_and_env_from_are_references() {
    let refs = pod()
        .init_container(
            container("migrate")
                .env_config_map_key("init-cm", "k1")
                .env_secret_key("init-s", "k2")
                .env_from_config_map("init-cm-whole")
                .env_from_secret("init-s-whole"),
        )
        .discover();
    assert_refs(
        &refs,
        &[
            req(CM, "init-cm", keys(&["k1"])),
            req(CM, "init-cm-whole", whole()),
            req(SECRET, "init-s", keys(&["k2"])),
            req(SECRET, "init-s-whole", whole()),
        ],
    );
}

#[test]
fn every_container_counts_not_only_the_first() {
    let refs = pod()
        .container(container("sidecar").env_from_secret("sidecar-secret"))
        .container(container("third").mount("v3"))
        .config_map_volume("v3", "third-cm", &[])
        .discover();
    assert_refs(
        &refs,
        &[
            req(CM, "third-cm", whole()),
            req(SECRET, "sidecar-secret", whole()),
        ],
    );
}

#[test]
fn plain_env_values_and_field_refs_are_not_references() {
    let refs = pod().app(Ctr::env_plain).discover();
    assert_refs(&refs, &[]);
}

// ---------------------------------------------------------------------------------------------
// Merging
// ---------------------------------------------------------------------------------------------

#[test]
fn key_sets_of_one_object_union() {
    let refs = pod()
        .env_config_map_key("cfg", "b")
        .env_config_map_key("cfg", "a")
        .mount_config_map("v", "cfg", &["c", "a"])
        .init_container(container("init").env_config_map_key("cfg", "d"))
        .discover();
    assert_refs(&refs, &[req(CM, "cfg", keys(&["a", "b", "c", "d"]))]);
}

#[test]
fn whole_object_wins_over_keys_in_either_order() {
    // Keys first, then whole (env before envFrom in the same container) ...
    let keys_then_whole = pod()
        .env_secret_key("s", "k")
        .env_from_secret("s")
        .discover();
    assert_refs(&keys_then_whole, &[req(SECRET, "s", whole())]);
    // ... and whole first (initContainer envFrom), then keys (main container, volume items).
    let whole_then_keys = pod()
        .init_container(container("init").env_from_config_map("c"))
        .env_config_map_key("c", "k")
        .mount_config_map("v", "c", &["other"])
        .discover();
    assert_refs(&whole_then_keys, &[req(CM, "c", whole())]);
}

#[test]
fn a_volume_mounted_twice_is_one_reference() {
    let refs = pod()
        .mount_config_map("v", "cfg", &["k"])
        .app(|c| c.mount("v"))
        .container(container("side").mount("v"))
        .init_container(container("init").mount("v"))
        .discover();
    assert_refs(&refs, &[req(CM, "cfg", keys(&["k"]))]);
}

#[test]
fn config_map_and_secret_of_the_same_name_are_different_objects() {
    let refs = pod()
        .env_from_config_map("same")
        .env_secret_key("same", "k")
        .discover();
    assert_refs(
        &refs,
        &[req(CM, "same", whole()), req(SECRET, "same", keys(&["k"]))],
    );
}

#[test]
fn optional_when_every_reference_says_optional_true() {
    let refs = pod()
        .app(|c| {
            c.env_config_map_key_opt("cm", "a", Some(true))
                .env_from_config_map_opt("cm", Some(true))
                .env_secret_key_opt("s", "k", Some(true))
                .env_from_secret_opt("s2", Some(true))
        })
        .config_map_volume_opt("v1", "cm", &["b"], Some(true))
        .secret_volume_opt("v2", "s", &["j"], Some(true))
        .projected_volume(
            "v3",
            vec![
                projected_config_map("cm", &[], Some(true)),
                projected_secret("s", &["l"], Some(true)),
            ],
        )
        .app(|c| c.mount("v1").mount("v2").mount("v3"))
        .discover();
    assert_refs(
        &refs,
        &[
            opt(CM, "cm", whole()),
            opt(SECRET, "s", keys(&["j", "k", "l"])),
            opt(SECRET, "s2", whole()),
        ],
    );
}

#[test]
fn one_required_reference_makes_the_object_required() {
    // For each reference path, an otherwise-optional object becomes required as soon as that one
    // path does not say optional: true (absent `optional` and `optional: false` alike), whichever
    // comes first.
    for required in [None, Some(false)] {
        let refs = pod()
            // optional first, required second
            .app(|c| {
                c.env_config_map_key_opt("a", "k", Some(true))
                    .env_from_config_map_opt("a", required)
                    .env_secret_key_opt("b", "k", Some(true))
                    .env_secret_key_opt("b", "j", required)
                    .env_from_secret_opt("c", Some(true))
                    .env_from_secret_opt("c", required)
            })
            // required first (env), optional later (volumes)
            .app(|c| {
                c.env_config_map_key_opt("d", "k", required)
                    .env_secret_key_opt("e", "k", required)
            })
            .config_map_volume_opt("vd", "d", &[], Some(true))
            .secret_volume_opt("ve", "e", &[], Some(true))
            // required only through a volume / projection, optional through env
            .app(|c| {
                c.env_config_map_key_opt("f", "k", Some(true))
                    .env_secret_key_opt("g", "k", Some(true))
                    .env_config_map_key_opt("h", "k", Some(true))
                    .env_secret_key_opt("i", "k", Some(true))
            })
            .config_map_volume_opt("vf", "f", &["k"], required)
            .secret_volume_opt("vg", "g", &["k"], required)
            .projected_volume(
                "vp",
                vec![
                    projected_config_map("h", &["k"], required),
                    projected_secret("i", &["k"], required),
                ],
            )
            .app(|c| {
                c.mount("vd")
                    .mount("ve")
                    .mount("vf")
                    .mount("vg")
                    .mount("vp")
            })
            .discover();
        assert_refs(
            &refs,
            &[
                req(CM, "a", whole()),
                req(CM, "d", whole()),
                req(CM, "f", keys(&["k"])),
                req(CM, "h", keys(&["k"])),
                req(SECRET, "b", keys(&["j", "k"])),
                req(SECRET, "c", whole()),
                req(SECRET, "e", whole()),
                req(SECRET, "g", keys(&["k"])),
                req(SECRET, "i", keys(&["k"])),
            ],
        );
    }
}

#[test]
fn an_unmounted_required_volume_does_not_make_an_optional_reference_required() {
    let refs = pod()
        .app(|c| c.env_from_config_map_opt("cfg", Some(true)))
        .config_map_volume_opt("unmounted", "cfg", &[], Some(false))
        .discover();
    assert_refs(&refs, &[opt(CM, "cfg", whole())]);
}

// ---------------------------------------------------------------------------------------------
// Not references
// ---------------------------------------------------------------------------------------------

#[test]
fn image_pull_secrets_service_account_downward_api_and_csi_are_not_references() {
    let mut p = pod()
        .volume(Volume {
            name: "downward".to_owned(),
            downward_api: Some(DownwardAPIVolumeSource {
                items: Some(vec![DownwardAPIVolumeFile {
                    path: "labels".to_owned(),
                    field_ref: Some(ObjectFieldSelector {
                        field_path: "metadata.labels".to_owned(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        })
        .volume(Volume {
            name: "csi".to_owned(),
            csi: Some(CSIVolumeSource {
                driver: "secrets-store.csi.k8s.io".to_owned(),
                node_publish_secret_ref: Some(LocalObjectReference {
                    name: "csi-creds".to_owned(),
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
        .mount_projected(
            "sa-token",
            vec![VolumeProjection {
                service_account_token: Some(ServiceAccountTokenProjection {
                    path: "token".to_owned(),
                    ..Default::default()
                }),
                ..Default::default()
            }],
        )
        .app(|c| c.mount("downward").mount("csi"));
    p.image_pull_secrets.push(LocalObjectReference {
        name: "regcred".to_owned(),
    });
    p.service_account = Some("builder".to_owned());
    assert_refs(&p.discover(), &[]);

    // The same pod with one real reference finds exactly that one.
    let refs = p.env_from_secret("real").discover();
    assert_refs(&refs, &[req(SECRET, "real", whole())]);
}

#[test]
fn empty_names_are_not_references() {
    let refs = pod()
        .env_from_config_map("")
        .env_secret_key("", "k")
        .mount_config_map("v", "", &[])
        .discover();
    assert_refs(&refs, &[]);
}

#[test]
fn a_pod_without_references_has_none() {
    let refs = pod().discover();
    assert_refs(&refs, &[]);
    assert!(refs.rejected().is_empty());
}

// ---------------------------------------------------------------------------------------------
// Extra-reference annotations
// ---------------------------------------------------------------------------------------------

#[test]
fn extra_configmaps_annotation_is_split_trimmed_deduplicated_whole_and_required() {
    let refs = pod()
        .annotate(EXTRA_CONFIGMAPS_ANNOTATION, " a, b ,,a")
        .discover();
    assert_refs(&refs, &[req(CM, "a", whole()), req(CM, "b", whole())]);
    assert!(refs.rejected().is_empty(), "{:?}", refs.rejected());
}

#[test]
fn extra_secrets_annotation_is_split_trimmed_deduplicated_whole_and_required() {
    let refs = pod()
        .annotate(EXTRA_SECRETS_ANNOTATION, "\tc ,d,  , c,\n")
        .discover();
    assert_refs(
        &refs,
        &[req(SECRET, "c", whole()), req(SECRET, "d", whole())],
    );
    assert!(refs.rejected().is_empty(), "{:?}", refs.rejected());
}

#[test]
fn extra_annotations_merge_with_pod_spec_references() {
    // The annotations name whole, required objects: they widen key references and make optional
    // references required.
    let refs = pod()
        .app(|c| {
            c.env_config_map_key_opt("cfg", "k", Some(true))
                .env_secret_key_opt("sec", "k", Some(true))
        })
        .annotate(EXTRA_CONFIGMAPS_ANNOTATION, "cfg")
        .annotate(EXTRA_SECRETS_ANNOTATION, "sec, other")
        .discover();
    assert_refs(
        &refs,
        &[
            req(CM, "cfg", whole()),
            req(SECRET, "other", whole()),
            req(SECRET, "sec", whole()),
        ],
    );
}

#[test]
fn empty_or_blank_extra_annotations_add_nothing() {
    for value in ["", " ", ",", " , ,, "] {
        let refs = pod()
            .annotate(EXTRA_CONFIGMAPS_ANNOTATION, value)
            .annotate(EXTRA_SECRETS_ANNOTATION, value)
            .discover();
        assert_refs(&refs, &[]);
        assert!(
            refs.rejected().is_empty(),
            "{value:?}: {:?}",
            refs.rejected()
        );
    }
}

#[test]
fn other_annotations_are_not_references() {
    let refs = pod()
        .annotate("confighash.dev/extra-configmap", "singular")
        .annotate("example.com/extra-configmaps", "foreign")
        .annotate("confighash.dev/ignore", "true")
        .discover();
    assert_refs(&refs, &[]);
}

#[test]
fn invalid_names_in_extra_annotations_are_rejected_and_left_out() {
    let too_long = "a".repeat(254);
    let longest = format!("{}.{}", "a".repeat(63), "b".repeat(189));
    assert_eq!(longest.len(), 253);
    let cms = format!("good, Bad, under_score, -lead, trail-, a..b, .dot, {too_long}, {longest}");
    let refs = pod()
        .annotate(EXTRA_CONFIGMAPS_ANNOTATION, &cms)
        .annotate(EXTRA_SECRETS_ANNOTATION, "ok.example-1, sp ace, x/y, ünï")
        .discover();
    assert_refs(
        &refs,
        &[
            req(CM, &longest, whole()),
            req(CM, "good", whole()),
            req(SECRET, "ok.example-1", whole()),
        ],
    );
    let rejected: BTreeSet<ObjectRef> = refs.rejected().iter().cloned().collect();
    let expected: BTreeSet<ObjectRef> = [
        ObjectRef::new(CM, "Bad"),
        ObjectRef::new(CM, "under_score"),
        ObjectRef::new(CM, "-lead"),
        ObjectRef::new(CM, "trail-"),
        ObjectRef::new(CM, "a..b"),
        ObjectRef::new(CM, ".dot"),
        ObjectRef::new(CM, too_long),
        ObjectRef::new(SECRET, "sp ace"),
        ObjectRef::new(SECRET, "x/y"),
        ObjectRef::new(SECRET, "ünï"),
    ]
    .into_iter()
    .collect();
    assert_eq!(rejected, expected);
    for r in refs.rejected() {
        assert!(refs.get(r).is_none(), "rejected {r} is still a reference");
    }
}

#[test]
fn is_object_name_accepts_dns_subdomains_only() {
    for good in ["a", "0", "a-b", "a.b", "web-1.example.com", "x9"] {
        assert!(refs::is_object_name(good), "{good:?} should be valid");
    }
    for bad in ["", "A", "a_b", "-a", "a-", "a.", ".a", "a..b", "a b", "é"] {
        assert!(!refs::is_object_name(bad), "{bad:?} should be invalid");
    }
    assert!(refs::is_object_name(&"a".repeat(253)));
    assert!(!refs::is_object_name(&"a".repeat(254)));
}

#[test]
fn split_names_trims_and_drops_empty_items() {
    let names: Vec<&str> = refs::split_names(" a, b ,,a,\t").collect();
    assert_eq!(names, ["a", "b", "a"]);
}

// ---------------------------------------------------------------------------------------------
// Order
// ---------------------------------------------------------------------------------------------

#[test]
fn names_in_the_pod_spec_that_are_not_object_names_are_no_references() {
    let refs = pod()
        .env_from_secret("Z-upper")
        .env_from_config_map("../../kube-system/secrets/x")
        .env_config_map_key("x?watch=1", "k")
        .env_from_config_map("fine")
        .discover();
    let names: Vec<&str> = refs.iter().map(|(o, _)| o.name.as_str()).collect();
    assert_eq!(names, ["fine"]);
}

#[test]
fn iteration_order_is_kind_then_name_with_config_maps_first() {
    let refs = pod()
        .env_from_secret("a-secret")
        .env_from_secret("9-secret")
        .env_from_config_map("zz-cm")
        .env_config_map_key("b", "k")
        .env_from_config_map("a.b")
        .env_from_config_map("a-b")
        .annotate(EXTRA_SECRETS_ANNOTATION, "0-secret")
        .annotate(EXTRA_CONFIGMAPS_ANNOTATION, "m")
        .discover();
    let order: Vec<(ObjectKind, String)> =
        refs.iter().map(|(o, _)| (o.kind, o.name.clone())).collect();
    // Byte order: '-' (0x2d) < '.' (0x2e) < digits < lower case.
    let expected: Vec<(ObjectKind, String)> = [
        (CM, "a-b"),
        (CM, "a.b"),
        (CM, "b"),
        (CM, "m"),
        (CM, "zz-cm"),
        (SECRET, "0-secret"),
        (SECRET, "9-secret"),
        (SECRET, "a-secret"),
    ]
    .into_iter()
    .map(|(k, n)| (k, n.to_owned()))
    .collect();
    assert_eq!(order, expected);
    assert!(ObjectKind::ConfigMap < ObjectKind::Secret);
}

#[test]
fn get_finds_merged_references() {
    let refs = pod()
        .env_config_map_key("cfg", "k")
        .mount_config_map("v", "cfg", &["j"])
        .discover();
    let spec = refs
        .get(&ObjectRef::new(CM, "cfg"))
        .expect("cfg is referenced");
    assert_eq!(spec.selection, keys(&["j", "k"]));
    assert!(!spec.optional);
    assert!(refs.get(&ObjectRef::new(SECRET, "cfg")).is_none());
    assert!(refs.get(&ObjectRef::new(CM, "other")).is_none());
}

// ---------------------------------------------------------------------------------------------
// Workload kinds
// ---------------------------------------------------------------------------------------------

/// A pod spec using every reference path once, as JSON.
fn pod_spec_json() -> Value {
    json!({
        "initContainers": [{
            "name": "init",
            "image": "busybox",
            "envFrom": [{"secretRef": {"name": "init-secret"}}],
            "volumeMounts": [{"name": "proj", "mountPath": "/proj"}]
        }],
        "containers": [{
            "name": "app",
            "image": "busybox",
            "env": [
                {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "env-cm", "key": "a"}}},
                {"name": "B", "valueFrom": {"secretKeyRef": {"name": "env-secret", "key": "b", "optional": true}}}
            ],
            "envFrom": [{"configMapRef": {"name": "whole-cm"}}],
            "volumeMounts": [
                {"name": "conf", "mountPath": "/conf"},
                {"name": "tls", "mountPath": "/tls"}
            ]
        }],
        "volumes": [
            {"name": "conf", "configMap": {"name": "vol-cm", "items": [{"key": "x", "path": "x"}]}},
            {"name": "tls", "secret": {"secretName": "vol-secret"}},
            {"name": "proj", "projected": {"sources": [
                {"configMap": {"name": "proj-cm"}},
                {"secret": {"name": "proj-secret", "items": [{"key": "y", "path": "y"}]}}
            ]}},
            {"name": "unmounted", "configMap": {"name": "unmounted-cm"}}
        ],
        "imagePullSecrets": [{"name": "regcred"}]
    })
}

fn expected_workload_refs() -> Vec<Row> {
    vec![
        req(CM, "env-cm", keys(&["a"])),
        req(CM, "extra-cm", whole()),
        req(CM, "proj-cm", whole()),
        req(CM, "vol-cm", keys(&["x"])),
        req(CM, "whole-cm", whole()),
        opt(SECRET, "env-secret", keys(&["b"])),
        req(SECRET, "extra-secret", whole()),
        req(SECRET, "init-secret", whole()),
        req(SECRET, "proj-secret", keys(&["y"])),
        req(SECRET, "vol-secret", whole()),
    ]
}

/// `web` in `prod`, of `kind`, with `labels`, the pod spec of [`pod_spec_json`], and one more
/// ConfigMap and two more Secrets (one not an object name) named in annotations.
fn workload_json(kind: WorkloadKind, labels: Value) -> Value {
    workload(kind, "web")
        .in_namespace("prod")
        .labels(labels)
        .extra_config_maps(&["extra-cm"])
        .extra_secrets(&["extra-secret", "Invalid_Name"])
        .pod_spec(pod_spec_json())
        .json()
}

fn workload_info(kind: WorkloadKind, obj: &Value) -> WorkloadInfo {
    match workload::analyze(kind, obj) {
        Ok(Analysis::Workload(info)) => *info,
        other => panic!("{kind}: expected a workload, got {other:?}"),
    }
}

#[test]
fn every_workload_kind_yields_its_references() {
    for kind in WorkloadKind::BUILT_IN {
        let obj = workload_json(kind, json!({"app": "web"}));
        let api_version = obj["apiVersion"].as_str().unwrap();
        assert_eq!(
            confighash::core::workload::Kinds::built_in().from_type(api_version, kind.kind()),
            Some(kind),
            "{api_version} {kind}"
        );
        let info = workload_info(kind, &obj);
        assert_eq!(info.kind, kind);
        assert_eq!(info.name.as_deref(), Some("web"), "{kind}");
        assert_eq!(info.namespace.as_deref(), Some("prod"), "{kind}");
        assert!(!info.opted_out, "{kind}");
        assert_eq!(rows(&info.refs), expected_workload_refs(), "{kind}");
        assert_eq!(
            info.refs.rejected(),
            [ObjectRef::new(SECRET, "Invalid_Name")],
            "{kind}"
        );
    }
}

#[test]
fn cron_job_references_come_from_the_job_template_only() {
    // A pod template put where Deployments keep it is not the CronJob's template.
    let mut obj = workload_json(WorkloadKind::CRON_JOB, json!({}));
    obj["spec"]["template"] = json!({
        "spec": {"containers": [{"name": "x", "envFrom": [{"configMapRef": {"name": "decoy"}}]}]}
    });
    let info = workload_info(WorkloadKind::CRON_JOB, &obj);
    assert_eq!(rows(&info.refs), expected_workload_refs());

    obj["spec"]
        .as_object_mut()
        .unwrap()
        .remove("jobTemplate")
        .unwrap();
    assert!(
        workload::analyze(WorkloadKind::CRON_JOB, &obj).is_err(),
        "a CronJob without spec.jobTemplate.spec.template has no pod template"
    );
}

#[test]
fn rollout_with_workload_ref_is_passed_through() {
    let obj = json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": "web", "namespace": "prod"},
        "spec": {
            "workloadRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "strategy": {"canary": {}}
        }
    });
    assert!(matches!(
        workload::analyze(WorkloadKind::ROLLOUT, &obj),
        Ok(Analysis::WorkloadRef)
    ));
    // A Rollout with its own template is a workload, whatever else it carries.
    let own = workload_json(WorkloadKind::ROLLOUT, json!({}));
    assert!(matches!(
        workload::analyze(WorkloadKind::ROLLOUT, &own),
        Ok(Analysis::Workload(_))
    ));
}

#[test]
fn workload_labelled_enabled_false_is_opted_out() {
    for kind in WorkloadKind::BUILT_IN {
        let out = workload_json(
            kind,
            json!({"app": "web", "confighash.dev/enabled": "false"}),
        );
        let info = workload_info(kind, &out);
        assert!(info.opted_out, "{kind} labelled enabled=false");
        // Opting out does not change what it references.
        assert_eq!(rows(&info.refs), expected_workload_refs(), "{kind}");

        for labels in [
            json!({"confighash.dev/enabled": "true"}),
            json!({"app": "web"}),
            json!(null),
        ] {
            let obj = workload_json(kind, labels.clone());
            assert!(
                !workload_info(kind, &obj).opted_out,
                "{kind} with labels {labels} is not opted out"
            );
        }
    }
}

#[test]
fn opt_out_label_on_the_pod_template_is_not_an_opt_out() {
    let mut obj = workload_json(WorkloadKind::DEPLOYMENT, json!({}));
    obj["spec"]["template"]["metadata"]["labels"]["confighash.dev/enabled"] = json!("false");
    assert!(!workload_info(WorkloadKind::DEPLOYMENT, &obj).opted_out);
}

#[test]
fn workload_labelled_enabled_true_is_opted_in_and_only_exactly_true() {
    for kind in WorkloadKind::BUILT_IN {
        let opted_in = workload_json(
            kind,
            json!({"app": "web", "confighash.dev/enabled": "true"}),
        );
        let info = workload_info(kind, &opted_in);
        assert!(
            info.opted_in && !info.opted_out,
            "{kind} labelled enabled=true"
        );
        assert_eq!(rows(&info.refs), expected_workload_refs(), "{kind}");

        for labels in [
            json!({"confighash.dev/enabled": "false"}),
            json!({"confighash.dev/enabled": "True"}),
            json!({"confighash.dev/enabled": "yes"}),
            json!({"confighash.dev/enabled": ""}),
            json!({"app": "web"}),
            json!(null),
        ] {
            let obj = workload_json(kind, labels.clone());
            assert!(
                !workload_info(kind, &obj).opted_in,
                "{kind} with labels {labels} is not opted in"
            );
        }
    }
    // On the pod template the label means nothing.
    let mut obj = workload_json(WorkloadKind::DEPLOYMENT, json!({}));
    obj["spec"]["template"]["metadata"]["labels"]["confighash.dev/enabled"] = json!("true");
    assert!(!workload_info(WorkloadKind::DEPLOYMENT, &obj).opted_in);
}

/// A review may name one object's keys thousands of times (a 7 MiB body holds about 100,000
/// `env` entries): each is merged into one set, kept once and in byte order, and a set kept a
/// long time holds the same keys.
#[test]
fn many_key_references_to_one_object_merge_into_one_ordered_set() {
    let n = 20_000;
    let env: Vec<Value> = (0..n)
        .rev()
        .map(|i| json!({"name": format!("E{i}"), "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": format!("k{}", i % (n / 2))}}}))
        .collect();
    let spec: PodSpec =
        serde_json::from_value(json!({"containers": [{"name": "app", "env": env}]})).unwrap();
    let mut refs = refs::discover(&spec, None);
    let mut expected: Vec<String> = (0..n / 2).map(|i| format!("k{i}")).collect();
    expected.sort();
    let keys_of = |refs: &References| match &refs.get(&ObjectRef::new(CM, "cfg")).unwrap().selection
    {
        Selection::Keys(keys) => keys.iter().cloned().collect::<Vec<_>>(),
        Selection::Whole => panic!("a key selection"),
    };
    assert_eq!(keys_of(&refs), expected);
    let before = refs.clone();
    refs.shrink_to_fit();
    assert_eq!(refs, before, "the same references once kept");
    assert_eq!(keys_of(&refs), expected);
    let Selection::Keys(keys) = &refs.get(&ObjectRef::new(CM, "cfg")).unwrap().selection else {
        unreachable!()
    };
    assert!(keys.contains("k0") && keys.contains(&format!("k{}", n / 2 - 1)));
    assert!(!keys.contains("k") && keys.len() == n / 2);
}

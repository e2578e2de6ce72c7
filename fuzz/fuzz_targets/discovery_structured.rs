//! Reference discovery from pod specs built by `arbitrary`: every shape of reference, with names
//! and keys drawn mostly from a small pool so that references to one object meet and merge.

#![no_main]

use std::collections::BTreeMap;

use confighash::core::names::{EXTRA_CONFIGMAPS_ANNOTATION, EXTRA_SECRETS_ANNOTATION};
use confighash_fuzz_checks::check_discovery;
use k8s_openapi::api::core::v1::{
    ConfigMapEnvSource, ConfigMapKeySelector, ConfigMapProjection, ConfigMapVolumeSource,
    Container, EmptyDirVolumeSource, EnvFromSource, EnvVar, EnvVarSource, KeyToPath, PodSpec,
    ProjectedVolumeSource, SecretEnvSource, SecretKeySelector, SecretProjection,
    SecretVolumeSource, Volume, VolumeMount, VolumeProjection,
};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

/// Names and keys that meet: valid names, the empty name, names with padding, invalid ones.
const POOL: [&str; 10] = [
    "app", "db", "", "a.b", "Bad_Name", " app ", "x-1", "-x", "app,db", "a..b",
];

#[derive(Arbitrary, Debug)]
enum Name {
    Pool(u8),
    Free(String),
}

impl Name {
    fn get(&self) -> String {
        match self {
            Name::Pool(i) => POOL[usize::from(*i) % POOL.len()].to_owned(),
            Name::Free(s) => s.clone(),
        }
    }
}

#[derive(Arbitrary, Debug)]
struct KeyRef {
    name: Name,
    key: Name,
    optional: Option<bool>,
}

#[derive(Arbitrary, Debug)]
enum Env {
    Plain,
    ConfigMapKey(KeyRef),
    SecretKey(KeyRef),
    Both(KeyRef, KeyRef),
}

#[derive(Arbitrary, Debug)]
enum EnvFrom {
    ConfigMap(Name, Option<bool>),
    Secret(Name, Option<bool>),
    Both(Name, Name),
}

#[derive(Arbitrary, Debug)]
struct Ctr {
    env: Vec<Env>,
    env_from: Vec<EnvFrom>,
    /// Mounted volumes, by index: `v0` to `v4` (only `v0` to `v3` can exist).
    mounts: Vec<u8>,
}

#[derive(Arbitrary, Debug)]
struct Projected {
    name: Name,
    /// `None`: no `items`; `Some(vec![])`: an empty list.
    items: Option<Vec<Name>>,
    optional: Option<bool>,
}

#[derive(Arbitrary, Debug)]
enum Projection {
    ConfigMap(Projected),
    Secret(Projected),
    Both(Projected, Projected),
    Other,
}

#[derive(Arbitrary, Debug)]
enum Source {
    ConfigMap(Projected),
    Secret(Option<Projected>),
    Projected(Vec<Projection>),
    EmptyDir,
    Both(Projected, Projected),
}

#[derive(Arbitrary, Debug)]
struct Vol {
    /// `v0` to `v3`; two volumes may share a name.
    name: u8,
    source: Source,
}

#[derive(Arbitrary, Debug)]
struct Extra {
    names: Vec<Name>,
    /// How the names are joined.
    separator: u8,
}

#[derive(Arbitrary, Debug)]
struct Pod {
    init: Option<Vec<Ctr>>,
    containers: Vec<Ctr>,
    volumes: Option<Vec<Vol>>,
    extra_config_maps: Option<Extra>,
    extra_secrets: Option<Extra>,
    /// Other annotations on the workload.
    other: Option<(String, String)>,
}

fn items(items: &Option<Vec<Name>>) -> Option<Vec<KeyToPath>> {
    items.as_ref().map(|keys| {
        keys.iter()
            .enumerate()
            .map(|(i, k)| KeyToPath {
                key: k.get(),
                path: format!("f{i}"),
                ..Default::default()
            })
            .collect()
    })
}

fn config_map_key(r: &KeyRef) -> ConfigMapKeySelector {
    ConfigMapKeySelector {
        name: r.name.get(),
        key: r.key.get(),
        optional: r.optional,
    }
}

fn secret_key(r: &KeyRef) -> SecretKeySelector {
    SecretKeySelector {
        name: r.name.get(),
        key: r.key.get(),
        optional: r.optional,
    }
}

fn container(i: usize, c: &Ctr) -> Container {
    let env = c
        .env
        .iter()
        .enumerate()
        .map(|(j, e)| {
            let value_from = match e {
                Env::Plain => None,
                Env::ConfigMapKey(r) => Some(EnvVarSource {
                    config_map_key_ref: Some(config_map_key(r)),
                    ..Default::default()
                }),
                Env::SecretKey(r) => Some(EnvVarSource {
                    secret_key_ref: Some(secret_key(r)),
                    ..Default::default()
                }),
                Env::Both(a, b) => Some(EnvVarSource {
                    config_map_key_ref: Some(config_map_key(a)),
                    secret_key_ref: Some(secret_key(b)),
                    ..Default::default()
                }),
            };
            EnvVar {
                name: format!("E{j}"),
                value: value_from.is_none().then(|| "plain".to_owned()),
                value_from,
            }
        })
        .collect();
    let env_from = c
        .env_from
        .iter()
        .map(|f| {
            let config_map = |n: &Name, optional| ConfigMapEnvSource {
                name: n.get(),
                optional,
            };
            let secret = |n: &Name, optional| SecretEnvSource {
                name: n.get(),
                optional,
            };
            match f {
                EnvFrom::ConfigMap(n, o) => EnvFromSource {
                    config_map_ref: Some(config_map(n, *o)),
                    ..Default::default()
                },
                EnvFrom::Secret(n, o) => EnvFromSource {
                    secret_ref: Some(secret(n, *o)),
                    ..Default::default()
                },
                EnvFrom::Both(a, b) => EnvFromSource {
                    config_map_ref: Some(config_map(a, None)),
                    secret_ref: Some(secret(b, None)),
                    ..Default::default()
                },
            }
        })
        .collect();
    let mounts = c
        .mounts
        .iter()
        .map(|m| VolumeMount {
            name: format!("v{}", m % 5),
            mount_path: format!("/m/{m}"),
            ..Default::default()
        })
        .collect();
    Container {
        name: format!("c{i}"),
        env: Some(env),
        env_from: Some(env_from),
        volume_mounts: Some(mounts),
        ..Default::default()
    }
}

fn config_map_volume(p: &Projected) -> ConfigMapVolumeSource {
    ConfigMapVolumeSource {
        name: p.name.get(),
        items: items(&p.items),
        optional: p.optional,
        ..Default::default()
    }
}

fn secret_volume(p: &Projected) -> SecretVolumeSource {
    SecretVolumeSource {
        secret_name: Some(p.name.get()),
        items: items(&p.items),
        optional: p.optional,
        ..Default::default()
    }
}

fn projection(p: &Projection) -> VolumeProjection {
    let config_map = |p: &Projected| ConfigMapProjection {
        name: p.name.get(),
        items: items(&p.items),
        optional: p.optional,
    };
    let secret = |p: &Projected| SecretProjection {
        name: p.name.get(),
        items: items(&p.items),
        optional: p.optional,
    };
    match p {
        Projection::ConfigMap(c) => VolumeProjection {
            config_map: Some(config_map(c)),
            ..Default::default()
        },
        Projection::Secret(s) => VolumeProjection {
            secret: Some(secret(s)),
            ..Default::default()
        },
        Projection::Both(c, s) => VolumeProjection {
            config_map: Some(config_map(c)),
            secret: Some(secret(s)),
            ..Default::default()
        },
        Projection::Other => VolumeProjection::default(),
    }
}

fn volume(v: &Vol) -> Volume {
    let mut volume = Volume {
        name: format!("v{}", v.name % 4),
        ..Default::default()
    };
    match &v.source {
        Source::ConfigMap(c) => volume.config_map = Some(config_map_volume(c)),
        Source::Secret(Some(s)) => volume.secret = Some(secret_volume(s)),
        Source::Secret(None) => volume.secret = Some(SecretVolumeSource::default()),
        Source::Projected(sources) => {
            volume.projected = Some(ProjectedVolumeSource {
                sources: Some(sources.iter().map(projection).collect()),
                ..Default::default()
            })
        }
        Source::EmptyDir => volume.empty_dir = Some(EmptyDirVolumeSource::default()),
        Source::Both(c, s) => {
            volume.config_map = Some(config_map_volume(c));
            volume.secret = Some(secret_volume(s));
        }
    }
    volume
}

fn joined(extra: &Extra) -> String {
    let separator = [",", ", ", " ,\t", ",,"][usize::from(extra.separator) % 4];
    extra
        .names
        .iter()
        .map(Name::get)
        .collect::<Vec<_>>()
        .join(separator)
}

fuzz_target!(|pod: Pod| {
    let spec = PodSpec {
        init_containers: pod.init.as_ref().map(|cs| {
            cs.iter()
                .enumerate()
                .map(|(i, c)| container(i, c))
                .collect()
        }),
        containers: pod
            .containers
            .iter()
            .enumerate()
            .map(|(i, c)| container(100 + i, c))
            .collect(),
        volumes: pod
            .volumes
            .as_ref()
            .map(|vs| vs.iter().map(volume).collect()),
        ..Default::default()
    };
    let mut annotations = BTreeMap::new();
    if let Some(extra) = &pod.extra_config_maps {
        annotations.insert(EXTRA_CONFIGMAPS_ANNOTATION.to_owned(), joined(extra));
    }
    if let Some(extra) = &pod.extra_secrets {
        annotations.insert(EXTRA_SECRETS_ANNOTATION.to_owned(), joined(extra));
    }
    if let Some((k, v)) = &pod.other {
        annotations.insert(k.clone(), v.clone());
    }
    let annotations = (!annotations.is_empty()).then_some(annotations);
    check_discovery(&spec, annotations.as_ref());
});

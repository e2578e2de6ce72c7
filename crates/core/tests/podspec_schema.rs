//! Every field of a pod spec that can name a ConfigMap or Secret is decided: counted as a
//! reference (docs/serve.md, "A reference is") or not, with the reason. The schema is
//! kube-apiserver's own for the newest Kubernetes the project runs, trimmed and committed
//! (`scripts/podspec-schema.py 1.37.2`), so the test stays offline; a release that adds such a
//! field fails here until it is put in one of the lists.

use std::collections::BTreeSet;

use confighash_core::refs::{self, ObjectKind, ObjectRef};
use k8s_openapi::api::core::v1::PodSpec;
use serde_json::{Map, Value, json};

const SCHEMA: &str = include_str!("data/podspec-1.37.2.json");

/// Counted: the container reads the object's content.
const REFERENCES: &[&str] = &[
    "containers[].env[].valueFrom.configMapKeyRef",
    "containers[].env[].valueFrom.secretKeyRef",
    "containers[].envFrom[].configMapRef",
    "containers[].envFrom[].secretRef",
    "initContainers[].env[].valueFrom.configMapKeyRef",
    "initContainers[].env[].valueFrom.secretKeyRef",
    "initContainers[].envFrom[].configMapRef",
    "initContainers[].envFrom[].secretRef",
    "volumes[].configMap",
    "volumes[].secret.secretName",
    "volumes[].projected.sources[].configMap",
    "volumes[].projected.sources[].secret",
];

/// Fields that hold a reference above (the object around `secretName`).
const HOLDERS: &[&str] = &["volumes[].secret"];

/// Not counted, and why (docs/serve.md says the same).
const NOT_REFERENCES: &[(&str, &str)] = &[
    (
        "ephemeralContainers[].env[].valueFrom.configMapKeyRef",
        "added to running pods only; the API server refuses them in a pod template",
    ),
    (
        "ephemeralContainers[].env[].valueFrom.secretKeyRef",
        "added to running pods only",
    ),
    (
        "ephemeralContainers[].envFrom[].configMapRef",
        "added to running pods only",
    ),
    (
        "ephemeralContainers[].envFrom[].secretRef",
        "added to running pods only",
    ),
    (
        "imagePullSecrets[]",
        "read by the kubelet to pull images; the containers never see it",
    ),
    (
        "volumes[].azureFile.secretName",
        "credentials the volume plugin reads when mounting",
    ),
    (
        "volumes[].cephfs.secretFile",
        "a path on the node, not a Secret's name",
    ),
    ("volumes[].cephfs.secretRef", "mount credentials"),
    ("volumes[].cinder.secretRef", "mount credentials"),
    ("volumes[].csi.nodePublishSecretRef", "mount credentials"),
    ("volumes[].flexVolume.secretRef", "mount credentials"),
    ("volumes[].iscsi.secretRef", "mount credentials"),
    ("volumes[].rbd.secretRef", "mount credentials"),
    ("volumes[].scaleIO.secretRef", "mount credentials"),
    ("volumes[].storageos.secretRef", "mount credentials"),
];

/// Newer fields that name no ConfigMap or Secret, checked to be where the docs say.
const NAMES_NONE: &[&str] = &[
    "volumes[].image",
    "containers[].env[].valueFrom.fileKeyRef",
    "volumes[].projected.sources[].clusterTrustBundle",
    "volumes[].projected.sources[].podCertificate",
];

struct Schema {
    types: Map<String, Value>,
}

impl Schema {
    fn load() -> Schema {
        let doc: Value = serde_json::from_str(SCHEMA).expect("the committed schema is JSON");
        let types = doc["types"].as_object().expect("types").clone();
        Schema { types }
    }

    fn properties(&self, ty: &str) -> Option<&Map<String, Value>> {
        self.types.get(ty)?.get("properties")?.as_object()
    }

    /// Every field path under `ty` (`[]` after a list), with its type, depth first; a type
    /// met again on its own path is not entered twice.
    fn paths(
        &self,
        ty: &str,
        path: &str,
        on_path: &mut Vec<String>,
        out: &mut Vec<(String, String)>,
    ) {
        let Some(props) = self.properties(ty) else {
            return;
        };
        for (name, t) in props {
            let t = t.as_str().expect("a type name");
            let list = t.starts_with('[');
            let base = t.trim_matches(|c| matches!(c, '[' | ']' | '{' | '}'));
            let here = format!(
                "{}{name}{}",
                if path.is_empty() {
                    String::new()
                } else {
                    format!("{path}.")
                },
                if list { "[]" } else { "" }
            );
            out.push((here.clone(), t.to_owned()));
            if !on_path.iter().any(|p| p == base) {
                on_path.push(base.to_owned());
                self.paths(base, &here, on_path, out);
                on_path.pop();
            }
        }
    }

    fn type_at(&self, path: &str) -> Option<String> {
        let mut out = Vec::new();
        self.paths("PodSpec", "", &mut vec!["PodSpec".to_owned()], &mut out);
        out.into_iter().find(|(p, _)| p == path).map(|(_, t)| t)
    }

    /// An object of type `ty` with every required property set (strings "v", numbers 0).
    fn minimal(&self, ty: &str) -> Value {
        let mut object = Map::new();
        let Some(props) = self.properties(ty) else {
            return Value::Object(object);
        };
        let required = self.types[ty]["required"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for r in required {
            let r = r.as_str().expect("a name");
            object.insert(
                r.to_owned(),
                self.value_of(props[r].as_str().expect("type")),
            );
        }
        Value::Object(object)
    }

    fn value_of(&self, t: &str) -> Value {
        match t {
            "string" => json!("v"),
            "integer" | "number" => json!(0),
            "boolean" => json!(false),
            t if t.starts_with('[') => json!([]),
            t if t.starts_with('{') => json!({}),
            t => self.minimal(t),
        }
    }

    /// A pod spec with `path` set to name object "x" (and key "k"), whatever it takes around it:
    /// required fields, and a container that mounts volume "v".
    fn naming(&self, path: &str) -> Value {
        let mut spec = json!({"containers": [{"name": "c", "image": "i",
            "volumeMounts": [{"name": "v", "mountPath": "/v"}]}]});
        let segments: Vec<&str> = path.split('.').collect();
        let mut ty = "PodSpec".to_owned();
        let mut at = &mut spec;
        for (i, segment) in segments.iter().enumerate() {
            let name = segment.trim_end_matches("[]");
            let t = self.properties(&ty).expect("an object type")[name]
                .as_str()
                .expect("type")
                .to_owned();
            let base = t.trim_matches(|c| matches!(c, '[' | ']')).to_owned();
            let last = i + 1 == segments.len();
            let value = if last {
                self.leaf(&base)
            } else {
                self.minimal(&base)
            };
            let object = at.as_object_mut().expect("an object");
            if segment.ends_with("[]") {
                let list = object.entry(name).or_insert_with(|| json!([]));
                let list = list.as_array_mut().expect("a list");
                if list.is_empty() {
                    list.push(value);
                }
                at = &mut list[0];
            } else {
                at = object.entry(name).or_insert(value);
            }
            ty = base;
        }
        spec
    }

    fn leaf(&self, ty: &str) -> Value {
        if ty == "string" {
            return json!("x");
        }
        let mut value = self.minimal(ty);
        if let (Some(props), Some(object)) = (self.properties(ty), value.as_object_mut()) {
            for (field, v) in [("name", "x"), ("secretName", "x"), ("key", "k")] {
                if props.contains_key(field) {
                    object.insert(field.to_owned(), json!(v));
                }
            }
        }
        value
    }
}

/// Whether a field names (or holds the name of) a ConfigMap or Secret: by its name or its type's.
fn may_name_config(field_path: &str, ty: &str) -> bool {
    let field = field_path
        .rsplit('.')
        .next()
        .unwrap_or(field_path)
        .to_lowercase();
    let base = ty.trim_matches(|c| matches!(c, '[' | ']' | '{' | '}'));
    field.contains("secret")
        || field.contains("configmap")
        || base.contains("Secret")
        || base.contains("ConfigMap")
}

#[test]
fn every_field_that_can_name_a_config_map_or_secret_is_decided() {
    let schema = Schema::load();
    let mut all = Vec::new();
    schema.paths("PodSpec", "", &mut vec!["PodSpec".to_owned()], &mut all);
    let found: BTreeSet<&str> = all
        .iter()
        .filter(|(p, t)| may_name_config(p, t))
        .map(|(p, _)| p.as_str())
        .collect();
    let decided: BTreeSet<&str> = REFERENCES
        .iter()
        .chain(HOLDERS)
        .copied()
        .chain(NOT_REFERENCES.iter().map(|(p, _)| *p))
        .collect();
    let undecided: Vec<_> = found.difference(&decided).collect();
    assert!(
        undecided.is_empty(),
        "fields of the 1.37 PodSpec that can name a ConfigMap or Secret, in neither list: {undecided:?}"
    );
    let gone: Vec<_> = decided.difference(&found).collect();
    assert!(gone.is_empty(), "listed but not in the schema: {gone:?}");
}

#[test]
fn the_fields_that_name_nothing_are_where_the_docs_say() {
    let schema = Schema::load();
    for path in NAMES_NONE {
        let ty = schema.type_at(path);
        assert!(ty.is_some(), "{path} is not in the 1.37 PodSpec");
        assert!(!may_name_config(path, &ty.unwrap()), "{path}");
    }
}

fn discovered(spec: Value) -> BTreeSet<ObjectRef> {
    let spec: PodSpec = serde_json::from_value(spec).expect("a pod spec");
    refs::discover(&spec, None)
        .iter()
        .map(|(r, _)| r.clone())
        .collect()
}

#[test]
fn each_reference_is_discovered_and_each_other_field_is_not() {
    let schema = Schema::load();
    for path in REFERENCES {
        let kind = if path.to_lowercase().contains("secret") {
            ObjectKind::Secret
        } else {
            ObjectKind::ConfigMap
        };
        let spec = schema.naming(path);
        assert_eq!(
            discovered(spec.clone()),
            BTreeSet::from([ObjectRef::new(kind, "x")]),
            "{path}: {spec}"
        );
    }
    for (path, _) in NOT_REFERENCES {
        let spec = schema.naming(path);
        assert_eq!(discovered(spec.clone()), BTreeSet::new(), "{path}: {spec}");
    }
}

#[test]
fn the_docs_name_every_field_that_is_not_a_reference() {
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/serve.md"))
        .expect("docs/serve.md");
    let fields = NOT_REFERENCES
        .iter()
        .map(|(p, _)| *p)
        .chain(NAMES_NONE.iter().copied())
        .map(|p| {
            // The field's own name, or its volume's for mount credentials.
            let parts: Vec<&str> = p.split('.').collect();
            match parts.as_slice() {
                ["ephemeralContainers[]", ..] => "ephemeralContainers".to_owned(),
                ["volumes[]", volume, ..] if !p.contains("sources") => volume.to_string(),
                _ => parts.last().unwrap().trim_end_matches("[]").to_owned(),
            }
        });
    for field in fields {
        assert!(
            docs.contains(&format!("`{field}`")),
            "docs/serve.md does not name `{field}`"
        );
    }
}

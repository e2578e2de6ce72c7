//! Builders for the objects and requests the tests make again and again, so that a test reads as
//! its scenario.
//!
//! - [`KEY`], [`key`]: the installation's HMAC key in tests (the e2e harness's too).
//! - [`namespace`], [`create_namespace`]: a Namespace with labels, and one created through a client.
//! - [`config_map`], [`secret`]: a named ConfigMap with text data, a Secret with bytes;
//!   [`Meta`] puts either in a namespace, at a resource version, or annotates it.
//! - [`create`], [`put`]: creates an object through a client; or replaces the one of that name.
//! - [`deployment`], [`workload`]: a [`Workload`] of any kind as JSON (`web` in `shop` by
//!   default), with the references its pod template makes.
//! - [`Review`]: an AdmissionReview body (CREATE, UPDATE or any operation) for an object.
//! - [`patch_of`], [`patched`]: the patch of a webhook's reply, and an object with it applied.
//! - [`stamp_of`], [`set_stamp`], [`marker_of`]: the stamp and the unstamped marker of a workload.
//! - [`expected_stamp`]: the stamp of a workload over its references as a client reads them now.

use std::fmt::Debug;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine;
use confighash::core::checksum::{self, ObjectView, Recipe, RefState, Stamp, StampKey};
use confighash::core::names::{
    CHECKSUM_ANNOTATION, EXTRA_CONFIGMAPS_ANNOTATION, EXTRA_SECRETS_ANNOTATION,
    UNSTAMPED_ANNOTATION,
};
use confighash::core::refs::{ObjectKind, ObjectRef};
use confighash::core::workload::{self, Analysis, WorkloadKind};
use k8s_openapi::ByteString;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, ObjectMeta, PostParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// The HMAC key of the installation in tests (32 bytes; `support::KEY` of the e2e harness too).
pub const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

/// [`KEY`] as a stamp key.
pub fn key() -> StampKey {
    StampKey::new(KEY.to_vec()).unwrap()
}

/// The namespace workloads are in unless a test says otherwise.
pub const NS: &str = "shop";

// ----- namespaces, ConfigMaps and Secrets -----

/// A Namespace with `labels`.
pub fn namespace(name: &str, labels: &[(&str, &str)]) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Creates Namespace `name` with `labels` through `client`.
pub async fn create_namespace(client: &kube::Client, name: &str, labels: &[(&str, &str)]) {
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace(name, labels))
        .await
        .expect("namespace created");
}

/// A ConfigMap `name` holding `data`.
pub fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..Default::default()
    }
}

/// A ConfigMap `name` holding `data` and `binary` (binaryData, when there is any).
pub fn binary_config_map(name: &str, data: &[(&str, &str)], binary: &[(&str, &[u8])]) -> ConfigMap {
    ConfigMap {
        binary_data: (!binary.is_empty()).then(|| {
            binary
                .iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
                .collect()
        }),
        ..config_map(name, data)
    }
}

/// A Secret `name` holding `data` (the decoded bytes).
pub fn secret(name: &str, data: &[(&str, &[u8])]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
                .collect(),
        ),
        ..Default::default()
    }
}

/// Metadata for any built object: `config_map("web", ..).in_namespace("shop").at_version("7")`.
pub trait Meta: kube::Resource + Sized {
    fn in_namespace(mut self, namespace: &str) -> Self {
        self.meta_mut().namespace = Some(namespace.to_owned());
        self
    }

    fn at_version(mut self, resource_version: &str) -> Self {
        self.meta_mut().resource_version = Some(resource_version.to_owned());
        self
    }

    fn annotated(mut self, key: &str, value: &str) -> Self {
        self.meta_mut()
            .annotations
            .get_or_insert_with(Default::default)
            .insert(key.to_owned(), value.to_owned());
        self
    }
}

impl<K: kube::Resource> Meta for K {}

/// Creates `object` in `namespace` through `client`.
pub async fn create<K>(client: &kube::Client, namespace: &str, object: K)
where
    K: kube::Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned,
{
    Api::<K>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
}

/// Creates `object` in `namespace` through `client`, or replaces the object of that name.
pub async fn put<K>(client: &kube::Client, namespace: &str, mut object: K)
where
    K: kube::Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let name = object.meta().name.clone().expect("a named object");
    match api.get_opt(&name).await.unwrap() {
        Some(old) => {
            object.meta_mut().resource_version = old.meta().resource_version.clone();
            api.replace(&name, &PostParams::default(), &object)
                .await
                .unwrap();
        }
        None => {
            api.create(&PostParams::default(), &object).await.unwrap();
        }
    }
}

// ----- workloads -----

/// A workload as JSON, built up by what its pod template references.
#[derive(Debug, Clone)]
pub struct Workload {
    kind: WorkloadKind,
    object: Value,
}

/// A Deployment `name` in [`NS`] with one container that references nothing yet.
pub fn deployment(name: &str) -> Workload {
    workload(WorkloadKind::DEPLOYMENT, name)
}

/// A workload of `kind` named `name` in [`NS`], with one container (`app`, `example/app:1`)
/// that references nothing yet; the pod template is labelled `app: <name>`.
pub fn workload(kind: WorkloadKind, name: &str) -> Workload {
    let mut pod = json!({"containers": [{"name": "app", "image": "example/app:1"}]});
    if kind == WorkloadKind::CRON_JOB {
        pod["restartPolicy"] = json!("OnFailure");
    }
    let template = json!({"metadata": {"labels": {"app": name}}, "spec": pod});
    let selector = json!({"matchLabels": {"app": name}});
    let (api_version, spec) = match kind {
        WorkloadKind::CRON_JOB => (
            "batch/v1",
            json!({"schedule": "*/5 * * * *", "jobTemplate": {"spec": {"template": template}}}),
        ),
        WorkloadKind::ROLLOUT => (
            "argoproj.io/v1alpha1",
            json!({"selector": selector, "template": template, "strategy": {"canary": {}}}),
        ),
        WorkloadKind::STATEFUL_SET => (
            "apps/v1",
            json!({"serviceName": name, "selector": selector, "template": template}),
        ),
        _ => (
            "apps/v1",
            json!({"selector": selector, "template": template}),
        ),
    };
    Workload {
        kind,
        object: json!({
            "apiVersion": api_version,
            "kind": kind.kind(),
            "metadata": {"name": name, "namespace": NS},
            "spec": spec
        }),
    }
}

impl Workload {
    pub fn kind(&self) -> WorkloadKind {
        self.kind
    }

    /// The object.
    pub fn json(&self) -> Value {
        self.object.clone()
    }

    /// The object as a typed one (a k8s-openapi `Deployment`, ...).
    pub fn typed<T: DeserializeOwned>(&self) -> T {
        serde_json::from_value(self.json()).expect("the workload's type")
    }

    pub fn in_namespace(mut self, namespace: &str) -> Self {
        self.object["metadata"]["namespace"] = json!(namespace);
        self
    }

    /// No namespace: the API server puts it in the one it is created in.
    pub fn without_namespace(mut self) -> Self {
        self.metadata().remove("namespace");
        self
    }

    /// Sets `metadata.<field>` (resourceVersion, uid, ...).
    pub fn meta(mut self, field: &str, value: Value) -> Self {
        self.metadata().insert(field.to_owned(), value);
        self
    }

    /// The workload's labels (not the pod template's), `null` included.
    pub fn labels(self, labels: Value) -> Self {
        self.meta("labels", labels)
    }

    /// One annotation on the workload (not on the pod template).
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        let annotations = self
            .metadata()
            .entry("annotations")
            .or_insert_with(|| json!({}));
        annotations[key] = json!(value);
        self
    }

    /// Names more ConfigMaps in the extra-reference annotation.
    pub fn extra_config_maps(self, names: &[impl AsRef<str>]) -> Self {
        let names: Vec<&str> = names.iter().map(AsRef::as_ref).collect();
        self.annotation(EXTRA_CONFIGMAPS_ANNOTATION, &names.join(","))
    }

    /// Names more Secrets in the extra-reference annotation.
    pub fn extra_secrets(self, names: &[impl AsRef<str>]) -> Self {
        let names: Vec<&str> = names.iter().map(AsRef::as_ref).collect();
        self.annotation(EXTRA_SECRETS_ANNOTATION, &names.join(","))
    }

    /// Sets `spec.<field>` (replicas, paused, workloadRef, ...).
    pub fn spec(mut self, field: &str, value: Value) -> Self {
        self.object["spec"][field] = value;
        self
    }

    /// The pod template's metadata, replaced (`null` included).
    pub fn template_metadata(mut self, metadata: Value) -> Self {
        self.template()["metadata"] = metadata;
        self
    }

    /// The pod template's annotations, replaced.
    pub fn template_annotations(mut self, annotations: Value) -> Self {
        self.template()["metadata"]["annotations"] = annotations;
        self
    }

    /// The pod spec, replaced.
    pub fn pod_spec(mut self, spec: Value) -> Self {
        self.template()["spec"] = spec;
        self
    }

    /// The image of the first container.
    pub fn image(mut self, image: &str) -> Self {
        self.container()["image"] = json!(image);
        self
    }

    /// The first container takes every key of ConfigMap `name` as environment variables.
    pub fn env_from_config_map(self, name: &str) -> Self {
        self.push_container("envFrom", json!({"configMapRef": {"name": name}}))
    }

    /// [`Workload::env_from_config_map`], optional: the ConfigMap may be absent.
    pub fn env_from_optional_config_map(self, name: &str) -> Self {
        self.push_container(
            "envFrom",
            json!({"configMapRef": {"name": name, "optional": true}}),
        )
    }

    /// The first container takes every key of Secret `name` as environment variables.
    pub fn env_from_secret(self, name: &str) -> Self {
        self.push_container("envFrom", json!({"secretRef": {"name": name}}))
    }

    /// Variable `var` of the first container is key `key` of ConfigMap `name`.
    pub fn config_map_key(self, var: &str, name: &str, key: &str) -> Self {
        self.push_container(
            "env",
            json!({"name": var, "valueFrom": {"configMapKeyRef": {"name": name, "key": key}}}),
        )
    }

    /// Variable `var` of the first container is key `key` of Secret `name`.
    pub fn secret_key(self, var: &str, name: &str, key: &str) -> Self {
        self.push_container(
            "env",
            json!({"name": var, "valueFrom": {"secretKeyRef": {"name": name, "key": key}}}),
        )
    }

    /// Volume `volume` holds ConfigMap `name` (only `items` of it if any are given) and the
    /// first container mounts it at `/etc/<volume>`.
    pub fn config_map_volume(mut self, volume: &str, name: &str, items: &[&str]) -> Self {
        let mut source = json!({"name": name});
        if !items.is_empty() {
            source["items"] = items.iter().map(|k| json!({"key": k, "path": k})).collect();
        }
        let pod = &mut self.template()["spec"];
        match pod["volumes"].as_array_mut() {
            Some(volumes) => volumes.push(json!({"name": volume, "configMap": source})),
            None => pod["volumes"] = json!([{"name": volume, "configMap": source}]),
        }
        self.push_container(
            "volumeMounts",
            json!({"name": volume, "mountPath": format!("/etc/{volume}")}),
        )
    }

    fn metadata(&mut self) -> &mut serde_json::Map<String, Value> {
        self.object["metadata"].as_object_mut().expect("metadata")
    }

    fn template(&mut self) -> &mut Value {
        let path = format!("/{}", self.kind.template_path().join("/"));
        self.object.pointer_mut(&path).expect("a pod template")
    }

    fn container(&mut self) -> &mut Value {
        &mut self.template()["spec"]["containers"][0]
    }

    fn push_container(mut self, list: &str, item: Value) -> Self {
        let container = self.container();
        match container[list].as_array_mut() {
            Some(items) => items.push(item),
            None => container[list] = json!([item]),
        }
        self
    }
}

impl From<Workload> for Value {
    fn from(workload: Workload) -> Value {
        workload.object
    }
}

// ----- AdmissionReviews -----

/// An AdmissionReview body as the API server sends it: the request's kind and resource come
/// from the object's `apiVersion` and `kind`, its namespace and name from the object's metadata,
/// and every review gets a new uid. Derefs to the JSON, so a test can edit it.
#[derive(Debug, Clone)]
pub struct Review(Value);

impl Review {
    /// A CREATE of `object`.
    pub fn create(object: &Value) -> Review {
        Review::of("CREATE", object, None)
    }

    /// An UPDATE from `old` to `object`.
    pub fn update(object: &Value, old: &Value) -> Review {
        Review::of("UPDATE", object, Some(old))
    }

    /// `operation` on `object`, with `old` as the stored object if any.
    pub fn of(operation: &str, object: &Value, old: Option<&Value>) -> Review {
        static UID: AtomicU64 = AtomicU64::new(1);
        let uid = UID.fetch_add(1, Ordering::SeqCst);
        let api_version = object["apiVersion"].as_str().unwrap_or("apps/v1");
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let kind = object["kind"].as_str().unwrap_or("Deployment");
        Review(json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": format!("00000000-0000-0000-0000-{uid:012}"),
                "kind": {"group": group, "version": version, "kind": kind},
                "resource": {"group": group, "version": version,
                             "resource": format!("{}s", kind.to_lowercase())},
                "name": object["metadata"]["name"],
                "namespace": object["metadata"]["namespace"],
                "operation": operation,
                "userInfo": {"username": "kubernetes-admin"},
                "object": object,
                "oldObject": old.cloned().unwrap_or(Value::Null),
                "dryRun": false
            }
        }))
    }

    /// The same review with request uid `uid`.
    pub fn uid(mut self, uid: &str) -> Review {
        self.0["request"]["uid"] = json!(uid);
        self
    }

    /// The body as sent.
    pub fn bytes(&self) -> Vec<u8> {
        self.0.to_string().into_bytes()
    }

    pub fn json(self) -> Value {
        self.0
    }
}

impl Deref for Review {
    type Target = Value;

    fn deref(&self) -> &Value {
        &self.0
    }
}

impl DerefMut for Review {
    fn deref_mut(&mut self) -> &mut Value {
        &mut self.0
    }
}

/// The decoded JSONPatch of an AdmissionReview `reply`, if it has one.
pub fn patch_of(reply: &Value) -> Option<Vec<u8>> {
    let encoded = reply["response"]["patch"].as_str()?;
    Some(
        base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .expect("a base64 patch"),
    )
}

/// `object` with the patch of `reply` applied (unchanged if it has none).
pub fn patched(object: &Value, reply: &Value) -> Value {
    let mut object = object.clone();
    if let Some(bytes) = patch_of(reply) {
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).expect("a JSONPatch");
        json_patch::patch(&mut object, &patch).expect("the patch applies");
    }
    object
}

// ----- stamps -----

/// The workload kind of `object`, from its `apiVersion` and `kind`.
pub fn kind_of(object: &Value) -> WorkloadKind {
    confighash::core::workload::Kinds::built_in()
        .from_type(
            object["apiVersion"].as_str().unwrap_or_default(),
            object["kind"].as_str().unwrap_or_default(),
        )
        .unwrap_or_else(|| panic!("not a workload: {object}"))
}

/// The stamp on the pod template of a workload.
pub fn stamp_of(object: &Value) -> Option<String> {
    workload::template(kind_of(object), object)
        .ok()??
        .pointer("/metadata/annotations")?
        .get(CHECKSUM_ANNOTATION)?
        .as_str()
        .map(str::to_owned)
}

/// Puts `stamp` on the pod template of a workload that has annotations, or removes it.
pub fn set_stamp(object: &mut Value, stamp: Option<&str>) {
    let path = format!(
        "/{}/metadata/annotations",
        kind_of(object).template_path().join("/")
    );
    let annotations = object
        .pointer_mut(&path)
        .and_then(Value::as_object_mut)
        .expect("pod template annotations");
    match stamp {
        Some(s) => {
            annotations.insert(CHECKSUM_ANNOTATION.into(), json!(s));
        }
        None => {
            annotations.remove(CHECKSUM_ANNOTATION);
        }
    }
}

/// Why a workload is unstamped (its marker annotation), if it says.
pub fn marker_of(object: &Value) -> Option<String> {
    object["metadata"]["annotations"][UNSTAMPED_ANNOTATION]
        .as_str()
        .map(str::to_owned)
}

/// The stamp of `object`, a workload in `namespace`, under `recipe` with `key`, over its
/// references as `client` reads them now (objects annotated to be ignored left out).
pub async fn expected_stamp(
    client: &kube::Client,
    key: &StampKey,
    recipe: Recipe,
    namespace: &str,
    object: &Value,
) -> Stamp {
    let Analysis::Workload(info) = workload::analyze(kind_of(object), object).unwrap() else {
        panic!("not a workload: {object}")
    };
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let mut stored_config_maps = Vec::new();
    let mut stored_secrets = Vec::new();
    for (r, _) in info.refs.iter() {
        match r.kind {
            ObjectKind::ConfigMap => {
                if let Some(cm) = config_maps.get_opt(&r.name).await.unwrap() {
                    stored_config_maps.push((r.clone(), cm));
                }
            }
            ObjectKind::Secret => {
                if let Some(s) = secrets.get_opt(&r.name).await.unwrap() {
                    stored_secrets.push((r.clone(), s));
                }
            }
        }
    }
    let views: Vec<(ObjectRef, bool, ObjectView<'_>)> = stored_config_maps
        .iter()
        .map(|(r, cm)| {
            (
                r.clone(),
                checksum::is_ignored(cm.metadata.annotations.as_ref()),
                ObjectView::config_map(cm).unwrap(),
            )
        })
        .chain(stored_secrets.iter().map(|(r, s)| {
            (
                r.clone(),
                checksum::is_ignored(s.metadata.annotations.as_ref()),
                ObjectView::secret(s),
            )
        }))
        .collect();
    let state = |r: &ObjectRef| match views.iter().find(|(v, _, _)| v == r) {
        Some((_, true, _)) => RefState::Ignored,
        Some((_, false, view)) => RefState::Present(view),
        None => RefState::Absent,
    };
    match recipe {
        Recipe::V1 => checksum::compute_stamp_v1(Some(key), &info.refs, state),
        Recipe::V2 => checksum::compute_stamp(Some(key), namespace, &info.refs, state),
    }
}

//! The invariants the fuzz targets check, and what they need to check them: a `ObjectSource`
//! that answers from memory, a webhook built on it, and a reference model of discovery.
//!
//! A crate of its own so that both the fuzz targets (`fuzz/`) and `cargo test`
//! (`tests/core/fuzz_regressions.rs`) depend on it: the tests replay the seeds (and every crash
//! input kept as a regression) through exactly the checks the targets make.

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use axum::response::IntoResponse;
use base64::Engine;
use confighash::certs::key::KeyStore;
use confighash::core::checksum::{self, ObjectDigest, Recipe, RefState, StampKey, Tag};
use confighash::core::names::{CHECKSUM_ANNOTATION, UNSTAMPED_ANNOTATION, UNSTAMPED_LOOKUP_FAILED};
use confighash::core::refs::{self, ObjectKind, ObjectRef, References, Selection};
use confighash::core::workload::{self, Analysis, Kinds, WorkloadKind};
use confighash::metrics::Metrics;
use confighash::offline::{self, InputError, Source};
use confighash::webhook::admission::{BadRequest, Webhook};
use confighash::webhook::budget::MemoryBudget;
use confighash::webhook::lookup::{Fetched, ObjectSource, ReadError};
use futures::future::BoxFuture;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Container, KeyToPath, PodSpec, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;
use tokio::runtime::Runtime;

/// The webhook's HMAC key.
pub const KEY: &[u8] = b"fuzz-key-0123456789abcdef";

// ---------------------------------------------------------------------------------------------
// Admission reviews
// ---------------------------------------------------------------------------------------------

/// Answers every read from the object's name alone, without I/O, so that a fuzzer can reach
/// every lookup outcome by naming objects:
/// a name containing `absent` does not exist, `fail` fails the read, `dup` is a ConfigMap with
/// one key in both `data` and `binaryData` (a recipe error), `ignored` carries
/// `confighash.dev/ignore: "true"`; any other name exists with two keys.
pub struct NameSource;

impl NameSource {
    fn object(kind: ObjectKind, name: &str) -> Result<Option<Fetched>, ReadError> {
        if name.contains("fail") {
            return Err(ReadError::Refused("injected read failure"));
        }
        if name.contains("absent") {
            return Ok(None);
        }
        let metadata = ObjectMeta {
            name: Some(name.to_owned()),
            annotations: name.contains("ignored").then(|| {
                BTreeMap::from([(
                    confighash::core::names::IGNORE_ANNOTATION.to_owned(),
                    "true".to_owned(),
                )])
            }),
            ..ObjectMeta::default()
        };
        let entries = [("k", name.to_owned()), ("v", "1".to_owned())];
        Ok(Some(match kind {
            ObjectKind::ConfigMap => Fetched::ConfigMap(ConfigMap {
                metadata,
                data: Some(
                    entries
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), v.clone()))
                        .collect(),
                ),
                binary_data: name
                    .contains("dup")
                    .then(|| BTreeMap::from([("k".to_owned(), ByteString(b"b".to_vec()))])),
                ..ConfigMap::default()
            }),
            ObjectKind::Secret => Fetched::Secret(Secret {
                metadata,
                data: Some(
                    entries
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), ByteString(v.clone().into_bytes())))
                        .collect(),
                ),
                ..Secret::default()
            }),
        }))
    }
}

impl ObjectSource for NameSource {
    fn fetch<'a>(
        &'a self,
        _namespace: &'a str,
        object: &'a ObjectRef,
        _budget: &'a MemoryBudget,
    ) -> BoxFuture<'a, Result<Option<Fetched>, ReadError>> {
        Box::pin(futures::future::ready(Self::object(
            object.kind,
            &object.name,
        )))
    }
}

/// The runtime the webhook's async answer is driven on: one thread, no I/O.
pub fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread tokio runtime")
}

/// A webhook that reads from [`NameSource`]. Every read is a ready future, so the deadline
/// never passes; it only has to be set.
pub fn webhook() -> Webhook {
    Webhook::new(
        Arc::new(NameSource),
        Arc::new(KeyStore::new(
            StampKey::new(KEY.to_vec()).expect("a long enough key"),
        )),
        Arc::new(Metrics::new()),
    )
    .with_lookup_deadline(Duration::from_secs(30))
}

/// Feeds one request body to the webhook as the HTTP server would and checks the answer.
pub fn check_admission(rt: &Runtime, webhook: &Webhook, body: &[u8]) {
    match rt.block_on(webhook.answer(body)) {
        Ok(review) => check_review(rt, webhook, body, &review),
        Err(bad) => check_bad_request(rt, bad),
    }
}

/// A refused body becomes a 400 whose body is a JSON object with a string `error`.
fn check_bad_request(rt: &Runtime, bad: BadRequest) {
    let response = bad.into_response();
    assert_eq!(response.status(), 400, "a refused review must be a 400");
    let bytes = rt
        .block_on(axum::body::to_bytes(response.into_body(), usize::MAX))
        .expect("the error body");
    let body: Value = serde_json::from_slice(&bytes).expect("the error body is JSON");
    assert!(
        body.get("error").is_some_and(Value::is_string),
        "the error body names the error: {body}"
    );
}

/// The paths (JSON pointers) the webhook may write: the workload's unstamped marker and the
/// pod template's checksum annotation.
fn writable_paths(kind: WorkloadKind) -> [String; 2] {
    let pointer = |tokens: &[&str]| {
        tokens
            .iter()
            .map(|t| format!("/{}", t.replace('~', "~0").replace('/', "~1")))
            .collect::<String>()
    };
    let mut template: Vec<&str> = kind.template_path().to_vec();
    template.extend(["metadata", "annotations", CHECKSUM_ANNOTATION]);
    [
        pointer(&["metadata", "annotations", UNSTAMPED_ANNOTATION]),
        pointer(&template),
    ]
}

fn check_review(rt: &Runtime, webhook: &Webhook, body: &[u8], review: &Value) {
    let text = serde_json::to_vec(review).expect("a review serializes");
    let reparsed: Value = serde_json::from_slice(&text).expect("the review is JSON");
    assert_eq!(&reparsed, review, "the review survives a JSON round trip");
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(review["kind"], "AdmissionReview");
    let response = review["response"]
        .as_object()
        .expect("the review has a response");
    for key in response.keys() {
        assert!(
            ["uid", "allowed", "patchType", "patch"].contains(&key.as_str()),
            "unexpected response field {key}"
        );
    }
    assert_eq!(
        response["allowed"], true,
        "confighash never blocks a review"
    );
    let uid = response["uid"].as_str().expect("a string uid");
    assert!(!uid.is_empty());

    // The body parsed as a review; as a plain JSON value it parses too, except where serde's
    // skipping of unknown fields accepts what a `Value` refuses (numbers out of range).
    let Ok(input) = serde_json::from_slice::<Value>(body) else {
        return;
    };
    let request = &input["request"];
    assert_eq!(request["uid"].as_str(), Some(uid), "the uid is echoed");

    let Some(patch) = response.get("patch") else {
        assert!(response.get("patchType").is_none());
        return;
    };
    assert_eq!(response["patchType"], "JSONPatch");
    let operation = request["operation"].as_str().unwrap_or_default();
    assert!(
        operation == "CREATE" || operation == "UPDATE",
        "a {operation:?} review was patched"
    );
    let kind = WorkloadKind::built_in(
        request["kind"]["group"].as_str().unwrap_or_default(),
        request["kind"]["kind"].as_str().unwrap_or_default(),
    )
    .expect("only workload kinds are patched");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch.as_str().expect("a base64 string"))
        .expect("the patch is base64");
    let ops: Value = serde_json::from_slice(&bytes).expect("the patch is JSON");
    let parsed: json_patch::Patch =
        serde_json::from_value(ops.clone()).expect("the patch is a JSONPatch");
    assert!(!parsed.0.is_empty(), "an empty patch is sent as none");

    // Every operation writes one of the two annotations or creates a parent map of one.
    let writable = writable_paths(kind);
    let old = request.get("oldObject").filter(|o| o.is_object());
    let old_stamp = old.and_then(|o| workload::stamp_and_marker(kind, o).0);
    for op in ops.as_array().expect("a JSONPatch is an array") {
        let path = op["path"].as_str().expect("a path");
        assert!(
            writable
                .iter()
                .any(|w| w == path || w.starts_with(&format!("{path}/"))),
            "the patch writes {path}"
        );
        match (op["op"].as_str(), writable.iter().position(|w| w == path)) {
            (Some("add"), None) => assert_eq!(op["value"], serde_json::json!({})),
            (Some("add"), Some(0)) => assert_eq!(op["value"], UNSTAMPED_LOOKUP_FAILED),
            (Some("add"), Some(_)) => {
                let stamp = op["value"].as_str().expect("a string stamp");
                let key_id = webhook.keys().current().id().to_owned();
                // Only the current recipe is ever written; an older one only by keeping it.
                assert!(
                    Recipe::of_stamp(stamp, &key_id) == Some(Recipe::CURRENT)
                        || Some(stamp) == old_stamp,
                    "the patch sets {stamp:?}, neither a current stamp nor the old one"
                );
            }
            (Some("remove"), Some(_)) => {}
            other => panic!("unexpected operation {other:?}: {op}"),
        }
    }

    let mut patched = request["object"].clone();
    json_patch::patch(&mut patched, &parsed).expect("the patch applies to the object");

    // Answering again with the patched object changes nothing more.
    let mut again = input.clone();
    again["request"]["object"] = patched;
    let again_body = serde_json::to_vec(&again).expect("JSON");
    let second = rt
        .block_on(webhook.answer(&again_body))
        .expect("the patched review is still a review");
    assert!(
        second["response"].get("patch").is_none(),
        "a second answer patches again: {}",
        second["response"]
    );
}

// ---------------------------------------------------------------------------------------------
// Reference discovery
// ---------------------------------------------------------------------------------------------

/// A discovery input as the `discovery` target reads it from JSON: either a bare pod spec, or
/// `{"spec": <pod spec>, "annotations": {<workload metadata annotations>}}`.
pub fn discovery_input(bytes: &[u8]) -> Option<(PodSpec, Option<BTreeMap<String, String>>)> {
    let value: Value = serde_json::from_slice(bytes).ok()?;
    let (spec, annotations) = match value.get("spec") {
        Some(spec) => (spec, value.get("annotations")),
        None => (&value, None),
    };
    let spec: PodSpec = serde_json::from_value(spec.clone()).ok()?;
    let annotations = match annotations {
        None | Some(Value::Null) => None,
        Some(a) => Some(serde_json::from_value(a.clone()).ok()?),
    };
    Some((spec, annotations))
}

/// One mention of an object in a pod spec or annotation: `None` keys mean the whole object.
struct Mention<'a> {
    kind: ObjectKind,
    name: &'a str,
    keys: Option<BTreeSet<String>>,
    optional: bool,
}

/// The README's "Workloads and references", written as plainly as possible: list every mention,
/// then fold the mentions of each object.
fn model(spec: &PodSpec, annotations: Option<&BTreeMap<String, String>>) -> References {
    let mut mentions = Vec::new();
    let containers: Vec<&Container> = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .collect();
    let one = |k: &str| Some(BTreeSet::from([k.to_owned()]));
    for c in &containers {
        for env in c.env.iter().flatten() {
            let Some(from) = &env.value_from else {
                continue;
            };
            if let Some(r) = &from.config_map_key_ref {
                let (name, optional) = (r.name.as_str(), r.optional == Some(true));
                let (kind, keys) = (ObjectKind::ConfigMap, one(&r.key));
                mentions.push(Mention {
                    kind,
                    name,
                    keys,
                    optional,
                });
            }
            if let Some(r) = &from.secret_key_ref {
                let (name, optional) = (r.name.as_str(), r.optional == Some(true));
                let (kind, keys) = (ObjectKind::Secret, one(&r.key));
                mentions.push(Mention {
                    kind,
                    name,
                    keys,
                    optional,
                });
            }
        }
        for from in c.env_from.iter().flatten() {
            if let Some(r) = &from.config_map_ref {
                mentions.push(Mention {
                    kind: ObjectKind::ConfigMap,
                    name: &r.name,
                    keys: None,
                    optional: r.optional == Some(true),
                });
            }
            if let Some(r) = &from.secret_ref {
                mentions.push(Mention {
                    kind: ObjectKind::Secret,
                    name: &r.name,
                    keys: None,
                    optional: r.optional == Some(true),
                });
            }
        }
    }
    let mounted = |volume: &str| {
        containers
            .iter()
            .any(|c| c.volume_mounts.iter().flatten().any(|m| m.name == volume))
    };
    let keys = |items: &Option<Vec<KeyToPath>>| match items {
        Some(items) if !items.is_empty() => Some(items.iter().map(|i| i.key.clone()).collect()),
        _ => None,
    };
    for v in spec.volumes.iter().flatten().filter(|v| mounted(&v.name)) {
        if let Some(cm) = &v.config_map {
            mentions.push(Mention {
                kind: ObjectKind::ConfigMap,
                name: &cm.name,
                keys: keys(&cm.items),
                optional: cm.optional == Some(true),
            });
        }
        if let Some(s) = &v.secret
            && let Some(name) = &s.secret_name
        {
            mentions.push(Mention {
                kind: ObjectKind::Secret,
                name,
                keys: keys(&s.items),
                optional: s.optional == Some(true),
            });
        }
        let sources = v.projected.iter().flat_map(|p| p.sources.iter().flatten());
        for source in sources {
            if let Some(cm) = &source.config_map {
                mentions.push(Mention {
                    kind: ObjectKind::ConfigMap,
                    name: &cm.name,
                    keys: keys(&cm.items),
                    optional: cm.optional == Some(true),
                });
            }
            if let Some(s) = &source.secret {
                mentions.push(Mention {
                    kind: ObjectKind::Secret,
                    name: &s.name,
                    keys: keys(&s.items),
                    optional: s.optional == Some(true),
                });
            }
        }
    }
    for (annotation, kind) in [
        (
            confighash::core::names::EXTRA_CONFIGMAPS_ANNOTATION,
            ObjectKind::ConfigMap,
        ),
        (
            confighash::core::names::EXTRA_SECRETS_ANNOTATION,
            ObjectKind::Secret,
        ),
    ] {
        let value = annotations.and_then(|a| a.get(annotation));
        for name in value.into_iter().flat_map(|v| v.split(',')).map(str::trim) {
            if refs::is_object_name(name) {
                mentions.push(Mention {
                    kind,
                    name,
                    keys: None,
                    optional: false,
                });
            }
        }
    }

    let mut objects: BTreeMap<ObjectRef, Vec<&Mention<'_>>> = BTreeMap::new();
    // Names that are not object names are no references (they name nothing that can exist).
    for m in mentions.iter().filter(|m| refs::is_object_name(m.name)) {
        objects
            .entry(ObjectRef::new(m.kind, m.name))
            .or_default()
            .push(m);
    }
    let mut model = References::default();
    for (object, ms) in objects {
        let selection = if ms.iter().any(|m| m.keys.is_none()) {
            Selection::Whole
        } else {
            Selection::Keys(
                ms.iter()
                    .flat_map(|m| m.keys.iter().flatten())
                    .cloned()
                    .collect(),
            )
        };
        let optional = ms.iter().all(|m| m.optional);
        model.add(object.kind, &object.name, selection, optional);
    }
    model
}

/// The names the extra-reference annotations give that are not object names, each once per
/// kind, ConfigMaps first, in the order written.
fn model_rejected(annotations: Option<&BTreeMap<String, String>>) -> Vec<ObjectRef> {
    let mut rejected: Vec<ObjectRef> = Vec::new();
    for (annotation, kind) in [
        (
            confighash::core::names::EXTRA_CONFIGMAPS_ANNOTATION,
            ObjectKind::ConfigMap,
        ),
        (
            confighash::core::names::EXTRA_SECRETS_ANNOTATION,
            ObjectKind::Secret,
        ),
    ] {
        let value = annotations.and_then(|a| a.get(annotation));
        for name in value.into_iter().flat_map(|v| v.split(',')).map(str::trim) {
            let r = ObjectRef::new(kind, name);
            if !name.is_empty() && !refs::is_object_name(name) && !rejected.contains(&r) {
                rejected.push(r);
            }
        }
    }
    rejected
}

/// What a pod spec's references are, checked against the model and for determinism, order
/// independence and a stamp that can always be computed.
pub fn check_discovery(spec: &PodSpec, annotations: Option<&BTreeMap<String, String>>) {
    let found = refs::discover(spec, annotations);
    assert_eq!(
        found,
        refs::discover(spec, annotations),
        "discovery is deterministic"
    );

    let expected = model(spec, annotations);
    let listed = |r: &References| {
        r.iter()
            .map(|(o, s)| (o.clone(), s.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        listed(&found),
        listed(&expected),
        "discovery differs from the model"
    );
    assert_eq!(found.len(), expected.len());
    assert_eq!(found.is_empty(), expected.is_empty());
    assert_eq!(
        found.rejected(),
        model_rejected(annotations).as_slice(),
        "rejected names differ from the model"
    );

    for (object, spec) in found.iter() {
        assert!(!object.name.is_empty(), "an empty name is not a reference");
        assert_eq!(found.get(object), Some(spec));
        if let Selection::Keys(keys) = &spec.selection {
            assert!(!keys.is_empty(), "{object} selects no key at all");
        }
    }
    for r in found.rejected() {
        assert!(!r.name.is_empty() && r.name.trim() == r.name);
        assert!(!refs::is_object_name(&r.name));
    }

    // The order of containers and volumes does not matter.
    let mut reordered = spec.clone();
    if let Some(init) = reordered.init_containers.as_mut() {
        init.reverse();
    }
    reordered.containers.reverse();
    if let Some(volumes) = reordered.volumes.as_mut() {
        volumes.reverse();
    }
    assert_eq!(
        refs::discover(&reordered, annotations),
        found,
        "the order of containers or volumes changed the references"
    );

    check_stamps(&found);
}

/// Computes stamps over `refs` with every kind of object state; they are always well formed.
fn check_stamps(found: &References) {
    // Present objects hold their selected keys but the last, and a key of their own.
    let digests: BTreeMap<&ObjectRef, ObjectDigest> = found
        .iter()
        .map(|(object, spec)| {
            let mut keys: Vec<String> = match &spec.selection {
                Selection::Whole => vec![],
                Selection::Keys(keys) => keys.iter().cloned().collect(),
            };
            keys.pop();
            keys.push(format!("own-{}", object.name));
            let entries = keys.into_iter().map(|k| {
                let digest = [k.len() as u8; 32];
                (k, Tag::Data, digest)
            });
            (object, ObjectDigest::from_digests(entries))
        })
        .collect();
    let state = |object: &ObjectRef| match object.name.len() % 3 {
        0 => RefState::Absent,
        1 => RefState::Ignored,
        _ => RefState::Present(&digests[object]),
    };
    let key = StampKey::new(KEY.to_vec()).expect("a long enough key");
    for key in [None, Some(&key)] {
        let id = checksum::key_id(key);
        let stamp = checksum::compute_stamp(key, "fuzz", found, state);
        assert_eq!(
            Recipe::of_stamp(stamp.as_str(), id),
            Some(Recipe::V2),
            "malformed stamp {stamp}"
        );
        assert_eq!(stamp, checksum::compute_stamp(key, "fuzz", found, state));
        assert_ne!(stamp, checksum::compute_stamp(key, "fuzz2", found, state));
        let v1 = checksum::compute_stamp_v1(key, found, state);
        assert_eq!(
            Recipe::of_stamp(v1.as_str(), id),
            Some(Recipe::V1),
            "malformed v1 stamp {v1}"
        );
    }
}

/// The names in `refs` that are not ConfigMap or Secret names (DNS-1123 subdomains).
pub fn invalid_names(found: &References) -> Vec<&ObjectRef> {
    found
        .iter()
        .map(|(o, _)| o)
        .filter(|o| !refs::is_object_name(&o.name))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// `confighash stamp`
// ---------------------------------------------------------------------------------------------

/// The sources a `stamp_yaml` input stands for: NUL bytes separate files; `None` when a file is
/// not UTF-8 (the command refuses those before stamping).
pub fn stamp_sources(bytes: &[u8]) -> Option<Vec<Source>> {
    bytes
        .split(|b| *b == 0)
        .take(4)
        .enumerate()
        .map(|(i, part)| {
            Some(Source {
                name: format!("input-{i}.yaml"),
                text: String::from_utf8(part.to_vec()).ok()?,
            })
        })
        .collect()
}

fn stamp_options(explain: bool) -> offline::Options {
    offline::Options {
        namespace: Some("default".to_owned()),
        key: None,
        explain,
        ..Default::default()
    }
}

/// Runs `stamp` (and `stamp --explain`) over `sources`. Errors are values that point into the
/// input; a stamped output stamps to itself and means what the input meant, apart from stamps.
pub fn check_stamp_yaml(sources: &[Source]) {
    let stamped = offline::run(sources, &stamp_options(false));
    let explained = offline::run(sources, &stamp_options(true));
    if let Err(e) = &explained {
        check_input_error(sources, e);
    }
    // Without --namespace: an error that points into the input (a document that needs a
    // namespace names none), or, when no document needed one, the same output.
    let without_namespace = offline::run(
        sources,
        &offline::Options {
            namespace: None,
            ..stamp_options(false)
        },
    );
    match (&without_namespace, &stamped) {
        (Err(e), _) => check_input_error(sources, e),
        (Ok(out), Ok(with)) => assert_eq!(out, with, "--namespace changed a run that needs none"),
        (Ok(_), Err(e)) => panic!("only --namespace made the run fail: {e}"),
    }
    let out = match stamped {
        Ok(out) => out,
        Err(e) => {
            check_input_error(sources, &e);
            return;
        }
    };
    assert!(
        explained.is_ok(),
        "explain failed where stamping did not: {explained:?}"
    );

    let again = offline::run(
        &[Source {
            name: "stamped.yaml".to_owned(),
            text: out.text.clone(),
        }],
        &stamp_options(false),
    )
    .unwrap_or_else(|e| panic!("the stamped output does not stamp again: {e}"));
    assert_eq!(again.text, out.text, "stamping the output changed it");

    // Read as YAML streams, the output is the input plus stamps.
    let mut before = Vec::new();
    for source in sources {
        match serde_saphyr::from_multiple::<Value>(&source.text) {
            Ok(docs) => before.extend(docs),
            // The stream reader refuses what the command's per-document reading accepts.
            Err(_) => return,
        }
    }
    let after = serde_saphyr::from_multiple::<Value>(&out.text)
        .unwrap_or_else(|e| panic!("the output is not a YAML stream: {e}\n{}", out.text));
    let meaning = |docs: Vec<Value>| -> Vec<Value> {
        docs.into_iter()
            .filter(|d| !d.is_null())
            .map(without_stamps)
            .collect()
    };
    let after_stamps: Vec<Value> = after.iter().filter(|d| !d.is_null()).cloned().collect();
    assert_eq!(
        meaning(before),
        meaning(after),
        "stamping changed more than stamps"
    );
    for doc in &after_stamps {
        check_stamped(doc);
    }
}

/// An error names one of the sources, a document and a line that exist.
fn check_input_error(sources: &[Source], e: &InputError) {
    let source = sources
        .iter()
        .find(|s| s.name == e.source_name)
        .unwrap_or_else(|| panic!("the error names no source: {e}"));
    assert!(e.document >= 1, "documents count from 1: {e}");
    let lines = yaml_lines(&source.text);
    assert!(
        (1..=lines).contains(&e.line),
        "line {} of a {lines}-line source: {e}",
        e.line
    );
    assert!(!e.message.is_empty());
    assert!(e.to_string().contains(&e.message));
}

/// How many lines an editor shows for `text`, counting line breaks as YAML does: CR LF, LF and
/// a lone CR each end a line.
pub fn yaml_lines(text: &str) -> usize {
    let breaks = text.replace("\r\n", "\n").matches(['\r', '\n']).count();
    breaks + 1
}

/// Each object of a document (a `List`'s items, or the document itself).
fn objects_mut(doc: &mut Value) -> Vec<&mut Value> {
    if doc.get("kind").and_then(Value::as_str) == Some("List")
        && doc.get("items").is_some_and(Value::is_array)
    {
        return doc["items"]
            .as_array_mut()
            .map(|items| items.iter_mut().collect())
            .unwrap_or_default();
    }
    vec![doc]
}

fn workload_kind(obj: &Value) -> Option<WorkloadKind> {
    Kinds::built_in().from_type(
        obj.get("apiVersion").and_then(Value::as_str)?,
        obj.get("kind").and_then(Value::as_str)?,
    )
}

/// A document without its workloads' checksum annotations, and without the maps that held only
/// that annotation (or nothing).
fn without_stamps(mut doc: Value) -> Value {
    for obj in objects_mut(&mut doc) {
        let Some(kind) = workload_kind(obj) else {
            continue;
        };
        let mut path = vec![];
        path.extend(kind.template_path().iter().map(|t| format!("/{t}")));
        let template = obj.pointer_mut(&path.concat());
        let Some(Value::Object(template)) = template else {
            continue;
        };
        if let Some(Value::Object(meta)) = template.get_mut("metadata") {
            if let Some(Value::Object(annotations)) = meta.get_mut("annotations") {
                annotations.remove(CHECKSUM_ANNOTATION);
            }
            if meta
                .get("annotations")
                .is_some_and(|a| a.is_null() || a.as_object().is_some_and(|m| m.is_empty()))
            {
                meta.remove("annotations");
            }
        }
        if template
            .get("metadata")
            .is_some_and(|m| m.is_null() || m.as_object().is_some_and(|m| m.is_empty()))
        {
            template.remove("metadata");
        }
    }
    doc
}

/// Every workload of the output that stamping reads as one carries a plain v2 stamp, unless it
/// opted out.
fn check_stamped(doc: &Value) {
    let mut doc = doc.clone();
    for obj in objects_mut(&mut doc) {
        let Some(kind) = workload_kind(obj) else {
            continue;
        };
        if let Ok(Analysis::Workload(info)) = workload::analyze(kind, obj)
            && !info.opted_out
        {
            let stamp = info.stamp.as_deref().unwrap_or_default();
            assert_eq!(
                Recipe::of_stamp(stamp, checksum::PLAIN_KEY_ID),
                Some(Recipe::CURRENT),
                "a stamped {kind} carries {stamp:?}"
            );
        }
    }
}

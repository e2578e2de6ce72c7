//! Workload kinds and where their pod template is.
//!
//! Works on the object as JSON (`serde_json::Value`), the form both admission reviews and YAML
//! manifests arrive in, so that kinds without k8s-openapi types (Argo Rollouts) are handled the
//! same way and fields this crate does not know about are never lost.

use crate::names::{
    CHECKSUM_ANNOTATION, ENABLED_LABEL, RESTARTED_AT_ANNOTATION, UNSTAMPED_ANNOTATION,
    UNSTAMPED_TOO_MANY_REFERENCES,
};
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodSpec;
use serde_json::Value;

use crate::refs::{self, References};

pub use crate::kind::{KindError, Kinds, WorkloadKind};

/// Why an object could not be read as a workload.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("{path} must be {expected}")]
    Shape {
        path: String,
        expected: &'static str,
    },
    #[error("{kind} has no pod template at .{path}")]
    NoTemplate { kind: WorkloadKind, path: String },
    /// A configured kind's object has something at its pointer that is not a pod template (an
    /// object with `spec.containers` and nothing but `metadata` and `spec`).
    #[error("{kind} has something other than a pod template at .{path}")]
    NotPodTemplate { kind: WorkloadKind, path: String },
    /// The pod spec does not decode: where (its field path from the object's root, as
    /// `spec.template.spec.volumes[2].configMap.defaultMode`) and why. The message names the
    /// place only: the reason (`error`) may quote the value, which is the caller's to show.
    #[error("{} has a value of the wrong type or shape", .path.display())]
    PodSpec {
        path: FieldPath,
        #[source]
        error: serde_json::Error,
    },
}

/// A place in an object: map keys and list indexes from its root.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldPath(pub Vec<FieldSegment>);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldSegment {
    Key(String),
    Index(usize),
}

/// How many characters of a field path are shown: its keys may come from a review.
const MAX_PATH_SHOWN: usize = 256;

impl FieldPath {
    /// As kubectl writes it: `spec.volumes[2].configMap`, with characters outside names'
    /// alphabet shown as `?` and at most 256 of them.
    pub fn display(&self) -> String {
        let mut out = String::new();
        for segment in &self.0 {
            match segment {
                FieldSegment::Key(key) => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.extend(key.chars().map(|c| {
                        if c.is_ascii_alphanumeric() || "-_./".contains(c) {
                            c
                        } else {
                            '?'
                        }
                    }));
                }
                FieldSegment::Index(i) => out.push_str(&format!("[{i}]")),
            }
        }
        if out.chars().count() > MAX_PATH_SHOWN {
            out = out.chars().take(MAX_PATH_SHOWN).collect::<String>() + "...";
        }
        out
    }

    /// The segments as strings (an index in decimal), to find the place in a document.
    pub fn segments(&self) -> Vec<String> {
        self.0
            .iter()
            .map(|s| match s {
                FieldSegment::Key(k) => k.clone(),
                FieldSegment::Index(i) => i.to_string(),
            })
            .collect()
    }
}

/// Decodes `value` as a `T`; on failure, the field path (under `base`) of what did not decode.
/// The path is looked for only then (a second decode that follows it), so a value that decodes
/// costs what a plain decode does.
pub fn decode_at<'de, T: serde::Deserialize<'de>>(
    value: &'de Value,
    base: &[&str],
) -> Result<T, (FieldPath, serde_json::Error)> {
    if let Ok(decoded) = T::deserialize(value) {
        return Ok(decoded);
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let mut path: Vec<FieldSegment> = base
            .iter()
            .map(|k| FieldSegment::Key((*k).to_owned()))
            .collect();
        for segment in e.path().iter() {
            match segment {
                serde_path_to_error::Segment::Seq { index } => {
                    path.push(FieldSegment::Index(*index))
                }
                serde_path_to_error::Segment::Map { key } => {
                    path.push(FieldSegment::Key(key.clone()))
                }
                serde_path_to_error::Segment::Enum { variant } => {
                    path.push(FieldSegment::Key(variant.clone()))
                }
                serde_path_to_error::Segment::Unknown => {}
            }
        }
        (FieldPath(path), e.into_inner())
    })
}

/// What confighash does with an object.
#[derive(Debug)]
pub enum Analysis {
    /// Not a kind confighash stamps (Jobs, Pods, anything else): passed through.
    Unsupported,
    /// A Rollout that uses `workloadRef`: its template lives elsewhere, passed through.
    WorkloadRef,
    /// A workload to stamp.
    Workload(Box<WorkloadInfo>),
}

/// What the stamp rules need to know about a workload.
#[derive(Debug, Clone)]
pub struct WorkloadInfo {
    pub kind: WorkloadKind,
    pub name: Option<String>,
    pub namespace: Option<String>,
    /// Labelled `confighash.dev/enabled=false`.
    pub opted_out: bool,
    /// Labelled `confighash.dev/enabled=true` (exactly): handled as in an opted-in namespace,
    /// whatever its namespace's labels, but in an excluded namespace.
    pub opted_in: bool,
    pub refs: References,
    /// The stamp on the pod template, if any.
    pub stamp: Option<String>,
    /// Whether the workload carries the `confighash.dev/unstamped` marker.
    pub marker: bool,
    /// Whether that marker is the terminal `too-many-references`.
    pub too_many_references: bool,
}

/// Reads an object of a known workload kind.
pub fn analyze(kind: WorkloadKind, obj: &Value) -> Result<Analysis, WorkloadError> {
    analyze_within(kind, obj, usize::MAX)
}

/// [`analyze`], keeping at most `max_references` distinct referenced objects (see
/// [`References::over_limit`]): what `serve` uses, so the cost of a workload that names
/// thousands of objects stops at the limit.
pub fn analyze_within(
    kind: WorkloadKind,
    obj: &Value,
    max_references: usize,
) -> Result<Analysis, WorkloadError> {
    if kind == WorkloadKind::ROLLOUT && !obj.pointer("/spec/workloadRef").is_none_or(Value::is_null)
    {
        return Ok(Analysis::WorkloadRef);
    }
    let metadata = object_at(obj, &["metadata"])?;
    let labels = string_map(metadata, "metadata", "labels")?;
    let enabled = labels
        .as_ref()
        .and_then(|l| l.get(ENABLED_LABEL))
        .map(String::as_str);
    let annotations = string_map(metadata, "metadata", "annotations")?;
    let template = match template(kind, obj) {
        Ok(Some(template)) => template,
        Ok(None) => {
            return Err(WorkloadError::NoTemplate {
                kind,
                path: kind.template_path().join("."),
            });
        }
        Err(WorkloadError::Shape { .. }) if !kind.is_built_in() => {
            return Err(not_pod_template(kind));
        }
        Err(e) => return Err(e),
    };
    if !kind.is_built_in() && !is_pod_template(template) {
        return Err(not_pod_template(kind));
    }
    let template_meta = object_at(template, &["metadata"])?;
    let template_annotations = string_map(template_meta, "template.metadata", "annotations")?;
    let spec = match template.get("spec") {
        Some(spec) if !spec.is_null() => {
            let mut base: Vec<&str> = kind.template_path().to_vec();
            base.push("spec");
            decode_at::<PodSpec>(spec, &base)
                .map_err(|(path, error)| WorkloadError::PodSpec { path, error })?
        }
        _ => PodSpec::default(),
    };
    Ok(Analysis::Workload(Box::new(WorkloadInfo {
        kind,
        name: string_at(metadata, "name"),
        namespace: string_at(metadata, "namespace"),
        opted_out: enabled == Some("false"),
        opted_in: enabled == Some("true"),
        refs: refs::discover_within(&spec, annotations.as_ref(), max_references),
        stamp: template_annotations.and_then(|mut a| a.remove(CHECKSUM_ANNOTATION)),
        marker: annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(UNSTAMPED_ANNOTATION)),
        too_many_references: annotations.is_some_and(|a| {
            a.get(UNSTAMPED_ANNOTATION)
                .is_some_and(|v| v == UNSTAMPED_TOO_MANY_REFERENCES)
        }),
    })))
}

impl WorkloadError {
    /// Whether the object has no pod template where its kind keeps one: a configured kind's
    /// object like that is passed through and counted, not an error of the object's.
    pub fn is_no_template(&self) -> bool {
        matches!(
            self,
            WorkloadError::NoTemplate { .. } | WorkloadError::NotPodTemplate { .. }
        )
    }
}

fn not_pod_template(kind: WorkloadKind) -> WorkloadError {
    WorkloadError::NotPodTemplate {
        kind,
        path: kind.template_path().join("."),
    }
}

/// Whether `template` is a pod template as a configured kind must hold one: an object of
/// `metadata` and `spec` alone, whose `spec` has a `containers` list (a pod spec always has one).
/// A pointer that is wrong for the kind (`/spec` where `/spec/template` was meant) then stamps
/// nothing, rather than writing annotations where no pod reads them.
fn is_pod_template(template: &Value) -> bool {
    let Value::Object(fields) = template else {
        return false;
    };
    fields.keys().all(|k| k == "metadata" || k == "spec")
        && fields
            .get("metadata")
            .is_none_or(|m| m.is_object() || m.is_null())
        && fields
            .get("spec")
            .and_then(|spec| spec.get("containers"))
            .is_some_and(Value::is_array)
}

/// The stamp on a workload's pod template and whether it carries the unstamped marker, read
/// without decoding the pod spec (for an UPDATE's old object).
pub fn stamp_and_marker(kind: WorkloadKind, obj: &Value) -> (Option<&str>, bool) {
    let stamp = template(kind, obj)
        .ok()
        .flatten()
        .and_then(|t| t.pointer("/metadata/annotations"))
        .and_then(|a| a.get(CHECKSUM_ANNOTATION))
        .and_then(Value::as_str);
    let marker = obj
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(UNSTAMPED_ANNOTATION))
        .is_some();
    (stamp, marker)
}

/// The pod template's `kubectl.kubernetes.io/restartedAt` annotation, which `kubectl rollout
/// restart` sets.
pub fn restarted_at(kind: WorkloadKind, obj: &Value) -> Option<&str> {
    template(kind, obj)
        .ok()
        .flatten()
        .and_then(|t| t.pointer("/metadata/annotations"))
        .and_then(|a| a.get(RESTARTED_AT_ANNOTATION))
        .and_then(Value::as_str)
}

/// The pod template of a workload, or `None` if the object has none.
pub fn template(kind: WorkloadKind, obj: &Value) -> Result<Option<&Value>, WorkloadError> {
    let mut here = obj;
    for (i, token) in kind.template_path().iter().enumerate() {
        match here.get(token) {
            None | Some(Value::Null) => return Ok(None),
            Some(v @ Value::Object(_)) => here = v,
            Some(_) => {
                return Err(WorkloadError::Shape {
                    path: kind.template_path()[..=i].join("."),
                    expected: "an object",
                });
            }
        }
    }
    Ok(Some(here))
}

/// `obj` at `path` if it is an object; a missing or null value reads as an empty object.
fn object_at<'v>(obj: &'v Value, path: &[&str]) -> Result<&'v Value, WorkloadError> {
    static EMPTY: Value = Value::Null;
    let mut here = obj;
    for token in path {
        here = here.get(token).unwrap_or(&EMPTY);
    }
    match here {
        Value::Object(_) | Value::Null => Ok(here),
        _ => Err(WorkloadError::Shape {
            path: path.join("."),
            expected: "an object",
        }),
    }
}

fn string_at(obj: &Value, key: &str) -> Option<String> {
    obj.get(key).and_then(Value::as_str).map(str::to_owned)
}

/// A string-to-string map such as labels or annotations; absent or null reads as `None`.
fn string_map(
    obj: &Value,
    parent: &str,
    key: &str,
) -> Result<Option<BTreeMap<String, String>>, WorkloadError> {
    let bad = || WorkloadError::Shape {
        path: format!("{parent}.{key}"),
        expected: "a map of strings",
    };
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(k, v)| Ok((k.clone(), v.as_str().ok_or_else(bad)?.to_owned())))
            .collect::<Result<_, _>>()
            .map(Some),
        Some(_) => Err(bad()),
    }
}

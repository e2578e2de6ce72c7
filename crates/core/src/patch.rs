//! The JSONPatch that makes a workload carry a decided stamp and marker, and the watcher's
//! conditional touch.
//!
//! It touches nothing but the pod template's `confighash.dev/checksum` and the workload's
//! `confighash.dev/unstamped`, creates missing parent maps first, and escapes `~` and `/` in keys.

use json_patch::{
    AddOperation, Patch, PatchOperation, RemoveOperation, ReplaceOperation, TestOperation,
};
use jsonptr::PointerBuf;
use serde_json::Value;

use crate::names::{CHECKSUM_ANNOTATION, UNSTAMPED_ANNOTATION, UNSTAMPED_LOOKUP_FAILED};
use crate::workload::WorkloadKind;

/// Why no patch could be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot set annotations: {path} is neither an object nor absent")]
pub struct PatchError {
    pub path: String,
}

/// The operations that set the stamp (`None`: remove it) and the `lookup-failed` marker (or
/// remove any marker); empty when the object already carries both.
pub fn build(
    obj: &Value,
    kind: WorkloadKind,
    stamp: Option<&str>,
    marker: bool,
) -> Result<Patch, PatchError> {
    build_with_marker(obj, kind, stamp, marker.then_some(UNSTAMPED_LOOKUP_FAILED))
}

/// As [`build`], with the marker's value (`None`: no marker).
pub fn build_with_marker(
    obj: &Value,
    kind: WorkloadKind,
    stamp: Option<&str>,
    marker_value: Option<&str>,
) -> Result<Patch, PatchError> {
    let mut ops = Vec::new();
    set_annotation(
        &mut ops,
        obj,
        &["metadata", "annotations"],
        UNSTAMPED_ANNOTATION,
        marker_value,
    )?;
    let mut path: Vec<&str> = kind.template_path().to_vec();
    path.extend(["metadata", "annotations"]);
    set_annotation(&mut ops, obj, &path, CHECKSUM_ANNOTATION, stamp)?;
    Ok(Patch(ops))
}

/// Adds the operations that make the map at `parents` hold `key: value` (or not hold `key`).
fn set_annotation(
    ops: &mut Vec<PatchOperation>,
    obj: &Value,
    parents: &[&str],
    key: &str,
    value: Option<&str>,
) -> Result<(), PatchError> {
    // Walk down as far as the object goes.
    let mut here = Some(obj);
    let mut depth = 0;
    for token in parents {
        match here.and_then(|h| h.get(token)) {
            Some(Value::Object(_)) => {
                here = here.and_then(|h| h.get(token));
                depth += 1;
            }
            Some(Value::Null) | None => {
                here = None;
                break;
            }
            Some(_) => {
                return Err(PatchError {
                    path: parents[..=depth].join("."),
                });
            }
        }
    }
    let existing = here.and_then(|map| map.get(key)).and_then(Value::as_str);
    if existing == value && (value.is_some() || here.and_then(|m| m.get(key)).is_none()) {
        return Ok(());
    }
    let Some(value) = value else {
        // Remove: only reached when the map exists and holds the key.
        ops.push(PatchOperation::Remove(RemoveOperation {
            path: PointerBuf::from_tokens(parents.iter().copied().chain([key])),
        }));
        return Ok(());
    };
    // Create each missing parent as an empty map, then add the key.
    for end in depth + 1..=parents.len() {
        ops.push(PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(parents[..end].iter().copied()),
            value: Value::Object(Default::default()),
        }));
    }
    ops.push(PatchOperation::Add(AddOperation {
        path: PointerBuf::from_tokens(parents.iter().copied().chain([key])),
        value: Value::String(value.to_owned()),
    }));
    Ok(())
}

/// The watcher's touch of a workload, conditional on what the watcher believes it carries.
#[derive(Debug, Clone, PartialEq)]
pub enum Touch {
    /// A JSON patch: `test` the believed stamp, then `replace` it.
    Json(Patch),
    /// A merge patch that sets the stamp and carries the believed resourceVersion, which the API
    /// server checks (409 Conflict when it moved on): for a workload without a stamp. A merge
    /// patch creates the missing parent maps itself.
    Merge(Value),
}

/// The touch that sets the pod template's stamp to `expected` only if the workload still
/// carries `believed` (its stamp), or, without one, is still at `resource_version`. Nothing
/// else is written: not the marker (the webhook removes it when it stamps), no other field.
pub fn touch(
    kind: WorkloadKind,
    expected: &str,
    believed: Option<&str>,
    resource_version: &str,
) -> Touch {
    let template = kind.template_path();
    match believed {
        Some(stamp) => {
            let path = PointerBuf::from_tokens(template.iter().copied().chain([
                "metadata",
                "annotations",
                CHECKSUM_ANNOTATION,
            ]));
            Touch::Json(Patch(vec![
                PatchOperation::Test(TestOperation {
                    path: path.clone(),
                    value: Value::String(stamp.to_owned()),
                }),
                PatchOperation::Replace(ReplaceOperation {
                    path,
                    value: Value::String(expected.to_owned()),
                }),
            ]))
        }
        None => {
            let mut annotations = serde_json::Map::new();
            annotations.insert(CHECKSUM_ANNOTATION.into(), expected.into());
            let mut here = serde_json::json!({"metadata": {"annotations": annotations}});
            for token in template.iter().rev() {
                let mut parent = serde_json::Map::new();
                parent.insert((*token).to_owned(), here);
                here = Value::Object(parent);
            }
            here["metadata"] = serde_json::json!({"resourceVersion": resource_version});
            Touch::Merge(here)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_touch_tests_the_believed_stamp_then_replaces_it() {
        let Touch::Json(patch) = touch(WorkloadKind::CRON_JOB, "v2:k:new", Some("v2:k:old"), "7")
        else {
            panic!("a JSON patch");
        };
        let path = "/spec/jobTemplate/spec/template/metadata/annotations/confighash.dev~1checksum";
        assert_eq!(
            serde_json::to_value(&patch).unwrap(),
            json!([
                {"op": "test", "path": path, "value": "v2:k:old"},
                {"op": "replace", "path": path, "value": "v2:k:new"},
            ])
        );
        // Applied to a workload that carries another stamp, the test fails and nothing changes.
        let mut other = json!({"spec": {"jobTemplate": {"spec": {"template": {"metadata": {
            "annotations": {CHECKSUM_ANNOTATION: "v2:k:newer"}}}}}}});
        let before = other.clone();
        assert!(json_patch::patch(&mut other, &patch).is_err());
        assert_eq!(other, before);
    }

    #[test]
    fn a_touch_of_a_workload_without_a_stamp_carries_its_resource_version() {
        assert_eq!(
            touch(WorkloadKind::DEPLOYMENT, "v2:k:new", None, "42"),
            Touch::Merge(json!({
                "metadata": {"resourceVersion": "42"},
                "spec": {"template": {"metadata": {"annotations": {
                    CHECKSUM_ANNOTATION: "v2:k:new"}}}},
            }))
        );
    }
}

//! The JSONPatch that makes a workload carry a decided stamp and marker.
//!
//! It touches nothing but the pod template's `confighash.dev/checksum` and the workload's
//! `confighash.dev/unstamped`, creates missing parent maps first, and escapes `~` and `/` in keys.

use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation};
use jsonptr::PointerBuf;
use serde_json::Value;

use crate::core::names::{CHECKSUM_ANNOTATION, UNSTAMPED_ANNOTATION, UNSTAMPED_LOOKUP_FAILED};
use crate::core::workload::WorkloadKind;

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

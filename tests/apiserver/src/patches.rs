//! The four patch types kube-apiserver accepts on PATCH.

use serde_json::{Map, Value};

/// `application/merge-patch+json` (RFC 7386): maps merge, `null` deletes, anything else replaces.
pub fn merge(target: &mut Value, patch: &Value) {
    json_patch::merge(target, patch);
}

/// `application/json-patch+json` (RFC 6902).
pub fn json(target: &mut Value, patch: &Value) -> Result<(), String> {
    let patch: json_patch::Patch =
        serde_json::from_value(patch.clone()).map_err(|e| format!("invalid JSON patch: {e}"))?;
    json_patch::patch(target, &patch).map_err(|e| e.to_string())
}

/// `application/strategic-merge-patch+json`, for the shapes workload objects have.
///
/// Like kube-apiserver's strategic merge for the fields confighash and kubectl touch: maps merge
/// and `null` deletes as in a merge patch; lists of objects that carry a merge key (`name` for
/// containers, volumes, env and mounts; `containerPort` for ports) merge item by item, an item with
/// `$patch: delete` is removed; other lists are replaced. `$setElementOrder` and `$retainKeys`
/// directives are accepted and ignored (order and retention of merged lists are left as stored).
pub fn strategic(target: &mut Value, patch: &Value) -> Result<(), String> {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            if p.get("$patch").and_then(Value::as_str) == Some("replace") {
                let mut replaced = p.clone();
                replaced.remove("$patch");
                *t = replaced;
                return Ok(());
            }
            for (k, v) in p {
                if k.starts_with("$setElementOrder/") || k == "$retainKeys" || k == "$patch" {
                    continue;
                }
                if v.is_null() {
                    t.remove(k);
                    continue;
                }
                match t.get_mut(k) {
                    Some(existing) => strategic_field(existing, v)?,
                    None => {
                        let mut fresh = Value::Null;
                        strategic_field(&mut fresh, v)?;
                        t.insert(k.clone(), fresh);
                    }
                }
            }
            Ok(())
        }
        (t, p) => {
            *t = p.clone();
            Ok(())
        }
    }
}

fn strategic_field(target: &mut Value, patch: &Value) -> Result<(), String> {
    match (&mut *target, patch) {
        (Value::Object(_), Value::Object(_)) => strategic(target, patch),
        (Value::Array(t), Value::Array(p)) => {
            let Some(key) = merge_key(t, p) else {
                *target = Value::Array(p.iter().map(strip_directives).collect());
                return Ok(());
            };
            for item in p {
                let id = item.get(key).cloned();
                let pos = t
                    .iter()
                    .position(|e| e.get(key) == id.as_ref() && id.is_some());
                let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
                match (pos, delete) {
                    (Some(i), true) => {
                        t.remove(i);
                    }
                    (None, true) => {}
                    (Some(i), false) => strategic(&mut t[i], item)?,
                    (None, false) => t.push(strip_directives(item)),
                }
            }
            Ok(())
        }
        (_, p) => {
            *target = strip_directives(p);
            Ok(())
        }
    }
}

/// The merge key of a list whose items are all objects carrying it.
fn merge_key(target: &[Value], patch: &[Value]) -> Option<&'static str> {
    ["name", "containerPort"].into_iter().find(|key| {
        let all = |items: &[Value]| items.iter().all(|i| i.get(key).is_some());
        !patch.is_empty() && all(patch) && all(target)
    })
}

fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect::<Map<_, _>>(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

/// `application/apply-patch+yaml` (server-side apply), simplified.
///
/// Creates the object when absent; otherwise merges the applied configuration over the stored
/// object. Unlike kube-apiserver it keeps no managedFields, so a field the manager stops applying
/// is not removed and there are no conflicts between managers; confighash applies whole objects
/// it alone manages, where the two behave the same.
pub fn apply(existing: Option<&Value>, applied: &Value) -> Value {
    match existing {
        None => applied.clone(),
        Some(existing) => {
            let mut out = existing.clone();
            json_patch::merge(&mut out, applied);
            out
        }
    }
}

//! The four patch types kube-apiserver accepts on PATCH.

use serde_json::{Map, Value};

use crate::apiserver::schema::{self, ListKind, Ty};

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

/// Why a strategic merge patch was refused: kube-apiserver's status code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchError {
    /// 400 for a malformed patch, 422 for one that does not fit the object.
    pub code: u16,
    pub message: String,
}

impl PatchError {
    fn bad(message: impl Into<String>) -> Self {
        PatchError {
            code: 400,
            message: message.into(),
        }
    }

    fn unprocessable(message: impl Into<String>) -> Self {
        PatchError {
            code: 422,
            message: message.into(),
        }
    }
}

/// `application/strategic-merge-patch+json` on an object of type `ty` (see `schema::root`).
///
/// Mimics k8s.io/apimachinery's strategicpatch for the types the stand-in serves: maps merge and
/// `null` deletes as in a merge patch; each list merges by its field's `patchStrategy` (see
/// `schema`): by its `patchMergeKey` item by item (`containers` by `name`, `volumeMounts` by
/// `mountPath`, `ports` by `containerPort`, ...), as a set (`finalizers`), or replaced whole when
/// the field has no strategy (`envFrom`, `tolerations`, `args`, ...). Directives: `$patch:
/// replace|delete|merge` on maps and list items, `$retainKeys`, `$deleteFromPrimitiveList/`.
/// `$setElementOrder/` is accepted and not applied: merged lists keep the stored order with new
/// items appended.
///
/// A list in a field that `schema` does not describe is refused (400) rather than guessed at;
/// an item without its list's merge key is refused (422), as kube-apiserver does.
pub fn strategic(target: &mut Value, patch: &Value, ty: Ty) -> Result<(), PatchError> {
    match (&mut *target, patch) {
        (Value::Object(t), Value::Object(p)) => merge_map(t, p, ty, ""),
        (_, Value::Object(p)) => {
            let mut fresh = Map::new();
            merge_map(&mut fresh, p, ty, "")?;
            *target = Value::Object(fresh);
            Ok(())
        }
        _ => Err(PatchError::bad(
            "a strategic merge patch must be a JSON object",
        )),
    }
}

fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_owned()
    } else {
        format!("{path}.{field}")
    }
}

fn directive(patch: &Map<String, Value>) -> Result<Option<&str>, PatchError> {
    match patch.get("$patch") {
        None => Ok(None),
        Some(Value::String(s)) if matches!(s.as_str(), "replace" | "delete" | "merge") => {
            Ok(Some(s.as_str()))
        }
        Some(other) => Err(PatchError::bad(format!("Unknown patch type: {other}"))),
    }
}

fn merge_map(
    target: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    ty: Ty,
    path: &str,
) -> Result<(), PatchError> {
    if directive(patch)? == Some("replace") {
        *target = strip_map(patch);
        return Ok(());
    }
    if let Some(keys) = patch.get("$retainKeys") {
        let keys: Vec<&str> = keys
            .as_array()
            .and_then(|a| a.iter().map(Value::as_str).collect())
            .ok_or_else(|| PatchError::bad("invalid patch format of retainKeys"))?;
        if let Some(k) = patch
            .keys()
            .find(|k| !k.starts_with('$') && !keys.contains(&k.as_str()))
        {
            return Err(PatchError::unprocessable(format!(
                "{}: the patch sets {k:?}, which is not in $retainKeys",
                join(path, k)
            )));
        }
        target.retain(|k, _| keys.contains(&k.as_str()));
    }
    for (k, v) in patch {
        if k.starts_with('$') {
            continue;
        }
        let here = join(path, k);
        let field = schema::field(ty, k);
        match v {
            Value::Null => {
                target.remove(k);
            }
            Value::Object(p) if directive(p)? == Some("delete") => {
                target.remove(k);
            }
            Value::Object(p) => match target.get_mut(k) {
                Some(Value::Object(t)) => merge_map(t, p, field.object(), &here)?,
                _ => {
                    let mut fresh = Map::new();
                    merge_map(&mut fresh, p, field.object(), &here)?;
                    target.insert(k.clone(), Value::Object(fresh));
                }
            },
            Value::Array(items) => {
                let kind = field.list().ok_or_else(|| {
                    PatchError::bad(format!(
                        "strategic merge patch: {here}: how this list merges is not known to this \
                         server; send a JSON merge patch or a JSON patch instead"
                    ))
                })?;
                let merged = merge_list(target.get(k), items, kind, &here)?;
                target.insert(k.clone(), merged);
            }
            scalar => {
                target.insert(k.clone(), scalar.clone());
            }
        }
    }
    for (k, v) in patch {
        let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") else {
            continue;
        };
        let doomed = v
            .as_array()
            .ok_or_else(|| PatchError::bad("invalid patch format for a primitive list"))?;
        if let Some(Value::Array(list)) = target.get_mut(field) {
            list.retain(|item| !doomed.contains(item));
        }
    }
    Ok(())
}

fn merge_list(
    target: Option<&Value>,
    items: &[Value],
    kind: ListKind,
    path: &str,
) -> Result<Value, PatchError> {
    let existing: Vec<Value> = match target {
        Some(Value::Array(a)) => a.clone(),
        _ => Vec::new(),
    };
    match kind {
        ListKind::Atomic => Ok(Value::Array(items.iter().map(strip).collect())),
        ListKind::Set => {
            let mut out = existing;
            for item in items {
                if item.is_object() || item.is_array() {
                    return Err(PatchError::bad(format!(
                        "{path}: a list of scalars cannot merge {item}"
                    )));
                }
                if !out.contains(item) {
                    out.push(item.clone());
                }
            }
            Ok(Value::Array(out))
        }
        ListKind::Merge(key, item_ty) => {
            let objects: Vec<&Map<String, Value>> = items
                .iter()
                .map(|i| {
                    i.as_object().ok_or_else(|| {
                        PatchError::bad(format!("{path}: {i} is not an object with a {key:?}"))
                    })
                })
                .collect::<Result<_, _>>()?;
            let mut replace = false;
            for item in &objects {
                replace |= directive(item)? == Some("replace");
            }
            let mut out = if replace { Vec::new() } else { existing };
            for item in objects {
                let Some(id) = item.get(key) else {
                    if directive(item)? == Some("replace") {
                        continue;
                    }
                    return Err(PatchError::unprocessable(format!(
                        "{path}: map: {} does not contain declared merge key: {key}",
                        Value::Object(item.clone())
                    )));
                };
                let pos = out.iter().position(|e| e.get(key) == Some(id));
                match (pos, directive(item)?) {
                    (Some(i), Some("delete")) => {
                        out.remove(i);
                    }
                    (None, Some("delete")) => {}
                    (Some(i), _) => {
                        // Found by its key, so an object.
                        if let Some(t) = out[i].as_object_mut() {
                            merge_map(t, item, item_ty, path)?;
                        }
                    }
                    (None, _) => {
                        let mut fresh = Map::new();
                        merge_map(&mut fresh, item, item_ty, path)?;
                        out.push(Value::Object(fresh));
                    }
                }
            }
            Ok(Value::Array(out))
        }
    }
}

fn strip_map(m: &Map<String, Value>) -> Map<String, Value> {
    m.iter()
        .filter(|(k, _)| !k.starts_with('$'))
        .map(|(k, v)| (k.clone(), strip(v)))
        .collect()
}

/// A patch value without its `$` directives, as it is stored.
fn strip(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(strip_map(m)),
        Value::Array(a) => Value::Array(a.iter().map(strip).collect()),
        other => other.clone(),
    }
}

/// `application/apply-patch+yaml` (server-side apply), simplified.
///
/// Creates the object when absent; otherwise merges the applied configuration over the stored
/// object. The applier's fields are recorded in managedFields (see `managed`), but unlike
/// kube-apiserver a field the manager stops applying is not removed and there are no conflicts
/// between managers; confighash applies whole objects it alone manages, where the two behave
/// the same.
///
/// A `null` in the applied configuration is no opinion, as kube-apiserver takes it: it removes
/// nothing another manager set (`annotations: null` in a pod template leaves a webhook's
/// annotation and its owner in place; a merge patch would delete the map).
pub fn apply(existing: Option<&Value>, applied: &Value) -> Value {
    let applied = without_nulls(applied);
    match existing {
        None => applied,
        Some(existing) => {
            let mut out = existing.clone();
            json_patch::merge(&mut out, &applied);
            out
        }
    }
}

/// `v` without the members whose value is `null`, at every depth of objects.
fn without_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_nulls).collect()),
        other => other.clone(),
    }
}

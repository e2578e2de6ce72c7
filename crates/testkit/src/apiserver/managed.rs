//! `metadata.managedFields`: kube-apiserver's field manager, simplified.
//!
//! Mimics k8s.io/apiserver's field manager (endpoints/handlers/fieldmanager with
//! apimachinery's managedfields) as it runs on every create, update and patch, before mutating
//! admission:
//!
//! - An update (POST, PUT, or a JSON, merge or strategic merge PATCH) is recorded under its
//!   manager (`fieldManager`, else the User-Agent up to its first `/`) with operation `Update`:
//!   the fields it changed, compared with the stored object before admission, join the
//!   manager's set and its `time` becomes now; other managers lose the fields it changed
//!   (updates always force), and everybody loses the fields it removed. An update that changes
//!   no field leaves managedFields as they are.
//! - A server-side apply is recorded with operation `Apply`: the manager's set becomes the
//!   fields of the applied configuration.
//! - Entries with no field left are dropped; entries are ordered as kube-apiserver orders them
//!   (operation, then time, then manager).
//!
//! Because this runs before admission, a write whose request changed a field is stored even when
//! a webhook changed it back: its managedFields differ. The exception is kube-apiserver's
//! `IgnoreManagedFieldsTimestampsTransformer`, which runs after admission: when the stored
//! object would differ only in managedFields timestamps, the old ones are kept and nothing is
//! written (see `equal_but_for_time`). So a manager that changes the same field again, with a
//! webhook turning it back, writes nothing the second time; the first time it does.
//!
//! Simplified: sets hold leaf fields. Lists with a merge key (see `schema`) are keyed by it
//! alone (`k:{"name":"app"}`; kube keys container ports by port and protocol), scalar sets by
//! value (`v:"x"`), and every other list is one atomic leaf. Maps own no `.` entry of their own
//! unless they are empty. `status` and the server-owned metadata are not tracked, as the real
//! field manager strips them. Apply conflicts between managers are not detected (an apply
//! forces, as an update does), and fields an applier stops applying are not removed from the
//! object. Webhooks cannot change managedFields: the entries computed here are stored.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use crate::apiserver::schema::{self, Field, ListKind, Ty};

/// A field path, as fieldsV1 keys: `f:spec`, `k:{"name":"app"}`, `v:"x"`.
pub type Path = Vec<String>;
pub type FieldSet = BTreeSet<Path>;

/// One `metadata.managedFields` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub manager: String,
    /// `Update` or `Apply`.
    pub operation: String,
    pub api_version: String,
    /// RFC 3339, seconds.
    pub time: Option<String>,
    pub subresource: Option<String>,
    pub fields: FieldSet,
}

/// The manager kube-apiserver records for a request: `fieldManager` if given, else the
/// User-Agent up to its first `/` without unprintable characters, cut to 128 characters
/// (`managerOrUserAgent`); "unknown" when neither says anything.
pub fn manager_of(field_manager: Option<&str>, user_agent: Option<&str>) -> String {
    if let Some(m) = field_manager.filter(|m| !m.is_empty()) {
        return m.to_owned();
    }
    let prefix: String = user_agent
        .unwrap_or("")
        .split('/')
        .next()
        .unwrap_or("")
        .chars()
        .filter(|c| !c.is_control())
        .take(128)
        .collect();
    if prefix.is_empty() {
        "unknown".to_owned()
    } else {
        prefix
    }
}

/// Fields the field manager never tracks: type and identity, server-set metadata, and `status`
/// (reset on main-resource writes of the kinds that have one).
fn ignored(path: &[String], key: &str) -> bool {
    match path {
        [] => matches!(key, "apiVersion" | "kind" | "status"),
        [meta] if meta == "f:metadata" => matches!(
            key,
            "name"
                | "namespace"
                | "creationTimestamp"
                | "selfLink"
                | "uid"
                | "generation"
                | "managedFields"
                | "resourceVersion"
                | "deletionTimestamp"
                | "deletionGracePeriodSeconds"
        ),
        _ => false,
    }
}

fn child(path: &[String], element: String) -> Path {
    let mut p = path.to_vec();
    p.push(element);
    p
}

/// The key element of a list item merged by `key`, if it has one.
fn item_key(item: &Value, key: &str) -> Option<String> {
    let id = item.as_object()?.get(key)?;
    Some(format!("k:{}", json!({ key: id })))
}

/// The items of a keyed list by their key elements, when every item has its key.
fn keyed<'v>(items: &'v [Value], key: &str) -> Option<BTreeMap<String, &'v Value>> {
    items
        .iter()
        .map(|i| item_key(i, key).map(|k| (k, i)))
        .collect()
}

/// The leaf fields of `value`, found at `path` in a field described by `field`.
fn leaves(value: &Value, field: Field, path: &[String], out: &mut FieldSet) {
    match value {
        Value::Object(m) if !m.is_empty() => {
            let ty = field.object();
            for (k, v) in m {
                if !ignored(path, k) {
                    leaves(v, schema::field(ty, k), &child(path, format!("f:{k}")), out);
                }
            }
        }
        Value::Array(items) if !items.is_empty() => match field.list() {
            Some(ListKind::Merge(key, item_ty)) if keyed(items, key).is_some() => {
                for item in items {
                    let element = item_key(item, key).unwrap_or_default();
                    leaves(item, Field::Object(item_ty), &child(path, element), out);
                }
            }
            Some(ListKind::Set) if items.iter().all(|i| !i.is_object() && !i.is_array()) => {
                for item in items {
                    out.insert(child(path, format!("v:{item}")));
                }
            }
            _ => {
                out.insert(path.to_vec());
            }
        },
        _ if path.is_empty() => {}
        _ => {
            out.insert(path.to_vec());
        }
    }
}

/// What changed from `old` to `new`: leaves added or changed, and leaves removed.
fn compare(
    old: Option<&Value>,
    new: Option<&Value>,
    field: Field,
    path: &[String],
    changed: &mut FieldSet,
    removed: &mut FieldSet,
) {
    match (old, new) {
        (Some(Value::Object(o)), Some(Value::Object(n))) => {
            let ty = field.object();
            let keys: BTreeSet<&String> = o.keys().chain(n.keys()).collect();
            for k in keys {
                if !ignored(path, k) {
                    let here = child(path, format!("f:{k}"));
                    let f = schema::field(ty, k);
                    compare(o.get(k), n.get(k), f, &here, changed, removed);
                }
            }
        }
        (Some(Value::Array(o)), Some(Value::Array(n))) if o != n => match field.list() {
            Some(ListKind::Merge(key, item_ty)) => match (keyed(o, key), keyed(n, key)) {
                (Some(o), Some(n)) => {
                    let keys: BTreeSet<&String> = o.keys().chain(n.keys()).collect();
                    for k in keys {
                        let here = child(path, k.clone());
                        let f = Field::Object(item_ty);
                        let (a, b) = (o.get(k).copied(), n.get(k).copied());
                        compare(a, b, f, &here, changed, removed);
                    }
                }
                _ => replaced(old, new, field, path, changed, removed),
            },
            _ => replaced(old, new, field, path, changed, removed),
        },
        (o, n) if o == n => {}
        _ => replaced(old, new, field, path, changed, removed),
    }
}

fn replaced(
    old: Option<&Value>,
    new: Option<&Value>,
    field: Field,
    path: &[String],
    changed: &mut FieldSet,
    removed: &mut FieldSet,
) {
    let mut before = FieldSet::new();
    let mut after = FieldSet::new();
    if let Some(o) = old {
        leaves(o, field, path, &mut before);
    }
    if let Some(n) = new {
        leaves(n, field, path, &mut after);
    }
    for p in &before {
        if !after.contains(p) {
            removed.insert(p.clone());
        }
    }
    if old.is_none() {
        changed.extend(after);
    } else {
        // Leaves present before and after are changed only if their values differ: compare
        // them one by one (a replaced atomic list or scalar is one leaf that changed).
        for p in after {
            let relative = &p[path.len()..];
            if before.contains(&p) && at(old, relative) == at(new, relative) {
                continue;
            }
            changed.insert(p);
        }
    }
}

/// The value at a field path, following keyed and set elements.
fn at<'v>(value: Option<&'v Value>, path: &[String]) -> Option<&'v Value> {
    let mut here = value?;
    for element in path {
        here = if let Some(name) = element.strip_prefix("f:") {
            here.get(name)?
        } else if let Some(key) = element.strip_prefix("k:") {
            let key: Map<String, Value> = serde_json::from_str(key).ok()?;
            here.as_array()?.iter().find(|i| {
                key.iter()
                    .all(|(k, v)| i.as_object().and_then(|o| o.get(k)) == Some(v))
            })?
        } else if let Some(v) = element.strip_prefix("v:") {
            let v: Value = serde_json::from_str(v).ok()?;
            here.as_array()?.iter().find(|i| **i == v)?
        } else {
            return None;
        };
    }
    Some(here)
}

fn root_field(group: &str, kind: &str) -> Field {
    Field::Object(schema::root(group, kind).unwrap_or(Ty::Unknown))
}

/// The managedFields entries of `obj`: None when it has none or they do not parse.
pub fn entries_of(obj: &Value) -> Option<Vec<Entry>> {
    let list = obj.pointer("/metadata/managedFields")?.as_array()?;
    list.iter().map(parse_entry).collect()
}

fn parse_entry(v: &Value) -> Option<Entry> {
    let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    let mut fields = FieldSet::new();
    if let Some(f) = v.get("fieldsV1") {
        parse_fields(f, &[], &mut fields)?;
    }
    Some(Entry {
        manager: s("manager")?,
        operation: s("operation")?,
        api_version: s("apiVersion").unwrap_or_default(),
        time: s("time"),
        subresource: s("subresource"),
        fields,
    })
}

fn parse_fields(v: &Value, path: &[String], out: &mut FieldSet) -> Option<()> {
    let m = v.as_object()?;
    if m.is_empty() && !path.is_empty() {
        out.insert(path.to_vec());
    }
    for (k, child_value) in m {
        if k == "." {
            out.insert(path.to_vec());
        } else {
            parse_fields(child_value, &child(path, k.clone()), out)?;
        }
    }
    Some(())
}

/// A field set as `fieldsV1`: nested maps of path elements, `{}` at the leaves, and `.` for a
/// node that is owned itself and has owned children.
fn fields_v1(set: &FieldSet) -> Value {
    #[derive(Default)]
    struct Node {
        member: bool,
        children: BTreeMap<String, Node>,
    }
    fn to_value(node: &Node) -> Value {
        let mut m = Map::new();
        if node.member && !node.children.is_empty() {
            m.insert(".".into(), json!({}));
        }
        for (k, c) in &node.children {
            m.insert(k.clone(), to_value(c));
        }
        Value::Object(m)
    }
    let mut root = Node::default();
    for path in set {
        let mut node = &mut root;
        for element in path {
            node = node.children.entry(element.clone()).or_default();
        }
        node.member = true;
    }
    to_value(&root)
}

/// Entries as `metadata.managedFields`, in kube-apiserver's order.
pub fn to_json(entries: &[Entry]) -> Value {
    let mut sorted: Vec<&Entry> = entries.iter().collect();
    sorted.sort_by(|a, b| {
        (
            &a.operation,
            &a.time,
            &a.manager,
            &a.api_version,
            &a.subresource,
        )
            .cmp(&(
                &b.operation,
                &b.time,
                &b.manager,
                &b.api_version,
                &b.subresource,
            ))
    });
    Value::Array(
        sorted
            .into_iter()
            .map(|e| {
                let mut v = json!({
                    "manager": e.manager,
                    "operation": e.operation,
                    "apiVersion": e.api_version,
                });
                if let Some(t) = &e.time {
                    v["time"] = json!(t);
                }
                v["fieldsType"] = json!("FieldsV1");
                v["fieldsV1"] = fields_v1(&e.fields);
                if let Some(s) = &e.subresource {
                    v["subresource"] = json!(s);
                }
                v
            })
            .collect(),
    )
}

/// One write, as the field manager sees it.
pub struct Write<'a> {
    pub group: &'a str,
    pub kind: &'a str,
    pub api_version: &'a str,
    pub manager: &'a str,
    /// The current time, RFC 3339 seconds.
    pub now: &'a str,
}

/// The entries a write starts from (kube's `decodeLiveOrNew`): the request object's own when it
/// carries any, none when it resets them with `[]`, else the stored object's.
fn base(live: Option<&Value>, new: &Value) -> Vec<Entry> {
    match new.pointer("/metadata/managedFields") {
        Some(Value::Array(a)) if a.is_empty() => return Vec::new(),
        Some(Value::Array(a)) if a.len() == 1 && a[0] == json!({}) => return Vec::new(),
        _ => {}
    }
    entries_of(new)
        .filter(|e| !e.is_empty())
        .or_else(|| live.and_then(entries_of))
        .unwrap_or_default()
}

/// Takes the fields in `changed` from everyone and those under `removed` from everyone.
fn release(entries: &mut [Entry], changed: &FieldSet, removed: &FieldSet) {
    for e in entries.iter_mut() {
        e.fields
            .retain(|p| !changed.contains(p) && !removed.iter().any(|r| p.starts_with(r)));
    }
}

/// The managedFields after an update (a create when `live` is None) from `live` to `new`.
pub fn update(write: &Write<'_>, live: Option<&Value>, new: &Value) -> Vec<Entry> {
    let mut entries = base(live, new);
    let (mut changed, mut removed) = (FieldSet::new(), FieldSet::new());
    let field = root_field(write.group, write.kind);
    compare(live, Some(new), field, &[], &mut changed, &mut removed);
    release(&mut entries, &changed, &removed);
    if !changed.is_empty() {
        let mine = entries.iter_mut().find(|e| {
            e.manager == write.manager && e.operation == "Update" && e.subresource.is_none()
        });
        match mine {
            Some(e) => {
                e.fields.extend(changed);
                e.time = Some(write.now.to_owned());
                e.api_version = write.api_version.to_owned();
            }
            None => entries.push(Entry {
                manager: write.manager.to_owned(),
                operation: "Update".into(),
                api_version: write.api_version.to_owned(),
                time: Some(write.now.to_owned()),
                subresource: None,
                fields: changed,
            }),
        }
    }
    entries.retain(|e| !e.fields.is_empty());
    entries
}

/// The managedFields after a server-side apply of `applied` turned `live` (None: absent) into
/// `merged`.
pub fn apply(
    write: &Write<'_>,
    live: Option<&Value>,
    merged: &Value,
    applied: &Value,
) -> Vec<Entry> {
    let mut entries = live.and_then(entries_of).unwrap_or_default();
    let (mut changed, mut removed) = (FieldSet::new(), FieldSet::new());
    let field = root_field(write.group, write.kind);
    compare(live, Some(merged), field, &[], &mut changed, &mut removed);
    let mut set = FieldSet::new();
    leaves(applied, field, &[], &mut set);
    let before = entries
        .iter()
        .position(|e| e.manager == write.manager && e.operation == "Apply")
        .map(|i| entries.remove(i));
    release(&mut entries, &changed, &removed);
    let time = match before {
        Some(b) if b.fields == set && changed.is_empty() && removed.is_empty() => b.time,
        _ => Some(write.now.to_owned()),
    };
    entries.push(Entry {
        manager: write.manager.to_owned(),
        operation: "Apply".into(),
        api_version: write.api_version.to_owned(),
        time,
        subresource: None,
        fields: set,
    });
    entries.retain(|e| !e.fields.is_empty());
    entries
}

/// Whether two managedFields lists differ at most in their timestamps.
pub fn equal_but_for_time(a: &Value, b: &Value) -> bool {
    // Entries are ordered by time, so a newer time can move an entry: compare them as sets.
    let strip = |v: &Value| -> Option<Vec<String>> {
        let mut entries: Vec<String> = v
            .as_array()?
            .iter()
            .map(|e| {
                let mut e = e.clone();
                if let Some(o) = e.as_object_mut() {
                    o.remove("time");
                }
                e.to_string()
            })
            .collect();
        entries.sort();
        Some(entries)
    };
    match (strip(a), strip(b)) {
        (Some(a), Some(b)) => a == b,
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_equal_but_for_time_may_be_in_another_order() {
        let entry = |manager: &str, time: &str| serde_json::json!({"manager": manager, "operation": "Update", "time": time});
        let old = Value::Array(vec![entry("a", "1"), entry("b", "1")]);
        let moved = Value::Array(vec![entry("b", "1"), entry("a", "2")]);
        assert!(equal_but_for_time(&old, &moved));
        let other = Value::Array(vec![entry("b", "1"), entry("c", "2")]);
        assert!(!equal_but_for_time(&old, &other));
    }

    fn write<'a>(manager: &'a str, now: &'a str) -> Write<'a> {
        Write {
            group: "apps",
            kind: "Deployment",
            api_version: "apps/v1",
            manager,
            now,
        }
    }

    fn deployment(image: &str, env: Value) -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "ns", "uid": "u", "resourceVersion": "5"},
            "spec": {"template": {"spec": {"containers": [
                {"name": "app", "image": image, "env": env}
            ]}}},
            "status": {"replicas": 1}
        })
    }

    fn with_entries(mut obj: Value, entries: &[Entry]) -> Value {
        obj["metadata"]["managedFields"] = to_json(entries);
        obj
    }

    #[test]
    fn a_create_owns_its_leaves_with_lists_keyed_by_their_merge_keys() {
        let obj = deployment("a:1", json!([{"name": "X", "value": "1"}]));
        let entries = update(&write("kubectl", "2024-01-01T00:00:00Z"), None, &obj);
        assert_eq!(entries.len(), 1);
        let json = to_json(&entries);
        assert_eq!(
            json[0]["fieldsV1"],
            json!({"f:spec": {"f:template": {"f:spec": {"f:containers": {
                "k:{\"name\":\"app\"}": {
                    "f:env": {"k:{\"name\":\"X\"}": {"f:name": {}, "f:value": {}}},
                    "f:image": {},
                    "f:name": {}
                }
            }}}}}),
            "identity, server-set metadata and status are not tracked"
        );
        assert_eq!(json[0]["operation"], "Update");
        assert_eq!(json[0]["time"], "2024-01-01T00:00:00Z");
        // fieldsV1 parses back to the same set.
        let parsed = entries_of(&with_entries(obj, &entries)).unwrap();
        assert_eq!(parsed, entries);
    }

    #[test]
    fn an_update_takes_what_it_changed_and_everyone_loses_what_it_removed() {
        let first = deployment("a:1", json!([{"name": "X", "value": "1"}]));
        let created = update(&write("kubectl", "2024-01-01T00:00:00Z"), None, &first);
        let live = with_entries(first, &created);
        let mut next = live.clone();
        next["spec"]["template"]["spec"]["containers"][0]["image"] = json!("a:2");
        next["spec"]["template"]["spec"]["containers"][0]["env"] = json!([]);
        let entries = update(&write("ci", "2024-01-01T00:00:09Z"), Some(&live), &next);
        let by = |m: &str| {
            entries
                .iter()
                .find(|e| e.manager == m)
                .unwrap()
                .fields
                .clone()
        };
        let image: Path = [
            "f:spec",
            "f:template",
            "f:spec",
            "f:containers",
            "k:{\"name\":\"app\"}",
            "f:image",
        ]
        .map(str::to_owned)
        .to_vec();
        assert!(by("ci").contains(&image));
        assert!(!by("kubectl").contains(&image), "taken over");
        assert!(
            by("kubectl")
                .iter()
                .all(|p| !p.iter().any(|e| e == "f:env")),
            "the removed env items are nobody's"
        );
        // An update that changes nothing leaves managedFields alone, time included.
        let live = with_entries(next.clone(), &entries);
        let again = update(&write("ci", "2024-01-01T00:00:30Z"), Some(&live), &live);
        assert_eq!(again, entries);
    }

    #[test]
    fn a_node_owned_with_owned_children_is_written_with_a_dot() {
        let set: FieldSet = [
            vec!["f:data".to_owned()],
            vec!["f:data".to_owned(), "f:k".to_owned()],
        ]
        .into_iter()
        .collect();
        let v = fields_v1(&set);
        assert_eq!(v, json!({"f:data": {".": {}, "f:k": {}}}));
        let mut parsed = FieldSet::new();
        parse_fields(&v, &[], &mut parsed).unwrap();
        assert_eq!(parsed, set);
    }

    #[test]
    fn the_manager_comes_from_field_manager_or_the_user_agent() {
        assert_eq!(manager_of(Some("mine"), Some("kubectl/v1")), "mine");
        assert_eq!(
            manager_of(None, Some("kubectl/v1.33.0 (linux/amd64)")),
            "kubectl"
        );
        assert_eq!(manager_of(Some(""), Some("helm")), "helm");
        assert_eq!(manager_of(None, None), "unknown");
        assert_eq!(manager_of(None, Some("/x")), "unknown");
    }

    #[test]
    fn timestamps_alone_are_not_a_difference() {
        let a = json!([{"manager": "m", "operation": "Update", "time": "2024-01-01T00:00:00Z", "fieldsV1": {}}]);
        let b = json!([{"manager": "m", "operation": "Update", "time": "2024-01-01T00:00:05Z", "fieldsV1": {}}]);
        let c = json!([{"manager": "n", "operation": "Update", "time": "2024-01-01T00:00:05Z", "fieldsV1": {}}]);
        assert!(equal_but_for_time(&a, &b));
        assert!(!equal_but_for_time(&a, &c));
    }
}

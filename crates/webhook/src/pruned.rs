//! A review's `object` and `oldObject`, read only as far as the webhook looks into them.
//!
//! `object` is read whole but for `status` and `metadata.managedFields`, which nothing here
//! reads and which a real API server sends with every object (managedFields often as large as
//! the spec); they are skipped as they are read ([`Object`]).
//!
//! On UPDATE the rules need three annotations of the object as it was: the stamp and
//! `kubectl.kubernetes.io/restartedAt` on the pod template, and the unstamped marker on the
//! workload. `oldObject` is as large as `object` (half the review), and building it whole into a
//! [`Value`] (a map and a string for every member) was most of what parsing a review cost. Here
//! it is parsed into a [`Value`] that holds only the members on the way to those annotations
//! ([`kept`]); every other member is skipped as it is read, without being built. What
//! [`workload::stamp_and_marker`](confighash_core::workload::stamp_and_marker) and
//! [`workload::restarted_at`](confighash_core::workload::restarted_at) read of the result is what they
//! would read of the whole object:
//! - a kept member that is an object keeps, of its own members, only the kept ones; a kept member
//!   of any other type is kept whole, as are the annotation maps;
//! - of a member given twice, the last counts, as when the whole object is parsed;
//! - an `oldObject` that is not an object stays what it is (the rules then treat the review as a
//!   CREATE, as before).
//!
//! Skipped members are still read as JSON (a malformed review is refused as before), but their
//! numbers are checked for syntax only: one too large for a float (`1e400`, which no API server
//! sends) no longer makes the review malformed.

use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Which members of an object are kept.
#[derive(Debug)]
enum Keep {
    /// The member whole.
    All,
    /// Of an object, these members (each kept as its own [`Keep`] says) and no other; a value
    /// that is not an object, whole.
    Members(&'static [(&'static str, Keep)]),
    /// Of an object, every member but those in `skip`, those in `within` kept as their own
    /// [`Keep`] says, the others whole; a value that is not an object, whole.
    AllBut {
        skip: &'static [&'static str],
        within: &'static [(&'static str, Keep)],
    },
}

/// What the webhook reads of `object`: all of it but `status` and `metadata.managedFields`.
const OBJECT: Keep = Keep::AllBut {
    skip: &["status"],
    within: &[(
        "metadata",
        Keep::AllBut {
            skip: &["managedFields"],
            within: &[],
        },
    )],
};

/// What the rules read of `oldObject`: `metadata.annotations`, and the pod template's annotations
/// at every place a kind has its template (`spec.template`, a CronJob's
/// `spec.jobTemplate.spec.template`, and each configured kind's pointer).
fn kept() -> &'static Keep {
    use std::sync::RwLock;
    // Built again (once more kept for good) only when a kind is configured: a few times in a
    // process's life.
    static KEPT: RwLock<Option<(usize, &'static Keep)>> = RwLock::new(None);
    let count = confighash_core::kind::configured_count();
    if let Some((built, keep)) = *KEPT.read().unwrap_or_else(|e| e.into_inner())
        && built == count
    {
        return keep;
    }
    let mut cached = KEPT.write().unwrap_or_else(|e| e.into_inner());
    let kinds = confighash_core::kind::every_kind();
    let paths: Vec<&'static [&'static str]> = kinds.iter().map(|k| k.template_path()).collect();
    let keep: &'static Keep = Box::leak(Box::new(kept_for(&paths)));
    *cached = Some((count, keep));
    keep
}

/// The [`Keep`] of an object's `metadata.annotations` and of the template annotations at each
/// of `templates` (paths of keys).
fn kept_for(templates: &[&'static [&'static str]]) -> Keep {
    #[derive(Default)]
    struct Node {
        annotations: bool,
        children: std::collections::BTreeMap<&'static str, Node>,
    }
    fn into_keep(node: Node) -> Keep {
        let mut members: Vec<(&'static str, Keep)> = node
            .children
            .into_iter()
            .map(|(name, child)| (name, into_keep(child)))
            .collect();
        if node.annotations {
            members.push(("annotations", Keep::All));
        }
        Keep::Members(Box::leak(members.into_boxed_slice()))
    }
    let mut root = Node::default();
    root.children.entry("metadata").or_default().annotations = true;
    for path in templates {
        let mut here = &mut root;
        for token in path.iter().chain(&["metadata"]) {
            here = here.children.entry(token).or_default();
        }
        here.annotations = true;
    }
    into_keep(root)
}

/// `oldObject` with only the members the rules read ([`kept`]).
#[derive(Debug)]
pub struct OldObject(pub Value);

impl<'de> Deserialize<'de> for OldObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Pruned(kept()).deserialize(d).map(OldObject)
    }
}

/// `object` without `status` and `metadata.managedFields` ([`OBJECT`]).
#[derive(Debug)]
pub struct Object(pub Value);

impl<'de> Deserialize<'de> for Object {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Pruned(&OBJECT).deserialize(d).map(Object)
    }
}

/// Parses a value keeping what a [`Keep`] says.
struct Pruned(&'static Keep);

impl<'de> DeserializeSeed<'de> for Pruned {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        match self.0 {
            Keep::All => Value::deserialize(d),
            keep => d.deserialize_any(PrunedVisitor(keep)),
        }
    }
}

struct PrunedVisitor(&'static Keep);

impl<'de> Visitor<'de> for PrunedVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut kept = Map::new();
        while let Some(member) = map.next_key_seed(MemberName(self.0))? {
            match member {
                Member::Keep(name, keep) => {
                    let value = map.next_value_seed(Pruned(keep))?;
                    kept.insert(name.into_owned(), value);
                }
                Member::Skip => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Value::Object(kept))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Value, A::Error> {
        Value::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
}

/// What to do with a member, by its name.
enum Member<'a> {
    /// Keep it, under this name, as the [`Keep`] says.
    Keep(std::borrow::Cow<'a, str>, &'static Keep),
    Skip,
}

/// A member's name, read into what to do with the member: a name that is skipped is never
/// copied.
struct MemberName(&'static Keep);

impl<'de> DeserializeSeed<'de> for MemberName {
    type Value = Member<'static>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for MemberName {
    type Value = Member<'static>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a member name")
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        let find =
            |members: &'static [(&'static str, Keep)]| members.iter().find(|(name, _)| *name == v);
        Ok(match self.0 {
            Keep::All => Member::Keep(v.to_owned().into(), &Keep::All),
            Keep::Members(members) => match find(members) {
                Some((name, keep)) => Member::Keep((*name).into(), keep),
                None => Member::Skip,
            },
            Keep::AllBut { skip, within } => {
                if skip.contains(&v) {
                    Member::Skip
                } else if let Some((name, keep)) = find(within) {
                    Member::Keep((*name).into(), keep)
                } else {
                    Member::Keep(v.to_owned().into(), &Keep::All)
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use confighash_core::workload::{self, WorkloadKind};

    /// The built-in kinds and a configured one whose template is elsewhere.
    fn kinds() -> Vec<WorkloadKind> {
        let scaled_job =
            WorkloadKind::parse("keda.sh/v1alpha1/ScaledJob=/spec/jobTargetRef/template").unwrap();
        WorkloadKind::BUILT_IN
            .into_iter()
            .chain([scaled_job])
            .collect()
    }

    fn pruned(text: &str) -> Value {
        serde_json::from_str::<OldObject>(text).unwrap().0
    }

    /// The rules read the same of the pruned object as of the whole one, for every kind.
    fn reads_the_same(text: &str) {
        let kinds = kinds();
        let whole: Value = serde_json::from_str(text).unwrap();
        let pruned = pruned(text);
        assert_eq!(whole.is_object(), pruned.is_object(), "{text}");
        for kind in kinds {
            assert_eq!(
                workload::stamp_and_marker(kind, &whole),
                workload::stamp_and_marker(kind, &pruned),
                "{kind} {text}"
            );
            assert_eq!(
                workload::restarted_at(kind, &whole),
                workload::restarted_at(kind, &pruned),
                "{kind} {text}"
            );
        }
    }

    #[test]
    fn a_configured_kinds_template_annotations_are_kept() {
        let scaled_job =
            WorkloadKind::parse("keda.sh/v1alpha1/ScaledJob=/spec/jobTargetRef/template").unwrap();
        let text = json!({
            "metadata": {"name": "nightly"},
            "spec": {
                "pollingInterval": 30,
                "jobTargetRef": {
                    "parallelism": 1,
                    "template": {
                        "metadata": {"annotations": {"confighash.dev/checksum": "v2:abc:01"}},
                        "spec": {"containers": [{"name": "job", "image": "busybox"}]}
                    }
                }
            }
        })
        .to_string();
        let pruned = pruned(&text);
        assert_eq!(
            pruned.pointer("/spec/jobTargetRef"),
            Some(&json!({"template": {"metadata": {"annotations": {
                "confighash.dev/checksum": "v2:abc:01"
            }}}}))
        );
        assert_eq!(
            workload::stamp_and_marker(scaled_job, &pruned),
            (Some("v2:abc:01"), false)
        );
        reads_the_same(&text);
    }

    #[test]
    fn only_the_members_on_the_way_to_the_annotations_are_kept() {
        let text = json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "web",
                "labels": {"app": "web"},
                "annotations": {"confighash.dev/unstamped": "lookup-failed"},
                "managedFields": [{"manager": "kubectl"}]
            },
            "spec": {
                "replicas": 3,
                "template": {
                    "metadata": {
                        "labels": {"app": "web"},
                        "annotations": {
                            "confighash.dev/checksum": "v2:abc:00",
                            "kubectl.kubernetes.io/restartedAt": "2025-01-01T00:00:00Z"
                        }
                    },
                    "spec": {"containers": [{"name": "web", "image": "nginx"}]}
                }
            },
            "status": {"replicas": 3}
        })
        .to_string();
        assert_eq!(
            pruned(&text),
            json!({
                "metadata": {"annotations": {"confighash.dev/unstamped": "lookup-failed"}},
                "spec": {"template": {"metadata": {"annotations": {
                    "confighash.dev/checksum": "v2:abc:00",
                    "kubectl.kubernetes.io/restartedAt": "2025-01-01T00:00:00Z"
                }}}}
            })
        );
        reads_the_same(&text);
    }

    #[test]
    fn a_cron_jobs_template_is_kept_where_it_is() {
        reads_the_same(
            &json!({
                "metadata": {"annotations": {}},
                "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": {
                    "metadata": {"annotations": {"confighash.dev/checksum": "v2:abc:01"}},
                    "spec": {"containers": []}
                }}}}
            })
            .to_string(),
        );
    }

    #[test]
    fn what_the_whole_object_would_hold_the_pruned_one_holds_too() {
        for text in [
            // Not an object: a CREATE for the rules.
            "null",
            "\"web\"",
            "[1, {\"metadata\": {}}]",
            "42",
            // Kept members of other types stay whole.
            r#"{"metadata": "x", "spec": [1, 2]}"#,
            r#"{"spec": {"template": null}}"#,
            r#"{"spec": {"template": {"metadata": {"annotations": ["a"]}}}}"#,
            r#"{"spec": {"template": {"metadata": {"annotations": {"confighash.dev/checksum": 7}}}}}"#,
            // The last of a member given twice counts.
            r#"{"spec": {"template": {"metadata": {"annotations": {"confighash.dev/checksum": "v2:a:1"}}}},
                "spec": {"template": {"metadata": {"annotations": {"confighash.dev/checksum": "v2:b:2"}}}}}"#,
            r#"{"metadata": {"annotations": {"confighash.dev/unstamped": "x"}}, "metadata": {}}"#,
            // Names written with escapes are the same names.
            r#"{"sp\u0065c": {"template": {"metadata": {"annotations": {"confighash.dev/checksum": "v2:e:3"}}}}}"#,
            // Members skipped hold anything, nested deep.
            r#"{"status": {"a": [[[{"b": "c\"d"}]]], "e": -1.5e300}, "spec": {}}"#,
        ] {
            reads_the_same(text);
        }
    }

    /// `object` as the webhook reads it: the whole object but `status` and
    /// `metadata.managedFields`, members in their order, the last of duplicates counting.
    #[test]
    fn object_is_read_whole_but_status_and_managed_fields() {
        for text in [
            r#"{"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
                             "labels": {"confighash.dev/enabled": "true"}, "annotations": {"a": "b"}},
                "spec": {"template": {"metadata": {"annotations": {"confighash.dev/checksum": "v2:a:1"}},
                                      "spec": {"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": "x"}}]}]}},
                         "status": "a spec member of that name is kept"},
                "status": {"replicas": 3, "conditions": [{"type": "Available"}]}}"#,
            r#"{"metadata": "not an object", "status": 1}"#,
            r#"{"metadata": {"managedFields": 1, "name": "a"}, "metadata": {"name": "b", "managedFields": []}}"#,
            r#"{"st\u0061tus": {}, "kind": "CronJob"}"#,
            r#"[{"status": 1}]"#,
            "null",
        ] {
            let mut whole: Value = serde_json::from_str(text).unwrap();
            if let Some(o) = whole.as_object_mut() {
                o.shift_remove("status");
                if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.shift_remove("managedFields");
                }
            }
            let pruned = serde_json::from_str::<Object>(text).unwrap().0;
            assert_eq!(pruned, whole, "{text}");
            assert_eq!(
                serde_json::to_string(&pruned).unwrap(),
                serde_json::to_string(&whole).unwrap(),
                "members in the same order: {text}"
            );
        }
    }

    #[test]
    fn malformed_json_is_still_refused() {
        for text in [
            r#"{"status": [1, 2"#,
            r#"{"status": tru}"#,
            r#"{"spec": {"template": }}"#,
        ] {
            assert!(serde_json::from_str::<OldObject>(text).is_err(), "{text}");
            assert!(serde_json::from_str::<Object>(text).is_err(), "{text}");
        }
    }
}

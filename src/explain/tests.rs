//! The pure part of `confighash explain`: from read objects to verdicts, reasons and text.

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::events::v1::Event;
use serde_json::{Value, json};

use super::model::{self, Facts, KeyFacts, KeyOrigin, Read, RefObject, Verdict};
use super::observed;
use super::render;
use super::{WorkloadArg, parse_kind, parse_workload, resolve_kind};
use crate::core::checksum::{self, StampKey};
use crate::core::record::ObjectRecord;
use crate::core::refs::{ObjectKind, ObjectRef, References, Selection};
use crate::core::workload::Kinds;
use crate::core::workload::WorkloadKind;

const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";
const OTHER_KEY: &[u8] = b"fedcba9876543210fedcba9876543210";
const SECRET_VALUE: &str = "hunter2-do-not-print";

fn key() -> StampKey {
    StampKey::new(KEY.to_vec()).unwrap()
}

/// A Deployment using ConfigMap `app` (envFrom) and key `password` of Secret `db`.
fn deployment(labels: Value, annotations: Value, stamp: Option<&str>) -> Value {
    let template_annotations = match stamp {
        Some(s) => json!({"confighash.dev/checksum": s}),
        None => json!({}),
    };
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop", "labels": labels, "annotations": annotations, "generation": 2},
        "spec": {
            "replicas": 3,
            "template": {
                "metadata": {"annotations": template_annotations},
                "spec": {"containers": [{
                    "name": "app",
                    "image": "example/app:1",
                    "envFrom": [{"configMapRef": {"name": "app"}}],
                    "env": [{"name": "P", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}]
                }]}
            }
        },
        "status": {
            "observedGeneration": 2, "updatedReplicas": 3, "readyReplicas": 3, "availableReplicas": 3,
            "conditions": [{"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]
        }
    })
}

fn config_map(data: &[(&str, &str)], annotations: &[(&str, &str)]) -> RefObject {
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {
            "name": "app",
            "resourceVersion": "41",
            "annotations": annotations.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "managedFields": [
                {"manager": "kubectl-client-side-apply", "operation": "Update", "time": "2025-01-02T03:04:05Z"},
                {"manager": "argocd-controller", "operation": "Apply", "time": "2025-03-01T00:00:00Z"}
            ]
        },
        "data": data.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
    }))
    .unwrap();
    RefObject {
        entry: ObjectRecord::config_map(&cm).unwrap(),
        resource_version: cm.metadata.resource_version.clone(),
        field_managers: observed::field_managers(cm.metadata.managed_fields.as_deref()),
        progressive: confighash_watcher::index::is_progressive(cm.metadata.annotations.as_ref()),
    }
}

fn secret(value: &str) -> RefObject {
    let s: Secret = serde_json::from_value(json!({
        "metadata": {"name": "db", "resourceVersion": "7"},
        "stringData": {"password": value, "user": "app"},
    }))
    .unwrap();
    RefObject {
        entry: ObjectRecord::secret(&s),
        resource_version: s.metadata.resource_version.clone(),
        field_managers: Vec::new(),
        progressive: false,
    }
}

fn opted_in() -> BTreeMap<String, String> {
    BTreeMap::from([("confighash.dev/enabled".to_owned(), "true".to_owned())])
}

fn installed_webhook() -> MutatingWebhookConfiguration {
    serde_json::from_value(json!({
        "metadata": {"name": "confighash"},
        "webhooks": [{
            "name": "stamp.confighash.dev",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "clientConfig": {"url": "https://confighash.example/mutate"},
            "rules": [{"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                       "resources": ["deployments", "statefulsets", "daemonsets"], "scope": "Namespaced"}],
            "namespaceSelector": {
                "matchLabels": {"confighash.dev/enabled": "true"},
                "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["confighash", "kube-system"]}]
            },
            "objectSelector": {"matchExpressions": [{"key": "confighash.dev/enabled", "operator": "NotIn", "values": ["false"]}]}
        }, {
            "name": "workload.confighash.dev",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "clientConfig": {"url": "https://confighash.example/mutate"},
            "rules": [{"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                       "resources": ["deployments", "statefulsets", "daemonsets"], "scope": "Namespaced"}],
            "namespaceSelector": {
                "matchExpressions": [
                    {"key": "confighash.dev/enabled", "operator": "NotIn", "values": ["true"]},
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["confighash", "kube-system"]}
                ]
            },
            "objectSelector": {"matchLabels": {"confighash.dev/enabled": "true"}}
        }]
    }))
    .unwrap()
}

/// An opted-in namespace, the installed webhook, the key read from its Secret, both references
/// found, no Events; the workload as given.
fn facts(object: Value) -> Facts {
    Facts {
        kind: WorkloadKind::DEPLOYMENT,
        resource: "deployments".into(),
        namespace: "shop".into(),
        name: "web".into(),
        object,
        namespace_labels: Read::Found(opted_in()),
        install_namespace: "confighash".into(),
        webhook_name: "confighash".into(),
        webhook: Read::Found(installed_webhook()),
        key: KeyFacts {
            source: KeyOrigin::Secret {
                namespace: "confighash".into(),
                name: "confighash-key".into(),
            },
            key: Read::Found(key()),
        },
        references: BTreeMap::from([
            (
                ObjectRef::new(ObjectKind::ConfigMap, "app"),
                Read::Found(config_map(&[("mode", "fast")], &[])),
            ),
            (
                ObjectRef::new(ObjectKind::Secret, "db"),
                Read::Found(secret(SECRET_VALUE)),
            ),
        ]),
        events: Read::Found(Vec::new()),
    }
}

/// The stamp the workload of [`facts`] should carry, as explain computes it.
fn expected(facts: &Facts) -> String {
    model::explain(facts).unwrap().expected_stamp.unwrap()
}

fn stamped(stamp: &str) -> Facts {
    facts(deployment(json!({}), json!({}), Some(stamp)))
}

fn unstamped() -> Facts {
    facts(deployment(json!({}), json!({}), None))
}

fn verdict(f: &Facts) -> (Verdict, String) {
    let e = model::explain(f).unwrap();
    (e.verdict, e.reason)
}

#[test]
fn a_stamp_equal_to_the_expected_one_is_up_to_date() {
    let stamp = expected(&unstamped());
    assert!(stamp.starts_with(&format!("v2:{}:", key().id())), "{stamp}");
    let e = model::explain(&stamped(&stamp)).unwrap();
    assert_eq!(e.verdict, Verdict::UpToDate, "{}", e.reason);
    assert_eq!(e.verdict.exit_code(), 0);
    assert_eq!(e.stamp.class, "current");
    assert_eq!(e.stamp.recipe.as_deref(), Some("v2"));
    assert_eq!(e.expected_stamp.as_deref(), Some(stamp.as_str()));
}

#[test]
fn the_expected_stamp_is_the_recipe_over_the_references_read() {
    // The recipe computed straight from the objects, as the webhook would.
    let f = unstamped();
    let mut refs = References::default();
    refs.add(ObjectKind::ConfigMap, "app", Selection::Whole, false);
    refs.add(
        ObjectKind::Secret,
        "db",
        Selection::Keys(["password".to_owned()].into()),
        false,
    );
    let objects = f.references.clone();
    let direct = checksum::compute_stamp(Some(&key()), "shop", &refs, |r| match objects.get(r) {
        Some(Read::Found(o)) => checksum::RefState::Present(&o.entry.digest),
        _ => checksum::RefState::Absent,
    });
    assert_eq!(expected(&f), direct.to_string());
}

#[test]
fn a_current_stamp_over_changed_config_is_stale() {
    let old = expected(&unstamped());
    let mut f = stamped(&old);
    f.references.insert(
        ObjectRef::new(ObjectKind::ConfigMap, "app"),
        Read::Found(config_map(&[("mode", "slow")], &[])),
    );
    let (v, reason) = verdict(&f);
    assert_eq!(v, Verdict::Stale);
    assert_eq!(v.exit_code(), 1);
    assert!(reason.contains("not visible from the API"), "{reason}");
}

#[test]
fn a_v1_stamp_of_the_current_key_is_checked_under_v1() {
    let f = unstamped();
    let info = match crate::core::workload::analyze(WorkloadKind::DEPLOYMENT, &f.object).unwrap() {
        crate::core::workload::Analysis::Workload(info) => info,
        _ => unreachable!(),
    };
    let objects = f.references.clone();
    let v1 = checksum::compute_stamp_v1(Some(&key()), &info.refs, |r| match objects.get(r) {
        Some(Read::Found(o)) => checksum::RefState::Present(&o.entry.digest),
        _ => checksum::RefState::Absent,
    });
    let e = model::explain(&stamped(v1.as_str())).unwrap();
    assert_eq!(e.verdict, Verdict::UpToDate, "{}", e.reason);
    assert_eq!(e.stamp.recipe.as_deref(), Some("v1"));
    assert!(e.reason.contains("recipe v1"), "{}", e.reason);

    let mut changed = stamped(v1.as_str());
    changed.references.insert(
        ObjectRef::new(ObjectKind::ConfigMap, "app"),
        Read::Found(config_map(&[("mode", "slow")], &[])),
    );
    assert_eq!(verdict(&changed).0, Verdict::Stale);
}

#[test]
fn unstamped_workloads_say_why_by_their_marker() {
    let (v, reason) = verdict(&unstamped());
    assert_eq!(v, Verdict::Unstamped);
    assert!(reason.contains("predates confighash"), "{reason}");

    for (marker, says) in [
        ("lookup-failed", "reconcile"),
        ("too-many-references", "never retried"),
        ("something-else", "something-else"),
    ] {
        let f = facts(deployment(
            json!({}),
            json!({"confighash.dev/unstamped": marker}),
            None,
        ));
        let e = model::explain(&f).unwrap();
        assert_eq!(e.verdict, Verdict::Unstamped, "{marker}");
        assert_eq!(e.stamp.marker.as_deref(), Some(marker));
        assert!(e.reason.contains(says), "{marker}: {}", e.reason);
    }
}

#[test]
fn an_unstamped_workload_needs_neither_the_key_nor_its_references() {
    let mut f = unstamped();
    f.key.key = Read::Forbidden;
    f.references.clear();
    assert_eq!(verdict(&f).0, Verdict::Unstamped);
}

#[test]
fn foreign_stamps_say_what_makes_them_foreign() {
    let other = StampKey::new(OTHER_KEY.to_vec()).unwrap();
    let digest = "0".repeat(64);
    let cases = [
        (
            format!("v2:{}:{digest}", other.id()),
            "other-key",
            format!("made with key {}", other.id()),
        ),
        (
            format!("v2:plain:{digest}"),
            "other-key",
            "without a key".to_owned(),
        ),
        (
            format!("v9:{}:{digest}", key().id()),
            "unknown-recipe",
            "recipe v9".to_owned(),
        ),
        (
            "config-v17".to_owned(),
            "malformed",
            "not of the form".to_owned(),
        ),
        (
            format!("v2:{}:{}", key().id(), "A".repeat(64)),
            "malformed",
            "not of the form".to_owned(),
        ),
    ];
    for (stamp, why, says) in cases {
        let e = model::explain(&stamped(&stamp)).unwrap();
        assert_eq!(e.verdict, Verdict::Foreign, "{stamp}");
        assert_eq!(e.stamp.class, "foreign", "{stamp}");
        assert_eq!(e.stamp.foreign, Some(why), "{stamp}");
        assert!(e.reason.contains(&says), "{stamp}: {}", e.reason);
        assert!(e.reason.contains("kubectl rollout restart"), "{}", e.reason);
    }
}

#[test]
fn without_the_key_a_well_formed_stamp_cannot_be_judged() {
    let stamp = expected(&unstamped());
    let mut f = stamped(&stamp);
    f.key.key = Read::Forbidden;
    let e = model::explain(&f).unwrap();
    assert_eq!(e.verdict, Verdict::Unknown);
    assert_eq!(e.verdict.exit_code(), 2);
    assert_eq!(e.stamp.class, "unverified");
    assert_eq!(e.expected_stamp, None);
    assert!(
        e.reason
            .contains("needs read access (get) to the key Secret confighash/confighash-key"),
        "{}",
        e.reason
    );
    assert_eq!(e.key.state, "forbidden");

    f.key.key = Read::Absent;
    let (_, reason) = verdict(&f);
    assert!(reason.contains("does not exist"), "{reason}");

    // But a stamp that no installation makes is foreign whatever the key.
    let mut plain = stamped(&format!("v2:plain:{}", "1".repeat(64)));
    plain.key.key = Read::Forbidden;
    assert_eq!(verdict(&plain).0, Verdict::Foreign);
}

#[test]
fn a_reference_that_cannot_be_read_leaves_the_verdict_unknown() {
    let stamp = expected(&unstamped());
    let mut f = stamped(&stamp);
    f.references
        .insert(ObjectRef::new(ObjectKind::Secret, "db"), Read::Forbidden);
    let e = model::explain(&f).unwrap();
    assert_eq!(e.verdict, Verdict::Unknown);
    assert!(
        e.reason
            .contains("reading Secret db needs read access (get secrets in namespace shop)"),
        "{}",
        e.reason
    );
    assert_eq!(e.references[1].state, "forbidden");

    // Over the read cap nothing is read.
    f.references.clear();
    let (v, reason) = verdict(&f);
    assert_eq!(v, Verdict::Unknown);
    assert!(reason.contains("were not read"), "{reason}");
}

#[test]
fn a_missing_required_reference_keeps_the_stamp() {
    let stamp = expected(&unstamped());
    let mut f = stamped(&stamp);
    f.references
        .insert(ObjectRef::new(ObjectKind::ConfigMap, "app"), Read::Absent);
    let e = model::explain(&f).unwrap();
    assert_eq!(e.verdict, Verdict::MissingReference, "{}", e.reason);
    assert!(
        e.reason.contains("required ConfigMap app does not exist"),
        "{}",
        e.reason
    );
    assert_eq!(e.references[0].state, "absent");
}

#[test]
fn the_ignore_annotation_leaves_an_object_out_as_the_recipe_does() {
    let mut f = unstamped();
    f.references.insert(
        ObjectRef::new(ObjectKind::ConfigMap, "app"),
        Read::Found(config_map(
            &[("mode", "fast")],
            &[("confighash.dev/ignore", "true")],
        )),
    );
    let with_ignored = expected(&f);
    // The same as a workload that does not reference it at all.
    let mut refs = References::default();
    refs.add(
        ObjectKind::Secret,
        "db",
        Selection::Keys(["password".to_owned()].into()),
        false,
    );
    let s = secret(SECRET_VALUE);
    let direct = checksum::compute_stamp(Some(&key()), "shop", &refs, |_| {
        checksum::RefState::Present(&s.entry.digest)
    });
    assert_eq!(with_ignored, direct.to_string());
    let e = model::explain(&f).unwrap();
    assert_eq!(e.references[0].state, "ignored");

    // Any other value of the annotation counts the object in.
    f.references.insert(
        ObjectRef::new(ObjectKind::ConfigMap, "app"),
        Read::Found(config_map(
            &[("mode", "fast")],
            &[("confighash.dev/ignore", "yes")],
        )),
    );
    assert_eq!(expected(&f), expected(&unstamped()));
}

#[test]
fn selection_gates_come_before_the_stamp() {
    let stamp = expected(&unstamped());

    let out = facts(deployment(
        json!({"confighash.dev/enabled": "false"}),
        json!({}),
        Some(&stamp),
    ));
    let e = model::explain(&out).unwrap();
    assert_eq!(e.verdict, Verdict::OptedOut);
    assert!(e.opted_out);
    assert_eq!(e.webhook.selected, Some(false));

    let mut f = stamped(&stamp);
    f.namespace_labels = Read::Found(BTreeMap::new());
    let e = model::explain(&f).unwrap();
    assert_eq!(e.verdict, Verdict::NotSelected);
    assert!(
        e.reason.contains("namespace shop is not opted in"),
        "{}",
        e.reason
    );
    assert!(
        e.reason.contains("neither stamps nor touches"),
        "{}",
        e.reason
    );
    assert_eq!(e.namespace_info.opted_in, Some(false));

    // A webhook configuration that selects it anyway: the watcher still does not act there.
    let mut config = installed_webhook();
    config.webhooks.as_mut().unwrap()[0].namespace_selector = None;
    f.webhook = Read::Found(config);
    let (v, reason) = verdict(&f);
    assert_eq!(v, Verdict::NotSelected);
    assert!(reason.contains("the watcher never touches"), "{reason}");

    let mut f = stamped(&stamp);
    f.webhook = Read::Absent;
    let (v, reason) = verdict(&f);
    assert_eq!(v, Verdict::NotSelected);
    assert!(
        reason.contains("MutatingWebhookConfiguration confighash does not exist"),
        "{reason}"
    );

    let mut f = stamped(&stamp);
    let mut config = installed_webhook();
    config.webhooks.as_mut().unwrap()[0].rules.as_mut().unwrap()[0].operations =
        Some(vec!["CREATE".into()]);
    f.webhook = Read::Found(config);
    let (v, reason) = verdict(&f);
    assert_eq!(v, Verdict::NotSelected);
    assert!(reason.contains("do not cover UPDATE"), "{reason}");

    let mut f = stamped(&stamp);
    f.namespace = "confighash".into();
    assert_eq!(verdict(&f).0, Verdict::NotSelected);

    let rollout = Facts {
        kind: WorkloadKind::ROLLOUT,
        object: json!({"metadata": {"name": "web"}, "spec": {"workloadRef": {"kind": "Deployment", "name": "web"}}}),
        ..unstamped()
    };
    let (v, reason) = verdict(&rollout);
    assert_eq!(v, Verdict::NotSelected);
    assert!(reason.contains("workloadRef"), "{reason}");
}

#[test]
fn what_could_not_be_read_does_not_decide() {
    let stamp = expected(&unstamped());
    let mut f = stamped(&stamp);
    f.namespace_labels = Read::Forbidden;
    f.webhook = Read::Forbidden;
    let e = model::explain(&f).unwrap();
    assert_eq!(e.verdict, Verdict::UpToDate);
    assert_eq!(e.namespace_info.opted_in, None);
    assert_eq!(e.namespace_info.state, "forbidden");
    assert_eq!(e.webhook.selected, None);
    let text = render::text(&e);
    assert!(
        text.contains("reading the Namespace is forbidden"),
        "{text}"
    );
    assert!(
        text.contains("not known: reading it is forbidden"),
        "{text}"
    );
}

#[test]
fn the_namespace_name_label_is_there_for_selectors() {
    let stamp = expected(&unstamped());
    let mut f = stamped(&stamp);
    let mut config = installed_webhook();
    config.webhooks.as_mut().unwrap()[0].namespace_selector = Some(
        serde_json::from_value(json!({"matchLabels": {"kubernetes.io/metadata.name": "shop"}}))
            .unwrap(),
    );
    f.webhook = Read::Found(config);
    assert_eq!(verdict(&f).0, Verdict::UpToDate);
}

#[test]
fn references_show_selection_state_and_field_managers() {
    let e = model::explain(&unstamped()).unwrap();
    let cm = &e.references[0];
    assert_eq!((cm.kind, cm.name.as_str()), ("ConfigMap", "app"));
    assert_eq!(cm.keys, None);
    assert_eq!(cm.state, "found");
    assert_eq!(cm.resource_version.as_deref(), Some("41"));
    assert_eq!(cm.key_count, Some(1));
    assert_eq!(cm.bytes, Some(4), "the decoded bytes of its values");
    assert_eq!(
        cm.field_managers
            .iter()
            .map(|m| (m.manager.as_str(), m.last_write.as_deref().unwrap()))
            .collect::<Vec<_>>(),
        [
            ("argocd-controller", "2025-03-01T00:00:00Z"),
            ("kubectl-client-side-apply", "2025-01-02T03:04:05Z")
        ]
    );
    let s = &e.references[1];
    assert_eq!(s.keys.as_deref(), Some(&["password".to_owned()][..]));
    assert!(s.absent_keys.is_empty());
    assert!(!s.optional);

    let text = render::text(&e);
    assert!(
        text.contains(
            "ConfigMap app: whole object, required: found, 1 key (4 bytes), resourceVersion 41"
        ),
        "{text}"
    );
    assert!(
        text.contains("when the manager last wrote a field it owns, not necessarily the data"),
        "{text}"
    );
    assert!(
        text.contains("argocd-controller (Apply): 2025-03-01T00:00:00Z"),
        "{text}"
    );
}

#[test]
fn secret_content_never_reaches_the_output() {
    let e = model::explain(&unstamped()).unwrap();
    let value_digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(SECRET_VALUE));
    for out in [render::text(&e), serde_json::to_string(&e).unwrap()] {
        assert!(!out.contains(SECRET_VALUE), "{out}");
        assert!(!out.contains(&value_digest), "{out}");
    }
}

#[test]
fn the_json_document_has_its_documented_fields() {
    let stamp = expected(&unstamped());
    let e = model::explain(&stamped(&stamp)).unwrap();
    let v = serde_json::to_value(&e).unwrap();
    assert_eq!(v["verdict"], "up-to-date");
    assert_eq!(v["kind"], "Deployment");
    assert_eq!(v["namespaceOptIn"]["optedIn"], true);
    assert_eq!(v["webhook"]["selected"], true);
    assert_eq!(v["webhook"]["entries"][0]["name"], "stamp.confighash.dev");
    assert_eq!(v["stamp"]["class"], "current");
    assert_eq!(v["stamp"]["keyId"], key().id());
    assert_eq!(v["expectedStamp"], stamp.as_str());
    assert_eq!(v["key"]["state"], "read");
    assert_eq!(v["references"][0]["resourceVersion"], "41");
    assert_eq!(
        v["references"][0]["fieldManagers"][0]["lastWrite"],
        "2025-03-01T00:00:00Z"
    );
    assert_eq!(v["rollout"]["desired"], 3);
    assert_eq!(v["rollout"]["progressing"], "True (NewReplicaSetAvailable)");
    assert_eq!(v["events"]["items"], json!([]));
    for field in ["reason", "optedOut", "rejectedReferences"] {
        assert!(v.get(field).is_some(), "{field}");
    }
}

fn event(reason: &str, controller: &str, name: &str, time: &str, count: Option<i32>) -> Event {
    let mut e = json!({
        "metadata": {"name": format!("{name}.{time}")},
        "eventTime": time,
        "reportingController": controller,
        "reportingInstance": "confighash-0",
        "action": "Touch",
        "reason": reason,
        "type": "Normal",
        "note": format!("{reason} at {time}"),
        "regarding": {"kind": "Deployment", "namespace": "shop", "name": name}
    });
    if let Some(c) = count {
        e["series"] = json!({"count": c, "lastObservedTime": time});
    }
    serde_json::from_value(e).unwrap()
}

#[test]
fn only_confighash_events_about_the_workload_are_shown_newest_last() {
    let t = |m: u32| format!("2025-01-01T00:{m:02}:00.000000Z");
    let mut events = vec![
        event("ConfigChanged", "confighash", "web", &t(1), None),
        event("ConfigChanged", "confighash", "other", &t(2), None),
        event(
            "ScalingReplicaSet",
            "deployment-controller",
            "web",
            &t(3),
            None,
        ),
        event("ConfigChanged", "someone-else", "web", &t(4), None),
        event("TouchFailed", "confighash", "web", &t(5), Some(3)),
    ];
    let found = observed::recorded_events(&events, WorkloadKind::DEPLOYMENT, "shop", "web");
    assert_eq!(
        found
            .iter()
            .map(|e| (e.reason.as_str(), e.time.as_deref().unwrap()))
            .collect::<Vec<_>>(),
        [
            ("ConfigChanged", "2025-01-01T00:01:00Z"),
            ("TouchFailed", "2025-01-01T00:05:00Z")
        ]
    );
    assert_eq!(found[1].count, Some(3));
    // Another kind of the same name is another object.
    assert!(
        observed::recorded_events(&events, WorkloadKind::STATEFUL_SET, "shop", "web").is_empty()
    );

    for m in 10..20 {
        events.push(event("ConfigChanged", "confighash", "web", &t(m), None));
    }
    let found = observed::recorded_events(&events, WorkloadKind::DEPLOYMENT, "shop", "web");
    assert_eq!(found.len(), observed::MAX_EVENTS);
    assert_eq!(
        found.last().unwrap().time.as_deref(),
        Some("2025-01-01T00:19:00Z")
    );

    let mut f = unstamped();
    f.events = Read::Found(events);
    let text = render::text(&model::explain(&f).unwrap());
    assert!(
        text.contains("2025-01-01T00:19:00Z Normal ConfigChanged: ConfigChanged at"),
        "{text}"
    );
}

#[test]
fn rollout_state_by_kind() {
    let d = observed::rollout(
        WorkloadKind::DEPLOYMENT,
        &deployment(json!({}), json!({}), None),
    );
    assert_eq!(d.generation, Some(2));
    assert_eq!(d.observed_generation, Some(2));
    assert_eq!(
        (d.desired, d.updated, d.ready, d.available),
        (Some(3), Some(3), Some(3), Some(3))
    );

    let ds = observed::rollout(
        WorkloadKind::DAEMON_SET,
        &json!({"metadata": {"generation": 4}, "spec": {"updateStrategy": {"type": "OnDelete"}},
                "status": {"observedGeneration": 3, "desiredNumberScheduled": 5, "updatedNumberScheduled": 2}}),
    );
    assert_eq!((ds.desired, ds.updated), (Some(5), Some(2)));
    let text = render::text(&model::explain(&Facts {
        kind: WorkloadKind::DAEMON_SET,
        object: {
            let mut o = deployment(json!({}), json!({}), None);
            o["spec"]["updateStrategy"] = json!({"type": "OnDelete"});
            o["status"] = json!({"observedGeneration": 1, "desiredNumberScheduled": 5, "updatedNumberScheduled": 2});
            o
        },
        ..unstamped()
    })
    .unwrap());
    assert!(text.contains("generation 2, observed 1"), "{text}");
    assert!(text.contains("5 desired, 2 updated"), "{text}");
    assert!(
        text.contains("OnDelete: pods take a new template only when deleted"),
        "{text}"
    );

    let cj = observed::rollout(
        WorkloadKind::CRON_JOB,
        &json!({"status": {"lastScheduleTime": "2025-01-01T00:00:00Z"}}),
    );
    assert_eq!(
        cj.last_schedule_time.as_deref(),
        Some("2025-01-01T00:00:00Z")
    );
    assert_eq!(cj.suspended, Some(false));
    assert_eq!(cj.desired, None);

    let ro = observed::rollout(
        WorkloadKind::ROLLOUT,
        &json!({"spec": {"replicas": 2}, "status": {"phase": "Healthy"}}),
    );
    assert_eq!(ro.phase.as_deref(), Some("Healthy"));
}

#[test]
fn a_workload_that_is_not_one_is_an_error_not_a_panic() {
    let f = facts(json!({"metadata": {"name": "web"}, "spec": {"template": "nope"}}));
    let e = model::explain(&f).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("Deployment shop/web cannot be read as a workload: spec.template"),
        "{e}"
    );
}

#[test]
fn the_table_lines_up_and_shortens_stamps() {
    let stamp = expected(&unstamped());
    let mut rows = vec![
        render::Row::of(&model::explain(&stamped(&stamp)).unwrap()),
        render::Row::of(&model::explain(&unstamped()).unwrap()),
    ];
    rows[1].name = "a-much-longer-name".into();
    rows[1].marker = Some("lookup-failed".into());
    let table = render::table(&rows);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3);
    assert!(
        lines[0].starts_with("NAMESPACE   KIND         NAME                 VERDICT      STAMP"),
        "{table}"
    );
    let short = format!("{}…", &stamp[..stamp.len() - 52]);
    assert!(lines[1].ends_with(&short), "{table}");
    assert!(
        lines[2].ends_with("<none> (marker lookup-failed)"),
        "{table}"
    );
    // Columns start at the same place on every line.
    let col = lines[0].find("VERDICT").unwrap();
    assert_eq!(&lines[1][col..col + 10], "up-to-date");
    assert_eq!(&lines[2][col..col + 9], "unstamped");
}

#[test]
fn kinds_by_kubectl_names() {
    for (s, kind) in [
        ("deploy", WorkloadKind::DEPLOYMENT),
        ("Deployment", WorkloadKind::DEPLOYMENT),
        ("deployments.apps", WorkloadKind::DEPLOYMENT),
        ("deployments.v1.apps", WorkloadKind::DEPLOYMENT),
        ("sts", WorkloadKind::STATEFUL_SET),
        ("statefulsets", WorkloadKind::STATEFUL_SET),
        ("ds", WorkloadKind::DAEMON_SET),
        ("daemonset", WorkloadKind::DAEMON_SET),
        ("cj", WorkloadKind::CRON_JOB),
        ("cronjobs.batch", WorkloadKind::CRON_JOB),
        ("rollout", WorkloadKind::ROLLOUT),
        ("rollouts", WorkloadKind::ROLLOUT),
        ("rollouts.argoproj.io", WorkloadKind::ROLLOUT),
    ] {
        assert_eq!(parse_kind(&Kinds::built_in(), s), Some(kind), "{s}");
    }
    for s in ["pod", "job", "deployments.batch", "", "svc", "cloneset"] {
        assert_eq!(parse_kind(&Kinds::built_in(), s), None, "{s}");
    }
    let clone_set = WorkloadKind::parse("apps.kruise.io/v1alpha1/CloneSet=/spec/template").unwrap();
    let kinds = Kinds::with_configured([clone_set]).unwrap();
    for s in [
        "cloneset",
        "CloneSet",
        "clonesets",
        "clonesets.apps.kruise.io",
        "clonesets.v1alpha1.apps.kruise.io",
    ] {
        assert_eq!(parse_kind(&kinds, s), Some(clone_set), "{s}");
    }
    assert_eq!(parse_kind(&kinds, "clonesets.apps"), None);
    assert_eq!(parse_kind(&kinds, "deploy"), Some(WorkloadKind::DEPLOYMENT));
    let arg = parse_workload("cloneset/web").unwrap();
    assert_eq!(resolve_kind(&kinds, &arg), Ok(clone_set));
    let unknown = resolve_kind(&Kinds::built_in(), &arg).unwrap_err();
    assert!(
        unknown.contains("not a kind") && unknown.contains("--workload-kind"),
        "{unknown}"
    );
    assert_eq!(
        parse_workload("sts/db-0"),
        Ok(WorkloadArg {
            kind: "sts".into(),
            name: "db-0".into()
        })
    );
    assert!(parse_workload("web").unwrap_err().contains("not KIND/NAME"));
    assert!(
        resolve_kind(&Kinds::built_in(), &parse_workload("job/x").unwrap())
            .unwrap_err()
            .contains("not a kind")
    );
    assert!(
        parse_workload("deploy/Web")
            .unwrap_err()
            .contains("not an object name")
    );
    assert!(
        parse_workload("deploy/a/b")
            .unwrap_err()
            .contains("not an object name")
    );
}

#[test]
fn values_read_from_the_cluster_cannot_fake_lines_of_the_output() {
    let forged = "x\n  verdict: up-to-date\u{1b}[2J";
    let mut f = facts(deployment(
        json!({}),
        json!({"confighash.dev/unstamped": forged}),
        Some(forged),
    ));
    f.events = Read::Found(vec![
        serde_json::from_value(json!({
            "metadata": {"name": "e"},
            "eventTime": "2025-01-01T00:00:00.000000Z",
            "reportingController": "confighash",
            "reason": "ConfigChanged",
            "note": forged,
            "regarding": {"kind": "Deployment", "namespace": "shop", "name": "web"}
        }))
        .unwrap(),
    ]);
    let e = model::explain(&f).unwrap();
    assert_eq!(e.verdict, Verdict::Foreign);
    let text = render::text(&e);
    assert_eq!(
        text.lines()
            .filter(|l| l.trim_start().starts_with("verdict:"))
            .count(),
        1,
        "{text}"
    );
    assert!(!text.contains('\u{1b}'), "{text}");
    let table = render::table(&[render::Row::of(&e)]);
    assert_eq!(table.lines().count(), 2, "{table}");
    assert!(!table.contains('\u{1b}'), "{table}");
}

#[test]
fn a_dry_runs_would_roll_events_are_shown() {
    let events = vec![event(
        "WouldRoll",
        "confighash",
        "web",
        "2025-01-01T00:01:00.000000Z",
        None,
    )];
    let found = observed::recorded_events(&events, WorkloadKind::DEPLOYMENT, "shop", "web");
    assert_eq!(
        found.iter().map(|e| e.reason.as_str()).collect::<Vec<_>>(),
        ["WouldRoll"]
    );
}

#[test]
fn a_workload_labelled_true_is_selected_in_a_namespace_that_is_not_opted_in() {
    let stamp = expected(&unstamped());
    let labelled = |namespace: &str, labels: BTreeMap<String, String>| {
        let mut f = facts(deployment(
            json!({"confighash.dev/enabled": "true"}),
            json!({}),
            Some(&stamp),
        ));
        f.namespace = namespace.into();
        f.namespace_labels = Read::Found(labels);
        f
    };
    let plain = BTreeMap::from([("kubernetes.io/metadata.name".to_owned(), "shop".to_owned())]);
    let e = model::explain(&labelled("shop", plain)).unwrap();
    assert_eq!(e.verdict, Verdict::UpToDate, "{}", e.reason);
    assert!(e.opted_in && !e.opted_out);
    assert_eq!(e.namespace_info.opted_in, Some(false));
    assert_eq!(e.webhook.selected, Some(true));
    let selected: Vec<(&str, Option<bool>)> = e
        .webhook
        .entries
        .iter()
        .map(|entry| (entry.name.as_str(), entry.selected))
        .collect();
    assert_eq!(
        selected,
        [
            ("stamp.confighash.dev", Some(false)),
            ("workload.confighash.dev", Some(true))
        ]
    );
    let text = render::text(&e);
    assert!(
        text.contains("workload: opted in (confighash.dev/enabled=true)"),
        "{text}"
    );
    assert!(text.contains("namespace shop: not opted in"), "{text}");
    assert_eq!(
        serde_json::to_value(&e).unwrap()["optedIn"],
        json!(true),
        "in the JSON document"
    );

    // In kube-system the label counts for nothing.
    let system = BTreeMap::from([(
        "kubernetes.io/metadata.name".to_owned(),
        "kube-system".to_owned(),
    )]);
    let e = model::explain(&labelled("kube-system", system)).unwrap();
    assert_eq!(e.verdict, Verdict::NotSelected, "{}", e.reason);
    assert_eq!(e.webhook.selected, Some(false));
}

/// The WaveHalted Event confighash records on ConfigMap `app` for the content of `rv`.
fn wave_halted_event(rv: &str) -> Event {
    serde_json::from_value(json!({
        "metadata": {"name": format!("app.{rv}"), "creationTimestamp": "2025-01-01T00:00:00Z"},
        "eventTime": "2025-01-01T00:00:00.000000Z",
        "reportingController": "confighash",
        "reportingInstance": "confighash-0",
        "action": "Rollout",
        "reason": "WaveHalted",
        "type": "Warning",
        "note": format!("the progressive wave of the change of ConfigMap app (resourceVersion {rv}) halted at Deployment shop/api: pod api-1: container app restarted once; 4 dependents wait, untouched, for the next change of its content"),
        "regarding": {"kind": "ConfigMap", "namespace": "shop", "name": "app"}
    }))
    .unwrap()
}

#[test]
fn a_stale_workload_of_a_progressive_config_map_waits_for_its_batch_or_behind_a_halted_wave() {
    let old = expected(&unstamped());
    let mut f = stamped(&old);
    let progressive = [("confighash.dev/rollout", "progressive")];
    f.references.insert(
        ObjectRef::new(ObjectKind::ConfigMap, "app"),
        Read::Found(config_map(&[("mode", "slow")], &progressive)),
    );
    let (v, reason) = verdict(&f);
    assert_eq!(v, Verdict::Stale);
    assert!(
        reason.contains("ConfigMap app rolls its dependents in progressive waves"),
        "{reason}"
    );
    // A halt of an earlier content of the object is not this one's.
    f.events = Read::Found(vec![wave_halted_event("40")]);
    assert!(
        verdict(&f).1.contains("when its batch comes"),
        "{}",
        verdict(&f).1
    );
    // The object is at resourceVersion 41 (config_map's): halted on this content.
    f.events = Read::Found(vec![wave_halted_event("40"), wave_halted_event("41")]);
    let (v, reason) = verdict(&f);
    assert_eq!(v, Verdict::Stale);
    assert!(
        reason.contains("It waits behind the halted progressive wave of ConfigMap app")
            && reason.contains("(resourceVersion 41) halted at Deployment shop/api"),
        "{reason}"
    );
    // Up to date, nothing is said of waves.
    let mut current = stamped(&old);
    current.events = Read::Found(vec![wave_halted_event("41")]);
    let (v, reason) = verdict(&current);
    assert_eq!(v, Verdict::UpToDate);
    assert!(!reason.contains("wave"), "{reason}");
}

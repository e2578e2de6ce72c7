//! The watcher's memory as plain data: the digest store and the workload index, fed objects
//! without a client.

use crate::build;

use build::{Meta, Workload, config_map, deployment, key, secret};
use confighash::core::checksum::{self, ObjectView, RefState};
use confighash::core::names::IGNORE_ANNOTATION;
use confighash::core::refs::{ObjectKind, ObjectRef, References, Selection};
use confighash::core::rules::Lookup;
use confighash::core::workload::WorkloadKind;
use confighash::watcher::index::{
    ConfigStore, StoredConfig, WorkloadEntry, WorkloadIndex, WorkloadKey,
};
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::{Value, json};

fn cm_key(ns: &str, name: &str) -> (String, ObjectRef) {
    (ns.to_owned(), ObjectRef::new(ObjectKind::ConfigMap, name))
}

fn secret_key(ns: &str, name: &str) -> (String, ObjectRef) {
    (ns.to_owned(), ObjectRef::new(ObjectKind::Secret, name))
}

fn stored(cm: &ConfigMap) -> StoredConfig {
    StoredConfig::from_config_map(cm).unwrap()
}

#[test]
fn upsert_reports_only_changes_the_recipe_sees() {
    let mut store = ConfigStore::default();
    let key = cm_key("shop", "app");
    assert!(store.upsert(
        key.clone(),
        stored(&config_map("app", &[("a", "1")]).at_version("1"))
    ));
    // A metadata-only write: same inputs, new resourceVersion kept.
    assert!(!store.upsert(
        key.clone(),
        stored(&config_map("app", &[("a", "1")]).at_version("2"))
    ));
    assert_eq!(&*store.get(&key).unwrap().resource_version, "2");
    // New content.
    assert!(store.upsert(
        key.clone(),
        stored(&config_map("app", &[("a", "2")]).at_version("3"))
    ));
    // The ignore annotation added.
    let ignored = config_map("app", &[("a", "2")])
        .at_version("4")
        .annotated(IGNORE_ANNOTATION, "true");
    assert!(store.upsert(key.clone(), stored(&ignored)));
    assert!(matches!(store.state("shop", &key.1), RefState::Ignored));
    assert!(store.remove(&key));
    assert!(!store.remove(&key));
    assert!(matches!(store.state("shop", &key.1), RefState::Absent));
    assert!(store.is_empty());
}

#[test]
fn counts_follow_every_insert_and_removal_per_kind() {
    let mut store = ConfigStore::default();
    for ns in ["a", "b"] {
        for i in 0..3 {
            store.upsert(
                cm_key(ns, &format!("cm-{i}")),
                stored(&config_map("x", &[("k", "v")]).at_version("1")),
            );
        }
        store.upsert(
            secret_key(ns, "db"),
            StoredConfig::from_secret(&secret("db", &[("p", b"x")])),
        );
    }
    // Re-inserting a known object does not count it twice.
    store.upsert(
        cm_key("a", "cm-0"),
        stored(&config_map("x", &[("k", "w")]).at_version("2")),
    );
    assert_eq!(store.count(ObjectKind::ConfigMap), 6);
    assert_eq!(store.count(ObjectKind::Secret), 2);
    assert_eq!(store.len(), 8);
    assert_eq!(store.keys().count(), 8);

    store.remove(&cm_key("a", "cm-1"));
    store.remove(&cm_key("a", "missing"));
    store.remove(&secret_key("zz", "db"));
    assert_eq!(store.count(ObjectKind::ConfigMap), 5);

    store.remove_namespace("b");
    assert!(!store.has_namespace("b"));
    assert!(store.has_namespace("a"));
    assert_eq!(store.count(ObjectKind::ConfigMap), 2);
    assert_eq!(store.count(ObjectKind::Secret), 1);
    assert!(store.keys().all(|(ns, _, _)| ns == "a"));

    // The last object of a namespace takes the namespace with it.
    store.remove(&cm_key("a", "cm-0"));
    store.remove(&cm_key("a", "cm-2"));
    store.remove(&secret_key("a", "db"));
    assert!(!store.has_namespace("a"));
    assert!(store.is_empty());
}

#[test]
fn the_same_name_in_two_namespaces_or_of_two_kinds_is_two_objects() {
    let mut store = ConfigStore::default();
    store.upsert(
        cm_key("a", "app"),
        stored(&config_map("app", &[("k", "1")]).at_version("1")),
    );
    store.upsert(
        cm_key("b", "app"),
        stored(&config_map("app", &[("k", "2")]).at_version("1")),
    );
    store.upsert(
        secret_key("a", "app"),
        StoredConfig::from_secret(&secret("app", &[("k", b"3")])),
    );
    assert_eq!(store.len(), 3);
    assert_ne!(
        store.get(&cm_key("a", "app")),
        store.get(&cm_key("b", "app"))
    );
    assert!(matches!(
        store.state("c", &ObjectRef::new(ObjectKind::ConfigMap, "app")),
        RefState::Absent
    ));
}

#[test]
fn lookup_gives_the_stamp_the_whole_objects_give() {
    let cm = config_map("app", &[("LOG_LEVEL", "info"), ("PORT", "8080")]).at_version("1");
    let db = secret("db", &[("password", b"hunter2"), ("user", b"app")]);
    let mut store = ConfigStore::default();
    store.upsert(cm_key("shop", "app"), stored(&cm));
    store.upsert(secret_key("shop", "db"), StoredConfig::from_secret(&db));

    let mut refs = References::default();
    refs.add(ObjectKind::ConfigMap, "app", Selection::Whole, false);
    refs.add(
        ObjectKind::Secret,
        "db",
        Selection::Keys(["password".to_owned()].into()),
        false,
    );
    refs.add(ObjectKind::ConfigMap, "extra", Selection::Whole, true);

    let cm_view = ObjectView::config_map(&cm).unwrap();
    let db_view = ObjectView::secret(&db);
    let state = |r: &ObjectRef| match r.name.as_str() {
        "app" => RefState::Present(&cm_view),
        "db" => RefState::Present(&db_view),
        _ => RefState::Absent,
    };
    let from_objects = checksum::compute_stamp(Some(&key()), "shop", &refs, state);
    let from_objects_v1 = checksum::compute_stamp_v1(Some(&key()), &refs, state);
    assert_eq!(
        store.lookup(&key(), "shop", &refs, false, u64::MAX),
        Lookup::Resolved {
            expected: from_objects.clone(),
            expected_v1: None,
            required_absent: false
        }
    );
    // The v1 stamp, to check stamps of earlier releases, comes from the same digests.
    assert_eq!(
        store.lookup(&key(), "shop", &refs, true, u64::MAX),
        Lookup::Resolved {
            expected: from_objects.clone(),
            expected_v1: Some(from_objects_v1.clone()),
            required_absent: false
        }
    );
    // The namespace enters the v2 stamp only.
    store.upsert(cm_key("shop-2", "app"), stored(&cm));
    store.upsert(secret_key("shop-2", "db"), StoredConfig::from_secret(&db));
    let Lookup::Resolved {
        expected,
        expected_v1,
        ..
    } = store.lookup(&key(), "shop-2", &refs, true, u64::MAX)
    else {
        panic!("the store always resolves");
    };
    assert_ne!(expected, from_objects);
    assert_eq!(expected_v1, Some(from_objects_v1));

    // A required reference gone is reported; an optional one is not.
    store.remove(&secret_key("shop", "db"));
    let Lookup::Resolved {
        required_absent, ..
    } = store.lookup(&key(), "shop", &refs, false, u64::MAX)
    else {
        panic!("the store always resolves");
    };
    assert!(required_absent);
}

/// Deployment `name` in `shop` (resource version 5, uid u-1) taking ConfigMaps `refs` whole.
fn using(name: &str, refs: &[&str]) -> Workload {
    refs.iter().fold(
        deployment(name)
            .meta("resourceVersion", json!("5"))
            .meta("uid", json!("u-1")),
        |d, r| d.env_from_config_map(r),
    )
}

fn entry(obj: &Value) -> WorkloadEntry {
    WorkloadEntry::from_object(WorkloadKind::DEPLOYMENT, obj)
        .unwrap()
        .expect("a Deployment is stamped")
}

fn wkey(name: &str) -> WorkloadKey {
    WorkloadKey::new(WorkloadKind::DEPLOYMENT, "shop", name)
}

#[test]
fn the_reverse_index_follows_references_as_they_change() {
    let mut index = WorkloadIndex::default();
    index.upsert(wkey("web"), entry(&using("web", &["app", "shared"]).json()));
    index.upsert(wkey("api"), entry(&using("api", &["shared"]).json()));
    let dependents = |index: &WorkloadIndex, name: &str| -> Vec<String> {
        index
            .dependents(&cm_key("shop", name))
            .map(|k| k.name)
            .collect()
    };
    assert_eq!(dependents(&index, "shared"), ["api", "web"]);
    assert_eq!(dependents(&index, "app"), ["web"]);

    // web stops using "app": its link goes, and nothing else references it.
    index.upsert(wkey("web"), entry(&using("web", &["shared"]).json()));
    assert!(!index.is_referenced(&cm_key("shop", "app")));
    assert_eq!(dependents(&index, "shared"), ["api", "web"]);
    // Same name in another namespace is another object.
    assert!(!index.is_referenced(&cm_key("other", "shared")));

    assert!(index.remove(&wkey("api")));
    assert!(!index.remove(&wkey("api")));
    assert_eq!(dependents(&index, "shared"), ["web"]);
    assert_eq!(index.keys_of(WorkloadKind::DEPLOYMENT), [wkey("web")]);
    assert!(index.keys_of(WorkloadKind::STATEFUL_SET).is_empty());

    index.remove_namespace("shop");
    assert!(index.is_empty());
    assert!(!index.is_referenced(&cm_key("shop", "shared")));
}

#[test]
fn entries_know_which_workloads_do_not_roll_by_themselves() {
    assert!(entry(&using("web", &["app"]).json()).rolls_by_itself);
    assert!(!entry(&using("web", &["app"]).spec("paused", json!(true)).json()).rolls_by_itself);
    let on_delete = json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "db", "namespace": "shop"},
        "spec": {
            "updateStrategy": {"type": "OnDelete"},
            "template": {"spec": {"containers": [{"name": "db", "image": "db:1"}]}}
        }
    });
    let e = WorkloadEntry::from_object(WorkloadKind::STATEFUL_SET, &on_delete)
        .unwrap()
        .unwrap();
    assert!(!e.rolls_by_itself);
    let e = entry(&using("web", &["app"]).json());
    assert_eq!(e.resource_version, "5");
    assert_eq!(e.uid, "u-1");
    assert_eq!(e.refs.len(), 1);
}

#[test]
fn a_rollout_with_a_workload_ref_is_not_indexed() {
    let rollout = json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"workloadRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}}
    });
    assert_eq!(
        WorkloadEntry::from_object(WorkloadKind::ROLLOUT, &rollout).unwrap(),
        None
    );
}

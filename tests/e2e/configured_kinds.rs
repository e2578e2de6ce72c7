//! End to end: workload kinds added by configuration (`--workload-kind`; the chart's
//! `workloadKinds`), custom resources with a pod template: OpenKruise's CloneSet and Knative's
//! Service at `/spec/template`, KEDA's ScaledJob at `/spec/jobTargetRef/template`, and
//! OpenKruise's BroadcastJob, whose CRD is applied only after confighash started. Their CRDs are
//! in `tests/data/crds/`; the stand-in runs confighash with the same kinds and serves each once
//! its CRD is "applied", the real tier installs the chart with `tests/data/crds/kinds.json`. No
//! controller runs: a rollout is a new stored template (`Env::rollouts`), and confighash's writes
//! are counted from the API server's record (the audit log on a real cluster).

use crate::support;

use kube::api::{Api, DynamicObject, PostParams};
use serde_json::json;
use support::Env;

/// The kinds whose CRDs these scenarios apply first, each with the name of its object.
const KINDS: [(&str, &str); 3] = [
    ("CloneSet", "clone-web"),
    ("Service", "knative-web"),
    ("ScaledJob", "nightly"),
];

/// confighash's writes to `name` of `resource` in `namespace` so far.
fn writes_to(env: &Env, namespace: &str, resource: &str, name: &str) -> usize {
    env.confighash_writes(namespace)
        .iter()
        .filter(|w| w.resource == resource && w.name == name)
        .count()
}

fn resource_of(kind: &str) -> String {
    support::api_resource(kind).plural
}

#[tokio::test]
async fn crd_kinds_are_stamped_at_create_and_roll_once_per_change_of_what_they_use() {
    const TEST: &str = "crd_kinds_are_stamped_at_create_and_roll_once_per_change_of_what_they_use";
    let Some(env) = Env::counted(TEST).await else {
        return;
    };
    for (kind, _) in KINDS {
        env.apply_crd(kind).await;
    }
    env.namespace("crds", true).await;
    env.config_map("crds", "app-env", &[("LOG_LEVEL", "info"), ("UNUSED", "a")])
        .await;
    // A Deployment that uses the same key: the recipe does not depend on the kind, so every
    // object's stamp must be the Deployment's.
    env.workload(
        "crds",
        "Deployment",
        "web",
        &[("key", "app-env/LOG_LEVEL")],
        json!({}),
    )
    .await;
    for (kind, name) in KINDS {
        env.workload(
            "crds",
            kind,
            name,
            &[("key", "app-env/LOG_LEVEL")],
            json!({}),
        )
        .await;
    }
    let first = env.stamp("crds", "Deployment", "web").await;
    assert!(first.is_some(), "the Deployment is stamped at CREATE");
    for (kind, name) in KINDS {
        assert_eq!(
            env.stamp("crds", kind, name).await,
            first,
            "{kind} {name} is stamped at CREATE, as the Deployment"
        );
        env.wait_watching(kind, 1).await;
    }
    env.barrier("crds").await;
    for (kind, name) in KINDS {
        assert_eq!(env.rollouts("crds", kind, name).await, 0, "{kind} {name}");
        assert_eq!(writes_to(&env, "crds", &resource_of(kind), name), 0);
    }

    // A change of the key they use: each rolls once, by one write of confighash's.
    env.config_map(
        "crds",
        "app-env",
        &[("LOG_LEVEL", "debug"), ("UNUSED", "a")],
    )
    .await;
    for (kind, name) in KINDS {
        env.wait_rollouts("crds", kind, name, 1).await;
    }
    env.barrier("crds").await;
    let second = env.stamp("crds", "Deployment", "web").await;
    assert_ne!(second, first, "the Deployment rolled");
    let mut measured = Vec::new();
    for (kind, name) in KINDS {
        let rollouts = env.rollouts("crds", kind, name).await;
        let writes = writes_to(&env, "crds", &resource_of(kind), name);
        measured.push(format!("{kind} {name}: {rollouts} rollout, {writes} write"));
        assert_eq!(rollouts, 1, "{kind} {name}");
        assert_eq!(writes, 1, "{kind} {name}: confighash's writes");
        assert_eq!(env.stamp("crds", kind, name).await, second, "{kind} {name}");
        assert_eq!(env.events("crds", name, "ConfigChanged").await, 1, "{name}");
    }
    eprintln!("{TEST}: {}", measured.join("; "));

    // A change of a key none of them uses: nothing.
    env.config_map(
        "crds",
        "app-env",
        &[("LOG_LEVEL", "debug"), ("UNUSED", "b")],
    )
    .await;
    env.barrier("crds").await;
    for (kind, name) in KINDS {
        assert_eq!(env.rollouts("crds", kind, name).await, 1, "{kind} {name}");
        assert_eq!(writes_to(&env, "crds", &resource_of(kind), name), 1);
        assert_eq!(env.stamp("crds", kind, name).await, second);
    }
}

#[tokio::test]
async fn a_configured_kind_not_served_at_start_is_watched_once_its_crd_is_applied() {
    const TEST: &str = "a_configured_kind_not_served_at_start_is_watched_once_its_crd_is_applied";
    let Some(env) = Env::counted(TEST).await else {
        return;
    };
    env.namespace("late", true).await;
    env.config_map("late", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    // confighash runs with BroadcastJob configured, and the cluster does not serve it.
    env.barrier("late").await;
    if env.apply_crd("BroadcastJob").await {
        eprintln!(
            "skipped: {TEST} needs a cluster that did not serve BroadcastJobs when confighash \
             started (this one served them before the scenario: an earlier run applied the CRD)"
        );
        return;
    }
    env.workload(
        "late",
        "BroadcastJob",
        "warm-cache",
        &[("envFrom", "app-env")],
        json!({}),
    )
    .await;
    let first = env.stamp("late", "BroadcastJob", "warm-cache").await;
    assert!(
        first.is_some(),
        "stamped at CREATE: the webhook's rules name the kind"
    );
    // The watcher finds the kind when it looks again, and lists it.
    env.wait_watching("BroadcastJob", 1).await;
    env.barrier("late").await;
    assert_eq!(env.rollouts("late", "BroadcastJob", "warm-cache").await, 0);
    env.config_map("late", "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.wait_rollouts("late", "BroadcastJob", "warm-cache", 1)
        .await;
    env.barrier("late").await;
    assert_eq!(env.rollouts("late", "BroadcastJob", "warm-cache").await, 1);
    assert_eq!(writes_to(&env, "late", "broadcastjobs", "warm-cache"), 1);
    assert_ne!(env.stamp("late", "BroadcastJob", "warm-cache").await, first);
}

#[tokio::test]
async fn an_object_with_no_pod_template_at_the_pointer_is_passed_through_unchanged() {
    let env = Env::start().await;
    env.apply_crd("Service").await;
    env.namespace("bare", true).await;
    // A Knative Service with no template yet: nothing to stamp.
    let object = json!({
        "apiVersion": "serving.knative.dev/v1",
        "kind": "Service",
        "metadata": {"name": "bare"},
        "spec": {"traffic": [{"latestRevision": true, "percent": 100}]}
    });
    let api: Api<DynamicObject> = Api::namespaced_with(
        env.client.clone(),
        &env.ns("bare"),
        &support::api_resource("Service"),
    );
    let created = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(object.clone()).unwrap(),
        )
        .await
        .unwrap();
    let created = serde_json::to_value(created).unwrap();
    assert_eq!(created["spec"], object["spec"], "the spec is as sent");
    assert!(
        created.pointer("/metadata/annotations").is_none(),
        "no annotation added: {created}"
    );
    if env.is_stand_in() {
        assert_eq!(
            env.metrics.requests("Service", "CREATE", "no-pod-template"),
            1,
            "counted as no-pod-template"
        );
    }
}

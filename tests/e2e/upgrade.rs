//! End to end: upgrading from a release that stamped with recipe v1. Workloads carry `v1:` stamps
//! made with the installation's key, written before this version starts; they are checked under
//! v1 (docs/recipe.md, "Recipe v2"), so the upgrade rolls nothing, and a config change made while
//! the new version takes over (a leader handover) rolls each dependent workload exactly once, to
//! its v2 stamp.
//!
//! The `v1:` stamps are written straight into the stand-in: the workloads are created while
//! their namespace is not opted in (the webhook's namespaceSelector skips them, as it would skip
//! them with no confighash installed), with stamps computed by `compute_stamp_v1` over the
//! objects as the API server stores them. The namespace is opted in before the watcher starts.
//!
//! Both scenarios start the watcher (and its replicas) in-process and count the stand-in's
//! requests, so on a real cluster they are skipped.

use crate::build;
use crate::support;

use std::collections::BTreeMap;

use confighash::core::checksum::{Recipe, Stamp, StampKey};
use confighash::core::workload::WorkloadKind;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::{Env, Setup};

const NS: &str = "shop";

/// A workload: kind, name, and references (as `support::workload_object` takes them).
type Workload = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);

/// The workloads of the upgrade: (kind, name, references). The first three depend on ConfigMap
/// `app-env` (whole, one key, and beside a Secret key and an absent optional key); `other` does
/// not.
const WORKLOADS: [Workload; 4] = [
    ("Deployment", "web", &[("envFrom", "app-env")]),
    (
        "StatefulSet",
        "db",
        &[
            ("key", "app-env/LOG_LEVEL"),
            ("secretKey", "db-creds/password"),
        ],
    ),
    (
        "CronJob",
        "report",
        &[
            ("envFrom", "app-env"),
            ("secretEnvFrom", "db-creds"),
            ("optionalEnvFrom", "not-there"),
        ],
    ),
    ("Deployment", "other", &[("volume", "unrelated")]),
];

/// The API plurals of the workload kinds above: confighash must write none of them.
const PLURALS: [&str; 3] = ["deployments", "statefulsets", "cronjobs"];

fn kind_of(kind: &str) -> WorkloadKind {
    WorkloadKind::BUILT_IN
        .into_iter()
        .find(|k| k.kind() == kind)
        .expect("a workload kind")
}

/// The v1 and v2 stamps of `object` over its references as the API server stores them now.
async fn stamps_now(env: &Env, object: &Value) -> (Stamp, Stamp) {
    let key = StampKey::new(support::KEY.to_vec()).unwrap();
    (
        build::expected_stamp(&env.client, &key, Recipe::V1, &env.ns(NS), object).await,
        build::expected_stamp(&env.client, &key, Recipe::V2, &env.ns(NS), object).await,
    )
}

/// Creates the namespace (not opted in yet), the config and the workloads, each carrying the
/// v1 stamp of the current key over the config as stored. Returns the workloads' v1 stamps by
/// name.
async fn seed_v1_stamped(env: &Env) -> BTreeMap<&'static str, String> {
    env.namespace(NS, false).await;
    env.config_map(NS, "app-env", &[("LOG_LEVEL", "info"), ("PORT", "8080")])
        .await;
    env.config_map(NS, "unrelated", &[("motd", "hello")]).await;
    env.secret(NS, "db-creds", &[("password", "s3cret"), ("user", "app")])
        .await;
    let mut stamps = BTreeMap::new();
    for (kind, name, refs) in WORKLOADS {
        let mut object = support::workload_object(kind, name, refs, json!({}));
        let (v1, v2) = stamps_now(env, &object).await;
        assert!(v1.as_str().starts_with("v1:3eb1bd43:"), "{v1}");
        assert_ne!(v1.as_str(), v2.as_str());
        let path = format!("/{}/metadata", kind_of(kind).template_path().join("/"));
        object.pointer_mut(&path).unwrap()["annotations"] = json!({support::STAMP: v1.as_str()});
        let api: Api<DynamicObject> = Api::namespaced_with(
            env.client.clone(),
            &env.ns(NS),
            &support::api_resource(kind),
        );
        api.create(
            &PostParams::default(),
            &serde_json::from_value(object).unwrap(),
        )
        .await
        .unwrap();
        // Stored as written: the webhook did not see it.
        assert_eq!(
            env.stamp(NS, kind, name).await.as_deref(),
            Some(v1.as_str())
        );
        stamps.insert(name, v1.to_string());
    }
    stamps
}

/// Labels the namespace `confighash.dev/enabled=true`.
async fn opt_in(env: &Env) {
    Api::<Namespace>::all(env.client.clone())
        .patch(
            &env.ns(NS),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"confighash.dev/enabled": "true"}}})),
        )
        .await
        .unwrap();
}

/// Writes (update or patch) on the workload kinds above, by anyone; the test itself only
/// creates them.
fn workload_writes(env: &Env) -> usize {
    env.api()
        .requests()
        .iter()
        .filter(|(verb, resource)| {
            (verb == "patch" || verb == "update") && PLURALS.contains(&resource.as_str())
        })
        .count()
}

/// A barrier that touches no workload kind under test: a DaemonSet in namespace `sentinel`
/// that uses ConfigMap `barrier`. The watcher handles ConfigMap events in order, so once its
/// change has rolled the DaemonSet, everything written before has been handled too.
async fn barrier(env: &Env) {
    const SENTINEL: &str = "sentinel";
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns(SENTINEL));
    if Api::<Namespace>::all(env.client.clone())
        .get_opt(&env.ns(SENTINEL))
        .await
        .unwrap()
        .is_none()
    {
        env.namespace(SENTINEL, true).await;
        env.config_map(SENTINEL, "barrier", &[("n", "0")]).await;
        env.workload(
            SENTINEL,
            "DaemonSet",
            "barrier",
            &[("envFrom", "barrier")],
            json!({}),
        )
        .await;
    }
    let before = env.rollouts(SENTINEL, "DaemonSet", "barrier").await;
    let n = cms.get("barrier").await.unwrap().data.unwrap()["n"]
        .parse::<u64>()
        .unwrap()
        + 1;
    env.config_map(SENTINEL, "barrier", &[("n", &n.to_string())])
        .await;
    env.wait_rollouts(SENTINEL, "DaemonSet", "barrier", before + 1)
        .await;
}

#[tokio::test]
async fn upgrading_over_right_v1_stamps_rolls_and_patches_nothing() {
    let Some(mut env) = Env::stand_in_with(
        "upgrading_over_right_v1_stamps_rolls_and_patches_nothing",
        "starts the watcher late, counts requests",
        Setup {
            start_watcher: false,
            ..Default::default()
        },
    )
    .await
    else {
        return;
    };
    let v1 = seed_v1_stamped(&env).await;

    // A control beside them: a v1 stamp of the current key over content that has changed since
    // (stale). Reconcile at start replaces it, which shows reconcile ran over this namespace.
    let mut control =
        support::workload_object("DaemonSet", "control", &[("envFrom", "app-env")], json!({}));
    let (_, control_v2) = stamps_now(&env, &control).await;
    let stale = "v1:3eb1bd43:0000000000000000000000000000000000000000000000000000000000000000";
    control["spec"]["template"]["metadata"]["annotations"] = json!({support::STAMP: stale});
    Api::<DynamicObject>::namespaced_with(
        env.client.clone(),
        &env.ns(NS),
        &support::api_resource("DaemonSet"),
    )
    .create(
        &PostParams::default(),
        &serde_json::from_value(control).unwrap(),
    )
    .await
    .unwrap();
    opt_in(&env).await;
    assert_eq!(workload_writes(&env), 0);

    env.start_watcher();
    env.wait_synced().await;
    env.wait_rollouts(NS, "DaemonSet", "control", 1).await;
    // Twice: the first may be handled in the same pass as reconcile's touches; by the second,
    // every touch reconcile started has been answered.
    barrier(&env).await;
    barrier(&env).await;

    assert_eq!(
        env.stamp(NS, "DaemonSet", "control").await.as_deref(),
        Some(control_v2.as_str()),
        "the stale v1 stamp became the v2 stamp"
    );
    for (kind, name, _) in WORKLOADS {
        assert_eq!(
            env.rollouts(NS, kind, name).await,
            0,
            "{kind} {name} rolled"
        );
        assert_eq!(
            env.stamp(NS, kind, name).await.as_deref(),
            Some(v1[name].as_str()),
            "{kind} {name} keeps its right v1 stamp"
        );
    }
    assert_eq!(workload_writes(&env), 0, "confighash wrote a workload");
}

#[tokio::test]
async fn a_config_change_during_a_leader_handover_rolls_each_dependent_once() {
    let Some(mut env) = Env::stand_in_with(
        "a_config_change_during_a_leader_handover_rolls_each_dependent_once",
        "runs two replicas in-process and stops the leader, counts requests",
        Setup {
            start_watcher: false,
            ..Default::default()
        },
    )
    .await
    else {
        return;
    };
    let v1 = seed_v1_stamped(&env).await;
    opt_in(&env).await;
    Api::<Namespace>::all(env.client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "confighash"}})).unwrap(),
        )
        .await
        .unwrap();

    // Two replicas of the new version; one leads and reconciles over the v1 stamps.
    let (lead_a, elect_a) = env.elect("replica-a");
    let (lead_b, elect_b) = env.elect("replica-b");
    env.start_watcher_with(lead_a.clone());
    let watcher_b = env.spawn_watcher("replica-b", lead_b.clone());
    env.eventually("a leader", || async {
        lead_a.is_leader() || lead_b.is_leader()
    })
    .await;
    env.wait_synced().await;
    barrier(&env).await;
    barrier(&env).await;
    for (kind, name, _) in WORKLOADS {
        assert_eq!(
            env.rollouts(NS, kind, name).await,
            0,
            "{kind} {name} rolled"
        );
    }
    assert_eq!(workload_writes(&env), 0);

    // The leader goes away; the config changes before the other replica has taken over.
    let (survivor, survivor_election, survivor_watcher) = if lead_a.is_leader() {
        env.stop_watcher();
        elect_a.abort();
        (lead_b, elect_b, Some(watcher_b))
    } else {
        watcher_b.abort();
        elect_b.abort();
        (lead_a, elect_a, None)
    };
    env.config_map(NS, "app-env", &[("LOG_LEVEL", "debug"), ("PORT", "8080")])
        .await;
    env.eventually("the other replica to take over", || async {
        survivor.is_leader()
    })
    .await;

    for (kind, name, _) in &WORKLOADS[..3] {
        env.wait_rollouts(NS, kind, name, 1).await;
    }
    barrier(&env).await;
    barrier(&env).await;
    for (kind, name, _) in &WORKLOADS[..3] {
        assert_eq!(
            env.rollouts(NS, kind, name).await,
            1,
            "{kind} {name}: one rollout, never two"
        );
        let object = env.get_workload(NS, kind, name).await.unwrap();
        let (_, v2) = stamps_now(&env, &object).await;
        assert_eq!(
            env.stamp(NS, kind, name).await.as_deref(),
            Some(v2.as_str()),
            "{kind} {name} ends on the v2 stamp of the new content"
        );
    }
    // `other` does not use app-env: untouched, its v1 stamp still right.
    assert_eq!(env.rollouts(NS, "Deployment", "other").await, 0);
    assert_eq!(
        env.stamp(NS, "Deployment", "other").await.as_deref(),
        Some(v1["other"].as_str())
    );
    survivor_election.abort();
    if let Some(w) = survivor_watcher {
        w.abort();
    }
}

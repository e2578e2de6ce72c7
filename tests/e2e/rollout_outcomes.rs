//! End to end: how each rollout after a config change ended. The test plays the Deployment
//! controller's part, writing `status` through the status subresource of the in-memory API
//! server as the controller would, and confighash records `RolloutComplete` or `RolloutStalled`
//! on the Deployment, or nothing when it was deleted mid-rollout.
//!
//! These need the in-memory API server (nobody else may write a Deployment's status on a real
//! cluster) and are skipped on a real cluster.

use crate::support;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};
use support::Env;

/// `shop` opted in, ConfigMap `web-config` and Deployment `web` using it; then `web-config`
/// changes and the watcher's touch of `web` is in. The Deployments API and `web`'s generation
/// after the touch.
async fn touched_after_a_change(env: &Env) -> (Api<Deployment>, i64) {
    env.namespace("shop", true).await;
    env.config_map("shop", "web-config", &[("LOG_LEVEL", "info")])
        .await;
    env.deployment("shop", "web", &[("envFrom", "web-config")])
        .await;
    env.barrier("shop").await;
    env.config_map("shop", "web-config", &[("LOG_LEVEL", "debug")])
        .await;
    env.wait_rollouts("shop", "Deployment", "web", 1).await;
    // Its result is in: the rollout is followed from now on.
    env.settled().await;
    assert_eq!(env.events("shop", "web", "ConfigChanged").await, 1);
    let deploys: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns("shop"));
    let generation = deploys
        .get("web")
        .await
        .unwrap()
        .metadata
        .generation
        .unwrap();
    assert_eq!(generation, 2, "created, then touched");
    (deploys, generation)
}

/// Writes `status` through the status subresource, as the Deployment controller does.
async fn write_status(deploys: &Api<Deployment>, name: &str, status: Value) {
    deploys
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .unwrap();
}

/// The Events with `reason` on `name` in `shop`: (type, note).
async fn events(env: &Env, name: &str, reason: &str) -> Vec<(String, String)> {
    Api::<Event>::namespaced(env.client.clone(), &env.ns("shop"))
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .map(|e| (e.type_.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

/// Polls until `name` has an Event with `reason`; its (type, note).
async fn wait_event(env: &Env, name: &str, reason: &str) -> (String, String) {
    env.eventually(&format!("a {reason} Event on {name}"), || async {
        !events(env, name, reason).await.is_empty()
    })
    .await;
    let mut found = events(env, name, reason).await;
    assert_eq!(found.len(), 1, "{found:?}");
    found.remove(0)
}

#[tokio::test]
async fn a_completed_rollout_is_recorded_with_the_change_that_caused_it() {
    let Some(env) = Env::stand_in(
        "a_completed_rollout_is_recorded_with_the_change_that_caused_it",
        "writes the Deployment's status as its controller would",
    )
    .await
    else {
        return;
    };
    let (deploys, generation) = touched_after_a_change(&env).await;
    assert_eq!(env.metrics.rollouts_followed(), 2, "web and the barrier");

    // The controller sees the new spec and starts a new ReplicaSet: not done.
    write_status(
        &deploys,
        "web",
        json!({"observedGeneration": generation, "replicas": 2, "updatedReplicas": 1,
               "readyReplicas": 1, "availableReplicas": 1}),
    )
    .await;
    env.barrier("shop").await;
    assert!(events(&env, "web", "RolloutComplete").await.is_empty());

    // The old pod is gone and the new one available: done.
    write_status(
        &deploys,
        "web",
        json!({"observedGeneration": generation, "replicas": 1, "updatedReplicas": 1,
               "readyReplicas": 1, "availableReplicas": 1}),
    )
    .await;
    let (type_, note) = wait_event(&env, "web", "RolloutComplete").await;
    assert_eq!(type_, "Normal");
    assert!(
        note.starts_with("pods now run the config of ConfigMap web-config, changed ")
            && note.ends_with(" earlier"),
        "{note}"
    );
    assert_eq!(env.metrics.rollout_outcomes("complete"), 1);
    assert!(
        env.metrics
            .encode()
            .contains("confighash_config_change_to_rollout_complete_seconds_count 1"),
        "one latency observed"
    );
    assert!(events(&env, "web", "RolloutStalled").await.is_empty());
}

#[tokio::test]
async fn a_deployment_past_its_progress_deadline_is_recorded_as_stalled() {
    let Some(env) = Env::stand_in(
        "a_deployment_past_its_progress_deadline_is_recorded_as_stalled",
        "writes the Deployment's status as its controller would",
    )
    .await
    else {
        return;
    };
    let (deploys, generation) = touched_after_a_change(&env).await;
    write_status(
        &deploys,
        "web",
        json!({"observedGeneration": generation, "replicas": 2, "updatedReplicas": 1,
               "readyReplicas": 1, "availableReplicas": 1, "unavailableReplicas": 1,
               "conditions": [
                   {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
                   {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                    "message": "ReplicaSet \"web-5f7d\" has timed out progressing."}]}),
    )
    .await;
    let (type_, note) = wait_event(&env, "web", "RolloutStalled").await;
    assert_eq!(type_, "Warning");
    assert!(
        note.starts_with("the rollout of the config of ConfigMap web-config (changed ")
            && note.contains(
                "stalled: it exceeded its progress deadline (ProgressDeadlineExceeded); pods may \
                 still run the previous config"
            ),
        "{note}"
    );
    assert_eq!(env.metrics.rollout_outcomes("stalled"), 1);
    assert!(events(&env, "web", "RolloutComplete").await.is_empty());
}

#[tokio::test]
async fn a_deployment_deleted_mid_rollout_gets_no_outcome() {
    let Some(env) = Env::stand_in(
        "a_deployment_deleted_mid_rollout_gets_no_outcome",
        "writes the Deployment's status as its controller would",
    )
    .await
    else {
        return;
    };
    let (deploys, _) = touched_after_a_change(&env).await;
    deploys
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    env.eventually("the followed rollout let go", || async {
        env.metrics.rollout_outcomes("gone") == 1
    })
    .await;

    // One of the same name, created again and rolled out, is not the rollout followed.
    env.deployment("shop", "web", &[("envFrom", "web-config")])
        .await;
    write_status(
        &deploys,
        "web",
        json!({"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
               "readyReplicas": 1, "availableReplicas": 1}),
    )
    .await;
    env.barrier("shop").await;
    assert!(events(&env, "web", "RolloutComplete").await.is_empty());
    assert!(events(&env, "web", "RolloutStalled").await.is_empty());
    assert_eq!(env.metrics.rollout_outcomes("complete"), 0);
    assert_eq!(env.metrics.rollouts_followed(), 1, "the barrier's, only");
}

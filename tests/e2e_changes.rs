//! End to end: config changes roll exactly the workloads that use them, once.

#[path = "e2e/support.rs"]
mod support;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use support::Env;

#[tokio::test]
async fn a_config_map_change_rolls_its_workload_once() {
    let env = Env::start().await;
    env.namespace("shop", true).await;
    env.config_map("shop", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.deployment("shop", "web", &[("envFrom", "app-env")])
        .await;
    let first = env.stamp("shop", "Deployment", "web").await;
    assert!(first.is_some(), "stamped at CREATE");
    env.barrier("shop").await;
    assert_eq!(
        env.rollouts("shop", "Deployment", "web").await,
        0,
        "created after its ConfigMap: no further rollout"
    );

    env.config_map("shop", "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.wait_rollouts("shop", "Deployment", "web", 1).await;
    env.barrier("shop").await;
    assert_eq!(
        env.rollouts("shop", "Deployment", "web").await,
        1,
        "exactly one rollout"
    );
    assert_ne!(env.stamp("shop", "Deployment", "web").await, first);
}

#[tokio::test]
async fn a_label_only_change_rolls_nothing() {
    let env = Env::start().await;
    env.namespace("shop", true).await;
    env.config_map("shop", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.deployment("shop", "web", &[("envFrom", "app-env")])
        .await;
    Api::<ConfigMap>::namespaced(env.client.clone(), "shop")
        .patch(
            "app-env",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "shop"}}})),
        )
        .await
        .unwrap();
    env.barrier("shop").await;
    assert_eq!(env.rollouts("shop", "Deployment", "web").await, 0);
}

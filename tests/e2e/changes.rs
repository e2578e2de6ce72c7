//! End to end: config changes roll exactly the workloads that use them, once.

use crate::support;

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
    env.barrier("shop").await;
    let mark = env.mark("shop").await;
    Api::<ConfigMap>::namespaced(env.client.clone(), &env.ns("shop"))
        .patch(
            "app-env",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "shop"}}})),
        )
        .await
        .unwrap();
    env.barrier("shop").await;
    assert_eq!(env.rollouts("shop", "Deployment", "web").await, 0);
    env.assert_quiet_since(&mark, "web", "a label-only change")
        .await;
}

#[tokio::test]
async fn a_workload_over_max_references_is_never_touched_and_says_why() {
    use k8s_openapi::api::events::v1::Event;
    use kube::api::{DynamicObject, ListParams, PostParams};
    let Some(env) = Env::stand_in(
        "a_workload_over_max_references_is_never_touched_and_says_why",
        "counts its requests; --max-references as set here",
    )
    .await
    else {
        return;
    };
    env.namespace("shop", true).await;
    env.config_map("shop", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    let mut obj =
        support::workload_object("Deployment", "web", &[("envFrom", "app-env")], json!({}));
    let extra: Vec<String> = (0..300).map(|i| format!("extra-{i}")).collect();
    obj["metadata"]["annotations"] = json!({"confighash.dev/extra-configmaps": extra.join(",")});
    let api: Api<DynamicObject> = Api::namespaced_with(
        env.client.clone(),
        &env.ns("shop"),
        &support::api_resource("Deployment"),
    );
    api.create(
        &PostParams::default(),
        &serde_json::from_value(obj).unwrap(),
    )
    .await
    .unwrap();
    let created = env.get_workload("shop", "Deployment", "web").await.unwrap();
    assert_eq!(
        created["metadata"]["annotations"]["confighash.dev/unstamped"],
        "too-many-references"
    );
    assert_eq!(env.stamp("shop", "Deployment", "web").await, None);
    env.eventually("the Warning Event", || async {
        Api::<Event>::namespaced(env.client.clone(), &env.ns("shop"))
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("TooManyReferences")
                    && e.type_.as_deref() == Some("Warning")
            })
    })
    .await;

    env.barrier("shop").await;
    let patches_before = patches_of_deployments(&env);
    env.config_map("shop", "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.barrier("shop").await;
    assert_eq!(env.rollouts("shop", "Deployment", "web").await, 0);
    assert_eq!(
        patches_of_deployments(&env),
        patches_before + 1,
        "beside the barrier's own touch, confighash touched a workload the webhook will not stamp"
    );
}

fn patches_of_deployments(env: &Env) -> usize {
    env.api()
        .requests()
        .iter()
        .filter(|(verb, resource)| verb == "patch" && resource == "deployments")
        .count()
}

/// A workload written while the API server could not call the webhook (here: the webhook is
/// down under failurePolicy Ignore, as with a NetworkPolicy that blocks the API server or a
/// stale caBundle) carries neither a stamp nor the unstamped marker: the watcher counts it in
/// `confighash_workloads_bypassed_total`, once per workload (uid), however often it sees it.
/// Stamped, opted-out and not-opted-in workloads are not counted.
#[tokio::test]
async fn a_workload_created_past_the_webhook_is_counted_as_bypassed_once() {
    use std::time::Duration;

    use confighash::watcher::WatcherConfig;
    use kube::api::{DeleteParams, DynamicObject};
    use support::Setup;

    let Some(mut env) = Env::stand_in_with(
        "a_workload_created_past_the_webhook_is_counted_as_bypassed_once",
        "stops the webhook, reads the watcher's metrics",
        Setup {
            watcher: WatcherConfig {
                // Everything here is created after the watcher started.
                bypass_grace: Some(Duration::ZERO),
                ..Setup::default().watcher
            },
            ..Default::default()
        },
    )
    .await
    else {
        return;
    };
    env.namespace("shop", true).await;
    env.namespace("other", false).await;
    env.config_map("shop", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.deployment("shop", "stamped", &[("envFrom", "app-env")])
        .await;
    assert!(env.stamp("shop", "Deployment", "stamped").await.is_some());
    env.barrier("shop").await;
    assert_eq!(env.metrics.workloads_bypassed(), 0, "stamped at CREATE");

    env.stop_webhook().await;
    env.deployment("shop", "web", &[("envFrom", "app-env")])
        .await;
    env.workload(
        "shop",
        "Deployment",
        "opted-out",
        &[("envFrom", "app-env")],
        json!({"confighash.dev/enabled": "false"}),
    )
    .await;
    env.deployment("other", "web", &[]).await;
    assert_eq!(env.stamp("shop", "Deployment", "web").await, None);
    env.eventually("web to be counted", || async {
        env.metrics.workloads_bypassed() == 1
    })
    .await;

    // Seen again (its own writes, and a restarted watch's list): still counted once.
    env.restart_webhook().await;
    let deployments: Api<DynamicObject> = Api::namespaced_with(
        env.client.clone(),
        &env.ns("shop"),
        &support::api_resource("Deployment"),
    );
    for team in ["a", "b"] {
        deployments
            .patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"team": team}}})),
            )
            .await
            .unwrap();
    }
    env.api().close_watches();
    env.barrier("shop").await;
    assert_eq!(env.stamp("shop", "Deployment", "web").await, None);
    assert_eq!(env.metrics.workloads_bypassed(), 1, "each workload once");
    assert!(
        env.metrics
            .encode()
            .lines()
            .any(|l| l == "confighash_workloads_bypassed_total 1"),
        "exported"
    );

    // The same name again is another workload (another uid).
    env.stop_webhook().await;
    deployments
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    env.deployment("shop", "web", &[("envFrom", "app-env")])
        .await;
    env.eventually("the new web to be counted", || async {
        env.metrics.workloads_bypassed() == 2
    })
    .await;
    env.restart_webhook().await;
    env.barrier("shop").await;
    assert_eq!(env.metrics.workloads_bypassed(), 2);
    assert_eq!(env.rollouts("shop", "Deployment", "stamped").await, 0);
}

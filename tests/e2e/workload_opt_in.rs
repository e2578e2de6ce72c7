//! End to end: a workload labelled `confighash.dev/enabled=true` is handled wherever it is, as in
//! an opted-in namespace, by the webhook (the configuration's second entry,
//! `workload.confighash.dev`) and by the watcher; its unlabelled neighbours are not. Exact
//! rollout counts, and (in the stand-in) exactly one webhook call per write.

use crate::support;

use confighash_testkit::apiserver::admission::CallResult;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use support::{Env, api_resource};

const STAMP_ENTRY: &str = "stamp.confighash.dev";
const WORKLOAD_ENTRY: &str = "workload.confighash.dev";

fn opted_in() -> Value {
    json!({"confighash.dev/enabled": "true"})
}

/// Sets (or, with `null`, removes) the workload's `confighash.dev/enabled` label: an UPDATE.
async fn label_workload(env: &Env, namespace: &str, name: &str, value: Value) {
    Api::<DynamicObject>::namespaced_with(
        env.client.clone(),
        &env.ns(namespace),
        &api_resource("Deployment"),
    )
    .patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"confighash.dev/enabled": value}}})),
    )
    .await
    .unwrap();
}

/// Sets (or, with `null`, removes) the namespace's `confighash.dev/enabled` label.
async fn label_namespace(env: &Env, namespace: &str, value: Value) {
    Api::<Namespace>::all(env.client.clone())
        .patch(
            &env.ns(namespace),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"confighash.dev/enabled": value}}})),
        )
        .await
        .unwrap();
}

/// A labelled Deployment in a namespace that is not opted in is stamped at CREATE and rolls
/// once per change of its ConfigMap; its unlabelled neighbour, using the same ConfigMap, is
/// never stamped and never rolls. Without the label it rolls no more; labelled again it is
/// brought up to date (once) by the write that labels it.
#[tokio::test]
async fn a_labelled_workload_in_a_plain_namespace_rolls_and_its_neighbour_never_does() {
    let env = Env::start().await;
    env.namespace("wl-on", true).await;
    env.namespace("wl-plain", false).await;
    env.config_map("wl-plain", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    let uses = [("envFrom", "app-env")];
    env.workload("wl-plain", "Deployment", "web", &uses, opted_in())
        .await;
    env.deployment("wl-plain", "other", &uses).await;
    assert!(
        env.stamp("wl-plain", "Deployment", "web").await.is_some(),
        "stamped at CREATE"
    );
    assert_eq!(env.stamp("wl-plain", "Deployment", "other").await, None);
    let first = env.stamp("wl-plain", "Deployment", "web").await;

    for (n, level) in [(1, "debug"), (2, "trace")] {
        env.config_map("wl-plain", "app-env", &[("LOG_LEVEL", level)])
            .await;
        env.wait_rollouts("wl-plain", "Deployment", "web", n).await;
        // The ConfigMap watch is one cluster-wide stream handled in order: a barrier in the
        // opted-in namespace comes after this change was handled.
        env.barrier("wl-on").await;
        assert_eq!(env.rollouts("wl-plain", "Deployment", "web").await, n);
        assert_eq!(env.rollouts("wl-plain", "Deployment", "other").await, 0);
    }
    assert_ne!(env.stamp("wl-plain", "Deployment", "web").await, first);
    assert_eq!(env.stamp("wl-plain", "Deployment", "other").await, None);
    // Events are recorded in their own task, and a repeat joins the first one's series.
    env.eventually("web's ConfigChanged Event", || async {
        env.events("wl-plain", "web", "ConfigChanged").await > 0
    })
    .await;
    assert_eq!(env.events("wl-plain", "other", "ConfigChanged").await, 0);

    // The label removed: the write is sent to the webhook (its old object has the label), which
    // keeps the current stamp, so nothing rolls; changes roll nothing from then on.
    label_workload(&env, "wl-plain", "web", Value::Null).await;
    env.barrier("wl-on").await;
    assert_eq!(env.rollouts("wl-plain", "Deployment", "web").await, 2);
    env.config_map("wl-plain", "app-env", &[("LOG_LEVEL", "warn")])
        .await;
    env.barrier("wl-on").await;
    assert_eq!(env.rollouts("wl-plain", "Deployment", "web").await, 2);
    assert_eq!(env.rollouts("wl-plain", "Deployment", "other").await, 0);

    // Labelled again: the webhook brings the stale stamp up to date (one rollout), and the
    // watcher, once it has listed the namespace again, finds nothing more to do.
    label_workload(&env, "wl-plain", "web", json!("true")).await;
    env.wait_rollouts("wl-plain", "Deployment", "web", 3).await;
    env.barrier("wl-on").await;
    assert_eq!(env.rollouts("wl-plain", "Deployment", "web").await, 3);
    env.config_map("wl-plain", "app-env", &[("LOG_LEVEL", "error")])
        .await;
    env.wait_rollouts("wl-plain", "Deployment", "web", 4).await;
    env.barrier("wl-on").await;
    assert_eq!(env.rollouts("wl-plain", "Deployment", "web").await, 4);
    assert_eq!(env.rollouts("wl-plain", "Deployment", "other").await, 0);
    assert_eq!(env.stamp("wl-plain", "Deployment", "other").await, None);
}

/// The label in an opted-in namespace changes nothing (the namespace's entry handles it, once);
/// when the namespace opts out, the labelled workload goes on rolling and the unlabelled one
/// stops; opted in again, the unlabelled one catches up once.
#[tokio::test]
async fn a_labelled_workload_rolls_whether_its_namespace_opts_in_or_out() {
    let env = Env::start().await;
    env.namespace("wl-ns", true).await;
    env.namespace("wl-barrier", true).await;
    env.config_map("wl-ns", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    let uses = [("envFrom", "app-env")];
    env.workload("wl-ns", "Deployment", "web", &uses, opted_in())
        .await;
    env.deployment("wl-ns", "api", &uses).await;
    assert!(env.stamp("wl-ns", "Deployment", "web").await.is_some());
    assert!(env.stamp("wl-ns", "Deployment", "api").await.is_some());

    env.config_map("wl-ns", "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.wait_rollouts("wl-ns", "Deployment", "web", 1).await;
    env.wait_rollouts("wl-ns", "Deployment", "api", 1).await;
    env.barrier("wl-barrier").await;
    assert_eq!(env.rollouts("wl-ns", "Deployment", "web").await, 1);
    assert_eq!(env.rollouts("wl-ns", "Deployment", "api").await, 1);

    // The namespace opts out: web, labelled, still rolls; api does not.
    label_namespace(&env, "wl-ns", Value::Null).await;
    env.barrier("wl-barrier").await;
    env.config_map("wl-ns", "app-env", &[("LOG_LEVEL", "trace")])
        .await;
    env.wait_rollouts("wl-ns", "Deployment", "web", 2).await;
    env.barrier("wl-barrier").await;
    assert_eq!(env.rollouts("wl-ns", "Deployment", "web").await, 2);
    assert_eq!(env.rollouts("wl-ns", "Deployment", "api").await, 1);

    // Opted in again: api, whose config changed meanwhile, is touched once; web is current.
    label_namespace(&env, "wl-ns", json!("true")).await;
    env.wait_rollouts("wl-ns", "Deployment", "api", 2).await;
    env.barrier("wl-barrier").await;
    assert_eq!(env.rollouts("wl-ns", "Deployment", "web").await, 2);
    assert_eq!(env.rollouts("wl-ns", "Deployment", "api").await, 2);
}

/// The entries the writes since `before` called, in order, each checked to be confighash's and
/// answered.
fn entries_since(env: &Env, before: usize) -> Vec<String> {
    env.api().webhook_calls()[before..]
        .iter()
        .map(|c| {
            assert_eq!(c.configuration, "confighash");
            assert!(
                !matches!(c.result, CallResult::FailedIgnored(_)),
                "{c:?} failed"
            );
            c.webhook.clone()
        })
        .collect()
}

/// Each write of a labelled workload, a CREATE, the watcher's touch, the UPDATEs that remove and
/// add the label, calls the webhook once, through one entry: `workload.confighash.dev` in a
/// plain namespace, `stamp.confighash.dev` in an opted-in one; an unlabelled workload in a plain
/// namespace calls it never.
#[tokio::test]
async fn each_write_of_a_labelled_workload_is_reviewed_once() {
    let Some(env) = Env::stand_in(
        "each_write_of_a_labelled_workload_is_reviewed_once",
        "it counts the API server's webhook calls per entry",
    )
    .await
    else {
        return;
    };
    env.namespace("wc-on", true).await;
    env.namespace("wc-plain", false).await;
    for ns in ["wc-on", "wc-plain"] {
        env.config_map(ns, "app-env", &[("LOG_LEVEL", "info")])
            .await;
    }
    env.barrier("wc-on").await;
    let uses = [("envFrom", "app-env")];
    let calls = || env.api().webhook_calls().len();

    for (ns, entry) in [("wc-plain", WORKLOAD_ENTRY), ("wc-on", STAMP_ENTRY)] {
        let before = calls();
        env.workload(ns, "Deployment", "web", &uses, opted_in())
            .await;
        assert_eq!(entries_since(&env, before), [entry], "{ns}: CREATE");
        assert!(env.stamp(ns, "Deployment", "web").await.is_some());
    }
    let before = calls();
    env.deployment("wc-plain", "other", &uses).await;
    assert_eq!(entries_since(&env, before), [] as [&str; 0], "unlabelled");
    env.barrier("wc-on").await;

    // The watcher's touch after a change: one call.
    for (ns, entry) in [("wc-plain", WORKLOAD_ENTRY), ("wc-on", STAMP_ENTRY)] {
        let before = calls();
        env.config_map(ns, "app-env", &[("LOG_LEVEL", "debug")])
            .await;
        env.wait_rollouts(ns, "Deployment", "web", 1).await;
        env.settled().await;
        assert_eq!(entries_since(&env, before), [entry], "{ns}: the touch");
    }

    // Removing the label and adding it back: one call each.
    for value in [Value::Null, json!("true")] {
        let before = calls();
        label_workload(&env, "wc-plain", "web", value.clone()).await;
        assert_eq!(
            entries_since(&env, before),
            [WORKLOAD_ENTRY],
            "label {value}"
        );
        env.barrier("wc-on").await;
    }
    assert_eq!(env.rollouts("wc-plain", "Deployment", "web").await, 1);
    assert_eq!(env.rollouts("wc-plain", "Deployment", "other").await, 0);
    assert_eq!(
        env.metrics.workloads_bypassed(),
        0,
        "every labelled workload passed through the webhook"
    );
}

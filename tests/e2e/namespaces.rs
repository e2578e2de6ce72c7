//! End to end: namespaces as a cluster handles them. A deleted namespace terminates first (its
//! objects go over a second, then the Namespace), and admission sees namespace labels through a
//! cache that lags the store.
//!
//! Needs the in-memory API server (its termination time and admission cache lag are set here).

use crate::support;

use std::time::Duration;

use confighash::core::rules;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;
use support::{Env, Setup};

/// How many writes of Events the API server has received so far (a new Event is a create, a
/// repeat of one is a patch of its series).
fn event_writes(env: &Env) -> usize {
    env.api()
        .requests()
        .iter()
        .filter(|(verb, resource)| (verb == "create" || verb == "patch") && resource == "events")
        .count()
}

/// Deleting an opted-in namespace deletes its ConfigMaps, which with `--roll-on-delete` would
/// change the stamps of the workloads that use them: confighash must leave the namespace alone
/// from its first sign of termination, touching nothing and recording no Event there.
#[tokio::test]
async fn deleting_an_opted_in_namespace_touches_nothing_even_with_roll_on_delete() {
    let mut setup = Setup::default();
    setup.watcher.rules = rules::Options {
        roll_on_delete: true,
        ..Default::default()
    };
    let Some(env) = Env::stand_in_with(
        "deleting_an_opted_in_namespace_touches_nothing_even_with_roll_on_delete",
        "its watcher runs --roll-on-delete, and it counts the Events confighash writes",
        setup,
    )
    .await
    else {
        return;
    };
    for ns in ["doomed", "other"] {
        env.namespace(ns, true).await;
    }
    env.config_map("doomed", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.secret("doomed", "token", &[("token", "t")]).await;
    for name in ["web", "api"] {
        env.deployment(
            "doomed",
            name,
            &[("envFrom", "app-env"), ("secretEnvFrom", "token")],
        )
        .await;
    }
    env.barrier("doomed").await;
    env.barrier("other").await;
    // Events are recorded in their own task: the two barriers' ConfigChanged Events are counted
    // before the deletion, not after it (under load one landed after this point and was taken
    // for an Event of the deletion).
    env.eventually("the barriers' Events", || async { event_writes(&env) >= 2 })
        .await;
    let mark = env.mark("other").await;
    let events = event_writes(&env);
    let barrier_before = env.rollouts("other", "Deployment", "barrier").await;

    Api::<Namespace>::all(env.client.clone())
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    env.eventually("the namespace to be gone", || async {
        Api::<Namespace>::all(env.client.clone())
            .get_opt("doomed")
            .await
            .unwrap()
            .is_none()
    })
    .await;
    // The deletions came on the same watches before the barrier's change.
    env.barrier("other").await;
    env.assert_quiet_since(&mark, "web", "the namespace was deleted")
        .await;
    let barrier = env.rollouts("other", "Deployment", "barrier").await - barrier_before;
    let barrier = usize::try_from(barrier).unwrap();
    // Events are recorded in their own task: wait for the barrier's.
    env.eventually("the barrier's Event", || async {
        event_writes(&env) - events >= barrier
    })
    .await;
    let written: Vec<String> = env
        .api()
        .audit()
        .into_iter()
        .filter(|r| r.resource == "events" && (r.verb == "create" || r.verb == "patch"))
        .map(|r| format!("{} {}/{}", r.verb, r.namespace, r.name))
        .collect();
    assert_eq!(
        event_writes(&env) - events,
        barrier,
        "Events besides the barrier's ConfigChanged; every Event write: {written:?}"
    );
}

/// Admission reads namespace labels from a cache that lags the store: a workload created just
/// after its namespace opts in can miss the webhook. It is not counted as bypassing the webhook
/// (that happens within the grace after an opt-in), and its next config change stamps it and
/// rolls it once.
#[tokio::test]
async fn a_workload_created_before_admission_sees_the_opt_in_is_stamped_at_its_next_change() {
    let Some(env) = Env::stand_in(
        "a_workload_created_before_admission_sees_the_opt_in_is_stamped_at_its_next_change",
        "it sets the admission cache lag",
    )
    .await
    else {
        return;
    };
    let lag = Duration::from_secs(2);
    env.api().set_namespace_cache_lag(lag);
    env.namespace("late", false).await;
    env.eventually("admission's view to hold the namespace", || async {
        env.api().cached_namespace("late").is_some()
    })
    .await;
    env.config_map("late", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    Api::<Namespace>::all(env.client.clone())
        .patch(
            "late",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"confighash.dev/enabled": "true"}}})),
        )
        .await
        .unwrap();
    env.deployment("late", "web", &[("envFrom", "app-env")])
        .await;
    let cached = env.api().cached_namespace("late").unwrap();
    assert!(
        cached
            .pointer("/metadata/labels/confighash.dev~1enabled")
            .is_none(),
        "the scenario needs the create to come before admission sees the label: {cached}"
    );
    assert_eq!(
        env.stamp("late", "Deployment", "web").await,
        None,
        "admission did not see the opt-in yet"
    );

    env.api().set_namespace_cache_lag(Duration::ZERO);
    env.barrier("late").await;
    assert_eq!(env.rollouts("late", "Deployment", "web").await, 0);
    assert_eq!(
        env.metrics.workloads_bypassed(),
        0,
        "created within the grace after the opt-in"
    );

    env.config_map("late", "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.wait_rollouts("late", "Deployment", "web", 1).await;
    env.barrier("late").await;
    assert_eq!(env.rollouts("late", "Deployment", "web").await, 1);
    assert!(env.stamp("late", "Deployment", "web").await.is_some());
    assert_eq!(env.events("late", "web", "ConfigChanged").await, 1);
}

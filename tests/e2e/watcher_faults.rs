//! End to end: the watcher when the webhook keeps turning its touches back (every lookup of a
//! ConfigMap fails, so the webhook keeps the old stamp): touches follow the backoff rather than
//! the change window, a `TouchFailed` Event says why the pods have not rolled, and once lookups
//! work again the workload rolls exactly once and nothing is left pending.
//!
//! The faults are injected into the in-memory API server; against a real cluster these
//! scenarios are skipped.

use crate::support;

use std::time::Duration;

use confighash::cluster::get::LOOKUP_USER_AGENT;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use support::{DEADLINE, Env, Setup, WINDOW};

const NS: &str = "faults";

/// Patches of Deployments the API server has received so far.
fn deployment_patches(env: &Env) -> usize {
    env.api()
        .requests()
        .iter()
        .filter(|(verb, resource)| verb == "patch" && resource == "deployments")
        .count()
}

/// The most touches of one workload the watcher may send within `elapsed` of a change, when
/// every touch is turned back: the first when the window closes, then each one no sooner than a
/// window (the per-workload interval) and the backoff (doubling from `retry_base`) after the
/// one before. Touches can only come later than this (lookups and patches take time).
fn most_touches_within(elapsed: Duration, retry_base: Duration) -> usize {
    let mut at = WINDOW;
    let mut touches = 0;
    while at <= elapsed {
        touches += 1;
        at += WINDOW.max(retry_base * (1 << (touches - 1).min(16)));
    }
    touches
}

/// `TouchFailed` Events on a workload of the namespace.
async fn touch_failed_events(env: &Env, name: &str) -> Vec<Event> {
    env.recorded_events(NS, name, "TouchFailed").await
}

#[tokio::test]
async fn touches_the_webhook_turns_back_follow_the_backoff_then_the_workload_rolls_once() {
    let setup = Setup::default();
    let retry_base = setup.watcher.retry_base;
    let Some(env) = Env::stand_in_with(
        "touches_the_webhook_turns_back_follow_the_backoff_then_the_workload_rolls_once",
        "fails the webhook's lookups, counts requests, reads the watcher's metrics",
        setup,
    )
    .await
    else {
        return;
    };
    env.namespace(NS, true).await;
    env.config_map(NS, "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.deployment(NS, "web", &[("envFrom", "app-env")]).await;
    let before = env.stamp(NS, "Deployment", "web").await;
    assert!(before.is_some(), "stamped at CREATE");
    env.barrier(NS).await;
    assert_eq!(env.rollouts(NS, "Deployment", "web").await, 0);
    let patches_before = deployment_patches(&env);

    // From now on every read of a ConfigMap by the webhook fails (its lookups send their own
    // User-Agent; the watcher's reads before a touch still succeed), so it keeps the old stamp
    // of every touch.
    env.api()
        .fail_fraction_from(LOOKUP_USER_AGENT, Some("get"), Some("configmaps"), 1.0, 500);
    let changed = tokio::time::Instant::now();
    // Written without reading it first.
    Api::<ConfigMap>::namespaced(env.client.clone(), &env.ns(NS))
        .patch(
            "app-env",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"LOG_LEVEL": "debug"}})),
        )
        .await
        .unwrap();

    // Six touches turned back: at a window apart they would have taken 2.4 s; with the backoff,
    // the sixth comes 4 s after the change at the soonest.
    let turned_back = 6;
    env.eventually("six touches turned back", || async {
        env.metrics.touches("kept-by-webhook") >= turned_back
    })
    .await;
    let touches = deployment_patches(&env) - patches_before;
    let elapsed = changed.elapsed();
    assert!(
        touches <= most_touches_within(elapsed, retry_base),
        "{touches} touches within {elapsed:?}: more than the backoff allows"
    );
    assert!(
        elapsed >= Duration::from_secs(4),
        "six touches turned back within {elapsed:?}: they did not back off"
    );
    assert_eq!(env.rollouts(NS, "Deployment", "web").await, 0);
    assert_eq!(env.stamp(NS, "Deployment", "web").await, before);

    env.eventually("a TouchFailed Event on web", || async {
        !touch_failed_events(&env, "web").await.is_empty()
    })
    .await;
    let events = touch_failed_events(&env, "web").await;
    assert_eq!(events.len(), 1, "at most one every ten minutes: {events:?}");
    let note = events[0].note.as_deref().unwrap_or_default();
    assert!(
        note.contains("app-env")
            && note.contains("the webhook kept the old stamp")
            && note.contains("its pods have not rolled"),
        "{note:?}"
    );
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));

    // Lookups work again: the next retry lands, once.
    env.api().clear_faults();
    env.wait_rollouts(NS, "Deployment", "web", 1).await;
    env.barrier(NS).await;
    assert_eq!(env.rollouts(NS, "Deployment", "web").await, 1);
    assert_ne!(env.stamp(NS, "Deployment", "web").await, before);
    env.eventually("no touch pending or in flight", || async {
        env.metrics.touches_outstanding() == (0, 0)
    })
    .await;
    assert_eq!(env.rollouts(NS, "Deployment", "web").await, 1);
}

#[test]
fn the_bound_counts_the_window_then_the_backoff() {
    let base = Duration::from_millis(100);
    let ms = Duration::from_millis;
    // Touches at 0.4, 0.8, 1.2, 1.6, 2.4, 4.0 and 7.2 s.
    assert_eq!(most_touches_within(ms(399), base), 0);
    assert_eq!(most_touches_within(ms(400), base), 1);
    assert_eq!(most_touches_within(ms(1600), base), 4);
    assert_eq!(most_touches_within(ms(3999), base), 5);
    assert_eq!(most_touches_within(ms(4000), base), 6);
    assert_eq!(most_touches_within(ms(7200), base), 7);
    assert!(DEADLINE > ms(7200));
}

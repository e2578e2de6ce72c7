//! End to end: `confighash serve --dry-run`. The webhook is called for every workload and stamps
//! none; the watcher decides every change as usual and records a `WouldRoll` Event where it
//! would touch, once per change, and writes no workload. Leader election and Events go on.
//!
//! Needs the in-memory API server: confighash runs with a setup of its own, and the test counts
//! the writes the API server receives and reads confighash's metrics.
//!
//! The usual barrier ([`Env::barrier`]) waits for a sentinel to roll, which nothing does in a dry
//! run: [`dry_barrier`] waits for the sentinel's `WouldRoll` instead.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use confighash::core::checksum::StampKey;
use confighash::core::names::WOULD_ROLL_REASON;
use confighash::metrics::Metrics;
use confighash::watcher::leader::{self, LeaderConfig};
use confighash::watcher::state::WOULD_ROLL_OUTCOME;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use support::{Env, KEY, Setup};

const NS: &str = "shop";
const WORKLOAD_RESOURCES: [&str; 5] = [
    "deployments",
    "statefulsets",
    "daemonsets",
    "cronjobs",
    "rollouts",
];

/// Writes (create, update, patch) the API server received on these resources so far, from
/// anyone.
fn writes(env: &Env, resources: &[&str]) -> usize {
    env.api()
        .requests()
        .iter()
        .filter(|(verb, resource)| {
            matches!(verb.as_str(), "create" | "update" | "patch")
                && resources.contains(&resource.as_str())
        })
        .count()
}

/// How many times `WouldRoll` was recorded on the object `name`: a repeat of an Event is a patch
/// of its series, which counts its occurrences.
async fn would_rolls(env: &Env, name: &str) -> i32 {
    Api::<Event>::namespaced(env.client.clone(), NS)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|e| {
            e.reason.as_deref() == Some(WOULD_ROLL_REASON)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum()
}

/// The notes of the `WouldRoll` Events on `name`.
async fn would_roll_notes(env: &Env, name: &str) -> Vec<String> {
    Api::<Event>::namespaced(env.client.clone(), NS)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(WOULD_ROLL_REASON)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .filter_map(|e| e.note)
        .collect()
}

/// The barrier of a dry run: changes the sentinel ConfigMap and waits for the watcher to record
/// `WouldRoll` on the sentinel Deployment, then for it to settle. Watch events are handled in
/// order and a change joins the open window, so every change made before has been decided on
/// once it returns.
async fn dry_barrier(env: &Env, n: u32) {
    let before = would_rolls(env, "sentinel").await;
    env.config_map(NS, "sentinel", &[("n", &n.to_string())])
        .await;
    env.eventually("the sentinel's WouldRoll Event", || async {
        would_rolls(env, "sentinel").await > before
    })
    .await;
    env.settled().await;
}

/// A stamp of the installation's key that matches no config: made by confighash before the
/// config it was made of changed.
fn stale_stamp() -> String {
    let id = StampKey::new(KEY.to_vec()).unwrap().id().to_owned();
    format!("v2:{id}:{}", "0".repeat(64))
}

/// How many objects of `kind` the watcher keeps.
fn watched(env: &Env, kind: &str) -> u64 {
    let series = format!("confighash_watched_objects{{kind=\"{kind}\"}} ");
    env.metrics
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(&series)?.parse().ok())
        .unwrap_or(0)
}

fn has_marker(object: &Value) -> bool {
    object
        .pointer("/metadata/annotations/confighash.dev~1unstamped")
        .is_some()
}

#[tokio::test]
async fn a_dry_run_writes_no_workload_and_records_each_change_once() {
    let Some(mut env) = Env::stand_in_with(
        "a_dry_run_writes_no_workload_and_records_each_change_once",
        "runs confighash with --dry-run and counts what the API server receives",
        Setup {
            dry_run: true,
            start_watcher: false,
            ..Setup::default()
        },
    )
    .await
    else {
        return;
    };
    // Leader election as serve runs it, with short timings; the watcher touches only as leader.
    Api::<Namespace>::all(env.client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "confighash"}})).unwrap(),
        )
        .await
        .unwrap();
    let mut election = LeaderConfig::new("confighash", "replica-a");
    election.lease_duration = Duration::from_millis(1500);
    election.renew_deadline = Duration::from_millis(1000);
    election.retry_period = Duration::from_millis(200);
    let (leadership, _election) = leader::spawn(env.confighash.clone(), election);
    // The app's metrics, which its webhook counts in (a started watcher gets its own).
    let webhook_metrics: Arc<Metrics> = env.metrics.clone();
    // Reconcile runs several times between two barriers (each waits out a change window).
    env.config.resync = Duration::from_millis(150);
    assert!(
        env.config.dry_run,
        "the watcher runs as the app's --dry-run says"
    );
    env.start_watcher_with(leadership.clone());
    env.eventually("a leader", || async { leadership.is_leader() })
        .await;
    env.wait_synced().await;

    env.namespace(NS, true).await;
    env.config_map(NS, "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.secret(NS, "db", &[("password", "s3cret")]).await;
    env.config_map(NS, "sentinel", &[("n", "0")]).await;
    // The watcher has them before the workloads come: their appearance is no change to them.
    env.eventually("the watcher to keep the config", || async {
        watched(&env, "ConfigMap") >= 2 && watched(&env, "Secret") >= 1
    })
    .await;
    let refs = [("envFrom", "app-env"), ("secretEnvFrom", "db")];
    let workloads_before = writes(&env, &WORKLOAD_RESOURCES);
    let mut created = 0;
    let mut workloads = Vec::new();
    for (kind, name) in [
        ("Deployment", "web"),
        ("StatefulSet", "db"),
        ("DaemonSet", "agent"),
        ("CronJob", "backup"),
        ("Rollout", "front"),
    ] {
        if !env.serves(kind) {
            continue;
        }
        env.workload(NS, kind, name, &refs, json!({})).await;
        created += 1;
        workloads.push((kind, name));
    }
    // Stamped by confighash before its config changed (written as it is: the dry run's webhook
    // does not correct it).
    let mut stale = support::workload_object("Deployment", "stale", &refs, json!({}));
    stale["spec"]["template"]["metadata"]["annotations"] = json!({support::STAMP: stale_stamp()});
    Api::<kube::api::DynamicObject>::namespaced_with(
        env.client.clone(),
        NS,
        &support::api_resource("Deployment"),
    )
    .create(
        &PostParams::default(),
        &serde_json::from_value(stale).unwrap(),
    )
    .await
    .unwrap();
    created += 1;
    env.deployment(NS, "sentinel", &[("envFrom", "sentinel")])
        .await;
    created += 1;

    // The webhook decided to stamp every CREATE, and stamped none.
    for (kind, name) in &workloads {
        let object = env.get_workload(NS, kind, name).await.unwrap();
        assert_eq!(env.stamp(NS, kind, name).await, None, "{kind} {name}");
        assert!(!has_marker(&object), "{kind} {name}: {object}");
    }
    assert_eq!(
        env.stamp(NS, "Deployment", "stale").await,
        Some(stale_stamp()),
        "a stamp in the manifest is not corrected"
    );
    // web, stale and the sentinel.
    assert_eq!(
        webhook_metrics.requests("Deployment", "CREATE", "stamped"),
        3
    );
    assert_eq!(
        webhook_metrics.dry_runs("Deployment", "CREATE", "stamped"),
        3
    );

    dry_barrier(&env, 1).await;
    // Reconcile found the stale stamp once, whatever the resyncs since.
    env.eventually("the stale stamp's WouldRoll", || async {
        would_rolls(&env, "stale").await == 1
    })
    .await;
    assert_eq!(
        would_roll_notes(&env, "stale").await,
        [
            "its stamp was stale; confighash would re-stamp the pod template and its pods would \
          roll (dry run)"
        ]
    );
    for (_, name) in &workloads {
        assert_eq!(would_rolls(&env, name).await, 0, "{name}: nothing changed");
    }
    let leases_before = writes(&env, &["leases"]);
    let events_before = writes(&env, &["events"]);
    let would_roll_before = env.metrics.touches(WOULD_ROLL_OUTCOME);

    // One change: one WouldRoll on each workload that uses it.
    env.config_map(NS, "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    dry_barrier(&env, 2).await;
    for name in workloads.iter().map(|(_, n)| *n).chain(["stale"]) {
        let expected = if name == "stale" { 2 } else { 1 };
        env.eventually(&format!("{name}'s WouldRoll"), || async {
            would_rolls(&env, name).await == expected
        })
        .await;
    }
    assert_eq!(
        would_roll_notes(&env, "web").await,
        [
            "ConfigMap app-env changed; confighash would re-stamp the pod template and its pods \
          would roll (dry run)"
        ]
    );
    // The same change seen again: reconcile every 150 ms, and a barrier, record nothing more.
    dry_barrier(&env, 3).await;
    for name in workloads.iter().map(|(_, n)| *n).chain(["stale"]) {
        let expected = if name == "stale" { 2 } else { 1 };
        assert_eq!(would_rolls(&env, name).await, expected, "{name}");
    }
    let changed = u64::try_from(workloads.len()).unwrap() + 1;
    assert_eq!(
        env.metrics.touches(WOULD_ROLL_OUTCOME) - would_roll_before,
        changed + 2,
        "one per workload that uses app-env, and the sentinel's two barriers"
    );

    // A new change is recorded anew.
    env.secret(NS, "db", &[("password", "rotated")]).await;
    dry_barrier(&env, 4).await;
    env.eventually("web's second WouldRoll", || async {
        would_rolls(&env, "web").await == 2
    })
    .await;

    // Nothing wrote a workload but the test's own creates; confighash touched none.
    assert_eq!(
        writes(&env, &WORKLOAD_RESOURCES) - workloads_before,
        created,
        "writes to workloads: {:?}",
        env.api()
            .requests()
            .iter()
            .filter(|(_, r)| WORKLOAD_RESOURCES.contains(&r.as_str()))
            .collect::<Vec<_>>()
    );
    assert_eq!(env.touches(), 0, "{}", env.touch_outcomes());
    for (kind, name) in &workloads {
        assert_eq!(env.stamp(NS, kind, name).await, None, "{kind} {name}");
        if env.counts_rollouts(kind) {
            assert_eq!(env.rollouts(NS, kind, name).await, 0, "{kind} {name}");
        }
    }
    // Its own writes went on: the Lease renewed, the Events recorded.
    assert!(writes(&env, &["leases"]) > leases_before);
    assert!(writes(&env, &["events"]) > events_before);
    assert!(leadership.is_leader());
}

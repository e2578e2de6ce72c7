//! End to end: confighash's lifecycle and failure modes. Restarts, lookup failures, a webhook
//! that is down, a replaced key, a killed leader, dropped watches, Events and rate limits; each
//! scenario checks rollout counts. Restarts run on a real cluster too, with the real tier's
//! `serve.sh` ([`Env::controlling`]); the rest need the in-memory API server and confighash
//! in-process (they inject faults, stop the webhook alone, swap the key or read metrics), so on
//! a real cluster they are skipped.

use crate::support;

use std::time::Duration;

use confighash::cluster::get::LOOKUP_USER_AGENT;
use confighash::core::checksum::StampKey;
use confighash::watcher::WatcherConfig;
use confighash::watcher::leader::Leadership;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use support::{Env, Setup};

const NS: &str = "shop";
const UNSTAMPED: &str = "confighash.dev/unstamped";

/// An opted-in namespace with ConfigMap `app-env` and Deployment `web` using it, stamped at
/// CREATE and settled (no rollout).
async fn shop(env: &Env) {
    env.namespace(NS, true).await;
    env.config_map(NS, "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.deployment(NS, "web", &[("envFrom", "app-env")]).await;
    assert!(
        env.stamp(NS, "Deployment", "web").await.is_some(),
        "stamped at CREATE"
    );
    env.barrier(NS).await;
    assert_eq!(env.rollouts(NS, "Deployment", "web").await, 0);
}

/// The `confighash.dev/unstamped` marker on a workload's metadata.
async fn marker(env: &Env, name: &str) -> Option<String> {
    env.get_workload(NS, "Deployment", name)
        .await?
        .pointer("/metadata/annotations")?
        .get(UNSTAMPED)?
        .as_str()
        .map(str::to_owned)
}

/// The value of an unlabelled metric in the OpenMetrics text.
fn metric(env: &Env, name: &str) -> f64 {
    env.metrics
        .encode()
        .lines()
        .find_map(|line| {
            let (n, v) = line.split_once(' ')?;
            (n == name).then(|| v.trim().parse::<f64>().ok())?
        })
        .unwrap_or(0.0)
}

/// Creates a StatefulSet with `updateStrategy: OnDelete` through the API.
async fn on_delete_stateful_set(env: &Env, name: &str, refs: &[(&str, &str)]) {
    let mut obj = support::workload_object("StatefulSet", name, refs, json!({}));
    obj["spec"]["updateStrategy"] = json!({"type": "OnDelete"});
    let sts: StatefulSet = serde_json::from_value(obj).unwrap();
    Api::<StatefulSet>::namespaced(env.client.clone(), &env.ns(NS))
        .create(&PostParams::default(), &sts)
        .await
        .unwrap();
}

/// The ConfigChanged Events recorded for the workload `name`.
async fn config_changed_events(env: &Env, name: &str) -> Vec<Event> {
    env.recorded_events(NS, name, "ConfigChanged").await
}

#[tokio::test]
async fn a_restart_with_nothing_changed_rolls_nothing() {
    let Some(mut env) = Env::controlling(
        "a_restart_with_nothing_changed_rolls_nothing",
        Setup::default(),
    )
    .await
    else {
        return;
    };
    shop(&env).await;
    let mark = env.mark(NS).await;

    env.stop_confighash(false).await;
    env.start_confighash().await;
    // Twice: the first may be handled by the new watcher's reconcile at start, in the same pass
    // as `web`; by the second, that pass is over.
    env.barrier(NS).await;
    env.barrier(NS).await;
    assert_eq!(
        env.rollouts(NS, "Deployment", "web").await,
        0,
        "stamps are compared, not replayed"
    );
    env.assert_quiet_since(&mark, "web", "a restart").await;
}

#[tokio::test]
async fn a_change_made_while_the_watcher_was_down_rolls_once_at_start() {
    let Some(mut env) = Env::controlling(
        "a_change_made_while_the_watcher_was_down_rolls_once_at_start",
        Setup::default(),
    )
    .await
    else {
        return;
    };
    shop(&env).await;
    let before = env.stamp(NS, "Deployment", "web").await;

    // In the stand-in the watcher alone stops; on a real cluster the process (webhook and
    // watcher), as a rollout of confighash's Deployment does.
    if env.is_stand_in() {
        env.stop_watcher();
    } else {
        env.stop_confighash(false).await;
    }
    env.config_map(NS, "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    if env.is_stand_in() {
        env.start_watcher();
    } else {
        env.start_confighash().await;
    }
    env.wait_rollouts(NS, "Deployment", "web", 1).await;
    env.barrier(NS).await;
    assert_eq!(env.rollouts(NS, "Deployment", "web").await, 1);
    assert_ne!(env.stamp(NS, "Deployment", "web").await, before);
}

#[tokio::test]
async fn a_lookup_failure_at_create_is_marked_and_reconcile_resolves_it() {
    let Some(mut env) = Env::stand_in(
        "a_lookup_failure_at_create_is_marked_and_reconcile_resolves_it",
        "fails the webhook's lookup, restarts the watcher",
    )
    .await
    else {
        return;
    };
    env.namespace(NS, true).await;
    env.config_map(NS, "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.barrier(NS).await;

    // The webhook's one lookup (a get of `app-env`) fails.
    env.api()
        .fail_next_from(LOOKUP_USER_AGENT, Some("get"), Some("configmaps"), 1, 500);
    env.deployment(NS, "web", &[("envFrom", "app-env")]).await;
    assert_eq!(
        marker(&env, "web").await.as_deref(),
        Some("lookup-failed"),
        "a CREATE the webhook could not stamp is marked"
    );
    assert_eq!(env.stamp(NS, "Deployment", "web").await, None);
    assert_eq!(env.rollouts(NS, "Deployment", "web").await, 0);

    // Reconcile at start resolves the marker.
    env.stop_watcher();
    env.start_watcher();
    env.wait_rollouts(NS, "Deployment", "web", 1).await;
    env.eventually("the marker to go", || async {
        marker(&env, "web").await.is_none()
    })
    .await;
    let stamp = env.stamp(NS, "Deployment", "web").await;
    assert!(stamp.is_some(), "stamped by reconcile");
    env.deployment(NS, "twin", &[("envFrom", "app-env")]).await;
    assert_eq!(stamp, env.stamp(NS, "Deployment", "twin").await);
    env.barrier(NS).await;
    assert_eq!(env.rollouts(NS, "Deployment", "web").await, 1);
}

#[tokio::test]
async fn a_change_while_the_webhook_is_down_still_lands_with_the_right_stamp() {
    let Some(mut env) = Env::controlling(
        "a_change_while_the_webhook_is_down_still_lands_with_the_right_stamp",
        Setup::default(),
    )
    .await
    else {
        return;
    };
    shop(&env).await;
    let before = env.stamp(NS, "Deployment", "web").await;

    // failurePolicy Ignore: the watcher's touch is admitted as it is.
    env.stop_webhook().await;
    env.config_map(NS, "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.wait_rollouts(NS, "Deployment", "web", 1).await;
    let stamp = env.stamp(NS, "Deployment", "web").await;
    assert_ne!(stamp, before);

    env.restart_webhook().await;
    env.deployment(NS, "twin", &[("envFrom", "app-env")]).await;
    assert_eq!(
        stamp,
        env.stamp(NS, "Deployment", "twin").await,
        "the watcher's stamp is the one the webhook computes"
    );
    env.barrier(NS).await;
    assert_eq!(env.rollouts(NS, "Deployment", "web").await, 1);
}

#[tokio::test]
async fn a_replaced_key_rolls_nothing_until_a_config_change() {
    let Some(mut env) = Env::controlling(
        "a_replaced_key_rolls_nothing_until_a_config_change",
        Setup::default(),
    )
    .await
    else {
        return;
    };
    shop(&env).await;
    let old = env.stamp(NS, "Deployment", "web").await.unwrap();

    // A key of this run's own: on a real cluster an earlier run may have left the fixed one.
    let bytes: [u8; 32] = rand::random();
    let new_key = StampKey::new(bytes.to_vec()).unwrap();
    let new_id = new_key.id().to_owned();
    assert!(!old.starts_with(&format!("v2:{new_id}:")));
    // Reconcile after a restart leaves the foreign stamp alone.
    env.replace_key(&bytes).await;
    env.barrier(NS).await;
    env.barrier(NS).await;
    // An UPDATE that leaves the template unchanged keeps it too.
    Api::<Deployment>::namespaced(env.client.clone(), &env.ns(NS))
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "shop"}}})),
        )
        .await
        .unwrap();
    env.barrier(NS).await;
    assert_eq!(env.rollouts(NS, "Deployment", "web").await, 0);
    assert_eq!(
        env.stamp(NS, "Deployment", "web").await.as_deref(),
        Some(old.as_str())
    );

    // The next config change replaces it.
    env.config_map(NS, "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.wait_rollouts(NS, "Deployment", "web", 1).await;
    env.barrier(NS).await;
    assert_eq!(env.rollouts(NS, "Deployment", "web").await, 1);
    let stamp = env.stamp(NS, "Deployment", "web").await.unwrap();
    assert!(
        stamp.starts_with(&format!("v2:{new_id}:")),
        "{stamp} carries the new key id {new_id}"
    );
}

#[tokio::test]
async fn a_killed_leader_is_replaced_and_a_change_rolls_once() {
    let Some(mut env) = Env::stand_in_with(
        "a_killed_leader_is_replaced_and_a_change_rolls_once",
        "runs two replicas in-process and stops the leader",
        Setup {
            start_watcher: false,
            ..Default::default()
        },
    )
    .await
    else {
        return;
    };
    Api::<Namespace>::all(env.client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "confighash"}})).unwrap(),
        )
        .await
        .unwrap();
    let (lead_a, elect_a) = env.elect("replica-a");
    let (lead_b, elect_b) = env.elect("replica-b");
    env.start_watcher_with(lead_a.clone());
    let watcher_b = env.spawn_watcher("replica-b", lead_b.clone());
    shop(&env).await;
    env.eventually("a leader", || async {
        lead_a.is_leader() || lead_b.is_leader()
    })
    .await;

    let (survivor, survivor_election, survivor_watcher): (Leadership, _, _) = if lead_a.is_leader()
    {
        env.stop_watcher();
        elect_a.abort();
        (lead_b, elect_b, Some(watcher_b))
    } else {
        watcher_b.abort();
        elect_b.abort();
        (lead_a, elect_a, None)
    };
    env.eventually("the other replica to take over", || async {
        survivor.is_leader()
    })
    .await;

    env.config_map(NS, "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.wait_rollouts(NS, "Deployment", "web", 1).await;
    env.barrier(NS).await;
    assert_eq!(
        env.rollouts(NS, "Deployment", "web").await,
        1,
        "one rollout, never two"
    );
    survivor_election.abort();
    if let Some(w) = survivor_watcher {
        w.abort();
    }
}

#[tokio::test]
async fn a_dropped_watch_and_410_during_a_change_still_roll_once() {
    let Some(env) = Env::stand_in(
        "a_dropped_watch_and_410_during_a_change_still_roll_once",
        "closes watches, compacts history",
    )
    .await
    else {
        return;
    };
    shop(&env).await;

    env.config_map(NS, "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.api().close_watches();
    env.api().compact();
    env.wait_rollouts(NS, "Deployment", "web", 1).await;
    env.barrier(NS).await;
    assert_eq!(env.rollouts(NS, "Deployment", "web").await, 1);
}

/// Every new watch fails until the faults are cleared, the open ones are closed, `app-env`
/// changes and history is compacted past the change: the next watch gets 410 and lists again.
/// Returns once a watch was refused after the change, the faults still in place.
async fn change_while_the_watches_are_down(env: &Env) {
    env.api().fail_next(Some("watch"), None, u32::MAX, 500);
    env.api().close_watches();
    env.config_map(NS, "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.api().compact();
    let refused = env.api().injected_faults().len();
    env.eventually("a watch refused after the change", || async {
        env.api().injected_faults().len() > refused
    })
    .await;
}

/// The watches go down, a change is made while they are down, and history is compacted past
/// it: the watcher's next watch gets 410 Gone and lists again, and only that list carries the
/// change. It rolls once, with one touch.
#[tokio::test]
async fn a_change_made_while_the_watches_are_down_is_carried_by_the_relist() {
    let Some(env) = Env::stand_in(
        "a_change_made_while_the_watches_are_down_is_carried_by_the_relist",
        "refuses and closes watches, compacts history, reads metrics",
    )
    .await
    else {
        return;
    };
    shop(&env).await;
    let touched = env.metrics.touches("touched");

    change_while_the_watches_are_down(&env).await;
    assert_eq!(
        env.rollouts(NS, "Deployment", "web").await,
        0,
        "nothing can have seen the change yet"
    );
    env.api().clear_faults();

    env.wait_rollouts(NS, "Deployment", "web", 1).await;
    env.barrier(NS).await;
    assert_eq!(env.rollouts(NS, "Deployment", "web").await, 1);
    // The barrier's own touch is the other one.
    assert_eq!(env.metrics.touches("touched") - touched, 2);
}

/// As above, on an API server that ends a watch from a compacted version at once with no event
/// instead of the 410 it owes (kube-apiserver does for Events, and was seen to on 1.35 after a
/// restart and a compaction): the watcher does not resume from that version for ever but lists
/// again, and the change rolls once.
#[tokio::test]
async fn a_watch_ended_at_once_without_its_410_lists_again_and_the_change_rolls_once() {
    let Some(env) = Env::stand_in_with(
        "a_watch_ended_at_once_without_its_410_lists_again_and_the_change_rolls_once",
        "ends expired watches without a 410, refuses and closes watches, compacts history",
        Setup {
            silent_expired_watches: true,
            ..Setup::default()
        },
    )
    .await
    else {
        return;
    };
    shop(&env).await;

    change_while_the_watches_are_down(&env).await;
    env.api().clear_faults();
    env.wait_rollouts(NS, "Deployment", "web", 1).await;
    env.barrier(NS).await;
    assert_eq!(env.rollouts(NS, "Deployment", "web").await, 1);
    assert_eq!(env.events(NS, "web", "ConfigChanged").await, 1);
}

/// The watcher's lists are streaming lists where the API server serves them, and pages of
/// `list` calls where it refuses them (kube-apiserver 1.33, whose `WatchList` gate is off):
/// either way a change rolls once, and a relist after 410 carries a change made while the
/// watches were down.
#[tokio::test]
async fn the_watcher_streams_its_lists_and_pages_them_where_the_server_cannot_stream() {
    for watch_list in [true, false] {
        let setup = Setup {
            watch_list,
            ..Setup::default()
        };
        let Some(env) = Env::stand_in_with(
            "the_watcher_streams_its_lists_and_pages_them_where_the_server_cannot_stream",
            "turns the WatchList gate off, compacts history, counts requests",
            setup,
        )
        .await
        else {
            return;
        };
        shop(&env).await;
        let lists = |resource: &str| {
            env.api()
                .audit()
                .iter()
                .filter(|r| {
                    r.user == "system:serviceaccount:confighash:confighash"
                        && r.verb == "list"
                        && r.resource == resource
                        && r.namespace.is_empty()
                })
                .count()
        };
        let (config_maps, secrets) = (lists("configmaps"), lists("secrets"));
        if watch_list {
            assert_eq!((config_maps, secrets), (0, 0), "streamed, not listed");
        } else {
            assert!(config_maps >= 1 && secrets >= 1, "listed in pages");
        }

        change_while_the_watches_are_down(&env).await;
        env.api().clear_faults();
        env.wait_rollouts(NS, "Deployment", "web", 1).await;
        env.barrier(NS).await;
        assert_eq!(env.rollouts(NS, "Deployment", "web").await, 1);
        assert_eq!(env.events(NS, "web", "ConfigChanged").await, 1);
        if watch_list {
            assert_eq!(lists("configmaps"), 0, "the relist streamed too");
        } else {
            assert!(lists("configmaps") > config_maps, "the relist listed again");
        }
    }
}

#[tokio::test]
async fn a_stamp_kept_by_the_webhook_is_retried_until_it_lands() {
    let Some(env) = Env::stand_in(
        "a_stamp_kept_by_the_webhook_is_retried_until_it_lands",
        "fails the webhook's lookups, reads metrics",
    )
    .await
    else {
        return;
    };
    shop(&env).await;
    let before = env.stamp(NS, "Deployment", "web").await;

    env.config_map(NS, "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    // The webhook's lookups fail for the first touches: it keeps the old stamp.
    env.api()
        .fail_next_from(LOOKUP_USER_AGENT, Some("get"), Some("configmaps"), 3, 500);
    env.wait_rollouts(NS, "Deployment", "web", 1).await;
    let stamp = env.stamp(NS, "Deployment", "web").await;
    assert_ne!(stamp, before);
    assert!(
        env.metrics.touches("kept-by-webhook") >= 1,
        "the kept stamp was noticed"
    );
    assert!(metric(&env, "confighash_touch_retries_total") >= 1.0);

    env.deployment(NS, "twin", &[("envFrom", "app-env")]).await;
    assert_eq!(stamp, env.stamp(NS, "Deployment", "twin").await);
    env.barrier(NS).await;
    assert_eq!(env.rollouts(NS, "Deployment", "web").await, 1);
}

#[tokio::test]
async fn a_change_records_an_event_naming_the_config_map() {
    let env = Env::start().await;
    shop(&env).await;
    on_delete_stateful_set(&env, "db", &[("envFrom", "app-env")]).await;
    env.barrier(NS).await;
    assert_eq!(env.rollouts(NS, "StatefulSet", "db").await, 0);

    env.config_map(NS, "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.wait_rollouts(NS, "Deployment", "web", 1).await;
    env.wait_rollouts(NS, "StatefulSet", "db", 1).await;

    env.eventually("an Event on web", || async {
        !config_changed_events(&env, "web").await.is_empty()
    })
    .await;
    let events = config_changed_events(&env, "web").await;
    let event = &events[0];
    assert_eq!(event.type_.as_deref(), Some("Normal"));
    let note = event.note.as_deref().unwrap_or_default();
    assert!(note.contains("app-env"), "{note:?} names the ConfigMap");
    let regarding = event.regarding.as_ref().unwrap();
    assert_eq!(regarding.kind.as_deref(), Some("Deployment"));

    env.eventually("an Event on db", || async {
        !config_changed_events(&env, "db").await.is_empty()
    })
    .await;
    let events = config_changed_events(&env, "db").await;
    let event = &events[0];
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let note = event.note.as_deref().unwrap_or_default();
    assert!(note.contains("app-env"), "{note:?} names the ConfigMap");
    assert!(
        note.contains("will not roll by themselves"),
        "{note:?} says the pods will not roll"
    );

    env.barrier(NS).await;
    assert_eq!(env.rollouts(NS, "Deployment", "web").await, 1);
    assert_eq!(env.rollouts(NS, "StatefulSet", "db").await, 1);
}

#[tokio::test]
async fn a_change_shared_by_many_workloads_is_rate_limited_and_rolls_each_once() {
    let Some(env) = Env::stand_in_with(
        "a_change_shared_by_many_workloads_is_rate_limited_and_rolls_each_once",
        "sets --max-touches-per-second, reads metrics",
        Setup {
            watcher: WatcherConfig {
                max_touches_per_second: 2.0,
                ..Setup::default().watcher
            },
            ..Default::default()
        },
    )
    .await
    else {
        return;
    };
    env.namespace(NS, true).await;
    env.config_map(NS, "shared", &[("LOG_LEVEL", "info")]).await;
    let names: Vec<String> = (0..30).map(|i| format!("web-{i}")).collect();
    for name in &names {
        env.deployment(NS, name, &[("envFrom", "shared")]).await;
    }
    env.barrier(NS).await;

    env.config_map(NS, "shared", &[("LOG_LEVEL", "debug")])
        .await;
    for name in &names {
        env.wait_rollouts(NS, "Deployment", name, 1).await;
    }
    env.barrier(NS).await;
    for name in &names {
        assert_eq!(
            env.rollouts(NS, "Deployment", name).await,
            1,
            "{name} rolled once"
        );
    }
    let limited = metric(&env, "confighash_touches_rate_limited_total");
    assert!(limited > 0.0, "the token bucket held touches back");
}

/// Polls for up to `within` until `name` has rolled `n` times; returns the count then (for
/// scenarios that must not wait the full DEADLINE when confighash misbehaves).
async fn rollouts_within(env: &Env, name: &str, n: u64, within: Duration) -> u64 {
    let start = tokio::time::Instant::now();
    loop {
        let now = env.rollouts(NS, "Deployment", name).await;
        if now >= n || start.elapsed() >= within {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// README ("When a stamp changes", rule 3; "The watcher"): a foreign stamp is replaced at the next config change the
// watcher acts on, and a touch whose stamp the webhook kept is retried. The retry is scheduled
// with an empty change set, so `touch_due` decides it as `Trigger::Reconcile`, which keeps
// foreign stamps: the retry is dropped and the change never lands.
#[tokio::test]
async fn a_change_kept_by_the_webhook_on_a_foreign_stamp_lands_on_retry() {
    let Some(env) = Env::stand_in(
        "a_change_kept_by_the_webhook_on_a_foreign_stamp_lands_on_retry",
        "swaps the key, fails a lookup, reads metrics",
    )
    .await
    else {
        return;
    };
    shop(&env).await;
    let new_key = StampKey::new(b"fedcba9876543210fedcba9876543210".to_vec()).unwrap();
    let new_id = new_key.id().to_owned();
    env.keys.set(new_key);
    env.barrier(NS).await;
    assert_eq!(env.rollouts(NS, "Deployment", "web").await, 0);

    env.config_map(NS, "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    // The first touch's lookup in the webhook fails: it keeps the foreign stamp.
    env.api()
        .fail_next_from(LOOKUP_USER_AGENT, Some("get"), Some("configmaps"), 1, 500);
    let rolled = rollouts_within(&env, "web", 1, Duration::from_secs(5)).await;
    assert!(env.metrics.touches("kept-by-webhook") >= 1);
    assert_eq!(rolled, 1, "the retried touch lands");
    env.barrier(NS).await;
    assert_eq!(env.rollouts(NS, "Deployment", "web").await, 1);
    let stamp = env.stamp(NS, "Deployment", "web").await.unwrap();
    assert!(stamp.starts_with(&format!("v2:{new_id}:")), "{stamp}");
}

// README ("The watcher"): the Event names what changed. After a retry it says "its stamp was stale":
// the retry's `Pending` starts empty (its change set, and its attempt count, are dropped).
#[tokio::test]
async fn the_event_of_a_retried_touch_names_the_config_map() {
    let Some(env) = Env::stand_in(
        "the_event_of_a_retried_touch_names_the_config_map",
        "fails the webhook's lookups, reads metrics",
    )
    .await
    else {
        return;
    };
    shop(&env).await;
    env.config_map(NS, "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.api()
        .fail_next_from(LOOKUP_USER_AGENT, Some("get"), Some("configmaps"), 2, 500);
    env.wait_rollouts(NS, "Deployment", "web", 1).await;
    assert!(env.metrics.touches("kept-by-webhook") >= 1);
    env.eventually("an Event on web", || async {
        !config_changed_events(&env, "web").await.is_empty()
    })
    .await;
    for event in config_changed_events(&env, "web").await {
        let note = event.note.unwrap_or_default();
        assert!(note.contains("app-env"), "{note:?} names the ConfigMap");
    }
}

/// The TouchFailed Events recorded for the workload `name`.
async fn touch_failed_events(env: &Env, name: &str) -> Vec<Event> {
    env.recorded_events(NS, name, "TouchFailed").await
}

/// A touch that keeps failing (here: confighash's RBAC lost `patch` on Deployments) records one
/// Warning Event `TouchFailed` on the workload saying what failed, without the API server's
/// message, and when it is retried; the retries go on with backoff, and once the patch is allowed
/// again the change lands and rolls once.
#[tokio::test]
async fn a_touch_that_keeps_failing_records_one_touch_failed_event_and_lands_later() {
    let Some(env) = Env::stand_in(
        "a_touch_that_keeps_failing_records_one_touch_failed_event_and_lands_later",
        "changes the RBAC, reads metrics",
    )
    .await
    else {
        return;
    };
    shop(&env).await;
    let rbac = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/base/rbac.yaml"
    ))
    .unwrap();
    let no_patch = rbac.replace(
        "resources: [deployments, statefulsets, daemonsets]\n    verbs: [get, list, watch, patch]",
        "resources: [deployments, statefulsets, daemonsets]\n    verbs: [get, list, watch]",
    );
    assert_ne!(
        no_patch, rbac,
        "deploy/base/rbac.yaml grants patch on deployments"
    );
    let authorizer = |yaml: &str| {
        Some(confighash_testkit::apiserver::rbac::Authorizer::from_yaml(yaml).unwrap())
    };
    env.api().set_authorizer(authorizer(&no_patch));

    env.config_map(NS, "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.eventually("a TouchFailed Event on web", || async {
        !touch_failed_events(&env, "web").await.is_empty()
    })
    .await;
    assert!(
        env.metrics.touches("error") >= 2,
        "it failed more than once"
    );
    assert_eq!(env.rollouts(NS, "Deployment", "web").await, 0);
    let events = touch_failed_events(&env, "web").await;
    assert_eq!(events.len(), 1, "{events:#?}");
    let event = &events[0];
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(
        event.regarding.as_ref().unwrap().kind.as_deref(),
        Some("Deployment")
    );
    let note = event.note.as_deref().unwrap_or_default();
    for part in ["ConfigMap app-env changed", "403 Forbidden", "retrying in "] {
        assert!(note.contains(part), "{note:?} says {part:?}");
    }
    assert!(
        !note.contains("cannot patch resource"),
        "{note:?} quotes the API server's message"
    );

    // Allowed again: the next retry lands, and the workload rolls once.
    env.api().set_authorizer(authorizer(&rbac));
    env.wait_rollouts(NS, "Deployment", "web", 1).await;
    env.barrier(NS).await;
    assert_eq!(env.rollouts(NS, "Deployment", "web").await, 1);
    let events = touch_failed_events(&env, "web").await;
    assert_eq!(events.len(), 1, "rate-limited: {events:#?}");
    assert_eq!(events[0].series, None, "recorded once");
    assert!(
        !config_changed_events(&env, "web").await.is_empty(),
        "the touch that landed says so"
    );
}

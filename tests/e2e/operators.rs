//! End to end: workloads an operator owns and rewrites. A test operator keeps a Deployment (2
//! replicas) and a StatefulSet (3 replicas) as its desired state says, writing their whole spec
//! every 2 s, with no stamp in what it writes: once with server-side apply (forced, its own
//! field manager), once with update (a PUT of the stored object with the spec it built). One
//! ConfigMap change in the middle. The webhook stamps each of its writes, so the stamp is on
//! every template the API server stores, each workload rolls exactly once (every StatefulSet
//! ordinal on the new template, on a real cluster), and confighash's writes stay what one change
//! needs, however many the operator makes.
//!
//! Three minutes on a real cluster (as the issue of operator-owned workloads asks); 20 s in the
//! stand-in, which is there for speed.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::{Env, STAMP};

/// How the operator writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Write {
    /// Server-side apply, forced, field manager `test-operator`.
    Apply,
    /// GET, then PUT of the stored object with the operator's spec (field manager
    /// `test-operator`).
    Update,
}

const MANAGER: &str = "test-operator";
/// The operator's workloads: (kind, name, replicas).
const OWNED: [(&str, &str, i64); 2] = [("Deployment", "op-web", 2), ("StatefulSet", "op-db", 3)];
const PERIOD: Duration = Duration::from_secs(2);

/// What the operator saw of its writes.
#[derive(Default)]
struct Tally {
    writes: AtomicU64,
    /// Writes whose stored template (the answer) carried no stamp.
    unstamped: AtomicU64,
    /// Writes refused (a conflict with a write in between: tried again at the next period).
    refused: AtomicU64,
}

/// The operator's desired object: its whole spec, no stamp.
fn desired(kind: &str, name: &str, replicas: i64) -> Value {
    let mut object = support::workload_object(
        kind,
        name,
        &[("envFrom", "op-config")],
        json!({"app.kubernetes.io/managed-by": MANAGER}),
    );
    object["spec"]["replicas"] = json!(replicas);
    object
}

/// One round of the operator: both workloads written once.
async fn reconcile(env: &Env, namespace: &str, how: Write, tally: &Tally) {
    for (kind, name, replicas) in OWNED {
        let api: Api<DynamicObject> =
            Api::namespaced_with(env.client.clone(), namespace, &support::api_resource(kind));
        let want = desired(kind, name, replicas);
        let written = match how {
            Write::Apply => {
                api.patch(
                    name,
                    &PatchParams::apply(MANAGER).force(),
                    &Patch::Apply(&want),
                )
                .await
            }
            Write::Update => match api.get_opt(name).await.unwrap() {
                None => {
                    let create = PostParams {
                        field_manager: Some(MANAGER.into()),
                        ..Default::default()
                    };
                    api.create(&create, &serde_json::from_value(want).unwrap())
                        .await
                }
                Some(stored) => {
                    let mut object = serde_json::to_value(stored).unwrap();
                    object["spec"] = want["spec"].clone();
                    let replace = PostParams {
                        field_manager: Some(MANAGER.into()),
                        ..Default::default()
                    };
                    api.replace(name, &replace, &serde_json::from_value(object).unwrap())
                        .await
                }
            },
        };
        match written {
            Ok(stored) => {
                tally.writes.fetch_add(1, Ordering::SeqCst);
                let stored = serde_json::to_value(stored).unwrap();
                let stamp = stored
                    .pointer("/spec/template/metadata/annotations")
                    .and_then(|a| a.get(STAMP));
                if stamp.is_none() {
                    tally.unstamped.fetch_add(1, Ordering::SeqCst);
                }
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                tally.refused.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) => panic!("the operator's write of {kind} {namespace}/{name}: {e}"),
        }
    }
}

/// On a real cluster, polls until every pod of the StatefulSet runs its update revision and the
/// controller calls the rollout done.
async fn every_ordinal_updated(env: &Env, namespace: &str, name: &str, replicas: i32) {
    let sets: Api<StatefulSet> = Api::namespaced(env.client.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), namespace);
    env.eventually_with(
        || async {
            let set = sets.get(name).await.unwrap();
            let status = set.status.unwrap_or_default();
            let Some(update) = status.update_revision.clone() else {
                return false;
            };
            if status.current_revision.as_ref() != Some(&update)
                || status.updated_replicas != Some(replicas)
                || status.observed_generation < set.metadata.generation
            {
                return false;
            }
            let list = pods.list(&ListParams::default()).await.unwrap();
            (0..replicas).all(|ordinal| {
                list.items.iter().any(|p| {
                    p.metadata.name.as_deref() == Some(&format!("{name}-{ordinal}"))
                        && p.metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get("controller-revision-hash"))
                            == Some(&update)
                })
            })
        },
        || format!("every ordinal of StatefulSet {namespace}/{name} on its update revision"),
    )
    .await;
}

/// The field managers of an object's `metadata.managedFields`, with their operations.
async fn managers(env: &Env, namespace: &str, kind: &str, name: &str) -> Vec<String> {
    let object = env.get_workload(namespace, kind, name).await.unwrap();
    let mut managers: Vec<String> = object["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            format!(
                "{} ({})",
                m["manager"].as_str().unwrap_or(""),
                m["operation"].as_str().unwrap_or("")
            )
        })
        .collect();
    managers.sort();
    managers
}

async fn operator_owned_workloads_roll_once(test: &str, scenario: &str, how: Write) {
    let Some(env) = Env::counted(test).await else {
        return;
    };
    let run = if env.is_stand_in() {
        Duration::from_secs(20)
    } else {
        Duration::from_secs(180)
    };
    env.namespace(scenario, true).await;
    let namespace = env.ns(scenario);
    env.config_map(scenario, "op-config", &[("LOG_LEVEL", "info")])
        .await;
    let tally = Arc::new(Tally::default());
    reconcile(&env, &namespace, how, &tally).await;
    for (kind, name, _) in OWNED {
        env.wait_first_revision(scenario, kind, name).await;
    }
    if !env.is_stand_in() {
        every_ordinal_updated(&env, &namespace, "op-db", 3).await;
    }
    env.barrier(scenario).await;
    let first: Vec<Option<String>> = futures::future::join_all(
        OWNED
            .iter()
            .map(|(kind, name, _)| env.stamp(scenario, kind, name)),
    )
    .await;
    assert!(first.iter().all(Option::is_some), "stamped at CREATE");

    // The operator rewrites both every PERIOD; the ConfigMap changes half way.
    let start = tokio::time::Instant::now();
    let mut changed = false;
    while start.elapsed() < run {
        let round = tokio::time::Instant::now();
        reconcile(&env, &namespace, how, &tally).await;
        if !changed && start.elapsed() >= run / 2 {
            env.config_map(scenario, "op-config", &[("LOG_LEVEL", "debug")])
                .await;
            changed = true;
        }
        tokio::time::sleep_until(round + PERIOD).await;
    }
    for (kind, name, _) in OWNED {
        env.wait_rollouts(scenario, kind, name, 1).await;
    }
    if !env.is_stand_in() {
        every_ordinal_updated(&env, &namespace, "op-db", 3).await;
    }
    env.barrier(scenario).await;

    let writes = tally.writes.load(Ordering::SeqCst);
    let mut measured = vec![format!(
        "{how:?}: the operator wrote {writes} times in {run:?} ({} refused, {} stored without a stamp)",
        tally.refused.load(Ordering::SeqCst),
        tally.unstamped.load(Ordering::SeqCst)
    )];
    assert_eq!(
        tally.unstamped.load(Ordering::SeqCst),
        0,
        "every template the operator's writes stored carries the stamp"
    );
    // Each round writes both workloads: at least half the rounds the run had time for.
    let rounds = run.as_secs() / PERIOD.as_secs();
    assert!(
        writes >= OWNED.len() as u64 * rounds / 2,
        "the operator wrote {writes} times in {rounds} rounds"
    );
    for ((kind, name, _), first) in OWNED.iter().zip(&first) {
        let rollouts = env.rollouts(scenario, kind, name).await;
        let stamp = env.stamp(scenario, kind, name).await;
        let resource = support::api_resource(kind).plural;
        let confighash = env
            .confighash_writes(scenario)
            .iter()
            .filter(|w| w.resource == resource && w.name == *name)
            .count();
        let events = env.events(scenario, name, "ConfigChanged").await;
        measured.push(format!(
            "{kind} {name}: {rollouts} rollout, {confighash} confighash writes, {events} \
             ConfigChanged, managers {:?}",
            managers(&env, scenario, kind, name).await
        ));
        assert_eq!(rollouts, 1, "{kind} {name} rolls exactly once");
        assert!(
            stamp.is_some() && stamp != *first,
            "{kind} {name}: the new stamp"
        );
        // The touch after the change, and at most one more refused because the operator's
        // write (stamped by the webhook with the new content) came first: never one per write.
        assert!(
            confighash <= 2,
            "{kind} {name}: confighash wrote {confighash} times"
        );
        assert!(events <= 1, "{kind} {name}: {events} ConfigChanged Events");
    }
    eprintln!("{test}: {}", measured.join("; "));
}

#[tokio::test]
async fn workloads_an_operator_applies_every_2s_roll_once_per_change() {
    operator_owned_workloads_roll_once(
        "workloads_an_operator_applies_every_2s_roll_once_per_change",
        "op-apply",
        Write::Apply,
    )
    .await;
}

#[tokio::test]
async fn workloads_an_operator_replaces_every_2s_roll_once_per_change() {
    operator_owned_workloads_roll_once(
        "workloads_an_operator_replaces_every_2s_roll_once_per_change",
        "op-update",
        Write::Update,
    )
    .await;
}

//! The user stories, one test each, with exact counts: rollouts from what the API server keeps (in
//! the stand-in its count of template transitions; on a real cluster the workloads' revisions)
//! and confighash's own writes from the API server's record of requests (the stand-in's, or the
//! real API server's audit log), besides the `ConfigChanged` Events it recorded. A touch the
//! webhook turns back rolls nothing, so rollouts alone cannot show one: the writes can.
//!
//! They run in the fast suite on the stand-in and in the real tier (`scripts/real-tier.sh`) on
//! kube-apiserver; the two that stop confighash or add a replica run there while no other
//! scenario does ([`Env::controlling`]). Each records what it measured ([`Env::record_story`]); the real tier turns the records into the
//! table in `docs/user-stories.md`.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::{Env, Setup, WINDOW};

/// What a story counts on one workload since a [`Before`].
#[derive(Debug, PartialEq, Eq)]
struct Counted {
    rollouts: u64,
    /// confighash's writes to the workload (its touches), whatever their answer.
    touches: usize,
    /// `ConfigChanged` Events confighash recorded on it.
    events: usize,
}

impl std::fmt::Display for Counted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} rollout(s), {} touch(es), {} ConfigChanged",
            self.rollouts, self.touches, self.events
        )
    }
}

/// Where a workload stood before a story's step.
struct Before {
    namespace: String,
    kind: String,
    name: String,
    rollouts: u64,
    touches: usize,
    events: usize,
}

fn touches(env: &Env, namespace: &str, name: &str) -> usize {
    let workloads = [
        "deployments",
        "statefulsets",
        "daemonsets",
        "cronjobs",
        "rollouts",
    ];
    env.confighash_writes(namespace)
        .iter()
        .filter(|w| workloads.contains(&w.resource.as_str()) && w.name == name)
        .count()
}

/// How many times confighash recorded `ConfigChanged` on the workload: a repeated Event is one
/// object whose `series.count` says how often it happened.
async fn config_changed(env: &Env, namespace: &str, name: &str) -> usize {
    env.recorded_events(namespace, name, "ConfigChanged")
        .await
        .iter()
        .map(|e| {
            e.series
                .as_ref()
                .map_or(1, |s| usize::try_from(s.count).unwrap_or(1))
        })
        .sum()
}

async fn before(env: &Env, namespace: &str, kind: &str, name: &str) -> Before {
    Before {
        namespace: namespace.to_owned(),
        kind: kind.to_owned(),
        name: name.to_owned(),
        rollouts: if env.counts_rollouts(kind) {
            env.rollouts(namespace, kind, name).await
        } else {
            0
        },
        touches: touches(env, namespace, name),
        events: config_changed(env, namespace, name).await,
    }
}

/// The counts since `b`, after a barrier in its namespace (every change written before it has
/// been handled, and confighash's watcher has nothing pending).
async fn since(env: &Env, b: &Before) -> Counted {
    env.barrier(&b.namespace).await;
    Counted {
        rollouts: if env.counts_rollouts(&b.kind) {
            env.rollouts(&b.namespace, &b.kind, &b.name).await - b.rollouts
        } else {
            0
        },
        touches: touches(env, &b.namespace, &b.name) - b.touches,
        events: config_changed(env, &b.namespace, &b.name).await - b.events,
    }
}

fn exactly(rollouts: u64, touches: usize, events: usize) -> Counted {
    Counted {
        rollouts,
        touches,
        events,
    }
}

/// Asserts the counts and records the story.
fn check(env: &Env, story: &str, test: &str, expected: Counted, measured: Counted) {
    env.record_story(story, &expected.to_string(), &measured.to_string(), test);
    assert_eq!(measured, expected, "{story}");
}

/// The stamp a fresh Deployment named `twin` gets with these references: the expected stamp of
/// any up-to-date workload that uses the same config.
async fn twin_stamp(env: &Env, namespace: &str, twin: &str, refs: &[(&str, &str)]) -> String {
    env.deployment(namespace, twin, refs).await;
    env.stamp(namespace, "Deployment", twin)
        .await
        .expect("the twin is stamped at CREATE")
}

/// Whether confighash's writes are counted here; if not, the story says so and is skipped.
fn counted(env: &Env, test: &str) -> bool {
    if env.counts_writes() {
        return true;
    }
    eprintln!("skipped: {test} counts confighash's writes: set CONFIGHASH_E2E_AUDIT_LOG");
    false
}

async fn create_deployment(env: &Env, namespace: &str, object: Value) {
    let name = object["metadata"]["name"].as_str().unwrap().to_owned();
    Api::<Deployment>::namespaced(env.client.clone(), &env.ns(namespace))
        .create(
            &PostParams::default(),
            &serde_json::from_value(object).unwrap(),
        )
        .await
        .unwrap();
    env.wait_first_revision(namespace, "Deployment", &name)
        .await;
}

/// A Deployment whose container runs `spec` (containers' `env`, `envFrom`, `volumeMounts`) with
/// `volumes`.
fn deployment_object(name: &str, container: Value, volumes: Value) -> Value {
    let mut container = container;
    container["name"] = json!("app");
    container["image"] = json!("example/app:1");
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [container], "volumes": volumes}
            }
        }
    })
}

#[tokio::test]
async fn story_01_config_and_workload_created_together_roll_nothing_after_the_first() {
    const TEST: &str = "story_01_config_and_workload_created_together_roll_nothing_after_the_first";
    let env = Env::start().await;
    if !counted(&env, TEST) {
        return;
    }
    env.namespace("u1", true).await;
    // A first GitOps sync: the ConfigMap and the Deployment in one go.
    env.config_map("u1", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.deployment("u1", "web", &[("envFrom", "app-env")]).await;
    let b = Before {
        rollouts: 0,
        touches: 0,
        events: 0,
        ..before(&env, "u1", "Deployment", "web").await
    };
    assert!(
        env.stamp("u1", "Deployment", "web").await.is_some(),
        "stamped at CREATE"
    );
    check(
        &env,
        "1. config and workload created together (first sync)",
        TEST,
        exactly(0, 0, 0),
        since(&env, &b).await,
    );
}

#[tokio::test]
async fn story_02_one_config_map_change_rolls_once() {
    const TEST: &str = "story_02_one_config_map_change_rolls_once";
    let env = Env::start().await;
    if !counted(&env, TEST) {
        return;
    }
    env.namespace("u2", true).await;
    env.config_map("u2", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.deployment("u2", "web", &[("envFrom", "app-env")]).await;
    env.barrier("u2").await;
    let b = before(&env, "u2", "Deployment", "web").await;
    env.config_map("u2", "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.wait_rollouts("u2", "Deployment", "web", b.rollouts + 1)
        .await;
    check(
        &env,
        "2. one ConfigMap change",
        TEST,
        exactly(1, 1, 1),
        since(&env, &b).await,
    );
    assert_eq!(
        env.stamp("u2", "Deployment", "web").await.unwrap(),
        twin_stamp(&env, "u2", "twin", &[("envFrom", "app-env")]).await
    );
}

#[tokio::test]
async fn story_03_config_map_and_deployment_changed_in_one_apply_roll_once() {
    const TEST: &str = "story_03_config_map_and_deployment_changed_in_one_apply_roll_once";
    let env = Env::start().await;
    if !counted(&env, TEST) {
        return;
    }
    env.namespace("u3", true).await;
    env.config_map("u3", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.deployment("u3", "web", &[("envFrom", "app-env")]).await;
    env.barrier("u3").await;
    let b = before(&env, "u3", "Deployment", "web").await;
    // One apply: the ConfigMap, then the Deployment with a new image, well inside one window.
    let apply = tokio::time::Instant::now();
    env.config_map("u3", "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.set_image("u3", "web", "example/app:2").await;
    assert!(
        apply.elapsed() < WINDOW,
        "the apply took {:?}, longer than the window: the story did not happen",
        apply.elapsed()
    );
    env.wait_rollouts("u3", "Deployment", "web", b.rollouts + 1)
        .await;
    // The webhook stamped the new config into the Deployment's own write: the window's touch
    // finds nothing to do.
    check(
        &env,
        "3. ConfigMap and Deployment changed in one apply",
        TEST,
        exactly(1, 0, 0),
        since(&env, &b).await,
    );
    assert_eq!(
        env.stamp("u3", "Deployment", "web").await.unwrap(),
        twin_stamp(&env, "u3", "twin", &[("envFrom", "app-env")]).await
    );
}

#[tokio::test]
async fn story_04_a_label_only_edit_rolls_nothing() {
    const TEST: &str = "story_04_a_label_only_edit_rolls_nothing";
    let env = Env::start().await;
    if !counted(&env, TEST) {
        return;
    }
    env.namespace("u4", true).await;
    env.config_map("u4", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.deployment("u4", "web", &[("envFrom", "app-env")]).await;
    env.barrier("u4").await;
    let b = before(&env, "u4", "Deployment", "web").await;
    Api::<ConfigMap>::namespaced(env.client.clone(), &env.ns("u4"))
        .patch(
            "app-env",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "platform"}}})),
        )
        .await
        .unwrap();
    check(
        &env,
        "4. label-only edit of the ConfigMap",
        TEST,
        exactly(0, 0, 0),
        since(&env, &b).await,
    );
}

#[tokio::test]
async fn story_05_an_identical_replace_rolls_nothing() {
    const TEST: &str = "story_05_an_identical_replace_rolls_nothing";
    let env = Env::start().await;
    if !counted(&env, TEST) {
        return;
    }
    env.namespace("u5", true).await;
    env.config_map("u5", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.deployment("u5", "web", &[("envFrom", "app-env")]).await;
    env.barrier("u5").await;
    let b = before(&env, "u5", "Deployment", "web").await;
    // What `kubectl replace -f` sends: the whole object, unchanged, as a PUT.
    let api: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns("u5"));
    let live = api.get("app-env").await.unwrap();
    api.replace("app-env", &PostParams::default(), &live)
        .await
        .unwrap();
    check(
        &env,
        "5. identical rewrite (kubectl replace)",
        TEST,
        exactly(0, 0, 0),
        since(&env, &b).await,
    );
}

#[tokio::test]
async fn story_06_a_change_of_an_unused_key_rolls_nothing() {
    const TEST: &str = "story_06_a_change_of_an_unused_key_rolls_nothing";
    let env = Env::start().await;
    if !counted(&env, TEST) {
        return;
    }
    env.namespace("u6", true).await;
    env.config_map("u6", "env", &[("used", "1"), ("unused", "1")])
        .await;
    env.config_map(
        "u6",
        "files",
        &[("app.yaml", "a: 1"), ("other.yaml", "b: 1")],
    )
    .await;
    create_deployment(
        &env,
        "u6",
        deployment_object(
            "web",
            json!({
                "env": [{"name": "USED", "valueFrom": {"configMapKeyRef": {"name": "env", "key": "used"}}}],
                "volumeMounts": [{"name": "files", "mountPath": "/etc/app"}]
            }),
            json!([{"name": "files", "configMap": {"name": "files", "items": [{"key": "app.yaml", "path": "app.yaml"}]}}]),
        ),
    )
    .await;
    env.barrier("u6").await;
    let b = before(&env, "u6", "Deployment", "web").await;
    env.config_map("u6", "env", &[("used", "1"), ("unused", "2")])
        .await;
    env.config_map(
        "u6",
        "files",
        &[("app.yaml", "a: 1"), ("other.yaml", "b: 2")],
    )
    .await;
    check(
        &env,
        "6. change of keys the workload does not use (configMapKeyRef, volume items)",
        TEST,
        exactly(0, 0, 0),
        since(&env, &b).await,
    );
}

#[tokio::test]
async fn story_07_a_change_while_confighash_is_stopped_rolls_once_when_it_starts() {
    const TEST: &str = "story_07_a_change_while_confighash_is_stopped_rolls_once_when_it_starts";
    let Some(mut env) = Env::controlling(TEST, Setup::default()).await else {
        return;
    };
    if !counted(&env, TEST) {
        return;
    }
    env.namespace("u7", true).await;
    env.config_map("u7", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.deployment("u7", "web", &[("envFrom", "app-env")]).await;
    env.barrier("u7").await;
    let b = before(&env, "u7", "Deployment", "web").await;
    env.stop_confighash(false).await;
    env.config_map("u7", "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.start_confighash().await;
    env.wait_rollouts("u7", "Deployment", "web", b.rollouts + 1)
        .await;
    check(
        &env,
        "7. confighash stopped, a change made, confighash started",
        TEST,
        exactly(1, 1, 1),
        since(&env, &b).await,
    );
    let b = before(&env, "u7", "Deployment", "web").await;
    env.stop_confighash(false).await;
    env.start_confighash().await;
    check(
        &env,
        "7. ... and started again with no change",
        TEST,
        exactly(0, 0, 0),
        since(&env, &b).await,
    );
}

#[tokio::test]
async fn story_08_twenty_changes_in_two_windows_roll_at_most_three_times() {
    const TEST: &str = "story_08_twenty_changes_in_two_windows_roll_at_most_three_times";
    let Some(env) = Env::counted(TEST).await else {
        return;
    };
    env.namespace("u8", true).await;
    env.config_map("u8", "app-env", &[("N", "0")]).await;
    env.deployment("u8", "web", &[("envFrom", "app-env")]).await;
    env.barrier("u8").await;
    let b = before(&env, "u8", "Deployment", "web").await;
    // 20 changes in 10 s with the default 5 s window: two windows. Scaled to the scenarios'
    // window, a write every WINDOW / 10, scheduled from the start.
    let start = tokio::time::Instant::now();
    for i in 1..=20u32 {
        // Pacing of the generated load, not waiting for a condition.
        tokio::time::sleep_until(start + WINDOW / 10 * (i - 1)).await;
        env.config_map("u8", "app-env", &[("N", &i.to_string())])
            .await;
    }
    let took = start.elapsed();
    let expected = twin_stamp(&env, "u8", "twin", &[("envFrom", "app-env")]).await;
    env.eventually("the stamp of the last content", || async {
        env.stamp("u8", "Deployment", "web").await.as_deref() == Some(expected.as_str())
    })
    .await;
    let measured = since(&env, &b).await;
    env.record_story(
        "8. 20 changes in two change windows (10 s at the default 5 s)",
        "at most 3 rollouts, each touch rolls, ending on the last content",
        &measured.to_string(),
        TEST,
    );
    assert!(
        took < WINDOW * 3,
        "the writes took {took:?}: the story did not happen"
    );
    assert!(
        (1..=3).contains(&measured.rollouts),
        "20 changes in two windows: {measured}"
    );
    assert_eq!(
        measured.touches as u64, measured.rollouts,
        "every touch rolled: {measured}"
    );
    assert_eq!(measured.events as u64, measured.rollouts, "{measured}");
}

#[tokio::test]
async fn story_09_a_secret_deleted_and_recreated_with_the_same_content_rolls_nothing() {
    const TEST: &str =
        "story_09_a_secret_deleted_and_recreated_with_the_same_content_rolls_nothing";
    let env = Env::start().await;
    if !counted(&env, TEST) {
        return;
    }
    env.namespace("u9", true).await;
    env.secret("u9", "db", &[("password", "s3cret")]).await;
    env.deployment("u9", "web", &[("secretEnvFrom", "db")])
        .await;
    env.barrier("u9").await;
    let b = before(&env, "u9", "Deployment", "web").await;
    Api::<Secret>::namespaced(env.client.clone(), &env.ns("u9"))
        .delete("db", &DeleteParams::default())
        .await
        .unwrap();
    env.secret("u9", "db", &[("password", "s3cret")]).await;
    check(
        &env,
        "9. Secret deleted and re-created with the same content",
        TEST,
        exactly(0, 0, 0),
        since(&env, &b).await,
    );
}

#[tokio::test]
async fn story_10_a_workload_with_a_service_account_token_rolls_once_for_its_config_map() {
    const TEST: &str =
        "story_10_a_workload_with_a_service_account_token_rolls_once_for_its_config_map";
    let env = Env::start().await;
    if !counted(&env, TEST) {
        return;
    }
    env.namespace("u10", true).await;
    let ns = env.ns("u10");
    if !env.is_stand_in() {
        // The token controller deletes a token Secret whose ServiceAccount does not exist yet.
        let accounts: Api<ServiceAccount> = Api::namespaced(env.client.clone(), &ns);
        env.eventually("the default ServiceAccount", || async {
            accounts.get_opt("default").await.unwrap().is_some()
        })
        .await;
    }
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &ns);
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "token", "annotations": {"kubernetes.io/service-account.name": "default"}},
                "type": "kubernetes.io/service-account-token"
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    if !env.is_stand_in() {
        // The token controller fills it in after the create.
        env.eventually("the token controller to fill the Secret", || async {
            secrets
                .get("token")
                .await
                .unwrap()
                .data
                .is_some_and(|d| d.contains_key("token"))
        })
        .await;
    }
    env.config_map("u10", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    create_deployment(
        &env,
        "u10",
        deployment_object(
            "web",
            json!({
                "envFrom": [{"configMapRef": {"name": "app-env"}}],
                "volumeMounts": [{"name": "token", "mountPath": "/var/run/token"}]
            }),
            json!([{"name": "token", "secret": {"secretName": "token"}}]),
        ),
    )
    .await;
    env.barrier("u10").await;
    let b = before(&env, "u10", "Deployment", "web").await;
    env.config_map("u10", "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.wait_rollouts("u10", "Deployment", "web", b.rollouts + 1)
        .await;
    check(
        &env,
        "10. ServiceAccount-token Secret and a ConfigMap mounted, the ConfigMap changed",
        TEST,
        exactly(1, 1, 1),
        since(&env, &b).await,
    );
}

#[tokio::test]
async fn story_11_a_cron_job_gets_the_new_config_for_its_next_job_and_starts_none() {
    const TEST: &str = "story_11_a_cron_job_gets_the_new_config_for_its_next_job_and_starts_none";
    let env = Env::start().await;
    if !counted(&env, TEST) {
        return;
    }
    env.namespace("u11", true).await;
    env.config_map("u11", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.workload(
        "u11",
        "CronJob",
        "report",
        &[("envFrom", "app-env")],
        json!({}),
    )
    .await;
    env.barrier("u11").await;
    let first = env.stamp("u11", "CronJob", "report").await.unwrap();
    let b = before(&env, "u11", "CronJob", "report").await;
    env.config_map("u11", "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    let expected = twin_stamp(&env, "u11", "twin", &[("envFrom", "app-env")]).await;
    env.eventually(
        "the CronJob's job template to carry the new stamp",
        || async {
            env.stamp("u11", "CronJob", "report").await.as_deref() == Some(expected.as_str())
        },
    )
    .await;
    let measured = since(&env, &b).await;
    // The stand-in serves no Jobs (and has no CronJob controller to start one).
    let jobs = if env.is_stand_in() {
        0
    } else {
        Api::<Job>::namespaced(env.client.clone(), &env.ns("u11"))
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len()
    };
    let text = format!(
        "job template {}, {} touch(es), {} ConfigChanged, {jobs} Job(s) started",
        if first != expected {
            "re-stamped"
        } else {
            "unchanged"
        },
        measured.touches,
        measured.events
    );
    env.record_story(
        "11. a CronJob's ConfigMap changed",
        "job template re-stamped, 1 touch(es), 1 ConfigChanged, 0 Job(s) started",
        &text,
        TEST,
    );
    assert_ne!(first, expected);
    assert_eq!(
        (measured.touches, measured.events, jobs),
        (1, 1, 0),
        "{text}"
    );
}

#[tokio::test]
async fn story_12_the_leader_killed_during_a_change_still_rolls_once() {
    const TEST: &str = "story_12_the_leader_killed_during_a_change_still_rolls_once";
    let Some(env) = Env::controlling(
        TEST,
        Setup {
            start_watcher: false,
            ..Default::default()
        },
    )
    .await
    else {
        return;
    };
    if !counted(&env, TEST) {
        return;
    }
    // Two replicas electing a leader on a Lease: in-process in the stand-in, a second process
    // beside the first on a real cluster.
    let mut in_process = Vec::new();
    if env.is_stand_in() {
        Api::<Namespace>::all(env.client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "confighash"}})).unwrap(),
            )
            .await
            .unwrap();
        for identity in ["confighash-local-0", "confighash-local-1"] {
            let (leadership, election) = env.elect(identity);
            let watcher = env.spawn_watcher(identity, leadership.clone());
            in_process.push((leadership, election, watcher));
        }
    } else {
        support::serve_sh("start", 1).await;
    }
    env.namespace("u12", true).await;
    env.config_map("u12", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.deployment("u12", "web", &[("envFrom", "app-env")])
        .await;
    let leader = || async {
        if env.is_stand_in() {
            in_process
                .iter()
                .position(|(l, _, _)| l.is_leader())
                .map(|i| i as u8)
        } else {
            support::leader_replica(&env).await
        }
    };
    env.eventually("a leader", || async { leader().await.is_some() })
        .await;
    env.barrier("u12").await;
    let b = before(&env, "u12", "Deployment", "web").await;

    env.config_map("u12", "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    let killed = leader().await.unwrap();
    if env.is_stand_in() {
        let (_, election, watcher) = &in_process[usize::from(killed)];
        election.abort();
        watcher.abort();
    } else {
        support::serve_sh("kill", killed).await;
    }
    // The survivor takes the Lease once it expires (15 s on a real cluster), then touches.
    let start = tokio::time::Instant::now();
    while env.rollouts("u12", "Deployment", "web").await < b.rollouts + 1 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the survivor did not roll web within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let measured = since(&env, &b).await;
    // Back to one replica 0 for the scenarios after this one.
    if env.is_stand_in() {
        for (_, election, watcher) in &in_process {
            election.abort();
            watcher.abort();
        }
    } else {
        support::serve_sh("stop", 1).await;
        if killed == 0 {
            support::serve_sh("start", 0).await;
        }
    }
    check(
        &env,
        "12. two replicas, the leader killed during a change",
        TEST,
        exactly(1, 1, 1),
        measured,
    );
}

#[tokio::test]
async fn story_13_a_stateful_set_and_a_daemon_set_roll_once_each() {
    const TEST: &str = "story_13_a_stateful_set_and_a_daemon_set_roll_once_each";
    let env = Env::start().await;
    if !counted(&env, TEST) {
        return;
    }
    env.namespace("u13", true).await;
    env.config_map("u13", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    for kind in ["StatefulSet", "DaemonSet"] {
        env.workload(
            "u13",
            kind,
            &kind.to_lowercase(),
            &[("envFrom", "app-env")],
            json!({}),
        )
        .await;
    }
    env.barrier("u13").await;
    let sts = before(&env, "u13", "StatefulSet", "statefulset").await;
    let ds = before(&env, "u13", "DaemonSet", "daemonset").await;
    env.config_map("u13", "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.wait_rollouts("u13", "StatefulSet", "statefulset", sts.rollouts + 1)
        .await;
    env.wait_rollouts("u13", "DaemonSet", "daemonset", ds.rollouts + 1)
        .await;
    check(
        &env,
        "13. a StatefulSet's ConfigMap changed",
        TEST,
        exactly(1, 1, 1),
        since(&env, &sts).await,
    );
    check(
        &env,
        "13. a DaemonSet's ConfigMap changed",
        TEST,
        exactly(1, 1, 1),
        since(&env, &ds).await,
    );
}

//! End to end: the scenarios of the README ("When a stamp changes", "The watcher"), one test
//! each, every one asserting rollout counts from the API server's accounting (on a real cluster,
//! from the workloads' revisions; a CronJob has none, so there its stamp alone is checked).
//!
//! "0 rollouts" is only asserted after `env.barrier(..)`, which proves the watcher has handled
//! every change written before it (including deciding not to act). The Secret rewritten
//! continuously runs on a real cluster whose confighash has the scenarios' change window and
//! whose audit log is given ([`Env::counted`]); the cluster without Argo Rollouts runs on one
//! that serves none.

use crate::support;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::{Env, Setup, WINDOW};

/// The stamp a fresh Deployment named `twin` gets in `namespace` with these references. The
/// recipe covers only the referenced config, so an up-to-date workload using the same config
/// carries exactly this stamp.
async fn twin_stamp(env: &Env, namespace: &str, twin: &str, refs: &[(&str, &str)]) -> String {
    env.deployment(namespace, twin, refs).await;
    env.stamp(namespace, "Deployment", twin)
        .await
        .expect("the twin is stamped at CREATE")
}

/// Sets an annotation on a ConfigMap (a metadata-only write).
async fn annotate_config_map(env: &Env, namespace: &str, name: &str, key: &str, value: &str) {
    Api::<ConfigMap>::namespaced(env.client.clone(), &env.ns(namespace))
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
        )
        .await
        .unwrap();
}

/// Changes a Deployment's pod template (its image) the way an apply of a new manifest does:
/// the stored object with the change, through the admission chain.
async fn change_image(env: &Env, namespace: &str, name: &str, image: &str) {
    let api: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns(namespace));
    let mut d = api.get(name).await.unwrap();
    d.spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap()
        .containers[0]
        .image = Some(image.to_owned());
    api.replace(name, &PostParams::default(), &d).await.unwrap();
}

// 1.
#[tokio::test]
async fn a_secret_change_rolls_its_workload_once() {
    let env = Env::start().await;
    env.namespace("s1", true).await;
    env.secret("s1", "db", &[("password", "one")]).await;
    env.deployment("s1", "web", &[("secretEnvFrom", "db")])
        .await;
    let first = env.stamp("s1", "Deployment", "web").await;
    assert!(first.is_some(), "stamped at CREATE");
    env.barrier("s1").await;
    assert_eq!(env.rollouts("s1", "Deployment", "web").await, 0);

    env.secret("s1", "db", &[("password", "two")]).await;
    env.wait_rollouts("s1", "Deployment", "web", 1).await;
    env.barrier("s1").await;
    assert_eq!(
        env.rollouts("s1", "Deployment", "web").await,
        1,
        "exactly one rollout"
    );
    let last = env.stamp("s1", "Deployment", "web").await;
    assert_ne!(last, first);
    assert_eq!(
        last.unwrap(),
        twin_stamp(&env, "s1", "twin", &[("secretEnvFrom", "db")]).await
    );
}

// 2.
#[tokio::test]
async fn a_config_map_and_deployment_changed_in_one_sync_roll_once() {
    let env = Env::start().await;
    env.namespace("s2", true).await;
    env.config_map("s2", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.deployment("s2", "web", &[("envFrom", "app-env")]).await;
    let first = env.stamp("s2", "Deployment", "web").await;
    env.barrier("s2").await;
    assert_eq!(env.rollouts("s2", "Deployment", "web").await, 0);

    // One Argo CD wave: the ConfigMap first, then the Deployment, well inside one window.
    let wave = tokio::time::Instant::now();
    env.config_map("s2", "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    change_image(&env, "s2", "web", "example/app:2").await;
    assert!(
        wave.elapsed() < WINDOW,
        "the sync took {:?}, longer than the window: the scenario did not happen",
        wave.elapsed()
    );
    env.wait_rollouts("s2", "Deployment", "web", 1).await;
    env.barrier("s2").await;
    assert_eq!(
        env.rollouts("s2", "Deployment", "web").await,
        1,
        "one sync, one rollout"
    );
    let last = env.stamp("s2", "Deployment", "web").await;
    assert_ne!(last, first);
    assert_eq!(
        last.unwrap(),
        twin_stamp(&env, "s2", "twin", &[("envFrom", "app-env")]).await,
        "the stamp is the one of the new ConfigMap"
    );
}

// 3.
#[tokio::test]
async fn only_referenced_keys_of_a_key_reference_roll() {
    let env = Env::start().await;
    env.namespace("s3", true).await;
    env.config_map("s3", "cm", &[("used", "1"), ("other", "a")])
        .await;
    env.deployment("s3", "web", &[("key", "cm/used")]).await;
    let first = env.stamp("s3", "Deployment", "web").await;
    env.barrier("s3").await;

    let mark = env.mark("s3").await;
    env.config_map("s3", "cm", &[("used", "1"), ("other", "b")])
        .await;
    env.barrier("s3").await;
    assert_eq!(
        env.rollouts("s3", "Deployment", "web").await,
        0,
        "an unreferenced key changed"
    );
    env.assert_quiet_since(&mark, "web", "an unreferenced key changed")
        .await;
    assert_eq!(env.stamp("s3", "Deployment", "web").await, first);

    env.config_map("s3", "cm", &[("used", "2"), ("other", "b")])
        .await;
    env.wait_rollouts("s3", "Deployment", "web", 1).await;
    env.barrier("s3").await;
    assert_eq!(env.rollouts("s3", "Deployment", "web").await, 1);
    assert_ne!(env.stamp("s3", "Deployment", "web").await, first);
}

// 4.
#[tokio::test]
async fn five_changes_in_one_window_roll_once_to_the_final_content() {
    let env = Env::start().await;
    env.namespace("s4", true).await;
    env.config_map("s4", "app-env", &[("N", "0")]).await;
    env.deployment("s4", "web", &[("envFrom", "app-env")]).await;
    env.barrier("s4").await;

    let burst = tokio::time::Instant::now();
    for n in 1..=5 {
        env.config_map("s4", "app-env", &[("N", &n.to_string())])
            .await;
    }
    assert!(
        burst.elapsed() < WINDOW,
        "the five writes took {:?}, longer than the window: the scenario did not happen",
        burst.elapsed()
    );
    env.wait_rollouts("s4", "Deployment", "web", 1).await;
    env.barrier("s4").await;
    assert_eq!(
        env.rollouts("s4", "Deployment", "web").await,
        1,
        "one window, one rollout"
    );
    assert_eq!(
        env.stamp("s4", "Deployment", "web").await.unwrap(),
        twin_stamp(&env, "s4", "twin", &[("envFrom", "app-env")]).await,
        "the stamp is the one of the final content"
    );
}

// 5.
#[tokio::test]
async fn a_secret_rewritten_continuously_rolls_at_most_once_per_window() {
    let Some(env) =
        Env::counted("a_secret_rewritten_continuously_rolls_at_most_once_per_window").await
    else {
        return;
    };
    env.namespace("s5", true).await;
    env.secret("s5", "token", &[("token", "v0")]).await;
    env.deployment("s5", "web", &[("secretEnvFrom", "token")])
        .await;
    env.barrier("s5").await;

    // the README's "a Secret rewritten every second for 20 s with a 5 s window", scaled to the
    // test window: a write every WINDOW/4 for 5 x WINDOW (20 writes). Writes are scheduled from
    // the start, not after each other, so slow writes do not stretch the run into a sixth
    // window.
    const WRITES: u32 = 20;
    let writes_before = env.touches();
    let barrier_before = env.rollouts("s5", "Deployment", "barrier").await;
    let start = tokio::time::Instant::now();
    let mut written = Vec::new();
    for i in 0..WRITES {
        // Pacing of the generated load, not waiting for a condition.
        tokio::time::sleep_until(start + WINDOW / 4 * i).await;
        env.secret("s5", "token", &[("token", &format!("v{}", i + 1))])
            .await;
        written.push(start.elapsed());
    }
    assert!(
        start.elapsed() < WINDOW * 5,
        "the writes took {:?}, longer than 5 windows: the scenario did not happen",
        start.elapsed()
    );

    let expected = twin_stamp(&env, "s5", "twin", &[("secretEnvFrom", "token")]).await;
    env.eventually("the stamp of the final Secret", || async {
        env.stamp("s5", "Deployment", "web").await.as_deref() == Some(expected.as_str())
    })
    .await;
    env.barrier("s5").await;
    let rolled = env.rollouts("s5", "Deployment", "web").await;
    // The windows these writes open: the watcher sees each write a little after the client
    // does, so a write close to a window's end may fall on either side of it.
    let slack = WINDOW / 8;
    let most = windows(&written, WINDOW, slack, true);
    let fewest = windows(&written, WINDOW, slack, false);
    // One touch per window, and each rolls; a window may roll nothing when the touch before it
    // already read its only write (the webhook reads the Secret when the touch arrives).
    assert!(
        (fewest.saturating_sub(1).max(1)..=most).contains(&rolled),
        "rolled {rolled} times for {WRITES} writes at {written:?}: the windows allow \
         {fewest} to {most}"
    );
    assert_eq!(
        env.stamp("s5", "Deployment", "web").await.unwrap(),
        expected
    );
    // Every write confighash made rolled something: no touch was turned back or redundant.
    let barrier = env.rollouts("s5", "Deployment", "barrier").await - barrier_before;
    assert_eq!(
        env.touches() - writes_before,
        rolled + barrier,
        "touches besides {rolled} of web and {barrier} of the barrier ({})",
        env.touch_outcomes()
    );
}

/// How many change windows of length `window` writes at these offsets open: the first write
/// opens one, later writes within it join it, and the first write after it closes opens the
/// next. A write within `slack` of a window's end counts as inside it (`most: false`) or after
/// it (`most: true`).
fn windows(
    written: &[std::time::Duration],
    window: std::time::Duration,
    slack: std::time::Duration,
    most: bool,
) -> u64 {
    let mut count = 0;
    let mut closes = None;
    for &at in written {
        let opens = match closes {
            None => true,
            Some(end) if most => at + slack >= end,
            Some(end) => at >= end + slack,
        };
        if opens {
            count += 1;
            closes = Some(at + window);
        }
    }
    count
}

// 6.
#[tokio::test]
async fn a_config_map_created_after_its_workload_rolls_it_once() {
    let env = Env::start().await;
    env.namespace("s6", true).await;
    env.deployment("s6", "web", &[("envFrom", "late")]).await;
    let first = env.stamp("s6", "Deployment", "web").await;
    assert!(
        first.is_some(),
        "stamped at CREATE with the absent ConfigMap"
    );
    env.barrier("s6").await;
    assert_eq!(env.rollouts("s6", "Deployment", "web").await, 0);

    env.config_map("s6", "late", &[("LOG_LEVEL", "info")]).await;
    env.wait_rollouts("s6", "Deployment", "web", 1).await;
    env.barrier("s6").await;
    assert_eq!(env.rollouts("s6", "Deployment", "web").await, 1);
    let last = env.stamp("s6", "Deployment", "web").await;
    assert_ne!(last, first);
    assert_eq!(
        last.unwrap(),
        twin_stamp(&env, "s6", "twin", &[("envFrom", "late")]).await
    );
}

// 7.
#[tokio::test]
async fn a_deleted_required_config_map_rolls_nothing_until_new_content() {
    let env = Env::start().await;
    env.namespace("s7", true).await;
    env.config_map("s7", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.deployment("s7", "web", &[("envFrom", "app-env")]).await;
    let first = env.stamp("s7", "Deployment", "web").await;
    env.barrier("s7").await;

    let mark = env.mark("s7").await;
    env.delete_config_map("s7", "app-env").await;
    env.barrier("s7").await;
    assert_eq!(
        env.rollouts("s7", "Deployment", "web").await,
        0,
        "deleted: new pods could not start anyway"
    );
    assert_eq!(
        env.stamp("s7", "Deployment", "web").await,
        first,
        "the stamp is kept"
    );

    env.config_map("s7", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.barrier("s7").await;
    assert_eq!(
        env.rollouts("s7", "Deployment", "web").await,
        0,
        "re-created with the same content"
    );
    assert_eq!(env.stamp("s7", "Deployment", "web").await, first);
    env.assert_quiet_since(
        &mark,
        "web",
        "deleted, then re-created with the same content",
    )
    .await;

    env.config_map("s7", "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.wait_rollouts("s7", "Deployment", "web", 1).await;
    env.barrier("s7").await;
    assert_eq!(env.rollouts("s7", "Deployment", "web").await, 1);
    assert_ne!(env.stamp("s7", "Deployment", "web").await, first);
}

// 8.
#[tokio::test]
async fn namespaces_not_opted_in_and_opted_out_workloads_are_left_alone() {
    let env = Env::start().await;
    env.namespace("plain", false).await;
    env.namespace("s8", true).await;
    env.config_map("plain", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.deployment("plain", "web", &[("envFrom", "app-env")])
        .await;
    env.config_map("s8", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.workload(
        "s8",
        "Deployment",
        "opted-out",
        &[("envFrom", "app-env")],
        json!({"confighash.dev/enabled": "false"}),
    )
    .await;
    assert_eq!(env.stamp("plain", "Deployment", "web").await, None);
    assert_eq!(env.stamp("s8", "Deployment", "opted-out").await, None);
    env.barrier("s8").await;

    env.config_map("plain", "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.config_map("s8", "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    // The barrier lives in the opted-in namespace (it needs a stamped workload to roll); the
    // ConfigMap watch is one cluster-wide stream handled in order, so it covers "plain" too.
    env.barrier("s8").await;
    assert_eq!(env.rollouts("plain", "Deployment", "web").await, 0);
    assert_eq!(env.stamp("plain", "Deployment", "web").await, None);
    assert_eq!(env.rollouts("s8", "Deployment", "opted-out").await, 0);
    assert_eq!(env.stamp("s8", "Deployment", "opted-out").await, None);
}

// 9.
#[tokio::test]
async fn every_workload_kind_rolls_once() {
    const KINDS: [&str; 4] = ["StatefulSet", "DaemonSet", "CronJob", "Rollout"];
    let env = Env::start().await;
    let kinds: Vec<&str> = KINDS
        .into_iter()
        .filter(|kind| {
            let served = env.serves(kind);
            if !served {
                eprintln!("real cluster: Argo Rollouts are not installed, no {kind} is checked");
            }
            served
        })
        .collect();
    env.namespace("s9", true).await;
    env.config_map("s9", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    let mut first = Vec::new();
    for &kind in &kinds {
        let name = kind.to_lowercase();
        env.workload("s9", kind, &name, &[("envFrom", "app-env")], json!({}))
            .await;
        let stamp = env.stamp("s9", kind, &name).await;
        assert!(stamp.is_some(), "{kind} stamped at CREATE");
        first.push(stamp);
    }
    env.barrier("s9").await;

    env.config_map("s9", "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    for (&kind, first) in kinds.iter().zip(&first) {
        let name = kind.to_lowercase();
        if env.counts_rollouts(kind) {
            env.wait_rollouts("s9", kind, &name, 1).await;
        } else {
            eprintln!(
                "real cluster: a {kind} keeps no revision, so its rollouts are not counted; \
                 its job template's stamp is checked"
            );
            env.eventually(&format!("the {kind}'s stamp to change"), || async {
                env.stamp("s9", kind, &name).await != *first
            })
            .await;
        }
    }
    env.barrier("s9").await;
    let expected = twin_stamp(&env, "s9", "twin", &[("envFrom", "app-env")]).await;
    for (kind, first) in kinds.into_iter().zip(first) {
        let name = kind.to_lowercase();
        if env.counts_rollouts(kind) {
            assert_eq!(env.rollouts("s9", kind, &name).await, 1, "{kind}");
        }
        // For the CronJob this is the job template's stamp: the next Job gets the new config.
        let last = env.stamp("s9", kind, &name).await;
        assert_ne!(last, first, "{kind}");
        assert_eq!(last.as_deref(), Some(expected.as_str()), "{kind}");
    }
    // Running Jobs are left alone and none is created (the CronJob is suspended, so none starts
    // by its schedule): the stand-in does not serve Jobs, so this is checked on a real cluster
    // only.
    if !env.is_stand_in() {
        let jobs = Api::<Job>::namespaced(env.client.clone(), &env.ns("s9"))
            .list(&ListParams::default())
            .await
            .unwrap();
        assert!(jobs.items.is_empty(), "no Job was created");
    }
}

// 10.
#[tokio::test]
async fn a_cluster_without_argo_rollouts_still_rolls_deployments() {
    // The stand-in is set up without them; a real cluster is taken as it is.
    let env = Env::start_with(Setup {
        rollouts_served: false,
        ..Default::default()
    })
    .await;
    if env.serves("Rollout") {
        eprintln!(
            "skipped: a_cluster_without_argo_rollouts_still_rolls_deployments needs a cluster \
             without Argo Rollouts, and this one serves them"
        );
        return;
    }
    env.namespace("s10", true).await;
    env.config_map("s10", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.deployment("s10", "web", &[("envFrom", "app-env")])
        .await;
    let first = env.stamp("s10", "Deployment", "web").await;
    assert!(first.is_some());
    env.barrier("s10").await;

    env.config_map("s10", "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.wait_rollouts("s10", "Deployment", "web", 1).await;
    env.barrier("s10").await;
    assert_eq!(env.rollouts("s10", "Deployment", "web").await, 1);
    assert_ne!(env.stamp("s10", "Deployment", "web").await, first);
}

// 11.
#[tokio::test]
async fn optional_references_and_the_ignore_annotation() {
    let env = Env::start().await;
    env.namespace("s11", true).await;
    // An optional reference to a ConfigMap that does not exist yet.
    env.deployment("s11", "opt", &[("optionalEnvFrom", "maybe")])
        .await;
    let opt_first = env.stamp("s11", "Deployment", "opt").await;
    assert!(opt_first.is_some(), "stamped at CREATE with the absent one");
    // A required reference that will be ignored.
    env.config_map("s11", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.deployment("s11", "web", &[("envFrom", "app-env")])
        .await;
    let web_first = env.stamp("s11", "Deployment", "web").await;
    env.barrier("s11").await;

    env.config_map("s11", "maybe", &[("FEATURE", "on")]).await;
    env.wait_rollouts("s11", "Deployment", "opt", 1).await;
    env.barrier("s11").await;
    assert_eq!(
        env.rollouts("s11", "Deployment", "opt").await,
        1,
        "the optional ConfigMap appeared"
    );
    assert_ne!(env.stamp("s11", "Deployment", "opt").await, opt_first);

    annotate_config_map(&env, "s11", "app-env", "confighash.dev/ignore", "true").await;
    env.wait_rollouts("s11", "Deployment", "web", 1).await;
    env.barrier("s11").await;
    assert_eq!(
        env.rollouts("s11", "Deployment", "web").await,
        1,
        "adding the ignore annotation changes the stamp once"
    );
    let ignored = env.stamp("s11", "Deployment", "web").await;
    assert_ne!(ignored, web_first);
    assert_eq!(
        ignored.as_deref(),
        Some(twin_stamp(&env, "s11", "no-refs", &[]).await.as_str()),
        "an ignored object is left out as if unreferenced"
    );

    env.config_map("s11", "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.barrier("s11").await;
    assert_eq!(
        env.rollouts("s11", "Deployment", "web").await,
        1,
        "content changes of an ignored ConfigMap roll nothing"
    );
    assert_eq!(env.stamp("s11", "Deployment", "web").await, ignored);
    assert_eq!(env.rollouts("s11", "Deployment", "opt").await, 1);
}

// 12.
#[tokio::test]
async fn a_shared_config_map_rolls_exactly_its_users() {
    let env = Env::start().await;
    env.namespace("s12", true).await;
    env.config_map("s12", "shared", &[("LOG_LEVEL", "info")])
        .await;
    env.config_map("s12", "own", &[("PORT", "8080")]).await;
    env.deployment("s12", "a", &[("envFrom", "shared")]).await;
    env.deployment("s12", "b", &[("volume", "shared")]).await;
    env.deployment("s12", "c", &[("envFrom", "own")]).await;
    let c_first = env.stamp("s12", "Deployment", "c").await;
    env.barrier("s12").await;

    env.config_map("s12", "shared", &[("LOG_LEVEL", "debug")])
        .await;
    env.wait_rollouts("s12", "Deployment", "a", 1).await;
    env.wait_rollouts("s12", "Deployment", "b", 1).await;
    env.barrier("s12").await;
    assert_eq!(env.rollouts("s12", "Deployment", "a").await, 1);
    assert_eq!(env.rollouts("s12", "Deployment", "b").await, 1);
    assert_eq!(
        env.rollouts("s12", "Deployment", "c").await,
        0,
        "c does not use the shared ConfigMap"
    );
    assert_eq!(env.stamp("s12", "Deployment", "c").await, c_first);
}

/// Sets or removes a namespace's opt-in label.
async fn opt_in(env: &Env, namespace: &str, opted_in: bool) {
    let value = if opted_in { json!("true") } else { json!(null) };
    Api::<Namespace>::all(env.client.clone())
        .patch(
            &env.ns(namespace),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"confighash.dev/enabled": value}}})),
        )
        .await
        .unwrap();
}

/// Waits until the in-process watcher keeps exactly `n` ConfigMaps: it keeps only those of
/// opted-in namespaces. On a real cluster this cannot be observed (confighash's metrics are not
/// read here), so there it is left out, with a note.
async fn wait_kept_config_maps(env: &Env, n: usize) {
    if !env.is_stand_in() {
        eprintln!(
            "real cluster: not checked that the watcher keeps {n} ConfigMap(s) (its metrics are \
             not read)"
        );
        return;
    }
    let line = format!("confighash_watched_objects{{kind=\"ConfigMap\"}} {n}");
    let metrics = env.metrics.clone();
    env.eventually(&format!("the watcher to keep {n} ConfigMaps"), || {
        let found = metrics.encode().lines().any(|l| l == line);
        async move { found }
    })
    .await;
}

// 13.
#[tokio::test]
async fn a_namespace_opted_in_later_rolls_on_its_next_change_with_every_reference() {
    let env = Env::start().await;
    env.namespace("late", false).await;
    env.namespace("s13", true).await;
    env.config_map("late", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.secret("late", "db", &[("password", "one")]).await;
    let refs = [("envFrom", "app-env"), ("secretKey", "db/password")];
    env.deployment("late", "web", &refs).await;
    assert_eq!(env.stamp("late", "Deployment", "web").await, None);
    env.barrier("s13").await;
    // The barrier's ConfigMap is the only one kept: "late" is known not to be opted in, so its
    // objects are left out, and opting in has to list them.
    wait_kept_config_maps(&env, 1).await;

    opt_in(&env, "late", true).await;
    env.barrier("late").await;
    env.config_map("late", "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.wait_rollouts("late", "Deployment", "web", 1).await;
    env.barrier("late").await;
    assert_eq!(env.rollouts("late", "Deployment", "web").await, 1);
    // The stamp covers the Secret too, which changed nowhere since the opt-in.
    assert_eq!(
        env.stamp("late", "Deployment", "web").await.unwrap(),
        twin_stamp(&env, "late", "twin", &refs).await
    );
}

// 14.
#[tokio::test]
async fn a_change_made_while_a_namespace_was_opted_out_rolls_once_when_it_opts_back_in() {
    let env = Env::start().await;
    env.namespace("s14", true).await;
    env.namespace("s14-other", true).await;
    env.config_map("s14", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.secret("s14", "db", &[("password", "one")]).await;
    let refs = [("envFrom", "app-env"), ("secretEnvFrom", "db")];
    env.deployment("s14", "web", &refs).await;
    let first = env.stamp("s14", "Deployment", "web").await.unwrap();
    env.barrier("s14").await;

    opt_in(&env, "s14", false).await;
    env.barrier("s14-other").await;
    wait_kept_config_maps(&env, 1).await; // s14-other's barrier only
    env.config_map("s14", "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.barrier("s14-other").await;
    assert_eq!(env.rollouts("s14", "Deployment", "web").await, 0);

    opt_in(&env, "s14", true).await;
    env.wait_rollouts("s14", "Deployment", "web", 1).await;
    env.barrier("s14").await;
    assert_eq!(env.rollouts("s14", "Deployment", "web").await, 1);
    let last = env.stamp("s14", "Deployment", "web").await.unwrap();
    assert_ne!(last, first);
    assert_eq!(last, twin_stamp(&env, "s14", "twin", &refs).await);
}

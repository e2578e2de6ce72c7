//! End to end: progressive waves (`confighash.dev/rollout: progressive`) where users need them,
//! counted from confighash's own writes: a change of one key of a ConfigMap whose first
//! dependents use another key goes to the first workload that uses the changed key, alone; a
//! wave whose batches take longer to touch than the timeout finishes without a halt; a
//! brownfield namespace with a progressive CA bundle rolls nothing on opt-in.
//!
//! A wave waits for rollouts: their controllers and pods run on the real tier (kwok), not in the
//! stand-in, which runs only the brownfield scenario (it rolls nothing, so needs no rollout).

use std::time::Duration;

use crate::support;

use confighash::core::names::{ROLLOUT_ANNOTATION, UNSTAMPED_ANNOTATION, UNSTAMPED_LOOKUP_FAILED};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use support::Env;

/// How long a wave of these scenarios may take, end to end.
const WAVE_DEADLINE: Duration = Duration::from_secs(600);

/// Marks a ConfigMap progressive (a metadata-only write: no content change).
async fn make_progressive(env: &Env, namespace: &str, name: &str) {
    Api::<ConfigMap>::namespaced(env.client.clone(), &env.ns(namespace))
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {ROLLOUT_ANNOTATION: "progressive"}}}),
            ),
        )
        .await
        .unwrap();
}

/// confighash's writes of Deployments in `namespace` (not its Events), by name.
fn deployment_writes(env: &Env, namespace: &str) -> Vec<String> {
    env.confighash_writes(namespace)
        .into_iter()
        .filter(|w| w.resource == "deployments")
        .map(|w| w.name)
        .collect()
}

/// Polls, up to [`WAVE_DEADLINE`], until every one of `names` rolled `n` times.
async fn wait_all_rolled(env: &Env, namespace: &str, names: &[String], n: u64) {
    let start = tokio::time::Instant::now();
    loop {
        let mut behind = Vec::new();
        for name in names {
            if env.rollouts(namespace, "Deployment", name).await < n {
                behind.push(name.as_str());
            }
        }
        if behind.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < WAVE_DEADLINE,
            "after {WAVE_DEADLINE:?}, not rolled {n} times: {behind:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn skip_in_stand_in(env: &Env, test: &str) -> bool {
    if env.is_stand_in() {
        eprintln!(
            "skipped: {test} needs controllers and pods (a wave waits for rollouts): the real \
             tier runs it on kube-apiserver with kwok"
        );
        return true;
    }
    false
}

#[tokio::test]
async fn a_change_of_one_key_rolls_the_first_workload_that_uses_it_alone() {
    const TEST: &str = "a_change_of_one_key_rolls_the_first_workload_that_uses_it_alone";
    let Some(env) = Env::counted(TEST).await else {
        return;
    };
    if skip_in_stand_in(&env, TEST) {
        return;
    }
    let ns = "mixed-keys";
    env.namespace(ns, true).await;
    env.config_map(ns, "shared", &[("a", "1"), ("b", "1")])
        .await;
    make_progressive(&env, ns, "shared").await;
    // Three dependents of key `b` sort first, five of key `a` after them.
    let of_b: Vec<String> = (0..3).map(|i| format!("d{i:02}")).collect();
    let of_a: Vec<String> = (3..8).map(|i| format!("d{i:02}")).collect();
    for name in &of_b {
        env.deployment(ns, name, &[("key", "shared/b")]).await;
    }
    for name in &of_a {
        env.deployment(ns, name, &[("key", "shared/a")]).await;
    }
    env.barrier(ns).await;
    let before = deployment_writes(&env, ns).len();

    env.config_map(ns, "shared", &[("a", "2"), ("b", "1")])
        .await;
    env.eventually_with(
        || async { env.rollouts(ns, "Deployment", "d03").await == 1 },
        || "d03, the first dependent of key a, to roll".to_owned(),
    )
    .await;
    // The next batch waits for d03's rollout and the settle time after it (10 s): none of the
    // others has rolled when the first has.
    let mut first_batch = vec!["d03".to_owned()];
    for name in of_a.iter().skip(1).chain(&of_b) {
        if env.rollouts(ns, "Deployment", name).await > 0 {
            first_batch.push(name.clone());
        }
    }
    assert_eq!(
        first_batch,
        ["d03"],
        "the first batch of the change of key a"
    );
    wait_all_rolled(&env, ns, &of_a, 1).await;
    env.barrier(ns).await;
    for name in &of_b {
        assert_eq!(env.rollouts(ns, "Deployment", name).await, 0, "{name}");
    }
    let writes = deployment_writes(&env, ns);
    let mut wave_writes: Vec<&str> = writes[before..]
        .iter()
        .map(String::as_str)
        .filter(|n| *n != "barrier")
        .collect();
    wave_writes.sort_unstable();
    assert_eq!(
        wave_writes, of_a,
        "confighash's writes: each user of key a once"
    );
    eprintln!("{TEST}: first batch {first_batch:?}; writes {wave_writes:?}");
}

#[tokio::test]
async fn a_wave_whose_batches_take_longer_to_touch_than_the_timeout_finishes() {
    const TEST: &str = "a_wave_whose_batches_take_longer_to_touch_than_the_timeout_finishes";
    let Some(mut env) = Env::controlling(TEST, support::Setup::default()).await else {
        return;
    };
    if skip_in_stand_in(&env, TEST) {
        return;
    }
    // 0.5 touches a second and a 20 s timeout: the batch of 32 takes over 20 s to touch (the
    // bucket holds 20 at most). The clock of each workload starts at its own touch.
    let _restored = env
        .restart_confighash_with(&["--max-touches-per-second=0.5", "--progressive-timeout=20s"])
        .await;
    let ns = "slow-touches";
    env.namespace(ns, true).await;
    env.config_map(ns, "shared", &[("ca.crt", "1")]).await;
    make_progressive(&env, ns, "shared").await;
    let names: Vec<String> = (0..63).map(|i| format!("d{i:02}")).collect();
    for name in &names {
        env.deployment(ns, name, &[("volume", "shared")]).await;
    }
    env.barrier(ns).await;
    let started = tokio::time::Instant::now();
    env.config_map(ns, "shared", &[("ca.crt", "2")]).await;
    wait_all_rolled(&env, ns, &names, 1).await;
    let took = started.elapsed();
    assert_eq!(
        env.events(ns, "shared", "WaveHalted").await,
        0,
        "no halt: nothing was unhealthy"
    );
    env.barrier(ns).await;
    let writes = deployment_writes(&env, ns);
    for name in &names {
        let n = writes.iter().filter(|w| *w == name).count();
        assert_eq!(n, 1, "{name}: confighash's writes");
    }
    eprintln!("{TEST}: 63 Deployments rolled in {took:?}, each written once, no halt");
}

/// The wave CI runs at scale (the 2,000 is `benches/progressive_wave.rs`): 200 Deployments share
/// a progressive CA bundle, touched at 20 a second; the change rolls each exactly once, in
/// batches 1, 2, 4, ..., 72, with no halt.
#[tokio::test]
async fn a_wave_of_two_hundred_rolls_each_once_without_a_halt() {
    const TEST: &str = "a_wave_of_two_hundred_rolls_each_once_without_a_halt";
    let Some(mut env) = Env::controlling(TEST, support::Setup::default()).await else {
        return;
    };
    if skip_in_stand_in(&env, TEST) {
        return;
    }
    let _restored = env
        .restart_confighash_with(&["--max-touches-per-second=20", "--progressive-settle=2s"])
        .await;
    let ns = "wave-200";
    env.namespace(ns, true).await;
    env.config_map(ns, "ca-bundle", &[("ca.crt", "1")]).await;
    make_progressive(&env, ns, "ca-bundle").await;
    let names: Vec<String> = (0..200).map(|i| format!("d{i:03}")).collect();
    for name in &names {
        env.deployment(ns, name, &[("volume", "ca-bundle")]).await;
    }
    env.barrier(ns).await;
    let started = tokio::time::Instant::now();
    env.config_map(ns, "ca-bundle", &[("ca.crt", "2")]).await;
    wait_all_rolled(&env, ns, &names, 1).await;
    let took = started.elapsed();
    assert_eq!(env.events(ns, "ca-bundle", "WaveHalted").await, 0);
    env.barrier(ns).await;
    let writes = deployment_writes(&env, ns);
    for name in &names {
        let n = writes.iter().filter(|w| *w == name).count();
        assert_eq!(n, 1, "{name}: confighash's writes");
    }
    // The wave's first write is the first member's, alone: its gate (the barrier's are not
    // the wave's).
    let first = writes.iter().find(|w| names.contains(w));
    assert_eq!(first.map(String::as_str), Some("d000"));
    eprintln!("{TEST}: 200 Deployments rolled in {took:?}, each written once, no halt");
}

#[tokio::test]
async fn a_brownfield_namespace_with_a_progressive_ca_bundle_rolls_nothing_on_opt_in() {
    const TEST: &str =
        "a_brownfield_namespace_with_a_progressive_ca_bundle_rolls_nothing_on_opt_in";
    let Some(env) = Env::counted(TEST).await else {
        return;
    };
    // Years of workloads, never stamped, and a CA bundle marked progressive; one of them carries
    // the marker reconcile resolves (as a lookup that failed at its CREATE leaves it).
    let ns = "brownfield";
    env.namespace(ns, false).await;
    env.config_map(ns, "ca-bundle", &[("ca.crt", "1")]).await;
    make_progressive(&env, ns, "ca-bundle").await;
    let names: Vec<String> = (0..6).map(|i| format!("d{i:02}")).collect();
    for name in &names {
        env.deployment(ns, name, &[("volume", "ca-bundle")]).await;
    }
    let mut marked = support::workload_object(
        "Deployment",
        "marked",
        &[("volume", "ca-bundle")],
        json!({}),
    );
    marked["metadata"]["annotations"] = json!({UNSTAMPED_ANNOTATION: UNSTAMPED_LOOKUP_FAILED});
    let api: Api<DynamicObject> = Api::namespaced_with(
        env.client.clone(),
        &env.ns(ns),
        &support::api_resource("Deployment"),
    );
    api.create(
        &PostParams::default(),
        &serde_json::from_value(marked).unwrap(),
    )
    .await
    .unwrap();
    env.wait_first_revision(ns, "Deployment", "marked").await;

    // Opted in: reconcile resolves the marker, and touches nothing else.
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(env.client.clone());
    namespaces
        .patch(
            &env.ns(ns),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"confighash.dev/enabled": "true"}}})),
        )
        .await
        .unwrap();
    env.eventually_with(
        || async { env.stamp(ns, "Deployment", "marked").await.is_some() },
        || "the marked Deployment to be stamped".to_owned(),
    )
    .await;
    env.barrier(ns).await;
    let writes: Vec<String> = deployment_writes(&env, ns)
        .into_iter()
        .filter(|n| n != "barrier")
        .collect();
    assert_eq!(writes, ["marked"], "confighash's writes on opt-in");
    for name in &names {
        assert_eq!(env.stamp(ns, "Deployment", name).await, None, "{name}");
        if env.counts_rollouts("Deployment") {
            assert_eq!(env.rollouts(ns, "Deployment", name).await, 0, "{name}");
        }
    }
    assert_eq!(env.events(ns, "ca-bundle", "WaveHalted").await, 0);
}

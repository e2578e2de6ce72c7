//! End to end: what a GitOps tool sees. Argo CD's server-side diff and Flux's drift detection
//! send the manifest from git as a server-side apply with `dryRun=All` under their own field
//! manager; the answer is what they compare with the live object. It passes through the webhook
//! like a write, so it carries the stamp the webhook would write now: the live stamp while the
//! config is unchanged (no drift, also for `annotations: {}` and `annotations: null` in the pod
//! template), and the new stamp while a change window is open (drift for up to the window).
//!
//! Who owns the stamp in `managedFields`, as kube-apiserver 1.34 records it: nobody after a
//! CREATE by apply (a field a mutating webhook adds to an apply is owned by no manager),
//! `confighash` (operation Update) after a touch, and still `confighash` after the next apply by
//! the GitOps tool, which does not strip it.

use crate::support;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use support::{Env, STAMP, WINDOW};

const MANAGER: &str = "argocd-controller";

/// The Deployment `web` as git holds it: no stamp; `annotations` is put in the pod template's
/// metadata as given (absent when None).
fn manifest(annotations: Option<Value>) -> Value {
    let mut metadata = json!({"labels": {"app": "web"}});
    if let Some(a) = annotations {
        metadata["annotations"] = a;
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": metadata,
                "spec": {"containers": [{
                    "name": "app",
                    "image": "example/app:1",
                    "envFrom": [{"configMapRef": {"name": "app-env"}}]
                }]}
            }
        }
    })
}

/// A server-side apply of `manifest` by the GitOps tool's manager; `dry_run` as its diff does.
async fn apply(env: &Env, namespace: &str, manifest: &Value, dry_run: bool) -> Deployment {
    let api: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns(namespace));
    let mut params = PatchParams::apply(MANAGER);
    params.dry_run = dry_run;
    api.patch("web", &params, &Patch::Apply(manifest))
        .await
        .unwrap()
}

fn stamp_of(d: &Deployment) -> Option<String> {
    d.spec
        .as_ref()?
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(STAMP)
        .cloned()
}

/// The managers (and operations) whose managed fields hold the stamp.
fn stamp_owners(d: &Deployment) -> Vec<String> {
    let field = format!("f:{STAMP}");
    d.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| {
            m.fields_v1.as_ref().is_some_and(|f| {
                f.0.pointer("/f:spec/f:template/f:metadata/f:annotations")
                    .and_then(|a| a.get(&field))
                    .is_some()
            })
        })
        .map(|m| {
            format!(
                "{} {}",
                m.manager.as_deref().unwrap_or("?"),
                m.operation.as_deref().unwrap_or("?")
            )
        })
        .collect()
}

async fn live(env: &Env, namespace: &str) -> Deployment {
    Api::<Deployment>::namespaced(env.client.clone(), &env.ns(namespace))
        .get("web")
        .await
        .unwrap()
}

#[tokio::test]
async fn a_gitops_diff_sees_no_drift_and_an_apply_never_strips_the_stamp() {
    let env = Env::start().await;
    env.namespace("g1", true).await;
    env.config_map("g1", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    let created = apply(&env, "g1", &manifest(None), false).await;
    env.wait_first_revision("g1", "Deployment", "web").await;
    let stamp = stamp_of(&created).expect("stamped at CREATE");
    assert_eq!(
        stamp_owners(&live(&env, "g1").await),
        Vec::<String>::new(),
        "after a CREATE by apply the webhook's stamp is owned by no manager"
    );
    env.barrier("g1").await;

    // The diff: the git manifest, dry run, with the pod template's annotations absent, empty
    // or null. Each answer carries the live stamp: no drift.
    for annotations in [None, Some(json!({})), Some(Value::Null)] {
        let what = format!("{annotations:?}");
        let answer = apply(&env, "g1", &manifest(annotations), true).await;
        assert_eq!(
            stamp_of(&answer).as_deref(),
            Some(stamp.as_str()),
            "the dry-run apply with annotations {what} shows the live stamp"
        );
    }
    assert_eq!(env.rollouts("g1", "Deployment", "web").await, 0);

    // A config change: the touch makes confighash the stamp's owner.
    env.config_map("g1", "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.wait_rollouts("g1", "Deployment", "web", 1).await;
    env.barrier("g1").await;
    let touched = live(&env, "g1").await;
    let new_stamp = stamp_of(&touched).unwrap();
    assert_ne!(new_stamp, stamp);
    assert_eq!(
        stamp_owners(&touched),
        ["confighash Update"],
        "after a touch confighash owns the stamp: {:#?}",
        touched.metadata.managed_fields
    );

    // The next sync applies the manifest without the stamp: it keeps its value and its owner,
    // and nothing rolls.
    let writes = touches(&env, "g1");
    for annotations in [None, Some(json!({})), Some(Value::Null)] {
        let applied = apply(&env, "g1", &manifest(annotations), false).await;
        assert_eq!(stamp_of(&applied).as_deref(), Some(new_stamp.as_str()));
    }
    env.barrier("g1").await;
    let after = live(&env, "g1").await;
    assert_eq!(stamp_of(&after).as_deref(), Some(new_stamp.as_str()));
    assert_eq!(stamp_owners(&after), ["confighash Update"]);
    assert_eq!(
        env.rollouts("g1", "Deployment", "web").await,
        1,
        "the apply rolled nothing"
    );
    assert_eq!(touches(&env, "g1"), writes, "confighash wrote nothing");
    assert_eq!(env.events("g1", "web", "ConfigChanged").await, 1);
}

/// confighash's writes to the Deployment `web` so far.
fn touches(env: &Env, namespace: &str) -> usize {
    env.confighash_writes(namespace)
        .iter()
        .filter(|w| w.resource == "deployments" && w.name == "web")
        .count()
}

#[tokio::test]
async fn a_sync_inside_an_open_change_window_rolls_once_and_leaves_the_touch_nothing_to_do() {
    let env = Env::start().await;
    env.namespace("g2", true).await;
    env.config_map("g2", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    let created = apply(&env, "g2", &manifest(None), false).await;
    env.wait_first_revision("g2", "Deployment", "web").await;
    let stamp = stamp_of(&created).unwrap();
    env.barrier("g2").await;
    let mark = env.mark("g2").await;

    // The ConfigMap changes in git and is synced: a change window opens. Within it the diff
    // shows the stamp of the new config (drift, for up to the window), and a sync then (Argo
    // CD's auto-sync, a Flux reconcile) writes it through the webhook: one rollout.
    let opened = tokio::time::Instant::now();
    env.config_map("g2", "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    let diff = apply(&env, "g2", &manifest(None), true).await;
    let synced = apply(&env, "g2", &manifest(None), false).await;
    assert!(
        opened.elapsed() < WINDOW,
        "the diff and the sync took {:?}, longer than the window: the scenario did not happen",
        opened.elapsed()
    );
    let new_stamp = stamp_of(&diff).unwrap();
    assert_ne!(
        new_stamp, stamp,
        "the diff inside the window shows the new stamp"
    );
    assert_eq!(stamp_of(&synced).as_deref(), Some(new_stamp.as_str()));
    env.wait_rollouts("g2", "Deployment", "web", 1).await;

    // When the window closes the watcher finds the stamp current: it touches nothing.
    env.barrier("g2").await;
    assert_eq!(env.rollouts("g2", "Deployment", "web").await, 1);
    env.assert_quiet_since(&mark, "web", "a sync inside the window")
        .await;
    assert_eq!(
        stamp_of(&live(&env, "g2").await).as_deref(),
        Some(new_stamp.as_str())
    );
}

//! End to end: an UPDATE that sends the git manifest without the stamp (`kubectl replace`,
//! Argo CD's `Replace=true`) rolls nothing, whatever stamp the workload carries (current, of a
//! replaced key, or none because it predates confighash), alone and with a second mutating
//! webhook that adds a pod-template field at every write and is called after confighash or
//! before it.
//!
//! They run on both servers: on a real cluster the second webhook is served here on loopback,
//! the key Secret is replaced and the outage is the webhook configuration pointed at a closed
//! port, under [`Env::controlling`]'s lock.

use crate::support;

use confighash_testkit::apiserver::TestWebhook;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::{Env, Setup, api_resource, workload_object};

/// The template annotation the second webhook adds.
const SIDECAR: &str = "sidecar.example/injected";

/// Where the second webhook runs, by namespace: none, after confighash (its configuration sorts
/// after `confighash`), before it.
const NAMESPACES: [(&str, Option<&str>); 3] = [
    ("plain", None),
    ("after", Some("zz-sidecar")),
    ("before", Some("a-sidecar")),
];

/// What the workloads carry when the manifest is replaced.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Carried {
    /// The stamp of the current key.
    Current,
    /// The stamp of a key replaced since.
    Foreign,
    /// No stamp: created while the webhook was down, as before confighash was installed.
    None,
}

/// Registers a webhook that adds [`SIDECAR`] to the pod template at every CREATE and UPDATE in
/// namespaces labelled `sidecar=<its configuration's name>`, with `reinvocationPolicy:
/// IfNeeded`. It is served here on loopback, where a real API server calls it too; its
/// configuration is named `name` and this Env's suffix (`name` itself in the stand-in), so its
/// order beside `confighash` is the one `name` gives, and on a real cluster it selects only this
/// Env's namespaces: a configuration another run left behind (its server gone) never fails this
/// run's writes.
async fn register_sidecar(env: &Env, name: &str) -> Sidecar {
    let hook = TestWebhook::annotating(SIDECAR, "true").await;
    let configuration_name = env.ns(name);
    let mut configuration = hook.configuration(&configuration_name, "Fail");
    configuration["webhooks"][0]["name"] = json!(format!("{name}.example.test"));
    configuration["webhooks"][0]["namespaceSelector"] =
        json!({"matchLabels": {"sidecar": configuration_name}});
    configuration["webhooks"][0]["reinvocationPolicy"] = json!("IfNeeded");
    Api::<MutatingWebhookConfiguration>::all(env.client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(configuration).unwrap(),
        )
        .await
        .unwrap();
    Sidecar {
        hook,
        configuration: env.real_config().map(|config| (config, configuration_name)),
    }
}

/// A second webhook and, on a real cluster, its configuration, which outlives the test: dropping
/// this deletes it (also when the test fails), before the webhook's server goes, so no write of a
/// later test meets a configuration whose server is gone.
struct Sidecar {
    hook: TestWebhook,
    configuration: Option<(kube::Config, String)>,
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let Some((config, name)) = self.configuration.take() else {
            return;
        };
        let what = format!("deleting the webhook configuration {name}");
        support::clean_up(config, &what, |client| async move {
            Api::<MutatingWebhookConfiguration>::all(client)
                .delete(&name, &Default::default())
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
    }
}

/// The manifest in git: the workload as first applied, without any stamp, at the stored
/// resourceVersion.
fn manifest(stored: &Value) -> DynamicObject {
    let mut object = workload_object("Deployment", "web", &[("envFrom", "app-env")], json!({}));
    object["metadata"]["resourceVersion"] = stored["metadata"]["resourceVersion"].clone();
    serde_json::from_value(object).unwrap()
}

/// Replaces the Deployment `web` in `ns` with `object(stored)`, `stored` read just before. On a
/// real cluster the Deployment controller may write the status in between (409 Conflict): then
/// it reads and replaces again, as `kubectl replace` users do.
async fn replace_web(env: &Env, ns: &str, object: impl Fn(&Value) -> DynamicObject) {
    let api: Api<DynamicObject> =
        Api::namespaced_with(env.client.clone(), &env.ns(ns), &api_resource("Deployment"));
    for attempt in 1.. {
        let stored = env.get_workload(ns, "Deployment", "web").await.unwrap();
        match api
            .replace("web", &PostParams::default(), &object(&stored))
            .await
        {
            Ok(_) => return,
            Err(kube::Error::Api(status)) if status.code == 409 && attempt < 10 => {}
            Err(e) => panic!("replace of {ns}/web: {e}"),
        }
    }
}

async fn replace_rolls_nothing(test: &str, carried: Carried) {
    let Some(mut env) = Env::controlling(test, Setup::default()).await else {
        return;
    };
    let mut hooks = Vec::new();
    for (ns, sidecar) in NAMESPACES {
        env.namespace(ns, true).await;
        if let Some(name) = sidecar {
            Api::<Namespace>::all(env.client.clone())
                .patch(
                    &env.ns(ns),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {"sidecar": env.ns(name)}}})),
                )
                .await
                .unwrap();
            hooks.push(register_sidecar(&env, name).await);
        }
        env.config_map(ns, "app-env", &[("LOG_LEVEL", "info")])
            .await;
        // The barrier's own workloads exist before the webhook may go down.
        env.barrier(ns).await;
    }
    if carried == Carried::None {
        env.stop_webhook().await;
    }
    for (ns, _) in NAMESPACES {
        env.deployment(ns, "web", &[("envFrom", "app-env")]).await;
    }
    match carried {
        Carried::None => env.restart_webhook().await,
        Carried::Foreign => {
            // A key of this run's own: on a real cluster an earlier run may have left one.
            let bytes: [u8; 32] = rand::random();
            env.replace_key(&bytes).await;
        }
        Carried::Current => {}
    }
    for (ns, sidecar) in NAMESPACES {
        env.barrier(ns).await;
        let before = env.get_workload(ns, "Deployment", "web").await.unwrap();
        let stamp = env.stamp(ns, "Deployment", "web").await;
        assert_eq!(stamp.is_some(), carried != Carried::None, "{ns}: {stamp:?}");
        let template_annotations = before.pointer("/spec/template/metadata/annotations");
        assert_eq!(
            template_annotations.and_then(|a| a.get(SIDECAR)).is_some(),
            sidecar.is_some(),
            "{ns}: {template_annotations:?}"
        );

        replace_web(&env, ns, manifest).await;
        env.barrier(ns).await;
        assert_eq!(
            env.rollouts(ns, "Deployment", "web").await,
            0,
            "{carried:?} stamp, {ns}: the replace rolled the workload"
        );
        assert_eq!(env.stamp(ns, "Deployment", "web").await, stamp, "{ns}");
    }
    for sidecar in &hooks {
        assert!(sidecar.hook.calls() > 0, "the second webhook was called");
    }
    // On a real cluster dropping `hooks` deletes the second webhooks' configurations.
}

#[tokio::test]
async fn replacing_the_manifest_keeps_a_current_stamp_and_rolls_nothing() {
    replace_rolls_nothing(
        "replacing_the_manifest_keeps_a_current_stamp_and_rolls_nothing",
        Carried::Current,
    )
    .await;
}

#[tokio::test]
async fn replacing_the_manifest_keeps_a_foreign_stamp_and_rolls_nothing() {
    replace_rolls_nothing(
        "replacing_the_manifest_keeps_a_foreign_stamp_and_rolls_nothing",
        Carried::Foreign,
    )
    .await;
}

#[tokio::test]
async fn replacing_the_manifest_of_a_workload_never_stamped_rolls_nothing() {
    replace_rolls_nothing(
        "replacing_the_manifest_of_a_workload_never_stamped_rolls_nothing",
        Carried::None,
    )
    .await;
}

/// Opting a stamped workload out with a replace that drops the stamp rolls nothing, and config
/// changes no longer roll it.
#[tokio::test]
async fn opting_a_stamped_workload_out_by_replace_rolls_nothing() {
    let env = Env::start().await;
    env.namespace("shop", true).await;
    env.config_map("shop", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.deployment("shop", "web", &[("envFrom", "app-env")])
        .await;
    env.barrier("shop").await;
    let stamp = env.stamp("shop", "Deployment", "web").await;
    assert!(stamp.is_some());

    replace_web(&env, "shop", |stored| {
        let mut object = workload_object(
            "Deployment",
            "web",
            &[("envFrom", "app-env")],
            json!({"confighash.dev/enabled": "false"}),
        );
        object["metadata"]["resourceVersion"] = stored["metadata"]["resourceVersion"].clone();
        serde_json::from_value(object).unwrap()
    })
    .await;
    env.barrier("shop").await;
    assert_eq!(env.rollouts("shop", "Deployment", "web").await, 0);
    assert_eq!(env.stamp("shop", "Deployment", "web").await, stamp);

    env.config_map("shop", "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.barrier("shop").await;
    assert_eq!(
        env.rollouts("shop", "Deployment", "web").await,
        0,
        "an opted-out workload does not roll on config changes"
    );
}

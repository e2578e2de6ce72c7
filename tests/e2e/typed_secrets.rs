//! End to end: Secrets of every type are configuration to the watcher, as they are to the
//! webhook. A workload that mounts a service-account token or a Helm release record beside a
//! ConfigMap rolls once when the ConfigMap changes: to both, every reference is present, so the
//! stamp is not frozen.

use crate::support;

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use support::{Env, Setup};

/// A Secret of a type other than `Opaque`.
struct Typed {
    type_: &'static str,
    labels: &'static [(&'static str, &'static str)],
    annotations: &'static [(&'static str, &'static str)],
    data: &'static [(&'static str, &'static str)],
}

const SERVICE_ACCOUNT_TOKEN: Typed = Typed {
    type_: "kubernetes.io/service-account-token",
    labels: &[],
    // The ServiceAccount every namespace has; a real cluster's token controller fills the rest.
    annotations: &[("kubernetes.io/service-account.name", "default")],
    data: &[
        ("token", "eyJhbGciOiJSUzI1NiJ9.e30.c2lnbmF0dXJl"),
        ("namespace", "n"),
    ],
};

const HELM_RELEASE: Typed = Typed {
    type_: "helm.sh/release.v1",
    labels: &[
        ("owner", "helm"),
        ("name", "web"),
        ("status", "deployed"),
        ("version", "1"),
    ],
    annotations: &[],
    data: &[(
        "release",
        "H4sIAAAAAAAA/6pWKkktLlGyUlAqS8wpTVWqBQQAAP//LNkgcRMAAAA=",
    )],
};

fn map(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    (!pairs.is_empty()).then(|| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    })
}

async fn create_secret(env: &Env, namespace: &str, name: &str, typed: &Typed) {
    let api: Api<Secret> = Api::namespaced(env.client.clone(), &env.ns(namespace));
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: map(typed.labels),
            annotations: map(typed.annotations),
            ..Default::default()
        },
        type_: Some(typed.type_.to_owned()),
        data: Some(
            typed
                .data
                .iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Default::default()
    };
    if !env.is_stand_in() && typed.type_ == SERVICE_ACCOUNT_TOKEN.type_ {
        // A real cluster's token controller deletes a token Secret whose ServiceAccount does not
        // exist, and the ServiceAccount controller makes `default` only after the namespace.
        let accounts: Api<ServiceAccount> = Api::namespaced(env.client.clone(), &env.ns(namespace));
        env.eventually("the namespace's default ServiceAccount", || async {
            accounts.get_opt("default").await.unwrap().is_some()
        })
        .await;
    }
    api.create(&PostParams::default(), &secret).await.unwrap();
    if !env.is_stand_in() {
        // A real cluster's token controller adds its own keys after the create; wait for them, so
        // that write is not taken for a change made later.
        env.eventually("the Secret to be complete", || async {
            let s = api.get(name).await.unwrap();
            typed.type_ != SERVICE_ACCOUNT_TOKEN.type_
                || s.data.is_some_and(|d| d.contains_key("ca.crt"))
        })
        .await;
    }
}

/// Creates the Deployment `name`: `envFrom` the ConfigMap `config_map`, the Secret `secret`
/// mounted as a volume.
async fn deployment_mounting(
    env: &Env,
    namespace: &str,
    name: &str,
    config_map: &str,
    secret: &str,
) {
    let mut obj =
        support::workload_object("Deployment", name, &[("envFrom", config_map)], json!({}));
    let pod = &mut obj["spec"]["template"]["spec"];
    pod["volumes"] = json!([{"name": "secret", "secret": {"secretName": secret}}]);
    pod["containers"][0]["volumeMounts"] =
        json!([{"name": "secret", "mountPath": "/var/run/secret", "readOnly": true}]);
    Api::<DynamicObject>::namespaced_with(
        env.client.clone(),
        &env.ns(namespace),
        &support::api_resource("Deployment"),
    )
    .create(
        &PostParams::default(),
        &serde_json::from_value(obj).unwrap(),
    )
    .await
    .unwrap();
}

/// PATCH requests on Deployments the stand-in received so far (the test never patches one, so
/// all are confighash's touches).
fn patches_of_deployments(env: &Env) -> usize {
    env.api()
        .requests()
        .iter()
        .filter(|(verb, resource)| verb == "patch" && resource == "deployments")
        .count()
}

/// The ConfigChanged Events recorded for the workload `name`.
async fn config_changed_events(env: &Env, namespace: &str, name: &str) -> Vec<Event> {
    env.recorded_events(namespace, name, "ConfigChanged").await
}

/// `web` mounts a Secret of this type and uses the ConfigMap `app-env`; a change of the
/// ConfigMap rolls it exactly once, with one touch and a `ConfigChanged` Event.
async fn a_config_map_change_rolls_beside(typed: &Typed, ns: &str) {
    let env = Env::start().await;
    env.namespace(ns, true).await;
    create_secret(&env, ns, "typed", typed).await;
    env.config_map(ns, "app-env", &[("LOG_LEVEL", "info")])
        .await;
    rolls_once_on_a_config_map_change(&env, ns).await;
}

/// Creates `web` (see [`a_config_map_change_rolls_beside`]), then changes `app-env`: exactly one
/// rollout, one touch (counted on the stand-in), one `ConfigChanged` Event.
async fn rolls_once_on_a_config_map_change(env: &Env, ns: &str) {
    deployment_mounting(env, ns, "web", "app-env", "typed").await;
    let first = env.stamp(ns, "Deployment", "web").await;
    assert!(first.is_some(), "stamped at CREATE");
    env.barrier(ns).await;
    assert_eq!(env.rollouts(ns, "Deployment", "web").await, 0);
    let patches_before = env.is_stand_in().then(|| patches_of_deployments(env));

    env.config_map(ns, "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.wait_rollouts(ns, "Deployment", "web", 1).await;
    env.barrier(ns).await;
    assert_eq!(
        env.rollouts(ns, "Deployment", "web").await,
        1,
        "exactly one rollout"
    );
    assert_ne!(env.stamp(ns, "Deployment", "web").await, first);
    if let Some(before) = patches_before {
        assert_eq!(
            patches_of_deployments(env),
            before + 2,
            "one touch of web and one of the barrier's Deployment"
        );
    }
    env.eventually("the ConfigChanged Event", || async {
        config_changed_events(env, ns, "web").await.iter().any(|e| {
            e.type_.as_deref() == Some("Normal")
                && e.note
                    .as_deref()
                    .is_some_and(|n| n.starts_with("ConfigMap app-env changed"))
        })
    })
    .await;
    assert_eq!(config_changed_events(env, ns, "web").await.len(), 1);
}

#[tokio::test]
async fn a_config_map_change_rolls_a_workload_that_mounts_a_service_account_token() {
    a_config_map_change_rolls_beside(&SERVICE_ACCOUNT_TOKEN, "tokens").await;
}

#[tokio::test]
async fn a_config_map_change_rolls_a_workload_that_mounts_a_helm_release_record() {
    a_config_map_change_rolls_beside(&HELM_RELEASE, "releases").await;
}

/// A namespace that opts in after the watcher listed it: its objects are listed again then, a
/// service-account token among them.
#[tokio::test]
async fn a_namespace_opted_in_later_lists_its_typed_secrets_too() {
    let Some(mut env) = Env::stand_in_with(
        "a_namespace_opted_in_later_lists_its_typed_secrets_too",
        "starts the watcher after the objects exist",
        Setup {
            start_watcher: false,
            ..Default::default()
        },
    )
    .await
    else {
        return;
    };
    let ns = "later";
    env.namespace(ns, false).await;
    create_secret(&env, ns, "typed", &SERVICE_ACCOUNT_TOKEN).await;
    env.config_map(ns, "app-env", &[("LOG_LEVEL", "info")])
        .await;
    // Listed while the namespace is not opted in: nothing of it is kept.
    env.start_watcher();
    env.wait_synced().await;

    Api::<Namespace>::all(env.client.clone())
        .patch(
            ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"confighash.dev/enabled": "true"}}})),
        )
        .await
        .unwrap();
    rolls_once_on_a_config_map_change(&env, ns).await;
}

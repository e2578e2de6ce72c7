//! `confighash explain` against the in-memory API server with confighash running: one test per
//! verdict, the table of `-A`, `-o json`, a missing workload, a key Secret the user may not read,
//! and the real binary with a kubeconfig file.
//!
//! The in-process confighash reads its key from a file; `explain` reads the installation's key
//! from the key Secret as users run it, so each test writes that Secret with the same bytes.

use crate::support;

use clap::Parser;
use confighash::cli::{Cli, Command};
use confighash::core::checksum::StampKey;
use confighash::explain::{self, Report};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::{Env, KEY, Setup};

const OTHER_KEY: &[u8] = b"another key, not the installation's";

/// The environment, or `None` against a real cluster (these tests need the stand-in).
async fn stand_in(setup: Setup) -> Option<Env> {
    let env = Env::stand_in_with(
        "explain",
        "it writes the key Secret and sets up each verdict in-process",
        setup,
    )
    .await?;
    install_key(&env).await;
    Some(env)
}

/// Writes the key Secret `confighash/confighash-key` with the key confighash runs with.
async fn install_key(env: &Env) {
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    if namespaces.get_opt("confighash").await.unwrap().is_none() {
        env.namespace("confighash", false).await;
    }
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "confighash-key", "namespace": "confighash"},
        "data": {"key": ByteString(KEY.to_vec())}
    }))
    .unwrap();
    Api::<Secret>::namespaced(env.client.clone(), "confighash")
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
}

/// Runs `confighash explain ARGS` through the library entry point, as the user's (superuser)
/// kubeconfig would, behind the sanitising client.
async fn explain(env: &Env, args: &[&str]) -> Report {
    let client =
        confighash::cluster::client::build(env.api().config(), confighash::explain::READS).unwrap();
    explain_with(client, args).await
}

async fn explain_with(client: kube::Client, args: &[&str]) -> Report {
    let cli = Cli::try_parse_from(["confighash", "explain"].iter().chain(args)).unwrap();
    let Command::Explain(parsed) = cli.command else {
        panic!("not explain")
    };
    let request = parsed.to_request().expect("a valid explain request");
    let report = explain::run(client, &request).await;
    // The output, for `cargo test -- --nocapture`.
    println!("$ confighash explain {}\n{}", args.join(" "), report.text);
    for e in &report.errors {
        println!("error: {e}");
    }
    report
}

fn verdict_line(report: &Report) -> &str {
    report
        .text
        .lines()
        .find_map(|l| l.trim().strip_prefix("verdict: "))
        .unwrap_or_else(|| panic!("no verdict in {:?}", report.text))
}

fn json_of(report: &Report) -> Value {
    serde_json::from_str(&report.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", report.text))
}

/// A configured kind is explained as the built-in ones: found by its kind or plural with the
/// flag, its webhook rules matched by the plural the cluster serves.
#[tokio::test]
async fn a_configured_kind_is_explained_with_the_flag() {
    let Some(env) = stand_in(Setup::default()).await else {
        return;
    };
    env.apply_crd("CloneSet").await;
    env.namespace("shop", true).await;
    env.config_map("shop", "web-config", &[("mode", "fast")])
        .await;
    env.workload(
        "shop",
        "CloneSet",
        "web",
        &[("envFrom", "web-config")],
        json!({}),
    )
    .await;
    let stamp = env.stamp("shop", "CloneSet", "web").await.unwrap();
    let flag = "--workload-kind=apps.kruise.io/v1alpha1/CloneSet=/spec/template";
    for kind in ["cloneset", "clonesets.apps.kruise.io"] {
        let report = explain(&env, &["-n", "shop", &format!("{kind}/web"), flag]).await;
        assert_eq!(report.code, explain::EXIT_UP_TO_DATE, "{report:?}");
        let text = &report.text;
        assert!(
            text.starts_with("CloneSet shop/web\n  verdict: up-to-date\n"),
            "{text}"
        );
        assert!(
            text.contains("MutatingWebhookConfiguration confighash selects this workload"),
            "{text}"
        );
        assert!(text.contains(&format!("expected stamp: {stamp}")), "{text}");
    }
    // The namespace's table lists it among the workloads.
    let table = explain(&env, &["-n", "shop", flag]).await;
    assert!(table.text.contains("CloneSet"), "{}", table.text);
}

#[tokio::test]
async fn up_to_date_after_a_config_change_rolled_it() {
    let Some(env) = stand_in(Setup::default()).await else {
        return;
    };
    env.namespace("shop", true).await;
    env.config_map("shop", "web-config", &[("mode", "fast")])
        .await;
    env.secret("shop", "web-db", &[("password", "hunter2")])
        .await;
    env.deployment(
        "shop",
        "web",
        &[("envFrom", "web-config"), ("secretKey", "web-db/password")],
    )
    .await;
    let report = explain(&env, &["-n", "shop", "deploy/web"]).await;
    assert_eq!(report.code, 0, "{report:?}");
    assert_eq!(verdict_line(&report), "up-to-date");

    // A change the watcher acts on: it touches, the webhook re-stamps, an Event is recorded.
    env.config_map("shop", "web-config", &[("mode", "slow")])
        .await;
    env.wait_rollouts("shop", "Deployment", "web", 1).await;
    env.eventually("the ConfigChanged Event", || async {
        env.events("shop", "web", "ConfigChanged").await > 0
    })
    .await;
    env.settled().await;
    let stamp = env.stamp("shop", "Deployment", "web").await.unwrap();
    let report = explain(&env, &["-n", "shop", "deployment/web"]).await;
    assert_eq!(report.code, explain::EXIT_UP_TO_DATE, "{report:?}");
    let text = &report.text;
    assert!(
        text.starts_with("Deployment shop/web\n  verdict: up-to-date\n"),
        "{text}"
    );
    assert!(
        text.contains("  namespace shop: opted in (confighash.dev/enabled=true)"),
        "{text}"
    );
    assert!(
        text.contains("MutatingWebhookConfiguration confighash selects this workload"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "stamp (confighash.dev/checksum): {stamp} (current: this installation's key"
        )),
        "{text}"
    );
    assert!(text.contains(&format!("expected stamp: {stamp}")), "{text}");
    assert!(
        text.contains(
            "ConfigMap web-config: whole object, required: found, 1 key (4 bytes), resourceVersion"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "Secret web-db: keys password, required: found, 1 key (7 bytes), resourceVersion"
        ),
        "{text}"
    );
    assert!(
        text.contains("key: key Secret confighash/confighash-key: key id"),
        "{text}"
    );
    assert!(
        text.contains("Normal ConfigChanged: ConfigMap web-config"),
        "{text}"
    );
    assert!(!text.contains("hunter2"), "{text}");
}

#[tokio::test]
async fn stale_when_the_config_changed_and_no_watcher_acted() {
    let Some(env) = stand_in(Setup {
        start_watcher: false,
        ..Setup::default()
    })
    .await
    else {
        return;
    };
    env.namespace("stale", true).await;
    env.config_map("stale", "settings", &[("a", "1")]).await;
    env.deployment("stale", "api", &[("volume", "settings")])
        .await;
    let before = env.stamp("stale", "Deployment", "api").await.unwrap();
    env.config_map("stale", "settings", &[("a", "2")]).await;

    let report = explain(&env, &["-n", "stale", "deploy/api"]).await;
    assert_eq!(report.code, explain::EXIT_ATTENTION, "{report:?}");
    assert_eq!(verdict_line(&report), "stale");
    assert!(
        report.text.contains("not visible from the API"),
        "{}",
        report.text
    );
    let doc = json_of(&explain(&env, &["-n", "stale", "deploy/api", "-o", "json"]).await);
    assert_eq!(doc["verdict"], "stale");
    assert_eq!(doc["stamp"]["value"], before.as_str());
    assert_eq!(doc["stamp"]["class"], "current");
    assert_ne!(doc["expectedStamp"], before.as_str());
    assert_eq!(
        env.stamp("stale", "Deployment", "api").await.unwrap(),
        before,
        "explain only reads"
    );
}

#[tokio::test]
async fn unstamped_with_the_too_many_references_marker() {
    let mut setup = Setup::default();
    setup.watcher.max_references = 2;
    let Some(env) = stand_in(setup).await else {
        return;
    };
    env.namespace("big", true).await;
    env.deployment(
        "big",
        "many",
        &[("envFrom", "a"), ("envFrom", "b"), ("envFrom", "c")],
    )
    .await;
    env.eventually("the TooManyReferences Event", || async {
        env.events("big", "many", "TooManyReferences").await > 0
    })
    .await;
    let report = explain(&env, &["-n", "big", "deploy/many"]).await;
    assert_eq!(report.code, 1, "{report:?}");
    assert_eq!(verdict_line(&report), "unstamped");
    let text = &report.text;
    assert!(
        text.contains("marker (confighash.dev/unstamped): too-many-references"),
        "{text}"
    );
    assert!(text.contains("never retried"), "{text}");
    assert!(
        text.contains("Warning TooManyReferences: it references more than 2"),
        "{text}"
    );
    // Its references are absent, and said so.
    assert!(
        text.contains("ConfigMap a: whole object, required: absent"),
        "{text}"
    );
}

#[tokio::test]
async fn unstamped_without_a_marker_when_created_past_the_webhook() {
    let Some(mut env) = stand_in(Setup::default()).await else {
        return;
    };
    env.namespace("down", true).await;
    env.config_map("down", "cfg", &[("k", "v")]).await;
    // The watcher has handled the ConfigMap's creation: no change window is open that would
    // touch (and so stamp) the workload below.
    env.barrier("down").await;
    env.stop_webhook().await;
    env.deployment("down", "early", &[("envFrom", "cfg")]).await;
    assert_eq!(env.stamp("down", "Deployment", "early").await, None);

    let report = explain(&env, &["-n", "down", "deploy/early"]).await;
    assert_eq!(report.code, 1, "{report:?}");
    assert_eq!(verdict_line(&report), "unstamped");
    let text = &report.text;
    assert!(
        text.contains("stamp (confighash.dev/checksum): none"),
        "{text}"
    );
    assert!(
        !text.contains("marker (confighash.dev/unstamped)"),
        "{text}"
    );
    assert!(
        text.contains("neither a stamp nor the unstamped marker"),
        "{text}"
    );
    assert!(text.contains("at its next config change"), "{text}");
}

#[tokio::test]
async fn foreign_when_stamped_with_another_key() {
    let Some(env) = stand_in(Setup::default()).await else {
        return;
    };
    env.namespace("moved", true).await;
    env.config_map("moved", "cfg", &[("k", "v")]).await;
    // No change window open: a config change would replace the foreign stamp.
    env.barrier("moved").await;
    let other = StampKey::new(OTHER_KEY.to_vec()).unwrap();
    let current = StampKey::new(KEY.to_vec()).unwrap();
    env.keys.set(other.clone());
    env.deployment("moved", "old", &[("envFrom", "cfg")]).await;
    env.keys.set(current.clone());
    let stamp = env.stamp("moved", "Deployment", "old").await.unwrap();
    assert!(stamp.starts_with(&format!("v2:{}:", other.id())), "{stamp}");

    let report = explain(&env, &["-n", "moved", "deploy/old"]).await;
    assert_eq!(report.code, 1, "{report:?}");
    assert_eq!(verdict_line(&report), "foreign");
    let text = &report.text;
    assert!(
        text.contains(&format!(
            "(foreign: key {} is not this installation's)",
            other.id()
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "made with key {}, not with this installation's key {}",
            other.id(),
            current.id()
        )),
        "{text}"
    );
    assert!(text.contains("kubectl rollout restart"), "{text}");
}

#[tokio::test]
async fn not_selected_in_a_namespace_that_is_not_opted_in() {
    let Some(env) = stand_in(Setup::default()).await else {
        return;
    };
    env.namespace("plain", false).await;
    env.config_map("plain", "cfg", &[("k", "v")]).await;
    env.deployment("plain", "web", &[("envFrom", "cfg")]).await;

    let report = explain(&env, &["-n", "plain", "deploy/web"]).await;
    assert_eq!(report.code, 1, "{report:?}");
    assert_eq!(verdict_line(&report), "not-selected");
    let text = &report.text;
    assert!(
        text.contains("namespace plain: not opted in (no label confighash.dev/enabled)"),
        "{text}"
    );
    assert!(
        text.contains("MutatingWebhookConfiguration confighash does not select this workload"),
        "{text}"
    );
    assert!(
        text.contains("namespaceSelector does not select the namespace"),
        "{text}"
    );
    // The expected stamp is still computed.
    assert!(text.contains("expected stamp: v2:"), "{text}");
}

#[tokio::test]
async fn not_selected_without_the_webhook_configuration() {
    let Some(env) = stand_in(Setup::default()).await else {
        return;
    };
    env.namespace("shop", true).await;
    env.deployment("shop", "web", &[]).await;
    let report = explain(
        &env,
        &[
            "-n",
            "shop",
            "deploy/web",
            "--webhook-configuration",
            "renamed",
        ],
    )
    .await;
    assert_eq!(verdict_line(&report), "not-selected");
    assert!(
        report
            .text
            .contains("MutatingWebhookConfiguration renamed does not exist"),
        "{}",
        report.text
    );
}

#[tokio::test]
async fn opted_out_workloads_say_so() {
    let Some(env) = stand_in(Setup::default()).await else {
        return;
    };
    env.namespace("shop", true).await;
    env.config_map("shop", "cfg", &[("k", "v")]).await;
    env.workload(
        "shop",
        "StatefulSet",
        "db",
        &[("envFrom", "cfg")],
        json!({"confighash.dev/enabled": "false"}),
    )
    .await;
    let report = explain(&env, &["-n", "shop", "sts/db"]).await;
    assert_eq!(report.code, 1, "{report:?}");
    assert_eq!(verdict_line(&report), "opted-out");
    assert!(
        report
            .text
            .contains("workload: opted out (confighash.dev/enabled=false)"),
        "{}",
        report.text
    );
    assert!(
        report
            .text
            .contains("objectSelector does not select the workload"),
        "{}",
        report.text
    );
}

#[tokio::test]
async fn all_namespaces_lists_every_workload_of_the_opted_in_ones() {
    let Some(env) = stand_in(Setup::default()).await else {
        return;
    };
    env.namespace("shop", true).await;
    env.namespace("blog", true).await;
    env.namespace("plain", false).await;
    env.config_map("shop", "cfg", &[("k", "v")]).await;
    env.deployment("shop", "web", &[("envFrom", "cfg")]).await;
    env.workload(
        "shop",
        "CronJob",
        "backup",
        &[("envFrom", "cfg")],
        json!({}),
    )
    .await;
    env.workload("blog", "DaemonSet", "agent", &[], json!({}))
        .await;
    env.workload("blog", "Rollout", "front", &[], json!({}))
        .await;
    env.deployment("plain", "ignored", &[]).await;

    let report = explain(&env, &["-A"]).await;
    assert_eq!(report.code, 0, "{report:?}");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let lines: Vec<&str> = report.text.lines().collect();
    assert_eq!(lines.len(), 5, "{}", report.text);
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(header, ["NAMESPACE", "KIND", "NAME", "VERDICT", "STAMP"]);
    let rows: Vec<Vec<&str>> = lines[1..]
        .iter()
        .map(|l| l.split_whitespace().take(4).collect())
        .collect();
    assert_eq!(
        rows,
        [
            ["blog", "DaemonSet", "agent", "up-to-date"],
            ["blog", "Rollout", "front", "up-to-date"],
            ["shop", "Deployment", "web", "up-to-date"],
            ["shop", "CronJob", "backup", "up-to-date"],
        ]
    );

    // One workload that is not up to date makes the exit status 1.
    env.workload(
        "shop",
        "Deployment",
        "legacy",
        &[],
        json!({"confighash.dev/enabled": "false"}),
    )
    .await;
    let report = explain(&env, &["-A", "-o", "json"]).await;
    assert_eq!(report.code, 1, "{report:?}");
    let doc = json_of(&report);
    let legacy = doc["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == "legacy")
        .unwrap();
    assert_eq!(legacy["verdict"], "opted-out");
    assert_eq!(legacy["namespace"], "shop");
    assert_eq!(doc["errors"], json!([]));

    // -n NS without a workload lists that namespace, opted in or not.
    let report = explain(&env, &["-n", "plain"]).await;
    assert_eq!(report.code, 1, "{report:?}");
    assert!(
        report.text.lines().nth(1).unwrap().contains("not-selected"),
        "{}",
        report.text
    );
}

#[tokio::test]
async fn json_output_is_one_document_with_the_documented_fields() {
    let Some(env) = stand_in(Setup::default()).await else {
        return;
    };
    env.namespace("shop", true).await;
    env.config_map("shop", "cfg", &[("k", "v")]).await;
    env.secret("shop", "db", &[("password", "hunter2")]).await;
    env.deployment(
        "shop",
        "web",
        &[
            ("envFrom", "cfg"),
            ("secretKey", "db/password"),
            ("key", "cfg/missing"),
        ],
    )
    .await;
    let report = explain(&env, &["-n", "shop", "deploy/web", "-o", "json"]).await;
    assert_eq!(report.code, 0, "{report:?}");
    assert!(!report.text.contains("hunter2"));
    let doc = json_of(&report);
    let stamp = env.stamp("shop", "Deployment", "web").await.unwrap();
    assert_eq!(doc["kind"], "Deployment");
    assert_eq!(doc["namespace"], "shop");
    assert_eq!(doc["name"], "web");
    assert_eq!(doc["verdict"], "up-to-date");
    assert_eq!(doc["namespaceOptIn"]["optedIn"], true);
    assert_eq!(doc["webhook"]["configuration"], "confighash");
    assert_eq!(doc["webhook"]["selected"], true);
    assert_eq!(
        doc["webhook"]["entries"][0]["operations"],
        json!(["CREATE", "UPDATE"])
    );
    assert_eq!(doc["optedOut"], false);
    assert_eq!(doc["stamp"]["value"], stamp.as_str());
    assert_eq!(doc["stamp"]["class"], "current");
    assert_eq!(doc["stamp"]["recipe"], "v2");
    assert_eq!(doc["expectedStamp"], stamp.as_str());
    assert_eq!(doc["key"]["source"], "secret");
    assert_eq!(doc["key"]["state"], "read");
    let refs = doc["references"].as_array().unwrap();
    assert_eq!(refs.len(), 2);
    assert_eq!(refs[0]["kind"], "ConfigMap");
    assert_eq!(refs[0]["keys"], Value::Null, "envFrom wins over one key");
    assert_eq!(refs[0]["state"], "found");
    assert!(refs[0]["resourceVersion"].is_string());
    assert_eq!(refs[1]["kind"], "Secret");
    assert_eq!(refs[1]["keys"], json!(["password"]));
    assert_eq!(refs[1]["keyCount"], 1);
    assert_eq!(doc["events"]["state"], "found");
    assert!(doc["rollout"].is_object());
}

#[tokio::test]
async fn a_missing_workload_is_an_error() {
    let Some(env) = stand_in(Setup::default()).await else {
        return;
    };
    env.namespace("shop", true).await;
    let report = explain(&env, &["-n", "shop", "deploy/nope"]).await;
    assert_eq!(report.code, explain::EXIT_ERROR);
    assert_eq!(report.text, "");
    assert_eq!(report.errors, ["Deployment shop/nope does not exist"]);
}

/// A user who may read workloads, Namespaces, Events, the webhook configuration and the
/// ConfigMaps and Secrets of namespace `shop`, but nothing in confighash's namespace.
async fn viewer(env: &Env) -> kube::Client {
    let api = env.api();
    let rbac = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/base/rbac.yaml"
    ))
    .unwrap();
    let mut authorizer = confighash_testkit::apiserver::rbac::Authorizer::from_yaml(&rbac).unwrap();
    for obj in [
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "viewer"},
            "rules": [
                {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list"]},
                {"apiGroups": ["apps"], "resources": ["deployments", "statefulsets", "daemonsets"], "verbs": ["get", "list"]},
                {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["list"]},
                {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"], "verbs": ["get"]}
            ]
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "viewer"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "viewer"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "config-reader", "namespace": "shop"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["get"]}]
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "config-reader", "namespace": "shop"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "config-reader"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]
        }),
    ] {
        authorizer.insert(&obj).unwrap();
    }
    api.set_authorizer(Some(authorizer));
    api.add_token(
        "alice-token",
        confighash_testkit::apiserver::user::UserInfo {
            username: "alice".into(),
            groups: vec!["system:authenticated".into()],
        },
    );
    confighash::cluster::client::build(
        api.config_with_token("alice-token"),
        confighash::explain::READS,
    )
    .unwrap()
}

#[tokio::test]
async fn without_read_access_to_the_key_secret_the_comparison_says_what_it_needs() {
    let Some(env) = stand_in(Setup::default()).await else {
        return;
    };
    env.namespace("shop", true).await;
    env.config_map("shop", "cfg", &[("k", "v")]).await;
    env.deployment("shop", "web", &[("envFrom", "cfg")]).await;
    let alice = viewer(&env).await;

    let report = explain_with(alice.clone(), &["-n", "shop", "deploy/web"]).await;
    assert_eq!(report.code, explain::EXIT_ERROR, "{report:?}");
    assert_eq!(verdict_line(&report), "unknown");
    let text = &report.text;
    assert!(
        text.contains(
            "comparing the stamp needs read access (get) to the key Secret \
             confighash/confighash-key, or the key given with --key-file"
        ),
        "{text}"
    );
    assert!(
        text.contains("key: key Secret confighash/confighash-key: reading it is forbidden"),
        "{text}"
    );
    assert!(text.contains("expected stamp: not known"), "{text}");
    // What needs no key is still told.
    assert!(text.contains("namespace shop: opted in"), "{text}");
    assert!(
        text.contains("ConfigMap cfg: whole object, required: found"),
        "{text}"
    );

    // With the key in a file the same user gets the verdict.
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, KEY).unwrap();
    let report = explain_with(
        alice,
        &[
            "-n",
            "shop",
            "deploy/web",
            "--key-file",
            key_file.to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(report.code, 0, "{report:?}");
    assert_eq!(verdict_line(&report), "up-to-date");
}

/// A kubeconfig file for the stand-in's superuser, in namespace `namespace`.
fn kubeconfig(env: &Env, dir: &std::path::Path, namespace: &str) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
  - name: stand-in
    cluster:
      server: {url}
contexts:
  - name: stand-in
    context:
      cluster: stand-in
      user: admin
      namespace: {namespace}
current-context: stand-in
users:
  - name: admin
    user: {{}}
",
        url = env.api().url()
    );
    std::fs::write(&path, text).unwrap();
    path
}

async fn binary(args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_confighash"))
        .arg("explain")
        .args(args)
        .env_clear()
        .output()
        .await
        .expect("the binary runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_explains_with_a_kubeconfig_file() {
    let Some(env) = stand_in(Setup::default()).await else {
        return;
    };
    env.namespace("shop", true).await;
    env.config_map("shop", "cfg", &[("k", "v")]).await;
    env.deployment("shop", "web", &[("envFrom", "cfg")]).await;
    let dir = tempfile::tempdir().unwrap();
    let config = kubeconfig(&env, dir.path(), "shop");
    let config = config.to_str().unwrap();

    // The namespace comes from the context.
    let out = binary(&["--kubeconfig", config, "deploy/web"]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with("Deployment shop/web\n  verdict: up-to-date\n"),
        "{stdout}"
    );

    let out = binary(&["--kubeconfig", config, "-A"]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let row: Vec<&str> = stdout.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        row[..4],
        ["shop", "Deployment", "web", "up-to-date"],
        "{stdout}"
    );

    let out = binary(&["--kubeconfig", config, "-n", "shop", "deploy/gone"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(out.stdout, b"");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "error: Deployment shop/gone does not exist\n"
    );

    // Bad input gets a clear error and status 2.
    for (args, says) in [
        (
            vec!["--kubeconfig", config, "pod/web"],
            "is not a kind confighash stamps",
        ),
        (
            vec![
                "--kubeconfig",
                config,
                "-n",
                "Not_A_Namespace",
                "deploy/web",
            ],
            "is not a namespace name",
        ),
        (
            vec!["--kubeconfig", "/nonexistent/kubeconfig", "deploy/web"],
            "kubeconfig /nonexistent/kubeconfig",
        ),
        (
            vec!["--kubeconfig", config, "--context", "nope", "deploy/web"],
            "nope",
        ),
    ] {
        let out = binary(&args).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

#[tokio::test]
async fn explain_never_writes() {
    let Some(env) = stand_in(Setup {
        start_watcher: false,
        ..Setup::default()
    })
    .await
    else {
        return;
    };
    env.namespace("shop", true).await;
    env.config_map("shop", "cfg", &[("k", "v")]).await;
    env.deployment("shop", "web", &[("envFrom", "cfg")]).await;
    // A label-only change of the ConfigMap: nothing to roll.
    Api::<ConfigMap>::namespaced(env.client.clone(), "shop")
        .patch(
            "cfg",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    let version = env.api().resource_version();
    explain(&env, &["-n", "shop", "deploy/web"]).await;
    explain(&env, &["-A", "-o", "json"]).await;
    assert_eq!(
        env.api().resource_version(),
        version,
        "explain wrote something"
    );
}

//! Tests of the in-memory API server itself, through a real `kube::Client`: the evidence that it
//! behaves like kube-apiserver where confighash relies on it.

use crate::build;
use crate::wait;

use std::collections::BTreeMap;
use std::time::Duration;

use build::{config_map, create_namespace};
use confighash_testkit::apiserver::{ApiServer, TestWebhook};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Secret};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use wait::DEADLINE;

/// Deployment `name` (labelled `app: <name>`) without a namespace, as a typed object.
fn deployment(name: &str) -> Deployment {
    build::deployment(name)
        .without_namespace()
        .labels(json!({"app": name}))
        .typed()
}

fn api_code(err: kube::Error) -> u16 {
    match err {
        kube::Error::Api(s) => s.code,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn create_get_list_patch_delete() {
    let server = ApiServer::start().await;
    let client = server.client();
    create_namespace(&client, "shop", &[]).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "shop");

    let created = cms
        .create(&PostParams::default(), &config_map("web", &[("a", "1")]))
        .await
        .unwrap();
    assert!(created.uid().is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    let rv1: u64 = created.resource_version().unwrap().parse().unwrap();

    let err = cms
        .create(&PostParams::default(), &config_map("web", &[]))
        .await
        .unwrap_err();
    assert_eq!(api_code(err), 409, "a second create of one name conflicts");

    let got = cms.get("web").await.unwrap();
    assert_eq!(got.data.unwrap()["a"], "1");

    let patched = cms
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"b": "2"}})),
        )
        .await
        .unwrap();
    let rv2: u64 = patched.resource_version().unwrap().parse().unwrap();
    assert!(rv2 > rv1, "every write gets a higher resourceVersion");
    assert_eq!(patched.data.as_ref().unwrap().len(), 2);

    let list = cms.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);

    cms.delete("web", &DeleteParams::default()).await.unwrap();
    assert_eq!(api_code(cms.get("web").await.unwrap_err()), 404);
    assert_eq!(
        api_code(
            cms.delete("web", &DeleteParams::default())
                .await
                .unwrap_err()
        ),
        404
    );

    // Creating in a namespace that does not exist is NotFound.
    let elsewhere: Api<ConfigMap> = Api::namespaced(client, "nowhere");
    let err = elsewhere
        .create(&PostParams::default(), &config_map("x", &[]))
        .await
        .unwrap_err();
    assert_eq!(api_code(err), 404);
}

#[tokio::test]
async fn generate_name_and_invalid_names() {
    let server = ApiServer::start().await;
    let client = server.client();
    create_namespace(&client, "ns", &[]).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "ns");
    let mut cm = config_map("", &[]);
    cm.metadata.name = None;
    cm.metadata.generate_name = Some("cfg-".into());
    let a = cms.create(&PostParams::default(), &cm).await.unwrap();
    let b = cms.create(&PostParams::default(), &cm).await.unwrap();
    assert!(
        a.name_any().starts_with("cfg-") && a.name_any().len() == 9,
        "{}",
        a.name_any()
    );
    assert_ne!(a.name_any(), b.name_any());
    let err = cms
        .create(&PostParams::default(), &config_map("Not_Valid", &[]))
        .await
        .unwrap_err();
    assert_eq!(api_code(err), 422);
}

#[tokio::test]
async fn list_pages_with_limit_and_continue() {
    let server = ApiServer::start().await;
    let client = server.client();
    create_namespace(&client, "ns", &[]).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "ns");
    for i in 0..7 {
        cms.create(&PostParams::default(), &config_map(&format!("cm-{i}"), &[]))
            .await
            .unwrap();
    }
    let mut names = Vec::new();
    let mut params = ListParams::default().limit(3);
    let mut rvs = Vec::new();
    let mut pages = 0;
    loop {
        let page = cms.list(&params).await.unwrap();
        pages += 1;
        rvs.push(page.metadata.resource_version.clone().unwrap());
        names.extend(page.items.iter().map(|c| c.name_any()));
        if pages == 1 {
            // A write between pages does not show in later pages: they come from one snapshot.
            cms.create(&PostParams::default(), &config_map("cm-9", &[]))
                .await
                .unwrap();
        }
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => params = params.continue_token(&c),
            _ => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(names, (0..7).map(|i| format!("cm-{i}")).collect::<Vec<_>>());
    assert!(
        rvs.windows(2).all(|w| w[0] == w[1]),
        "all pages share one resourceVersion: {rvs:?}"
    );

    // A continue token from before a compaction is 410 Gone.
    let first = cms.list(&ListParams::default().limit(2)).await.unwrap();
    server.compact();
    let token = first.metadata.continue_.unwrap();
    let err = cms
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap_err();
    assert_eq!(api_code(err), 410);
}

#[tokio::test]
async fn label_and_field_selectors() {
    let server = ApiServer::start().await;
    let client = server.client();
    create_namespace(&client, "a", &[]).await;
    create_namespace(&client, "b", &[]).await;
    for ns in ["a", "b"] {
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        for (name, tier) in [("one", "web"), ("two", "db"), ("three", "web")] {
            let mut cm = config_map(name, &[]);
            cm.metadata.labels = Some(BTreeMap::from([("tier".to_string(), tier.to_string())]));
            cms.create(&PostParams::default(), &cm).await.unwrap();
        }
    }
    let all: Api<ConfigMap> = Api::all(client.clone());
    let names = |l: kube::api::ObjectList<ConfigMap>| -> Vec<String> {
        l.items
            .iter()
            .map(|c| format!("{}/{}", c.namespace().unwrap(), c.name_any()))
            .collect()
    };
    let web = all
        .list(&ListParams::default().labels("tier=web"))
        .await
        .unwrap();
    assert_eq!(names(web), ["a/one", "a/three", "b/one", "b/three"]);
    let not_web = all
        .list(&ListParams::default().labels("tier!=web"))
        .await
        .unwrap();
    assert_eq!(names(not_web), ["a/two", "b/two"]);
    let in_a = all
        .list(&ListParams::default().fields("metadata.namespace=a,metadata.name!=one"))
        .await
        .unwrap();
    assert_eq!(names(in_a), ["a/three", "a/two"]);
    let err = all
        .list(&ListParams::default().fields("data.x=1"))
        .await
        .unwrap_err();
    assert_eq!(api_code(err), 400, "unsupported field labels are refused");

    let secrets: Api<Secret> = Api::namespaced(client.clone(), "a");
    for (name, type_) in [("tls", "kubernetes.io/tls"), ("plain", "Opaque")] {
        let s: Secret = serde_json::from_value(json!({
            "metadata": {"name": name}, "type": type_, "stringData": {"k": "v"}
        }))
        .unwrap();
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }
    let opaque = secrets
        .list(&ListParams::default().fields("type!=kubernetes.io/tls"))
        .await
        .unwrap();
    assert_eq!(
        opaque
            .items
            .iter()
            .map(|s| s.name_any())
            .collect::<Vec<_>>(),
        ["plain"]
    );
    // stringData was folded into data.
    let plain = secrets.get("plain").await.unwrap();
    assert_eq!(plain.data.unwrap()["k"].0, b"v");
    assert!(plain.string_data.is_none());
}

#[tokio::test]
async fn update_conflicts_on_a_stale_resource_version() {
    let server = ApiServer::start().await;
    let client = server.client();
    create_namespace(&client, "ns", &[]).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "ns");
    let first = cms
        .create(&PostParams::default(), &config_map("c", &[("k", "1")]))
        .await
        .unwrap();
    let mut second = first.clone();
    second.data = Some(BTreeMap::from([("k".into(), "2".into())]));
    cms.replace("c", &PostParams::default(), &second)
        .await
        .unwrap();
    let mut stale = first.clone();
    stale.data = Some(BTreeMap::from([("k".into(), "3".into())]));
    let err = cms
        .replace("c", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert_eq!(api_code(err), 409);
    assert_eq!(cms.get("c").await.unwrap().data.unwrap()["k"], "2");
    // Without a resourceVersion the update is unconditional.
    stale.metadata.resource_version = None;
    cms.replace("c", &PostParams::default(), &stale)
        .await
        .unwrap();
    assert_eq!(cms.get("c").await.unwrap().data.unwrap()["k"], "3");
}

#[tokio::test]
async fn every_patch_type() {
    let server = ApiServer::start().await;
    let client = server.client();
    create_namespace(&client, "ns", &[]).await;
    let deploys: Api<Deployment> = Api::namespaced(client, "ns");
    deploys
        .create(&PostParams::default(), &deployment("web"))
        .await
        .unwrap();

    let merged = deploys
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "spec": {"template": {"metadata": {"annotations": {"a": "1"}}}}
            })),
        )
        .await
        .unwrap();
    assert_eq!(
        merged
            .spec
            .as_ref()
            .unwrap()
            .template
            .metadata
            .as_ref()
            .unwrap()
            .annotations
            .as_ref()
            .unwrap()["a"],
        "1"
    );

    let json_patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "add", "path": "/spec/template/metadata/annotations/confighash.dev~1checksum", "value": "x"}
    ]))
    .unwrap();
    let patched = deploys
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Json::<()>(json_patch),
        )
        .await
        .unwrap();
    let annotations = patched
        .spec
        .unwrap()
        .template
        .metadata
        .unwrap()
        .annotations
        .unwrap();
    assert_eq!(annotations["confighash.dev/checksum"], "x");
    assert_eq!(annotations["a"], "1");

    // Strategic merge merges containers by name instead of replacing the list.
    let strategic = deploys
        .patch("web", &PatchParams::default(), &Patch::Strategic(json!({
            "spec": {"template": {"spec": {"containers": [{"name": "app", "env": [{"name": "X", "value": "1"}]}]}}}
        })))
        .await
        .unwrap();
    let containers = strategic.spec.unwrap().template.spec.unwrap().containers;
    assert_eq!(containers.len(), 1);
    assert_eq!(containers[0].image.as_deref(), Some("example/app:1"));
    assert_eq!(containers[0].env.as_ref().unwrap()[0].name, "X");

    // Server-side apply creates, then updates.
    let applied = deploys
        .patch(
            "api",
            &PatchParams::apply("confighash"),
            &Patch::Apply(deployment("api")),
        )
        .await
        .unwrap();
    assert_eq!(applied.metadata.generation, Some(1));
    let mut changed = deployment("api");
    changed.spec.as_mut().unwrap().replicas = Some(3);
    let applied = deploys
        .patch(
            "api",
            &PatchParams::apply("confighash"),
            &Patch::Apply(changed),
        )
        .await
        .unwrap();
    assert_eq!(applied.spec.unwrap().replicas, Some(3));
    assert_eq!(
        applied.metadata.generation,
        Some(2),
        "a spec change bumps generation"
    );

    // A broken JSON patch is refused and stores nothing.
    let rv = server.resource_version();
    let bad: json_patch::Patch =
        serde_json::from_value(json!([{"op": "remove", "path": "/spec/nothing/here"}])).unwrap();
    let err = deploys
        .patch("web", &PatchParams::default(), &Patch::Json::<()>(bad))
        .await
        .unwrap_err();
    assert_eq!(api_code(err), 422);
    assert_eq!(server.resource_version(), rv);
}

#[tokio::test]
async fn identical_writes_store_nothing() {
    let server = ApiServer::start().await;
    let client = server.client();
    create_namespace(&client, "ns", &[]).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "ns");
    let cm = cms
        .create(&PostParams::default(), &config_map("c", &[("k", "1")]))
        .await
        .unwrap();
    let rv = server.resource_version();
    let same = cms
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "1"}})),
        )
        .await
        .unwrap();
    assert_eq!(same.resource_version(), cm.resource_version());
    cms.replace("c", &PostParams::default(), &cm).await.unwrap();
    assert_eq!(server.resource_version(), rv, "no resourceVersion was used");
}

#[tokio::test]
async fn rollouts_count_template_transitions() {
    let server = ApiServer::start().await;
    let client = server.client();
    create_namespace(&client, "ns", &[]).await;
    let deploys: Api<Deployment> = Api::namespaced(client, "ns");
    deploys
        .create(&PostParams::default(), &deployment("web"))
        .await
        .unwrap();
    assert_eq!(server.rollouts("ns", "Deployment", "web"), 0);
    let set = |v: &str| {
        Patch::Merge(json!({"spec": {"template": {"metadata": {"annotations": {"v": v}}}}}))
    };
    for v in ["a", "b", "a"] {
        deploys
            .patch("web", &PatchParams::default(), &set(v))
            .await
            .unwrap();
    }
    // Replicas are not the template.
    deploys
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 4}})),
        )
        .await
        .unwrap();
    // A CronJob's rollouts are its job template's transitions.
    let cronjobs: Api<k8s_openapi::api::batch::v1::CronJob> =
        Api::namespaced(server.client(), "ns");
    let cj = serde_json::from_value(json!({
        "metadata": {"name": "nightly"},
        "spec": {"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": {"spec": {
            "restartPolicy": "OnFailure", "containers": [{"name": "c", "image": "busybox"}]
        }}}}}
    }))
    .unwrap();
    cronjobs.create(&PostParams::default(), &cj).await.unwrap();
    cronjobs
        .patch(
            "nightly",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"schedule": "0 4 * * *"}})),
        )
        .await
        .unwrap();
    assert_eq!(
        server.rollouts("ns", "CronJob", "nightly"),
        0,
        "the schedule is not the template"
    );
    cronjobs
        .patch("nightly", &PatchParams::default(), &Patch::Merge(json!({
            "spec": {"jobTemplate": {"spec": {"template": {"metadata": {"annotations": {"v": "1"}}}}}}
        })))
        .await
        .unwrap();
    assert_eq!(server.rollouts("ns", "CronJob", "nightly"), 1);
    assert_eq!(
        server.rollouts("ns", "Deployment", "web"),
        3,
        "A->B->A counts each transition"
    );
}

#[tokio::test]
async fn watch_resumes_after_a_dropped_stream_and_reports_410() {
    let server = ApiServer::start().await;
    let client = server.client();
    create_namespace(&client, "ns", &[]).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "ns");
    let start = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();

    let mut stream = cms
        .watch(&WatchParams::default(), &start)
        .await
        .unwrap()
        .boxed();
    cms.create(&PostParams::default(), &config_map("a", &[]))
        .await
        .unwrap();
    let last = match tokio::time::timeout(DEADLINE, stream.try_next())
        .await
        .unwrap()
        .unwrap()
    {
        Some(WatchEvent::Added(cm)) => {
            assert_eq!(cm.name_any(), "a");
            cm.resource_version().unwrap()
        }
        other => panic!("expected ADDED, got {other:?}"),
    };

    server.close_watches();
    let end = tokio::time::timeout(DEADLINE, stream.try_next())
        .await
        .unwrap();
    assert!(
        matches!(end, Ok(None)),
        "the stream ends when dropped: {end:?}"
    );

    // Written while nobody watched: a resumed watch replays it.
    cms.create(&PostParams::default(), &config_map("b", &[]))
        .await
        .unwrap();
    cms.delete("a", &DeleteParams::default()).await.unwrap();
    let mut resumed = cms
        .watch(&WatchParams::default(), &last)
        .await
        .unwrap()
        .boxed();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match tokio::time::timeout(DEADLINE, resumed.try_next())
            .await
            .unwrap()
            .unwrap()
        {
            Some(WatchEvent::Added(cm)) => seen.push(format!("ADDED {}", cm.name_any())),
            Some(WatchEvent::Deleted(cm)) => seen.push(format!("DELETED {}", cm.name_any())),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, ["ADDED b", "DELETED a"]);

    server.compact();
    let mut old = cms
        .watch(&WatchParams::default(), &last)
        .await
        .unwrap()
        .boxed();
    match tokio::time::timeout(DEADLINE, old.try_next())
        .await
        .unwrap()
        .unwrap()
    {
        Some(WatchEvent::Error(e)) => assert_eq!(e.code, 410),
        other => panic!("expected a 410 error event, got {other:?}"),
    }
}

#[tokio::test]
async fn watch_sends_bookmarks_and_selector_transitions() {
    let server = ApiServer::start().await;
    let client = server.client();
    create_namespace(&client, "ns", &[]).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "ns");
    let mut cm = config_map("c", &[]);
    cm.metadata.labels = Some(BTreeMap::from([("watched".into(), "yes".into())]));
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let rv = server.resource_version().to_string();
    let params = WatchParams::default().labels("watched=yes");
    let mut stream = cms.watch(&params, &rv).await.unwrap().boxed();
    // Leaving the selection reads as DELETED to this watch.
    cms.patch(
        "c",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"watched": "no"}}})),
    )
    .await
    .unwrap();
    let mut deleted = false;
    let mut bookmark = false;
    while !(deleted && bookmark) {
        match tokio::time::timeout(DEADLINE, stream.try_next())
            .await
            .unwrap()
            .unwrap()
        {
            Some(WatchEvent::Deleted(c)) => deleted = c.name_any() == "c",
            Some(WatchEvent::Bookmark(b)) => {
                let brv: u64 = b.metadata.resource_version.parse().unwrap();
                bookmark = deleted && brv >= server.resource_version();
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn runtime_watcher_survives_drops_and_compaction() {
    let server = ApiServer::start().await;
    let client = server.client();
    create_namespace(&client, "ns", &[]).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "ns");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let task = {
        let seen = seen.clone();
        let stream = watcher(cms.clone(), watcher::Config::default())
            .default_backoff()
            .applied_objects();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(Ok(cm)) = stream.next().await {
                seen.lock().unwrap().insert(cm.name_any());
            }
        })
    };
    let has = |name: &'static str| {
        let seen = seen.clone();
        move || {
            let ok = seen.lock().unwrap().contains(name);
            async move { ok }
        }
    };
    cms.create(&PostParams::default(), &config_map("first", &[]))
        .await
        .unwrap();
    wait::eventually("first", has("first")).await;
    server.close_watches();
    cms.create(&PostParams::default(), &config_map("second", &[]))
        .await
        .unwrap();
    wait::eventually("second after a dropped watch", has("second")).await;
    server.compact();
    server.close_watches();
    cms.create(&PostParams::default(), &config_map("third", &[]))
        .await
        .unwrap();
    wait::eventually("third after 410", has("third")).await;
    task.abort();
}

#[tokio::test]
async fn the_event_recorder_publishes_events() {
    let server = ApiServer::start().await;
    let client = server.client();
    create_namespace(&client, "ns", &[]).await;
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), "ns");
    let d = deploys
        .create(&PostParams::default(), &deployment("web"))
        .await
        .unwrap();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "confighash".into(),
            instance: None,
        },
    );
    let reference = ObjectReference {
        api_version: Some("apps/v1".into()),
        kind: Some("Deployment".into()),
        name: d.metadata.name.clone(),
        namespace: d.metadata.namespace.clone(),
        uid: d.metadata.uid.clone(),
        ..Default::default()
    };
    let event = Event {
        type_: EventType::Normal,
        reason: "ConfigChanged".into(),
        note: Some("ConfigMap web changed".into()),
        action: "Rolling".into(),
        secondary: None,
    };
    recorder.publish(&event, &reference).await.unwrap();
    recorder.publish(&event, &reference).await.unwrap();
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client, "ns");
    let list = events.list(&ListParams::default()).await.unwrap();
    assert_eq!(
        list.items.len(),
        1,
        "a repeated event is one object with a count"
    );
    let e = &list.items[0];
    assert_eq!(e.reason.as_deref(), Some("ConfigChanged"));
    assert_eq!(e.regarding.as_ref().unwrap().name.as_deref(), Some("web"));
}

#[tokio::test]
async fn injected_faults_and_delays() {
    let server = ApiServer::start().await;
    let client = server.client();
    create_namespace(&client, "ns", &[]).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "ns");
    cms.create(&PostParams::default(), &config_map("c", &[]))
        .await
        .unwrap();
    server.fail_next(Some("get"), Some("configmaps"), 2, 500);
    assert_eq!(api_code(cms.get("c").await.unwrap_err()), 500);
    assert_eq!(api_code(cms.get("c").await.unwrap_err()), 500);
    cms.get("c").await.expect("the fault is used up");
    // A 429 carries Retry-After, so kube's default retry policy sends the list again.
    let lists = |s: &ApiServer| s.requests().iter().filter(|(v, _)| v == "list").count();
    let before = lists(&server);
    server.fail_next(None, Some("configmaps"), 1, 429);
    cms.list(&ListParams::default()).await.unwrap();
    assert_eq!(lists(&server), before + 2, "one refused list, one retried");
    // Without retries the 429 reaches the caller.
    let mut config = server.config();
    config.default_retry = false;
    let plain: Api<ConfigMap> = Api::namespaced(Client::try_from(config).unwrap(), "ns");
    server.fail_next(None, Some("configmaps"), 1, 429);
    assert_eq!(
        api_code(plain.list(&ListParams::default()).await.unwrap_err()),
        429
    );
    // Faults on other resources leave this one alone.
    server.fail_next(Some("get"), Some("secrets"), 1, 500);
    cms.get("c").await.unwrap();

    server.set_delay(Duration::from_millis(300));
    let started = std::time::Instant::now();
    cms.get("c").await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
    server.set_delay(Duration::ZERO);
}

#[tokio::test]
async fn rollouts_can_be_unserved() {
    let server = ApiServer::start().await;
    let client = server.client();
    let discovery = kube::Discovery::new(client.clone()).run().await.unwrap();
    assert!(discovery.has_group("argoproj.io"));
    assert!(discovery.has_group("apps"));
    server.set_rollouts_served(false);
    let discovery = kube::Discovery::new(client.clone()).run().await.unwrap();
    assert!(!discovery.has_group("argoproj.io"));
    let req = http::Request::get("/apis/argoproj.io/v1alpha1/rollouts")
        .body(Vec::new())
        .unwrap();
    let err = client.request::<serde_json::Value>(req).await.unwrap_err();
    assert_eq!(api_code(err), 404);
}

async fn register(client: &Client, configuration: serde_json::Value) {
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let name = configuration["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let obj: MutatingWebhookConfiguration = serde_json::from_value(configuration).unwrap();
    match api.get_opt(&name).await.unwrap() {
        Some(old) => {
            let mut obj = obj;
            obj.metadata.resource_version = old.metadata.resource_version;
            api.replace(&name, &PostParams::default(), &obj)
                .await
                .unwrap();
        }
        None => {
            api.create(&PostParams::default(), &obj).await.unwrap();
        }
    }
}

fn template_annotation(d: &Deployment, key: &str) -> Option<String> {
    d.spec
        .as_ref()?
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(key)
        .cloned()
}

#[tokio::test]
async fn a_registered_webhook_mutates_and_its_change_counts_as_a_rollout() {
    let server = ApiServer::start().await;
    let client = server.client();
    create_namespace(&client, "on", &[("confighash.dev/enabled", "true")]).await;
    create_namespace(&client, "off", &[]).await;
    let hook = TestWebhook::annotating("confighash.dev/checksum", "stamped").await;
    register(&client, hook.configuration("confighash", "Fail")).await;

    let on: Api<Deployment> = Api::namespaced(client.clone(), "on");
    let created = on
        .create(&PostParams::default(), &deployment("web"))
        .await
        .unwrap();
    assert_eq!(
        template_annotation(&created, "confighash.dev/checksum").as_deref(),
        Some("stamped")
    );
    assert_eq!(hook.calls(), 1);
    assert_eq!(
        server.rollouts("on", "Deployment", "web"),
        0,
        "a create is not a rollout"
    );

    // A user's template change goes through the webhook again: one rollout.
    on.patch("web", &PatchParams::default(), &Patch::Merge(json!({
        "spec": {"template": {"spec": {"containers": [{"name": "app", "image": "example/app:2"}]}}}
    })))
    .await
    .unwrap();
    assert_eq!(hook.calls(), 2);
    assert_eq!(server.rollouts("on", "Deployment", "web"), 1);

    // A patch that changes nothing is still admitted, and stores nothing.
    let rv = server.resource_version();
    on.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "web"}}})),
    )
    .await
    .unwrap();
    assert_eq!(hook.calls(), 3, "admission runs on a no-op patch");
    assert_eq!(
        server.resource_version(),
        rv,
        "an identical write is skipped"
    );

    // A namespace outside the namespaceSelector is never sent to the webhook.
    let off: Api<Deployment> = Api::namespaced(client.clone(), "off");
    let plain = off
        .create(&PostParams::default(), &deployment("web"))
        .await
        .unwrap();
    assert_eq!(template_annotation(&plain, "confighash.dev/checksum"), None);
    assert_eq!(hook.calls(), 3);

    // Dry runs are admitted and not stored.
    let dry = on
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &deployment("dry"),
        )
        .await
        .unwrap();
    assert_eq!(
        template_annotation(&dry, "confighash.dev/checksum").as_deref(),
        Some("stamped")
    );
    assert_eq!(api_code(on.get("dry").await.unwrap_err()), 404);

    assert!(
        server
            .webhook_calls()
            .iter()
            .all(|c| c.webhook == "stamp.confighash.dev")
    );
}

#[tokio::test]
async fn an_unreachable_webhook_follows_its_failure_policy() {
    let server = ApiServer::start().await;
    let client = server.client();
    create_namespace(&client, "on", &[("confighash.dev/enabled", "true")]).await;
    let hook = TestWebhook::annotating("confighash.dev/checksum", "stamped").await;
    let unreachable = |policy: &str| {
        let mut c = hook.configuration("confighash", policy);
        // A port nothing listens on: connection refused.
        c["webhooks"][0]["clientConfig"]["url"] = json!("https://127.0.0.1:9/mutate");
        c
    };
    let on: Api<Deployment> = Api::namespaced(client.clone(), "on");

    register(&client, unreachable("Ignore")).await;
    let created = on
        .create(&PostParams::default(), &deployment("ignored"))
        .await
        .unwrap();
    assert_eq!(
        template_annotation(&created, "confighash.dev/checksum"),
        None
    );

    register(&client, unreachable("Fail")).await;
    let err = on
        .create(&PostParams::default(), &deployment("failed"))
        .await
        .unwrap_err();
    assert_eq!(api_code(err), 500);
    assert_eq!(api_code(on.get("failed").await.unwrap_err()), 404);
}

#[tokio::test]
async fn rbac_denies_what_the_roles_do_not_allow() {
    let server = ApiServer::start().await;
    let admin = server.client();
    create_namespace(&admin, "a", &[]).await;
    create_namespace(&admin, "b", &[]).await;
    for ns in ["a", "b"] {
        Api::<ConfigMap>::namespaced(admin.clone(), ns)
            .create(&PostParams::default(), &config_map("c", &[]))
            .await
            .unwrap();
    }
    let roles = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: reader, namespace: a}
rules:
  - apiGroups: [""]
    resources: [configmaps]
    verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: reader, namespace: a}
subjects: [{kind: ServiceAccount, name: app, namespace: a}]
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: reader}
"#;
    server.set_authorizer(Some(
        confighash_testkit::apiserver::rbac::Authorizer::from_yaml(roles).unwrap(),
    ));
    server.add_token(
        "app-token",
        confighash_testkit::apiserver::user::UserInfo::service_account("a", "app"),
    );
    let app = Client::try_from(server.config_with_token("app-token")).unwrap();

    let in_a: Api<ConfigMap> = Api::namespaced(app.clone(), "a");
    in_a.get("c").await.expect("the Role allows get in a");
    assert_eq!(
        api_code(in_a.list(&ListParams::default()).await.unwrap_err()),
        403
    );
    assert_eq!(
        api_code(
            in_a.delete("c", &DeleteParams::default())
                .await
                .unwrap_err()
        ),
        403
    );
    let in_b: Api<ConfigMap> = Api::namespaced(app.clone(), "b");
    let err = in_b.get("c").await.unwrap_err();
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 403);
            assert!(
                s.message.contains("cannot get resource \"configmaps\""),
                "{}",
                s.message
            );
        }
        other => panic!("{other:?}"),
    }
    // Discovery is open to every authenticated user; an unknown token is not authenticated.
    kube::Discovery::new(app)
        .run()
        .await
        .expect("discovery is allowed");
    let stranger = Client::try_from(server.config_with_token("nobody")).unwrap();
    let err = Api::<ConfigMap>::namespaced(stranger, "a")
        .get("c")
        .await
        .unwrap_err();
    assert_eq!(api_code(err), 401);
    // The superuser is not restricted.
    Api::<ConfigMap>::namespaced(admin, "b")
        .get("c")
        .await
        .unwrap();
}

// ----- what kube-apiserver does that a forgiving stand-in would not -----

fn api_status(err: kube::Error) -> kube::core::Status {
    match err {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// The managedFields entry of `manager` with `operation`, if any.
fn managed_entry(
    obj: &serde_json::Value,
    manager: &str,
    operation: &str,
) -> Option<serde_json::Value> {
    obj.pointer("/metadata/managedFields")?
        .as_array()?
        .iter()
        .find(|e| e["manager"] == manager && e["operation"] == operation)
        .cloned()
}

/// Whether `t` is an RFC 3339 time in whole seconds, UTC: `2024-05-01T12:34:56Z`.
fn is_rfc3339_seconds(t: &str) -> bool {
    let b = t.as_bytes();
    b.len() == 20
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            10 => *c == b'T',
            13 | 16 => *c == b':',
            19 => *c == b'Z',
            _ => c.is_ascii_digit(),
        })
}

#[tokio::test]
async fn a_write_that_a_webhook_turns_back_is_stored_for_its_managed_fields() {
    let server = ApiServer::start().await;
    let client = server.client();
    create_namespace(&client, "on", &[("confighash.dev/enabled", "true")]).await;
    let hook = TestWebhook::annotating("confighash.dev/checksum", "stamped").await;
    register(&client, hook.configuration("confighash", "Fail")).await;
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), "on");
    deploys
        .create(&PostParams::default(), &deployment("web"))
        .await
        .unwrap();
    let rv = server.resource_version();
    let mut events = deploys
        .watch(&WatchParams::default(), &rv.to_string())
        .await
        .unwrap()
        .boxed();

    // The request changes the stamp; the webhook turns it back. The object is the same but for
    // managedFields, which the field manager updated before admission: it is stored.
    let touch = |manager: &str| {
        (
            PatchParams {
                field_manager: Some(manager.to_owned()),
                ..Default::default()
            },
            Patch::Merge(json!({"spec": {"template": {"metadata": {"annotations": {
                "confighash.dev/checksum": "other"
            }}}}})),
        )
    };
    let (params, patch) = touch("tester");
    let touched = deploys.patch("web", &params, &patch).await.unwrap();
    assert_eq!(
        template_annotation(&touched, "confighash.dev/checksum").as_deref(),
        Some("stamped"),
        "the webhook turned the change back"
    );
    assert!(server.resource_version() > rv, "the write was stored");
    assert_eq!(
        server.rollouts("on", "Deployment", "web"),
        0,
        "the template did not change"
    );
    let stored = serde_json::to_value(&touched).unwrap();
    let entry = managed_entry(&stored, "tester", "Update").expect("an entry for the manager");
    assert_eq!(entry["apiVersion"], "apps/v1");
    assert_eq!(entry["fieldsType"], "FieldsV1");
    assert!(
        is_rfc3339_seconds(entry["time"].as_str().unwrap()),
        "{entry}"
    );
    assert_eq!(
        entry["fieldsV1"],
        json!({"f:spec": {"f:template": {"f:metadata": {"f:annotations": {
            "f:confighash.dev/checksum": {}
        }}}}})
    );
    match tokio::time::timeout(DEADLINE, events.try_next())
        .await
        .unwrap()
        .unwrap()
    {
        Some(WatchEvent::Modified(d)) => {
            assert_eq!(d.resource_version(), touched.resource_version());
        }
        other => panic!("expected MODIFIED, got {other:?}"),
    }

    // The same manager changing the same field again changes no field set, only a timestamp:
    // as kube-apiserver's IgnoreManagedFieldsTimestampsTransformer does, nothing is written.
    // A second later, so the manager's new time also moves its entry (entries are ordered by time).
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let rv = server.resource_version();
    let (params, patch) = touch("tester");
    deploys.patch("web", &params, &patch).await.unwrap();
    assert_eq!(
        server.resource_version(),
        rv,
        "only a timestamp would change"
    );

    // A request that changes nothing before admission writes nothing either.
    let unchanged = Patch::Merge(json!({"spec": {"template": {"metadata": {"annotations": {
        "confighash.dev/checksum": "stamped"
    }}}}}));
    deploys.patch("web", &params, &unchanged).await.unwrap();
    assert_eq!(server.resource_version(), rv);

    // Another manager taking the field over is a change of managedFields: stored again.
    let (params, patch) = touch("another");
    let taken = deploys.patch("web", &params, &patch).await.unwrap();
    assert!(server.resource_version() > rv);
    let taken = serde_json::to_value(&taken).unwrap();
    assert!(managed_entry(&taken, "another", "Update").is_some());
    assert!(
        managed_entry(&taken, "tester", "Update").is_none(),
        "an entry left with no field is dropped: {}",
        taken["metadata"]["managedFields"]
    );
    assert_eq!(hook.calls(), 5, "every write went through admission");
}

#[tokio::test]
async fn the_field_manager_is_named_by_the_request_or_its_user_agent() {
    let server = ApiServer::start().await;
    let plain = server.client();
    create_namespace(&plain, "ns", &[]).await;
    let mut config = server.config();
    config.headers.push((
        http::header::USER_AGENT,
        "kubectl/v1.33.0 (linux/amd64) kubernetes/abcdef0"
            .parse()
            .unwrap(),
    ));
    let kubectl: Api<ConfigMap> = Api::namespaced(Client::try_from(config).unwrap(), "ns");
    let cms: Api<ConfigMap> = Api::namespaced(plain, "ns");

    // A create is an Update operation of the User-Agent's first segment.
    let created = kubectl
        .create(
            &PostParams::default(),
            &config_map("by-kubectl", &[("k", "1")]),
        )
        .await
        .unwrap();
    let created = serde_json::to_value(&created).unwrap();
    let entry = managed_entry(&created, "kubectl", "Update").expect("kubectl's entry");
    assert_eq!(entry["fieldsV1"], json!({"f:data": {"f:k": {}}}));

    // Without a User-Agent or a fieldManager: "unknown".
    let anonymous = cms
        .create(
            &PostParams::default(),
            &config_map("anonymous", &[("k", "1")]),
        )
        .await
        .unwrap();
    let anonymous = serde_json::to_value(&anonymous).unwrap();
    assert!(
        managed_entry(&anonymous, "unknown", "Update").is_some(),
        "{anonymous}"
    );

    // fieldManager wins over the User-Agent; the manager owns what it changed.
    let params = PatchParams {
        field_manager: Some("editor".into()),
        ..Default::default()
    };
    let patched = kubectl
        .patch(
            "by-kubectl",
            &params,
            &Patch::Merge(json!({"data": {"k": "2", "extra": "x"}})),
        )
        .await
        .unwrap();
    let patched = serde_json::to_value(&patched).unwrap();
    assert_eq!(
        managed_entry(&patched, "editor", "Update").unwrap()["fieldsV1"],
        json!({"f:data": {"f:extra": {}, "f:k": {}}})
    );
    assert!(
        managed_entry(&patched, "kubectl", "Update").is_none(),
        "kubectl's only field was taken over"
    );

    // Server-side apply records an Apply operation with the applied fields.
    let applied = cms
        .patch(
            "applied",
            &PatchParams::apply("applier"),
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "applied"}, "data": {"a": "1"}
            })),
        )
        .await
        .unwrap();
    let applied = serde_json::to_value(&applied).unwrap();
    assert_eq!(
        managed_entry(&applied, "applier", "Apply").unwrap()["fieldsV1"],
        json!({"f:data": {"f:a": {}}})
    );
}

#[tokio::test]
async fn every_namespace_is_labelled_with_its_name() {
    let server = ApiServer::start().await;
    let client = server.client();
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    create_namespace(&client, "team-a", &[("tier", "web")]).await;
    let label = |ns: &k8s_openapi::api::core::v1::Namespace| {
        ns.labels().get("kubernetes.io/metadata.name").cloned()
    };
    let created = namespaces.get("team-a").await.unwrap();
    assert_eq!(label(&created).as_deref(), Some("team-a"));
    assert_eq!(created.labels()["tier"], "web");
    assert_eq!(
        created.spec.as_ref().unwrap().finalizers.as_deref(),
        Some(&["kubernetes".to_owned()][..])
    );
    // Removing or changing it does not stick: defaulting sets it again.
    let patched = namespaces
        .patch(
            "team-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"kubernetes.io/metadata.name": null}}})),
        )
        .await
        .unwrap();
    assert_eq!(label(&patched).as_deref(), Some("team-a"));
    let mut replaced = patched.clone();
    replaced.metadata.labels = Some(BTreeMap::from([(
        "kubernetes.io/metadata.name".into(),
        "other".into(),
    )]));
    let replaced = namespaces
        .replace("team-a", &PostParams::default(), &replaced)
        .await
        .unwrap();
    assert_eq!(label(&replaced).as_deref(), Some("team-a"));
    assert_eq!(
        replaced.labels().get("tier"),
        None,
        "the rest of the PUT applies"
    );
}

#[tokio::test]
async fn deleting_a_namespace_terminates_it_then_deletes_its_content_and_it_last() {
    let server = ApiServer::start_with(confighash_testkit::apiserver::Options {
        namespace_termination: Duration::from_secs(2),
        ..Default::default()
    })
    .await;
    let client = server.client();
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    create_namespace(&client, "doomed", &[("team", "a")]).await;
    create_namespace(&client, "kept", &[]).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "doomed");
    for name in ["one", "two", "three"] {
        cms.create(&PostParams::default(), &config_map(name, &[]))
            .await
            .unwrap();
    }
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), "doomed");
    deploys
        .create(&PostParams::default(), &deployment("web"))
        .await
        .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), "kept")
        .create(&PostParams::default(), &config_map("safe", &[]))
        .await
        .unwrap();

    // Every write from here on, in resourceVersion order, as "TYPE kind name".
    let rv = server.resource_version().to_string();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(
        u64,
        String,
        std::time::Instant,
    )>::new()));
    let mut watches = Vec::new();
    macro_rules! record {
        ($api:expr, $kind:literal) => {{
            let mut stream = $api
                .watch(&WatchParams::default(), &rv)
                .await
                .unwrap()
                .boxed();
            let seen = seen.clone();
            watches.push(tokio::spawn(async move {
                while let Ok(Some(event)) = stream.try_next().await {
                    let (what, obj) = match event {
                        WatchEvent::Added(o) => ("ADDED", o),
                        WatchEvent::Modified(o) => ("MODIFIED", o),
                        WatchEvent::Deleted(o) => ("DELETED", o),
                        _ => continue,
                    };
                    let rv: u64 = obj.resource_version().unwrap().parse().unwrap();
                    let event = format!("{what} {} {}", $kind, obj.name_any());
                    seen.lock()
                        .unwrap()
                        .push((rv, event, std::time::Instant::now()));
                }
            }));
        }};
    }
    record!(namespaces, "Namespace");
    record!(Api::<ConfigMap>::all(client.clone()), "ConfigMap");
    record!(Api::<Deployment>::all(client.clone()), "Deployment");

    let deleted_at = std::time::Instant::now();
    let answer = namespaces
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .expect("the Namespace, not a Status");
    assert!(answer.metadata.deletion_timestamp.is_some());
    assert_eq!(
        answer.status.as_ref().unwrap().phase.as_deref(),
        Some("Terminating")
    );
    assert_eq!(answer.labels()["team"], "a", "labels are kept");

    // Terminating, not gone: no new content, but what is there can still be read and written.
    let err = api_status(
        cms.create(&PostParams::default(), &config_map("late", &[]))
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        err.message,
        "configmaps \"late\" is forbidden: unable to create new content in namespace doomed \
         because it is being terminated"
    );
    assert_eq!(
        err.details.unwrap().causes[0].reason,
        "NamespaceTerminating"
    );
    deploys
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .expect("updates are allowed while terminating");
    assert_eq!(
        namespaces
            .delete("doomed", &DeleteParams::default())
            .await
            .unwrap()
            .left()
            .unwrap()
            .metadata
            .deletion_timestamp,
        answer.metadata.deletion_timestamp,
        "a second DELETE changes nothing"
    );
    assert!(
        cms.list(&ListParams::default()).await.unwrap().items.len() > 1,
        "the content is not deleted at once"
    );

    wait::eventually("the namespace to be deleted", || {
        let namespaces = namespaces.clone();
        async move { namespaces.get_opt("doomed").await.unwrap().is_none() }
    })
    .await;
    let expected = 1 + 4 + 1 + 1 + 1; // terminating, content, conditions, the patch, deleted
    wait::eventually("every event", || {
        let n = seen.lock().unwrap().len();
        async move { n >= expected }
    })
    .await;
    for w in watches {
        w.abort();
    }
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    let order: Vec<&str> = seen.iter().map(|(_, e, _)| e.as_str()).collect();
    assert_eq!(order[0], "MODIFIED Namespace doomed", "{order:#?}");
    assert_eq!(order[1], "MODIFIED Deployment web", "{order:#?}");
    let mut content: Vec<&str> = order[2..6].to_vec();
    content.sort();
    assert_eq!(
        content,
        [
            "DELETED ConfigMap one",
            "DELETED ConfigMap three",
            "DELETED ConfigMap two",
            "DELETED Deployment web"
        ],
        "{order:#?}"
    );
    assert_eq!(
        &order[6..],
        ["MODIFIED Namespace doomed", "DELETED Namespace doomed"],
        "{order:#?}"
    );
    // The deletions were spread over the termination time (2 s for 4 objects: one each 400 ms),
    // and the Namespace went last, after it.
    let spread = seen[5].2 - seen[2].2;
    assert!(spread >= Duration::from_millis(600), "{spread:?}");
    let last = seen[7].2 - deleted_at;
    assert!(last >= Duration::from_secs(2), "{last:?}");
    // Other namespaces are untouched.
    Api::<ConfigMap>::namespaced(client, "kept")
        .get("safe")
        .await
        .unwrap();
}

/// A webhook that sets the annotation `admitted` of the object itself (not its template) to the
/// AdmissionReview's uid: a change on every call.
async fn annotating_the_object() -> TestWebhook {
    TestWebhook::start(|request| {
        use base64::Engine;
        let mut ops = Vec::new();
        if request
            .pointer("/object/metadata/annotations")
            .is_none_or(serde_json::Value::is_null)
        {
            ops.push(json!({"op": "add", "path": "/metadata/annotations", "value": {}}));
        }
        ops.push(
            json!({"op": "add", "path": "/metadata/annotations/admitted", "value": request["uid"]}),
        );
        let patch = base64::engine::general_purpose::STANDARD.encode(json!(ops).to_string());
        json!({"allowed": true, "patchType": "JSONPatch", "patch": patch})
    })
    .await
}

#[tokio::test]
async fn a_deployment_generation_follows_its_annotations_as_admission_left_them() {
    let server = ApiServer::start().await;
    let client = server.client();
    create_namespace(&client, "plain", &[]).await;
    create_namespace(&client, "on", &[("confighash.dev/enabled", "true")]).await;
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), "plain");
    let generation = |d: &Deployment| d.metadata.generation.unwrap();
    let merge = |v: serde_json::Value| Patch::Merge(v);
    let d = deploys
        .create(&PostParams::default(), &deployment("web"))
        .await
        .unwrap();
    assert_eq!(generation(&d), 1);
    // kube's Deployment strategy: an annotation change bumps the generation (annotations are
    // copied to ReplicaSets); a label change does not.
    let d = deploys
        .patch(
            "web",
            &PatchParams::default(),
            &merge(json!({"metadata": {"annotations": {"a": "1"}}})),
        )
        .await
        .unwrap();
    assert_eq!(generation(&d), 2);
    let d = deploys
        .patch(
            "web",
            &PatchParams::default(),
            &merge(json!({"metadata": {"labels": {"l": "1"}}})),
        )
        .await
        .unwrap();
    assert_eq!(generation(&d), 2);
    let d = deploys
        .patch(
            "web",
            &PatchParams::default(),
            &merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    assert_eq!(generation(&d), 3);

    // Other kinds follow their spec only.
    let sets: Api<k8s_openapi::api::apps::v1::StatefulSet> =
        Api::namespaced(client.clone(), "plain");
    let set = build::workload(confighash::core::workload::WorkloadKind::STATEFUL_SET, "db")
        .without_namespace()
        .typed();
    sets.create(&PostParams::default(), &set).await.unwrap();
    let set = sets
        .patch(
            "db",
            &PatchParams::default(),
            &merge(json!({"metadata": {"annotations": {"a": "1"}}})),
        )
        .await
        .unwrap();
    assert_eq!(set.metadata.generation, Some(1));

    // Computed after mutating admission: a label change that a webhook turns into an annotation
    // change bumps the generation.
    let hook = annotating_the_object().await;
    register(&client, hook.configuration("annotate", "Fail")).await;
    let on: Api<Deployment> = Api::namespaced(client.clone(), "on");
    let d = on
        .create(&PostParams::default(), &deployment("web"))
        .await
        .unwrap();
    assert_eq!(generation(&d), 1);
    let d = on
        .patch(
            "web",
            &PatchParams::default(),
            &merge(json!({"metadata": {"labels": {"l": "1"}}})),
        )
        .await
        .unwrap();
    assert!(d.annotations().contains_key("admitted"));
    assert_eq!(generation(&d), 2);
}

#[tokio::test]
async fn admission_reads_namespace_labels_from_a_lagging_cache() {
    let lag = Duration::from_secs(1);
    let server = ApiServer::start_with(confighash_testkit::apiserver::Options {
        namespace_cache_lag: lag,
        ..Default::default()
    })
    .await;
    let client = server.client();
    let hook = TestWebhook::annotating("confighash.dev/checksum", "stamped").await;
    register(&client, hook.configuration("confighash", "Fail")).await;
    let stamped = |d: &Deployment| template_annotation(d, "confighash.dev/checksum").is_some();

    // A namespace the cache does not have yet is read live: its labels count at once.
    create_namespace(&client, "fresh", &[("confighash.dev/enabled", "true")]).await;
    assert!(server.cached_namespace("fresh").is_none());
    let fresh: Api<Deployment> = Api::namespaced(client.clone(), "fresh");
    let d = fresh
        .create(&PostParams::default(), &deployment("web"))
        .await
        .unwrap();
    assert!(stamped(&d), "read live");

    // Once the cache has a namespace, a label set just now is not seen yet: a create right
    // after opting the namespace in misses the webhook.
    create_namespace(&client, "late", &[]).await;
    wait::eventually("the cache to have the namespace", || {
        let cached = server.cached_namespace("late").is_some();
        async move { cached }
    })
    .await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let labelled = std::time::Instant::now();
    namespaces
        .patch(
            "late",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"confighash.dev/enabled": "true"}}})),
        )
        .await
        .unwrap();
    let late: Api<Deployment> = Api::namespaced(client.clone(), "late");
    let missed = late
        .create(&PostParams::default(), &deployment("missed"))
        .await
        .unwrap();
    assert!(
        labelled.elapsed() < lag,
        "the test was too slow to show the lag"
    );
    assert!(!stamped(&missed), "the cache still had the old labels");

    // The cache catches up, and then the webhook is called.
    wait::eventually("the cache to have the label", || {
        let opted_in = server
            .cached_namespace("late")
            .is_some_and(|ns| ns["metadata"]["labels"]["confighash.dev/enabled"] == "true");
        async move { opted_in }
    })
    .await;
    assert!(labelled.elapsed() >= lag);
    let d = late
        .create(&PostParams::default(), &deployment("caught-up"))
        .await
        .unwrap();
    assert!(stamped(&d));

    // The lag can be changed at run time; zero reads the store itself.
    server.set_namespace_cache_lag(Duration::ZERO);
    namespaces
        .patch(
            "late",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"confighash.dev/enabled": null}}})),
        )
        .await
        .unwrap();
    let d = late
        .create(&PostParams::default(), &deployment("after"))
        .await
        .unwrap();
    assert!(!stamped(&d));
}

#[tokio::test]
async fn strategic_merge_patches_merge_each_list_by_its_own_key() {
    let server = ApiServer::start().await;
    let client = server.client();
    create_namespace(&client, "ns", &[]).await;
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), "ns");
    let d = build::deployment("web")
        .without_namespace()
        .pod_spec(json!({
            "containers": [{
                "name": "app", "image": "example/app:1",
                "env": [{"name": "A", "value": "1"}],
                "envFrom": [{"configMapRef": {"name": "one"}}],
                "ports": [{"containerPort": 80}],
                "volumeMounts": [{"name": "cfg", "mountPath": "/etc/a"}]
            }],
            "volumes": [{"name": "cfg", "configMap": {"name": "cfg"}}],
            "tolerations": [{"key": "a", "operator": "Exists"}],
            "imagePullSecrets": [{"name": "pull-a"}]
        }))
        .typed::<Deployment>();
    deploys.create(&PostParams::default(), &d).await.unwrap();
    let strategic = |patch: serde_json::Value| Patch::Strategic(patch);
    let pod = |patch: serde_json::Value| json!({"spec": {"template": {"spec": patch}}});

    let patched = deploys
        .patch(
            "web",
            &PatchParams::default(),
            &strategic(pod(json!({
                "containers": [{
                    "name": "app",
                    "env": [{"name": "B", "value": "2"}],
                    "envFrom": [{"secretRef": {"name": "two"}}],
                    "ports": [{"containerPort": 81}],
                    "volumeMounts": [{"name": "more", "mountPath": "/etc/b"}]
                }],
                "volumes": [{"name": "more", "emptyDir": {}}],
                "tolerations": [{"key": "b", "operator": "Exists"}],
                "imagePullSecrets": [{"name": "pull-b"}]
            }))),
        )
        .await
        .unwrap();
    let spec = serde_json::to_value(patched.spec.unwrap().template.spec.unwrap()).unwrap();
    let names = |list: &str, key: &str| -> Vec<String> {
        spec.pointer(list)
            .and_then(serde_json::Value::as_array)
            .unwrap()
            .iter()
            .map(|i| i[key].to_string().trim_matches('"').to_owned())
            .collect()
    };
    assert_eq!(
        names("/containers/0/env", "name"),
        ["A", "B"],
        "env merges by name"
    );
    assert_eq!(
        names("/containers/0/ports", "containerPort"),
        ["80", "81"],
        "ports by containerPort"
    );
    assert_eq!(
        names("/containers/0/volumeMounts", "mountPath"),
        ["/etc/a", "/etc/b"],
        "mounts by mountPath"
    );
    assert_eq!(
        names("/volumes", "name"),
        ["cfg", "more"],
        "volumes by name"
    );
    assert_eq!(
        names("/imagePullSecrets", "name"),
        ["pull-a", "pull-b"],
        "pull secrets by name"
    );
    assert_eq!(
        spec["containers"][0]["envFrom"],
        json!([{"secretRef": {"name": "two"}}]),
        "envFrom has no merge key: replaced"
    );
    assert_eq!(
        spec["tolerations"],
        json!([{"key": "b", "operator": "Exists"}]),
        "tolerations have none: replaced"
    );
    assert_eq!(
        spec["containers"][0]["image"], "example/app:1",
        "the container merged"
    );

    // Directives: delete an item by its key; retain only the listed keys of a volume.
    let patched = deploys
        .patch(
            "web",
            &PatchParams::default(),
            &strategic(pod(json!({
                "containers": [{"name": "app", "volumeMounts": [{"mountPath": "/etc/a", "$patch": "delete"}]}],
                "volumes": [{"name": "cfg", "emptyDir": {}, "$retainKeys": ["emptyDir", "name"]}]
            }))),
        )
        .await
        .unwrap();
    let spec = serde_json::to_value(patched.spec.unwrap().template.spec.unwrap()).unwrap();
    assert_eq!(
        spec["containers"][0]["volumeMounts"],
        json!([{"name": "more", "mountPath": "/etc/b"}])
    );
    assert_eq!(spec["volumes"][0], json!({"name": "cfg", "emptyDir": {}}));

    // Finalizers merge as a set.
    let patched = deploys
        .patch(
            "web",
            &PatchParams::default(),
            &strategic(json!({"metadata": {"finalizers": ["a", "b"]}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.metadata.finalizers.unwrap(), ["a", "b"]);
    let patched = deploys
        .patch(
            "web",
            &PatchParams::default(),
            &strategic(json!({"metadata": {"finalizers": ["c"], "$deleteFromPrimitiveList/finalizers": ["a"]}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.metadata.finalizers.unwrap(), ["b", "c"]);

    // A list whose merge rule is not known is refused, not guessed at; so is an item without
    // its list's merge key. Neither stores anything.
    let rv = server.resource_version();
    let err = api_status(
        deploys
            .patch(
                "web",
                &PatchParams::default(),
                &strategic(pod(json!({"madeUp": [{"name": "x"}]}))),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 400, "{}", err.message);
    assert!(
        err.message.contains("spec.template.spec.madeUp"),
        "{}",
        err.message
    );
    let err = api_status(
        deploys
            .patch(
                "web",
                &PatchParams::default(),
                &strategic(pod(json!({"containers": [{"image": "x"}]}))),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 422, "{}", err.message);
    assert!(
        err.message
            .contains("does not contain declared merge key: name"),
        "{}",
        err.message
    );
    assert_eq!(server.resource_version(), rv);

    // Custom resources have no patch strategies: kube-apiserver does not take the media type.
    let rollouts: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client,
        "ns",
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Rollout"),
            "rollouts",
        ),
    );
    let err = api_status(
        rollouts
            .patch(
                "any",
                &PatchParams::default(),
                &strategic(json!({"spec": {}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 415, "{}", err.message);
}

#[tokio::test]
async fn watch_lists_stream_the_state_then_a_bookmark_then_changes() {
    let server = ApiServer::start().await;
    let client = server.client();
    create_namespace(&client, "ns", &[]).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "ns");
    for name in ["a", "b"] {
        cms.create(&PostParams::default(), &config_map(name, &[]))
            .await
            .unwrap();
    }
    let listed_at = server.resource_version();

    // sendInitialEvents=true&resourceVersionMatch=NotOlderThan: ADDED for each object, one at a
    // time, then a bookmark marked as the end of the initial events, then changes.
    let mut stream = cms
        .watch(&WatchParams::default().initial_events(), "0")
        .await
        .unwrap()
        .boxed();
    let mut next = async || {
        tokio::time::timeout(DEADLINE, stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
    };
    let mut added = Vec::new();
    for _ in 0..2 {
        match next().await {
            WatchEvent::Added(cm) => added.push(cm.name_any()),
            other => panic!("expected ADDED, got {other:?}"),
        }
    }
    added.sort();
    assert_eq!(added, ["a", "b"]);
    match next().await {
        WatchEvent::Bookmark(b) => {
            assert_eq!(
                b.metadata
                    .annotations
                    .get("k8s.io/initial-events-end")
                    .map(String::as_str),
                Some("true")
            );
            assert_eq!(b.metadata.resource_version, listed_at.to_string());
        }
        other => panic!("expected the initial-events-end BOOKMARK, got {other:?}"),
    }
    cms.create(&PostParams::default(), &config_map("c", &[]))
        .await
        .unwrap();
    loop {
        match next().await {
            WatchEvent::Added(cm) => {
                assert_eq!(cm.name_any(), "c");
                break;
            }
            // Periodic bookmarks may come first.
            WatchEvent::Bookmark(_) => {}
            other => panic!("expected ADDED c, got {other:?}"),
        }
    }

    // kube-runtime's watcher with streaming lists: Init, the objects, InitDone, then changes.
    let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let task = {
        let events = events.clone();
        let stream = watcher(cms.clone(), watcher::Config::default().streaming_lists());
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let text = match event {
                    Ok(watcher::Event::Init) => "Init".to_owned(),
                    Ok(watcher::Event::InitApply(cm)) => format!("InitApply {}", cm.name_any()),
                    Ok(watcher::Event::InitDone) => "InitDone".to_owned(),
                    Ok(watcher::Event::Apply(cm)) => format!("Apply {}", cm.name_any()),
                    Ok(watcher::Event::Delete(cm)) => format!("Delete {}", cm.name_any()),
                    Err(e) => format!("error {e}"),
                };
                events.lock().unwrap().push(text);
            }
        })
    };
    wait::eventually("the streamed list", || {
        let done = events.lock().unwrap().iter().any(|e| e == "InitDone");
        async move { done }
    })
    .await;
    cms.delete("a", &DeleteParams::default()).await.unwrap();
    wait::eventually("the change after the list", || {
        let done = events.lock().unwrap().iter().any(|e| e == "Delete a");
        async move { done }
    })
    .await;
    task.abort();
    let events = events.lock().unwrap().clone();
    assert_eq!(
        events,
        [
            "Init",
            "InitApply a",
            "InitApply b",
            "InitApply c",
            "InitDone",
            "Delete a"
        ]
    );
    assert_eq!(
        server
            .requests()
            .iter()
            .filter(|(verb, _)| verb == "list")
            .count(),
        0,
        "no list was needed"
    );
}

#[tokio::test]
async fn watch_list_options_that_do_not_fit_are_refused_as_kube_apiserver_refuses_them() {
    let server = ApiServer::start().await;
    let client = server.client();
    create_namespace(&client, "ns", &[]).await;
    let get = async |client: &Client, query: &str| {
        let req = http::Request::get(format!("/api/v1/namespaces/ns/configmaps?{query}"))
            .body(Vec::new())
            .unwrap();
        api_status(client.request::<serde_json::Value>(req).await.unwrap_err())
    };
    let invalid = "ListOptions.meta.k8s.io \"\" is invalid: ";
    let err = get(&client, "watch=true&sendInitialEvents=true").await;
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        err.message,
        format!(
            "{invalid}resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"
        )
    );
    let err = get(
        &client,
        "watch=true&resourceVersion=5&resourceVersionMatch=NotOlderThan",
    )
    .await;
    assert_eq!(
        err.message,
        format!(
            "{invalid}resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"
        )
    );
    let err = get(
        &client,
        "watch=true&sendInitialEvents=true&resourceVersionMatch=Exact",
    )
    .await;
    assert_eq!(
        err.message,
        format!(
            "{invalid}[resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan, resourceVersionMatch: Unsupported value: \"Exact\": supported values: \"NotOlderThan\"]"
        )
    );
    let err = get(&client, "sendInitialEvents=true").await;
    assert_eq!(
        err.message,
        format!("{invalid}sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list")
    );
    assert_eq!(err.code, 422);

    // A cluster with the WatchList feature gate off (Kubernetes 1.33's default) refuses them.
    let off = ApiServer::start_with(confighash_testkit::apiserver::Options {
        watch_list: false,
        ..Default::default()
    })
    .await;
    create_namespace(&off.client(), "ns", &[]).await;
    let err = get(&off.client(), "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true").await;
    assert_eq!(
        err.message,
        format!(
            "{invalid}sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"
        )
    );
}

/// Runs `cluster::watch::events` over the ConfigMaps of namespace "ns" (holding "a", "b", "c")
/// of a stand-in with `options` until a list has ended, then applies "d" and waits to see it.
/// Returns the names the last list ended with, why the watch gave up streaming lists (if it did),
/// and the audit's watch and list requests of ConfigMaps, in order.
async fn watch_until_listed(
    options: confighash_testkit::apiserver::Options,
    quiet: Duration,
) -> (Vec<String>, Vec<&'static str>, Vec<String>) {
    use confighash::cluster::watch::{StreamingLists, events};
    let server = ApiServer::start_with(options).await;
    let client = server.client();
    create_namespace(&client, "ns", &[]).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "ns");
    for name in ["a", "b", "c"] {
        cms.create(&PostParams::default(), &config_map(name, &[]))
            .await
            .unwrap();
    }
    let told = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let lists = StreamingLists {
        quiet,
        ..StreamingLists::telling({
            let told = told.clone();
            move |why| told.lock().unwrap().push(why.as_str())
        })
    };
    let events = events(cms.clone(), watcher::Config::default(), &lists).default_backoff();
    let mut events = std::pin::pin!(events);
    let mut listed = Vec::new();
    let mut listing = Vec::new();
    let done = tokio::time::timeout(DEADLINE, async {
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Init) => listing.clear(),
                Ok(watcher::Event::InitApply(cm)) => listing.push(cm.name_any()),
                Ok(watcher::Event::InitDone) => {
                    listed = std::mem::take(&mut listing);
                    if listed.len() == 3 {
                        cms.create(&PostParams::default(), &config_map("d", &[]))
                            .await
                            .unwrap();
                    }
                }
                Ok(watcher::Event::Apply(cm)) if cm.name_any() == "d" => return true,
                _ => {}
            }
        }
        false
    })
    .await;
    assert_eq!(
        done,
        Ok(true),
        "the list ended and the watch after it saw a change"
    );
    listed.sort();
    let requests = server
        .audit()
        .iter()
        .filter(|r| r.resource == "configmaps" && (r.verb == "watch" || r.verb == "list"))
        .map(|r| r.verb.clone())
        .collect();
    let told = told.lock().unwrap().clone();
    (listed, told, requests)
}

/// A streaming list whose end-of-list bookmark never comes (a proxy that drops it) does not leave
/// the watch unsynced: after a quiet spell it lists in pages, and the list ends with every object.
#[tokio::test]
async fn a_streaming_list_without_its_end_bookmark_falls_back_to_pages() {
    let (listed, told, requests) = watch_until_listed(
        confighash_testkit::apiserver::Options {
            drop_initial_events_end: true,
            ..Default::default()
        },
        Duration::from_millis(500),
    )
    .await;
    assert_eq!(listed, ["a", "b", "c"]);
    assert_eq!(told, ["quiet"]);
    assert_eq!(requests[..2], ["watch", "list"], "{requests:?}");
}

/// A streaming list that breaks before its end every time (kubernetes#138557) fails three
/// times, then the watch lists in pages: bounded, not a list of everything for ever. A stream
/// that just ends says nothing: the third is seen to have failed when the fourth begins.
#[tokio::test]
async fn streaming_lists_that_keep_breaking_fall_back_to_pages_after_three() {
    let (listed, told, requests) = watch_until_listed(
        confighash_testkit::apiserver::Options {
            break_initial_events_after: Some(1),
            ..Default::default()
        },
        confighash::cluster::watch::INITIAL_EVENTS_QUIET,
    )
    .await;
    assert_eq!(listed, ["a", "b", "c"]);
    assert_eq!(told, ["broken"]);
    let streamed = requests.iter().take_while(|v| *v == "watch").count();
    assert_eq!(
        streamed, 4,
        "three failed, the fourth given up, then pages: {requests:?}"
    );
    assert_eq!(requests[4], "list");
}

/// A watch list closed right after its end bookmark (kubernetes#134837) costs no list: the watch
/// resumes from the bookmark's version with a plain watch, and nothing falls back.
#[tokio::test]
async fn a_streaming_list_closed_after_its_bookmark_resumes_without_listing_again() {
    let (listed, told, requests) = watch_until_listed(
        confighash_testkit::apiserver::Options {
            close_after_initial_events_end: true,
            ..Default::default()
        },
        confighash::cluster::watch::INITIAL_EVENTS_QUIET,
    )
    .await;
    assert_eq!(listed, ["a", "b", "c"]);
    assert!(told.is_empty(), "{told:?}");
    assert!(!requests.contains(&"list".to_owned()), "{requests:?}");
    assert_eq!(
        requests.len(),
        2,
        "one streaming list, one resumed watch: {requests:?}"
    );
}

#[tokio::test]
async fn a_create_a_lagging_view_lets_into_a_terminating_namespace_is_deleted_with_it() {
    let lag = Duration::from_secs(1);
    let server = ApiServer::start_with(confighash_testkit::apiserver::Options {
        namespace_cache_lag: lag,
        namespace_termination: Duration::from_millis(200),
        ..Default::default()
    })
    .await;
    let client = server.client();
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    create_namespace(&client, "doomed", &[]).await;
    wait::eventually("the cache to have the namespace", || {
        let cached = server.cached_namespace("doomed").is_some();
        async move { cached }
    })
    .await;
    let deleting = std::time::Instant::now();
    namespaces
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    // NamespaceLifecycle reads its lagging view, which still says Active.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "doomed");
    cms.create(&PostParams::default(), &config_map("sneaked-in", &[]))
        .await
        .expect("the lagging view lets it in");
    assert!(
        deleting.elapsed() < lag,
        "the test was too slow to show the lag"
    );
    // The namespace controller deletes it with the rest.
    wait::eventually("the namespace to be deleted", || {
        let namespaces = namespaces.clone();
        async move { namespaces.get_opt("doomed").await.unwrap().is_none() }
    })
    .await;
    assert!(
        server
            .object("configmaps", "doomed", "sneaked-in")
            .is_none()
    );
    // Once the view has caught up, creates are refused until the namespace is gone, and then
    // they are NotFound.
    let err = cms
        .create(&PostParams::default(), &config_map("too-late", &[]))
        .await
        .unwrap_err();
    assert_eq!(api_code(err), 404);
}

/// The status subresource, as a workload's controller uses it: a write of `.../status` changes
/// `status` only (spec, metadata and generation stay), bumps the resourceVersion and reaches
/// watches as MODIFIED; a write of the main resource keeps the stored status.
#[tokio::test]
async fn the_status_subresource_writes_status_and_nothing_else() {
    let server = ApiServer::start().await;
    let client = server.client();
    create_namespace(&client, "ns", &[]).await;
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), "ns");
    let created = deploys
        .create(&PostParams::default(), &deployment("web"))
        .await
        .unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    let rv = server.resource_version().to_string();
    let mut stream = deploys
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();

    // PUT: the body's status, and nothing else of it.
    let mut body = created.clone();
    body.status =
        Some(serde_json::from_value(json!({"observedGeneration": 1, "replicas": 1})).unwrap());
    body.spec.as_mut().unwrap().replicas = Some(9);
    body.metadata.labels = Some(BTreeMap::from([("app".into(), "other".into())]));
    let replaced = deploys
        .replace_status("web", &PostParams::default(), &body)
        .await
        .unwrap();
    let status = replaced.status.clone().unwrap();
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!(status.replicas, Some(1));
    assert_eq!(replaced.spec, created.spec, "the spec is not written");
    assert_eq!(replaced.metadata.labels, created.metadata.labels);
    assert_eq!(replaced.metadata.generation, Some(1), "no new generation");
    let rv1: u64 = replaced.resource_version().unwrap().parse().unwrap();
    assert!(rv1 > rv.parse().unwrap(), "a new resourceVersion");
    match tokio::time::timeout(DEADLINE, stream.try_next())
        .await
        .unwrap()
        .unwrap()
    {
        Some(WatchEvent::Modified(d)) => {
            assert_eq!(d.resource_version(), replaced.resource_version());
            assert_eq!(d.status.unwrap().replicas, Some(1));
        }
        other => panic!("expected MODIFIED, got {other:?}"),
    }

    // PATCH (merge): patches the status; what it says of the spec is dropped.
    let patched = deploys
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5},
                "status": {"updatedReplicas": 1, "availableReplicas": 1}})),
        )
        .await
        .unwrap();
    let status = patched.status.clone().unwrap();
    assert_eq!(
        (
            status.replicas,
            status.updated_replicas,
            status.available_replicas
        ),
        (Some(1), Some(1), Some(1))
    );
    assert_eq!(patched.spec, created.spec);
    // The same again stores nothing.
    let rv2 = server.resource_version();
    deploys
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"updatedReplicas": 1}})),
        )
        .await
        .unwrap();
    assert_eq!(server.resource_version(), rv2);
    // GET returns the object.
    assert_eq!(
        deploys.get_status("web").await.unwrap().status,
        patched.status
    );
    // A stale resourceVersion conflicts.
    let err = deploys
        .replace_status("web", &PostParams::default(), &body)
        .await
        .unwrap_err();
    assert_eq!(api_code(err), 409);

    // A write of the main resource keeps the status, and the status subresource keeps the
    // generation the spec change bumped.
    let updated = deploys
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}, "status": {"replicas": 7}})),
        )
        .await
        .unwrap();
    assert_eq!(
        updated.status, patched.status,
        "status left to the subresource"
    );
    assert_eq!(updated.metadata.generation, Some(2));
    let observed = deploys
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"observedGeneration": 2}})),
        )
        .await
        .unwrap();
    assert_eq!(observed.metadata.generation, Some(2));
    assert_eq!(observed.spec.unwrap().replicas, Some(2));

    // RBAC names it `deployments/status`; objects that are not there, and kinds without it, 404.
    assert!(
        server
            .requests()
            .iter()
            .any(|(verb, resource)| verb == "patch" && resource == "deployments/status")
    );
    assert_eq!(api_code(deploys.get_status("nope").await.unwrap_err()), 404);
    let cms: Api<ConfigMap> = Api::namespaced(client, "ns");
    cms.create(&PostParams::default(), &config_map("c", &[]))
        .await
        .unwrap();
    assert_eq!(api_code(cms.get_status("c").await.unwrap_err()), 404);
}

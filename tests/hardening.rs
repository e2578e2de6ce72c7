//! What a forged review can make the webhook do: which requests it sends (none for a namespace
//! or name that is not a Kubernetes name, none in excluded namespaces, none over
//! `--max-references`), how reads are shared among reviews, and that the bytes of what it reads
//! count against the review memory budget.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use apiserver::ApiServer;
use base64::Engine;
use confighash::admin::metrics::Metrics;
use confighash::certs::key::KeyStore;
use confighash::core::checksum::StampKey;
use confighash::core::refs::ObjectRef;
use confighash::webhook::admission::{DEFAULT_MAX_REFERENCES, Webhook};
use confighash::webhook::lookup::{ConfigSource, Fetched, KubeSource, MemoryBudget};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

const KEY: &[u8] = b"hardening.rs: a key of 32 bytes!";
const NS: &str = "shop";
const MARKER: &str = "confighash.dev/unstamped";
const STAMP: &str = "confighash.dev/checksum";

async fn api_with_config_map(data: &str) -> ApiServer {
    let api = ApiServer::start().await;
    let client = api.client();
    for ns in [NS, "kube-system", "confighash", "tenant-x"] {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
    }
    for ns in [NS, "kube-system", "confighash", "tenant-x"] {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "web"},
            "data": {"app.conf": data}
        }))
        .unwrap();
        Api::<ConfigMap>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &cm)
            .await
            .unwrap();
    }
    api
}

async fn put_config_map(client: &kube::Client, ns: &str, name: &str, data: &str) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let mut cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": name},
        "data": {"app.conf": data}
    }))
    .unwrap();
    match api.get_opt(name).await.unwrap() {
        Some(old) => {
            cm.metadata.resource_version = old.metadata.resource_version;
            api.replace(name, &PostParams::default(), &cm)
                .await
                .unwrap();
        }
        None => {
            api.create(&PostParams::default(), &cm).await.unwrap();
        }
    }
}

fn webhook(source: Arc<dyn ConfigSource>) -> Webhook {
    Webhook::new(
        source,
        Arc::new(KeyStore::new(StampKey::new(KEY.to_vec()).unwrap())),
        Arc::new(Metrics::new()),
    )
}

/// A Deployment mounting ConfigMap `web`, naming `extra` more through the extra annotation.
fn deployment(namespace: &str, extra: &[String], template_annotations: Value) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "web",
            "namespace": namespace,
            "annotations": {"confighash.dev/extra-configmaps": extra.join(",")}
        },
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}, "annotations": template_annotations},
                "spec": {
                    "containers": [{"name": "web", "image": "example/web:1",
                        "volumeMounts": [{"name": "cfg", "mountPath": "/etc/web"}]}],
                    "volumes": [{"name": "cfg", "configMap": {"name": "web"}}]
                }
            }
        }
    })
}

fn review(operation: &str, namespace: &str, object: &Value, old: Option<&Value>) -> Vec<u8> {
    static UID: AtomicU64 = AtomicU64::new(1);
    let uid = UID.fetch_add(1, Ordering::SeqCst);
    let mut request = json!({
        "uid": format!("00000000-0000-0000-0000-{uid:012}"),
        "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
        "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
        "namespace": namespace,
        "name": "web",
        "operation": operation,
        "object": object,
    });
    if let Some(old) = old {
        request["oldObject"] = old.clone();
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
        .to_string()
        .into_bytes()
}

/// The object with the reply's patch applied.
fn patched(object: &Value, reply: &Value) -> Value {
    let mut object = object.clone();
    if let Some(patch) = reply["response"]["patch"].as_str() {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(patch)
            .unwrap();
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
        json_patch::patch(&mut object, &patch).unwrap();
    }
    object
}

fn stamp(object: &Value) -> Option<&str> {
    object["spec"]["template"]["metadata"]["annotations"][STAMP].as_str()
}

fn marker(object: &Value) -> Option<&str> {
    object["metadata"]["annotations"][MARKER].as_str()
}

/// GETs of ConfigMaps and Secrets the stand-in has served.
fn reads(api: &ApiServer) -> usize {
    api.requests()
        .iter()
        .filter(|(verb, resource)| {
            verb == "get" && (resource == "configmaps" || resource == "secrets")
        })
        .count()
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("extra-{i}")).collect()
}

#[tokio::test]
async fn a_namespace_or_name_that_is_not_a_kubernetes_name_is_refused_before_any_read() {
    let api = api_with_config_map("a").await;
    let webhook = webhook(Arc::new(KubeSource::new(api.client())));
    let before = api.requests().len();
    // The attack's namespaces: each would have reached another path of the API.
    for namespace in [
        "kube-system/secrets/admin-token?",
        "secrets?",
        "docs?watch=true&x=",
        "..",
        "shop/../kube-system",
        "Shop",
        "a.b",
        "",
        &"a".repeat(64),
    ] {
        let object = deployment(namespace, &[], json!({}));
        let err = webhook
            .answer(&review("CREATE", namespace, &object, None))
            .await
            .expect_err(namespace);
        assert_eq!(err.status(), 400, "{namespace}: {}", err.message());
        assert!(err.message().contains("namespace"), "{}", err.message());
    }
    // A review without a namespace at all.
    let mut body: Value =
        serde_json::from_slice(&review("CREATE", NS, &deployment(NS, &[], json!({})), None))
            .unwrap();
    body["request"].as_object_mut().unwrap().remove("namespace");
    let err = webhook
        .answer(body.to_string().as_bytes())
        .await
        .unwrap_err();
    assert_eq!(err.status(), 400);
    // And a workload name that is not an object name.
    let mut body: Value =
        serde_json::from_slice(&review("CREATE", NS, &deployment(NS, &[], json!({})), None))
            .unwrap();
    body["request"]["name"] = json!("web\nlevel=error msg=forged");
    let err = webhook
        .answer(body.to_string().as_bytes())
        .await
        .unwrap_err();
    assert_eq!(err.status(), 400);
    assert_eq!(
        api.requests().len(),
        before,
        "no request reached the API server: {:?}",
        &api.requests()[before..]
    );
    // The same review in a valid namespace is read and stamped.
    let object = deployment(NS, &[], json!({}));
    let reply = webhook
        .answer(&review("CREATE", NS, &object, None))
        .await
        .unwrap();
    assert!(stamp(&patched(&object, &reply)).is_some());
    assert_eq!(reads(&api), 1);
}

#[tokio::test]
async fn objects_in_kube_system_its_own_and_excluded_namespaces_are_never_read() {
    let api = api_with_config_map("a").await;
    let webhook = webhook(Arc::new(KubeSource::new(api.client())))
        .with_excluded_namespaces(["confighash".to_owned(), "tenant-x".to_owned()]);
    for namespace in ["kube-system", "confighash", "tenant-x"] {
        let object = deployment(namespace, &[], json!({}));
        let reply = webhook
            .answer(&review("CREATE", namespace, &object, None))
            .await
            .unwrap();
        assert_eq!(reply["response"]["allowed"], true);
        assert!(reply["response"]["patch"].is_null(), "{namespace}: {reply}");
    }
    assert_eq!(reads(&api), 0, "{:?}", api.requests());
}

#[tokio::test]
async fn a_workload_over_max_references_is_marked_for_good_and_nothing_is_read() {
    let api = api_with_config_map("a").await;
    let webhook = webhook(Arc::new(KubeSource::new(api.client())));
    // The attack's review: ten thousand names, about 90 KB.
    let many = names(10_000);
    let object = deployment(NS, &many, json!({}));
    let body = review("CREATE", NS, &object, None);
    assert!(body.len() > 90_000, "{} bytes", body.len());
    let reply = webhook.answer(&body).await.unwrap();
    let created = patched(&object, &reply);
    assert_eq!(marker(&created), Some("too-many-references"));
    assert_eq!(stamp(&created), None);
    assert_eq!(reads(&api), 0);
    assert_eq!(
        webhook
            .metrics()
            .requests("Deployment", "CREATE", "too-many-references"),
        1
    );

    // Exactly at the limit is read; one more is not.
    let at_limit = names(DEFAULT_MAX_REFERENCES - 1); // plus ConfigMap web
    let object = deployment(NS, &at_limit, json!({}));
    let reply = webhook
        .answer(&review("CREATE", NS, &object, None))
        .await
        .unwrap();
    let stamped = patched(&object, &reply);
    assert!(stamp(&stamped).is_some() && marker(&stamped).is_none());
    assert_eq!(reads(&api), DEFAULT_MAX_REFERENCES);

    // An UPDATE that grows a stamped workload past the limit keeps its stamp, reads nothing.
    let grown = deployment(
        NS,
        &names(DEFAULT_MAX_REFERENCES),
        stamped["spec"]["template"]["metadata"]["annotations"].clone(),
    );
    let before = reads(&api);
    let reply = webhook
        .answer(&review("UPDATE", NS, &grown, Some(&stamped)))
        .await
        .unwrap();
    let updated = patched(&grown, &reply);
    assert_eq!(stamp(&updated), stamp(&stamped));
    assert_eq!(reads(&api), before);

    // The marked workload, edited below the limit, is stamped and loses the marker.
    let edited = deployment(NS, &names(3), json!({}));
    let mut edited = edited;
    edited["metadata"]["annotations"][MARKER] = json!("too-many-references");
    let reply = webhook
        .answer(&review("UPDATE", NS, &edited, Some(&created)))
        .await
        .unwrap();
    let fixed = patched(&edited, &reply);
    assert!(stamp(&fixed).is_some());
    assert_eq!(marker(&fixed), None);
}

/// Answers reads in the order they start once released by the test, recording which review
/// (by namespace) each read belongs to.
struct Gated {
    started: Mutex<Vec<String>>,
    release: tokio::sync::Semaphore,
    in_flight: AtomicUsize,
    most: AtomicUsize,
}

impl ConfigSource for Gated {
    fn fetch<'a>(
        &'a self,
        namespace: &'a str,
        _object: &'a ObjectRef,
        _budget: &'a MemoryBudget,
    ) -> BoxFuture<'a, Result<Option<Fetched>, String>> {
        Box::pin(async move {
            self.started.lock().unwrap().push(namespace.to_owned());
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            self.release.acquire().await.unwrap().forget();
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            Ok(None)
        })
    }
}

#[tokio::test]
async fn a_flood_of_large_reviews_does_not_starve_a_small_one() {
    const LARGE: usize = 20;
    const CAP: usize = 8;
    let source = Arc::new(Gated {
        started: Mutex::new(Vec::new()),
        release: tokio::sync::Semaphore::new(0),
        in_flight: AtomicUsize::new(0),
        most: AtomicUsize::new(0),
    });
    let webhook = Arc::new(
        webhook(source.clone())
            .with_max_reads_in_flight(CAP)
            .with_lookup_deadline(Duration::from_secs(60)),
    );
    let mut tasks = Vec::new();
    for i in 0..LARGE {
        let webhook = webhook.clone();
        let ns = format!("flood-{i}");
        tasks.push(tokio::spawn(async move {
            let object = deployment(&ns, &names(200), json!({}));
            webhook.answer(&review("CREATE", &ns, &object, None)).await
        }));
    }
    // Every large review has reads waiting before the small one arrives.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while source.started.lock().unwrap().len() < CAP {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the flood never started"
        );
        tokio::task::yield_now().await;
    }
    for _ in 0..200 {
        tokio::task::yield_now().await;
    }
    let small = {
        let webhook = webhook.clone();
        tokio::spawn(async move {
            let object = deployment(NS, &names(1), json!({}));
            webhook.answer(&review("CREATE", NS, &object, None)).await
        })
    };
    for _ in 0..200 {
        tokio::task::yield_now().await;
    }
    let queued_before_small = source.started.lock().unwrap().len();
    // Let reads finish one at a time until the small review's two reads have both started.
    while source
        .started
        .lock()
        .unwrap()
        .iter()
        .filter(|n| *n == NS)
        .count()
        < 2
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the small review was starved"
        );
        source.release.add_permits(1);
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }
    let served_meanwhile = source.started.lock().unwrap().len() - queued_before_small - 2;
    // In turn across the waiting reviews: the small one waits for at most one read of each
    // large review per read of its own, not for the thousands queued before it.
    assert!(
        served_meanwhile <= 2 * (LARGE + 1),
        "{served_meanwhile} reads of other reviews went first"
    );
    source.release.add_permits(1_000_000);
    small.await.unwrap().unwrap();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert!(source.most.load(Ordering::SeqCst) <= CAP);
    assert_eq!(webhook.reads_free(), CAP, "every place is given back");
}

#[tokio::test]
async fn the_bytes_of_objects_read_count_against_the_review_memory_budget() {
    // A ConfigMap of about 1 MiB.
    let api = api_with_config_map(&"x".repeat(1 << 20)).await;
    let webhook = webhook(Arc::new(KubeSource::new(api.client())));
    let object = deployment(NS, &[], json!({}));
    // Too small a budget for the object: the lookup fails (rule 1), nothing is stamped.
    let small = MemoryBudget::new(512 * 1024);
    let reply = webhook
        .answer_within(&review("CREATE", NS, &object, None), &small)
        .await
        .unwrap();
    let created = patched(&object, &reply);
    assert_eq!(marker(&created), Some("lookup-failed"));
    assert_eq!(small.in_use(), 0, "what the read held is given back");
    // With room for it, it is read and stamped, and the budget is whole again afterwards.
    let budget = MemoryBudget::new(8 << 20);
    let reply = webhook
        .answer_within(&review("CREATE", NS, &object, None), &budget)
        .await
        .unwrap();
    assert!(stamp(&patched(&object, &reply)).is_some());
    assert_eq!(budget.in_use(), 0);
}

#[tokio::test]
async fn a_create_right_after_a_config_write_sees_the_write_under_concurrent_reviews() {
    let api = api_with_config_map("v1").await;
    let client = api.client();
    api.set_delay(Duration::from_millis(30));
    let webhook = Arc::new(webhook(Arc::new(KubeSource::new(client.clone()))));
    let object = deployment(NS, &[], json!({}));
    // Reviews of the same workload keep arriving while the ConfigMap is written.
    let mut stamps_by_content: BTreeMap<&str, String> = BTreeMap::new();
    for content in ["v1", "v2"] {
        let reply = webhook
            .answer(&review("CREATE", NS, &object, None))
            .await
            .unwrap();
        let expected = stamp(&patched(&object, &reply)).unwrap().to_owned();
        stamps_by_content.insert(content, expected);
        if content == "v1" {
            let background: Vec<_> = (0..8)
                .map(|_| {
                    let webhook = webhook.clone();
                    let object = object.clone();
                    tokio::spawn(async move {
                        webhook.answer(&review("CREATE", NS, &object, None)).await
                    })
                })
                .collect();
            put_config_map(&client, NS, "web", "v2").await;
            // At once after the write: this review must see v2, whatever is in flight.
            let reply = webhook
                .answer(&review("CREATE", NS, &object, None))
                .await
                .unwrap();
            let after_write = stamp(&patched(&object, &reply)).unwrap().to_owned();
            for t in background {
                t.await.unwrap().unwrap();
            }
            stamps_by_content.insert("after-write", after_write);
        }
    }
    assert_ne!(stamps_by_content["v1"], stamps_by_content["v2"]);
    assert_eq!(
        stamps_by_content["after-write"], stamps_by_content["v2"],
        "the CREATE after the write was stamped from a read older than the write"
    );
}

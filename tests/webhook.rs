//! The webhook over real TLS on loopback: an HTTPS client that trusts only the test CA sends
//! AdmissionReviews; referenced objects are served by the in-memory API server.

use std::sync::Arc;
use std::time::Duration;

use apiserver::{ApiServer, HttpsClient, TestCerts};
use base64::Engine;
use confighash::admin::health::Health;
use confighash::admin::metrics::Metrics;
use confighash::certs::key::KeyStore;
use confighash::core::checksum::{self, ObjectView, Recipe, RefState, StampKey};
use confighash::core::refs::{ObjectKind, ObjectRef};
use confighash::core::workload::{self, Analysis, WorkloadKind};
use confighash::webhook::admission::Webhook;
use confighash::webhook::lookup::KubeSource;
use confighash::webhook::server::{self as serve, Running, ServeConfig};
use confighash::webhook::tls::CertStore;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";
const STAMP: &str = "confighash.dev/checksum";

struct Harness {
    api: ApiServer,
    client: kube::Client,
    https: HttpsClient,
    url: String,
    admin: String,
    metrics: Arc<Metrics>,
    running: Option<Running>,
    dir: tempfile::TempDir,
}

async fn harness() -> Harness {
    harness_with(Duration::from_secs(2)).await
}

async fn harness_with(lookup_deadline: Duration) -> Harness {
    let api = ApiServer::start().await;
    let client = api.client();
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "shop"}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let certs = TestCerts::generate();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tls.crt"), &certs.cert_pem).unwrap();
    std::fs::write(dir.path().join("tls.key"), &certs.key_pem).unwrap();
    std::fs::write(dir.path().join("ca.crt"), &certs.ca_pem).unwrap();
    let store = CertStore::load(dir.path().join("tls.crt"), dir.path().join("tls.key")).unwrap();
    let metrics = Arc::new(Metrics::new());
    let webhook = Arc::new(
        Webhook::new(
            Arc::new(KubeSource::new(client.clone())),
            Arc::new(KeyStore::new(StampKey::new(KEY.to_vec()).unwrap())),
            metrics.clone(),
        )
        .with_lookup_deadline(lookup_deadline),
    );
    let running = serve::start(ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        certs: store,
        client_ca: None,
        webhook,
        health: Arc::new(Health::default()),
        cert_poll: Duration::from_millis(100),
        header_read_timeout: Duration::from_secs(2),
        drain_timeout: Duration::from_secs(5),
    })
    .await
    .unwrap();
    Harness {
        url: format!("https://127.0.0.1:{}/mutate", running.webhook_addr.port()),
        admin: format!("http://{}", running.admin_addr),
        https: HttpsClient::new(&certs.ca_pem),
        api,
        client,
        metrics,
        running: Some(running),
        dir,
    }
}

impl Harness {
    async fn config_map(&self, name: &str, data: Value, annotations: Value) {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": annotations}, "data": data
        }))
        .unwrap();
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), "shop");
        match api.get_opt(name).await.unwrap() {
            Some(_) => {
                api.patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"data": null})),
                )
                .await
                .unwrap();
                api.patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::to_value(&cm).unwrap()),
                )
                .await
                .unwrap();
            }
            None => {
                api.create(&PostParams::default(), &cm).await.unwrap();
            }
        }
    }

    async fn secret(&self, name: &str, string_data: Value) {
        let s: Secret =
            serde_json::from_value(json!({"metadata": {"name": name}, "stringData": string_data}))
                .unwrap();
        Api::<Secret>::namespaced(self.client.clone(), "shop")
            .create(&PostParams::default(), &s)
            .await
            .unwrap();
    }

    async fn delete_config_map(&self, name: &str) {
        Api::<ConfigMap>::namespaced(self.client.clone(), "shop")
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }

    async fn review(&self, body: &Value) -> Value {
        let reply = self
            .https
            .post(&self.url, body.to_string().into_bytes())
            .await
            .unwrap();
        assert_eq!(
            reply.status,
            200,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
        let review = reply.json();
        assert_eq!(review["response"]["uid"], body["request"]["uid"]);
        assert_eq!(
            review["response"]["allowed"], true,
            "a well-formed review is always allowed"
        );
        review
    }

    /// Sends a review and returns the object with the returned patch applied (and the patch).
    async fn admit(&self, body: &Value) -> (Value, Option<Value>) {
        let review = self.review(body).await;
        let mut object = body["request"]["object"].clone();
        let Some(encoded) = review["response"]["patch"].as_str() else {
            assert!(review["response"].get("patchType").is_none());
            return (object, None);
        };
        assert_eq!(review["response"]["patchType"], "JSONPatch");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap();
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
        json_patch::patch(&mut object, &patch).unwrap();
        (object, Some(serde_json::from_slice(&bytes).unwrap()))
    }

    /// The stamp the webhook should compute for `object` from the stand-in's current state.
    async fn expected(&self, kind: WorkloadKind, object: &Value) -> String {
        self.expected_with(Recipe::V2, kind, object).await
    }

    /// The same under `recipe` (v1: what an earlier release stamped).
    async fn expected_with(&self, recipe: Recipe, kind: WorkloadKind, object: &Value) -> String {
        let Analysis::Workload(info) = workload::analyze(kind, object).unwrap() else {
            panic!("not a workload")
        };
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), "shop");
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), "shop");
        let mut cm_objs = Vec::new();
        let mut secret_objs = Vec::new();
        for (r, _) in info.refs.iter() {
            match r.kind {
                ObjectKind::ConfigMap => {
                    cm_objs.push((r.clone(), cms.get_opt(&r.name).await.unwrap()))
                }
                ObjectKind::Secret => {
                    secret_objs.push((r.clone(), secrets.get_opt(&r.name).await.unwrap()))
                }
            }
        }
        let key = StampKey::new(KEY.to_vec()).unwrap();
        let views: Vec<_> = cm_objs
            .iter()
            .filter_map(|(r, o)| {
                o.as_ref().map(|o| {
                    (
                        r.clone(),
                        checksum::is_ignored(o.metadata.annotations.as_ref()),
                        ObjectView::config_map(o).unwrap(),
                    )
                })
            })
            .chain(secret_objs.iter().filter_map(|(r, o)| {
                o.as_ref().map(|o| {
                    (
                        r.clone(),
                        checksum::is_ignored(o.metadata.annotations.as_ref()),
                        ObjectView::secret(o),
                    )
                })
            }))
            .collect();
        let state = |r: &ObjectRef| match views.iter().find(|(v, _, _)| v == r) {
            Some((_, true, _)) => RefState::Ignored,
            Some((_, false, view)) => RefState::Present(view),
            None => RefState::Absent,
        };
        match recipe {
            Recipe::V1 => checksum::compute_stamp_v1(Some(&key), &info.refs, state),
            Recipe::V2 => checksum::compute_stamp(Some(&key), "shop", &info.refs, state),
        }
        .to_string()
    }

    async fn metrics_text(&self) -> String {
        admin_get(&format!("{}/metrics", self.admin)).await.1
    }
}

/// A GET on the plain-HTTP admin port.
async fn admin_get(url: &str) -> (u16, String) {
    let req = http::Request::get(url).body(String::new()).unwrap();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<String>();
    let resp = client.request(req).await.unwrap();
    let status = resp.status().as_u16();
    use http_body_util::BodyExt;
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

fn pod_template(extra_annotations: Value) -> Value {
    json!({
        "metadata": {"labels": {"app": "web"}, "annotations": extra_annotations},
        "spec": {
            "containers": [{
                "name": "web",
                "image": "nginx:1.27",
                "envFrom": [{"configMapRef": {"name": "app-env"}}],
                "env": [{"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}],
                "volumeMounts": [{"name": "conf", "mountPath": "/etc/nginx/nginx.conf", "subPath": "nginx.conf"}]
            }],
            "volumes": [{"name": "conf", "configMap": {"name": "web", "items": [{"key": "nginx.conf", "path": "nginx.conf"}]}}]
        }
    })
}

fn workload_object(kind: WorkloadKind, template: Value) -> Value {
    let (api_version, spec) = match kind {
        WorkloadKind::CronJob => (
            "batch/v1",
            json!({"schedule": "*/5 * * * *", "jobTemplate": {"spec": {"template": template}}}),
        ),
        WorkloadKind::Rollout => (
            "argoproj.io/v1alpha1",
            json!({"selector": {"matchLabels": {"app": "web"}}, "template": template, "strategy": {"canary": {}}}),
        ),
        _ => (
            "apps/v1",
            json!({"selector": {"matchLabels": {"app": "web"}}, "template": template}),
        ),
    };
    json!({
        "apiVersion": api_version,
        "kind": kind.kind(),
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": spec
    })
}

fn review(operation: &str, kind: WorkloadKind, object: &Value, old: Option<&Value>) -> Value {
    static UID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let uid = format!(
        "uid-{}",
        UID.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    );
    let version = if kind == WorkloadKind::Rollout {
        "v1alpha1"
    } else {
        "v1"
    };
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": kind.group(), "version": version, "kind": kind.kind()},
            "resource": {"group": kind.group(), "version": version, "resource": format!("{}s", kind.kind().to_lowercase())},
            "name": "web",
            "namespace": "shop",
            "operation": operation,
            "userInfo": {"username": "kubernetes-admin"},
            "object": object,
            "oldObject": old.cloned().unwrap_or(Value::Null),
            "dryRun": false
        }
    })
}

fn stamp_of(kind: WorkloadKind, obj: &Value) -> Option<String> {
    workload::template(kind, obj)
        .unwrap()?
        .pointer("/metadata/annotations")?
        .get(STAMP)?
        .as_str()
        .map(str::to_owned)
}

fn set_stamp(kind: WorkloadKind, obj: &mut Value, stamp: Option<&str>) {
    let path = format!("/{}/metadata/annotations", kind.template_path().join("/"));
    let annotations = obj.pointer_mut(&path).unwrap().as_object_mut().unwrap();
    match stamp {
        Some(s) => {
            annotations.insert(STAMP.into(), json!(s));
        }
        None => {
            annotations.remove(STAMP);
        }
    }
}

async fn standard_config(h: &Harness) {
    h.config_map(
        "app-env",
        json!({"LOG_LEVEL": "info", "PORT": "8080"}),
        json!({}),
    )
    .await;
    h.config_map(
        "web",
        json!({"nginx.conf": "events {}", "unused": "x"}),
        json!({}),
    )
    .await;
    h.secret("db", json!({"password": "s3cret", "user": "app"}))
        .await;
}

#[tokio::test]
async fn create_and_update_every_kind() {
    let h = harness().await;
    standard_config(&h).await;
    for kind in WorkloadKind::ALL {
        let object = workload_object(kind, pod_template(json!({"team": "shop"})));
        let (created, patch) = h.admit(&review("CREATE", kind, &object, None)).await;
        let stamp = stamp_of(kind, &created).unwrap_or_else(|| panic!("{kind} not stamped"));
        assert_eq!(stamp, h.expected(kind, &object).await, "{kind}");
        assert!(stamp.starts_with("v2:3eb1bd43:"), "{stamp}");
        // Nothing but the stamp changed.
        let mut back = created.clone();
        set_stamp(kind, &mut back, None);
        assert_eq!(
            back, object,
            "{kind}: the patch touched more than the stamp"
        );
        assert_eq!(
            patch.unwrap().as_array().unwrap().len(),
            1,
            "{kind}: annotations existed, one op"
        );

        // An UPDATE that changes the image keeps a right stamp: no patch.
        let mut updated = created.clone();
        let t = kind.template_path().join("/");
        *updated
            .pointer_mut(&format!("/{t}/spec/containers/0/image"))
            .unwrap() = json!("nginx:1.28");
        let (_, patch) = h
            .admit(&review("UPDATE", kind, &updated, Some(&created)))
            .await;
        assert!(patch.is_none(), "{kind}: a right stamp needs no patch");
    }
    assert_eq!(h.metrics.requests("Deployment", "CREATE", "stamped"), 1);
    assert_eq!(h.metrics.requests("CronJob", "UPDATE", "unchanged"), 1);
}

#[tokio::test]
async fn a_template_without_metadata_gets_its_parents_created() {
    let h = harness().await;
    standard_config(&h).await;
    let mut object = workload_object(WorkloadKind::Deployment, pod_template(json!({})));
    object["spec"]["template"]
        .as_object_mut()
        .unwrap()
        .remove("metadata");
    let (created, patch) = h
        .admit(&review("CREATE", WorkloadKind::Deployment, &object, None))
        .await;
    assert_eq!(patch.unwrap().as_array().unwrap().len(), 3);
    assert_eq!(
        created["spec"]["template"]["metadata"],
        json!({"annotations": {STAMP: h.expected(WorkloadKind::Deployment, &object).await}})
    );
}

#[tokio::test]
async fn config_changes_change_the_stamp_and_unreferenced_keys_do_not() {
    let h = harness().await;
    standard_config(&h).await;
    let kind = WorkloadKind::Deployment;
    let object = workload_object(kind, pod_template(json!({})));
    let (first, _) = h.admit(&review("CREATE", kind, &object, None)).await;
    let s1 = stamp_of(kind, &first).unwrap();

    // Only nginx.conf of "web" is referenced.
    h.config_map(
        "web",
        json!({"nginx.conf": "events {}", "unused": "changed"}),
        json!({}),
    )
    .await;
    let (again, patch) = h.admit(&review("UPDATE", kind, &first, Some(&first))).await;
    assert!(patch.is_none());
    assert_eq!(stamp_of(kind, &again).unwrap(), s1);

    h.config_map(
        "app-env",
        json!({"LOG_LEVEL": "debug", "PORT": "8080"}),
        json!({}),
    )
    .await;
    let (changed, _) = h.admit(&review("UPDATE", kind, &first, Some(&first))).await;
    let s2 = stamp_of(kind, &changed).unwrap();
    assert_ne!(s2, s1);
    assert_eq!(s2, h.expected(kind, &object).await);
}

#[tokio::test]
async fn a_dropped_stamp_is_restored() {
    let h = harness().await;
    standard_config(&h).await;
    let kind = WorkloadKind::StatefulSet;
    let object = workload_object(kind, pod_template(json!({})));
    let (stamped, _) = h.admit(&review("CREATE", kind, &object, None)).await;
    let mut dropped = stamped.clone();
    set_stamp(kind, &mut dropped, None);
    let (restored, patch) = h
        .admit(&review("UPDATE", kind, &dropped, Some(&stamped)))
        .await;
    assert!(patch.is_some());
    assert_eq!(stamp_of(kind, &restored), stamp_of(kind, &stamped));
}

#[tokio::test]
async fn a_failed_lookup_keeps_the_old_stamp_and_marks_a_create() {
    let h = harness().await;
    standard_config(&h).await;
    let kind = WorkloadKind::Deployment;
    let object = workload_object(kind, pod_template(json!({})));
    let (stamped, _) = h.admit(&review("CREATE", kind, &object, None)).await;
    let old = stamp_of(kind, &stamped).unwrap();

    // The config changed, but reading it fails: the old stamp stays, even if the request dropped it.
    h.config_map("app-env", json!({"LOG_LEVEL": "warn"}), json!({}))
        .await;
    h.api.fail_next(Some("get"), Some("configmaps"), 1, 500);
    let mut dropped = stamped.clone();
    set_stamp(kind, &mut dropped, None);
    let (kept, _) = h
        .admit(&review("UPDATE", kind, &dropped, Some(&stamped)))
        .await;
    assert_eq!(stamp_of(kind, &kept).as_deref(), Some(old.as_str()));
    assert_eq!(
        h.metrics.requests("Deployment", "UPDATE", "kept-on-error"),
        1
    );

    // At CREATE nothing is stamped and the marker says why.
    h.api.fail_next(Some("get"), Some("secrets"), 1, 500);
    let (marked, _) = h.admit(&review("CREATE", kind, &object, None)).await;
    assert_eq!(stamp_of(kind, &marked), None);
    assert_eq!(
        marked["metadata"]["annotations"]["confighash.dev/unstamped"],
        "lookup-failed"
    );
    assert!(h.metrics_text().await.contains("outcome=\"error\""));
}

#[tokio::test]
async fn a_lookup_past_its_deadline_keeps_the_template() {
    let h = harness_with(Duration::from_millis(200)).await;
    standard_config(&h).await;
    let kind = WorkloadKind::DaemonSet;
    let object = workload_object(kind, pod_template(json!({})));
    let (stamped, _) = h.admit(&review("CREATE", kind, &object, None)).await;
    h.api.set_delay(Duration::from_millis(600));
    let mut changed = stamped.clone();
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:2");
    let (kept, patch) = h
        .admit(&review("UPDATE", kind, &changed, Some(&stamped)))
        .await;
    assert!(patch.is_none(), "the template is not changed");
    assert_eq!(stamp_of(kind, &kept), stamp_of(kind, &stamped));
    let (marked, _) = h.admit(&review("CREATE", kind, &object, None)).await;
    assert_eq!(
        marked["metadata"]["annotations"]["confighash.dev/unstamped"],
        "lookup-failed"
    );
    h.api.set_delay(Duration::ZERO);
    assert!(h.metrics_text().await.contains("outcome=\"deadline\""));
}

#[tokio::test]
async fn a_deleted_required_reference_keeps_the_stamp_and_an_optional_one_appearing_changes_it() {
    let h = harness().await;
    standard_config(&h).await;
    let kind = WorkloadKind::Deployment;
    let mut template = pod_template(json!({}));
    template["spec"]["containers"][0]["envFrom"]
        .as_array_mut()
        .unwrap()
        .push(json!({"configMapRef": {"name": "extra", "optional": true}}));
    let object = workload_object(kind, template);
    let (stamped, _) = h.admit(&review("CREATE", kind, &object, None)).await;
    let s1 = stamp_of(kind, &stamped).unwrap();

    h.delete_config_map("app-env").await;
    let mut changed = stamped.clone();
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:2");
    let (kept, _) = h
        .admit(&review("UPDATE", kind, &changed, Some(&stamped)))
        .await;
    assert_eq!(
        stamp_of(kind, &kept).as_deref(),
        Some(s1.as_str()),
        "required reference deleted: stamp kept"
    );
    assert_eq!(h.metrics.requests("Deployment", "UPDATE", "kept-absent"), 1);

    h.config_map(
        "app-env",
        json!({"LOG_LEVEL": "info", "PORT": "8080"}),
        json!({}),
    )
    .await;
    let (same, patch) = h
        .admit(&review("UPDATE", kind, &stamped, Some(&stamped)))
        .await;
    assert!(
        patch.is_none(),
        "re-created with the same content: nothing changes"
    );
    assert_eq!(stamp_of(kind, &same).unwrap(), s1);

    h.config_map("extra", json!({"FEATURE": "on"}), json!({}))
        .await;
    let (appeared, _) = h
        .admit(&review("UPDATE", kind, &stamped, Some(&stamped)))
        .await;
    let s2 = stamp_of(kind, &appeared).unwrap();
    assert_ne!(s2, s1, "an optional reference appearing changes the stamp");
    assert_eq!(s2, h.expected(kind, &object).await);
}

#[tokio::test]
async fn a_foreign_stamp_is_kept_until_the_template_changes() {
    let h = harness().await;
    standard_config(&h).await;
    let kind = WorkloadKind::Deployment;
    let foreign = "v1:deadbeef:1111111111111111111111111111111111111111111111111111111111111111";
    let object = workload_object(kind, pod_template(json!({STAMP: foreign})));
    let (kept, patch) = h
        .admit(&review("UPDATE", kind, &object, Some(&object)))
        .await;
    assert!(patch.is_none());
    assert_eq!(stamp_of(kind, &kept).as_deref(), Some(foreign));
    assert_eq!(
        h.metrics.requests("Deployment", "UPDATE", "kept-foreign"),
        1
    );

    let mut changed = object.clone();
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:2");
    let (replaced, _) = h
        .admit(&review("UPDATE", kind, &changed, Some(&object)))
        .await;
    assert_eq!(
        stamp_of(kind, &replaced).unwrap(),
        h.expected(kind, &object).await
    );
}

/// A stamp of recipe v1 made with the current key (what the release before stamped) is checked
/// under v1: an UPDATE that leaves the template alone keeps it while it is right (also when the
/// request drops it, or carries the watcher's v2 touch the webhook's own reads disagree with),
/// and replaces it with the v2 stamp once the config changed. A template change writes v2.
#[tokio::test]
async fn a_v1_stamp_of_the_current_key_is_kept_while_right_and_replaced_when_stale() {
    let h = harness().await;
    standard_config(&h).await;
    let kind = WorkloadKind::Deployment;
    let bare = workload_object(kind, pod_template(json!({})));
    let v1 = h.expected_with(Recipe::V1, kind, &bare).await;
    let v2 = h.expected(kind, &bare).await;
    assert!(v1.starts_with("v1:3eb1bd43:"), "{v1}");
    assert_ne!(v1, v2);
    let object = workload_object(kind, pod_template(json!({STAMP: v1})));

    // Nothing changed: kept, whether the request carries it, drops it or carries a v2 stamp.
    let (kept, patch) = h
        .admit(&review("UPDATE", kind, &object, Some(&object)))
        .await;
    assert!(patch.is_none(), "{patch:?}");
    assert_eq!(stamp_of(kind, &kept).as_deref(), Some(v1.as_str()));
    for carried in [None, Some(v2.as_str())] {
        let mut request = object.clone();
        set_stamp(kind, &mut request, carried);
        let (kept, _) = h
            .admit(&review("UPDATE", kind, &request, Some(&object)))
            .await;
        assert_eq!(
            stamp_of(kind, &kept).as_deref(),
            Some(v1.as_str()),
            "carrying {carried:?}"
        );
    }
    assert_eq!(h.metrics.requests("Deployment", "UPDATE", "unchanged"), 1);

    // A template change rolls anyway: it writes the v2 stamp.
    let mut changed = object.clone();
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:2");
    let (migrated, _) = h
        .admit(&review("UPDATE", kind, &changed, Some(&object)))
        .await;
    assert_eq!(stamp_of(kind, &migrated).as_deref(), Some(v2.as_str()));

    // The config changes: the v1 stamp is stale and becomes the v2 stamp of the new content.
    h.config_map(
        "app-env",
        json!({"LOG_LEVEL": "debug", "PORT": "8080"}),
        json!({}),
    )
    .await;
    let (replaced, patch) = h
        .admit(&review("UPDATE", kind, &object, Some(&object)))
        .await;
    assert!(patch.is_some());
    let now = h.expected(kind, &bare).await;
    assert_ne!(now, v2);
    assert_eq!(stamp_of(kind, &replaced).as_deref(), Some(now.as_str()));
}

#[tokio::test]
async fn ignored_objects_are_left_out_and_opted_out_workloads_skipped() {
    let h = harness().await;
    standard_config(&h).await;
    h.config_map(
        "generated",
        json!({"k": "v"}),
        json!({"confighash.dev/ignore": "true"}),
    )
    .await;
    let kind = WorkloadKind::Deployment;
    let mut template = pod_template(json!({}));
    template["spec"]["containers"][0]["envFrom"]
        .as_array_mut()
        .unwrap()
        .push(json!({"configMapRef": {"name": "generated"}}));
    let with_ignored = workload_object(kind, template);
    let without = workload_object(kind, pod_template(json!({})));
    let (a, _) = h.admit(&review("CREATE", kind, &with_ignored, None)).await;
    let (b, _) = h.admit(&review("CREATE", kind, &without, None)).await;
    assert_eq!(
        stamp_of(kind, &a),
        stamp_of(kind, &b),
        "an ignored object counts as unreferenced"
    );

    let mut opted_out = without.clone();
    opted_out["metadata"]["labels"] = json!({"confighash.dev/enabled": "false"});
    let (skipped, patch) = h.admit(&review("CREATE", kind, &opted_out, None)).await;
    assert!(patch.is_none());
    assert_eq!(stamp_of(kind, &skipped), None);
    assert_eq!(h.metrics.requests("Deployment", "CREATE", "skipped"), 1);
}

#[tokio::test]
async fn other_kinds_and_operations_pass_through() {
    let h = harness().await;
    let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "once"},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}}});
    let mut r = review("CREATE", WorkloadKind::Deployment, &job, None);
    r["request"]["kind"] = json!({"group": "batch", "version": "v1", "kind": "Job"});
    assert!(h.admit(&r).await.1.is_none(), "Jobs are passed through");
    let deployment = workload_object(WorkloadKind::Deployment, pod_template(json!({})));
    for op in ["DELETE", "CONNECT"] {
        let r = review(op, WorkloadKind::Deployment, &deployment, Some(&deployment));
        assert!(h.admit(&r).await.1.is_none(), "{op} is passed through");
    }
    let mut rollout = workload_object(WorkloadKind::Rollout, pod_template(json!({})));
    rollout["spec"]["workloadRef"] =
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"});
    assert!(
        h.admit(&review("CREATE", WorkloadKind::Rollout, &rollout, None))
            .await
            .1
            .is_none()
    );
}

#[tokio::test]
async fn bad_input_gets_a_clear_error() {
    let h = harness().await;
    let good = review(
        "CREATE",
        WorkloadKind::Deployment,
        &workload_object(WorkloadKind::Deployment, pod_template(json!({}))),
        None,
    );
    let with = |f: &dyn Fn(&mut Value)| {
        let mut v = good.clone();
        f(&mut v);
        v.to_string().into_bytes()
    };
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        ("empty body", Vec::new(), 400, "not an AdmissionReview"),
        ("not JSON", b"hello".to_vec(), 400, "not an AdmissionReview"),
        (
            "truncated JSON",
            good.to_string().as_bytes()[..40].to_vec(),
            400,
            "not an AdmissionReview",
        ),
        (
            "JSON array",
            b"[1,2]".to_vec(),
            400,
            "not an AdmissionReview",
        ),
        (
            "JSON string",
            b"\"review\"".to_vec(),
            400,
            "not an AdmissionReview",
        ),
        ("null", b"null".to_vec(), 400, "not an AdmissionReview"),
        ("empty object", b"{}".to_vec(), 400, "no apiVersion"),
        (
            "v1beta1",
            with(&|v| v["apiVersion"] = json!("admission.k8s.io/v1beta1")),
            400,
            "unsupported apiVersion",
        ),
        (
            "other group",
            with(&|v| v["apiVersion"] = json!("apps/v1")),
            400,
            "unsupported apiVersion",
        ),
        (
            "apiVersion number",
            with(&|v| v["apiVersion"] = json!(1)),
            400,
            "not an AdmissionReview",
        ),
        (
            "wrong kind",
            with(&|v| v["kind"] = json!("Deployment")),
            400,
            "kind is not AdmissionReview",
        ),
        (
            "no kind",
            with(&|v| {
                v.as_object_mut().unwrap().remove("kind");
            }),
            400,
            "kind is not AdmissionReview",
        ),
        (
            "no request",
            with(&|v| {
                v.as_object_mut().unwrap().remove("request");
            }),
            400,
            "no request",
        ),
        (
            "null request",
            with(&|v| v["request"] = Value::Null),
            400,
            "no request",
        ),
        (
            "request not an object",
            with(&|v| v["request"] = json!("x")),
            400,
            "not an AdmissionReview",
        ),
        (
            "no uid",
            with(&|v| {
                v["request"].as_object_mut().unwrap().remove("uid");
            }),
            400,
            "no uid",
        ),
        (
            "empty uid",
            with(&|v| v["request"]["uid"] = json!("")),
            400,
            "no uid",
        ),
        (
            "uid number",
            with(&|v| v["request"]["uid"] = json!(7)),
            400,
            "not an AdmissionReview",
        ),
        (
            "object not JSON object kind",
            with(&|v| v["request"]["kind"] = json!("Deployment")),
            400,
            "not an AdmissionReview",
        ),
        (
            "not UTF-8",
            vec![0xff, 0xfe, 0x00],
            400,
            "not an AdmissionReview",
        ),
    ];
    assert!(cases.len() >= 20);
    for (name, body, status, message) in cases {
        let reply = h.https.post(&h.url, body).await.unwrap();
        assert_eq!(
            reply.status,
            status,
            "{name}: {}",
            String::from_utf8_lossy(&reply.body)
        );
        let error = reply.json()["error"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(
            error.contains(message),
            "{name}: {error:?} should mention {message:?}"
        );
        assert_eq!(reply.headers["content-type"], "application/json", "{name}");
    }

    // Well-formed but odd reviews are allowed without a patch, never refused.
    for (name, body) in [
        (
            "no object",
            with(&|v| {
                v["request"].as_object_mut().unwrap().remove("object");
            }),
        ),
        (
            "object is a string",
            with(&|v| v["request"]["object"] = json!("x")),
        ),
        (
            "template is a number",
            with(&|v| v["request"]["object"]["spec"]["template"] = json!(3)),
        ),
        (
            "containers is a map",
            with(&|v| v["request"]["object"]["spec"]["template"]["spec"]["containers"] = json!({})),
        ),
        (
            "annotations are numbers",
            with(&|v| v["request"]["object"]["metadata"]["annotations"] = json!({"a": 1})),
        ),
    ] {
        let reply = h.https.post(&h.url, body).await.unwrap();
        assert_eq!(reply.status, 200, "{name}");
        assert_eq!(reply.json()["response"]["allowed"], true, "{name}");
        assert!(reply.json()["response"].get("patch").is_none(), "{name}");
    }

    // Size: a review over 7 MiB is refused, a valid 5 MiB one is served.
    let mut big = good.clone();
    big["request"]["object"]["metadata"]["annotations"] =
        json!({"filler": "x".repeat(5 * 1024 * 1024)});
    let reply = h
        .https
        .post(&h.url, big.to_string().into_bytes())
        .await
        .unwrap();
    assert_eq!(reply.status, 200);
    big["request"]["object"]["metadata"]["annotations"] =
        json!({"filler": "x".repeat(7 * 1024 * 1024 + 1)});
    let reply = h
        .https
        .post(&h.url, big.to_string().into_bytes())
        .await
        .unwrap();
    assert_eq!(reply.status, 413);
    assert!(
        reply.json()["error"]
            .as_str()
            .unwrap()
            .contains("larger than")
    );

    // Paths and methods.
    let reply = h
        .https
        .post(
            &h.url.replace("/mutate", "/validate"),
            good.to_string().into_bytes(),
        )
        .await
        .unwrap();
    assert_eq!(reply.status, 404);
    assert!(reply.json()["error"].is_string());
    let reply = h.https.send("GET", &h.url, Vec::new()).await.unwrap();
    assert_eq!(reply.status, 405);
    assert!(reply.json()["error"].is_string());
    assert!(h.metrics.requests("", "", "bad-request") >= 20);
}

#[tokio::test]
async fn a_slow_client_is_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = harness().await;
    let certs_ca = {
        // A TLS connection that sends half a request line and then nothing.
        let reply = h.https.post(&h.url, b"{}".to_vec()).await.unwrap();
        assert_eq!(reply.status, 400);
        h.url.clone()
    };
    let addr = certs_ca
        .trim_start_matches("https://")
        .trim_end_matches("/mutate")
        .to_owned();
    let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    // Not even a TLS handshake: the server closes the connection after its timeout (2 s here).
    tcp.write_all(b"\x16\x03\x01").await.unwrap();
    let mut buf = [0u8; 16];
    let closed = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "the server must close: {closed:?}"
    );
}

#[tokio::test]
async fn readiness_and_metrics_on_the_admin_port() {
    let mut h = harness().await;
    assert_eq!(admin_get(&format!("{}/livez", h.admin)).await.0, 200);
    assert_eq!(admin_get(&format!("{}/readyz", h.admin)).await.0, 200);
    standard_config(&h).await;
    let kind = WorkloadKind::Deployment;
    let object = workload_object(kind, pod_template(json!({})));
    h.admit(&review("CREATE", kind, &object, None)).await;
    let text = h.metrics_text().await;
    for needle in [
        "confighash_webhook_requests_total{kind=\"Deployment\",operation=\"CREATE\",outcome=\"stamped\"} 1",
        "confighash_webhook_lookups_total{kind=\"ConfigMap\",outcome=\"found\"} 2",
        "confighash_webhook_request_duration_seconds_count 1",
        "confighash_certificate_expiry_timestamp_seconds",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    // A request in flight when shutdown starts still gets its answer. Its lookups take 1.5 s
    // (under the 2 s deadline), so the drain outlasts the readiness check below by far.
    h.api.set_delay(Duration::from_millis(1500));
    let lookups_before = h.api.received();
    let in_flight = {
        let https = h.https.clone();
        let url = h.url.clone();
        let body = review("UPDATE", kind, &object, Some(&object))
            .to_string()
            .into_bytes();
        tokio::spawn(async move { https.post(&url, body).await })
    };
    let start = tokio::time::Instant::now();
    while h.api.received() == lookups_before {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the review never reached its lookups"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let running = h.running.take().unwrap();
    let health = running.health.clone();
    let admin = h.admin.clone();
    let stop = tokio::spawn(running.shutdown());
    let start = tokio::time::Instant::now();
    while health.is_ready() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "shutdown never began"
        );
        tokio::task::yield_now().await;
    }
    // Not ready while draining (the admin port still answers until the drain ends).
    let (status, _) = admin_get(&format!("{admin}/readyz")).await;
    assert_eq!(status, 503);
    let reply = in_flight.await.unwrap().unwrap();
    assert_eq!(reply.status, 200, "the in-flight review finished");
    stop.await.unwrap();
    h.api.set_delay(Duration::ZERO);
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<String>();
    let after = client
        .request(
            http::Request::get(format!("{admin}/readyz"))
                .body(String::new())
                .unwrap(),
        )
        .await;
    assert!(after.is_err(), "the admin port is closed after shutdown");
    let refused = h.https.post(&h.url, b"{}".to_vec()).await;
    assert!(
        refused.is_err(),
        "the webhook port is closed after shutdown"
    );
}

#[tokio::test]
async fn readyz_is_not_ready_before_a_certificate() {
    let health = Health::default();
    assert!(!health.is_ready());
    health.set_certificate_loaded();
    assert!(health.is_ready());
    health.set_shutting_down();
    assert!(!health.is_ready());
}

#[tokio::test]
async fn the_api_server_calls_the_webhook_and_workloads_are_stamped_at_create() {
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    use k8s_openapi::api::apps::v1::Deployment;
    let h = harness().await;
    standard_config(&h).await;
    Api::<Namespace>::all(h.client.clone())
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"confighash.dev/enabled": "true"}}})),
        )
        .await
        .unwrap();
    let ca = std::fs::read_to_string(h.dir.path().join("ca.crt")).unwrap();
    let configuration: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": "confighash"},
        "webhooks": [{
            "name": "stamp.confighash.dev",
            "clientConfig": {"url": h.url, "caBundle": base64::engine::general_purpose::STANDARD.encode(ca)},
            "rules": [{"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                       "resources": ["deployments"]}],
            "namespaceSelector": {"matchLabels": {"confighash.dev/enabled": "true"}},
            "objectSelector": {"matchExpressions": [{"key": "confighash.dev/enabled", "operator": "NotIn", "values": ["false"]}]},
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "timeoutSeconds": 5,
            "reinvocationPolicy": "IfNeeded",
            "admissionReviewVersions": ["v1"]
        }]
    }))
    .unwrap();
    Api::<MutatingWebhookConfiguration>::all(h.client.clone())
        .create(&PostParams::default(), &configuration)
        .await
        .unwrap();

    let object = workload_object(WorkloadKind::Deployment, pod_template(json!({})));
    let deployment: Deployment = serde_json::from_value(object.clone()).unwrap();
    let deploys: Api<Deployment> = Api::namespaced(h.client.clone(), "shop");
    let created = deploys
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    let stamp = created
        .spec
        .unwrap()
        .template
        .metadata
        .unwrap()
        .annotations
        .unwrap()[STAMP]
        .clone();
    assert_eq!(
        stamp,
        h.expected(WorkloadKind::Deployment, &object).await,
        "stamped at CREATE"
    );
    assert_eq!(
        h.api.rollouts("shop", "Deployment", "web"),
        0,
        "no second rollout after a fresh deploy"
    );

    // A label-only change goes through the webhook and changes nothing.
    let rv = h.api.resource_version();
    deploys
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"tier": "front"}}})),
        )
        .await
        .unwrap();
    assert_eq!(h.api.rollouts("shop", "Deployment", "web"), 0);
    assert!(h.api.resource_version() > rv);

    // New config plus a touch (what the watcher sends) rolls once, to the right stamp.
    h.config_map(
        "app-env",
        json!({"LOG_LEVEL": "debug", "PORT": "8080"}),
        json!({}),
    )
    .await;
    let touched = deploys
        .patch("web", &PatchParams::default(), &Patch::Merge(json!({
            "spec": {"template": {"metadata": {"annotations": {STAMP: "v2:3eb1bd43:0000000000000000000000000000000000000000000000000000000000000000"}}}}
        })))
        .await
        .unwrap();
    let stamp2 = touched
        .spec
        .unwrap()
        .template
        .metadata
        .unwrap()
        .annotations
        .unwrap()[STAMP]
        .clone();
    assert_eq!(
        stamp2,
        h.expected(WorkloadKind::Deployment, &object).await,
        "the webhook corrected the touch"
    );
    assert_ne!(stamp2, stamp);
    assert_eq!(h.api.rollouts("shop", "Deployment", "web"), 1);
}

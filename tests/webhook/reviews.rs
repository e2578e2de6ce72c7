//! The webhook over real TLS on loopback: an HTTPS client that trusts only the test CA sends
//! AdmissionReviews; referenced objects are served by the in-memory API server.

use crate::build;
use crate::harness;
use crate::wait;

use std::ops::{Deref, DerefMut};
use std::time::Duration;

use base64::Engine;
use build::{
    KEY, Meta, NS, Review, Workload, config_map, patch_of, patched, secret, set_stamp, stamp_of,
    workload,
};
use confighash::core::checksum::Recipe;
use confighash::core::names::CHECKSUM_ANNOTATION as STAMP;
use confighash::core::workload::WorkloadKind;
use confighash::serving::health::Health;
use harness::{Harness, ServeSettings, Served};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// The in-memory API server with namespace `shop`, and a webhook reading it served over TLS.
struct Setup {
    cluster: Harness,
    served: Served,
}

impl Deref for Setup {
    type Target = Served;

    fn deref(&self) -> &Served {
        &self.served
    }
}

impl DerefMut for Setup {
    fn deref_mut(&mut self) -> &mut Served {
        &mut self.served
    }
}

async fn harness() -> Setup {
    harness_with(Duration::from_secs(2)).await
}

async fn harness_with(lookup_deadline: Duration) -> Setup {
    let cluster = Harness::start(&[NS], KEY).await;
    let webhook = cluster.webhook().with_lookup_deadline(lookup_deadline);
    let served = harness::serve(
        webhook,
        ServeSettings {
            cert_poll: Duration::from_millis(100),
            drain_timeout: Duration::from_secs(5),
            ..ServeSettings::default()
        },
    )
    .await;
    Setup { cluster, served }
}

impl Setup {
    /// Creates or replaces an object in `shop`.
    async fn put<K>(&self, object: K)
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + std::fmt::Debug
            + serde::Serialize
            + serde::de::DeserializeOwned,
    {
        self.cluster.put(NS, object).await;
    }

    async fn delete_config_map(&self, name: &str) {
        Api::<ConfigMap>::namespaced(self.cluster.client.clone(), NS)
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }

    /// Sends a review; checks it is answered for its uid and allowed.
    async fn review(&self, body: &Value) -> Value {
        let review = self.post(body).await.json();
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
        let object = &body["request"]["object"];
        let Some(bytes) = patch_of(&review) else {
            assert!(review["response"].get("patchType").is_none());
            return (object.clone(), None);
        };
        assert_eq!(review["response"]["patchType"], "JSONPatch");
        (
            patched(object, &review),
            Some(serde_json::from_slice(&bytes).unwrap()),
        )
    }

    /// The stamp the webhook should compute for `object` from the stand-in's current state.
    async fn expected(&self, object: &Value) -> String {
        self.cluster.expected(Recipe::V2, object).await
    }

    async fn metrics_text(&self) -> String {
        self.admin_get("/metrics").await.1
    }
}

/// The workload of these tests, `web` in `shop`: it reads ConfigMap `app-env` whole, key
/// `password` of Secret `db`, and key `nginx.conf` of ConfigMap `web` through a volume.
fn web(kind: WorkloadKind, template_annotations: Value) -> Workload {
    workload(kind, "web")
        .image("nginx:1.27")
        .env_from_config_map("app-env")
        .secret_key("DB_PASSWORD", "db", "password")
        .config_map_volume("conf", "web", &["nginx.conf"])
        .template_annotations(template_annotations)
}

/// `app-env`, `web` and `db`, as [`web`] reads them.
async fn standard_config(h: &Setup) {
    h.put(config_map(
        "app-env",
        &[("LOG_LEVEL", "info"), ("PORT", "8080")],
    ))
    .await;
    h.put(config_map(
        "web",
        &[("nginx.conf", "events {}"), ("unused", "x")],
    ))
    .await;
    h.put(secret("db", &[("password", b"s3cret"), ("user", b"app")]))
        .await;
}

#[tokio::test]
async fn create_and_update_every_kind() {
    let h = harness().await;
    standard_config(&h).await;
    for kind in WorkloadKind::BUILT_IN {
        let object = web(kind, json!({"team": "shop"})).json();
        let (created, patch) = h.admit(&Review::create(&object)).await;
        let stamp = stamp_of(&created).unwrap_or_else(|| panic!("{kind} not stamped"));
        assert_eq!(stamp, h.expected(&object).await, "{kind}");
        assert!(stamp.starts_with("v2:3eb1bd43:"), "{stamp}");
        // Nothing but the stamp changed.
        let mut back = created.clone();
        set_stamp(&mut back, None);
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
        let (_, patch) = h.admit(&Review::update(&updated, &created)).await;
        assert!(patch.is_none(), "{kind}: a right stamp needs no patch");
    }
    assert_eq!(h.metrics.requests("Deployment", "CREATE", "stamped"), 1);
    assert_eq!(h.metrics.requests("CronJob", "UPDATE", "unchanged"), 1);
}

#[tokio::test]
async fn a_template_without_metadata_gets_its_parents_created() {
    let h = harness().await;
    standard_config(&h).await;
    let mut object = web(WorkloadKind::DEPLOYMENT, json!({})).json();
    object["spec"]["template"]
        .as_object_mut()
        .unwrap()
        .remove("metadata");
    let (created, patch) = h.admit(&Review::create(&object)).await;
    assert_eq!(patch.unwrap().as_array().unwrap().len(), 3);
    assert_eq!(
        created["spec"]["template"]["metadata"],
        json!({"annotations": {STAMP: h.expected(&object).await}})
    );
}

#[tokio::test]
async fn config_changes_change_the_stamp_and_unreferenced_keys_do_not() {
    let h = harness().await;
    standard_config(&h).await;
    let kind = WorkloadKind::DEPLOYMENT;
    let object = web(kind, json!({})).json();
    let (first, _) = h.admit(&Review::create(&object)).await;
    let s1 = stamp_of(&first).unwrap();

    // Only nginx.conf of "web" is referenced.
    h.put(config_map(
        "web",
        &[("nginx.conf", "events {}"), ("unused", "changed")],
    ))
    .await;
    let (again, patch) = h.admit(&Review::update(&first, &first)).await;
    assert!(patch.is_none());
    assert_eq!(stamp_of(&again).unwrap(), s1);

    h.put(config_map(
        "app-env",
        &[("LOG_LEVEL", "debug"), ("PORT", "8080")],
    ))
    .await;
    let (changed, _) = h.admit(&Review::update(&first, &first)).await;
    let s2 = stamp_of(&changed).unwrap();
    assert_ne!(s2, s1);
    assert_eq!(s2, h.expected(&object).await);
}

#[tokio::test]
async fn a_dropped_stamp_is_restored() {
    let h = harness().await;
    standard_config(&h).await;
    let kind = WorkloadKind::STATEFUL_SET;
    let object = web(kind, json!({})).json();
    let (stamped, _) = h.admit(&Review::create(&object)).await;
    let mut dropped = stamped.clone();
    set_stamp(&mut dropped, None);
    let (restored, patch) = h.admit(&Review::update(&dropped, &stamped)).await;
    assert!(patch.is_some());
    assert_eq!(stamp_of(&restored), stamp_of(&stamped));
}

#[tokio::test]
async fn a_failed_lookup_keeps_the_old_stamp_and_marks_a_create() {
    let h = harness().await;
    standard_config(&h).await;
    let kind = WorkloadKind::DEPLOYMENT;
    let object = web(kind, json!({})).json();
    let (stamped, _) = h.admit(&Review::create(&object)).await;
    let old = stamp_of(&stamped).unwrap();

    // The config changed, but reading it fails: the old stamp stays, even if the request dropped it.
    h.put(config_map("app-env", &[("LOG_LEVEL", "warn")])).await;
    h.cluster
        .api
        .fail_next(Some("get"), Some("configmaps"), 1, 500);
    let mut dropped = stamped.clone();
    set_stamp(&mut dropped, None);
    let (kept, _) = h.admit(&Review::update(&dropped, &stamped)).await;
    assert_eq!(stamp_of(&kept).as_deref(), Some(old.as_str()));
    assert_eq!(
        h.metrics.requests("Deployment", "UPDATE", "kept-on-error"),
        1
    );

    // At CREATE nothing is stamped and the marker says why.
    h.cluster
        .api
        .fail_next(Some("get"), Some("secrets"), 1, 500);
    let (marked, _) = h.admit(&Review::create(&object)).await;
    assert_eq!(stamp_of(&marked), None);
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
    let kind = WorkloadKind::DAEMON_SET;
    let object = web(kind, json!({})).json();
    let (stamped, _) = h.admit(&Review::create(&object)).await;
    h.cluster.api.set_delay(Duration::from_millis(600));
    let mut changed = stamped.clone();
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:2");
    let (kept, patch) = h.admit(&Review::update(&changed, &stamped)).await;
    assert!(patch.is_none(), "the template is not changed");
    assert_eq!(stamp_of(&kept), stamp_of(&stamped));
    let (marked, _) = h.admit(&Review::create(&object)).await;
    assert_eq!(
        marked["metadata"]["annotations"]["confighash.dev/unstamped"],
        "lookup-failed"
    );
    h.cluster.api.set_delay(Duration::ZERO);
    assert!(h.metrics_text().await.contains("outcome=\"deadline\""));
}

#[tokio::test]
async fn a_deleted_required_reference_keeps_the_stamp_and_an_optional_one_appearing_changes_it() {
    let h = harness().await;
    standard_config(&h).await;
    let kind = WorkloadKind::DEPLOYMENT;
    let object = web(kind, json!({}))
        .env_from_optional_config_map("extra")
        .json();
    let (stamped, _) = h.admit(&Review::create(&object)).await;
    let s1 = stamp_of(&stamped).unwrap();

    h.delete_config_map("app-env").await;
    let mut changed = stamped.clone();
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:2");
    let (kept, _) = h.admit(&Review::update(&changed, &stamped)).await;
    assert_eq!(
        stamp_of(&kept).as_deref(),
        Some(s1.as_str()),
        "required reference deleted: stamp kept"
    );
    assert_eq!(h.metrics.requests("Deployment", "UPDATE", "kept-absent"), 1);

    h.put(config_map(
        "app-env",
        &[("LOG_LEVEL", "info"), ("PORT", "8080")],
    ))
    .await;
    let (same, patch) = h.admit(&Review::update(&stamped, &stamped)).await;
    assert!(
        patch.is_none(),
        "re-created with the same content: nothing changes"
    );
    assert_eq!(stamp_of(&same).unwrap(), s1);

    h.put(config_map("extra", &[("FEATURE", "on")])).await;
    let (appeared, _) = h.admit(&Review::update(&stamped, &stamped)).await;
    let s2 = stamp_of(&appeared).unwrap();
    assert_ne!(s2, s1, "an optional reference appearing changes the stamp");
    assert_eq!(s2, h.expected(&object).await);
}

#[tokio::test]
async fn a_foreign_stamp_is_kept_until_an_update_carries_a_new_stamp() {
    let h = harness().await;
    standard_config(&h).await;
    let kind = WorkloadKind::DEPLOYMENT;
    let foreign = "v1:deadbeef:1111111111111111111111111111111111111111111111111111111111111111";
    let object = web(kind, json!({STAMP: foreign})).json();
    let (kept, patch) = h.admit(&Review::update(&object, &object)).await;
    assert!(patch.is_none());
    assert_eq!(stamp_of(&kept).as_deref(), Some(foreign));
    assert_eq!(
        h.metrics.requests("Deployment", "UPDATE", "kept-foreign"),
        1
    );

    // A template change, with or without the stamp, keeps it too: it cannot be told from a
    // field another mutating webhook adds after confighash.
    let mut changed = object.clone();
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:2");
    let mut dropped = changed.clone();
    set_stamp(&mut dropped, None);
    for request in [&changed, &dropped] {
        let (kept, _) = h.admit(&Review::update(request, &object)).await;
        assert_eq!(stamp_of(&kept).as_deref(), Some(foreign));
    }
    assert_eq!(
        h.metrics.requests("Deployment", "UPDATE", "kept-foreign"),
        3
    );

    // A rollout restart rolls the pods anyway: it gets the current stamp, also when it drops it.
    let mut restarted = dropped.clone();
    restarted["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"] =
        json!("2026-12-01T10:00:00Z");
    let (replaced, _) = h.admit(&Review::update(&restarted, &object)).await;
    assert_eq!(stamp_of(&replaced).unwrap(), h.expected(&object).await);

    // The watcher's touch carries a stamp of the current key: the webhook computes it.
    let mut touched = object.clone();
    set_stamp(&mut touched, Some("v2:3eb1bd43:0000"));
    let (replaced, _) = h.admit(&Review::update(&touched, &object)).await;
    assert_eq!(stamp_of(&replaced).unwrap(), h.expected(&object).await);
}

/// A workload that predates confighash (no stamp, no marker) is not stamped by an UPDATE that
/// carries no stamp, template change or not; the watcher's touch stamps it.
#[tokio::test]
async fn a_workload_never_stamped_is_stamped_only_by_an_update_carrying_a_stamp() {
    let h = harness().await;
    standard_config(&h).await;
    let kind = WorkloadKind::DEPLOYMENT;
    let object = web(kind, json!({})).json();
    let mut changed = object.clone();
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:2");
    for request in [&object, &changed] {
        let (kept, patch) = h.admit(&Review::update(request, &object)).await;
        assert!(patch.is_none(), "{patch:?}");
        assert_eq!(stamp_of(&kept), None);
    }
    assert_eq!(
        h.metrics.requests("Deployment", "UPDATE", "kept-unstamped"),
        2
    );
    let mut touched = object.clone();
    set_stamp(&mut touched, Some("v2:3eb1bd43:0000"));
    let (stamped, _) = h.admit(&Review::update(&touched, &object)).await;
    assert_eq!(stamp_of(&stamped).unwrap(), h.expected(&object).await);
}

/// A stamp of recipe v1 made with the current key (what the release before stamped) is checked
/// under v1: an UPDATE that leaves the template alone keeps it while it is right (also when the
/// request drops it, or carries the watcher's v2 touch the webhook's own reads disagree with),
/// and replaces it with the v2 stamp once the config changed. A template change keeps it too (it
/// cannot be told from a field another webhook adds).
#[tokio::test]
async fn a_v1_stamp_of_the_current_key_is_kept_while_right_and_replaced_when_stale() {
    let h = harness().await;
    standard_config(&h).await;
    let kind = WorkloadKind::DEPLOYMENT;
    let bare = web(kind, json!({})).json();
    let v1 = h.cluster.expected(Recipe::V1, &bare).await;
    let v2 = h.expected(&bare).await;
    assert!(v1.starts_with("v1:3eb1bd43:"), "{v1}");
    assert_ne!(v1, v2);
    let object = web(kind, json!({STAMP: v1})).json();

    // Nothing changed: kept, whether the request carries it, drops it or carries a v2 stamp.
    let (kept, patch) = h.admit(&Review::update(&object, &object)).await;
    assert!(patch.is_none(), "{patch:?}");
    assert_eq!(stamp_of(&kept).as_deref(), Some(v1.as_str()));
    for carried in [None, Some(v2.as_str())] {
        let mut request = object.clone();
        set_stamp(&mut request, carried);
        let (kept, _) = h.admit(&Review::update(&request, &object)).await;
        assert_eq!(
            stamp_of(&kept).as_deref(),
            Some(v1.as_str()),
            "carrying {carried:?}"
        );
    }
    assert_eq!(h.metrics.requests("Deployment", "UPDATE", "unchanged"), 1);

    // A template change keeps it as well.
    let mut changed = object.clone();
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:2");
    let (kept, _) = h.admit(&Review::update(&changed, &object)).await;
    assert_eq!(stamp_of(&kept).as_deref(), Some(v1.as_str()));

    // The config changes: the v1 stamp is stale and becomes the v2 stamp of the new content.
    h.put(config_map(
        "app-env",
        &[("LOG_LEVEL", "debug"), ("PORT", "8080")],
    ))
    .await;
    let (replaced, patch) = h.admit(&Review::update(&object, &object)).await;
    assert!(patch.is_some());
    let now = h.expected(&bare).await;
    assert_ne!(now, v2);
    assert_eq!(stamp_of(&replaced).as_deref(), Some(now.as_str()));
}

#[tokio::test]
async fn ignored_objects_are_left_out_and_opted_out_workloads_skipped() {
    let h = harness().await;
    standard_config(&h).await;
    h.put(config_map("generated", &[("k", "v")]).annotated("confighash.dev/ignore", "true"))
        .await;
    let kind = WorkloadKind::DEPLOYMENT;
    let with_ignored = web(kind, json!({})).env_from_config_map("generated").json();
    let without = web(kind, json!({})).json();
    let (a, _) = h.admit(&Review::create(&with_ignored)).await;
    let (b, _) = h.admit(&Review::create(&without)).await;
    assert_eq!(
        stamp_of(&a),
        stamp_of(&b),
        "an ignored object counts as unreferenced"
    );

    let mut opted_out = without.clone();
    opted_out["metadata"]["labels"] = json!({"confighash.dev/enabled": "false"});
    let (skipped, patch) = h.admit(&Review::create(&opted_out)).await;
    assert!(patch.is_none());
    assert_eq!(stamp_of(&skipped), None);
    assert_eq!(h.metrics.requests("Deployment", "CREATE", "skipped"), 1);
}

#[tokio::test]
async fn other_kinds_and_operations_pass_through() {
    let h = harness().await;
    let job = json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "once", "namespace": NS},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}}});
    let r = Review::create(&job);
    assert_eq!(
        r["request"]["kind"],
        json!({"group": "batch", "version": "v1", "kind": "Job"})
    );
    assert!(h.admit(&r).await.1.is_none(), "Jobs are passed through");
    let deployment = web(WorkloadKind::DEPLOYMENT, json!({})).json();
    for op in ["DELETE", "CONNECT"] {
        let r = Review::of(op, &deployment, Some(&deployment));
        assert!(h.admit(&r).await.1.is_none(), "{op} is passed through");
    }
    let rollout = web(WorkloadKind::ROLLOUT, json!({}))
        .spec(
            "workloadRef",
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}),
        )
        .json();
    assert!(h.admit(&Review::create(&rollout)).await.1.is_none());
}

#[tokio::test]
async fn bad_input_gets_a_clear_error() {
    let h = harness().await;
    let good = Review::create(&web(WorkloadKind::DEPLOYMENT, json!({})).json()).json();
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
    assert_eq!(h.admin_get("/livez").await.0, 200);
    assert_eq!(h.admin_get("/readyz").await.0, 200);
    standard_config(&h).await;
    let kind = WorkloadKind::DEPLOYMENT;
    let object = web(kind, json!({})).json();
    h.admit(&Review::create(&object)).await;
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
    h.cluster.api.set_delay(Duration::from_millis(1500));
    let lookups_before = h.cluster.api.received();
    let in_flight = {
        let https = h.https.clone();
        let url = h.url.clone();
        let body = Review::update(&object, &object).bytes();
        tokio::spawn(async move { https.post(&url, body).await })
    };
    wait::eventually("the review to reach its lookups", async || {
        h.cluster.api.received() > lookups_before
    })
    .await;
    let running = h.running.take().unwrap();
    let health = running.health.clone();
    let admin = h.admin.clone();
    let stop = tokio::spawn(running.shutdown());
    wait::eventually("shutdown to begin", async || !health.is_ready()).await;
    // Not ready while draining (the admin port still answers until the drain ends).
    let (status, _) = h.admin_get("/readyz").await;
    assert_eq!(status, 503);
    let reply = in_flight.await.unwrap().unwrap();
    assert_eq!(reply.status, 200, "the in-flight review finished");
    stop.await.unwrap();
    h.cluster.api.set_delay(Duration::ZERO);
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
    Api::<Namespace>::all(h.cluster.client.clone())
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"confighash.dev/enabled": "true"}}})),
        )
        .await
        .unwrap();
    let ca = h.ca_pem.clone();
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
    Api::<MutatingWebhookConfiguration>::all(h.cluster.client.clone())
        .create(&PostParams::default(), &configuration)
        .await
        .unwrap();

    let object = web(WorkloadKind::DEPLOYMENT, json!({})).json();
    let deployment: Deployment = serde_json::from_value(object.clone()).unwrap();
    let deploys: Api<Deployment> = Api::namespaced(h.cluster.client.clone(), "shop");
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
    assert_eq!(stamp, h.expected(&object).await, "stamped at CREATE");
    assert_eq!(
        h.cluster.api.rollouts("shop", "Deployment", "web"),
        0,
        "no second rollout after a fresh deploy"
    );

    // A label-only change goes through the webhook and changes nothing.
    let rv = h.cluster.api.resource_version();
    deploys
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"tier": "front"}}})),
        )
        .await
        .unwrap();
    assert_eq!(h.cluster.api.rollouts("shop", "Deployment", "web"), 0);
    assert!(h.cluster.api.resource_version() > rv);

    // New config plus a touch (what the watcher sends) rolls once, to the right stamp.
    h.put(config_map(
        "app-env",
        &[("LOG_LEVEL", "debug"), ("PORT", "8080")],
    ))
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
        h.expected(&object).await,
        "the webhook corrected the touch"
    );
    assert_ne!(stamp2, stamp);
    assert_eq!(h.cluster.api.rollouts("shop", "Deployment", "web"), 1);
}

/// `--dry-run`: every review is decided and counted as without it, then allowed without its
/// patch, which `confighash_webhook_dry_run_total` counts by the outcome it was for.
#[tokio::test]
async fn a_dry_run_allows_every_review_without_a_patch_and_counts_what_it_withheld() {
    let cluster = Harness::start(&[NS], KEY).await;
    let served = harness::serve(
        cluster.webhook().with_dry_run(true),
        ServeSettings::default(),
    )
    .await;
    let h = Setup { cluster, served };
    standard_config(&h).await;
    let kind = WorkloadKind::DEPLOYMENT;
    let object = web(kind, json!({})).json();

    // A CREATE that would be stamped.
    let (admitted, patch) = h.admit(&Review::create(&object)).await;
    assert_eq!(patch, None, "no patch in a dry run");
    assert_eq!(admitted, object);
    assert_eq!(h.metrics.requests("Deployment", "CREATE", "stamped"), 1);
    assert_eq!(h.metrics.dry_runs("Deployment", "CREATE", "stamped"), 1);

    // An UPDATE carrying the right stamp needs no patch anyway: nothing withheld.
    let mut stamped = object.clone();
    set_stamp(&mut stamped, Some(&h.expected(&object).await));
    let (_, patch) = h.admit(&Review::update(&stamped, &stamped)).await;
    assert_eq!(patch, None);
    assert_eq!(h.metrics.requests("Deployment", "UPDATE", "unchanged"), 1);
    assert_eq!(h.metrics.dry_runs("Deployment", "UPDATE", "unchanged"), 0);

    // A CREATE whose lookup fails would get the unstamped marker.
    h.cluster
        .api
        .fail_next(Some("get"), Some("secrets"), 1, 500);
    let (admitted, patch) = h.admit(&Review::create(&object)).await;
    assert_eq!(patch, None);
    assert_eq!(admitted, object);
    assert_eq!(
        h.metrics.dry_runs("Deployment", "CREATE", "kept-on-error"),
        1
    );

    let text = h.metrics_text().await;
    assert!(
        text.lines().any(|l| l
            == "confighash_webhook_dry_run_total{kind=\"Deployment\",operation=\"CREATE\",outcome=\"stamped\"} 1"),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l
            == "confighash_webhook_dry_run_total{kind=\"CronJob\",operation=\"UPDATE\",outcome=\"stamped\"} 0"),
        "every series exists from the start in a dry run"
    );
    // Without a dry run every series is exported too, at 0: the dashboard's panel and any
    // alert on it show 0, not "no data", on a normal install.
    let plain = harness::webhook(std::sync::Arc::new(harness::NoObjects), KEY);
    let text = plain.metrics().encode();
    let series: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("confighash_webhook_dry_run_total{"))
        .collect();
    assert!(!series.is_empty(), "{text}");
    assert!(series.iter().all(|l| l.ends_with(" 0")), "{series:?}");
}

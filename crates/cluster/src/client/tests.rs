use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use base64::Engine;
use futures::StreamExt;
use http_body_util::StreamBody;
use kube::Api;
use kube::api::{ListParams, PostParams};
use kube::runtime::watcher;
use serde_json::{Value, json};

use super::*;

/// Every resource: the layer as `serve` builds it.
const ALL: Reads = Reads::of(&[
    Resource::ConfigMaps,
    Resource::Secrets,
    Resource::Namespaces,
    Resource::Events,
    Resource::Leases,
    Resource::MutatingWebhookConfigurations,
    Resource::Workloads,
    Resource::Pods,
]);

const CANARY: &str = "c4n4ry-7Hq2x";

fn canary_b64() -> String {
    base64::engine::general_purpose::STANDARD.encode(CANARY)
}

/// Log lines written while the returned guard lives, every level and target.
fn capture() -> (Arc<Mutex<Vec<u8>>>, tracing::subscriber::DefaultGuard) {
    #[derive(Clone)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Arc::new(Mutex::new(Vec::new()));
    let sink = Sink(buf.clone());
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || sink.clone())
        .finish();
    (buf, tracing::subscriber::set_default(subscriber))
}

fn assert_clean(what: &str, text: &str) {
    for needle in [CANARY.to_owned(), canary_b64()] {
        assert!(!text.contains(&needle), "{what} holds the canary:\n{text}");
    }
}

fn reply(status: u16, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = StatusCode::from_u16(status).unwrap();
    r.headers_mut()
        .insert("x-leak", HeaderValue::from_static("c4n4ry-7Hq2x"));
    r
}

/// A kube client whose API server is `answer` (method, path and query -> status, body).
fn client(
    answer: impl Fn(&Method, &str) -> (u16, String) + Send + Sync + Clone + 'static,
) -> kube::Client {
    let service = tower::service_fn(move |req: Request<Body>| {
        let answer = answer.clone();
        async move {
            let target = req
                .uri()
                .path_and_query()
                .map(|p| p.as_str().to_owned())
                .unwrap_or_default();
            let (status, body) = answer(req.method(), &target);
            Ok::<_, Infallible>(reply(status, body))
        }
    });
    kube::Client::new(SanitizeLayer { reads: ALL }.layer(service), "default")
}

async fn through(request: Request<Body>, status: u16, body: &'static str) -> (StatusCode, Value) {
    let mut svc = SanitizeLayer { reads: ALL }.layer(tower::service_fn(
        move |_req: Request<Body>| async move { Ok::<_, Infallible>(reply(status, body)) },
    ));
    let response = svc.call(request).await.unwrap();
    let status = response.status();
    assert!(
        response.headers().get("x-leak").is_none(),
        "the server's headers are not passed on"
    );
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap()
}

#[test]
fn the_path_says_what_an_answer_must_be() {
    let at = |method: &str, uri: &str| {
        Expect::of(
            &Request::builder().method(method).uri(uri).body(()).unwrap(),
            ALL,
        )
    };
    use Expect::*;
    use Shape::*;
    let cases = [
        (
            "GET",
            "/api/v1/namespaces/a/configmaps/b",
            Typed(Ty::ConfigMap, Object),
        ),
        (
            "GET",
            "/api/v1/namespaces/a/secrets?limit=50",
            Typed(Ty::Secret, List),
        ),
        (
            "GET",
            "/api/v1/secrets?fieldSelector=x&limit=5",
            Typed(Ty::Secret, List),
        ),
        (
            "POST",
            "/api/v1/namespaces/a/secrets?",
            Typed(Ty::Secret, Object),
        ),
        (
            "PUT",
            "/api/v1/namespaces/a/secrets/k?",
            Typed(Ty::Secret, Object),
        ),
        (
            "DELETE",
            "/api/v1/namespaces/a/secrets/k",
            Typed(Ty::Secret, Deleted),
        ),
        (
            "DELETE",
            "/api/v1/namespaces/a/secrets",
            Typed(Ty::Secret, DeletedList),
        ),
        ("GET", "/api/v1/namespaces", Typed(Ty::Namespace, List)),
        (
            "GET",
            "/api/v1/namespaces/shop",
            Typed(Ty::Namespace, Object),
        ),
        (
            "GET",
            "/api/v1/namespaces?&watch=true&resourceVersion=1",
            Watch(Ty::Namespace),
        ),
        ("GET", "/api/v1/configmaps?watch=1", Watch(Ty::ConfigMap)),
        (
            "GET",
            "/api/v1/configmaps?sendInitialEvents=true&watch=true",
            Watch(Ty::ConfigMap),
        ),
        (
            "GET",
            "/api/v1/configmaps?watch=false",
            Typed(Ty::ConfigMap, List),
        ),
        (
            "POST",
            "/api/v1/namespaces/a/events",
            Typed(Ty::CoreEvent, Object),
        ),
        (
            "PATCH",
            "/apis/events.k8s.io/v1/namespaces/a/events/e",
            Typed(Ty::Event, Object),
        ),
        (
            "GET",
            "/apis/coordination.k8s.io/v1/namespaces/a/leases/l",
            Typed(Ty::Lease, Object),
        ),
        (
            "PATCH",
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/c?",
            Typed(Ty::MutatingWebhookConfiguration, Object),
        ),
        (
            "PATCH",
            "/apis/apps/v1/namespaces/a/deployments/web?fieldManager=confighash",
            Typed(Ty::Workload(WorkloadKind::DEPLOYMENT), Object),
        ),
        (
            "GET",
            "/apis/batch/v1/cronjobs?limit=50",
            Typed(Ty::Workload(WorkloadKind::CRON_JOB), List),
        ),
        (
            "GET",
            "/apis/argoproj.io/v1alpha1/rollouts?watch=true",
            Watch(Ty::Workload(WorkloadKind::ROLLOUT)),
        ),
        (
            "GET",
            "/apis/apps/v1/statefulsets",
            Typed(Ty::Workload(WorkloadKind::STATEFUL_SET), List),
        ),
        (
            "GET",
            "/apis/apps/v1/daemonsets",
            Typed(Ty::Workload(WorkloadKind::DAEMON_SET), List),
        ),
        (
            "GET",
            "/api/v1/namespaces/a/pods?labelSelector=app%3Dweb&limit=500",
            Typed(Ty::Pod, List),
        ),
        ("GET", "/apis/apps/v1", Typed(Ty::ApiResourceList, Object)),
        ("GET", "/api/v1", Typed(Ty::ApiResourceList, Object)),
        ("GET", "/api", Typed(Ty::ApiVersions, Object)),
        ("GET", "/apis", Typed(Ty::ApiGroupList, Object)),
        ("GET", "/apis/apps", Typed(Ty::ApiGroup, Object)),
        ("GET", "/version", Typed(Ty::VersionInfo, Object)),
        ("GET", "/healthz", Json),
        // Nothing confighash reads: no rule says what the answer may hold.
        ("GET", "/api/v1/namespaces/a/serviceaccounts", Unknown),
        ("GET", "/api/v1/nodes", Unknown),
        ("GET", "/apis/batch/v1/namespaces/a/jobs", Unknown),
        (
            "GET",
            "/apis/apps/v1/namespaces/a/deployments/web/scale",
            Unknown,
        ),
        ("GET", "/api/v1/namespaces/a/status", Unknown),
        ("GET", "/api/v1/namespaces/a/secrets/", Unknown),
        ("GET", "/apis/rbac.authorization.k8s.io/v1/roles", Unknown),
    ];
    for (method, uri, expected) in cases {
        assert_eq!(at(method, uri), expected, "{method} {uri}");
    }
    // Another representation (metadata only) is not read; aggregated discovery is.
    let metadata = Request::get("/api/v1/secrets")
        .header(
            ACCEPT,
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
        )
        .body(())
        .unwrap();
    assert_eq!(Expect::of(&metadata, ALL), Unknown);
    let aggregated = Request::get("/apis")
        .header(
            ACCEPT,
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
        )
        .body(())
        .unwrap();
    assert_eq!(
        Expect::of(&aggregated, ALL),
        Typed(Ty::GroupDiscoveryList, Object)
    );
    let mut raw = Request::get("/api/v1/namespaces/a/secrets/b")
        .body(())
        .unwrap();
    raw.extensions_mut().insert(DecodedByCaller);
    assert_eq!(Expect::of(&raw, ALL), Raw);
}

#[tokio::test]
async fn error_bodies_keep_the_code_and_a_known_reason_only() {
    let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"secret c4n4ry-7Hq2x is invalid","reason":"NotFound","details":{"name":"c4n4ry-7Hq2x","causes":[{"message":"c4n4ry-7Hq2x"}]},"code":404}"#;
    let (status, json) = through(get("/api/v1/namespaces/a/secrets/b"), 404, body).await;
    assert_eq!(status, 404);
    assert_eq!(json["code"], 404);
    assert_eq!(json["reason"], "NotFound");
    assert_eq!(json["kind"], "Status");
    assert_clean("the Status", &json.to_string());

    // A reason that is not one Kubernetes defines is dropped, even a plain word.
    let body = r#"{"kind":"Status","message":"x","reason":"Hunter","code":403}"#;
    let (status, json) = through(get("/api/v1/secrets"), 403, body).await;
    assert_eq!((status.as_u16(), &json["reason"]), (403, &Value::Null));

    // Plain text, HTML, a JSON of another shape: the code stays.
    for body in [
        "c4n4ry-7Hq2x",
        "<html><b>c4n4ry-7Hq2x</b></html>",
        "[\"c4n4ry-7Hq2x\"]",
    ] {
        let (status, json) = through(get("/api/v1/secrets"), 500, body).await;
        assert_eq!(status, 500);
        assert_eq!(json["code"], 500);
        assert_clean("the Status", &json.to_string());
    }
}

#[tokio::test]
async fn success_bodies_must_parse_as_what_kube_will_parse_them_into() {
    let secret =
        r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"b"},"data":{"k":"YWJj"}}"#;
    let (status, json) = through(get("/api/v1/namespaces/a/secrets/b"), 200, secret).await;
    assert_eq!(status, 200);
    assert_eq!(json["data"]["k"], "YWJj", "a good answer passes unchanged");

    let undecodable = [
        // Asked for a ConfigMap, answered a Secret.
        ("/api/v1/namespaces/a/configmaps/b", secret),
        (
            "/api/v1/namespaces/a/secrets/b",
            r#"{"kind":"Secret","data":"c4n4ry-7Hq2x"}"#,
        ),
        (
            "/api/v1/namespaces/a/secrets/b",
            r#"{"kind":"Secret","data":{"k":"c4n4ry-7Hq2x!"}}"#,
        ),
        (
            "/api/v1/namespaces/a/secrets/b",
            r#"{"kind":"Secret","data":{"k":1,"l":"YzRuNHJ5LTdIcTJ4"}}"#,
        ),
        (
            "/api/v1/namespaces/a/secrets/b",
            r#"{"kind":"Secret","data":{"k":"YzRu"#,
        ),
        ("/api/v1/namespaces/a/secrets/b", "c4n4ry-7Hq2x"),
        (
            "/api/v1/namespaces/a/secrets",
            r#"{"kind":"SecretList","items":"c4n4ry-7Hq2x"}"#,
        ),
        // A list where one object was asked for.
        (
            "/api/v1/namespaces/a/secrets/b",
            r#"{"kind":"SecretList","metadata":{},"items":[]}"#,
        ),
        (
            "/apis/apps/v1/namespaces/a/deployments/web",
            r#"{"kind":"Secret","metadata":{},"data":{"k":"YzRuNHJ5LTdIcTJ4"}}"#,
        ),
        (
            "/apis/apps/v1/deployments",
            r#"{"kind":"List","metadata":{"resourceVersion":"1"},"items":[{"kind":"Secret","metadata":{}}]}"#,
        ),
        (
            "/apis/apps/v1",
            r#"{"kind":"APIResourceList","groupVersion":"apps/v1","resources":"c4n4ry-7Hq2x"}"#,
        ),
        ("/healthz", "c4n4ry-7Hq2x"),
        (
            "/api/v1/namespaces/a/serviceaccounts",
            r#"{"kind":"ServiceAccountList","items":[]}"#,
        ),
    ];
    for (path, body) in undecodable {
        let (status, json) = through(get(path), 200, body).await;
        assert_eq!(status, 500, "{path} {body}");
        assert_eq!(json["code"], 500);
        assert_clean("the Status", &json.to_string());
    }

    let (status, _) = through(get("/apis/apps/v1/deployments"), 200,
        r#"{"kind":"DeploymentList","metadata":{"resourceVersion":"1"},"items":[{"metadata":{"name":"web"},"spec":{}}]}"#).await;
    assert_eq!(
        status, 200,
        "items without a kind are taken as the kind listed"
    );

    // A delete may answer a Status: passed on sanitized, with its summary and code.
    let delete = Request::delete("/api/v1/namespaces/a/secrets/b")
        .body(Body::empty())
        .unwrap();
    let (status, json) = through(delete, 200,
        r#"{"kind":"Status","apiVersion":"v1","status":"Success","code":200,"message":"c4n4ry-7Hq2x","details":{"name":"c4n4ry-7Hq2x"}}"#).await;
    assert_eq!(status, 200);
    assert_eq!(
        (json["status"].as_str(), json["code"].as_u64()),
        (Some("Success"), Some(200))
    );
    assert_clean("the Status", &json.to_string());
}

#[tokio::test]
async fn the_caller_that_decodes_gets_the_body_unread_but_errors_sanitized() {
    let mut request = get("/api/v1/namespaces/a/secrets/b");
    request.extensions_mut().insert(DecodedByCaller);
    let mut svc =
        SanitizeLayer { reads: ALL }.layer(tower::service_fn(|_req: Request<Body>| async {
            Ok::<_, Infallible>(reply(200, "not JSON"))
        }));
    let response = svc.call(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&bytes[..], b"not JSON");

    let mut request = get("/api/v1/namespaces/a/secrets/b");
    request.extensions_mut().insert(DecodedByCaller);
    let (status, json) = {
        let mut svc =
            SanitizeLayer { reads: ALL }.layer(tower::service_fn(|_req: Request<Body>| async {
                Ok::<_, Infallible>(reply(
                    403,
                    r#"{"message":"c4n4ry-7Hq2x","reason":"Forbidden"}"#,
                ))
            }));
        let response = svc.call(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice::<Value>(&bytes).unwrap())
    };
    assert_eq!(
        (status.as_u16(), json["reason"].as_str()),
        (403, Some("Forbidden"))
    );
    assert_clean("the Status", &json.to_string());
}

#[tokio::test]
async fn bodies_larger_than_the_bound_are_withheld() {
    let big = Bytes::from(vec![b' '; MAX_ANSWER_BYTES + 1]);
    let mut svc =
        SanitizeLayer { reads: ALL }.layer(tower::service_fn(move |_req: Request<Body>| {
            let big = big.clone();
            async move {
                // Sent in pieces, with no length declared.
                let chunks: Vec<Result<Frame<Bytes>, Infallible>> = big
                    .chunks(1 << 20)
                    .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
                    .collect();
                Ok::<_, Infallible>(Response::new(StreamBody::new(futures::stream::iter(
                    chunks,
                ))))
            }
        }));
    let response = svc.call(get("/api/v1/secrets")).await.unwrap();
    assert_eq!(response.status(), 500);
}

/// The lines `input` (sent in pieces of `piece` bytes) becomes through a watch of `path`.
async fn watch_lines(path: &str, input: &[u8], piece: usize) -> Vec<String> {
    let input = Bytes::copy_from_slice(input);
    let mut svc =
        SanitizeLayer { reads: ALL }.layer(tower::service_fn(move |_req: Request<Body>| {
            let input = input.clone();
            async move {
                let chunks: Vec<Result<Frame<Bytes>, Infallible>> = input
                    .chunks(piece)
                    .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
                    .collect();
                Ok::<_, Infallible>(Response::new(StreamBody::new(futures::stream::iter(
                    chunks,
                ))))
            }
        }));
    let response = svc.call(get(path)).await.unwrap();
    assert_eq!(response.status(), 200);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    assert!(text.is_empty() || text.ends_with('\n'), "{text}");
    text.lines().map(str::to_owned).collect()
}

#[tokio::test]
async fn watch_lines_are_checked_one_by_one() {
    let good = r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","resourceVersion":"2"},"data":{"k":"YWJj"}}}"#;
    let bookmark = r#"{"type":"BOOKMARK","object":{"kind":"Secret","apiVersion":"v1","metadata":{"resourceVersion":"3"}}}"#;
    let error = r#"{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired","message":"c4n4ry-7Hq2x"}}"#;
    let input = format!("{good}\r\n\n{bookmark}\n{error}\n{good}\n");
    for piece in [1, 7, 4096] {
        let lines = watch_lines("/api/v1/secrets?watch=true", input.as_bytes(), piece).await;
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert_eq!(lines[0], good);
        assert_eq!(lines[1], bookmark);
        let event: Value = serde_json::from_str(&lines[2]).unwrap();
        assert_eq!(event["type"], "ERROR");
        assert_eq!(event["object"]["code"], 410, "the watcher still relists");
        assert_eq!(event["object"]["reason"], "Expired");
        assert_clean("the ERROR event", &lines[2]);
        assert_eq!(lines[3], good);
    }

    // A line that does not parse, an object of another kind or a mistyped one ends the watch
    // with a 500 ERROR event; nothing after it passes.
    for bad in [
        "c4n4ry-7Hq2x".to_owned(),
        r#"{"type":"ADDED","object":{"kind":"ConfigMap","data":{"k":"c4n4ry-7Hq2x"}}}"#.to_owned(),
        r#"{"type":"MODIFIED","object":{"kind":"Secret","data":"c4n4ry-7Hq2x"}}"#.to_owned(),
        r#"{"type":"c4n4ry-7Hq2x","object":{}}"#.to_owned(),
        r#"{"kind":"Status","code":410,"message":"c4n4ry-7Hq2x"}"#.to_owned(),
    ] {
        let input = format!("{good}\n{bad}\n{good}\n");
        let lines = watch_lines("/api/v1/secrets?watch=true", input.as_bytes(), 5).await;
        assert_eq!(lines.len(), 2, "{bad}: {lines:?}");
        assert_eq!(lines[0], good);
        let event: Value = serde_json::from_str(&lines[1]).unwrap();
        assert_eq!(
            (event["type"].as_str(), event["object"]["code"].as_u64()),
            (Some("ERROR"), Some(500))
        );
        assert_clean("the stream", &lines.join("\n"));
    }

    // A workload watch takes objects of its own kind only.
    let other = r#"{"type":"ADDED","object":{"kind":"Secret","metadata":{"name":"s","resourceVersion":"1"},"data":{"k":"YzRuNHJ5LTdIcTJ4"}}}"#;
    let lines = watch_lines(
        "/apis/apps/v1/deployments?watch=true",
        format!("{other}\n").as_bytes(),
        64,
    )
    .await;
    assert_eq!(lines.len(), 1);
    assert_clean("the stream", &lines[0]);

    // A last line cut short by the end of the stream is dropped, as kube drops it.
    let lines = watch_lines(
        "/api/v1/secrets?watch=true",
        format!("{good}\n{{\"type\":\"ADDED\",\"object\":{{\"data\":{{\"k\":\"YzRu").as_bytes(),
        3,
    )
    .await;
    assert_eq!(lines, vec![good.to_owned()]);
    // A last line without its newline that parses passes.
    let lines = watch_lines("/api/v1/secrets?watch=true", good.as_bytes(), 3).await;
    assert_eq!(lines, vec![good.to_owned()]);
}

/// The lines a watch of `path` becomes when the server sends `input` after `after` and ends it.
async fn watch_lines_after(path: &str, input: &'static str, after: Duration) -> Vec<String> {
    let mut svc = SanitizeLayer { reads: ALL }.layer(tower::service_fn(
        move |_req: Request<Body>| async move {
            let body = futures::stream::once(async move {
                tokio::time::sleep(after).await;
                Ok::<_, Infallible>(Frame::data(Bytes::from_static(input.as_bytes())))
            });
            Ok::<_, Infallible>(Response::new(StreamBody::new(body.boxed())))
        },
    ));
    let response = svc.call(get(path)).await.unwrap();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec())
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_resumed_watch_ended_at_once_without_a_line_ends_with_a_410() {
    let resumed = "/api/v1/secrets?watch=true&resourceVersion=5&allowWatchBookmarks=true";
    let lines = watch_lines_after(resumed, "", Duration::from_millis(5)).await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    let event: Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(event["type"], "ERROR");
    assert_eq!(
        event["object"]["code"], 410,
        "kube-runtime lists again on a 410"
    );
    assert_eq!(event["object"]["reason"], "Expired");

    let bookmark = "{\"type\":\"BOOKMARK\",\"object\":{\"kind\":\"Secret\",\"apiVersion\":\"v1\",\"metadata\":{\"resourceVersion\":\"6\"}}}\n";
    for (path, input, after, why) in [
        (
            resumed,
            bookmark,
            Duration::ZERO,
            "a watch that sent a line worked",
        ),
        (
            resumed,
            "",
            2 * SHORT_WATCH,
            "a watch that lasted ended for a reason of its own",
        ),
        (
            "/api/v1/secrets?watch=true",
            "",
            Duration::ZERO,
            "a watch from now",
        ),
        (
            "/api/v1/secrets?watch=true&resourceVersion=0",
            "",
            Duration::ZERO,
            "a watch from any version",
        ),
        (
            "/api/v1/secrets?watch=true&resourceVersion=5&sendInitialEvents=true",
            "",
            Duration::ZERO,
            "a streaming list (its own failures are counted by the watch)",
        ),
    ] {
        let lines = watch_lines_after(path, input, after).await;
        assert!(
            lines.iter().all(|l| !l.contains("\"ERROR\"")),
            "{why}: {lines:?}"
        );
    }
}

/// An API server that closes every watch from a version at once, saying nothing (as it does for
/// a version it cannot serve in some states): kube-runtime's watcher would resume from the same
/// version for ever and never see a change; through the layer it lists again, and the change
/// the second list holds is seen.
#[tokio::test]
async fn a_watch_closed_at_once_again_and_again_lists_again_and_sees_the_change() {
    let lists = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = lists.clone();
    let client = client(move |_method, target| {
        if target.contains("watch=true") {
            return (200, String::new());
        }
        let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let item = json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s", "namespace": "a", "resourceVersion": (n + 2).to_string()},
            "data": {"k": if n == 0 { "b2xk" } else { "bmV3" }}});
        (
            200,
            json!({"kind": "SecretList", "apiVersion": "v1",
                "metadata": {"resourceVersion": (n + 2).to_string()}, "items": [item]})
            .to_string(),
        )
    });
    let api: Api<Secret> = Api::all(client);
    let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
    let seen = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(event) = stream.next().await {
            if let Ok(watcher::Event::InitApply(s)) = event
                && s.data.unwrap()["k"].0 == b"new"
            {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(seen, Ok(true), "the second list's change was never seen");
    assert!(lists.load(std::sync::atomic::Ordering::SeqCst) >= 2);
}

#[tokio::test]
async fn a_watch_line_longer_than_the_bound_ends_the_watch() {
    let mut input = br#"{"type":"ADDED","object":{"kind":"Secret","data":{"k":""#.to_vec();
    input.resize(MAX_WATCH_LINE_BYTES + 10, b'A');
    let lines = watch_lines("/api/v1/secrets?watch=true", &input, 1 << 20).await;
    assert_eq!(lines.len(), 1);
    let event: Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(event["object"]["code"], 500);
}

#[tokio::test]
async fn kube_keeps_working_and_logs_nothing_the_server_chose() {
    let (logs, _guard) = capture();
    let client = client(|method, target| {
        let status = |code: u16, reason: &str| {
            (
                code,
                json!({"kind": "Status", "code": code, "reason": reason,
                "message": format!("c4n4ry-7Hq2x {}", canary_b64())})
                .to_string(),
            )
        };
        match (method.as_str(), target) {
            ("GET", t) if t.starts_with("/api/v1/namespaces/a/secrets/absent") => {
                status(404, "NotFound")
            }
            ("POST", t) if t.starts_with("/api/v1/namespaces/a/secrets") => {
                status(409, "AlreadyExists")
            }
            ("PUT", _) => status(409, "Conflict"),
            ("GET", t) if t.starts_with("/api/v1/namespaces/a/secrets/denied") => {
                status(403, "Forbidden")
            }
            ("GET", t) if t.starts_with("/api/v1/namespaces/a/secrets/mistyped") => (
                200,
                json!({"kind": "Secret", "data": {"k": "c4n4ry-7Hq2x"}}).to_string(),
            ),
            ("GET", t) if t.starts_with("/api/v1/namespaces/a/configmaps/secret") => (
                200,
                json!({"kind": "Secret", "apiVersion": "v1", "metadata": {"name": "x"},
                    "data": {"k": canary_b64()}})
                .to_string(),
            ),
            _ => (500, "<html>c4n4ry-7Hq2x</html>".to_owned()),
        }
    });
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "a");
    assert!(
        secrets.get_opt("absent").await.unwrap().is_none(),
        "404 NotFound is None"
    );
    let err = secrets
        .create(&PostParams::default(), &Secret::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists"),
        "{err:?}"
    );
    let err = secrets
        .replace("x", &PostParams::default(), &Secret::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.is_conflict()),
        "{err:?}"
    );
    let err = secrets.get("denied").await.unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.is_forbidden()),
        "{err:?}"
    );
    let mut errors = vec![format!("{err:?}")];
    for name in ["mistyped", "other"] {
        let err = secrets.get(name).await.unwrap_err();
        assert!(
            matches!(&err, kube::Error::Api(s) if s.code == 500),
            "{err:?}"
        );
        errors.push(format!("{err:?} {err}"));
    }
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "a");
    let err = maps.get("secret").await.unwrap_err();
    errors.push(format!("{err:?} {err}"));
    let err = secrets.list(&ListParams::default()).await.unwrap_err();
    errors.push(format!("{err:?} {err}"));
    drop(_guard);
    assert_clean("the errors", &errors.join("\n"));
    let logs = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    assert!(
        logs.contains("Unsuccessful"),
        "kube logged its errors: {logs}"
    );
    assert_clean("the logs", &logs);
}

#[tokio::test]
async fn the_watcher_still_relists_on_410_and_logs_nothing_the_server_chose() {
    let (logs, _guard) = capture();
    let lists = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = lists.clone();
    let watches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let client = client(move |_method, target| {
        if target.contains("watch=true") {
            let n = watches.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let added = json!({"type": "ADDED", "object": {"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "s", "namespace": "a", "resourceVersion": "2"},
                "data": {"k": canary_b64()}}});
            let gone = json!({"type": "ERROR", "object": {"kind": "Status", "code": 410,
                "reason": "Expired", "message": "c4n4ry-7Hq2x"}});
            let bad =
                r#"{"type":"MODIFIED","object":{"kind":"Secret","data":{"k":"c4n4ry-7Hq2x"}}}"#;
            // The watch ends at a line that does not decode; the watcher watches again,
            // and relists after a 410.
            if n.is_multiple_of(2) {
                (200, format!("{added}\n{bad}\n{added}\n"))
            } else {
                (200, format!("{added}\n{gone}\n"))
            }
        } else {
            let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if n.is_multiple_of(2) {
                (
                    200,
                    r#"{"kind":"SecretList","items":"c4n4ry-7Hq2x"}"#.to_owned(),
                )
            } else {
                (
                    200,
                    json!({"kind": "SecretList", "apiVersion": "v1",
                    "metadata": {"resourceVersion": "1"}, "items": []})
                    .to_string(),
                )
            }
        }
    });
    let api: Api<Secret> = Api::all(client);
    let mut errors = Vec::new();
    let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
    let mut applied = 0;
    for _ in 0..1000 {
        if lists.load(std::sync::atomic::Ordering::SeqCst) >= 5 {
            break;
        }
        match stream.next().await.unwrap() {
            Ok(watcher::Event::Apply(s)) => {
                applied += 1;
                assert_eq!(s.data.unwrap()["k"].0, CANARY.as_bytes());
            }
            Ok(_) => {}
            Err(e) => errors.push(format!("{e:?} {e}")),
        }
    }
    drop(_guard);
    assert!(
        lists.load(std::sync::atomic::Ordering::SeqCst) >= 5,
        "{errors:?}"
    );
    assert!(applied >= 1);
    assert!(errors.iter().any(|e| e.contains("500")), "{errors:?}");
    assert!(errors.iter().any(|e| e.contains("410")), "{errors:?}");
    assert_clean("the errors", &errors.join("\n"));
    let logs = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    assert_clean("the logs", &logs);
}

#[test]
fn a_resource_no_part_declared_is_withheld_and_says_why() {
    let get = |path: &str| Request::builder().uri(path).body(()).unwrap();
    let configmaps = "/api/v1/namespaces/a/configmaps/b";
    assert_eq!(
        Expect::of(&get(configmaps), Reads::of(&[Resource::Secrets])),
        Expect::Undeclared
    );
    assert!(matches!(
        Expect::of(&get(configmaps), Reads::of(&[Resource::ConfigMaps])),
        Expect::Typed(Ty::ConfigMap, Shape::Object)
    ));
    // Discovery needs no declaration; an unknown resource stays unknown.
    assert!(matches!(
        Expect::of(&get("/api/v1"), Reads::NONE),
        Expect::Typed(Ty::ApiResourceList, _)
    ));
    assert_eq!(
        Expect::of(&get("/api/v1/namespaces/a/serviceaccounts/b"), ALL),
        Expect::Unknown
    );
    assert!(UNDECLARED.contains("Resource"));
}

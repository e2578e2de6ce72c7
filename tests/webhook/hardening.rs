//! What a forged review can make the webhook do: which requests it sends (none for a namespace
//! or name that is not a Kubernetes name, none in excluded namespaces, none over
//! `--max-references`), how reads are shared among reviews, and that the bytes of what it reads
//! count against the review memory budget.

use crate::build;
use crate::harness;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use build::{NS, Review, Workload, config_map, deployment, marker_of, patched, stamp_of};
use confighash::core::names::UNSTAMPED_ANNOTATION as MARKER;
use confighash::core::refs::ObjectRef;
use confighash::webhook::admission::DEFAULT_MAX_REFERENCES;
use confighash::webhook::budget::MemoryBudget;
use confighash::webhook::lookup::{Fetched, MAX_CONCURRENT_READS, ObjectSource, ReadError};
use futures::future::BoxFuture;
use harness::Harness;
use serde_json::{Value, json};

const KEY: &[u8] = b"hardening.rs: a key of 32 bytes!";

/// The in-memory API server with namespaces `shop`, `kube-system`, `confighash` and `tenant-x`,
/// each holding ConfigMap `web` with `data` under key `app.conf`.
async fn api_with_config_map(data: &str) -> Harness {
    let namespaces = [NS, "kube-system", "confighash", "tenant-x"];
    let h = Harness::start(&namespaces, KEY).await;
    for ns in namespaces {
        build::create(&h.client, ns, config_map("web", &[("app.conf", data)])).await;
    }
    h
}

/// A Deployment mounting ConfigMap `web`, naming `extra` more through the extra annotation.
fn web(namespace: &str, extra: &[String], template_annotations: Value) -> Workload {
    deployment("web")
        .in_namespace(namespace)
        .extra_config_maps(extra)
        .config_map_volume("cfg", "web", &[])
        .template_annotations(template_annotations)
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("extra-{i}")).collect()
}

#[tokio::test]
async fn a_namespace_or_name_that_is_not_a_kubernetes_name_is_refused_before_any_read() {
    let h = api_with_config_map("a").await;
    let webhook = h.webhook();
    let before = h.api.requests().len();
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
        let object = web(namespace, &[], json!({})).json();
        let err = webhook
            .answer(&Review::create(&object).bytes())
            .await
            .expect_err(namespace);
        assert_eq!(err.status(), 400, "{namespace}: {}", err.message());
        assert!(err.message().contains("namespace"), "{}", err.message());
    }
    // A review without a namespace at all.
    let mut body = Review::create(&web(NS, &[], json!({})).json()).json();
    body["request"].as_object_mut().unwrap().remove("namespace");
    let err = webhook
        .answer(body.to_string().as_bytes())
        .await
        .unwrap_err();
    assert_eq!(err.status(), 400);
    // And a workload name that is not an object name.
    let mut body = Review::create(&web(NS, &[], json!({})).json()).json();
    body["request"]["name"] = json!("web\nlevel=error msg=forged");
    let err = webhook
        .answer(body.to_string().as_bytes())
        .await
        .unwrap_err();
    assert_eq!(err.status(), 400);
    assert_eq!(
        h.api.requests().len(),
        before,
        "no request reached the API server: {:?}",
        &h.api.requests()[before..]
    );
    // The same review in a valid namespace is read and stamped.
    read_and_stamped_in_shop(&webhook, &h).await;
}

/// A review of a workload in `shop` using ConfigMap `web` is read (the harness's first read)
/// and stamped.
async fn read_and_stamped_in_shop(webhook: &confighash::webhook::admission::Webhook, h: &Harness) {
    let object = web(NS, &[], json!({})).json();
    let reply = webhook
        .answer(&Review::create(&object).bytes())
        .await
        .unwrap();
    assert!(stamp_of(&patched(&object, &reply)).is_some());
    assert_eq!(h.reads(), 1);
}

#[tokio::test]
async fn objects_in_kube_system_its_own_and_excluded_namespaces_are_never_read() {
    let h = api_with_config_map("a").await;
    let webhook = h
        .webhook()
        .with_excluded_namespaces(["confighash".to_owned(), "tenant-x".to_owned()]);
    for namespace in ["kube-system", "confighash", "tenant-x"] {
        let object = web(namespace, &[], json!({})).json();
        let reply = webhook
            .answer(&Review::create(&object).bytes())
            .await
            .unwrap();
        assert_eq!(reply["response"]["allowed"], true);
        assert!(reply["response"]["patch"].is_null(), "{namespace}: {reply}");
    }
    assert_eq!(h.reads(), 0, "{:?}", h.api.requests());
}

/// Least-privilege mode: forged reviews of workloads outside `--watch-namespaces` (whatever
/// labels they claim) cause no read; inside the list they are read and stamped as usual.
#[tokio::test]
async fn objects_outside_watch_namespaces_are_never_read() {
    let h = api_with_config_map("a").await;
    let webhook = h
        .webhook()
        .with_watch_namespaces(Some([NS.to_owned()].into()));
    for labels in [json!({}), json!({"confighash.dev/enabled": "true"})] {
        let mut object = web("tenant-x", &names(20), json!({})).json();
        object["metadata"]["labels"] = labels;
        for body in [
            Review::create(&object).bytes(),
            Review::update(&object, &object).bytes(),
        ] {
            let reply = webhook.answer(&body).await.unwrap();
            assert_eq!(reply["response"]["allowed"], true);
            assert!(reply["response"]["patch"].is_null(), "{reply}");
        }
    }
    assert_eq!(h.reads(), 0, "{:?}", h.api.requests());
    read_and_stamped_in_shop(&webhook, &h).await;
}

#[tokio::test]
async fn a_workload_over_max_references_is_marked_for_good_and_nothing_is_read() {
    let h = api_with_config_map("a").await;
    let webhook = h.webhook();
    // The attack's review: ten thousand names, about 90 KB.
    let many = names(10_000);
    let object = web(NS, &many, json!({})).json();
    let body = Review::create(&object).bytes();
    assert!(body.len() > 90_000, "{} bytes", body.len());
    let reply = webhook.answer(&body).await.unwrap();
    let created = patched(&object, &reply);
    assert_eq!(marker_of(&created).as_deref(), Some("too-many-references"));
    assert_eq!(stamp_of(&created), None);
    assert_eq!(h.reads(), 0);
    assert_eq!(
        webhook
            .metrics()
            .requests("Deployment", "CREATE", "too-many-references"),
        1
    );

    // Exactly at the limit is read; one more is not.
    let at_limit = names(DEFAULT_MAX_REFERENCES - 1); // plus ConfigMap web
    let object = web(NS, &at_limit, json!({})).json();
    let reply = webhook
        .answer(&Review::create(&object).bytes())
        .await
        .unwrap();
    let stamped = patched(&object, &reply);
    assert!(stamp_of(&stamped).is_some() && marker_of(&stamped).is_none());
    assert_eq!(h.reads(), DEFAULT_MAX_REFERENCES);

    // An UPDATE that grows a stamped workload past the limit keeps its stamp, reads nothing.
    let grown = web(
        NS,
        &names(DEFAULT_MAX_REFERENCES),
        stamped["spec"]["template"]["metadata"]["annotations"].clone(),
    )
    .json();
    let before = h.reads();
    let reply = webhook
        .answer(&Review::update(&grown, &stamped).bytes())
        .await
        .unwrap();
    let updated = patched(&grown, &reply);
    assert_eq!(stamp_of(&updated), stamp_of(&stamped));
    assert_eq!(h.reads(), before);

    // The marked workload, edited below the limit, is stamped and loses the marker.
    let edited = web(NS, &names(3), json!({})).json();
    let mut edited = edited;
    edited["metadata"]["annotations"][MARKER] = json!("too-many-references");
    let reply = webhook
        .answer(&Review::update(&edited, &created).bytes())
        .await
        .unwrap();
    let fixed = patched(&edited, &reply);
    assert!(stamp_of(&fixed).is_some());
    assert_eq!(marker_of(&fixed), None);
}

/// A workload whose references hold more than `--max-reference-bytes`: reading stops once past
/// the limit, a CREATE gets the `too-large` marker, an UPDATE keeps its stamp, and once the
/// references fit again it is stamped and loses the marker.
#[tokio::test]
async fn a_workload_over_max_reference_bytes_is_marked_too_large_and_reading_stops() {
    let h = api_with_config_map("a").await;
    let blob = "x".repeat(256 << 10);
    let big = names(40);
    for name in &big {
        build::create(&h.client, NS, config_map(name, &[("blob", &blob)])).await;
    }
    let webhook = h.webhook().with_max_reference_bytes(1 << 20);

    // Forty objects of 256 KiB against a limit of 1 MiB.
    let before = h.reads();
    let object = web(NS, &big, json!({})).json();
    let reply = webhook
        .answer(&Review::create(&object).bytes())
        .await
        .unwrap();
    let created = patched(&object, &reply);
    assert_eq!(marker_of(&created).as_deref(), Some("too-large"));
    assert_eq!(stamp_of(&created), None);
    let reads = h.reads() - before;
    assert!(
        reads <= 5 + MAX_CONCURRENT_READS,
        "{reads} of 41 objects read: reading goes on past the limit"
    );
    assert_eq!(
        webhook
            .metrics()
            .requests("Deployment", "CREATE", "too-large"),
        1
    );

    // Three objects fit (768 KiB and ConfigMap web): stamped.
    let fits = web(NS, &big[..3], json!({})).json();
    let reply = webhook
        .answer(&Review::create(&fits).bytes())
        .await
        .unwrap();
    let stamped = patched(&fits, &reply);
    assert!(stamp_of(&stamped).is_some() && marker_of(&stamped).is_none());

    // An UPDATE that grows it past the limit keeps its stamp and adds no marker.
    let grown = web(
        NS,
        &big[..8],
        stamped["spec"]["template"]["metadata"]["annotations"].clone(),
    )
    .json();
    let reply = webhook
        .answer(&Review::update(&grown, &stamped).bytes())
        .await
        .unwrap();
    let updated = patched(&grown, &reply);
    assert_eq!(stamp_of(&updated), stamp_of(&stamped));
    assert_eq!(marker_of(&updated), None);

    // The marked workload, edited to fit, is stamped and loses the marker.
    let mut edited = web(NS, &big[..2], json!({})).json();
    edited["metadata"]["annotations"][MARKER] = json!("too-large");
    let reply = webhook
        .answer(&Review::update(&edited, &created).bytes())
        .await
        .unwrap();
    let fixed = patched(&edited, &reply);
    assert!(stamp_of(&fixed).is_some());
    assert_eq!(marker_of(&fixed), None);
}

/// Answers reads in the order they start once released by the test, recording which review
/// (by namespace) each read belongs to.
struct Gated {
    started: Mutex<Vec<String>>,
    release: tokio::sync::Semaphore,
    in_flight: AtomicUsize,
    most: AtomicUsize,
}

impl ObjectSource for Gated {
    fn fetch<'a>(
        &'a self,
        namespace: &'a str,
        _object: &'a ObjectRef,
        _budget: &'a MemoryBudget,
    ) -> BoxFuture<'a, Result<Option<Fetched>, ReadError>> {
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
        harness::webhook(source.clone(), KEY)
            .with_max_reads_in_flight(CAP)
            .with_lookup_deadline(Duration::from_secs(60)),
    );
    let mut tasks = Vec::new();
    for i in 0..LARGE {
        let webhook = webhook.clone();
        let ns = format!("flood-{i}");
        tasks.push(tokio::spawn(async move {
            let object = web(&ns, &names(200), json!({})).json();
            webhook.answer(&Review::create(&object).bytes()).await
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
            let object = web(NS, &names(1), json!({})).json();
            webhook.answer(&Review::create(&object).bytes()).await
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
    let h = api_with_config_map(&"x".repeat(1 << 20)).await;
    let webhook = h.webhook();
    let object = web(NS, &[], json!({})).json();
    // Too small a budget for the object: the lookup fails (rule 1), nothing is stamped.
    let small = MemoryBudget::new(512 * 1024);
    let reply = webhook
        .answer_within(&Review::create(&object).bytes(), &small)
        .await
        .unwrap();
    let created = patched(&object, &reply);
    assert_eq!(marker_of(&created).as_deref(), Some("lookup-failed"));
    assert_eq!(small.in_use(), 0, "what the read held is given back");
    // With room for it, it is read and stamped, and the budget is whole again afterwards.
    let budget = MemoryBudget::new(8 << 20);
    let reply = webhook
        .answer_within(&Review::create(&object).bytes(), &budget)
        .await
        .unwrap();
    assert!(stamp_of(&patched(&object, &reply)).is_some());
    assert_eq!(budget.in_use(), 0);
}

#[tokio::test]
async fn a_create_right_after_a_config_write_sees_the_write_under_concurrent_reviews() {
    let h = api_with_config_map("v1").await;
    h.api.set_delay(Duration::from_millis(30));
    let webhook = Arc::new(h.webhook());
    let object = web(NS, &[], json!({})).json();
    // Reviews of the same workload keep arriving while the ConfigMap is written.
    let mut stamps_by_content: BTreeMap<&str, String> = BTreeMap::new();
    for content in ["v1", "v2"] {
        let reply = webhook
            .answer(&Review::create(&object).bytes())
            .await
            .unwrap();
        let expected = stamp_of(&patched(&object, &reply)).unwrap().to_owned();
        stamps_by_content.insert(content, expected);
        if content == "v1" {
            let background: Vec<_> = (0..8)
                .map(|_| {
                    let webhook = webhook.clone();
                    let object = object.clone();
                    tokio::spawn(
                        async move { webhook.answer(&Review::create(&object).bytes()).await },
                    )
                })
                .collect();
            h.put(NS, config_map("web", &[("app.conf", "v2")])).await;
            // At once after the write: this review must see v2, whatever is in flight.
            let reply = webhook
                .answer(&Review::create(&object).bytes())
                .await
                .unwrap();
            let after_write = stamp_of(&patched(&object, &reply)).unwrap().to_owned();
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

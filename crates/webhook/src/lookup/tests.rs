use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::budget::LARGE_ANSWERS_AT_ONCE;
use confighash_core::refs::Selection;

/// Answers every read after a yield, counting how many are in flight at once.
#[derive(Default)]
struct Counting {
    in_flight: AtomicUsize,
    most: AtomicUsize,
    reads: AtomicUsize,
    /// Every object found with values of this many bytes; none found at 0.
    size: u64,
}

impl ObjectSource for Counting {
    fn fetch<'a>(
        &'a self,
        _namespace: &'a str,
        _object: &'a ObjectRef,
        _budget: &'a MemoryBudget,
    ) -> BoxFuture<'a, Result<Option<Fetched>, ReadError>> {
        Box::pin(async move {
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            self.reads.fetch_add(1, Ordering::SeqCst);
            for _ in 0..3 {
                tokio::task::yield_now().await;
            }
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            Ok((self.size > 0).then(|| {
                Fetched::Entry(ObjectRecord {
                    ignored: false,
                    digest: ObjectDigest::from_digests([("k".to_owned(), Tag::Data, [0; 32])])
                        .with_bytes(self.size),
                })
            }))
        })
    }
}

fn many(n: usize) -> References {
    let mut refs = References::default();
    for i in 0..n {
        refs.add(
            ObjectKind::ConfigMap,
            &format!("cm-{i}"),
            Selection::Whole,
            true,
        );
    }
    refs
}

#[tokio::test]
async fn a_review_naming_many_objects_reads_a_few_at_a_time() {
    let refs = many(500);
    let source = Arc::new(Counting::default());
    let lookups = Lookups::new(source.clone(), 1000);
    let resolved = lookups
        .resolve(
            "shop",
            &refs,
            Duration::from_secs(30),
            &Metrics::new(),
            &MemoryBudget::new(1 << 20),
            u64::MAX,
        )
        .await
        .unwrap();
    assert_eq!(
        source.reads.load(Ordering::SeqCst),
        500,
        "every object is read"
    );
    let most = source.most.load(Ordering::SeqCst);
    assert!(
        (2..=MAX_CONCURRENT_READS).contains(&most),
        "{most} reads in flight at once"
    );
    assert_eq!(resolved.absent_required(&refs).count(), 0);
    assert_eq!(lookups.places_free(), 1000, "every place is given back");
}

#[tokio::test]
async fn reviews_together_keep_to_the_shared_cap() {
    let refs = many(200);
    let source = Arc::new(Counting::default());
    let lookups = Lookups::new(source.clone(), 5);
    let budget = MemoryBudget::new(1 << 20);
    let metrics = Metrics::new();
    let reviews = (0..8).map(|_| {
        lookups.resolve(
            "shop",
            &refs,
            Duration::from_secs(30),
            &metrics,
            &budget,
            u64::MAX,
        )
    });
    for result in futures::future::join_all(reviews).await {
        result.unwrap();
    }
    assert_eq!(source.reads.load(Ordering::SeqCst), 1600);
    let most = source.most.load(Ordering::SeqCst);
    assert!((2..=5).contains(&most), "{most} reads in flight at once");
    assert_eq!(lookups.places_free(), 5);
}

#[tokio::test]
async fn a_lookup_stops_reading_once_past_its_bytes() {
    let refs = many(256);
    let source = Arc::new(Counting {
        size: 1 << 20,
        ..Counting::default()
    });
    let lookups = Lookups::new(source.clone(), 1000);
    let metrics = Metrics::new();
    let result = lookups
        .resolve(
            "shop",
            &refs,
            Duration::from_secs(30),
            &metrics,
            &MemoryBudget::new(1 << 20),
            4 << 20,
        )
        .await;
    match result {
        Err(LookupError::TooLarge { bytes, max }) => {
            assert_eq!(max, 4 << 20);
            assert_eq!(bytes, 5 << 20, "stopped at the first read past the limit");
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    let reads = source.reads.load(Ordering::SeqCst);
    assert!(
        reads <= 5 + MAX_CONCURRENT_READS,
        "{reads} of 256 objects read for a limit of 4 objects"
    );
    assert_eq!(lookups.places_free(), 1000, "every place is given back");
    // Under the limit, everything is read.
    let fits = lookups
        .resolve(
            "shop",
            &many(4),
            Duration::from_secs(30),
            &metrics,
            &MemoryBudget::new(1 << 20),
            4 << 20,
        )
        .await
        .unwrap();
    assert_eq!(fits.objects.len(), 4);
}

#[tokio::test]
async fn a_review_past_a_mebibyte_reads_as_heavy() {
    let refs = many(40);
    let source = Arc::new(Counting {
        size: 512 << 10,
        ..Counting::default()
    });
    // 8 places: 2 for heavy reads. Once 1 MiB is in, at most 2 reads are in flight.
    let lookups = Lookups::new(source.clone(), 8);
    lookups
        .resolve(
            "shop",
            &refs,
            Duration::from_secs(30),
            &Metrics::new(),
            &MemoryBudget::new(1 << 20),
            u64::MAX,
        )
        .await
        .unwrap();
    assert_eq!(source.reads.load(Ordering::SeqCst), 40);
    assert_eq!(lookups.places_free(), 8);
    assert_eq!(lookups.fair.heavy_in_flight(), 0);
}

#[tokio::test]
async fn large_answers_are_read_a_few_at_a_time_and_small_ones_never_wait_for_them() {
    use http_body_util::Full;
    use hyper::body::Bytes;
    let budget = MemoryBudget::new(64 << 20);
    let large = || Full::new(Bytes::from(vec![b'x'; LARGE_ANSWER_BYTES + 1]));
    let mut held = Vec::new();
    for _ in 0..LARGE_ANSWERS_AT_ONCE {
        held.push(read_limited(large(), None, &budget).await.unwrap());
    }
    // The next large answer waits for one of them; a small one does not.
    let waiting = read_limited(large(), None, &budget);
    tokio::pin!(waiting);
    assert!(
        futures::poll!(waiting.as_mut()).is_pending(),
        "a ninth large answer is read while eight are held"
    );
    let (small, _permits) = read_limited(
        Full::new(Bytes::from(vec![b'y'; LARGE_ANSWER_BYTES])),
        None,
        &budget,
    )
    .await
    .unwrap();
    assert_eq!(small.len(), LARGE_ANSWER_BYTES);
    held.pop();
    let (body, _permits) = waiting.await.unwrap();
    assert_eq!(body.len(), LARGE_ANSWER_BYTES + 1);
}

fn entry(kind: ObjectKind, body: &str) -> Result<ObjectRecord, ReadError> {
    decode_object(&ObjectRef::new(kind, "x"), body.as_bytes())
}

#[test]
fn decoding_reads_what_the_typed_objects_read() {
    let cm: ConfigMap = serde_json::from_str(
        r#"{"kind":"ConfigMap","metadata":{"name":"x"},"data":{"a":"1\n\u00e9","b":""},
            "binaryData":{"c":"iVBORw=="}}"#,
    )
    .unwrap();
    let body = serde_json::to_string(&cm).unwrap();
    assert_eq!(
        entry(ObjectKind::ConfigMap, &body).unwrap(),
        ObjectRecord::config_map(&cm).unwrap()
    );
    let secret: Secret = serde_json::from_str(
        r#"{"kind":"Secret","metadata":{"name":"x","annotations":{"o":"p"}},
            "data":{"password":"czNjcmV0","user":"YXBw"},"type":"Opaque"}"#,
    )
    .unwrap();
    let body = serde_json::to_string(&secret).unwrap();
    assert_eq!(
        entry(ObjectKind::Secret, &body).unwrap(),
        ObjectRecord::secret(&secret)
    );
    let ignored =
        r#"{"metadata":{"annotations":{"confighash.dev/ignore":"true"}},"data":{"a":"b"}}"#;
    assert!(entry(ObjectKind::ConfigMap, ignored).unwrap().ignored);
    // The decoded bytes of the values, each key once (the last of duplicates).
    let bytes = |kind, body: &str| {
        use confighash_core::checksum::Entries;
        entry(kind, body).unwrap().digest.bytes()
    };
    assert_eq!(
        bytes(ObjectKind::ConfigMap, &serde_json::to_string(&cm).unwrap()),
        4 + 4
    );
    assert_eq!(
        bytes(ObjectKind::Secret, &serde_json::to_string(&secret).unwrap()),
        6 + 3
    );
    assert_eq!(
        bytes(ObjectKind::ConfigMap, r#"{"data":{"a":"xx","a":"y"}}"#),
        1
    );
}

#[test]
fn decoding_errors_never_quote_the_answer() {
    let canary = "c4n4ry-hunter2";
    let bodies = [
        canary.to_string(),
        format!(r#"{{"data":"{canary}"}}"#),
        format!(r#"{{"data":{{"k":"{canary}"}}}}"#),
        format!(r#"{{"data":{{"k":["{canary}"]}}}}"#),
        format!(r#"{{"kind":"{canary}","data":{{}}}}"#),
        format!(r#"{{"metadata":{{"annotations":{{"a":1}}}},"x":"{canary}"}}"#),
        format!(r#"{{"data":{{"k":"{canary}""#),
        format!(r#"{{"binaryData":{{"k":"{canary}"}}}}"#),
    ];
    for body in &bodies {
        for kind in [ObjectKind::ConfigMap, ObjectKind::Secret] {
            if let Err(e) = entry(kind, body) {
                let (text, debug) = (e.to_string(), format!("{e:?}"));
                for shown in [text, debug] {
                    assert!(!shown.contains("c4n4ry"), "{shown}");
                    assert!(!shown.contains("hunter"), "{shown}");
                }
            }
        }
    }
    assert!(entry(ObjectKind::Secret, &bodies[2]).is_err(), "not base64");
    assert!(entry(ObjectKind::ConfigMap, &bodies[1]).is_err());
    assert!(
        entry(ObjectKind::ConfigMap, &bodies[4]).is_err(),
        "another kind"
    );
}

#[test]
fn paths_are_built_only_from_valid_names() {
    let cm = |n: &str| ObjectRef::new(ObjectKind::ConfigMap, n);
    assert_eq!(
        object_path("shop", &cm("web.conf")).unwrap(),
        "/api/v1/namespaces/shop/configmaps/web.conf"
    );
    for ns in [
        "kube-system/secrets/admin-token?",
        "secrets?",
        "docs?watch=true&x=",
        "..",
        "",
        "a%2fb",
        "Shop",
        "a.b",
    ] {
        assert_eq!(
            object_path(ns, &cm("any")),
            Err(PathError::Namespace),
            "{ns}"
        );
    }
    for name in ["../x", "a/b", "a?b", "", "A", "a b"] {
        assert_eq!(
            object_path("shop", &cm(name)),
            Err(PathError::Name),
            "{name}"
        );
    }
}

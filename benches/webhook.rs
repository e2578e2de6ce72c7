//! Handler CPU of the webhook for one UPDATE review of a ~10 KiB Deployment that references 10
//! ConfigMaps and Secrets (served from memory), versus parsing the same request body into a
//! `serde_json::Value`.
//!
//! The machine these run on is shared, so only the ratio between the parse baseline and
//! `Webhook::answer`, measured in the same group of the same run, is meaningful. The baseline is
//! registered first.
//!
//! The fixture (Deployment, review body, the 10 referenced objects, the in-memory source) is
//! repeated in `benches/webhook_tls.rs`, which sends the same review over TLS; keep the two
//! copies the same.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use confighash::certs::key::KeyStore;
use confighash::metrics::Metrics;
use confighash::webhook::admission::Webhook;
use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::Value;

use fixture::{KEY, MemorySource, ReviewFixture};

use confighash_testkit::bench::fixture;

fn webhook() -> Webhook {
    Webhook::new(
        Arc::new(MemorySource::new()),
        Arc::new(KeyStore::new(
            confighash::core::checksum::StampKey::new(KEY.to_vec()).expect("a long enough key"),
        )),
        Arc::new(Metrics::new()),
    )
    .with_lookup_deadline(Duration::from_secs(2))
}

/// Rounds and calls per block of [`interleaved_ratio`].
const ROUNDS: usize = 40;
const BLOCK: u32 = 25;

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    }
}

/// A cross-check of criterion's ratio that drift on the shared machine cannot skew: `ROUNDS`
/// rounds, each timing a block of `BLOCK` parses and a block of `BLOCK` answers back to back
/// (the order alternating between rounds). Returns the median per-round ratio answer/parse and
/// the median time per call of each.
fn interleaved_ratio(
    rt: &tokio::runtime::Runtime,
    webhook: &Webhook,
    body: &[u8],
) -> (f64, Duration, Duration) {
    let parse_block = || {
        let t = Instant::now();
        for _ in 0..BLOCK {
            black_box(serde_json::from_slice::<Value>(black_box(body)).expect("JSON"));
        }
        t.elapsed()
    };
    let answer_block = || {
        let t = Instant::now();
        for _ in 0..BLOCK {
            black_box(
                rt.block_on(webhook.answer(black_box(body)))
                    .expect("a review"),
            );
        }
        t.elapsed()
    };
    let (mut ratios, mut parses, mut answers) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let (parse, answer) = if round.is_multiple_of(2) {
            let p = parse_block();
            (p, answer_block())
        } else {
            let a = answer_block();
            (parse_block(), a)
        };
        ratios.push(answer.as_secs_f64() / parse.as_secs_f64());
        parses.push(parse.as_secs_f64() / f64::from(BLOCK));
        answers.push(answer.as_secs_f64() / f64::from(BLOCK));
    }
    (
        median(&mut ratios),
        Duration::from_secs_f64(median(&mut parses)),
        Duration::from_secs_f64(median(&mut answers)),
    )
}

fn bench_answer(c: &mut Criterion) {
    fixture::check_references();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let webhook = webhook();

    // A stale stamp: the answer carries a patch that replaces it.
    let ReviewFixture { body, object_len } = fixture::review(&fixture::stale_stamp());
    let answer = rt.block_on(webhook.answer(&body)).expect("a review");
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert_eq!(answer["response"]["uid"], fixture::UID);
    let expected = fixture::patched_stamp(&answer).expect("a stale stamp is replaced");

    // The same review with the right stamp on both objects: allowed without a patch.
    let ReviewFixture {
        body: body_unchanged,
        ..
    } = fixture::review(&expected);
    let answer = rt
        .block_on(webhook.answer(&body_unchanged))
        .expect("a review");
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert!(answer["response"].get("patch").is_none(), "{answer}");

    println!(
        "review body: {} bytes (object {} bytes, oldObject the same but one env value), {} references",
        body.len(),
        object_len,
        fixture::REFERENCES
    );

    let (ratio, parse, answer) = interleaved_ratio(&rt, &webhook, &body);
    println!(
        "interleaved check ({ROUNDS} rounds of {BLOCK} calls each): answer/parse median {ratio:.2}x \
         (parse {:.1} µs, answer {:.1} µs per call, medians)",
        parse.as_secs_f64() * 1e6,
        answer.as_secs_f64() * 1e6
    );

    let mut group = c.benchmark_group("webhook_update_10KiB_10_refs");
    group.bench_function("serde_json_from_slice_value", |b| {
        b.iter(|| serde_json::from_slice::<Value>(black_box(&body)).expect("JSON"))
    });
    group.bench_function("answer", |b| {
        b.iter(|| {
            rt.block_on(webhook.answer(black_box(&body)))
                .expect("a review")
        })
    });
    group.bench_function("answer_no_patch", |b| {
        b.iter(|| {
            rt.block_on(webhook.answer(black_box(&body_unchanged)))
                .expect("a review")
        })
    });
    group.finish();
}

criterion_group!(benches, bench_answer);
criterion_main!(benches);

//! Checksum of one 1 MiB ConfigMap versus plain SHA-256 over the same bytes.
//!
//! The machine these run on is shared, so only the ratio between the `sha2` baseline and the
//! stamp, measured in the same group of the same run, is meaningful. Every group reports
//! throughput over the 1 MiB of values; the baseline is registered first.

use std::collections::BTreeMap;
use std::hint::black_box;

use confighash::core::checksum::{ObjectView, RefState, StampKey, compute_stamp};
use confighash::core::refs::{ObjectKind, References, Selection};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use sha2::{Digest, Sha256};

const MIB: usize = 1 << 20;
const CM_NAME: &str = "app-config";
/// The namespace of the stamped workload (recipe v2 binds it).
const NAMESPACE: &str = "bench";

/// Deterministic, text-like filler of exactly `len` bytes (ASCII, so valid UTF-8), varied by
/// `seed` so no two values are the same.
fn filler(len: usize, seed: usize) -> String {
    let mut out = String::with_capacity(len + 64);
    let mut line = 0usize;
    while out.len() < len {
        out.push_str(&format!(
            "setting.{seed}.{line} = value-{:08x}-{}\n",
            line.wrapping_mul(2_654_435_761) ^ seed,
            "x".repeat(line % 23)
        ));
        line += 1;
    }
    out.truncate(len);
    out
}

/// A ConfigMap whose `data` holds `keys` values of `MIB / keys` bytes each.
fn config_map(keys: usize) -> ConfigMap {
    assert_eq!(MIB % keys, 0, "the values must add up to exactly 1 MiB");
    let data: BTreeMap<String, String> = (0..keys)
        .map(|i| (format!("file-{i:02}.conf"), filler(MIB / keys, i)))
        .collect();
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(CM_NAME.to_owned()),
            namespace: Some("default".to_owned()),
            ..ObjectMeta::default()
        },
        data: Some(data),
        ..ConfigMap::default()
    }
}

fn bench_variant(c: &mut Criterion, group_name: &str, keys: usize) {
    let cm = config_map(keys);
    let values: Vec<&[u8]> = cm
        .data
        .as_ref()
        .expect("data is set")
        .values()
        .map(String::as_bytes)
        .collect();
    let total: usize = values.iter().map(|v| v.len()).sum();
    assert_eq!(total, MIB);

    let view = ObjectView::config_map(&cm).expect("no key is in both data and binaryData");
    let mut refs = References::default();
    refs.add(ObjectKind::ConfigMap, CM_NAME, Selection::Whole, false);
    let key = StampKey::new(vec![7u8; 32]).expect("32 bytes is long enough");

    // Sanity checks outside the timed loops: both stamps are well formed and differ.
    let plain = compute_stamp(None, NAMESPACE, &refs, |_| RefState::Present(&view));
    let keyed = compute_stamp(Some(&key), NAMESPACE, &refs, |_| RefState::Present(&view));
    assert!(plain.as_str().starts_with("v2:plain:"));
    assert!(keyed.as_str().starts_with(&format!("v2:{}:", key.id())));
    assert_ne!(plain, keyed);

    let mut group = c.benchmark_group(group_name);
    group.throughput(Throughput::Bytes(total as u64));

    group.bench_function("sha2", |b| {
        b.iter(|| {
            let mut h = Sha256::new();
            for v in black_box(&values) {
                h.update(v);
            }
            h.finalize()
        })
    });
    group.bench_function("compute_stamp", |b| {
        b.iter(|| {
            compute_stamp(None, black_box(NAMESPACE), black_box(&refs), |_| {
                RefState::Present(black_box(&view))
            })
        })
    });
    group.bench_function("compute_stamp_hmac", |b| {
        b.iter(|| {
            compute_stamp(
                Some(black_box(&key)),
                black_box(NAMESPACE),
                black_box(&refs),
                |_| RefState::Present(black_box(&view)),
            )
        })
    });
    group.finish();
}

fn checksum(c: &mut Criterion) {
    bench_variant(c, "checksum_1MiB_1x1MiB", 1);
    bench_variant(c, "checksum_1MiB_64x16KiB", 64);
}

criterion_group!(benches, checksum);
criterion_main!(benches);

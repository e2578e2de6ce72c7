//! The golden vectors of checksum recipe v1 (DESIGN.md). These stamps are frozen: a change here
//! is a new recipe version, never an edit.

use std::collections::{BTreeMap, BTreeSet};

use confighash::checksum::{self, ObjectDigest, ObjectView, RefState, StampKey};
use confighash::refs::{ObjectKind, ObjectRef, References, Selection};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};

fn config_map(data: &[(&str, &str)], binary: &[(&str, &[u8])]) -> ConfigMap {
    ConfigMap {
        data: (!data.is_empty()).then(|| {
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        }),
        binary_data: (!binary.is_empty()).then(|| {
            binary
                .iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
                .collect()
        }),
        ..Default::default()
    }
}

fn secret(data: &[(&str, &str)]) -> Secret {
    Secret {
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Default::default()
    }
}

fn keys(keys: &[&str]) -> Selection {
    Selection::Keys(keys.iter().map(|k| k.to_string()).collect::<BTreeSet<_>>())
}

enum Obj {
    Cm(ConfigMap),
    Secret(Secret),
}

/// Computes a stamp twice, from whole objects and from per-key digests, and checks they agree.
fn stamp(
    key: Option<&StampKey>,
    refs: &[(ObjectKind, &str, Selection)],
    objects: &[(ObjectKind, &str, Obj)],
) -> String {
    let mut r = References::default();
    for (kind, name, sel) in refs {
        r.add(*kind, name, sel.clone(), false);
    }
    let views: BTreeMap<ObjectRef, ObjectView<'_>> = objects
        .iter()
        .map(|(kind, name, obj)| {
            let view = match obj {
                Obj::Cm(cm) => ObjectView::config_map(cm).expect("valid ConfigMap"),
                Obj::Secret(s) => ObjectView::secret(s),
            };
            (ObjectRef::new(*kind, *name), view)
        })
        .collect();
    let digests: BTreeMap<&ObjectRef, ObjectDigest> = views
        .iter()
        .map(|(r, v)| (r, ObjectDigest::from_view(v)))
        .collect();
    let whole = checksum::compute_stamp(key, &r, |o| match views.get(o) {
        Some(v) => RefState::Present(v),
        None => RefState::Absent,
    });
    let from_digests = checksum::compute_stamp(key, &r, |o| match digests.get(o) {
        Some(d) => RefState::Present(d),
        None => RefState::Absent,
    });
    assert_eq!(
        whole, from_digests,
        "whole-object and digest-only stamps differ"
    );
    whole.to_string()
}

#[test]
fn vector_1_whole_config_map_plain() {
    let cm = config_map(&[("LOG_LEVEL", "info"), ("PORT", "8080")], &[]);
    assert_eq!(
        stamp(
            None,
            &[(ObjectKind::ConfigMap, "app-env", Selection::Whole)],
            &[(ObjectKind::ConfigMap, "app-env", Obj::Cm(cm))]
        ),
        "v1:plain:6f004be85bf00fc0a69cd1e9d42b62cabd982c8b566f33df6c11c680b0e9e3ea"
    );
}

#[test]
fn vector_2_whole_config_map_with_key() {
    let key = StampKey::new(b"0123456789abcdef0123456789abcdef".to_vec()).unwrap();
    let cm = config_map(&[("LOG_LEVEL", "info"), ("PORT", "8080")], &[]);
    assert_eq!(
        stamp(
            Some(&key),
            &[(ObjectKind::ConfigMap, "app-env", Selection::Whole)],
            &[(ObjectKind::ConfigMap, "app-env", Obj::Cm(cm))]
        ),
        "v1:3eb1bd43:4084ffa0af2c111a98d039d2aa796f61a55b363c85768d6c06c74021173632a3"
    );
}

#[test]
fn vector_3_keys_absent_object_secret_and_binary_data() {
    assert_eq!(
        stamp(
            None,
            &[
                (ObjectKind::ConfigMap, "web", keys(&["nginx.conf"])),
                (ObjectKind::Secret, "db", keys(&["password"])),
                (ObjectKind::ConfigMap, "logo", Selection::Whole),
            ],
            &[
                (
                    ObjectKind::Secret,
                    "db",
                    Obj::Secret(secret(&[("password", "s3cret"), ("user", "app")]))
                ),
                (
                    ObjectKind::ConfigMap,
                    "logo",
                    Obj::Cm(config_map(&[], &[("logo.png", &[0x89, 0x50, 0x4e, 0x47])]))
                ),
            ]
        ),
        "v1:plain:b2ba086651607bf08ee7fa785bcda0dc3ae4949e5554f293eac719955fe3e008"
    );
}

#[test]
fn vector_4_no_references() {
    assert_eq!(
        stamp(None, &[], &[]),
        "v1:plain:68da50291d305bed0a35f47f99ded5903a206c95e2f188825ce901d4c4430798"
    );
}

#[test]
fn vector_5_missing_key_of_present_config_map() {
    assert_eq!(
        stamp(
            None,
            &[(ObjectKind::ConfigMap, "cfg", keys(&["missing"]))],
            &[(
                ObjectKind::ConfigMap,
                "cfg",
                Obj::Cm(config_map(&[("present", "1")], &[]))
            )]
        ),
        "v1:plain:f6a79d938a2eeb7eecc95e9e1455da9f77861d29faf76bd32bbb46162b964dfc"
    );
}

#[test]
fn vector_6_empty_config_map() {
    assert_eq!(
        stamp(
            None,
            &[(ObjectKind::ConfigMap, "empty", Selection::Whole)],
            &[(
                ObjectKind::ConfigMap,
                "empty",
                Obj::Cm(config_map(&[], &[]))
            )]
        ),
        "v1:plain:60f01de9ad4dc90e7879266d3e5ae6d7e728ec0c21deb0c12791fde01ebaee8a"
    );
}

#[test]
fn vector_7_whole_tls_secret() {
    assert_eq!(
        stamp(
            None,
            &[(ObjectKind::Secret, "tls", Selection::Whole)],
            &[(
                ObjectKind::Secret,
                "tls",
                Obj::Secret(secret(&[("tls.crt", "CERT"), ("tls.key", "KEY")]))
            )]
        ),
        "v1:plain:729b2a4ea25068f934c7e39ceea7b27b95e82ce7bca6ecbc2a81088ea8fb8c43"
    );
}

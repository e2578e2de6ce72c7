//! The golden vectors of checksum recipes v1 and v2 (docs/recipe.md). These stamps are frozen: a
//! change here is a new recipe version, never an edit. v2 is what stamps are made with; v1 stays
//! computable so stamps of earlier releases can be checked.

use crate::build;

use std::collections::BTreeMap;

use build::{binary_config_map, config_map, secret};
use confighash::core::checksum::{self, ObjectDigest, ObjectView, RefState, StampKey};
use confighash::core::refs::{ObjectKind, ObjectRef, References, Selection};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};

fn keys(keys: &[&str]) -> Selection {
    Selection::Keys(keys.iter().map(|k| k.to_string()).collect())
}

enum Obj {
    Cm(ConfigMap),
    Secret(Secret),
}

/// Which recipe a vector is for, and the namespace v2 binds.
#[derive(Clone, Copy)]
enum Recipe<'a> {
    V1,
    V2(&'a str),
}

/// Computes a stamp twice, from whole objects and from per-key digests, and checks they agree.
fn stamp_with(
    recipe: Recipe<'_>,
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
    let from_views = |o: &ObjectRef| match views.get(o) {
        Some(v) => RefState::Present(v),
        None => RefState::Absent,
    };
    let from_digests = |o: &ObjectRef| match digests.get(o) {
        Some(d) => RefState::Present(d),
        None => RefState::Absent,
    };
    let (whole, digest_only) = match recipe {
        Recipe::V1 => (
            checksum::compute_stamp_v1(key, &r, from_views),
            checksum::compute_stamp_v1(key, &r, from_digests),
        ),
        Recipe::V2(ns) => (
            checksum::compute_stamp(key, ns, &r, from_views),
            checksum::compute_stamp(key, ns, &r, from_digests),
        ),
    };
    assert_eq!(
        whole, digest_only,
        "whole-object and digest-only stamps differ"
    );
    whole.to_string()
}

/// A recipe v1 stamp.
fn stamp(
    key: Option<&StampKey>,
    refs: &[(ObjectKind, &str, Selection)],
    objects: &[(ObjectKind, &str, Obj)],
) -> String {
    stamp_with(Recipe::V1, key, refs, objects)
}

#[test]
fn vector_1_whole_config_map_plain() {
    let cm = config_map("app-env", &[("LOG_LEVEL", "info"), ("PORT", "8080")]);
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
    let cm = config_map("app-env", &[("LOG_LEVEL", "info"), ("PORT", "8080")]);
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
                    Obj::Secret(secret("db", &[("password", b"s3cret"), ("user", b"app")]))
                ),
                (
                    ObjectKind::ConfigMap,
                    "logo",
                    Obj::Cm(binary_config_map(
                        "logo",
                        &[],
                        &[("logo.png", &[0x89, 0x50, 0x4e, 0x47])]
                    ))
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
                Obj::Cm(config_map("cfg", &[("present", "1")]))
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
                Obj::Cm(config_map("empty", &[]))
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
                Obj::Secret(secret("tls", &[("tls.crt", b"CERT"), ("tls.key", b"KEY")]))
            )]
        ),
        "v1:plain:729b2a4ea25068f934c7e39ceea7b27b95e82ce7bca6ecbc2a81088ea8fb8c43"
    );
}

// Recipe v2: the inputs of the v1 vectors, in namespace `default` unless said, and vector 8.

fn test_key() -> StampKey {
    build::key()
}

/// References and objects, as `stamp_with` takes them.
type Inputs = (
    Vec<(ObjectKind, &'static str, Selection)>,
    Vec<(ObjectKind, &'static str, Obj)>,
);

fn vector_1_inputs() -> Inputs {
    let cm = config_map("app-env", &[("LOG_LEVEL", "info"), ("PORT", "8080")]);
    (
        vec![(ObjectKind::ConfigMap, "app-env", Selection::Whole)],
        vec![(ObjectKind::ConfigMap, "app-env", Obj::Cm(cm))],
    )
}

#[test]
fn v2_vector_1_whole_config_map_plain() {
    let (refs, objects) = vector_1_inputs();
    assert_eq!(
        stamp_with(Recipe::V2("default"), None, &refs, &objects),
        "v2:plain:842499d32b43c07f94b45c022381da213f8a0e16cd2a2f5e27bea352550be9e8"
    );
    assert_eq!(
        stamp_with(Recipe::V2("shop"), None, &refs, &objects),
        "v2:plain:63fb616d0b3d1936fa1c667467c0f016eff4136898b6af29c79b9dab5a77e927"
    );
}

#[test]
fn v2_vector_2_whole_config_map_with_key() {
    let key = test_key();
    let (refs, objects) = vector_1_inputs();
    assert_eq!(
        stamp_with(Recipe::V2("default"), Some(&key), &refs, &objects),
        "v2:3eb1bd43:abf5d65729f9d1f18f8e11dd7b4b73385fea471594fae17e4a7353cf5a359f77"
    );
    assert_eq!(
        stamp_with(Recipe::V2("shop"), Some(&key), &refs, &objects),
        "v2:3eb1bd43:e42669a3f15d5f82a37963146406ad4864ba3cf5ab15eeb34da97ddecd8145d0"
    );
}

#[test]
fn v2_vector_3_keys_absent_object_secret_and_binary_data() {
    assert_eq!(
        stamp_with(
            Recipe::V2("default"),
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
                    Obj::Secret(secret("db", &[("password", b"s3cret"), ("user", b"app")]))
                ),
                (
                    ObjectKind::ConfigMap,
                    "logo",
                    Obj::Cm(binary_config_map(
                        "logo",
                        &[],
                        &[("logo.png", &[0x89, 0x50, 0x4e, 0x47])]
                    ))
                ),
            ]
        ),
        "v2:plain:68d40165568d7aca381a7a4e4ab7168ec9af3ef8dcc89d148de0104720b86dda"
    );
}

#[test]
fn v2_vector_4_no_references() {
    assert_eq!(
        stamp_with(Recipe::V2("default"), None, &[], &[]),
        "v2:plain:8a197cfb21e9aa6bbcf94cf7eae326632e2e20d00aa81064c1ed75590e8bf482"
    );
}

#[test]
fn v2_vector_5_missing_key_of_present_config_map() {
    assert_eq!(
        stamp_with(
            Recipe::V2("default"),
            None,
            &[(ObjectKind::ConfigMap, "cfg", keys(&["missing"]))],
            &[(
                ObjectKind::ConfigMap,
                "cfg",
                Obj::Cm(config_map("cfg", &[("present", "1")]))
            )]
        ),
        "v2:plain:b001b3bdc33d959c442b6b811a01d056933aaab954b4491926a1c80e6e274abe"
    );
}

#[test]
fn v2_vector_6_empty_config_map() {
    assert_eq!(
        stamp_with(
            Recipe::V2("default"),
            None,
            &[(ObjectKind::ConfigMap, "empty", Selection::Whole)],
            &[(
                ObjectKind::ConfigMap,
                "empty",
                Obj::Cm(config_map("empty", &[]))
            )]
        ),
        "v2:plain:4be2dec3882d3d899862dfec14c7f36c517c942afa443e1cea089538456cc759"
    );
}

#[test]
fn v2_vector_7_whole_tls_secret() {
    assert_eq!(
        stamp_with(
            Recipe::V2("default"),
            None,
            &[(ObjectKind::Secret, "tls", Selection::Whole)],
            &[(
                ObjectKind::Secret,
                "tls",
                Obj::Secret(secret("tls", &[("tls.crt", b"CERT"), ("tls.key", b"KEY")]))
            )]
        ),
        "v2:plain:6512498eb316531d7cfaaaa38f0480704e3d8d395b79f0a6c871d68c4e10f750"
    );
}

#[test]
fn v2_vector_8_absent_whole_object_and_absent_key_selection() {
    assert_eq!(
        stamp_with(
            Recipe::V2("default"),
            None,
            &[
                (ObjectKind::ConfigMap, "gone", Selection::Whole),
                (ObjectKind::Secret, "s", keys(&["a"])),
            ],
            &[]
        ),
        "v2:plain:3d9621fca57853475817e7766c2b4712b9eda2826b1eaabfccaaf707dc3e3bd6"
    );
}

/// Vector 8's message, written out byte by byte from docs/recipe.md, hashes to vector 8: the
/// absent Secret names its selected key, the absent whole ConfigMap names none.
#[test]
fn v2_vector_8_message_by_hand() {
    use sha2::{Digest, Sha256};
    fn lp(out: &mut Vec<u8>, bytes: &[u8]) {
        out.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
        out.extend_from_slice(bytes);
    }
    let mut m = Vec::new();
    for part in [
        &b"confighash-recipe-v2"[..],
        b"default",
        b"ConfigMap",
        b"gone",
        b"absent",
        b"Secret",
        b"s",
        b"absent",
        b"a",
    ] {
        lp(&mut m, part);
    }
    assert_eq!(
        format!("v2:plain:{}", hex::encode(Sha256::digest(&m))),
        "v2:plain:3d9621fca57853475817e7766c2b4712b9eda2826b1eaabfccaaf707dc3e3bd6"
    );
}

#[test]
fn v2_binds_the_namespace_and_v1_does_not() {
    let (refs, objects) = vector_1_inputs();
    let in_ns = |ns| stamp_with(Recipe::V2(ns), None, &refs, &objects);
    assert_ne!(in_ns("default"), in_ns("shop"));
    // Length prefixes keep the namespace apart from what follows it.
    assert_ne!(in_ns("a"), in_ns("a\0"));
    // v1 stays what it was, whatever the namespace.
    assert_eq!(
        stamp(None, &refs, &objects),
        "v1:plain:6f004be85bf00fc0a69cd1e9d42b62cabd982c8b566f33df6c11c680b0e9e3ea"
    );
}

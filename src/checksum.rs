//! Checksum recipe v1: the exact bytes hashed into a stamp.
//!
//! The recipe is frozen: anyone holding the referenced objects (and the key) can recompute a stamp
//! from the description in `DESIGN.md`. Values enter the message only as their SHA-256, so the
//! watcher can keep 32 bytes per key instead of the content ([`ObjectDigest`]) and still compute
//! the same stamp as the webhook computes from whole objects ([`ObjectView`]).

use std::collections::BTreeMap;
use std::fmt;

use hmac::{Hmac, Mac};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use sha2::digest::Update;
use sha2::{Digest, Sha256};

use crate::refs::{ObjectRef, RefSpec, References, Selection};

/// Version tag of this recipe, the first part of every stamp it makes.
pub const RECIPE_VERSION: &str = "v1";
/// Key id written in stamps made without a key.
pub const PLAIN_KEY_ID: &str = "plain";
/// Keys shorter than this are refused.
pub const MIN_KEY_LEN: usize = 16;
/// The annotation that leaves a ConfigMap or Secret out of every checksum (value exactly "true").
pub const IGNORE_ANNOTATION: &str = "confighash.dev/ignore";

const HEADER: &[u8] = b"confighash-recipe-v1";

/// SHA-256 of one value.
pub type ValueDigest = [u8; 32];

/// Which map of the object a key lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tag {
    /// A ConfigMap's `data` (UTF-8 bytes) or a Secret's `data` (decoded bytes).
    Data,
    /// A ConfigMap's `binaryData` (decoded bytes).
    BinaryData,
}

impl Tag {
    pub fn as_str(self) -> &'static str {
        match self {
            Tag::Data => "data",
            Tag::BinaryData => "binaryData",
        }
    }
}

/// Why the recipe could not be computed from an object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecipeError {
    #[error("ConfigMap {name:?} has key {key:?} in both data and binaryData")]
    DuplicateKey { name: String, key: String },
}

/// Why a key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the checksum key is {len} bytes long; at least {MIN_KEY_LEN} bytes are required")]
    TooShort { len: usize },
}

/// The installation's HMAC key and its public id.
#[derive(Clone)]
pub struct StampKey {
    bytes: Vec<u8>,
    id: String,
}

impl StampKey {
    /// Takes the key bytes exactly as given (no trimming, no decoding).
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, KeyError> {
        let bytes = bytes.into();
        if bytes.len() < MIN_KEY_LEN {
            return Err(KeyError::TooShort { len: bytes.len() });
        }
        let id = hex::encode(&Sha256::digest(&bytes)[..4]);
        Ok(StampKey { bytes, id })
    }

    /// First 8 hex digits of SHA-256 of the key.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl fmt::Debug for StampKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StampKey")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// The key id stamps made with `key` carry.
pub fn key_id(key: Option<&StampKey>) -> &str {
    key.map_or(PLAIN_KEY_ID, StampKey::id)
}

/// A computed stamp: `v1:<keyid>:<64 lowercase hex>`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Stamp(String);

impl Stamp {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Stamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Stamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl From<Stamp> for String {
    fn from(s: Stamp) -> String {
        s.0
    }
}

/// Whether a stamp value was made by this recipe with the key whose id is `key_id`.
/// Anything else (other version, other key, malformed) is foreign.
pub fn is_current(stamp: &str, key_id: &str) -> bool {
    let Some(rest) = stamp
        .strip_prefix(RECIPE_VERSION)
        .and_then(|r| r.strip_prefix(':'))
    else {
        return false;
    };
    let Some(digest) = rest.strip_prefix(key_id).and_then(|r| r.strip_prefix(':')) else {
        return false;
    };
    digest.len() == 64
        && digest
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The recipe's view of one object's entries.
///
/// `entries` yields every entry in (key, tag) byte order, each key once; `entry` finds one key.
pub trait Entries {
    fn for_each_entry(&self, f: &mut dyn FnMut(&str, Tag, &ValueDigest));
    fn entry(&self, key: &str) -> Option<(Tag, ValueDigest)>;
}

/// What the recipe knows about one referenced object.
#[derive(Clone, Copy)]
pub enum RefState<'a> {
    /// The object does not exist (NotFound).
    Absent,
    /// The object exists but is annotated `confighash.dev/ignore: "true"`.
    Ignored,
    /// The object exists with these entries.
    Present(&'a dyn Entries),
}

/// Per-key digests of one object: the recipe's inputs without the content.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectDigest {
    entries: BTreeMap<String, (Tag, ValueDigest)>,
}

impl ObjectDigest {
    /// Builds from already computed digests. A key given twice keeps the last.
    pub fn from_digests(entries: impl IntoIterator<Item = (String, Tag, ValueDigest)>) -> Self {
        ObjectDigest {
            entries: entries.into_iter().map(|(k, t, d)| (k, (t, d))).collect(),
        }
    }

    /// Hashes every value of a whole object.
    pub fn from_view(view: &ObjectView<'_>) -> Self {
        let mut entries = BTreeMap::new();
        view.for_each_entry(&mut |k, t, d| {
            entries.insert(k.to_owned(), (t, *d));
        });
        ObjectDigest { entries }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl Entries for ObjectDigest {
    fn for_each_entry(&self, f: &mut dyn FnMut(&str, Tag, &ValueDigest)) {
        for (k, (t, d)) in &self.entries {
            f(k, *t, d);
        }
    }

    fn entry(&self, key: &str) -> Option<(Tag, ValueDigest)> {
        self.entries.get(key).copied()
    }
}

/// A borrowed view of a whole ConfigMap or Secret that hashes values as the recipe asks for them.
#[derive(Debug, Clone)]
pub struct ObjectView<'a> {
    /// Sorted by key, each key once.
    entries: Vec<(&'a str, Tag, &'a [u8])>,
}

impl<'a> ObjectView<'a> {
    /// `data` (UTF-8) and `binaryData` (decoded); a key in both is an error.
    pub fn config_map(cm: &'a ConfigMap) -> Result<Self, RecipeError> {
        let mut entries: Vec<(&str, Tag, &[u8])> = Vec::new();
        if let Some(data) = &cm.data {
            entries.extend(
                data.iter()
                    .map(|(k, v)| (k.as_str(), Tag::Data, v.as_bytes())),
            );
        }
        if let Some(binary) = &cm.binary_data {
            for (k, v) in binary {
                if cm.data.as_ref().is_some_and(|d| d.contains_key(k)) {
                    return Err(RecipeError::DuplicateKey {
                        name: cm.metadata.name.clone().unwrap_or_default(),
                        key: k.clone(),
                    });
                }
                entries.push((k.as_str(), Tag::BinaryData, v.0.as_slice()));
            }
        }
        entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
        Ok(ObjectView { entries })
    }

    /// `data` (decoded), with `stringData` merged over it as the API server stores it.
    pub fn secret(secret: &'a Secret) -> Self {
        let mut merged: BTreeMap<&str, &[u8]> = BTreeMap::new();
        if let Some(data) = &secret.data {
            merged.extend(data.iter().map(|(k, v)| (k.as_str(), v.0.as_slice())));
        }
        if let Some(string_data) = &secret.string_data {
            merged.extend(string_data.iter().map(|(k, v)| (k.as_str(), v.as_bytes())));
        }
        ObjectView {
            entries: merged.into_iter().map(|(k, v)| (k, Tag::Data, v)).collect(),
        }
    }

    pub fn keys(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.entries.iter().map(|e| e.0)
    }
}

impl Entries for ObjectView<'_> {
    fn for_each_entry(&self, f: &mut dyn FnMut(&str, Tag, &ValueDigest)) {
        for (k, t, v) in &self.entries {
            f(k, *t, &Sha256::digest(v).into());
        }
    }

    fn entry(&self, key: &str) -> Option<(Tag, ValueDigest)> {
        let i = self.entries.binary_search_by(|e| e.0.cmp(key)).ok()?;
        let (_, t, v) = self.entries[i];
        Some((t, Sha256::digest(v).into()))
    }
}

/// Whether an object's annotations leave it out of every checksum.
pub fn is_ignored(annotations: Option<&BTreeMap<String, String>>) -> bool {
    annotations
        .and_then(|a| a.get(IGNORE_ANNOTATION))
        .is_some_and(|v| v == "true")
}

fn lp(out: &mut impl Update, bytes: &[u8]) {
    out.update(&(bytes.len() as u64).to_be_bytes());
    out.update(bytes);
}

/// Writes the recipe message for `refs` into `out`, asking `state` about each referenced object.
pub fn write_message<'s>(
    out: &mut impl Update,
    refs: &References,
    mut state: impl FnMut(&ObjectRef) -> RefState<'s>,
) {
    lp(out, HEADER);
    for (obj, spec) in refs.iter() {
        let entries = match state(obj) {
            RefState::Ignored => continue,
            RefState::Absent => {
                write_object_header(out, obj);
                lp(out, b"absent");
                continue;
            }
            RefState::Present(entries) => entries,
        };
        write_object_header(out, obj);
        lp(out, b"present");
        write_entries(out, spec, entries);
    }
}

fn write_object_header(out: &mut impl Update, obj: &ObjectRef) {
    lp(out, obj.kind.as_str().as_bytes());
    lp(out, obj.name.as_bytes());
}

fn write_entries(out: &mut impl Update, spec: &RefSpec, entries: &dyn Entries) {
    match &spec.selection {
        Selection::Whole => entries.for_each_entry(&mut |key, tag, digest| {
            write_entry(out, key, tag, digest);
        }),
        Selection::Keys(keys) => {
            for key in keys {
                match entries.entry(key) {
                    Some((tag, digest)) => write_entry(out, key, tag, &digest),
                    None => {
                        lp(out, b"absent-key");
                        lp(out, key.as_bytes());
                    }
                }
            }
        }
    }
}

fn write_entry(out: &mut impl Update, key: &str, tag: Tag, digest: &ValueDigest) {
    lp(out, tag.as_str().as_bytes());
    lp(out, key.as_bytes());
    lp(out, digest);
}

/// Computes the stamp of `refs`: HMAC-SHA256 of the message with `key`, or SHA-256 without.
pub fn compute_stamp<'s>(
    key: Option<&StampKey>,
    refs: &References,
    state: impl FnMut(&ObjectRef) -> RefState<'s>,
) -> Stamp {
    let digest: [u8; 32] = match key {
        Some(k) => {
            // HMAC accepts keys of any length; StampKey guarantees at least MIN_KEY_LEN.
            let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&k.bytes)
                .expect("HMAC-SHA256 takes keys of any length");
            write_message(&mut mac, refs, state);
            mac.finalize().into_bytes().into()
        }
        None => {
            let mut h = Sha256::new();
            write_message(&mut h, refs, state);
            h.finalize().into()
        }
    };
    Stamp(format!(
        "{RECIPE_VERSION}:{}:{}",
        key_id(key),
        hex::encode(digest)
    ))
}

//! The checksum recipes: the exact bytes hashed into a stamp.
//!
//! Recipe v2 ([`compute_stamp`]) is the one stamps are made with; recipe v1
//! ([`compute_stamp_v1`]) stays computable so stamps of earlier releases can be checked. Both are
//! frozen: anyone holding the referenced objects (and the key) can recompute a stamp from the
//! description in `docs/recipe.md`. Values enter the message only as their SHA-256, so the
//! watcher can keep 32 bytes per key instead of the content ([`ObjectDigest`]) and still compute
//! the same stamp as the webhook computes from whole objects ([`ObjectView`]).

use crate::names::IGNORE_ANNOTATION;
use std::collections::BTreeMap;
use std::fmt;

use hmac::{Hmac, Mac};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use sha2::digest::Update;
use sha2::{Digest, Sha256};

use crate::refs::{ObjectRef, RefSpec, References, Selection};

/// Version tag of the current recipe, the first part of every stamp it makes.
pub const RECIPE_VERSION: &str = Recipe::CURRENT.as_str();
/// Key id written in stamps made without a key.
pub const PLAIN_KEY_ID: &str = "plain";
/// Keys shorter than this are refused.
pub const MIN_KEY_LEN: usize = 16;

/// A version of the checksum recipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Recipe {
    /// Earlier releases: no namespace, and an absent object hashes the same whatever keys were
    /// selected. Only checked, never written by `serve`.
    V1,
    /// The namespace enters the message, and an absent object names its selected keys.
    V2,
}

impl Recipe {
    /// The recipe stamps are made with.
    pub const CURRENT: Recipe = Recipe::V2;

    /// The stamp prefix: `v1` or `v2`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Recipe::V1 => "v1",
            Recipe::V2 => "v2",
        }
    }

    fn header(self) -> &'static [u8] {
        match self {
            Recipe::V1 => b"confighash-recipe-v1",
            Recipe::V2 => b"confighash-recipe-v2",
        }
    }

    /// The recipe a stamp value was made by, if it is a well-formed stamp of a known recipe
    /// made with the key whose id is `key_id` (`<recipe>:<key_id>:<64 lowercase hex>`).
    pub fn of_stamp(stamp: &str, key_id: &str) -> Option<Recipe> {
        let (version, rest) = stamp.split_once(':')?;
        let recipe = [Recipe::V1, Recipe::V2]
            .into_iter()
            .find(|r| r.as_str() == version)?;
        let digest = rest.strip_prefix(key_id)?.strip_prefix(':')?;
        let well_formed = digest.len() == 64
            && digest
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        well_formed.then_some(recipe)
    }
}

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

/// A computed stamp: `<recipe>:<keyid>:<64 lowercase hex>`.
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

/// Whether a stamp value is ours: made by a recipe this build can check (v1 or v2) with the key
/// whose id is `key_id`. Anything else (unknown version, other key, malformed) is foreign.
pub fn is_current(stamp: &str, key_id: &str) -> bool {
    Recipe::of_stamp(stamp, key_id).is_some()
}

/// The recipe's view of one object's entries.
///
/// `entries` yields every entry in (key, tag) byte order, each key once; `entry` finds one key.
pub trait Entries {
    fn for_each_entry(&self, f: &mut dyn FnMut(&str, Tag, &ValueDigest));
    fn entry(&self, key: &str) -> Option<(Tag, ValueDigest)>;
    /// The decoded bytes of all values (`--max-reference-bytes` counts them).
    fn bytes(&self) -> u64;
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
///
/// The watcher keeps one of these for every ConfigMap and Secret it watches, so they are packed
/// into a single allocation: per entry, in key order, the key's length (LEB128), the key, the tag
/// (0 data, 1 binaryData) and the 32-byte digest. Objects have few keys, so lookups scan.
/// Beside them, the decoded bytes of all values: what reading the object for the recipe costs
/// (`--max-reference-bytes`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ObjectDigest {
    packed: Box<[u8]>,
    bytes: u64,
}

impl ObjectDigest {
    /// Builds from already computed digests, with no byte count (see [`ObjectDigest::with_bytes`]).
    /// A key given twice keeps the last.
    pub fn from_digests(entries: impl IntoIterator<Item = (String, Tag, ValueDigest)>) -> Self {
        let sorted: BTreeMap<String, (Tag, ValueDigest)> =
            entries.into_iter().map(|(k, t, d)| (k, (t, d))).collect();
        let mut packer = Packer::default();
        for (k, (t, d)) in &sorted {
            packer.push(k, *t, d);
        }
        packer.finish()
    }

    /// Hashes every value of a whole object, and counts their decoded bytes.
    pub fn from_view(view: &ObjectView<'_>) -> Self {
        // The view is sorted by key with each key once, as the packed form needs.
        let mut packer = Packer::default();
        view.for_each_entry(&mut |k, t, d| packer.push(k, t, d));
        packer.finish().with_bytes(view.bytes())
    }

    /// The same digests, with `bytes` as the decoded size of the object's values.
    pub fn with_bytes(mut self, bytes: u64) -> Self {
        self.bytes = bytes;
        self
    }

    pub fn len(&self) -> usize {
        self.iter().count()
    }

    pub fn is_empty(&self) -> bool {
        self.packed.is_empty()
    }

    /// Bytes held on the heap.
    pub fn heap_size(&self) -> usize {
        self.packed.len()
    }

    fn iter(&self) -> PackedEntries<'_> {
        PackedEntries { rest: &self.packed }
    }
}

impl fmt::Debug for ObjectDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.iter().map(|(k, t, d)| (k, (t, hex::encode(d)))))
            .finish()
    }
}

#[derive(Default)]
struct Packer {
    buf: Vec<u8>,
}

impl Packer {
    fn push(&mut self, key: &str, tag: Tag, digest: &ValueDigest) {
        push_len(&mut self.buf, key.len());
        self.buf.extend_from_slice(key.as_bytes());
        self.buf.push(match tag {
            Tag::Data => 0,
            Tag::BinaryData => 1,
        });
        self.buf.extend_from_slice(digest);
    }

    fn finish(self) -> ObjectDigest {
        ObjectDigest {
            packed: self.buf.into_boxed_slice(),
            bytes: 0,
        }
    }
}

/// Appends `len` as 7-bit groups, low first, the high bit set on all but the last.
fn push_len(buf: &mut Vec<u8>, mut len: usize) {
    while len >= 0x80 {
        buf.push((len & 0x7f) as u8 | 0x80);
        len >>= 7;
    }
    buf.push(len as u8);
}

/// Walks a packed digest. Only [`Packer`] and [`NamedDigest::new`] write the bytes, so they are
/// well formed; a short read ends the walk rather than panicking.
struct PackedEntries<'a> {
    rest: &'a [u8],
}

impl<'a> PackedEntries<'a> {
    /// A length-prefixed string ([`push_len`]), consumed.
    fn read_str(&mut self) -> Option<&'a str> {
        let mut len = 0usize;
        let mut shift = 0;
        let mut i = 0;
        loop {
            let b = *self.rest.get(i)?;
            i += 1;
            len |= usize::from(b & 0x7f).checked_shl(shift)?;
            if b & 0x80 == 0 {
                break;
            }
            shift += 7;
        }
        let rest = &self.rest[i..];
        let text = std::str::from_utf8(rest.get(..len)?).ok()?;
        self.rest = &rest[len..];
        Some(text)
    }
}

impl<'a> Iterator for PackedEntries<'a> {
    type Item = (&'a str, Tag, &'a ValueDigest);

    fn next(&mut self) -> Option<Self::Item> {
        let key = self.read_str()?;
        let rest = self.rest;
        let tag = match *rest.first()? {
            0 => Tag::Data,
            _ => Tag::BinaryData,
        };
        let digest: &ValueDigest = rest.get(1..33)?.try_into().ok()?;
        self.rest = &rest[33..];
        Some((key, tag, digest))
    }
}

/// The entry of `key` among sorted entries.
fn find(entries: PackedEntries<'_>, key: &str) -> Option<(Tag, ValueDigest)> {
    for (k, t, d) in entries {
        match k.cmp(key) {
            std::cmp::Ordering::Less => continue,
            std::cmp::Ordering::Equal => return Some((t, *d)),
            std::cmp::Ordering::Greater => return None,
        }
    }
    None
}

impl Entries for ObjectDigest {
    fn for_each_entry(&self, f: &mut dyn FnMut(&str, Tag, &ValueDigest)) {
        for (k, t, d) in self.iter() {
            f(k, t, d);
        }
    }

    fn entry(&self, key: &str) -> Option<(Tag, ValueDigest)> {
        find(self.iter(), key)
    }

    fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// An object's name and its [`ObjectDigest`] in one allocation: the watcher keeps one per
/// ConfigMap and Secret it watches, and a separate name would cost a second allocation each.
#[derive(Clone, PartialEq, Eq)]
pub struct NamedDigest {
    /// The name, length-prefixed as the packed keys are, then the packed entries.
    packed: Box<[u8]>,
    bytes: u64,
}

impl NamedDigest {
    pub fn new(name: &str, digest: &ObjectDigest) -> Self {
        let mut buf = Vec::with_capacity(name.len() + 2 + digest.packed.len());
        push_len(&mut buf, name.len());
        buf.extend_from_slice(name.as_bytes());
        buf.extend_from_slice(&digest.packed);
        NamedDigest {
            packed: buf.into_boxed_slice(),
            bytes: digest.bytes,
        }
    }

    /// (the name, the packed entries after it).
    fn split(&self) -> (&str, &[u8]) {
        let mut rest = PackedEntries { rest: &self.packed };
        match rest.read_str() {
            Some(name) => (name, rest.rest),
            None => ("", &[]),
        }
    }

    pub fn name(&self) -> &str {
        self.split().0
    }

    /// Whether `digest` holds the same entries and byte count.
    pub fn same_digest(&self, digest: &ObjectDigest) -> bool {
        self.bytes == digest.bytes && self.split().1 == &*digest.packed
    }

    /// The digest alone, as a copy.
    pub fn digest(&self) -> ObjectDigest {
        ObjectDigest {
            packed: self.split().1.into(),
            bytes: self.bytes,
        }
    }

    fn iter(&self) -> PackedEntries<'_> {
        PackedEntries {
            rest: self.split().1,
        }
    }
}

impl Entries for NamedDigest {
    fn for_each_entry(&self, f: &mut dyn FnMut(&str, Tag, &ValueDigest)) {
        for (k, t, d) in self.iter() {
            f(k, t, d);
        }
    }

    fn entry(&self, key: &str) -> Option<(Tag, ValueDigest)> {
        find(self.iter(), key)
    }

    fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl fmt::Debug for NamedDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NamedDigest")
            .field("name", &self.name())
            .field("digest", &self.digest())
            .finish()
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

    fn bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.2.len() as u64).sum()
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

/// Writes the recipe v2 message for the references `refs` of a workload in `namespace` into
/// `out`, asking `state` about each referenced object.
pub fn write_message<'s>(
    out: &mut impl Update,
    namespace: &str,
    refs: &References,
    state: impl FnMut(&ObjectRef) -> RefState<'s>,
) {
    write(out, Recipe::V2, namespace, refs, state);
}

/// Writes the recipe v1 message for `refs` into `out` (v1 has no namespace).
pub fn write_message_v1<'s>(
    out: &mut impl Update,
    refs: &References,
    state: impl FnMut(&ObjectRef) -> RefState<'s>,
) {
    write(out, Recipe::V1, "", refs, state);
}

fn write<'s>(
    out: &mut impl Update,
    recipe: Recipe,
    namespace: &str,
    refs: &References,
    mut state: impl FnMut(&ObjectRef) -> RefState<'s>,
) {
    lp(out, recipe.header());
    if recipe == Recipe::V2 {
        lp(out, namespace.as_bytes());
    }
    for (obj, spec) in refs.iter() {
        let entries = match state(obj) {
            RefState::Ignored => continue,
            RefState::Absent => {
                write_object_header(out, obj);
                lp(out, b"absent");
                if let (Recipe::V2, Selection::Keys(keys)) = (recipe, &spec.selection) {
                    for key in keys {
                        lp(out, key.as_bytes());
                    }
                }
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

/// Computes the recipe v2 stamp of the references `refs` of a workload in `namespace`:
/// HMAC-SHA256 of the message with `key`, or SHA-256 without.
pub fn compute_stamp<'s>(
    key: Option<&StampKey>,
    namespace: &str,
    refs: &References,
    state: impl FnMut(&ObjectRef) -> RefState<'s>,
) -> Stamp {
    hash(key, Recipe::V2, |out| {
        write(out, Recipe::V2, namespace, refs, state)
    })
}

/// Computes the recipe v1 stamp of `refs`, to check stamps of earlier releases. `serve` never
/// writes one.
pub fn compute_stamp_v1<'s>(
    key: Option<&StampKey>,
    refs: &References,
    state: impl FnMut(&ObjectRef) -> RefState<'s>,
) -> Stamp {
    hash(key, Recipe::V1, |out| {
        write(out, Recipe::V1, "", refs, state)
    })
}

/// Any `Update` sink the message can be written to: HMAC or plain SHA-256.
enum Hasher {
    Keyed(Hmac<Sha256>),
    Plain(Sha256),
}

impl Update for Hasher {
    fn update(&mut self, data: &[u8]) {
        match self {
            Hasher::Keyed(mac) => Mac::update(mac, data),
            Hasher::Plain(h) => Digest::update(h, data),
        }
    }
}

fn hash(key: Option<&StampKey>, recipe: Recipe, message: impl FnOnce(&mut Hasher)) -> Stamp {
    let mut hasher = match key {
        // HMAC accepts keys of any length; StampKey guarantees at least MIN_KEY_LEN.
        Some(k) => Hasher::Keyed(
            <Hmac<Sha256> as Mac>::new_from_slice(&k.bytes)
                .expect("HMAC-SHA256 takes keys of any length"),
        ),
        None => Hasher::Plain(Sha256::new()),
    };
    message(&mut hasher);
    let digest: [u8; 32] = match hasher {
        Hasher::Keyed(mac) => mac.finalize().into_bytes().into(),
        Hasher::Plain(h) => h.finalize().into(),
    };
    Stamp(format!(
        "{}:{}:{}",
        recipe.as_str(),
        key_id(key),
        hex::encode(digest)
    ))
}

/// The key stamps are made with now, swapped atomically when the key is rotated (the binary
/// loads it and watches it for rotation).
pub struct KeyStore {
    key: arc_swap::ArcSwap<StampKey>,
}

impl KeyStore {
    pub fn new(key: StampKey) -> Self {
        KeyStore {
            key: arc_swap::ArcSwap::from_pointee(key),
        }
    }

    /// The key in use now.
    pub fn current(&self) -> std::sync::Arc<StampKey> {
        self.key.load_full()
    }

    /// Replaces the key; later calls to [`current`](Self::current) return it.
    pub fn set(&self, key: StampKey) {
        self.key.store(std::sync::Arc::new(key));
    }
}

impl std::fmt::Debug for KeyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyStore")
            .field("key_id", &self.current().id())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest_of(s: &str) -> ValueDigest {
        Sha256::digest(s.as_bytes()).into()
    }

    #[test]
    fn packed_digest_keeps_keys_of_every_length_in_order() {
        // Lengths around the one- and two-byte LEB128 boundaries, and an empty key.
        let keys: Vec<String> = [0usize, 1, 127, 128, 300, 16_384]
            .iter()
            .map(|n| "k".repeat(*n))
            .collect();
        let digest = ObjectDigest::from_digests(keys.iter().enumerate().map(|(i, k)| {
            let tag = if i % 2 == 0 {
                Tag::Data
            } else {
                Tag::BinaryData
            };
            (k.clone(), tag, digest_of(k))
        }));
        assert_eq!(digest.len(), keys.len());
        let mut seen = Vec::new();
        digest.for_each_entry(&mut |k, t, d| seen.push((k.to_owned(), t, *d)));
        let mut expected: Vec<(String, Tag, ValueDigest)> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let tag = if i % 2 == 0 {
                    Tag::Data
                } else {
                    Tag::BinaryData
                };
                (k.clone(), tag, digest_of(k))
            })
            .collect();
        expected.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(seen, expected);
        for (k, t, d) in &expected {
            assert_eq!(digest.entry(k), Some((*t, *d)), "key of length {}", k.len());
        }
        assert_eq!(digest.entry("kk-not-there"), None);
        assert_eq!(digest.entry("z"), None);
    }

    #[test]
    fn packed_digest_of_nothing_is_empty_and_allocates_nothing() {
        let digest = ObjectDigest::from_digests(std::iter::empty());
        assert!(digest.is_empty());
        assert_eq!(digest.len(), 0);
        assert_eq!(digest.heap_size(), 0);
        assert_eq!(digest.entry(""), None);
    }

    #[test]
    fn packed_digest_stores_non_ascii_keys_by_byte_order() {
        let digest = ObjectDigest::from_digests([
            ("é".to_owned(), Tag::Data, digest_of("1")),
            ("z".to_owned(), Tag::Data, digest_of("2")),
            ("a".to_owned(), Tag::BinaryData, digest_of("3")),
        ]);
        let mut order = Vec::new();
        digest.for_each_entry(&mut |k, _, _| order.push(k.to_owned()));
        assert_eq!(order, ["a", "z", "é"]);
        assert_eq!(digest.entry("é"), Some((Tag::Data, digest_of("1"))));
        assert_eq!(digest.entry("a"), Some((Tag::BinaryData, digest_of("3"))));
    }
}

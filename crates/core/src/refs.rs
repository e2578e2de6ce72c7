//! Reference discovery: which ConfigMaps and Secrets (and which of their keys) a pod template uses.
//!
//! References come from `env[].valueFrom`, `envFrom[]` and mounted volumes of every container and
//! initContainer, plus the `confighash.dev/extra-*` annotations on the workload. Several references
//! to one object merge: a whole-object reference wins over key references, key sets union, and the
//! object is optional only if every reference to it says `optional: true`.

use crate::names::{EXTRA_CONFIGMAPS_ANNOTATION, EXTRA_SECRETS_ANNOTATION};
use std::collections::{BTreeMap, BTreeSet, HashSet};

use k8s_openapi::api::core::v1::{Container, KeyToPath, PodSpec, Volume};

/// The two kinds of object a workload can reference. Ordered as the recipe orders them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectKind {
    ConfigMap,
    Secret,
}

impl ObjectKind {
    pub const ALL: [ObjectKind; 2] = [ObjectKind::ConfigMap, ObjectKind::Secret];

    /// The kind name, as the API and the recipe spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectKind::ConfigMap => "ConfigMap",
            ObjectKind::Secret => "Secret",
        }
    }
}

/// One referenced object in the workload's namespace.
/// Ordered by (kind, name) as bytes, the order the recipe hashes them in.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    pub kind: ObjectKind,
    pub name: String,
}

impl ObjectRef {
    pub fn new(kind: ObjectKind, name: impl Into<String>) -> Self {
        ObjectRef {
            kind,
            name: name.into(),
        }
    }
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.kind.as_str(), self.name)
    }
}

/// Which entries of a referenced object count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// Every key.
    Whole,
    /// Only these keys.
    Keys(KeySet),
}

/// Keys of an object, each once, in byte order (the recipe's).
///
/// Built as a `BTreeSet`, so that a review naming one object's keys thousands of times merges
/// them in O(log n) each; [`KeySet::compact`] turns it into a sorted slice of exactly its
/// length for keeping (the watcher keeps one per key-level reference of every workload, most
/// with one key, for which a `BTreeSet` takes a node of room for eleven, about 280 bytes).
#[derive(Clone)]
pub struct KeySet(Keys);

#[derive(Clone)]
enum Keys {
    /// Boxed, so that a kept set (the slice) takes no more room than a slice.
    #[allow(clippy::box_collection)]
    Set(Box<BTreeSet<String>>),
    Slice(Box<[String]>),
}

/// The keys of a [`KeySet`], in order.
pub enum Iter<'a> {
    Set(std::collections::btree_set::Iter<'a, String>),
    Slice(std::slice::Iter<'a, String>),
}

impl<'a> Iterator for Iter<'a> {
    type Item = &'a String;

    fn next(&mut self) -> Option<&'a String> {
        match self {
            Iter::Set(i) => i.next(),
            Iter::Slice(i) => i.next(),
        }
    }
}

impl KeySet {
    pub fn iter(&self) -> Iter<'_> {
        match &self.0 {
            Keys::Set(set) => Iter::Set(set.iter()),
            Keys::Slice(slice) => Iter::Slice(slice.iter()),
        }
    }

    pub fn contains(&self, key: &str) -> bool {
        match &self.0 {
            Keys::Set(set) => set.contains(key),
            Keys::Slice(slice) => slice.binary_search_by(|k| k.as_str().cmp(key)).is_ok(),
        }
    }

    pub fn len(&self) -> usize {
        match &self.0 {
            Keys::Set(set) => set.len(),
            Keys::Slice(slice) => slice.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The same keys in the least room, for a set kept a long time.
    pub fn compact(&mut self) {
        if let Keys::Set(set) = &mut self.0 {
            self.0 = Keys::Slice(std::mem::take(&mut **set).into_iter().collect());
        }
    }
}

const _: () = assert!(std::mem::size_of::<KeySet>() == 16);

impl Default for KeySet {
    fn default() -> Self {
        KeySet(Keys::Set(Box::default()))
    }
}

impl PartialEq for KeySet {
    fn eq(&self, other: &KeySet) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for KeySet {}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl FromIterator<String> for KeySet {
    fn from_iter<I: IntoIterator<Item = String>>(keys: I) -> Self {
        KeySet(Keys::Set(Box::new(keys.into_iter().collect())))
    }
}

impl Extend<String> for KeySet {
    fn extend<I: IntoIterator<Item = String>>(&mut self, keys: I) {
        if let Keys::Slice(slice) = &mut self.0 {
            self.0 = Keys::Set(Box::new(
                std::mem::take(slice).into_vec().into_iter().collect(),
            ));
        }
        if let Keys::Set(set) = &mut self.0 {
            set.extend(keys);
        }
    }
}

impl<const N: usize> From<[String; N]> for KeySet {
    fn from(keys: [String; N]) -> Self {
        keys.into_iter().collect()
    }
}

impl From<BTreeSet<String>> for KeySet {
    fn from(keys: BTreeSet<String>) -> Self {
        KeySet(Keys::Set(Box::new(keys)))
    }
}

impl IntoIterator for KeySet {
    type Item = String;
    type IntoIter = std::vec::IntoIter<String>;

    fn into_iter(self) -> Self::IntoIter {
        match self.0 {
            Keys::Set(set) => set.into_iter().collect::<Vec<_>>().into_iter(),
            Keys::Slice(slice) => slice.into_vec().into_iter(),
        }
    }
}

impl<'a> IntoIterator for &'a KeySet {
    type Item = &'a String;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl Selection {
    fn key(key: &str) -> Self {
        Selection::Keys(KeySet(Keys::Slice(Box::new([key.to_owned()]))))
    }

    fn merge(&mut self, other: Selection) {
        match (&mut *self, other) {
            (Selection::Whole, _) => {}
            (_, Selection::Whole) => *self = Selection::Whole,
            (Selection::Keys(mine), Selection::Keys(theirs)) => mine.extend(theirs),
        }
    }
}

/// The merged reference to one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefSpec {
    pub selection: Selection,
    /// True only if every reference to the object says `optional: true`.
    pub optional: bool,
}

/// Every object a workload references, merged per object, in recipe order.
///
/// A sorted vector rather than a map: workloads reference a handful of objects, and the watcher
/// keeps one of these per workload.
///
/// Built within a limit of distinct objects ([`discover_within`]): past it nothing more is kept
/// and [`References::over_limit`] says so, so neither the time nor the memory of discovery grows
/// with what a workload claims to reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct References {
    refs: Vec<(ObjectRef, RefSpec)>,
    rejected: Vec<ObjectRef>,
    limit: usize,
    over_limit: bool,
}

impl Default for References {
    fn default() -> Self {
        References {
            refs: Vec::new(),
            rejected: Vec::new(),
            limit: usize::MAX,
            over_limit: false,
        }
    }
}

/// At most this many invalid names are kept for warnings ([`References::rejected`]).
pub const MAX_REJECTED: usize = 16;

impl References {
    /// No references yet; at most `limit` distinct objects will be kept.
    pub fn within(limit: usize) -> Self {
        References {
            limit,
            ..References::default()
        }
    }

    /// Adds one reference, merging it with earlier ones to the same object.
    /// Empty names are not references (the API server refuses them). A new object past the
    /// limit is not kept: [`References::over_limit`] turns true.
    pub fn add(&mut self, kind: ObjectKind, name: &str, selection: Selection, optional: bool) {
        if name.is_empty() {
            return;
        }
        let found = self
            .refs
            .binary_search_by(|(r, _)| (r.kind, r.name.as_str()).cmp(&(kind, name)));
        match found {
            Ok(i) => {
                let spec = &mut self.refs[i].1;
                spec.selection.merge(selection);
                spec.optional &= optional;
            }
            Err(_) if self.refs.len() >= self.limit => self.over_limit = true,
            Err(i) => self.refs.insert(
                i,
                (
                    ObjectRef::new(kind, name),
                    RefSpec {
                        selection,
                        optional,
                    },
                ),
            ),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&ObjectRef, &RefSpec)> {
        self.refs.iter().map(|(r, spec)| (r, spec))
    }

    pub fn get(&self, obj: &ObjectRef) -> Option<&RefSpec> {
        let i = self.refs.binary_search_by(|(r, _)| r.cmp(obj)).ok()?;
        Some(&self.refs[i].1)
    }

    pub fn len(&self) -> usize {
        self.refs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.refs.is_empty()
    }

    /// Gives back spare capacity, for references kept a long time.
    pub fn shrink_to_fit(&mut self) {
        self.refs.shrink_to_fit();
        self.rejected.shrink_to_fit();
        for (_, spec) in &mut self.refs {
            if let Selection::Keys(keys) = &mut spec.selection {
                keys.compact();
            }
        }
    }

    /// Names in the extra-reference annotations that are not valid object names, left out (the
    /// first [`MAX_REJECTED`]).
    pub fn rejected(&self) -> &[ObjectRef] {
        &self.rejected
    }

    /// The workload references more distinct objects than the limit it was discovered within;
    /// only the first ones found were kept.
    pub fn over_limit(&self) -> bool {
        self.over_limit
    }
}

/// Finds every reference of a pod spec and of the workload's metadata annotations.
pub fn discover(spec: &PodSpec, annotations: Option<&BTreeMap<String, String>>) -> References {
    discover_within(spec, annotations, usize::MAX)
}

/// [`discover`], keeping at most `limit` distinct objects ([`References::over_limit`]).
pub fn discover_within(
    spec: &PodSpec,
    annotations: Option<&BTreeMap<String, String>>,
    limit: usize,
) -> References {
    let mut refs = References::within(limit);
    let init = spec.init_containers.as_deref().unwrap_or_default();
    let containers = init.iter().chain(&spec.containers);

    let mut mounted: HashSet<&str> = HashSet::new();
    for c in containers.clone() {
        add_container_refs(&mut refs, c);
        if let Some(mounts) = &c.volume_mounts {
            mounted.extend(mounts.iter().map(|m| m.name.as_str()));
        }
    }
    for v in spec.volumes.as_deref().unwrap_or_default() {
        if mounted.contains(v.name.as_str()) {
            add_volume_refs(&mut refs, v);
        }
    }
    if let Some(annotations) = annotations {
        for (annotation, kind) in [
            (EXTRA_CONFIGMAPS_ANNOTATION, ObjectKind::ConfigMap),
            (EXTRA_SECRETS_ANNOTATION, ObjectKind::Secret),
        ] {
            for name in annotations
                .get(annotation)
                .into_iter()
                .flat_map(|v| split_names(v))
            {
                if refs.over_limit {
                    break;
                }
                if is_object_name(name) {
                    refs.add(kind, name, Selection::Whole, false);
                } else if refs.rejected.len() < MAX_REJECTED
                    && !refs
                        .rejected
                        .iter()
                        .any(|r| r.kind == kind && r.name == name)
                {
                    refs.rejected.push(ObjectRef::new(kind, name));
                }
            }
        }
    }
    refs
}

/// Splits an extra-reference annotation: on commas, whitespace trimmed, empty items dropped.
pub fn split_names(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').map(str::trim).filter(|s| !s.is_empty())
}

/// Whether `name` is a valid namespace name (a DNS-1123 label): at most 63 lowercase letters,
/// digits and `-`, starting and ending with a letter or digit.
pub fn is_namespace_name(name: &str) -> bool {
    name.len() <= 63 && !name.contains('.') && is_object_name(name)
}

/// Whether `name` is a valid ConfigMap or Secret name (a DNS-1123 subdomain).
pub fn is_object_name(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

/// Adds a reference named in the pod spec. A name that is not a ConfigMap or Secret name (a
/// DNS-1123 subdomain) names no object that can exist, so it is no reference; it is never read
/// either (the name would go into the path of a GET unescaped). The API server refuses such pod
/// specs in its built-in kinds; a custom resource's may not.
fn add_spec_ref(
    refs: &mut References,
    kind: ObjectKind,
    name: &str,
    selection: Selection,
    optional: bool,
) {
    if is_object_name(name) {
        refs.add(kind, name, selection, optional);
    }
}

fn add_container_refs(refs: &mut References, c: &Container) {
    for env in c.env.as_deref().unwrap_or_default() {
        let Some(from) = &env.value_from else {
            continue;
        };
        if let Some(r) = &from.config_map_key_ref {
            let optional = r.optional.unwrap_or(false);
            add_spec_ref(
                refs,
                ObjectKind::ConfigMap,
                &r.name,
                Selection::key(&r.key),
                optional,
            );
        }
        if let Some(r) = &from.secret_key_ref {
            let optional = r.optional.unwrap_or(false);
            add_spec_ref(
                refs,
                ObjectKind::Secret,
                &r.name,
                Selection::key(&r.key),
                optional,
            );
        }
    }
    for from in c.env_from.as_deref().unwrap_or_default() {
        if let Some(r) = &from.config_map_ref {
            let optional = r.optional.unwrap_or(false);
            add_spec_ref(
                refs,
                ObjectKind::ConfigMap,
                &r.name,
                Selection::Whole,
                optional,
            );
        }
        if let Some(r) = &from.secret_ref {
            let optional = r.optional.unwrap_or(false);
            add_spec_ref(
                refs,
                ObjectKind::Secret,
                &r.name,
                Selection::Whole,
                optional,
            );
        }
    }
}

fn add_volume_refs(refs: &mut References, v: &Volume) {
    if let Some(cm) = &v.config_map {
        let optional = cm.optional.unwrap_or(false);
        add_spec_ref(
            refs,
            ObjectKind::ConfigMap,
            &cm.name,
            items(&cm.items),
            optional,
        );
    }
    if let Some(s) = &v.secret
        && let Some(name) = &s.secret_name
    {
        let optional = s.optional.unwrap_or(false);
        add_spec_ref(refs, ObjectKind::Secret, name, items(&s.items), optional);
    }
    let sources = v.projected.as_ref().and_then(|p| p.sources.as_deref());
    for source in sources.unwrap_or_default() {
        if let Some(cm) = &source.config_map {
            let optional = cm.optional.unwrap_or(false);
            add_spec_ref(
                refs,
                ObjectKind::ConfigMap,
                &cm.name,
                items(&cm.items),
                optional,
            );
        }
        if let Some(s) = &source.secret {
            let optional = s.optional.unwrap_or(false);
            add_spec_ref(refs, ObjectKind::Secret, &s.name, items(&s.items), optional);
        }
    }
}

/// `items` selects keys; absent or empty `items` projects every key (as the kubelet does).
fn items(items: &Option<Vec<KeyToPath>>) -> Selection {
    match items.as_deref() {
        None | Some([]) => Selection::Whole,
        Some(items) => Selection::Keys(items.iter().map(|i| i.key.clone()).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(key: &str, names: impl Iterator<Item = String>) -> BTreeMap<String, String> {
        BTreeMap::from([(key.to_owned(), names.collect::<Vec<_>>().join(","))])
    }

    #[test]
    fn discovery_stops_at_the_limit_whatever_the_order_of_the_names() {
        let spec = PodSpec::default();
        // Reverse order: every name would be inserted at the front of the sorted list.
        let many = annotations(
            EXTRA_CONFIGMAPS_ANNOTATION,
            (0..10_000).rev().map(|i| format!("cm-{i:05}")),
        );
        let refs = discover_within(&spec, Some(&many), 256);
        assert!(refs.over_limit());
        assert_eq!(refs.len(), 256);

        // Exactly at the limit (and the same name repeated) is not over it.
        let at_limit = annotations(
            EXTRA_SECRETS_ANNOTATION,
            (0..512).map(|i| format!("s-{:03}", i % 256)),
        );
        let refs = discover_within(&spec, Some(&at_limit), 256);
        assert!(!refs.over_limit());
        assert_eq!(refs.len(), 256);

        // Without a limit every distinct object is kept.
        let refs = discover(&spec, Some(&many));
        assert!(!refs.over_limit());
        assert_eq!(refs.len(), 10_000);
    }

    #[test]
    fn invalid_names_kept_for_warnings_are_bounded() {
        let invalid = annotations(
            EXTRA_CONFIGMAPS_ANNOTATION,
            (0..10_000).map(|i| format!("Not_A_Name_{i}")),
        );
        let refs = discover_within(&PodSpec::default(), Some(&invalid), 256);
        assert_eq!(refs.rejected().len(), MAX_REJECTED);
        assert!(refs.is_empty());
        assert!(!refs.over_limit());
    }
}

//! The watcher's memory: per-key digests of ConfigMaps and Secrets, the workloads and what they
//! reference, and the reverse index from a referenced object to its dependents.
//!
//! Plain data, tested without a client. Per object only the recipe's inputs are kept (tag and
//! SHA-256 per key, the ignore flag, the resourceVersion), never the content, so memory does not
//! grow with the size of Secrets and ConfigMaps.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::num::NonZeroU64;

use hashbrown::HashTable;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use serde_json::Value;

use crate::rollout;
use confighash_core::checksum::{NamedDigest, RecipeError, RefState, StampKey};
use confighash_core::record::ObjectRecord;
use confighash_core::refs::{ObjectKind, ObjectRef, References};
use confighash_core::rules::{self, Lookup};
use confighash_core::workload::{self, Analysis, WorkloadKind};

/// A referenced object's identity: its namespace and (kind, name).
pub type ConfigKey = (String, ObjectRef);

/// What the watcher keeps of one ConfigMap or Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredConfig {
    pub resource_version: Box<str>,
    pub record: ObjectRecord,
    /// Annotated `confighash.dev/rollout: progressive`: its content changes roll its dependents
    /// in progressive waves. Not an input of the recipe.
    pub progressive: bool,
}

impl StoredConfig {
    pub fn from_config_map(cm: &ConfigMap) -> Result<Self, RecipeError> {
        Ok(StoredConfig {
            resource_version: resource_version(cm.metadata.resource_version.as_deref()),
            record: ObjectRecord::config_map(cm)?,
            progressive: is_progressive(cm.metadata.annotations.as_ref()),
        })
    }

    pub fn from_secret(secret: &Secret) -> Self {
        StoredConfig {
            resource_version: resource_version(secret.metadata.resource_version.as_deref()),
            record: ObjectRecord::secret(secret),
            progressive: is_progressive(secret.metadata.annotations.as_ref()),
        }
    }
}

/// Whether an object's annotations carry `confighash.dev/rollout: progressive` (exactly).
pub fn is_progressive(annotations: Option<&std::collections::BTreeMap<String, String>>) -> bool {
    annotations
        .and_then(|a| a.get(confighash_core::names::ROLLOUT_ANNOTATION))
        .is_some_and(|v| v == confighash_core::names::PROGRESSIVE)
}

fn resource_version(rv: Option<&str>) -> Box<str> {
    rv.unwrap_or_default().into()
}

/// The digests of every watched ConfigMap and Secret, by namespace.
///
/// There are far more of these than of anything else the watcher keeps (150,000 in a big
/// cluster), so each is kept in 40 bytes beside one allocation of its name and digests
/// ([`Held`]), in a hash table per namespace found by kind and name.
#[derive(Default)]
pub struct ConfigStore {
    namespaces: HashMap<String, HashTable<Held>>,
    hasher: RandomState,
    config_maps: usize,
    secrets: usize,
}

impl std::fmt::Debug for ConfigStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigStore")
            .field("config_maps", &self.config_maps)
            .field("secrets", &self.secrets)
            .finish_non_exhaustive()
    }
}

/// What the store keeps of one object: [`StoredConfig`] with the name inside the digests'
/// allocation and the resourceVersion as a number.
#[derive(Debug)]
struct Held {
    named: NamedDigest,
    /// The resourceVersion as an etcd revision; None when it is not a decimal number above 0,
    /// and then no arrival is refused as older than it.
    resource_version: Option<NonZeroU64>,
    kind: ObjectKind,
    ignored: bool,
    progressive: bool,
}

impl Held {
    fn new(name: &str, kind: ObjectKind, config: &StoredConfig) -> Self {
        Held {
            named: NamedDigest::new(name, &config.record.digest),
            resource_version: revision(&config.resource_version),
            kind,
            ignored: config.record.ignored,
            progressive: config.progressive,
        }
    }

    fn is(&self, kind: ObjectKind, name: &str) -> bool {
        self.kind == kind && self.named.name() == name
    }

    fn stored(&self) -> StoredConfig {
        StoredConfig {
            resource_version: self
                .resource_version
                .map(|rv| rv.to_string())
                .unwrap_or_default()
                .into(),
            record: ObjectRecord {
                ignored: self.ignored,
                digest: self.named.digest(),
            },
            progressive: self.progressive,
        }
    }
}

fn revision(rv: &str) -> Option<NonZeroU64> {
    rv.parse().ok()
}

/// Whether resourceVersion `rv` is older than `held` (both decimal numbers, as etcd's
/// revisions are; otherwise nothing can be said, and it is not).
pub(crate) fn older_revision(rv: &str, held: &str) -> bool {
    matches!((revision(rv), revision(held)), (Some(rv), Some(held)) if rv < held)
}

impl ConfigStore {
    fn hash(&self, kind: ObjectKind, name: &str) -> u64 {
        self.hasher.hash_one((kind, name))
    }

    /// Records an object's state. True when the recipe's inputs changed: a new object, new
    /// content, or the ignore annotation added or removed (metadata-only writes are false).
    ///
    /// An object older than the one held (a lower resourceVersion of the same object, as a
    /// cached list or a lagging watch can deliver) is refused: the view never goes back in one
    /// object's history. resourceVersions are compared only when both are decimal numbers, as
    /// etcd's revisions are; otherwise the newer arrival is taken.
    pub fn upsert(&mut self, key: ConfigKey, config: StoredConfig) -> bool {
        let (namespace, object) = key;
        let kind = object.kind;
        let hash = self.hash(kind, &object.name);
        let hasher = &self.hasher;
        let objects = self.namespaces.entry(namespace).or_default();
        let entry = objects.entry(
            hash,
            |h| h.is(kind, &object.name),
            |h| hasher.hash_one((h.kind, h.named.name())),
        );
        match entry {
            hashbrown::hash_table::Entry::Occupied(mut held) => {
                let old = held.get_mut();
                let rv = revision(&config.resource_version);
                if let (Some(rv), Some(held_rv)) = (rv, old.resource_version)
                    && rv < held_rv
                {
                    tracing::debug!(
                        name = %object.name,
                        resource_version = %config.resource_version,
                        held = %held_rv,
                        "an older state of a ConfigMap or Secret; ignored"
                    );
                    return false;
                }
                let changed = old.ignored != config.record.ignored
                    || !old.named.same_digest(&config.record.digest);
                if changed {
                    *old = Held::new(&object.name, kind, &config);
                } else {
                    old.resource_version = rv;
                    old.progressive = config.progressive;
                }
                changed
            }
            hashbrown::hash_table::Entry::Vacant(place) => {
                place.insert(Held::new(&object.name, kind, &config));
                *self.count_mut(kind) += 1;
                true
            }
        }
    }

    /// Forgets an object. True when it was known.
    pub fn remove(&mut self, key: &ConfigKey) -> bool {
        let (namespace, object) = key;
        let hash = self.hash(object.kind, &object.name);
        let Some(objects) = self.namespaces.get_mut(namespace) else {
            return false;
        };
        let removed = match objects.find_entry(hash, |h| h.is(object.kind, &object.name)) {
            Ok(held) => {
                held.remove();
                true
            }
            Err(_) => false,
        };
        if objects.is_empty() {
            self.namespaces.remove(namespace);
        }
        if removed {
            *self.count_mut(object.kind) -= 1;
        }
        removed
    }

    fn held(&self, namespace: &str, object: &ObjectRef) -> Option<&Held> {
        let hash = self.hash(object.kind, &object.name);
        self.namespaces
            .get(namespace)?
            .find(hash, |h| h.is(object.kind, &object.name))
    }

    /// Whether an object is held and annotated `confighash.dev/rollout: progressive`.
    pub fn is_progressive(&self, key: &ConfigKey) -> bool {
        self.held(&key.0, &key.1).is_some_and(|h| h.progressive)
    }

    /// A copy of what is held of an object.
    pub fn get(&self, key: &ConfigKey) -> Option<StoredConfig> {
        self.held(&key.0, &key.1).map(Held::stored)
    }

    /// What the recipe sees of an object.
    pub fn state(&self, namespace: &str, object: &ObjectRef) -> RefState<'_> {
        match self.held(namespace, object) {
            None => RefState::Absent,
            Some(h) if h.ignored => RefState::Ignored,
            Some(h) => RefState::Present(&h.named),
        }
    }

    /// Every object's key as (namespace, kind, name), for re-list comparisons.
    pub fn keys(&self) -> impl Iterator<Item = (&str, ObjectKind, &str)> {
        self.namespaces.iter().flat_map(|(ns, objects)| {
            objects
                .iter()
                .map(move |h| (ns.as_str(), h.kind, h.named.name()))
        })
    }

    /// Drops every object of a namespace (opted out, or deleted).
    pub fn remove_namespace(&mut self, namespace: &str) {
        for held in self.namespaces.remove(namespace).into_iter().flatten() {
            *self.count_mut(held.kind) -= 1;
        }
    }

    /// Whether anything of this namespace is kept.
    #[cfg(feature = "testkit")]
    pub fn has_namespace(&self, namespace: &str) -> bool {
        self.namespaces.contains_key(namespace)
    }

    /// How many objects of a kind are kept.
    pub fn count(&self, kind: ObjectKind) -> usize {
        match kind {
            ObjectKind::ConfigMap => self.config_maps,
            ObjectKind::Secret => self.secrets,
        }
    }

    fn count_mut(&mut self, kind: ObjectKind) -> &mut usize {
        match kind {
            ObjectKind::ConfigMap => &mut self.config_maps,
            ObjectKind::Secret => &mut self.secrets,
        }
    }

    pub fn len(&self) -> usize {
        self.config_maps + self.secrets
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The rules' view of a workload's references in `namespace` ([`rules::expected`]), over
    /// `max_bytes` too large.
    pub fn lookup(
        &self,
        key: &StampKey,
        namespace: &str,
        refs: &References,
        with_v1: bool,
        max_bytes: u64,
    ) -> Lookup {
        let view = NamespaceOfStore {
            store: self,
            namespace,
        };
        rules::expected(&view, Some(key), namespace, refs, with_v1, max_bytes)
    }
}

/// The store as the recipe sees one namespace.
struct NamespaceOfStore<'a> {
    store: &'a ConfigStore,
    namespace: &'a str,
}

impl rules::View for NamespaceOfStore<'_> {
    fn state(&self, object: &ObjectRef) -> RefState<'_> {
        self.store.state(self.namespace, object)
    }
}

/// One namespace of the store with one object as it was before (`None`: absent), the rest as
/// now: what a workload's stamp was before that object's change.
struct AsIf<'a> {
    inner: NamespaceOfStore<'a>,
    object: &'a ObjectRef,
    before: Option<(bool, NamedDigest)>,
}

impl rules::View for AsIf<'_> {
    fn state(&self, object: &ObjectRef) -> RefState<'_> {
        if object != self.object {
            return self.inner.state(object);
        }
        match &self.before {
            None => RefState::Absent,
            Some((true, _)) => RefState::Ignored,
            Some((false, named)) => RefState::Present(named),
        }
    }
}

impl ConfigStore {
    /// As [`ConfigStore::lookup`], with `object` as `before` says it was (`None`: absent)
    /// instead of as it is now.
    #[allow(clippy::too_many_arguments)]
    pub fn lookup_as_if(
        &self,
        key: &StampKey,
        namespace: &str,
        refs: &References,
        with_v1: bool,
        max_bytes: u64,
        object: &ObjectRef,
        before: Option<&ObjectRecord>,
    ) -> Lookup {
        let view = AsIf {
            inner: NamespaceOfStore {
                store: self,
                namespace,
            },
            object,
            before: before.map(|r| (r.ignored, NamedDigest::new(&object.name, &r.digest))),
        };
        rules::expected(&view, Some(key), namespace, refs, with_v1, max_bytes)
    }
}

/// A workload's identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkloadKey {
    pub kind: WorkloadKindKey,
    pub namespace: String,
    pub name: String,
}

/// [`WorkloadKind`] in a key: kinds sort built-in kinds first, in [`WorkloadKind::BUILT_IN`]'s
/// order, then configured kinds in the order they were configured. As large as a `u8` would be
/// here: the key's strings align it to 8 bytes anyway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkloadKindKey(WorkloadKind);

impl From<WorkloadKind> for WorkloadKindKey {
    fn from(kind: WorkloadKind) -> Self {
        WorkloadKindKey(kind)
    }
}

impl WorkloadKindKey {
    pub fn kind(self) -> WorkloadKind {
        self.0
    }
}

impl WorkloadKey {
    pub fn new(kind: WorkloadKind, namespace: &str, name: &str) -> Self {
        WorkloadKey {
            kind: kind.into(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }
}

impl std::fmt::Display for WorkloadKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind.kind(), self.namespace, self.name)
    }
}

/// What the watcher keeps of one workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadEntry {
    pub refs: References,
    pub stamp: Option<String>,
    pub marker: bool,
    pub opted_out: bool,
    /// Labelled `confighash.dev/enabled=true`: handled as in an opted-in namespace wherever it is
    /// (but in an excluded namespace).
    pub opted_in: bool,
    /// False for `OnDelete` update strategies and paused Deployments and Rollouts: a new
    /// template does not replace their pods by itself.
    pub rolls_by_itself: bool,
    pub resource_version: String,
    pub uid: String,
    /// It references more objects than `--max-references`, or carries the terminal
    /// `too-many-references` marker: never touched, its references not kept.
    pub too_many_references: bool,
    /// Its creationTimestamp, in seconds since the Unix epoch.
    pub created: Option<i64>,
    /// `metadata.generation` (0 when absent): it grows with every change of the spec, pod
    /// template included, so a state of lower generation than one already seen is older.
    pub generation: i64,
    /// Where its rollout stands, by its `status` ([`rollout::progress`]): read at every event,
    /// used only while the watcher follows a rollout of it. One byte in what was padding: the
    /// index does not grow.
    pub rollout: Option<rollout::Progress>,
    /// An Argo Rollout waiting at a `pause` step with a duration: its rollout goes on by
    /// itself, so a progressive wave's no-progress clock does not run meanwhile.
    pub timed_pause: bool,
}

impl WorkloadEntry {
    /// Reads a workload object; `None` for what confighash does not stamp (a Rollout with
    /// `workloadRef`).
    pub fn from_object(
        kind: WorkloadKind,
        obj: &Value,
    ) -> Result<Option<Self>, workload::WorkloadError> {
        Self::read(kind, obj, usize::MAX)
    }

    /// [`Self::from_object`] with at most `max_references` references read, then
    /// [`Self::limit_references`]: what the watcher keeps, at a cost that stops at the limit.
    pub fn from_object_within(
        kind: WorkloadKind,
        obj: &Value,
        max_references: usize,
    ) -> Result<Option<Self>, workload::WorkloadError> {
        Ok(Self::read(kind, obj, max_references)?.map(|e| e.limit_references(max_references)))
    }

    fn read(
        kind: WorkloadKind,
        obj: &Value,
        max_references: usize,
    ) -> Result<Option<Self>, workload::WorkloadError> {
        let info = match workload::analyze_within(kind, obj, max_references)? {
            Analysis::Workload(info) => info,
            Analysis::Unsupported | Analysis::WorkloadRef => return Ok(None),
        };
        // Paused by a person, or at an Argo Rollout's `pause: {}` step (it waits for one).
        let pause = rollout::pause(kind, obj);
        let paused = obj.pointer("/spec/paused").and_then(Value::as_bool) == Some(true)
            || pause == rollout::Pause::Indefinite;
        // OnDelete, or an in-place update (OpenKruise's `InPlaceIfPossible`, `InPlaceOnly`):
        // a change of the template's annotations alone is patched onto the running pods, whose
        // containers do not restart, so they do not read the new config.
        let on_delete = matches!(
            obj.pointer("/spec/updateStrategy/type")
                .and_then(Value::as_str),
            Some("OnDelete" | "InPlaceIfPossible" | "InPlaceOnly")
        );
        let text = |p: &str| {
            obj.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        Ok(Some(WorkloadEntry {
            refs: info.refs,
            stamp: info.stamp,
            marker: info.marker,
            opted_out: info.opted_out,
            opted_in: info.opted_in,
            rolls_by_itself: !paused && !on_delete,
            timed_pause: pause == rollout::Pause::Timed,
            resource_version: text("/metadata/resourceVersion"),
            uid: text("/metadata/uid"),
            too_many_references: info.too_many_references,
            created: obj
                .pointer("/metadata/creationTimestamp")
                .and_then(Value::as_str)
                .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
                .map(|t| t.as_second()),
            generation: obj
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0),
            rollout: rollout::progress(kind, obj),
        }))
    }

    /// Freezes a workload that references more than `max_references` objects (or carries the
    /// terminal marker): the webhook reads nothing for it, so the watcher never touches it and
    /// keeps none of its references.
    pub fn limit_references(mut self, max_references: usize) -> Self {
        if self.too_many_references || self.refs.over_limit() || self.refs.len() > max_references {
            self.too_many_references = true;
            self.opted_out = true;
            self.opted_in = false;
            self.refs = References::default();
        }
        self
    }
}

/// Every watched workload and the reverse index reference -> workloads.
///
/// References are same-namespace, so the reverse index is kept per namespace and names each
/// dependent by kind and name only ([`Dependents`]: most objects have one or two users, and a
/// vector's spare room, four places at its first push, would cost more than the users
/// themselves). It is keyed by a 64-bit hash of the referenced object, not the
/// object's name (a copy of the name per referenced object was a third of the index); the
/// rare objects whose hashes collide share a slice, so every answer is checked against the
/// dependents' own references.
#[derive(Debug, Default)]
pub struct WorkloadIndex {
    /// Boxed: a table's free places are as large as its values, and at 20,000 workloads a
    /// third of them or more are free.
    workloads: HashMap<WorkloadKey, Box<WorkloadEntry>>,
    reverse: HashMap<String, HashMap<u64, Dependents>>,
    /// How many workloads of each kind are kept.
    counts: HashMap<WorkloadKindKey, usize>,
    hasher: RandomState,
    /// Every object gets the same key: the collisions' path, for tests.
    #[cfg(test)]
    collide: bool,
}

/// The users of one object (or of objects whose hashes collide): sorted, each once. Most
/// objects have one user, kept in place; more take a slice of exactly their number.
#[derive(Debug)]
enum Dependents {
    One(Dependent),
    Many(Box<[Dependent]>),
}

type Dependent = (WorkloadKindKey, Box<str>);

impl Dependents {
    fn as_slice(&self) -> &[Dependent] {
        match self {
            Dependents::One(one) => std::slice::from_ref(one),
            Dependents::Many(many) => many,
        }
    }

    fn search(&self, dependent: (WorkloadKindKey, &str)) -> Result<usize, usize> {
        self.as_slice()
            .binary_search_by(|(k, n)| (*k, &**n).cmp(&dependent))
    }

    /// With `dependent` added in order (unchanged when it is there).
    fn add(&mut self, dependent: (WorkloadKindKey, &str)) {
        if let Err(i) = self.search(dependent) {
            let mut grown: Vec<Dependent> = Vec::with_capacity(self.as_slice().len() + 1);
            grown.extend_from_slice(&self.as_slice()[..i]);
            grown.push((dependent.0, Box::from(dependent.1)));
            grown.extend_from_slice(&self.as_slice()[i..]);
            *self = Dependents::Many(grown.into_boxed_slice());
        }
    }

    /// Without `dependent`; None when no user is left.
    fn without(self, dependent: (WorkloadKindKey, &str)) -> Option<Dependents> {
        let Ok(i) = self.search(dependent) else {
            return Some(self);
        };
        let mut kept = match self {
            Dependents::One(_) => return None,
            Dependents::Many(many) => many.into_vec(),
        };
        kept.remove(i);
        match kept.len() {
            0 => None,
            1 => kept.pop().map(Dependents::One),
            _ => Some(Dependents::Many(kept.into_boxed_slice())),
        }
    }
}

impl WorkloadIndex {
    /// The reverse index's key of an object.
    fn slot(&self, object: &ObjectRef) -> u64 {
        #[cfg(test)]
        if self.collide {
            return 0;
        }
        self.hasher.hash_one(object)
    }

    /// The distinct reverse-index keys of a workload's references.
    fn slots(&self, entry: &WorkloadEntry) -> Vec<u64> {
        let mut slots: Vec<u64> = entry.refs.iter().map(|(r, _)| self.slot(r)).collect();
        slots.sort_unstable();
        slots.dedup();
        slots
    }

    /// Records a workload, replacing what was known of it.
    pub fn upsert(&mut self, key: WorkloadKey, mut entry: WorkloadEntry) {
        self.unlink(&key);
        entry.refs.shrink_to_fit();
        if !entry.refs.is_empty() {
            let slots = self.slots(&entry);
            let objects = self.reverse.entry(key.namespace.clone()).or_default();
            for slot in slots {
                let dependent = (key.kind, &*key.name);
                match objects.entry(slot) {
                    std::collections::hash_map::Entry::Occupied(mut users) => {
                        users.get_mut().add(dependent)
                    }
                    std::collections::hash_map::Entry::Vacant(place) => {
                        place.insert(Dependents::One((key.kind, Box::from(&*key.name))));
                    }
                }
            }
        }
        let kind = key.kind;
        if self.workloads.insert(key, Box::new(entry)).is_none() {
            *self.counts.entry(kind).or_default() += 1;
        }
    }

    /// Forgets a workload. True when it was known.
    pub fn remove(&mut self, key: &WorkloadKey) -> bool {
        self.unlink(key);
        let removed = self.workloads.remove(key).is_some();
        if removed && let Some(count) = self.counts.get_mut(&key.kind) {
            *count = count.saturating_sub(1);
        }
        removed
    }

    /// How many workloads of a kind are kept.
    pub fn count_of(&self, kind: WorkloadKind) -> usize {
        self.counts
            .get(&WorkloadKindKey::from(kind))
            .copied()
            .unwrap_or(0)
    }

    fn unlink(&mut self, key: &WorkloadKey) {
        let Some(old) = self.workloads.get(key) else {
            return;
        };
        let slots = self.slots(old);
        let Some(objects) = self.reverse.get_mut(&key.namespace) else {
            return;
        };
        for slot in slots {
            if let Some(users) = objects.remove(&slot)
                && let Some(left) = users.without((key.kind, &key.name))
            {
                objects.insert(slot, left);
            }
        }
        if objects.is_empty() {
            self.reverse.remove(&key.namespace);
        }
    }

    /// The dependents recorded under an object's key: its users, and those of any object whose
    /// key collides with it.
    fn candidates<'a>(
        &'a self,
        config: &'a ConfigKey,
    ) -> impl Iterator<Item = &'a (WorkloadKindKey, Box<str>)> + 'a {
        let (namespace, object) = config;
        self.reverse
            .get(namespace)
            .and_then(|objects| objects.get(&self.slot(object)))
            .map(Dependents::as_slice)
            .into_iter()
            .flatten()
    }

    /// Whether the workload `(kind, name)` of the object's namespace references the object.
    fn uses(&self, config: &ConfigKey, kind: WorkloadKindKey, name: &str) -> bool {
        let (namespace, object) = config;
        // A lookup by borrowed parts would need the key's own type; the candidates are few.
        let key = WorkloadKey {
            kind,
            namespace: namespace.clone(),
            name: name.to_owned(),
        };
        self.workloads
            .get(&key)
            .is_some_and(|e| e.refs.get(object).is_some())
    }

    pub fn get(&self, key: &WorkloadKey) -> Option<&WorkloadEntry> {
        self.workloads.get(key).map(|e| &**e)
    }

    pub fn get_mut(&mut self, key: &WorkloadKey) -> Option<&mut WorkloadEntry> {
        self.workloads.get_mut(key).map(|e| &mut **e)
    }

    /// The workloads that reference an object, in order.
    pub fn dependents<'a>(
        &'a self,
        config: &'a ConfigKey,
    ) -> impl Iterator<Item = WorkloadKey> + 'a {
        let (namespace, object) = config;
        self.candidates(config)
            .map(move |(kind, name)| WorkloadKey {
                kind: *kind,
                namespace: namespace.clone(),
                name: name.to_string(),
            })
            .filter(move |key| {
                self.workloads
                    .get(key)
                    .is_some_and(|e| e.refs.get(object).is_some())
            })
    }

    /// Whether any workload references the object.
    pub fn is_referenced(&self, config: &ConfigKey) -> bool {
        self.candidates(config)
            .any(|(kind, name)| self.uses(config, *kind, name))
    }

    pub fn iter(&self) -> impl Iterator<Item = (&WorkloadKey, &WorkloadEntry)> {
        self.workloads.iter().map(|(k, e)| (k, &**e))
    }

    pub fn keys_of(&self, kind: WorkloadKind) -> Vec<WorkloadKey> {
        let kind = WorkloadKindKey::from(kind);
        self.workloads
            .keys()
            .filter(|k| k.kind == kind)
            .cloned()
            .collect()
    }

    pub fn remove_namespace(&mut self, namespace: &str) {
        let keys: Vec<WorkloadKey> = self
            .workloads
            .keys()
            .filter(|k| k.namespace == namespace)
            .cloned()
            .collect();
        for k in keys {
            self.remove(&k);
        }
    }

    pub fn len(&self) -> usize {
        self.workloads.len()
    }

    pub fn is_empty(&self) -> bool {
        self.workloads.is_empty()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_kind_in_a_key_costs_no_more_than_a_byte_did() {
        // A dependent is kept per reference: the kind shares the name's alignment.
        assert_eq!(std::mem::size_of::<Dependent>(), 24);
        assert_eq!(std::mem::size_of::<WorkloadKey>(), 56);
        let clone_set =
            WorkloadKind::parse("apps.kruise.io/v1alpha1/CloneSet=/spec/template").unwrap();
        let key = WorkloadKey::new(clone_set, "shop", "web");
        assert_eq!(key.kind.kind(), clone_set, "a configured kind stays itself");
        assert!(WorkloadKindKey::from(WorkloadKind::ROLLOUT) < key.kind);
    }

    use super::*;
    use serde_json::json;

    #[test]
    fn an_in_place_update_strategy_does_not_roll_pods_by_itself() {
        let clone_set =
            WorkloadKind::parse("apps.kruise.io/v1alpha1/CloneSet=/spec/template").unwrap();
        let with = |strategy: &str| {
            let obj = json!({
                "metadata": {"name": "web", "namespace": "shop"},
                "spec": {"updateStrategy": {"type": strategy},
                         "template": {"spec": {"containers": [{"name": "app"}]}}},
            });
            WorkloadEntry::from_object(clone_set, &obj)
                .unwrap()
                .unwrap()
                .rolls_by_itself
        };
        assert!(with("ReCreate"));
        assert!(
            !with("InPlaceIfPossible"),
            "the stamp is patched onto running pods"
        );
        assert!(!with("InPlaceOnly"));
        assert!(!with("OnDelete"));
    }

    #[test]
    fn an_argo_rollout_at_a_pause_step_is_timed_or_waits_for_a_person() {
        let at = |index: u64| {
            let obj = json!({
                "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
                "metadata": {"name": "web", "namespace": "shop"},
                "spec": {"strategy": {"canary": {"steps": [
                    {"pause": {"duration": "1h"}}, {"pause": {}}]}},
                    "template": {"spec": {"containers": [{"name": "app"}]}}},
                "status": {"phase": "Paused", "currentStepIndex": index,
                    "pauseConditions": [{"reason": "CanaryPauseStep"}]},
            });
            let e = WorkloadEntry::from_object(WorkloadKind::ROLLOUT, &obj)
                .unwrap()
                .unwrap();
            (e.rolls_by_itself, e.timed_pause)
        };
        assert_eq!(at(0), (true, true), "a timed pause is part of its rollout");
        assert_eq!(at(1), (false, false), "pause: {{}} waits for a person");
    }

    fn deployment(names: &[String]) -> Value {
        json!({
            "metadata": {
                "name": "web",
                "annotations": {confighash_core::names::EXTRA_CONFIGMAPS_ANNOTATION: names.join(",")},
            },
            "spec": {"template": {"spec": {"containers": [{"name": "app"}]}}},
        })
    }

    fn using(names: &[&str]) -> WorkloadEntry {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        WorkloadEntry::from_object(WorkloadKind::DEPLOYMENT, &deployment(&names))
            .unwrap()
            .unwrap()
    }

    #[test]
    fn dependents_are_exact_even_when_every_object_shares_a_key() {
        for collide in [false, true] {
            let mut index = WorkloadIndex {
                collide,
                ..WorkloadIndex::default()
            };
            let key = |name: &str| WorkloadKey::new(WorkloadKind::DEPLOYMENT, "shop", name);
            let object = |name: &str| {
                (
                    "shop".to_owned(),
                    ObjectRef::new(ObjectKind::ConfigMap, name),
                )
            };
            let names = |index: &WorkloadIndex, object: &ConfigKey| -> Vec<String> {
                index.dependents(object).map(|k| k.name).collect()
            };
            index.upsert(key("web"), using(&["a", "b"]));
            index.upsert(key("api"), using(&["b"]));
            index.upsert(key("job"), using(&["c"]));
            assert_eq!(names(&index, &object("a")), ["web"], "collide: {collide}");
            assert_eq!(names(&index, &object("b")), ["api", "web"]);
            assert_eq!(names(&index, &object("c")), ["job"]);
            assert!(names(&index, &object("d")).is_empty());
            assert!(index.is_referenced(&object("a")) && !index.is_referenced(&object("d")));
            // web stops using b; api is deleted; job moves to a.
            index.upsert(key("web"), using(&["a"]));
            assert!(index.remove(&key("api")));
            index.upsert(key("job"), using(&["a"]));
            assert_eq!(names(&index, &object("a")), ["job", "web"]);
            assert!(names(&index, &object("b")).is_empty() && !index.is_referenced(&object("b")));
            assert!(!index.is_referenced(&object("c")));
            index.remove(&key("web"));
            index.remove(&key("job"));
            assert!(index.reverse.is_empty(), "nothing left behind");
        }
    }

    #[test]
    fn a_workload_over_the_limit_is_frozen_without_reading_past_it() {
        let many: Vec<String> = (0..10_000).rev().map(|i| format!("cm-{i:05}")).collect();
        let entry =
            WorkloadEntry::from_object_within(WorkloadKind::DEPLOYMENT, &deployment(&many), 256)
                .unwrap()
                .unwrap();
        assert!(entry.too_many_references);
        assert!(entry.opted_out);
        assert!(entry.refs.is_empty());
        let mut labelled = deployment(&many);
        labelled["metadata"]["labels"] =
            serde_json::json!({confighash_core::names::ENABLED_LABEL: "true"});
        let entry = WorkloadEntry::from_object_within(WorkloadKind::DEPLOYMENT, &labelled, 256)
            .unwrap()
            .unwrap();
        assert!(
            entry.opted_out && !entry.opted_in,
            "frozen, opted in or not"
        );

        let at_limit: Vec<String> = (0..256).map(|i| format!("cm-{i:03}")).collect();
        let entry = WorkloadEntry::from_object_within(
            WorkloadKind::DEPLOYMENT,
            &deployment(&at_limit),
            256,
        )
        .unwrap()
        .unwrap();
        assert!(!entry.too_many_references);
        assert_eq!(entry.refs.len(), 256);
    }

    fn config_map_at(rv: &str, value: &str) -> StoredConfig {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "app", "namespace": "shop", "resourceVersion": rv},
            "data": {"k": value},
        }))
        .unwrap();
        StoredConfig::from_config_map(&cm).unwrap()
    }

    #[test]
    fn an_older_state_of_an_object_never_replaces_a_newer_one() {
        let key = (
            "shop".to_owned(),
            ObjectRef::new(ObjectKind::ConfigMap, "app"),
        );
        let mut store = ConfigStore::default();
        assert!(store.upsert(key.clone(), config_map_at("20", "B")));
        // A cached list or a lagging watch delivers the state before it.
        assert!(!store.upsert(key.clone(), config_map_at("9", "A")));
        let held = store.get(&key).expect("the object is held");
        assert_eq!(&*held.resource_version, "20");
        assert_eq!(held.record, config_map_at("20", "B").record);
        // Newer states go in; equal ones too (a relist repeats what was seen).
        assert!(!store.upsert(key.clone(), config_map_at("20", "B")));
        assert!(store.upsert(key.clone(), config_map_at("31", "C")));
        // resourceVersions that are not numbers cannot be compared: the arrival is taken.
        assert!(store.upsert(key.clone(), config_map_at("x", "D")));
        assert!(
            store.upsert(key.clone(), config_map_at("9", "E")),
            "nor with one that is not"
        );
    }
}

//! The object store: what etcd and the watch cache are to kube-apiserver.
//!
//! One global, monotonically increasing resourceVersion; every write gets the next one. Writes are
//! kept in a history that watches replay from a resourceVersion, until it is compacted (then a
//! watch from an older version gets 410 Gone, as after an etcd compaction). Every stored write is
//! broadcast to open watches while the store is locked, so a watch that subscribes under the lock
//! misses nothing and sees events in resourceVersion order.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::broadcast;

use crate::apiserver::resources::ResourceInfo;

/// Where an object lives: its resource, namespace ("" when cluster-scoped) and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub group: &'static str,
    pub plural: &'static str,
    pub namespace: String,
    pub name: String,
}

impl Key {
    pub fn new(resource: &'static ResourceInfo, namespace: &str, name: &str) -> Self {
        Key {
            group: resource.group,
            plural: resource.plural,
            namespace: if resource.namespaced {
                namespace.to_owned()
            } else {
                String::new()
            },
            name: name.to_owned(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One stored write, as watches see it.
#[derive(Debug, Clone)]
pub struct Event {
    pub rv: u64,
    pub resource: &'static ResourceInfo,
    pub kind: EventType,
    /// The object after the write (for DELETED, the last state, with the delete's resourceVersion).
    pub object: Arc<Value>,
    /// The object before the write, so a watch with a selector can turn a MODIFIED that leaves
    /// (or enters) its selection into DELETED (or ADDED), as the watch cache does.
    pub old: Option<Arc<Value>>,
}

/// A list served page by page from the state it had at its first page, as an etcd range read at
/// a fixed revision does.
#[derive(Debug)]
pub struct Snapshot {
    pub rv: u64,
    pub items: Vec<Value>,
}

pub struct Store {
    rv: u64,
    objects: BTreeMap<Key, Arc<Value>>,
    history: VecDeque<Event>,
    /// Watches and continues from a resourceVersion below this get 410 Gone.
    compacted: u64,
    events: broadcast::Sender<Event>,
    rollouts: HashMap<(String, String, String), u64>,
    snapshots: HashMap<u64, Snapshot>,
    next_id: u64,
    /// Every write of each Namespace with when it was made (None: deleted), for views of the
    /// Namespaces that lag behind the store (see `namespace_as_of`).
    namespace_log: HashMap<String, VecDeque<NamespaceWrite>>,
}

/// When a Namespace was written, and how it was then (None: deleted).
type NamespaceWrite = (Instant, Option<Arc<Value>>);

/// How many writes of one Namespace `namespace_log` keeps.
const NAMESPACE_LOG: usize = 64;

/// Bound on the replayable history; older writes are compacted away.
const HISTORY: usize = 100_000;

impl Store {
    pub fn new() -> Self {
        Store {
            rv: 1,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            compacted: 0,
            events: broadcast::channel(16_384).0,
            rollouts: HashMap::new(),
            snapshots: HashMap::new(),
            next_id: 0,
            namespace_log: HashMap::new(),
        }
    }

    /// The current resourceVersion: the version of the latest write.
    pub fn rv(&self) -> u64 {
        self.rv
    }

    pub fn compacted(&self) -> u64 {
        self.compacted
    }

    pub fn get(&self, key: &Key) -> Option<Arc<Value>> {
        self.objects.get(key).cloned()
    }

    /// Every object of a resource (in one namespace, or all when `namespace` is None), in
    /// (namespace, name) order.
    pub fn list(
        &self,
        resource: &'static ResourceInfo,
        namespace: Option<&str>,
    ) -> Vec<Arc<Value>> {
        self.objects
            .iter()
            .filter(|(k, _)| k.group == resource.group && k.plural == resource.plural)
            .filter(|(k, _)| namespace.is_none_or(|ns| k.namespace == ns))
            .map(|(_, v)| v.clone())
            .collect()
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// Writes in history after `rv`, or None when `rv` is older than the compaction point.
    pub fn since(&self, rv: u64) -> Option<impl Iterator<Item = &Event>> {
        if rv < self.compacted {
            return None;
        }
        Some(self.history.iter().filter(move |e| e.rv > rv))
    }

    /// A fresh uid, in the UUID form Kubernetes uses.
    pub fn uid(&mut self) -> String {
        self.next_id += 1;
        format!("00000000-0000-4000-8000-{:012x}", self.next_id)
    }

    /// A suffix for `generateName`, from the alphabet Kubernetes uses (no vowels, no 0/1/3).
    pub fn name_suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        self.next_id += 1;
        let mut n = self.next_id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (0..5)
            .map(|_| {
                let c = ALPHABET[(n % ALPHABET.len() as u64) as usize] as char;
                n /= ALPHABET.len() as u64;
                c
            })
            .collect()
    }

    /// Stores `object` (or deletes, when None) under the next resourceVersion and broadcasts it.
    /// Returns the stored object with its new `metadata.resourceVersion`.
    pub fn write(
        &mut self,
        resource: &'static ResourceInfo,
        key: Key,
        object: Option<Value>,
    ) -> Option<Arc<Value>> {
        self.commit(resource, key, object, None)
    }

    /// Deletes the object, with `last` as the state its DELETED event carries (as when a write
    /// that empties the finalizers of an object being deleted deletes it instead).
    pub fn delete_as(
        &mut self,
        resource: &'static ResourceInfo,
        key: Key,
        last: Value,
    ) -> Option<Arc<Value>> {
        self.commit(resource, key, None, Some(last))
    }

    fn commit(
        &mut self,
        resource: &'static ResourceInfo,
        key: Key,
        object: Option<Value>,
        last: Option<Value>,
    ) -> Option<Arc<Value>> {
        self.rv += 1;
        let rv = self.rv;
        let old = self.objects.get(&key).cloned();
        let name = key.name.clone();
        let (kind, stored) = match object {
            Some(mut obj) => {
                set_rv(&mut obj, rv);
                let obj = Arc::new(obj);
                self.count_rollout(resource, &key, old.as_deref(), &obj);
                self.objects.insert(key, obj.clone());
                let kind = if old.is_some() {
                    EventType::Modified
                } else {
                    EventType::Added
                };
                (kind, obj)
            }
            None => {
                self.objects.remove(&key);
                let mut last = last
                    .or_else(|| old.as_deref().cloned())
                    .unwrap_or(Value::Null);
                set_rv(&mut last, rv);
                (EventType::Deleted, Arc::new(last))
            }
        };
        if resource.group.is_empty() && resource.kind == "Namespace" {
            let log = self.namespace_log.entry(name).or_default();
            if log.len() == NAMESPACE_LOG {
                log.pop_front();
            }
            let state = (kind != EventType::Deleted).then(|| stored.clone());
            log.push_back((Instant::now(), state));
        }
        let event = Event {
            rv,
            resource,
            kind,
            object: stored.clone(),
            old,
        };
        if self.history.len() == HISTORY
            && let Some(dropped) = self.history.pop_front()
        {
            self.compacted = dropped.rv;
        }
        self.history.push_back(event.clone());
        // No receiver is not an error: nobody is watching.
        let _ = self.events.send(event);
        Some(stored)
    }

    /// Pod-template transitions: a write whose template differs from the stored one's.
    fn count_rollout(
        &mut self,
        resource: &ResourceInfo,
        key: &Key,
        old: Option<&Value>,
        new: &Value,
    ) {
        let (Some(pointer), Some(old)) = (resource.template, old) else {
            return;
        };
        if old.pointer(pointer) != new.pointer(pointer) {
            *self
                .rollouts
                .entry((
                    key.namespace.clone(),
                    resource.kind.to_owned(),
                    key.name.clone(),
                ))
                .or_default() += 1;
        }
    }

    /// The Namespace `name` as a cache that applies each write `lag` after it was made sees it
    /// now; None when that view has no such Namespace (not yet created, or deleted).
    pub fn namespace_as_of(&self, name: &str, lag: Duration) -> Option<Arc<Value>> {
        let now = Instant::now();
        self.namespace_log
            .get(name)?
            .iter()
            .rev()
            .find(|(at, _)| now.saturating_duration_since(*at) >= lag)
            .and_then(|(_, state)| state.clone())
    }

    pub fn rollouts(&self, namespace: &str, kind: &str, name: &str) -> u64 {
        self.rollouts
            .get(&(namespace.to_owned(), kind.to_owned(), name.to_owned()))
            .copied()
            .unwrap_or(0)
    }

    /// Forgets all history: watches and list continuations from before now get 410 Gone.
    pub fn compact(&mut self) {
        self.compacted = self.rv;
        self.history.clear();
        self.snapshots.clear();
    }

    pub fn save_snapshot(&mut self, snapshot: Snapshot) -> u64 {
        self.next_id += 1;
        self.snapshots.insert(self.next_id, snapshot);
        self.next_id
    }

    pub fn take_snapshot(&mut self, id: u64) -> Option<Snapshot> {
        self.snapshots.remove(&id)
    }
}

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}

fn set_rv(obj: &mut Value, rv: u64) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
}

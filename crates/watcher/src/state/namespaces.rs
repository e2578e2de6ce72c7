//! Which namespaces the watcher decides in: a part of [`State`](super::State) that owns what it
//! knows of them. A namespace is decided in when it is opted in (or a workload there is, by its
//! label), is not being listed after opting in, and is not terminating. What the state must do
//! about a namespace's news comes back as a [`Step`].

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::SystemTime;

use confighash_cluster::watch::Watched;

use crate::index::{ConfigKey, StoredConfig, WorkloadKey};

#[derive(Debug, Default)]
pub(super) struct Namespaces {
    /// Opted in, with when this watcher saw them opt in.
    opted_in: HashMap<String, SystemTime>,
    /// Known not to be opted in: their ConfigMaps and Secrets are not kept, unless a workload
    /// there is opted in.
    excluded: HashSet<String>,
    /// Opted in after being excluded, while their objects are listed.
    listing: HashMap<String, Backfill>,
    /// The last list's generation: a list's results name theirs.
    generation: u64,
    /// Workloads labelled `confighash.dev/enabled=true`, by namespace (excluded namespaces left
    /// out): handled wherever they are, so their namespaces' ConfigMaps and Secrets are kept,
    /// opted in or not.
    workloads_opted_in: HashMap<String, HashSet<WorkloadKey>>,
    /// Being deleted: nothing in them is touched and no Event is recorded there.
    terminating: HashSet<String>,
}

/// A namespace's objects being listed after it opted in.
#[derive(Debug, Default)]
struct Backfill {
    generation: u64,
    /// Objects the watches reported since the opt-in: what they said is at least as new as the
    /// list, so the list does not overwrite them.
    seen: HashSet<ConfigKey>,
    /// Changes whose window closed during the list, decided once it is in.
    deferred: BTreeSet<ConfigKey>,
    /// What the list showed so far.
    listed: HashMap<ConfigKey, StoredConfig>,
}

/// What the state must do about a namespace.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Step {
    Nothing,
    /// Its objects were left out: list them ([`Effect::Backfill`](super::Effect::Backfill)) with
    /// this generation; its workloads are compared once they are in.
    List(u64),
    /// Its objects are kept: compare its workloads' stamps.
    Compare,
    /// Nothing there is decided on any more: drop its ConfigMaps and Secrets.
    DropConfigs,
}

/// A namespace's list, ended.
#[derive(Debug)]
pub(super) struct Listed {
    /// What the list showed that the watches have not reported since the opt-in.
    pub(super) objects: Vec<(ConfigKey, StoredConfig)>,
    /// Changes whose window closed during the list.
    pub(super) deferred: BTreeSet<ConfigKey>,
    /// How many objects the list showed.
    pub(super) count: usize,
}

impl Namespaces {
    /// Whether `namespace` is being deleted.
    pub(super) fn is_terminating(&self, namespace: &str) -> bool {
        self.terminating.contains(namespace)
    }

    /// When this watcher saw `namespace` opt in, if it is opted in.
    pub(super) fn opted_in_at(&self, namespace: &str) -> Option<SystemTime> {
        self.opted_in.get(namespace).copied()
    }

    /// Whether workloads of `namespace` are decided on: it is opted in or `opted_in` (the
    /// workload is, by its label), and it is neither being listed nor terminating.
    pub(super) fn decides_in(&self, namespace: &str, opted_in: bool) -> bool {
        (opted_in || self.opted_in.contains_key(namespace))
            && !self.listing.contains_key(namespace)
            && !self.terminating.contains(namespace)
    }

    /// Whether the ConfigMaps and Secrets of a namespace are kept: it is not known to be left
    /// out (opted in, or not seen yet), or a workload there opted in by its label.
    pub(super) fn keeps_configs(&self, namespace: &str) -> bool {
        !self.excluded.contains(namespace) || self.workloads_opted_in.contains_key(namespace)
    }

    /// The Namespaces were listed again: these are all that exist.
    pub(super) fn relisted(&mut self, seen: &HashSet<String>) {
        self.opted_in.retain(|n, _| seen.contains(n));
        self.excluded.retain(|n| seen.contains(n));
        self.listing.retain(|n, _| seen.contains(n));
        self.terminating.retain(|n| seen.contains(n));
    }

    /// Whether `namespace` is terminating as last seen; true when it began to now. A namespace
    /// never stops terminating: one of the same name seen not terminating is a new namespace.
    pub(super) fn terminates(&mut self, namespace: &str, terminating: bool) -> bool {
        if terminating {
            self.terminating.insert(namespace.to_owned())
        } else {
            self.terminating.remove(namespace);
            false
        }
    }

    /// `namespace` was seen: opted in or not, since `at` (`None`: deleted). An excluded
    /// namespace, or one outside `--watch-namespaces`, comes as not opted in, whatever its
    /// labels say.
    pub(super) fn seen(&mut self, namespace: &str, opted_in: Option<(bool, SystemTime)>) -> Step {
        match opted_in {
            Some((true, at)) => {
                let was_excluded = self.excluded.remove(namespace);
                if self.opted_in.contains_key(namespace) {
                    return Step::Nothing;
                }
                self.opted_in.insert(namespace.to_owned(), at);
                if self.terminating.contains(namespace) {
                    return Step::Nothing; // Nothing there is decided on: no list, no comparison.
                }
                if was_excluded && !self.workloads_opted_in.contains_key(namespace) {
                    Step::List(self.start_list(namespace))
                } else {
                    Step::Compare
                }
            }
            Some((false, _)) => {
                self.opted_in.remove(namespace);
                self.excluded.insert(namespace.to_owned());
                if self.workloads_opted_in.contains_key(namespace) {
                    // Workloads there opted in by their label: its objects are still kept (and a
                    // list in progress goes on); the others are no longer decided on.
                    return Step::Nothing;
                }
                self.listing.remove(namespace);
                Step::DropConfigs
            }
            None => {
                // Deleted: its objects' own deletions follow on their watches.
                self.opted_in.remove(namespace);
                self.listing.remove(namespace);
                self.excluded.remove(namespace);
                Step::Nothing
            }
        }
    }

    /// Records whether a workload is opted in by its label. Its namespace's ConfigMaps and
    /// Secrets are kept while one is: the first such workload of a namespace whose objects were
    /// left out has them listed, and once the last is gone (deleted, or relabelled) from a
    /// namespace that is not opted in they are dropped.
    pub(super) fn workload_opted_in(&mut self, key: &WorkloadKey, opted_in: bool) -> Step {
        let namespace = &key.namespace;
        if opted_in {
            let workloads = self
                .workloads_opted_in
                .entry(namespace.clone())
                .or_default();
            if !workloads.insert(key.clone()) || workloads.len() > 1 {
                return Step::Nothing;
            }
            if self.excluded.contains(namespace)
                && !self.terminating.contains(namespace)
                && !self.listing.contains_key(namespace)
            {
                tracing::info!(workload = %key, "a workload opted in by its label: listing the ConfigMaps and Secrets of its namespace");
                return Step::List(self.start_list(namespace));
            }
            Step::Nothing
        } else {
            let Some(workloads) = self.workloads_opted_in.get_mut(namespace) else {
                return Step::Nothing;
            };
            if !workloads.remove(key) || !workloads.is_empty() {
                return Step::Nothing;
            }
            self.workloads_opted_in.remove(namespace);
            if !self.excluded.contains(namespace) {
                return Step::Nothing;
            }
            tracing::info!(
                namespace,
                "no workload there is opted in any more: its ConfigMaps and Secrets are no longer kept"
            );
            self.listing.remove(namespace);
            Step::DropConfigs
        }
    }

    /// Starts a list of a namespace's ConfigMaps and Secrets: its generation.
    fn start_list(&mut self, namespace: &str) -> u64 {
        self.generation += 1;
        self.listing.insert(
            namespace.to_owned(),
            Backfill {
                generation: self.generation,
                ..Backfill::default()
            },
        );
        self.generation
    }

    /// A watch reported `config`: a list of its namespace under way must not overwrite it.
    pub(super) fn config_seen(&mut self, config: &ConfigKey) {
        if let Some(list) = self.listing.get_mut(&config.0) {
            list.seen.insert(config.clone());
        }
    }

    /// Keeps `changes` of a workload of `namespace` until the namespace's list is in; gives them
    /// back when no list is under way there.
    pub(super) fn defer(
        &mut self,
        namespace: &str,
        changes: BTreeSet<ConfigKey>,
    ) -> Option<BTreeSet<ConfigKey>> {
        match self.listing.get_mut(namespace) {
            Some(list) => {
                list.deferred.extend(changes);
                None
            }
            None => Some(changes),
        }
    }

    /// What the list of `namespace` (of `generation`) showed; what it all was once it ends.
    /// Results of a list that was given up (the namespace opted out, or in again) are dropped.
    pub(super) fn list_showed(
        &mut self,
        namespace: &str,
        generation: u64,
        change: Watched<ConfigKey, Option<StoredConfig>>,
    ) -> Option<Listed> {
        let list = self
            .listing
            .get_mut(namespace)
            .filter(|l| l.generation == generation)?;
        let all = match change {
            Watched::Applied(key, Some(stored)) => {
                list.listed.insert(key, stored);
                return None;
            }
            Watched::Applied(key, None) | Watched::Deleted(key) => {
                list.listed.remove(&key);
                return None;
            }
            Watched::Relisted(all) => all,
        };
        let list = self.listing.remove(namespace)?;
        let objects = (list.listed.into_iter())
            .filter(|(key, _)| all.contains(key) && !list.seen.contains(key))
            .collect();
        Some(Listed {
            objects,
            deferred: list.deferred,
            count: all.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use confighash_core::refs::{ObjectKind, ObjectRef};
    use confighash_core::workload::WorkloadKind;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn config(namespace: &str, name: &str) -> ConfigKey {
        (
            namespace.to_owned(),
            ObjectRef::new(ObjectKind::ConfigMap, name.to_owned()),
        )
    }

    fn stored(rv: &str) -> StoredConfig {
        let mut cm = ConfigMap::default();
        cm.metadata.resource_version = Some(rv.to_owned());
        StoredConfig::from_config_map(&cm).unwrap()
    }

    fn workload(namespace: &str, name: &str) -> WorkloadKey {
        WorkloadKey::new(WorkloadKind::DEPLOYMENT, namespace, name)
    }

    #[test]
    fn a_namespace_that_opts_in_after_it_was_left_out_is_listed_before_it_is_decided_in() {
        let mut n = Namespaces::default();
        let at = SystemTime::UNIX_EPOCH;
        assert_eq!(n.seen("shop", Some((false, at))), Step::DropConfigs);
        assert!(!n.keeps_configs("shop") && !n.decides_in("shop", false));
        let Step::List(generation) = n.seen("shop", Some((true, at))) else {
            panic!("not listed");
        };
        assert_eq!(n.opted_in_at("shop"), Some(at));
        assert!(
            n.keeps_configs("shop") && !n.decides_in("shop", false),
            "listing"
        );
        // Seen again while listing: nothing more.
        assert_eq!(n.seen("shop", Some((true, at))), Step::Nothing);

        // A watch reports one object during the list: the list does not overwrite it. A change
        // there waits for the list.
        n.config_seen(&config("shop", "fresh"));
        let changes = BTreeSet::from([config("shop", "fresh")]);
        assert_eq!(n.defer("shop", changes.clone()), None);
        assert_eq!(n.defer("other", changes.clone()), Some(changes.clone()));
        for name in ["fresh", "listed", "gone-since"] {
            let shown = Watched::Applied(config("shop", name), Some(stored("1")));
            assert!(n.list_showed("shop", generation, shown).is_none());
        }
        // The results of another list are not this one's.
        let stale = Watched::Relisted(HashSet::new());
        assert!(n.list_showed("shop", generation + 1, stale).is_none());
        let all = HashSet::from([config("shop", "fresh"), config("shop", "listed")]);
        let listed =
            (n.list_showed("shop", generation, Watched::Relisted(all))).expect("the list ended");
        let objects: Vec<_> = listed.objects.iter().map(|(k, _)| k.clone()).collect();
        assert_eq!(objects, [config("shop", "listed")]);
        assert_eq!(listed.deferred, changes);
        assert_eq!(listed.count, 2);
        assert!(n.decides_in("shop", false));
        assert_eq!(n.defer("shop", changes.clone()), Some(changes));
    }

    #[test]
    fn a_workload_opted_in_by_its_label_keeps_its_namespace_config_while_it_is_there() {
        let mut n = Namespaces::default();
        let at = SystemTime::UNIX_EPOCH;
        assert_eq!(n.seen("team", Some((false, at))), Step::DropConfigs);
        let (a, b) = (workload("team", "a"), workload("team", "b"));
        assert!(matches!(n.workload_opted_in(&a, true), Step::List(_)));
        assert_eq!(n.workload_opted_in(&b, true), Step::Nothing, "listed once");
        assert!(n.keeps_configs("team"));
        assert!(
            !n.decides_in("team", false) && !n.decides_in("team", true),
            "listing"
        );
        // The namespace opting out again keeps its objects: workloads there opted in.
        assert_eq!(n.seen("team", Some((false, at))), Step::Nothing);
        assert_eq!(
            n.workload_opted_in(&a, false),
            Step::Nothing,
            "b is still there"
        );
        assert_eq!(n.workload_opted_in(&b, false), Step::DropConfigs);
        assert!(!n.keeps_configs("team"));
        // A namespace not known to be left out keeps its objects: nothing to list or drop.
        assert_eq!(
            n.workload_opted_in(&workload("new", "c"), true),
            Step::Nothing
        );
        assert_eq!(
            n.workload_opted_in(&workload("new", "c"), false),
            Step::Nothing
        );
    }

    #[test]
    fn nothing_is_decided_in_a_terminating_namespace_and_a_relist_forgets_what_is_gone() {
        let mut n = Namespaces::default();
        let at = SystemTime::UNIX_EPOCH;
        assert_eq!(n.seen("shop", Some((true, at))), Step::Compare);
        assert!(n.decides_in("shop", false));
        assert!(n.terminates("shop", true), "began now");
        assert!(!n.terminates("shop", true), "once");
        assert!(n.is_terminating("shop") && !n.decides_in("shop", true));
        // One of the same name, not terminating, is a new namespace.
        assert!(!n.terminates("shop", false));
        assert!(n.decides_in("shop", false));
        n.relisted(&HashSet::new());
        assert_eq!(n.opted_in_at("shop"), None);
        assert!(!n.decides_in("shop", false));
    }
}

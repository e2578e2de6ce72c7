//! Which watches have listed, and when reconcile is due: a part of [`State`](super::State).
//!
//! Nothing is decided before every watch has listed once (a workload compared against config
//! not yet listed would look stale). Reconcile runs once then, and every `--resync` after the
//! last one, whoever asked for it (a new leader reconciles too).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::{OTHER_STREAMS, Stream, WatcherConfig};

#[derive(Debug)]
pub(super) struct Lists {
    /// The streams listed, with the namespace of a namespace's own watch.
    listed: HashSet<(Stream, Option<String>)>,
    /// How many must list: every kind once, or every kind but the Namespaces once per namespace
    /// watched (`--watch-namespaces`).
    expected: usize,
    /// Where reconcile stands.
    reconcile: Reconcile,
    /// `--resync`.
    resync: Duration,
}

/// Where reconcile stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reconcile {
    /// Not every watch has listed yet: nothing ran.
    Waiting,
    /// Every watch has listed: the first reconcile is due.
    Due,
    /// The last one ran; the next is due then.
    Next(Instant),
}

impl Lists {
    pub(super) fn new(config: &WatcherConfig) -> Self {
        let streams = OTHER_STREAMS + config.kinds.len();
        let expected = match &config.watch_namespaces {
            None => streams,
            Some(list) => 1 + (streams - 1) * list.len(),
        };
        Lists {
            listed: HashSet::new(),
            expected,
            reconcile: Reconcile::Waiting,
            resync: config.resync,
        }
    }

    /// Whether every watch has listed.
    pub(super) fn is_synced(&self) -> bool {
        self.listed.len() == self.expected
    }

    /// Whether `stream` (of `scope`'s own watch) has listed.
    pub(super) fn has_listed(&self, stream: Stream, scope: Option<String>) -> bool {
        self.listed.contains(&(stream, scope))
    }

    /// `stream`'s list is in (or there is nothing to list). Returns how many have listed, and
    /// of how many.
    pub(super) fn listed(&mut self, stream: Stream, scope: Option<String>) -> (usize, usize) {
        self.listed.insert((stream, scope));
        if self.is_synced() && self.reconcile == Reconcile::Waiting {
            self.reconcile = Reconcile::Due;
        }
        (self.listed.len(), self.expected)
    }

    /// Whether reconcile is due at `now`: once every watch has listed, then every `--resync`.
    pub(super) fn reconcile_due(&self, now: Instant) -> bool {
        match self.reconcile {
            Reconcile::Waiting => false,
            Reconcile::Due => true,
            Reconcile::Next(at) => now >= at,
        }
    }

    /// Reconcile ran at `now` (the first, a periodic one, or a new leader's): the next is due
    /// `--resync` later.
    pub(super) fn reconciled(&mut self, now: Instant) {
        self.reconcile = Reconcile::Next(now + self.resync);
    }

    /// When the next periodic reconcile is due, once one ran.
    pub(super) fn next_resync(&self) -> Option<Instant> {
        match self.reconcile {
            Reconcile::Next(at) => Some(at),
            Reconcile::Waiting | Reconcile::Due => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use confighash_core::refs::ObjectKind;
    use std::collections::BTreeSet;

    #[test]
    fn reconcile_is_due_once_every_watch_listed_then_every_resync() {
        let config = WatcherConfig {
            resync: Duration::from_secs(60),
            ..Default::default()
        };
        let mut lists = Lists::new(&config);
        let now = Instant::now();
        let streams = [Stream::ConfigMaps, Stream::Secrets, Stream::Namespaces]
            .into_iter()
            .chain(config.kinds.iter().map(Stream::Workloads))
            .collect::<Vec<_>>();
        let (last, rest) = streams.split_last().unwrap();
        for s in rest {
            lists.listed(*s, None);
            // A list again of one already listed counts once.
            lists.listed(*s, None);
        }
        assert!(!lists.is_synced() && !lists.reconcile_due(now));
        assert_eq!(lists.listed(*last, None), (streams.len(), streams.len()));
        assert!(lists.is_synced() && lists.reconcile_due(now));
        assert_eq!(lists.next_resync(), None);
        lists.reconciled(now);
        assert!(!lists.reconcile_due(now + Duration::from_secs(59)));
        assert!(lists.reconcile_due(now + Duration::from_secs(60)));
        assert_eq!(lists.next_resync(), Some(now + Duration::from_secs(60)));
    }

    #[test]
    fn with_watched_namespaces_each_lists_its_own_kinds() {
        let config = WatcherConfig {
            watch_namespaces: Some(BTreeSet::from(["a".to_owned(), "b".to_owned()])),
            ..Default::default()
        };
        let mut lists = Lists::new(&config);
        lists.listed(Stream::Namespaces, None);
        for ns in ["a", "b"] {
            for kind in [ObjectKind::ConfigMap, ObjectKind::Secret] {
                lists.listed(Stream::from_kind(kind), Some(ns.to_owned()));
            }
            for kind in config.kinds.iter() {
                assert!(!lists.is_synced());
                lists.listed(Stream::Workloads(kind), Some(ns.to_owned()));
            }
        }
        assert!(lists.is_synced());
        assert!(!lists.has_listed(Stream::ConfigMaps, None));
        assert!(lists.has_listed(Stream::ConfigMaps, Some("a".to_owned())));
    }
}

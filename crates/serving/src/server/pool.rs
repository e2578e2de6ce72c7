//! Connection slots that never stop the accept loop: at the cap, the oldest member is closed to
//! make room for the newest.
//!
//! A listen backlog is first come, first served, so a port whose cap makes new connections wait
//! there can be kept full by anyone who opens connections faster than they are closed, and the
//! connection that matters (a kubelet probe, the API server's handshake) waits behind them until
//! its client gives up. An [`EvictingPool`] turns that around: every connection is accepted at
//! once, and when the pool is full the member admitted longest ago is told to leave. A client
//! that sends its request as soon as it connects is served within a few milliseconds; to push it
//! out, others must open a whole pool's worth of connections within those milliseconds. What the
//! pool holds stays bounded all the while (one more for the moment an evicted member takes to
//! close), so the process's file descriptors do too.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

/// A fixed number of places; admitting a member when all are taken evicts the oldest one.
#[derive(Debug)]
pub(super) struct EvictingPool {
    capacity: usize,
    members: Mutex<Members>,
}

#[derive(Debug, Default)]
struct Members {
    next_id: u64,
    /// Oldest first: ids only grow. Sending (or dropping) a member's sender evicts it.
    by_age: BTreeMap<u64, oneshot::Sender<()>>,
}

impl EvictingPool {
    /// A pool of `capacity` places (at least one).
    pub(super) fn new(capacity: usize) -> Arc<Self> {
        Arc::new(EvictingPool {
            capacity: capacity.max(1),
            members: Mutex::new(Members::default()),
        })
    }

    pub(super) fn capacity(&self) -> usize {
        self.capacity
    }

    fn members(&self) -> MutexGuard<'_, Members> {
        self.members.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits a new member. When the pool was full, its oldest member is told to leave, and
    /// `true` comes back with the ticket.
    pub(super) fn admit(self: &Arc<Self>) -> (Ticket, bool) {
        let (tx, rx) = oneshot::channel();
        let mut members = self.members();
        let mut evicted = false;
        while members.by_age.len() >= self.capacity {
            if let Some((_, oldest)) = members.by_age.pop_first() {
                // A member whose ticket is being dropped right now may not hear it: it is
                // leaving anyway.
                let _ = oldest.send(());
                evicted = true;
            }
        }
        let id = members.next_id;
        members.next_id += 1;
        members.by_age.insert(id, tx);
        drop(members);
        (
            Ticket {
                pool: Arc::clone(self),
                id,
                evicted: rx,
                gone: false,
            },
            evicted,
        )
    }
}

/// A member's place in an [`EvictingPool`], given back when dropped.
#[derive(Debug)]
pub(super) struct Ticket {
    pool: Arc<EvictingPool>,
    id: u64,
    evicted: oneshot::Receiver<()>,
    gone: bool,
}

impl Ticket {
    /// Resolves once this member has been evicted (at once if it already was). Cancel safe.
    pub(super) async fn evicted(&mut self) {
        if !self.gone {
            // The sender is only ever dropped by sending, by eviction, or with this ticket.
            let _ = (&mut self.evicted).await;
            self.gone = true;
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.pool.members().by_age.remove(&self.id);
    }
}

/// Resolves once `ticket`'s member is evicted; never without a ticket.
pub(super) async fn evicted(ticket: &mut Option<Ticket>) {
    match ticket {
        Some(ticket) => ticket.evicted().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn is_evicted(ticket: &mut Ticket) -> bool {
        tokio::time::timeout(Duration::from_millis(1), ticket.evicted())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn the_oldest_member_is_evicted_when_the_pool_is_full() {
        let pool = EvictingPool::new(2);
        let (mut first, full) = pool.admit();
        assert!(!full);
        let (mut second, full) = pool.admit();
        assert!(!full);
        assert!(!is_evicted(&mut first).await);
        let (mut third, full) = pool.admit();
        assert!(full);
        assert!(is_evicted(&mut first).await);
        // Once evicted, always evicted.
        assert!(is_evicted(&mut first).await);
        assert!(!is_evicted(&mut second).await);
        assert!(!is_evicted(&mut third).await);

        // A member that leaves frees its place: no eviction for the next one.
        drop(second);
        let (mut fourth, full) = pool.admit();
        assert!(!full);
        assert!(!is_evicted(&mut third).await);
        assert!(!is_evicted(&mut fourth).await);
        drop(first);
        assert_eq!(pool.members().by_age.len(), 2);
    }

    #[tokio::test]
    async fn a_pool_has_at_least_one_place() {
        let pool = EvictingPool::new(0);
        assert_eq!(pool.capacity(), 1);
        let (mut first, _) = pool.admit();
        let (_second, full) = pool.admit();
        assert!(full);
        assert!(is_evicted(&mut first).await);
    }
}

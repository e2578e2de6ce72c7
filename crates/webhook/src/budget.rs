//! What the webhook's reviews share, and how it is handed out: the memory they may hold
//! ([`MemoryBudget`], with its few places for large object answers) and the places under the cap
//! of reads in flight ([`Fair`], in turn across reviews, heavy reviews last).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

/// Memory the webhook's reviews may hold at once, all together: review bodies, what parsing them
/// takes, and the objects their lookups read while those are decoded. Taken in bytes; what is
/// taken is given back when its permit is dropped.
///
/// Object answers larger than [`LARGE_ANSWER_BYTES`] are read at most [`LARGE_ANSWERS_AT_ONCE`]
/// at a time, all reviews together: a flood of reviews naming large Secrets then holds a bounded
/// part of the budget, and small answers and new reviews keep finding room.
#[derive(Debug, Clone)]
pub struct MemoryBudget {
    semaphore: Arc<Semaphore>,
    capacity: usize,
    large: Arc<Semaphore>,
}

/// The largest object answer read: etcd keeps objects up to 1.5 MiB, which base64 and JSON
/// escapes can make about twice as large.
pub const MAX_OBJECT_BYTES: usize = 4 * 1024 * 1024;

/// An object answer past this many bytes is large: see [`MemoryBudget`].
pub const LARGE_ANSWER_BYTES: usize = 64 * 1024;
/// Large answers read at once, all reviews together. Each holds at most twice
/// [`MAX_OBJECT_BYTES`] of the budget, about 24 MiB for all of them at worst, 22 MiB for eight
/// Secrets of 1 MiB.
pub const LARGE_ANSWERS_AT_ONCE: usize = 8;

impl MemoryBudget {
    pub fn new(bytes: usize) -> Self {
        let capacity = bytes.clamp(1, Semaphore::MAX_PERMITS);
        MemoryBudget {
            semaphore: Arc::new(Semaphore::new(capacity)),
            capacity,
            large: Arc::new(Semaphore::new(LARGE_ANSWERS_AT_ONCE)),
        }
    }

    /// Waits for a place to read a large answer ([`LARGE_ANSWER_BYTES`]).
    pub(crate) async fn large_answer(&self) -> Option<OwnedSemaphorePermit> {
        self.large.clone().acquire_owned().await.ok()
    }

    /// The whole budget in bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes held now.
    pub fn in_use(&self) -> usize {
        self.capacity - self.semaphore.available_permits()
    }

    /// Takes `bytes` at once, or nothing if that much is not free now.
    pub fn try_reserve(&self, bytes: usize) -> Option<OwnedSemaphorePermit> {
        let bytes = u32::try_from(bytes).ok()?;
        self.semaphore.clone().try_acquire_many_owned(bytes).ok()
    }

    /// Takes `bytes`, waiting until that much is free; `None` when it never can be.
    pub async fn reserve(&self, bytes: usize) -> Option<OwnedSemaphorePermit> {
        if bytes > self.capacity {
            return None;
        }
        let bytes = u32::try_from(bytes).ok()?;
        self.semaphore.clone().acquire_many_owned(bytes).await.ok()
    }
}

/// A review becomes heavy once its reads have brought this many decoded bytes: its remaining
/// reads queue behind every other review's ([`Fair`]). Configuration is kilobytes; a review past
/// a mebibyte is reading large Secrets, or forged to.
pub const HEAVY_AFTER_BYTES: u64 = 1 << 20;

/// A cap on reads in flight, handed out in turn across reviews: when reads wait, the next free
/// place goes to the review after the one served last, not to the one that asked first. A review
/// with two references among a hundred with hundreds each waits for at most one read of each.
///
/// Reads of heavy reviews (past [`HEAVY_AFTER_BYTES`]) are served only when no other read
/// waits, and hold at most a quarter of the places together: a share of the lookup capacity
/// that reviews reading a lot cannot take.
pub struct Fair {
    state: Mutex<FairState>,
}

/// Which queue a read waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    Normal,
    /// Of a review that has read a lot already.
    Heavy,
}

#[derive(Default)]
struct FairState {
    available: usize,
    /// Heavy reads in flight, and how many may be.
    heavy: usize,
    heavy_cap: usize,
    /// Reviews with waiting reads, in the order they are served: normal, then heavy.
    turn: [VecDeque<u64>; 2],
    waiting: HashMap<(Class, u64), VecDeque<oneshot::Sender<FairPermit>>>,
}

impl FairState {
    fn may_take(&self, class: Class) -> bool {
        self.available > 0 && (class == Class::Normal || self.heavy < self.heavy_cap)
    }

    fn take(&mut self, class: Class) {
        self.available -= 1;
        if class == Class::Heavy {
            self.heavy += 1;
        }
    }

    fn give_back(&mut self, class: Class) {
        self.available += 1;
        if class == Class::Heavy {
            self.heavy -= 1;
        }
    }

    /// The next waiting read that may take a place, in turn within its class.
    fn next_waiting(&mut self) -> Option<(Class, oneshot::Sender<FairPermit>)> {
        for (i, class) in [Class::Normal, Class::Heavy].into_iter().enumerate() {
            if !self.may_take(class) {
                continue;
            }
            while let Some(review) = self.turn[i].pop_front() {
                let Some(queue) = self.waiting.get_mut(&(class, review)) else {
                    continue;
                };
                let sender = queue.pop_front();
                if queue.is_empty() {
                    self.waiting.remove(&(class, review));
                } else {
                    self.turn[i].push_back(review);
                }
                if let Some(sender) = sender {
                    return Some((class, sender));
                }
            }
        }
        None
    }
}

/// A place under the [`Fair`] cap; given back (or on to the next waiting review) when dropped.
pub struct FairPermit {
    fair: Option<Arc<Fair>>,
    class: Class,
}

impl Drop for FairPermit {
    fn drop(&mut self) {
        if let Some(fair) = self.fair.take() {
            Fair::release(fair, self.class);
        }
    }
}

impl Fair {
    pub fn new(places: usize) -> Arc<Self> {
        let places = places.max(1);
        Arc::new(Fair {
            state: Mutex::new(FairState {
                available: places,
                heavy_cap: (places / 4).max(1),
                ..FairState::default()
            }),
        })
    }

    /// Waits for a place for a read of review `review`.
    pub async fn acquire(self: &Arc<Self>, review: u64, class: Class) -> FairPermit {
        let waiter = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            // A read waits only while its class may not take a place (a release serves waiters
            // first, normal ones before heavy ones), so a free place here has no one waiting.
            if state.may_take(class) {
                state.take(class);
                return FairPermit {
                    fair: Some(self.clone()),
                    class,
                };
            }
            let (tx, rx) = oneshot::channel();
            // A review is in its class's `turn` exactly while it has an entry in `waiting`.
            if !state.waiting.contains_key(&(class, review)) {
                state.turn[class as usize].push_back(review);
            }
            let queue = state.waiting.entry((class, review)).or_default();
            // Reads of a review that gave up stay queued until their turn; drop them now.
            queue.retain(|s| !s.is_closed());
            queue.push_back(tx);
            rx
        };
        match waiter.await {
            Ok(permit) => permit,
            // The sender is dropped only with the whole `Fair`: nothing to hand out then.
            Err(_) => FairPermit { fair: None, class },
        }
    }

    fn release(fair: Arc<Fair>, class: Class) {
        fair.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .give_back(class);
        loop {
            let next = {
                let mut state = fair.state.lock().unwrap_or_else(|e| e.into_inner());
                let next = state.next_waiting();
                if let Some((class, _)) = &next {
                    state.take(*class);
                }
                next
            };
            let Some((class, sender)) = next else {
                return;
            };
            match sender.send(FairPermit {
                fair: Some(fair.clone()),
                class,
            }) {
                Ok(()) => return,
                // That read gave up: its place is given back and goes to the next one.
                Err(mut permit) => {
                    permit.fair = None;
                    fair.state
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .give_back(class);
                }
            }
        }
    }

    /// Heavy reads holding a place now.
    pub fn heavy_in_flight(&self) -> usize {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).heavy
    }

    /// Places free now.
    pub fn available(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .available
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn places_go_round_the_waiting_reviews_in_turn() {
        let fair = Fair::new(1);
        let first = fair.acquire(0, Class::Normal).await;
        // Review 1 queues three reads, then review 2 one: review 2 is served second, not fourth.
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for review in [1u64, 1, 1, 2] {
            let queued = fair.clone();
            let order = order.clone();
            tasks.push(tokio::spawn(async move {
                let permit = queued.acquire(review, Class::Normal).await;
                order.lock().unwrap().push(review);
                drop(permit);
            }));
            // Let each task queue before the next one starts.
            until_waiting(&fair, tasks.len()).await;
        }
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![1, 2, 1, 1]);
        assert_eq!(fair.available(), 1);
    }

    #[tokio::test]
    async fn a_read_that_gave_up_passes_its_place_on() {
        let fair = Fair::new(1);
        let first = fair.acquire(0, Class::Normal).await;
        let abandoned = tokio::spawn({
            let fair = fair.clone();
            async move {
                let _p = fair.acquire(1, Class::Normal).await;
            }
        });
        while fair.state.lock().unwrap().waiting.is_empty() {
            tokio::task::yield_now().await;
        }
        abandoned.abort();
        let _ = abandoned.await;
        drop(first);
        assert_eq!(fair.available(), 1, "the place was not lost with the read");
        let _again = fair.acquire(3, Class::Normal).await;
        assert_eq!(fair.available(), 0);
    }

    /// Waits until `n` reads wait in `fair`.
    async fn until_waiting(fair: &Fair, n: usize) {
        while fair
            .state
            .lock()
            .unwrap()
            .waiting
            .values()
            .map(VecDeque::len)
            .sum::<usize>()
            < n
        {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn heavy_reviews_wait_behind_the_others_and_keep_to_their_share() {
        let fair = Fair::new(4);
        // A quarter of the places (1) for heavy reads: the second waits with places free.
        let heavy = fair.acquire(1, Class::Heavy).await;
        let second = tokio::spawn({
            let fair = fair.clone();
            async move { fair.acquire(1, Class::Heavy).await }
        });
        until_waiting(&fair, 1).await;
        assert_eq!(fair.available(), 3);
        let normal: Vec<FairPermit> =
            futures::future::join_all((0..3).map(|_| fair.acquire(2, Class::Normal))).await;
        assert_eq!(fair.available(), 0, "normal reads take the rest at once");
        drop(heavy);
        let second = second.await.unwrap();
        // All places taken: heavy reads of review 1 queue first, then review 3's normal read;
        // each freed place goes to the normal read first.
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (review, class) in [(1u64, Class::Heavy), (1, Class::Heavy), (3, Class::Normal)] {
            let queued = fair.clone();
            let order = order.clone();
            tasks.push(tokio::spawn(async move {
                let permit = queued.acquire(review, class).await;
                order.lock().unwrap().push(review);
                drop(permit);
            }));
            until_waiting(&fair, tasks.len()).await;
        }
        drop(normal);
        drop(second);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![3, 1, 1]);
        assert_eq!(fair.available(), 4);
        assert_eq!(fair.state.lock().unwrap().heavy, 0);
    }
}

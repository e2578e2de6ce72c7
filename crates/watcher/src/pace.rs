//! How fast the watcher acts: the change window, the per-workload interval and the global token
//! bucket. Plain data over `Instant`s, tested without a clock.

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;
use std::time::{Duration, Instant};

/// Collects changes: the first change opens the window; when it closes, `debounce` later (later
/// changes do not extend it), everything seen in it is handled together.
#[derive(Debug)]
pub struct ChangeWindow<T: Ord> {
    debounce: Duration,
    opened: Option<Instant>,
    changes: BTreeSet<T>,
}

impl<T: Ord> ChangeWindow<T> {
    pub fn new(debounce: Duration) -> Self {
        ChangeWindow {
            debounce,
            opened: None,
            changes: BTreeSet::new(),
        }
    }

    /// Records a change seen at `now`, opening the window if it is closed.
    pub fn record(&mut self, now: Instant, change: T) {
        self.opened.get_or_insert(now);
        self.changes.insert(change);
    }

    /// When the open window closes.
    pub fn closes_at(&self) -> Option<Instant> {
        self.opened.map(|t| t + self.debounce)
    }

    /// When the window opened, and its changes, once it has closed (and closes it).
    pub fn take_if_closed(&mut self, now: Instant) -> Option<(Instant, BTreeSet<T>)> {
        let closes = self.closes_at()?;
        if now < closes {
            return None;
        }
        let opened = self.opened.take()?;
        Some((opened, std::mem::take(&mut self.changes)))
    }

    /// Whether the open window holds a change of `change`.
    pub fn contains(&self, change: &T) -> bool {
        self.changes.contains(change)
    }

    pub fn is_open(&self) -> bool {
        self.opened.is_some()
    }
}

/// A token bucket: `rate` tokens a second, at most `burst` saved up.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Option<Instant>,
}

impl TokenBucket {
    pub fn new(rate: f64, burst: u32) -> Self {
        TokenBucket {
            rate: rate.max(f64::MIN_POSITIVE),
            burst: f64::from(burst.max(1)),
            tokens: f64::from(burst.max(1)),
            last: None,
        }
    }

    fn refill(&mut self, now: Instant) {
        if let Some(last) = self.last {
            let elapsed = now.saturating_duration_since(last).as_secs_f64();
            self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        }
        self.last = Some(now);
    }

    /// Takes a token, or says when the next one will be there.
    pub fn take(&mut self, now: Instant) -> Result<(), Instant> {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        // At least a millisecond: a bucket a rounding error short of a token would otherwise
        // ask to be woken now, again and again.
        let wait = Duration::from_secs_f64((1.0 - self.tokens) / self.rate);
        Err(now + wait.max(Duration::from_millis(1)))
    }
}

/// Why a touch has to wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// The workload was touched less than the minimum interval ago.
    Workload(Instant),
    /// The cluster-wide bucket is empty.
    RateLimited(Instant),
}

impl Wait {
    pub fn until(self) -> Instant {
        match self {
            Wait::Workload(t) | Wait::RateLimited(t) => t,
        }
    }
}

/// At most one touch per workload per `min_interval`, and a global token bucket over all.
#[derive(Debug)]
pub struct Pacer<K: Eq + Hash> {
    min_interval: Duration,
    last: HashMap<K, Instant>,
    bucket: TokenBucket,
}

impl<K: Eq + Hash + Clone> Pacer<K> {
    pub fn new(min_interval: Duration, rate: f64, burst: u32) -> Self {
        Pacer {
            min_interval,
            last: HashMap::new(),
            bucket: TokenBucket::new(rate, burst),
        }
    }

    /// Allows a touch of `key` at `now` (and records it), or says until when to wait.
    pub fn allow(&mut self, now: Instant, key: &K) -> Result<(), Wait> {
        if let Some(last) = self.last.get(key) {
            let next = *last + self.min_interval;
            if now < next {
                return Err(Wait::Workload(next));
            }
        }
        self.bucket.take(now).map_err(Wait::RateLimited)?;
        self.last.insert(key.clone(), now);
        Ok(())
    }

    /// Forgets entries older than the interval, so the map stays as large as recent activity.
    pub fn forget_old(&mut self, now: Instant) {
        let interval = self.min_interval;
        self.last
            .retain(|_, t| now.saturating_duration_since(*t) < interval);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_not_extended_by_later_changes() {
        let t0 = Instant::now();
        let mut w = ChangeWindow::new(Duration::from_secs(5));
        assert!(w.take_if_closed(t0).is_none());
        w.record(t0, "a");
        w.record(t0 + Duration::from_secs(4), "b");
        assert_eq!(w.closes_at(), Some(t0 + Duration::from_secs(5)));
        assert!(w.take_if_closed(t0 + Duration::from_millis(4999)).is_none());
        let (opened, changes) = w.take_if_closed(t0 + Duration::from_secs(5)).unwrap();
        assert_eq!(opened, t0);
        assert_eq!(changes.into_iter().collect::<Vec<_>>(), ["a", "b"]);
        assert!(!w.is_open());
        // The next change opens a new window.
        w.record(t0 + Duration::from_secs(6), "c");
        assert_eq!(w.closes_at(), Some(t0 + Duration::from_secs(11)));
    }

    #[test]
    fn the_bucket_allows_a_burst_then_its_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(5.0, 20);
        for _ in 0..20 {
            b.take(t0).unwrap();
        }
        let next = b.take(t0).unwrap_err();
        assert_eq!(next, t0 + Duration::from_millis(200));
        b.take(t0 + Duration::from_millis(200)).unwrap();
        assert!(b.take(t0 + Duration::from_millis(200)).is_err());
        // Tokens saved up never exceed the burst.
        let later = t0 + Duration::from_secs(3600);
        for _ in 0..20 {
            b.take(later).unwrap();
        }
        assert!(b.take(later).is_err());
    }

    #[test]
    fn a_workload_is_touched_at_most_once_per_interval() {
        let t0 = Instant::now();
        let mut p = Pacer::new(Duration::from_secs(5), 100.0, 20);
        p.allow(t0, &"web").unwrap();
        assert_eq!(
            p.allow(t0 + Duration::from_secs(1), &"web"),
            Err(Wait::Workload(t0 + Duration::from_secs(5)))
        );
        p.allow(t0 + Duration::from_secs(1), &"api").unwrap();
        p.allow(t0 + Duration::from_secs(5), &"web").unwrap();
        p.forget_old(t0 + Duration::from_secs(20));
        assert!(p.last.is_empty());
    }

    #[test]
    fn the_bucket_bounds_all_workloads_together() {
        let t0 = Instant::now();
        let mut p = Pacer::new(Duration::from_secs(5), 5.0, 20);
        let allowed = (0..100).filter(|i| p.allow(t0, i).is_ok()).count();
        assert_eq!(allowed, 20);
        assert!(matches!(p.allow(t0, &1000), Err(Wait::RateLimited(_))));
        // Over ten seconds: the burst plus five a second.
        let mut allowed = 0;
        for ms in (0..10_000).step_by(10) {
            if p.allow(t0 + Duration::from_millis(ms), &(2000 + ms))
                .is_ok()
            {
                allowed += 1;
            }
        }
        assert!((49..=51).contains(&allowed), "{allowed}");
    }
}

//! The flap guard: a ConfigMap or Secret whose change windows open more than `--flap-threshold`
//! times within `--flap-period` (a token rotated every few seconds, a broken ExternalSecret)
//! would roll its dependents at every window, forever. Once it flaps, its changes are held and
//! released at most once per interval, 1 minute at first and doubling up to 15 minutes, always
//! as the latest content; the guard lifts after a whole interval with no change. Plain data over
//! `Instant`s, tested without a clock.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::{Duration, Instant};

/// The first interval of a flapping object.
pub const FIRST_INTERVAL: Duration = Duration::from_secs(60);
/// The longest interval: the guard doubles up to it.
pub const MAX_INTERVAL: Duration = Duration::from_secs(15 * 60);

/// What a change of an object is, to the guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Not flapping: handled as usual.
    Pass,
    /// This change made the object flap: it is handled as usual, and from now on the object's
    /// changes are held.
    Tripped,
    /// The object flaps: the change is held until the guard's interval ends.
    Held,
}

#[derive(Debug)]
struct Guard {
    interval: Duration,
    /// When the interval ends.
    ends: Instant,
    /// A change came during the interval.
    held: bool,
}

#[derive(Debug, Default)]
struct Flap {
    /// When the object's last change windows opened, within the period.
    windows: VecDeque<Instant>,
    guard: Option<Guard>,
}

/// What the guard knows of each object that changed lately.
#[derive(Debug)]
pub struct FlapGuard<K: Eq + Hash> {
    threshold: usize,
    period: Duration,
    objects: HashMap<K, Flap>,
}

impl<K: Eq + Hash + Clone> FlapGuard<K> {
    /// An object flaps once more than `threshold` of its change windows opened within `period`.
    pub fn new(threshold: u32, period: Duration) -> Self {
        FlapGuard {
            threshold: usize::try_from(threshold).unwrap_or(usize::MAX),
            period,
            objects: HashMap::new(),
        }
    }

    /// A content change of `key` at `now`; `opens_window` when the change window does not hold
    /// a change of `key` already (a window counts once per object).
    pub fn change(&mut self, key: &K, now: Instant, opens_window: bool) -> Seen {
        let flap = self.objects.entry(key.clone()).or_default();
        if let Some(guard) = &mut flap.guard {
            guard.held = true;
            return Seen::Held;
        }
        if !opens_window {
            return Seen::Pass;
        }
        let period = self.period;
        flap.windows
            .retain(|at| now.saturating_duration_since(*at) < period);
        flap.windows.push_back(now);
        if flap.windows.len() <= self.threshold {
            return Seen::Pass;
        }
        flap.windows.clear();
        flap.guard = Some(Guard {
            interval: FIRST_INTERVAL,
            ends: now + FIRST_INTERVAL,
            held: false,
        });
        Seen::Tripped
    }

    /// Whether a change of `key` is held now: when its interval ends.
    pub fn holds(&self, key: &K) -> Option<Instant> {
        let guard = self.objects.get(key)?.guard.as_ref()?;
        guard.held.then_some(guard.ends)
    }

    /// Whether `key` flaps now (held or not).
    pub fn flaps(&self, key: &K) -> bool {
        self.objects.get(key).is_some_and(|f| f.guard.is_some())
    }

    /// When the next interval ends.
    pub fn next_end(&self) -> Option<Instant> {
        self.objects
            .values()
            .filter_map(|f| f.guard.as_ref().map(|g| g.ends))
            .min()
    }

    /// Ends the intervals due by `now`: an object that changed during its interval is released
    /// (returned in the first list: its latest content is to be handled now) and its next
    /// interval is twice as long, up to [`MAX_INTERVAL`]; one that did not stops flapping (the
    /// second list).
    pub fn end_due(&mut self, now: Instant) -> (Vec<K>, Vec<K>) {
        let mut released = Vec::new();
        let mut lifted = Vec::new();
        for (key, flap) in &mut self.objects {
            let Some(guard) = &mut flap.guard else {
                continue;
            };
            if guard.ends > now {
                continue;
            }
            if guard.held {
                guard.interval = (guard.interval * 2).min(MAX_INTERVAL);
                guard.ends = now + guard.interval;
                guard.held = false;
                released.push(key.clone());
            } else {
                flap.guard = None;
                lifted.push(key.clone());
            }
        }
        for key in &lifted {
            self.objects.remove(key);
        }
        (released, lifted)
    }

    /// How many objects flap now.
    pub fn flapping(&self) -> usize {
        self.objects.values().filter(|f| f.guard.is_some()).count()
    }

    /// Forgets objects that do not flap and whose windows are all older than the period.
    pub fn forget_old(&mut self, now: Instant) {
        let period = self.period;
        self.objects.retain(|_, f| {
            f.guard.is_some()
                || f.windows
                    .back()
                    .is_some_and(|at| now.saturating_duration_since(*at) < period)
        });
    }

    /// Forgets `key` (deleted with its namespace, say).
    pub fn forget(&mut self, key: &K) {
        self.objects.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t0: Instant, seconds: u64) -> Instant {
        t0 + Duration::from_secs(seconds)
    }

    #[test]
    fn more_than_the_threshold_of_windows_in_the_period_trips_the_guard() {
        let t0 = Instant::now();
        let mut guard = FlapGuard::new(5, Duration::from_secs(600));
        for i in 0..5 {
            assert_eq!(guard.change(&"s", at(t0, i * 10), true), Seen::Pass);
            // More changes inside one window count once.
            assert_eq!(guard.change(&"s", at(t0, i * 10 + 1), false), Seen::Pass);
        }
        assert_eq!(guard.flapping(), 0);
        assert_eq!(guard.change(&"s", at(t0, 50), true), Seen::Tripped);
        assert_eq!(guard.flapping(), 1);
        assert!(guard.flaps(&"s"));
        assert_eq!(guard.holds(&"s"), None, "nothing held yet");
        assert_eq!(guard.change(&"s", at(t0, 55), true), Seen::Held);
        assert_eq!(guard.holds(&"s"), Some(at(t0, 110)));
        assert_eq!(guard.next_end(), Some(at(t0, 110)));
        assert_eq!(guard.change(&"other", at(t0, 55), true), Seen::Pass);
    }

    #[test]
    fn windows_older_than_the_period_do_not_count() {
        let t0 = Instant::now();
        let mut guard = FlapGuard::new(5, Duration::from_secs(600));
        for i in 0..20 {
            // One window every 2 minutes: 5 within any 10 minutes, never more.
            assert_eq!(guard.change(&"s", at(t0, i * 121), true), Seen::Pass, "{i}");
        }
        guard.forget_old(at(t0, 19 * 121 + 600));
        assert_eq!(guard.objects.len(), 0);
    }

    #[test]
    fn intervals_double_up_to_fifteen_minutes_and_a_quiet_interval_lifts_the_guard() {
        let t0 = Instant::now();
        let mut guard = FlapGuard::new(1, Duration::from_secs(600));
        guard.change(&"s", t0, true);
        assert_eq!(guard.change(&"s", at(t0, 5), true), Seen::Tripped);
        let mut now = at(t0, 5);
        let mut intervals = Vec::new();
        for _ in 0..6 {
            assert_eq!(
                guard.change(&"s", now + Duration::from_secs(1), true),
                Seen::Held
            );
            let end = guard.next_end().unwrap();
            intervals.push((end - now).as_secs());
            assert_eq!(
                guard.end_due(end - Duration::from_millis(1)),
                (vec![], vec![])
            );
            assert_eq!(guard.end_due(end), (vec!["s"], vec![]));
            now = end;
        }
        assert_eq!(intervals, [60, 120, 240, 480, 900, 900]);
        // A whole interval with no change: it stops flapping.
        let end = guard.next_end().unwrap();
        assert_eq!(guard.end_due(end), (vec![], vec!["s"]));
        assert_eq!(guard.flapping(), 0);
        assert_eq!(guard.next_end(), None);
        assert_eq!(
            guard.change(&"s", end, true),
            Seen::Pass,
            "a new episode starts afresh"
        );
    }
}

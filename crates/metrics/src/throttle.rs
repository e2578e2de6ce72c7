//! One rule for warnings that anyone can make repeat (a client opening connections, a watch
//! refused again and again, objects a user may create): a line at most once per
//! [`WARN_EVERY`], saying how many were held back since the last one.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a throttled warning is logged at most.
pub const WARN_EVERY: Duration = Duration::from_secs(60);

/// Lets a repeated warning through at most once per interval, counting those held back. Shared
/// between tasks as it is (`&self`).
#[derive(Debug)]
pub struct Throttle {
    every: Duration,
    /// When a line was last let through, and how many were held back since.
    state: Mutex<(Option<Instant>, u64)>,
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle::every(WARN_EVERY)
    }
}

impl Throttle {
    /// A throttle of one line per `every`.
    pub const fn every(every: Duration) -> Self {
        Throttle {
            every,
            state: Mutex::new((None, 0)),
        }
    }

    /// `Some(held)` when a line may be logged now, `held` being how many were held back since
    /// the last one; `None` when this one is held back.
    pub fn allow(&self) -> Option<u64> {
        self.allow_at(Instant::now())
    }

    fn allow_at(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state
            .0
            .is_some_and(|at| now.saturating_duration_since(at) < self.every)
        {
            state.1 += 1;
            return None;
        }
        let held = state.1;
        *state = (Some(now), 0);
        Some(held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_saying_how_many_were_held_back() {
        let t = Throttle::every(Duration::from_secs(60));
        let t0 = Instant::now();
        assert_eq!(t.allow_at(t0), Some(0));
        for s in 1..60 {
            assert_eq!(t.allow_at(t0 + Duration::from_secs(s)), None);
        }
        assert_eq!(t.allow_at(t0 + Duration::from_secs(60)), Some(59));
        assert_eq!(t.allow_at(t0 + Duration::from_secs(61)), None);
        assert_eq!(t.allow_at(t0 + Duration::from_secs(200)), Some(1));
    }
}

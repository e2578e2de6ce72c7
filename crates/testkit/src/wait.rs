//! Waiting without fixed sleeps: every wait polls a check towards a deadline and fails naming
//! what it waited for.
//!
//! - [`eventually`]: polls until a check holds, within [`DEADLINE`]; how long that took.
//! - [`eventually_within`]: the same within another bound (for waits a test measures).
//! - [`throughout`]: polls a check over a quiet period and fails as soon as it does not hold:
//!   how a test shows that something does not happen.

use std::time::Duration;

use tokio::time::Instant;

/// How long any one wait may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(10);
/// How often a check is polled.
pub const POLL: Duration = Duration::from_millis(5);

/// Polls `check` until it holds; fails after [`DEADLINE`]. Returns how long it took.
pub async fn eventually(what: &str, check: impl AsyncFnMut() -> bool) -> Duration {
    eventually_within(what, DEADLINE, check).await
}

/// Polls `check` until it holds; fails after `within`. Returns how long it took.
pub async fn eventually_within(
    what: &str,
    within: Duration,
    mut check: impl AsyncFnMut() -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        if check().await {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Polls `check` for `period` and fails at the first poll where it does not hold.
pub async fn throughout(what: &str, period: Duration, mut check: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    loop {
        assert!(
            check().await,
            "{what} no longer held after {:?}",
            start.elapsed()
        );
        if start.elapsed() >= period {
            return;
        }
        tokio::time::sleep(POLL).await;
    }
}

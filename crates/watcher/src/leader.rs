//! Leader election on a `coordination.k8s.io/v1` Lease, the way client-go's `leaderelection` does
//! it: every replica serves the webhook, only the leader touches workloads.
//!
//! The rules:
//!
//! - A candidate reads the Lease every retry period (with jitter). It takes the Lease when it is
//!   absent (create), when its `holderIdentity` is empty, or when it has expired. Expiry is judged
//!   on the local monotonic clock, never by comparing `renewTime` with the local wall clock: the
//!   Lease is expired when `leaseDurationSeconds` have passed since this process *first observed*
//!   the current record. A skewed clock on another node therefore cannot make a live Lease look
//!   expired.
//! - Every write is an update carrying the `resourceVersion` that was read (or a create), so when
//!   two candidates race, the API server accepts one and answers 409 Conflict to the other. A
//!   Lease is never overwritten blindly.
//! - The leader renews every retry period. Its leadership is valid until `renew_deadline` after
//!   the moment it *sent* its last successful write; when that passes without a new successful
//!   renewal it steps down at once. Other candidates measure `leaseDurationSeconds` (longer than
//!   the renew deadline) from when they *saw* that write, which is later than it was sent, so a
//!   new leader can only appear after the old one has stopped: leaders never overlap.
//! - A leader that reads the Lease and finds another holder steps down.
//!
//! [`Leadership::is_leader`] checks the validity deadline itself, so leadership ends on time
//! even if the election task is starved; when the task is aborted or dropped, leadership ends
//! with it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The Lease's name unless `--lease` names another.
pub const DEFAULT_LEASE_NAME: &str = "confighash";
/// How long a Lease stays valid for other candidates after they observe its last renewal.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// How long the leader keeps leading after its last successful renewal.
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// How often candidates try to acquire and the leader renews.
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);

/// Candidates wait between `retry_period` and `retry_period * (1 + JITTER_FACTOR)` between
/// attempts (client-go's factor), so that they do not all hit the API server at once.
const JITTER_FACTOR: f64 = 1.2;

/// How many times `release` retries after a conflict.
const RELEASE_ATTEMPTS: u32 = 3;

/// Leader election settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderConfig {
    /// Namespace of the Lease (the pod's own namespace).
    pub namespace: String,
    /// Name of the Lease (`--lease`, by default `confighash`).
    pub lease_name: String,
    /// This replica's identity, unique per process (see [`LeaderConfig::default_identity`]).
    pub identity: String,
    /// How long other candidates wait, after observing the last renewal, before taking over
    /// (15 s). Written to the Lease in whole seconds, rounded up.
    pub lease_duration: Duration,
    /// How long the leader keeps leading without a successful renewal (10 s); shorter than the
    /// lease duration.
    pub renew_deadline: Duration,
    /// How often to try to acquire or renew (2 s); shorter than the renew deadline.
    pub retry_period: Duration,
}

/// An invalid [`LeaderConfig`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("leader election: the {0} must not be empty")]
    Empty(&'static str),
    #[error("leader election: the {0} must be longer than zero")]
    Zero(&'static str),
    #[error(
        "leader election: the lease duration ({0:?}) is too long to write to a Lease (at most {max} s)",
        max = i32::MAX
    )]
    LeaseDurationTooLong(Duration),
    #[error(
        "leader election: the renew deadline ({renew_deadline:?}) must be shorter than the lease \
         duration ({lease_duration:?})"
    )]
    RenewDeadline {
        renew_deadline: Duration,
        lease_duration: Duration,
    },
    #[error(
        "leader election: the retry period ({retry_period:?}) must be shorter than the renew \
         deadline ({renew_deadline:?})"
    )]
    RetryPeriod {
        retry_period: Duration,
        renew_deadline: Duration,
    },
}

impl LeaderConfig {
    /// The defaults (Lease `confighash`, 15 s / 10 s / 2 s) for `identity` in `namespace`.
    pub fn new(namespace: impl Into<String>, identity: impl Into<String>) -> Self {
        LeaderConfig {
            namespace: namespace.into(),
            lease_name: DEFAULT_LEASE_NAME.to_owned(),
            identity: identity.into(),
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            retry_period: DEFAULT_RETRY_PERIOD,
        }
    }

    /// A process-unique identity: the pod name (`POD_NAME`), else the host name, plus a random
    /// suffix, so that a restarted process never mistakes its predecessor's Lease for its own.
    pub fn default_identity() -> String {
        let non_empty = |s: String| {
            let s = s.trim().to_owned();
            (!s.is_empty()).then_some(s)
        };
        let base = std::env::var("POD_NAME")
            .ok()
            .and_then(non_empty)
            .or_else(|| std::env::var("HOSTNAME").ok().and_then(non_empty))
            .or_else(|| {
                std::fs::read_to_string("/etc/hostname")
                    .ok()
                    .and_then(non_empty)
            })
            .unwrap_or_else(|| "confighash".to_owned());
        format!("{base}_{:08x}", rand::random::<u32>())
    }

    /// Checks that the names are set and that retry period < renew deadline < lease duration.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (what, value) in [
            ("namespace", &self.namespace),
            ("lease name", &self.lease_name),
            ("identity", &self.identity),
        ] {
            if value.is_empty() {
                return Err(ConfigError::Empty(what));
            }
        }
        for (what, value) in [
            ("lease duration", self.lease_duration),
            ("renew deadline", self.renew_deadline),
            ("retry period", self.retry_period),
        ] {
            if value.is_zero() {
                return Err(ConfigError::Zero(what));
            }
        }
        if self.lease_duration > Duration::from_secs(i32::MAX as u64) {
            return Err(ConfigError::LeaseDurationTooLong(self.lease_duration));
        }
        if self.renew_deadline >= self.lease_duration {
            return Err(ConfigError::RenewDeadline {
                renew_deadline: self.renew_deadline,
                lease_duration: self.lease_duration,
            });
        }
        if self.retry_period >= self.renew_deadline {
            return Err(ConfigError::RetryPeriod {
                retry_period: self.retry_period,
                renew_deadline: self.renew_deadline,
            });
        }
        Ok(())
    }

    /// `leaseDurationSeconds` to write: the lease duration in whole seconds, rounded up, so that
    /// others never wait less than configured.
    fn lease_duration_seconds(&self) -> i32 {
        let secs =
            self.lease_duration.as_secs() + u64::from(self.lease_duration.subsec_nanos() > 0);
        i32::try_from(secs.max(1)).unwrap_or(i32::MAX)
    }
}

// ----- Leadership -----

/// Whether this replica leads. Cheap to clone; all clones share the state.
#[derive(Clone)]
pub struct Leadership {
    inner: Arc<Shared>,
}

struct Shared {
    leader: AtomicBool,
    /// Nanoseconds after `epoch` at which the current leadership ends unless renewed.
    valid_until: AtomicU64,
    epoch: Instant,
    changes: watch::Sender<bool>,
}

impl Leadership {
    fn new(leader: bool) -> Self {
        Leadership {
            inner: Arc::new(Shared {
                leader: AtomicBool::new(leader),
                valid_until: AtomicU64::new(if leader { u64::MAX } else { 0 }),
                epoch: Instant::now(),
                changes: watch::channel(leader).0,
            }),
        }
    }

    /// Always the leader, for `--leader-elect=false`.
    pub fn always() -> Leadership {
        Leadership::new(true)
    }

    /// Whether this replica leads now: it holds the Lease and its renew deadline has not passed.
    /// Check it right before acting as the leader.
    pub fn is_leader(&self) -> bool {
        self.inner.leader.load(Ordering::SeqCst) && {
            let now = self.inner.epoch.elapsed().as_nanos();
            now < u128::from(self.inner.valid_until.load(Ordering::SeqCst))
        }
    }

    /// A receiver that sees each change of leadership (to wake up on); `is_leader` stays the
    /// authority, since it also ends leadership at the renew deadline by itself.
    pub fn changes(&self) -> watch::Receiver<bool> {
        self.inner.changes.subscribe()
    }

    /// Leads until `deadline`; returns whether this is a change.
    fn lead_until(&self, deadline: Instant) -> bool {
        let nanos = deadline
            .saturating_duration_since(self.inner.epoch)
            .as_nanos();
        let nanos = u64::try_from(nanos).unwrap_or(u64::MAX);
        self.inner.valid_until.store(nanos, Ordering::SeqCst);
        self.inner.leader.store(true, Ordering::SeqCst);
        self.inner.changes.send_if_modified(|leader| {
            let changed = !*leader;
            *leader = true;
            changed
        })
    }

    /// Stops leading; returns whether this replica was leading.
    fn step_down(&self) -> bool {
        self.inner.leader.store(false, Ordering::SeqCst);
        self.inner.changes.send_if_modified(|leader| {
            let changed = *leader;
            *leader = false;
            changed
        })
    }
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("is_leader", &self.is_leader())
            .finish()
    }
}

// ----- the election -----

/// Starts the election: the returned task acquires the Lease, renews it while leading, and
/// tries again after losing it, until it is aborted (which ends leadership).
///
/// # Panics
///
/// If `config` is invalid; check it with [`LeaderConfig::validate`] first.
pub fn spawn(client: kube::Client, config: LeaderConfig) -> (Leadership, JoinHandle<()>) {
    if let Err(e) = config.validate() {
        panic!("{e}");
    }
    let leadership = Leadership::new(false);
    let elector = Elector {
        api: Api::namespaced(client, &config.namespace),
        leadership: leadership.clone(),
        observed: None,
        config,
    };
    let task = tokio::spawn(async move {
        let _guard = StepDownOnDrop {
            leadership: elector.leadership.clone(),
            identity: elector.config.identity.clone(),
        };
        elector.run().await;
    });
    (leadership, task)
}

/// Gives the Lease up if `config.identity` holds it, so that another replica takes over at once
/// instead of after the lease duration; returns whether it did. For graceful shutdown: abort the
/// election task (and await it) first, or it would claim the Lease again.
pub async fn release(client: kube::Client, config: &LeaderConfig) -> Result<bool, ReleaseError> {
    release_lease(client, config).await.map_err(ReleaseError)
}

/// Why [`release`] failed. Displayed (and debug-printed) without anything the API server wrote
/// but a status code and a reason word, so it can be logged as it is.
pub struct ReleaseError(pub kube::Error);

impl std::fmt::Display for ReleaseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&confighash_cluster::redact::kube_error(&self.0))
    }
}

impl std::fmt::Debug for ReleaseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReleaseError({self})")
    }
}

impl std::error::Error for ReleaseError {}

async fn release_lease(client: kube::Client, config: &LeaderConfig) -> Result<bool, kube::Error> {
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    let mut attempt = 1;
    loop {
        let Some(mut lease) = api.get_opt(&config.lease_name).await? else {
            return Ok(false);
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(config.identity.as_str()) {
            return Ok(false);
        }
        // As client-go: no holder, and a short duration for anyone reading the record.
        let now = MicroTime(Timestamp::now());
        spec.holder_identity = Some(String::new());
        spec.lease_duration_seconds = Some(1);
        spec.acquire_time = Some(now.clone());
        spec.renew_time = Some(now);
        match api
            .replace(&config.lease_name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                tracing::info!(
                    identity = %config.identity,
                    namespace = %config.namespace,
                    lease = %config.lease_name,
                    "released the leader lease"
                );
                return Ok(true);
            }
            Err(e) if is_conflict(&e) && attempt < RELEASE_ATTEMPTS => attempt += 1,
            Err(e) => return Err(e),
        }
    }
}

/// Ends leadership when the election task stops (aborted or dropped).
struct StepDownOnDrop {
    leadership: Leadership,
    identity: String,
}

impl Drop for StepDownOnDrop {
    fn drop(&mut self) {
        if self.leadership.step_down() {
            tracing::info!(identity = %self.identity, "lost leadership: the election stopped");
        }
    }
}

/// The Lease record as last seen, and when it was first seen (local monotonic clock).
struct Observed {
    spec: LeaseSpec,
    since: Instant,
}

enum Attempt {
    /// We hold the Lease; the successful write was sent at this instant.
    Held { sent: Instant },
    /// Another candidate holds a valid Lease.
    HeldBy(String),
    /// Someone else wrote the Lease between our read and our write.
    Conflict,
}

struct Elector {
    api: Api<Lease>,
    config: LeaderConfig,
    leadership: Leadership,
    observed: Option<Observed>,
}

impl Elector {
    async fn run(mut self) {
        loop {
            let valid_until = self.acquire().await;
            if self.leadership.lead_until(valid_until) {
                tracing::info!(
                    identity = %self.config.identity,
                    namespace = %self.config.namespace,
                    lease = %self.config.lease_name,
                    "became leader"
                );
            }
            let reason = self.renew(valid_until).await;
            if self.leadership.step_down() {
                tracing::info!(
                    identity = %self.config.identity,
                    namespace = %self.config.namespace,
                    lease = %self.config.lease_name,
                    reason = %reason,
                    "lost leadership"
                );
            }
        }
    }

    /// Tries until this replica holds the Lease; returns when its leadership ends unless renewed.
    async fn acquire(&mut self) -> Instant {
        loop {
            let start = Instant::now();
            let deadline = start + self.config.renew_deadline;
            match tokio::time::timeout_at(deadline, self.try_acquire_or_renew(false)).await {
                Ok(Ok(Attempt::Held { sent })) => {
                    let valid_until = sent + self.config.renew_deadline;
                    if Instant::now() < valid_until {
                        return valid_until;
                    }
                    tracing::debug!("acquired the lease too late to lead; trying again");
                }
                Ok(Ok(Attempt::HeldBy(holder))) => {
                    tracing::debug!(%holder, "the leader lease is held by another replica");
                }
                Ok(Ok(Attempt::Conflict)) => {
                    tracing::debug!("another replica wrote the leader lease first");
                }
                Ok(Err(error)) => {
                    tracing::warn!(error = %confighash_cluster::redact::kube_error(&error), "could not acquire the leader lease");
                }
                Err(_) => tracing::warn!("acquiring the leader lease timed out"),
            }
            tokio::time::sleep(jittered(self.config.retry_period)).await;
        }
    }

    /// Renews every retry period until leadership ends; returns why it ended.
    async fn renew(&mut self, mut valid_until: Instant) -> String {
        let mut last_attempt = Instant::now();
        let mut retry_now = false;
        // One immediate retry per conflict streak, not a hot loop.
        let mut retried_conflict = false;
        loop {
            if !std::mem::take(&mut retry_now) {
                tokio::time::sleep_until(
                    (last_attempt + self.config.retry_period).min(valid_until),
                )
                .await;
            }
            if Instant::now() >= valid_until {
                return "no successful renewal before the renew deadline".to_owned();
            }
            last_attempt = Instant::now();
            match tokio::time::timeout_at(valid_until, self.try_acquire_or_renew(true)).await {
                Ok(Ok(Attempt::Held { sent })) => {
                    valid_until = sent + self.config.renew_deadline;
                    self.leadership.lead_until(valid_until);
                    retried_conflict = false;
                }
                Ok(Ok(Attempt::HeldBy(holder))) => {
                    return format!("the lease is held by {holder}");
                }
                Ok(Ok(Attempt::Conflict)) => {
                    // Someone wrote the Lease: read it again at once to see who holds it.
                    tracing::debug!("conflict renewing the leader lease");
                    retry_now = !retried_conflict;
                    retried_conflict = true;
                }
                Ok(Err(error)) => tracing::warn!(
                    error = %confighash_cluster::redact::kube_error(&error),
                    "could not renew the leader lease"
                ),
                Err(_) => {
                    return "renewing timed out at the renew deadline".to_owned();
                }
            }
        }
    }

    /// Notes `spec` as seen now; returns when the record was first seen.
    fn observe(&mut self, spec: &LeaseSpec, now: Instant) -> Instant {
        match &self.observed {
            Some(o) if o.spec == *spec => o.since,
            _ => {
                self.observed = Some(Observed {
                    spec: spec.clone(),
                    since: now,
                });
                now
            }
        }
    }

    /// One read and, when the Lease is ours to take or keep, one write.
    async fn try_acquire_or_renew(&mut self, leading: bool) -> Result<Attempt, kube::Error> {
        let name = self.config.lease_name.clone();
        let identity = self.config.identity.clone();
        let Some(current) = self.api.get_opt(&name).await? else {
            let now = MicroTime(Timestamp::now());
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name),
                    namespace: Some(self.config.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(identity),
                    lease_duration_seconds: Some(self.config.lease_duration_seconds()),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            let sent = Instant::now();
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observe(&created.spec.unwrap_or_default(), Instant::now());
                    Ok(Attempt::Held { sent })
                }
                Err(e) if is_conflict(&e) => Ok(Attempt::Conflict),
                Err(e) => Err(e),
            };
        };

        let old = current.spec.clone().unwrap_or_default();
        let now = Instant::now();
        let first_seen = self.observe(&old, now);
        let holder = old.holder_identity.as_deref().filter(|h| !h.is_empty());
        let ours = holder == Some(identity.as_str());
        if let Some(holder) = holder.filter(|_| !ours) {
            let duration = old
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .filter(|&s| s > 0)
                .map_or(self.config.lease_duration, Duration::from_secs);
            if leading || now < first_seen + duration {
                return Ok(Attempt::HeldBy(holder.to_owned()));
            }
        }

        let stamp = MicroTime(Timestamp::now());
        let mut spec = old.clone();
        spec.holder_identity = Some(identity);
        spec.lease_duration_seconds = Some(self.config.lease_duration_seconds());
        spec.renew_time = Some(stamp.clone());
        if ours {
            spec.acquire_time.get_or_insert(stamp);
            spec.lease_transitions.get_or_insert(0);
        } else {
            spec.acquire_time = Some(stamp);
            spec.lease_transitions = Some(old.lease_transitions.unwrap_or(0).saturating_add(1));
        }
        let mut lease = current;
        lease.spec = Some(spec);
        let sent = Instant::now();
        match self
            .api
            .replace(&name, &PostParams::default(), &lease)
            .await
        {
            Ok(updated) => {
                self.observe(&updated.spec.unwrap_or_default(), Instant::now());
                Ok(Attempt::Held { sent })
            }
            Err(e) if is_conflict(&e) => Ok(Attempt::Conflict),
            Err(e) => Err(e),
        }
    }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 409)
}

/// `period` stretched by a random 0..JITTER_FACTOR of itself.
fn jittered(period: Duration) -> Duration {
    period.mul_f64(1.0 + JITTER_FACTOR * rand::random::<f64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid() {
        let config = LeaderConfig::new("ns", "me");
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(config.lease_name, "confighash");
        assert_eq!(config.lease_duration_seconds(), 15);
    }

    #[test]
    fn lease_seconds_round_up() {
        let mut config = LeaderConfig::new("ns", "me");
        config.lease_duration = Duration::from_millis(1500);
        assert_eq!(config.lease_duration_seconds(), 2);
        config.lease_duration = Duration::from_millis(300);
        assert_eq!(config.lease_duration_seconds(), 1);
    }

    #[test]
    fn jitter_stays_in_range() {
        let period = Duration::from_millis(100);
        for _ in 0..1000 {
            let d = jittered(period);
            assert!(
                d >= period && d <= period.mul_f64(1.0 + JITTER_FACTOR),
                "{d:?}"
            );
        }
    }

    #[test]
    fn identities_differ_per_process() {
        assert_ne!(
            LeaderConfig::default_identity(),
            LeaderConfig::default_identity()
        );
    }

    #[tokio::test]
    async fn leadership_ends_at_its_deadline_by_itself() {
        let leadership = Leadership::new(false);
        let mut changes = leadership.changes();
        assert!(!leadership.is_leader());
        assert!(leadership.lead_until(Instant::now() + Duration::from_millis(50)));
        assert!(leadership.is_leader());
        assert!(changes.has_changed().unwrap());
        assert!(*changes.borrow_and_update());
        // Renewing is not a change.
        assert!(!leadership.lead_until(Instant::now() + Duration::from_millis(50)));
        assert!(!changes.has_changed().unwrap());
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(!leadership.is_leader(), "the deadline passed");
        assert!(leadership.step_down());
        assert!(!leadership.step_down());
        assert!(!*changes.borrow_and_update());
    }

    #[test]
    fn always_leads() {
        let leadership = Leadership::always();
        assert!(leadership.is_leader());
        assert!(leadership.clone().is_leader());
        assert!(*leadership.changes().borrow());
    }
}

//! Prometheus metrics, all named `confighash_*`, served as text on the admin port: the one
//! registry every part records into.
//!
//! Metrics carry counts and names of outcomes, never object names from a review or any config
//! content. Its Cargo.toml keeps it small: the core (for the outcome and kind labels) and
//! prometheus-client; no Kubernetes client, no task runtime.

#![forbid(unsafe_code)]

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use confighash_core::kind::{Kinds, WorkloadKind, every_kind};
use confighash_core::refs::ObjectKind;
use confighash_core::rules::Outcome;

pub mod throttle;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    kind: &'static str,
    operation: &'static str,
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// Why a watch gives up streaming lists: `confighash_cluster::watch::Fallback`'s labels.
pub const STREAMING_LIST_FALLBACK_REASONS: [&str; 4] =
    ["refused", "quiet", "broken", "closed_after_bookmark"];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LookupLabels {
    kind: &'static str,
    outcome: &'static str,
}

/// A kind the watcher reads in one namespace of `--watch-namespaces` (bounded by that list).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NamespaceKindLabels {
    kind: &'static str,
    namespace: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
}

/// The kinds the watcher lists and watches per namespace: ConfigMaps, Secrets and every workload
/// kind of `kinds`.
fn watched_kinds(kinds: &Kinds) -> impl Iterator<Item = &'static str> + '_ {
    [ObjectKind::ConfigMap, ObjectKind::Secret]
        .into_iter()
        .map(ObjectKind::as_str)
        .chain(kinds.iter().map(WorkloadKind::kind))
}

/// Review outcomes of requests that never reached a workload decision (`kind` and `operation`
/// empty).
pub const REQUEST_FAILURE_OUTCOMES: [&str; 3] = ["bad-request", "busy", "timeout"];
/// Outcomes of reads of referenced objects.
pub const LOOKUP_OUTCOMES: [&str; 4] = ["found", "absent", "error", "deadline"];
/// The review outcome counted when a workload references more than `--max-references` objects.
pub const TOO_MANY_REFERENCES_OUTCOME: &str = "too-many-references";
/// The review outcome counted when an object of a configured kind (`--workload-kind`) has no pod
/// template at its kind's pointer: it is allowed unchanged.
pub const NO_POD_TEMPLATE_OUTCOME: &str = "no-pod-template";
/// Outcomes of workload touches. `stale`: the workload no longer carried what the touch
/// expected to replace (the PATCH's `test` or resourceVersion precondition failed), so nothing
/// was written and it was decided again.
pub const TOUCH_OUTCOMES: [&str; 6] = [
    "touched",
    "kept-by-webhook",
    "stale",
    "error",
    "gone",
    "would-roll",
];
/// How followed rollouts ended: `complete` and `stalled` (each with its Event), `gone` (the
/// workload or its namespace was deleted), `superseded` (its template was written again, by a
/// newer touch or an update), `abandoned` (this replica stopped leading, the workload was paused,
/// or its controller reported nothing in time).
pub const ROLLOUT_OUTCOMES: [&str; 5] = ["complete", "stalled", "gone", "superseded", "abandoned"];

/// Every (kind, operation, outcome) a review can be counted with: the rules' outcomes and the
/// too-many-references outcome for each workload kind of `kinds` and operation (and
/// no-pod-template for configured kinds), skipped reviews of other kinds and operations, and the
/// failures before any decision.
fn request_label_sets(kinds: impl IntoIterator<Item = WorkloadKind>) -> Vec<RequestLabels> {
    let kinds: Vec<WorkloadKind> = kinds.into_iter().collect();
    let mut sets = Vec::new();
    for operation in ["CREATE", "UPDATE"] {
        for &kind in &kinds {
            let outcomes = Outcome::ALL
                .iter()
                .map(|o| o.as_str())
                .chain([TOO_MANY_REFERENCES_OUTCOME])
                .chain((!kind.is_built_in()).then_some(NO_POD_TEMPLATE_OUTCOME));
            for outcome in outcomes {
                sets.push(RequestLabels {
                    kind: kind.kind(),
                    operation,
                    outcome,
                });
            }
        }
        sets.push(RequestLabels {
            kind: "",
            operation,
            outcome: Outcome::Skipped.as_str(),
        });
    }
    sets.push(RequestLabels {
        kind: "",
        operation: "other",
        outcome: Outcome::Skipped.as_str(),
    });
    for outcome in REQUEST_FAILURE_OUTCOMES {
        sets.push(RequestLabels {
            kind: "",
            operation: "",
            outcome,
        });
    }
    sets
}

/// Every (kind, operation, outcome) a review `--dry-run` allowed without its patch can be
/// counted with: those of the workload decisions.
fn dry_run_label_sets(kinds: impl IntoIterator<Item = WorkloadKind>) -> Vec<RequestLabels> {
    request_label_sets(kinds)
        .into_iter()
        .filter(|l| {
            !l.kind.is_empty()
                && l.outcome != Outcome::Skipped.as_str()
                && l.outcome != NO_POD_TEMPLATE_OUTCOME
        })
        .collect()
}

/// Declares [`Metrics`]: one line per metric (field, type = initial value, name, help), each
/// registered under the `confighash_` prefix in this order.
macro_rules! metrics {
    ($($field:ident: $ty:ty = $init:expr, $name:literal, $help:literal;)*) => {
        /// Every metric confighash exports.
        pub struct Metrics {
            registry: Registry,
            $($field: $ty,)*
        }

        impl Metrics {
            /// Every metric, registered, without any series.
            fn registered() -> Self {
                let mut registry = Registry::with_prefix("confighash");
                $(
                    let $field: $ty = $init;
                    registry.register($name, $help, $field.clone());
                )*
                Metrics { registry, $($field,)* }
            }
        }
    };
}

// The table of every metric.
metrics! {
    requests: Family<RequestLabels, Counter> = Default::default(), "webhook_requests",
        "Admission reviews by workload kind, operation and outcome";
    // 0.25 ms to about 4 s.
    latency: Histogram = Histogram::new(exponential_buckets(0.000_25, 2.0, 15)), "webhook_request_duration_seconds",
        "Time to answer an admission review, lookups included";
    lookups: Family<LookupLabels, Counter> = Default::default(), "webhook_lookups",
        "Reads of referenced ConfigMaps and Secrets by outcome (found, absent, error, deadline)";
    connections: Gauge = Default::default(), "webhook_connections",
        "Connections open on the webhook port, TLS handshakes included";
    connection_limit_reached: Counter = Default::default(), "webhook_connection_limit_reached",
        "Times the webhook port filled up to --max-connections (new connections then wait in the listen backlog)";
    unsent_answers_closed: Counter = Default::default(), "webhook_unsent_answers_closed",
        "Webhook connections closed because an answer was still unsent a second after the request timeout (a client that does not read: an HTTP/2 flow-control window kept shut)";
    connection_errors: Counter = Default::default(), "webhook_connection_errors",
        "Webhook connections that ended with an error (HTTP/2 streams reset too often, a malformed frame, a reset connection): logged at most once a minute";
    watch_forbidden: Family<NamespaceKindLabels, Counter> = Default::default(), "watch_forbidden",
        "Lists and watches of a namespace of --watch-namespaces refused with 403 (no Role there grants them): logged at most once a minute per watch; the other namespaces go on";
    streaming_list_fallbacks: Family<ReasonLabels, Counter> = Default::default(), "streaming_list_fallbacks",
        "Watches that gave up streaming lists (sendInitialEvents) for paged lists, by reason: refused (the API server does not serve them), quiet (no end bookmark for 30 s), broken (3 in a row broke before their end), closed_after_bookmark (3 in a row were listed again at once)";
    kinds_unlistable: Family<KindLabels, Gauge> = Default::default(), "workload_kind_unlistable",
        "1 while a workload kind's list keeps failing (403, a broken conversion webhook of its CRD): it counts as listed and empty, so every other kind rolls; its watch keeps trying";
    cert_reloads: Counter = Default::default(), "certificate_reloads",
        "Serving certificates loaded after a change on disk";
    cert_reload_failures: Counter = Default::default(), "certificate_reload_failures",
        "Changed serving certificates that could not be loaded (the old pair stays in service)";
    cert_expiry: Gauge = Default::default(), "certificate_expiry_timestamp_seconds",
        "When the serving certificate in use expires, in Unix seconds";
    watched: Family<KindLabels, Gauge> = Default::default(), "watched_objects",
        "Objects the watcher keeps, by kind (ConfigMaps and Secrets as digests only)";
    synced: Gauge = Default::default(), "watcher_cache_synced",
        "1 once every watch has listed its objects";
    leader: Gauge = Default::default(), "leader",
        "1 while this replica is the leader (only the leader touches workloads)";
    changes: Family<KindLabels, Counter> = Default::default(), "config_changes",
        "Content changes of referenced ConfigMaps and Secrets seen on the watch";
    touches: Family<OutcomeLabels, Counter> = Default::default(), "touches",
        "Workload touches by outcome (touched, kept-by-webhook, error, gone; would-roll: a touch a dry run did not make)";
    touch_retries: Counter = Default::default(), "touch_retries",
        "Touches scheduled again after the webhook kept the old stamp or the API failed";
    rate_limited: Counter = Default::default(), "touches_rate_limited",
        "Touches delayed by the global token bucket";
    reconcile_mismatches: Counter = Default::default(), "reconcile_mismatches",
        "Workloads reconcile found with a stale stamp or an unstamped marker";
    // 1 ms to about 65 s: the change window is part of it.
    touch_latency: Histogram = Histogram::new(exponential_buckets(0.001, 2.0, 17)), "change_to_touch_seconds",
        "From a change seen on the watch to its touch sent";
    bypassed: Counter = Default::default(), "workloads_bypassed",
        "Workloads created in opted-in namespaces since this replica started that carry neither a stamp nor the unstamped marker: the API server did not call the webhook";
    touches_pending: Gauge = Default::default(), "touches_pending",
        "Workload touches the leader has pending: waiting for their time (window, pacing, backoff after a touch that did not take), due, or parked behind a touch in flight";
    touches_in_flight: Gauge = Default::default(), "touches_in_flight",
        "Workload touches sent whose result has not come back";
    dry_run: Family<RequestLabels, Counter> = Default::default(), "webhook_dry_run",
        "Admission reviews --dry-run allowed without the patch they would have had, by workload kind, operation and the outcome that patch was for";
    rollouts: Family<OutcomeLabels, Counter> = Default::default(), "rollouts",
        "Rollouts after config changes the leader followed, by how they ended (complete, stalled, gone, superseded, abandoned)";
    rollouts_followed: Gauge = Default::default(), "rollouts_followed",
        "Rollouts after config changes the leader follows now";
    touch_wave_eta: Gauge = Default::default(), "touch_wave_eta_seconds",
        "When the touches pending now will all have been sent, at --max-touches-per-second (whole seconds, rounded up): how long a wave of rollouts after a change of a widely used ConfigMap or Secret has to go";
    config_flapping: Gauge = Default::default(), "config_flapping_objects",
        "ConfigMaps and Secrets whose changes the flap guard holds back now (more than --flap-threshold change windows in --flap-period)";
    waves_halted: Gauge = Default::default(), "waves_halted",
        "Progressive waves halted now: a workload of the wave did not finish its rollout healthy, and the object's other dependents wait for its next content change";
    // 1 s to about 2.3 h.
    rollout_latency: Histogram = Histogram::new(exponential_buckets(1.0, 2.0, 14)), "config_change_to_rollout_complete_seconds",
        "From a config change seen on the watch to the rollout it caused reported complete";
    build_info: Family<BuildLabels, Gauge> = Default::default(), "build_info",
        "1, labelled with the version of confighash that runs";
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let metrics = Self::registered();
        metrics
            .build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        // Every series whose labels are known in advance exists from the start, at 0, so
        // `rate()` and `increase()` see its first increment.
        for labels in request_label_sets(WorkloadKind::BUILT_IN) {
            let _ = metrics.requests.get_or_create(&labels);
        }
        for kind in ObjectKind::ALL {
            for outcome in LOOKUP_OUTCOMES {
                let _ = metrics.lookups.get_or_create(&LookupLabels {
                    kind: kind.as_str(),
                    outcome,
                });
            }
            let _ = metrics.watched.get_or_create(&KindLabels {
                kind: kind.as_str(),
            });
            let _ = metrics.changes.get_or_create(&KindLabels {
                kind: kind.as_str(),
            });
        }
        metrics.prepare_kinds(&Kinds::built_in());
        for outcome in TOUCH_OUTCOMES {
            let _ = metrics.touches.get_or_create(&OutcomeLabels { outcome });
        }
        for outcome in ROLLOUT_OUTCOMES {
            let _ = metrics.rollouts.get_or_create(&OutcomeLabels { outcome });
        }
        for reason in STREAMING_LIST_FALLBACK_REASONS {
            let _ = metrics
                .streaming_list_fallbacks
                .get_or_create(&ReasonLabels { reason });
        }
        metrics.prepare_dry_run();
        metrics
    }

    /// Counts one admission review.
    pub fn request(&self, kind: &'static str, operation: &'static str, outcome: &'static str) {
        debug_assert!(
            request_label_sets(every_kind()).contains(&RequestLabels {
                kind,
                operation,
                outcome
            }),
            "{kind} {operation} {outcome} is not exported from the start"
        );
        self.requests
            .get_or_create(&RequestLabels {
                kind,
                operation,
                outcome,
            })
            .inc();
    }

    /// How many reviews were counted with these labels (for tests and reports).
    pub fn requests(
        &self,
        kind: &'static str,
        operation: &'static str,
        outcome: &'static str,
    ) -> u64 {
        self.requests
            .get_or_create(&RequestLabels {
                kind,
                operation,
                outcome,
            })
            .get()
    }

    pub fn observe_latency(&self, seconds: f64) {
        self.latency.observe(seconds);
    }

    pub fn lookup(&self, kind: &'static str, outcome: &'static str) {
        debug_assert!(LOOKUP_OUTCOMES.contains(&outcome), "{outcome}");
        self.lookups
            .get_or_create(&LookupLabels { kind, outcome })
            .inc();
    }

    /// A connection of the webhook port opened (`true`) or closed (`false`).
    pub fn connection(&self, opened: bool) {
        if opened {
            self.connections.inc();
        } else {
            self.connections.dec();
        }
    }

    /// The webhook port filled up to its connection limit.
    pub fn connection_limit_reached(&self) {
        self.connection_limit_reached.inc();
    }

    /// A webhook connection was closed with an answer still unsent past its deadline.
    pub fn unsent_answer_closed(&self) {
        self.unsent_answers_closed.inc();
    }

    /// A webhook connection ended with a protocol error.
    pub fn connection_error(&self) {
        self.connection_errors.inc();
    }

    /// How many webhook connections ended with a protocol error.
    /// Creates every series of `confighash_watch_forbidden_total` for `--watch-namespaces` at 0.
    pub fn prepare_watch_namespaces<'a>(
        &self,
        namespaces: impl IntoIterator<Item = &'a String>,
        kinds: &Kinds,
    ) {
        for namespace in namespaces {
            for kind in watched_kinds(kinds) {
                let _ = self.watch_forbidden.get_or_create(&NamespaceKindLabels {
                    kind,
                    namespace: namespace.clone(),
                });
            }
        }
    }

    /// Counts a watch that gave up streaming lists for paged ones.
    pub fn streaming_list_fallback(&self, reason: &'static str) {
        debug_assert!(STREAMING_LIST_FALLBACK_REASONS.contains(&reason));
        self.streaming_list_fallbacks
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Watches that gave up streaming lists for `reason`.
    pub fn streaming_list_fallbacks(&self, reason: &'static str) -> u64 {
        self.streaming_list_fallbacks
            .get_or_create(&ReasonLabels { reason })
            .get()
    }

    /// Counts a list or watch of `kind` in `namespace` refused with 403.
    pub fn watch_forbidden(&self, kind: &'static str, namespace: &str) {
        self.watch_forbidden
            .get_or_create(&NamespaceKindLabels {
                kind,
                namespace: namespace.to_owned(),
            })
            .inc();
    }

    pub fn connection_errors(&self) -> u64 {
        self.connection_errors.get()
    }

    /// How many webhook connections were closed with an answer still unsent.
    pub fn unsent_answers_closed(&self) -> u64 {
        self.unsent_answers_closed.get()
    }

    /// How many times the webhook port filled up to its connection limit.
    #[cfg(feature = "testkit")]
    pub fn connection_limit_hits(&self) -> u64 {
        self.connection_limit_reached.get()
    }

    /// Records a certificate reload attempt that found changed files.
    pub fn cert_reload(&self, ok: bool) {
        if ok {
            self.cert_reloads.inc();
        } else {
            self.cert_reload_failures.inc();
        }
    }

    pub fn set_cert_expiry(&self, unix_seconds: i64) {
        self.cert_expiry.set(unix_seconds);
    }

    pub fn set_watched(&self, kind: &'static str, count: usize) {
        self.watched
            .get_or_create(&KindLabels { kind })
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// How many objects of `kind` the watcher keeps (for tests).
    #[cfg(feature = "testkit")]
    pub fn watched(&self, kind: &'static str) -> u64 {
        let gauge = self.watched.get_or_create(&KindLabels { kind });
        u64::try_from(gauge.get()).unwrap_or(0)
    }

    pub fn set_synced(&self, synced: bool) {
        self.synced.set(i64::from(synced));
    }

    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    pub fn change_seen(&self, kind: &'static str) {
        self.changes.get_or_create(&KindLabels { kind }).inc();
    }

    pub fn touch(&self, outcome: &'static str) {
        debug_assert!(TOUCH_OUTCOMES.contains(&outcome), "{outcome}");
        self.touches.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    /// How many touches ended with this outcome.
    pub fn touches(&self, outcome: &'static str) -> u64 {
        self.touches.get_or_create(&OutcomeLabels { outcome }).get()
    }

    pub fn touch_retry(&self) {
        self.touch_retries.inc();
    }

    pub fn touch_rate_limited(&self) {
        self.rate_limited.inc();
    }

    pub fn reconcile_mismatches(&self, count: u64) {
        self.reconcile_mismatches.inc_by(count);
    }

    pub fn observe_touch_latency(&self, seconds: f64) {
        self.touch_latency.observe(seconds);
    }

    /// A workload that did not pass through the webhook was seen (once per workload).
    pub fn workload_bypassed(&self) {
        self.bypassed.inc();
    }

    /// How many workloads were seen that did not pass through the webhook.
    pub fn workloads_bypassed(&self) -> u64 {
        self.bypassed.get()
    }

    /// How many touches are pending and in flight now.
    pub fn set_touches(&self, pending: usize, in_flight: usize) {
        self.touches_pending
            .set(i64::try_from(pending).unwrap_or(i64::MAX));
        self.touches_in_flight
            .set(i64::try_from(in_flight).unwrap_or(i64::MAX));
    }

    /// How many touches are pending, and how many in flight, as last set.
    #[cfg(feature = "testkit")]
    pub fn touches_outstanding(&self) -> (u64, u64) {
        let count = |g: &Gauge| u64::try_from(g.get()).unwrap_or(0);
        (count(&self.touches_pending), count(&self.touches_in_flight))
    }

    /// Creates every series of `confighash_webhook_dry_run_total` at 0. [`Metrics::new`] does,
    /// in every mode, so that dashboards and alerts see 0 rather than no data.
    pub fn prepare_dry_run(&self) {
        for labels in dry_run_label_sets(WorkloadKind::BUILT_IN) {
            let _ = self.dry_run.get_or_create(&labels);
        }
    }

    /// Creates the series of the workload kinds of `kinds` at 0 (reviews, dry-run reviews,
    /// watched objects). [`Metrics::new`] does for the built-in kinds; `serve` does for its
    /// configured kinds (`--workload-kind`).
    pub fn prepare_kinds(&self, kinds: &Kinds) {
        for labels in request_label_sets(kinds.iter()) {
            let _ = self.requests.get_or_create(&labels);
        }
        for labels in dry_run_label_sets(kinds.iter()) {
            let _ = self.dry_run.get_or_create(&labels);
        }
        for kind in kinds.iter() {
            let _ = self
                .watched
                .get_or_create(&KindLabels { kind: kind.kind() });
            let _ = self
                .kinds_unlistable
                .get_or_create(&KindLabels { kind: kind.kind() });
        }
    }

    /// Counts a review allowed without its patch by `--dry-run`, with the outcome the patch was
    /// for.
    pub fn dry_run(&self, kind: &'static str, operation: &'static str, outcome: &'static str) {
        let labels = RequestLabels {
            kind,
            operation,
            outcome,
        };
        debug_assert!(
            dry_run_label_sets(every_kind()).contains(&labels),
            "{kind} {operation} {outcome} is not exported by prepare_dry_run"
        );
        self.dry_run.get_or_create(&labels).inc();
    }

    /// How many reviews `--dry-run` allowed without their patch, with these labels.
    #[cfg(feature = "testkit")]
    pub fn dry_runs(
        &self,
        kind: &'static str,
        operation: &'static str,
        outcome: &'static str,
    ) -> u64 {
        self.dry_run
            .get_or_create(&RequestLabels {
                kind,
                operation,
                outcome,
            })
            .get()
    }

    /// A followed rollout ended this way.
    pub fn rollout_outcome(&self, outcome: &'static str) {
        debug_assert!(ROLLOUT_OUTCOMES.contains(&outcome), "{outcome}");
        self.rollouts
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    /// How many followed rollouts ended this way.
    #[cfg(feature = "testkit")]
    pub fn rollout_outcomes(&self, outcome: &'static str) -> u64 {
        self.rollouts
            .get_or_create(&OutcomeLabels { outcome })
            .get()
    }

    /// How many rollouts are followed now.
    pub fn set_rollouts_followed(&self, count: usize) {
        self.rollouts_followed
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// How long the touches pending now take to send at `rate` a second.
    pub fn set_touch_wave_eta(&self, pending: usize, rate: f64) {
        let seconds = if rate > 0.0 {
            (pending as f64 / rate).ceil()
        } else {
            0.0
        };
        self.touch_wave_eta.set(seconds.min(i64::MAX as f64) as i64);
    }

    /// The estimate [`Metrics::set_touch_wave_eta`] last set, in seconds.
    pub fn touch_wave_eta(&self) -> u64 {
        u64::try_from(self.touch_wave_eta.get()).unwrap_or(0)
    }

    /// How many ConfigMaps and Secrets the flap guard holds now.
    pub fn set_config_flapping(&self, count: usize) {
        self.config_flapping
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// How many ConfigMaps and Secrets the flap guard holds, as last set.
    pub fn config_flapping(&self) -> u64 {
        u64::try_from(self.config_flapping.get()).unwrap_or(0)
    }

    /// Whether `kind`'s list keeps failing (it counts as listed, empty).
    pub fn set_kind_unlistable(&self, kind: &'static str, unlistable: bool) {
        self.kinds_unlistable
            .get_or_create(&KindLabels { kind })
            .set(i64::from(unlistable));
    }

    /// How many progressive waves are halted now.
    pub fn set_waves_halted(&self, count: usize) {
        self.waves_halted
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// How many progressive waves are halted, as last set.
    pub fn waves_halted(&self) -> u64 {
        u64::try_from(self.waves_halted.get()).unwrap_or(0)
    }

    /// How many rollouts are followed, as last set.
    pub fn rollouts_followed(&self) -> u64 {
        u64::try_from(self.rollouts_followed.get()).unwrap_or(0)
    }

    /// From a config change seen to the rollout it caused complete.
    pub fn observe_rollout_latency(&self, seconds: f64) {
        self.rollout_latency.observe(seconds);
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the series `series` (name and labels as the text format writes them).
    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok())?
        })
    }

    #[test]
    fn a_fresh_scrape_has_every_known_series_at_zero_and_the_build_info() {
        let text = Metrics::new().encode();
        let zero = |series: &str| {
            assert_eq!(value(&text, series), Some(0.0), "{series} in\n{text}");
        };
        assert_eq!(
            value(
                &text,
                &format!(
                    "confighash_build_info{{version=\"{}\"}}",
                    env!("CARGO_PKG_VERSION")
                )
            ),
            Some(1.0),
            "{text}"
        );
        zero("confighash_workloads_bypassed_total");
        zero("confighash_touches_pending");
        zero("confighash_touches_in_flight");
        zero("confighash_rollouts_followed");
        zero("confighash_config_flapping_objects");
        zero("confighash_waves_halted");
        zero("confighash_touch_wave_eta_seconds");
        zero("confighash_config_change_to_rollout_complete_seconds_count");
        for outcome in ROLLOUT_OUTCOMES {
            zero(&format!(
                "confighash_rollouts_total{{outcome=\"{outcome}\"}}"
            ));
        }
        for outcome in TOUCH_OUTCOMES {
            zero(&format!(
                "confighash_touches_total{{outcome=\"{outcome}\"}}"
            ));
        }
        for kind in ["ConfigMap", "Secret"] {
            for outcome in LOOKUP_OUTCOMES {
                zero(&format!(
                    "confighash_webhook_lookups_total{{kind=\"{kind}\",outcome=\"{outcome}\"}}"
                ));
            }
            zero(&format!(
                "confighash_config_changes_total{{kind=\"{kind}\"}}"
            ));
        }
        for kind in [
            "ConfigMap",
            "Secret",
            "Deployment",
            "StatefulSet",
            "DaemonSet",
            "CronJob",
            "Rollout",
        ] {
            zero(&format!("confighash_watched_objects{{kind=\"{kind}\"}}"));
        }
        for outcome in [
            "stamped",
            "unchanged",
            "kept-on-error",
            "kept-absent",
            "kept-foreign",
            "kept-unstamped",
            "skipped",
            "too-many-references",
        ] {
            for operation in ["CREATE", "UPDATE"] {
                zero(&format!(
                    "confighash_webhook_requests_total{{kind=\"Deployment\",operation=\"{operation}\",outcome=\"{outcome}\"}}"
                ));
            }
        }
        for outcome in ["bad-request", "busy", "timeout"] {
            zero(&format!(
                "confighash_webhook_requests_total{{kind=\"\",operation=\"\",outcome=\"{outcome}\"}}"
            ));
        }
        zero(
            "confighash_webhook_requests_total{kind=\"\",operation=\"other\",outcome=\"skipped\"}",
        );
        zero(
            "confighash_webhook_requests_total{kind=\"\",operation=\"CREATE\",outcome=\"skipped\"}",
        );
        // Counting one of them adds no series.
        let metrics = Metrics::new();
        let before = metrics.encode().lines().count();
        metrics.touch("error");
        metrics.request("CronJob", "UPDATE", "kept-foreign");
        metrics.lookup("Secret", "deadline");
        metrics.change_seen("Secret");
        metrics.set_watched("Rollout", 3);
        assert_eq!(metrics.encode().lines().count(), before);
    }
}

//! Prometheus metrics, all named `confighash_*`, served as text on the admin port.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    kind: &'static str,
    operation: &'static str,
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LookupLabels {
    kind: &'static str,
    outcome: &'static str,
}

/// Every metric confighash exports.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Histogram,
    lookups: Family<LookupLabels, Counter>,
    cert_reloads: Counter,
    cert_reload_failures: Counter,
    cert_expiry: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("confighash");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "webhook_requests",
            "Admission reviews by workload kind, operation and outcome",
            requests.clone(),
        );
        // 0.25 ms to about 4 s.
        let latency = Histogram::new(exponential_buckets(0.000_25, 2.0, 15));
        registry.register(
            "webhook_request_duration_seconds",
            "Time to answer an admission review, lookups included",
            latency.clone(),
        );
        let lookups = Family::<LookupLabels, Counter>::default();
        registry.register(
            "webhook_lookups",
            "Reads of referenced ConfigMaps and Secrets by outcome (found, absent, error, deadline)",
            lookups.clone(),
        );
        let cert_reloads = Counter::default();
        registry.register(
            "certificate_reloads",
            "Serving certificates loaded after a change on disk",
            cert_reloads.clone(),
        );
        let cert_reload_failures = Counter::default();
        registry.register(
            "certificate_reload_failures",
            "Changed serving certificates that could not be loaded (the old pair stays in service)",
            cert_reload_failures.clone(),
        );
        let cert_expiry = Gauge::default();
        registry.register(
            "certificate_expiry_timestamp_seconds",
            "When the serving certificate in use expires, in Unix seconds",
            cert_expiry.clone(),
        );
        Metrics {
            registry,
            requests,
            latency,
            lookups,
            cert_reloads,
            cert_reload_failures,
            cert_expiry,
        }
    }

    /// Counts one admission review.
    pub fn request(&self, kind: &'static str, operation: &'static str, outcome: &'static str) {
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
        self.lookups
            .get_or_create(&LookupLabels { kind, outcome })
            .inc();
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

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

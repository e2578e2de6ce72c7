//! The mutating admission webhook: `POST /mutate` with an `admission.k8s.io/v1` AdmissionReview.
//!
//! The async shell parses and reads references; the decision is the shared stamp rules
//! ([`rules::decide`]) and the patch is [`patch::build`]'s. A well-formed review is always
//! allowed: confighash mutates, it never blocks a deploy.

use confighash_metrics::throttle::Throttle;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Version, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Router};
use base64::Engine;
use http_body_util::BodyExt;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::OwnedSemaphorePermit;
use tracing::Instrument;

use super::pruned::{Object, OldObject};
use crate::budget::MemoryBudget;
use crate::lookup::{self, LookupError, Lookups, ObjectSource};
use confighash_core::checksum::KeyStore;
use confighash_core::checksum::StampKey;
use confighash_core::names::{
    UNSTAMPED_LOOKUP_FAILED, UNSTAMPED_TOO_LARGE, UNSTAMPED_TOO_MANY_REFERENCES,
};
use confighash_core::patch;
use confighash_core::refs;
use confighash_core::rules::{self, Current, Lookup, Outcome, Trigger};
use confighash_core::workload::{self, Analysis, Kinds, WorkloadKind};
use confighash_metrics::Metrics;
use confighash_serving::held;

/// Largest review body accepted: an UPDATE carries two objects of up to 1.5 MiB each, base64
/// and the envelope on top.
pub const MAX_BODY: usize = 7 * 1024 * 1024;

const REVIEW_API_VERSION: &str = "admission.k8s.io/v1";

/// A review must be received and answered within this from its request head, by default: the
/// server's request timeout.
pub use confighash_serving::server::DEFAULT_REQUEST_TIMEOUT;
/// Memory reviews may hold at once, all connections together, by default: room for four of the
/// largest reviews, or thousands of ordinary ones (a few KiB each).
pub const DEFAULT_REVIEW_MEMORY: usize = 64 * 1024 * 1024;
/// The least memory budget: one largest review made of few values (its buffer and its parsed
/// copy), with room to spare.
pub const MIN_REVIEW_MEMORY: usize = 2 * MAX_BODY + 1024 * 1024;
/// What every review counts against the memory budget besides its body: its head (at most 16 KiB
/// on HTTP/2, 64 KiB on HTTP/1.1, usually well under 1 KiB) and its state. It bounds how many
/// reviews are held at once.
pub const REVIEW_ALLOWANCE: usize = 16 * 1024;

/// What an answer counts against the memory budget besides its bytes, from when it is made until
/// it is sent in full: its stream's state in the HTTP/2 server (about 2.5 KiB measured) and the
/// response head.
pub const ANSWER_ALLOWANCE: usize = 4 * 1024;

/// What one counted JSON value (see `parse_cost`) takes at most once parsed, with its share of
/// the maps and vectors around it. Measured peaks: 72 bytes per value for an array of numbers,
/// 74 for an object of numbers, 163 to 173 for an array of one-member objects (the worst shape
/// found: an ordered map is large for one member). So a 7 MiB review can take over 400 MiB parsed;
/// ordinary reviews count about 20 bytes of JSON per value.
pub const PARSED_VALUE_COST: usize = 192;

/// Bounds on every review of one server, shared by all its connections: a time limit, and one
/// memory budget. A review holds, from its head until it is answered, an allowance
/// ([`REVIEW_ALLOWANCE`]), its body buffer as it grows, and, once the body is in, what parsing it
/// may take ([`PARSED_VALUE_COST`]); a review that finds no room gets 503 at once, one that could
/// never fit gets 413.
#[derive(Debug, Clone)]
pub struct ReviewLimits {
    timeout: Duration,
    memory: MemoryBudget,
}

impl Default for ReviewLimits {
    fn default() -> Self {
        ReviewLimits::new(DEFAULT_REQUEST_TIMEOUT, DEFAULT_REVIEW_MEMORY)
    }
}

impl ReviewLimits {
    /// Reviews must be received and answered within `timeout`, and hold at most `memory` bytes at
    /// once (at least [`MIN_REVIEW_MEMORY`]).
    pub fn new(timeout: Duration, memory: usize) -> Self {
        ReviewLimits {
            timeout,
            memory: MemoryBudget::new(memory.max(MIN_REVIEW_MEMORY)),
        }
    }

    /// Bytes of the memory budget held by reviews (and the objects their lookups read) now.
    pub fn memory_in_use(&self) -> usize {
        self.memory.in_use()
    }

    /// Takes `bytes` of the budget at once, or none if that much is not free.
    fn reserve(&self, bytes: usize) -> Option<OwnedSemaphorePermit> {
        self.memory.try_reserve(bytes)
    }

    fn capacity(&self) -> usize {
        self.memory.capacity()
    }
}

pub use confighash_core::names::{DEFAULT_MAX_REFERENCES, KUBE_SYSTEM};
/// The default lookup deadline (`--lookup-deadline`).
pub const DEFAULT_LOOKUP_DEADLINE: Duration = Duration::from_secs(2);

/// What the webhook needs to answer reviews: [`Webhook::new`], then the `with_` methods for
/// anything other than the defaults.
pub struct Webhook {
    lookups: Lookups,
    keys: Arc<KeyStore>,
    metrics: Arc<Metrics>,
    /// One deadline for all lookups of a review, well below the webhook's `timeoutSeconds`.
    lookup_deadline: Duration,
    options: rules::Options,
    /// Distinct objects a workload may reference; over it nothing is read.
    max_references: usize,
    /// The decoded bytes of values a workload's lookups may read (`--max-reference-bytes`).
    max_reference_bytes: u64,
    /// Namespaces whose objects are never read: `kube-system`, confighash's own and
    /// `--exclude-namespaces`.
    excluded: BTreeSet<String>,
    /// `--watch-namespaces`: the only namespaces whose objects are read (`None`: every one).
    watched: Option<BTreeSet<String>>,
    /// `--dry-run`: decide and count as usual, answer without the patch.
    dry_run: bool,
    /// The kinds stamped: the built-in kinds and `--workload-kind`.
    kinds: Kinds,
    /// Objects of a configured kind without a pod template at its pointer: when one was last
    /// logged, and how many were not logged since.
    no_template: NoTemplateLog,
}

/// Logs objects without a pod template at most once a minute: anyone who may create such
/// objects could otherwise fill the log.
#[derive(Default)]
struct NoTemplateLog(Throttle);

impl NoTemplateLog {
    fn report(&self, kind: WorkloadKind, error: &workload::WorkloadError) {
        let Some(unlogged) = self.0.allow() else {
            return;
        };
        tracing::warn!(
            error = %error,
            pointer = kind.template_pointer(),
            unlogged,
            "no pod template at the configured kind's pointer (--workload-kind); allowed \
             unchanged. Counted as outcome no-pod-template; logged at most once a minute \
             (unlogged: how many since the last line)"
        );
    }
}

impl Webhook {
    /// A webhook reading from `source`, with the defaults of `confighash serve`.
    pub fn new(source: Arc<dyn ObjectSource>, keys: Arc<KeyStore>, metrics: Arc<Metrics>) -> Self {
        Webhook {
            lookups: Lookups::new(source, lookup::DEFAULT_MAX_READS_IN_FLIGHT),
            keys,
            metrics,
            lookup_deadline: DEFAULT_LOOKUP_DEADLINE,
            options: rules::Options::default(),
            max_references: DEFAULT_MAX_REFERENCES,
            max_reference_bytes: confighash_core::names::DEFAULT_MAX_REFERENCE_BYTES,
            excluded: BTreeSet::from([KUBE_SYSTEM.to_owned()]),
            watched: None,
            dry_run: false,
            kinds: Kinds::built_in(),
            no_template: NoTemplateLog::default(),
        }
    }

    /// The kinds stamped: the built-in kinds and those configured (`--workload-kind`).
    pub fn with_kinds(mut self, kinds: Kinds) -> Self {
        self.metrics.prepare_kinds(&kinds);
        self.kinds = kinds;
        self
    }

    pub fn with_lookup_deadline(mut self, deadline: Duration) -> Self {
        self.lookup_deadline = deadline;
        self
    }

    pub fn with_options(mut self, options: rules::Options) -> Self {
        self.options = options;
        self
    }

    /// `--max-references` (at least 1).
    pub fn with_max_references(mut self, max: usize) -> Self {
        self.max_references = max.max(1);
        self
    }

    /// `--max-reference-bytes` (at least 1).
    pub fn with_max_reference_bytes(mut self, max: u64) -> Self {
        self.max_reference_bytes = max.max(1);
        self
    }

    /// Namespaces never read besides `kube-system` (confighash's own, `--exclude-namespaces`).
    pub fn with_excluded_namespaces(
        mut self,
        namespaces: impl IntoIterator<Item = String>,
    ) -> Self {
        self.excluded.extend(namespaces);
        self
    }

    /// `--watch-namespaces`: reviews of workloads in any other namespace are allowed unchanged
    /// without a read, whatever the sender says of its labels.
    pub fn with_watch_namespaces(mut self, namespaces: Option<BTreeSet<String>>) -> Self {
        self.watched = namespaces;
        self
    }

    /// `--dry-run`: every review is decided and counted as usual, then allowed without its patch,
    /// which is counted in `confighash_webhook_dry_run_total` and logged at debug.
    pub fn with_dry_run(mut self, dry_run: bool) -> Self {
        if dry_run {
            self.metrics.prepare_dry_run();
        }
        self.dry_run = dry_run;
        self
    }

    /// Reads in flight for all reviews together.
    #[cfg(feature = "testkit")]
    pub fn with_max_reads_in_flight(mut self, max: usize) -> Self {
        self.lookups = self.lookups.with_cap(max);
        self
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn keys(&self) -> &Arc<KeyStore> {
        &self.keys
    }

    /// Places under the shared cap of reads that are free now.
    #[cfg(feature = "testkit")]
    pub fn reads_free(&self) -> usize {
        self.lookups.places_free()
    }
}

// The review and its answer are our own lean types, not `kube::core::admission`'s:
// - its `AdmissionRequest<T>` parses `object` into `T` through `DynamicObject`'s
//   `serde(flatten)`, slower than one `Value`, and the review memory accounting
//   ([`parse_cost`]) is measured on this parse;
// - its `AdmissionResponse` is `non_exhaustive` (built only from its own request type) and
//   serializes `patch: Vec<u8>` as a JSON array of numbers, up to 4 bytes per patch byte on the
//   wire where base64 takes 1.33. kube-apiserver decodes both; the answer here is the
//   documented form, base64 in `patch` with `patchType: JSONPatch`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Review {
    api_version: Option<String>,
    kind: Option<String>,
    request: Option<Request>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GroupVersionKind {
    #[serde(default)]
    group: String,
    #[serde(default)]
    kind: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Request {
    uid: Option<String>,
    #[serde(default)]
    kind: GroupVersionKind,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    operation: Option<String>,
    /// All of it but what nothing here reads ([`Object`]).
    #[serde(default)]
    object: Option<Object>,
    /// Only what the rules read of it ([`OldObject`]).
    #[serde(default)]
    old_object: Option<OldObject>,
}

/// A review that cannot be answered: 400 (or 413, 503) with a JSON message.
#[derive(Debug)]
pub struct BadRequest {
    status: StatusCode,
    message: String,
}

impl BadRequest {
    fn new(message: impl Into<String>) -> Self {
        BadRequest {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }

    /// The HTTP status the review is answered with.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    fn busy() -> Self {
        BadRequest {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "the webhook holds as many reviews in memory as it may; try again".into(),
        }
    }
}

impl IntoResponse for BadRequest {
    fn into_response(self) -> Response {
        error_response(self.status, &self.message)
    }
}

fn error_response(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({"error": message}))).into_response()
}

/// The webhook's router with the default [`ReviewLimits`]: `POST /mutate`; 404 elsewhere, 405 for
/// other methods; a panic in a handler becomes a 500, not a dead task.
pub fn router(webhook: Arc<Webhook>) -> Router {
    router_with(webhook, ReviewLimits::default())
}

/// The webhook's router, each review within `limits`.
pub fn router_with(webhook: Arc<Webhook>, limits: ReviewLimits) -> Router {
    Router::new()
        .route("/mutate", post(mutate))
        .method_not_allowed_fallback(|| async {
            error_response(
                StatusCode::METHOD_NOT_ALLOWED,
                "only POST is allowed on /mutate",
            )
        })
        .fallback(|| async {
            error_response(
                StatusCode::NOT_FOUND,
                "not found; reviews go to POST /mutate",
            )
        })
        .layer(Extension(limits))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(|_| {
            error_response(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
        }))
        .with_state(webhook)
}

async fn mutate(
    State(webhook): State<Arc<Webhook>>,
    Extension(limits): Extension<ReviewLimits>,
    version: Version,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let mut response = review(&webhook, &limits, &headers, body).await;
    webhook
        .metrics
        .observe_latency(started.elapsed().as_secs_f64());
    let body_may_be_unread = matches!(
        response.status(),
        StatusCode::REQUEST_TIMEOUT
            | StatusCode::PAYLOAD_TOO_LARGE
            | StatusCode::SERVICE_UNAVAILABLE
    );
    if version <= Version::HTTP_11 && body_may_be_unread {
        // The body may be unread (too slow, too large, no memory for it): the connection cannot
        // carry another request after it, so say so instead of leaving the client to find out.
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// Reads and answers one review within the limits: the whole of it, body included, within the
/// timeout, and its body within the memory budget.
async fn review(
    webhook: &Webhook,
    limits: &ReviewLimits,
    headers: &HeaderMap,
    body: Body,
) -> Response {
    let Some(mut held) = limits.reserve(REVIEW_ALLOWANCE) else {
        webhook.metrics.request("", "", "busy");
        return BadRequest::busy().into_response();
    };
    let received = AtomicBool::new(false);
    let work = async {
        let bytes = read_body(headers, body, limits, &mut held).await?;
        received.store(true, Ordering::Relaxed);
        // Parsed, the review takes far more than its bytes when it is made of many small values:
        // that is counted against the budget too, before parsing.
        let parsing = parse_cost(&bytes);
        if parsing > limits.capacity() - held.num_permits() {
            return Err(BadRequest {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                message: format!(
                    "the review has too many JSON values to parse within the webhook's memory \
                     budget ({} bytes)",
                    limits.capacity()
                ),
            });
        }
        held.merge(limits.reserve(parsing).ok_or_else(BadRequest::busy)?);
        webhook.answer_within(&bytes, &limits.memory).await
    };
    match tokio::time::timeout(limits.timeout, work).await {
        Ok(Ok(review)) => {
            // The answer and its stream's state stay counted until they are sent (a client that
            // keeps its flow-control window shut holds them): the rest is given back now.
            let response = axum::Json(review).into_response();
            let answer = axum::body::HttpBody::size_hint(response.body())
                .exact()
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(0);
            let keep = answer
                .saturating_add(ANSWER_ALLOWANCE)
                .min(held.num_permits());
            let kept = held.split(keep);
            drop(held);
            held::hold(response, kept)
        }
        Ok(Err(bad)) => {
            let outcome = if bad.status == StatusCode::SERVICE_UNAVAILABLE {
                "busy"
            } else {
                "bad-request"
            };
            webhook.metrics.request("", "", outcome);
            bad.into_response()
        }
        Err(_) => {
            webhook.metrics.request("", "", "timeout");
            if received.load(Ordering::Relaxed) {
                error_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &format!("the review was not answered within {:?}", limits.timeout),
                )
            } else {
                error_response(
                    StatusCode::REQUEST_TIMEOUT,
                    &format!("the review was not received within {:?}", limits.timeout),
                )
            }
        }
    }
}

/// Bytes that parsing `body` into [`Value`]s may take at most: a copy of its strings, and
/// [`PARSED_VALUE_COST`] for each value or member it can hold (every `,` `:` `[` `{` outside
/// strings, plus one), counted without parsing.
fn parse_cost(body: &[u8]) -> usize {
    let mut values = 1usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in body {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else {
            match b {
                b'"' => in_string = true,
                b',' | b':' | b'[' | b'{' => values += 1,
                _ => {}
            }
        }
    }
    body.len()
        .saturating_add(values.saturating_mul(PARSED_VALUE_COST))
}

/// The body, at most [`MAX_BODY`] bytes. Its buffer's growth is taken from the memory budget as
/// it happens (`held` gathers it), so only bytes that have arrived count; a declared length is
/// checked, never allocated up front.
async fn read_body(
    headers: &HeaderMap,
    mut body: Body,
    limits: &ReviewLimits,
    held: &mut OwnedSemaphorePermit,
) -> Result<Vec<u8>, BadRequest> {
    let too_large = || BadRequest {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        message: format!("the review is larger than {MAX_BODY} bytes"),
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return Err(too_large());
    }
    let mut buf: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BadRequest::new(format!("reading the review: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let needed = buf.len() + data.len();
        if needed > MAX_BODY {
            return Err(too_large());
        }
        if needed > buf.capacity() {
            let capacity = needed.max(buf.capacity() * 2).clamp(8 * 1024, MAX_BODY);
            let more = limits
                .reserve(capacity - buf.capacity())
                .ok_or_else(BadRequest::busy)?;
            held.merge(more);
            buf.reserve_exact(capacity - buf.len());
        }
        buf.extend_from_slice(&data);
    }
    Ok(buf)
}

impl Webhook {
    /// Answers one review body, or says why it is not a review, with a memory budget of its own.
    pub async fn answer(&self, body: &[u8]) -> Result<Value, BadRequest> {
        self.answer_within(body, &MemoryBudget::new(DEFAULT_REVIEW_MEMORY))
            .await
    }

    /// Answers one review body, the objects its lookups read taken from `budget`.
    pub async fn answer_within(
        &self,
        body: &[u8],
        budget: &MemoryBudget,
    ) -> Result<Value, BadRequest> {
        let review: Review = serde_json::from_slice(body).map_err(|e| {
            BadRequest::new(format!(
                "the body is not an AdmissionReview: {}",
                confighash_cluster::redact::json_error(&e)
            ))
        })?;
        match review.api_version.as_deref() {
            Some(REVIEW_API_VERSION) => {}
            Some(_) => {
                return Err(BadRequest::new(format!(
                    "unsupported apiVersion; confighash serves {REVIEW_API_VERSION}"
                )));
            }
            None => return Err(BadRequest::new("the AdmissionReview has no apiVersion")),
        }
        if review.kind.as_deref() != Some("AdmissionReview") {
            return Err(BadRequest::new("the body's kind is not AdmissionReview"));
        }
        let request = review
            .request
            .ok_or_else(|| BadRequest::new("the AdmissionReview has no request"))?;
        let uid = request
            .uid
            .clone()
            .filter(|u| !u.is_empty())
            .ok_or_else(|| BadRequest::new("the AdmissionReview request has no uid"))?;
        if uid.len() > MAX_UID_LEN || uid.chars().any(char::is_control) {
            return Err(BadRequest::new(format!(
                "the AdmissionReview request's uid is not a uid (at most {MAX_UID_LEN} \
                 characters, no control characters)"
            )));
        }
        let reviewed = self.review(&request, budget).await?;
        // Counted here, once for every review that was answered.
        self.metrics
            .request(reviewed.kind, reviewed.operation, reviewed.outcome);
        if reviewed.withheld {
            self.metrics
                .dry_run(reviewed.kind, reviewed.operation, reviewed.outcome);
        }
        let patch = reviewed.patch;
        let mut response = json!({"uid": uid, "allowed": true});
        if let Some(patch) = patch {
            response["patchType"] = json!("JSONPatch");
            response["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(patch));
        }
        Ok(json!({
            "apiVersion": REVIEW_API_VERSION,
            "kind": "AdmissionReview",
            "response": response
        }))
    }

    /// What becomes of a review: skipped, or the workload pipeline ([`Self::review_workload`]).
    /// A workload review whose namespace or name could not name an object is refused: they go
    /// into request paths and log lines.
    async fn review(
        &self,
        request: &Request,
        budget: &MemoryBudget,
    ) -> Result<Reviewed, BadRequest> {
        let operation: &'static str = match request.operation.as_deref() {
            Some("CREATE") => "CREATE",
            Some("UPDATE") => "UPDATE",
            // DELETE and CONNECT are allowed untouched.
            _ => return Ok(Reviewed::skipped("", "other")),
        };
        let Some(kind) = self.kinds.find(&request.kind.group, &request.kind.kind) else {
            return Ok(Reviewed::skipped("", operation));
        };
        let label = kind.kind();
        let namespace = request.namespace.as_deref().unwrap_or("");
        if !refs::is_namespace_name(namespace) {
            return Err(BadRequest::new(
                "request.namespace is not a namespace name (a DNS-1123 label); workloads are \
                 namespaced",
            ));
        }
        let name = request.name.as_deref().unwrap_or("");
        if !name.is_empty() && !refs::is_object_name(name) {
            return Err(BadRequest::new(
                "request.name is not an object name (a DNS-1123 subdomain)",
            ));
        }
        // Checked above, so they may go into log lines: every line of this review carries them.
        let span = tracing::info_span!("review", kind = label, namespace, name, operation);
        Ok(self
            .review_workload(request, kind, namespace, operation, budget)
            .instrument(span)
            .await)
    }

    /// Why objects of `namespace` are never read, if they are not: excluded, or outside
    /// `--watch-namespaces`.
    fn never_read(&self, namespace: &str) -> Option<&'static str> {
        if self.excluded.contains(namespace) {
            Some("excluded namespace")
        } else if self
            .watched
            .as_ref()
            .is_some_and(|list| !list.contains(namespace))
        {
            Some("namespace outside --watch-namespaces")
        } else {
            None
        }
    }

    /// A workload review whose namespace and name were checked, one way through: analyse, look
    /// up, decide, patch. Whether the namespace is opted in, or the workload by its own
    /// `confighash.dev/enabled=true`, is the API server's to decide (the webhook entries'
    /// selectors): the labels a review shows are the sender's word and are not checked here.
    async fn review_workload(
        &self,
        request: &Request,
        kind: WorkloadKind,
        namespace: &str,
        operation: &'static str,
        budget: &MemoryBudget,
    ) -> Reviewed {
        let skipped = Reviewed::skipped(kind.kind(), operation);
        if let Some(why) = self.never_read(namespace) {
            // The namespace labels the review claims are the sender's words: objects here are
            // never read.
            tracing::debug!("{why}; allowed unchanged");
            return skipped;
        }
        let subject = match analyse(request, kind, self.max_references) {
            Analysed::Subject(subject) => subject,
            Analysed::Nothing => return skipped,
            Analysed::NoTemplate(error) => {
                self.no_template.report(kind, &error);
                return Reviewed {
                    outcome: NO_POD_TEMPLATE_OUTCOME,
                    ..skipped
                };
            }
        };
        let key = self.keys.current();
        let lookup = self.look_up(&subject, namespace, &key, budget).await;
        let current = subject.current();
        let decision = rules::decide(
            subject.trigger,
            current,
            subject.info.opted_out,
            &lookup,
            key.id(),
            self.options,
        );
        let too_many = subject.too_many();
        let outcome = if too_many {
            TOO_MANY_REFERENCES_OUTCOME
        } else {
            decision.outcome.as_str()
        };
        tracing::debug!(
            outcome,
            stamp = decision.stamp.as_deref().unwrap_or(""),
            "decided"
        );
        let marker = decision.marker.then_some(if too_many {
            UNSTAMPED_TOO_MANY_REFERENCES
        } else if decision.outcome == Outcome::KeptTooLarge {
            UNSTAMPED_TOO_LARGE
        } else {
            UNSTAMPED_LOOKUP_FAILED
        });
        let patch = if decision.changes(current) || too_many {
            workload_patch(&subject, decision.stamp.as_deref(), marker)
        } else {
            None
        };
        let withheld = self.dry_run && patch.is_some();
        if withheld {
            tracing::debug!(
                outcome,
                stamp = decision.stamp.as_deref().unwrap_or(""),
                marker = marker.unwrap_or(""),
                "dry run: allowed without the patch that would have set this"
            );
        }
        Reviewed {
            kind: kind.kind(),
            operation,
            outcome,
            patch: patch.filter(|_| !withheld),
            withheld,
        }
    }

    /// Step 2: the state of the references, read within the review's bounds (none for an
    /// opted-out workload or one over `--max-references`).
    async fn look_up(
        &self,
        subject: &Subject<'_>,
        namespace: &str,
        key: &StampKey,
        budget: &MemoryBudget,
    ) -> Lookup {
        if subject.info.opted_out {
            // Rule 4 needs no lookup.
            return Lookup::Failed;
        }
        if subject.too_many() {
            // Rule 1, terminal: nothing is read.
            tracing::warn!(
                max_references = self.max_references,
                "the workload references more objects than --max-references; nothing is read"
            );
            return Lookup::Failed;
        }
        let refs = &subject.info.refs;
        let resolved = self
            .lookups
            .resolve(
                namespace,
                refs,
                self.lookup_deadline,
                &self.metrics,
                budget,
                self.max_reference_bytes,
            )
            .await;
        match resolved {
            Ok(resolved) => {
                let with_v1 = rules::needs_v1(subject.trigger, subject.current(), key.id());
                resolved.lookup(key, namespace, refs, with_v1, self.max_reference_bytes)
            }
            Err(LookupError::TooLarge { bytes, max }) => {
                tracing::warn!(
                    bytes,
                    max,
                    "the references hold more than --max-reference-bytes; reading stopped, the \
                     template is left as it was"
                );
                Lookup::TooLarge { bytes }
            }
            Err(e) => {
                tracing::warn!(error = %e, "lookup failed; the template is left as it was");
                Lookup::Failed
            }
        }
    }
}

/// What became of one review: what the request handler counts, once, and the patch it answers
/// with.
#[derive(Debug)]
struct Reviewed {
    kind: &'static str,
    operation: &'static str,
    outcome: &'static str,
    patch: Option<Vec<u8>>,
    /// A dry run left a patch out.
    withheld: bool,
}

impl Reviewed {
    fn skipped(kind: &'static str, operation: &'static str) -> Self {
        Reviewed {
            kind,
            operation,
            outcome: Outcome::Skipped.as_str(),
            patch: None,
            withheld: false,
        }
    }
}

/// A workload as a review shows it, and why its stamp is decided.
struct Subject<'r> {
    object: &'r Value,
    kind: WorkloadKind,
    info: Box<workload::WorkloadInfo>,
    trigger: Trigger<'r>,
}

impl Subject<'_> {
    fn current(&self) -> Current<'_> {
        Current {
            stamp: self.info.stamp.as_deref(),
            marker: self.info.marker,
        }
    }

    /// Over `--max-references` (and not opted out): nothing is read, the marker is terminal.
    fn too_many(&self) -> bool {
        !self.info.opted_out && self.info.refs.over_limit()
    }
}

/// What step 1 found in a review.
enum Analysed<'r> {
    Subject(Subject<'r>),
    /// Nothing to stamp: no object, not a workload, unreadable.
    Nothing,
    /// An object of a configured kind with no pod template at its pointer.
    NoTemplate(workload::WorkloadError),
}

/// Step 1: the workload in the review, its references (at most `max_references`) and the trigger.
fn analyse(request: &Request, kind: WorkloadKind, max_references: usize) -> Analysed<'_> {
    let Some(object) = request.object.as_ref().map(|o| &o.0) else {
        tracing::warn!("review without an object; allowed unchanged");
        return Analysed::Nothing;
    };
    let info = match workload::analyze_within(kind, object, max_references) {
        Ok(Analysis::Workload(info)) => info,
        Ok(_) => return Analysed::Nothing,
        Err(e) if !kind.is_built_in() && e.is_no_template() => return Analysed::NoTemplate(e),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the workload; allowed unchanged");
            return Analysed::Nothing;
        }
    };
    let trigger = match (
        request.operation.as_deref(),
        request.old_object.as_ref().map(|o| &o.0),
    ) {
        (Some("UPDATE"), Some(old)) if old.is_object() => {
            let (stamp, marker) = workload::stamp_and_marker(kind, old);
            Trigger::Update {
                old: Current { stamp, marker },
                restart: workload::restarted_at(kind, object) != workload::restarted_at(kind, old),
            }
        }
        _ => Trigger::Create,
    };
    Analysed::Subject(Subject {
        object,
        kind,
        info,
        trigger,
    })
}

/// Step 4: the serialized JSONPatch that gives the workload `stamp` and `marker`, if it changes
/// anything.
fn workload_patch(
    subject: &Subject<'_>,
    stamp: Option<&str>,
    marker: Option<&str>,
) -> Option<Vec<u8>> {
    match patch::build_with_marker(subject.object, subject.kind, stamp, marker) {
        Ok(p) if p.0.is_empty() => None,
        Ok(p) => serde_json::to_vec(&p).ok(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot patch the workload; allowed unchanged");
            None
        }
    }
}

pub use confighash_metrics::{NO_POD_TEMPLATE_OUTCOME, TOO_MANY_REFERENCES_OUTCOME};
/// The longest `request.uid` answered (Kubernetes sends UUIDs, 36 characters).
const MAX_UID_LEN: usize = 128;

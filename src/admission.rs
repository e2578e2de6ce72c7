//! The mutating admission webhook: `POST /mutate` with an `admission.k8s.io/v1` AdmissionReview.
//!
//! The async shell parses and reads references; the decision is the shared stamp rules
//! ([`rules::decide`]) and the patch is [`patch::build`]'s. A well-formed review is always
//! allowed: confighash mutates, it never blocks a deploy.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use base64::Engine;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::key::KeyStore;
use crate::lookup::{self, ConfigSource};
use crate::metrics::Metrics;
use crate::patch;
use crate::rules::{self, Current, Decision, Lookup, Outcome, Trigger};
use crate::workload::{self, Analysis, WorkloadKind};

/// Largest review body accepted: an UPDATE carries two objects of up to 1.5 MiB each, base64
/// and the envelope on top.
pub const MAX_BODY: usize = 7 * 1024 * 1024;

const REVIEW_API_VERSION: &str = "admission.k8s.io/v1";

/// What the webhook needs to answer reviews.
pub struct Webhook {
    pub source: Arc<dyn ConfigSource>,
    pub keys: Arc<KeyStore>,
    pub metrics: Arc<Metrics>,
    /// One deadline for all lookups of a review, well below the webhook's `timeoutSeconds`.
    pub lookup_deadline: Duration,
    pub options: rules::Options,
}

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
    #[serde(default)]
    object: Option<Value>,
    #[serde(default)]
    old_object: Option<Value>,
}

/// A review that cannot be answered: 400 (or 413) with a JSON message.
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
}

impl IntoResponse for BadRequest {
    fn into_response(self) -> Response {
        error_response(self.status, &self.message)
    }
}

fn error_response(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({"error": message}))).into_response()
}

/// The webhook's router: `POST /mutate`; 404 elsewhere, 405 for other methods; a panic in a
/// handler becomes a 500, not a dead task.
pub fn router(webhook: Arc<Webhook>) -> Router {
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
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(|_| {
            error_response(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
        }))
        .with_state(webhook)
}

async fn mutate(
    State(webhook): State<Arc<Webhook>>,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let response = match read_body(&headers, body).await {
        Ok(bytes) => match webhook.answer(&bytes).await {
            Ok(review) => axum::Json(review).into_response(),
            Err(bad) => {
                webhook.metrics.request("", "", "bad-request");
                bad.into_response()
            }
        },
        Err(bad) => {
            webhook.metrics.request("", "", "bad-request");
            bad.into_response()
        }
    };
    webhook
        .metrics
        .observe_latency(started.elapsed().as_secs_f64());
    response
}

async fn read_body(headers: &axum::http::HeaderMap, body: Body) -> Result<Bytes, BadRequest> {
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
    axum::body::to_bytes(body, MAX_BODY).await.map_err(|e| {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(err) = source {
            if err.is::<http_body_util::LengthLimitError>() {
                return too_large();
            }
            source = err.source();
        }
        BadRequest::new(format!("reading the review: {e}"))
    })
}

impl Webhook {
    /// Answers one review body, or says why it is not a review.
    pub async fn answer(&self, body: &[u8]) -> Result<Value, BadRequest> {
        let review: Review = serde_json::from_slice(body)
            .map_err(|e| BadRequest::new(format!("the body is not an AdmissionReview: {e}")))?;
        match review.api_version.as_deref() {
            Some(REVIEW_API_VERSION) => {}
            Some(other) => {
                return Err(BadRequest::new(format!(
                    "unsupported apiVersion {other:?}; confighash serves {REVIEW_API_VERSION}"
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
        let patch = self.decide(&request).await;
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

    /// The serialized JSONPatch to return, if any; counts and logs the decision.
    async fn decide(&self, request: &Request) -> Option<Vec<u8>> {
        let operation: &'static str = match request.operation.as_deref() {
            Some("CREATE") => "CREATE",
            Some("UPDATE") => "UPDATE",
            // DELETE and CONNECT are allowed untouched.
            _ => {
                self.metrics.request("", "other", Outcome::Skipped.as_str());
                return None;
            }
        };
        let Some(kind) = WorkloadKind::from_group_kind(&request.kind.group, &request.kind.kind)
        else {
            self.metrics
                .request("", operation, Outcome::Skipped.as_str());
            return None;
        };
        let label = kind.kind();
        let Some(object) = request.object.as_ref() else {
            tracing::warn!(
                kind = label,
                operation,
                "review without an object; allowed unchanged"
            );
            self.metrics
                .request(label, operation, Outcome::Skipped.as_str());
            return None;
        };
        let namespace = request.namespace.as_deref().unwrap_or("");
        let name = request.name.as_deref().unwrap_or("");
        let info = match workload::analyze(kind, object) {
            Ok(Analysis::Workload(info)) => info,
            Ok(_) => {
                self.metrics
                    .request(label, operation, Outcome::Skipped.as_str());
                return None;
            }
            Err(e) => {
                tracing::warn!(kind = label, namespace, name, error = %e, "cannot read the workload; allowed unchanged");
                self.metrics
                    .request(label, operation, Outcome::Skipped.as_str());
                return None;
            }
        };
        let current = Current {
            stamp: info.stamp.as_deref(),
            marker: info.marker,
        };
        let trigger = match (operation, request.old_object.as_ref()) {
            ("UPDATE", Some(old)) if old.is_object() => {
                let (stamp, marker) = workload::stamp_and_marker(kind, old);
                Trigger::Update {
                    old: Current { stamp, marker },
                    template_unchanged: workload::templates_equal_ignoring_stamp(kind, old, object),
                }
            }
            _ => Trigger::Create,
        };

        let key = self.keys.current();
        let lookup = if info.opted_out {
            // Rule 4 needs no lookup.
            Lookup::Failed
        } else {
            match lookup::resolve(
                self.source.as_ref(),
                namespace,
                &info.refs,
                self.lookup_deadline,
                &self.metrics,
            )
            .await
            .and_then(|resolved| Ok(resolved.lookup(&key, &info.refs)?))
            {
                Ok(lookup) => lookup,
                Err(e) => {
                    tracing::warn!(kind = label, namespace, name, operation, error = %e,
                        "lookup failed; the template is left as it was");
                    Lookup::Failed
                }
            }
        };
        let decision: Decision = rules::decide(
            trigger,
            current,
            info.opted_out,
            &lookup,
            key.id(),
            self.options,
        );
        self.metrics
            .request(label, operation, decision.outcome.as_str());
        tracing::debug!(
            kind = label,
            namespace,
            name,
            operation,
            outcome = decision.outcome.as_str(),
            stamp = decision.stamp.as_deref().unwrap_or(""),
            "decided"
        );
        if !decision.changes(current) {
            return None;
        }
        match patch::build(object, kind, decision.stamp.as_deref(), decision.marker) {
            Ok(p) if p.0.is_empty() => None,
            Ok(p) => serde_json::to_vec(&p).ok(),
            Err(e) => {
                tracing::warn!(kind = label, namespace, name, error = %e, "cannot patch the workload; allowed unchanged");
                None
            }
        }
    }
}

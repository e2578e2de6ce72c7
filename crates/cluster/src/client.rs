//! The Kubernetes client of `confighash serve`, behind a layer that lets no answer through that
//! kube-client or kube-runtime could log.
//!
//! kube-client logs a success body it cannot parse (whole, at WARN), error bodies and the Status
//! they hold (at DEBUG), a Status a delete returns (at TRACE) and a watch's response headers (at
//! TRACE); kube-runtime's watcher logs its errors with `{:?}`, which for a decoding error is serde's
//! message (`invalid type: string "…"`, quoting the value) and for an API error the Status message
//! (which can quote the object a request carried). Any of these can hold Secret data when the API
//! server answers a path with something other than what was asked for. Filtering log targets
//! would hide the libraries' other messages too; instead, [`Sanitize`] sits on top of the client's
//! stack (above authentication, retries and tracing) and rewrites every answer before the library
//! sees it, so that what the library can log holds nothing the API server chose but a status
//! code and a reason word.
//!
//! The rules, and the behaviour of kube each keeps working:
//!
//! - **Error status (400 and above).** The body is replaced by a `Status` holding the HTTP code,
//!   the body's `reason` if it is one of the reasons Kubernetes defines (`NotFound`, `Conflict`,
//!   `Expired`, ...; never free text), and a fixed message. kube builds `Error::Api` from it as
//!   before, so `get_opt` still turns 404 `NotFound` into `None`, conflict handling still sees 409
//!   (`is_conflict`), 403, 422 and 429 keep their code, and the watcher still relists on 410. At
//!   most [`MAX_ERROR_BYTES`] of the body are read, only to find the reason.
//! - **Headers.** Every answer passed on carries a `Content-Type` of its own and nothing else of the
//!   server's (kube logs a watch's headers at TRACE); the layers below (retries honouring
//!   `Retry-After`, authentication) still see the original ones.
//! - **Success body of a request that is not a watch.** Read whole (at most [`MAX_ANSWER_BYTES`];
//!   lists are paged) and parsed with the very type kube will parse it into, chosen from the path:
//!   `configmaps` [`ConfigMap`], `secrets` [`Secret`], `namespaces` [`Namespace`], `leases`
//!   [`Lease`], `events` (core and `events.k8s.io`) the two Event types,
//!   `mutatingwebhookconfigurations` [`MutatingWebhookConfiguration`], the workload kinds
//!   ([`WorkloadKind`]) [`DynamicObject`] of that kind; a path without a name is a list
//!   (`ObjectList<T>`) for GET and DELETE, one object for POST. A DELETE may answer a `Status`
//!   instead (kube checks `kind: Status` first, as here): it is passed on sanitized as above.
//!   Discovery paths (`/api`, `/apis`, `/api/v1`, `/apis/<group>[/<version>]`, `/version`) are
//!   parsed as their discovery types, and any other path that is not a resource must be JSON. A
//!   resource path of a kind not listed (or a subresource, or a metadata-only request) passes
//!   nothing: confighash does not read it, and no rule can say what it may hold. An answer that
//!   does not parse becomes a 500 whose Status says only that it could not be decoded, so kube's
//!   own parse never fails and the caller sees an ordinary API error.
//! - **Watch** (`watch=true`, or `sendInitialEvents`). Passed on line by line as it arrives (not
//!   buffered whole): each line must parse as `WatchEvent<T>`; an `ERROR` event is passed on with
//!   its Status sanitized (the watcher still relists on a 410 event); a line that does not parse,
//!   or one longer than [`MAX_WATCH_LINE_BYTES`], becomes an `ERROR` event with a 500 Status and
//!   ends the stream, so the watcher watches again from the last version it saw and no event is
//!   lost. Blank lines are dropped; a last line cut short by the end of the stream is dropped as
//!   kube does.
//! - **Requests marked [`DecodedByCaller`]** (the webhook's lookups, which read the body
//!   themselves, count it against the review memory budget and never quote it): error answers are
//!   sanitized as above, success bodies pass unread.
//!
//! Transport errors pass through unchanged: they carry no body.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body as HttpBody, Bytes, Frame};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, Namespace, Secret};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    APIGroup, APIGroupList, APIResourceList, APIVersions,
};
use k8s_openapi::apimachinery::pkg::version::Info;
use kube::api::{DynamicObject, ObjectList, WatchEvent};
use kube::client::{Body, ClientBuilder};
use kube::core::Status;
use serde::de::DeserializeOwned;
use tower::{BoxError, Layer, Service};

use confighash_core::workload::WorkloadKind;

/// The largest success body read of a request that is not a watch. The watcher lists 50
/// objects a page.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;
/// The longest watch line (one event): etcd keeps objects up to 1.5 MiB.
pub const MAX_WATCH_LINE_BYTES: usize = 16 * 1024 * 1024;
/// The most of an error body read to find its reason.
pub const MAX_ERROR_BYTES: usize = 1024 * 1024;

/// The message of every error Status passed on.
const WITHHELD: &str =
    "the API server's message was withheld by confighash: it can quote object content";
/// The message of the 500 that replaces an answer that does not parse.
const UNDECODABLE: &str = "the API server's answer could not be decoded as what was asked for and was withheld by confighash";
/// The message of the 500 that replaces an answer larger than the layer reads.
const TOO_LARGE: &str = "the API server's answer was too large and was withheld by confighash";
/// The message of the 500 that replaces the answer to a request for a resource confighash does
/// not read.
const UNKNOWN: &str =
    "confighash does not read this resource; the API server's answer was withheld";

/// The body of every answer the layer passes on.
pub type AnswerBody = UnsyncBoxBody<Bytes, BoxError>;

/// The client `serve` uses: kube's default stack for `config`, under [`SanitizeLayer`].
pub fn build(config: kube::Config) -> Result<kube::Client, kube::Error> {
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&SanitizeLayer)
        .build())
}

/// A request extension: the caller reads the success body itself, bounded, and never quotes it;
/// the layer passes it unread (error answers are still sanitized).
#[derive(Debug, Clone, Copy)]
pub struct DecodedByCaller;

/// Puts [`Sanitize`] on a service.
#[derive(Debug, Clone, Copy, Default)]
pub struct SanitizeLayer;

impl<S> Layer<S> for SanitizeLayer {
    type Service = Sanitize<S>;
    fn layer(&self, inner: S) -> Sanitize<S> {
        Sanitize { inner }
    }
}

/// Rewrites every answer of `inner` by the rules in the [module documentation](self).
#[derive(Debug, Clone)]
pub struct Sanitize<S> {
    inner: S,
}

impl<S, B> Service<Request<Body>> for Sanitize<S>
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: HttpBody<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<AnswerBody>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let expect = Expect::of(&request);
        let what = format!("{} {}", request.method(), request.uri().path());
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await.map_err(Into::into)?;
            sanitize(expect, &what, response).await
        })
    }
}

// ----- what an answer must be -----

/// The types kube parses answers into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    ConfigMap,
    Secret,
    Namespace,
    CoreEvent,
    Event,
    Lease,
    MutatingWebhookConfiguration,
    /// A [`DynamicObject`] of this kind.
    Workload(WorkloadKind),
    ApiResourceList,
    ApiGroupList,
    ApiGroup,
    ApiVersions,
    GroupDiscoveryList,
    VersionInfo,
}

impl Ty {
    /// The type of resource `resource` of API group `group`, if confighash reads it.
    fn of_resource(group: &str, resource: &str) -> Option<Ty> {
        Some(match (group, resource) {
            ("", "configmaps") => Ty::ConfigMap,
            ("", "secrets") => Ty::Secret,
            ("", "namespaces") => Ty::Namespace,
            ("", "events") => Ty::CoreEvent,
            ("events.k8s.io", "events") => Ty::Event,
            ("coordination.k8s.io", "leases") => Ty::Lease,
            ("admissionregistration.k8s.io", "mutatingwebhookconfigurations") => {
                Ty::MutatingWebhookConfiguration
            }
            _ => {
                // kube's plural of a kind: lower case, plus "s".
                let kind = WorkloadKind::ALL.into_iter().find(|k| {
                    k.group() == group && format!("{}s", k.kind().to_ascii_lowercase()) == resource
                })?;
                Ty::Workload(kind)
            }
        })
    }
}

/// How many objects an answer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Object,
    List,
    /// One object, or a Status.
    Deleted,
    /// A list, or a Status.
    DeletedList,
}

/// What the answer to a request must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// The caller reads the body itself ([`DecodedByCaller`]).
    Raw,
    /// Any JSON (a path that is not a resource or discovery).
    Json,
    /// Nothing passes: a resource confighash does not read.
    Unknown,
    Typed(Ty, Shape),
    Watch(Ty),
}

/// A query parameter's value as the API server reads a boolean (Go's `strconv.ParseBool`).
fn is_true(v: &str) -> bool {
    matches!(v, "1" | "t" | "T" | "true" | "TRUE" | "True")
}

impl Expect {
    fn of<B>(request: &Request<B>) -> Expect {
        if request.extensions().get::<DecodedByCaller>().is_some() {
            return Expect::Raw;
        }
        let uri = request.uri();
        let watch = uri.query().unwrap_or("").split('&').any(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (k == "watch" || k == "sendInitialEvents") && is_true(v)
        });
        let accept = request
            .headers()
            .get(ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        // `as=` asks for another representation: only aggregated discovery is read.
        let aggregated = accept.contains("as=APIGroupDiscoveryList");
        let other_form = accept.contains("as=") && !aggregated;
        let segments: Vec<&str> = uri.path().trim_start_matches('/').split('/').collect();
        let discovery = |ty| {
            if other_form {
                Expect::Unknown
            } else {
                Expect::Typed(ty, Shape::Object)
            }
        };
        let (group, rest) = match segments.as_slice() {
            ["version"] => return discovery(Ty::VersionInfo),
            ["api"] | ["apis"] if aggregated => return discovery(Ty::GroupDiscoveryList),
            ["api"] => return discovery(Ty::ApiVersions),
            ["apis"] => return discovery(Ty::ApiGroupList),
            ["api", _] | ["apis", _, _] => return discovery(Ty::ApiResourceList),
            ["apis", _] => return discovery(Ty::ApiGroup),
            ["api", _, rest @ ..] => ("", rest),
            ["apis", group, _, rest @ ..] => (*group, rest),
            _ => {
                return if other_form {
                    Expect::Unknown
                } else {
                    Expect::Json
                };
            }
        };
        // [namespaces, ns,] resource [, name [, subresource ...]]
        let (resource, tail) = match rest {
            ["namespaces", _, resource, tail @ ..] => (*resource, tail),
            [resource, tail @ ..] => (*resource, tail),
            [] => return Expect::Unknown,
        };
        let Some(ty) = Ty::of_resource(group, resource) else {
            return Expect::Unknown;
        };
        if other_form || tail.len() > 1 || tail.iter().any(|s| s.is_empty()) {
            // A metadata-only form, a subresource, or an empty name.
            return Expect::Unknown;
        }
        if watch {
            return Expect::Watch(ty);
        }
        let named = tail.len() == 1;
        let shape = match (request.method(), named) {
            (&Method::DELETE, true) => Shape::Deleted,
            (&Method::DELETE, false) => Shape::DeletedList,
            (&Method::GET, false) => Shape::List,
            _ => Shape::Object,
        };
        Expect::Typed(ty, shape)
    }
}

// ----- checking bodies -----

/// A type kube parses answers into.
trait Expected: DeserializeOwned + Clone {}

macro_rules! expected {
    ($($t:ty),*) => { $(impl Expected for $t {})* };
}
expected!(
    ConfigMap,
    Secret,
    Namespace,
    CoreEvent,
    Event,
    Lease,
    MutatingWebhookConfiguration,
    DynamicObject,
    APIResourceList,
    APIGroupList,
    APIGroup,
    APIVersions,
    Info,
    kube::client::APIGroupDiscoveryList
);

/// k8s-openapi's types refuse another `kind` while parsing, but [`DynamicObject`] takes any
/// object: a workload answer's objects are checked for their `kind` (when they name one) here.
mod kinds {
    use serde::Deserialize;

    #[derive(Deserialize)]
    struct Kinded {
        kind: Option<String>,
    }

    #[derive(Deserialize)]
    struct KindedList {
        items: Option<Vec<Kinded>>,
    }

    #[derive(Deserialize)]
    struct KindedEvent {
        object: Option<Kinded>,
    }

    fn is(k: &Kinded, kind: &str) -> bool {
        k.kind.as_deref().is_none_or(|k| k == kind)
    }

    pub fn object(body: &[u8], kind: &str) -> bool {
        serde_json::from_slice::<Kinded>(body).is_ok_and(|k| is(&k, kind))
    }

    pub fn list(body: &[u8], kind: &str) -> bool {
        serde_json::from_slice::<KindedList>(body)
            .is_ok_and(|l| l.items.iter().flatten().all(|k| is(k, kind)))
    }

    pub fn event(line: &[u8], kind: &str) -> bool {
        serde_json::from_slice::<KindedEvent>(line)
            .is_ok_and(|e| e.object.as_ref().is_none_or(|k| is(k, kind)))
    }
}

/// The kind a workload answer's objects must be, if `ty` is a workload.
fn workload_kind(ty: Ty) -> Option<&'static str> {
    match ty {
        Ty::Workload(kind) => Some(kind.kind()),
        _ => None,
    }
}

/// What becomes of a body.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Passed on as it is.
    Pass,
    /// Replaced by this sanitized Status.
    Status(Vec<u8>),
    /// Replaced by a 500.
    Undecodable,
}

/// What becomes of a watch line.
#[derive(Debug, PartialEq, Eq)]
enum LineVerdict {
    Pass,
    /// An ERROR event, sanitized.
    Error(Vec<u8>),
    Undecodable,
}

fn check_as<T: Expected>(ty: Ty, shape: Shape, body: &[u8]) -> Verdict {
    let kind = workload_kind(ty);
    let object = |body: &[u8]| {
        serde_json::from_slice::<T>(body).is_ok()
            && kind.is_none_or(|kind| kinds::object(body, kind))
    };
    let list = |body: &[u8]| {
        serde_json::from_slice::<ObjectList<T>>(body).is_ok()
            && kind.is_none_or(|kind| kinds::list(body, kind))
    };
    let ok = |fits: bool| {
        if fits {
            Verdict::Pass
        } else {
            Verdict::Undecodable
        }
    };
    match shape {
        Shape::Object => ok(object(body)),
        Shape::List => ok(list(body)),
        Shape::Deleted | Shape::DeletedList => {
            // As kube's `request_status`: a Status if `kind` says so, else the object or list.
            #[derive(serde::Deserialize)]
            struct KindOnly {
                kind: Option<serde_json::Value>,
            }
            let is_status = serde_json::from_slice::<KindOnly>(body)
                .is_ok_and(|k| k.kind.is_some_and(|k| k == "Status"));
            if is_status {
                match serde_json::from_slice::<Status>(body) {
                    Ok(status) => Verdict::Status(sanitized_status(&status, 200)),
                    Err(_) => Verdict::Undecodable,
                }
            } else if shape == Shape::Deleted {
                ok(object(body))
            } else {
                ok(list(body))
            }
        }
    }
}

fn check(ty: Ty, shape: Shape, body: &[u8]) -> Verdict {
    match ty {
        Ty::ConfigMap => check_as::<ConfigMap>(ty, shape, body),
        Ty::Secret => check_as::<Secret>(ty, shape, body),
        Ty::Namespace => check_as::<Namespace>(ty, shape, body),
        Ty::CoreEvent => check_as::<CoreEvent>(ty, shape, body),
        Ty::Event => check_as::<Event>(ty, shape, body),
        Ty::Lease => check_as::<Lease>(ty, shape, body),
        Ty::MutatingWebhookConfiguration => {
            check_as::<MutatingWebhookConfiguration>(ty, shape, body)
        }
        Ty::Workload(_) => check_as::<DynamicObject>(ty, shape, body),
        Ty::ApiResourceList => check_as::<APIResourceList>(ty, shape, body),
        Ty::ApiGroupList => check_as::<APIGroupList>(ty, shape, body),
        Ty::ApiGroup => check_as::<APIGroup>(ty, shape, body),
        Ty::ApiVersions => check_as::<APIVersions>(ty, shape, body),
        Ty::GroupDiscoveryList => check_as::<kube::client::APIGroupDiscoveryList>(ty, shape, body),
        Ty::VersionInfo => check_as::<Info>(ty, shape, body),
    }
}

fn check_event_as<T: Expected>(ty: Ty, line: &[u8]) -> LineVerdict {
    match serde_json::from_slice::<WatchEvent<T>>(line) {
        Ok(WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Deleted(_)) => {
            if workload_kind(ty).is_none_or(|kind| kinds::event(line, kind)) {
                LineVerdict::Pass
            } else {
                LineVerdict::Undecodable
            }
        }
        Ok(WatchEvent::Bookmark(_)) => LineVerdict::Pass,
        Ok(WatchEvent::Error(status)) => LineVerdict::Error(error_event(&sanitized_status(
            &status,
            StatusCode::INTERNAL_SERVER_ERROR.as_u16(),
        ))),
        Err(_) => LineVerdict::Undecodable,
    }
}

fn check_event(ty: Ty, line: &[u8]) -> LineVerdict {
    match ty {
        Ty::ConfigMap => check_event_as::<ConfigMap>(ty, line),
        Ty::Secret => check_event_as::<Secret>(ty, line),
        Ty::Namespace => check_event_as::<Namespace>(ty, line),
        Ty::CoreEvent => check_event_as::<CoreEvent>(ty, line),
        Ty::Event => check_event_as::<Event>(ty, line),
        Ty::Lease => check_event_as::<Lease>(ty, line),
        Ty::MutatingWebhookConfiguration => {
            check_event_as::<MutatingWebhookConfiguration>(ty, line)
        }
        Ty::Workload(_) => check_event_as::<DynamicObject>(ty, line),
        // Discovery is not watched.
        _ => LineVerdict::Undecodable,
    }
}

// ----- sanitized Status -----

/// `reason` if it is one Kubernetes defines: a word, never free text.
fn known_reason(reason: &str) -> &str {
    if kube::core::response::reason::is_known(reason) {
        reason
    } else {
        ""
    }
}

/// A Status JSON with `code`, `reason` if known, and `message`; `success` for a Status a delete
/// answers with `status: Success`.
fn status_json(code: u16, reason: &str, message: &str, success: bool) -> Vec<u8> {
    let status = Status {
        status: Some(if success {
            kube::core::response::StatusSummary::Success
        } else {
            kube::core::response::StatusSummary::Failure
        }),
        code,
        message: message.to_owned(),
        metadata: Some(Default::default()),
        reason: known_reason(reason).to_owned(),
        details: None,
    };
    let mut value = serde_json::to_value(&status).unwrap_or_default();
    if let Some(map) = value.as_object_mut() {
        map.insert("kind".into(), "Status".into());
        map.insert("apiVersion".into(), "v1".into());
    }
    serde_json::to_vec(&value).unwrap_or_default()
}

/// `status` with its code (or `fallback` when it has none in range), a known reason and the
/// fixed message.
fn sanitized_status(status: &Status, fallback: u16) -> Vec<u8> {
    let code = if (100..=599).contains(&status.code) {
        status.code
    } else {
        fallback
    };
    status_json(code, &status.reason, WITHHELD, status.is_success())
}

/// A watch ERROR event line holding `status` (JSON), newline included.
fn error_event(status: &[u8]) -> Vec<u8> {
    let mut line = Vec::with_capacity(status.len() + 32);
    line.extend_from_slice(br#"{"type":"ERROR","object":"#);
    line.extend_from_slice(status);
    line.extend_from_slice(b"}\n");
    line
}

fn undecodable_event() -> Vec<u8> {
    error_event(&status_json(500, "InternalError", UNDECODABLE, false))
}

// ----- answers -----

fn answer(status: StatusCode, body: AnswerBody) -> Response<AnswerBody> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn full(bytes: impl Into<Bytes>) -> AnswerBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

fn withheld(message: &str) -> Response<AnswerBody> {
    answer(
        StatusCode::INTERNAL_SERVER_ERROR,
        full(status_json(500, "InternalError", message, false)),
    )
}

/// The reason of an error body, if it is a JSON object with one, read up to [`MAX_ERROR_BYTES`].
async fn error_reason<B>(body: B) -> String
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    #[derive(serde::Deserialize)]
    struct ReasonOnly {
        reason: Option<String>,
    }
    let Ok(collected) = Limited::new(body, MAX_ERROR_BYTES).collect().await else {
        return String::new();
    };
    serde_json::from_slice::<ReasonOnly>(&collected.to_bytes())
        .ok()
        .and_then(|r| r.reason)
        .map(|r| known_reason(&r).to_owned())
        .unwrap_or_default()
}

async fn sanitize<B>(
    expect: Expect,
    what: &str,
    response: Response<B>,
) -> Result<Response<AnswerBody>, BoxError>
where
    B: HttpBody<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    let status = response.status();
    if status.as_u16() >= 400 {
        let reason = error_reason(response.into_body()).await;
        tracing::debug!(
            request = what,
            status = status.as_u16(),
            reason,
            "the API server answered with an error; its message is withheld"
        );
        let body = status_json(status.as_u16(), &reason, WITHHELD, false);
        return Ok(answer(status, full(body)));
    }
    match expect {
        Expect::Raw => {
            let length = response.headers().get(CONTENT_LENGTH).cloned();
            let mut passed = answer(
                status,
                response.into_body().map_err(Into::into).boxed_unsync(),
            );
            if let Some(length) = length {
                passed.headers_mut().insert(CONTENT_LENGTH, length);
            }
            Ok(passed)
        }
        Expect::Watch(ty) => Ok(answer(
            status,
            WatchLines::new(response.into_body(), ty).boxed_unsync(),
        )),
        Expect::Unknown => {
            tracing::warn!(
                request = what,
                "confighash does not read this resource; the answer is withheld"
            );
            Ok(withheld(UNKNOWN))
        }
        Expect::Json | Expect::Typed(..) => {
            let declared = response
                .headers()
                .get(CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            if declared.is_some_and(|n| n > MAX_ANSWER_BYTES as u64) {
                tracing::warn!(request = what, "the answer is too large; withheld");
                return Ok(withheld(TOO_LARGE));
            }
            let body = match Limited::new(response.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await
            {
                Ok(collected) => collected.to_bytes(),
                Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                    tracing::warn!(request = what, "the answer is too large; withheld");
                    return Ok(withheld(TOO_LARGE));
                }
                Err(e) => return Err(e),
            };
            let verdict = match expect {
                Expect::Typed(ty, shape) => check(ty, shape, &body),
                _ if serde_json::from_slice::<serde::de::IgnoredAny>(&body).is_ok() => {
                    Verdict::Pass
                }
                _ => Verdict::Undecodable,
            };
            Ok(match verdict {
                Verdict::Pass => answer(status, full(body)),
                Verdict::Status(sanitized) => answer(status, full(sanitized)),
                Verdict::Undecodable => {
                    tracing::warn!(
                        request = what,
                        expected = ?expect,
                        "the answer does not decode as what was asked for; withheld"
                    );
                    withheld(UNDECODABLE)
                }
            })
        }
    }
}

// ----- watch streams -----

/// A watch body passed on line by line; see the module documentation.
struct WatchLines<B> {
    /// `None` once the stream has ended, or been ended.
    inner: Option<B>,
    ty: Ty,
    /// The line being received.
    partial: Vec<u8>,
    /// Lines checked and not yet passed on.
    ready: VecDeque<Bytes>,
}

impl<B> WatchLines<B> {
    fn new(inner: B, ty: Ty) -> Self {
        WatchLines {
            inner: Some(inner),
            ty,
            partial: Vec::new(),
            ready: VecDeque::new(),
        }
    }

    /// Ends the stream after what is ready and a 500 ERROR event.
    fn fail(&mut self) {
        self.ready.push_back(Bytes::from(undecodable_event()));
        self.inner = None;
        self.partial = Vec::new();
    }

    /// Checks one complete line (without its newline); false when the stream must end.
    fn line(&mut self, mut line: &[u8]) -> bool {
        if let [rest @ .., b'\r'] = line {
            line = rest;
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            return true;
        }
        match check_event(self.ty, line) {
            LineVerdict::Pass => {
                let mut out = Vec::with_capacity(line.len() + 1);
                out.extend_from_slice(line);
                out.push(b'\n');
                self.ready.push_back(Bytes::from(out));
                true
            }
            LineVerdict::Error(event) => {
                self.ready.push_back(Bytes::from(event));
                true
            }
            LineVerdict::Undecodable => {
                tracing::warn!(
                    expected = ?self.ty,
                    "a watch event does not decode as what was asked for; withheld, and the watch ended"
                );
                self.fail();
                false
            }
        }
    }

    fn receive(&mut self, mut data: &[u8]) {
        while let Some(at) = data.iter().position(|&b| b == b'\n') {
            let ok = if self.partial.is_empty() {
                self.line(&data[..at])
            } else {
                self.partial.extend_from_slice(&data[..at]);
                let line = std::mem::take(&mut self.partial);
                self.line(&line)
            };
            if !ok {
                return;
            }
            data = &data[at + 1..];
        }
        if self.partial.len() + data.len() > MAX_WATCH_LINE_BYTES {
            tracing::warn!(
                expected = ?self.ty,
                max = MAX_WATCH_LINE_BYTES,
                "a watch event is too long; withheld, and the watch ended"
            );
            self.fail();
            return;
        }
        self.partial.extend_from_slice(data);
    }

    /// The stream ended: a last line without its newline passes if it parses; one cut short
    /// is dropped, as kube does.
    fn end(&mut self) {
        self.inner = None;
        let last = std::mem::take(&mut self.partial);
        if last.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        match serde_json::from_slice::<serde::de::IgnoredAny>(&last) {
            Err(e) if e.is_eof() => {}
            _ => {
                self.line(&last);
            }
        }
    }
}

impl<B> HttpBody for WatchLines<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if let Some(line) = this.ready.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(line))));
            }
            let Some(inner) = this.inner.as_mut() else {
                return Poll::Ready(None);
            };
            match Pin::new(inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => this.end(),
                Poll::Ready(Some(Err(e))) => {
                    // A transport error: it carries no body. What was cut short is dropped.
                    this.inner = None;
                    this.partial = Vec::new();
                    return Poll::Ready(Some(Err(e.into())));
                }
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        this.receive(&data);
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_none() && self.ready.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::{Arc, Mutex};

    use base64::Engine;
    use futures::StreamExt;
    use http_body_util::StreamBody;
    use kube::Api;
    use kube::api::{ListParams, PostParams};
    use kube::runtime::watcher;
    use serde_json::{Value, json};

    use super::*;

    const CANARY: &str = "c4n4ry-7Hq2x";

    fn canary_b64() -> String {
        base64::engine::general_purpose::STANDARD.encode(CANARY)
    }

    /// Log lines written while the returned guard lives, every level and target.
    fn capture() -> (Arc<Mutex<Vec<u8>>>, tracing::subscriber::DefaultGuard) {
        #[derive(Clone)]
        struct Sink(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Sink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = Sink(buf.clone());
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(move || sink.clone())
            .finish();
        (buf, tracing::subscriber::set_default(subscriber))
    }

    fn assert_clean(what: &str, text: &str) {
        for needle in [CANARY.to_owned(), canary_b64()] {
            assert!(!text.contains(&needle), "{what} holds the canary:\n{text}");
        }
    }

    fn reply(status: u16, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
        let mut r = Response::new(Full::new(body.into()));
        *r.status_mut() = StatusCode::from_u16(status).unwrap();
        r.headers_mut()
            .insert("x-leak", HeaderValue::from_static("c4n4ry-7Hq2x"));
        r
    }

    /// A kube client whose API server is `answer` (method, path and query -> status, body).
    fn client(
        answer: impl Fn(&Method, &str) -> (u16, String) + Send + Sync + Clone + 'static,
    ) -> kube::Client {
        let service = tower::service_fn(move |req: Request<Body>| {
            let answer = answer.clone();
            async move {
                let target = req
                    .uri()
                    .path_and_query()
                    .map(|p| p.as_str().to_owned())
                    .unwrap_or_default();
                let (status, body) = answer(req.method(), &target);
                Ok::<_, Infallible>(reply(status, body))
            }
        });
        kube::Client::new(SanitizeLayer.layer(service), "default")
    }

    async fn through(
        request: Request<Body>,
        status: u16,
        body: &'static str,
    ) -> (StatusCode, Value) {
        let mut svc =
            SanitizeLayer.layer(tower::service_fn(move |_req: Request<Body>| async move {
                Ok::<_, Infallible>(reply(status, body))
            }));
        let response = svc.call(request).await.unwrap();
        let status = response.status();
        assert!(
            response.headers().get("x-leak").is_none(),
            "the server's headers are not passed on"
        );
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    fn get(uri: &str) -> Request<Body> {
        Request::get(uri).body(Body::empty()).unwrap()
    }

    #[test]
    fn the_path_says_what_an_answer_must_be() {
        let at = |method: &str, uri: &str| {
            Expect::of(&Request::builder().method(method).uri(uri).body(()).unwrap())
        };
        use Expect::*;
        use Shape::*;
        let cases = [
            (
                "GET",
                "/api/v1/namespaces/a/configmaps/b",
                Typed(Ty::ConfigMap, Object),
            ),
            (
                "GET",
                "/api/v1/namespaces/a/secrets?limit=50",
                Typed(Ty::Secret, List),
            ),
            (
                "GET",
                "/api/v1/secrets?fieldSelector=x&limit=5",
                Typed(Ty::Secret, List),
            ),
            (
                "POST",
                "/api/v1/namespaces/a/secrets?",
                Typed(Ty::Secret, Object),
            ),
            (
                "PUT",
                "/api/v1/namespaces/a/secrets/k?",
                Typed(Ty::Secret, Object),
            ),
            (
                "DELETE",
                "/api/v1/namespaces/a/secrets/k",
                Typed(Ty::Secret, Deleted),
            ),
            (
                "DELETE",
                "/api/v1/namespaces/a/secrets",
                Typed(Ty::Secret, DeletedList),
            ),
            ("GET", "/api/v1/namespaces", Typed(Ty::Namespace, List)),
            (
                "GET",
                "/api/v1/namespaces/shop",
                Typed(Ty::Namespace, Object),
            ),
            (
                "GET",
                "/api/v1/namespaces?&watch=true&resourceVersion=1",
                Watch(Ty::Namespace),
            ),
            ("GET", "/api/v1/configmaps?watch=1", Watch(Ty::ConfigMap)),
            (
                "GET",
                "/api/v1/configmaps?sendInitialEvents=true&watch=true",
                Watch(Ty::ConfigMap),
            ),
            (
                "GET",
                "/api/v1/configmaps?watch=false",
                Typed(Ty::ConfigMap, List),
            ),
            (
                "POST",
                "/api/v1/namespaces/a/events",
                Typed(Ty::CoreEvent, Object),
            ),
            (
                "PATCH",
                "/apis/events.k8s.io/v1/namespaces/a/events/e",
                Typed(Ty::Event, Object),
            ),
            (
                "GET",
                "/apis/coordination.k8s.io/v1/namespaces/a/leases/l",
                Typed(Ty::Lease, Object),
            ),
            (
                "PATCH",
                "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/c?",
                Typed(Ty::MutatingWebhookConfiguration, Object),
            ),
            (
                "PATCH",
                "/apis/apps/v1/namespaces/a/deployments/web?fieldManager=confighash",
                Typed(Ty::Workload(WorkloadKind::Deployment), Object),
            ),
            (
                "GET",
                "/apis/batch/v1/cronjobs?limit=50",
                Typed(Ty::Workload(WorkloadKind::CronJob), List),
            ),
            (
                "GET",
                "/apis/argoproj.io/v1alpha1/rollouts?watch=true",
                Watch(Ty::Workload(WorkloadKind::Rollout)),
            ),
            (
                "GET",
                "/apis/apps/v1/statefulsets",
                Typed(Ty::Workload(WorkloadKind::StatefulSet), List),
            ),
            (
                "GET",
                "/apis/apps/v1/daemonsets",
                Typed(Ty::Workload(WorkloadKind::DaemonSet), List),
            ),
            ("GET", "/apis/apps/v1", Typed(Ty::ApiResourceList, Object)),
            ("GET", "/api/v1", Typed(Ty::ApiResourceList, Object)),
            ("GET", "/api", Typed(Ty::ApiVersions, Object)),
            ("GET", "/apis", Typed(Ty::ApiGroupList, Object)),
            ("GET", "/apis/apps", Typed(Ty::ApiGroup, Object)),
            ("GET", "/version", Typed(Ty::VersionInfo, Object)),
            ("GET", "/healthz", Json),
            // Nothing confighash reads: no rule says what the answer may hold.
            ("GET", "/api/v1/namespaces/a/pods", Unknown),
            ("GET", "/apis/batch/v1/namespaces/a/jobs", Unknown),
            (
                "GET",
                "/apis/apps/v1/namespaces/a/deployments/web/scale",
                Unknown,
            ),
            ("GET", "/api/v1/namespaces/a/status", Unknown),
            ("GET", "/api/v1/namespaces/a/secrets/", Unknown),
            ("GET", "/apis/rbac.authorization.k8s.io/v1/roles", Unknown),
        ];
        for (method, uri, expected) in cases {
            assert_eq!(at(method, uri), expected, "{method} {uri}");
        }
        // Another representation (metadata only) is not read; aggregated discovery is.
        let metadata = Request::get("/api/v1/secrets")
            .header(
                ACCEPT,
                "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
            )
            .body(())
            .unwrap();
        assert_eq!(Expect::of(&metadata), Unknown);
        let aggregated = Request::get("/apis")
            .header(
                ACCEPT,
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            )
            .body(())
            .unwrap();
        assert_eq!(
            Expect::of(&aggregated),
            Typed(Ty::GroupDiscoveryList, Object)
        );
        let mut raw = Request::get("/api/v1/namespaces/a/secrets/b")
            .body(())
            .unwrap();
        raw.extensions_mut().insert(DecodedByCaller);
        assert_eq!(Expect::of(&raw), Raw);
    }

    #[tokio::test]
    async fn error_bodies_keep_the_code_and_a_known_reason_only() {
        let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"secret c4n4ry-7Hq2x is invalid","reason":"NotFound","details":{"name":"c4n4ry-7Hq2x","causes":[{"message":"c4n4ry-7Hq2x"}]},"code":404}"#;
        let (status, json) = through(get("/api/v1/namespaces/a/secrets/b"), 404, body).await;
        assert_eq!(status, 404);
        assert_eq!(json["code"], 404);
        assert_eq!(json["reason"], "NotFound");
        assert_eq!(json["kind"], "Status");
        assert_clean("the Status", &json.to_string());

        // A reason that is not one Kubernetes defines is dropped, even a plain word.
        let body = r#"{"kind":"Status","message":"x","reason":"Hunter","code":403}"#;
        let (status, json) = through(get("/api/v1/secrets"), 403, body).await;
        assert_eq!((status.as_u16(), &json["reason"]), (403, &Value::Null));

        // Plain text, HTML, a JSON of another shape: the code stays.
        for body in [
            "c4n4ry-7Hq2x",
            "<html><b>c4n4ry-7Hq2x</b></html>",
            "[\"c4n4ry-7Hq2x\"]",
        ] {
            let (status, json) = through(get("/api/v1/secrets"), 500, body).await;
            assert_eq!(status, 500);
            assert_eq!(json["code"], 500);
            assert_clean("the Status", &json.to_string());
        }
    }

    #[tokio::test]
    async fn success_bodies_must_parse_as_what_kube_will_parse_them_into() {
        let secret =
            r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"b"},"data":{"k":"YWJj"}}"#;
        let (status, json) = through(get("/api/v1/namespaces/a/secrets/b"), 200, secret).await;
        assert_eq!(status, 200);
        assert_eq!(json["data"]["k"], "YWJj", "a good answer passes unchanged");

        let undecodable = [
            // Asked for a ConfigMap, answered a Secret.
            ("/api/v1/namespaces/a/configmaps/b", secret),
            (
                "/api/v1/namespaces/a/secrets/b",
                r#"{"kind":"Secret","data":"c4n4ry-7Hq2x"}"#,
            ),
            (
                "/api/v1/namespaces/a/secrets/b",
                r#"{"kind":"Secret","data":{"k":"c4n4ry-7Hq2x!"}}"#,
            ),
            (
                "/api/v1/namespaces/a/secrets/b",
                r#"{"kind":"Secret","data":{"k":1,"l":"YzRuNHJ5LTdIcTJ4"}}"#,
            ),
            (
                "/api/v1/namespaces/a/secrets/b",
                r#"{"kind":"Secret","data":{"k":"YzRu"#,
            ),
            ("/api/v1/namespaces/a/secrets/b", "c4n4ry-7Hq2x"),
            (
                "/api/v1/namespaces/a/secrets",
                r#"{"kind":"SecretList","items":"c4n4ry-7Hq2x"}"#,
            ),
            // A list where one object was asked for.
            (
                "/api/v1/namespaces/a/secrets/b",
                r#"{"kind":"SecretList","metadata":{},"items":[]}"#,
            ),
            (
                "/apis/apps/v1/namespaces/a/deployments/web",
                r#"{"kind":"Secret","metadata":{},"data":{"k":"YzRuNHJ5LTdIcTJ4"}}"#,
            ),
            (
                "/apis/apps/v1/deployments",
                r#"{"kind":"List","metadata":{"resourceVersion":"1"},"items":[{"kind":"Secret","metadata":{}}]}"#,
            ),
            (
                "/apis/apps/v1",
                r#"{"kind":"APIResourceList","groupVersion":"apps/v1","resources":"c4n4ry-7Hq2x"}"#,
            ),
            ("/healthz", "c4n4ry-7Hq2x"),
            (
                "/api/v1/namespaces/a/pods",
                r#"{"kind":"PodList","items":[]}"#,
            ),
        ];
        for (path, body) in undecodable {
            let (status, json) = through(get(path), 200, body).await;
            assert_eq!(status, 500, "{path} {body}");
            assert_eq!(json["code"], 500);
            assert_clean("the Status", &json.to_string());
        }

        let (status, _) = through(get("/apis/apps/v1/deployments"), 200,
            r#"{"kind":"DeploymentList","metadata":{"resourceVersion":"1"},"items":[{"metadata":{"name":"web"},"spec":{}}]}"#).await;
        assert_eq!(
            status, 200,
            "items without a kind are taken as the kind listed"
        );

        // A delete may answer a Status: passed on sanitized, with its summary and code.
        let delete = Request::delete("/api/v1/namespaces/a/secrets/b")
            .body(Body::empty())
            .unwrap();
        let (status, json) = through(delete, 200,
            r#"{"kind":"Status","apiVersion":"v1","status":"Success","code":200,"message":"c4n4ry-7Hq2x","details":{"name":"c4n4ry-7Hq2x"}}"#).await;
        assert_eq!(status, 200);
        assert_eq!(
            (json["status"].as_str(), json["code"].as_u64()),
            (Some("Success"), Some(200))
        );
        assert_clean("the Status", &json.to_string());
    }

    #[tokio::test]
    async fn the_caller_that_decodes_gets_the_body_unread_but_errors_sanitized() {
        let mut request = get("/api/v1/namespaces/a/secrets/b");
        request.extensions_mut().insert(DecodedByCaller);
        let mut svc = SanitizeLayer.layer(tower::service_fn(|_req: Request<Body>| async {
            Ok::<_, Infallible>(reply(200, "not JSON"))
        }));
        let response = svc.call(request).await.unwrap();
        assert_eq!(response.status(), 200);
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"not JSON");

        let mut request = get("/api/v1/namespaces/a/secrets/b");
        request.extensions_mut().insert(DecodedByCaller);
        let (status, json) = {
            let mut svc = SanitizeLayer.layer(tower::service_fn(|_req: Request<Body>| async {
                Ok::<_, Infallible>(reply(
                    403,
                    r#"{"message":"c4n4ry-7Hq2x","reason":"Forbidden"}"#,
                ))
            }));
            let response = svc.call(request).await.unwrap();
            let status = response.status();
            let bytes = response.into_body().collect().await.unwrap().to_bytes();
            (status, serde_json::from_slice::<Value>(&bytes).unwrap())
        };
        assert_eq!(
            (status.as_u16(), json["reason"].as_str()),
            (403, Some("Forbidden"))
        );
        assert_clean("the Status", &json.to_string());
    }

    #[tokio::test]
    async fn bodies_larger_than_the_bound_are_withheld() {
        let big = Bytes::from(vec![b' '; MAX_ANSWER_BYTES + 1]);
        let mut svc = SanitizeLayer.layer(tower::service_fn(move |_req: Request<Body>| {
            let big = big.clone();
            async move {
                // Sent in pieces, with no length declared.
                let chunks: Vec<Result<Frame<Bytes>, Infallible>> = big
                    .chunks(1 << 20)
                    .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
                    .collect();
                Ok::<_, Infallible>(Response::new(StreamBody::new(futures::stream::iter(
                    chunks,
                ))))
            }
        }));
        let response = svc.call(get("/api/v1/secrets")).await.unwrap();
        assert_eq!(response.status(), 500);
    }

    /// The lines `input` (sent in pieces of `piece` bytes) becomes through a watch of `path`.
    async fn watch_lines(path: &str, input: &[u8], piece: usize) -> Vec<String> {
        let input = Bytes::copy_from_slice(input);
        let mut svc = SanitizeLayer.layer(tower::service_fn(move |_req: Request<Body>| {
            let input = input.clone();
            async move {
                let chunks: Vec<Result<Frame<Bytes>, Infallible>> = input
                    .chunks(piece)
                    .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
                    .collect();
                Ok::<_, Infallible>(Response::new(StreamBody::new(futures::stream::iter(
                    chunks,
                ))))
            }
        }));
        let response = svc.call(get(path)).await.unwrap();
        assert_eq!(response.status(), 200);
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        assert!(text.is_empty() || text.ends_with('\n'), "{text}");
        text.lines().map(str::to_owned).collect()
    }

    #[tokio::test]
    async fn watch_lines_are_checked_one_by_one() {
        let good = r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","resourceVersion":"2"},"data":{"k":"YWJj"}}}"#;
        let bookmark = r#"{"type":"BOOKMARK","object":{"kind":"Secret","apiVersion":"v1","metadata":{"resourceVersion":"3"}}}"#;
        let error = r#"{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired","message":"c4n4ry-7Hq2x"}}"#;
        let input = format!("{good}\r\n\n{bookmark}\n{error}\n{good}\n");
        for piece in [1, 7, 4096] {
            let lines = watch_lines("/api/v1/secrets?watch=true", input.as_bytes(), piece).await;
            assert_eq!(lines.len(), 4, "{lines:?}");
            assert_eq!(lines[0], good);
            assert_eq!(lines[1], bookmark);
            let event: Value = serde_json::from_str(&lines[2]).unwrap();
            assert_eq!(event["type"], "ERROR");
            assert_eq!(event["object"]["code"], 410, "the watcher still relists");
            assert_eq!(event["object"]["reason"], "Expired");
            assert_clean("the ERROR event", &lines[2]);
            assert_eq!(lines[3], good);
        }

        // A line that does not parse, an object of another kind or a mistyped one ends the watch
        // with a 500 ERROR event; nothing after it passes.
        for bad in [
            "c4n4ry-7Hq2x".to_owned(),
            r#"{"type":"ADDED","object":{"kind":"ConfigMap","data":{"k":"c4n4ry-7Hq2x"}}}"#
                .to_owned(),
            r#"{"type":"MODIFIED","object":{"kind":"Secret","data":"c4n4ry-7Hq2x"}}"#.to_owned(),
            r#"{"type":"c4n4ry-7Hq2x","object":{}}"#.to_owned(),
            r#"{"kind":"Status","code":410,"message":"c4n4ry-7Hq2x"}"#.to_owned(),
        ] {
            let input = format!("{good}\n{bad}\n{good}\n");
            let lines = watch_lines("/api/v1/secrets?watch=true", input.as_bytes(), 5).await;
            assert_eq!(lines.len(), 2, "{bad}: {lines:?}");
            assert_eq!(lines[0], good);
            let event: Value = serde_json::from_str(&lines[1]).unwrap();
            assert_eq!(
                (event["type"].as_str(), event["object"]["code"].as_u64()),
                (Some("ERROR"), Some(500))
            );
            assert_clean("the stream", &lines.join("\n"));
        }

        // A workload watch takes objects of its own kind only.
        let other = r#"{"type":"ADDED","object":{"kind":"Secret","metadata":{"name":"s","resourceVersion":"1"},"data":{"k":"YzRuNHJ5LTdIcTJ4"}}}"#;
        let lines = watch_lines(
            "/apis/apps/v1/deployments?watch=true",
            format!("{other}\n").as_bytes(),
            64,
        )
        .await;
        assert_eq!(lines.len(), 1);
        assert_clean("the stream", &lines[0]);

        // A last line cut short by the end of the stream is dropped, as kube drops it.
        let lines = watch_lines(
            "/api/v1/secrets?watch=true",
            format!("{good}\n{{\"type\":\"ADDED\",\"object\":{{\"data\":{{\"k\":\"YzRu").as_bytes(),
            3,
        )
        .await;
        assert_eq!(lines, vec![good.to_owned()]);
        // A last line without its newline that parses passes.
        let lines = watch_lines("/api/v1/secrets?watch=true", good.as_bytes(), 3).await;
        assert_eq!(lines, vec![good.to_owned()]);
    }

    #[tokio::test]
    async fn a_watch_line_longer_than_the_bound_ends_the_watch() {
        let mut input = br#"{"type":"ADDED","object":{"kind":"Secret","data":{"k":""#.to_vec();
        input.resize(MAX_WATCH_LINE_BYTES + 10, b'A');
        let lines = watch_lines("/api/v1/secrets?watch=true", &input, 1 << 20).await;
        assert_eq!(lines.len(), 1);
        let event: Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(event["object"]["code"], 500);
    }

    #[tokio::test]
    async fn kube_keeps_working_and_logs_nothing_the_server_chose() {
        let (logs, _guard) = capture();
        let client = client(|method, target| {
            let status = |code: u16, reason: &str| {
                (
                    code,
                    json!({"kind": "Status", "code": code, "reason": reason,
                    "message": format!("c4n4ry-7Hq2x {}", canary_b64())})
                    .to_string(),
                )
            };
            match (method.as_str(), target) {
                ("GET", t) if t.starts_with("/api/v1/namespaces/a/secrets/absent") => {
                    status(404, "NotFound")
                }
                ("POST", t) if t.starts_with("/api/v1/namespaces/a/secrets") => {
                    status(409, "AlreadyExists")
                }
                ("PUT", _) => status(409, "Conflict"),
                ("GET", t) if t.starts_with("/api/v1/namespaces/a/secrets/denied") => {
                    status(403, "Forbidden")
                }
                ("GET", t) if t.starts_with("/api/v1/namespaces/a/secrets/mistyped") => (
                    200,
                    json!({"kind": "Secret", "data": {"k": "c4n4ry-7Hq2x"}}).to_string(),
                ),
                ("GET", t) if t.starts_with("/api/v1/namespaces/a/configmaps/secret") => (
                    200,
                    json!({"kind": "Secret", "apiVersion": "v1", "metadata": {"name": "x"},
                        "data": {"k": canary_b64()}})
                    .to_string(),
                ),
                _ => (500, "<html>c4n4ry-7Hq2x</html>".to_owned()),
            }
        });
        let secrets: Api<Secret> = Api::namespaced(client.clone(), "a");
        assert!(
            secrets.get_opt("absent").await.unwrap().is_none(),
            "404 NotFound is None"
        );
        let err = secrets
            .create(&PostParams::default(), &Secret::default())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists"),
            "{err:?}"
        );
        let err = secrets
            .replace("x", &PostParams::default(), &Secret::default())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, kube::Error::Api(s) if s.is_conflict()),
            "{err:?}"
        );
        let err = secrets.get("denied").await.unwrap_err();
        assert!(
            matches!(&err, kube::Error::Api(s) if s.is_forbidden()),
            "{err:?}"
        );
        let mut errors = vec![format!("{err:?}")];
        for name in ["mistyped", "other"] {
            let err = secrets.get(name).await.unwrap_err();
            assert!(
                matches!(&err, kube::Error::Api(s) if s.code == 500),
                "{err:?}"
            );
            errors.push(format!("{err:?} {err}"));
        }
        let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "a");
        let err = maps.get("secret").await.unwrap_err();
        errors.push(format!("{err:?} {err}"));
        let err = secrets.list(&ListParams::default()).await.unwrap_err();
        errors.push(format!("{err:?} {err}"));
        drop(_guard);
        assert_clean("the errors", &errors.join("\n"));
        let logs = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
        assert!(
            logs.contains("Unsuccessful"),
            "kube logged its errors: {logs}"
        );
        assert_clean("the logs", &logs);
    }

    #[tokio::test]
    async fn the_watcher_still_relists_on_410_and_logs_nothing_the_server_chose() {
        let (logs, _guard) = capture();
        let lists = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = lists.clone();
        let watches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let client = client(move |_method, target| {
            if target.contains("watch=true") {
                let n = watches.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let added = json!({"type": "ADDED", "object": {"apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": "s", "namespace": "a", "resourceVersion": "2"},
                    "data": {"k": canary_b64()}}});
                let gone = json!({"type": "ERROR", "object": {"kind": "Status", "code": 410,
                    "reason": "Expired", "message": "c4n4ry-7Hq2x"}});
                let bad =
                    r#"{"type":"MODIFIED","object":{"kind":"Secret","data":{"k":"c4n4ry-7Hq2x"}}}"#;
                // The watch ends at a line that does not decode; the watcher watches again,
                // and relists after a 410.
                if n.is_multiple_of(2) {
                    (200, format!("{added}\n{bad}\n{added}\n"))
                } else {
                    (200, format!("{added}\n{gone}\n"))
                }
            } else {
                let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if n.is_multiple_of(2) {
                    (
                        200,
                        r#"{"kind":"SecretList","items":"c4n4ry-7Hq2x"}"#.to_owned(),
                    )
                } else {
                    (
                        200,
                        json!({"kind": "SecretList", "apiVersion": "v1",
                        "metadata": {"resourceVersion": "1"}, "items": []})
                        .to_string(),
                    )
                }
            }
        });
        let api: Api<Secret> = Api::all(client);
        let mut errors = Vec::new();
        let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
        let mut applied = 0;
        for _ in 0..1000 {
            if lists.load(std::sync::atomic::Ordering::SeqCst) >= 5 {
                break;
            }
            match stream.next().await.unwrap() {
                Ok(watcher::Event::Apply(s)) => {
                    applied += 1;
                    assert_eq!(s.data.unwrap()["k"].0, CANARY.as_bytes());
                }
                Ok(_) => {}
                Err(e) => errors.push(format!("{e:?} {e}")),
            }
        }
        drop(_guard);
        assert!(
            lists.load(std::sync::atomic::Ordering::SeqCst) >= 5,
            "{errors:?}"
        );
        assert!(applied >= 1);
        assert!(errors.iter().any(|e| e.contains("500")), "{errors:?}");
        assert!(errors.iter().any(|e| e.contains("410")), "{errors:?}");
        assert_clean("the errors", &errors.join("\n"));
        let logs = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
        assert_clean("the logs", &logs);
    }
}

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
//!   ([`WorkloadKind`]) [`DynamicObject`] of that kind (any resource of a configured kind's API
//!   group: a [`DynamicObject`] of one of the group's configured kinds); a path without a name is a list
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
//! - **A resumed watch that ends at once with nothing** (a watch from a `resourceVersion`, not a
//!   list, ended by the server within [`SHORT_WATCH`] of being asked for, without one line) ends
//!   with a 410 `ERROR` event added, so that kube-runtime's watcher lists again instead of
//!   resuming from the same version for ever. An API server that cannot serve a version closes
//!   such a watch without the 410 it owes in some states (the Events resource, kubernetes#104171
//!   and #137089; kube-apiserver 1.35 after a restart and a compaction, seen in
//!   docs/compatibility.md), and kube-runtime resumes a cleanly closed watch from the same version
//!   at once, with no backoff: a loop of empty watches that never sees a change. client-go's
//!   reflector treats such a "very short watch" as an error and lists again, after a pause; here
//!   the 410 is an error the watch's backoff counts.
//! - **Requests marked [`DecodedByCaller`]** (the webhook's lookups, which read the body
//!   themselves, count it against the review memory budget and never quote it): error answers are
//!   sanitized as above, success bodies pass unread.
//!
//! Transport errors pass through unchanged: they carry no body.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body as HttpBody, Bytes, Frame};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, Namespace, Pod, Secret};
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

use confighash_core::kind::{WorkloadKind, every_kind};

/// The largest success body read of a request that is not a watch. The watcher lists 50
/// objects a page.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;
/// The longest watch line (one event): etcd keeps objects up to 1.5 MiB.
pub const MAX_WATCH_LINE_BYTES: usize = 16 * 1024 * 1024;
/// The most of an error body read to find its reason.
pub const MAX_ERROR_BYTES: usize = 1024 * 1024;
/// A resumed watch the server ends this soon without a line did not work: see the module
/// documentation. client-go's reflector uses the same second.
pub const SHORT_WATCH: Duration = Duration::from_secs(1);

/// The message of every error Status passed on.
const WITHHELD: &str =
    "the API server's message was withheld by confighash: it can quote object content";
/// The message of the 500 that replaces an answer that does not parse.
const UNDECODABLE: &str = "the API server's answer could not be decoded as what was asked for and was withheld by confighash";
/// The message of the 410 added to a resumed watch that ended at once without a line.
const SHORT_WATCH_ENDED: &str = "the API server ended this watch at once without an event; \
     confighash takes its resourceVersion as expired and lists again";
/// The message of the 500 that replaces an answer larger than the layer reads.
const TOO_LARGE: &str = "the API server's answer was too large and was withheld by confighash";
/// The message of the 500 that replaces the answer to a request for a resource confighash does
/// not read.
const UNKNOWN: &str =
    "confighash does not read this resource; the API server's answer was withheld";
/// The message of the 500 that replaces the answer to a request for a resource confighash reads,
/// but not through this client: the part that reads it did not declare it ([`Resource`]).
const UNDECLARED: &str = "this confighash client was not built to read this resource (the part \
     that reads it must declare it: confighash_cluster::client::Resource); the API server's answer \
     was withheld";

/// A resource confighash reads, and so a kind of answer this client lets through checked. Each
/// part declares what it reads (`confighash_watcher::READS`, `confighash_webhook::READS`, ...);
/// `confighash serve` builds its one client from their union ([`Reads`]). A request for a
/// resource no part declared gets a 500 saying so ([`UNDECLARED`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    ConfigMaps,
    Secrets,
    Namespaces,
    /// Core and `events.k8s.io` Events.
    Events,
    Leases,
    MutatingWebhookConfigurations,
    /// Every workload kind ([`WorkloadKind`]).
    Workloads,
    /// Pods (watched per namespace while a progressive wave judges there).
    Pods,
}

impl Resource {
    const fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// A set of [`Resource`]s: what a client is built to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reads(u8);

impl Reads {
    /// Nothing: only discovery and requests whose caller reads the body ([`DecodedByCaller`]).
    pub const NONE: Reads = Reads(0);

    /// The resources of `resources`.
    pub const fn of(resources: &[Resource]) -> Reads {
        let mut bits = 0;
        let mut i = 0;
        while i < resources.len() {
            bits |= resources[i].bit();
            i += 1;
        }
        Reads(bits)
    }

    /// What either reads.
    pub const fn and(self, other: Reads) -> Reads {
        Reads(self.0 | other.0)
    }

    pub const fn contains(self, resource: Resource) -> bool {
        self.0 & resource.bit() != 0
    }
}

/// The body of every answer the layer passes on.
pub type AnswerBody = UnsyncBoxBody<Bytes, BoxError>;

/// The client `serve` uses: kube's default stack for `config`, under [`SanitizeLayer`], letting
/// through answers about the resources of `reads`.
pub fn build(config: kube::Config, reads: Reads) -> Result<kube::Client, kube::Error> {
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&SanitizeLayer { reads })
        .build())
}

/// A request extension: the caller reads the success body itself, bounded, and never quotes it;
/// the layer passes it unread (error answers are still sanitized).
#[derive(Debug, Clone, Copy)]
pub struct DecodedByCaller;

/// Puts [`Sanitize`] on a service, for the resources of `reads`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SanitizeLayer {
    pub reads: Reads,
}

impl<S> Layer<S> for SanitizeLayer {
    type Service = Sanitize<S>;
    fn layer(&self, inner: S) -> Sanitize<S> {
        Sanitize {
            inner,
            reads: self.reads,
        }
    }
}

/// Rewrites every answer of `inner` by the rules in the [module documentation](self).
#[derive(Debug, Clone)]
pub struct Sanitize<S> {
    inner: S,
    reads: Reads,
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
        let expect = Expect::of(&request, self.reads);
        let what = format!("{} {}", request.method(), request.uri().path());
        let resumed = resumes_a_watch(&request).then(tokio::time::Instant::now);
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await.map_err(Into::into)?;
            sanitize(expect, resumed, &what, response).await
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
    Pod,
    /// A [`DynamicObject`] of this built-in kind.
    Workload(WorkloadKind),
    /// A [`DynamicObject`] of a kind configured in this API group (`--workload-kind`): its
    /// resource's plural is the CRD's own, so any resource of the group is read as one of them.
    ConfiguredWorkload(&'static str),
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
            ("", "pods") => Ty::Pod,
            ("admissionregistration.k8s.io", "mutatingwebhookconfigurations") => {
                Ty::MutatingWebhookConfiguration
            }
            _ => {
                // kube's plural of a kind: lower case, plus "s".
                let built_in = WorkloadKind::BUILT_IN.into_iter().find(|k| {
                    k.group() == group && format!("{}s", k.kind().to_ascii_lowercase()) == resource
                });
                match built_in {
                    Some(kind) => Ty::Workload(kind),
                    None => {
                        let configured = every_kind()
                            .into_iter()
                            .find(|k| !k.is_built_in() && k.group() == group)?;
                        Ty::ConfiguredWorkload(configured.group())
                    }
                }
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
    /// Nothing passes: a resource confighash reads, not declared for this client.
    Undeclared,
    Typed(Ty, Shape),
    Watch(Ty),
}

impl Ty {
    /// The declared resource whose answers parse as this type; `None` for discovery.
    fn resource(self) -> Option<Resource> {
        Some(match self {
            Ty::ConfigMap => Resource::ConfigMaps,
            Ty::Secret => Resource::Secrets,
            Ty::Namespace => Resource::Namespaces,
            Ty::CoreEvent | Ty::Event => Resource::Events,
            Ty::Lease => Resource::Leases,
            Ty::Pod => Resource::Pods,
            Ty::MutatingWebhookConfiguration => Resource::MutatingWebhookConfigurations,
            Ty::Workload(_) | Ty::ConfiguredWorkload(_) => Resource::Workloads,
            Ty::ApiResourceList
            | Ty::ApiGroupList
            | Ty::ApiGroup
            | Ty::ApiVersions
            | Ty::GroupDiscoveryList
            | Ty::VersionInfo => return None,
        })
    }
}

/// Whether `request` resumes a watch from a version: `watch` with a `resourceVersion` other than
/// none and "0" (any version), and no `sendInitialEvents` (which lists first).
fn resumes_a_watch<B>(request: &Request<B>) -> bool {
    let (mut watch, mut version, mut lists) = (false, false, false);
    for pair in request.uri().query().unwrap_or("").split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "watch" => watch = is_true(v),
            "resourceVersion" => version = !v.is_empty() && v != "0",
            "sendInitialEvents" => lists = is_true(v),
            _ => {}
        }
    }
    watch && version && !lists
}

/// A query parameter's value as the API server reads a boolean (Go's `strconv.ParseBool`).
fn is_true(v: &str) -> bool {
    matches!(v, "1" | "t" | "T" | "true" | "TRUE" | "True")
}

impl Expect {
    fn of<B>(request: &Request<B>, reads: Reads) -> Expect {
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
        if ty.resource().is_some_and(|r| !reads.contains(r)) {
            return Expect::Undeclared;
        }
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
    Pod,
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

    fn is(k: &Kinded, kinds: &[&str]) -> bool {
        k.kind.as_deref().is_none_or(|k| kinds.contains(&k))
    }

    pub fn object(body: &[u8], kinds: &[&str]) -> bool {
        serde_json::from_slice::<Kinded>(body).is_ok_and(|k| is(&k, kinds))
    }

    pub fn list(body: &[u8], kinds: &[&str]) -> bool {
        serde_json::from_slice::<KindedList>(body)
            .is_ok_and(|l| l.items.iter().flatten().all(|k| is(k, kinds)))
    }

    pub fn event(line: &[u8], kinds: &[&str]) -> bool {
        serde_json::from_slice::<KindedEvent>(line)
            .is_ok_and(|e| e.object.as_ref().is_none_or(|k| is(k, kinds)))
    }
}

/// The kinds a workload answer's objects may be, if `ty` is a workload.
fn workload_kinds(ty: Ty) -> Option<Vec<&'static str>> {
    match ty {
        Ty::Workload(kind) => Some(vec![kind.kind()]),
        Ty::ConfiguredWorkload(group) => Some(
            every_kind()
                .into_iter()
                .filter(|k| !k.is_built_in() && k.group() == group)
                .map(WorkloadKind::kind)
                .collect(),
        ),
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
    let kinds = workload_kinds(ty);
    let object = |body: &[u8]| {
        serde_json::from_slice::<T>(body).is_ok()
            && kinds
                .as_ref()
                .is_none_or(|kinds| kinds::object(body, kinds))
    };
    let list = |body: &[u8]| {
        serde_json::from_slice::<ObjectList<T>>(body).is_ok()
            && kinds.as_ref().is_none_or(|kinds| kinds::list(body, kinds))
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
        Ty::Pod => check_as::<Pod>(ty, shape, body),
        Ty::MutatingWebhookConfiguration => {
            check_as::<MutatingWebhookConfiguration>(ty, shape, body)
        }
        Ty::Workload(_) | Ty::ConfiguredWorkload(_) => check_as::<DynamicObject>(ty, shape, body),
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
            if workload_kinds(ty).is_none_or(|kinds| kinds::event(line, &kinds)) {
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
        Ty::Pod => check_event_as::<Pod>(ty, line),
        Ty::MutatingWebhookConfiguration => {
            check_event_as::<MutatingWebhookConfiguration>(ty, line)
        }
        Ty::Workload(_) | Ty::ConfiguredWorkload(_) => check_event_as::<DynamicObject>(ty, line),
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

/// `resumed`: when the request was sent, if it resumes a watch ([`resumes_a_watch`]).
async fn sanitize<B>(
    expect: Expect,
    resumed: Option<tokio::time::Instant>,
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
            WatchLines::new(response.into_body(), ty, resumed).boxed_unsync(),
        )),
        Expect::Unknown => {
            tracing::warn!(
                request = what,
                "confighash does not read this resource; the answer is withheld"
            );
            Ok(withheld(UNKNOWN))
        }
        Expect::Undeclared => {
            tracing::warn!(
                request = what,
                "this client was not built to read this resource (the part that reads it must \
                 declare it: confighash_cluster::client::Resource); the answer is withheld"
            );
            Ok(withheld(UNDECLARED))
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
    /// When a watch resumed from a version was asked for, until its first line.
    resumed: Option<tokio::time::Instant>,
}

impl<B> WatchLines<B> {
    fn new(inner: B, ty: Ty, resumed: Option<tokio::time::Instant>) -> Self {
        WatchLines {
            inner: Some(inner),
            ty,
            partial: Vec::new(),
            ready: VecDeque::new(),
            resumed,
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
        self.resumed = None;
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
        if !last.iter().all(u8::is_ascii_whitespace) {
            match serde_json::from_slice::<serde::de::IgnoredAny>(&last) {
                Err(e) if e.is_eof() => {}
                _ => {
                    self.line(&last);
                }
            }
        }
        if let Some(asked) = self.resumed.take()
            && asked.elapsed() < SHORT_WATCH
        {
            tracing::info!(
                expected = ?self.ty,
                "a resumed watch ended at once without an event; listing again"
            );
            self.ready.push_back(Bytes::from(error_event(&status_json(
                410,
                "Expired",
                SHORT_WATCH_ENDED,
                false,
            ))));
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
mod tests;

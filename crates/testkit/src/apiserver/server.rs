//! The HTTP front: kube-apiserver's REST paths, verbs, Status errors and watch streams.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use crate::apiserver::admission::{self, AdmissionError, AdmissionInput, Operation, WebhookCall};
use crate::apiserver::managed;
use crate::apiserver::patches;
use crate::apiserver::rbac::{Authorizer, RequestAttributes};
use crate::apiserver::resources::{self, RESOURCES, ROLLOUTS_GROUP, ResourceInfo};
use crate::apiserver::schema;
use crate::apiserver::selectors::{FieldSelector, LabelSelector, labels_of};
use crate::apiserver::store::{Event, EventType, Key, Snapshot, Store};
use crate::apiserver::user::UserInfo;

/// kube-apiserver's default request body limit (3 MiB).
const MAX_BODY: usize = 3 * 1024 * 1024;

/// How the stand-in starts.
#[derive(Debug, Clone)]
pub struct Options {
    /// How often watches that ask for bookmarks get one (kube-apiserver: about a minute).
    pub bookmark_interval: Duration,
    /// Whether the Argo Rollouts CRD is installed.
    pub rollouts_served: bool,
    /// How long the namespace controller takes to empty a deleted Namespace: its objects are
    /// deleted one by one spread over this time, then the Namespace itself (default 1 s; in a
    /// cluster, seconds to minutes).
    pub namespace_termination: Duration,
    /// How far admission's view of the Namespaces (for webhooks' namespaceSelectors and for
    /// refusing creates in terminating namespaces) lags behind the store, as kube-apiserver's
    /// informer cache does (in a cluster, usually milliseconds). The default is zero, so that a
    /// test that relabels a namespace and then writes in it sees one outcome, not one that
    /// depends on its timing; a test about that race sets a lag. Changeable at run time with
    /// `ApiServer::set_namespace_cache_lag`.
    pub namespace_cache_lag: Duration,
    /// Whether watch lists (`sendInitialEvents`) are served: kube-apiserver's `WatchList` feature
    /// gate (on by default in 1.32 and from 1.34, off in 1.33). When off, a watch that asks for
    /// them is refused with 422.
    pub watch_list: bool,
    /// A fault: watch lists are served, but the bookmark that ends their initial events
    /// (`k8s.io/initial-events-end`) is never sent, as behind a proxy that drops it. Not a
    /// behaviour of kube-apiserver.
    pub drop_initial_events_end: bool,
    /// A fault: a watch list's stream ends after this many initial events, before its end
    /// bookmark, every time (kubernetes#138557: under load a broken stream starts again from
    /// zero and never gets through). Not a behaviour of a healthy kube-apiserver.
    pub break_initial_events_after: Option<usize>,
    /// A fault: a watch list's stream ends right after its end bookmark (kubernetes#134837).
    /// A watch resumed from the bookmark's version is served as usual.
    pub close_after_initial_events_end: bool,
    /// A watch resumed from a compacted version ends at once with no event, instead of the 410
    /// ERROR event it owes: what kube-apiserver does for Events (served from etcd, not the watch
    /// cache: kubernetes#104171, #137089) and, seen on 1.35, for other resources after a restart
    /// and a compaction.
    pub silent_expired_watches: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            bookmark_interval: Duration::from_secs(1),
            rollouts_served: true,
            namespace_termination: Duration::from_secs(1),
            namespace_cache_lag: Duration::ZERO,
            watch_list: true,
            drop_initial_events_end: false,
            break_initial_events_after: None,
            close_after_initial_events_end: false,
            silent_expired_watches: false,
        }
    }
}

/// A fault to inject: fail the next `remaining` requests that match, or (`fraction`) each
/// matching request with that probability, without end.
#[derive(Debug, Clone)]
struct Fault {
    /// Only requests whose User-Agent starts with this (None: any).
    user_agent: Option<String>,
    verb: Option<String>,
    resource: Option<String>,
    remaining: u32,
    fraction: Option<f64>,
    status: u16,
}

/// The injected faults, the dice for `fail_fraction`, and a record of what was failed.
struct Faults {
    active: Vec<Fault>,
    /// SplitMix64 state, fixed seed: the sequence of draws is the same in every run.
    rng: u64,
    injected: Vec<InjectedFault>,
}

/// A request that an injected fault failed.
#[derive(Debug, Clone)]
pub struct InjectedFault {
    pub verb: String,
    /// The resource plural.
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub status: u16,
    /// When the request was failed.
    pub at: std::time::Instant,
}

pub(crate) struct Shared {
    store: Mutex<Store>,
    faults: Mutex<Faults>,
    delay: Mutex<Duration>,
    kill_watches: tokio::sync::watch::Sender<u64>,
    rollouts_served: AtomicBool,
    /// The custom resources of `CRD_RESOURCES` whose CRD is "applied": (group, plural).
    crds_served: Mutex<HashSet<(&'static str, &'static str)>>,
    authorizer: Mutex<Option<Arc<Authorizer>>>,
    tokens: Mutex<HashMap<String, UserInfo>>,
    /// Every webhook call of the admission chain and how long it took.
    webhook_calls: Mutex<Vec<(WebhookCall, Duration)>>,
    requests: Mutex<Vec<(String, String)>>,
    /// Every resource request by whom, as kube-apiserver's audit log records them.
    audit: Mutex<Vec<Audited>>,
    /// Requests that have arrived, counted before any injected delay.
    received: std::sync::atomic::AtomicU64,
    bookmark_interval: Duration,
    namespace_termination: Duration,
    namespace_lag: Mutex<Duration>,
    watch_list: bool,
    drop_initial_events_end: bool,
    break_initial_events_after: Option<usize>,
    close_after_initial_events_end: bool,
    silent_expired_watches: bool,
    /// Work the server does on its own (emptying deleted namespaces), ended with the server.
    background: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking test thread must not take the whole server down with it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running in-memory API server on 127.0.0.1.
pub struct ApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.task.abort();
        for task in lock(&self.shared.background).drain(..) {
            task.abort();
        }
    }
}

impl ApiServer {
    /// Starts a server with default options on a random loopback port.
    pub async fn start() -> Self {
        Self::start_with(Options::default()).await
    }

    pub async fn start_with(options: Options) -> Self {
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::new()),
            faults: Mutex::new(Faults {
                active: Vec::new(),
                rng: 0x5eed_c0f1_6a54_0001,
                injected: Vec::new(),
            }),
            delay: Mutex::new(Duration::ZERO),
            kill_watches: tokio::sync::watch::channel(0).0,
            rollouts_served: AtomicBool::new(options.rollouts_served),
            crds_served: Mutex::new(HashSet::new()),
            authorizer: Mutex::new(None),
            tokens: Mutex::new(HashMap::new()),
            webhook_calls: Mutex::new(Vec::new()),
            requests: Mutex::new(Vec::new()),
            audit: Mutex::new(Vec::new()),
            received: std::sync::atomic::AtomicU64::new(0),
            bookmark_interval: options.bookmark_interval,
            namespace_termination: options.namespace_termination,
            namespace_lag: Mutex::new(options.namespace_cache_lag),
            watch_list: options.watch_list,
            drop_initial_events_end: options.drop_initial_events_end,
            break_initial_events_after: options.break_initial_events_after,
            close_after_initial_events_end: options.close_after_initial_events_end,
            silent_expired_watches: options.silent_expired_watches,
            background: Mutex::new(Vec::new()),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("local address");
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let task = tokio::spawn(async move {
            // Ends only when the task is aborted.
            let _ = axum::serve(listener, app).await;
        });
        ApiServer { shared, addr, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kube client configuration for the superuser.
    pub fn config(&self) -> kube::Config {
        let mut config = kube::Config::new(self.url().parse().expect("a valid URL"));
        config.default_namespace = "default".into();
        config
    }

    /// A kube client configuration that authenticates with a bearer token (see `add_token`).
    pub fn config_with_token(&self, token: &str) -> kube::Config {
        let mut config = self.config();
        let value = format!("Bearer {token}")
            .parse()
            .expect("a valid header value");
        config.headers.push((header::AUTHORIZATION, value));
        config
    }

    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(self.config()).expect("a client for the stand-in")
    }

    /// Makes `token` authenticate as `user`.
    pub fn add_token(&self, token: &str, user: UserInfo) {
        lock(&self.shared.tokens).insert(token.to_owned(), user);
    }

    /// Makes `token` authenticate no one any more, as a bound token past its expiry.
    pub fn revoke_token(&self, token: &str) {
        lock(&self.shared.tokens).remove(token);
    }

    /// Enforces RBAC on every request of users that are not superusers (None: no RBAC).
    pub fn set_authorizer(&self, authorizer: Option<Authorizer>) {
        *lock(&self.shared.authorizer) = authorizer.map(Arc::new);
    }

    /// Pod-template transitions of a workload so far.
    pub fn rollouts(&self, namespace: &str, kind: &str, name: &str) -> u64 {
        lock(&self.shared.store).rollouts(namespace, kind, name)
    }

    /// The stored object, read without going through HTTP.
    pub fn object(&self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        let resource = RESOURCES
            .iter()
            .find(|r| r.plural == plural && r.group != "events.k8s.io")?;
        let key = Key::new(resource, namespace, name);
        lock(&self.shared.store).get(&key).map(|v| (*v).clone())
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        lock(&self.shared.store).rv()
    }

    /// Fails the next `count` requests with this verb (None: any) on this resource plural (None:
    /// any) with `status` (500 or 429, which gets `Retry-After: 1`).
    pub fn fail_next(&self, verb: Option<&str>, resource: Option<&str>, count: u32, status: u16) {
        self.add_fault(None, verb, resource, count, None, status);
    }

    /// As [`ApiServer::fail_next`], for requests whose User-Agent starts with `user_agent` only
    /// (the webhook's lookups send their own, the watcher's requests none).
    pub fn fail_next_from(
        &self,
        user_agent: &str,
        verb: Option<&str>,
        resource: Option<&str>,
        count: u32,
        status: u16,
    ) {
        self.add_fault(Some(user_agent), verb, resource, count, None, status);
    }

    fn add_fault(
        &self,
        user_agent: Option<&str>,
        verb: Option<&str>,
        resource: Option<&str>,
        remaining: u32,
        fraction: Option<f64>,
        status: u16,
    ) {
        lock(&self.shared.faults).active.push(Fault {
            user_agent: user_agent.map(str::to_owned),
            verb: verb.map(str::to_owned),
            resource: resource.map(str::to_owned),
            remaining,
            fraction: fraction.map(|f| f.clamp(0.0, 1.0)),
            status,
        });
    }

    /// Fails each request with this verb (None: any) on this resource plural (None: any) with
    /// probability `fraction`, from now on, with `status` (as `fail_next`). Mimics an apiserver
    /// in trouble (etcd leader changes, an overloaded priority level), where a random share of
    /// requests fails with a 500 InternalError (or a 429 with `Retry-After`).
    pub fn fail_fraction(
        &self,
        verb: Option<&str>,
        resource: Option<&str>,
        fraction: f64,
        status: u16,
    ) {
        self.add_fault(None, verb, resource, 0, Some(fraction), status);
    }

    /// As [`ApiServer::fail_fraction`], for requests whose User-Agent starts with `user_agent`
    /// only.
    pub fn fail_fraction_from(
        &self,
        user_agent: &str,
        verb: Option<&str>,
        resource: Option<&str>,
        fraction: f64,
        status: u16,
    ) {
        self.add_fault(Some(user_agent), verb, resource, 0, Some(fraction), status);
    }

    /// Removes every injected fault that is still active (the record stays).
    pub fn clear_faults(&self) {
        lock(&self.shared.faults).active.clear();
    }

    /// Every request an injected fault (`fail_next` or `fail_fraction`) failed so far, in order.
    pub fn injected_faults(&self) -> Vec<InjectedFault> {
        lock(&self.shared.faults).injected.clone()
    }

    /// Ends every open watch stream, as a restarting apiserver or a dropped connection does.
    pub fn close_watches(&self) {
        self.shared.kill_watches.send_modify(|n| *n += 1);
    }

    /// Compacts history: watches and list continuations from an older resourceVersion get 410.
    pub fn compact(&self) {
        lock(&self.shared.store).compact();
    }

    /// Delays every response by `delay`.
    pub fn set_delay(&self, delay: Duration) {
        *lock(&self.shared.delay) = delay;
    }

    /// Sets how far admission's view of the Namespaces lags behind the store (see
    /// `Options::namespace_cache_lag`).
    pub fn set_namespace_cache_lag(&self, lag: Duration) {
        *lock(&self.shared.namespace_lag) = lag;
    }

    /// The Namespace `name` as admission's lagging view of the Namespaces holds it now; None when
    /// that view does not have it (not yet, or no longer), when admission reads it live.
    pub fn cached_namespace(&self, name: &str) -> Option<Value> {
        let lag = *lock(&self.shared.namespace_lag);
        lock(&self.shared.store)
            .namespace_as_of(name, lag)
            .map(|v| (*v).clone())
    }

    /// Installs or removes the Argo Rollouts CRD.
    pub fn set_rollouts_served(&self, served: bool) {
        self.shared.rollouts_served.store(served, Ordering::SeqCst);
    }

    /// "Applies" or removes the CRD of a custom resource of `CRD_RESOURCES` (group, plural).
    pub fn set_crd_served(&self, group: &str, plural: &str, served: bool) {
        let crd = resources::CRD_RESOURCES
            .into_iter()
            .find(|(g, p)| *g == group && *p == plural)
            .unwrap_or_else(|| panic!("the stand-in has no custom resource {plural}.{group}"));
        let mut crds = lock(&self.shared.crds_served);
        if served {
            crds.insert(crd);
        } else {
            crds.remove(&crd);
        }
    }

    /// Every webhook call of the admission chain so far.
    pub fn webhook_calls(&self) -> Vec<WebhookCall> {
        lock(&self.shared.webhook_calls)
            .iter()
            .map(|(call, _)| call.clone())
            .collect()
    }

    /// Every webhook call of the admission chain so far, with how long it took (as
    /// kube-apiserver's admission duration histogram observes them).
    pub fn timed_webhook_calls(&self) -> Vec<(WebhookCall, Duration)> {
        lock(&self.shared.webhook_calls).clone()
    }

    /// How many requests have arrived so far, counted before any injected delay (so a test can
    /// tell that a request is in flight).
    pub fn received(&self) -> u64 {
        self.shared.received.load(Ordering::SeqCst)
    }

    /// (verb, resource plural or path) of every request so far.
    pub fn requests(&self) -> Vec<(String, String)> {
        lock(&self.shared.requests).clone()
    }

    /// Every resource request so far with its user, namespace and name, as kube-apiserver's
    /// audit log records them (the name of a create is the object's; the answer is not kept).
    pub fn audit(&self) -> Vec<Audited> {
        lock(&self.shared.audit).clone()
    }
}

/// One resource request, as an entry of kube-apiserver's audit log names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Audited {
    pub user: String,
    pub verb: String,
    /// The resource's plural, with `/status` for the status subresource.
    pub resource: String,
    pub namespace: String,
    pub name: String,
}

// ----- errors -----

/// A `Status` error response, as kube-apiserver sends them.
#[derive(Debug)]
pub(crate) struct ApiError {
    code: u16,
    reason: &'static str,
    message: String,
    details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    fn not_found(resource: &ResourceInfo, name: &str) -> Self {
        let mut e = Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(resource)),
        );
        e.details = Some(json!({"name": name, "group": resource.group, "kind": resource.plural}));
        e
    }

    fn no_route() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    fn conflict(resource: &ResourceInfo, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; \
                 please apply your changes to the latest version and try again",
                qualified(resource)
            ),
        )
    }

    fn invalid(resource: &ResourceInfo, name: &str, message: impl std::fmt::Display) -> Self {
        Self::new(
            422,
            "Invalid",
            format!("{} \"{name}\" is invalid: {message}", resource.kind),
        )
    }

    fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    fn status_body(&self) -> Value {
        let mut body = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            body["details"] = d.clone();
        }
        body
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (code, axum::Json(self.status_body())).into_response();
        if self.code == 429 {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        resp
    }
}

/// `configmaps` or `deployments.apps`, as Status messages name resources.
fn qualified(resource: &ResourceInfo) -> String {
    if resource.group.is_empty() {
        resource.plural.to_owned()
    } else {
        format!("{}.{}", resource.plural, resource.group)
    }
}

type ApiResult = Result<Response, ApiError>;

fn ok_json(code: StatusCode, v: &Value) -> Response {
    (code, axum::Json(v)).into_response()
}

// ----- routing -----

/// What a path names.
enum Target {
    ApiVersions,
    GroupList,
    ResourceList(String, String),
    Version,
    Resource {
        resource: &'static ResourceInfo,
        namespace: Option<String>,
        name: Option<String>,
        /// `.../{name}/status`: the status subresource of a workload.
        status: bool,
    },
}

impl Shared {
    fn served(&self) -> Vec<&'static ResourceInfo> {
        let rollouts = self.rollouts_served.load(Ordering::SeqCst);
        let crds = lock(&self.crds_served);
        let crd = |r: &ResourceInfo| {
            resources::CRD_RESOURCES.contains(&(r.group, r.plural))
                && !crds.contains(&(r.group, r.plural))
        };
        RESOURCES
            .iter()
            .filter(|r| !crd(r))
            .filter(|r| rollouts || r.group != ROLLOUTS_GROUP)
            .collect()
    }
}

fn parse_path(served: &[&'static ResourceInfo], path: &str) -> Result<Target, ApiError> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api"] => return Ok(Target::ApiVersions),
        ["apis"] => return Ok(Target::GroupList),
        ["version"] => return Ok(Target::Version),
        ["api", v] => return Ok(Target::ResourceList(String::new(), (*v).to_owned())),
        ["apis", g, v] => return Ok(Target::ResourceList((*g).to_owned(), (*v).to_owned())),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(ApiError::no_route()),
    };
    let find = |plural: &str| {
        resources::find(served, group, version, plural).ok_or_else(ApiError::no_route)
    };
    // `.../{name}/status`: the status subresource.
    let (rest, status) = match rest {
        ["namespaces", _, _, _, "status"] | [_, _, "status"] => (&rest[..rest.len() - 1], true),
        _ => (rest, false),
    };
    let (resource, namespace, name) = match rest {
        [plural] => (find(plural)?, None, None),
        ["namespaces", ns, plural] => (find(plural)?, Some(*ns), None),
        ["namespaces", ns, plural, name] => (find(plural)?, Some(*ns), Some(*name)),
        [plural, name] => (find(plural)?, None, Some(*name)),
        _ => return Err(ApiError::no_route()),
    };
    if status && (name.is_none() || resource.template.is_none()) {
        // Only workloads have a status subresource here.
        return Err(ApiError::no_route());
    }
    if resource.namespaced != namespace.is_some() && (name.is_some() || !resource.namespaced) {
        // A namespaced object needs its namespace; a cluster-scoped one has none.
        return Err(ApiError::no_route());
    }
    Ok(Target::Resource {
        resource,
        namespace: namespace.map(str::to_owned),
        name: name.map(str::to_owned),
        status,
    })
}

async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    shared.received.fetch_add(1, Ordering::SeqCst);
    let delay = *lock(&shared.delay);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    match serve(&shared, req).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    }
}

async fn serve(shared: &Arc<Shared>, req: Request) -> ApiResult {
    let (parts, body) = req.into_parts();
    let user = authenticate(shared, &parts.headers)?;
    let query: HashMap<String, String> = parts
        .uri
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let path = parts.uri.path().to_owned();
    let served = shared.served();
    let target = parse_path(&served, &path);

    // Non-resource requests: discovery.
    let (resource, namespace, name, status) = match target {
        Ok(Target::Resource {
            resource,
            namespace,
            name,
            status,
        }) => (resource, namespace, name, status),
        Ok(other) => {
            authorize_path(shared, &user, &path)?;
            lock(&shared.requests).push(("get".into(), path.clone()));
            if parts.method != Method::GET {
                return Err(ApiError::new(
                    405,
                    "MethodNotAllowed",
                    "only GET is allowed",
                ));
            }
            return discovery(&served, other);
        }
        Err(e) => {
            authorize_path(shared, &user, &path)?;
            return Err(e);
        }
    };

    let watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    let verb = match (&parts.method, name.is_some()) {
        (&Method::GET, true) => "get",
        (&Method::GET, false) if watch => "watch",
        (&Method::GET, false) => "list",
        (&Method::POST, false) => "create",
        (&Method::PUT, true) => "update",
        (&Method::PATCH, true) => "patch",
        (&Method::DELETE, true) if !status => "delete",
        _ => {
            return Err(ApiError::new(
                405,
                "MethodNotAllowed",
                format!("{} is not supported on this path", parts.method),
            ));
        }
    };
    // The subresource is named as RBAC names it: `deployments/status`.
    let requested = if status {
        format!("{}/status", resource.plural)
    } else {
        resource.plural.to_owned()
    };
    if status && watch {
        return Err(ApiError::new(
            405,
            "MethodNotAllowed",
            "the status subresource cannot be watched",
        ));
    }
    lock(&shared.requests).push((verb.to_owned(), requested.clone()));
    lock(&shared.audit).push(Audited {
        user: user.username.clone(),
        verb: verb.to_owned(),
        resource: requested.clone(),
        namespace: namespace.clone().unwrap_or_default(),
        name: name.clone().unwrap_or_default(),
    });

    let field_selector = query.get("fieldSelector").map(String::as_str).unwrap_or("");
    let fields =
        FieldSelector::parse(field_selector, resource.kind).map_err(ApiError::bad_request)?;
    // A watch or list restricted to one name counts as a request for that name, as in RBAC.
    let rbac_name = name.clone().or_else(|| fields.name().map(str::to_owned));
    authorize(
        shared,
        &user,
        verb,
        resource,
        if status { "status" } else { "" },
        namespace.as_deref(),
        rbac_name.as_deref(),
        &path,
    )?;
    inject_fault(
        shared,
        parts
            .headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok()),
        verb,
        &requested,
        namespace.as_deref(),
        name.as_deref(),
    )?;

    let body = axum::body::to_bytes(body, MAX_BODY + 1)
        .await
        .map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?;
    if body.len() > MAX_BODY {
        return Err(ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {MAX_BODY}"),
        ));
    }
    let dry_run = query.get("dryRun").is_some_and(|v| v == "All");
    let ns = namespace.as_deref().unwrap_or("");
    let user_agent = parts
        .headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok());
    let manager = managed::manager_of(query.get("fieldManager").map(String::as_str), user_agent);
    let ctx = Ctx {
        shared,
        resource,
        namespace: ns,
        user: &user,
        dry_run,
        manager: &manager,
    };
    if status {
        let name = name.as_deref().unwrap_or_default();
        let content_type = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        return match verb {
            "get" => get(&ctx, name),
            "update" => update_status(&ctx, name, &body),
            _ => patch_status(&ctx, name, content_type, &body),
        };
    }
    match verb {
        "get" => get(&ctx, name.as_deref().unwrap_or_default()),
        "list" => list(&ctx, namespace.as_deref(), &query, &fields),
        "watch" => watch_stream(&ctx, namespace.as_deref(), &query, fields),
        "create" => create(&ctx, &body).await,
        "update" => update(&ctx, name.as_deref().unwrap_or_default(), &body).await,
        "patch" => {
            let content_type = parts
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let manager = query.get("fieldManager").map(String::as_str);
            patch(
                &ctx,
                name.as_deref().unwrap_or_default(),
                content_type,
                manager,
                &body,
            )
            .await
        }
        _ => delete(&ctx, name.as_deref().unwrap_or_default(), &body).await,
    }
}

fn discovery(served: &[&'static ResourceInfo], target: Target) -> ApiResult {
    let body = match target {
        Target::ApiVersions => resources::api_versions(),
        Target::GroupList => resources::api_group_list(served),
        Target::ResourceList(group, version) => {
            resources::api_resource_list(served, &group, &version).ok_or_else(ApiError::no_route)?
        }
        Target::Version => json!({"major": "1", "minor": "37", "gitVersion": "v1.37.2-standin"}),
        Target::Resource { .. } => return Err(ApiError::no_route()),
    };
    Ok(ok_json(StatusCode::OK, &body))
}

// ----- authentication, authorization, faults -----

/// Mimics bearer-token authentication: no token is the superuser (a cluster-admin kubeconfig);
/// an unknown token is 401.
fn authenticate(shared: &Shared, headers: &HeaderMap) -> Result<UserInfo, ApiError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(UserInfo::admin());
    };
    let token = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| ApiError::new(401, "Unauthorized", "Unauthorized"))?;
    lock(&shared.tokens)
        .get(token)
        .cloned()
        .ok_or_else(|| ApiError::new(401, "Unauthorized", "Unauthorized"))
}

fn authorize_path(shared: &Shared, user: &UserInfo, path: &str) -> Result<(), ApiError> {
    let Some(authz) = lock(&shared.authorizer).clone() else {
        return Ok(());
    };
    let attrs = RequestAttributes {
        verb: "get",
        api_group: "",
        resource: "",
        subresource: "",
        namespace: None,
        name: None,
        path,
        resource_request: false,
    };
    if authz.allows(user, &attrs) {
        return Ok(());
    }
    Err(ApiError::new(
        403,
        "Forbidden",
        format!(
            "forbidden: User \"{}\" cannot get path \"{path}\"",
            user.username
        ),
    ))
}

#[allow(clippy::too_many_arguments)]
fn authorize(
    shared: &Shared,
    user: &UserInfo,
    verb: &str,
    resource: &ResourceInfo,
    subresource: &str,
    namespace: Option<&str>,
    name: Option<&str>,
    path: &str,
) -> Result<(), ApiError> {
    let Some(authz) = lock(&shared.authorizer).clone() else {
        return Ok(());
    };
    let attrs = RequestAttributes {
        verb,
        api_group: resource.group,
        resource: resource.plural,
        subresource,
        namespace,
        name,
        path,
        resource_request: true,
    };
    if authz.allows(user, &attrs) {
        return Ok(());
    }
    // kube-apiserver's wording, so a failing test reads like a failing cluster.
    let what = match name {
        Some(n) => format!("{} \"{n}\" is forbidden", qualified(resource)),
        None => format!("{} is forbidden", qualified(resource)),
    };
    let scope = match namespace {
        Some(ns) => format!(" in the namespace \"{ns}\""),
        None => " at the cluster scope".to_owned(),
    };
    Err(ApiError::new(
        403,
        "Forbidden",
        format!(
            "{what}: User \"{}\" cannot {verb} resource \"{}\" in API group \"{}\"{scope}",
            user.username, resource.plural, resource.group
        ),
    ))
}

fn inject_fault(
    shared: &Shared,
    user_agent: Option<&str>,
    verb: &str,
    plural: &str,
    namespace: Option<&str>,
    name: Option<&str>,
) -> Result<(), ApiError> {
    let mut faults = lock(&shared.faults);
    let Faults {
        active,
        rng,
        injected,
    } = &mut *faults;
    let hit = active.iter_mut().find(|f| {
        f.user_agent
            .as_deref()
            .is_none_or(|a| user_agent.is_some_and(|u| u.starts_with(a)))
            && f.verb.as_deref().is_none_or(|v| v == verb)
            && f.resource.as_deref().is_none_or(|r| r == plural)
            && match f.fraction {
                None => f.remaining > 0,
                // One draw per matching fraction fault, so each stays independent.
                Some(fraction) => draw(rng) < fraction,
            }
    });
    let Some(fault) = hit else { return Ok(()) };
    let status = fault.status;
    if fault.fraction.is_none() {
        fault.remaining -= 1;
        active.retain(|f| f.fraction.is_some() || f.remaining > 0);
    }
    injected.push(InjectedFault {
        verb: verb.to_owned(),
        resource: plural.to_owned(),
        namespace: namespace.map(str::to_owned),
        name: name.map(str::to_owned),
        status,
        at: std::time::Instant::now(),
    });
    Err(match status {
        429 => ApiError::new(429, "TooManyRequests", "injected fault: too many requests"),
        code => ApiError::new(code, "InternalError", "injected fault: internal error"),
    })
}

/// A uniform draw in [0, 1) from SplitMix64 state `state`.
fn draw(state: &mut u64) -> f64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

// ----- verbs -----

struct Ctx<'a> {
    shared: &'a Arc<Shared>,
    resource: &'static ResourceInfo,
    namespace: &'a str,
    user: &'a UserInfo,
    dry_run: bool,
    /// The field manager writes are recorded under (see `managed::manager_of`).
    manager: &'a str,
}

impl Ctx<'_> {
    fn key(&self, name: &str) -> Key {
        Key::new(self.resource, self.namespace, name)
    }

    fn store(&self) -> MutexGuard<'_, Store> {
        lock(&self.shared.store)
    }

    /// The field manager's view of a write by this request.
    fn field_write<'n>(&'n self, api_version: &'n str, now: &'n str) -> managed::Write<'n> {
        managed::Write {
            group: self.resource.group,
            kind: self.resource.kind,
            api_version,
            manager: self.manager,
            now,
        }
    }

    /// The Namespace `name` as admission sees it: from a cache that lags the store by the
    /// configured delay, read live only when the cache does not have it (as the webhook
    /// dispatcher's and NamespaceLifecycle's namespace listers are used).
    fn namespace_view(&self, name: &str) -> Option<Arc<Value>> {
        let lag = *lock(&self.shared.namespace_lag);
        let store = self.store();
        store
            .namespace_as_of(name, lag)
            .or_else(|| store.get(&Key::new(namespace_resource(), "", name)))
    }
}

/// The Namespace resource.
fn namespace_resource() -> &'static ResourceInfo {
    &RESOURCES[0]
}

fn get(ctx: &Ctx<'_>, name: &str) -> ApiResult {
    let obj = ctx
        .store()
        .get(&ctx.key(name))
        .ok_or_else(|| ApiError::not_found(ctx.resource, name))?;
    Ok(ok_json(StatusCode::OK, &obj))
}

fn selected(obj: &Value, labels: &LabelSelector, fields: &FieldSelector) -> bool {
    labels.matches(&labels_of(obj)) && fields.matches(obj)
}

fn label_selector(query: &HashMap<String, String>) -> Result<LabelSelector, ApiError> {
    LabelSelector::parse(query.get("labelSelector").map(String::as_str).unwrap_or(""))
        .map_err(ApiError::bad_request)
}

/// Lists, page by page: `limit` cuts a page, `continue` resumes from a snapshot taken at the
/// first page (an etcd read at a fixed revision), and a token older than the compaction point is
/// 410 Gone, as kube-apiserver answers after etcd compacted that revision.
fn list(
    ctx: &Ctx<'_>,
    namespace: Option<&str>,
    query: &HashMap<String, String>,
    fields: &FieldSelector,
) -> ApiResult {
    list_options(ctx.shared, query, false)?;
    let labels = label_selector(query)?;
    let limit: usize = match query.get("limit").map(String::as_str) {
        None | Some("") | Some("0") => usize::MAX,
        Some(l) => l
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
    };
    let mut store = ctx.store();
    let snapshot = match query.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            let (id, rv) = decode_continue(token)?;
            match store.take_snapshot(id) {
                Some(s) => s,
                None if rv < store.compacted() || rv <= store.rv() => {
                    return Err(ApiError::gone(
                        "The provided continue parameter is too old to display a consistent \
                         list result. You can start a new list without the continue parameter.",
                    ));
                }
                None => return Err(ApiError::bad_request("invalid continue token")),
            }
        }
        None => Snapshot {
            rv: store.rv(),
            items: store
                .list(ctx.resource, namespace)
                .into_iter()
                .filter(|o| selected(o, &labels, fields))
                .map(|o| (*o).clone())
                .collect(),
        },
    };
    let rv = snapshot.rv;
    let mut items = snapshot.items;
    let rest = if items.len() > limit {
        items.split_off(limit)
    } else {
        Vec::new()
    };
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if !rest.is_empty() {
        metadata["remainingItemCount"] = json!(rest.len());
        let id = store.save_snapshot(Snapshot { rv, items: rest });
        metadata["continue"] = json!(encode_continue(id, rv));
    }
    drop(store);
    // Items of a list carry no kind or apiVersion, as kube-apiserver serves them.
    for item in &mut items {
        if let Some(o) = item.as_object_mut() {
            o.remove("kind");
            o.remove("apiVersion");
        }
    }
    let body = json!({
        "kind": format!("{}List", ctx.resource.kind),
        "apiVersion": ctx.resource.api_version(),
        "metadata": metadata,
        "items": items,
    });
    Ok(ok_json(StatusCode::OK, &body))
}

/// Go's `strconv.ParseBool`, as query parameters are decoded.
fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// The `sendInitialEvents` of a list or watch, after kube-apiserver's defaulting
/// (`SetListOptionsDefaults`: with the WatchList gate on, a watch without a resourceVersion, or
/// from "0", is a watch list) and validated as `ValidateListOptions` does: a bad combination is
/// 422 Invalid, with kube-apiserver's message.
fn list_options(
    shared: &Shared,
    query: &HashMap<String, String>,
    watch: bool,
) -> Result<Option<bool>, ApiError> {
    let get = |k: &str| query.get(k).map(String::as_str).unwrap_or("");
    let rv = get("resourceVersion");
    let cont = get("continue");
    let mut matched = get("resourceVersionMatch");
    let mut send = match query.get("sendInitialEvents") {
        None => None,
        Some(v) => Some(parse_bool(v).ok_or_else(|| {
            ApiError::bad_request(format!("sendInitialEvents: invalid boolean {v:?}"))
        })?),
    };
    if shared.watch_list && watch && send.is_none() && matched.is_empty() && matches!(rv, "" | "0")
    {
        send = Some(true);
        matched = "NotOlderThan";
    }
    // (field, reason, message) of each field.Error, in kube-apiserver's order.
    let mut errors: Vec<(&str, &str, String)> = Vec::new();
    let forbidden =
        |field, detail: &str| (field, "FieldValueForbidden", format!("Forbidden: {detail}"));
    let unsupported = |supported: &[&str]| {
        let values: Vec<String> = supported.iter().map(|v| format!("{v:?}")).collect();
        (
            "resourceVersionMatch",
            "FieldValueNotSupported",
            format!(
                "Unsupported value: {matched:?}: supported values: {}",
                values.join(", ")
            ),
        )
    };
    let rvm = "resourceVersionMatch";
    if watch {
        if send.is_some() {
            if matched != "NotOlderThan" {
                errors.push(forbidden(
                    rvm,
                    "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                ));
            }
            if !shared.watch_list {
                errors.push(forbidden(
                    "sendInitialEvents",
                    "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
                ));
            }
        }
        if !matched.is_empty() {
            if send.is_none() {
                errors.push(forbidden(
                    rvm,
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                ));
            }
            if matched != "NotOlderThan" {
                errors.push(unsupported(&["NotOlderThan"]));
            }
            if !cont.is_empty() {
                errors.push(forbidden(
                    rvm,
                    "resourceVersionMatch is forbidden when continue is provided",
                ));
            }
        }
    } else {
        if !matched.is_empty() {
            if rv.is_empty() {
                errors.push(forbidden(
                    rvm,
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                ));
            }
            if !cont.is_empty() {
                errors.push(forbidden(
                    rvm,
                    "resourceVersionMatch is forbidden when continue is provided",
                ));
            }
            if matched != "Exact" && matched != "NotOlderThan" {
                errors.push(unsupported(&["Exact", "NotOlderThan", ""]));
            }
            if matched == "Exact" && rv == "0" {
                errors.push(forbidden(
                    rvm,
                    "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                ));
            }
        }
        if send.is_some() {
            errors.push(forbidden(
                "sendInitialEvents",
                "sendInitialEvents is forbidden for list",
            ));
        }
    }
    if errors.is_empty() {
        return Ok(send);
    }
    let texts: Vec<String> = errors
        .iter()
        .map(|(field, _, message)| format!("{field}: {message}"))
        .collect();
    let aggregate = match texts.as_slice() {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    };
    let mut e = ApiError::new(
        422,
        "Invalid",
        format!("ListOptions.meta.k8s.io \"\" is invalid: {aggregate}"),
    );
    let causes: Vec<Value> = errors
        .iter()
        .map(|(field, reason, message)| json!({"reason": reason, "message": message, "field": field}))
        .collect();
    e.details = Some(json!({"group": "meta.k8s.io", "kind": "ListOptions", "causes": causes}));
    Err(e)
}

fn encode_continue(id: u64, rv: u64) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(format!("{id}:{rv}"))
}

fn decode_continue(token: &str) -> Result<(u64, u64), ApiError> {
    use base64::Engine;
    let bad = || ApiError::bad_request("invalid continue token");
    let raw = base64::engine::general_purpose::STANDARD
        .decode(token)
        .map_err(|_| bad())?;
    let text = String::from_utf8(raw).map_err(|_| bad())?;
    let (id, rv) = text.split_once(':').ok_or_else(bad)?;
    Ok((
        id.parse().map_err(|_| bad())?,
        rv.parse().map_err(|_| bad())?,
    ))
}

/// A watch: newline-delimited JSON events.
///
/// Mimics the watch cache: without a resourceVersion (or "0") it starts with ADDED for every
/// current object; from a resourceVersion it replays later writes, or sends one ERROR event with
/// a 410 Status when that version was compacted. MODIFIED events that move an object into or out
/// of the selection become ADDED or DELETED. BOOKMARKs carry a resourceVersion up to which every
/// event has been sent. The stream ends after `timeoutSeconds` or when `close_watches` is called.
fn watch_stream(
    ctx: &Ctx<'_>,
    namespace: Option<&str>,
    query: &HashMap<String, String>,
    fields: FieldSelector,
) -> ApiResult {
    let labels = label_selector(query)?;
    let resource = ctx.resource;
    let namespace = namespace.map(str::to_owned);
    let bookmarks = query
        .get("allowWatchBookmarks")
        .is_some_and(|v| v == "true");
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(1800));
    let send_initial_events = list_options(ctx.shared, query, true)?;
    let end_bookmark = bookmarks && !ctx.shared.drop_initial_events_end;
    let from: Option<u64> = match query.get("resourceVersion").map(String::as_str) {
        None | Some("") | Some("0") => None,
        Some(rv) => Some(
            rv.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv:?}")))?,
        ),
    };

    let filter = {
        let namespace = namespace.clone();
        move |e: &Event| -> Option<Value> {
            if e.resource.group != resource.group || e.resource.plural != resource.plural {
                return None;
            }
            let in_ns = |o: &Value| {
                namespace.as_deref().is_none_or(|ns| {
                    o.pointer("/metadata/namespace").and_then(Value::as_str) == Some(ns)
                })
            };
            let now = in_ns(&e.object) && selected(&e.object, &labels, &fields);
            let before = e
                .old
                .as_deref()
                .is_some_and(|o| in_ns(o) && selected(o, &labels, &fields));
            let kind = match (e.kind, before, now) {
                (EventType::Added, _, true) => EventType::Added,
                (EventType::Deleted, _, true) => EventType::Deleted,
                (EventType::Modified, true, true) => EventType::Modified,
                (EventType::Modified, false, true) => EventType::Added,
                (EventType::Modified, true, false) => EventType::Deleted,
                _ => return None,
            };
            Some(json!({"type": kind.as_str(), "object": *e.object}))
        }
    };

    let mut initial: Vec<Value> = Vec::new();
    // With sendInitialEvents=true, the version the initial events end at, for the bookmark.
    let mut initial_end: Option<u64> = None;
    let (mut rx, mut last_rv) = {
        let store = ctx.store();
        let rx = store.subscribe();
        match (send_initial_events, from) {
            // A watch list: the state not older than `from` (here: the current one) as ADDED
            // events, then a bookmark that says they are complete, then the changes after it.
            (Some(true), from) => {
                if let Some(rv) = from.filter(|rv| *rv > store.rv()) {
                    return Err(ApiError::new(
                        504,
                        "Timeout",
                        format!("Too large resource version: {rv}, current: {}", store.rv()),
                    ));
                }
                for obj in store.list(resource, namespace.as_deref()) {
                    let e = Event {
                        rv: 0,
                        resource,
                        kind: EventType::Added,
                        object: obj,
                        old: None,
                    };
                    initial.extend(filter(&e));
                }
                initial_end = Some(store.rv());
            }
            // No initial events: the changes from now on.
            (Some(false), None) => {}
            (None, None) => {
                for obj in store.list(resource, namespace.as_deref()) {
                    let e = Event {
                        rv: 0,
                        resource,
                        kind: EventType::Added,
                        object: obj,
                        old: None,
                    };
                    initial.extend(filter(&e));
                }
            }
            (_, Some(rv)) => match store.since(rv) {
                Some(events) => initial.extend(events.filter_map(&filter)),
                None if ctx.shared.silent_expired_watches => {
                    return Ok(stream_response(futures::stream::empty().boxed()));
                }
                None => {
                    let status = ApiError::gone(format!(
                        "too old resource version: {rv} ({})",
                        store.compacted()
                    ))
                    .status_body();
                    let error = line(&json!({"type": "ERROR", "object": status}));
                    return Ok(stream_response(
                        futures::stream::once(async move { error }).boxed(),
                    ));
                }
            },
        }
        (rx, store.rv())
    };

    let shared = ctx.shared.clone();
    let mut kill = shared.kill_watches.subscribe();
    let interval = shared.bookmark_interval;
    let kind = resource.kind;
    let api_version = resource.api_version();
    // The faults of watch lists.
    let break_after = initial_end.and(shared.break_initial_events_after);
    let close_after_end = initial_end.is_some() && shared.close_after_initial_events_end;
    let stream = async_stream(move |tx| async move {
        for (sent, e) in initial.into_iter().enumerate() {
            if break_after == Some(sent) {
                return;
            }
            if tx.send(line(&e)).await.is_err() {
                return;
            }
        }
        if let Some(rv) = initial_end.filter(|_| end_bookmark) {
            let bookmark = json!({"type": "BOOKMARK", "object": {
                "kind": kind, "apiVersion": api_version,
                "metadata": {
                    "resourceVersion": rv.to_string(),
                    "annotations": {"k8s.io/initial-events-end": "true"}
                }
            }});
            if tx.send(line(&bookmark)).await.is_err() || close_after_end {
                return;
            }
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval(interval);
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = &mut deadline => return,
                _ = kill.changed() => return,
                // The client went away.
                _ = tx.closed() => return,
                _ = ticker.tick(), if bookmarks => {
                    // Everything up to the store's version is already in the channel: drain it,
                    // then the bookmark's version is one the client has seen all events up to.
                    let rv = lock(&shared.store).rv();
                    loop {
                        match rx.try_recv() {
                            Ok(e) => {
                                last_rv = e.rv;
                                if let Some(v) = filter(&e)
                                    && tx.send(line(&v)).await.is_err()
                                {
                                    return;
                                }
                            }
                            Err(tokio::sync::broadcast::error::TryRecvError::Empty) => break,
                            Err(_) => return,
                        }
                    }
                    last_rv = last_rv.max(rv);
                    let bookmark = json!({"type": "BOOKMARK", "object": {
                        "kind": kind, "apiVersion": api_version,
                        "metadata": {"resourceVersion": last_rv.to_string()}
                    }});
                    if tx.send(line(&bookmark)).await.is_err() {
                        return;
                    }
                }
                e = rx.recv() => match e {
                    Ok(e) => {
                        last_rv = e.rv;
                        if let Some(v) = filter(&e)
                            && tx.send(line(&v)).await.is_err()
                        {
                            return;
                        }
                    }
                    // A watcher that falls this far behind is closed; the client re-watches.
                    Err(RecvError::Lagged(_)) | Err(RecvError::Closed) => return,
                },
            }
        }
    });
    Ok(stream_response(stream))
}

fn line(v: &Value) -> Bytes {
    let mut s = v.to_string();
    s.push('\n');
    Bytes::from(s)
}

/// A stream fed by a task through a small channel, ended when the task returns.
fn async_stream<F, Fut>(f: F) -> futures::stream::BoxStream<'static, Bytes>
where
    F: FnOnce(tokio::sync::mpsc::Sender<Bytes>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(f(tx));
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()
}

fn stream_response(stream: futures::stream::BoxStream<'static, Bytes>) -> Response {
    let body = Body::from_stream(stream.map(Ok::<_, Infallible>));
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body)
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

// ----- writes -----

fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    Ok(v)
}

fn meta(obj: &Value, field: &str) -> Option<String> {
    obj.get("metadata")?.get(field)?.as_str().map(str::to_owned)
}

fn meta_mut(obj: &mut Value) -> &mut serde_json::Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    obj["metadata"]
        .as_object_mut()
        .expect("metadata was just made an object")
}

/// Checks `kind`/`apiVersion` against the URL and fills them in when absent.
fn check_type(resource: &ResourceInfo, obj: &mut Value) -> Result<(), ApiError> {
    let api_version = resource.api_version();
    match obj.get("kind").and_then(Value::as_str) {
        None => obj["kind"] = json!(resource.kind),
        Some(k) if k == resource.kind => {}
        Some(k) => {
            return Err(ApiError::bad_request(format!(
                "the kind {k:?} of the body does not match the URL's {:?}",
                resource.kind
            )));
        }
    }
    match obj.get("apiVersion").and_then(Value::as_str) {
        None => obj["apiVersion"] = json!(api_version),
        Some(v) if v == api_version => {}
        Some(v) => {
            return Err(ApiError::bad_request(format!(
                "the apiVersion {v:?} of the body does not match the URL's {api_version:?}"
            )));
        }
    }
    Ok(())
}

/// Validation and normalisation every write gets, as the resources' registry strategies do.
fn normalize(resource: &ResourceInfo, name: &str, obj: &mut Value) -> Result<(), ApiError> {
    if !is_dns_subdomain(name) {
        return Err(ApiError::invalid(
            resource,
            name,
            format!(
                "metadata.name: Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'"
            ),
        ));
    }
    for field in ["labels", "annotations"] {
        match obj.pointer(&format!("/metadata/{field}")) {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) if m.values().all(Value::is_string) => {}
            Some(_) => {
                return Err(ApiError::bad_request(format!(
                    "metadata.{field} must be a map of strings"
                )));
            }
        }
    }
    match resource.kind {
        // The Secret strategy folds stringData into data.
        "Secret" => {
            use base64::Engine;
            let engine = base64::engine::general_purpose::STANDARD;
            if let Some(data) = obj.get("data").and_then(Value::as_object) {
                for (k, v) in data {
                    let ok = v.as_str().is_some_and(|s| engine.decode(s).is_ok());
                    if !ok {
                        return Err(ApiError::invalid(
                            resource,
                            name,
                            format!("data[{k}]: Invalid value: must be base64"),
                        ));
                    }
                }
            }
            if let Some(Value::Object(string_data)) =
                obj.as_object_mut().and_then(|o| o.remove("stringData"))
            {
                if !obj.get("data").is_some_and(Value::is_object) {
                    obj["data"] = json!({});
                }
                for (k, v) in string_data {
                    let s = v.as_str().ok_or_else(|| {
                        ApiError::invalid(
                            resource,
                            name,
                            format!("stringData[{k}]: must be a string"),
                        )
                    })?;
                    obj["data"][k] = json!(engine.encode(s));
                }
            }
        }
        "ConfigMap" => {
            if let (Some(Value::Object(d)), Some(Value::Object(b))) =
                (obj.get("data"), obj.get("binaryData"))
                && let Some(k) = d.keys().find(|k| b.contains_key(*k))
            {
                return Err(ApiError::invalid(
                    resource,
                    name,
                    format!("data[{k}]: Invalid value: duplicate of key present in binaryData"),
                ));
            }
            if let Some(Value::Object(d)) = obj.get("data")
                && let Some((k, _)) = d.iter().find(|(_, v)| !v.is_string())
            {
                return Err(ApiError::bad_request(format!(
                    "ConfigMap data[{k}] must be a string"
                )));
            }
        }
        // ValidateMutatingWebhookConfiguration: each webhook's name is a fully qualified domain
        // name of at least three segments.
        "MutatingWebhookConfiguration" => {
            for (i, webhook) in obj
                .get("webhooks")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                let hook = webhook.get("name").and_then(Value::as_str).unwrap_or("");
                if !is_dns_subdomain(hook) || hook.split('.').count() < 3 {
                    return Err(ApiError::invalid(
                        resource,
                        name,
                        format!(
                            "webhooks[{i}].name: Invalid value: {hook:?}: should be a domain with at least three segments separated by dots"
                        ),
                    ));
                }
            }
        }
        "Namespace" if resource.group.is_empty() => {
            // Defaulting (SetDefaults_Namespace) and the strategy's Canonicalize, before and
            // after admission: every Namespace is labelled with its own name.
            let m = meta_mut(obj);
            if !m.get("labels").is_some_and(Value::is_object) {
                m.insert("labels".into(), json!({}));
            }
            m["labels"]["kubernetes.io/metadata.name"] = json!(name);
        }
        _ => {}
    }
    Ok(())
}

fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

fn now() -> String {
    // RFC 3339 seconds, as metadata timestamps are.
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a calendar date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Labels of the namespace a write is in (for a Namespace, its own), for namespaceSelectors, as
/// the webhook dispatcher reads them: from its lagging view of the Namespaces.
fn namespace_labels(ctx: &Ctx<'_>, name: &str) -> BTreeMap<String, String> {
    let namespace = if is_namespace(ctx.resource) {
        name
    } else {
        ctx.namespace
    };
    ctx.namespace_view(namespace)
        .map(|ns| labels_of(&ns))
        .unwrap_or_default()
}

fn is_namespace(resource: &ResourceInfo) -> bool {
    resource.group.is_empty() && resource.kind == "Namespace"
}

fn webhook_configurations(ctx: &Ctx<'_>) -> Vec<Value> {
    let resource = RESOURCES
        .iter()
        .find(|r| r.kind == "MutatingWebhookConfiguration")
        .expect("the stand-in serves mutatingwebhookconfigurations");
    ctx.store()
        .list(resource, None)
        .into_iter()
        .map(|v| (*v).clone())
        .collect()
}

/// Runs the mutating admission chain on `object`.
async fn admit(
    ctx: &Ctx<'_>,
    operation: Operation,
    name: &str,
    object: Value,
    old: Option<&Value>,
) -> Result<Value, ApiError> {
    let configurations = webhook_configurations(ctx);
    let namespace_labels = namespace_labels(ctx, name);
    let input = AdmissionInput {
        resource: ctx.resource,
        operation,
        namespace: ctx.resource.namespaced.then_some(ctx.namespace),
        name,
        object,
        old_object: old,
        namespace_labels,
        dry_run: ctx.dry_run,
        user: ctx.user,
    };
    match admission::mutate(&configurations, input).await {
        Ok(outcome) => {
            lock(&ctx.shared.webhook_calls)
                .extend(outcome.calls.into_iter().zip(outcome.durations));
            Ok(outcome.object)
        }
        Err(AdmissionError::Denied { code, message, .. }) => {
            Err(ApiError::new(code, "Forbidden", message))
        }
        Err(AdmissionError::Failed { message, .. }) => Err(ApiError::new(
            500,
            "InternalError",
            format!("Internal error occurred: {message}"),
        )),
    }
}

/// How the field manager records a write.
#[derive(Debug, Clone, Copy)]
enum FieldOp<'a> {
    /// A create, update or non-apply patch: operation `Update`.
    Update,
    /// A server-side apply of this configuration: operation `Apply`.
    Apply(&'a Value),
}

/// The managedFields of a write by `ctx`'s manager from `live` (None: a create) to `obj`, as
/// the field manager computes them before admission.
fn record_fields(ctx: &Ctx<'_>, op: FieldOp<'_>, live: Option<&Value>, obj: &mut Value) {
    let now = now();
    let api_version = ctx.resource.api_version();
    let write = ctx.field_write(&api_version, &now);
    let entries = match op {
        FieldOp::Update => managed::update(&write, live, obj),
        FieldOp::Apply(applied) => managed::apply(&write, live, obj, applied),
    };
    let m = meta_mut(obj);
    if entries.is_empty() {
        m.remove("managedFields");
    } else {
        m.insert("managedFields".into(), managed::to_json(&entries));
    }
}

/// Puts the managedFields computed before admission back: webhooks do not change them here.
fn keep_managed_fields(from: &Value, to: &mut Value) {
    let fields = from.pointer("/metadata/managedFields").cloned();
    let m = meta_mut(to);
    match fields {
        Some(f) => m.insert("managedFields".into(), f),
        None => m.remove("managedFields"),
    };
}

/// kube-apiserver's `IgnoreManagedFieldsTimestampsTransformer`, after admission: a write whose
/// object differs from the stored one only in managedFields timestamps keeps the stored ones,
/// so that it writes nothing.
fn ignore_managed_fields_timestamps(existing: &Value, obj: &mut Value) {
    let (Some(old), Some(new)) = (
        existing.pointer("/metadata/managedFields"),
        obj.pointer("/metadata/managedFields"),
    ) else {
        return;
    };
    if old == new || !managed::equal_but_for_time(old, new) {
        return;
    }
    let mut probe = obj.clone();
    meta_mut(&mut probe).insert("managedFields".into(), old.clone());
    if probe == *existing {
        *obj = probe;
    }
}

/// Server-set fields of a new object, as the strategies' PrepareForCreate and BeforeCreate set
/// them after admission.
fn prepare_for_create(resource: &ResourceInfo, obj: &mut Value) {
    let m = meta_mut(obj);
    m.remove("deletionTimestamp");
    m.remove("deletionGracePeriodSeconds");
    if resource.generation {
        m.insert("generation".into(), json!(1));
    }
    if is_namespace(resource) {
        // A new Namespace is Active and carries the `kubernetes` finalizer, which the namespace
        // controller removes once it has emptied a deleted namespace.
        obj["status"] = json!({"phase": "Active"});
        if !obj.get("spec").is_some_and(Value::is_object) {
            obj["spec"] = json!({});
        }
        let finalizers = obj["spec"]
            .as_object_mut()
            .expect("spec was just made an object")
            .entry("finalizers")
            .or_insert_with(|| json!([]));
        if !finalizers.is_array() {
            *finalizers = json!([]);
        }
        if let Some(list) = finalizers.as_array_mut()
            && !list.iter().any(|f| f == "kubernetes")
        {
            list.push(json!("kubernetes"));
        }
    }
}

/// NamespaceLifecycle's refusal of a create in a terminating namespace.
fn terminating(resource: &ResourceInfo, name: &str, namespace: &str) -> ApiError {
    let mut e = ApiError::new(
        403,
        "Forbidden",
        format!(
            "{} \"{name}\" is forbidden: unable to create new content in namespace {namespace} \
             because it is being terminated",
            qualified(resource)
        ),
    );
    e.details = Some(json!({
        "name": name,
        "group": resource.group,
        "kind": resource.plural,
        "causes": [{
            "reason": "NamespaceTerminating",
            "message": format!("namespace {namespace} is being terminated"),
            "field": "metadata.namespace",
        }],
    }));
    e
}

async fn create(ctx: &Ctx<'_>, body: &[u8]) -> ApiResult {
    let obj = parse_body(body)?;
    create_object(ctx, obj, FieldOp::Update).await
}

async fn create_object(ctx: &Ctx<'_>, mut obj: Value, op: FieldOp<'_>) -> ApiResult {
    check_type(ctx.resource, &mut obj)?;
    if let Some(ns) = meta(&obj, "namespace").filter(|ns| !ns.is_empty())
        && ctx.resource.namespaced
        && ns != ctx.namespace
    {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    if meta(&obj, "resourceVersion").is_some_and(|rv| !rv.is_empty()) {
        return Err(ApiError::new(
            500,
            "InternalError",
            "resourceVersion should not be set on objects to be created",
        ));
    }
    let name = match (meta(&obj, "name"), meta(&obj, "generateName")) {
        (Some(n), _) if !n.is_empty() => n,
        (_, Some(prefix)) if !prefix.is_empty() => format!("{prefix}{}", ctx.store().name_suffix()),
        _ => {
            return Err(ApiError::invalid(
                ctx.resource,
                "",
                "metadata.name: Required value: name or generateName is required",
            ));
        }
    };
    if ctx.resource.namespaced {
        // NamespaceLifecycle, the first admission plugin: no content in a namespace that does
        // not exist, and no new content in one being terminated (as its lagging view says).
        let exists = ctx
            .store()
            .get(&Key::new(namespace_resource(), "", ctx.namespace))
            .is_some();
        if !exists {
            return Err(ApiError::not_found(namespace_resource(), ctx.namespace));
        }
        let phase = ctx
            .namespace_view(ctx.namespace)
            .and_then(|ns| ns.pointer("/status/phase").cloned());
        if phase.as_ref().and_then(Value::as_str) == Some("Terminating") {
            return Err(terminating(ctx.resource, &name, ctx.namespace));
        }
    }
    {
        let uid = ctx.store().uid();
        let m = meta_mut(&mut obj);
        m.insert("name".into(), json!(name));
        if ctx.resource.namespaced {
            m.insert("namespace".into(), json!(ctx.namespace));
        } else {
            m.remove("namespace");
        }
        m.insert("uid".into(), json!(uid));
        m.insert("creationTimestamp".into(), json!(now()));
    }
    prepare_for_create(ctx.resource, &mut obj);
    normalize(ctx.resource, &name, &mut obj)?;
    record_fields(ctx, op, None, &mut obj);
    let mut admitted = admit(ctx, Operation::Create, &name, obj.clone(), None).await?;
    check_type(ctx.resource, &mut admitted)?;
    restore_identity(&obj, &mut admitted);
    prepare_for_create(ctx.resource, &mut admitted);
    keep_managed_fields(&obj, &mut admitted);
    normalize(ctx.resource, &name, &mut admitted)?;
    let key = ctx.key(&name);
    let mut store = ctx.store();
    if store.get(&key).is_some() {
        let mut e = ApiError::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(ctx.resource)),
        );
        e.details =
            Some(json!({"name": name, "group": ctx.resource.group, "kind": ctx.resource.plural}));
        return Err(e);
    }
    if ctx.dry_run {
        return Ok(ok_json(StatusCode::CREATED, &admitted));
    }
    let stored = store
        .write(ctx.resource, key, Some(admitted))
        .expect("a write returns the stored object");
    Ok(ok_json(StatusCode::CREATED, &stored))
}

/// Server-owned identity that no client or webhook may change.
fn restore_identity(from: &Value, to: &mut Value) {
    let keep: Vec<(&str, Value)> = ["name", "namespace", "uid", "creationTimestamp"]
        .into_iter()
        .filter_map(|f| from.get("metadata")?.get(f).map(|v| (f, v.clone())))
        .collect();
    let m = meta_mut(to);
    for (f, v) in keep {
        m.insert(f.into(), v);
    }
}

async fn update(ctx: &Ctx<'_>, name: &str, body: &[u8]) -> ApiResult {
    let mut obj = parse_body(body)?;
    check_type(ctx.resource, &mut obj)?;
    match meta(&obj, "name") {
        Some(n) if n == name => {}
        other => {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                other.unwrap_or_default()
            )));
        }
    }
    let precondition = meta(&obj, "resourceVersion").filter(|rv| !rv.is_empty());
    write_loop(ctx, name, precondition, FieldOp::Update, move |_existing| {
        Ok(obj.clone())
    })
    .await
}

async fn patch(
    ctx: &Ctx<'_>,
    name: &str,
    content_type: &str,
    manager: Option<&str>,
    body: &[u8],
) -> ApiResult {
    let media = content_type.split(';').next().unwrap_or("").trim();
    let strategic_type = schema::root(ctx.resource.group, ctx.resource.kind);
    let patch: Value = match media {
        "application/apply-patch+yaml" => {
            if manager.is_none_or(str::is_empty) {
                return Err(ApiError::bad_request(
                    "PATCH, application/apply-patch+yaml requires fieldManager to be specified",
                ));
            }
            let text = std::str::from_utf8(body)
                .map_err(|_| ApiError::bad_request("the apply body is not UTF-8"))?;
            serde_saphyr::from_str(text).map_err(|e| {
                ApiError::bad_request(format!("the apply body is not valid YAML: {e}"))
            })?
        }
        "application/strategic-merge-patch+json" if strategic_type.is_none() => {
            // Custom resources have no patch strategies: kube-apiserver does not offer this type.
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml; got {media:?}"
                ),
            ));
        }
        "application/merge-patch+json"
        | "application/json-patch+json"
        | "application/strategic-merge-patch+json" => serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("the patch is not valid JSON: {e}")))?,
        other => {
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json; got {other:?}"
                ),
            ));
        }
    };
    if media == "application/apply-patch+yaml" {
        if !patch.is_object() {
            return Err(ApiError::bad_request(
                "the applied configuration must be an object",
            ));
        }
        let exists = ctx.store().get(&ctx.key(name)).is_some();
        if !exists {
            // Server-side apply creates what does not exist.
            let mut obj = patch.clone();
            meta_mut(&mut obj).insert("name".into(), json!(name));
            return create_object(ctx, obj, FieldOp::Apply(&patch)).await;
        }
    }
    let resource = ctx.resource;
    let op = if media == "application/apply-patch+yaml" {
        FieldOp::Apply(&patch)
    } else {
        FieldOp::Update
    };
    write_loop(ctx, name, None, op, |existing| {
        let mut out = existing.clone();
        match media {
            "application/merge-patch+json" => patches::merge(&mut out, &patch),
            "application/json-patch+json" => {
                patches::json(&mut out, &patch).map_err(|e| ApiError::invalid(resource, name, e))?
            }
            "application/strategic-merge-patch+json" => {
                let ty = strategic_type.unwrap_or(schema::Ty::Unknown);
                patches::strategic(&mut out, &patch, ty).map_err(|e| match e.code {
                    400 => ApiError::bad_request(e.message),
                    _ => ApiError::new(422, "Invalid", e.message),
                })?
            }
            _ => out = patches::apply(Some(existing), &patch),
        }
        if !out.is_object() {
            return Err(ApiError::invalid(
                resource,
                name,
                "the patched object is not an object",
            ));
        }
        Ok(out)
    })
    .await
}

/// The read-modify-write of an UPDATE or PATCH, as kube-apiserver's GuaranteedUpdate: read the
/// stored object, compute the new one, record it in managedFields, run admission, apply the
/// strategy, and store it only if nothing was written in between; otherwise retry (or 409 when
/// the client gave a resourceVersion precondition).
///
/// A write whose result equals the stored object stores nothing and bumps no resourceVersion
/// (admission still runs), as the etcd3 store skips identical writes. Because managedFields are
/// recorded before admission, a request that changed a field writes even when a webhook changed
/// it back, unless only managedFields timestamps would differ (see
/// `ignore_managed_fields_timestamps`).
async fn write_loop(
    ctx: &Ctx<'_>,
    name: &str,
    precondition: Option<String>,
    op: FieldOp<'_>,
    mut compute: impl FnMut(&Value) -> Result<Value, ApiError>,
) -> ApiResult {
    let key = ctx.key(name);
    for _ in 0..10 {
        let existing = ctx
            .store()
            .get(&key)
            .ok_or_else(|| ApiError::not_found(ctx.resource, name))?;
        let existing_rv = meta(&existing, "resourceVersion").unwrap_or_default();
        if precondition.as_ref().is_some_and(|rv| *rv != existing_rv) {
            return Err(ApiError::conflict(ctx.resource, name));
        }
        let mut obj = compute(&existing)?;
        check_type(ctx.resource, &mut obj)?;
        // A patch that sets a different resourceVersion is a precondition too.
        if let Some(rv) = meta(&obj, "resourceVersion").filter(|rv| !rv.is_empty())
            && rv != existing_rv
        {
            return Err(ApiError::conflict(ctx.resource, name));
        }
        if let Some(uid) = meta(&obj, "uid").filter(|u| !u.is_empty())
            && Some(&uid) != meta(&existing, "uid").as_ref()
        {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta(&existing, "uid").unwrap_or_default()
                ),
            ));
        }
        restore_identity(&existing, &mut obj);
        normalize(ctx.resource, name, &mut obj)?;
        record_fields(ctx, op, Some(&existing), &mut obj);
        let mut admitted =
            admit(ctx, Operation::Update, name, obj.clone(), Some(&existing)).await?;
        check_type(ctx.resource, &mut admitted)?;
        restore_identity(&existing, &mut admitted);
        carry_server_fields(ctx.resource, &existing, &mut admitted);
        keep_managed_fields(&obj, &mut admitted);
        normalize(ctx.resource, name, &mut admitted)?;

        let mut store = ctx.store();
        let current = store
            .get(&key)
            .ok_or_else(|| ApiError::not_found(ctx.resource, name))?;
        if meta(&current, "resourceVersion").unwrap_or_default() != existing_rv {
            if precondition.is_some() {
                return Err(ApiError::conflict(ctx.resource, name));
            }
            continue;
        }
        meta_mut(&mut admitted).insert("resourceVersion".into(), json!(existing_rv));
        ignore_managed_fields_timestamps(&existing, &mut admitted);
        if admitted == *existing || ctx.dry_run {
            return Ok(ok_json(StatusCode::OK, &admitted));
        }
        let stored = store
            .write(ctx.resource, key, Some(admitted))
            .expect("a write returns the stored object");
        return Ok(ok_json(StatusCode::OK, &stored));
    }
    Err(ApiError::conflict(ctx.resource, name))
}

/// `PUT .../{name}/status`: the object's `status` replaced by the body's (see `write_status`).
fn update_status(ctx: &Ctx<'_>, name: &str, body: &[u8]) -> ApiResult {
    let mut obj = parse_body(body)?;
    check_type(ctx.resource, &mut obj)?;
    if meta(&obj, "name").as_deref() != Some(name) {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            meta(&obj, "name").unwrap_or_default()
        )));
    }
    write_status(ctx, name, move |_| Ok(obj))
}

/// `PATCH .../{name}/status` (merge, JSON or strategic merge patch): the patch is applied to the
/// whole object and only the `status` of the result is kept (see `write_status`).
fn patch_status(ctx: &Ctx<'_>, name: &str, content_type: &str, body: &[u8]) -> ApiResult {
    let media = content_type.split(';').next().unwrap_or("").trim();
    let strategic_type = schema::root(ctx.resource.group, ctx.resource.kind);
    let patch: Value = match media {
        "application/merge-patch+json" | "application/json-patch+json" => {
            serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("the patch is not valid JSON: {e}")))?
        }
        "application/strategic-merge-patch+json" if strategic_type.is_some() => {
            serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("the patch is not valid JSON: {e}")))?
        }
        other => {
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "the stand-in's status subresource takes application/merge-patch+json, application/json-patch+json and (built-in kinds) application/strategic-merge-patch+json; got {other:?}"
                ),
            ));
        }
    };
    let resource = ctx.resource;
    write_status(ctx, name, |existing| {
        let mut out = existing.clone();
        match media {
            "application/merge-patch+json" => patches::merge(&mut out, &patch),
            "application/json-patch+json" => {
                patches::json(&mut out, &patch).map_err(|e| ApiError::invalid(resource, name, e))?
            }
            _ => {
                let ty = strategic_type.unwrap_or(schema::Ty::Unknown);
                patches::strategic(&mut out, &patch, ty).map_err(|e| match e.code {
                    400 => ApiError::bad_request(e.message),
                    _ => ApiError::new(422, "Invalid", e.message),
                })?
            }
        }
        Ok(out)
    })
}

/// A write of the status subresource, as the registry's status strategies make it: of the object
/// `compute` returns, only `status` is kept; spec and metadata stay as stored (labels,
/// annotations, generation and managedFields included). No admission webhook is called (the
/// configurations here match main resources only). The resourceVersion is bumped and watches get
/// a MODIFIED event; a write that leaves `status` as it is stores nothing. A resourceVersion or
/// uid in the computed object is a precondition, as on the main resource.
fn write_status(
    ctx: &Ctx<'_>,
    name: &str,
    compute: impl FnOnce(&Value) -> Result<Value, ApiError>,
) -> ApiResult {
    let key = ctx.key(name);
    let mut store = ctx.store();
    let existing = store
        .get(&key)
        .ok_or_else(|| ApiError::not_found(ctx.resource, name))?;
    let written = compute(&existing)?;
    if !written.is_object() {
        return Err(ApiError::invalid(
            ctx.resource,
            name,
            "the patched object is not an object",
        ));
    }
    let existing_rv = meta(&existing, "resourceVersion").unwrap_or_default();
    if meta(&written, "resourceVersion").is_some_and(|rv| !rv.is_empty() && rv != existing_rv) {
        return Err(ApiError::conflict(ctx.resource, name));
    }
    if meta(&written, "uid")
        .is_some_and(|uid| !uid.is_empty() && Some(&uid) != meta(&existing, "uid").as_ref())
    {
        return Err(ApiError::conflict(ctx.resource, name));
    }
    let mut obj = (*existing).clone();
    match written.get("status") {
        Some(status) if !status.is_null() => obj["status"] = status.clone(),
        _ => {
            if let Some(o) = obj.as_object_mut() {
                o.remove("status");
            }
        }
    }
    if obj == *existing || ctx.dry_run {
        return Ok(ok_json(StatusCode::OK, &obj));
    }
    let stored = store
        .write(ctx.resource, key, Some(obj))
        .expect("a write returns the stored object");
    Ok(ok_json(StatusCode::OK, &stored))
}

/// What the registry strategies do on update after mutating admission (BeforeUpdate and
/// PrepareForUpdate): `deletionTimestamp` never changes; `status` is left to the status
/// subresource, so a main-resource write keeps the stored one; a Namespace keeps its
/// `spec.finalizers`; `generation` is bumped when `spec` changes, and for a Deployment also
/// when its annotations change (they are copied to its ReplicaSets). Computed on the object as
/// admission left it.
fn carry_server_fields(resource: &ResourceInfo, existing: &Value, obj: &mut Value) {
    let deletion = existing.pointer("/metadata/deletionTimestamp").cloned();
    let m = meta_mut(obj);
    match deletion {
        Some(t) => m.insert("deletionTimestamp".into(), t),
        None => m.remove("deletionTimestamp"),
    };
    let keep_status = |obj: &mut Value| match existing.get("status") {
        Some(s) => obj["status"] = s.clone(),
        None => {
            if let Some(o) = obj.as_object_mut() {
                o.remove("status");
            }
        }
    };
    if resource.generation {
        let generation = existing
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        // apiequality.Semantic.DeepEqual: an empty map equals an absent one.
        let annotations = |o: &Value| {
            o.pointer("/metadata/annotations")
                .and_then(Value::as_object)
                .filter(|a| !a.is_empty())
                .cloned()
        };
        let changed = existing.get("spec") != obj.get("spec")
            || (resource.kind == "Deployment" && annotations(existing) != annotations(obj));
        let bumped = if changed { generation + 1 } else { generation };
        meta_mut(obj).insert("generation".into(), json!(bumped));
        keep_status(obj);
    }
    if is_namespace(resource) {
        keep_status(obj);
        let finalizers = existing.pointer("/spec/finalizers").cloned();
        match (
            finalizers,
            obj.get_mut("spec").and_then(Value::as_object_mut),
        ) {
            (Some(f), Some(spec)) => {
                spec.insert("finalizers".into(), f);
            }
            (Some(f), None) => obj["spec"] = json!({ "finalizers": f }),
            (None, Some(spec)) => {
                spec.remove("finalizers");
            }
            (None, None) => {}
        }
    }
}

async fn delete(ctx: &Ctx<'_>, name: &str, body: &[u8]) -> ApiResult {
    let options: Value = if body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("DeleteOptions are not valid JSON: {e}")))?
    };
    let key = ctx.key(name);
    let existing = ctx
        .store()
        .get(&key)
        .ok_or_else(|| ApiError::not_found(ctx.resource, name))?;
    for (field, what) in [("resourceVersion", "ResourceVersion"), ("uid", "UID")] {
        if let Some(want) = options
            .pointer(&format!("/preconditions/{field}"))
            .and_then(Value::as_str)
            && Some(want) != meta(&existing, field).as_deref()
        {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!(
                    "Precondition failed: {what} in precondition: {want}, {what} in object meta: {}",
                    meta(&existing, field).unwrap_or_default()
                ),
            ));
        }
    }
    admit(ctx, Operation::Delete, name, Value::Null, Some(&existing)).await?;
    if is_namespace(ctx.resource) {
        return terminate_namespace(ctx, name);
    }
    if ctx.dry_run {
        return Ok(ok_json(StatusCode::OK, &existing));
    }
    let mut store = ctx.store();
    let deleted = store
        .write(ctx.resource, key, None)
        .expect("a delete returns the last state");
    Ok(ok_json(StatusCode::OK, &deleted))
}

/// The DELETE of a Namespace, as the namespace registry answers it: the first one marks it
/// Terminating (`deletionTimestamp`, `status.phase`: a MODIFIED event) and answers 200 with it;
/// the namespace controller then empties it in the background (see `empty_namespace`). A DELETE
/// of a Namespace already terminating answers it as it is.
fn terminate_namespace(ctx: &Ctx<'_>, name: &str) -> ApiResult {
    let key = ctx.key(name);
    let mut store = ctx.store();
    let current = store
        .get(&key)
        .ok_or_else(|| ApiError::not_found(ctx.resource, name))?;
    if current.pointer("/metadata/deletionTimestamp").is_some() {
        return Ok(ok_json(StatusCode::OK, &current));
    }
    let mut terminating = (*current).clone();
    meta_mut(&mut terminating).insert("deletionTimestamp".into(), json!(now()));
    if !terminating.get("status").is_some_and(Value::is_object) {
        terminating["status"] = json!({});
    }
    terminating["status"]["phase"] = json!("Terminating");
    if ctx.dry_run {
        return Ok(ok_json(StatusCode::OK, &terminating));
    }
    let uid = meta(&terminating, "uid").unwrap_or_default();
    let stored = store
        .write(ctx.resource, key, Some(terminating))
        .expect("a write returns the stored object");
    drop(store);
    let task = tokio::spawn(empty_namespace(ctx.shared.clone(), name.to_owned(), uid));
    let mut background = lock(&ctx.shared.background);
    background.retain(|t| !t.is_finished());
    background.push(task);
    Ok(ok_json(StatusCode::OK, &stored))
}

/// The namespace controller emptying a terminating Namespace: its objects are deleted one at a
/// time (each a DELETED event), spread over `Options::namespace_termination`, kinds in the
/// order the stand-in serves them; then anything created meanwhile (a create that a lagging
/// view let through); then the status conditions are set (MODIFIED) and the `kubernetes`
/// finalizer removed, which deletes the Namespace (DELETED, last).
async fn empty_namespace(shared: Arc<Shared>, name: String, uid: String) {
    let content = |store: &Store| -> Vec<(&'static ResourceInfo, String)> {
        RESOURCES
            .iter()
            .filter(|r| r.namespaced)
            .flat_map(|r| {
                store
                    .list(r, Some(&name))
                    .into_iter()
                    .map(move |o| (r, meta(&o, "name").unwrap_or_default()))
            })
            .collect()
    };
    let count = content(&lock(&shared.store)).len();
    let step = shared.namespace_termination / (count as u32 + 1);
    for _ in 0..count {
        tokio::time::sleep(step).await;
        let mut store = lock(&shared.store);
        if let Some((resource, object)) = content(&store).into_iter().next() {
            store.write(resource, Key::new(resource, &name, &object), None);
        }
    }
    tokio::time::sleep(step).await;
    let mut store = lock(&shared.store);
    for (resource, object) in content(&store) {
        store.write(resource, Key::new(resource, &name, &object), None);
    }
    let key = Key::new(namespace_resource(), "", &name);
    let Some(namespace) = store.get(&key) else {
        return;
    };
    if meta(&namespace, "uid").as_deref() != Some(uid.as_str()) {
        return;
    }
    let mut namespace = (*namespace).clone();
    let at = now();
    let condition = |kind: &str, reason: &str, message: &str| {
        json!({
            "type": kind,
            "status": "False",
            "lastTransitionTime": at,
            "reason": reason,
            "message": message,
        })
    };
    namespace["status"]["conditions"] = json!([
        condition(
            "NamespaceDeletionDiscoveryFailure",
            "ResourcesDiscovered",
            "All resources successfully discovered"
        ),
        condition(
            "NamespaceDeletionGroupVersionParsingFailure",
            "ParsedGroupVersions",
            "All legacy kube types successfully parsed"
        ),
        condition(
            "NamespaceDeletionContentFailure",
            "ContentDeleted",
            "All content successfully deleted, may be waiting on finalization"
        ),
        condition(
            "NamespaceContentRemaining",
            "ContentRemoved",
            "All content successfully removed"
        ),
        condition(
            "NamespaceFinalizersRemaining",
            "ContentHasNoFinalizers",
            "All content-preserving finalizers finished"
        ),
    ]);
    let resource = namespace_resource();
    store.write(resource, key.clone(), Some(namespace.clone()));
    if namespace.get("spec").is_some_and(Value::is_object) {
        namespace["spec"]["finalizers"] = json!([]);
    }
    store.delete_as(resource, key, namespace);
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
    use kube::Api;
    use kube::api::{ObjectMeta, PostParams};

    use super::*;

    fn named<T: Default>(name: &str, with_meta: impl FnOnce(ObjectMeta) -> T) -> T {
        with_meta(ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        })
    }

    fn status_of(e: &kube::Error) -> Option<u16> {
        match e {
            kube::Error::Api(s) => Some(s.code),
            _ => None,
        }
    }

    #[tokio::test]
    async fn fail_fraction_fails_about_that_share_of_matching_requests_and_records_them() {
        let server = ApiServer::start().await;
        let client = server.client();
        Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &named("ns", |metadata| Namespace {
                    metadata,
                    ..Default::default()
                }),
            )
            .await
            .unwrap();
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "ns");
        let secrets: Api<Secret> = Api::namespaced(client.clone(), "ns");
        cms.create(
            &PostParams::default(),
            &named("cm", |metadata| ConfigMap {
                metadata,
                ..Default::default()
            }),
        )
        .await
        .unwrap();
        secrets
            .create(
                &PostParams::default(),
                &named("s", |metadata| Secret {
                    metadata,
                    ..Default::default()
                }),
            )
            .await
            .unwrap();

        server.fail_fraction(Some("get"), Some("configmaps"), 0.25, 500);
        let mut failed = 0;
        for _ in 0..400 {
            match cms.get("cm").await {
                Ok(_) => {}
                Err(e) => {
                    // Not retried by kube's client (it retries 429, 503 and 504 only).
                    assert_eq!(status_of(&e), Some(500), "{e}");
                    failed += 1;
                }
            }
            // Other resources and verbs are not touched.
            secrets.get("s").await.unwrap();
            cms.list(&Default::default()).await.unwrap();
        }
        // Binomial(400, 0.25): mean 100, standard deviation about 8.7.
        assert!((60..=140).contains(&failed), "{failed} of 400 failed");

        let injected = server.injected_faults();
        assert_eq!(injected.len(), failed);
        for f in &injected {
            assert_eq!(
                (f.verb.as_str(), f.resource.as_str(), f.status),
                ("get", "configmaps", 500)
            );
            assert_eq!(f.namespace.as_deref(), Some("ns"));
            assert_eq!(f.name.as_deref(), Some("cm"));
        }
        assert!(injected.windows(2).all(|w| w[0].at <= w[1].at));

        // fail_next still fails exactly the next matching requests, and is recorded too.
        server.fail_next(Some("get"), Some("secrets"), 2, 500);
        assert_eq!(status_of(&secrets.get("s").await.unwrap_err()), Some(500));
        assert_eq!(status_of(&secrets.get("s").await.unwrap_err()), Some(500));
        secrets.get("s").await.unwrap();
        let injected = server.injected_faults();
        assert_eq!(injected.len(), failed + 2);
        assert_eq!(injected[failed].resource, "secrets");
    }

    #[tokio::test]
    async fn fail_fraction_zero_and_one_and_clear_faults() {
        let server = ApiServer::start().await;
        let client = server.client();
        let namespaces: Api<Namespace> = Api::all(client);
        server.fail_fraction(Some("get"), Some("namespaces"), 0.0, 500);
        for _ in 0..50 {
            // NotFound, never the injected 500.
            let e = namespaces.get("absent").await.unwrap_err();
            assert_eq!(status_of(&e), Some(404));
        }
        server.fail_fraction(Some("get"), Some("namespaces"), 1.0, 500);
        for _ in 0..50 {
            let e = namespaces.get("absent").await.unwrap_err();
            assert_eq!(status_of(&e), Some(500));
        }
        assert_eq!(server.injected_faults().len(), 50);
        server.clear_faults();
        let e = namespaces.get("absent").await.unwrap_err();
        assert_eq!(status_of(&e), Some(404));
        assert_eq!(server.injected_faults().len(), 50);
    }
}

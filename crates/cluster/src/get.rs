//! GETs of single objects by path, for the webhook's lookups: the API server's answer as it
//! comes, on connections the asking task drives itself.
//!
//! A review reads up to 16 objects at once by name (the webhook's `MAX_CONCURRENT_READS`), and
//! the answer's body is read by the caller within the review memory budget and never quoted. Through `kube::Client`, each GET would also cross a buffer to a worker task,
//! open a tracing span, pass a retry policy and the sanitizing layer (whose work on a body the
//! caller reads is nothing), and go through hyper's pooled client, which runs every connection in
//! a task of its own: several hops between tasks, and often between threads, per GET. None of
//! it is needed here. [`Getter`] keeps what the cluster does need, all taken from kube's own
//! configuration:
//! - the API server's address (with the path prefix a kubeconfig may carry), TLS as kube sets it
//!   up (the cluster's CA, a client certificate, `tls-server-name`), the connect timeout;
//! - credentials through kube's own authentication layer, so they stay fresh exactly as kube
//!   keeps them: a token file (a bound service account token, rotated by the kubelet) is read
//!   again at least once a minute, an exec plugin runs again before its token expires;
//! - the impersonation headers a kubeconfig may set.
//!
//! Idle HTTP/1.1 connections wait in a small pool. A GET takes one (or opens one), and the task
//! that asked drives it until the answer's body is read to its end; only then does the connection
//! go back. A GET dropped before that (the review's deadline passed) drops its connection. A GET
//! on a pooled connection that the server closed meanwhile is sent once more on a new one: GETs
//! are idempotent.
//!
//! A kubeconfig with a proxy is served through `kube::Client` instead ([`Getter::from_client`]),
//! as is a getter built from a client alone.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use http::header::{ACCEPT, HOST, USER_AGENT};
use http::{HeaderValue, Request, Response, Uri};
use http_body_util::Empty;
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::client::conn::http1;
use hyper_util::client::legacy::connect::HttpConnector;
use kube::client::ConfigExt;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, ServiceBuilder, ServiceExt};

use crate::client::Reads;

/// Idle connections kept for later GETs; more than this are closed once their answer is read.
/// The webhook's shared cap on reads in flight bounds how many are open at once; keeping as many
/// idle as it allows means a burst after a lull opens no new connection (closing and opening
/// them under load cost both sides CPU when it was scarcest).
pub const MAX_IDLE_CONNECTIONS: usize = 128;

/// The User-Agent of the webhook's lookups: the API server's audit log (and its field manager
/// default, though lookups write nothing) tells them from the watcher's requests.
pub const LOOKUP_USER_AGENT: &str = concat!("confighash-webhook/", env!("CARGO_PKG_VERSION"));

/// What a GET failed with: transport and credential errors. They carry no answer body.
#[derive(Debug, thiserror::Error)]
pub enum GetError {
    #[error("the path {0:?} is not a valid request path")]
    Path(String),
    #[error("credentials: {0}")]
    Credentials(String),
    #[error("connecting to the API server: {0}")]
    Connect(String),
    #[error("the API server connection failed: {0}")]
    Connection(String),
    #[error("{0}")]
    Client(String),
}

/// Reads objects by path from the API server: one GET each, the answer's body for the caller.
#[derive(Clone)]
pub struct Getter {
    inner: Inner,
}

#[derive(Clone)]
enum Inner {
    Direct(Arc<Direct>),
    Client(kube::Client),
}

impl std::fmt::Debug for Getter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            Inner::Direct(d) => f.debug_struct("Getter").field("base", &d.base).finish(),
            Inner::Client(_) => f
                .debug_struct("Getter")
                .field("through", &"kube::Client")
                .finish(),
        }
    }
}

/// The stream of one connection: TLS or plain TCP, as the cluster's URL says.
trait Stream: hyper::rt::Read + hyper::rt::Write + Send + Unpin {}
impl<T: hyper::rt::Read + hyper::rt::Write + Send + Unpin> Stream for T {}
type Io = Box<dyn Stream>;

/// The body of every GET: none.
type NoBody = Empty<Bytes>;

/// Opens a connection to a URI.
type Connector = BoxCloneSyncService<Uri, Io, BoxError>;
/// Adds credentials and the kubeconfig's extra headers to a request.
type Prepare = BoxCloneSyncService<Request<NoBody>, Request<NoBody>, BoxError>;

struct Direct {
    /// The cluster's URL as kube has it, for connecting.
    base: Uri,
    /// Its path prefix without the trailing `/` (often empty): each request's path is this
    /// followed by the object's path, sent in origin form with a `Host` header, as HTTP/1.1
    /// clients send it.
    prefix: String,
    host: HeaderValue,
    connector: Connector,
    prepare: Prepare,
    idle: Mutex<Vec<Conn>>,
}

/// One HTTP/1.1 connection: where requests go in, and the future that moves its bytes, polled
/// only by the task that uses the connection.
struct Conn {
    sender: http1::SendRequest<NoBody>,
    /// `None` once the connection has ended.
    driver: Option<Pin<Box<http1::Connection<Io, NoBody>>>>,
}

impl Conn {
    /// Moves the connection's bytes as far as they go now. An error ends it.
    fn drive(&mut self, cx: &mut Context<'_>) -> Result<(), hyper::Error> {
        if let Some(driver) = self.driver.as_mut() {
            match driver.as_mut().poll(cx) {
                Poll::Pending => {}
                Poll::Ready(result) => {
                    self.driver = None;
                    result?;
                }
            }
        }
        Ok(())
    }

    fn is_open(&self) -> bool {
        self.driver.is_some() && !self.sender.is_closed()
    }
}

impl Getter {
    /// A getter with connections of its own, set up from kube's `config` (TLS, credentials,
    /// headers); through a `kube::Client` when the configuration names a proxy.
    pub fn new(config: &kube::Config) -> Result<Getter, kube::Error> {
        if config.proxy_url.is_some() {
            // kube's client speaks to SOCKS and HTTP proxies; the connections here do not.
            let client = crate::client::build(config.clone(), Reads::NONE)?;
            return Ok(Getter::from_client(client));
        }
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(config.connect_timeout);
        let https = config.rustls_https_connector_with_connector(http)?;
        let connector: Connector = BoxCloneSyncService::new(
            https
                .map_response(|stream| Box::new(stream) as Io)
                .map_err(BoxError::from),
        );
        let prepare: Prepare = BoxCloneSyncService::new(
            ServiceBuilder::new()
                .option_layer(config.auth_layer()?)
                .layer(config.extra_headers_layer()?)
                // The layers want an answer of `http::Response`: the request goes back in one.
                .service(tower::service_fn(|request: Request<NoBody>| async move {
                    Ok::<_, BoxError>(Response::new(request))
                }))
                .map_response(Response::into_body)
                .map_err(BoxError::from),
        );
        let base = config.cluster_url.clone();
        let prefix = base.path().trim_end_matches('/').to_owned();
        let Some(host) = base
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        else {
            // kube connects to no URL without a host either; its client says why.
            return Ok(Getter::from_client(crate::client::build(
                config.clone(),
                Reads::NONE,
            )?));
        };
        Ok(Getter {
            inner: Inner::Direct(Arc::new(Direct {
                base,
                prefix,
                host,
                connector,
                prepare,
                idle: Mutex::new(Vec::new()),
            })),
        })
    }

    /// A getter that sends through `client` (and the layers it has).
    pub fn from_client(client: kube::Client) -> Getter {
        Getter {
            inner: Inner::Client(client),
        }
    }

    /// GETs `path` (`/api/v1/...`, already checked to hold only valid names), accepting JSON.
    /// The answer's status and headers, and its body to read; an error only when no answer came.
    pub async fn get(&self, path: &str) -> Result<Response<GetBody>, GetError> {
        match &self.inner {
            Inner::Direct(direct) => direct.get(path).await,
            Inner::Client(client) => {
                let mut request = Request::get(path)
                    .header(ACCEPT, "application/json")
                    .header(USER_AGENT, LOOKUP_USER_AGENT)
                    .body(kube::client::Body::empty())
                    .map_err(|_| GetError::Path(path.to_owned()))?;
                // The caller reads the body, bounded, and never quotes it: the sanitizing layer
                // passes it unread (it still withholds error bodies).
                request
                    .extensions_mut()
                    .insert(crate::client::DecodedByCaller);
                let response = client
                    .send(request)
                    .await
                    .map_err(|e| GetError::Client(crate::redact::kube_error(&e)))?;
                Ok(response.map(|body| GetBody {
                    inner: BodyInner::Client(body),
                }))
            }
        }
    }

    /// Connections waiting in the pool (none through a client).
    pub fn idle_connections(&self) -> usize {
        match &self.inner {
            Inner::Direct(d) => d.idle.lock().unwrap_or_else(|e| e.into_inner()).len(),
            Inner::Client(_) => 0,
        }
    }
}

impl Direct {
    async fn get(self: &Arc<Self>, path: &str) -> Result<Response<GetBody>, GetError> {
        let mut uri = String::with_capacity(self.prefix.len() + path.len());
        uri.push_str(&self.prefix);
        uri.push_str(path);
        let uri: Uri = uri.parse().map_err(|_| GetError::Path(path.to_owned()))?;
        let mut request = Request::new(NoBody::new());
        *request.uri_mut() = uri;
        let headers = request.headers_mut();
        headers.insert(HOST, self.host.clone());
        headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        headers.insert(USER_AGENT, HeaderValue::from_static(LOOKUP_USER_AGENT));
        let request = self
            .prepare
            .clone()
            .oneshot(request)
            .await
            .map_err(|e| GetError::Credentials(e.to_string()))?;
        // A pooled connection first; when it turns out closed, once more on a new one.
        if let Some(conn) = self.take_idle()
            && let Ok(answer) = self.send(conn, copy(&request)).await
        {
            return Ok(answer);
        }
        let conn = self.connect().await?;
        self.send(conn, request)
            .await
            .map_err(|e| GetError::Connection(e.to_string()))
    }

    fn take_idle(&self) -> Option<Conn> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(conn) = idle.pop() {
            if conn.is_open() {
                return Some(conn);
            }
        }
        None
    }

    fn put_back(&self, conn: Conn) {
        if !conn.is_open() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE_CONNECTIONS {
            idle.push(conn);
        }
    }

    async fn connect(&self) -> Result<Conn, GetError> {
        let io = self
            .connector
            .clone()
            .oneshot(self.base.clone())
            .await
            .map_err(|e| GetError::Connect(e.to_string()))?;
        let (sender, driver) = http1::handshake(io)
            .await
            .map_err(|e| GetError::Connect(e.to_string()))?;
        Ok(Conn {
            sender,
            driver: Some(Box::pin(driver)),
        })
    }

    /// Sends `request` on `conn`, driving it until the answer's head is in.
    async fn send(
        self: &Arc<Self>,
        mut conn: Conn,
        request: Request<NoBody>,
    ) -> Result<Response<GetBody>, hyper::Error> {
        std::future::poll_fn(|cx| {
            conn.drive(cx)?;
            conn.sender.poll_ready(cx)
        })
        .await?;
        let mut answer = std::pin::pin!(conn.sender.send_request(request));
        let response = std::future::poll_fn(|cx| {
            if let Poll::Ready(response) = answer.as_mut().poll(cx) {
                return Poll::Ready(response);
            }
            conn.drive(cx)?;
            // The driver may have handed the answer over (or, ending, an error).
            answer.as_mut().poll(cx)
        })
        .await?;
        let pool = self.clone();
        Ok(response.map(|incoming| GetBody {
            inner: BodyInner::Direct {
                incoming,
                conn: Some(conn),
                pool,
            },
        }))
    }
}

/// `request` again, for a second try: GETs have no body and no extensions to keep.
fn copy(request: &Request<NoBody>) -> Request<NoBody> {
    let mut again = Request::new(NoBody::new());
    *again.method_mut() = request.method().clone();
    *again.uri_mut() = request.uri().clone();
    *again.version_mut() = request.version();
    *again.headers_mut() = request.headers().clone();
    again
}

/// The body of an answer. Reading it drives the connection it comes on, which goes back to the
/// pool once the body has ended; dropped before that, the connection is closed.
pub struct GetBody {
    inner: BodyInner,
}

enum BodyInner {
    Direct {
        incoming: Incoming,
        conn: Option<Conn>,
        pool: Arc<Direct>,
    },
    Client(kube::client::Body),
}

impl Body for GetBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.get_mut().inner {
            BodyInner::Client(body) => Pin::new(body).poll_frame(cx).map_err(BoxError::from),
            BodyInner::Direct {
                incoming,
                conn,
                pool,
            } => {
                if let Some(c) = conn.as_mut()
                    && let Err(e) = c.drive(cx)
                {
                    *conn = None;
                    return Poll::Ready(Some(Err(e.into())));
                }
                let frame = ready!(Pin::new(incoming).poll_frame(cx));
                if frame.is_none()
                    && let Some(c) = conn.take()
                {
                    pool.put_back(c);
                }
                Poll::Ready(frame.map(|f| f.map_err(BoxError::from)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            BodyInner::Direct { incoming, .. } => incoming.is_end_stream(),
            BodyInner::Client(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            BodyInner::Direct { incoming, .. } => incoming.size_hint(),
            BodyInner::Client(body) => body.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A server that answers every GET of `/found` with a small JSON body and any other path with
    /// a 404 Status, keeping connections open, or closing each after one answer (without saying
    /// so, as a server whose idle timeout passed does). Counts the connections it accepted.
    async fn server(close_after_one: bool) -> (kube::Config, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        let mut chunk = [0u8; 1024];
                        let Ok(n) = socket.read(&mut chunk).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                            continue;
                        };
                        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                        buf.drain(..end + 4);
                        let (status, body) = if head.starts_with("GET /found ") {
                            ("200 OK", r#"{"kind":"ConfigMap","data":{"a":"b"}}"#)
                        } else {
                            ("404 Not Found", r#"{"kind":"Status","code":404}"#)
                        };
                        let answer = format!(
                            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n\
                             content-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if socket.write_all(answer.as_bytes()).await.is_err() || close_after_one {
                            return;
                        }
                    }
                });
            }
        });
        let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        (config, accepted)
    }

    async fn body_of(getter: &Getter, path: &str) -> (u16, Bytes) {
        let response = getter.get(path).await.unwrap();
        let status = response.status().as_u16();
        (
            status,
            response.into_body().collect().await.unwrap().to_bytes(),
        )
    }

    #[tokio::test]
    async fn one_connection_serves_one_get_after_another_404s_included() {
        let (config, accepted) = server(false).await;
        let getter = Getter::new(&config).unwrap();
        for _ in 0..3 {
            let (status, body) = body_of(&getter, "/found").await;
            assert_eq!(status, 200);
            assert!(body.starts_with(b"{\"kind\":\"ConfigMap\""));
            assert_eq!(body_of(&getter, "/absent").await.0, 404);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(getter.idle_connections(), 1);
    }

    #[tokio::test]
    async fn a_pooled_connection_the_server_closed_is_replaced() {
        let (config, accepted) = server(true).await;
        let getter = Getter::new(&config).unwrap();
        for round in 1..=3 {
            assert_eq!(body_of(&getter, "/found").await.0, 200, "GET {round}");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_get_dropped_before_its_body_is_read_gives_its_connection_up() {
        let (config, accepted) = server(false).await;
        let getter = Getter::new(&config).unwrap();
        let response = getter.get("/found").await.unwrap();
        drop(response);
        assert_eq!(getter.idle_connections(), 0);
        assert_eq!(body_of(&getter, "/found").await.0, 200);
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        assert_eq!(getter.idle_connections(), 1);
    }

    #[tokio::test]
    async fn gets_at_once_each_take_a_connection_and_all_go_back() {
        let (config, accepted) = server(false).await;
        let getter = Getter::new(&config).unwrap();
        let gets = (0..5).map(|_| body_of(&getter, "/found"));
        for (status, _) in futures::future::join_all(gets).await {
            assert_eq!(status, 200);
        }
        let opened = accepted.load(Ordering::SeqCst);
        assert!((1..=5).contains(&opened), "{opened}");
        assert_eq!(getter.idle_connections(), opened);
    }

    #[tokio::test]
    async fn no_server_is_a_connect_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        let getter = Getter::new(&config).unwrap();
        let Err(error) = getter.get("/found").await else {
            panic!("an answer without a server");
        };
        assert!(matches!(error, GetError::Connect(_)), "{error}");
    }
}

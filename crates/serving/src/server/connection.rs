//! One connection: its requests tracked, its answers held until sent, its idle and header
//! timers, driven until it closes.

use super::*;

/// What a connection's requests are doing; the connection's driver watches it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Activity {
    /// Requests whose head has arrived, since the connection opened.
    pub(super) requests: u64,
    /// Requests being answered now.
    pub(super) in_flight: usize,
    /// When `in_flight` last became 0 (or the connection opened).
    pub(super) idle_since: Instant,
    /// When the oldest request whose answer is not sent in full yet arrived (its answer may be
    /// made and held back by the client's flow control).
    pub(super) oldest_unsent: Option<Instant>,
    /// When the oldest answer made but not sent in full yet was made.
    pub(super) oldest_unsent_made: Option<Instant>,
}

/// The requests of one connection whose answers are not sent in full yet: when each arrived, and
/// when its answer was made (None while it is being made).
#[derive(Default)]
pub(super) struct Unsent {
    pub(super) next: std::sync::atomic::AtomicU64,
    pub(super) started:
        std::sync::Mutex<std::collections::BTreeMap<u64, (Instant, Option<Instant>)>>,
}

impl Unsent {
    /// The oldest arrival and the oldest answer made, of the answers not sent yet.
    fn oldest(
        started: &std::collections::BTreeMap<u64, (Instant, Option<Instant>)>,
    ) -> (Option<Instant>, Option<Instant>) {
        let arrived = started.values().map(|(at, _)| *at).min();
        let made = started.values().filter_map(|(_, made)| *made).min();
        (arrived, made)
    }
}

/// Marks one answer unsent until dropped: hyper drops the response body once it is sent in
/// full, or its stream or connection is gone.
pub(super) struct UnsentAnswer {
    id: u64,
    unsent: Arc<Unsent>,
    activity: Arc<watch::Sender<Activity>>,
}

impl UnsentAnswer {
    fn start(unsent: Arc<Unsent>, activity: Arc<watch::Sender<Activity>>) -> Self {
        let id = unsent.next.fetch_add(1, Ordering::Relaxed);
        let answer = UnsentAnswer {
            id,
            unsent,
            activity,
        };
        answer.update(|started| {
            started.insert(id, (Instant::now(), None));
        });
        answer
    }

    /// Changes the connection's record of unsent answers, and tells its driver the oldest.
    fn update(
        &self,
        change: impl FnOnce(&mut std::collections::BTreeMap<u64, (Instant, Option<Instant>)>),
    ) {
        let oldest = {
            let mut started = self
                .unsent
                .started
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            change(&mut started);
            Unsent::oldest(&started)
        };
        self.activity
            .send_modify(|a| (a.oldest_unsent, a.oldest_unsent_made) = oldest);
    }

    /// The answer is made: from now on only the client's reading holds it.
    fn made(&self) {
        self.update(|started| {
            if let Some(entry) = started.get_mut(&self.id) {
                entry.1 = Some(Instant::now());
            }
        });
    }
}

impl Drop for UnsentAnswer {
    fn drop(&mut self) {
        let id = self.id;
        self.update(|started| {
            started.remove(&id);
        });
    }
}

/// A port's router as a hyper service that reports each request's start and end, and when its
/// answer has been sent.
#[derive(Clone)]
pub(super) struct Tracked {
    router: axum::Router,
    activity: Arc<watch::Sender<Activity>>,
    unsent: Arc<Unsent>,
}

/// Marks a request in flight until dropped (answered, or its connection gone).
pub(super) struct InFlight(Arc<watch::Sender<Activity>>);

impl InFlight {
    fn start(activity: Arc<watch::Sender<Activity>>) -> Self {
        activity.send_modify(|a| {
            a.requests += 1;
            a.in_flight += 1;
        });
        InFlight(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.send_modify(|a| {
            a.in_flight -= 1;
            if a.in_flight == 0 {
                a.idle_since = Instant::now();
            }
        });
    }
}

impl hyper::service::Service<hyper::Request<Incoming>> for Tracked {
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn call(&self, request: hyper::Request<Incoming>) -> Self::Future {
        // hyper calls the service once a request head is complete (HTTP/1.1) or a stream's
        // headers have arrived (HTTP/2).
        let in_flight = InFlight::start(self.activity.clone());
        let unsent = UnsentAnswer::start(self.unsent.clone(), self.activity.clone());
        let router = self.router.clone();
        Box::pin(async move {
            let response = router.oneshot(request.map(Body::new)).await;
            drop(in_flight);
            unsent.made();
            response.map(|r| held::hold(r, unsent))
        })
    }
}

/// Why a connection's timer is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Timer {
    /// No complete request head yet: the header deadline from accept.
    FirstRequest,
    /// No request in flight: the idle limit.
    Idle,
    /// Asked to close because idle, and not closed yet.
    Closing,
    /// An answer is still unsent past its deadline.
    Unsent,
}

/// Serves one accepted connection: on the webhook port the TLS handshake (and with a client CA,
/// the move to a reserved slot) first, then HTTP until the client closes, a deadline passes, the
/// server stops or the connection is evicted. `_slot` counts the connection (and on a queue holds
/// its slot); `ticket` is its place in an evicting pool.
pub(super) async fn serve_connection(
    connections: Connections,
    tcp: TcpStream,
    peer: SocketAddr,
    accepted_at: Instant,
    stopped: watch::Receiver<bool>,
    _slot: Slot,
    mut ticket: Option<Ticket>,
) {
    // One deadline from accept to the first complete request head: the handshake, the protocol
    // detection (which waits for the HTTP/2 preface) and the head itself.
    let first_deadline = accepted_at + connections.header_read_timeout;
    let (acceptor, reserved) = match &connections.security {
        Security::Plain => {
            let io = TokioIo::new(tcp);
            return drive(&connections, io, peer, first_deadline, stopped, ticket).await;
        }
        Security::Tls { acceptor, reserved } => (acceptor, reserved),
    };
    let handshake = tokio::time::timeout_at(first_deadline, acceptor.accept(tcp));
    let tls = tokio::select! {
        result = handshake => match result {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(%peer, "TLS handshake timed out");
                return;
            }
        },
        () = evicted(&mut ticket) => {
            tracing::debug!(%peer, "TLS handshake closed to make room for a new connection");
            return;
        }
    };
    // With a client CA the handshake has verified the client's certificate: the connection
    // leaves the handshake pool for a reserved slot, waiting (still evictable) while all are
    // taken.
    let _reserved = match reserved {
        None => None,
        Some(slots) => {
            let permit = tokio::select! {
                permit = tokio::time::timeout_at(first_deadline, slots.clone().acquire_owned()) => permit,
                () = evicted(&mut ticket) => {
                    tracing::debug!(%peer, "closed to make room while waiting for a reserved slot");
                    return;
                }
            };
            let Ok(Ok(permit)) = permit else {
                tracing::debug!(%peer, "no reserved slot before the header deadline; closed");
                return;
            };
            ticket = None;
            Some(permit)
        }
    };
    drive(
        &connections,
        TokioIo::new(tls),
        peer,
        first_deadline,
        stopped,
        ticket,
    )
    .await;
}

/// Serves HTTP on `io` until the client closes, a deadline passes, the server stops or the
/// connection is evicted (`ticket`).
pub(super) async fn drive<I>(
    connections: &Connections,
    io: I,
    peer: SocketAddr,
    first_deadline: Instant,
    mut stopped: watch::Receiver<bool>,
    mut ticket: Option<Ticket>,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (activity, mut watched) = watch::channel(Activity {
        requests: 0,
        in_flight: 0,
        idle_since: Instant::now(),
        oldest_unsent: None,
        oldest_unsent_made: None,
    });
    let service = Tracked {
        router: connections.router.clone(),
        activity: Arc::new(activity),
        unsent: Arc::default(),
    };
    let mut conn = pin!(
        connections
            .builder
            .serve_connection_with_upgrades(io, service)
    );
    let mut closing_since: Option<Instant> = None;
    let mut stopping = false;
    loop {
        let now = *watched.borrow_and_update();
        let mut timer: Option<(Instant, Timer)> = None;
        let mut consider = |at: Instant, why: Timer| {
            if timer.is_none_or(|(t, _)| at < t) {
                timer = Some((at, why));
            }
        };
        if now.requests == 0 {
            consider(first_deadline, Timer::FirstRequest);
        }
        if let Some(oldest) = now.oldest_unsent {
            consider(oldest + connections.answer_deadline, Timer::Unsent);
        }
        if let Some(made) = now.oldest_unsent_made {
            // An answer made and not taken for this long: the client does not read.
            consider(made + UNSENT_AFTER_MADE, Timer::Unsent);
        }
        if let Some(since) = closing_since {
            // A graceful close needs the requests in flight answered (each bounded by the request
            // timeout, and none older than the close) and, on HTTP/2, a ping answered.
            consider(since + connections.close_timeout, Timer::Closing);
        } else if !stopping && now.requests > 0 && now.in_flight == 0 {
            consider(now.idle_since + connections.idle_timeout, Timer::Idle);
        }
        let sleep = async {
            match timer {
                Some((at, _)) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                    if let Some(metrics) = &connections.metrics {
                        metrics.connection_error();
                    }
                    connections.error_log.record(peer);
                }
                return;
            }
            Ok(()) = watched.changed() => {}
            () = stop_requested(&mut stopped), if !stopping => {
                // Finish what is in flight, then close; the drain timeout bounds the wait.
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
            () = evicted(&mut ticket) => {
                tracing::debug!(%peer, "closed to make room for a new connection");
                return;
            }
            () = sleep => match timer.map(|(_, why)| why) {
                Some(Timer::FirstRequest) => {
                    tracing::debug!(%peer, header_read_timeout = ?connections.header_read_timeout, "no complete request head in time; closed");
                    return;
                }
                Some(Timer::Idle) => {
                    tracing::debug!(%peer, idle_timeout = ?connections.idle_timeout, "idle; closing");
                    closing_since = Some(Instant::now());
                    conn.as_mut().graceful_shutdown();
                }
                Some(Timer::Unsent) => {
                    // The peer does not take its answers (an HTTP/2 stream window kept at 0, or
                    // a socket not read): closing the connection resets its streams and frees
                    // their answers, which the request timeout promised to bound.
                    if let Some(metrics) = &connections.metrics {
                        metrics.unsent_answer_closed();
                    }
                    connections.unsent_log.record(peer);
                    return;
                }
                Some(Timer::Closing) | None => {
                    tracing::debug!(%peer, "did not close in time; dropped");
                    return;
                }
            },
        }
    }
}

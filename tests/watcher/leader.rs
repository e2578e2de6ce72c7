//! Leader election against the in-memory API server, with short durations: a 1.5 s lease
//! (written as 2 s), a 1 s renew deadline and a 200 ms retry period. Every wait polls towards a
//! deadline; what must not happen is sampled over its period and fails at once.

use crate::build;
use crate::wait;

use std::time::{Duration, SystemTime};

use confighash::watcher::leader::{self, ConfigError, LeaderConfig, Leadership};
use confighash_testkit::apiserver::ApiServer;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

const NS: &str = "leader-test";
const LEASE: Duration = Duration::from_millis(1500);
/// What the Lease says: the lease duration rounded up to whole seconds.
const LEASE_WRITTEN: Duration = Duration::from_secs(2);
const RENEW: Duration = Duration::from_secs(1);
const RETRY: Duration = Duration::from_millis(200);
const SAMPLE: Duration = Duration::from_millis(5);
/// Slack for stepping down after the renew deadline (sampling and scheduling).
const MARGIN: Duration = Duration::from_millis(150);

fn config(identity: &str) -> LeaderConfig {
    LeaderConfig {
        lease_duration: LEASE,
        renew_deadline: RENEW,
        retry_period: RETRY,
        ..LeaderConfig::new(NS, identity)
    }
}

async fn start() -> (ApiServer, Client) {
    let server = ApiServer::start().await;
    let client = server.client();
    build::create_namespace(&client, NS, &[]).await;
    (server, client)
}

/// Samples two candidates until `until` holds, asserting they never both lead.
async fn never_both(
    a: &Leadership,
    b: &Leadership,
    within: Duration,
    mut until: impl FnMut() -> bool,
) {
    let start = Instant::now();
    loop {
        let (la, lb) = (a.is_leader(), b.is_leader());
        assert!(!(la && lb), "both candidates lead at {:?}", start.elapsed());
        if until() {
            return;
        }
        assert!(start.elapsed() < within, "timed out after {within:?}");
        tokio::time::sleep(SAMPLE).await;
    }
}

fn lease(server: &ApiServer, name: &str) -> Value {
    server
        .object("leases", NS, name)
        .unwrap_or_else(|| panic!("lease {name} exists"))
}

fn holder(server: &ApiServer) -> String {
    lease(server, "confighash")["spec"]["holderIdentity"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn transitions(server: &ApiServer) -> i64 {
    lease(server, "confighash")["spec"]["leaseTransitions"]
        .as_i64()
        .expect("leaseTransitions set")
}

fn renew_time(server: &ApiServer) -> Timestamp {
    lease(server, "confighash")["spec"]["renewTime"]
        .as_str()
        .expect("renewTime set")
        .parse()
        .expect("a timestamp")
}

/// GETs and PUTs of Leases the API server has had so far.
fn lease_requests(server: &ApiServer) -> (usize, usize) {
    let requests = server.requests();
    let count = |verb: &str| {
        requests
            .iter()
            .filter(|(v, resource)| v == verb && resource == "leases")
            .count()
    };
    (count("get"), count("update"))
}

/// Spawns a candidate while another leads, and waits until it has read the Lease (so it knows
/// the leader). The leader renews with a GET and then a PUT every retry period, so from any
/// moment on its GETs outnumber its PUTs by at most one: two GETs more than PUTs since the
/// spawn mean that the new candidate has read the Lease.
async fn spawn_follower(
    server: &ApiServer,
    client: Client,
    config: LeaderConfig,
) -> (Leadership, tokio::task::JoinHandle<()>) {
    let (gets, puts) = lease_requests(server);
    let follower = leader::spawn(client, config);
    wait::eventually_within(
        "the new candidate to read the Lease",
        Duration::from_secs(3),
        async || {
            let (g, p) = lease_requests(server);
            g - gets >= p - puts + 2
        },
    )
    .await;
    follower
}

/// Spawns `first`, waits until it leads, then spawns `second` and waits until it has read the
/// Lease (so the leader is known).
async fn leader_then_follower(
    server: &ApiServer,
    first: (Client, LeaderConfig),
    second: (Client, LeaderConfig),
) -> [(Leadership, tokio::task::JoinHandle<()>); 2] {
    let a = leader::spawn(first.0, first.1);
    wait::eventually_within(
        "the first candidate to lead",
        Duration::from_secs(3),
        async || a.0.is_leader(),
    )
    .await;
    let b = spawn_follower(server, second.0, second.1).await;
    [a, b]
}

/// Waits until the leader has renewed the Lease once since it was acquired.
async fn wait_renewal(server: &ApiServer) {
    let acquired = renew_time(server);
    wait::eventually_within("a renewal", RETRY * 4, async || {
        renew_time(server) > acquired
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_candidate_leads_and_renews() {
    let (server, client) = start().await;
    let (leadership, task) = leader::spawn(client, config("solo"));
    let mut changes = leadership.changes();
    tokio::time::timeout(Duration::from_secs(3), changes.wait_for(|l| *l))
        .await
        .expect("leads in time")
        .expect("the election is running");
    assert!(leadership.is_leader());
    assert!(leadership.clone().is_leader(), "clones share the state");

    let spec = &lease(&server, "confighash")["spec"];
    assert_eq!(spec["holderIdentity"], "solo");
    assert_eq!(spec["leaseDurationSeconds"], 2);
    assert_eq!(spec["leaseTransitions"], 0);
    assert!(spec["acquireTime"].is_string());
    let first = renew_time(&server);

    // The leader renews every retry period and stays leader.
    wait::eventually_within("a renewal", RETRY * 4, async || renew_time(&server) > first).await;
    assert_eq!(
        lease(&server, "confighash")["spec"]["acquireTime"],
        spec["acquireTime"]
    );
    wait::throughout("a healthy leader leading", RENEW + RETRY * 2, async || {
        leadership.is_leader()
    })
    .await;
    assert_eq!(transitions(&server), 0);

    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    assert!(!leadership.is_leader(), "aborting the task ends leadership");
    assert!(!*changes.borrow());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_candidates_never_both_lead() {
    let (server, client) = start().await;
    let (a, ta) = leader::spawn(client.clone(), config("a"));
    let (b, tb) = leader::spawn(client, config("b"));
    wait::eventually_within("a leader", Duration::from_secs(3), async || {
        a.is_leader() || b.is_leader()
    })
    .await;
    let until = Instant::now() + Duration::from_secs(3);
    let mut samples = 0;
    while Instant::now() < until {
        let (la, lb) = (a.is_leader(), b.is_leader());
        assert!(la != lb, "exactly one leads (a: {la}, b: {lb})");
        samples += 1;
        tokio::time::sleep(SAMPLE).await;
    }
    assert!(samples > 100, "sampled often ({samples})");
    let expected = if a.is_leader() { "a" } else { "b" };
    assert_eq!(holder(&server), expected);
    assert_eq!(transitions(&server), 0, "the lease never changed hands");
    ta.abort();
    tb.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborting_the_leader_hands_over_after_the_lease_expires() {
    let (server, client) = start().await;
    let [(a, ta), (b, tb)] = leader_then_follower(
        &server,
        (client.clone(), config("a")),
        (client.clone(), config("b")),
    )
    .await;
    assert!(!b.is_leader());

    ta.abort();
    assert!(ta.await.unwrap_err().is_cancelled());
    assert!(!a.is_leader());
    let took = wait::eventually_within("b to take over", Duration::from_secs(5), async || {
        b.is_leader()
    })
    .await;
    // b waits out the lease from the last renewal it saw (at most a retry period before the abort).
    assert!(
        took >= LEASE_WRITTEN - RETRY * 2,
        "b took over after {took:?}, before expiry"
    );
    assert_eq!(holder(&server), "b");
    assert_eq!(transitions(&server), 1);

    // And again, back to a new candidate: each takeover counts.
    let (c, tc) = spawn_follower(&server, client, config("c")).await;
    assert!(!c.is_leader());
    tb.abort();
    assert!(tb.await.unwrap_err().is_cancelled());
    wait::eventually_within("c to take over", Duration::from_secs(5), async || {
        c.is_leader()
    })
    .await;
    assert_eq!(holder(&server), "c");
    assert_eq!(transitions(&server), 2);
    tc.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_hands_over_at_once() {
    let (server, client) = start().await;
    let config_a = config("a");
    let [(a, ta), (b, tb)] = leader_then_follower(
        &server,
        (client.clone(), config_a.clone()),
        (client.clone(), config("b")),
    )
    .await;
    assert!(!b.is_leader());

    ta.abort();
    assert!(ta.await.unwrap_err().is_cancelled());
    assert!(!a.is_leader());
    assert!(
        leader::release(client.clone(), &config_a)
            .await
            .expect("released")
    );
    assert_eq!(holder(&server), "", "no holder after release");
    let took = wait::eventually_within("b to take over", Duration::from_secs(3), async || {
        b.is_leader()
    })
    .await;
    assert!(took < RENEW, "b took over after {took:?}, not at once");
    assert_eq!(holder(&server), "b");
    assert_eq!(transitions(&server), 1);

    // Releasing a Lease someone else holds does nothing.
    assert!(
        !leader::release(client.clone(), &config_a)
            .await
            .expect("no error")
    );
    assert_eq!(holder(&server), "b");
    wait::throughout("b leading", RETRY * 2, async || b.is_leader()).await;
    // Nor does releasing a Lease that does not exist.
    let mut other = config_a.clone();
    other.lease_name = "absent".into();
    assert!(!leader::release(client, &other).await.expect("no error"));
    tb.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_renewals_fail_steps_down_before_the_lease_expires() {
    let (server, client) = start().await;
    let (leadership, task) = leader::spawn(client, config("a"));
    wait::eventually_within("leading", Duration::from_secs(3), async || {
        leadership.is_leader()
    })
    .await;
    wait_renewal(&server).await;

    // More failures than renewals fit in the renew deadline; the rest hit re-acquisition.
    server.fail_next(Some("update"), Some("leases"), 8, 500);
    let took = wait::eventually_within("stepping down", Duration::from_secs(3), async || {
        !leadership.is_leader()
    })
    .await;
    let down = Timestamp::try_from(SystemTime::now()).expect("a timestamp");
    // The Lease still holds the last successful renewal; its renewTime was stamped right before
    // that write was sent, which is when the leader's renew deadline started.
    let since_renewal = Duration::try_from(down.duration_since(renew_time(&server)))
        .expect("stepped down after the last renewal");
    assert!(
        since_renewal >= RENEW - SAMPLE * 4,
        "kept leading through failures until the renew deadline ({since_renewal:?})"
    );
    assert!(
        since_renewal <= RENEW + MARGIN,
        "stepped down at the renew deadline ({since_renewal:?})"
    );
    assert!(since_renewal < LEASE, "before the lease expired");
    assert!(took <= RENEW + MARGIN, "{took:?}");
    // The task notices too (is_leader checks the deadline itself, so it may be a moment first).
    tokio::time::timeout(SAMPLE * 10, leadership.changes().wait_for(|l| !*l))
        .await
        .expect("the change is sent at the deadline")
        .expect("the election is running");
    assert_eq!(holder(&server), "a");

    // Once the API server answers again, it leads again: still its own Lease, no transition.
    wait::eventually_within("leading again", Duration::from_secs(5), async || {
        leadership.is_leader()
    })
    .await;
    assert_eq!(transitions(&server), 0);
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_renewals_hang_steps_down_at_the_renew_deadline() {
    let (server, client) = start().await;
    let (leadership, task) = leader::spawn(client, config("a"));
    wait::eventually_within("leading", Duration::from_secs(3), async || {
        leadership.is_leader()
    })
    .await;
    wait_renewal(&server).await;

    server.set_delay(RENEW * 2);
    let took = wait::eventually_within("stepping down", Duration::from_secs(3), async || {
        !leadership.is_leader()
    })
    .await;
    // The last success was at most a retry period (and a request) before the delay began.
    assert!(
        took >= RENEW - RETRY - SAMPLE * 10,
        "stepped down early: {took:?}"
    );
    assert!(took <= RENEW + MARGIN, "stepped down late: {took:?}");
    assert!(
        took + RETRY < LEASE,
        "well before the lease expired: {took:?}"
    );

    server.set_delay(Duration::ZERO);
    wait::eventually_within("leading again", Duration::from_secs(5), async || {
        leadership.is_leader()
    })
    .await;
    task.abort();
}

/// A TCP proxy in front of the API server that can be frozen: while frozen it forwards nothing,
/// like a network partition between one replica and the API server.
async fn freezable_proxy(server: &ApiServer) -> (Client, watch::Sender<bool>) {
    let upstream = server.url().trim_start_matches("http://").to_owned();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let (frozen, _) = watch::channel(false);
    let frozen_rx = frozen.subscribe();
    tokio::spawn(async move {
        while let Ok((down, _)) = listener.accept().await {
            let Ok(up) = TcpStream::connect(&upstream).await else {
                continue;
            };
            let (down_r, down_w) = down.into_split();
            let (up_r, up_w) = up.into_split();
            tokio::spawn(pump(down_r, up_w, frozen_rx.clone()));
            tokio::spawn(pump(up_r, down_w, frozen_rx.clone()));
        }
    });
    let mut config = server.config();
    config.cluster_url = format!("http://{addr}").parse().expect("a URL");
    (Client::try_from(config).expect("a client"), frozen)
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: watch::Receiver<bool>,
) {
    let mut buf = vec![0; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if frozen.wait_for(|f| !*f).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_steps_down_before_the_other_takes_over() {
    let (server, client) = start().await;
    let (partitioned, freeze) = freezable_proxy(&server).await;
    let [(a, ta), (b, tb)] =
        leader_then_follower(&server, (partitioned, config("a")), (client, config("b"))).await;
    assert!(a.is_leader() && !b.is_leader());

    freeze.send_replace(true);
    let frozen_at = Instant::now();
    let mut a_down = None;
    never_both(&a, &b, Duration::from_secs(5), || {
        if a_down.is_none() && !a.is_leader() {
            a_down = Some(frozen_at.elapsed());
        }
        b.is_leader()
    })
    .await;
    let b_up = frozen_at.elapsed();
    let a_down = a_down.expect("a stepped down");
    assert!(a_down <= RENEW + MARGIN, "a stepped down late: {a_down:?}");
    assert!(
        b_up >= a_down + (LEASE - RENEW),
        "b took over {b_up:?} after the freeze, too soon after a stepped down ({a_down:?})"
    );
    assert_eq!(holder(&server), "b");
    assert_eq!(transitions(&server), 1);

    // Healed: a sees b's Lease (and its stale writes, if any, get 409) and stays a follower.
    freeze.send_replace(false);
    let until = Instant::now() + RETRY * 5;
    never_both(&a, &b, Duration::from_secs(3), || Instant::now() >= until).await;
    assert!(b.is_leader() && !a.is_leader());
    assert_eq!(holder(&server), "b");
    ta.abort();
    tb.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_is_judged_on_the_local_clock_not_the_renew_time() {
    let (server, client) = start().await;
    let api: Api<Lease> = Api::namespaced(client.clone(), NS);
    let hour = SignedDuration::from_hours(1);
    // One Lease renewed "in the future" by a holder with a skewed clock, one renewed an hour ago:
    // both must be waited out for their leaseDurationSeconds from when we first see them.
    for (name, renewed, transitions) in [
        ("future", Timestamp::now() + hour, Some(4)),
        ("past", Timestamp::now() - hour, None),
    ] {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("ghost".into()),
                lease_duration_seconds: Some(1),
                acquire_time: Some(MicroTime(renewed)),
                renew_time: Some(MicroTime(renewed)),
                lease_transitions: transitions,
                ..LeaseSpec::default()
            }),
        };
        api.create(&PostParams::default(), &lease)
            .await
            .expect("lease created");
    }
    let candidate = |lease: &str| {
        leader::spawn(
            client.clone(),
            LeaderConfig {
                lease_name: lease.into(),
                ..config("me")
            },
        )
    };
    let (future, tf) = candidate("future");
    let (past, tp) = candidate("past");
    let took = wait::eventually_within("both taken over", Duration::from_secs(4), async || {
        future.is_leader() && past.is_leader()
    })
    .await;
    assert!(
        took >= Duration::from_millis(900),
        "took over after {took:?}, before a full leaseDurationSeconds of local observation"
    );
    for (name, expected_transitions) in [("future", 5), ("past", 1)] {
        let spec = &lease(&server, name)["spec"];
        assert_eq!(spec["holderIdentity"], "me");
        assert_eq!(spec["leaseTransitions"], expected_transitions);
        assert_eq!(spec["leaseDurationSeconds"], 2);
    }
    tf.abort();
    tp.abort();
}

#[test]
fn config_validation() {
    let ok = LeaderConfig::new("ns", "me");
    assert_eq!(ok.validate(), Ok(()));
    assert_eq!(ok.lease_name, "confighash");
    assert_eq!(
        (ok.lease_duration, ok.renew_deadline, ok.retry_period),
        (
            Duration::from_secs(15),
            Duration::from_secs(10),
            Duration::from_secs(2)
        )
    );
    assert_eq!(config("me").validate(), Ok(()));

    let with = |f: fn(&mut LeaderConfig)| {
        let mut c = LeaderConfig::new("ns", "me");
        f(&mut c);
        c.validate()
    };
    assert!(matches!(
        with(|c| c.renew_deadline = c.lease_duration),
        Err(ConfigError::RenewDeadline { .. })
    ));
    assert!(matches!(
        with(|c| c.renew_deadline = Duration::from_secs(20)),
        Err(ConfigError::RenewDeadline { .. })
    ));
    assert!(matches!(
        with(|c| c.retry_period = c.renew_deadline),
        Err(ConfigError::RetryPeriod { .. })
    ));
    assert_eq!(
        with(|c| c.retry_period = Duration::ZERO),
        Err(ConfigError::Zero("retry period"))
    );
    assert_eq!(
        with(|c| c.identity.clear()),
        Err(ConfigError::Empty("identity"))
    );
    assert_eq!(
        with(|c| c.namespace.clear()),
        Err(ConfigError::Empty("namespace"))
    );
    assert_eq!(
        with(|c| c.lease_name.clear()),
        Err(ConfigError::Empty("lease name"))
    );
    let message = with(|c| c.renew_deadline = Duration::from_secs(15))
        .unwrap_err()
        .to_string();
    assert!(message.contains("renew deadline"), "{message}");
    assert!(message.contains("lease duration"), "{message}");

    let identity = LeaderConfig::default_identity();
    assert!(!identity.is_empty());
    assert_ne!(identity, LeaderConfig::default_identity());
}

#[tokio::test]
#[should_panic(expected = "renew deadline")]
async fn spawning_with_an_invalid_config_panics() {
    let server = ApiServer::start().await;
    let mut invalid = config("me");
    invalid.renew_deadline = invalid.lease_duration;
    let _ = leader::spawn(server.client(), invalid);
}

#[test]
fn always_leads() {
    let always = Leadership::always();
    assert!(always.is_leader());
    assert!(*always.changes().borrow());
}

//! `--dry-run` under the fake clock: windows, pacing and reconcile decide as usual, nothing is
//! touched, and each stamp a touch would set is recorded once as a `WouldRoll` Event.

use super::*;

fn dry_run() -> WatcherConfig {
    WatcherConfig {
        dry_run: true,
        ..config()
    }
}

fn would_roll(w: &W, what: &str) -> Effect {
    event(
        w,
        EventType::Normal,
        WOULD_ROLL_REASON,
        "DryRun",
        &format!(
            "{what}; confighash would re-stamp the pod template and its pods would roll (dry run)"
        ),
    )
}

fn remembered(t: &Test) -> usize {
    (t.state.per_workload.values())
        .filter(|w| w.would_roll.is_some())
        .count()
}

#[test]
fn a_change_records_one_would_roll_event_and_touches_nothing() {
    let mut t = Test::leader(dry_run());
    let web = shop(&mut t);
    assert_eq!(t.config(1.0, app_env("debug")), []);
    assert_eq!(t.next_wake(), Some(6.0), "the same change window");
    assert_eq!(t.wake(5.999), []);
    assert_eq!(t.wake(6.0), [would_roll(&web, APP_ENV_CHANGED)]);
    assert_eq!(
        t.next_wake(),
        Some(600.0),
        "nothing pending, nothing in flight"
    );
    assert_eq!(t.metrics.touches_outstanding(), (0, 0));
    assert_eq!(t.metrics.touches(WOULD_ROLL_OUTCOME), 1);
    for outcome in ["touched", "kept-by-webhook", "error", "gone"] {
        assert_eq!(t.metrics.touches(outcome), 0, "{outcome}");
    }
    assert_eq!(remembered(&t), 1);
}

#[test]
fn the_same_change_seen_again_records_nothing_more() {
    let mut t = Test::leader(dry_run());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    assert_eq!(t.wake(6.0), [would_roll(&web, APP_ENV_CHANGED)]);

    // Nothing was written: the workload's watch still shows its old stamp, now stale.
    assert_eq!(t.workload(7.0, &web), []);
    assert_eq!(
        t.next_wake(),
        Some(600.0),
        "not checked again a window later"
    );
    // The same content again, and a relist showing it.
    assert_eq!(t.config(8.0, app_env("debug")), []);
    let relisted = Watched::Relisted(HashSet::from([app_env("debug").0]));
    assert_eq!(
        t.feed(
            8.5,
            Input::Config(ConfigSource::Watch(ObjectKind::ConfigMap), relisted)
        ),
        [Effect::ReleaseMemory]
    );
    assert_eq!(t.wake(13.0), []);
    // The resync, and a new leadership, compare every stamp: this one as the touch left it.
    assert_eq!(t.wake(600.0), []);
    assert_eq!(t.metric("confighash_reconcile_mismatches_total"), 0.0);
    assert_eq!(t.feed(601.0, Input::Leader(false)), []);
    assert_eq!(t.feed(602.0, Input::Leader(true)), []);
    assert_eq!(t.wake(1202.0), []);
    assert_eq!(t.metrics.touches(WOULD_ROLL_OUTCOME), 1);
}

#[test]
fn a_new_change_records_a_new_event_and_so_does_going_back() {
    let mut t = Test::leader(dry_run());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    assert_eq!(t.wake(6.0), [would_roll(&web, APP_ENV_CHANGED)]);
    t.config(7.0, app_env("trace"));
    assert_eq!(t.wake(12.0), [would_roll(&web, APP_ENV_CHANGED)]);
    // Back to the content the workload's own stamp is of: a touch would have rolled it back.
    t.config(13.0, app_env("info"));
    assert_eq!(t.expected(&web), web.stamp.clone().unwrap());
    assert_eq!(t.wake(18.0), [would_roll(&web, APP_ENV_CHANGED)]);
    assert_eq!(t.wake(600.0), []);
    assert_eq!(t.metrics.touches(WOULD_ROLL_OUTCOME), 3);
    assert_eq!(remembered(&t), 1, "one stamp per workload");
}

#[test]
fn reconcile_records_each_stale_stamp_once() {
    let mut t = Test::leader(dry_run());
    let app = app_env("info");
    t.cluster.insert(app.0.clone(), app.1.clone());
    let uses = [("configMap", "app-env")];
    // Stamped before the ConfigMap changed, while confighash was down.
    let stale_stamp = t.expected(&deployment(NS, "stale", &uses));
    let changed = app_env("debug");
    t.cluster.insert(changed.0.clone(), changed.1.clone());
    let fresh = deployment(NS, "fresh", &uses);
    let fresh = fresh.clone().stamped(&t.expected(&fresh));
    let stale = deployment(NS, "stale", &uses).stamped(&stale_stamp);
    let mut marked = deployment(NS, "marked", &uses);
    marked.annotations = json!({UNSTAMPED_ANNOTATION: "lookup-failed"});
    let unstamped = deployment(NS, "unstamped", &uses);

    let effects = t.start(
        &[(NS, true)],
        &[changed],
        &[&fresh, &stale, &marked, &unstamped],
    );
    let mut expected = listed();
    expected.extend([
        would_roll(&marked, STALE_WHY),
        would_roll(&stale, STALE_WHY),
    ]);
    assert_eq!(effects, expected, "as the touches would be");
    assert_eq!(t.metric("confighash_reconcile_mismatches_total"), 2.0);
    // Their watch events, and the next resync, find them as the touches would have left them.
    assert_eq!(t.workload(1.0, &marked), []);
    assert_eq!(t.workload(1.0, &stale), []);
    assert_eq!(t.wake(600.0), []);
    assert_eq!(t.metric("confighash_reconcile_mismatches_total"), 2.0);

    // A config change replaces every stamp, the never-stamped one's too.
    t.config(601.0, app_env("trace"));
    assert_eq!(
        t.wake(606.0),
        [
            would_roll(&fresh, APP_ENV_CHANGED),
            would_roll(&marked, APP_ENV_CHANGED),
            would_roll(&stale, APP_ENV_CHANGED),
            would_roll(&unstamped, APP_ENV_CHANGED),
        ]
    );
    assert_eq!(t.wake(1200.0), []);
}

#[test]
fn a_deleted_workload_drops_what_was_remembered_of_it() {
    let mut t = Test::leader(dry_run());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    assert_eq!(t.wake(6.0), [would_roll(&web, APP_ENV_CHANGED)]);
    assert_eq!(remembered(&t), 1);
    let deleted = Watched::Deleted(web.key());
    assert_eq!(
        t.feed(7.0, Input::Workload(WorkloadKind::DEPLOYMENT, deleted)),
        []
    );
    assert_eq!(remembered(&t), 0);

    // Created again with the manifest's old stamp: another workload, recorded afresh.
    let again = W {
        uid: "uid-web-2".to_owned(),
        ..web
    };
    assert_eq!(t.workload(8.0, &again), []);
    assert_eq!(t.wake(13.0), [would_roll(&again, STALE_WHY)]);
    assert_eq!(remembered(&t), 1);
    // A relist that no longer shows it drops it too.
    let relisted = Watched::Relisted(HashSet::new());
    assert_eq!(
        t.feed(14.0, Input::Workload(WorkloadKind::DEPLOYMENT, relisted)),
        []
    );
    assert_eq!(remembered(&t), 0);
}

#[test]
fn a_stamp_written_by_someone_else_counts_again() {
    let mut t = Test::leader(dry_run());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    assert_eq!(t.wake(6.0), [would_roll(&web, APP_ENV_CHANGED)]);
    // Someone writes the expected stamp by hand: nothing to record, nothing remembered.
    let web = web.clone().stamped(&t.expected(&web));
    assert_eq!(t.workload(7.0, &web), []);
    assert_eq!(remembered(&t), 0);
    assert_eq!(t.wake(600.0), []);
    // From that stamp on, changes count as usual.
    t.config(601.0, app_env("info"));
    assert_eq!(t.wake(606.0), [would_roll(&web, APP_ENV_CHANGED)]);
}

#[test]
fn a_burst_is_paced_as_its_touches_would_be() {
    let mut t = Test::leader(WatcherConfig {
        max_touches_per_second: 2.0,
        ..dry_run()
    });
    let shared = config_map(NS, "shared", &[("LOG_LEVEL", "info")]);
    t.cluster.insert(shared.0.clone(), shared.1.clone());
    let workloads: Vec<W> = (0..25)
        .map(|i| {
            let w = deployment(NS, &format!("web-{i:02}"), &[("configMap", "shared")]);
            let stamp = t.expected(&w);
            w.stamped(&stamp)
        })
        .collect();
    let refs: Vec<&W> = workloads.iter().collect();
    assert_eq!(t.start(&[(NS, true)], &[shared], &refs), listed());

    t.config(1.0, config_map(NS, "shared", &[("LOG_LEVEL", "debug")]));
    let why = "ConfigMap shared changed";
    let burst: Vec<Effect> = workloads[..20].iter().map(|w| would_roll(w, why)).collect();
    assert_eq!(t.wake(6.0), burst, "the bucket's burst");
    assert_eq!(t.metric("confighash_touches_rate_limited_total"), 5.0);
    let mut last = 6.0;
    for w in &workloads[20..] {
        let next = t.next_wake().unwrap();
        assert!((next - last - 0.5).abs() < 1e-3, "{next} after {last}");
        last = next;
        assert_eq!(t.wake(next), [would_roll(w, why)]);
    }
    assert_eq!(t.next_wake(), Some(600.0));
    assert_eq!(t.wake(600.0), []);
    assert_eq!(t.metrics.touches(WOULD_ROLL_OUTCOME), 25);
}

#[test]
fn only_the_leader_records_and_a_new_leader_records_once() {
    let mut t = Test::follower(dry_run());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    assert_eq!(t.wake(6.0), [], "a follower only watches");
    assert_eq!(
        t.feed(7.0, Input::Leader(true)),
        [would_roll(&web, STALE_WHY)]
    );
    // Leadership lost and won again (past the pacing of one workload): nothing new to record.
    assert_eq!(t.feed(8.0, Input::Leader(false)), []);
    assert_eq!(t.feed(20.0, Input::Leader(true)), []);
    assert_eq!(t.wake(600.0), []);
    assert_eq!(t.metrics.touches(WOULD_ROLL_OUTCOME), 1);
}

#[test]
fn a_workload_that_does_not_roll_by_itself_is_told_so() {
    let mut t = Test::leader(dry_run());
    let app = app_env("info");
    t.cluster.insert(app.0.clone(), app.1.clone());
    let mut db = deployment(NS, "db", &[("configMap", "app-env")]);
    db.kind = WorkloadKind::STATEFUL_SET;
    db.on_delete = true;
    let db = db.clone().stamped(&t.expected(&db));
    t.start(&[(NS, true)], &[app], &[&db]);
    t.config(1.0, app_env("debug"));
    let note = "ConfigMap app-env changed; confighash would re-stamp the pod template, but its \
                pods would not roll by themselves (OnDelete or in-place update strategy, or paused) (dry run)";
    assert_eq!(
        t.wake(6.0),
        [event(
            &db,
            EventType::Normal,
            WOULD_ROLL_REASON,
            "DryRun",
            note
        )]
    );
}

#[test]
fn unstamped_workloads_are_not_counted_as_bypassing_the_webhook() {
    // The webhook of a dry run stamps nothing, so every new workload would count.
    let mut t = Test::leader(dry_run());
    t.start(&[(NS, true)], &[], &[]);
    let web = W {
        created: Some(wall0() + Duration::from_secs(40)),
        ..deployment(NS, "web", &[])
    };
    assert_eq!(t.workload(40.0, &web), []);
    assert_eq!(t.metrics.workloads_bypassed(), 0);
}

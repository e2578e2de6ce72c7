//! The key, the Events, workloads that bypassed the webhook, and the text of notes.

use super::*;

// ----- the key -----

#[test]
fn a_replaced_key_touches_nothing_until_a_real_change() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    let old = web.stamp.clone();
    t.key = Arc::new(key_b());
    assert_eq!(t.feed(1.0, Input::Key(t.key.clone())), []);
    assert_eq!(t.wake(600.0), [], "reconcile leaves the foreign stamp");
    assert_eq!(t.feed(601.0, Input::Leader(false)), []);
    assert_eq!(
        t.feed(602.0, Input::Leader(true)),
        [],
        "as does a new leader"
    );

    t.config(603.0, app_env("debug"));
    let stamp = t.expected(&web);
    assert!(stamp.starts_with(&format!("v2:{}:", key_b().id())));
    assert_eq!(t.wake(608.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);
    // The webhook kept the foreign stamp: the retry is still a config change and replaces it.
    assert_eq!(t.touched(608.1, &web, TouchResult::Patched(old)), []);
    assert_eq!(t.wake(613.0), [touch(&web, &stamp, APP_ENV_CHANGED, 1)]);
}

// ----- Events -----

#[test]
fn an_on_delete_workload_is_told_its_pods_do_not_roll() {
    let mut t = Test::leader(config());
    let app = app_env("info");
    t.cluster.insert(app.0.clone(), app.1.clone());
    let mut db = deployment(NS, "db", &[("configMap", "app-env")]);
    db.kind = WorkloadKind::STATEFUL_SET;
    db.on_delete = true;
    let db = db.clone().stamped(&t.expected(&db));
    t.start(&[(NS, true)], &[app], &[&db]);
    t.config(1.0, app_env("debug"));
    let stamp = t.expected(&db);
    assert_eq!(t.wake(6.0), [touch(&db, &stamp, APP_ENV_CHANGED, 0)]);
    let note = "ConfigMap app-env changed; the pod template was re-stamped, but pods will not \
                roll by themselves (OnDelete or in-place update strategy, or paused): delete or resume them to \
                apply the new config";
    assert_eq!(
        t.touched(6.1, &db, TouchResult::Patched(Some(stamp))),
        [event(
            &db,
            EventType::Warning,
            CONFIG_CHANGED_REASON,
            "Restamp",
            note
        )]
    );
}

// ----- workloads that bypassed the webhook -----

#[test]
fn a_workload_created_past_the_webhook_is_counted_once() {
    let mut t = Test::leader(config());
    t.start(&[(NS, true)], &[], &[]);
    let created = |w: W, seconds| W {
        created: Some(wall0() + Duration::from_secs(seconds)),
        ..w
    };
    let early = created(deployment(NS, "early", &[]), 20);
    assert_eq!(t.workload(20.0, &early), []);
    assert_eq!(t.metrics.workloads_bypassed(), 0, "within the grace");

    let web = created(deployment(NS, "web", &[]), 40);
    t.workload(40.0, &web);
    t.workload(41.0, &web);
    assert_eq!(t.metrics.workloads_bypassed(), 1, "each workload once");
    let stamped = created(deployment(NS, "stamped", &[]), 40).stamped("v2:x:y");
    let mut opted_out = created(deployment(NS, "opted-out", &[]), 40);
    opted_out.labels = json!({ENABLED_LABEL: "false"});
    let other = created(deployment("other", "web", &[]), 40);
    for w in [&stamped, &opted_out, &other] {
        t.workload(42.0, w);
    }
    assert_eq!(t.metrics.workloads_bypassed(), 1);

    // The same name again is another workload (another uid).
    let again = W {
        uid: "uid-web-2".to_owned(),
        ..web
    };
    t.workload(50.0, &again);
    assert_eq!(t.metrics.workloads_bypassed(), 2);

    // A namespace that opts in later: its grace starts then.
    t.namespace(100.0, "later", true);
    t.workload(110.0, &created(deployment("later", "a", &[]), 110));
    assert_eq!(t.metrics.workloads_bypassed(), 2);
    t.workload(131.0, &created(deployment("later", "b", &[]), 131));
    assert_eq!(t.metrics.workloads_bypassed(), 3);
}

// ----- text -----

#[test]
fn retry_delays_read_as_people_write_them() {
    assert_eq!(format_delay(Duration::from_millis(200)), "200ms");
    assert_eq!(format_delay(Duration::ZERO), "1ms");
    assert_eq!(format_delay(Duration::from_millis(40_400)), "40s");
    assert_eq!(format_delay(Duration::from_secs(600)), "10m");
}

#[test]
fn changed_names_stay_short() {
    let key = |kind, name: &str| ("shop".to_owned(), ObjectRef::new(kind, name.to_owned()));
    let one = BTreeSet::from([key(ObjectKind::ConfigMap, "app-env")]);
    assert_eq!(changed_names(&one), "ConfigMap app-env changed");
    let many: BTreeSet<ConfigKey> = (0..5)
        .map(|i| key(ObjectKind::Secret, &format!("s{i}")))
        .collect();
    assert_eq!(
        changed_names(&many),
        "Secret s0, Secret s1, Secret s2 and 2 more changed"
    );
    // Every Event that says what changed says it so: a workload with 300 references that all
    // changed gets a ConfigChanged note of three names, not 300.
    let all: BTreeSet<ConfigKey> = (0..300)
        .map(|i| {
            key(
                ObjectKind::ConfigMap,
                &format!("a-long-config-map-name-{i:03}"),
            )
        })
        .collect();
    let web = WorkloadKey::new(WorkloadKind::DEPLOYMENT, "shop", "web");
    for event in [
        crate::state::config_changed(&web, "uid", &all, true),
        crate::state::config_changed(&web, "uid", &all, false),
        crate::state::would_roll(&web, "uid", &all, true),
    ] {
        assert!(
            event.note.contains(" and 297 more changed; "),
            "{}",
            event.note
        );
        assert!(event.note.len() < 400, "{}", event.note.len());
    }
}

#[test]
fn unix_seconds_are_whole_seconds_rounded_down() {
    let t = SystemTime::UNIX_EPOCH + Duration::from_millis(10_900);
    assert_eq!(unix_seconds(t), 10);
    assert_eq!(unix_seconds(SystemTime::UNIX_EPOCH), 0);
}

/// The touch's response (the workload as stored after it) reaches the state machine before the
/// watch delivers the touch's own event; the watch, behind, may first deliver an older state of
/// the workload. That older state must not bring the old stamp back, or the next decision would
/// touch the workload again for a stamp it already carries: a write that rolls nothing and an
/// Event that says it did.
#[test]
fn a_watch_event_older_than_a_touchs_response_does_not_bring_the_old_stamp_back() {
    let mut t = Test::leader(config());
    let web = shop(&mut t).generation(1);
    assert_eq!(t.workload(0.5, &web), []);
    let before = web.clone();
    assert_eq!(t.config(1.0, app_env("debug")), []);
    let stamp = t.expected(&web);
    assert_eq!(t.wake(6.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);

    let web = web.stamped(&stamp).generation(2);
    assert_eq!(
        t.workload(6.1, &web),
        [],
        "the response, fed as the workload"
    );
    assert_eq!(
        t.touched(6.1, &web, TouchResult::Patched(Some(stamp.clone()))),
        [config_changed(&web, APP_ENV_CHANGED)]
    );
    assert_eq!(t.workload(6.2, &before), [], "an older state, late");
    assert_eq!(
        t.next_wake(),
        Some(600.0),
        "nothing to do: its stamp is right"
    );
    assert_eq!(t.wake(20.0), []);
    assert_eq!(t.workload(6.3, &web), [], "the touch's own event");
    assert_eq!(t.metrics.touches("touched"), 1);

    // A newer generation is taken as usual: someone put the old stamp back.
    let old_stamp = before.stamp.clone().unwrap();
    let restamped = web.clone().stamped(&old_stamp).generation(3);
    assert_eq!(t.workload(21.0, &restamped), []);
    assert_eq!(
        t.next_wake(),
        Some(26.0),
        "a stale stamp is checked a window later"
    );
}

#[test]
fn outcome_labels_are_those_the_metrics_declare() {
    assert_eq!(
        Touched::ALL.map(Touched::as_str),
        confighash_metrics::TOUCH_OUTCOMES
    );
    assert_eq!(
        follow::Ended::ALL.map(follow::Ended::as_str),
        confighash_metrics::ROLLOUT_OUTCOMES
    );
}

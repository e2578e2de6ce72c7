//! Touches pending and in flight, leadership, and restarts.

use super::*;

// ----- touches pending and in flight -----

#[test]
fn touches_pending_and_in_flight_are_gauged() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    let gauges = |t: &Test| {
        (
            t.metric("confighash_touches_pending"),
            t.metric("confighash_touches_in_flight"),
        )
    };
    assert_eq!(gauges(&t), (0.0, 0.0));
    t.config(1.0, app_env("debug"));
    assert_eq!(gauges(&t), (0.0, 0.0), "a window is no touch yet");
    let first = t.expected(&web);
    assert_eq!(t.wake(6.0), [touch(&web, &first, APP_ENV_CHANGED, 0)]);
    assert_eq!(gauges(&t), (0.0, 1.0));
    // Another change while it is in flight: parked.
    t.config(7.0, app_env("trace"));
    t.wake(12.0);
    assert_eq!(gauges(&t), (1.0, 1.0));
    assert_eq!(t.metrics.touches_outstanding(), (1, 1));
    let second = t.expected(&web);
    let effects = t.touched(13.0, &web, TouchResult::Patched(Some(first.clone())));
    assert_eq!(effects[1], touch(&web, &second, APP_ENV_CHANGED, 0));
    assert_eq!(gauges(&t), (0.0, 1.0));
    // Turned back (the watch has not shown the first stamp yet): pending on its backoff.
    t.touched(13.1, &web, TouchResult::Patched(web.stamp.clone()));
    assert_eq!(gauges(&t), (1.0, 0.0));
    assert_eq!(t.wake(18.0), [touch(&web, &second, APP_ENV_CHANGED, 1)]);
    assert_eq!(gauges(&t), (0.0, 1.0));
    t.touched(18.1, &web, TouchResult::Patched(Some(second)));
    assert_eq!(gauges(&t), (0.0, 0.0));
    assert_eq!(t.metrics.touches_outstanding(), (0, 0));

    // Scheduled a window ahead: a workload that arrives stale.
    let api = deployment(NS, "api", &[("configMap", "app-env")]).stamped("v2:x:stale");
    let api = W {
        stamp: Some(first.clone()),
        ..api
    };
    t.workload(20.0, &api);
    assert_eq!(gauges(&t), (1.0, 0.0));
    assert_eq!(t.feed(21.0, Input::Leader(false)), []);
    assert_eq!(gauges(&t), (0.0, 0.0), "a follower has nothing pending");
}

// ----- leadership -----

#[test]
fn only_the_leader_touches_and_a_new_leader_reconciles() {
    let mut t = Test::follower(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    assert_eq!(t.wake(6.0), [], "a follower only watches");
    assert_eq!(t.next_wake(), Some(600.0));
    assert_eq!(t.metric("confighash_leader"), 0.0);

    let stamp = t.expected(&web);
    assert_eq!(
        t.feed(7.0, Input::Leader(true)),
        [touch(&web, &stamp, STALE_WHY, 0)],
        "it compares every stamp at once"
    );
    assert_eq!(t.metric("confighash_leader"), 1.0);
    assert_eq!(t.metric("confighash_reconcile_mismatches_total"), 1.0);
    assert_eq!(
        t.feed(7.5, Input::Leader(true)),
        [],
        "no change, no reconcile"
    );
    let web = web.stamped(&stamp);
    t.touched(7.6, &web, TouchResult::Patched(Some(stamp)));
    t.workload(7.7, &web);

    // Leadership lost with a change pending: dropped.
    t.config(8.0, app_env("trace"));
    assert_eq!(t.feed(9.0, Input::Leader(false)), []);
    assert_eq!(t.wake(13.0), []);
    assert_eq!(t.metric("confighash_leader"), 0.0);
}

// ----- restarts -----

#[test]
fn a_restart_with_nothing_changed_touches_nothing() {
    let mut t = Test::leader(config());
    shop(&mut t);
    assert_eq!(t.wake(600.0), [], "nor does the resync");
    assert_eq!(t.next_wake(), Some(1200.0));
}

#[test]
fn a_restart_touches_stale_stamps_and_markers_once_and_leaves_the_unstamped() {
    let mut t = Test::leader(config());
    let app = app_env("info");
    t.cluster.insert(app.0.clone(), app.1.clone());
    let uses = [("configMap", "app-env")];
    // Stamped before the ConfigMap changed, while the watcher was down.
    let stale_stamp = t.expected(&deployment(NS, "stale", &uses));
    let changed = app_env("debug");
    t.cluster.insert(changed.0.clone(), changed.1.clone());
    let fresh = deployment(NS, "fresh", &uses);
    let fresh = fresh.clone().stamped(&t.expected(&fresh));
    let stale = deployment(NS, "stale", &uses).stamped(&stale_stamp);
    let mut marked = deployment(NS, "marked", &uses);
    marked.annotations = json!({UNSTAMPED_ANNOTATION: "lookup-failed"});
    let unstamped = deployment(NS, "unstamped", &uses);
    let stamp = t.expected(&fresh);

    let effects = t.start(
        &[(NS, true)],
        &[changed],
        &[&fresh, &stale, &marked, &unstamped],
    );
    let mut expected = listed();
    expected.extend([
        touch(&marked, &stamp, STALE_WHY, 0),
        touch(&stale, &stamp, STALE_WHY, 0),
    ]);
    assert_eq!(effects, expected);
    assert_eq!(t.metric("confighash_reconcile_mismatches_total"), 2.0);
}

#[test]
fn stamp_existing_stamps_the_unstamped_at_start() {
    let mut t = Test::leader(WatcherConfig {
        rules: rules::Options {
            stamp_existing: true,
            ..rules::Options::default()
        },
        ..config()
    });
    let app = app_env("info");
    t.cluster.insert(app.0.clone(), app.1.clone());
    let unstamped = deployment(NS, "unstamped", &[("configMap", "app-env")]);
    let stamp = t.expected(&unstamped);
    let mut expected = listed();
    expected.push(touch(&unstamped, &stamp, STALE_WHY, 0));
    assert_eq!(t.start(&[(NS, true)], &[app], &[&unstamped]), expected);
}

#[test]
fn a_dropped_watch_relisting_a_change_touches_once() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    // The watch broke (410) across a change: the re-list shows it.
    let (key, stored) = app_env("debug");
    t.cluster.insert(key.clone(), stored.clone());
    let source = || ConfigSource::Watch(ObjectKind::ConfigMap);
    let applied = Watched::Applied(key.clone(), Some(stored));
    assert_eq!(t.feed(1.0, Input::Config(source(), applied)), []);
    let relisted = Watched::Relisted(HashSet::from([key]));
    assert_eq!(
        t.feed(1.1, Input::Config(source(), relisted)),
        [Effect::ReleaseMemory]
    );
    let stamp = t.expected(&web);
    assert_eq!(t.wake(6.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);
}

#[test]
fn a_relist_removes_what_vanished_meanwhile() {
    let mut t = Test::leader(config());
    let maybe = config_map(NS, "maybe", &[("FEATURE", "on")]);
    t.cluster.insert(maybe.0.clone(), maybe.1.clone());
    let opt = deployment(NS, "opt", &[("optionalConfigMap", "maybe")]);
    let opt = opt.clone().stamped(&t.expected(&opt));
    assert_eq!(
        t.start(&[(NS, true)], std::slice::from_ref(&maybe), &[&opt]),
        listed()
    );

    // Deleted while the watch was down: the re-list does not show it.
    t.cluster.remove(&maybe.0);
    let relisted = Watched::Relisted(HashSet::new());
    let source = ConfigSource::Watch(ObjectKind::ConfigMap);
    assert_eq!(
        t.feed(1.0, Input::Config(source, relisted)),
        [Effect::ReleaseMemory]
    );
    let stamp = t.expected(&opt);
    assert_ne!(Some(&stamp), opt.stamp.as_ref());
    assert_eq!(
        t.wake(6.0),
        [touch(&opt, &stamp, "ConfigMap maybe changed", 0)]
    );

    // A workload gone meanwhile is forgotten, with what was pending for it.
    t.config(7.0, config_map(NS, "maybe", &[("FEATURE", "off")]));
    let relisted = Watched::Relisted(HashSet::new());
    assert_eq!(
        t.feed(8.0, Input::Workload(WorkloadKind::DEPLOYMENT, relisted)),
        []
    );
    assert_eq!(t.wake(12.0), []);
    assert_eq!(t.next_wake(), Some(600.0));
    assert!(
        t.metrics
            .encode()
            .contains("confighash_watched_objects{kind=\"Deployment\"} 0")
    );
}

#[test]
fn a_kind_the_cluster_does_not_serve_counts_as_listed() {
    let mut t = Test::leader(config());
    for input in [
        Input::Namespace(Watched::Relisted(HashSet::new())),
        Input::Config(
            ConfigSource::Watch(ObjectKind::ConfigMap),
            Watched::Relisted(HashSet::new()),
        ),
        Input::Config(
            ConfigSource::Watch(ObjectKind::Secret),
            Watched::Relisted(HashSet::new()),
        ),
    ] {
        t.feed(0.0, input);
    }
    for kind in WorkloadKind::BUILT_IN {
        assert!(!t.state.is_synced());
        let input = if kind == WorkloadKind::ROLLOUT {
            Input::NotServed(kind)
        } else {
            Input::Workload(kind, Watched::Relisted(HashSet::new()))
        };
        t.feed(0.0, input);
    }
    assert!(t.state.is_synced());
    assert_eq!(t.metric("confighash_watcher_cache_synced"), 1.0);
}

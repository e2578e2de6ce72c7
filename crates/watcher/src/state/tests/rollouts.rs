//! How each rollout ended: `RolloutComplete` and `RolloutStalled`.

use super::*;

// ----- how each rollout ended -----

/// `w` as its watch reports it once its controller wrote `status` for `generation`.
fn with_status(t: &mut Test, seconds: f64, w: &W, generation: i64, status: Value) -> Vec<Effect> {
    let mut obj = w.object();
    obj["metadata"]["generation"] = json!(generation);
    obj["status"] = status;
    let entry = WorkloadEntry::from_object_within(w.kind, &obj, t.max_references).unwrap();
    t.feed(
        seconds,
        Input::Workload(w.kind, Watched::Applied(w.key(), entry)),
    )
}

/// What each kind's controller reports of a rollout of generation 2 that is not done, and done.
fn statuses(kind: WorkloadKind) -> (Value, Value) {
    match kind {
        WorkloadKind::DEPLOYMENT => (
            json!({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 1,
                   "availableReplicas": 1}),
            json!({"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1,
                   "availableReplicas": 1}),
        ),
        WorkloadKind::STATEFUL_SET => (
            json!({"observedGeneration": 2, "replicas": 1, "readyReplicas": 1,
                   "updatedReplicas": 0, "currentRevision": "r1", "updateRevision": "r2"}),
            json!({"observedGeneration": 2, "replicas": 1, "readyReplicas": 1,
                   "updatedReplicas": 1, "currentRevision": "r2", "updateRevision": "r2"}),
        ),
        WorkloadKind::DAEMON_SET => (
            json!({"observedGeneration": 2, "desiredNumberScheduled": 3,
                   "updatedNumberScheduled": 2, "numberAvailable": 3}),
            json!({"observedGeneration": 2, "desiredNumberScheduled": 3,
                   "updatedNumberScheduled": 3, "numberAvailable": 3}),
        ),
        WorkloadKind::ROLLOUT => (
            json!({"observedGeneration": "2", "phase": "Progressing"}),
            json!({"observedGeneration": "2", "phase": "Healthy"}),
        ),
        _ => (json!({}), json!({})),
    }
}

fn rollout_complete(w: &W, note: &str) -> Effect {
    event(
        w,
        EventType::Normal,
        ROLLOUT_COMPLETE_REASON,
        "Rollout",
        note,
    )
}

fn rollout_stalled(w: &W, note: &str) -> Effect {
    event(
        w,
        EventType::Warning,
        ROLLOUT_STALLED_REASON,
        "Rollout",
        note,
    )
}

/// `shop` opted in with ConfigMaps `app-env` and `app-flags` and `w`, stamped, using them.
fn shop_with(t: &mut Test, w: W) -> W {
    let configs = [app_env("info"), config_map(NS, "app-flags", &[("F", "1")])];
    for (k, s) in &configs {
        t.cluster.insert(k.clone(), s.clone());
    }
    let w = w.clone().stamped(&t.expected(&w));
    assert_eq!(t.start(&[(NS, true)], &configs, &[&w]), listed());
    w
}

/// A workload of `kind` named `web`, using `app-env` and `app-flags`.
fn web_of(kind: WorkloadKind) -> W {
    W {
        kind,
        ..deployment(
            NS,
            "web",
            &[("configMap", "app-env"), ("configMap", "app-flags")],
        )
    }
}

/// `app-env` changes at `at`; its window closes and the touch of `w` takes a tenth of a second
/// later. `w` with its new stamp.
fn change_and_touch(t: &mut Test, w: &W, at: f64) -> W {
    assert_eq!(t.config(at, app_env(&format!("level-{at}"))), []);
    let stamp = t.expected(w);
    assert_eq!(t.wake(at + 5.0), [touch(w, &stamp, APP_ENV_CHANGED, 0)]);
    assert_eq!(
        t.touched(at + 5.1, w, TouchResult::Patched(Some(stamp.clone()))),
        [config_changed(w, APP_ENV_CHANGED)]
    );
    w.clone().stamped(&stamp)
}

/// The value of a series with labels, as the text format writes it.
fn series(t: &Test, name: &str) -> f64 {
    t.metrics
        .encode()
        .lines()
        .find_map(|line| {
            let (n, v) = line.rsplit_once(' ')?;
            (n == name).then(|| v.trim().parse::<f64>().ok())?
        })
        .unwrap_or(0.0)
}

#[test]
fn a_deployment_rollout_is_reported_complete_with_how_long_it_took() {
    let mut t = Test::leader(config());
    let old = shop_with(&mut t, web_of(WorkloadKind::DEPLOYMENT));
    let web = change_and_touch(&mut t, &old, 1.0);
    assert_eq!(t.metrics.rollouts_followed(), 1);
    let (rolling, done) = statuses(WorkloadKind::DEPLOYMENT);

    // An event from before the touch (its stamp the old one) comes after the touch's result:
    // older, whatever its status says.
    assert_eq!(with_status(&mut t, 6.2, &old, 1, done.clone()), []);
    // The touch's own write: a new generation, not observed yet.
    assert_eq!(with_status(&mut t, 6.3, &web, 2, json!({})), []);
    assert_eq!(with_status(&mut t, 20.0, &web, 2, rolling), []);
    assert_eq!(t.metrics.rollouts_followed(), 1);
    assert_eq!(
        with_status(&mut t, 47.0, &web, 2, done.clone()),
        [rollout_complete(
            &web,
            "pods now run the config of ConfigMap app-env, changed 46s earlier"
        )]
    );
    assert_eq!(t.metrics.rollouts_followed(), 0);
    assert_eq!(t.metrics.rollout_outcomes("complete"), 1);
    assert_eq!(
        t.metric("confighash_config_change_to_rollout_complete_seconds_count"),
        1.0
    );
    assert_eq!(
        t.metric("confighash_config_change_to_rollout_complete_seconds_sum"),
        46.0
    );
    // Once.
    assert_eq!(with_status(&mut t, 48.0, &web, 2, done), []);
    assert_eq!(t.next_wake(), Some(600.0));
}

#[test]
fn every_kind_with_a_rollout_is_reported_complete_by_its_own_status() {
    for kind in [
        WorkloadKind::STATEFUL_SET,
        WorkloadKind::DAEMON_SET,
        WorkloadKind::ROLLOUT,
    ] {
        let mut t = Test::leader(config());
        let old = shop_with(&mut t, web_of(kind));
        let web = change_and_touch(&mut t, &old, 1.0);
        let (rolling, done) = statuses(kind);
        assert_eq!(with_status(&mut t, 6.3, &web, 2, rolling), [], "{kind}");
        // Done, but for the generation before the touch: not yet.
        let mut stale = done.clone();
        stale["observedGeneration"] = if kind == WorkloadKind::ROLLOUT {
            json!("1")
        } else {
            json!(1)
        };
        assert_eq!(with_status(&mut t, 7.0, &web, 2, stale), [], "{kind}");
        assert_eq!(
            with_status(&mut t, 31.0, &web, 2, done),
            [rollout_complete(
                &web,
                "pods now run the config of ConfigMap app-env, changed 30s earlier"
            )],
            "{kind}"
        );
        assert_eq!(t.metrics.rollout_outcomes("complete"), 1, "{kind}");
    }
}

#[test]
fn a_rollout_done_before_the_touch_result_is_reported_with_it() {
    let mut t = Test::leader(config());
    let old = shop_with(&mut t, web_of(WorkloadKind::DEPLOYMENT));
    t.config(1.0, app_env("debug"));
    let stamp = t.expected(&old);
    assert_eq!(t.wake(6.0), [touch(&old, &stamp, APP_ENV_CHANGED, 0)]);
    let web = old.stamped(&stamp);
    // The write and the controller's whole rollout show on the watch before the result.
    let (_, done) = statuses(WorkloadKind::DEPLOYMENT);
    assert_eq!(with_status(&mut t, 6.5, &web, 2, done), []);
    assert_eq!(
        t.touched(9.0, &web, TouchResult::Patched(Some(stamp))),
        [
            config_changed(&web, APP_ENV_CHANGED),
            rollout_complete(
                &web,
                "pods now run the config of ConfigMap app-env, changed 8s earlier"
            )
        ]
    );
    assert_eq!(t.metrics.rollouts_followed(), 0);
}

#[test]
fn a_deployment_past_its_progress_deadline_is_reported_stalled() {
    let mut t = Test::leader(config());
    let old = shop_with(&mut t, web_of(WorkloadKind::DEPLOYMENT));
    let web = change_and_touch(&mut t, &old, 1.0);
    let stalled = json!({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 1,
        "availableReplicas": 1, "conditions": [
            {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
            {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
             "message": "ReplicaSet \"web-7d9\" has timed out progressing."}]});
    assert_eq!(
        with_status(&mut t, 121.0, &web, 2, stalled.clone()),
        [rollout_stalled(
            &web,
            "the rollout of the config of ConfigMap app-env (changed 2m earlier) stalled: it \
             exceeded its progress deadline (ProgressDeadlineExceeded); pods may still run the \
             previous config (kubectl rollout status shows where it stands)"
        )]
    );
    assert_eq!(t.metrics.rollout_outcomes("stalled"), 1);
    assert_eq!(
        series(&t, "confighash_rollouts_total{outcome=\"stalled\"}"),
        1.0
    );
    assert_eq!(t.metrics.rollouts_followed(), 0, "no longer followed");
    assert_eq!(with_status(&mut t, 122.0, &web, 2, stalled), []);
}

#[test]
fn a_stateful_set_or_daemon_set_not_done_within_the_rollout_timeout_is_reported_stalled() {
    for kind in [WorkloadKind::STATEFUL_SET, WorkloadKind::DAEMON_SET] {
        let mut t = Test::leader(WatcherConfig {
            rollout_timeout: Duration::from_secs(300),
            ..config()
        });
        let old = shop_with(&mut t, web_of(kind));
        let web = change_and_touch(&mut t, &old, 1.0);
        let (rolling, _) = statuses(kind);
        assert_eq!(with_status(&mut t, 100.0, &web, 2, rolling), []);
        assert_eq!(
            t.next_wake(),
            Some(306.1),
            "{kind}: the timeout after the touch"
        );
        assert_eq!(t.wake(306.0), [], "{kind}");
        assert_eq!(
            t.wake(306.1),
            [rollout_stalled(
                &web,
                "the rollout of the config of ConfigMap app-env (changed 5m 5s earlier) stalled: \
                 it is not complete 5m after the touch (--rollout-timeout); pods may still run \
                 the previous config (kubectl rollout status shows where it stands)"
            )],
            "{kind}"
        );
        assert_eq!(t.next_wake(), Some(600.0), "{kind}");
        assert_eq!(t.metrics.rollouts_followed(), 0, "{kind}");
    }
}

#[test]
fn a_degraded_argo_rollout_is_reported_stalled() {
    let mut t = Test::leader(config());
    let old = shop_with(&mut t, web_of(WorkloadKind::ROLLOUT));
    let web = change_and_touch(&mut t, &old, 1.0);
    assert_eq!(
        with_status(
            &mut t,
            61.0,
            &web,
            2,
            json!({"observedGeneration": "2", "phase": "Degraded"})
        ),
        [rollout_stalled(
            &web,
            "the rollout of the config of ConfigMap app-env (changed 1m earlier) stalled: the \
             Argo Rollout is Degraded; pods may still run the previous config (kubectl rollout \
             status shows where it stands)"
        )]
    );
}

#[test]
fn a_deployment_whose_controller_reports_nothing_is_let_go_after_a_day() {
    let mut t = Test::leader(WatcherConfig {
        resync: FOLLOW_AT_MOST * 2,
        ..config()
    });
    let old = shop_with(&mut t, web_of(WorkloadKind::DEPLOYMENT));
    change_and_touch(&mut t, &old, 1.0);
    let deadline = 6.1 + FOLLOW_AT_MOST.as_secs_f64();
    assert_eq!(t.next_wake(), Some(deadline));
    assert_eq!(t.wake(deadline), [], "no Event");
    assert_eq!(t.metrics.rollout_outcomes("abandoned"), 1);
    assert_eq!(t.metrics.rollouts_followed(), 0);
}

#[test]
fn a_workload_deleted_mid_rollout_is_let_go_without_an_event() {
    for kind in [WorkloadKind::DEPLOYMENT, WorkloadKind::STATEFUL_SET] {
        let mut t = Test::leader(config());
        let old = shop_with(&mut t, web_of(kind));
        let web = change_and_touch(&mut t, &old, 1.0);
        let (rolling, done) = statuses(kind);
        assert_eq!(with_status(&mut t, 10.0, &web, 2, rolling), []);
        assert_eq!(
            t.feed(20.0, Input::Workload(kind, Watched::Deleted(web.key()))),
            []
        );
        assert_eq!(t.metrics.rollout_outcomes("gone"), 1, "{kind}");
        assert_eq!(t.metrics.rollouts_followed(), 0, "{kind}");
        // One of the same name, created again, is not the one followed.
        let again = W {
            uid: "uid-web-2".to_owned(),
            ..web.clone()
        };
        assert_eq!(with_status(&mut t, 30.0, &again, 1, done), [], "{kind}");
        assert_eq!(t.wake(606.1), [], "{kind}: no timeout either");
    }
}

#[test]
fn a_second_touch_during_a_followed_rollout_replaces_it() {
    let mut t = Test::leader(config());
    let old = shop_with(&mut t, web_of(WorkloadKind::DEPLOYMENT));
    let first = change_and_touch(&mut t, &old, 1.0);
    let (rolling, done) = statuses(WorkloadKind::DEPLOYMENT);
    assert_eq!(with_status(&mut t, 6.3, &first, 2, rolling.clone()), []);

    // app-flags changes while the first rollout goes on.
    let flags = config_map(NS, "app-flags", &[("F", "2")]);
    assert_eq!(t.config(10.0, flags), []);
    let stamp = t.expected(&first);
    let why = "ConfigMap app-flags changed";
    assert_eq!(t.wake(15.0), [touch(&first, &stamp, why, 0)]);
    let second = first.clone().stamped(&stamp);
    // The second write shows on the watch before its result: the first rollout is superseded.
    assert_eq!(
        with_status(&mut t, 15.05, &second, 3, json!({"observedGeneration": 2})),
        []
    );
    assert_eq!(t.metrics.rollout_outcomes("superseded"), 1);
    assert_eq!(
        t.touched(15.1, &second, TouchResult::Patched(Some(stamp))),
        [config_changed(&second, why)]
    );
    let _ = done;
    let mut done = statuses(WorkloadKind::DEPLOYMENT).1;
    done["observedGeneration"] = json!(3);
    assert_eq!(
        with_status(&mut t, 40.0, &second, 3, done),
        [rollout_complete(
            &second,
            "pods now run the config of ConfigMap app-flags, changed 30s earlier"
        )]
    );
    assert_eq!(t.metrics.rollout_outcomes("complete"), 1);
    assert_eq!(t.metrics.rollout_outcomes("superseded"), 1);
}

#[test]
fn a_second_touch_whose_result_comes_first_replaces_it_too() {
    let mut t = Test::leader(config());
    let old = shop_with(&mut t, web_of(WorkloadKind::STATEFUL_SET));
    let first = change_and_touch(&mut t, &old, 1.0);
    let (rolling, done) = statuses(WorkloadKind::STATEFUL_SET);
    assert_eq!(with_status(&mut t, 6.3, &first, 2, rolling.clone()), []);
    let second = change_and_touch(&mut t, &first, 20.0);
    assert_eq!(t.metrics.rollout_outcomes("superseded"), 1);
    // Its write shows on the watch after the result.
    assert_eq!(with_status(&mut t, 25.2, &second, 3, rolling), []);
    assert_eq!(t.metrics.rollouts_followed(), 1);
    // The timeout runs from the second touch.
    assert_eq!(t.next_wake(), Some(600.0));
    assert_eq!(t.wake(600.0), []);
    assert_eq!(t.next_wake(), Some(625.1));
    let mut done = done;
    done["observedGeneration"] = json!(3);
    assert_eq!(
        with_status(&mut t, 30.0, &second, 3, done),
        [rollout_complete(
            &second,
            "pods now run the config of ConfigMap app-env, changed 10s earlier"
        )]
    );
}

#[test]
fn workloads_whose_pods_do_not_roll_by_themselves_are_not_followed() {
    // OnDelete.
    let mut t = Test::leader(config());
    let mut db = web_of(WorkloadKind::STATEFUL_SET);
    db.on_delete = true;
    let db = shop_with(&mut t, db);
    t.config(1.0, app_env("debug"));
    let stamp = t.expected(&db);
    assert_eq!(t.wake(6.0), [touch(&db, &stamp, APP_ENV_CHANGED, 0)]);
    let effects = t.touched(6.1, &db, TouchResult::Patched(Some(stamp.clone())));
    assert!(
        matches!(&effects[..], [Effect::Event(e)] if e.reason == CONFIG_CHANGED_REASON),
        "{effects:?}"
    );
    assert_eq!(t.metrics.rollouts_followed(), 0);
    let (_, done) = statuses(WorkloadKind::STATEFUL_SET);
    assert_eq!(with_status(&mut t, 7.0, &db.stamped(&stamp), 2, done), []);
    assert_eq!(t.wake(606.1), []);

    // A Deployment paused while followed is let go.
    let mut t = Test::leader(config());
    let old = shop_with(&mut t, web_of(WorkloadKind::DEPLOYMENT));
    let web = change_and_touch(&mut t, &old, 1.0);
    let mut paused = web.object();
    paused["spec"]["paused"] = json!(true);
    let entry = WorkloadEntry::from_object(web.kind, &paused).unwrap();
    assert_eq!(
        t.feed(
            8.0,
            Input::Workload(web.kind, Watched::Applied(web.key(), entry))
        ),
        []
    );
    assert_eq!(t.metrics.rollout_outcomes("abandoned"), 1);
    assert_eq!(t.metrics.rollouts_followed(), 0);
}

#[test]
fn a_touch_of_reconcile_is_not_followed() {
    let mut t = Test::leader(config());
    shop(&mut t);
    let old = deployment(NS, "api", &[("configMap", "api-env")]);
    let old_stamp = t.expected(&old);
    t.config(1.0, config_map(NS, "api-env", &[("A", "1")]));
    let api = old.stamped(&old_stamp);
    t.workload(1.5, &api);
    let stamp = t.expected(&api);
    assert_eq!(t.wake(6.5), [touch(&api, &stamp, STALE_WHY, 0)]);
    t.touched(6.6, &api, TouchResult::Patched(Some(stamp)));
    assert_eq!(t.metrics.rollouts_followed(), 0);
}

#[test]
fn losing_leadership_lets_go_of_followed_rollouts() {
    let mut t = Test::leader(config());
    let old = shop_with(&mut t, web_of(WorkloadKind::STATEFUL_SET));
    let web = change_and_touch(&mut t, &old, 1.0);
    assert_eq!(t.metrics.rollouts_followed(), 1);
    assert_eq!(t.feed(10.0, Input::Leader(false)), []);
    assert_eq!(t.metrics.rollouts_followed(), 0);
    assert_eq!(t.metrics.rollout_outcomes("abandoned"), 1);
    let (_, done) = statuses(WorkloadKind::STATEFUL_SET);
    assert_eq!(with_status(&mut t, 20.0, &web, 2, done.clone()), []);
    // Leading again, it does not know what it followed before.
    assert_eq!(t.feed(30.0, Input::Leader(true)), []);
    assert_eq!(with_status(&mut t, 31.0, &web, 2, done), []);
    assert_eq!(t.wake(606.1), [], "no timeout");

    // A touch whose result comes after leadership was lost is not followed either.
    let mut t = Test::leader(config());
    let old = shop_with(&mut t, web_of(WorkloadKind::DEPLOYMENT));
    t.config(1.0, app_env("debug"));
    let stamp = t.expected(&old);
    assert_eq!(t.wake(6.0), [touch(&old, &stamp, APP_ENV_CHANGED, 0)]);
    t.feed(6.05, Input::Leader(false));
    t.touched(6.1, &old, TouchResult::Patched(Some(stamp)));
    assert_eq!(t.metrics.rollouts_followed(), 0);
}

#[test]
fn a_namespace_terminating_mid_rollout_lets_go_without_an_event() {
    let mut t = Test::leader(config());
    let old = shop_with(&mut t, web_of(WorkloadKind::DAEMON_SET));
    change_and_touch(&mut t, &old, 1.0);
    assert_eq!(t.terminate(10.0, NS, true), []);
    assert_eq!(t.metrics.rollout_outcomes("gone"), 1);
    assert_eq!(t.wake(606.1), []);
}

//! Touches that fail or do not take: retries, their backoff and `TouchFailed`.

use super::*;

// ----- retries -----

#[test]
fn a_stamp_kept_by_the_webhook_is_retried_for_the_same_change() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    let old = web.stamp.clone();
    t.config(1.0, app_env("debug"));
    let stamp = t.expected(&web);
    assert_eq!(t.wake(6.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);

    // The webhook's lookup failed: it kept the old stamp.
    assert_eq!(t.touched(6.1, &web, TouchResult::Patched(old)), []);
    assert_eq!(t.metrics.touches("kept-by-webhook"), 1);
    assert_eq!(t.metric("confighash_touch_retries_total"), 1.0);
    assert_eq!(t.next_wake(), Some(7.1), "retried after retry_base");
    // At most one touch per workload per debounce: held until 11.
    assert_eq!(t.wake(7.1), []);
    assert_eq!(t.next_wake(), Some(11.0));
    assert_eq!(
        t.wake(11.0),
        [touch(&web, &stamp, APP_ENV_CHANGED, 1)],
        "the retry names the change, as its Event will"
    );
    assert_eq!(
        t.touched(11.1, &web, TouchResult::Patched(Some(stamp.clone()))),
        [config_changed(&web, APP_ENV_CHANGED)]
    );
}

#[test]
fn a_touch_that_keeps_failing_records_one_touch_failed_event_per_ten_minutes() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    let stamp = t.expected(&web);
    let forbidden = || {
        TouchResult::Failed(TouchError::Forbidden(
            "the API server answered 403 Forbidden".to_owned(),
        ))
    };
    assert_eq!(t.wake(6.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);
    assert_eq!(
        t.touched(6.0, &web, forbidden()),
        [],
        "one failure: no Event yet"
    );
    assert_eq!(t.next_wake(), Some(7.0));
    assert_eq!(t.wake(7.0), []);
    assert_eq!(t.wake(11.0), [touch(&web, &stamp, APP_ENV_CHANGED, 1)]);
    let note = "re-stamping the pod template after ConfigMap app-env changed failed 2 times in a \
                row: the patch was refused (the API server answered 403 Forbidden): confighash's \
                RBAC must allow patch on deployments; retrying in 2s";
    assert_eq!(
        t.touched(11.0, &web, forbidden()),
        [event(
            &web,
            EventType::Warning,
            TOUCH_FAILED_REASON,
            "Restamp",
            note
        )]
    );

    // It goes on failing, with backoff: one more Event once ten minutes have passed.
    let mut touches = vec![];
    let mut events = vec![];
    while let Some(next) = t.next_wake().filter(|n| *n < 1100.0) {
        for effect in t.wake(next) {
            let Effect::Touch(touch) = effect else {
                panic!("{effect:?}");
            };
            touches.push((next, touch.attempt));
            for effect in t.touched(next, &web, forbidden()) {
                events.push((next, effect));
            }
        }
    }
    assert_eq!(
        touches,
        [
            (16.0, 2),
            (21.0, 3),
            (29.0, 4),
            (45.0, 5),
            (77.0, 6),
            (141.0, 7),
            (269.0, 8),
            (525.0, 9),
            (1037.0, 10)
        ]
    );
    let note = "re-stamping the pod template after ConfigMap app-env changed failed 11 times in a \
                row: the patch was refused (the API server answered 403 Forbidden): confighash's \
                RBAC must allow patch on deployments; retrying in 10m";
    assert_eq!(
        events,
        [(
            1037.0,
            event(
                &web,
                EventType::Warning,
                TOUCH_FAILED_REASON,
                "Restamp",
                note
            )
        )]
    );
    assert_eq!(t.metrics.touches("error"), 11);

    // The resync finds it pending and leaves its time alone.
    assert_eq!(t.wake(1200.0), []);
    assert_eq!(t.next_wake(), Some(1637.0));
    // Allowed again: it lands, and its Event names the change.
    assert_eq!(t.wake(1637.0), [touch(&web, &stamp, APP_ENV_CHANGED, 11)]);
    assert_eq!(
        t.touched(1637.0, &web, TouchResult::Patched(Some(stamp.clone()))),
        [config_changed(&web, APP_ENV_CHANGED)]
    );
}

#[test]
fn other_failures_are_retried_and_named_as_they_are() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    let stamp = t.expected(&web);
    let failed =
        || TouchResult::Failed(TouchError::Other("the API server answered 500".to_owned()));
    t.wake(6.0);
    assert_eq!(t.touched(6.0, &web, failed()), []);
    assert_eq!(t.wake(11.0), [touch(&web, &stamp, APP_ENV_CHANGED, 1)]);
    let note = "re-stamping the pod template after ConfigMap app-env changed failed 2 times in a \
                row: the patch failed (the API server answered 500); retrying in 2s";
    assert_eq!(
        t.touched(11.5, &web, failed()),
        [event(
            &web,
            EventType::Warning,
            TOUCH_FAILED_REASON,
            "Restamp",
            note
        )]
    );
}

#[test]
fn a_workload_gone_before_its_touch_is_not_retried() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    t.wake(6.0);
    assert_eq!(t.touched(6.1, &web, TouchResult::Gone), []);
    assert_eq!(t.metrics.touches("gone"), 1);
    assert_eq!(t.next_wake(), Some(600.0));
    // A result for a touch not in flight is ignored.
    assert_eq!(t.touched(6.2, &web, TouchResult::Gone), []);
    assert_eq!(t.metrics.touches("gone"), 1);
}

// ----- backoff of touches that do not take -----

/// When a touch's own watch event (the write of a touch the webhook turned back is still stored,
/// so the workload comes back with its old stamp) arrives, relative to the touch's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Echo {
    Never,
    Before,
    After,
}

/// The webhook turns back every touch of `w` sent before `until` (seconds), each touch's own
/// watch event arriving as `echo` says, at the same instant. The touches sent (when, attempt)
/// and every other effect, in order.
pub(super) fn revert_until(
    t: &mut Test,
    w: &W,
    until: f64,
    echo: Echo,
) -> (Vec<(f64, u32)>, Vec<Effect>) {
    let mut touches = vec![];
    let mut others = vec![];
    while let Some(next) = t.next_wake().filter(|n| *n < until) {
        for effect in t.wake(next) {
            let Effect::Touch(touch) = effect else {
                others.push(effect);
                continue;
            };
            assert_eq!(touch.workload, w.key());
            touches.push((next, touch.attempt));
            if echo == Echo::Before {
                others.extend(t.workload(next, w));
            }
            others.extend(t.touched(next, w, TouchResult::Patched(w.stamp.clone())));
            if echo == Echo::After {
                others.extend(t.workload(next, w));
            }
        }
    }
    (touches, others)
}

/// The touches of a change whose touches the webhook keeps turning back, from a first touch at
/// 6 s: the per-workload interval (5 s) first, then the backoff doubling from 1 s.
pub(super) const REVERTED: [(f64, u32); 11] = [
    (6.0, 0),
    (11.0, 1),
    (16.0, 2),
    (21.0, 3),
    (29.0, 4),
    (45.0, 5),
    (77.0, 6),
    (141.0, 7),
    (269.0, 8),
    (525.0, 9),
    (1037.0, 10),
];

fn kept_by_webhook_note(failures: u32, retry_in: &str) -> String {
    format!(
        "re-stamping the pod template after ConfigMap app-env changed failed {failures} times in \
         a row: the webhook kept the old stamp (it could not read the referenced ConfigMaps and \
         Secrets, or decided otherwise), so the pod template was not changed and its pods have \
         not rolled; retrying in {retry_in}"
    )
}

fn touch_failed(w: &W, note: &str) -> Effect {
    event(w, EventType::Warning, TOUCH_FAILED_REASON, "Restamp", note)
}

#[test]
fn a_reverted_touch_backs_off_whenever_its_own_watch_event_arrives() {
    for echo in [Echo::Never, Echo::Before, Echo::After] {
        let mut t = Test::leader(config());
        let web = shop(&mut t);
        t.config(1.0, app_env("debug"));
        let (touches, others) = revert_until(&mut t, &web, 1100.0, echo);
        assert_eq!(touches, REVERTED, "{echo:?}");
        assert_eq!(
            others,
            [
                touch_failed(&web, &kept_by_webhook_note(2, "2s")),
                touch_failed(&web, &kept_by_webhook_note(11, "10m")),
            ],
            "{echo:?}: the second failure, then once per ten minutes"
        );
        assert_eq!(t.metrics.touches("kept-by-webhook"), 11, "{echo:?}");
        assert_eq!(t.metric("confighash_touch_retries_total"), 11.0);
        assert_eq!(t.next_wake(), Some(1200.0), "{echo:?}: the resync first");
        assert_eq!(
            t.wake(1200.0),
            [],
            "{echo:?}: which leaves the backoff alone"
        );
        assert_eq!(t.next_wake(), Some(1637.0), "{echo:?}: capped at --resync");
    }
}

#[test]
fn an_echo_before_the_result_no_longer_caps_the_backoff_at_the_window() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    let (touches, _) = revert_until(&mut t, &web, 45.0, Echo::Before);
    assert_eq!(touches, REVERTED[..5]);
    // The touch at 29 came back as a watch event, asking for a check a window later (34), then
    // as a result: the retry waits for the backoff.
    assert_eq!(t.next_wake(), Some(45.0));
    assert_eq!(t.wake(34.0), []);
}

#[test]
fn watch_events_and_resyncs_during_a_backoff_do_not_shorten_it() {
    let mut t = Test::leader(WatcherConfig {
        resync: Duration::from_secs(60),
        ..config()
    });
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    let (touches, _) = revert_until(&mut t, &web, 78.0, Echo::After);
    assert_eq!(
        touches,
        REVERTED[..7],
        "the touch at 77 waits 64 s, capped at 60"
    );
    for second in 78..137 {
        if second == 120 {
            assert_eq!(t.wake(120.0), [], "the resync");
        }
        assert_eq!(t.workload(f64::from(second), &web), [], "at {second}");
        let next = if second < 120 { 120.0 } else { 137.0 };
        assert_eq!(t.next_wake(), Some(next), "at {second}");
    }
    let stamp = t.expected(&web);
    assert_eq!(t.wake(137.0), [touch(&web, &stamp, APP_ENV_CHANGED, 7)]);
    t.touched(137.0, &web, TouchResult::Patched(web.stamp.clone()));
    assert_eq!(
        t.next_wake(),
        Some(180.0),
        "the resync at 180, the retry at 197"
    );
    assert_eq!(t.wake(180.0), []);
    assert_eq!(t.wake(197.0), [touch(&web, &stamp, APP_ENV_CHANGED, 8)]);
}

#[test]
fn a_failed_touch_whose_event_comes_first_backs_off_too() {
    // A patch stored but answered with an error (a timeout on the way back): the watch shows
    // the write before the error comes back.
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    let failed = || TouchResult::Failed(TouchError::Other("timed out".to_owned()));
    let mut touches = vec![];
    while let Some(next) = t.next_wake().filter(|n| *n < 100.0) {
        for effect in t.wake(next) {
            if let Effect::Touch(touch) = effect {
                touches.push((next, touch.attempt));
                t.workload(next, &web);
                t.touched(next, &web, failed());
            }
        }
    }
    assert_eq!(touches, REVERTED[..7]);
    assert_eq!(t.metrics.touches("error"), 7);
}

#[test]
fn a_touch_that_takes_ends_the_backoff() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    let (touches, _) = revert_until(&mut t, &web, 30.0, Echo::After);
    assert_eq!(touches, REVERTED[..5]);
    // The webhook reads again: the retry at 45 takes.
    let stamp = t.expected(&web);
    assert_eq!(t.wake(45.0), [touch(&web, &stamp, APP_ENV_CHANGED, 5)]);
    assert_eq!(
        t.touched(45.0, &web, TouchResult::Patched(Some(stamp.clone()))),
        [config_changed(&web, APP_ENV_CHANGED)]
    );
    let web = web.stamped(&stamp);
    assert_eq!(t.workload(45.0, &web), []);

    // The next change is touched when its window closes, as a first attempt.
    t.config(60.0, app_env("trace"));
    let next = t.expected(&web);
    assert_eq!(t.wake(65.0), [touch(&web, &next, APP_ENV_CHANGED, 0)]);
    // And a failure now starts from the first delay again.
    t.touched(65.0, &web, TouchResult::Patched(web.stamp.clone()));
    assert_eq!(t.next_wake(), Some(66.0));
}

#[test]
fn a_stamp_written_by_someone_else_ends_the_backoff() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    revert_until(&mut t, &web, 30.0, Echo::After);
    assert_eq!(t.next_wake(), Some(45.0));
    // An update of the workload that the webhook stamped: the stamp is right, nothing pending.
    let stamp = t.expected(&web);
    let web = web.stamped(&stamp);
    assert_eq!(t.workload(31.0, &web), []);
    assert_eq!(t.wake(45.0), []);
    assert_eq!(t.metric("confighash_touches_pending"), 0.0);

    t.config(50.0, app_env("trace"));
    let next = t.expected(&web);
    assert_eq!(t.wake(55.0), [touch(&web, &next, APP_ENV_CHANGED, 0)]);
}

#[test]
fn a_deleted_workload_loses_its_backoff() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    revert_until(&mut t, &web, 30.0, Echo::After);
    assert_eq!(t.next_wake(), Some(45.0));
    let deleted = Watched::Deleted(web.key());
    assert_eq!(
        t.feed(31.0, Input::Workload(WorkloadKind::DEPLOYMENT, deleted)),
        []
    );
    assert_eq!(t.next_wake(), Some(600.0));

    // Created again (another uid, stamped by the webhook): a change touches it at once.
    let web = W {
        uid: "uid-web-2".to_owned(),
        ..web.clone().stamped(&t.expected(&web))
    };
    assert_eq!(t.workload(32.0, &web), []);
    t.config(33.0, app_env("trace"));
    let stamp = t.expected(&web);
    assert_eq!(t.wake(38.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);
}

#[test]
fn a_new_change_during_a_backoff_waits_for_it_and_is_named_by_the_retry() {
    let mut t = Test::leader(config());
    let app = app_env("info");
    let db = secret(NS, "db", &[("password", "one")]);
    for (k, v) in [&app, &db] {
        t.cluster.insert(k.clone(), v.clone());
    }
    let web = deployment(NS, "web", &[("configMap", "app-env"), ("secret", "db")]);
    let web = web.clone().stamped(&t.expected(&web));
    t.start(&[(NS, true)], &[app, db], &[&web]);
    t.config(1.0, app_env("debug"));
    let (touches, _) = revert_until(&mut t, &web, 30.0, Echo::After);
    assert_eq!(touches, REVERTED[..5]);
    assert_eq!(t.next_wake(), Some(45.0));

    // The Secret changes: its window closes at 36, and the touch still waits for 45.
    assert_eq!(t.config(31.0, secret(NS, "db", &[("password", "two")])), []);
    assert_eq!(t.next_wake(), Some(36.0));
    assert_eq!(t.wake(36.0), []);
    assert_eq!(t.next_wake(), Some(45.0));
    let stamp = t.expected(&web);
    let both = "ConfigMap app-env, Secret db changed";
    assert_eq!(t.wake(45.0), [touch(&web, &stamp, both, 5)]);
    assert_eq!(
        t.touched(45.0, &web, TouchResult::Patched(Some(stamp))),
        [config_changed(&web, both)]
    );
}

#[test]
fn leadership_lost_ends_the_backoff_and_a_new_leader_reconciles_afresh() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    revert_until(&mut t, &web, 30.0, Echo::After);
    assert_eq!(t.next_wake(), Some(45.0));
    assert_eq!(t.feed(31.0, Input::Leader(false)), []);
    assert_eq!(t.next_wake(), Some(600.0));
    assert_eq!(t.feed(32.0, Input::Leader(true)), []);
    assert_eq!(t.next_wake(), Some(34.0), "a window after the last touch");
    let stamp = t.expected(&web);
    assert_eq!(t.wake(34.0), [touch(&web, &stamp, STALE_WHY, 0)]);
}

//! Namespaces being deleted: nothing pending there is touched, no Event recorded.

use super::retries::Echo;
use super::retries::REVERTED;
use super::retries::revert_until;
use super::*;

// ----- terminating namespaces -----

fn roll_on_delete() -> WatcherConfig {
    WatcherConfig {
        rules: rules::Options {
            roll_on_delete: true,
            ..rules::Options::default()
        },
        ..config()
    }
}

#[test]
fn a_terminating_namespace_drops_what_is_pending_and_its_deletions_roll_nothing() {
    for config in [config(), roll_on_delete()] {
        let roll = config.rules.roll_on_delete;
        let mut t = Test::leader(config);
        let web = shop(&mut t);
        t.config(1.0, app_env("debug"));
        // A touch the webhook turned back: retried at 11.
        let (touches, _) = revert_until(&mut t, &web, 7.0, Echo::After);
        assert_eq!(touches, REVERTED[..1]);
        assert_eq!(t.metric("confighash_touches_pending"), 1.0);

        assert_eq!(t.terminate(8.0, NS, true), [], "roll_on_delete {roll}");
        assert_eq!(t.metric("confighash_touches_pending"), 0.0);
        assert_eq!(t.next_wake(), Some(600.0), "roll_on_delete {roll}");
        // Its objects go: deletions of ConfigMaps look like changes, but roll nothing.
        assert_eq!(t.delete_config(9.0, &app_env("info").0), []);
        assert_eq!(
            t.next_wake(),
            Some(600.0),
            "roll_on_delete {roll}: no window"
        );
        assert_eq!(t.workload(9.5, &web), [], "its own deletion's MODIFIED");
        assert_eq!(t.wake(14.0), []);
        assert_eq!(t.wake(600.0), [], "nor does the resync");
        let deleted = Watched::Deleted(web.key());
        t.feed(601.0, Input::Workload(WorkloadKind::DEPLOYMENT, deleted));
        let deleted = Watched::Deleted(NS.to_owned());
        assert_eq!(t.feed(602.0, Input::Namespace(deleted)), []);
        assert_eq!(t.metric("confighash_touches_pending"), 0.0);
        assert_eq!(t.metric("confighash_touches_in_flight"), 0.0);
    }
}

#[test]
fn a_namespace_that_terminates_while_a_window_is_open_is_left_alone() {
    for config in [config(), roll_on_delete()] {
        let roll = config.rules.roll_on_delete;
        let mut t = Test::leader(config);
        shop(&mut t);
        t.config(1.0, app_env("debug"));
        assert_eq!(t.terminate(2.0, NS, true), []);
        assert_eq!(t.delete_config(3.0, &app_env("info").0), []);
        assert_eq!(t.next_wake(), Some(6.0), "roll_on_delete {roll}");
        assert_eq!(t.wake(6.0), [], "roll_on_delete {roll}");
        assert_eq!(t.next_wake(), Some(600.0));
    }
}

#[test]
fn a_touch_in_flight_when_its_namespace_terminates_records_no_event_and_is_not_retried() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    let stamp = t.expected(&web);
    assert_eq!(t.wake(6.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);
    assert_eq!(t.terminate(6.05, NS, true), []);
    assert_eq!(
        t.touched(6.1, &web, TouchResult::Patched(Some(stamp.clone()))),
        [],
        "no ConfigChanged Event: creates in the namespace are refused"
    );
    assert_eq!(t.metrics.touches("touched"), 1);

    // One that failed once before: its second failure would record a TouchFailed Event.
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    let (touches, _) = revert_until(&mut t, &web, 7.0, Echo::After);
    assert_eq!(touches, REVERTED[..1]);
    assert_eq!(t.wake(11.0), [touch(&web, &stamp, APP_ENV_CHANGED, 1)]);
    assert_eq!(t.metric("confighash_touches_in_flight"), 1.0);
    assert_eq!(t.terminate(11.05, NS, true), []);
    let forbidden = TouchResult::Failed(TouchError::Forbidden("403".to_owned()));
    assert_eq!(t.touched(11.1, &web, forbidden), []);
    assert_eq!(t.metrics.touches("error"), 1);
    assert_eq!(t.next_wake(), Some(600.0), "not retried");
    assert_eq!(t.metric("confighash_touches_pending"), 0.0);
    assert_eq!(t.metric("confighash_touches_in_flight"), 0.0);
}

#[test]
fn a_terminating_namespace_gets_no_event_and_no_touch_from_a_new_leader() {
    let mut t = Test::follower(WatcherConfig {
        max_references: 1,
        ..config()
    });
    let app = app_env("info");
    t.cluster.insert(app.0.clone(), app.1.clone());
    let big = deployment(NS, "big", &[("configMap", "a"), ("configMap", "b")]);
    let stale = deployment(NS, "stale", &[("configMap", "app-env")]);
    let stale = stale.clone().stamped(&t.expected(&stale));
    let changed = app_env("debug");
    t.cluster.insert(changed.0.clone(), changed.1.clone());
    // A stale stamp and a workload over --max-references.
    assert_eq!(
        t.start(&[(NS, true)], &[changed], &[&big, &stale]),
        listed()
    );
    assert_eq!(t.terminate(0.5, NS, true), []);
    assert_eq!(t.feed(1.0, Input::Leader(true)), [], "reconcile skips it");
    assert_eq!(t.workload(2.0, &big), [], "no TooManyReferences Event");
    assert_eq!(t.wake(600.0), []);

    // Deleted, and a namespace of the same name made again: a namespace like any other.
    let deleted = Watched::Deleted(NS.to_owned());
    t.feed(601.0, Input::Namespace(deleted));
    t.namespace(602.0, NS, true);
    let note = "it references more than 1 ConfigMaps and Secrets (--max-references): confighash \
                does not read them, stamp it or roll it on config changes";
    let big = W {
        uid: "uid-big-2".to_owned(),
        ..big
    };
    let deleted = Watched::Deleted(big.key());
    t.feed(603.0, Input::Workload(WorkloadKind::DEPLOYMENT, deleted));
    assert_eq!(
        t.workload(603.0, &big),
        [event(
            &big,
            EventType::Warning,
            TOO_MANY_REFERENCES_REASON,
            "Skip",
            note
        )]
    );
}

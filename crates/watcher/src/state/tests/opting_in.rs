//! Namespaces opting in: listed, then their changes touch with every reference.

use super::*;

// ----- namespaces opting in -----

#[test]
fn a_namespace_opting_in_is_listed_then_its_changes_touch_with_every_reference() {
    let mut t = Test::leader(config());
    let uses = [("configMap", "app-env"), ("secret", "db")];
    let web = deployment("late", "web", &uses);
    let app_env_late = |level| config_map("late", "app-env", &[("LOG_LEVEL", level)]);
    let db = secret("late", "db", &[("password", "one")]);
    let effects = t.start(
        &[(NS, true), ("late", false)],
        &[app_env_late("info"), db.clone()],
        &[&web],
    );
    assert_eq!(effects, listed());
    assert!(
        t.metrics
            .encode()
            .contains("confighash_watched_objects{kind=\"Secret\"} 0"),
        "left out while not opted in"
    );

    assert_eq!(
        t.namespace(1.0, "late", true),
        [Effect::Backfill {
            namespace: "late".to_owned(),
            generation: 1
        }]
    );
    // A change seen on the watch during the list: its window closes before the list is in.
    t.config(2.0, app_env_late("debug"));
    assert_eq!(t.wake(7.0), [], "decided once the list is in");

    // The list (older than the watch for app-env) arrives.
    let source = || ConfigSource::Backfill {
        namespace: "late".to_owned(),
        generation: 1,
    };
    for (key, stored) in [app_env_late("info"), db.clone()] {
        let applied = Watched::Applied(key, Some(stored));
        assert_eq!(t.feed(8.0, Input::Config(source(), applied)), []);
    }
    let all = HashSet::from([app_env_late("info").0, db.0.clone()]);
    let stamp = t.expected(&web);
    assert_eq!(
        t.feed(8.0, Input::Config(source(), Watched::Relisted(all))),
        [
            Effect::ReleaseMemory,
            touch(&web, &stamp, APP_ENV_CHANGED, 0)
        ],
        "the stamp covers the Secret too, which did not change"
    );
}

#[test]
fn a_list_of_an_earlier_opt_in_is_dropped() {
    let mut t = Test::leader(config());
    t.start(&[("late", false)], &[], &[]);
    t.namespace(1.0, "late", true);
    t.namespace(2.0, "late", false);
    assert_eq!(
        t.namespace(3.0, "late", true),
        [Effect::Backfill {
            namespace: "late".to_owned(),
            generation: 2
        }]
    );
    let old = ConfigSource::Backfill {
        namespace: "late".to_owned(),
        generation: 1,
    };
    let (key, stored) = config_map("late", "app-env", &[]);
    let applied = Watched::Applied(key.clone(), Some(stored));
    assert_eq!(t.feed(4.0, Input::Config(old.clone(), applied)), []);
    let relisted = Watched::Relisted(HashSet::from([key]));
    assert_eq!(t.feed(4.0, Input::Config(old, relisted)), []);
    assert!(
        t.metrics
            .encode()
            .contains("confighash_watched_objects{kind=\"ConfigMap\"} 0")
    );
}

#[test]
fn a_change_made_while_opted_out_touches_once_when_the_namespace_opts_back_in() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.namespace(1.0, NS, false);
    assert_eq!(t.config(2.0, app_env("debug")), [], "not kept meanwhile");
    assert_eq!(t.wake(7.0), []);

    let backfill = Effect::Backfill {
        namespace: NS.to_owned(),
        generation: 1,
    };
    assert_eq!(t.namespace(8.0, NS, true), [backfill]);
    let source = || ConfigSource::Backfill {
        namespace: NS.to_owned(),
        generation: 1,
    };
    let (key, stored) = app_env("debug");
    let applied = Watched::Applied(key.clone(), Some(stored));
    t.feed(9.0, Input::Config(source(), applied));
    let relisted = Watched::Relisted(HashSet::from([key]));
    assert_eq!(
        t.feed(9.0, Input::Config(source(), relisted)),
        [Effect::ReleaseMemory]
    );
    assert_eq!(t.next_wake(), Some(14.0), "compared a window later");
    let stamp = t.expected(&web);
    assert_eq!(t.wake(14.0), [touch(&web, &stamp, STALE_WHY, 0)]);
}

#[test]
fn a_namespace_seen_for_the_first_time_is_compared_a_window_later() {
    let mut t = Test::leader(config());
    t.start(&[], &[], &[]);
    let stale = deployment("new", "web", &[]).stamped("v2:00000000:other-key");
    let uses = [("configMap", "app-env")];
    let web = deployment("new", "api", &uses);
    let old_stamp = t.expected(&web);
    let web = web.stamped(&old_stamp);
    t.config(1.0, config_map("new", "app-env", &[("A", "1")]));
    t.workload(1.0, &stale);
    t.workload(1.0, &web);
    assert_eq!(t.namespace(2.0, "new", true), []);
    assert_eq!(t.next_wake(), Some(7.0));
    let stamp = t.expected(&web);
    assert_eq!(
        t.wake(7.0),
        [touch(&web, &stamp, STALE_WHY, 0)],
        "the foreign stamp is left alone"
    );
}

//! The flap guard under the fake clock: an object whose change windows open more than
//! `--flap-threshold` times in `--flap-period` rolls its dependents at most once per interval,
//! always to its latest content, while another reference's change rolls at once.

use super::*;

const DB_CHANGED: &str = "Secret db changed";

fn flapping_note() -> String {
    "ConfigMap app-env changed in more than 5 change windows within 10m: its changes now roll \
     this workload at most once per interval (1 minute, doubling up to 15), always to its latest \
     content, until a whole interval passes with no change"
        .to_owned()
}

/// `shop` with `web` using ConfigMap `app-env` and Secret `db`, stamped at CREATE.
fn shop_with_db(t: &mut Test) -> W {
    let app = app_env("info");
    let db = secret(NS, "db", &[("password", "one")]);
    t.cluster.insert(app.0.clone(), app.1.clone());
    t.cluster.insert(db.0.clone(), db.1.clone());
    let web = deployment(NS, "web", &[("configMap", "app-env"), ("secret", "db")]);
    let web = web.clone().stamped(&t.expected(&web));
    t.start(&[(NS, true)], &[app, db], &[&web]);
    web
}

/// Wakes at `at`, expects exactly one touch of `w` for `why`, and completes it as the webhook
/// would (the stored workload first, then the result). The workload as touched.
fn rolls(t: &mut Test, at: f64, w: &W, why: &str) -> W {
    let stamp = t.expected(w);
    assert_eq!(t.wake(at), [touch(w, &stamp, why, 0)], "at {at}");
    let touched = w.clone().stamped(&stamp);
    t.workload(at + 0.1, &touched);
    assert_eq!(
        t.touched(at + 0.1, &touched, TouchResult::Patched(Some(stamp))),
        [config_changed(&touched, why)]
    );
    touched
}

#[test]
fn a_flapping_config_map_rolls_once_per_interval_and_another_reference_at_once() {
    let mut t = Test::leader(config());
    let mut web = shop_with_db(&mut t);
    // Five windows in a minute: each rolls, as usual.
    for (i, level) in ["a", "b", "c", "d", "e"].into_iter().enumerate() {
        let at = 1.0 + 6.0 * i as f64;
        assert_eq!(t.config(at, app_env(level)), []);
        web = rolls(&mut t, at + 5.0, &web, APP_ENV_CHANGED);
    }
    assert_eq!(t.metric("confighash_config_flapping_objects"), 0.0);

    // The sixth window within ten minutes: it flaps. This change still rolls.
    let flapping = event(
        &web,
        EventType::Warning,
        CONFIG_FLAPPING_REASON,
        "Restamp",
        &flapping_note(),
    );
    assert_eq!(t.config(31.0, app_env("f")), [flapping], "once per episode");
    assert_eq!(t.metric("confighash_config_flapping_objects"), 1.0);
    web = rolls(&mut t, 36.0, &web, APP_ENV_CHANGED);

    // Its next changes are held until the interval ends (31 + 60 s).
    assert_eq!(t.config(42.0, app_env("g")), []);
    assert_eq!(t.wake(47.0), []);
    assert_eq!(t.next_wake(), Some(91.0));

    // A change of the other reference rolls at once, to everything's latest content.
    assert_eq!(t.config(50.0, secret(NS, "db", &[("password", "two")])), []);
    web = rolls(&mut t, 55.0, &web, DB_CHANGED);
    assert_eq!(
        web.stamp,
        Some(t.expected(&web)),
        "app-env's latest content too"
    );

    // Held again, then released once when the interval ends, to the latest content.
    assert_eq!(t.config(60.0, app_env("h")), []);
    assert_eq!(t.config(70.0, app_env("i")), []);
    assert_eq!(t.wake(80.0), []);
    web = rolls(&mut t, 91.0, &web, APP_ENV_CHANGED);
    // The next interval is twice as long; the resync does not roll a held change either.
    assert_eq!(t.config(100.0, app_env("j")), []);
    assert_eq!(t.next_wake(), Some(211.0));
    assert_eq!(t.wake(150.0), []);
    web = rolls(&mut t, 211.0, &web, APP_ENV_CHANGED);

    // A whole interval (240 s) with no change: it no longer flaps, and rolls as usual again.
    assert_eq!(t.wake(451.0), []);
    assert_eq!(t.metric("confighash_config_flapping_objects"), 0.0);
    assert_eq!(t.config(460.0, app_env("k")), []);
    rolls(&mut t, 465.0, &web, APP_ENV_CHANGED);
}

#[test]
fn a_reconcile_check_does_not_roll_a_held_change() {
    let mut t = Test::leader(WatcherConfig {
        flap_threshold: 1,
        ..config()
    });
    let mut web = shop_with_db(&mut t);
    t.config(1.0, app_env("a"));
    web = rolls(&mut t, 6.0, &web, APP_ENV_CHANGED);
    t.config(10.0, app_env("b")); // trips the guard
    web = rolls(&mut t, 15.0, &web, APP_ENV_CHANGED);
    assert_eq!(t.config(20.0, app_env("c")), []); // held until 70
    // The workload's own watch event (a status update) asks for a check a window later: held.
    assert_eq!(t.workload(21.0, &web), []);
    assert_eq!(t.wake(26.0), []);
    assert_eq!(t.wake(69.9), []);
    rolls(&mut t, 70.0, &web, APP_ENV_CHANGED);
}

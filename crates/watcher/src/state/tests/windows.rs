//! Change windows and the pacing of touches.

use super::*;

// ----- change windows -----

#[test]
fn one_change_touches_once_when_its_window_closes() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    assert_eq!(t.next_wake(), Some(600.0), "only the resync is due");

    assert_eq!(t.config(1.0, app_env("debug")), []);
    assert_eq!(
        t.next_wake(),
        Some(6.0),
        "the window closes a debounce later"
    );
    assert_eq!(t.wake(5.999), []);
    let stamp = t.expected(&web);
    assert_eq!(t.wake(6.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);
    assert_eq!(t.next_wake(), Some(600.0));

    let web = web.stamped(&stamp);
    assert_eq!(
        t.touched(6.1, &web, TouchResult::Patched(Some(stamp.clone()))),
        [config_changed(&web, APP_ENV_CHANGED)]
    );
    // The watch then shows the new stamp: nothing more to do.
    assert_eq!(t.workload(6.2, &web), []);
    assert_eq!(t.next_wake(), Some(600.0));
    assert_eq!(t.metrics.touches("touched"), 1);
    assert_eq!(t.metric("confighash_touch_retries_total"), 0.0);
}

#[test]
fn a_burst_in_one_window_is_one_touch_to_the_final_content() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    for (at, level) in [(1.0, "1"), (2.0, "2"), (3.0, "3"), (5.9, "4")] {
        assert_eq!(t.config(at, app_env(level)), []);
        assert_eq!(t.next_wake(), Some(6.0), "later changes do not extend it");
    }
    let stamp = t.expected(&web);
    assert_eq!(t.wake(6.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);
}

#[test]
fn changes_in_two_windows_touch_twice() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    let first = t.expected(&web);
    assert_eq!(t.wake(6.0), [touch(&web, &first, APP_ENV_CHANGED, 0)]);
    let web = web.stamped(&first);
    t.touched(6.1, &web, TouchResult::Patched(Some(first.clone())));
    t.workload(6.2, &web);

    assert_eq!(t.config(7.0, app_env("trace")), []);
    assert_eq!(t.next_wake(), Some(12.0));
    let second = t.expected(&web);
    assert_ne!(first, second);
    assert_eq!(t.wake(12.0), [touch(&web, &second, APP_ENV_CHANGED, 0)]);
}

#[test]
fn a_metadata_only_write_opens_no_window() {
    let mut t = Test::leader(config());
    shop(&mut t);
    let relabelled = config_map_annotated(
        NS,
        "app-env",
        &[("LOG_LEVEL", "info")],
        json!({"team": "shop"}),
    );
    assert_eq!(t.config(1.0, relabelled), []);
    assert_eq!(t.next_wake(), Some(600.0));
}

#[test]
fn a_change_during_a_touch_in_flight_waits_for_it() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    let first = t.expected(&web);
    assert_eq!(t.wake(6.0), [touch(&web, &first, APP_ENV_CHANGED, 0)]);

    // Another window closes while the touch is held up: parked, not sent.
    t.config(7.0, app_env("trace"));
    assert_eq!(t.wake(12.0), []);
    assert_eq!(t.next_wake(), Some(600.0));

    // Once it is done, the parked one is decided again, at once.
    let second = t.expected(&web);
    assert_eq!(
        t.touched(13.0, &web, TouchResult::Patched(Some(first.clone()))),
        [
            config_changed(&web, APP_ENV_CHANGED),
            touch(&web, &second, APP_ENV_CHANGED, 0)
        ]
    );
}

#[test]
fn a_workload_that_arrives_stale_is_touched_a_window_later() {
    let mut t = Test::leader(config());
    shop(&mut t);
    // Its ConfigMap's change came first and found nothing referencing it.
    let old = deployment(NS, "api", &[("configMap", "api-env")]);
    let old_stamp = t.expected(&old);
    assert_eq!(t.config(1.0, config_map(NS, "api-env", &[("A", "1")])), []);
    assert_eq!(t.next_wake(), Some(600.0));
    let api = old.stamped(&old_stamp);
    assert_eq!(t.workload(1.5, &api), []);
    assert_eq!(t.next_wake(), Some(6.5));
    let stamp = t.expected(&api);
    assert_eq!(t.wake(6.5), [touch(&api, &stamp, STALE_WHY, 0)]);
}

// ----- pacing -----

#[test]
fn a_burst_across_many_workloads_is_paced_by_the_token_bucket() {
    let mut t = Test::leader(WatcherConfig {
        max_touches_per_second: 2.0,
        ..config()
    });
    let shared = config_map(NS, "shared", &[("LOG_LEVEL", "info")]);
    t.cluster.insert(shared.0.clone(), shared.1.clone());
    let workloads: Vec<W> = (0..30)
        .map(|i| {
            let w = deployment(NS, &format!("web-{i:02}"), &[("configMap", "shared")]);
            let stamp = t.expected(&w);
            w.stamped(&stamp)
        })
        .collect();
    let refs: Vec<&W> = workloads.iter().collect();
    assert_eq!(t.start(&[(NS, true)], &[shared], &refs), listed());

    t.config(1.0, config_map(NS, "shared", &[("LOG_LEVEL", "debug")]));
    let stamp = t.expected(&workloads[0]);
    let why = "ConfigMap shared changed";
    let burst: Vec<Effect> = workloads[..20]
        .iter()
        .map(|w| touch(w, &stamp, why, 0))
        .collect();
    assert_eq!(t.wake(6.0), burst, "the bucket's burst");
    assert_eq!(t.metric("confighash_touches_rate_limited_total"), 10.0);

    // Then one every half second (2 a second), in order.
    let mut last = 6.0;
    for w in &workloads[20..] {
        let next = t.next_wake().unwrap();
        assert!((next - last - 0.5).abs() < 1e-3, "{next} after {last}");
        last = next;
        assert_eq!(t.wake(next), [touch(w, &stamp, why, 0)]);
    }
    assert_eq!(t.next_wake(), Some(600.0));
}

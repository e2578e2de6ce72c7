//! Workloads over `--max-reference-bytes`.

use super::*;

// ----- --max-reference-bytes -----

#[test]
fn references_over_max_reference_bytes_roll_nothing_warn_once_and_roll_once_they_fit() {
    let mut t = Test::leader(WatcherConfig {
        max_reference_bytes: 10,
        ..config()
    });
    let web = shop(&mut t);
    let note = |bytes: u64| {
        format!(
            "its ConfigMaps and Secrets hold {bytes} bytes of values, more than 10 \
             (--max-reference-bytes): confighash keeps its stamp and does not roll it until \
             they shrink"
        )
    };
    let first = web.clone();
    let too_large = |bytes| {
        event(
            &first,
            EventType::Warning,
            REFERENCES_TOO_LARGE_REASON,
            "Skip",
            &note(bytes),
        )
    };
    // Grown past the limit: no touch (the webhook would keep the stamp), one Warning Event.
    let big = "x".repeat(20);
    assert_eq!(t.config(1.0, app_env(&big)), []);
    assert_eq!(t.wake(6.0), [too_large(20)]);
    let bigger = "y".repeat(30);
    assert_eq!(t.config(7.0, app_env(&bigger)), []);
    assert_eq!(t.wake(12.0), [], "one Event while it stays over");
    assert_eq!(t.wake(600.0), [], "reconcile keeps it too");
    // Back under the limit: the content differs from what the stamp was made of, one touch.
    assert_eq!(t.config(601.0, app_env("debug")), []);
    let stamp = t.expected(&web);
    assert_eq!(t.wake(606.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);
    // Over again later: a new Event.
    let web = web.stamped(&stamp);
    t.touched(606.1, &web, TouchResult::Patched(Some(stamp.clone())));
    t.workload(606.2, &web);
    assert_eq!(t.config(700.0, app_env(&big)), []);
    assert_eq!(t.wake(705.0), [too_large(20)]);
}

#[test]
fn a_workload_marked_too_large_is_left_until_it_fits_then_stamped_once() {
    let mut t = Test::leader(WatcherConfig {
        max_reference_bytes: 10,
        ..config()
    });
    let big = app_env(&"x".repeat(20));
    t.cluster.insert(big.0.clone(), big.1.clone());
    let mut marked = deployment(NS, "marked", &[("configMap", "app-env")]);
    marked.annotations = json!({UNSTAMPED_ANNOTATION: "too-large"});
    let effects = t.start(&[(NS, true)], &[big], &[&marked]);
    let mut expected = listed();
    expected.push(event(
        &marked,
        EventType::Warning,
        REFERENCES_TOO_LARGE_REASON,
        "Skip",
        "its ConfigMaps and Secrets hold 20 bytes of values, more than 10 \
         (--max-reference-bytes): confighash keeps its stamp and does not roll it until they \
         shrink",
    ));
    assert_eq!(effects, expected, "reconcile leaves the marker");
    assert_eq!(t.wake(600.0), []);
    // The Secret shrinks without any workload write: the change stamps it.
    assert_eq!(t.config(601.0, app_env("info")), []);
    let stamp = t.expected(&marked);
    assert_eq!(t.wake(606.0), [touch(&marked, &stamp, APP_ENV_CHANGED, 0)]);
}

//! What is left alone, deletes, and workloads over `--max-references`.

use super::*;

// ----- what is left alone -----

#[test]
fn opted_out_workloads_and_namespaces_not_opted_in_are_left_alone() {
    let mut t = Test::leader(config());
    let uses = [("configMap", "app-env")];
    let mut opted_out = deployment(NS, "opted-out", &uses);
    opted_out.labels = json!({ENABLED_LABEL: "false"});
    let plain = deployment("plain", "web", &uses);
    let effects = t.start(
        &[(NS, true), ("plain", false)],
        &[
            app_env("info"),
            config_map("plain", "app-env", &[("A", "1")]),
        ],
        &[&opted_out, &plain],
    );
    assert_eq!(effects, listed());
    assert!(
        t.metrics
            .encode()
            .contains("confighash_watched_objects{kind=\"ConfigMap\"} 1"),
        "only the opted-in namespace's ConfigMap is kept"
    );

    assert_eq!(t.config(1.0, app_env("debug")), []);
    assert_eq!(
        t.config(1.0, config_map("plain", "app-env", &[("A", "2")])),
        []
    );
    assert_eq!(t.wake(6.0), []);
}

#[test]
fn an_excluded_namespace_is_never_opted_in() {
    let mut t = Test::leader(config());
    let uses = [("configMap", "app-env")];
    let system = deployment("kube-system", "dns", &uses);
    let config = config_map("kube-system", "app-env", &[("A", "1")]);
    let stale = system.clone().stamped("v2:00000000:stale");
    t.start(&[("kube-system", true)], &[config], &[&stale]);
    assert_eq!(
        t.config(1.0, config_map("kube-system", "app-env", &[("A", "2")])),
        []
    );
    assert_eq!(t.wake(6.0), []);
    assert_eq!(t.wake(600.0), []);
}

#[test]
fn the_ignore_annotation_changes_the_stamp_once_and_then_content_rolls_nothing() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    let ignore = json!({"confighash.dev/ignore": "true"});
    let ignored =
        |level| config_map_annotated(NS, "app-env", &[("LOG_LEVEL", level)], ignore.clone());
    t.config(1.0, ignored("info"));
    let stamp = t.expected(&web);
    let no_refs = t.expected(&deployment(NS, "no-refs", &[]));
    assert_eq!(stamp, no_refs, "left out as if unreferenced");
    assert_eq!(t.wake(6.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);
    let web = web.stamped(&stamp);
    t.touched(6.1, &web, TouchResult::Patched(Some(stamp.clone())));
    t.workload(6.2, &web);

    // A content change of an ignored ConfigMap: a window, and nothing to touch.
    assert_eq!(t.config(7.0, ignored("debug")), []);
    assert_eq!(t.wake(12.0), []);
}

#[test]
fn an_optional_reference_that_appears_touches_once() {
    let mut t = Test::leader(config());
    let opt = deployment(NS, "opt", &[("optionalConfigMap", "maybe")]);
    let opt = opt.clone().stamped(&t.expected(&opt));
    assert_eq!(t.start(&[(NS, true)], &[], &[&opt]), listed());
    t.config(1.0, config_map(NS, "maybe", &[("FEATURE", "on")]));
    let stamp = t.expected(&opt);
    assert_eq!(
        t.wake(6.0),
        [touch(&opt, &stamp, "ConfigMap maybe changed", 0)]
    );
}

// ----- deletes -----

#[test]
fn a_deleted_required_config_map_touches_nothing_until_new_content() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    let (key, _) = app_env("info");
    assert_eq!(t.delete_config(1.0, &key), []);
    assert_eq!(t.next_wake(), Some(6.0));
    assert_eq!(t.wake(6.0), [], "new pods could not start anyway");

    assert_eq!(t.config(7.0, app_env("info")), []);
    assert_eq!(t.wake(12.0), [], "re-created with the same content");

    t.config(13.0, app_env("debug"));
    let stamp = t.expected(&web);
    assert_eq!(t.wake(18.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);
}

#[test]
fn roll_on_delete_touches_when_a_required_config_map_goes() {
    let mut t = Test::leader(WatcherConfig {
        rules: rules::Options {
            roll_on_delete: true,
            ..rules::Options::default()
        },
        ..config()
    });
    let web = shop(&mut t);
    t.delete_config(1.0, &app_env("info").0);
    let stamp = t.expected(&web);
    assert_eq!(t.wake(6.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);
}

#[test]
fn a_deleted_workload_is_forgotten() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    let deleted = Watched::Deleted(web.key());
    assert_eq!(
        t.feed(2.0, Input::Workload(WorkloadKind::DEPLOYMENT, deleted)),
        []
    );
    assert_eq!(t.wake(6.0), [], "nothing references the change any more");
}

// ----- too many references -----

#[test]
fn a_workload_over_max_references_is_frozen_with_one_event() {
    let mut t = Test::leader(WatcherConfig {
        max_references: 2,
        ..config()
    });
    let big = deployment(
        NS,
        "big",
        &[("configMap", "a"), ("configMap", "b"), ("configMap", "c")],
    );
    let note = "it references more than 2 ConfigMaps and Secrets (--max-references): confighash \
                does not read them, stamp it or roll it on config changes";
    let warning = event(
        &big,
        EventType::Warning,
        TOO_MANY_REFERENCES_REASON,
        "Skip",
        note,
    );
    let mut expected = listed();
    expected.push(warning.clone());
    assert_eq!(
        t.start(&[(NS, true)], &[config_map(NS, "a", &[])], &[&big]),
        expected
    );
    assert_eq!(t.workload(1.0, &big), [], "one Event per workload");
    assert_eq!(t.config(2.0, config_map(NS, "a", &[("X", "1")])), []);
    assert_eq!(t.next_wake(), Some(600.0), "its references are not kept");
    assert_eq!(t.wake(600.0), []);

    // Deleted and created again: another workload, another Event.
    let deleted = Watched::Deleted(big.key());
    t.feed(601.0, Input::Workload(WorkloadKind::DEPLOYMENT, deleted));
    assert_eq!(t.workload(602.0, &big), [warning]);
}

#[test]
fn a_follower_records_no_too_many_references_event() {
    let mut t = Test::follower(WatcherConfig {
        max_references: 0,
        ..config()
    });
    let big = deployment(NS, "big", &[("configMap", "a")]);
    assert_eq!(t.start(&[(NS, true)], &[], &[&big]), listed());
}

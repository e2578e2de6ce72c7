//! Workloads opted in by their label, wherever they are.

use super::*;

// ----- workloads opted in by their label -----

/// `w` labelled `confighash.dev/enabled=value`.
fn enabled(w: W, value: &str) -> W {
    W {
        labels: json!({ENABLED_LABEL: value}),
        ..w
    }
}

/// The list of `namespace`'s ConfigMaps and Secrets (an [`Effect::Backfill`] of `generation`)
/// comes back with what the cluster has: the effects of its end.
fn list_namespace(t: &mut Test, seconds: f64, namespace: &str, generation: u64) -> Vec<Effect> {
    let source = || ConfigSource::Backfill {
        namespace: namespace.to_owned(),
        generation,
    };
    let objects: Vec<(ConfigKey, StoredConfig)> = t
        .cluster
        .iter()
        .filter(|(k, _)| k.0 == namespace)
        .map(|(k, s)| (k.clone(), s.clone()))
        .collect();
    for (key, stored) in objects.clone() {
        let applied = Watched::Applied(key, Some(stored));
        assert_eq!(t.feed(seconds, Input::Config(source(), applied)), []);
    }
    let all = objects.into_iter().map(|(k, _)| k).collect();
    t.feed(seconds, Input::Config(source(), Watched::Relisted(all)))
}

fn backfill(namespace: &str, generation: u64) -> Effect {
    Effect::Backfill {
        namespace: namespace.to_owned(),
        generation,
    }
}

fn kept_config_maps(t: &Test) -> usize {
    t.state.configs.count(ObjectKind::ConfigMap)
}

const PLAIN: &str = "plain";

fn plain_app_env(level: &str) -> (ConfigKey, StoredConfig) {
    config_map(PLAIN, "app-env", &[("LOG_LEVEL", level)])
}

/// `plain`, not opted in, listed before its workloads: `web` (labelled true) and `other` (not
/// labelled) use `app-env`, both stamped. The first labelled workload has the namespace's
/// objects listed; returns (web, other) once the list is in.
fn plain(t: &mut Test) -> (W, W) {
    let (key, stored) = plain_app_env("info");
    t.cluster.insert(key, stored);
    let uses = [("configMap", "app-env")];
    let web = enabled(deployment(PLAIN, "web", &uses), "true");
    let web = web.clone().stamped(&t.expected(&web));
    let other = deployment(PLAIN, "other", &uses);
    let other = other.clone().stamped(&t.expected(&other));
    let effects = t.start(&[(PLAIN, false)], &[plain_app_env("info")], &[&web, &other]);
    let mut expected = listed();
    expected.push(backfill(PLAIN, 1));
    assert_eq!(effects, expected, "its objects were left out: listed");
    assert_eq!(kept_config_maps(t), 0);
    assert_eq!(
        list_namespace(t, 0.5, PLAIN, 1),
        [Effect::ReleaseMemory],
        "both stamps are current"
    );
    assert_eq!(kept_config_maps(t), 1);
    (web, other)
}

#[test]
fn a_workload_labelled_true_in_a_plain_namespace_rolls_and_its_neighbour_does_not() {
    let mut t = Test::leader(config());
    let (web, other) = plain(&mut t);

    assert_eq!(t.config(1.0, plain_app_env("debug")), []);
    let stamp = t.expected(&web);
    assert_eq!(t.wake(6.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);
    let web = web.stamped(&stamp);
    assert_eq!(
        t.touched(6.1, &web, TouchResult::Patched(Some(stamp.clone()))),
        [config_changed(&web, APP_ENV_CHANGED)]
    );
    assert_eq!(t.workload(6.2, &web), []);
    // Reconcile leaves the unlabelled one alone too, stale as it is.
    assert_ne!(other.stamp, Some(t.expected(&other)));
    assert_eq!(t.wake(600.0), []);
    assert_eq!(t.metrics.touches("touched"), 1);
}

#[test]
fn a_labelled_workload_seen_before_its_namespace_keeps_the_objects_without_a_list() {
    let mut t = Test::leader(config());
    t.start(&[], &[], &[]);
    let uses = [("configMap", "app-env")];
    assert_eq!(t.config(1.0, plain_app_env("info")), []);
    let web = enabled(deployment(PLAIN, "web", &uses), "true");
    let web = web.clone().stamped(&t.expected(&web));
    let other = deployment(PLAIN, "other", &uses);
    let other = other.clone().stamped(&t.expected(&other));
    assert_eq!(t.workload(1.0, &web), []);
    assert_eq!(t.workload(1.0, &other), []);

    // The Namespace comes later and is not opted in: the objects stay, for `web`.
    assert_eq!(t.namespace(2.0, PLAIN, false), []);
    assert_eq!(kept_config_maps(&t), 1);
    assert_eq!(t.config(3.0, plain_app_env("debug")), []);
    let stamp = t.expected(&web);
    assert_eq!(t.wake(8.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);
}

#[test]
fn the_last_labelled_workload_going_drops_the_objects_and_relabelling_lists_them_again() {
    let mut t = Test::leader(config());
    let (web, other) = plain(&mut t);

    // Relabelled (the label removed): nothing there is handled, nothing of it is kept.
    let unlabelled = W {
        labels: json!({}),
        ..web.clone()
    };
    assert_eq!(t.workload(1.0, &unlabelled), []);
    assert_eq!(kept_config_maps(&t), 0);
    assert_eq!(t.config(2.0, plain_app_env("debug")), []);
    assert_eq!(t.wake(7.0), []);

    // Labelled true again: listed again, and compared once the list is in (the change made
    // meanwhile makes its stamp stale).
    assert_eq!(t.workload(8.0, &web), [backfill(PLAIN, 2)]);
    assert_eq!(t.wake(20.0), [], "not decided before the list is in");
    assert_eq!(
        list_namespace(&mut t, 21.0, PLAIN, 2),
        [Effect::ReleaseMemory]
    );
    assert_eq!(t.next_wake(), Some(26.0), "compared a window later");
    let stamp = t.expected(&web);
    assert_eq!(t.wake(26.0), [touch(&web, &stamp, STALE_WHY, 0)]);
    let web = web.stamped(&stamp);
    t.touched(26.1, &web, TouchResult::Patched(Some(stamp)));
    t.workload(26.2, &web);

    // Labelled false: opted out, and nothing is kept.
    assert_eq!(t.workload(30.0, &enabled(web.clone(), "false")), []);
    assert_eq!(kept_config_maps(&t), 0);
    assert_eq!(t.workload(31.0, &web), [backfill(PLAIN, 3)]);
    assert_eq!(
        list_namespace(&mut t, 32.0, PLAIN, 3),
        [Effect::ReleaseMemory]
    );
    assert_eq!(kept_config_maps(&t), 1);

    // Deleted: the same.
    let deleted = Watched::Deleted(web.key());
    assert_eq!(t.feed(33.0, Input::Workload(web.kind, deleted)), []);
    assert_eq!(kept_config_maps(&t), 0);
    assert_eq!(t.config(34.0, plain_app_env("trace")), []);
    assert_eq!(t.wake(40.0), []);
    assert_eq!(t.wake(700.0), [], "{other:?} is never touched");
}

#[test]
fn a_list_for_a_labelled_workload_that_lost_its_label_meanwhile_is_dropped() {
    let mut t = Test::leader(config());
    let uses = [("configMap", "app-env")];
    let web = enabled(deployment(PLAIN, "web", &uses), "true");
    let effects = t.start(&[(PLAIN, false)], &[plain_app_env("info")], &[&web]);
    assert!(effects.contains(&backfill(PLAIN, 1)), "{effects:?}");
    let unlabelled = W {
        labels: json!({}),
        ..web.clone()
    };
    assert_eq!(t.workload(1.0, &unlabelled), []);
    assert_eq!(list_namespace(&mut t, 2.0, PLAIN, 1), []);
    assert_eq!(kept_config_maps(&t), 0);
}

#[test]
fn a_namespace_opting_out_keeps_the_objects_its_labelled_workloads_use() {
    let mut t = Test::leader(config());
    let (key, stored) = app_env("info");
    t.cluster.insert(key, stored);
    let uses = [("configMap", "app-env")];
    let web = enabled(deployment(NS, "web", &uses), "true");
    let web = web.clone().stamped(&t.expected(&web));
    let api = deployment(NS, "api", &uses);
    let api = api.clone().stamped(&t.expected(&api));
    assert_eq!(
        t.start(&[(NS, true)], &[app_env("info")], &[&web, &api]),
        listed()
    );

    assert_eq!(t.namespace(1.0, NS, false), []);
    assert_eq!(kept_config_maps(&t), 1, "kept for web");
    assert_eq!(t.config(2.0, app_env("debug")), []);
    let stamp = t.expected(&web);
    assert_eq!(
        t.wake(7.0),
        [touch(&web, &stamp, APP_ENV_CHANGED, 0)],
        "web only"
    );
    let web = web.stamped(&stamp);
    t.touched(7.1, &web, TouchResult::Patched(Some(stamp)));
    assert_eq!(t.workload(7.2, &web), []);

    // Opting back in lists nothing (its objects were kept); api, stale since, is compared a
    // window later.
    assert_eq!(t.namespace(10.0, NS, true), []);
    assert_eq!(t.next_wake(), Some(15.0));
    let stamp = t.expected(&api);
    assert_eq!(t.wake(15.0), [touch(&api, &stamp, STALE_WHY, 0)]);
}

#[test]
fn a_namespace_opting_in_while_its_objects_are_listed_for_a_labelled_workload_waits_for_the_list() {
    let mut t = Test::leader(config());
    let (key, stored) = plain_app_env("info");
    t.cluster.insert(key, stored);
    let uses = [("configMap", "app-env")];
    let web = enabled(deployment(PLAIN, "web", &uses), "true");
    let web = web.clone().stamped(&t.expected(&web));
    let other = deployment(PLAIN, "other", &uses);
    let other = other.clone().stamped(&t.expected(&other));
    let effects = t.start(&[(PLAIN, false)], &[plain_app_env("info")], &[&web, &other]);
    assert!(effects.contains(&backfill(PLAIN, 1)), "{effects:?}");

    assert_eq!(
        t.namespace(1.0, PLAIN, true),
        [],
        "the list in progress serves"
    );
    assert_eq!(t.config(2.0, plain_app_env("debug")), []);
    assert_eq!(t.wake(7.0), [], "decided once the list is in");
    let web_stamp = t.expected(&web);
    let other_stamp = t.expected(&other);
    assert_eq!(
        list_namespace(&mut t, 8.0, PLAIN, 1),
        [
            Effect::ReleaseMemory,
            touch(&other, &other_stamp, APP_ENV_CHANGED, 0),
            touch(&web, &web_stamp, APP_ENV_CHANGED, 0),
        ]
    );
}

#[test]
fn a_namespace_opting_in_and_out_while_listed_for_a_labelled_workload_keeps_the_list() {
    let mut t = Test::leader(config());
    let (key, stored) = plain_app_env("info");
    t.cluster.insert(key, stored);
    let uses = [("configMap", "app-env")];
    let web = enabled(deployment(PLAIN, "web", &uses), "true");
    let web = web.clone().stamped(&t.expected(&web));
    let other = deployment(PLAIN, "other", &uses);
    let other = other.clone().stamped(&t.expected(&other));
    t.start(&[(PLAIN, false)], &[plain_app_env("info")], &[&web, &other]);

    assert_eq!(t.namespace(1.0, PLAIN, true), []);
    assert_eq!(t.namespace(2.0, PLAIN, false), []);
    assert_eq!(t.config(3.0, plain_app_env("debug")), []);
    assert_eq!(t.wake(8.0), []);
    let stamp = t.expected(&web);
    assert_eq!(
        list_namespace(&mut t, 9.0, PLAIN, 1),
        [
            Effect::ReleaseMemory,
            touch(&web, &stamp, APP_ENV_CHANGED, 0)
        ],
        "web only: the namespace is not opted in"
    );
}

#[test]
fn a_workload_labelled_true_in_an_excluded_namespace_is_left_alone() {
    let mut t = Test::leader(config());
    let uses = [("configMap", "app-env")];
    let dns = enabled(deployment("kube-system", "dns", &uses), "true").stamped("v2:00000000:stale");
    let cm = |v| config_map("kube-system", "app-env", &[("A", v)]);
    assert_eq!(
        t.start(&[("kube-system", false)], &[cm("1")], &[&dns]),
        listed(),
        "nothing listed"
    );
    assert_eq!(kept_config_maps(&t), 0);
    assert_eq!(t.config(1.0, cm("2")), []);
    assert_eq!(t.wake(6.0), []);
    assert_eq!(t.wake(600.0), []);
}

#[test]
fn a_workload_created_labelled_true_past_the_webhook_is_counted() {
    let mut t = Test::leader(config());
    t.start(&[(PLAIN, false)], &[], &[]);
    let created = |w: W, seconds| W {
        created: Some(wall0() + Duration::from_secs(seconds)),
        ..w
    };
    let early = enabled(created(deployment(PLAIN, "early", &[]), 20), "true");
    t.workload(20.0, &early);
    assert_eq!(t.metrics.workloads_bypassed(), 0, "within the grace");

    let web = enabled(created(deployment(PLAIN, "web", &[]), 40), "true");
    t.workload(40.0, &web);
    t.workload(41.0, &web);
    assert_eq!(t.metrics.workloads_bypassed(), 1, "once");

    // Created without the label, labelled later: the write that added it was sent to the
    // webhook, which leaves a workload never stamped as it is.
    let later = created(deployment(PLAIN, "later", &[]), 40);
    t.workload(40.0, &later);
    t.workload(50.0, &enabled(later, "true"));
    assert_eq!(t.metrics.workloads_bypassed(), 1);

    // In a namespace not opted in, without the label: not confighash's.
    t.workload(60.0, &created(deployment(PLAIN, "plain", &[]), 60));
    assert_eq!(t.metrics.workloads_bypassed(), 1);
}

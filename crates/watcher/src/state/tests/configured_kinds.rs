//! Workload kinds added by configuration (`--workload-kind`): listed, decided and touched as the
//! built-in kinds, and waited for until listed or known not to be served.

use super::*;

fn clone_set() -> WorkloadKind {
    WorkloadKind::parse("apps.kruise.io/v1alpha1/CloneSet=/spec/template").unwrap()
}

fn with_clone_sets() -> WatcherConfig {
    WatcherConfig {
        kinds: Kinds::with_configured([clone_set()]).unwrap(),
        ..config()
    }
}

#[test]
fn a_configured_kinds_workload_is_touched_once_per_change() {
    let mut t = Test::leader(with_clone_sets());
    let app_env_info = app_env("info");
    t.cluster
        .insert(app_env_info.0.clone(), app_env_info.1.clone());
    let web = W {
        kind: clone_set(),
        ..deployment(NS, "web", &[("configMap", "app-env")])
    };
    let web = web.clone().stamped(&t.expected(&web));
    assert_eq!(t.start(&[(NS, true)], &[app_env_info], &[&web]), listed());
    assert_eq!(
        t.metric("confighash_watched_objects{kind=\"CloneSet\"}"),
        1.0
    );

    assert_eq!(t.config(1.0, app_env("debug")), []);
    let stamp = t.expected(&web);
    assert_eq!(t.wake(6.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);
    let web = web.stamped(&stamp);
    assert_eq!(
        t.touched(6.1, &web, TouchResult::Patched(Some(stamp.clone()))),
        [config_changed(&web, APP_ENV_CHANGED)]
    );
    assert_eq!(t.workload(6.2, &web), []);
    // A change of nothing it uses: nothing.
    assert_eq!(t.config(7.0, config_map(NS, "other", &[("A", "1")])), []);
    assert_eq!(t.wake(12.0), []);
    assert_eq!(t.metrics.touches("touched"), 1);
}

#[test]
fn reconcile_waits_for_a_configured_kind_until_it_is_listed_or_not_served() {
    let mut t = Test::leader(with_clone_sets());
    t.feed(0.0, Input::Namespace(Watched::Relisted(HashSet::new())));
    for kind in [ObjectKind::ConfigMap, ObjectKind::Secret] {
        let relisted = Watched::Relisted(HashSet::new());
        t.feed(0.0, Input::Config(ConfigSource::Watch(kind), relisted));
    }
    for kind in WorkloadKind::BUILT_IN {
        t.feed(
            0.0,
            Input::Workload(kind, Watched::Relisted(HashSet::new())),
        );
    }
    assert!(!t.state.is_synced(), "CloneSets are not listed yet");
    // Its CRD is not installed: counted as listed, empty; looked for again by the shell.
    t.feed(0.1, Input::NotServed(clone_set()));
    assert!(t.state.is_synced());
}

#[test]
fn a_configured_kind_that_cannot_be_listed_counts_as_listed_and_empty() {
    // A 403, or a CRD whose conversion webhook is broken: the other kinds must still roll.
    let mut t = Test::leader(with_clone_sets());
    let app_env_info = app_env("info");
    t.cluster
        .insert(app_env_info.0.clone(), app_env_info.1.clone());
    t.feed(0.0, Input::Namespace(Watched::Relisted(HashSet::new())));
    t.namespace(0.0, NS, true);
    for kind in [ObjectKind::ConfigMap, ObjectKind::Secret] {
        let listed: HashSet<ConfigKey> = if kind == ObjectKind::ConfigMap {
            [app_env_info.0.clone()].into()
        } else {
            HashSet::new()
        };
        if kind == ObjectKind::ConfigMap {
            t.config(0.0, app_env_info.clone());
        }
        t.feed(
            0.0,
            Input::Config(ConfigSource::Watch(kind), Watched::Relisted(listed)),
        );
    }
    let web = deployment(NS, "web", &[("configMap", "app-env")]);
    let web = web.clone().stamped(&t.expected(&web));
    t.workload(0.0, &web);
    for kind in WorkloadKind::BUILT_IN {
        let seen = if kind == WorkloadKind::DEPLOYMENT {
            [web.key()].into()
        } else {
            HashSet::new()
        };
        t.feed(0.0, Input::Workload(kind, Watched::Relisted(seen)));
    }
    assert!(!t.state.is_synced(), "waits for the CloneSets");
    t.feed(0.5, Input::Unlistable(clone_set()));
    assert!(t.state.is_synced());
    assert_eq!(
        t.metric("confighash_workload_kind_unlistable{kind=\"CloneSet\"}"),
        1.0
    );
    // The Deployment rolls on a change.
    t.config(1.0, app_env("debug"));
    let stamp = t.expected(&web);
    assert_eq!(t.wake(6.0), [touch(&web, &stamp, APP_ENV_CHANGED, 0)]);
    // Its first list, once it works, counts as any other, and the gauge drops.
    t.feed(
        7.0,
        Input::Workload(clone_set(), Watched::Relisted(HashSet::new())),
    );
    assert_eq!(
        t.metric("confighash_workload_kind_unlistable{kind=\"CloneSet\"}"),
        0.0
    );
}

//! Least-privilege mode (`--watch-namespaces`): one watch per listed namespace and kind, each
//! listing on its own; nothing outside the list is opted in; a namespace whose watches are
//! refused (403) does not hold the others back.

use super::*;

const BLOG: &str = "blog";
const PAYROLL: &str = "payroll";

fn watching(namespaces: &[&str]) -> WatcherConfig {
    WatcherConfig {
        watch_namespaces: Some(namespaces.iter().map(|n| (*n).to_owned()).collect()),
        ..config()
    }
}

/// Lists one namespace's watches: its ConfigMaps and Secrets among `configs`, its workloads
/// among `workloads`. The effects of the whole list.
fn list_namespace(
    t: &mut Test,
    ns: &str,
    configs: &[(ConfigKey, StoredConfig)],
    workloads: &[&W],
) -> Vec<Effect> {
    let mut effects = Vec::new();
    for kind in [ObjectKind::ConfigMap, ObjectKind::Secret] {
        let mut listed = HashSet::new();
        for (key, stored) in configs
            .iter()
            .filter(|(k, _)| k.0 == ns && k.1.kind == kind)
        {
            listed.insert(key.clone());
            t.cluster.insert(key.clone(), stored.clone());
            let source = ConfigSource::WatchIn(kind, ns.to_owned());
            let change = Watched::Applied(key.clone(), Some(stored.clone()));
            effects.extend(t.feed(0.0, Input::Config(source, change)));
        }
        let source = ConfigSource::WatchIn(kind, ns.to_owned());
        effects.extend(t.feed(0.0, Input::Config(source, Watched::Relisted(listed))));
    }
    for kind in WorkloadKind::BUILT_IN {
        let mut listed = HashSet::new();
        for w in workloads.iter().filter(|w| w.kind == kind && w.ns == ns) {
            listed.insert(w.key());
            let change = Watched::Applied(w.key(), w.entry(t.max_references));
            effects.extend(t.feed(0.0, Input::WorkloadIn(kind, ns.to_owned(), change)));
        }
        let relisted = Watched::Relisted(listed);
        effects.extend(t.feed(0.0, Input::WorkloadIn(kind, ns.to_owned(), relisted)));
    }
    effects
}

fn namespaces_listed(t: &mut Test, namespaces: &[(&str, bool)]) {
    for (name, opted_in) in namespaces {
        t.namespace(0.0, name, *opted_in);
    }
    let names = namespaces.iter().map(|(n, _)| (*n).to_owned()).collect();
    t.feed(0.0, Input::Namespace(Watched::Relisted(names)));
}

#[test]
fn synced_once_every_listed_namespace_has_listed_and_a_relist_stays_in_its_namespace() {
    let mut t = Test::leader(watching(&[NS, BLOG]));
    namespaces_listed(&mut t, &[(NS, true), (BLOG, true), (PAYROLL, true)]);
    let configs = [
        app_env("info"),
        config_map(BLOG, "app-env", &[("THEME", "dark")]),
    ];
    for c in &configs {
        t.cluster.insert(c.0.clone(), c.1.clone());
    }
    // Optional: a ConfigMap that goes away rolls its workloads (a required one's does not).
    let uses = [("optionalConfigMap", "app-env")];
    let shop_web = deployment(NS, "web", &uses);
    let shop_web = shop_web.clone().stamped(&t.expected(&shop_web));
    let blog_web = deployment(BLOG, "web", &uses);
    let blog_web = blog_web.clone().stamped(&t.expected(&blog_web));

    list_namespace(&mut t, NS, &configs, &[&shop_web]);
    assert!(!t.state.is_synced(), "blog has not listed yet");
    assert_eq!(t.metric("confighash_watcher_cache_synced"), 0.0);
    assert_eq!(
        list_namespace(&mut t, BLOG, &configs, &[&blog_web]),
        listed()
    );
    assert!(t.state.is_synced());

    // blog's ConfigMap watch relists without its app-env (deleted while it was down): blog's
    // workload rolls; shop's ConfigMap of the same name is still there, and its workload does
    // not.
    t.cluster.remove(&configs[1].0);
    let source = ConfigSource::WatchIn(ObjectKind::ConfigMap, BLOG.to_owned());
    t.feed(
        1.0,
        Input::Config(source, Watched::Relisted(HashSet::new())),
    );
    let stamp = t.expected(&blog_web);
    assert_eq!(
        t.wake(6.0),
        [touch(&blog_web, &stamp, "ConfigMap app-env changed", 0)],
        "blog's only"
    );
    assert_eq!(t.expected(&shop_web), *shop_web.stamp.as_ref().unwrap());

    // A relist of shop's Deployments keeps blog's.
    let relisted = Watched::Relisted(HashSet::from([shop_web.key()]));
    t.feed(
        7.0,
        Input::WorkloadIn(WorkloadKind::DEPLOYMENT, NS.to_owned(), relisted),
    );
    assert!(
        t.metrics
            .encode()
            .contains("confighash_watched_objects{kind=\"Deployment\"} 2")
    );
}

#[test]
fn a_namespace_outside_the_list_is_never_opted_in() {
    let mut t = Test::leader(watching(&[NS, BLOG]));
    namespaces_listed(&mut t, &[(NS, true), (BLOG, false), (PAYROLL, false)]);
    list_namespace(&mut t, NS, &[app_env("info")], &[]);
    list_namespace(&mut t, BLOG, &[], &[]);
    assert!(t.state.is_synced());
    let backfills = |effects: &[Effect]| -> Vec<String> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Backfill { namespace, .. } => Some(namespace.clone()),
                _ => None,
            })
            .collect()
    };
    // A listed namespace that opts in has its ConfigMaps and Secrets listed; one outside the
    // list, labelled alike, has nothing read.
    assert_eq!(backfills(&t.namespace(1.0, BLOG, true)), [BLOG]);
    assert_eq!(t.namespace(1.0, PAYROLL, true), []);
    // Nor does a workload there that opts in by its own label (were one to reach the state:
    // no watch covers it) have its namespace listed, or get touched.
    t.namespace(2.0, PAYROLL, false);
    let mut w = deployment(PAYROLL, "web", &[("configMap", "app-env")]);
    w.labels = json!({ENABLED_LABEL: "true"});
    assert_eq!(t.workload(3.0, &w), []);
    assert_eq!(t.wake(700.0), [], "nor at the resync");
}

#[test]
fn a_forbidden_namespace_counts_as_listed_and_the_others_reconcile() {
    let mut t = Test::leader(watching(&[NS, "denied"]));
    namespaces_listed(&mut t, &[(NS, true), ("denied", true)]);
    // Stamped before the ConfigMap changed, while the watcher was down.
    let before = app_env("info");
    t.cluster.insert(before.0.clone(), before.1.clone());
    let uses = [("configMap", "app-env")];
    let stale_stamp = t.expected(&deployment(NS, "stale", &uses));
    let app = app_env("debug");
    t.cluster.insert(app.0.clone(), app.1.clone());
    let stale = deployment(NS, "stale", &uses).stamped(&stale_stamp);
    assert_eq!(list_namespace(&mut t, NS, &[app], &[&stale]), listed());
    assert!(!t.state.is_synced());
    let mut effects = Vec::new();
    let whats = [
        WatchOf::Config(ObjectKind::ConfigMap),
        WatchOf::Config(ObjectKind::Secret),
    ]
    .into_iter()
    .chain(WorkloadKind::BUILT_IN.into_iter().map(WatchOf::Workloads));
    for what in whats {
        assert!(!t.state.is_synced());
        effects.extend(t.feed(0.0, Input::Forbidden(what, "denied".to_owned())));
        // Told again at the next retry: nothing new.
        effects.extend(t.feed(0.0, Input::Forbidden(what, "denied".to_owned())));
    }
    assert!(t.state.is_synced());
    let stamp = t.expected(&stale);
    assert!(
        effects.contains(&touch(&stale, &stamp, STALE_WHY, 0)),
        "{effects:?}"
    );
    // Its first list, once allowed, counts as any other.
    let later = list_namespace(&mut t, "denied", &[], &[]);
    assert!(
        !later.iter().any(|e| matches!(e, Effect::Touch(_))),
        "{later:?}"
    );
}

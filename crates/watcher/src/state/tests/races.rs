//! The orders in which a lagging cluster can show things: the webhook's stamp newer than the
//! watcher's copy of the config, a new leader that has not seen the old one's touch, a
//! relist after a 410. The watcher never acts against newer knowledge.

use super::*;

/// The stamp `w` carries when `app-env` has `LOG_LEVEL: level`.
fn stamp_with(t: &Test, w: &W, level: &str) -> String {
    let mut at = Test::follower(config());
    at.cluster = t.cluster.clone();
    let (key, stored) = app_env(level);
    at.cluster.insert(key, stored);
    at.expected(w)
}

/// The cluster's `app-env` becomes `level`, but its watch has not shown it yet.
fn lagging(t: &mut Test, level: &str) {
    let (key, stored) = app_env(level);
    t.cluster.insert(key, stored);
}

fn touches(effects: &[Effect]) -> Vec<&Touch> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Touch(touch) => Some(touch),
            _ => None,
        })
        .collect()
}

#[test]
fn a_stamp_the_webhook_made_from_newer_config_is_never_touched_back() {
    let mut t = Test::leader(config());
    let web = shop(&mut t); // A: info
    t.config(1.0, app_env("debug")); // B
    let b = t.expected(&web);
    assert_eq!(t.wake(6.0), [touch(&web, &b, APP_ENV_CHANGED, 0)]);

    // Before the webhook reads, app-env becomes C; its watch lags (a drop, a 429 backoff).
    lagging(&mut t, "trace");
    let c = stamp_with(&t, &web, "trace");
    let web_c = web.clone().stamped(&c);
    // The touch's response, as the shell reports it: the stored workload, then the result.
    assert_eq!(t.workload(6.1, &web_c), []);
    assert_eq!(
        t.touched(6.1, &web_c, TouchResult::Patched(Some(c.clone()))),
        [config_changed(&web_c, APP_ENV_CHANGED)],
        "the pods roll, to C"
    );

    // The watcher's copy still says B: it checks again a window later, and reads afresh before
    // replacing a stamp it did not write.
    let check = t.next_wake().unwrap();
    assert!((check - 11.1).abs() < 1e-6, "{check}");
    let raw = t.feed_raw(check, Input::Wake);
    let [Effect::Recheck { workload, configs }] = raw.as_slice() else {
        panic!("a read afresh, not a touch back to B: {raw:?}");
    };
    assert_eq!(workload, &web.key());
    assert_eq!(configs, &[app_env("trace").0]);
    let read = vec![(app_env("trace").0, Some(app_env("trace").1))];
    assert_eq!(
        t.feed(check, Input::Rechecked(web.key(), Ok(read))),
        [],
        "C is what the workload carries: nothing to do"
    );
    // The window the read opened closes with nothing to do; the lagging event changes nothing.
    assert_eq!(t.wake(check + 5.0), []);
    assert_eq!(t.config(20.0, app_env("trace")), []);
    assert_eq!(t.wake(30.0), []);
    assert_eq!(t.next_wake(), Some(600.0));
    assert_eq!(t.metrics.touches("kept-by-webhook"), 0);
    assert_eq!(t.metrics.touches("touched"), 1);
    assert_eq!(
        t.metric("confighash_touch_retries_total"),
        0.0,
        "no TouchFailed"
    );
}

#[test]
fn a_change_reverted_behind_a_relist_touches_once_to_the_reverted_content() {
    let mut t = Test::leader(config());
    let web = shop(&mut t); // A
    t.config(1.0, app_env("debug")); // B
    let b = t.expected(&web);
    assert_eq!(t.wake(6.0), [touch(&web, &b, APP_ENV_CHANGED, 0)]);
    // The webhook read C; the watch dropped, and app-env went back to B meanwhile.
    let c = stamp_with(&t, &web, "trace");
    let web_c = web.clone().stamped(&c);
    t.workload(6.1, &web_c);
    t.touched(6.1, &web_c, TouchResult::Patched(Some(c.clone())));
    // The 410 relist shows B, which the watcher's copy already says: no change, no window.
    let relisted = Watched::Relisted(HashSet::from([app_env("debug").0]));
    assert_eq!(t.config(8.0, app_env("debug")), []);
    assert_eq!(
        t.feed(
            8.0,
            Input::Config(ConfigSource::Watch(ObjectKind::ConfigMap), relisted)
        ),
        [Effect::ReleaseMemory]
    );

    // The check a window after the response reads afresh (B) and touches, once, to B.
    let mut effects = Vec::new();
    for at in [11.1, 16.1, 30.0, 100.0] {
        effects.extend(t.wake(at));
    }
    let web_b = web_c.clone();
    assert_eq!(effects, [touch(&web_b, &b, STALE_WHY, 0)]);
    let web_b = web.clone().stamped(&b);
    t.workload(11.2, &web_b);
    t.touched(11.2, &web_b, TouchResult::Patched(Some(b.clone())));
    assert_eq!(t.wake(200.0), []);
    assert_eq!(
        touches(&t.wake(600.0)),
        Vec::<&Touch>::new(),
        "nor at the resync"
    );
}

#[test]
fn a_new_leader_that_has_not_seen_the_old_ones_touch_writes_nothing_and_records_nothing() {
    let mut t = Test::follower(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    assert_eq!(t.wake(6.0), [], "a follower only watches");
    let stamp = t.expected(&web);
    // The old leader touched web; this replica's workload watch has not shown it yet.
    let raw = t.feed_raw(7.0, Input::Leader(true));
    assert!(
        matches!(raw.as_slice(), [Effect::Recheck { .. }]),
        "{raw:?}"
    );
    let read = vec![(app_env("debug").0, Some(app_env("debug").1))];
    let effects = t.feed(7.0, Input::Rechecked(web.key(), Ok(read)));
    assert_eq!(effects, [touch(&web, &stamp, STALE_WHY, 0)]);
    let [Effect::Touch(sent)] = effects.as_slice() else {
        unreachable!()
    };
    assert_eq!(
        sent.believed,
        Believed::Stamp(web.stamp.clone().unwrap()),
        "the patch tests the stamp the watcher believes is there"
    );

    // The test fails (422): the shell reads the workload, reports it, then the result.
    let web_new = web.clone().stamped(&stamp);
    assert_eq!(t.workload(7.1, &web_new), []);
    assert_eq!(t.touched(7.1, &web_new, TouchResult::Stale), []);
    assert_eq!(t.wake(20.0), [], "nothing left to do");
    assert_eq!(t.metrics.touches("stale"), 1);
    assert_eq!(t.metrics.touches("touched"), 0);
    assert_eq!(t.metric("confighash_touch_retries_total"), 0.0);
}

#[test]
fn a_stale_touch_is_decided_again_on_the_workload_as_read() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    let b = t.expected(&web);
    assert_eq!(t.wake(6.0), [touch(&web, &b, APP_ENV_CHANGED, 0)]);
    // Someone changed the image meanwhile; the webhook stamped that write from the old config
    // (its read came before the change): the test of the stamp still holds, so this is what a
    // refusal for another reason looks like, and it is retried with backoff.
    t.touched(
        6.1,
        &web,
        TouchResult::Failed(TouchError::Other("422 Unprocessable Entity".to_owned())),
    );
    assert_eq!(t.metrics.touches("error"), 1);

    // A touch whose precondition failed because another stamp is there now is decided again,
    // and touched once it is its turn: here the other stamp is an older config's.
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    assert_eq!(t.wake(6.0), [touch(&web, &b, APP_ENV_CHANGED, 0)]);
    let other = stamp_with(&t, &web, "warn");
    let web_other = web.clone().stamped(&other);
    t.workload(6.1, &web_other);
    assert_eq!(t.touched(6.1, &web_other, TouchResult::Stale), []);
    assert_eq!(
        t.wake(11.0),
        [touch(&web_other, &b, APP_ENV_CHANGED, 0)],
        "after the workload's interval, for the same change, testing the stamp it read"
    );
}

#[test]
fn references_that_cannot_be_read_afresh_back_off_like_a_failed_touch() {
    let mut t = Test::leader(config());
    let web = shop(&mut t);
    t.config(1.0, app_env("debug"));
    let raw = t.feed_raw(6.0, Input::Wake);
    assert!(
        matches!(raw.as_slice(), [Effect::Recheck { .. }]),
        "{raw:?}"
    );
    let refused = TouchError::Forbidden("403".to_owned());
    assert_eq!(
        t.feed(6.1, Input::Rechecked(web.key(), Err(refused))),
        [],
        "one failure records no Event"
    );
    assert_eq!(t.metric("confighash_touch_retries_total"), 1.0);
    assert_eq!(t.next_wake(), Some(7.1), "retried after retry_base");
}

/// A wave of 60 touches of ConfigMap `shared` in `shop` is under way when ConfigMap `lone` in
/// `lone_ns` (used by one workload) changes: its touch is among the next two, whether its
/// namespace and name sort before or after the wave's (touches go round the causes across the
/// bucket's ticks, not from the first cause at each tick).
fn a_lone_change_during_a_wave(lone_ns: &str, lone: &str) {
    let mut t = Test::leader(WatcherConfig {
        max_touches_per_second: 2.0,
        ..config()
    });
    let shared = config_map(NS, "shared", &[("LOG_LEVEL", "info")]);
    let other = config_map(lone_ns, lone, &[("LOG_LEVEL", "info")]);
    for (k, v) in [&shared, &other] {
        t.cluster.insert(k.clone(), v.clone());
    }
    let stamped = |t: &Test, w: W| {
        let stamp = t.expected(&w);
        w.stamped(&stamp)
    };
    let wave: Vec<W> = (0..60)
        .map(|i| {
            stamped(
                &t,
                deployment(NS, &format!("web-{i:02}"), &[("configMap", "shared")]),
            )
        })
        .collect();
    // Its name sorts after every workload of the wave.
    let lone_app = stamped(&t, deployment(lone_ns, "zz-app", &[("configMap", lone)]));
    let mut refs: Vec<&W> = wave.iter().collect();
    refs.push(&lone_app);
    let namespaces: Vec<(&str, bool)> = if lone_ns == NS {
        vec![(NS, true)]
    } else {
        vec![(NS, true), (lone_ns, true)]
    };
    t.start(&namespaces, &[shared, other], &refs);

    t.config(1.0, config_map(NS, "shared", &[("LOG_LEVEL", "debug")]));
    // Every touch takes at once, as the API server would answer it.
    let answer = |t: &mut Test, now: f64, effects: Vec<Effect>| -> Vec<String> {
        let mut names = Vec::new();
        for touch in touches(&effects) {
            names.push(touch.workload.name.clone());
            let result = TouchResult::Patched(Some(touch.stamp.clone()));
            t.feed(now, Input::Touched(touch.workload.clone(), result));
        }
        names
    };
    let burst = t.wake(6.0);
    assert_eq!(answer(&mut t, 6.0, burst).len(), 20, "the bucket's burst");
    assert_eq!(
        t.metric("confighash_touch_wave_eta_seconds"),
        20.0,
        "40 touches left at 2 a second"
    );
    // 40 of the wave wait for tokens, 2 a second, when another ConfigMap changes.
    t.config(6.1, config_map(lone_ns, lone, &[("LOG_LEVEL", "debug")]));
    // The wave goes on meanwhile, a token at a time, so none is saved up when the lone
    // change's window closes (at 11.1).
    let mut sent = Vec::new();
    let mut now = 6.1;
    while sent.len() < 3 {
        now = t.next_wake().unwrap().max(now);
        let effects = t.wake(now);
        let names = answer(&mut t, now, effects);
        if now >= 11.1 {
            sent.extend(names);
        }
    }
    assert!(
        sent[..2].contains(&"zz-app".to_owned()),
        "the lone workload's touch is among the first two after its window: {sent:?}"
    );
}

#[test]
fn a_change_of_a_few_workloads_is_not_queued_behind_a_wave() {
    // Its cause sorts before the wave's, after it, and in a namespace that sorts after.
    a_lone_change_during_a_wave(NS, "other");
    a_lone_change_during_a_wave(NS, "zz-other");
    a_lone_change_during_a_wave("zz-ns", "other");
}

//! Progressive waves under the fake clock: a small simulated cluster answers the state's
//! touches (the workload rolls, its controller reports it complete) and looks at pods (Ready,
//! or restarting when the config it got is broken), so every transition of a wave is seen with
//! its times: batches of 1, 2, 4; a halt; the fix; a timeout; a stall; a new leader.

use super::*;
use crate::pods::PodsVerdict;
use confighash_core::names::{ROLLOUT_ANNOTATION, WAVE_HALTED_REASON};

const SHARED: &str = "shared";
const SETTLE: f64 = 10.0;

fn shared(value: &str, rv: &str) -> (ConfigKey, StoredConfig) {
    let (key, mut stored) = config_map_annotated(
        NS,
        SHARED,
        &[("config.yaml", value)],
        json!({ROLLOUT_ANNOTATION: "progressive"}),
    );
    stored.resource_version = rv.into();
    (key, stored)
}

fn shared_key() -> ConfigKey {
    shared("", "1").0
}

/// How the simulated cluster's workloads take a new template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Takes {
    /// Complete 2 s after the touch; pods Ready unless the config is broken, then restarting.
    AsUsual,
    /// Never complete (pods never Ready).
    Never,
    /// Its Deployment controller reports `ProgressDeadlineExceeded`.
    Stalls,
    /// The webhook keeps the old stamp on every touch (it cannot read the references).
    Kept,
    /// A new pod Ready every `every` seconds, complete once all `pods` are (a DaemonSet on
    /// many nodes).
    Slowly { every: u32, pods: usize },
    /// Rolled and complete before the answer to the touch arrives (fake nodes, a slow answer).
    BeforeTheAnswer,
}

/// The workloads as the cluster has them, answering the state.
struct Cluster {
    t: Test,
    workloads: BTreeMap<WorkloadKey, W>,
    /// Generation of each workload.
    generations: BTreeMap<WorkloadKey, i64>,
    /// Stamps of broken config: pods of them restart.
    broken: HashSet<String>,
    takes: BTreeMap<WorkloadKey, Takes>,
    /// Inputs due later: (seconds, sequence) to input.
    due: BTreeMap<(u64, u64), Input>,
    seq: u64,
    now: f64,
    /// Touches made: (seconds, workload name).
    touches: Vec<(f64, String)>,
    events: Vec<Effect>,
    pod_looks: usize,
    /// Looks at pods, by workload name.
    pod_looks_of: BTreeMap<String, usize>,
    /// Looks at pods asked for and not answered yet, and the most at once.
    looks_in_flight: usize,
    max_looks_in_flight: usize,
    /// When each workload was last touched.
    touched_at: BTreeMap<WorkloadKey, f64>,
    /// The RBAC grants no list or watch of pods: every look is refused.
    pods_forbidden: bool,
    /// The last resourceVersion written (the controllers' reports carry increasing ones).
    rv: u64,
}

impl Cluster {
    /// `shop` opted in, the progressive ConfigMap `shared` at `value` and `n` Deployments
    /// `d00`, `d01`, ... using it, stamped; this replica leads.
    fn new(n: usize, value: &str, config: WatcherConfig) -> Self {
        let mut t = Test::leader(config);
        let shared = shared(value, "1");
        t.cluster.insert(shared.0.clone(), shared.1.clone());
        let mut workloads = BTreeMap::new();
        for i in 0..n {
            let w = deployment(NS, &format!("d{i:02}"), &[("configMap", SHARED)]);
            let w = w.clone().stamped(&t.expected(&w));
            workloads.insert(w.key(), w);
        }
        let listed_ws: Vec<&W> = workloads.values().collect();
        assert_eq!(t.start(&[(NS, true)], &[shared], &listed_ws), listed());
        Cluster::around(t, workloads)
    }

    fn around(t: Test, workloads: BTreeMap<WorkloadKey, W>) -> Self {
        Cluster {
            t,
            generations: workloads.keys().map(|k| (k.clone(), 1)).collect(),
            takes: workloads
                .keys()
                .map(|k| (k.clone(), Takes::AsUsual))
                .collect(),
            workloads,
            broken: HashSet::new(),
            due: BTreeMap::new(),
            seq: 0,
            now: 0.0,
            touches: Vec::new(),
            events: Vec::new(),
            pod_looks: 0,
            pod_looks_of: BTreeMap::new(),
            looks_in_flight: 0,
            max_looks_in_flight: 0,
            touched_at: BTreeMap::new(),
            pods_forbidden: false,
            rv: 100,
        }
    }

    fn w(&self, name: &str) -> W {
        self.workloads
            .values()
            .find(|w| w.name == name)
            .unwrap()
            .clone()
    }

    fn later(&mut self, after: f64, input: Input) {
        let at = ((self.now + after) * 1000.0).round() as u64;
        self.seq += 1;
        self.due.insert((at, self.seq), input);
    }

    /// The config changes to `value` at `seconds` (`broken: true` in it breaks its pods).
    fn change(&mut self, seconds: f64, value: &str, rv: &str) {
        self.now = seconds;
        let changed = shared(value, rv);
        self.t.cluster.insert(changed.0.clone(), changed.1.clone());
        if value.contains("broken: true") {
            let any = self.workloads.values().next().unwrap().clone();
            let stamp = self.t.expected(&any);
            self.broken.insert(stamp);
        }
        let effects = self.t.config(seconds, changed);
        self.answer(effects);
    }

    /// The object of `w` with `status` as its controller writes it for `generation`.
    fn report(&mut self, key: &WorkloadKey, complete: bool, stalled: bool) -> Input {
        self.rv += 1;
        self.report_at(key, complete, stalled, self.rv)
    }

    /// [`Cluster::report`] at resourceVersion `rv`.
    fn report_at(&self, key: &WorkloadKey, complete: bool, stalled: bool, rv: u64) -> Input {
        let w = &self.workloads[key];
        let generation = self.generations[key];
        let mut obj = w.object();
        obj["metadata"]["generation"] = json!(generation);
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        obj["status"] = if !w.kind.is_built_in() {
            // A configured kind's controller, as Knative's: observedGeneration and Ready.
            json!({"observedGeneration": generation,
                   "conditions": [{"type": "Ready", "status": if complete { "True" } else { "False" }}]})
        } else if stalled {
            json!({"observedGeneration": generation, "replicas": 2, "updatedReplicas": 1,
                "availableReplicas": 1, "conditions": [{"type": "Progressing", "status": "False",
                "reason": "ProgressDeadlineExceeded"}]})
        } else if complete {
            json!({"observedGeneration": generation, "replicas": 1, "updatedReplicas": 1,
                   "availableReplicas": 1})
        } else {
            json!({"observedGeneration": generation, "replicas": 2, "updatedReplicas": 1,
                   "availableReplicas": 1})
        };
        let entry = WorkloadEntry::from_object_within(w.kind, &obj, usize::MAX).unwrap();
        Input::Workload(w.kind, Watched::Applied(key.clone(), entry))
    }

    /// Carries out what the state asked for, as the API server and the controllers would.
    fn answer(&mut self, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Touch(touch) if self.takes[&touch.workload] == Takes::Kept => {
                    let key = touch.workload.clone();
                    self.touches.push((self.now, key.name.clone()));
                    let old = self.workloads[&key].stamp.clone();
                    self.later(0.1, Input::Touched(key, TouchResult::Patched(old)));
                }
                Effect::Touch(touch) => {
                    let key = touch.workload.clone();
                    self.touches.push((self.now, key.name.clone()));
                    let w = self.workloads.get_mut(&key).unwrap();
                    w.stamp = Some(touch.stamp.clone());
                    *self.generations.get_mut(&key).unwrap() += 1;
                    let rolling = self.report(&key, false, false);
                    self.later(0.1, rolling);
                    let answered = if self.takes[&key] == Takes::BeforeTheAnswer {
                        // The PATCH's response, at the write's resourceVersion, is handled
                        // after the controller's later status came through the watch.
                        let written = self.rv;
                        let done = self.report(&key, true, false);
                        self.later(0.2, done);
                        let response = self.report_at(&key, false, false, written);
                        self.later(3.0, response);
                        3.0
                    } else {
                        0.1
                    };
                    self.later(
                        answered,
                        Input::Touched(key.clone(), TouchResult::Patched(Some(touch.stamp))),
                    );
                    self.touched_at.insert(key.clone(), self.now);
                    match self.takes[&key] {
                        Takes::AsUsual => {
                            let done = self.report(&key, true, false);
                            self.later(2.0, done);
                        }
                        Takes::Slowly { every, pods } => {
                            let done = self.report(&key, true, false);
                            self.later(f64::from(every) * pods as f64, done);
                        }
                        Takes::Stalls => {
                            let stalled = self.report(&key, false, true);
                            self.later(30.0, stalled);
                        }
                        Takes::Never | Takes::Kept | Takes::BeforeTheAnswer => {}
                    }
                }
                Effect::CheckPods {
                    workload, stamp, ..
                } => {
                    self.pod_looks += 1;
                    *self.pod_looks_of.entry(workload.name.clone()).or_default() += 1;
                    self.looks_in_flight += 1;
                    self.max_looks_in_flight = self.max_looks_in_flight.max(self.looks_in_flight);
                    if self.pods_forbidden {
                        let refused = Err(TouchError::Forbidden("403".to_owned()));
                        self.later(0.2, Input::PodsChecked(workload, stamp, refused));
                        continue;
                    }
                    let verdict = if self.broken.contains(&stamp) {
                        PodsVerdict::Failing(format!(
                            "pod {}-1: container app restarted once",
                            workload.name
                        ))
                    } else if let Takes::Slowly { every, pods } = self.takes[&workload] {
                        let since = self.now - self.touched_at[&workload];
                        let ready = ((since / f64::from(every)) as usize).min(pods);
                        if ready == pods {
                            PodsVerdict::Ready { pods }
                        } else {
                            PodsVerdict::NotReady { pods, ready }
                        }
                    } else if matches!(
                        self.takes[&workload],
                        Takes::AsUsual | Takes::BeforeTheAnswer
                    ) {
                        PodsVerdict::Ready { pods: 1 }
                    } else {
                        PodsVerdict::NotReady { pods: 1, ready: 0 }
                    };
                    self.later(0.2, Input::PodsChecked(workload, stamp, Ok(verdict)));
                }
                Effect::Recheck { .. } => unreachable!("Test::feed answers reads afresh"),
                other => self.events.push(other),
            }
        }
    }

    /// Runs the cluster and the state until `seconds`.
    fn run_until(&mut self, seconds: f64) {
        // Wake-ups at one instant with nothing due: the state would spin.
        let mut idle = 0;
        let mut idle_at = None;
        loop {
            let next_due = self.due.keys().next().map(|(at, _)| *at as f64 / 1000.0);
            let wake = self.t.next_wake();
            let next = [next_due, wake]
                .into_iter()
                .flatten()
                .fold(f64::INFINITY, f64::min);
            if next > seconds {
                self.now = seconds;
                return;
            }
            self.now = next.max(self.now);
            let effects = if next_due.is_some_and(|d| d <= next) {
                idle = 0;
                let (_, input) = self.due.pop_first().unwrap();
                if matches!(input, Input::PodsChecked(..)) {
                    self.looks_in_flight -= 1;
                }
                self.t.feed(self.now, input)
            } else {
                let effects = self.t.wake(self.now);
                let same = idle_at == Some(self.now);
                idle = if effects.is_empty() && same {
                    idle + 1
                } else {
                    0
                };
                idle_at = Some(self.now);
                assert!(
                    idle < 3,
                    "woken at {} for nothing, again and again: {:?} {:?}",
                    self.now,
                    self.t.state.waves,
                    (
                        self.t.state.next_wave_wake().map(|t| t - self.t.t0),
                        self.t.state.rollouts.next_deadline().map(|t| t - self.t.t0),
                        self.t.state.window.closes_at(),
                        self.t.state.lists.next_resync().map(|t| t - self.t.t0),
                        self.t.state.touches.counts().0
                    )
                );
                effects
            };
            self.answer(effects);
        }
    }

    /// Names of the workloads touched, in order.
    fn touched(&self) -> Vec<&str> {
        self.touches.iter().map(|(_, n)| n.as_str()).collect()
    }

    fn halted_events(&self) -> Vec<&Effect> {
        self.events
            .iter()
            .filter(|e| match e {
                Effect::Event(e) => e.reason == WAVE_HALTED_REASON,
                Effect::ConfigEvent(e) => e.reason == WAVE_HALTED_REASON,
                _ => false,
            })
            .collect()
    }

    fn halted_gauge(&self) -> f64 {
        self.t.metric("confighash_waves_halted")
    }
}

fn names(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("d{i:02}")).collect()
}

#[test]
fn a_good_change_rolls_batches_of_one_two_four_each_after_the_one_before_is_healthy() {
    let mut c = Cluster::new(7, "mode: a", config());
    c.change(1.0, "mode: b", "2");
    c.run_until(600.0);
    assert_eq!(c.touched(), names(0..7), "each dependent once, in order");
    let at = |name: &str| c.touches.iter().find(|(_, n)| n == name).unwrap().0;
    // The window closes at 6 s: the first dependent alone.
    assert_eq!(at("d00"), 6.0);
    // Complete 2 s after its touch, its pods clean at the first look after that, and still so
    // the settle time later: the next batch waits for all of it.
    let first_done = at("d00") + 2.0 + SETTLE;
    assert!(
        at("d01") >= first_done && at("d01") < first_done + 4.0,
        "{}",
        at("d01")
    );
    assert_eq!(at("d01"), at("d02"), "one batch");
    assert!(at("d03") >= at("d02") + 2.0 + SETTLE, "{}", at("d03"));
    for later in ["d04", "d05", "d06"] {
        assert_eq!(at(later), at("d03"), "one batch of four");
    }
    assert!(c.halted_events().is_empty());
    assert_eq!(c.halted_gauge(), 0.0);
    assert!(
        c.t.state.waves.is_empty(),
        "the wave ends once every dependent is healthy"
    );
    // Every workload was also followed to its RolloutComplete, as after any touch.
    let complete = c
        .events
        .iter()
        .filter(|e| matches!(e, Effect::Event(e) if e.reason == ROLLOUT_COMPLETE_REASON))
        .count();
    assert_eq!(complete, 7);
}

#[test]
fn a_broken_change_stops_at_the_first_dependent_and_the_fix_rolls_every_one_once() {
    let mut c = Cluster::new(7, "mode: a", config());
    c.change(1.0, "broken: true", "2");
    c.run_until(1200.0);
    assert_eq!(c.touched(), ["d00"], "the first dependent alone");
    let halted = c.halted_events();
    assert_eq!(halted.len(), 2, "{halted:?}");
    let Effect::ConfigEvent(on_object) = halted[0] else {
        panic!("{halted:?}")
    };
    assert_eq!(on_object.config, shared_key());
    assert_eq!(on_object.type_, EventType::Warning);
    assert_eq!(
        on_object.note,
        "the progressive wave of the change of ConfigMap shared (resourceVersion 2) halted at \
         Deployment shop/d00: pod d00-1: container app restarted once; 6 dependents wait, \
         untouched, for the next change of its content"
    );
    let Effect::Event(on_workload) = halted[1] else {
        panic!("{halted:?}")
    };
    assert_eq!(on_workload.workload, c.w("d00").key());
    assert_eq!(on_workload.uid, "uid-d00");
    assert_eq!(c.halted_gauge(), 1.0);
    let halt = c.t.state.wave_halted(&shared_key()).unwrap();
    assert_eq!((halt.workload.name.as_str(), halt.waiting), ("d00", 6));
    // Nothing is looked at any more while it is halted.
    let looks = c.pod_looks;
    c.run_until(1800.0);
    assert_eq!((c.touches.len(), c.pod_looks), (1, looks));

    // The fix: a new wave from the first dependent, the one already rolled included.
    c.events.clear();
    c.change(1801.0, "mode: c", "3");
    c.run_until(2400.0);
    assert_eq!(c.touched()[1..], names(0..7), "each dependent once more");
    assert!(c.halted_events().is_empty());
    assert_eq!(c.halted_gauge(), 0.0);
    assert!(c.t.state.waves.is_empty());
}

#[test]
fn the_halt_comes_at_the_first_look_after_the_touch() {
    let mut c = Cluster::new(3, "mode: a", config());
    c.change(1.0, "broken: true", "2");
    c.run_until(60.0);
    let Effect::ConfigEvent(_) = c.halted_events()[0] else {
        panic!()
    };
    // Touched at 6 s, looked at then (0.2 s to answer): halted by 6.5 s.
    let mut c = Cluster::new(3, "mode: a", config());
    c.change(1.0, "broken: true", "2");
    c.run_until(6.5);
    assert!(
        c.t.state.wave_halted(&shared_key()).is_some(),
        "halted 0.5 s after the touch"
    );
}

/// Three dependents, the first taking its touches as `takes`, and a change at 1 s: the wave
/// has not halted just before the timeout after the touch at 6 s, and has just after it.
fn halted_at_the_timeout(takes: Takes) -> (Cluster, Halt) {
    let mut c = Cluster::new(3, "mode: a", config());
    let d00 = c.w("d00").key();
    c.takes.insert(d00, takes);
    c.change(1.0, "mode: b", "2");
    c.run_until(6.0 + 299.0);
    assert!(
        c.t.state.wave_halted(&shared_key()).is_none(),
        "still within the timeout"
    );
    c.run_until(6.0 + 301.0);
    let halt = c.t.state.wave_halted(&shared_key()).unwrap().clone();
    (c, halt)
}

#[test]
fn a_rollout_that_never_finishes_halts_the_wave_at_the_timeout() {
    let (c, halt) = halted_at_the_timeout(Takes::Never);
    assert_eq!(
        halt.why,
        "its rollout made no progress (no new pod became Ready) for 5m (--progressive-timeout)"
    );
    assert_eq!(c.touched(), ["d00"]);
}

#[test]
fn a_stalled_rollout_halts_the_wave() {
    let mut c = Cluster::new(3, "mode: a", config());
    let d00 = c.w("d00").key();
    c.takes.insert(d00, Takes::Stalls);
    c.change(1.0, "mode: b", "2");
    c.run_until(100.0);
    let halt = c.t.state.wave_halted(&shared_key()).unwrap();
    assert_eq!(
        halt.why,
        "it exceeded its progress deadline (ProgressDeadlineExceeded)"
    );
    assert_eq!(c.touched(), ["d00"]);
}

/// A standby replica beside the leader of `c`, fed what its watches would have shown: the
/// listing, and everything after it is given with [`standby_sees`].
fn standby(c: &Cluster) -> Test {
    let mut s = Test::follower(config());
    s.cluster = c.t.cluster.clone();
    let configs: Vec<(ConfigKey, StoredConfig)> = s
        .cluster
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let ws: Vec<&W> = c.workloads.values().collect();
    let effects = s.start(&[(NS, true)], &configs, &ws);
    assert!(effects.iter().all(|e| !matches!(e, Effect::Touch(_))));
    s
}

#[test]
fn a_standby_that_takes_over_resumes_the_wave_and_never_touches_a_current_one() {
    let mut c = Cluster::new(7, "mode: a", config());
    let mut s = standby(&c);
    c.change(1.0, "mode: b", "2");
    s.cluster = c.t.cluster.clone();
    assert_eq!(s.config(1.0, shared("mode: b", "2")), []);
    // Its window closes as the leader's does: it knows the wave's members, and touches none.
    let effects = s.wake(6.0);
    assert!(
        effects.iter().all(|e| !matches!(e, Effect::Touch(_))),
        "{effects:?}"
    );
    assert_eq!(
        s.state.waves.members(&shared_key()).map(<[_]>::len),
        Some(7)
    );
    // The first two batches are touched (d00, then d01 and d02): the leader goes.
    let mut deadline = 6.0;
    while c.touches.len() < 3 {
        deadline += 1.0;
        c.run_until(deadline);
    }
    c.run_until(deadline + 0.5);
    let effects = c.t.feed(deadline + 0.5, Input::Leader(false));
    c.answer(effects);
    assert_eq!(c.halted_gauge(), 0.0);
    // The standby saw the touches as its watch showed them, then leads.
    let now = deadline + 0.5;
    let mut workloads = c.workloads.clone();
    for w in workloads.values_mut() {
        w.generation = None;
        let effects = s.workload(now, w);
        assert!(effects.iter().all(|e| !matches!(e, Effect::Touch(_))));
    }
    let effects = s.feed(now, Input::Leader(true));
    assert!(
        effects.iter().all(|e| !matches!(e, Effect::Touch(_))),
        "nothing touched before the rolled ones are judged: {effects:?}"
    );
    let mut resumed = Cluster::around(s, workloads);
    resumed.now = now;
    resumed.answer(effects);
    for name in ["d00", "d01", "d02"] {
        let key = resumed.w(name).key();
        let done = resumed.report(&key, true, false);
        resumed.later(0.1, done);
    }
    resumed.run_until(now + 600.0);
    assert_eq!(
        resumed.touched(),
        names(3..7),
        "the next batch, once the rolled ones are judged healthy afresh"
    );
    let at = |name: &str| resumed.touches.iter().find(|(_, n)| n == name).unwrap().0;
    assert!(
        at("d03") >= now + SETTLE,
        "the gate judged first: {}",
        at("d03")
    );
}

#[test]
fn a_replica_that_never_saw_the_change_starts_no_wave() {
    // Stale dependents of a progressive object whose change this replica did not see (a
    // brownfield opt-in, a key rotation, every replica restarted): reconcile goes as without
    // waves, and never holds them behind a wave of content that did not change.
    let mut t = Test::leader(config());
    let shared = shared("mode: a", "1");
    t.cluster.insert(shared.0.clone(), shared.1.clone());
    let ws: Vec<W> = (0..5)
        .map(|i| {
            let w = deployment(NS, &format!("d{i:02}"), &[("configMap", SHARED)]);
            w.stamped("v2:00000000:stale")
        })
        .collect();
    let refs: Vec<&W> = ws.iter().collect();
    let effects = t.start(&[(NS, true)], &[shared], &refs);
    assert!(
        t.state.waves.is_empty(),
        "no wave for content that did not change"
    );
    let _ = effects;
}
#[test]
fn a_change_of_another_reference_is_not_held() {
    let mut t = Test::leader(config());
    let shared = shared("mode: a", "1");
    let own = config_map(NS, "own", &[("k", "1")]);
    for (k, s) in [&shared, &own] {
        t.cluster.insert(k.clone(), s.clone());
    }
    let mut ws = Vec::new();
    for i in 0..3 {
        let w = deployment(
            NS,
            &format!("d{i:02}"),
            &[("configMap", SHARED), ("configMap", "own")],
        );
        ws.push(w.clone().stamped(&t.expected(&w)));
    }
    let refs: Vec<&W> = ws.iter().collect();
    assert_eq!(t.start(&[(NS, true)], &[shared, own], &refs), listed());
    // Both change in one window: `own` is not progressive, so every dependent is touched.
    t.config(1.0, shared_value("mode: b"));
    t.config(1.5, config_map(NS, "own", &[("k", "2")]));
    let effects = t.wake(6.5);
    let touched: Vec<&str> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::Touch(touch) => Some(touch.workload.name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(touched, ["d00", "d01", "d02"]);
}

fn shared_value(value: &str) -> (ConfigKey, StoredConfig) {
    shared(value, "2")
}

#[test]
fn many_dependents_make_an_object_progressive_with_the_flag() {
    let mut c = Cluster::new(
        3,
        "mode: a",
        WatcherConfig {
            progressive_dependents: Some(2),
            ..config()
        },
    );
    // Not annotated: progressive by its three dependents alone.
    let (key, mut stored) = config_map(NS, SHARED, &[("config.yaml", "broken: true")]);
    stored.resource_version = "2".into();
    c.now = 1.0;
    c.t.cluster.insert(key.clone(), stored.clone());
    let any = c.w("d00");
    let stamp = c.t.expected(&any);
    c.broken.insert(stamp);
    let effects = c.t.config(1.0, (key, stored));
    c.answer(effects);
    c.run_until(120.0);
    assert_eq!(c.touched(), ["d00"]);
    assert!(c.t.state.wave_halted(&shared_key()).is_some());

    // Without the flag (and no annotation), all at once.
    let mut t = Test::leader(config());
    let plain = config_map(NS, SHARED, &[("config.yaml", "a")]);
    t.cluster.insert(plain.0.clone(), plain.1.clone());
    let ws: Vec<W> = (0..3)
        .map(|i| {
            let w = deployment(NS, &format!("d{i:02}"), &[("configMap", SHARED)]);
            w.clone().stamped(&t.expected(&w))
        })
        .collect();
    let refs: Vec<&W> = ws.iter().collect();
    assert_eq!(t.start(&[(NS, true)], &[plain], &refs), listed());
    t.config(1.0, config_map(NS, SHARED, &[("config.yaml", "b")]));
    let touches = t
        .wake(6.0)
        .into_iter()
        .filter(|e| matches!(e, Effect::Touch(_)))
        .count();
    assert_eq!(touches, 3);
}

#[test]
fn a_cron_job_counts_as_done_once_stamped() {
    let mut t = Test::leader(config());
    let shared = shared("mode: a", "1");
    t.cluster.insert(shared.0.clone(), shared.1.clone());
    let mut ws = Vec::new();
    for (kind, name) in [
        (WorkloadKind::CRON_JOB, "a-job"),
        (WorkloadKind::CRON_JOB, "b-job"),
        (WorkloadKind::CRON_JOB, "c-job"),
    ] {
        let mut w = deployment(NS, name, &[("configMap", SHARED)]);
        w.kind = kind;
        ws.push(w.clone().stamped(&t.expected(&w)));
    }
    let refs: Vec<&W> = ws.iter().collect();
    assert_eq!(t.start(&[(NS, true)], &[shared], &refs), listed());
    let workloads: BTreeMap<WorkloadKey, W> = ws.into_iter().map(|w| (w.key(), w)).collect();
    let mut c = Cluster::around(t, workloads);
    for key in c.workloads.keys().cloned().collect::<Vec<_>>() {
        c.takes.insert(key, Takes::Never);
    }
    c.change(1.0, "mode: b", "2");
    c.run_until(30.0);
    assert_eq!(c.touched(), ["a-job", "b-job", "c-job"]);
    assert_eq!(c.pod_looks, 0, "a CronJob's pods are not judged");
    let at: Vec<f64> = c.touches.iter().map(|(t, _)| *t).collect();
    assert!(at[0] < at[1] && at[1] == at[2], "{at:?}");
}

#[test]
fn the_halt_gauge_is_exported_at_zero() {
    let c = Cluster::new(1, "mode: a", config());
    assert!(
        c.t.metrics.encode().contains("confighash_waves_halted 0"),
        "{}",
        c.t.metrics.encode()
    );
}

#[test]
fn a_new_change_in_the_middle_of_a_wave_starts_it_over_from_the_first_dependent() {
    let mut c = Cluster::new(7, "mode: a", config());
    c.change(1.0, "mode: b", "2");
    let mut deadline = 0.0;
    while c.touches.len() < 3 {
        deadline += 1.0;
        c.run_until(deadline);
    }
    assert_eq!(c.touched(), names(0..3));
    c.change(deadline + 1.0, "mode: c", "3");
    c.run_until(deadline + 600.0);
    let again = &c.touched()[3..];
    assert_eq!(
        again,
        names(0..7),
        "the new content from the first dependent, each once"
    );
    assert!(c.t.state.waves.is_empty());
}

#[test]
fn deleting_the_object_ends_its_halted_wave() {
    let mut c = Cluster::new(3, "mode: a", config());
    c.change(1.0, "broken: true", "2");
    c.run_until(60.0);
    assert_eq!(c.halted_gauge(), 1.0);
    let effects = c.t.delete_config(61.0, &shared_key());
    c.answer(effects);
    c.run_until(120.0);
    assert_eq!(c.halted_gauge(), 0.0);
    assert!(c.t.state.wave_halted(&shared_key()).is_none());
    assert_eq!(
        c.touched(),
        ["d00"],
        "its deletion rolls nothing (no --roll-on-delete)"
    );
}

#[test]
fn a_touch_the_webhook_keeps_turning_back_halts_the_wave_at_the_timeout() {
    let (c, halt) = halted_at_the_timeout(Takes::Kept);
    assert!(c.touches.len() > 3, "retried: {:?}", c.touches);
    assert!(c.touches.iter().all(|(_, n)| n == "d00"), "{:?}", c.touches);
    assert_eq!(
        halt.why,
        "it was not re-stamped within 5m (--progressive-timeout)"
    );
    assert_eq!(halt.waiting, 2);
}

#[test]
fn pods_that_stop_being_ready_within_the_settle_time_start_it_over() {
    let mut c = Cluster::new(2, "mode: a", config());
    c.change(1.0, "mode: b", "2");
    // d00 complete at 8 s, clean from the look at 9.2 s: healthy at 19.2 s unless a look
    // between shows a pod not Ready.
    c.run_until(12.0);
    let d00 = c.w("d00").key();
    let stamp = c.w("d00").stamp.unwrap();
    let effects = c.t.feed(
        12.0,
        Input::PodsChecked(d00, stamp, Ok(PodsVerdict::NotReady { pods: 1, ready: 0 })),
    );
    c.answer(effects);
    c.run_until(20.0);
    assert_eq!(c.touched(), ["d00"], "the settle time starts over");
    c.run_until(40.0);
    assert_eq!(c.touched(), ["d00", "d01"]);
}

#[test]
fn a_deleted_object_rolls_its_dependents_as_usual_with_roll_on_delete() {
    let mut c = Cluster::new(
        3,
        "mode: a",
        WatcherConfig {
            progressive_dependents: Some(1),
            rules: rules::Options {
                roll_on_delete: true,
                ..rules::Options::default()
            },
            ..config()
        },
    );
    c.now = 1.0;
    let effects = c.t.delete_config(1.0, &shared_key());
    c.answer(effects);
    c.run_until(60.0);
    assert_eq!(
        c.touched(),
        names(0..3),
        "no wave to wait for once the object is gone"
    );
}

/// `shop` opted in, the progressive ConfigMap `shared` with keys `a` and `b` (`a0`, `b0`),
/// and these Deployments, each using one key of it (`a` or `b`), stamped; this replica leads.
fn mixed_keys(uses: &[(&str, &str)], config: WatcherConfig) -> Cluster {
    let mut t = Test::leader(config);
    let shared = shared_keys("a0", "b0", "1");
    t.cluster.insert(shared.0.clone(), shared.1.clone());
    let mut workloads = BTreeMap::new();
    for (name, key) in uses {
        let w = deployment(NS, name, &[("configMapKey", &format!("{SHARED}/{key}"))]);
        let w = w.clone().stamped(&t.expected(&w));
        workloads.insert(w.key(), w);
    }
    let listed_ws: Vec<&W> = workloads.values().collect();
    assert_eq!(t.start(&[(NS, true)], &[shared], &listed_ws), listed());
    Cluster::around(t, workloads)
}

fn shared_keys(a: &str, b: &str, rv: &str) -> (ConfigKey, StoredConfig) {
    let (key, mut stored) = config_map_annotated(
        NS,
        SHARED,
        &[("a", a), ("b", b)],
        json!({ROLLOUT_ANNOTATION: "progressive"}),
    );
    stored.resource_version = rv.into();
    (key, stored)
}

#[test]
fn the_first_batch_is_the_first_dependent_the_change_affects_alone() {
    // Three dependents of key `b` sort first; a broken change of key `a` reaches one
    // workload, then halts (the batch used to count from position 3: four at once).
    let uses = [
        ("d00", "b"),
        ("d01", "b"),
        ("d02", "b"),
        ("d03", "a"),
        ("d04", "a"),
        ("d05", "a"),
        ("d06", "a"),
        ("d07", "a"),
    ];
    let mut c = mixed_keys(&uses, config());
    c.now = 1.0;
    let changed = shared_keys("broken: true", "b0", "2");
    c.t.cluster.insert(changed.0.clone(), changed.1.clone());
    let stamp = c.t.expected(&c.w("d03"));
    c.broken.insert(stamp);
    let effects = c.t.config(1.0, changed);
    c.answer(effects);
    c.run_until(6.0);
    assert_eq!(
        c.t.state.waves.members(&shared_key()).unwrap(),
        names(3..8).iter().map(|n| c.w(n).key()).collect::<Vec<_>>(),
        "the members are the dependents the change re-stamps"
    );
    c.run_until(600.0);
    assert_eq!(c.touched(), ["d03"], "exactly one workload before the halt");
    let halt = c.t.state.wave_halted(&shared_key()).unwrap();
    assert_eq!((halt.workload.name.as_str(), halt.waiting), ("d03", 4));
    assert_eq!(
        c.pod_looks_of.keys().collect::<Vec<_>>(),
        ["d03"],
        "only it is judged"
    );
}

#[test]
fn a_good_change_of_one_key_rolls_only_its_users_one_two_four() {
    let uses = [
        ("d00", "b"),
        ("d01", "a"),
        ("d02", "b"),
        ("d03", "a"),
        ("d04", "a"),
    ];
    let mut c = mixed_keys(&uses, config());
    c.now = 1.0;
    let changed = shared_keys("a1", "b0", "2");
    c.t.cluster.insert(changed.0.clone(), changed.1.clone());
    let effects = c.t.config(1.0, changed);
    c.answer(effects);
    c.run_until(600.0);
    assert_eq!(c.touched(), ["d01", "d03", "d04"]);
    let at = |name: &str| c.touches.iter().find(|(_, n)| n == name).unwrap().0;
    assert!(at("d03") >= at("d01") + 2.0 + SETTLE, "d03 waits for d01");
    assert_eq!(at("d03"), at("d04"), "the second batch, of two");
    assert!(c.t.state.waves.is_empty());
}

#[test]
fn reconcile_after_a_brownfield_opt_in_starts_no_wave_and_holds_nothing() {
    // Stamped for content the object held before this replica started: stale, as after a
    // brownfield opt-in with `--stamp-existing` or a rotation. Reconcile touches them as
    // without waves: the object's content did not change, so there is no wave to hold them.
    let mut t = Test::leader(config());
    let old = shared("mode: old", "1");
    t.cluster.insert(old.0.clone(), old.1.clone());
    let ws: Vec<W> = (0..5)
        .map(|i| {
            let w = deployment(NS, &format!("d{i:02}"), &[("configMap", SHARED)]);
            w.clone().stamped(&t.expected(&w))
        })
        .collect();
    let now = shared("mode: a", "2");
    t.cluster.insert(now.0.clone(), now.1.clone());
    let refs: Vec<&W> = ws.iter().collect();
    let effects = t.start(&[(NS, true)], &[now], &refs);
    let touched: Vec<&str> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::Touch(t) => Some(t.workload.name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(touched, names(0..5), "as without waves");
    assert!(
        t.state.waves.is_empty(),
        "no wave for content that did not change"
    );
}

#[test]
fn reconcile_never_starts_a_wave_for_a_stale_plain_reference() {
    // d00..d02 use the progressive `shared` and a plain `own`; `own` changed while no
    // replica led: reconcile touches all three at once, none held behind `shared`.
    let mut t = Test::leader(config());
    let shared = shared("mode: a", "1");
    let old_own = config_map(NS, "own", &[("k", "1")]);
    for (k, s) in [&shared, &old_own] {
        t.cluster.insert(k.clone(), s.clone());
    }
    let ws: Vec<W> = (0..3)
        .map(|i| {
            let w = deployment(
                NS,
                &format!("d{i:02}"),
                &[("configMap", SHARED), ("configMap", "own")],
            );
            w.clone().stamped(&t.expected(&w))
        })
        .collect();
    let own = config_map(NS, "own", &[("k", "2")]);
    t.cluster.insert(own.0.clone(), own.1.clone());
    let refs: Vec<&W> = ws.iter().collect();
    let effects = t.start(&[(NS, true)], &[shared, own], &refs);
    let touches = effects
        .iter()
        .filter(|e| matches!(e, Effect::Touch(_)))
        .count();
    assert_eq!(touches, 3);
}

#[test]
fn a_wave_whose_batches_take_longer_to_touch_than_the_timeout_finishes_without_a_halt() {
    // 63 dependents at 0.5 touches/s (burst 20): the batch of 32 takes over 20 s to touch,
    // twice the timeout. Its clock starts at each touch, so nothing halts.
    let config = WatcherConfig {
        max_touches_per_second: 0.5,
        progressive_timeout: Duration::from_secs(30),
        ..config()
    };
    let mut c = Cluster::new(63, "mode: a", config);
    c.change(1.0, "mode: b", "2");
    c.run_until(3600.0);
    assert!(c.halted_events().is_empty(), "{:?}", c.halted_events());
    assert_eq!(c.touched(), names(0..63), "each once, in order");
    let first = c.touches[31].0;
    let last = c.touches[62].0;
    assert!(
        last - first > 30.0,
        "the last batch took {} s to touch",
        last - first
    );
    assert!(c.t.state.waves.is_empty());
}

#[test]
fn a_rollout_that_keeps_progressing_is_not_halted_by_the_timeout() {
    // A DaemonSet on many nodes: a new pod Ready every 20 s, for 10 minutes, against a 60 s
    // timeout: it is making progress, so the wave waits for it.
    let config = WatcherConfig {
        progressive_timeout: Duration::from_secs(60),
        ..config()
    };
    let mut c = Cluster::new(2, "mode: a", config);
    let d00 = c.w("d00").key();
    c.takes.insert(
        d00.clone(),
        Takes::Slowly {
            every: 20,
            pods: 30,
        },
    );
    c.change(1.0, "mode: b", "2");
    c.run_until(400.0);
    assert!(
        c.t.state.wave_halted(&shared_key()).is_none(),
        "still progressing"
    );
    assert_eq!(c.touched(), ["d00"]);
    c.run_until(900.0);
    assert!(c.halted_events().is_empty());
    assert_eq!(c.touched(), ["d00", "d01"]);
}

#[test]
fn a_gate_member_re_stamped_later_is_judged_from_then() {
    // d00 uses `shared` (progressive) and `own` (plain); d01 never finishes. `own` changes
    // long after d00's touch: d00 is re-stamped, and its new rollout is judged from that
    // touch, not the old one (which would halt the wave at once, blaming d00).
    let mut t = Test::leader(config());
    let shared_cm = shared("mode: a", "1");
    let own = config_map(NS, "own", &[("k", "1")]);
    for (k, s) in [&shared_cm, &own] {
        t.cluster.insert(k.clone(), s.clone());
    }
    let d00 = deployment(NS, "d00", &[("configMap", SHARED), ("configMap", "own")]);
    let d01 = deployment(NS, "d01", &[("configMap", SHARED)]);
    let ws = [
        d00.clone().stamped(&t.expected(&d00)),
        d01.clone().stamped(&t.expected(&d01)),
    ];
    let refs: Vec<&W> = ws.iter().collect();
    assert_eq!(t.start(&[(NS, true)], &[shared_cm, own], &refs), listed());
    let workloads = ws.iter().map(|w| (w.key(), w.clone())).collect();
    let mut c = Cluster::around(t, workloads);
    c.takes.insert(c.w("d01").key(), Takes::Never);
    c.change(1.0, "mode: b", "2");
    c.run_until(310.0);
    assert_eq!(c.touched(), ["d00", "d01"]);
    c.now = 310.0;
    let own = config_map(NS, "own", &[("k", "2")]);
    c.t.cluster.insert(own.0.clone(), own.1.clone());
    let effects = c.t.config(310.0, own);
    c.answer(effects);
    c.run_until(400.0);
    assert_eq!(c.touched(), ["d00", "d01", "d00"]);
    let halt =
        c.t.state
            .wave_halted(&shared_key())
            .unwrap_or_else(|| panic!("{:?} {:#?}", c.touches, c.t.state.waves));
    assert_eq!(halt.workload.name, "d01", "{halt:?}");
}

#[test]
fn a_workload_two_waves_share_goes_when_both_release_it_and_halts_both() {
    // `shared` (progressive): a00, d00. `other` (progressive): d00. Both change in one window:
    // `other` releases d00 first, `shared` after a00 is healthy; d00 waits for both.
    let mut t = Test::leader(config());
    let p = shared("mode: a", "1");
    let (qk, mut q) = config_map_annotated(
        NS,
        "other",
        &[("x", "1")],
        json!({ROLLOUT_ANNOTATION: "progressive"}),
    );
    q.resource_version = "1".into();
    for (k, s) in [&p, &(qk.clone(), q.clone())] {
        t.cluster.insert(k.clone(), s.clone());
    }
    let a00 = deployment(NS, "a00", &[("configMap", SHARED)]);
    let d00 = deployment(NS, "d00", &[("configMap", SHARED), ("configMap", "other")]);
    let ws = [
        a00.clone().stamped(&t.expected(&a00)),
        d00.clone().stamped(&t.expected(&d00)),
    ];
    let refs: Vec<&W> = ws.iter().collect();
    assert_eq!(
        t.start(&[(NS, true)], &[p, (qk.clone(), q)], &refs),
        listed()
    );
    let workloads = ws.iter().map(|w| (w.key(), w.clone())).collect();
    let mut c = Cluster::around(t, workloads);
    let (qk2, mut q2) = config_map_annotated(
        NS,
        "other",
        &[("x", "broken: true")],
        json!({ROLLOUT_ANNOTATION: "progressive"}),
    );
    q2.resource_version = "2".into();
    c.change(1.0, "mode: b", "2");
    c.t.cluster.insert(qk2.clone(), q2.clone());
    let stamp = c.t.expected(&c.w("d00"));
    c.broken.insert(stamp);
    let effects = c.t.config(1.5, (qk2, q2));
    c.answer(effects);
    c.run_until(600.0);
    assert_eq!(c.touched(), ["a00", "d00"]);
    let at = |name: &str| c.touches.iter().find(|(_, n)| n == name).unwrap().0;
    assert!(
        at("d00") >= at("a00") + 2.0 + SETTLE,
        "d00 waited for `shared` too"
    );
    assert_eq!(c.halted_gauge(), 2.0, "both waves halted");
    let on_d00: Vec<&WorkloadEvent> = c
        .events
        .iter()
        .filter_map(|e| match e {
            Effect::Event(e) if e.reason == WAVE_HALTED_REASON => Some(e),
            _ => None,
        })
        .collect();
    assert_eq!(on_d00.len(), 1, "{on_d00:?}");
    assert!(
        on_d00[0].note.contains("ConfigMap shared") && on_d00[0].note.contains("ConfigMap other"),
        "{}",
        on_d00[0].note
    );
}

#[test]
fn losing_progressive_status_ends_a_halted_wave_and_releases_the_rest_at_once() {
    let mut c = Cluster::new(3, "mode: a", config());
    c.change(1.0, "broken: true", "2");
    c.run_until(60.0);
    assert_eq!(c.halted_gauge(), 1.0);
    assert_eq!(c.touched(), ["d00"]);
    // The annotation removed: the same content, metadata only.
    let (key, mut plain) = config_map(NS, SHARED, &[("config.yaml", "broken: true")]);
    plain.resource_version = "3".into();
    c.t.cluster.insert(key.clone(), plain.clone());
    c.now = 61.0;
    let effects = c.t.config(61.0, (key, plain));
    c.answer(effects);
    c.run_until(65.0);
    assert_eq!(c.halted_gauge(), 0.0);
    assert!(c.t.state.waves.is_empty());
    assert_eq!(c.touched(), ["d00", "d01", "d02"], "the rest at once");
}

#[test]
fn a_large_batch_is_looked_at_a_few_at_a_time() {
    let mut c = Cluster::new(40, "mode: a", config());
    c.change(1.0, "mode: b", "2");
    c.run_until(900.0);
    assert_eq!(c.touched(), names(0..40));
    assert!(
        c.max_looks_in_flight <= MAX_POD_CHECKS,
        "{} looks in flight",
        c.max_looks_in_flight
    );
    assert!(c.max_looks_in_flight > 1);
    assert!(c.t.state.waves.is_empty());
}

#[test]
fn a_configured_kind_is_judged_by_its_status_and_ready_condition() {
    let service = WorkloadKind::parse("serving.knative.dev/v1/Service=/spec/template").unwrap();
    let config = WatcherConfig {
        kinds: Kinds::with_configured([service]).unwrap(),
        ..config()
    };
    let run = |first: Takes| {
        let mut t = Test::leader(config.clone());
        let shared = shared("mode: a", "1");
        t.cluster.insert(shared.0.clone(), shared.1.clone());
        let ws: Vec<W> = (0..3)
            .map(|i| {
                let w = W {
                    kind: service,
                    ..deployment(NS, &format!("s{i:02}"), &[("configMap", SHARED)])
                };
                w.clone().stamped(&t.expected(&w))
            })
            .collect();
        let refs: Vec<&W> = ws.iter().collect();
        assert_eq!(t.start(&[(NS, true)], &[shared], &refs), listed());
        let mut c = Cluster::around(t, ws.into_iter().map(|w| (w.key(), w)).collect());
        let s00 = c.w("s00").key();
        c.takes.insert(s00, first);
        c.change(1.0, "mode: b", "2");
        c.run_until(600.0);
        c
    };
    // Ready 2 s after its touch, still so the settle time later: the next batch goes.
    let c = run(Takes::AsUsual);
    assert_eq!(c.touched(), ["s00", "s01", "s02"]);
    let at = |name: &str| c.touches.iter().find(|(_, n)| n == name).unwrap().0;
    assert!(at("s01") >= at("s00") + 2.0 + SETTLE, "{}", at("s01"));
    assert_eq!(c.pod_looks, 0, "judged by its status, not its pods");
    assert!(c.halted_events().is_empty());
    // Never Ready: the wave halts at the no-progress timeout, blaming it.
    let c = run(Takes::Never);
    assert_eq!(c.touched(), ["s00"]);
    let halt = c.t.state.wave_halted(&shared_key()).unwrap();
    assert_eq!(halt.workload.name, "s00");
    assert!(halt.why.contains("no progress"), "{}", halt.why);
}

#[test]
fn the_halt_gauge_is_the_waves_halted_now_across_a_change_of_leader() {
    let mut c = Cluster::new(3, "mode: a", config());
    c.change(1.0, "broken: true", "2");
    c.run_until(60.0);
    assert_eq!(c.halted_gauge(), 1.0);
    // Leadership lost: this replica judges nothing, so it counts no halted wave.
    let effects = c.t.feed(60.0, Input::Leader(false));
    c.answer(effects);
    assert_eq!(c.halted_gauge(), 0.0);
    assert_eq!(
        c.t.state.waves.members(&shared_key()).map(<[_]>::len),
        Some(3),
        "it keeps the wave's members"
    );
    // Leading again: the rolled member is judged afresh, found failing, and the wave is halted
    // once more, without touching anything.
    let effects = c.t.feed(61.0, Input::Leader(true));
    c.answer(effects);
    c.run_until(120.0);
    assert_eq!(c.halted_gauge(), 1.0);
    assert_eq!(c.touched(), ["d00"]);
}

#[test]
fn without_access_to_pods_a_wave_judges_by_rollout_status_alone() {
    // The chart's watcher.progressiveWavePods: false: every look at pods is refused. A good
    // change rolls batch by batch on the controllers' status; a stalled rollout still halts.
    let mut c = Cluster::new(3, "mode: a", config());
    c.pods_forbidden = true;
    c.change(1.0, "mode: b", "2");
    c.run_until(600.0);
    assert_eq!(c.touched(), names(0..3));
    let at = |name: &str| c.touches.iter().find(|(_, n)| n == name).unwrap().0;
    assert!(at("d01") >= at("d00") + 2.0 + SETTLE, "{}", at("d01"));
    assert!(c.halted_events().is_empty());
    assert_eq!(c.pod_looks, 1, "refused once, not asked again");

    let mut c = Cluster::new(3, "mode: a", config());
    c.pods_forbidden = true;
    let d00 = c.w("d00").key();
    c.takes.insert(d00, Takes::Stalls);
    c.change(1.0, "mode: b", "2");
    c.run_until(600.0);
    assert_eq!(c.touched(), ["d00"]);
    assert!(c.t.state.wave_halted(&shared_key()).is_some());
}

/// On fake nodes a rollout can be complete before the answer to its touch arrives (the API
/// server answered late): the wave sees the rollout complete and its pods Ready, and goes on.
#[test]
fn a_rollout_complete_before_its_touch_is_answered_counts_as_progress() {
    let mut c = Cluster::new(7, "a: 1", WatcherConfig::default());
    for key in c.workloads.keys().cloned().collect::<Vec<_>>() {
        c.takes.insert(key, Takes::BeforeTheAnswer);
    }
    c.change(0.0, "a: 2", "2");
    c.run_until(900.0);
    assert!(c.halted_events().is_empty(), "{:?}", c.halted_events());
    assert_eq!(c.touched(), names(0..7), "each once, in order");
    // And the rollouts followed are seen complete, each with its Event.
    let complete = c
        .events
        .iter()
        .filter(|e| matches!(e, Effect::Event(e) if e.reason == confighash_core::names::ROLLOUT_COMPLETE_REASON))
        .count();
    assert_eq!(complete, 7);
    assert_eq!(c.t.metric("confighash_rollouts_followed"), 0.0);
}

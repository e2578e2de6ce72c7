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
        let w = &self.workloads[key];
        let generation = self.generations[key];
        let mut obj = w.object();
        obj["metadata"]["generation"] = json!(generation);
        obj["status"] = if stalled {
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
                    self.later(
                        0.1,
                        Input::Touched(key.clone(), TouchResult::Patched(Some(touch.stamp))),
                    );
                    match self.takes[&key] {
                        Takes::AsUsual => {
                            let done = self.report(&key, true, false);
                            self.later(2.0, done);
                        }
                        Takes::Stalls => {
                            let stalled = self.report(&key, false, true);
                            self.later(30.0, stalled);
                        }
                        Takes::Never | Takes::Kept => {}
                    }
                }
                Effect::CheckPods { workload, stamp } => {
                    self.pod_looks += 1;
                    let verdict = if self.broken.contains(&stamp) {
                        PodsVerdict::Failing(format!(
                            "pod {}-1: container app restarted once",
                            workload.name
                        ))
                    } else if self.takes[&workload] == Takes::AsUsual {
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
                    "woken at {} for nothing, again and again",
                    self.now
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

#[test]
fn a_rollout_that_never_finishes_halts_the_wave_at_the_timeout() {
    let mut c = Cluster::new(3, "mode: a", config());
    let d00 = c.w("d00").key();
    c.takes.insert(d00, Takes::Never);
    c.change(1.0, "mode: b", "2");
    c.run_until(6.0 + 299.0);
    assert!(
        c.t.state.wave_halted(&shared_key()).is_none(),
        "still within the timeout"
    );
    c.run_until(6.0 + 301.0);
    let halt = c.t.state.wave_halted(&shared_key()).unwrap();
    assert_eq!(
        halt.why,
        "its rollout did not finish healthy within 5m (--progressive-timeout)"
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

#[test]
fn a_new_leader_resumes_from_the_stamps_and_never_touches_a_current_one() {
    let mut c = Cluster::new(7, "mode: a", config());
    c.change(1.0, "mode: b", "2");
    // The first two batches are touched (d00, then d01 and d02): the leader goes.
    let mut deadline = 0.0;
    while c.touches.len() < 3 {
        deadline += 1.0;
        c.run_until(deadline);
    }
    c.run_until(deadline + 0.5);
    let effects = c.t.feed(deadline + 0.5, Input::Leader(false));
    c.answer(effects);
    assert!(
        c.t.state.waves.is_empty(),
        "a replica that does not lead holds no wave"
    );
    // A new replica starts, lists what the cluster has, and leads.
    let mut t = Test::leader(config());
    let configs: Vec<(ConfigKey, StoredConfig)> =
        c.t.cluster
            .iter()
            .map(|(k, s)| (k.clone(), s.clone()))
            .collect();
    t.cluster = c.t.cluster.clone();
    let mut workloads = c.workloads.clone();
    // The controllers finished d01 and d02 meanwhile.
    let listed_ws: Vec<&W> = workloads.values().collect();
    let mut effects = t.start(&[(NS, true)], &configs, &listed_ws);
    effects.retain(|e| *e != Effect::ReleaseMemory);
    assert!(
        effects.iter().all(|e| !matches!(e, Effect::Touch(_))),
        "nothing touched before the rolled ones are judged: {effects:?}"
    );
    let before = c.touches.len();
    for w in workloads.values_mut() {
        w.generation = None;
    }
    let mut resumed = Cluster::around(t, workloads);
    resumed.now = deadline + 0.5;
    resumed.answer(effects);
    // The rolled ones report complete (they are).
    for name in ["d00", "d01", "d02"] {
        let key = resumed.w(name).key();
        let done = resumed.report(&key, true, false);
        resumed.later(0.1, done);
    }
    resumed.run_until(deadline + 600.0);
    assert_eq!(before, 3);
    assert_eq!(
        resumed.touched(),
        names(3..7),
        "the next batch, once the rolled ones are judged healthy afresh"
    );
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
    let mut c = Cluster::new(3, "mode: a", config());
    let d00 = c.w("d00").key();
    c.takes.insert(d00, Takes::Kept);
    c.change(1.0, "mode: b", "2");
    c.run_until(6.0 + 299.0);
    assert!(c.t.state.wave_halted(&shared_key()).is_none());
    assert!(c.touches.len() > 3, "retried: {:?}", c.touches);
    assert!(c.touches.iter().all(|(_, n)| n == "d00"), "{:?}", c.touches);
    c.run_until(6.0 + 301.0);
    let halt = c.t.state.wave_halted(&shared_key()).unwrap();
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

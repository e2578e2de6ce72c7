//! The fault run on a real control plane: confighash as the real tier runs it (two `serve`
//! processes electing a leader on a real Lease, as the chart's ServiceAccount), config changes
//! from a seeded RNG, and the faults kube-apiserver, etcd and the controllers make for real while
//! they run, checked workload by workload from what the cluster keeps.
//!
//! 1. Setup: one opted-in namespace, a pool of ConfigMaps and Secrets, and Deployments,
//!    StatefulSets and DaemonSets (each keeping 1,000 old revisions) that use one to three of
//!    them: `envFrom`, a key reference (one key of three, so a change of the others is a change
//!    of a key the workload does not read), a mounted volume, a Secret's `envFrom` or key.
//! 2. Changes, one at a time, spread over the run: content changes, content-identical rewrites
//!    (a new annotation), label-only edits, and Secrets deleted and created again with the same
//!    content. After each, the object is read back and every workload's expected stamp computed
//!    with the recipe over the objects read back (`support::recipe`, the chart's key): its
//!    history of stamps, in the order the config really had them.
//! 3. Faults while the changes run, one after another: the leading replica killed (SIGKILL),
//!    the other taking the Lease over, the killed one started again; etcd compacted and kube-apiserver restarted (every watch ends, and resumes
//!    from before the compaction get 410 Gone); confighash's reads of ConfigMaps refused with 429
//!    by an API Priority and Fairness level (`real::Jail`); kube-controller-manager restarted.
//!    The run's own writes retry through them.
//! 4. Quiescence: polls until every stamp is the last of its history and every controller has
//!    seen its workload's last template, then a barrier.
//! 5. Checks, per workload: the stamp is the last of its history; its rollouts (the revisions
//!    the cluster keeps) are between 1 and the stamp changes of its history when the config
//!    changed, and 0 when it did not; every revision's template carries a stamp of the history,
//!    each later revision a later one (never back to older config, never a stamp no config
//!    had); and confighash's touches that the API server stored (2xx PATCHes in its audit log)
//!    are no more than its rollouts: a touch that rolled nothing is a violation.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use confighash::core::checksum::StampKey;
use confighash::core::refs::{self, References};
use k8s_openapi::api::apps::v1::{ControllerRevision, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, PodSpec, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::e2e::real::{self, Jail};
use crate::e2e::support::{self, Env, STAMP};

/// The run's namespace (as `Env::ns` maps it) and the one the jail's holder writes in.
const NS: &str = "fault-real";
const HOLD_NS: &str = "fault-real-hold";
/// The keys of every pool ConfigMap; key references select [`KEYED`] only.
const CM_KEYS: [&str; 3] = ["a", "b", "c"];
const KEYED: &str = "a";
const SECRET_KEYS: [&str; 2] = ["user", "token"];
/// How long one of the run's own writes may keep failing (kube-apiserver restarting) before the
/// run fails.
const WRITE_DEADLINE: Duration = Duration::from_secs(120);
/// How long quiescence may take after the last change and fault: a killed leader's Lease
/// expires after 15 s, watches back off up to 30 s after a restart.
const QUIESCENCE_DEADLINE: Duration = Duration::from_secs(300);
/// How long confighash's reads stay refused.
const REFUSED_FOR: Duration = Duration::from_secs(8);

/// How big a run is.
#[derive(Debug, Clone)]
pub struct Size {
    pub deployments: usize,
    pub stateful_sets: usize,
    pub daemon_sets: usize,
    pub config_maps: usize,
    pub secrets: usize,
    pub changes: usize,
    /// How long the changes are spread over.
    pub period: Duration,
}

impl Size {
    /// The real tier's size: every change kind and every fault, in about a minute of changes.
    pub fn tier() -> Size {
        Size {
            deployments: 14,
            stateful_sets: 3,
            daemon_sets: 3,
            config_maps: 8,
            secrets: 4,
            changes: 60,
            period: Duration::from_secs(50),
        }
    }

    /// The bench's size (`cargo bench --bench fault_run` with `CONFIGHASH_E2E_KUBECONFIG`).
    pub fn bench() -> Size {
        Size {
            deployments: 60,
            stateful_sets: 10,
            daemon_sets: 10,
            config_maps: 24,
            secrets: 12,
            changes: 240,
            period: Duration::from_secs(120),
        }
    }

    fn workloads(&self) -> usize {
        self.deployments + self.stateful_sets + self.daemon_sets
    }
}

/// What a run found: its figures as a Markdown table, and every violation.
pub struct Report {
    pub table: String,
    pub violations: Vec<String>,
}

struct Workload {
    kind: &'static str,
    name: String,
    refs: References,
    /// The stamps its config had, in order (first: at creation).
    history: Vec<String>,
}

/// The pool as last read back from the API server.
#[derive(Default)]
struct Model {
    cms: BTreeMap<String, ConfigMap>,
    secrets: BTreeMap<String, Secret>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Change {
    Content,
    Rewrite,
    Label,
    Recreate,
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    KillLeader,
    CompactAndRestartApiServer,
    RefuseReads,
    RestartControllerManager,
}

/// When each fault starts, as a share of the change period.
const FAULTS: [(f64, Fault); 4] = [
    (0.10, Fault::KillLeader),
    (0.30, Fault::CompactAndRestartApiServer),
    (0.55, Fault::RefuseReads),
    (0.80, Fault::RestartControllerManager),
];

/// Runs the fault run on the real cluster `env` (started with `Env::controlling`, with the audit
/// log), `size` big, its changes drawn from `seed`.
pub async fn run(env: &Env, size: &Size, seed: u64) -> Report {
    let audit = support::audit().expect("the real-cluster fault run needs the audit log");
    let began = Instant::now();
    let mut rng = StdRng::seed_from_u64(seed);
    let ns = env.ns(NS);
    env.namespace(NS, true).await;
    env.namespace(HOLD_NS, false).await;
    let key = chart_key(env).await;

    // The pool and the workloads.
    let mut model = Model::default();
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &ns);
    for i in 0..size.config_maps {
        let data: Vec<(&str, &str)> = CM_KEYS.iter().map(|k| (*k, "0")).collect();
        env.config_map(NS, &format!("cm-{i}"), &data).await;
        let name = format!("cm-{i}");
        model
            .cms
            .insert(name.clone(), cms.get(&name).await.unwrap());
    }
    for i in 0..size.secrets {
        let data: Vec<(&str, &str)> = SECRET_KEYS.iter().map(|k| (*k, "0")).collect();
        env.secret(NS, &format!("s-{i}"), &data).await;
        let name = format!("s-{i}");
        model
            .secrets
            .insert(name.clone(), secrets.get(&name).await.unwrap());
    }
    let mut workloads = Vec::new();
    let kinds = std::iter::repeat_n("Deployment", size.deployments)
        .chain(std::iter::repeat_n("StatefulSet", size.stateful_sets))
        .chain(std::iter::repeat_n("DaemonSet", size.daemon_sets));
    for (i, kind) in kinds.enumerate() {
        let name = format!("{}-{i}", kind.to_ascii_lowercase());
        let mut uses: Vec<(String, String)> = Vec::new();
        for _ in 0..rng.random_range(1..=3) {
            let cm = format!("cm-{}", rng.random_range(0..size.config_maps));
            let secret = format!("s-{}", rng.random_range(0..size.secrets));
            uses.push(match rng.random_range(0..5) {
                0 => ("envFrom".into(), cm),
                1 => ("key".into(), format!("{cm}/{KEYED}")),
                2 => ("volume".into(), cm),
                3 => ("secretEnvFrom".into(), secret),
                _ => ("secretKey".into(), format!("{secret}/token")),
            });
        }
        let uses: Vec<(&str, &str)> = uses.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        let mut object = support::workload_object(kind, &name, &uses, json!({}));
        object["spec"]["revisionHistoryLimit"] = json!(1000);
        let refs = template_refs(&object);
        let api: Api<DynamicObject> =
            Api::namespaced_with(env.client.clone(), &ns, &support::api_resource(kind));
        api.create(
            &PostParams::default(),
            &serde_json::from_value(object).unwrap(),
        )
        .await
        .unwrap();
        let (stamp, _) = support::recipe(&key, &ns, &refs, &model.cms, &model.secrets).unwrap();
        workloads.push(Workload {
            kind,
            name,
            refs,
            history: vec![stamp],
        });
    }
    let mut violations = Vec::new();
    for w in &workloads {
        env.wait_first_revision(NS, w.kind, &w.name).await;
        let stored = env.stamp(NS, w.kind, &w.name).await;
        if stored.as_deref() != Some(w.history[0].as_str()) {
            violations.push(format!(
                "{} {}: stamped {stored:?} at CREATE, the recipe says {}",
                w.kind, w.name, w.history[0]
            ));
        }
    }
    env.barrier(NS).await;
    let setup = began.elapsed();

    // A second replica: the first fault kills whichever leads.
    support::serve_sh("start", 1).await;
    let _replicas = Replicas;
    env.wait_leader().await;

    // The changes and the faults, side by side.
    let start = Instant::now();
    let mut counts: BTreeMap<Change, usize> = BTreeMap::new();
    let changes = async {
        for i in 0..size.changes {
            let due = size.period.mul_f64(i as f64 / size.changes as f64);
            tokio::time::sleep(due.saturating_sub(start.elapsed())).await;
            let change = match rng.random_range(0..100) {
                0..55 => Change::Content,
                55..70 => Change::Rewrite,
                70..85 => Change::Label,
                _ => Change::Recreate,
            };
            *counts.entry(change).or_default() += 1;
            apply(env, &ns, &mut rng, &mut model, change, i).await;
            for w in workloads.iter_mut() {
                let (stamp, _) =
                    support::recipe(&key, &ns, &w.refs, &model.cms, &model.secrets).unwrap();
                if w.history.last() != Some(&stamp) {
                    w.history.push(stamp);
                }
            }
        }
    };
    let faults = async {
        let mut log = Vec::new();
        for (at, fault) in FAULTS {
            let due = size.period.mul_f64(at);
            tokio::time::sleep(due.saturating_sub(start.elapsed())).await;
            let from = start.elapsed();
            inject(env, audit.user(), &ns, fault).await;
            log.push(format!(
                "{fault:?} {:.1}-{:.1} s",
                from.as_secs_f64(),
                start.elapsed().as_secs_f64()
            ));
        }
        log
    };
    let ((), fault_log) = tokio::join!(changes, faults);
    let changed_for = start.elapsed();

    // Quiescence.
    let quiet = Instant::now();
    loop {
        let mut waiting = Vec::new();
        for w in &workloads {
            let stamp = env.stamp(NS, w.kind, &w.name).await;
            if stamp.as_ref() != w.history.last() {
                waiting.push(format!("{} {}", w.kind, w.name));
            } else if !env.observed_latest(NS, w.kind, &w.name).await {
                waiting.push(format!("{} {} (its controller)", w.kind, w.name));
            }
        }
        if waiting.is_empty() {
            break;
        }
        if quiet.elapsed() > QUIESCENCE_DEADLINE {
            violations.push(format!(
                "not quiescent {QUIESCENCE_DEADLINE:?} after the last change: {}",
                waiting.join(", ")
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let quiescence = quiet.elapsed();
    env.wait_leader().await;
    env.barrier(NS).await;

    // The checks.
    let touches = audit.workload_writes(&ns[NS.len() + 1..]);
    if touches.iter().all(|t| t.stored_stamp.is_none()) && !touches.is_empty() {
        violations.push(
            "the audit log records no workload the API server stored: its policy must log \
             confighash's workload writes at RequestResponse (scripts/control-plane.sh)"
                .to_owned(),
        );
    }
    let mut totals = Totals::default();
    for w in &workloads {
        check(env, w, &touches, &mut totals, &mut violations).await;
    }
    let mut table = String::new();
    table.push_str(
        "| seed | workloads | changes (content / rewrite / label / re-create) | faults | \
         config transitions | rollouts (new stamps stored) / controller revisions | `ConfigChanged` touches | writes stored / refused by the test / other | \
         touches that rolled nothing | rollouts to older config | setup / changes / quiescence |\n",
    );
    table.push_str("|---|---|---|---|---|---|---|---|---|---|---|\n");
    let count = |c: Change| counts.get(&c).copied().unwrap_or(0);
    table.push_str(&format!(
        "| {seed} | {} | {} ({} / {} / {} / {}) | {} | {} | {} / {} | {} | {} / {} / {} | {} | {} | {:.0} / {:.0} / {:.0} s |\n",
        size.workloads(),
        size.changes,
        count(Change::Content),
        count(Change::Rewrite),
        count(Change::Label),
        count(Change::Recreate),
        fault_log.join("; "),
        totals.transitions,
        totals.rollouts,
        totals.revisions,
        totals.touched,
        totals.stored,
        totals.refused,
        totals.other,
        totals.rolled_nothing,
        totals.backwards,
        setup.as_secs_f64(),
        changed_for.as_secs_f64(),
        quiescence.as_secs_f64(),
    ));
    Report { table, violations }
}

/// Stops replica 1 and makes sure replica 0 runs again, for the scenarios after the run (also
/// when it fails).
struct Replicas;

impl Drop for Replicas {
    fn drop(&mut self) {
        let Some(script) = std::env::var_os("CONFIGHASH_E2E_SERVE") else {
            return;
        };
        for (verb, replica) in [("stop", "1"), ("start", "0")] {
            // `start` of a replica that runs fails, and says so: that is the wanted state.
            let _ = std::process::Command::new(&script)
                .args([verb, replica])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

/// The chart's HMAC key, from its key Secret (the real tier's release `confighash`).
async fn chart_key(env: &Env) -> StampKey {
    let secret = Api::<Secret>::namespaced(env.client.clone(), "confighash")
        .get("confighash-key")
        .await
        .expect("the chart's key Secret confighash/confighash-key");
    let bytes = secret
        .data
        .and_then(|d| d.get("key").cloned())
        .expect("the key Secret has a key");
    StampKey::new(bytes.0).expect("the chart's key is a valid key")
}

fn template_refs(object: &Value) -> References {
    let spec: PodSpec =
        serde_json::from_value(object["spec"]["template"]["spec"].clone()).expect("a pod spec");
    let annotations: Option<BTreeMap<String, String>> =
        serde_json::from_value(object["metadata"]["annotations"].clone()).ok();
    refs::discover(&spec, annotations.as_ref())
}

/// Retries one of the run's writes until it is answered (kube-apiserver may be restarting).
/// `done` says which errors mean the write is in place already (a retry of a write that was
/// stored before its answer was lost).
async fn retrying<T, F, Fut>(what: &str, done: fn(&kube::Error) -> bool, mut write: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let start = Instant::now();
    loop {
        match write().await {
            Ok(_) => return,
            Err(e) if done(&e) => return,
            Err(e) => {
                assert!(
                    start.elapsed() < WRITE_DEADLINE,
                    "{what}: still failing after {WRITE_DEADLINE:?}: {e}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

fn never(_: &kube::Error) -> bool {
    false
}

fn code_is(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// Makes change number `i` of kind `change` to a pool object, and reads the object back.
async fn apply(env: &Env, ns: &str, rng: &mut StdRng, model: &mut Model, change: Change, i: usize) {
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), ns);
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), ns);
    let secret = change == Change::Recreate || rng.random_bool(0.35);
    let name = if secret {
        format!("s-{}", rng.random_range(0..model.secrets.len()))
    } else {
        format!("cm-{}", rng.random_range(0..model.cms.len()))
    };
    let what = format!("change {i} ({change:?} of {name})");
    let patch = match change {
        Change::Content if secret => {
            let key = SECRET_KEYS[rng.random_range(0..SECRET_KEYS.len())];
            json!({"stringData": {key: format!("v{i}")}})
        }
        Change::Content => {
            let key = CM_KEYS[rng.random_range(0..CM_KEYS.len())];
            json!({"data": {key: format!("v{i}")}})
        }
        Change::Rewrite => {
            json!({"metadata": {"annotations": {"fault-run.example.com/synced": i.to_string()}}})
        }
        Change::Label => {
            json!({"metadata": {"labels": {"fault-run.example.com/rev": i.to_string()}}})
        }
        Change::Recreate => Value::Null,
    };
    let (post, merge, params) = (
        PostParams::default(),
        Patch::Merge(&patch),
        PatchParams::default(),
    );
    let delete = DeleteParams::default();
    if change == Change::Recreate {
        let old = model.secrets[&name].clone();
        retrying(
            &what,
            |e| code_is(e, 404),
            || secrets.delete(&name, &delete),
        )
        .await;
        let again = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            data: old.data.clone(),
            type_: old.type_.clone(),
            ..Default::default()
        };
        retrying(&what, |e| code_is(e, 409), || secrets.create(&post, &again)).await;
    } else if secret {
        retrying(&what, never, || secrets.patch(&name, &params, &merge)).await;
    } else {
        retrying(&what, never, || cms.patch(&name, &params, &merge)).await;
    }
    let start = Instant::now();
    loop {
        let read = if secret {
            secrets.get(&name).await.map(|s| {
                model.secrets.insert(name.clone(), s);
            })
        } else {
            cms.get(&name).await.map(|c| {
                model.cms.insert(name.clone(), c);
            })
        };
        match read {
            Ok(()) => return,
            Err(e) => assert!(
                start.elapsed() < WRITE_DEADLINE,
                "{what}: reading it back still fails after {WRITE_DEADLINE:?}: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Injects one fault and returns once it is over.
async fn inject(env: &Env, user: &str, ns: &str, fault: Fault) {
    match fault {
        Fault::KillLeader => {
            let leader = support::leader_replica(env)
                .await
                .expect("a replica holds confighash's Lease");
            support::serve_sh("kill", leader).await;
            // The other replica takes the Lease once it expires; then the killed one comes back
            // as a follower.
            let start = Instant::now();
            while support::leader_replica(env)
                .await
                .is_none_or(|now| now == leader)
            {
                assert!(
                    start.elapsed() < support::LEADER_DEADLINE,
                    "no other replica took the Lease within {:?} of the leader's kill",
                    support::LEADER_DEADLINE
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            support::serve_sh("start", leader).await;
        }
        Fault::CompactAndRestartApiServer => {
            real::control_plane(&["compact"]).await;
            real::control_plane(&["restart", "kube-apiserver"]).await;
        }
        Fault::RefuseReads => {
            let hold = env.ns(HOLD_NS);
            let jail = Jail::start(env, user, ns, &hold).await;
            let holders = jail.until_refused(env, user, ns, &hold).await;
            // The fault's length, not a wait for something to happen.
            tokio::time::sleep(REFUSED_FOR).await;
            drop(jail);
            for holder in holders {
                holder.abort();
            }
        }
        Fault::RestartControllerManager => {
            real::control_plane(&["restart", "kube-controller-manager"]).await;
        }
    }
}

#[derive(Default)]
struct Totals {
    transitions: usize,
    rollouts: u64,
    stored: usize,
    refused: usize,
    other: usize,
    touched: u64,
    revisions: usize,
    rolled_nothing: u64,
    backwards: usize,
}

/// The revisions the cluster keeps of a workload, as (revision, stamp of its template), oldest
/// first.
async fn revisions(env: &Env, w: &Workload) -> Vec<(i64, Option<String>)> {
    let ns = env.ns(NS);
    let object = env.get_workload(NS, w.kind, &w.name).await.unwrap();
    let uid = object["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let owned = |owners: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference]| {
        owners.iter().any(|o| o.uid == uid)
    };
    let mut out: Vec<(i64, Option<String>)> = if w.kind == "Deployment" {
        Api::<ReplicaSet>::namespaced(env.client.clone(), &ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|rs| owned(rs.owner_references()))
            .map(|rs| {
                let revision = rs
                    .annotations()
                    .get("deployment.kubernetes.io/revision")
                    .and_then(|r| r.parse().ok())
                    .unwrap_or(0);
                let stamp = rs
                    .spec
                    .and_then(|s| s.template)
                    .and_then(|t| t.metadata)
                    .and_then(|m| m.annotations)
                    .and_then(|a| a.get(STAMP).cloned());
                (revision, stamp)
            })
            .collect()
    } else {
        Api::<ControllerRevision>::namespaced(env.client.clone(), &ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|r| owned(r.owner_references()))
            .map(|r| {
                let stamp = r.data.as_ref().and_then(|d| {
                    d.0.pointer("/spec/template/metadata/annotations")
                        .and_then(|a| a.get(STAMP))
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                });
                (r.revision, stamp)
            })
            .collect()
    };
    out.sort();
    out
}

/// Where each of `stamps` stands in the workload's history: violations for a stamp the config
/// never had and for a step back to an older one. Returns the positions, as `#N`.
fn ordered<'a>(
    id: &str,
    what: &str,
    index: &HashMap<&str, usize>,
    stamps: impl Iterator<Item = (String, Option<&'a str>)>,
    totals: &mut Totals,
    violations: &mut Vec<String>,
) -> Vec<String> {
    let mut last: Option<usize> = None;
    let mut seen = Vec::new();
    for (label, stamp) in stamps {
        let at = stamp.and_then(|s| index.get(s).copied());
        seen.push(match (stamp, at) {
            (_, Some(i)) => format!("{label}:#{i}"),
            (Some(s), None) => format!("{label}:{}", s.chars().take(20).collect::<String>()),
            (None, None) => format!("{label}:none"),
        });
        match (at, last) {
            (None, _) => violations.push(format!(
                "{id}: {what} {label} carries {stamp:?}, a stamp its config never had"
            )),
            (Some(i), Some(l)) if i < l => {
                totals.backwards += 1;
                violations.push(format!(
                    "{id}: {what} {label} went back to config #{i} after #{l}"
                ));
            }
            (Some(i), _) => last = Some(i),
        }
    }
    seen
}

async fn check(
    env: &Env,
    w: &Workload,
    touches: &[support::Audited],
    totals: &mut Totals,
    violations: &mut Vec<String>,
) {
    let id = format!("{} {}", w.kind, w.name);
    let stamp = env.stamp(NS, w.kind, &w.name).await;
    if stamp.as_ref() != w.history.last() {
        violations.push(format!(
            "{id}: stamp {stamp:?}, the recipe over its config says {:?}",
            w.history.last()
        ));
    }
    let index: HashMap<&str, usize> = w
        .history
        .iter()
        .enumerate()
        .map(|(i, s)| (s.as_str(), i))
        .collect();

    // confighash's writes of it, by answer, and the stamps the stored ones left: a write the
    // webhook turned back (keeping the stamp as it was, because its reads were refused) is
    // stored unchanged, and the first write after a test that failed is refused (422).
    let plural = support::api_resource(w.kind).plural;
    let mine: Vec<&support::Audited> = touches
        .iter()
        .filter(|t| t.name == w.name && t.resource == plural)
        .collect();
    let stored: Vec<&support::Audited> = mine
        .iter()
        .copied()
        .filter(|t| (200..300).contains(&t.code))
        .collect();
    let refused = mine
        .iter()
        .filter(|t| t.code == 422 || t.code == 409)
        .count();
    totals.stored += stored.len();
    totals.refused += refused;
    totals.other += mine.len() - stored.len() - refused;
    // The rollouts: each write that stored a new stamp (the controllers may fold two quick
    // ones into one revision).
    let mut rollouts = 0u64;
    let mut previous = w.history[0].as_str();
    for write in &stored {
        if let Some(now) = write.stored_stamp.as_deref()
            && now != previous
        {
            rollouts += 1;
            previous = now;
        }
    }
    let writes = ordered(
        &id,
        "write",
        &index,
        std::iter::once(("w0".to_owned(), Some(w.history[0].as_str()))).chain(
            stored
                .iter()
                .enumerate()
                .map(|(i, t)| (format!("w{}", i + 1), t.stored_stamp.as_deref())),
        ),
        totals,
        violations,
    );
    let revisions = revisions(env, w).await;
    totals.revisions += revisions.len().saturating_sub(1);
    let revisions = ordered(
        &id,
        "revision",
        &index,
        revisions
            .iter()
            .map(|(r, stamp)| (format!("r{r}"), stamp.as_deref())),
        totals,
        violations,
    );
    let transitions = w.history.len() - 1;
    totals.transitions += transitions;
    totals.rollouts += rollouts;
    let trail = || {
        format!(
            "(writes {}; revisions {})",
            writes.join(" "),
            revisions.join(" ")
        )
    };
    if transitions == 0 && rollouts > 0 {
        violations.push(format!(
            "{id}: rolled {rollouts} times, its config never changed {}",
            trail()
        ));
    }
    if transitions > 0 && rollouts == 0 {
        violations.push(format!(
            "{id}: its config changed {transitions} times, it never rolled {}",
            trail()
        ));
    }
    if rollouts as usize > transitions {
        violations.push(format!(
            "{id}: rolled {rollouts} times, more than its config changed ({transitions}) {}",
            trail()
        ));
    }
    // The touches it counted as rolling, each with a `ConfigChanged` Event (the recorder folds
    // repeats into a series: its count), against the new stamps stored.
    let touched: u64 = env
        .recorded_events(NS, &w.name, confighash::core::names::CONFIG_CHANGED_REASON)
        .await
        .iter()
        .map(|e| {
            e.series
                .as_ref()
                .map_or(1, |s| u64::try_from(s.count).unwrap_or(0))
        })
        .sum();
    totals.touched += touched;
    totals.rolled_nothing += touched.saturating_sub(rollouts);
    if touched != rollouts {
        violations.push(format!(
            "{id}: {touched} ConfigChanged Events, {rollouts} new stamps stored {}",
            trail()
        ));
    }
}

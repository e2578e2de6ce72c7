//! The stand-in held to kube-apiserver: one scenario script, run on either server, records what
//! the server shows after each step (a transcript), and the transcript must equal the one
//! kube-apiserver 1.34 gave, committed as `tests/differential/kube-apiserver.json`.
//!
//! In the fast suite the script runs on the in-memory API server with confighash in-process, so
//! a difference of the stand-in from the real server fails `cargo test`. The real tier runs it on
//! kube-apiserver (`scripts/real-tier.sh`), where a transcript that changed fails too: set
//! `CONFIGHASH_DIFFERENTIAL_WRITE=1` there to write the new one, and look at the diff.
//!
//! What is recorded, per step: the workload's generation, rollouts (as [`Env::rollouts`] counts
//! them), its stamp (as the n-th distinct stamp seen), the keys of its pod template's
//! annotations, the field managers of its managedFields (and their operations; the controllers'
//! `status` entries are left out: the stand-in runs no controllers), whether the ConfigMap's and
//! the workload's resourceVersion moved, the events of a watch on the ConfigMap, confighash's
//! writes to the workload (by verb and resource), and its `ConfigChanged` recordings. The namespace's deletion is recorded as the phase it shows at once and whether
//! it is then gone.

use crate::support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::{Value, json};
use support::Env;

const NS: &str = "diff";
const GOLDEN: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/differential/kube-apiserver.json"
);

/// What the script has seen so far, to record changes step by step.
struct Recorder {
    steps: Vec<Value>,
    stamps: Vec<String>,
    config_map_rv: String,
    workload_rv: String,
    writes: BTreeMap<String, usize>,
    watched: Arc<Mutex<Vec<String>>>,
}

impl Recorder {
    fn stamp_class(&mut self, stamp: Option<String>) -> Value {
        let Some(stamp) = stamp else {
            return Value::Null;
        };
        let n = match self.stamps.iter().position(|s| *s == stamp) {
            Some(i) => i + 1,
            None => {
                self.stamps.push(stamp);
                self.stamps.len()
            }
        };
        json!(format!("S{n}"))
    }

    async fn observe(&mut self, env: &Env, step: &str) {
        env.barrier(NS).await;
        let deployment = Api::<Deployment>::namespaced(env.client.clone(), &env.ns(NS))
            .get("web")
            .await
            .unwrap();
        let config_map = Api::<ConfigMap>::namespaced(env.client.clone(), &env.ns(NS))
            .get("cfg")
            .await
            .unwrap();
        let template = deployment.spec.as_ref().unwrap().template.metadata.clone();
        let annotations = template
            .as_ref()
            .and_then(|m| m.annotations.clone())
            .unwrap_or_default();
        let stamp = self.stamp_class(annotations.get(support::STAMP).cloned());
        let mut managers: Vec<String> = deployment
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter(|m| m.subresource.is_none())
            .map(|m| {
                format!(
                    "{} {}",
                    m.manager.as_deref().unwrap_or("?"),
                    m.operation.as_deref().unwrap_or("?")
                )
            })
            .collect();
        managers.sort();
        let rv = |m: &kube::api::ObjectMeta| m.resource_version.clone().unwrap_or_default();
        let config_map_moved = rv(&config_map.metadata) != self.config_map_rv;
        let workload_moved = rv(&deployment.metadata) != self.workload_rv;
        self.config_map_rv = rv(&config_map.metadata);
        self.workload_rv = rv(&deployment.metadata);

        let mut writes = BTreeMap::new();
        for w in env.confighash_writes(NS) {
            // Its Events are counted by their recordings below (the barrier records some too,
            // and a create names no object in its path).
            if w.name == "web" {
                *writes
                    .entry(format!("{} {}", w.verb, w.resource))
                    .or_insert(0usize) += 1;
            }
        }
        let new_writes: BTreeMap<String, usize> = writes
            .iter()
            .map(|(k, n)| (k.clone(), n - self.writes.get(k).copied().unwrap_or(0)))
            .filter(|(_, n)| *n > 0)
            .collect();
        self.writes = writes;
        let watched = std::mem::take(&mut *self.watched.lock().unwrap());
        let config_changed: i64 = env
            .recorded_events(NS, "web", "ConfigChanged")
            .await
            .iter()
            .map(|e| e.series.as_ref().map_or(1, |s| i64::from(s.count)))
            .sum();
        self.steps.push(json!({
            "step": step,
            "generation": deployment.metadata.generation,
            "rollouts": env.rollouts(NS, "Deployment", "web").await,
            "stamp": stamp,
            "template annotations": annotations.keys().collect::<Vec<_>>(),
            "managers": managers,
            "config map resourceVersion moved": config_map_moved,
            "workload resourceVersion moved": workload_moved,
            "config map watch events": watched,
            "confighash writes": new_writes,
            "ConfigChanged recordings": config_changed,
        }));
    }
}

/// Follows the ConfigMap `cfg` from `resource_version` on, recording each event's type.
fn watch_config_map(env: &Env, resource_version: String, into: Arc<Mutex<Vec<String>>>) {
    let api: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns(NS));
    tokio::spawn(async move {
        let params = WatchParams::default().fields("metadata.name=cfg");
        let mut stream = api.watch(&params, &resource_version).await.unwrap().boxed();
        while let Some(event) = stream.next().await {
            let kind = match event {
                Ok(WatchEvent::Added(_)) => "ADDED",
                Ok(WatchEvent::Modified(_)) => "MODIFIED",
                Ok(WatchEvent::Deleted(_)) => "DELETED",
                Ok(WatchEvent::Bookmark(_)) => continue,
                Ok(WatchEvent::Error(e)) => panic!("the watch failed: {e:?}"),
                Err(e) => panic!("the watch failed: {e}"),
            };
            into.lock().unwrap().push(kind.to_owned());
        }
    });
}

async fn run(env: &Env) -> Value {
    env.namespace(NS, true).await;
    env.config_map(NS, "cfg", &[("a", "1")]).await;
    env.secret(NS, "sec", &[("p", "1")]).await;
    let config_maps: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns(NS));
    let created = config_maps.get("cfg").await.unwrap();
    let watched = Arc::new(Mutex::new(Vec::new()));
    watch_config_map(
        env,
        created.metadata.resource_version.clone().unwrap(),
        watched.clone(),
    );
    env.deployment(NS, "web", &[("envFrom", "cfg"), ("secretEnvFrom", "sec")])
        .await;
    let mut r = Recorder {
        steps: Vec::new(),
        stamps: Vec::new(),
        config_map_rv: String::new(),
        workload_rv: String::new(),
        writes: BTreeMap::new(),
        watched,
    };
    r.observe(env, "created").await;

    env.config_map(NS, "cfg", &[("a", "2")]).await;
    env.wait_rollouts(NS, "Deployment", "web", 1).await;
    r.observe(env, "ConfigMap content changed").await;

    config_maps
        .patch(
            "cfg",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}})),
        )
        .await
        .unwrap();
    r.observe(env, "ConfigMap label added").await;

    let live = config_maps.get("cfg").await.unwrap();
    config_maps
        .replace("cfg", &PostParams::default(), &live)
        .await
        .unwrap();
    r.observe(env, "ConfigMap replaced unchanged").await;

    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns(NS));
    env.set_image(NS, "web", "example/app:2").await;
    env.wait_rollouts(NS, "Deployment", "web", 2).await;
    r.observe(env, "Deployment image changed").await;

    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .unwrap();
    r.observe(env, "Deployment scaled").await;

    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &env.ns(NS));
    secrets
        .delete("sec", &DeleteParams::default())
        .await
        .unwrap();
    env.secret(NS, "sec", &[("p", "1")]).await;
    r.observe(env, "Secret deleted and re-created the same")
        .await;

    let mut manifest = serde_json::to_value(deployments.get("web").await.unwrap()).unwrap();
    manifest["metadata"] = json!({"name": "web"});
    manifest.as_object_mut().unwrap().remove("status");
    manifest["spec"]["template"]["metadata"]["annotations"] = json!({});
    let mut dry = PatchParams::apply("gitops").force();
    dry.dry_run = true;
    let answer = deployments
        .patch("web", &dry, &Patch::Apply(&manifest))
        .await
        .unwrap();
    let answered = answer
        .spec
        .and_then(|s| s.template.metadata)
        .and_then(|m| m.annotations)
        .and_then(|a| a.get(support::STAMP).cloned());
    let answered = r.stamp_class(answered);
    r.observe(env, "server-side dry-run apply by another manager")
        .await;
    r.steps
        .last_mut()
        .unwrap()
        .as_object_mut()
        .unwrap()
        .insert("dry-run answer stamp".into(), answered);

    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    namespaces
        .delete(&env.ns(NS), &DeleteParams::default())
        .await
        .unwrap();
    let phase = namespaces
        .get_opt(&env.ns(NS))
        .await
        .unwrap()
        .and_then(|n| n.status)
        .and_then(|s| s.phase);
    env.eventually("the namespace to be gone", || async {
        namespaces.get_opt(&env.ns(NS)).await.unwrap().is_none()
    })
    .await;
    r.steps.push(json!({
        "step": "namespace deleted",
        "phase at once": phase,
        "then gone": true,
    }));
    Value::Array(r.steps)
}

#[tokio::test]
async fn the_stand_in_shows_what_kube_apiserver_shows() {
    let env = Env::start().await;
    if !env.counts_writes() {
        eprintln!(
            "skipped: the differential script counts confighash's writes: set CONFIGHASH_E2E_AUDIT_LOG"
        );
        return;
    }
    let transcript = run(&env).await;
    let text = serde_json::to_string_pretty(&transcript).unwrap() + "\n";
    let server = if env.is_stand_in() {
        "the stand-in"
    } else {
        "kube-apiserver"
    };
    if !env.is_stand_in() && std::env::var_os("CONFIGHASH_DIFFERENTIAL_WRITE").is_some() {
        std::fs::write(GOLDEN, &text).unwrap();
        eprintln!("wrote {GOLDEN}");
        return;
    }
    let golden = std::fs::read_to_string(GOLDEN).unwrap_or_else(|e| {
        panic!("{GOLDEN}: {e} (write it on kube-apiserver with CONFIGHASH_DIFFERENTIAL_WRITE=1)")
    });
    let golden: Value = serde_json::from_str(&golden).unwrap();
    let (ours, theirs) = (transcript.as_array().unwrap(), golden.as_array().unwrap());
    let mut differences = Vec::new();
    for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
        for (key, expected) in b.as_object().unwrap() {
            let got = a.get(key).unwrap_or(&Value::Null);
            if got != expected {
                differences.push(format!(
                    "step {i} ({}): {key}: kube-apiserver {expected}, {server} {got}",
                    b["step"]
                ));
            }
        }
    }
    if ours.len() != theirs.len() {
        differences.push(format!(
            "{} steps, kube-apiserver {}",
            ours.len(),
            theirs.len()
        ));
    }
    assert!(
        differences.is_empty(),
        "{server} differs from kube-apiserver:\n{}\n\n{server}'s transcript:\n{text}",
        differences.join("\n")
    );
}

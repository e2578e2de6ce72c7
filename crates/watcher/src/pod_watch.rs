//! The pods of the namespaces where a progressive wave judges, from one watch per namespace
//! (never a list per workload per look): what [`crate::pods::judge`] reads, trimmed in memory to
//! the few fields it needs, so memory grows with the pods, not with their specs.
//!
//! A watch starts when a wave of the namespace starts judging and stops when none does
//! ([`crate::state::State::pod_namespaces`]); a look at pods waits for its first list.

use confighash_metrics::throttle::Throttle;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus, Pod,
    PodCondition, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;

use crate::pods::{Owner, PodsVerdict};
use confighash_cluster::redact;
use confighash_cluster::watch::StreamingLists;
use confighash_core::names::CHECKSUM_ANNOTATION;

/// Labels a pod keeps: those its owner is found by ([`Owner::owns`]).
const KEPT_LABELS: [&str; 2] = ["pod-template-hash", "rollouts-pod-template-hash"];

/// How long a look at pods waits for its namespace's first list before it reports an error.
pub const FIRST_LIST_WAIT: Duration = Duration::from_secs(60);

/// The pods of one namespace, as its watch last showed them.
#[derive(Default)]
struct Store {
    /// The RBAC does not let confighash list or watch pods here (the chart's
    /// `watcher.progressiveWavePods: false`): waves judge by rollout status alone.
    forbidden: bool,
    pods: HashMap<String, Pod>,
    /// What the list under way has brought so far (a relist replaces the store when it ends).
    listing: Option<HashMap<String, Pod>>,
}

/// One namespace's watch.
struct Watching {
    store: Arc<RwLock<Store>>,
    /// True once the first list is in.
    listed: watch::Receiver<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The pod watches, by namespace.
#[derive(Default)]
pub struct PodWatches {
    by_namespace: HashMap<String, Watching>,
    lists: StreamingLists,
}

/// Why a look at pods has no verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LookError {
    /// The RBAC does not allow listing or watching pods in the namespace.
    Forbidden,
    Other(String),
}

/// A look at the pods of one workload, answered from its namespace's watch.
pub struct Look {
    store: Arc<RwLock<Store>>,
    listed: watch::Receiver<bool>,
}

impl PodWatches {
    /// No namespace watched yet; their watches give up streaming lists as `lists` says.
    pub fn new(lists: StreamingLists) -> Self {
        PodWatches {
            lists,
            ..Default::default()
        }
    }

    /// Watches exactly these namespaces from now on.
    pub fn keep(&mut self, client: &kube::Client, page_size: u32, namespaces: &[&str]) {
        self.by_namespace
            .retain(|ns, _| namespaces.contains(&ns.as_str()));
        for ns in namespaces {
            if self.by_namespace.contains_key(*ns) {
                continue;
            }
            tracing::debug!(namespace = ns, "watching pods for a progressive wave");
            let store = Arc::new(RwLock::new(Store::default()));
            let (tx, listed) = watch::channel(false);
            let task = tokio::spawn(run(
                Api::namespaced(client.clone(), ns),
                page_size,
                store.clone(),
                tx,
                self.lists.clone(),
            ));
            self.by_namespace.insert(
                (*ns).to_owned(),
                Watching {
                    store,
                    listed,
                    task,
                },
            );
        }
    }

    /// How many namespaces are watched.
    pub fn len(&self) -> usize {
        self.by_namespace.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_namespace.is_empty()
    }

    /// A look at pods of `namespace`; `None` when it is not watched.
    pub fn look(&self, namespace: &str) -> Option<Look> {
        let w = self.by_namespace.get(namespace)?;
        Some(Look {
            store: w.store.clone(),
            listed: w.listed.clone(),
        })
    }
}

impl Look {
    /// The verdict on `owner`'s pods of `stamp`, once the namespace has listed.
    pub async fn judge(
        mut self,
        stamp: &str,
        owner: Owner<'_>,
        since: SystemTime,
    ) -> Result<PodsVerdict, LookError> {
        let listed = tokio::time::timeout(FIRST_LIST_WAIT, self.listed.wait_for(|l| *l)).await;
        match listed {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => {
                return Err(LookError::Other(
                    "the watch of the namespace's pods ended".to_owned(),
                ));
            }
            Err(_) => {
                return Err(LookError::Other(format!(
                    "the namespace's pods were not listed within {}s",
                    FIRST_LIST_WAIT.as_secs()
                )));
            }
        }
        let store = self.store.read().unwrap_or_else(|e| e.into_inner());
        if store.forbidden {
            return Err(LookError::Forbidden);
        }
        // Only pods of the stamp are judged: the rest are not even collected.
        let pods: Vec<&Pod> = store
            .pods
            .values()
            .filter(|p| {
                p.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(CHECKSUM_ANNOTATION))
                    .is_some_and(|s| s == stamp)
            })
            .collect();
        Ok(crate::pods::judge_refs(stamp, owner, since, &pods))
    }
}

async fn run(
    api: Api<Pod>,
    page_size: u32,
    store: Arc<RwLock<Store>>,
    listed: watch::Sender<bool>,
    lists: StreamingLists,
) {
    let config = watcher::Config::default().page_size(page_size);
    let mut events = confighash_cluster::watch::events(api, config, &lists)
        .default_backoff()
        .boxed();
    let throttle = Throttle::default();
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(event) => event,
            Err(e) => {
                if redact::is_forbidden(&e) {
                    // Said once, by the state; the watch keeps trying, and a list that works
                    // later takes over.
                    store.write().unwrap_or_else(|e| e.into_inner()).forbidden = true;
                    listed.send_replace(true);
                    continue;
                }
                if let Some(unlogged) = throttle.allow() {
                    tracing::warn!(error = %redact::watcher_error(&e), unlogged,
                        "watch of pods for a progressive wave failed; retrying");
                }
                continue;
            }
        };
        let mut s = store.write().unwrap_or_else(|e| e.into_inner());
        match event {
            Event::Init => s.listing = Some(HashMap::new()),
            Event::InitApply(pod) => {
                if let Some((name, pod)) = trimmed(pod) {
                    s.listing.get_or_insert_with(HashMap::new).insert(name, pod);
                }
            }
            Event::InitDone => {
                if let Some(pods) = s.listing.take() {
                    s.pods = pods;
                }
                s.forbidden = false;
                drop(s);
                listed.send_replace(true);
            }
            Event::Apply(pod) => {
                if let Some((name, pod)) = trimmed(pod) {
                    s.pods.insert(name, pod);
                }
            }
            Event::Delete(pod) => {
                if let Some(name) = pod.metadata.name {
                    s.pods.remove(&name);
                }
            }
        }
    }
}

use kube::runtime::WatchStreamExt;

/// What the judge reads of a pod, and nothing else: its name, stamp, owner, the labels its owner
/// is found by, its creation and deletion, and of its status the phase, reason, Ready condition
/// and each container's restarts, waiting reason and terminations.
pub fn trimmed(pod: Pod) -> Option<(String, Pod)> {
    let meta = pod.metadata;
    let name = meta.name?;
    let annotations = meta.annotations.and_then(|mut a| {
        let stamp = a.remove(CHECKSUM_ANNOTATION)?;
        Some([(CHECKSUM_ANNOTATION.to_owned(), stamp)].into())
    });
    let labels = meta.labels.map(|l| {
        l.into_iter()
            .filter(|(k, _)| KEPT_LABELS.contains(&k.as_str()))
            .collect()
    });
    let owner_references = meta.owner_references.map(|refs| {
        refs.into_iter()
            .filter(|r| r.controller == Some(true))
            .map(|r| OwnerReference {
                api_version: String::new(),
                kind: r.kind,
                name: r.name,
                uid: r.uid,
                controller: r.controller,
                block_owner_deletion: None,
            })
            .collect()
    });
    let status = pod.status.map(|s| PodStatus {
        phase: s.phase,
        reason: s.reason,
        conditions: s.conditions.map(|c| {
            c.into_iter()
                .filter(|c| c.type_ == "Ready")
                .map(|c| PodCondition {
                    type_: c.type_,
                    status: c.status,
                    ..Default::default()
                })
                .collect()
        }),
        container_statuses: s.container_statuses.map(trim_containers),
        init_container_statuses: s.init_container_statuses.map(trim_containers),
        ..Default::default()
    });
    let trimmed = Pod {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            annotations,
            labels,
            owner_references,
            creation_timestamp: meta.creation_timestamp,
            deletion_timestamp: meta.deletion_timestamp,
            ..Default::default()
        },
        spec: None,
        status,
    };
    Some((name, trimmed))
}

fn trim_containers(statuses: Vec<ContainerStatus>) -> Vec<ContainerStatus> {
    let trim_state = |s: Option<ContainerState>| {
        s.map(|s| ContainerState {
            waiting: s.waiting.map(|w| ContainerStateWaiting {
                reason: w.reason,
                message: None,
            }),
            terminated: s.terminated.map(|t| ContainerStateTerminated {
                exit_code: t.exit_code,
                finished_at: t.finished_at,
                ..Default::default()
            }),
            running: None,
        })
    };
    statuses
        .into_iter()
        .map(|c| ContainerStatus {
            name: c.name,
            restart_count: c.restart_count,
            state: trim_state(c.state),
            last_state: trim_state(c.last_state),
            ready: c.ready,
            ..Default::default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_trimmed_pod_is_judged_as_the_whole_one() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {
                "name": "web-7d9f-a", "namespace": "shop",
                "annotations": {CHECKSUM_ANNOTATION: "s", "other": "x".repeat(10_000)},
                "labels": {"pod-template-hash": "7d9f", "app": "web"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "web-7d9f", "uid": "rs", "controller": true}],
                "creationTimestamp": "2026-06-01T12:00:00Z",
            },
            "spec": {"containers": [{"name": "app", "image": "app", "env": [{"name": "A", "value": "secret"}]}]},
            "status": {"phase": "Running", "reason": null,
                "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}],
                "containerStatuses": [{"name": "app", "image": "app", "imageID": "", "ready": true,
                    "restartCount": 2, "state": {"running": {"startedAt": "2026-06-01T12:05:00Z"}},
                    "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2026-06-01T12:04:00Z",
                        "message": "words it printed"}}}]},
        }))
        .unwrap();
        let owner = Owner {
            kind: confighash_core::workload::WorkloadKind::DEPLOYMENT,
            name: "web",
            uid: "uid-web",
        };
        let since: SystemTime = SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_000_000);
        let whole = crate::pods::judge("s", owner, since, std::slice::from_ref(&pod));
        let (name, small) = trimmed(pod.clone()).unwrap();
        assert_eq!(name, "web-7d9f-a");
        assert_eq!(
            crate::pods::judge("s", owner, since, std::slice::from_ref(&small)),
            whole
        );
        let text = serde_json::to_string(&small).unwrap();
        assert!(
            !text.contains("secret") && !text.contains("words it printed"),
            "{text}"
        );
        assert!(
            text.len() * 10 < serde_json::to_string(&pod).unwrap().len(),
            "{text}"
        );
    }
}

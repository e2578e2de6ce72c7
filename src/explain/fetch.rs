//! Reading what an explanation needs from the API server, through the sanitising client
//! ([`crate::cluster::client`]): the workload, its Namespace, the webhook configuration, the key,
//! the referenced objects and the namespace's Events. Only reads.
//!
//! A referenced Secret is reduced at once to what the recipe takes (a SHA-256 per key, as the
//! webhook reduces it), its resourceVersion and its field managers; its data is dropped here and
//! never reaches an error or the output.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use serde_json::Value;

use crate::certs::key::SECRET_DATA_KEY;
use crate::cluster::redact::kube_error;
use crate::core::checksum::StampKey;
use crate::core::names::ENABLED_LABEL;
use crate::core::record::ObjectRecord;
use crate::core::refs::{ObjectKind, ObjectRef};
use crate::core::workload::WorkloadKind;
use crate::explain::model::{self, KeyFacts, KeyOrigin, Read, RefObject};

/// Objects asked for per page of a list.
const PAGE: u32 = 250;
/// Pages of Events read at most in one namespace (the newest Events may be past them in a
/// namespace with more).
const MAX_EVENT_PAGES: usize = 20;
/// References read at once.
const CONCURRENT_READS: usize = 8;

/// The outcome of a request as a [`Read`].
fn read<T>(result: Result<T, kube::Error>) -> Read<T> {
    match result {
        Ok(t) => Read::Found(t),
        Err(kube::Error::Api(status)) if status.code == 404 => Read::Absent,
        Err(kube::Error::Api(status)) if status.code == 403 => Read::Forbidden,
        Err(e) => Read::Failed(kube_error(&e)),
    }
}

/// Reads through `client`.
#[derive(Clone)]
pub struct ClusterReader {
    client: kube::Client,
    /// Configured kinds' resources as discovery found them.
    discovered: Arc<tokio::sync::Mutex<HashMap<WorkloadKind, ApiResource>>>,
}

impl ClusterReader {
    pub fn new(client: kube::Client) -> Self {
        ClusterReader {
            client,
            discovered: Arc::default(),
        }
    }

    /// The API resource of a workload kind: a built-in kind's as kube names it, a configured
    /// kind's as discovery says (its CRD's plural), or as kube names it when the cluster does not
    /// serve it (reads then find nothing).
    pub async fn resource(&self, kind: WorkloadKind) -> ApiResource {
        let named = crate::cluster::discover::named_resource(kind);
        if kind.is_built_in() {
            return named;
        }
        let mut discovered = self.discovered.lock().await;
        if let Some(resource) = discovered.get(&kind) {
            return resource.clone();
        }
        match crate::cluster::discover::workload_resource(&self.client, kind).await {
            Ok(resource) => {
                discovered.insert(kind, resource.clone());
                resource
            }
            Err(_) => named,
        }
    }

    /// The workload as JSON.
    pub async fn workload(&self, kind: WorkloadKind, namespace: &str, name: &str) -> Read<Value> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &self.resource(kind).await);
        match read(api.get(name).await) {
            Read::Found(obj) => match serde_json::to_value(obj) {
                Ok(v) => Read::Found(v),
                Err(e) => Read::Failed(crate::cluster::redact::json_error(&e)),
            },
            Read::Absent => Read::Absent,
            Read::Forbidden => Read::Forbidden,
            Read::Failed(e) => Read::Failed(e),
        }
    }

    /// Every workload of `kind` in `namespace`; `Absent` when the kind is not served.
    pub async fn workloads(&self, kind: WorkloadKind, namespace: &str) -> Read<Vec<Value>> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &self.resource(kind).await);
        let mut items = Vec::new();
        let mut params = ListParams::default().limit(PAGE);
        loop {
            let page = match read(api.list(&params).await) {
                Read::Found(page) => page,
                Read::Absent => return Read::Absent,
                Read::Forbidden => return Read::Forbidden,
                Read::Failed(e) => return Read::Failed(e),
            };
            for obj in page.items {
                match serde_json::to_value(obj) {
                    Ok(v) => items.push(v),
                    Err(e) => return Read::Failed(crate::cluster::redact::json_error(&e)),
                }
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return Read::Found(items),
            }
        }
    }

    /// The namespaces labelled `confighash.dev/enabled=true`, sorted.
    pub async fn opted_in_namespaces(&self) -> Read<Vec<String>> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let mut names = Vec::new();
        let mut params = ListParams::default()
            .labels(&format!("{ENABLED_LABEL}=true"))
            .limit(PAGE);
        loop {
            let page = match read(api.list(&params).await) {
                Read::Found(page) => page,
                Read::Absent => return Read::Absent,
                Read::Forbidden => return Read::Forbidden,
                Read::Failed(e) => return Read::Failed(e),
            };
            names.extend(page.items.into_iter().filter_map(|ns| ns.metadata.name));
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
        names.sort();
        Read::Found(names)
    }

    /// The Namespace's labels.
    pub async fn namespace_labels(&self, namespace: &str) -> Read<BTreeMap<String, String>> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        match read(api.get(namespace).await) {
            Read::Found(ns) => Read::Found(ns.metadata.labels.unwrap_or_default()),
            Read::Absent => Read::Absent,
            Read::Forbidden => Read::Forbidden,
            Read::Failed(e) => Read::Failed(e),
        }
    }

    pub async fn webhook_configuration(&self, name: &str) -> Read<MutatingWebhookConfiguration> {
        let api: Api<MutatingWebhookConfiguration> = Api::all(self.client.clone());
        read(api.get(name).await)
    }

    /// The key from data key `key` of Secret `namespace/name`.
    pub async fn key_secret(&self, namespace: &str, name: &str) -> KeyFacts {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let key = match read(api.get(name).await) {
            Read::Found(secret) => {
                match crate::certs::key::key_from_secret(&secret, namespace, name) {
                    Ok(key) => Read::Found(key),
                    Err(e) => Read::Failed(e.to_string()),
                }
            }
            Read::Absent => Read::Absent,
            Read::Forbidden => Read::Forbidden,
            Read::Failed(e) => Read::Failed(format!(
                "reading Secret {namespace}/{name} (data key `{SECRET_DATA_KEY}`): {e}"
            )),
        };
        KeyFacts {
            source: KeyOrigin::Secret {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            },
            key,
        }
    }

    /// One referenced object, reduced to what is shown and hashed.
    pub async fn reference(&self, namespace: &str, object: &ObjectRef) -> Read<RefObject> {
        match object.kind {
            ObjectKind::ConfigMap => {
                let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
                match read(api.get(&object.name).await) {
                    Read::Found(cm) => match ObjectRecord::config_map(&cm) {
                        Ok(entry) => Read::Found(RefObject {
                            entry,
                            resource_version: cm.metadata.resource_version.clone(),
                            field_managers: crate::explain::observed::field_managers(
                                cm.metadata.managed_fields.as_deref(),
                            ),
                            progressive: confighash_watcher::index::is_progressive(
                                cm.metadata.annotations.as_ref(),
                            ),
                        }),
                        Err(e) => Read::Failed(e.to_string()),
                    },
                    Read::Absent => Read::Absent,
                    Read::Forbidden => Read::Forbidden,
                    Read::Failed(e) => Read::Failed(e),
                }
            }
            ObjectKind::Secret => {
                let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
                match read(api.get(&object.name).await) {
                    Read::Found(secret) => Read::Found(RefObject {
                        entry: ObjectRecord::secret(&secret),
                        resource_version: secret.metadata.resource_version.clone(),
                        field_managers: crate::explain::observed::field_managers(
                            secret.metadata.managed_fields.as_deref(),
                        ),
                        progressive: confighash_watcher::index::is_progressive(
                            secret.metadata.annotations.as_ref(),
                        ),
                    }),
                    Read::Absent => Read::Absent,
                    Read::Forbidden => Read::Forbidden,
                    Read::Failed(e) => Read::Failed(e),
                }
            }
        }
    }

    /// The references of one workload, a few at a time, from `cache` where they were read
    /// already (for another workload of the namespace). Over [`model::MAX_REFERENCES_READ`]
    /// none are read.
    pub async fn references(
        &self,
        namespace: &str,
        refs: &[ObjectRef],
        cache: &mut HashMap<ObjectRef, Read<RefObject>>,
    ) -> BTreeMap<ObjectRef, Read<RefObject>> {
        if refs.len() > model::MAX_REFERENCES_READ {
            return BTreeMap::new();
        }
        let missing: Vec<&ObjectRef> = refs.iter().filter(|r| !cache.contains_key(r)).collect();
        let fetched: Vec<(ObjectRef, Read<RefObject>)> = futures::stream::iter(missing)
            .map(|r| async move { (r.clone(), self.reference(namespace, r).await) })
            .buffer_unordered(CONCURRENT_READS)
            .collect()
            .await;
        cache.extend(fetched);
        refs.iter()
            .filter_map(|r| Some((r.clone(), cache.get(r)?.clone())))
            .collect()
    }

    /// The namespace's events.k8s.io/v1 Events (at most [`MAX_EVENT_PAGES`] pages).
    pub async fn events(&self, namespace: &str) -> Read<Vec<Event>> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let mut events = Vec::new();
        let mut params = ListParams::default().limit(PAGE);
        for _ in 0..MAX_EVENT_PAGES {
            let page = match read(api.list(&params).await) {
                Read::Found(page) => page,
                Read::Absent => return Read::Found(events),
                Read::Forbidden => return Read::Forbidden,
                Read::Failed(e) => return Read::Failed(e),
            };
            events.extend(page.items);
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
        Read::Found(events)
    }
}

/// The key from a file: its bytes exactly (as `serve --key-file` reads it).
pub fn key_file(path: &std::path::Path) -> KeyFacts {
    let key = match std::fs::read(path) {
        Ok(bytes) => match StampKey::new(bytes) {
            Ok(key) => Read::Found(key),
            Err(e) => Read::Failed(format!("the key file {} is refused: {e}", path.display())),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Read::Failed(format!("the key file {} does not exist", path.display()))
        }
        Err(e) => Read::Failed(format!("cannot read the key file {}: {e}", path.display())),
    };
    KeyFacts {
        source: KeyOrigin::File(path.display().to_string()),
        key,
    }
}

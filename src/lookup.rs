//! Reading a workload's references: every object in parallel under one deadline.
//!
//! NotFound is "absent", not an error. Any other error, or the deadline passing, fails the whole
//! lookup (stamp rule 1), because a stamp computed from part of the inputs would be wrong.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;

use crate::checksum::{self, ObjectView, Recipe, RecipeError, RefState, Stamp, StampKey};
use crate::metrics::Metrics;
use crate::refs::{ObjectKind, ObjectRef, References};
use crate::rules::Lookup;

/// A referenced object as read from the API server.
#[derive(Debug, Clone)]
pub enum Fetched {
    ConfigMap(ConfigMap),
    Secret(Secret),
}

impl Fetched {
    fn annotations(&self) -> Option<&BTreeMap<String, String>> {
        match self {
            Fetched::ConfigMap(c) => c.metadata.annotations.as_ref(),
            Fetched::Secret(s) => s.metadata.annotations.as_ref(),
        }
    }

    fn view(&self) -> Result<ObjectView<'_>, RecipeError> {
        match self {
            Fetched::ConfigMap(c) => ObjectView::config_map(c),
            Fetched::Secret(s) => Ok(ObjectView::secret(s)),
        }
    }
}

/// Why a lookup failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LookupError {
    #[error("reading {object}: {message}")]
    Read { object: ObjectRef, message: String },
    #[error("the lookup deadline of {0:?} passed")]
    Deadline(Duration),
    #[error(transparent)]
    Recipe(#[from] RecipeError),
}

/// Where referenced objects are read from.
pub trait ConfigSource: Send + Sync + 'static {
    /// The object, `None` when it does not exist.
    fn fetch<'a>(
        &'a self,
        namespace: &'a str,
        object: &'a ObjectRef,
    ) -> BoxFuture<'a, Result<Option<Fetched>, String>>;
}

/// Reads straight from the API server. A get without a resourceVersion is a consistent (quorum)
/// read, so a ConfigMap written just before its Deployment is seen.
pub struct KubeSource {
    client: kube::Client,
}

impl KubeSource {
    pub fn new(client: kube::Client) -> Self {
        KubeSource { client }
    }
}

impl ConfigSource for KubeSource {
    fn fetch<'a>(
        &'a self,
        namespace: &'a str,
        object: &'a ObjectRef,
    ) -> BoxFuture<'a, Result<Option<Fetched>, String>> {
        Box::pin(async move {
            match object.kind {
                ObjectKind::ConfigMap => {
                    Api::<ConfigMap>::namespaced(self.client.clone(), namespace)
                        .get_opt(&object.name)
                        .await
                        .map(|o| o.map(Fetched::ConfigMap))
                }
                ObjectKind::Secret => Api::<Secret>::namespaced(self.client.clone(), namespace)
                    .get_opt(&object.name)
                    .await
                    .map(|o| o.map(Fetched::Secret)),
            }
            .map_err(|e| e.to_string())
        })
    }
}

/// Every referenced object, read.
#[derive(Debug, Default)]
pub struct Resolved {
    objects: BTreeMap<ObjectRef, Option<Fetched>>,
}

impl Resolved {
    /// Required references that do not exist.
    pub fn absent_required<'r>(
        &'r self,
        refs: &'r References,
    ) -> impl Iterator<Item = &'r ObjectRef> {
        refs.iter()
            .filter(|(r, spec)| !spec.optional && matches!(self.objects.get(*r), Some(None)))
            .map(|(r, _)| r)
    }

    /// The expected stamp of the references `refs` of a workload in `namespace` over these
    /// objects, under `recipe` (v1 has no namespace: it is ignored there).
    pub fn stamp(
        &self,
        key: &StampKey,
        recipe: Recipe,
        namespace: &str,
        refs: &References,
    ) -> Result<Stamp, RecipeError> {
        let mut views = BTreeMap::new();
        for (r, fetched) in &self.objects {
            if let Some(f) = fetched
                && !checksum::is_ignored(f.annotations())
            {
                views.insert(r, f.view()?);
            }
        }
        let state = |r: &ObjectRef| match (self.objects.get(r), views.get(r)) {
            (_, Some(view)) => RefState::Present(view),
            (Some(Some(_)), None) => RefState::Ignored,
            _ => RefState::Absent,
        };
        Ok(match recipe {
            Recipe::V1 => checksum::compute_stamp_v1(Some(key), refs, state),
            Recipe::V2 => checksum::compute_stamp(Some(key), namespace, refs, state),
        })
    }

    /// The rules' view of this lookup; the expected v1 stamp only when `with_v1` (see
    /// [`crate::rules::needs_v1`]).
    pub fn lookup(
        &self,
        key: &StampKey,
        namespace: &str,
        refs: &References,
        with_v1: bool,
    ) -> Result<Lookup, RecipeError> {
        let expected_v1 = if with_v1 {
            Some(self.stamp(key, Recipe::V1, namespace, refs)?)
        } else {
            None
        };
        Ok(Lookup::Resolved {
            expected: self.stamp(key, Recipe::V2, namespace, refs)?,
            expected_v1,
            required_absent: self.absent_required(refs).next().is_some(),
        })
    }
}

/// Reads one review keeps in flight at most. A pod naming thousands of objects is read a few
/// at a time within the same deadline, not all at once against the API server; the deadline then
/// bounds how many reads one review can cause.
pub const MAX_CONCURRENT_READS: usize = 16;

/// Reads every reference of a workload in `namespace`, in parallel, within `deadline`.
pub async fn resolve(
    source: &dyn ConfigSource,
    namespace: &str,
    refs: &References,
    deadline: Duration,
    metrics: &Metrics,
) -> Result<Resolved, LookupError> {
    type Read<'a> = BoxFuture<'a, (&'a ObjectRef, Result<Option<Fetched>, String>)>;
    let reads: Vec<Read<'_>> = refs
        .iter()
        .map(|(r, _)| -> Read<'_> {
            Box::pin(async move { (r, source.fetch(namespace, r).await) })
        })
        .collect();
    let reads = futures::stream::iter(reads)
        .buffer_unordered(MAX_CONCURRENT_READS)
        .collect::<Vec<_>>();
    let results = tokio::time::timeout(deadline, reads).await.map_err(|_| {
        for (r, _) in refs.iter() {
            metrics.lookup(r.kind.as_str(), "deadline");
        }
        LookupError::Deadline(deadline)
    })?;
    let mut resolved = Resolved::default();
    let mut failure = None;
    for (r, result) in results {
        match result {
            Ok(found) => {
                metrics.lookup(
                    r.kind.as_str(),
                    if found.is_some() { "found" } else { "absent" },
                );
                resolved.objects.insert(r.clone(), found);
            }
            Err(message) => {
                metrics.lookup(r.kind.as_str(), "error");
                failure.get_or_insert(LookupError::Read {
                    object: r.clone(),
                    message,
                });
            }
        }
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(resolved),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::refs::Selection;

    /// Answers every read after a yield, counting how many are in flight at once.
    #[derive(Default)]
    struct Counting {
        in_flight: AtomicUsize,
        most: AtomicUsize,
        reads: AtomicUsize,
    }

    impl ConfigSource for Counting {
        fn fetch<'a>(
            &'a self,
            _namespace: &'a str,
            _object: &'a ObjectRef,
        ) -> BoxFuture<'a, Result<Option<Fetched>, String>> {
            Box::pin(async move {
                let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                self.most.fetch_max(now, Ordering::SeqCst);
                self.reads.fetch_add(1, Ordering::SeqCst);
                for _ in 0..3 {
                    tokio::task::yield_now().await;
                }
                self.in_flight.fetch_sub(1, Ordering::SeqCst);
                Ok(None)
            })
        }
    }

    #[tokio::test]
    async fn a_review_naming_many_objects_reads_a_few_at_a_time() {
        let mut refs = References::default();
        for i in 0..500 {
            refs.add(
                ObjectKind::ConfigMap,
                &format!("cm-{i}"),
                Selection::Whole,
                true,
            );
        }
        let source = Counting::default();
        let resolved = resolve(
            &source,
            "shop",
            &refs,
            Duration::from_secs(30),
            &Metrics::new(),
        )
        .await
        .unwrap();
        assert_eq!(
            source.reads.load(Ordering::SeqCst),
            500,
            "every object is read"
        );
        let most = source.most.load(Ordering::SeqCst);
        assert!(
            (2..=MAX_CONCURRENT_READS).contains(&most),
            "{most} reads in flight at once"
        );
        assert_eq!(resolved.absent_required(&refs).count(), 0);
    }
}

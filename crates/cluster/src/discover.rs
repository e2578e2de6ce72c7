//! Whether the cluster serves a workload kind, and under which resource.
//!
//! Discovery is the API server's word, and it goes into request paths: only what confighash
//! already knows is taken from it. A built-in kind's resource is its own (`deployments`); of a
//! configured kind (`--workload-kind`) only the plural is read, and only when it is a resource
//! name (a lower-case DNS label) the group version lists for exactly that kind. The group,
//! version and kind are always the configured ones.

use kube::api::{ApiResource, GroupVersionKind};

use confighash_core::workload::WorkloadKind;

/// The resource of `kind` as its name says (kube's plural: `deployments`, `clonesets`).
pub fn named_resource(kind: WorkloadKind) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        kind.group(),
        kind.version(),
        kind.kind(),
    ))
}

/// Why a kind's resource was not found.
#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    /// The group version is not served, or lists no resource of the kind (no CRD yet).
    #[error("not served: {0}")]
    NotServed(String),
    /// The group version lists the kind under a name that is not a resource name.
    #[error("discovery names the kind's resource with something that is not a resource name")]
    BadName,
}

/// The resource `kind` is served under, if the cluster serves it at the kind's version.
pub async fn workload_resource(
    client: &kube::Client,
    kind: WorkloadKind,
) -> Result<ApiResource, DiscoverError> {
    let list = client
        .list_api_group_resources(&kind.api_version())
        .await
        .map_err(|e| DiscoverError::NotServed(crate::redact::kube_error(&e)))?;
    let listed = list
        .resources
        .iter()
        // Subresources (`clonesets/status`) carry the kind too.
        .find(|r| r.kind == kind.kind() && !r.name.contains('/'))
        .ok_or_else(|| {
            DiscoverError::NotServed(format!(
                "{} lists no resource of kind {}",
                kind.api_version(),
                kind.kind()
            ))
        })?;
    if kind.is_built_in() {
        return Ok(named_resource(kind));
    }
    if !is_resource_name(&listed.name) {
        return Err(DiscoverError::BadName);
    }
    Ok(ApiResource {
        plural: listed.name.clone(),
        ..named_resource(kind)
    })
}

/// A lower-case DNS label: what a CRD's plural must be.
fn is_resource_name(name: &str) -> bool {
    confighash_core::refs::is_namespace_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_resource_names_are_taken_from_discovery() {
        for good in ["clonesets", "services", "scaled-jobs", "a1"] {
            assert!(is_resource_name(good), "{good}");
        }
        for bad in [
            "",
            "Clonesets",
            "x/status",
            "../secrets",
            "-a",
            "a-",
            "a.b",
            "a?b",
        ] {
            assert!(!is_resource_name(bad), "{bad}");
        }
        let long = "a".repeat(64);
        assert!(!is_resource_name(&long));
    }

    #[test]
    fn a_kinds_resource_by_its_name() {
        let resource = named_resource(WorkloadKind::ROLLOUT);
        assert_eq!(resource.api_version, "argoproj.io/v1alpha1");
        assert_eq!(resource.plural, "rollouts");
    }
}

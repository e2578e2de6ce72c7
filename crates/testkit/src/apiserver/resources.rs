//! The resources the stand-in serves, and the discovery documents that describe them.
//!
//! Mimics kube-apiserver's discovery: `/api` lists the core versions, `/apis` the groups,
//! `/api/v1` and `/apis/{group}/{version}` an `APIResourceList` per group version.

use serde_json::{Value, json};

/// One served resource type.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResourceInfo {
    /// "" for the core group.
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    /// The lowercase plural used in URLs and RBAC rules.
    pub plural: &'static str,
    pub namespaced: bool,
    /// Whether writes to `spec` bump `metadata.generation` (as for workloads and leases do not).
    pub generation: bool,
    /// Pointer to the pod template counted as rollouts, if this is a workload.
    pub template: Option<&'static str>,
    pub verbs: &'static [&'static str],
}

impl ResourceInfo {
    /// `apiVersion` as objects carry it: `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The URL prefix of this group version: `/api/v1` or `/apis/{group}/{version}`.
    pub fn prefix(&self) -> String {
        if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        }
    }
}

const ALL_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

const fn resource(
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
) -> ResourceInfo {
    ResourceInfo {
        group,
        version,
        kind,
        plural,
        namespaced,
        generation: false,
        template: None,
        verbs: ALL_VERBS,
    }
}

const fn workload(
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    template: &'static str,
) -> ResourceInfo {
    ResourceInfo {
        group,
        version,
        kind,
        plural,
        namespaced: true,
        generation: true,
        template: Some(template),
        verbs: ALL_VERBS,
    }
}

/// Argo Rollouts' group, served only while its CRD is "installed".
pub const ROLLOUTS_GROUP: &str = "argoproj.io";

/// The custom resources of [`RESOURCES`] (group, plural), none served until
/// `ApiServer::set_crd_served` says so.
pub const CRD_RESOURCES: [(&str, &str); 4] = [
    ("apps.kruise.io", "clonesets"),
    ("serving.knative.dev", "services"),
    ("keda.sh", "scaledjobs"),
    ("apps.kruise.io", "broadcastjobs"),
];

/// Every resource the stand-in knows.
pub static RESOURCES: &[ResourceInfo] = &[
    resource("", "v1", "Namespace", "namespaces", false),
    resource("", "v1", "ConfigMap", "configmaps", true),
    resource("", "v1", "Secret", "secrets", true),
    resource("", "v1", "Event", "events", true),
    resource("events.k8s.io", "v1", "Event", "events", true),
    workload("apps", "v1", "Deployment", "deployments", "/spec/template"),
    workload(
        "apps",
        "v1",
        "StatefulSet",
        "statefulsets",
        "/spec/template",
    ),
    workload("apps", "v1", "DaemonSet", "daemonsets", "/spec/template"),
    workload(
        "batch",
        "v1",
        "CronJob",
        "cronjobs",
        "/spec/jobTemplate/spec/template",
    ),
    workload(
        ROLLOUTS_GROUP,
        "v1alpha1",
        "Rollout",
        "rollouts",
        "/spec/template",
    ),
    // Custom resources with a pod template, as their CRDs serve them (tests/data/crds/), each
    // served only once its CRD is "applied" ([`CRD_RESOURCES`]).
    workload(
        "apps.kruise.io",
        "v1alpha1",
        "CloneSet",
        "clonesets",
        "/spec/template",
    ),
    workload(
        "serving.knative.dev",
        "v1",
        "Service",
        "services",
        "/spec/template",
    ),
    workload(
        "keda.sh",
        "v1alpha1",
        "ScaledJob",
        "scaledjobs",
        "/spec/jobTargetRef/template",
    ),
    workload(
        "apps.kruise.io",
        "v1alpha1",
        "BroadcastJob",
        "broadcastjobs",
        "/spec/template",
    ),
    resource("coordination.k8s.io", "v1", "Lease", "leases", true),
    resource(
        "admissionregistration.k8s.io",
        "v1",
        "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations",
        false,
    ),
];

/// Looks a resource up by group, version and plural.
pub fn find(
    resources: &[&'static ResourceInfo],
    group: &str,
    version: &str,
    plural: &str,
) -> Option<&'static ResourceInfo> {
    resources
        .iter()
        .copied()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// `GET /api`.
pub fn api_versions() -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]
    })
}

/// `GET /apis`: every non-core group among `resources`.
pub fn api_group_list(resources: &[&'static ResourceInfo]) -> Value {
    let mut groups: Vec<Value> = Vec::new();
    let mut seen: Vec<(&str, &str)> = Vec::new();
    for r in resources.iter().filter(|r| !r.group.is_empty()) {
        if seen.contains(&(r.group, r.version)) {
            continue;
        }
        seen.push((r.group, r.version));
        let gv = json!({"groupVersion": r.api_version(), "version": r.version});
        groups.push(json!({
            "name": r.group,
            "versions": [gv.clone()],
            "preferredVersion": gv
        }));
    }
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `GET /api/v1` or `/apis/{group}/{version}`; `None` when the group version is not served.
pub fn api_resource_list(
    resources: &[&'static ResourceInfo],
    group: &str,
    version: &str,
) -> Option<Value> {
    let list: Vec<Value> = resources
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .map(|r| {
            json!({
                "name": r.plural,
                "singularName": r.kind.to_lowercase(),
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": r.verbs,
            })
        })
        .collect();
    if list.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": list
    }))
}

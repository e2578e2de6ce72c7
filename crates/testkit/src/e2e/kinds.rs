//! The configured workload kinds of the scenarios (`tests/data/crds/kinds.json`): the stand-in
//! runs confighash with them, its RBAC and webhook rules as the chart's `workloadKinds` makes
//! them; the real tier installs the chart with the same file. Their CRDs are beside it.

use std::sync::LazyLock;

use confighash::core::workload::{Kinds, WorkloadKind};
use serde::Deserialize;
use serde_json::{Value, json};

/// One item of the chart's `workloadKinds`.
#[derive(Debug, Clone, Deserialize)]
pub struct TestKind {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub resource: String,
    pub template: String,
}

impl TestKind {
    /// Its `--workload-kind` value.
    pub fn flag(&self) -> String {
        format!(
            "{}/{}/{}={}",
            self.group, self.version, self.kind, self.template
        )
    }

    /// As confighash configures it.
    pub fn workload_kind(&self) -> WorkloadKind {
        WorkloadKind::parse(&self.flag()).expect("tests/data/crds/kinds.json holds valid kinds")
    }

    pub fn api_version(&self) -> String {
        format!("{}/{}", self.group, self.version)
    }

    /// Its CRD (`tests/data/crds/<resource>.yaml`).
    pub fn crd(&self) -> Value {
        let path = format!("{}/tests/data/crds/{}.yaml", crate::ROOT, self.resource);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// The API resource, with the CRD's plural.
    pub fn api_resource(&self) -> kube::api::ApiResource {
        kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk(&self.group, &self.version, &self.kind),
            &self.resource,
        )
    }
}

/// Every configured kind of the scenarios.
pub fn test_kinds() -> &'static [TestKind] {
    static KINDS: LazyLock<Vec<TestKind>> = LazyLock::new(|| {
        serde_json::from_str(include_str!("../../../../tests/data/crds/kinds.json"))
            .expect("tests/data/crds/kinds.json")
    });
    &KINDS
}

/// The scenarios' kind named `kind` (`CloneSet`).
pub fn test_kind(kind: &str) -> &'static TestKind {
    test_kinds()
        .iter()
        .find(|k| k.kind == kind)
        .unwrap_or_else(|| panic!("no kind {kind} in tests/data/crds/kinds.json"))
}

/// The built-in kinds and the scenarios' configured kinds.
pub fn kinds() -> Kinds {
    Kinds::with_configured(test_kinds().iter().map(TestKind::workload_kind))
        .expect("the configured kinds go together")
}

/// What the chart's `workloadKinds` adds to confighash's ClusterRole, as its own ClusterRole and
/// binding for the ServiceAccount `confighash/confighash`.
pub fn rbac_yaml() -> String {
    let rules: Vec<Value> = test_kinds()
        .iter()
        .map(|k| {
            json!({"apiGroups": [k.group], "resources": [k.resource],
                   "verbs": ["get", "list", "watch", "patch"]})
        })
        .collect();
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "confighash-workload-kinds"},
        "rules": rules,
    });
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "confighash-workload-kinds"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "confighash-workload-kinds"},
        "subjects": [{"kind": "ServiceAccount", "name": "confighash", "namespace": "confighash"}],
    });
    format!("---\n{role}\n---\n{binding}\n")
}

/// The webhook rules the chart's `workloadKinds` adds to both entries.
pub fn webhook_rules() -> Vec<Value> {
    test_kinds()
        .iter()
        .map(|k| {
            json!({"apiGroups": [k.group], "apiVersions": [k.version],
                   "operations": ["CREATE", "UPDATE"], "resources": [k.resource],
                   "scope": "Namespaced"})
        })
        .collect()
}

//! Whether a MutatingWebhookConfiguration sends a workload to the webhook: each entry's
//! `namespaceSelector`, `objectSelector` and `rules`, evaluated as the API server evaluates them
//! for a CREATE and an UPDATE of the workload.
//!
//! Pure: the configuration and the labels are given. `matchConditions` (CEL) are not evaluated;
//! an entry that has them says so.

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::Serialize;

use crate::core::workload::WorkloadKind;

/// The label the API server sets on every Namespace, holding its name.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// The operations whose admission stamps a workload: CREATE stamps it, UPDATE (every touch of the
/// watcher is one) re-stamps it.
pub const OPERATIONS: [&str; 2] = ["CREATE", "UPDATE"];

/// The resource (plural) of a workload kind as kube names it from the kind (`deployments`); a
/// configured kind's CRD may name it otherwise, which discovery says
/// ([`ClusterReader::resource`](super::fetch::ClusterReader::resource)).
pub fn plural(kind: WorkloadKind) -> String {
    kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
        kind.group(),
        kind.version(),
        kind.kind(),
    ))
    .plural
}

/// What an entry's selectors are evaluated against.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    pub kind: WorkloadKind,
    /// The kind's resource (plural) as the cluster serves it.
    pub resource: &'a str,
    /// The Namespace's labels (with [`NAMESPACE_NAME_LABEL`]); `None` when they could not be read.
    pub namespace_labels: Option<&'a BTreeMap<String, String>>,
    /// The workload's labels.
    pub object_labels: &'a BTreeMap<String, String>,
}

/// How one webhook entry treats the workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EntryMatch {
    /// The entry's name (`stamp.confighash.dev` in the installed configurations).
    pub name: String,
    /// Whether its namespaceSelector selects the namespace (`null`: the namespace's labels could
    /// not be read).
    pub namespace_selected: Option<bool>,
    /// Whether its objectSelector selects the workload's labels.
    pub object_selected: bool,
    /// Which of CREATE and UPDATE of this kind its rules cover.
    pub operations: Vec<String>,
    /// Whether the entry sends both CREATE and UPDATE of this workload to the webhook (`null`:
    /// not known, see `namespaceSelected`).
    pub selected: Option<bool>,
    /// Anything else worth knowing about the entry.
    pub notes: Vec<String>,
}

/// Evaluates every entry of `configuration` for `subject`.
pub fn entries(
    configuration: &MutatingWebhookConfiguration,
    subject: Subject<'_>,
) -> Vec<EntryMatch> {
    configuration
        .webhooks
        .iter()
        .flatten()
        .map(|w| entry(w, subject))
        .collect()
}

/// The namespaces of least-privilege mode (`--watch-namespaces`), as the chart writes them into
/// every entry's namespaceSelector: a `kubernetes.io/metadata.name In (...)` expression shared by
/// all entries. `None`: some entry has no such expression (cluster-wide mode).
pub fn watch_namespaces(configuration: &MutatingWebhookConfiguration) -> Option<Vec<String>> {
    let mut lists = configuration.webhooks.iter().flatten().map(|w| {
        w.namespace_selector
            .as_ref()?
            .match_expressions
            .iter()
            .flatten()
            .find(|e| e.key == NAMESPACE_NAME_LABEL && e.operator == "In")
            .and_then(|e| e.values.clone())
    });
    let first = lists.next()??;
    lists.all(|l| l.as_ref() == Some(&first)).then_some(first)
}

/// Whether some entry selects the workload: `Some(true)` if one does, `Some(false)` if none can,
/// `None` if that turns on labels that could not be read.
pub fn selected(entries: &[EntryMatch]) -> Option<bool> {
    if entries.iter().any(|e| e.selected == Some(true)) {
        Some(true)
    } else if entries.iter().all(|e| e.selected == Some(false)) {
        Some(false)
    } else {
        None
    }
}

fn entry(webhook: &MutatingWebhook, subject: Subject<'_>) -> EntryMatch {
    let mut notes = Vec::new();
    let mut selector =
        |what: &str, selector: Option<&LabelSelector>, labels| match matches(selector, labels) {
            Ok(m) => m,
            Err(e) => {
                notes.push(format!("its {what} is not valid ({e}) and selects nothing"));
                false
            }
        };
    let namespace_selected = subject.namespace_labels.map(|labels| {
        selector(
            "namespaceSelector",
            webhook.namespace_selector.as_ref(),
            labels,
        )
    });
    let object_selected = selector(
        "objectSelector",
        webhook.object_selector.as_ref(),
        subject.object_labels,
    );
    let (version, resource) = (subject.kind.version(), subject.resource);
    let exact = webhook.match_policy.as_deref() == Some("Exact");
    let mut operations = Vec::new();
    let mut by_equivalence = false;
    for op in OPERATIONS {
        let rules = webhook.rules.iter().flatten();
        let covered = rules
            .clone()
            .any(|r| covers(r, subject.kind.group(), Some(version), resource, op));
        let equivalent = !covered
            && !exact
            && rules
                .clone()
                .any(|r| covers(r, subject.kind.group(), None, resource, op));
        by_equivalence |= equivalent;
        if covered || equivalent {
            operations.push(op.to_owned());
        }
    }
    if by_equivalence {
        notes.push(format!(
            "its rules name another version of {resource}; matchPolicy Equivalent sends {version} \
             requests when the API server serves that version too"
        ));
    }
    if webhook
        .match_conditions
        .as_ref()
        .is_some_and(|c| !c.is_empty())
    {
        notes.push("it has matchConditions, which are not evaluated here".to_owned());
    }
    let no_ca = webhook.client_config.service.is_some()
        && webhook
            .client_config
            .ca_bundle
            .as_ref()
            .is_none_or(|b| b.0.is_empty());
    if no_ca {
        notes.push(
            "its caBundle is empty: the API server cannot verify the webhook's certificate, and \
             calls fail (then failurePolicy applies)"
                .to_owned(),
        );
    }
    let all_operations = operations.len() == OPERATIONS.len();
    let selected = match namespace_selected {
        Some(ns) => Some(ns && object_selected && all_operations),
        None if !object_selected || !all_operations => Some(false),
        None => None,
    };
    EntryMatch {
        name: webhook.name.clone(),
        namespace_selected,
        object_selected,
        operations,
        selected,
        notes,
    }
}

/// Whether `rule` covers `operation` on the main resource `resource` of `group` (and `version`,
/// when given) in a namespace.
fn covers(
    rule: &RuleWithOperations,
    group: &str,
    version: Option<&str>,
    resource: &str,
    operation: &str,
) -> bool {
    let has = |list: &Option<Vec<String>>, value: &str| {
        list.iter().flatten().any(|v| v == "*" || v == value)
    };
    // `*` is every resource, `*/*` every resource and subresource; `deployments/*` is only the
    // subresources of deployments.
    let resources = rule
        .resources
        .iter()
        .flatten()
        .any(|r| r == resource || r == "*" || r == "*/*");
    let scope = matches!(rule.scope.as_deref(), None | Some("*") | Some("Namespaced"));
    has(&rule.api_groups, group)
        && version.is_none_or(|v| has(&rule.api_versions, v))
        && has(&rule.operations, operation)
        && resources
        && scope
}

/// Whether `selector` selects `labels`, as `metav1.LabelSelectorAsSelector` does: an absent or
/// empty selector selects everything; every `matchLabels` pair and every expression must hold.
pub fn matches(
    selector: Option<&LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> Result<bool, String> {
    let Some(selector) = selector else {
        return Ok(true);
    };
    let mut all = true;
    for (k, v) in selector.match_labels.iter().flatten() {
        all &= labels.get(k) == Some(v);
    }
    for e in selector.match_expressions.iter().flatten() {
        let values = e.values.as_deref().unwrap_or_default();
        let value = labels.get(&e.key);
        let holds = match e.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => {
                return Err(format!(
                    "operator {} of key {:?} needs values",
                    e.operator, e.key
                ));
            }
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(format!(
                    "operator {} of key {:?} takes no values",
                    e.operator, e.key
                ));
            }
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            other => return Err(format!("unknown operator {other:?} of key {:?}", e.key)),
        };
        all &= holds;
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn selector(v: serde_json::Value) -> LabelSelector {
        serde_json::from_value(v).unwrap()
    }

    /// deploy/'s configuration.
    fn installed() -> MutatingWebhookConfiguration {
        serde_json::from_value(json!({
            "metadata": {"name": "confighash"},
            "webhooks": [{
                "name": "stamp.confighash.dev",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "clientConfig": {"service": {"name": "confighash", "namespace": "confighash"}, "caBundle": "Y2E="},
                "rules": [
                    {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                     "resources": ["deployments", "statefulsets", "daemonsets"], "scope": "Namespaced"},
                    {"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                     "resources": ["cronjobs"], "scope": "Namespaced"},
                    {"apiGroups": ["argoproj.io"], "apiVersions": ["v1alpha1"], "operations": ["CREATE", "UPDATE"],
                     "resources": ["rollouts"], "scope": "Namespaced"}
                ],
                "matchPolicy": "Equivalent",
                "namespaceSelector": {
                    "matchLabels": {"confighash.dev/enabled": "true"},
                    "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["confighash", "kube-system"]}]
                },
                "objectSelector": {"matchExpressions": [{"key": "confighash.dev/enabled", "operator": "NotIn", "values": ["false"]}]}
            }]
        }))
        .unwrap()
    }

    fn evaluate(
        configuration: &MutatingWebhookConfiguration,
        kind: WorkloadKind,
        ns: Option<&BTreeMap<String, String>>,
        object: &BTreeMap<String, String>,
    ) -> Vec<EntryMatch> {
        entries(
            configuration,
            Subject {
                kind,
                resource: &plural(kind),
                namespace_labels: ns,
                object_labels: object,
            },
        )
    }

    #[test]
    fn the_installed_configuration_selects_opted_in_namespaces_and_every_kind() {
        let config = installed();
        let ns = labels(&[
            ("confighash.dev/enabled", "true"),
            (NAMESPACE_NAME_LABEL, "shop"),
        ]);
        for kind in WorkloadKind::BUILT_IN {
            let found = evaluate(&config, kind, Some(&ns), &labels(&[("app", "web")]));
            assert_eq!(found.len(), 1);
            assert_eq!(found[0].selected, Some(true), "{kind}: {found:?}");
            assert_eq!(found[0].operations, ["CREATE", "UPDATE"]);
            assert!(found[0].notes.is_empty(), "{:?}", found[0].notes);
            assert_eq!(selected(&found), Some(true));
        }
    }

    #[test]
    fn namespaces_not_opted_in_or_excluded_by_name_are_not_selected() {
        let config = installed();
        let object = labels(&[]);
        for ns in [
            labels(&[(NAMESPACE_NAME_LABEL, "shop")]),
            labels(&[
                ("confighash.dev/enabled", "yes"),
                (NAMESPACE_NAME_LABEL, "shop"),
            ]),
            labels(&[
                ("confighash.dev/enabled", "true"),
                (NAMESPACE_NAME_LABEL, "kube-system"),
            ]),
        ] {
            let found = evaluate(&config, WorkloadKind::DEPLOYMENT, Some(&ns), &object);
            assert_eq!(found[0].namespace_selected, Some(false), "{ns:?}");
            assert_eq!(selected(&found), Some(false));
        }
    }

    #[test]
    fn an_opted_out_workload_is_not_selected_whatever_the_namespace() {
        let config = installed();
        let out = labels(&[("confighash.dev/enabled", "false")]);
        let ns = labels(&[("confighash.dev/enabled", "true")]);
        let found = evaluate(&config, WorkloadKind::STATEFUL_SET, Some(&ns), &out);
        assert!(!found[0].object_selected);
        assert_eq!(selected(&found), Some(false));
        // Unknown namespace labels do not matter then.
        let found = evaluate(&config, WorkloadKind::STATEFUL_SET, None, &out);
        assert_eq!(found[0].namespace_selected, None);
        assert_eq!(selected(&found), Some(false));
        // But they do for a workload the objectSelector selects.
        let found = evaluate(&config, WorkloadKind::STATEFUL_SET, None, &labels(&[]));
        assert_eq!(selected(&found), None);
    }

    #[test]
    fn rules_must_cover_create_and_update_of_the_main_resource() {
        let mut config = installed();
        let ns = labels(&[("confighash.dev/enabled", "true")]);
        let webhook = &mut config.webhooks.as_mut().unwrap()[0];
        webhook.rules = Some(vec![
            serde_json::from_value(json!({"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["deployments"]})).unwrap(),
            serde_json::from_value(json!({"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["deployments/*"]})).unwrap(),
            serde_json::from_value(json!({"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["*"], "resources": ["*/*"], "scope": "Cluster"})).unwrap(),
        ]);
        let found = evaluate(&config, WorkloadKind::DEPLOYMENT, Some(&ns), &labels(&[]));
        assert_eq!(found[0].operations, ["CREATE"]);
        assert_eq!(found[0].selected, Some(false));
        let found = evaluate(&config, WorkloadKind::CRON_JOB, Some(&ns), &labels(&[]));
        assert!(found[0].operations.is_empty());

        let webhook = &mut config.webhooks.as_mut().unwrap()[0];
        webhook.rules = Some(vec![serde_json::from_value(json!({"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["*"], "resources": ["*"]})).unwrap()]);
        let found = evaluate(&config, WorkloadKind::ROLLOUT, Some(&ns), &labels(&[]));
        assert_eq!(found[0].selected, Some(true));

        // Another version counts under Equivalent (the default), not under Exact.
        let webhook = &mut config.webhooks.as_mut().unwrap()[0];
        webhook.rules = Some(vec![serde_json::from_value(json!({"apiGroups": ["apps"], "apiVersions": ["v1beta2"], "operations": ["CREATE", "UPDATE"], "resources": ["deployments"]})).unwrap()]);
        webhook.match_policy = None;
        let found = evaluate(&config, WorkloadKind::DEPLOYMENT, Some(&ns), &labels(&[]));
        assert_eq!(found[0].selected, Some(true));
        assert!(
            found[0].notes[0].contains("Equivalent"),
            "{:?}",
            found[0].notes
        );
        config.webhooks.as_mut().unwrap()[0].match_policy = Some("Exact".into());
        let found = evaluate(&config, WorkloadKind::DEPLOYMENT, Some(&ns), &labels(&[]));
        assert_eq!(found[0].selected, Some(false));
    }

    #[test]
    fn no_entries_select_nothing_and_one_selecting_entry_is_enough() {
        let mut config = installed();
        let ns = labels(&[("confighash.dev/enabled", "true")]);
        let mut other = config.webhooks.as_ref().unwrap()[0].clone();
        other.name = "other.example.com".into();
        other.object_selector = Some(selector(json!({"matchLabels": {"team": "a"}})));
        config.webhooks.as_mut().unwrap().insert(0, other);
        let found = evaluate(&config, WorkloadKind::DEPLOYMENT, Some(&ns), &labels(&[]));
        assert_eq!(found[0].selected, Some(false));
        assert_eq!(found[1].selected, Some(true));
        assert_eq!(selected(&found), Some(true));

        config.webhooks = None;
        assert!(evaluate(&config, WorkloadKind::DEPLOYMENT, Some(&ns), &labels(&[])).is_empty());
        assert_eq!(selected(&[]), Some(false));
    }

    #[test]
    fn selector_operators() {
        let l = labels(&[("a", "1"), ("b", "2")]);
        let check = |v| matches(Some(&selector(v)), &l);
        assert_eq!(matches(None, &l), Ok(true));
        assert_eq!(check(json!({})), Ok(true));
        assert_eq!(
            check(json!({"matchLabels": {"a": "1", "b": "2"}})),
            Ok(true)
        );
        assert_eq!(check(json!({"matchLabels": {"a": "2"}})), Ok(false));
        let expr = |op: &str, key: &str, values: &[&str]| {
            check(json!({"matchExpressions": [{"key": key, "operator": op, "values": values}]}))
        };
        assert_eq!(expr("In", "a", &["0", "1"]), Ok(true));
        assert_eq!(expr("In", "c", &["1"]), Ok(false));
        assert_eq!(expr("NotIn", "a", &["1"]), Ok(false));
        assert_eq!(expr("NotIn", "c", &["1"]), Ok(true));
        assert_eq!(expr("Exists", "b", &[]), Ok(true));
        assert_eq!(expr("Exists", "c", &[]), Ok(false));
        assert_eq!(expr("DoesNotExist", "c", &[]), Ok(true));
        assert_eq!(expr("DoesNotExist", "a", &[]), Ok(false));
        assert!(
            expr("Gt", "a", &["0"])
                .unwrap_err()
                .contains("unknown operator")
        );
        assert!(expr("In", "a", &[]).is_err());
        assert!(expr("Exists", "a", &["1"]).is_err());
    }

    #[test]
    fn an_invalid_selector_selects_nothing_and_says_why() {
        let mut config = installed();
        config.webhooks.as_mut().unwrap()[0].object_selector = Some(selector(
            json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}),
        ));
        let ns = labels(&[("confighash.dev/enabled", "true")]);
        let found = evaluate(&config, WorkloadKind::DEPLOYMENT, Some(&ns), &labels(&[]));
        assert_eq!(found[0].selected, Some(false));
        assert!(
            found[0].notes[0].contains("objectSelector is not valid"),
            "{:?}",
            found[0].notes
        );
    }

    #[test]
    fn an_empty_ca_bundle_is_noted() {
        let mut config = installed();
        config.webhooks.as_mut().unwrap()[0].client_config.ca_bundle = None;
        let ns = labels(&[("confighash.dev/enabled", "true")]);
        let found = evaluate(&config, WorkloadKind::DEPLOYMENT, Some(&ns), &labels(&[]));
        assert!(
            found[0].notes[0].contains("caBundle is empty"),
            "{:?}",
            found[0].notes
        );
    }
}

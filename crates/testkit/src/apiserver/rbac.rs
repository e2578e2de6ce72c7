//! Authorization: an RBAC authorizer.
//!
//! Mimics kube-apiserver's RBAC authorizer (k8s.io/kubernetes/plugin/pkg/auth/authorizer/rbac)
//! behind the `system:masters` privileged-group authorizer: a request is allowed when some rule of
//! a role bound to the user allows it, and denied otherwise. ClusterRoleBindings grant their
//! ClusterRole everywhere; RoleBindings grant a Role of their namespace, or a ClusterRole, within
//! their namespace only. The bootstrap roles every authenticated user has (`system:discovery`,
//! `system:public-info-viewer`, `system:basic-user`) are built in.
//!
//! The objects are checked as kube-apiserver's validation of rbac.authorization.k8s.io/v1 would
//! (after its defaulting), so a fixture that a real cluster would refuse is refused here too.
//! A ClusterRole's `aggregationRule` is ignored: nothing runs the aggregation controller, so such a
//! role grants just the `rules` it is given.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::apiserver::selectors::is_dns1123_subdomain;
use crate::apiserver::user::UserInfo;

const GROUP: &str = "rbac.authorization.k8s.io";
const API_VERSION: &str = "rbac.authorization.k8s.io/v1";

/// What a request asks to do, as kube-apiserver's `authorizer.Attributes` (filled from its
/// RequestInfo) describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestAttributes<'a> {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`; for
    /// non-resource requests the lowercase HTTP method.
    pub verb: &'a str,
    /// "" for the core group.
    pub api_group: &'a str,
    /// The plural resource, e.g. `configmaps`.
    pub resource: &'a str,
    /// e.g. `status`, or "".
    pub subresource: &'a str,
    /// None (or "") for cluster-scoped requests.
    pub namespace: Option<&'a str>,
    /// The object's name, if the request carries one: not for create, list or deletecollection,
    /// except that list and watch with a `metadata.name=X` field selector carry X.
    pub name: Option<&'a str>,
    /// The URL path, matched against `nonResourceURLs` for non-resource requests.
    pub path: &'a str,
    /// Whether this is a request for an API resource (rather than e.g. `/version`).
    pub resource_request: bool,
}

/// One `PolicyRule`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct PolicyRule {
    verbs: Vec<String>,
    api_groups: Vec<String>,
    resources: Vec<String>,
    resource_names: Vec<String>,
    non_resource_urls: Vec<String>,
}

impl PolicyRule {
    /// Mimics `rbac.RuleAllows` and the matchers of `rbacv1helpers`.
    fn allows(&self, attrs: &RequestAttributes) -> bool {
        if !self.verbs.iter().any(|v| v == "*" || v == attrs.verb) {
            return false;
        }
        if !attrs.resource_request {
            // `NonResourceURLMatches`: "*" matches all; a trailing "*" matches by prefix.
            return self.non_resource_urls.iter().any(|url| {
                url == "*"
                    || url == attrs.path
                    || (url.ends_with('*') && attrs.path.starts_with(url.trim_end_matches('*')))
            });
        }
        let group_matches = self
            .api_groups
            .iter()
            .any(|g| g == "*" || g == attrs.api_group);
        let combined = if attrs.subresource.is_empty() {
            attrs.resource.to_owned()
        } else {
            format!("{}/{}", attrs.resource, attrs.subresource)
        };
        // `ResourceMatches`: "*" matches every resource and subresource; "*/sub" matches the
        // subresource `sub` of every resource.
        let resource_matches = self.resources.iter().any(|r| {
            r == "*"
                || *r == combined
                || (!attrs.subresource.is_empty()
                    && r.strip_prefix("*/") == Some(attrs.subresource))
        });
        // `ResourceNameMatches`: a rule with resourceNames needs the request's name among them;
        // a request without a name (create, list, deletecollection) has name "" in Kubernetes.
        let requested_name = attrs.name.unwrap_or("");
        let name_matches = self.resource_names.is_empty()
            || self.resource_names.iter().any(|n| n == requested_name);
        group_matches && resource_matches && name_matches
    }
}

/// One binding subject, after the defaulting and validation kube-apiserver applies.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Subject {
    User(String),
    Group(String),
    /// An empty namespace (allowed in RoleBindings only) means the binding's namespace.
    ServiceAccount {
        namespace: String,
        name: String,
    },
}

/// Whether the user is in the group. Mimics kube-apiserver's `AuthenticatedGroupAdder`: every
/// authenticated user is in `system:authenticated`, listed or not; only the anonymous user is not.
fn in_group(user: &UserInfo, group: &str) -> bool {
    if user.groups.iter().any(|g| g == group) {
        return true;
    }
    let anonymous = user.username == "system:anonymous"
        || user.groups.iter().any(|g| g == "system:unauthenticated");
    group == "system:authenticated" && !anonymous
}

impl Subject {
    /// Mimics `appliesToUser`; `namespace` is the binding's ("" for ClusterRoleBindings).
    fn applies_to(&self, user: &UserInfo, namespace: &str) -> bool {
        match self {
            Subject::User(name) => user.username == *name,
            Subject::Group(name) => in_group(user, name),
            Subject::ServiceAccount {
                namespace: sa_namespace,
                name,
            } => {
                let sa_namespace = if sa_namespace.is_empty() {
                    namespace
                } else {
                    sa_namespace
                };
                !sa_namespace.is_empty()
                    && user.username == format!("system:serviceaccount:{sa_namespace}:{name}")
            }
        }
    }
}

/// A binding's `roleRef`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RoleRef {
    ClusterRole(String),
    /// A Role in the binding's namespace.
    Role(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Binding {
    role_ref: RoleRef,
    subjects: Vec<Subject>,
}

/// Decides whether a user may make a request, from the RBAC objects it was given.
#[derive(Debug, Clone)]
pub struct Authorizer {
    cluster_roles: BTreeMap<String, Vec<PolicyRule>>,
    /// Keyed by (namespace, name).
    roles: BTreeMap<(String, String), Vec<PolicyRule>>,
    cluster_role_bindings: BTreeMap<String, Binding>,
    /// Keyed by (namespace, name).
    role_bindings: BTreeMap<(String, String), Binding>,
}

impl Default for Authorizer {
    fn default() -> Self {
        Self::new()
    }
}

/// The bootstrap roles and bindings (plugin/pkg/auth/authorizer/rbac/bootstrappolicy) that
/// concern every user, as kube-apiserver creates them at startup.
fn bootstrap_objects() -> Vec<Value> {
    let cluster_role = |name: &str, rules: Value| {
        json!({
            "apiVersion": API_VERSION,
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": rules,
        })
    };
    let binding = |name: &str, groups: &[&str]| {
        let subjects: Vec<Value> = groups
            .iter()
            .map(|g| json!({"apiGroup": GROUP, "kind": "Group", "name": g}))
            .collect();
        json!({
            "apiVersion": API_VERSION,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": name},
            "subjects": subjects,
        })
    };
    vec![
        cluster_role(
            "system:discovery",
            json!([{
                "verbs": ["get"],
                "nonResourceURLs": [
                    "/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi",
                    "/openapi/*", "/readyz", "/version", "/version/",
                ],
            }]),
        ),
        binding("system:discovery", &["system:authenticated"]),
        cluster_role(
            "system:public-info-viewer",
            json!([{
                "verbs": ["get"],
                "nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"],
            }]),
        ),
        binding(
            "system:public-info-viewer",
            &["system:authenticated", "system:unauthenticated"],
        ),
        cluster_role(
            "system:basic-user",
            json!([
                {
                    "verbs": ["create"],
                    "apiGroups": ["authorization.k8s.io"],
                    "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                },
                {
                    "verbs": ["create"],
                    "apiGroups": ["authentication.k8s.io"],
                    "resources": ["selfsubjectreviews"],
                },
            ]),
        ),
        binding("system:basic-user", &["system:authenticated"]),
    ]
}

impl Authorizer {
    /// An authorizer with only the bootstrap roles every authenticated user has.
    pub fn new() -> Self {
        let mut authorizer = Authorizer {
            cluster_roles: BTreeMap::new(),
            roles: BTreeMap::new(),
            cluster_role_bindings: BTreeMap::new(),
            role_bindings: BTreeMap::new(),
        };
        for obj in bootstrap_objects() {
            authorizer
                .insert(&obj)
                .expect("the bootstrap RBAC objects are valid");
        }
        authorizer
    }

    /// The bootstrap roles plus the given ClusterRoles, ClusterRoleBindings, Roles and
    /// RoleBindings (rbac.authorization.k8s.io/v1); objects of other groups are ignored, and
    /// `List` objects contribute their items. A later object with the same kind, namespace and
    /// name replaces an earlier one (as applying it would), bootstrap ones included.
    pub fn from_objects(objs: &[Value]) -> Result<Self, String> {
        let mut authorizer = Self::new();
        for (i, obj) in objs.iter().enumerate() {
            authorizer
                .insert(obj)
                .map_err(|e| format!("object {}: {e}", i + 1))?;
        }
        Ok(authorizer)
    }

    /// Like [`Authorizer::from_objects`], from multi-document YAML: documents are separated by
    /// lines that are `---` (optionally followed by a comment); empty documents are skipped.
    pub fn from_yaml(text: &str) -> Result<Self, String> {
        let mut objects = Vec::new();
        for (i, doc) in split_yaml_documents(text).iter().enumerate() {
            let blank = doc.lines().all(|line| {
                let line = line.trim();
                line.is_empty() || line.starts_with('#')
            });
            if blank {
                continue;
            }
            let value: Value =
                serde_saphyr::from_str(doc).map_err(|e| format!("YAML document {}: {e}", i + 1))?;
            if !value.is_null() {
                objects.push(value);
            }
        }
        Self::from_objects(&objects)
    }

    /// Adds (or replaces) one RBAC object; see [`Authorizer::from_objects`].
    pub fn insert(&mut self, obj: &Value) -> Result<(), String> {
        let Value::Object(map) = obj else {
            return Err(format!("expected an object, got {obj}"));
        };
        let api_version = required_string(map, "apiVersion", "")?;
        let kind = required_string(map, "kind", "")?;
        if kind.ends_with("List")
            && let Some(items) = map.get("items")
        {
            let Value::Array(items) = items else {
                return Err(format!("{kind}: items must be a list"));
            };
            for (i, item) in items.iter().enumerate() {
                self.insert(item)
                    .map_err(|e| format!("{kind} items[{i}]: {e}"))?;
            }
            return Ok(());
        }
        let Some(version) = api_version
            .strip_prefix(GROUP)
            .and_then(|v| v.strip_prefix('/'))
        else {
            return Ok(()); // Not RBAC.
        };
        if version != "v1" {
            return Err(format!(
                "no matches for kind {kind:?} in version {api_version:?}"
            ));
        }
        let metadata = match map.get("metadata") {
            Some(Value::Object(metadata)) => metadata,
            _ => return Err(format!("{kind}: metadata.name: Required value")),
        };
        let name = match metadata.get("name") {
            Some(Value::String(name)) if !name.is_empty() => name.clone(),
            None | Some(Value::Null) | Some(Value::String(_)) => {
                return Err(format!("{kind}: metadata.name: Required value"));
            }
            Some(other) => {
                return Err(format!(
                    "{kind}: metadata.name must be a string, got {other}"
                ));
            }
        };
        // A namespaced object without a namespace lands in "default", as `kubectl apply` with the
        // default context would put it; cluster-scoped objects drop theirs, as kube-apiserver does.
        let namespace = match metadata.get("namespace") {
            None | Some(Value::Null) => "default".to_owned(),
            Some(Value::String(ns)) if ns.is_empty() => "default".to_owned(),
            Some(Value::String(ns)) => ns.clone(),
            Some(other) => {
                return Err(format!(
                    "{kind} {name:?}: metadata.namespace must be a string, got {other}"
                ));
            }
        };
        let context = |e: String| format!("{kind} {name:?}: {e}");
        match kind.as_str() {
            "ClusterRole" => {
                let rules = parse_rules(map, false).map_err(context)?;
                self.cluster_roles.insert(name, rules);
            }
            "Role" => {
                let rules = parse_rules(map, true).map_err(context)?;
                self.roles.insert((namespace, name), rules);
            }
            "ClusterRoleBinding" => {
                let binding = parse_binding(map, false).map_err(context)?;
                self.cluster_role_bindings.insert(name, binding);
            }
            "RoleBinding" => {
                let binding = parse_binding(map, true).map_err(context)?;
                self.role_bindings.insert((namespace, name), binding);
            }
            other => {
                return Err(format!(
                    "no matches for kind {other:?} in version {api_version:?}"
                ));
            }
        }
        Ok(())
    }

    /// Whether `user` may make the request. Mimics kube-apiserver's authorizer chain: members of
    /// `system:masters` may do anything; otherwise the RBAC authorizer's `VisitRulesFor` walks
    /// the ClusterRoleBindings and, for namespaced resource requests, the RoleBindings of the
    /// request's namespace. Bindings to roles that do not exist grant nothing.
    pub fn allows(&self, user: &UserInfo, attrs: &RequestAttributes) -> bool {
        if user.is_superuser() {
            return true;
        }
        let any_rule = |rules: Option<&Vec<PolicyRule>>| {
            rules.is_some_and(|rules| rules.iter().any(|rule| rule.allows(attrs)))
        };
        let cluster_wide = self.cluster_role_bindings.values().any(|binding| {
            binding.subjects.iter().any(|s| s.applies_to(user, ""))
                && match &binding.role_ref {
                    RoleRef::ClusterRole(role) => any_rule(self.cluster_roles.get(role)),
                    // Validation refuses these.
                    RoleRef::Role(_) => false,
                }
        });
        if cluster_wide {
            return true;
        }
        // Non-resource requests have no namespace.
        let namespace = match attrs.namespace {
            Some(ns) if attrs.resource_request && !ns.is_empty() => ns,
            _ => return false,
        };
        self.role_bindings
            .iter()
            .filter(|((binding_namespace, _), _)| binding_namespace == namespace)
            .any(|(_, binding)| {
                binding
                    .subjects
                    .iter()
                    .any(|s| s.applies_to(user, namespace))
                    && match &binding.role_ref {
                        RoleRef::ClusterRole(role) => any_rule(self.cluster_roles.get(role)),
                        RoleRef::Role(role) => {
                            any_rule(self.roles.get(&(namespace.to_owned(), role.clone())))
                        }
                    }
            })
    }
}

/// Splits at lines that are `---`, possibly followed by whitespace and a comment.
fn split_yaml_documents(text: &str) -> Vec<String> {
    let mut docs = vec![String::new()];
    for line in text.lines() {
        let separator = line.strip_prefix("---").is_some_and(|rest| {
            let trimmed = rest.trim_start();
            trimmed.is_empty() || (trimmed.len() < rest.len() && trimmed.starts_with('#'))
        });
        if separator {
            docs.push(String::new());
        } else if let Some(doc) = docs.last_mut() {
            doc.push_str(line);
            doc.push('\n');
        }
    }
    docs
}

/// `context` prefixes the error message, if not empty.
fn required_string(map: &Map<String, Value>, field: &str, context: &str) -> Result<String, String> {
    let error = match map.get(field) {
        Some(Value::String(s)) => return Ok(s.clone()),
        None | Some(Value::Null) => format!("{field}: Required value"),
        Some(other) => format!("{field} must be a string, got {other}"),
    };
    Err(if context.is_empty() {
        error
    } else {
        format!("{context}: {error}")
    })
}

fn optional_string(map: &Map<String, Value>, field: &str, path: &str) -> Result<String, String> {
    match map.get(field) {
        Some(Value::String(s)) => Ok(s.clone()),
        None | Some(Value::Null) => Ok(String::new()),
        Some(other) => Err(format!("{path}.{field} must be a string, got {other}")),
    }
}

fn string_list(map: &Map<String, Value>, field: &str, path: &str) -> Result<Vec<String>, String> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(s) => Ok(s.clone()),
                other => Err(format!("{path}.{field}[{i}] must be a string, got {other}")),
            })
            .collect(),
        Some(other) => Err(format!("{path}.{field} must be a list, got {other}")),
    }
}

/// A role's `rules`, checked as `ValidatePolicyRule` does.
fn parse_rules(role: &Map<String, Value>, namespaced: bool) -> Result<Vec<PolicyRule>, String> {
    let rules = match role.get("rules") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(rules)) => rules,
        Some(other) => return Err(format!("rules must be a list, got {other}")),
    };
    let mut parsed = Vec::with_capacity(rules.len());
    for (i, rule) in rules.iter().enumerate() {
        let path = format!("rules[{i}]");
        let Value::Object(rule) = rule else {
            return Err(format!("{path} must be an object, got {rule}"));
        };
        let rule = PolicyRule {
            verbs: string_list(rule, "verbs", &path)?,
            api_groups: string_list(rule, "apiGroups", &path)?,
            resources: string_list(rule, "resources", &path)?,
            resource_names: string_list(rule, "resourceNames", &path)?,
            non_resource_urls: string_list(rule, "nonResourceURLs", &path)?,
        };
        if rule.verbs.is_empty() {
            return Err(format!(
                "{path}.verbs: Required value: verbs must contain at least one value"
            ));
        }
        if !rule.non_resource_urls.is_empty() {
            if namespaced {
                return Err(format!(
                    "{path}.nonResourceURLs: Invalid value: {:?}: namespaced rules cannot apply \
                     to non-resource URLs",
                    rule.non_resource_urls
                ));
            }
            if !rule.api_groups.is_empty()
                || !rule.resources.is_empty()
                || !rule.resource_names.is_empty()
            {
                return Err(format!(
                    "{path}.nonResourceURLs: Invalid value: {:?}: rules cannot apply to both \
                     regular resources and non-resource URLs",
                    rule.non_resource_urls
                ));
            }
        } else {
            if rule.api_groups.is_empty() {
                return Err(format!(
                    "{path}.apiGroups: Required value: resource rules must supply at least one \
                     api group"
                ));
            }
            if rule.resources.is_empty() {
                return Err(format!(
                    "{path}.resources: Required value: resource rules must supply at least one \
                     resource"
                ));
            }
        }
        parsed.push(rule);
    }
    Ok(parsed)
}

/// A binding's `roleRef` and `subjects`, defaulted and checked as kube-apiserver does
/// (`SetDefaults_Subject`, `ValidateRoleBinding`, `ValidateRoleBindingSubject`).
fn parse_binding(binding: &Map<String, Value>, namespaced: bool) -> Result<Binding, String> {
    let role_ref = match binding.get("roleRef") {
        Some(Value::Object(role_ref)) => role_ref,
        None | Some(Value::Null) => return Err("roleRef: Required value".to_owned()),
        Some(other) => return Err(format!("roleRef must be an object, got {other}")),
    };
    let api_group = optional_string(role_ref, "apiGroup", "roleRef")?;
    if !api_group.is_empty() && api_group != GROUP {
        return Err(format!(
            "roleRef.apiGroup: Unsupported value: {api_group:?}: supported values: {GROUP:?}"
        ));
    }
    let role_name = optional_string(role_ref, "name", "roleRef")?;
    if role_name.is_empty() {
        return Err("roleRef.name: Required value".to_owned());
    }
    let role_kind = optional_string(role_ref, "kind", "roleRef")?;
    let role_ref = match role_kind.as_str() {
        "ClusterRole" => RoleRef::ClusterRole(role_name),
        "Role" if namespaced => RoleRef::Role(role_name),
        _ if namespaced => {
            return Err(format!(
                "roleRef.kind: Unsupported value: {role_kind:?}: supported values: \"Role\", \
                 \"ClusterRole\""
            ));
        }
        _ => {
            return Err(format!(
                "roleRef.kind: Unsupported value: {role_kind:?}: supported values: \
                 \"ClusterRole\""
            ));
        }
    };

    let subjects = match binding.get("subjects") {
        None | Some(Value::Null) => &Vec::new(),
        Some(Value::Array(subjects)) => subjects,
        Some(other) => return Err(format!("subjects must be a list, got {other}")),
    };
    let mut parsed = Vec::with_capacity(subjects.len());
    for (i, subject) in subjects.iter().enumerate() {
        let path = format!("subjects[{i}]");
        let Value::Object(subject) = subject else {
            return Err(format!("{path} must be an object, got {subject}"));
        };
        let kind = optional_string(subject, "kind", &path)?;
        let name = optional_string(subject, "name", &path)?;
        let namespace = optional_string(subject, "namespace", &path)?;
        let api_group = optional_string(subject, "apiGroup", &path)?;
        if name.is_empty() {
            return Err(format!("{path}.name: Required value"));
        }
        let parsed_subject = match kind.as_str() {
            "ServiceAccount" => {
                if !is_dns1123_subdomain(&name) {
                    return Err(format!(
                        "{path}.name: Invalid value: {name:?}: a lowercase RFC 1123 subdomain \
                         must consist of lower case alphanumeric characters, '-' or '.', and \
                         must start and end with an alphanumeric character"
                    ));
                }
                if !api_group.is_empty() {
                    return Err(format!(
                        "{path}.apiGroup: Unsupported value: {api_group:?}: supported values: \
                         \"\""
                    ));
                }
                if !namespaced && namespace.is_empty() {
                    return Err(format!("{path}.namespace: Required value"));
                }
                Subject::ServiceAccount { namespace, name }
            }
            "User" | "Group" => {
                // An omitted apiGroup defaults to rbac.authorization.k8s.io.
                if !api_group.is_empty() && api_group != GROUP {
                    return Err(format!(
                        "{path}.apiGroup: Unsupported value: {api_group:?}: supported values: \
                         {GROUP:?}"
                    ));
                }
                if kind == "User" {
                    Subject::User(name)
                } else {
                    Subject::Group(name)
                }
            }
            other => {
                return Err(format!(
                    "{path}.kind: Unsupported value: {other:?}: supported values: \
                     \"ServiceAccount\", \"User\", \"Group\""
                ));
            }
        };
        parsed.push(parsed_subject);
    }
    Ok(Binding {
        role_ref,
        subjects: parsed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo {
            username: name.to_owned(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        }
    }

    fn resource<'a>(
        verb: &'a str,
        api_group: &'a str,
        resource: &'a str,
        namespace: Option<&'a str>,
        name: Option<&'a str>,
    ) -> RequestAttributes<'a> {
        RequestAttributes {
            verb,
            api_group,
            resource,
            subresource: "",
            namespace,
            name,
            path: "",
            resource_request: true,
        }
    }

    fn non_resource<'a>(verb: &'a str, path: &'a str) -> RequestAttributes<'a> {
        RequestAttributes {
            verb,
            api_group: "",
            resource: "",
            subresource: "",
            namespace: None,
            name: None,
            path,
            resource_request: false,
        }
    }

    /// A ClusterRole with one rule, bound cluster-wide to the user `alice`.
    fn alice_with_rule(rule: Value) -> Authorizer {
        Authorizer::from_objects(&[
            json!({
                "apiVersion": API_VERSION, "kind": "ClusterRole",
                "metadata": {"name": "r"}, "rules": [rule],
            }),
            json!({
                "apiVersion": API_VERSION, "kind": "ClusterRoleBinding",
                "metadata": {"name": "b"},
                "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": "r"},
                "subjects": [{"kind": "User", "name": "alice"}],
            }),
        ])
        .unwrap()
    }

    fn alice() -> UserInfo {
        user("alice", &["system:authenticated"])
    }

    #[test]
    fn verbs_must_match() {
        let authz = alice_with_rule(
            json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}),
        );
        let u = alice();
        assert!(authz.allows(
            &u,
            &resource("get", "", "configmaps", Some("ns"), Some("a"))
        ));
        assert!(authz.allows(&u, &resource("list", "", "configmaps", Some("ns"), None)));
        assert!(!authz.allows(&u, &resource("watch", "", "configmaps", Some("ns"), None)));
        assert!(!authz.allows(
            &u,
            &resource("delete", "", "configmaps", Some("ns"), Some("a"))
        ));
        // Not a different user.
        assert!(!authz.allows(
            &user("bob", &[]),
            &resource("get", "", "configmaps", Some("ns"), Some("a"))
        ));
    }

    #[test]
    fn api_groups_must_match() {
        let authz = alice_with_rule(
            json!({"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"]}),
        );
        let u = alice();
        assert!(authz.allows(
            &u,
            &resource("get", "apps", "deployments", Some("ns"), None)
        ));
        assert!(!authz.allows(&u, &resource("get", "", "deployments", Some("ns"), None)));
        assert!(!authz.allows(
            &u,
            &resource("get", "extensions", "deployments", Some("ns"), None)
        ));
    }

    #[test]
    fn resources_and_subresources_must_match() {
        let authz = alice_with_rule(
            json!({"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["patch"]}),
        );
        let u = alice();
        let mut attrs = resource("patch", "apps", "deployments", Some("ns"), Some("d"));
        assert!(authz.allows(&u, &attrs));
        attrs.subresource = "status";
        assert!(
            !authz.allows(&u, &attrs),
            "subresources need their own rule"
        );
        attrs.resource = "statefulsets";
        attrs.subresource = "";
        assert!(!authz.allows(&u, &attrs));

        let authz = alice_with_rule(
            json!({"apiGroups": ["apps"], "resources": ["deployments/status"], "verbs": ["patch"]}),
        );
        let mut attrs = resource("patch", "apps", "deployments", Some("ns"), Some("d"));
        assert!(!authz.allows(&u, &attrs));
        attrs.subresource = "status";
        assert!(authz.allows(&u, &attrs));
        attrs.subresource = "scale";
        assert!(!authz.allows(&u, &attrs));
    }

    #[test]
    fn wildcards() {
        let authz =
            alice_with_rule(json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}));
        let u = alice();
        let mut attrs = resource("deletecollection", "apps", "deployments", Some("ns"), None);
        assert!(authz.allows(&u, &attrs));
        attrs.subresource = "scale";
        assert!(authz.allows(&u, &attrs), "\"*\" covers subresources");
        assert!(authz.allows(&u, &resource("create", "", "namespaces", None, None)));
        // Resource rules say nothing about non-resource URLs.
        assert!(!authz.allows(&u, &non_resource("get", "/metrics")));

        let authz = alice_with_rule(
            json!({"apiGroups": ["apps"], "resources": ["*/status"], "verbs": ["update"]}),
        );
        let mut attrs = resource("update", "apps", "deployments", Some("ns"), Some("d"));
        assert!(
            !authz.allows(&u, &attrs),
            "\"*/status\" is not the main resource"
        );
        attrs.subresource = "status";
        assert!(authz.allows(&u, &attrs));
        attrs.resource = "statefulsets";
        assert!(authz.allows(&u, &attrs));
        attrs.subresource = "scale";
        assert!(!authz.allows(&u, &attrs));
    }

    #[test]
    fn resource_names_need_a_named_request() {
        let authz = alice_with_rule(json!({
            "apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["cm"],
            "verbs": ["get", "list", "watch", "create", "update", "delete", "deletecollection"],
        }));
        let u = alice();
        let ns = Some("ns");
        assert!(authz.allows(&u, &resource("get", "", "configmaps", ns, Some("cm"))));
        assert!(authz.allows(&u, &resource("update", "", "configmaps", ns, Some("cm"))));
        assert!(authz.allows(&u, &resource("delete", "", "configmaps", ns, Some("cm"))));
        assert!(!authz.allows(&u, &resource("get", "", "configmaps", ns, Some("other"))));
        // Requests without a name never match a rule with resourceNames.
        assert!(!authz.allows(&u, &resource("list", "", "configmaps", ns, None)));
        assert!(!authz.allows(&u, &resource("watch", "", "configmaps", ns, None)));
        assert!(!authz.allows(&u, &resource("create", "", "configmaps", ns, None)));
        assert!(!authz.allows(
            &u,
            &resource("deletecollection", "", "configmaps", ns, None)
        ));
        // ...but list and watch with a `metadata.name=cm` field selector carry the name.
        assert!(authz.allows(&u, &resource("list", "", "configmaps", ns, Some("cm"))));
        assert!(authz.allows(&u, &resource("watch", "", "configmaps", ns, Some("cm"))));
    }

    #[test]
    fn cluster_role_binding_applies_everywhere() {
        let authz =
            alice_with_rule(json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}));
        let u = alice();
        assert!(authz.allows(&u, &resource("get", "", "secrets", Some("a"), Some("s"))));
        assert!(authz.allows(&u, &resource("get", "", "secrets", Some("b"), Some("s"))));
    }

    fn namespaced_fixture() -> Authorizer {
        Authorizer::from_objects(&[
            json!({
                "apiVersion": API_VERSION, "kind": "ClusterRole",
                "metadata": {"name": "cm-reader"},
                "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}],
            }),
            json!({
                "apiVersion": API_VERSION, "kind": "RoleBinding",
                "metadata": {"name": "read-cms", "namespace": "team-a"},
                "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": "cm-reader"},
                "subjects": [{"kind": "User", "apiGroup": GROUP, "name": "alice"}],
            }),
            json!({
                "apiVersion": API_VERSION, "kind": "Role",
                "metadata": {"name": "secret-writer", "namespace": "team-b"},
                "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}],
            }),
            // Refers to a Role of the same name in its own namespace, which does not exist.
            json!({
                "apiVersion": API_VERSION, "kind": "RoleBinding",
                "metadata": {"name": "write-secrets", "namespace": "team-a"},
                "roleRef": {"apiGroup": GROUP, "kind": "Role", "name": "secret-writer"},
                "subjects": [{"kind": "User", "name": "alice"}],
            }),
            json!({
                "apiVersion": API_VERSION, "kind": "RoleBinding",
                "metadata": {"name": "write-secrets", "namespace": "team-b"},
                "roleRef": {"apiGroup": GROUP, "kind": "Role", "name": "secret-writer"},
                "subjects": [{"kind": "User", "name": "bob"}],
            }),
        ])
        .unwrap()
    }

    #[test]
    fn role_binding_to_cluster_role_is_limited_to_its_namespace() {
        let authz = namespaced_fixture();
        let u = alice();
        assert!(authz.allows(
            &u,
            &resource("get", "", "configmaps", Some("team-a"), Some("x"))
        ));
        assert!(!authz.allows(
            &u,
            &resource("get", "", "configmaps", Some("team-b"), Some("x"))
        ));
        assert!(!authz.allows(&u, &resource("get", "", "configmaps", None, Some("x"))));
        assert!(!authz.allows(&u, &resource("get", "", "configmaps", Some(""), Some("x"))));
    }

    #[test]
    fn role_in_another_namespace_does_not_apply() {
        let authz = namespaced_fixture();
        // alice's binding in team-a names a Role that exists only in team-b.
        let u = alice();
        assert!(!authz.allows(&u, &resource("create", "", "secrets", Some("team-a"), None)));
        assert!(!authz.allows(&u, &resource("create", "", "secrets", Some("team-b"), None)));
        // bob's binding in team-b uses the Role of team-b, there only.
        let bob = user("bob", &[]);
        assert!(authz.allows(
            &bob,
            &resource("create", "", "secrets", Some("team-b"), None)
        ));
        assert!(!authz.allows(
            &bob,
            &resource("create", "", "secrets", Some("team-a"), None)
        ));
    }

    #[test]
    fn service_account_subjects() {
        let authz = Authorizer::from_yaml(
            r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: lease-holder}
rules:
- {apiGroups: [coordination.k8s.io], resources: [leases], verbs: ["*"]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: controller}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: lease-holder}
subjects:
- {kind: ServiceAccount, name: controller, namespace: system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: local, namespace: apps}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: lease-holder}
subjects:
# No namespace: the binding's own.
- {kind: ServiceAccount, name: worker}
"#,
        )
        .unwrap();
        fn lease(ns: &str) -> RequestAttributes<'_> {
            resource(
                "update",
                "coordination.k8s.io",
                "leases",
                Some(ns),
                Some("l"),
            )
        }
        let controller = UserInfo::service_account("system", "controller");
        assert!(authz.allows(&controller, &lease("anywhere")));
        assert!(!authz.allows(
            &UserInfo::service_account("other", "controller"),
            &lease("x")
        ));
        // A user merely named like the service account is the same principal to RBAC.
        assert!(authz.allows(
            &user("system:serviceaccount:system:controller", &[]),
            &lease("x")
        ));
        let worker = UserInfo::service_account("apps", "worker");
        assert!(authz.allows(&worker, &lease("apps")));
        assert!(!authz.allows(&worker, &lease("system")));
        assert!(!authz.allows(
            &UserInfo::service_account("system", "worker"),
            &lease("apps")
        ));
    }

    #[test]
    fn user_and_group_subjects() {
        let authz = Authorizer::from_objects(&[
            json!({
                "apiVersion": API_VERSION, "kind": "ClusterRole",
                "metadata": {"name": "viewer"},
                "rules": [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["list"]}],
            }),
            json!({
                "apiVersion": API_VERSION, "kind": "ClusterRoleBinding",
                "metadata": {"name": "viewers"},
                "roleRef": {"kind": "ClusterRole", "name": "viewer"},
                "subjects": [
                    {"kind": "User", "name": "carol"},
                    {"kind": "Group", "name": "devs"},
                ],
            }),
        ])
        .unwrap();
        let list = resource("list", "apps", "deployments", Some("ns"), None);
        assert!(authz.allows(&user("carol", &[]), &list));
        assert!(authz.allows(&user("dave", &["devs"]), &list));
        assert!(!authz.allows(&user("dave", &["ops"]), &list));
        // A user named like the group is not in it.
        assert!(!authz.allows(&user("devs", &[]), &list));
        // Service accounts' groups work as groups.
        let authz = Authorizer::from_objects(&[
            json!({
                "apiVersion": API_VERSION, "kind": "ClusterRole",
                "metadata": {"name": "viewer"},
                "rules": [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["list"]}],
            }),
            json!({
                "apiVersion": API_VERSION, "kind": "ClusterRoleBinding",
                "metadata": {"name": "all-sas"},
                "roleRef": {"kind": "ClusterRole", "name": "viewer"},
                "subjects": [{"kind": "Group", "name": "system:serviceaccounts:ns"}],
            }),
        ])
        .unwrap();
        assert!(authz.allows(&UserInfo::service_account("ns", "any"), &list));
        assert!(!authz.allows(&UserInfo::service_account("other", "any"), &list));
    }

    #[test]
    fn non_resource_urls() {
        let authz =
            alice_with_rule(json!({"nonResourceURLs": ["/metrics", "/logs/*"], "verbs": ["get"]}));
        let u = alice();
        assert!(authz.allows(&u, &non_resource("get", "/metrics")));
        assert!(!authz.allows(&u, &non_resource("post", "/metrics")));
        assert!(!authz.allows(&u, &non_resource("get", "/metrics/x")));
        assert!(authz.allows(&u, &non_resource("get", "/logs/")));
        assert!(authz.allows(&u, &non_resource("get", "/logs/kube/a.log")));
        assert!(!authz.allows(&u, &non_resource("get", "/logs")));
        // Non-resource rules say nothing about resources.
        assert!(!authz.allows(&u, &resource("get", "", "metrics", None, None)));

        let authz = alice_with_rule(json!({"nonResourceURLs": ["*"], "verbs": ["*"]}));
        assert!(authz.allows(&u, &non_resource("delete", "/anything/at/all")));
    }

    #[test]
    fn discovery_is_allowed_to_every_authenticated_user() {
        let authz = Authorizer::new();
        for u in [
            alice(),
            user("no-groups", &[]),
            UserInfo::service_account("ns", "sa"),
        ] {
            for path in [
                "/api",
                "/api/v1",
                "/apis",
                "/apis/apps/v1",
                "/version",
                "/healthz",
                "/livez",
                "/readyz",
            ] {
                assert!(authz.allows(&u, &non_resource("get", path)), "{path}");
            }
            assert!(!authz.allows(&u, &non_resource("post", "/api")));
            assert!(!authz.allows(&u, &non_resource("get", "/metrics")));
            assert!(!authz.allows(&u, &non_resource("get", "/healthz/etcd")));
            // Discovery grants nothing on resources.
            assert!(!authz.allows(&u, &resource("list", "", "configmaps", Some("ns"), None)));
            assert!(!authz.allows(&u, &resource("get", "", "namespaces", None, Some("ns"))));
        }
        // The anonymous user has only the public info.
        let anonymous = user("system:anonymous", &["system:unauthenticated"]);
        assert!(authz.allows(&anonymous, &non_resource("get", "/healthz")));
        assert!(authz.allows(&anonymous, &non_resource("get", "/version")));
        assert!(!authz.allows(&anonymous, &non_resource("get", "/api")));
        assert!(!authz.allows(&anonymous, &non_resource("get", "/apis/apps/v1")));
    }

    #[test]
    fn superuser_is_always_allowed() {
        let authz = Authorizer::new();
        let admin = UserInfo::admin();
        assert!(authz.allows(
            &admin,
            &resource("delete", "apps", "deployments", Some("x"), Some("d"))
        ));
        assert!(authz.allows(&admin, &resource("create", "", "namespaces", None, None)));
        assert!(authz.allows(&admin, &non_resource("post", "/anything")));
        assert!(authz.allows(
            &user("root", &["system:masters"]),
            &non_resource("get", "/metrics")
        ));
    }

    #[test]
    fn from_yaml_with_several_documents() {
        let authz = Authorizer::from_yaml(
            r#"---
# A leading separator and comment-only documents are fine.
---   # separator with a comment
apiVersion: v1
kind: ServiceAccount
metadata: {name: bot, namespace: ns}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: cm-editor
  namespace: ns
rules:
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, update, patch]
---

---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: bot-edits
  namespace: ns
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: cm-editor
subjects:
- kind: ServiceAccount
  name: bot
  namespace: ns
---
apiVersion: v1
kind: List
items:
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRole
  metadata: {name: ns-lister}
  rules: [{apiGroups: [""], resources: [namespaces], verbs: [list]}]
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRoleBinding
  metadata: {name: bot-lists}
  roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: ns-lister}
  subjects: [{kind: ServiceAccount, name: bot, namespace: ns}]
"#,
        )
        .unwrap();
        let bot = UserInfo::service_account("ns", "bot");
        assert!(authz.allows(
            &bot,
            &resource("patch", "", "configmaps", Some("ns"), Some("c"))
        ));
        assert!(!authz.allows(
            &bot,
            &resource("delete", "", "configmaps", Some("ns"), Some("c"))
        ));
        assert!(!authz.allows(
            &bot,
            &resource("patch", "", "configmaps", Some("x"), Some("c"))
        ));
        assert!(authz.allows(&bot, &resource("list", "", "namespaces", None, None)));
        assert!(authz.allows(&bot, &non_resource("get", "/apis")));

        assert!(Authorizer::from_yaml("").is_ok());
        assert!(Authorizer::from_yaml("---\n---\n").is_ok());
        let err = Authorizer::from_yaml("kind: [unclosed\n").unwrap_err();
        assert!(err.starts_with("YAML document 1"), "{err}");
    }

    #[test]
    fn later_objects_replace_earlier_ones() {
        let role = |verb: &str| {
            json!({
                "apiVersion": API_VERSION, "kind": "ClusterRole", "metadata": {"name": "r"},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": [verb]}],
            })
        };
        let binding = json!({
            "apiVersion": API_VERSION, "kind": "ClusterRoleBinding", "metadata": {"name": "b"},
            "roleRef": {"kind": "ClusterRole", "name": "r"},
            "subjects": [{"kind": "User", "name": "alice"}],
        });
        let authz = Authorizer::from_objects(&[role("get"), binding, role("list")]).unwrap();
        assert!(!authz.allows(
            &alice(),
            &resource("get", "", "pods", Some("ns"), Some("p"))
        ));
        assert!(authz.allows(&alice(), &resource("list", "", "pods", Some("ns"), None)));
    }

    #[test]
    fn invalid_objects_are_rejected() {
        let cases = [
            json!("not an object"),
            json!({"kind": "ClusterRole", "metadata": {"name": "x"}}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1beta1", "kind": "ClusterRole",
                   "metadata": {"name": "x"}}),
            json!({"apiVersion": API_VERSION, "kind": "Something", "metadata": {"name": "x"}}),
            json!({"apiVersion": API_VERSION, "kind": "ClusterRole"}),
            json!({"apiVersion": API_VERSION, "kind": "ClusterRole", "metadata": {"name": "x"},
                   "rules": [{"apiGroups": [""], "resources": ["pods"]}]}),
            json!({"apiVersion": API_VERSION, "kind": "ClusterRole", "metadata": {"name": "x"},
                   "rules": [{"resources": ["pods"], "verbs": ["get"]}]}),
            json!({"apiVersion": API_VERSION, "kind": "ClusterRole", "metadata": {"name": "x"},
                   "rules": [{"apiGroups": [""], "verbs": ["get"]}]}),
            json!({"apiVersion": API_VERSION, "kind": "ClusterRole", "metadata": {"name": "x"},
                   "rules": [{"apiGroups": [""], "nonResourceURLs": ["/x"], "verbs": ["get"]}]}),
            json!({"apiVersion": API_VERSION, "kind": "ClusterRole", "metadata": {"name": "x"},
                   "rules": [{"apiGroups": [""], "resources": "pods", "verbs": ["get"]}]}),
            json!({"apiVersion": API_VERSION, "kind": "Role",
                   "metadata": {"name": "x", "namespace": "ns"},
                   "rules": [{"nonResourceURLs": ["/x"], "verbs": ["get"]}]}),
            json!({"apiVersion": API_VERSION, "kind": "ClusterRoleBinding",
                   "metadata": {"name": "x"},
                   "roleRef": {"kind": "Role", "name": "r"}}),
            json!({"apiVersion": API_VERSION, "kind": "RoleBinding",
                   "metadata": {"name": "x", "namespace": "ns"},
                   "roleRef": {"kind": "Pod", "name": "r"}}),
            json!({"apiVersion": API_VERSION, "kind": "RoleBinding",
                   "metadata": {"name": "x", "namespace": "ns"},
                   "roleRef": {"apiGroup": "apps", "kind": "Role", "name": "r"}}),
            json!({"apiVersion": API_VERSION, "kind": "RoleBinding",
                   "metadata": {"name": "x", "namespace": "ns"},
                   "roleRef": {"kind": "Role"}}),
            json!({"apiVersion": API_VERSION, "kind": "ClusterRoleBinding",
                   "metadata": {"name": "x"},
                   "roleRef": {"kind": "ClusterRole", "name": "r"},
                   "subjects": [{"kind": "ServiceAccount", "name": "sa"}]}),
            json!({"apiVersion": API_VERSION, "kind": "ClusterRoleBinding",
                   "metadata": {"name": "x"},
                   "roleRef": {"kind": "ClusterRole", "name": "r"},
                   "subjects": [{"kind": "Robot", "name": "r2"}]}),
            json!({"apiVersion": API_VERSION, "kind": "ClusterRoleBinding",
                   "metadata": {"name": "x"},
                   "roleRef": {"kind": "ClusterRole", "name": "r"},
                   "subjects": [{"kind": "User", "apiGroup": "", "name": ""}]}),
            json!({"apiVersion": API_VERSION, "kind": "ClusterRoleBinding",
                   "metadata": {"name": "x"},
                   "roleRef": {"kind": "ClusterRole", "name": "r"},
                   "subjects": [{"kind": "User", "apiGroup": "v1", "name": "u"}]}),
            json!({"apiVersion": API_VERSION, "kind": "ClusterRoleBinding",
                   "metadata": {"name": "x"},
                   "roleRef": {"kind": "ClusterRole", "name": "r"},
                   "subjects": [{"kind": "ServiceAccount", "name": "Bad_Name", "namespace": "n"}]}),
        ];
        for obj in cases {
            assert!(
                Authorizer::from_objects(std::slice::from_ref(&obj)).is_err(),
                "{obj} should be rejected"
            );
        }
        // Objects of other groups are ignored.
        assert!(
            Authorizer::from_objects(&[json!({"apiVersion": "v1", "kind": "ConfigMap"})]).is_ok()
        );
    }

    #[test]
    fn binding_to_missing_role_grants_nothing() {
        let authz = Authorizer::from_objects(&[json!({
            "apiVersion": API_VERSION, "kind": "ClusterRoleBinding", "metadata": {"name": "b"},
            "roleRef": {"kind": "ClusterRole", "name": "missing"},
            "subjects": [{"kind": "User", "name": "alice"}],
        })])
        .unwrap();
        assert!(!authz.allows(
            &alice(),
            &resource("get", "", "pods", Some("ns"), Some("p"))
        ));
    }
}

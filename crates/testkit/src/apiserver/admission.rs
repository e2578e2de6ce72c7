//! The mutating admission chain: MutatingWebhookConfiguration webhooks called over HTTPS.
//!
//! Mimics kube-apiserver's `MutatingAdmissionWebhook` plugin
//! (k8s.io/apiserver/pkg/admission/plugin/webhook/mutating): which webhooks are called
//! (webhook/predicates/{rules,namespace,object} and generic.Webhook.ShouldCallHook), the
//! AdmissionReview sent and the checks made on the answer (webhook/request), failurePolicy, and
//! reinvocation (mutating/reinvocationcontext.go with k8s.io/apiserver/pkg/admission/reinvocation.go).
//!
//! Not mimicked: `matchPolicy: Equivalent` (only the exact group, version and resource match, as
//! with `matchPolicy: Exact`; the stand-in serves one version of each resource anyway),
//! `matchConditions` (CEL, ignored: they never exclude a webhook), `clientConfig.service` (a call
//! failure, as the stand-in has no Services to route to), in-tree admission plugins and audit
//! annotations. Without a `caBundle` kube-apiserver would trust the system roots; the stand-in
//! trusts nothing then, so such a call fails.

use std::collections::{BTreeMap, BTreeSet};
use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;
use serde_json::{Map, Value, json};

use crate::apiserver::resources::ResourceInfo;
use crate::apiserver::selectors::{LabelSelector, labels_of};
use crate::apiserver::user::UserInfo;

/// The admission operation, as `request.operation` and the rules' `operations` spell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    Create,
    Update,
    Delete,
}

impl Operation {
    /// `CREATE`, `UPDATE` or `DELETE`.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
        }
    }

    /// The kind of `request.options`: the options of the REST call that is being admitted.
    fn options_kind(self) -> &'static str {
        match self {
            Operation::Create => "CreateOptions",
            Operation::Update => "UpdateOptions",
            Operation::Delete => "DeleteOptions",
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One write to admit: kube-apiserver's `admission.Attributes`.
#[derive(Debug, Clone)]
pub struct AdmissionInput<'a> {
    pub resource: &'static ResourceInfo,
    pub operation: Operation,
    /// The object's namespace; `None` for cluster-scoped resources.
    pub namespace: Option<&'a str>,
    pub name: &'a str,
    /// The object as it will be stored; `Value::Null` for `Delete`.
    pub object: Value,
    /// The stored object, for `Update` and `Delete`.
    pub old_object: Option<&'a Value>,
    /// Labels of the object's namespace (for a Namespace object, its own) as the dispatcher's
    /// namespace cache has them, which may lag behind the store.
    pub namespace_labels: BTreeMap<String, String>,
    pub dry_run: bool,
    pub user: &'a UserInfo,
}

/// What the chain made of an admitted write.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionOutcome {
    /// The object as mutated by the webhooks.
    pub object: Value,
    /// Every webhook called, in call order (reinvocations included).
    pub calls: Vec<WebhookCall>,
    /// `response.warnings` of the webhooks, in call order; kube-apiserver sends each back to the
    /// client as a `Warning: 299 - "..."` header.
    pub warnings: Vec<String>,
    /// How long each call of `calls` took, in the same order: what kube-apiserver's
    /// `apiserver_admission_webhook_admission_duration_seconds` observes.
    pub durations: Vec<std::time::Duration>,
}

/// One call of one webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookCall {
    /// `metadata.name` of the MutatingWebhookConfiguration.
    pub configuration: String,
    /// `webhooks[].name`.
    pub webhook: String,
    /// 0 for the first pass over the chain, 1 for the reinvocation pass (as in kube-apiserver's
    /// `round_{round}_index_{index}` audit annotations).
    pub round: u8,
    pub result: CallResult,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallResult {
    /// The webhook's patch changed the object (the audit annotation's `mutated: true`).
    Patched,
    /// The webhook allowed the object without changing it (no patch, or a patch that changed
    /// nothing).
    Unpatched,
    /// The call failed and `failurePolicy: Ignore` let the write go on ("failing open"); the
    /// reason as it follows `failed calling webhook "<name>": `.
    FailedIgnored(String),
}

/// Why the chain refused a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdmissionError {
    /// The webhook answered `allowed: false` (kube-apiserver's `webhookerrors.ToStatusErr`), or
    /// cannot be called for a dry run (`webhookerrors.NewDryRunUnsupportedErr`, code 400).
    Denied {
        webhook: String,
        code: u16,
        message: String,
    },
    /// The call failed under `failurePolicy: Fail`, or the webhook's answer could not be used
    /// whatever the failurePolicy (a patch that does not apply, for one). kube-apiserver answers
    /// these with a 500 `InternalError`.
    Failed { webhook: String, message: String },
}

impl AdmissionError {
    /// The HTTP status kube-apiserver answers the write with.
    pub fn code(&self) -> u16 {
        match self {
            AdmissionError::Denied { code, .. } => *code,
            AdmissionError::Failed { .. } => 500,
        }
    }

    /// The `metav1.Status` kube-apiserver answers the write with.
    pub fn status(&self) -> Value {
        match self {
            // ToStatusErr keeps the webhook's status, with the message prefixed.
            AdmissionError::Denied { code, message, .. } => json!({
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": message,
                "code": code,
            }),
            // apierrors.NewInternalError.
            AdmissionError::Failed { message, .. } => json!({
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": format!("Internal error occurred: {message}"),
                "reason": "InternalError",
                "details": {"causes": [{"message": message}]},
                "code": 500,
            }),
        }
    }
}

impl fmt::Display for AdmissionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdmissionError::Denied { message, .. } | AdmissionError::Failed { message, .. } => {
                f.write_str(message)
            }
        }
    }
}

impl StdError for AdmissionError {}

/// kube-apiserver's `admissionregistration/v1` default for `timeoutSeconds`.
const DEFAULT_TIMEOUT_SECONDS: u64 = 10;

/// One webhook of one configuration.
struct Hook<'a> {
    configuration: &'a str,
    index: usize,
    name: &'a str,
    spec: &'a Value,
}

impl Hook<'_> {
    /// Mimics `webhook.GetUID()` of the webhook accessor: `{configuration}/{webhook}/{index}`,
    /// the key the reinvocation context remembers webhooks by.
    fn uid(&self) -> String {
        format!("{}/{}/{}", self.configuration, self.name, self.index)
    }

    fn field(&self, name: &str) -> Option<&str> {
        self.spec.get(name).and_then(Value::as_str)
    }

    /// `failurePolicy`, default `Fail`.
    fn ignores_failures(&self) -> bool {
        self.field("failurePolicy") == Some("Ignore")
    }

    /// `reinvocationPolicy`, default `Never`.
    fn reinvocable(&self) -> bool {
        self.field("reinvocationPolicy") == Some("IfNeeded")
    }

    fn timeout(&self) -> Duration {
        let seconds = self
            .spec
            .get("timeoutSeconds")
            .and_then(Value::as_u64)
            .unwrap_or(DEFAULT_TIMEOUT_SECONDS);
        Duration::from_secs(seconds)
    }
}

/// The webhooks of `configurations` in call order. Mimics the webhook source
/// (configuration/mutating_webhook_manager.go): configurations sorted by name, webhooks in
/// list order.
fn hooks(configurations: &[Value]) -> Vec<Hook<'_>> {
    let mut sorted: Vec<(&str, &Value)> = configurations
        .iter()
        .map(|c| {
            let name = c
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            (name, c)
        })
        .collect();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let mut hooks = Vec::new();
    for (configuration, config) in sorted {
        let Some(webhooks) = config.get("webhooks").and_then(Value::as_array) else {
            continue;
        };
        for (index, spec) in webhooks.iter().enumerate() {
            let name = spec.get("name").and_then(Value::as_str).unwrap_or("");
            hooks.push(Hook {
                configuration,
                index,
                name,
                spec,
            });
        }
    }
    hooks
}

/// Mimics `rules.IsExemptAdmissionConfigurationResource`: webhooks are never called for writes
/// of webhook configurations and admission policies, so a broken webhook cannot lock itself in.
fn is_exempt(resource: &ResourceInfo) -> bool {
    resource.group == "admissionregistration.k8s.io"
        && matches!(
            resource.plural,
            "validatingwebhookconfigurations"
                | "mutatingwebhookconfigurations"
                | "validatingadmissionpolicies"
                | "validatingadmissionpolicybindings"
                | "mutatingadmissionpolicies"
                | "mutatingadmissionpolicybindings"
        )
}

fn is_namespace(resource: &ResourceInfo) -> bool {
    resource.group.is_empty() && resource.plural == "namespaces"
}

/// The strings of an array field of a rule; absent means none.
fn strings<'v>(value: &'v Value, field: &str) -> Vec<&'v str> {
    value
        .get(field)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// Mimics `rules.Matcher.Matches`: scope, operation, group, version and resource all match.
fn rule_matches(rule: &Value, resource: &ResourceInfo, operation: Operation) -> bool {
    let one_of = |field: &str, value: &str| {
        strings(rule, field)
            .iter()
            .any(|candidate| *candidate == "*" || *candidate == value)
    };
    // Matcher.resource: `res/sub` against the request's resource and subresource; `*` is any
    // resource without subresource, `res/*` a resource and all its subresources, `*/*`
    // everything. The stand-in serves main resources only, so the subresource is always "".
    let resource_matches = strings(rule, "resources").iter().any(|candidate| {
        let (res, sub) = candidate.split_once('/').unwrap_or((candidate, ""));
        (res == "*" || res == resource.plural) && (sub == "*" || sub.is_empty())
    });
    // Matcher.scope: absent or `*` is any; `Cluster` is a request without a namespace;
    // `Namespaced` one with a namespace, and never a Namespace object itself.
    let scope_matches = match rule.get("scope").and_then(Value::as_str) {
        None | Some("*") => true,
        Some("Cluster") => !resource.namespaced,
        Some("Namespaced") => resource.namespaced && !is_namespace(resource),
        Some(_) => false,
    };
    scope_matches
        && one_of("operations", operation.as_str())
        && one_of("apiGroups", resource.group)
        && one_of("apiVersions", resource.version)
        && resource_matches
}

/// Mimics `generic.Webhook.ShouldCallHook`: the namespaceSelector, the objectSelector, then one
/// rule must match. Errors are selectors that do not parse, which kube-apiserver returns as an
/// internal error whatever the failurePolicy.
fn should_call(
    hook: &Hook<'_>,
    input: &AdmissionInput<'_>,
    object: &Value,
) -> Result<bool, String> {
    // Absent selectors are `{}` (API defaulting), which select everything.
    let selector = |field: &str| {
        LabelSelector::from_object(hook.spec.get(field).unwrap_or(&Value::Null))
            .map_err(|e| format!("invalid {field}: {e}"))
    };

    // namespace.Matcher.MatchNamespaceSelector: a cluster-scoped object that is not a Namespace
    // is never exempted by the namespaceSelector.
    let resource = input.resource;
    if resource.namespaced || is_namespace(resource) {
        let namespace_selector = selector("namespaceSelector")?;
        if !namespace_selector.is_everything() {
            // GetNamespaceLabels: a Namespace being created or updated is matched on its own
            // labels as the chain has mutated them so far; anything else on the stored labels
            // of its namespace.
            let labels = if is_namespace(resource)
                && matches!(input.operation, Operation::Create | Operation::Update)
            {
                labels_of(object)
            } else {
                input.namespace_labels.clone()
            };
            if !namespace_selector.matches(&labels) {
                return Ok(false);
            }
        }
    }

    // object.Matcher.MatchObjectSelector: an empty selector selects everything; otherwise the
    // object or the old object must match, and an absent one (the object of a DELETE, the old
    // object of a CREATE) never does.
    let object_selector = selector("objectSelector")?;
    if !object_selector.is_everything()
        && ![Some(object), input.old_object]
            .into_iter()
            .flatten()
            .any(|candidate| {
                candidate.is_object() && object_selector.matches(&labels_of(candidate))
            })
    {
        return Ok(false);
    }

    let rules = hook
        .spec
        .get("rules")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    Ok(rules
        .iter()
        .any(|rule| rule_matches(rule, resource, input.operation)))
}

/// The webhooks that `input` would call, as (configuration, webhook) names in call order.
/// A webhook whose selector does not parse is left out (`mutate` fails the write on it).
pub fn matching_webhooks(
    configurations: &[Value],
    input: &AdmissionInput<'_>,
) -> Vec<(String, String)> {
    if is_exempt(input.resource) {
        return Vec::new();
    }
    hooks(configurations)
        .into_iter()
        .filter(|hook| should_call(hook, input, &input.object).unwrap_or(false))
        .map(|hook| (hook.configuration.to_owned(), hook.name.to_owned()))
        .collect()
}

/// Mimics mutating/reinvocationcontext.go's `webhookReinvokeContext`.
#[derive(Default)]
struct ReinvokeContext {
    /// IfNeeded webhooks called since the object last changed.
    previously_invoked: BTreeSet<String>,
    /// IfNeeded webhooks that a later webhook changed the object after.
    reinvoke: BTreeSet<String>,
    /// `ReinvocationContext.ShouldReinvoke`: some webhook changed the object.
    should_reinvoke: bool,
}

/// Runs the mutating webhooks of `configurations` on `input.object`.
///
/// Mimics the reinvoker (admission/reinvocation.go) around `mutatingDispatcher.Dispatch`: one
/// pass over the chain; if any webhook changed the object, a second and last pass calls only
/// the `reinvocationPolicy: IfNeeded` webhooks that were called before a later change. The
/// second pass re-checks matching against the mutated object, and never calls a webhook for the
/// first time.
pub async fn mutate(
    configurations: &[Value],
    input: AdmissionInput<'_>,
) -> Result<AdmissionOutcome, AdmissionError> {
    let mut input = input;
    let mut object = std::mem::take(&mut input.object);
    let mut calls = Vec::new();
    let mut warnings = Vec::new();
    let mut durations = Vec::new();
    if is_exempt(input.resource) {
        return Ok(AdmissionOutcome {
            object,
            calls,
            warnings,
            durations,
        });
    }
    let hooks = hooks(configurations);
    let mut context = ReinvokeContext::default();
    for round in 0..2u8 {
        if round == 1 && !context.should_reinvoke {
            break;
        }
        for hook in &hooks {
            let matches =
                should_call(hook, &input, &object).map_err(|e| AdmissionError::Failed {
                    webhook: hook.name.to_owned(),
                    message: format!("admission webhook {:?}: {e}", hook.name),
                })?;
            if !matches {
                continue;
            }
            if round == 1 && !context.reinvoke.contains(&hook.uid()) {
                continue;
            }
            let called = std::time::Instant::now();
            let result = call_hook(hook, &input, &object).await;
            let took = called.elapsed();
            let (changed, failure) = match result {
                Ok(answer) => {
                    warnings.extend(answer.warnings);
                    match answer.object {
                        // apiequality.Semantic.DeepEqual of the object before and after.
                        Some(patched) if patched != object => {
                            object = patched;
                            (true, None)
                        }
                        _ => (false, None),
                    }
                }
                Err(failure) => (false, Some(failure)),
            };
            if changed {
                // RequireReinvokingPreviouslyInvokedPlugins + SetShouldReinvoke.
                context.reinvoke.append(&mut context.previously_invoked);
                context.should_reinvoke = true;
            }
            if hook.reinvocable() {
                // AddReinvocableWebhookToPreviouslyInvoked, after the change check: a webhook is
                // reinvoked for changes made after it, not for its own.
                context.previously_invoked.insert(hook.uid());
            }
            let result = match failure {
                None if changed => CallResult::Patched,
                None => CallResult::Unpatched,
                // ErrCallingWebhook under failurePolicy Ignore: "failing open".
                Some(Failure::Calling(reason)) if hook.ignores_failures() => {
                    CallResult::FailedIgnored(reason)
                }
                Some(Failure::Calling(reason)) => {
                    return Err(AdmissionError::Failed {
                        webhook: hook.name.to_owned(),
                        message: format!("failed calling webhook {:?}: {reason}", hook.name),
                    });
                }
                Some(Failure::Refused(error)) => return Err(error),
            };
            calls.push(WebhookCall {
                configuration: hook.configuration.to_owned(),
                webhook: hook.name.to_owned(),
                round,
                result,
            });
            durations.push(took);
        }
    }
    Ok(AdmissionOutcome {
        object,
        calls,
        warnings,
        durations,
    })
}

/// How one webhook call went wrong.
enum Failure {
    /// `webhookutil.ErrCallingWebhook`: the webhook could not be called or answered nonsense;
    /// subject to failurePolicy.
    Calling(String),
    /// A denial or any other error, which fails the write whatever the failurePolicy.
    Refused(AdmissionError),
}

/// What a webhook that allowed the write answered.
struct Answer {
    /// The object with the webhook's patch applied; `None` when it sent no patch.
    object: Option<Value>,
    warnings: Vec<String>,
}

/// Mimics `mutatingDispatcher.callAttrMutatingHook`.
async fn call_hook(
    hook: &Hook<'_>,
    input: &AdmissionInput<'_>,
    object: &Value,
) -> Result<Answer, Failure> {
    let name = hook.name;
    let failed = |message: String| {
        Failure::Refused(AdmissionError::Failed {
            webhook: name.to_owned(),
            message,
        })
    };

    // A dry run may only call webhooks that declare no side effects (on dry runs).
    if input.dry_run {
        match hook.field("sideEffects") {
            Some("None" | "NoneOnDryRun") => {}
            None => return Err(Failure::Calling("Webhook SideEffects is nil".to_owned())),
            Some(_) => {
                return Err(Failure::Refused(AdmissionError::Denied {
                    webhook: name.to_owned(),
                    code: 400,
                    message: format!("admission webhook {name:?} does not support dry run"),
                }));
            }
        }
    }

    let uid = new_uid();
    let review = review_request(&uid, input, object);
    let body = serde_json::to_vec(&review).map_err(|e| failed(e.to_string()))?;
    let answer = post_review(hook.spec.get("clientConfig"), body, hook.timeout())
        .await
        .map_err(Failure::Calling)?;

    // request.VerifyAdmissionResponse.
    let invalid =
        |reason: String| Failure::Calling(format!("received invalid webhook response: {reason}"));
    let api_version = answer
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind = answer.get("kind").and_then(Value::as_str).unwrap_or("");
    if api_version != "admission.k8s.io/v1" || kind != "AdmissionReview" {
        return Err(invalid(format!(
            "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {api_version}, Kind={kind}"
        )));
    }
    let Some(response) = answer.get("response").filter(|r| r.is_object()) else {
        return Err(invalid("webhook response was absent".to_owned()));
    };
    let response_uid = response.get("uid").and_then(Value::as_str).unwrap_or("");
    if response_uid != uid {
        return Err(invalid(format!(
            "expected response.uid={uid:?}, got {response_uid:?}"
        )));
    }
    let patch = response.get("patch").and_then(Value::as_str).unwrap_or("");
    let patch_type = response
        .get("patchType")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !patch.is_empty() && patch_type.is_empty() {
        return Err(invalid(
            "webhook returned response.patch but not response.patchType".to_owned(),
        ));
    }
    if patch.is_empty() && !patch_type.is_empty() {
        return Err(invalid(
            "webhook returned response.patchType but not response.patch".to_owned(),
        ));
    }
    let warnings = strings(response, "warnings")
        .into_iter()
        .map(str::to_owned)
        .collect();

    if response.get("allowed").and_then(Value::as_bool) != Some(true) {
        return Err(Failure::Refused(denial(name, response.get("status"))));
    }
    if patch.is_empty() {
        return Ok(Answer {
            object: None,
            warnings,
        });
    }
    if patch_type != "JSONPatch" {
        return Err(Failure::Calling(format!(
            "unsupported patch type {patch_type:?}"
        )));
    }
    // `patch` is []byte in Go: a bad base64 string fails decoding the response body.
    let patch = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .map_err(|e| invalid(format!("response.patch is not base64: {e}")))?;

    // From here kube-apiserver answers with an internal error, never subject to failurePolicy.
    let patch: json_patch::Patch = serde_json::from_slice(&patch).map_err(|e| {
        failed(format!(
            "admission webhook {name:?} returned an invalid JSON patch: {e}"
        ))
    })?;
    if patch.0.is_empty() {
        return Ok(Answer {
            object: None,
            warnings,
        });
    }
    if input.operation == Operation::Delete || object.is_null() {
        return Err(failed(format!(
            "admission webhook {name:?} attempted to modify the object, which is not supported for this operation"
        )));
    }
    let mut patched = object.clone();
    json_patch::patch(&mut patched, &patch).map_err(|e| {
        failed(format!(
            "admission webhook {name:?} returned a patch that does not apply: {e}"
        ))
    })?;
    if !patched.is_object() {
        return Err(failed(format!(
            "admission webhook {name:?} patched the object into something that is not an object"
        )));
    }
    Ok(Answer {
        object: Some(patched),
        warnings,
    })
}

/// Mimics `webhookerrors.ToStatusErr`: a code under 400 becomes 403, and the message names the
/// webhook.
fn denial(name: &str, status: Option<&Value>) -> AdmissionError {
    let field = |f: &str| {
        status
            .and_then(|s| s.get(f))
            .and_then(Value::as_str)
            .unwrap_or("")
    };
    let code = status
        .and_then(|s| s.get("code"))
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| *c >= 400)
        .unwrap_or(403);
    let denied_by = format!("admission webhook {name:?} denied the request");
    let message = if !field("message").is_empty() {
        format!("{denied_by}: {}", field("message"))
    } else if !field("reason").is_empty() {
        format!("{denied_by}: {}", field("reason"))
    } else {
        format!("{denied_by} without explanation")
    };
    AdmissionError::Denied {
        webhook: name.to_owned(),
        code,
        message,
    }
}

/// Mimics `request.CreateV1AdmissionReview`: the AdmissionReview for one call, with the object
/// as the chain has mutated it so far.
fn review_request(uid: &str, input: &AdmissionInput<'_>, object: &Value) -> Value {
    let r = input.resource;
    let kind = json!({"group": r.group, "version": r.version, "kind": r.kind});
    let resource = json!({"group": r.group, "version": r.version, "resource": r.plural});
    let mut request = Map::new();
    request.insert("uid".into(), uid.into());
    request.insert("kind".into(), kind.clone());
    request.insert("resource".into(), resource.clone());
    // The stand-in converts nothing: the request's kind and resource are the object's.
    request.insert("requestKind".into(), kind);
    request.insert("requestResource".into(), resource);
    request.insert("name".into(), input.name.into());
    if r.namespaced
        && let Some(namespace) = input.namespace.filter(|n| !n.is_empty())
    {
        request.insert("namespace".into(), namespace.into());
    }
    request.insert("operation".into(), input.operation.as_str().into());
    request.insert(
        "userInfo".into(),
        json!({"username": input.user.username, "groups": input.user.groups}),
    );
    // RawExtensions: an absent object is sent as null (a DELETE's object, a CREATE's oldObject).
    let object = match input.operation {
        Operation::Delete => Value::Null,
        _ => object.clone(),
    };
    let old_object = match input.operation {
        Operation::Create => Value::Null,
        _ => input.old_object.cloned().unwrap_or(Value::Null),
    };
    request.insert("object".into(), object);
    request.insert("oldObject".into(), old_object);
    request.insert("dryRun".into(), input.dry_run.into());
    let mut options = json!({
        "kind": input.operation.options_kind(),
        "apiVersion": "meta.k8s.io/v1",
    });
    if input.dry_run {
        options["dryRun"] = json!(["All"]);
    }
    request.insert("options".into(), options);
    json!({
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": request,
    })
}

/// A fresh random (version 4) UUID, as kube-apiserver gives each AdmissionReview.
fn new_uid() -> String {
    static FALLBACK: AtomicU64 = AtomicU64::new(0);
    let mut bytes = [0u8; 16];
    if rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut bytes)
        .is_err()
    {
        // No system randomness: unique within the process is all the check needs.
        let n = FALLBACK.fetch_add(1, Ordering::Relaxed);
        bytes[8..].copy_from_slice(&n.to_be_bytes());
    }
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// A rustls client configuration that trusts only the PEM certificates of `caBundle`.
fn tls_config(ca_bundle: Option<&Value>) -> Result<rustls::ClientConfig, String> {
    let encoded = ca_bundle
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or(
            "clientConfig.caBundle is empty, and the stand-in API server trusts only caBundle",
        )?;
    let pem = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|e| format!("clientConfig.caBundle is not base64: {e}"))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| format!("clientConfig.caBundle is not PEM: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("clientConfig.caBundle holds a bad certificate: {e}"))?;
    }
    if roots.is_empty() {
        return Err("clientConfig.caBundle holds no PEM certificate".to_owned());
    }
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth())
}

/// An error with its sources, as Go's wrapped errors print.
fn describe(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// POSTs an AdmissionReview to `clientConfig.url` and decodes the answer. Mimics the webhook
/// client (k8s.io/apiserver/pkg/util/webhook): the timeout bounds the whole call, and is also
/// sent as the `timeout` query parameter as client-go's `Request.Timeout` does; any 2xx up to
/// 206 is a success as in client-go's `transformResponse`. Errors are the reason of an
/// `ErrCallingWebhook`.
async fn post_review(
    client_config: Option<&Value>,
    body: Vec<u8>,
    timeout: Duration,
) -> Result<Value, String> {
    let client_config = client_config.ok_or("the webhook has no clientConfig")?;
    let url = match client_config.get("url").and_then(Value::as_str) {
        Some(url) => url,
        None if client_config.get("service").is_some() => {
            return Err(
                "clientConfig.service is not supported by the stand-in API server; give clientConfig.url"
                    .to_owned(),
            );
        }
        None => return Err("clientConfig has neither url nor service".to_owned()),
    };
    let separator = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{separator}timeout={}s", timeout.as_secs());
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e| format!("clientConfig.url {url:?} is not a URL: {e}"))?;
    if uri.scheme_str() != Some("https") {
        return Err(format!("clientConfig.url {url:?} is not https"));
    }
    let tls = tls_config(client_config.get("caBundle"))?;
    // The server name verified is the URL's host (a DNS name or an IP address SAN).
    // kube-apiserver's (Go) client sends without Nagle's delay.
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.set_nodelay(true);
    http.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_all_versions()
        .wrap_connector(http);
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
    let request = hyper::Request::post(uri)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(hyper::header::ACCEPT, "application/json, */*")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let post = format!("Post {url:?}");
    let exchange = async {
        let response = client
            .request(request)
            .await
            .map_err(|e| format!("failed to call webhook: {post}: {}", describe(&e)))?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("failed to call webhook: {post}: {}", describe(&e)))?
            .to_bytes();
        Ok::<_, String>((status, body))
    };
    let (status, body) = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("failed to call webhook: {post}: context deadline exceeded"))??;
    if !(200..=206).contains(&status.as_u16()) {
        let text = String::from_utf8_lossy(&body);
        let text: String = text.chars().take(1024).collect();
        return Err(format!(
            "failed to call webhook: {post}: an error on the server ({text:?}) has prevented the request from succeeding (status {status})"
        ));
    }
    serde_json::from_slice(&body)
        .map_err(|e| format!("failed to call webhook: the response is not an AdmissionReview: {e}"))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::net::SocketAddr;
    use std::sync::{LazyLock, Mutex};
    use std::time::Instant;

    use axum::Json;
    use axum::Router;
    use axum::extract::{Path, State};
    use axum::http::StatusCode;
    use axum::response::{IntoResponse, Response};
    use axum::routing::post;
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
        IsCa, KeyPair, KeyUsagePurpose,
    };
    use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    use tokio::net::{TcpListener, TcpStream};
    use tokio_rustls::TlsAcceptor;
    use tokio_rustls::server::TlsStream;

    use super::*;
    use crate::apiserver::resources::RESOURCES;

    /// What the test webhook at one path answers.
    #[derive(Clone)]
    enum Behaviour {
        /// These `response` fields, with the request's uid.
        Respond(Value),
        /// Allowed, with this JSON patch.
        Patch(Value),
        /// Allowed, setting label `key` to the number of calls to this path so far, so every
        /// call changes the object.
        Count(&'static str),
        /// Allowed after this delay.
        Sleep(Duration),
        /// Allowed, with another uid than the request's.
        WrongUid,
        /// This HTTP status, with a text body.
        Status(u16),
    }

    #[derive(Default)]
    struct ServerState {
        behaviours: HashMap<String, Behaviour>,
        /// (path, AdmissionReview) of every request, in arrival order.
        requests: Mutex<Vec<(String, Value)>>,
    }

    struct Server {
        addr: SocketAddr,
        /// base64 of the PEM of the CA that signed the server's certificate.
        ca_bundle: String,
        state: Arc<ServerState>,
    }

    impl Server {
        fn url(&self, path: &str) -> String {
            format!("https://{}/{path}", self.addr)
        }

        fn requests(&self, path: &str) -> Vec<Value> {
            self.state
                .requests
                .lock()
                .unwrap()
                .iter()
                .filter(|(p, _)| p == path)
                .map(|(_, review)| review.clone())
                .collect()
        }

        fn calls(&self, path: &str) -> usize {
            self.requests(path).len()
        }

        /// A webhook named `path` calling this server's `path`, with a rule for creating and
        /// updating Deployments and the other fields kube-apiserver requires.
        fn webhook(&self, path: &str) -> Value {
            json!({
                "name": format!("{path}.example.com"),
                "clientConfig": {"url": self.url(path), "caBundle": self.ca_bundle},
                "rules": [{
                    "operations": ["CREATE", "UPDATE"],
                    "apiGroups": ["apps"],
                    "apiVersions": ["v1"],
                    "resources": ["deployments"],
                }],
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
            })
        }
    }

    fn new_ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.distinguished_name.push(DnType::CommonName, name);
        CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
    }

    fn bundle(ca: &CertifiedIssuer<'static, KeyPair>) -> String {
        base64::engine::general_purpose::STANDARD.encode(ca.pem())
    }

    /// Hands axum the connections whose TLS handshake succeeded; handshakes run concurrently so
    /// that a failed or stalled one does not hold up the others.
    struct TlsListener {
        addr: SocketAddr,
        accepted: tokio::sync::mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    }

    impl axum::serve::Listener for TlsListener {
        type Io = TlsStream<TcpStream>;
        type Addr = SocketAddr;

        async fn accept(&mut self) -> (Self::Io, Self::Addr) {
            match self.accepted.recv().await {
                Some(connection) => connection,
                None => std::future::pending().await,
            }
        }

        fn local_addr(&self) -> std::io::Result<SocketAddr> {
            Ok(self.addr)
        }
    }

    /// Starts an HTTPS webhook server on 127.0.0.1 with a certificate for 127.0.0.1 and
    /// localhost, signed by a CA made for it. It serves `POST /{path}` per `behaviours`.
    async fn start(behaviours: &[(&str, Behaviour)]) -> Server {
        start_for(&["127.0.0.1", "localhost"], behaviours).await
    }

    /// `start` with a certificate for `names`.
    async fn start_for(names: &[&str], behaviours: &[(&str, Behaviour)]) -> Server {
        let ca = new_ca("webhook test CA");
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "webhook");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &ca).unwrap();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key)
        .unwrap();
        // axum::serve speaks HTTP/1.1 only unless its http2 feature is on.
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(tls));

        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let (sender, accepted) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            while let Ok((stream, peer)) = tcp.accept().await {
                let acceptor = acceptor.clone();
                let sender = sender.clone();
                tokio::spawn(async move {
                    let handshake =
                        tokio::time::timeout(Duration::from_secs(5), acceptor.accept(stream));
                    if let Ok(Ok(stream)) = handshake.await {
                        let _ = sender.send((stream, peer)).await;
                    }
                });
            }
        });

        let state = Arc::new(ServerState {
            behaviours: behaviours
                .iter()
                .map(|(path, b)| ((*path).to_owned(), b.clone()))
                .collect(),
            requests: Mutex::default(),
        });
        let app = Router::new()
            .route("/{path}", post(review))
            .with_state(state.clone());
        tokio::spawn(async move {
            let _ = axum::serve(TlsListener { addr, accepted }, app).await;
        });
        Server {
            addr,
            ca_bundle: bundle(&ca),
            state,
        }
    }

    fn review_response(response: Value) -> Response {
        Json(json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": response,
        }))
        .into_response()
    }

    fn allowed_with_patch(uid: &Value, ops: &Value) -> Response {
        let patch = base64::engine::general_purpose::STANDARD.encode(ops.to_string());
        review_response(json!({
            "uid": uid,
            "allowed": true,
            "patchType": "JSONPatch",
            "patch": patch,
        }))
    }

    async fn review(
        State(state): State<Arc<ServerState>>,
        Path(path): Path<String>,
        Json(review): Json<Value>,
    ) -> Response {
        let count = {
            let mut requests = state.requests.lock().unwrap();
            requests.push((path.clone(), review.clone()));
            requests.iter().filter(|(p, _)| *p == path).count()
        };
        let uid = review["request"]["uid"].clone();
        match state.behaviours.get(&path).cloned() {
            None => StatusCode::NOT_FOUND.into_response(),
            Some(Behaviour::Respond(fields)) => {
                let mut response = json!({"uid": uid});
                for (k, v) in fields.as_object().unwrap() {
                    response[k] = v.clone();
                }
                review_response(response)
            }
            Some(Behaviour::Patch(ops)) => allowed_with_patch(&uid, &ops),
            Some(Behaviour::Count(key)) => allowed_with_patch(
                &uid,
                &json!([{"op": "add", "path": format!("/metadata/labels/{key}"), "value": count.to_string()}]),
            ),
            Some(Behaviour::Sleep(delay)) => {
                tokio::time::sleep(delay).await;
                review_response(json!({"uid": uid, "allowed": true}))
            }
            Some(Behaviour::WrongUid) => {
                review_response(json!({"uid": "not-the-request-uid", "allowed": true}))
            }
            Some(Behaviour::Status(code)) => {
                (StatusCode::from_u16(code).unwrap(), "webhook broke").into_response()
            }
        }
    }

    fn configuration(name: &str, webhooks: Vec<Value>) -> Value {
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": webhooks,
        })
    }

    fn resource(group: &str, plural: &str) -> &'static ResourceInfo {
        RESOURCES
            .iter()
            .find(|r| r.group == group && r.plural == plural)
            .unwrap()
    }

    static ADMIN: LazyLock<UserInfo> = LazyLock::new(UserInfo::admin);

    fn deployment(labels: Value) -> Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default", "labels": labels},
            "spec": {"replicas": 1},
        })
    }

    /// Creating Deployment `default/web` with `labels`, in a namespace labelled `team: a`.
    fn create(labels: Value) -> AdmissionInput<'static> {
        AdmissionInput {
            resource: resource("apps", "deployments"),
            operation: Operation::Create,
            namespace: Some("default"),
            name: "web",
            object: deployment(labels),
            old_object: None,
            namespace_labels: BTreeMap::from([("team".to_owned(), "a".to_owned())]),
            dry_run: false,
            user: &ADMIN,
        }
    }

    fn label_patch(key: &str, value: &str) -> Behaviour {
        Behaviour::Patch(
            json!([{"op": "add", "path": format!("/metadata/labels/{key}"), "value": value}]),
        )
    }

    fn results(outcome: &AdmissionOutcome) -> Vec<(&str, u8, CallResult)> {
        outcome
            .calls
            .iter()
            .map(|c| (c.webhook.as_str(), c.round, c.result.clone()))
            .collect()
    }

    #[tokio::test]
    async fn a_matching_webhooks_patch_is_applied_and_the_request_is_complete() {
        let server = start(&[("add", label_patch("added", "yes"))]).await;
        let configs = [configuration("config", vec![server.webhook("add")])];
        let outcome = mutate(&configs, create(json!({"app": "web"})))
            .await
            .unwrap();

        assert_eq!(
            outcome.object["metadata"]["labels"],
            json!({"app": "web", "added": "yes"})
        );
        assert_eq!(
            outcome.calls,
            vec![WebhookCall {
                configuration: "config".to_owned(),
                webhook: "add.example.com".to_owned(),
                round: 0,
                result: CallResult::Patched,
            }]
        );
        let requests = server.requests("add");
        assert_eq!(requests.len(), 1);
        let review = &requests[0];
        assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(review["kind"], "AdmissionReview");
        let request = &review["request"];
        assert_eq!(request["uid"].as_str().unwrap().len(), 36);
        let kind = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
        let gvr = json!({"group": "apps", "version": "v1", "resource": "deployments"});
        assert_eq!(request["kind"], kind);
        assert_eq!(request["requestKind"], kind);
        assert_eq!(request["resource"], gvr);
        assert_eq!(request["requestResource"], gvr);
        assert_eq!(request["name"], "web");
        assert_eq!(request["namespace"], "default");
        assert_eq!(request["operation"], "CREATE");
        assert_eq!(request["userInfo"]["username"], ADMIN.username);
        assert_eq!(request["userInfo"]["groups"], json!(ADMIN.groups));
        assert_eq!(request["object"], deployment(json!({"app": "web"})));
        assert_eq!(request["oldObject"], Value::Null);
        assert_eq!(request["dryRun"], false);
        assert_eq!(
            request["options"],
            json!({"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"})
        );
    }

    #[tokio::test]
    async fn configurations_run_in_name_order_and_see_earlier_changes() {
        let server = start(&[
            ("first", label_patch("order", "first")),
            // Fails to apply unless `first` ran before.
            (
                "second",
                Behaviour::Patch(json!([
                    {"op": "test", "path": "/metadata/labels/order", "value": "first"},
                    {"op": "replace", "path": "/metadata/labels/order", "value": "second"}
                ])),
            ),
            (
                "third",
                Behaviour::Respond(json!({"allowed": true, "warnings": ["careful"]})),
            ),
        ])
        .await;
        let configs = [
            configuration("b", vec![server.webhook("second"), server.webhook("third")]),
            configuration("a", vec![server.webhook("first")]),
        ];
        let outcome = mutate(&configs, create(json!({}))).await.unwrap();
        assert_eq!(outcome.object["metadata"]["labels"]["order"], "second");
        assert_eq!(
            results(&outcome),
            vec![
                ("first.example.com", 0, CallResult::Patched),
                ("second.example.com", 0, CallResult::Patched),
                ("third.example.com", 0, CallResult::Unpatched),
            ]
        );
        assert_eq!(outcome.warnings, vec!["careful".to_owned()]);
        assert_eq!(
            server.requests("second")[0]["request"]["object"]["metadata"]["labels"]["order"],
            "first"
        );
    }

    #[tokio::test]
    async fn webhooks_that_do_not_match_are_not_called() {
        let paths = [
            "match",
            "configmaps",
            "status",
            "delete",
            "cluster",
            "core",
            "v2",
            "namespace",
            "object",
        ];
        let behaviours: Vec<(&str, Behaviour)> = paths
            .iter()
            .map(|p| (*p, label_patch(p, "called")))
            .collect();
        let server = start(&behaviours).await;
        let mut hooks: Vec<Value> = paths.iter().map(|p| server.webhook(p)).collect();
        hooks[0]["rules"] = json!([{
            "operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"],
            "resources": ["*"], "scope": "Namespaced",
        }]);
        hooks[0]["namespaceSelector"] =
            json!({"matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "b"]}]});
        hooks[0]["objectSelector"] = json!({"matchLabels": {"app": "web"}});
        hooks[1]["rules"][0]["resources"] = json!(["configmaps"]);
        hooks[2]["rules"][0]["resources"] = json!(["deployments/status"]);
        hooks[3]["rules"][0]["operations"] = json!(["DELETE"]);
        hooks[4]["rules"][0]["scope"] = json!("Cluster");
        hooks[5]["rules"][0]["apiGroups"] = json!([""]);
        hooks[6]["rules"][0]["apiVersions"] = json!(["v2"]);
        hooks[7]["namespaceSelector"] = json!({"matchLabels": {"team": "b"}});
        hooks[8]["objectSelector"] =
            json!({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["web"]}]});
        let configs = [configuration("config", hooks)];

        let input = create(json!({"app": "web"}));
        assert_eq!(
            matching_webhooks(&configs, &input),
            vec![("config".to_owned(), "match.example.com".to_owned())]
        );
        let outcome = mutate(&configs, input).await.unwrap();
        assert_eq!(
            outcome.object["metadata"]["labels"],
            json!({"app": "web", "match": "called"})
        );
        assert_eq!(server.calls("match"), 1);
        for path in &paths[1..] {
            assert_eq!(server.calls(path), 0, "{path} was called");
        }
    }

    #[tokio::test]
    async fn an_object_selector_matching_only_the_old_object_calls_the_webhook() {
        let server = start(&[("old", label_patch("seen", "yes"))]).await;
        let mut hook = server.webhook("old");
        hook["objectSelector"] = json!({"matchLabels": {"managed": "true"}});
        let configs = [configuration("config", vec![hook])];
        let old = deployment(json!({"managed": "true"}));
        let input = AdmissionInput {
            operation: Operation::Update,
            old_object: Some(&old),
            ..create(json!({}))
        };
        assert_eq!(matching_webhooks(&configs, &input).len(), 1);
        let outcome = mutate(&configs, input).await.unwrap();
        assert_eq!(outcome.object["metadata"]["labels"]["seen"], "yes");
        assert_eq!(server.calls("old"), 1);

        // Neither object matches: not called.
        let other = deployment(json!({"managed": "false"}));
        let input = AdmissionInput {
            operation: Operation::Update,
            old_object: Some(&other),
            ..create(json!({}))
        };
        assert!(matching_webhooks(&configs, &input).is_empty());
        mutate(&configs, input).await.unwrap();
        assert_eq!(server.calls("old"), 1);
    }

    #[tokio::test]
    async fn dry_run_and_old_object_are_sent() {
        let server = start(&[
            ("dry", Behaviour::Respond(json!({"allowed": true}))),
            ("effects", Behaviour::Respond(json!({"allowed": true}))),
        ])
        .await;
        let configs = [configuration("config", vec![server.webhook("dry")])];
        let old = deployment(json!({"version": "1"}));
        let input = AdmissionInput {
            operation: Operation::Update,
            old_object: Some(&old),
            dry_run: true,
            ..create(json!({"version": "2"}))
        };
        let outcome = mutate(&configs, input.clone()).await.unwrap();
        assert_eq!(
            results(&outcome),
            vec![("dry.example.com", 0, CallResult::Unpatched)]
        );
        let request = &server.requests("dry")[0]["request"];
        assert_eq!(request["operation"], "UPDATE");
        assert_eq!(request["dryRun"], true);
        assert_eq!(request["oldObject"], old);
        assert_eq!(request["object"], deployment(json!({"version": "2"})));
        assert_eq!(
            request["options"],
            json!({"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1", "dryRun": ["All"]})
        );

        // A webhook that may have side effects is never called on a dry run.
        let mut hook = server.webhook("effects");
        hook["sideEffects"] = json!("Some");
        let error = mutate(&[configuration("config", vec![hook])], input)
            .await
            .unwrap_err();
        assert_eq!(
            error,
            AdmissionError::Denied {
                webhook: "effects.example.com".to_owned(),
                code: 400,
                message: "admission webhook \"effects.example.com\" does not support dry run"
                    .to_owned(),
            }
        );
        assert_eq!(server.calls("effects"), 0);
    }

    #[tokio::test]
    async fn a_delete_sends_the_old_object_and_no_object() {
        let server = start(&[("delete", Behaviour::Respond(json!({"allowed": true})))]).await;
        let mut hook = server.webhook("delete");
        hook["rules"][0]["operations"] = json!(["DELETE"]);
        let old = deployment(json!({}));
        let input = AdmissionInput {
            operation: Operation::Delete,
            old_object: Some(&old),
            object: Value::Null,
            ..create(json!({}))
        };
        let outcome = mutate(&[configuration("config", vec![hook])], input)
            .await
            .unwrap();
        assert_eq!(outcome.object, Value::Null);
        let request = &server.requests("delete")[0]["request"];
        assert_eq!(request["object"], Value::Null);
        assert_eq!(request["oldObject"], old);
        assert_eq!(request["options"]["kind"], "DeleteOptions");
    }

    #[tokio::test]
    async fn a_denial_is_returned_whatever_the_failure_policy() {
        let server = start(&[
            (
                "deny",
                Behaviour::Respond(json!({
                    "allowed": false,
                    "status": {"code": 422, "message": "no thanks"},
                })),
            ),
            ("bare", Behaviour::Respond(json!({"allowed": false}))),
        ])
        .await;
        let mut hook = server.webhook("deny");
        hook["failurePolicy"] = json!("Ignore");
        let error = mutate(&[configuration("config", vec![hook])], create(json!({})))
            .await
            .unwrap_err();
        assert_eq!(
            error,
            AdmissionError::Denied {
                webhook: "deny.example.com".to_owned(),
                code: 422,
                message: "admission webhook \"deny.example.com\" denied the request: no thanks"
                    .to_owned(),
            }
        );
        assert_eq!(error.code(), 422);

        let error = mutate(
            &[configuration("config", vec![server.webhook("bare")])],
            create(json!({})),
        )
        .await
        .unwrap_err();
        assert_eq!(
            error,
            AdmissionError::Denied {
                webhook: "bare.example.com".to_owned(),
                code: 403,
                message:
                    "admission webhook \"bare.example.com\" denied the request without explanation"
                        .to_owned(),
            }
        );
    }

    /// A URL on which nothing listens.
    async fn unreachable_url() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        format!("https://{addr}/gone")
    }

    #[tokio::test]
    async fn an_unreachable_webhook_follows_the_failure_policy() {
        let server = start(&[("after", label_patch("after", "yes"))]).await;
        let mut gone = server.webhook("gone");
        gone["clientConfig"]["url"] = json!(unreachable_url().await);
        gone["failurePolicy"] = json!("Ignore");
        let configs = [configuration(
            "config",
            vec![gone.clone(), server.webhook("after")],
        )];
        let outcome = mutate(&configs, create(json!({"app": "web"})))
            .await
            .unwrap();
        assert_eq!(
            outcome.object["metadata"]["labels"],
            json!({"app": "web", "after": "yes"})
        );
        assert!(
            matches!(&outcome.calls[0].result, CallResult::FailedIgnored(reason) if reason.contains("failed to call webhook")),
            "{:?}",
            outcome.calls
        );
        assert_eq!(outcome.calls[1].result, CallResult::Patched);

        gone["failurePolicy"] = json!("Fail");
        let configs = [configuration("config", vec![gone, server.webhook("after")])];
        match mutate(&configs, create(json!({}))).await.unwrap_err() {
            AdmissionError::Failed { webhook, message } => {
                assert_eq!(webhook, "gone.example.com");
                assert!(
                    message.starts_with("failed calling webhook \"gone.example.com\": "),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
        // The chain stopped at the failure.
        assert_eq!(server.calls("after"), 1);
    }

    /// Runs `hook` alone with failurePolicy Fail and returns the failure message.
    async fn failure(hook: Value) -> String {
        match mutate(&[configuration("config", vec![hook])], create(json!({}))).await {
            Err(AdmissionError::Failed { message, .. }) => {
                eprintln!("MSG {message}");
                message
            }
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_webhook_slower_than_its_timeout_fails() {
        let server = start(&[("slow", Behaviour::Sleep(Duration::from_secs(5)))]).await;
        let mut hook = server.webhook("slow");
        hook["timeoutSeconds"] = json!(1);
        let started = Instant::now();
        let message = failure(hook.clone()).await;
        assert!(started.elapsed() < Duration::from_secs(4));
        assert!(message.contains("context deadline exceeded"), "{message}");
        assert!(message.contains("?timeout=1s"), "{message}");

        hook["failurePolicy"] = json!("Ignore");
        let outcome = mutate(&[configuration("config", vec![hook])], create(json!({})))
            .await
            .unwrap();
        assert!(matches!(
            outcome.calls[0].result,
            CallResult::FailedIgnored(_)
        ));
        assert_eq!(outcome.object, deployment(json!({})));
    }

    #[tokio::test]
    async fn a_server_certificate_from_another_ca_fails() {
        let server = start(&[("tls", Behaviour::Respond(json!({"allowed": true})))]).await;
        let mut hook = server.webhook("tls");
        hook["clientConfig"]["caBundle"] = json!(bundle(&new_ca("another CA")));
        let message = failure(hook).await;
        assert!(message.contains("certificate"), "{message}");
        assert_eq!(server.calls("tls"), 0);
    }

    #[tokio::test]
    async fn the_server_name_of_the_url_is_verified() {
        let server = start_for(
            &["localhost"],
            &[("name", Behaviour::Respond(json!({"allowed": true})))],
        )
        .await;
        // The certificate is for localhost only: 127.0.0.1 is the right server by another name.
        let mut hook = server.webhook("name");
        let message = failure(hook.clone()).await;
        assert!(message.contains("certificate"), "{message}");
        assert_eq!(server.calls("name"), 0);
        let port = server.addr.port();
        hook["clientConfig"]["url"] = json!(format!("https://localhost:{port}/name"));
        mutate(&[configuration("config", vec![hook])], create(json!({})))
            .await
            .unwrap();
        assert_eq!(server.calls("name"), 1);
    }

    #[tokio::test]
    async fn a_response_with_another_uid_fails() {
        let server = start(&[("uid", Behaviour::WrongUid)]).await;
        let message = failure(server.webhook("uid")).await;
        assert!(
            message.contains("received invalid webhook response: expected response.uid="),
            "{message}"
        );
    }

    #[tokio::test]
    async fn unusable_answers_fail() {
        let server = start(&[
            ("500", Behaviour::Status(500)),
            (
                "patchtype",
                Behaviour::Respond(json!({"allowed": true, "patch": "W10="})),
            ),
            ("kind", Behaviour::Respond(json!({"allowed": true}))),
        ])
        .await;
        let message = failure(server.webhook("500")).await;
        assert!(message.contains("status 500"), "{message}");
        let message = failure(server.webhook("patchtype")).await;
        assert!(message.contains("not response.patchType"), "{message}");

        let mut hook = server.webhook("kind");
        hook["clientConfig"].as_object_mut().unwrap().remove("url");
        hook["clientConfig"]["service"] = json!({"namespace": "default", "name": "webhook"});
        let message = failure(hook).await;
        assert!(
            message.contains("clientConfig.service is not supported"),
            "{message}"
        );
    }

    #[tokio::test]
    async fn a_patch_that_does_not_apply_fails_even_when_failures_are_ignored() {
        let server = start(&[(
            "bad",
            Behaviour::Patch(json!([{"op": "replace", "path": "/spec/missing/field", "value": 1}])),
        )])
        .await;
        let mut hook = server.webhook("bad");
        hook["failurePolicy"] = json!("Ignore");
        let message = failure(hook).await;
        assert!(message.contains("does not apply"), "{message}");
    }

    #[tokio::test]
    async fn an_if_needed_webhook_is_reinvoked_after_a_later_change() {
        let server = start(&[
            ("early", label_patch("early", "yes")),
            ("late", label_patch("late", "yes")),
        ])
        .await;
        let mut early = server.webhook("early");
        early["reinvocationPolicy"] = json!("IfNeeded");
        let configs = [configuration("config", vec![early, server.webhook("late")])];
        let outcome = mutate(&configs, create(json!({}))).await.unwrap();
        assert_eq!(
            results(&outcome),
            vec![
                ("early.example.com", 0, CallResult::Patched),
                ("late.example.com", 0, CallResult::Patched),
                ("early.example.com", 1, CallResult::Unpatched),
            ]
        );
        let requests = server.requests("early");
        assert_eq!(requests.len(), 2);
        assert_eq!(
            requests[1]["request"]["object"]["metadata"]["labels"],
            json!({"early": "yes", "late": "yes"})
        );
        assert_ne!(requests[0]["request"]["uid"], requests[1]["request"]["uid"]);
        assert_eq!(server.calls("late"), 1);
    }

    #[tokio::test]
    async fn no_reinvocation_without_a_later_change() {
        let server = start(&[
            ("early", label_patch("early", "yes")),
            ("late", Behaviour::Respond(json!({"allowed": true}))),
        ])
        .await;
        let mut early = server.webhook("early");
        early["reinvocationPolicy"] = json!("IfNeeded");
        let configs = [configuration("config", vec![early, server.webhook("late")])];
        let outcome = mutate(&configs, create(json!({}))).await.unwrap();
        assert_eq!(outcome.calls.len(), 2);
        assert_eq!(server.calls("early"), 1);
    }

    #[tokio::test]
    async fn reinvocation_happens_at_most_once() {
        // Both always change the object and ask to be reinvoked.
        let server = start(&[("a", Behaviour::Count("a")), ("b", Behaviour::Count("b"))]).await;
        let mut a = server.webhook("a");
        a["reinvocationPolicy"] = json!("IfNeeded");
        let mut b = server.webhook("b");
        b["reinvocationPolicy"] = json!("IfNeeded");
        let configs = [configuration("config", vec![a, b])];
        let outcome = mutate(&configs, create(json!({}))).await.unwrap();
        // Round 0: a, b (b's change requires a). Round 1: a, whose change requires b, then b.
        assert_eq!(
            results(&outcome),
            vec![
                ("a.example.com", 0, CallResult::Patched),
                ("b.example.com", 0, CallResult::Patched),
                ("a.example.com", 1, CallResult::Patched),
                ("b.example.com", 1, CallResult::Patched),
            ]
        );
        assert_eq!(
            outcome.object["metadata"]["labels"],
            json!({"a": "2", "b": "2"})
        );
        assert_eq!(server.calls("a"), 2);
        assert_eq!(server.calls("b"), 2);
    }

    #[tokio::test]
    async fn a_selector_that_does_not_parse_fails_whatever_the_failure_policy() {
        let hook = json!({
            "name": "broken.example.com",
            "clientConfig": {"url": "https://127.0.0.1:1/"},
            "rules": [{
                "operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"],
            }],
            "objectSelector": {"matchExpressions": [{"key": "app", "operator": "Near"}]},
            "failurePolicy": "Ignore",
        });
        let configs = [configuration("config", vec![hook])];
        let input = create(json!({}));
        assert!(matching_webhooks(&configs, &input).is_empty());
        match mutate(&configs, input).await.unwrap_err() {
            AdmissionError::Failed { webhook, message } => {
                assert_eq!(webhook, "broken.example.com");
                assert!(message.contains("invalid objectSelector"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn namespace_selectors_and_scopes_of_cluster_scoped_objects() {
        let hook = |scope: &str, namespace_selector: Value| {
            json!({
                "name": format!("{scope}.example.com"),
                "clientConfig": {"url": "https://127.0.0.1:1/"},
                "rules": [{
                    "operations": ["CREATE"], "apiGroups": ["*"], "apiVersions": ["*"],
                    "resources": ["*/*"], "scope": scope,
                }],
                "namespaceSelector": namespace_selector,
            })
        };
        let selector = json!({"matchLabels": {"env": "prod"}});
        let configs = [configuration(
            "config",
            vec![
                hook("Cluster", selector.clone()),
                hook("Namespaced", selector.clone()),
                hook("*", json!({})),
            ],
        )];
        let names = |input: &AdmissionInput<'_>| -> Vec<String> {
            matching_webhooks(&configs, input)
                .into_iter()
                .map(|(_, w)| w)
                .collect()
        };
        // A Namespace is cluster-scoped and matched on its own labels as they will be stored.
        let namespace = |labels: Value| AdmissionInput {
            resource: resource("", "namespaces"),
            namespace: None,
            name: "prod",
            object: json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "prod", "labels": labels}}),
            namespace_labels: BTreeMap::new(),
            ..create(json!({}))
        };
        assert_eq!(
            names(&namespace(json!({"env": "prod"}))),
            vec!["Cluster.example.com", "*.example.com"]
        );
        assert_eq!(names(&namespace(json!({}))), vec!["*.example.com"]);
        // A namespaced object is matched on its namespace's labels.
        let in_namespace = |labels: &[(&str, &str)]| AdmissionInput {
            namespace_labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..create(json!({}))
        };
        assert_eq!(names(&in_namespace(&[])), vec!["*.example.com"]);
        assert_eq!(
            names(&in_namespace(&[("env", "prod")])),
            vec!["Namespaced.example.com", "*.example.com"]
        );
        // Other cluster-scoped objects are never excluded by a namespaceSelector.
        static CLUSTER_ROLES: ResourceInfo = ResourceInfo {
            group: "rbac.authorization.k8s.io",
            version: "v1",
            kind: "ClusterRole",
            plural: "clusterroles",
            namespaced: false,
            generation: false,
            template: None,
            verbs: &["create"],
        };
        let cluster_role = AdmissionInput {
            resource: &CLUSTER_ROLES,
            namespace: None,
            name: "reader",
            object: json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "reader"}}),
            namespace_labels: BTreeMap::new(),
            ..create(json!({}))
        };
        assert_eq!(
            names(&cluster_role),
            vec!["Cluster.example.com", "*.example.com"]
        );
        // Webhook configurations are exempt from webhooks.
        let exempt = AdmissionInput {
            resource: resource(
                "admissionregistration.k8s.io",
                "mutatingwebhookconfigurations",
            ),
            namespace: None,
            ..create(json!({}))
        };
        assert!(names(&exempt).is_empty());
    }
}

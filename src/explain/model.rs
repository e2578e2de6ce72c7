//! From what was read to the explanation: the namespace's opt-in and the webhook's selection, the
//! stamp's classification, the references, the expected stamp and the verdict by the core's rules
//! ([`rules::expected`], [`rules::decide`] as reconcile decides), the Events confighash recorded
//! and the rollout's state.
//!
//! Pure: everything comes in as [`Facts`]; nothing here reads the cluster or a clock.

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::events::v1::Event;
use serde::Serialize;
use serde_json::Value;

use crate::core::checksum::{RefState, StampKey};
use crate::core::names::KUBE_SYSTEM;
use crate::core::names::{
    DEFAULT_MAX_REFERENCE_BYTES, ENABLED_LABEL, UNSTAMPED_ANNOTATION, UNSTAMPED_LOOKUP_FAILED,
    UNSTAMPED_TOO_LARGE, UNSTAMPED_TOO_MANY_REFERENCES,
};
use crate::core::names::{PROGRESSIVE, ROLLOUT_ANNOTATION};
use crate::core::record::ObjectRecord;
use crate::core::refs::{ObjectRef, Selection};
use crate::core::rules::{self, Current, Lookup, Outcome, Trigger};
use crate::core::workload::{self, Analysis, WorkloadKind};
use crate::explain::observed::{self, EventInfo, FieldManager, RolloutInfo};
use crate::explain::select::{self, EntryMatch, NAMESPACE_NAME_LABEL, Subject};

/// The most references read for one workload: `serve`'s default `--max-references`. A workload
/// naming more is marked by the webhook and never stamped.
pub const MAX_REFERENCES_READ: usize = crate::core::names::DEFAULT_MAX_REFERENCES;

/// What reading one object gave.
#[derive(Debug, Clone)]
pub enum Read<T> {
    Found(T),
    /// NotFound.
    Absent,
    /// The user may not read it (403).
    Forbidden,
    /// Any other failure, in words that quote nothing the API server sent.
    Failed(String),
}

impl<T> Read<T> {
    pub fn found(&self) -> Option<&T> {
        match self {
            Read::Found(t) => Some(t),
            _ => None,
        }
    }

    fn state(&self) -> &'static str {
        match self {
            Read::Found(_) => "found",
            Read::Absent => "absent",
            Read::Forbidden => "forbidden",
            Read::Failed(_) => "error",
        }
    }

    fn error(&self) -> Option<String> {
        match self {
            Read::Failed(e) => Some(e.clone()),
            _ => None,
        }
    }
}

/// A referenced ConfigMap or Secret as read: what the recipe needs, and what is shown of it.
#[derive(Debug, Clone)]
pub struct RefObject {
    /// Per-key digests (or ignored), exactly as the webhook computes them.
    pub entry: ObjectRecord,
    pub resource_version: Option<String>,
    /// From `metadata.managedFields`.
    pub field_managers: Vec<FieldManager>,
    /// Annotated `confighash.dev/rollout: progressive`: its changes roll in progressive waves.
    pub progressive: bool,
}

/// Where the installation's key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyOrigin {
    /// `--key-file`.
    File(String),
    /// The key Secret (`--install-namespace`, `--key-secret`), data key `key`.
    Secret { namespace: String, name: String },
}

/// The installation's key, as far as it could be had.
#[derive(Debug, Clone)]
pub struct KeyFacts {
    pub source: KeyOrigin,
    /// `Failed` also when the Secret holds no usable key (the message says why).
    pub key: Read<StampKey>,
}

/// Everything read about one workload.
#[derive(Debug, Clone)]
pub struct Facts {
    pub kind: WorkloadKind,
    /// The kind's resource (plural) as the cluster serves it: what webhook rules name.
    pub resource: String,
    pub namespace: String,
    pub name: String,
    /// The workload as the API server returned it.
    pub object: Value,
    /// The Namespace's labels.
    pub namespace_labels: Read<BTreeMap<String, String>>,
    /// confighash's own namespace (`--install-namespace`).
    pub install_namespace: String,
    /// The name of the MutatingWebhookConfiguration (`--webhook-configuration`).
    pub webhook_name: String,
    pub webhook: Read<MutatingWebhookConfiguration>,
    pub key: KeyFacts,
    /// Every reference of the workload that was read; one missing here was not read (over
    /// [`MAX_REFERENCES_READ`]).
    pub references: BTreeMap<ObjectRef, Read<RefObject>>,
    /// The namespace's events.k8s.io/v1 Events (all of them: those about this workload that
    /// confighash recorded are picked here).
    pub events: Read<Vec<Event>>,
}

/// The answer to "why does this workload carry the stamp it carries".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// The stamp is the expected stamp.
    UpToDate,
    /// A stamp of this installation's key that differs from the expected stamp.
    Stale,
    /// No stamp.
    Unstamped,
    /// A stamp confighash keeps but does not check: another key, an unknown recipe, malformed.
    Foreign,
    /// The webhook is not called for it, or its namespace is not opted in.
    NotSelected,
    /// Labelled `confighash.dev/enabled=false`.
    OptedOut,
    /// A required reference does not exist: the stamp is kept (rule 2).
    MissingReference,
    /// The references hold more than `--max-reference-bytes`: the stamp is kept (rule 1).
    TooLarge,
    /// Not enough could be read to say.
    Unknown,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::UpToDate => "up-to-date",
            Verdict::Stale => "stale",
            Verdict::Unstamped => "unstamped",
            Verdict::Foreign => "foreign",
            Verdict::NotSelected => "not-selected",
            Verdict::OptedOut => "opted-out",
            Verdict::MissingReference => "missing-reference",
            Verdict::TooLarge => "too-large",
            Verdict::Unknown => "unknown",
        }
    }

    /// The exit status: 0 up to date, 2 when it could not be told, 1 otherwise.
    pub fn exit_code(self) -> u8 {
        match self {
            Verdict::UpToDate => 0,
            Verdict::Unknown => 2,
            _ => 1,
        }
    }
}

/// The JSON document of `confighash explain -o json` (field names are stable).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    pub verdict: Verdict,
    /// The verdict in words: why, and what happens next.
    pub reason: String,
    #[serde(rename = "namespaceOptIn")]
    pub namespace_info: NamespaceInfo,
    pub webhook: WebhookInfo,
    pub opted_out: bool,
    /// Labelled `confighash.dev/enabled=true`: handled whether or not its namespace is opted in.
    pub opted_in: bool,
    pub stamp: StampInfo,
    pub references: Vec<Reference>,
    /// Names in the extra-reference annotations that are not valid object names, left out.
    pub rejected_references: Vec<String>,
    pub key: KeyInfo,
    /// The stamp the workload should carry now, when the key and every reference could be read.
    pub expected_stamp: Option<String>,
    pub events: EventsInfo,
    pub rollout: RolloutInfo,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceInfo {
    /// `found`, `forbidden` or `error`.
    pub state: &'static str,
    /// Labelled `confighash.dev/enabled=true` (`null`: not known).
    pub opted_in: Option<bool>,
    /// The value of its `confighash.dev/enabled` label.
    pub label: Option<String>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookInfo {
    /// The MutatingWebhookConfiguration's name.
    pub configuration: String,
    /// `found`, `absent`, `forbidden` or `error`.
    pub state: &'static str,
    /// Whether it sends this workload's CREATE and UPDATE to a webhook (`null`: not known).
    pub selected: Option<bool>,
    pub entries: Vec<EntryMatch>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StampInfo {
    /// The pod template's `confighash.dev/checksum`.
    pub value: Option<String>,
    /// `current` (this installation's key, recipe v2 or v1), `foreign`, `none`, or `unverified`
    /// (well formed, but the installation's key could not be read to tell).
    pub class: &'static str,
    /// The stamp's recipe version (`v2`, `v1`, or what it says).
    pub recipe: Option<String>,
    pub key_id: Option<String>,
    /// Why it is foreign: `other-key`, `unknown-recipe` or `malformed`.
    pub foreign: Option<&'static str>,
    /// The value of the workload's `confighash.dev/unstamped` marker.
    pub marker: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reference {
    /// `ConfigMap` or `Secret`.
    pub kind: &'static str,
    pub name: String,
    /// The selected keys; `null` for the whole object.
    pub keys: Option<Vec<String>>,
    pub optional: bool,
    /// `found`, `ignored` (annotated `confighash.dev/ignore: "true"`, left out of the stamp),
    /// `absent`, `forbidden`, `error`, or `not-read`.
    pub state: &'static str,
    pub error: Option<String>,
    pub resource_version: Option<String>,
    /// How many keys the object has (found objects only).
    pub key_count: Option<usize>,
    /// The decoded bytes of its values, as `--max-reference-bytes` counts them (found objects
    /// that are not ignored).
    pub bytes: Option<u64>,
    /// Selected keys the object does not have.
    pub absent_keys: Vec<String>,
    pub field_managers: Vec<FieldManager>,
    /// Annotated `confighash.dev/rollout: progressive` (found objects only).
    pub progressive: bool,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyInfo {
    /// `file` or `secret`.
    pub source: &'static str,
    /// The key file (`--key-file`).
    pub path: Option<String>,
    /// The key Secret's namespace and name.
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// `read`, `absent`, `forbidden` or `error`.
    pub state: &'static str,
    pub key_id: Option<String>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventsInfo {
    /// `found`, `forbidden` or `error`.
    pub state: &'static str,
    /// The last few (newest last).
    pub items: Vec<EventInfo>,
    pub error: Option<String>,
}

/// Why a workload could not be explained at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {namespace}/{name} cannot be read as a workload: {message}")]
pub struct NotAWorkload {
    pub kind: WorkloadKind,
    pub namespace: String,
    pub name: String,
    pub message: String,
}

/// The references of a workload object (what [`Facts::references`] must cover), or why it is not
/// a workload.
pub fn references(
    kind: WorkloadKind,
    namespace: &str,
    name: &str,
    object: &Value,
) -> Result<Vec<ObjectRef>, NotAWorkload> {
    match workload::analyze(kind, object) {
        Ok(Analysis::Workload(info)) => Ok(info.refs.iter().map(|(r, _)| r.clone()).collect()),
        Ok(_) => Ok(Vec::new()),
        Err(e) => Err(NotAWorkload {
            kind,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            message: e.to_string(),
        }),
    }
}

/// Explains one workload.
pub fn explain(facts: &Facts) -> Result<Explanation, NotAWorkload> {
    let analysis = workload::analyze(facts.kind, &facts.object).map_err(|e| NotAWorkload {
        kind: facts.kind,
        namespace: facts.namespace.clone(),
        name: facts.name.clone(),
        message: e.to_string(),
    })?;
    let info = match &analysis {
        Analysis::Workload(info) => Some(info.as_ref()),
        _ => None,
    };
    let key = facts.key.key.found();
    let marker = facts
        .object
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(UNSTAMPED_ANNOTATION))
        .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned));
    let stamp_value = info.and_then(|i| i.stamp.clone());
    let stamp = classify(stamp_value.as_deref(), key, marker);

    let namespace_info = namespace_info(&facts.namespace_labels);
    let object_labels = string_map(facts.object.pointer("/metadata/labels"));
    let mut ns_labels = facts.namespace_labels.found().cloned();
    if let Some(labels) = ns_labels.as_mut() {
        // The API server sets it on every Namespace; selectors may name it.
        labels
            .entry(NAMESPACE_NAME_LABEL.to_owned())
            .or_insert_with(|| facts.namespace.clone());
    }
    let webhook = webhook_info(facts, ns_labels.as_ref(), &object_labels);

    let mut references = Vec::new();
    let mut unread = 0;
    if let Some(info) = info {
        for (r, spec) in info.refs.iter() {
            let read = facts.references.get(r);
            unread += usize::from(read.is_none());
            references.push(reference(r, &spec.selection, spec.optional, read));
        }
    }
    let rejected_references = info
        .map(|i| i.refs.rejected().iter().map(ToString::to_string).collect())
        .unwrap_or_default();

    // The expected stamp and the rules' decision, when everything they need was read.
    let all_read = unread == 0
        && facts
            .references
            .values()
            .all(|r| matches!(r, Read::Found(_) | Read::Absent));
    let mut expected_stamp = None;
    let mut decision = None;
    if let (Some(info), Some(key), true) = (info, key, all_read) {
        let view = Refs(&facts.references);
        let current = Current {
            stamp: info.stamp.as_deref(),
            marker: info.marker,
        };
        let with_v1 = rules::needs_v1(Trigger::Reconcile, current, key.id());
        let lookup = rules::expected(
            &view,
            Some(key),
            &facts.namespace,
            &info.refs,
            with_v1,
            DEFAULT_MAX_REFERENCE_BYTES,
        );
        if let Lookup::Resolved { expected, .. } = &lookup {
            expected_stamp = Some(expected.to_string());
        }
        decision = Some(rules::decide(
            Trigger::Reconcile,
            current,
            false,
            &lookup,
            key.id(),
            rules::Options::default(),
        ));
    }

    let gates = Gates {
        facts,
        analysis: &analysis,
        namespace: &namespace_info,
        webhook: &webhook,
    };
    let (verdict, reason) = match gates.verdict() {
        Some(v) => v,
        None => stamp_verdict(
            facts,
            &stamp,
            decision.map(|d| d.outcome),
            &references,
            unread,
        ),
    };

    Ok(Explanation {
        kind: facts.kind.kind(),
        namespace: facts.namespace.clone(),
        name: facts.name.clone(),
        verdict,
        reason,
        namespace_info,
        webhook,
        opted_out: info.is_some_and(|i| i.opted_out),
        opted_in: info.is_some_and(|i| i.opted_in),
        stamp,
        references,
        rejected_references,
        key: key_info(&facts.key),
        expected_stamp,
        events: events(facts),
        rollout: observed::rollout(facts.kind, &facts.object),
    })
}

/// The rules' view of the references read.
struct Refs<'a>(&'a BTreeMap<ObjectRef, Read<RefObject>>);

impl rules::View for Refs<'_> {
    fn state(&self, object: &ObjectRef) -> RefState<'_> {
        match self.0.get(object) {
            Some(Read::Found(o)) => crate::core::record::state_of(Some(&o.entry)),
            _ => RefState::Absent,
        }
    }
}

/// What decides the verdict before the stamp is looked at: the workload kind, the opt-out, the
/// namespace and the webhook configuration.
struct Gates<'a> {
    facts: &'a Facts,
    analysis: &'a Analysis,
    namespace: &'a NamespaceInfo,
    webhook: &'a WebhookInfo,
}

impl Gates<'_> {
    fn verdict(&self) -> Option<(Verdict, String)> {
        let facts = self.facts;
        let info = match self.analysis {
            Analysis::Workload(info) => info,
            _ => {
                return Some((
                    Verdict::NotSelected,
                    "it uses workloadRef: its pod template lives in the workload it refers to, and \
                     confighash passes it through"
                        .to_owned(),
                ));
            }
        };
        if info.opted_out {
            return Some((
                Verdict::OptedOut,
                format!(
                    "it is labelled {ENABLED_LABEL}=false: the webhook is not called for it and the \
                     watcher never touches it, so its stamp stays as it is"
                ),
            ));
        }
        let ns = facts.namespace.as_str();
        if ns == KUBE_SYSTEM || ns == facts.install_namespace {
            return Some((
                Verdict::NotSelected,
                format!(
                    "confighash never stamps workloads in {KUBE_SYSTEM} or in its own namespace \
                     ({})",
                    facts.install_namespace
                ),
            ));
        }
        if let Read::Found(config) = &facts.webhook
            && let Some(list) = select::watch_namespaces(config)
            && !list.iter().any(|n| n == ns)
        {
            return Some((
                Verdict::NotSelected,
                format!(
                    "namespace {ns} is outside confighash's --watch-namespaces ({}): nothing there \
                     is read, stamped or touched, whatever its labels",
                    list.join(", ")
                ),
            ));
        }
        if self.namespace.opted_in == Some(false) && !info.opted_in {
            return Some((
                Verdict::NotSelected,
                if self.webhook.selected == Some(true) {
                    format!(
                        "namespace {ns} is not opted in (it lacks the label {ENABLED_LABEL}=true): \
                         the webhook configuration selects it all the same, but the watcher never \
                         touches workloads of namespaces that are not opted in, so config changes \
                         roll nothing"
                    )
                } else {
                    format!(
                        "namespace {ns} is not opted in (it lacks the label {ENABLED_LABEL}=true): \
                         confighash neither stamps nor touches its workloads"
                    )
                },
            ));
        }
        let name = &facts.webhook_name;
        match (&facts.webhook, self.webhook.selected) {
            (Read::Absent, _) => Some((
                Verdict::NotSelected,
                format!(
                    "MutatingWebhookConfiguration {name} does not exist: the API server calls no \
                     confighash webhook (is confighash installed, and under this name? see \
                     --webhook-configuration)"
                ),
            )),
            (Read::Found(_), Some(false)) => Some((
                Verdict::NotSelected,
                format!(
                    "MutatingWebhookConfiguration {name} does not send this workload's CREATE and \
                     UPDATE to the webhook{}",
                    why_not_selected(&self.webhook.entries)
                ),
            )),
            _ => None,
        }
    }
}

/// Why no entry selects, in a few words per entry.
fn why_not_selected(entries: &[EntryMatch]) -> String {
    if entries.is_empty() {
        return ": it has no webhooks".to_owned();
    }
    let reasons: Vec<String> = entries
        .iter()
        .map(|e| {
            let mut why = Vec::new();
            if e.namespace_selected == Some(false) {
                why.push("its namespaceSelector does not select the namespace".to_owned());
            }
            if !e.object_selected {
                why.push("its objectSelector does not select the workload".to_owned());
            }
            let missing: Vec<&str> = select::OPERATIONS
                .into_iter()
                .filter(|op| !e.operations.iter().any(|o| o == op))
                .collect();
            if !missing.is_empty() {
                why.push(format!(
                    "its rules do not cover {} of this kind",
                    missing.join(" and ")
                ));
            }
            format!("{}: {}", e.name, why.join(", "))
        })
        .collect();
    format!(" ({})", reasons.join("; "))
}

/// The verdict once the workload is selected (or that could not be told): from the rules'
/// decision when the key and every reference were read, else from the stamp alone where that
/// suffices.
fn stamp_verdict(
    facts: &Facts,
    stamp: &StampInfo,
    outcome: Option<Outcome>,
    references: &[Reference],
    unread: usize,
) -> (Verdict, String) {
    let unstamped = || {
        (
            Verdict::Unstamped,
            unstamped_reason(stamp.marker.as_deref()),
        )
    };
    let foreign = || {
        (
            Verdict::Foreign,
            foreign_reason(stamp, facts.key.key.found()),
        )
    };
    match outcome {
        Some(Outcome::Unchanged) => {
            let recipe = if stamp.recipe.as_deref() == Some("v1") {
                "a recipe v1 stamp of this installation's key that is still right under v1 (it \
                 becomes v2 at the next config change)"
            } else {
                "made with this installation's key"
            };
            (
                Verdict::UpToDate,
                format!("the stamp is the expected stamp, {recipe}"),
            )
        }
        Some(Outcome::KeptAbsent) => {
            let absent: Vec<String> = references
                .iter()
                .filter(|r| r.state == "absent" && !r.optional)
                .map(|r| format!("{} {}", r.kind, r.name))
                .collect();
            (
                Verdict::MissingReference,
                format!(
                    "the required {} {} not exist: the stamp is kept as it is, since new pods \
                     could not start anyway; it changes once the object is created again with \
                     content other than it had when the workload was stamped",
                    absent.join(", "),
                    if absent.len() == 1 { "does" } else { "do" }
                ),
            )
        }
        Some(Outcome::KeptForeign) => foreign(),
        Some(Outcome::KeptUnstamped) => unstamped(),
        Some(Outcome::KeptTooLarge) => {
            let bytes: u64 = references.iter().filter_map(|r| r.bytes).sum();
            (
                Verdict::TooLarge,
                format!(
                    "its references hold {bytes} bytes of values, more than serve's default \
                     --max-reference-bytes ({DEFAULT_MAX_REFERENCE_BYTES}): the webhook stops \
                     reading them, keeps the stamp it has (a new workload gets \
                     {UNSTAMPED_ANNOTATION}: {UNSTAMPED_TOO_LARGE}), and the watcher does not \
                     roll it; once they shrink, the next change or reconcile stamps it"
                ),
            )
        }
        Some(Outcome::Stamped) => match stamp.class {
            "none" => unstamped(),
            "foreign" => foreign(),
            _ => (
                Verdict::Stale,
                match wave_reason(facts, references) {
                    Some(wave) => format!(
                        "the stamp was made with this installation's key but differs from the \
                         expected stamp: a referenced object changed since. {wave}"
                    ),
                    None => "the stamp was made with this installation's key but differs from \
                             the expected stamp: a referenced object changed since. The watcher \
                             touches the workload when the change window after a change closes, \
                             and its reconcile compares every workload each --resync; whether a \
                             touch is pending in the leader's memory is not visible from the API \
                             (the Events below show what was recorded)"
                        .to_owned(),
                },
            ),
        },
        // The rules never keep on error here (every reference was read) nor skip (the opt-out is
        // a gate).
        Some(Outcome::KeptOnError | Outcome::Skipped) | None => match stamp.class {
            "none" => unstamped(),
            "foreign" => foreign(),
            _ => (Verdict::Unknown, unknown_reason(facts, references, unread)),
        },
    }
}

/// Where a stale workload stands in the progressive wave of a reference, if one is marked
/// progressive: behind a wave halted on that object's current content (its `WaveHalted` Event,
/// which names the content's resourceVersion), or waiting for its batch.
fn wave_reason(facts: &Facts, references: &[Reference]) -> Option<String> {
    let progressive: Vec<&Reference> = references
        .iter()
        .filter(|r| r.progressive && r.state == "found")
        .collect();
    let first = progressive.first()?;
    let events = facts.events.found().map(Vec::as_slice).unwrap_or_default();
    for r in &progressive {
        let Some(rv) = &r.resource_version else {
            continue;
        };
        let halted =
            crate::explain::observed::wave_halted(events, r.kind, &facts.namespace, &r.name, rv);
        if let Some(note) = halted {
            return Some(format!(
                "It waits behind the halted progressive wave of {} {} ({ROLLOUT_ANNOTATION}: \
                 {PROGRESSIVE}): the watcher touches none of its dependents for this content; \
                 the object's next content change starts a new wave (a write of the workload \
                 itself is still stamped by the webhook). The WaveHalted Event: {note}",
                r.kind, r.name
            ));
        }
    }
    Some(format!(
        "{} {} rolls its dependents in progressive waves ({ROLLOUT_ANNOTATION}: {PROGRESSIVE}): \
         the watcher touches this workload when its batch comes, once every workload of the \
         batches before it finished its rollout healthy",
        first.kind, first.name
    ))
}

fn unstamped_reason(marker: Option<&str>) -> String {
    match marker {
        Some(UNSTAMPED_LOOKUP_FAILED) => format!(
            "the webhook could not read its references when it was created and marked it \
             {UNSTAMPED_ANNOTATION}: {UNSTAMPED_LOOKUP_FAILED}; the watcher's reconcile (at its \
             start and each --resync) stamps it"
        ),
        Some(UNSTAMPED_TOO_LARGE) => format!(
            "its references held more bytes than serve's --max-reference-bytes when it was \
             created, so the webhook marked it {UNSTAMPED_ANNOTATION}: {UNSTAMPED_TOO_LARGE}; the \
             watcher's reconcile (at its start, each --resync and at a change of a reference) \
             stamps it once they fit"
        ),
        Some(UNSTAMPED_TOO_MANY_REFERENCES) => format!(
            "it references more distinct ConfigMaps and Secrets than serve's --max-references, so \
             the webhook read none and marked it {UNSTAMPED_ANNOTATION}: \
             {UNSTAMPED_TOO_MANY_REFERENCES}; this is never retried while it references that many"
        ),
        Some(other) => format!(
            "it carries the marker {UNSTAMPED_ANNOTATION}: {other:?}, which asks for a stamp: the \
             watcher's reconcile stamps it"
        ),
        None => "it carries neither a stamp nor the unstamped marker: it predates confighash, or \
                 was created while the API server did not call the webhook (confighash down or \
                 unreachable, failurePolicy Ignore). It is stamped at its next config change, \
                 when the watcher touches it, or at a `kubectl rollout restart`"
            .to_owned(),
    }
}

fn foreign_reason(stamp: &StampInfo, key: Option<&StampKey>) -> String {
    let why = match (stamp.foreign, stamp.key_id.as_deref()) {
        (Some("other-key"), Some(crate::core::checksum::PLAIN_KEY_ID)) => {
            "it is a stamp made without a key (`confighash stamp` without --key-file), not by this \
             installation"
                .to_owned()
        }
        (Some("other-key"), Some(id)) => match key {
            Some(key) => format!(
                "it was made with key {id}, not with this installation's key {} (the key was \
                 replaced, or the stamp came from elsewhere)",
                key.id()
            ),
            None => format!("it was made with key {id}, not with this installation's key"),
        },
        (Some("unknown-recipe"), _) => format!(
            "its recipe {} is not one this version of confighash knows",
            stamp.recipe.as_deref().unwrap_or("?")
        ),
        _ => "it is not of the form <recipe>:<key id>:<64 lowercase hex digits>".to_owned(),
    };
    format!(
        "{why}. confighash keeps such a stamp as it is: it is replaced at the next config change \
         the watcher acts on, or at a `kubectl rollout restart`"
    )
}

fn unknown_reason(facts: &Facts, references: &[Reference], unread: usize) -> String {
    let mut why = Vec::new();
    match (&facts.key.source, &facts.key.key) {
        (_, Read::Found(_)) => {}
        (KeyOrigin::Secret { namespace, name }, Read::Forbidden) => why.push(format!(
            "comparing the stamp needs read access (get) to the key Secret {namespace}/{name}, or \
             the key given with --key-file"
        )),
        (KeyOrigin::Secret { namespace, name }, Read::Absent) => why.push(format!(
            "the key Secret {namespace}/{name} does not exist (is confighash installed in \
             namespace {namespace}? see --install-namespace and --key-secret); comparing the \
             stamp needs the installation's key"
        )),
        (_, Read::Failed(e)) => why.push(format!("the key could not be had: {e}")),
        (KeyOrigin::File(path), _) => why.push(format!("the key file {path} could not be read")),
    }
    if unread > 0 {
        why.push(format!(
            "it references more than {MAX_REFERENCES_READ} objects, which were not read"
        ));
    }
    for r in references {
        match r.state {
            "forbidden" => why.push(format!(
                "reading {} {} needs read access (get {}s in namespace {})",
                r.kind,
                r.name,
                r.kind.to_ascii_lowercase(),
                facts.namespace
            )),
            "error" => why.push(format!(
                "reading {} {} failed: {}",
                r.kind,
                r.name,
                r.error.as_deref().unwrap_or("")
            )),
            _ => {}
        }
    }
    format!(
        "the expected stamp could not be computed: {}",
        why.join("; ")
    )
}

/// Classifies a stamp: against the installation's key when it is known, by its form alone when
/// not.
pub fn classify(value: Option<&str>, key: Option<&StampKey>, marker: Option<String>) -> StampInfo {
    let mut info = StampInfo {
        value: value.map(str::to_owned),
        class: "none",
        recipe: None,
        key_id: None,
        foreign: None,
        marker,
    };
    let Some(value) = value else {
        return info;
    };
    let parts = value.split_once(':').and_then(|(version, rest)| {
        let (key_id, digest) = rest.split_once(':')?;
        Some((version, key_id, digest))
    });
    let well_formed = parts.filter(|(version, key_id, digest)| {
        let hex =
            |s: &str, n| s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        !version.is_empty()
            && (*key_id == crate::core::checksum::PLAIN_KEY_ID || hex(key_id, 8))
            && hex(digest, 64)
    });
    let Some((version, key_id, _)) = well_formed else {
        info.class = "foreign";
        info.foreign = Some("malformed");
        return info;
    };
    info.recipe = Some(version.to_owned());
    info.key_id = Some(key_id.to_owned());
    if !matches!(version, "v1" | "v2") {
        info.class = "foreign";
        info.foreign = Some("unknown-recipe");
        return info;
    }
    let current = match key {
        Some(key) => crate::core::checksum::is_current(value, key.id()),
        // An installation always has a key: a plain stamp is never its own.
        None if key_id == crate::core::checksum::PLAIN_KEY_ID => false,
        None => {
            info.class = "unverified";
            return info;
        }
    };
    if current {
        info.class = "current";
    } else {
        info.class = "foreign";
        info.foreign = Some("other-key");
    }
    info
}

fn namespace_info(labels: &Read<BTreeMap<String, String>>) -> NamespaceInfo {
    let label = labels.found().and_then(|l| l.get(ENABLED_LABEL).cloned());
    NamespaceInfo {
        // A workload was found in it, so the Namespace exists: NotFound is a failure here.
        state: match labels {
            Read::Absent => "error",
            other => other.state(),
        },
        opted_in: labels.found().map(|_| label.as_deref() == Some("true")),
        label,
        error: match labels {
            Read::Absent => Some("the Namespace was not found".to_owned()),
            other => other.error(),
        },
    }
}

fn webhook_info(
    facts: &Facts,
    namespace_labels: Option<&BTreeMap<String, String>>,
    object_labels: &BTreeMap<String, String>,
) -> WebhookInfo {
    let (entries, selected) = match &facts.webhook {
        Read::Found(config) => {
            let entries = select::entries(
                config,
                Subject {
                    kind: facts.kind,
                    resource: &facts.resource,
                    namespace_labels,
                    object_labels,
                },
            );
            let selected = select::selected(&entries);
            (entries, selected)
        }
        Read::Absent => (Vec::new(), Some(false)),
        _ => (Vec::new(), None),
    };
    WebhookInfo {
        configuration: facts.webhook_name.clone(),
        state: facts.webhook.state(),
        selected,
        entries,
        error: facts.webhook.error(),
    }
}

fn reference(
    r: &ObjectRef,
    selection: &Selection,
    optional: bool,
    read: Option<&Read<RefObject>>,
) -> Reference {
    let keys = match selection {
        Selection::Whole => None,
        Selection::Keys(keys) => Some(keys.iter().cloned().collect::<Vec<_>>()),
    };
    let mut reference = Reference {
        kind: r.kind.as_str(),
        name: r.name.clone(),
        keys,
        optional,
        state: read.map_or("not-read", Read::state),
        error: read.and_then(Read::error),
        resource_version: None,
        key_count: None,
        bytes: None,
        absent_keys: Vec::new(),
        field_managers: Vec::new(),
        progressive: false,
    };
    if let Some(Read::Found(object)) = read {
        reference.resource_version = object.resource_version.clone();
        reference.progressive = object.progressive;
        reference.field_managers = object.field_managers.clone();
        if object.entry.ignored {
            reference.state = "ignored";
        } else {
            use crate::core::checksum::Entries;
            reference.key_count = Some(object.entry.digest.len());
            reference.bytes = Some(object.entry.digest.bytes());
            reference.absent_keys = reference
                .keys
                .iter()
                .flatten()
                .filter(|k| object.entry.digest.entry(k).is_none())
                .cloned()
                .collect();
        }
    }
    reference
}

fn key_info(key: &KeyFacts) -> KeyInfo {
    let (source, path, namespace, name) = match &key.source {
        KeyOrigin::File(path) => ("file", Some(path.clone()), None, None),
        KeyOrigin::Secret { namespace, name } => {
            ("secret", None, Some(namespace.clone()), Some(name.clone()))
        }
    };
    KeyInfo {
        source,
        path,
        namespace,
        name,
        state: match &key.key {
            Read::Found(_) => "read",
            other => other.state(),
        },
        key_id: key.key.found().map(|k| k.id().to_owned()),
        error: key.key.error(),
    }
}

fn events(facts: &Facts) -> EventsInfo {
    let items = match &facts.events {
        Read::Found(events) => {
            observed::recorded_events(events, facts.kind, &facts.namespace, &facts.name)
        }
        _ => Vec::new(),
    };
    EventsInfo {
        state: facts.events.state(),
        items,
        error: facts.events.error(),
    }
}

/// A map of strings at `value` (labels); anything else reads as empty.
fn string_map(value: Option<&Value>) -> BTreeMap<String, String> {
    value
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
        .collect()
}

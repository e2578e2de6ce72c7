//! `confighash diff`: which workloads a change to rendered manifests will roll.
//!
//! Both sides are read as `stamp` reads its input (the same YAML, lists and namespaces), and
//! each workload's stamp is computed on each side with the same recipe and rules
//! ([`rules::expected_stamp`] over the side's ConfigMaps and Secrets), so the answer is the
//! webhook's. Objects are matched by (namespace, kind, name).
//!
//! At the edges, as the webhook would see the change applied to a cluster that holds the base:
//! - a referenced object in neither side is outside the manifests: assumed unchanged, and listed;
//! - a required reference present in base and removed in head keeps the stamp (rule 2);
//! - a workload only in head may roll once it exists (its earlier state is not knowable here);
//! - pod templates are compared as written, without the stamp annotation: a value the server
//!   would fill in by default counts as a change;
//! - a CronJob's change reaches its next Job; `OnDelete` and paused workloads get the new stamp,
//!   but their pods do not roll by themselves.
//!
//! Secret values never reach the output: only key names.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde_json::{Value, json};

use super::{
    Input, InputError, NamespaceOfInput, Options, Source, error, named, object, read_input,
    required_namespace,
};
use crate::core::checksum::{Entries, RefState};
use crate::core::names::{CHECKSUM_ANNOTATION, ENABLED_LABEL, IGNORE_ANNOTATION};
use crate::core::record::ObjectRecord;
use crate::core::refs::{ObjectRef, References, Selection};
use crate::core::rules::{self, View};
use crate::core::workload::{self, Analysis, WorkloadKind};

/// How to print the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Text,
    Json,
    Markdown,
}

/// What a change does to one workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    /// It exists in base and will roll.
    Rolls,
    /// Only in head: it may roll once created over an existing one.
    Added,
    /// Something it references changed, but nothing it reads: it does not roll.
    DoesNotRoll,
    /// Only in base.
    Removed,
}

impl Verdict {
    fn as_str(self) -> &'static str {
        match self {
            Verdict::Rolls => "rolls",
            Verdict::Added => "added",
            Verdict::DoesNotRoll => "does-not-roll",
            Verdict::Removed => "removed",
        }
    }
}

/// One workload's line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub namespace: String,
    pub kind: WorkloadKind,
    pub name: String,
    pub verdict: Verdict,
    /// Why, one item each: the pod template, a config object and its keys.
    pub reasons: Vec<String>,
    /// How the roll happens where it is not the usual one.
    pub note: Option<&'static str>,
}

/// The whole report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub entries: Vec<Entry>,
    /// Referenced objects in neither side: assumed unchanged.
    pub outside: Vec<String>,
    pub warnings: Vec<String>,
}

impl Report {
    /// Whether a workload that exists in base rolls (the command's exit status 1).
    pub fn rolls(&self) -> bool {
        self.entries.iter().any(|e| e.verdict == Verdict::Rolls)
    }
}

struct Workload {
    kind: WorkloadKind,
    namespace: String,
    name: String,
    refs: References,
    /// The pod template without the stamp annotation.
    template: Value,
    note: Option<&'static str>,
}

/// The workloads of one side, by (namespace, kind, name); opted-out workloads are left out.
fn workloads(
    sources: &[Source],
    input: &Input<'_>,
    options: &Options,
) -> Result<BTreeMap<(String, &'static str, String), Workload>, InputError> {
    let mut out = BTreeMap::new();
    for &place in &input.places {
        let obj = object(&input.docs, place);
        let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
        let Some(kind) = options.kinds.from_type(api_version, kind) else {
            continue;
        };
        let doc = &input.docs[place.doc];
        let opted_out = obj
            .pointer("/metadata/labels")
            .and_then(|l| l.get(ENABLED_LABEL))
            .and_then(Value::as_str)
            == Some("false");
        if opted_out {
            continue;
        }
        let info = match workload::analyze(kind, &obj) {
            Ok(Analysis::Workload(info)) => info,
            Ok(Analysis::WorkloadRef | Analysis::Unsupported) => continue,
            // Left as it is by `stamp`, passed through by the webhook: it never rolls.
            Err(e) if !kind.is_built_in() && e.is_no_template() => continue,
            Err(e) => {
                return Err(error(sources, doc, format!("{}: {e}", named(kind, &obj))));
            }
        };
        let name = info.name.clone().unwrap_or_default();
        let namespace = required_namespace(&obj, options, kind.kind(), &name)
            .map_err(|m| error(sources, doc, m))?;
        let mut template = workload::template(kind, &obj)
            .ok()
            .flatten()
            .cloned()
            .unwrap_or(Value::Null);
        if let Some(Value::Object(annotations)) = template.pointer_mut("/metadata/annotations") {
            annotations.remove(CHECKSUM_ANNOTATION);
            if annotations.is_empty() {
                template["metadata"]
                    .as_object_mut()
                    .map(|m| m.remove("annotations"));
            }
        }
        let note = match kind {
            WorkloadKind::CRON_JOB => Some("the next Job uses the new config"),
            _ if obj.pointer("/spec/paused") == Some(&Value::Bool(true)) => {
                Some("paused: the stamp changes, its pods do not roll by themselves")
            }
            _ if obj
                .pointer("/spec/updateStrategy/type")
                .and_then(Value::as_str)
                == Some("OnDelete") =>
            {
                Some("OnDelete: the stamp changes, its pods do not roll by themselves")
            }
            _ => None,
        };
        out.insert(
            (namespace.clone(), kind.kind(), name.clone()),
            Workload {
                kind,
                namespace,
                name,
                refs: info.refs,
                template,
                note,
            },
        );
    }
    Ok(out)
}

/// The entries of an object, by key: tag and digest (not the value).
fn entries(record: &ObjectRecord) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    record.digest.for_each_entry(&mut |key, tag, digest| {
        out.insert(key.to_owned(), format!("{tag:?}{digest:?}"));
    });
    out
}

/// How a referenced object differs between the sides, for one workload.
enum ObjectChange {
    Same,
    /// Keys it reads changed (added, removed or changed).
    Read(Vec<String>),
    /// Content changed in keys it does not read.
    Unread(Vec<String>),
    /// Its metadata only (labels, annotations): no key changed.
    Metadata,
    /// Removed in head (a required reference: rule 2 keeps the stamp).
    Removed,
    Added,
    /// Ignored on one side and not on the other.
    Ignored,
    /// Ignored on both sides, and changed.
    IgnoredChanged,
}

fn compare(
    base: &Input<'_>,
    head: &Input<'_>,
    namespace: &str,
    object_ref: &ObjectRef,
    selection: &Selection,
) -> ObjectChange {
    let key = (namespace.to_owned(), object_ref.clone());
    let (b, h) = (base.configs.get(&key), head.configs.get(&key));
    match (b, h) {
        (None, None) => ObjectChange::Same,
        (Some(_), None) => ObjectChange::Removed,
        (None, Some(_)) => ObjectChange::Added,
        (Some(b), Some(h)) => {
            if b.record.ignored != h.record.ignored {
                return ObjectChange::Ignored;
            }
            if b.record.ignored {
                let same = object(&base.docs, b.place) == object(&head.docs, h.place);
                return if same {
                    ObjectChange::Same
                } else {
                    ObjectChange::IgnoredChanged
                };
            }
            let (be, he) = (entries(&b.record), entries(&h.record));
            let changed: BTreeSet<&String> = be
                .keys()
                .chain(he.keys())
                .filter(|k| be.get(*k) != he.get(*k))
                .collect();
            if changed.is_empty() {
                let same = object(&base.docs, b.place) == object(&head.docs, h.place);
                return if same {
                    ObjectChange::Same
                } else {
                    ObjectChange::Metadata
                };
            }
            let reads = |k: &str| match selection {
                Selection::Whole => true,
                Selection::Keys(keys) => keys.contains(k),
            };
            let (read, unread): (Vec<&String>, Vec<&String>) =
                changed.into_iter().partition(|k| reads(k));
            if read.is_empty() {
                ObjectChange::Unread(unread.into_iter().cloned().collect())
            } else {
                ObjectChange::Read(read.into_iter().cloned().collect())
            }
        }
    }
}

/// Which workloads rolling `base` forward to `head` rolls.
pub fn diff(base: &[Source], head: &[Source], options: &Options) -> Result<Report, InputError> {
    let options = Options {
        key: None,
        explain: false,
        ..options.clone()
    };
    let base_input = read_input(base, &options)?;
    let head_input = read_input(head, &options)?;
    let base_workloads = workloads(base, &base_input, &options)?;
    let head_workloads = workloads(head, &head_input, &options)?;
    let mut report = Report::default();
    for (side, input) in [("base", &base_input), ("head", &head_input)] {
        report
            .warnings
            .extend(input.warnings.iter().map(|w| format!("{side}: {w}")));
    }
    let mut outside = BTreeSet::new();
    for (key, h) in &head_workloads {
        let Some(b) = base_workloads.get(key) else {
            report.entries.push(Entry {
                namespace: h.namespace.clone(),
                kind: h.kind,
                name: h.name.clone(),
                verdict: Verdict::Added,
                reasons: vec!["new in head: it may roll once it exists".into()],
                note: None,
            });
            continue;
        };
        let ns = &h.namespace;
        let base_view = NamespaceOfInput {
            configs: &base_input.configs,
            namespace: ns,
        };
        let head_view = NamespaceOfInput {
            configs: &head_input.configs,
            namespace: ns,
        };
        let base_stamp = rules::expected_stamp(&base_view, None, ns, &b.refs);
        let head_stamp = rules::expected_stamp(&head_view, None, ns, &h.refs);
        // Rule 2: a required reference absent in head keeps the stamp.
        let kept = h.refs.iter().any(|(r, spec)| {
            !spec.optional
                && matches!(head_view.state(r), RefState::Absent)
                && base_input.configs.contains_key(&(ns.clone(), r.clone()))
        });
        let template_changed = b.template != h.template;
        // What changed in the config it reads (which moves the stamp), and what changed that
        // it does not read.
        let mut reasons = Vec::new();
        let mut unread = Vec::new();
        if b.refs != h.refs && !template_changed {
            reasons.push("its references changed".to_owned());
        }
        config_changes(
            (&base_input, &head_input),
            ns,
            &h.refs,
            &mut reasons,
            &mut unread,
            &mut outside,
        );
        let stamp_changes = !kept && base_stamp != head_stamp;
        let verdict = if template_changed || stamp_changes {
            Verdict::Rolls
        } else if !unread.is_empty() {
            Verdict::DoesNotRoll
        } else {
            continue;
        };
        let reasons = match verdict {
            Verdict::DoesNotRoll => unread,
            // Rolls for its template alone: config changes that did not move the stamp are noise.
            _ if !stamp_changes => vec!["its pod template changed".to_owned()],
            _ if template_changed => std::iter::once("its pod template changed".to_owned())
                .chain(reasons)
                .collect(),
            _ => reasons,
        };
        report.entries.push(Entry {
            namespace: ns.clone(),
            kind: h.kind,
            name: h.name.clone(),
            verdict,
            reasons,
            note: if verdict == Verdict::Rolls {
                h.note
            } else {
                None
            },
        });
    }
    for (key, b) in &base_workloads {
        if !head_workloads.contains_key(key) {
            report.entries.push(Entry {
                namespace: b.namespace.clone(),
                kind: b.kind,
                name: b.name.clone(),
                verdict: Verdict::Removed,
                reasons: vec!["removed in head".into()],
                note: None,
            });
        }
    }
    report.entries.sort_by(|a, b| {
        (a.verdict, &a.namespace, a.kind.kind(), &a.name).cmp(&(
            b.verdict,
            &b.namespace,
            b.kind.kind(),
            &b.name,
        ))
    });
    report.outside = outside.into_iter().collect();
    Ok(report)
}

/// What changed in each referenced object between base and head: what moves the stamp goes to
/// `reasons`, what it does not read to `unread`, and objects in neither input to `outside`.
fn config_changes(
    (base_input, head_input): (&Input, &Input),
    ns: &String,
    refs: &References,
    reasons: &mut Vec<String>,
    unread: &mut Vec<String>,
    outside: &mut BTreeSet<String>,
) {
    for (r, spec) in refs.iter() {
        let what = format!("{} {}", r.kind.as_str(), r.name);
        let keys = |keys: &[String]| {
            let shown: Vec<&str> = keys.iter().map(String::as_str).collect();
            shown.join(", ")
        };
        match compare(base_input, head_input, ns, r, &spec.selection) {
            ObjectChange::Same => {
                if !base_input.configs.contains_key(&(ns.clone(), r.clone()))
                    && !head_input.configs.contains_key(&(ns.clone(), r.clone()))
                {
                    outside.insert(format!("{what} in {ns}"));
                }
            }
            ObjectChange::Read(k) => reasons.push(format!("{what}: keys {}", keys(&k))),
            ObjectChange::Added => reasons.push(format!("{what}: added")),
            ObjectChange::Ignored => reasons.push(format!("{what}: its ignore annotation changed")),
            ObjectChange::Removed if spec.optional => {
                reasons.push(format!("{what}: removed (an optional reference)"))
            }
            ObjectChange::Removed => unread.push(format!(
                "{what}: removed; a required reference that is absent keeps the stamp"
            )),
            ObjectChange::Unread(k) => unread.push(format!(
                "{what}: keys it does not read changed ({})",
                keys(&k)
            )),
            ObjectChange::IgnoredChanged => unread.push(format!(
                "{what}: ignored ({IGNORE_ANNOTATION}): its changes never roll"
            )),
            ObjectChange::Metadata => {
                unread.push(format!("{what}: its metadata changed, not its data"))
            }
        }
    }
}

/// The report as text, JSON or Markdown (for a pull-request comment).
pub fn render(report: &Report, format: Format) -> String {
    let mut out = String::new();
    match format {
        Format::Json => {
            let entries: Vec<Value> = report
                .entries
                .iter()
                .map(|e| {
                    json!({
                        "namespace": e.namespace,
                        "kind": e.kind.kind(),
                        "name": e.name,
                        "verdict": e.verdict.as_str(),
                        "reasons": e.reasons,
                        "note": e.note,
                    })
                })
                .collect();
            out = serde_json::to_string_pretty(&json!({
                "rolls": report.rolls(),
                "workloads": entries,
                "outside": report.outside,
            }))
            .unwrap_or_default();
            out.push('\n');
        }
        Format::Text => {
            if report.entries.is_empty() {
                out.push_str("no workload rolls\n");
            }
            for e in &report.entries {
                let _ = writeln!(
                    out,
                    "{} {}/{}: {}",
                    e.kind,
                    e.namespace,
                    e.name,
                    e.verdict.as_str()
                );
                for r in &e.reasons {
                    let _ = writeln!(out, "  {r}");
                }
                if let Some(note) = e.note {
                    let _ = writeln!(out, "  ({note})");
                }
            }
            for o in &report.outside {
                let _ = writeln!(out, "outside the manifests, assumed unchanged: {o}");
            }
        }
        Format::Markdown => {
            let rolling = report
                .entries
                .iter()
                .filter(|e| e.verdict == Verdict::Rolls)
                .count();
            let _ = writeln!(
                out,
                "### confighash: {} workload{} will roll\n",
                rolling,
                if rolling == 1 { "" } else { "s" }
            );
            if !report.entries.is_empty() {
                out.push_str("| Workload | Namespace | What happens | Why |\n|---|---|---|---|\n");
                for e in &report.entries {
                    let mut why = e.reasons.join("; ");
                    if let Some(note) = e.note {
                        why.push_str(&format!(" ({note})"));
                    }
                    let _ = writeln!(
                        out,
                        "| {} {} | {} | {} | {} |",
                        e.kind,
                        markdown(&e.name),
                        markdown(&e.namespace),
                        e.verdict.as_str(),
                        markdown(&why)
                    );
                }
            }
            if !report.outside.is_empty() {
                let _ = writeln!(
                    out,
                    "\nOutside the manifests, assumed unchanged: {}",
                    markdown(&report.outside.join(", "))
                );
            }
        }
    }
    out
}

/// Text for a Markdown table cell: pipes and markup escaped.
fn markdown(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '|' | '\\' | '`' | '*' | '_' | '<' | '>' | '[' | ']') {
            out.push('\\');
        }
        if c == '\n' {
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    out
}

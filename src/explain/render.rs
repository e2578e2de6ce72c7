//! The text forms: one workload's explanation, and the table of many.

use std::fmt::Write as _;

use serde::Serialize;

use crate::core::names::{CHECKSUM_ANNOTATION, ENABLED_LABEL};
use crate::explain::model::{Explanation, Reference, Verdict};
use crate::explain::observed::RolloutInfo;

/// One line of the table of `confighash explain -A` (and of `-n NS` without a workload).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    pub namespace: String,
    pub kind: &'static str,
    pub name: String,
    pub verdict: Verdict,
    /// The pod template's stamp, if any.
    pub stamp: Option<String>,
    /// The `confighash.dev/unstamped` marker's value, if any.
    pub marker: Option<String>,
    pub reason: String,
}

impl Row {
    pub fn of(e: &Explanation) -> Self {
        Row {
            namespace: e.namespace.clone(),
            kind: e.kind,
            name: e.name.clone(),
            verdict: e.verdict,
            stamp: e.stamp.value.clone(),
            marker: e.stamp.marker.clone(),
            reason: e.reason.clone(),
        }
    }
}

/// The table: NAMESPACE KIND NAME VERDICT STAMP, columns aligned. Stamps are shortened to their
/// recipe, key id and first 12 hex digits.
pub fn table(rows: &[Row]) -> String {
    let cells: Vec<[String; 5]> = rows
        .iter()
        .map(|r| {
            let stamp = match (&r.stamp, &r.marker) {
                (Some(s), _) => shown(&short_stamp(s)),
                (None, Some(m)) => format!("<none> (marker {})", shown(m)),
                (None, None) => "<none>".to_owned(),
            };
            [
                r.namespace.clone(),
                r.kind.to_owned(),
                r.name.clone(),
                r.verdict.as_str().to_owned(),
                stamp,
            ]
        })
        .collect();
    let header = ["NAMESPACE", "KIND", "NAME", "VERDICT", "STAMP"].map(str::to_owned);
    let mut widths = header.clone().map(|h| h.len());
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&cells) {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}   ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `v2:3eb1bd43:d66b2e3ea36b…` of a well-formed stamp; anything else as it is, cut at 40
/// characters.
fn short_stamp(stamp: &str) -> String {
    match stamp.rsplit_once(':') {
        Some((head, digest)) if digest.len() == 64 && digest.is_ascii() => {
            format!("{head}:{}…", &digest[..12])
        }
        _ if stamp.chars().count() > 40 => {
            format!("{}…", stamp.chars().take(40).collect::<String>())
        }
        _ => stamp.to_owned(),
    }
}

/// A value read from the cluster, with control characters (line breaks, terminal escapes)
/// escaped, so that it cannot break or fake a line of the output.
fn shown(s: &str) -> String {
    if s.chars().any(char::is_control) {
        s.chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect()
    } else {
        s.to_owned()
    }
}

fn yes_no(b: Option<bool>, yes: &str, no: &str, unknown: &str) -> String {
    match b {
        Some(true) => yes.to_owned(),
        Some(false) => no.to_owned(),
        None => unknown.to_owned(),
    }
}

/// One workload's explanation as text.
/// The explanation as text: one section after another.
pub fn text(e: &Explanation) -> String {
    let sections: [fn(&mut String, &Explanation); 9] = [
        verdict,
        namespace,
        webhook,
        workload,
        stamp,
        references,
        key,
        events,
        |w, e| {
            let _ = writeln!(w, "  rollout: {}", rollout(&e.rollout));
        },
    ];
    let mut out = String::new();
    for section in sections {
        section(&mut out, e);
    }
    out
}

/// The workload, its verdict and why.
fn verdict(w: &mut String, e: &Explanation) {
    let _ = writeln!(w, "{} {}/{}", e.kind, e.namespace, e.name);
    let _ = writeln!(w, "  verdict: {}", e.verdict.as_str());
    let _ = writeln!(w, "    {}", shown(&e.reason));
}

/// Whether its namespace is opted in.
fn namespace(w: &mut String, e: &Explanation) {
    let ns = &e.namespace_info;
    let opt_in = match (ns.opted_in, &ns.label) {
        (Some(true), _) => format!("opted in ({ENABLED_LABEL}=true)"),
        (Some(false), Some(v)) => format!("not opted in ({ENABLED_LABEL}={}, not true)", shown(v)),
        (Some(false), None) => format!("not opted in (no label {ENABLED_LABEL})"),
        (None, _) => format!(
            "not known: {}",
            match ns.state {
                "forbidden" => "reading the Namespace is forbidden".to_owned(),
                _ => shown(ns.error.as_deref().unwrap_or("")),
            }
        ),
    };
    let _ = writeln!(w, "  namespace {}: {opt_in}", e.namespace);
}

/// Whether the webhook configuration selects it, entry by entry.
fn webhook(w: &mut String, e: &Explanation) {
    let hook = &e.webhook;
    let state = match hook.state {
        "found" => yes_no(
            hook.selected,
            "selects this workload",
            "does not select this workload",
            "may select this workload (the namespace's labels could not be read)",
        ),
        "absent" => "does not exist".to_owned(),
        "forbidden" => "not known: reading it is forbidden".to_owned(),
        _ => format!("not known: {}", shown(hook.error.as_deref().unwrap_or(""))),
    };
    let _ = writeln!(
        w,
        "  webhook: MutatingWebhookConfiguration {} {state}",
        hook.configuration
    );
    for entry in &hook.entries {
        let ops = if entry.operations.is_empty() {
            "neither CREATE nor UPDATE".to_owned()
        } else {
            entry.operations.join(" and ")
        };
        let _ = writeln!(
            w,
            "    {}: namespaceSelector {}, objectSelector {}, rules cover {ops} of this kind",
            entry.name,
            yes_no(
                entry.namespace_selected,
                "selects the namespace",
                "does not select the namespace",
                "not evaluated",
            ),
            yes_no(
                Some(entry.object_selected),
                "selects the workload",
                "does not select the workload",
                "",
            ),
        );
        for note in &entry.notes {
            let _ = writeln!(w, "      note: {}", shown(note));
        }
    }
}

/// Whether the workload opts out or in by its own label.
fn workload(w: &mut String, e: &Explanation) {
    let _ = writeln!(
        w,
        "  workload: {}",
        if e.opted_out {
            format!("opted out ({ENABLED_LABEL}=false)")
        } else if e.opted_in {
            format!(
                "opted in ({ENABLED_LABEL}=true): handled whether or not its namespace is opted in"
            )
        } else {
            "not opted out".to_owned()
        }
    );
}

/// The stamp it carries, and its marker.
fn stamp(w: &mut String, e: &Explanation) {
    let s = &e.stamp;
    let value = shown(s.value.as_deref().unwrap_or(""));
    let recipe = shown(s.recipe.as_deref().unwrap_or(""));
    let key_id = shown(s.key_id.as_deref().unwrap_or(""));
    let what = match (s.class, s.foreign) {
        ("none", _) => "none".to_owned(),
        ("current", _) => format!(
            "{} (current: this installation's key {}, recipe {})",
            value, key_id, recipe
        ),
        ("unverified", _) => format!(
            "{} (key {}, recipe {}; not checked: the installation's key is not known)",
            value, key_id, recipe
        ),
        (_, Some("other-key")) => format!(
            "{} (foreign: key {} is not this installation's)",
            value, key_id
        ),
        (_, Some("unknown-recipe")) => format!("{} (foreign: unknown recipe {})", value, recipe),
        _ => format!(
            "{:?} (foreign: malformed)",
            s.value.as_deref().unwrap_or("")
        ),
    };
    let _ = writeln!(w, "  stamp ({CHECKSUM_ANNOTATION}): {what}");
    if let Some(marker) = &s.marker {
        let _ = writeln!(w, "  marker (confighash.dev/unstamped): {}", shown(marker));
    }
}

/// Its references, as read.
fn references(w: &mut String, e: &Explanation) {
    if e.references.is_empty() {
        let _ = writeln!(w, "  references: none");
    } else {
        let _ = writeln!(w, "  references:");
        for r in &e.references {
            reference(w, r);
        }
    }
    for name in &e.rejected_references {
        let _ = writeln!(
            w,
            "    {name:?} in an extra-reference annotation is not a valid name, left out"
        );
    }
}

/// The installation's key and the expected stamp.
fn key(w: &mut String, e: &Explanation) {
    let k = &e.key;
    let key_place = match k.source {
        "file" => format!("key file {}", shown(k.path.as_deref().unwrap_or(""))),
        _ => format!(
            "key Secret {}/{}",
            k.namespace.as_deref().unwrap_or(""),
            k.name.as_deref().unwrap_or("")
        ),
    };
    let key_state = match k.state {
        "read" => format!("key id {}", k.key_id.as_deref().unwrap_or("")),
        "forbidden" => "reading it is forbidden: comparing the stamp needs read access to it (or \
                        --key-file)"
            .to_owned(),
        "absent" => "does not exist".to_owned(),
        _ => shown(k.error.as_deref().unwrap_or("")),
    };
    let _ = writeln!(w, "  key: {key_place}: {key_state}");
    let _ = writeln!(
        w,
        "  expected stamp: {}",
        e.expected_stamp.as_deref().unwrap_or("not known")
    );
}

/// The Events confighash recorded on it.
fn events(w: &mut String, e: &Explanation) {
    match e.events.state {
        "found" if e.events.items.is_empty() => {
            let _ = writeln!(w, "  events recorded by confighash: none");
        }
        "found" => {
            let _ = writeln!(w, "  events recorded by confighash (newest last):");
            for ev in &e.events.items {
                let count = ev.count.map(|c| format!(" (x{c})")).unwrap_or_default();
                let _ = writeln!(
                    w,
                    "    {} {} {}{count}: {}",
                    shown(ev.time.as_deref().unwrap_or("-")),
                    shown(ev.type_.as_deref().unwrap_or("-")),
                    shown(&ev.reason),
                    shown(ev.note.as_deref().unwrap_or(""))
                );
            }
        }
        "forbidden" => {
            let _ = writeln!(
                w,
                "  events recorded by confighash: not known (listing events.k8s.io Events is forbidden)"
            );
        }
        _ => {
            let _ = writeln!(
                w,
                "  events recorded by confighash: not known ({})",
                shown(e.events.error.as_deref().unwrap_or(""))
            );
        }
    }
}

fn reference(w: &mut String, r: &Reference) {
    let selection = match &r.keys {
        None => "whole object".to_owned(),
        Some(keys) => format!("keys {}", keys.join(", ")),
    };
    let need = if r.optional { "optional" } else { "required" };
    let state = match r.state {
        "found" => {
            let mut s = format!(
                "found, {}",
                match r.key_count {
                    Some(1) => "1 key".to_owned(),
                    Some(n) => format!("{n} keys"),
                    None => "keys not known".to_owned(),
                }
            );
            if let Some(bytes) = r.bytes {
                let _ = write!(s, " ({bytes} bytes)");
            }
            if !r.absent_keys.is_empty() {
                let _ = write!(s, ", without {}", r.absent_keys.join(", "));
            }
            s
        }
        "ignored" => {
            "found, ignored (confighash.dev/ignore: \"true\"): left out of the stamp".into()
        }
        "absent" => "absent".to_owned(),
        "forbidden" => "not read: forbidden".to_owned(),
        "not-read" => "not read".to_owned(),
        _ => format!("not read: {}", shown(r.error.as_deref().unwrap_or(""))),
    };
    let version = r
        .resource_version
        .as_deref()
        .map(|v| format!(", resourceVersion {}", shown(v)))
        .unwrap_or_default();
    let _ = writeln!(
        w,
        "    {} {}: {selection}, {need}: {state}{version}",
        r.kind, r.name
    );
    if !r.field_managers.is_empty() {
        let _ = writeln!(
            w,
            "      last write per field manager (when the manager last wrote a field it owns, not necessarily the data):"
        );
        for m in &r.field_managers {
            let how = [m.operation.as_deref(), m.subresource.as_deref()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(", ");
            let how = shown(&how);
            let _ = writeln!(
                w,
                "        {} ({how}): {}",
                shown(&m.manager),
                shown(m.last_write.as_deref().unwrap_or("no time"))
            );
        }
    }
}

fn rollout(r: &RolloutInfo) -> String {
    let mut parts = Vec::new();
    if let Some(g) = r.generation {
        match r.observed_generation {
            Some(o) if o >= g => parts.push(format!("generation {g} observed")),
            Some(o) => parts.push(format!(
                "generation {g}, observed {o}: its controller has not seen the latest change yet"
            )),
            None => parts.push(format!("generation {g}, not observed by a controller yet")),
        }
    }
    if let Some(d) = r.desired {
        let n = |v: Option<i64>| v.unwrap_or(0);
        parts.push(format!(
            "{d} desired, {} updated, {} ready, {} available",
            n(r.updated),
            n(r.ready),
            n(r.available)
        ));
    }
    if let Some(p) = &r.progressing {
        parts.push(format!("Progressing {p}"));
    }
    if r.paused == Some(true) {
        parts.push("paused: pods do not roll until it is resumed".to_owned());
    }
    if let Some(s) = &r.update_strategy {
        if s == "OnDelete" {
            parts.push(
                "update strategy OnDelete: pods take a new template only when deleted".into(),
            );
        } else {
            parts.push(format!("update strategy {s}"));
        }
    }
    if let Some(phase) = &r.phase {
        parts.push(format!("phase {phase}"));
    }
    if r.last_schedule_time.is_some() || r.last_successful_time.is_some() || r.suspended.is_some() {
        parts.push(format!(
            "last schedule {}",
            r.last_schedule_time.as_deref().unwrap_or("never")
        ));
        if let Some(t) = &r.last_successful_time {
            parts.push(format!("last success {t}"));
        }
        if r.suspended == Some(true) {
            parts.push("suspended".to_owned());
        }
    }
    if parts.is_empty() {
        "no status".to_owned()
    } else {
        parts.join("; ")
    }
}

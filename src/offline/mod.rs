//! `confighash stamp`: stamps workloads in Kubernetes YAML offline.
//!
//! Each workload's references are resolved against the ConfigMaps and Secrets of the same input,
//! in the same namespace. Documents are written back in order; those it does not change are copied
//! byte for byte. Stamps made here are for inspection and render pipelines: a cluster's webhook
//! stamps with its own key.
//!
//! Must not reach: the API server, the network, or the running webhook's and watcher's state:
//! it reads files and writes its output.

pub mod diff;
pub mod yaml;

use std::collections::HashMap;
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use serde_json::Value;

use crate::core::checksum::{self, ObjectView, RefState, StampKey};
use crate::core::names::ENABLED_LABEL;
use crate::core::patch;
use crate::core::record::ObjectRecord;
use crate::core::refs::{ObjectKind, ObjectRef, References, Selection};
use crate::core::rules;
use crate::core::workload::{self, Analysis, FieldPath, Kinds, WorkloadError, WorkloadKind};

/// One input: a file's text and the name errors call it by.
#[derive(Debug, Clone)]
pub struct Source {
    pub name: String,
    pub text: String,
}

/// How to stamp.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The namespace of documents that name none (`--namespace`). Without it, every ConfigMap,
    /// Secret and stamped workload must name its own: there is no silent `default`, because the
    /// namespace enters the stamp.
    pub namespace: Option<String>,
    /// HMAC key; `None` makes plain stamps.
    pub key: Option<StampKey>,
    /// Report references and stamps instead of writing the documents.
    pub explain: bool,
    /// The kinds stamped: the built-in kinds and `--workload-kind`.
    pub kinds: Kinds,
}

/// A problem with the input, located by file, document (1-based) and line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{source_name}: document {document} (line {line}): {message}")]
pub struct InputError {
    pub source_name: String,
    pub document: usize,
    pub line: usize,
    pub message: String,
}

/// What `stamp` produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Output {
    /// The documents (or, with `explain`, the report).
    pub text: String,
    /// Things worth a look that did not stop the run, such as references the input lacks.
    pub warnings: Vec<String>,
}

/// One YAML document of a source.
struct Doc<'a> {
    source: usize,
    /// 1-based position in its source.
    index: usize,
    /// 1-based line where the document's content starts.
    line: usize,
    /// The `---` line that opened the document, or "" for the first.
    separator: &'a str,
    body: &'a str,
    value: Value,
    /// Keys given twice in one map: (line in the document, key); the last value was kept.
    duplicates: Vec<(usize, String)>,
    changed: bool,
}

/// A Kubernetes object found in a document: the document and, inside a `List`, the item.
#[derive(Clone, Copy)]
struct Place {
    doc: usize,
    item: Option<usize>,
}

struct Config {
    place: Place,
    record: ObjectRecord,
}

/// Everything of an input: its documents, the objects in them, and its ConfigMaps and Secrets
/// by namespace and name.
struct Input<'a> {
    docs: Vec<Doc<'a>>,
    places: Vec<Place>,
    configs: HashMap<(String, ObjectRef), Config>,
    warnings: Vec<String>,
}

/// The object at `place`.
fn object(docs: &[Doc<'_>], p: Place) -> Value {
    let v = &docs[p.doc].value;
    match p.item {
        Some(i) => v["items"][i].clone(),
        None => v.clone(),
    }
}

/// Reads every document of `sources` and the ConfigMaps and Secrets among them.
fn read_input<'a>(sources: &'a [Source], options: &Options) -> Result<Input<'a>, InputError> {
    let mut docs = Vec::new();
    for (i, source) in sources.iter().enumerate() {
        for (index, (line, separator, body)) in split(&source.text).into_iter().enumerate() {
            docs.push(parse(sources, i, index + 1, line, separator, body)?);
        }
    }

    let mut warnings = Vec::new();
    for doc in &docs {
        for (line, key) in &doc.duplicates {
            warnings.push(format!(
                "{}: document {} (line {}): the key {key:?} is given twice in one map; the last \
                 value is used, as kubectl does (kubectl --validate=strict refuses it)",
                sources[doc.source].name,
                doc.index,
                doc.line + line - 1
            ));
        }
    }

    for doc in &mut docs {
        match doc.value.get_mut("items").and_then(Value::as_array_mut) {
            Some(items) => items.iter_mut().for_each(nulls_as_the_server_reads_them),
            None => nulls_as_the_server_reads_them(&mut doc.value),
        }
    }

    let mut places = Vec::new();
    for (d, doc) in docs.iter().enumerate() {
        match doc.value.get("items").and_then(Value::as_array) {
            Some(items) if is_list(&doc.value) => {
                places.extend((0..items.len()).map(|i| Place {
                    doc: d,
                    item: Some(i),
                }));
            }
            _ => places.push(Place { doc: d, item: None }),
        }
    }
    let mut configs: HashMap<(String, ObjectRef), Config> = HashMap::new();
    for &place in &places {
        let obj = object(&docs, place);
        let Some((kind, name, record)) = read_config(&obj)
            .map_err(|(path, m)| located(sources, &docs[place.doc], place, path, m))?
        else {
            continue;
        };
        let ns = required_namespace(&obj, options, kind.as_str(), &name)
            .map_err(|m| error(sources, &docs[place.doc], m))?;
        let key = (ns.clone(), ObjectRef::new(kind, name));
        let config = Config { place, record };
        if let Some(first) = configs.insert(key.clone(), config) {
            let first = &docs[first.place.doc];
            return Err(error(
                sources,
                &docs[place.doc],
                format!(
                    "{} is defined twice in namespace {ns}: first in {}, document {}",
                    key.1, sources[first.source].name, first.index
                ),
            ));
        }
    }

    Ok(Input {
        docs,
        places,
        configs,
        warnings,
    })
}

/// Stamps every supported workload of `sources`.
pub fn run(sources: &[Source], options: &Options) -> Result<Output, InputError> {
    let Input {
        mut docs,
        places,
        configs,
        warnings,
    } = read_input(sources, options)?;
    let mut out = Output {
        warnings,
        ..Output::default()
    };

    for &place in &places {
        let mut obj = object(&docs, place);
        let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
        let Some(kind) = options.kinds.from_type(api_version, kind) else {
            continue;
        };
        let doc = &docs[place.doc];
        // Opted out: copied as it is, whatever its pod spec holds.
        let enabled = obj
            .pointer("/metadata/labels")
            .and_then(|l| l.get(ENABLED_LABEL))
            .and_then(Value::as_str);
        if enabled == Some("false") {
            if options.explain {
                let title = title(kind, &obj, options);
                writeln!(
                    out.text,
                    "{title}\n  skipped: labelled {ENABLED_LABEL}=false\n"
                )
                .ok();
            }
            continue;
        }
        let info = match workload::analyze(kind, &obj) {
            Ok(Analysis::Workload(info)) => info,
            Ok(Analysis::WorkloadRef) => {
                if options.explain {
                    let title = title(kind, &obj, options);
                    writeln!(out.text, "{title}\n  skipped: uses workloadRef\n").ok();
                }
                continue;
            }
            Ok(Analysis::Unsupported) => continue,
            Err(e) if !kind.is_built_in() && e.is_no_template() => {
                let title = title(kind, &obj, options);
                out.warnings.push(format!(
                    "{title}: {e} (--workload-kind {}); left as it is",
                    kind.flag()
                ));
                continue;
            }
            Err(WorkloadError::PodSpec { path, error: e }) => {
                let message = format!("{}: {}: {e}", named(kind, &obj), path.display());
                return Err(located(sources, doc, place, Some(path), message));
            }
            Err(e) => return Err(error(sources, doc, format!("{}: {e}", named(kind, &obj)))),
        };
        let title = title(kind, &obj, options);
        if info.opted_out {
            if options.explain {
                writeln!(
                    out.text,
                    "{title}\n  skipped: labelled {ENABLED_LABEL}=false\n"
                )
                .ok();
            }
            continue;
        }
        for rejected in info.refs.rejected() {
            out.warnings.push(format!(
                "{title}: {rejected:?} in an extra-reference annotation is not a valid name; left out"
            ));
        }
        let name = obj.pointer("/metadata/name").and_then(Value::as_str);
        let ns = required_namespace(&obj, options, kind.kind(), name.unwrap_or("<unnamed>"))
            .map_err(|m| error(sources, doc, m))?;
        let view = NamespaceOfInput {
            configs: &configs,
            namespace: &ns,
        };
        let lookup = |r: &ObjectRef| view.get(r);
        let stamp = rules::expected_stamp(&view, options.key.as_ref(), &ns, &info.refs);
        for (r, spec) in info.refs.iter() {
            if lookup(r).is_none() && !spec.optional {
                out.warnings.push(format!(
                    "{title} references {r}, which is not in the input (namespace {ns})"
                ));
            }
        }
        if options.explain {
            explain(&mut out.text, &title, &info.refs, lookup, stamp.as_str());
            continue;
        }
        let ops = patch::build(&obj, kind, Some(stamp.as_str()), false)
            .map_err(|e| error(sources, doc, format!("{kind}: {e}")))?;
        if ops.0.is_empty() {
            continue;
        }
        json_patch::patch(&mut obj, &ops)
            .map_err(|e| error(sources, doc, format!("{kind}: cannot stamp: {e}")))?;
        let doc = &mut docs[place.doc];
        match place.item {
            Some(i) => doc.value["items"][i] = obj,
            None => doc.value = obj,
        }
        doc.changed = true;
    }

    if !options.explain {
        out.text = render(sources, &docs)?;
    }
    Ok(out)
}

/// Splits a YAML stream at its `---` lines. A line that starts with `---` followed by whitespace
/// or its end always opens a document: YAML forbids such a line inside content.
fn split(text: &str) -> Vec<(usize, &str, &str)> {
    let mut docs = Vec::new();
    let (mut start, mut sep_end, mut line, mut start_line) = (0, 0, 1, 1);
    let mut pos = 0;
    for l in text.split_inclusive('\n') {
        let is_separator = l
            .strip_prefix("---")
            .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t', '\r', '\n']));
        if is_separator {
            if pos > 0 {
                docs.push((start_line, &text[start..sep_end], &text[sep_end..pos]));
            }
            start = pos;
            start_line = line;
            // Content after `--- ` on the same line belongs to the document.
            let rest = l[3..].trim_start();
            sep_end = if rest.is_empty() || rest.starts_with('#') {
                start_line += 1;
                pos + l.len()
            } else {
                pos + 3
            };
        }
        pos += l.len();
        line += line_breaks(l);
    }
    if pos > start || docs.is_empty() {
        docs.push((start_line, &text[start..sep_end], &text[sep_end..]));
    }
    docs
}

/// Line breaks in one `\n`-terminated piece of text, counted as YAML counts them: `\r\n`, `\n`
/// and a lone `\r` are one each.
fn line_breaks(piece: &str) -> usize {
    let b = piece.as_bytes();
    let lone_cr = b
        .iter()
        .enumerate()
        .filter(|&(i, &c)| c == b'\r' && b.get(i + 1) != Some(&b'\n'))
        .count();
    lone_cr + usize::from(b.last() == Some(&b'\n'))
}

fn parse<'a>(
    sources: &[Source],
    source: usize,
    index: usize,
    line: usize,
    separator: &'a str,
    body: &'a str,
) -> Result<Doc<'a>, InputError> {
    let mut doc = Doc {
        source,
        index,
        line,
        separator,
        body,
        value: Value::Null,
        duplicates: Vec::new(),
        changed: false,
    };
    if body.trim().is_empty() {
        return Ok(doc);
    }
    match yaml::parse(body) {
        Ok(read) => {
            doc.value = read.value;
            doc.duplicates = read.duplicates;
        }
        Err(e) => {
            return Err(InputError {
                source_name: sources[source].name.clone(),
                document: index,
                line: line + e.line.max(1) - 1,
                message: format!("not valid YAML: column {}: {}", e.column, e.message),
            });
        }
    }
    if !matches!(doc.value, Value::Object(_) | Value::Null) {
        return Err(error(
            sources,
            &doc,
            "a Kubernetes document must be a map".into(),
        ));
    }
    Ok(doc)
}

/// The maps of strings the recipe and the rules read, where the API server decodes a null value
/// as the empty string (Go's JSON leaves a string at its zero value): so must we.
fn nulls_as_the_server_reads_them(obj: &mut Value) {
    const MAPS: [&str; 9] = [
        "/metadata/labels",
        "/metadata/annotations",
        "/data",
        "/stringData",
        "/binaryData",
        "/spec/template/metadata/labels",
        "/spec/template/metadata/annotations",
        "/spec/jobTemplate/spec/template/metadata/labels",
        "/spec/jobTemplate/spec/template/metadata/annotations",
    ];
    for pointer in MAPS {
        if let Some(Value::Object(map)) = obj.pointer_mut(pointer) {
            for value in map.values_mut().filter(|v| v.is_null()) {
                *value = Value::String(String::new());
            }
        }
    }
}

/// A list as kubectl reads one: `v1/List` or any `*List` kind (`DeploymentList`), with `items`.
fn is_list(v: &Value) -> bool {
    v.get("kind")
        .and_then(Value::as_str)
        .is_some_and(|k| k.ends_with("List"))
        && v.get("items").is_some_and(Value::is_array)
}

/// `kind` and, when it has one, the object's name: `StatefulSet redis`.
fn named(kind: WorkloadKind, obj: &Value) -> String {
    match obj.pointer("/metadata/name").and_then(Value::as_str) {
        Some(name) => format!("{kind} {name}"),
        None => kind.to_string(),
    }
}

/// An error at the line of the field `path` of the object at `place`, when it is found there
/// (else at the document's line).
fn located(
    sources: &[Source],
    doc: &Doc<'_>,
    place: Place,
    path: Option<FieldPath>,
    message: String,
) -> InputError {
    let mut at = error(sources, doc, message);
    if let Some(path) = path {
        let mut segments = Vec::new();
        if let Some(i) = place.item {
            segments.extend(["items".to_owned(), i.to_string()]);
        }
        segments.extend(path.segments());
        if let Some(line) = yaml::line_of(doc.body, &segments) {
            at.line = doc.line + line - 1;
        }
    }
    at
}

fn error(sources: &[Source], doc: &Doc<'_>, message: String) -> InputError {
    InputError {
        source_name: sources[doc.source].name.clone(),
        document: doc.index,
        line: doc.line,
        message,
    }
}

/// The document's own namespace, else `--namespace`, else none.
fn namespace<'a>(obj: &'a Value, options: &'a Options) -> Option<&'a str> {
    obj.pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .filter(|ns| !ns.is_empty())
        .or(options.namespace.as_deref().filter(|ns| !ns.is_empty()))
}

/// The namespace of an object whose namespace enters a stamp or a lookup.
fn required_namespace(
    obj: &Value,
    options: &Options,
    kind: &str,
    name: &str,
) -> Result<String, String> {
    namespace(obj, options).map(str::to_owned).ok_or_else(|| {
        format!(
            "{kind} {name} has no metadata.namespace; the namespace enters its stamp, so give it \
             in the document or with --namespace"
        )
    })
}

fn title(kind: WorkloadKind, obj: &Value, options: &Options) -> String {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("<unnamed>");
    match namespace(obj, options) {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

/// Reads a ConfigMap or Secret (core/v1): its kind, name, ignore annotation and entry digests.
/// A ConfigMap or a Secret of the input; an error names the field path where one is known.
#[allow(clippy::type_complexity)]
fn read_config(
    obj: &Value,
) -> Result<Option<(ObjectKind, String, ObjectRecord)>, (Option<FieldPath>, String)> {
    if obj.get("apiVersion").and_then(Value::as_str) != Some("v1") {
        return Ok(None);
    }
    let named = |kind: &str| match obj.pointer("/metadata/name").and_then(Value::as_str) {
        Some(name) => format!("{kind} {name}"),
        None => kind.to_owned(),
    };
    let decode_error = |kind: &str, (path, e): (FieldPath, serde_json::Error)| {
        let message = format!("{}: {}: {e}", named(kind), path.display());
        (Some(path), message)
    };
    let (kind, meta, record) = match obj.get("kind").and_then(Value::as_str) {
        Some("ConfigMap") => {
            let cm: ConfigMap =
                workload::decode_at(obj, &[]).map_err(|e| decode_error("ConfigMap", e))?;
            // Checked even when the object is ignored: the API server would refuse it.
            ObjectView::config_map(&cm)
                .map_err(|e| (None, format!("{}: {e}", named("ConfigMap"))))?;
            let record = ObjectRecord::config_map(&cm)
                .map_err(|e| (None, format!("{}: {e}", named("ConfigMap"))))?;
            (ObjectKind::ConfigMap, cm.metadata, record)
        }
        Some("Secret") => {
            let secret: Secret =
                workload::decode_at(obj, &[]).map_err(|e| decode_error("Secret", e))?;
            let record = ObjectRecord::secret(&secret);
            (ObjectKind::Secret, secret.metadata, record)
        }
        _ => return Ok(None),
    };
    let name = match meta.name {
        Some(name) if !name.is_empty() => name,
        _ => return Err((None, format!("{} has no metadata.name", kind.as_str()))),
    };
    Ok(Some((kind, name, record)))
}

fn explain<'c>(
    out: &mut String,
    title: &str,
    refs: &References,
    lookup: impl Fn(&ObjectRef) -> Option<&'c Config>,
    stamp: &str,
) {
    writeln!(out, "{title}").ok();
    if refs.is_empty() {
        writeln!(out, "  no references").ok();
    }
    for (r, spec) in refs.iter() {
        let need = if spec.optional {
            "optional"
        } else {
            "required"
        };
        let config = lookup(r);
        let found = match config {
            None => "absent".to_owned(),
            Some(c) if c.record.ignored => {
                format!("ignored ({})", crate::core::names::IGNORE_ANNOTATION)
            }
            Some(c) => match c.record.digest.len() {
                1 => "found, 1 key".to_owned(),
                n => format!("found, {n} keys"),
            },
        };
        let selection = match &spec.selection {
            Selection::Whole => "whole object".to_owned(),
            Selection::Keys(keys) => {
                let keys: Vec<String> = keys
                    .iter()
                    .map(|k| match config {
                        Some(c)
                            if !c.record.ignored
                                && checksum::Entries::entry(&c.record.digest, k).is_none() =>
                        {
                            format!("{k} (absent)")
                        }
                        _ => k.clone(),
                    })
                    .collect();
                format!("keys {}", keys.join(", "))
            }
        };
        writeln!(out, "  {r}: {selection}, {need}: {found}").ok();
    }
    for r in refs.rejected() {
        writeln!(
            out,
            "  {}: {:?} is not a valid name, left out",
            r.kind.as_str(),
            r.name
        )
        .ok();
    }
    writeln!(out, "  stamp: {stamp}\n").ok();
}

/// Writes every document back: unchanged ones byte for byte, changed ones re-serialized.
fn render(sources: &[Source], docs: &[Doc<'_>]) -> Result<String, InputError> {
    let mut text = String::new();
    let mut last_source = None;
    for doc in docs {
        if last_source.is_some_and(|s| s != doc.source) {
            // A new file: make sure its first document stays a document of its own.
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            if doc.separator.is_empty() {
                text.push_str("---\n");
            }
        }
        last_source = Some(doc.source);
        if !doc.changed {
            text.push_str(doc.separator);
            text.push_str(doc.body);
            continue;
        }
        let yaml = serde_saphyr::to_string(&doc.value).map_err(|e| {
            error(
                sources,
                doc,
                format!("cannot write the stamped document: {e}"),
            )
        })?;
        if !doc.separator.is_empty() {
            // Keeps a comment on the `---` line; content there is now part of `yaml`.
            text.push_str(doc.separator.trim_end());
            text.push('\n');
        }
        text.push_str(&yaml);
        if !yaml.ends_with('\n') {
            text.push('\n');
        }
    }
    Ok(text)
}

/// The input's ConfigMaps and Secrets as the recipe sees one namespace.
struct NamespaceOfInput<'a> {
    configs: &'a HashMap<(String, ObjectRef), Config>,
    namespace: &'a str,
}

impl NamespaceOfInput<'_> {
    fn get(&self, object: &ObjectRef) -> Option<&Config> {
        self.configs
            .get(&(self.namespace.to_owned(), object.clone()))
    }
}

impl rules::View for NamespaceOfInput<'_> {
    fn state(&self, object: &ObjectRef) -> RefState<'_> {
        crate::core::record::state_of(self.get(object).map(|c| &c.record))
    }
}

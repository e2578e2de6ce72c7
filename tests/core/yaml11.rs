//! `stamp` reads YAML as kubectl does: every (context, scalar form) of
//! `tests/data/yaml11/cases.json` against kubectl's own reading in `golden.json`, which the real
//! tier regenerates with the pinned kubectl and a real API server (`scripts/yaml-golden.py
//! --check`), so this suite needs only Rust.
//!
//! - The parse: where kubectl (`--validate=false`) reads a value, ours is the same JSON value
//!   (numbers compared as numbers: kubectl writes big integers as floats); where it refuses the
//!   document, so do we.
//! - Strict validation: where the API server cannot decode the document's types
//!   (`--validate=strict`, `wrong-type`) in a field `stamp` reads, `stamp` refuses it too; where
//!   it takes the document, so does `stamp`. Values its validation refuses (`invalid`: a file
//!   mode over 0777, a name's syntax) are left to it: `stamp` reads them as written.
//! - What `stamp` writes back reads as the same value.

use confighash::offline::{self, Options, Source, yaml};
use serde_json::Value;

fn load(name: &str) -> Value {
    let path = format!("{}/tests/data/yaml11/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// JSON values equal as kubectl's: numbers by their value.
fn same(ours: &Value, kubectl: &Value) -> bool {
    match (ours, kubectl) {
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same(x, y))
        }
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len() && a.iter().all(|(k, v)| b.get(k).is_some_and(|w| same(v, w)))
        }
        _ => ours == kubectl,
    }
}

struct Case {
    context: String,
    form: String,
    doc: String,
    pointer: String,
    golden: Value,
}

fn cases() -> Vec<Case> {
    let cases = load("cases.json");
    let golden = load("golden.json");
    let golden = golden.as_array().unwrap();
    let mut out = Vec::new();
    for (name, context) in cases["contexts"].as_object().unwrap() {
        for form in cases["forms"].as_array().unwrap() {
            let form = form.as_str().unwrap();
            let entry = golden
                .iter()
                .find(|e| e["context"] == name.as_str() && e["form"] == form)
                .unwrap_or_else(|| {
                    panic!("golden.json has no case {name} {form:?}: regenerate it")
                });
            out.push(Case {
                context: name.clone(),
                form: form.to_owned(),
                doc: context["doc"].as_str().unwrap().replace("@FORM@", form),
                pointer: context["pointer"].as_str().unwrap().to_owned(),
                golden: entry.clone(),
            });
        }
    }
    out
}

fn stamp(doc: &str) -> Result<offline::Output, offline::InputError> {
    offline::run(
        &[Source {
            name: "case.yaml".into(),
            text: doc.to_owned(),
        }],
        &Options {
            namespace: Some("default".into()),
            key: None,
            explain: false,
            ..Default::default()
        },
    )
}

#[test]
fn the_corpus_has_at_least_sixty_forms_in_every_context() {
    let cases = load("cases.json");
    assert!(cases["forms"].as_array().unwrap().len() >= 60);
    assert_eq!(
        cases["contexts"].as_object().unwrap().len() * cases["forms"].as_array().unwrap().len(),
        load("golden.json").as_array().unwrap().len(),
        "golden.json is not cases.json's: regenerate it (scripts/yaml-golden.py)"
    );
}

#[test]
fn every_scalar_form_reads_as_kubectl_reads_it() {
    let mut wrong = Vec::new();
    for case in cases() {
        let ours = yaml::parse(&case.doc);
        let what = format!("{} {:?}", case.context, case.form);
        match (&ours, case.golden["parse"].get("value")) {
            (Ok(read), Some(kubectl)) => {
                let ours = read.value.pointer(&case.pointer).unwrap_or(&Value::Null);
                if !same(ours, kubectl) {
                    wrong.push(format!("{what}: ours {ours}, kubectl's {kubectl}"));
                }
            }
            // kubectl refuses the document as it reads it (its YAML, or metadata of the wrong
            // type): so must stamp.
            (Ok(read), None) if stamp(&case.doc).is_ok() => wrong.push(format!(
                "{what}: kubectl refuses it, stamp reads {} and takes it",
                read.value.pointer(&case.pointer).unwrap_or(&Value::Null)
            )),
            (Ok(_), None) => {}
            (Err(_), Some(kubectl)) => {
                wrong.push(format!("{what}: we refuse it, kubectl reads {kubectl}"))
            }
            (Err(_), None) => {}
        }
    }
    assert!(
        wrong.is_empty(),
        "{} differences:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[test]
fn stamp_refuses_what_strict_validation_refuses_in_the_fields_it_reads() {
    let mut wrong = Vec::new();
    for case in cases() {
        let what = format!("{} {:?}", case.context, case.form);
        let result = stamp(&case.doc);
        let strict = case.golden["strict"].as_str().unwrap();
        // The type of a field stamp reads: ConfigMap keys are names whose syntax stamp does
        // not check (the API server does), so only their parse is compared.
        let typed = case.context != "configmap-key";
        match (strict, &result) {
            ("wrong-type", Ok(_)) if typed => wrong.push(format!(
                "{what}: the API server cannot decode its types, stamp takes it"
            )),
            ("accepted", Err(e)) => wrong.push(format!(
                "{what}: the API server takes it, stamp refuses it: {e}"
            )),
            _ => {}
        }
    }
    assert!(
        wrong.is_empty(),
        "{} differences:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[test]
fn what_stamp_writes_back_reads_the_same() {
    for case in cases() {
        let Ok(read) = yaml::parse(&case.doc) else {
            continue;
        };
        let Ok(out) = stamp(&case.doc) else {
            continue;
        };
        let again = yaml::parse(&out.text).unwrap_or_else(|e| {
            panic!(
                "{} {:?}: stamp wrote YAML we cannot read: {e:?}\n{}",
                case.context, case.form, out.text
            )
        });
        let mut before = read.value.pointer(&case.pointer).cloned();
        // In a map of strings the API server reads null as "", and stamp writes it so where it
        // writes the document again (a workload it stamps; a ConfigMap is copied as it is).
        if before == Some(Value::Null) && case.context == "annotation" {
            before = Some(Value::String(String::new()));
        }
        let after = again.value.pointer(&case.pointer).cloned();
        assert_eq!(
            before, after,
            "{} {:?}: stamp wrote\n{}",
            case.context, case.form, out.text
        );
    }
}

//! The fuzz targets' invariants under `cargo test`: every hand-made seed in `fuzz/seeds/<target>/`
//! (and, for `stamp_yaml`, every example) goes through the same checks the targets make, which
//! live in the `confighash-fuzz-checks` crate (`crates/fuzz-checks`). Inputs the fuzzers found are
//! kept below as their own tests.

use crate::build;

use std::path::{Path, PathBuf};

use build::{Review, deployment, patch_of};
use confighash::core::refs;
use confighash::offline::Source;

use confighash_fuzz_checks as fuzz_checks;

fn files(dir: &str) -> Vec<PathBuf> {
    let dir = Path::new(confighash_testkit::ROOT).join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no files in {}", dir.display());
    files
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn admission(body: &[u8]) {
    let rt = fuzz_checks::runtime();
    let webhook = fuzz_checks::webhook();
    fuzz_checks::check_admission(&rt, &webhook, body);
}

fn discovery(bytes: &[u8]) {
    if let Some((spec, annotations)) = fuzz_checks::discovery_input(bytes) {
        fuzz_checks::check_discovery(&spec, annotations.as_ref());
    }
}

fn stamp_yaml(bytes: &[u8]) {
    if let Some(sources) = fuzz_checks::stamp_sources(bytes) {
        fuzz_checks::check_stamp_yaml(&sources);
    }
}

#[test]
fn admission_review_seeds_keep_the_invariants() {
    for path in files("fuzz/seeds/admission_review") {
        println!("{}", path.display());
        admission(&read(&path));
    }
}

#[test]
fn discovery_seeds_keep_the_invariants() {
    for path in files("fuzz/seeds/discovery") {
        println!("{}", path.display());
        let bytes = read(&path);
        assert!(
            fuzz_checks::discovery_input(&bytes).is_some(),
            "{} is not a discovery input",
            path.display()
        );
        discovery(&bytes);
    }
}

#[test]
fn stamp_yaml_seeds_and_examples_keep_the_invariants() {
    for path in files("fuzz/seeds/stamp_yaml")
        .into_iter()
        .chain(files("examples"))
    {
        println!("{}", path.display());
        stamp_yaml(&read(&path));
    }
}

#[test]
fn every_example_together_keeps_the_stamp_invariants() {
    let sources: Vec<Source> = files("examples")
        .iter()
        .map(|p| Source {
            name: p.display().to_string(),
            text: String::from_utf8(read(p)).expect("UTF-8"),
        })
        .collect();
    fuzz_checks::check_stamp_yaml(&sources);
}

#[test]
fn the_in_memory_source_reaches_every_lookup_outcome() {
    // The seeds rely on these names; a review of each is answered as the rules say.
    let review =
        |name: &str| Review::create(&deployment("web").env_from_config_map(name).json()).bytes();
    let rt = fuzz_checks::runtime();
    let webhook = fuzz_checks::webhook();
    let patch = |name: &str| -> String {
        let answer = rt
            .block_on(webhook.answer(&review(name)))
            .expect("a review");
        patch_of(&answer)
            .map(|bytes| String::from_utf8(bytes).expect("UTF-8"))
            .unwrap_or_default()
    };
    for name in ["cfg", "gone-absent", "cfg-ignored"] {
        assert!(patch(name).contains("confighash.dev~1checksum"), "{name}");
        admission(&review(name));
    }
    for name in ["db-fail", "dup"] {
        let patch = patch(name);
        assert!(patch.contains("confighash.dev~1unstamped"), "{name}");
        assert!(!patch.contains("confighash.dev~1checksum"), "{name}");
        admission(&review(name));
    }
}

/// `stamp_yaml`, crash 1 (a false alarm of the target's own check, kept as a regression): YAML
/// counts a lone CR as a line break, so an error can be on line 3 of a text that has no LF at
/// all. The check now counts lines as YAML does.
#[test]
fn stamp_yaml_lone_carriage_returns_are_line_breaks() {
    let input = b"\r\r%";
    stamp_yaml(input);
    let source = Source {
        name: "cr.yaml".to_owned(),
        text: String::from_utf8(input.to_vec()).expect("UTF-8"),
    };
    let options = confighash::offline::Options {
        namespace: Some("default".to_owned()),
        key: None,
        explain: false,
        ..Default::default()
    };
    let e = confighash::offline::run(&[source], &options).expect_err("not YAML");
    assert_eq!((e.document, e.line), (1, 3), "{e}");
}

/// Lone CRs in an earlier document are line breaks, for the parser and the document splitter
/// alike, so an error in a later document names its line.
#[test]
fn stamp_yaml_errors_after_lone_carriage_returns_name_the_right_line() {
    // Line 1 `a: 1`, lines 2 and 3 empty (lone CRs), line 4 `---`, line 5 `b: %`.
    let source = Source {
        name: "cr.yaml".to_owned(),
        text: "a: 1\r\r\r\n---\nb: %\n".to_owned(),
    };
    let options = confighash::offline::Options {
        namespace: Some("default".to_owned()),
        key: None,
        explain: false,
        ..Default::default()
    };
    let e = confighash::offline::run(&[source], &options).expect_err("not YAML");
    assert_eq!((e.document, e.line), (2, 5), "{e}");
}

/// A name in a pod spec that is not a ConfigMap or Secret name (a DNS-1123 subdomain) is no
/// reference: were it one, the webhook would put it, unescaped, in the path of the GET it sends
/// to the API server. The extra-reference annotations refuse such names too.
#[test]
fn pod_spec_names_that_are_not_object_names_are_not_references() {
    for name in [
        "A",
        "../../kube-system/secrets/x",
        "x?watch=1",
        "a/b",
        " cfg",
    ] {
        let spec = serde_json::json!({"containers": [{
            "name": "a",
            "envFrom": [{"configMapRef": {"name": name}}],
            "env": [{"name": "E", "valueFrom": {"secretKeyRef": {"name": name, "key": "k"}}}]
        }]});
        let (spec, _) = fuzz_checks::discovery_input(spec.to_string().as_bytes()).expect("a spec");
        let found = refs::discover(&spec, None);
        assert!(
            fuzz_checks::invalid_names(&found).is_empty(),
            "{name:?} became a reference: {found:?}"
        );
    }
}

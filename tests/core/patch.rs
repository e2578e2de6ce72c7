//! The JSONPatch builder: applying its patch to real-looking workloads gives exactly the expected
//! object, touching nothing but the stamp and the marker.

use crate::build;

use confighash::core::patch;
use confighash::core::workload::WorkloadKind;
use serde_json::{Value, json};

const STAMP: &str = "v2:plain:8a197cfb21e9aa6bbcf94cf7eae326632e2e20d00aa81064c1ed75590e8bf482";

/// Deployment `web` in `shop` (two replicas) whose pod template has `template_metadata`.
fn deployment(template_metadata: Value) -> Value {
    build::deployment("web")
        .labels(json!({"app": "web"}))
        .spec("replicas", json!(2))
        .image("nginx:1.27")
        .template_metadata(template_metadata)
        .json()
}

fn apply(obj: &Value, kind: WorkloadKind, stamp: Option<&str>, marker: bool) -> (Value, usize) {
    let p = patch::build(obj, kind, stamp, marker).expect("patch builds");
    let n = p.0.len();
    let mut out = obj.clone();
    json_patch::patch(&mut out, &p).expect("patch applies");
    // The patch survives the JSON round trip the AdmissionReview puts it through.
    let wire = serde_json::to_string(&p).unwrap();
    let back: json_patch::Patch = serde_json::from_str(&wire).unwrap();
    let mut again = obj.clone();
    json_patch::patch(&mut again, &back).unwrap();
    assert_eq!(out, again);
    (out, n)
}

#[test]
fn adds_missing_annotations_map() {
    let obj = deployment(json!({"labels": {"app": "web"}}));
    let (out, _) = apply(&obj, WorkloadKind::DEPLOYMENT, Some(STAMP), false);
    let mut want = obj.clone();
    want["spec"]["template"]["metadata"]["annotations"] = json!({"confighash.dev/checksum": STAMP});
    assert_eq!(out, want);
}

#[test]
fn adds_missing_metadata_and_escapes_the_slash() {
    let mut obj = deployment(json!({}));
    obj["spec"]["template"]
        .as_object_mut()
        .unwrap()
        .remove("metadata");
    let p = patch::build(&obj, WorkloadKind::DEPLOYMENT, Some(STAMP), false).unwrap();
    let paths: Vec<String> = serde_json::to_value(&p)
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|op| op["path"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        paths,
        [
            "/spec/template/metadata",
            "/spec/template/metadata/annotations",
            "/spec/template/metadata/annotations/confighash.dev~1checksum"
        ]
    );
    let (out, _) = apply(&obj, WorkloadKind::DEPLOYMENT, Some(STAMP), false);
    assert_eq!(
        out["spec"]["template"]["metadata"],
        json!({"annotations": {"confighash.dev/checksum": STAMP}})
    );
}

#[test]
fn null_annotations_are_replaced() {
    let obj = deployment(json!({"annotations": null}));
    let (out, _) = apply(&obj, WorkloadKind::DEPLOYMENT, Some(STAMP), false);
    assert_eq!(
        out["spec"]["template"]["metadata"]["annotations"],
        json!({"confighash.dev/checksum": STAMP})
    );
}

#[test]
fn replaces_only_the_stamp_and_keeps_other_annotations() {
    let obj = deployment(json!({"annotations": {
        "confighash.dev/checksum": "v2:plain:old",
        "odd~key/with~1escapes": "kept",
        "prometheus.io/scrape": "true"
    }}));
    let (out, n) = apply(&obj, WorkloadKind::DEPLOYMENT, Some(STAMP), false);
    assert_eq!(n, 1);
    let mut want = obj.clone();
    want["spec"]["template"]["metadata"]["annotations"]["confighash.dev/checksum"] = json!(STAMP);
    assert_eq!(out, want);
}

#[test]
fn empty_when_already_right() {
    let obj = deployment(json!({"annotations": {"confighash.dev/checksum": STAMP}}));
    let p = patch::build(&obj, WorkloadKind::DEPLOYMENT, Some(STAMP), false).unwrap();
    assert!(p.0.is_empty(), "{p:?}");
    let p = patch::build(
        &deployment(json!({})),
        WorkloadKind::DEPLOYMENT,
        None,
        false,
    )
    .unwrap();
    assert!(p.0.is_empty(), "{p:?}");
}

#[test]
fn removes_a_stamp_and_adds_the_marker() {
    let obj = deployment(json!({"annotations": {"confighash.dev/checksum": STAMP, "a": "b"}}));
    let (out, _) = apply(&obj, WorkloadKind::DEPLOYMENT, None, true);
    let mut want = obj.clone();
    want["spec"]["template"]["metadata"]["annotations"] = json!({"a": "b"});
    want["metadata"]["annotations"] = json!({"confighash.dev/unstamped": "lookup-failed"});
    assert_eq!(out, want);
}

#[test]
fn stamping_removes_the_marker() {
    let mut obj = deployment(json!({}));
    obj["metadata"]["annotations"] =
        json!({"confighash.dev/unstamped": "lookup-failed", "team": "shop"});
    let (out, _) = apply(&obj, WorkloadKind::DEPLOYMENT, Some(STAMP), false);
    assert_eq!(out["metadata"]["annotations"], json!({"team": "shop"}));
    assert_eq!(
        out["spec"]["template"]["metadata"]["annotations"]["confighash.dev/checksum"],
        json!(STAMP)
    );
}

#[test]
fn cron_job_template_is_under_the_job_template() {
    let obj = json!({
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "refresh"},
        "spec": {
            "schedule": "*/15 * * * *",
            "jobTemplate": {"spec": {"template": {"spec": {
                "restartPolicy": "OnFailure",
                "containers": [{"name": "c", "image": "curl"}]
            }}}}
        }
    });
    let (out, _) = apply(&obj, WorkloadKind::CRON_JOB, Some(STAMP), false);
    let mut want = obj.clone();
    want["spec"]["jobTemplate"]["spec"]["template"]["metadata"] =
        json!({"annotations": {"confighash.dev/checksum": STAMP}});
    assert_eq!(out, want);
}

#[test]
fn a_template_that_is_not_an_object_is_an_error() {
    let mut obj = deployment(json!({}));
    obj["spec"]["template"]["metadata"] = json!("oops");
    let err = patch::build(&obj, WorkloadKind::DEPLOYMENT, Some(STAMP), false).unwrap_err();
    assert_eq!(err.path, "spec.template.metadata");
}

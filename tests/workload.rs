//! Workload helpers the webhook uses on UPDATE: the old object's stamp and marker, and whether
//! the template changed apart from the stamp.

#[path = "common/build.rs"]
mod build;

use confighash::core::names::{UNSTAMPED_ANNOTATION, UNSTAMPED_LOOKUP_FAILED};
use confighash::core::workload::{self, WorkloadKind};
use serde_json::{Value, json};

/// Deployment `web`, marked unstamped, whose pod template has `template_metadata` and runs
/// `image`.
fn deployment(template_metadata: Value, image: &str) -> Value {
    build::deployment("web")
        .annotation(UNSTAMPED_ANNOTATION, UNSTAMPED_LOOKUP_FAILED)
        .template_metadata(template_metadata)
        .image(image)
        .json()
}

#[test]
fn templates_differing_only_in_the_stamp_are_equal() {
    let kind = WorkloadKind::Deployment;
    let equal = |a: Value, b: Value| workload::templates_equal_ignoring_stamp(kind, &a, &b);
    let stamped =
        |s: &str| json!({"labels": {"app": "web"}, "annotations": {"confighash.dev/checksum": s}});
    assert!(equal(
        deployment(stamped("a"), "x"),
        deployment(stamped("b"), "x")
    ));
    assert!(equal(
        deployment(stamped("a"), "x"),
        deployment(json!({"labels": {"app": "web"}}), "x")
    ));
    assert!(equal(
        deployment(json!({"labels": {"app": "web"}, "annotations": {}}), "x"),
        deployment(json!({"labels": {"app": "web"}, "annotations": null}), "x")
    ));
    assert!(equal(
        deployment(
            json!({"annotations": {"confighash.dev/checksum": "a"}}),
            "x"
        ),
        deployment(json!(null), "x")
    ));
    // Anything else is a change.
    assert!(!equal(
        deployment(stamped("a"), "x"),
        deployment(stamped("a"), "y")
    ));
    assert!(!equal(
        deployment(stamped("a"), "x"),
        deployment(json!({"labels": {"app": "api"}}), "x")
    ));
    assert!(!equal(
        deployment(json!({"annotations": {"other": "1"}}), "x"),
        deployment(json!({"annotations": {"other": "2"}}), "x")
    ));
    assert!(!equal(
        deployment(json!({"annotations": {"other": "1"}}), "x"),
        deployment(json!({}), "x")
    ));
    assert!(!equal(
        deployment(json!({"annotations": "odd"}), "x"),
        deployment(json!({}), "x")
    ));
}

#[test]
fn cron_job_templates_are_compared_under_the_job_template() {
    let cron = |stamp: &str, schedule: &str| {
        json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "c"},
               "spec": {"schedule": schedule, "jobTemplate": {"spec": {"template": {
                   "metadata": {"annotations": {"confighash.dev/checksum": stamp}},
                   "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}}})
    };
    let kind = WorkloadKind::CronJob;
    assert!(workload::templates_equal_ignoring_stamp(
        kind,
        &cron("a", "* * * * *"),
        &cron("b", "0 * * * *")
    ));
    let c = cron("a", "* * * * *");
    let (stamp, marker) = workload::stamp_and_marker(kind, &c);
    assert_eq!((stamp, marker), (Some("a"), false));
}

#[test]
fn stamp_and_marker_read_without_a_pod_spec() {
    let d = deployment(
        json!({"annotations": {"confighash.dev/checksum": "s"}}),
        "x",
    );
    assert_eq!(
        workload::stamp_and_marker(WorkloadKind::Deployment, &d),
        (Some("s"), true)
    );
    let broken = json!({"spec": {"template": 3}});
    assert_eq!(
        workload::stamp_and_marker(WorkloadKind::Deployment, &broken),
        (None, false)
    );
}

//! The workload helper the webhook uses on UPDATE: the old object's stamp and marker.

use crate::build;

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
fn a_cron_jobs_stamp_is_read_under_the_job_template() {
    let c = json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "c"},
           "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": {
               "metadata": {"annotations": {"confighash.dev/checksum": "a"}},
               "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}}});
    let (stamp, marker) = workload::stamp_and_marker(WorkloadKind::CRON_JOB, &c);
    assert_eq!((stamp, marker), (Some("a"), false));
}

#[test]
fn stamp_and_marker_read_without_a_pod_spec() {
    let d = deployment(
        json!({"annotations": {"confighash.dev/checksum": "s"}}),
        "x",
    );
    assert_eq!(
        workload::stamp_and_marker(WorkloadKind::DEPLOYMENT, &d),
        (Some("s"), true)
    );
    let broken = json!({"spec": {"template": 3}});
    assert_eq!(
        workload::stamp_and_marker(WorkloadKind::DEPLOYMENT, &broken),
        (None, false)
    );
}

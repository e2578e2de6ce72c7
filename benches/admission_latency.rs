//! Admission latency as kube-apiserver sees it: the share of confighash's webhook calls that
//! finish within 25 ms (kube-apiserver's `apiserver_admission_webhook_admission_duration_seconds`
//! bucket `le="0.025"`), beside a no-op webhook registered on the same rules for the same writes
//! in the same run (served by this process on loopback, answering `allowed` without a patch).
//!
//! Real cluster only (the stand-in has no such histogram): `source target/control-plane/e2e.env`
//! after `CONFIGHASH_REAL_KEEP=1 scripts/real-tier.sh -- none`, then
//!
//!   cargo bench --bench admission_latency        # CONFIGHASH_ADMISSION_WRITES=1000
//!
//! Writes: half CREATEs of Deployments that reference a ConfigMap and a Secret, half UPDATEs of
//! their pod templates, in one opted-in namespace, sent 8 at a time.
#[path = "../tests/e2e/support.rs"]
mod support;

use std::collections::BTreeMap;

use apiserver::TestWebhook;
use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use support::Env;

const NS: &str = "admission";
const BUCKET: &str = "0.025";

/// (calls within 25 ms, calls) per webhook name, summed over operations, from kube-apiserver's
/// metrics text.
fn shares(metrics: &str) -> BTreeMap<String, (f64, f64)> {
    let mut out: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) =
            line.strip_prefix("apiserver_admission_webhook_admission_duration_seconds_")
        else {
            continue;
        };
        let (series, value) = match rest.rsplit_once(' ') {
            Some((s, v)) => (s, v.parse::<f64>().unwrap_or(0.0)),
            None => continue,
        };
        let label = |key: &str| {
            series
                .split_once(&format!("{key}=\""))
                .and_then(|(_, r)| r.split_once('"'))
                .map(|(v, _)| v.to_owned())
        };
        let Some(name) = label("name") else { continue };
        if label("type").as_deref() != Some("admit") {
            continue;
        }
        let entry = out.entry(name).or_default();
        if series.starts_with("bucket") && label("le").as_deref() == Some(BUCKET) {
            entry.0 += value;
        } else if series.starts_with("count") {
            entry.1 += value;
        }
    }
    out
}

async fn apiserver_metrics(env: &Env) -> String {
    env.client
        .request_text(http::Request::get("/metrics").body(Vec::new()).unwrap())
        .await
        .expect("kube-apiserver's /metrics (the admin user may read it)")
}

async fn run() {
    let writes: usize = std::env::var("CONFIGHASH_ADMISSION_WRITES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000);
    let env = Env::start().await;
    if env.is_stand_in() {
        eprintln!(
            "admission_latency measures kube-apiserver's histogram: point it at a real cluster \
             (source target/control-plane/e2e.env)"
        );
        std::process::exit(2);
    }
    env.namespace(NS, true).await;
    env.config_map(NS, "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.secret(NS, "db", &[("password", "x")]).await;

    // The no-op webhook, on the same rules, for this namespace only.
    let noop = TestWebhook::start(|_| json!({"allowed": true})).await;
    let name = env.ns("zz-noop");
    let mut configuration = noop.configuration(&name, "Ignore");
    configuration["webhooks"][0]["name"] = json!("noop.example.test");
    configuration["webhooks"][0]["namespaceSelector"] =
        json!({"matchLabels": {"kubernetes.io/metadata.name": env.ns(NS)}});
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(env.client.clone());
    configurations
        .create(
            &PostParams::default(),
            &serde_json::from_value(configuration).unwrap(),
        )
        .await
        .unwrap();

    let before = shares(&apiserver_metrics(&env).await);
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns(NS));
    let n = writes / 2;
    futures::stream::iter(0..n)
        .for_each_concurrent(8, |i| {
            let deployments = deployments.clone();
            async move {
                let object = support::workload_object(
                    "Deployment",
                    &format!("web-{i}"),
                    &[("envFrom", "app-env"), ("secretEnvFrom", "db")],
                    json!({}),
                );
                deployments
                    .create(
                        &PostParams::default(),
                        &serde_json::from_value(object).unwrap(),
                    )
                    .await
                    .unwrap();
            }
        })
        .await;
    futures::stream::iter(0..n)
        .for_each_concurrent(8, |i| {
            let deployments = deployments.clone();
            async move {
                deployments
                    .patch(
                        &format!("web-{i}"),
                        &PatchParams::default(),
                        &Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [
                            {"name": "app", "image": "example/app:2"}
                        ]}}}})),
                    )
                    .await
                    .unwrap();
            }
        })
        .await;
    let after = shares(&apiserver_metrics(&env).await);
    configurations
        .delete(&name, &Default::default())
        .await
        .unwrap();

    println!("admission calls within 25 ms, {writes} writes (CREATE and UPDATE), 8 at a time");
    println!();
    println!("| webhook | calls | within 25 ms | share |");
    println!("|---|---|---|---|");
    for hook in ["stamp.confighash.dev", "noop.example.test"] {
        let (fast, count) = after.get(hook).copied().unwrap_or_default();
        let (fast0, count0) = before.get(hook).copied().unwrap_or_default();
        let (fast, count) = (fast - fast0, count - count0);
        println!(
            "| {hook} | {count:.0} | {fast:.0} | {:.1} % |",
            if count > 0.0 {
                100.0 * fast / count
            } else {
                0.0
            }
        );
    }
    println!();
    println!(
        "Both counted as the difference of two readings of kube-apiserver's /metrics around the \
         writes; the no-op webhook answered {} reviews.",
        noop.calls()
    );
}

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run());
}

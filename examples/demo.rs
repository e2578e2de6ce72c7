//! The whole flow with no cluster: `cargo run --release --example demo`.
//!
//! Starts the in-memory Kubernetes API server of `crates/testkit/src/apiserver` with confighash's webhook in
//! its admission chain (served over TLS by `serve`'s code) and the watcher running as deploy/'s
//! ServiceAccount, exactly as the end-to-end tests do (`crates/testkit/src/e2e/support.rs`). Then it applies
//! `examples/homer.yaml` (server-side apply, document by document) and shows, step by step, that
//!
//! - the Deployment is stamped at CREATE, so a fresh deploy rolls nothing afterwards;
//! - changing the config file homer mounts with `subPath` rolls it exactly once, with a
//!   `ConfigChanged` Event (step 1);
//! - a label-only edit (step 2) and a rewrite with identical data (step 3) roll nothing and
//!   touch nothing.
//!
//! Exits 0 when everything happened as described, 1 with what did not match otherwise.

use confighash_testkit::e2e::support;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use confighash::watcher::WatcherConfig;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use kube::error::DiscoveryError;
use serde_json::{Value, json};
use support::{Env, STAMP, Setup};

const MANIFEST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/homer.yaml");
/// `--debounce`: the change window. The default is 5 s; 1 s keeps the demo short.
const WINDOW: Duration = Duration::from_secs(1);
/// How long past the change window a quiet period lasts before "nothing happened" is believed.
const MARGIN: Duration = Duration::from_millis(1500);
/// How long something that must happen may take.
const DEADLINE: Duration = Duration::from_secs(15);
const POLL: Duration = Duration::from_millis(20);
const ENABLED: &str = "confighash.dev/enabled";
const MANAGER: &str = "demo";

#[tokio::main]
async fn main() -> ExitCode {
    if std::env::var_os("CONFIGHASH_E2E_KUBECONFIG").is_some() {
        eprintln!(
            "demo: CONFIGHASH_E2E_KUBECONFIG is set; the demo runs only against the in-memory \
             API server: unset it"
        );
        return ExitCode::from(2);
    }
    let demo = Demo {
        start: Instant::now(),
    };
    match demo.run().await {
        Ok(summary) => {
            demo.say(format!("OK: {summary}"));
            ExitCode::SUCCESS
        }
        Err(e) => {
            demo.say(format!("FAILED: {e:#}"));
            ExitCode::FAILURE
        }
    }
}

struct Demo {
    start: Instant,
}

/// What is watched for "nothing happened".
#[derive(Debug, Clone, PartialEq, Eq)]
struct Snapshot {
    rollouts: u64,
    touches: u64,
    stamp: Option<String>,
}

/// Where homer's config file comes from.
struct ConfigFile {
    config_map: String,
    key: String,
    mount_path: String,
}

impl Demo {
    fn say(&self, line: impl AsRef<str>) {
        println!(
            "[{:>6.2}s] {}",
            self.start.elapsed().as_secs_f64(),
            line.as_ref()
        );
    }

    async fn run(&self) -> Result<String> {
        let setup = Setup {
            watcher: WatcherConfig {
                debounce: WINDOW,
                ..Setup::default().watcher
            },
            ..Setup::default()
        };
        let env = Env::start_with(setup).await;
        self.say(format!(
            "in-memory API server up; confighash serve running: webhook over TLS in its admission \
             chain, watcher with a {}s change window",
            WINDOW.as_secs_f64()
        ));
        self.wait_for("the watcher's caches to sync", DEADLINE, async || {
            Ok(env
                .metrics
                .encode()
                .lines()
                .any(|l| l == "confighash_watcher_cache_synced 1")
                .then_some(()))
        })
        .await?;

        // Apply the manifests, the Namespace first.
        let text = std::fs::read_to_string(MANIFEST).with_context(|| format!("read {MANIFEST}"))?;
        let mut docs: Vec<Value> = serde_saphyr::from_multiple::<Value>(&text)
            .with_context(|| format!("parse {MANIFEST}"))?
            .into_iter()
            .filter(|d| !d.is_null())
            .collect();
        docs.sort_by_key(|d| d["kind"] != "Namespace");
        let ns = docs
            .iter()
            .find(|d| d["kind"] == "Namespace")
            .and_then(|d| d["metadata"]["name"].as_str())
            .context("examples/homer.yaml has no Namespace")?
            .to_owned();
        let mut applied = Vec::new();
        let mut skipped = Vec::new();
        let mut deployment = None;
        for mut doc in docs {
            let what = format!(
                "{}/{}",
                str_at(&doc, "/kind"),
                str_at(&doc, "/metadata/name")
            );
            if doc["kind"] == "Namespace" {
                // The opt-in: confighash acts only in namespaces with this label.
                doc["metadata"]["labels"][ENABLED] = json!("true");
                applied.push(format!("{what} ({ENABLED}=true)"));
            } else {
                doc["metadata"]["namespace"] = json!(ns);
                applied.push(what.clone());
            }
            match apply(&env.client, &ns, &doc).await? {
                Some(obj) if doc["kind"] == "Deployment" => deployment = Some(obj),
                Some(_) => {}
                None => {
                    applied.pop();
                    skipped.push(what);
                }
            }
        }
        self.say(format!(
            "applied examples/homer.yaml: {}",
            applied.join(", ")
        ));
        if !skipped.is_empty() {
            self.say(format!(
                "  skipped {} (not served by the in-memory API server; confighash ignores it)",
                skipped.join(", ")
            ));
        }
        let deployment = deployment.context("examples/homer.yaml has no Deployment")?;
        let name = str_at(&deployment, "/metadata/name").to_owned();
        let file = config_file(&deployment)?;

        // CREATE: the stamp is in the first pod template, so nothing rolls after a deploy.
        let created = deployment
            .pointer("/spec/template/metadata/annotations")
            .and_then(|a| a.get(STAMP))
            .and_then(Value::as_str)
            .context("the Deployment was not stamped at CREATE")?
            .to_owned();
        self.say(format!(
            "CREATE Deployment/{name}: the webhook stamped its pod template (recipe:key id:HMAC)"
        ));
        self.say(format!("  {STAMP}: {created}"));
        let mut now = self.snapshot(&env, &ns, &name).await?;
        if now.rollouts != 0 || now.stamp.as_deref() != Some(&created) {
            bail!("Deployment/{name} changed right after CREATE: {now:?}");
        }
        self.quiet(&env, &ns, &name, &now).await?;
        self.say(format!(
            "  no rollout, no touch by the end of the change window + {}s: nothing rolls after a \
             deploy",
            MARGIN.as_secs_f64()
        ));

        // 1) A content change rolls once.
        self.say(format!(
            "1) edit {} in ConfigMap/{} (kubectl edit)",
            file.key, file.config_map
        ));
        self.say(format!(
            "  homer mounts it at {} with subPath: running pods never see a change, new pods do",
            file.mount_path
        ));
        let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), &ns);
        let cm = cms.get(&file.config_map).await?;
        let old = cm
            .data
            .as_ref()
            .and_then(|d| d.get(&file.key))
            .with_context(|| format!("ConfigMap/{} has no key {}", file.config_map, file.key))?;
        let (line, edited) = edit_subtitle(old)?;
        cms.patch(
            &file.config_map,
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {&file.key: edited}})),
        )
        .await?;
        self.say(format!("  {line}"));
        let before = now.clone();
        now = self
            .wait_for("the rollout and its touch", DEADLINE, async || {
                // The rollout shows when the touch is stored; the watcher counts the touch
                // when it reads the answer, a moment later.
                let s = self.snapshot(&env, &ns, &name).await?;
                if s.rollouts > before.rollouts + 1 || s.touches > before.touches + 1 {
                    bail!(
                        "Deployment/{name} rolled {} times after {} touches, not once after one",
                        s.rollouts - before.rollouts,
                        s.touches - before.touches
                    );
                }
                let done = s.rollouts == before.rollouts + 1 && s.touches == before.touches + 1;
                Ok(done.then_some(s))
            })
            .await?;
        let stamp = now.stamp.clone().unwrap_or_default();
        if stamp == created {
            bail!("Deployment/{name} rolled but kept its stamp {created}");
        }
        self.say(format!(
            "  the change window closed, the watcher touched Deployment/{name}, the webhook \
             re-stamped it"
        ));
        self.say(format!("  {STAMP}: {stamp}"));
        self.quiet(&env, &ns, &name, &now).await?;
        self.say(format!(
            "  exactly 1 rollout and 1 touch; nothing more by the end of the change window + {}s",
            MARGIN.as_secs_f64()
        ));
        let event = self
            .wait_for("the ConfigChanged Event", DEADLINE, async || {
                let events = config_changed(&env, &ns, &name).await?;
                if events.len() > 1 {
                    bail!(
                        "{} ConfigChanged Events for one change, not 1",
                        events.len()
                    );
                }
                Ok(events.into_iter().next())
            })
            .await?;
        self.say(format!(
            "  Event on Deployment/{name}: {} {} \"{}\"",
            event.type_.as_deref().unwrap_or("?"),
            event.reason.as_deref().unwrap_or("?"),
            event.note.as_deref().unwrap_or("")
        ));

        // 2) and 3): metadata-only writes roll nothing.
        self.say(format!(
            "2) label-only edit of ConfigMap/{} (kubectl label)",
            file.config_map
        ));
        cms.patch(
            &file.config_map,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "homelab"}}})),
        )
        .await?;
        self.quiet(&env, &ns, &name, &now).await?;
        self.say(format!(
            "  no rollout, no touch by the end of the change window + {}s",
            MARGIN.as_secs_f64()
        ));

        self.say(format!(
            "3) rewrite ConfigMap/{} with identical data and a new annotation (kubectl replace)",
            file.config_map
        ));
        let mut cm = cms.get(&file.config_map).await?;
        cm.metadata
            .annotations
            .get_or_insert_default()
            .insert("homelab.example.net/synced-at".into(), "now".into());
        cms.replace(&file.config_map, &PostParams::default(), &cm)
            .await?;
        self.quiet(&env, &ns, &name, &now).await?;
        self.say(format!(
            "  no rollout, no touch by the end of the change window + {}s",
            MARGIN.as_secs_f64()
        ));
        let events = config_changed(&env, &ns, &name).await?.len();
        if events != 1 {
            bail!("{events} ConfigChanged Events at the end, not 1");
        }

        Ok(format!(
            "stamped at CREATE, {} rollout for one config change, none for a label edit or an \
             identical rewrite",
            now.rollouts
        ))
    }

    async fn snapshot(&self, env: &Env, ns: &str, name: &str) -> Result<Snapshot> {
        let touches = ["touched", "kept-by-webhook", "error", "gone"]
            .into_iter()
            .map(|outcome| env.metrics.touches(outcome))
            .sum();
        let deployments: Api<DynamicObject> =
            Api::namespaced_with(env.client.clone(), ns, &support::api_resource("Deployment"));
        let obj = serde_json::to_value(deployments.get(name).await?)?;
        Ok(Snapshot {
            rollouts: env.rollouts(ns, "Deployment", name).await,
            touches,
            stamp: obj
                .pointer("/spec/template/metadata/annotations")
                .and_then(|a| a.get(STAMP))
                .and_then(Value::as_str)
                .map(str::to_owned),
        })
    }

    /// Polls until the change window and the margin have passed, failing as soon as anything
    /// differs from `expected` (a rollout, a touch, a new stamp).
    async fn quiet(&self, env: &Env, ns: &str, name: &str, expected: &Snapshot) -> Result<()> {
        let until = Instant::now() + WINDOW + MARGIN;
        loop {
            let now = self.snapshot(env, ns, name).await?;
            if now != *expected {
                bail!(
                    "Deployment/{name} changed when nothing should have: {expected:?} -> {now:?}"
                );
            }
            if Instant::now() >= until {
                return Ok(());
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Polls `probe` until it gives a value, fails, or `deadline` passes.
    async fn wait_for<T>(
        &self,
        what: &str,
        deadline: Duration,
        mut probe: impl AsyncFnMut() -> Result<Option<T>>,
    ) -> Result<T> {
        let until = Instant::now() + deadline;
        loop {
            if let Some(v) = probe().await? {
                return Ok(v);
            }
            if Instant::now() >= until {
                bail!("timed out after {}s waiting for {what}", deadline.as_secs());
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// Server-side applies one manifest document; None when the API server does not serve its kind.
async fn apply(client: &kube::Client, ns: &str, doc: &Value) -> Result<Option<Value>> {
    let (group, version) = match str_at(doc, "/apiVersion").split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", str_at(doc, "/apiVersion")),
    };
    let gvk = GroupVersionKind::gvk(group, version, str_at(doc, "/kind"));
    let (resource, caps) = match kube::discovery::pinned_kind(client, &gvk).await {
        Ok(found) => found,
        Err(kube::Error::Discovery(DiscoveryError::MissingKind(_))) => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("discover {gvk:?}")),
    };
    let api: Api<DynamicObject> = if caps.scope == kube::discovery::Scope::Namespaced {
        Api::namespaced_with(client.clone(), ns, &resource)
    } else {
        Api::all_with(client.clone(), &resource)
    };
    let name = str_at(doc, "/metadata/name");
    let obj = api
        .patch(name, &PatchParams::apply(MANAGER), &Patch::Apply(doc))
        .await
        .with_context(|| format!("apply {}/{name}", gvk.kind))?;
    Ok(Some(serde_json::to_value(obj)?))
}

/// The ConfigMap key a container of the Deployment mounts with `subPath`.
fn config_file(deployment: &Value) -> Result<ConfigFile> {
    let spec = &deployment["spec"]["template"]["spec"];
    let empty = Vec::new();
    let volumes = spec["volumes"].as_array().unwrap_or(&empty);
    for container in spec["containers"].as_array().unwrap_or(&empty) {
        for mount in container["volumeMounts"].as_array().unwrap_or(&empty) {
            let Some(key) = mount["subPath"].as_str() else {
                continue;
            };
            let volume = volumes.iter().find(|v| v["name"] == mount["name"]);
            if let Some(cm) = volume.and_then(|v| v["configMap"]["name"].as_str()) {
                return Ok(ConfigFile {
                    config_map: cm.to_owned(),
                    key: key.to_owned(),
                    mount_path: str_at(mount, "/mountPath").to_owned(),
                });
            }
        }
    }
    bail!("the Deployment mounts no ConfigMap key with subPath")
}

/// The file with its `subtitle:` value changed, and a line saying how.
fn edit_subtitle(file: &str) -> Result<(String, String)> {
    let old = file
        .lines()
        .find(|l| l.starts_with("subtitle:"))
        .context("the config file has no top-level subtitle: line")?;
    let new = "subtitle: \"k3s @ home, rolled by confighash\"";
    Ok((format!("{old}  ->  {new}"), file.replacen(old, new, 1)))
}

/// The ConfigChanged Events recorded for the Deployment `name`.
async fn config_changed(env: &Env, ns: &str, name: &str) -> Result<Vec<Event>> {
    Ok(Api::<Event>::namespaced(env.client.clone(), ns)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("ConfigChanged")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .collect())
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

//! Faults a real control plane makes itself, shared by the scenarios that cause them
//! (`tests/e2e/real_faults.rs`) and the fault run's real-cluster mode
//! (`crates/testkit/src/e2e/fault_run.rs`): API Priority and Fairness refusing confighash's reads
//! ([`Jail`]), and `scripts/control-plane.sh` restarting components or compacting etcd
//! ([`control_plane`]).

use std::time::Duration;

use crate::apiserver::TestWebhook;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::json;

use crate::e2e::support::{self, Env};

/// The user whose request holds the jail's one running request.
const HOLDER: &str = "confighash-e2e-jail-holder";

/// How long the holder's request waits in admission.
const HOLD: Duration = Duration::from_secs(25);

const FLOW_CONTROL: (&str, &str) = ("flowcontrol.apiserver.k8s.io", "v1");

fn flow_control(kind: &str) -> ApiResource {
    let plural = match kind {
        "FlowSchema" => "flowschemas",
        _ => "prioritylevelconfigurations",
    };
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(FLOW_CONTROL.0, FLOW_CONTROL.1, kind),
        plural,
    )
}

/// A priority level with no seats that rejects; a FlowSchema sending to it confighash's GETs of
/// ConfigMaps in `namespace` and the [`HOLDER`]'s CREATEs of ConfigMaps in `hold`; a webhook
/// that keeps those CREATEs waiting [`HOLD`]. Dropping this deletes the three (also when the
/// scenario fails), from a thread and client of its own.
pub struct Jail {
    config: kube::Config,
    name: String,
    _hook: TestWebhook,
}

impl Jail {
    pub async fn start(env: &Env, user: &str, namespace: &str, hold: &str) -> Jail {
        // The holder may create ConfigMaps in `hold` and nothing else. (It is not in
        // `system:masters`: the `exempt` FlowSchema would take its requests.)
        let rbac: [(&str, serde_json::Value); 2] = [
            (
                "Role",
                json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                    "metadata": {"name": "holder", "namespace": hold},
                    "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}],
                }),
            ),
            (
                "RoleBinding",
                json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                    "metadata": {"name": "holder", "namespace": hold},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "holder"},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": HOLDER}],
                }),
            ),
        ];
        for (kind, object) in rbac {
            let plural = if kind == "Role" {
                "roles"
            } else {
                "rolebindings"
            };
            let resource = ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", kind),
                plural,
            );
            Api::<DynamicObject>::namespaced_with(env.client.clone(), hold, &resource)
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(object).unwrap(),
                )
                .await
                .unwrap();
        }
        let hook = TestWebhook::delaying(HOLD).await;
        let mut configuration = hook.configuration(&env.ns("confighash-e2e-jail"), "Ignore");
        configuration["webhooks"][0]["name"] = json!("hold.example.test");
        configuration["webhooks"][0]["timeoutSeconds"] = json!(30);
        configuration["webhooks"][0]["rules"] = json!([{"apiGroups": [""], "apiVersions": ["v1"],
            "operations": ["CREATE"], "resources": ["configmaps"]}]);
        configuration["webhooks"][0]["namespaceSelector"] =
            json!({"matchLabels": {"kubernetes.io/metadata.name": hold}});
        Api::<MutatingWebhookConfiguration>::all(env.client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(configuration).unwrap(),
            )
            .await
            .unwrap();
        let name = env.ns("confighash-e2e-jail");
        let (sa_namespace, sa_name) = user
            .strip_prefix("system:serviceaccount:")
            .and_then(|rest| rest.split_once(':'))
            .expect("confighash runs as a ServiceAccount");
        let level: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "kind": "PriorityLevelConfiguration",
            "metadata": {"name": name},
            "spec": {"type": "Limited", "limited": {
                "nominalConcurrencyShares": 0,
                "lendablePercent": 0,
                "borrowingLimitPercent": 0,
                "limitResponse": {"type": "Reject"},
            }},
        }))
        .unwrap();
        let schema: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "kind": "FlowSchema",
            "metadata": {"name": name},
            "spec": {
                "priorityLevelConfiguration": {"name": name},
                "matchingPrecedence": 200,
                "rules": [{
                    "subjects": [{"kind": "ServiceAccount",
                        "serviceAccount": {"namespace": sa_namespace, "name": sa_name}}],
                    "resourceRules": [{"verbs": ["get"], "apiGroups": [""],
                        "resources": ["configmaps"], "namespaces": [namespace]}],
                }, {
                    "subjects": [{"kind": "User", "user": {"name": HOLDER}}],
                    "resourceRules": [{"verbs": ["create"], "apiGroups": [""],
                        "resources": ["configmaps"], "namespaces": [hold]}],
                }],
            },
        }))
        .unwrap();
        for (kind, object) in [
            ("PriorityLevelConfiguration", level),
            ("FlowSchema", schema),
        ] {
            Api::<DynamicObject>::all_with(env.client.clone(), &flow_control(kind))
                .create(&PostParams::default(), &object)
                .await
                .unwrap();
        }
        Jail {
            config: env.real_config().expect("a real cluster"),
            name,
            _hook: hook,
        }
    }

    /// Starts the holder's request (a CREATE of a ConfigMap in `hold`, as [`HOLDER`]): it runs in
    /// the jail's level for [`HOLD`], so the level is never idle.
    pub fn hold(&self, hold: &str) -> tokio::task::JoinHandle<()> {
        let mut config = self.config.clone();
        config.auth_info.impersonate = Some(HOLDER.to_owned());
        let hold = hold.to_owned();
        tokio::spawn(async move {
            let client = kube::Client::try_from(config).unwrap();
            let object: ConfigMap = serde_json::from_value(json!({
                "metadata": {"generateName": "holder-"},
            }))
            .unwrap();
            let _ = Api::<ConfigMap>::namespaced(client, &hold)
                .create(&PostParams::default(), &object)
                .await;
        })
    }
}

impl Jail {
    /// Starts holders until a read of confighash's (as `user`) of a ConfigMap in `namespace` is
    /// refused, and returns them (abort them once the jail is dropped). kube-apiserver takes the
    /// new FlowSchema a moment after it is created, and a holder that started before runs in
    /// another level: so a holder is started, and another every 2 s, until a read is refused.
    pub async fn until_refused(
        &self,
        env: &Env,
        user: &str,
        namespace: &str,
        hold: &str,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let mut as_confighash = self.config.clone();
        as_confighash.auth_info.impersonate = Some(user.to_owned());
        let as_confighash = kube::Client::try_from(as_confighash).unwrap();
        let cms: Api<ConfigMap> = Api::namespaced(as_confighash, namespace);
        let probe = env.ns("confighash-e2e-jail-probe");
        let mut holders = Vec::new();
        let start = tokio::time::Instant::now();
        loop {
            holders.push(self.hold(hold));
            let next = tokio::time::Instant::now() + Duration::from_secs(2);
            while tokio::time::Instant::now() < next {
                // kube's client retries a 429 after its Retry-After: a read refused goes on
                // retrying, so a read that has not come back within a second was refused.
                match tokio::time::timeout(Duration::from_secs(1), cms.get_opt(&probe)).await {
                    Err(_) => return holders,
                    Ok(Err(kube::Error::Api(s))) if s.code == 429 => return holders,
                    Ok(_) => {}
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert!(
                start.elapsed() < support::DEADLINE,
                "kube-apiserver did not refuse confighash's reads with 429"
            );
        }
    }
}

impl Drop for Jail {
    fn drop(&mut self) {
        let name = self.name.clone();
        let what = format!("deleting the priority level {name}");
        support::clean_up(self.config.clone(), &what, |client| async move {
            for kind in ["FlowSchema", "PriorityLevelConfiguration"] {
                Api::<DynamicObject>::all_with(client.clone(), &flow_control(kind))
                    .delete(&name, &Default::default())
                    .await
                    .map_err(|e| format!("the {kind}: {e}"))?;
            }
            Api::<MutatingWebhookConfiguration>::all(client)
                .delete(&name, &Default::default())
                .await
                .map(|_| ())
                .map_err(|e| format!("the webhook configuration: {e}"))
        });
    }
}

/// Runs `scripts/control-plane.sh VERB` on the real tier's control plane.
pub async fn control_plane(args: &[&str]) {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/control-plane.sh"
    );
    let status = tokio::process::Command::new(script)
        .args(args)
        .status()
        .await
        .unwrap_or_else(|e| panic!("{script}: {e}"));
    assert!(status.success(), "control-plane.sh {args:?}: {status}");
}

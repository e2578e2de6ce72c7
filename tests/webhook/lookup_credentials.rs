//! The webhook's lookups authenticate as kube's client does. Bound service account tokens expire
//! and the kubelet rotates the token file; the lookups read the file again (as kube does: at least
//! once a minute) and go on working with the new token once the old one is revoked.

use std::time::{Duration, Instant};

use confighash::cluster::get::Getter;
use confighash::core::refs::{ObjectKind, ObjectRef};
use confighash::webhook::budget::MemoryBudget;
use confighash::webhook::lookup::{Fetched, KubeSource, ObjectSource, ReadError};
use confighash_testkit::apiserver::server::ApiServer;
use confighash_testkit::apiserver::user::UserInfo;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

async fn fetch(source: &KubeSource) -> Result<Option<Fetched>, ReadError> {
    let budget = MemoryBudget::new(64 * 1024 * 1024);
    let object = ObjectRef::new(ObjectKind::ConfigMap, "app-env");
    source.fetch("shop", &object, &budget).await
}

#[tokio::test]
async fn a_rotated_token_file_is_read_again() {
    let api = ApiServer::start().await;
    let admin = api.client();
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "shop"}})).unwrap();
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    let config_map: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "app-env"},
        "data": {"LOG_LEVEL": "info"}
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(admin, "shop")
        .create(&PostParams::default(), &config_map)
        .await
        .unwrap();

    let user = UserInfo::service_account("confighash", "confighash");
    api.add_token("token-a", user.clone());
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "token-a").unwrap();
    let mut config = api.config();
    config.auth_info.token_file = Some(token_file.to_string_lossy().into_owned());
    let started = Instant::now();
    let source = KubeSource::new(Getter::new(&config).unwrap());
    assert!(
        matches!(fetch(&source).await, Ok(Some(_))),
        "read with the first token"
    );

    // The kubelet writes the new token; the old one expires.
    std::fs::write(&token_file, "token-b").unwrap();
    api.add_token("token-b", user);
    api.revoke_token("token-a");
    let refused = fetch(&source).await;
    assert!(
        matches!(&refused, Err(ReadError::Status(s)) if s.as_u16() == 401),
        "the old token, still held, is refused: {:?}",
        refused.map(|f| f.is_some())
    );

    // kube reads the file again before a minute has passed since it read it.
    let deadline = started + Duration::from_secs(75);
    loop {
        match fetch(&source).await {
            Ok(Some(_)) => break,
            other => assert!(
                Instant::now() < deadline,
                "the rotated token was not used within 75 s: {:?}",
                other.map(|f| f.is_some())
            ),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "the rotated token was used {:.0?} after the first read",
        started.elapsed()
    );
}

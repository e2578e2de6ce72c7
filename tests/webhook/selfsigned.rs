//! `--self-signed-certs` against the in-memory API server: replicas agree on one CA, the caBundle
//! is published, and renewal and CA rotation never fail a request made with the published bundle.

use crate::build;
use crate::wait;

use std::sync::Arc;
use std::time::Duration;

use confighash::certs::key::KeyStore;
use confighash::certs::selfsigned::{self, SelfSignedConfig};
use confighash::cluster::get::Getter;
use confighash::core::checksum::StampKey;
use confighash::metrics::Metrics;
use confighash::serving::health::Health;
use confighash::serving::tls::CertStore;
use confighash::webhook::admission::Webhook;
use confighash::webhook::lookup::KubeSource;
use confighash::webhook::server::{self as serve, WebhookServeConfig};
use confighash_testkit::apiserver::{ApiServer, HttpsClient};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

async fn cluster() -> (ApiServer, kube::Client) {
    let api = ApiServer::start().await;
    let client = api.client();
    build::create_namespace(&client, "confighash", &[]).await;
    let mwc: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": "confighash"},
        "webhooks": [{
            "name": "stamp.confighash.dev",
            "clientConfig": {"service": {"name": "confighash", "namespace": "confighash", "path": "/mutate"}},
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"]
        }]
    }))
    .unwrap();
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &mwc)
        .await
        .unwrap();
    (api, client)
}

/// A configuration whose certificate names `localhost`, so a loopback client can verify it.
fn config(dir: &std::path::Path) -> SelfSignedConfig {
    let mut c = SelfSignedConfig::new("confighash", dir.join("tls.crt"), dir.join("tls.key"));
    c.service = "localhost".into();
    c
}

async fn published_bundle(client: &kube::Client) -> String {
    let mwc = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get("confighash")
        .await
        .unwrap();
    let bundles: Vec<String> = mwc
        .webhooks
        .unwrap()
        .iter()
        .map(|w| {
            String::from_utf8(w.client_config.ca_bundle.clone().unwrap_or_default().0).unwrap()
        })
        .collect();
    assert!(
        bundles.iter().all(|b| *b == bundles[0]),
        "every webhook carries the same bundle"
    );
    bundles[0].clone()
}

async fn start_webhook(client: &kube::Client, dir: &std::path::Path) -> serve::RunningWebhook {
    let certs = CertStore::load(dir.join("tls.crt"), dir.join("tls.key")).unwrap();
    serve::start(WebhookServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        certs,
        client_ca: None,
        webhook: Arc::new(
            Webhook::new(
                Arc::new(KubeSource::new(Getter::from_client(client.clone()))),
                Arc::new(KeyStore::new(StampKey::new(vec![7u8; 32]).unwrap())),
                Arc::new(Metrics::new()),
            )
            .with_lookup_deadline(Duration::from_secs(2)),
        ),
        health: Arc::new(Health::default()),
        cert_poll: Duration::from_millis(20),
        header_read_timeout: Duration::from_secs(5),
        drain_timeout: Duration::from_secs(2),
    })
    .await
    .unwrap()
}

/// One request as the API server makes it: trusting exactly the published caBundle.
async fn call(client: &kube::Client, port: u16) -> Result<u16, String> {
    let bundle = published_bundle(client).await;
    let https = HttpsClient::new(&bundle);
    https
        .post(&format!("https://localhost:{port}/mutate"), b"{}".to_vec())
        .await
        .map(|r| r.status)
}

#[tokio::test]
async fn replicas_starting_together_share_one_ca_and_publish_it() {
    let (_api, client) = cluster().await;
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let (ca, cb) = (config(dirs[0].path()), config(dirs[1].path()));
    let (a, b) = tokio::join!(
        selfsigned::ensure(&client, &ca),
        selfsigned::ensure(&client, &cb)
    );
    a.unwrap();
    b.unwrap();
    let secrets = Api::<Secret>::namespaced(client.clone(), "confighash")
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(secrets.items.len(), 1, "one Secret");
    let data = secrets.items[0].data.clone().unwrap();
    let ca = String::from_utf8(data["ca.crt"].0.clone()).unwrap();
    assert_eq!(
        published_bundle(&client).await.trim(),
        ca.trim(),
        "the caBundle is the one CA"
    );
    for d in &dirs {
        assert_eq!(
            std::fs::read(d.path().join("tls.crt")).unwrap(),
            data["tls.crt"].0,
            "both replicas serve the shared pair"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = |f: &str| {
            std::fs::metadata(d.path().join(f))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode("tls.key"), 0o600, "the key is its owner's only");
        assert_eq!(mode("tls.crt"), 0o644, "the certificate is readable");
    }
    let running = start_webhook(&client, dirs[0].path()).await;
    assert_eq!(
        call(&client, running.webhook_addr.port()).await.unwrap(),
        400,
        "reachable with the published bundle"
    );
    running.shutdown().await;
}

#[tokio::test]
async fn renewal_and_ca_rotation_fail_no_request() {
    let (_api, client) = cluster().await;
    let dir = tempfile::tempdir().unwrap();
    // The first serving certificate is short-lived, so the renewal below finds it due.
    let mut base = config(dir.path());
    base.cert_validity = Duration::from_secs(3600);
    base.renew_before = Duration::from_secs(1800);
    selfsigned::ensure(&client, &base).await.unwrap();
    let first_ca = published_bundle(&client).await;
    let running = start_webhook(&client, dir.path()).await;
    let port = running.webhook_addr.port();

    // A client keeps calling the webhook the way the API server does, throughout.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let caller = {
        let (client, stop) = (client.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut ok, mut failed) = (0u32, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                match call(&client, port).await {
                    Ok(400) => ok += 1,
                    other => failed.push(format!("{other:?}")),
                }
            }
            (ok, failed)
        })
    };
    let served = |path: std::path::PathBuf| move || std::fs::read_to_string(&path).unwrap();
    let tls = served(dir.path().join("tls.crt"));

    // Renewal: the serving certificate is due, so it is re-issued by the same CA.
    let before = tls();
    let mut renew = base.clone();
    renew.renew_before = Duration::from_secs(2 * 3600);
    renew.cert_validity = Duration::from_secs(90 * 24 * 3600);
    selfsigned::ensure(&client, &renew).await.unwrap();
    assert_ne!(tls(), before, "renewed");
    assert_eq!(
        published_bundle(&client).await,
        first_ca,
        "renewal keeps the CA"
    );

    // Rotation, steps 1 and 2: a new CA joins the bundle, then signs the serving certificate.
    let mut rotate = renew.clone();
    rotate.rotate_ca_before = rotate.ca_validity * 2;
    rotate.check_interval = Duration::from_secs(3600);
    selfsigned::ensure(&client, &rotate).await.unwrap();
    let bundle = published_bundle(&client).await;
    assert!(
        bundle.contains(first_ca.trim()),
        "the old CA stays trusted during the overlap"
    );
    assert!(
        bundle.len() > first_ca.len(),
        "the new CA joined the bundle"
    );
    // The server picks up the new CA's certificate: a client trusting only the new CA gets in.
    let new_ca = bundle
        .split("-----END CERTIFICATE-----")
        .next()
        .unwrap()
        .to_owned()
        + "-----END CERTIFICATE-----\n";
    assert!(!new_ca.contains(first_ca.trim()));
    let only_new = HttpsClient::new(&new_ca);
    let url = format!("https://localhost:{port}/mutate");
    wait::eventually("the new certificate to be served", async || {
        only_new.post(&url, b"{}".to_vec()).await.is_ok()
    })
    .await;
    // Step 3: once replicas have had two checks to load it, the old CA leaves the bundle (the
    // certificate is back-dated five minutes, so with a 1 ms check that time has passed).
    let mut finish = renew.clone();
    finish.check_interval = Duration::from_millis(1);
    selfsigned::ensure(&client, &finish).await.unwrap();
    let last = published_bundle(&client).await;
    assert!(!last.contains(first_ca.trim()), "the old CA is gone");
    assert!(bundle.contains(last.trim()), "the new CA is what remains");

    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (ok, failed) = caller.await.unwrap();
    assert!(failed.is_empty(), "failed requests: {failed:?}");
    assert!(ok > 0);
    running.shutdown().await;
}

/// `--self-signed-name 127.0.0.1`, added to a release whose Secret already holds a pair without
/// it: the serving certificate is re-issued by the same CA with the IP address as an IP SAN, so
/// an API server calling the webhook at `https://127.0.0.1:PORT` (the chart's `webhook.url`)
/// verifies it with the published bundle, which does not change.
#[tokio::test]
async fn an_added_name_reissues_the_certificate_from_the_same_ca() {
    let (_api, client) = cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let before = config(dir.path());
    selfsigned::ensure(&client, &before).await.unwrap();
    let bundle = published_bundle(&client).await;
    let first = std::fs::read(dir.path().join("tls.crt")).unwrap();
    let running = start_webhook(&client, dir.path()).await;
    let port = running.webhook_addr.port();
    let by_ip = || async {
        HttpsClient::new(&published_bundle(&client).await)
            .post(&format!("https://127.0.0.1:{port}/mutate"), b"{}".to_vec())
            .await
            .map(|r| r.status)
    };
    assert!(
        by_ip().await.is_err(),
        "the Service-only certificate does not verify for 127.0.0.1"
    );

    let mut after = config(dir.path());
    after.extra_names = vec!["127.0.0.1".into()];
    selfsigned::ensure(&client, &after).await.unwrap();
    let second = std::fs::read(dir.path().join("tls.crt")).unwrap();
    assert_ne!(first, second, "re-issued");
    assert_eq!(published_bundle(&client).await, bundle, "the same CA");
    // The certificate store polls the files every 20 ms.
    wait::eventually("the re-issued certificate to be served", async || {
        by_ip().await == Ok(400)
    })
    .await;
    // Nothing more is due: a second pass leaves the pair as it is.
    selfsigned::ensure(&client, &after).await.unwrap();
    assert_eq!(std::fs::read(dir.path().join("tls.crt")).unwrap(), second);
    running.shutdown().await;
}

//! The installation's key from a Secret, against the in-memory API server: creation when absent,
//! the creation race between replicas, refused content, retries, and reloading by the watch.

use crate::build;
use crate::wait;

use std::io::Write;
use std::sync::{Arc, Mutex};

use build::{create_namespace, secret};
use confighash::certs::key::{self, KeyLoadError, KeyStore};
use confighash::core::checksum::StampKey;
use confighash_testkit::apiserver::ApiServer;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tracing::instrument::WithSubscriber;

const NS: &str = "confighash-system";
const SECRET: &str = "confighash-key";

async fn setup() -> (ApiServer, Client) {
    let server = ApiServer::start().await;
    let client = server.client();
    create_namespace(&client, NS, &[]).await;
    (server, client)
}

fn secrets(client: &Client) -> Api<Secret> {
    Api::namespaced(client.clone(), NS)
}

async fn create_secret(client: &Client, data: &[(&str, &[u8])]) {
    secrets(client)
        .create(&PostParams::default(), &secret(SECRET, data))
        .await
        .expect("Secret created");
}

/// Replaces the Secret's data with `data` (a merge patch with `null` drops the other keys).
async fn set_data(client: &Client, data: &[(&str, &[u8])]) {
    let old = secrets(client).get(SECRET).await.unwrap();
    let mut patch: serde_json::Map<String, serde_json::Value> = old
        .data
        .unwrap_or_default()
        .into_keys()
        .map(|k| (k, serde_json::Value::Null))
        .collect();
    for (k, v) in data {
        patch.insert(
            k.to_string(),
            serde_json::to_value(ByteString(v.to_vec())).unwrap(),
        );
    }
    secrets(client)
        .patch(
            SECRET,
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": patch })),
        )
        .await
        .expect("Secret patched");
}

fn stored_key(client_secret: &Secret) -> Vec<u8> {
    client_secret.data.as_ref().expect("data")["key"].0.clone()
}

fn id_of(bytes: &[u8]) -> String {
    StampKey::new(bytes.to_vec()).unwrap().id().to_owned()
}

#[tokio::test]
async fn absent_secret_is_created_with_a_random_key() {
    let (server, client) = setup().await;
    let store = key::from_secret(client.clone(), NS, SECRET).await.unwrap();

    let secret = secrets(&client)
        .get(SECRET)
        .await
        .expect("the Secret exists");
    let bytes = stored_key(&secret);
    assert_eq!(bytes.len(), 32);
    assert_eq!(store.current().id(), id_of(&bytes));
    assert_eq!(secret.type_.as_deref(), Some("Opaque"));
    let labels = secret.metadata.labels.unwrap_or_default();
    assert_eq!(labels["app.kubernetes.io/name"], "confighash");
    let annotations = secret.metadata.annotations.unwrap_or_default();
    assert!(
        annotations
            .values()
            .any(|v| v.contains("confighash") && v.contains("key")),
        "an annotation says what the Secret is: {annotations:?}"
    );
    assert!(server.object("secrets", NS, SECRET).is_some());

    // A second replica (or a restart) reads the same key.
    let again = key::from_secret(client.clone(), NS, SECRET).await.unwrap();
    assert_eq!(again.current().id(), store.current().id());

    // Two installations get different keys.
    let (_other_server, other_client) = setup().await;
    let other = key::from_secret(other_client, NS, SECRET).await.unwrap();
    assert_ne!(other.current().id(), store.current().id());
}

#[tokio::test]
async fn existing_secret_key_is_used_as_is() {
    let (_server, client) = setup().await;
    // Binary bytes with a trailing newline: taken exactly, after base64 decoding.
    let bytes: &[u8] = b"\x00\xffan existing key that someone chose\n";
    create_secret(&client, &[("key", bytes), ("other", b"ignored")]).await;
    let store = key::from_secret(client.clone(), NS, SECRET).await.unwrap();
    assert_eq!(store.current().id(), id_of(bytes));
    let secret = secrets(&client).get(SECRET).await.unwrap();
    assert_eq!(
        stored_key(&secret),
        bytes,
        "an existing key is never rewritten"
    );
}

#[tokio::test]
async fn concurrent_replicas_agree_on_one_key() {
    let (server, client) = setup().await;
    let loads = (0..8).map(|_| {
        let client = client.clone();
        tokio::spawn(async move { key::from_secret(client, NS, SECRET).await })
    });
    let stores: Vec<Arc<KeyStore>> = futures::future::join_all(loads)
        .await
        .into_iter()
        .map(|r| r.expect("task").expect("key loaded"))
        .collect();
    let secret = secrets(&client).get(SECRET).await.unwrap();
    let winner = id_of(&stored_key(&secret));
    for store in &stores {
        assert_eq!(store.current().id(), winner);
    }
    let list = secrets(&client).list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1, "exactly one Secret exists");
    let creates = server
        .requests()
        .iter()
        .filter(|(verb, what)| verb == "create" && what == "secrets")
        .count();
    assert!(
        creates >= 2,
        "the replicas really raced ({creates} creates)"
    );
}

#[tokio::test]
async fn short_key_is_refused() {
    let (_server, client) = setup().await;
    create_secret(&client, &[("key", b"fifteen bytes!!")]).await;
    let err = key::from_secret(client.clone(), NS, SECRET)
        .await
        .unwrap_err();
    assert!(matches!(err, KeyLoadError::SecretKey { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(&format!("{NS}/{SECRET}")), "{msg}");
    assert!(msg.contains("15 bytes"), "{msg}");
    assert!(msg.contains("at least 16"), "{msg}");
    let secret = secrets(&client).get(SECRET).await.unwrap();
    assert_eq!(
        stored_key(&secret),
        b"fifteen bytes!!",
        "the Secret is left alone"
    );
}

#[tokio::test]
async fn secret_without_key_entry_is_refused() {
    let (_server, client) = setup().await;
    create_secret(&client, &[("hmac", b"0123456789abcdef0123456789abcdef")]).await;
    let err = key::from_secret(client.clone(), NS, SECRET)
        .await
        .unwrap_err();
    assert!(matches!(err, KeyLoadError::MissingKey { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(&format!("{NS}/{SECRET}")), "{msg}");
    assert!(msg.contains("`key`"), "{msg}");
    let secret = secrets(&client).get(SECRET).await.unwrap();
    assert!(
        !secret.data.unwrap().contains_key("key"),
        "the Secret is left alone"
    );

    // A Secret with no data at all is refused the same way.
    secrets(&client)
        .delete(SECRET, &DeleteParams::default())
        .await
        .unwrap();
    create_secret(&client, &[]).await;
    let err = key::from_secret(client, NS, SECRET).await.unwrap_err();
    assert!(matches!(err, KeyLoadError::MissingKey { .. }), "{err:?}");
}

#[tokio::test]
async fn transient_failures_are_retried() {
    let (server, client) = setup().await;
    let bytes: &[u8] = b"0123456789abcdef0123456789abcdef";
    create_secret(&client, &[("key", bytes)]).await;
    let gets = |s: &ApiServer| {
        s.requests()
            .iter()
            .filter(|(verb, what)| verb == "get" && what == "secrets")
            .count()
    };
    let before = gets(&server);
    server.fail_next(Some("get"), Some("secrets"), 2, 500);
    let store = key::from_secret(client.clone(), NS, SECRET).await.unwrap();
    assert_eq!(store.current().id(), id_of(bytes));
    assert_eq!(
        gets(&server),
        before + 3,
        "two failed reads, then one that worked"
    );

    // Failures of the create are retried too.
    secrets(&client)
        .delete(SECRET, &DeleteParams::default())
        .await
        .unwrap();
    server.fail_next(Some("create"), Some("secrets"), 2, 500);
    let store = key::from_secret(client.clone(), NS, SECRET).await.unwrap();
    let secret = secrets(&client).get(SECRET).await.unwrap();
    assert_eq!(store.current().id(), id_of(&stored_key(&secret)));
}

#[tokio::test]
async fn persistent_failures_give_up_with_a_clear_error() {
    let (server, client) = setup().await;
    server.fail_next(Some("get"), Some("secrets"), 1000, 500);
    let err = key::from_secret(client, NS, SECRET).await.unwrap_err();
    assert!(matches!(err, KeyLoadError::Api { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(&format!("{NS}/{SECRET}")), "{msg}");
    assert!(msg.contains("attempt"), "{msg}");
}

#[tokio::test]
async fn permanent_errors_are_not_retried() {
    let (server, client) = setup().await;
    // No such namespace: the create is NotFound, which is final.
    let err = key::from_secret(client, "nowhere", SECRET)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, KeyLoadError::Api { attempts: 1, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains(&format!("nowhere/{SECRET}")));
    let creates = server
        .requests()
        .iter()
        .filter(|(verb, what)| verb == "create" && what == "secrets")
        .count();
    assert_eq!(creates, 1);
}

/// Log lines written by the code under test (plain text, no colours).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    fn lines_with(&self, level: &str, needle: &str) -> usize {
        self.text()
            .lines()
            .filter(|l| l.contains(level) && l.contains(needle))
            .count()
    }
}

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn the_watch_reloads_good_keys_and_keeps_the_old_one_otherwise() {
    let (server, client) = setup().await;
    let first: &[u8] = b"first key, thirty-two bytes long";
    create_secret(&client, &[("key", first)]).await;
    let store = key::from_secret(client.clone(), NS, SECRET).await.unwrap();
    assert_eq!(store.current().id(), id_of(first));

    let logs = Logs::default();
    let subscriber = {
        let logs = logs.clone();
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || logs.clone())
            .finish()
    };
    let task = tokio::spawn(
        key::watch_secret(store.clone(), client.clone(), NS.into(), SECRET.into())
            .with_subscriber(subscriber),
    );
    let has_id = |bytes: &'static [u8]| {
        let store = store.clone();
        let id = id_of(bytes);
        async move || store.current().id() == id
    };

    // A changed key is reloaded.
    let second: &[u8] = b"second key, also long enough!!!";
    set_data(&client, &[("key", second)]).await;
    wait::eventually("the second key", has_id(second)).await;
    wait::eventually("the change logged", async || {
        logs.lines_with("INFO", &id_of(second)) >= 1
    })
    .await;

    // Too short: the old key stays, and an error names the Secret.
    set_data(&client, &[("key", b"short")]).await;
    wait::eventually("the refused key logged", async || {
        logs.lines_with("ERROR", SECRET) >= 1
    })
    .await;
    assert_eq!(store.current().id(), id_of(second));

    // Missing entry: the same.
    set_data(&client, &[("not-key", second)]).await;
    wait::eventually("the missing entry logged", async || {
        logs.lines_with("ERROR", SECRET) >= 2
    })
    .await;
    assert_eq!(store.current().id(), id_of(second));

    // Deleted: the current key stays, with a warning.
    secrets(&client)
        .delete(SECRET, &DeleteParams::default())
        .await
        .unwrap();
    wait::eventually("the deletion logged", async || {
        logs.lines_with("WARN", "deleted") >= 1
    })
    .await;
    assert_eq!(store.current().id(), id_of(second));

    // Created again with a good key: picked up.
    let third: &[u8] = b"third key, created after delete";
    create_secret(&client, &[("key", third)]).await;
    wait::eventually("the third key", has_id(third)).await;

    // Dropped watches are survived.
    server.close_watches();
    let fourth: &[u8] = b"fourth key, after a dropped watch";
    set_data(&client, &[("key", fourth)]).await;
    wait::eventually("the fourth key after a dropped watch", has_id(fourth)).await;

    // So is compacted history (410 Gone on the re-watch).
    server.compact();
    server.close_watches();
    let fifth: &[u8] = b"fifth key, after a compaction!!";
    set_data(&client, &[("key", fifth)]).await;
    wait::eventually("the fifth key after 410", has_id(fifth)).await;

    task.abort();
    let _ = task.await;
    let text = logs.text();
    for key in [first, second, third, fourth, fifth] {
        let key = String::from_utf8_lossy(key);
        assert!(!text.contains(&*key), "a key reached the logs:\n{text}");
    }
    assert_eq!(
        logs.lines_with("ERROR", SECRET),
        2,
        "each refused version is reported once, not again after re-lists:\n{text}"
    );
}

#[tokio::test]
async fn the_watch_ignores_other_secrets_and_an_unchanged_key() {
    let (_server, client) = setup().await;
    let first: &[u8] = b"first key, thirty-two bytes long";
    create_secret(&client, &[("key", first)]).await;
    let store = key::from_secret(client.clone(), NS, SECRET).await.unwrap();
    let logs = Logs::default();
    let subscriber = {
        let logs = logs.clone();
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || logs.clone())
            .finish()
    };
    let task = tokio::spawn(
        key::watch_secret(store.clone(), client.clone(), NS.into(), SECRET.into())
            .with_subscriber(subscriber),
    );
    // Another Secret with a `key` entry in the same namespace is not the key Secret.
    let other = secret("unrelated", &[("key", b"another secret's key, not ours!!")]);
    secrets(&client)
        .create(&PostParams::default(), &other)
        .await
        .unwrap();
    // A metadata-only write to the key Secret, then a real change as a marker that the watch
    // has handled everything before it.
    secrets(&client)
        .patch(
            SECRET,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
        )
        .await
        .unwrap();
    let second: &[u8] = b"second key, also long enough!!!";
    set_data(&client, &[("key", second)]).await;
    let id = id_of(second);
    wait::eventually("the second key", async || store.current().id() == id).await;
    task.abort();
    let _ = task.await;
    let text = logs.text();
    let changes = text.lines().filter(|l| l.contains("changed")).count();
    assert_eq!(changes, 1, "only the real change is logged:\n{text}");
    assert!(
        !text.contains(&id_of(b"another secret's key, not ours!!")),
        "{text}"
    );
}

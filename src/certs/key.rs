//! The installation's HMAC key (docs/recipe.md, "Digest, key id and stamp").
//!
//! The key comes either from a file (`--key-file`: its bytes exactly, no trimming, no decoding) or
//! from data key `key` of a Secret in the pod's namespace (`--key-secret`: the decoded bytes). When
//! that Secret does not exist, the first replica to start creates it with 32 random bytes; replicas
//! that lose the creation race read the winner's key. Every replica then watches the Secret and
//! swaps a changed key into its [`KeyStore`], so stamps follow the new key without a restart.
//!
//! The key itself is never logged: only its id (first 8 hex digits of its SHA-256).

use crate::core::names::{DESCRIPTION_ANNOTATION, FIELD_MANAGER, NAME_LABEL};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt, watcher};

use crate::cluster::watch::{Adapter, Watched, changes};
use crate::core::checksum::{self, KeyError, StampKey};
use crate::core::refs::References;

/// The Secret data key that holds the checksum key.
pub const SECRET_DATA_KEY: &str = "key";
/// Length of a key confighash generates.
pub const GENERATED_KEY_LEN: usize = 32;
const DESCRIPTION: &str = "HMAC key of confighash checksum stamps (confighash.dev/checksum), \
     created by confighash. Replacing data key `key` makes every replica reload it; workloads get \
     stamps with the new key id at the next change of their config.";
/// Attempts at reading or creating the Secret before giving up on transient errors.
const MAX_ATTEMPTS: u32 = 5;
/// Backoff after the first transient failure; doubled after each further one.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);

pub use confighash_core::checksum::KeyStore;

/// Why the key could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum KeyLoadError {
    #[error("cannot read the checksum key file {}: {source}", path.display())]
    ReadFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the checksum key file {} is refused: {source}", path.display())]
    FileKey {
        path: PathBuf,
        #[source]
        source: KeyError,
    },
    #[error(
        "Secret {namespace}/{name} has no data key `{SECRET_DATA_KEY}`; put the checksum key \
         (at least {min} bytes) there, or delete the Secret so that confighash creates a new one when it starts",
        min = checksum::MIN_KEY_LEN
    )]
    MissingKey { namespace: String, name: String },
    #[error(
        "the checksum key in Secret {namespace}/{name} (data key `{SECRET_DATA_KEY}`) is refused: {source}"
    )]
    SecretKey {
        namespace: String,
        name: String,
        #[source]
        source: KeyError,
    },
    #[error(
        "cannot {action} the checksum key Secret {namespace}/{name} (after {attempts} attempt(s)): {}",
        crate::cluster::redact::kube_error(source)
    )]
    Api {
        action: &'static str,
        namespace: String,
        name: String,
        attempts: u32,
        #[source]
        source: Box<kube::Error>,
    },
}

/// Loads the key from a file: its bytes exactly as they are.
pub fn from_file(path: &Path) -> Result<Arc<KeyStore>, KeyLoadError> {
    let bytes = std::fs::read(path).map_err(|source| KeyLoadError::ReadFile {
        path: path.to_owned(),
        source,
    })?;
    let key = StampKey::new(bytes).map_err(|source| KeyLoadError::FileKey {
        path: path.to_owned(),
        source,
    })?;
    tracing::info!(key_id = key.id(), path = %path.display(), "loaded the checksum key file");
    Ok(Arc::new(KeyStore::new(key)))
}

/// Loads the key from data key `key` of Secret `namespace/name`, creating the Secret with 32
/// random bytes when it does not exist. Safe when several replicas start at once: all of them end
/// with the key of the one whose create succeeded. Transient errors (5xx, 429, connection) are
/// retried a few times with a short backoff.
pub async fn from_secret(
    client: kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Arc<KeyStore>, KeyLoadError> {
    let api: Api<Secret> = Api::namespaced(client, namespace);
    let mut backoff = FIRST_BACKOFF;
    let mut attempt = 1;
    loop {
        match load_or_create(&api, namespace, name).await {
            Ok((key, created)) => {
                if created {
                    tracing::info!(
                        key_id = key.id(),
                        namespace,
                        secret = name,
                        "created the checksum key Secret with a new random key"
                    );
                } else {
                    tracing::info!(
                        key_id = key.id(),
                        namespace,
                        secret = name,
                        "loaded the checksum key from its Secret"
                    );
                }
                return Ok(Arc::new(KeyStore::new(key)));
            }
            Err(Failure::Invalid(e)) => return Err(e),
            Err(Failure::Api {
                action,
                source,
                retry,
            }) => {
                if attempt >= MAX_ATTEMPTS || !retry {
                    return Err(KeyLoadError::Api {
                        action,
                        namespace: namespace.to_owned(),
                        name: name.to_owned(),
                        attempts: attempt,
                        source: Box::new(source),
                    });
                }
                tracing::warn!(
                    namespace,
                    secret = name,
                    attempt,
                    error = %crate::cluster::redact::kube_error(&source),
                    "cannot {action} the checksum key Secret yet; retrying"
                );
                tokio::time::sleep(backoff).await;
                backoff *= 2;
                attempt += 1;
            }
        }
    }
}

/// One attempt's failure: the Secret's content is refused (final) or the API failed.
enum Failure {
    Invalid(KeyLoadError),
    Api {
        action: &'static str,
        source: kube::Error,
        /// Whether another attempt may succeed.
        retry: bool,
    },
}

impl Failure {
    fn api(action: &'static str, source: kube::Error) -> Self {
        let retry = is_transient(&source);
        Failure::Api {
            action,
            source,
            retry,
        }
    }
}

/// Reads the Secret, or creates it when absent; on losing a creation race reads the winner's.
/// Returns the key and whether this call created the Secret.
async fn load_or_create(
    api: &Api<Secret>,
    namespace: &str,
    name: &str,
) -> Result<(StampKey, bool), Failure> {
    let api_err = |action| move |source| Failure::api(action, source);
    if let Some(secret) = api.get_opt(name).await.map_err(api_err("read"))? {
        return key_from_secret(&secret, namespace, name)
            .map(|k| (k, false))
            .map_err(Failure::Invalid);
    }
    let bytes: [u8; GENERATED_KEY_LEN] = rand::random();
    let key = StampKey::new(bytes.to_vec()).expect("a generated key is long enough");
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    match api.create(&params, &new_secret(name, &bytes)).await {
        Ok(_) => Ok((key, true)),
        Err(kube::Error::Api(status)) if status.code == 409 => {
            // Another replica created it first: use its key, so every replica agrees.
            match api.get_opt(name).await.map_err(api_err("read"))? {
                Some(secret) => key_from_secret(&secret, namespace, name)
                    .map(|k| (k, false))
                    .map_err(Failure::Invalid),
                // Created and deleted again in between: try the whole thing once more.
                None => Err(Failure::Api {
                    action: "create",
                    source: kube::Error::Api(status),
                    retry: true,
                }),
            }
        }
        Err(source) => Err(Failure::api("create", source)),
    }
}

fn new_secret(name: &str, bytes: &[u8]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([(
                NAME_LABEL.0.to_owned(),
                NAME_LABEL.1.to_owned(),
            )])),
            annotations: Some(BTreeMap::from([(
                DESCRIPTION_ANNOTATION.to_owned(),
                DESCRIPTION.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(
            SECRET_DATA_KEY.to_owned(),
            ByteString(bytes.to_vec()),
        )])),
        ..Secret::default()
    }
}

/// The key in data key `key` of `secret` (decoded bytes).
pub fn key_from_secret(
    secret: &Secret,
    namespace: &str,
    name: &str,
) -> Result<StampKey, KeyLoadError> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(SECRET_DATA_KEY))
        .ok_or_else(|| KeyLoadError::MissingKey {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })?;
    StampKey::new(bytes.0.clone()).map_err(|source| KeyLoadError::SecretKey {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        source,
    })
}

/// Errors worth another try: server errors, throttling, and failures to reach the server.
fn is_transient(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(status) => status.code >= 500 || status.code == 429,
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => true,
        _ => false,
    }
}

/// Whether two keys are the same bytes. `StampKey` does not expose its bytes, so this compares
/// the ids and then the HMAC of one fixed message (the stamp of no references in namespace "")
/// under each key.
fn same_key(a: &StampKey, b: &StampKey) -> bool {
    let probe = |k: &StampKey| {
        checksum::compute_stamp(Some(k), "", &References::default(), |_| {
            unreachable!("no references, nothing to look up")
        })
    };
    a.id() == b.id() && probe(a) == probe(b)
}

/// Watches Secret `namespace/name` and swaps a changed key into `store`. Runs until cancelled
/// (dropped or aborted); dropped watches and expired resourceVersions (410) are survived by
/// re-listing with backoff.
///
/// A replacement without data key `key`, or with a key that is too short, is refused: the current
/// key stays in use and an error is logged. A deleted Secret also leaves the current key in use
/// (with a warning); a Secret created again later is read as usual.
pub async fn watch_secret(
    store: Arc<KeyStore>,
    client: kube::Client,
    namespace: String,
    name: String,
) {
    let api: Api<Secret> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut watch = KeyWatch {
        store,
        namespace: namespace.clone(),
        name: name.clone(),
        last_rv: None,
    };
    loop {
        let adapter = Adapter::new(
            |secret: &Secret| secret.metadata.name.clone(),
            |_: &String, secret: Secret| secret,
        );
        let events = watcher(api.clone(), config.clone()).default_backoff();
        let mut changes = std::pin::pin!(changes(events, adapter, |e| {
            tracing::warn!(
                namespace = %namespace,
                secret = %name,
                error = %crate::cluster::redact::watcher_error(e),
                "watch of the checksum key Secret failed; retrying"
            )
        }));
        while let Some(change) = changes.next().await {
            watch.handle(change);
        }
        // The watcher stream does not end by itself; start over should it ever do so.
    }
}

/// State of [`watch_secret`] between events.
struct KeyWatch {
    store: Arc<KeyStore>,
    namespace: String,
    name: String,
    /// resourceVersion of the last version of the Secret handled, so a re-list after a dropped
    /// watch does not handle (and log) the same version again.
    last_rv: Option<String>,
}

impl KeyWatch {
    fn handle(&mut self, change: Watched<String, Secret>) {
        match change {
            Watched::Applied(_, secret) => self.apply(&secret),
            Watched::Deleted(_) => self.deleted(),
            Watched::Relisted(listed) => {
                if !listed.contains(&self.name) && self.last_rv.is_some() {
                    // Deleted while the watch was down.
                    self.deleted();
                }
            }
        }
    }

    fn apply(&mut self, secret: &Secret) {
        let rv = secret.metadata.resource_version.clone();
        if rv.is_some() && rv == self.last_rv {
            return;
        }
        self.last_rv = rv;
        let current = self.store.current();
        match key_from_secret(secret, &self.namespace, &self.name) {
            Ok(key) if same_key(&key, &current) => {}
            Ok(key) => {
                tracing::info!(
                    namespace = %self.namespace,
                    secret = %self.name,
                    key_id = key.id(),
                    previous_key_id = current.id(),
                    "the checksum key changed; stamping with the new key"
                );
                self.store.set(key);
            }
            Err(e) => tracing::error!(
                namespace = %self.namespace,
                secret = %self.name,
                key_id = current.id(),
                error = %e,
                "refused the new content of the checksum key Secret; keeping the current key"
            ),
        }
    }

    fn deleted(&mut self) {
        self.last_rv = None;
        tracing::warn!(
            namespace = %self.namespace,
            secret = %self.name,
            key_id = self.store.current().id(),
            "the checksum key Secret was deleted; keeping the current key"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn file_bytes_are_taken_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = b"0123456789abcdef0123456789abcdef\n";
        let store = from_file(&write(&dir, "key", bytes)).unwrap();
        let exact = StampKey::new(bytes.to_vec()).unwrap();
        let trimmed = StampKey::new(bytes[..32].to_vec()).unwrap();
        assert_eq!(store.current().id(), exact.id());
        assert_ne!(
            store.current().id(),
            trimmed.id(),
            "the trailing newline is part of the key"
        );
        assert!(same_key(&store.current(), &exact));
        assert!(!same_key(&store.current(), &trimmed));
    }

    #[test]
    fn file_with_binary_bytes_is_not_decoded() {
        let dir = tempfile::tempdir().unwrap();
        let bytes: Vec<u8> = (0u8..=255).collect();
        let store = from_file(&write(&dir, "key", &bytes)).unwrap();
        assert_eq!(store.current().id(), StampKey::new(bytes).unwrap().id());
    }

    #[test]
    fn short_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        // 15 bytes of content plus a newline is 16: accepted, because the newline counts.
        assert!(from_file(&write(&dir, "sixteen", b"0123456789abcde\n")).is_ok());
        let path = write(&dir, "short", b"0123456789abcde");
        let err = from_file(&path).unwrap_err();
        assert!(
            matches!(
                &err,
                KeyLoadError::FileKey {
                    source: KeyError::TooShort { len: 15 },
                    ..
                }
            ),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(msg.contains("15 bytes"), "{msg}");
        assert!(msg.contains("at least 16"), "{msg}");
        assert!(from_file(&write(&dir, "empty", b"")).is_err());
    }

    #[test]
    fn missing_file_error_names_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("no-such-key");
        let err = from_file(&path).unwrap_err();
        assert!(matches!(&err, KeyLoadError::ReadFile { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains(&path.display().to_string()), "{msg}");
    }

    #[test]
    fn store_swaps_keys() {
        let a = StampKey::new(*b"aaaaaaaaaaaaaaaa").unwrap();
        let b = StampKey::new(*b"bbbbbbbbbbbbbbbb").unwrap();
        let store = KeyStore::new(a.clone());
        let before = store.current();
        store.set(b.clone());
        assert_eq!(before.id(), a.id(), "a loaded key stays valid after a swap");
        assert_eq!(store.current().id(), b.id());
        assert!(format!("{store:?}").contains(b.id()));
    }

    #[test]
    fn secret_keys_are_read_and_checked() {
        let mut secret = new_secret("k", b"0123456789abcdef");
        let key = key_from_secret(&secret, "ns", "k").unwrap();
        assert_eq!(key.id(), StampKey::new(*b"0123456789abcdef").unwrap().id());
        secret
            .data
            .as_mut()
            .unwrap()
            .insert(SECRET_DATA_KEY.into(), ByteString(b"short".to_vec()));
        let err = key_from_secret(&secret, "ns", "k").unwrap_err();
        assert!(err.to_string().contains("ns/k"), "{err}");
        secret.data = None;
        let err = key_from_secret(&secret, "ns", "k").unwrap_err();
        assert!(matches!(err, KeyLoadError::MissingKey { .. }), "{err:?}");
    }

    #[test]
    fn transient_errors() {
        let status = |code| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                ..kube::core::Status::failure("x", "y")
            }))
        };
        assert!(is_transient(&status(500)));
        assert!(is_transient(&status(503)));
        assert!(is_transient(&status(429)));
        assert!(!is_transient(&status(403)));
        assert!(!is_transient(&status(404)));
        assert!(!is_transient(&status(409)));
    }
}

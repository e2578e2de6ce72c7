//! Serving certificates for the webhook, re-read from disk without dropping connections.
//!
//! [`CertStore`] holds the pair in service in an [`ArcSwap`]; the rustls [`ServerConfig`] from
//! [`CertStore::server_config`] asks it for the pair on every handshake, so a swap takes effect
//! on the next connection and connections already open keep the pair they started with.
//!
//! [`CertStore::poll`] re-reads the two paths on an interval. Reading the paths (rather than
//! watching them) follows kubelet's Secret volume updates, which write a new dated directory and
//! rename a `..data` symlink over the old one: `tls.crt -> ..data/tls.crt` then resolves to the new
//! files. A new pair replaces the old one only when both files parse and the key matches the
//! certificate; otherwise the old pair stays in service and the error is reported.
//!
//! [`ClientCaStore`] does the same for `--client-ca-file`: the CA whose certificates the webhook
//! requires of its clients, re-read on the same interval and used from the next handshake on.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{
    DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
};
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use sha2::{Digest, Sha256};

/// ALPN protocols the webhook offers, most preferred first.
pub const ALPN_PROTOCOLS: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Why a certificate and key pair could not be loaded. Every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} is not valid PEM: {reason}", path.display())]
    Pem { path: PathBuf, reason: String },
    #[error("no certificate (a PEM \"CERTIFICATE\" block) in {}", path.display())]
    NoCertificate { path: PathBuf },
    #[error(
        "no private key in {} (expected an unencrypted PEM \"PRIVATE KEY\", \"RSA PRIVATE KEY\" or \"EC PRIVATE KEY\" block)",
        path.display()
    )]
    NoPrivateKey { path: PathBuf },
    #[error("the private key in {} is encrypted; the webhook needs it unencrypted", path.display())]
    EncryptedKey { path: PathBuf },
    #[error(
        "unsupported private key in {} (supported: RSA, ECDSA P-256/P-384, Ed25519): {reason}",
        path.display()
    )]
    UnsupportedKey { path: PathBuf, reason: String },
    #[error(
        "the private key in {} does not match the certificate in {}",
        key_path.display(),
        cert_path.display()
    )]
    KeyMismatch {
        cert_path: PathBuf,
        key_path: PathBuf,
    },
    #[error("cannot parse the certificate in {}: {reason}", path.display())]
    BadCertificate { path: PathBuf, reason: String },
    #[error("the client CA in {} cannot be used: {reason}", path.display())]
    BadClientCa { path: PathBuf, reason: String },
}

/// A certificate chain and its key, checked to belong together.
#[derive(Clone)]
pub struct LoadedPair {
    /// The chain (leaf first) and the signing key, as rustls serves them.
    pub key: Arc<CertifiedKey>,
    /// The leaf certificate's notAfter, in seconds since the Unix epoch.
    pub not_after: i64,
    /// SHA-256 over both files' bytes; equal fingerprints mean unchanged files.
    pub fingerprint: [u8; 32],
}

impl fmt::Debug for LoadedPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadedPair")
            .field("chain_len", &self.key.cert.len())
            .field("not_after", &self.not_after)
            .field("fingerprint", &hex::encode(self.fingerprint))
            .finish()
    }
}

/// Read and check the pair at `cert_path` (PEM chain, leaf first) and `key_path` (PEM key).
pub fn load_pair(cert_path: &Path, key_path: &Path) -> Result<LoadedPair, TlsError> {
    let (cert_pem, key_pem) = read_consistent(cert_path, key_path)?;
    parse_pair(cert_path, &cert_pem, key_path, &key_pem)
}

/// Read both files. kubelet may swap `..data` between the two reads, so the certificate is read
/// again after the key: if it is unchanged, the key belongs with it (a generation with the same
/// certificate has the same key, or is no pair at all). A few attempts, then the last read is
/// returned as it is and the key check decides.
fn read_consistent(cert_path: &Path, key_path: &Path) -> Result<(Vec<u8>, Vec<u8>), TlsError> {
    const ATTEMPTS: usize = 3;
    let mut cert_pem = read(cert_path)?;
    let mut attempt = 1;
    loop {
        let key_pem = read(key_path)?;
        let cert_again = read(cert_path)?;
        if cert_again == cert_pem || attempt == ATTEMPTS {
            return Ok((cert_again, key_pem));
        }
        cert_pem = cert_again;
        attempt += 1;
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

fn fingerprint(cert_pem: &[u8], key_pem: &[u8]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    // Length-prefixed, so moving bytes from one file to the other changes the fingerprint.
    hasher.update((cert_pem.len() as u64).to_be_bytes());
    hasher.update(cert_pem);
    hasher.update((key_pem.len() as u64).to_be_bytes());
    hasher.update(key_pem);
    hasher.finalize().into()
}

/// The file is a private key or comes from a Secret: the reason names what is wrong, never a
/// line or marker of the file.
fn pem_error(path: &Path, error: pem::Error) -> TlsError {
    let reason = match error {
        pem::Error::MissingSectionEnd { .. } => "a section has no END line".to_owned(),
        pem::Error::IllegalSectionStart { .. } => "a malformed BEGIN line".to_owned(),
        pem::Error::Base64Decode(_) => "a section is not valid base64".to_owned(),
        pem::Error::SectionTooLarge => "a section is too large".to_owned(),
        pem::Error::Io(e) => format!("reading failed: {}", e.kind()),
        _ => "the PEM does not parse".to_owned(),
    };
    TlsError::Pem {
        path: path.to_owned(),
        reason,
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn parse_pair(
    cert_path: &Path,
    cert_pem: &[u8],
    key_path: &Path,
    key_pem: &[u8],
) -> Result<LoadedPair, TlsError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(cert_path, e))?;
    let Some(leaf) = chain.first() else {
        return Err(TlsError::NoCertificate {
            path: cert_path.to_owned(),
        });
    };
    let not_after = match x509_parser::parse_x509_certificate(leaf) {
        Ok((_, cert)) => cert.validity().not_after.timestamp(),
        Err(e) => {
            return Err(TlsError::BadCertificate {
                path: cert_path.to_owned(),
                reason: e.to_string(),
            });
        }
    };

    let key_der = match PrivateKeyDer::from_pem_slice(key_pem) {
        Ok(key) => key,
        Err(pem::Error::NoItemsFound) => {
            let encrypted = key_pem
                .windows(b"ENCRYPTED PRIVATE KEY".len())
                .any(|w| w == b"ENCRYPTED PRIVATE KEY")
                || key_pem
                    .windows(b"Proc-Type: 4,ENCRYPTED".len())
                    .any(|w| w == b"Proc-Type: 4,ENCRYPTED");
            let path = key_path.to_owned();
            return Err(if encrypted {
                TlsError::EncryptedKey { path }
            } else {
                TlsError::NoPrivateKey { path }
            });
        }
        Err(e) => return Err(pem_error(key_path, e)),
    };
    let signing_key = provider()
        .key_provider
        .load_private_key(key_der)
        .map_err(|e| TlsError::UnsupportedKey {
            path: key_path.to_owned(),
            reason: e.to_string(),
        })?;

    let certified = CertifiedKey::new(chain, signing_key);
    match certified.keys_match() {
        Ok(()) => {}
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            return Err(TlsError::KeyMismatch {
                cert_path: cert_path.to_owned(),
                key_path: key_path.to_owned(),
            });
        }
        // The ring signers all expose their public key, so this is not expected; without it
        // there is nothing to compare here, and clients would refuse a wrong key's signature.
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(e) => {
            return Err(TlsError::BadCertificate {
                path: cert_path.to_owned(),
                reason: e.to_string(),
            });
        }
    }

    Ok(LoadedPair {
        key: Arc::new(certified),
        not_after,
        fingerprint: fingerprint(cert_pem, key_pem),
    })
}

/// The serving pair in use, re-read from its two paths on demand ([`CertStore::reload`]) or on an
/// interval ([`CertStore::poll`]).
pub struct CertStore {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: ArcSwap<CertifiedKey>,
    not_after: AtomicI64,
    /// What the files held at the last reload; the lock also serialises reloads.
    seen: Mutex<Seen>,
}

struct Seen {
    /// Fingerprint of the files behind `current`.
    loaded: [u8; 32],
    /// Fingerprint of the last files that did not make a good pair, until a good pair replaces it.
    refused: Option<[u8; 32]>,
}

impl fmt::Debug for CertStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertStore")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .field("not_after", &self.not_after())
            .finish_non_exhaustive()
    }
}

impl CertStore {
    /// Load the first pair; the webhook cannot serve without it, so this must succeed.
    pub fn load(
        cert_path: impl Into<PathBuf>,
        key_path: impl Into<PathBuf>,
    ) -> Result<Arc<Self>, TlsError> {
        let cert_path = cert_path.into();
        let key_path = key_path.into();
        let pair = load_pair(&cert_path, &key_path)?;
        Ok(Arc::new(CertStore {
            cert_path,
            key_path,
            current: ArcSwap::new(pair.key),
            not_after: AtomicI64::new(pair.not_after),
            seen: Mutex::new(Seen {
                loaded: pair.fingerprint,
                refused: None,
            }),
        }))
    }

    pub fn cert_path(&self) -> &Path {
        &self.cert_path
    }

    pub fn key_path(&self) -> &Path {
        &self.key_path
    }

    /// The leaf's notAfter of the pair in service, in seconds since the Unix epoch.
    pub fn not_after(&self) -> i64 {
        self.not_after.load(Ordering::Acquire)
    }

    /// The pair in service.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.load_full()
    }

    /// Whether the files now hold a pair that was refused, so the pair in service is older than
    /// what is on disk. Cleared when the files change back or a good pair loads.
    pub fn refused(&self) -> bool {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .refused
            .is_some()
    }

    /// Re-read both files.
    ///
    /// - `Ok(true)`: a new good pair is now in service.
    /// - `Ok(false)`: nothing new: the files hold the pair in service, or the same bytes that
    ///   were already refused (each bad pair is reported once, not on every poll; see
    ///   [`CertStore::refused`]).
    /// - `Err`: a file cannot be read (reported every time), or new bytes do not make a good
    ///   pair. Either way the old pair stays in service; half a pair is never swapped in.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let (cert_pem, key_pem) = read_consistent(&self.cert_path, &self.key_path)?;
        let found = fingerprint(&cert_pem, &key_pem);
        if found == seen.loaded {
            seen.refused = None;
            return Ok(false);
        }
        if seen.refused == Some(found) {
            return Ok(false);
        }
        let pair = match parse_pair(&self.cert_path, &cert_pem, &self.key_path, &key_pem) {
            Ok(pair) => pair,
            Err(e) => {
                seen.refused = Some(found);
                return Err(e);
            }
        };
        self.current.store(pair.key);
        self.not_after.store(pair.not_after, Ordering::Release);
        seen.loaded = pair.fingerprint;
        seen.refused = None;
        Ok(true)
    }

    /// The rustls configuration for the webhook port: TLS 1.2 and 1.3 with the ring provider,
    /// ALPN `h2` and `http/1.1`, no client certificates, and the certificate taken from this
    /// store on every handshake.
    ///
    /// Session resumption is off: a resumed session skips the certificate, so a client could
    /// keep using a session authenticated by a pair already replaced (after a key compromise,
    /// say). A full handshake costs little next to an admission call, and the API server keeps
    /// its connections open anyway.
    pub fn server_config(self: &Arc<Self>) -> ServerConfig {
        self.server_config_with(None)
    }

    /// [`CertStore::server_config`], and with `client_ca` a client certificate is required of
    /// every client: one that chains to the CA [`ClientCaStore`] has in service at the time of
    /// the handshake, valid now, for client authentication (or any use, without an extended key
    /// usage). Without one the handshake fails.
    pub fn server_config_with(
        self: &Arc<Self>,
        client_ca: Option<&Arc<ClientCaStore>>,
    ) -> ServerConfig {
        let builder = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            // The ring provider has cipher suites for both versions, so this cannot fail.
            .expect("the ring provider supports TLS 1.2 and 1.3");
        let builder = match client_ca {
            Some(ca) => builder.with_client_cert_verifier(Arc::new(CaVerifier(Arc::clone(ca)))),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(Arc::new(StoreResolver(Arc::clone(self))));
        config.alpn_protocols = ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect();
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        config.send_tls13_tickets = 0;
        config
    }

    /// Reload every `interval` (the first after one interval, since [`CertStore::load`] has just
    /// read the files) and hand each result to `on_result`, which counts and logs. Runs until
    /// the task is dropped or the runtime shuts down. An interval under a millisecond is taken
    /// as one millisecond.
    pub async fn poll(
        self: Arc<Self>,
        interval: Duration,
        on_result: impl Fn(&Result<bool, TlsError>) + Send + 'static,
    ) {
        poll(self, Self::reload, interval, on_result).await;
    }
}

/// Calls `reload` on `store` every `interval` (the first after one interval), off the async
/// threads since it reads files, and hands each result to `on_result`.
async fn poll<S: Send + Sync + 'static>(
    store: Arc<S>,
    reload: fn(&S) -> Result<bool, TlsError>,
    interval: Duration,
    on_result: impl Fn(&Result<bool, TlsError>) + Send + 'static,
) {
    let interval = interval.max(Duration::from_millis(1));
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let store = Arc::clone(&store);
        match tokio::task::spawn_blocking(move || reload(&store)).await {
            Ok(result) => on_result(&result),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Cancelled: the runtime is shutting down.
            Err(_) => return,
        }
    }
}

/// Hands rustls the pair in service at the time of each handshake.
#[derive(Debug)]
struct StoreResolver(Arc<CertStore>);

impl ResolvesServerCert for StoreResolver {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current())
    }
}

/// The CA that signs the certificates the webhook requires of its clients (`--client-ca-file`),
/// re-read from its path on demand ([`ClientCaStore::reload`]) or on an interval
/// ([`ClientCaStore::poll`]), as [`CertStore`] re-reads the serving pair: a new CA is checked
/// whole before it replaces the old one, and is used from the next handshake on; connections
/// already open are not checked again.
///
/// The file may hold several certificates (PEM), each trusted as a root: during a CA rotation,
/// the old CA and the new one.
pub struct ClientCaStore {
    path: PathBuf,
    current: ArcSwap<TrustedCa>,
    seen: Mutex<Seen>,
}

/// A client CA in service.
struct TrustedCa {
    verifier: Arc<dyn ClientCertVerifier>,
    /// How many CA certificates the file held.
    certificates: usize,
}

impl fmt::Debug for ClientCaStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientCaStore")
            .field("path", &self.path)
            .field("certificates", &self.certificates())
            .finish_non_exhaustive()
    }
}

impl ClientCaStore {
    /// Load the CA; the webhook does not start without it.
    pub fn load(path: impl Into<PathBuf>) -> Result<Arc<Self>, TlsError> {
        let path = path.into();
        let pem = read(&path)?;
        let ca = parse_client_ca(&path, &pem)?;
        Ok(Arc::new(ClientCaStore {
            path,
            current: ArcSwap::from_pointee(ca),
            seen: Mutex::new(Seen {
                loaded: fingerprint(&pem, b""),
                refused: None,
            }),
        }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many CA certificates are trusted now.
    pub fn certificates(&self) -> usize {
        self.current.load().certificates
    }

    /// Whether the file now holds a CA that was refused. Cleared when the file changes back or a
    /// good CA loads.
    pub fn refused(&self) -> bool {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .refused
            .is_some()
    }

    /// Re-read the file: as [`CertStore::reload`], `Ok(true)` when a new CA is in service,
    /// `Ok(false)` when nothing is new, `Err` when the file cannot be read or its new content is
    /// not a usable CA (the old CA stays in service).
    pub fn reload(&self) -> Result<bool, TlsError> {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let pem = read(&self.path)?;
        let found = fingerprint(&pem, b"");
        if found == seen.loaded {
            seen.refused = None;
            return Ok(false);
        }
        if seen.refused == Some(found) {
            return Ok(false);
        }
        match parse_client_ca(&self.path, &pem) {
            Ok(ca) => {
                self.current.store(Arc::new(ca));
                seen.loaded = found;
                seen.refused = None;
                Ok(true)
            }
            Err(e) => {
                seen.refused = Some(found);
                Err(e)
            }
        }
    }

    /// Reload every `interval`, as [`CertStore::poll`].
    pub async fn poll(
        self: Arc<Self>,
        interval: Duration,
        on_result: impl Fn(&Result<bool, TlsError>) + Send + 'static,
    ) {
        poll(self, Self::reload, interval, on_result).await;
    }
}

fn parse_client_ca(path: &Path, pem: &[u8]) -> Result<TrustedCa, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(path, e))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    let mut roots = RootCertStore::empty();
    for cert in &certs {
        roots
            .add(cert.clone())
            .map_err(|e| TlsError::BadCertificate {
                path: path.to_owned(),
                reason: e.to_string(),
            })?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|e| TlsError::BadClientCa {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    Ok(TrustedCa {
        verifier,
        certificates: certs.len(),
    })
}

/// Checks client certificates against the CA [`ClientCaStore`] has in service at the time of
/// each handshake.
///
/// It names no acceptable CA in its certificate request: the names would have to follow the
/// reloaded CA, and clients need none. A Go client (kube-apiserver) with one certificate sends it
/// when the list is empty, and with a list, only if its chain names one of them as an issuer:
/// a client certificate issued by an intermediate whose root is the CA here would then not be
/// sent at all.
#[derive(Debug)]
struct CaVerifier(Arc<ClientCaStore>);

impl CaVerifier {
    fn current(&self) -> Arc<dyn ClientCertVerifier> {
        Arc::clone(&self.0.current.load().verifier)
    }
}

impl ClientCertVerifier for CaVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.current()
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.current().supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("a key");
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .expect("params")
            .self_signed(&key)
            .expect("a certificate");
        (cert.pem(), key.serialize_pem())
    }

    fn write_pair(dir: &Path, cert: &str, key: &str) -> (PathBuf, PathBuf) {
        let (c, k) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&c, cert).expect("write cert");
        std::fs::write(&k, key).expect("write key");
        (c, k)
    }

    #[test]
    fn loads_a_good_pair_and_reports_unchanged_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, key) = pair();
        let (c, k) = write_pair(dir.path(), &cert, &key);
        let store = CertStore::load(&c, &k).expect("load");
        assert!(store.not_after() > 0);
        assert!(!store.reload().expect("reload"));
    }

    #[test]
    fn a_bad_pair_is_reported_once_and_a_good_one_replaces_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, key) = pair();
        let (c, k) = write_pair(dir.path(), &cert, &key);
        let store = CertStore::load(&c, &k).expect("load");

        let (other_cert, other_key) = pair();
        std::fs::write(&c, &other_cert).expect("write");
        assert!(matches!(store.reload(), Err(TlsError::KeyMismatch { .. })));
        assert!(store.refused());
        assert!(!store.reload().expect("the same bad pair again"));
        assert!(store.refused());

        // Back to the pair in service: nothing refused any more.
        std::fs::write(&c, &cert).expect("write");
        assert!(!store.reload().expect("unchanged"));
        assert!(!store.refused());

        // The same bad pair again is reported again, since it is news again.
        std::fs::write(&c, &other_cert).expect("write");
        assert!(store.reload().is_err());

        // A missing file is reported on every call.
        std::fs::remove_file(&k).expect("remove");
        assert!(matches!(store.reload(), Err(TlsError::Read { .. })));
        assert!(matches!(store.reload(), Err(TlsError::Read { .. })));

        std::fs::write(&k, &other_key).expect("write");
        assert!(store.reload().expect("a good pair"));
        assert!(!store.refused());
        assert_eq!(store.current().cert[0].as_ref(), {
            let der = CertificateDer::from_pem_slice(other_cert.as_bytes()).expect("der");
            der.as_ref().to_vec()
        });
    }

    #[test]
    fn errors_name_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, key) = pair();
        let (other_cert, _) = pair();

        let (c, k) = write_pair(dir.path(), "not pem at all\n", &key);
        let err = load_pair(&c, &k).unwrap_err();
        assert!(matches!(err, TlsError::NoCertificate { .. }), "{err}");
        assert!(err.to_string().contains("tls.crt"), "{err}");

        let (c, k) = write_pair(dir.path(), &cert, "nothing here\n");
        let err = load_pair(&c, &k).unwrap_err();
        assert!(matches!(err, TlsError::NoPrivateKey { .. }), "{err}");
        assert!(err.to_string().contains("tls.key"), "{err}");

        let (c, k) = write_pair(
            dir.path(),
            &cert,
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n",
        );
        let err = load_pair(&c, &k).unwrap_err();
        assert!(matches!(err, TlsError::EncryptedKey { .. }), "{err}");

        let (c, k) = write_pair(dir.path(), &other_cert, &key);
        let err = load_pair(&c, &k).unwrap_err();
        assert!(matches!(err, TlsError::KeyMismatch { .. }), "{err}");
        assert!(err.to_string().contains("does not match"), "{err}");

        let truncated = &cert[..cert.len() - 30];
        let (c, k) = write_pair(dir.path(), truncated, &key);
        let err = load_pair(&c, &k).unwrap_err();
        assert!(matches!(err, TlsError::Pem { .. }), "{err}");
        assert!(err.to_string().contains("tls.crt"), "{err}");

        let err = load_pair(&dir.path().join("missing.crt"), &k).unwrap_err();
        assert!(matches!(err, TlsError::Read { .. }), "{err}");
        assert!(err.to_string().contains("missing.crt"), "{err}");
    }

    #[test]
    fn a_certificate_that_is_not_x509_is_reported() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, key) = pair();
        let junk = "-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n";
        let (c, k) = write_pair(dir.path(), junk, &key);
        let err = load_pair(&c, &k).unwrap_err();
        assert!(matches!(err, TlsError::BadCertificate { .. }), "{err}");
    }

    #[test]
    fn an_unsupported_key_is_reported() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, _) = pair();
        let junk_key = "-----BEGIN PRIVATE KEY-----\naGVsbG8gd29ybGQ=\n-----END PRIVATE KEY-----\n";
        let (c, k) = write_pair(dir.path(), &cert, junk_key);
        let err = load_pair(&c, &k).unwrap_err();
        assert!(matches!(err, TlsError::UnsupportedKey { .. }), "{err}");
    }

    #[test]
    fn fingerprint_separates_the_files() {
        assert_ne!(fingerprint(b"ab", b"c"), fingerprint(b"a", b"bc"));
    }
}

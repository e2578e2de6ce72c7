//! `--self-signed-certs`: the webhook's own CA and serving certificate, with no extra software.
//!
//! All replicas share one Secret holding the CA, the serving pair and the CA bundle the
//! MutatingWebhookConfiguration must carry. Every step is a conditional write, so replicas that
//! start together end with one CA. Each replica keeps the caBundle patched, writes the serving
//! pair to the files its certificate store polls, renews the serving certificate before it
//! expires, and rotates the CA through a two-CA bundle:
//!
//! 1. a new CA signs nothing yet; the bundle carries the new and the old CA;
//! 2. once the caBundle carries both, the serving certificate is re-issued by the new CA;
//! 3. once every replica has had time to load it, the old CA leaves the bundle.
//!
//! No request fails during the overlap, because the bundle always trusts the CA of whatever
//! certificate any replica serves.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use base64::Engine;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use sha2::{Digest, Sha256};

const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const BUNDLE: &str = "ca-bundle.crt";
const TLS_CERT: &str = "tls.crt";
const TLS_KEY: &str = "tls.key";
/// SHA-256 (hex) of the CA certificate that signed `tls.crt`.
const TLS_ISSUER: &str = "tls-issuer";

/// The Secret the CA and serving pair are kept in, unless `--certs-secret` names another.
pub const DEFAULT_SECRET_NAME: &str = "confighash-certs";
/// The webhook's Service, unless `--service` names another.
pub const DEFAULT_SERVICE: &str = "confighash";
/// The MutatingWebhookConfiguration whose caBundle is kept, unless `--webhook-configuration`
/// names another.
pub const DEFAULT_WEBHOOK_CONFIGURATION: &str = "confighash";

/// Where and how long.
#[derive(Debug, Clone)]
pub struct SelfSignedConfig {
    /// The pod's namespace: the Secret and the Service live there.
    pub namespace: String,
    pub secret_name: String,
    /// The webhook's Service, whose DNS names the serving certificate carries.
    pub service: String,
    /// The MutatingWebhookConfiguration whose caBundle is kept current.
    pub webhook_configuration: String,
    /// More names the serving certificate carries besides the Service's (`--self-signed-name`;
    /// IP addresses become IP SANs).
    pub extra_names: Vec<String>,
    /// Where the serving pair is written for the certificate store to load.
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
    pub ca_validity: Duration,
    pub cert_validity: Duration,
    /// Re-issue the serving certificate when less than this is left (less than `cert_validity`).
    pub renew_before: Duration,
    /// Start a CA rotation when less than this is left of the CA.
    pub rotate_ca_before: Duration,
    /// How often every replica checks; the old CA leaves the bundle two checks after the new
    /// serving certificate was issued.
    pub check_interval: Duration,
}

const DAY: u64 = 24 * 60 * 60;
/// How far certificates' notBefore is set in the past, for clocks that lag.
const BACKDATE: Duration = Duration::from_secs(300);

impl SelfSignedConfig {
    /// The defaults: Secret `confighash-certs`, Service and webhook configuration `confighash`,
    /// a 10-year CA rotated a year before it expires, a 90-day certificate renewed 30 days before.
    /// `serve` replaces the three names with those of `--certs-secret`, `--service` and
    /// `--webhook-configuration`.
    pub fn new(namespace: &str, cert_path: PathBuf, key_path: PathBuf) -> Self {
        SelfSignedConfig {
            namespace: namespace.to_owned(),
            secret_name: DEFAULT_SECRET_NAME.to_owned(),
            service: DEFAULT_SERVICE.to_owned(),
            webhook_configuration: DEFAULT_WEBHOOK_CONFIGURATION.to_owned(),
            extra_names: Vec::new(),
            cert_path,
            key_path,
            ca_validity: Duration::from_secs(3650 * DAY),
            cert_validity: Duration::from_secs(90 * DAY),
            renew_before: Duration::from_secs(30 * DAY),
            rotate_ca_before: Duration::from_secs(365 * DAY),
            check_interval: Duration::from_secs(5 * 60),
        }
    }
}

/// Why the certificates could not be made current.
#[derive(Debug, thiserror::Error)]
pub enum SelfSignedError {
    #[error(
        "the certificate Secret {namespace}/{name}: {}",
        crate::cluster::redact::kube_error(source)
    )]
    Secret {
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error(
        "the MutatingWebhookConfiguration {name}: {}",
        crate::cluster::redact::kube_error(source)
    )]
    WebhookConfiguration {
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("the certificate Secret {0} holds unusable data: {1}")]
    Corrupt(String, String),
    #[error("cannot make a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// Not the parser's message: it can quote a line of the stored CA key.
    #[error("the certificate Secret {0} holds a CA certificate or key that does not parse")]
    UnusableCa(String),
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the certificate Secret kept changing under us; trying again later")]
    Contended,
}

/// The Secret's contents, as text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct State {
    ca_cert: String,
    ca_key: String,
    bundle: String,
    tls_cert: String,
    tls_key: String,
    tls_issuer: String,
}

impl State {
    fn from_secret(secret: &Secret, name: &str) -> Result<State, SelfSignedError> {
        let data = secret.data.clone().unwrap_or_default();
        let get = |k: &str| -> Result<String, SelfSignedError> {
            let v = data
                .get(k)
                .ok_or_else(|| SelfSignedError::Corrupt(name.to_owned(), format!("no {k}")))?;
            String::from_utf8(v.0.clone())
                .map_err(|_| SelfSignedError::Corrupt(name.to_owned(), format!("{k} is not text")))
        };
        Ok(State {
            ca_cert: get(CA_CERT)?,
            ca_key: get(CA_KEY)?,
            bundle: get(BUNDLE)?,
            tls_cert: get(TLS_CERT)?,
            tls_key: get(TLS_KEY)?,
            tls_issuer: get(TLS_ISSUER)?,
        })
    }

    fn data(&self) -> BTreeMap<String, ByteString> {
        [
            (CA_CERT, &self.ca_cert),
            (CA_KEY, &self.ca_key),
            (BUNDLE, &self.bundle),
            (TLS_CERT, &self.tls_cert),
            (TLS_KEY, &self.tls_key),
            (TLS_ISSUER, &self.tls_issuer),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), ByteString(v.as_bytes().to_vec())))
        .collect()
    }
}

fn fingerprint(pem: &str) -> String {
    hex::encode(Sha256::digest(pem.trim().as_bytes()))
}

fn new_ca(validity: Duration) -> Result<(String, String), SelfSignedError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(
        DnType::CommonName,
        format!("confighash CA {:08x}", rand::random::<u32>()),
    );
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let now = SystemTime::now();
    params.not_before = (now - BACKDATE).into();
    params.not_after = (now + validity).into();
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A serving pair from the CA of Secret `secret`.
fn issue(
    secret: &str,
    ca_cert: &str,
    ca_key: &str,
    names: &[String],
    validity: Duration,
) -> Result<(String, String), SelfSignedError> {
    // The parsers' messages can quote a line of the key: not passed on.
    let unusable = |_| SelfSignedError::UnusableCa(secret.to_owned());
    let signer = KeyPair::from_pem(ca_key).map_err(unusable)?;
    let issuer = Issuer::from_ca_cert_pem(ca_cert, signer).map_err(unusable)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(names.to_vec())?;
    params
        .distinguished_name
        .push(DnType::CommonName, names[0].clone());
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let now = SystemTime::now();
    params.not_before = (now - BACKDATE).into();
    params.not_after = (now + validity).into();
    let cert = params.signed_by(&key, &issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// notBefore and notAfter of a PEM certificate.
fn validity(pem: &str, secret: &str) -> Result<(SystemTime, SystemTime), SelfSignedError> {
    let corrupt = |what: &str| SelfSignedError::Corrupt(secret.to_owned(), what.to_owned());
    let (_, der) = x509_parser::pem::parse_x509_pem(pem.as_bytes())
        .map_err(|_| corrupt("a certificate is not PEM"))?;
    let cert = der
        .parse_x509()
        .map_err(|_| corrupt("a certificate does not parse"))?;
    let at = |t: x509_parser::time::ASN1Time| {
        SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(t.timestamp()).unwrap_or(0))
    };
    Ok((
        at(cert.validity().not_before),
        at(cert.validity().not_after),
    ))
}

/// The names the serving certificate must carry: the Service's, then `extra_names`.
fn names(config: &SelfSignedConfig) -> Vec<String> {
    let mut names = crate::certs::certificates::service_names(&config.service, &config.namespace);
    for name in &config.extra_names {
        if !names.contains(name) {
            names.push(name.clone());
        }
    }
    names
}

/// Whether the certificate `pem` carries every one of `names` as a subject alternative name
/// (IP addresses as IP SANs). One that does not parse carries none.
fn carries(pem: &str, names: &[String]) -> bool {
    use x509_parser::extensions::GeneralName;
    let Ok((_, der)) = x509_parser::pem::parse_x509_pem(pem.as_bytes()) else {
        return false;
    };
    let Ok(cert) = der.parse_x509() else {
        return false;
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return false;
    };
    let general = &san.value.general_names;
    names
        .iter()
        .all(|name| match name.parse::<std::net::IpAddr>() {
            Ok(ip) => {
                let octets = match ip {
                    std::net::IpAddr::V4(v4) => v4.octets().to_vec(),
                    std::net::IpAddr::V6(v6) => v6.octets().to_vec(),
                };
                general
                    .iter()
                    .any(|g| matches!(g, GeneralName::IPAddress(b) if *b == octets.as_slice()))
            }
            Err(_) => general
                .iter()
                .any(|g| matches!(g, GeneralName::DNSName(d) if d.eq_ignore_ascii_case(name))),
        })
}

fn fresh(config: &SelfSignedConfig) -> Result<State, SelfSignedError> {
    let (ca_cert, ca_key) = new_ca(config.ca_validity)?;
    let (tls_cert, tls_key) = issue(
        &config.secret_name,
        &ca_cert,
        &ca_key,
        &names(config),
        config.cert_validity,
    )?;
    Ok(State {
        tls_issuer: fingerprint(&ca_cert),
        bundle: ca_cert.clone(),
        ca_cert,
        ca_key,
        tls_cert,
        tls_key,
    })
}

/// The next state of the Secret, given what the webhook configuration currently trusts, or
/// `None` when nothing is due.
fn next(
    config: &SelfSignedConfig,
    state: &State,
    trusted: &str,
    now: SystemTime,
) -> Result<Option<State>, SelfSignedError> {
    let name = &config.secret_name;
    let (_, ca_expires) = validity(&state.ca_cert, name)?;
    let (not_before, tls_expires) = validity(&state.tls_cert, name)?;
    // Certificates are back-dated by BACKDATE against clock skew.
    let issued = not_before + BACKDATE;
    let ca_fp = fingerprint(&state.ca_cert);
    let rotating = state.bundle.trim() != state.ca_cert.trim();

    // 1. The CA nears its end: a new one joins the bundle; it signs nothing yet.
    if !rotating && ca_expires < now + config.rotate_ca_before {
        let (ca_cert, ca_key) = new_ca(config.ca_validity)?;
        let bundle = format!("{}\n{}\n", ca_cert.trim(), state.ca_cert.trim());
        return Ok(Some(State {
            ca_cert,
            ca_key,
            bundle,
            ..state.clone()
        }));
    }
    // 2. The serving certificate comes from an older CA, nears its end, or lacks a name it must
    //    carry (a name added with --self-signed-name): re-issue it from the current CA, but only
    //    once the webhook configuration trusts that CA.
    let from_old_ca = state.tls_issuer != ca_fp;
    let lacks_a_name = !carries(&state.tls_cert, &names(config));
    if (from_old_ca || lacks_a_name || tls_expires < now + config.renew_before)
        && trusted.contains(state.ca_cert.trim())
    {
        let (tls_cert, tls_key) = issue(
            name,
            &state.ca_cert,
            &state.ca_key,
            &names(config),
            config.cert_validity,
        )?;
        return Ok(Some(State {
            tls_cert,
            tls_key,
            tls_issuer: ca_fp,
            ..state.clone()
        }));
    }
    // 3. Every replica has had two checks to load the new CA's certificate: the old CA goes.
    if rotating && !from_old_ca && issued + config.check_interval * 2 < now {
        return Ok(Some(State {
            bundle: state.ca_cert.clone(),
            ..state.clone()
        }));
    }
    Ok(None)
}

/// Makes the Secret, the caBundle and the local files current, once. Safe to run on every
/// replica at the same time.
pub async fn ensure(
    client: &kube::Client,
    config: &SelfSignedConfig,
) -> Result<(), SelfSignedError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &config.namespace);
    let secret_err = |e: kube::Error| SelfSignedError::Secret {
        namespace: config.namespace.clone(),
        name: config.secret_name.clone(),
        source: Box::new(e),
    };
    let post = PostParams {
        field_manager: Some(crate::core::names::FIELD_MANAGER.to_owned()),
        ..Default::default()
    };
    for _ in 0..10 {
        let Some(secret) = secrets
            .get_opt(&config.secret_name)
            .await
            .map_err(secret_err)?
        else {
            let state = fresh(config)?;
            let secret = Secret {
                metadata: kube::api::ObjectMeta {
                    name: Some(config.secret_name.clone()),
                    labels: Some(BTreeMap::from([(
                        "app.kubernetes.io/name".to_owned(),
                        "confighash".to_owned(),
                    )])),
                    ..Default::default()
                },
                data: Some(state.data()),
                ..Default::default()
            };
            match secrets.create(&post, &secret).await {
                Ok(_) => tracing::info!(
                    secret = config.secret_name,
                    "created the webhook CA and serving certificate"
                ),
                // Another replica won: use its CA.
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(secret_err(e)),
            }
            continue;
        };
        let state = State::from_secret(&secret, &config.secret_name)?;
        let trusted = publish_bundle(client, config, &state.bundle).await?;
        match next(config, &state, &trusted, SystemTime::now())? {
            Some(new_state) => {
                let mut updated = secret.clone();
                updated.data = Some(new_state.data());
                match secrets.replace(&config.secret_name, &post, &updated).await {
                    Ok(_) => tracing::info!(
                        secret = config.secret_name,
                        "advanced the webhook certificates"
                    ),
                    Err(kube::Error::Api(s)) if s.code == 409 => {}
                    Err(e) => return Err(secret_err(e)),
                }
            }
            None => {
                write_pair(config, &state).await?;
                return Ok(());
            }
        }
    }
    Err(SelfSignedError::Contended)
}

/// Puts `bundle` in every webhook's caBundle; returns what the configuration trusts now.
async fn publish_bundle(
    client: &kube::Client,
    config: &SelfSignedConfig,
    bundle: &str,
) -> Result<String, SelfSignedError> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let err = |e: kube::Error| SelfSignedError::WebhookConfiguration {
        name: config.webhook_configuration.clone(),
        source: Box::new(e),
    };
    let Some(current) = api
        .get_opt(&config.webhook_configuration)
        .await
        .map_err(err)?
    else {
        tracing::warn!(
            name = config.webhook_configuration,
            "the MutatingWebhookConfiguration does not exist yet"
        );
        return Ok(String::new());
    };
    let encoded = base64::engine::general_purpose::STANDARD.encode(bundle.as_bytes());
    let webhooks = current.webhooks.unwrap_or_default();
    let mut ops = Vec::new();
    for (i, w) in webhooks.iter().enumerate() {
        if w.client_config.ca_bundle.as_ref().map(|b| b.0.as_slice()) != Some(bundle.as_bytes()) {
            // The test op makes the patch fail rather than touch a webhook that moved.
            ops.push(serde_json::json!({"op": "test", "path": format!("/webhooks/{i}/name"), "value": w.name}));
            ops.push(serde_json::json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": encoded}));
        }
    }
    if ops.is_empty() {
        return Ok(bundle.to_owned());
    }
    let patch: json_patch::Patch =
        serde_json::from_value(serde_json::Value::Array(ops)).map_err(|e| {
            SelfSignedError::Corrupt(config.webhook_configuration.clone(), e.to_string())
        })?;
    let params = PatchParams {
        field_manager: Some(crate::core::names::FIELD_MANAGER.to_owned()),
        ..Default::default()
    };
    api.patch(
        &config.webhook_configuration,
        &params,
        &Patch::<()>::Json(patch),
    )
    .await
    .map_err(err)?;
    tracing::info!(
        name = config.webhook_configuration,
        "published the CA bundle"
    );
    Ok(bundle.to_owned())
}

/// Writes the serving pair where the certificate store polls it, if it differs.
async fn write_pair(config: &SelfSignedConfig, state: &State) -> Result<(), SelfSignedError> {
    // The key is readable by its owner only (0600); the certificate by anyone (0644).
    for (path, content, mode) in [
        (&config.key_path, &state.tls_key, 0o600),
        (&config.cert_path, &state.tls_cert, 0o644),
    ] {
        if tokio::fs::read_to_string(path).await.ok().as_deref() == Some(content.as_str()) {
            continue;
        }
        let write_err = |source| SelfSignedError::Write {
            path: path.clone(),
            source,
        };
        if let Some(dir) = path.parent() {
            tokio::fs::create_dir_all(dir).await.map_err(write_err)?;
        }
        // Write and rename, so the store never reads half a file.
        let tmp = path.with_extension("tmp");
        let _ = tokio::fs::remove_file(&tmp).await;
        let mut options = tokio::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        options.mode(mode);
        #[cfg(not(unix))]
        let _ = mode;
        let mut file = options.open(&tmp).await.map_err(write_err)?;
        tokio::io::AsyncWriteExt::write_all(&mut file, content.as_bytes())
            .await
            .map_err(write_err)?;
        file.sync_all().await.map_err(write_err)?;
        drop(file);
        tokio::fs::rename(&tmp, path).await.map_err(write_err)?;
    }
    Ok(())
}

/// Keeps the certificates current every `check_interval` until the task is dropped.
pub async fn run(client: kube::Client, config: SelfSignedConfig) {
    loop {
        tokio::time::sleep(config.check_interval).await;
        if let Err(e) = ensure(&client, &config).await {
            tracing::error!(error = %e, "cannot keep the webhook certificates current");
        }
    }
}

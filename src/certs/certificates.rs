//! A local CA and a serving certificate signed by it, for `confighash certs`: enough to run the
//! webhook outside a cluster's certificate machinery (kind, a laptop, CI). Keys are ECDSA P-256.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SerialNumber,
};

/// File names written by [`write`], in the order written.
pub const CA_CERT_FILE: &str = "ca.crt";
pub const CA_KEY_FILE: &str = "ca.key";
pub const CERT_FILE: &str = "tls.crt";
pub const KEY_FILE: &str = "tls.key";

/// Clock skew allowance: certificates are valid from this long before now.
const BACKDATE: Duration = Duration::from_secs(5 * 60);
const DAY: u64 = 24 * 60 * 60;

#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error("no names given for the serving certificate")]
    NoNames,
    #[error("empty name given for the serving certificate")]
    EmptyName,
    #[error("validity must be at least one day (CA {ca_days} days, certificate {cert_days} days)")]
    ZeroDays { ca_days: u32, cert_days: u32 },
    #[error("the serving certificate ({cert_days} days) must not outlive its CA ({ca_days} days)")]
    OutlivesCa { ca_days: u32, cert_days: u32 },
    #[error("cannot generate the certificates: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{} already exists; remove it or choose another directory", path.display())]
    Exists { path: PathBuf },
    #[error("cannot create directory {}: {source}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// A CA and a serving pair it signed, all PEM.
#[derive(Clone)]
pub struct Generated {
    pub ca_cert_pem: String,
    pub ca_key_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for Generated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generated")
            .field("ca_cert_pem", &self.ca_cert_pem)
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

/// The names a client may use for the Service `service` in `namespace`; the API server calls
/// the webhook as `service.namespace.svc`.
pub fn service_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        service.to_owned(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ]
}

/// Make a CA valid for `ca_days` and a serving certificate valid for `cert_days` for
/// `dns_names` (names that parse as IP addresses become IP SANs; duplicates are dropped).
pub fn generate(
    dns_names: &[String],
    ca_days: u32,
    cert_days: u32,
) -> Result<Generated, CertsError> {
    if ca_days == 0 || cert_days == 0 {
        return Err(CertsError::ZeroDays { ca_days, cert_days });
    }
    if cert_days > ca_days {
        return Err(CertsError::OutlivesCa { ca_days, cert_days });
    }
    let mut names: Vec<String> = Vec::with_capacity(dns_names.len());
    for name in dns_names {
        let name = name.trim();
        if name.is_empty() {
            return Err(CertsError::EmptyName);
        }
        if !names.iter().any(|n| n == name) {
            names.push(name.to_owned());
        }
    }
    let Some(first) = names.first().cloned() else {
        return Err(CertsError::NoNames);
    };

    let now = SystemTime::now();
    let not_before = now - BACKDATE;

    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, "confighash local CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.not_before = not_before.into();
    ca.not_after = (now + days(ca_days)).into();
    ca.serial_number = Some(random_serial());
    let ca_cert = ca.self_signed(&ca_key)?;
    let ca_cert_pem = ca_cert.pem();
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(names)?;
    leaf.distinguished_name.push(DnType::CommonName, first);
    leaf.is_ca = IsCa::ExplicitNoCa;
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.use_authority_key_identifier_extension = true;
    leaf.not_before = not_before.into();
    leaf.not_after = (now + days(cert_days)).into();
    leaf.serial_number = Some(random_serial());
    let cert = leaf.signed_by(&key, &issuer)?;

    Ok(Generated {
        ca_cert_pem,
        ca_key_pem,
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

fn days(n: u32) -> Duration {
    Duration::from_secs(u64::from(n) * DAY)
}

/// 16 random bytes, top bit clear so the DER integer stays positive and within 20 octets.
fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01; // no leading zero octet to strip
    SerialNumber::from_slice(&bytes)
}

/// Write `ca.crt`, `ca.key`, `tls.crt` and `tls.key` into `dir` (created if missing), keys
/// readable by the owner only. Nothing is overwritten: if any of the four exists, nothing is
/// written. Returns the paths written.
pub fn write(dir: &Path, g: &Generated) -> Result<Vec<PathBuf>, CertsError> {
    let files: [(&str, &str, bool); 4] = [
        (CA_CERT_FILE, &g.ca_cert_pem, false),
        (CA_KEY_FILE, &g.ca_key_pem, true),
        (CERT_FILE, &g.cert_pem, false),
        (KEY_FILE, &g.key_pem, true),
    ];
    for (name, _, _) in &files {
        let path = dir.join(name);
        // symlink_metadata: a dangling symlink counts as existing too.
        if path.symlink_metadata().is_ok() {
            return Err(CertsError::Exists { path });
        }
    }
    fs::create_dir_all(dir).map_err(|source| CertsError::CreateDir {
        path: dir.to_owned(),
        source,
    })?;

    let mut written = Vec::with_capacity(files.len());
    for (name, contents, secret) in files {
        let path = dir.join(name);
        if let Err(e) = write_new(&path, contents, secret) {
            // Leave no half-written set behind; files that existed before were never touched.
            for done in &written {
                let _ = fs::remove_file(done);
            }
            return Err(e);
        }
        written.push(path);
    }
    Ok(written)
}

fn write_new(path: &Path, contents: &str, secret: bool) -> Result<(), CertsError> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(if secret { 0o600 } else { 0o644 });
    }
    #[cfg(not(unix))]
    let _ = secret;
    let mut file = options.open(path).map_err(|source| {
        if source.kind() == io::ErrorKind::AlreadyExists {
            CertsError::Exists {
                path: path.to_owned(),
            }
        } else {
            CertsError::Write {
                path: path.to_owned(),
                source,
            }
        }
    })?;
    let result = file
        .write_all(contents.as_bytes())
        .and_then(|()| file.sync_all());
    result.map_err(|source| {
        let _ = fs::remove_file(path);
        CertsError::Write {
            path: path.to_owned(),
            source,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::prelude::*;

    fn parse(pem: &str) -> Vec<u8> {
        let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).expect("PEM");
        p.contents
    }

    #[test]
    fn service_names_cover_the_service_dns_forms() {
        assert_eq!(
            service_names("confighash", "tools"),
            [
                "confighash",
                "confighash.tools",
                "confighash.tools.svc",
                "confighash.tools.svc.cluster.local"
            ]
        );
    }

    #[test]
    fn ca_and_serving_certificate_have_the_right_extensions() {
        let names = vec![
            "hook.ns.svc".to_owned(),
            "127.0.0.1".to_owned(),
            "hook.ns.svc".to_owned(),
        ];
        let g = generate(&names, 30, 10).expect("generate");

        let ca_der = parse(&g.ca_cert_pem);
        let (_, ca) = X509Certificate::from_der(&ca_der).expect("CA");
        assert!(ca.is_ca());
        let ku = ca.key_usage().expect("ku").expect("key usage present");
        assert!(ku.value.key_cert_sign());

        let der = parse(&g.cert_pem);
        let (_, cert) = X509Certificate::from_der(&der).expect("cert");
        assert!(!cert.is_ca());
        assert_eq!(cert.issuer(), ca.subject());
        let eku = cert
            .extended_key_usage()
            .expect("eku")
            .expect("eku present");
        assert!(eku.value.server_auth);
        let san = cert
            .subject_alternative_name()
            .expect("san")
            .expect("san present");
        let got: Vec<String> = san
            .value
            .general_names
            .iter()
            .map(|n| match n {
                GeneralName::DNSName(d) => format!("dns:{d}"),
                GeneralName::IPAddress(ip) => format!("ip:{ip:?}"),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(got, ["dns:hook.ns.svc", "ip:[127, 0, 0, 1]"]);
        let lifetime =
            cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp();
        assert_eq!(lifetime, 10 * DAY as i64 + BACKDATE.as_secs() as i64);
        assert!(cert.validity().not_after <= ca.validity().not_after);
    }

    #[test]
    fn bad_arguments_are_refused() {
        let names = vec!["a".to_owned()];
        assert!(matches!(generate(&[], 2, 1), Err(CertsError::NoNames)));
        assert!(matches!(
            generate(&[" ".to_owned()], 2, 1),
            Err(CertsError::EmptyName)
        ));
        assert!(matches!(
            generate(&names, 0, 0),
            Err(CertsError::ZeroDays { .. })
        ));
        assert!(matches!(
            generate(&names, 1, 2),
            Err(CertsError::OutlivesCa { .. })
        ));
    }

    #[cfg(unix)]
    #[test]
    fn keys_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let g = generate(&["a".to_owned()], 2, 1).expect("generate");
        let out = dir.path().join("new/sub");
        let written = write(&out, &g).expect("write");
        assert_eq!(written.len(), 4);
        for (name, mode) in [
            (CA_KEY_FILE, 0o600),
            (KEY_FILE, 0o600),
            (CA_CERT_FILE, 0o644),
            (CERT_FILE, 0o644),
        ] {
            let meta = fs::metadata(out.join(name)).expect("metadata");
            let got = meta.permissions().mode() & 0o777;
            if mode == 0o600 {
                assert_eq!(got, 0o600, "{name}");
            } else {
                // The umask may take more away from certificates, never add.
                assert_eq!(got & !0o644, 0, "{name}");
            }
        }
    }
}

//! Certificate generation with rcgen: a self-signed certificate for `--dev`, and a CA plus a
//! serving certificate for installs (`gpu-share certs`) and tests.

use std::path::{Path, PathBuf};

pub mod keeper;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

/// PEM-encoded certificate (chain) and private key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PemPair {
    pub cert_pem: String,
    pub key_pem: String,
}

/// A CA and a serving certificate it signed.
#[derive(Debug, Clone)]
pub struct Bundle {
    pub ca: PemPair,
    pub serving: PemPair,
}

/// Why certificates could not be made or written, in words.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("--days must be from 1 to {MAX_DAYS} (the certificate's validity in days), got {0}")]
    Days(i64),
    #[error("--out {}: {source}", .dir.display())]
    OutDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: cannot make it private: {source}", .path.display())]
    Private {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A self-signed serving certificate for these SANs (DNS names or IP addresses).
pub fn self_signed(sans: &[&str]) -> Result<PemPair, CertError> {
    let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
    let ck = rcgen::generate_simple_self_signed(sans)?;
    Ok(PemPair {
        cert_pem: ck.cert.pem(),
        key_pem: ck.signing_key.serialize_pem(),
    })
}

/// Longest validity `gpu-share certs` issues, in days (ten years).
pub const MAX_DAYS: i64 = 3650;

/// A new CA named `ca_name` and a serving certificate for `sans`, both valid for `days` days
/// (1 to [`MAX_DAYS`]).
///
/// The CA's key is returned here but `gpu-share certs` does not keep it, so the CA is no more
/// than the issuer of this one certificate: it expires with it, and a renewal makes a new CA.
pub fn ca_and_serving(ca_name: &str, sans: &[String], days: i64) -> Result<Bundle, CertError> {
    if !(1..=MAX_DAYS).contains(&days) {
        return Err(CertError::Days(days));
    }
    let now = time::OffsetDateTime::now_utc();
    let not_after = now + time::Duration::days(days);
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, ca_name);
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca_params.not_before = now;
    ca_params.not_after = not_after;
    let ca_key = KeyPair::generate()?;
    let ca_key_pem = ca_key.serialize_pem();
    let ca = CertifiedIssuer::self_signed(ca_params, ca_key)?;

    let mut params = CertificateParams::new(sans.to_vec())?;
    params.distinguished_name.push(
        DnType::CommonName,
        sans.first().map(String::as_str).unwrap_or("gpu-share"),
    );
    params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.not_before = now;
    params.not_after = not_after;
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &ca)?;
    Ok(Bundle {
        ca: PemPair {
            cert_pem: ca.pem(),
            key_pem: ca_key_pem,
        },
        serving: PemPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        },
    })
}

/// What `gpu-share certs` issues: the webhook Service's namespace and name, the serving
/// certificate's SANs, its validity, and the directory to write into.
#[derive(Debug, Clone)]
pub struct Install<'a> {
    pub namespace: &'a str,
    pub service: &'a str,
    pub sans: &'a [String],
    pub days: i64,
    pub out: &'a Path,
}

/// `gpu-share certs`: writes `ca.crt`, `tls.crt` and `tls.key` (mode 0600, also when it existed)
/// into `install.out` and returns what to do next, with the base64 caBundle. The CA's key is not
/// written: every run makes a new CA.
pub fn write_install_bundle(install: &Install<'_>) -> Result<String, CertError> {
    use base64::Engine;
    let Install {
        namespace,
        service,
        sans,
        days,
        out,
    } = *install;
    let bundle = ca_and_serving(&format!("gpu-share CA ({namespace}/{service})"), sans, days)?;
    std::fs::create_dir_all(out).map_err(|source| CertError::OutDir {
        dir: out.to_path_buf(),
        source,
    })?;
    write_pem(&out.join("ca.crt"), &bundle.ca.cert_pem, false)?;
    write_pem(&out.join("tls.crt"), &bundle.serving.cert_pem, false)?;
    write_pem(&out.join("tls.key"), &bundle.serving.key_pem, true)?;
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(bundle.ca.cert_pem.as_bytes());
    let d = out.display();
    Ok(format!(
        "wrote {d}/ca.crt, {d}/tls.crt, {d}/tls.key (SANs: {sans})\n\
         create the Secret:\n  kubectl -n {namespace} create secret generic gpu-share-tls --from-file={d}/tls.crt --from-file={d}/tls.key --from-file={d}/ca.crt\n\
         patch the caBundle of the four webhooks:\n  kubectl patch mutatingwebhookconfiguration gpu-share --type=json -p '[{{\"op\":\"add\",\"path\":\"/webhooks/0/clientConfig/caBundle\",\"value\":\"{ca_bundle}\"}},{{\"op\":\"add\",\"path\":\"/webhooks/1/clientConfig/caBundle\",\"value\":\"{ca_bundle}\"}},{{\"op\":\"add\",\"path\":\"/webhooks/2/clientConfig/caBundle\",\"value\":\"{ca_bundle}\"}}]'\n  kubectl patch validatingwebhookconfiguration gpu-share --type=json -p '[{{\"op\":\"add\",\"path\":\"/webhooks/0/clientConfig/caBundle\",\"value\":\"{ca_bundle}\"}}]'\n\
         caBundle:\n{ca_bundle}\n",
        sans = sans.join(", "),
    ))
}

/// Writes a PEM file; a `private` one is mode 0600, also when it was already there.
fn write_pem(path: &Path, text: &str, private: bool) -> Result<(), CertError> {
    let write = |source| CertError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = private;
    let mut f = opts.open(path).map_err(write)?;
    // `mode` applies only when the file is created: tighten one that was already there before
    // the key goes in.
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|source| CertError::Private {
                path: path.to_path_buf(),
                source,
            })?;
    }
    std::io::Write::write_all(&mut f, text.as_bytes()).map_err(write)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject;

    #[test]
    fn generates_parsable_pem() {
        let p = self_signed(&["localhost", "127.0.0.1"]).unwrap();
        assert!(p.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(p.key_pem.contains("PRIVATE KEY"));
        let b = ca_and_serving(
            "gpu-share-ca",
            &["gpu-share.gpu-share.svc".to_string()],
            365,
        )
        .unwrap();
        assert_ne!(b.ca.cert_pem, b.serving.cert_pem);
        let der: Vec<_> =
            rustls::pki_types::CertificateDer::pem_slice_iter(b.serving.cert_pem.as_bytes())
                .collect();
        assert_eq!(der.len(), 1);
        assert!(der[0].is_ok());
    }

    fn not_after(pem: &str) -> i64 {
        let der = rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        cert.validity().not_after.timestamp()
    }

    #[test]
    fn days_are_bounded_and_the_ca_expires_with_its_certificate() {
        let sans = ["localhost".to_string()];
        for days in [0, -1, MAX_DAYS + 1, i64::MAX, i64::MIN] {
            let e = ca_and_serving("ca", &sans, days).unwrap_err().to_string();
            assert!(e.contains("--days must be from 1 to 3650"), "{days}: {e}");
        }
        let b = ca_and_serving("ca", &sans, MAX_DAYS).unwrap();
        assert_eq!(not_after(&b.ca.cert_pem), not_after(&b.serving.cert_pem));
        let b = ca_and_serving("ca", &sans, 1).unwrap();
        let in_a_day = time::OffsetDateTime::now_utc().unix_timestamp() + 86_400;
        assert!((not_after(&b.ca.cert_pem) - in_a_day).abs() < 60);
    }

    #[cfg(unix)]
    #[test]
    fn an_existing_key_file_is_made_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("tls.key");
        std::fs::write(&key, "old").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let sans = ["gpu-share.gpu-share.svc".to_string()];
        let install = Install {
            namespace: "gpu-share",
            service: "gpu-share",
            sans: &sans,
            days: 30,
            out: dir.path(),
        };
        let text = write_install_bundle(&install).unwrap();
        assert!(text.contains("caBundle"), "{text}");
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{mode:o}");
        assert!(
            std::fs::read_to_string(&key)
                .unwrap()
                .contains("PRIVATE KEY")
        );
        assert!(
            !dir.path().join("ca.key").exists(),
            "the CA key is not kept"
        );
        let install = Install {
            days: 100_000_000_000_000,
            ..install
        };
        let e = write_install_bundle(&install).unwrap_err();
        assert!(matches!(e, CertError::Days(_)), "{e}");
        assert!(e.to_string().contains("--days"), "{e}");
    }
}

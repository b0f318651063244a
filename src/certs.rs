//! Certificate generation with rcgen: a self-signed certificate for `--dev`, and a CA plus a
//! serving certificate for installs (`gpu-share certs`) and tests.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

/// PEM-encoded certificate (chain) and private key.
#[derive(Debug, Clone)]
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

fn err(e: rcgen::Error) -> String {
    format!("certificate generation failed: {e}")
}

/// A self-signed serving certificate for these SANs (DNS names or IP addresses).
pub fn self_signed(sans: &[&str]) -> Result<PemPair, String> {
    let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
    let ck = rcgen::generate_simple_self_signed(sans).map_err(err)?;
    Ok(PemPair {
        cert_pem: ck.cert.pem(),
        key_pem: ck.signing_key.serialize_pem(),
    })
}

/// A new CA named `ca_name` and a serving certificate for `sans`, valid for `days` days.
pub fn ca_and_serving(ca_name: &str, sans: &[String], days: i64) -> Result<Bundle, String> {
    let now = time::OffsetDateTime::now_utc();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
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
    // The CA outlives its serving certificates, so a renewal can keep the same caBundle.
    ca_params.not_after = now + time::Duration::days(days.saturating_mul(10));
    let ca_key = KeyPair::generate().map_err(err)?;
    let ca_key_pem = ca_key.serialize_pem();
    let ca = CertifiedIssuer::self_signed(ca_params, ca_key).map_err(err)?;

    let mut params = CertificateParams::new(sans.to_vec()).map_err(err)?;
    params.distinguished_name.push(
        DnType::CommonName,
        sans.first().map(String::as_str).unwrap_or("gpu-share"),
    );
    params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.not_before = now;
    params.not_after = now + time::Duration::days(days);
    let key = KeyPair::generate().map_err(err)?;
    let cert = params.signed_by(&key, &ca).map_err(err)?;
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
}

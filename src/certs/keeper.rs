//! PURE: the keeper of the webhook's own certificates, as Kyverno's and Gatekeeper's
//! cert-controller keep theirs: a CA in Secret `gpu-share-ca`, the serving certificate and the
//! CAs to trust in Secret `gpu-share-tls`, and the webhook configurations' `caBundle`. Given what
//! is there now, [`next_step`] says the one write to make next; the shell
//! (`cluster::certs`) makes it and looks again.
//!
//! Rotation never leaves a client without trust in what a server serves:
//! - a serving certificate is renewed from the same CA once a third of its life is left, and the
//!   CA is in every bundle already;
//! - a CA is renewed once a third of its life is left: the new CA joins the bundle beside the
//!   old one first, and only once the bundle has been everywhere for `propagation` (the API
//!   server's webhook configuration, every webhook replica) is a serving certificate issued from
//!   it; the old CA leaves the bundle `propagation` after that, when no replica serves a
//!   certificate it signed any more.
//!
//! The Secret `gpu-share-tls` is the truth the caBundles follow: its annotations say since when
//! its bundle and its serving certificate are what they are.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    PublicKeyData,
};
use time::{Duration, OffsetDateTime};
use x509_parser::prelude::{FromDer, X509Certificate};

use super::{CertError, PemPair};

/// What the keeper issues, and how long it waits for a change to reach every client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The serving certificate's DNS names and addresses.
    pub sans: Vec<String>,
    pub serving_validity: Duration,
    pub ca_validity: Duration,
    /// How long a new bundle or serving certificate takes to reach every client and replica.
    pub propagation: Duration,
}

/// The Secret `gpu-share-tls` as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    pub serving: PemPair,
    /// `ca.crt`: the CAs clients are to trust, PEM.
    pub bundle: String,
    /// Since when the bundle is what it is (`None`: long enough).
    pub bundle_since: Option<OffsetDateTime>,
    /// Since when the serving certificate is what it is (`None`: long enough).
    pub serving_since: Option<OffsetDateTime>,
}

/// What the keeper finds.
#[derive(Debug, Clone)]
pub struct Observed {
    pub now: OffsetDateTime,
    /// Secret `gpu-share-ca`: the CA that signs (`tls.crt`, `tls.key`).
    pub ca: Option<PemPair>,
    pub served: Option<Served>,
    /// The `caBundle` of each webhook of gpu-share's webhook configurations, PEM (`None`: unset).
    pub ca_bundles: Vec<Option<String>>,
}

/// The one write to make next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Create or replace Secret `gpu-share-ca`.
    WriteCa { ca: PemPair, why: &'static str },
    /// Create or replace Secret `gpu-share-tls`.
    WriteServed { served: Served, why: &'static str },
    /// Set every webhook's `caBundle` to this bundle (the Secret's).
    WriteBundles { bundle: String },
    /// Nothing to do before `until`.
    Wait { until: OffsetDateTime },
}

/// A certificate read from PEM: its DER, validity and public key.
struct Cert {
    pem: String,
    der: Vec<u8>,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
}

impl Cert {
    fn parse(pem: &str) -> Vec<Cert> {
        pem_blocks(pem)
            .into_iter()
            .filter_map(|block| {
                let (_, pem) = x509_parser::pem::parse_x509_pem(block.as_bytes()).ok()?;
                let der = pem.contents;
                let (_, x) = X509Certificate::from_der(&der).ok()?;
                let not_before = x.validity().not_before.to_datetime();
                let not_after = x.validity().not_after.to_datetime();
                Some(Cert {
                    pem: block,
                    der: der.clone(),
                    not_before,
                    not_after,
                })
            })
            .collect()
    }

    fn x509(&self) -> Option<X509Certificate<'_>> {
        X509Certificate::from_der(&self.der).ok().map(|(_, x)| x)
    }

    /// Whether a third or less of its life is left at `now` (or it is not yet, or no longer,
    /// valid).
    fn due(&self, now: OffsetDateTime) -> bool {
        let life = self.not_after - self.not_before;
        now < self.not_before || self.not_after - now <= life / 3
    }

    fn expired(&self, now: OffsetDateTime) -> bool {
        now >= self.not_after
    }

    /// Whether `ca` signed this certificate.
    fn signed_by(&self, ca: &Cert) -> bool {
        match (self.x509(), ca.x509()) {
            (Some(me), Some(ca)) => me.verify_signature(Some(ca.public_key())).is_ok(),
            _ => false,
        }
    }

    /// Whether `key_pem` is this certificate's private key.
    fn key_matches(&self, key_pem: &str) -> bool {
        let Ok(key) = KeyPair::from_pem(key_pem) else {
            return false;
        };
        self.x509()
            .is_some_and(|x| x.public_key().raw == key.subject_public_key_info().as_slice())
    }

    fn is_ca(&self) -> bool {
        self.x509().is_some_and(|x| x.is_ca())
    }

    /// Whether it names every one of `sans` (DNS names or IP addresses).
    fn names(&self, sans: &[String]) -> bool {
        let Some(x) = self.x509() else {
            return false;
        };
        let Ok(Some(ext)) = x.subject_alternative_name() else {
            return false;
        };
        let named: Vec<String> = ext
            .value
            .general_names
            .iter()
            .filter_map(|n| match n {
                x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
                // The keeper names IPv4 loopback only.
                x509_parser::extensions::GeneralName::IPAddress(ip) if ip.len() == 4 => {
                    Some(format!("{}.{}.{}.{}", ip[0], ip[1], ip[2], ip[3]))
                }
                _ => None,
            })
            .collect();
        sans.iter().all(|s| named.contains(s))
    }
}

/// The PEM blocks of a text, each whole.
fn pem_blocks(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with("-----BEGIN ") {
            current.clear();
        }
        current.push_str(line);
        current.push('\n');
        if line.starts_with("-----END ") {
            out.push(std::mem::take(&mut current));
        }
    }
    out
}

/// The one step to take next (the module's rules).
pub fn next_step(o: &Observed, s: &Settings) -> Result<Step, CertError> {
    let now = o.now;
    // The CA: present, a CA, its key, and more than a third of its life left.
    let ca = o.ca.as_ref().and_then(|pair| {
        let cert = Cert::parse(&pair.cert_pem).into_iter().next()?;
        (cert.is_ca() && cert.key_matches(&pair.key_pem)).then_some((cert, pair))
    });
    let ca = match ca {
        None => {
            return Ok(Step::WriteCa {
                ca: new_ca(now, s.ca_validity)?,
                why: "no CA yet (or it is no CA, or not its key)",
            });
        }
        Some((cert, _)) if cert.due(now) => {
            return Ok(Step::WriteCa {
                ca: new_ca(now, s.ca_validity)?,
                why: "the CA has a third or less of its life left",
            });
        }
        Some(ca) => ca,
    };
    let (ca_cert, ca_pair) = ca;

    let Some(served) = o.served.as_ref() else {
        // Nothing is served yet: the first certificate, and the bundle, at once.
        return Ok(Step::WriteServed {
            served: Served {
                serving: issue(ca_pair, &s.sans, now, s.serving_validity)?,
                bundle: ca_cert.pem.clone(),
                bundle_since: Some(now),
                serving_since: Some(now),
            },
            why: "no serving certificate yet",
        });
    };
    let serving = Cert::parse(&served.serving.cert_pem).into_iter().next();
    let long_ago = |since: Option<OffsetDateTime>| since.is_none_or(|t| now >= t + s.propagation);

    // The bundle: the signing CA, and every unexpired CA of the bundle that signed the serving
    // certificate, or may still have signed what a replica serves.
    let mut bundle = vec![ca_cert.pem.clone()];
    for c in Cert::parse(&served.bundle) {
        if c.der == ca_cert.der || c.expired(now) || bundle.contains(&c.pem) {
            continue;
        }
        let signs_serving = serving.as_ref().is_some_and(|sv| sv.signed_by(&c));
        if signs_serving || !long_ago(served.serving_since) {
            bundle.push(c.pem);
        }
    }
    let bundle = bundle.concat();
    if bundle != served.bundle {
        return Ok(Step::WriteServed {
            served: Served {
                bundle,
                bundle_since: Some(now),
                ..served.clone()
            },
            why: "the CAs to trust changed",
        });
    }
    if o.ca_bundles
        .iter()
        .any(|b| b.as_deref() != Some(&served.bundle))
    {
        return Ok(Step::WriteBundles {
            bundle: served.bundle.clone(),
        });
    }

    // The serving certificate.
    let due = match &serving {
        None => Some("the serving certificate does not parse"),
        Some(c) if !c.key_matches(&served.serving.key_pem) => {
            Some("the serving key is not the certificate's")
        }
        Some(c) if !c.names(&s.sans) => Some("the serving certificate lacks a name"),
        Some(c) if c.due(now) => {
            Some("the serving certificate has a third or less of its life left")
        }
        Some(c) if !c.signed_by(&ca_cert) => Some("the serving certificate is not the CA's"),
        Some(_) => None,
    };
    if let Some(why) = due {
        let expired = serving.as_ref().is_none_or(|c| c.expired(now));
        if expired || long_ago(served.bundle_since) {
            return Ok(Step::WriteServed {
                served: Served {
                    serving: issue(ca_pair, &s.sans, now, s.serving_validity)?,
                    serving_since: Some(now),
                    ..served.clone()
                },
                why,
            });
        }
        return Ok(Step::Wait {
            until: served.bundle_since.unwrap_or(now) + s.propagation,
        });
    }

    // Nothing now: the next renewal, or the next bundle change.
    let serving = serving
        .as_ref()
        .map_or(now, |c| c.not_after - (c.not_after - c.not_before) / 3);
    let ca_due = ca_cert.not_after - (ca_cert.not_after - ca_cert.not_before) / 3;
    let mut until = serving.min(ca_due);
    for since in [served.serving_since, served.bundle_since]
        .into_iter()
        .flatten()
    {
        if now < since + s.propagation {
            until = until.min(since + s.propagation);
        }
    }
    Ok(Step::Wait { until })
}

/// How far before `now` a certificate's validity starts, for clocks a little behind: five
/// minutes, or a tenth of a short validity (a certificate must not be born a third from its end).
fn backdate(validity: Duration) -> Duration {
    let tenth: Duration = validity / 10;
    tenth.min(Duration::minutes(5))
}

/// A new CA, valid from `now` for `validity`, named with its start so that two CAs differ.
pub fn new_ca(now: OffsetDateTime, validity: Duration) -> Result<PemPair, CertError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(
        DnType::CommonName,
        format!("gpu-share webhook CA {}", now.unix_timestamp()),
    );
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = now - backdate(validity);
    params.not_after = now + validity;
    let key = KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    Ok(PemPair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// A serving certificate for `sans` signed by `ca`, valid from `now` for `validity`.
pub fn issue(
    ca: &PemPair,
    sans: &[String],
    now: OffsetDateTime,
    validity: Duration,
) -> Result<PemPair, CertError> {
    let ca_key = KeyPair::from_pem(&ca.key_pem)?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key)?;
    let mut params = CertificateParams::new(sans.to_vec())?;
    params.distinguished_name.push(
        DnType::CommonName,
        sans.first().map(String::as_str).unwrap_or("gpu-share"),
    );
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = now - backdate(validity);
    params.not_after = now + validity;
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(PemPair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

#[cfg(test)]
mod tests;

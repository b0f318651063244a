//! TLS for the HTTPS listener: rustls with the ring provider, TLS 1.2 and 1.3 only, optional
//! client-certificate verification, and certificate rotation without a restart.
//!
//! Kubernetes rotates Secret volumes by swapping a `..data` symlink, not by rewriting the files,
//! so a file-change watch can miss it. Instead, before accepting a connection the files are
//! re-read (at most once per `check_every`) and compared with what is loaded; a change builds a
//! new configuration, and a change that does not parse keeps the old one and is logged.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio_rustls::TlsAcceptor;

use crate::Error;

/// The PEM files behind the listener.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

#[derive(PartialEq, Eq)]
struct Contents {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

struct Loaded {
    contents: Contents,
    acceptor: TlsAcceptor,
    checked: Instant,
}

/// A TLS acceptor that follows its files.
pub struct ReloadingTls {
    files: TlsFiles,
    check_every: Duration,
    loaded: Mutex<Loaded>,
}

impl ReloadingTls {
    /// Loads the files now: a bad file stops the service with the flag name and the reason.
    pub fn load(files: TlsFiles, check_every: Duration) -> Result<Self, Error> {
        let contents = read_all(&files)?;
        let acceptor = build(&contents)?;
        Ok(ReloadingTls {
            files,
            check_every,
            loaded: Mutex::new(Loaded {
                contents,
                acceptor,
                checked: Instant::now(),
            }),
        })
    }

    /// The acceptor for the next connection, re-reading the files when they may have changed.
    pub async fn acceptor(&self) -> TlsAcceptor {
        let (stale, current) = {
            let l = crate::sync::lock(&self.loaded);
            (l.checked.elapsed() >= self.check_every, l.acceptor.clone())
        };
        if !stale {
            return current;
        }
        let files = self.files.clone();
        let read = tokio::task::spawn_blocking(move || read_all(&files)).await;
        let mut l = crate::sync::lock(&self.loaded);
        l.checked = Instant::now();
        match read {
            Ok(Ok(contents)) if contents != l.contents => match build(&contents) {
                Ok(acceptor) => {
                    tracing::info!(cert = %self.files.cert.display(), "TLS certificate changed on disk; loaded it");
                    l.contents = contents;
                    l.acceptor = acceptor;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "TLS files changed but do not load; keeping the previous certificate")
                }
            },
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot re-read TLS files; keeping the previous certificate")
            }
            Err(e) => tracing::warn!(error = %e, "TLS reload task failed"),
        }
        l.acceptor.clone()
    }
}

fn read(flag: &'static str, path: &PathBuf) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|source| Error::ReadFile {
        flag,
        path: path.display().to_string(),
        source,
    })
}

fn read_all(files: &TlsFiles) -> Result<Contents, Error> {
    Ok(Contents {
        cert: read("--tls-cert", &files.cert)?,
        key: read("--tls-key", &files.key)?,
        client_ca: files
            .client_ca
            .as_ref()
            .map(|p| read("--client-ca", p))
            .transpose()?,
    })
}

fn certs(flag: &'static str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::Tls {
            flag,
            reason: format!("not a PEM certificate file: {e}"),
        })?;
    if certs.is_empty() {
        return Err(Error::Tls {
            flag,
            reason: "no PEM certificate found in the file".into(),
        });
    }
    Ok(certs)
}

fn build(c: &Contents) -> Result<TlsAcceptor, Error> {
    let chain = certs("--tls-cert", &c.cert)?;
    let key = PrivateKeyDer::from_pem_slice(&c.key).map_err(|e| Error::Tls {
        flag: "--tls-key",
        reason: format!("no PEM private key found in the file: {e}"),
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| Error::Tls {
            flag: "--tls-cert",
            reason: e.to_string(),
        })?;
    let builder = match &c.client_ca {
        None => builder.with_no_client_auth(),
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certs("--client-ca", pem)? {
                roots.add(cert).map_err(|e| Error::Tls {
                    flag: "--client-ca",
                    reason: e.to_string(),
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| Error::Tls {
                    flag: "--client-ca",
                    reason: e.to_string(),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| Error::Tls {
            flag: "--tls-key",
            reason: format!("the key does not match the certificate or is unusable: {e}"),
        })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &std::path::Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn bad_files_name_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let good = crate::certs::self_signed(&["localhost"]).unwrap();
        let other = crate::certs::self_signed(&["localhost"]).unwrap();
        let cert = write(dir.path(), "c.pem", &good.cert_pem);
        let key = write(dir.path(), "k.pem", &good.key_pem);
        let junk = write(dir.path(), "junk.pem", "hello");
        let wrong_key = write(dir.path(), "wk.pem", &other.key_pem);
        let load = |cert: &PathBuf, key: &PathBuf, ca: Option<PathBuf>| {
            ReloadingTls::load(
                TlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                    client_ca: ca,
                },
                Duration::ZERO,
            )
            .err()
            .map(|e| e.to_string())
        };
        assert_eq!(load(&cert, &key, None), None);
        assert!(load(&junk, &key, None).unwrap().starts_with("--tls-cert"));
        assert!(load(&cert, &junk, None).unwrap().starts_with("--tls-key"));
        assert!(
            load(&cert, &wrong_key, None)
                .unwrap()
                .contains("does not match")
        );
        assert!(
            load(&cert, &key, Some(junk.clone()))
                .unwrap()
                .starts_with("--client-ca")
        );
        assert!(
            load(&dir.path().join("missing"), &key, None)
                .unwrap()
                .contains("--tls-cert: cannot read")
        );
        assert_eq!(load(&cert, &key, Some(cert.clone())), None);
    }
}

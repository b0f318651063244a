//! The shell of the certificate keeper ([`crate::certs::keeper`]): reads Secrets `gpu-share-ca`
//! and `gpu-share-tls` and the caBundles of gpu-share's webhook configurations, makes the one
//! write the keeper says, and writes the serving certificate where this process serves it from
//! (its `--tls-cert` and `--tls-key` files, which the server re-reads every second). Every
//! replica runs it: a write carries the resourceVersion it read (or is a create), so two replicas
//! never both win, and the loser reads the winner's on its next look.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio::sync::watch::Receiver;

use crate::certs::PemPair;
use crate::certs::keeper::{Observed, Served, Settings, Step, next_step};

/// When the Secret's bundle and serving certificate last changed.
const ANNOTATION_BUNDLE_SINCE: &str = "gpu-share.io/bundle-since";
const ANNOTATION_SERVING_SINCE: &str = "gpu-share.io/serving-since";

/// Longest time between two looks (changes made by others are seen within it).
const LOOK_EVERY: Duration = Duration::from_secs(30);

/// What the keeper keeps, and where.
#[derive(Debug, Clone)]
pub struct Keeper {
    pub namespace: String,
    pub ca_secret: String,
    pub tls_secret: String,
    /// The MutatingWebhookConfiguration and ValidatingWebhookConfiguration of this name.
    pub webhook_configuration: String,
    pub settings: Settings,
    /// Where this process serves from.
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// Why a look or a write failed (it is tried again on the next look).
#[derive(Debug, thiserror::Error)]
pub enum KeepError {
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Cert(#[from] crate::certs::CertError),
    #[error("the webhook's certificates were not in place after {0} s")]
    NotInPlace(u64),
    #[error("writing {path}: {source}")]
    File {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> KeepError {
    let what = what.into();
    move |source| KeepError::Api { what, source }
}

/// Looks and writes until the serving certificate is in place and its files written: what the
/// server needs before it starts. Gives up after `limit`.
pub async fn first(client: &Client, k: &Keeper, limit: Duration) -> Result<(), KeepError> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match look(client, k).await {
            Ok(Step::Wait { .. }) if write_files(client, k).await? => return Ok(()),
            Ok(_) => {}
            Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
            Err(e) => tracing::warn!(error = %e, "certificate keeper: trying again"),
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(KeepError::NotInPlace(limit.as_secs()));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Keeps the certificates from now on, in the background.
pub fn spawn(client: Client, k: Keeper, mut shutdown: Receiver<bool>) {
    tokio::spawn(async move {
        loop {
            let pause = match look(&client, &k).await {
                Ok(Step::Wait { until }) => {
                    let left = until - OffsetDateTime::now_utc();
                    Duration::try_from(left)
                        .unwrap_or(Duration::ZERO)
                        .clamp(Duration::from_secs(1), LOOK_EVERY)
                }
                Ok(_) => Duration::from_secs(1),
                Err(e) => {
                    tracing::warn!(error = %e, "certificate keeper: trying again");
                    Duration::from_secs(5)
                }
            };
            if let Err(e) = write_files(&client, &k).await {
                tracing::warn!(error = %e, "certificate keeper: cannot write the serving certificate");
            }
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = shutdown.changed() => return,
            }
        }
    });
}

/// Reads what is there, takes the keeper's one step, and returns it.
async fn look(client: &Client, k: &Keeper) -> Result<Step, KeepError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &k.namespace);
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let ca = secrets
        .get_opt(&k.ca_secret)
        .await
        .map_err(api(format!("reading Secret {}", k.ca_secret)))?;
    let tls = secrets
        .get_opt(&k.tls_secret)
        .await
        .map_err(api(format!("reading Secret {}", k.tls_secret)))?;
    let mwc = mutating
        .get_opt(&k.webhook_configuration)
        .await
        .map_err(api("reading the MutatingWebhookConfiguration"))?;
    let vwc = validating
        .get_opt(&k.webhook_configuration)
        .await
        .map_err(api("reading the ValidatingWebhookConfiguration"))?;
    let pem = |b: &Option<ByteString>| {
        b.as_ref()
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
    };
    let mut ca_bundles = Vec::new();
    for w in mwc.iter().flat_map(|c| c.webhooks.iter().flatten()) {
        ca_bundles.push(pem(&w.client_config.ca_bundle));
    }
    for w in vwc.iter().flat_map(|c| c.webhooks.iter().flatten()) {
        ca_bundles.push(pem(&w.client_config.ca_bundle));
    }
    let observed = Observed {
        now: OffsetDateTime::now_utc(),
        ca: ca.as_ref().and_then(pair),
        served: tls.as_ref().and_then(served),
        ca_bundles,
    };
    let step = next_step(&observed, &k.settings)?;
    match &step {
        Step::WriteCa { ca: pem, why } => {
            tracing::info!(secret = %k.ca_secret, why, "certificate keeper: a new CA");
            let data = BTreeMap::from([
                (
                    "tls.crt".to_string(),
                    ByteString(pem.cert_pem.clone().into_bytes()),
                ),
                (
                    "tls.key".to_string(),
                    ByteString(pem.key_pem.clone().into_bytes()),
                ),
            ]);
            write_secret(&secrets, &k.ca_secret, ca.as_ref(), data, BTreeMap::new()).await?;
        }
        Step::WriteServed { served: s, why } => {
            tracing::info!(secret = %k.tls_secret, why, "certificate keeper: writes the serving certificate or the CAs to trust");
            let data = BTreeMap::from([
                (
                    "tls.crt".to_string(),
                    ByteString(s.serving.cert_pem.clone().into_bytes()),
                ),
                (
                    "tls.key".to_string(),
                    ByteString(s.serving.key_pem.clone().into_bytes()),
                ),
                (
                    "ca.crt".to_string(),
                    ByteString(s.bundle.clone().into_bytes()),
                ),
            ]);
            let mut annotations = BTreeMap::new();
            for (key, at) in [
                (ANNOTATION_BUNDLE_SINCE, s.bundle_since),
                (ANNOTATION_SERVING_SINCE, s.serving_since),
            ] {
                if let Some(at) = at.and_then(|t| t.format(&Rfc3339).ok()) {
                    annotations.insert(key.to_string(), at);
                }
            }
            write_secret(&secrets, &k.tls_secret, tls.as_ref(), data, annotations).await?;
        }
        Step::WriteBundles { bundle } => {
            tracing::info!(configuration = %k.webhook_configuration, "certificate keeper: sets the webhooks' caBundle");
            let b = ByteString(bundle.clone().into_bytes());
            if let Some(mut c) = mwc {
                for w in c.webhooks.iter_mut().flatten() {
                    w.client_config.ca_bundle = Some(b.clone());
                }
                mutating
                    .replace(&k.webhook_configuration, &PostParams::default(), &c)
                    .await
                    .map_err(api("writing the MutatingWebhookConfiguration's caBundle"))?;
            }
            if let Some(mut c) = vwc {
                for w in c.webhooks.iter_mut().flatten() {
                    w.client_config.ca_bundle = Some(b.clone());
                }
                validating
                    .replace(&k.webhook_configuration, &PostParams::default(), &c)
                    .await
                    .map_err(api("writing the ValidatingWebhookConfiguration's caBundle"))?;
            }
        }
        Step::Wait { .. } => {}
    }
    Ok(step)
}

/// Creates the Secret, or replaces it at the resourceVersion read.
async fn write_secret(
    secrets: &Api<Secret>,
    name: &str,
    read: Option<&Secret>,
    data: BTreeMap<String, ByteString>,
    annotations: BTreeMap<String, String>,
) -> Result<(), KeepError> {
    let mut labels = BTreeMap::new();
    labels.insert(
        "app.kubernetes.io/name".to_string(),
        "gpu-share".to_string(),
    );
    labels.insert(
        "app.kubernetes.io/part-of".to_string(),
        "gpu-share".to_string(),
    );
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            resource_version: read.and_then(|s| s.metadata.resource_version.clone()),
            labels: Some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".to_string()),
        data: Some(data),
        ..Default::default()
    };
    let written = match read {
        None => secrets.create(&PostParams::default(), &secret).await,
        Some(_) => secrets.replace(name, &PostParams::default(), &secret).await,
    };
    written
        .map(|_| ())
        .map_err(api(format!("writing Secret {name}")))
}

fn text(s: &Secret, key: &str) -> Option<String> {
    s.data
        .as_ref()?
        .get(key)
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
}

fn pair(s: &Secret) -> Option<PemPair> {
    Some(PemPair {
        cert_pem: text(s, "tls.crt")?,
        key_pem: text(s, "tls.key")?,
    })
}

fn served(s: &Secret) -> Option<Served> {
    let since = |key: &str| {
        s.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .and_then(|v| OffsetDateTime::parse(v, &Rfc3339).ok())
    };
    Some(Served {
        serving: pair(s)?,
        bundle: text(s, "ca.crt").unwrap_or_default(),
        bundle_since: since(ANNOTATION_BUNDLE_SINCE),
        serving_since: since(ANNOTATION_SERVING_SINCE),
    })
}

/// Writes the Secret's serving certificate to this process's files when they differ; whether
/// they hold one now.
async fn write_files(client: &Client, k: &Keeper) -> Result<bool, KeepError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &k.namespace);
    let Some(pair) = secrets
        .get_opt(&k.tls_secret)
        .await
        .map_err(api(format!("reading Secret {}", k.tls_secret)))?
        .as_ref()
        .and_then(pair)
    else {
        return Ok(false);
    };
    for (path, text) in [(&k.key_file, &pair.key_pem), (&k.cert_file, &pair.cert_pem)] {
        if std::fs::read_to_string(path).ok().as_ref() == Some(text) {
            continue;
        }
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text)
            .and_then(|_| {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
            })
            .and_then(|_| std::fs::rename(&tmp, path))
            .map_err(|source| KeepError::File {
                path: path.display().to_string(),
                source,
            })?;
    }
    Ok(true)
}

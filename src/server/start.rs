//! What `run` starts from, step by step: the policy, the certificate, the extender's state, and
//! the cluster's API with the tasks that read it (the extender's watches, reconcile, explainer,
//! requeuer and node advertiser, or for the webhook alone a probe).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::watch;

use super::policy::{load_nodes, load_policy_file, log_policy_file};
use super::tls;
use crate::cli::ServeArgs;
use crate::cluster::ClusterFacts;
use crate::extender::state::{ExtenderState, Mode};
use crate::metrics::Metrics;
use crate::policy::Policy;
use crate::shared::{PolicyStore, Readiness};
use crate::{Error, Result, extender};

/// The policy file (`--policy`) or the embedded default, and the bytes it was read from (empty
/// for the default).
pub(super) fn load_policy_at_start(args: &ServeArgs) -> Result<(Arc<PolicyStore>, Vec<u8>)> {
    let (policy, bytes) = match &args.policy {
        Some(path) => {
            let (loaded, bytes) = load_policy_file(path)?;
            log_policy_file(path, &loaded);
            (loaded.policy, bytes)
        }
        None => (Policy::default_policy(), Vec::new()),
    };
    tracing::info!(source = %args.policy.as_ref().map_or("embedded default".to_string(), |p| p.display().to_string()), "policy loaded");
    Ok((Arc::new(PolicyStore::new(policy)), bytes))
}

/// The `--tls-cert` and `--tls-key` paths, both required.
pub(super) fn cert_and_key(args: &ServeArgs) -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    let cert = args
        .tls_cert
        .clone()
        .ok_or(Error::MissingFlag { flag: "--tls-cert" })?;
    let key = args
        .tls_key
        .clone()
        .ok_or(Error::MissingFlag { flag: "--tls-key" })?;
    Ok((cert, key))
}

/// The certificate files: the flags' or, in `--dev` without `--tls-cert`, a self-signed pair for
/// localhost written to a temporary directory (returned, so that it lives while it is used).
pub(super) fn certificate_files(
    args: &ServeArgs,
) -> Result<(tls::TlsFiles, Option<tempfile::TempDir>)> {
    if !(args.dev && args.tls_cert.is_none()) {
        let (cert, key) = cert_and_key(args)?;
        let files = tls::TlsFiles {
            cert,
            key,
            client_ca: args.client_ca.clone(),
        };
        return Ok((files, None));
    }
    let dir = tempfile::Builder::new()
        .prefix("gpu-share-dev-")
        .tempdir()
        .map_err(|source| Error::DevFiles {
            what: "cannot create a temp dir",
            source,
        })?;
    let pair =
        crate::certs::self_signed(&["localhost", "127.0.0.1"]).map_err(Error::DevCertificate)?;
    let cert = dir.path().join("tls.crt");
    let key = dir.path().join("tls.key");
    std::fs::write(&cert, &pair.cert_pem)
        .and_then(|_| std::fs::write(&key, &pair.key_pem))
        .map_err(|source| Error::DevFiles {
            what: "cannot write the certificate",
            source,
        })?;
    tracing::info!(dir = %dir.path().display(), cert = %cert.display(), "--dev: generated a self-signed certificate for localhost and 127.0.0.1");
    let files = tls::TlsFiles {
        cert,
        key,
        client_ca: args.client_ca.clone(),
    };
    Ok((files, Some(dir)))
}

/// The extender's state for `--role extender|all` (with the `--nodes` inventory, if given).
pub(super) fn extender_state(
    args: &ServeArgs,
    store: &PolicyStore,
) -> Result<Option<Arc<ExtenderState>>> {
    if !args.role.extender() {
        return Ok(None);
    }
    let mode = if args.dev { Mode::Dev } else { Mode::Cluster };
    let ext = Arc::new(ExtenderState::new(
        mode,
        Duration::from_secs(args.assume_ttl_seconds.max(1)),
    ));
    if let Some(path) = &args.nodes {
        let reading = store.current().reading.clone();
        let nodes = load_nodes(path)?;
        let gpu = ext.learn_nodes(&nodes, &reading);
        tracing::info!(path = %path.display(), nodes = nodes.len(), gpu_nodes = gpu, "--nodes: inventory loaded");
    }
    Ok(Some(ext))
}

/// The cluster's API (`None` in `--dev`, which is ready at once): the extender's watches,
/// reconcile and requeuer, or for the webhook alone a probe that marks it ready once the API
/// server answers.
pub(super) async fn connect(
    args: &ServeArgs,
    extender: &Option<Arc<ExtenderState>>,
    store: &Arc<PolicyStore>,
    ready: &Arc<Readiness>,
    metrics: &Arc<Metrics>,
    shutdown: &watch::Receiver<bool>,
) -> Result<Option<ClusterFacts>> {
    if args.dev {
        ready.cluster.store(true, Ordering::Release);
        return Ok(None);
    }
    let client = kube::Client::try_default()
        .await
        .map_err(Error::NoCluster)?;
    let facts = ClusterFacts::new(client.clone());
    match extender {
        Some(ext) => {
            // Ready when the node and pod caches have synced.
            let advertised = Arc::new(crate::quota::advertiser::Seen::default());
            extender::sync::spawn_watches(
                client.clone(),
                ext.clone(),
                store.clone(),
                ready.clone(),
                {
                    let advertised = advertised.clone();
                    move |ev: &kube::runtime::watcher::Event<k8s_openapi::api::core::v1::Node>| {
                        advertised.observe(ev)
                    }
                },
                shutdown.clone(),
            );
            crate::quota::advertiser::spawn(
                client.clone(),
                ext.clone(),
                store.clone(),
                advertised,
                metrics.clone(),
                crate::cluster::leadership::Leadership::new(&args.leader_lease),
                shutdown.clone(),
            );
            extender::sync::spawn_reconcile(
                client.clone(),
                ext.clone(),
                store.clone(),
                metrics.clone(),
                Duration::from_secs(args.reconcile_seconds.max(1)),
                shutdown.clone(),
            );
            extender::sync::spawn_explainer(
                client.clone(),
                ext.clone(),
                store.clone(),
                ext.explainer().subscribe(),
                shutdown.clone(),
            );
            if args.requeue_nudge {
                extender::sync::spawn_requeuer(
                    client,
                    ext.clone(),
                    metrics.clone(),
                    ext.subscribe_releases(),
                    shutdown.clone(),
                );
            } else {
                tracing::info!(
                    "--requeue-nudge false: pods waiting for GPU capacity are not nudged"
                );
            }
        }
        None => spawn_api_probe(facts.clone(), ready.clone()),
    }
    Ok(Some(facts))
}

/// The webhook alone is ready once the API server answers: asks every 2 s until it does.
pub(super) fn spawn_api_probe(facts: ClusterFacts, ready: Arc<Readiness>) {
    tokio::spawn(async move {
        loop {
            match facts.ping().await {
                Ok(()) => {
                    ready.cluster.store(true, Ordering::Release);
                    tracing::info!("Kubernetes API reached");
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "Kubernetes API not reachable yet");
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
        }
    });
}

//! The policy as the service holds it: loaded from a file (with what is derived from it), swapped
//! atomically on reload, and the `--nodes` file of `--dev`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::metrics::Metrics;
use crate::policy::Policy;
use crate::{Error, Result};

use crate::shared::{PolicyStore, stopped};

/// Reads and validates a policy file.
pub fn load_policy(path: &PathBuf) -> Result<Policy> {
    load_policy_file(path).map(|(loaded, _)| loaded.policy)
}

/// Reads and validates a policy file, returning the bytes it was read from as well (the
/// reloader compares against exactly those).
pub fn load_policy_bytes(path: &PathBuf) -> Result<(Policy, Vec<u8>)> {
    load_policy_file(path).map(|(loaded, bytes)| (loaded.policy, bytes))
}

/// Reads and validates a policy file: the policy with the fields it left out and its warnings,
/// and the bytes it was read from. Errors name the file.
pub fn load_policy_file(path: &PathBuf) -> Result<(crate::policy::LoadedFile, Vec<u8>)> {
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| Error::Policy {
        path: shown.clone(),
        reason: e.to_string(),
    })?;
    let text = String::from_utf8(bytes).map_err(|e| Error::Policy {
        path: shown.clone(),
        reason: format!("not UTF-8 text: {e}"),
    })?;
    let loaded = Policy::load(&text, &shown).map_err(|e| Error::Policy {
        path: shown.clone(),
        reason: e.to_string(),
    })?;
    Ok((loaded, text.into_bytes()))
}

/// Logs what a policy file set empty on purpose, and what it left to the defaults.
pub(super) fn log_policy_file(path: &std::path::Path, loaded: &crate::policy::LoadedFile) {
    for w in &loaded.warnings {
        tracing::warn!(path = %path.display(), warning = %w, "policy");
    }
    if !loaded.defaulted.is_empty() {
        tracing::info!(path = %path.display(), fields = %loaded.defaulted.join(", "), "policy: fields left out take the embedded default's values");
    }
}

/// Re-reads the policy file every `every`; a valid change replaces the policy, an invalid one
/// keeps the last good policy and logs why. Works with ConfigMap symlink swaps (content compare).
/// `loaded` is the content the store's policy was read from, so that a change made between that
/// read and this task's start is not mistaken for the loaded policy.
pub fn spawn_policy_reloader(
    path: PathBuf,
    loaded: Vec<u8>,
    store: Arc<PolicyStore>,
    metrics: Arc<Metrics>,
    every: Duration,
    mut shutdown: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut last = Some(loaded);
        loop {
            tokio::select! {
                _ = stopped(&mut shutdown) => return,
                _ = tokio::time::sleep(every) => {}
            }
            let bytes = match tokio::fs::read(&path).await {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot re-read the policy; keeping the last good one");
                    continue;
                }
            };
            if last.as_deref() == Some(&bytes[..]) {
                continue;
            }
            last = Some(bytes.clone());
            match Policy::load(
                &String::from_utf8_lossy(&bytes),
                &path.display().to_string(),
            ) {
                Ok(loaded) => {
                    log_policy_file(&path, &loaded);
                    store.replace(loaded.policy);
                    metrics.policy_reload("ok");
                    tracing::info!(path = %path.display(), "policy reloaded");
                }
                Err(e) => {
                    metrics.policy_reload("invalid");
                    tracing::error!(path = %path.display(), error = %e, "new policy is invalid; keeping the last good one");
                }
            }
        }
    })
}

/// Reads a NodeList (YAML or JSON; a single Node or a YAML stream of Nodes also works).
pub fn load_nodes(path: &PathBuf) -> Result<Vec<k8s_openapi::api::core::v1::Node>> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::ReadNodes {
        path: path.clone(),
        source,
    })?;
    parse_nodes(&text).map_err(|source| Error::Nodes {
        path: path.clone(),
        source,
    })
}

/// Parses the `--nodes` file contents.
pub fn parse_nodes(
    text: &str,
) -> std::result::Result<Vec<k8s_openapi::api::core::v1::Node>, crate::documents::DocumentError> {
    crate::documents::typed(text, "Node")
}

/// `--dev` with `--nodes`: in which form those nodes offer MIG profiles (the webhook's
/// `mig.strategy: auto`; in a cluster it reads the cluster's nodes instead).
pub(super) fn dev_mig_offers(
    args: &crate::cli::ServeArgs,
    store: &PolicyStore,
) -> Result<Option<Arc<crate::inventory::MigOffers>>> {
    let (true, Some(path)) = (args.dev, &args.nodes) else {
        return Ok(None);
    };
    let reading = store.current().reading.clone();
    Ok(Some(Arc::new(crate::inventory::MigOffers::of_cluster(
        &load_nodes(path)?,
        &reading,
    ))))
}

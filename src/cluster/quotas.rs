//! The ResourceQuotas, for each namespace's GPUs against its quotas ([`crate::quota::usage`]):
//! watched by the extender (for `/v1/quotas` and the occupancy page), or listed once by
//! `gpu-share status` straight from the cluster.

use futures::StreamExt;
use k8s_openapi::api::core::v1::ResourceQuota;
use kube::api::ListParams;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::watch::Receiver;

use crate::shared::stopped;

/// The ResourceQuotas as a watch keeps them. Empty before the watch starts, and without a
/// cluster.
#[derive(Default)]
pub struct Seen(std::sync::OnceLock<Store<ResourceQuota>>);

impl Seen {
    /// Starts the watch of every namespace's ResourceQuotas (once; a second call does nothing).
    pub fn watch(&self, client: Client, mut shutdown: Receiver<bool>) {
        if self.0.get().is_some() {
            return;
        }
        let (reader, writer) = reflector::store();
        if self.0.set(reader).is_err() {
            return;
        }
        let mut stream = reflector::reflector(
            writer,
            watcher(
                Api::<ResourceQuota>::all(client),
                watcher::Config::default(),
            ),
        )
        .default_backoff()
        .boxed();
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    _ = stopped(&mut shutdown) => return,
                    n = stream.next() => n,
                };
                match next {
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "ResourceQuota watch error; kube-runtime retries with backoff")
                    }
                    None => return,
                }
            }
        });
    }

    /// Every ResourceQuota the watch holds.
    pub fn all(&self) -> Vec<ResourceQuota> {
        self.0
            .get()
            .map(|s| s.state().iter().map(|q| (**q).clone()).collect())
            .unwrap_or_default()
    }
}

/// Lists the ResourceQuotas of `namespace`, or of every namespace.
pub async fn list(
    client: &Client,
    namespace: Option<&str>,
) -> Result<Vec<ResourceQuota>, kube::Error> {
    let api: Api<ResourceQuota> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    Ok(api.list(&ListParams::default()).await?.items)
}

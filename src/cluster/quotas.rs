//! The ResourceQuotas, for each namespace's GPUs against its quotas ([`crate::quota::usage`]):
//! watched by the extender (for `/v1/quotas` and the occupancy page), or listed once by
//! `gpu-share status` straight from the cluster.

use k8s_openapi::api::core::v1::ResourceQuota;
use kube::api::ListParams;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::watch::Receiver;

/// The ResourceQuotas as a watch keeps them. Empty before the watch starts, and without a
/// cluster.
#[derive(Default)]
pub struct Seen(std::sync::OnceLock<Store<ResourceQuota>>);

impl Seen {
    /// Starts the watch of every namespace's ResourceQuotas (once; a second call does nothing).
    pub fn watch(&self, client: Client, shutdown: Receiver<bool>) {
        if self.0.get().is_some() {
            return;
        }
        let _ = self.0.set(super::watch::reflect(
            Api::<ResourceQuota>::all(client),
            watcher::Config::default(),
            "resourcequotas",
            shutdown,
        ));
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

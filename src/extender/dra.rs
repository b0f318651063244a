//! What the DRA watches do to the extender's state: a slice's event re-reads its node, a claim's
//! event re-counts the holdings on its nodes ([`crate::dra::DraView`], then
//! [`crate::ledger::Ledger::sync_claims`]), and the tasks that feed them from
//! `cluster::dra`'s streams. A cluster that does not serve `resource.k8s.io/v1` has no DRA
//! nodes: the watches are not started, and the extender does not wait for them.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kube::Client;
use kube::runtime::watcher::Event;
use tokio::sync::watch::Receiver;

use super::state::ExtenderState;
use crate::dra::{Claim, ResourceClaim, ResourceSlice};
use crate::inventory::{GpuNode, ModeSource};

/// Collects a relist's objects (Init .. InitDone): the view is replaced by the whole list at
/// once, so what vanished during a dropped watch goes.
#[derive(Debug)]
pub struct Relisted<T> {
    listing: Option<Vec<T>>,
}

impl<T> Default for Relisted<T> {
    fn default() -> Self {
        Relisted { listing: None }
    }
}

impl ExtenderState {
    /// A node whose GPUs the DRA driver publishes, as the extender packs onto it (with its
    /// time-sliced shares opted in where a `nodeModes` rule declares it time-sliced).
    pub fn dra_gpu_node(&self, name: &str) -> Option<GpuNode> {
        let declared = self.shares_declared(name);
        self.dra().gpu_node(name, declared)
    }

    /// Whether a `nodeModes` rule declares node `name` time-sliced, as its labels were last
    /// read ([`crate::cache::NodeFacts::shares_declared`]).
    fn shares_declared(&self, name: &str) -> bool {
        self.nodes().get(name).is_some_and(|f| f.shares_declared)
    }

    /// Applies one slice event. Returns true when a full list has just completed.
    pub fn apply_slice_event(
        &self,
        relist: &mut Relisted<ResourceSlice>,
        event: Event<ResourceSlice>,
    ) -> bool {
        let touched: BTreeSet<String> = match event {
            Event::Init => {
                relist.listing = Some(Vec::new());
                return false;
            }
            Event::InitApply(s) => {
                if let Some(l) = relist.listing.as_mut() {
                    l.push(s);
                }
                return false;
            }
            Event::InitDone => {
                let all = relist.listing.take().unwrap_or_default();
                let changed = self.dra().replace_slices(all);
                self.refresh_dra_nodes(&changed);
                return true;
            }
            Event::Apply(s) => self.dra().apply_slice(s).into_iter().collect(),
            Event::Delete(s) => s
                .metadata
                .name
                .as_deref()
                .and_then(|n| self.dra().remove_slice(n))
                .into_iter()
                .collect(),
        };
        self.refresh_dra_nodes(&touched);
        false
    }

    /// Applies one claim event. Returns true when a full list has just completed.
    pub fn apply_claim_event(
        &self,
        relist: &mut Relisted<Claim>,
        event: Event<ResourceClaim>,
    ) -> bool {
        let touched = match event {
            Event::Init => {
                relist.listing = Some(Vec::new());
                return false;
            }
            Event::InitApply(c) => {
                // Kept as read: what a claim holds of the driver's devices, not the object.
                if let Some(l) = relist.listing.as_mut() {
                    l.extend(Claim::read(&c));
                }
                return false;
            }
            Event::InitDone => {
                let all = relist.listing.take().unwrap_or_default();
                let touched = self.dra().replace_claims(all);
                self.refresh_dra_nodes(&touched);
                return true;
            }
            Event::Apply(c) => {
                let Some(uid) = c.metadata.uid.clone() else {
                    return false;
                };
                self.dra().apply_claim(&uid, Claim::read(&c))
            }
            Event::Delete(c) => {
                let Some(uid) = c.metadata.uid.clone() else {
                    return false;
                };
                self.dra().apply_claim(&uid, None)
            }
        };
        self.refresh_dra_nodes(&touched);
        false
    }

    /// Reads `nodes` again from the view: their inventory, and their claims' holdings. A node
    /// a device plugin serves keeps that reading (a node runs one or the other; one that
    /// publishes both is warned about once).
    pub fn refresh_dra_nodes(&self, nodes: &BTreeSet<String>) {
        for name in nodes {
            let declared = self.shares_declared(name);
            let (g, holdings, covered) = {
                let v = self.dra();
                (
                    v.gpu_node(name, declared),
                    v.holdings(name),
                    v.covered_on(name),
                )
            };
            let current = self.ledger().with_node(name, |nl| nl.node.mode_source);
            match (current, g) {
                (Some(source), Some(_)) if source != ModeSource::Dra => {
                    warn_both_once(name);
                }
                (Some(source), None) if source != ModeSource::Dra => {}
                (_, Some(g)) => {
                    self.touch_node(name);
                    self.set_node(name, Some(g));
                    self.sync_claims(name, &holdings, &covered);
                }
                (Some(_), None) => {
                    self.touch_node(name);
                    self.drop_claims(name);
                    self.set_node(name, None);
                }
                (None, None) => {
                    self.sync_claims(name, &holdings, &covered);
                }
            }
        }
    }
}

fn warn_both_once(node: &str) {
    static WARNED: std::sync::Mutex<BTreeSet<String>> = std::sync::Mutex::new(BTreeSet::new());
    if crate::sync::lock(&WARNED).insert(node.to_string()) {
        tracing::warn!(
            node,
            "node advertises GPUs through a device plugin and publishes them through NVIDIA's DRA driver too; gpu-share reads the device plugin's (a node should run one or the other)"
        );
    }
}

/// Starts the slice and claim watches if the cluster serves `resource.k8s.io/v1`; `synced` is
/// set once both have listed, or at once when there is no DRA API (or it cannot be asked: then
/// DRA nodes are not read, said in the log).
pub fn spawn_watches(
    client: Client,
    ext: Arc<ExtenderState>,
    synced: Arc<AtomicBool>,
    shutdown: Receiver<bool>,
) {
    tokio::spawn(async move {
        let served = crate::cluster::dra::served(&client).await;
        match served {
            Ok(true) => {}
            Ok(false) => {
                tracing::info!(
                    "the API does not serve resource.k8s.io/v1 (Kubernetes before 1.34): no DRA nodes"
                );
                synced.store(true, Ordering::Release);
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot ask the API whether it serves resource.k8s.io/v1: DRA nodes are not read");
                synced.store(true, Ordering::Release);
                return;
            }
        }
        let slices_synced = Arc::new(AtomicBool::new(false));
        let claims_synced = Arc::new(AtomicBool::new(false));
        let e = ext.clone();
        let mut relist = Relisted::default();
        tokio::spawn(crate::cluster::watch::drive(
            crate::cluster::dra::slice_events(client.clone()),
            slices_synced.clone(),
            "resourceslices",
            shutdown.clone(),
            move |ev| e.apply_slice_event(&mut relist, ev),
        ));
        let e = ext.clone();
        let mut relist = Relisted::default();
        tokio::spawn(crate::cluster::watch::drive(
            crate::cluster::dra::claim_events(client),
            claims_synced.clone(),
            "resourceclaims",
            shutdown.clone(),
            move |ev| e.apply_claim_event(&mut relist, ev),
        ));
        let mut shutdown = shutdown;
        loop {
            if slices_synced.load(Ordering::Acquire) && claims_synced.load(Ordering::Acquire) {
                synced.store(true, Ordering::Release);
                return;
            }
            tokio::select! {
                _ = crate::shared::stopped(&mut shutdown) => return,
                _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
            }
        }
    });
}

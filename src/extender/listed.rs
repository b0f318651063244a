//! What a reconcile keeps of the API's lists ([`Listed`]): GPU nodes' inventories (DRA nodes'
//! included) and bound pods' holdings (a DRA claim's in place of the pods it stands for), read a
//! page at a time ([`list_compact`]). The reconcile (`super::sync`) and `gpu-share status` read
//! through it.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;

use crate::cache::NodeFacts;
use crate::cluster::watch;
use crate::inventory;
use crate::ledger::{self, ObservedPod};
use crate::reservation::view::ReservationPod;

/// What a reconcile keeps of a list: GPU nodes' inventories and bound pods' holdings, not the
/// objects (a list of 150,000 pods is a few GB decoded; this is a few dozen MB).
#[derive(Debug, Default)]
pub struct Listed {
    pub(super) nodes: HashMap<String, inventory::GpuNode>,
    pub(super) pods: HashMap<String, ObservedPod>,
    /// gpu-share's reservation pods, in every state.
    reservations: Vec<ReservationPod>,
    /// The DRA side, where the API serves it ([`Listed::dra`]).
    dra: Option<crate::dra::DraView>,
    /// Every node's facts, as the node watch reads them (labels, taints, whether a `nodeModes`
    /// rule declares it time-sliced under the policy the list was read with, cordoned).
    pub(super) facts: HashMap<String, NodeFacts>,
}

impl Listed {
    /// Keeps what a reconcile compares of a node, read as the node watch reads it
    /// ([`NodeFacts::read`]).
    pub fn node(&mut self, n: &Node, reading: &inventory::Reading) {
        let (facts, inventory) = NodeFacts::read(n, reading);
        let name = n.metadata.name.clone().unwrap_or_default();
        if let Some(g) = inventory {
            self.nodes.insert(g.name.clone(), g);
        }
        self.facts.insert(name, facts);
    }

    /// The nodes the list showed cordoned (`gpu-share status` straight from the cluster says
    /// so).
    pub fn cordoned(&self) -> std::collections::BTreeSet<String> {
        self.facts
            .iter()
            .filter(|(_, f)| f.cordoned)
            .map(|(name, _)| name.clone())
            .collect()
    }

    pub fn pod(&mut self, p: &Pod) {
        if let Ok(Some(o)) = ledger::observed_holding(p) {
            self.pods.insert(o.pod.uid.clone(), o);
        }
        self.reservations.extend(ReservationPod::of(p));
    }

    /// Adds the DRA side: the nodes NVIDIA's DRA driver publishes GPUs on (where no device
    /// plugin does: a node runs one or the other) and, in [`Listed::into_parts`], the claims'
    /// holdings in place of the pods they stand for.
    pub fn dra(&mut self, view: crate::dra::DraView) {
        for name in view.nodes() {
            let declared = self.facts.get(&name).is_some_and(|f| f.shares_declared);
            if !self.nodes.contains_key(&name)
                && let Some(g) = view.gpu_node(&name, declared)
            {
                self.nodes.insert(name, g);
            }
        }
        self.dra = Some(view);
    }

    /// The reservation pods listed.
    pub fn reservations(&self) -> &[ReservationPod] {
        &self.reservations
    }

    /// The GPU nodes and the bound pods, pods ordered by UID.
    pub fn into_parts(self) -> (Vec<inventory::GpuNode>, Vec<ObservedPod>) {
        let mut pods: Vec<ObservedPod> = self.pods.into_values().collect();
        if let Some(view) = &self.dra {
            pods.retain(|o| !view.covers(&o.pod.uid));
            for (name, g) in &self.nodes {
                if g.mode_source == inventory::ModeSource::Dra {
                    pods.extend(view.holdings(name));
                }
            }
        }
        pods.sort_by(|a, b| a.pod.uid.cmp(&b.pod.uid));
        (self.nodes.into_values().collect(), pods)
    }

    /// How many GPU nodes and bound pods it holds.
    pub fn counts(&self) -> (usize, usize) {
        (self.nodes.len(), self.pods.len())
    }
}

/// Lists nodes and pods a page at a time (one consistent snapshot each), keeping only what a
/// reconcile compares.
pub async fn list_compact(
    client: &Client,
    reading: &inventory::Reading,
) -> Result<Listed, kube::Error> {
    let mut listed = Listed::default();
    watch::list_nodes(client, |n| listed.node(n, reading)).await?;
    watch::list_pods(client, |p| listed.pod(p)).await?;
    match crate::cluster::dra::served(client).await {
        Ok(true) => listed.dra(crate::cluster::dra::list(client).await?),
        Ok(false) => {}
        // The slice watch still keeps DRA nodes in the extender's ledger.
        Err(e) => {
            tracing::warn!(error = %e, "cannot ask the API whether it serves resource.k8s.io/v1: this list has no DRA nodes")
        }
    }
    Ok(listed)
}

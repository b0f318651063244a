//! What gpu-share knows of the DRA side of the cluster, as plain data: the driver's slices, the
//! claims allocated its devices, and the nodes without a device plugin's GPUs that the slices
//! may describe. From it: each DRA node's [`GpuNode`], the holdings its claims make in the
//! ledger, and the pods those claims stand for.

use std::collections::{BTreeMap, BTreeSet};

use super::claim::Claim;
use super::node::{DraNode, Kind};
use super::slice::ResourceSlice;
use crate::inventory::GpuNode;
use crate::ledger::{Holder, ObservedPod, PodRef, claim_key};
use crate::packing::{Demand, GpuDemand};

/// The DRA side of the cluster.
#[derive(Debug, Default, Clone)]
pub struct DraView {
    /// Slices of driver `gpu.nvidia.com`, by node, then by slice name.
    slices: BTreeMap<String, BTreeMap<String, ResourceSlice>>,
    /// Claims allocated devices of the driver, by UID.
    claims: BTreeMap<String, Claim>,
    /// Pod UID -> the claims that stand for it.
    covering: BTreeMap<String, BTreeSet<String>>,
    /// Slice name -> its node, and node -> the UIDs of the claims holding devices there: an
    /// event touches one node's entries, not every node's or every claim.
    slice_node: BTreeMap<String, String>,
    node_claims: BTreeMap<String, BTreeSet<String>>,
}

impl DraView {
    /// Adds or replaces a slice: the node it describes, if any.
    pub fn apply_slice(&mut self, s: ResourceSlice) -> Option<String> {
        let name = s.metadata.name.clone()?;
        let from = self.remove_slice(&name);
        let Some(node) = s.spec.node_name.clone() else {
            return from;
        };
        if s.spec.driver != crate::nvidia::DRA_DRIVER {
            return Some(node);
        }
        self.slice_node.insert(name.clone(), node.clone());
        self.slices.entry(node.clone()).or_default().insert(name, s);
        Some(node)
    }

    /// Removes a slice by name: the node it described, if any.
    pub fn remove_slice(&mut self, name: &str) -> Option<String> {
        let node = self.slice_node.remove(name)?;
        if let Some(by) = self.slices.get_mut(&node) {
            by.remove(name);
            if by.is_empty() {
                self.slices.remove(&node);
            }
        }
        Some(node)
    }

    /// Replaces every slice (a relist): the nodes whose slices changed.
    pub fn replace_slices(&mut self, all: Vec<ResourceSlice>) -> BTreeSet<String> {
        let before = std::mem::take(&mut self.slices);
        self.slice_node.clear();
        for s in all {
            self.apply_slice(s);
        }
        let mut changed: BTreeSet<String> = BTreeSet::new();
        for n in before.keys().chain(self.slices.keys()) {
            if before.get(n) != self.slices.get(n) {
                changed.insert(n.clone());
            }
        }
        changed
    }

    /// The driver's devices on `node`, if it publishes any. `shares_declared`: whether a
    /// `nodeModes` rule declares the node `time-slicing` (read from its labels under the
    /// current policy, [`crate::cache::NodeFacts::shares_declared`]), the opt-in for
    /// time-sliced shares on the driver's consumable shares.
    pub fn node(&self, node: &str, shares_declared: bool) -> Option<DraNode> {
        let mut d = self.devices(node)?;
        d.shares_declared = shares_declared;
        Some(d)
    }

    /// The driver's devices on `node`, whatever gpu-share may share there.
    fn devices(&self, node: &str) -> Option<DraNode> {
        DraNode::from_slices(node, self.slices.get(node)?.values())
    }

    /// `node` as the extender packs onto it, if the driver publishes GPUs there
    /// (`shares_declared` as for [`DraView::node`]).
    pub fn gpu_node(&self, node: &str, shares_declared: bool) -> Option<GpuNode> {
        let d = self.node(node, shares_declared)?;
        (!d.devices.is_empty()).then(|| d.gpu_node())
    }

    /// Every node with slices of the driver.
    pub fn nodes(&self) -> Vec<String> {
        self.slices.keys().cloned().collect()
    }

    /// Adds or replaces a claim (`None`: it holds no device of the driver now): the nodes whose
    /// holdings changed.
    pub fn apply_claim(&mut self, uid: &str, claim: Option<Claim>) -> BTreeSet<String> {
        let mut touched: BTreeSet<String> = BTreeSet::new();
        if let Some(old) = self.claims.remove(uid) {
            for n in old.nodes() {
                touched.insert(n.to_string());
                if let Some(c) = self.node_claims.get_mut(n) {
                    c.remove(uid);
                    if c.is_empty() {
                        self.node_claims.remove(n);
                    }
                }
            }
            for p in &old.pods {
                if let Some(c) = self.covering.get_mut(p) {
                    c.remove(uid);
                    if c.is_empty() {
                        self.covering.remove(p);
                    }
                }
            }
        }
        if let Some(c) = claim {
            for n in c.nodes() {
                touched.insert(n.to_string());
                self.node_claims
                    .entry(n.to_string())
                    .or_default()
                    .insert(uid.to_string());
            }
            for p in &c.pods {
                self.covering
                    .entry(p.clone())
                    .or_default()
                    .insert(uid.to_string());
            }
            self.claims.insert(uid.to_string(), c);
        }
        touched
    }

    /// Replaces every claim (a relist): the nodes whose holdings changed.
    pub fn replace_claims(&mut self, all: Vec<Claim>) -> BTreeSet<String> {
        let mut touched = BTreeSet::new();
        let listed: BTreeSet<String> = all.iter().map(|c| c.uid.clone()).collect();
        let gone: Vec<String> = self
            .claims
            .keys()
            .filter(|u| !listed.contains(*u))
            .cloned()
            .collect();
        for uid in gone {
            touched.extend(self.apply_claim(&uid, None));
        }
        for c in all {
            if self.claims.get(&c.uid) != Some(&c) {
                let uid = c.uid.clone();
                touched.extend(self.apply_claim(&uid, Some(c)));
            }
        }
        touched
    }

    /// Whether an allocated claim stands for pod `uid`: then the claim is what it holds.
    pub fn covers(&self, pod_uid: &str) -> bool {
        self.covering.contains_key(pod_uid)
    }

    /// The pods the claims on `node` stand for.
    pub fn covered_on(&self, node: &str) -> BTreeSet<String> {
        self.claims_on(node)
            .flat_map(|c| c.pods.iter().cloned())
            .collect()
    }

    /// The claims holding devices on `node`.
    fn claims_on<'a>(&'a self, node: &str) -> impl Iterator<Item = &'a Claim> + 'a {
        self.node_claims
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|uid| self.claims.get(uid))
    }

    /// How many claims hold devices of the driver.
    pub fn claim_count(&self) -> usize {
        self.claims.len()
    }

    /// The holdings the claims make on `node`, as the ledger records them: one per claim and
    /// kind of device (whole GPUs, with the GPUs DRA chose; MIG devices per profile; parts of a
    /// device shared by consumable capacity). A device the node's slices do not list (yet) is
    /// left out until they do.
    pub fn holdings(&self, node: &str) -> Vec<ObservedPod> {
        let Some(dra) = self.devices(node) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for c in self.claims_on(node) {
            let mut whole: Vec<(u32, u32)> = Vec::new();
            let mut shared: Vec<(u32, u32)> = Vec::new();
            let mut mig: BTreeMap<String, u32> = BTreeMap::new();
            for held in &c.devices {
                if held.pool != node {
                    continue;
                }
                let Some(d) = dra.devices.get(&held.device) else {
                    continue;
                };
                match (&d.kind, d.shares) {
                    // The shares the allocation consumed (the request policy's default, one,
                    // when it does not say), of the device's; by memory alone, all of it.
                    (Kind::Gpu { .. }, Some(shares)) => {
                        if let Some(i) = dra.gpu_index(&held.device) {
                            let taken = held.shares.unwrap_or(1).min(shares);
                            let milli = (taken * 1000)
                                .checked_div(shares)
                                .map_or(1000, |m| m.clamp(1, 1000))
                                as u32;
                            shared.push((i, milli));
                        }
                    }
                    (Kind::Gpu { .. }, None) => {
                        if let Some(i) = dra.gpu_index(&held.device) {
                            whole.push((i, 1000));
                        }
                    }
                    (Kind::Mig { profile, .. }, _) => *mig.entry(profile.clone()).or_insert(0) += 1,
                }
            }
            let pod = |kind: &str| {
                PodRef::new(
                    claim_key(&c.uid, node, kind),
                    c.namespace.clone(),
                    c.name.clone(),
                )
                .held_by(Holder::Claim)
            };
            if !whole.is_empty() {
                whole.sort();
                out.push(ObservedPod {
                    pod: pod("gpu"),
                    node: node.to_string(),
                    demand: Demand::gpu(GpuDemand::Whole {
                        count: whole.len() as u32,
                    }),
                    gpus: Some(whole),
                });
            }
            for (i, (gpu, milli)) in shared.into_iter().enumerate() {
                out.push(ObservedPod {
                    pod: pod(&format!("share-{i}")),
                    node: node.to_string(),
                    demand: Demand::gpu(GpuDemand::Timeslice {
                        milli,
                        memory_mib: None,
                    }),
                    gpus: Some(vec![(gpu, milli)]),
                });
            }
            for (profile, count) in mig {
                out.push(ObservedPod {
                    pod: pod(&format!("mig-{profile}")),
                    node: node.to_string(),
                    demand: Demand::gpu(GpuDemand::Mig { profile, count }),
                    gpus: None,
                });
            }
        }
        out
    }
}

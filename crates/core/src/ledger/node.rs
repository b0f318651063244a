//! PURE: one node's ledger (its capacity, usage and holders) and preemption on it.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::inventory::{self, GpuNode};
use crate::packing::{self, Demand, FragMemo, GpuDemand, Placement, Reason, Scorer, Usage};

use super::holder::*;
use super::pod_read::*;

/// What one pod holds on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Holding {
    pub pod: PodRef,
    pub node: String,
    pub demand: Demand,
    pub placement: Placement,
}

/// One node's capacity, usage and holders.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeLedger {
    pub node: GpuNode,
    pub usage: Usage,
    /// Boxed: a node holds a few dozen pods, and a B-tree of so few entries leaves most of its
    /// nodes' slots empty; a slot is a pointer, not a whole holding (the wire benchmark's ledger,
    /// 150,000 pods on 5,000 nodes).
    pub holdings: BTreeMap<String, Box<Holding>>,
    /// The node's fragmentation as the last decision on it measured it (a cache).
    #[serde(skip)]
    pub memo: packing::FragMemo,
    /// Counts the changes of its usage and holdings: a placement planned at one generation is
    /// committed only at the same one ([`super::Ledger::hold`] plans under this node's lock
    /// alone and commits under the index's).
    #[serde(skip)]
    generation: u64,
}

/// Two ledgers are equal when they hold the same node, usage and holdings, whatever their memos
/// (a cache) hold.
impl PartialEq for NodeLedger {
    fn eq(&self, other: &NodeLedger) -> bool {
        self.node == other.node && self.usage == other.usage && self.holdings == other.holdings
    }
}

impl Eq for NodeLedger {}

impl NodeLedger {
    pub fn new(node: GpuNode) -> Self {
        NodeLedger {
            usage: Usage::empty(&node),
            node,
            holdings: BTreeMap::new(),
            memo: packing::FragMemo::default(),
            generation: 0,
        }
    }

    /// How many changes its usage and holdings have seen.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Checks the fit and, if it fits, records the holding (the bind path). Idempotent for a pod
    /// already held here.
    pub fn hold(
        &mut self,
        scorer: &Scorer,
        pod: PodRef,
        demand: Demand,
    ) -> Result<Placement, Reason> {
        if let Some(h) = self.holdings.get(&pod.uid) {
            return Ok(h.placement.clone());
        }
        let placement = self.plan(scorer, &demand)?;
        Ok(self.commit(pod, demand, placement))
    }

    /// Where the packing would place `demand` here now, or why it cannot: nothing changes but the
    /// memo (a cache), so the generation stays.
    pub fn plan(&mut self, scorer: &Scorer, demand: &Demand) -> Result<Placement, Reason> {
        packing::place(scorer, &self.node, &self.usage, demand, &mut self.memo).map(|(p, _)| p)
    }

    /// Records the holding of a placement [planned](Self::plan) at this generation.
    pub fn commit(&mut self, pod: PodRef, demand: Demand, placement: Placement) -> Placement {
        self.generation += 1;
        packing::apply(&mut self.usage, &placement);
        self.holdings.insert(
            pod.uid.clone(),
            Box::new(Holding {
                pod,
                node: self.node.name.clone(),
                // The requirement was the bind's; held, the demand is what the API shows of the
                // pod (a reconcile compares the two).
                demand: Demand {
                    enforcement: crate::enforcement::Requirement::Off,
                    ..demand
                },
                placement: placement.clone(),
            }),
        );
        placement
    }

    /// Records what the API says a pod holds, whether or not it fits (the API is the truth; a pod
    /// bound by another scheduler still occupies the device). A pod held here already is only
    /// [refreshed](Self::refresh).
    /// A reservation first recorded from the API takes the place of its GPU's stand-ins (whose
    /// UIDs are returned, for the caller's index).
    pub fn record(&mut self, observed: &ObservedPod) -> Vec<String> {
        self.record_planned(observed, None)
    }

    /// The placement a pod recorded from the API would get here now (`None` when it is held here
    /// already), with the generation it was planned at: [`Self::record_planned`] takes it while
    /// the generation holds.
    pub fn plan_record(&self, observed: &ObservedPod) -> Option<(u64, Placement)> {
        (!self.holdings.contains_key(&observed.pod.uid)).then(|| {
            (
                self.generation,
                self.placement_for(&observed.demand, observed.gpus.as_deref()),
            )
        })
    }

    /// [`Self::record`], with the placement planned by [`Self::plan_record`] when nothing has
    /// changed here since (else it is planned again).
    pub fn record_planned(
        &mut self,
        observed: &ObservedPod,
        planned: Option<(u64, Placement)>,
    ) -> Vec<String> {
        let uid = &observed.pod.uid;
        let replaced = match observed.demand.gpu {
            GpuDemand::ReservationPod { gpu, .. }
                if observed.pod.holder != Holder::StandIn && !self.holdings.contains_key(uid) =>
            {
                self.drop_stand_ins(gpu)
            }
            _ => Vec::new(),
        };
        let planned = planned
            .filter(|(generation, _)| *generation == self.generation)
            .map(|(_, p)| p);
        self.record_one(observed, planned);
        replaced
    }

    /// Releases the stand-ins of GPU `gpu`'s reservation: their UIDs.
    fn drop_stand_ins(&mut self, gpu: u32) -> Vec<String> {
        let gone: Vec<String> = self
            .holdings
            .iter()
            .filter(|(_, h)| {
                h.pod.holder == Holder::StandIn
                    && matches!(h.demand.gpu, GpuDemand::ReservationPod { gpu: g, .. } if g == gpu)
            })
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in &gone {
            self.release(uid);
        }
        gone
    }

    /// Takes what pod `observed` says of being moved (its phase, its annotations) into its
    /// holding here, if it has one: it follows the pod, and moves nothing.
    pub fn note_consent(&mut self, observed: &ObservedPod) {
        if let Some(h) = self.holdings.get_mut(&observed.pod.uid)
            && h.pod.consent != observed.pod.consent
        {
            h.pod.consent.clone_from(&observed.pod.consent);
        }
    }

    fn record_one(&mut self, observed: &ObservedPod, planned: Option<Placement>) {
        if self.holdings.contains_key(&observed.pod.uid) {
            self.note_consent(observed);
            if let Some(gpus) = &observed.gpus {
                self.refresh(&observed.pod.uid, gpus);
            }
            return;
        }
        let placement = planned
            .unwrap_or_else(|| self.placement_for(&observed.demand, observed.gpus.as_deref()));
        self.generation += 1;
        packing::apply(&mut self.usage, &placement);
        self.holdings.insert(
            observed.pod.uid.clone(),
            Box::new(Holding {
                pod: observed.pod.clone(),
                node: self.node.name.clone(),
                demand: observed.demand.clone(),
                placement,
            }),
        );
    }

    /// A pod already held here keeps the demand it was bound with: its annotations can be edited
    /// later, what the device plugin gave it cannot. Only its per-GPU choice may be refreshed (the
    /// bind annotation arriving after a restart, or a model a relist left behind), and only to
    /// an annotation that fits the demand: one that does not leaves the holding as it is.
    fn refresh(&mut self, uid: &str, gpus: &[(u32, u32)]) {
        if self
            .holdings
            .get(uid)
            .is_none_or(|h| h.placement.gpus == gpus)
        {
            return;
        }
        let Some(mut h) = self.release(uid) else {
            return;
        };
        let refreshed = self.placement_for(&h.demand, Some(gpus));
        if refreshed.gpus == gpus {
            h.placement = refreshed;
        }
        packing::apply(&mut self.usage, &h.placement);
        self.holdings.insert(uid.to_string(), Box::new(h));
    }

    /// The placement of a demand recorded from the API: the node-level part from the demand, the
    /// per-GPU part from the bind annotation when it fits the demand, else the binpack choice.
    /// The annotation wins even where the model has no room: the pod runs on those GPUs, and a
    /// holding without them would let the next pod have them too (the model shows the GPU over
    /// full instead, until what overfills it goes).
    fn placement_for(&self, demand: &Demand, gpus: Option<&[(u32, u32)]>) -> Placement {
        let scorer = Scorer::new(packing::PackingPolicy::Binpack);
        // The pod is running: when the model has no room for it, it still holds its units.
        let mut best = scorer
            .evaluate(&self.node, &self.usage, demand, &mut FragMemo::default())
            .map_or_else(|| packing::node_level(&self.node, demand), |(p, _)| p);
        if let Some(gpus) = gpus
            && annotation_fits(
                gpus,
                &demand.gpu,
                self.node.gpus,
                best.gpus.iter().map(|(_, m)| m).sum(),
            )
        {
            best.gpus = gpus.to_vec();
        }
        best
    }

    /// Re-points a share in per-GPU form at one of the GPUs `to` (another GPU of the node that
    /// gpu-share holds): the packing chooses among them as it would at bind, the others and the
    /// share's own counting as taken. Its new per-GPU model, or `None` when it is no such share
    /// or none of `to` has room for it.
    pub fn repoint(&mut self, scorer: &Scorer, uid: &str, to: &[u32]) -> Option<Vec<(u32, u32)>> {
        let h = self.holdings.get(uid)?;
        if !h.demand.pointed() {
            return None;
        }
        let mut usage = self.usage.clone();
        packing::unapply(&mut usage, &h.placement);
        for (i, whole) in usage.whole.iter_mut().enumerate() {
            if !to.contains(&(i as u32)) {
                *whole += 1;
            }
        }
        let (placement, _) = packing::place(
            scorer,
            &self.node,
            &usage,
            &h.demand,
            &mut FragMemo::default(),
        )
        .ok()?;
        let mut h = self.release(uid)?;
        self.generation += 1;
        h.placement = placement;
        packing::apply(&mut self.usage, &h.placement);
        let gpus = h.placement.gpus.clone();
        self.holdings.insert(uid.to_string(), Box::new(h));
        Some(gpus)
    }

    /// Releases a pod's holding here.
    pub fn release(&mut self, uid: &str) -> Option<Holding> {
        let h = self.holdings.remove(uid)?;
        self.generation += 1;
        packing::unapply(&mut self.usage, &h.placement);
        Some(*h)
    }

    /// New capacity for the node (labels or allocatable changed): usage is rebuilt from the
    /// holdings, keeping their per-GPU model where it still applies.
    pub fn set_node(&mut self, node: GpuNode) {
        if node == self.node {
            return;
        }
        let holdings = std::mem::take(&mut self.holdings);
        let generation = self.generation + 1;
        *self = NodeLedger::new(node);
        self.generation = generation;
        for h in holdings.into_values() {
            // As they were: stand-ins included (the index names them).
            self.record_one(
                &ObservedPod {
                    pod: h.pod,
                    node: h.node,
                    demand: h.demand,
                    gpus: Some(h.placement.gpus),
                },
                None,
            );
        }
    }

    /// True when no enforced count exceeds the node's capacity.
    pub fn within_capacity(&self) -> bool {
        let u = &self.usage;
        let n = &self.node;
        let mig_ok = match &n.mig {
            inventory::MigLayout::Mixed { instances } => u
                .mig
                .iter()
                .all(|(p, used)| *used <= instances.get(p).copied().unwrap_or(0)),
            _ => u.mig.is_empty(),
        };
        let budget_ok = match n.sharing {
            inventory::Sharing::TimeSlicing { .. } => u.budget_milli <= u64::from(n.gpus) * 1000,
            _ => true,
        };
        // Per GPU, on a node shared per GPU: within 100% (a share beside a whole holding passes
        // it) and within the GPU's memory, and no GPU both held whole and reserved.
        let per_gpu_ok = n.sharing != inventory::Sharing::PerGpu
            || (0..u.gpu_milli.len()).all(|i| {
                let whole = u.whole.get(i).copied().unwrap_or(0);
                let reserved = u.reserved.get(i).copied().unwrap_or(0);
                let memory = u.gpu_memory.get(i).copied().unwrap_or(0);
                u.gpu_milli[i] <= 1000
                    && whole <= 1
                    && !(whole > 0 && reserved > 0)
                    && n.gpu_memory_mib.is_none_or(|m| memory <= m)
            });
        u.slots <= n.slots && mig_ok && budget_ok && per_gpu_ok
    }
}

/// Preemption on one node: which victims really make room for `demand`. kube-scheduler's dry
/// run chose `given` without knowing classes or slot sizes. Victims that free capacity the demand
/// can use come first (lowest priority first), then other holders here of lower priority than
/// the preemptor; the set grows until the demand fits, then shrinks to be just sufficient.
/// `None`: no set on this node makes room. If the GPU side fits already (the node failed for
/// other reasons, e.g. CPU), kube-scheduler's own victims are kept.
pub fn plan_victims(
    nl: &NodeLedger,
    demand: &Demand,
    preemptor_priority: i32,
    given: &[String],
) -> Option<Vec<String>> {
    // DRA has no preemption (Kubernetes 1.37): a victim's claim would be freed, but the DRA
    // plugin that chose its devices does not count on it, and the pod would wait the same.
    if nl.node.mode_source == inventory::ModeSource::Dra {
        return None;
    }
    if packing::fit(&nl.node, &nl.usage, demand).is_ok() {
        return if given.is_empty() {
            None
        } else {
            Some(given.to_vec())
        };
    }
    let helps = |h: &Holding| -> bool {
        match &demand.gpu {
            GpuDemand::Mig { profile, .. } => {
                // A device of the requested profile, or one of a layout the node no longer has
                // (its GPU is taken until the pod leaves).
                let stale = |p: &String| packing::stale_mig_of(&nl.node, &nl.usage, p) > 0;
                h.placement
                    .mig
                    .as_ref()
                    .is_some_and(|(p, _)| p == profile || stale(p))
                    || (matches!(nl.node.mig, inventory::MigLayout::Single { .. })
                        && h.placement.slots > 0)
            }
            GpuDemand::None => false,
            _ => {
                h.placement.slots > 0
                    || h.placement.budget_milli > 0
                    || !h.placement.gpus.is_empty()
            }
        }
    };
    let mut given_h: Vec<&Holding> = given
        .iter()
        .filter_map(|u| nl.holdings.get(u).map(|h| &**h))
        .filter(|h| helps(h))
        .collect();
    given_h.sort_by_key(|h| h.pod.priority);
    let mut extra: Vec<&Holding> = nl
        .holdings
        .values()
        .map(|h| &**h)
        .filter(|h| !given.contains(&h.pod.uid) && h.pod.priority < preemptor_priority && helps(h))
        .collect();
    extra.sort_by_key(|h| h.pod.priority);
    let order: Vec<&Holding> = given_h.into_iter().chain(extra).collect();
    let fits_without = |victims: &[&Holding]| -> bool {
        let mut usage = nl.usage.clone();
        for h in victims {
            packing::unapply(&mut usage, &h.placement);
        }
        packing::fit(&nl.node, &usage, demand).is_ok()
    };
    let mut chosen: Vec<&Holding> = Vec::new();
    for h in order {
        chosen.push(h);
        if fits_without(&chosen) {
            break;
        }
    }
    if chosen.is_empty() || !fits_without(&chosen) {
        return None;
    }
    // Shrink: try dropping each victim, highest priority first.
    let mut i = chosen.len();
    while i > 0 {
        i -= 1;
        let mut trial = chosen.clone();
        trial.remove(i);
        if !trial.is_empty() && fits_without(&trial) {
            chosen = trial;
        }
    }
    Some(chosen.iter().map(|h| h.pod.uid.clone()).collect())
}

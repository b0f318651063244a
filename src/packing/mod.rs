//! PURE: fit, place and score GPU demands on GPU nodes. The extender (filter, prioritize, bind,
//! preempt), the simulator and the benchmarks all call this module: there is one implementation.
//!
//! Two levels of truth live here:
//! - what the NVIDIA device plugin enforces, per node: MIG devices per profile, units of the
//!   node's pool resource (whole GPUs, replicas, single-strategy MIG devices), the declared
//!   time-slicing budget and memory. [`fit`] checks these, and the extender accounts them.
//! - a per-GPU model (`Usage::gpu_milli`): which GPU a share would land on. The device plugin
//!   picks the GPU itself, so in a cluster this is only a model (kept for scoring, the simulator
//!   and a future node agent); on [`Sharing::PerGpu`] nodes (the simulator's trace cluster) it is
//!   enforced, as in the FGD paper.

mod demand;
pub mod frag;
pub mod score;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use serde::Serialize;

use crate::inventory::{GpuNode, MigLayout, Sharing};

pub use demand::*;
pub use frag::FragMemo;
pub use score::{OnlineWorkload, PackingPolicy, Scorer, Workload};

/// What is allocated on one node.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub cpu_milli: u64,
    pub memory_mib: u64,
    /// Per full GPU, allocated thousandths (the per-GPU model; may exceed 1000 on a time-sliced
    /// node where the device plugin stacked replicas differently than modelled).
    pub gpu_milli: Vec<u32>,
    /// Units of the node's pool resource in use.
    pub slots: u32,
    /// Declared time-slicing budgets, thousandths of a GPU.
    pub budget_milli: u64,
    /// Declared GPU memory of mps/timeslice pods, MiB.
    pub gpu_memory_mib: u64,
    /// MIG devices in use per profile.
    pub mig: BTreeMap<String, u32>,
    /// Pods holding something here.
    pub pods: u32,
    /// Pods per GPU request kind ([`GpuDemand::tag`]): the `gpu-clustering` policy's view.
    pub tags: BTreeMap<u32, u32>,
}

impl Usage {
    /// Empty usage for a node.
    pub fn empty(node: &GpuNode) -> Self {
        Usage {
            gpu_milli: vec![0; node.gpus as usize],
            ..Usage::default()
        }
    }

    /// Full GPUs with nothing on them (model).
    pub fn free_gpus(&self) -> u32 {
        self.gpu_milli.iter().filter(|m| **m == 0).count() as u32
    }

    /// Allocated thousandths over all full GPUs (model).
    pub fn allocated_milli(&self) -> u64 {
        self.gpu_milli
            .iter()
            .map(|m| u64::from((*m).min(GPU_MILLI)))
            .sum()
    }
}

/// What a placement adds to a node's [`Usage`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// Per-GPU model: (GPU index, thousandths).
    pub gpus: Vec<(u32, u32)>,
    pub slots: u32,
    pub budget_milli: u64,
    pub gpu_memory_mib: u64,
    pub mig: Option<(String, u32)>,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    /// The demand's [`GpuDemand::tag`].
    pub tag: Option<u32>,
}

impl Placement {
    /// The per-GPU model as `index:milli` pairs, e.g. `0:250,3:1000` (the binding annotation).
    pub fn gpus_text(&self) -> String {
        self.gpus
            .iter()
            .map(|(i, m)| format!("{i}:{m}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Parses [`Placement::gpus_text`]; `None` if malformed.
    pub fn parse_gpus(text: &str) -> Option<Vec<(u32, u32)>> {
        if text.is_empty() {
            return Some(Vec::new());
        }
        text.split(',')
            .map(|p| {
                let (i, m) = p.split_once(':')?;
                Some((i.parse().ok()?, m.parse().ok()?))
            })
            .collect()
    }
}

/// Adds a placement to a node's usage.
pub fn apply(usage: &mut Usage, p: &Placement) {
    shift::<true>(usage, p);
}

/// Removes a placement that [`apply`] added.
pub fn unapply(usage: &mut Usage, p: &Placement) {
    shift::<false>(usage, p);
}

/// Adds (`ADD`) or removes a placement, field by field in one place, so that the two can never
/// disagree. Saturating both ways: a recorded pod may claim more than any node has (its spec is
/// not ours). Map entries that fall to zero are removed.
#[inline]
fn shift<const ADD: bool>(usage: &mut Usage, p: &Placement) {
    fn step<T: num_step::Step>(x: &mut T, by: T, add: bool) {
        *x = if add { x.up(by) } else { x.down(by) };
    }
    fn count<K: Ord + Clone>(
        map: &mut std::collections::BTreeMap<K, u32>,
        key: &K,
        by: u32,
        add: bool,
    ) {
        if add {
            let n = map.entry(key.clone()).or_default();
            *n = n.saturating_add(by);
        } else if let Some(n) = map.get_mut(key) {
            *n = n.saturating_sub(by);
            if *n == 0 {
                map.remove(key);
            }
        }
    }
    for (i, m) in &p.gpus {
        if let Some(g) = usage.gpu_milli.get_mut(*i as usize) {
            step(g, *m, ADD);
        }
    }
    step(&mut usage.slots, p.slots, ADD);
    step(&mut usage.budget_milli, p.budget_milli, ADD);
    step(&mut usage.gpu_memory_mib, p.gpu_memory_mib, ADD);
    if let Some((profile, n)) = &p.mig {
        count(&mut usage.mig, profile, *n, ADD);
    }
    step(&mut usage.cpu_milli, p.cpu_milli, ADD);
    step(&mut usage.memory_mib, p.memory_mib, ADD);
    step(&mut usage.pods, 1, ADD);
    if let Some(t) = p.tag {
        count(&mut usage.tags, &t, 1, ADD);
    }
}

/// Saturating steps for the usage counters' integer types.
mod num_step {
    pub trait Step: Copy {
        fn up(self, by: Self) -> Self;
        fn down(self, by: Self) -> Self;
    }
    macro_rules! step {
        ($($t:ty),*) => {$(
            impl Step for $t {
                #[inline]
                fn up(self, by: Self) -> Self { self.saturating_add(by) }
                #[inline]
                fn down(self, by: Self) -> Self { self.saturating_sub(by) }
            }
        )*};
    }
    step!(u32, u64);
}

/// Why a node cannot take a demand. The messages are a fixed set of category sentences (no
/// per-node numbers), so kube-scheduler can group them in the pod's FailedScheduling event.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    NotGpuNode,
    UnknownNode,
    ModelNotAllowed,
    NoMig,
    MigProfileAbsent,
    MigProfileFull,
    MigSingleOtherProfile,
    NodeIsMig,
    SharingMismatch {
        node: &'static str,
        pod: &'static str,
    },
    MpsReplicaTooSmall,
    ReplicaMemoryTooSmall,
    GpuMemoryTooSmall,
    NoFreeReplica,
    BudgetUsedUp,
    MemoryBudgetUsedUp,
    TooFewGpus,
    NoFreeGpus,
    NoGpuWithRoom,
    ResourceAbsent,
    NotEnoughUnits,
    Cpu,
    Memory,
}

impl Reason {
    /// The sentence sent to kube-scheduler.
    pub fn message(&self) -> String {
        self.message_static().into_owned()
    }

    /// [`Reason::message`], borrowed where the sentence is fixed (filter sends one per node).
    pub fn message_static(&self) -> std::borrow::Cow<'static, str> {
        match self {
            Reason::NotGpuNode => "node has no NVIDIA GPUs".into(),
            Reason::UnknownNode => "node is not in gpu-share's inventory".into(),
            Reason::ModelNotAllowed => "node's GPU model is not one the pod allows".into(),
            Reason::NoMig => "node has no MIG devices; pod asks MIG".into(),
            Reason::MigProfileAbsent => "node has no MIG devices of the requested profile".into(),
            Reason::MigProfileFull => "no free MIG device of the requested profile".into(),
            Reason::MigSingleOtherProfile => {
                "node's GPUs are split into MIG devices of another profile".into()
            }
            Reason::NodeIsMig => {
                "node's GPUs are split into MIG devices; pod asks full GPUs".into()
            }
            Reason::SharingMismatch { node, pod } => format!("node {node}; pod asks {pod}").into(),
            Reason::MpsReplicaTooSmall => {
                "MPS replicas on this node are smaller than the request".into()
            }
            Reason::ReplicaMemoryTooSmall => {
                "GPU memory per replica on this node is smaller than the request".into()
            }
            Reason::GpuMemoryTooSmall => {
                "GPU memory on this node is smaller than the request".into()
            }
            Reason::NoFreeReplica => "no free GPU replica on this node".into(),
            Reason::BudgetUsedUp => "time-slicing budget of this node's GPUs is used up".into(),
            Reason::MemoryBudgetUsedUp => "GPU memory budget of this node is used up".into(),
            Reason::TooFewGpus => "node has fewer GPUs than the pod asks".into(),
            Reason::NoFreeGpus => "not enough free whole GPUs".into(),
            Reason::NoGpuWithRoom => "no single GPU has enough free share".into(),
            Reason::ResourceAbsent => "node does not advertise the requested GPU resource".into(),
            Reason::NotEnoughUnits => "not enough free units of the requested GPU resource".into(),
            Reason::Cpu => "not enough free CPU".into(),
            Reason::Memory => "not enough free memory".into(),
        }
    }

    /// True when freed capacity could make the node fit (kube-scheduler's `FailedNodes`, where
    /// preemption may help); false when the node can never hold the pod
    /// (`FailedAndUnresolvableNodes`).
    pub fn resolvable(&self) -> bool {
        matches!(
            self,
            Reason::MigProfileFull
                | Reason::NoFreeReplica
                | Reason::BudgetUsedUp
                | Reason::MemoryBudgetUsedUp
                | Reason::NoFreeGpus
                | Reason::NoGpuWithRoom
                | Reason::NotEnoughUnits
                | Reason::Cpu
                | Reason::Memory
        )
    }

    /// A short stable label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Reason::NotGpuNode => "not_gpu_node",
            Reason::UnknownNode => "unknown_node",
            Reason::ModelNotAllowed => "model_not_allowed",
            Reason::NoMig => "no_mig",
            Reason::MigProfileAbsent => "mig_profile_absent",
            Reason::MigProfileFull => "mig_profile_full",
            Reason::MigSingleOtherProfile => "mig_single_other_profile",
            Reason::NodeIsMig => "node_is_mig",
            Reason::SharingMismatch { .. } => "sharing_mismatch",
            Reason::MpsReplicaTooSmall => "mps_replica_too_small",
            Reason::ReplicaMemoryTooSmall => "replica_memory_too_small",
            Reason::GpuMemoryTooSmall => "gpu_memory_too_small",
            Reason::NoFreeReplica => "no_free_replica",
            Reason::BudgetUsedUp => "budget_used_up",
            Reason::MemoryBudgetUsedUp => "memory_budget_used_up",
            Reason::TooFewGpus => "too_few_gpus",
            Reason::NoFreeGpus => "no_free_gpus",
            Reason::NoGpuWithRoom => "no_gpu_with_room",
            Reason::ResourceAbsent => "resource_absent",
            Reason::NotEnoughUnits => "not_enough_units",
            Reason::Cpu => "cpu",
            Reason::Memory => "memory",
        }
    }
}

fn node_sharing_words(node: &GpuNode) -> &'static str {
    match node.sharing {
        Sharing::None if node.gpus == 0 && node.mig != MigLayout::None => "has only MIG devices",
        Sharing::None => "does not share GPUs",
        Sharing::TimeSlicing { .. } => "shares GPUs by time-slicing",
        Sharing::Mps { .. } => "shares GPUs by MPS",
        Sharing::PerGpu => "shares GPUs per GPU",
    }
}

fn mismatch(node: &GpuNode, pod: &'static str) -> Reason {
    Reason::SharingMismatch {
        node: node_sharing_words(node),
        pod,
    }
}

/// Checks CPU, memory and model; then the GPU rules of [`fit_gpu`].
pub fn fit(node: &GpuNode, usage: &Usage, demand: &Demand) -> Result<(), Reason> {
    if !demand.models.is_empty() {
        let product = node.product.as_deref().unwrap_or_default();
        if !demand.models.iter().any(|m| m == product) {
            return Err(Reason::ModelNotAllowed);
        }
    }
    if let Some(cpu) = node.cpu_milli
        && usage.cpu_milli.saturating_add(demand.cpu_milli) > cpu
    {
        return Err(Reason::Cpu);
    }
    if let Some(mem) = node.memory_mib
        && usage.memory_mib.saturating_add(demand.memory_mib) > mem
    {
        return Err(Reason::Memory);
    }
    fit_gpu(node, usage, &demand.gpu)
}

fn replica_milli(node: &GpuNode) -> u32 {
    GPU_MILLI / node.sharing.replicas()
}

/// The GPU rules. Classes never mix: MIG fits only free MIG devices of that profile; mps only
/// MPS nodes whose replicas are large enough; timeslice only time-sliced nodes; exclusive only
/// unshared whole GPUs.
pub fn fit_gpu(node: &GpuNode, usage: &Usage, demand: &GpuDemand) -> Result<(), Reason> {
    let free_slots = node.slots.saturating_sub(usage.slots);
    match demand {
        GpuDemand::None => Ok(()),
        GpuDemand::Mig { profile, count } => match &node.mig {
            MigLayout::None => Err(Reason::NoMig),
            MigLayout::Single { profile: p } if p != profile => Err(Reason::MigSingleOtherProfile),
            MigLayout::Single { .. } => {
                if node.slots < *count {
                    Err(Reason::MigProfileAbsent)
                } else if free_slots < *count {
                    Err(Reason::MigProfileFull)
                } else {
                    Ok(())
                }
            }
            MigLayout::Mixed { instances } => {
                let total = instances.get(profile).copied().unwrap_or(0);
                let used = usage.mig.get(profile).copied().unwrap_or(0);
                if total < *count {
                    Err(Reason::MigProfileAbsent)
                } else if total.saturating_sub(used) < *count {
                    Err(Reason::MigProfileFull)
                } else {
                    Ok(())
                }
            }
        },
        GpuDemand::Whole { count } => {
            if let MigLayout::Single { .. } = node.mig {
                return Err(Reason::NodeIsMig);
            }
            match node.sharing {
                Sharing::None => {
                    if node.gpus == 0 && node.mig != MigLayout::None {
                        Err(Reason::NodeIsMig)
                    } else if node.slots < *count {
                        Err(Reason::TooFewGpus)
                    } else if free_slots < *count || usage.free_gpus() < *count {
                        Err(Reason::NoFreeGpus)
                    } else {
                        Ok(())
                    }
                }
                Sharing::PerGpu => {
                    if node.gpus < *count {
                        Err(Reason::TooFewGpus)
                    } else if usage.free_gpus() < *count {
                        Err(Reason::NoFreeGpus)
                    } else {
                        Ok(())
                    }
                }
                Sharing::TimeSlicing { .. } | Sharing::Mps { .. } => {
                    Err(mismatch(node, "whole unshared GPUs"))
                }
            }
        }
        GpuDemand::Mps { milli, memory_mib } => match node.sharing {
            Sharing::Mps { replicas } => {
                if replica_milli(node) < *milli {
                    return Err(Reason::MpsReplicaTooSmall);
                }
                if let (Some(want), Some(gpu_mem)) = (memory_mib, node.gpu_memory_mib)
                    && gpu_mem / u64::from(replicas.max(1)) < *want
                {
                    return Err(Reason::ReplicaMemoryTooSmall);
                }
                if free_slots < 1 {
                    return Err(Reason::NoFreeReplica);
                }
                Ok(())
            }
            _ => Err(mismatch(node, "MPS")),
        },
        GpuDemand::Timeslice { milli, memory_mib } => match node.sharing {
            Sharing::TimeSlicing { .. } => {
                if let (Some(want), Some(gpu_mem)) = (memory_mib, node.gpu_memory_mib)
                    && *want > gpu_mem
                {
                    return Err(Reason::GpuMemoryTooSmall);
                }
                if free_slots < 1 {
                    return Err(Reason::NoFreeReplica);
                }
                if usage.budget_milli.saturating_add(u64::from(*milli))
                    > u64::from(node.gpus) * 1000
                {
                    return Err(Reason::BudgetUsedUp);
                }
                if let (Some(want), Some(gpu_mem)) = (memory_mib, node.gpu_memory_mib)
                    && usage.gpu_memory_mib.saturating_add(*want)
                        > gpu_mem.saturating_mul(u64::from(node.gpus))
                {
                    return Err(Reason::MemoryBudgetUsedUp);
                }
                Ok(())
            }
            Sharing::PerGpu => {
                if node.gpus == 0 {
                    return Err(Reason::TooFewGpus);
                }
                if let (Some(want), Some(gpu_mem)) = (memory_mib, node.gpu_memory_mib)
                    && *want > gpu_mem
                {
                    return Err(Reason::GpuMemoryTooSmall);
                }
                if usage
                    .gpu_milli
                    .iter()
                    .any(|m| m.saturating_add(*milli) <= GPU_MILLI)
                {
                    Ok(())
                } else {
                    Err(Reason::NoGpuWithRoom)
                }
            }
            _ => Err(mismatch(node, "time-slicing")),
        },
        GpuDemand::Units { resource, count } => {
            if *resource != node.pool_resource || node.slots == 0 {
                return Err(Reason::ResourceAbsent);
            }
            if node.slots < *count {
                return Err(Reason::ResourceAbsent);
            }
            if free_slots < *count {
                return Err(Reason::NotEnoughUnits);
            }
            // On a time-sliced node each unit counts its fair share against the budget.
            if let Sharing::TimeSlicing { .. } = node.sharing
                && usage
                    .budget_milli
                    .saturating_add(u64::from(*count) * u64::from(replica_milli(node)))
                    > u64::from(node.gpus) * 1000
            {
                return Err(Reason::BudgetUsedUp);
            }
            Ok(())
        }
    }
}

/// What a demand holds on a node apart from the per-GPU model: pool units, time-slicing budget,
/// declared GPU memory, MIG devices, CPU and memory. Every candidate starts from this; a pod
/// already running where the model has no room is recorded with exactly this.
pub fn node_level(node: &GpuNode, demand: &Demand) -> Placement {
    let base = Placement {
        cpu_milli: demand.cpu_milli,
        memory_mib: demand.memory_mib,
        tag: demand.gpu.tag(),
        ..Placement::default()
    };
    let per_gpu_model = node.sharing == Sharing::PerGpu;
    match &demand.gpu {
        GpuDemand::None => base,
        GpuDemand::Whole { count } => Placement {
            slots: if per_gpu_model { 0 } else { *count },
            ..base
        },
        GpuDemand::Mig { profile, count } => match node.mig {
            MigLayout::Single { .. } => Placement {
                slots: *count,
                ..base
            },
            _ => Placement {
                mig: Some((profile.clone(), *count)),
                ..base
            },
        },
        GpuDemand::Mps { memory_mib, .. } => Placement {
            slots: 1,
            gpu_memory_mib: memory_mib.unwrap_or(0),
            ..base
        },
        GpuDemand::Timeslice { milli, memory_mib } => Placement {
            slots: u32::from(!per_gpu_model),
            budget_milli: if per_gpu_model { 0 } else { u64::from(*milli) },
            gpu_memory_mib: memory_mib.unwrap_or(0),
            ..base
        },
        GpuDemand::Units { count, .. } => Placement {
            slots: *count,
            budget_milli: match node.sharing {
                Sharing::TimeSlicing { .. } => u64::from(*count) * u64::from(replica_milli(node)),
                _ => 0,
            },
            ..base
        },
    }
}

/// Every way the demand could be placed on the node's GPUs (per-GPU model), one per distinct
/// GPU state, after [`fit`] said yes. Whole-GPU demands take the lowest-index free GPUs.
pub fn candidates(node: &GpuNode, usage: &Usage, demand: &Demand) -> Vec<Placement> {
    let mut out = Vec::new();
    for_each_candidate(node, usage, demand, |p| out.push(p.clone()));
    out
}

/// Visits [`candidates`] in order without keeping them (a scorer clones only the best): the
/// single-GPU candidates are one placement whose GPU changes between visits.
pub fn for_each_candidate(
    node: &GpuNode,
    usage: &Usage,
    demand: &Demand,
    mut visit: impl FnMut(&Placement),
) {
    let base = node_level(node, demand);
    let free_indexes = |n: u32| -> Vec<(u32, u32)> {
        usage
            .gpu_milli
            .iter()
            .enumerate()
            .filter(|(_, m)| **m == 0)
            .take(n as usize)
            .map(|(i, _)| (i as u32, GPU_MILLI))
            .collect()
    };
    // One candidate per distinct free amount (GPUs with equal load are interchangeable).
    let mut one_gpu_each = |milli: u32, strict: bool, base: Placement| {
        let mut cand = Placement {
            gpus: vec![(0, milli)],
            ..base
        };
        let mut visited = false;
        for (i, m) in usage.gpu_milli.iter().enumerate() {
            // An earlier GPU as used as this one fit as well and was visited.
            if m.saturating_add(milli) > GPU_MILLI || usage.gpu_milli[..i].contains(m) {
                continue;
            }
            cand.gpus[0].0 = i as u32;
            visit(&cand);
            visited = true;
        }
        if !visited && !strict {
            // The model is full; the device plugin still has a replica: model it on the
            // least-loaded GPU.
            if let Some((i, _)) = usage.gpu_milli.iter().enumerate().min_by_key(|(_, m)| **m) {
                cand.gpus[0].0 = i as u32;
                visit(&cand);
            }
        }
    };
    match &demand.gpu {
        GpuDemand::None | GpuDemand::Mig { .. } => visit(&base),
        GpuDemand::Whole { count } => visit(&Placement {
            gpus: free_indexes(*count),
            ..base
        }),
        GpuDemand::Mps { .. } => one_gpu_each(replica_milli(node), false, base),
        GpuDemand::Timeslice { milli, .. } => {
            one_gpu_each(*milli, node.sharing == Sharing::PerGpu, base)
        }
        GpuDemand::Units { count, .. } => {
            let gpus = match node.sharing {
                Sharing::None | Sharing::PerGpu => free_indexes(*count),
                Sharing::TimeSlicing { .. } | Sharing::Mps { .. } => {
                    // Each unit is one replica: model them on the least-loaded GPUs. No node
                    // hands out more units than it has (a recorded pod may claim more).
                    let r = replica_milli(node);
                    let mut load: BinaryHeap<Reverse<(u32, u32)>> = usage
                        .gpu_milli
                        .iter()
                        .enumerate()
                        .map(|(i, m)| Reverse((*m, i as u32)))
                        .collect();
                    let mut out = Vec::new();
                    for _ in 0..(*count).min(node.slots) {
                        let Some(Reverse((m, i))) = load.pop() else {
                            break;
                        };
                        out.push((i, r));
                        load.push(Reverse((m.saturating_add(r), i)));
                    }
                    out
                }
            };
            visit(&Placement { gpus, ..base })
        }
    }
}

/// Fits, then picks the placement the scorer likes best. Returns the placement and its score.
pub fn place(
    scorer: &Scorer,
    node: &GpuNode,
    usage: &Usage,
    demand: &Demand,
) -> Result<(Placement, f64), Reason> {
    place_memo(scorer, node, usage, demand, &mut FragMemo::default())
}

/// [`place`], with the node's own [`FragMemo`] (kept between decisions on the node).
pub fn place_memo(
    scorer: &Scorer,
    node: &GpuNode,
    usage: &Usage,
    demand: &Demand,
    memo: &mut FragMemo,
) -> Result<(Placement, f64), Reason> {
    fit(node, usage, demand)?;
    scorer
        .evaluate_memo(node, usage, demand, memo)
        .ok_or(Reason::NoGpuWithRoom)
}

/// Integer extender scores 0..=10 from raw scores (higher is better): min-max scaled, so the
/// best node gets 10 and the worst 0; all equal get 10.
pub fn to_extender_scores(raw: &[f64]) -> Vec<i64> {
    let (lo, hi) = raw
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), s| {
            (lo.min(*s), hi.max(*s))
        });
    raw.iter()
        .map(|s| {
            if !(hi - lo).is_finite() || hi - lo < 1e-12 {
                10
            } else {
                (((s - lo) / (hi - lo)) * 10.0).round().clamp(0.0, 10.0) as i64
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_shares_follow_the_model_and_demands_print_as_annotations() {
        assert_eq!(mig_profile_milli("3g.40gb"), 428);
        assert_eq!(
            mig_profile_milli("1g.6gb"),
            250,
            "an A30 has 4 compute slices"
        );
        assert_eq!(mig_profile_milli("5g.99gb"), 714, "unknown: N of 7");
        let mig = GpuDemand::Mig {
            profile: "3g.40gb".into(),
            count: 2,
        };
        assert!((mig.gpus() - 0.856).abs() < 1e-9);
        assert_eq!(mig.to_string(), "mig-3g.40gb,count=2");
        assert_eq!(GpuDemand::Whole { count: 1 }.to_string(), "exclusive");
        let mps = GpuDemand::Mps {
            milli: 428,
            memory_mib: Some(40448),
        };
        assert_eq!(mps.to_string(), "mps-42.8,memory=40448Mi");
    }
    use crate::inventory::GpuNode;

    fn ts4() -> GpuNode {
        GpuNode::shared("ts", "H100", 2, 81559, Sharing::TimeSlicing { replicas: 4 })
    }

    fn mps4() -> GpuNode {
        GpuNode::shared("mps", "H100", 2, 81559, Sharing::Mps { replicas: 4 })
    }

    fn mig() -> GpuNode {
        GpuNode {
            gpus: 0,
            slots: 0,
            mig: MigLayout::Mixed {
                instances: [("1g.10gb".to_string(), 7), ("3g.40gb".to_string(), 2)]
                    .into_iter()
                    .collect(),
            },
            ..GpuNode::whole("mig", "A100", 0, 81920)
        }
    }

    fn ts(p: u32) -> Demand {
        Demand::gpu(GpuDemand::Timeslice {
            milli: p * 10,
            memory_mib: None,
        })
    }

    fn mps(p: u32) -> Demand {
        Demand::gpu(GpuDemand::Mps {
            milli: p * 10,
            memory_mib: None,
        })
    }

    fn add(node: &GpuNode, usage: &mut Usage, d: &Demand) -> Result<(), Reason> {
        let (p, _) = place(&Scorer::new(PackingPolicy::Binpack), node, usage, d)?;
        apply(usage, &p);
        Ok(())
    }

    #[test]
    fn classes_never_mix() {
        let plain = GpuNode::whole("plain", "H100", 8, 81559);
        let empty = |n: &GpuNode| Usage::empty(n);
        assert!(fit(&plain, &empty(&plain), &ts(25)).is_err());
        assert!(fit(&plain, &empty(&plain), &mps(25)).is_err());
        assert!(fit(&ts4(), &empty(&ts4()), &mps(25)).is_err());
        assert!(fit(&mps4(), &empty(&mps4()), &ts(25)).is_err());
        let whole = Demand::gpu(GpuDemand::Whole { count: 1 });
        assert!(fit(&ts4(), &empty(&ts4()), &whole).is_err());
        assert!(fit(&mig(), &empty(&mig()), &whole).is_err());
        assert!(fit(&mig(), &empty(&mig()), &ts(25)).is_err());
        let m = Demand::gpu(GpuDemand::Mig {
            profile: "1g.10gb".into(),
            count: 1,
        });
        assert!(fit(&plain, &empty(&plain), &m).is_err());
        assert!(fit(&mig(), &empty(&mig()), &m).is_ok());
        assert_eq!(
            fit(&ts4(), &empty(&ts4()), &mps(25)).unwrap_err().message(),
            "node shares GPUs by time-slicing; pod asks MPS"
        );
    }

    #[test]
    fn mps_replica_must_be_large_enough() {
        let n = mps4();
        let u = Usage::empty(&n);
        assert_eq!(fit(&n, &u, &mps(50)), Err(Reason::MpsReplicaTooSmall));
        assert!(!Reason::MpsReplicaTooSmall.resolvable());
        assert!(fit(&n, &u, &mps(25)).is_ok());
        assert!(fit(&n, &u, &mps(10)).is_ok());
    }

    #[test]
    fn mps_fills_replicas_then_rejects_resolvably() {
        let n = mps4();
        let mut u = Usage::empty(&n);
        for _ in 0..8 {
            add(&n, &mut u, &mps(20)).unwrap();
        }
        assert_eq!(u.slots, 8);
        assert_eq!(add(&n, &mut u, &mps(20)), Err(Reason::NoFreeReplica));
        assert!(Reason::NoFreeReplica.resolvable());
        // The model puts 4 replicas of 250 on each GPU.
        assert_eq!(u.gpu_milli, vec![1000, 1000]);
    }

    #[test]
    fn timeslice_budget_is_bounded_by_gpus() {
        let n = ts4();
        let mut u = Usage::empty(&n);
        add(&n, &mut u, &ts(60)).unwrap();
        add(&n, &mut u, &ts(60)).unwrap();
        assert_eq!(u.budget_milli, 1200);
        add(&n, &mut u, &ts(50)).unwrap();
        assert_eq!(add(&n, &mut u, &ts(40)), Err(Reason::BudgetUsedUp));
        add(&n, &mut u, &ts(30)).unwrap();
        assert_eq!(u.budget_milli, 2000);
        // Replicas: 8 slots; budget is the binding limit here.
        assert_eq!(u.slots, 4);
    }

    #[test]
    fn timeslice_memory_budget() {
        let n = ts4();
        let mut u = Usage::empty(&n);
        let big = Demand::gpu(GpuDemand::Timeslice {
            milli: 10,
            memory_mib: Some(60_000),
        });
        add(&n, &mut u, &big).unwrap();
        add(&n, &mut u, &big).unwrap();
        assert_eq!(add(&n, &mut u, &big), Err(Reason::MemoryBudgetUsedUp));
        let huge = Demand::gpu(GpuDemand::Timeslice {
            milli: 10,
            memory_mib: Some(90_000),
        });
        assert_eq!(
            fit(&n, &Usage::empty(&n), &huge),
            Err(Reason::GpuMemoryTooSmall)
        );
    }

    #[test]
    fn mig_counts_per_profile() {
        let n = mig();
        let mut u = Usage::empty(&n);
        let big = Demand::gpu(GpuDemand::Mig {
            profile: "3g.40gb".into(),
            count: 1,
        });
        add(&n, &mut u, &big).unwrap();
        add(&n, &mut u, &big).unwrap();
        assert_eq!(add(&n, &mut u, &big), Err(Reason::MigProfileFull));
        let absent = Demand::gpu(GpuDemand::Mig {
            profile: "7g.80gb".into(),
            count: 1,
        });
        assert_eq!(fit(&n, &u, &absent), Err(Reason::MigProfileAbsent));
    }

    #[test]
    fn whole_gpus_and_unapply() {
        let n = GpuNode::whole("plain", "H100", 4, 81559);
        let mut u = Usage::empty(&n);
        let two = Demand::gpu(GpuDemand::Whole { count: 2 });
        let (p, _) = place(&Scorer::new(PackingPolicy::Binpack), &n, &u, &two).unwrap();
        apply(&mut u, &p);
        assert_eq!(u.gpu_milli, vec![1000, 1000, 0, 0]);
        add(&n, &mut u, &two).unwrap();
        assert_eq!(add(&n, &mut u, &two), Err(Reason::NoFreeGpus));
        unapply(&mut u, &p);
        assert_eq!(u.gpu_milli, vec![0, 0, 1000, 1000]);
        assert_eq!(u.slots, 2);
        let five = Demand::gpu(GpuDemand::Whole { count: 5 });
        assert_eq!(fit(&n, &u, &five), Err(Reason::TooFewGpus));
    }

    #[test]
    fn per_gpu_nodes_take_both_shapes() {
        let mut n = GpuNode::whole("trace", "G2", 2, 0);
        n.sharing = Sharing::PerGpu;
        n.gpu_memory_mib = None;
        let mut u = Usage::empty(&n);
        add(&n, &mut u, &ts(60)).unwrap();
        add(&n, &mut u, &ts(60)).unwrap();
        assert_eq!(u.gpu_milli, vec![600, 600]);
        assert_eq!(add(&n, &mut u, &ts(50)), Err(Reason::NoGpuWithRoom));
        add(&n, &mut u, &ts(40)).unwrap();
        assert_eq!(
            fit(&n, &u, &Demand::gpu(GpuDemand::Whole { count: 1 })),
            Err(Reason::NoFreeGpus)
        );
    }

    #[test]
    fn cpu_memory_and_model() {
        let mut n = GpuNode::whole("n", "V100M16", 1, 0);
        n.cpu_milli = Some(8000);
        n.memory_mib = Some(1000);
        let u = Usage::empty(&n);
        let mut d = Demand::gpu(GpuDemand::Whole { count: 1 });
        d.cpu_milli = 9000;
        assert_eq!(fit(&n, &u, &d), Err(Reason::Cpu));
        d.cpu_milli = 1000;
        d.memory_mib = 2000;
        assert_eq!(fit(&n, &u, &d), Err(Reason::Memory));
        d.memory_mib = 10;
        d.models = vec!["T4".into()];
        assert_eq!(fit(&n, &u, &d), Err(Reason::ModelNotAllowed));
        d.models = vec!["T4".into(), "V100M16".into()];
        assert!(fit(&n, &u, &d).is_ok());
    }

    #[test]
    fn units_count_against_the_pool() {
        let n = ts4();
        let mut u = Usage::empty(&n);
        let d = Demand::gpu(GpuDemand::Units {
            resource: "nvidia.com/gpu".into(),
            count: 3,
        });
        add(&n, &mut u, &d).unwrap();
        assert_eq!(u.slots, 3);
        assert_eq!(u.budget_milli, 750);
        let other = Demand::gpu(GpuDemand::Units {
            resource: "nvidia.com/gpu.shared".into(),
            count: 1,
        });
        assert_eq!(fit(&n, &u, &other), Err(Reason::ResourceAbsent));
    }

    #[test]
    fn extender_scores_are_scaled() {
        assert_eq!(to_extender_scores(&[0.2, 0.6, 1.0]), vec![0, 5, 10]);
        assert_eq!(to_extender_scores(&[0.5, 0.5]), vec![10, 10]);
        assert_eq!(to_extender_scores(&[]), Vec::<i64>::new());
    }

    #[test]
    fn gpus_text_round_trips() {
        let p = Placement {
            gpus: vec![(0, 250), (3, 1000)],
            ..Placement::default()
        };
        assert_eq!(p.gpus_text(), "0:250,3:1000");
        assert_eq!(Placement::parse_gpus("0:250,3:1000"), Some(p.gpus));
        assert_eq!(Placement::parse_gpus(""), Some(vec![]));
        assert_eq!(Placement::parse_gpus("x"), None);
    }
}

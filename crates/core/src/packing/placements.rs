//! Candidates: every way a demand that fits could be placed on a node's GPUs (the per-GPU
//! model), and what it holds on the node apart from them.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::demand::{Demand, GPU_MILLI, GpuDemand};
use super::fit::replica_milli;
use super::usage::{Placement, Usage};
use crate::inventory::{GpuNode, MigLayout, Sharing};

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
        GpuDemand::Mps { milli, memory_mib } => Placement {
            slots: u32::from(!per_gpu_model),
            // Per GPU, a share without a budget is pinned at its fraction of the GPU's memory.
            gpu_memory_mib: if per_gpu_model {
                super::demand::per_gpu_mps_memory(*milli, *memory_mib, node.gpu_memory_mib)
                    .unwrap_or(0)
            } else {
                memory_mib.unwrap_or(0)
            },
            shared: true,
            mps: true,
            ..base
        },
        GpuDemand::Timeslice { milli, memory_mib } => Placement {
            slots: u32::from(!per_gpu_model),
            budget_milli: if per_gpu_model { 0 } else { u64::from(*milli) },
            gpu_memory_mib: memory_mib.unwrap_or(0),
            shared: true,
            ..base
        },
        GpuDemand::ReservationPod {
            gpu,
            mps,
            cdi_device,
        } => Placement {
            reserve: Some(*gpu),
            mps: *mps,
            cdi_device: *cdi_device,
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

/// What a GPU must have, beyond room for a share's thousandths, to take the share in the model.
#[derive(Clone, Copy)]
struct ShareRule {
    /// Room for the share's declared memory: time-sliced shares' memory adds up on their GPU.
    memory: bool,
    /// The per-GPU model is enforced (a node gpu-share shares per GPU): never a GPU held whole
    /// or by the other sharing class, and never a share modelled where no GPU has room.
    per_gpu: bool,
    /// An MPS share ([`Usage::class_ok`]).
    mps: bool,
}

impl ShareRule {
    /// An MPS replica of the device plugin: its memory is the plugin's equal split.
    const REPLICA: ShareRule = ShareRule {
        memory: false,
        per_gpu: false,
        mps: true,
    };
    /// A time-slicing replica of the device plugin with a declared budget and memory.
    const BUDGET: ShareRule = ShareRule {
        memory: true,
        per_gpu: false,
        mps: false,
    };
    /// A time-sliced share on a node gpu-share shares per GPU.
    const PER_GPU: ShareRule = ShareRule {
        memory: true,
        per_gpu: true,
        mps: false,
    };
    /// An MPS share on a node gpu-share shares per GPU, served by its GPU's own MPS daemon.
    const PER_GPU_MPS: ShareRule = ShareRule {
        memory: true,
        per_gpu: true,
        mps: true,
    };
}

/// `count` replicas of a node the device plugin shares (time-slicing or MPS), modelled as the
/// plugin hands them out, each on the least-loaded GPU at the time (ties to the lowest index),
/// one replica's thousandths each; never more than the node has (a recorded pod may claim more).
fn replica_gpus(node: &GpuNode, usage: &Usage, count: u32) -> Vec<(u32, u32)> {
    let r = replica_milli(node);
    let mut load: BinaryHeap<Reverse<(u32, u32)>> = usage
        .gpu_milli
        .iter()
        .enumerate()
        .map(|(i, m)| Reverse((*m, i as u32)))
        .collect();
    let mut out = Vec::new();
    for _ in 0..count.min(node.slots) {
        let Some(Reverse((m, i))) = load.pop() else {
            break;
        };
        out.push((i, r));
        load.push(Reverse((m.saturating_add(r), i)));
    }
    out
}

/// Every way the demand could be placed on the node's GPUs (per-GPU model), one per distinct
/// GPU state, after [`fit`](super::fit) said yes. Whole-GPU demands take the lowest-index free GPUs.
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
        (0..usage.gpu_milli.len())
            .filter(|i| usage.is_free(*i))
            .take(n as usize)
            .map(|i| (i as u32, GPU_MILLI))
            .collect()
    };
    // One candidate per distinct GPU state (GPUs with equal load are interchangeable), each a GPU
    // with room for the share's thousandths. `rule` says what else a GPU must have: room for the
    // share's declared memory too (time-slicing, where shares' memory adds up on their GPU), and
    // not being held whole (per GPU); and whether, where no GPU has room, the share is modelled on
    // the least-loaded GPU anyway. A bind never gets there ([`fit`](super::fit) refuses first): only
    // a pod recorded from the API does, which runs on some GPU whatever the model says.
    // A share that takes its GPU's CDI device goes only where no reservation without it holds
    // the GPU.
    // On a node shared per GPU, a GPU no reservation holds yet is opened only where the node
    // has room for the reservation the share brings ([`super::reservation_room`]).
    let cdi_device = demand.takes_cdi_device();
    let room_to_open = |mps: bool| super::opening::reservation_room(node, usage, demand, mps);
    let mut one_gpu_each = |milli: u32, rule: ShareRule, base: Placement| {
        let memory = base.gpu_memory_mib;
        let gpu_memory = node.gpu_memory_mib.unwrap_or(u64::MAX);
        let mut cand = Placement {
            gpus: vec![(0, milli)],
            ..base
        };
        let mut visited = false;
        let opens = !rule.per_gpu || room_to_open(rule.mps);
        // GPUs in the same state are interchangeable: the same fit, the same score.
        let state = |i: usize| {
            (
                usage.gpu_milli[i],
                usage.gpu_memory.get(i).copied().unwrap_or(0),
                usage.is_free(i),
                usage.is_shareable(i)
                    && usage.class_ok(i, rule.mps)
                    && (!rule.per_gpu || !cdi_device || usage.serves_cdi_device(i))
                    && (opens || usage.is_reserved(i)),
            )
        };
        for (i, m) in usage.gpu_milli.iter().enumerate() {
            if m.saturating_add(milli) > GPU_MILLI {
                continue;
            }
            let (_, used_memory, _, shareable) = state(i);
            if rule.memory && used_memory.saturating_add(memory) > gpu_memory {
                continue;
            }
            if rule.per_gpu && !shareable {
                continue;
            }
            // An earlier GPU in the same state fit as well and was visited.
            if (0..i).any(|j| state(j) == state(i)) {
                continue;
            }
            cand.gpus[0].0 = i as u32;
            visit(&cand);
            visited = true;
        }
        if !visited && !rule.per_gpu {
            // A recorded pod the model has no room for: the device plugin gave it a replica on
            // some GPU; model it on the least-loaded one.
            if let Some((i, _)) = usage.gpu_milli.iter().enumerate().min_by_key(|(_, m)| **m) {
                cand.gpus[0].0 = i as u32;
                visit(&cand);
            }
        }
    };
    match &demand.gpu {
        GpuDemand::None | GpuDemand::Mig { .. } | GpuDemand::ReservationPod { .. } => visit(&base),
        GpuDemand::Whole { count } => visit(&Placement {
            gpus: free_indexes(*count),
            whole: true,
            ..base
        }),
        GpuDemand::Mps { milli, .. } if node.sharing == Sharing::PerGpu => {
            one_gpu_each(*milli, ShareRule::PER_GPU_MPS, base)
        }
        GpuDemand::Mps { .. } => one_gpu_each(replica_milli(node), ShareRule::REPLICA, base),
        GpuDemand::Timeslice { milli, .. } => {
            let rule = if node.sharing == Sharing::PerGpu {
                ShareRule::PER_GPU
            } else {
                ShareRule::BUDGET
            };
            one_gpu_each(*milli, rule, base)
        }
        GpuDemand::Units { count, .. } => {
            let whole = matches!(node.sharing, Sharing::None | Sharing::PerGpu);
            let gpus = match node.sharing {
                Sharing::None | Sharing::PerGpu => free_indexes(*count),
                Sharing::TimeSlicing { .. } | Sharing::Mps { .. } => {
                    replica_gpus(node, usage, *count)
                }
            };
            visit(&Placement {
                gpus,
                whole,
                ..base
            })
        }
    }
}

//! The FGD paper's six baseline policies, as its simulator scores them: `random`, `dotprod`,
//! `gpu-clustering`, `gpu-packing`, `bestfit` (integer scores 0..=100), and the best-fit GPU
//! inside the node they share. The scorer (`score.rs`) dispatches to them.

use super::demand::{Demand, GPU_MILLI, GpuDemand};
use super::usage::{Placement, Usage};
use crate::inventory::{GpuNode, Sharing};

/// The largest node of the FGD trace, the normaliser of the `dotprod` and `bestfit` scores.
pub const MAX_SPEC_CPU_MILLI: f64 = 128_000.0;
pub const MAX_SPEC_GPU_MILLI: f64 = 8_000.0;

/// Free share of each GPU (thousandths).
fn gpu_left(usage: &Usage) -> impl Iterator<Item = u32> + '_ {
    usage.gpu_milli.iter().map(|m| GPU_MILLI.saturating_sub(*m))
}

fn cpu_left(node: &GpuNode, usage: &Usage) -> u64 {
    node.cpu_milli
        .map_or(0, |c| c.saturating_sub(usage.cpu_milli))
}

/// Among the candidates, the one on the fullest GPU (the least free share that fits); whole-GPU
/// demands have one candidate.
pub(super) fn best_fit_gpu(usage: &Usage, cands: Vec<Placement>) -> Option<Placement> {
    // The fullest GPU; among equals, an idle one a reservation holds (see `held_bonus`).
    let load = |p: &Placement| {
        let milli = p
            .gpus
            .first()
            .and_then(|(i, _)| usage.gpu_milli.get(*i as usize))
            .copied()
            .unwrap_or(0);
        (milli, usage.holds_for(p))
    };
    cands.into_iter().fold(None, |best, p| match best {
        Some(b) if load(&b) >= load(&p) => Some(b),
        _ => Some(p),
    })
}

/// A random GPU among all those with room (uniform over GPUs, not over distinct loads), drawn
/// from a hash of the seed and the node's state.
pub(super) fn random_gpu(
    seed: u64,
    node: &GpuNode,
    usage: &Usage,
    demand: &Demand,
    cands: &[Placement],
) -> Placement {
    let first = cands[0].clone();
    let (mps, milli, memory) = match &demand.gpu {
        GpuDemand::Timeslice { milli, memory_mib } if node.sharing == Sharing::PerGpu => {
            (false, *milli, *memory_mib)
        }
        GpuDemand::Mps { milli, memory_mib } if node.sharing == Sharing::PerGpu => (
            true,
            *milli,
            super::demand::per_gpu_mps_memory(*milli, *memory_mib, node.gpu_memory_mib),
        ),
        _ => return first,
    };
    let eligible: Vec<u32> = (0..usage.gpu_milli.len())
        .filter(|i| usage.takes_share(*i, mps, milli, memory, node.gpu_memory_mib))
        .map(|i| i as u32)
        .collect();
    if eligible.is_empty() {
        return first;
    }
    let mut h = seed ^ 0x9e37_79b9_7f4a_7c15;
    for b in node.name.bytes() {
        h = splitmix(h ^ u64::from(b));
    }
    h = splitmix(h ^ u64::from(usage.pods) ^ (usage.cpu_milli << 20));
    let g = eligible[(h % eligible.len() as u64) as usize];
    Placement {
        gpus: vec![(g, milli)],
        ..first
    }
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `dotprod`: 100 x (1 - (free . request) / 2), the vectors (CPU, GPU) normalised by the
/// largest node; truncated to an integer.
pub fn dot_product_score(node: &GpuNode, usage: &Usage, demand: &Demand) -> f64 {
    let (milli, count) = demand.gpu.per_gpu();
    let free_gpu: u64 = gpu_left(usage).map(u64::from).sum();
    let node_v = [
        cpu_left(node, usage) as f64 / MAX_SPEC_CPU_MILLI,
        free_gpu as f64 / MAX_SPEC_GPU_MILLI,
    ];
    let pod_v = [
        demand.cpu_milli as f64 / MAX_SPEC_CPU_MILLI,
        f64::from(milli) * f64::from(count) / MAX_SPEC_GPU_MILLI,
    ];
    let dot = node_v[0] * pod_v[0] + node_v[1] * pod_v[1];
    (100.0 * (1.0 - dot / 2.0)).trunc()
}

/// `bestfit`: 100 x (1 - 0.5 (CPU left after)/128 vCPU - 0.5 (GPU left after)/8 GPUs),
/// truncated to an integer.
pub fn best_fit_score(node: &GpuNode, usage: &Usage, demand: &Demand) -> f64 {
    let (milli, count) = demand.gpu.per_gpu();
    let free_gpu: u64 = gpu_left(usage).map(u64::from).sum();
    let cpu_after = cpu_left(node, usage) as f64 - demand.cpu_milli as f64;
    let gpu_after = free_gpu as f64 - f64::from(milli) * f64::from(count);
    let waste = cpu_after / MAX_SPEC_CPU_MILLI * 0.5 + gpu_after / MAX_SPEC_GPU_MILLI * 0.5;
    ((1.0 - waste) * 100.0).trunc()
}

/// `gpu-clustering`: 75-100 when the node runs only pods of the same GPU request kind, 50-75
/// when it runs that kind among others, 25-50 when it runs no GPU pod, 0-25 otherwise; inside a
/// band, fuller nodes first. CPU-only pods score 0 everywhere.
pub fn gpu_clustering_score(usage: &Usage, demand: &Demand) -> f64 {
    let Some(tag) = demand.gpu.tag() else {
        return 0.0;
    };
    let left: i64 = gpu_left(usage).map(i64::from).sum();
    let base = 25 * (8000 - left) / 8000;
    let band = if usage.tags.get(&tag).is_some_and(|n| *n > 0) {
        if usage.tags.len() == 1 { 75 } else { 50 }
    } else if usage.tags.is_empty() {
        25
    } else {
        0
    };
    (base + band) as f64
}

/// `gpu-packing`: a pod that fits on already shared GPUs scores 50-100 (the less free share on
/// them the better), one that needs free GPUs of a used node 33-50, an empty node 0-33.
/// CPU-only pods score 0 everywhere.
pub fn gpu_packing_score(node: &GpuNode, usage: &Usage, demand: &Demand) -> f64 {
    let (milli, mut need) = demand.gpu.per_gpu();
    if milli == 0 {
        return 0.0;
    }
    let left: Vec<u32> = gpu_left(usage).collect();
    let fully_free = left.iter().filter(|l| **l == GPU_MILLI).count() as i64;
    if fully_free == i64::from(node.gpus) {
        return (33 - fully_free).max(fully_free) as f64;
    }
    let mut order: Vec<usize> = (0..left.len()).collect();
    order.sort_by_key(|i| left[*i]);
    let mut free_used = 0i64;
    let mut chosen = Vec::new();
    for i in order {
        if need == 0 {
            break;
        }
        if milli <= left[i] {
            need -= 1;
            chosen.push(i);
            if left[i] == GPU_MILLI {
                free_used += 1;
            }
        }
    }
    if need != 0 {
        return 0.0;
    }
    if free_used > 0 {
        return (50 - free_used).max(33) as f64;
    }
    let ratio: i64 = chosen
        .iter()
        .map(|i| i64::from(left[*i]) * 100 / 1000)
        .sum();
    (100 - ratio / 10).max(50) as f64
}

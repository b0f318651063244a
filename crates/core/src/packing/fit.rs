//! Fit: whether a node can take a demand, and if not, why, in a fixed set of words.

use super::demand::{Demand, GPU_MILLI, GpuDemand};
use super::reason::Reason;
use super::usage::Usage;
use crate::inventory::{GpuNode, MigLayout, ModeSource, Sharing};

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

/// Checks that the node advertises every resource the pod's limits name, then CPU, memory and
/// model; then the GPU rules of [`fit_gpu`]; last, that the node holds a share's memory where
/// the policy requires it.
pub fn fit(node: &GpuNode, usage: &Usage, demand: &Demand) -> Result<(), Reason> {
    if node.mode_source == crate::inventory::ModeSource::Dra {
        match demand.gpu {
            GpuDemand::Mps { .. } => return Err(Reason::DraMps),
            GpuDemand::Timeslice { .. } if !node.shares_declared => {
                return Err(Reason::DraNoShares);
            }
            _ => {}
        }
    }
    if node.mode_source == crate::inventory::ModeSource::Dra
        && node.sharing != Sharing::None
        && matches!(
            demand.gpu,
            GpuDemand::Whole { .. } | GpuDemand::Units { .. } | GpuDemand::Mig { .. }
        )
    {
        return Err(Reason::DraSharedDevices);
    }
    if node.mode_source == crate::inventory::ModeSource::Dra
        && let GpuDemand::Mig { profile, .. } = &demand.gpu
        && demand
            .resources
            .iter()
            .any(|r| r == crate::inventory::RESOURCE_GPU)
        && !demand
            .resources
            .contains(&crate::mig::resource_name(profile))
    {
        return Err(Reason::DraMigForm);
    }
    if let Some(r) = demand.resources.iter().find(|r| !node.advertises(r)) {
        return Err(Reason::ResourceNotAdvertised {
            resource: r.clone(),
        });
    }
    // A share in per-GPU form gets its GPU from gpu-share, on a node shared per GPU only; a
    // share that asks the device plugin for a replica would get a whole GPU there.
    let share = matches!(
        demand.gpu,
        GpuDemand::Timeslice { .. } | GpuDemand::Mps { .. }
    );
    if demand.pointed() && node.sharing != Sharing::PerGpu {
        return Err(mismatch(node, "a GPU shared per GPU"));
    }
    if share && node.sharing == Sharing::PerGpu && !demand.resources.is_empty() {
        return Err(mismatch(node, "a replica from the device plugin"));
    }
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
    fit_gpu(node, usage, &demand.gpu)?;
    // A share that takes its GPU's CDI device needs a GPU with room whose reservation writes it
    // (or none yet).
    if let (GpuDemand::Timeslice { milli, memory_mib }, true, Sharing::PerGpu) =
        (&demand.gpu, demand.takes_cdi_device(), node.sharing)
        && !(0..usage.gpu_milli.len()).any(|i| {
            usage.serves_cdi_device(i)
                && usage.takes_share(i, false, *milli, *memory_mib, node.gpu_memory_mib)
        })
    {
        return Err(Reason::NoGpuWithCdiDevice);
    }
    // A share that would open a GPU brings the GPU's reservation pod, whose CPU and memory the
    // node must hold too.
    super::opening::room_to_open(node, usage, demand)?;
    // Last, once the node is of the share's kind and has room: whether it holds the share's
    // memory, where the policy requires it (shares only: `timeslice` and `mps`).
    let share = matches!(
        demand.gpu,
        GpuDemand::Timeslice { .. } | GpuDemand::Mps { .. }
    );
    if share
        && demand.enforcement == crate::enforcement::Requirement::Required
        && let crate::enforcement::Hold::NotHeld { gap, .. } =
            super::held::memory_hold(node, demand)
    {
        return Err(Reason::MemoryNotHeld(gap));
    }
    Ok(())
}

/// Devices of `profile` held beyond what a mixed-strategy node now advertises: devices of a
/// layout that changed under its pods (mig-manager rewrote `nvidia.com/mig.config`, the device
/// plugin re-registered). Their pods still run on them.
pub fn stale_mig_of(node: &GpuNode, usage: &Usage, profile: &str) -> u32 {
    let MigLayout::Mixed { instances } = &node.mig else {
        return 0;
    };
    let used = usage.mig.get(profile).copied().unwrap_or(0);
    used.saturating_sub(instances.get(profile).copied().unwrap_or(0))
}

/// [`stale_mig_of`], over every profile held.
pub fn stale_mig_devices(node: &GpuNode, usage: &Usage) -> u32 {
    usage.mig.keys().map(|p| stale_mig_of(node, usage, p)).sum()
}

/// Devices of `profile` in the node's new MIG layout that gpu-share does not offer while old
/// devices are still held. The device plugin does not say which GPU a device is cut from, so
/// each old device is taken to occupy a GPU of its own (at most all of them), and each such GPU
/// is taken to hold its share of the new devices of `profile` (rounded up): never a new device
/// on a GPU that an old one may still occupy.
pub fn mig_blocked_by_old_layout(node: &GpuNode, usage: &Usage, profile: &str) -> u32 {
    let MigLayout::Mixed { instances } = &node.mig else {
        return 0;
    };
    let stale = stale_mig_devices(node, usage);
    if stale == 0 {
        return 0;
    }
    let total = instances.get(profile).copied().unwrap_or(0);
    let gpus = node.physical_gpus().max(1);
    let per_gpu = total.div_ceil(gpus);
    total.min(per_gpu.saturating_mul(stale.min(gpus)))
}

/// Some GPU takes a share of `milli` thousandths and `memory_mib` of declared memory (GPUs of
/// `gpu_memory_mib` each): not held whole, with room for both. Else why not, in words.
fn gpu_with_room(
    usage: &Usage,
    mps: bool,
    milli: u32,
    memory_mib: Option<u64>,
    gpu_memory_mib: Option<u64>,
) -> Result<(), Reason> {
    let room = |i: usize| usage.takes_share(i, mps, milli, None, None);
    let memory_room = |i: usize| usage.takes_share(i, mps, milli, memory_mib, gpu_memory_mib);
    let n = usage.gpu_milli.len();
    if (0..n).any(|i| room(i) && memory_room(i)) {
        Ok(())
    } else if (0..n).any(room) {
        Err(Reason::NoGpuWithMemory)
    } else if (0..n).any(|i| usage.takes_share(i, !mps, milli, memory_mib, gpu_memory_mib)) {
        Err(Reason::GpusOfOtherClass)
    } else {
        Err(Reason::NoGpuWithRoom)
    }
}

/// A share on a node gpu-share shares per GPU (an MPS one when `mps`): a GPU not held whole nor
/// by the other class, with room for the share's thousandths and for its memory. Per GPU, shares
/// never pass 100% nor the GPU's memory.
fn per_gpu_share(
    node: &GpuNode,
    usage: &Usage,
    mps: bool,
    milli: u32,
    memory_mib: Option<u64>,
) -> Result<(), Reason> {
    if node.gpus == 0 {
        return Err(Reason::TooFewGpus);
    }
    if let (Some(want), Some(gpu_mem)) = (memory_mib, node.gpu_memory_mib)
        && want > gpu_mem
    {
        return Err(Reason::GpuMemoryTooSmall);
    }
    gpu_with_room(usage, mps, milli, memory_mib, node.gpu_memory_mib)
}

/// A share's declared memory fits one replica's part of its GPU (the GPU's memory over
/// `replicas`): each MPS replica's equal split, or one of the equal shares NVIDIA's DRA driver
/// cuts a GPU into.
fn replica_memory_fits(
    node: &GpuNode,
    replicas: u32,
    memory_mib: Option<u64>,
) -> Result<(), Reason> {
    match (memory_mib, node.gpu_memory_mib) {
        (Some(want), Some(gpu_mem)) if gpu_mem / u64::from(replicas.max(1)) < want => {
            Err(Reason::ReplicaMemoryTooSmall)
        }
        _ => Ok(()),
    }
}

pub(super) fn replica_milli(node: &GpuNode) -> u32 {
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
            MigLayout::Single { profile: p, .. } if p != profile => {
                Err(Reason::MigSingleOtherProfile)
            }
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
                let blocked = mig_blocked_by_old_layout(node, usage, profile);
                if total < *count {
                    Err(Reason::MigProfileAbsent)
                } else if total.saturating_sub(used) < *count {
                    Err(Reason::MigProfileFull)
                } else if total.saturating_sub(used).saturating_sub(blocked) < *count {
                    Err(Reason::MigLayoutChanged)
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
                replica_memory_fits(node, replicas, *memory_mib)?;
                if free_slots < 1 {
                    return Err(Reason::NoFreeReplica);
                }
                // A replica is its GPU's 1/replicas; units asked for directly count the same.
                gpu_with_room(usage, true, replica_milli(node), None, None)
            }
            // gpu-share's own MPS daemon per GPU: shares of unequal sizes on one GPU, never
            // beside time-sliced ones.
            Sharing::PerGpu => {
                let memory =
                    super::demand::per_gpu_mps_memory(*milli, *memory_mib, node.gpu_memory_mib);
                per_gpu_share(node, usage, true, *milli, memory)
            }
            _ => Err(mismatch(node, "MPS")),
        },
        GpuDemand::Timeslice { milli, memory_mib } => match node.sharing {
            // NVIDIA's DRA driver cuts each GPU into `replicas` equal shares and hands one to a
            // claim, on the first GPU with one free: a share that fits one holds on any GPU.
            Sharing::TimeSlicing { replicas } if node.mode_source == ModeSource::Dra => {
                let share = replica_milli(node);
                if *milli > share {
                    return Err(Reason::DraShareTooSmall);
                }
                replica_memory_fits(node, replicas, *memory_mib)?;
                if free_slots < 1 {
                    return Err(Reason::NoFreeReplica);
                }
                gpu_with_room(usage, false, share, None, None)
            }
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
                // The node's budget is its GPUs' together, but a share runs on one GPU: one
                // must have room for its thousandths and its memory, or the model (and what
                // `status` shows) would put a GPU past 100%.
                gpu_with_room(usage, false, *milli, *memory_mib, node.gpu_memory_mib)
            }
            Sharing::PerGpu => per_gpu_share(node, usage, false, *milli, *memory_mib),
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
            // Per GPU, whole GPUs come from the free ones: not shared, not reserved.
            if node.sharing == Sharing::PerGpu && usage.free_gpus() < *count {
                return Err(Reason::NoFreeGpus);
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
            // Units of a shared node are replicas, each its GPU's 1/replicas, handed out on the
            // least-loaded GPUs (`placements.rs`): none may pass 100% there. Handing each to the
            // least-loaded GPU overfills one only once every GPU is too full for another, so
            // they fit exactly when the GPUs have room for `count` replicas between them.
            if matches!(
                node.sharing,
                Sharing::TimeSlicing { .. } | Sharing::Mps { .. }
            ) {
                let r = replica_milli(node);
                let room: u32 = usage
                    .gpu_milli
                    .iter()
                    .map(|m| GPU_MILLI.saturating_sub(*m) / r)
                    .sum();
                if room < *count {
                    return Err(Reason::NoGpuWithRoom);
                }
            }
            Ok(())
        }
        GpuDemand::ReservationPod { gpu, mps, .. } => {
            if node.sharing != Sharing::PerGpu {
                Err(mismatch(node, "per-GPU sharing"))
            } else if *gpu >= node.gpus {
                Err(Reason::TooFewGpus)
            } else if usage.is_shareable(*gpu as usize) && usage.class_ok(*gpu as usize, *mps) {
                Ok(())
            } else {
                Err(Reason::NoFreeGpus)
            }
        }
    }
}

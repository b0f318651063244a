//! Fit: whether a node can take a demand, and if not, why, in a fixed set of words.

use serde::Serialize;

use super::demand::{Demand, GPU_MILLI, GpuDemand};
use super::usage::Usage;
use crate::inventory::{GpuNode, MigLayout, ModeSource, Sharing};

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
    /// The node's MIG layout changed while pods still hold devices of the old one.
    MigLayoutChanged,
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
    /// A GPU has room for the share's thousandths, but none of those has room for its memory
    /// (the per-GPU model, enforced on nodes gpu-share shares per GPU).
    NoGpuWithMemory,
    /// A GPU has room for a time-sliced share that takes its GPU's CDI device
    /// (`perGpu.timesliceCdi`), but every such GPU is held by a reservation that writes none
    /// (created before the policy's setting was on): it frees once that GPU's shares leave.
    NoGpuWithCdiDevice,
    /// A GPU has room for the share, but every such GPU serves the other sharing class (MPS
    /// shares and time-sliced shares never share a GPU; nodes gpu-share shares per GPU).
    GpusOfOtherClass,
    ResourceAbsent,
    NotEnoughUnits,
    /// The node does not advertise a resource the pod's limits name (kube-scheduler's own
    /// resource check would refuse it too).
    ResourceNotAdvertised {
        resource: String,
    },
    /// A reservation on the node failed a moment ago (why): shares in per-GPU form go to other
    /// nodes for a while rather than wait on another reservation that would fail the same way.
    ReservationFailed {
        why: String,
    },
    /// A defragmentation plan is making room on the node for another pod (why: the plan in
    /// words): nothing else is placed there until it ends.
    HeldForPlan {
        why: String,
    },
    /// The pod replaces one a defragmentation plan moved, and the room for it is held on
    /// another node.
    SteeredElsewhere,
    Cpu,
    Memory,
    /// The policy requires a share's memory to be held to its budget, and nothing on the node
    /// holds it ([`crate::enforcement`]).
    MemoryNotHeld(crate::enforcement::Gap),
    /// A time-sliced share on a node whose GPUs NVIDIA's DRA driver publishes, where the driver
    /// does not share them by consumable capacity or no `nodeModes` rule declares the node
    /// `time-slicing` (the opt-in; [`crate::dra`]).
    DraNoShares,
    /// An MPS share on a node whose GPUs NVIDIA's DRA driver publishes: the driver gives none
    /// beside its consumable shares, and gpu-share arranges none there.
    DraMps,
    /// A time-sliced share larger than one of the equal shares NVIDIA's DRA driver cuts each
    /// GPU into (its ConsumableShares): a claim takes one share.
    DraShareTooSmall,
    /// A MIG pod in the single strategy's form (`nvidia.com/gpu`) on a node whose MIG devices
    /// NVIDIA's DRA driver publishes: there `nvidia.com/gpu` is a whole GPU.
    DraMigForm,
    /// A whole GPU or a MIG device asked of a node whose devices NVIDIA's DRA driver shares by
    /// consumable capacity (its ConsumableShares): a claim takes a share there, not the device.
    DraSharedDevices,
}

/// How [`Reason::ReservationFailed`]'s sentence begins, whatever the failure.
const RESERVATION_FAILED_HEAD: &str = "a reservation of a GPU on this node failed";

/// How [`Reason::HeldForPlan`]'s sentence begins, whatever the plan.
const HELD_FOR_PLAN_HEAD: &str =
    "a defragmentation plan is making room on this node for a waiting pod";

/// How [`Reason::ResourceNotAdvertised`]'s sentence ends, whatever the resource.
const NOT_ADVERTISED_TAIL: &str = ", the resource the pod's limits name";

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
            Reason::MigLayoutChanged => {
                "node's MIG layout changed while pods still hold devices of the old one; their GPUs stay taken until they finish".into()
            }
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
            Reason::NoGpuWithMemory => {
                "no GPU with a free enough share has enough free memory for the request".into()
            }
            Reason::NoGpuWithCdiDevice => {
                "every GPU with room is held by a reservation that writes no CDI device, which this share takes (perGpu.timesliceCdi)".into()
            }
            Reason::GpusOfOtherClass => {
                "every GPU with room serves the other sharing class (MPS shares and time-sliced shares never share a GPU)".into()
            }
            Reason::ResourceAbsent => "node does not advertise the requested GPU resource".into(),
            Reason::NotEnoughUnits => "not enough free units of the requested GPU resource".into(),
            Reason::ResourceNotAdvertised { resource } => {
                format!("node does not advertise {resource}{NOT_ADVERTISED_TAIL}").into()
            }
            Reason::ReservationFailed { why } => format!(
                "{RESERVATION_FAILED_HEAD} moments ago ({why}); shares in per-GPU form go to other nodes for a while"
            )
            .into(),
            Reason::HeldForPlan { why } => {
                format!("{HELD_FOR_PLAN_HEAD} ({why}); other pods go elsewhere until it ends").into()
            }
            Reason::SteeredElsewhere => {
                "the pod replaces one a defragmentation plan moved, and its room is held on another node".into()
            }
            Reason::Cpu => "not enough free CPU".into(),
            Reason::Memory => "not enough free memory".into(),
            Reason::MemoryNotHeld(gap) => gap.sentence().into(),
            Reason::DraNoShares => {
                "node's GPUs come through NVIDIA's DRA driver, where time-sliced shares go only if the driver shares its GPUs by consumable capacity (ConsumableShares) and a nodeModes rule of the policy declares the node time-slicing; gpu-share serves whole GPUs (exclusive-<n>) and MIG devices there".into()
            }
            Reason::DraMps => {
                "node's GPUs come through NVIDIA's DRA driver, which gives no MPS share beside its consumable shares; MPS shares go to device-plugin nodes".into()
            }
            Reason::DraShareTooSmall => {
                "node's GPUs are cut into equal shares by NVIDIA's DRA driver (ConsumableShares), and one share, which is what a claim takes, is smaller than the pod's fraction".into()
            }
            Reason::DraSharedDevices => {
                "node's devices are shared by NVIDIA's DRA driver (its ConsumableShares): a claim there takes a share of a device, never a whole GPU or MIG device".into()
            }
            Reason::DraMigForm => {
                "node's MIG devices come through NVIDIA's DRA driver as nvidia.com/mig-<profile> (gpu-share's DeviceClasses); the pod asks for nvidia.com/gpu (the single MIG strategy's form), which is a whole GPU there".into()
            }
        }
    }

    /// Every sentence [`Reason::message`] can say (a mismatch's is told by its `; pod asks `, a
    /// resource the node lacks by its tail):
    /// how a scheduling message is known to carry gpu-share's word.
    pub fn all_messages() -> impl Iterator<Item = &'static str> {
        [
            Reason::NotGpuNode,
            Reason::UnknownNode,
            Reason::ModelNotAllowed,
            Reason::NoMig,
            Reason::MigProfileAbsent,
            Reason::MigProfileFull,
            Reason::MigLayoutChanged,
            Reason::MigSingleOtherProfile,
            Reason::NodeIsMig,
            Reason::MpsReplicaTooSmall,
            Reason::ReplicaMemoryTooSmall,
            Reason::GpuMemoryTooSmall,
            Reason::NoFreeReplica,
            Reason::BudgetUsedUp,
            Reason::MemoryBudgetUsedUp,
            Reason::TooFewGpus,
            Reason::NoFreeGpus,
            Reason::NoGpuWithRoom,
            Reason::NoGpuWithMemory,
            Reason::NoGpuWithCdiDevice,
            Reason::GpusOfOtherClass,
            Reason::ResourceAbsent,
            Reason::NotEnoughUnits,
            Reason::MemoryNotHeld(crate::enforcement::Gap::NoBudget),
            Reason::MemoryNotHeld(crate::enforcement::Gap::NoDriverLimits),
            Reason::MemoryNotHeld(crate::enforcement::Gap::Mig),
            Reason::DraNoShares,
            Reason::DraMps,
            Reason::DraShareTooSmall,
            Reason::DraMigForm,
            Reason::DraSharedDevices,
            Reason::SteeredElsewhere,
        ]
        .into_iter()
        .filter_map(|r| match r.message_static() {
            std::borrow::Cow::Borrowed(m) => Some(m),
            std::borrow::Cow::Owned(_) => None,
        })
        .chain([
            "; pod asks ",
            NOT_ADVERTISED_TAIL,
            RESERVATION_FAILED_HEAD,
            HELD_FOR_PLAN_HEAD,
        ])
    }

    /// True when freed capacity could make the node fit (kube-scheduler's `FailedNodes`, where
    /// preemption may help); false when the node can never hold the pod
    /// (`FailedAndUnresolvableNodes`).
    pub fn resolvable(&self) -> bool {
        matches!(
            self,
            Reason::MigProfileFull
                | Reason::MigLayoutChanged
                | Reason::NoFreeReplica
                | Reason::BudgetUsedUp
                | Reason::MemoryBudgetUsedUp
                | Reason::NoFreeGpus
                | Reason::NoGpuWithRoom
                | Reason::NoGpuWithMemory
                | Reason::NoGpuWithCdiDevice
                | Reason::GpusOfOtherClass
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
            Reason::MigLayoutChanged => "mig_layout_changed",
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
            Reason::NoGpuWithMemory => "no_gpu_with_memory",
            Reason::NoGpuWithCdiDevice => "no_gpu_with_cdi_device",
            Reason::GpusOfOtherClass => "gpus_of_other_class",
            Reason::ResourceAbsent => "resource_absent",
            Reason::NotEnoughUnits => "not_enough_units",
            Reason::ResourceNotAdvertised { .. } => "resource_not_advertised",
            Reason::ReservationFailed { .. } => "reservation_failed",
            Reason::HeldForPlan { .. } => "held_for_plan",
            Reason::SteeredElsewhere => "steered_elsewhere",
            Reason::Cpu => "cpu",
            Reason::Memory => "memory",
            Reason::MemoryNotHeld(gap) => gap.label(),
            Reason::DraNoShares => "dra_no_shares",
            Reason::DraMps => "dra_mps",
            Reason::DraShareTooSmall => "dra_share_too_small",
            Reason::DraMigForm => "dra_mig_form",
            Reason::DraSharedDevices => "dra_shared_devices",
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

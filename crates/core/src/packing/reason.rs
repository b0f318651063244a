//! Why a node cannot take a demand, in a fixed set of words: the sentence sent to
//! kube-scheduler, whether freed capacity could help, and a label for metrics.

use serde::Serialize;

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
    NoRoomForReservation,
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
            Reason::NoRoomForReservation => {
                "every GPU with room would be opened by this share, and the node has no CPU or memory left for the reservation pod that opening a GPU brings".into()
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
            Reason::NoRoomForReservation,
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
                | Reason::NoRoomForReservation
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
            Reason::NoRoomForReservation => "no_room_for_reservation",
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

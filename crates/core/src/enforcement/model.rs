//! What holds a share to its budget: the types ([`super`] says how they are read and used).

use serde::{Deserialize, Serialize};

/// The first driver branch with per-container memory limits.
pub const MIN_DRIVER_FOR_MEMORY_LIMITS: u32 = 615;
/// The bind annotation that says what holds a share's memory on its node, or `none: <why>`.
pub const ANNOTATION_HELD_BY: &str = "gpu-share.io/memory-held-by";
/// The environment the toolkit's hook reads (MiB): the soft limit...
pub const ENV_MEMORY_REQUEST: &str = "NVIDIA_GPU_MEMORY_REQUEST";
/// ...and the hard limit.
pub const ENV_MEMORY_LIMIT: &str = "NVIDIA_GPU_MEMORY_LIMIT";

/// What a budgeted share needs of its node (the policy's `enforcement.budgets`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Requirement {
    /// Only nodes that hold the share's memory to its budget.
    Required,
    /// Any node; where nothing holds it, the bind says so on the pod.
    #[default]
    Preferred,
    /// Nothing checked, nothing said.
    Off,
}

impl Requirement {
    pub fn as_str(self) -> &'static str {
        match self {
            Requirement::Required => "required",
            Requirement::Preferred => "preferred",
            Requirement::Off => "off",
        }
    }
}

/// Whether the driver's memory limits hold a share's memory on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum MemoryLimits {
    /// Driver r615 or later, and the toolkit's hook declared by the policy.
    Applied,
    /// Driver r615 or later, but the policy does not declare the toolkit's hook.
    HookNotDeclared,
    /// The driver is older than r615.
    DriverTooOld,
    /// No label or declaration gives the driver's version.
    #[default]
    DriverUnknown,
    /// The policy's `nodeModes` says the node's toolkit does not apply them.
    DeclaredOff,
    /// The driver and the toolkit would, but a time-sliced share in per-GPU form reaches its GPU
    /// through `NVIDIA_VISIBLE_DEVICES` under the legacy runtime, which runs no CDI hook (said
    /// per share, never read from a node), unless the policy's `perGpu.timesliceCdi` gives it
    /// its GPU's CDI device.
    NotThroughPerGpuForm,
    /// GKE's own GPU stack, whose device plugin and runtime run no Container Toolkit hook.
    GkeStack,
    /// NVIDIA's DRA driver gives the node's GPUs: a claim that takes a share of a GPU by
    /// consumable capacity (its ConsumableShares) gets no per-container memory limit from it.
    DraDriver,
}

impl MemoryLimits {
    /// Why the limits do not hold, in words; `None` when they do.
    pub fn why_not(self, driver: Option<&str>) -> Option<String> {
        let driver = driver.unwrap_or("unknown");
        match self {
            MemoryLimits::Applied => None,
            MemoryLimits::HookNotDeclared => Some(format!(
                "driver {driver} has per-container memory limits, but the policy does not declare the Container Toolkit's hook that applies them (enforcement.memoryLimitHook, GPU Operator 26.7.1 or later)"
            )),
            MemoryLimits::DriverTooOld => Some(format!(
                "driver {driver} has no per-container memory limits (r{MIN_DRIVER_FOR_MEMORY_LIMITS} or later)"
            )),
            MemoryLimits::DriverUnknown => Some(format!(
                "the node's driver version is unknown (no GPU Feature Discovery label nvidia.com/cuda.driver-version.major, no nodeModes driverVersion), so its per-container memory limits (r{MIN_DRIVER_FOR_MEMORY_LIMITS} or later) cannot be counted on"
            )),
            MemoryLimits::DeclaredOff => Some(
                "the policy's nodeModes says the node's Container Toolkit does not apply the driver's memory limits".to_string(),
            ),
            MemoryLimits::GkeStack => Some(format!(
                "driver {driver}, but GKE's own GPU stack runs no Container Toolkit hook to apply the driver's memory limits"
            )),
            MemoryLimits::NotThroughPerGpuForm => Some(format!(
                "driver {driver} has per-container memory limits, but a time-sliced share in per-GPU form gets its GPU through the legacy runtime, which runs no CDI hook (the policy's perGpu.timesliceCdi gives it a CDI device with NVIDIA's hooks)"
            )),
            MemoryLimits::DraDriver => Some(format!(
                "driver {driver}, but NVIDIA's DRA driver gives this node's GPUs, and a claim that takes a share of a GPU (its ConsumableShares) gets no per-container memory limit"
            )),
        }
    }
}

/// What can hold a share to its budget on one node, as read from its labels and the policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Enforcement {
    /// The driver's version (GFD's `nvidia.com/cuda.driver-version.full`, or its major alone, or
    /// the policy's `nodeModes` `driverVersion`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    pub memory_limits: MemoryLimits,
    /// A time-sliced share in per-GPU form gets its GPU through the CDI device its reservation
    /// writes (`gpu-share.io/gpu=<UUID>`, NVIDIA's edits with the toolkit's hooks), not a bare
    /// UUID under the legacy runtime (the policy's `perGpu.timesliceCdi`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub timeslice_cdi: bool,
}

/// What holds a share's memory on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Holder {
    /// The driver's per-container limit, at the share's budget.
    DriverLimit,
    /// The device plugin's MPS server, at the replica's equal split of the GPU.
    DevicePluginMps,
    /// gpu-share's MPS daemon of the GPU (a node shared per GPU): the client's pinned limit at
    /// its budget (or its fraction of the GPU's memory) and its thread percentage, set in its
    /// environment.
    GpuShareMps,
    /// A MIG device's own memory.
    #[serde(rename = "mig")]
    Hardware,
    /// The pod has its GPUs whole.
    WholeGpu,
}

impl Holder {
    pub fn as_str(self) -> &'static str {
        match self {
            Holder::DriverLimit => "driver-limit",
            Holder::DevicePluginMps => "device-plugin-mps",
            Holder::GpuShareMps => "gpu-share-mps",
            Holder::Hardware => "mig",
            Holder::WholeGpu => "whole-gpu",
        }
    }
}

/// Why nothing holds a share's memory on a node, by kind (kube-scheduler groups the nodes of
/// one sentence in a pod's event, so the sentence carries no per-node value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Gap {
    /// The driver's limit would hold it, but the share has no memory budget.
    NoBudget,
    /// Time-slicing (or no MPS server) and no driver limits.
    NoDriverLimits,
    /// The node's GPUs are MIG devices, to which the driver's limits do not apply.
    Mig,
}

impl Gap {
    /// The sentence for kube-scheduler.
    pub fn sentence(self) -> &'static str {
        match self {
            Gap::NoBudget => {
                "budget enforcement required: the driver's memory limit here needs the share's gpu-share/memory"
            }
            Gap::NoDriverLimits => {
                "budget enforcement required: nothing on this node holds a share's memory (no MPS server, no driver memory limits)"
            }
            Gap::Mig => {
                "budget enforcement required: the driver's memory limits do not apply to this node's MIG devices"
            }
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Gap::NoBudget => "memory_not_held_no_budget",
            Gap::NoDriverLimits => "memory_not_held",
            Gap::Mig => "memory_not_held_mig",
        }
    }
}

/// What holds one demand's memory on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// Held, by this.
    Held(Holder),
    /// Not held: of what kind, and why in words (with the node's own facts).
    NotHeld { gap: Gap, why: String },
    /// Nothing to hold (no GPU, or a reservation).
    Nothing,
}

impl Hold {
    /// The bind annotation's value ([`ANNOTATION_HELD_BY`]).
    pub fn annotation(&self) -> Option<String> {
        match self {
            Hold::Held(h) => Some(h.as_str().to_string()),
            Hold::NotHeld { why, .. } => Some(format!("none: {why}")),
            Hold::Nothing => None,
        }
    }
}

/// How a node's GPUs are shared, as far as holding a share's memory goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeSharing {
    /// Whole GPUs (and MIG devices).
    Unshared,
    /// The device plugin's time-slicing.
    TimeSlicing,
    /// The device plugin's MPS, `replicas` per GPU.
    Mps { replicas: u32 },
    /// gpu-share's per-GPU sharing.
    PerGpu,
}

/// The node facts [`memory_hold`] reads.
#[derive(Debug, Clone, Copy)]
pub struct NodeFacts<'a> {
    pub enforcement: &'a Enforcement,
    pub sharing: NodeSharing,
    /// Every GPU of the node is in MIG mode (the driver's limits apply to none of them).
    pub all_mig: bool,
}

/// What a pod asks for, as far as holding its memory goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    /// `timeslice-<p>`, with its memory budget if it has one.
    Timeslice { memory_mib: Option<u64> },
    /// `mps-<p>`, with its memory budget if it has one.
    Mps { memory_mib: Option<u64> },
    /// Device-plugin units asked for directly (replicas on a shared node, GPUs on a plain one).
    Units,
    /// MIG devices.
    Mig,
    /// Whole GPUs.
    Whole,
    /// No GPU, or a reservation.
    Nothing,
}

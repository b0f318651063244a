//! How a node's GPUs are shared, and where that was read from.

use serde::Serialize;

/// How a node's full GPUs are shared (the device plugin's sharing config applies to all of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "strategy", rename_all = "kebab-case")]
pub enum Sharing {
    /// Not shared: each unit of `nvidia.com/gpu` is a whole GPU (or, on a single-strategy MIG
    /// node, a MIG device).
    None,
    /// Time-slicing: each GPU is advertised `replicas` times; no isolation.
    TimeSlicing { replicas: u32 },
    /// MPS: each GPU is advertised `replicas` times, each replica a fixed 1/replicas of the SMs
    /// and memory.
    Mps { replicas: u32 },
    /// The simulator's model of the trace's cluster (the FGD paper's): any GPU takes whole-GPU
    /// pods and fractional pods, placed per GPU. No NVIDIA device plugin mode enforces this.
    PerGpu,
}

impl Sharing {
    pub fn replicas(self) -> u32 {
        match self {
            Sharing::TimeSlicing { replicas } | Sharing::Mps { replicas } => replicas.max(1),
            Sharing::None | Sharing::PerGpu => 1,
        }
    }

    /// The GFD label value.
    pub fn label(self) -> &'static str {
        match self {
            Sharing::None => "none",
            Sharing::TimeSlicing { .. } => "time-slicing",
            Sharing::Mps { .. } => "mps",
            Sharing::PerGpu => "per-gpu",
        }
    }
}

/// Where a node's sharing mode was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ModeSource {
    /// NVIDIA GPU Feature Discovery's labels (`nvidia.com/gpu.*`, `nvidia.com/mig.*`).
    #[default]
    Gfd,
    /// GKE's own GPU labels (`cloud.google.com/gke-*`).
    Gke,
    /// No label says how the GPUs are shared (NVIDIA's device plugin without GFD, common on
    /// EKS and AKS): each `nvidia.com/gpu` is taken as a whole, unshared GPU, unverified.
    Unverified,
    /// The policy's `nodeModes` declares it for the node's labels.
    Declared,
    /// No label says, but the node's cloud instance type gives its GPU count
    /// (`node.kubernetes.io/instance-type`): what `nvidia.com/gpu` has above it is replicas.
    InstanceType,
    /// NVIDIA's DRA driver's ResourceSlices (`gpu.nvidia.com`): no device plugin on the node
    /// ([`crate::dra`]).
    Dra,
}

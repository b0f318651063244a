//! One GPU node as the extender and the simulator see it ([`GpuNode`], its MIG layout), and why
//! no pod of its class may be able to use it ([`Unreached`]). Read from a Node by the parent
//! module.

use std::collections::BTreeMap;

use serde::Serialize;

use super::sharing::{ModeSource, Sharing};
use crate::nvidia::{MAX_GPUS_PER_NODE, MIG_RESOURCE_PREFIX, RESOURCE_GPU, RESOURCE_GPU_SHARED};

/// A node no pod of its class can use: they ask for a resource it does not advertise (the
/// device plugin renamed its shared GPUs, or runs another MIG strategy than the policy's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Unreached {
    /// `timeslice`, `mps`, `mig` or `exclusive`.
    pub class: &'static str,
    pub pods_ask_for: String,
    /// The GPU resources the node advertises, with a unit or more.
    pub node_advertises: Vec<String>,
}

impl Unreached {
    /// In words, for `/v1/nodes`, `gpu-share status` and the log.
    pub fn sentence(&self) -> String {
        let advertises = self.node_advertises.join(", ");
        format!(
            "no {} pod can use this node: they ask for {}, the node advertises {advertises}; {}",
            self.class,
            self.pods_ask_for,
            self.hint()
        )
    }

    /// What would make the node usable.
    pub fn hint(&self) -> String {
        match self.class {
            "mig" => {
                "set the policy's mig.strategy to the device plugin's (nvidia.com/mig.strategy)"
                    .to_string()
            }
            "exclusive" => format!(
                "exclusive pods ask for {RESOURCE_GPU}; label the node's sharing mode (GPU Feature Discovery) or declare it in the policy's nodeModes"
            ),
            class => {
                let other = self
                    .node_advertises
                    .iter()
                    .find(|r| !r.starts_with(MIG_RESOURCE_PREFIX))
                    .map_or(RESOURCE_GPU_SHARED, String::as_str);
                format!(
                    "set the policy's resources.{class} to {other} if every {class} node advertises it, or make the device plugin's renameByDefault agree across them"
                )
            }
        }
    }
}

/// How MIG devices are exposed on the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "strategy", rename_all = "kebab-case")]
pub enum MigLayout {
    /// No MIG devices.
    None,
    /// Single strategy: every unit of `nvidia.com/gpu` is a MIG device of `profile`, of which
    /// one GPU of the node's model holds `per_gpu` ([`crate::mig::MigTable::per_gpu`]).
    Single {
        profile: String,
        #[serde(rename = "devicesPerGpu")]
        per_gpu: u32,
    },
    /// Mixed strategy: MIG devices per profile (`nvidia.com/mig-<profile>` allocatable counts,
    /// replicas included when MIG devices are time-sliced).
    Mixed { instances: BTreeMap<String, u32> },
}

/// One GPU node as the extender and the simulator see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuNode {
    pub name: String,
    /// GPU model, e.g. `NVIDIA-H100-80GB-HBM3` (no `-SHARED`, no `-MIG-<profile>`).
    pub product: Option<String>,
    /// Physical full GPUs not in MIG mode (the per-GPU model has this many GPUs).
    pub gpus: u32,
    /// Memory of one full GPU, MiB.
    pub gpu_memory_mib: Option<u64>,
    pub sharing: Sharing,
    /// Allocatable units of `pool_resource`: whole GPUs, replicas, or single-strategy MIG devices.
    pub slots: u32,
    /// The resource those units are advertised as.
    pub pool_resource: String,
    pub mig: MigLayout,
    /// Allocatable CPU (milli) and memory (MiB), when accounted (the simulator; in a cluster
    /// kube-scheduler checks them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_milli: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    /// Where the sharing mode was read from.
    pub mode_source: ModeSource,
    /// GFD's `nvidia.com/gpu.count` on a mixed-strategy MIG node, where it counts physical GPUs
    /// (a MIG layout that leaves slices unused cannot tell them); see [`GpuNode::physical_gpus`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labelled_gpus: Option<u32>,
    /// Memory of one MIG device per profile, MiB: GFD's `nvidia.com/mig-<profile>.memory`
    /// (mixed), or `nvidia.com/gpu.memory` on a single-strategy node, where it is the device's.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub mig_memory_mib: BTreeMap<String, u64>,
    /// Every GPU resource the node advertises with a unit or more (`nvidia.com/gpu`,
    /// `nvidia.com/gpu.shared`, `nvidia.com/mig-*`): what a pod's limits may name here.
    pub advertised: Vec<String>,
    /// Set when no pod of the node's class can use it ([`Reading::unreached`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreached: Option<Unreached>,
    /// Set when the node asks for per-GPU sharing (label or policy) and does not qualify: why,
    /// in words ([`crate::inventory::opt_in_per_gpu`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_gpu_refused: Option<String>,
    /// What can hold a share to its budget here ([`crate::enforcement`]).
    pub enforcement: crate::enforcement::Enforcement,
    /// A node whose GPUs NVIDIA's DRA driver shares by consumable capacity, which a `nodeModes`
    /// rule declares `time-slicing`: gpu-share's time-sliced shares take its shares (the
    /// opt-in; [`crate::dra`]).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub shares_declared: bool,
}

impl GpuNode {
    /// A plain node with `gpus` unshared GPUs.
    pub fn whole(name: &str, product: &str, gpus: u32, gpu_memory_mib: u64) -> Self {
        GpuNode {
            name: name.to_string(),
            product: Some(product.to_string()),
            gpus,
            gpu_memory_mib: Some(gpu_memory_mib),
            sharing: Sharing::None,
            slots: gpus,
            pool_resource: RESOURCE_GPU.to_string(),
            mig: MigLayout::None,
            cpu_milli: None,
            memory_mib: None,
            mode_source: ModeSource::Gfd,
            labelled_gpus: None,
            mig_memory_mib: BTreeMap::new(),
            advertised: if gpus > 0 {
                vec![RESOURCE_GPU.to_string()]
            } else {
                Vec::new()
            },
            unreached: None,
            per_gpu_refused: None,
            shares_declared: false,
            enforcement: Default::default(),
        }
    }

    /// Whether the node advertises `resource` with a unit or more: the resource a pod's limits
    /// name must be one (kube-scheduler's own resource check agrees).
    pub fn advertises(&self, resource: &str) -> bool {
        self.advertised.iter().any(|r| r == resource)
    }

    /// Physical GPUs: the full GPUs, and the GPUs the MIG devices are cut from (single
    /// strategy: the devices over how many of the profile one GPU holds; mixed: the devices'
    /// compute share, rounded up, or GFD's count when larger); at most [`MAX_GPUS_PER_NODE`].
    /// The one GPU count `/v1/nodes`, `gpu-share status` and the simulator show.
    pub fn physical_gpus(&self) -> u32 {
        let mig = match &self.mig {
            MigLayout::None => 0,
            MigLayout::Single { per_gpu, .. } => self.slots.div_ceil((*per_gpu).max(1)),
            MigLayout::Mixed { instances } => {
                let milli: u64 = instances
                    .iter()
                    .map(|(p, c)| u64::from(*c) * u64::from(crate::mig::mig_profile_milli(p)))
                    .sum();
                u32::try_from(milli.div_ceil(1000)).unwrap_or(u32::MAX)
            }
        };
        self.gpus
            .saturating_add(mig)
            .max(self.labelled_gpus.unwrap_or(0))
            .min(MAX_GPUS_PER_NODE)
    }

    /// A node whose GPUs are shared with `sharing` (`replicas` per GPU).
    pub fn shared(
        name: &str,
        product: &str,
        gpus: u32,
        gpu_memory_mib: u64,
        sharing: Sharing,
    ) -> Self {
        let pool = GpuNode::whole(name, product, gpus, gpu_memory_mib);
        GpuNode {
            slots: gpus * sharing.replicas(),
            sharing,
            ..pool
        }
    }

    /// What [`crate::enforcement::memory_hold`] reads of the node.
    pub fn enforcement_facts(&self) -> crate::enforcement::NodeFacts<'_> {
        use crate::enforcement::NodeSharing;
        crate::enforcement::NodeFacts {
            enforcement: &self.enforcement,
            sharing: match self.sharing {
                Sharing::None => NodeSharing::Unshared,
                Sharing::TimeSlicing { .. } => NodeSharing::TimeSlicing,
                Sharing::Mps { replicas } => NodeSharing::Mps { replicas },
                Sharing::PerGpu => NodeSharing::PerGpu,
            },
            all_mig: self.mig != MigLayout::None && self.gpus == 0,
        }
    }

    /// Total MIG devices (any profile).
    pub fn mig_devices(&self) -> u32 {
        match &self.mig {
            MigLayout::None => 0,
            MigLayout::Single { .. } => self.slots,
            MigLayout::Mixed { instances } => instances.values().sum(),
        }
    }

    /// A short description of the node's kind, e.g. `time-slicing x4`, `mig mixed`.
    pub fn kind(&self) -> String {
        if self.mode_source == ModeSource::Dra
            && let Sharing::TimeSlicing { replicas } = self.sharing
        {
            let served = if self.shares_declared {
                ", time-sliced shares"
            } else {
                ""
            };
            return format!("consumable shares x{replicas}{served}");
        }
        match (&self.mig, self.sharing) {
            (MigLayout::Single { profile, .. }, _) => format!("mig single {profile}"),
            (MigLayout::Mixed { .. }, Sharing::None) if self.gpus == 0 => "mig mixed".to_string(),
            (MigLayout::Mixed { .. }, _) => format!("mig mixed + {}", self.sharing_kind()),
            _ => self.sharing_kind(),
        }
    }

    fn sharing_kind(&self) -> String {
        match self.sharing {
            Sharing::None => "whole".to_string(),
            Sharing::TimeSlicing { replicas } => format!("time-slicing x{replicas}"),
            Sharing::Mps { replicas } => format!("mps x{replicas}"),
            Sharing::PerGpu => "per-gpu".to_string(),
        }
    }
}

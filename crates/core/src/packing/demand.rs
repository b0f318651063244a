//! The demand model: what a pod asks of a node (a GPU demand by class, CPU and memory), and the
//! MIG shares it is measured in.

use serde::Serialize;

pub use crate::mig::{GPU_MILLI, mig_profile_milli, mig_share_milli};

/// What a pod asks of the GPU side of a node.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum GpuDemand {
    /// No GPU (CPU-only pods in the simulator).
    None,
    /// `count` whole, unshared GPUs.
    Whole { count: u32 },
    /// One MPS replica of at least `milli`/1000 of a GPU.
    Mps { milli: u32, memory_mib: Option<u64> },
    /// One time-slicing replica with a declared budget of `milli`/1000 of a GPU.
    Timeslice { milli: u32, memory_mib: Option<u64> },
    /// `count` MIG devices of `profile` (profile form, e.g. `1g.10gb+me`).
    Mig { profile: String, count: u32 },
    /// `count` units of a device-plugin resource asked for directly (`nvidia.com/gpu` without a
    /// gpu-share annotation): whole GPUs, replicas or single-strategy MIG devices, by node.
    Units { resource: String, count: u32 },
    /// gpu-share's reservation of GPU `gpu` of a node it shares per GPU: the pod that holds the
    /// GPU through the device plugin (one `nvidia.com/gpu`) so that shares can use it; `mps`:
    /// it runs the GPU's MPS daemon, for MPS shares only; `cdi_device`: a time-sliced one that
    /// writes the GPU's CDI device (only such a reservation serves a share that takes it).
    #[serde(rename = "reserve")]
    ReservationPod {
        gpu: u32,
        mps: bool,
        cdi_device: bool,
    },
}

impl GpuDemand {
    /// The class name used in reasons and metrics.
    pub fn class(&self) -> &'static str {
        match self {
            GpuDemand::None => "none",
            GpuDemand::Whole { .. } => "exclusive",
            GpuDemand::Mps { .. } => "mps",
            GpuDemand::Timeslice { .. } => "timeslice",
            GpuDemand::Mig { .. } => "mig",
            GpuDemand::Units { .. } => "device",
            GpuDemand::ReservationPod { .. } => "reservation",
        }
    }

    /// The request's kind for clustering like requests together: 0 for a share of one GPU,
    /// `n` for `n` whole GPUs; `None` for MIG devices, device-plugin units and CPU-only pods.
    pub fn tag(&self) -> Option<u32> {
        match self {
            GpuDemand::Mps { .. } | GpuDemand::Timeslice { .. } => Some(0),
            GpuDemand::Whole { count } => Some(*count),
            _ => None,
        }
    }

    /// The per-GPU view: (thousandths on each GPU, GPUs). A share is (milli, 1); whole GPUs,
    /// MIG devices and device-plugin units count as whole GPUs each; no GPU is (0, 0).
    pub fn per_gpu(&self) -> (u32, u32) {
        match self {
            GpuDemand::None | GpuDemand::ReservationPod { .. } => (0, 0),
            GpuDemand::Timeslice { milli, .. } | GpuDemand::Mps { milli, .. } => {
                ((*milli).min(GPU_MILLI), 1)
            }
            GpuDemand::Whole { count }
            | GpuDemand::Mig { count, .. }
            | GpuDemand::Units { count, .. } => (GPU_MILLI, *count),
        }
    }

    /// Size in thousandths of a GPU (model): a MIG device counts by its compute slices
    /// (`3g.40gb` is 3/7 of a GPU), a device-plugin unit as a whole GPU.
    pub fn milli(&self) -> u64 {
        match self {
            GpuDemand::None | GpuDemand::ReservationPod { .. } => 0,
            GpuDemand::Whole { count } | GpuDemand::Units { count, .. } => {
                u64::from(*count) * u64::from(GPU_MILLI)
            }
            GpuDemand::Mps { milli, .. } | GpuDemand::Timeslice { milli, .. } => u64::from(*milli),
            GpuDemand::Mig { profile, count } => {
                u64::from(*count) * u64::from(mig_profile_milli(profile))
            }
        }
    }

    /// Size in GPUs (model), for reports.
    pub fn gpus(&self) -> f64 {
        self.milli() as f64 / f64::from(GPU_MILLI)
    }
}

/// A demand in the annotation's words (`exclusive`, `mps-25,memory=12288Mi`, `mig-1g.10gb`,
/// `mig-1g.10gb,count=2`), as `GpuRequest::normalized` writes them; a share restated from a MIG
/// device may carry a decimal (`mps-42.8`). Device-plugin units read `nvidia.com/gpu x2`.
impl std::fmt::Display for GpuDemand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let memory = |f: &mut std::fmt::Formatter<'_>, m: &Option<u64>| match m {
            Some(m) => write!(f, ",memory={m}Mi"),
            None => Ok(()),
        };
        let pct = |milli: u32| f64::from(milli) / 10.0;
        match self {
            GpuDemand::None => f.write_str("none"),
            GpuDemand::Whole { count: 1 } => f.write_str("exclusive"),
            GpuDemand::Whole { count } => write!(f, "exclusive-{count}"),
            GpuDemand::Mps { milli, memory_mib } => {
                write!(f, "mps-{}", pct(*milli))?;
                memory(f, memory_mib)
            }
            GpuDemand::Timeslice { milli, memory_mib } => {
                write!(f, "timeslice-{}", pct(*milli))?;
                memory(f, memory_mib)
            }
            GpuDemand::Mig { profile, count: 1 } => write!(f, "mig-{profile}"),
            GpuDemand::Mig { profile, count } => write!(f, "mig-{profile},count={count}"),
            GpuDemand::Units { resource, count } => write!(f, "{resource} x{count}"),
            GpuDemand::ReservationPod {
                gpu,
                mps: false,
                cdi_device: false,
            } => write!(f, "reservation of GPU {gpu}"),
            GpuDemand::ReservationPod {
                gpu,
                mps: false,
                cdi_device: true,
            } => write!(f, "reservation of GPU {gpu} with its CDI device"),
            GpuDemand::ReservationPod { gpu, mps: true, .. } => {
                write!(f, "reservation of GPU {gpu} with its MPS daemon")
            }
        }
    }
}

/// The GPU memory an MPS share in per-GPU form holds on its GPU (and is pinned at by its MPS
/// server): its budget, else its thousandths of the GPU's memory (rounded down; unknown when
/// the GPU's memory is).
pub fn per_gpu_mps_memory(
    milli: u32,
    memory_mib: Option<u64>,
    gpu_memory_mib: Option<u64>,
) -> Option<u64> {
    memory_mib.or_else(|| gpu_memory_mib.map(|m| m * u64::from(milli) / u64::from(GPU_MILLI)))
}

/// Where a share in per-GPU form reads its GPU from: the ConfigMap, and the key its container's
/// `NVIDIA_VISIBLE_DEVICES` reads (which says what the container takes).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Devices {
    /// In the pod's namespace.
    pub configmap: String,
    /// The key is [`crate::request::CDI_DEVICE_KEY`]: a time-sliced share takes its GPU's CDI
    /// device (`gpu-share.io/gpu=<UUID>`, the policy's `perGpu.timesliceCdi`), not its UUID
    /// under the legacy runtime. (An MPS share always takes its GPU's MPS device, in
    /// [`crate::request::DEVICES_KEY`].)
    pub cdi_device: bool,
}

/// A pod's full demand.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Demand {
    /// CPU and memory are checked only on nodes that account them (the simulator).
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpu: GpuDemand,
    /// Allowed GPU models (exact product names, `-SHARED` stripped); empty means any.
    pub models: Vec<String>,
    /// The `nvidia.com/*` resources the pod's limits name: a node must advertise each. Empty
    /// for demands not read from a pod (the simulator's).
    pub resources: Vec<String>,
    /// A share in per-GPU form: the pod asks the device plugin for nothing, and its container
    /// reads `NVIDIA_VISIBLE_DEVICES` from a ConfigMap, which gpu-share fills with the GPU it
    /// holds for it (a node shared per GPU only). Demands not read from a pod (the
    /// simulator's) have none and fit either kind of node.
    pub devices: Option<Devices>,
    /// Whether the node must hold the share's memory to its budget (the policy's
    /// `enforcement.budgets`, set by the extender at filter and bind; `Off` for pods recorded
    /// from the API, which run wherever they are, and for the simulator's demands).
    pub enforcement: crate::enforcement::Requirement,
    /// The memory limit the Container Toolkit's hook will apply to the pod's container, MiB:
    /// `NVIDIA_GPU_MEMORY_LIMIT` and `NVIDIA_GPU_MEMORY_REQUEST` as literal values in its
    /// environment (the webhook writes them at the budget). What the driver's limit holds is
    /// this, never the request annotation: a pod admitted without them has none.
    pub driver_limit_mib: Option<u64>,
}

impl Demand {
    pub fn gpu(gpu: GpuDemand) -> Self {
        Demand {
            cpu_milli: 0,
            memory_mib: 0,
            gpu,
            models: Vec::new(),
            resources: Vec::new(),
            devices: None,
            enforcement: crate::enforcement::Requirement::Off,
            driver_limit_mib: None,
        }
    }

    /// A share in per-GPU form ([`Demand::devices`]).
    pub fn pointed(&self) -> bool {
        self.devices.is_some()
    }

    /// A share that takes its GPU's CDI device ([`Devices::cdi_device`]): only a GPU whose
    /// reservation writes it, or a free one (whose new reservation will), serves it.
    pub fn takes_cdi_device(&self) -> bool {
        self.devices.as_ref().is_some_and(|d| d.cdi_device)
    }
}

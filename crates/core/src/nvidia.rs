//! PURE: NVIDIA's names as its device plugin, GPU Feature Discovery and GKE set them (node
//! labels and extended resources, protocols.md 3.4), and the bounds on what one node is taken to
//! claim. Below `inventory` and `policy`, which both read them.

pub const LABEL_PRODUCT: &str = "nvidia.com/gpu.product";
pub const LABEL_COUNT: &str = "nvidia.com/gpu.count";
pub const LABEL_MEMORY: &str = "nvidia.com/gpu.memory";
pub const LABEL_REPLICAS: &str = "nvidia.com/gpu.replicas";
pub const LABEL_SHARING: &str = "nvidia.com/gpu.sharing-strategy";
pub const LABEL_MIG_STRATEGY: &str = "nvidia.com/mig.strategy";
pub const LABEL_MIG_CONFIG: &str = "nvidia.com/mig.config";
/// GPU Feature Discovery writes a MIG device's slices under its resource's name, so under the
/// single strategy this one is on a node exactly when its `nvidia.com/gpu` are MIG devices
/// (k8s-device-plugin `internal/lm/resource.go`, `newMigResourceLabeler`).
pub const LABEL_SINGLE_MIG_SLICES: &str = "nvidia.com/gpu.slices.gi";
pub const RESOURCE_GPU: &str = "nvidia.com/gpu";
/// What the device plugin advertises a shared GPU's replicas as under `renameByDefault: true`
/// (time-slicing or MPS); the product label then has no `-SHARED` suffix.
pub const RESOURCE_GPU_SHARED: &str = "nvidia.com/gpu.shared";

// GKE's own GPU labels. GKE runs its own device plugin (always `nvidia.com/gpu`, one unit per
// client of a shared GPU, one per MIG partition) and no GPU Feature Discovery.
// https://cloud.google.com/kubernetes-engine/docs/concepts/timesharing-gpus,
// https://cloud.google.com/kubernetes-engine/docs/how-to/gpus-multi (MIG),
// GoogleCloudPlatform/container-engine-accelerators pkg/gpu/nvidia (resource name, virtual devices).
/// `nvidia-l4`, `nvidia-h100-80gb`, ...
pub const LABEL_GKE_ACCELERATOR: &str = "cloud.google.com/gke-accelerator";
/// `time-sharing` or `mps` (auto-provisioned nodes may say `TIME_SHARING` / `MPS`).
pub const LABEL_GKE_SHARING: &str = "cloud.google.com/gke-gpu-sharing-strategy";
/// Clients per physical GPU (2-48); allocatable `nvidia.com/gpu` is GPUs times this.
pub const LABEL_GKE_CLIENTS: &str = "cloud.google.com/gke-max-shared-clients-per-gpu";
/// The MIG partition size of every GPU, e.g. `1g.5gb`; each partition is one `nvidia.com/gpu`.
pub const LABEL_GKE_PARTITION: &str = "cloud.google.com/gke-gpu-partition-size";
pub const MIG_RESOURCE_PREFIX: &str = "nvidia.com/mig-";

/// gpu-share's own node label: `per-gpu` asks gpu-share to share the node's plain GPUs per GPU
/// (the device plugin left unshared).
pub const LABEL_SHARING_MODE: &str = "gpu-share.io/sharing";
/// The one value of [`LABEL_SHARING_MODE`].
pub const PER_GPU: &str = "per-gpu";

/// Most GPUs one node is taken to have. The largest GPU nodes hold 8 (16 at most); a node that
/// advertises more is clamped to this (with a warning), so that per-GPU state stays small.
pub const MAX_GPUS_PER_NODE: u32 = 64;
/// Replicas per GPU assumed when bounding a shared pool: a node advertising more than
/// `MAX_GPUS_PER_NODE * MAX_REPLICAS_PER_GPU` units of its pool is clamped.
pub const MAX_REPLICAS_PER_GPU: u32 = 48;
/// MIG instances per GPU at most (seven 1g instances), for bounding MIG device counts.
pub const MAX_MIG_PER_GPU: u32 = 7;

/// Whether `v` is a valid Kubernetes label value: at most 63 characters of `[A-Za-z0-9._-]`,
/// beginning and ending with a letter or digit (or empty).
pub fn is_label_value(v: &str) -> bool {
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    v.is_empty()
        || (v.len() <= 63
            && alnum(v.chars().next())
            && alnum(v.chars().last())
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
}

/// NVIDIA's DRA driver for GPUs (`kubernetes-sigs/dra-driver-nvidia-gpu`): the driver name of its
/// ResourceSlices and claims' results, and the domain of its device attributes ([`crate::dra`]).
pub const DRA_DRIVER: &str = "gpu.nvidia.com";

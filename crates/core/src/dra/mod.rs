//! PURE: nodes whose GPUs NVIDIA's DRA driver publishes (`gpu.nvidia.com`, Dynamic Resource
//! Allocation) instead of a device plugin. Such a node has no GFD labels and no `nvidia.com/*`
//! allocatable: its GPUs are ResourceSlices, and a pod's GPUs are a ResourceClaim's allocation,
//! made by kube-scheduler's DRA plugin (for `nvidia.com/gpu` and `nvidia.com/mig-<profile>`
//! limits, through DeviceClasses that name them: KEP-5004). gpu-share chooses the node only;
//! DRA chooses the device within it (docs/platforms.md, "DRA").
//! - [`slice`]: the driver's ResourceSlices;
//! - [`node`]: one node's devices ([`DraNode`]), and the [`crate::inventory::GpuNode`] packed onto;
//! - [`claim`]: ResourceClaims, and the devices and pods of each;
//! - [`view`]: all of it ([`DraView`]): the nodes, the claims' holdings in the ledger, and the
//!   pods the claims stand for.

pub mod claim;
pub mod node;
pub mod slice;
pub mod view;

pub use claim::{Claim, ClaimedDevice, ResourceClaim};
pub use node::{DraDevice, DraNode, Kind};
pub use slice::ResourceSlice;
pub use view::DraView;

/// NVIDIA's DRA driver for GPUs.
pub use crate::nvidia::DRA_DRIVER as DRIVER;
/// The API group and version gpu-share reads slices and claims in.
pub const API_GROUP: &str = "resource.k8s.io";
pub const API_VERSION: &str = "v1";
/// The suffix of the DeviceClasses gpu-share ships, one per MIG profile: `mig-1g.10gb.gpu-share.io`.
pub const CLASS_SUFFIX: &str = "gpu-share.io";

/// gpu-share's DeviceClass for MIG profile `profile`: its name and CEL selector, and the
/// extended resource it maps (the device plugin's mixed-strategy name, so a MIG pod's limits
/// are the same on both kinds of node).
pub fn mig_device_class(profile: &str) -> (String, String, String) {
    let dotted = profile.replace('+', ".");
    (
        format!("mig-{dotted}.{CLASS_SUFFIX}"),
        format!(
            "device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'mig' && device.attributes['{DRIVER}'].profile == '{profile}'"
        ),
        crate::mig::resource_name(profile),
    )
}

#[cfg(test)]
mod tests;

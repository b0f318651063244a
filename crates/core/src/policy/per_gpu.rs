//! The policy file's `perGpu` section (PURE).

use serde::{Deserialize, Serialize};

use crate::request::GpuClass;

fn release_after_seconds() -> u32 {
    30
}

/// The policy file's `perGpu` section: sharing per GPU on plain nodes that opt in (node label
/// `gpu-share.io/sharing=per-gpu`, or `nodeModes` `sharing: per-gpu`), each shared GPU held by a
/// reservation pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PerGpuPolicy {
    /// `timeslice-<p>` pods take the per-GPU form (no device-plugin resource; pointed at the GPU
    /// gpu-share holds for them) and go to nodes shared per GPU only.
    #[serde(default)]
    pub timeslice: bool,
    /// `mps-<p>` pods take the per-GPU form too, each GPU served by an MPS daemon its
    /// reservation runs (pointed at through a CDI device of gpu-share's own), with unequal
    /// sizes on one GPU; they go to nodes shared per GPU only. Needs `mps.runAsUser`.
    #[serde(default)]
    pub mps: bool,
    /// `timeslice-<p>` pods in per-GPU form get their GPU through a CDI device their GPU's
    /// reservation writes (`gpu-share.io/gpu=<UUID>`, NVIDIA's own edits for the GPU, the
    /// Container Toolkit's memory-limit hook among them), under the policy's runtime class,
    /// instead of a bare UUID under the legacy runtime. The reservations then write the node's
    /// CDI directory (root, hostPath), so their namespace must allow privileged pods, as for
    /// `mps`; the nvidia runtime must read CDI names (CDI or auto mode).
    #[serde(default)]
    pub timeslice_cdi: bool,
    /// Seconds a reservation outlives the last share on its GPU, so that a GPU is not
    /// re-reserved for every pod that comes and goes.
    #[serde(default = "release_after_seconds")]
    pub release_after_seconds: u32,
}

impl Default for PerGpuPolicy {
    fn default() -> Self {
        PerGpuPolicy {
            timeslice: false,
            mps: false,
            timeslice_cdi: false,
            release_after_seconds: release_after_seconds(),
        }
    }
}

impl PerGpuPolicy {
    /// Whether pods of `class` take the per-GPU form.
    pub fn takes(&self, class: &GpuClass) -> bool {
        match class {
            GpuClass::Timeslice { .. } => self.timeslice,
            GpuClass::Mps { .. } => self.mps,
            _ => false,
        }
    }
}

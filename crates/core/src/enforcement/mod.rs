//! What holds a share to its budget inside the GPU, node by node (PURE).
//!
//! gpu-share packs shares by their budgets; NVIDIA's own mechanisms hold them there:
//! - **the driver's per-container memory limits** (r615 and later, `nvmlDeviceSetMemoryLimits`),
//!   which the NVIDIA Container Toolkit's CDI hook `apply-cuda-memory-limits` applies at container
//!   creation from `NVIDIA_GPU_MEMORY_REQUEST` and `NVIDIA_GPU_MEMORY_LIMIT` (MiB). Not for MIG
//!   devices. gpu-share reads the driver's version from GPU Feature Discovery's labels (or the
//!   policy's `nodeModes`); it cannot see the toolkit, so the hook is the policy's word
//!   (`enforcement.memoryLimitHook`): a guess would fail open, the hook skipping what it cannot do;
//! - **the device plugin's MPS** (equal split): every client of a replica is held to the GPU's
//!   memory over the replica count, and to 100 / replicas of its threads;
//! - for MIG devices and whole GPUs, the hardware.
//!
//! [`memory_hold`] says, for one node and one share, which holds the share's memory, or why
//! nothing does, in words. Under the policy's `enforcement.budgets: required`,
//! [`crate::packing::fit`] refuses a node that cannot hold a share; under `preferred` the bind
//! says on the pod what holds it ([`ANNOTATION_HELD_BY`]). This module imports nothing of the crate: the inventory, the policy and the
//! packing each hand it plain values.

mod hold;
mod model;
mod read;

pub use hold::{memory_hold, summary};
pub use model::*;
pub use read::{Declared, EnforcementReading, driver_major, read};

#[cfg(test)]
mod tests;

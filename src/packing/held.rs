//! What holds a demand's memory on a node ([`crate::enforcement::memory_hold`] over the
//! packing's own types).

use super::demand::GpuDemand;
use crate::enforcement::{Hold, Share};
use crate::inventory::GpuNode;

/// The share a demand is, as far as holding its memory goes.
pub fn share_of(gpu: &GpuDemand) -> Share {
    match gpu {
        GpuDemand::None | GpuDemand::Reserve { .. } => Share::Nothing,
        GpuDemand::Mig { .. } => Share::Mig,
        GpuDemand::Whole { .. } => Share::Whole,
        GpuDemand::Timeslice { memory_mib, .. } => Share::Timeslice {
            memory_mib: *memory_mib,
        },
        GpuDemand::Mps { memory_mib, .. } => Share::Mps {
            memory_mib: *memory_mib,
        },
        GpuDemand::Units { .. } => Share::Units,
    }
}

/// What holds `gpu`'s memory on `node`, or why nothing does.
pub fn memory_hold(node: &GpuNode, gpu: &GpuDemand) -> Hold {
    crate::enforcement::memory_hold(node.enforcement_facts(), share_of(gpu))
}

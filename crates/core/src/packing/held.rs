//! What holds a demand's memory on a node ([`crate::enforcement::memory_hold`] over the
//! packing's own types).

use super::demand::{Demand, GpuDemand};
use crate::enforcement::{Hold, Share};
use crate::inventory::GpuNode;

/// The share a demand is, as far as holding its memory goes: a share's budget is the limit its
/// container carries for the toolkit's hook ([`Demand::driver_limit_mib`]).
pub fn share_of(demand: &Demand) -> Share {
    let memory_mib = demand.driver_limit_mib;
    match demand.gpu {
        GpuDemand::None | GpuDemand::ReservationPod { .. } => Share::Nothing,
        GpuDemand::Mig { .. } => Share::Mig,
        GpuDemand::Whole { .. } => Share::Whole,
        GpuDemand::Timeslice { .. } => Share::Timeslice { memory_mib },
        GpuDemand::Mps { .. } => Share::Mps { memory_mib },
        GpuDemand::Units { .. } => Share::Units,
    }
}

/// What holds `demand`'s memory on `node`, or why nothing does.
pub fn memory_hold(node: &GpuNode, demand: &Demand) -> Hold {
    crate::enforcement::memory_hold(node.enforcement_facts(), share_of(demand))
}

//! Opening a GPU on a node gpu-share shares per GPU: the first share on a GPU brings the GPU's
//! reservation pod, whose CPU and memory the node must hold too (kubelet would refuse a
//! reservation its node cannot hold, and the share waiting on it would be evicted).

use super::demand::{Demand, GpuDemand};
use super::reason::Reason;
use super::usage::Usage;
use crate::inventory::{GpuNode, Sharing};

/// What a reservation pod asks of its node besides its GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReservationRequests {
    pub cpu_milli: u64,
    pub memory_mib: u64,
}

/// A time-sliced reservation's requests.
pub const PLAIN_RESERVATION: ReservationRequests = ReservationRequests {
    cpu_milli: 5,
    memory_mib: 16,
};
/// An MPS reservation's: it runs its GPU's MPS daemon.
pub const MPS_RESERVATION: ReservationRequests = ReservationRequests {
    cpu_milli: 20,
    memory_mib: 64,
};

/// The requests of a reservation that runs its GPU's MPS daemon (`mps`) or not.
pub fn reservation_requests(mps: bool) -> ReservationRequests {
    if mps {
        MPS_RESERVATION
    } else {
        PLAIN_RESERVATION
    }
}

/// Whether the node has room, besides `demand`, for the reservation pod a share in per-GPU form
/// brings to a GPU none holds yet (an MPS one, running the GPU's daemon, when `mps`).
pub fn reservation_room(node: &GpuNode, usage: &Usage, demand: &Demand, mps: bool) -> bool {
    let r = reservation_requests(mps);
    let holds = |cap: Option<u64>, used: u64, asked: u64, more: u64| {
        cap.is_none_or(|c| used.saturating_add(asked).saturating_add(more) <= c)
    };
    holds(
        node.cpu_milli,
        usage.cpu_milli,
        demand.cpu_milli,
        r.cpu_milli,
    ) && holds(
        node.memory_mib,
        usage.memory_mib,
        demand.memory_mib,
        r.memory_mib,
    )
}

/// A share in per-GPU form fits where the node holds the reservation it would bring, or where a
/// GPU a reservation holds already has room for it (of its class, with its CDI device where it
/// takes one). Else [`Reason::NoRoomForReservation`]. Other demands, and other nodes: `Ok`.
pub fn room_to_open(node: &GpuNode, usage: &Usage, demand: &Demand) -> Result<(), Reason> {
    if node.sharing != Sharing::PerGpu {
        return Ok(());
    }
    let (mps, milli, memory_mib) = match demand.gpu {
        GpuDemand::Timeslice { milli, memory_mib } => (false, milli, memory_mib),
        GpuDemand::Mps { milli, memory_mib } => (
            true,
            milli,
            super::demand::per_gpu_mps_memory(milli, memory_mib, node.gpu_memory_mib),
        ),
        _ => return Ok(()),
    };
    if reservation_room(node, usage, demand, mps)
        || (0..usage.gpu_milli.len()).any(|i| {
            usage.is_reserved(i)
                && (!demand.takes_cdi_device() || usage.serves_cdi_device(i))
                && usage.takes_share(i, mps, milli, memory_mib, node.gpu_memory_mib)
        })
    {
        Ok(())
    } else {
        Err(Reason::NoRoomForReservation)
    }
}

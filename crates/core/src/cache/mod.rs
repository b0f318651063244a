//! PURE: what the API shows of the cluster, kept as the extender decides over it: one entry per
//! object, fed by the watches through `apply`, `delete` and `reset` (a relist is one `reset`).
//!
//! - [`node`]: the nodes, each one [`NodeFacts`] read from its Node object in one place
//!   ([`NodeFacts::read`]): what a new fact of a node needs is a field there and its reading;
//! - [`pod`]: where each pod's bind stands, one [`PodEntry`] each (read in filter and kept for
//!   its bind, found no room, assumed until the API shows it, in doubt until a read back,
//!   changed by the watch lately).
//!
//! The ledger ([`crate::ledger`]) keeps each GPU node's inventory and what it holds, behind a lock
//! per node; [`NodeFacts::read`] reads the inventory with the facts (DRA's slices give the rest).

pub mod node;
pub mod pod;

pub use node::{NodeFacts, Nodes};
pub use pod::{
    Assumed, KUBE_SCHEDULER_SHORT, MEMO_BYTES, MEMO_TTL, NO_ROOM_TTL, NoRoom, PodEntry, Pods,
    UNSCHEDULED_CAP, Unscheduled, Wanting,
};

//! PURE: defragmentation's plan. When a pod waits because the free capacity is scattered (four
//! GPUs a quarter free each, and an `exclusive-1` pod waiting), moving a few shares makes room:
//! this module says which, and where each goes, with the packing that placed them.
//!
//! - [`model`]: what the planner reads ([`Site`]: a node, its usage, its residents, each
//!   [`Mobility`]: a reservation, a pod that may move, or one pinned and why), its [`Limits`],
//!   and what it answers: a [`Plan`], or [`NoPlan`] in words.
//! - [`room`]: what must leave one node for the pod to fit there, the fewest and cheapest, as
//!   the packing's own fit decides.
//! - [`search`]: the node where room is cheapest, and a target for each pod that moves, which
//!   the scorer picks among the nodes the move breaks no free GPU on.
//! - [`flight`]: a plan under way (`defrag.mode: on`): its moves' progress, how a moved pod's
//!   replacement is known, what the waiting pod's annotation records, and how a plan ends.
//! - [`mobility`]: whether a running pod may move, read from the pod (its controller, its
//!   `gpu-share.io/defrag` and `gpu-share.io/restart-cost` annotations, its phase) and the
//!   namespaces the policy opts in.
//!
//! Which pods may move (a controller's, opted in, not opted out, not of higher priority than the
//! waiting pod, past their workload's cooldown) is read into each resident's [`Mobility`]
//! ([`mobility::mobility`]); the priority rule is applied here, against the waiting pod's. The extender
//! holds each target and the freed room before anything is evicted; the simulator replays the
//! same plans.

pub mod flight;
pub mod mobility;
pub mod model;
pub mod room;
pub mod search;

pub use model::{
    Cost, Limits, Mobility, Movable, Move, NoPlan, Pinned, Plan, Resident, Site, Waiting,
};
pub use search::{Guest, plan};

#[cfg(test)]
mod tests;

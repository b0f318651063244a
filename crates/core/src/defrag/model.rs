//! PURE: what the planner reads (each node with what holds something there, and whether each
//! holding may move), what it is bounded by, and what it answers: a plan, or why there is none.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::inventory::GpuNode;
use crate::packing::{Demand, Placement, Usage};

/// One node as the planner reads it: its capacity, what is allocated there, and what holds it.
#[derive(Debug, Clone, Copy)]
pub struct Site<'a> {
    pub node: &'a GpuNode,
    pub usage: &'a Usage,
    pub residents: &'a [Resident],
}

/// One holding on a node: a pod, or gpu-share's reservation of one of its GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resident {
    /// Its key in the ledger (a pod's UID).
    pub id: String,
    /// `namespace/name`, for the words of a plan.
    pub key: String,
    pub demand: Demand,
    pub placement: Placement,
    pub mobility: Mobility,
}

/// Whether a holding may move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mobility {
    /// gpu-share's reservation of a GPU shared per GPU: never moved, released once no share is
    /// left on its GPU (the freed GPU is then free).
    Reservation,
    /// A pod a controller recreates, opted in.
    Movable(Movable),
    /// A pod that stays, and why.
    Pinned(Pinned),
}

/// What moving a pod costs, and whose it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Movable {
    /// Its priority (`spec.priority`): a pod of higher priority than the waiting one never
    /// moves for it.
    pub priority: i32,
    /// What a restart costs its workload, in moves (1 unless the workload says more): the plan
    /// with the least total is chosen.
    pub restart_cost: u32,
    /// Its workload (`namespace/Kind/name` of its controller): the cooldown is per workload, and
    /// its replacement is known by it.
    pub workload: String,
}

/// Why a pod stays where it is, in words a refusal can give.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pinned {
    /// No controller would recreate it (a bare pod, or one of a kind that is not a ReplicaSet,
    /// StatefulSet or Job).
    NoController,
    /// Neither its namespace nor its workload is opted in.
    NotOptedIn,
    /// It opts out (`gpu-share.io/defrag: never`).
    OptedOut,
    /// Its workload had a pod moved, or an eviction refused, less than the cooldown ago.
    CoolingDown,
    /// Not running as the API last showed it (pending a bind, in doubt, leaving), or held for a
    /// DRA claim or a reservation on its way: only settled pods move.
    Unsettled,
    /// Of higher priority than the waiting pod.
    HigherPriority,
}

impl Pinned {
    /// Every variant, in the order a refusal lists them.
    pub const ALL: [Pinned; 6] = [
        Pinned::NoController,
        Pinned::NotOptedIn,
        Pinned::OptedOut,
        Pinned::CoolingDown,
        Pinned::Unsettled,
        Pinned::HigherPriority,
    ];

    /// The words a refusal gives for pods pinned so.
    pub fn words(self) -> &'static str {
        match self {
            Pinned::NoController => "no controller would recreate them",
            Pinned::NotOptedIn => "neither their namespace nor their workload is opted in",
            Pinned::OptedOut => "they opt out",
            Pinned::CoolingDown => {
                "their workload had a pod moved, or an eviction refused, within the cooldown"
            }
            Pinned::Unsettled => "they are not settled on their node",
            Pinned::HigherPriority => "their priority is higher than the waiting pod's",
        }
    }
}

/// The bounds on one plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// At most this many moves for each GPU the waiting pod asks (a share asks one).
    pub moves_per_gpu: u32,
    /// On how many nodes the ways to make room are weighed, those the quick estimate ranks
    /// first ([`super::room::estimate`]).
    pub nodes_weighed: usize,
    /// How many of the cheapest ways to make room are tried for targets before giving up.
    pub rooms_tried: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            moves_per_gpu: 2,
            nodes_weighed: 32,
            rooms_tried: 16,
        }
    }
}

/// What the waiting pod asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting<'a> {
    pub demand: &'a Demand,
    pub priority: i32,
}

/// A plan's cost: the restart costs of the pods it moves, summed; then its highest priority
/// moved; then the number of moves. Lower is better, in that order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cost {
    pub restarts: u32,
    pub top_priority: i32,
    pub moves: u32,
}

/// One move: a pod evicted from `from`, its replacement held on `to`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Move {
    pub id: String,
    pub key: String,
    pub workload: String,
    pub from: String,
    pub to: String,
    pub demand: Demand,
    /// Where its replacement goes on `to`.
    pub placement: Placement,
}

/// Room made for a waiting pod: the moves, then the pod's node and placement there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// The waiting pod's node.
    pub node: String,
    /// Its placement there once the moves are done.
    pub placement: Placement,
    pub moves: Vec<Move>,
    /// Reservations on `node` released because no share is left on their GPU.
    pub releases: Vec<String>,
    pub cost: Cost,
}

/// The plan in words: "moving ns/a from node n0 to n1 and ns/b from node n0 to n2 makes room
/// on node n0".
impl std::fmt::Display for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let moves: Vec<String> = self
            .moves
            .iter()
            .map(|m| format!("{} from node {} to {}", m.key, m.from, m.to))
            .collect();
        if moves.is_empty() {
            write!(
                f,
                "releasing reservations left with no share makes room on node {}",
                self.node
            )?;
        } else {
            write!(
                f,
                "moving {} makes room on node {}",
                moves.join(" and "),
                self.node
            )?;
        }
        if !self.placement.gpus.is_empty() {
            let gpus: Vec<String> = self
                .placement
                .gpus
                .iter()
                .map(|(g, _)| g.to_string())
                .collect();
            write!(f, " (GPU {})", gpus.join(", "))?;
        }
        if !self.releases.is_empty() && !self.moves.is_empty() {
            write!(
                f,
                ", releasing {} reservation(s) left with no share",
                self.releases.len()
            )?;
        }
        Ok(())
    }
}

/// Why no plan makes room, counted over the nodes weighed.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NoPlan {
    /// A node takes the pod as things stand: nothing needs to move.
    pub fits: Option<String>,
    /// Nodes weighed: those the pod may go to, of its kind (it would fit one empty).
    pub nodes: usize,
    /// Nodes where moving every pod that may move would still leave no room, and the pods that
    /// stayed there, by why.
    pub no_room: usize,
    pub pinned: BTreeMap<Pinned, usize>,
    /// Nodes where room takes more moves than the limits allow, with the fewest any needed.
    pub over_limit: usize,
    pub fewest_moves: Option<u32>,
    pub limit: u32,
    /// Nodes where room could be made but a pod to move had nowhere to go that breaks no free
    /// GPU, with one such pod.
    pub no_target: usize,
    pub stranded: Option<String>,
}

impl NoPlan {
    /// The chief reason, as a metric labels it: `fits` (nothing needs to move), `no-node` (none
    /// of the pod's kind it may go to), `no-target` (a pod to move has nowhere to go),
    /// `over-limit` (room takes more moves than allowed), or `no-room` (the pods that may move
    /// leave too little).
    pub fn label(&self) -> &'static str {
        if self.fits.is_some() {
            "fits"
        } else if self.nodes == 0 {
            "no-node"
        } else if self.no_target > 0 {
            "no-target"
        } else if self.over_limit > 0 {
            "over-limit"
        } else {
            "no-room"
        }
    }
}

impl std::fmt::Display for NoPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(node) = &self.fits {
            return write!(
                f,
                "node {node} takes the pod as things stand; nothing needs to move"
            );
        }
        if self.nodes == 0 {
            return f.write_str("no node of the pod's kind that it may go to");
        }
        write!(
            f,
            "no moves make room on any of the {} node(s) of the pod's kind:",
            self.nodes
        )?;
        let mut sep = " ";
        if self.no_room > 0 {
            write!(
                f,
                "{sep}on {} the pods that may move leave too little room",
                self.no_room
            )?;
            let why: Vec<String> = Pinned::ALL
                .iter()
                .filter_map(|p| {
                    self.pinned
                        .get(p)
                        .map(|n| format!("{n} because {}", p.words()))
                })
                .collect();
            if !why.is_empty() {
                write!(f, " (pods staying: {})", why.join("; "))?;
            }
            sep = "; ";
        }
        if self.over_limit > 0 {
            write!(
                f,
                "{sep}on {} room takes more moves than the limit of {}",
                self.over_limit, self.limit
            )?;
            if let Some(n) = self.fewest_moves {
                write!(f, " (fewest: {n})")?;
            }
            sep = "; ";
        }
        if self.no_target > 0 {
            write!(
                f,
                "{sep}on {} a pod to move has no other node that takes it without breaking a free GPU",
                self.no_target
            )?;
            if let Some(p) = &self.stranded {
                write!(f, " (as {p})")?;
            }
        }
        Ok(())
    }
}

//! PURE: the plan for one waiting pod: the node where room is cheapest to make, and a target for
//! each pod that moves, chosen by the packing's scorer among the nodes the move breaks no free
//! GPU on.

use std::collections::HashMap;

use super::model::{Limits, Move, NoPlan, Plan, Resident, Site, Waiting};
use super::room::{self, NoRoom, Room};
use crate::inventory::Sharing;
use crate::packing::{self, Demand, FragMemo, GpuDemand, Placement, Scorer, Usage};

/// Who a node is asked to host: the waiting pod, or the replacement of a pod that moves.
#[derive(Debug, Clone, Copy)]
pub enum Guest<'a> {
    Waiting,
    Moved(&'a Resident),
}

/// Plans room for the waiting pod over `sites`. `may_host` says which nodes may take whom
/// (the pod's node constraints, cordons, nodes other plans use): the waiting pod goes only
/// where it may, and each moved pod's replacement likewise.
///
/// The ways to make room on each node ([`room::rooms`]) are ranked by cost; for the cheapest
/// [`Limits::rooms_tried`], each pod to move is given a target in turn, the largest first:
/// among the nodes other than the source that take it without breaking into a free GPU (a
/// share onto an empty GPU would be a new fragment), the one the scorer likes best, with the
/// moves before it counted there. The first room whose pods all find targets is the plan.
pub fn plan(
    scorer: &Scorer,
    sites: &[Site],
    waiting: &Waiting,
    limits: &Limits,
    may_host: impl Fn(Guest, &str) -> bool,
) -> Result<Plan, NoPlan> {
    // The plan's length is bounded per GPU freed; how many of its moves are under way at once
    // is the execution's to pace (`defrag.movesAtOnce`).
    let limit = limits
        .moves_per_gpu
        .saturating_mul(room::gpus_asked(&waiting.demand.gpu));
    let mut why = NoPlan {
        limit,
        ..NoPlan::default()
    };
    // The nodes the pod may go to, of its kind (it would fit one empty).
    let eligible: Vec<usize> = (0..sites.len())
        .filter(|i| {
            let node = sites[*i].node;
            may_host(Guest::Waiting, &node.name)
                && packing::fit(node, &Usage::empty(node), waiting.demand).is_ok()
        })
        .collect();
    why.nodes = eligible.len();
    if let Some(i) = eligible.iter().find(|i| {
        let s = &sites[**i];
        packing::fit(s.node, s.usage, waiting.demand).is_ok()
    }) {
        why.fits = Some(sites[*i].node.name.clone());
        return Err(why);
    }
    let refused = |why: &mut NoPlan, no: NoRoom| match no {
        NoRoom::Pinned(pinned) => {
            why.no_room += 1;
            for p in pinned {
                *why.pinned.entry(p).or_default() += 1;
            }
        }
        NoRoom::OverLimit(n) => {
            why.over_limit += 1;
            why.fewest_moves = Some(why.fewest_moves.map_or(n, |f| f.min(n)));
        }
    };
    // Every node ranked by its quick estimate; the ways to make room weighed on the most
    // promising.
    let mut promising: Vec<(u32, usize)> = Vec::new();
    for i in eligible {
        match room::estimate(&sites[i], waiting, limit) {
            Ok(k) => promising.push((k, i)),
            Err(no) => refused(&mut why, no),
        }
    }
    promising
        .sort_by(|(ka, a), (kb, b)| (ka, &sites[*a].node.name).cmp(&(kb, &sites[*b].node.name)));
    let mut rooms: Vec<(usize, Room)> = Vec::new();
    for (_, i) in promising.into_iter().take(limits.nodes_weighed.max(1)) {
        match room::rooms(scorer, &sites[i], waiting, limit) {
            Ok(found) => rooms.extend(found.into_iter().map(|r| (i, r))),
            Err(no) => refused(&mut why, no),
        }
    }
    rooms.sort_by(|(a, ra), (b, rb)| {
        (ra.cost, &sites[*a].node.name, &ra.moved).cmp(&(rb.cost, &sites[*b].node.name, &rb.moved))
    });
    let mut stranded_on: Vec<usize> = Vec::new();
    // Pods found with no target as the cluster stands: a room that moves one is not tried, nor
    // counted against the rooms tried.
    let mut nowhere: Vec<&str> = Vec::new();
    let mut tried = 0;
    for (source, room) in rooms {
        if tried == limits.rooms_tried.max(1) {
            break;
        }
        if room
            .moved
            .iter()
            .any(|k| nowhere.contains(&sites[source].residents[*k].id.as_str()))
        {
            if !stranded_on.contains(&source) {
                stranded_on.push(source);
            }
            continue;
        }
        tried += 1;
        match targets(scorer, sites, source, &room, &may_host) {
            Ok(moves) => {
                let site = &sites[source];
                return Ok(Plan {
                    node: site.node.name.clone(),
                    placement: room.placement,
                    moves,
                    releases: room
                        .released
                        .iter()
                        .map(|k| site.residents[*k].id.clone())
                        .collect(),
                    cost: room.cost,
                });
            }
            Err(Stranded { resident, alone }) => {
                if !stranded_on.contains(&source) {
                    stranded_on.push(source);
                }
                if alone {
                    nowhere.push(&resident.id);
                }
                why.stranded.get_or_insert_with(|| resident.key.clone());
            }
        }
    }
    why.no_target = stranded_on.len();
    Err(why)
}

/// A pod of a room with no target.
struct Stranded<'a> {
    resident: &'a Resident,
    /// Whether it has none as the cluster stands (no move of the room went before it): then it
    /// has none in any room.
    alone: bool,
}

/// A target for each pod `room` moves off `sites[source]`, the largest first, each counted
/// where it goes before the next is placed; or the first pod with none.
fn targets<'a>(
    scorer: &Scorer,
    sites: &[Site<'a>],
    source: usize,
    room: &Room,
    may_host: &impl Fn(Guest, &str) -> bool,
) -> Result<Vec<Move>, Stranded<'a>> {
    let from = &sites[source];
    let mut movers: Vec<&Resident> = room.moved.iter().map(|i| &from.residents[*i]).collect();
    movers.sort_by_key(|r| (std::cmp::Reverse(r.demand.gpu.milli()), r.id.clone()));
    // The usage of each node the moves so far went to.
    let mut changed: HashMap<usize, Usage> = HashMap::new();
    let mut moves = Vec::with_capacity(movers.len());
    for r in movers {
        let mut best: Option<(f64, usize, Placement)> = None;
        for (t, site) in sites.iter().enumerate() {
            if t == source || !may_host(Guest::Moved(r), &site.node.name) {
                continue;
            }
            let usage = changed.get(&t).unwrap_or(site.usage);
            if !room_in_use(site.node, usage, &r.demand)
                || packing::fit(site.node, usage, &r.demand).is_err()
            {
                continue;
            }
            let Ok((placement, score)) = packing::place(
                scorer,
                site.node,
                usage,
                &r.demand,
                &mut FragMemo::default(),
            ) else {
                continue;
            };
            if breaks_free_gpu(site.node.sharing, usage, &r.demand, &placement) {
                continue;
            }
            let better = match &best {
                None => true,
                Some((s, b, _)) => {
                    score > *s || (score == *s && site.node.name < sites[*b].node.name)
                }
            };
            if better {
                best = Some((score, t, placement));
            }
        }
        let Some((_, t, placement)) = best else {
            return Err(Stranded {
                resident: r,
                alone: moves.is_empty(),
            });
        };
        let usage = changed.entry(t).or_insert_with(|| sites[t].usage.clone());
        packing::apply(usage, &placement);
        moves.push(Move {
            id: r.id.clone(),
            key: r.key.clone(),
            workload: match &r.mobility {
                super::model::Mobility::Movable(m) => m.workload.clone(),
                _ => String::new(),
            },
            from: from.node.name.clone(),
            to: sites[t].node.name.clone(),
            demand: r.demand.clone(),
            placement,
        });
    }
    Ok(moves)
}

/// Whether a share could land on a GPU already in use on a node gpu-share shares per GPU (a
/// quick test before the packing's placement; true for every other demand and node).
fn room_in_use(node: &crate::inventory::GpuNode, usage: &Usage, demand: &Demand) -> bool {
    let (mps, milli, memory) = match &demand.gpu {
        GpuDemand::Timeslice { milli, memory_mib } => (false, *milli, *memory_mib),
        GpuDemand::Mps { milli, memory_mib } => (true, *milli, *memory_mib),
        _ => return true,
    };
    if node.sharing != Sharing::PerGpu {
        return true;
    }
    (0..usage.gpu_milli.len())
        .any(|g| !usage.is_free(g) && usage.takes_share(g, mps, milli, memory, node.gpu_memory_mib))
}

/// Whether placing `demand` at `placement` takes more free GPUs than it asks whole: a share
/// landing on an empty GPU leaves a new fragment behind. Only where a GPU is a unit pods ask
/// for whole (nodes gpu-share shares per GPU, plain nodes): on the device plugin's time-slicing
/// and MPS nodes every pod takes a replica, and the plugin, not the model, picks the GPU.
pub fn breaks_free_gpu(
    sharing: Sharing,
    usage: &Usage,
    demand: &Demand,
    placement: &Placement,
) -> bool {
    if !matches!(sharing, Sharing::PerGpu | Sharing::None) {
        return false;
    }
    let whole = match &demand.gpu {
        GpuDemand::Whole { count } => *count,
        GpuDemand::Units { count, .. } if sharing == Sharing::None => *count,
        _ => 0,
    };
    let before = usage.free_gpus();
    let mut after = usage.clone();
    packing::apply(&mut after, placement);
    before.saturating_sub(after.free_gpus()) > whole
}

//! PURE: what must leave one node for a waiting pod to fit there: the fewest and cheapest pods
//! that may move, and the reservations left with no share on their GPU.
//!
//! The packing's own [`packing::fit`] and [`packing::place`] decide whether the pod fits once
//! they are gone, so room is made in the packing's terms on every kind of node: a GPU emptied
//! for whole GPUs, a GPU's thousandths for a share, a MIG device, a node's time-slicing budget,
//! its CPU.

use super::model::{Cost, Mobility, Pinned, Resident, Site, Waiting};
use crate::packing::{self, FragMemo, GpuDemand, Placement, Scorer, Usage};

/// Room on one node: the residents to move and to release (indexes into the site's
/// residents), and the waiting pod's placement once they are gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Room {
    pub moved: Vec<usize>,
    pub released: Vec<usize>,
    pub placement: Placement,
    pub cost: Cost,
}

/// Why one node has no room to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoRoom {
    /// Moving every pod that may move leaves too little room; the pods that stay, by why.
    Pinned(Vec<Pinned>),
    /// Room takes this many moves, more than the limit.
    OverLimit(u32),
}

/// How many choices of GPUs to empty are weighed for whole GPUs on one node.
const WHOLE_CHOICES: usize = 8;

/// Why a resident stays for this waiting pod, if it does.
pub fn pinned_for(r: &Resident, waiting: &Waiting) -> Option<Pinned> {
    match &r.mobility {
        Mobility::Reservation => None,
        Mobility::Pinned(p) => Some(*p),
        Mobility::Movable(m) if m.priority > waiting.priority => Some(Pinned::HigherPriority),
        Mobility::Movable(_) => None,
    }
}

/// The GPUs a demand asks for, which the moves per GPU are counted against (a share asks one).
pub fn gpus_asked(demand: &GpuDemand) -> u32 {
    match demand {
        GpuDemand::Whole { count }
        | GpuDemand::Mig { count, .. }
        | GpuDemand::Units { count, .. } => (*count).max(1),
        _ => 1,
    }
}

/// The ways to make room on `site` within `limit` moves, cheapest first (at least one, or why
/// there is none): the residents whose leaving lets the waiting pod fit there, each set no
/// larger than the fit needs. Several orders of removal are tried (each GPU's residents,
/// largest first and smallest first; for whole GPUs, each choice of the GPUs cheapest to empty;
/// the same MIG profile's; the node's by CPU and by GPU, largest first), since the cheapest room may hold a pod
/// that has nowhere to go and another room a pod that has.
pub fn rooms(
    scorer: &Scorer,
    site: &Site,
    waiting: &Waiting,
    limit: u32,
) -> Result<Vec<Room>, NoRoom> {
    estimate(site, waiting, limit)?;
    let movable = movable(site, waiting);
    let release_idle = matches!(
        waiting.demand.gpu,
        GpuDemand::Whole { .. } | GpuDemand::Units { .. }
    );
    let mut found: Vec<Room> = Vec::new();
    let mut fewest_over: Option<u32> = None;
    for order in orders(site, waiting, &movable) {
        let Some(moved) = first_fit(site, waiting, &order, release_idle) else {
            continue;
        };
        let moved = cut_down(site, waiting, moved, release_idle);
        if found.iter().any(|r| r.moved == moved) {
            continue;
        }
        let n = moved.len() as u32;
        if n > limit {
            fewest_over = Some(fewest_over.map_or(n, |f| f.min(n)));
            continue;
        }
        let Some((released, placement)) = fits_without(scorer, site, waiting, &moved, release_idle)
        else {
            continue;
        };
        let cost = cost_of(site, &moved);
        found.push(Room {
            moved,
            released,
            placement,
            cost,
        });
    }
    if !found.is_empty() {
        found.sort_by(|a, b| (a.cost, &a.moved).cmp(&(b.cost, &b.moved)));
        return Ok(found);
    }
    match fewest_over {
        Some(n) => Err(NoRoom::OverLimit(n)),
        None => Err(NoRoom::Pinned(
            site.residents
                .iter()
                .filter_map(|r| pinned_for(r, waiting))
                .collect(),
        )),
    }
}

/// The fewest moves room on `site` can take by the per-GPU model (a lower bound, checked before
/// any fit), or why no `limit` of the movable residents can make room: for a share, the GPU
/// whose free thousandths reach the share's with the fewest of its movable shares, largest
/// first; for whole GPUs, the pods on the emptiest GPUs that only movable pods hold. Nodes whose
/// kind the model does not say so of (time-slicing and MPS nodes of the device plugin, which
/// count shares per node; MIG devices) are given `limit`. Quick: the planner ranks every node by
/// it and weighs the ways to make room on the most promising only.
pub fn estimate(site: &Site, waiting: &Waiting, limit: u32) -> Result<u32, NoRoom> {
    use crate::inventory::Sharing;
    if !matches!(site.node.sharing, Sharing::PerGpu | Sharing::None) {
        return Ok(limit);
    }
    let movable: Vec<usize> = movable(site, waiting);
    let pinned = || {
        NoRoom::Pinned(
            site.residents
                .iter()
                .filter_map(|r| pinned_for(r, waiting))
                .collect(),
        )
    };
    let on_gpu = |g: u32| {
        movable.iter().filter_map(move |i| {
            let p = &site.residents[*i].placement;
            p.gpus.iter().find(|(j, _)| *j == g).map(|(_, m)| *m)
        })
    };
    let fewest = match &waiting.demand.gpu {
        GpuDemand::Timeslice { milli, .. } | GpuDemand::Mps { milli, .. } => {
            // Per GPU, the fewest of its movable shares (largest first) that leave room.
            (0..site.node.gpus)
                .filter_map(|g| {
                    let used = site.usage.gpu_milli.get(g as usize).copied().unwrap_or(0);
                    let mut free = 1000u32.saturating_sub(used);
                    let mut mine: Vec<u32> = on_gpu(g).collect();
                    mine.sort_unstable_by(|a, b| b.cmp(a));
                    let mut k = 0u32;
                    for m in mine {
                        if free >= *milli {
                            break;
                        }
                        free += m;
                        k += 1;
                    }
                    (free >= *milli).then_some(k)
                })
                .min()
                .ok_or_else(pinned)?
        }
        GpuDemand::Whole { count } => {
            let mut pods: Vec<u32> = (0..site.node.gpus)
                .filter(|g| !pinned_on(site, waiting, *g))
                .map(|g| on_gpu(g).count() as u32)
                .collect();
            pods.sort_unstable();
            if pods.len() < *count as usize {
                return Err(pinned());
            }
            pods.iter().take(*count as usize).sum()
        }
        _ => return Ok(limit),
    };
    // The node's CPU and memory count too: a pod is refused beside a free GPU when they lack.
    let fewest = fewest
        .max(
            fewest_freeing(
                site,
                waiting,
                &movable,
                |d| d.cpu_milli,
                site.node.cpu_milli,
                site.usage.cpu_milli,
            )
            .ok_or_else(pinned)?,
        )
        .max(
            fewest_freeing(
                site,
                waiting,
                &movable,
                |d| d.memory_mib,
                site.node.memory_mib,
                site.usage.memory_mib,
            )
            .ok_or_else(pinned)?,
        );
    if fewest > limit {
        return Err(NoRoom::OverLimit(fewest));
    }
    Ok(fewest)
}

/// The fewest movable residents (the largest first) whose leaving frees what the waiting pod
/// lacks of one of the node's resources (CPU or memory, read by `amount`; `capacity` `None`
/// where the node does not account it), or `None` if all of them do not free enough. The
/// reservations' part counts as freed: one may be released with its last share.
fn fewest_freeing(
    site: &Site,
    waiting: &Waiting,
    movable: &[usize],
    amount: impl Fn(&crate::packing::Demand) -> u64,
    capacity: Option<u64>,
    used: u64,
) -> Option<u32> {
    let Some(capacity) = capacity else {
        return Some(0);
    };
    let reserved: u64 = site
        .residents
        .iter()
        .filter(|r| r.mobility == Mobility::Reservation)
        .map(|r| amount(&r.demand))
        .sum();
    let mut lacking =
        (used.saturating_sub(reserved) + amount(waiting.demand)).saturating_sub(capacity);
    let mut theirs: Vec<u64> = movable
        .iter()
        .map(|i| amount(&site.residents[*i].demand))
        .collect();
    theirs.sort_unstable_by(|a, b| b.cmp(a));
    let mut k = 0u32;
    for a in theirs {
        if lacking == 0 {
            break;
        }
        lacking = lacking.saturating_sub(a);
        k += 1;
    }
    (lacking == 0).then_some(k)
}

/// The residents that may move for the waiting pod.
fn movable(site: &Site, waiting: &Waiting) -> Vec<usize> {
    (0..site.residents.len())
        .filter(|i| {
            let r = &site.residents[*i];
            r.mobility != Mobility::Reservation && pinned_for(r, waiting).is_none()
        })
        .collect()
}

/// The orders of removal tried: per GPU (for demands the per-GPU model places), the residents
/// on it, largest share of it first; for a MIG device, the residents of its profile first; and
/// the whole node's, largest first. Only residents that may move are in them.
fn orders(site: &Site, waiting: &Waiting, movable: &[usize]) -> Vec<Vec<usize>> {
    let size = |i: &usize| site.residents[*i].demand.gpu.milli();
    let mut by_size = movable.to_vec();
    by_size.sort_by_key(|i| {
        (
            std::cmp::Reverse(size(i)),
            cost_key(&site.residents[*i]),
            *i,
        )
    });
    let mut orders = Vec::new();
    let on_gpu = |g: u32| -> Vec<usize> {
        let mut v: Vec<(u32, usize)> = movable
            .iter()
            .filter_map(|i| {
                let p = &site.residents[*i].placement;
                p.gpus.iter().find(|(j, _)| *j == g).map(|(_, m)| (*m, *i))
            })
            .collect();
        v.sort_by_key(|(m, i)| (std::cmp::Reverse(*m), cost_key(&site.residents[*i]), *i));
        v.into_iter().map(|(_, i)| i).collect()
    };
    match &waiting.demand.gpu {
        GpuDemand::Timeslice { .. } | GpuDemand::Mps { .. } => {
            for g in 0..site.node.gpus {
                let v = on_gpu(g);
                if !v.is_empty() {
                    let mut smallest_first = v.clone();
                    smallest_first.reverse();
                    orders.push(v);
                    orders.push(smallest_first);
                }
            }
        }
        GpuDemand::Whole { count } => {
            // The GPUs no pinned holder is on, cheapest to empty first; each run of `count` of
            // them (up to [`WHOLE_CHOICES`]), emptied together.
            let mut gpus: Vec<(u32, usize, u32)> = (0..site.node.gpus)
                .filter(|g| !pinned_on(site, waiting, *g))
                .map(|g| {
                    let v = on_gpu(g);
                    let c: u32 = v.iter().map(|i| restart_cost(&site.residents[*i])).sum();
                    (c, v.len(), g)
                })
                .collect();
            gpus.sort();
            let count = (*count as usize).max(1);
            for w in gpus.windows(count).take(WHOLE_CHOICES) {
                let chosen: Vec<usize> = w.iter().flat_map(|(_, _, g)| on_gpu(*g)).collect();
                if !chosen.is_empty() {
                    orders.push(chosen);
                }
            }
        }
        GpuDemand::Mig { profile, .. } => {
            let mut same: Vec<usize> = by_size
                .iter()
                .copied()
                .filter(|i| {
                    site.residents[*i]
                        .placement
                        .mig
                        .as_ref()
                        .is_some_and(|(p, _)| p == profile)
                })
                .collect();
            let rest: Vec<usize> = by_size
                .iter()
                .copied()
                .filter(|i| !same.contains(i))
                .collect();
            same.extend(rest);
            orders.push(same);
        }
        _ => {}
    }
    // The node's CPU, largest first: a pod may be refused for CPU beside a free GPU. Once with
    // the pods that take no GPU first (they go wherever CPU is left, where a share needs room
    // on a GPU in use and an exclusive pod a free GPU with the CPU this one lacks), once not.
    if waiting.demand.cpu_milli > 0 || waiting.demand.memory_mib > 0 {
        let by_cpu = |no_gpu_first: bool| {
            let mut v = movable.to_vec();
            v.sort_by_key(|i| {
                let r = &site.residents[*i];
                (
                    no_gpu_first && r.demand.gpu.milli() > 0,
                    std::cmp::Reverse((r.demand.cpu_milli, r.demand.memory_mib)),
                    cost_key(r),
                    *i,
                )
            });
            v
        };
        orders.push(by_cpu(true));
        orders.push(by_cpu(false));
    }
    orders.push(by_size);
    orders.dedup();
    orders
}

/// Whether a resident that stays holds part of GPU `g`.
fn pinned_on(site: &Site, waiting: &Waiting, g: u32) -> bool {
    site.residents
        .iter()
        .any(|r| pinned_for(r, waiting).is_some() && r.placement.gpus.iter().any(|(j, _)| *j == g))
}

/// Removes the residents of `order` one by one until the waiting pod fits; the prefix removed,
/// or `None` if it never fits. The fit alone is checked here (the scorer's placement, dearer,
/// once the set is final).
fn first_fit(
    site: &Site,
    waiting: &Waiting,
    order: &[usize],
    release_idle: bool,
) -> Option<Vec<usize>> {
    (0..=order.len())
        .find(|k| fits(site, waiting, &order[..*k], release_idle))
        .map(|k| order[..k].to_vec())
}

/// Whether the waiting pod passes the packing's fit once `moved` are gone.
fn fits(site: &Site, waiting: &Waiting, moved: &[usize], release_idle: bool) -> bool {
    let (usage, _) = usage_without(site, moved, release_idle);
    packing::fit(site.node, &usage, waiting.demand).is_ok()
}

/// Drops from `moved` each resident the fit does not need, the costliest first.
fn cut_down(
    site: &Site,
    waiting: &Waiting,
    mut moved: Vec<usize>,
    release_idle: bool,
) -> Vec<usize> {
    let mut by_cost = moved.clone();
    by_cost.sort_by_key(|i| std::cmp::Reverse((cost_key(&site.residents[*i]), *i)));
    for i in by_cost {
        let rest: Vec<usize> = moved.iter().copied().filter(|j| *j != i).collect();
        if fits(site, waiting, &rest, release_idle) {
            moved = rest;
        }
    }
    moved.sort_unstable();
    moved
}

/// The site's usage without the residents `moved`, and without the reservations left with no
/// share on their GPU (those whose GPU lost a share to the moves; with `release_idle`, also
/// those idle already): the usage and the reservations released.
pub fn usage_without(site: &Site, moved: &[usize], release_idle: bool) -> (Usage, Vec<usize>) {
    let mut usage = site.usage.clone();
    for i in moved {
        packing::unapply(&mut usage, &site.residents[*i].placement);
    }
    let on = |i: usize, g: u32| {
        site.residents[i]
            .placement
            .gpus
            .iter()
            .any(|(j, _)| *j == g)
    };
    let mut released = Vec::new();
    for (k, r) in site.residents.iter().enumerate() {
        let (Mobility::Reservation, Some(g)) = (&r.mobility, r.placement.reserve) else {
            continue;
        };
        let shares_left = (0..site.residents.len()).any(|i| {
            !moved.contains(&i) && site.residents[i].mobility != Mobility::Reservation && on(i, g)
        });
        let lost_one = moved.iter().any(|i| on(*i, g));
        if !shares_left && (lost_one || release_idle) {
            packing::unapply(&mut usage, &r.placement);
            released.push(k);
        }
    }
    (usage, released)
}

/// Whether the waiting pod fits once `moved` are gone: the reservations released and its
/// placement.
fn fits_without(
    scorer: &Scorer,
    site: &Site,
    waiting: &Waiting,
    moved: &[usize],
    release_idle: bool,
) -> Option<(Vec<usize>, Placement)> {
    let (usage, released) = usage_without(site, moved, release_idle);
    packing::place(
        scorer,
        site.node,
        &usage,
        waiting.demand,
        &mut FragMemo::default(),
    )
    .ok()
    .map(|(p, _)| (released, p))
}

fn restart_cost(r: &Resident) -> u32 {
    match &r.mobility {
        Mobility::Movable(m) => m.restart_cost.max(1),
        _ => 0,
    }
}

/// A resident's place in the cost order: restart cost, then priority.
fn cost_key(r: &Resident) -> (u32, i32) {
    match &r.mobility {
        Mobility::Movable(m) => (m.restart_cost.max(1), m.priority),
        _ => (0, i32::MIN),
    }
}

/// What moving `moved` costs.
pub fn cost_of(site: &Site, moved: &[usize]) -> Cost {
    let mut cost = Cost {
        restarts: 0,
        top_priority: i32::MIN,
        moves: moved.len() as u32,
    };
    for i in moved {
        let r = &site.residents[*i];
        cost.restarts += restart_cost(r);
        if let Mobility::Movable(m) = &r.mobility {
            cost.top_priority = cost.top_priority.max(m.priority);
        }
    }
    if moved.is_empty() {
        cost.top_priority = 0;
    }
    cost
}

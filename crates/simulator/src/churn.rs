//! PURE: a replay with departures. FGD's replay only adds pods; a cluster's pods also leave,
//! and what they leave behind is scattered. Here one pod arrives per step, in the seed's order
//! of the trace (cycled), and lives a number of steps drawn at its arrival (exponential, the same
//! draw under every mode), so that the cluster is offered `load` of its GPUs on average
//! (Little's law: the mean lifetime is `load` x capacity / the mean GPU per pod). A pod that fits
//! nowhere waits, retried every step after the departures, oldest first, and gives up after
//! `patience` steps.
//!
//! Each seed runs twice on the same arrivals and lifetimes, without moves and with them
//! (`defrag`: a refused pod, on arrival and on every retry, is given a plan,
//! [`super::residents::Residents::make_room`]). Counted over the steps after `warmup`:
//! the pods refused on arrival; of those, the ones an offline repack of the same moment would
//! place ([`repack_places`]: best-fit decreasing of every running pod and the refused one, from an
//! empty cluster; the bound), which are the pods that waited for fragmentation; how many of those
//! the moves placed at once; the moves per freed GPU; and the GPUs left unallocated, as a mean
//! over the steps.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::replay::{Order, WorkloadSource, reservation_demand, with_reservations};
use super::residents::{Moved, Residents};
use super::trace::{TracePod, node_capacity_milli};
use crate::defrag::Limits;
use crate::inventory::GpuNode;
use crate::packing::{self, Demand, FragMemo, Homes, OnlineWorkload, PackingPolicy, Scorer, Usage};

/// How the replay with departures runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Churn {
    /// The GPUs offered, as a share of the cluster's (1.0: as many as it has, on average).
    pub load: f64,
    /// Steps before counting starts (the cluster fills and settles).
    pub warmup: usize,
    /// Steps counted.
    pub steps: usize,
    /// Steps a refused pod waits before it gives up.
    pub patience: usize,
    /// Weigh each refusal against the offline repack of its moment (a best-fit decreasing of
    /// every running pod per refusal: the dear part).
    pub bound: bool,
}

impl Default for Churn {
    fn default() -> Self {
        Churn {
            load: 1.0,
            warmup: 20_000,
            steps: 10_000,
            patience: 100,
            bound: true,
        }
    }
}

/// One run's counts, over the counted steps.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChurnOutcome {
    pub seed: u64,
    pub arrived: u64,
    /// Refused on arrival (by the packing; with moves, before any plan).
    pub refused: u64,
    /// Of those, the ones the offline repack of that moment places (with [`Churn::bound`]).
    pub fragmented: u64,
    /// Refused on arrival and placed at once by moves.
    pub placed_by_moves: u64,
    /// Of [`Self::placed_by_moves`], those the repack places too.
    pub fragmented_placed_by_moves: u64,
    /// Placed after waiting (a retry found room, with or without moves).
    pub placed_later: u64,
    /// Gave up after the patience.
    pub gave_up: u64,
    /// What the moves did (every plan, on arrival and on retries).
    pub moved: Moved,
    /// GPUs left unallocated, % of the cluster's, mean over the counted steps.
    pub unallocated_pct: f64,
}

/// A pod waiting for room.
struct Waiter {
    pod: usize,
    since: usize,
    /// The departures counted when it last tried: only a node a pod left since can take it
    /// now (placements only fill nodes).
    tried: u64,
    /// When it was last given a plan.
    planned: usize,
}

/// What one replay with departures runs on.
#[derive(Clone, Copy)]
pub struct Replay<'a> {
    pub nodes: &'a [GpuNode],
    pub pods: &'a [TracePod],
    pub order: &'a Order,
    pub policy: PackingPolicy,
    pub source: &'a WorkloadSource,
    pub seed: u64,
}

/// The cluster as a replay with departures changes it: each node's usage, its fragmentation
/// memo, and who holds what.
struct Cluster<'a> {
    nodes: &'a [GpuNode],
    usages: Vec<Usage>,
    /// Each node's fragmentation before a placement (keyed by its usage, so never stale).
    memos: Vec<FragMemo>,
    residents: Residents,
    reservation: Demand,
}

impl Cluster<'_> {
    /// Places `demand` on the node of `candidates` the scorer likes best (ties to the first, the
    /// candidates in the seed's node order, as the replay breaks them), with the reservations it
    /// opens: its id, or `None` when none takes it.
    fn place_best(
        &mut self,
        scorer: &Scorer,
        pod: usize,
        demand: &Demand,
        candidates: &[usize],
    ) -> Option<String> {
        let mut best: Option<(usize, packing::Placement, f64)> = None;
        for &i in candidates {
            let node = &self.nodes[i];
            let Ok((p, s)) =
                packing::place(scorer, node, &self.usages[i], demand, &mut self.memos[i])
            else {
                continue;
            };
            if best.as_ref().is_none_or(|(_, _, b)| s > *b) {
                best = Some((i, p, s));
            }
        }
        let (i, p, _) = best?;
        let opened = with_reservations(&self.nodes[i], &mut self.usages[i], &p, &self.reservation)?;
        Some(self.residents.placed(i, pod, demand, &p, &opened))
    }

    /// Places `demand` where a plan's moves make room: its id.
    fn make_room(&mut self, scorer: &Scorer, pod: usize, demand: &Demand) -> Option<String> {
        let reservation = &self.reservation;
        let place = |n: &GpuNode, u: &mut Usage, p: &packing::Placement| {
            with_reservations(n, u, p, reservation)
        };
        self.residents
            .make_room(scorer, self.nodes, &mut self.usages, pod, demand, &place)
            .map(|(_, id)| id)
    }
}

/// Runs one seed's replay with departures, without moves (`defrag: None`) or with them.
pub fn run(replay: &Replay, churn: &Churn, defrag: Option<Limits>) -> ChurnOutcome {
    let Replay {
        nodes,
        pods,
        order,
        policy,
        source,
        seed,
    } = *replay;
    let capacity: u64 = nodes.iter().map(node_capacity_milli).sum();
    let arrivals = churn.warmup + churn.steps;
    let cycle = &order.pods;
    let mean_gpu = cycle
        .iter()
        .map(|i| pods[*i].gpu_milli() as f64)
        .sum::<f64>()
        / cycle.len().max(1) as f64;
    let mean_life = if mean_gpu > 0.0 {
        churn.load * capacity as f64 / mean_gpu
    } else {
        1.0
    };
    // Lifetimes drawn from their own stream, the same under every mode.
    let mut life_rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6c69_6665);
    let lives: Vec<usize> = (0..arrivals)
        .map(|_| {
            let u: f64 = life_rng.random_range(f64::EPSILON..1.0);
            ((-u.ln() * mean_life).ceil() as usize).max(1)
        })
        .collect();

    let mut scorer = match source {
        WorkloadSource::Fixed(w) => Scorer::with_workload(policy, w.clone()),
        _ => Scorer::new(policy),
    };
    scorer.seed = seed;
    let mut online = OnlineWorkload::default();
    let homes = Homes::of(nodes);
    let mut cluster = Cluster {
        nodes,
        usages: nodes.iter().map(Usage::empty).collect(),
        memos: vec![FragMemo::default(); nodes.len()],
        residents: Residents::new(nodes.len(), defrag.unwrap_or_default()),
        reservation: reservation_demand(),
    };
    let mut ends: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    let mut queue: VecDeque<Waiter> = VecDeque::new();
    let mut out = ChurnOutcome {
        seed,
        ..ChurnOutcome::default()
    };
    let mut unallocated_sum = 0.0;
    let mut allocated: u64 = 0;
    let mut sizes: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    // Departures so far, and the count at each node's last departure.
    let mut departures: u64 = 0;
    let mut left_at: Vec<u64> = vec![0; nodes.len()];
    // A waiting pod is given a plan again this often (a plan weighs every node).
    let replan = (churn.patience / 4).max(1);

    for step in 0..arrivals {
        let counting = step >= churn.warmup;
        // Departures due now.
        if let Some(ids) = ends.remove(&step) {
            for id in ids {
                if let Some(n) = cluster.residents.depart(&id, nodes, &mut cluster.usages) {
                    allocated -= sizes.remove(&id).unwrap_or(0);
                    departures += 1;
                    left_at[n] = departures;
                }
            }
        }
        // The waiting pods, oldest first.
        let mut still = VecDeque::with_capacity(queue.len());
        while let Some(mut w) = queue.pop_front() {
            let demand = &pods[w.pod].demand;
            let mut placed = None;
            if w.tried < departures {
                let changed: Vec<usize> =
                    (0..nodes.len()).filter(|n| left_at[*n] > w.tried).collect();
                w.tried = departures;
                placed = cluster.place_best(&scorer, w.pod, demand, &changed);
            }
            if placed.is_none() && defrag.is_some() && step - w.planned >= replan {
                w.planned = step;
                placed = cluster.make_room(&scorer, w.pod, demand);
            }
            match placed {
                Some(id) => {
                    let size = pods[w.pod].gpu_milli();
                    allocated += size;
                    sizes.insert(id.clone(), size);
                    ends.entry(step + lives[w.since]).or_default().push(id);
                    if w.since >= churn.warmup {
                        out.placed_later += 1;
                    }
                }
                None if step - w.since >= churn.patience => {
                    if w.since >= churn.warmup {
                        out.gave_up += 1;
                    }
                }
                None => still.push_back(w),
            }
        }
        queue = still;
        // The arrival.
        let pi = cycle[step % cycle.len()];
        let demand = &pods[pi].demand;
        if let WorkloadSource::Online = source
            && online.observe(demand)
        {
            scorer = Scorer {
                seed,
                ..Scorer::with_workload(policy, Arc::new(online.target(&homes)))
            };
        }
        if counting {
            out.arrived += 1;
        }
        let mut placed = cluster.place_best(&scorer, pi, demand, &order.nodes);
        if placed.is_none() {
            let fragmented = counting
                && churn.bound
                && repack_places(nodes, cluster.residents.running(), demand);
            if counting {
                out.refused += 1;
                out.fragmented += u64::from(fragmented);
            }
            if defrag.is_some() {
                placed = cluster.make_room(&scorer, pi, demand);
                if counting && placed.is_some() {
                    out.placed_by_moves += 1;
                    out.fragmented_placed_by_moves += u64::from(fragmented);
                }
            }
        }
        match placed {
            Some(id) => {
                let size = pods[pi].gpu_milli();
                allocated += size;
                sizes.insert(id.clone(), size);
                ends.entry(step + lives[step]).or_default().push(id);
            }
            None => queue.push_back(Waiter {
                pod: pi,
                since: step,
                tried: departures,
                planned: step,
            }),
        }
        if counting {
            unallocated_sum +=
                100.0 * capacity.saturating_sub(allocated) as f64 / capacity.max(1) as f64;
        }
    }
    out.moved = cluster.residents.moved;
    out.unallocated_pct = unallocated_sum / churn.steps.max(1) as f64;
    out
}

/// The offline repack of a moment: whether best-fit decreasing places every pod of `running`
/// and `extra` on the empty nodes (largest GPU ask first, then CPU; each on the node it leaves
/// the least GPU free on, by the packing's own fit). A bound in practice, not in theory (bin
/// packing is hard, and best-fit decreasing may fail where an order found by chance did not).
pub fn repack_places<'a>(
    nodes: &[GpuNode],
    running: impl Iterator<Item = &'a Demand>,
    extra: &Demand,
) -> bool {
    let mut items: Vec<&Demand> = running.collect();
    items.push(extra);
    items.sort_by_key(|d| {
        std::cmp::Reverse((
            d.gpu.per_gpu().0 as u64 * u64::from(d.gpu.per_gpu().1),
            d.cpu_milli,
        ))
    });
    let reservation = reservation_demand();
    let mut usages: Vec<Usage> = nodes.iter().map(Usage::empty).collect();
    let best_fit = Scorer::new(PackingPolicy::BestFit);
    for d in items {
        let want = d.gpu.milli();
        let mut best: Option<(usize, packing::Placement, f64)> = None;
        for (i, node) in nodes.iter().enumerate() {
            // Quick: GPU and CPU left, before the packing's fit.
            let free = node_capacity_milli(node).saturating_sub(usages[i].allocated_milli());
            if free < want
                || node
                    .cpu_milli
                    .is_some_and(|c| usages[i].cpu_milli + d.cpu_milli > c)
            {
                continue;
            }
            let Ok((p, s)) =
                packing::place(&best_fit, node, &usages[i], d, &mut FragMemo::default())
            else {
                continue;
            };
            if best.as_ref().is_none_or(|(_, _, b)| s > *b) {
                best = Some((i, p, s));
            }
        }
        let Some((i, p, _)) = best else {
            return false;
        };
        if with_reservations(&nodes[i], &mut usages[i], &p, &reservation).is_none() {
            return false;
        }
    }
    true
}

/// One policy's runs with departures, without moves and with them, over the seeds.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChurnReport {
    pub policy: String,
    pub churn: ChurnSettings,
    /// Per seed, without moves.
    pub without: Vec<ChurnOutcome>,
    /// Per seed, with moves (the same arrivals and lifetimes).
    pub with: Vec<ChurnOutcome>,
}

/// [`Churn`] and the limits, as the report gives them.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChurnSettings {
    pub load: f64,
    pub warmup: usize,
    pub steps: usize,
    pub patience: usize,
    pub moves_per_gpu: u32,
}

impl ChurnReport {
    /// Of the pods that waited for fragmentation (refused, and placed by the repack), the share
    /// the moves placed at once, all seeds together; `None` when none waited so.
    pub fn share_of_bound(&self) -> Option<f64> {
        let fragmented: u64 = self.with.iter().map(|o| o.fragmented).sum();
        let placed: u64 = self.with.iter().map(|o| o.fragmented_placed_by_moves).sum();
        (fragmented > 0).then(|| placed as f64 / fragmented as f64)
    }

    /// Moves per GPU freed, all seeds together; `None` when nothing was freed.
    pub fn moves_per_gpu(&self) -> Option<f64> {
        let moves: u64 = self.with.iter().map(|o| o.moved.moves).sum();
        let freed: u64 = self.with.iter().map(|o| o.moved.gpus_freed).sum();
        (freed > 0).then(|| moves as f64 / freed as f64)
    }
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 { f64::NAN } else { s / n as f64 }
}

/// The report's table, one block per policy.
pub fn table(reports: &[ChurnReport], seeds: &[u64]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for r in reports {
        let c = &r.churn;
        let _ = writeln!(
            out,
            "{}: with departures, load {}, {} steps counted after {} (one arrival per step), a refused pod waits {} steps; moves: at most {} per GPU asked; seeds {}",
            r.policy,
            c.load,
            c.steps,
            c.warmup,
            c.patience,
            c.moves_per_gpu,
            super::report::seeds_text(seeds)
        );
        let _ = writeln!(
            out,
            "  {:<14} {:>9} {:>11} {:>12} {:>12} {:>8} {:>10}",
            "", "refused", "fragmented", "placed now", "placed later", "gave up", "unalloc%"
        );
        for (label, runs) in [("without moves", &r.without), ("with moves", &r.with)] {
            let m = |f: fn(&ChurnOutcome) -> f64| mean(runs.iter().map(f));
            let _ = writeln!(
                out,
                "  {:<14} {:>9.1} {:>11.1} {:>12.1} {:>12.1} {:>8.1} {:>10.2}",
                label,
                m(|o| o.refused as f64),
                m(|o| o.fragmented as f64),
                m(|o| o.placed_by_moves as f64),
                m(|o| o.placed_later as f64),
                m(|o| o.gave_up as f64),
                m(|o| o.unallocated_pct),
            );
        }
        let share = r
            .share_of_bound()
            .map_or_else(|| "-".to_string(), |s| format!("{:.1}%", 100.0 * s));
        let per_gpu = r
            .moves_per_gpu()
            .map_or_else(|| "-".to_string(), |m| format!("{m:.2}"));
        let _ = writeln!(
            out,
            "  of the pods that waited for fragmentation (the repack places them), the moves placed {share} at once; {per_gpu} moves per GPU freed"
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packing::GpuDemand;
    use crate::replay::tests::per_gpu_nodes as nodes;

    fn share(pct: u32) -> Demand {
        Demand::gpu(GpuDemand::Timeslice {
            milli: pct * 10,
            memory_mib: None,
        })
    }

    fn whole() -> Demand {
        Demand::gpu(GpuDemand::Whole { count: 1 })
    }

    #[test]
    fn the_repack_places_what_fits_in_some_order() {
        let n = nodes(2);
        // Two 30% shares and an exclusive pod: the exclusive pod on one GPU, the shares on the
        // other.
        assert!(repack_places(&n, [share(30), share(30)].iter(), &whole()));
        // Two 60% shares take both GPUs whatever the order.
        assert!(!repack_places(&n, [share(60), share(60)].iter(), &whole()));
    }

    /// A small cluster spread (the `spread` policy scatters shares on purpose), with departures:
    /// with moves, fewer pods give up, the moves place pods the repack places too, and every
    /// count stays within the ones it is a part of.
    #[test]
    fn moves_place_what_scattered_shares_refuse() {
        let n = nodes(8);
        let pods: Vec<TracePod> = [share(30), share(30), share(20), whole()]
            .into_iter()
            .enumerate()
            .map(|(i, demand)| TracePod {
                name: format!("p{i}"),
                demand,
            })
            .collect();
        let order = Order {
            pods: vec![0, 1, 2, 3, 0, 1, 3, 2, 3, 0],
            nodes: (0..8).collect(),
        };
        let churn = Churn {
            load: 1.0,
            warmup: 200,
            steps: 2000,
            patience: 8,
            bound: true,
        };
        let go = |defrag| {
            run(
                &Replay {
                    nodes: &n,
                    pods: &pods,
                    order: &order,
                    policy: PackingPolicy::Spread,
                    source: &WorkloadSource::None,
                    seed: 7,
                },
                &churn,
                defrag,
            )
        };
        let without = go(None);
        let with = go(Some(Limits::default()));
        assert_eq!(without.arrived, 2000);
        assert_eq!(with.arrived, 2000);
        assert!(without.refused > 0, "{without:?}");
        assert!(without.fragmented > 0, "{without:?}");
        assert_eq!(without.placed_by_moves, 0);
        assert_eq!(without.moved, Moved::default());
        assert!(with.placed_by_moves > 0, "{with:?}");
        assert!(
            with.gave_up < without.gave_up,
            "{with:?} against {without:?}"
        );
        for o in [&with, &without] {
            assert!(o.fragmented <= o.refused);
            assert!(o.placed_by_moves <= o.refused);
            assert!(o.fragmented_placed_by_moves <= o.fragmented.min(o.placed_by_moves));
            assert!((0.0..=100.0).contains(&o.unallocated_pct));
        }
        assert!(with.moved.placed >= with.placed_by_moves);
        assert!(
            with.moved.moves >= with.moved.placed,
            "every plan moved a pod"
        );
    }
}

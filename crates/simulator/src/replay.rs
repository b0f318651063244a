//! PURE: one replay of a trace under one policy and one seed, as the FGD paper's simulator does
//! it (reference/fgd.md section 4): pods sorted by name and shuffled, inflated with uniform
//! draws with replacement up to `tune` times the cluster's GPU capacity, nodes permuted, pods
//! placed one at a time on the best-scoring node that fits (ties broken at random), failures
//! dropped, nothing ever deleted. After every pod it records the arrived and allocated GPU and
//! the cluster's fragmentation.
//!
//! Placement goes through [`packing::fit`] and [`Scorer::evaluate`]: the code the extender's
//! filter, prioritize and bind run.

use std::collections::HashMap;
use std::sync::Arc;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::residents::{Moved, Residents};
use super::trace::{TracePod, gpu_request_milli};
use crate::defrag::Limits;
use crate::inventory::{GpuNode, Sharing};
use crate::packing::frag::TargetWorkload;
use crate::packing::{
    self, Demand, FragMemo, GpuDemand, Homes, OnlineWorkload, PackingPolicy, Placement, Reason,
    Scorer, Usage,
};

/// The arrival order of one seed: indexes into the trace's pods (inflated copies repeat an
/// index) and the node order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Order {
    pub pods: Vec<usize>,
    pub nodes: Vec<usize>,
}

/// Builds the arrival order for `seed`: sort by name, shuffle, then append uniform draws with
/// replacement until the next draw would push the GPU request past `tune` x capacity (or drop
/// random pods until the request is within it), then permute the nodes. As in the FGD
/// simulator, the stopping test adds a draw's per-GPU share (a multi-GPU draw may overshoot).
pub fn order(pods: &[TracePod], nodes: usize, capacity_milli: u64, seed: u64, tune: f64) -> Order {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut idx: Vec<usize> = (0..pods.len()).collect();
    idx.sort_by(|a, b| pods[*a].name.cmp(&pods[*b].name));
    idx.shuffle(&mut rng);
    // Inflation draws GPU pods; a trace without one has nothing to inflate.
    let draws_gpu = pods.iter().any(|p| per_gpu_milli(&p.demand) > 0);
    if tune > 0.0 && draws_gpu {
        let cap = (tune * capacity_milli as f64) as u64;
        let mut total: u64 = idx.iter().map(|i| pods[*i].gpu_milli()).sum();
        if total <= cap {
            loop {
                let i = rng.random_range(0..pods.len());
                if total + per_gpu_milli(&pods[i].demand) > cap {
                    break;
                }
                total += pods[i].gpu_milli();
                idx.push(i);
            }
        } else {
            while total > cap && !idx.is_empty() {
                let k = rng.random_range(0..idx.len());
                total -= pods[idx[k]].gpu_milli();
                idx.remove(k);
            }
        }
    }
    let mut node_order: Vec<usize> = (0..nodes).collect();
    node_order.shuffle(&mut rng);
    Order {
        pods: idx,
        nodes: node_order,
    }
}

fn per_gpu_milli(d: &Demand) -> u64 {
    u64::from(d.gpu.per_gpu().0)
}

/// The state after one pod.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// GPU asked for by every pod so far, placed or not, thousandths.
    pub arrived_milli: u64,
    pub allocated_milli: u64,
    /// Cluster fragmentation (sum over nodes), thousandths.
    pub frag_milli: f64,
}

/// One replay's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOutcome {
    pub seed: u64,
    pub capacity_milli: u64,
    /// One sample before the first pod and one after each pod.
    pub samples: Vec<Sample>,
    pub placed: usize,
    pub failed: usize,
    /// With [`Trace::explain`]: each pod that fit nowhere, in arrival order.
    pub unplaced: Vec<Unplaced>,
    /// With [`Trace::defrag`]: what the moves did.
    pub moved: Option<Moved>,
}

/// A pod that fit nowhere, recorded with [`Trace::explain`].
#[derive(Debug, Clone, PartialEq)]
pub struct Unplaced {
    /// Its index in the trace.
    pub pod: usize,
    /// GPU asked for by every pod that arrived up to and including this one, thousandths.
    pub arrived_milli: u64,
    /// Why it fit no node.
    pub reason: Reason,
}

/// How a policy's workload estimate is obtained.
#[derive(Debug, Clone)]
pub enum WorkloadSource {
    /// None needed (the policy does not read one).
    None,
    /// Fixed up front (FGD: the typical shapes of the untuned trace).
    Fixed(Arc<TargetWorkload>),
    /// Learnt online from the pods seen so far (gpu-share).
    Online,
}

impl WorkloadSource {
    /// What a policy reads: FGD's estimate fixed up front (`fixed`), gpu-share's learnt online,
    /// nothing for the others.
    pub fn for_policy(policy: PackingPolicy, fixed: &Arc<TargetWorkload>) -> Self {
        match policy {
            PackingPolicy::Fgd => WorkloadSource::Fixed(fixed.clone()),
            PackingPolicy::GpuShare => WorkloadSource::Online,
            _ => WorkloadSource::None,
        }
    }
}

/// Per node and shape: the node's version when scored, and the score (`None`: does not fit).
#[derive(Clone, Copy)]
struct Slot {
    version: u32,
    score: Option<f64>,
}

struct Shapes {
    index: HashMap<Demand, usize>,
}

impl Shapes {
    fn id(&mut self, d: &Demand) -> usize {
        // Memory is part of the demand (it is checked), so it is part of the key.
        let n = self.index.len();
        *self.index.entry(d.clone()).or_insert(n)
    }
}

/// What a replay runs on.
#[derive(Debug, Clone, Copy)]
pub struct Trace<'a> {
    pub nodes: &'a [GpuNode],
    pub pods: &'a [TracePod],
    /// The fixed workload the fragmentation metric is measured against (the untuned trace's
    /// typical shapes).
    pub metric: &'a TargetWorkload,
    /// Record why each unplaced pod fit nowhere (a fit check per node per failure).
    pub explain: bool,
    /// kube-scheduler's `percentageOfNodesToScore`: 100 scores every node that fits (gpu-share's
    /// shipped profile), 0 is kube-scheduler's adaptive default; see [`nodes_to_find`].
    pub nodes_to_score: u32,
    /// Defragment within these limits: a pod that fits nowhere is placed where the moves of a
    /// plan make room ([`Residents::make_room`]).
    pub defrag: Option<Limits>,
}

/// How many fitting nodes kube-scheduler looks for before it stops filtering
/// (`numFeasibleNodesToFind`, kube-scheduler v1.37): every node below 100 nodes; otherwise
/// `percent` of them (0: 50% less one point per 125 nodes, at least 5%), at least 100.
pub fn nodes_to_find(percent: u32, nodes: usize) -> usize {
    const MIN_NODES: usize = 100;
    if nodes < MIN_NODES || percent >= 100 {
        return nodes;
    }
    let percent = if percent == 0 {
        50usize.saturating_sub(nodes / 125).max(5)
    } else {
        percent as usize
    };
    (nodes * percent / 100).max(MIN_NODES)
}

/// Replays the trace's pods in `order` with `policy`; `progress` is called after every pod.
pub fn run(
    trace: &Trace<'_>,
    order: &Order,
    policy: PackingPolicy,
    source: &WorkloadSource,
    seed: u64,
    mut progress: impl FnMut(),
) -> RunOutcome {
    let Trace {
        nodes,
        pods,
        metric,
        explain,
        nodes_to_score,
        defrag,
    } = *trace;
    let mut residents = defrag.map(|limits| Residents::new(nodes.len(), limits));
    let to_find = nodes_to_find(nodes_to_score, nodes.len());
    // Where kube-scheduler's next search starts (`nextStartNodeIndex`), in the node order.
    let mut start = 0usize;
    let capacity_milli: u64 = nodes.iter().map(super::trace::node_capacity_milli).sum();
    let mut usages: Vec<Usage> = nodes.iter().map(Usage::empty).collect();
    let mut versions = vec![0u32; nodes.len()];
    let mut node_frag: Vec<f64> = nodes
        .iter()
        .zip(&usages)
        .map(|(n, u)| metric.node_frag(n, u))
        .collect();
    let mut frag_total: f64 = node_frag.iter().sum();

    let mut scorer = match source {
        WorkloadSource::Fixed(w) => Scorer::with_workload(policy, w.clone()),
        _ => Scorer::new(policy),
    };
    scorer.seed = seed;
    let mut online = OnlineWorkload::default();
    // The nodes never change during a replay, so neither does how scarce a shape's homes are.
    let homes = Homes::of(nodes);
    // `random` draws every time (its scores are all equal and its GPU choice is a draw).
    let random = policy == PackingPolicy::Random;
    let mut shapes = Shapes {
        index: Default::default(),
    };
    let mut cache: Vec<Vec<Slot>> = vec![Vec::new(); nodes.len()];
    // Each node's fragmentation before a placement, shared by the shapes scored on it.
    let mut memos: Vec<FragMemo> = vec![FragMemo::default(); nodes.len()];
    // Tie-breaking draws from their own stream, so every policy sees the same arrival order.
    let mut ties = ChaCha8Rng::seed_from_u64(seed ^ 0x7469_6573_5f67_7075);

    let reservation = reservation_demand();

    let mut samples = Vec::with_capacity(order.pods.len() + 1);
    let mut arrived = 0u64;
    let mut allocated = 0u64;
    samples.push(Sample {
        arrived_milli: 0,
        allocated_milli: 0,
        frag_milli: frag_total,
    });
    let (mut placed, mut failed) = (0, 0);
    let mut unplaced = Vec::new();

    for &pi in &order.pods {
        let demand = &pods[pi].demand;
        let ask = gpu_request_milli(demand);
        arrived += ask;
        if let WorkloadSource::Online = source
            && online.observe(demand)
        {
            scorer = Scorer {
                seed,
                ..Scorer::with_workload(policy, Arc::new(online.target(&homes)))
            };
            for c in &mut cache {
                c.clear();
            }
        }
        let sid = shapes.id(demand);

        // Best node: highest score; ties go to the first node in the permuted order (the FGD
        // simulator's kube-scheduler picks the smallest of the permutation-prefixed names),
        // except for `random`, whose equal scores are a uniform draw (reservoir sampling).
        // With fewer nodes to find than there are, the search starts where the last one
        // stopped and stops at the `to_find`th node that fits, as kube-scheduler's does.
        let mut best: Option<(usize, f64)> = None;
        let mut tied = 0u32;
        let (mut found, mut visited) = (0usize, 0usize);
        let n = order.nodes.len();
        for k in 0..n {
            if found == to_find {
                break;
            }
            let ni = order.nodes[(start + k) % n];
            visited += 1;
            let node = &nodes[ni];
            let score = if !random {
                let row = &mut cache[ni];
                if row.len() <= sid {
                    row.resize(
                        sid + 1,
                        Slot {
                            version: u32::MAX,
                            score: None,
                        },
                    );
                }
                let slot = &mut row[sid];
                if slot.version != versions[ni] {
                    slot.score = evaluate(&scorer, node, &usages[ni], demand, &mut memos[ni]);
                    slot.version = versions[ni];
                }
                slot.score
            } else {
                evaluate(&scorer, node, &usages[ni], demand, &mut memos[ni])
            };
            let Some(s) = score else { continue };
            found += 1;
            match best {
                Some((_, b)) if s < b || (s == b && !random) => {}
                Some((_, b)) if s == b && random => {
                    tied += 1;
                    if ties.random_range(0..tied) == 0 {
                        best = Some((ni, s));
                    }
                }
                _ => {
                    best = Some((ni, s));
                    tied = 1;
                }
            }
        }
        if to_find < n {
            start = (start + visited) % n;
        }
        let mut changed: Vec<usize> = Vec::new();
        if let Some((ni, _)) = best
            && let Some((p, _)) = scorer.evaluate(&nodes[ni], &usages[ni], demand, &mut memos[ni])
            && let Some(opened) = with_reservations(&nodes[ni], &mut usages[ni], &p, &reservation)
        {
            if let Some(r) = residents.as_mut() {
                r.placed(ni, pi, demand, &p, &opened);
            }
            changed.push(ni);
        } else if let Some(r) = residents.as_mut()
            && let Some((touched, _)) =
                r.make_room(&scorer, nodes, &mut usages, pi, demand, &|n, u, p| {
                    with_reservations(n, u, p, &reservation)
                })
        {
            changed = touched;
        }
        for &ni in &changed {
            versions[ni] = versions[ni].wrapping_add(1);
            let f = metric.node_frag(&nodes[ni], &usages[ni]);
            frag_total += f - node_frag[ni];
            node_frag[ni] = f;
        }
        if !changed.is_empty() {
            allocated += ask;
            placed += 1;
        } else {
            failed += 1;
            if explain {
                unplaced.push(Unplaced {
                    pod: pi,
                    arrived_milli: arrived,
                    reason: why_nowhere(nodes, &usages, demand),
                });
            }
        }
        samples.push(Sample {
            arrived_milli: arrived,
            allocated_milli: allocated,
            frag_milli: frag_total.max(0.0),
        });
        progress();
    }
    RunOutcome {
        seed,
        capacity_milli,
        samples,
        placed,
        failed,
        unplaced,
        moved: residents.map(|r| r.moved),
    }
}

/// What a reservation pod asks of its node (besides its GPU): read from the pod gpu-share
/// creates, the way the extender reads it from the API.
pub fn reservation_demand() -> Demand {
    let template = crate::reservation::Template {
        image: "gpu-share".into(),
        ..Default::default()
    };
    let pod = serde_json::from_value(crate::reservation::pod("node", 0, false, &template))
        .expect("the reservation pod is a Pod (tested)");
    crate::ledger::observed_holding(&pod)
        .ok()
        .flatten()
        .expect("a reservation pod holds its GPU (tested)")
        .demand
}

/// Applies placement `p`, and on a node gpu-share shares per GPU the reservation pod of every
/// GPU the share is the first on (as bind creates it, with its own CPU and memory): the
/// reservations opened. `None`, and nothing applied, when the node cannot hold the reservation
/// too: kubelet would refuse it and gpu-share evict the share.
pub fn with_reservations(
    node: &GpuNode,
    usage: &mut Usage,
    p: &Placement,
    reservation: &Demand,
) -> Option<Vec<(Demand, Placement)>> {
    let opens: Vec<u32> = if node.sharing == Sharing::PerGpu && p.shared {
        p.gpus
            .iter()
            .map(|(i, _)| *i)
            .filter(|i| usage.reserved.get(*i as usize).is_some_and(|r| *r == 0))
            .collect()
    } else {
        Vec::new()
    };
    packing::apply(usage, p);
    let mut held: Vec<(Demand, Placement)> = Vec::with_capacity(opens.len());
    for gpu in opens {
        let d = Demand {
            gpu: GpuDemand::ReservationPod {
                gpu,
                mps: p.mps,
                cdi_device: false,
            },
            ..reservation.clone()
        };
        let placed = packing::fit(node, usage, &d)
            .ok()
            .and_then(|()| packing::candidates(node, usage, &d).into_iter().next());
        match placed {
            Some(r) => {
                packing::apply(usage, &r);
                held.push((d, r));
            }
            None => {
                for (_, r) in &held {
                    packing::unapply(usage, r);
                }
                packing::unapply(usage, p);
                return None;
            }
        }
    }
    Some(held)
}

/// Why a demand fit no node: the most common reason among nodes that only lacked room (freed
/// capacity would help), else the most common reason of all.
fn why_nowhere(nodes: &[GpuNode], usages: &[Usage], demand: &Demand) -> Reason {
    let mut counts: HashMap<Reason, usize> = HashMap::new();
    for (n, u) in nodes.iter().zip(usages) {
        // A node that passes `fit` but offers no placement lacks room on any single GPU.
        let r = packing::fit(n, u, demand)
            .err()
            .unwrap_or(Reason::NoGpuWithRoom);
        *counts.entry(r).or_default() += 1;
    }
    let pick = |resolvable: bool| {
        counts
            .iter()
            .filter(|(r, _)| r.resolvable() == resolvable)
            .max_by_key(|(r, n)| (**n, std::cmp::Reverse(r.label())))
            .map(|(r, _)| r.clone())
    };
    pick(true)
        .or_else(|| pick(false))
        .unwrap_or(Reason::UnknownNode)
}

fn evaluate(
    scorer: &Scorer,
    node: &GpuNode,
    usage: &Usage,
    demand: &Demand,
    memo: &mut FragMemo,
) -> Option<f64> {
    packing::place(scorer, node, usage, demand, memo)
        .ok()
        .map(|(_, s)| s)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::packing::GpuDemand;

    fn pod(name: &str, gpu: GpuDemand) -> TracePod {
        TracePod {
            name: name.into(),
            demand: Demand {
                cpu_milli: 1000,
                ..Demand::gpu(gpu)
            },
        }
    }

    /// Nodes of one GPU each, shared per GPU as the trace's are.
    pub(crate) fn per_gpu_nodes(n: usize) -> Vec<GpuNode> {
        (0..n)
            .map(|i| {
                let mut node = GpuNode::whole(&format!("n{i}"), "H100", 1, 81559);
                node.sharing = Sharing::PerGpu;
                node
            })
            .collect()
    }

    /// Two shares spread over two GPUs leave no GPU whole for an exclusive pod; with
    /// defragmentation, one share moves onto the other's GPU and the pod is placed.
    #[test]
    fn defragmenting_places_what_scattered_shares_refused() {
        let nodes = per_gpu_nodes(2);
        let share = GpuDemand::Timeslice {
            milli: 300,
            memory_mib: None,
        };
        let pods = vec![
            pod("a", share.clone()),
            pod("b", share),
            pod("c", GpuDemand::Whole { count: 1 }),
        ];
        let metric = TargetWorkload::typical(pods.iter().map(|p| &p.demand), 0.95);
        let o = Order {
            pods: vec![0, 1, 2],
            nodes: vec![0, 1],
        };
        let run_with = |defrag| {
            let trace = Trace {
                nodes: &nodes,
                pods: &pods,
                metric: &metric,
                explain: false,
                nodes_to_score: 100,
                defrag,
            };
            run(
                &trace,
                &o,
                PackingPolicy::Spread,
                &WorkloadSource::None,
                1,
                || {},
            )
        };
        let without = run_with(None);
        assert_eq!((without.placed, without.failed), (2, 1));
        assert_eq!(without.moved, None);
        let with = run_with(Some(Limits::default()));
        assert_eq!((with.placed, with.failed), (3, 0));
        assert_eq!(
            with.moved,
            Some(Moved {
                sought: 1,
                placed: 1,
                moves: 1,
                gpus_freed: 1
            })
        );
        assert_eq!(with.samples.last().unwrap().allocated_milli, 1600);
    }

    #[test]
    fn inflation_stops_even_without_gpu_pods() {
        let cpu_only = vec![pod("a", GpuDemand::None), pod("b", GpuDemand::None)];
        let o = order(&cpu_only, 3, 8000, 1, 1.3);
        assert_eq!(o.pods.len(), 2, "nothing to inflate");
        let mixed = vec![
            pod("a", GpuDemand::None),
            pod("b", GpuDemand::Whole { count: 1 }),
        ];
        let o = order(&mixed, 1, 8000, 1, 1.3);
        let asked: u64 = o.pods.iter().map(|i| mixed[*i].gpu_milli()).sum();
        assert!(asked <= 10_400 && asked > 8000, "{asked}");
    }

    #[test]
    fn kube_scheduler_finds_a_share_of_the_nodes() {
        assert_eq!(nodes_to_find(100, 5000), 5000);
        assert_eq!(nodes_to_find(0, 5000), 500, "50% less 40 points");
        assert_eq!(
            nodes_to_find(0, 1213),
            497,
            "41% of the openb trace's 1,213 nodes"
        );
        assert_eq!(nodes_to_find(0, 100_000), 5000, "at least 5%");
        assert_eq!(nodes_to_find(10, 500), 100, "at least 100 nodes");
        assert_eq!(nodes_to_find(0, 60), 60, "every node of a small cluster");
    }

    /// Sampled, the second pod's search starts where the first stopped, past the node the first
    /// pod half filled: two half-used nodes, where scoring every node fills one.
    #[test]
    fn a_sampled_search_misses_the_node_it_half_filled() {
        let nodes: Vec<GpuNode> = (0..200)
            .map(|i| GpuNode::whole(&format!("n{i}"), "H100", 2, 81559))
            .collect();
        let pods = vec![
            pod("a", GpuDemand::Whole { count: 1 }),
            pod("b", GpuDemand::Whole { count: 1 }),
        ];
        let two = [pod("w", GpuDemand::Whole { count: 2 })];
        let metric = TargetWorkload::typical(two.iter().map(|p| &p.demand), 0.95);
        let o = Order {
            pods: vec![0, 1],
            nodes: (0..200).collect(),
        };
        let frag = |nodes_to_score| {
            let trace = Trace {
                nodes: &nodes,
                pods: &pods,
                metric: &metric,
                explain: false,
                nodes_to_score,
                defrag: None,
            };
            let out = run(
                &trace,
                &o,
                PackingPolicy::Binpack,
                &WorkloadSource::None,
                1,
                || {},
            );
            assert_eq!(out.placed, 2);
            out.samples.last().unwrap().frag_milli
        };
        assert_eq!(frag(100), 0.0);
        assert_eq!(frag(50), 2000.0, "one free GPU on each of two nodes");
    }

    #[test]
    fn unplaced_pods_are_explained_in_the_fit_reasons() {
        let nodes = vec![GpuNode::whole("n", "H100", 1, 81559)];
        let pods = vec![
            pod("a", GpuDemand::Whole { count: 1 }),
            pod("b", GpuDemand::Whole { count: 1 }),
            pod("c", GpuDemand::Whole { count: 2 }),
        ];
        let metric = TargetWorkload::typical(pods.iter().map(|p| &p.demand), 0.95);
        let trace = Trace {
            nodes: &nodes,
            pods: &pods,
            metric: &metric,
            explain: true,
            nodes_to_score: 100,
            defrag: None,
        };
        let o = Order {
            pods: vec![0, 1, 2],
            nodes: vec![0],
        };
        let out = run(
            &trace,
            &o,
            PackingPolicy::Binpack,
            &WorkloadSource::None,
            1,
            || {},
        );
        assert_eq!((out.placed, out.failed), (1, 2));
        let got: Vec<(usize, u64, Reason)> = out
            .unplaced
            .into_iter()
            .map(|u| (u.pod, u.arrived_milli, u.reason))
            .collect();
        assert_eq!(
            got,
            vec![(1, 2000, Reason::NoFreeGpus), (2, 4000, Reason::TooFewGpus)]
        );
    }

    /// On a node shared per GPU, the first share on a GPU brings its reservation pod, as in a
    /// cluster: the GPU is reserved and the node's CPU pays the reservation's request; a share
    /// whose reservation the node's CPU cannot hold too is not placed (kubelet would refuse the
    /// reservation), and a second share on the same GPU needs no second reservation.
    #[test]
    fn shares_on_per_gpu_nodes_bring_their_reservations() {
        let reservation = reservation_demand();
        assert_eq!(reservation.cpu_milli, 5, "the reservation pod asks 5m CPU");
        let mut node = GpuNode::whole("n", "A100", 2, 81920);
        node.sharing = Sharing::PerGpu;
        node.cpu_milli = Some(2005);
        let mut usage = Usage::empty(&node);
        let share = |cpu_milli| Demand {
            cpu_milli,
            ..Demand::gpu(GpuDemand::Timeslice {
                milli: 300,
                memory_mib: None,
            })
        };
        let on = |usage: &Usage, gpu: u32, d: &Demand| {
            let mut p = packing::candidates(&node, usage, d).remove(0);
            p.gpus[0].0 = gpu;
            p
        };
        let first = on(&usage, 0, &share(1000));
        assert!(with_reservations(&node, &mut usage, &first, &reservation).is_some());
        assert_eq!(
            (usage.reserved.clone(), usage.cpu_milli),
            (vec![1, 0], 1005)
        );
        let second = on(&usage, 0, &share(500));
        assert!(with_reservations(&node, &mut usage, &second, &reservation).is_some());
        assert_eq!(
            (usage.reserved.clone(), usage.cpu_milli),
            (vec![1, 0], 1505)
        );
        // 500m fit the share on GPU 1, not its reservation's 5m as well: nothing applied.
        let before = usage.clone();
        let third = on(&usage, 1, &share(500));
        assert!(with_reservations(&node, &mut usage, &third, &reservation).is_none());
        assert_eq!(usage, before);
        // On a node shared some other way, no reservation.
        let mut ts = GpuNode::whole("t", "A100", 1, 81920);
        ts.sharing = Sharing::TimeSlicing { replicas: 4 };
        let mut u = Usage::empty(&ts);
        let p = packing::candidates(&ts, &u, &share(0)).remove(0);
        assert!(with_reservations(&ts, &mut u, &p, &reservation).is_some());
        assert_eq!(u.reserved, vec![0]);
    }
}

//! PURE: packing policies. A score is "higher is better" for placing a demand on a node with a
//! given placement; the extender scales scores to 0..=10, the simulator takes the best node.

use serde::{Deserialize, Serialize};

use std::sync::Arc;

use super::baselines::{
    best_fit_gpu, best_fit_score, dot_product_score, gpu_clustering_score, gpu_packing_score,
    random_gpu,
};
use super::demand::{Demand, GPU_MILLI, GpuDemand};
use super::frag::{Frag, FragMemo, Measure, Shape, TargetWorkload};
use super::placements::{candidates, for_each_candidate};
use super::usage::{Placement, Usage};
use crate::inventory::{GpuNode, MigLayout, Sharing};

/// Packing policies by name (the policy file's `packing.policy` takes `binpack`, `spread` and
/// `gpu-share`; the simulator takes them all, with the six baselines of the FGD paper).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum PackingPolicy {
    /// Fill partly used nodes and GPUs of the same class first; keep whole nodes and GPUs free.
    Binpack,
    /// The opposite: least used node first.
    Spread,
    /// gpu-share's own policy (the default): see [`Scorer::evaluate`].
    #[default]
    GpuShare,
    /// FGD paper baseline: a uniformly random feasible node (the caller draws) and GPU.
    Random,
    /// FGD paper baseline (Tetris): smallest dot product of the node's free and the pod's
    /// requested (CPU, GPU) vectors, each normalised by the largest node.
    #[serde(rename = "dotprod")]
    DotProd,
    /// FGD paper baseline: nodes already running pods of the same GPU request kind first.
    GpuClustering,
    /// FGD paper baseline: already shared GPUs, then free GPUs of used nodes, then empty nodes.
    GpuPacking,
    /// FGD paper baseline: the least free (CPU, GPU) left after placing.
    #[serde(rename = "bestfit")]
    BestFit,
    /// Fragmentation gradient descent (Weng et al., ATC'23): the smallest growth of the node's
    /// fragmentation against a target workload fixed up front.
    Fgd,
}

impl PackingPolicy {
    /// Every policy, in the order reports list them.
    pub const ALL: [PackingPolicy; 9] = [
        PackingPolicy::Random,
        PackingPolicy::DotProd,
        PackingPolicy::GpuClustering,
        PackingPolicy::GpuPacking,
        PackingPolicy::BestFit,
        PackingPolicy::Fgd,
        PackingPolicy::GpuShare,
        PackingPolicy::Binpack,
        PackingPolicy::Spread,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PackingPolicy::Binpack => "binpack",
            PackingPolicy::Spread => "spread",
            PackingPolicy::GpuShare => "gpu-share",
            PackingPolicy::Random => "random",
            PackingPolicy::DotProd => "dotprod",
            PackingPolicy::GpuClustering => "gpu-clustering",
            PackingPolicy::GpuPacking => "gpu-packing",
            PackingPolicy::BestFit => "bestfit",
            PackingPolicy::Fgd => "fgd",
        }
    }

    /// The policy named `name` (as [`PackingPolicy::name`] prints it).
    pub fn parse(name: &str) -> Option<PackingPolicy> {
        PackingPolicy::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Whether scores depend on a target workload.
    pub fn reads_workload(self) -> bool {
        matches!(self, PackingPolicy::Fgd | PackingPolicy::GpuShare)
    }
}

impl std::fmt::Display for PackingPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl From<crate::policy::PackingPolicyName> for PackingPolicy {
    fn from(n: crate::policy::PackingPolicyName) -> Self {
        match n {
            crate::policy::PackingPolicyName::Binpack => PackingPolicy::Binpack,
            crate::policy::PackingPolicyName::Spread => PackingPolicy::Spread,
            crate::policy::PackingPolicyName::GpuShare => PackingPolicy::GpuShare,
        }
    }
}

/// A packing policy, ready to score.
#[derive(Debug, Clone)]
pub struct Scorer {
    pub policy: PackingPolicy,
    /// The target workload of `fgd` and `gpu-share` (without one, `gpu-share` falls back to its
    /// binpack form and `fgd` to binpack).
    pub workload: Option<Arc<TargetWorkload>>,
    /// Seeds the `random` policy's GPU choice.
    pub seed: u64,
}

impl Scorer {
    pub fn new(policy: PackingPolicy) -> Self {
        Scorer {
            policy,
            workload: None,
            seed: 0,
        }
    }

    pub fn with_workload(policy: PackingPolicy, workload: Arc<TargetWorkload>) -> Self {
        Scorer {
            workload: (!workload.is_empty()).then_some(workload),
            ..Scorer::new(policy)
        }
    }

    /// Fills `memo` with the node's "before" fragmentation under this scorer's workload, as
    /// [`Scorer::evaluate`] would read it (nothing for policies that read no workload).
    pub fn warm_memo(&self, node: &GpuNode, usage: &Usage, memo: &mut FragMemo) {
        let measure = match self.policy {
            PackingPolicy::Fgd => Measure::Fgd,
            PackingPolicy::GpuShare => Measure::CpuCapped,
            _ => return,
        };
        if let Some(w) = &self.workload {
            memo.node_frag(w, measure, node, usage);
        }
    }

    /// Picks the placement on this node and scores the node (higher is better), after
    /// [`super::fit`] said yes. `None` when there is no way to place the demand.
    ///
    /// The six baselines follow the FGD paper's simulator: integer scores 0..=100 (so equal
    /// nodes tie and the caller's tie-break decides), and the GPU inside the node chosen
    /// best-fit (the fullest GPU that fits), except `random` (a random GPU) and `fgd` (the GPU
    /// whose use grows the node's fragmentation least). `gpu-share` is FGD's rule with a
    /// CPU-aware measure against the workload seen so far: see [`frag_step_score`].
    ///
    /// The node's fragmentation before the placement is read from (and kept in) `memo`: the
    /// node's own, kept between decisions, or a fresh `FragMemo::default()` (the same result).
    pub fn evaluate(
        &self,
        node: &GpuNode,
        usage: &Usage,
        demand: &Demand,
        memo: &mut FragMemo,
    ) -> Option<(Placement, f64)> {
        // The fragmentation policies score every candidate and keep only the best.
        let measure = match (self.policy, &self.workload) {
            (PackingPolicy::Fgd, Some(w)) => Some((w, Measure::Fgd)),
            (PackingPolicy::GpuShare, Some(w)) if Shape::of(demand).is_some() => {
                Some((w, Measure::CpuCapped))
            }
            _ => None,
        };
        if let Some((w, m)) = measure {
            let before = memo.node_frag(w, m, node, usage);
            return best_candidate(node, usage, demand, |p| {
                frag_step_score(w, m, node, usage, p, before) + held_bonus(usage, p)
            });
        }
        let cands = candidates(node, usage, demand);
        if cands.is_empty() {
            return None;
        }
        match self.policy {
            PackingPolicy::Random => {
                let p = random_gpu(self.seed, node, usage, demand, &cands);
                Some((p, 0.0))
            }
            PackingPolicy::DotProd => best_fit_gpu(usage, cands).map(|p| {
                let s = dot_product_score(node, usage, demand);
                (p, s)
            }),
            PackingPolicy::GpuClustering => best_fit_gpu(usage, cands).map(|p| {
                let s = gpu_clustering_score(usage, demand);
                (p, s)
            }),
            PackingPolicy::GpuPacking => best_fit_gpu(usage, cands).map(|p| {
                let s = gpu_packing_score(node, usage, demand);
                (p, s)
            }),
            PackingPolicy::BestFit => best_fit_gpu(usage, cands).map(|p| {
                let s = best_fit_score(node, usage, demand);
                (p, s)
            }),
            // Without a workload (or for a demand the measure does not model) `fgd` and
            // `gpu-share` fall back to their binpack form.
            PackingPolicy::Fgd
            | PackingPolicy::GpuShare
            | PackingPolicy::Binpack
            | PackingPolicy::Spread => self.max_score(node, usage, demand, cands),
        }
    }

    fn max_score(
        &self,
        node: &GpuNode,
        usage: &Usage,
        demand: &Demand,
        cands: Vec<Placement>,
    ) -> Option<(Placement, f64)> {
        first_max(cands.into_iter().map(|p| {
            let s = self.score(node, usage, demand, &p);
            (p, s)
        }))
    }

    /// Scores one placement with the binpack family (binpack, spread, and gpu-share's form for
    /// demands the fragmentation measure does not model: MIG devices and device units).
    pub fn score(&self, node: &GpuNode, usage: &Usage, demand: &Demand, p: &Placement) -> f64 {
        let fill = fill_after(node, usage, demand, p);
        let gpu_fit = gpu_fit_after(usage, p);
        held_bonus(usage, p)
            + match self.policy {
                PackingPolicy::Spread => (1.0 - fill) + 0.01 * (1.0 - gpu_fit),
                PackingPolicy::GpuShare => {
                    // Binpack, and a node that is empty now is the last resort for a shared demand
                    // (whole nodes stay free for multi-GPU pods).
                    let opens_node = usage.pods == 0 && usage.allocated_milli() == 0;
                    let shared = matches!(
                        demand.gpu,
                        GpuDemand::Mps { .. } | GpuDemand::Timeslice { .. } | GpuDemand::Mig { .. }
                    );
                    fill + 0.01 * gpu_fit
                        - replica_waste(node, demand)
                        - if opens_node && shared { 0.5 } else { 0.0 }
                }
                _ => fill + 0.01 * gpu_fit - replica_waste(node, demand),
            }
    }
}

/// Breaks ties for a share on a node gpu-share shares per GPU: an idle GPU a reservation
/// already holds (in its release grace) over a free GPU that would need a new reservation. Too
/// small to outweigh any difference of the measures, so it only chooses among equals. (A GPU
/// with shares on it is weighed by the measures; the simulator, where nothing leaves, never has
/// an idle reserved GPU.)
fn held_bonus(usage: &Usage, p: &Placement) -> f64 {
    if usage.holds_for(p) { 1e-6 } else { 0.0 }
}

/// The first of the highest-scoring candidates, cloning a candidate only when it leads.
fn best_candidate(
    node: &GpuNode,
    usage: &Usage,
    demand: &Demand,
    mut score: impl FnMut(&Placement) -> f64,
) -> Option<(Placement, f64)> {
    let mut best: Option<(Placement, f64)> = None;
    for_each_candidate(node, usage, demand, |p| {
        let s = score(p);
        if best.as_ref().is_none_or(|(_, b)| s > *b) {
            best = Some((p.clone(), s));
        }
    });
    best
}

/// The first of the highest-scoring items.
fn first_max(items: impl Iterator<Item = (Placement, f64)>) -> Option<(Placement, f64)> {
    items.fold(None, |best, (p, s)| match best {
        Some((bp, bs)) if bs >= s => Some((bp, bs)),
        _ => Some((p, s)),
    })
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// The score of one placement under `fgd` (the paper's measure) and `gpu-share`
/// ([`Measure::CpuCapped`]): how much the node's fragmentation grows, squashed by a sigmoid into
/// 100 integer steps as FGD does (near-equal nodes tie, and the caller's stable tie-break packs
/// them first-fit). `gpu-share` measures against the workload *seen so far* rather than one
/// fixed up front, and counts the idle GPU capacity the node's free CPU cannot feed at the
/// workload's CPU per GPU ([`Frag::stranded`]): a pod that eats the CPU of a node with free GPUs
/// is charged for the GPUs it strands, and one that uses GPUs a CPU-poor node could not feed
/// is credited for them.
pub fn frag_step_score(
    w: &TargetWorkload,
    measure: Measure,
    node: &GpuNode,
    usage: &Usage,
    p: &Placement,
    before: Frag,
) -> f64 {
    let growth = w.parts_after(measure, node, usage, p).total() - before.total();
    (sigmoid(-growth / 1000.0) * 100.0).trunc()
}

/// How full the pool the demand draws on is after the placement, 0..=1.
pub fn fill_after(node: &GpuNode, usage: &Usage, demand: &Demand, p: &Placement) -> f64 {
    match &demand.gpu {
        GpuDemand::Mig { .. } => {
            let total = node.mig_devices();
            if total == 0 {
                return 0.0;
            }
            let used: u32 = match node.mig {
                MigLayout::Single { .. } => usage.slots + p.slots,
                _ => usage.mig.values().sum::<u32>() + p.mig.as_ref().map_or(0, |(_, n)| *n),
            };
            f64::from(used) / f64::from(total)
        }
        GpuDemand::None => match node.cpu_milli {
            Some(c) if c > 0 => (usage.cpu_milli + p.cpu_milli) as f64 / c as f64,
            _ => 0.0,
        },
        _ => {
            if node.gpus > 0 {
                let after: u64 = usage.allocated_milli()
                    + p.gpus.iter().map(|(_, m)| u64::from(*m)).sum::<u64>();
                (after as f64 / (f64::from(node.gpus) * f64::from(GPU_MILLI))).min(1.0)
            } else if node.slots > 0 {
                f64::from(usage.slots + p.slots) / f64::from(node.slots)
            } else {
                0.0
            }
        }
    }
}

/// How full the chosen GPU(s) are after the placement (best fit inside the node), 0..=1.
fn gpu_fit_after(usage: &Usage, p: &Placement) -> f64 {
    if p.gpus.is_empty() {
        return 0.0;
    }
    let sum: f64 = p
        .gpus
        .iter()
        .map(|(i, m)| {
            let before = usage.gpu_milli.get(*i as usize).copied().unwrap_or(0);
            f64::from((before + m).min(GPU_MILLI)) / f64::from(GPU_MILLI)
        })
        .sum();
    sum / p.gpus.len() as f64
}

/// For MPS, the part of a replica the pod does not need (a 10% pod on a 50% replica wastes 80% of it).
fn replica_waste(node: &GpuNode, demand: &Demand) -> f64 {
    match (&demand.gpu, node.sharing) {
        (GpuDemand::Mps { milli, .. }, Sharing::Mps { replicas }) => {
            let r = GPU_MILLI / replicas.max(1);
            f64::from(r.saturating_sub(*milli)) / f64::from(r.max(1))
        }
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packing::{Homes, OnlineWorkload, Workload, apply, place};

    #[test]
    fn frag_after_reads_every_gpu_of_a_large_node() {
        let w = TargetWorkload {
            shapes: vec![(
                Shape {
                    cpu_milli: 1000,
                    gpus: 1,
                    gpu_milli: 500,
                    models: vec![],
                },
                1.0,
            )],
        };
        let mut n = GpuNode::whole("big", "X", 80, 81920);
        n.cpu_milli = Some(1_000_000);
        let mut u = Usage::empty(&n);
        for g in u.gpu_milli.iter_mut().skip(60) {
            *g = 300;
        }
        // GPU 70 is left with 100 free, too little for the shape: lost.
        let p = Placement {
            gpus: vec![(70, 600)],
            cpu_milli: 1000,
            ..Placement::default()
        };
        let mut after = u.clone();
        apply(&mut after, &p);
        for m in [Measure::Fgd, Measure::CpuCapped] {
            assert_eq!(w.parts_after(m, &n, &u, &p), w.node_parts_by(m, &n, &after));
        }
    }

    /// A trace node (per-GPU, CPU accounted) with the given per-GPU use.
    fn trace_node(gpus: u32, cpu: u64, used: &[u32]) -> (GpuNode, Usage) {
        let mut n = GpuNode::whole("n", "G2", gpus, 0);
        n.sharing = Sharing::PerGpu;
        n.slots = 0;
        n.gpu_memory_mib = None;
        n.cpu_milli = Some(cpu);
        n.memory_mib = Some(1 << 20);
        let mut u = Usage::empty(&n);
        for (g, m) in u.gpu_milli.iter_mut().zip(used) {
            *g = *m;
        }
        (n, u)
    }

    fn share(cpu: u64, milli: u32) -> Demand {
        Demand {
            cpu_milli: cpu,
            memory_mib: 0,
            gpu: GpuDemand::Timeslice {
                milli,
                memory_mib: None,
            },
            models: vec![],
            resources: vec![],
            devices: None,
            enforcement: crate::enforcement::Requirement::Off,
            driver_limit_mib: None,
        }
    }

    fn whole(cpu: u64, count: u32) -> Demand {
        Demand {
            cpu_milli: cpu,
            memory_mib: 0,
            gpu: GpuDemand::Whole { count },
            models: vec![],
            resources: vec![],
            devices: None,
            enforcement: crate::enforcement::Requirement::Off,
            driver_limit_mib: None,
        }
    }

    fn eval(policy: PackingPolicy, n: &GpuNode, u: &Usage, d: &Demand) -> (Placement, f64) {
        Scorer::new(policy)
            .evaluate(n, u, d, &mut FragMemo::default())
            .unwrap()
    }

    #[test]
    fn gpu_packing_prefers_shared_gpus_then_used_nodes_then_empty_nodes() {
        let (n, empty) = trace_node(8, 96_000, &[]);
        // All 8 free: max(33 - 8, 8).
        assert_eq!(gpu_packing_score(&n, &empty, &share(1000, 300)), 25.0);
        // GPU 0 has 400 left: 100 - (400*100/1000)/10 = 96, on GPU 0 (best fit).
        let (_, used) = trace_node(8, 96_000, &[600]);
        let (p, s) = eval(PackingPolicy::GpuPacking, &n, &used, &share(1000, 300));
        assert_eq!((p.gpus.clone(), s), (vec![(0, 300)], 96.0));
        // A whole GPU on a used node: max(50 - 1, 33).
        assert_eq!(gpu_packing_score(&n, &used, &whole(1000, 1)), 49.0);
        // CPU-only pods score 0.
        let cpu_only = Demand {
            cpu_milli: 1000,
            ..Demand::gpu(GpuDemand::None)
        };
        assert_eq!(gpu_packing_score(&n, &used, &cpu_only), 0.0);
        assert_eq!(gpu_clustering_score(&used, &cpu_only), 0.0);
    }

    #[test]
    fn gpu_clustering_bands_by_the_kinds_already_on_the_node() {
        let (n, mut u) = trace_node(8, 96_000, &[]);
        let d = share(1000, 500);
        // No pods: 25 + 25*(8000-8000)/8000.
        assert_eq!(gpu_clustering_score(&u, &d), 25.0);
        let (p, _) = eval(PackingPolicy::GpuClustering, &n, &u, &d);
        apply(&mut u, &p);
        // Only share pods here: 75 + 25*500/8000 (= 1, integer).
        assert_eq!(gpu_clustering_score(&u, &d), 76.0);
        // A whole-GPU pod sees another kind only: 0 + 1.
        assert_eq!(gpu_clustering_score(&u, &whole(1000, 1)), 1.0);
        let (p, _) = eval(PackingPolicy::GpuClustering, &n, &u, &whole(1000, 1));
        apply(&mut u, &p);
        // Mixed kinds including the pod's: 50 + 25*1500/8000 (= 4).
        assert_eq!(gpu_clustering_score(&u, &d), 54.0);
    }

    #[test]
    fn best_fit_and_dot_product_follow_their_formulas() {
        let (n, u) = trace_node(8, 128_000, &[1000, 1000, 1000, 1000]);
        let d = share(64_000, 500);
        // Left after: CPU 64,000 of 128,000 and GPU 3,500 of 8,000.
        // 100 * (1 - 0.5*0.5 - 0.5*3500/8000) = 53.125 -> 53.
        assert_eq!(best_fit_score(&n, &u, &d), 53.0);
        // Free (1, 0.5) . request (0.5, 0.0625) = 0.53125; 100 * (1 - 0.265625) -> 73.
        assert_eq!(dot_product_score(&n, &u, &d), 73.0);
        // Fuller nodes score higher with bestfit.
        let (_, emptier) = trace_node(8, 128_000, &[]);
        assert!(best_fit_score(&n, &emptier, &d) < best_fit_score(&n, &u, &d));
    }

    #[test]
    fn fgd_places_where_fragmentation_grows_least() {
        let w = Arc::new(TargetWorkload {
            shapes: vec![
                (
                    Shape {
                        cpu_milli: 1000,
                        gpus: 1,
                        gpu_milli: 500,
                        models: vec![],
                    },
                    0.5,
                ),
                (
                    Shape {
                        cpu_milli: 1000,
                        gpus: 1,
                        gpu_milli: 1000,
                        models: vec![],
                    },
                    0.5,
                ),
            ],
        });
        let fgd = Scorer::with_workload(PackingPolicy::Fgd, w.clone());
        // GPU 0 half used. A 500 pod on GPU 0 fills it (no fragment left); on GPU 1 it would
        // leave 500 that whole-GPU pods cannot use.
        let (n, u) = trace_node(2, 8000, &[500, 0]);
        let (p, s_fill) = fgd
            .evaluate(&n, &u, &share(1000, 500), &mut FragMemo::default())
            .unwrap();
        assert_eq!(p.gpus, vec![(0, 500)]);
        // Before: 0.5*0 + 0.5*500 = 250 fragment; after: 0 -> growth -250, sigmoid(0.25)*100.
        assert_eq!(s_fill, (sigmoid(0.25) * 100.0).trunc());
        // The same pod on an empty node grows fragmentation: lower score.
        let (n2, u2) = trace_node(2, 8000, &[]);
        let (_, s_empty) = fgd
            .evaluate(&n2, &u2, &share(1000, 500), &mut FragMemo::default())
            .unwrap();
        assert!(s_empty < s_fill);
        // gpu-share with the same workload scores like FGD.
        let gs = Scorer::with_workload(PackingPolicy::GpuShare, w);
        assert_eq!(
            gs.evaluate(&n, &u, &share(1000, 500), &mut FragMemo::default())
                .unwrap()
                .1,
            s_fill
        );
    }

    #[test]
    fn gpu_share_charges_a_pod_for_the_gpus_its_cpu_strands() {
        // The workload: 10-CPU, 1-GPU pods.
        let w = Arc::new(TargetWorkload {
            shapes: vec![(
                Shape {
                    cpu_milli: 10_000,
                    gpus: 1,
                    gpu_milli: 1000,
                    models: vec![],
                },
                1.0,
            )],
        });
        let cpu_only = Demand {
            cpu_milli: 10_000,
            ..Demand::gpu(GpuDemand::None)
        };
        // An 8-GPU node with 30 CPUs left feeds three such pods; a CPU-only pod there leaves
        // CPU for two. A 2-GPU node with 100 CPUs feeds both its GPUs either way.
        let (starved, su) = trace_node(8, 30_000, &[]);
        let (rich, ru) = trace_node(2, 100_000, &[]);
        let fgd = Scorer::with_workload(PackingPolicy::Fgd, w.clone());
        let gs = Scorer::with_workload(PackingPolicy::GpuShare, w);
        // FGD sees no difference (the pod still fits once on both).
        let f_starved = fgd
            .evaluate(&starved, &su, &cpu_only, &mut FragMemo::default())
            .unwrap()
            .1;
        let f_rich = fgd
            .evaluate(&rich, &ru, &cpu_only, &mut FragMemo::default())
            .unwrap()
            .1;
        assert_eq!((f_starved, f_rich), (50.0, 50.0));
        // gpu-share charges the stranded GPU: 1000 more fragment, sigmoid(-1) -> 26.
        let g_starved = gs
            .evaluate(&starved, &su, &cpu_only, &mut FragMemo::default())
            .unwrap()
            .1;
        let g_rich = gs
            .evaluate(&rich, &ru, &cpu_only, &mut FragMemo::default())
            .unwrap()
            .1;
        assert_eq!(g_rich, 50.0);
        assert_eq!(g_starved, (sigmoid(-1.0) * 100.0).trunc());
        assert!(g_starved < g_rich);
    }

    #[test]
    fn gpu_share_credits_a_pod_that_uses_gpus_the_cpu_could_not_feed() {
        // Most pods ask 1 GPU and 12 CPUs, a fifth 2 GPUs and 16 CPUs: 32 CPUs for every 3 GPUs.
        let one = Shape {
            cpu_milli: 12_000,
            gpus: 1,
            gpu_milli: 1000,
            models: vec![],
        };
        let two = Shape {
            cpu_milli: 16_000,
            gpus: 2,
            ..one.clone()
        };
        let w = Arc::new(TargetWorkload {
            shapes: vec![(one, 0.8), (two, 0.2)],
        });
        let pod = whole(4000, 1);
        // A 2-GPU, 16-CPU node feeds 1.5 GPUs: 500 stranded. The small pod leaves 12 CPUs for
        // its last GPU, which they feed (-500), but takes the 2-GPU pods' home (+200).
        let (small, su) = trace_node(2, 16_000, &[]);
        // An 8-GPU node with 5 GPUs and 60 CPUs free feeds them all, before and after.
        let (big, bu) = trace_node(8, 60_000, &[1000; 3]);
        let parts = |n: &GpuNode, u: &Usage| {
            let before = w.node_parts_by(Measure::CpuCapped, n, u);
            let (p, _) = eval_with(&w, n, u, &pod);
            let after = w.parts_after(Measure::CpuCapped, n, u, &p);
            (after.fgd - before.fgd, after.stranded - before.stranded)
        };
        assert_eq!(parts(&small, &su), (200.0, -500.0));
        assert_eq!(parts(&big, &bu), (0.0, 0.0));
        // The score is the step of the whole growth: -300 on the small node (57), 0 (50).
        let s_small = eval_with(&w, &small, &su, &pod).1;
        let s_big = eval_with(&w, &big, &bu, &pod).1;
        assert_eq!(s_small, (sigmoid(0.3) * 100.0).trunc());
        assert_eq!((s_small, s_big), (57.0, 50.0));
    }

    fn eval_with(w: &Arc<TargetWorkload>, n: &GpuNode, u: &Usage, d: &Demand) -> (Placement, f64) {
        Scorer::with_workload(PackingPolicy::GpuShare, w.clone())
            .evaluate(n, u, d, &mut FragMemo::default())
            .unwrap()
    }

    #[test]
    fn random_draws_any_gpu_with_room_and_depends_on_the_seed() {
        let (n, u) = trace_node(8, 96_000, &[900, 0, 0, 0, 0, 0, 0, 0]);
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..64 {
            let s = Scorer {
                seed,
                ..Scorer::new(PackingPolicy::Random)
            };
            let (p, score) = s
                .evaluate(&n, &u, &share(1000, 300), &mut FragMemo::default())
                .unwrap();
            assert_eq!(score, 0.0);
            assert_ne!(p.gpus[0].0, 0, "GPU 0 has no room for 300");
            seen.insert(p.gpus[0].0);
        }
        assert!(
            seen.len() >= 5,
            "draws should spread over the free GPUs: {seen:?}"
        );
    }

    #[test]
    fn online_workload_refreshes_on_schedule_and_learns_the_mix() {
        let mut o = OnlineWorkload::default();
        let mut refreshed = Vec::new();
        for i in 1..=40u64 {
            let d = if i % 4 == 0 {
                whole(1000, 1)
            } else {
                share(1000, 250)
            };
            if o.observe(&d) {
                refreshed.push(i);
            }
        }
        assert_eq!(refreshed, vec![1, 2, 4, 8, 16, 32]);
        let t = o.target(&Homes::default());
        assert_eq!(t.shapes[0].0.gpu_milli, 250);
        assert!((t.shapes[0].1 - 0.75).abs() < 1e-9);
        assert_eq!(
            PackingPolicy::parse("gpu-share"),
            Some(PackingPolicy::GpuShare)
        );
        assert_eq!(
            PackingPolicy::parse("dotprod"),
            Some(PackingPolicy::DotProd)
        );
        assert_eq!(PackingPolicy::parse("best-fit"), None);
    }

    fn ts(p: u32) -> Demand {
        Demand::gpu(GpuDemand::Timeslice {
            milli: p * 10,
            memory_mib: None,
        })
    }

    fn best<'n>(scorer: &Scorer, nodes: &'n [(GpuNode, Usage)], d: &Demand) -> Option<&'n str> {
        nodes
            .iter()
            .filter_map(|(n, u)| {
                place(scorer, n, u, d, &mut FragMemo::default())
                    .ok()
                    .map(|(_, s)| (n, s))
            })
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(n, _)| n.name.as_str())
    }

    fn two_ts_nodes() -> Vec<(GpuNode, Usage)> {
        let a = GpuNode::shared("a", "H100", 2, 81559, Sharing::TimeSlicing { replicas: 4 });
        let b = GpuNode::shared("b", "H100", 2, 81559, Sharing::TimeSlicing { replicas: 4 });
        let mut ua = Usage::empty(&a);
        let (p, _) = place(
            &Scorer::new(PackingPolicy::Binpack),
            &a,
            &ua,
            &ts(30),
            &mut FragMemo::default(),
        )
        .unwrap();
        apply(&mut ua, &p);
        let ub = Usage::empty(&b);
        vec![(a, ua), (b, ub)]
    }

    #[test]
    fn binpack_fills_used_nodes_spread_empties() {
        let nodes = two_ts_nodes();
        assert_eq!(
            best(&Scorer::new(PackingPolicy::Binpack), &nodes, &ts(20)),
            Some("a")
        );
        assert_eq!(
            best(&Scorer::new(PackingPolicy::GpuShare), &nodes, &ts(20)),
            Some("a")
        );
        assert_eq!(
            best(&Scorer::new(PackingPolicy::Spread), &nodes, &ts(20)),
            Some("b")
        );
    }

    #[test]
    fn binpack_picks_the_fullest_gpu_that_fits() {
        let n = GpuNode::shared("a", "H100", 2, 81559, Sharing::TimeSlicing { replicas: 4 });
        let mut u = Usage::empty(&n);
        u.gpu_milli = vec![300, 600];
        let (p, _) = place(
            &Scorer::new(PackingPolicy::Binpack),
            &n,
            &u,
            &ts(30),
            &mut FragMemo::default(),
        )
        .unwrap();
        assert_eq!(p.gpus, vec![(1, 300)]);
        let (p, _) = place(
            &Scorer::new(PackingPolicy::Spread),
            &n,
            &u,
            &ts(30),
            &mut FragMemo::default(),
        )
        .unwrap();
        assert_eq!(p.gpus, vec![(0, 300)]);
    }

    #[test]
    fn mps_prefers_replicas_that_barely_fit() {
        let x2 = GpuNode::shared("x2", "H100", 1, 81559, Sharing::Mps { replicas: 2 });
        let x4 = GpuNode::shared("x4", "H100", 1, 81559, Sharing::Mps { replicas: 4 });
        let nodes = vec![
            (x2.clone(), Usage::empty(&x2)),
            (x4.clone(), Usage::empty(&x4)),
        ];
        let d = Demand::gpu(GpuDemand::Mps {
            milli: 200,
            memory_mib: None,
        });
        assert_eq!(
            best(&Scorer::new(PackingPolicy::Binpack), &nodes, &d),
            Some("x4")
        );
    }

    #[test]
    fn workload_window_tracks_the_most_common_demand() {
        let mut w = Workload::new(3);
        w.observe(&ts(10));
        w.observe(&ts(20));
        w.observe(&ts(20));
        assert_eq!(w.most_common(), Some(&ts(20)));
        w.observe(&ts(10));
        w.observe(&ts(10));
        // The window holds 3: the first 20 has left, so 10 leads 2 to 1.
        assert_eq!(w.most_common(), Some(&ts(10)));
        w.observe(&ts(20));
        w.observe(&ts(20));
        assert_eq!(w.most_common(), Some(&ts(20)));
    }
}

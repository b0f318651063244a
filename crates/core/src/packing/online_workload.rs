//! The workloads scores are measured against: the most recent demands (the fragmentation
//! gauge's window), and the workload `gpu-share` learns online, handing out target workloads.

use std::collections::{HashMap, VecDeque};

use super::demand::Demand;
use super::frag::{Shape, TargetWorkload};
use super::homes::Homes;

/// The most recent demands (a window, most recent last): the extender's fragmentation gauge
/// measures against the most common of them.
#[derive(Debug, Clone)]
pub struct Workload {
    capacity: usize,
    window: VecDeque<Demand>,
    counts: HashMap<Demand, u32>,
}

impl Workload {
    pub fn new(capacity: usize) -> Self {
        Workload {
            capacity: capacity.max(1),
            window: VecDeque::new(),
            counts: HashMap::new(),
        }
    }

    /// Records one decision's demand.
    pub fn observe(&mut self, demand: &Demand) {
        if self.window.len() == self.capacity
            && let Some(old) = self.window.pop_front()
            && let Some(c) = self.counts.get_mut(&old)
        {
            *c -= 1;
            if *c == 0 {
                self.counts.remove(&old);
            }
        }
        self.window.push_back(demand.clone());
        *self.counts.entry(demand.clone()).or_default() += 1;
    }

    /// The most common demand (ties: the most recent of them).
    pub fn most_common(&self) -> Option<&Demand> {
        let best = self.counts.values().copied().max()?;
        self.window
            .iter()
            .rev()
            .find(|d| self.counts.get(*d) == Some(&best))
    }
}

/// The workload seen so far, as `gpu-share` learns it online: every demand observed counts
/// (it never knows the pods still to come). [`OnlineWorkload::observe`] says when a new target
/// workload is due (after 1, 2, 4, ... observations, then every 1,024), so scores that depend
/// on it stay stable between refreshes and can be cached. [`OnlineWorkload::target`] weighs
/// each shape's count by how scarce its homes are in the cluster ([`Homes::scarcity`]).
#[derive(Debug, Clone, Default)]
pub struct OnlineWorkload {
    index: HashMap<Shape, usize>,
    counts: Vec<(Shape, u64)>,
    total: u64,
}

/// The share of the demands the typical shapes cover (as in the FGD paper).
pub const TYPICAL_COVERAGE: f64 = 0.95;

impl OnlineWorkload {
    /// Counts one demand; true when a refreshed target workload is due.
    pub fn observe(&mut self, demand: &Demand) -> bool {
        let Some(shape) = Shape::of(demand) else {
            return false;
        };
        self.total += 1;
        match self.index.get(&shape) {
            Some(i) => self.counts[*i].1 += 1,
            None => {
                self.index.insert(shape.clone(), self.counts.len());
                self.counts.push((shape, 1));
            }
        }
        let t = self.total;
        (t >= 1 && t.is_power_of_two()) || (t > 1024 && t.is_multiple_of(1024))
    }

    /// The target workload from everything observed so far: each shape's count times its
    /// scarcity in `homes` (with no homes known, plain counts), the heaviest shapes until they
    /// cover [`TYPICAL_COVERAGE`] of the weighted total.
    pub fn target(&self, homes: &Homes) -> TargetWorkload {
        let weights: Vec<(Shape, f64)> = self
            .counts
            .iter()
            .map(|(s, c)| (s.clone(), *c as f64 * homes.scarcity(s)))
            .collect();
        let total = weights.iter().map(|(_, w)| w).sum();
        TargetWorkload::from_weights(weights, total, TYPICAL_COVERAGE)
    }

    pub fn total(&self) -> u64 {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{GpuNode, Sharing};
    use crate::packing::{FragMemo, GpuDemand, PackingPolicy, Scorer, Usage};
    use std::sync::Arc;

    fn node(name: &str, gpus: u32, cpu: u64) -> GpuNode {
        let mut n = GpuNode::whole(name, name, gpus, 0);
        n.sharing = Sharing::PerGpu;
        n.slots = 0;
        n.gpu_memory_mib = None;
        n.cpu_milli = Some(cpu);
        n.memory_mib = Some(1 << 20);
        n
    }

    fn whole(cpu: u64, count: u32) -> Demand {
        Demand {
            cpu_milli: cpu,
            ..Demand::gpu(GpuDemand::Whole { count })
        }
    }

    /// Ten 8-GPU, 96-CPU nodes ("G2") and one 8-GPU, 128-CPU node ("G3"), 88 GPUs; a workload
    /// of 95 one-GPU, 12-CPU pods and 5 eight-GPU, 120-CPU pods (which only G3 holds).
    fn setup() -> (GpuNode, GpuNode, Homes, OnlineWorkload) {
        let g2 = node("G2", 8, 96_000);
        let g3 = node("G3", 8, 128_000);
        let mut nodes = vec![g3.clone()];
        for _ in 0..10 {
            nodes.push(g2.clone());
        }
        let mut o = OnlineWorkload::default();
        for i in 0..100 {
            let d = if i % 20 == 0 {
                whole(120_000, 8)
            } else {
                whole(12_000, 1)
            };
            o.observe(&d);
        }
        (g2, g3, Homes::of(&nodes), o)
    }

    #[test]
    fn a_rare_shape_with_scarce_homes_stays_in_the_target() {
        let (_, _, homes, o) = setup();
        // Counted plainly, the 1-GPU shape alone covers 95%: the large one drops out.
        let plain = o.target(&Homes::default());
        assert_eq!(plain.shapes.len(), 1);
        assert_eq!(plain.shapes[0].0.gpus, 1);
        // Its homes are 8 of 88 GPUs: counted 11^0.75 (about 6.0) times, 30 against 95.
        let t = o.target(&homes);
        assert_eq!(t.shapes.len(), 2);
        let large = t.shapes.iter().find(|(s, _)| s.gpus == 8).unwrap();
        let weighted = 5.0 * 11f64.powf(crate::packing::SCARCITY_EXPONENT);
        assert!(
            (large.1 - weighted / (weighted + 95.0)).abs() < 1e-12,
            "{}",
            large.1
        );
        assert!((t.shapes.iter().map(|(_, p)| p).sum::<f64>() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn a_small_pod_leaves_the_only_home_of_a_large_one_alone() {
        let (g2, g3, homes, o) = setup();
        let pod = whole(12_000, 1);
        let score = |w: TargetWorkload, n: &GpuNode| {
            Scorer::with_workload(PackingPolicy::GpuShare, Arc::new(w))
                .evaluate(n, &Usage::empty(n), &pod, &mut FragMemo::default())
                .unwrap()
                .1
        };
        // Without the scarcity weighting, the CPU-rich G3 looks as good a place as G2 (the CPU
        // of either feeds its GPUs) ...
        let plain = o.target(&Homes::default());
        assert!(score(plain.clone(), &g3) >= score(plain, &g2));
        // ... with it, taking G3's first GPU costs the 8-GPU, 120-CPU shape its only home.
        let t = o.target(&homes);
        assert!(score(t.clone(), &g2) > score(t, &g3));
    }
}

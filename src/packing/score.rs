//! PURE: packing policies. A score is "higher is better" for placing a demand on a node with a
//! given placement; the extender scales scores to 0..=10, the simulator takes the best node.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::{Demand, GPU_MILLI, GpuDemand, Placement, Usage};
use crate::inventory::{GpuNode, MigLayout, Sharing};

/// Packing policies by name (the policy file's `packing.policy`, the simulator's `--policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum PackingPolicy {
    /// Fill partly used nodes and GPUs of the same class first; keep whole nodes and GPUs free.
    Binpack,
    /// The opposite: least used node first.
    Spread,
    /// gpu-share's own policy (the default).
    #[default]
    GpuShare,
}

impl PackingPolicy {
    pub fn name(self) -> &'static str {
        match self {
            PackingPolicy::Binpack => "binpack",
            PackingPolicy::Spread => "spread",
            PackingPolicy::GpuShare => "gpu-share",
        }
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

/// The demands seen recently, most recent last: the online workload estimate (it knows only
/// pods already seen).
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

    pub fn len(&self) -> usize {
        self.window.len()
    }

    pub fn is_empty(&self) -> bool {
        self.window.is_empty()
    }

    /// The most common demand (ties: the most recent of them).
    pub fn most_common(&self) -> Option<&Demand> {
        let best = self.counts.values().copied().max()?;
        self.window
            .iter()
            .rev()
            .find(|d| self.counts.get(*d) == Some(&best))
    }

    /// Demands with their share of the window, most frequent first.
    pub fn shares(&self) -> Vec<(&Demand, f64)> {
        let n = self.window.len().max(1) as f64;
        let mut v: Vec<_> = self
            .counts
            .iter()
            .map(|(d, c)| (d, f64::from(*c) / n))
            .collect();
        v.sort_by(|a, b| {
            b.1.total_cmp(&a.1)
                .then_with(|| format!("{:?}", a.0).cmp(&format!("{:?}", b.0)))
        });
        v
    }
}

/// A packing policy, ready to score placements.
#[derive(Debug, Clone, Copy)]
pub struct Scorer {
    pub policy: PackingPolicy,
}

impl Scorer {
    pub fn new(policy: PackingPolicy) -> Self {
        Scorer { policy }
    }

    /// Scores one placement (higher is better).
    pub fn score(&self, node: &GpuNode, usage: &Usage, demand: &Demand, p: &Placement) -> f64 {
        let fill = fill_after(node, usage, demand, p);
        let gpu_fit = gpu_fit_after(usage, p);
        match self.policy {
            PackingPolicy::Binpack => fill + 0.01 * gpu_fit - replica_waste(node, demand),
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
        }
    }
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
    use crate::packing::{apply, place};

    fn ts(p: u32) -> Demand {
        Demand::gpu(GpuDemand::Timeslice {
            milli: p * 10,
            memory_mib: None,
        })
    }

    fn best<'n>(scorer: &Scorer, nodes: &'n [(GpuNode, Usage)], d: &Demand) -> Option<&'n str> {
        nodes
            .iter()
            .filter_map(|(n, u)| place(scorer, n, u, d).ok().map(|(_, s)| (n, s)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(n, _)| n.name.as_str())
    }

    fn two_ts_nodes() -> Vec<(GpuNode, Usage)> {
        let a = GpuNode::shared("a", "H100", 2, 81559, Sharing::TimeSlicing { replicas: 4 });
        let b = GpuNode::shared("b", "H100", 2, 81559, Sharing::TimeSlicing { replicas: 4 });
        let mut ua = Usage::empty(&a);
        let (p, _) = place(&Scorer::new(PackingPolicy::Binpack), &a, &ua, &ts(30)).unwrap();
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
        let (p, _) = place(&Scorer::new(PackingPolicy::Binpack), &n, &u, &ts(30)).unwrap();
        assert_eq!(p.gpus, vec![(1, 300)]);
        let (p, _) = place(&Scorer::new(PackingPolicy::Spread), &n, &u, &ts(30)).unwrap();
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
        assert_eq!(w.len(), 3);
        assert_eq!(w.most_common(), Some(&ts(10)));
        let shares = w.shares();
        assert_eq!(shares[0].0, &ts(10));
        assert!((shares[0].1 - 2.0 / 3.0).abs() < 1e-9);
    }
}

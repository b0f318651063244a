//! PURE: where each pod shape of a target workload could run, and how scarce those homes are.
//!
//! The fragmentation measure weighs a shape by how often it arrives. That undervalues a shape
//! only a few nodes can ever hold: an 8-GPU, 120-CPU pod that fits only the largest nodes, or a
//! pod pinned to a GPU model the cluster has little of. A placement that uses such a node's last
//! room for it costs the cluster far more than its popularity says, because no other node can
//! take it in. gpu-share's online workload therefore weighs each shape's count by its
//! *scarcity*: the cluster's GPUs over the GPUs of the nodes that could hold the shape when
//! empty, capped at [`MAX_SCARCITY`] and raised to [`SCARCITY_EXPONENT`]. A shape whose homes
//! hold more than half the GPUs is not weighted ([`SCARCE_BELOW`]).
//!
//! A home is judged in the measure's own terms (see [`super::frag`]): enough CPU, at least as
//! many GPUs as the shape asks for, and an allowed GPU model. Only nodes the per-GPU measure
//! models count (nodes without MIG devices).

use std::collections::HashMap;

use super::frag::Shape;
use crate::inventory::{GpuNode, MigLayout};

/// The largest ratio of the cluster's GPUs to a shape's homes' that counts (a shape only 1% of
/// the GPUs can hold).
pub const MAX_SCARCITY: f64 = 100.0;

/// A shape is scarce when the cluster has at least this many times its homes' GPUs (2: its
/// homes hold at most half of them).
/// Shapes most nodes can hold, such as the 8-GPU pods asking 64 or 88 CPUs that four in five of
/// the trace's GPUs can take, need no protecting: weighting them too (1.2 times) cost 0.08
/// points on multigpu40 and 0.87 on pin-sets-33 (docs/packing.md).
pub const SCARCE_BELOW: f64 = 2.0;

/// The weight grows slower than the scarcity: a shape only 5% of the GPUs can hold (the 8-GPU,
/// 120-CPU pods on the trace's G3 nodes) weighs 9.4 times its count, not 20. Fully weighted,
/// gpu-share kept every G3 node for those pods, refusing none where FGD refuses a few, and
/// refused more of everything else.
pub const SCARCITY_EXPONENT: f64 = 0.75;

/// The cluster's nodes as the measure sees them: the GPUs of each kind of node (CPU, GPU count
/// and model). Kinds are keyed, not listed: nodes that differ by a few millicores of allocatable
/// CPU are kinds of their own, so a cluster can have about as many kinds as nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Homes {
    kinds: HashMap<Kind, u64>,
    /// GPUs on every counted node.
    gpus: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Kind {
    cpu_milli: Option<u64>,
    gpus_per_node: u32,
    product: Option<String>,
}

impl Homes {
    /// The homes `nodes` offer.
    pub fn of<'a>(nodes: impl IntoIterator<Item = &'a GpuNode>) -> Self {
        let mut homes = Homes::default();
        for n in nodes {
            homes.add(n);
        }
        homes
    }

    /// Counts one more node (nodes with MIG devices or no GPUs are not homes of any shape).
    pub fn add(&mut self, node: &GpuNode) {
        if node.gpus == 0 || !matches!(node.mig, MigLayout::None) {
            return;
        }
        let gpus = u64::from(node.gpus);
        self.gpus += gpus;
        let kind = Kind {
            cpu_milli: node.cpu_milli,
            gpus_per_node: node.gpus,
            product: node.product.clone(),
        };
        *self.kinds.entry(kind).or_default() += gpus;
    }

    /// GPUs on the nodes that could hold `shape` when empty.
    fn gpus_for(&self, shape: &Shape) -> u64 {
        self.kinds
            .iter()
            .filter(|(k, _)| {
                k.cpu_milli.is_none_or(|c| c >= shape.cpu_milli)
                    && k.gpus_per_node >= shape.gpus
                    && (shape.models.is_empty()
                        || k.product.as_ref().is_some_and(|p| shape.models.contains(p)))
            })
            .map(|(_, gpus)| gpus)
            .sum()
    }

    /// The factor `shape`'s count is weighted by: the cluster's GPUs over the GPUs of its homes
    /// (at most [`MAX_SCARCITY`]), raised to [`SCARCITY_EXPONENT`], when its homes hold at most
    /// 1 / [`SCARCE_BELOW`] of the GPUs. 1 for shapes more nodes can hold, for CPU-only shapes,
    /// for shapes no node can hold (they weigh on every node alike) and when no node is known.
    pub fn scarcity(&self, shape: &Shape) -> f64 {
        if shape.gpus == 0 || self.gpus == 0 {
            return 1.0;
        }
        match self.gpus_for(shape) {
            0 => 1.0,
            homes => {
                let ratio = self.gpus as f64 / homes as f64;
                if ratio < SCARCE_BELOW {
                    1.0
                } else {
                    ratio.min(MAX_SCARCITY).powf(SCARCITY_EXPONENT)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, product: &str, gpus: u32, cpu: u64) -> GpuNode {
        let mut n = GpuNode::whole(name, product, gpus, 0);
        n.cpu_milli = Some(cpu);
        n
    }

    fn shape(gpus: u32, cpu: u64, models: &[&str]) -> Shape {
        Shape {
            cpu_milli: cpu,
            gpus,
            gpu_milli: 1000,
            models: models.iter().map(|m| m.to_string()).collect(),
        }
    }

    /// 90 two-GPU T4 nodes with 104 CPUs (180 GPUs), 9 eight-GPU G2 nodes with 96 CPUs (72),
    /// one eight-GPU G3 node with 128 CPUs (8): 260 GPUs.
    fn cluster() -> Homes {
        let mut nodes = Vec::new();
        for i in 0..90 {
            nodes.push(node(&format!("t4-{i}"), "T4", 2, 104_000));
        }
        for i in 0..9 {
            nodes.push(node(&format!("g2-{i}"), "G2", 8, 96_000));
        }
        nodes.push(node("g3", "G3", 8, 128_000));
        Homes::of(&nodes)
    }

    #[test]
    fn nodes_of_a_kind_are_counted_together() {
        let h = cluster();
        assert_eq!(h.kinds.len(), 3);
        assert_eq!(h.gpus, 260);
        assert_eq!(h.gpus_for(&shape(1, 8000, &[])), 260);
    }

    #[test]
    fn nodes_that_differ_by_a_few_millicores_are_kinds_of_their_own() {
        // Allocatable CPU varies from node to node in real clusters.
        let nodes: Vec<GpuNode> = (0..5000u64)
            .map(|i| node(&format!("n{i}"), "L4", 8, 60_000 + i))
            .collect();
        let h = Homes::of(&nodes);
        assert_eq!(h.kinds.len(), 5000);
        // The 1,000 nodes with at least 64,000 millicores: a fifth of the GPUs.
        assert_eq!(h.gpus_for(&shape(8, 64_000, &[])), 8 * 1000);
        assert!((h.scarcity(&shape(8, 64_000, &[])) - 5f64.powf(SCARCITY_EXPONENT)).abs() < 1e-12);
    }

    #[test]
    fn a_shape_few_nodes_can_hold_weighs_more() {
        let h = cluster();
        // Every node holds a 1-GPU, 8-CPU pod.
        assert_eq!(h.scarcity(&shape(1, 8000, &[])), 1.0);
        let weight = |ratio: f64| ratio.powf(SCARCITY_EXPONENT);
        // 8 GPUs and 88 CPUs: the G2 and G3 nodes, 80 of 260 GPUs.
        assert!((h.scarcity(&shape(8, 88_000, &[])) - weight(260.0 / 80.0)).abs() < 1e-12);
        // 8 GPUs and 120 CPUs: the G3 node only.
        assert!((h.scarcity(&shape(8, 120_000, &[])) - weight(260.0 / 8.0)).abs() < 1e-12);
        assert!(h.scarcity(&shape(8, 120_000, &[])) > h.scarcity(&shape(8, 88_000, &[])));
        // Pinned to G3, any size: the same single node.
        assert!((h.scarcity(&shape(1, 1000, &["G3"])) - weight(260.0 / 8.0)).abs() < 1e-12);
        // A set of models counts the homes of each.
        let pair = h.scarcity(&shape(1, 1000, &["G3", "G2"]));
        assert!((pair - weight(260.0 / 80.0)).abs() < 1e-12);
        // 100 CPUs: the T4 and G3 nodes, 188 of 260 GPUs, more than half: not scarce.
        assert_eq!(h.scarcity(&shape(1, 100_000, &[])), 1.0);
        // Exactly half is scarce.
        let mut half = vec![node("a", "T4", 2, 8000), node("b", "T4", 2, 64_000)];
        let h2 = Homes::of(&half);
        assert_eq!(h2.scarcity(&shape(1, 64_000, &[])), weight(2.0));
        half.push(node("c", "T4", 1, 64_000));
        assert_eq!(Homes::of(&half).scarcity(&shape(1, 64_000, &[])), 1.0);
        // More CPU than any node: no home; it weighs as much as everywhere (1).
        assert_eq!(h.scarcity(&shape(1, 200_000, &[])), 1.0);
        // CPU-only shapes are not weighted.
        assert_eq!(h.scarcity(&shape(0, 1000, &[])), 1.0);
    }

    #[test]
    fn scarcity_is_capped_and_mig_nodes_are_not_homes() {
        let mut nodes = vec![node("one", "A10", 1, 8000)];
        for i in 0..400 {
            nodes.push(node(&format!("big-{i}"), "G2", 8, 96_000));
        }
        let mut mig = node("mig", "A100", 8, 96_000);
        mig.mig = MigLayout::Single {
            profile: "1g.10gb".into(),
            per_gpu: 7,
        };
        nodes.push(mig);
        let h = Homes::of(&nodes);
        assert_eq!(h.gpus, 3201);
        let cap = MAX_SCARCITY.powf(SCARCITY_EXPONENT);
        assert_eq!(h.scarcity(&shape(1, 1000, &["A10"])), cap);
        assert_eq!(h.scarcity(&shape(1, 1000, &["A100"])), 1.0, "no home");
        assert_eq!(Homes::default().scarcity(&shape(1, 1000, &[])), 1.0);
    }
}

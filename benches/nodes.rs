//! The benches' 5,000-node cluster: four kinds of GPU node in a fixed mix, shared by
//! `decision.rs` and `binds.rs`.

use std::collections::BTreeMap;

use gpu_share::inventory::{GpuNode, MigLayout, Sharing};

/// Node `i`: time-sliced H100 (4 in 10), whole A100 (3 in 10), MPS L40S (2 in 10) or MIG A100.
pub fn gpu_node(i: usize) -> GpuNode {
    let name = format!("node-{i:05}");
    match i % 10 {
        0..=3 => GpuNode::shared(
            &name,
            "NVIDIA-H100-80GB-HBM3",
            8,
            81559,
            Sharing::TimeSlicing { replicas: 8 },
        ),
        4..=6 => GpuNode::whole(&name, "NVIDIA-A100-SXM4-80GB", 8, 81920),
        7..=8 => GpuNode::shared(&name, "NVIDIA-L40S", 4, 46068, Sharing::Mps { replicas: 4 }),
        _ => {
            let mut n = GpuNode::whole(&name, "NVIDIA-A100-SXM4-80GB", 0, 81920);
            n.slots = 0;
            n.mig = MigLayout::Mixed {
                instances: BTreeMap::from([("1g.10gb".into(), 14), ("3g.40gb".into(), 4)]),
            };
            n
        }
    }
}

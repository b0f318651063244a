//! PURE: what a GPU node advertises of [`RESOURCE_GPU_MILLI`].
//!
//! kube-scheduler is told to ignore the quantity (`managedResources`, `ignoredByScheduler`):
//! gpu-share's extender decides where GPUs fit. Two parts of Kubernetes still read it against
//! the node:
//! - kube-scheduler's queueing hint for node events (`noderesources` `isSchedulableAfterNodeChange`
//!   -> `isFit`, which ignores nothing): a pod waiting for GPUs is woken by a node's change only
//!   if the node advertises every resource the pod requests;
//! - kubelet's admission, which drops an extended resource its node does not advertise
//!   (`removeMissingExtendedResources`) and checks one it does against what the node's pods
//!   hold.
//!
//! So every GPU node advertises its physical GPUs in thousandths. That is a true bound: gpu-share
//! never places more than a GPU's worth on one GPU, and a pod's quantity is never more than
//! what it holds (a share its percentage, a whole GPU 1000, a MIG device its compute sevenths
//! rounded down, which is what the ledger counts for the device too).

use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};

use crate::inventory::GpuNode;
use crate::request::RESOURCE_GPU_MILLI;

/// What `node` should advertise: its physical GPUs, in thousandths.
pub fn capacity(node: &GpuNode) -> u64 {
    u64::from(node.physical_gpus()) * u64::from(crate::mig::GPU_MILLI)
}

/// What a node advertises of the quantity now (its status capacity); `None` when it does not.
pub fn advertised(node: &Node) -> Option<u64> {
    let status = node.status.as_ref()?;
    status
        .capacity
        .as_ref()?
        .get(RESOURCE_GPU_MILLI)
        .and_then(|q| crate::inventory::quantity_count(&q.0))
}

/// The merge patch of a node's status that advertises `milli`: capacity, and allocatable (which
/// kubelet would derive from capacity at its next status update; a node without a kubelet, or
/// before that update, has it at once).
pub fn status_patch(milli: u64) -> Value {
    let q = milli.to_string();
    json!({"status": {
        "capacity": {RESOURCE_GPU_MILLI: q},
        "allocatable": {RESOURCE_GPU_MILLI: q},
    }})
}

/// The nodes whose advertisement is not what it should be (`desired`: each GPU node and its
/// [`capacity`]; `seen`: what each advertises now), with the value each should have. A node
/// with no GPU left is not in `desired` and keeps what it advertises: it takes no gpu-share pod,
/// and a pod admitted under the old value is never refused by taking it away.
pub fn due<'a>(
    desired: impl IntoIterator<Item = (&'a str, u64)>,
    seen: impl Fn(&str) -> Option<u64>,
) -> Vec<(String, u64)> {
    desired
        .into_iter()
        .filter(|(name, milli)| *milli > 0 && seen(name) != Some(*milli))
        .map(|(name, milli)| (name.to_string(), milli))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{MigLayout, Sharing};

    /// A node's physical GPUs in thousandths, whatever its mode: whole, replicas of the device
    /// plugin, per GPU, and MIG by either strategy (the seven 1g slices of a GPU, each 142,
    /// stay within its 1000).
    #[test]
    fn a_node_advertises_its_physical_gpus_in_thousandths() {
        let whole = GpuNode::whole("a", "NVIDIA-H100-80GB-HBM3", 8, 81559);
        assert_eq!(capacity(&whole), 8000);
        let replicas = GpuNode::shared(
            "b",
            "NVIDIA-A100-SXM4-80GB",
            4,
            81920,
            Sharing::TimeSlicing { replicas: 4 },
        );
        assert_eq!(capacity(&replicas), 4000, "replicas are not GPUs");
        let mig = GpuNode {
            gpus: 0,
            slots: 0,
            mig: MigLayout::Mixed {
                instances: [("1g.10gb".to_string(), 14)].into(),
            },
            labelled_gpus: Some(2),
            ..GpuNode::whole("c", "NVIDIA-A100-SXM4-80GB", 0, 81920)
        };
        assert_eq!(capacity(&mig), 2000);
        let one_g = crate::request::GpuRequest::parse_normalized("mig-1g.10gb").unwrap();
        assert!(7 * u64::from(one_g.gpu_milli()) <= 1000);
        let none = GpuNode::whole("d", "x", 0, 0);
        assert_eq!(capacity(&none), 0);
    }

    #[test]
    fn what_a_node_advertises_is_read_from_its_capacity() {
        let node = |capacity: Value| -> Node {
            serde_json::from_value(json!({"metadata": {"name": "n"},
                "status": {"capacity": capacity}}))
            .unwrap()
        };
        assert_eq!(
            advertised(&node(json!({"gpu-share.io/gpu-milli": "8000"}))),
            Some(8000)
        );
        assert_eq!(advertised(&node(json!({"nvidia.com/gpu": "8"}))), None);
        assert_eq!(
            advertised(&serde_json::from_value(json!({"metadata": {"name": "n"}})).unwrap()),
            None
        );
        let patch = status_patch(4000);
        assert_eq!(
            patch["status"]["capacity"]["gpu-share.io/gpu-milli"],
            "4000"
        );
        assert_eq!(
            patch["status"]["allocatable"]["gpu-share.io/gpu-milli"],
            "4000"
        );
    }

    /// Patched: a node that advertises nothing (new, or re-registered by its kubelet) or another
    /// value (its GPUs changed). Not: one already right, or one with no GPU.
    #[test]
    fn only_nodes_advertising_another_value_are_due() {
        let seen = |n: &str| match n {
            "right" => Some(8000),
            "changed" => Some(4000),
            "gone" => Some(8000),
            _ => None,
        };
        let due = due(
            [
                ("right", 8000),
                ("changed", 8000),
                ("new", 2000),
                ("no-gpu", 0),
            ],
            seen,
        );
        assert_eq!(
            due,
            [("changed".to_string(), 8000), ("new".to_string(), 2000)]
        );
    }
}

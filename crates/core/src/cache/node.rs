//! PURE: the nodes as the API shows them, one [`NodeFacts`] each.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::core::v1::{Node, Taint};

use crate::inventory::{self, GpuNode};

/// What the extender knows of one node, read from its Node object alone ([`NodeFacts::read`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeFacts {
    /// Its labels: the explainer reads pods' node constraints against them.
    pub labels: BTreeMap<String, String>,
    /// Its `PreferNoSchedule` taints, as `key=value`, sorted: filter passes one node of a tie
    /// only where the tied nodes' are alike ([`soft_taints`]).
    pub soft_taints: Vec<String>,
    /// Whether a `nodeModes` rule declares the node `time-slicing` (on a DRA node, the opt-in for
    /// time-sliced shares, [`crate::dra::DraView::gpu_node`]): kept here alone.
    pub shares_declared: bool,
    /// Cordoned (`spec.unschedulable`): kube-scheduler places nothing new there.
    pub cordoned: bool,
}

impl NodeFacts {
    /// Reads a node, under the policy's reading of its labels: its facts, and the GPUs a device
    /// plugin serves there as the inventory reads them (`None`: none; NVIDIA's DRA driver may
    /// still publish some, [`crate::dra`]). The ledger keeps the inventory
    /// ([`crate::ledger::NodeLedger`]), the [`Nodes`] the rest.
    pub fn read(node: &Node, reading: &inventory::Reading) -> (NodeFacts, Option<GpuNode>) {
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let spec = node.spec.as_ref();
        let facts = NodeFacts {
            shares_declared: inventory::declares_time_slicing(&labels, &reading.declared),
            soft_taints: soft_taints(spec.and_then(|s| s.taints.as_deref())),
            cordoned: spec.and_then(|s| s.unschedulable).unwrap_or(false),
            labels,
        };
        (facts, inventory::read_node(node, reading))
    }

    /// A node known by name alone (`--dev`'s `--nodes`, a request's node names): no labels, no
    /// GPUs.
    pub fn named() -> NodeFacts {
        NodeFacts::default()
    }
}

/// A node's `PreferNoSchedule` taints, as `key=value`, sorted: two nodes with the same list score
/// alike in kube-scheduler's TaintToleration, whatever the pod tolerates. Empty for most nodes.
pub fn soft_taints(taints: Option<&[Taint]>) -> Vec<String> {
    let mut out: Vec<String> = taints
        .into_iter()
        .flatten()
        .filter(|t| t.effect == "PreferNoSchedule")
        .map(|t| format!("{}={}", t.key, t.value.as_deref().unwrap_or_default()))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Every node the API shows, by name.
#[derive(Debug, Default)]
pub struct Nodes {
    by_name: HashMap<String, NodeFacts>,
}

impl Nodes {
    /// A node added or changed.
    pub fn apply(&mut self, name: &str, facts: NodeFacts) {
        match self.by_name.get_mut(name) {
            Some(f) => *f = facts,
            None => {
                self.by_name.insert(name.to_string(), facts);
            }
        }
    }

    /// A node deleted: whether it was known.
    pub fn delete(&mut self, name: &str) -> bool {
        self.by_name.remove(name).is_some()
    }

    /// A relist showed the nodes `listed` (applied one by one before): every other node is gone.
    /// Their names, sorted.
    pub fn reset(&mut self, listed: &HashSet<String>) -> Vec<String> {
        let mut gone: Vec<String> = self
            .by_name
            .keys()
            .filter(|n| !listed.contains(*n))
            .cloned()
            .collect();
        for n in &gone {
            self.by_name.remove(n);
        }
        gone.sort();
        gone
    }

    pub fn get(&self, name: &str) -> Option<&NodeFacts> {
        self.by_name.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &NodeFacts)> {
        self.by_name.iter()
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(v: serde_json::Value) -> Node {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_node_is_read_in_one_place() {
        let n = node(serde_json::json!({
            "metadata": {"name": "g1", "labels": {
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                "nvidia.com/gpu.count": "2", "pool": "a"}},
            "spec": {"unschedulable": true, "taints": [
                {"key": "b", "value": "2", "effect": "PreferNoSchedule"},
                {"key": "gpu", "effect": "NoSchedule"},
                {"key": "a", "effect": "PreferNoSchedule"}]},
            "status": {"allocatable": {"nvidia.com/gpu": "2"}}
        }));
        let (f, inventory) = NodeFacts::read(&n, &inventory::Reading::default());
        assert_eq!(f.labels.get("pool").map(String::as_str), Some("a"));
        assert_eq!(f.soft_taints, ["a=", "b=2"]);
        assert!(soft_taints(None).is_empty());
        assert!(f.cordoned);
        assert!(!f.shares_declared);
        assert_eq!(inventory.map(|g| g.gpus), Some(2));
        let (plain, none) = NodeFacts::read(
            &node(serde_json::json!({"metadata": {"name": "cpu"}})),
            &inventory::Reading::default(),
        );
        assert_eq!((plain, none), (NodeFacts::default(), None));
    }

    #[test]
    fn a_relist_removes_every_node_it_did_not_show() {
        let mut nodes = Nodes::default();
        nodes.apply("gpu", NodeFacts::named());
        nodes.apply(
            "cpu",
            NodeFacts {
                soft_taints: vec!["a=".into()],
                ..NodeFacts::named()
            },
        );
        nodes.apply("kept", NodeFacts::named());
        assert_eq!(
            nodes.reset(&HashSet::from(["kept".to_string()])),
            ["cpu", "gpu"]
        );
        assert_eq!(nodes.len(), 1);
        assert!(nodes.get("cpu").is_none());
        assert!(nodes.delete("kept"));
        assert!(!nodes.delete("kept"));
        assert!(nodes.is_empty());
    }
}

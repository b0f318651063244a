//! PURE: the nodes as the API shows them, one [`NodeFacts`] each.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::core::v1::{Node, Taint, Toleration};

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
    /// Its `NoSchedule` and `NoExecute` taints: kube-scheduler's TaintToleration passes only pods
    /// that tolerate each ([`NodeFacts::tolerated_by`]).
    pub hard_taints: Vec<Taint>,
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
            hard_taints: spec
                .and_then(|s| s.taints.as_deref())
                .into_iter()
                .flatten()
                .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
                .cloned()
                .collect(),
            labels,
        };
        (facts, inventory::read_node(node, reading))
    }

    /// Whether a pod with these tolerations may be placed here, as kube-scheduler's
    /// TaintToleration and NodeUnschedulable plugins judge: each `NoSchedule` and `NoExecute`
    /// taint tolerated, and, when cordoned, the `node.kubernetes.io/unschedulable` taint too.
    pub fn tolerated_by(&self, tolerations: &[Toleration]) -> bool {
        let tolerated = |key: &str, value: &str, effect: &str| {
            tolerations.iter().any(|t| matches(t, key, value, effect))
        };
        self.hard_taints.iter().all(|taint| {
            tolerated(
                &taint.key,
                taint.value.as_deref().unwrap_or_default(),
                &taint.effect,
            )
        }) && (!self.cordoned || tolerated(UNSCHEDULABLE, "", "NoSchedule"))
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

/// The taint a cordoned node carries (kube-scheduler's NodeUnschedulable reads
/// `spec.unschedulable` as this taint).
pub const UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";

/// Whether one toleration tolerates one taint, as Kubernetes matches them: the same effect (or
/// none named), the same key (or none named, with `Exists`), and the same value under `Equal` (the
/// default operator) or any value under `Exists`.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    matches(
        toleration,
        &taint.key,
        taint.value.as_deref().unwrap_or_default(),
        &taint.effect,
    )
}

/// [`tolerates`] over a taint's parts (a cordon's taint is never built).
fn matches(toleration: &Toleration, key: &str, value: &str, effect: &str) -> bool {
    let wanted = toleration.effect.as_deref().unwrap_or_default();
    if !wanted.is_empty() && wanted != effect {
        return false;
    }
    let named = toleration.key.as_deref().unwrap_or_default();
    if !named.is_empty() && named != key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => toleration.value.as_deref().unwrap_or_default() == value,
        _ => false,
    }
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
        assert_eq!(
            f.hard_taints
                .iter()
                .map(|t| t.key.as_str())
                .collect::<Vec<_>>(),
            ["gpu"]
        );
        assert!(!f.shares_declared);
        assert_eq!(inventory.map(|g| g.gpus), Some(2));
        let (plain, none) = NodeFacts::read(
            &node(serde_json::json!({"metadata": {"name": "cpu"}})),
            &inventory::Reading::default(),
        );
        assert_eq!((plain, none), (NodeFacts::default(), None));
    }

    fn toleration(v: serde_json::Value) -> Toleration {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn taints_are_tolerated_as_kubernetes_matches_them() {
        let taint = |key: &str, value: Option<&str>, effect: &str| Taint {
            key: key.into(),
            value: value.map(Into::into),
            effect: effect.into(),
            ..Taint::default()
        };
        let gpu = taint("nvidia.com/gpu", Some("present"), "NoSchedule");
        let cases = [
            (
                serde_json::json!({"key": "nvidia.com/gpu", "operator": "Exists"}),
                true,
            ),
            (
                serde_json::json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}),
                true,
            ),
            (
                serde_json::json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}),
                false,
            ),
            (
                serde_json::json!({"key": "nvidia.com/gpu", "value": "present"}),
                true,
            ),
            (
                serde_json::json!({"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"}),
                false,
            ),
            (serde_json::json!({"key": "nvidia.com/gpu"}), false),
            (serde_json::json!({"operator": "Exists"}), true),
            (
                serde_json::json!({"key": "other", "operator": "Exists"}),
                false,
            ),
        ];
        for (t, want) in cases {
            assert_eq!(tolerates(&toleration(t.clone()), &gpu), want, "{t}");
        }
        let node = NodeFacts {
            hard_taints: vec![gpu, taint("pool", Some("defrag"), "NoExecute")],
            ..NodeFacts::named()
        };
        let gpu_only = [toleration(
            serde_json::json!({"key": "nvidia.com/gpu", "operator": "Exists"}),
        )];
        assert!(
            !node.tolerated_by(&gpu_only),
            "every taint must be tolerated"
        );
        assert!(!node.tolerated_by(&[]));
        let both = [
            gpu_only[0].clone(),
            toleration(
                serde_json::json!({"key": "pool", "value": "defrag", "effect": "NoExecute"}),
            ),
        ];
        assert!(node.tolerated_by(&both));
        assert!(
            NodeFacts::named().tolerated_by(&[]),
            "an untainted node takes any pod"
        );
        let cordoned = NodeFacts {
            cordoned: true,
            ..NodeFacts::named()
        };
        assert!(!cordoned.tolerated_by(&both));
        assert!(cordoned.tolerated_by(&[toleration(
            serde_json::json!({"key": UNSCHEDULABLE, "operator": "Exists", "effect": "NoSchedule"})
        )]));
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

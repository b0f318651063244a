//! Why a gpu-share pod waits, when kube-scheduler never asked gpu-share.
//!
//! kube-scheduler asks the extender only about the nodes its own plugins pass. When every node
//! fails them (a time-sliced GPU whose replicas are all taken is "Insufficient nvidia.com/gpu"
//! to NodeResourcesFit), the pod's FailedScheduling event has no word from gpu-share. The pod
//! watch sees such a pod (Unschedulable, a message without gpu-share's reasons); the explainer
//! then weighs the pod against the GPU nodes its nodeSelector and required node affinity allow,
//! with the same fit as filter, and records a Warning event `GpuShareUnschedulable` on the pod
//! saying, node by node, why none has room. The pod is not nudged: kube-scheduler requeues pods
//! its own plugins refused when capacity frees. One event per distinct kube-scheduler message. (The task that writes the events is `sync::spawn_explainer`.)

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, Pod, PodSpec};
use tokio::sync::mpsc;

use crate::cache::{NodeFacts, Nodes};
use crate::ledger;
use crate::packing::Reason;
use crate::sync::lock;

/// The event's reason.
pub const EVENT_REASON: &str = "GpuShareUnschedulable";
/// How many pods may wait for an explanation; beyond it new ones are dropped (a later change of
/// their condition brings them back).
const QUEUE: usize = 1024;
/// How often a pod is weighed again when a GPU node seems to have room for it (the ledger may
/// not have seen the binds kube-scheduler already counted), and how long apart.
pub const RETRIES: u8 = 3;
pub const RETRY_AFTER: Duration = Duration::from_secs(2);

/// A pod to explain, and how many times it was weighed already.
pub type Queued = (Arc<Pod>, u8);

/// What the explainer keeps: which kube-scheduler message each pod was last explained for, and
/// where to send the next one. It reads pods' node constraints against the nodes' labels
/// ([`crate::cache::NodeFacts::labels`]).
pub struct Explainer {
    explained: moka::sync::Cache<String, String>,
    queue: Mutex<Option<mpsc::Sender<Queued>>>,
}

impl Default for Explainer {
    fn default() -> Self {
        Explainer {
            explained: moka::sync::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(Duration::from_secs(3600))
                .build(),
            queue: Mutex::new(None),
        }
    }
}

impl Explainer {
    /// The pods to explain, from now on.
    pub fn subscribe(&self) -> mpsc::Receiver<Queued> {
        let (tx, rx) = mpsc::channel(QUEUE);
        *lock(&self.queue) = Some(tx);
        rx
    }

    /// A pod seen by the watch: queued when kube-scheduler refused it without gpu-share's word
    /// and this refusal was not explained yet.
    pub fn consider(&self, pod: &Pod) {
        let Some(message) = unexplained_refusal(pod) else {
            return;
        };
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        if self.explained.get(&uid).as_deref() == Some(message.as_str()) {
            return;
        }
        if self.send((Arc::new(pod.clone()), 0)) {
            self.explained.insert(uid, message);
        }
    }

    /// Queues a pod (again); false when the queue is full or nobody listens.
    pub fn send(&self, queued: Queued) -> bool {
        lock(&self.queue)
            .as_ref()
            .is_some_and(|tx| tx.try_send(queued).is_ok())
    }
}

/// The nodes the pod's nodeSelector picks, whatever its node affinity says (the affinity
/// gpu-share writes for shares names GFD labels a DRA node never has), sorted.
pub fn selected_by_node_selector(nodes: &Nodes, spec: &PodSpec) -> Vec<String> {
    let mut names: Vec<String> = nodes
        .iter()
        .filter(|(_, f)| {
            spec.node_selector
                .as_ref()
                .is_none_or(|s| s.iter().all(|(k, v)| f.labels.get(k) == Some(v)))
        })
        .map(|(name, _)| name.clone())
        .collect();
    names.sort();
    names
}

/// The nodes kube-scheduler's own placement rules leave a pod: its nodeSelector and required
/// node affinity allow them, and it tolerates their taints (and their cordon), sorted.
pub fn candidates(nodes: &Nodes, spec: &PodSpec) -> Vec<String> {
    let mut names: Vec<String> = nodes
        .iter()
        .filter(|(name, f)| open_to(spec, name, f))
        .map(|(name, _)| name.clone())
        .collect();
    names.sort();
    names
}

/// The kube-scheduler message of a gpu-share pod refused without a word from gpu-share: it
/// waits for a node, its PodScheduled condition is False for Unschedulable, and the message
/// gives none of gpu-share's reasons.
pub fn unexplained_refusal(pod: &Pod) -> Option<String> {
    let asks = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(crate::request::ANNOTATION_REQUEST));
    if !asks || !ledger::waits_for_a_node(pod) {
        return None;
    }
    let condition = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled")?;
    if condition.status != "False" || condition.reason.as_deref() != Some("Unschedulable") {
        return None;
    }
    let message = condition.message.clone().unwrap_or_default();
    (!Reason::all_messages().any(|m| message.contains(m))).then_some(message)
}

/// Whether a node is open to a pod under kube-scheduler's own placement rules: its nodeSelector
/// and required node affinity ([`selects`]), the node's `NoSchedule` and `NoExecute` taints, and
/// a cordon ([`NodeFacts::tolerated_by`]).
pub fn open_to(spec: &PodSpec, name: &str, facts: &NodeFacts) -> bool {
    selects(spec, name, &facts.labels)
        && facts.tolerated_by(spec.tolerations.as_deref().unwrap_or_default())
}

/// Whether a node (its name and labels) passes a pod's nodeSelector and required node affinity,
/// as kube-scheduler's NodeAffinity plugin reads them.
pub fn selects(spec: &PodSpec, name: &str, labels: &BTreeMap<String, String>) -> bool {
    let selector_ok = spec
        .node_selector
        .as_ref()
        .is_none_or(|s| s.iter().all(|(k, v)| labels.get(k) == Some(v)));
    let affinity_ok = ledger::required_node_terms(spec).is_none_or(|terms| {
        terms.iter().any(|t| {
            let exprs = t.match_expressions.as_deref().unwrap_or_default();
            let fields = t.match_fields.as_deref().unwrap_or_default();
            // An empty term selects nothing.
            !(exprs.is_empty() && fields.is_empty())
                && exprs.iter().all(|e| holds(e, labels.get(&e.key)))
                && fields
                    .iter()
                    .all(|e| e.key == "metadata.name" && holds(e, Some(&name.to_string())))
        })
    });
    selector_ok && affinity_ok
}

fn holds(e: &NodeSelectorRequirement, value: Option<&String>) -> bool {
    let values = e.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match e.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (
                value.and_then(|v| number(v)),
                values.first().and_then(|b| number(b)),
            ) else {
                return false;
            };
            if e.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

/// The event's note: why none of the candidate nodes has room, grouped by reason (most nodes
/// first) with up to three node names each. `None` when a node fits (the pod waits for
/// something else than GPUs: kube-scheduler's message says what).
pub fn explanation(class: &str, verdicts: &[(String, Result<(), Reason>)]) -> Option<String> {
    if verdicts.is_empty() {
        return Some(format!(
            "gpu-share: no GPU node is left to this {class} pod by its nodeSelector, node affinity and tolerations"
        ));
    }
    if verdicts.iter().any(|(_, v)| v.is_ok()) {
        return None;
    }
    let mut groups: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for (node, v) in verdicts {
        if let Err(r) = v {
            groups.entry(r.message()).or_default().push(node);
        }
    }
    let mut groups: Vec<(String, Vec<&str>)> = groups.into_iter().collect();
    groups.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
    let parts: Vec<String> = groups
        .iter()
        .map(|(why, nodes)| {
            let mut shown = nodes.iter().take(3).copied().collect::<Vec<_>>().join(", ");
            if nodes.len() > 3 {
                shown.push_str(&format!(", and {} more", nodes.len() - 3));
            }
            format!("{} {why} ({shown})", nodes.len())
        })
        .collect();
    Some(format!(
        "gpu-share: 0/{} GPU nodes can take this {class} pod: {}",
        verdicts.len(),
        parts.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> PodSpec {
        let mut s = json!({"containers": [{"name": "c"}]});
        for (k, x) in v.as_object().unwrap() {
            s[k] = x.clone();
        }
        serde_json::from_value(s).unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn node_selectors_and_required_affinity_are_read_as_kube_scheduler_reads_them() {
        let n = labels(&[
            ("kubernetes.io/hostname", "a"),
            ("nvidia.com/gpu.sharing-strategy", "mps"),
            ("nvidia.com/gpu.count", "4"),
        ]);
        assert!(selects(&spec(json!({})), "a", &n));
        assert!(selects(
            &spec(json!({"nodeSelector": {"kubernetes.io/hostname": "a"}})),
            "a",
            &n
        ));
        assert!(!selects(
            &spec(json!({"nodeSelector": {"kubernetes.io/hostname": "b"}})),
            "a",
            &n
        ));
        let affinity = |terms: serde_json::Value| {
            spec(
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}}),
            )
        };
        let term = |key: &str, op: &str, values: &[&str]| json!({"matchExpressions": [{"key": key, "operator": op, "values": values}]});
        assert!(selects(
            &affinity(json!([term(
                "nvidia.com/gpu.sharing-strategy",
                "In",
                &["mps"]
            )])),
            "a",
            &n
        ));
        assert!(!selects(
            &affinity(json!([term(
                "nvidia.com/gpu.sharing-strategy",
                "NotIn",
                &["mps"]
            )])),
            "a",
            &n
        ));
        // Terms are alternatives.
        assert!(selects(
            &affinity(json!([
                term("x", "Exists", &[]),
                term("nvidia.com/gpu.count", "Gt", &["3"])
            ])),
            "a",
            &n
        ));
        assert!(!selects(
            &affinity(json!([term("nvidia.com/gpu.count", "Lt", &["3"])])),
            "a",
            &n
        ));
        assert!(selects(
            &affinity(json!([term("x", "DoesNotExist", &[])])),
            "a",
            &n
        ));
        assert!(selects(
            &affinity(
                json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]}])
            ),
            "a",
            &n
        ));
        assert!(!selects(
            &affinity(
                json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}])
            ),
            "a",
            &n
        ));
        assert!(
            !selects(&affinity(json!([{}])), "a", &n),
            "an empty term selects nothing"
        );
    }

    /// kube-scheduler's TaintToleration and NodeUnschedulable leave out a node whose taint the pod
    /// does not tolerate, or a cordoned one: the explainer weighs neither (a node there with room
    /// would otherwise keep it silent).
    #[test]
    fn taints_and_cordons_leave_a_node_out_as_kube_scheduler_does() {
        let mut nodes = Nodes::default();
        let facts = |v: serde_json::Value| -> NodeFacts {
            let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(v).unwrap();
            NodeFacts::read(&node, &crate::inventory::Reading::default()).0
        };
        nodes.apply("plain", facts(json!({"metadata": {"name": "plain"}})));
        nodes.apply(
            "tainted",
            facts(json!({"metadata": {"name": "tainted"}, "spec": {"taints": [
                {"key": "gpu-share.io/test", "value": "defrag", "effect": "NoSchedule"},
                {"key": "soft", "effect": "PreferNoSchedule"}]}})),
        );
        nodes.apply(
            "draining",
            facts(
                json!({"metadata": {"name": "draining"}, "spec": {"taints": [
                {"key": "maintenance", "effect": "NoExecute"}]}}),
            ),
        );
        nodes.apply(
            "cordoned",
            facts(json!({"metadata": {"name": "cordoned"}, "spec": {"unschedulable": true}})),
        );
        assert_eq!(candidates(&nodes, &spec(json!({}))), ["plain"]);
        let tolerant = spec(json!({"tolerations": [
            {"key": "gpu-share.io/test", "operator": "Equal", "value": "defrag", "effect": "NoSchedule"},
            {"key": "maintenance", "operator": "Exists"}]}));
        assert_eq!(
            candidates(&nodes, &tolerant),
            ["draining", "plain", "tainted"]
        );
        let everything = spec(json!({"tolerations": [{"operator": "Exists"}]}));
        assert_eq!(
            candidates(&nodes, &everything),
            ["cordoned", "draining", "plain", "tainted"]
        );
    }

    #[test]
    fn the_note_groups_nodes_by_reason_and_stays_silent_when_a_node_fits() {
        let v = |n: &str, r: Result<(), Reason>| (n.to_string(), r);
        let verdicts = vec![
            v("ts", Err(Reason::NoFreeReplica)),
            v("m1", Err(Reason::NoMig)),
            v("m2", Err(Reason::NoMig)),
            v("m3", Err(Reason::NoMig)),
            v("m4", Err(Reason::NoMig)),
        ];
        let note = explanation("timeslice", &verdicts).unwrap();
        assert_eq!(
            note,
            "gpu-share: 0/5 GPU nodes can take this timeslice pod: 4 node has no MIG devices; pod asks MIG (m1, m2, m3, and 1 more); 1 no free GPU replica on this node (ts)"
        );
        let mut fits = verdicts.clone();
        fits.push(v("free", Ok(())));
        assert_eq!(explanation("timeslice", &fits), None);
        assert!(
            explanation("mps", &[])
                .unwrap()
                .contains("no GPU node is left to this mps pod")
        );
    }

    #[test]
    fn only_refusals_without_gpu_shares_word_are_explained() {
        let pod = |message: &str, request: bool| -> Pod {
            let annotations = if request {
                json!({"gpu-share": "mps-25", "gpu-share.io/request": "mps-25"})
            } else {
                json!({})
            };
            serde_json::from_value(json!({
                "metadata": {"name": "p", "namespace": "n", "uid": "u", "annotations": annotations},
                "spec": {"containers": [{"name": "c"}]},
                "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]},
            }))
            .unwrap()
        };
        let kube = "0/5 nodes are available: 1 Insufficient nvidia.com/gpu, 4 node(s) didn't match Pod's node affinity/selector.";
        assert_eq!(unexplained_refusal(&pod(kube, true)).as_deref(), Some(kube));
        assert_eq!(unexplained_refusal(&pod(kube, false)), None);
        let ours = "0/5 nodes are available: 1 no free GPU replica on this node, 4 node(s) didn't match Pod's node affinity/selector.";
        assert_eq!(unexplained_refusal(&pod(ours, true)), None);
        // Explained once per message.
        let e = Explainer::default();
        let mut rx = e.subscribe();
        e.consider(&pod(kube, true));
        e.consider(&pod(kube, true));
        assert_eq!(rx.try_recv().map(|(_, attempt)| attempt), Ok(0));
        assert!(rx.try_recv().is_err());
        e.consider(&pod("0/5 nodes are available: 5 Insufficient cpu.", true));
        assert!(rx.try_recv().is_ok());
    }
}

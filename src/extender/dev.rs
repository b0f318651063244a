//! `--dev`'s source. With no cluster to watch, the verbs' requests are what the cache learns
//! from, as a cluster's watches feed it: the nodes a request carries whole, whether a pod's
//! request annotation is contradicted by its limits, and whether filter found it no node (a
//! pending pod). In a cluster none of this runs: the node and pod watches keep the same facts.
//! The verbs decide the same way under either source.

use k8s_openapi::api::core::v1::Node;

use super::pending::{Found, Unscheduled, bounded};
use super::state::ExtenderState;
use super::wire::ExtenderArgs;
use crate::ledger;

/// Learns the nodes a request carries whole (kube-scheduler sends them without
/// `nodeCacheCapable`).
pub fn learn_nodes(ext: &ExtenderState, args: &ExtenderArgs, reading: &crate::inventory::Reading) {
    use serde::Deserialize;
    let Some(list) = &args.nodes else {
        return;
    };
    let nodes: Vec<Node> = list
        .items
        .iter()
        .filter_map(|i| Node::deserialize(i).ok())
        .collect();
    ext.learn_nodes(&nodes, reading);
}

/// A pod as filter is asked about it.
pub struct Asked {
    uid: String,
    namespace: String,
    name: String,
}

/// Notes what a pod watch would of the pod a filter asks about: whether its request annotation
/// is contradicted by its limits. The pod, to note filter's outcome for.
pub fn asked(ext: &ExtenderState, args: &ExtenderArgs) -> Option<Asked> {
    let pod = args.pod.as_ref()?;
    let uid = pod.metadata.uid.clone()?;
    ext.note_contradicted(&uid, ledger::request_contradiction(pod).is_some());
    Some(Asked {
        uid,
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
    })
}

/// Counts a gpu-share pod filter found no node for as pending, with why; one it found a node
/// for no longer is.
pub fn filtered(ext: &ExtenderState, pod: Asked, found: &Found) {
    match found {
        Found::Nodes => ext.clear_unscheduled(&pod.uid),
        Found::None { class, why } => ext.note_unscheduled(
            &pod.uid,
            Unscheduled {
                namespace: pod.namespace,
                name: pod.name,
                class,
                since: std::time::SystemTime::now(),
                reason: Some(bounded(why)),
            },
        ),
    }
}

//! Warnings about a node that are worth saying once per process, not at every read.

use std::collections::HashSet;
use std::sync::Mutex;

type Warned = Mutex<Option<HashSet<String>>>;

/// Whether this is the first time (per process) `node` is warned about under `set`.
fn first_warning(set: &Warned, node: &str) -> bool {
    crate::sync::lock(set)
        .get_or_insert_with(Default::default)
        .insert(node.to_string())
}

/// Warns once per node (per process) that its sharing mode is a guess.
pub(super) fn warn_unverified_once(node: &str) {
    static WARNED: Warned = Mutex::new(None);
    if first_warning(&WARNED, node) {
        tracing::warn!(
            node,
            "no GPU Feature Discovery or GKE labels say how this node's GPUs are shared, and no nodeModes rule of the policy matches it: gpu-share takes each nvidia.com/gpu as a whole, unshared GPU (exclusive pods only); if the device plugin shares them (time-slicing, MPS, MIG single), install GPU Feature Discovery (the GPU Operator does) or declare the mode in the policy's nodeModes, or gpu-share may overcommit them"
        );
    }
}

/// Warns once per node (per process) that its instance type says it advertises replicas.
pub(super) fn warn_instance_shared_once(
    node: &str,
    instance_type: &str,
    gpus: u32,
    advertised: u32,
    replicas: u32,
) {
    static WARNED: Warned = Mutex::new(None);
    if first_warning(&WARNED, node) {
        tracing::warn!(
            node,
            instance_type,
            "the node advertises {advertised} nvidia.com/gpu, and its instance type {instance_type} has {gpus} GPUs: its device plugin shares each GPU {replicas} ways (time-slicing or MPS), which no GPU Feature Discovery label says; gpu-share reads it as time-sliced and places no whole-GPU pod there (declare its mode in the policy's nodeModes to place shares there)"
        );
    }
}

/// Warns once per node (per process) that no pod of its class can use it.
pub(super) fn warn_unreached_once(node: &str, resource: &str, sentence: &str) {
    static WARNED: Warned = Mutex::new(None);
    if first_warning(&WARNED, node) {
        tracing::warn!(node, resource, "{sentence}");
    }
}

/// Warns once per node (per process) that it asks for per-GPU sharing and does not qualify.
pub(super) fn warn_per_gpu_refused_once(node: &str, why: &str) {
    static WARNED: Warned = Mutex::new(None);
    if first_warning(&WARNED, node) {
        tracing::warn!(node, "{why}");
    }
}

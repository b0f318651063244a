//! gpu-share pods without a node yet: what the pending-pod gauges count and the occupancy page
//! lists, each with why it waits.

use std::time::SystemTime;

/// Pending gpu-share pods of one class: how many, and how long the oldest has waited.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PendingClass {
    pub class: &'static str,
    pub pods: usize,
    pub oldest_seconds: f64,
}

use k8s_openapi::api::core::v1::Pod;

pub use crate::cache::pod::{UNSCHEDULED_CAP, Unscheduled};

/// The longest reason kept per pod (kube-scheduler's message names node counts per reason; a
/// longer one is cut at a character boundary, with an ellipsis).
pub const REASON_MAX: usize = 1024;

/// `text` cut to at most [`REASON_MAX`] bytes.
pub fn bounded(text: &str) -> String {
    if text.len() <= REASON_MAX {
        return text.to_string();
    }
    let mut end = REASON_MAX - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// PURE: why a pod waits for a node, as its PodScheduled condition says (the scheduler's
/// message, or its reason); `None` when the scheduler has not said.
pub fn scheduling_reason(pod: &Pod) -> Option<String> {
    let c = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
    c.message
        .clone()
        .filter(|m| !m.is_empty())
        .or_else(|| c.reason.clone())
        .or_else(|| Some("unschedulable".into()))
}

/// PURE: a pod gpu-share admitted (it carries `gpu-share.io/request`) that has no node yet and
/// is neither finished nor being deleted, with its class and creation time.
pub fn unscheduled_of(pod: &Pod) -> Option<Unscheduled> {
    let has_request = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(crate::request::ANNOTATION_REQUEST));
    // A pod held by scheduling gates (Kueue, for one) is not offered to any scheduler yet.
    let gated = pod
        .spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| !g.is_empty());
    if !has_request || gated || !crate::ledger::waits_for_a_node(pod) {
        return None;
    }
    let class = match crate::ledger::gpu_demand_of_pod(pod) {
        Ok(Some(g)) if g.class() != "none" => g.class(),
        _ => return None,
    };
    let since = pod
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or_else(SystemTime::now, |t| SystemTime::from(t.0));
    Some(Unscheduled {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        class,
        since,
        reason: scheduling_reason(pod).as_deref().map(bounded),
    })
}

/// Whether filter found a gpu-share pod a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    Nodes,
    /// None fit: the pod's class, and why, in words.
    None {
        class: &'static str,
        why: String,
    },
}

//! PURE: Kubernetes-shaped simulator input.

use super::trace::TracePod;
use crate::inventory::GpuNode;

pub fn parse_node_list(_text: &str) -> Result<Vec<GpuNode>, String> {
    Err("NodeList input: in progress".into())
}

pub fn parse_pod_list(_text: &str) -> Result<Vec<TracePod>, String> {
    Err("pod list input: in progress".into())
}

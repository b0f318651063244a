//! PURE: Kubernetes-shaped simulator input (a NodeList with GFD labels, annotated pods).
//! Not implemented yet: the simulator reads the openb CSV format only.

use super::trace::TracePod;
use crate::inventory::GpuNode;

pub fn parse_node_list(_text: &str) -> Result<Vec<GpuNode>, String> {
    Err("a NodeList is not supported yet: give an openb node CSV (sn,cpu_milli,memory_mib,gpu,model)".into())
}

pub fn parse_pod_list(_text: &str) -> Result<Vec<TracePod>, String> {
    Err("pod manifests are not supported yet: give an openb pod CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec])".into())
}

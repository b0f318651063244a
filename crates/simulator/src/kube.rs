//! PURE: Kubernetes-shaped simulator input.
//!
//! Nodes: a `NodeList` (or a YAML stream / JSON list of Nodes) with GPU Feature Discovery labels
//! and `status.allocatable`, read by the extender's own inventory code ([`inventory::from_node`]):
//! MIG (single or mixed, the devices the node advertises), time-slicing and MPS replicas, plain
//! GPUs; allocatable CPU and memory are accounted. Nodes without NVIDIA GPUs are skipped.
//!
//! Pods: pod manifests (a `List`, a YAML stream or a JSON array) with the `gpu-share`
//! annotation (as the webhook reads it), or plain `nvidia.com/*` limits; CPU and memory
//! requested as kube-scheduler counts them; a required node affinity
//! `nvidia.com/gpu.product In [...]` (the `-SHARED` suffix dropped) restricts the GPU model.

use k8s_openapi::api::core::v1::{Node, Pod};

use super::partition::ClusterNode;
use super::trace::TracePod;
use crate::inventory;
use crate::ledger;
use crate::packing::{Demand, GpuDemand};
use crate::{documents, request};

/// Why Kubernetes-shaped input cannot be replayed.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error(transparent)]
    Documents(#[from] documents::DocumentError),
    #[error("no node with NVIDIA GPUs (GPU Feature Discovery labels or nvidia.com/* allocatable)")]
    NoGpuNodes,
    /// `what` names the pod: its name, quoted, or its position.
    #[error("pod {what}: {source}")]
    Request {
        what: String,
        #[source]
        source: request::RequestError,
    },
    #[error("pod {what}: {source}")]
    Demand {
        what: String,
        #[source]
        source: ledger::DemandError,
    },
    #[error("no pods")]
    NoPods,
}

/// Reads the GPU nodes of a NodeList.
pub fn parse_node_list(text: &str) -> Result<Vec<ClusterNode>, ManifestError> {
    let mut out = Vec::new();
    for node in documents::typed::<Node>(text, "Node")? {
        // Allocatable CPU and memory come with the inventory.
        let Some(g) = inventory::from_node(&node, &inventory::Reading::default()) else {
            continue;
        };
        out.push(ClusterNode {
            physical_gpus: g.physical_gpus(),
            node: g,
        });
    }
    if out.is_empty() {
        return Err(ManifestError::NoGpuNodes);
    }
    Ok(out)
}

/// Reads pod manifests.
pub fn parse_pod_list(text: &str) -> Result<Vec<TracePod>, ManifestError> {
    let mut out = Vec::new();
    for (i, pod) in documents::typed::<Pod>(text, "Pod")?
        .into_iter()
        .enumerate()
    {
        let what = pod
            .metadata
            .name
            .as_ref()
            .map_or_else(|| format!("item {i}"), |n| format!("{n:?}"));
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        let gpu = match request::from_annotations(&annotations).map_err(|source| {
            ManifestError::Request {
                what: what.clone(),
                source,
            }
        })? {
            Some(a) => ledger::demand_of_request(&a.request),
            None => ledger::gpu_demand_of_pod(&pod)
                .map_err(|source| ManifestError::Demand { what, source })?
                .unwrap_or(GpuDemand::None),
        };
        // CPU as kube-scheduler counts it (the extender's demands read the same function).
        let cpu = pod.spec.as_ref().map_or(0, ledger::pod_cpu_milli);
        // Memory by the same rule, in MiB.
        let mem = pod
            .spec
            .as_ref()
            .map_or(0, |s| ledger::pod_request_milli(s, "memory"))
            / 1000
            / (1 << 20);
        out.push(TracePod {
            name: pod
                .metadata
                .name
                .clone()
                .unwrap_or_else(|| format!("pod-{i:05}")),
            demand: Demand {
                cpu_milli: cpu,
                memory_mib: mem,
                gpu,
                models: ledger::pod_models(&pod),
                resources: Vec::new(),
                devices: None,
                enforcement: crate::enforcement::Requirement::Off,
                driver_limit_mib: None,
            },
        });
    }
    if out.is_empty() {
        return Err(ManifestError::NoPods);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{MigLayout, Sharing};

    const NODES: &str = r#"
apiVersion: v1
kind: NodeList
items:
  - metadata:
      name: ts
      labels:
        nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3-SHARED
        nvidia.com/gpu.count: "2"
        nvidia.com/gpu.memory: "81559"
        nvidia.com/gpu.replicas: "4"
        nvidia.com/gpu.sharing-strategy: time-slicing
    status:
      allocatable: {cpu: "32", memory: 256Gi, nvidia.com/gpu: "8"}
  - metadata:
      name: mig
      labels:
        nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB
        nvidia.com/gpu.count: "1"
        nvidia.com/mig.strategy: mixed
    status:
      allocatable: {cpu: "16", memory: 128Gi, nvidia.com/mig-1g.10gb: "7"}
  - metadata: {name: cpu-only}
    status:
      allocatable: {cpu: "64", memory: 256Gi}
"#;

    #[test]
    fn gpu_nodes_come_from_gfd_labels_with_cpu_and_memory() {
        let cluster = parse_node_list(NODES).unwrap();
        assert_eq!(
            cluster.iter().map(|c| c.physical_gpus).collect::<Vec<_>>(),
            vec![2, 1],
            "GFD's gpu.count; MIG devices fill one GPU"
        );
        let nodes: Vec<crate::inventory::GpuNode> = cluster.into_iter().map(|c| c.node).collect();
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[0].sharing, Sharing::TimeSlicing { replicas: 4 });
        assert_eq!(nodes[0].cpu_milli, Some(32_000));
        assert_eq!(nodes[0].memory_mib, Some(256 * 1024));
        assert_eq!(nodes[0].product.as_deref(), Some("NVIDIA-H100-80GB-HBM3"));
        match &nodes[1].mig {
            MigLayout::Mixed { instances } => assert_eq!(instances["1g.10gb"], 7),
            other => panic!("expected mixed MIG, got {other:?}"),
        }
        assert!(
            parse_node_list("items: [{metadata: {name: x}}]")
                .unwrap_err()
                .to_string()
                .contains("no node with NVIDIA GPUs")
        );
    }

    #[test]
    fn pods_from_annotations_limits_and_affinity() {
        let pods = parse_pod_list(
            r#"
- metadata: {name: a, annotations: {gpu-share: timeslice-30}}
  spec:
    containers: [{name: c, resources: {requests: {cpu: 1500m, memory: 2Gi}}}]
    affinity:
      nodeAffinity:
        requiredDuringSchedulingIgnoredDuringExecution:
          nodeSelectorTerms:
            - matchExpressions:
                - {key: nvidia.com/gpu.product, operator: In, values: [NVIDIA-H100-80GB-HBM3-SHARED]}
- metadata: {name: b, annotations: {gpu-share: mig-1g.10gb}}
  spec: {containers: [{name: c}]}
- metadata: {name: c}
  spec: {containers: [{name: c, resources: {limits: {nvidia.com/gpu: "2"}}}]}
- metadata: {name: d}
  spec: {containers: [{name: c, resources: {requests: {cpu: "2"}}}]}
"#,
        )
        .unwrap();
        assert_eq!(pods.len(), 4);
        assert_eq!(
            pods[0].demand.gpu,
            GpuDemand::Timeslice {
                milli: 300,
                memory_mib: None
            }
        );
        assert_eq!(pods[0].demand.cpu_milli, 1500);
        assert_eq!(pods[0].demand.memory_mib, 2048);
        assert_eq!(pods[0].demand.models, vec!["NVIDIA-H100-80GB-HBM3"]);
        assert!(matches!(pods[1].demand.gpu, GpuDemand::Mig { .. }));
        assert!(matches!(
            pods[2].demand.gpu,
            GpuDemand::Units { count: 2, .. }
        ));
        assert_eq!(pods[3].demand.gpu, GpuDemand::None);
        let e = parse_pod_list("- metadata: {name: x, annotations: {gpu-share: mps-500}}\n  spec: {containers: [{name: c}]}\n").unwrap_err();
        assert!(matches!(e, ManifestError::Request { .. }), "{e}");
        assert!(e.to_string().contains("pod \"x\""), "{e}");
    }
}

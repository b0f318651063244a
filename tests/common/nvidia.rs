//! The nodes NVIDIA's own code labels (`tests/fixtures/nvidia/nodes.yaml`, from
//! `tests/fixtures/nvidia/generate.sh`) and what `/v1/nodes` must read of each: shared by the
//! unit-level tests (tests/nvidia.rs) and the control-plane test (tests/cluster.rs), which
//! registers the same nodes with a real kube-apiserver.

use std::collections::BTreeMap;

use gpu_share::extender::report::NodeReport;
use k8s_openapi::api::core::v1::Node;

/// The file, relative to the repository.
pub const NODES: &str = "tests/fixtures/nvidia/nodes.yaml";

/// The sets of nodes as the configurations people run write them, one file each beside the
/// catalogue (`generate.sh`): the GPU Operator's default ClusterPolicy, the device plugin's chart
/// with its defaults (no GFD) and with GFD, the chart under the mixed strategy, and GKE.
pub const SETS: &[&str] = &[
    "tests/fixtures/nvidia/operator-defaults.yaml",
    "tests/fixtures/nvidia/device-plugin-chart.yaml",
    "tests/fixtures/nvidia/device-plugin-chart-mixed.yaml",
    "tests/fixtures/nvidia/gke.yaml",
];

/// The classes every set is tried with (tests/node_sets.rs, tests/install.rs).
pub const CLASSES: &[&str] = &[
    "exclusive-1",
    "exclusive-2",
    "timeslice-50",
    "mps-25",
    "mig-1g.5gb",
    "mig-1g.10gb",
    "mig-3g.40gb",
];

/// A class, and the nodes of a set it lands on.
pub type Landing = (&'static str, &'static [&'static str]);

/// Where each class lands, set by set: written from what each node is, not read from the code.
/// On the GPU Operator's defaults every GPU node carries `nvidia.com/mig.strategy=single`, MIG or
/// not, and whole-GPU pods land on every node whose GPUs are neither shared nor MIG devices
/// (before, on none). Without GPU Feature Discovery (the device plugin chart's default) the
/// instance type tells a time-sliced g6.12xlarge (16 nvidia.com/gpu on 4 L4s) from whole GPUs.
pub const LANDINGS: &[(&str, &[Landing])] = &[
    (
        "tests/fixtures/nvidia/operator-defaults.yaml",
        &[
            (
                "exclusive-1",
                &["op-a100-80gb", "op-h100", "op-l4", "op-l40s"],
            ),
            ("exclusive-2", &["op-a100-80gb", "op-h100", "op-l40s"]),
            ("timeslice-50", &["op-h100-ts4"]),
            ("mps-25", &["op-h100-mps4"]),
            ("mig-1g.5gb", &[]),
            ("mig-1g.10gb", &["op-a100-80gb-all-1g.10gb"]),
            ("mig-3g.40gb", &["op-h100-all-3g.40gb"]),
        ],
    ),
    (
        "tests/fixtures/nvidia/device-plugin-chart.yaml",
        &[
            (
                "exclusive-1",
                &[
                    "dp-g6-xlarge",
                    "dp-gfd-g6-xlarge",
                    "dp-gfd-p5-48xlarge",
                    "dp-p5-48xlarge",
                ],
            ),
            ("exclusive-2", &["dp-gfd-p5-48xlarge", "dp-p5-48xlarge"]),
            ("timeslice-50", &["dp-gfd-g6e-12xlarge-ts4"]),
            ("mps-25", &["dp-gfd-p5-48xlarge-mps4"]),
            ("mig-1g.5gb", &[]),
            ("mig-1g.10gb", &[]),
            ("mig-3g.40gb", &[]),
        ],
    ),
    (
        "tests/fixtures/nvidia/device-plugin-chart-mixed.yaml",
        &[
            (
                "exclusive-1",
                &["mixed-a100-80gb-7mig-1full", "mixed-h100", "mixed-l40s"],
            ),
            ("exclusive-2", &["mixed-h100", "mixed-l40s"]),
            ("timeslice-50", &[]),
            ("mps-25", &[]),
            ("mig-1g.5gb", &["mixed-a100-40gb-all-1g.5gb"]),
            (
                "mig-1g.10gb",
                &[
                    "mixed-a100-80gb-7mig-1full",
                    "mixed-a100-80gb-all-1g.10gb",
                    "mixed-h100-3g-4x1g",
                ],
            ),
            ("mig-3g.40gb", &["mixed-h100-3g-4x1g"]),
        ],
    ),
    (
        "tests/fixtures/nvidia/gke.yaml",
        &[
            ("exclusive-1", &["gke-a3-highgpu-8g", "gke-g2-standard-8"]),
            ("exclusive-2", &["gke-a3-highgpu-8g"]),
            ("timeslice-50", &["gke-g2-standard-24-ts4"]),
            ("mps-25", &["gke-a3-highgpu-8g-mps2"]),
            ("mig-1g.5gb", &["gke-a2-highgpu-1g-1g.5gb"]),
            ("mig-1g.10gb", &[]),
            ("mig-3g.40gb", &["gke-a2-ultragpu-8g-3g.40gb"]),
        ],
    ),
];

/// The nodes generated from NVIDIA's code: the catalogue.
pub fn nodes() -> Vec<Node> {
    set(NODES)
}

/// The nodes of one file of the generated sets, relative to the repository.
pub fn set(file: &str) -> Vec<Node> {
    let path = format!("{}/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    gpu_share::server::parse_nodes(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

pub fn labels(n: &Node) -> BTreeMap<String, String> {
    n.metadata.labels.clone().unwrap_or_default()
}

/// Whether GFD labelled the node as MIG single-strategy.
pub fn single(n: &Node) -> bool {
    labels(n).get("nvidia.com/mig.strategy").map(String::as_str) == Some("single")
}

/// What each generated node is: physical GPUs, the pool's resource and units, replicas per
/// GPU, and MIG devices per profile. Written from the generator's node list, not from the code.
#[allow(clippy::type_complexity)]
pub const EXPECTED: &[(&str, u32, &str, u32, u32, &[(&str, u32)])] = &[
    (
        "a100-40gb-mig-mixed-all-1g.5gb",
        8,
        "nvidia.com/gpu",
        0,
        1,
        &[("1g.5gb", 56)],
    ),
    (
        "a100-40gb-mig-mixed-all-3g.20gb",
        8,
        "nvidia.com/gpu",
        0,
        1,
        &[("3g.20gb", 16)],
    ),
    (
        "a100-40gb-mig-mixed-3g-4x1g",
        8,
        "nvidia.com/gpu",
        0,
        1,
        &[("1g.5gb", 32), ("3g.20gb", 8)],
    ),
    (
        "a100-40gb-mig-single-all-1g.5gb",
        8,
        "nvidia.com/gpu",
        56,
        1,
        &[("1g.5gb", 56)],
    ),
    (
        "a100-80gb-x1-mig-mixed-all-1g.10gb",
        1,
        "nvidia.com/gpu",
        0,
        1,
        &[("1g.10gb", 7)],
    ),
    (
        "a100-80gb-x1-mig-single-all-1g.10gb",
        1,
        "nvidia.com/gpu",
        7,
        1,
        &[("1g.10gb", 7)],
    ),
    (
        "a100-80gb-mig-mixed-all-1g.10gb",
        8,
        "nvidia.com/gpu",
        0,
        1,
        &[("1g.10gb", 56)],
    ),
    (
        "a100-80gb-mig-mixed-all-3g.40gb",
        8,
        "nvidia.com/gpu",
        0,
        1,
        &[("3g.40gb", 16)],
    ),
    (
        "a100-80gb-mig-mixed-3g-4x1g",
        8,
        "nvidia.com/gpu",
        0,
        1,
        &[("1g.10gb", 32), ("3g.40gb", 8)],
    ),
    (
        "a100-80gb-mig-mixed-7mig-1full",
        8,
        "nvidia.com/gpu",
        1,
        1,
        &[("1g.10gb", 21), ("3g.40gb", 8)],
    ),
    (
        "a100-80gb-mig-single-all-1g.10gb",
        8,
        "nvidia.com/gpu",
        56,
        1,
        &[("1g.10gb", 56)],
    ),
    (
        "a100-80gb-mig-single-all-3g.40gb",
        8,
        "nvidia.com/gpu",
        16,
        1,
        &[("3g.40gb", 16)],
    ),
    (
        "a100-80gb-mig-mixed-no-mig-config",
        8,
        "nvidia.com/gpu",
        0,
        1,
        &[("1g.10gb", 56)],
    ),
    (
        "a100-80gb-mig-single-no-mig-config",
        8,
        "nvidia.com/gpu",
        56,
        1,
        &[("1g.10gb", 56)],
    ),
    (
        "h100-80gb-mig-single-all-3g.40gb",
        8,
        "nvidia.com/gpu",
        16,
        1,
        &[("3g.40gb", 16)],
    ),
    ("a100-80gb-plain", 8, "nvidia.com/gpu", 8, 1, &[]),
    (
        "h100-80gb-mig-mixed-all-1g.10gb",
        8,
        "nvidia.com/gpu",
        0,
        1,
        &[("1g.10gb", 56)],
    ),
    (
        "h100-80gb-mig-mixed-all-3g.40gb",
        8,
        "nvidia.com/gpu",
        0,
        1,
        &[("3g.40gb", 16)],
    ),
    (
        "h100-80gb-mig-mixed-3g-4x1g",
        8,
        "nvidia.com/gpu",
        0,
        1,
        &[("1g.10gb", 32), ("3g.40gb", 8)],
    ),
    (
        "h100-80gb-mig-single-all-1g.10gb",
        8,
        "nvidia.com/gpu",
        56,
        1,
        &[("1g.10gb", 56)],
    ),
    ("h100-80gb-ts4", 8, "nvidia.com/gpu", 32, 4, &[]),
    (
        "h100-80gb-ts4-rename",
        8,
        "nvidia.com/gpu.shared",
        32,
        4,
        &[],
    ),
    ("h100-80gb-mps4", 8, "nvidia.com/gpu", 32, 4, &[]),
    (
        "h100-80gb-mps4-rename",
        8,
        "nvidia.com/gpu.shared",
        32,
        4,
        &[],
    ),
    ("h100-80gb-plain", 8, "nvidia.com/gpu", 8, 1, &[]),
    ("l40s-plain", 4, "nvidia.com/gpu", 4, 1, &[]),
    ("l40s-ts4", 4, "nvidia.com/gpu", 16, 4, &[]),
];

/// Checks one node's report (from `/v1/nodes`, or the same reports `gpu-share status` prints)
/// against [`EXPECTED`], with nothing bound on the node: GPUs, the pool's resource, units and
/// replicas, MIG devices per profile, and memory as GFD labels it (a full GPU's, or on a
/// single-strategy node the MIG device's). Whether the node is out of reach depends on the
/// policy, and is each caller's check.
pub fn check_report(r: &NodeReport, n: &Node) -> Result<(), String> {
    let name = r.name.as_str();
    let Some((_, gpus, resource, units, replicas, mig)) =
        EXPECTED.iter().find(|e| e.0 == name).copied()
    else {
        return Err(format!("{name}: not in EXPECTED"));
    };
    let l = labels(n);
    let got_mig: BTreeMap<&str, u32> = r
        .mig
        .iter()
        .map(|(p, c)| {
            let total = c.split_once('/').and_then(|(_, t)| t.parse().ok());
            (p.as_str(), total.unwrap_or(u32::MAX))
        })
        .collect();
    let want_mig: BTreeMap<&str, u32> = mig.iter().copied().collect();
    let got = (
        r.gpus,
        r.resource.as_str(),
        r.slots.clone(),
        r.replicas,
        got_mig,
    );
    let want = (gpus, resource, format!("0/{units}"), replicas, want_mig);
    if got != want {
        return Err(format!("{name}: read {got:?}, expected {want:?}"));
    }
    let label_memory: Option<u64> = l.get("nvidia.com/gpu.memory").and_then(|m| m.parse().ok());
    if single(n) {
        let profile = mig[0].0;
        if r.gpu_memory_mib.is_some() || r.mig_memory_mib.get(profile).copied() != label_memory {
            return Err(format!(
                "{name}: memory {:?} / {:?}, expected none / {profile} {label_memory:?}",
                r.gpu_memory_mib, r.mig_memory_mib
            ));
        }
    } else {
        if r.gpu_memory_mib != label_memory {
            return Err(format!(
                "{name}: GPU memory {:?}, expected {label_memory:?}",
                r.gpu_memory_mib
            ));
        }
        for (profile, _) in mig {
            let key = format!("nvidia.com/mig-{profile}.memory");
            let want: Option<u64> = l.get(&key).and_then(|m| m.parse().ok());
            if want.is_none() || r.mig_memory_mib.get(*profile).copied() != want {
                return Err(format!(
                    "{name}: {profile} memory {:?}, expected {want:?}",
                    r.mig_memory_mib.get(*profile)
                ));
            }
        }
    }
    Ok(())
}

/// The pod with `annotations` as the webhook writes it in a cluster whose nodes offer MIG in the
/// forms `offers` says (`None`: they could not be read), with its warnings; or its refusal.
pub fn plan_pod(
    policy: &gpu_share::policy::Policy,
    annotations: serde_json::Value,
    offers: Option<&gpu_share::inventory::MigOffers>,
) -> Result<(k8s_openapi::api::core::v1::Pod, Vec<String>), String> {
    let obj = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default", "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}
    });
    let facts = gpu_share::admission::plan::Facts {
        namespace: "default",
        namespace_labels: None,
        runtime_class: gpu_share::admission::plan::RuntimeClassState::Exists,
        request_uid: "u",
        mig_offers: offers,
        legacy_runtime_class: gpu_share::admission::plan::RuntimeClassState::Unknown,
    };
    let decision = gpu_share::admission::plan::plan(&obj, policy, &policy.mig_table(), &facts);
    let gpu_share::admission::plan::Decision::Mutate(m) = decision else {
        return Err(format!("{decision:?}"));
    };
    let mut doc = obj.clone();
    json_patch::patch(&mut doc, &m.patch).map_err(|e| e.to_string())?;
    Ok((
        serde_json::from_value(doc).map_err(|e| e.to_string())?,
        m.warnings,
    ))
}

/// The GPU limits of the pod's first container, as text.
pub fn gpu_limits(pod: &k8s_openapi::api::core::v1::Pod) -> BTreeMap<String, String> {
    pod.spec.as_ref().unwrap().containers[0]
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .map(|l| l.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect())
        .unwrap_or_default()
}

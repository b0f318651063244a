//! Every class against every node of every configuration people run: the node sets in
//! `tests/fixtures/nvidia/` (the GPU Operator's default ClusterPolicy, the device plugin's chart
//! with and without GFD, the chart under the mixed strategy, GKE; `generate.sh`), each read as a
//! cluster of its own under the default policy. A pod of a class lands on a node when the
//! webhook's node affinity selects the node and the extender's fit takes the pod on the empty
//! node (which includes kube-scheduler's own check: the node advertises what the pod's limits
//! name). Where each class lands is written out below, set by set, from what each node is.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::nvidia::{SETS, gpu_limits, labels, plan_pod, set};
use gpu_share::inventory::{self, MigOffers, Reading};
use gpu_share::packing::{self, Usage};
use gpu_share::policy::Policy;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;

const CLASSES: &[&str] = &[
    "exclusive-1",
    "exclusive-2",
    "timeslice-50",
    "mps-25",
    "mig-1g.5gb",
    "mig-1g.10gb",
    "mig-3g.40gb",
];

/// The pod as the webhook writes it in a cluster of `nodes`, with its warnings.
fn planned(policy: &Policy, class: &str, offers: &MigOffers) -> (Pod, Vec<String>) {
    planned_with(policy, json!({"gpu-share": class}), offers)
        .unwrap_or_else(|d| panic!("{class}: {d}"))
}

/// The pod with `annotations` as the webhook writes it, with its warnings, or its refusal.
fn planned_with(
    policy: &Policy,
    annotations: serde_json::Value,
    offers: &MigOffers,
) -> Result<(Pod, Vec<String>), String> {
    plan_pod(policy, annotations, Some(offers))
}

/// Where each class lands in a cluster of `nodes` under `policy`: class -> node names.
fn landings(policy: &Policy, nodes: &[Node]) -> BTreeMap<&'static str, BTreeSet<String>> {
    let reading = Reading::of(policy);
    let read: Vec<_> = nodes
        .iter()
        .filter_map(|n| inventory::read_node(n, &reading).map(|g| (n, g)))
        .collect();
    let offers = MigOffers::of(read.iter().map(|(_, g)| g));
    let mut out = BTreeMap::new();
    for class in CLASSES {
        let (pod, _) = planned(policy, class, &offers);
        let demand = gpu_share::ledger::demand_of_pod(&pod).unwrap().unwrap();
        let spec = pod.spec.as_ref().unwrap();
        let lands: BTreeSet<String> = read
            .iter()
            .filter(|(n, g)| {
                let name = n.metadata.name.as_deref().unwrap();
                gpu_share::extender::explain::selects(spec, name, &labels(n))
                    && packing::fit(g, &Usage::empty(g), &demand).is_ok()
            })
            .map(|(_, g)| g.name.clone())
            .collect();
        out.insert(*class, lands);
    }
    out
}

/// A class, and the nodes of a set it lands on.
type Landing = (&'static str, &'static [&'static str]);

/// Where each class lands, set by set: written from what each node is, not read from the code.
/// On the GPU Operator's defaults every GPU node carries `nvidia.com/mig.strategy=single`, MIG or
/// not, and whole-GPU pods land on every node whose GPUs are neither shared nor MIG devices
/// (before, on none). Without GPU Feature Discovery (the device plugin chart's default) the
/// instance type tells a time-sliced g6.12xlarge (16 nvidia.com/gpu on 4 L4s) from whole GPUs.
const LANDINGS: &[(&str, &[Landing])] = &[
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

#[test]
fn every_class_lands_where_each_set_s_nodes_can_hold_it() {
    let policy = Policy::default_policy();
    assert_eq!(
        LANDINGS.iter().map(|(f, _)| *f).collect::<Vec<_>>(),
        SETS.to_vec()
    );
    let mut wrong = Vec::new();
    for (file, expected) in LANDINGS {
        let got = landings(&policy, &set(file));
        for (class, want) in *expected {
            let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
            if got[class] != want {
                wrong.push(format!(
                    "{file}: {class} lands on {:?}, expected {want:?}",
                    got[class]
                ));
            }
        }
        assert_eq!(expected.len(), CLASSES.len(), "{file}");
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Each set says what configuration it is and where each node comes from.
#[test]
fn every_set_is_generated_and_says_its_source() {
    for file in SETS {
        let path = format!("{}/{file}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with("# Generated by tests/fixtures/nvidia/generate.sh"),
            "{file}"
        );
        for n in set(file) {
            let source = &n.metadata.annotations.as_ref().unwrap()["gpu-share.io/fixture-source"];
            let gke = n.metadata.name.as_deref().unwrap().starts_with("gke-");
            assert_eq!(
                source.starts_with("GKE:"),
                gke,
                "{file}: {:?} {source}",
                n.metadata.name
            );
            if !gke {
                assert!(source.contains("k8s-device-plugin v0.20.0"), "{source}");
            }
        }
    }
}

/// Every GPU node of every set is reached by some class: no set holds a node gpu-share cannot use.
#[test]
fn every_node_of_every_set_takes_some_class() {
    for (file, expected) in LANDINGS {
        let nodes = set(file);
        let reached: BTreeSet<&str> = expected
            .iter()
            .flat_map(|(_, n)| n.iter().copied())
            .collect();
        for n in &nodes {
            let name = n.metadata.name.as_deref().unwrap();
            // The time-sliced node without GFD: no label says so, so only a declared rule would
            // bring shares to it; whole GPUs are refused there (its instance type's count).
            if name == "dp-g6-12xlarge-ts4" {
                continue;
            }
            assert!(reached.contains(name), "{file}: {name} takes no class");
        }
    }
}

/// Without GPU Feature Discovery, a node's instance type gives its GPU count: the g6.12xlarge
/// whose device plugin time-slices 4 L4s advertises 16 nvidia.com/gpu and is read as 4 GPUs x 4
/// replicas, where an exclusive pod is refused in words; the g6.xlarge's one unit is a whole GPU.
#[test]
fn instance_types_tell_replicas_from_whole_gpus_without_gfd() {
    let policy = Policy::default_policy();
    let reports: BTreeMap<String, _> = gpu_share::status::reports_from(&policy, &set(SETS[1]), &[])
        .into_iter()
        .map(|r| (r.name.clone(), r))
        .collect();
    let ts = &reports["dp-g6-12xlarge-ts4"];
    assert_eq!(
        (ts.kind.as_str(), ts.gpus, ts.replicas),
        ("time-slicing x4 (instance type)", 4, 4),
        "{ts:?}"
    );
    let one = &reports["dp-g6-xlarge"];
    assert_eq!(
        (one.kind.as_str(), one.gpus),
        ("whole (instance type)", 1),
        "{one:?}"
    );
    // A type the table lacks stays unverified.
    let mut unknown = set(SETS[1])
        .into_iter()
        .find(|n| n.metadata.name.as_deref() == Some("dp-g6-12xlarge-ts4"))
        .unwrap();
    unknown
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(inventory::LABEL_INSTANCE_TYPE.into(), "x9.huge".into());
    let g = inventory::read_node(&unknown, &Reading::of(&policy)).unwrap();
    assert_eq!(
        (g.mode_source, g.gpus),
        (inventory::ModeSource::Unverified, 16)
    );
    // The exclusive pod's refusal on the time-sliced node, in words.
    let g = inventory::read_node(
        &set(SETS[1])
            .into_iter()
            .find(|n| n.metadata.name.as_deref() == Some("dp-g6-12xlarge-ts4"))
            .unwrap(),
        &Reading::of(&policy),
    )
    .unwrap();
    let (pod, _) = planned(&policy, "exclusive-2", &MigOffers::default());
    let demand = gpu_share::ledger::demand_of_pod(&pod).unwrap().unwrap();
    let why = packing::fit(&g, &Usage::empty(&g), &demand).unwrap_err();
    assert!(why.message().contains("time-slic"), "{}", why.message());
}

/// On the GPU Operator's defaults before any MIG node is up (a MIG pool scaled to zero, a MIG
/// config not yet applied), every GPU node is still labelled with the single strategy: a MIG pod
/// asks for nvidia.com/gpu, as the pool will offer it, and is told that this is a guess and how
/// to choose. Its own `gpu-share/mig-strategy` wins, with nothing to warn of; a value that is no
/// strategy, or one on a pod that asks for no MIG device, is refused in words.
#[test]
fn a_mig_pod_before_its_pool_is_up_takes_the_cluster_s_strategy_or_its_own() {
    let policy = Policy::default_policy();
    let plain: Vec<Node> = set(SETS[0])
        .into_iter()
        .filter(|n| !labels(n).contains_key("nvidia.com/gpu.slices.gi"))
        .collect();
    assert_eq!(plain.len(), 6);
    let offers = MigOffers::of_cluster(&plain, &Reading::of(&policy));
    let (pod, warnings) = planned(&policy, "mig-1g.10gb", &offers);
    assert_eq!(gpu_limits(&pod)["nvidia.com/gpu"], "1");
    assert!(
        warnings.len() == 1
            && warnings[0].contains("nvidia.com/mig.strategy=single")
            && warnings[0].contains("a guess")
            && warnings[0].contains("gpu-share/mig-strategy"),
        "{warnings:?}"
    );
    // Once the pool is up, the pod lands there.
    let all = set(SETS[0]);
    let up = MigOffers::of_cluster(&all, &Reading::of(&policy));
    let (pod, warnings) = planned(&policy, "mig-1g.10gb", &up);
    assert!(warnings.is_empty(), "{warnings:?}");
    let reading = Reading::of(&policy);
    let node = all
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some("op-a100-80gb-all-1g.10gb"))
        .unwrap();
    let g = inventory::read_node(node, &reading).unwrap();
    let demand = gpu_share::ledger::demand_of_pod(&pod).unwrap().unwrap();
    assert!(packing::fit(&g, &Usage::empty(&g), &demand).is_ok());

    // The pod's own choice.
    let (pod, warnings) = planned_with(
        &policy,
        json!({"gpu-share": "mig-1g.10gb", "gpu-share/mig-strategy": "mixed"}),
        &offers,
    )
    .unwrap();
    assert_eq!(gpu_limits(&pod)["nvidia.com/mig-1g.10gb"], "1");
    assert!(warnings.is_empty(), "{warnings:?}");
    for (annotations, says) in [
        (
            json!({"gpu-share": "mig-1g.10gb", "gpu-share/mig-strategy": "auto"}),
            "is not a MIG strategy",
        ),
        (
            json!({"gpu-share": "mps-25", "gpu-share/mig-strategy": "single"}),
            "applies to mig-<profile> only",
        ),
    ] {
        let refused = planned_with(&policy, annotations.clone(), &offers).unwrap_err();
        assert!(refused.contains(says), "{annotations}: {refused}");
    }
}

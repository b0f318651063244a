//! What a GPU node advertises of `gpu-share.io/gpu-milli` (its GPUs times 1000) is a true bound
//! for kubelet's admission: whatever the packing places on a node, in any order and of any class,
//! the quantities of the pods it placed never add up to more, so kubelet never refuses a pod
//! gpu-share bound for the quantity. KWOK runs no kubelet admission; this checks the same rule
//! against the one packing implementation.

use gpu_share::inventory::{GpuNode, MigLayout, Sharing};
use gpu_share::ledger::{Ledger, PodRef, demand_of_request};
use gpu_share::packing::{Demand, PackingPolicy, Scorer};
use gpu_share::quota::advertise;
use gpu_share::request::GpuRequest;
use proptest::prelude::*;

/// kubelet's rule for an extended resource (v1.37.2, `pkg/kubelet/lifecycle/predicate.go`):
/// one the node's allocatable does not list is dropped from the pod's requests before the fit
/// check (`removeMissingExtendedResources`); one it lists fits while what the node's pods
/// request of it, the new pod included, is at most the allocatable (the scheduler framework's
/// `Fits`, which kubelet's admission calls).
fn kubelet_admits(allocatable: Option<u64>, requested_on_node: u64, pod: u64) -> bool {
    match allocatable {
        None => true,
        Some(a) => requested_on_node.saturating_add(pod) <= a,
    }
}

#[test]
fn kubelets_rule_as_read() {
    assert!(
        kubelet_admits(None, 10_000, 1000),
        "not advertised: dropped"
    );
    assert!(kubelet_admits(Some(2000), 1000, 1000));
    assert!(!kubelet_admits(Some(2000), 1500, 1000));
}

/// Every kind of GPU node gpu-share reads: whole GPUs, the device plugin's time-slicing and MPS
/// replicas (one of a third of a GPU), MIG by both strategies, and per-GPU sharing.
fn nodes() -> Vec<GpuNode> {
    let a100 = |name: &str| GpuNode::whole(name, "NVIDIA-A100-SXM4-80GB", 0, 81920);
    vec![
        GpuNode::whole("plain", "NVIDIA-L40S", 4, 46068),
        GpuNode::shared(
            "ts",
            "NVIDIA-H100-80GB-HBM3",
            2,
            81559,
            Sharing::TimeSlicing { replicas: 4 },
        ),
        GpuNode::shared(
            "mps",
            "NVIDIA-A100-SXM4-80GB",
            3,
            81920,
            Sharing::Mps { replicas: 3 },
        ),
        GpuNode {
            gpus: 0,
            slots: 0,
            mig: MigLayout::Mixed {
                instances: [
                    ("1g.10gb".to_string(), 7),
                    ("3g.40gb".to_string(), 2),
                    ("2g.20gb".to_string(), 1),
                ]
                .into(),
            },
            labelled_gpus: Some(2),
            ..a100("mig-mixed")
        },
        GpuNode {
            slots: 14,
            mig: MigLayout::Single {
                profile: "1g.10gb".into(),
                per_gpu: 7,
            },
            ..a100("mig-single")
        },
        GpuNode {
            sharing: Sharing::PerGpu,
            ..GpuNode::whole("per-gpu", "NVIDIA-A100-SXM4-80GB", 4, 81920)
        },
    ]
}

fn request() -> impl Strategy<Value = String> {
    prop_oneof![
        (1u32..=100).prop_map(|p| format!("mps-{p}")),
        (1u32..=100).prop_map(|p| format!("timeslice-{p}")),
        (1u32..=3).prop_map(|n| format!("exclusive-{n}")),
        (
            prop_oneof![
                Just("1g.10gb"),
                Just("2g.20gb"),
                Just("3g.40gb"),
                Just("7g.80gb")
            ],
            1u32..=3
        )
            .prop_map(|(p, n)| format!("mig-{p},count={n}")),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn what_the_packing_places_never_asks_more_than_a_node_advertises(
        asks in proptest::collection::vec((request(), 0usize..6), 1..80),
        policy in prop_oneof![Just(PackingPolicy::GpuShare), Just(PackingPolicy::Binpack)],
    ) {
        let nodes = nodes();
        let ledger = Ledger::rebuild(nodes.clone(), &[]);
        let scorer = Scorer::new(policy);
        let mut requested = vec![0u64; nodes.len()];
        for (i, (ask, n)) in asks.iter().enumerate() {
            let request = GpuRequest::parse_normalized(ask).unwrap();
            let pod = PodRef::new(format!("p{i}"), "ml", format!("p{i}"));
            let demand = Demand::gpu(demand_of_request(&request));
            if ledger.hold(&scorer, &nodes[*n].name, pod, demand).is_ok() {
                let quantity = u64::from(request.gpu_milli());
                let allocatable = Some(advertise::capacity(&nodes[*n]));
                prop_assert!(
                    kubelet_admits(allocatable, requested[*n], quantity),
                    "{}: {ask} ({quantity}) placed over {:?} with {} requested",
                    nodes[*n].name, allocatable, requested[*n]
                );
                requested[*n] += quantity;
            }
        }
    }
}

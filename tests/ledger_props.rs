//! Property tests: random sequences of bind / delete / restart never overcommit a node's MIG
//! devices, replicas, budgets or whole GPUs, and the ledger rebuilt from the API (the pods with
//! their node and bind annotation) equals the live one; concurrent binds from many threads never
//! overcommit either; the fragmentation memo a node ledger keeps never changes a score.

use std::sync::Arc;

use gpu_share::inventory::{GpuNode, Sharing};
use gpu_share::ledger::{Ledger, ObservedPod, PodRef};
use gpu_share::packing::{self, Demand, GpuDemand, Homes, OnlineWorkload, PackingPolicy, Scorer};
use k8s_openapi::api::core::v1::Pod;
use proptest::prelude::*;
use serde_json::json;

fn nodes() -> Vec<GpuNode> {
    gpu_share::fuzzing::ledger_nodes()
}

#[derive(Debug, Clone)]
enum Op {
    Bind {
        pod: u8,
        node: u8,
        demand: GpuDemand,
    },
    Delete {
        pod: u8,
    },
    Restart,
}

fn demand() -> impl Strategy<Value = GpuDemand> {
    prop_oneof![
        (1u32..=3).prop_map(|count| GpuDemand::Whole { count }),
        (1u32..=100, proptest::option::of(1000u64..=50_000)).prop_map(|(p, m)| GpuDemand::Mps {
            milli: p * 10,
            memory_mib: m
        }),
        (1u32..=100, proptest::option::of(1000u64..=90_000)).prop_map(|(p, m)| {
            GpuDemand::Timeslice {
                milli: p * 10,
                memory_mib: m,
            }
        }),
        (
            prop_oneof![Just("1g.10gb"), Just("3g.40gb"), Just("7g.80gb")],
            1u32..=3
        )
            .prop_map(|(p, count)| GpuDemand::Mig {
                profile: p.to_string(),
                count
            }),
        (1u32..=4).prop_map(|count| GpuDemand::Units {
            resource: "nvidia.com/gpu".into(),
            count
        }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..40, 0u8..4, demand()).prop_map(|(pod, node, demand)| Op::Bind { pod, node, demand }),
        3 => (0u8..40).prop_map(|pod| Op::Delete { pod }),
        1 => Just(Op::Restart),
    ]
}

/// Nodes gpu-share shares per GPU: an A100 80GB with 4 GPUs and an H100 with 2.
fn per_gpu_nodes() -> Vec<GpuNode> {
    [
        ("pg-a100", "NVIDIA-A100-SXM4-80GB", 4, 81920),
        ("pg-h100", "NVIDIA-H100-80GB-HBM3", 2, 81559),
    ]
    .into_iter()
    .map(|(name, product, gpus, memory)| GpuNode {
        sharing: Sharing::PerGpu,
        ..GpuNode::whole(name, product, gpus, memory)
    })
    .collect()
}

fn per_gpu_op() -> impl Strategy<Value = Op> {
    let demand = prop_oneof![
        (1u32..=2).prop_map(|count| GpuDemand::Whole { count }),
        (1u32..=2).prop_map(|count| GpuDemand::Units {
            resource: "nvidia.com/gpu".into(),
            count
        }),
        (1u32..=100, proptest::option::of(1000u64..=60_000)).prop_map(|(p, m)| {
            GpuDemand::Timeslice {
                milli: p * 10,
                memory_mib: m,
            }
        }),
        (0u32..4, proptest::bool::ANY).prop_map(|(gpu, cdi_device)| GpuDemand::ReservationPod {
            gpu,
            mps: false,
            cdi_device
        }),
    ];
    prop_oneof![
        6 => (0u8..30, 0u8..2, demand).prop_map(|(pod, node, demand)| Op::Bind { pod, node, demand }),
        3 => (0u8..30).prop_map(|pod| Op::Delete { pod }),
        1 => Just(Op::Restart),
    ]
}

/// Multi-GPU nodes the device plugin shares: time-slicing (2x A10 x4, 3x L4 x2) and MPS (2x H100
/// x4, 3x A100 x3, whose replica is 333 thousandths).
fn replicated_nodes() -> Vec<GpuNode> {
    vec![
        GpuNode::shared(
            "ts-a10",
            "NVIDIA-A10",
            2,
            23028,
            Sharing::TimeSlicing { replicas: 4 },
        ),
        GpuNode::shared(
            "ts-l4",
            "NVIDIA-L4",
            3,
            23034,
            Sharing::TimeSlicing { replicas: 2 },
        ),
        GpuNode::shared(
            "mps-h100",
            "NVIDIA-H100-80GB-HBM3",
            2,
            81559,
            Sharing::Mps { replicas: 4 },
        ),
        GpuNode::shared(
            "mps-a100",
            "NVIDIA-A100-SXM4-80GB",
            3,
            81920,
            Sharing::Mps { replicas: 3 },
        ),
    ]
}

fn replicated_op() -> impl Strategy<Value = Op> {
    let demand = prop_oneof![
        (1u32..=100, proptest::option::of(1000u64..=24_000)).prop_map(|(p, m)| {
            GpuDemand::Timeslice {
                milli: p * 10,
                memory_mib: m,
            }
        }),
        (1u32..=34, proptest::option::of(1000u64..=27_000)).prop_map(|(p, m)| GpuDemand::Mps {
            milli: p * 10,
            memory_mib: m
        }),
        (1u32..=3).prop_map(|count| GpuDemand::Units {
            resource: "nvidia.com/gpu".into(),
            count
        }),
    ];
    prop_oneof![
        6 => (0u8..40, 0u8..4, demand).prop_map(|(pod, node, demand)| Op::Bind { pod, node, demand }),
        3 => (0u8..40).prop_map(|pod| Op::Delete { pod }),
        1 => Just(Op::Restart),
    ]
}

/// How a test turns an operation's pod into what bind sees, and the ledger into what the API
/// lists.
struct Api {
    /// The pod `uid` asking `gpu` on `node`: its reference and demand.
    admit: fn(&str, &str, GpuDemand) -> (PodRef, Demand),
    /// Every held pod as a replica rebuilding its ledger reads it from the API.
    list: fn(&Ledger) -> Vec<ObservedPod>,
}

/// Pods as plain demands, and the API as the ledger's own view of its holdings.
const PLAIN: Api = Api {
    admit: |uid, _, gpu| {
        let pref = PodRef::new(uid.to_string(), "ml", uid.to_string());
        (pref, Demand::gpu(gpu))
    },
    list: api_view,
};

/// Pods as the API holds them on nodes shared per GPU, read the way the extender reads them.
const PER_GPU_OBJECTS: Api = Api {
    admit: |uid, node, gpu| {
        let o = observed(&per_gpu_pod(uid, node, &gpu, None));
        (o.pod, o.demand)
    },
    list: listed_pods,
};

/// A pod as the API holds it once admitted and bound to `node`, on a node gpu-share shares per
/// GPU: a share reads its GPU from its devices ConfigMap and asks gpu-share's unit; whole GPUs
/// come from the device plugin (with gpu-share's request, or asked directly); a reservation is
/// the pod gpu-share creates. `gpus`: the bind annotation.
fn per_gpu_pod(uid: &str, node: &str, gpu: &GpuDemand, gpus: Option<String>) -> Pod {
    let mut p = match gpu {
        GpuDemand::ReservationPod {
            gpu,
            mps,
            cdi_device,
        } => {
            let t = gpu_share::reservation::Template {
                image: "gpu-share:test".into(),
                cdi_device: *cdi_device,
                ..Default::default()
            };
            gpu_share::reservation::pod(node, *gpu, *mps, &t)
        }
        GpuDemand::Timeslice { .. } => json!({
            "metadata": {"namespace": "ml", "annotations": {"gpu-share.io/request": gpu.to_string()}},
            "spec": {"containers": [{"name": "c",
                "resources": {"limits": {"gpu-share.io/shared-gpu": "1"}},
                "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef":
                    {"name": format!("gpu-share-devices-{uid}"), "key": "NVIDIA_VISIBLE_DEVICES"}}}]}]}
        }),
        GpuDemand::Whole { count } => json!({
            "metadata": {"namespace": "ml", "annotations": {"gpu-share.io/request": gpu.to_string()}},
            "spec": {"containers": [{"name": "c",
                "resources": {"limits": {"nvidia.com/gpu": count.to_string()}}}]}
        }),
        GpuDemand::Units { resource, count } => json!({
            "metadata": {"namespace": "ml"},
            "spec": {"containers": [{"name": "c",
                "resources": {"limits": {resource.as_str(): count.to_string()}}}]}
        }),
        other => panic!("no pod of {other:?} on a node shared per GPU"),
    };
    p["metadata"]["name"] = json!(uid);
    p["metadata"]["uid"] = json!(uid);
    p["spec"]["nodeName"] = json!(node);
    p["status"] = json!({"phase": "Running"});
    if let Some(g) = gpus {
        p["metadata"]["annotations"]["gpu-share.io/gpus"] = json!(g);
    }
    serde_json::from_value(p).expect("a pod")
}

fn observed(p: &Pod) -> ObservedPod {
    gpu_share::ledger::observed_holding(p)
        .expect("a readable pod")
        .expect("a pod that holds GPUs")
}

/// Every held pod as a Pod object (with the annotation bind wrote), read back as the extender's
/// watch and reconcile read pods.
fn listed_pods(l: &Ledger) -> Vec<ObservedPod> {
    let mut out = Vec::new();
    l.for_each_node(|nl| {
        for h in nl.holdings.values() {
            let gpus = (!matches!(h.demand.gpu, GpuDemand::ReservationPod { .. }))
                .then(|| h.placement.gpus_text());
            out.push(observed(&per_gpu_pod(
                &h.pod.uid,
                &nl.node.name,
                &h.demand.gpu,
                gpus,
            )));
        }
    });
    out.sort_by(|a, b| a.pod.uid.cmp(&b.pod.uid));
    out
}

/// One operation on the live ledger: a bind (of a pod not yet held: exactly when the packing
/// core places it), a delete, or a restart (a replica rebuilt from the API alone, which must
/// equal the live one). Returns the ledger to go on with.
fn step(
    live: Ledger,
    nodes: &[GpuNode],
    scorer: &Scorer,
    api: &Api,
    op: Op,
) -> Result<Ledger, TestCaseError> {
    match op {
        Op::Bind { pod, node, demand } => {
            let node = &nodes[node as usize % nodes.len()].name;
            let uid = format!("p{pod}");
            let (pref, demand) = (api.admit)(&uid, node, demand);
            let expected = live.node_of(&uid).is_none().then(|| {
                live.with_node(node, |nl| {
                    packing::place(
                        scorer,
                        &nl.node,
                        &nl.usage,
                        &demand,
                        &mut packing::FragMemo::default(),
                    )
                    .is_ok()
                })
                .expect("node")
            });
            let got = live.hold(scorer, node, pref, demand).is_ok();
            if let Some(expected) = expected {
                prop_assert_eq!(got, expected);
            }
            Ok(live)
        }
        Op::Delete { pod } => {
            live.release(&format!("p{pod}"));
            Ok(live)
        }
        Op::Restart => {
            let rebuilt = Ledger::rebuild(nodes.to_vec(), &(api.list)(&live));
            prop_assert_eq!(rebuilt.snapshot(), live.snapshot());
            Ok(rebuilt)
        }
    }
}

/// What the API would list: every held pod with its node and bind annotation.
fn api_view(l: &Ledger) -> Vec<ObservedPod> {
    l.observed()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn binds_never_overcommit_and_rebuild_matches(ops in proptest::collection::vec(op(), 1..120)) {
        let nodes = nodes();
        let mut live = Ledger::rebuild(nodes.clone(), &[]);
        let scorer = Scorer::new(PackingPolicy::GpuShare);
        for op in ops {
            live = step(live, &nodes, &scorer, &PLAIN, op)?;
            for nl in live.snapshot().values() {
                prop_assert!(nl.within_capacity(), "overcommitted {}: {:?}", nl.node.name, nl.usage);
                prop_assert!(nl.usage.gpu_milli.iter().all(|m| *m <= 1000), "GPU model over 100% on {}: {:?}", nl.node.name, nl.usage.gpu_milli);
                let whole_used: u32 = nl.holdings.values().map(|h| match h.demand.gpu {
                    GpuDemand::Whole { count } => count,
                    _ => 0,
                }).sum();
                prop_assert!(whole_used <= nl.node.slots, "{} whole GPUs held on {}", whole_used, nl.node.name);
            }
        }
        let rebuilt = Ledger::rebuild(nodes, &api_view(&live));
        prop_assert_eq!(rebuilt.snapshot(), live.snapshot());
    }

    /// On a node gpu-share shares per GPU, random binds of whole GPUs, device-plugin units and
    /// time-sliced shares (with and without memory), reservations and releases never put more
    /// than 100% or more than the GPU's memory on a GPU, never mix a whole holding with shares or
    /// a reservation on one GPU, and a rebuild from the API gives the same ledger. Every pod is
    /// the Pod object the API would hold (shares reading their GPU from a devices ConfigMap,
    /// reservation pods as gpu-share creates them), read as the extender reads pods.
    #[test]
    fn per_gpu_budgets_and_classes_hold_per_gpu(ops in proptest::collection::vec(per_gpu_op(), 1..120)) {
        let nodes = per_gpu_nodes();
        let mut live = Ledger::rebuild(nodes.clone(), &[]);
        let scorer = Scorer::new(PackingPolicy::GpuShare);
        for op in ops {
            live = step(live, &nodes, &scorer, &PER_GPU_OBJECTS, op)?;
            for nl in live.snapshot().values() {
                prop_assert!(nl.within_capacity(), "overcommitted {}: {:?}", nl.node.name, nl.usage);
                // The same, from the holdings alone.
                let gpus = nl.node.gpus as usize;
                let (mut milli, mut memory) = (vec![0u32; gpus], vec![0u64; gpus]);
                let (mut whole, mut shared) = (vec![0u32; gpus], vec![false; gpus]);
                for h in nl.holdings.values() {
                    match &h.demand.gpu {
                        GpuDemand::Timeslice { memory_mib, .. } => {
                            for (i, m) in &h.placement.gpus {
                                milli[*i as usize] += m;
                                memory[*i as usize] += memory_mib.unwrap_or(0);
                                shared[*i as usize] = true;
                            }
                        }
                        GpuDemand::ReservationPod { gpu, .. } => shared[*gpu as usize] = true,
                        _ => {
                            for (i, m) in &h.placement.gpus {
                                milli[*i as usize] += m;
                                whole[*i as usize] += 1;
                            }
                        }
                    }
                }
                let gpu_memory = nl.node.gpu_memory_mib.unwrap_or(u64::MAX);
                for i in 0..gpus {
                    prop_assert!(milli[i] <= 1000, "GPU {} of {} at {}", i, nl.node.name, milli[i]);
                    prop_assert!(memory[i] <= gpu_memory, "GPU {} of {}: {} MiB", i, nl.node.name, memory[i]);
                    prop_assert!(whole[i] <= 1 && !(whole[i] == 1 && shared[i]), "GPU {} of {} mixes classes: {:?}", i, nl.node.name, nl.holdings);
                }
            }
        }
        let rebuilt = Ledger::rebuild(nodes, &listed_pods(&live));
        prop_assert_eq!(rebuilt.snapshot(), live.snapshot());
    }

    /// On multi-GPU nodes the device plugin shares (time-slicing and MPS), random binds of
    /// shares and device-plugin units, releases and restarts never model a GPU past 100% nor
    /// past its memory, and what the node reports as used is exactly what its holdings place:
    /// each time-sliced share its budget, each replica its GPU's 1/replicas.
    #[test]
    fn replicated_nodes_never_put_a_gpu_past_its_whole(ops in proptest::collection::vec(replicated_op(), 1..120)) {
        let nodes = replicated_nodes();
        let mut live = Ledger::rebuild(nodes.clone(), &[]);
        let scorer = Scorer::new(PackingPolicy::GpuShare);
        for op in ops {
            live = step(live, &nodes, &scorer, &PLAIN, op)?;
            for nl in live.snapshot().values() {
                prop_assert!(nl.within_capacity(), "overcommitted {}: {:?}", nl.node.name, nl.usage);
                let gpus = nl.node.gpus as usize;
                let replica = 1000 / nl.node.sharing.replicas();
                let (mut milli, mut memory) = (vec![0u32; gpus], vec![0u64; gpus]);
                let mut placed = 0u64;
                for h in nl.holdings.values() {
                    let (each, mem) = match &h.demand.gpu {
                        GpuDemand::Timeslice { milli, memory_mib } => (*milli, memory_mib.unwrap_or(0)),
                        GpuDemand::Mps { .. } | GpuDemand::Units { .. } => (replica, 0),
                        other => return Err(TestCaseError::fail(format!("unexpected {other:?}"))),
                    };
                    let units = match &h.demand.gpu {
                        GpuDemand::Units { count, .. } => *count as usize,
                        _ => 1,
                    };
                    prop_assert_eq!(h.placement.gpus.len(), units, "{:?} placed as {:?}", h.demand.gpu, h.placement.gpus);
                    for (i, m) in &h.placement.gpus {
                        prop_assert_eq!(*m, each);
                        milli[*i as usize] += m;
                        memory[*i as usize] += mem;
                        placed += u64::from(*m);
                    }
                }
                for i in 0..gpus {
                    prop_assert!(milli[i] <= 1000, "GPU {} of {} at {}: {:?}", i, nl.node.name, milli[i], nl.holdings);
                    prop_assert!(memory[i] <= nl.node.gpu_memory_mib.unwrap(), "GPU {} of {}: {} MiB", i, nl.node.name, memory[i]);
                }
                prop_assert_eq!(milli, nl.usage.gpu_milli.clone());
                prop_assert_eq!(nl.usage.allocated_milli(), placed, "{} reports other than its holdings", nl.node.name);
            }
        }
        let rebuilt = Ledger::rebuild(nodes, &api_view(&live));
        prop_assert_eq!(rebuilt.snapshot(), live.snapshot());
    }

    /// Binds from several threads at once (as kube-scheduler's asynchronous binds arrive) never
    /// overcommit, and every bind that succeeded is in the ledger exactly once.
    #[test]
    fn concurrent_binds_never_overcommit(per_thread in proptest::collection::vec(proptest::collection::vec((0u8..4, demand()), 1..40), 4)) {
        let nodes = nodes();
        let ledger = Arc::new(Ledger::rebuild(nodes.clone(), &[]));
        let handles: Vec<_> = per_thread
            .into_iter()
            .enumerate()
            .map(|(t, binds)| {
                let ledger = ledger.clone();
                let nodes = nodes.clone();
                std::thread::spawn(move || {
                    let scorer = Scorer::new(PackingPolicy::Binpack);
                    let mut ok = Vec::new();
                    for (i, (node, demand)) in binds.into_iter().enumerate() {
                        let uid = format!("t{t}-{i}");
                        let pref = PodRef::new(uid.clone(), "ml", uid.clone());
                        if ledger.hold(&scorer, &nodes[node as usize].name, pref, Demand::gpu(demand)).is_ok() {
                            ok.push(uid);
                        }
                    }
                    ok
                })
            })
            .collect();
        let mut ok: Vec<String> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
        ok.sort();
        prop_assert_eq!(ledger.uids(), ok);
        for nl in ledger.snapshot().values() {
            prop_assert!(nl.within_capacity(), "overcommitted {}: {:?}", nl.node.name, nl.usage);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// The fragmentation memo each node ledger keeps between decisions never changes a
    /// decision: after any sequence of binds, deletes and workload refreshes, scoring a probe
    /// with the node's memo gives what scoring it afresh gives.
    #[test]
    fn memoised_scores_equal_fresh_ones(
        ops in proptest::collection::vec(op(), 1..80),
        cpus in proptest::collection::vec(0u64..=16, 80),
        probes in proptest::collection::vec((demand(), 0u64..=16), 1..6),
    ) {
        let nodes: Vec<GpuNode> = nodes()
            .into_iter()
            .map(|mut n| {
                n.cpu_milli = Some(48_000);
                n
            })
            .collect();
        let live = Ledger::rebuild(nodes.clone(), &[]);
        let mut seen = OnlineWorkload::default();
        let mut scorer = Scorer::new(PackingPolicy::GpuShare);
        for (k, op) in ops.into_iter().enumerate() {
            if let Op::Bind { pod, node, demand } = op {
                let demand = Demand { cpu_milli: cpus[k] * 1000, ..Demand::gpu(demand) };
                if seen.observe(&demand) {
                    let t = seen.target(&Homes::of(&nodes));
                    scorer = Scorer::with_workload(PackingPolicy::GpuShare, Arc::new(t));
                }
                let uid = format!("p{pod}");
                let pref = PodRef::new(uid.clone(), "ml", uid);
                let _ = live.hold(&scorer, &nodes[node as usize].name, pref, demand);
            } else if let Op::Delete { pod } = op {
                live.release(&format!("p{pod}"));
            }
            for (gpu, cpu) in &probes {
                let probe = Demand { cpu_milli: cpu * 1000, ..Demand::gpu(gpu.clone()) };
                for n in &nodes {
                    let (memo, fresh) = live
                        .with_node(&n.name, |nl| {
                            let fresh = packing::place(&scorer, &nl.node, &nl.usage, &probe, &mut packing::FragMemo::default());
                            let memo = packing::place(&scorer, &nl.node, &nl.usage, &probe, &mut nl.memo);
                            (memo, fresh)
                        })
                        .expect("node");
                    prop_assert_eq!(memo, fresh);
                }
            }
        }
        // A ledger's value is its pods, not its memos: rebuilt (no memo filled) it is equal.
        let rebuilt = Ledger::rebuild(nodes, &api_view(&live));
        prop_assert_eq!(rebuilt.snapshot(), live.snapshot());
    }
}

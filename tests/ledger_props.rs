//! Property tests: random sequences of bind / delete / restart never overcommit a node's MIG
//! devices, replicas, budgets or whole GPUs, and the ledger rebuilt from the API (the pods with
//! their node and bind annotation) equals the live one.

use gpu_share::extender::state::{ExtenderState, Mode};
use gpu_share::inventory::{GpuNode, MigLayout, Sharing};
use gpu_share::ledger::{Ledger, ObservedPod, PodRef};
use gpu_share::packing::{Demand, GpuDemand, PackingPolicy, Scorer};
use proptest::prelude::*;

fn nodes() -> Vec<GpuNode> {
    vec![
        GpuNode::whole("plain", "L40S", 4, 46068),
        GpuNode::shared("ts", "H100", 2, 81559, Sharing::TimeSlicing { replicas: 4 }),
        GpuNode::shared("mps", "H100", 2, 81559, Sharing::Mps { replicas: 4 }),
        GpuNode {
            gpus: 1,
            slots: 1,
            mig: MigLayout::Mixed {
                instances: [("1g.10gb".to_string(), 7), ("3g.40gb".to_string(), 2)].into(),
            },
            ..GpuNode::whole("mig", "A100", 1, 81920)
        },
    ]
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

/// What the API would list: every held pod with its node and bind annotation.
fn api_view(l: &Ledger) -> Vec<ObservedPod> {
    l.nodes
        .values()
        .flat_map(|nl| nl.holdings.values())
        .map(|h| ObservedPod {
            pod: h.pod.clone(),
            node: h.node.clone(),
            demand: h.demand.clone(),
            gpus: Some(h.placement.gpus.clone()),
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn binds_never_overcommit_and_rebuild_matches(ops in proptest::collection::vec(op(), 1..120)) {
        let nodes = nodes();
        let mut live = Ledger::rebuild(nodes.clone(), &[]);
        let scorer = Scorer::new(PackingPolicy::GpuShare);
        for op in ops {
            match op {
                Op::Bind { pod, node, demand } => {
                    let node = &nodes[node as usize].name;
                    let pref = PodRef { uid: format!("p{pod}"), namespace: "ml".into(), name: format!("p{pod}"), priority: 0 };
                    let _ = live.reserve(&scorer, node, pref, Demand::gpu(demand));
                }
                Op::Delete { pod } => {
                    live.release(&format!("p{pod}"));
                }
                Op::Restart => {
                    // A restarted replica rebuilds from the API alone.
                    let rebuilt = Ledger::rebuild(nodes.clone(), &api_view(&live));
                    prop_assert_eq!(&rebuilt.nodes, &live.nodes);
                    live = rebuilt;
                }
            }
            for nl in live.nodes.values() {
                prop_assert!(nl.within_capacity(), "overcommitted {}: {:?}", nl.node.name, nl.usage);
                let shared = matches!(nl.node.sharing, Sharing::TimeSlicing { .. } | Sharing::Mps { .. });
                prop_assert!(shared || nl.usage.gpu_milli.iter().all(|m| *m <= 1000), "GPU model over 100% on {}", nl.node.name);
                let whole_used = nl.holdings.values().filter(|h| matches!(h.demand.gpu, GpuDemand::Whole { .. })).count();
                prop_assert!(whole_used as u32 <= nl.node.slots);
            }
        }
        let rebuilt = Ledger::rebuild(nodes, &api_view(&live));
        prop_assert_eq!(rebuilt.nodes, live.nodes);
    }

    /// The concurrent per-node state the extender runs behaves as the single-threaded ledger.
    #[test]
    fn extender_state_matches_the_pure_ledger(ops in proptest::collection::vec(op(), 1..80)) {
        let nodes = nodes();
        let mut pure = Ledger::rebuild(nodes.clone(), &[]);
        let ext = ExtenderState::new(Mode::Dev, std::time::Duration::from_secs(60));
        for n in &nodes {
            ext.ledgers.upsert_node(n.clone());
        }
        let scorer = Scorer::new(PackingPolicy::Binpack);
        for op in ops {
            match op {
                Op::Bind { pod, node, demand } => {
                    let node = &nodes[node as usize].name;
                    let pref = PodRef { uid: format!("p{pod}"), namespace: "ml".into(), name: format!("p{pod}"), priority: 0 };
                    let a = pure.reserve(&scorer, node, pref.clone(), Demand::gpu(demand.clone()));
                    let b = ext.ledgers.reserve(&scorer, node, pref, Demand::gpu(demand));
                    prop_assert_eq!(a, b);
                }
                Op::Delete { pod } => {
                    let a = pure.release(&format!("p{pod}"));
                    let b = ext.ledgers.release(&format!("p{pod}"));
                    prop_assert_eq!(a, b);
                }
                Op::Restart => {}
            }
        }
        let snap: std::collections::BTreeMap<String, _> = ext.ledgers.snapshot().into_iter().map(|n| (n.node.name.clone(), n)).collect();
        prop_assert_eq!(snap, pure.nodes);
    }
}

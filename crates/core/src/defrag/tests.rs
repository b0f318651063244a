//! The planner on small clusters drawn by hand: nodes gpu-share shares per GPU (each shared GPU
//! held by its reservation), with whole-GPU pods that stay.

use super::*;
use crate::inventory::{GpuNode, Sharing};
use crate::packing::{self, Demand, FragMemo, GpuDemand, PackingPolicy, Placement, Scorer, Usage};

const A100: &str = "NVIDIA-A100-SXM4-80GB";

struct Node {
    node: GpuNode,
    usage: Usage,
    residents: Vec<Resident>,
}

/// Nodes of four A100s each, shared per GPU.
struct Cluster {
    nodes: Vec<Node>,
}

fn ts(pct: u32) -> Demand {
    Demand::gpu(GpuDemand::Timeslice {
        milli: pct * 10,
        memory_mib: None,
    })
}

fn exclusive(count: u32) -> Demand {
    Demand::gpu(GpuDemand::Whole { count })
}

fn movable(workload: &str) -> Mobility {
    Mobility::Movable(Movable {
        priority: 0,
        restart_cost: 1,
        workload: workload.into(),
    })
}

/// `demand`'s placement on GPU `gpu` of an empty node like `node`.
fn placed_on(node: &GpuNode, demand: &Demand, gpu: u32) -> Placement {
    let (mut p, _) = packing::place(
        &Scorer::new(PackingPolicy::GpuShare),
        node,
        &Usage::empty(node),
        demand,
        &mut FragMemo::default(),
    )
    .expect("fits an empty node");
    for g in &mut p.gpus {
        g.0 = gpu;
    }
    if p.reserve.is_some() {
        p.reserve = Some(gpu);
    }
    p
}

impl Cluster {
    fn new(nodes: usize) -> Cluster {
        Cluster {
            nodes: (0..nodes)
                .map(|i| {
                    let mut node = GpuNode::whole(&format!("n{i}"), A100, 4, 81920);
                    node.sharing = Sharing::PerGpu;
                    Node {
                        usage: Usage::empty(&node),
                        node,
                        residents: Vec::new(),
                    }
                })
                .collect(),
        }
    }

    /// Holds `demand` on GPU `gpu` of node `n`; a share's first on its GPU brings the GPU's
    /// reservation.
    fn add(
        &mut self,
        n: usize,
        id: &str,
        demand: Demand,
        gpu: u32,
        mobility: Mobility,
    ) -> &mut Self {
        let node = &mut self.nodes[n];
        let share = matches!(
            demand.gpu,
            GpuDemand::Timeslice { .. } | GpuDemand::Mps { .. }
        );
        if share && node.usage.reserved[gpu as usize] == 0 {
            let r = Demand::gpu(GpuDemand::ReservationPod {
                gpu,
                mps: false,
                cdi_device: false,
            });
            let p = placed_on(&node.node, &r, gpu);
            packing::apply(&mut node.usage, &p);
            node.residents.push(Resident {
                id: format!("reserve-{}-{gpu}", node.node.name),
                key: format!("gpu-share/reserve-{}-{gpu}", node.node.name),
                demand: r,
                placement: p,
                mobility: Mobility::Reservation,
            });
        }
        let p = placed_on(&node.node, &demand, gpu);
        packing::apply(&mut node.usage, &p);
        node.residents.push(Resident {
            id: id.into(),
            key: format!("ns/{id}"),
            demand,
            placement: p,
            mobility,
        });
        self
    }

    /// Every GPU of node `n` but those listed held whole by a pod that stays.
    fn whole_except(&mut self, n: usize, keep: &[u32]) -> &mut Self {
        for g in 0..4 {
            if !keep.contains(&g) {
                let id = format!("whole-{n}-{g}");
                self.add(
                    n,
                    &id,
                    exclusive(1),
                    g,
                    Mobility::Pinned(Pinned::NoController),
                );
            }
        }
        self
    }

    fn sites(&self) -> Vec<Site<'_>> {
        self.nodes
            .iter()
            .map(|n| Site {
                node: &n.node,
                usage: &n.usage,
                residents: &n.residents,
            })
            .collect()
    }

    fn plan(&self, waiting: &Demand, limits: &Limits) -> Result<Plan, NoPlan> {
        plan(
            &Scorer::new(PackingPolicy::GpuShare),
            &self.sites(),
            &Waiting {
                demand: waiting,
                priority: 0,
            },
            limits,
            |_, _| true,
        )
    }
}

/// The picture from the issue, made small: node 0's one shared GPU holds a quarter, node 1's
/// three quarters; every other GPU is held whole. An `exclusive-1` pod waits; one move (the
/// quarter onto node 1's GPU) frees node 0's GPU, whose reservation is released with it.
#[test]
fn one_move_frees_a_whole_gpu() {
    let mut c = Cluster::new(2);
    c.add(0, "a", ts(25), 0, movable("ns/ReplicaSet/a"))
        .whole_except(0, &[0])
        .add(1, "b", ts(50), 0, movable("ns/ReplicaSet/b"))
        .add(1, "c", ts(25), 0, movable("ns/ReplicaSet/c"))
        .whole_except(1, &[0]);
    let plan = c.plan(&exclusive(1), &Limits::default()).expect("a plan");
    assert_eq!(plan.node, "n0");
    assert_eq!(plan.placement.gpus, [(0, 1000)]);
    assert_eq!(plan.releases, ["reserve-n0-0"]);
    assert_eq!(plan.moves.len(), 1);
    let m = &plan.moves[0];
    assert_eq!(
        (m.id.as_str(), m.from.as_str(), m.to.as_str()),
        ("a", "n0", "n1")
    );
    assert_eq!(m.placement.gpus, [(0, 250)]);
    assert_eq!(m.workload, "ns/ReplicaSet/a");
    assert_eq!(
        plan.to_string(),
        "moving ns/a from node n0 to n1 makes room on node n0 (GPU 0), releasing 1 reservation(s) left with no share"
    );
    assert_eq!(
        plan.cost,
        Cost {
            restarts: 1,
            top_priority: 0,
            moves: 1
        }
    );
}

/// A pod that fits as things stand needs no plan, and the answer says where it fits.
#[test]
fn nothing_moves_for_a_pod_that_fits() {
    let mut c = Cluster::new(1);
    c.add(0, "a", ts(25), 0, movable("w"));
    let why = c.plan(&exclusive(1), &Limits::default()).unwrap_err();
    assert_eq!(why.fits.as_deref(), Some("n0"));
    assert!(why.to_string().contains("nothing needs to move"), "{why}");
}

/// Pods that stay are never moved, and the refusal says why they stay.
#[test]
fn pinned_pods_stay_and_the_refusal_says_why() {
    for (mobility, words) in [
        (
            Mobility::Pinned(Pinned::NoController),
            "no controller would recreate them",
        ),
        (Mobility::Pinned(Pinned::OptedOut), "they opt out"),
        (
            Mobility::Pinned(Pinned::NotOptedIn),
            "neither their namespace nor their workload",
        ),
        (Mobility::Pinned(Pinned::CoolingDown), "within the cooldown"),
        (
            Mobility::Movable(Movable {
                priority: 100,
                restart_cost: 1,
                workload: "w".into(),
            }),
            "priority is higher than the waiting pod's",
        ),
    ] {
        let mut c = Cluster::new(2);
        c.add(0, "a", ts(25), 0, mobility)
            .whole_except(0, &[0])
            .add(1, "b", ts(80), 0, movable("w2"))
            .whole_except(1, &[0]);
        let why = c.plan(&exclusive(1), &Limits::default()).unwrap_err();
        assert_eq!(why.fits, None);
        assert_eq!(why.nodes, 2);
        // Node 0's pod stays; node 1's could leave, but its 80% fits on no GPU in use.
        assert_eq!((why.no_room, why.no_target), (1, 1), "{why:?}");
        let text = why.to_string();
        assert!(text.contains(words), "{text}");
    }
}

/// A move never lands a share on an empty GPU (which would be a new fragment): with no used GPU
/// to take it, the plan is refused and names the pod.
#[test]
fn a_move_breaks_no_free_gpu() {
    let mut c = Cluster::new(2);
    c.add(0, "a", ts(25), 0, movable("w"))
        .whole_except(0, &[0])
        // Node 1: GPU 0 nine tenths full, GPU 1 free: the share fits only on the free GPU. An
        // exclusive-2 pod waits, so node 1's free GPU alone is not room.
        .add(1, "b", ts(90), 0, Mobility::Pinned(Pinned::NoController))
        .whole_except(1, &[0, 1]);
    let why = c.plan(&exclusive(2), &Limits::default()).unwrap_err();
    assert_eq!((why.no_room, why.no_target), (2, 0), "{why:?}");
    // Node 0 with two GPUs emptied would need its three whole pods moved; they stay. And an
    // exclusive-1 pod fits node 1's free GPU as things stand.
    assert!(why.to_string().contains("no controller"), "{why}");
    let mut c = Cluster::new(2);
    c.add(0, "a", ts(25), 0, movable("w"))
        .whole_except(0, &[0])
        .add(1, "b", ts(90), 0, Mobility::Pinned(Pinned::NoController))
        .add(1, "c", ts(90), 1, Mobility::Pinned(Pinned::NoController))
        .whole_except(1, &[0, 1]);
    // Node 1's GPUs each have a tenth free: the quarter fits nowhere but an empty GPU, of
    // which there is none: no target.
    let why = c.plan(&exclusive(1), &Limits::default()).unwrap_err();
    assert_eq!(why.no_target, 1, "{why:?}");
    assert_eq!(why.stranded.as_deref(), Some("ns/a"));
    assert!(
        why.to_string().contains("without breaking a free GPU"),
        "{why}"
    );
}

/// Room that takes more moves than the limit allows is refused, with the fewest it needs; with
/// the limit raised, the same room is the plan.
#[test]
fn over_the_limit_is_refused_with_the_fewest_moves() {
    let mut c = Cluster::new(2);
    c.add(0, "a", ts(25), 0, movable("w"))
        .add(0, "b", ts(25), 0, movable("w"))
        .add(0, "c", ts(25), 0, movable("w"))
        .whole_except(0, &[0])
        .add(1, "d", ts(10), 0, Mobility::Pinned(Pinned::NoController))
        .whole_except(1, &[0]);
    let limits = Limits {
        moves_per_gpu: 2,
        ..Limits::default()
    };
    let why = c.plan(&exclusive(1), &limits).unwrap_err();
    assert_eq!((why.over_limit, why.fewest_moves), (1, Some(3)), "{why:?}");
    assert!(
        why.to_string().contains("more moves than the limit of 2"),
        "{why}"
    );
    let plan = c
        .plan(
            &exclusive(1),
            &Limits {
                moves_per_gpu: 3,
                ..Limits::default()
            },
        )
        .expect("a plan");
    assert_eq!(plan.node, "n0");
    assert_eq!(plan.moves.len(), 3);
    assert!(plan.moves.iter().all(|m| m.to == "n1"));
}

/// Of two nodes, the one whose room costs fewer restarts: a pod whose workload weighs its
/// restart at 3 stays, and two pods of cost 1 move instead.
#[test]
fn the_cheapest_room_is_chosen() {
    let mut c = Cluster::new(3);
    c.add(
        0,
        "costly",
        ts(30),
        0,
        Mobility::Movable(Movable {
            priority: 0,
            restart_cost: 3,
            workload: "w-costly".into(),
        }),
    )
    .whole_except(0, &[0])
    .add(1, "x", ts(20), 0, movable("w"))
    .add(1, "y", ts(20), 0, movable("w"))
    .whole_except(1, &[0])
    // The targets: node 2's GPU 0 has 40% free.
    .add(2, "z", ts(60), 0, Mobility::Pinned(Pinned::NoController))
    .whole_except(2, &[0]);
    let plan = c.plan(&exclusive(1), &Limits::default()).expect("a plan");
    assert_eq!(plan.node, "n1");
    assert_eq!(plan.cost.restarts, 2);
    let mut moved: Vec<&str> = plan.moves.iter().map(|m| m.id.as_str()).collect();
    moved.sort();
    assert_eq!(moved, ["x", "y"]);
    assert!(plan.moves.iter().all(|m| m.to != "n1"));
}

/// Room for a share: a `timeslice-50` pod waits where no GPU has half free. Moving the larger
/// share would be the fewest thousandths moved, but it fits nowhere else; the smaller one does,
/// and its leaving makes room too.
#[test]
fn room_for_a_share() {
    let mut c = Cluster::new(2);
    c.add(0, "a", ts(40), 0, movable("w"))
        .add(0, "b", ts(20), 0, movable("w"))
        .whole_except(0, &[0])
        .add(1, "c", ts(70), 0, Mobility::Pinned(Pinned::NoController))
        .whole_except(1, &[0]);
    let plan = c.plan(&ts(50), &Limits::default()).expect("a plan");
    assert_eq!(plan.node, "n0");
    assert_eq!(plan.moves.len(), 1);
    assert_eq!(plan.moves[0].id, "b");
    assert_eq!(plan.moves[0].to, "n1");
    // No reservation is released: node 0's GPU keeps a share.
    assert!(plan.releases.is_empty());
}

/// The waiting pod goes only where it may, and so does each replacement.
#[test]
fn nodes_the_pods_may_not_use_are_left_alone() {
    let mut c = Cluster::new(3);
    c.add(0, "a", ts(25), 0, movable("w"))
        .whole_except(0, &[0])
        .add(1, "b", ts(75), 0, movable("w"))
        .whole_except(1, &[0])
        .add(2, "c", ts(75), 0, movable("w"))
        .whole_except(2, &[0]);
    let sites = c.sites();
    let waiting = exclusive(1);
    let plan = plan(
        &Scorer::new(PackingPolicy::GpuShare),
        &sites,
        &Waiting {
            demand: &waiting,
            priority: 0,
        },
        &Limits::default(),
        |guest, node| match guest {
            Guest::Waiting => node == "n0",
            Guest::Moved(_) => node != "n1",
        },
    )
    .expect("a plan");
    assert_eq!(plan.node, "n0");
    assert_eq!(plan.moves[0].to, "n2");
}

/// A pod refused for CPU beside a free GPU: the pod to move is the one that takes no GPU, which
/// goes wherever CPU is left, not the exclusive pod beside it, which frees as much CPU but needs
/// a free GPU elsewhere (of which there is none).
#[test]
fn cpu_is_made_beside_a_free_gpu() {
    let mut c = Cluster::new(2);
    for n in &mut c.nodes {
        n.node.cpu_milli = Some(64_000);
        n.node.memory_mib = Some(262_144);
        n.usage = Usage::empty(&n.node);
    }
    let with_cpu = |mut d: Demand, cpu: u64| {
        d.cpu_milli = cpu;
        d
    };
    let cpu_only = Demand {
        cpu_milli: 20_000,
        ..Demand::gpu(GpuDemand::None)
    };
    // Node 0: GPU 0 free; GPU 1 an exclusive pod that may move, with 30 CPUs; GPUs 2 and 3 held
    // by pods that stay; and a pod of 20 CPUs and no GPU. 6 CPUs are left.
    c.add(
        0,
        "big",
        with_cpu(exclusive(1), 30_000),
        1,
        movable("w-big"),
    )
    .add(
        0,
        "stay-2",
        with_cpu(exclusive(1), 4_000),
        2,
        Mobility::Pinned(Pinned::NoController),
    )
    .add(
        0,
        "stay-3",
        with_cpu(exclusive(1), 4_000),
        3,
        Mobility::Pinned(Pinned::NoController),
    )
    .add(0, "cpu", cpu_only, 0, movable("w-cpu"));
    // Node 1: every GPU held by a pod that stays, 48 CPUs left.
    for g in 0..4 {
        c.add(
            1,
            &format!("stay-1-{g}"),
            with_cpu(exclusive(1), 4_000),
            g,
            Mobility::Pinned(Pinned::NoController),
        );
    }
    let waiting = with_cpu(exclusive(1), 16_000);
    let plan = c.plan(&waiting, &Limits::default()).expect("a plan");
    assert_eq!(plan.node, "n0");
    assert_eq!(plan.placement.gpus, [(0, 1000)]);
    let moved: Vec<(&str, &str)> = plan
        .moves
        .iter()
        .map(|m| (m.id.as_str(), m.to.as_str()))
        .collect();
    assert_eq!(moved, [("cpu", "n1")]);
    // With that pod pinned, the exclusive pod would have to go, and has nowhere to.
    for r in &mut c.nodes[0].residents {
        if r.id == "cpu" {
            r.mobility = Mobility::Pinned(Pinned::NotOptedIn);
        }
    }
    let why = c.plan(&waiting, &Limits::default()).unwrap_err();
    assert_eq!(why.stranded.as_deref(), Some("ns/big"), "{why:?}");
}

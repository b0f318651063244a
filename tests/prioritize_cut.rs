//! A prioritize answer that lists only the nodes that score above 0 (`packing::listed_scores`;
//! not served yet: with it, the cluster test's preemption point failed, docs/cluster-scale.md):
//! replayed over the packing traces through the extender's own state and scoring (the calls its
//! prioritize handler makes), every node's score as kube-scheduler reads it (an unlisted node
//! scores 0) equals the full answer's, so the node chosen does not change. How much shorter the
//! answer is depends on the cluster: about half the scores on the openb traces, whose nodes
//! differ in CPU and GPUs, most of them on a cluster of identical, mostly empty nodes
//! (docs/cluster-scale.md).

use std::path::Path;
use std::time::Duration;

use gpu_share::extender::handlers;
use gpu_share::extender::state::{ExtenderState, Mode};
use gpu_share::ledger::PodRef;
use gpu_share::packing::{self, PackingPolicy};
use gpu_share::simulate::driver;

/// Places the trace's pods in name order through the extender's state and compares, for every
/// pod, the full prioritize answer with the cut one. Returns (nodes scored, nodes listed).
fn replay(inputs: &driver::Inputs, limit: usize) -> (usize, usize) {
    let ext = ExtenderState::new(Mode::Dev, Duration::from_secs(60));
    for n in &inputs.nodes {
        ext.ledger().upsert_node(n.clone());
    }
    let names: Vec<String> = inputs.nodes.iter().map(|n| n.name.clone()).collect();
    let mut pods: Vec<_> = inputs.pods.iter().collect();
    pods.sort_by(|a, b| a.name.cmp(&b.name));
    let policy = PackingPolicy::GpuShare;
    let (mut scored, mut listed, mut placed) = (0, 0, 0);
    for (i, pod) in pods.into_iter().take(limit).enumerate() {
        ext.observe_demand(&pod.demand, policy);
        let scorer = ext.scorer(policy);
        // What prioritize computes for every node it is sent (here: every node), and its full
        // answer: every node, 0 where it does not fit.
        let raw = handlers::raw_scores(&ext, &scorer, &names, &pod.demand);
        if raw.iter().all(Option::is_none) {
            continue;
        }
        let full = packing::node_scores(&raw);
        // The cut answer, as kube-scheduler reads it.
        let cut = packing::listed_scores(&raw);
        let mut read = vec![0i64; names.len()];
        for &(n, score) in &cut {
            assert!(score > 0, "pod {i}: a listed node scores 0");
            read[n] = score;
        }
        assert_eq!(
            read, full,
            "pod {i} ({}): the cut changed a score",
            pod.name
        );
        scored += names.len();
        listed += cut.len();
        // kube-scheduler takes a node of the highest total; among the fitting nodes of the
        // highest score both answers give the same set, and a listed node of that score exists.
        let best = *full.iter().max().unwrap();
        let chosen = (0..names.len())
            .find(|&n| raw[n].is_some() && full[n] == best)
            .unwrap();
        assert!(
            cut.iter().any(|&(n, s)| n == chosen && s == best),
            "pod {i}: the chosen node is not listed"
        );
        let who = PodRef {
            uid: format!("uid-{i}"),
            namespace: "trace".into(),
            name: pod.name.clone(),
            priority: 0,
        };
        if ext
            .ledger()
            .reserve(&scorer, &names[chosen], who, pod.demand.clone())
            .is_ok()
        {
            placed += 1;
        }
    }
    assert!(placed > 0, "nothing was placed");
    (scored, listed)
}

#[test]
fn the_cut_prioritize_answer_chooses_the_same_nodes_on_the_trace_fixture() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/simulate");
    let inputs = driver::load(&dir.join("nodes.csv"), &dir.join("pods.csv")).unwrap();
    let (scored, listed) = replay(&inputs, usize::MAX);
    eprintln!("prioritize cut, trace fixture: {listed} of {scored} node scores listed");
    // Many nodes sit at the lowest score (empty ones, for a packing policy).
    assert!(
        listed < scored,
        "the cut answer listed {listed} of {scored} node scores"
    );
}

/// The full openb traces (../shared/data/openb): the default one and the variants the
/// simulator's CI checks replay. `cargo test --release --test prioritize_cut -- --ignored`.
#[test]
#[ignore = "needs ../shared/data/openb: cargo test --release --test prioritize_cut -- --ignored"]
fn the_cut_prioritize_answer_chooses_the_same_nodes_on_the_full_traces() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/openb");
    for name in ["default", "gpushare100", "multigpu50"] {
        let inputs = driver::load(
            &data.join("openb_node_list_gpu_node.csv"),
            &data.join(format!("openb_pod_list_{name}.csv")),
        )
        .expect("the openb trace in ../shared/data/openb");
        let (scored, listed) = replay(&inputs, usize::MAX);
        eprintln!("prioritize cut, trace {name}: {listed} of {scored} node scores listed");
        assert!(listed < scored, "{name}: the cut left no node out");
    }
}

//! Filter's best tier (`packing.candidates: best`, `packing::best_tier`), replayed over the
//! packing traces through the extender's own state and scoring (the calls its filter and
//! prioritize handlers make). kube-scheduler scores only the nodes filter passes, so the tier's
//! size is what it is spared per pod. The replay checks what the tier keeps of the choice:
//! - the node the packing ranks best is always passed;
//! - the nodes prioritize then ranks top (on the tier's own range) are a subset of those it
//!   ranked top when every fitting node was passed, so kube-scheduler's own scores choose among
//!   fewer, better packed nodes, never among worse ones.

use std::path::Path;
use std::time::Duration;

use gpu_share::extender::handlers;
use gpu_share::extender::state::{ExtenderState, Mode};
use gpu_share::ledger::PodRef;
use gpu_share::packing::{self, PackingPolicy};
use gpu_share_simulator::driver;

/// What the replay counts over the pods that fit somewhere.
#[derive(Debug, Default)]
struct Counts {
    pods: usize,
    /// Nodes sent (every node, for every pod).
    sent: usize,
    /// Fitting nodes (what filter passed under `candidates: all`).
    fitting: usize,
    /// Nodes in the best tier (what filter passes under `best`).
    tier: usize,
}

/// Places the trace's pods in name order through the extender's state, each on the best node
/// of the tier, and checks the tier's properties for every pod.
fn replay(inputs: &driver::Inputs) -> Counts {
    let ext = ExtenderState::new(Mode::Dev, Duration::from_secs(60));
    for n in &inputs.nodes {
        ext.set_node(&n.name, Some(n.clone()));
    }
    let names: Vec<String> = inputs.nodes.iter().map(|n| n.name.clone()).collect();
    let mut pods: Vec<_> = inputs.pods.iter().collect();
    pods.sort_by(|a, b| a.name.cmp(&b.name));
    let policy = PackingPolicy::GpuShare;
    let mut counts = Counts::default();
    let mut placed = 0;
    for (i, pod) in pods.into_iter().enumerate() {
        ext.observe_demand(&pod.demand, policy);
        let scorer = ext.scorer(policy);
        let raw = handlers::raw_scores(&ext, &scorer, &names, &pod.demand);
        if raw.iter().all(Option::is_none) {
            continue;
        }
        let full = packing::node_scores(&raw);
        let tier = packing::best_tier(&raw);
        // The node the packing ranks best (the first of equals).
        let best = (0..names.len())
            .filter(|&n| raw[n].is_some())
            .max_by(|&a, &b| raw[a].partial_cmp(&raw[b]).unwrap().then(b.cmp(&a)))
            .unwrap();
        assert!(
            tier[best],
            "pod {i} ({}): the best node is not passed",
            pod.name
        );
        // Prioritize over the tier alone, as kube-scheduler then sends it.
        let kept: Vec<usize> = (0..names.len()).filter(|&n| tier[n]).collect();
        let kept_raw: Vec<Option<f64>> = kept.iter().map(|&n| raw[n]).collect();
        let ranked = packing::node_scores(&kept_raw);
        for (k, &n) in kept.iter().enumerate() {
            assert!(
                raw[n].is_some(),
                "pod {i}: a node that does not fit is passed"
            );
            if ranked[k] == packing::MAX_SCORE {
                assert_eq!(
                    full[n],
                    packing::MAX_SCORE,
                    "pod {i} ({}): a node ranked top over the tier was not top over every fitting node",
                    pod.name
                );
            }
        }
        assert_eq!(
            ranked[kept.iter().position(|&n| n == best).unwrap()],
            packing::MAX_SCORE
        );
        counts.pods += 1;
        counts.sent += names.len();
        counts.fitting += raw.iter().filter(|r| r.is_some()).count();
        counts.tier += kept.len();
        let who = PodRef::new(format!("uid-{i}"), "trace", pod.name.clone());
        let mut binding = ext.begin_bind(&format!("uid-{i}"), &names[best], false);
        if binding.hold(&scorer, who, pod.demand.clone()).is_ok() {
            binding.commit();
            placed += 1;
        } else {
            binding.abort();
        }
    }
    assert!(placed > 0, "nothing was placed");
    counts
}

#[test]
fn the_best_tier_keeps_the_best_node_on_the_trace_fixture() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/simulate");
    let inputs = driver::load(&dir.join("nodes.csv"), &dir.join("pods.csv")).unwrap();
    let c = replay(&inputs);
    eprintln!("filter tier, trace fixture: {c:?}");
    assert!(c.pods > 0);
    assert!(
        c.tier < c.fitting,
        "the tier passed every fitting node: {c:?}"
    );
}

/// The full openb traces (../shared/data/openb): the default one and the variants the
/// simulator's CI checks replay. `cargo test --release --test filter_tier -- --ignored`.
#[test]
#[ignore = "needs ../shared/data/openb: cargo test --release --test filter_tier -- --ignored"]
fn the_best_tier_keeps_the_best_node_on_the_full_traces() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/openb");
    for name in ["default", "gpushare100", "multigpu50"] {
        let inputs = driver::load(
            &data.join("openb_node_list_gpu_node.csv"),
            &data.join(format!("openb_pod_list_{name}.csv")),
        )
        .expect("the openb trace in ../shared/data/openb");
        let c = replay(&inputs);
        eprintln!(
            "filter tier, trace {name}: {} pods; per pod {:.0} nodes sent, {:.0} fitting, {:.1} passed",
            c.pods,
            c.sent as f64 / c.pods as f64,
            c.fitting as f64 / c.pods as f64,
            c.tier as f64 / c.pods as f64
        );
        assert!(
            c.tier < c.fitting,
            "{name}: the tier passed every fitting node"
        );
    }
}

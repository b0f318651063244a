//! Binds in parallel: whether binds to different nodes wait for each other in the ledger, and how
//! long each lock is held.
//!
//! `cargo bench --bench binds` (the `bench` profile; `THREADS=1,2,4 ROUNDS=5` to change it):
//! - **Throughput.** 5,000 nodes of four kinds (time-sliced H100, whole A100, MPS L40S, MIG
//!   A100), the `gpu-share` policy with a learnt workload. Each of T threads binds pods of mixed
//!   classes to its own nodes (thread t takes nodes t, t + T, ...) through `Ledger::hold`, the
//!   ledger half of bind, then releases them; binds per second for T = 1, 2 and 4, each the
//!   median of ROUNDS rounds, with the range. Where binds serialize, T threads bind no faster
//!   than one.
//! - **Hold times.** The two sections a bind runs under a lock, timed one by one on the same
//!   nodes: the placement (`NodeLedger::plan`, under the node's lock alone) and the record
//!   (`NodeLedger::commit` and the index's insert, under the index's lock). p50 and p99.
//!
//! It prints a table; docs/performance.md keeps the run's numbers and the machine.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gpu_share::extender::state::{ExtenderState, Mode};
use gpu_share::inventory::GpuNode;
use gpu_share::ledger::{Ledger, NodeLedger, PodRef};
use gpu_share::packing::{Demand, PackingPolicy, Scorer};

mod nodes;

const NODES: usize = 5000;
/// Binds per thread per round.
const BINDS: usize = 20_000;

/// The requests node `i` is bound, by its kind: what fits it.
fn kinds(i: usize) -> &'static [&'static str] {
    match i % 10 {
        0..=3 => &["timeslice-30", "timeslice-50", "timeslice-20"],
        4..=6 => &["exclusive-1", "exclusive-4", "exclusive-2"],
        7..=8 => &["mps-25", "mps-50"],
        _ => &["mig-1g.10gb", "mig-3g.40gb"],
    }
}

fn node(i: usize) -> GpuNode {
    let mut n = nodes::gpu_node(i);
    n.cpu_milli = Some(192_000);
    n
}

fn request(text: &str) -> Demand {
    let r = gpu_share::request::GpuRequest::parse_normalized(text).expect("a valid request");
    Demand {
        cpu_milli: 4000,
        ..Demand::gpu(gpu_share::ledger::demand_of_request(&r))
    }
}

fn pod_ref(uid: String) -> PodRef {
    PodRef::new(uid.clone(), "bench", uid)
}

/// Each node's demands, by the node's index.
fn demands() -> Vec<Vec<Demand>> {
    (0..NODES)
        .map(|i| kinds(i).iter().map(|k| request(k)).collect())
        .collect()
}

/// The ledger's nodes, and a scorer with the workload the extender learns over them.
fn cluster() -> (Ledger, Scorer, Vec<String>) {
    let ext = ExtenderState::new(Mode::Dev, Duration::from_secs(3600));
    let ledger = Ledger::new();
    for i in 0..NODES {
        ext.set_node(&node(i).name, Some(node(i)));
        ledger.upsert_node(node(i));
    }
    for k in 0..2048 {
        let kinds = kinds(k);
        ext.observe_demand(&request(kinds[k % kinds.len()]), PackingPolicy::GpuShare);
    }
    let scorer = ext.scorer(PackingPolicy::GpuShare);
    // Warm, as the extender warms its own nodes' memos for a learnt workload.
    ledger.for_each_node(|nl| scorer.warm_memo(&nl.node, &nl.usage, &mut nl.memo));
    let names = (0..NODES).map(|i| node(i).name).collect();
    (ledger, scorer, names)
}

/// One round: `threads` threads each bind BINDS pods to their own nodes and release them.
/// Binds per second over the round.
fn round(
    ledger: &Ledger,
    scorer: &Scorer,
    names: &[String],
    demands: &[Vec<Demand>],
    threads: usize,
) -> f64 {
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                let mine: Vec<usize> = (t..names.len()).step_by(threads).collect();
                let mut held = Vec::new();
                for i in 0..BINDS {
                    let uid = format!("t{t}-{i}");
                    let n = mine[i % mine.len()];
                    let d = &demands[n];
                    let ok = ledger
                        .hold(
                            scorer,
                            &names[n],
                            pod_ref(uid.clone()),
                            d[(i / mine.len()) % d.len()].clone(),
                        )
                        .is_ok();
                    if ok {
                        held.push(uid);
                    }
                    // Keep the nodes part full: release the oldest once a thread holds 4 a node.
                    if held.len() > 4 * mine.len() {
                        ledger.release(&held.remove(0));
                    }
                }
                for uid in held {
                    ledger.release(&uid);
                }
            });
        }
    });
    (threads * BINDS) as f64 / start.elapsed().as_secs_f64()
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// The sections a bind holds a lock for, timed on copies of the nodes.
fn hold_times(
    ledger: &Ledger,
    scorer: &Scorer,
    names: &[String],
    demands: &[Vec<Demand>],
) -> [(Duration, Duration); 2] {
    let mut plan = Vec::new();
    let mut commit = Vec::new();
    let index: Mutex<HashMap<String, String>> = Mutex::new(HashMap::new());
    for (i, name) in names.iter().enumerate().take(4000) {
        let Some(mut nl): Option<NodeLedger> = ledger.with_node(name, |nl| nl.clone()) else {
            continue;
        };
        let demand = demands[i][i % demands[i].len()].clone();
        let t = Instant::now();
        let planned = nl.plan(scorer, &demand);
        plan.push(t.elapsed());
        if let Ok(p) = planned {
            let uid = format!("hold-{i}");
            let t = Instant::now();
            let mut ix = index.lock().unwrap();
            black_box(nl.commit(pod_ref(uid.clone()), demand, p));
            ix.insert(uid, name.clone());
            drop(ix);
            commit.push(t.elapsed());
        }
    }
    plan.sort();
    commit.sort();
    [
        (percentile(&plan, 0.5), percentile(&plan, 0.99)),
        (percentile(&commit, 0.5), percentile(&commit, 0.99)),
    ]
}

fn main() {
    let threads: Vec<usize> = std::env::var("THREADS")
        .ok()
        .map(|s| s.split(',').filter_map(|t| t.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2, 4]);
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let (ledger, scorer, names) = cluster();
    let demands = demands();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "binds in parallel: {NODES} nodes, {BINDS} binds per thread per round, {rounds} rounds, {cores} cores"
    );
    round(&ledger, &scorer, &names, &demands, 1);
    let mut base = None;
    println!("| threads | binds/s (median) | range | vs 1 thread |");
    println!("|---|---|---|---|");
    for &t in &threads {
        let mut r: Vec<f64> = (0..rounds)
            .map(|_| round(&ledger, &scorer, &names, &demands, t))
            .collect();
        r.sort_by(f64::total_cmp);
        let median = r[r.len() / 2];
        let base = *base.get_or_insert(median);
        println!(
            "| {t} | {median:.0} | {:.0}-{:.0} | {:.2}x |",
            r[0],
            r[r.len() - 1],
            median / base
        );
    }
    let [(plan50, plan99), (commit50, commit99)] = hold_times(&ledger, &scorer, &names, &demands);
    println!("| held | lock | p50 | p99 |");
    println!("|---|---|---|---|");
    println!("| placement | the node's | {plan50:?} | {plan99:?} |");
    println!("| record | the index's | {commit50:?} | {commit99:?} |");
}

//! Per-decision cost of the extender over a 5,000-node cluster, and one simulator replay.
//!
//! `cargo bench --bench decision` runs criterion on:
//! - `extender/filter_5000`, `extender/prioritize_5000`: one verb over 5,000 node names with the
//!   `gpu-share` policy and a learnt workload, on a partly filled cluster (time-sliced H100,
//!   plain A100, MPS L40S and MIG A100 nodes);
//! - `extender/filter_5000_owned`: filter for a Deployment's pod (owned by its ReplicaSet), whose
//!   best tier is ranked as kube-scheduler's default topology spread would rank it;
//!   `filter_5000_empty` and `filter_5000_empty_owned`: a bare and an owned pod on the same nodes
//!   empty, where the best tier is every node of the pod's kind (3,000 time-sliced nodes);
//! - `extender/bind_reserve`: the ledger half of bind (`Binding::hold`: fit re-check and record)
//!   and its undo (`Binding::abort`);
//! - `simulate/fgd_replay`: one replay of the default openb trace (or the test slice when
//!   ../shared/data is absent).
//!
//! Before criterion's groups it times 2,000 single prioritize decisions and prints their p50 and
//! p99 (the extender's budget: 2 ms p99 at 5,000 nodes), twice: for a stream of pods of mixed
//! classes, each bound before the next (the steady state), and with every node's fragmentation
//! memo emptied before each decision (the worst case).

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use gpu_share::extender::state::{ExtenderState, Mode};
use gpu_share::extender::wire::{ExtenderArgs, HostPriority};
use gpu_share::extender::{handlers, wire};
use gpu_share::inventory::GpuNode;
use gpu_share::ledger::PodRef;
use gpu_share::metrics::Metrics;
use gpu_share::packing::TYPICAL_COVERAGE;
use gpu_share::packing::frag::TargetWorkload;
use gpu_share::packing::{Demand, FragMemo, PackingPolicy, Scorer};
use gpu_share::policy::Policy;
use gpu_share::server::LoadedPolicy;
use gpu_share_simulator::{driver, replay};
use k8s_openapi::api::core::v1::Pod;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod nodes;
use nodes::gpu_node;

const NODES: usize = 5000;

/// Node `i`, with its allocatable CPU (the `gpu-share` measure reads it).
fn node(i: usize) -> GpuNode {
    let mut n = gpu_node(i);
    n.cpu_milli = Some(if i % 10 >= 7 && i % 10 <= 8 {
        64_000
    } else {
        192_000
    });
    n
}

fn request(text: &str, cpu_milli: u64) -> Demand {
    let r = gpu_share::request::GpuRequest::parse_normalized(text).expect("a valid request");
    Demand {
        cpu_milli,
        ..Demand::gpu(gpu_share::ledger::demand_of_request(&r))
    }
}

fn pod(uid: &str, request: &str) -> Pod {
    pod_with_cpu(uid, request, 8000)
}

fn pod_with_cpu(uid: &str, request: &str, cpu_milli: u64) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": uid, "namespace": "bench", "uid": uid,
                     "annotations": {"gpu-share.io/request": request}},
        "spec": {"containers": [{"name": "c",
                                 "resources": {"requests": {"cpu": format!("{cpu_milli}m")}}}],
                 "schedulerName": "gpu-share-scheduler"}
    }))
    .expect("pod literal")
}

/// A pod of a ReplicaSet (a Deployment's): kube-scheduler's default topology spread spreads it,
/// and filter ranks the best tier as that spread would.
fn owned_pod(uid: &str, request: &str, replica_set: &str) -> Pod {
    let mut p = pod(uid, request);
    p.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: replica_set.into(),
            uid: replica_set.into(),
            controller: Some(true),
            ..Default::default()
        },
    ]);
    p
}

fn pod_ref(uid: &str) -> PodRef {
    PodRef::new(uid, "bench", uid)
}

/// Holds pod `uid` on `node` as bind does (`--dev`: nothing to assume); whether it fit.
fn hold(ext: &ExtenderState, scorer: &Scorer, node: &str, uid: &str, demand: Demand) -> bool {
    let mut binding = ext.begin_bind(uid, node, false);
    let held = binding.hold(scorer, pod_ref(uid), demand).is_ok();
    if held {
        binding.commit();
    } else {
        binding.abort();
    }
    held
}

/// The requests the bench's pods carry.
const KINDS: [&str; 8] = [
    "timeslice-30",
    "timeslice-50",
    "timeslice-20",
    "exclusive-1",
    "exclusive-4",
    "mps-25",
    "mig-1g.10gb",
    "mig-3g.40gb",
];

struct Cluster {
    ext: ExtenderState,
    policy: LoadedPolicy,
    names: Vec<String>,
}

/// 5,000 nodes, partly filled through the extender's own bind path: 60,000 binds of random
/// classes and CPU requests (2-16 CPUs) to random nodes, of which those that fit are kept.
fn cluster() -> Cluster {
    let ext = ExtenderState::new(Mode::Dev, Duration::from_secs(3600));
    let names: Vec<String> = (0..NODES).map(|i| node(i).name.clone()).collect();
    for i in 0..NODES {
        // Its facts as a kubelet registers it: its hostname label (which the default spread
        // over hosts reads), no zone.
        let n = node(i);
        let facts = gpu_share_core::cache::node::NodeFacts {
            labels: [("kubernetes.io/hostname".to_string(), n.name.clone())].into(),
            ..Default::default()
        };
        ext.apply_node(&n.name.clone(), facts, Some(n));
    }
    let policy = LoadedPolicy::new(Policy::default_policy());
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let scorer = ext.scorer(PackingPolicy::GpuShare);
    let mut placed = 0;
    for k in 0..60_000 {
        let req = KINDS[rng.random_range(0..KINDS.len())];
        let demand = request(req, [2000, 4000, 8000, 16_000][rng.random_range(0..4)]);
        ext.observe_demand(&demand, PackingPolicy::GpuShare);
        let target = &names[rng.random_range(0..NODES)];
        if hold(&ext, &scorer, target, &format!("fill-{k}"), demand) {
            placed += 1;
        }
    }
    eprintln!("bench cluster: {NODES} nodes, {placed} pods placed");
    Cluster { ext, policy, names }
}

fn args(c: &Cluster, p: &Pod) -> ExtenderArgs {
    ExtenderArgs {
        pod: Some(p.clone()),
        nodes: None,
        node_names: Some(c.names.clone()),
    }
}

fn report(label: &str, times: &[(Duration, Duration)]) {
    let pct = |f: fn(&(Duration, Duration)) -> Duration| {
        let mut t: Vec<Duration> = times.iter().map(f).collect();
        t.sort();
        (t[t.len() / 2], t[t.len() * 99 / 100], t[t.len() - 1])
    };
    let (s50, s99, smax) = pct(|t| t.0);
    let (w50, w99, wmax) = pct(|t| t.1);
    eprintln!(
        "prioritize over {NODES} nodes (gpu-share policy, {} decisions, {label}): \
         scoring p50 {s50:?} p99 {s99:?} max {smax:?}; as served (parse, score, reply) \
         p50 {w50:?} p99 {w99:?} max {wmax:?}",
        times.len()
    );
}

/// One prioritize as the server runs it: the body kube-scheduler sends parsed, scored, the reply
/// serialized. Returns the scores, the scoring time and the whole time.
fn served(c: &Cluster, body: &[u8]) -> (Vec<HostPriority>, Duration, Duration) {
    let t0 = Instant::now();
    let a = wire::parse_args(black_box(body)).expect("well-formed");
    let t1 = Instant::now();
    let scores = handlers::prioritize(&c.ext, &c.policy, a).expect("prioritize");
    let t2 = Instant::now();
    black_box(serde_json::to_vec(&scores).expect("reply"));
    (scores, t2 - t1, t0.elapsed())
}

/// The body kube-scheduler sends (Go field names, `Nodes` null).
fn body(c: &Cluster, p: &Pod) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"Pod": p, "Nodes": null, "NodeNames": c.names}))
        .expect("body")
}

/// The steady state: a stream of 2,000 pods of random classes and CPU requests, each observed
/// (as filter does), prioritized (timed) and bound to its best node; once 500 are held, each
/// new bind releases the oldest. Every bind and release changes a node, whose memo then misses;
/// the learnt workload is refreshed once in the stream (at 61,440 observations).
fn percentiles_stream(c: &Cluster) {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut held = std::collections::VecDeque::new();
    let mut times = Vec::with_capacity(2000);
    for k in 0..2000 {
        let req = KINDS[rng.random_range(0..KINDS.len())];
        let cpu = [2000, 4000, 8000, 16_000][rng.random_range(0..4)];
        let uid = format!("stream-{k}");
        let b = body(c, &pod_with_cpu(&uid, req, cpu));
        let demand = request(req, cpu);
        c.ext.observe_demand(&demand, PackingPolicy::GpuShare);
        let (scores, scoring, whole) = served(c, &b);
        times.push((scoring, whole));
        let best = scores
            .iter()
            .max_by_key(|h| (h.score, std::cmp::Reverse(&h.host)));
        let scorer = c.ext.scorer(PackingPolicy::GpuShare);
        if let Some(h) = best
            && hold(&c.ext, &scorer, &h.host, &uid, demand)
        {
            held.push_back(uid);
            if held.len() > 500
                && let Some(old) = held.pop_front()
            {
                c.ext.release(&old);
            }
        }
    }
    report("a stream of binds and releases", &times);
}

/// The worst case: every node's fragmentation memo emptied before each decision (as right
/// after a workload refresh, when none holds).
fn percentiles_cold(c: &Cluster) {
    let b = body(c, &pod("probe", "timeslice-30"));
    let times: Vec<(Duration, Duration)> = (0..2000)
        .map(|_| {
            c.ext
                .ledger()
                .with_nodes_scoring(&c.names, |_, _, memo| *memo = FragMemo::default());
            let (_, scoring, whole) = served(c, &b);
            (scoring, whole)
        })
        .collect();
    report("memos emptied", &times);
}

fn extender(cr: &mut Criterion) {
    let c = cluster();
    percentiles_stream(&c);
    percentiles_cold(&c);
    let metrics = Metrics::new();
    let p = pod("probe", "timeslice-30");
    let mut g = cr.benchmark_group("extender");
    g.bench_function("filter_5000", |b| {
        b.iter(|| black_box(handlers::filter(&c.ext, &c.policy, &metrics, args(&c, &p))))
    });
    // A Deployment's pod, five of whose siblings are held: the tier ranked as the default
    // spread would rank it.
    let scorer = c.ext.scorer(PackingPolicy::GpuShare);
    for k in 0..5 {
        let mut binding = c
            .ext
            .begin_bind(&format!("sibling-{k}"), &c.names[k * 7], false);
        let sibling = pod_ref(&format!("sibling-{k}")).controlled_by(Some("rs-probe".into()));
        match binding.hold(&scorer, sibling, request("timeslice-30", 8000)) {
            Ok(_) => drop(binding.commit()),
            Err(_) => binding.abort(),
        }
    }
    let owned = owned_pod("probe-owned", "timeslice-30", "rs-probe");
    g.bench_function("filter_5000_owned", |b| {
        b.iter(|| {
            black_box(handlers::filter(
                &c.ext,
                &c.policy,
                &metrics,
                args(&c, &owned),
            ))
        })
    });
    // The same pod on an empty cluster, where the best tier is every node of its kind (3,000
    // time-sliced nodes): the spread ranks all of them.
    let empty = Cluster {
        ext: ExtenderState::new(Mode::Dev, Duration::from_secs(3600)),
        policy: LoadedPolicy::new(Policy::default_policy()),
        names: c.names.clone(),
    };
    for i in 0..NODES {
        let n = node(i);
        let facts = gpu_share_core::cache::node::NodeFacts {
            labels: [("kubernetes.io/hostname".to_string(), n.name.clone())].into(),
            ..Default::default()
        };
        empty.ext.apply_node(&n.name.clone(), facts, Some(n));
    }
    g.bench_function("filter_5000_empty", |b| {
        b.iter(|| {
            black_box(handlers::filter(
                &empty.ext,
                &empty.policy,
                &metrics,
                args(&empty, &p),
            ))
        })
    });
    g.bench_function("filter_5000_empty_owned", |b| {
        b.iter(|| {
            black_box(handlers::filter(
                &empty.ext,
                &empty.policy,
                &metrics,
                args(&empty, &owned),
            ))
        })
    });
    g.bench_function("prioritize_5000", |b| {
        b.iter(|| black_box(handlers::prioritize(&c.ext, &c.policy, args(&c, &p))))
    });
    // The whole verb as the server runs it (parse, score, reply).
    let b = body(&c, &p);
    g.bench_function("prioritize_5000_served", |bn| {
        bn.iter(|| black_box(served(&c, &b).2))
    });
    g.bench_function("parse_5000", |bn| {
        bn.iter(|| black_box(wire::parse_args(black_box(&b)).expect("well-formed")))
    });
    let reply = handlers::prioritize(&c.ext, &c.policy, args(&c, &p)).expect("prioritize");
    g.bench_function("reply_5000", |bn| {
        bn.iter(|| black_box(serde_json::to_vec(black_box(&reply)).expect("reply")))
    });
    let scorer = c.ext.scorer(PackingPolicy::GpuShare);
    g.bench_function("bind_reserve", |b| {
        b.iter(|| {
            let mut binding = c.ext.begin_bind("bind-probe", &c.names[0], false);
            let r = binding.hold(
                &scorer,
                pod_ref("bind-probe"),
                request("timeslice-10", 2000),
            );
            binding.abort();
            black_box(r.is_ok())
        })
    });
    g.finish();
}

fn simulate(cr: &mut Criterion) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let data = root.join("../shared/data/openb");
    let (nodes, pods) = if data.join("openb_pod_list_default.csv").exists() {
        (
            data.join("openb_node_list_gpu_node.csv"),
            data.join("openb_pod_list_default.csv"),
        )
    } else {
        (
            root.join("tests/fixtures/simulate/nodes.csv"),
            root.join("tests/fixtures/simulate/pods.csv"),
        )
    };
    let inputs = driver::load(&nodes, &pods).expect("trace");
    let capacity: u64 = inputs.nodes.iter().map(|n| u64::from(n.gpus) * 1000).sum();
    let metric = Arc::new(TargetWorkload::typical(
        inputs.pods.iter().map(|p| &p.demand),
        TYPICAL_COVERAGE,
    ));
    let order = replay::order(&inputs.pods, inputs.nodes.len(), capacity, 42, 1.3);
    let trace = replay::Trace {
        nodes: &inputs.nodes,
        pods: &inputs.pods,
        metric: &metric,
        explain: false,
        nodes_to_score: 100,
        defrag: None,
    };
    let mut g = cr.benchmark_group("simulate");
    g.sample_size(10);
    for policy in [PackingPolicy::Fgd, PackingPolicy::GpuShare] {
        let source = replay::WorkloadSource::for_policy(policy, &metric);
        g.bench_function(format!("{policy}_replay"), |b| {
            b.iter(|| black_box(replay::run(&trace, &order, policy, &source, 42, || {})))
        });
    }
    g.finish();
}

criterion_group!(benches, extender, simulate);
criterion_main!(benches);

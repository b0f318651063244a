//! `gpu-share simulate` end to end on a slice of the openb trace (every 20th node and pod of the
//! default trace, in tests/fixtures/simulate/): report invariants, the CLI's outputs, and, when
//! the full trace is beside the checkout (../shared/data), FGD against the published number.

use std::path::{Path, PathBuf};

mod common;

use common::{run_err, run_ok};
use std::sync::Arc;

use gpu_share::packing::PackingPolicy;
use gpu_share::packing::TYPICAL_COVERAGE;
use gpu_share::packing::frag::TargetWorkload;
use gpu_share_simulator::partition::Choice;
use gpu_share_simulator::replay::{self, Trace, WorkloadSource};
use gpu_share_simulator::{default_policies, driver};

/// The extender's example NodeList and the annotated pods written for it.
fn example_cluster() -> (PathBuf, PathBuf) {
    let nodes = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/extender/nodes.yaml");
    (nodes, fixture("cluster-pods.yaml"))
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/simulate")
        .join(name)
}

#[test]
fn every_replay_respects_capacity_arrivals_and_never_deletes() {
    let inputs = driver::load(&fixture("nodes.csv"), &fixture("pods.csv")).unwrap();
    let capacity: u64 = inputs.nodes.iter().map(|n| u64::from(n.gpus) * 1000).sum();
    assert_eq!(capacity, 314_000);
    let metric = Arc::new(TargetWorkload::typical(
        inputs.pods.iter().map(|p| &p.demand),
        TYPICAL_COVERAGE,
    ));
    let trace = Trace {
        nodes: &inputs.nodes,
        pods: &inputs.pods,
        metric: &metric,
        explain: false,
        nodes_to_score: 100,
        defrag: None,
    };
    for seed in [1, 2] {
        let order = replay::order(&inputs.pods, inputs.nodes.len(), capacity, seed, 1.3);
        // Inflated to 1.3x: the request stops just short of (or, with a multi-GPU draw, just
        // past) 1.3 x capacity; every original pod is in it once.
        let asked: u64 = order.pods.iter().map(|i| inputs.pods[*i].gpu_milli()).sum();
        assert!(asked as f64 > 1.25 * capacity as f64 && (asked as f64) < 1.35 * capacity as f64);
        let mut originals: Vec<usize> = order.pods[..inputs.pods.len()].to_vec();
        originals.sort_unstable();
        assert_eq!(originals, (0..inputs.pods.len()).collect::<Vec<_>>());
        let mut nodes = order.nodes.clone();
        nodes.sort_unstable();
        assert_eq!(nodes, (0..inputs.nodes.len()).collect::<Vec<_>>());

        for policy in default_policies() {
            let mut calls = 0;
            let out = replay::run(
                &trace,
                &order,
                policy,
                &WorkloadSource::for_policy(policy, &metric),
                seed,
                || calls += 1,
            );
            assert_eq!(calls, order.pods.len());
            assert_eq!(out.samples.len(), order.pods.len() + 1, "{policy}");
            assert_eq!(out.placed + out.failed, order.pods.len(), "{policy}");
            assert!(
                out.placed > 0 && out.failed > 0,
                "{policy}: 130% cannot all fit"
            );
            for w in out.samples.windows(2) {
                let (a, b) = (w[0], w[1]);
                assert!(
                    b.arrived_milli >= a.arrived_milli,
                    "{policy}: arrivals only grow"
                );
                assert!(
                    b.allocated_milli >= a.allocated_milli,
                    "{policy}: nothing deleted"
                );
                // A pod is allocated whole or not at all.
                let placed = b.allocated_milli - a.allocated_milli;
                assert!(placed == 0 || placed == b.arrived_milli - a.arrived_milli);
            }
            for s in &out.samples {
                assert!(s.allocated_milli <= capacity, "{policy}: over capacity");
                assert!(s.allocated_milli <= s.arrived_milli, "{policy}");
                let idle = (capacity - s.allocated_milli) as f64;
                assert!(
                    s.frag_milli >= 0.0 && s.frag_milli <= idle + 1e-6,
                    "{policy}"
                );
            }
        }
    }
}

#[test]
fn refusals_account_for_the_unallocated_gpus_and_name_their_shapes() {
    let inputs = driver::load(&fixture("nodes.csv"), &fixture("pods.csv")).unwrap();
    let policies = [PackingPolicy::Fgd, PackingPolicy::GpuShare];
    let report = driver::simulate(&inputs, &policies, &[3, 4, 5], 1.3, false, true);
    for p in &report.policies {
        assert!(!p.refusals.is_empty(), "{}: the fixture overflows", p.name);
        // Every refused pod is in the table: all but, at most, the last draw of a seed (it may
        // overshoot 130%) arrived by 130%.
        let by130: f64 = p.refusals.iter().map(|r| r.pods["130"]).sum();
        assert!(
            by130 <= p.pods_failed + 1e-6 && p.pods_failed - by130 <= 1.0 + 1e-6,
            "{}: {by130} refusals by 130%, {} failed",
            p.name,
            p.pods_failed
        );
        // At 100% arrival the GPU refused is the GPU left unallocated (the curve's 100% bucket
        // spans half a point either side: at most one 8-GPU pod of the fixture's 314 GPUs).
        let refused: f64 = p.refusals.iter().map(|r| r.refused_gpu_pct["100"]).sum();
        let unalloc = p.unallocated_gpu_pct["100"];
        assert!(
            (refused - unalloc).abs() <= 800.0 / 314.0,
            "{}: refused {refused}% by 100%, unallocated {unalloc}%",
            p.name
        );
        for r in &p.refusals {
            assert!(r.earliest_refused_at_pct <= r.first_refused_at_pct, "{r:?}");
            assert!(!r.why.is_empty() && r.shape.contains("CPU"), "{r:?}");
        }
        for w in p.refusals.windows(2) {
            assert!(w[0].refused_gpu_pct["100"] >= w[1].refused_gpu_pct["100"]);
        }
    }
    let text = gpu_share_simulator::report::table(&report);
    assert!(
        text.contains("\ngpu-share:\n") && text.contains("\nfgd:\n"),
        "{text}"
    );
}

#[test]
fn report_curves_are_monotone_and_the_table_has_every_policy() {
    let inputs = driver::load(&fixture("nodes.csv"), &fixture("pods.csv")).unwrap();
    let report = driver::simulate(&inputs, &default_policies(), &[3, 4, 5], 1.3, false, false);
    assert_eq!(report.gpus_total, 314);
    assert_eq!(report.policies.len(), 7);
    for p in &report.policies {
        assert_eq!(p.curve[0].arrived_pct, 0);
        // Bucket 0 holds the empty cluster and the first pods (arrived below 0.5%).
        assert!(p.curve[0].allocated_pct < 0.5);
        // Empty cluster: fragmentation = share of CPU-only shapes in the workload x capacity.
        assert!(p.curve[0].frag_amount_pct > 0.0);
        assert!(p.curve.len() >= 130, "{}: reaches 130% arrival", p.name);
        for w in p.curve.windows(2) {
            assert_eq!(w[1].arrived_pct, w[0].arrived_pct + 1);
            assert!(
                w[1].allocated_pct + 1e-9 >= w[0].allocated_pct,
                "{}: allocation falls from {} to {} at {}%",
                p.name,
                w[0].allocated_pct,
                w[1].allocated_pct,
                w[1].arrived_pct
            );
            assert!(w[1].allocated_pct <= w[1].arrived_pct as f64 + 1.0);
        }
        let at100 = p.unallocated_gpu_pct["100"];
        let at130 = p.unallocated_gpu_pct["130"];
        assert!(
            (0.0..=100.0).contains(&at100) && at130 <= at100 + 1e-9,
            "{}",
            p.name
        );
    }
    let table = gpu_share_simulator::report::table(&report);
    for p in default_policies() {
        assert!(table.contains(p.name()), "{table}");
    }
    // Random is the paper's worst baseline; FGD beats best-fit packing (3 seeds, 314 GPUs).
    let un = |n: &str| {
        report
            .policies
            .iter()
            .find(|p| p.name == n)
            .unwrap()
            .unallocated_gpu_pct["100"]
    };
    assert!(un("random") > un("bestfit") && un("bestfit") > un("fgd"));
}

/// `gpu-share simulate` on the fixture trace with seeds 7 and 8, then `extra`; its stdout.
fn simulate_fixture_seeds_7_8<'a>(extra: impl IntoIterator<Item = &'a std::ffi::OsStr>) -> String {
    let (nodes, pods) = (fixture("nodes.csv"), fixture("pods.csv"));
    let mut args: Vec<std::ffi::OsString> = ["simulate", "--nodes"].map(Into::into).to_vec();
    args.push(nodes.into_os_string());
    args.push("--pods".into());
    args.push(pods.into_os_string());
    args.extend(["--seeds", "7..8"].map(Into::into));
    args.extend(extra.into_iter().map(Into::into));
    run_ok(args)
}

#[test]
fn cli_writes_the_table_json_and_svg() {
    let dir = tempfile::tempdir().unwrap();
    let (json, svg) = (dir.path().join("r.json"), dir.path().join("r.svg"));
    let os = |p: &'static str| std::ffi::OsStr::new(p);
    let table = simulate_fixture_seeds_7_8([
        os("--policy"),
        os("fgd"),
        os("--policy"),
        os("gpu-share"),
        os("--json"),
        json.as_os_str(),
        os("--svg"),
        svg.as_os_str(),
    ]);
    assert!(
        table.contains("61 nodes, 314 GPUs, 408 pods, tune 1.3, seeds 7,8"),
        "{table}"
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["gpus_total"], 314);
    assert_eq!(v["seeds"], serde_json::json!([7, 8]));
    assert_eq!(v["policies"][0]["name"], "fgd");
    assert_eq!(v["policies"][1]["name"], "gpu-share");
    assert!(v["policies"][0]["unallocated_gpu_pct"]["100"].is_number());
    assert!(v["policies"][0]["unallocated_gpu_pct"]["130"].is_number());
    assert!(v["policies"][0]["frag_amount_pct"]["100"].is_number());
    let first = &v["policies"][0]["curve"][0];
    assert_eq!(first["arrived_pct"], 0);
    assert!(first["frag_ratio_pct"].is_number());
    // Without --refusals, no refusal table.
    assert!(v["policies"][0].get("refusals").is_none());
    assert!(!table.contains("refused:"), "{table}");
    // Units and the direction of every column.
    assert!(table.contains("Lower is better"), "{table}");
    for header in [
        "unalloc%@100",
        "unalloc%@130",
        "frag%@100",
        "frag/idle%",
        "placed/asked",
    ] {
        assert!(table.contains(header), "{header}: {table}");
    }
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("gpu-share") && svg.contains("fgd"));
    assert!(svg.contains("lower is better") && svg.contains("the 2 lowest, zoomed in"));
    // Every x label inside the picture (the last one was clipped), the legend right of the
    // plots (it covered the start of the curves).
    let width: f64 = attr(&svg, "<svg", "width").unwrap();
    let texts: Vec<(f64, String)> = svg
        .split("<text")
        .skip(1)
        .filter_map(|t| {
            let x = attr(t, "", "x")?;
            let body = t.split_once('>')?.1.split_once("</text>")?.0;
            Some((x, body.trim().to_string()))
        })
        .collect();
    let label = texts
        .iter()
        .find(|(_, t)| t == "130")
        .expect("the 130% label");
    assert!(
        label.0 + 15.0 < width,
        "the last x label at {} of {width}",
        label.0
    );
    for name in ["fgd", "gpu-share"] {
        let (x, _) = texts.iter().find(|(_, t)| t == name).unwrap();
        assert!(*x > 780.0, "legend entry {name} at x {x}, inside the plots");
    }
}

/// A numeric attribute of the first element starting with `tag` in `text`.
fn attr(text: &str, tag: &str, name: &str) -> Option<f64> {
    let at = text.find(tag)?;
    let rest = &text[at..];
    let key = format!(" {name}=\"");
    let start = rest.find(&key)? + key.len();
    let end = rest[start..].find('"')? + start;
    rest[start..end].trim_end_matches("px").parse().ok()
}

/// A Kubernetes-shaped replay (`--tune 0`: the pods as given) says how many pods were placed of
/// those asked: the number that matters when the pods never ask for the whole cluster.
#[test]
fn cli_kubernetes_shaped_replay_shows_pods_placed_of_asked() {
    let (nodes, pods) = example_cluster();
    let table = run_ok([
        "simulate",
        "--nodes",
        nodes.to_str().unwrap(),
        "--pods",
        pods.to_str().unwrap(),
        "--tune",
        "0",
        "--seeds",
        "1..3",
        "--policy",
        "gpu-share",
    ]);
    let row = table
        .lines()
        .find(|l| l.starts_with("gpu-share "))
        .unwrap_or_else(|| panic!("{table}"));
    let cell = row.split_whitespace().last().unwrap();
    let (placed, asked) = cell.split_once('/').unwrap_or_else(|| panic!("{row}"));
    let placed: f64 = placed.parse().unwrap();
    assert_eq!(asked, "48", "{row}");
    assert!((38.0..=40.0).contains(&placed), "{row}");
}

#[test]
fn cli_explains_bad_input() {
    let run = |args: &[&str]| run_err(args);
    let nodes = fixture("nodes.csv");
    let pods = fixture("pods.csv");
    let (n, p) = (nodes.to_str().unwrap(), pods.to_str().unwrap());
    let e = run(&["simulate", "--nodes", n, "--pods", p, "--policy", "fdg"]);
    assert!(e.contains("unknown policy \"fdg\""), "{e}");
    let e = run(&["simulate", "--nodes", n, "--pods", p, "--seeds", "9..3"]);
    assert!(e.contains("empty"), "{e}");
    let e = run(&["simulate", "--nodes", p, "--pods", p]);
    assert!(e.contains("missing column \"sn\""), "{e}");
    let e = run(&["simulate", "--nodes", "/nonexistent.csv", "--pods", p]);
    assert!(e.contains("cannot read /nonexistent.csv"), "{e}");
    let e = run(&[
        "simulate",
        "--nodes",
        n,
        "--pods",
        p,
        "--variant",
        "pin-all",
    ]);
    assert!(e.contains("unknown variant \"pin-all\""), "{e}");
}

/// `--variant` replays a generated variant of the pods, says so in the table's first line and
/// the JSON, and draws the same pods for the same --variant-seed.
#[test]
fn cli_replays_a_variant_and_names_it() {
    let nodes = fixture("nodes.csv");
    let pods = fixture("pods.csv");
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let (n, p, j) = (
        nodes.to_str().unwrap(),
        pods.to_str().unwrap(),
        json.to_str().unwrap(),
    );
    let args = [
        "simulate",
        "--nodes",
        n,
        "--pods",
        p,
        "--policy",
        "fgd",
        "--policy",
        "gpu-share",
        "--seeds",
        "1..2",
        "--variant",
        "pin-sets-33",
        "--json",
        j,
    ];
    let table = run_ok(args);
    assert!(
        table
            .lines()
            .next()
            .unwrap()
            .contains("(variant pin-sets-33, seed 2023)"),
        "{table}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["variant"], "pin-sets-33, seed 2023");
    assert_eq!(run_ok(args), table, "the same pods again");
    let plain = run_ok(&args[..11]);
    assert!(!plain.contains("variant"), "{plain}");
    assert_ne!(
        plain.lines().skip(1).collect::<Vec<_>>(),
        table.lines().skip(1).collect::<Vec<_>>(),
        "pinning a third of the GPU pods changes the result"
    );
}

/// The published numbers (reference/fgd.md section 5: unallocated GPU % at 100% arrival, mean
/// of seeds 42-51, default trace).
const PUBLISHED: [(&str, f64); 6] = [
    ("random", 13.70),
    ("dotprod", 9.38),
    ("gpu-clustering", 8.35),
    ("gpu-packing", 8.22),
    ("bestfit", 7.14),
    ("fgd", 4.77),
];

/// The full default trace of ../shared/data/openb (the ignored tests below; CI runs them).
fn full_trace() -> driver::Inputs {
    full_trace_named("default")
}

/// The full trace `openb_pod_list_{name}.csv` of ../shared/data/openb.
fn full_trace_named(name: &str) -> driver::Inputs {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/openb");
    driver::load(
        &data.join("openb_node_list_gpu_node.csv"),
        &data.join(format!("openb_pod_list_{name}.csv")),
    )
    .expect("the openb trace in ../shared/data/openb")
}

/// gpu-share leaves fewer GPUs unallocated than FGD at 100% and at 130% arrival, and at 100%
/// than the paper's FGD figure too when it published one (the reference is the lower).
fn assert_gpu_share_ahead_of_fgd(
    report: &gpu_share_simulator::report::Report,
    what: &str,
    published_fgd_at_100: Option<f64>,
) {
    let of = |name: &str| report.policies.iter().find(|p| p.name == name).unwrap();
    for at in ["100", "130"] {
        let (gs, ours) = (
            of("gpu-share").unallocated_gpu_pct[at],
            of("fgd").unallocated_gpu_pct[at],
        );
        let fgd = match published_fgd_at_100 {
            Some(published) if at == "100" => ours.min(published),
            _ => ours,
        };
        assert!(
            gs < fgd,
            "{what}, at {at}% arrival: gpu-share leaves {gs:.2}% unallocated, FGD {fgd:.2}% \
             (the project's {ours:.2}%, published {published_fgd_at_100:?} at 100%)"
        );
    }
}

/// The six baselines on the full default trace, seeds 42-51, within 0.5 points of the paper;
/// gpu-share below FGD at 100% and 130% arrival.
/// Needs ../shared/data/openb beside the checkout and a release build (about 10 s):
/// `cargo test --release --test simulate -- --ignored` (CI runs it).
#[test]
#[ignore = "needs ../shared/data/openb: cargo test --release --test simulate -- --ignored"]
fn baselines_reproduce_the_published_numbers_and_gpu_share_beats_fgd_on_the_full_trace() {
    let inputs = full_trace();
    let policies: Vec<PackingPolicy> = PUBLISHED
        .iter()
        .map(|(n, _)| PackingPolicy::parse(n).unwrap())
        .chain([PackingPolicy::GpuShare])
        .collect();
    let seeds: Vec<u64> = (42..=51).collect();
    let report = driver::simulate(&inputs, &policies, &seeds, 1.3, false, false);
    assert_eq!(report.gpus_total, 6212);
    for (name, published) in PUBLISHED {
        let p = report.policies.iter().find(|p| p.name == name).unwrap();
        let ours = p.unallocated_gpu_pct["100"];
        assert!(
            (ours - published).abs() <= 0.5,
            "{name}: {ours:.2}% unallocated at 100% arrival, published {published:.2}%"
        );
    }
    let (_, fgd_published) = PUBLISHED.iter().find(|(n, _)| *n == "fgd").unwrap();
    assert_gpu_share_ahead_of_fgd(&report, "default trace", Some(*fgd_published));
}

/// gpu-share ahead of FGD on a generated model-pinned variant of the full trace (20% of the GPU
/// pods pinned to pairs of models, `--variant pin-sets-20`), at 100% and 130% arrival, seeds
/// 42-51. Needs ../shared/data/openb and a release build (CI runs it).
#[test]
#[ignore = "needs ../shared/data/openb: cargo test --release --test simulate -- --ignored"]
fn gpu_share_beats_fgd_on_a_model_pinned_variant_of_the_full_trace() {
    use gpu_share_simulator::variant::{DEFAULT_SEED, Variant};
    let mut inputs = full_trace();
    inputs.pods =
        Variant::parse("pin-sets-20")
            .unwrap()
            .apply(&inputs.pods, &inputs.nodes, DEFAULT_SEED);
    let pinned = inputs
        .pods
        .iter()
        .filter(|p| !p.demand.models.is_empty())
        .count();
    assert!(pinned > 1000, "{pinned} pods pinned");
    replay_gpu_share_and_fgd_and_assert_ahead(&inputs, "pin-sets-20", None);
}

/// gpu-share ahead of FGD on a generated CPU-only-heavy variant of the full trace (three times
/// the CPU-only pods, `--variant cpu-x3`), at 100% and 130% arrival, seeds 42-51: the variant
/// where charging only a growth of the stranded GPUs, not crediting their use, trails FGD.
/// Needs ../shared/data/openb and a release build (CI runs it).
#[test]
#[ignore = "needs ../shared/data/openb: cargo test --release --test simulate -- --ignored"]
fn gpu_share_beats_fgd_on_a_cpu_only_heavy_variant_of_the_full_trace() {
    use gpu_share_simulator::variant::{DEFAULT_SEED, Variant};
    let mut inputs = full_trace();
    let cpu_only = |pods: &[gpu_share_simulator::trace::TracePod]| {
        pods.iter()
            .filter(|p| p.demand.gpu.per_gpu().1 == 0)
            .count()
    };
    let before = cpu_only(&inputs.pods);
    inputs.pods =
        Variant::parse("cpu-x3")
            .unwrap()
            .apply(&inputs.pods, &inputs.nodes, DEFAULT_SEED);
    assert_eq!(cpu_only(&inputs.pods), 3 * before);
    replay_gpu_share_and_fgd_and_assert_ahead(&inputs, "cpu-x3", None);
}

/// gpu-share ahead of FGD on a multi-GPU-heavy trace (multigpu40: the trace's authors' variant
/// whose multi-GPU pods ask 40% of the GPUs, the one where FGD led longest), at 100% and 130%
/// arrival, seeds 42-51, and at 100% below the published FGD figure (3.1%) too.
/// Needs ../shared/data/openb and a release build (CI runs it).
#[test]
#[ignore = "needs ../shared/data/openb: cargo test --release --test simulate -- --ignored"]
fn gpu_share_beats_fgd_on_a_multi_gpu_heavy_trace() {
    let inputs = full_trace_named("multigpu40");
    let multi = inputs
        .pods
        .iter()
        .filter(|p| p.demand.gpu.per_gpu().1 > 1)
        .count();
    assert!(multi > 600, "{multi} multi-GPU pods");
    replay_gpu_share_and_fgd_and_assert_ahead(&inputs, "multigpu40", Some(3.1));
}

/// FGD and gpu-share over seeds 42-51 at tune 1.3, gpu-share ahead at both arrival levels
/// (see [`assert_gpu_share_ahead_of_fgd`]).
fn replay_gpu_share_and_fgd_and_assert_ahead(
    inputs: &driver::Inputs,
    what: &str,
    published_fgd_at_100: Option<f64>,
) {
    let policies = [PackingPolicy::Fgd, PackingPolicy::GpuShare];
    let seeds: Vec<u64> = (42..=51).collect();
    let report = driver::simulate(inputs, &policies, &seeds, 1.3, false, false);
    assert_gpu_share_ahead_of_fgd(&report, what, published_fgd_at_100);
}

/// The Kubernetes-shaped input: the extender's example cluster (MIG mixed, time-slicing, MPS,
/// plain) and annotated pods of every class. Each class fits only its kind of node: the MIG,
/// time-slicing and MPS pods all fit; the exclusive ones compete for the 4 plain GPUs.
#[test]
fn kubernetes_shaped_input_places_every_class_on_its_kind_of_node() {
    let (nodes, pods) = example_cluster();
    let inputs = driver::load(&nodes, &pods).unwrap();
    assert_eq!(inputs.nodes.len(), 4, "the CPU-only node is not a GPU node");
    assert_eq!(inputs.pods.len(), 48);
    let capacity: u64 = inputs
        .nodes
        .iter()
        .map(gpu_share_simulator::trace::node_capacity_milli)
        .sum();
    // 8 + 8 + 4 full GPUs, and the A100's 1 full GPU, 21 x 1/7 and 8 x 3/7 (each MIG device
    // in whole thousandths, rounded down: 29 devices lose less than 29).
    let exact = 21_000.0 + 21.0 * 1000.0 / 7.0 + 8.0 * 3000.0 / 7.0;
    assert!(
        capacity as f64 <= exact && exact - (capacity as f64) < 29.0,
        "{capacity}"
    );
    let metric = TargetWorkload::typical(inputs.pods.iter().map(|p| &p.demand), TYPICAL_COVERAGE);
    let trace = Trace {
        nodes: &inputs.nodes,
        pods: &inputs.pods,
        metric: &metric,
        explain: false,
        nodes_to_score: 100,
        defrag: None,
    };
    for policy in [PackingPolicy::GpuShare, PackingPolicy::BestFit] {
        let order = replay::order(&inputs.pods, inputs.nodes.len(), capacity, 5, 0.0);
        assert_eq!(order.pods.len(), 48, "tune 0 replays the pods as they are");
        let out = replay::run(&trace, &order, policy, &WorkloadSource::Online, 5, || {});
        assert!(
            (38..=40).contains(&out.placed),
            "{policy}: {} placed (36 shared/MIG pods plus 2-4 exclusive)",
            out.placed
        );
    }
}

/// Partitioning what-ifs on the example cluster (A100 and 2x H100 MIG-capable, one L40S) and its
/// 48 pods: 6 each of timeslice-20/30/50, mps-25, mig-1g.10gb, mig-3g.40gb, exclusive-1 and
/// exclusive-2. The expected counts follow from the geometry, not from a previous run.
#[test]
fn partition_what_ifs_report_how_many_pods_fit_and_why_not() {
    let (nodes, pods) = example_cluster();
    let inputs = driver::load(&nodes, &pods).unwrap();
    assert_eq!(inputs.physical_gpus, vec![8, 8, 8, 4]);
    let table = gpu_share::mig::MigTable::default();
    let choices: Vec<Choice> = [
        "as-is",
        "exclusive",
        "timeslice-4",
        "mps-4",
        "all-1g.10gb",
        "all-balanced",
    ]
    .iter()
    .map(|c| Choice::parse(c, &table).unwrap())
    .collect();
    let seeds = [1, 2, 3];
    let rows = driver::what_if(&inputs, &choices, &[PackingPolicy::GpuShare], &seeds);
    assert_eq!(rows.len(), 6);
    let row = |name: &str| rows.iter().find(|r| r.partition == name).unwrap();
    for r in &rows {
        assert_eq!(r.pods, 48, "{}", r.partition);
        assert_eq!(r.gpus, 28, "{}", r.partition);
        assert!(r.pods_placed_min <= r.pods_placed_max && r.pods_placed_max <= 48);
        let unplaced: f64 = r.unplaced.values().sum();
        assert!(
            (r.pods_placed + unplaced - 48.0).abs() < 0.3,
            "{}: placed {} + unplaced {unplaced} must be every pod",
            r.partition,
            r.pods_placed
        );
        assert!(r.gpu_allocated_pct <= 100.0);
    }
    // As labelled, only the exclusive pods compete (for the L40S and the A100's full GPU).
    let as_is = row("as-is");
    assert!((38..=40).contains(&as_is.pods_placed_min), "{as_is:?}");
    assert_eq!(as_is.nodes_changed, 4);
    // Unshared: 54 GPUs asked for 28 even-sized nodes, so every GPU is taken.
    let ex = row("exclusive");
    assert_eq!(ex.gpu_allocated_pct, 100.0);
    assert!(ex.pods_placed_max <= 28);
    assert_eq!(ex.restated["mps-25"], "exclusive");
    // Time-sliced everywhere: every share fits, no whole GPU is left.
    let ts = row("timeslice-4");
    assert_eq!((ts.pods_placed_min, ts.pods_placed_max), (36, 36));
    assert_eq!(
        ts.unplaced["exclusive-2: node shares GPUs by time-slicing; pod asks whole unshared GPUs"],
        6.0
    );
    assert_eq!(ts.restated["mig-3g.40gb"], "timeslice-42.8,memory=40448Mi");
    // MPS with 4 replicas: a replica is 25% of a GPU, so 30%, 3/7 and 50% do not fit.
    let mps = row("mps-4");
    assert_eq!((mps.pods_placed_min, mps.pods_placed_max), (18, 18));
    assert_eq!(
        mps.unplaced["mps-50: MPS replicas on this node are smaller than the request"],
        6.0
    );
    // 1g.10gb devices hold only 1/7 of a GPU: the other shares cannot be expressed; the L40S
    // (no MIG) keeps its whole GPUs.
    let small = row("all-1g.10gb");
    assert_eq!(small.nodes_changed, 3);
    assert_eq!(small.nodes_kept["GPU model without MIG"], 1);
    assert_eq!(small.restated["mps-25"], "not expressible");
    assert!(small.pods_placed_max <= 6 + 4, "{small:?}");
    assert!(
        small
            .unplaced
            .keys()
            .any(|k| k.starts_with("timeslice-50: needs 50% of a GPU")),
        "{small:?}"
    );
    // all-balanced (2x 1g, 2g, 3g): 25% and 20% take the 2g, 30% the 3g, 50% has no device.
    let bal = row("all-balanced");
    assert_eq!(bal.restated["mps-25"], "mig-2g.20gb");
    assert_eq!(bal.restated["timeslice-30"], "mig-3g.40gb");
    assert_eq!(bal.restated["timeslice-50"], "not expressible");
}

#[test]
fn cli_partition_prints_the_what_if_table_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("what-if.json");
    let (nodes, pods) = example_cluster();
    let os = |p: &'static str| std::ffi::OsStr::new(p);
    let text = run_ok([
        os("simulate"),
        os("--nodes"),
        nodes.as_os_str(),
        os("--pods"),
        pods.as_os_str(),
        os("--seeds"),
        os("4"),
        os("--partition"),
        os("as-is,mps-2"),
        os("--partition"),
        os("all-balanced"),
        os("--json"),
        json.as_os_str(),
    ]);
    for want in [
        "as-is",
        "mps-2",
        "all-balanced",
        "pods placed",
        "not placed: exclusive-2",
    ] {
        assert!(text.contains(want), "{want:?} missing from:\n{text}");
    }
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["seeds"], serde_json::json!([4]));
    let names: Vec<&str> = v["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["partition"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["as-is", "mps-2", "all-balanced"]);

    let e = run_err([
        os("simulate"),
        os("--nodes"),
        nodes.as_os_str(),
        os("--pods"),
        pods.as_os_str(),
        os("--partition"),
        os("all-1g.11gb"),
    ]);
    assert!(e.contains("did you mean all-1g.10gb"), "{e}");
}

#[test]
fn cli_reports_refusals_by_pod_shape() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let os = |p: &'static str| std::ffi::OsStr::new(p);
    let table = simulate_fixture_seeds_7_8([
        os("--policy"),
        os("gpu-share"),
        os("--refusals"),
        os("--json"),
        json.as_os_str(),
    ]);
    assert!(
        table.contains("refused:") && table.contains("\ngpu-share:\n"),
        "{table}"
    );
    assert!(
        table.contains("pod shape") && table.contains("earliest"),
        "{table}"
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let rows = v["policies"][0]["refusals"].as_array().unwrap();
    assert!(!rows.is_empty());
    for r in rows {
        assert!(r["shape"].as_str().unwrap().contains("CPU"), "{r}");
        assert!(r["refusedGpuPct"]["100"].is_number() && r["pods"]["130"].is_number());
        assert!(
            r["firstRefusedAtPct"].is_number() && r["why"].is_string(),
            "{r}"
        );
    }
}

/// `--defrag` places refused pods where moves make room on the trace slice: the table says how
/// many, with the moves per GPU freed, and never fewer pods are placed than without it.
#[test]
fn cli_defragments_and_says_what_the_moves_did() {
    let os = std::ffi::OsStr::new;
    let plain = simulate_fixture_seeds_7_8([os("--policy"), os("gpu-share")]);
    let moved = simulate_fixture_seeds_7_8([os("--policy"), os("gpu-share"), os("--defrag")]);
    assert!(!plain.contains("defragmenting"), "{plain}");
    let line = moved
        .lines()
        .find(|l| l.starts_with("gpu-share, defragmenting: "))
        .unwrap_or_else(|| panic!("no defragmentation line: {moved}"));
    assert!(line.contains("moves per GPU"), "{line}");
    // The placed/asked column: with moves, at least as many placed of as many asked.
    let placed = |table: &str| -> f64 {
        let row = table
            .lines()
            .find(|l| l.starts_with("gpu-share "))
            .unwrap_or_else(|| panic!("no gpu-share row: {table}"));
        let cell = row.split_whitespace().last().unwrap();
        cell.split('/').next().unwrap().parse().unwrap()
    };
    assert!(placed(&moved) >= placed(&plain), "{plain}\n{moved}");
}

/// `--churn` replays with departures, without moves and with them, and weighs the refusals
/// against the repack; a load of 0 is refused in words.
#[test]
fn cli_replays_with_departures() {
    let os = std::ffi::OsStr::new;
    let table = simulate_fixture_seeds_7_8([os("--churn"), os("300"), os("--patience"), os("20")]);
    assert!(
        table.contains("gpu-share: with departures, load 1"),
        "{table}"
    );
    assert!(table.contains("without moves"), "{table}");
    assert!(table.contains("with moves"), "{table}");
    assert!(table.contains("waited for fragmentation"), "{table}");
    let nodes = fixture("nodes.csv");
    let pods = fixture("pods.csv");
    let e = run_err([
        "simulate",
        "--nodes",
        nodes.to_str().unwrap(),
        "--pods",
        pods.to_str().unwrap(),
        "--churn",
        "10",
        "--load",
        "0",
    ]);
    assert!(e.contains("--load 0 is out of range"), "{e}");
}

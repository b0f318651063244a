//! PURE: the workload variants the packing study replays beside the shared traces, made the way
//! the trace's authors made theirs (the FGD paper, sections 6.5 and 6.6) and seeded, so that
//! anyone gets the same pods:
//!
//! - `pin-one-P`: P% of the GPU pods (1 to 100) may run only on the cluster's most common GPU
//!   model, by GPUs (G2 on the openb cluster, 71% of its GPUs): demand concentrated on one
//!   model, as when most teams ask for "the big ones".
//! - `pin-sets-P`: P% of the GPU pods may run only on a set of two models, `A|B` as the trace's
//!   `gpu_spec` writes it (`V100M16|V100M32`). The pair is drawn with a probability in
//!   proportion to the GPUs the two models have together.
//! - `cpu-xF`: the CPU-only pods F times over (`cpu-x0`: none, `cpu-x0.5`, `cpu-x2`, `cpu-x3`):
//!   fewer are dropped at random, more are copies drawn at random.
//!
//! A pod is pinned only to a set some node of which can hold it alone (its model, GPUs, CPU and
//! memory): the pods drawn for pinning that no node of the set can hold are left unpinned and
//! others drawn in their place.

use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::trace::TracePod;
use crate::inventory::GpuNode;
use crate::packing::{self, Demand, GpuDemand, Usage};

/// The seed variants are generated with unless one is given: the same pods for every replay
/// seed, so that only the arrival order varies between seeds.
pub const DEFAULT_SEED: u64 = 2023;

/// A workload variant.
#[derive(Debug, Clone, PartialEq)]
pub enum Variant {
    /// This percentage of the GPU pods pinned to the most common model.
    PinOne(u32),
    /// This percentage of the GPU pods pinned to a pair of models.
    PinSets(u32),
    /// The CPU-only pods this many times over.
    CpuOnly(f64),
}

/// A `--variant` value that names none.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown variant {0:?}: pin-one-P or pin-sets-P (P% of the GPU pods pinned, 1 to 100), or cpu-xF (the CPU-only pods F times over, 0 to 10)"
)]
pub struct UnknownVariant(pub String);

impl Variant {
    pub fn parse(text: &str) -> Result<Variant, UnknownVariant> {
        let t = text.trim();
        let unknown = || UnknownVariant(t.to_string());
        let percent = |p: &str| {
            p.parse::<u32>()
                .ok()
                .filter(|p| (1..=100).contains(p))
                .ok_or_else(unknown)
        };
        if let Some(p) = t.strip_prefix("pin-one-") {
            return percent(p).map(Variant::PinOne);
        }
        if let Some(p) = t.strip_prefix("pin-sets-") {
            return percent(p).map(Variant::PinSets);
        }
        if let Some(f) = t.strip_prefix("cpu-x") {
            return f
                .parse::<f64>()
                .ok()
                .filter(|f| (0.0..=10.0).contains(f))
                .map(Variant::CpuOnly)
                .ok_or_else(unknown);
        }
        Err(unknown())
    }

    /// The pods of this variant of `pods` on `nodes`, drawn with `seed`.
    pub fn apply(&self, pods: &[TracePod], nodes: &[GpuNode], seed: u64) -> Vec<TracePod> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        match self {
            Variant::PinOne(p) => {
                let sets = vec![(vec![most_common_model(nodes)], 1)];
                pin(pods, nodes, *p, &sets, &mut rng)
            }
            Variant::PinSets(p) => pin(pods, nodes, *p, &model_pairs(nodes), &mut rng),
            Variant::CpuOnly(f) => cpu_only_times(pods, *f, &mut rng),
        }
    }
}

impl std::fmt::Display for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Variant::PinOne(p) => write!(f, "pin-one-{p}"),
            Variant::PinSets(p) => write!(f, "pin-sets-{p}"),
            Variant::CpuOnly(x) => write!(f, "cpu-x{x}"),
        }
    }
}

/// GPUs per model, most first (ties by name).
fn gpus_by_model(nodes: &[GpuNode]) -> Vec<(String, u64)> {
    let mut by: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    for n in nodes {
        if let Some(m) = &n.product {
            *by.entry(m.clone()).or_default() += u64::from(n.gpus);
        }
    }
    let mut v: Vec<(String, u64)> = by.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v
}

/// The model with the most GPUs.
fn most_common_model(nodes: &[GpuNode]) -> String {
    gpus_by_model(nodes)
        .first()
        .map(|(m, _)| m.clone())
        .unwrap_or_default()
}

/// Every pair of distinct models, weighted by the GPUs the two have together.
fn model_pairs(nodes: &[GpuNode]) -> Vec<(Vec<String>, u64)> {
    let models = gpus_by_model(nodes);
    let mut pairs = Vec::new();
    for (i, (a, ga)) in models.iter().enumerate() {
        for (b, gb) in &models[i + 1..] {
            pairs.push((vec![a.clone(), b.clone()], ga + gb));
        }
    }
    pairs
}

/// Whether the pod is a GPU pod (a share, whole GPUs, a MIG device or device units).
fn asks_gpu(d: &Demand) -> bool {
    !matches!(d.gpu, GpuDemand::None)
}

/// Whether some node of the models can hold the demand alone.
fn fits_somewhere(demand: &Demand, models: &[String], nodes: &[GpuNode]) -> bool {
    let pinned = Demand {
        models: models.to_vec(),
        ..demand.clone()
    };
    nodes
        .iter()
        .any(|n| packing::fit(n, &Usage::empty(n), &pinned).is_ok())
}

/// Pins `percent`% of the GPU pods (rounded) to sets drawn by weight; a drawn pod no node of
/// its set can hold is left as it is and another is drawn.
fn pin(
    pods: &[TracePod],
    nodes: &[GpuNode],
    percent: u32,
    sets: &[(Vec<String>, u64)],
    rng: &mut ChaCha8Rng,
) -> Vec<TracePod> {
    let mut out = pods.to_vec();
    let mut gpu_pods: Vec<usize> = (0..out.len())
        .filter(|i| asks_gpu(&out[*i].demand))
        .collect();
    let want = (gpu_pods.len() as u64 * u64::from(percent)).div_ceil(100) as usize;
    gpu_pods.shuffle(rng);
    let mut pinned = 0;
    for i in gpu_pods {
        if pinned == want || sets.is_empty() {
            break;
        }
        let Ok((models, _)) = sets.choose_weighted(rng, |(_, w)| *w) else {
            break;
        };
        if fits_somewhere(&out[i].demand, models, nodes) {
            out[i].demand.models = models.clone();
            pinned += 1;
        }
    }
    out
}

/// The CPU-only pods `times` over: fewer are a random subset, more add random copies (named
/// `<pod>-x<k>`); GPU pods stay as they are.
fn cpu_only_times(pods: &[TracePod], times: f64, rng: &mut ChaCha8Rng) -> Vec<TracePod> {
    let (cpu, mut out): (Vec<TracePod>, Vec<TracePod>) =
        pods.iter().cloned().partition(|p| !asks_gpu(&p.demand));
    let want = (cpu.len() as f64 * times).round() as usize;
    if want <= cpu.len() {
        let mut keep = cpu;
        keep.shuffle(rng);
        keep.truncate(want);
        out.extend(keep);
    } else if !cpu.is_empty() {
        for k in 0..want - cpu.len() {
            let mut copy = cpu[rng.random_range(0..cpu.len())].clone();
            copy.name = format!("{}-x{k}", copy.name);
            out.push(copy);
        }
        out.extend(cpu);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, model: &str, gpus: u32, cpu: u64) -> GpuNode {
        let mut n = GpuNode::whole(name, model, gpus, 16384);
        n.sharing = crate::inventory::Sharing::PerGpu;
        n.cpu_milli = Some(cpu);
        n.memory_mib = Some(1 << 20);
        n
    }

    fn pod(name: &str, gpu: GpuDemand, cpu: u64) -> TracePod {
        TracePod {
            name: name.into(),
            demand: Demand {
                cpu_milli: cpu,
                ..Demand::gpu(gpu)
            },
        }
    }

    fn cluster() -> Vec<GpuNode> {
        vec![
            node("a1", "A", 8, 96_000),
            node("a2", "A", 8, 96_000),
            node("b1", "B", 8, 128_000),
            node("c1", "C", 2, 8_000),
        ]
    }

    fn trace() -> Vec<TracePod> {
        let mut pods = Vec::new();
        for i in 0..80 {
            pods.push(pod(
                &format!("share-{i:02}"),
                GpuDemand::Timeslice {
                    milli: 500,
                    memory_mib: None,
                },
                4_000,
            ));
        }
        for i in 0..10 {
            // 8 GPUs and 120 CPUs: only B can hold it.
            pods.push(pod(
                &format!("big-{i}"),
                GpuDemand::Whole { count: 8 },
                120_000,
            ));
        }
        for i in 0..10 {
            pods.push(pod(&format!("cpu-{i}"), GpuDemand::None, 2_000));
        }
        pods
    }

    #[test]
    fn the_cli_draws_with_the_default_seed() {
        use clap::Parser;
        #[derive(Parser)]
        struct Simulate {
            #[command(flatten)]
            args: crate::args::SimulateArgs,
        }
        let cli =
            Simulate::try_parse_from(["simulate", "--nodes", "n.csv", "--pods", "p.csv"]).unwrap();
        assert_eq!(cli.args.variant_seed, DEFAULT_SEED);
    }

    #[test]
    fn names_parse_and_print_back() {
        for name in ["pin-one-5", "pin-sets-33", "cpu-x0", "cpu-x0.5", "cpu-x3"] {
            assert_eq!(Variant::parse(name).unwrap().to_string(), name);
        }
        for bad in [
            "pin-one-0",
            "pin-one-101",
            "pin-sets-x",
            "cpu-x11",
            "cpu-x-1",
            "halves",
        ] {
            let e = Variant::parse(bad).unwrap_err();
            assert!(e.to_string().contains("unknown variant"), "{bad}: {e}");
        }
    }

    #[test]
    fn pin_one_pins_the_share_to_the_most_common_model_and_only_where_it_fits() {
        let nodes = cluster();
        let out = Variant::PinOne(20).apply(&trace(), &nodes, DEFAULT_SEED);
        assert_eq!(out.len(), 100);
        let pinned: Vec<&TracePod> = out.iter().filter(|p| !p.demand.models.is_empty()).collect();
        // 20% of the 90 GPU pods, rounded up.
        assert_eq!(pinned.len(), 18);
        for p in &pinned {
            assert_eq!(p.demand.models, vec!["A"], "{}", p.name);
            // A (96 CPUs) cannot hold a 120-CPU pod: never pinned there.
            assert!(p.name.starts_with("share-"), "{}", p.name);
            assert!(fits_somewhere(&p.demand, &p.demand.models, &nodes));
        }
        assert!(
            out.iter()
                .all(|p| p.name.starts_with("cpu-") != asks_gpu(&p.demand))
        );
        // Seeded: the same pods again; another seed, others.
        assert_eq!(
            out,
            Variant::PinOne(20).apply(&trace(), &nodes, DEFAULT_SEED)
        );
        assert_ne!(out, Variant::PinOne(20).apply(&trace(), &nodes, 7));
    }

    #[test]
    fn pin_sets_draw_pairs_every_pinned_pod_fits_some_node_of() {
        let nodes = cluster();
        let out = Variant::PinSets(50).apply(&trace(), &nodes, DEFAULT_SEED);
        let pinned: Vec<&TracePod> = out.iter().filter(|p| !p.demand.models.is_empty()).collect();
        assert_eq!(pinned.len(), 45);
        let mut seen = std::collections::BTreeSet::new();
        for p in &pinned {
            assert_eq!(p.demand.models.len(), 2, "{}", p.name);
            assert!(
                fits_somewhere(&p.demand, &p.demand.models, &nodes),
                "{}",
                p.name
            );
            if p.name.starts_with("big-") {
                assert!(p.demand.models.contains(&"B".to_string()), "{:?}", p.demand);
            }
            seen.insert(p.demand.models.join("|"));
        }
        // A|B holds the most GPUs and is drawn most; pairs with C are drawn too.
        assert!(seen.contains("A|B") && seen.len() >= 2, "{seen:?}");
    }

    #[test]
    fn cpu_only_pods_scale_and_gpu_pods_stay() {
        let nodes = cluster();
        let count = |pods: &[TracePod]| pods.iter().filter(|p| !asks_gpu(&p.demand)).count();
        for (times, want) in [(0.0, 0), (0.5, 5), (1.0, 10), (3.0, 30)] {
            let out = Variant::CpuOnly(times).apply(&trace(), &nodes, DEFAULT_SEED);
            assert_eq!(count(&out), want, "x{times}");
            assert_eq!(out.len() - count(&out), 90, "x{times}: GPU pods unchanged");
            let names: std::collections::BTreeSet<&str> =
                out.iter().map(|p| p.name.as_str()).collect();
            assert_eq!(names.len(), out.len(), "x{times}: names stay unique");
        }
    }
}

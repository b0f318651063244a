//! The simulator's shell: reads the input files, runs every (policy, seed) replay on a thread
//! pool with a progress bar on stderr, and writes the outputs.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;

use super::partition::{self, Choice, ChoiceReport, ClusterNode, Prepared};
use super::replay::{self, Order, RunOutcome, Trace, WorkloadSource};
use super::report::{self, Report};
use super::trace::{self, TracePod};
use super::variant::Variant;
use crate::args::SimulateArgs;
use crate::inventory::GpuNode;
use crate::mig::MigTable;
use crate::packing::TYPICAL_COVERAGE;
use crate::packing::frag::TargetWorkload;
use crate::packing::{GPU_MILLI, PackingPolicy};

/// Why a simulation cannot run, in words, each cause chained.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    #[error("cannot read {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {}: {source}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", .path.display())]
    Trace {
        path: PathBuf,
        #[source]
        source: trace::TraceError,
    },
    #[error("{}: {source}", .path.display())]
    Manifests {
        path: PathBuf,
        #[source]
        source: super::kube::ManifestError,
    },
    #[error("{}: the nodes have no GPUs", .path.display())]
    NoGpus { path: PathBuf },
    #[error("--tune {0} is out of range (0 to 100)")]
    Tune(f64),
    #[error("--load {0} is out of range (above 0, at most 10)")]
    Load(f64),
    #[error(transparent)]
    Seeds(#[from] super::SeedsError),
    #[error(transparent)]
    Policy(#[from] super::UnknownPolicy),
    #[error(transparent)]
    Partition(#[from] partition::ChoiceError),
    #[error(transparent)]
    Variant(#[from] super::variant::UnknownVariant),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Chart(#[from] super::chart::ChartError),
}

/// The loaded inputs.
pub struct Inputs {
    pub nodes: Vec<GpuNode>,
    /// Physical GPUs per node (what a partitioning what-if reconfigures).
    pub physical_gpus: Vec<u32>,
    pub pods: Vec<TracePod>,
}

fn read(path: &Path) -> Result<String, SimulateError> {
    std::fs::read_to_string(path).map_err(|source| SimulateError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn write(path: &Path, text: impl AsRef<[u8]>) -> Result<(), SimulateError> {
    std::fs::write(path, text).map_err(|source| SimulateError::Write {
        path: path.to_path_buf(),
        source,
    })
}

fn is_csv(path: &Path, text: &str) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("csv"))
        || text.lines().next().is_some_and(|l| {
            let l = l.trim();
            l.starts_with("sn,") || l.starts_with("name,")
        })
}

/// Reads nodes and pods (openb CSV or Kubernetes-shaped).
pub fn load(nodes: &Path, pods: &Path) -> Result<Inputs, SimulateError> {
    let trace_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SimulateError::Trace { path, source }
    };
    let manifest_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SimulateError::Manifests { path, source }
    };
    let ntext = read(nodes)?;
    let ptext = read(pods)?;
    let (nodes_v, physical_gpus) = if is_csv(nodes, &ntext) {
        let v = trace::parse_nodes_csv(&ntext).map_err(trace_error(nodes))?;
        let gpus = v.iter().map(|n| n.gpus).collect();
        (v, gpus)
    } else {
        super::kube::parse_node_list(&ntext)
            .map_err(manifest_error(nodes))?
            .into_iter()
            .map(|c| (c.node, c.physical_gpus))
            .unzip()
    };
    let pods_v = if is_csv(pods, &ptext) {
        trace::parse_pods_csv(&ptext).map_err(trace_error(pods))?
    } else {
        super::kube::parse_pod_list(&ptext).map_err(manifest_error(pods))?
    };
    if nodes_v.iter().map(trace::node_capacity_milli).sum::<u64>() == 0 {
        return Err(SimulateError::NoGpus {
            path: nodes.to_path_buf(),
        });
    }
    Ok(Inputs {
        nodes: nodes_v,
        physical_gpus,
        pods: pods_v,
    })
}

/// How the replays run, beyond the inputs, policies and seeds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Options {
    /// Inflate the trace to this multiple of the cluster's GPU capacity.
    pub tune: f64,
    /// A progress bar on stderr.
    pub show_progress: bool,
    /// Each policy's report also says which pods it refused, when and why (a fit check per node
    /// per refusal).
    pub refusals: bool,
    /// kube-scheduler's `percentageOfNodesToScore` (100: every node, as gpu-share's profile
    /// ships; 0: kube-scheduler's adaptive default; [`replay::nodes_to_find`]).
    pub nodes_to_score: u32,
    /// Defragment within these limits ([`super::residents`]).
    pub defrag: Option<crate::defrag::Limits>,
}

/// Runs every (policy, seed) replay and aggregates the report; with `refusals`, each policy's
/// report also says which pods it refused, when and why.
pub fn simulate(
    inputs: &Inputs,
    policies: &[PackingPolicy],
    seeds: &[u64],
    tune: f64,
    show_progress: bool,
    refusals: bool,
) -> Report {
    simulate_with(
        inputs,
        policies,
        seeds,
        &Options {
            tune,
            show_progress,
            refusals,
            nodes_to_score: 100,
            defrag: None,
        },
    )
}

/// [`simulate`] with every option.
pub fn simulate_with(
    inputs: &Inputs,
    policies: &[PackingPolicy],
    seeds: &[u64],
    options: &Options,
) -> Report {
    let Options {
        tune,
        show_progress,
        refusals,
        nodes_to_score,
        defrag,
    } = *options;
    let capacity: u64 = inputs
        .nodes
        .iter()
        .map(super::trace::node_capacity_milli)
        .sum();
    // The fixed target workload: FGD's (the untuned trace's typical shapes), which is also the
    // yardstick of every policy's fragmentation metric.
    let metric = Arc::new(TargetWorkload::typical(
        inputs.pods.iter().map(|p| &p.demand),
        TYPICAL_COVERAGE,
    ));
    let orders: Vec<Order> = seeds
        .iter()
        .map(|s| replay::order(&inputs.pods, inputs.nodes.len(), capacity, *s, tune))
        .collect();
    let total: u64 =
        orders.iter().map(|o| o.pods.len() as u64).sum::<u64>() * policies.len() as u64;
    let bar = if show_progress {
        let b = ProgressBar::new(total);
        b.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{bar:40}] {percent:>3}% {human_pos}/{human_len} pods, eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        b
    } else {
        ProgressBar::hidden()
    };
    let jobs: Vec<(usize, usize)> = (0..policies.len())
        .flat_map(|p| (0..seeds.len()).map(move |s| (p, s)))
        .collect();
    let outcomes: Vec<((usize, usize), RunOutcome)> = jobs
        .par_iter()
        .map(|&(pi, si)| {
            let policy = policies[pi];
            let source = WorkloadSource::for_policy(policy, &metric);
            let mut n = 0u64;
            let out = replay::run(
                &Trace {
                    nodes: &inputs.nodes,
                    pods: &inputs.pods,
                    metric: &metric,
                    explain: refusals,
                    nodes_to_score,
                    defrag,
                },
                &orders[si],
                policy,
                &source,
                seeds[si],
                || {
                    n += 1;
                    if n.is_multiple_of(256) {
                        bar.inc(256);
                    }
                },
            );
            bar.inc(n % 256);
            ((pi, si), out)
        })
        .collect();
    bar.finish_and_clear();
    // Moved, not copied, into one group per policy (jobs are policy-major).
    let mut groups: Vec<Vec<RunOutcome>> = vec![Vec::new(); policies.len()];
    for ((pi, _), r) in outcomes {
        groups[pi].push(r);
    }
    let policies_out = policies
        .iter()
        .zip(&groups)
        .map(|(p, runs)| {
            let mut r = report::policy_report(p.name(), runs);
            if refusals {
                r.refusals = super::refusals::refusals(&inputs.pods, runs);
            }
            r
        })
        .collect();
    Report {
        gpus_total: capacity / u64::from(GPU_MILLI),
        nodes: inputs.nodes.len(),
        pods: inputs.pods.len(),
        variant: None,
        nodes_to_score,
        tune,
        seeds: seeds.to_vec(),
        policies: policies_out,
    }
}

/// Partitioning what-ifs: every (choice, policy, seed) replay of the pods as listed (no
/// inflation), with the reason each unplaced pod fit nowhere.
pub fn what_if(
    inputs: &Inputs,
    choices: &[Choice],
    policies: &[PackingPolicy],
    seeds: &[u64],
) -> Vec<ChoiceReport> {
    let table = MigTable::default();
    let cluster: Vec<ClusterNode> = inputs
        .nodes
        .iter()
        .zip(&inputs.physical_gpus)
        .map(|(n, g)| ClusterNode {
            node: n.clone(),
            physical_gpus: *g,
        })
        .collect();
    let prepared: Vec<(Prepared, Arc<TargetWorkload>)> = choices
        .iter()
        .map(|c| {
            let p = partition::prepare(&cluster, &inputs.pods, c, &table);
            let metric = Arc::new(TargetWorkload::typical(
                p.pods.iter().map(|p| &p.demand),
                TYPICAL_COVERAGE,
            ));
            (p, metric)
        })
        .collect();
    let jobs: Vec<(usize, usize, usize)> = (0..prepared.len())
        .flat_map(|c| {
            (0..policies.len()).flat_map(move |p| (0..seeds.len()).map(move |s| (c, p, s)))
        })
        .collect();
    let runs: Vec<((usize, usize), RunOutcome)> = jobs
        .par_iter()
        .map(|&(ci, pi, si)| {
            let (prep, metric) = &prepared[ci];
            let capacity: u64 = prep.nodes.iter().map(trace::node_capacity_milli).sum();
            let order = replay::order(&prep.pods, prep.nodes.len(), capacity, seeds[si], 0.0);
            let out = replay::run(
                &Trace {
                    nodes: &prep.nodes,
                    pods: &prep.pods,
                    metric,
                    explain: true,
                    nodes_to_score: 100,
                    defrag: None,
                },
                &order,
                policies[pi],
                &WorkloadSource::for_policy(policies[pi], metric),
                seeds[si],
                || {},
            );
            ((ci, pi), out)
        })
        .collect();
    let mut groups: Vec<Vec<RunOutcome>> = vec![Vec::new(); prepared.len() * policies.len()];
    for ((ci, pi), r) in runs {
        groups[ci * policies.len() + pi].push(r);
    }
    let mut rows = Vec::new();
    for (ci, (prep, _)) in prepared.iter().enumerate() {
        for (pi, policy) in policies.iter().enumerate() {
            let mine = &groups[ci * policies.len() + pi];
            rows.push(partition::choice_report(prep, policy.name(), mine));
        }
    }
    rows
}

/// The policies named, or gpu-share's alone when none is (the replays with departures run two
/// modes per seed, so not every policy by default).
fn policies_or_gpu_share(named: &[String], parsed: Vec<PackingPolicy>) -> Vec<PackingPolicy> {
    if named.is_empty() {
        vec![PackingPolicy::GpuShare]
    } else {
        parsed
    }
}

/// Every (policy, seed) replay with departures, without moves and with them, on all cores.
pub fn churn_replays(
    inputs: &Inputs,
    policies: &[PackingPolicy],
    seeds: &[u64],
    churn: &super::churn::Churn,
    limits: crate::defrag::Limits,
) -> Vec<super::churn::ChurnReport> {
    let capacity: u64 = inputs.nodes.iter().map(trace::node_capacity_milli).sum();
    let metric = Arc::new(TargetWorkload::typical(
        inputs.pods.iter().map(|p| &p.demand),
        TYPICAL_COVERAGE,
    ));
    let orders: Vec<Order> = seeds
        .iter()
        .map(|s| replay::order(&inputs.pods, inputs.nodes.len(), capacity, *s, 0.0))
        .collect();
    let jobs: Vec<(usize, usize, bool)> = (0..policies.len())
        .flat_map(|p| (0..seeds.len()).flat_map(move |s| [(p, s, false), (p, s, true)]))
        .collect();
    let runs: Vec<((usize, bool), super::churn::ChurnOutcome)> = jobs
        .par_iter()
        .map(|&(pi, si, moves)| {
            let policy = policies[pi];
            let out = super::churn::run(
                &super::churn::Replay {
                    nodes: &inputs.nodes,
                    pods: &inputs.pods,
                    order: &orders[si],
                    policy,
                    source: &WorkloadSource::for_policy(policy, &metric),
                    seed: seeds[si],
                },
                churn,
                moves.then_some(limits),
            );
            ((pi, moves), out)
        })
        .collect();
    policies
        .iter()
        .enumerate()
        .map(|(pi, p)| {
            let of = |moves: bool| {
                runs.iter()
                    .filter(|((i, m), _)| *i == pi && *m == moves)
                    .map(|(_, o)| *o)
                    .collect()
            };
            super::churn::ChurnReport {
                policy: p.name().to_string(),
                churn: super::churn::ChurnSettings {
                    load: churn.load,
                    warmup: churn.warmup,
                    steps: churn.steps,
                    patience: churn.patience,
                    moves_per_gpu: limits.moves_per_gpu,
                },
                without: of(false),
                with: of(true),
            }
        })
        .collect()
}

/// `gpu-share simulate`: returns the text to print.
pub fn run(args: &SimulateArgs) -> Result<String, SimulateError> {
    let seeds = super::parse_seeds(&args.seeds)?;
    let policies = super::parse_policies(&args.policies)?;
    if !(0.0..=100.0).contains(&args.tune) || args.tune.is_nan() {
        return Err(SimulateError::Tune(args.tune));
    }
    let table = MigTable::default();
    let choices: Vec<Choice> = args
        .partitions
        .iter()
        .flat_map(|p| p.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| Choice::parse(p, &table))
        .collect::<Result<_, _>>()?;
    let variant = args.variant.as_deref().map(Variant::parse).transpose()?;
    let mut inputs = load(&args.nodes, &args.pods)?;
    if let Some(v) = &variant {
        inputs.pods = v.apply(&inputs.pods, &inputs.nodes, args.variant_seed);
    }
    if let Some(t) = args.threads {
        // A second call (tests) finds the pool built: keep it.
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(t.max(1))
            .build_global();
    }
    if !choices.is_empty() {
        // What-ifs replay gpu-share's policy unless policies are named.
        let policies = if args.policies.is_empty() {
            vec![PackingPolicy::GpuShare]
        } else {
            policies
        };
        let rows = what_if(&inputs, &choices, &policies, &seeds);
        if let Some(path) = &args.json {
            let text = serde_json::to_string_pretty(&serde_json::json!({
                "seeds": seeds,
                "partitions": rows,
            }))?;
            write(path, text + "\n")?;
        }
        return Ok(partition::table(&rows, &seeds));
    }
    if let Some(steps) = args.churn {
        if !(args.load > 0.0 && args.load <= 10.0) {
            return Err(SimulateError::Load(args.load));
        }
        let churn = super::churn::Churn {
            load: args.load,
            warmup: 2 * steps,
            steps,
            patience: args.patience,
            bound: true,
        };
        let reports = churn_replays(
            &inputs,
            &policies_or_gpu_share(&args.policies, policies),
            &seeds,
            &churn,
            args.move_limits(),
        );
        if let Some(path) = &args.json {
            let text = serde_json::to_string_pretty(&reports)?;
            write(path, text + "\n")?;
        }
        return Ok(super::churn::table(&reports, &seeds));
    }
    tracing::info!(
        nodes = inputs.nodes.len(),
        pods = inputs.pods.len(),
        policies = policies.len(),
        seeds = seeds.len(),
        "simulating"
    );
    let mut report = simulate_with(
        &inputs,
        &policies,
        &seeds,
        &Options {
            tune: args.tune,
            show_progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
            refusals: args.refusals,
            nodes_to_score: args.nodes_to_score,
            defrag: args.defrag_limits(),
        },
    );
    report.variant = variant.map(|v| format!("{v}, seed {}", args.variant_seed));
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report)?;
        write(path, text + "\n")?;
    }
    if let Some(path) = &args.svg {
        let svg = super::chart::svg(&report)?;
        write(path, svg)?;
    }
    Ok(report::table(&report))
}

//! `gpu-share simulate`'s flags (clap): the service's command line takes them as they are.

use std::path::PathBuf;

use clap::Args;

#[derive(Debug, Clone, Args)]
pub struct SimulateArgs {
    /// Nodes: an openb node CSV (`sn,cpu_milli,memory_mib,gpu,model`), or a Kubernetes
    /// NodeList (YAML or JSON) with GPU Feature Discovery labels.
    #[arg(long)]
    pub nodes: PathBuf,
    /// Pods: an openb pod CSV, or a list of pod manifests (YAML stream or List) carrying the
    /// `gpu-share` annotation.
    #[arg(long)]
    pub pods: PathBuf,
    /// A policy to replay (repeatable): random, dotprod, gpu-clustering, gpu-packing, bestfit,
    /// fgd, gpu-share (binpack and spread too). Default: the first seven.
    #[arg(long = "policy", value_name = "NAME")]
    pub policies: Vec<String>,
    /// Seeds, inclusive range `A..B`, or a comma list.
    #[arg(long, default_value = "42..51")]
    pub seeds: String,
    /// Inflate the trace to this multiple of the cluster's GPU capacity (0: replay it as is).
    #[arg(long, default_value_t = 1.3)]
    pub tune: f64,
    /// Write the report as JSON here.
    #[arg(long, value_name = "OUT")]
    pub json: Option<PathBuf>,
    /// Write the chart (unallocated GPU % against arrived %) as SVG here.
    #[arg(long, value_name = "OUT")]
    pub svg: Option<PathBuf>,
    /// A partitioning what-if (repeatable): replay the pods as listed with every GPU node
    /// reconfigured: as-is, exclusive, timeslice-N, mps-N, all-balanced, all-<MIG profile>
    /// (mig-parted's names, e.g. all-1g.10gb). Reports how many pods fit under each, and why
    /// the others do not. Uses the gpu-share policy unless --policy is given.
    #[arg(long = "partition", value_name = "NAME")]
    pub partitions: Vec<String>,
    /// Worker threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Replay a variant of the pods (docs/packing.md, "Variants"): pin-one-P or pin-sets-P (P%
    /// of the GPU pods pinned to the most common GPU model, or to pairs of models), or cpu-xF
    /// (the CPU-only pods F times over: cpu-x0 none, cpu-x3 three times as many).
    #[arg(long, value_name = "NAME")]
    pub variant: Option<String>,
    /// The seed the variant's pods are drawn with (the same pods for every replay seed).
    #[arg(long, default_value_t = 2023)]
    pub variant_seed: u64,
    /// Also report, per policy, the GPU refused to each pod shape by 100% and 130% arrival,
    /// when the first refusal came and the fit reason (which pods fail, for lack of what).
    #[arg(long)]
    pub refusals: bool,
    /// kube-scheduler's percentageOfNodesToScore to replay: each pod is placed on the best of
    /// the first nodes that fit from where the last search stopped (100: every node, as
    /// gpu-share's profile ships; 0: kube-scheduler's adaptive default, 50% less one point per
    /// 125 nodes, at least 5% and 100 nodes).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub nodes_to_score: u32,
    /// Defragment: a pod that fits nowhere is placed where moving running pods makes room (the
    /// extender's plan, docs/defragmentation.md), within --moves-per-gpu.
    #[arg(long)]
    pub defrag: bool,
    /// With --defrag or --churn: at most this many moves per GPU the waiting pod asks.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub moves_per_gpu: u32,
    /// Replay with departures instead (docs/defragmentation.md): one pod arrives per step and
    /// lives a drawn number of steps; this many steps are counted, after twice as many to fill
    /// the cluster. Each seed runs without moves and with them (within --moves-per-gpu), and each refusal is weighed against an offline repack of its moment.
    #[arg(long, value_name = "STEPS")]
    pub churn: Option<usize>,
    /// With --churn: the GPUs offered, as a share of the cluster's.
    #[arg(long, default_value_t = 1.0)]
    pub load: f64,
    /// With --churn: steps a refused pod waits before it gives up.
    #[arg(long, default_value_t = 100)]
    pub patience: usize,
}

impl SimulateArgs {
    /// The defragmentation limits the flags set, if --defrag is given.
    pub fn defrag_limits(&self) -> Option<crate::defrag::Limits> {
        self.defrag.then(|| self.move_limits())
    }

    /// The limits --moves-per-gpu sets.
    pub fn move_limits(&self) -> crate::defrag::Limits {
        crate::defrag::Limits {
            moves_per_gpu: self.moves_per_gpu,
            ..crate::defrag::Limits::default()
        }
    }
}

//! PURE: partitioning what-ifs. "How would my cluster pack if its GPUs were MIG-partitioned, or
//! shared by MPS, or time-sliced, or not shared at all?"
//!
//! A [`Choice`] reconfigures every GPU node the way the NVIDIA GPU Operator would (a device-plugin
//! sharing config, or a mig-parted named config such as `all-1g.10gb` or `all-balanced`), and
//! restates every pod's request in the terms that choice offers:
//!
//! - a share of one GPU (`mps-P`, `timeslice-P`, or one MIG device, counted by compute slices
//!   and memory) becomes an MPS replica, a time-slicing replica, one whole GPU (`exclusive`), or
//!   the smallest MIG device of the config that holds it;
//! - whole GPUs stay whole GPUs (which MIG-partitioned and shared nodes do not offer);
//! - a request that the choice cannot express (a 50% share under `all-1g.10gb`) is reported as
//!   such, in words, and not replayed.
//!
//! Nodes a MIG config does not apply to (GPU models without MIG, or without the profile) keep
//! their current setup, as mig-parted leaves GPUs its config does not select.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use super::replay::RunOutcome;
use super::trace::TracePod;
use crate::inventory::{
    GpuNode, MAX_REPLICAS_PER_GPU as MAX_REPLICAS, MigLayout, RESOURCE_GPU, Sharing,
};
use crate::mig::{MigModel, MigProfile, MigTable};
use crate::packing::{Demand, GpuDemand, mig_share_milli};

/// Why a `--partition` value names no choice.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChoiceError {
    #[error("partition {text:?}: replicas per GPU must be a whole number from 2 to {MAX_REPLICAS}")]
    Replicas { text: String },
    #[error("partition {text:?}: no GPU model in the MIG table has profile {profile:?}{hint}", hint = did_you_mean(.hints))]
    UnknownProfile {
        text: String,
        profile: String,
        hints: Vec<String>,
    },
    #[error("unknown partition {text:?}: one of {CHOICE_NAMES}")]
    Unknown { text: String },
}

fn did_you_mean(hints: &[String]) -> String {
    if hints.is_empty() {
        String::new()
    } else {
        format!(" (did you mean all-{}?)", hints.join(", all-"))
    }
}

/// Why a demand cannot be expressed under a choice, in words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestateError {
    #[error("asks {resource}, which {choice} does not advertise")]
    Resource { resource: String, choice: Choice },
    #[error("asks {count} MIG devices {profile}, which {choice} does not offer")]
    MigDevices {
        count: u32,
        profile: String,
        choice: Choice,
    },
    #[error("asks {gpu}, which {choice} cannot express")]
    Inexpressible { gpu: GpuDemand, choice: Choice },
    #[error("no GPU in the cluster can take {0}")]
    NoModel(Choice),
    #[error("needs {share}{memory} of a GPU, more than any MIG device of {choice} on {model} holds",
        share = percent(*.milli),
        memory = .memory_mib.map_or_else(String::new, |m| format!(" and {m} MiB")))]
    TooLarge {
        milli: u32,
        memory_mib: Option<u64>,
        choice: Choice,
        model: String,
    },
}

/// One partitioning choice for the whole cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// The nodes as labelled.
    AsIs,
    /// No sharing, no MIG: whole GPUs only (mig-parted's `all-disabled`).
    Exclusive,
    /// Time-slicing with this many replicas per GPU.
    TimeSlicing(u32),
    /// MPS with this many replicas per GPU (each replica 1/N of the SMs and memory).
    Mps(u32),
    /// mig-parted `all-<profile>`: every GPU split into as many devices of one profile as fit.
    MigAll(String),
    /// mig-parted `all-balanced`: 2x 1g + 1x 2g + 1x 3g per GPU (A30: 2x 1g + 1x 2g).
    MigBalanced,
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Choice::AsIs => f.write_str("as-is"),
            Choice::Exclusive => f.write_str("exclusive"),
            Choice::TimeSlicing(n) => write!(f, "timeslice-{n}"),
            Choice::Mps(n) => write!(f, "mps-{n}"),
            Choice::MigAll(p) => write!(f, "all-{}", p.replace('+', ".")),
            Choice::MigBalanced => f.write_str("all-balanced"),
        }
    }
}

/// The names `--partition` accepts, for messages.
pub const CHOICE_NAMES: &str = "as-is, exclusive (or all-disabled), timeslice-N, mps-N (N replicas per GPU, 2 to 48), \
     all-balanced, all-<MIG profile> (e.g. all-1g.10gb)";

impl Choice {
    /// Parses a `--partition` value against the MIG table.
    pub fn parse(text: &str, table: &MigTable) -> Result<Choice, ChoiceError> {
        let t = text.trim();
        let replicas = |n: &str| -> Result<u32, ChoiceError> {
            match n.parse::<u32>() {
                Ok(n) if (2..=MAX_REPLICAS).contains(&n) => Ok(n),
                _ => Err(ChoiceError::Replicas {
                    text: t.to_string(),
                }),
            }
        };
        match t {
            "as-is" => return Ok(Choice::AsIs),
            "exclusive" | "all-disabled" => return Ok(Choice::Exclusive),
            "all-balanced" => return Ok(Choice::MigBalanced),
            _ => {}
        }
        if let Some(n) = t.strip_prefix("timeslice-") {
            return replicas(n).map(Choice::TimeSlicing);
        }
        if let Some(n) = t.strip_prefix("mps-") {
            return replicas(n).map(Choice::Mps);
        }
        if let Some(p) = t.strip_prefix("all-") {
            // Label form (`1g.10gb.me`) or profile form (`1g.10gb+me`).
            let profile = crate::inventory::profile_from_resource_suffix(p);
            if table.find(&profile).is_some() {
                return Ok(Choice::MigAll(profile));
            }
            return Err(ChoiceError::UnknownProfile {
                text: t.to_string(),
                hints: table.suggestions(&profile),
                profile,
            });
        }
        Err(ChoiceError::Unknown {
            text: t.to_string(),
        })
    }

    fn is_mig(&self) -> bool {
        matches!(self, Choice::MigAll(_) | Choice::MigBalanced)
    }

    /// The MIG devices one GPU of `model` holds under this choice, `None` when the choice is
    /// not MIG or the model lacks the profile.
    pub fn mig_layout<'m>(&self, model: &'m MigModel) -> Option<Vec<(&'m MigProfile, u32)>> {
        match self {
            Choice::MigAll(profile) => {
                let p = model.profile(profile)?;
                // As many as fit: `max` already encodes the placement limits (4 of a 2-slice
                // 1g, 2 of a 3g), checked against the geometry here.
                let names: Vec<&str> = vec![p.name.as_str(); usize::from(p.max)];
                model.place_all(&names)?;
                Some(vec![(p, u32::from(p.max))])
            }
            Choice::MigBalanced => {
                // The smallest plain 1g, the 2g of two compute slices, and (8-slice models) the
                // 3g: mig-parted's config-default `all-balanced`.
                let by = |mem: u8, compute: u8| {
                    model.profiles.iter().find(|p| {
                        p.memory_slices == mem
                            && p.compute_slices == compute
                            && !p.name.contains('+')
                    })
                };
                let mut out = vec![(by(1, 1)?, 2), (by(2, 2)?, 1)];
                if model.memory_slices >= 8 {
                    out.push((by(4, 3)?, 1));
                }
                let names: Vec<&str> = out
                    .iter()
                    .flat_map(|(p, n)| std::iter::repeat_n(p.name.as_str(), *n as usize))
                    .collect();
                model.place_all(&names)?;
                Some(out)
            }
            _ => None,
        }
    }
}

/// A GPU node with the physical GPU count a reconfiguration starts from (GFD's
/// `nvidia.com/gpu.count`; for the openb trace, the node's GPUs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    pub node: GpuNode,
    pub physical_gpus: u32,
}

/// Reconfigures one node. `Err` says why the choice does not apply (the node keeps its setup).
pub fn node_under(
    n: &ClusterNode,
    choice: &Choice,
    table: &MigTable,
) -> Result<GpuNode, &'static str> {
    let node = &n.node;
    let plain = |sharing: Sharing| GpuNode {
        gpus: n.physical_gpus,
        slots: n.physical_gpus.saturating_mul(sharing.replicas()),
        sharing,
        pool_resource: RESOURCE_GPU.to_string(),
        mig: MigLayout::None,
        gpu_memory_mib: node.gpu_memory_mib.or_else(|| full_memory(node, table)),
        ..node.clone()
    };
    match choice {
        Choice::AsIs => Ok(node.clone()),
        Choice::Exclusive => Ok(plain(Sharing::None)),
        Choice::TimeSlicing(r) => Ok(plain(Sharing::TimeSlicing { replicas: *r })),
        Choice::Mps(r) => Ok(plain(Sharing::Mps { replicas: *r })),
        Choice::MigAll(_) | Choice::MigBalanced => {
            let model = node
                .product
                .as_deref()
                .and_then(|p| table.model_for_product(p))
                .ok_or("GPU model without MIG")?;
            let layout = choice
                .mig_layout(model)
                .ok_or("GPU model without this MIG profile")?;
            let instances: BTreeMap<String, u32> = layout
                .into_iter()
                .map(|(p, c)| (p.name.clone(), c.saturating_mul(n.physical_gpus)))
                .collect();
            Ok(GpuNode {
                gpus: 0,
                slots: 0,
                sharing: Sharing::None,
                pool_resource: RESOURCE_GPU.to_string(),
                mig: MigLayout::Mixed { instances },
                ..node.clone()
            })
        }
    }
}

/// Full-GPU memory from the MIG table (the largest profile's), when GFD's label is missing.
fn full_memory(node: &GpuNode, table: &MigTable) -> Option<u64> {
    let model = table.model_for_product(node.product.as_deref()?)?;
    model
        .profiles
        .iter()
        .max_by_key(|p| p.memory_slices)
        .and_then(|p| p.memory_mib)
}

/// A profile's usable memory: the table's capture, else its nominal size (`10gb`) in MiB.
fn profile_memory_mib(p: &MigProfile) -> u64 {
    p.memory_mib.unwrap_or_else(|| {
        let gb: u64 = p
            .name
            .split_once('.')
            .and_then(|(_, m)| {
                m.trim_end_matches(|c: char| !c.is_ascii_digit())
                    .parse()
                    .ok()
            })
            .unwrap_or(0);
        gb * 1024
    })
}

/// What the cluster offers under a choice, for restating pods.
#[derive(Debug, Clone)]
pub struct Offer<'t> {
    pub choice: Choice,
    table: &'t MigTable,
    /// MIG choices: the MIG model for a pod without a model constraint (the one with the most
    /// GPUs the choice applies to).
    default_model: Option<&'t MigModel>,
}

impl<'t> Offer<'t> {
    /// `nodes` are the cluster as it is; the choice's default MIG model is picked from them.
    pub fn new(choice: Choice, nodes: &[ClusterNode], table: &'t MigTable) -> Self {
        let mut gpus: BTreeMap<&str, u32> = BTreeMap::new();
        if choice.is_mig() {
            for n in nodes {
                if let Some(m) = n
                    .node
                    .product
                    .as_deref()
                    .and_then(|p| table.model_for_product(p))
                    && choice.mig_layout(m).is_some()
                {
                    *gpus.entry(m.model.as_str()).or_default() += n.physical_gpus;
                }
            }
        }
        let default_model = gpus
            .into_iter()
            .max_by_key(|(name, g)| (*g, std::cmp::Reverse(*name)))
            .and_then(|(name, _)| table.models.iter().find(|m| m.model == name));
        Offer {
            choice,
            table,
            default_model,
        }
    }

    /// The MIG model a pod lands on: its model constraint's, else the default.
    fn model_for(&self, demand: &Demand) -> Option<&'t MigModel> {
        demand
            .models
            .iter()
            .find_map(|p| self.table.model_for_product(p))
            .or(self.default_model)
    }

    /// A share of one GPU (thousandths, optional memory) that a demand stands for, `None` for
    /// demands that are not a single share.
    fn share_of(&self, demand: &Demand) -> Option<(u32, Option<u64>)> {
        match &demand.gpu {
            GpuDemand::Mps { milli, memory_mib } | GpuDemand::Timeslice { milli, memory_mib } => {
                Some((*milli, *memory_mib))
            }
            GpuDemand::Mig { profile, count: 1 } => {
                let (model, p) = demand
                    .models
                    .iter()
                    .find_map(|m| self.table.model_for_product(m))
                    .and_then(|m| m.profile(profile).map(|p| (m, p)))
                    .or_else(|| self.table.find(profile))?;
                Some((mig_share_milli(model, p), Some(profile_memory_mib(p))))
            }
            _ => None,
        }
    }

    /// Restates a demand under the choice; `Err` says in words why it cannot be expressed.
    pub fn restate(&self, demand: &Demand) -> Result<Demand, RestateError> {
        let with = |gpu: GpuDemand| Demand {
            gpu,
            ..demand.clone()
        };
        if self.choice == Choice::AsIs {
            return Ok(demand.clone());
        }
        // Whole GPUs, and plain `nvidia.com/gpu` units (whole GPUs outside sharing).
        let whole = match &demand.gpu {
            GpuDemand::None => return Ok(demand.clone()),
            GpuDemand::Whole { count } => Some(*count),
            GpuDemand::Units { resource, count } if resource == RESOURCE_GPU => Some(*count),
            GpuDemand::Mig { count, .. } if *count > 1 && !self.choice.is_mig() => Some(*count),
            _ => None,
        };
        if let Some(count) = whole {
            return Ok(with(GpuDemand::Whole { count }));
        }
        if let GpuDemand::Units { resource, .. } = &demand.gpu {
            return Err(RestateError::Resource {
                resource: resource.clone(),
                choice: self.choice.clone(),
            });
        }
        if let (true, GpuDemand::Mig { profile, count }) = (self.choice.is_mig(), &demand.gpu) {
            // Kept when the config offers the profile on the pod's model.
            if let Some(m) = self.model_for(demand)
                && self
                    .choice
                    .mig_layout(m)
                    .is_some_and(|l| l.iter().any(|(p, _)| &p.name == profile))
            {
                return Ok(demand.clone());
            }
            if *count > 1 {
                return Err(RestateError::MigDevices {
                    count: *count,
                    profile: profile.clone(),
                    choice: self.choice.clone(),
                });
            }
        }
        let Some((milli, memory_mib)) = self.share_of(demand) else {
            return Err(RestateError::Inexpressible {
                gpu: demand.gpu.clone(),
                choice: self.choice.clone(),
            });
        };
        match &self.choice {
            Choice::AsIs => Ok(demand.clone()),
            Choice::Exclusive => Ok(with(GpuDemand::Whole { count: 1 })),
            Choice::TimeSlicing(_) => Ok(with(GpuDemand::Timeslice { milli, memory_mib })),
            Choice::Mps(_) => Ok(with(GpuDemand::Mps { milli, memory_mib })),
            Choice::MigAll(_) | Choice::MigBalanced => {
                let Some(model) = self.model_for(demand) else {
                    return Err(RestateError::NoModel(self.choice.clone()));
                };
                let layout = self.choice.mig_layout(model).unwrap_or_default();
                let fits = layout.iter().map(|(p, _)| *p).filter(|p| {
                    mig_share_milli(model, p) >= milli
                        && memory_mib.is_none_or(|m| profile_memory_mib(p) >= m)
                });
                match fits.min_by_key(|p| (p.memory_slices, p.compute_slices)) {
                    Some(p) => Ok(with(GpuDemand::Mig {
                        profile: p.name.clone(),
                        count: 1,
                    })),
                    None => Err(RestateError::TooLarge {
                        milli,
                        memory_mib,
                        choice: self.choice.clone(),
                        model: model.model.clone(),
                    }),
                }
            }
        }
    }
}

fn percent(milli: u32) -> String {
    format!("{}%", f64::from(milli) / 10.0)
}

const NOT_EXPRESSIBLE: &str = "not expressible";

/// A cluster and its pods under one choice, ready to replay.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub choice: Choice,
    pub nodes: Vec<GpuNode>,
    /// Nodes left as they were, per reason.
    pub kept: BTreeMap<String, usize>,
    /// The pods the choice can express, restated.
    pub pods: Vec<TracePod>,
    /// The pods it cannot: "request: why".
    pub rejected: Vec<String>,
    /// Request as asked -> as restated (or "not expressible").
    pub restated: BTreeMap<String, String>,
    pub physical_gpus: u32,
}

/// Reconfigures the nodes and restates the pods for one choice.
pub fn prepare(
    cluster: &[ClusterNode],
    pods: &[TracePod],
    choice: &Choice,
    table: &MigTable,
) -> Prepared {
    let mut nodes = Vec::with_capacity(cluster.len());
    let mut kept: BTreeMap<String, usize> = BTreeMap::new();
    for c in cluster {
        match node_under(c, choice, table) {
            Ok(n) => nodes.push(n),
            Err(why) => {
                *kept.entry(why.to_string()).or_default() += 1;
                nodes.push(c.node.clone());
            }
        }
    }
    let offer = Offer::new(choice.clone(), cluster, table);
    let mut out = Vec::with_capacity(pods.len());
    let mut rejected = Vec::new();
    let mut restated = BTreeMap::new();
    for p in pods {
        let asked = p.demand.gpu.to_string();
        match offer.restate(&p.demand) {
            Ok(d) => {
                restated.insert(asked, d.gpu.to_string());
                out.push(TracePod {
                    name: p.name.clone(),
                    demand: d,
                });
            }
            Err(why) => {
                restated.insert(asked.clone(), NOT_EXPRESSIBLE.to_string());
                rejected.push(format!("{asked}: {why}"));
            }
        }
    }
    Prepared {
        choice: choice.clone(),
        nodes,
        kept,
        pods: out,
        rejected,
        restated,
        physical_gpus: cluster.iter().map(|c| c.physical_gpus).sum(),
    }
}

/// Aggregates the replays (one per seed, with [`RunOutcome::unplaced`] recorded) of one
/// prepared choice under one policy.
pub fn choice_report(prep: &Prepared, policy: &str, runs: &[RunOutcome]) -> ChoiceReport {
    let n = runs.len().max(1) as f64;
    let mut unplaced: BTreeMap<String, f64> = BTreeMap::new();
    for why in &prep.rejected {
        *unplaced.entry(why.clone()).or_default() += 1.0;
    }
    for r in runs {
        for u in &r.unplaced {
            let asked = prep
                .pods
                .get(u.pod)
                .map_or_else(String::new, |p| p.demand.gpu.to_string());
            *unplaced
                .entry(format!("{asked}: {}", u.reason.message()))
                .or_default() += 1.0 / n;
        }
    }
    for v in unplaced.values_mut() {
        *v = (*v * 10.0).round() / 10.0;
    }
    let rejected = prep.rejected.len();
    let placed: Vec<usize> = runs.iter().map(|r| r.placed).collect();
    let alloc: f64 = runs
        .iter()
        .map(|r| {
            let last = r.samples.last().map_or(0, |s| s.allocated_milli);
            100.0 * last as f64 / r.capacity_milli.max(1) as f64
        })
        .sum::<f64>()
        / n;
    ChoiceReport {
        partition: prep.choice.to_string(),
        policy: policy.to_string(),
        nodes_changed: prep.nodes.len() - prep.kept.values().sum::<usize>(),
        nodes_kept: prep.kept.clone(),
        gpus: prep.physical_gpus,
        pods: prep.pods.len() + rejected,
        pods_placed: (placed.iter().sum::<usize>() as f64 / n * 10.0).round() / 10.0,
        pods_placed_min: placed.iter().copied().min().unwrap_or(0),
        pods_placed_max: placed.iter().copied().max().unwrap_or(0),
        gpu_allocated_pct: (alloc * 10.0).round() / 10.0,
        unplaced,
        restated: prep.restated.clone(),
    }
}

/// One row of the what-if report: a (choice, policy) pair, means over seeds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChoiceReport {
    pub partition: String,
    pub policy: String,
    /// GPU nodes the choice reconfigured, and those it left as they are (with why).
    pub nodes_changed: usize,
    pub nodes_kept: BTreeMap<String, usize>,
    /// Physical GPUs, and the capacity in GPUs (MIG devices by compute share).
    pub gpus: u32,
    pub pods: usize,
    pub pods_placed: f64,
    pub pods_placed_min: usize,
    pub pods_placed_max: usize,
    pub gpu_allocated_pct: f64,
    /// Unplaced pods per "request: why", mean over seeds.
    pub unplaced: BTreeMap<String, f64>,
    /// How each distinct request was restated ("mps-25" -> "mig-2g.20gb").
    pub restated: BTreeMap<String, String>,
}

/// Text table of the what-if rows, then the reasons and restatements per row.
pub fn table(rows: &[ChoiceReport], seeds: &[u64]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let Some(first) = rows.first() else {
        return out;
    };
    let _ = writeln!(
        out,
        "{} pods; each partitioning replayed once per seed ({}), pods in shuffled order, no inflation",
        first.pods,
        super::report::seeds_text(seeds)
    );
    let _ = writeln!(
        out,
        "{:<16} {:<11} {:>6} {:>12} {:>9} {:>11} {:>8}",
        "partition", "policy", "GPUs", "pods placed", "min-max", "GPU alloc%", "changed"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:<16} {:<11} {:>6} {:>7.1}/{:<4} {:>9} {:>11.1} {:>5}/{}",
            r.partition,
            r.policy,
            r.gpus,
            r.pods_placed,
            r.pods,
            format!("{}-{}", r.pods_placed_min, r.pods_placed_max),
            r.gpu_allocated_pct,
            r.nodes_changed,
            r.nodes_changed + r.nodes_kept.values().sum::<usize>(),
        );
    }
    for r in rows {
        if r.unplaced.is_empty() && r.nodes_kept.is_empty() {
            continue;
        }
        let _ = writeln!(out, "\n{} ({}):", r.partition, r.policy);
        for (why, n) in &r.nodes_kept {
            let _ = writeln!(out, "  {n} node(s) kept as they are: {why}");
        }
        for (from, to) in &r.restated {
            // Requests the choice cannot express are listed with their reason below.
            if from != to && to != NOT_EXPRESSIBLE {
                let _ = writeln!(out, "  {from} -> {to}");
            }
        }
        for (why, n) in &r.unplaced {
            let _ = writeln!(out, "  {n:>6.1} not placed: {why}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> MigTable {
        MigTable::default()
    }

    fn h100(name: &str, sharing: Sharing) -> ClusterNode {
        ClusterNode {
            node: GpuNode::shared(name, "NVIDIA-H100-80GB-HBM3", 8, 81559, sharing),
            physical_gpus: 8,
        }
    }

    fn share(gpu: GpuDemand) -> Demand {
        Demand::gpu(gpu)
    }

    #[test]
    fn choices_parse_and_print_back() {
        let t = table();
        for name in [
            "as-is",
            "exclusive",
            "timeslice-4",
            "mps-2",
            "all-1g.10gb",
            "all-balanced",
            "all-1g.10gb.me",
        ] {
            let c = Choice::parse(name, &t).unwrap();
            assert_eq!(c.to_string(), name);
        }
        assert_eq!(
            Choice::parse("all-disabled", &t).unwrap(),
            Choice::Exclusive
        );
        let e = Choice::parse("all-1g.11gb", &t).unwrap_err().to_string();
        assert!(e.contains("did you mean all-1g.10gb"), "{e}");
        let e = Choice::parse("mps-1", &t).unwrap_err();
        assert_eq!(
            e,
            ChoiceError::Replicas {
                text: "mps-1".into()
            }
        );
        assert!(e.to_string().contains("2 to 48"), "{e}");
        assert!(Choice::parse("mps-x", &t).is_err());
        assert!(
            Choice::parse("halves", &t)
                .unwrap_err()
                .to_string()
                .contains("timeslice-N")
        );
    }

    #[test]
    fn mig_configs_follow_mig_parted() {
        let t = table();
        let h100 = t.model_for_product("NVIDIA-H100-80GB-HBM3").unwrap();
        let a30 = t.model_for_product("NVIDIA-A30").unwrap();
        let names = |l: Vec<(&MigProfile, u32)>| -> Vec<(String, u32)> {
            l.into_iter().map(|(p, n)| (p.name.clone(), n)).collect()
        };
        assert_eq!(
            names(Choice::MigBalanced.mig_layout(h100).unwrap()),
            vec![
                ("1g.10gb".into(), 2),
                ("2g.20gb".into(), 1),
                ("3g.40gb".into(), 1)
            ]
        );
        assert_eq!(
            names(Choice::MigBalanced.mig_layout(a30).unwrap()),
            vec![("1g.6gb".into(), 2), ("2g.12gb".into(), 1)]
        );
        let all = |p: &str| Choice::MigAll(p.into()).mig_layout(h100).map(names);
        assert_eq!(all("1g.10gb"), Some(vec![("1g.10gb".into(), 7)]));
        assert_eq!(all("1g.20gb"), Some(vec![("1g.20gb".into(), 4)]));
        assert_eq!(all("3g.40gb"), Some(vec![("3g.40gb".into(), 2)]));
        assert_eq!(all("1g.6gb"), None);
    }

    #[test]
    fn nodes_are_reconfigured_or_kept_with_a_reason() {
        let t = table();
        let ts = h100("a", Sharing::TimeSlicing { replicas: 4 });
        let n = node_under(&ts, &Choice::Mps(2), &t).unwrap();
        assert_eq!((n.gpus, n.slots), (8, 16));
        assert_eq!(n.sharing, Sharing::Mps { replicas: 2 });
        let n = node_under(&ts, &Choice::Exclusive, &t).unwrap();
        assert_eq!((n.gpus, n.slots, n.sharing), (8, 8, Sharing::None));
        let n = node_under(&ts, &Choice::MigAll("1g.10gb".into()), &t).unwrap();
        assert_eq!(n.gpus, 0);
        match n.mig {
            MigLayout::Mixed { instances } => assert_eq!(instances["1g.10gb"], 56),
            other => panic!("expected mixed MIG, got {other:?}"),
        }
        let t4 = ClusterNode {
            node: GpuNode::whole("t4", "Tesla-T4", 4, 15360),
            physical_gpus: 4,
        };
        assert_eq!(
            node_under(&t4, &Choice::MigBalanced, &t).unwrap_err(),
            "GPU model without MIG"
        );
        assert_eq!(node_under(&t4, &Choice::AsIs, &t).unwrap(), t4.node);
    }

    #[test]
    fn shares_are_restated_in_each_choice() {
        let t = table();
        let nodes = [h100("a", Sharing::None)];
        let offer = |c: Choice| Offer::new(c, &nodes, &t);
        let mps25 = share(GpuDemand::Mps {
            milli: 250,
            memory_mib: None,
        });
        let ts50 = share(GpuDemand::Timeslice {
            milli: 500,
            memory_mib: None,
        });
        let mig3g = share(GpuDemand::Mig {
            profile: "3g.40gb".into(),
            count: 1,
        });
        let whole2 = share(GpuDemand::Whole { count: 2 });

        let balanced = offer(Choice::MigBalanced);
        // 25% needs two of seven compute slices.
        assert_eq!(
            balanced.restate(&mps25).unwrap().gpu,
            GpuDemand::Mig {
                profile: "2g.20gb".into(),
                count: 1
            }
        );
        let e = balanced.restate(&ts50).unwrap_err().to_string();
        assert!(
            e.contains("needs 50% of a GPU") && e.contains("all-balanced"),
            "{e}"
        );
        assert_eq!(balanced.restate(&mig3g).unwrap(), mig3g);
        assert_eq!(balanced.restate(&whole2).unwrap(), whole2);

        let ts = offer(Choice::TimeSlicing(4));
        assert_eq!(
            ts.restate(&mig3g).unwrap().gpu,
            GpuDemand::Timeslice {
                milli: 428,
                memory_mib: Some(40448)
            }
        );
        assert_eq!(
            offer(Choice::Exclusive).restate(&mps25).unwrap().gpu,
            GpuDemand::Whole { count: 1 }
        );
        assert_eq!(
            offer(Choice::Mps(4)).restate(&ts50).unwrap().gpu,
            GpuDemand::Mps {
                milli: 500,
                memory_mib: None
            }
        );
        // Memory decides the device: 12 GiB does not fit a 1g.10gb.
        let mem = share(GpuDemand::Timeslice {
            milli: 100,
            memory_mib: Some(12 * 1024),
        });
        assert_eq!(
            offer(Choice::MigAll("1g.20gb".into()))
                .restate(&mem)
                .unwrap()
                .gpu,
            GpuDemand::Mig {
                profile: "1g.20gb".into(),
                count: 1
            }
        );
        assert!(
            offer(Choice::MigAll("1g.10gb".into()))
                .restate(&mem)
                .is_err()
        );
        let units = share(GpuDemand::Units {
            resource: "nvidia.com/gpu.shared".into(),
            count: 1,
        });
        assert!(
            offer(Choice::Exclusive)
                .restate(&units)
                .unwrap_err()
                .to_string()
                .contains("gpu.shared")
        );
        assert_eq!(offer(Choice::AsIs).restate(&units).unwrap(), units);
    }
}

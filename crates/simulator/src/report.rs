//! PURE: from replays to the report: per-run curves bucketed by arrived %, means and medians
//! over seeds, the table, the JSON document and the SVG chart.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::median;
use super::replay::RunOutcome;

/// One bucket of one run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub allocated_pct: f64,
    pub frag_amount_pct: f64,
    pub frag_ratio_pct: f64,
}

/// A run's curve: index = arrived % (rounded), up to the last bucket the run reached.
pub fn curve(run: &RunOutcome) -> Vec<Point> {
    let cap = run.capacity_milli.max(1) as f64;
    let mut sums: Vec<(f64, f64, f64, u32)> = Vec::new();
    for s in &run.samples {
        let b = (100.0 * s.arrived_milli as f64 / cap).round() as usize;
        if sums.len() <= b {
            sums.resize(b + 1, (0.0, 0.0, 0.0, 0));
        }
        let idle = run.capacity_milli.saturating_sub(s.allocated_milli) as f64;
        let ratio = if idle > 0.0 {
            100.0 * s.frag_milli / idle
        } else {
            100.0
        };
        let e = &mut sums[b];
        e.0 += 100.0 * s.allocated_milli as f64 / cap;
        e.1 += 100.0 * s.frag_milli / cap;
        e.2 += ratio;
        e.3 += 1;
    }
    let mut out: Vec<Point> = Vec::with_capacity(sums.len());
    for b in 0..sums.len() {
        // An empty bucket takes the mean of the samples within +-1; with none there either (a
        // small cluster jumps several points per pod), the state carries over from below.
        let range = if sums[b].3 > 0 {
            b..=b
        } else {
            b.saturating_sub(1)..=(b + 1).min(sums.len() - 1)
        };
        let (a, f, r, n) = range.map(|i| sums[i]).fold((0.0, 0.0, 0.0, 0), |x, y| {
            (x.0 + y.0, x.1 + y.1, x.2 + y.2, x.3 + y.3)
        });
        let point = match (n, out.last()) {
            (0, Some(prev)) => *prev,
            _ => {
                let n = f64::from(n.max(1));
                Point {
                    allocated_pct: a / n,
                    frag_amount_pct: f / n,
                    frag_ratio_pct: r / n,
                }
            }
        };
        out.push(point);
    }
    out
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.iter().sum::<f64>() / v.len() as f64
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// One point of a policy's curve, over seeds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CurvePoint {
    pub arrived_pct: u32,
    /// Mean over the seeds that reached this bucket.
    pub allocated_pct: f64,
    pub allocated_pct_median: f64,
    pub frag_amount_pct: f64,
    pub frag_ratio_pct: f64,
    pub seeds: usize,
}

/// A policy's results over seeds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PolicyReport {
    pub name: String,
    /// 100 - allocated %, mean over seeds, at the report's arrival points.
    pub unallocated_gpu_pct: BTreeMap<String, f64>,
    pub unallocated_gpu_pct_median: BTreeMap<String, f64>,
    pub frag_amount_pct: BTreeMap<String, f64>,
    pub frag_ratio_pct: BTreeMap<String, f64>,
    /// Pods placed and failed, mean over seeds.
    pub pods_placed: f64,
    pub pods_failed: f64,
    pub curve: Vec<CurvePoint>,
    /// With `--refusals`: the GPU refused per pod shape (see [`super::refusals`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub refusals: Vec<super::refusals::Refusal>,
    /// With `--defrag`: what the moves did, mean over seeds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moved: Option<MovedReport>,
}

/// What defragmentation did over a policy's replays, mean over seeds.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MovedReport {
    /// Pods the packing refused, for which a plan was sought.
    pub sought: f64,
    /// Of those, placed once their plan's moves were made.
    pub placed: f64,
    pub moves: f64,
    pub gpus_freed: f64,
    /// Moves over GPUs freed, all seeds together.
    pub moves_per_gpu: f64,
}

fn moved_report(runs: &[RunOutcome]) -> Option<MovedReport> {
    let all: Vec<super::residents::Moved> = runs.iter().filter_map(|r| r.moved).collect();
    if all.is_empty() {
        return None;
    }
    let n = all.len() as f64;
    let sum = |f: fn(&super::residents::Moved) -> u64| all.iter().map(f).sum::<u64>() as f64;
    let (moves, freed) = (sum(|m| m.moves), sum(|m| m.gpus_freed));
    Some(MovedReport {
        sought: round2(sum(|m| m.sought) / n),
        placed: round2(sum(|m| m.placed) / n),
        moves: round2(moves / n),
        gpus_freed: round2(freed / n),
        moves_per_gpu: if freed > 0.0 {
            round2(moves / freed)
        } else {
            0.0
        },
    })
}

pub use super::REPORT_AT;

/// Aggregates one policy's runs (one per seed).
pub fn policy_report(name: &str, runs: &[RunOutcome]) -> PolicyReport {
    let curves: Vec<Vec<Point>> = runs.iter().map(curve).collect();
    let len = curves.iter().map(Vec::len).max().unwrap_or(0);
    let mut points = Vec::with_capacity(len);
    for b in 0..len {
        let at: Vec<&Point> = curves.iter().filter_map(|c| c.get(b)).collect();
        let alloc: Vec<f64> = at.iter().map(|p| p.allocated_pct).collect();
        let amount: Vec<f64> = at.iter().map(|p| p.frag_amount_pct).collect();
        let ratio: Vec<f64> = at.iter().map(|p| p.frag_ratio_pct).collect();
        points.push(CurvePoint {
            arrived_pct: b as u32,
            allocated_pct: round2(mean(&alloc)),
            allocated_pct_median: round2(median(&alloc)),
            frag_amount_pct: round2(mean(&amount)),
            frag_ratio_pct: round2(mean(&ratio)),
            seeds: at.len(),
        });
    }
    let mut unalloc = BTreeMap::new();
    let mut unalloc_med = BTreeMap::new();
    let mut amount = BTreeMap::new();
    let mut ratio = BTreeMap::new();
    for at in REPORT_AT {
        let idx = at as usize;
        let vals: Vec<&Point> = curves.iter().filter_map(|c| c.get(idx)).collect();
        if vals.is_empty() {
            continue;
        }
        let alloc: Vec<f64> = vals.iter().map(|p| 100.0 - p.allocated_pct).collect();
        unalloc.insert(at.to_string(), round2(mean(&alloc)));
        unalloc_med.insert(at.to_string(), round2(median(&alloc)));
        amount.insert(
            at.to_string(),
            round2(mean(
                &vals.iter().map(|p| p.frag_amount_pct).collect::<Vec<_>>(),
            )),
        );
        ratio.insert(
            at.to_string(),
            round2(mean(
                &vals.iter().map(|p| p.frag_ratio_pct).collect::<Vec<_>>(),
            )),
        );
    }
    let n = runs.len().max(1) as f64;
    PolicyReport {
        name: name.to_string(),
        unallocated_gpu_pct: unalloc,
        unallocated_gpu_pct_median: unalloc_med,
        frag_amount_pct: amount,
        frag_ratio_pct: ratio,
        pods_placed: runs.iter().map(|r| r.placed as f64).sum::<f64>() / n,
        pods_failed: runs.iter().map(|r| r.failed as f64).sum::<f64>() / n,
        curve: points,
        refusals: Vec::new(),
        moved: moved_report(runs),
    }
}

/// The whole report (`--json`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    pub gpus_total: u64,
    pub nodes: usize,
    pub pods: usize,
    /// The workload variant replayed (`--variant`), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// kube-scheduler's percentageOfNodesToScore replayed (`--nodes-to-score`): 100 scores every
    /// node, 0 is kube-scheduler's adaptive default.
    pub nodes_to_score: u32,
    pub tune: f64,
    pub seeds: Vec<u64>,
    pub policies: Vec<PolicyReport>,
}

fn cell(m: &BTreeMap<String, f64>, at: u32) -> String {
    m.get(&at.to_string())
        .map_or_else(|| "-".to_string(), |v| format!("{v:.2}"))
}

/// The table: unallocated GPU % (mean and median over seeds) and fragmentation at 100% and 130%
/// arrival, with each policy's margin against `fgd` when it is in the report.
pub fn table(r: &Report) -> String {
    let fgd = r.policies.iter().find(|p| p.name == "fgd");
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} nodes, {} GPUs, {} pods{}{}, tune {}, seeds {}",
        r.nodes,
        r.gpus_total,
        r.pods,
        r.variant
            .as_ref()
            .map_or_else(String::new, |v| format!(" (variant {v})")),
        match r.nodes_to_score {
            100 => String::new(),
            0 => format!(
                ", scoring the first {} nodes that fit (kube-scheduler's adaptive percentageOfNodesToScore)",
                super::replay::nodes_to_find(0, r.nodes)
            ),
            p => format!(
                ", scoring the first {} nodes that fit (percentageOfNodesToScore {p})",
                super::replay::nodes_to_find(p, r.nodes)
            ),
        },
        r.tune,
        seeds_text(&r.seeds)
    );
    let _ = writeln!(
        out,
        "unalloc%: GPUs left unallocated, % of all GPUs, once the arrived pods ask for 100% (130%)\n\
         \x20 of them (mean of the seeds; median: at 100%); vs fgd: difference from fgd, in points\n\
         frag%: GPUs idle in pieces too small for the workload's pods, % of all GPUs, at 100%;\n\
         \x20 frag/idle%: the same, % of the idle GPUs. Lower is better in all of these.\n\
         placed/asked: pods placed of the pods that arrived (mean of the seeds)"
    );
    let _ = writeln!(
        out,
        "{:<15}  {:>12}  {:>6}  {:>6}  {:>12}  {:>6}  {:>9}  {:>10}  {:>15}",
        "policy",
        "unalloc%@100",
        "median",
        "vs fgd",
        "unalloc%@130",
        "vs fgd",
        "frag%@100",
        "frag/idle%",
        "placed/asked"
    );
    for p in &r.policies {
        let margin = |at: u32| -> String {
            match (fgd, p.unallocated_gpu_pct.get(&at.to_string())) {
                (Some(f), Some(v)) if f.name != p.name => f
                    .unallocated_gpu_pct
                    .get(&at.to_string())
                    .map_or_else(|| "-".into(), |fv| format!("{:+.2}", v - fv)),
                _ => "-".into(),
            }
        };
        let _ = writeln!(
            out,
            "{:<15}  {:>12}  {:>6}  {:>6}  {:>12}  {:>6}  {:>9}  {:>10}  {:>15}",
            p.name,
            cell(&p.unallocated_gpu_pct, 100),
            cell(&p.unallocated_gpu_pct_median, 100),
            margin(100),
            cell(&p.unallocated_gpu_pct, 130),
            margin(130),
            cell(&p.frag_amount_pct, 100),
            cell(&p.frag_ratio_pct, 100),
            placed_of_asked(p.pods_placed, p.pods_placed + p.pods_failed),
        );
    }
    for p in &r.policies {
        if let Some(m) = &p.moved {
            let _ = writeln!(
                out,
                "{}, defragmenting: {} of the {} pods refused per seed placed after moves, {} moves \
                 for {} GPUs freed ({} moves per GPU)",
                p.name, m.placed, m.sought, m.moves, m.gpus_freed, m.moves_per_gpu
            );
        }
    }
    let refusals: Vec<(&str, &[super::refusals::Refusal])> = r
        .policies
        .iter()
        .map(|p| (p.name.as_str(), p.refusals.as_slice()))
        .collect();
    out.push_str(&super::refusals::table(&refusals));
    out
}

/// `39.4/48`: a mean of placed pods over the pods asked, whole numbers without decimals.
fn placed_of_asked(placed: f64, asked: f64) -> String {
    let num = |x: f64| {
        if (x - x.round()).abs() < 0.05 {
            format!("{x:.0}")
        } else {
            format!("{x:.1}")
        }
    };
    format!("{}/{}", num(placed), num(asked))
}

/// `42..51` for a contiguous range, else a comma list.
pub fn seeds_text(seeds: &[u64]) -> String {
    match (seeds.first(), seeds.last()) {
        (Some(a), Some(b)) if seeds.len() > 2 && seeds.windows(2).all(|w| w[1] == w[0] + 1) => {
            format!("{a}..{b}")
        }
        _ => seeds
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(","),
    }
}

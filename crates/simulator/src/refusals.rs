//! PURE: which pods a policy refused, when, and for lack of what (`simulate --refusals`).
//!
//! Two arrival points say how much a policy left unallocated, not why. At 100% arrival every
//! GPU a refused pod asked for is a GPU left unallocated, so the refusals up to that point are
//! the whole of the figure: grouped by pod shape, with the arrival point of the first refusal
//! and the fit reason, they say which pods fail, from when, and for lack of what (an 8-GPU pod
//! refused from 60% arrival on, while the cluster still has room, reads differently from one
//! refused in the last percent).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

use serde::Serialize;

use super::replay::RunOutcome;
use super::trace::{TracePod, gpu_request_milli};
use super::{REPORT_AT, median};
use crate::packing::{Demand, Reason};

/// The GPU one policy refused to one pod shape, over seeds.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Refusal {
    /// The pod shape: its GPU request, CPU and allowed models (`exclusive-8, 120 CPU`).
    pub shape: String,
    /// GPU asked for by the refused pods of this shape that arrived by 100% (130%) of the
    /// GPUs, % of the GPUs, mean over the seeds.
    pub refused_gpu_pct: BTreeMap<String, f64>,
    /// Those pods, mean over the seeds.
    pub pods: BTreeMap<String, f64>,
    /// The arrival point (% of the GPUs) of the shape's first refusal, median over the seeds
    /// that refused one.
    pub first_refused_at_pct: f64,
    /// The earliest of those points: a shape refused from 60% arrival in one seed in ten has
    /// its median near the end but this one early.
    pub earliest_refused_at_pct: f64,
    /// The fit reason given most often.
    pub why: String,
}

/// A demand's shape as the refusal table names it.
pub fn shape_label(d: &Demand) -> String {
    let cpu = d.cpu_milli as f64 / 1000.0;
    let mut s = if d.cpu_milli.is_multiple_of(1000) {
        format!("{}, {cpu:.0} CPU", d.gpu)
    } else {
        format!("{}, {cpu:.1} CPU", d.gpu)
    };
    if !d.models.is_empty() {
        let _ = write!(s, ", on {}", d.models.join("|"));
    }
    s
}

/// The refusals of one policy's runs (recorded with `Trace::explain`), largest first by the GPU
/// refused by 100% arrival, then by 130%.
pub fn refusals(pods: &[TracePod], runs: &[RunOutcome]) -> Vec<Refusal> {
    #[derive(Default)]
    struct Acc {
        /// Per arrival point of [`REPORT_AT`]: % of the GPUs and pods, summed over the runs.
        gpu_pct: [f64; REPORT_AT.len()],
        pods: [u64; REPORT_AT.len()],
        /// The arrival % of the first refusal in each run that refused this shape.
        first: Vec<f64>,
        why: HashMap<Reason, u32>,
    }
    let n = runs.len().max(1) as f64;
    let mut by: BTreeMap<String, Acc> = BTreeMap::new();
    for run in runs {
        let cap = run.capacity_milli.max(1);
        let mut seen = HashSet::new();
        for u in &run.unplaced {
            let Some(pod) = pods.get(u.pod) else { continue };
            let label = shape_label(&pod.demand);
            let acc = by.entry(label.clone()).or_default();
            let ask = gpu_request_milli(&pod.demand);
            for (i, at) in REPORT_AT.iter().enumerate() {
                if u.arrived_milli * 100 <= cap * u64::from(*at) {
                    acc.gpu_pct[i] += 100.0 * ask as f64 / cap as f64;
                    acc.pods[i] += 1;
                }
            }
            if seen.insert(label) {
                acc.first.push(100.0 * u.arrived_milli as f64 / cap as f64);
            }
            *acc.why.entry(u.reason.clone()).or_default() += 1;
        }
    }
    let mut rows: Vec<(Acc, Refusal)> = by
        .into_iter()
        .map(|(shape, acc)| {
            let why = acc
                .why
                .iter()
                .max_by_key(|(r, c)| (**c, std::cmp::Reverse(r.label())))
                .map(|(r, _)| r.message())
                .unwrap_or_default();
            let round = |x: f64, k: f64| (x * k).round() / k;
            let at = |v: &[f64]| -> BTreeMap<String, f64> {
                REPORT_AT
                    .iter()
                    .zip(v)
                    .map(|(a, x)| (a.to_string(), *x))
                    .collect()
            };
            let gpu: Vec<f64> = acc.gpu_pct.iter().map(|x| round(x / n, 1000.0)).collect();
            let count: Vec<f64> = acc
                .pods
                .iter()
                .map(|c| round(*c as f64 / n, 10.0))
                .collect();
            let earliest = acc.first.iter().copied().fold(f64::INFINITY, f64::min);
            let refusal = Refusal {
                shape,
                refused_gpu_pct: at(&gpu),
                pods: at(&count),
                first_refused_at_pct: round(median(&acc.first), 10.0),
                earliest_refused_at_pct: round(earliest, 10.0),
                why,
            };
            (acc, refusal)
        })
        .collect();
    // Most GPU refused by the first arrival point, then the next; BTreeMap order breaks ties.
    rows.sort_by(|(a, _), (b, _)| {
        b.gpu_pct
            .iter()
            .zip(&a.gpu_pct)
            .fold(std::cmp::Ordering::Equal, |o, (x, y)| {
                o.then(x.total_cmp(y))
            })
    });
    rows.into_iter().map(|(_, r)| r).collect()
}

/// How many shapes the text table lists per policy (the JSON has them all).
pub const TABLE_ROWS: usize = 12;

/// The text table: per policy (name, refusals), the shapes it refused the most GPU to.
pub fn table(policies: &[(&str, &[Refusal])]) -> String {
    let mut out = String::new();
    if policies.iter().all(|(_, r)| r.is_empty()) {
        return out;
    }
    let _ = writeln!(
        out,
        "\nrefused: GPU asked for by refused pods that arrived by 100% (130%) of the GPUs, % of\n\
         \x20 all GPUs, mean of the seeds (at 100% arrival this is the unallocated figure); first:\n\
         \x20 arrival % of the shape's first refusal, median of the seeds (earliest: of any seed);\n\
         \x20 why: the fit reason given most often"
    );
    for (name, refusals) in policies.iter().filter(|(_, r)| !r.is_empty()) {
        let _ = writeln!(out, "\n{name}:");
        let _ = writeln!(
            out,
            "  {:<34} {:>8} {:>8} {:>8} {:>6} {:>8}  why",
            "pod shape", "pods@100", "refused%", "@130", "first", "earliest"
        );
        for r in refusals.iter().take(TABLE_ROWS) {
            let get =
                |m: &BTreeMap<String, f64>, at: u32| m.get(&at.to_string()).copied().unwrap_or(0.0);
            let _ = writeln!(
                out,
                "  {:<34} {:>8.1} {:>8.3} {:>8.3} {:>6.1} {:>8.1}  {}",
                r.shape,
                get(&r.pods, 100),
                get(&r.refused_gpu_pct, 100),
                get(&r.refused_gpu_pct, 130),
                r.first_refused_at_pct,
                r.earliest_refused_at_pct,
                r.why
            );
        }
        if refusals.len() > TABLE_ROWS {
            let _ = writeln!(
                out,
                "  ({} more shapes in the JSON report)",
                refusals.len() - TABLE_ROWS
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packing::GpuDemand;
    use crate::replay::Unplaced;

    fn pod(gpu: GpuDemand, cpu_milli: u64, models: &[&str]) -> TracePod {
        TracePod {
            name: "p".into(),
            demand: Demand {
                cpu_milli,
                models: models.iter().map(|m| m.to_string()).collect(),
                ..Demand::gpu(gpu)
            },
        }
    }

    fn run(capacity_milli: u64, unplaced: Vec<(usize, u64, Reason)>) -> RunOutcome {
        RunOutcome {
            seed: 0,
            capacity_milli,
            samples: Vec::new(),
            placed: 0,
            failed: unplaced.len(),
            moved: None,
            unplaced: unplaced
                .into_iter()
                .map(|(pod, arrived_milli, reason)| Unplaced {
                    pod,
                    arrived_milli,
                    reason,
                })
                .collect(),
        }
    }

    #[test]
    fn shapes_are_named_by_request_cpu_and_models() {
        let p = pod(GpuDemand::Whole { count: 8 }, 120_000, &[]);
        assert_eq!(shape_label(&p.demand), "exclusive-8, 120 CPU");
        let p = pod(
            GpuDemand::Timeslice {
                milli: 810,
                memory_mib: None,
            },
            3_200,
            &["T4", "A10"],
        );
        assert_eq!(shape_label(&p.demand), "timeslice-81, 3.2 CPU, on T4|A10");
    }

    #[test]
    fn refusals_split_at_100_percent_and_are_timed_per_seed() {
        let pods = vec![
            pod(GpuDemand::Whole { count: 8 }, 120_000, &[]),
            pod(GpuDemand::Whole { count: 1 }, 12_000, &[]),
        ];
        // 100 GPUs. Seed one refuses the 8-GPU pod at 60% and 120% arrival, and the 1-GPU pod
        // at 99%; seed two refuses the 8-GPU pod at 90% (and only then).
        let runs = vec![
            run(
                100_000,
                vec![
                    (0, 60_000, Reason::Cpu),
                    (1, 99_000, Reason::NoFreeGpus),
                    (0, 120_000, Reason::TooFewGpus),
                ],
            ),
            run(100_000, vec![(0, 90_000, Reason::Cpu)]),
        ];
        let r = refusals(&pods, &runs);
        assert_eq!(r.len(), 2);
        let big = &r[0];
        assert_eq!(big.shape, "exclusive-8, 120 CPU");
        // By 100%: 8 + 8 GPUs over two seeds of 100 GPUs = 8%; by 130%: 24 / 2 = 12%.
        assert_eq!(big.refused_gpu_pct["100"], 8.0);
        assert_eq!(big.refused_gpu_pct["130"], 12.0);
        assert_eq!(big.pods["100"], 1.0);
        assert_eq!(big.pods["130"], 1.5);
        // First refusals at 60% and 90%: median 75, earliest 60.
        assert_eq!(big.first_refused_at_pct, 75.0);
        assert_eq!(big.earliest_refused_at_pct, 60.0);
        assert_eq!(big.why, Reason::Cpu.message());
        let small = &r[1];
        assert_eq!(small.refused_gpu_pct["100"], 0.5);
        assert_eq!(small.first_refused_at_pct, 99.0);
        assert_eq!(small.why, Reason::NoFreeGpus.message());
    }

    #[test]
    fn the_table_lists_each_policy_that_has_refusals() {
        let pods = vec![pod(GpuDemand::Whole { count: 2 }, 4_000, &[])];
        let runs = vec![run(10_000, vec![(0, 9_000, Reason::TooFewGpus)])];
        let with = refusals(&pods, &runs);
        let text = table(&[("fgd", &[]), ("gpu-share", &with)]);
        assert!(text.contains("\ngpu-share:\n"), "{text}");
        assert!(!text.contains("\nfgd:\n"), "{text}");
        assert!(text.contains("exclusive-2, 4 CPU"), "{text}");
        assert!(text.contains("20.000"), "{text}");
        assert!(table(&[("fgd", &[])]).is_empty());
    }
}

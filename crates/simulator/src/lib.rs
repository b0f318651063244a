//! gpu-share's simulator, `gpu-share simulate`: replays a trace (the FGD paper's openb trace, or
//! a Kubernetes-shaped cluster) through the packing core under several policies and seeds, and
//! reports how much GPU each leaves unallocated and how fragmented the cluster gets
//! (reference/fgd.md sections 3-4).
//!
//! It is an offline tool: it places pods with the core's packing, the one the extender calls,
//! and depends on nothing of the service (Cargo holds it to that). Everything but [`driver`] is
//! pure; the driver reads files, runs the replays on all cores and writes the outputs.
#![forbid(unsafe_code)]

// The pure core (crates/core), at the paths the simulator has always used.
/// The reservation's model: the pure core's.
pub use gpu_share_core::reservation;
pub use gpu_share_core::{
    defrag, documents, enforcement, inventory, ledger, mig, packing, request,
};

pub mod args;
pub mod chart;
pub mod churn;
pub mod kube;
pub mod partition;
pub mod refusals;
pub mod replay;
pub mod report;
pub mod residents;
pub mod trace;
pub mod variant;

pub mod driver;

use crate::packing::PackingPolicy;

/// The arrival points (% of the GPU capacity) the reports give figures at.
pub const REPORT_AT: [u32; 2] = [100, 130];

/// The median of `v` (NaN when empty).
pub(crate) fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

/// The policies replayed when none is named: the FGD paper's six and gpu-share's own (every
/// policy but `binpack` and `spread`).
pub fn default_policies() -> Vec<PackingPolicy> {
    PackingPolicy::ALL
        .into_iter()
        .filter(|p| !matches!(p, PackingPolicy::Binpack | PackingPolicy::Spread))
        .collect()
}

/// Why `--seeds` names no seeds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SeedsError {
    #[error("seed {0:?} is not a non-negative integer")]
    NotANumber(String),
    #[error("seed range {0} is empty (A..B needs A <= B)")]
    EmptyRange(String),
    #[error("seed range {0} has more than 10,000 seeds")]
    TooMany(String),
    #[error("no seeds")]
    None,
}

/// A `--policy` name that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown policy {0:?}: one of {names}", names = PackingPolicy::ALL.map(PackingPolicy::name).join(", "))]
pub struct UnknownPolicy(pub String);

/// Parses `--seeds`: `A..B` (inclusive), `A`, or `A,B,C`.
pub fn parse_seeds(text: &str) -> Result<Vec<u64>, SeedsError> {
    let text = text.trim();
    let num = |s: &str| {
        s.trim()
            .parse::<u64>()
            .map_err(|_| SeedsError::NotANumber(s.trim().to_string()))
    };
    let seeds = if let Some((a, b)) = text.split_once("..") {
        let (a, b) = (num(a)?, num(b.trim_start_matches('='))?);
        if b < a {
            return Err(SeedsError::EmptyRange(text.to_string()));
        }
        if b - a >= 10_000 {
            return Err(SeedsError::TooMany(text.to_string()));
        }
        (a..=b).collect()
    } else {
        text.split(',').map(num).collect::<Result<Vec<_>, _>>()?
    };
    if seeds.is_empty() {
        return Err(SeedsError::None);
    }
    Ok(seeds)
}

/// Parses the `--policy` names (default: [`default_policies`]), without duplicates.
pub fn parse_policies(names: &[String]) -> Result<Vec<PackingPolicy>, UnknownPolicy> {
    if names.is_empty() {
        return Ok(default_policies());
    }
    let mut out = Vec::new();
    for n in names {
        for n in n.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let p = PackingPolicy::parse(n).ok_or_else(|| UnknownPolicy(n.to_string()))?;
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_and_policies_parse() {
        assert_eq!(parse_seeds("42..51").unwrap().len(), 10);
        assert_eq!(parse_seeds("7").unwrap(), vec![7]);
        assert_eq!(parse_seeds("1,3").unwrap(), vec![1, 3]);
        let e = parse_seeds("5..4").unwrap_err();
        assert_eq!(e, SeedsError::EmptyRange("5..4".into()));
        assert!(e.to_string().contains("empty"), "{e}");
        let e = parse_seeds("x").unwrap_err();
        assert!(e.to_string().contains("not a non-negative"), "{e}");
        assert_eq!(parse_policies(&[]).unwrap().len(), 7);
        assert_eq!(
            parse_policies(&["fgd".into(), "gpu-share,fgd".into()]).unwrap(),
            vec![PackingPolicy::Fgd, PackingPolicy::GpuShare]
        );
        assert!(
            parse_policies(&["fdg".into()])
                .unwrap_err()
                .to_string()
                .contains("unknown policy \"fdg\"")
        );
    }
}

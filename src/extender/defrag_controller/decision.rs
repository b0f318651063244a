//! PURE: what the planner says for one waiting pod over one tick's [`Ground`], and the words
//! the pod is told.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::Pod;

use super::gather::Ground;
use crate::cache::Nodes;
use crate::defrag::{Guest, Limits, NoPlan, Plan, Waiting};
use crate::extender::explain;
use crate::ledger::BindPod;
use crate::packing::{Demand, Scorer};
use crate::policy::{DefragPolicy, Policy};

/// A pod filter found no room for, as the planner weighs it.
#[derive(Debug, Clone)]
pub struct Waiter {
    pub pod: std::sync::Arc<Pod>,
    /// Its demand as filter reads it.
    pub demand: Demand,
    pub priority: i32,
}

impl Waiter {
    /// The pod as filter reads it under `policy`; `None` for a pod that asks no GPU, or whose
    /// request cannot be read (filter refuses it in words), or that has a node already.
    pub fn of(pod: std::sync::Arc<Pod>, policy: &Policy) -> Option<Waiter> {
        if !crate::ledger::waits_for_a_node(&pod) {
            return None;
        }
        let read = BindPod::of(&pod);
        let mut demand = read.demand.ok().flatten()?;
        demand.enforcement = policy.enforcement.budgets;
        Some(Waiter {
            priority: read.pod.priority,
            pod,
            demand,
        })
    }
}

/// The planner's limits under the policy.
pub fn limits(policy: &DefragPolicy) -> Limits {
    Limits {
        moves_per_gpu: policy.moves_per_gpu,
        ..Limits::default()
    }
}

/// The plan for `waiter` over `ground`: it goes only to nodes kube-scheduler's own placement
/// rules leave it (its nodeSelector, required node affinity and tolerations,
/// [`explain::open_to`]) and `open` leaves it (no other plan under way holds them), and a pod
/// that moves goes only where `may_go` (its UID, the node) says.
pub fn weigh(
    ground: &Ground,
    nodes: &Nodes,
    scorer: &Scorer,
    waiter: &Waiter,
    policy: &DefragPolicy,
    may_go: &dyn Fn(&str, &str) -> bool,
    open: &dyn Fn(&str) -> bool,
) -> Result<Plan, NoPlan> {
    let spec = waiter.pod.spec.clone().unwrap_or_default();
    crate::defrag::plan(
        scorer,
        &ground.sites(),
        &Waiting {
            demand: &waiter.demand,
            priority: waiter.priority,
        },
        &limits(policy),
        |guest, node| match guest {
            Guest::Waiting => {
                open(node)
                    && nodes
                        .get(node)
                        .is_some_and(|f| explain::open_to(&spec, node, f))
            }
            Guest::Moved(r) => may_go(&r.id, node),
        },
    )
}

/// The nodes kube-scheduler's own placement rules leave a pod ([`explain::open_to`]).
pub fn picked_by(nodes: &Nodes, spec: &k8s_openapi::api::core::v1::PodSpec) -> HashSet<String> {
    nodes
        .iter()
        .filter(|(n, f)| explain::open_to(spec, n, f))
        .map(|(n, _)| n.clone())
        .collect()
}

/// What the waiting pod is told, if anything: the plan and that nothing moves (`defrag.mode:
/// plan`), or why no moves make room. Nothing where a node takes it as things stand (the ledger
/// saw room kube-scheduler will find on its next try).
pub fn words(outcome: &Result<Plan, NoPlan>) -> Option<String> {
    match outcome {
        Ok(plan) => Some(format!("{plan}; defrag.mode is plan, so nothing moves")),
        Err(why) if why.fits.is_some() => None,
        Err(why) => Some(format!("no defragmentation plan: {why}")),
    }
}

/// The outcome as the metric labels it.
pub fn label(outcome: &Result<Plan, NoPlan>) -> &'static str {
    match outcome {
        Ok(_) => "planned",
        Err(why) => why.label(),
    }
}

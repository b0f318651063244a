//! PURE over the ledger: what the defragmentation planner weighs, one [`Ground`] per tick:
//! every node the ledger holds, with its usage and what holds something there, each holding
//! read as a resident with its [`Mobility`].

use std::collections::BTreeMap;

use crate::defrag::mobility::mobility_of;
use crate::defrag::{Mobility, Pinned, Resident, Site};
use crate::inventory::GpuNode;
use crate::ledger::{Holder, Holding, NodeLedger};
use crate::packing::{GpuDemand, Usage};

/// The nodes as the planner reads them, owned (the ledger's snapshot of one tick).
pub struct Ground {
    nodes: Vec<(GpuNode, Usage, Vec<Resident>)>,
}

/// What decides whether a holding may move beyond what its pod says.
pub struct Rules<'a> {
    /// The namespaces the policy opts in (`defrag.namespaces`).
    pub namespaces: &'a [String],
    /// Whether a workload had a pod moved, or an eviction refused, within the cooldown.
    pub cooling: &'a dyn Fn(&str) -> bool,
    /// Whether a pod is not settled in the extender's eyes (a bind assumed or in doubt).
    pub unsettled: &'a dyn Fn(&str) -> bool,
}

impl Ground {
    /// Reads every node of `snapshot` (the ledger's), its holdings as residents under `rules`.
    pub fn gather(snapshot: BTreeMap<String, NodeLedger>, rules: &Rules) -> Ground {
        let nodes = snapshot
            .into_values()
            .map(|nl| {
                let residents = nl
                    .holdings
                    .iter()
                    .map(|(key, h)| resident(key, h, rules))
                    .collect();
                (nl.node, nl.usage, residents)
            })
            .collect();
        Ground { nodes }
    }

    /// The sites the planner reads, in the ledger's order of node names.
    pub fn sites(&self) -> Vec<Site<'_>> {
        self.nodes
            .iter()
            .map(|(node, usage, residents)| Site {
                node,
                usage,
                residents,
            })
            .collect()
    }

    /// How many holdings there are, over every node.
    pub fn holdings(&self) -> usize {
        self.nodes.iter().map(|(_, _, r)| r.len()).sum()
    }
}

/// One holding as a resident: gpu-share's reservation of a GPU; a DRA claim's allocation or a
/// reservation on its way (both unsettled: nothing here moves them); or a pod, which may move as
/// it says and the rules allow.
fn resident(key: &str, h: &Holding, rules: &Rules) -> Resident {
    let mobility = match h.pod.holder {
        Holder::Pod if matches!(h.demand.gpu, GpuDemand::ReservationPod { .. }) => {
            Mobility::Reservation
        }
        Holder::Pod => match mobility_of(
            h.pod.consent.as_deref(),
            &h.pod.namespace,
            h.pod.priority,
            rules.namespaces,
            rules.cooling,
        ) {
            Mobility::Movable(_) if (rules.unsettled)(&h.pod.uid) => {
                Mobility::Pinned(Pinned::Unsettled)
            }
            m => m,
        },
        Holder::Claim | Holder::StandIn | Holder::Promise => Mobility::Pinned(Pinned::Unsettled),
    };
    Resident {
        id: key.to_string(),
        key: format!("{}/{}", h.pod.namespace, h.pod.name),
        demand: h.demand.clone(),
        placement: h.placement.clone(),
        mobility,
    }
}

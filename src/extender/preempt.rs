//! `POST /scheduler/preempt`: per candidate node, the victims that really make room for the pod's
//! class ([`crate::ledger::plan_victims`]), a plain function over [`ExtenderState`] with no I/O,
//! and the axum handler around it.

use std::collections::BTreeMap;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;

use super::Context;
use super::handlers::{VerbError, begin, reply};
use super::state::ExtenderState;
use super::wire::{self, ExtenderPreemptionArgs, ExtenderPreemptionResult, MetaPod, MetaVictims};
use crate::ledger;

/// Preempt: keep, per candidate node, just the victims that make room for the pod's class. A pod
/// whose request cannot be read preempts nothing.
pub fn preempt(
    ext: &ExtenderState,
    args: ExtenderPreemptionArgs,
) -> Result<ExtenderPreemptionResult, VerbError> {
    if !ext.is_synced() {
        return Err(VerbError::NotSynced);
    }
    let pod = args
        .pod
        .as_ref()
        .ok_or(VerbError::BadRequest("request has no Pod"))?;
    let mut given: BTreeMap<String, (Vec<String>, i64)> = BTreeMap::new();
    if let Some(m) = &args.node_name_to_meta_victims {
        for (node, v) in m {
            let v = v.clone().unwrap_or_default();
            let uids = v
                .pods
                .unwrap_or_default()
                .into_iter()
                .flatten()
                .map(|p| p.uid)
                .collect();
            given.insert(node.clone(), (uids, v.num_pdb_violations));
        }
    } else if let Some(m) = &args.node_name_to_victims {
        for (node, v) in m {
            let Some(v) = v else { continue };
            let uids = v
                .pods
                .iter()
                .flatten()
                .flatten()
                .filter_map(|p| p.metadata.uid.clone())
                .collect();
            given.insert(node.clone(), (uids, v.num_pdb_violations));
        }
    }
    let meta = |uids: Vec<String>, pdb: i64| MetaVictims {
        pods: Some(uids.into_iter().map(|uid| Some(MetaPod { uid })).collect()),
        num_pdb_violations: pdb,
    };
    let demand = match ledger::demand_of_pod(pod) {
        Ok(d) => d,
        Err(e) => {
            tracing::info!(pod = %ledger::pod_key(pod), error = %e, "preempt: the pod's request cannot be read; no victims");
            return Ok(ExtenderPreemptionResult {
                node_name_to_meta_victims: Some(BTreeMap::new()),
            });
        }
    };
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let none = || {
        Ok(ExtenderPreemptionResult {
            node_name_to_meta_victims: Some(BTreeMap::new()),
        })
    };
    if let Some(d) = &demand {
        // kube-scheduler deletes victims asynchronously and may try the pod again before the
        // pod watch has shown those deletions here: the room is on its way.
        if ext.ledger().victims_leaving(&uid) {
            tracing::info!(pod = %ledger::pod_key(pod), "preempt: the victims of this pod's last preemption are still leaving; no more");
            return none();
        }
        // Or its cache saw them go before this ledger did, so its retry found no room, and it
        // asks again now that the ledger has: the room is there, and the next try takes it.
        if let Some(node) = ext.ledger().room_made(&uid, d) {
            tracing::info!(pod = %ledger::pod_key(pod), node = %node, "preempt: this pod's last preemption made room; no more victims");
            return none();
        }
    }
    let priority = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
    // Nodes a defragmentation plan holds for another pod take no other GPU pod until it ends:
    // victims there would make room this pod cannot use.
    let fences = ext.ledger().fences_now();
    let mut out = BTreeMap::new();
    let candidates = given.len();
    let mut victims = 0usize;
    for (node, (uids, pdb)) in given {
        let Some(demand) = &demand else {
            // Not a GPU pod: the scheduler's choice stands.
            if !uids.is_empty() {
                victims += uids.len();
                out.insert(node, meta(uids, pdb));
            }
            continue;
        };
        if fences.get(&node).is_some_and(|f| f.waiting != uid) {
            tracing::debug!(pod = %ledger::pod_key(pod), node = %node, "preempt: a defragmentation plan holds this node for another pod; no victims here");
            continue;
        }
        let planned = ext
            .ledger()
            .with_node(&node, |nl| {
                ledger::plan_victims(nl, demand, priority, &uids)
            })
            .flatten();
        match planned {
            Some(v) if !v.is_empty() => {
                tracing::debug!(pod = %ledger::pod_key(pod), node = %node, offered = uids.len(), kept = v.len(), "preempt: victims kept");
                victims += v.len();
                out.insert(node, meta(v, pdb));
            }
            _ => {
                tracing::debug!(pod = %ledger::pod_key(pod), node = %node, "preempt: no victim set on this node makes room for the pod's class")
            }
        }
    }
    tracing::info!(pod = %ledger::pod_key(pod), candidates, nodes = out.len(), victims, "preempt");
    if demand.is_some() && !uid.is_empty() {
        let given = out
            .iter()
            .flat_map(|(node, m): (&String, &MetaVictims)| {
                m.pods
                    .iter()
                    .flatten()
                    .flatten()
                    .map(move |p| (node.clone(), p.uid.clone()))
            })
            .collect();
        ext.note_victims(&uid, given);
    }
    Ok(ExtenderPreemptionResult {
        node_name_to_meta_victims: Some(out),
    })
}

pub async fn preempt_handler(State(state): State<Context>, body: Bytes) -> Response {
    let start = Instant::now();
    match begin(&state, "preempt", start, wire::parse_preemption(&body)) {
        Ok((ext, args)) => reply(&state, "preempt", start, preempt(ext, args)),
        Err(r) => r,
    }
}

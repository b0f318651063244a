//! The `gpu-share` policy's learnt workload in the extender: the demands seen, the target
//! decisions score against, and the background warm-up of every node's memo for a newer one.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::ledger::Ledger;
use crate::packing::frag::TargetWorkload;
use crate::packing::{OnlineWorkload, PackingPolicy, Scorer, Workload};
use crate::sync::lock;

/// The window (pods, each counted once) behind the fragmentation gauge.
pub const WORKLOAD_WINDOW: usize = 1000;

/// The online workload, the target workload last handed out, and the most recent demands
/// (the fragmentation gauge's window), each pod counted once.
#[derive(Debug)]
pub struct Online {
    pub seen: OnlineWorkload,
    /// What decisions score against.
    pub target: Option<Arc<TargetWorkload>>,
    /// A newer target, waiting for every node's memo to be filled for it.
    pub pending: Option<Arc<TargetWorkload>>,
    /// A thread is filling the memos.
    pub warming: bool,
    pub recent: Workload,
}

impl Default for Online {
    fn default() -> Self {
        Online {
            seen: OnlineWorkload::default(),
            target: None,
            pending: None,
            warming: false,
            recent: Workload::new(WORKLOAD_WINDOW),
        }
    }
}

/// From this many nodes on, a refreshed workload is used once every node's memo is filled for
/// it in the background.
pub const WARM_IN_BACKGROUND_NODES: usize = 1000;

/// Fills every node's memo for the pending target, then makes it the target; again while a
/// newer one arrived meanwhile.
pub(super) fn warm_memos(online: &Mutex<Online>, ledger: &Ledger, policy: PackingPolicy) {
    loop {
        let Some(t) = lock(online).pending.take() else {
            lock(online).warming = false;
            return;
        };
        let started = Instant::now();
        let scorer = Scorer::with_workload(policy, t.clone());
        let nodes = ledger.for_each_node(|nl| scorer.warm_memo(&nl.node, &nl.usage, &mut nl.memo));
        let mut o = lock(online);
        o.target = Some(t);
        if o.pending.is_none() {
            o.warming = false;
            drop(o);
            tracing::debug!(nodes, took = ?started.elapsed(), "scoring against the refreshed workload");
            return;
        }
    }
}

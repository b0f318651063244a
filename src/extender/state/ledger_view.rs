//! The ledger as the extender's readers see it ([`super::ExtenderState::ledger`]): every read,
//! and no verb that changes what it holds. Those are [`super::ExtenderState`]'s, so that a
//! change of the ledger goes through the state's verbs by construction, not by convention.
//!
//! The one thing a reader may write is a node's fragmentation memo, a cache of the scorer's sums
//! that scoring fills as it goes ([`LedgerView::with_nodes_scoring`]).

use std::collections::{BTreeMap, HashMap};

use crate::inventory::GpuNode;
use crate::ledger::{Holding, Ledger, NodeLedger, ObservedPod};
use crate::packing::{Demand, FragMemo, Usage};

/// A read-only view of the ledger.
#[derive(Clone, Copy)]
pub struct LedgerView<'a>(pub(super) &'a Ledger);

impl<'a> LedgerView<'a> {
    /// A view of `ledger` (the extender's is [`super::ExtenderState::ledger`]).
    pub fn new(ledger: &'a Ledger) -> Self {
        LedgerView(ledger)
    }

    /// How many node ledgers there are.
    pub fn node_count(&self) -> usize {
        self.0.node_count()
    }

    /// Every node's name, sorted.
    pub fn node_names(&self) -> Vec<String> {
        self.0.node_names()
    }

    /// Reads one node's ledger under its lock.
    pub fn with_node<R>(&self, name: &str, f: impl FnOnce(&NodeLedger) -> R) -> Option<R> {
        self.0.with_node(name, |nl| f(nl))
    }

    /// Reads each named node's ledger under its lock, spread over threads for the verbs that
    /// visit every node of a request ([`Ledger::with_nodes_par`]); `None` for names not in the
    /// inventory, in the names' order.
    pub fn with_nodes_par<R: Send>(
        &self,
        names: &[String],
        f: impl Fn(&NodeLedger) -> R + Sync,
    ) -> Vec<Option<R>> {
        self.0.with_nodes_par(names, |nl| f(nl))
    }

    /// [`LedgerView::with_nodes_par`] for scoring: each node's inventory and usage, and its
    /// fragmentation memo, which scoring fills.
    pub fn with_nodes_scoring<R: Send>(
        &self,
        names: &[String],
        f: impl Fn(&GpuNode, &Usage, &mut FragMemo) -> R + Sync,
    ) -> Vec<Option<R>> {
        self.0
            .with_nodes_par(names, |nl| f(&nl.node, &nl.usage, &mut nl.memo))
    }

    /// Reads every node's ledger, one at a time; returns how many it read.
    pub fn for_each_node(&self, mut f: impl FnMut(&NodeLedger)) -> usize {
        self.0.for_each_node(|nl| f(nl))
    }

    /// Every holding as the API would show it ([`Ledger::observed`]).
    pub fn observed(&self) -> Vec<ObservedPod> {
        self.0.observed()
    }

    /// A copy of every node ledger, by name (each consistent in itself).
    pub fn snapshot(&self) -> BTreeMap<String, NodeLedger> {
        self.0.snapshot()
    }

    /// Whether a DRA claim stands for pod `uid`.
    pub fn claimed(&self, uid: &str) -> bool {
        self.0.claimed(uid)
    }

    /// The node a pod holds something on.
    pub fn node_of(&self, uid: &str) -> Option<String> {
        self.0.node_of(uid)
    }

    /// How many pods of spread controller `controller` each node holds ([`Ledger::spread_counts`]).
    pub fn spread_counts(&self, controller: &str) -> HashMap<String, u32> {
        self.0.spread_counts(controller)
    }

    /// Why shares in per-GPU form are held off `node` now, if they are.
    pub fn held_off(&self, node: &str) -> Option<String> {
        self.0.held_off(node)
    }

    /// The nodes defragmentation plans hold for their waiting pods now ([`Ledger::fence`]).
    pub fn fences_now(&self) -> HashMap<String, crate::ledger::Fence> {
        self.0.fences_now()
    }

    /// The nodes shares in per-GPU form are held off now, and why.
    pub fn held_off_now(&self) -> HashMap<String, String> {
        self.0.held_off_now()
    }

    /// Whether preemptor `uid`'s victims are still held ([`Ledger::victims_leaving`]).
    pub fn victims_leaving(&self, uid: &str) -> bool {
        self.0.victims_leaving(uid)
    }

    /// The node whose victims' leaving made room for preemptor `uid` ([`Ledger::room_made`]).
    pub fn room_made(&self, uid: &str, demand: &Demand) -> Option<String> {
        self.0.room_made(uid, demand)
    }

    /// What pod `uid` holds, if anything.
    pub fn holding(&self, uid: &str) -> Option<Holding> {
        self.0.holding(uid)
    }

    /// Pods waiting for their node to appear in the inventory.
    pub fn unplaced(&self) -> usize {
        self.0.unplaced()
    }

    /// How many pods the ledger holds (placed or not).
    pub fn uids_len(&self) -> usize {
        self.0.uids_len()
    }

    /// The key of every holding but DRA claims' ([`Ledger::uids`]).
    pub fn uids(&self) -> Vec<String> {
        self.0.uids()
    }
}

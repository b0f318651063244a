//! The cluster's ledger: one [`NodeLedger`] per node behind its own lock, and a listener called on
//! every release.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};

use crate::inventory::GpuNode;
use crate::packing::{Demand, Placement, Reason, Scorer};
use crate::sync::lock;

use super::holder::*;
use super::index::Index;
use super::node::*;
use super::pod_read::*;

type ReleaseListener = Box<dyn Fn(&Holding) + Send + Sync>;

/// The fewest nodes one thread takes in [`Ledger::with_nodes_par`]: small requests stay on the
/// calling thread, where handing them out would cost more than it saves.
pub const PARALLEL_CHUNK: usize = 512;

/// How long a preemptor's victims are taken to be on their way out (the ledger sees a deletion
/// within a watch event; an API that refused it is retried after this).
pub const VICTIMS_LEAVING: std::time::Duration = std::time::Duration::from_secs(10);

/// How many times [`Ledger::hold`] places a pod under the node's lock alone before it places
/// it under the index's too: each retry means another change on that node was recorded first.
pub const PLACE_TRIES: u32 = 4;

/// A node held for the pod a defragmentation plan makes room for ([`Ledger::fence`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub until: std::time::Instant,
    /// The waiting pod's UID.
    pub waiting: String,
    /// Why, in words (`for ns/name: moving ...`).
    pub why: String,
}

/// A victim a preemptor was given: `(node, victim UID)`.
pub type NodeVictim = (String, String);

/// The cluster's ledger: one [`NodeLedger`] per node behind its own lock, and an index of which
/// node holds each pod behind another. A placement runs under its node's lock alone, so binds to
/// different nodes place in parallel; the index's lock is taken to record it, and no lock is held
/// across two nodes' placements ([`Ledger::hold`]). The extender, `gpu-share status` and the
/// tests share this one type.
#[derive(Default)]
pub struct Ledger {
    /// By name, as prioritize looks up every candidate node of a decision.
    nodes: RwLock<HashMap<String, Arc<Mutex<NodeLedger>>, foldhash::quality::RandomState>>,
    /// Which node holds each placed holding ([`Index`]).
    index: Mutex<Index>,
    /// Pods bound to nodes not (yet) in the inventory.
    unplaced: Mutex<HashMap<String, ObservedPod>>,
    on_release: RwLock<Option<ReleaseListener>>,
    /// Nodes where a reservation failed a moment ago: until when, and why. Shares in per-GPU
    /// form are not placed there meanwhile ([`Reason::ReservationFailed`]).
    held_off: Mutex<HashMap<String, (std::time::Instant, String)>>,
    /// Nodes where a defragmentation plan is making room for a waiting pod: until when, the
    /// waiting pod's UID, and the plan in words. Only that pod (and what holds for it: a
    /// reservation's stand-in, the plan's promises) is placed there meanwhile
    /// ([`Reason::HeldForPlan`]).
    fenced: Mutex<HashMap<String, Fence>>,
    /// The victims each preemptor (by UID) was last given, and when.
    preempted: Mutex<HashMap<String, (std::time::Instant, Vec<NodeVictim>)>>,
    /// Pods a DRA claim stands for (by UID), and the claim's node: the claim holds their
    /// devices, so they hold nothing themselves ([`Ledger::sync_claims`]).
    claimed: Mutex<HashMap<String, String>>,
}

impl Ledger {
    pub fn new() -> Self {
        Ledger::default()
    }

    /// Builds a ledger from nodes and pods as the API lists them.
    pub fn rebuild(nodes: impl IntoIterator<Item = GpuNode>, pods: &[ObservedPod]) -> Self {
        let l = Ledger::new();
        for n in nodes {
            l.upsert_node(n);
        }
        for p in pods {
            l.record(p);
        }
        l
    }

    /// Calls `f` with every holding released from now on (the extender's requeue).
    pub fn on_release(&self, f: impl Fn(&Holding) + Send + Sync + 'static) {
        *crate::sync::write(&self.on_release) = Some(Box::new(f));
    }

    fn node(&self, name: &str) -> Option<Arc<Mutex<NodeLedger>>> {
        crate::sync::read(&self.nodes).get(name).cloned()
    }

    /// How many node ledgers there are.
    pub fn node_count(&self) -> usize {
        crate::sync::read(&self.nodes).len()
    }

    /// Every node's name, sorted.
    pub fn node_names(&self) -> Vec<String> {
        let mut names: Vec<String> = crate::sync::read(&self.nodes).keys().cloned().collect();
        names.sort_unstable();
        names
    }

    /// Runs `f` on one node's ledger under its lock.
    pub fn with_node<R>(&self, name: &str, f: impl FnOnce(&mut NodeLedger) -> R) -> Option<R> {
        let n = self.node(name)?;
        let mut g = lock(&n);
        Some(f(&mut g))
    }

    /// Runs `f` on each named node's ledger (under that node's lock, one at a time), in order;
    /// `None` for names not in the inventory. Looks the nodes up under one read of the map.
    pub fn with_nodes<R>(
        &self,
        names: &[String],
        mut f: impl FnMut(&mut NodeLedger) -> R,
    ) -> Vec<Option<R>> {
        let map = crate::sync::read(&self.nodes);
        names
            .iter()
            .map(|n| map.get(n.as_str()).map(|m| f(&mut lock(m))))
            .collect()
    }

    /// [`Ledger::with_nodes`] spread over rayon's threads, in chunks of [`PARALLEL_CHUNK`]
    /// nodes, for the verbs that visit every node of a request. Each node is still under its own
    /// lock while `f` runs, and the answers keep the names' order.
    pub fn with_nodes_par<R: Send>(
        &self,
        names: &[String],
        f: impl Fn(&mut NodeLedger) -> R + Sync,
    ) -> Vec<Option<R>> {
        use rayon::prelude::*;
        if names.len() < 2 * PARALLEL_CHUNK || rayon::current_num_threads() < 2 {
            return self.with_nodes(names, f);
        }
        let map = crate::sync::read(&self.nodes);
        names
            .par_iter()
            .with_min_len(PARALLEL_CHUNK)
            .map(|n| map.get(n.as_str()).map(|m| f(&mut lock(m))))
            .collect()
    }

    /// Runs `f` on every node ledger, one at a time (the node map is not held meanwhile, so
    /// nodes can come and go); returns how many it visited.
    pub fn for_each_node(&self, mut f: impl FnMut(&mut NodeLedger)) -> usize {
        let handles: Vec<_> = crate::sync::read(&self.nodes).values().cloned().collect();
        for h in &handles {
            f(&mut lock(h));
        }
        handles.len()
    }

    /// Every holding as the API would show it (the pod, its node and its bind annotation): what a
    /// restarted extender rebuilds from.
    pub fn observed(&self) -> Vec<ObservedPod> {
        self.snapshot()
            .values()
            .flat_map(|nl| nl.holdings.values())
            .map(|h| ObservedPod {
                pod: h.pod.clone(),
                node: h.node.clone(),
                demand: h.demand.clone(),
                gpus: Some(h.placement.gpus.clone()),
            })
            .collect()
    }

    /// A copy of every node ledger, by name (each consistent in itself).
    pub fn snapshot(&self) -> BTreeMap<String, NodeLedger> {
        let handles: Vec<_> = crate::sync::read(&self.nodes)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        handles
            .into_iter()
            .map(|(k, n)| (k, lock(&n).clone()))
            .collect()
    }

    pub fn upsert_node(&self, node: GpuNode) {
        let name = node.name.clone();
        if let Some(n) = self.node(&name) {
            lock(&n).set_node(node);
            return;
        }
        crate::sync::write(&self.nodes)
            .entry(name.clone())
            .or_insert_with(|| Arc::new(Mutex::new(NodeLedger::new(node))));
        let waiting: Vec<ObservedPod> = {
            let mut u = lock(&self.unplaced);
            let uids: Vec<String> = u
                .iter()
                .filter(|(_, o)| o.node == name)
                .map(|(k, _)| k.clone())
                .collect();
            uids.iter().filter_map(|k| u.remove(k)).collect()
        };
        for o in waiting {
            self.record(&o);
        }
    }

    /// Removes a node; its pods wait (unplaced) until it comes back.
    pub fn remove_node(&self, name: &str) {
        // Most calls are for nodes without GPUs, never held: no write lock for those.
        if self.node(name).is_none() {
            return;
        }
        let removed = crate::sync::write(&self.nodes).remove(name);
        let Some(n) = removed else { return };
        let holdings: Vec<Holding> = lock(&n).holdings.values().map(|h| (**h).clone()).collect();
        let mut index = lock(&self.index);
        let mut unplaced = lock(&self.unplaced);
        for h in holdings {
            index.remove(&h.pod.uid);
            unplaced.insert(
                h.pod.uid.clone(),
                ObservedPod {
                    pod: h.pod,
                    node: h.node,
                    demand: h.demand,
                    gpus: Some(h.placement.gpus),
                },
            );
        }
    }

    /// Makes the DRA claims' holdings on `node` exactly `holdings` ([`crate::dra::DraView::holdings`]),
    /// and the pods `covered` (those the claims there stand for) hold nothing of their own there:
    /// a pod bound to a DRA node holds by its demand only until its claim is seen. Returns how
    /// many holdings changed.
    pub fn sync_claims(
        &self,
        node: &str,
        holdings: &[ObservedPod],
        covered: &std::collections::BTreeSet<String>,
    ) -> usize {
        {
            let mut claimed = lock(&self.claimed);
            claimed.retain(|uid, at| at != node || covered.contains(uid));
            for uid in covered {
                claimed.insert(uid.clone(), node.to_string());
            }
        }
        let mut changed = 0;
        for uid in covered {
            if self.node_of(uid).as_deref() == Some(node) && self.release(uid).is_some() {
                changed += 1;
            }
        }
        let want: std::collections::BTreeMap<&str, &ObservedPod> =
            holdings.iter().map(|o| (o.pod.uid.as_str(), o)).collect();
        let held: Vec<(String, Holding)> = self
            .with_node(node, |nl| {
                nl.holdings
                    .iter()
                    .filter(|(_, h)| h.pod.holder == Holder::Claim)
                    .map(|(u, h)| (u.clone(), (**h).clone()))
                    .collect()
            })
            .unwrap_or_default();
        for (uid, h) in &held {
            let same = want.get(uid.as_str()).is_some_and(|o| {
                o.demand == h.demand && o.gpus.as_ref().is_none_or(|g| *g == h.placement.gpus)
            });
            if !same {
                self.release(uid);
                changed += 1;
            }
        }
        lock(&self.unplaced).retain(|uid, o| {
            !(o.pod.holder == Holder::Claim && o.node == node && !want.contains_key(uid.as_str()))
        });
        for o in holdings {
            if self.node_of(&o.pod.uid).is_none() {
                self.record(o);
                changed += 1;
            }
        }
        changed
    }

    /// Forgets the DRA claims' holdings and covered pods on a node that is no longer one
    /// (its slices gone, or the node deleted).
    pub fn drop_claims(&self, node: &str) {
        self.sync_claims(node, &[], &Default::default());
    }

    /// Whether a DRA claim stands for pod `uid`.
    pub fn claimed(&self, uid: &str) -> bool {
        lock(&self.claimed).contains_key(uid)
    }

    /// The node a pod holds something on.
    pub fn node_of(&self, uid: &str) -> Option<String> {
        lock(&self.index).get(uid).map(|(node, _)| node.to_string())
    }

    /// How many pods of spread controller `controller` ([`spread_controller`]) each node holds;
    /// nodes holding none are left out.
    pub fn spread_counts(&self, controller: &str) -> HashMap<String, u32> {
        lock(&self.index).spread_counts(controller)
    }

    /// Records what the API says a pod holds (nothing, for a pod a DRA claim stands for).
    ///
    /// Its placement is planned under the node's lock alone, then recorded under the index's
    /// (the lock order: index, then a node) while nothing changed on the node meanwhile; if
    /// something did, it is planned again there. Two updates of one pod cannot interleave and
    /// leave a holding the index does not point to.
    pub fn record(&self, o: &ObservedPod) {
        if o.pod.holder != Holder::Claim && lock(&self.claimed).contains_key(&o.pod.uid) {
            return;
        }
        let n = self.node(&o.node);
        let planned = n.as_ref().and_then(|n| lock(n).plan_record(o));
        let moved = {
            let mut index = lock(&self.index);
            let moved = match index.get(&o.pod.uid) {
                Some((prev, _)) if prev != o.node => self.take(&mut index, &o.pod.uid),
                _ => None,
            };
            match self.node(&o.node) {
                Some(now) => {
                    let planned =
                        planned.filter(|_| n.as_ref().is_some_and(|n| Arc::ptr_eq(n, &now)));
                    for stand_in in lock(&now).record_planned(o, planned) {
                        index.remove(&stand_in);
                    }
                    index.insert(&o.node, &o.pod);
                }
                None => {
                    lock(&self.unplaced).insert(o.pod.uid.clone(), o.clone());
                }
            }
            moved
        };
        if let Some(h) = moved {
            self.notify(&h);
        }
    }

    /// Checks the fit on `node` and records the holding (bind).
    ///
    /// Binds to different nodes run in parallel: the packing places the pod under the node's lock
    /// alone, and the placement is then recorded under the index's lock (and the node's again),
    /// if nothing changed on the node meanwhile. If something did, it is placed again, up to
    /// [`PLACE_TRIES`] times; after that, once more under both locks. The index's lock is held
    /// for bookkeeping only: never across a placement, in the common case.
    pub fn hold(
        &self,
        scorer: &Scorer,
        node: &str,
        pod: PodRef,
        demand: Demand,
    ) -> Result<Placement, Reason> {
        let n = self.node(node).ok_or(Reason::UnknownNode)?;
        if lock(&self.claimed)
            .get(&pod.uid)
            .is_some_and(|at| at == node)
        {
            // Its DRA claim, allocated before bind, holds its devices already.
            return Ok(Placement::default());
        }
        if demand.pointed()
            && self.node_of(&pod.uid).is_none_or(|at| at != node)
            && let Some(why) = self.held_off(node)
        {
            return Err(Reason::ReservationFailed { why });
        }
        if pod.holder == Holder::Pod
            && let Some(fence) = self.fence_of(node)
            && fence.waiting != pod.uid
            && self.node_of(&pod.uid).is_none_or(|at| at != node)
        {
            return Err(Reason::HeldForPlan { why: fence.why });
        }
        let uid = pod.uid.clone();
        // Where the placement is recorded: the pod as it goes into the node's ledger.
        let indexed = pod.clone();
        let mut tries = 0;
        loop {
            tries += 1;
            // `None`: held there already, or placed too many times; placed under both locks then.
            let planned = if tries <= PLACE_TRIES {
                let mut nl = lock(&n);
                if nl.holdings.contains_key(&uid) {
                    None
                } else {
                    Some((nl.generation(), nl.plan(scorer, &demand)?))
                }
            } else {
                None
            };
            let mut index = lock(&self.index);
            let moved = match index.get(&uid) {
                Some((prev, _)) if prev != node => self.take(&mut index, &uid),
                _ => None,
            };
            let mut nl = lock(&n);
            let result = if let Some(h) = nl.holdings.get(&uid) {
                Ok(h.placement.clone())
            } else {
                match planned {
                    Some((generation, placement)) if generation == nl.generation() => {
                        Ok(nl.commit(pod, demand, placement))
                    }
                    Some(_) => {
                        // The node changed between the placement and its record: place again.
                        drop((nl, index));
                        if let Some(h) = moved {
                            self.notify(&h);
                        }
                        continue;
                    }
                    None => nl.hold(scorer, pod, demand),
                }
            };
            drop(nl);
            if result.is_ok() {
                index.insert(node, &indexed);
            }
            drop(index);
            if let Some(h) = moved {
                self.notify(&h);
            }
            return result;
        }
    }

    /// Holds shares in per-GPU form off `node` until `until`: a reservation there failed (why).
    pub fn hold_off(&self, node: &str, until: std::time::Instant, why: String) {
        lock(&self.held_off).insert(node.to_string(), (until, why));
    }

    /// Why shares in per-GPU form are held off `node` now, if they are.
    pub fn held_off(&self, node: &str) -> Option<String> {
        let mut held = lock(&self.held_off);
        match held.get(node) {
            Some((until, why)) if *until > std::time::Instant::now() => Some(why.clone()),
            Some(_) => {
                held.remove(node);
                None
            }
            None => None,
        }
    }

    /// Holds `node` for pod `waiting` until `until` (a defragmentation plan is making room there
    /// for it): gpu-share places no other pod there meanwhile (filter refuses them, [`Ledger::hold`]
    /// too; a pod the API shows bound is recorded as ever). The plan's own holds (promises, and a
    /// reservation's stand-in for the waiting pod's share) are not pods, and pass.
    pub fn fence(&self, node: &str, waiting: &str, until: std::time::Instant, why: String) {
        lock(&self.fenced).insert(
            node.to_string(),
            Fence {
                until,
                waiting: waiting.to_string(),
                why,
            },
        );
    }

    /// Lifts the fence `waiting`'s plan put on `node`, if it is still that plan's.
    pub fn unfence(&self, node: &str, waiting: &str) {
        let mut fenced = lock(&self.fenced);
        if fenced.get(node).is_some_and(|f| f.waiting == waiting) {
            fenced.remove(node);
        }
    }

    /// `node`'s fence, if one holds now (one past its time is lifted).
    pub fn fence_of(&self, node: &str) -> Option<Fence> {
        let mut fenced = lock(&self.fenced);
        match fenced.get(node) {
            Some(f) if f.until > std::time::Instant::now() => Some(f.clone()),
            Some(_) => {
                fenced.remove(node);
                None
            }
            None => None,
        }
    }

    /// Every fence that holds now, by node (usually none: one lookup for a whole filter).
    pub fn fences_now(&self) -> HashMap<String, Fence> {
        let now = std::time::Instant::now();
        let mut fenced = lock(&self.fenced);
        fenced.retain(|_, f| f.until > now);
        fenced.clone()
    }

    /// Places pod `pod` on `node` in the room promise `promise` holds there for it: under the
    /// node's lock, the promise is released and the pod placed; should the pod not fit even so,
    /// the promise stays as it was and the reason is returned. A promise no longer held (its
    /// plan ended) is an ordinary hold. The placement is made under the index's lock too: a
    /// replacement's bind is rare, and the promise must not be seen gone before the pod is in.
    pub fn redeem(
        &self,
        scorer: &Scorer,
        node: &str,
        promise: &str,
        pod: PodRef,
        demand: Demand,
    ) -> Result<Placement, Reason> {
        let n = self.node(node).ok_or(Reason::UnknownNode)?;
        let mut index = lock(&self.index);
        if index.get(promise).is_none_or(|(at, _)| at != node) || index.get(&pod.uid).is_some() {
            drop(index);
            return self.hold(scorer, node, pod, demand);
        }
        let mut nl = lock(&n);
        let Some(kept) = nl.release(promise) else {
            drop((nl, index));
            return self.hold(scorer, node, pod, demand);
        };
        match nl.plan(scorer, &demand) {
            Ok(placement) => {
                // The room passes from the promise to the pod: nothing was freed, so the release
                // listener is not told.
                let indexed = pod.clone();
                let placed = nl.commit(pod, demand, placement);
                index.remove(promise);
                index.insert(node, &indexed);
                Ok(placed)
            }
            Err(why) => {
                nl.commit(
                    kept.pod.clone(),
                    kept.demand.clone(),
                    kept.placement.clone(),
                );
                Err(why)
            }
        }
    }

    /// Re-points the share in per-GPU form `uid` at one of the GPUs `to` of its node
    /// ([`NodeLedger::repoint`]).
    pub fn repoint(&self, scorer: &Scorer, uid: &str, to: &[u32]) -> Option<Vec<(u32, u32)>> {
        let node = self.node_of(uid)?;
        self.with_node(&node, |nl| nl.repoint(scorer, uid, to))
            .flatten()
    }

    /// The nodes shares in per-GPU form are held off now, and why (usually none: one lookup
    /// for a whole filter instead of one per node).
    pub fn held_off_now(&self) -> HashMap<String, String> {
        let now = std::time::Instant::now();
        let mut held = lock(&self.held_off);
        held.retain(|_, (until, _)| *until > now);
        held.iter()
            .map(|(node, (_, why))| (node.clone(), why.clone()))
            .collect()
    }

    /// Records the victims preemptor `uid` was given on every candidate node, as `(node, victim
    /// UID)`.
    pub fn note_victims(&self, uid: &str, victims: Vec<NodeVictim>) {
        let now = std::time::Instant::now();
        let mut p = lock(&self.preempted);
        p.retain(|_, (at, _)| now.duration_since(*at) < VICTIMS_LEAVING);
        p.insert(uid.to_string(), (now, victims));
    }

    /// The victims preemptor `uid` was given less than [`VICTIMS_LEAVING`] ago.
    fn noted_victims(&self, uid: &str) -> Option<Vec<NodeVictim>> {
        let (at, victims) = lock(&self.preempted).get(uid).cloned()?;
        (at.elapsed() < VICTIMS_LEAVING && !victims.is_empty()).then_some(victims)
    }

    /// Whether the victims preemptor `uid` was given less than [`VICTIMS_LEAVING`] ago are all
    /// still held: the ledger has not yet seen the deletions kube-scheduler made on the node it
    /// chose (its victims there gone, the others kept). Preempting again then would evict more
    /// pods for the same room.
    pub fn victims_leaving(&self, uid: &str) -> bool {
        self.noted_victims(uid)
            .is_some_and(|v| v.iter().all(|(_, victim)| self.node_of(victim).is_some()))
    }

    /// A node where preemptor `uid`'s last preemption (less than [`VICTIMS_LEAVING`] ago) made
    /// room: some of its victims there are gone, and `demand` fits now. kube-scheduler may try
    /// the pod again, find no room (its cache saw the victims go before this ledger did), and
    /// ask for victims again once this ledger has seen them go: evicting more then would empty
    /// a second node for the room the first already has.
    pub fn room_made(&self, uid: &str, demand: &Demand) -> Option<String> {
        let victims = self.noted_victims(uid)?;
        let mut nodes: Vec<&String> = victims
            .iter()
            .filter(|(_, victim)| self.node_of(victim).is_none())
            .map(|(node, _)| node)
            .collect();
        nodes.sort();
        nodes.dedup();
        nodes.into_iter().find_map(|node| {
            self.with_node(node, |nl| {
                crate::packing::fit(&nl.node, &nl.usage, demand).is_ok()
            })
            .unwrap_or(false)
            .then(|| node.clone())
        })
    }

    /// Releases a pod's holding (and tells the release listener).
    pub fn release(&self, uid: &str) -> Option<Holding> {
        lock(&self.unplaced).remove(uid);
        let h = {
            let mut index = lock(&self.index);
            self.take(&mut index, uid)?
        };
        self.notify(&h);
        Some(h)
    }

    /// Removes a holding from the index (held by the caller) and from its node.
    fn take(&self, index: &mut Index, uid: &str) -> Option<Holding> {
        let (node, _) = index.remove(uid)?;
        let n = self.node(&node)?;
        lock(&n).release(uid)
    }

    fn notify(&self, h: &Holding) {
        if let Some(f) = crate::sync::read(&self.on_release).as_ref() {
            f(h);
        }
    }

    pub fn holding(&self, uid: &str) -> Option<Holding> {
        let node = self.node_of(uid)?;
        self.with_node(&node, |nl| nl.holdings.get(uid).map(|h| (**h).clone()))
            .flatten()
    }

    /// Pods waiting for their node to appear in the inventory.
    pub fn unplaced(&self) -> usize {
        lock(&self.unplaced).len()
    }

    /// How many pods the ledger holds (placed or not).
    pub fn uids_len(&self) -> usize {
        lock(&self.index).len() + lock(&self.unplaced).len()
    }

    /// The key of every holding (placed or not) but DRA claims' ([`Ledger::sync_claims`] keeps
    /// those) and defragmentation's promises (their plan's controller does): pods' UIDs, and stand-ins' keys, which lapse with their assumption.
    pub fn uids(&self) -> Vec<String> {
        let mut v: Vec<String> = lock(&self.index)
            .keys()
            .filter(|(_, holder)| !matches!(holder, Holder::Claim | Holder::Promise))
            .map(|(u, _)| u.clone())
            .collect();
        v.extend(lock(&self.unplaced).keys().cloned());
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;
    use crate::inventory::Sharing;
    use crate::packing::{GpuDemand, PackingPolicy};

    fn pod(uid: &str) -> PodRef {
        PodRef::new(uid, "ml", uid)
    }

    fn share(milli: u32) -> Demand {
        Demand::gpu(GpuDemand::Timeslice {
            milli,
            memory_mib: None,
        })
    }

    fn ledger(nodes: usize) -> Ledger {
        let l = Ledger::new();
        for i in 0..nodes {
            l.upsert_node(GpuNode::shared(
                &format!("n{i}"),
                "NVIDIA-A100-SXM4-80GB",
                2,
                81920,
                Sharing::TimeSlicing { replicas: 4 },
            ));
        }
        l
    }

    /// A bind that waits for a busy node holds no lock another node's bind needs: the index's
    /// lock is not taken until the placement is made. (Before, the waiting bind held the index's
    /// lock while it waited, and every bind to every other node waited behind it.)
    #[test]
    fn a_bind_waiting_for_a_busy_node_holds_up_no_other_node() {
        let l = Arc::new(ledger(2));
        let scorer = Arc::new(Scorer::new(PackingPolicy::Binpack));
        let (locked, is_locked) = mpsc::channel();
        let (free, freed) = mpsc::channel::<()>();
        let busy = {
            let l = l.clone();
            std::thread::spawn(move || {
                l.with_node("n0", |_| {
                    locked.send(()).unwrap();
                    freed.recv().unwrap();
                })
            })
        };
        is_locked.recv().unwrap();
        let waiting = {
            let (l, scorer) = (l.clone(), scorer.clone());
            std::thread::spawn(move || l.hold(&scorer, "n0", pod("a"), share(250)))
        };
        // Long enough for the waiting bind to reach n0's lock; had it not yet, the bind below
        // would pass on the old code too, never fail on this one.
        std::thread::sleep(Duration::from_millis(100));
        let (done, is_done) = mpsc::channel();
        let other = {
            let (l, scorer) = (l.clone(), scorer.clone());
            std::thread::spawn(move || {
                done.send(l.hold(&scorer, "n1", pod("b"), share(250)))
                    .unwrap()
            })
        };
        let answer = is_done.recv_timeout(Duration::from_secs(10));
        free.send(()).unwrap();
        assert!(
            matches!(answer, Ok(Ok(_))),
            "a bind to n1 waited for n0: {answer:?}"
        );
        busy.join().unwrap();
        other.join().unwrap();
        assert!(waiting.join().unwrap().is_ok());
        assert_eq!(l.node_of("a").as_deref(), Some("n0"));
        assert_eq!(l.node_of("b").as_deref(), Some("n1"));
    }

    /// Binds from many threads, some of one pod to two nodes at once, and the watch's records
    /// and releases beside them: each node ends within capacity, every holding is where the
    /// index points, and every index entry has its holding.
    #[test]
    fn binds_in_parallel_keep_the_index_and_the_nodes_agreed() {
        let l = Arc::new(ledger(4));
        let scorer = Arc::new(Scorer::new(PackingPolicy::Binpack));
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let (l, scorer) = (l.clone(), scorer.clone());
                std::thread::spawn(move || {
                    for i in 0..400 {
                        let uid = format!("p{}", (t * 37 + i * 11) % 97);
                        let node = format!("n{}", (t + i) % 4);
                        match i % 5 {
                            0 => {
                                l.release(&uid);
                            }
                            1 => l.record(&ObservedPod {
                                pod: pod(&uid),
                                node,
                                demand: share(250),
                                gpus: None,
                            }),
                            _ => {
                                let _ = l.hold(&scorer, &node, pod(&uid), share(250));
                            }
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let index = lock(&l.index).clone();
        let mut held = 0;
        l.for_each_node(|nl| {
            for uid in nl.holdings.keys() {
                assert_eq!(
                    index.get(uid).map(|(n, _)| n),
                    Some(nl.node.name.as_str()),
                    "{uid} held on {} but indexed elsewhere",
                    nl.node.name
                );
                held += 1;
            }
        });
        assert_eq!(held, index.len(), "an index entry without its holding");
    }
}

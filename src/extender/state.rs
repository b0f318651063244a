//! The extender's live state: the ledger, one `NodeLedger` per node behind its own lock (binds to
//! one node are serialized, binds to different nodes place in parallel and meet only to record the
//! holding, [`Ledger::hold`]; no lock is held across I/O); the nodes and where each pod's bind
//! stands, one entry each ([`crate::cache`]: assumed until the API shows it, the lapse freeing
//! it; in doubt; changed lately; read in filter or prioritize and kept for bind; found no room,
//! for the requeuer) and the recent workload.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;

use super::online::warm_memos;
pub use super::online::{Online, WARM_IN_BACKGROUND_NODES, WORKLOAD_WINDOW};
use crate::cache::{NodeFacts, Nodes, Pods};
use crate::ledger::Ledger;
use crate::packing::{Demand, Homes, PackingPolicy, Scorer};
use crate::sync::lock;

/// How long a bound allocation may stay unseen in the API before it frees itself.
pub const DEFAULT_ASSUME_TTL: Duration = Duration::from_secs(120);
/// How long a watch change shields a pod or node from a reconcile's older list (longer than
/// any list takes).
pub const TOUCHED_TTL: Duration = Duration::from_secs(600);

pub use super::nudge::Released;
pub use super::pending::{PendingClass, UNSCHEDULED_CAP, Unscheduled, unscheduled_of};
pub use crate::cache::NoRoom;

pub mod flights;
pub mod in_flight;
pub mod ledger_view;

pub use ledger_view::LedgerView;

/// How the extender learns about nodes and binds pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `--dev`: nodes from requests or `--nodes`, bind records in memory.
    Dev,
    /// Watches nodes and pods, binds through the API.
    Cluster,
}

pub use crate::cache::pod::Assumed;

/// The extender's state. Its fields are its own: filter, prioritize, bind and the API's events
/// change it through the verbs below (remember a pod, mark one waiting, bind as a
/// [`in_flight::Binding`], and in `extender::sync` apply a watch event or a reconcile).
pub struct ExtenderState {
    mode: Mode,
    ledger: Arc<Ledger>,
    /// What is known of each pod beyond its holding ([`Pods`]): as filter or prioritize read
    /// it (for bind), whether filter found it no room (for the requeuer, [`super::nudge`]), its
    /// bind assumed (its lapse releases the holding) or in doubt, its last change by the watch,
    /// whether it waits for a node (from the pod watch, or in `--dev` from filter) and whether
    /// its limits contradict its request (from filter and the pod watch).
    pods: Mutex<Pods>,
    /// The `gpu-share` policy's workload estimate: every pod's demand, once, when first seen.
    online: Arc<Mutex<Online>>,
    /// The caches have synced (always true in `--dev`).
    synced: AtomicBool,
    /// When the watch last changed a node, by name: a reconcile that works from an older list
    /// leaves it alone (a pod's is in its entry). Each reconcile forgets what is older than its
    /// list (a later list is newer still).
    nodes_touched: Mutex<std::collections::HashMap<String, Instant>>,
    /// Every node the API shows (in `--dev`, the nodes requests and `--nodes` give), one entry
    /// each; the ledger keeps the GPU nodes' inventories.
    nodes: RwLock<Nodes>,
    /// Why pods kube-scheduler refused without asking gpu-share wait (events on them).
    explainer: super::explain::Explainer,
    /// The resource sets already warned about as bound without the extender (once each).
    bypassed: Mutex<std::collections::BTreeSet<Vec<String>>>,
    /// The reservation pods, as the reservation controller's watch sees them.
    pub reservations: crate::cluster::reservation_api::Seen,
    /// Defragmentation's latest plan for each waiting pod, as its controller posts them.
    pub plans: super::defrag_controller::board::Board,
    /// Defragmentation's plans under way ([`flights`]).
    flights: Mutex<Vec<crate::defrag::flight::Flight>>,
    /// NVIDIA's DRA driver's slices and the claims allocated its devices ([`super::dra`]).
    dra: Mutex<crate::dra::DraView>,
}

impl ExtenderState {
    pub fn new(mode: Mode, assume_ttl: Duration) -> Self {
        ExtenderState {
            mode,
            ledger: Arc::new(Ledger::new()),
            pods: Mutex::new(Pods::new(assume_ttl)),
            online: Arc::new(Mutex::new(Online::default())),
            synced: AtomicBool::new(mode == Mode::Dev),
            nodes_touched: Mutex::new(std::collections::HashMap::new()),
            nodes: RwLock::new(Nodes::default()),
            explainer: super::explain::Explainer::default(),
            reservations: Default::default(),
            plans: Default::default(),
            flights: Mutex::new(Vec::new()),
            bypassed: Mutex::new(std::collections::BTreeSet::new()),
            dra: Mutex::new(crate::dra::DraView::default()),
        }
    }

    /// The DRA side of the cluster as the watches show it.
    pub fn dra(&self) -> std::sync::MutexGuard<'_, crate::dra::DraView> {
        lock(&self.dra)
    }

    /// Node labels and the pods waiting to be explained ([`super::explain`]).
    pub fn explainer(&self) -> &super::explain::Explainer {
        &self.explainer
    }

    /// Records whether pod `uid`'s request annotation is contradicted by its limits.
    pub fn note_contradicted(&self, uid: &str, contradicted: bool) {
        lock(&self.pods).note_contradicted(uid, contradicted);
    }

    /// How many pods known now have a request annotation their limits contradict.
    pub fn contradicted_pods(&self) -> usize {
        lock(&self.pods).contradicted()
    }

    /// Counts a gpu-share pod as waiting for a node (keeps the earlier `since` of a pod already
    /// counted, and its last reason when this one gives none).
    pub fn note_unscheduled(&self, uid: &str, pending: Unscheduled) {
        lock(&self.pods).note_unscheduled(uid, pending);
    }

    /// The gpu-share pods waiting for a node, longest waiting first.
    pub fn pending_pods(&self) -> Vec<Unscheduled> {
        let mut out: Vec<Unscheduled> = lock(&self.pods).unscheduled().cloned().collect();
        out.sort_by(|a, b| (a.since, &a.namespace, &a.name).cmp(&(b.since, &b.namespace, &b.name)));
        out
    }

    /// The pod has a node, is gone, or no longer waits.
    pub fn clear_unscheduled(&self, uid: &str) {
        lock(&self.pods).clear_unscheduled(uid);
    }

    /// Pending gpu-share pods by class, with the oldest's wait at `now`; sorted by class.
    pub fn pending_by_class(&self, now: SystemTime) -> Vec<PendingClass> {
        let mut by: BTreeMap<&'static str, PendingClass> = BTreeMap::new();
        for u in lock(&self.pods).unscheduled() {
            let waited = now
                .duration_since(u.since)
                .unwrap_or_default()
                .as_secs_f64();
            let e = by.entry(u.class).or_insert(PendingClass {
                class: u.class,
                pods: 0,
                oldest_seconds: 0.0,
            });
            e.pods += 1;
            e.oldest_seconds = e.oldest_seconds.max(waited);
        }
        by.into_values().collect()
    }

    /// Counts a pod's demand in the online workload (call once per pod).
    ///
    /// A refreshed target (every 1,024 pods) would leave every node's memo of its fragmentation
    /// stale, and the next decision would compute all of them: over 5,000 nodes, 1-2 ms more. So
    /// decisions keep scoring against the current target while a thread fills every node's memo
    /// for the new one; then it takes over. The first target is used at once, and so is every
    /// target on clusters under [`WARM_IN_BACKGROUND_NODES`] nodes, where computing every memo
    /// again costs a decision less than 0.3 ms.
    ///
    /// The target weighs each shape by how scarce its homes are among the nodes known when it is
    /// refreshed ([`Homes`]); the node locks are taken with the workload's lock released.
    pub fn observe_demand(&self, demand: &Demand, policy: PackingPolicy) {
        let due = {
            let mut o = lock(&self.online);
            o.recent.observe(demand);
            o.seen.observe(demand)
        };
        if !due {
            return;
        }
        let mut homes = Homes::default();
        self.ledger.for_each_node(|nl| homes.add(&nl.node));
        let mut o = lock(&self.online);
        let t = Arc::new(o.seen.target(&homes));
        if o.target.is_none()
            || !policy.reads_workload()
            || self.ledger.node_count() < WARM_IN_BACKGROUND_NODES
        {
            o.target = Some(t);
            return;
        }
        o.pending = Some(t);
        if o.warming {
            return;
        }
        o.warming = true;
        drop(o);
        let (online, ledger) = (self.online.clone(), self.ledger.clone());
        let spawned = std::thread::Builder::new()
            .name("gpu-share-warm".into())
            .spawn(move || warm_memos(&online, &ledger, policy));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the memo warm-up; using the new workload at once");
            let mut o = lock(&self.online);
            o.warming = false;
            if let Some(t) = o.pending.take() {
                o.target = Some(t);
            }
        }
    }

    /// The scorer for a packing policy, with the online workload for `gpu-share`: the same
    /// scoring the simulator replays.
    pub fn scorer(&self, policy: PackingPolicy) -> Scorer {
        let target = if policy.reads_workload() {
            crate::sync::lock(&self.online).target.clone()
        } else {
            None
        };
        match target {
            Some(t) => Scorer::with_workload(policy, t),
            None => Scorer::new(policy),
        }
    }

    /// Learns nodes (`--dev`: from requests and `--nodes`). Returns the number of GPU nodes.
    pub fn learn_nodes(
        &self,
        nodes: &[k8s_openapi::api::core::v1::Node],
        reading: &crate::inventory::Reading,
    ) -> usize {
        let mut gpu = 0;
        for n in nodes {
            let name = n.metadata.name.clone().unwrap_or_default();
            let (facts, inventory) = NodeFacts::read(n, reading);
            gpu += usize::from(inventory.is_some());
            self.apply_node(&name, facts, inventory);
        }
        gpu
    }

    /// The nodes as the API shows them, to read.
    pub fn nodes(&self) -> std::sync::RwLockReadGuard<'_, Nodes> {
        crate::sync::read(&self.nodes)
    }

    /// A node added or changed ([`NodeFacts::read`]): its facts, and the inventory the ledger
    /// packs onto (its device plugin's GPUs, else those NVIDIA's DRA driver publishes there).
    pub fn apply_node(
        &self,
        name: &str,
        facts: NodeFacts,
        inventory: Option<crate::inventory::GpuNode>,
    ) {
        // Its facts first: whether its DRA GPUs' shares are opted in is read from them.
        crate::sync::write(&self.nodes).apply(name, facts);
        let gpu = inventory.or_else(|| self.dra_gpu_node(name));
        self.set_node(name, gpu);
    }

    /// A node's facts as a list read them (a reconcile): its inventory is the reconcile's to
    /// compare.
    pub(super) fn set_facts(&self, name: &str, facts: NodeFacts) {
        if self.nodes().get(name) != Some(&facts) {
            crate::sync::write(&self.nodes).apply(name, facts);
        }
    }

    /// A node deleted.
    pub fn delete_node(&self, name: &str) {
        crate::sync::write(&self.nodes).delete(name);
        self.set_node(name, None);
    }

    /// A relist of the nodes showed `listed` (applied one by one before): every other node is
    /// gone, from the nodes and the ledger alike. Returns how many went.
    pub fn reset_nodes(&self, listed: &std::collections::HashSet<String>) -> usize {
        let mut gone: std::collections::BTreeSet<String> = crate::sync::write(&self.nodes)
            .reset(listed)
            .into_iter()
            .collect();
        gone.extend(
            self.ledger
                .node_names()
                .into_iter()
                .filter(|n| !listed.contains(n)),
        );
        for name in &gone {
            self.set_node(name, None);
        }
        gone.len()
    }

    /// True when the node is known (from the API, or in `--dev` from requests and `--nodes`).
    pub fn knows_node(&self, name: &str) -> bool {
        self.nodes().get(name).is_some()
    }

    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// The node and pod caches have synced: the verbs may answer.
    pub fn mark_synced(&self) {
        self.synced.store(true, Ordering::Release);
    }

    /// How it learns about nodes and binds pods.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The cluster's ledger, to read (fit, scores, reports): a view with no verb that changes
    /// it. Its changes go through the state's verbs.
    pub fn ledger(&self) -> LedgerView<'_> {
        LedgerView(&self.ledger)
    }

    /// Re-points the share in per-GPU form `uid` at one of the GPUs `to` of its node (the
    /// reservation controller's move, [`Ledger::repoint`]).
    pub fn repoint(&self, scorer: &Scorer, uid: &str, to: &[u32]) -> Option<Vec<(u32, u32)>> {
        self.ledger.repoint(scorer, uid, to)
    }

    /// Holds shares in per-GPU form off `node` until `until`, for `why` (a reservation failed).
    pub fn hold_off(&self, node: &str, until: Instant, why: String) {
        self.ledger.hold_off(node, until, why);
    }

    /// Records the victims preemptor `uid` was given, node by node.
    pub fn note_victims(&self, uid: &str, victims: Vec<crate::ledger::NodeVictim>) {
        self.ledger.note_victims(uid, victims);
    }

    /// What NVIDIA's DRA driver's claims hold on `node` now ([`Ledger::sync_claims`]): their
    /// holdings, and the pods they stand for. Returns how many holdings changed.
    pub fn sync_claims(
        &self,
        node: &str,
        holdings: &[crate::ledger::ObservedPod],
        covered: &std::collections::BTreeSet<String>,
    ) -> usize {
        self.ledger.sync_claims(node, holdings, covered)
    }

    /// Forgets the DRA claims on a node that is no longer one.
    pub fn drop_claims(&self, node: &str) {
        self.ledger.drop_claims(node);
    }

    /// Keeps a pod as filter or prioritize read it, for bind. Returns whether it was new.
    pub fn remember_pod(&self, uid: &str, pod: Arc<crate::ledger::BindPod>) -> bool {
        lock(&self.pods).remember(uid, pod, Instant::now())
    }

    /// A pod as filter or prioritize read it.
    pub fn remembered_pod(&self, uid: &str) -> Option<Arc<crate::ledger::BindPod>> {
        lock(&self.pods).remembered(uid, Instant::now())
    }

    /// Marks pod `uid` as finding no room: the requeuer nudges it when a holding of its class
    /// is released.
    pub fn note_no_room(&self, uid: &str, who: NoRoom) {
        lock(&self.pods).note_no_room(uid, who, Instant::now());
    }

    /// The pods that found no room, by UID, the longest marked first.
    pub fn no_room_pods(&self) -> Vec<(String, NoRoom)> {
        lock(&self.pods).no_room(Instant::now())
    }

    /// The pods that wait for GPU room, the longest waiting first ([`Pods::wanting_room`]).
    pub fn wanting_room(&self) -> Vec<crate::cache::Wanting> {
        lock(&self.pods).wanting_room(Instant::now())
    }

    /// Whether pod `uid` found no room.
    pub fn has_no_room(&self, uid: &str) -> bool {
        lock(&self.pods).has_no_room(uid, Instant::now())
    }

    /// Pod `uid` was nudged or given a node: it waits for room no more.
    pub fn clear_no_room(&self, uid: &str) {
        lock(&self.pods).clear_no_room(uid);
    }

    /// What the API showed of a node: its inventory, or `None` when it is not a GPU node.
    pub fn set_node(&self, name: &str, inventory: Option<crate::inventory::GpuNode>) {
        match inventory {
            Some(inv) => self.ledger.upsert_node(inv),
            None => self.ledger.remove_node(name),
        }
    }

    /// Releases what pod `uid` holds, and any assumption of it.
    pub fn release(&self, uid: &str) {
        self.confirm(uid);
        self.ledger.release(uid);
    }

    /// Whether the ledger holds `uid` as a list shows it (`o`): its demand, and its GPUs where the
    /// list names them. Compared in place, under the pod's node alone (the ledger keeps a pod
    /// under one node), so a reconcile of 150,000 pods allocates only for the ones that differ.
    /// What the pod says of being moved follows the list on the way (no drift: it holds
    /// nothing).
    pub fn holds_as_listed(&self, uid: &str, o: &crate::ledger::ObservedPod) -> bool {
        self.ledger
            .with_node(&o.node, |nl| {
                nl.note_consent(o);
                nl.holdings.get(uid).is_some_and(|h| {
                    h.demand == o.demand && o.gpus.as_ref().is_none_or(|g| *g == h.placement.gpus)
                })
            })
            .unwrap_or(false)
    }

    /// Records a holding the API shows: no longer merely assumed.
    pub fn record(&self, observed: &crate::ledger::ObservedPod) {
        self.ledger.record(observed);
        self.confirm(&observed.pod.uid);
    }

    /// What is assumed of pod `uid`: bound (or being bound) by this extender, not yet shown by
    /// the API.
    pub fn assumption(&self, uid: &str) -> Option<Assumed> {
        lock(&self.pods).assumption(uid, Instant::now()).cloned()
    }

    /// Assumes pod `uid` (again), for the assume TTL from now.
    pub(super) fn assume(&self, uid: &str, assumed: Assumed) {
        lock(&self.pods).assume(uid, assumed, Instant::now());
    }

    /// The API shows pod `uid` bound (or gone): it is no longer merely assumed.
    pub fn confirm(&self, uid: &str) {
        lock(&self.pods).forget_assumption(uid);
    }

    /// Releases the holdings whose assumption lapsed: bound by this extender, never shown by the
    /// API for the assume TTL. A holding the pod has on another node since is not its bind's.
    fn lapse_assumptions(&self) {
        let lapsed = lock(&self.pods).lapse(Instant::now());
        for (uid, a) in lapsed {
            if self.ledger.node_of(&uid).as_deref() == Some(a.node.as_str()) {
                tracing::warn!(uid = %uid, node = %a.node, "bound allocation never appeared in the API; freeing it");
                self.ledger.release(&uid);
            }
        }
    }

    /// The demand seen most often lately (the fragmentation gauge's target), if any.
    pub fn most_common_demand(&self) -> Option<Demand> {
        lock(&self.online).recent.most_common().cloned()
    }

    /// Subscribes to releases (the requeuer).
    pub fn subscribe_releases(&self) -> mpsc::UnboundedReceiver<Released> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.ledger.on_release(move |h| {
            let _ = tx.send(Released {
                node: h.node.clone(),
                class: h.demand.gpu.class(),
            });
        });
        rx
    }

    /// Runs the pending expiries (lapsed assumptions free their holdings here).
    pub fn run_pending(&self) {
        if let Some(t) = Instant::now().checked_sub(TOUCHED_TTL) {
            self.forget_touches_before(t);
        }
        self.lapse_assumptions();
        lock(&self.pods).expire(Instant::now());
    }

    /// Whether a list of pods begun at `listed_from` may lack `uid` although the extender bound
    /// it: its bind was still in flight, or the API accepted it after the list began. A list
    /// (a consistent read) begun after the API accepted a binding shows the pod unless it is gone.
    pub fn bound_after(&self, uid: &str, listed_from: Instant) -> bool {
        self.assumption(uid)
            .is_some_and(|a| a.bound_at.is_none_or(|at| at >= listed_from))
    }

    /// Notes that the watch changed pod `uid` now.
    pub fn touch(&self, uid: &str) {
        lock(&self.pods).touch(uid, Instant::now());
    }

    /// Whether the watch changed pod `uid` after `t`.
    pub fn touched_after(&self, uid: &str, t: Instant) -> bool {
        lock(&self.pods).touched_after(uid, t)
    }

    /// Notes that the watch changed node `name` now.
    pub fn touch_node(&self, name: &str) {
        lock(&self.nodes_touched).insert(name.to_string(), Instant::now());
    }

    /// Whether the watch changed node `name` after `t`.
    pub fn node_touched_after(&self, name: &str, t: Instant) -> bool {
        lock(&self.nodes_touched)
            .get(name)
            .is_some_and(|at| *at > t)
    }

    /// Forgets the changes made before `t`: only lists begun before `t` need them. Returns how
    /// many changes (of pods and nodes) are still remembered.
    pub fn forget_touches_before(&self, t: Instant) -> usize {
        let mut nodes = lock(&self.nodes_touched);
        nodes.retain(|_, at| *at >= t);
        nodes.len() + lock(&self.pods).forget_touches_before(t)
    }

    /// A pod seen in the API: records or releases its holding.
    pub fn observe_pod(&self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        self.touch(&uid);
        match unscheduled_of(pod) {
            Some(u) => self.note_unscheduled(&uid, u),
            None => self.clear_unscheduled(&uid),
        }
        self.note_contradicted(
            &uid,
            !crate::ledger::is_terminal(pod) && crate::ledger::request_contradiction(pod).is_some(),
        );
        self.explainer.consider(pod);
        match crate::ledger::observed_holding(pod) {
            Ok(Some(o)) => {
                if let Some(resources) = crate::ledger::bound_without_extender(pod) {
                    self.warn_bypassed(pod, resources);
                }
                self.ledger.record(&o);
                self.confirm(&uid);
                self.clear_no_room(&uid);
            }
            Ok(None) => {
                if pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_ref())
                    .is_some()
                {
                    self.clear_no_room(&uid);
                }
                let unbound = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_ref())
                    .is_none();
                if unbound && !crate::ledger::is_terminal(pod) {
                    // A pod's node is never unset: this view is older than the holding (our
                    // bind, or a list that showed it bound, ahead of a slow watch). A binding
                    // that did not take is released by bind, a read back, or expiry.
                    return;
                }
                if self.ledger.node_of(&uid).is_some() {
                    self.ledger.release(&uid);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot account a pod's GPU demand");
            }
        }
    }

    /// Warns, once per set of resources, that a gpu-share pod was bound without the extender
    /// ([`crate::ledger::bound_without_extender`]). Its holding is accounted all the same.
    fn warn_bypassed(&self, pod: &Pod, resources: Vec<String>) {
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let named = resources.join(", ");
        if lock(&self.bypassed).insert(resources) {
            tracing::warn!(
                pod = %crate::ledger::pod_key(pod),
                node,
                resources = %named,
                "a gpu-share pod was bound without the extender (no gpu-share.io/gpus): kube-scheduler calls the extender only for pods that request one of its managedResources; add {named} to managedResources in the scheduler configuration"
            );
        }
    }

    /// A pod deleted in the API.
    pub fn forget_pod(&self, uid: &str) {
        lock(&self.pods).forget(uid, Instant::now());
        self.ledger.release(uid);
    }

    /// After a full relist begun at `listed_from`: releases holdings of pods the API no longer
    /// has, except allocations whose binding the list may not show yet. An allocation bound
    /// before the list began and missing from it is gone, even if no watch ever showed it.
    pub fn retain_pods(
        &self,
        seen: &std::collections::HashSet<String>,
        listed_from: Instant,
    ) -> usize {
        lock(&self.pods).retain_listed(seen, listed_from);
        let mut dropped = 0;
        for uid in self.ledger.uids() {
            if !seen.contains(&uid) && !self.bound_after(&uid, listed_from) {
                // Gone as of this list: an older reconcile's list must not bring it back.
                self.touch(&uid);
                self.confirm(&uid);
                self.ledger.release(&uid);
                dropped += 1;
            }
        }
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extender::report::gpus_by_class;
    use crate::extender::report::{fragmented_gpus, report};
    use crate::inventory::{GpuNode, Sharing};
    use crate::ledger::NodeLedger;
    use crate::ledger::PodRef;
    use crate::packing::{GpuDemand, PackingPolicy, Scorer};

    /// A node whose sharing no label states says so in `/v1/nodes` (and so in `gpu-share
    /// status`, which prints the kind).
    #[test]
    fn an_unverified_node_says_so_in_its_report() {
        let labels = std::collections::BTreeMap::from([(
            "node.kubernetes.io/instance-type".to_string(),
            "g5.12xlarge".to_string(),
        )]);
        let alloc =
            std::collections::BTreeMap::from([("nvidia.com/gpu".to_string(), "4".to_string())]);
        let n = crate::inventory::from_parts(
            "eks-1",
            &labels,
            &alloc,
            &crate::inventory::Reading::default(),
        )
        .unwrap();
        let r = report(&NodeLedger::new(n), &crate::mig::MigTable::default(), &[]);
        assert_eq!(r.kind, "whole (unverified)");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["modeSource"], "unverified");
        let gfd = report(
            &NodeLedger::new(GpuNode::whole("g", "NVIDIA-L4", 1, 23034)),
            &crate::mig::MigTable::default(),
            &[],
        );
        assert_eq!(gfd.kind, "whole");
    }

    #[test]
    fn a_reconcile_forgets_the_changes_older_than_its_list() {
        let e = ExtenderState::new(Mode::Cluster, DEFAULT_ASSUME_TTL);
        for i in 0..10_000 {
            e.touch(&format!("uid-{i}"));
        }
        e.touch_node("n-early");
        std::thread::sleep(Duration::from_millis(2));
        let listed_at = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        e.touch("uid-late");
        e.touch_node("n-late");
        assert!(e.touched_after("uid-1", listed_at - Duration::from_secs(1)));
        assert!(!e.touched_after("uid-1", listed_at));
        assert!(!e.node_touched_after("n-early", listed_at));
        assert_eq!(e.forget_touches_before(listed_at), 2);
        assert!(e.touched_after("uid-late", listed_at));
        assert!(e.node_touched_after("n-late", listed_at));
        assert!(!e.touched_after("uid-1", listed_at - Duration::from_secs(1)));
        assert!(!e.node_touched_after("n-early", listed_at - Duration::from_secs(1)));
    }

    #[test]
    fn a_refreshed_workload_takes_over_once_every_memo_is_filled() {
        use crate::inventory::{GpuNode, Sharing};
        let ext = ExtenderState::new(Mode::Dev, Duration::from_secs(60));
        for i in 0..WARM_IN_BACKGROUND_NODES {
            let mut n = GpuNode::shared(
                &format!("n{i}"),
                "NVIDIA-L4",
                8,
                23034,
                Sharing::TimeSlicing { replicas: 4 },
            );
            n.cpu_milli = Some(64_000);
            ext.ledger.upsert_node(n);
        }
        let d = |milli| {
            Demand::gpu(GpuDemand::Timeslice {
                milli,
                memory_mib: None,
            })
        };
        ext.observe_demand(&d(250), PackingPolicy::GpuShare);
        let first = ext.scorer(PackingPolicy::GpuShare).workload.unwrap();
        // The second pod refreshes the target (at 2 pods): the first one serves until the warm-up
        // has filled every node's memo for the new one.
        ext.observe_demand(&d(500), PackingPolicy::GpuShare);
        let deadline = Instant::now() + Duration::from_secs(10);
        let second = loop {
            let w = ext.scorer(PackingPolicy::GpuShare).workload.unwrap();
            if !Arc::ptr_eq(&w, &first) {
                break w;
            }
            assert!(
                Instant::now() < deadline,
                "the refreshed workload never took over"
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!(second.shapes.len(), 2);
        assert!(!lock(&ext.online).warming);
        // Every memo already holds the new workload's value: reading it computes nothing new.
        let scorer = ext.scorer(PackingPolicy::GpuShare);
        let mut hits = 0;
        ext.ledger.for_each_node(|nl| {
            let before = nl.memo.clone();
            scorer.warm_memo(&nl.node, &nl.usage, &mut nl.memo);
            if format!("{before:?}") == format!("{:?}", nl.memo) {
                hits += 1;
            }
        });
        assert_eq!(hits, WARM_IN_BACKGROUND_NODES);
    }

    #[test]
    fn the_target_weighs_a_shape_by_how_few_known_nodes_can_hold_it() {
        use crate::inventory::{GpuNode, Sharing};
        let ext = ExtenderState::new(Mode::Dev, Duration::from_secs(60));
        for (i, product) in ["NVIDIA-L4"; 10]
            .into_iter()
            .chain(["NVIDIA-H100"])
            .enumerate()
        {
            let n = GpuNode::shared(
                &format!("n{i}"),
                product,
                8,
                23034,
                Sharing::TimeSlicing { replicas: 4 },
            );
            ext.ledger.upsert_node(n);
        }
        let d = |models: &[&str]| Demand {
            models: models.iter().map(|m| m.to_string()).collect(),
            ..Demand::gpu(GpuDemand::Timeslice {
                milli: 250,
                memory_mib: None,
            })
        };
        for _ in 0..3 {
            ext.observe_demand(&d(&[]), PackingPolicy::GpuShare);
        }
        // The fourth pod refreshes the target; it may only run on the H100 node, 8 of 88 GPUs.
        ext.observe_demand(&d(&["NVIDIA-H100"]), PackingPolicy::GpuShare);
        let w = ext.scorer(PackingPolicy::GpuShare).workload.unwrap();
        assert_eq!(w.shapes.len(), 2);
        assert_eq!(w.shapes[0].0.models, vec!["NVIDIA-H100".to_string()]);
        // Weighted 11^0.75 (about 6.0) against the three unpinned ones.
        let weight = 11f64.powf(crate::packing::SCARCITY_EXPONENT);
        assert!(
            (w.shapes[0].1 - weight / (weight + 3.0)).abs() < 1e-12,
            "{:?}",
            w.shapes
        );
    }

    #[test]
    fn gpu_share_scores_against_the_demands_seen() {
        let ext = ExtenderState::new(Mode::Dev, Duration::from_secs(60));
        assert!(ext.scorer(PackingPolicy::GpuShare).workload.is_none());
        let d = Demand::gpu(GpuDemand::Timeslice {
            milli: 250,
            memory_mib: None,
        });
        ext.observe_demand(&d, PackingPolicy::GpuShare);
        let s = ext.scorer(PackingPolicy::GpuShare);
        let w = s.workload.expect("a workload after the first pod");
        assert_eq!(w.shapes.len(), 1);
        assert_eq!(w.shapes[0].0.gpu_milli, 250);
        assert!(ext.scorer(PackingPolicy::Binpack).workload.is_none());
    }

    #[test]
    fn fragmented_gpus_counts_free_room_where_the_common_request_no_longer_fits() {
        let ts = |name: &str| {
            GpuNode::shared(name, "H100", 1, 81559, Sharing::TimeSlicing { replicas: 4 })
        };
        let mut a = NodeLedger::new(ts("a"));
        let b = NodeLedger::new(ts("b"));
        let plain = NodeLedger::new(GpuNode::whole("plain", "H100", 2, 81559));
        let scorer = Scorer::new(PackingPolicy::Binpack);
        let d = |p: u32| {
            Demand::gpu(GpuDemand::Timeslice {
                milli: p * 10,
                memory_mib: None,
            })
        };
        let pref = PodRef::new("x", "ml", "x");
        a.hold(&scorer, pref, d(70)).unwrap();
        // A 50% request no longer fits on a (30% free there); b is empty; the plain node is of
        // another class and does not count.
        let nodes = vec![a, b, plain];
        assert!((fragmented_gpus(&nodes, &d(50)) - 0.3).abs() < 1e-9);
        assert_eq!(fragmented_gpus(&nodes, &d(20)), 0.0);
    }

    fn pod_json(uid: &str, request: Option<&str>, node: Option<&str>, phase: &str) -> Pod {
        let mut annotations = serde_json::Map::new();
        if let Some(r) = request {
            annotations.insert("gpu-share.io/request".into(), r.into());
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("p-{uid}"), "namespace": "ml", "uid": uid,
                         "creationTimestamp": "2026-01-01T00:00:00Z",
                         "annotations": annotations},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                     "nodeName": node},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    #[test]
    fn unscheduled_pods_are_gpu_share_pods_without_a_node() {
        let created = SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600);
        let u = unscheduled_of(&pod_json("a", Some("timeslice-50"), None, "Pending")).unwrap();
        assert_eq!(u.class, "timeslice");
        assert_eq!(u.since, created);
        assert_eq!(
            (u.namespace.as_str(), u.name.as_str(), u.reason),
            ("ml", "p-a", None)
        );
        // The scheduler's word on it, kept (cut at REASON_MAX bytes, on a character).
        let mut said = pod_json("a", Some("timeslice-50"), None, "Pending");
        let long = format!("0/5000 nodes are available: {}", "ü".repeat(1000));
        said.status.as_mut().unwrap().conditions =
            Some(vec![k8s_openapi::api::core::v1::PodCondition {
                type_: "PodScheduled".into(),
                status: "False".into(),
                reason: Some("Unschedulable".into()),
                message: Some(long.clone()),
                ..Default::default()
            }]);
        let reason = unscheduled_of(&said).unwrap().reason.unwrap();
        assert!(
            reason.len() <= super::super::pending::REASON_MAX,
            "{}",
            reason.len()
        );
        assert!(reason.starts_with("0/5000 nodes are available: üü") && reason.ends_with('…'));
        assert_eq!(
            unscheduled_of(&pod_json("b", Some("exclusive"), None, "Pending")).map(|u| u.class),
            Some("exclusive")
        );
        // Bound, finished, or not admitted by gpu-share: not pending for it.
        assert!(unscheduled_of(&pod_json("c", Some("exclusive"), Some("n1"), "Pending")).is_none());
        assert!(unscheduled_of(&pod_json("d", Some("exclusive"), None, "Failed")).is_none());
        assert!(unscheduled_of(&pod_json("e", None, None, "Pending")).is_none());
        let mut gated = pod_json("f", Some("exclusive"), None, "Pending");
        gated.spec.as_mut().unwrap().scheduling_gates =
            Some(vec![k8s_openapi::api::core::v1::PodSchedulingGate {
                name: "kueue.x-k8s.io/admission".into(),
            }]);
        assert!(
            unscheduled_of(&gated).is_none(),
            "gated: not offered to a scheduler yet"
        );
    }

    #[test]
    fn pending_pods_are_counted_by_class_with_the_oldest_wait() {
        let e = ExtenderState::new(Mode::Cluster, Duration::from_secs(60));
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let u = |name: &str, class, at, reason: Option<&str>| Unscheduled {
            namespace: "ml".into(),
            name: name.into(),
            class,
            since: t0 + Duration::from_secs(at),
            reason: reason.map(str::to_string),
        };
        e.note_unscheduled("a", u("a", "mps", 0, Some("0/3 nodes fit")));
        e.note_unscheduled("b", u("b", "mps", 50, None));
        e.note_unscheduled("c", u("c", "mig", 90, None));
        // Seen again later, saying nothing new: the first time and the last reason stay.
        e.note_unscheduled("a", u("a", "mps", 95, None));
        let pending = e.pending_pods();
        let names: Vec<&str> = pending.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"], "longest waiting first");
        assert_eq!(pending[0], u("a", "mps", 0, Some("0/3 nodes fit")));
        let now = t0 + Duration::from_secs(100);
        assert_eq!(
            e.pending_by_class(now),
            [
                PendingClass {
                    class: "mig",
                    pods: 1,
                    oldest_seconds: 10.0
                },
                PendingClass {
                    class: "mps",
                    pods: 2,
                    oldest_seconds: 100.0
                },
            ]
        );
        // Watched: bound (a), deleted (c).
        e.observe_pod(&pod_json("a", Some("mps-25"), Some("n1"), "Pending"));
        e.forget_pod("c");
        assert_eq!(
            e.pending_by_class(now),
            [PendingClass {
                class: "mps",
                pods: 1,
                oldest_seconds: 50.0
            }]
        );
        // A relist that no longer has b drops it.
        e.retain_pods(&Default::default(), Instant::now());
        assert!(e.pending_by_class(now).is_empty());
    }

    #[test]
    fn a_nodes_gpus_are_split_by_class() {
        let mut mixed = GpuNode::whole("m", "A100", 2, 40960);
        mixed.mig = crate::inventory::MigLayout::Mixed {
            instances: [("3g.20gb".to_string(), 2)].into(),
        };
        let nl = NodeLedger::new(mixed);
        let by = gpus_by_class(&nl, &crate::mig::MigTable::default());
        assert_eq!(by.len(), 2);
        assert_eq!(
            (by[0].class, by[0].total, by[0].used),
            ("exclusive", 2.0, 0.0)
        );
        assert_eq!(by[1].class, "mig");
        assert!((by[1].total - 6.0 / 7.0).abs() < 0.01, "{by:?}");
        let ts = NodeLedger::new(GpuNode::shared(
            "t",
            "L4",
            1,
            23034,
            Sharing::Mps { replicas: 4 },
        ));
        assert_eq!(
            gpus_by_class(&ts, &crate::mig::MigTable::default())[0].class,
            "mps"
        );
    }
}

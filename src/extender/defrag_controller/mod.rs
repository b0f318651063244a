//! The defragmentation controller, under the policy's `defrag.mode: plan` or `on`. On the
//! replica that leads (its kube-scheduler holds the Lease), every [`TICK`] it weighs the pods that
//! wait for GPU room (filter found them none, or kube-scheduler's own resource check found no node
//! with the `nvidia.com/*` resources they ask), longest waiting first, with
//! [`crate::defrag::plan`] over the ledger: which running pods moving elsewhere would make room,
//! within the policy's limits. Each plan is posted on the node it would make room on ([`Board`]:
//! `/v1/nodes`, `gpu-share status`, the page).
//!
//! - Under `plan`, it tells each waiting pod in an event what moving would do, or why no moves
//!   would, and moves nothing: the mode is for watching before anything is evicted.
//! - Under `on`, it carries each plan out and follows it to its end ([`moving`]): the targets
//!   held and the freed node fenced first, the pods evicted through the Eviction API, their
//!   replacements steered to their targets, the waiting pod placed; or the plan unwound in words.
//!
//! - [`gather`]: the ledger's nodes as the planner reads them, each holding with whether it may
//!   move (its pod's controller, annotations and phase, the namespaces opted in, its workload's
//!   cooldown);
//! - [`decision`]: the plan for one waiting pod, and its words, with no I/O.
//!
//! The waiting pod's node constraints (nodeSelector, required node affinity) are read from the
//! pod; each pod a plan would move is read too, and the plan weighed again with the nodes its
//! own constraints pick.

pub mod board;
pub mod decision;
pub mod gather;
pub mod moving;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use tokio::sync::watch::Receiver;

use super::executor::{self, Executor};
use super::state::ExtenderState;
use crate::cache::Wanting;
use crate::cluster::leadership::Leadership;
use crate::defrag::flight::{GiveUp, Lineage, PodId, carries_plan, recorded};
use crate::defrag::{NoPlan, Plan};
use crate::metrics::Metrics;
use crate::packing::Scorer;
use crate::policy::{DefragMode, DefragPolicy};
use crate::reservation::view::Owner;
use crate::shared::{PolicyStore, stopped};
pub use board::Board;
pub use decision::{Waiter, weigh};
pub use gather::{Ground, Rules};

/// How often the controller weighs the waiting pods.
pub const TICK: Duration = Duration::from_secs(10);
/// The most waiting pods weighed in one tick.
const WEIGHED_PER_TICK: usize = 8;
/// How long before one waiting pod is weighed again.
const REWEIGH: Duration = Duration::from_secs(60);
/// How many times a plan is weighed again with the constraints of the pods it would move read.
const RETRIES: usize = 3;
/// The events' reasons, and the action they report.
pub const EVENT_PLAN: &str = "GpuShareDefragPlan";
pub const EVENT_NO_PLAN: &str = "GpuShareNoDefragPlan";
pub const EVENT_ACTION: &str = "Defragmentation";

/// Starts the controller's loop (it does nothing while `defrag.mode` is `off`).
pub fn spawn(
    client: Client,
    ext: Arc<ExtenderState>,
    policy: Arc<PolicyStore>,
    metrics: Arc<Metrics>,
    leadership: Leadership,
    shutdown: Receiver<bool>,
) {
    tokio::spawn(async move {
        let io = match crate::cluster::eviction::client().await {
            Ok(evictions) => executor::Api::new(client.clone()).evicting_with(evictions),
            Err(e) => {
                tracing::error!(error = %e, "no client for evictions without retries: a refused eviction is retried by the client until it gives up");
                executor::Api::new(client.clone())
            }
        };
        run(client, io, ext, policy, metrics, leadership, shutdown).await
    });
}

/// What the loop remembers between ticks, by waiting pod's UID.
#[derive(Default)]
pub struct Memory {
    /// When each was last weighed.
    weighed: HashMap<String, Instant>,
    /// What each was last told.
    said: HashMap<String, String>,
    leading: Option<bool>,
    /// When each workload (`namespace/Kind/name`) last had a pod moved, or an eviction
    /// refused: it is left alone for `defrag.cooldownSeconds`.
    cooled: HashMap<String, Instant>,
}

impl Memory {
    /// Forgets the pods no longer waiting (`waiting`: the UIDs of those that are).
    fn keep_only(&mut self, waiting: &HashSet<&str>) {
        self.weighed.retain(|uid, _| waiting.contains(uid.as_str()));
        self.said.retain(|uid, _| waiting.contains(uid.as_str()));
    }
}

async fn run(
    client: Client,
    io: executor::Api,
    ext: Arc<ExtenderState>,
    policy: Arc<PolicyStore>,
    metrics: Arc<Metrics>,
    leadership: Leadership,
    mut shutdown: Receiver<bool>,
) {
    let mut memory = Memory::default();
    loop {
        tokio::select! {
            _ = stopped(&mut shutdown) => return,
            _ = tokio::time::sleep(TICK) => {}
        }
        let loaded = policy.current();
        if loaded.policy.defrag.mode != DefragMode::On && !ext.flights().is_empty() {
            // Moving turned off: the plans under way are given up, their holds released.
            for f in ext.flights() {
                moving::unwind(&io, &ext, &metrics, &f.waiting, GiveUp::TurnedOff).await;
            }
        }
        if loaded.policy.defrag.mode == DefragMode::Off {
            // Turned off: nothing posted stays, and a pod told before is told again once on.
            ext.plans.clear();
            memory = Memory::default();
            continue;
        }
        if !ext.is_synced() {
            continue;
        }
        let waiting = ext.wanting_room();
        let uids: HashSet<&str> = waiting.iter().map(|w| w.uid.as_str()).collect();
        memory.keep_only(&uids);
        // A plan under way stays posted while its waiting pod is placed and its replacements land.
        let flights = ext.flights();
        let mut posted = uids.clone();
        posted.extend(flights.iter().map(|f| f.waiting.uid.as_str()));
        ext.plans.keep_only(&posted);
        if waiting.is_empty() && flights.is_empty() {
            continue;
        }
        let Some(leading) = leadership
            .check(&client, &mut memory.leading, "defragmentation controller")
            .await
        else {
            continue;
        };
        if leading {
            tick(&io, &ext, &loaded.policy, &metrics, &waiting, &mut memory).await;
        } else {
            // The replica that leads posts, tells and moves; it unwinds what this one began.
            moving::drop_all(&ext);
            ext.plans.clear();
            memory.weighed.clear();
            memory.said.clear();
        }
    }
}

/// Weighs the waiting pods due (`waiting`, longest first) and tells each what changed.
pub async fn tick<E: Executor>(
    io: &E,
    ext: &ExtenderState,
    policy: &crate::policy::Policy,
    metrics: &Metrics,
    waiting: &[Wanting],
    memory: &mut Memory,
) {
    let on = policy.defrag.mode == DefragMode::On;
    let scorer = ext.scorer(policy.packing.policy.into());
    if on {
        moving::advance(io, ext, &scorer, &policy.defrag, metrics).await;
    }
    let flying: HashSet<String> = ext.flights().into_iter().map(|f| f.waiting.uid).collect();
    let now = Instant::now();
    let due: Vec<&Wanting> = waiting
        .iter()
        .filter(|w| !flying.contains(&w.uid))
        .filter(|w| {
            memory
                .weighed
                .get(&w.uid)
                .is_none_or(|t| now.duration_since(*t) >= REWEIGH)
        })
        .take(WEIGHED_PER_TICK)
        .collect();
    if due.is_empty() {
        return;
    }
    let defrag = &policy.defrag;
    let unsettled = |uid: &str| ext.assumption(uid).is_some() || ext.in_doubt(uid).is_some();
    let cooldown = Duration::from_secs(u64::from(defrag.cooldown_seconds));
    let gather = |cooled: &HashMap<String, Instant>| {
        Ground::gather(
            ext.ledger().snapshot(),
            &Rules {
                namespaces: &defrag.namespaces,
                cooling: &|w| cooled.get(w).is_some_and(|t| t.elapsed() < cooldown),
                unsettled: &unsettled,
            },
        )
    };
    memory.cooled.retain(|_, t| t.elapsed() < cooldown);
    let mut ground = gather(&memory.cooled);
    for who in due {
        let uid = &who.uid;
        memory.weighed.insert(uid.clone(), now);
        let pod = match io.get_pod(&who.namespace, &who.name).await {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(pod = %format!("{}/{}", who.namespace, who.name), error = %e, "waiting pod not read; weighed again later");
                continue;
            }
        };
        if pod.metadata.uid.as_deref() != Some(uid.as_str()) {
            continue;
        }
        let id = PodId {
            uid: uid.clone(),
            namespace: who.namespace.clone(),
            name: who.name.clone(),
        };
        if carries_plan(&pod) {
            // Begun by a replica that no longer holds it: its holds went with that replica.
            let plan = recorded(&pod);
            moving::unwind(io, ext, metrics, &id, GiveUp::Orphaned { plan }).await;
            continue;
        }
        let Some(waiter) = Waiter::of(Arc::new(pod), policy) else {
            continue;
        };
        // No plan begins while `movesAtOnce` moves are under way, over every plan (a plan's own
        // moves beyond the bound wait for earlier ones to land).
        if on && ext.moves_under_way() >= defrag.moves_at_once as usize {
            memory.weighed.remove(uid);
            break;
        }
        let (outcome, read) = checked_plan(io, ext, &ground, &scorer, &waiter, defrag).await;
        metrics.defrag_plan(decision::label(&outcome));
        if let (true, Ok(plan)) = (on, &outcome) {
            let lineages: Option<Vec<Lineage>> = plan
                .moves
                .iter()
                .map(|m| read.get(&m.id).and_then(Lineage::of))
                .collect();
            let Some(lineages) = lineages else {
                tracing::debug!(pod = %id, "a pod the plan moves has no controller that recreates it, as read back; weighed again later");
                continue;
            };
            memory.said.remove(uid);
            if moving::begin(
                io,
                ext,
                &scorer,
                defrag,
                metrics,
                memory,
                id,
                plan.clone(),
                lineages,
            )
            .await
                && let Some(f) = ext.with_flight(uid, |f| f.clone())
            {
                ext.plans.post(uid, &f.plan.node, f.words());
            }
            // The ledger changed (promises, and the pods evicted are leaving): weighed afresh.
            ground = gather(&memory.cooled);
            continue;
        }
        match &outcome {
            Ok(plan) => ext.plans.post(
                uid,
                &plan.node,
                format!(
                    "for {}/{}: {plan} (plan only: nothing moves)",
                    who.namespace, who.name
                ),
            ),
            Err(_) => ext.plans.take_down(uid),
        }
        let Some(note) = decision::words(&outcome) else {
            continue;
        };
        if memory.said.get(uid) == Some(&note) {
            continue;
        }
        let reason = if outcome.is_ok() {
            EVENT_PLAN
        } else {
            EVENT_NO_PLAN
        };
        let owner = Owner {
            namespace: who.namespace.clone(),
            name: who.name.clone(),
            uid: uid.clone(),
        };
        io.note(&owner, false, EVENT_ACTION, reason, &note).await;
        tracing::info!(pod = %format!("{}/{}", who.namespace, who.name), "{note}");
        memory.said.insert(uid.clone(), note);
    }
}

/// The plan for `waiter`, each pod it would move read from the API first: a pod moves only to
/// nodes its own nodeSelector, required node affinity and tolerations leave it, and a pod that cannot be read, or
/// is no longer the pod the ledger holds (another UID under its name), does not move. Weighed
/// again while a plan names a pod not yet read; in the last round, only pods read may move.
/// Nodes another plan under way holds for its waiting pod are left alone. Returns the pods
/// read, by UID, with the outcome.
async fn checked_plan<E: Executor>(
    io: &E,
    ext: &ExtenderState,
    ground: &Ground,
    scorer: &Scorer,
    waiter: &Waiter,
    defrag: &DefragPolicy,
) -> (Result<Plan, NoPlan>, HashMap<String, Pod>) {
    // The nodes each pod read may go to, by its UID.
    let mut allowed: HashMap<String, HashSet<String>> = HashMap::new();
    let mut read: HashMap<String, Pod> = HashMap::new();
    let fences = ext.ledger().fences_now();
    let uid = waiter.pod.metadata.uid.clone().unwrap_or_default();
    let open = |node: &str| fences.get(node).is_none_or(|f| f.waiting == uid);
    for round in 0..=RETRIES {
        let last = round == RETRIES;
        let may_go = |id: &str, node: &str| {
            open(node)
                && match allowed.get(id) {
                    Some(nodes) => nodes.contains(node),
                    None => !last,
                }
        };
        let outcome = weigh(ground, &ext.nodes(), scorer, waiter, defrag, &may_go, &open);
        let Ok(plan) = &outcome else {
            return (outcome, read);
        };
        let unread: Vec<(String, String)> = plan
            .moves
            .iter()
            .filter(|m| !allowed.contains_key(&m.id))
            .map(|m| (m.id.clone(), m.key.clone()))
            .collect();
        if unread.is_empty() {
            return (outcome, read);
        }
        for (id, key) in unread {
            let nodes = match key.split_once('/') {
                Some((namespace, name)) => match io.get_pod(namespace, name).await {
                    Ok(pod) if pod.metadata.uid.as_deref() == Some(id.as_str()) => {
                        let nodes = decision::picked_by(
                            &ext.nodes(),
                            &pod.spec.clone().unwrap_or_default(),
                        );
                        read.insert(id.clone(), pod);
                        nodes
                    }
                    Ok(_) => HashSet::new(),
                    Err(e) => {
                        tracing::debug!(pod = %key, error = %e, "a pod a plan would move not read; it stays");
                        HashSet::new()
                    }
                },
                None => HashSet::new(),
            };
            allowed.insert(id, nodes);
        }
    }
    let none = |_: &str, _: &str| false;
    (
        weigh(ground, &ext.nodes(), scorer, waiter, defrag, &none, &open),
        read,
    )
}

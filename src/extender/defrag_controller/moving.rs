//! `defrag.mode: on`: carrying plans out, and ending them. A plan begins with its holds (each
//! move's target, and the node room is made on fenced for the waiting pod:
//! [`ExtenderState::begin_flight`]) and the plan written on the waiting pod; then each pod is
//! evicted through the Eviction API, in order, while fewer than `defrag.movesAtOnce` moves are
//! under way over every plan (evicted, their replacement not landed): the rest wait for earlier
//! replacements to land. A refusal (a PodDisruptionBudget) or a failure unwinds the plan: its
//! holds are released, the annotation taken off, the waiting pod told why. Each tick,
//! [`advance`] follows the plans under way: replacements that took their promise, the next
//! evictions, the waiting pod placed, the deadline.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::{EVENT_ACTION, Memory};
use crate::defrag::Plan;
use crate::defrag::flight::{ANNOTATION_PLAN, Flight, GiveUp, Leg, Lineage, Next, PodId};
use crate::extender::bind::ReadBackError;
use crate::extender::executor::{Evicted, Executor};
use crate::extender::state::ExtenderState;
use crate::metrics::Metrics;
use crate::packing::Scorer;
use crate::policy::DefragPolicy;
use crate::reservation::view::Owner;

/// The events' reasons.
pub const EVENT_MOVING: &str = "GpuShareDefragMoving";
pub const EVENT_MOVED: &str = "GpuShareDefragMoved";
pub const EVENT_PLACED: &str = "GpuShareDefragDone";
pub const EVENT_GAVE_UP: &str = "GpuShareDefragGaveUp";

/// Seconds since the Unix epoch.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn owner_of(id: &PodId) -> Owner {
    Owner {
        namespace: id.namespace.clone(),
        name: id.name.clone(),
        uid: id.uid.clone(),
    }
}

/// Carries `plan` out for waiting pod `waiting`: holds, the annotation, then the evictions in
/// order. `lineages` are the moved pods', in the plan's order. Returns whether the plan is
/// under way (`false`: it could not begin, or was unwound, and the waiting pod was told why).
#[allow(clippy::too_many_arguments)]
pub async fn begin<E: Executor>(
    io: &E,
    ext: &ExtenderState,
    scorer: &Scorer,
    policy: &DefragPolicy,
    metrics: &Metrics,
    memory: &mut Memory,
    waiting: PodId,
    plan: Plan,
    lineages: Vec<Lineage>,
) -> bool {
    let timeout = u64::from(policy.plan_timeout_seconds);
    let flight = Flight::begin(waiting.clone(), plan, lineages, now_secs(), timeout);
    let record = serde_json::to_string(&flight.record()).unwrap_or_default();
    let words = flight.plan.to_string();
    let moves = flight.plan.moves.clone();
    if let Err((pod, why)) =
        ext.begin_flight(scorer, flight, std::time::Duration::from_secs(timeout))
    {
        tracing::info!(pod = %waiting, moved = %pod, reason = %why.message(), "a plan's target no longer takes its pod; weighed again later");
        return false;
    }
    // Written before anything moves: a replica that finds it with no plan of its own unwinds it.
    if let Err(e) = io
        .annotate(
            &waiting.namespace,
            &waiting.name,
            ANNOTATION_PLAN,
            Some(&record),
        )
        .await
    {
        tracing::warn!(pod = %waiting, error = %e, "the plan could not be written on the waiting pod; nothing moved");
        ext.end_flight(&waiting.uid);
        return false;
    }
    let owner = owner_of(&waiting);
    io.note(
        &owner,
        false,
        EVENT_ACTION,
        EVENT_MOVING,
        &format!(
            "{words}: the targets are held, and the pods are evicted through the Eviction API (defrag.mode: on)"
        ),
    )
    .await;
    tracing::info!(pod = %waiting, plan = %words, "defragmentation plan begun");
    for m in &moves {
        memory.cooled.insert(m.workload.clone(), Instant::now());
    }
    evict_due(io, ext, policy, metrics, &waiting).await
}

/// Evicts the next moves of waiting pod `waiting`'s plan, in the plan's order, while fewer than
/// `defrag.movesAtOnce` moves are under way over every plan. Whether the plan is still under
/// way (`false`: an eviction was refused or failed, and the plan was unwound).
async fn evict_due<E: Executor>(
    io: &E,
    ext: &ExtenderState,
    policy: &DefragPolicy,
    metrics: &Metrics,
    waiting: &PodId,
) -> bool {
    loop {
        if ext.moves_under_way() >= policy.moves_at_once as usize {
            return true;
        }
        let Some((i, m)) = ext
            .with_flight(&waiting.uid, |f| {
                let i = f.next_eviction()?;
                // Under way before the call: its replacement may reach filter before the answer.
                f.legs[i] = Leg::Evicted;
                Some((i, f.plan.moves[i].clone()))
            })
            .flatten()
        else {
            return true;
        };
        let Some((namespace, name)) = m.key.split_once('/') else {
            let why = GiveUp::Failed {
                pod: m.key.clone(),
                why: "not a namespace/name".into(),
            };
            unwind(io, ext, metrics, waiting, why).await;
            return false;
        };
        let moved = Owner {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: m.id.clone(),
        };
        let answer = io.evict(&moved).await;
        let why = match answer {
            Ok(Evicted::Done) | Ok(Evicted::Gone) => {
                let gone = matches!(answer, Ok(Evicted::Gone));
                metrics.defrag_eviction(if gone { "gone" } else { "evicted" });
                if !gone {
                    io.note(
                        &moved,
                        false,
                        EVENT_ACTION,
                        EVENT_MOVED,
                        &format!(
                            "evicted to make room for {waiting} on node {}: its replacement is steered to node {}, where its room is held",
                            m.from, m.to
                        ),
                    )
                    .await;
                }
                tracing::info!(pod = %m.key, from = %m.from, to = %m.to, waiting = %waiting, gone, move_index = i, "moved");
                continue;
            }
            Ok(Evicted::Refused(why)) => {
                metrics.defrag_eviction("refused");
                GiveUp::Refused {
                    pod: m.key.clone(),
                    why,
                }
            }
            Err(e) => {
                metrics.defrag_eviction("failed");
                GiveUp::Failed {
                    pod: m.key.clone(),
                    why: e.to_string(),
                }
            }
        };
        unwind(io, ext, metrics, waiting, why).await;
        return false;
    }
}

/// Gives up waiting pod `waiting`'s plan: its holds released, its annotation taken off, and
/// the pod told why.
pub async fn unwind<E: Executor>(
    io: &E,
    ext: &ExtenderState,
    metrics: &Metrics,
    waiting: &PodId,
    why: GiveUp,
) {
    let had = ext.end_flight(&waiting.uid);
    ext.plans.take_down(&waiting.uid);
    metrics.defrag_given_up(why.label());
    if let Err(e) = io
        .annotate(&waiting.namespace, &waiting.name, ANNOTATION_PLAN, None)
        .await
    {
        tracing::debug!(pod = %waiting, error = %e, "the plan's annotation was not taken off; the next leading replica does");
    }
    let plan = had.map_or_else(
        || "a defragmentation plan".to_string(),
        |f| format!("the plan ({})", f.plan),
    );
    let note = format!("gave up {plan}: {why}; its holds are released");
    io.note(&owner_of(waiting), true, EVENT_ACTION, EVENT_GAVE_UP, &note)
        .await;
    tracing::info!(pod = %waiting, reason = why.label(), "{note}");
}

/// Whether the waiting pod still waits (`Some(true)`), is gone (`Some(false)`), or is bound
/// (`None`, with its node); `Err` where it could not be read this time.
async fn waiting_state<E: Executor>(
    io: &E,
    id: &PodId,
) -> Result<(Option<bool>, Option<String>), ()> {
    match io.get_pod(&id.namespace, &id.name).await {
        Ok(pod) if pod.metadata.uid.as_deref() != Some(id.uid.as_str()) => Ok((Some(false), None)),
        Ok(pod) if pod.metadata.deletion_timestamp.is_some() => Ok((Some(false), None)),
        Ok(pod) => match pod.spec.and_then(|s| s.node_name) {
            Some(node) => Ok((None, Some(node))),
            None => Ok((Some(true), None)),
        },
        Err(ReadBackError::Api(kube::Error::Api(s))) if s.code == 404 => Ok((Some(false), None)),
        Err(e) => {
            tracing::debug!(pod = %id, error = %e, "a plan's waiting pod not read; followed again next tick");
            Err(())
        }
    }
}

/// Follows every plan under way: replacements that took their promise, the next evictions where
/// earlier replacements landed, the waiting pod placed (its node's fence lifted), done, or given
/// up.
pub async fn advance<E: Executor>(
    io: &E,
    ext: &ExtenderState,
    scorer: &Scorer,
    policy: &DefragPolicy,
    metrics: &Metrics,
) {
    ext.note_landings(scorer);
    for flight in ext.flights() {
        let id = flight.waiting.clone();
        let Ok((waiting, bound_on)) = waiting_state(io, &id).await else {
            continue;
        };
        let Some(next) = ext.with_flight(&id.uid, |f| {
            f.tick(now_secs(), waiting, bound_on.as_deref())
        }) else {
            continue;
        };
        match next {
            Next::Wait => {
                if !evict_due(io, ext, policy, metrics, &id).await {
                    continue;
                }
                if let Some(f) = ext.with_flight(&id.uid, |f| f.clone()) {
                    if f.placed {
                        ext.lift_fence(&id.uid);
                    }
                    ext.plans.post(&id.uid, &f.plan.node, f.words());
                }
            }
            Next::Done | Next::DoneWithout => {
                let Some(f) = ext.end_flight(&id.uid) else {
                    continue;
                };
                ext.plans.take_down(&id.uid);
                metrics.defrag_gpus_freed(f.plan.placement.gpus.len().max(1) as u64);
                if let Err(e) = io
                    .annotate(&id.namespace, &id.name, ANNOTATION_PLAN, None)
                    .await
                {
                    tracing::debug!(pod = %id, error = %e, "the plan's annotation was not taken off a placed pod");
                }
                let landed = f.legs.iter().filter(|l| **l == Leg::Landed).count();
                let note = format!(
                    "placed on node {} after {} move(s) ({landed} replacement(s) placed on their held targets)",
                    f.plan.node,
                    f.legs.len()
                );
                io.note(&owner_of(&id), false, EVENT_ACTION, EVENT_PLACED, &note)
                    .await;
                tracing::info!(pod = %id, "{note}");
            }
            Next::GiveUp(why) => unwind(io, ext, metrics, &id, why).await,
        }
    }
}

/// Ends every plan under way without a word to the pods: this replica no longer leads. The
/// holds go; a plan's annotation stays for the replica that leads next, which unwinds it.
pub fn drop_all(ext: &ExtenderState) {
    for f in ext.flights() {
        ext.end_flight(&f.waiting.uid);
    }
}

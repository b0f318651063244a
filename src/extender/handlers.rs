//! `POST /scheduler/{filter,prioritize}` and `GET /v1/nodes` (bind is `super::bind`, preempt
//! `super::preempt`). filter and prioritize are plain functions over [`ExtenderState`] with no
//! I/O; the axum handlers around them parse, time and reply.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::pending::Found;
use super::report::{NodeReport, report};
use super::state::{ExtenderState, Mode};
use super::tie_break;

use super::Context;
use super::wire::{self, ExtenderArgs, ExtenderFilterResult, HostPriority, NodeList};
use crate::ledger;
use crate::metrics::Metrics;
use crate::packing::{self, Demand, Reason};
use crate::policy::Candidates;
use crate::shared::{LoadedPolicy, json_error};

/// What the verbs say while the caches have not synced.
pub const NOT_SYNCED: &str = "gpu-share extender is not ready: its node and pod caches have not synced yet, and it will not guess from an empty ledger";

/// The most nodes one filter or prioritize request may name: twice the largest cluster any
/// platform supports (GKE: 65,000 nodes). Past it the work per request has no useful bound.
pub const MAX_NODES_PER_REQUEST: usize = 130_000;

/// Why a verb has no answer (filter carries these in its `Error` field instead).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerbError {
    /// The caches have not synced: 503, the service is not ready.
    #[error("{NOT_SYNCED}")]
    NotSynced,
    /// The request breaks the extender protocol (no Pod, no nodes): 400.
    #[error("{0}")]
    BadRequest(&'static str),
    /// More nodes than [`MAX_NODES_PER_REQUEST`]: 413.
    #[error(
        "the request names {0} nodes; gpu-share takes at most {MAX_NODES_PER_REQUEST} per request"
    )]
    TooManyNodes(usize),
}

impl VerbError {
    /// The HTTP status of the reply, and the outcome label of the request metric.
    pub fn status(&self) -> (StatusCode, &'static str) {
        match self {
            VerbError::NotSynced => (StatusCode::SERVICE_UNAVAILABLE, "not_ready"),
            VerbError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            VerbError::TooManyNodes(_) => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
        }
    }
}

/// The nodes a filter/prioritize request is about.
enum NodeSet {
    /// `nodeCacheCapable: true`.
    Names(Vec<String>),
    /// Full Node objects, kept as received (to echo them).
    Full(Vec<Value>),
}

impl NodeSet {
    /// Takes the nodes out of the request (thousands of names or Node objects: not copied).
    fn take(args: &mut ExtenderArgs) -> Result<NodeSet, VerbError> {
        let set = match (args.node_names.take(), args.nodes.take()) {
            (Some(names), _) => NodeSet::Names(names),
            (None, Some(list)) => NodeSet::Full(list.items),
            (None, None) => {
                return Err(VerbError::BadRequest(
                    "request has neither Nodes nor NodeNames",
                ));
            }
        };
        let n = match &set {
            NodeSet::Names(v) => v.len(),
            NodeSet::Full(v) => v.len(),
        };
        if n > MAX_NODES_PER_REQUEST {
            return Err(VerbError::TooManyNodes(n));
        }
        Ok(set)
    }
}

fn node_name(v: &Value) -> String {
    v.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// The fit of a demand on each named node (in order), with its packing score where a scorer is
/// given and finds a placement; nodes outside the inventory are not GPU nodes (cluster mode, or
/// known as such) or unknown.
fn verdicts(
    ext: &ExtenderState,
    names: &[String],
    demand: &Demand,
    scorer: Option<&packing::Scorer>,
    pod: &ledger::BindPod,
) -> Vec<Result<Option<f64>, Reason>> {
    let held_off = if demand.pointed() {
        ext.ledger().held_off_now()
    } else {
        Default::default()
    };
    // Defragmentation: a moved pod's replacement goes to the room held for it alone, and the
    // nodes where plans make room take their waiting pods alone.
    // Passed the nodes kube-scheduler sent only: a target it left out (its own checks refused
    // it) is no reason to refuse the pod everywhere else.
    let steer = ext.steer(pod).filter(|s| names.contains(&s.node));
    let fences = ext.ledger().fences_now();
    ext.ledger()
        .with_nodes_scoring(names, |node, usage, memo| {
            packing::fit(node, usage, demand).map(|()| {
                scorer.and_then(|s| {
                    s.evaluate(node, usage, demand, memo)
                        .map(|(_, score)| score)
                })
            })
        })
        .into_iter()
        .zip(names)
        .map(|(r, name)| match r {
            _ if steer.is_some() => match &steer {
                Some(st) if st.node == *name => Ok(None),
                _ => Err(Reason::SteeredElsewhere),
            },
            Some(_) if fences.get(name).is_some_and(|f| f.waiting != pod.pod.uid) => {
                Err(Reason::HeldForPlan {
                    why: fences[name].why.clone(),
                })
            }
            Some(Ok(score)) => match held_off.get(name) {
                Some(why) => Err(Reason::ReservationFailed { why: why.clone() }),
                None => Ok(score),
            },
            Some(Err(r)) => Err(r),
            None if ext.mode() == Mode::Cluster || ext.knows_node(name) => Err(Reason::NotGpuNode),
            None => Err(Reason::UnknownNode),
        })
        .collect()
}

/// Filter: the fitting nodes the policy's `packing.candidates` passes on (the packing's best
/// tier, or every one); the other nodes with their reasons when none fits, or always under
/// `all`.
pub fn filter(
    ext: &ExtenderState,
    policy: &LoadedPolicy,
    metrics: &Metrics,
    mut args: ExtenderArgs,
) -> Filtered {
    let error = |e: String| Filtered {
        reply: ExtenderFilterResult {
            error: e,
            ..Default::default()
        },
        found: None,
    };
    if !ext.is_synced() {
        return error(NOT_SYNCED.to_string());
    }
    // The pod is kept (by UID) for bind: take it out of the request instead of copying it.
    let Some(pod) = args.pod.take().map(Arc::new) else {
        return error("request has no Pod".to_string());
    };
    let set = match NodeSet::take(&mut args) {
        Ok(s) => s,
        Err(e) => return error(e.to_string()),
    };
    let full_names: Vec<String> = match &set {
        NodeSet::Names(_) => Vec::new(),
        NodeSet::Full(items) => items.iter().map(node_name).collect(),
    };
    let names: &[String] = match &set {
        NodeSet::Names(n) => n,
        NodeSet::Full(_) => &full_names,
    };
    let seen = Arc::new(ledger::BindPod::of(&pod));
    let key = seen.key.clone();
    // A request annotation the pod's limits contradict: accounted by the limits, and said so in
    // every node's reason.
    let contradicted = ledger::request_contradiction(&pod);
    let first_seen = match &pod.metadata.uid {
        Some(uid) => ext.remember_pod(uid, seen.clone()),
        None => true,
    };
    // Per position in `names`: `None` when the node fits, else why not.
    let mut tags: Vec<Option<Reason>> = vec![None; names.len()];
    // Per position: the packing score of a fitting node, under `candidates: one` or `best`.
    let candidates = policy.policy.packing.candidates;
    let best_only = candidates != Candidates::All;
    let mut scores: Vec<Option<f64>> = vec![None; names.len()];
    let mut bad_request: Option<String> = None;
    let (mut failed_count, mut unresolvable_count) = (0, 0);
    match seen.demand.clone() {
        Err(e) => {
            metrics.rejection("bad_request", names.len() as u64);
            unresolvable_count = names.len();
            bad_request = Some(e.to_string());
        }
        Ok(None) => {}
        Ok(Some(mut demand)) => {
            demand.enforcement = policy.policy.enforcement.budgets;
            if first_seen {
                ext.observe_demand(&demand, policy.policy.packing.policy.into());
            }
            let mut by_reason: BTreeMap<&'static str, u64> = BTreeMap::new();
            let scorer = best_only.then(|| ext.scorer(policy.policy.packing.policy.into()));
            for (i, v) in verdicts(ext, names, &demand, scorer.as_ref(), &seen)
                .into_iter()
                .enumerate()
            {
                match v {
                    Ok(score) => scores[i] = score,
                    Err(r) => {
                        tracing::debug!(pod = %key, node = %names[i], reason = r.label(), "node rejected");
                        *by_reason.entry(r.label()).or_default() += 1;
                        if r.resolvable() {
                            failed_count += 1;
                        } else {
                            unresolvable_count += 1;
                        }
                        tags[i] = Some(r);
                    }
                }
            }
            for (r, c) in by_reason {
                metrics.rejection(r, c);
            }
            if failed_count > 0
                && failed_count + unresolvable_count == names.len()
                && let (Some(uid), Some(name), Some(ns)) = (
                    pod.metadata.uid.clone(),
                    pod.metadata.name.clone(),
                    pod.metadata.namespace.clone(),
                )
            {
                ext.note_no_room(
                    &uid,
                    super::state::NoRoom {
                        namespace: ns,
                        name,
                        class: demand.gpu.class(),
                    },
                );
            }
        }
    }
    let fit = names.len() - failed_count - unresolvable_count;
    if let Some(why) = &contradicted
        && first_seen
    {
        tracing::warn!(pod = %key, reason = %why, "request annotation contradicted by the pod's limits");
    }
    // Whether a gpu-share pod found a node, and if not, why (its pending reason).
    let found = match &seen.demand {
        Ok(Some(demand)) if fit == 0 && !names.is_empty() => Some(Found::None {
            class: demand.gpu.class(),
            why: summary(&tags, bad_request.as_deref()),
        }),
        Ok(Some(_)) => Some(Found::Nodes),
        _ => None,
    };
    // Under `best`, once a node fits: the best tier only, and no reasons (kube-scheduler reports
    // them only for a pod no node takes). A fitting node the scorer finds no placement on is
    // passed when no fitting node scores at all.
    let cut = best_only && fit > 0 && bad_request.is_none();
    // Under `one`, a single node of the tier where kube-scheduler's scores would rank the tied
    // nodes alike; `tie` says why the whole tier went on otherwise.
    let (passed, tie): (Vec<bool>, &str) = if cut && scores.iter().any(Option::is_some) {
        let tier = packing::best_tier(&scores);
        if candidates != Candidates::One {
            (tier, "")
        } else {
            let nodes = ext.nodes();
            let preference = tie_break::pod_preference(&pod);
            // A spread pod: the tier ranked as kube-scheduler's default spread would rank it.
            let spread = match &preference {
                Some(tie_break::Preference::Spread(controller)) => {
                    let members: Vec<&str> = names
                        .iter()
                        .zip(&tier)
                        .filter(|(_, t)| **t)
                        .map(|(n, _)| n.as_str())
                        .collect();
                    let counts = ext.ledger().spread_counts(controller);
                    Some(tie_break::spread_scores(&members, &counts, |n| {
                        nodes.get(n).map(|f| &f.labels)
                    }))
                }
                _ => None,
            };
            match tie_break::pick(
                names,
                &tier,
                preference.as_ref(),
                |n| nodes.get(n).map(|f| f.soft_taints.as_slice()),
                spread.as_deref(),
            ) {
                tie_break::Pass::One(i) => ((0..names.len()).map(|j| j == i).collect(), ""),
                tie_break::Pass::Tier(why) => (tier, why),
            }
        }
    } else {
        (tags.iter().map(Option::is_none).collect(), "")
    };
    let passed_count = passed.iter().filter(|p| **p).count();
    tracing::info!(pod = %key, nodes = names.len(), fit, passed = passed_count, failed = failed_count, unresolvable = unresolvable_count, tie, "filter");
    // The names move into the answer (thousands of them: not copied), each with its reason.
    let (failed_cap, unresolvable_cap) = if cut {
        (0, 0)
    } else {
        (failed_count, unresolvable_count)
    };
    let mut failed = wire::NodeReasons::with_capacity(failed_cap);
    let mut unresolvable = wire::NodeReasons::with_capacity(unresolvable_cap);
    let mut sort = |name: String, tag: Option<Reason>, pass: bool| -> Option<String> {
        if let Some(msg) = &bad_request {
            unresolvable.push(name, msg.clone().into());
            return None;
        }
        match tag {
            None => pass.then_some(name),
            Some(_) if cut => None,
            Some(r) => {
                let reason: std::borrow::Cow<'static, str> = match &contradicted {
                    None => r.message_static(),
                    Some(why) => format!("{} ({why})", r.message_static()).into(),
                };
                if r.resolvable() {
                    failed.push(name, reason);
                } else {
                    unresolvable.push(name, reason);
                }
                None
            }
        }
    };
    let mut result = ExtenderFilterResult::default();
    match set {
        NodeSet::Names(n) => {
            let kept: Vec<String> = n
                .into_iter()
                .zip(tags)
                .zip(passed)
                .filter_map(|((name, tag), pass)| sort(name, tag, pass))
                .collect();
            result.node_names = Some(kept);
        }
        NodeSet::Full(items) => {
            let kept: Vec<Value> = items
                .into_iter()
                .zip(full_names)
                .zip(tags)
                .zip(passed)
                .filter_map(|(((item, name), tag), pass)| sort(name, tag, pass).map(|_| item))
                .collect();
            result.nodes = Some(NodeList {
                metadata: None,
                items: kept,
            });
        }
    }
    result.failed_nodes = Some(failed);
    result.failed_and_unresolvable_nodes = Some(unresolvable);
    Filtered {
        reply: result,
        found,
    }
}

/// Filter's reply, and whether the gpu-share pod it was asked about found a node.
pub struct Filtered {
    pub reply: ExtenderFilterResult,
    /// `None` for a pod that asks no GPU, or whose request cannot be read.
    pub found: Option<Found>,
}

/// Prioritize: 0..=10 per node from the policy's packing score; nodes that do not fit get 0,
/// and so does every node for a pod whose request cannot be read (filter has already refused
/// it in words on every node, so kube-scheduler does not get here with it).
pub fn prioritize(
    ext: &ExtenderState,
    policy: &LoadedPolicy,
    mut args: ExtenderArgs,
) -> Result<Vec<HostPriority>, VerbError> {
    if !ext.is_synced() {
        return Err(VerbError::NotSynced);
    }
    let pod = args
        .pod
        .take()
        .map(Arc::new)
        .ok_or(VerbError::BadRequest("request has no Pod"))?;
    let set = NodeSet::take(&mut args)?;
    let names: Vec<String> = match set {
        NodeSet::Names(n) => n,
        NodeSet::Full(items) => items.iter().map(node_name).collect(),
    };
    let kept = Arc::new(ledger::BindPod::of(&pod));
    if let Some(uid) = &pod.metadata.uid {
        ext.remember_pod(uid, kept.clone());
    }
    let demand = match &kept.demand {
        Ok(d) => d.clone(),
        Err(e) => {
            tracing::warn!(pod = %kept.key, error = %e, "prioritize: the pod's request cannot be read; every node scores 0");
            None
        }
    };
    let Some(demand) = demand else {
        return Ok(names
            .into_iter()
            .map(|host| HostPriority { host, score: 0 })
            .collect());
    };
    let scorer = ext.scorer(policy.policy.packing.policy.into());
    let raw = raw_scores(ext, &scorer, &names, &demand);
    Ok(names
        .into_iter()
        .zip(packing::node_scores(&raw))
        .map(|(host, score)| HostPriority { host, score })
        .collect())
}

/// Each named node's packing score for `demand` (`None`: it does not fit there, or is unknown),
/// as prioritize computes it.
pub fn raw_scores(
    ext: &ExtenderState,
    scorer: &packing::Scorer,
    names: &[String],
    demand: &packing::Demand,
) -> Vec<Option<f64>> {
    ext.ledger()
        .with_nodes_scoring(names, |node, usage, memo| {
            packing::place(scorer, node, usage, demand, memo)
                .ok()
                .map(|(_, s)| s)
        })
        .into_iter()
        .map(Option::flatten)
        .collect()
}

// ---- axum glue -------------------------------------------------------------------------------

/// What every verb starts with: the extender's state and the parsed body, or the reply (404 when
/// the extender role is off, 400 with the reason for a body that is not well-formed). The error
/// is the finished reply, returned at once, so its size does not matter.
#[allow(clippy::result_large_err)]
pub(super) fn begin<'s, T>(
    state: &'s Context,
    verb: &'static str,
    start: Instant,
    parsed: Result<T, wire::WireError>,
) -> Result<(&'s ExtenderState, T), Response> {
    let Some(ext) = state.extender.as_deref() else {
        return Err(json_error(
            StatusCode::NOT_FOUND,
            "extender role not enabled",
        ));
    };
    parsed.map(|args| (ext, args)).map_err(|e| {
        state.metrics.observe(verb, "bad_request", start.elapsed());
        json_error(StatusCode::BAD_REQUEST, &e.to_string())
    })
}

/// Replies for the verbs whose Go result type has no `Error` field: any non-200 status is an
/// error to kube-scheduler.
pub(super) fn reply<T: serde::Serialize>(
    state: &Context,
    verb: &'static str,
    start: Instant,
    result: Result<T, VerbError>,
) -> Response {
    match result {
        Ok(r) => {
            state.metrics.observe(verb, "ok", start.elapsed());
            axum::Json(r).into_response()
        }
        Err(e) => {
            let (status, outcome) = e.status();
            state.metrics.observe(verb, outcome, start.elapsed());
            json_error(status, &e.to_string())
        }
    }
}

pub async fn filter_handler(State(state): State<Context>, body: Bytes) -> Response {
    let start = Instant::now();
    let (ext, args) = match begin(&state, "filter", start, wire::parse_args(&body)) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let policy = state.policy.current();
    // `--dev` learns from the request what a cluster's watches would feed the cache.
    let asked = (ext.mode() == Mode::Dev)
        .then(|| {
            super::dev::learn_nodes(ext, &args, &policy.reading);
            super::dev::asked(ext, &args)
        })
        .flatten();
    let Filtered {
        reply: result,
        found,
    } = filter(ext, &policy, &state.metrics, args);
    if let (Some(pod), Some(found)) = (asked, &found) {
        super::dev::filtered(ext, pod, found);
    }
    let fitting = match (&result.node_names, &result.nodes) {
        (Some(n), _) => n.len(),
        (None, Some(list)) => list.items.len(),
        (None, None) => 0,
    };
    let outcome = match (result.error.is_empty(), fitting) {
        (false, _) => "error",
        (true, 0) => "no_fit",
        (true, _) => "fit",
    };
    state.metrics.observe("filter", outcome, start.elapsed());
    axum::Json(result).into_response()
}

pub async fn prioritize_handler(State(state): State<Context>, body: Bytes) -> Response {
    let start = Instant::now();
    match begin(&state, "prioritize", start, wire::parse_args(&body)) {
        Ok((ext, args)) => {
            let policy = state.policy.current();
            if ext.mode() == Mode::Dev {
                super::dev::learn_nodes(ext, &args, &policy.reading);
            }
            let result = prioritize(ext, &policy, args);
            reply(&state, "prioritize", start, result)
        }
        Err(r) => r,
    }
}

/// Why no node fit, as sentences: `0/4 nodes fit. 3 nodes: <why>. 1 node: <why>.` (most common
/// first), or why the request itself cannot be read.
fn summary(tags: &[Option<Reason>], bad_request: Option<&str>) -> String {
    if let Some(bad) = bad_request {
        return format!("the request cannot be read: {bad}");
    }
    // Counted by the fixed sentences, borrowed: filter says this for every pod no node takes.
    let mut counts: BTreeMap<std::borrow::Cow<'static, str>, usize> = BTreeMap::new();
    for r in tags.iter().flatten() {
        *counts.entry(r.message_static()).or_default() += 1;
    }
    let mut counts: Vec<(std::borrow::Cow<'static, str>, usize)> = counts.into_iter().collect();
    counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let parts: Vec<String> = counts
        .iter()
        .map(|(m, n)| format!(" {n} node{}: {m}.", if *n == 1 { "" } else { "s" }))
        .collect();
    format!("0/{} nodes fit.{}", tags.len(), parts.concat())
}

/// `GET /v1/nodes`.
pub async fn nodes_handler(State(state): State<Context>) -> Response {
    let Some(ext) = state.extender.as_deref() else {
        return json_error(StatusCode::NOT_FOUND, "extender role not enabled");
    };
    let policy = state.policy.current();
    let reservations = super::report::by_node(ext.reservations.pods());
    let nodes = ext.nodes();
    let mut plans = ext.plans.by_node();
    let reports: Vec<NodeReport> = ext
        .ledger()
        .snapshot()
        .values()
        .map(|nl| {
            let r = reservations.get(&nl.node.name).map(Vec::as_slice);
            NodeReport {
                cordoned: nodes.get(&nl.node.name).is_some_and(|f| f.cordoned),
                defrag_plans: plans.remove(&nl.node.name).unwrap_or_default(),
                ..report(nl, &policy.mig, r.unwrap_or_default())
            }
        })
        .collect();
    axum::Json(reports).into_response()
}

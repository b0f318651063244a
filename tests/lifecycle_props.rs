//! The pod lifecycle as a property: random interleavings of
//! - watch events, delivered late, cut (the undelivered ones lost) and relisted;
//! - reconciles whose lists are taken before other events and applied after them;
//! - binds with every outcome the API can give: done, refused, timed out but landed, timed out
//!   and lost, each read back or left in doubt until a later read answers;
//! - the reservation creates a share's bind makes, with the same outcomes;
//! - pods finishing and deleted (reservations too, as by hand), and restarts;
//! - a node whose GPUs NVIDIA's DRA driver publishes: a pod bound there is given its device by
//!   kube-scheduler's DRA plugin, in a ResourceClaim allocated before the binding and deleted
//!   when the pod is done or its binding did not happen; the claims' watch is late and cut
//!   apart from the pods'.
//!
//! After every step: no GPU of the API's pods past its capacity (the extender decides every
//! bind, so an overcommit there is the state's fault), the ledger within capacity, and no
//! holding for a pod the API never had. Once every bind is answered, every doubt read back,
//! every event delivered and a fresh list reconciled, the ledger holds what the API says: each
//! device-plugin pod on its node, each claim on its device, and nothing of their own for the
//! pods the claims stand for.
//!
//! Bind's steps are bind's own: its decision (`bind::decide`: reserve, and hold the reservation
//! on its way) and its settling by the answers to its calls (`Decision::settle`: the create's,
//! then the binding's, with `read_back_needed` saying when the pod is read back), each API
//! answer chosen by the case. Only the calls between them are the case's: a create's answer is
//! made when the bind begins, the binding's later, and the decision settles by both, as
//! `Executor::carry_out_bind` hands them back (at once, where the create failed).
//! The replays at the end are the two races the fault runner found; each fails with its fix
//! taken out (docs/lifecycle.md says how).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use gpu_share::dra::{ResourceClaim, ResourceSlice};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::watcher::Event;
use proptest::prelude::*;
use serde_json::{Value, json};

use gpu_share::cluster::reservation_api::CreateError;
use gpu_share::dra::claim::EXTENDED_RESOURCE_CLAIM;
use gpu_share::extender::bind::{
    BindAnswers, BindCallError, Decision, Ended, ReadBackError, Settled, decide, read_back_needed,
};
use gpu_share::extender::dra::Relisted;
use gpu_share::extender::state::{ExtenderState, Mode};
use gpu_share::extender::sync::Relist;
use gpu_share::ledger::{ANNOTATION_GPUS, BindPod, Holder};
use gpu_share::policy::Policy;
use gpu_share::shared::{LoadedPolicy, PolicyStore};

/// The device plugin's nodes (per-GPU sharing), then the DRA node.
const NODES: [&str; 3] = ["n1", "n2", DRA_NODE];
/// A node of two whole GPUs whose ResourceSlices NVIDIA's DRA driver's own code published
/// (`tests/fixtures/nvidia-dra/`).
const DRA_NODE: &str = "dra-h100-2gpu-whole";
const GPUS: u32 = 2;
/// Longer than any case runs: an assumption never lapses mid-case (expiry is time's, not the
/// case's, to choose).
const ASSUME_TTL: Duration = Duration::from_secs(600);

/// What a pod asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// One whole GPU.
    Exclusive,
    /// A time-sliced share of 30% in per-GPU form: its GPU held by a reservation.
    Share,
}

/// What the API does with a call that leaves the extender (a binding, a reservation create).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// Done, and said so.
    Done,
    /// Refused (4xx): nothing done.
    Refused,
    /// No answer, but done.
    Landed,
    /// No answer, and not done.
    Lost,
}

/// One step of a case. Indices pick among what exists then (modulo its count); a step with
/// nothing to pick does nothing.
#[derive(Debug, Clone)]
enum Step {
    Create(Kind),
    /// kube-scheduler binds a pending pod to a node: bind reserves, and for a share on a GPU
    /// with no reservation, holds it and creates the reservation (`create` answers at once).
    /// The binding call then is in flight. On the DRA node the pod's claim is allocated first,
    /// and with `claim_seen` the claims' watch has delivered it before bind is asked.
    Bind {
        pod: usize,
        node: usize,
        create: Answer,
        claim_seen: bool,
    },
    /// The binding call in flight answers; with no answer, bind reads the pod back
    /// (`read_back`) or leaves it in doubt.
    Answer {
        bind: usize,
        answer: Answer,
        read_back: bool,
    },
    /// A pod in doubt is read back.
    Resolve(usize),
    /// A bound pod finishes (Succeeded).
    Finish(usize),
    /// A pod is deleted (a reservation too, as by hand).
    Delete(usize),
    /// The watch delivers its next events.
    Deliver(usize),
    /// The watch is cut: what it had not delivered is lost, and it lists again.
    Cut,
    /// The claims' watch delivers its next events.
    DeliverClaims(usize),
    /// The claims' watch is cut and lists again.
    CutClaims,
    /// A reconcile lists the API now.
    List,
    /// ... and applies its oldest list now.
    Reconcile,
    /// The extender restarts: binds in flight end as the API took them (`landed`), and the
    /// new process lists everything.
    Restart {
        landed: bool,
    },
}

/// A pod as the API has it.
#[derive(Debug, Clone)]
struct ApiPod {
    pod: Value,
    deleted: bool,
}

/// A ResourceClaim as the API has it: allocated on the DRA node for one pod.
#[derive(Debug, Clone)]
struct ApiClaim {
    pod: String,
    /// The device's index on the DRA node (`gpu-<i>`).
    gpu: u32,
}

/// A bind whose call is in flight.
struct InFlight<'a> {
    decision: Decision<'a>,
    uid: String,
    /// The reservation's create, made: the pod as created, `None` where it existed.
    created: Option<Box<Option<Pod>>>,
}

/// The API and the extender, step by step.
struct World {
    api: BTreeMap<String, ApiPod>,
    /// Every UID the API ever had.
    ever: BTreeSet<String>,
    /// What the watch has not delivered yet.
    watch: VecDeque<Event<Pod>>,
    /// Lists taken for reconciles, oldest first.
    lists: VecDeque<(Vec<Pod>, Instant)>,
    /// The UIDs of pods in doubt.
    doubt: Vec<String>,
    /// The claims by UID, and what the claims' watch has not delivered yet.
    claims: BTreeMap<String, ApiClaim>,
    claim_watch: VecDeque<Event<ResourceClaim>>,
    slices: Vec<ResourceSlice>,
    serial: u32,
    policy: std::sync::Arc<LoadedPolicy>,
    nodes: Vec<Node>,
}

fn node(name: &str) -> Node {
    if name == DRA_NODE {
        // The DRA driver's node: no device plugin's labels or resources.
        return serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
            "nvidia.com/gpu.count": GPUS.to_string(),
            "nvidia.com/gpu.memory": "81920",
            "nvidia.com/gpu.replicas": "1",
            "gpu-share.io/sharing": "per-gpu"}},
        "status": {"allocatable": {"nvidia.com/gpu": GPUS.to_string()}}
    }))
    .unwrap()
}

fn new_pod(uid: &str, kind: Kind) -> Value {
    match kind {
        Kind::Exclusive => json!({
            "metadata": {"name": uid, "namespace": "ml", "uid": uid,
                         "annotations": {"gpu-share.io/request": "exclusive"}},
            "spec": {"containers": [{"name": "c",
                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Pending"}
        }),
        Kind::Share => json!({
            "metadata": {"name": uid, "namespace": "ml", "uid": uid,
                         "annotations": {"gpu-share.io/request": "timeslice-30"}},
            "spec": {"containers": [{"name": "c",
                "resources": {"limits": {"gpu-share.io/shared-gpu": "1"}},
                "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef":
                    {"name": format!("gpu-share-devices-{uid}"), "key": "NVIDIA_VISIBLE_DEVICES"}}}]}]},
            "status": {"phase": "Pending"}
        }),
    }
}

/// The DRA node's slices, as the driver's code published them.
fn dra_slices() -> Vec<ResourceSlice> {
    let path = format!(
        "{}/tests/fixtures/nvidia-dra/{DRA_NODE}.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(path).unwrap();
    gpu_share::documents::objects(&text)
        .unwrap()
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect()
}

/// The name of the claim kube-scheduler makes for `pod`'s extended resources.
fn claim_name(pod: &str) -> String {
    format!("{pod}-extended-resources-x")
}

/// The claim kube-scheduler writes for a pod's `nvidia.com/gpu` on the DRA node (KEP-5004),
/// allocated device `gpu-<gpu>`.
fn claim_object(uid: &str, c: &ApiClaim) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": claim_name(&c.pod), "namespace": "ml",
            "uid": uid, "annotations": {EXTENDED_RESOURCE_CLAIM: "true"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": c.pod,
                                 "uid": c.pod, "controller": true}]},
        "spec": {"devices": {"requests": [{"name": "container-0-request-0",
            "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount",
                        "count": 1}}]}},
        "status": {
            "allocation": {"devices": {"results": [{"request": "container-0-request-0",
                "driver": gpu_share::dra::DRIVER, "pool": DRA_NODE,
                "device": format!("gpu-{}", c.gpu)}]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name",
                    "operator": "In", "values": [DRA_NODE]}]}]}},
            "reservedFor": [{"resource": "pods", "name": c.pod, "uid": c.pod}]
        }
    }))
    .unwrap()
}

fn typed(v: &Value) -> Pod {
    serde_json::from_value(v.clone()).unwrap()
}

fn node_of(v: &Value) -> Option<&str> {
    v["spec"]["nodeName"].as_str()
}

fn finished(v: &Value) -> bool {
    matches!(v["status"]["phase"].as_str(), Some("Succeeded" | "Failed"))
}

impl World {
    fn new() -> Self {
        World {
            api: BTreeMap::new(),
            ever: BTreeSet::new(),
            watch: VecDeque::new(),
            lists: VecDeque::new(),
            doubt: Vec::new(),
            claims: BTreeMap::new(),
            claim_watch: VecDeque::new(),
            slices: dra_slices(),
            serial: 0,
            policy: PolicyStore::new(Policy::default_policy()).current(),
            nodes: NODES.iter().map(|n| node(n)).collect(),
        }
    }

    /// A new extender process: nodes and pods listed, synced.
    fn start(&self) -> ExtenderState {
        let e = ExtenderState::new(Mode::Cluster, ASSUME_TTL);
        let mut r = Relist::default();
        e.apply_node_event(&mut r, Event::Init, &self.policy.reading);
        for n in &self.nodes {
            e.apply_node_event(&mut r, Event::InitApply(n.clone()), &self.policy.reading);
        }
        e.apply_node_event(&mut r, Event::InitDone, &self.policy.reading);
        let mut r = Relisted::default();
        e.apply_slice_event(&mut r, Event::Init);
        for s in &self.slices {
            e.apply_slice_event(&mut r, Event::InitApply(s.clone()));
        }
        e.apply_slice_event(&mut r, Event::InitDone);
        self.relist_claims(&e);
        let mut r = Relist::default();
        e.apply_pod_event(&mut r, Event::Init);
        for p in self.listed() {
            e.apply_pod_event(&mut r, Event::InitApply(p));
        }
        e.apply_pod_event(&mut r, Event::InitDone);
        e.mark_synced();
        e
    }

    /// The claims' watch lists again (after a cut, or at start).
    fn relist_claims(&self, e: &ExtenderState) {
        let mut r = Relisted::default();
        e.apply_claim_event(&mut r, Event::Init);
        for (uid, c) in &self.claims {
            e.apply_claim_event(&mut r, Event::InitApply(claim_object(uid, c)));
        }
        e.apply_claim_event(&mut r, Event::InitDone);
    }

    /// kube-scheduler's DRA plugin allocates `pod` a free device of the DRA node (first fit):
    /// the claim's UID, or `None` when every device is taken (the plugin filters the node out).
    fn allocate(&mut self, pod: &str) -> Option<String> {
        let gpu = (0..GPUS).find(|g| !self.claims.values().any(|c| c.gpu == *g))?;
        self.serial += 1;
        let uid = format!("c{}", self.serial);
        let c = ApiClaim {
            pod: pod.to_string(),
            gpu,
        };
        self.claim_watch
            .push_back(Event::Apply(claim_object(&uid, &c)));
        self.claims.insert(uid.clone(), c);
        Some(uid)
    }

    /// The claims of `pod` go: it is done, gone, or its binding did not happen.
    fn deallocate(&mut self, pod: &str) {
        let gone: Vec<String> = self
            .claims
            .iter()
            .filter(|(_, c)| c.pod == pod)
            .map(|(u, _)| u.clone())
            .collect();
        for uid in gone {
            let c = self.claims.remove(&uid).unwrap();
            self.claim_watch
                .push_back(Event::Delete(claim_object(&uid, &c)));
        }
    }

    /// Deallocates the claim of `pod` unless the API has it bound and unfinished.
    fn deallocate_unless_running(&mut self, pod: &str) {
        let running = self
            .api
            .get(pod)
            .is_some_and(|p| !p.deleted && node_of(&p.pod).is_some() && !finished(&p.pod));
        if !running {
            self.deallocate(pod);
        }
    }

    /// The API's pods, as a list shows them.
    fn listed(&self) -> Vec<Pod> {
        self.api
            .values()
            .filter(|p| !p.deleted)
            .map(|p| typed(&p.pod))
            .collect()
    }

    fn put(&mut self, uid: &str, pod: Value) {
        self.ever.insert(uid.to_string());
        self.watch.push_back(Event::Apply(typed(&pod)));
        self.api.insert(
            uid.to_string(),
            ApiPod {
                pod,
                deleted: false,
            },
        );
    }

    fn live(&self) -> impl Iterator<Item = (&String, &Value)> {
        self.api
            .iter()
            .filter(|(_, p)| !p.deleted)
            .map(|(u, p)| (u, &p.pod))
    }

    /// Pending pods no bind is on (kube-scheduler binds a pod once at a time).
    fn pending(&self, busy: &[InFlight<'_>]) -> Vec<String> {
        self.live()
            .filter(|(_, p)| node_of(p).is_none() && !finished(p))
            .filter(|(u, _)| !busy.iter().any(|b| &b.uid == *u))
            .map(|(u, _)| u.clone())
            .collect()
    }

    /// The API binds `uid` to `node` with bind's annotations.
    fn bind(&mut self, uid: &str, node: &str, annotations: &BTreeMap<String, String>) {
        let Some(p) = self.api.get(uid).filter(|p| !p.deleted) else {
            return;
        };
        if node_of(&p.pod).is_some() {
            return;
        }
        let mut pod = p.pod.clone();
        pod["spec"]["nodeName"] = json!(node);
        for (k, v) in annotations {
            pod["metadata"]["annotations"][k] = json!(v);
        }
        self.put(uid, pod);
    }

    /// The API creates GPU `gpu`'s reservation on `node`: the pod made, or `None` where one
    /// existed (the same reservation).
    fn create_reservation(&mut self, node: &str, gpu: u32) -> Option<Pod> {
        let name = gpu_share::reservation::name(node, gpu);
        if self
            .live()
            .any(|(_, p)| p["metadata"]["name"].as_str() == Some(&name))
        {
            return None;
        }
        self.serial += 1;
        let uid = format!("r{}", self.serial);
        let t = gpu_share::reservation::Template {
            image: "gpu-share:test".into(),
            ..Default::default()
        };
        let mut pod = gpu_share::reservation::pod(node, gpu, false, &t);
        pod["metadata"]["uid"] = json!(uid);
        pod["status"] = json!({"phase": "Pending"});
        self.put(&uid, pod.clone());
        Some(typed(&pod))
    }

    fn remove(&mut self, uid: &str) {
        if let Some(p) = self.api.get_mut(uid).filter(|p| !p.deleted) {
            p.deleted = true;
            let pod = typed(&p.pod);
            self.watch.push_back(Event::Delete(pod));
        }
    }

    /// Where the API has `uid` bound (a read back).
    fn bound_to(&self, uid: &str) -> Option<String> {
        self.api
            .get(uid)
            .filter(|p| !p.deleted)
            .and_then(|p| node_of(&p.pod).map(str::to_string))
    }

    /// The API's bound, unfinished pods: uid -> node.
    fn holders(&self) -> BTreeMap<String, String> {
        self.live()
            .filter(|(_, p)| !finished(p))
            .filter_map(|(u, p)| node_of(p).map(|n| (u.clone(), n.to_string())))
            .collect()
    }

    /// No GPU of the API's pods past its capacity: a GPU is given whole (an exclusive pod or a
    /// reservation) once at most, and its shares sum to 1000 at most.
    fn api_within_capacity(&self) -> Result<(), String> {
        let mut whole: BTreeMap<(String, u32), Vec<String>> = BTreeMap::new();
        let mut shares: BTreeMap<(String, u32), u32> = BTreeMap::new();
        for (uid, p) in self.live().filter(|(_, p)| !finished(p)) {
            // The DRA node's devices are the claims', one device each (first fit).
            let Some(n) = node_of(p).filter(|n| *n != DRA_NODE) else {
                continue;
            };
            let ann = &p["metadata"]["annotations"];
            if let Some(g) = ann["gpu-share.io/reserve-gpu"].as_str() {
                let g: u32 = g.parse().unwrap();
                whole.entry((n.into(), g)).or_default().push(uid.clone());
                continue;
            }
            let gpus = ann[ANNOTATION_GPUS].as_str().unwrap_or_default();
            for part in gpus.split(',').filter(|s| !s.is_empty()) {
                let (i, m) = part.split_once(':').unwrap_or((part, "1000"));
                let i: u32 = i.parse().unwrap();
                if ann["gpu-share.io/request"] == "exclusive" {
                    whole.entry((n.into(), i)).or_default().push(uid.clone());
                } else {
                    *shares.entry((n.into(), i)).or_default() += m.parse::<u32>().unwrap();
                }
            }
        }
        for (at, holders) in &whole {
            if holders.len() > 1 {
                return Err(format!("GPU {at:?} given whole to {holders:?}"));
            }
        }
        for (at, milli) in &shares {
            if *milli > 1000 {
                return Err(format!("GPU {at:?} shared {milli}/1000"));
            }
        }
        Ok(())
    }
}

/// Whether the ledger's holding `uid` is a pod's, not a stand-in's (the ledger says which).
fn holds_as_pod(e: &ExtenderState, uid: &str) -> bool {
    e.ledger()
        .holding(uid)
        .is_none_or(|h| h.pod.holder == Holder::Pod)
}

/// The invariants of every step. The ledger itself is held to its capacity once the watch has
/// delivered everything: an event older than what a read back learned (a pod bound, read back
/// gone, released; then the watch's event of its binding) places the pod again until the
/// deletion's event comes, on the safe side (more held, nothing given twice in the API).
fn check(w: &World, e: &ExtenderState) -> Result<(), String> {
    w.api_within_capacity()?;
    let delivered = |n: &&&str| w.watch.is_empty() && (**n != DRA_NODE || w.claim_watch.is_empty());
    for n in NODES.iter().filter(delivered) {
        let ok = e.ledger().with_node(n, |nl| nl.within_capacity());
        if ok != Some(true) {
            return Err(format!("the ledger's {n} past its capacity ({ok:?})"));
        }
    }
    for uid in e.ledger().uids().into_iter().filter(|u| holds_as_pod(e, u)) {
        if !w.ever.contains(&uid) {
            return Err(format!("the ledger holds {uid}, which the API never had"));
        }
    }
    Ok(())
}

/// Runs a case; `Err` says which step broke what.
fn run(steps: &[Step]) -> Result<(), String> {
    let mut w = World::new();
    let mut from = 0;
    loop {
        let e = w.start();
        let end = steps[from..]
            .iter()
            .position(|s| matches!(s, Step::Restart { .. }))
            .map(|i| from + i);
        let epoch = &steps[from..end.unwrap_or(steps.len())];
        let mut busy: Vec<InFlight<'_>> = Vec::new();
        for (i, step) in epoch.iter().enumerate() {
            apply(&mut w, &e, &mut busy, step)
                .and_then(|()| check(&w, &e))
                .map_err(|why| format!("step {} ({step:?}): {why}", from + i))?;
        }
        match end {
            Some(at) => {
                // The process dies: its binds in flight end as the API took them.
                let Step::Restart { landed } = steps[at] else {
                    unreachable!()
                };
                for b in busy.drain(..) {
                    if landed {
                        w.bind(&b.uid, &b.decision.node, &b.decision.annotations);
                    }
                    w.deallocate_unless_running(&b.uid);
                    drop(b.decision);
                }
                w.watch.clear();
                w.claim_watch.clear();
                w.lists.clear();
                w.doubt.clear();
                from = at + 1;
            }
            None => {
                return settle(&mut w, &e, busy).map_err(|why| format!("settled: {why}"));
            }
        }
    }
}

fn apply<'a>(
    w: &mut World,
    e: &'a ExtenderState,
    busy: &mut Vec<InFlight<'a>>,
    step: &Step,
) -> Result<(), String> {
    match *step {
        Step::Create(kind) => {
            w.serial += 1;
            let uid = format!("p{}", w.serial);
            w.put(&uid, new_pod(&uid, kind));
        }
        Step::Bind {
            pod,
            node,
            create,
            claim_seen,
        } => {
            let pending = w.pending(busy);
            if pending.is_empty() {
                return Ok(());
            }
            let uid = pending[pod % pending.len()].clone();
            let node = NODES[node % NODES.len()];
            if e.in_doubt(&uid).is_some() {
                return Ok(());
            }
            let pod = typed(&w.api[&uid].pod);
            // On the DRA node, the DRA plugin allocates an exclusive pod's claim before the
            // binding; with no device free it filters the node out.
            let asks_gpu =
                w.api[&uid].pod["metadata"]["annotations"]["gpu-share.io/request"] == "exclusive";
            if node == DRA_NODE && asks_gpu {
                if w.allocate(&uid).is_none() {
                    return Ok(());
                }
                if claim_seen {
                    let mut r = Relisted::default();
                    while let Some(ev) = w.claim_watch.pop_front() {
                        e.apply_claim_event(&mut r, ev);
                    }
                }
            }
            let p = BindPod::of(&pod);
            if p.demand.as_ref().is_ok_and(|d| d.is_none()) {
                return Err("a GPU pod read as plain".into());
            }
            let template = gpu_share::reservation::Template::default();
            // Refused in words: nothing reserved (and the claim unreserved).
            let Ok(decision) = decide(e, &w.policy, &template, &p, node, true) else {
                w.deallocate(&uid);
                return Ok(());
            };
            let mut made = None;
            if let Some(c) = &decision.create {
                let gpu = c.gpu;
                let created = match create {
                    Answer::Done => Ok(w.create_reservation(node, gpu)),
                    Answer::Refused => Err(CreateError::NoImage),
                    Answer::Landed => {
                        w.create_reservation(node, gpu);
                        Err(CreateError::Unanswered)
                    }
                    Answer::Lost => Err(CreateError::Unanswered),
                };
                match created {
                    Ok(pod) => made = Some(Box::new(pod)),
                    Err(error) => {
                        // The binding is not tried: the bind settles at once.
                        let settled = decision.settle(BindAnswers::NotCreated { gpu, error });
                        if !matches!(settled, Settled::Failed(_)) {
                            return Err(format!("a failed create settled as {settled:?}"));
                        }
                        w.deallocate(&uid);
                        return Ok(());
                    }
                }
            }
            busy.push(InFlight {
                decision,
                uid,
                created: made,
            });
        }
        Step::Answer {
            bind,
            answer,
            read_back,
        } => {
            if busy.is_empty() {
                return Ok(());
            }
            let b = busy.remove(bind % busy.len());
            let node = b.decision.node.clone();
            if matches!(answer, Answer::Done | Answer::Landed) {
                w.bind(&b.uid, &node, &b.decision.annotations);
            }
            // kube-scheduler unreserves a claim whose binding it did not see done.
            w.deallocate_unless_running(&b.uid);
            let why = match answer {
                Answer::Done => None,
                Answer::Refused => Some(BindCallError::Api(kube::Error::Api(
                    kube::core::Status::failure("pods \"p\" is forbidden", "Forbidden")
                        .with_code(403)
                        .boxed(),
                ))),
                Answer::Landed | Answer::Lost => Some(BindCallError::Unanswered),
            };
            let ended = match why {
                None => Ended::Bound,
                Some(why) => {
                    let read = read_back_needed(&why).then(|| {
                        if read_back {
                            Ok(w.bound_to(&b.uid))
                        } else {
                            Err(ReadBackError::Unanswered)
                        }
                    });
                    Ended::Failed { why, read }
                }
            };
            let answers = BindAnswers::Tried {
                created: b.created,
                ended,
            };
            if let Settled::InDoubt(_) = b.decision.settle(answers) {
                w.doubt.push(b.uid);
            }
        }
        Step::Resolve(i) => {
            if !w.doubt.is_empty() {
                let uid = w.doubt.remove(i % w.doubt.len());
                e.resolve(&uid, w.bound_to(&uid).as_deref());
            }
        }
        Step::Finish(i) => {
            let bound: Vec<String> = w
                .live()
                .filter(|(_, p)| node_of(p).is_some() && !finished(p))
                .map(|(u, _)| u.clone())
                .collect();
            if !bound.is_empty() {
                let uid = bound[i % bound.len()].clone();
                let mut pod = w.api[&uid].pod.clone();
                pod["status"]["phase"] = json!("Succeeded");
                w.put(&uid, pod);
                w.deallocate(&uid);
            }
        }
        Step::Delete(i) => {
            let live: Vec<String> = w.live().map(|(u, _)| u.clone()).collect();
            if !live.is_empty() {
                let uid = live[i % live.len()].clone();
                w.remove(&uid);
                w.deallocate(&uid);
            }
        }
        Step::Deliver(n) => {
            let mut r = Relist::default();
            for _ in 0..n {
                let Some(ev) = w.watch.pop_front() else { break };
                e.apply_pod_event(&mut r, ev);
            }
        }
        Step::Cut => {
            // The relist comes as one: kube's watcher buffers it to InitDone.
            w.watch.clear();
            let mut r = Relist::default();
            e.apply_pod_event(&mut r, Event::Init);
            for p in w.listed() {
                e.apply_pod_event(&mut r, Event::InitApply(p));
            }
            e.apply_pod_event(&mut r, Event::InitDone);
        }
        Step::DeliverClaims(n) => {
            let mut r = Relisted::default();
            for _ in 0..n {
                let Some(ev) = w.claim_watch.pop_front() else {
                    break;
                };
                e.apply_claim_event(&mut r, ev);
            }
        }
        Step::CutClaims => {
            w.claim_watch.clear();
            w.relist_claims(e);
        }
        Step::List => {
            let at = listed_at();
            w.lists.push_back((w.listed(), at));
        }
        Step::Reconcile => {
            if let Some((pods, at)) = w.lists.pop_front() {
                e.reconcile_with(&w.nodes, &pods, &w.policy.reading, at);
            }
        }
        Step::Restart { .. } => unreachable!("restarts end an epoch"),
    }
    Ok(())
}

/// When a list is taken: any change after it is later, on any clock's resolution.
fn listed_at() -> Instant {
    let at = Instant::now();
    while Instant::now() <= at {}
    at
}

/// Every bind answered (lost, read back), every doubt read back, every event delivered, a
/// fresh list reconciled: the ledger holds exactly the API's bound, unfinished pods, each on
/// its node (stand-ins aside: a create that got no answer and made nothing is held until its
/// assumption lapses), but for the DRA node's: there it holds the API's claims, each on its
/// device, and the pods they stand for hold nothing of their own.
fn settle<'a>(w: &mut World, e: &'a ExtenderState, busy: Vec<InFlight<'a>>) -> Result<(), String> {
    for b in busy {
        b.decision.abort();
    }
    for uid in std::mem::take(&mut w.doubt) {
        e.resolve(&uid, w.bound_to(&uid).as_deref());
    }
    let mut r = Relist::default();
    while let Some(ev) = w.watch.pop_front() {
        e.apply_pod_event(&mut r, ev);
    }
    let mut r = Relisted::default();
    while let Some(ev) = w.claim_watch.pop_front() {
        e.apply_claim_event(&mut r, ev);
    }
    check(w, e)?;
    let at = listed_at();
    e.reconcile_with(&w.nodes, &w.listed(), &w.policy.reading, at);
    check(w, e)?;
    let held: BTreeMap<String, String> = e
        .ledger()
        .uids()
        .into_iter()
        .filter(|u| holds_as_pod(e, u))
        .filter_map(|u| e.ledger().node_of(&u).map(|n| (u, n)))
        .collect();
    let mut api = w.holders();
    api.retain(|_, n| n != DRA_NODE);
    if held != api {
        return Err(format!("the ledger holds {held:?}, the API {api:?}"));
    }
    let mut claimed: Vec<(String, u32)> = e
        .ledger()
        .with_node(DRA_NODE, |nl| {
            nl.holdings
                .values()
                .filter(|h| h.pod.holder == Holder::Claim)
                .flat_map(|h| {
                    h.placement
                        .gpus
                        .iter()
                        .map(|(g, _)| (h.pod.name.clone(), *g))
                })
                .collect()
        })
        .unwrap_or_default();
    let mut api: Vec<(String, u32)> = w
        .claims
        .values()
        .map(|c| (claim_name(&c.pod), c.gpu))
        .collect();
    api.sort();
    claimed.sort();
    if claimed != api {
        return Err(format!(
            "the ledger's claims on the DRA node are {claimed:?}, the API's {api:?}"
        ));
    }
    Ok(())
}

fn answer() -> impl Strategy<Value = Answer> {
    prop_oneof![
        4 => Just(Answer::Done),
        1 => Just(Answer::Refused),
        2 => Just(Answer::Landed),
        2 => Just(Answer::Lost),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => prop_oneof![Just(Kind::Exclusive), Just(Kind::Share)].prop_map(Step::Create),
        5 => (any::<usize>(), any::<usize>(), answer(), any::<bool>()).prop_map(
            |(pod, node, create, claim_seen)| Step::Bind { pod, node, create, claim_seen }
        ),
        4 => (any::<usize>(), answer(), any::<bool>())
            .prop_map(|(bind, answer, read_back)| Step::Answer { bind, answer, read_back }),
        1 => any::<usize>().prop_map(Step::Resolve),
        1 => any::<usize>().prop_map(Step::Finish),
        1 => any::<usize>().prop_map(Step::Delete),
        4 => (1usize..4).prop_map(Step::Deliver),
        1 => Just(Step::Cut),
        2 => (1usize..4).prop_map(Step::DeliverClaims),
        1 => Just(Step::CutClaims),
        2 => Just(Step::List),
        2 => Just(Step::Reconcile),
        1 => any::<bool>().prop_map(|landed| Step::Restart { landed }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn the_ledger_never_overcommits_and_settles_to_the_api(
        steps in proptest::collection::vec(step(), 1..60)
    ) {
        if let Err(why) = run(&steps) {
            return Err(TestCaseError::fail(why));
        }
    }
}

/// kube-scheduler binds pending pod `pod` (by index) to n1, a reservation's create done.
fn bind_n1(pod: usize) -> Step {
    Step::Bind {
        pod,
        node: 0,
        create: Answer::Done,
        claim_seen: false,
    }
}

/// The binding call in flight answers: done.
fn bound() -> Step {
    Step::Answer {
        bind: 0,
        answer: Answer::Done,
        read_back: true,
    }
}

/// The fault runner's first race (seed 33, slow-then-cut API): a bind done, a reconcile's fresh
/// list showing the pod bound, then the lagging watch delivering the pod's event from before
/// its binding. Releasing the holding there gave the running pod's GPU to the next bind.
#[test]
fn a_stale_unbound_event_after_a_list_releases_nothing() {
    let steps = [
        Step::Create(Kind::Exclusive),
        Step::Create(Kind::Exclusive),
        Step::Create(Kind::Exclusive),
        // p1 and p2 bound to n1, whose two GPUs they take.
        bind_n1(0),
        bound(),
        bind_n1(0),
        bound(),
        Step::List,
        Step::Reconcile,
        // The watch, late: the three pods created, unbound.
        Step::Deliver(3),
        // n1 has no GPU left for p3.
        bind_n1(0),
        bound(),
    ];
    run(&steps).unwrap();
}

/// The fault runner's second race: a share's bind creates its GPU's reservation, the API server
/// answers after bind stopped waiting but creates it, and the bind fails (the share released).
/// Until the watch shows the reservation's pod, its GPU must not look free to a whole-GPU pod.
#[test]
fn a_reservation_created_without_an_answer_keeps_its_gpu() {
    let steps = [
        Step::Create(Kind::Share),
        Step::Bind {
            pod: 0,
            node: 0,
            create: Answer::Landed,
            claim_seen: false,
        },
        Step::Create(Kind::Exclusive),
        Step::Create(Kind::Exclusive),
        // Pending: the share p1, then p3 and p4, which n1's two GPUs would take but for the
        // reservation.
        bind_n1(1),
        bound(),
        bind_n1(1),
        bound(),
    ];
    run(&steps).unwrap();
}

//! Who holds what on which node, at the granularity the device plugin enforces (see
//! [`crate::packing`]). Reading a pod's demand and one node's ledger are pure; [`Ledger`], the
//! cluster's, holds a lock per node and calls a listener on release (the extender's requeue). A pod's holding is derived from the pod alone (its `gpu-share.io/request`
//! annotation or its `nvidia.com/*` limits, `spec.nodeName`, and the `gpu-share.io/gpus` model
//! annotation written at bind), so a restarted replica rebuilds the same ledger from the API.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use crate::inventory::{self, GpuNode, MIG_RESOURCE_PREFIX};
use crate::packing::{self, Demand, GpuDemand, Placement, Reason, Scorer, Usage};
use crate::request::{ANNOTATION_REQUEST, GpuClass, GpuRequest};
use crate::sync::lock;

/// The per-GPU model of a bound pod (`index:milli,...`), written with the binding.
pub const ANNOTATION_GPUS: &str = "gpu-share.io/gpus";

/// A pod's identity and priority.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRef {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub priority: i32,
}

/// What one pod holds on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Holding {
    pub pod: PodRef,
    pub node: String,
    pub demand: Demand,
    pub placement: Placement,
}

/// How a demand is expressed by a request annotation.
pub fn demand_of_request(request: &GpuRequest) -> GpuDemand {
    match &request.class {
        GpuClass::Mig { profile } => GpuDemand::Mig {
            profile: profile.clone(),
            count: request.count,
        },
        GpuClass::Mps { percent } => GpuDemand::Mps {
            milli: u32::from(*percent) * 10,
            memory_mib: request.memory_mib,
        },
        GpuClass::Timeslice { percent } => GpuDemand::Timeslice {
            milli: u32::from(*percent) * 10,
            memory_mib: request.memory_mib,
        },
        GpuClass::Exclusive { count } => GpuDemand::Whole { count: *count },
    }
}

/// Why a pod's GPU demand could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DemandError {
    #[error("pod {0}: {1}")]
    BadRequestAnnotation(String, String),
    #[error(
        "pod {0} asks for more than one kind of GPU resource ({1}); gpu-share accounts one per pod"
    )]
    Mixed(String, String),
}

/// The demand of a pod: its GPU demand ([`gpu_demand_of_pod`]) and its CPU request
/// ([`pod_cpu_milli`]), which the `gpu-share` policy's fragmentation measure reads. `Ok(None)`:
/// no GPU.
pub fn demand_of_pod(pod: &Pod) -> Result<Option<Demand>, DemandError> {
    let Some(gpu) = gpu_demand_of_pod(pod)? else {
        return Ok(None);
    };
    Ok(Some(Demand {
        cpu_milli: pod.spec.as_ref().map_or(0, pod_cpu_milli),
        ..Demand::gpu(gpu)
    }))
}

/// A pod's CPU request in thousandths, as kube-scheduler counts it: see [`pod_request_milli`].
pub fn pod_cpu_milli(spec: &k8s_openapi::api::core::v1::PodSpec) -> u64 {
    pod_request_milli(spec, "cpu")
}

/// A pod's request of `resource` in thousandths of its unit, as kube-scheduler counts it: the
/// larger of the sum over its containers and the largest init container, plus the pod overhead.
/// A container without a request but with a limit requests its limit (the API server's
/// defaulting).
pub fn pod_request_milli(spec: &k8s_openapi::api::core::v1::PodSpec, resource: &str) -> u64 {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let milli = |q: Option<&Quantity>| {
        q.and_then(|q| inventory::quantity_milli(&q.0))
            .map_or(0, |m| u64::try_from(m).unwrap_or(u64::MAX))
    };
    let request = |c: &k8s_openapi::api::core::v1::Container| -> u64 {
        let r = c.resources.as_ref();
        milli(
            r.and_then(|r| r.requests.as_ref())
                .and_then(|q| q.get(resource))
                .or_else(|| {
                    r.and_then(|r| r.limits.as_ref())
                        .and_then(|l| l.get(resource))
                }),
        )
    };
    let main = spec
        .containers
        .iter()
        .map(request)
        .fold(0u64, u64::saturating_add);
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .map(request)
        .max()
        .unwrap_or(0);
    let overhead = milli(spec.overhead.as_ref().and_then(|o| o.get(resource)));
    main.max(init).saturating_add(overhead)
}

/// The GPU demand of a pod: its `gpu-share.io/request` annotation, or else its `nvidia.com/*`
/// limits (summed over containers; an init container's, if larger). `Ok(None)`: no GPU. An
/// annotation the limits contradict ([`contradiction`]) is not believed: the pod is accounted
/// by its limits, which are what the device plugin hands it.
pub fn gpu_demand_of_pod(pod: &Pod) -> Result<Option<GpuDemand>, DemandError> {
    let id = pod_key(pod);
    let spec = pod.spec.as_ref();
    if let Some(value) = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_REQUEST))
    {
        let request = GpuRequest::parse_normalized(value)
            .map_err(|e| DemandError::BadRequestAnnotation(id.clone(), e.to_string()))?;
        let claimed = demand_of_request(&request);
        // Checked against the main containers, where the webhook writes the limits (an init
        // container's own GPU use is not the request's).
        let main = spec.map(|s| limit_totals(s, false)).unwrap_or_default();
        if contradiction(&claimed, &main).is_none() {
            return Ok(Some(claimed));
        }
    }
    demand_of_limits(id, spec.map(|s| limit_totals(s, true)).unwrap_or_default())
}

/// Why a pod's `gpu-share.io/request` is not believed, in words: its `nvidia.com/*` limits say
/// otherwise. `None` when they agree, or when the pod has no such limits to check against.
pub fn request_contradiction(pod: &Pod) -> Option<String> {
    let value = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_REQUEST))?;
    let request = GpuRequest::parse_normalized(value).ok()?;
    let totals = pod
        .spec
        .as_ref()
        .map(|s| limit_totals(s, false))
        .unwrap_or_default();
    contradiction(&demand_of_request(&request), &totals).map(|why| {
        format!("its {ANNOTATION_REQUEST} {value:?} is not believed, {why}; gpu-share accounts it by its limits")
    })
}

/// PURE: whether `nvidia.com/*` limit totals contradict a request's demand: a MIG profile and
/// count must match the limit's resource (`nvidia.com/mig-<profile>`, or `nvidia.com/gpu` under
/// the single strategy) and quantity; an exclusive count must equal the `nvidia.com/gpu` limit;
/// a shared class (mps, timeslice) holds exactly one replica of one non-MIG resource. No
/// `nvidia.com/*` limit at all is nothing to check against (such a pod gets no device).
pub fn contradiction(claimed: &GpuDemand, totals: &BTreeMap<String, u64>) -> Option<String> {
    if totals.is_empty() {
        return None;
    }
    let limits = || {
        totals
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let single = |resource: &str, n: u64| totals.len() == 1 && totals.get(resource) == Some(&n);
    let agrees = match claimed {
        GpuDemand::Mig { profile, count } => {
            single(&crate::mig::resource_name(profile), u64::from(*count))
                || single(inventory::RESOURCE_GPU, u64::from(*count))
        }
        GpuDemand::Whole { count } => single(inventory::RESOURCE_GPU, u64::from(*count)),
        GpuDemand::Mps { .. } | GpuDemand::Timeslice { .. } => {
            totals.len() == 1
                && totals
                    .iter()
                    .all(|(k, v)| *v == 1 && !k.starts_with(MIG_RESOURCE_PREFIX))
        }
        GpuDemand::None | GpuDemand::Units { .. } => true,
    };
    let want = match claimed {
        GpuDemand::Mig { profile, count } => format!(
            "{}: {count} (or {}: {count} under the single strategy)",
            crate::mig::resource_name(profile),
            inventory::RESOURCE_GPU
        ),
        GpuDemand::Whole { count } => format!("{}: {count}", inventory::RESOURCE_GPU),
        _ => "one replica of the shared resource".to_string(),
    };
    (!agrees).then(|| format!("as its limits ask for {} where it needs {want}", limits()))
}

/// The `nvidia.com/*` requests or limits of a pod spec, per resource: summed over containers,
/// and with `init`, an init container's if larger.
fn limit_totals(spec: &k8s_openapi::api::core::v1::PodSpec, init: bool) -> BTreeMap<String, u64> {
    let limits_of = |c: &k8s_openapi::api::core::v1::Container| -> BTreeMap<String, u64> {
        let r = c.resources.as_ref();
        let l = r.and_then(|r| r.limits.as_ref());
        let q = r.and_then(|r| r.requests.as_ref());
        let mut out = BTreeMap::new();
        for map in [q, l].into_iter().flatten() {
            for (k, v) in map {
                if k.starts_with("nvidia.com/")
                    && let Some(n) = inventory::quantity_count(&v.0)
                    && n > 0
                {
                    let e = out.entry(k.clone()).or_insert(0);
                    *e = (*e).max(n);
                }
            }
        }
        out
    };
    let mut total: BTreeMap<String, u64> = BTreeMap::new();
    for c in &spec.containers {
        for (k, n) in limits_of(c) {
            let e = total.entry(k).or_default();
            *e = e.saturating_add(n);
        }
    }
    for c in spec.init_containers.iter().flatten().filter(|_| init) {
        for (k, n) in limits_of(c) {
            let e = total.entry(k).or_default();
            *e = (*e).max(n);
        }
    }
    total
}

/// The demand `nvidia.com/*` limit totals express on their own.
fn demand_of_limits(
    id: String,
    total: BTreeMap<String, u64>,
) -> Result<Option<GpuDemand>, DemandError> {
    let mut iter = total.into_iter();
    let Some((resource, count)) = iter.next() else {
        return Ok(None);
    };
    let rest: Vec<String> = iter.map(|(k, _)| k).collect();
    if !rest.is_empty() {
        return Err(DemandError::Mixed(
            id,
            std::iter::once(resource)
                .chain(rest)
                .collect::<Vec<_>>()
                .join(", "),
        ));
    }
    let count = u32::try_from(count).unwrap_or(u32::MAX);
    let gpu = match resource.strip_prefix(MIG_RESOURCE_PREFIX) {
        Some(suffix) => GpuDemand::Mig {
            profile: inventory::profile_from_resource_suffix(suffix),
            count,
        },
        None => GpuDemand::Units { resource, count },
    };
    Ok(Some(gpu))
}

/// `namespace/name` of a pod.
pub fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata
            .name
            .as_deref()
            .or(pod.metadata.generate_name.as_deref())
            .unwrap_or_default()
    )
}

/// The identity of a pod.
pub fn pod_ref(pod: &Pod) -> PodRef {
    PodRef {
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        priority: pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0),
    }
}

/// What the extender keeps of a pod seen in filter or prioritize until it binds it: its
/// identity, its key for logs and its demand (or why it has none), which is all bind reads. A
/// Pod as kube-scheduler sends it is tens of KB (managedFields, env, volumes, probes, status,
/// up to 256 KiB of annotations); this is a few hundred bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindPod {
    pub pod: PodRef,
    pub key: String,
    pub demand: Result<Option<Demand>, String>,
}

impl BindPod {
    pub fn of(pod: &Pod) -> Self {
        BindPod {
            pod: pod_ref(pod),
            key: pod_key(pod),
            demand: demand_of_pod(pod).map_err(|e| e.to_string()),
        }
    }

    /// About how many bytes it takes in memory (the pod cache is bounded by this).
    pub fn size(&self) -> u32 {
        let p = &self.pod;
        let demand = match &self.demand {
            Ok(Some(d)) => d.models.iter().map(|m| m.len() + 24).sum::<usize>() + 64,
            Ok(None) => 0,
            Err(e) => e.len(),
        };
        let n = std::mem::size_of::<Self>()
            + p.uid.len()
            + p.namespace.len()
            + p.name.len()
            + self.key.len()
            + demand
            + 64;
        u32::try_from(n).unwrap_or(u32::MAX)
    }
}

/// True when a pod no longer holds anything (Succeeded or Failed).
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

/// What a pod seen in the API holds: `None` if it holds nothing (no GPU, not bound, finished).
pub fn observed_holding(pod: &Pod) -> Result<Option<ObservedPod>, DemandError> {
    let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
        return Ok(None);
    };
    if is_terminal(pod) {
        return Ok(None);
    }
    let Some(demand) = demand_of_pod(pod)? else {
        return Ok(None);
    };
    let gpus = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_GPUS))
        .and_then(|t| Placement::parse_gpus(t));
    Ok(Some(ObservedPod {
        pod: pod_ref(pod),
        node,
        demand,
        gpus,
    }))
}

/// A bound pod as read from the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedPod {
    pub pod: PodRef,
    pub node: String,
    pub demand: Demand,
    /// The per-GPU model written at bind, if any.
    pub gpus: Option<Vec<(u32, u32)>>,
}

/// A bind annotation's per-GPU shares add up to at most one GPU on every GPU it names.
fn no_gpu_over_full(gpus: &[(u32, u32)]) -> bool {
    let mut per: BTreeMap<u32, u32> = BTreeMap::new();
    gpus.iter().all(|(i, m)| {
        let e = per.entry(*i).or_default();
        *e = e.saturating_add(*m);
        *e <= 1000
    })
}

/// One node's capacity, usage and holders.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeLedger {
    pub node: GpuNode,
    pub usage: Usage,
    pub holdings: BTreeMap<String, Holding>,
    /// The node's fragmentation as the last decision on it measured it (a cache).
    #[serde(skip)]
    pub memo: packing::FragMemo,
}

/// Two ledgers are equal when they hold the same node, usage and holdings, whatever their memos
/// (a cache) hold.
impl PartialEq for NodeLedger {
    fn eq(&self, other: &NodeLedger) -> bool {
        self.node == other.node && self.usage == other.usage && self.holdings == other.holdings
    }
}

impl Eq for NodeLedger {}

impl NodeLedger {
    pub fn new(node: GpuNode) -> Self {
        NodeLedger {
            usage: Usage::empty(&node),
            node,
            holdings: BTreeMap::new(),
            memo: packing::FragMemo::default(),
        }
    }

    /// Checks the fit and, if it fits, records the holding (the bind path). Idempotent for a pod
    /// already held here.
    pub fn reserve(
        &mut self,
        scorer: &Scorer,
        pod: PodRef,
        demand: Demand,
    ) -> Result<Placement, Reason> {
        if let Some(h) = self.holdings.get(&pod.uid) {
            return Ok(h.placement.clone());
        }
        let (placement, _) =
            packing::place_memo(scorer, &self.node, &self.usage, &demand, &mut self.memo)?;
        packing::apply(&mut self.usage, &placement);
        self.holdings.insert(
            pod.uid.clone(),
            Holding {
                pod,
                node: self.node.name.clone(),
                demand,
                placement: placement.clone(),
            },
        );
        Ok(placement)
    }

    /// Records what the API says a pod holds, whether or not it fits (the API is the truth; a pod
    /// bound by another scheduler still occupies the device). Replaces an earlier record.
    pub fn record(&mut self, observed: &ObservedPod) {
        // A pod already held here keeps the demand it was bound with: its annotations can be
        // edited later, what the device plugin gave it cannot. Only the per-GPU choice may be
        // refreshed (the bind annotation arriving after a restart).
        let demand = match self.holdings.get(&observed.pod.uid) {
            Some(existing)
                if observed
                    .gpus
                    .as_ref()
                    .is_none_or(|g| *g == existing.placement.gpus) =>
            {
                return;
            }
            Some(existing) => existing.demand.clone(),
            None => observed.demand.clone(),
        };
        self.release(&observed.pod.uid);
        let placement = self.placement_for(&demand, observed.gpus.as_deref());
        packing::apply(&mut self.usage, &placement);
        self.holdings.insert(
            observed.pod.uid.clone(),
            Holding {
                pod: observed.pod.clone(),
                node: self.node.name.clone(),
                demand,
                placement,
            },
        );
    }

    /// The placement of a demand recorded from the API: the node-level part from the demand, the
    /// per-GPU part from the bind annotation when it is valid, else the binpack choice.
    fn placement_for(&self, demand: &Demand, gpus: Option<&[(u32, u32)]>) -> Placement {
        let scorer = Scorer::new(packing::PackingPolicy::Binpack);
        // The pod is running: when the model has no room for it, it still holds its units.
        let mut best = scorer
            .evaluate(&self.node, &self.usage, demand)
            .map_or_else(|| packing::node_level(&self.node, demand), |(p, _)| p);
        if let Some(gpus) = gpus
            && gpus.iter().all(|(i, _)| *i < self.node.gpus)
            && no_gpu_over_full(gpus)
            && gpus.iter().map(|(_, m)| m).sum::<u32>()
                == best.gpus.iter().map(|(_, m)| m).sum::<u32>()
        {
            best.gpus = gpus.to_vec();
        }
        best
    }

    /// Releases a pod's holding here.
    pub fn release(&mut self, uid: &str) -> Option<Holding> {
        let h = self.holdings.remove(uid)?;
        packing::unapply(&mut self.usage, &h.placement);
        Some(h)
    }

    /// New capacity for the node (labels or allocatable changed): usage is rebuilt from the
    /// holdings, keeping their per-GPU model where it still applies.
    pub fn set_node(&mut self, node: GpuNode) {
        if node == self.node {
            return;
        }
        let holdings = std::mem::take(&mut self.holdings);
        *self = NodeLedger::new(node);
        for h in holdings.into_values() {
            self.record(&ObservedPod {
                pod: h.pod,
                node: h.node,
                demand: h.demand,
                gpus: Some(h.placement.gpus),
            });
        }
    }

    /// True when no enforced count exceeds the node's capacity.
    pub fn within_capacity(&self) -> bool {
        let u = &self.usage;
        let n = &self.node;
        let mig_ok = match &n.mig {
            inventory::MigLayout::Mixed { instances } => u
                .mig
                .iter()
                .all(|(p, used)| *used <= instances.get(p).copied().unwrap_or(0)),
            _ => u.mig.is_empty(),
        };
        let budget_ok = match n.sharing {
            inventory::Sharing::TimeSlicing { .. } => u.budget_milli <= u64::from(n.gpus) * 1000,
            _ => true,
        };
        u.slots <= n.slots && mig_ok && budget_ok
    }
}

/// Preemption on one node: which victims really make room for `demand`. kube-scheduler's dry
/// run chose `given` without knowing classes or slot sizes. Victims that free capacity the demand
/// can use come first (lowest priority first), then other holders here of lower priority than
/// the preemptor; the set grows until the demand fits, then shrinks to be just sufficient.
/// `None`: no set on this node makes room. If the GPU side fits already (the node failed for
/// other reasons, e.g. CPU), kube-scheduler's own victims are kept.
pub fn plan_victims(
    nl: &NodeLedger,
    demand: &Demand,
    preemptor_priority: i32,
    given: &[String],
) -> Option<Vec<String>> {
    if packing::fit(&nl.node, &nl.usage, demand).is_ok() {
        return if given.is_empty() {
            None
        } else {
            Some(given.to_vec())
        };
    }
    let helps = |h: &Holding| -> bool {
        match &demand.gpu {
            GpuDemand::Mig { profile, .. } => {
                h.placement.mig.as_ref().is_some_and(|(p, _)| p == profile)
                    || (matches!(nl.node.mig, inventory::MigLayout::Single { .. })
                        && h.placement.slots > 0)
            }
            GpuDemand::None => false,
            _ => {
                h.placement.slots > 0
                    || h.placement.budget_milli > 0
                    || !h.placement.gpus.is_empty()
            }
        }
    };
    let mut given_h: Vec<&Holding> = given
        .iter()
        .filter_map(|u| nl.holdings.get(u))
        .filter(|h| helps(h))
        .collect();
    given_h.sort_by_key(|h| h.pod.priority);
    let mut extra: Vec<&Holding> = nl
        .holdings
        .values()
        .filter(|h| !given.contains(&h.pod.uid) && h.pod.priority < preemptor_priority && helps(h))
        .collect();
    extra.sort_by_key(|h| h.pod.priority);
    let order: Vec<&Holding> = given_h.into_iter().chain(extra).collect();
    let fits_without = |victims: &[&Holding]| -> bool {
        let mut usage = nl.usage.clone();
        for h in victims {
            packing::unapply(&mut usage, &h.placement);
        }
        packing::fit(&nl.node, &usage, demand).is_ok()
    };
    let mut chosen: Vec<&Holding> = Vec::new();
    for h in order {
        chosen.push(h);
        if fits_without(&chosen) {
            break;
        }
    }
    if chosen.is_empty() || !fits_without(&chosen) {
        return None;
    }
    // Shrink: try dropping each victim, highest priority first.
    let mut i = chosen.len();
    while i > 0 {
        i -= 1;
        let mut trial = chosen.clone();
        trial.remove(i);
        if !trial.is_empty() && fits_without(&trial) {
            chosen = trial;
        }
    }
    Some(chosen.iter().map(|h| h.pod.uid.clone()).collect())
}

type ReleaseListener = Box<dyn Fn(&Holding) + Send + Sync>;

/// The fewest nodes one thread takes in [`Ledger::with_nodes_par`]: small requests stay on the
/// calling thread, where handing them out would cost more than it saves.
pub const PARALLEL_CHUNK: usize = 512;

/// The cluster's ledger: one [`NodeLedger`] per node behind its own lock, so work on one node
/// (a bind) is serialized while different nodes proceed in parallel. No lock is held longer than
/// one node's bookkeeping. The extender, `gpu-share status` and the tests share this one type.
#[derive(Default)]
pub struct Ledger {
    /// By name, as prioritize looks up every candidate node of a decision.
    nodes: RwLock<HashMap<String, Arc<Mutex<NodeLedger>>, foldhash::quality::RandomState>>,
    /// uid -> node for every placed holding.
    index: Mutex<HashMap<String, String>>,
    /// Pods bound to nodes not (yet) in the inventory.
    unplaced: Mutex<HashMap<String, ObservedPod>>,
    on_release: RwLock<Option<ReleaseListener>>,
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

    /// Every node's name, sorted.
    /// How many node ledgers there are.
    pub fn node_count(&self) -> usize {
        crate::sync::read(&self.nodes).len()
    }

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
        let holdings: Vec<Holding> = lock(&n).holdings.values().cloned().collect();
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

    /// The node a pod holds something on.
    pub fn node_of(&self, uid: &str) -> Option<String> {
        lock(&self.index).get(uid).cloned()
    }

    /// Records what the API says a pod holds.
    pub fn record(&self, o: &ObservedPod) {
        // The index lock is held throughout (lock order: index, then a node), so two updates of
        // one pod cannot interleave and leave a holding the index does not point to.
        let moved = {
            let mut index = lock(&self.index);
            let moved = match index.get(&o.pod.uid) {
                Some(prev) if *prev != o.node => self.take(&mut index, &o.pod.uid),
                _ => None,
            };
            match self.node(&o.node) {
                Some(n) => {
                    lock(&n).record(o);
                    index.insert(o.pod.uid.clone(), o.node.clone());
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

    /// Checks the fit on `node` and records the holding (bind), under that node's lock and the
    /// index lock.
    pub fn reserve(
        &self,
        scorer: &Scorer,
        node: &str,
        pod: PodRef,
        demand: Demand,
    ) -> Result<Placement, Reason> {
        let n = self.node(node).ok_or(Reason::UnknownNode)?;
        let (result, moved) = {
            let mut index = lock(&self.index);
            let moved = match index.get(&pod.uid) {
                Some(prev) if prev != node => self.take(&mut index, &pod.uid),
                _ => None,
            };
            let uid = pod.uid.clone();
            let result = lock(&n).reserve(scorer, pod, demand);
            if result.is_ok() {
                index.insert(uid, node.to_string());
            }
            (result, moved)
        };
        if let Some(h) = moved {
            self.notify(&h);
        }
        result
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
    fn take(&self, index: &mut HashMap<String, String>, uid: &str) -> Option<Holding> {
        let node = index.remove(uid)?;
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
        self.with_node(&node, |nl| nl.holdings.get(uid).cloned())
            .flatten()
    }

    /// Pods waiting for their node to appear in the inventory.
    pub fn unplaced(&self) -> usize {
        lock(&self.unplaced).len()
    }

    /// Every UID held (placed or not).
    /// How many pods the ledger holds (placed or not).
    pub fn uids_len(&self) -> usize {
        lock(&self.index).len() + lock(&self.unplaced).len()
    }

    pub fn uids(&self) -> Vec<String> {
        let mut v: Vec<String> = lock(&self.index).keys().cloned().collect();
        v.extend(lock(&self.unplaced).keys().cloned());
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::Sharing;

    /// The slim copy the bind cache keeps reads the same: demand (GPU and CPU), identity and key.
    #[test]
    fn bind_pod_keeps_what_bind_reads() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "p", "namespace": "ml", "uid": "u-1",
                "labels": {"app": "x"},
                "annotations": {
                    "gpu-share": "mps-25", "gpu-share/memory": "8Gi",
                    "gpu-share.io/request": "mps-25,memory=8192Mi",
                    "kubectl.kubernetes.io/last-applied-configuration": "x".repeat(10_000),
                },
                "managedFields": [{"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1",
                                   "fieldsV1": {"f:metadata": {}}}],
            },
            "spec": {
                "priority": 7,
                "overhead": {"cpu": "250m"},
                "initContainers": [
                    {"name": "init", "image": "i", "resources": {"requests": {"cpu": "4"}}},
                    {"name": "sidecar", "image": "s", "restartPolicy": "Always",
                     "resources": {"requests": {"cpu": "500m"}}},
                ],
                "containers": [{
                    "name": "main", "image": "m",
                    "env": [{"name": "A", "value": "1"}],
                    "resources": {"requests": {"cpu": "2"}, "limits": {"nvidia.com/gpu": "1", "cpu": "3"}},
                }],
                "volumes": [{"name": "v", "emptyDir": {}}],
            },
            "status": {"phase": "Pending"},
        }))
        .unwrap();
        let kept = BindPod::of(&pod);
        assert_eq!(kept.demand, demand_of_pod(&pod).map_err(|e| e.to_string()));
        assert!(kept.demand.as_ref().unwrap().is_some());
        assert_eq!(kept.pod, pod_ref(&pod));
        assert_eq!(kept.key, pod_key(&pod));
        let full = serde_json::to_vec(&pod).unwrap().len();
        assert!(
            (kept.size() as usize) * 10 < full,
            "{} vs {full}",
            kept.size()
        );
        // A bad request is kept as its reason, counted in the size.
        let mut bad = pod.clone();
        bad.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("gpu-share.io/request".into(), "x".repeat(100_000));
        let kept = BindPod::of(&bad);
        assert!(kept.demand.is_err());
        assert!(kept.size() > 100_000, "{}", kept.size());
    }
    use crate::packing::PackingPolicy;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    fn pref(uid: &str) -> PodRef {
        PodRef {
            uid: uid.into(),
            namespace: "ml".into(),
            name: uid.into(),
            priority: 0,
        }
    }

    #[test]
    fn demand_from_annotation_and_from_limits() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "a", "namespace": "ml", "uid": "u1",
                "annotations": {"gpu-share.io/request": "mps-25,memory=12288Mi"}},
            "spec": {"containers": [{"name": "c"}]}
        }));
        assert_eq!(
            demand_of_pod(&p).unwrap().unwrap().gpu,
            GpuDemand::Mps {
                milli: 250,
                memory_mib: Some(12288)
            }
        );
        let p = pod(serde_json::json!({
            "metadata": {"name": "b", "namespace": "ml"},
            "spec": {"containers": [
                {"name": "c", "resources": {"limits": {"nvidia.com/mig-1g.10gb.me": "1"}}},
                {"name": "d", "resources": {"limits": {"nvidia.com/mig-1g.10gb.me": "2"}}}
            ]}
        }));
        assert_eq!(
            demand_of_pod(&p).unwrap().unwrap().gpu,
            GpuDemand::Mig {
                profile: "1g.10gb+me".into(),
                count: 3
            }
        );
        let p = pod(serde_json::json!({
            "metadata": {"name": "c", "namespace": "ml"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "1"}}}]}
        }));
        assert_eq!(demand_of_pod(&p).unwrap(), None);
        let p = pod(serde_json::json!({
            "metadata": {"name": "d", "namespace": "ml"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {
                "nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "1"}}}]}
        }));
        assert!(matches!(demand_of_pod(&p), Err(DemandError::Mixed(..))));
    }

    #[test]
    fn cpu_request_counts_as_kube_scheduler_does() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "a", "namespace": "ml",
                "annotations": {"gpu-share.io/request": "timeslice-50"}},
            "spec": {
                "containers": [
                    {"name": "c", "resources": {"requests": {"cpu": "1500m"}}},
                    // No request: the limit is the request.
                    {"name": "d", "resources": {"limits": {"cpu": "2"}}},
                    {"name": "e"}
                ],
                "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "3"}}}],
                "overhead": {"cpu": "250m"}
            }
        }));
        // max(1.5 + 2, 3) + 0.25.
        assert_eq!(demand_of_pod(&p).unwrap().unwrap().cpu_milli, 3750);
        let mut spec = p.spec.clone().unwrap();
        spec.init_containers = None;
        spec.overhead = None;
        assert_eq!(pod_cpu_milli(&spec), 3500);
        // A larger init container wins.
        let p = pod(serde_json::json!({
            "metadata": {"name": "b", "namespace": "ml"},
            "spec": {
                "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "4"}}}]
            }
        }));
        assert_eq!(demand_of_pod(&p).unwrap().unwrap().cpu_milli, 4000);
    }

    fn requested(request: &str, limits: serde_json::Value) -> Pod {
        pod(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ml", "uid": "u1",
                         "annotations": {"gpu-share.io/request": request}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}
        }))
    }

    #[test]
    fn a_request_its_limits_agree_with_is_believed() {
        for (request, limits, want) in [
            (
                "timeslice-50",
                serde_json::json!({"nvidia.com/gpu": "1"}),
                GpuDemand::Timeslice {
                    milli: 500,
                    memory_mib: None,
                },
            ),
            (
                "mps-25",
                serde_json::json!({"nvidia.com/gpu.shared": "1"}),
                GpuDemand::Mps {
                    milli: 250,
                    memory_mib: None,
                },
            ),
            (
                "exclusive-2",
                serde_json::json!({"nvidia.com/gpu": "2"}),
                GpuDemand::Whole { count: 2 },
            ),
            (
                "mig-1g.10gb,count=2",
                serde_json::json!({"nvidia.com/mig-1g.10gb": "2"}),
                GpuDemand::Mig {
                    profile: "1g.10gb".into(),
                    count: 2,
                },
            ),
            // The single strategy: a MIG device is a unit of nvidia.com/gpu.
            (
                "mig-3g.40gb",
                serde_json::json!({"nvidia.com/gpu": "1"}),
                GpuDemand::Mig {
                    profile: "3g.40gb".into(),
                    count: 1,
                },
            ),
            // No nvidia.com limit: nothing to check against (no device either).
            (
                "timeslice-90",
                serde_json::json!({"cpu": "1"}),
                GpuDemand::Timeslice {
                    milli: 900,
                    memory_mib: None,
                },
            ),
        ] {
            let p = requested(request, limits);
            assert_eq!(request_contradiction(&p), None, "{request}");
            assert_eq!(gpu_demand_of_pod(&p).unwrap(), Some(want), "{request}");
        }
    }

    /// The webhook writes limits into the main containers; an init container's own GPU use
    /// neither contradicts the request nor makes it unaccountable.
    #[test]
    fn an_init_containers_gpu_does_not_contradict_the_request() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ml",
                         "annotations": {"gpu-share.io/request": "mig-1g.10gb"}},
            "spec": {
                "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}],
                "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
            }
        }));
        assert_eq!(request_contradiction(&p), None);
        assert_eq!(
            gpu_demand_of_pod(&p).unwrap(),
            Some(GpuDemand::Mig {
                profile: "1g.10gb".into(),
                count: 1
            })
        );
    }

    #[test]
    fn a_request_its_limits_contradict_is_accounted_by_the_limits() {
        for (request, limits, want) in [
            // Rewritten down from timeslice-90 on a pod holding two replicas.
            (
                "timeslice-1",
                serde_json::json!({"nvidia.com/gpu": "2"}),
                GpuDemand::Units {
                    resource: "nvidia.com/gpu".into(),
                    count: 2,
                },
            ),
            (
                "exclusive",
                serde_json::json!({"nvidia.com/gpu": "4"}),
                GpuDemand::Units {
                    resource: "nvidia.com/gpu".into(),
                    count: 4,
                },
            ),
            (
                "mig-1g.10gb",
                serde_json::json!({"nvidia.com/mig-3g.40gb": "1"}),
                GpuDemand::Mig {
                    profile: "3g.40gb".into(),
                    count: 1,
                },
            ),
            (
                "mig-1g.10gb",
                serde_json::json!({"nvidia.com/mig-1g.10gb": "3"}),
                GpuDemand::Mig {
                    profile: "1g.10gb".into(),
                    count: 3,
                },
            ),
            (
                "mps-25",
                serde_json::json!({"nvidia.com/mig-1g.10gb": "1"}),
                GpuDemand::Mig {
                    profile: "1g.10gb".into(),
                    count: 1,
                },
            ),
        ] {
            let p = requested(request, limits.clone());
            let why = request_contradiction(&p).unwrap_or_else(|| panic!("{request} {limits}"));
            assert!(
                why.contains("is not believed") && why.contains("accounts it by its limits"),
                "{why}"
            );
            assert_eq!(
                gpu_demand_of_pod(&p).unwrap(),
                Some(want),
                "{request} {limits}"
            );
            // The rebuild reads the same.
            let mut bound = p.clone();
            bound.spec.as_mut().unwrap().node_name = Some("n1".into());
            let o = observed_holding(&bound).unwrap().unwrap();
            assert_eq!(Some(o.demand.gpu), gpu_demand_of_pod(&p).unwrap());
        }
        // Two kinds of GPU resource: contradicted, and the limits alone are refused in words.
        let p = requested(
            "timeslice-50",
            serde_json::json!({"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "1"}),
        );
        assert!(request_contradiction(&p).is_some());
        assert!(matches!(gpu_demand_of_pod(&p), Err(DemandError::Mixed(..))));
    }

    #[test]
    fn observed_holding_needs_a_node_and_a_live_phase() {
        let base = serde_json::json!({
            "metadata": {"name": "a", "namespace": "ml", "uid": "u1",
                "annotations": {"gpu-share.io/request": "timeslice-50", "gpu-share.io/gpus": "1:500"}},
            "spec": {"containers": [{"name": "c"}], "nodeName": "n1", "priority": 7},
            "status": {"phase": "Running"}
        });
        let o = observed_holding(&pod(base.clone())).unwrap().unwrap();
        assert_eq!(o.node, "n1");
        assert_eq!(o.gpus, Some(vec![(1, 500)]));
        assert_eq!(o.pod.priority, 7);
        let mut done = base.clone();
        done["status"]["phase"] = "Succeeded".into();
        assert_eq!(observed_holding(&pod(done)).unwrap(), None);
        let mut pending = base;
        pending["spec"]["nodeName"] = serde_json::Value::Null;
        assert_eq!(observed_holding(&pod(pending)).unwrap(), None);
    }

    #[test]
    fn reserve_record_release_and_rebuild() {
        let n = GpuNode::shared("n1", "H100", 2, 81559, Sharing::TimeSlicing { replicas: 4 });
        let l = Ledger::new();
        l.upsert_node(n.clone());
        let scorer = Scorer::new(PackingPolicy::Binpack);
        let d = Demand::gpu(GpuDemand::Timeslice {
            milli: 600,
            memory_mib: None,
        });
        let p1 = l.reserve(&scorer, "n1", pref("a"), d.clone()).unwrap();
        let p2 = l.reserve(&scorer, "n1", pref("b"), d.clone()).unwrap();
        assert_ne!(
            p1.gpus[0].0, p2.gpus[0].0,
            "second 60% goes to the other GPU"
        );
        // A third 60% fits the node's budget (1.8 of 2 GPUs); the model stacks it on one GPU.
        l.reserve(&scorer, "n1", pref("c"), d.clone()).unwrap();
        assert_eq!(
            l.reserve(&scorer, "n1", pref("d"), d.clone()),
            Err(Reason::BudgetUsedUp)
        );
        // Idempotent.
        assert_eq!(l.reserve(&scorer, "n1", pref("a"), d.clone()).unwrap(), p1);
        // Rebuild from what the API would show.
        let observed: Vec<ObservedPod> = ["a", "b", "c"]
            .iter()
            .map(|u| {
                let h = l.holding(u).unwrap();
                ObservedPod {
                    pod: h.pod.clone(),
                    node: h.node.clone(),
                    demand: h.demand.clone(),
                    gpus: Some(h.placement.gpus.clone()),
                }
            })
            .collect();
        let rebuilt = Ledger::rebuild([n.clone()], &observed);
        assert_eq!(rebuilt.snapshot(), l.snapshot());
        l.release("a");
        assert!(l.reserve(&scorer, "n1", pref("d"), d).is_ok());
        assert_eq!(l.with_node("n1", |nl| nl.within_capacity()), Some(true));
    }

    #[test]
    fn recorded_pods_keep_their_bound_demand_and_their_units() {
        let l = Ledger::new();
        l.upsert_node(GpuNode::whole("n", "H100", 2, 81559));
        let observed = |uid: &str, count: u32, gpus: Option<Vec<(u32, u32)>>| ObservedPod {
            pod: pref(uid),
            node: "n".into(),
            demand: Demand::gpu(GpuDemand::Whole { count }),
            gpus,
        };
        l.record(&observed("a", 2, None));
        assert_eq!(l.with_node("n", |nl| nl.usage.slots), Some(2));
        // Editing the annotation of a running pod does not shrink what it holds.
        l.record(&observed("a", 1, None));
        assert_eq!(l.with_node("n", |nl| nl.usage.slots), Some(2));
        assert_eq!(
            l.holding("a").unwrap().demand.gpu,
            GpuDemand::Whole { count: 2 }
        );
        // A pod running where the model has no free GPU still holds its units.
        l.record(&observed("b", 1, None));
        assert_eq!(l.with_node("n", |nl| nl.usage.slots), Some(3));
        assert_eq!(l.with_node("n", |nl| nl.within_capacity()), Some(false));
        // A bind annotation naming one GPU twice is not believed.
        l.upsert_node(GpuNode::whole("m", "H100", 2, 81559));
        l.record(&ObservedPod {
            node: "m".into(),
            ..observed("c", 2, Some(vec![(0, 1000), (0, 1000)]))
        });
        assert_eq!(
            l.with_node("m", |nl| nl.usage.gpu_milli.clone()),
            Some(vec![1000, 1000])
        );
    }

    #[test]
    fn a_huge_recorded_unit_count_is_bounded_by_the_node() {
        let mut nl = NodeLedger::new(GpuNode::shared(
            "ts",
            "H100",
            2,
            81559,
            Sharing::TimeSlicing { replicas: 4 },
        ));
        nl.record(&ObservedPod {
            pod: pref("x"),
            node: "ts".into(),
            demand: Demand::gpu(GpuDemand::Units {
                resource: "nvidia.com/gpu".into(),
                count: u32::MAX,
            }),
            gpus: None,
        });
        let h = nl.holdings.get("x").unwrap();
        assert_eq!(
            h.placement.gpus.len(),
            8,
            "one modelled replica per unit the node has"
        );
        assert_eq!(nl.usage.slots, u32::MAX);
    }

    #[test]
    fn pods_on_unknown_nodes_wait_for_the_node() {
        let l = Ledger::new();
        let o = ObservedPod {
            pod: pref("x"),
            node: "later".into(),
            demand: Demand::gpu(GpuDemand::Whole { count: 1 }),
            gpus: None,
        };
        l.record(&o);
        assert_eq!(l.uids(), vec!["x".to_string()]);
        l.upsert_node(GpuNode::whole("later", "H100", 2, 81559));
        assert_eq!(l.with_node("later", |nl| nl.usage.slots), Some(1));
        assert_eq!(l.unplaced(), 0);
        l.remove_node("later");
        assert_eq!(l.unplaced(), 1);
        assert_eq!(l.uids(), vec!["x".to_string()]);
    }

    #[test]
    fn preemption_keeps_only_victims_that_make_room() {
        let mut nl = NodeLedger::new(GpuNode {
            gpus: 0,
            slots: 0,
            mig: inventory::MigLayout::Mixed {
                instances: [("1g.10gb".to_string(), 2), ("3g.40gb".to_string(), 1)].into(),
            },
            ..GpuNode::whole("m", "A100", 0, 81920)
        });
        let scorer = Scorer::new(PackingPolicy::Binpack);
        let small = Demand::gpu(GpuDemand::Mig {
            profile: "1g.10gb".into(),
            count: 1,
        });
        let big = Demand::gpu(GpuDemand::Mig {
            profile: "3g.40gb".into(),
            count: 1,
        });
        let with_prio = |uid: &str, p: i32| PodRef {
            priority: p,
            ..pref(uid)
        };
        nl.reserve(&scorer, with_prio("s1", 5), small.clone())
            .unwrap();
        nl.reserve(&scorer, with_prio("s2", 1), small.clone())
            .unwrap();
        nl.reserve(&scorer, with_prio("b1", 3), big.clone())
            .unwrap();
        // The scheduler offered s1 and b1 for a 1g pod: only one 1g victim is needed, and b1
        // (another profile) does not help. s2 has the lowest priority but was not offered; the
        // offered s1 comes first.
        let v = plan_victims(&nl, &small, 10, &["s1".into(), "b1".into()]).unwrap();
        assert_eq!(v, vec!["s1".to_string()]);
        // Offered nothing useful: the lowest-priority 1g holder is added.
        let v = plan_victims(&nl, &small, 10, &["b1".into()]).unwrap();
        assert_eq!(v, vec!["s2".to_string()]);
        // A 3g pod of priority 2 cannot evict b1 (priority 3) unless offered.
        assert_eq!(plan_victims(&nl, &big, 2, &["s2".into()]), None);
        assert_eq!(
            plan_victims(&nl, &big, 2, &["b1".into()]),
            Some(vec!["b1".to_string()])
        );
    }

    #[test]
    fn set_node_keeps_holdings() {
        let mut nl = NodeLedger::new(GpuNode::whole("n", "H100", 2, 81559));
        nl.reserve(
            &Scorer::new(PackingPolicy::Binpack),
            pref("a"),
            Demand::gpu(GpuDemand::Whole { count: 1 }),
        )
        .unwrap();
        nl.set_node(GpuNode::whole("n", "H100", 4, 81559));
        assert_eq!(nl.usage.slots, 1);
        assert_eq!(nl.usage.gpu_milli.len(), 4);
        assert_eq!(nl.holdings.len(), 1);
    }
}

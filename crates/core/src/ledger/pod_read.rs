//! PURE: a pod's GPU demand and holding, read from the pod alone: its `gpu-share.io/request`
//! annotation checked against its `nvidia.com/*` limits, `spec.nodeName`, and the
//! `gpu-share.io/gpus` model written at bind.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use super::holder::PodRef;
use crate::defrag::mobility::Consent;
use crate::inventory::{self, MIG_RESOURCE_PREFIX};
use crate::packing::{Demand, Devices, GpuDemand, Placement};
use crate::request::{ANNOTATION_REQUEST, GpuClass, GpuRequest};

/// The per-GPU model of a bound pod (`index:milli,...`), written with the binding.
pub const ANNOTATION_GPUS: &str = "gpu-share.io/gpus";

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
    let resources: Vec<String> = pod
        .spec
        .as_ref()
        .map(|s| limit_totals(s, true).into_keys().collect())
        .unwrap_or_default();
    let devices = if matches!(gpu, GpuDemand::Timeslice { .. } | GpuDemand::Mps { .. })
        && resources.is_empty()
    {
        pod.spec.as_ref().and_then(devices_configmap)
    } else {
        None
    };
    Ok(Some(Demand {
        cpu_milli: pod.spec.as_ref().map_or(0, pod_cpu_milli),
        models: pod_models(pod),
        resources,
        devices,
        driver_limit_mib: pod.spec.as_ref().and_then(driver_limit_mib),
        ..Demand::gpu(gpu)
    }))
}

/// The memory limit the Container Toolkit's hook applies to a container of the pod, MiB: both
/// `NVIDIA_GPU_MEMORY_REQUEST` and `NVIDIA_GPU_MEMORY_LIMIT` set as literal numbers (the hook
/// skips a container that lacks either), read from the env kubelet resolves.
pub fn driver_limit_mib(spec: &k8s_openapi::api::core::v1::PodSpec) -> Option<u64> {
    use crate::enforcement::{ENV_MEMORY_LIMIT, ENV_MEMORY_REQUEST};
    spec.containers.iter().find_map(|c| {
        let literal = |name: &str| -> Option<u64> {
            let e = c.env.iter().flatten().find(|e| e.name == name)?;
            e.value_from.is_none().then_some(())?;
            e.value.as_deref()?.trim().parse().ok()
        };
        let (request, limit) = (literal(ENV_MEMORY_REQUEST)?, literal(ENV_MEMORY_LIMIT)?);
        (request <= limit).then_some(limit)
    })
}

/// The ConfigMap, and its key, a pod's container reads `NVIDIA_VISIBLE_DEVICES` from (the
/// per-GPU form): read from the env kubelet resolves, not from the annotation that mirrors it,
/// which anyone who can edit the pod can change.
pub fn devices_configmap(spec: &k8s_openapi::api::core::v1::PodSpec) -> Option<Devices> {
    use crate::request::{CDI_DEVICE_KEY, DEVICES_KEY};
    spec.containers
        .iter()
        .flat_map(|c| c.env.iter().flatten())
        .filter(|e| e.name == DEVICES_KEY)
        .find_map(|e| {
            let r = e.value_from.as_ref()?.config_map_key_ref.as_ref()?;
            let cdi_device = match r.key.as_str() {
                DEVICES_KEY => false,
                CDI_DEVICE_KEY => true,
                _ => return None,
            };
            (!r.name.is_empty()).then(|| Devices {
                configmap: r.name.clone(),
                cdi_device,
            })
        })
}

/// The terms of a pod's required node affinity (alternatives), if it has one.
pub fn required_node_terms(
    spec: &k8s_openapi::api::core::v1::PodSpec,
) -> Option<&[k8s_openapi::api::core::v1::NodeSelectorTerm]> {
    spec.affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| r.node_selector_terms.as_slice())
}

/// The GPU models a pod may run on, as the inventory names a node's model (`GpuNode::product`),
/// from what it requires of `nvidia.com/gpu.product` (or, on GKE, of
/// `cloud.google.com/gke-accelerator`): a nodeSelector, and `In` expressions of a required node
/// affinity. The affinity's terms are alternatives, so it pins the model only when every term
/// does (then to all of theirs); with both, the pod needs both. Empty: any model.
pub fn pod_models(pod: &Pod) -> Vec<String> {
    use inventory::{LABEL_GKE_ACCELERATOR, LABEL_PRODUCT};
    // The node's product as the inventory reads it: no `-SHARED`, no single-strategy MIG suffix.
    let model = |v: &str| {
        let v = v.strip_suffix("-SHARED").unwrap_or(v);
        v.split_once("-MIG-").map_or(v, |(m, _)| m).to_string()
    };
    let is_model_key = |k: &str| k == LABEL_PRODUCT || k == LABEL_GKE_ACCELERATOR;
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let selected: Option<Vec<String>> = spec.node_selector.as_ref().and_then(|s| {
        let v: Vec<String> = s
            .iter()
            .filter(|(k, _)| is_model_key(k))
            .map(|(_, v)| model(v))
            .collect();
        (!v.is_empty()).then_some(v)
    });
    let terms = required_node_terms(spec).unwrap_or_default();
    // Each term's allowed models (`None`: the term allows any); the affinity's, their union.
    let mut affinity: Option<Vec<String>> = None;
    for term in terms {
        let mut allowed: Option<Vec<String>> = None;
        for e in term.match_expressions.iter().flatten() {
            if !is_model_key(&e.key) || e.operator != "In" {
                continue;
            }
            let values: Vec<String> = e.values.iter().flatten().map(|v| model(v)).collect();
            allowed = Some(match allowed {
                None => values,
                Some(prev) => prev.into_iter().filter(|m| values.contains(m)).collect(),
            });
        }
        let Some(allowed) = allowed else {
            // A term that does not pin the model lets the pod run on any.
            affinity = None;
            break;
        };
        let union = affinity.get_or_insert_with(Vec::new);
        for m in allowed {
            if !union.contains(&m) {
                union.push(m);
            }
        }
    }
    match (selected, affinity) {
        (Some(s), Some(a)) => s.into_iter().filter(|m| a.contains(m)).collect(),
        (Some(only), None) | (None, Some(only)) => only,
        (None, None) => Vec::new(),
    }
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
        GpuDemand::None | GpuDemand::Units { .. } | GpuDemand::ReservationPod { .. } => true,
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
    let m = &pod.metadata;
    PodRef::new(
        m.uid.clone().unwrap_or_default(),
        m.namespace.clone().unwrap_or_default(),
        m.name.clone().unwrap_or_default(),
    )
    .with_priority(pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0))
    .controlled_by(spread_controller(pod))
}

/// The UID of the ReplicaSet, StatefulSet or ReplicationController controlling the pod: the
/// controllers whose pods kube-scheduler's default topology spread (`defaultingType: System`)
/// spreads over hosts and zones. A Deployment's pods are its ReplicaSets'.
pub fn spread_controller(pod: &Pod) -> Option<String> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| {
            o.controller == Some(true)
                && matches!(
                    o.kind.as_str(),
                    "ReplicaSet" | "StatefulSet" | "ReplicationController"
                )
        })
        .map(|o| o.uid.clone())
}

/// What the extender keeps of a pod seen in filter or prioritize until it binds it: its
/// identity, its key for logs and its demand (or why it has none), which is all bind reads. A
/// Pod as kube-scheduler sends it is tens of KB (managedFields, env, volumes, probes, status,
/// up to 256 KiB of annotations); this is a few hundred bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindPod {
    pub pod: PodRef,
    pub key: String,
    pub demand: Result<Option<Demand>, DemandError>,
    /// Its controller and pod template, where a controller that recreates pods owns it: how a
    /// replacement for a pod defragmentation moved is known ([`crate::defrag::flight`]).
    pub lineage: Option<crate::defrag::flight::Lineage>,
}

impl BindPod {
    pub fn of(pod: &Pod) -> Self {
        BindPod {
            pod: pod_ref(pod),
            key: pod_key(pod),
            demand: demand_of_pod(pod),
            lineage: crate::defrag::flight::Lineage::of(pod),
        }
    }

    /// About how many bytes it takes in memory (the pod cache is bounded by this).
    pub fn size(&self) -> u32 {
        let p = &self.pod;
        let demand = match &self.demand {
            Ok(Some(d)) => d.models.iter().map(|m| m.len() + 24).sum::<usize>() + 64,
            Ok(None) => 0,
            Err(DemandError::BadRequestAnnotation(a, b) | DemandError::Mixed(a, b)) => {
                a.len() + b.len() + 96
            }
        };
        let n = std::mem::size_of::<Self>()
            + p.uid.len()
            + p.namespace.len()
            + p.name.len()
            + self.key.len()
            + p.controller.as_ref().map_or(0, |c| c.len())
            + self.lineage.as_ref().map_or(0, |l| {
                l.controller.len() + l.template.as_ref().map_or(0, |t| t.len())
            })
            + demand
            + 64;
        u32::try_from(n).unwrap_or(u32::MAX)
    }
}

/// PURE: a pod that waits for a node: none assigned, not being deleted, still Pending.
pub fn waits_for_a_node(pod: &Pod) -> bool {
    pod.spec.as_ref().is_none_or(|s| s.node_name.is_none())
        && pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_none_or(|phase| phase == "Pending")
}

/// True when a pod no longer holds anything (Succeeded or Failed).
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

/// PURE: the GPU resources of a gpu-share pod (`gpu-share.io/request`) that was bound without
/// the extender: it has a node but no `gpu-share.io/gpus`, which the extender's bind always
/// writes (empty for MIG) in the same call as the binding. kube-scheduler calls an extender only
/// for pods that request one of its `managedResources`, so these are most likely resources the
/// scheduler configuration does not list. `None` for every other pod.
pub fn bound_without_extender(pod: &Pod) -> Option<Vec<String>> {
    let annotations = pod.metadata.annotations.as_ref()?;
    if !annotations.contains_key(crate::request::ANNOTATION_REQUEST)
        || annotations.contains_key(ANNOTATION_GPUS)
        || is_terminal(pod)
    {
        return None;
    }
    let spec = pod.spec.as_ref()?;
    spec.node_name.as_ref()?;
    let mut resources: Vec<String> = limit_totals(spec, true).into_keys().collect();
    let asks_share = spec.containers.iter().any(|c| {
        c.resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .is_some_and(|l| l.contains_key(crate::request::RESOURCE_SHARE))
    });
    if asks_share {
        resources.push(crate::request::RESOURCE_SHARE.to_string());
    }
    Some(resources)
}

/// What a pod seen in the API holds: `None` if it holds nothing (no GPU, not bound, finished).
pub fn observed_holding(pod: &Pod) -> Result<Option<ObservedPod>, DemandError> {
    let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
        return Ok(None);
    };
    if is_terminal(pod) {
        return Ok(None);
    }
    // A reservation (gpu-share's own, in its namespace) holds its GPU for shares, not whole.
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    if let Some(reserved) =
        crate::reservation::reserved_gpu(namespace, pod.metadata.annotations.as_ref())
    {
        return Ok(Some(ObservedPod {
            pod: pod_ref(pod),
            node,
            demand: Demand {
                cpu_milli: pod.spec.as_ref().map_or(0, pod_cpu_milli),
                ..Demand::gpu(reserved)
            },
            gpus: None,
        }));
    }
    let Some(demand) = demand_of_pod(pod)? else {
        return Ok(None);
    };
    // What the pod says of being moved is read where its holding is recorded (not at every
    // filter's reading).
    let consent = Consent::of(pod);
    let gpus = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_GPUS))
        .and_then(|t| Placement::parse_gpus(t));
    Ok(Some(ObservedPod {
        pod: pod_ref(pod).consenting(consent),
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

/// Whether a bind annotation can be what `demand` holds on a node of `node_gpus` GPUs, where
/// the model's own choice for it takes `model_milli` thousandths: each GPU on the node and none
/// over full, and either as much as the model's choice (the model may round a share up to a
/// replica, and sizes device-plugin units by the node) or the demand's own footprint (a share's
/// thousandths on one GPU, whole GPUs whole), which holds where the model has no room for the pod.
pub(super) fn annotation_fits(
    gpus: &[(u32, u32)],
    demand: &GpuDemand,
    node_gpus: u32,
    model_milli: u32,
) -> bool {
    let own = match (demand, gpus) {
        // A time-slicing share takes its thousandths; an MPS share at least its own (a node's
        // replica, which bind models, may be larger).
        (GpuDemand::Timeslice { milli, .. }, [(_, m)]) => m == milli,
        (GpuDemand::Mps { milli, .. }, [(_, m)]) => m >= milli,
        (GpuDemand::Whole { count }, _) => {
            gpus.len() == *count as usize && gpus.iter().all(|(_, m)| *m == 1000)
        }
        _ => false,
    };
    !gpus.is_empty()
        && gpus.iter().all(|(i, m)| *i < node_gpus && *m > 0)
        && no_gpu_over_full(gpus)
        && (own || gpus.iter().map(|(_, m)| m).sum::<u32>() == model_milli)
}

/// A bind annotation's per-GPU shares add up to at most one GPU on every GPU it names.
pub(super) fn no_gpu_over_full(gpus: &[(u32, u32)]) -> bool {
    let mut per: BTreeMap<u32, u32> = BTreeMap::new();
    gpus.iter().all(|(i, m)| {
        let e = per.entry(*i).or_default();
        *e = e.saturating_add(*m);
        *e <= 1000
    })
}

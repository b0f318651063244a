//! What the extender reports of its ledger: `/v1/nodes` (each node's capacity, use and holders),
//! each node's GPUs by class, and the fragmentation gauge.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::ledger::NodeLedger;
use crate::packing::{self, Demand};
use crate::reservation::plan::ReservationState;
use crate::reservation::view::ReservationPod;

/// `/v1/nodes`: every GPU node with its capacity, use and holders.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    pub name: String,
    /// e.g. `time-slicing x4`; `whole (unverified)` when no label says how the GPUs are shared.
    pub kind: String,
    /// Where the sharing mode was read from: `gfd`, `gke`, `declared` (the policy's nodeModes),
    /// `instance-type` (the cloud's GPU count for it), `dra` or `unverified`.
    #[serde(default)]
    pub mode_source: crate::inventory::ModeSource,
    pub product: Option<String>,
    /// Physical GPUs, MIG-partitioned ones included ([`crate::inventory::GpuNode::physical_gpus`]).
    pub gpus: u32,
    /// What the node's MIG devices add up to, in GPUs by compute share (seven `1g.10gb` are
    /// 7/7 = 1; `3g.40gb` + `3g.40gb` are 6/7 of their GPU): the allocatable part of its
    /// MIG-partitioned GPUs. 0 without MIG.
    #[serde(default)]
    pub mig_gpus: f64,
    /// Use and free room in GPUs: whole GPUs, shares of GPUs, and MIG devices by compute share.
    pub used_gpus: f64,
    pub free_gpus: f64,
    /// Enforced units: pool slots and MIG devices per profile, as `used/total`.
    pub slots: String,
    /// The resource the pool's units are advertised as (`nvidia.com/gpu`, or
    /// `nvidia.com/gpu.shared` under the device plugin's `renameByDefault`).
    #[serde(default)]
    pub resource: String,
    /// Units per GPU of a shared pool (1 unshared).
    #[serde(default)]
    pub replicas: u32,
    /// Memory of one full GPU, MiB (GFD's `nvidia.com/gpu.memory`).
    #[serde(default)]
    pub gpu_memory_mib: Option<u64>,
    pub mig: BTreeMap<String, String>,
    /// Memory of one MIG device per profile, MiB (GFD's labels).
    #[serde(default)]
    pub mig_memory_mib: BTreeMap<String, u64>,
    /// Why no pod of the node's class can use it, when none can (the pods ask for a resource
    /// the node does not advertise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreached: Option<String>,
    /// Why the node, which asks for per-GPU sharing (label or policy), is not shared per GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_gpu_refused: Option<String>,
    /// What holds a share's memory to its budget here, in words ([`crate::enforcement::summary`]).
    #[serde(default)]
    pub enforcement: String,
    /// The node's driver version, as read (GFD's labels, or the policy's `nodeModes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// Whether the driver's per-container memory limits hold shares here.
    #[serde(default)]
    pub driver_memory_limits: bool,
    pub pods: Vec<PodReport>,
    /// The GPUs gpu-share shares per GPU: each with its reservation and the shares bound to it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_gpus: Vec<SharedGpuReport>,
    /// The node's GPUs by the class of pod they take: its full GPUs under its sharing mode
    /// (`exclusive`, `timeslice`, `mps` or `shared`), and its MIG devices as `mig`.
    #[serde(default)]
    pub classes: Vec<ClassReport>,
    /// Free GPU capacity here that the most common request can no longer use, in GPUs (the
    /// node's part of `gpu_share_fragmented_gpu_milli`); absent when no request is known yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fragmented_gpus: Option<f64>,
    /// Cordoned (`spec.unschedulable`): kube-scheduler places nothing new here.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cordoned: bool,
    /// Defragmentation's plans that would make room here, in words (`defrag.mode: plan`: told,
    /// nothing moves).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub defrag_plans: Vec<String>,
}

/// What can hold a budgeted share's memory on a node: the driver's limit, the device plugin's
/// MPS split, or `none`.
fn memory_holders(n: &crate::inventory::GpuNode) -> Vec<&'static str> {
    use crate::enforcement::{Hold, Share, memory_hold};
    let facts = n.enforcement_facts();
    let mut out = Vec::new();
    for share in [
        Share::Timeslice {
            memory_mib: Some(1),
        },
        Share::Mps {
            memory_mib: Some(1),
        },
        Share::Mps { memory_mib: None },
    ] {
        if let Hold::Held(h) = memory_hold(facts, share)
            && !out.contains(&h.as_str())
        {
            out.push(h.as_str());
        }
    }
    if out.is_empty() {
        out.push("none");
    }
    out
}

/// One class of a node's GPUs ([`gpus_by_class`]), in GPUs.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClassReport {
    pub class: String,
    pub total: f64,
    pub used: f64,
}

/// One GPU that gpu-share shares per GPU, as the ledger and the reservations' watch show it.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SharedGpuReport {
    pub gpu: u32,
    /// The reservation pod that holds it (in `gpu-share-reservations`); none while one is
    /// created again.
    pub reservation: Option<String>,
    /// `starting`, `ready`, `failed`, `leaving`, or `absent` (no reservation pod).
    pub state: String,
    /// The GPU's UUID, as its reservation published it.
    pub uuid: Option<String>,
    /// Why the reservation failed, or why its container waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The pods that share it, `namespace/name`.
    pub shares: Vec<String>,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodReport {
    pub namespace: String,
    pub name: String,
    pub class: String,
    pub gpus: f64,
    /// The per-GPU model (`index:milli`), empty for MIG.
    pub model: String,
    /// The class of the request: `exclusive`, `timeslice`, `mps`, `mig`, `device` (NVIDIA
    /// resources asked directly) or `reservation`.
    #[serde(default)]
    pub kind: String,
}

/// One node's MIG devices in GPUs by compute share: capacity, use, and `used/total` per profile.
fn mig_use(nl: &NodeLedger, mig: &crate::mig::MigTable) -> (f64, f64, BTreeMap<String, String>) {
    let n = &nl.node;
    let u = &nl.usage;
    // On the node's model (its product label), never another model's table.
    let mig_share = |profile: &str| -> f64 {
        f64::from(mig.share_milli(n.product.as_deref(), profile)) / 1000.0
    };
    match &n.mig {
        crate::inventory::MigLayout::None => (0.0, 0.0, BTreeMap::new()),
        crate::inventory::MigLayout::Single { profile, .. } => (
            f64::from(n.slots) * mig_share(profile),
            f64::from(u.slots) * mig_share(profile),
            [(profile.clone(), format!("{}/{}", u.slots, n.slots))].into(),
        ),
        crate::inventory::MigLayout::Mixed { instances } => {
            let cap = instances
                .iter()
                .map(|(p, c)| f64::from(*c) * mig_share(p))
                .sum();
            let used = u
                .mig
                .iter()
                .map(|(p, c)| f64::from(*c) * mig_share(p))
                .sum();
            let counts = instances
                .iter()
                .map(|(p, c)| {
                    (
                        p.clone(),
                        format!("{}/{}", u.mig.get(p).copied().unwrap_or(0), c),
                    )
                })
                .collect();
            (cap, used, counts)
        }
    }
}

/// One node's GPUs by the class of pod they take, in GPUs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClassGpus {
    /// `exclusive`, `timeslice`, `mps` or `mig` (`shared` for the simulator's per-GPU model).
    pub class: &'static str,
    pub total: f64,
    pub used: f64,
}

/// A node's GPUs by class: its full GPUs under its sharing mode, and its MIG devices as `mig`.
pub fn gpus_by_class(nl: &NodeLedger, mig: &crate::mig::MigTable) -> Vec<ClassGpus> {
    let n = &nl.node;
    let mut out = Vec::with_capacity(2);
    if n.gpus > 0 {
        out.push(ClassGpus {
            class: match n.sharing {
                crate::inventory::Sharing::None => "exclusive",
                crate::inventory::Sharing::TimeSlicing { .. } => "timeslice",
                crate::inventory::Sharing::Mps { .. } => "mps",
                crate::inventory::Sharing::PerGpu => "shared",
            },
            total: f64::from(n.gpus),
            used: nl.usage.allocated_milli() as f64 / 1000.0,
        });
    }
    let (total, used, _) = mig_use(nl, mig);
    if total > 0.0 {
        out.push(ClassGpus {
            class: "mig",
            total,
            used,
        });
    }
    out
}

/// The GPUs of one node that gpu-share shares per GPU: those its shares in per-GPU form are
/// bound to, and those a reservation of `reservations` (the node's) holds.
fn shared_gpus(nl: &NodeLedger, reservations: &[ReservationPod]) -> Vec<SharedGpuReport> {
    let mut gpus: BTreeMap<u32, SharedGpuReport> = BTreeMap::new();
    fn entry(gpus: &mut BTreeMap<u32, SharedGpuReport>, gpu: u32) -> &mut SharedGpuReport {
        gpus.entry(gpu).or_insert_with(|| SharedGpuReport {
            gpu,
            reservation: None,
            state: "absent".into(),
            uuid: None,
            detail: None,
            shares: Vec::new(),
        })
    }
    for h in nl.holdings.values() {
        if h.demand.devices.is_some() {
            for (i, _) in &h.placement.gpus {
                entry(&mut gpus, *i)
                    .shares
                    .push(format!("{}/{}", h.pod.namespace, h.pod.name));
            }
        }
    }
    for r in reservations.iter().filter(|r| r.node == nl.node.name) {
        let e = entry(&mut gpus, r.gpu);
        // A reservation being deleted yields to the one that replaces it.
        if r.state == ReservationState::Leaving && e.reservation.is_some() {
            continue;
        }
        e.reservation = Some(r.name.clone());
        e.state = r.state.word().into();
        e.uuid = r.state.uuid().map(str::to_string);
        e.detail = r.state.detail().map(str::to_string);
    }
    gpus.into_values().collect()
}

/// Reservation pods by node name.
pub fn by_node(reservations: Vec<ReservationPod>) -> HashMap<String, Vec<ReservationPod>> {
    let mut out: HashMap<String, Vec<ReservationPod>> = HashMap::new();
    for r in reservations {
        out.entry(r.node.clone()).or_default().push(r);
    }
    out
}

/// Builds the `/v1/nodes` report for one node ledger, with the node's reservation pods.
pub fn report(
    nl: &NodeLedger,
    mig: &crate::mig::MigTable,
    reservations: &[ReservationPod],
) -> NodeReport {
    let n = &nl.node;
    let u = &nl.usage;
    let (mig_cap, mig_used, mig_counts) = mig_use(nl, mig);
    let gpu_cap = f64::from(n.gpus);
    let gpu_used = u.allocated_milli() as f64 / 1000.0;
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    let dra = n.mode_source == crate::inventory::ModeSource::Dra;
    NodeReport {
        name: n.name.clone(),
        kind: match n.mode_source {
            crate::inventory::ModeSource::Unverified => format!("{} (unverified)", n.kind()),
            crate::inventory::ModeSource::Declared => format!("{} (declared)", n.kind()),
            crate::inventory::ModeSource::InstanceType => format!("{} (instance type)", n.kind()),
            crate::inventory::ModeSource::Dra => format!("DRA: {}", n.kind()),
            _ => n.kind(),
        },
        mode_source: n.mode_source,
        product: n.product.clone(),
        gpus: n.physical_gpus(),
        mig_gpus: round(mig_cap),
        used_gpus: round(gpu_used + mig_used),
        free_gpus: round((gpu_cap - gpu_used).max(0.0) + (mig_cap - mig_used).max(0.0)),
        slots: format!("{}/{}", u.slots, n.slots),
        resource: n.pool_resource.clone(),
        replicas: n.sharing.replicas(),
        gpu_memory_mib: n.gpu_memory_mib,
        mig: mig_counts,
        mig_memory_mib: n.mig_memory_mib.clone(),
        unreached: n
            .unreached
            .as_ref()
            .map(crate::inventory::Unreached::sentence),
        per_gpu_refused: n.per_gpu_refused.clone(),
        enforcement: crate::enforcement::summary(n.enforcement_facts()),
        driver: n.enforcement.driver.clone(),
        driver_memory_limits: n.enforcement.memory_limits
            == crate::enforcement::MemoryLimits::Applied
            && !n.enforcement_facts().all_mig,
        pods: nl
            .holdings
            .values()
            .map(|h| PodReport {
                namespace: h.pod.namespace.clone(),
                name: h.pod.name.clone(),
                class: h.demand.gpu.to_string(),
                gpus: round(h.demand.gpu.gpus()),
                // On a DRA node the DRA plugin chose the devices, not gpu-share: no per-GPU
                // model is shown there.
                model: if dra {
                    String::new()
                } else {
                    h.placement.gpus_text()
                },
                kind: if h.pod.holder == crate::ledger::Holder::Claim {
                    "dra-claim".to_string()
                } else {
                    h.demand.gpu.class().to_string()
                },
            })
            .collect(),
        shared_gpus: shared_gpus(nl, reservations),
        classes: gpus_by_class(nl, mig)
            .into_iter()
            .map(|c| ClassReport {
                class: c.class.to_string(),
                total: round(c.total),
                used: round(c.used),
            })
            .collect(),
        fragmented_gpus: None,
        cordoned: false,
        defrag_plans: Vec::new(),
    }
}

/// The fragmentation gauge: free GPU capacity (in GPUs) on nodes where `demand` cannot fit for
/// lack of capacity (nodes of another class do not count).
pub fn fragmented_gpus<'a>(
    nodes: impl IntoIterator<Item = &'a NodeLedger>,
    demand: &Demand,
) -> f64 {
    nodes.into_iter().map(|nl| fragmented_on(nl, demand)).sum()
}

/// One node's share of [`fragmented_gpus`].
pub fn fragmented_on(nl: &NodeLedger, demand: &Demand) -> f64 {
    match packing::fit(&nl.node, &nl.usage, demand) {
        Err(r) if r.resolvable() => {
            let free: u64 = nl
                .usage
                .gpu_milli
                .iter()
                .map(|m| u64::from(1000u32.saturating_sub(*m)))
                .sum();
            free as f64 / 1000.0
        }
        _ => 0.0,
    }
}

/// Computes the extender's gauges from the live state (at scrape time): fragmentation, held
/// pods, GPU nodes, each node's GPUs by class, and the pending pods by class. Each node is read
/// under its own lock, one at a time; nothing is copied.
pub fn update_gauges(
    ext: &super::state::ExtenderState,
    metrics: &crate::metrics::Metrics,
    mig: &crate::mig::MigTable,
) {
    let common = ext.most_common_demand();
    let mut frag = 0.0;
    let mut pods = 0;
    let mut rows: Vec<(String, ClassGpus)> = Vec::new();
    let mut held: Vec<(String, Vec<&'static str>)> = Vec::new();
    let nodes = ext.ledger().for_each_node(|nl| {
        held.push((nl.node.name.clone(), memory_holders(&nl.node)));
        if let Some(d) = &common {
            frag += fragmented_on(nl, d);
        }
        pods += nl.holdings.len();
        for c in gpus_by_class(nl, mig) {
            rows.push((nl.node.name.clone(), c));
        }
    });
    metrics.ledger(frag, pods, nodes);
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    let rows: Vec<crate::metrics::NodeGpus<'_>> = rows
        .iter()
        .map(|(node, c)| crate::metrics::NodeGpus {
            node,
            class: c.class,
            allocated: round(c.used),
            free: round((c.total - c.used).max(0.0)),
        })
        .collect();
    metrics.node_gpus(&rows);
    let held: Vec<(&str, Vec<&str>)> = held.iter().map(|(n, h)| (n.as_str(), h.clone())).collect();
    metrics.node_memory_held(&held);
    let pending: Vec<_> = ext
        .pending_by_class(std::time::SystemTime::now())
        .into_iter()
        .map(|p| (p.class, p.pods, p.oldest_seconds.round()))
        .collect();
    metrics.pending(&pending);
    metrics.contradicted(ext.contradicted_pods());
    let reservations = ext.reservations.pods();
    metrics.reservations(reservations.iter().map(|r| r.state.word()));
}

//! PURE: a Kubernetes Node (GPU Feature Discovery labels and `status.allocatable`) becomes a
//! [`GpuNode`]: what the NVIDIA device plugin on it enforces, which is what the extender accounts.
//!
//! Labels read (protocols.md 3.4), as GFD writes them (`tests/fixtures/nvidia/` holds nodes
//! from GFD's and the device plugin's own code): `nvidia.com/gpu.product` (the `-SHARED` suffix
//! ignored; the single-strategy `-MIG-<profile>` suffix names the profile, the part before it
//! the model whose MIG geometry applies), `gpu.count`, `gpu.memory`, `gpu.replicas`,
//! `gpu.sharing-strategy`, `mig.strategy`, `mig.config`, `mig-<profile>.memory`. Capacity comes
//! from allocatable: `nvidia.com/gpu`, or for shared GPUs the name the node advertises
//! (`nvidia.com/gpu.shared` under `renameByDefault`), and each `nvidia.com/mig-<profile>`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;

pub use crate::nvidia::*;

mod instance_types;
mod node;
mod offers;
mod quantity;
mod sharing;
mod warnings;
pub use instance_types::LABEL_INSTANCE_TYPE;
pub use node::{GpuNode, MigLayout, Unreached};
pub use offers::{FormBasis, MigForm, MigOffers};
pub use quantity::{profile_from_resource_suffix, quantity_count, quantity_milli};
pub use sharing::{ModeSource, Sharing};
use warnings::{
    warn_instance_shared_once, warn_per_gpu_refused_once, warn_unreached_once, warn_unverified_once,
};

/// How nodes are read: the resources each class of pod asks for, the modes the policy declares
/// for nodes whose labels do not say, and the MIG table (the policy's models first).
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    /// What timeslice pods ask for (the policy's `resources`).
    pub timeslice: String,
    /// What mps pods ask for.
    pub mps: String,
    /// Whether MIG pods ask for `nvidia.com/gpu` (the single strategy) rather than
    /// `nvidia.com/mig-<profile>`; `None` under the `auto` strategy: what each node offers.
    pub mig_single: Option<bool>,
    pub declared: Vec<crate::policy::NodeMode>,
    pub mig: crate::mig::MigTable,
    /// What the policy says about the nodes' toolkits ([`crate::enforcement::read`]).
    pub enforcement: crate::enforcement::EnforcementReading,
}

impl Default for Reading {
    fn default() -> Self {
        Reading::from(RESOURCE_GPU)
    }
}

impl From<&str> for Reading {
    /// Shared pods of both classes ask for `shared`; the mixed MIG strategy; built-in models.
    fn from(shared: &str) -> Self {
        Reading {
            timeslice: shared.to_string(),
            mps: shared.to_string(),
            mig_single: Some(false),
            declared: Vec::new(),
            mig: crate::mig::MigTable::default(),
            enforcement: Default::default(),
        }
    }
}

impl Reading {
    pub fn of(policy: &crate::policy::Policy) -> Self {
        Reading {
            timeslice: policy.resources.timeslice_resource().to_string(),
            mps: policy.resources.mps_resource().to_string(),
            mig_single: match policy.mig.strategy {
                crate::policy::MigStrategy::Single => Some(true),
                crate::policy::MigStrategy::Mixed => Some(false),
                crate::policy::MigStrategy::Auto => None,
            },
            declared: policy.node_modes.clone(),
            mig: policy.mig_table(),
            enforcement: crate::enforcement::EnforcementReading {
                memory_limit_hook: policy.enforcement.memory_limit_hook,
                timeslice_cdi: policy.per_gpu.timeslice_cdi,
            },
        }
    }

    /// Whether the pods of the node's class ask for a resource the node does not advertise:
    /// then none of them can use it ([`Unreached`]). A node that advertises nothing (its device
    /// plugin not registered yet) is not one: there is no name to disagree with.
    pub fn unreached(&self, node: &GpuNode) -> Option<Unreached> {
        if node.advertised.is_empty() {
            return None;
        }
        let (class, asks) = match (&node.mig, node.sharing) {
            // Under `auto` a MIG pod asks for what the nodes offering its profile advertise.
            (MigLayout::Single { .. }, _) if self.mig_single.is_none() => return None,
            (MigLayout::Single { profile, .. }, _) => (
                "mig",
                if self.mig_single == Some(true) {
                    RESOURCE_GPU.to_string()
                } else {
                    crate::mig::resource_name(profile)
                },
            ),
            // All MIG, mixed strategy: MIG pods ask per profile unless the policy says single.
            (MigLayout::Mixed { .. }, _) if node.gpus == 0 => {
                if self.mig_single != Some(true) {
                    return None;
                }
                ("mig", RESOURCE_GPU.to_string())
            }
            (_, Sharing::TimeSlicing { .. }) => ("timeslice", self.timeslice.clone()),
            (_, Sharing::Mps { .. }) => ("mps", self.mps.clone()),
            _ => ("exclusive", RESOURCE_GPU.to_string()),
        };
        (!node.advertises(&asks)).then(|| Unreached {
            class,
            pods_ask_for: asks,
            node_advertises: node.advertised.clone(),
        })
    }
}

/// [`from_node`], then the policy's declared mode for a node whose labels do not say; warns
/// once per node when the mode is still a guess, or when no pod of its class can use it
/// ([`Reading::unreached`], shown in [`GpuNode::unreached`]). What the extender and `status` use.
pub fn read_node(node: &Node, reading: &Reading) -> Option<GpuNode> {
    let g = from_node(node, reading)?;
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    let labelled = g.mode_source != ModeSource::Unverified;
    let g = declare(g, labels, &reading.declared, &reading.mig);
    let g = by_instance_type(g, labels);
    let mut g = opt_in_per_gpu(g, labels, &reading.declared, labelled);
    g.unreached = reading.unreached(&g);
    // GKE's stack runs no Container Toolkit. (On a node shared per GPU, the limits reach MPS
    // shares, through their GPU's CDI device, and not time-sliced ones: said per share.)
    if g.enforcement.memory_limits == crate::enforcement::MemoryLimits::Applied
        && g.mode_source == ModeSource::Gke
    {
        g.enforcement.memory_limits = crate::enforcement::MemoryLimits::GkeStack;
    }
    if g.mode_source == ModeSource::Unverified {
        warn_unverified_once(&g.name);
    }
    if let Some(why) = &g.per_gpu_refused {
        warn_per_gpu_refused_once(&g.name, why);
    }
    if let Some(u) = &g.unreached {
        warn_unreached_once(&g.name, &u.pods_ask_for, &u.sentence());
    }
    Some(g)
}

impl MigOffers {
    /// What a cluster offers: its nodes read with `reading` ([`MigOffers::of`]), the MIG
    /// strategy its GPU nodes are labelled with, and the pools `reading`'s `nodeModes` declare.
    pub fn of_cluster(nodes: &[Node], reading: &Reading) -> Self {
        let read: Vec<GpuNode> = nodes.iter().filter_map(|n| from_node(n, reading)).collect();
        let mut offers = MigOffers::of(&read);
        offers.label_strategies(nodes.iter().filter_map(|n| {
            n.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_MIG_STRATEGY))
                .map(String::as_str)
        }));
        offers.declare(&reading.declared);
        offers
    }
}

/// The first `nodeModes` rule that declares a mode (a sharing mode or a MIG profile) and
/// selects a node of `labels`: the one that applies to it.
pub fn declared_mode<'a>(
    labels: &BTreeMap<String, String>,
    modes: &'a [crate::policy::NodeMode],
) -> Option<&'a crate::policy::NodeMode> {
    modes
        .iter()
        .find(|m| m.declares_mode() && m.selector.matches(labels))
}

/// Whether the rule that applies to a node of `labels` ([`declared_mode`]) declares it
/// `time-slicing`: on a node whose GPUs NVIDIA's DRA driver shares by consumable capacity, the
/// opt-in for gpu-share's time-sliced shares ([`crate::dra`]).
pub fn declares_time_slicing(
    labels: &BTreeMap<String, String>,
    modes: &[crate::policy::NodeMode],
) -> bool {
    declared_mode(labels, modes)
        .is_some_and(|m| m.sharing == Some(crate::policy::DeclaredSharing::TimeSlicing))
}

/// Applies the first declared mode whose selector matches `labels` to a node whose mode no
/// label states (GFD's and GKE's labels win).
pub fn declare(
    g: GpuNode,
    labels: &BTreeMap<String, String>,
    modes: &[crate::policy::NodeMode],
    mig: &crate::mig::MigTable,
) -> GpuNode {
    use crate::policy::DeclaredSharing;
    if g.mode_source != ModeSource::Unverified || g.mig != MigLayout::None {
        return g;
    }
    let Some(m) = declared_mode(labels, modes) else {
        return g;
    };
    let units = g.slots;
    if let Some(profile) = &m.mig_profile {
        return GpuNode {
            gpus: 0,
            sharing: Sharing::None,
            slots: clamp_mig_devices(&g.name, &g.pool_resource, units),
            mig: MigLayout::Single {
                profile: profile.clone(),
                per_gpu: mig.per_gpu(g.product.as_deref(), profile),
            },
            mode_source: ModeSource::Declared,
            ..g
        };
    }
    let sharing = match (m.sharing, m.replicas) {
        (Some(DeclaredSharing::TimeSlicing), Some(r)) => Sharing::TimeSlicing { replicas: r },
        (Some(DeclaredSharing::Mps), Some(r)) => Sharing::Mps { replicas: r },
        _ => Sharing::None,
    };
    let (gpus, slots) = clamp_pool(&g.name, &g.pool_resource, units, sharing.replicas());
    GpuNode {
        gpus,
        slots,
        sharing,
        mode_source: ModeSource::Declared,
        ..g
    }
}

/// A node whose mode neither a label nor the policy states, read by its instance type's GPU count
/// ([`instance_types`]): `nvidia.com/gpu` up to the count are whole GPUs; a multiple above it
/// are replicas of each GPU, which the device plugin time-slices or splits by MPS (taken as
/// time-slicing: no whole-GPU pod goes there). A type the table lacks, or a count no multiple of
/// the GPUs, leaves the node unverified.
pub fn by_instance_type(g: GpuNode, labels: &BTreeMap<String, String>) -> GpuNode {
    use instance_types::Advertised;
    if g.mode_source != ModeSource::Unverified
        || g.mig != MigLayout::None
        || g.sharing != Sharing::None
        || g.pool_resource != RESOURCE_GPU
    {
        return g;
    }
    let Some(kind) = labels.get(LABEL_INSTANCE_TYPE) else {
        return g;
    };
    let Some(t) = instance_types::lookup(kind) else {
        return g;
    };
    let sharing = match instance_types::advertised(g.slots, t.gpus) {
        Advertised::Whole => Sharing::None,
        Advertised::Replicas(replicas) => {
            warn_instance_shared_once(&g.name, kind, t.gpus, g.slots, replicas);
            Sharing::TimeSlicing { replicas }
        }
        Advertised::Unknown => return g,
    };
    let (gpus, slots) = clamp_pool(&g.name, &g.pool_resource, g.slots, sharing.replicas());
    GpuNode {
        gpus,
        slots,
        sharing,
        mode_source: ModeSource::InstanceType,
        ..g
    }
}

/// Per-GPU sharing for a node that asks for it: the label [`LABEL_SHARING_MODE`]`=per-gpu`, or
/// else the first `nodeModes` rule that applies to it (on a node whose labels state its mode,
/// `labelled`, only `per-gpu` rules do) saying `per-gpu`. Only a plain node qualifies: its device
/// plugin does not share its GPUs and none is in MIG mode, under NVIDIA's stack (GKE's own does
/// not honour `NVIDIA_VISIBLE_DEVICES`). A node that asks and does not qualify keeps its mode,
/// and says why in [`GpuNode::per_gpu_refused`].
pub fn opt_in_per_gpu(
    g: GpuNode,
    labels: &BTreeMap<String, String>,
    modes: &[crate::policy::NodeMode],
    labelled: bool,
) -> GpuNode {
    use crate::policy::DeclaredSharing;
    let asked = match labels.get(LABEL_SHARING_MODE).map(|v| v.trim()) {
        Some(PER_GPU) => format!("its label {LABEL_SHARING_MODE}={PER_GPU}"),
        Some(other) => {
            return GpuNode {
                per_gpu_refused: Some(format!(
                    "its label {LABEL_SHARING_MODE}={other:?} names no mode gpu-share knows (the one value is {PER_GPU})"
                )),
                ..g
            };
        }
        None => {
            let rule = modes.iter().enumerate().find(|(_, m)| {
                m.declares_mode()
                    && m.selector.matches(labels)
                    && (!labelled || m.sharing == Some(DeclaredSharing::PerGpu))
            });
            match rule {
                Some((i, m)) if m.sharing == Some(DeclaredSharing::PerGpu) => {
                    format!("the policy's nodeModes[{i}]")
                }
                _ => return g,
            }
        }
    };
    let refused = if g.mode_source == ModeSource::Gke {
        Some("it runs GKE's own GPU stack, whose device plugin and runtime do not honour NVIDIA_VISIBLE_DEVICES; per-GPU sharing needs NVIDIA's device plugin and Container Toolkit (the GPU Operator)".to_string())
    } else if g.mig != MigLayout::None {
        Some(format!(
            "its GPUs are in MIG mode ({}); per-GPU sharing needs plain GPUs",
            g.kind()
        ))
    } else if g.sharing != Sharing::None {
        Some(format!(
            "its device plugin shares its GPUs ({}); per-GPU sharing needs them unshared: leave the node out of the device plugin's sharing config",
            g.kind()
        ))
    } else {
        None
    };
    match refused {
        Some(why) => GpuNode {
            per_gpu_refused: Some(format!("{asked} asks for per-GPU sharing, but {why}")),
            ..g
        },
        None => GpuNode {
            sharing: Sharing::PerGpu,
            mode_source: if labelled {
                g.mode_source
            } else {
                ModeSource::Declared
            },
            ..g
        },
    }
}

fn label_u64(labels: &BTreeMap<String, String>, key: &str) -> Option<u64> {
    labels.get(key).and_then(|v| v.trim().parse().ok())
}

/// Builds the inventory of one node, read with `reading` (the policy's resource names and MIG
/// table). `None`: the node has no NVIDIA GPUs.
pub fn from_node(node: &Node, reading: &Reading) -> Option<GpuNode> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let allocatable: BTreeMap<String, String> = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .map(|a| a.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect())
        .unwrap_or_default();
    from_parts(&name, &labels, &allocatable, reading)
}

/// The resource a node's shared GPUs are advertised as: the first of the name the class's
/// pods ask for, `nvidia.com/gpu.shared` (`renameByDefault`) and `nvidia.com/gpu` that has a
/// unit, else the first present (a device plugin that has not registered its devices yet).
fn shared_pool(class_resource: &str, count: impl Fn(&str) -> Option<u64>) -> Option<(&str, u64)> {
    let names = [class_resource, RESOURCE_GPU_SHARED, RESOURCE_GPU];
    names
        .iter()
        .find_map(|r| count(r).filter(|n| *n > 0).map(|n| (*r, n)))
        .or_else(|| names.iter().find_map(|r| count(r).map(|n| (*r, n))))
}

/// What can hold a share's budget on the node with `labels` ([`crate::enforcement::read`]),
/// with the `nodeModes` rules that apply to it.
fn enforcement_of(
    labels: &BTreeMap<String, String>,
    reading: &Reading,
) -> crate::enforcement::Enforcement {
    let declared: Vec<crate::enforcement::Declared> = reading
        .declared
        .iter()
        .filter(|m| m.selector.matches(labels))
        .map(|m| crate::enforcement::Declared {
            driver_version: m.driver_version.clone(),
            memory_limit_hook: m.memory_limit_hook,
        })
        .collect();
    crate::enforcement::read(labels, &reading.enforcement, &declared)
}

/// [`from_node`] over plain maps (labels, allocatable quantities).
pub fn from_parts(
    name: &str,
    labels: &BTreeMap<String, String>,
    allocatable: &BTreeMap<String, String>,
    reading: &Reading,
) -> Option<GpuNode> {
    let count = |r: &str| allocatable.get(r).and_then(|q| quantity_count(q));
    let advertised: Vec<String> = allocatable
        .iter()
        .filter(|(k, v)| k.starts_with("nvidia.com/") && quantity_count(v).is_some_and(|n| n > 0))
        .map(|(k, _)| k.clone())
        .collect();
    // GFD's per-profile memory on a mixed-strategy node: `nvidia.com/mig-<profile>.memory`.
    let mut mig_memory_mib: BTreeMap<String, u64> = labels
        .iter()
        .filter_map(|(k, v)| {
            let suffix = k
                .strip_prefix(MIG_RESOURCE_PREFIX)?
                .strip_suffix(".memory")?;
            Some((profile_from_resource_suffix(suffix), v.trim().parse().ok()?))
        })
        .collect();
    let mig_instances: BTreeMap<String, u32> = allocatable
        .iter()
        .filter_map(|(k, v)| {
            let suffix = k.strip_prefix(MIG_RESOURCE_PREFIX)?;
            let n = quantity_count(v)?;
            Some((
                profile_from_resource_suffix(suffix),
                clamp_mig_devices(name, k, u32::try_from(n).unwrap_or(u32::MAX)),
            ))
        })
        .collect();
    let has_gfd = [
        LABEL_PRODUCT,
        LABEL_COUNT,
        LABEL_SHARING,
        LABEL_MIG_STRATEGY,
    ]
    .iter()
    .any(|l| labels.contains_key(*l));
    let gke_accelerator = labels.get(LABEL_GKE_ACCELERATOR);
    let gke_sharing = labels
        .get(LABEL_GKE_SHARING)
        .map(|v| v.trim().to_ascii_lowercase().replace('_', "-"));
    let gke_partition = labels
        .get(LABEL_GKE_PARTITION)
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty());
    let gke =
        !has_gfd && (gke_accelerator.is_some() || gke_sharing.is_some() || gke_partition.is_some());
    let gpu_alloc = count(RESOURCE_GPU);
    let any_shared_alloc = [
        reading.timeslice.as_str(),
        reading.mps.as_str(),
        RESOURCE_GPU_SHARED,
    ]
    .iter()
    .any(|r| count(r).is_some());
    if !has_gfd
        && gke_accelerator.is_none()
        && gpu_alloc.is_none()
        && !any_shared_alloc
        && mig_instances.is_empty()
    {
        return None;
    }
    let mode_source = if has_gfd {
        ModeSource::Gfd
    } else if gke {
        ModeSource::Gke
    } else {
        ModeSource::Unverified
    };
    let raw_product = labels
        .get(LABEL_PRODUCT)
        .or(if gke { gke_accelerator } else { None })
        .cloned();
    let mut product = raw_product
        .as_deref()
        .map(|p| p.strip_suffix("-SHARED").unwrap_or(p).to_string());
    let mig_strategy = labels.get(LABEL_MIG_STRATEGY).map(String::as_str);
    let label_replicas =
        u32::try_from(label_u64(labels, LABEL_REPLICAS).unwrap_or(1).max(1)).unwrap_or(u32::MAX);
    let gke_clients =
        u32::try_from(label_u64(labels, LABEL_GKE_CLIENTS).unwrap_or(1).max(1)).unwrap_or(u32::MAX);
    let sharing = match labels.get(LABEL_SHARING).map(String::as_str) {
        Some("mps") => Sharing::Mps {
            replicas: label_replicas,
        },
        Some("time-slicing") => Sharing::TimeSlicing {
            replicas: label_replicas,
        },
        Some("none") => Sharing::None,
        _ if label_replicas > 1 => Sharing::TimeSlicing {
            replicas: label_replicas,
        },
        _ if gke => match gke_sharing.as_deref() {
            Some("mps") => Sharing::Mps {
                replicas: gke_clients,
            },
            Some("time-sharing") => Sharing::TimeSlicing {
                replicas: gke_clients,
            },
            _ => Sharing::None,
        },
        _ => Sharing::None,
    };

    let cpu_milli = allocatable
        .get("cpu")
        .and_then(|q| quantity_milli(q))
        .map(|m| u64::try_from(m).unwrap_or(u64::MAX));
    let memory_mib = allocatable
        .get("memory")
        .and_then(|q| quantity_milli(q))
        .map(|m| u64::try_from(m / 1000 / (1 << 20)).unwrap_or(u64::MAX));
    let label_memory = label_u64(labels, LABEL_MEMORY);
    let label_count =
        u32::try_from(label_u64(labels, LABEL_COUNT).unwrap_or(0)).unwrap_or(u32::MAX);

    // Single strategy: MIG devices advertised as nvidia.com/gpu, product <model>-MIG-<profile>.
    // GFD writes a `+` of the profile as `.` (`1g.5gb.me`), as the resource names do.
    let single_profile = product.as_deref().and_then(|p| {
        p.split_once("-MIG-")
            .map(|(model, profile)| (model.to_string(), profile_from_resource_suffix(profile)))
    });
    // GKE's MIG partitions are advertised one nvidia.com/gpu each, as NVIDIA's single strategy.
    let gke_mig = if gke { gke_partition.clone() } else { None };
    if mig_strategy == Some("single") || single_profile.is_some() || gke_mig.is_some() {
        let profile = single_profile
            .as_ref()
            .map(|(_, p)| p.clone())
            .or_else(|| {
                labels
                    .get(LABEL_MIG_CONFIG)
                    .and_then(|c| c.strip_prefix("all-"))
                    .filter(|p| !matches!(*p, "disabled" | "enabled" | "balanced"))
                    .map(str::to_string)
            })
            .or(gke_mig);
        if gke && sharing != Sharing::None && profile.is_some() {
            tracing::warn!(
                node = name,
                "GKE node shares its MIG partitions ({LABEL_GKE_SHARING}); gpu-share accounts each unit of nvidia.com/gpu as one MIG device, so its MIG pods there are not isolated from each other"
            );
        }
        if let Some(profile) = profile {
            if let Some((model, _)) = single_profile {
                product = Some(model);
            }
            let slots = clamp_mig_devices(
                name,
                RESOURCE_GPU,
                u32::try_from(gpu_alloc.unwrap_or(u64::from(label_count))).unwrap_or(u32::MAX),
            );
            // Here GFD's gpu.memory is one MIG device's, not the GPU's.
            if let Some(m) = label_memory {
                mig_memory_mib.insert(profile.clone(), m);
            }
            let per_gpu = reading.mig.per_gpu(product.as_deref(), &profile);
            return Some(GpuNode {
                name: name.to_string(),
                product,
                gpus: 0,
                gpu_memory_mib: None,
                sharing: Sharing::None,
                slots,
                pool_resource: RESOURCE_GPU.to_string(),
                mig: MigLayout::Single { profile, per_gpu },
                cpu_milli,
                memory_mib,
                mode_source,
                labelled_gpus: None,
                mig_memory_mib,
                advertised,
                unreached: None,
                per_gpu_refused: None,
                shares_declared: false,
                enforcement: enforcement_of(labels, reading),
            });
        }
    }

    let (pool_resource, slots) = match sharing {
        Sharing::None | Sharing::PerGpu => (RESOURCE_GPU.to_string(), gpu_alloc.unwrap_or(0)),
        Sharing::TimeSlicing { .. } | Sharing::Mps { .. } => {
            let class = if matches!(sharing, Sharing::Mps { .. }) {
                &reading.mps
            } else {
                &reading.timeslice
            };
            shared_pool(class, count)
                .map_or((RESOURCE_GPU.to_string(), 0), |(r, n)| (r.to_string(), n))
        }
    };
    let slots = u32::try_from(slots).unwrap_or(u32::MAX);
    // Physical full GPUs not in MIG mode: the pool divided by replicas.
    let (gpus, slots) = clamp_pool(name, &pool_resource, slots, sharing.replicas());
    let mig = if mig_instances.is_empty() {
        MigLayout::None
    } else {
        MigLayout::Mixed {
            instances: mig_instances,
        }
    };
    let labelled_gpus =
        (label_count > 0 && matches!(mig, MigLayout::Mixed { .. })).then_some(label_count);
    Some(GpuNode {
        name: name.to_string(),
        product,
        gpus,
        gpu_memory_mib: label_memory,
        sharing,
        slots,
        pool_resource,
        mig,
        cpu_milli,
        memory_mib,
        mode_source,
        labelled_gpus,
        mig_memory_mib,
        advertised,
        unreached: None,
        per_gpu_refused: None,
        shares_declared: false,
        enforcement: enforcement_of(labels, reading),
    })
}

/// Bounds a node's full-GPU pool: more than [`MAX_GPUS_PER_NODE`] GPUs, or more than
/// `MAX_GPUS_PER_NODE * MAX_REPLICAS_PER_GPU` units, is taken as [`MAX_GPUS_PER_NODE`] GPUs at
/// most. Returns (GPUs, units).
fn clamp_pool(node: &str, resource: &str, slots: u32, replicas: u32) -> (u32, u32) {
    let gpus = slots / replicas.max(1);
    let max_slots = MAX_GPUS_PER_NODE * MAX_REPLICAS_PER_GPU;
    if gpus <= MAX_GPUS_PER_NODE && slots <= max_slots {
        return (gpus, slots);
    }
    // Units first, then the GPUs they make, so the two always agree.
    let clamped_slots = slots
        .min(MAX_GPUS_PER_NODE.saturating_mul(replicas.max(1)))
        .min(max_slots);
    let clamped_gpus = clamped_slots / replicas.max(1);
    tracing::warn!(
        node,
        resource,
        advertised = slots,
        replicas,
        gpus = clamped_gpus,
        units = clamped_slots,
        "node advertises more GPUs than gpu-share accounts per node ({MAX_GPUS_PER_NODE}); using {clamped_gpus} GPUs, {clamped_slots} units"
    );
    (clamped_gpus, clamped_slots)
}

/// Bounds a count of MIG devices to what [`MAX_GPUS_PER_NODE`] GPUs can hold.
fn clamp_mig_devices(node: &str, resource: &str, n: u32) -> u32 {
    let max = MAX_GPUS_PER_NODE * MAX_MIG_PER_GPU;
    if n <= max {
        return n;
    }
    tracing::warn!(
        node,
        resource,
        advertised = n,
        "node advertises more MIG devices than {MAX_GPUS_PER_NODE} GPUs can hold; using {max}"
    );
    max
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// A plain node opts in to per-GPU sharing by gpu-share's label or a `per-gpu` nodeModes
    /// rule (which applies to labelled nodes too); a node that does not qualify keeps its mode
    /// and says why.
    #[test]
    fn plain_nodes_opt_in_to_per_gpu_sharing_and_others_say_why_not() {
        let policy = crate::policy::Policy::load(
            "nodeModes:\n  - selector: {matchLabels: {pool: ts}}\n    sharing: time-slicing\n    replicas: 4\n  - selector: {matchExpressions: [{key: pool, operator: In, values: [ts, fractions]}]}\n    sharing: per-gpu\n",
            "p.yaml",
        )
        .unwrap()
        .policy;
        let reading = Reading::of(&policy);
        let node = |labels: serde_json::Value, alloc: serde_json::Value| -> GpuNode {
            let n: Node = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "n", "labels": labels},
                "status": {"allocatable": alloc}
            }))
            .unwrap();
            read_node(&n, &reading).unwrap()
        };
        let gfd = |extra: &[(&str, &str)]| {
            let mut l = serde_json::json!({
                LABEL_PRODUCT: "NVIDIA-A100-SXM4-80GB", LABEL_COUNT: "8",
                LABEL_MEMORY: "81920", LABEL_SHARING: "none",
            });
            for (k, v) in extra {
                l[*k] = serde_json::json!(v);
            }
            l
        };
        let eight = serde_json::json!({"nvidia.com/gpu": "8"});
        // By label.
        let n = node(gfd(&[(LABEL_SHARING_MODE, PER_GPU)]), eight.clone());
        assert_eq!(
            (n.sharing, n.gpus, n.mode_source, n.per_gpu_refused.clone()),
            (Sharing::PerGpu, 8, ModeSource::Gfd, None)
        );
        assert_eq!(n.kind(), "per-gpu");
        assert_eq!(n.pool_resource, RESOURCE_GPU);
        // By policy, on a labelled node: the time-slicing rule before it does not apply there.
        let n = node(gfd(&[("pool", "ts")]), eight.clone());
        assert_eq!(
            (n.sharing, n.mode_source),
            (Sharing::PerGpu, ModeSource::Gfd)
        );
        // An unlabelled node takes the first rule that matches: time-slicing here...
        let n = node(serde_json::json!({"pool": "ts"}), eight.clone());
        assert_eq!(n.sharing, Sharing::TimeSlicing { replicas: 4 });
        assert_eq!(n.per_gpu_refused, None);
        // ...and per-gpu there, declared.
        let n = node(serde_json::json!({"pool": "fractions"}), eight.clone());
        assert_eq!(
            (n.sharing, n.mode_source),
            (Sharing::PerGpu, ModeSource::Declared)
        );
        // No label and no rule: unchanged.
        let n = node(gfd(&[]), eight.clone());
        assert_eq!((n.sharing, n.per_gpu_refused), (Sharing::None, None));
        // Nodes that do not qualify keep their mode and say why, naming what asked.
        let refused = |n: GpuNode, sharing: Sharing, words: &[&str]| {
            assert_eq!(n.sharing, sharing);
            let why = n.per_gpu_refused.expect("a refusal in words");
            for w in words {
                assert!(why.contains(w), "{why:?} lacks {w:?}");
            }
        };
        refused(
            node(
                gfd(&[
                    (LABEL_SHARING_MODE, PER_GPU),
                    (LABEL_SHARING, "time-slicing"),
                    (LABEL_REPLICAS, "4"),
                ]),
                serde_json::json!({"nvidia.com/gpu": "32"}),
            ),
            Sharing::TimeSlicing { replicas: 4 },
            &[
                "gpu-share.io/sharing=per-gpu",
                "time-slicing x4",
                "unshared",
            ],
        );
        refused(
            node(
                gfd(&[("pool", "fractions"), (LABEL_MIG_STRATEGY, "mixed")]),
                serde_json::json!({"nvidia.com/mig-1g.10gb": "56"}),
            ),
            Sharing::None,
            &["nodeModes[1]", "MIG mode"],
        );
        refused(
            node(
                serde_json::json!({LABEL_GKE_ACCELERATOR: "nvidia-a100-80gb", LABEL_SHARING_MODE: PER_GPU}),
                eight.clone(),
            ),
            Sharing::None,
            &["GKE", "NVIDIA_VISIBLE_DEVICES"],
        );
        refused(
            node(gfd(&[(LABEL_SHARING_MODE, "per-node")]), eight),
            Sharing::None,
            &["\"per-node\"", "per-gpu"],
        );
    }

    /// The policy's nodeModes declare the mode of nodes no label describes; GFD's and GKE's
    /// labels win, and a node no rule matches stays unverified.
    #[test]
    fn declared_modes_apply_to_unlabelled_nodes_only() {
        let policy = crate::policy::Policy::load(
            "nodeModes:\n  - selector: {matchLabels: {pool: shared}}\n    sharing: time-slicing\n    replicas: 4\n  - selector: {matchLabels: {pool: mig}}\n    migProfile: 1g.10gb\n",
            "p.yaml",
        )
        .unwrap()
        .policy;
        let reading = Reading::of(&policy);
        let node = |name: &str, labels: serde_json::Value, gpus: &str| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "labels": labels},
                "status": {"allocatable": {"nvidia.com/gpu": gpus}}
            }))
            .unwrap()
        };
        let ts = read_node(
            &node("eks-ts", serde_json::json!({"pool": "shared"}), "16"),
            &reading,
        )
        .unwrap();
        assert_eq!(ts.sharing, Sharing::TimeSlicing { replicas: 4 });
        assert_eq!(
            (ts.gpus, ts.slots, ts.mode_source),
            (4, 16, ModeSource::Declared)
        );
        let mig = read_node(
            &node("aks-mig", serde_json::json!({"pool": "mig"}), "56"),
            &reading,
        )
        .unwrap();
        assert_eq!(
            (mig.mig.clone(), mig.gpus, mig.slots),
            (
                MigLayout::Single {
                    profile: "1g.10gb".into(),
                    per_gpu: 7
                },
                0,
                56
            )
        );
        let other = read_node(
            &node("eks-2", serde_json::json!({"pool": "other"}), "4"),
            &reading,
        )
        .unwrap();
        assert_eq!((other.gpus, other.mode_source), (4, ModeSource::Unverified));
        let gfd = read_node(
            &node(
                "gfd",
                serde_json::json!({"pool": "shared", "nvidia.com/gpu.sharing-strategy": "none", "nvidia.com/gpu.product": "NVIDIA-L4"}),
                "2",
            ),
            &reading,
        )
        .unwrap();
        assert_eq!(
            (gfd.sharing, gfd.mode_source),
            (Sharing::None, ModeSource::Gfd)
        );
    }

    /// Nodes as GKE, EKS and AKS present them, read to what their device plugin enforces.
    #[test]
    fn nodes_as_each_platform_presents_them() {
        let gpu = |n: &str| map(&[("nvidia.com/gpu", n), ("cpu", "8")]);
        // GKE time-sharing: 2 L4s, 4 clients each: 8 units of nvidia.com/gpu.
        let ts = from_parts(
            "gke-ts",
            &map(&[
                (LABEL_GKE_ACCELERATOR, "nvidia-l4"),
                (LABEL_GKE_SHARING, "time-sharing"),
                (LABEL_GKE_CLIENTS, "4"),
            ]),
            &gpu("8"),
            &Reading::from(RESOURCE_GPU),
        )
        .unwrap();
        assert_eq!(ts.sharing, Sharing::TimeSlicing { replicas: 4 });
        assert_eq!((ts.gpus, ts.slots), (2, 8));
        assert_eq!(ts.product.as_deref(), Some("nvidia-l4"));
        assert_eq!(ts.mode_source, ModeSource::Gke);
        // GKE MPS, the upper-case form auto-provisioning writes.
        let mps = from_parts(
            "gke-mps",
            &map(&[
                (LABEL_GKE_ACCELERATOR, "nvidia-h100-80gb"),
                (LABEL_GKE_SHARING, "MPS"),
                (LABEL_GKE_CLIENTS, "3"),
            ]),
            &gpu("24"),
            &Reading::from(RESOURCE_GPU),
        )
        .unwrap();
        assert_eq!(mps.sharing, Sharing::Mps { replicas: 3 });
        assert_eq!((mps.gpus, mps.slots), (8, 24));
        // GKE MIG: every A100 in 1g.5gb partitions, each one nvidia.com/gpu.
        let mig = from_parts(
            "gke-mig",
            &map(&[
                (LABEL_GKE_ACCELERATOR, "nvidia-tesla-a100"),
                (LABEL_GKE_PARTITION, "1g.5gb"),
            ]),
            &gpu("14"),
            &Reading::from(RESOURCE_GPU),
        )
        .unwrap();
        assert_eq!(
            mig.mig,
            MigLayout::Single {
                profile: "1g.5gb".into(),
                per_gpu: 7
            }
        );
        assert_eq!((mig.gpus, mig.slots), (0, 14));
        assert_eq!(mig.mode_source, ModeSource::Gke);
        // GKE without sharing: whole GPUs, read from GKE's labels (verified).
        let plain = from_parts(
            "gke-plain",
            &map(&[(LABEL_GKE_ACCELERATOR, "nvidia-l4")]),
            &gpu("2"),
            &Reading::from(RESOURCE_GPU),
        )
        .unwrap();
        assert_eq!((plain.sharing, plain.gpus), (Sharing::None, 2));
        assert_eq!(plain.mode_source, ModeSource::Gke);
        // EKS (or AKS) with NVIDIA's device plugin and no GFD: whole GPUs, flagged unverified.
        let eks = from_parts(
            "eks-g5",
            &map(&[
                ("node.kubernetes.io/instance-type", "g5.12xlarge"),
                ("eks.amazonaws.com/nodegroup", "gpu"),
            ]),
            &gpu("4"),
            &Reading::from(RESOURCE_GPU),
        )
        .unwrap();
        assert_eq!((eks.sharing, eks.gpus, eks.slots), (Sharing::None, 4, 4));
        assert_eq!(eks.mode_source, ModeSource::Unverified);
        // AKS MIG pool with the GPU Operator's GFD (mixed strategy): read from GFD as before.
        let aks = from_parts(
            "aks-mig",
            &map(&[
                ("kubernetes.azure.com/accelerator", "nvidia"),
                (LABEL_PRODUCT, "NVIDIA-A100-SXM4-40GB"),
                (LABEL_COUNT, "8"),
                (LABEL_MIG_STRATEGY, "mixed"),
            ]),
            &map(&[("nvidia.com/gpu", "0"), ("nvidia.com/mig-1g.5gb", "56")]),
            &Reading::from(RESOURCE_GPU),
        )
        .unwrap();
        assert_eq!(aks.mode_source, ModeSource::Gfd);
        assert_eq!(aks.mig_devices(), 56);
        // GFD labels win over GKE's when both are there.
        let both = from_parts(
            "both",
            &map(&[
                (LABEL_GKE_SHARING, "time-sharing"),
                (LABEL_GKE_CLIENTS, "4"),
                (LABEL_SHARING, "none"),
                (LABEL_PRODUCT, "NVIDIA-L4"),
            ]),
            &gpu("2"),
            &Reading::from(RESOURCE_GPU),
        )
        .unwrap();
        assert_eq!(
            (both.sharing, both.mode_source),
            (Sharing::None, ModeSource::Gfd)
        );
        // No NVIDIA resource and no GPU label: not a GPU node.
        assert!(
            from_parts(
                "cpu",
                &map(&[]),
                &map(&[("cpu", "8")]),
                &Reading::from(RESOURCE_GPU)
            )
            .is_none()
        );
    }

    #[test]
    fn quantities() {
        assert_eq!(quantity_milli("2"), Some(2000));
        assert_eq!(quantity_milli("1500m"), Some(1500));
        assert_eq!(quantity_milli("0.5"), Some(500));
        assert_eq!(quantity_milli("1Ki"), Some(1_024_000));
        assert_eq!(quantity_count("8"), Some(8));
        assert_eq!(quantity_milli("abc"), None);
        assert_eq!(quantity_milli("1Xi"), None);
        // Huge but well-formed quantities are not numbers we can hold: None, never a panic.
        assert_eq!(quantity_milli("999999999999999999.999999999Ti"), None);
        assert_eq!(
            quantity_milli("999999999999999999T"),
            Some(999_999_999_999_999_999 * 10u128.pow(15))
        );
        assert_eq!(quantity_count("999999999999999999Ti"), Some(u64::MAX));
    }

    #[test]
    fn absurd_nodes_are_clamped() {
        // 4e9 whole GPUs: Usage::empty would allocate a slot per GPU.
        let alloc = map(&[("nvidia.com/gpu", "4000000000")]);
        let n = from_parts("huge", &map(&[]), &alloc, &Reading::from("nvidia.com/gpu")).unwrap();
        assert_eq!((n.gpus, n.slots), (MAX_GPUS_PER_NODE, MAX_GPUS_PER_NODE));
        assert_eq!(crate::packing::Usage::empty(&n).gpu_milli.len(), 64);
        let n = from_parts(
            "huge",
            &map(&[]),
            &map(&[("nvidia.com/gpu", "65")]),
            &Reading::from("nvidia.com/gpu"),
        )
        .unwrap();
        assert_eq!(n.gpus, MAX_GPUS_PER_NODE);
        let n = from_parts(
            "ok",
            &map(&[]),
            &map(&[("nvidia.com/gpu", "64")]),
            &Reading::from("nvidia.com/gpu"),
        )
        .unwrap();
        assert_eq!((n.gpus, n.slots), (64, 64));
        // Time-slicing: 10 replicas of 100 GPUs.
        let labels = map(&[
            ("nvidia.com/gpu.replicas", "10"),
            ("nvidia.com/gpu.sharing-strategy", "time-slicing"),
        ]);
        let n = from_parts(
            "ts",
            &labels,
            &map(&[("nvidia.com/gpu", "1000")]),
            &Reading::from("nvidia.com/gpu"),
        )
        .unwrap();
        assert_eq!((n.gpus, n.slots), (64, 640));
        // More replicas per GPU than accounted: the units are capped, and the GPUs are the ones
        // those units make (3,072 units of 100 replicas: 30 GPUs), never more.
        let labels = map(&[
            ("nvidia.com/gpu.replicas", "100"),
            ("nvidia.com/gpu.sharing-strategy", "time-slicing"),
        ]);
        let n = from_parts(
            "many-replicas",
            &labels,
            &map(&[("nvidia.com/gpu", "4000")]),
            &Reading::from("nvidia.com/gpu"),
        )
        .unwrap();
        assert_eq!(
            (n.gpus, n.slots),
            (30, MAX_GPUS_PER_NODE * MAX_REPLICAS_PER_GPU)
        );
        // A replica count that does not fit in u32 is not truncated (2^32 + 4 is not 4).
        let labels = map(&[
            ("nvidia.com/gpu.replicas", "4294967300"),
            ("nvidia.com/gpu.sharing-strategy", "mps"),
        ]);
        let n = from_parts(
            "mps",
            &labels,
            &map(&[("nvidia.com/gpu", "8")]),
            &Reading::from("nvidia.com/gpu"),
        )
        .unwrap();
        assert_eq!(n.sharing, Sharing::Mps { replicas: u32::MAX });
        assert_eq!(n.gpus, 0);
        // MIG device counts: bounded, and summing them cannot overflow.
        let alloc = map(&[
            ("nvidia.com/mig-1g.10gb", "4294967295"),
            ("nvidia.com/mig-2g.20gb", "99999999999"),
        ]);
        let n = from_parts("mig", &map(&[]), &alloc, &Reading::from("nvidia.com/gpu")).unwrap();
        assert_eq!(n.mig_devices(), 2 * MAX_GPUS_PER_NODE * MAX_MIG_PER_GPU);
        // Single strategy: a gpu.count label beyond u32 is not truncated either.
        let labels = map(&[
            ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"),
            ("nvidia.com/gpu.count", "4294967297"),
        ]);
        let n = from_parts(
            "single",
            &labels,
            &map(&[]),
            &Reading::from("nvidia.com/gpu"),
        )
        .unwrap();
        assert_eq!(n.slots, MAX_GPUS_PER_NODE * MAX_MIG_PER_GPU);
    }

    #[test]
    fn resource_suffix_to_profile() {
        assert_eq!(profile_from_resource_suffix("1g.10gb"), "1g.10gb");
        assert_eq!(profile_from_resource_suffix("1g.10gb.me"), "1g.10gb+me");
        assert_eq!(
            profile_from_resource_suffix("1g.10gb.me.all"),
            "1g.10gb+me.all"
        );
    }

    #[test]
    fn cpu_node_is_not_a_gpu_node() {
        let alloc = map(&[("cpu", "16"), ("memory", "64Gi"), ("pods", "110")]);
        assert_eq!(
            from_parts("cpu-1", &map(&[]), &alloc, &Reading::from("nvidia.com/gpu")),
            None
        );
    }

    #[test]
    fn plain_h100_node() {
        let labels = map(&[
            ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
            ("nvidia.com/gpu.count", "8"),
            ("nvidia.com/gpu.memory", "81559"),
            ("nvidia.com/gpu.replicas", "1"),
            ("nvidia.com/gpu.sharing-strategy", "none"),
        ]);
        let alloc = map(&[
            ("cpu", "191500m"),
            ("memory", "2000Gi"),
            ("nvidia.com/gpu", "8"),
        ]);
        let n = from_parts(
            "h100-plain",
            &labels,
            &alloc,
            &Reading::from("nvidia.com/gpu"),
        )
        .unwrap();
        assert_eq!(n.gpus, 8);
        assert_eq!(n.slots, 8);
        assert_eq!(n.sharing, Sharing::None);
        assert_eq!(n.mig, MigLayout::None);
        assert_eq!(n.product.as_deref(), Some("NVIDIA-H100-80GB-HBM3"));
        assert_eq!(n.gpu_memory_mib, Some(81559));
        assert_eq!(n.cpu_milli, Some(191_500));
        assert_eq!(n.memory_mib, Some(2000 * 1024));
        assert_eq!(n.kind(), "whole");
    }

    #[test]
    fn h100_time_slicing_x4() {
        let labels = map(&[
            ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3-SHARED"),
            ("nvidia.com/gpu.count", "8"),
            ("nvidia.com/gpu.memory", "81559"),
            ("nvidia.com/gpu.replicas", "4"),
            ("nvidia.com/gpu.sharing-strategy", "time-slicing"),
        ]);
        let alloc = map(&[("nvidia.com/gpu", "32")]);
        let n = from_parts("h100-ts", &labels, &alloc, &Reading::from("nvidia.com/gpu")).unwrap();
        assert_eq!(n.sharing, Sharing::TimeSlicing { replicas: 4 });
        assert_eq!(n.slots, 32);
        assert_eq!(n.gpus, 8);
        assert_eq!(n.product.as_deref(), Some("NVIDIA-H100-80GB-HBM3"));
        assert_eq!(n.kind(), "time-slicing x4");
    }

    #[test]
    fn h100_mps_x4_renamed_resource() {
        let labels = map(&[
            ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
            ("nvidia.com/gpu.count", "4"),
            ("nvidia.com/gpu.replicas", "4"),
            ("nvidia.com/gpu.sharing-strategy", "mps"),
            ("nvidia.com/mps.capable", "true"),
        ]);
        let alloc = map(&[("nvidia.com/gpu.shared", "16"), ("nvidia.com/gpu", "0")]);
        let n = from_parts(
            "h100-mps",
            &labels,
            &alloc,
            &Reading::from("nvidia.com/gpu.shared"),
        )
        .unwrap();
        assert_eq!(n.sharing, Sharing::Mps { replicas: 4 });
        assert_eq!(n.pool_resource, "nvidia.com/gpu.shared");
        assert_eq!(n.slots, 16);
        assert_eq!(n.gpus, 4);
    }

    #[test]
    fn a100_mig_mixed_with_one_full_gpu() {
        let labels = map(&[
            ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB"),
            ("nvidia.com/gpu.count", "8"),
            ("nvidia.com/mig.strategy", "mixed"),
            ("nvidia.com/mig.capable", "true"),
            ("nvidia.com/mig-1g.10gb.count", "14"),
            ("nvidia.com/mig-3g.40gb.count", "4"),
        ]);
        let alloc = map(&[
            ("nvidia.com/gpu", "1"),
            ("nvidia.com/mig-1g.10gb", "14"),
            ("nvidia.com/mig-1g.10gb.me", "1"),
            ("nvidia.com/mig-3g.40gb", "4"),
            ("nvidia.com/mig-7g.80gb", "0"),
        ]);
        let n = from_parts(
            "a100-mig",
            &labels,
            &alloc,
            &Reading::from("nvidia.com/gpu"),
        )
        .unwrap();
        assert_eq!(n.gpus, 1);
        let MigLayout::Mixed { instances } = &n.mig else {
            panic!("{:?}", n.mig)
        };
        assert_eq!(instances["1g.10gb"], 14);
        assert_eq!(instances["1g.10gb+me"], 1);
        assert_eq!(instances["3g.40gb"], 4);
        assert_eq!(instances["7g.80gb"], 0);
        assert_eq!(n.mig_devices(), 19);
    }

    #[test]
    fn a100_mig_single() {
        let labels = map(&[
            ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"),
            ("nvidia.com/gpu.count", "56"),
            ("nvidia.com/gpu.memory", "4864"),
            ("nvidia.com/mig.strategy", "single"),
            ("nvidia.com/mig.config", "all-1g.5gb"),
        ]);
        let alloc = map(&[("nvidia.com/gpu", "56")]);
        let n = from_parts(
            "a100-single",
            &labels,
            &alloc,
            &Reading::from("nvidia.com/gpu"),
        )
        .unwrap();
        assert_eq!(
            n.mig,
            MigLayout::Single {
                profile: "1g.5gb".into(),
                per_gpu: 7
            }
        );
        assert_eq!(n.product.as_deref(), Some("NVIDIA-A100-SXM4-40GB"));
        assert_eq!(n.slots, 56);
        assert_eq!(n.gpus, 0);
        assert_eq!(n.kind(), "mig single 1g.5gb");
    }

    #[test]
    fn replicas_without_strategy_label_mean_time_slicing() {
        let labels = map(&[
            ("nvidia.com/gpu.product", "Tesla-T4-SHARED"),
            ("nvidia.com/gpu.count", "1"),
            ("nvidia.com/gpu.replicas", "10"),
        ]);
        let alloc = map(&[("nvidia.com/gpu", "10")]);
        let n = from_parts("t4", &labels, &alloc, &Reading::from("nvidia.com/gpu")).unwrap();
        assert_eq!(n.sharing, Sharing::TimeSlicing { replicas: 10 });
        assert_eq!(n.gpus, 1);
    }
}

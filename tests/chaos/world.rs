//! What the API says, and the invariants computed from it alone: capacity per class, every
//! gpu-share pod accounted for, reservations matching shares, and each extender's ledger equal
//! to the allocation the API implies.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use serde_json::Value;

use super::common::cluster::{Cluster, nvidia_allocatable, nvidia_limits};
use super::common::reserve::RESERVATIONS;

/// The annotation the webhook writes on every pod it mutated.
pub const REQUEST: &str = "gpu-share.io/request";
/// The annotation the extender binds with: `index:thousandths` per GPU, comma-separated.
pub const GPUS: &str = "gpu-share.io/gpus";

/// The quantity every gpu-share pod carries, and GPU nodes advertise.
const GPU_MILLI: &str = "gpu-share.io/gpu-milli";

/// One node's capacity as the API gives it.
#[derive(Debug, Default)]
pub struct NodeFacts {
    pub allocatable: BTreeMap<String, u64>,
    pub gpus: u32,
    /// What the node advertises of gpu-share.io/gpu-milli (allocatable), if it does.
    pub gpu_milli: Option<u64>,
}

/// One pod as the API gives it, reduced to what the invariants read.
#[derive(Debug, Clone)]
pub struct PodFacts {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub node: Option<String>,
    /// Not deleted and not finished: it holds what it was given.
    pub live: bool,
    /// The user's `gpu-share` annotation.
    pub asked: Option<String>,
    /// The webhook's `gpu-share.io/request`.
    pub request: Option<String>,
    /// Per GPU index, thousandths.
    pub gpus: Vec<(u32, u32)>,
    /// nvidia.com/* limits, summed over containers.
    pub limits: BTreeMap<String, u64>,
    /// gpu-share.io/gpu-milli limits, summed over containers.
    pub gpu_milli: u64,
    /// Reads its GPU from a devices ConfigMap (the per-GPU form).
    pub per_gpu: bool,
    pub created: Option<Timestamp>,
    /// PodScheduled: (status, message, lastTransitionTime).
    pub scheduled: Option<(String, String, Option<Timestamp>)>,
}

impl PodFacts {
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Its class, from the webhook's request: mig, mps, timeslice or exclusive.
    pub fn class(&self) -> &str {
        let r = self.request.as_deref().unwrap_or_default();
        ["mig", "mps", "timeslice", "exclusive"]
            .into_iter()
            .find(|c| r.starts_with(c))
            .unwrap_or("other")
    }
}

/// A reservation pod: it holds one GPU of a node for the shares in per-GPU form.
#[derive(Debug, Clone)]
pub struct Reservation {
    pub name: String,
    pub uid: String,
    pub node: String,
    pub gpu: u32,
}

/// A snapshot of the API.
#[derive(Debug, Default)]
pub struct World {
    pub nodes: BTreeMap<String, NodeFacts>,
    pub pods: Vec<PodFacts>,
    pub reservations: Vec<Reservation>,
}

fn parse_gpus(text: &str) -> Vec<(u32, u32)> {
    text.split(',')
        .filter_map(|t| {
            let (i, m) = t.trim().split_once(':')?;
            Some((i.parse().ok()?, m.parse().ok()?))
        })
        .collect()
}

fn facts(p: &Pod) -> PodFacts {
    let ann = p.metadata.annotations.clone().unwrap_or_default();
    let phase = p
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    let scheduled = p
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
        .map(|c| {
            (
                c.status.clone(),
                c.message.clone().unwrap_or_default(),
                c.last_transition_time.as_ref().map(|t| t.0),
            )
        });
    PodFacts {
        namespace: p.metadata.namespace.clone().unwrap_or_default(),
        name: p.metadata.name.clone().unwrap_or_default(),
        uid: p.metadata.uid.clone().unwrap_or_default(),
        node: p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty()),
        live: p.metadata.deletion_timestamp.is_none()
            && !matches!(phase.as_str(), "Succeeded" | "Failed"),
        asked: ann.get("gpu-share").cloned(),
        request: ann.get(REQUEST).cloned(),
        gpus: ann.get(GPUS).map(|g| parse_gpus(g)).unwrap_or_default(),
        limits: nvidia_limits(p),
        gpu_milli: p
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .filter_map(|c| c.resources.as_ref()?.limits.as_ref()?.get(GPU_MILLI))
            .filter_map(|q| gpu_share::inventory::quantity_count(&q.0))
            .sum(),
        per_gpu: p
            .spec
            .as_ref()
            .is_some_and(|s| gpu_share::ledger::devices_configmap(s).is_some()),
        created: p.metadata.creation_timestamp.as_ref().map(|t| t.0),
        scheduled,
    }
}

/// Reads nodes and pods (every namespace) from the API.
pub async fn read(c: &Cluster) -> Result<World, String> {
    let nodes = Api::<Node>::all(c.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("list nodes: {e}"))?;
    let mut w = World::default();
    for n in nodes.items {
        let labels = n.metadata.labels.clone().unwrap_or_default();
        let facts = NodeFacts {
            allocatable: nvidia_allocatable(&n),
            gpu_milli: n
                .status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref()?.get(GPU_MILLI))
                .and_then(|q| gpu_share::inventory::quantity_count(&q.0)),
            gpus: labels
                .get("nvidia.com/gpu.count")
                .and_then(|c| c.parse().ok())
                .unwrap_or(0),
        };
        w.nodes
            .insert(n.metadata.name.clone().unwrap_or_default(), facts);
    }
    let pods = Api::<Pod>::all(c.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("list pods: {e}"))?;
    for p in &pods.items {
        let f = facts(p);
        if f.namespace == RESERVATIONS {
            let gpu = p
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("gpu-share.io/reserve-gpu"))
                .and_then(|g| g.parse().ok());
            if let (Some(node), Some(gpu), true) = (&f.node, gpu, f.live) {
                w.reservations.push(Reservation {
                    name: f.name.clone(),
                    uid: f.uid.clone(),
                    node: node.clone(),
                    gpu,
                });
            }
            continue;
        }
        w.pods.push(f);
    }
    Ok(w)
}

impl World {
    /// Live gpu-share pods bound to each node.
    pub fn bound(&self) -> BTreeMap<&str, Vec<&PodFacts>> {
        let mut out: BTreeMap<&str, Vec<&PodFacts>> = BTreeMap::new();
        for p in &self.pods {
            if let (Some(node), true, Some(_)) = (&p.node, p.live, &p.request) {
                out.entry(node.as_str()).or_default().push(p);
            }
        }
        out
    }

    /// No node and no GPU holds more than its capacity, per class: each nvidia.com resource
    /// (MIG devices, time-slicing and MPS replicas, whole GPUs) within the node's allocatable;
    /// each GPU within 1000 thousandths (time-slicing and MPS budgets, per-GPU budgets,
    /// exclusive GPUs) and one class; on a node shared per GPU, no more GPUs held (exclusive,
    /// reserved) than it has, and one reservation per GPU; gpu-share.io/gpu-milli within what
    /// the node advertises (kubelet's admission). The violations, in words.
    pub fn over_capacity(&self) -> Vec<String> {
        let mut out = Vec::new();
        let bound = self.bound();
        for (node, pods) in &bound {
            let Some(n) = self.nodes.get(*node) else {
                continue;
            };
            let mut units: BTreeMap<&str, u64> = BTreeMap::new();
            let mut per_gpu: BTreeMap<u32, (u32, BTreeSet<&str>, Vec<String>)> = BTreeMap::new();
            for p in pods {
                for (r, q) in &p.limits {
                    *units.entry(r).or_default() += q;
                }
                for (i, m) in &p.gpus {
                    let e = per_gpu.entry(*i).or_default();
                    e.0 += m;
                    e.1.insert(p.class());
                    e.2.push(format!("{} {}", p.key(), m));
                }
            }
            for (r, used) in units {
                let has = n.allocatable.get(r).copied().unwrap_or(0);
                if used > has {
                    out.push(format!("{node}: {used} {r} bound, {has} allocatable"));
                }
            }
            // kubelet's admission: the quantity within what the node advertises (a node that
            // does not advertise it yet has kubelet drop it).
            let milli: u64 = pods.iter().map(|p| p.gpu_milli).sum();
            if let Some(has) = n.gpu_milli
                && milli > has
            {
                out.push(format!(
                    "{node}: {milli} {GPU_MILLI} bound, {has} advertised"
                ));
            }
            for (i, (milli, classes, who)) in &per_gpu {
                if *milli > 1000 {
                    out.push(format!("{node} GPU {i}: {milli}/1000 held by {who:?}"));
                }
                if classes.len() > 1 {
                    out.push(format!(
                        "{node} GPU {i}: classes {classes:?} mixed: {who:?}"
                    ));
                }
                if n.gpus > 0 && *i >= n.gpus {
                    out.push(format!("{node} GPU {i}: the node has {} GPUs", n.gpus));
                }
            }
        }
        let mut reserved: BTreeMap<(&str, u32), Vec<&str>> = BTreeMap::new();
        for r in &self.reservations {
            reserved
                .entry((r.node.as_str(), r.gpu))
                .or_default()
                .push(&r.name);
        }
        for ((node, gpu), names) in &reserved {
            if names.len() > 1 {
                out.push(format!("{node} GPU {gpu}: reserved by {names:?}"));
            }
            let whole = bound.get(node).is_some_and(|pods| {
                pods.iter()
                    .any(|p| p.class() == "exclusive" && p.gpus.iter().any(|g| g.0 == *gpu))
            });
            if whole {
                out.push(format!(
                    "{node} GPU {gpu}: reserved for shares and given whole to a pod"
                ));
            }
        }
        out
    }

    /// Pods that asked for gpu-share and were admitted without its mutation.
    pub fn unmutated(&self) -> Vec<String> {
        self.pods
            .iter()
            .filter(|p| p.asked.is_some() && p.request.is_none())
            .map(|p| format!("{} was admitted without the webhook's mutation", p.key()))
            .collect()
    }

    /// gpu-share pods of `namespaces`, older than `grace`, neither bound nor Pending with a
    /// reason (a PodScheduled condition False with a message).
    pub fn unaccounted(&self, namespaces: &[&str], grace_seconds: i64) -> Vec<String> {
        let now = Timestamp::now();
        self.pods
            .iter()
            .filter(|p| namespaces.contains(&p.namespace.as_str()))
            .filter(|p| p.request.is_some() && p.live && p.node.is_none())
            .filter(|p| {
                p.created
                    .is_some_and(|c| now.as_second() - c.as_second() > grace_seconds)
            })
            .filter(|p| {
                !matches!(&p.scheduled, Some((status, message, _)) if status == "False" && !message.is_empty())
            })
            .map(|p| {
                format!(
                    "{} is Pending with no reason (PodScheduled: {:?})",
                    p.key(),
                    p.scheduled
                )
            })
            .collect()
    }

    /// Per-GPU sharing: reservations holding a GPU no live share is on, and shares on a GPU no
    /// reservation holds (keys: reservation UID, share UID), with words for each.
    pub fn reservation_mismatches(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let mut shared: BTreeSet<(&str, u32)> = BTreeSet::new();
        for (node, pods) in self.bound() {
            for p in pods.iter().filter(|p| p.per_gpu) {
                for (i, _) in &p.gpus {
                    shared.insert((node, *i));
                    if !self
                        .reservations
                        .iter()
                        .any(|r| r.node == node && r.gpu == *i)
                    {
                        out.insert(
                            p.uid.clone(),
                            format!("share {} on {node} GPU {i} has no reservation", p.key()),
                        );
                    }
                }
            }
        }
        for r in &self.reservations {
            if !shared.contains(&(r.node.as_str(), r.gpu)) {
                out.insert(
                    r.uid.clone(),
                    format!(
                        "reservation {} holds {} GPU {} with no share on it",
                        r.name, r.node, r.gpu
                    ),
                );
            }
        }
        out
    }

    /// How a ledger (an extender's `/v1/nodes`) differs from the allocation the API implies:
    /// per node, the live gpu-share pods bound there, each with the GPUs it holds
    /// (`gpu-share.io/gpus` against the ledger's model), and the reservation pods.
    pub fn ledger_differences(&self, ledger: &Value) -> Vec<String> {
        let entry = |key: String, gpus: &[(u32, u32)]| {
            let mut gpus = gpus.to_vec();
            gpus.sort();
            let model: Vec<String> = gpus.iter().map(|(i, m)| format!("{i}:{m}")).collect();
            format!("{key} [{}]", model.join(","))
        };
        let held: BTreeMap<String, BTreeSet<String>> = ledger
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| {
                let pods = n["pods"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|p| {
                        let ns = p["namespace"].as_str().unwrap_or_default();
                        let key = format!("{ns}/{}", p["name"].as_str().unwrap_or_default());
                        if ns == RESERVATIONS {
                            key
                        } else {
                            entry(key, &parse_gpus(p["model"].as_str().unwrap_or_default()))
                        }
                    })
                    .collect();
                Some((n["name"].as_str()?.to_string(), pods))
            })
            .collect();
        // The ledger holds reservation pods too: each takes its GPU.
        let mut api: BTreeMap<String, BTreeSet<String>> = self
            .bound()
            .into_iter()
            .map(|(n, pods)| {
                (
                    n.to_string(),
                    pods.iter().map(|p| entry(p.key(), &p.gpus)).collect(),
                )
            })
            .collect();
        for r in &self.reservations {
            api.entry(r.node.clone())
                .or_default()
                .insert(format!("{RESERVATIONS}/{}", r.name));
        }
        let mut out = Vec::new();
        for node in self.nodes.keys() {
            let a = api.get(node).cloned().unwrap_or_default();
            let l = held.get(node).cloned().unwrap_or_default();
            if a != l {
                let only_api: Vec<_> = a.difference(&l).collect();
                let only_ledger: Vec<_> = l.difference(&a).collect();
                out.push(format!(
                    "{node}: the API has {only_api:?} the ledger lacks; the ledger has {only_ledger:?} the API does not"
                ));
            }
        }
        for node in held.keys() {
            if !self.nodes.contains_key(node) {
                out.push(format!("{node}: in the ledger, not in the API"));
            }
        }
        out
    }
}

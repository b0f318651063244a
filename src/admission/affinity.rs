//! The node affinity the planner requires of a pod: the terms that match nodes of its class
//! (NVIDIA's GPU Feature Discovery labels, GKE's own), crossed with the pod's own terms.

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

// Node labels the affinity uses (GPU Feature Discovery's and GKE's): the inventory's.
use crate::inventory::{
    LABEL_GKE_PARTITION, LABEL_GKE_SHARING, LABEL_MIG_CONFIG, LABEL_PRODUCT,
    LABEL_SHARING as LABEL_SHARING_STRATEGY, LABEL_SINGLE_MIG_SLICES,
};
use crate::policy::{DeclaredSharing, MigStrategy, Policy, SelectorOperator};
use crate::request::GpuClass;

use super::patch::PatchBuilder;

/// A node selector requirement: key, operator, values.
pub(super) type Expr = (String, &'static str, Vec<String>);

/// The alternatives (ORed) of node terms that match nodes of the class: one, but for whole GPUs,
/// whose one term is crossed with what keeps them off the node groups the policy declares shared
/// or MIG.
pub(super) fn affinity_for(class: &GpuClass, policy: &Policy) -> Vec<Vec<Expr>> {
    let e = |k: &str, op: &'static str, v: &str| (k.to_string(), op, vec![v.to_string()]);
    let absent = |k: &str| (k.to_string(), "DoesNotExist", Vec::new());
    match class {
        // The per-GPU form: plain nodes, as exclusive pods (gpu-share picks those shared per GPU).
        GpuClass::Timeslice { .. } | GpuClass::Mps { .. } if policy.per_gpu.takes(class) => {
            affinity_for(&GpuClass::Exclusive { count: 1 }, policy)
        }
        GpuClass::Mps { .. } => vec![vec![e(LABEL_SHARING_STRATEGY, "In", "mps")]],
        GpuClass::Timeslice { .. } => vec![vec![e(LABEL_SHARING_STRATEGY, "In", "time-slicing")]],
        // Any node whose GPUs are not shared: GFD's `none`, and nodes without GFD's label (the
        // device plugin alone, GKE) — but not GKE's shared or MIG-partitioned nodes, which carry
        // no GFD label either (NotIn also matches a node without the label). Of a single-strategy
        // node (the GPU Operator's default, written on every GPU node whether MIG-capable or not)
        // only one whose `nvidia.com/gpu` are MIG devices is left out: GFD labels those, and only
        // those, with their slices.
        GpuClass::Exclusive { .. } => {
            let whole = vec![
                (
                    LABEL_SHARING_STRATEGY.to_string(),
                    "NotIn",
                    vec!["mps".to_string(), "time-slicing".to_string()],
                ),
                absent(LABEL_SINGLE_MIG_SLICES),
                absent(LABEL_GKE_SHARING),
                absent(LABEL_GKE_PARTITION),
            ];
            undeclared(whole, policy)
        }
        GpuClass::Mig { profile } => match policy.mig.strategy {
            MigStrategy::Single => vec![vec![e(
                LABEL_MIG_CONFIG,
                "In",
                &crate::mig::all_config_name(profile),
            )]],
            // Auto is resolved to a form before the affinity is written (plan's `policy_for`).
            MigStrategy::Mixed | MigStrategy::Auto => vec![vec![]],
        },
    }
}

/// Most node terms the crossing in [`undeclared`] writes: past it, the declared groups are left
/// to the extender, which reads them by their rules and refuses whole-GPU pods there in words.
const MAX_UNDECLARED_TERMS: usize = 16;

/// `term` on nodes outside every group the policy's `nodeModes` declare time-sliced, MPS or MIG
/// (by a rule's labels: a group without GPU Feature Discovery, or scaled to zero, whose
/// `nvidia.com/gpu` are replicas or MIG devices that no label of NVIDIA's says): a rule matches
/// when all its expressions do, so a node is outside it when one of them fails, one alternative
/// each, crossed over the rules.
fn undeclared(term: Vec<Expr>, policy: &Policy) -> Vec<Vec<Expr>> {
    let mut out = vec![term];
    for rule in policy.node_modes.iter().filter(|m| {
        m.mig_profile.is_some()
            || matches!(
                m.sharing,
                Some(DeclaredSharing::TimeSlicing | DeclaredSharing::Mps)
            )
    }) {
        let negations: Vec<Expr> = selector_exprs(rule)
            .into_iter()
            .map(|(k, op, values)| {
                let op = match op {
                    "In" => "NotIn",
                    "NotIn" => "In",
                    "Exists" => "DoesNotExist",
                    _ => "Exists",
                };
                (k, op, values)
            })
            .collect();
        // A rule without labels selects nothing the affinity can name.
        if negations.is_empty() || out.len() * negations.len() > MAX_UNDECLARED_TERMS {
            continue;
        }
        out = out
            .iter()
            .flat_map(|t| {
                negations.iter().map(move |n| {
                    let mut t = t.clone();
                    t.push(n.clone());
                    t
                })
            })
            .collect();
    }
    out
}

/// GPU Feature Discovery's own word for a single-strategy MIG node of a profile, for nodes
/// that no MIG manager labelled (a managed platform's MIG pool, MIG set up by hand): its
/// product label, `<model>-MIG-<profile>` (`+` written `.`), for every model of the MIG table
/// that has the profile. A model's product names are the table's (the policy's models add
/// theirs), with and without the `NVIDIA-` prefix that drivers before R470 left out.
pub(super) fn gfd_single_alternative(
    class: &GpuClass,
    policy: &Policy,
    mig: &crate::mig::MigTable,
) -> Option<Vec<Expr>> {
    let GpuClass::Mig { profile } = class else {
        return None;
    };
    if policy.mig.strategy != MigStrategy::Single {
        return None;
    }
    let suffix = profile.replace('+', ".");
    let mut values: Vec<String> = mig
        .models
        .iter()
        .filter(|m| m.profile(profile).is_some())
        .flat_map(|m| m.products.iter())
        .flat_map(|p| {
            let p = p.strip_prefix("NVIDIA-").unwrap_or(p);
            [
                format!("NVIDIA-{p}-MIG-{suffix}"),
                format!("{p}-MIG-{suffix}"),
            ]
        })
        .filter(|v| crate::nvidia::is_label_value(v))
        .collect();
    values.sort();
    values.dedup();
    (!values.is_empty()).then(|| vec![(LABEL_PRODUCT.to_string(), "In", values)])
}

/// GKE's own label for the nodes a pod may also run on: GKE shares and partitions GPUs with its
/// own device plugin and no GFD labels. mps and timeslice pods match the sharing strategy
/// (auto-provisioned nodes spell the value in capitals), never a client count: any number of
/// clients per GPU will do. MIG pods match the partition size, but only under the single
/// strategy: GKE advertises each partition as one `nvidia.com/gpu`, which is what a MIG pod asks
/// for then; under the mixed strategy it asks for `nvidia.com/mig-<profile>`, which no GKE node
/// advertises.
pub(super) fn gke_alternative(class: &GpuClass, policy: &Policy) -> Option<Vec<Expr>> {
    let (key, values) = match class {
        // GKE's own GPU stack does not honour NVIDIA_VISIBLE_DEVICES: no per-GPU sharing there.
        GpuClass::Timeslice { .. } | GpuClass::Mps { .. } if policy.per_gpu.takes(class) => {
            return None;
        }
        GpuClass::Mps { .. } => (
            LABEL_GKE_SHARING,
            vec!["mps".to_string(), "MPS".to_string()],
        ),
        GpuClass::Timeslice { .. } => (
            LABEL_GKE_SHARING,
            vec!["time-sharing".to_string(), "TIME_SHARING".to_string()],
        ),
        GpuClass::Mig { profile } if policy.mig.strategy == MigStrategy::Single => {
            (LABEL_GKE_PARTITION, vec![profile.clone()])
        }
        _ => return None,
    };
    Some(vec![(key.to_string(), "In", values)])
}

/// The nodes the policy's `nodeModes` declare of the pod's class, by the labels its rules select
/// them by: nodes without GPU Feature Discovery (EKS and AKS node groups, often), whose mode no
/// label of NVIDIA's says, and a node group scaled to zero, whose template node (what a cluster
/// autoscaler simulates) carries the group's labels but none GFD writes after boot. One term per
/// rule: mps pods the rules that declare `mps`, timeslice pods (device-plugin form) those that
/// declare `time-slicing`, single-strategy MIG pods those that declare their profile. Whole GPUs
/// and the per-GPU form need none: their terms already match a node without GFD's labels. A rule
/// with an empty selector names no labels to require, and adds nothing.
pub(super) fn declared_alternatives(class: &GpuClass, policy: &Policy) -> Vec<Vec<Expr>> {
    let declares = |m: &crate::policy::NodeMode| match class {
        GpuClass::Timeslice { .. } | GpuClass::Mps { .. } if policy.per_gpu.takes(class) => false,
        GpuClass::Mps { .. } => m.sharing == Some(DeclaredSharing::Mps),
        GpuClass::Timeslice { .. } => m.sharing == Some(DeclaredSharing::TimeSlicing),
        GpuClass::Mig { profile } => {
            policy.mig.strategy == MigStrategy::Single && m.mig_profile.as_ref() == Some(profile)
        }
        GpuClass::Exclusive { .. } => false,
    };
    policy
        .node_modes
        .iter()
        .filter(|m| declares(m))
        .map(selector_exprs)
        .filter(|exprs| !exprs.is_empty())
        .collect()
}

/// A `nodeModes` rule's selector as node selector requirements.
fn selector_exprs(m: &crate::policy::NodeMode) -> Vec<Expr> {
    let mut exprs: Vec<Expr> = m
        .selector
        .match_labels
        .iter()
        .map(|(k, v)| (k.clone(), "In", vec![v.clone()]))
        .collect();
    exprs.extend(m.selector.match_expressions.iter().map(|r| {
        let op = match r.operator {
            SelectorOperator::In => "In",
            SelectorOperator::NotIn => "NotIn",
            SelectorOperator::Exists => "Exists",
            SelectorOperator::DoesNotExist => "DoesNotExist",
        };
        (r.key.clone(), op, r.values.clone())
    }));
    exprs
}

/// Requires the pod's own terms and one of `alternatives`: every existing required term is
/// crossed with every alternative (terms are ORed, expressions within one ANDed), and the
/// result replaces the terms; with one alternative, that ANDs it into every term. Without terms
/// of its own the pod gets one term per alternative. A term that already requires an
/// alternative (a second pass) stays as it is. Creates the missing parents whole.
pub(super) fn require_affinity(b: &mut PatchBuilder, pod: &Pod, alternatives: &[Vec<Expr>]) {
    if alternatives.iter().all(Vec::is_empty) {
        return;
    }
    let spec = pod.spec.as_ref();
    let affinity = spec.and_then(|s| s.affinity.as_ref());
    let node_affinity = affinity.and_then(|a| a.node_affinity.as_ref());
    let required = node_affinity.and_then(|n| {
        n.required_during_scheduling_ignored_during_execution
            .as_ref()
    });
    let own: Vec<Value> = required
        .map(|r| {
            r.node_selector_terms
                .iter()
                .map(|t| serde_json::to_value(t).unwrap_or_else(|_| json!({})))
                .collect()
        })
        .unwrap_or_default();
    let own = if own.is_empty() { vec![json!({})] } else { own };
    let mut terms = Vec::new();
    let mut changed = required.is_none_or(|r| r.node_selector_terms.is_empty());
    for term in &own {
        // A term that already requires one of the alternatives (a second pass) stays as it is.
        let have: Vec<Value> = term
            .get("matchExpressions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if alternatives
            .iter()
            .any(|alt| alt.iter().all(|e| have.contains(&expr_json(e))))
        {
            terms.push(term.clone());
            continue;
        }
        changed = true;
        for alt in alternatives {
            let mut t = term.clone();
            let mut exprs: Vec<Value> = t
                .get("matchExpressions")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for e in alt {
                let e = expr_json(e);
                if !exprs.contains(&e) {
                    exprs.push(e);
                }
            }
            t["matchExpressions"] = Value::Array(exprs);
            terms.push(t);
        }
    }
    if !changed {
        return;
    }
    const NA: [&str; 3] = ["spec", "affinity", "nodeAffinity"];
    const REQ: &str = "requiredDuringSchedulingIgnoredDuringExecution";
    let new_required = json!({ "nodeSelectorTerms": terms });
    match (affinity, node_affinity, required) {
        (None, _, _) => b.add(
            &["spec", "affinity"],
            json!({ "nodeAffinity": { REQ: new_required } }),
        ),
        (Some(_), None, _) => b.add(&NA, json!({ REQ: new_required })),
        (Some(_), Some(_), None) => b.add(&[&NA[..], &[REQ]].concat(), new_required),
        // `add` on an existing member replaces it.
        (Some(_), Some(_), Some(_)) => b.add(
            &[&NA[..], &[REQ, "nodeSelectorTerms"]].concat(),
            new_required["nodeSelectorTerms"].clone(),
        ),
    }
}

pub(super) fn expr_json(e: &Expr) -> Value {
    if e.2.is_empty() {
        // Exists and DoesNotExist take no values.
        json!({ "key": e.0, "operator": e.1 })
    } else {
        json!({ "key": e.0, "operator": e.1, "values": e.2 })
    }
}

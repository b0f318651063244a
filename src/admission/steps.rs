//! The planner's patch steps, numbered in the order they apply, each a small function over the
//! validated [`Target`]: the extended resource, tolerations, RuntimeClass, MPS settings, node
//! affinity, schedulerName, environment and the normalized request annotation.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use serde_json::{Value, json};

use crate::mig::{MigModel, MigProfile};
use crate::policy::{Policy, TolerationOperator};
use crate::request::{ANNOTATION_REQUEST, CDI_DEVICE_KEY, DEVICES_KEY, GpuClass, GpuRequest};

use super::affinity::{
    affinity_for, declared_alternatives, gfd_single_alternative, gke_alternative, require_affinity,
};
use super::patch::PatchBuilder;
use json_patch::PatchOperation;

/// Whether the policy's RuntimeClass exists in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeClassState {
    Exists,
    Missing,
    /// Not known (no cluster in `--dev`, or the lookup failed).
    Unknown,
}

impl From<Option<bool>> for RuntimeClassState {
    /// A lookup's answer: `Some(exists)`, or `None` when it failed.
    fn from(found: Option<bool>) -> Self {
        match found {
            Some(true) => RuntimeClassState::Exists,
            Some(false) => RuntimeClassState::Missing,
            None => RuntimeClassState::Unknown,
        }
    }
}

/// A pod that passed every validation, and what the steps need of it.
pub(super) struct Target<'a> {
    pub pod: &'a Pod,
    pub spec: &'a PodSpec,
    /// The container the request goes to, and its index in `spec.containers`.
    pub index: usize,
    pub container: &'a Container,
    pub request: &'a GpuRequest,
    /// A MIG request's model and profile.
    pub mig_profile: Option<(&'a MigModel, &'a MigProfile)>,
    /// The extended resource and how many units of it.
    pub resource: String,
    pub quantity: u32,
    /// MPS needs hostIPC and the pod does not set it.
    pub inject_host_ipc: bool,
    pub normalized: String,
    /// The pod already carries the normalized request annotation.
    pub request_annotated: bool,
    /// Per-GPU form: the ConfigMap the pod's `NVIDIA_VISIBLE_DEVICES` is read from.
    pub devices_configmap: Option<String>,
    pub annotations: &'a std::collections::BTreeMap<String, String>,
}

/// The patch and the warnings for a validated pod: every step, in order.
pub(super) fn patch(
    t: &Target<'_>,
    policy: &Policy,
    mig: &crate::mig::MigTable,
    runtime_class: RuntimeClassState,
    legacy_runtime_class: RuntimeClassState,
) -> (Vec<PatchOperation>, Vec<String>) {
    // A time-sliced pod in per-GPU form runs under `nvidia-legacy` where the GPU Operator made it
    // (CDI on), unless the policy gives it its GPU's CDI device; an MPS one names a CDI device,
    // which the policy's runtime (CDI or auto mode) resolves.
    let timeslice = matches!(t.request.class, GpuClass::Timeslice { .. });
    let cdi_device = timeslice && policy.per_gpu.timeslice_cdi;
    let legacy = t.devices_configmap.is_some()
        && timeslice
        && !cdi_device
        && legacy_runtime_class == RuntimeClassState::Exists;
    let (runtime_class_name, runtime_class) = if legacy {
        (
            super::devices::LEGACY_RUNTIME_CLASS,
            RuntimeClassState::Exists,
        )
    } else {
        (policy.runtime_class_name.as_str(), runtime_class)
    };
    let mut b = PatchBuilder::default();
    let mut warnings = Vec::new();
    let index = t.index.to_string();
    let cpath = ["spec", "containers", index.as_str()];
    add_resource_limit(&mut b, t, &cpath, policy);
    add_tolerations(&mut b, t.spec, policy);
    set_runtime_class(
        &mut b,
        &mut warnings,
        t.spec,
        runtime_class_name,
        runtime_class,
    );
    set_mps_process_settings(&mut b, &mut warnings, t, policy);
    // Step 5: the node affinity (`affinity.rs`).
    if policy.node_affinity {
        let mut alternatives = affinity_for(&t.request.class, policy);
        alternatives.extend(gfd_single_alternative(&t.request.class, policy, mig));
        alternatives.extend(gke_alternative(&t.request.class, policy));
        alternatives.extend(declared_alternatives(&t.request.class, policy));
        require_affinity(&mut b, t.pod, &alternatives);
    }
    set_scheduler_name(&mut b, &mut warnings, t.spec, policy);
    add_env(&mut b, t.container, &cpath, &workload_env(t, policy));
    if let Some(cm) = &t.devices_configmap {
        // Step 7b: the per-GPU form's devices (`devices.rs`).
        let mps = matches!(t.request.class, GpuClass::Mps { .. });
        let key = if cdi_device {
            CDI_DEVICE_KEY
        } else {
            DEVICES_KEY
        };
        super::devices::patch(&mut b, t.spec, t.index, cm, key, mps, t.annotations);
    }
    if !t.request_annotated {
        // Step 8: the normalized request annotation (the parent exists: it holds the
        // gpu-share annotation).
        b.add(
            &["metadata", "annotations", ANNOTATION_REQUEST],
            json!(t.normalized),
        );
    }
    (b.ops, warnings)
}

/// Step 1: the extended resource, as a limit of the target container, and the pod's size in
/// thousandths of a GPU ([`gpu_milli_for`]) beside it.
fn add_resource_limit(b: &mut PatchBuilder, t: &Target<'_>, cpath: &[&str], policy: &Policy) {
    let limits = t
        .container
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref());
    let wanted = [(t.resource.as_str(), Some(t.quantity))]
        .into_iter()
        .chain([(
            crate::request::RESOURCE_GPU_MILLI,
            gpu_milli_for(t.spec, t.request, policy),
        )]);
    let missing: Vec<(&str, Value)> = wanted
        .filter_map(|(name, n)| Some((name, json!(n?.to_string()))))
        .filter(|(name, _)| !limits.is_some_and(|l| l.contains_key(*name)))
        .collect();
    if missing.is_empty() {
        return;
    }
    let map = || {
        Value::Object(
            missing
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        )
    };
    match t.container.resources.as_ref() {
        None => b.add(
            &[cpath, &["resources"]].concat(),
            json!({ "limits": map() }),
        ),
        Some(r) if r.limits.is_none() => b.add(&[cpath, &["resources", "limits"]].concat(), map()),
        Some(_) => {
            for (name, value) in missing {
                b.add(&[cpath, &["resources", "limits", name]].concat(), value);
            }
        }
    }
}

/// The pod's `gpu-share.io/gpu-milli`, when the policy adds it (`gpuMilli`) and the pod goes to
/// gpu-share's scheduler: a pod that keeps a scheduler of its own gets none, since that
/// scheduler would not know to ignore a resource no node advertises.
pub(super) fn gpu_milli_for(spec: &PodSpec, request: &GpuRequest, policy: &Policy) -> Option<u32> {
    let another = !policy.scheduler_name.is_empty()
        && match spec.scheduler_name.as_deref() {
            None | Some("") | Some("default-scheduler") => false,
            Some(s) => s != policy.scheduler_name,
        };
    (policy.gpu_milli && !another).then(|| request.gpu_milli())
}

/// Step 2: the policy's tolerations the pod does not have yet.
fn add_tolerations(b: &mut PatchBuilder, spec: &PodSpec, policy: &Policy) {
    let existing = spec.tolerations.clone().unwrap_or_default();
    let missing: Vec<Value> = policy
        .tolerations
        .iter()
        .filter(|want| !existing.iter().any(|have| tolerates(have, want)))
        .map(|t| serde_json::to_value(t).unwrap_or(Value::Null))
        .collect();
    if missing.is_empty() {
        return;
    }
    if spec.tolerations.is_none() {
        b.add(&["spec", "tolerations"], Value::Array(missing));
    } else {
        for t in missing {
            b.add(&["spec", "tolerations", "-"], t);
        }
    }
}

/// Step 3: the policy's RuntimeClass (for a pod in per-GPU form, `nvidia-legacy` where it
/// exists), when the pod names none and it exists.
fn set_runtime_class(
    b: &mut PatchBuilder,
    warnings: &mut Vec<String>,
    spec: &PodSpec,
    name: &str,
    state: RuntimeClassState,
) {
    if name.is_empty() || spec.runtime_class_name.is_some() {
        return;
    }
    match state {
        RuntimeClassState::Exists => b.add(&["spec", "runtimeClassName"], json!(name)),
        RuntimeClassState::Missing => warnings.push(format!(
            "gpu-share: RuntimeClass {name} does not exist; runtimeClassName not set"
        )),
        RuntimeClassState::Unknown => warnings.push(format!(
            "gpu-share: could not check RuntimeClass {name}; runtimeClassName not set"
        )),
    }
}

/// Step 4, MPS: hostIPC, and the policy's runAsUser unless the pod or the container sets one.
fn set_mps_process_settings(
    b: &mut PatchBuilder,
    warnings: &mut Vec<String>,
    t: &Target<'_>,
    policy: &Policy,
) {
    if t.inject_host_ipc {
        b.add(&["spec", "hostIPC"], json!(true));
        warnings.push("gpu-share: injected hostIPC: true for MPS".to_string());
    }
    let (GpuClass::Mps { .. }, Some(uid)) = (&t.request.class, policy.mps.run_as_user) else {
        return;
    };
    let container_sets = t
        .container
        .security_context
        .as_ref()
        .and_then(|s| s.run_as_user)
        .is_some();
    match t.spec.security_context.as_ref() {
        _ if container_sets => {}
        None => b.add(&["spec", "securityContext"], json!({ "runAsUser": uid })),
        Some(sc) if sc.run_as_user.is_none() => {
            b.add(&["spec", "securityContext", "runAsUser"], json!(uid))
        }
        Some(_) => {}
    }
}

/// Step 6: the policy's schedulerName, unless the pod chose another scheduler (said in a
/// warning).
fn set_scheduler_name(
    b: &mut PatchBuilder,
    warnings: &mut Vec<String>,
    spec: &PodSpec,
    policy: &Policy,
) {
    if policy.scheduler_name.is_empty() {
        return;
    }
    match spec.scheduler_name.as_deref() {
        None | Some("") | Some("default-scheduler") => {
            b.add(&["spec", "schedulerName"], json!(policy.scheduler_name))
        }
        Some(s) if s == policy.scheduler_name => {}
        Some(s) => warnings.push(format!(
            "gpu-share: pod keeps its own scheduler {s}; GPU shares are not accounted by gpu-share, nor counted in gpu-share.io/gpu-milli quotas"
        )),
    }
}

/// Step 7: the environment: what the workload got (`GPU_SHARE_*`), and the limits that hold its
/// share ([`super::limits`]).
fn workload_env(t: &Target<'_>, policy: &Policy) -> Vec<(String, String)> {
    let req = t.request;
    let mut env: Vec<(String, String)> = Vec::new();
    if policy.workload_env {
        env.push(("GPU_SHARE_CLASS".into(), req.class.to_string()));
        let (fraction, memory) = match (&req.class, t.mig_profile) {
            (GpuClass::Mig { .. }, Some((model, p))) => (
                fmt_num(
                    f64::from(p.compute_slices) / f64::from(model.compute_slices)
                        * f64::from(req.count),
                ),
                p.memory_mib.map(|m| m * u64::from(req.count)),
            ),
            (GpuClass::Mps { percent } | GpuClass::Timeslice { percent }, _) => {
                (GpuRequest::fraction_of(*percent), req.memory_mib)
            }
            (GpuClass::Exclusive { count }, _) => (count.to_string(), None),
            (GpuClass::Mig { .. }, None) => (String::new(), None),
        };
        if !fraction.is_empty() {
            env.push(("GPU_SHARE_FRACTION".into(), fraction));
        }
        if let Some(m) = memory {
            env.push(("GPU_SHARE_MEMORY_MIB".into(), m.to_string()));
        }
    }
    env.extend(super::limits::env(req, policy));
    env
}

/// Appends env vars the container does not already define (its own values win).
fn add_env(b: &mut PatchBuilder, container: &Container, cpath: &[&str], env: &[(String, String)]) {
    let have: Vec<&str> = container
        .env
        .iter()
        .flatten()
        .map(|e| e.name.as_str())
        .collect();
    let missing: Vec<Value> = env
        .iter()
        .filter(|(n, _)| !have.contains(&n.as_str()))
        .map(|(n, v)| json!({ "name": n, "value": v }))
        .collect();
    b.append(
        &[cpath, &["env"]].concat(),
        container.env.is_some(),
        missing,
    );
}

/// Whether an existing pod toleration already covers the one the policy wants.
fn tolerates(
    have: &k8s_openapi::api::core::v1::Toleration,
    want: &crate::policy::Toleration,
) -> bool {
    let have_key = have.key.as_deref().unwrap_or("");
    let have_op = have.operator.as_deref().unwrap_or("Equal");
    let have_effect = have.effect.as_deref().unwrap_or("");
    let want_effect = want.effect.map(|e| format!("{e:?}")).unwrap_or_default();
    if have_key.is_empty() && have_op == "Exists" {
        return have_effect.is_empty() || have_effect == want_effect;
    }
    if have_key != want.key || !(have_effect.is_empty() || have_effect == want_effect) {
        return false;
    }
    match (have_op, want.operator) {
        ("Exists", _) => true,
        ("Equal", TolerationOperator::Equal) => {
            have.value.as_deref().unwrap_or("") == want.value.as_deref().unwrap_or("")
        }
        _ => false,
    }
}

/// A number with at most four decimals and no trailing zeros.
pub(super) fn fmt_num(x: f64) -> String {
    let s = format!("{x:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

//! The mutation planner (PURE): (pod, policy, namespace facts) -> JSON Patch | denial.
//!
//! A pod CREATE is read once ([`Intake::read`]: annotations, the parsed request, the typed
//! Pod); what the webhook must look up ([`Intake::needs`]) and the plan ([`Intake::plan`]) both
//! work from that. The plan is the validations below, each a small function, then the numbered
//! patch steps of `steps.rs`. Every step looks at what the pod already has, so the patch applies
//! to the exact object received (missing parents are created whole, existing arrays are
//! appended to) and a second pass over the patched pod adds nothing.

use std::collections::BTreeMap;

use json_patch::PatchOperation;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use serde_json::Value;

use crate::inventory::{FormBasis, MigOffers};
use crate::mig::{MigModel, MigProfile, MigTable};
use crate::policy::MigStrategy;
use crate::policy::{NamespaceRule, Policy};
use crate::request::{self, ANNOTATION_REQUEST, AnnotatedRequest, GpuClass, GpuRequest};

use super::devices;
pub use super::steps::RuntimeClassState;
use super::steps::{self, Target, fmt_num};

/// Pod Security Admission label on namespaces.
pub const POD_SECURITY_ENFORCE: &str = "pod-security.kubernetes.io/enforce";

/// What the planner knows about the cluster for one request.
#[derive(Debug, Clone)]
pub struct Facts<'a> {
    pub namespace: &'a str,
    /// The namespace's labels; `None` when they could not be read (no cluster).
    pub namespace_labels: Option<&'a BTreeMap<String, String>>,
    pub runtime_class: RuntimeClassState,
    /// The AdmissionRequest's uid: names a pod's devices ConfigMap (per-GPU form).
    pub request_uid: &'a str,
    /// In which form the cluster's nodes offer each MIG profile (the policy's `mig.strategy:
    /// auto`); `None` when unknown (no cluster, or the nodes could not be read).
    pub mig_offers: Option<&'a MigOffers>,
    /// Whether the RuntimeClass `nvidia-legacy` exists (the GPU Operator makes it where CDI is
    /// on): a pod in per-GPU form runs under it ([`crate::admission::devices::LEGACY_RUNTIME_CLASS`]).
    pub legacy_runtime_class: RuntimeClassState,
}

/// Why a pod was denied: a fixed set, used as a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DenialReason {
    Unparsable,
    UnknownMigProfile,
    ConflictingLimits,
    ClassForbidden,
    TooLarge,
    ContainerNotFound,
    NodeNameSet,
    HostIpcForbidden,
    NotAPod,
    NamespaceUnavailable,
    /// `gpu-share.io/request` without `gpu-share`: only the webhook writes it.
    RequestWithoutGpuShare,
    /// An UPDATE changes an annotation fixed at admission, or one only gpu-share writes.
    AnnotationUpdate,
    /// A gpu-share pod sets `NVIDIA_VISIBLE_DEVICES` itself.
    VisibleDevicesSet,
    /// A gpu-share pod sets one of the variables that hold its share to its budget
    /// ([`super::limits::GUARDED`]).
    LimitsSet,
    /// An MPS share in per-GPU form runs as another user than the policy's `mps.runAsUser`.
    MpsUserDiffers,
}

impl DenialReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DenialReason::Unparsable => "unparsable",
            DenialReason::UnknownMigProfile => "unknown_mig_profile",
            DenialReason::ConflictingLimits => "conflicting_limits",
            DenialReason::ClassForbidden => "class_forbidden",
            DenialReason::TooLarge => "too_large",
            DenialReason::ContainerNotFound => "container_not_found",
            DenialReason::NodeNameSet => "node_name_set",
            DenialReason::HostIpcForbidden => "host_ipc_forbidden",
            DenialReason::NotAPod => "not_a_pod",
            DenialReason::NamespaceUnavailable => "namespace_unavailable",
            DenialReason::RequestWithoutGpuShare => "request_without_gpu_share",
            DenialReason::AnnotationUpdate => "annotation_update",
            DenialReason::VisibleDevicesSet => "visible_devices_set",
            DenialReason::LimitsSet => "limits_set",
            DenialReason::MpsUserDiffers => "mps_user_differs",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    pub reason: DenialReason,
    pub message: String,
}

impl Denial {
    pub(super) fn new(reason: DenialReason, message: impl Into<String>) -> Self {
        Denial {
            reason,
            message: message.into(),
        }
    }
}

/// A planned mutation.
#[derive(Debug, Clone, PartialEq)]
pub struct Mutation {
    pub request: GpuRequest,
    pub patch: Vec<PatchOperation>,
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// The pod carries no `gpu-share` annotation: allowed untouched.
    NotRequested,
    Mutate(Mutation),
    Deny(Denial),
}

/// Reads the annotations of a raw pod object. Used before typed parsing, so that a pod without
/// the annotation is never blocked, whatever else it holds.
pub fn annotations_of(object: &Value) -> BTreeMap<String, String> {
    object
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether the webhook must look at a pod with these annotations: it asks for a GPU, or it
/// carries the annotation only the webhook may write (which the scheduler trusts).
pub fn concerns_gpu_share(annotations: &BTreeMap<String, String>) -> bool {
    annotations.contains_key(request::ANNOTATION) || annotations.contains_key(ANNOTATION_REQUEST)
}

/// A pod CREATE read once: its annotations, its gpu-share request and the typed Pod.
#[derive(Debug, Clone)]
pub struct Intake {
    pub annotations: BTreeMap<String, String>,
    pub annotated: AnnotatedRequest,
    pub pod: Pod,
}

impl Intake {
    /// Reads a pod CREATE: the intake, or the decision already made without the cluster (not
    /// gpu-share's to look at, or denied in words).
    pub fn read(object: &Value) -> Result<Intake, Decision> {
        let annotations = annotations_of(object);
        if !concerns_gpu_share(&annotations) {
            return Err(Decision::NotRequested);
        }
        if annotations.contains_key(ANNOTATION_REQUEST)
            && !annotations.contains_key(request::ANNOTATION)
        {
            return Err(Decision::Deny(Denial::new(
                DenialReason::RequestWithoutGpuShare,
                format!(
                    "gpu-share: the pod carries annotation {ANNOTATION_REQUEST} without annotation {}; \
                     {ANNOTATION_REQUEST} is written by the gpu-share webhook from the {} annotation, and the \
                     scheduler trusts it over the pod's resource limits: remove it, and ask for a GPU with {}: <class>",
                    request::ANNOTATION,
                    request::ANNOTATION,
                    request::ANNOTATION
                ),
            )));
        }
        let annotated = match request::from_annotations(&annotations) {
            Ok(None) => return Err(Decision::NotRequested),
            Ok(Some(a)) => a,
            Err(e) => {
                return Err(Decision::Deny(Denial::new(
                    DenialReason::Unparsable,
                    format!("gpu-share: {e}"),
                )));
            }
        };
        let pod: Pod = serde_json::from_value(object.clone()).map_err(|e| {
            Decision::Deny(Denial::new(
                DenialReason::NotAPod,
                format!("gpu-share: the object is not a valid Pod: {e}"),
            ))
        })?;
        Ok(Intake {
            annotations,
            annotated,
            pod,
        })
    }

    /// What [`Intake::plan`] will need to know about the cluster for this pod under `policy`.
    pub fn needs(&self, policy: &Policy) -> Needs {
        let selector_rules = policy.namespaces.iter().any(|r| r.selector.is_some());
        // A per-GPU MPS share gets its pipe from its GPU's CDI device, not hostIPC.
        let mps_host_ipc = matches!(self.annotated.request.class, GpuClass::Mps { .. })
            && policy.mps.host_ipc
            && !policy.per_gpu.takes(&self.annotated.request.class);
        let pod_names_runtime_class = self
            .pod
            .spec
            .as_ref()
            .is_some_and(|s| s.runtime_class_name.is_some());
        Needs {
            namespace_labels: selector_rules || mps_host_ipc,
            runtime_class: !policy.runtime_class_name.is_empty() && !pod_names_runtime_class,
            mig_offers: matches!(self.annotated.request.class, GpuClass::Mig { .. })
                && policy.mig.strategy == MigStrategy::Auto
                && self.annotated.mig_strategy.is_none(),
            legacy_runtime_class: policy.per_gpu.takes(&self.annotated.request.class)
                && matches!(self.annotated.request.class, GpuClass::Timeslice { .. })
                && !policy.per_gpu.timeslice_cdi
                && !policy.runtime_class_name.is_empty()
                && !pod_names_runtime_class,
        }
    }

    /// The policy as this pod is written under it: a MIG pod in the form its own
    /// `gpu-share/mig-strategy` asks for; else, under `mig.strategy: auto`, in the form of the
    /// nodes that offer its profile or the pools the policy declares
    /// ([`crate::inventory::MigOffers::form`]), with a warning when it leaves devices or a
    /// declared pool of the profile out of its reach, when the form is a guess, or when the
    /// nodes could not be read.
    fn policy_for<'p>(
        &self,
        policy: &'p Policy,
        facts: &Facts<'_>,
    ) -> (std::borrow::Cow<'p, Policy>, Option<String>) {
        let GpuClass::Mig { profile } = &self.annotated.request.class else {
            return (std::borrow::Cow::Borrowed(policy), None);
        };
        if let Some(asked) = self.annotated.mig_strategy {
            return (policy.with_mig_form(asked), None);
        }
        if policy.mig.strategy != MigStrategy::Auto {
            return (std::borrow::Cow::Borrowed(policy), None);
        }
        let choose = "set gpu-share/mig-strategy: single or mixed on the pod, or mig.strategy in the policy, to choose";
        let Some(offers) = facts.mig_offers else {
            return (
                policy.with_mig_form(MigStrategy::Mixed),
                Some(format!(
                    "gpu-share: the nodes' MIG strategy could not be read, so mig-{profile} asks for {} (the mixed strategy's form); a node that offers it as nvidia.com/gpu (the single strategy) cannot take this pod ({choose})",
                    crate::mig::resource_name(profile)
                )),
            );
        };
        let form = offers.form(profile);
        let written = policy.with_mig_form(form.strategy);
        let resource = written.resource_for(&self.annotated.request).0;
        let (name, other) = match form.strategy {
            MigStrategy::Single => ("single", "mixed"),
            _ => ("mixed", "single"),
        };
        let warning = match form.basis {
            FormBasis::Offered if form.other_form_devices > 0 => Some(format!(
                "gpu-share: nodes offer mig-{profile} in both MIG strategies' forms; this pod asks for {resource} as the {name} strategy's nodes offer it ({} devices), so the {} devices on {other}-strategy nodes cannot take it ({choose})",
                offers.devices(profile, form.strategy),
                form.other_form_devices
            )),
            FormBasis::Offered if form.declared_pool_left_out => Some(format!(
                "gpu-share: this pod asks for {resource} as the nodes that offer mig-{profile} now do (the mixed strategy), so the pool the policy's nodeModes declare of mig-{profile} (the single strategy's nvidia.com/gpu) cannot take it, nor grow for it ({choose})"
            )),
            FormBasis::Offered | FormBasis::Declared => None,
            FormBasis::Labelled { nodes } => Some(format!(
                "gpu-share: no node offers mig-{profile} yet and no nodeModes rule of the policy declares a pool of it, so this pod asks for {resource} as the {name} strategy that {nodes} GPU node(s) are labelled with (nvidia.com/mig.strategy={name}) would offer it: a guess ({choose})"
            )),
            FormBasis::Nothing => Some(format!(
                "gpu-share: no node offers mig-{profile}, no GPU node is labelled with a MIG strategy and no nodeModes rule of the policy declares a pool of it, so this pod asks for {resource} (the mixed strategy's form): a guess ({choose})"
            )),
        };
        (written, warning)
    }

    /// Plans the mutation: the validations, then the patch steps.
    pub fn plan(&self, policy: &Policy, mig: &MigTable, facts: &Facts<'_>) -> Decision {
        let (policy, form_warning) = self.policy_for(policy, facts);
        let policy = policy.as_ref();
        match self.target(policy, mig, facts) {
            Ok(target) => {
                let (patch, mut warnings) = steps::patch(
                    &target,
                    policy,
                    mig,
                    facts.runtime_class,
                    facts.legacy_runtime_class,
                );
                warnings.extend(form_warning);
                Decision::Mutate(Mutation {
                    request: self.annotated.request.clone(),
                    patch,
                    warnings,
                })
            }
            Err(d) => Decision::Deny(d),
        }
    }

    /// Every validation, in order; what the patch steps work on.
    fn target<'a>(
        &'a self,
        policy: &Policy,
        mig: &'a MigTable,
        facts: &Facts<'_>,
    ) -> Result<Target<'a>, Denial> {
        let req = &self.annotated.request;
        let spec =
            self.pod.spec.as_ref().ok_or_else(|| {
                Denial::new(DenialReason::NotAPod, "gpu-share: the pod has no spec")
            })?;
        check_no_node_name(spec)?;
        let mig_profile = known_mig_profile(req, mig)?;
        let rule = policy.rule_for(facts.namespace, facts.namespace_labels);
        if let Some((i, rule)) = rule {
            check_namespace_rule(req, mig, facts, i, rule)?;
        }
        let index = target_container(spec, self.annotated.container.as_deref())?;
        let normalized = req.normalized();
        check_request_annotation(&self.annotations, &normalized)?;
        let (resource, quantity) = policy.resource_for(req);
        check_existing_gpu_resources(&spec.containers, index, &resource, quantity)?;
        check_gpu_milli(
            spec,
            index,
            super::steps::gpu_milli_for(spec, req, policy),
            req.gpu_milli(),
        )?;
        let devices_configmap = policy
            .per_gpu
            .takes(&req.class)
            .then(|| devices::configmap_name(&self.annotations, facts.request_uid));
        if let Some(why) = devices::set_by_user(spec, index, devices_configmap.as_deref()) {
            return Err(Denial::new(DenialReason::VisibleDevicesSet, why));
        }
        if let Some(why) = super::limits::set_by_user(
            spec,
            index,
            &super::limits::env(req, policy),
            devices_configmap.as_deref(),
        ) {
            return Err(Denial::new(DenialReason::LimitsSet, why));
        }
        let per_gpu_mps = devices_configmap.is_some() && matches!(req.class, GpuClass::Mps { .. });
        if per_gpu_mps && let Some(why) = super::limits::other_user(spec, index, policy) {
            return Err(Denial::new(DenialReason::MpsUserDiffers, why));
        }
        // A per-GPU MPS share gets its pipe and shared memory from its GPU's CDI device.
        let inject_host_ipc = matches!(req.class, GpuClass::Mps { .. })
            && !per_gpu_mps
            && policy.mps.host_ipc
            && spec.host_ipc != Some(true);
        if inject_host_ipc {
            check_host_ipc_allowed(req, rule, facts)?;
        }
        Ok(Target {
            pod: &self.pod,
            spec,
            index,
            container: &spec.containers[index],
            request: req,
            mig_profile,
            resource,
            quantity,
            inject_host_ipc,
            normalized,
            request_annotated: self.annotations.contains_key(ANNOTATION_REQUEST),
            devices_configmap,
            annotations: &self.annotations,
        })
    }
}

/// Which cluster facts the planner will use for a pod, so that the webhook looks up only those
/// and fails only when one it needs cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Needs {
    /// The namespace's labels matter (selector rules, or the Pod Security check before injecting
    /// hostIPC for MPS): the pod cannot be planned without them, so a failed read denies it.
    pub namespace_labels: bool,
    /// The policy's RuntimeClass is looked up (the pod names none and the policy sets one).
    pub runtime_class: bool,
    /// The nodes' MIG forms are read (a MIG pod under `mig.strategy: auto`).
    pub mig_offers: bool,
    /// The RuntimeClass `nvidia-legacy` is looked up (a pod in per-GPU form naming none).
    pub legacy_runtime_class: bool,
}

/// What [`plan`] will need to know about the cluster for this pod under this policy (nothing,
/// when it is decided without the cluster).
pub fn needs(object: &Value, policy: &Policy) -> Needs {
    match Intake::read(object) {
        Ok(intake) => intake.needs(policy),
        Err(_) => Needs {
            namespace_labels: false,
            runtime_class: false,
            mig_offers: false,
            legacy_runtime_class: false,
        },
    }
}

/// Plans the mutation of one pod on CREATE ([`Intake::read`], then [`Intake::plan`]).
pub fn plan(object: &Value, policy: &Policy, mig: &MigTable, facts: &Facts<'_>) -> Decision {
    match Intake::read(object) {
        Ok(intake) => intake.plan(policy, mig, facts),
        Err(decided) => decided,
    }
}

/// `spec.nodeName` bypasses the scheduler and its accounting.
fn check_no_node_name(spec: &PodSpec) -> Result<(), Denial> {
    match spec.node_name.as_deref().filter(|n| !n.is_empty()) {
        None => Ok(()),
        Some(node) => Err(Denial::new(
            DenialReason::NodeNameSet,
            format!(
                "gpu-share: the pod sets spec.nodeName ({node}), which bypasses the gpu-share scheduler and its GPU \
                 accounting; remove spec.nodeName (use a nodeSelector or node affinity to pin the pod instead)"
            ),
        )),
    }
}

/// A MIG request's profile must be in the table: its model and profile.
fn known_mig_profile<'a>(
    req: &GpuRequest,
    mig: &'a MigTable,
) -> Result<Option<(&'a MigModel, &'a MigProfile)>, Denial> {
    let GpuClass::Mig { profile } = &req.class else {
        return Ok(None);
    };
    match mig.find(profile) {
        Some(found) => Ok(Some(found)),
        None => {
            let hints = mig.suggestions(profile);
            Err(Denial::new(
                DenialReason::UnknownMigProfile,
                format!(
                    "gpu-share: unknown MIG profile {profile:?} (did you mean {}?); known profiles: {}",
                    hints.join(" or "),
                    mig.profile_names().join(", ")
                ),
            ))
        }
    }
}

/// The namespace's policy rule (number `i`): the class allowed, and at most its GPUs per pod.
fn check_namespace_rule(
    req: &GpuRequest,
    mig: &MigTable,
    facts: &Facts<'_>,
    i: usize,
    rule: &NamespaceRule,
) -> Result<(), Denial> {
    if !rule.allowed_classes.is_empty() && !rule.allowed_classes.contains(&req.class.kind()) {
        let allowed: Vec<&str> = rule.allowed_classes.iter().map(|c| c.as_str()).collect();
        return Err(Denial::new(
            DenialReason::ClassForbidden,
            format!(
                "gpu-share: class {} is not allowed in namespace {} (policy rule {} allows: {})",
                req.class.kind(),
                facts.namespace,
                rule.describe(i),
                allowed.join(", ")
            ),
        ));
    }
    if let Some(max) = rule.max_gpus_per_pod {
        let size = gpus_of(req, mig);
        if size > max + 1e-9 {
            return Err(Denial::new(
                DenialReason::TooLarge,
                format!(
                    "gpu-share: {} asks for {} GPUs, more than the {} GPUs per pod that policy rule {} allows in namespace {}",
                    req.normalized(),
                    fmt_num(size),
                    fmt_num(max),
                    rule.describe(i),
                    facts.namespace
                ),
            ));
        }
    }
    Ok(())
}

/// A GPU request's size in GPUs, for `maxGpusPerPod`.
pub fn gpus_of(request: &GpuRequest, table: &MigTable) -> f64 {
    match &request.class {
        GpuClass::Mig { profile } => table
            .find(profile)
            .map(|(m, p)| {
                f64::from(p.compute_slices) / f64::from(m.compute_slices) * f64::from(request.count)
            })
            .unwrap_or(0.0),
        GpuClass::Mps { percent } | GpuClass::Timeslice { percent } => f64::from(*percent) / 100.0,
        GpuClass::Exclusive { count } => f64::from(*count),
    }
}

/// The container the request goes to: the one `gpu-share/container` names, else the first.
fn target_container(spec: &PodSpec, named: Option<&str>) -> Result<usize, Denial> {
    match named {
        Some(name) => spec.containers.iter().position(|c| c.name == name).ok_or_else(|| {
            Denial::new(
                DenialReason::ContainerNotFound,
                format!(
                    "gpu-share: annotation gpu-share/container names {:?}, but the pod's containers are: {}",
                    short(name, 64),
                    some_names(spec.containers.iter().map(|c| c.name.as_str()), 10)
                ),
            )
        }),
        None if spec.containers.is_empty() => Err(Denial::new(
            DenialReason::ContainerNotFound,
            "gpu-share: the pod has no containers",
        )),
        None => Ok(0),
    }
}

/// The normalized request annotation is written by gpu-share only: one already there must say
/// what the `gpu-share` annotation asks.
fn check_request_annotation(
    annotations: &BTreeMap<String, String>,
    normalized: &str,
) -> Result<(), Denial> {
    match annotations.get(ANNOTATION_REQUEST) {
        Some(existing) if existing != normalized => Err(Denial::new(
            DenialReason::ConflictingLimits,
            format!(
                "gpu-share: annotation {ANNOTATION_REQUEST} says {existing:?} but gpu-share asks for {normalized:?}; \
                     {ANNOTATION_REQUEST} is written by the webhook: remove it (and the GPU resources copied with it)"
            ),
        )),
        _ => Ok(()),
    }
}

/// Existing GPU resources must agree with the annotation.
/// `gpu-share.io/gpu-milli` is gpu-share's to write: a container that sets it is refused, since
/// quotas would count the pod at a size of its own choosing. Kept: the target container at the
/// value the webhook writes (`want`: an earlier pass wrote it, or the template's quantity did),
/// and, where the webhook writes none (`want` is `None`: the policy's `gpuMilli` turned off
/// since the workload was created), at the pod's own size (`size`), so that a Job's pods are
/// never refused for what gpu-share wrote into its template.
fn check_gpu_milli(
    spec: &PodSpec,
    target: usize,
    want: Option<u32>,
    size: u32,
) -> Result<(), Denial> {
    let name = crate::request::RESOURCE_GPU_MILLI;
    for (is_target, kind, c) in devices::every_container(spec, target) {
        let Some(res) = c.resources.as_ref() else {
            continue;
        };
        for (field, map) in [("limits", &res.limits), ("requests", &res.requests)] {
            let Some(q) = map.as_ref().and_then(|m| m.get(name)) else {
                continue;
            };
            if is_target && is_count(&q.0, want.unwrap_or(size)) {
                continue;
            }
            return Err(Denial::new(
                DenialReason::ConflictingLimits,
                format!(
                    "gpu-share: {kind} {:?} sets {name}: {} in resources.{field}; gpu-share sets it to the pod's size in thousandths of a GPU{}, which quotas count: remove it",
                    c.name,
                    q.0,
                    want.map(|w| format!(" ({w} here)")).unwrap_or_default()
                ),
            ));
        }
    }
    Ok(())
}

/// Whether a quantity is the count `n`, however it is written: the API server writes an
/// object's quantities in canonical form once it has decoded it (`2000` becomes `2k`), so a
/// later webhook, or a pod made from a template, sees `2k` where `2000` was written.
fn is_count(q: &str, n: u32) -> bool {
    crate::inventory::quantity_milli(q) == Some(u128::from(n) * 1000)
}

fn check_existing_gpu_resources(
    containers: &[Container],
    target: usize,
    resource: &str,
    quantity: u32,
) -> Result<(), Denial> {
    for (i, c) in containers.iter().enumerate() {
        let Some(res) = c.resources.as_ref() else {
            continue;
        };
        for (field, map) in [("limits", &res.limits), ("requests", &res.requests)] {
            for (name, q) in map.iter().flatten() {
                if !name.starts_with("nvidia.com/") {
                    continue;
                }
                if i == target && name == resource && is_count(&q.0, quantity) {
                    continue;
                }
                if resource == crate::request::RESOURCE_SHARE {
                    return Err(Denial::new(
                        DenialReason::ConflictingLimits,
                        format!(
                            "gpu-share: container {:?} sets {name}: {} in resources.{field}, but on this cluster \
                             these pods are shared per GPU (policy perGpu): gpu-share holds their GPU \
                             and points them at it, and they ask the device plugin for nothing; remove the GPU resources",
                            c.name, q.0
                        ),
                    ));
                }
                return Err(Denial::new(
                    DenialReason::ConflictingLimits,
                    format!(
                        "gpu-share: container {:?} already sets {name}: {} in resources.{field}, which conflicts with the \
                         gpu-share annotation (it would set {resource}: {quantity} on container {:?}); remove the GPU \
                         resources or the annotation",
                        c.name, q.0, containers[target].name
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// MPS needs hostIPC here: the namespace's rule must allow injecting it, and its Pod Security
/// level must not forbid it.
fn check_host_ipc_allowed(
    req: &GpuRequest,
    rule: Option<(usize, &NamespaceRule)>,
    facts: &Facts<'_>,
) -> Result<(), Denial> {
    let class = req.class.to_string();
    if let Some((i, rule)) = rule.filter(|(_, r)| !r.allow_host_ipc) {
        return Err(Denial::new(
            DenialReason::HostIpcForbidden,
            format!(
                "gpu-share: {class} needs hostIPC on this cluster (policy mps.hostIPC: true), but policy rule {} \
                 does not allow injecting hostIPC in namespace {}; use a mig or timeslice class, or allow hostIPC there",
                rule.describe(i),
                facts.namespace
            ),
        ));
    }
    if let Some(level) = facts
        .namespace_labels
        .and_then(|l| l.get(POD_SECURITY_ENFORCE))
        && (level == "baseline" || level == "restricted")
    {
        return Err(Denial::new(
            DenialReason::HostIpcForbidden,
            format!(
                "gpu-share: {class} needs hostIPC on this cluster (policy mps.hostIPC: true), but namespace {} \
                     enforces Pod Security level {level:?}, which forbids hostIPC; use a mig or timeslice class, run \
                     MPS pods in a privileged namespace, or set mps.hostIPC: false if your MPS stack (NVIDIA device \
                     plugin v0.15+) does not need it",
                facts.namespace
            ),
        ));
    }
    Ok(())
}

/// `s` cut to `max` characters, with an ellipsis when cut.
pub(super) fn short(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_string(),
        Some((i, _)) => format!("{}...", &s[..i]),
    }
}

/// The first `max` names, each cut to 64 characters, and how many more there are.
fn some_names<'a>(names: impl ExactSizeIterator<Item = &'a str>, max: usize) -> String {
    let total = names.len();
    let mut out: Vec<String> = names.take(max).map(|n| short(n, 64)).collect();
    if total > max {
        out.push(format!("and {} more", total - max));
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::MigStrategy;
    use serde_json::json;

    #[test]
    fn a_request_is_sized_in_gpus_for_max_gpus_per_pod() {
        let t = MigTable::default();
        let mig = GpuRequest::new(GpuClass::Mig {
            profile: "3g.40gb".into(),
        });
        assert!((gpus_of(&mig, &t) - 3.0 / 7.0).abs() < 1e-9);
        let mps = GpuRequest::new(GpuClass::Mps { percent: 25 });
        assert!((gpus_of(&mps, &t) - 0.25).abs() < 1e-9);
        let two = GpuRequest::new(GpuClass::Exclusive { count: 2 });
        assert_eq!(gpus_of(&two, &t), 2.0);
    }

    fn pod(annotations: Value, spec: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"generateName": "p-", "namespace": "ml", "annotations": annotations},
               "spec": spec})
    }

    fn basic_spec() -> Value {
        json!({"containers": [{"name": "main", "image": "x", "resources": {}}], "schedulerName": "default-scheduler"})
    }

    fn facts() -> Facts<'static> {
        Facts {
            namespace: "ml",
            namespace_labels: None,
            runtime_class: RuntimeClassState::Exists,
            request_uid: "0b5e7a4c-2d1f-4e8a-9c3b-5a6d7e8f9012",
            mig_offers: None,
            legacy_runtime_class: RuntimeClassState::Unknown,
        }
    }

    fn run(obj: &Value) -> Decision {
        let p = Policy::default_policy();
        plan(obj, &p, &p.mig_table(), &facts())
    }

    fn apply(obj: &Value, m: &Mutation) -> Value {
        let mut doc = obj.clone();
        json_patch::patch(&mut doc, &m.patch).expect("patch applies");
        doc
    }

    fn mutated(obj: &Value) -> (Value, Mutation) {
        match run(obj) {
            Decision::Mutate(m) => (apply(obj, &m), m),
            other => panic!("expected a mutation, got {other:?}"),
        }
    }

    fn denied(obj: &Value) -> Denial {
        match run(obj) {
            Decision::Deny(d) => d,
            other => panic!("expected a denial, got {other:?}"),
        }
    }

    fn env_of(doc: &Value, name: &str) -> Option<String> {
        doc["spec"]["containers"][0]["env"]
            .as_array()?
            .iter()
            .find(|e| e["name"] == name)
            .map(|e| e["value"].as_str().unwrap_or_default().to_string())
    }

    /// Every class carries its size in thousandths of a GPU beside its device, in the GPU
    /// container's limits (which requests default to); a second pass adds nothing; a pod that
    /// keeps a scheduler of its own gets none; a size of the pod's own is refused in words.
    #[test]
    fn every_pod_carries_its_size_in_thousandths_for_quotas() {
        let milli = crate::request::RESOURCE_GPU_MILLI;
        let on = Policy::default_policy();
        assert!(on.gpu_milli, "on by default");
        let run = |obj: &Value| plan(obj, &on, &on.mig_table(), &facts());
        let mutated = |obj: &Value| match run(obj) {
            Decision::Mutate(m) => (apply(obj, &m), m),
            other => panic!("expected a mutation, got {other:?}"),
        };
        let denied = |obj: &Value| match run(obj) {
            Decision::Deny(d) => d,
            other => panic!("expected a denial, got {other:?}"),
        };
        for (request, want) in [
            ("mps-25", "250"),
            ("timeslice-50", "500"),
            ("mig-3g.40gb", "428"),
            ("mig-1g.10gb", "142"),
            ("exclusive-2", "2000"),
        ] {
            let obj = pod(json!({"gpu-share": request}), basic_spec());
            let (doc, _) = mutated(&obj);
            let limits = &doc["spec"]["containers"][0]["resources"]["limits"];
            assert_eq!(limits[milli], want, "{request}: {limits}");
            assert_eq!(limits.as_object().unwrap().len(), 2, "{request}: {limits}");
            let (again, _) = mutated(&doc);
            assert_eq!(again, doc, "{request}: a second pass adds nothing");
        }
        // MIG devices counted together.
        let two = pod(
            json!({"gpu-share": "mig-2g.20gb", "gpu-share/count": "2"}),
            basic_spec(),
        );
        let (doc, _) = mutated(&two);
        assert_eq!(
            doc["spec"]["containers"][0]["resources"]["limits"][milli],
            "570"
        );
        // A scheduler of its own: no quantity, and the warning says so.
        let mut own = basic_spec();
        own["schedulerName"] = json!("volcano");
        let (doc, m) = mutated(&pod(json!({"gpu-share": "mps-25"}), own));
        assert!(doc["spec"]["containers"][0]["resources"]["limits"][milli].is_null());
        assert!(
            m.warnings
                .iter()
                .any(|w| w.contains("nor counted in gpu-share.io/gpu-milli")),
            "{:?}",
            m.warnings
        );
        // Set by the pod: refused, wherever.
        for (path, value) in [("containers", "100"), ("initContainers", "250")] {
            let mut spec = basic_spec();
            let c = json!({"name": "x", "image": "x", "resources": {"requests": {milli: value}, "limits": {milli: value}}});
            if path == "containers" {
                spec["containers"][0]["resources"] = c["resources"].clone();
            } else {
                spec["initContainers"] = json!([c]);
            }
            let d = denied(&pod(json!({"gpu-share": "mps-25"}), spec));
            assert_eq!(d.reason, DenialReason::ConflictingLimits);
            assert!(
                d.message.contains("gpu-share.io/gpu-milli") && d.message.contains("(250 here)"),
                "{}",
                d.message
            );
        }
        // Off in the policy: nothing.
        let p = Policy::load("gpuMilli: false\n", "p.yaml").unwrap().policy;
        let obj = pod(json!({"gpu-share": "mps-25"}), basic_spec());
        let Decision::Mutate(m) = plan(&obj, &p, &p.mig_table(), &facts()) else {
            panic!()
        };
        assert!(apply(&obj, &m)["spec"]["containers"][0]["resources"]["limits"][milli].is_null());
        // Written back in the API server's canonical form (a pod made from a Job's template,
        // or a second pass after another webhook): the same count.
        let mut spec = basic_spec();
        spec["containers"][0]["resources"] =
            json!({"limits": {milli: "2k", "nvidia.com/gpu": "2"}});
        let (doc, _) = mutated(&pod(json!({"gpu-share": "exclusive-2"}), spec));
        assert_eq!(
            doc["spec"]["containers"][0]["resources"]["limits"][milli],
            "2k"
        );
        // Off in the policy, on a pod whose template got the quantity before it was turned off:
        // kept at the pod's own size, refused at any other.
        for (value, admitted) in [("250", true), ("300", false)] {
            let mut spec = basic_spec();
            spec["containers"][0]["resources"] = json!({"limits": {milli: value}});
            let obj = pod(json!({"gpu-share": "mps-25"}), spec);
            match plan(&obj, &p, &p.mig_table(), &facts()) {
                Decision::Mutate(m) => {
                    assert!(admitted, "{value} admitted");
                    let limits = &apply(&obj, &m)["spec"]["containers"][0]["resources"]["limits"];
                    assert_eq!(limits[milli], value);
                }
                Decision::Deny(d) => {
                    assert!(!admitted, "{value} denied: {}", d.message);
                    assert_eq!(d.reason, DenialReason::ConflictingLimits);
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn no_annotation_no_patch() {
        assert_eq!(
            run(&pod(json!({"x": "y"}), basic_spec())),
            Decision::NotRequested
        );
        // Even an object that is not a valid pod is left alone without the annotation.
        assert_eq!(run(&json!({"spec": "garbage"})), Decision::NotRequested);
    }

    #[test]
    fn needs_only_what_the_plan_uses() {
        let p = Policy::default_policy();
        assert!(p.mps.host_ipc && !p.runtime_class_name.is_empty());
        let n = needs(&pod(json!({"gpu-share": "timeslice-50"}), basic_spec()), &p);
        assert!(!n.namespace_labels);
        assert!(n.runtime_class);
        let n = needs(&pod(json!({"gpu-share": "mps-50"}), basic_spec()), &p);
        assert!(n.namespace_labels);
        let mut no_ipc = p.clone();
        no_ipc.mps.host_ipc = false;
        let n = needs(&pod(json!({"gpu-share": "mps-50"}), basic_spec()), &no_ipc);
        assert!(!n.namespace_labels);
        let selector = Policy::from_yaml(&crate::policy::DEFAULT_POLICY_YAML.replace(
            "\nnamespaces: []\n",
            "\nnamespaces:\n  - selector:\n      matchLabels: {team: ml}\n    allowedClasses: [mig]\n",
        ))
        .unwrap();
        let n = needs(
            &pod(json!({"gpu-share": "exclusive"}), basic_spec()),
            &selector,
        );
        assert!(n.namespace_labels);
        let mut spec = basic_spec();
        spec["runtimeClassName"] = json!("custom");
        assert!(!needs(&pod(json!({"gpu-share": "exclusive"}), spec), &p).runtime_class);
        let mut none = p.clone();
        none.runtime_class_name.clear();
        assert!(!needs(&pod(json!({"gpu-share": "exclusive"}), basic_spec()), &none).runtime_class);
        // Pods the planner denies from their annotations alone need nothing.
        let n = needs(&pod(json!({"gpu-share": "mps-0"}), basic_spec()), &selector);
        assert!(!n.namespace_labels && !n.runtime_class);
    }

    #[test]
    fn request_annotation_alone_is_denied() {
        // The scheduler's ledger trusts gpu-share.io/request over the limits: a pod that writes
        // it by hand could hold 8 GPUs while being accounted for a sliver of one.
        let mut spec = basic_spec();
        spec["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": "8"}});
        let obj = pod(json!({"gpu-share.io/request": "mps-1"}), spec);
        assert!(concerns_gpu_share(&annotations_of(&obj)));
        let d = denied(&obj);
        assert_eq!(d.reason, DenialReason::RequestWithoutGpuShare);
        assert_eq!(d.reason.as_str(), "request_without_gpu_share");
        assert!(
            d.message.contains("written by the gpu-share webhook"),
            "{}",
            d.message
        );
        // Even on something that is not a valid pod.
        let d = denied(
            &json!({"metadata": {"annotations": {"gpu-share.io/request": "exclusive"}}, "spec": "x"}),
        );
        assert_eq!(d.reason, DenialReason::RequestWithoutGpuShare);
        assert!(!concerns_gpu_share(&annotations_of(&pod(
            json!({"gpu-share.io/gpus": "0:1"}),
            basic_spec()
        ))));
    }

    #[test]
    fn mig_mixed() {
        let (doc, m) = mutated(&pod(json!({"gpu-share": "mig-1g.10gb+me"}), basic_spec()));
        assert_eq!(
            doc["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb.me"],
            "1"
        );
        assert_eq!(doc["spec"]["tolerations"][0]["key"], "nvidia.com/gpu");
        assert_eq!(doc["spec"]["runtimeClassName"], "nvidia");
        assert_eq!(doc["spec"]["schedulerName"], "gpu-share-scheduler");
        assert_eq!(
            doc["metadata"]["annotations"]["gpu-share.io/request"],
            "mig-1g.10gb+me"
        );
        assert!(
            doc["spec"].get("affinity").is_none(),
            "mixed MIG: the resource name selects nodes"
        );
        assert_eq!(
            env_of(&doc, "GPU_SHARE_FRACTION").as_deref(),
            Some("0.1429")
        );
        assert_eq!(
            env_of(&doc, "GPU_SHARE_MEMORY_MIB").as_deref(),
            Some("9984")
        );
        // The default policy's `auto`, with the nodes unknown here: the mixed form, said so.
        assert!(
            m.warnings.len() == 1 && m.warnings[0].contains("could not be read"),
            "{:?}",
            m.warnings
        );
    }

    #[test]
    fn mig_single_strategy_uses_gpu_and_affinity() {
        let mut p = Policy::default_policy();
        p.mig.strategy = MigStrategy::Single;
        let obj = pod(
            json!({"gpu-share": "mig-3g.40gb", "gpu-share/count": "2"}),
            basic_spec(),
        );
        let Decision::Mutate(m) = plan(&obj, &p, &p.mig_table(), &facts()) else {
            panic!()
        };
        let doc = apply(&obj, &m);
        assert_eq!(
            doc["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
            "2"
        );
        let term = &doc["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0];
        assert_eq!(
            term["matchExpressions"][0],
            json!({"key": "nvidia.com/mig.config", "operator": "In", "values": ["all-3g.40gb"]})
        );
        // Or a node GPU Feature Discovery alone labelled, by its product (`<model>-MIG-<profile>`),
        // or a GKE node partitioned in that size (one nvidia.com/gpu per partition).
        let terms = &doc["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"];
        assert_eq!(terms.as_array().map(Vec::len), Some(3));
        let products = &terms[1]["matchExpressions"][0];
        assert_eq!(products["key"], "nvidia.com/gpu.product");
        assert_eq!(products["operator"], "In");
        let values: Vec<&str> = products["values"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        for v in [
            "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb",
            "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb",
            "NVIDIA-A100-80GB-PCIe-MIG-3g.40gb",
        ] {
            assert!(values.contains(&v), "{v} in {values:?}");
        }
        assert!(
            values.iter().all(|v| v.ends_with("-MIG-3g.40gb")),
            "{values:?}"
        );
        assert_eq!(
            terms[2]["matchExpressions"],
            json!([{"key": "cloud.google.com/gke-gpu-partition-size", "operator": "In", "values": ["3g.40gb"]}])
        );

        // Under the mixed strategy the pod asks for nvidia.com/mig-3g.40gb, which GKE never
        // advertises: no GKE term, and no required affinity at all (the resource selects).
        let p = Policy::default_policy();
        let Decision::Mutate(m) = plan(&obj, &p, &p.mig_table(), &facts()) else {
            panic!()
        };
        let doc = apply(&obj, &m);
        assert_eq!(
            doc["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-3g.40gb"],
            "2"
        );
        assert!(doc["spec"].get("affinity").is_none(), "{}", doc["spec"]);
    }

    #[test]
    fn mps_with_memory() {
        let (doc, m) = mutated(&pod(
            json!({"gpu-share": "mps-25", "gpu-share/memory": "8Gi"}),
            basic_spec(),
        ));
        assert_eq!(doc["spec"]["hostIPC"], true);
        assert_eq!(
            doc["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
            "1"
        );
        assert_eq!(
            env_of(&doc, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE").as_deref(),
            Some("25")
        );
        assert_eq!(
            env_of(&doc, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT").as_deref(),
            Some("0=8192M")
        );
        assert_eq!(env_of(&doc, "GPU_SHARE_FRACTION").as_deref(), Some("0.25"));
        assert_eq!(
            env_of(&doc, "GPU_SHARE_MEMORY_MIB").as_deref(),
            Some("8192")
        );
        // The toolkit's hook reads the budget as the driver's soft and hard limits.
        for name in ["NVIDIA_GPU_MEMORY_REQUEST", "NVIDIA_GPU_MEMORY_LIMIT"] {
            assert_eq!(env_of(&doc, name).as_deref(), Some("8192"), "{name}");
        }
        // A second pass (reinvocation) keeps what the first wrote and adds nothing.
        let (again, m2) = mutated(&doc);
        assert_eq!(again, doc);
        assert!(m2.patch.is_empty(), "{:?}", m2.patch);
        assert_eq!(
            doc["metadata"]["annotations"]["gpu-share.io/request"],
            "mps-25,memory=8192Mi"
        );
        let term = &doc["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0];
        assert_eq!(term["matchExpressions"][0]["values"][0], "mps");
        assert!(m.warnings.iter().any(|w| w.contains("hostIPC")));
    }

    /// A user-set copy of a limit's variable is refused in words, whatever its value: the
    /// budget is gpu-share's to set.
    #[test]
    fn a_user_set_limit_is_refused() {
        for (name, value) in [
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=80G"),
            ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100"),
            ("CUDA_MPS_PIPE_DIRECTORY", "/tmp/mine"),
            ("NVIDIA_GPU_MEMORY_LIMIT", "81920"),
            ("NVIDIA_GPU_MEMORY_LIMITS", "81920"),
        ] {
            let spec = json!({"containers": [{"name": "main", "image": "cuda",
                "env": [{"name": name, "value": value}]}]});
            let d = denied(&pod(
                json!({"gpu-share": "mps-25", "gpu-share/memory": "8Gi"}),
                spec,
            ));
            assert_eq!(d.reason, DenialReason::LimitsSet);
            assert!(d.message.contains(name), "{}", d.message);
        }
    }

    #[test]
    fn mps_without_memory_sets_no_memory_limit() {
        let (doc, _) = mutated(&pod(json!({"gpu-share": "mps-50"}), basic_spec()));
        assert_eq!(env_of(&doc, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), None);
        assert_eq!(env_of(&doc, "GPU_SHARE_MEMORY_MIB"), None);
    }

    #[test]
    fn mps_run_as_user_never_overrides() {
        let mut p = Policy::default_policy();
        p.mps.run_as_user = Some(1000);
        let obj = pod(json!({"gpu-share": "mps-50"}), basic_spec());
        let Decision::Mutate(m) = plan(&obj, &p, &p.mig_table(), &facts()) else {
            panic!()
        };
        assert_eq!(
            apply(&obj, &m)["spec"]["securityContext"]["runAsUser"],
            1000
        );
        let mut spec = basic_spec();
        spec["securityContext"] = json!({"runAsUser": 7});
        let obj = pod(json!({"gpu-share": "mps-50"}), spec);
        let Decision::Mutate(m) = plan(&obj, &p, &p.mig_table(), &facts()) else {
            panic!()
        };
        assert_eq!(apply(&obj, &m)["spec"]["securityContext"]["runAsUser"], 7);
    }

    #[test]
    fn timeslice_and_exclusive_affinity() {
        let (doc, m) = mutated(&pod(json!({"gpu-share": "timeslice-50"}), basic_spec()));
        assert!(doc["spec"].get("hostIPC").is_none());
        assert!(m.warnings.is_empty());
        let t = &doc["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0];
        assert_eq!(t["matchExpressions"][0]["values"][0], "time-slicing");
        let (doc, _) = mutated(&pod(json!({"gpu-share": "exclusive-2"}), basic_spec()));
        assert_eq!(
            doc["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
            "2"
        );
        let t = &doc["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0];
        assert_eq!(
            t["matchExpressions"],
            json!([
                {"key": "nvidia.com/gpu.sharing-strategy", "operator": "NotIn", "values": ["mps", "time-slicing"]},
                {"key": "nvidia.com/gpu.slices.gi", "operator": "DoesNotExist"},
                {"key": "cloud.google.com/gke-gpu-sharing-strategy", "operator": "DoesNotExist"},
                {"key": "cloud.google.com/gke-gpu-partition-size", "operator": "DoesNotExist"}
            ])
        );
        // It matches unshared nodes of every platform, and no shared or MIG one.
        let term: k8s_openapi::api::core::v1::NodeSelectorTerm =
            serde_json::from_value(t.clone()).unwrap();
        let matches = |labels: &[(&str, &str)]| {
            term.match_expressions.iter().flatten().all(|r| {
                let v = labels.iter().find(|(k, _)| *k == r.key).map(|(_, v)| *v);
                let values = r.values.clone().unwrap_or_default();
                match (r.operator.as_str(), v) {
                    ("In", Some(v)) => values.iter().any(|x| x == v),
                    ("In", None) => false,
                    ("NotIn", Some(v)) => !values.iter().any(|x| x == v),
                    ("NotIn", None) => true,
                    ("DoesNotExist", v) => v.is_none(),
                    ("Exists", v) => v.is_some(),
                    _ => false,
                }
            })
        };
        assert!(matches(&[("nvidia.com/gpu.sharing-strategy", "none")]));
        assert!(matches(&[(
            "node.kubernetes.io/instance-type",
            "g5.12xlarge"
        )]));
        assert!(matches(&[(
            "cloud.google.com/gke-accelerator",
            "nvidia-l4"
        )]));
        assert!(!matches(&[("nvidia.com/gpu.sharing-strategy", "mps")]));
        assert!(!matches(&[(
            "nvidia.com/gpu.sharing-strategy",
            "time-slicing"
        )]));
        // The GPU Operator's default strategy labels every GPU node single, MIG or not: only
        // one whose nvidia.com/gpu are MIG devices (GFD gives those their slices) is left out.
        assert!(matches(&[
            ("nvidia.com/mig.strategy", "single"),
            ("nvidia.com/gpu.sharing-strategy", "none")
        ]));
        assert!(!matches(&[
            ("nvidia.com/mig.strategy", "single"),
            ("nvidia.com/gpu.slices.gi", "1")
        ]));
        assert!(!matches(&[(
            "cloud.google.com/gke-gpu-sharing-strategy",
            "time-sharing"
        )]));
        assert!(!matches(&[(
            "cloud.google.com/gke-gpu-partition-size",
            "1g.5gb"
        )]));
        assert_eq!(env_of(&doc, "GPU_SHARE_FRACTION").as_deref(), Some("2"));
    }

    #[test]
    fn affinity_is_anded_into_every_existing_term() {
        let mut spec = basic_spec();
        spec["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
        ]}}});
        let (doc, _) = mutated(&pod(json!({"gpu-share": "exclusive"}), spec.clone()));
        let terms = &doc["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"];
        assert_eq!(terms.as_array().unwrap().len(), 2, "no new ORed term");
        assert_eq!(terms[0]["matchExpressions"][0]["key"], "zone");
        assert_eq!(terms[0]["matchExpressions"][1]["values"][0], "mps");
        assert_eq!(terms[1]["matchExpressions"][0]["values"][0], "mps");
        assert_eq!(terms[1]["matchFields"][0]["key"], "metadata.name");

        // timeslice: GFD's time-slicing nodes or GKE's time-sharing ones, crossed with each of
        // the pod's own terms (2 x 2), every term keeping the pod's requirements.
        let (doc, _) = mutated(&pod(json!({"gpu-share": "timeslice-10"}), spec));
        let terms = doc["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"]
            .as_array()
            .unwrap()
            .clone();
        assert_eq!(terms.len(), 4);
        let keys = |t: &Value| -> Vec<String> {
            t["matchExpressions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| format!("{} {}", e["key"].as_str().unwrap(), e["values"]))
                .collect()
        };
        assert_eq!(
            keys(&terms[0]),
            vec![
                "zone [\"a\"]".to_string(),
                "nvidia.com/gpu.sharing-strategy [\"time-slicing\"]".to_string()
            ]
        );
        assert_eq!(
            keys(&terms[1]),
            vec![
                "zone [\"a\"]".to_string(),
                "cloud.google.com/gke-gpu-sharing-strategy [\"time-sharing\",\"TIME_SHARING\"]"
                    .to_string()
            ]
        );
        assert_eq!(terms[2]["matchFields"][0]["key"], "metadata.name");
        assert_eq!(terms[3]["matchFields"][0]["key"], "metadata.name");
        assert_eq!(keys(&terms[3]).len(), 1);

        // No terms of its own: one term per kind of node.
        let (doc, _) = mutated(&pod(json!({"gpu-share": "mps-25"}), basic_spec()));
        let terms = &doc["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"];
        assert_eq!(
            terms,
            &json!([
                {"matchExpressions": [{"key": "nvidia.com/gpu.sharing-strategy", "operator": "In", "values": ["mps"]}]},
                {"matchExpressions": [{"key": "cloud.google.com/gke-gpu-sharing-strategy", "operator": "In", "values": ["mps", "MPS"]}]}
            ])
        );
    }

    #[test]
    fn existing_tolerations_and_env_are_appended_to() {
        let mut spec = basic_spec();
        spec["tolerations"] = json!([{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]);
        spec["containers"][0]["env"] =
            json!([{"name": "A", "value": "1"}, {"name": "GPU_SHARE_CLASS", "value": "mine"}]);
        let (doc, _) = mutated(&pod(json!({"gpu-share": "exclusive"}), spec));
        let tol = doc["spec"]["tolerations"].as_array().unwrap();
        assert_eq!(tol.len(), 2);
        assert_eq!(tol[0]["key"], "node.kubernetes.io/not-ready");
        let env = doc["spec"]["containers"][0]["env"].as_array().unwrap();
        assert_eq!(env[0]["name"], "A");
        assert_eq!(
            env_of(&doc, "GPU_SHARE_CLASS").as_deref(),
            Some("mine"),
            "the pod's own value wins"
        );
    }

    #[test]
    fn existing_toleration_is_not_duplicated() {
        let mut spec = basic_spec();
        spec["tolerations"] = json!([{"key": "nvidia.com/gpu", "operator": "Exists"}]);
        let (doc, _) = mutated(&pod(json!({"gpu-share": "exclusive"}), spec));
        assert_eq!(doc["spec"]["tolerations"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn second_pass_adds_nothing() {
        for class in ["mig-1g.10gb", "mps-25", "timeslice-50", "exclusive-2"] {
            let (doc, _) = mutated(&pod(
                json!({"gpu-share": class, "gpu-share/container": "main"}),
                basic_spec(),
            ));
            let Decision::Mutate(m) = run(&doc) else {
                panic!("{class}")
            };
            assert!(m.patch.is_empty(), "{class}: {:?}", m.patch);
        }
    }

    #[test]
    fn runtime_class_warnings() {
        let p = Policy::default_policy();
        let obj = pod(json!({"gpu-share": "exclusive"}), basic_spec());
        for state in [RuntimeClassState::Missing, RuntimeClassState::Unknown] {
            let f = Facts {
                runtime_class: state,
                ..facts()
            };
            let Decision::Mutate(m) = plan(&obj, &p, &p.mig_table(), &f) else {
                panic!()
            };
            assert!(apply(&obj, &m)["spec"].get("runtimeClassName").is_none());
            assert!(
                m.warnings.iter().any(|w| w.contains("RuntimeClass nvidia")),
                "{:?}",
                m.warnings
            );
        }
        let mut spec = basic_spec();
        spec["runtimeClassName"] = json!("custom");
        let (doc, _) = mutated(&pod(json!({"gpu-share": "exclusive"}), spec));
        assert_eq!(doc["spec"]["runtimeClassName"], "custom");
    }

    #[test]
    fn scheduler_name_is_respected() {
        let mut spec = basic_spec();
        spec["schedulerName"] = json!("volcano");
        let (doc, m) = mutated(&pod(json!({"gpu-share": "exclusive"}), spec));
        assert_eq!(doc["spec"]["schedulerName"], "volcano");
        assert!(m.warnings.iter().any(|w| w.contains("volcano")));
    }

    #[test]
    fn denials_say_why() {
        let d = denied(&pod(json!({"gpu-share": "mig-7g.79gb"}), basic_spec()));
        assert_eq!(d.reason, DenialReason::UnknownMigProfile);
        assert!(d.message.contains("did you mean 7g.80gb"), "{}", d.message);
        // Misspelt so that it is no profile's shape at all: the nearest names still.
        for (typo, meant) in [("mig-1g.10g", "1g.10gb"), ("mig-3g40gb", "3g.40gb")] {
            let d = denied(&pod(json!({"gpu-share": typo}), basic_spec()));
            assert_eq!(d.reason, DenialReason::UnknownMigProfile, "{typo}");
            let hints = d
                .message
                .split("did you mean ")
                .nth(1)
                .and_then(|m| m.split('?').next());
            assert!(
                hints.is_some_and(|h| h.split(" or ").any(|n| n == meant)),
                "{typo}: {}",
                d.message
            );
        }

        let d = denied(&pod(json!({"gpu-share": "half"}), basic_spec()));
        assert_eq!(d.reason, DenialReason::Unparsable);
        assert!(d.message.contains("valid forms"));

        let d = denied(&pod(json!({"gpu-share": "mps-0"}), basic_spec()));
        assert!(d.message.contains("1 to 100"));

        let d = denied(&pod(
            json!({"gpu-share": "mps-20", "gpu-share/container": "side"}),
            basic_spec(),
        ));
        assert_eq!(d.reason, DenialReason::ContainerNotFound);
        assert!(d.message.contains("main"));

        let mut spec = basic_spec();
        spec["nodeName"] = json!("gpu-1");
        assert_eq!(
            denied(&pod(json!({"gpu-share": "mps-20"}), spec)).reason,
            DenialReason::NodeNameSet
        );

        let mut spec = basic_spec();
        spec["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": "2"}});
        let d = denied(&pod(json!({"gpu-share": "exclusive"}), spec));
        assert_eq!(d.reason, DenialReason::ConflictingLimits);
        assert!(d.message.contains("nvidia.com/gpu: 2"));

        // The same limit the annotation would set is accepted.
        let mut spec = basic_spec();
        spec["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": "2"}});
        assert!(matches!(
            run(&pod(json!({"gpu-share": "exclusive-2"}), spec)),
            Decision::Mutate(_)
        ));

        let d = denied(&pod(
            json!({"gpu-share": "mps-20", "gpu-share.io/request": "mps-30"}),
            basic_spec(),
        ));
        assert_eq!(d.reason, DenialReason::ConflictingLimits);
    }

    #[test]
    fn namespace_policy_and_pod_security() {
        let yaml = crate::policy::DEFAULT_POLICY_YAML.replace(
            "\nnamespaces: []\n",
            "\nnamespaces:\n  - names: [ml]\n    allowedClasses: [mig, mps]\n    maxGpusPerPod: 0.5\n  - names: [noipc]\n    allowHostIPC: false\n",
        );
        let p = Policy::from_yaml(&yaml).unwrap();
        let t = p.mig_table();
        let deny = |obj: &Value, f: &Facts<'_>| match plan(obj, &p, &t, f) {
            Decision::Deny(d) => d,
            other => panic!("{other:?}"),
        };
        let d = deny(
            &pod(json!({"gpu-share": "timeslice-10"}), basic_spec()),
            &facts(),
        );
        assert_eq!(d.reason, DenialReason::ClassForbidden);
        assert!(d.message.contains("allows: mig, mps"), "{}", d.message);
        let d = deny(&pod(json!({"gpu-share": "mps-60"}), basic_spec()), &facts());
        assert_eq!(d.reason, DenialReason::TooLarge);
        assert!(matches!(
            plan(
                &pod(json!({"gpu-share": "mps-50"}), basic_spec()),
                &p,
                &t,
                &facts()
            ),
            Decision::Mutate(_)
        ));

        let noipc = Facts {
            namespace: "noipc",
            ..facts()
        };
        assert_eq!(
            deny(&pod(json!({"gpu-share": "mps-50"}), basic_spec()), &noipc).reason,
            DenialReason::HostIpcForbidden
        );

        let labels: BTreeMap<String, String> =
            [(POD_SECURITY_ENFORCE.to_string(), "baseline".to_string())].into();
        let psa = Facts {
            namespace: "other",
            namespace_labels: Some(&labels),
            runtime_class: RuntimeClassState::Exists,
            request_uid: "0b5e7a4c-2d1f-4e8a-9c3b-5a6d7e8f9012",
            mig_offers: None,
            legacy_runtime_class: RuntimeClassState::Unknown,
        };
        let d = deny(&pod(json!({"gpu-share": "mps-50"}), basic_spec()), &psa);
        assert!(d.message.contains("baseline"), "{}", d.message);
        assert!(matches!(
            plan(
                &pod(json!({"gpu-share": "timeslice-50"}), basic_spec()),
                &p,
                &t,
                &psa
            ),
            Decision::Mutate(_)
        ));
    }

    #[test]
    fn missing_resources_and_slash_keys() {
        let spec = json!({"containers": [{"name": "a", "image": "x"}]});
        let (doc, m) = mutated(&pod(json!({"gpu-share": "mig-1g.10gb"}), spec));
        assert_eq!(
            doc["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"],
            "1"
        );
        assert!(m.patch.iter().any(|op| matches!(op, PatchOperation::Add(a) if a.path.as_str() == "/metadata/annotations/gpu-share.io~1request")));
        let mut spec = basic_spec();
        spec["containers"][0]["resources"] = json!({"limits": {"cpu": "1"}});
        let (doc, m) = mutated(&pod(json!({"gpu-share": "mig-1g.10gb"}), spec));
        assert_eq!(
            doc["spec"]["containers"][0]["resources"]["limits"]["cpu"],
            "1"
        );
        assert!(m.patch.iter().any(|op| matches!(op, PatchOperation::Add(a) if a.path.as_str() == "/spec/containers/0/resources/limits/nvidia.com~1mig-1g.10gb")));
    }

    #[test]
    fn init_containers_are_left_alone() {
        let mut spec = basic_spec();
        spec["initContainers"] = json!([{"name": "init", "image": "x", "resources": {}}]);
        let (doc, m) = mutated(&pod(json!({"gpu-share": "mps-20"}), spec.clone()));
        assert_eq!(doc["spec"]["initContainers"], spec["initContainers"]);
        assert!(
            m.patch
                .iter()
                .all(|op| !format!("{op:?}").contains("initContainers"))
        );
    }
}

//! The policy file model and its validation (PURE). Loading and reloading live in `server/`.
//!
//! `policies/default.yaml` is the embedded default and documents every field. Validation happens
//! while the YAML is read, so every error carries the line and column of the offending value.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::mig::{MigModel, MigTable};
use crate::nvidia::RESOURCE_GPU;
use crate::request::{ClassKind, GpuClass, GpuRequest};
use crate::workloads::WorkloadKind;

mod defrag;
mod enforcement;
mod fields;
mod packing;
mod per_gpu;
mod resources;
pub use defrag::{DefragMode, DefragPolicy};
pub use enforcement::EnforcementPolicy;
pub use fields::UNSET_BY_DEFAULT;
pub use packing::{Candidates, PackingPolicyName, PackingSection};
pub use per_gpu::PerGpuPolicy;
pub use resources::{ResourceName, ResourcesPolicy, Violation};

/// The embedded default policy.
pub const DEFAULT_POLICY_YAML: &str = include_str!("../../../policies/default.yaml");

#[derive(Debug, Error)]
pub enum PolicyError {
    #[error("{0}")]
    Yaml(String),
    #[error("{0}")]
    Invalid(String),
}

pub use crate::mig::MigStrategy;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TolerationOperator {
    Exists,
    Equal,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

/// A toleration the webhook adds to GPU pods.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Toleration {
    pub key: String,
    pub operator: TolerationOperator,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<TaintEffect>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigPolicy {
    #[serde(default = "defaults::mig_strategy")]
    pub strategy: MigStrategy,
    /// Extra MIG models (B200, GH200, ...): same shape as the built-in table.
    #[serde(default)]
    pub models: Vec<MigModel>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MpsPolicy {
    /// Inject `hostIPC: true` into MPS pods.
    #[serde(rename = "hostIPC", default = "defaults::mps_host_ipc")]
    pub host_ipc: bool,
    /// Inject `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`.
    #[serde(default = "defaults::mps_active_thread_percentage")]
    pub active_thread_percentage: bool,
    /// A `runAsUser` for MPS pods that set none (one MPS server serves one UID).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_user: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SelectorOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SelectorRequirement {
    pub key: String,
    pub operator: SelectorOperator,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// A Kubernetes label selector (`matchLabels` AND `matchExpressions`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<SelectorRequirement>,
}

impl LabelSelector {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|e| {
                let got = labels.get(&e.key);
                match e.operator {
                    SelectorOperator::In => got.is_some_and(|v| e.values.contains(v)),
                    SelectorOperator::NotIn => got.is_none_or(|v| !e.values.contains(v)),
                    SelectorOperator::Exists => got.is_some(),
                    SelectorOperator::DoesNotExist => got.is_none(),
                }
            })
    }
}

/// A per-namespace rule. A rule matches when the namespace is in `names` (if given) and its
/// labels match `selector` (if given); the first matching rule wins.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamespaceRule {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// Classes pods may ask for; empty means all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_classes: Vec<ClassKind>,
    /// Largest request per pod, in GPUs (mps-50 is 0.5, exclusive-2 is 2, mig-3g.40gb is 3/7).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_gpus_per_pod: Option<f64>,
    /// Whether the webhook may inject hostIPC for MPS pods here (default true).
    #[serde(default = "yes", rename = "allowHostIPC")]
    pub allow_host_ipc: bool,
}

fn yes() -> bool {
    true
}

impl NamespaceRule {
    pub fn matches(&self, namespace: &str, labels: Option<&BTreeMap<String, String>>) -> bool {
        if !self.names.is_empty() && !self.names.iter().any(|n| n == namespace) {
            return false;
        }
        match (&self.selector, labels) {
            (None, _) => true,
            (Some(sel), Some(labels)) => sel.matches(labels),
            // Labels unknown (no cluster): a selector rule cannot be evaluated, so it does not match.
            (Some(_), None) => false,
        }
    }

    /// A short name for messages: the names, the selector, or "catch-all".
    pub fn describe(&self, index: usize) -> String {
        if !self.names.is_empty() {
            format!("namespaces[{index}] ({})", self.names.join(", "))
        } else if self.selector.is_some() {
            format!("namespaces[{index}] (label selector)")
        } else {
            format!("namespaces[{index}] (catch-all)")
        }
    }
}

/// The whole policy file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Policy {
    #[serde(default = "defaults::version")]
    pub version: PolicyVersion,
    #[serde(default = "defaults::resources")]
    pub resources: ResourcesPolicy,
    #[serde(default = "defaults::mig")]
    pub mig: MigPolicy,
    #[serde(default = "defaults::tolerations")]
    pub tolerations: Vec<Toleration>,
    /// RuntimeClass for GPU pods; empty string: never set one.
    #[serde(default = "defaults::runtime_class_name")]
    pub runtime_class_name: String,
    /// Scheduler for GPU pods; empty string: leave `schedulerName` alone.
    #[serde(default = "defaults::scheduler_name")]
    pub scheduler_name: String,
    /// Add required node affinity to nodes of the right sharing mode.
    #[serde(default = "defaults::node_affinity")]
    pub node_affinity: bool,
    /// Add `GPU_SHARE_CLASS`, `GPU_SHARE_FRACTION` and `GPU_SHARE_MEMORY_MIB` to the container.
    #[serde(default = "defaults::workload_env")]
    pub workload_env: bool,
    /// Add `gpu-share.io/gpu-milli` (the pod's size in thousandths of a GPU) to the GPU
    /// container's limits, for ResourceQuota and Kueue to count. Needs the scheduler's
    /// `managedResources` entry for it with `ignoredByScheduler: true`.
    #[serde(default = "defaults::gpu_milli")]
    pub gpu_milli: bool,
    #[serde(default = "defaults::mps")]
    pub mps: MpsPolicy,
    #[serde(default)]
    pub packing: PackingSection,
    #[serde(default = "defaults::per_gpu")]
    pub per_gpu: PerGpuPolicy,
    #[serde(default)]
    pub namespaces: Vec<NamespaceRule>,
    /// How GPUs are shared on nodes whose labels do not say (no GPU Feature Discovery, not GKE),
    /// by node label; the first matching rule wins.
    #[serde(default)]
    pub node_modes: Vec<NodeMode>,
    /// What holds a share to its budget inside the GPU.
    #[serde(default)]
    pub enforcement: EnforcementPolicy,
    /// Workload kinds beyond Kubernetes' own controllers whose pod templates the template check
    /// reads ([`builtin_kinds`] are always read).
    #[serde(default)]
    pub workloads: Vec<WorkloadKind>,
    /// Moving running pods to make room for a pod that waits because the free capacity is
    /// scattered (docs/defragmentation.md).
    #[serde(default)]
    pub defrag: DefragPolicy,
}

/// A declared sharing mode for nodes matching a label selector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeMode {
    pub selector: LabelSelector,
    /// `none` (whole GPUs), `time-slicing` or `mps` (the device plugin's mode, for nodes whose
    /// labels do not say), or `per-gpu` (gpu-share shares the node's plain GPUs per GPU; any
    /// node, labelled or not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<DeclaredSharing>,
    /// Replicas per GPU, for `time-slicing` and `mps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
    /// Single-strategy MIG: every unit of `nvidia.com/gpu` is a MIG device of this profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_profile: Option<String>,
    /// The nodes' driver version (`615.25.01`, or a major alone), where GPU Feature Discovery's
    /// `nvidia.com/cuda.driver-version.*` labels do not give it (they win where they do).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// Whether these nodes' Container Toolkit applies the driver's per-container memory limits
    /// (its CDI hook `apply-cuda-memory-limits`): overrides `enforcement.memoryLimitHook`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit_hook: Option<bool>,
}

impl NodeMode {
    /// Whether the rule declares a sharing mode or a MIG profile (a rule may declare only what
    /// holds a share's budget: the driver's version, the toolkit's hook).
    pub fn declares_mode(&self) -> bool {
        self.sharing.is_some() || self.mig_profile.is_some()
    }
}

/// The sharing modes a [`NodeMode`] may declare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeclaredSharing {
    None,
    TimeSlicing,
    Mps,
    /// gpu-share shares the node's unshared, non-MIG GPUs per GPU (reservations hold them).
    PerGpu,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PolicyVersion {
    #[serde(rename = "v1")]
    V1,
}

/// Every field a policy file may leave out takes the embedded default's value
/// (`policies/default.yaml`, which sets every field).
mod defaults {
    use super::*;

    static DEFAULT: std::sync::LazyLock<Policy> = std::sync::LazyLock::new(|| {
        serde_saphyr::from_str(DEFAULT_POLICY_YAML)
            .expect("the embedded default policy sets every field (tested)")
    });

    pub fn version() -> PolicyVersion {
        DEFAULT.version
    }
    pub fn resources() -> ResourcesPolicy {
        DEFAULT.resources.clone()
    }
    pub fn mig() -> MigPolicy {
        DEFAULT.mig.clone()
    }
    pub fn mig_strategy() -> MigStrategy {
        DEFAULT.mig.strategy
    }
    pub fn tolerations() -> Vec<Toleration> {
        DEFAULT.tolerations.clone()
    }
    pub fn runtime_class_name() -> String {
        DEFAULT.runtime_class_name.clone()
    }
    pub fn scheduler_name() -> String {
        DEFAULT.scheduler_name.clone()
    }
    pub fn node_affinity() -> bool {
        DEFAULT.node_affinity
    }
    pub fn workload_env() -> bool {
        DEFAULT.workload_env
    }
    pub fn gpu_milli() -> bool {
        DEFAULT.gpu_milli
    }
    pub fn mps() -> MpsPolicy {
        DEFAULT.mps.clone()
    }
    pub fn per_gpu() -> PerGpuPolicy {
        DEFAULT.per_gpu.clone()
    }
    pub fn mps_host_ipc() -> bool {
        DEFAULT.mps.host_ipc
    }
    pub fn mps_active_thread_percentage() -> bool {
        DEFAULT.mps.active_thread_percentage
    }
}

/// A policy as read from a file: the policy, the fields the file left out (they hold the
/// embedded default's values) and warnings about values set empty on purpose.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedFile {
    pub policy: Policy,
    pub defaulted: Vec<&'static str>,
    pub warnings: Vec<String>,
}

impl Policy {
    /// Parses and validates a policy. Errors name the line and column and say what is wrong.
    pub fn from_yaml(text: &str) -> Result<Policy, PolicyError> {
        Ok(Policy::load(text, "<input>")?.policy)
    }

    /// [`Policy::from_yaml`], with errors naming `source` (the file given), the fields left out
    /// and the warnings.
    pub fn load(text: &str, source: &str) -> Result<LoadedFile, PolicyError> {
        let name = |e: String| e.replace("<input>", source);
        let value: serde_json::Value =
            serde_saphyr::from_str(text).map_err(|e| PolicyError::Yaml(name(e.to_string())))?;
        let serde_json::Value::Object(_) = &value else {
            return Err(PolicyError::Yaml(format!(
                "{source}: the file holds no policy (a mapping of fields such as version, tolerations, namespaces)"
            )));
        };
        let policy: Policy =
            serde_saphyr::from_str(text).map_err(|e| PolicyError::Yaml(name(e.to_string())))?;
        policy
            .validate()
            .map_err(|e| PolicyError::Invalid(locate(text, &e.0)))?;
        let present = |path: &str| fields::present(&value, path);
        let defaulted = fields::left_out(&value);
        let mut warnings = Vec::new();
        if present("schedulerName") && policy.scheduler_name.is_empty() {
            warnings.push(
                "schedulerName is empty: GPU pods keep the scheduler they name (usually default-scheduler), so gpu-share's extender never sees them: their GPU shares are not accounted or packed, and nothing stops two of them from overcommitting a GPU".to_string(),
            );
        }
        if present("runtimeClassName") && policy.runtime_class_name.is_empty() {
            warnings.push(
                "runtimeClassName is empty: GPU pods get no runtimeClassName, so on nodes whose default container runtime is not NVIDIA's they start without GPU access".to_string(),
            );
        }
        if present("tolerations") && policy.tolerations.is_empty() {
            warnings.push(
                "tolerations is empty: GPU pods get no toleration, so on GPU nodes tainted nvidia.com/gpu (the NVIDIA charts, GKE) they never schedule unless they carry one themselves".to_string(),
            );
        }
        Ok(LoadedFile {
            policy,
            defaulted,
            warnings,
        })
    }

    /// The embedded default policy.
    pub fn default_policy() -> Policy {
        Policy::from_yaml(DEFAULT_POLICY_YAML)
            .expect("the embedded default policy is valid (tested)")
    }

    /// Cross-field checks that the YAML reader cannot do. Errors name the field path.
    fn validate(&self) -> Result<(), Violation> {
        crate::workloads::validate(&self.workloads).map_err(|e| Violation(e.to_string()))?;
        self.defrag.validate()?;
        if self.per_gpu.mps && self.mps.run_as_user.is_none_or(|u| u < 0) {
            return Err(Violation(
                "perGpu.mps needs mps.runAsUser: one MPS server serves one UID at a time (a client of another waits until the server drains), so every MPS share of a GPU must run as the same user; set it, e.g. 1000".into(),
            ));
        }
        for (i, m) in self.node_modes.iter().enumerate() {
            let declares_enforcement = m.driver_version.is_some() || m.memory_limit_hook.is_some();
            if let Some(v) = &m.driver_version
                && crate::enforcement::driver_major(v).is_none()
            {
                return Err(Violation(format!(
                    "nodeModes[{i}].driverVersion: {v:?} is not a driver version like 615.25.01"
                )));
            }
            match (m.sharing, m.replicas, &m.mig_profile) {
                (None, None, None) if declares_enforcement => {}
                (Some(_), _, Some(_)) | (None, _, None) => {
                    return Err(Violation(format!(
                        "nodeModes[{i}]: give either sharing (none, time-slicing, mps, per-gpu) or migProfile, or what holds a share's budget (driverVersion, memoryLimitHook)"
                    )));
                }
                (Some(DeclaredSharing::TimeSlicing | DeclaredSharing::Mps), r, None)
                    if !r.is_some_and(|r| {
                        (2..=crate::nvidia::MAX_REPLICAS_PER_GPU).contains(&r)
                    }) =>
                {
                    return Err(Violation(format!(
                        "nodeModes[{i}].replicas must be 2-{} for time-slicing and mps",
                        crate::nvidia::MAX_REPLICAS_PER_GPU
                    )));
                }
                (Some(DeclaredSharing::None | DeclaredSharing::PerGpu), Some(_), _)
                | (None, Some(_), Some(_)) => {
                    return Err(Violation(format!(
                        "nodeModes[{i}].replicas applies to time-slicing and mps only"
                    )));
                }
                (None, None, Some(p))
                    if crate::request::parse_class(&format!("mig-{p}")).is_err() =>
                {
                    return Err(Violation(format!(
                        "nodeModes[{i}].migProfile: {p:?} is not a profile name like 1g.10gb"
                    )));
                }
                _ => {}
            }
            if m.selector.match_labels.is_empty() && m.selector.match_expressions.is_empty() {
                return Err(Violation(format!(
                    "nodeModes[{i}].selector must name at least one label"
                )));
            }
        }
        for (i, rule) in self.namespaces.iter().enumerate() {
            if let Some(max) = rule.max_gpus_per_pod
                && !(max.is_finite() && max > 0.0)
            {
                return Err(Violation(format!(
                    "namespaces[{i}].maxGpusPerPod must be a number above 0, got {max}"
                )));
            }
            if let Some(sel) = &rule.selector {
                for (j, e) in sel.match_expressions.iter().enumerate() {
                    let needs_values =
                        matches!(e.operator, SelectorOperator::In | SelectorOperator::NotIn);
                    if needs_values == e.values.is_empty() {
                        return Err(Violation(format!(
                            "namespaces[{i}].selector.matchExpressions[{j}]: operator {:?} {} values",
                            e.operator,
                            if needs_values { "needs" } else { "takes no" }
                        )));
                    }
                }
            }
        }
        for (i, t) in self.tolerations.iter().enumerate() {
            if t.key.is_empty() {
                return Err(Violation(format!("tolerations[{i}].key must not be empty")));
            }
            if t.operator == TolerationOperator::Exists && t.value.is_some() {
                return Err(Violation(format!(
                    "tolerations[{i}]: operator Exists takes no value"
                )));
            }
        }
        let table = MigTable::default();
        let mut seen = std::collections::BTreeSet::new();
        for (i, m) in self.mig.models.iter().enumerate() {
            if !seen.insert(m.model.clone()) {
                return Err(Violation(format!(
                    "mig.models[{i}]: model {} is listed twice",
                    m.model
                )));
            }
            if m.memory_slices == 0 || m.compute_slices == 0 || m.profiles.is_empty() {
                return Err(Violation(format!(
                    "mig.models[{i}] ({}): memorySlices, computeSlices and profiles must be set",
                    m.model
                )));
            }
            for p in &m.profiles {
                let shaped = crate::request::parse_class(&format!("mig-{}", p.name)).is_ok();
                if !shaped {
                    return Err(Violation(format!(
                        "mig.models[{i}].profiles: {:?} is not a profile name like 1g.10gb",
                        p.name
                    )));
                }
                if p.memory_slices == 0 || p.compute_slices == 0 {
                    return Err(Violation(format!(
                        "mig.models[{i}].profiles[{}]: memorySlices and computeSlices must be at least 1",
                        p.name
                    )));
                }
                if p.memory_slices > m.memory_slices || p.compute_slices > m.compute_slices {
                    return Err(Violation(format!(
                        "mig.models[{i}].profiles[{}]: slices exceed the GPU's",
                        p.name
                    )));
                }
                if p.max == 0 || p.max > m.memory_slices {
                    return Err(Violation(format!(
                        "mig.models[{i}].profiles[{}]: max must be from 1 to the GPU's memorySlices ({}), got {}",
                        p.name, m.memory_slices, p.max
                    )));
                }
                if p.starts.is_empty()
                    || p.starts.iter().any(|s| {
                        u16::from(*s) + u16::from(p.memory_slices) > u16::from(m.memory_slices)
                    })
                {
                    return Err(Violation(format!(
                        "mig.models[{i}].profiles[{}]: starts must be set and stay within the GPU",
                        p.name
                    )));
                }
                if let Some((other, existing)) = table.find(&p.name)
                    && other.model != m.model
                    && existing.compute_slices != p.compute_slices
                {
                    return Err(Violation(format!(
                        "mig.models[{i}].profiles[{}]: the name is already used by {} with other slices",
                        p.name, other.model
                    )));
                }
            }
        }
        Ok(())
    }

    /// The MIG table: built-in models plus the policy's.
    pub fn mig_table(&self) -> MigTable {
        MigTable::with_extra(&self.mig.models)
    }

    /// The first namespace rule that applies, with its index.
    pub fn rule_for(
        &self,
        namespace: &str,
        labels: Option<&BTreeMap<String, String>>,
    ) -> Option<(usize, &NamespaceRule)> {
        self.namespaces
            .iter()
            .enumerate()
            .find(|(_, r)| r.matches(namespace, labels))
    }

    /// This policy with MIG pods written in `form` (the webhook's choice for one pod under
    /// `auto`); borrowed when that is the policy's strategy already.
    pub fn with_mig_form(&self, form: MigStrategy) -> std::borrow::Cow<'_, Policy> {
        if self.mig.strategy == form {
            std::borrow::Cow::Borrowed(self)
        } else {
            let mut p = self.clone();
            p.mig.strategy = form;
            std::borrow::Cow::Owned(p)
        }
    }

    /// The extended resource name and quantity the webhook injects for a request.
    pub fn resource_for(&self, request: &GpuRequest) -> (String, u32) {
        match &request.class {
            // Auto is resolved to a form per pod before this (the plan's `with_mig_form`);
            // unresolved, it is the mixed form.
            GpuClass::Mig { profile } => match self.mig.strategy {
                MigStrategy::Mixed | MigStrategy::Auto => {
                    (crate::mig::resource_name(profile), request.count)
                }
                MigStrategy::Single => (RESOURCE_GPU.to_string(), request.count),
            },
            // Per-GPU form: no device-plugin resource (the pod is pointed at its GPU), only
            // what brings it to the extender.
            GpuClass::Timeslice { .. } | GpuClass::Mps { .. }
                if self.per_gpu.takes(&request.class) =>
            {
                (crate::request::RESOURCE_SHARE.to_string(), 1)
            }
            GpuClass::Mps { .. } => (self.resources.mps_resource().to_string(), 1),
            GpuClass::Timeslice { .. } => (self.resources.timeslice_resource().to_string(), 1),
            GpuClass::Exclusive { count } => (RESOURCE_GPU.to_string(), *count),
        }
    }

    /// Every resource name this policy can inject (for the scheduler's `managedResources`).
    pub fn managed_resources(&self) -> Vec<String> {
        let mut names = vec![
            RESOURCE_GPU.to_string(),
            self.resources.timeslice_resource().to_string(),
            self.resources.mps_resource().to_string(),
            crate::request::RESOURCE_SHARE.to_string(),
            crate::request::RESOURCE_GPU_MILLI.to_string(),
        ];
        if self.mig.strategy != MigStrategy::Single {
            names.extend(
                self.mig_table()
                    .profile_names()
                    .iter()
                    .map(|p| crate::mig::resource_name(p)),
            );
        }
        names.sort();
        names.dedup();
        names
    }

    /// The effective policy as YAML (for `check-policy`).
    pub fn to_yaml(&self) -> String {
        serde_saphyr::to_string(self).unwrap_or_else(|e| format!("# cannot render policy: {e}\n"))
    }
}

/// Adds the line of the first path segment found in the text to a validation message.
fn locate(text: &str, message: &str) -> String {
    let field = message
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '[' || c == ']'))
        .next()
        .unwrap_or_default();
    let top = field.split(['.', '[']).next().unwrap_or_default();
    let line = text
        .lines()
        .position(|l| l.trim_start().starts_with(&format!("{top}:")));
    match line {
        Some(n) if !top.is_empty() => format!("line {}: {message}", n + 1),
        _ => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_policy_is_valid_and_has_nvidia_defaults() {
        let p = Policy::default_policy();
        assert_eq!(p.resources.shared.as_str(), "nvidia.com/gpu");
        assert_eq!(p.mig.strategy, MigStrategy::Auto);
        assert_eq!(p.runtime_class_name, "nvidia");
        assert_eq!(p.scheduler_name, "gpu-share-scheduler");
        assert!(p.mps.host_ipc);
        assert_eq!(p.tolerations[0].key, "nvidia.com/gpu");
        assert!(
            p.managed_resources()
                .contains(&"nvidia.com/mig-1g.10gb.me".to_string())
        );
        // Round trip through the printed form.
        assert_eq!(Policy::from_yaml(&p.to_yaml()).unwrap(), p);
    }

    #[test]
    fn mig_model_slices_are_bounded() {
        let with = |profile: &str| {
            DEFAULT_POLICY_YAML.replace(
                "  models: []",
                &format!(
                    "  models:\n    - model: X-96GB\n      products: [X]\n      memorySlices: 8\n      computeSlices: 7\n      profiles:\n        - {profile}\n"
                ),
            )
        };
        let ok = with("{name: 1g.12gb, memorySlices: 1, computeSlices: 1, max: 7, starts: [0, 6]}");
        assert!(
            Policy::from_yaml(&ok).is_ok(),
            "{:?}",
            Policy::from_yaml(&ok)
        );
        for (profile, why) in [
            // 255 + 1 overflowed a u8 sum.
            (
                "{name: 1g.12gb, memorySlices: 1, computeSlices: 1, max: 7, starts: [255]}",
                "stay within the GPU",
            ),
            (
                "{name: 2g.24gb, memorySlices: 2, computeSlices: 2, max: 3, starts: [254]}",
                "stay within the GPU",
            ),
            (
                "{name: 1g.12gb, memorySlices: 1, computeSlices: 1, max: 7, starts: [8]}",
                "stay within the GPU",
            ),
            (
                "{name: 1g.12gb, memorySlices: 1, computeSlices: 0, max: 7, starts: [0]}",
                "at least 1",
            ),
            (
                "{name: 1g.12gb, memorySlices: 0, computeSlices: 1, max: 7, starts: [0]}",
                "at least 1",
            ),
            (
                "{name: 1g.12gb, memorySlices: 1, computeSlices: 1, max: 0, starts: [0]}",
                "max must be from 1 to the GPU's memorySlices (8), got 0",
            ),
            (
                "{name: 1g.12gb, memorySlices: 1, computeSlices: 1, max: 9, starts: [0]}",
                "got 9",
            ),
            (
                "{name: 1g.12gb, memorySlices: 9, computeSlices: 1, max: 1, starts: [0]}",
                "exceed",
            ),
        ] {
            match Policy::from_yaml(&with(profile)) {
                Err(PolicyError::Invalid(e)) => assert!(e.contains(why), "{profile}: {e}"),
                other => panic!("{profile}: expected an invalid policy, got {other:?}"),
            }
        }
    }

    #[test]
    fn errors_name_the_line() {
        let bad = DEFAULT_POLICY_YAML.replace("shared: nvidia.com/gpu", "shared: gpu");
        let e = Policy::from_yaml(&bad).unwrap_err().to_string();
        assert!(e.contains("line"), "{e}");
        assert!(e.contains("<domain>/<name>"), "{e}");
        let bad = DEFAULT_POLICY_YAML.replace("strategy: auto", "strategy: both");
        let e = Policy::from_yaml(&bad).unwrap_err().to_string();
        assert!(e.contains("line"), "{e}");
        let bad = format!("{DEFAULT_POLICY_YAML}\nsurprise: 1\n");
        assert!(
            Policy::from_yaml(&bad)
                .unwrap_err()
                .to_string()
                .contains("surprise")
        );
        let bad =
            format!("{DEFAULT_POLICY_YAML}\nnamespaces:\n  - names: [a]\n    maxGpusPerPod: -1\n");
        let e = Policy::from_yaml(&bad.replace("\nnamespaces: []\n", "\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("maxGpusPerPod") && e.contains("line"), "{e}");
        assert!(Policy::from_yaml("").is_err());
        assert!(Policy::from_yaml(": : :").is_err());
    }

    /// Every field a policy has, two levels deep, is one `check-policy` and the service's log
    /// name when a file leaves it out: read from the policy itself, every optional field set.
    #[test]
    fn the_fields_named_when_left_out_are_every_field_the_policy_has() {
        let mut p = Policy::default_policy();
        p.resources.timeslice = Some("nvidia.com/gpu.shared".to_string().try_into().unwrap());
        p.resources.mps = Some("nvidia.com/gpu".to_string().try_into().unwrap());
        p.mps.run_as_user = Some(1000);
        let v = serde_json::to_value(&p).unwrap();
        let mut paths = Vec::new();
        for (k, inner) in v.as_object().unwrap() {
            paths.push(k.clone());
            if let Some(o) = inner.as_object() {
                paths.extend(o.keys().map(|c| format!("{k}.{c}")));
            }
        }
        let mut fields: Vec<String> = super::fields::FIELDS
            .iter()
            .map(|f| f.to_string())
            .collect();
        paths.sort();
        fields.sort();
        assert_eq!(paths, fields);
        // And a file of one field names each of the others' sections.
        let l = Policy::load("version: v1\n", "p.yaml").unwrap();
        for f in [
            "resources",
            "mig",
            "mps",
            "packing",
            "perGpu",
            "nodeModes",
            "workloads",
        ] {
            assert!(l.defaulted.contains(&f), "{f} not named: {:?}", l.defaulted);
        }
    }

    /// A file that leaves fields out takes the embedded default's values for them
    /// (docs/configuration.md's `namespaces:` example is a whole file), says which, and warns
    /// about fields set empty on purpose; the embedded default itself sets every field.
    #[test]
    fn left_out_fields_take_the_defaults_and_empty_ones_warn() {
        let d = Policy::load(DEFAULT_POLICY_YAML, "default.yaml").unwrap();
        assert_eq!(
            d.defaulted, UNSET_BY_DEFAULT,
            "only the fields unset by default"
        );
        assert!(d.warnings.is_empty(), "{:?}", d.warnings);
        let only = "namespaces:\n  - names: [research]\n    allowedClasses: [mig, mps]\n";
        let l = Policy::load(only, "p.yaml").unwrap();
        let def = Policy::default_policy();
        assert_eq!(l.policy.scheduler_name, def.scheduler_name);
        assert_eq!(l.policy.runtime_class_name, def.runtime_class_name);
        assert_eq!(l.policy.tolerations, def.tolerations);
        assert_eq!(l.policy.mps, def.mps);
        assert_eq!(l.policy.namespaces.len(), 1);
        assert!(l.defaulted.contains(&"schedulerName"), "{:?}", l.defaulted);
        assert!(!l.defaulted.contains(&"namespaces"));
        assert!(l.warnings.is_empty());
        // A section given in part: its other fields are the default's, and named by path.
        let part = Policy::load("mps:\n  hostIPC: false\n", "p.yaml").unwrap();
        assert!(!part.policy.mps.host_ipc);
        assert_eq!(
            part.policy.mps.active_thread_percentage,
            def.mps.active_thread_percentage
        );
        assert!(part.defaulted.contains(&"mps.activeThreadPercentage"));
        assert!(!part.defaulted.contains(&"mps"));
        // Explicitly empty: kept, with the consequence in words.
        let empty = Policy::load(
            "schedulerName: \"\"\nruntimeClassName: \"\"\ntolerations: []\n",
            "p.yaml",
        )
        .unwrap();
        assert_eq!(empty.policy.scheduler_name, "");
        assert!(empty.policy.tolerations.is_empty());
        assert_eq!(empty.warnings.len(), 3, "{:?}", empty.warnings);
        assert!(empty.warnings[0].contains("not accounted"));
        // Errors name the file given.
        let e = Policy::load("nodeAffinity: maybe\n", "/etc/gpu-share/policy.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("/etc/gpu-share/policy.yaml:1:"), "{e}");
        assert!(!e.contains("<input>"), "{e}");
        let e = Policy::load("", "p.yaml").unwrap_err().to_string();
        assert!(e.contains("p.yaml"), "{e}");
    }

    #[test]
    fn node_modes_are_checked_in_words() {
        let bad = |yaml: &str, why: &str| {
            let e = Policy::load(yaml, "p.yaml").unwrap_err().to_string();
            assert!(e.contains(why), "{yaml}: {e}");
        };
        bad(
            "nodeModes:\n  - selector: {matchLabels: {a: b}}\n    sharing: mps\n",
            "replicas must be 2-48",
        );
        bad(
            "nodeModes:\n  - selector: {matchLabels: {a: b}}\n",
            "either sharing",
        );
        bad(
            "nodeModes:\n  - selector: {}\n    sharing: none\n",
            "at least one label",
        );
        bad(
            "nodeModes:\n  - selector: {matchLabels: {a: b}}\n    migProfile: big\n",
            "not a profile name",
        );
        bad(
            "nodeModes:\n  - selector: {matchLabels: {a: b}}\n    sharing: none\n    replicas: 2\n",
            "time-slicing and mps only",
        );
        bad(
            "nodeModes:\n  - selector: {matchLabels: {a: b}}\n    sharing: per-gpu\n    replicas: 2\n",
            "time-slicing and mps only",
        );
        bad(
            "nodeModes:\n  - selector: {matchLabels: {a: b}}\n    sharing: per-gpu\n    migProfile: 1g.10gb\n",
            "either sharing",
        );
        let ok = Policy::load(
            "nodeModes:\n  - selector: {matchLabels: {a: b}}\n    sharing: time-slicing\n    replicas: 4\n",
            "p.yaml",
        )
        .unwrap();
        assert_eq!(ok.policy.node_modes[0].replicas, Some(4));
    }

    #[test]
    fn namespace_rules_first_match_wins() {
        let yaml = DEFAULT_POLICY_YAML.replace(
            "\nnamespaces: []\n",
            "\nnamespaces:\n  - names: [research]\n    allowedClasses: [mig]\n  - selector:\n      matchLabels: {team: ml}\n    allowHostIPC: false\n  - maxGpusPerPod: 1\n",
        );
        let p = Policy::from_yaml(&yaml).unwrap();
        let labels: BTreeMap<String, String> = [("team".to_string(), "ml".to_string())].into();
        assert_eq!(p.rule_for("research", Some(&labels)).unwrap().0, 0);
        assert_eq!(p.rule_for("other", Some(&labels)).unwrap().0, 1);
        assert_eq!(
            p.rule_for("other", None).unwrap().0,
            2,
            "selector rules need labels"
        );
        assert_eq!(p.rule_for("other", Some(&BTreeMap::new())).unwrap().0, 2);
    }

    #[test]
    fn selector_operators() {
        let labels: BTreeMap<String, String> = [("a".to_string(), "1".to_string())].into();
        let req = |operator, values: &[&str]| LabelSelector {
            match_labels: BTreeMap::new(),
            match_expressions: vec![SelectorRequirement {
                key: "a".into(),
                operator,
                values: values.iter().map(|s| s.to_string()).collect(),
            }],
        };
        assert!(req(SelectorOperator::In, &["1"]).matches(&labels));
        assert!(!req(SelectorOperator::NotIn, &["1"]).matches(&labels));
        assert!(req(SelectorOperator::Exists, &[]).matches(&labels));
        assert!(!req(SelectorOperator::DoesNotExist, &[]).matches(&labels));
    }

    #[test]
    fn resource_names_and_sizes() {
        let p = Policy::default_policy();
        let mig = GpuRequest::new(GpuClass::Mig {
            profile: "1g.10gb+me".into(),
        });
        assert_eq!(
            p.resource_for(&mig),
            ("nvidia.com/mig-1g.10gb.me".to_string(), 1)
        );
        assert_eq!(
            p.resource_for(&GpuRequest::new(GpuClass::Exclusive { count: 2 })),
            ("nvidia.com/gpu".into(), 2)
        );
        assert!(ResourceName::try_from("nvidia.com/gpu".to_string()).is_ok());
        assert!(ResourceName::try_from("kubernetes.io/gpu".to_string()).is_err());
        assert!(ResourceName::try_from(format!("nvidia.com/{}", "x".repeat(64))).is_err());
    }
}

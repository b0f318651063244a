//! The limits that hold a share to its budget inside the GPU, as a container's environment
//! (PURE): what the webhook writes, and the refusal of every other copy of those variables.
//!
//! - `NVIDIA_GPU_MEMORY_REQUEST` and `NVIDIA_GPU_MEMORY_LIMIT` (MiB): the Container Toolkit's CDI
//!   hook `apply-cuda-memory-limits` sets the driver's soft and hard limits on the container's
//!   cgroup from them (driver r615 and later). Both are the share's budget: the packing keeps the
//!   budgets on a GPU within its memory, so a soft limit below the hard one would let a share
//!   take memory its neighbours were promised. A share without `gpu-share/memory` gets neither
//!   (the README's "What is enforced" says what holds it then).
//! - `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` and `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`: an MPS client's
//!   own limits, which can only narrow its server's.
//!
//! Each is written as a literal value, never read from a key that could be missing, but one: an
//! MPS share in per-GPU form reads its pinned limit from its devices ConfigMap, filled at bind
//! with its budget or its fraction of the GPU's memory, through a key that is not optional
//! (kubelet does not start the container without it). A
//! container that sets any of them itself, or `CUDA_MPS_PIPE_DIRECTORY` (which MPS server it
//! talks to), or the toolkit's plural spellings (read before the singular ones by some of its
//! versions), is refused in words, as a user-set `NVIDIA_VISIBLE_DEVICES` is: only the copy the
//! webhook wrote itself on an earlier pass stays.

use k8s_openapi::api::core::v1::PodSpec;

use crate::enforcement::{ENV_MEMORY_LIMIT, ENV_MEMORY_REQUEST, Requirement};
use crate::policy::Policy;
use crate::request::{GpuClass, GpuRequest};

/// An MPS client's pinned device-memory limit (`<device>=<MiB>M`).
pub const MPS_PINNED_MEMORY: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";
/// An MPS client's share of the GPU's threads, in percent.
pub const MPS_THREAD_PERCENTAGE: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
/// The MPS server a client talks to.
pub const MPS_PIPE_DIRECTORY: &str = "CUDA_MPS_PIPE_DIRECTORY";

/// Every variable that sets or moves a share's limits: only gpu-share (or the device plugin)
/// sets them on a gpu-share pod.
pub const GUARDED: [&str; 7] = [
    ENV_MEMORY_REQUEST,
    ENV_MEMORY_LIMIT,
    "NVIDIA_GPU_MEMORY_REQUESTS",
    "NVIDIA_GPU_MEMORY_LIMITS",
    MPS_PINNED_MEMORY,
    MPS_THREAD_PERCENTAGE,
    MPS_PIPE_DIRECTORY,
];

/// The limits the webhook writes into the target container for `request` under `policy`.
pub fn env(request: &GpuRequest, policy: &Policy) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = Vec::new();
    let share = matches!(
        request.class,
        GpuClass::Mps { .. } | GpuClass::Timeslice { .. }
    );
    if let GpuClass::Mps { percent } = request.class {
        if policy.mps.active_thread_percentage {
            env.push((MPS_THREAD_PERCENTAGE.into(), percent.to_string()));
        }
        // In per-GPU form the ConfigMap's key holds it (`devices::patch`).
        if let Some(m) = request.memory_mib
            && !policy.per_gpu.takes(&request.class)
        {
            env.push((MPS_PINNED_MEMORY.into(), format!("0={m}M")));
        }
    }
    if share
        && policy.enforcement.budgets != Requirement::Off
        && let Some(m) = request.memory_mib
    {
        env.push((ENV_MEMORY_REQUEST.into(), m.to_string()));
        env.push((ENV_MEMORY_LIMIT.into(), m.to_string()));
    }
    env
}

/// `Some`: why the pod is refused, in words: a container sets one of [`GUARDED`] other than as
/// `ours` says (the target container's own limits, from [`env`], which an earlier pass of the
/// webhook wrote), or, in per-GPU form, as the pinned limit read from `configmap`.
pub fn set_by_user(
    spec: &PodSpec,
    target: usize,
    ours: &[(String, String)],
    configmap: Option<&str>,
) -> Option<String> {
    for (is_target, kind, c) in super::devices::every_container(spec, target) {
        for e in c.env.iter().flatten() {
            if !GUARDED.contains(&e.name.as_str()) {
                continue;
            }
            let literal = e.value_from.is_none()
                && ours
                    .iter()
                    .any(|(n, v)| *n == e.name && e.value.as_deref() == Some(v.as_str()));
            let from_configmap = e.name == MPS_PINNED_MEMORY
                && configmap.is_some_and(|cm| super::devices::reads_key(e, cm, MPS_PINNED_MEMORY));
            let written = is_target && (literal || from_configmap);
            if !written {
                return Some(format!(
                    "gpu-share: {kind} {:?} sets {}, which would change the limits that hold the pod's share to its budget inside the GPU; gpu-share sets them from the pod's request (gpu-share, gpu-share/memory) and the device plugin sets the MPS pipe: remove it",
                    c.name, e.name
                ));
            }
        }
    }
    None
}

/// `Some`: why an MPS share in per-GPU form is refused, in words: its GPU container runs as
/// another user than the policy's `mps.runAsUser`. One MPS server serves one UID at a time (a
/// client of another waits until the server drains), so every MPS share of a GPU runs as that
/// user; a pod that sets none gets it (step 4).
pub fn other_user(spec: &PodSpec, target: usize, policy: &Policy) -> Option<String> {
    let want = policy.mps.run_as_user?;
    let container = spec.containers.get(target)?;
    let set = container
        .security_context
        .as_ref()
        .and_then(|s| s.run_as_user)
        .or_else(|| spec.security_context.as_ref().and_then(|s| s.run_as_user))?;
    (set != want).then(|| {
        format!(
            "gpu-share: container {:?} runs as user {set}, and the GPU's MPS server serves user {want} (the policy's mps.runAsUser): one MPS server serves one user at a time, so every MPS share of a GPU runs as that user; remove runAsUser, or set it to {want}",
            container.name
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn req(text: &str, memory: Option<u64>) -> GpuRequest {
        GpuRequest {
            memory_mib: memory,
            ..GpuRequest::new(crate::request::parse_class(text).unwrap())
        }
    }

    fn spec(containers: serde_json::Value) -> PodSpec {
        serde_json::from_value(json!({"containers": containers})).unwrap()
    }

    #[test]
    fn a_budgeted_share_gets_the_hooks_limits_and_an_mps_share_its_clients() {
        let p = Policy::default_policy();
        let env = env(&req("mps-25", Some(20480)), &p);
        let get = |n: &str| env.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
        assert_eq!(get(MPS_THREAD_PERCENTAGE), Some("25"));
        assert_eq!(get(MPS_PINNED_MEMORY), Some("0=20480M"));
        assert_eq!(get(ENV_MEMORY_REQUEST), Some("20480"));
        assert_eq!(get(ENV_MEMORY_LIMIT), Some("20480"));
        let ts = super::env(&req("timeslice-50", Some(1024)), &p);
        assert_eq!(
            ts,
            vec![
                (ENV_MEMORY_REQUEST.to_string(), "1024".to_string()),
                (ENV_MEMORY_LIMIT.to_string(), "1024".to_string())
            ]
        );
        // No budget, no limit to write; MIG and whole GPUs need none; `off` writes none.
        assert!(super::env(&req("timeslice-50", None), &p).is_empty());
        assert!(super::env(&req("exclusive", Some(1024)), &p).is_empty());
        let off = Policy::load("enforcement:\n  budgets: off\n", "p.yaml")
            .unwrap()
            .policy;
        assert!(super::env(&req("timeslice-50", Some(1024)), &off).is_empty());
    }

    #[test]
    fn every_user_set_copy_is_refused_in_words_and_the_webhooks_own_kept() {
        let ours = vec![(ENV_MEMORY_LIMIT.to_string(), "1024".to_string())];
        for name in GUARDED {
            let s = spec(json!([{"name": "main", "env": [{"name": name, "value": "99999"}]}]));
            let why = set_by_user(&s, 0, &ours, None).expect("refused");
            assert!(why.contains(name) && why.contains("\"main\""), "{why}");
        }
        // What an earlier pass wrote stays; the same name from a key, or in a sidecar, does not.
        let s =
            spec(json!([{"name": "main", "env": [{"name": ENV_MEMORY_LIMIT, "value": "1024"}]}]));
        assert_eq!(set_by_user(&s, 0, &ours, None), None);
        let from_key = spec(json!([{"name": "main", "env": [{"name": ENV_MEMORY_LIMIT,
            "valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}}}]}]));
        assert!(set_by_user(&from_key, 0, &ours, None).is_some());
        let sidecar = spec(json!([{"name": "main"},
            {"name": "side", "env": [{"name": ENV_MEMORY_LIMIT, "value": "1024"}]}]));
        assert!(
            set_by_user(&sidecar, 0, &ours, None)
                .unwrap()
                .contains("\"side\"")
        );
        let init: PodSpec = serde_json::from_value(json!({"containers": [{"name": "main"}],
            "initContainers": [{"name": "warm", "env": [{"name": MPS_PIPE_DIRECTORY, "value": "/tmp/x"}]}]}))
        .unwrap();
        assert!(
            set_by_user(&init, 0, &ours, None)
                .unwrap()
                .contains("init container \"warm\"")
        );
        // Other variables are the pod's own business.
        let other = spec(
            json!([{"name": "main", "env": [{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}]}]),
        );
        assert_eq!(set_by_user(&other, 0, &ours, None), None);
    }
}

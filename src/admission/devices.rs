//! Pointing a pod in per-GPU form at its GPU (PURE): `NVIDIA_VISIBLE_DEVICES` read from a key of
//! a per-pod ConfigMap that gpu-share fills once the pod's GPU is held, and refusing the variable
//! wherever else a gpu-share pod sets it.
//!
//! The gate is the ConfigMap key: kubelet does not start a container whose env names a missing
//! ConfigMap or key (`optional: false`), so the container never starts before gpu-share has
//! written the UUID of the GPU its ledger holds for the pod, and never on another GPU. The name
//! is fixed here, at admission, from the AdmissionRequest's uid: the pod's own uid does not exist
//! yet, and a name derived from the pod's name would meet a previous pod's ConfigMap (a
//! StatefulSet reuses names before the garbage collector removes the old one).
//!
//! A downward-API env from an annotation written with the Binding would need no ConfigMap, but
//! kubelet resolves a downward-API env from whatever the pod carries when the container starts,
//! missing or not: a pod bound before its GPU's reservation knew the UUID would start on no GPU,
//! or on every GPU when the image sets `NVIDIA_VISIBLE_DEVICES=all`. Bind cannot wait for a new
//! reservation to start (kube-scheduler's bind timeout), so the gate must be one kubelet waits on.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, EnvVar, PodSpec};
use serde_json::{Value, json};

use super::patch::PatchBuilder;
pub use crate::request::{ANNOTATION_DEVICES, CDI_DEVICE_KEY, DEVICES_KEY};
/// The key (and variable) of an MPS share's pinned device-memory limit, filled at bind.
pub use crate::reservation::model::MPS_PINNED_KEY;

/// The variable NVIDIA's Container Toolkit reads the visible GPUs from.
pub const VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";

/// The RuntimeClass a pod in per-GPU form runs under where it exists. The GPU Operator 25.10 and
/// later turns CDI on by default: it then creates the RuntimeClasses `nvidia-cdi` and
/// `nvidia-legacy` beside `nvidia`, makes runc containerd's default, and runs the `nvidia`
/// runtime in CDI mode, which reads a bare GPU UUID in `NVIDIA_VISIBLE_DEVICES` as the device
/// `management.nvidia.com/gpu=<UUID>`, which no CDI spec defines: the container fails to
/// create ("unresolvable CDI devices"). The legacy runtime reads the variable as before
/// (nvidia-container-toolkit: `internal/modifier/cdi.go`, `internal/info/auto.go`; gpu-operator:
/// `controllers/object_controls.go`, v25.10.0). Where CDI is off the class does not exist and
/// the policy's `runtimeClassName` applies.
pub const LEGACY_RUNTIME_CLASS: &str = "nvidia-legacy";
/// What the other containers of a pod in per-GPU form see: no GPU, and no driver files (an image
/// that sets `NVIDIA_VISIBLE_DEVICES=all`, as CUDA's do, would otherwise see every GPU).
pub const NO_DEVICES: &str = "void";
/// The driver capabilities a share gets when its container sets none.
pub const DRIVER_CAPABILITIES: (&str, &str) = ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility");
/// Prefix of the per-pod ConfigMaps.
pub const CONFIGMAP_PREFIX: &str = "gpu-share-devices-";

/// The pod's ConfigMap: the one a previous pass of the webhook named (kept, so that a second
/// pass changes nothing), else one named from the AdmissionRequest's uid.
pub fn configmap_name(annotations: &BTreeMap<String, String>, request_uid: &str) -> String {
    if let Some(name) = annotations
        .get(ANNOTATION_DEVICES)
        .filter(|n| is_configmap_name(n))
    {
        return name.clone();
    }
    let uid: String = request_uid
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .map(|c| c.to_ascii_lowercase())
        .collect();
    let uid = uid.trim_matches('-');
    if !uid.is_empty() && uid.len() <= 64 && uid.len() == request_uid.len() {
        return format!("{CONFIGMAP_PREFIX}{uid}");
    }
    // Not a UUID (the API server always sends one): a digest of it, still one name per request.
    let digest = ring::digest::digest(&ring::digest::SHA256, request_uid.as_bytes());
    let hex: String = digest.as_ref()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{CONFIGMAP_PREFIX}{hex}")
}

/// Whether `name` is one [`configmap_name`] gives.
pub fn is_configmap_name(name: &str) -> bool {
    name.strip_prefix(CONFIGMAP_PREFIX).is_some_and(|rest| {
        !rest.is_empty()
            && rest.len() <= 64
            && rest
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !rest.ends_with('-')
    })
}

/// The one env entry that names the ConfigMap's key: [`DEVICES_KEY`], or [`CDI_DEVICE_KEY`] for
/// a time-sliced share that takes its GPU's CDI device.
fn from_configmap(name: &str, key: &str) -> Value {
    json!({
        "name": VISIBLE_DEVICES,
        "valueFrom": {"configMapKeyRef": {"name": name, "key": key, "optional": false}}
    })
}

/// Whether `e` is exactly what [`patch`] writes into the target container (either key: the
/// policy may have changed since the first pass).
fn is_ours_target(e: &EnvVar, configmap: &str) -> bool {
    reads_key(e, configmap, DEVICES_KEY) || reads_key(e, configmap, CDI_DEVICE_KEY)
}

/// Whether `e` reads key `key` of ConfigMap `configmap`, not optionally, and nothing else.
pub(super) fn reads_key(e: &EnvVar, configmap: &str, key: &str) -> bool {
    e.value.is_none()
        && e.value_from.as_ref().is_some_and(|f| {
            f.field_ref.is_none()
                && f.resource_field_ref.is_none()
                && f.secret_key_ref.is_none()
                && f.config_map_key_ref.as_ref().is_some_and(|r| {
                    r.name == configmap && r.key == key && r.optional != Some(true)
                })
        })
}

/// Every container of the pod, init containers too: whether it is the target container, and
/// what kind it is, in words (for refusals).
pub(super) fn every_container(
    spec: &PodSpec,
    target: usize,
) -> impl Iterator<Item = (bool, &'static str, &Container)> {
    spec.containers
        .iter()
        .enumerate()
        .map(move |(i, c)| (i == target, "container", c))
        .chain(
            spec.init_containers
                .iter()
                .flatten()
                .map(|c| (false, "init container", c)),
        )
}

/// A gpu-share pod never sets `NVIDIA_VISIBLE_DEVICES` itself: the device plugin or gpu-share
/// chooses the GPU. Only what a previous pass of the webhook wrote for a pod in per-GPU form
/// (`configmap`) stays. `Some`: why the pod is refused, in words.
pub fn set_by_user(spec: &PodSpec, target: usize, configmap: Option<&str>) -> Option<String> {
    for (is_target, kind, c) in every_container(spec, target) {
        for e in c.env.iter().flatten().filter(|e| e.name == VISIBLE_DEVICES) {
            let ours = match configmap {
                Some(cm) if is_target => is_ours_target(e, cm),
                Some(_) => e.value.as_deref() == Some(NO_DEVICES) && e.value_from.is_none(),
                None => false,
            };
            if !ours {
                return Some(format!(
                    "gpu-share: {kind} {:?} sets {VISIBLE_DEVICES}, which chooses GPUs around the scheduler's \
                     accounting; gpu-share (or the device plugin) sets it for the GPU the pod was given: remove it",
                    c.name
                ));
            }
        }
    }
    None
}

/// The per-GPU form's patch: the target container reads `NVIDIA_VISIBLE_DEVICES` from the
/// ConfigMap's key `key` (and, for an MPS share, `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`) and gets
/// `NVIDIA_DRIVER_CAPABILITIES` unless it sets its own; every other container, init containers
/// included, sees no GPU; the annotation names the ConfigMap.
pub(super) fn patch(
    b: &mut PatchBuilder,
    spec: &PodSpec,
    target: usize,
    configmap: &str,
    key: &str,
    mps: bool,
    annotations: &BTreeMap<String, String>,
) {
    let containers = spec
        .containers
        .iter()
        .enumerate()
        .map(|(i, c)| ("containers", i, c, i == target))
        .chain(
            spec.init_containers
                .iter()
                .flatten()
                .enumerate()
                .map(|(i, c)| ("initContainers", i, c, false)),
        );
    for (field, i, c, is_target) in containers {
        let index = i.to_string();
        let cpath = ["spec", field, index.as_str()];
        let mut add = vec![];
        if !has(c, VISIBLE_DEVICES) {
            add.push(if is_target {
                from_configmap(configmap, key)
            } else {
                json!({"name": VISIBLE_DEVICES, "value": NO_DEVICES})
            });
        }
        if is_target && mps && !has(c, MPS_PINNED_KEY) {
            add.push(json!({
                "name": MPS_PINNED_KEY,
                "valueFrom": {"configMapKeyRef": {"name": configmap, "key": MPS_PINNED_KEY, "optional": false}}
            }));
        }
        if is_target && !has(c, DRIVER_CAPABILITIES.0) {
            add.push(json!({"name": DRIVER_CAPABILITIES.0, "value": DRIVER_CAPABILITIES.1}));
        }
        b.append(&[&cpath[..], &["env"]].concat(), c.env.is_some(), add);
    }
    if annotations.get(ANNOTATION_DEVICES).map(String::as_str) != Some(configmap) {
        b.add(
            &["metadata", "annotations", ANNOTATION_DEVICES],
            json!(configmap),
        );
    }
}

fn has(c: &Container, name: &str) -> bool {
    c.env.iter().flatten().any(|e| e.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::plan::{Decision, Denial, DenialReason, Facts, RuntimeClassState, plan};
    use crate::policy::Policy;

    fn per_gpu_policy() -> Policy {
        Policy::load("perGpu:\n  timeslice: true\n", "p.yaml")
            .unwrap()
            .policy
    }

    fn facts(uid: &str) -> Facts<'_> {
        Facts {
            namespace: "ml",
            namespace_labels: None,
            runtime_class: RuntimeClassState::Exists,
            request_uid: uid,
            mig_offers: None,
            legacy_runtime_class: RuntimeClassState::Unknown,
        }
    }

    fn pod(request: &str, spec: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"generateName": "p-", "namespace": "ml", "annotations": {"gpu-share": request}},
               "spec": spec})
    }

    fn two_containers() -> Value {
        json!({
            "initContainers": [{"name": "fetch", "image": "x"}],
            "containers": [
                {"name": "server", "image": "cuda", "env": [{"name": "A", "value": "1"}]},
                {"name": "sidecar", "image": "cuda"}
            ]
        })
    }

    fn run(policy: &Policy, obj: &Value, uid: &str) -> Result<Value, Denial> {
        match plan(obj, policy, &policy.mig_table(), &facts(uid)) {
            Decision::Mutate(m) => {
                let mut doc = obj.clone();
                json_patch::patch(&mut doc, &m.patch).expect("patch applies");
                Ok(doc)
            }
            Decision::Deny(d) => Err(d),
            Decision::NotRequested => panic!("not requested"),
        }
    }

    fn env<'a>(doc: &'a Value, path: &str, name: &str) -> Option<&'a Value> {
        doc.pointer(path)?
            .as_array()?
            .iter()
            .find(|e| e["name"] == name)
    }

    /// A timeslice pod in per-GPU form asks the device plugin for nothing; its container reads
    /// the GPU from the ConfigMap key named at admission, every other container sees none, and
    /// a second pass (the API server's reinvocation) adds nothing.
    #[test]
    fn the_per_gpu_form_points_the_container_at_a_configmap_key() {
        let p = per_gpu_policy();
        let uid = "0B5E7A4C-2d1f-4e8a-9c3b-5a6d7e8f9012";
        let doc = run(&p, &pod("timeslice-30", two_containers()), uid).unwrap();
        let cm = "gpu-share-devices-0b5e7a4c-2d1f-4e8a-9c3b-5a6d7e8f9012";
        assert_eq!(doc["metadata"]["annotations"][ANNOTATION_DEVICES], cm);
        let main = "/spec/containers/0/env";
        assert_eq!(
            env(&doc, main, VISIBLE_DEVICES).unwrap()["valueFrom"],
            json!({"configMapKeyRef": {"name": cm, "key": DEVICES_KEY, "optional": false}})
        );
        assert_eq!(
            env(&doc, main, DRIVER_CAPABILITIES.0).unwrap()["value"],
            DRIVER_CAPABILITIES.1
        );
        assert_eq!(env(&doc, main, "A").unwrap()["value"], "1");
        for other in ["/spec/containers/1/env", "/spec/initContainers/0/env"] {
            assert_eq!(
                env(&doc, other, VISIBLE_DEVICES).unwrap()["value"],
                NO_DEVICES
            );
        }
        // No device: only the unit that brings the pod to the extender, and its size.
        assert_eq!(
            doc["spec"]["containers"][0]["resources"]["limits"],
            json!({crate::request::RESOURCE_SHARE: "1", crate::request::RESOURCE_GPU_MILLI: "300"})
        );
        assert!(
            doc["spec"]["containers"][1]
                .pointer("/resources/limits")
                .is_none()
        );
        assert_eq!(doc["spec"]["runtimeClassName"], "nvidia");
        let terms = &doc["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"];
        assert!(terms.to_string().contains("NotIn"), "plain nodes: {terms}");
        assert!(!terms.to_string().contains("time-sharing"), "{terms}");
        // Again, under another request's uid: the name stays, nothing is added.
        let again = run(&p, &doc, "another").unwrap();
        assert_eq!(again, doc);
        // The ledger reads the pod as a share in per-GPU form.
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(doc).unwrap();
        let d = crate::ledger::demand_of_pod(&pod).unwrap().unwrap();
        assert!(d.pointed() && d.resources.is_empty(), "{d:?}");
    }

    /// An MPS pod in per-GPU form: its GPU and its pinned limit from keys of its ConfigMap (not
    /// optional: kubelet starts no container without them), its threads and the driver's limits
    /// as literals, the policy's user, the policy's runtime (CDI names; not `nvidia-legacy`),
    /// no hostIPC (the CDI device brings the pipe). Another user, or a user-set pinned limit, is
    /// refused in words; a second pass adds nothing.
    #[test]
    fn the_per_gpu_mps_form_reads_its_gpu_and_limit_from_keys_and_runs_as_the_policys_user() {
        let p = Policy::load("perGpu:\n  mps: true\nmps:\n  runAsUser: 1000\n", "p.yaml")
            .unwrap()
            .policy;
        let mut obj = pod("mps-25", two_containers());
        obj["metadata"]["annotations"]["gpu-share/memory"] = json!("20Gi");
        let mut f = facts("u-1");
        f.legacy_runtime_class = RuntimeClassState::Exists;
        let doc = match plan(&obj, &p, &p.mig_table(), &f) {
            Decision::Mutate(m) => {
                let mut d = obj.clone();
                json_patch::patch(&mut d, &m.patch).unwrap();
                d
            }
            other => panic!("{other:?}"),
        };
        let cm = "gpu-share-devices-u-1";
        let main = "/spec/containers/0/env";
        let key = |k: &str| json!({"configMapKeyRef": {"name": cm, "key": k, "optional": false}});
        assert_eq!(
            env(&doc, main, VISIBLE_DEVICES).unwrap()["valueFrom"],
            key(DEVICES_KEY)
        );
        assert_eq!(
            env(&doc, main, MPS_PINNED_KEY).unwrap()["valueFrom"],
            key(MPS_PINNED_KEY)
        );
        let literal = |n: &str| env(&doc, main, n).and_then(|e| e["value"].as_str());
        assert_eq!(literal("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), Some("25"));
        assert_eq!(literal("NVIDIA_GPU_MEMORY_LIMIT"), Some("20480"));
        assert_eq!(literal("NVIDIA_GPU_MEMORY_REQUEST"), Some("20480"));
        assert_eq!(
            env(&doc, "/spec/containers/1/env", VISIBLE_DEVICES).unwrap()["value"],
            NO_DEVICES
        );
        assert_eq!(doc["spec"]["runtimeClassName"], "nvidia");
        assert!(doc["spec"].get("hostIPC").is_none(), "{}", doc["spec"]);
        assert_eq!(doc["spec"]["securityContext"]["runAsUser"], 1000);
        assert_eq!(
            doc["spec"]["containers"][0]["resources"]["limits"],
            json!({crate::request::RESOURCE_SHARE: "1", crate::request::RESOURCE_GPU_MILLI: "250"})
        );
        assert_eq!(run(&p, &doc, "another").unwrap(), doc);
        let pod_ = serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(doc.clone()).unwrap();
        let d = crate::ledger::demand_of_pod(&pod_).unwrap().unwrap();
        assert!(
            d.pointed() && matches!(d.gpu, crate::packing::GpuDemand::Mps { milli: 250, .. }),
            "{d:?}"
        );
        // Another user.
        let mut other = obj.clone();
        other["spec"]["securityContext"] = json!({"runAsUser": 2000});
        let denied = run(&p, &other, "u-2").unwrap_err();
        assert_eq!(denied.reason, DenialReason::MpsUserDiffers);
        assert!(
            denied.message.contains("serves user 1000"),
            "{}",
            denied.message
        );
        // A pinned limit of the user's own, even from the same ConfigMap's key in another
        // container, or optional in the target.
        let mut own = doc.clone();
        own["spec"]["containers"][0]["env"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .filter(|e| e["name"] == MPS_PINNED_KEY)
            .for_each(|e| e["valueFrom"]["configMapKeyRef"]["optional"] = json!(true));
        assert_eq!(
            run(&p, &own, "u-3").unwrap_err().reason,
            DenialReason::LimitsSet
        );
        // Without perGpu.mps' user the policy does not load.
        let e = Policy::load("perGpu:\n  mps: true\n", "p.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("perGpu.mps needs mps.runAsUser"), "{e}");
    }

    /// A container without `env` in per-GPU form gets both the workload variables and its
    /// devices: two steps add to the same new array, and the second appends to the first's (it
    /// replaced it: GPU_SHARE_CLASS and GPU_SHARE_FRACTION were lost).
    #[test]
    fn a_container_without_env_keeps_every_variable_in_per_gpu_form() {
        let p = per_gpu_policy();
        let spec = json!({"containers": [{"name": "main", "image": "cuda"}]});
        let doc = run(&p, &pod("timeslice-30", spec), "u").unwrap();
        let path = "/spec/containers/0/env";
        for name in [
            "GPU_SHARE_CLASS",
            "GPU_SHARE_FRACTION",
            VISIBLE_DEVICES,
            DRIVER_CAPABILITIES.0,
        ] {
            assert!(
                env(&doc, path, name).is_some(),
                "{name} missing: {}",
                doc["spec"]
            );
        }
    }

    /// Where the GPU Operator turned CDI on (the RuntimeClass `nvidia-legacy` exists), a pod in
    /// per-GPU form runs under the legacy runtime, which reads a bare UUID in
    /// NVIDIA_VISIBLE_DEVICES (the `nvidia` runtime, in CDI mode, fails to create the container);
    /// pods of the device plugin's forms keep the policy's class, and so does a pod that names
    /// its own. The webhook looks the class up only for pods in per-GPU form.
    #[test]
    fn under_cdi_the_per_gpu_form_runs_under_the_legacy_runtime() {
        let with_legacy = |state| Facts {
            legacy_runtime_class: state,
            ..facts("u")
        };
        let planned = |policy: &Policy, obj: &Value, state| match plan(
            obj,
            policy,
            &policy.mig_table(),
            &with_legacy(state),
        ) {
            Decision::Mutate(m) => {
                let mut doc = obj.clone();
                json_patch::patch(&mut doc, &m.patch).unwrap();
                doc
            }
            other => panic!("{other:?}"),
        };
        let p = per_gpu_policy();
        let share = pod("timeslice-30", two_containers());
        let doc = planned(&p, &share, RuntimeClassState::Exists);
        assert_eq!(doc["spec"]["runtimeClassName"], LEGACY_RUNTIME_CLASS);
        for state in [RuntimeClassState::Missing, RuntimeClassState::Unknown] {
            let doc = planned(&p, &share, state);
            assert_eq!(doc["spec"]["runtimeClassName"], "nvidia", "{state:?}");
        }
        let exclusive = pod("exclusive", two_containers());
        let doc = planned(&p, &exclusive, RuntimeClassState::Exists);
        assert_eq!(doc["spec"]["runtimeClassName"], "nvidia");
        let mut own = two_containers();
        own["runtimeClassName"] = json!("kata-nvidia");
        let doc = planned(
            &p,
            &pod("timeslice-30", own.clone()),
            RuntimeClassState::Exists,
        );
        assert_eq!(doc["spec"]["runtimeClassName"], "kata-nvidia");
        let needs = |obj: &Value, policy: &Policy| crate::admission::plan::needs(obj, policy);
        assert!(needs(&share, &p).legacy_runtime_class);
        assert!(!needs(&exclusive, &p).legacy_runtime_class);
        assert!(!needs(&pod("timeslice-30", own), &p).legacy_runtime_class);
        assert!(!needs(&share, &Policy::default_policy()).legacy_runtime_class);
    }

    /// With the policy's `perGpu.timesliceCdi`, a time-sliced pod in per-GPU form takes its GPU's
    /// CDI device: its container reads the ConfigMap's key `CDI_DEVICE`, and it runs under the
    /// policy's class (which resolves CDI names) even where `nvidia-legacy` exists; the class is
    /// not looked up. An MPS pod is as before. A second pass changes nothing, under either
    /// setting.
    #[test]
    fn with_timeslice_cdi_a_time_sliced_share_reads_its_gpus_cdi_device_under_the_policys_class() {
        let p = Policy::load("perGpu:\n  timeslice: true\n  mps: true\n  timesliceCdi: true\nmps:\n  runAsUser: 1000\n", "p.yaml")
            .unwrap()
            .policy;
        let with_legacy = Facts {
            legacy_runtime_class: RuntimeClassState::Exists,
            ..facts("u")
        };
        let patched = |policy: &Policy, obj: &Value| match plan(
            obj,
            policy,
            &policy.mig_table(),
            &with_legacy,
        ) {
            Decision::Mutate(m) => {
                let mut doc = obj.clone();
                json_patch::patch(&mut doc, &m.patch).unwrap();
                doc
            }
            other => panic!("{other:?}"),
        };
        let share = pod("timeslice-30", two_containers());
        let doc = patched(&p, &share);
        assert_eq!(doc["spec"]["runtimeClassName"], "nvidia");
        let target = "/spec/containers/0/env";
        let visible = env(&doc, target, VISIBLE_DEVICES).unwrap();
        assert_eq!(
            visible["valueFrom"]["configMapKeyRef"]["key"],
            CDI_DEVICE_KEY
        );
        assert_eq!(visible["valueFrom"]["configMapKeyRef"]["optional"], false);
        assert_eq!(doc["spec"]["containers"][1]["env"][0]["value"], NO_DEVICES);
        // The extender reads the form from the env, as kubelet resolves it.
        let typed: k8s_openapi::api::core::v1::PodSpec =
            serde_json::from_value(doc["spec"].clone()).unwrap();
        let d = crate::ledger::devices_configmap(&typed).unwrap();
        assert!(d.cdi_device && d.configmap.starts_with(CONFIGMAP_PREFIX));
        assert!(!crate::admission::plan::needs(&share, &p).legacy_runtime_class);
        // A second pass, under either setting, changes nothing of it.
        for policy in [&p, &per_gpu_policy()] {
            assert_eq!(run(policy, &doc, "u").unwrap(), doc);
        }
        // An MPS share still reads its MPS device from NVIDIA_VISIBLE_DEVICES's key.
        let doc = patched(&p, &pod("mps-25", two_containers()));
        let visible = env(&doc, target, VISIBLE_DEVICES).unwrap();
        assert_eq!(visible["valueFrom"]["configMapKeyRef"]["key"], DEVICES_KEY);
        // Without the setting, the bare UUID under the legacy class.
        let doc = patched(&per_gpu_policy(), &share);
        assert_eq!(doc["spec"]["runtimeClassName"], LEGACY_RUNTIME_CLASS);
        let visible = env(&doc, target, VISIBLE_DEVICES).unwrap();
        assert_eq!(visible["valueFrom"]["configMapKeyRef"]["key"], DEVICES_KEY);
    }

    /// A gpu-share pod never sets NVIDIA_VISIBLE_DEVICES itself, in either form, and a pod in
    /// per-GPU form asks the device plugin for nothing.
    #[test]
    fn a_user_set_visible_devices_is_refused_in_words() {
        let set = |value: Value| {
            let mut spec = two_containers();
            spec["containers"][1]["env"] = json!([{"name": VISIBLE_DEVICES, "value": value}]);
            spec
        };
        for policy in [per_gpu_policy(), Policy::default_policy()] {
            for (request, spec) in [
                ("timeslice-30", set(json!("all"))),
                ("exclusive", set(json!("GPU-1234"))),
                ("mps-50", set(json!("0"))),
            ] {
                let d = run(&policy, &pod(request, spec), "u").unwrap_err();
                assert_eq!(d.reason, DenialReason::VisibleDevicesSet);
                assert!(
                    d.message.contains("\"sidecar\"") && d.message.contains(VISIBLE_DEVICES),
                    "{}",
                    d.message
                );
            }
        }
        // What the webhook writes for one pod does not pass for another: a pod pointing at a
        // ConfigMap other than its own annotation names.
        let p = per_gpu_policy();
        let doc = run(&p, &pod("timeslice-30", two_containers()), "u-1").unwrap();
        let mut forged = doc.clone();
        for e in forged["spec"]["containers"][0]["env"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .filter(|e| e["name"] == VISIBLE_DEVICES)
        {
            e["valueFrom"]["configMapKeyRef"]["name"] = json!("gpu-share-devices-someone-else");
        }
        assert_eq!(
            run(&p, &forged, "u-2").unwrap_err().reason,
            DenialReason::VisibleDevicesSet
        );
        // Without per-GPU sharing, the same pod's env is refused too.
        assert_eq!(
            run(&Policy::default_policy(), &doc, "u-3")
                .unwrap_err()
                .reason,
            DenialReason::VisibleDevicesSet
        );
        // Limits on a pod in per-GPU form.
        let mut spec = two_containers();
        spec["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": "1"}});
        let d = run(&p, &pod("timeslice-30", spec), "u").unwrap_err();
        assert_eq!(d.reason, DenialReason::ConflictingLimits);
        assert!(
            d.message.contains("shared per GPU (policy perGpu)"),
            "{}",
            d.message
        );
        // Other classes keep the device plugin's form.
        let doc = run(&p, &pod("exclusive", two_containers()), "u").unwrap();
        assert_eq!(
            doc["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
            "1"
        );
        assert!(env(&doc, "/spec/containers/1/env", VISIBLE_DEVICES).is_none());
    }

    #[test]
    fn configmap_names_are_valid_and_one_per_request() {
        let none = BTreeMap::new();
        let a = configmap_name(&none, "5f0c9a0e-1111-2222-3333-444455556666");
        assert_eq!(a, "gpu-share-devices-5f0c9a0e-1111-2222-3333-444455556666");
        for odd in ["", "---", "a/b", &"x".repeat(300), "Ünï"] {
            let n = configmap_name(&none, odd);
            assert!(is_configmap_name(&n), "{odd:?} gave {n:?}");
            assert!(n.len() <= 253);
        }
        assert_ne!(configmap_name(&none, "a/b"), configmap_name(&none, "a/c"));
        // A name the annotation already gives is kept; an invalid one is not.
        let kept: BTreeMap<String, String> = [(ANNOTATION_DEVICES.to_string(), a.clone())].into();
        assert_eq!(configmap_name(&kept, "other"), a);
        let bad: BTreeMap<String, String> = [(
            ANNOTATION_DEVICES.to_string(),
            "kube-root-ca.crt".to_string(),
        )]
        .into();
        assert_eq!(
            configmap_name(&bad, "5f0c9a0e"),
            "gpu-share-devices-5f0c9a0e"
        );
    }
}

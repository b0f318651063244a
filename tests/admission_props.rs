//! Property test: for random pods and valid annotations, the patch always applies, the result is
//! a valid Pod, the written `gpu-share.io/request` reads back as the same request, and a second
//! pass adds nothing.

use gpu_share::admission::plan::{Decision, Facts, RuntimeClassState, plan};
use gpu_share::policy::Policy;
use k8s_openapi::api::core::v1::Pod;
use proptest::prelude::*;
use serde_json::{Value, json};

fn class() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "1g.10gb",
            "1g.10gb+me",
            "3g.40gb",
            "1g.12gb",
            "1g.18gb",
            "2g.12gb",
            "7g.80gb"
        ])
        .prop_map(|p| format!("mig-{p}")),
        (1u8..=100).prop_map(|p| format!("mps-{p}")),
        (1u8..=100).prop_map(|p| format!("timeslice-{p}")),
        Just("exclusive".to_string()),
        (1u32..=8).prop_map(|n| format!("exclusive-{n}")),
    ]
}

fn container(i: usize, with_env: bool, with_limits: Option<bool>) -> Value {
    let mut c = json!({"name": format!("c{i}"), "image": "img"});
    if with_env {
        c["env"] = json!([{"name": "X", "value": "1"}]);
    }
    match with_limits {
        None => {}
        Some(false) => c["resources"] = json!({}),
        Some(true) => c["resources"] = json!({"limits": {"cpu": "1"}, "requests": {"cpu": "1"}}),
    }
    c
}

prop_compose! {
    fn pod()(
        class in class(),
        n in 1usize..4,
        envs in prop::collection::vec(any::<bool>(), 3),
        limits in prop::collection::vec(prop::option::of(any::<bool>()), 3),
        target in prop::option::of(0usize..3),
        tolerations in 0usize..3,
        affinity in 0usize..4,
        scheduler in prop::option::of(prop::sample::select(vec!["default-scheduler", "gpu-share-scheduler"])),
        memory in prop::option::of(1u32..80),
        count in prop::option::of(1u32..4),
        init in any::<bool>(),
        host_ipc in prop::option::of(any::<bool>()),
    ) -> Value {
        let mut annotations = json!({"gpu-share": class.clone()});
        if (class.starts_with("mps-") || class.starts_with("timeslice-"))
            && let Some(m) = memory { annotations["gpu-share/memory"] = json!(format!("{m}Gi")); }
        if class.starts_with("mig-")
            && let Some(c) = count { annotations["gpu-share/count"] = json!(c.to_string()); }
        if let Some(t) = target.filter(|t| *t < n) { annotations["gpu-share/container"] = json!(format!("c{t}")); }
        let containers: Vec<Value> = (0..n).map(|i| container(i, envs[i], limits[i])).collect();
        let mut spec = json!({"containers": containers});
        if tolerations > 0 {
            let all = [json!({"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}),
                       json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})];
            spec["tolerations"] = json!(all[..tolerations].to_vec());
        }
        match affinity {
            1 => spec["affinity"] = json!({}),
            2 => spec["affinity"] = json!({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {"matchExpressions": [{"key": "a", "operator": "Exists"}]}}]}}),
            3 => spec["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}]}}}),
            _ => {}
        }
        if let Some(s) = scheduler { spec["schedulerName"] = json!(s); }
        if init { spec["initContainers"] = json!([{"name": "init", "image": "i"}]); }
        if let Some(h) = host_ipc { spec["hostIPC"] = json!(h); }
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "p-", "namespace": "ns", "annotations": annotations}, "spec": spec})
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    #[test]
    fn patch_applies_and_second_pass_adds_nothing(obj in pod()) {
        let policy = Policy::default_policy();
        let mig = policy.mig_table();
        let facts = Facts { namespace: "ns", namespace_labels: None, runtime_class: RuntimeClassState::Exists, request_uid: "u", mig_offers: None, legacy_runtime_class: RuntimeClassState::Unknown };
        let Decision::Mutate(first) = plan(&obj, &policy, &mig, &facts) else {
            return Err(TestCaseError::fail(format!("not mutated: {obj}")));
        };
        let mut doc = obj.clone();
        json_patch::patch(&mut doc, &first.patch).map_err(|e| TestCaseError::fail(format!("{e}: {obj}")))?;
        let pod: Pod = serde_json::from_value(doc.clone()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let spec = pod.spec.unwrap();
        let gpu_limits = spec.containers.iter().filter(|c| c.resources.as_ref().and_then(|r| r.limits.as_ref()).is_some_and(|l| l.keys().any(|k| k.starts_with("nvidia.com/")))).count();
        prop_assert_eq!(gpu_limits, 1, "exactly one container gets the GPU");
        prop_assert_eq!(&doc["spec"]["initContainers"], &obj["spec"]["initContainers"]);
        // The scheduler reads the written request back within the same bounds.
        let written = doc["metadata"]["annotations"][gpu_share::request::ANNOTATION_REQUEST].as_str().unwrap_or_default();
        prop_assert_eq!(gpu_share::request::GpuRequest::parse_normalized(written), Ok(first.request.clone()));
        let Decision::Mutate(second) = plan(&doc, &policy, &mig, &facts) else {
            return Err(TestCaseError::fail("second pass not allowed".to_string()));
        };
        prop_assert!(second.patch.is_empty(), "second pass: {:?}", second.patch);
    }
}

//! `/mutate` driven through the router with apiserver-shaped AdmissionReviews.

mod common;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

async fn review(name: &str) -> (Value, Value) {
    let review = fixture(&format!("admission/{name}"));
    let (status, response) =
        post(dev_state(), "/mutate", serde_json::to_vec(&review).unwrap()).await;
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(response["kind"], "AdmissionReview");
    assert_eq!(
        response["response"]["uid"], review["request"]["uid"],
        "uid must be echoed"
    );
    (review, response)
}

fn env(pod: &Pod, container: usize, name: &str) -> Option<String> {
    let c = &pod.spec.as_ref().unwrap().containers[container];
    c.env
        .as_ref()?
        .iter()
        .find(|e| e.name == name)
        .and_then(|e| e.value.clone())
}

fn limit(pod: &Pod, container: usize, name: &str) -> Option<String> {
    let c = &pod.spec.as_ref().unwrap().containers[container];
    c.resources
        .as_ref()?
        .limits
        .as_ref()?
        .get(name)
        .map(|q| q.0.clone())
}

fn tolerations(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .unwrap()
        .tolerations
        .iter()
        .flatten()
        .map(|t| t.key.clone().unwrap_or_default())
        .collect()
}

/// A second pass over the patched pod (reinvocation) must add nothing.
async fn assert_idempotent(review: &Value, patched: &Value) {
    let mut again = review.clone();
    again["request"]["object"] = patched.clone();
    let (status, response) =
        post(dev_state(), "/mutate", serde_json::to_vec(&again).unwrap()).await;
    assert_eq!(status, 200);
    assert_eq!(response["response"]["allowed"], true);
    assert!(
        response["response"].get("patch").is_none(),
        "second pass patched again: {response}"
    );
}

#[tokio::test]
async fn mig_mixed_gets_profile_resource_and_keeps_default_tolerations() {
    let (review, response) = review("mig-mixed.json").await;
    assert_eq!(response["response"]["allowed"], true);
    let (doc, pod) = apply(&review, &response);
    assert_eq!(
        limit(&pod, 0, "nvidia.com/mig-1g.10gb").as_deref(),
        Some("1")
    );
    assert_eq!(
        tolerations(&pod),
        [
            "node.kubernetes.io/not-ready",
            "node.kubernetes.io/unreachable",
            "nvidia.com/gpu"
        ],
        "existing tolerations are appended to"
    );
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.scheduler_name.as_deref(), Some("gpu-share-scheduler"));
    assert_eq!(
        spec.runtime_class_name, None,
        "no cluster: RuntimeClass not verified, so not set"
    );
    assert_eq!(
        env(&pod, 0, "GPU_SHARE_CLASS").as_deref(),
        Some("mig-1g.10gb")
    );
    assert_eq!(
        pod.metadata.annotations.as_ref().unwrap()["gpu-share.io/request"],
        "mig-1g.10gb"
    );
    assert_eq!(
        spec.volumes.as_ref().unwrap().len(),
        1,
        "service-account volume untouched"
    );
    let warnings = response["response"]["warnings"].as_array().unwrap();
    assert!(
        warnings
            .iter()
            .any(|w| w.as_str().unwrap().contains("RuntimeClass"))
    );
    assert_idempotent(&review, &doc).await;
}

#[tokio::test]
async fn mps_targets_the_named_container_and_appends_env() {
    let (review, response) = review("mps-memory-sidecar.json").await;
    let (doc, pod) = apply(&review, &response);
    assert_eq!(
        limit(&pod, 0, "nvidia.com/gpu"),
        None,
        "the sidecar gets nothing"
    );
    assert_eq!(limit(&pod, 1, "nvidia.com/gpu").as_deref(), Some("1"));
    assert_eq!(
        limit(&pod, 1, "cpu").as_deref(),
        Some("4"),
        "existing limits kept"
    );
    assert_eq!(
        env(&pod, 1, "HF_HOME").as_deref(),
        Some("/cache"),
        "existing env kept first"
    );
    assert_eq!(
        env(&pod, 1, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE").as_deref(),
        Some("25")
    );
    assert_eq!(
        env(&pod, 1, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT").as_deref(),
        Some("0=12288M")
    );
    assert_eq!(
        env(&pod, 1, "GPU_SHARE_MEMORY_MIB").as_deref(),
        Some("12288")
    );
    assert_eq!(env(&pod, 1, "GPU_SHARE_FRACTION").as_deref(), Some("0.25"));
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.host_ipc, Some(true));
    let terms = &spec
        .affinity
        .as_ref()
        .unwrap()
        .node_affinity
        .as_ref()
        .unwrap()
        .required_during_scheduling_ignored_during_execution
        .as_ref()
        .unwrap()
        .node_selector_terms;
    let e = &terms[0].match_expressions.as_ref().unwrap()[0];
    assert_eq!(
        (
            e.key.as_str(),
            e.operator.as_str(),
            e.values.clone().unwrap()
        ),
        (
            "nvidia.com/gpu.sharing-strategy",
            "In",
            vec!["mps".to_string()]
        )
    );
    assert_eq!(
        pod.metadata.annotations.as_ref().unwrap()["gpu-share.io/request"],
        "mps-25,memory=12288Mi"
    );
    assert!(
        response["response"]["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().contains("hostIPC"))
    );
    assert_idempotent(&review, &doc).await;
}

#[tokio::test]
async fn timeslice_is_anded_into_each_affinity_term() {
    // Each of the pod's 2 terms is crossed with the 2 kinds of time-shared node (GFD's
    // time-slicing, GKE's time-sharing): 4 terms, each keeping the pod's own requirement, so the
    // pod's constraint is never weakened.
    let (review, response) = review("timeslice-affinity.json").await;
    let (doc, pod) = apply(&review, &response);
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.host_ipc, None);
    let terms = &spec
        .affinity
        .as_ref()
        .unwrap()
        .node_affinity
        .as_ref()
        .unwrap()
        .required_during_scheduling_ignored_during_execution
        .as_ref()
        .unwrap()
        .node_selector_terms;
    assert_eq!(terms.len(), 4);
    let own = [
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/zone",
        "node.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
    ];
    for (i, t) in terms.iter().enumerate() {
        let exprs = t.match_expressions.as_ref().unwrap();
        assert_eq!(exprs.len(), 2);
        assert_eq!(exprs[0].key, own[i], "term {i} keeps the pod's requirement");
        let (key, values) = if i % 2 == 0 {
            ("nvidia.com/gpu.sharing-strategy", vec!["time-slicing"])
        } else {
            (
                "cloud.google.com/gke-gpu-sharing-strategy",
                vec!["time-sharing", "TIME_SHARING"],
            )
        };
        assert_eq!(exprs[1].key, key);
        assert_eq!(exprs[1].values.as_ref().unwrap(), &values);
    }
    assert_eq!(limit(&pod, 0, "nvidia.com/gpu").as_deref(), Some("1"));
    assert_eq!(env(&pod, 0, "GPU_SHARE_FRACTION").as_deref(), Some("0.5"));
    assert_idempotent(&review, &doc).await;
}

#[tokio::test]
async fn exclusive_leaves_init_containers_alone() {
    let (review, response) = review("exclusive-init.json").await;
    let (doc, pod) = apply(&review, &response);
    assert_eq!(limit(&pod, 0, "nvidia.com/gpu").as_deref(), Some("2"));
    assert_eq!(
        doc["spec"]["initContainers"],
        review["request"]["object"]["spec"]["initContainers"]
    );
    let spec = pod.spec.as_ref().unwrap();
    let exprs = spec
        .affinity
        .as_ref()
        .unwrap()
        .node_affinity
        .as_ref()
        .unwrap()
        .required_during_scheduling_ignored_during_execution
        .as_ref()
        .unwrap()
        .node_selector_terms[0]
        .match_expressions
        .clone()
        .unwrap();
    assert_eq!(
        (exprs[0].operator.as_str(), exprs[0].values.clone().unwrap()),
        ("NotIn", vec!["mps".to_string(), "time-slicing".to_string()])
    );
    assert_eq!(
        (
            exprs[2].key.as_str(),
            exprs[2].operator.as_str(),
            exprs[2].values.as_ref()
        ),
        (
            "cloud.google.com/gke-gpu-sharing-strategy",
            "DoesNotExist",
            None
        )
    );
    assert_eq!(
        (exprs[1].key.as_str(), exprs[1].operator.as_str()),
        ("nvidia.com/gpu.slices.gi", "DoesNotExist")
    );
    assert_eq!(pod.metadata.annotations.as_ref().unwrap()["team"], "nlp");
    assert_idempotent(&review, &doc).await;
}

#[tokio::test]
async fn unknown_profile_is_denied_with_a_suggestion() {
    let (_, response) = review("bad-profile.json").await;
    let r = &response["response"];
    assert_eq!(r["allowed"], false);
    assert_eq!(r["status"]["code"], 403);
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .contains("did you mean 7g.80gb"),
        "{r}"
    );
    assert!(r.get("patch").is_none() && r.get("patchType").is_none());
}

#[tokio::test]
async fn pods_without_the_annotation_pass_untouched() {
    let (_, response) = review("no-annotation.json").await;
    assert_eq!(response["response"]["allowed"], true);
    assert!(response["response"].get("patch").is_none());
    assert!(response["response"].get("warnings").is_none());
}

#[tokio::test]
async fn a_hand_written_request_annotation_is_denied() {
    let mut r = fixture("admission/mig-mixed.json");
    r["request"]["object"]["metadata"]["annotations"] =
        json!({"gpu-share.io/request": "timeslice-1"});
    let (status, response) = post(dev_state(), "/mutate", serde_json::to_vec(&r).unwrap()).await;
    assert_eq!(status, 200, "{response}");
    let resp = &response["response"];
    assert_eq!(resp["allowed"], false, "{resp}");
    assert_eq!(resp["status"]["code"], 403);
    assert!(
        resp["status"]["message"]
            .as_str()
            .unwrap()
            .contains("written by the gpu-share webhook"),
        "{resp}"
    );
    assert_eq!(
        resp["auditAnnotations"]["denied"],
        "request_without_gpu_share"
    );
}

#[tokio::test]
async fn dry_run_gets_the_same_answer() {
    let (review, response) = review("dry-run.json").await;
    let mut wet = review.clone();
    wet["request"]["dryRun"] = json!(false);
    let (_, wet_response) = post(dev_state(), "/mutate", serde_json::to_vec(&wet).unwrap()).await;
    assert_eq!(response, wet_response);
    let (_, pod) = apply(&review, &response);
    assert_eq!(limit(&pod, 0, "nvidia.com/gpu").as_deref(), Some("1"));
}

#[tokio::test]
async fn non_create_and_other_kinds_are_allowed() {
    let mut r = fixture("admission/mig-mixed.json");
    r["request"]["operation"] = json!("UPDATE");
    r["request"]["oldObject"] = r["request"]["object"].clone();
    let (status, response) = post(dev_state(), "/mutate", serde_json::to_vec(&r).unwrap()).await;
    assert_eq!(status, 200);
    assert_eq!(response["response"]["allowed"], true);
    assert!(response["response"].get("patch").is_none());
    let mut r = fixture("admission/mig-mixed.json");
    r["request"]["subResource"] = json!("status");
    let (_, response) = post(dev_state(), "/mutate", serde_json::to_vec(&r).unwrap()).await;
    assert!(response["response"].get("patch").is_none());
}

#[tokio::test]
async fn malformed_bodies_get_400_with_a_json_error() {
    for body in [
        &b"not json"[..],
        b"{}",
        b"[]",
        br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1"}"#,
        b"\xff\xfe",
    ] {
        let (status, response) = post(dev_state(), "/mutate", body.to_vec()).await;
        assert_eq!(status, 400, "{}", String::from_utf8_lossy(body));
        assert!(
            response["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{response}"
        );
    }
}

#[tokio::test]
async fn bodies_over_the_limit_get_413() {
    let big = vec![b' '; gpu_share::server::MUTATE_BODY_LIMIT + 1];
    let (status, _) = post(dev_state(), "/mutate", big).await;
    assert_eq!(status, 413);
}

#[tokio::test]
async fn garbage_inside_a_well_formed_review_never_panics() {
    let base = fixture("admission/mig-mixed.json");
    // For a denial: the reason and a fragment of the message.
    type Denied = Option<(&'static str, &'static str)>;
    // (object, allowed, denial)
    let cases: [(Value, bool, Denied); 9] = [
        // No object: nothing to mutate.
        (json!(null), true, None),
        // Not an object: no annotations, so not gpu-share's business.
        (json!("pod"), true, None),
        (json!([1, 2]), true, None),
        (
            json!({"metadata": {"annotations": {"gpu-share": "mps-10"}}, "spec": "x"}),
            false,
            Some(("not_a_pod", "the object is not a valid Pod")),
        ),
        (
            json!({"metadata": {"annotations": {"gpu-share": "mps-10"}}}),
            false,
            Some(("not_a_pod", "the pod has no spec")),
        ),
        (
            json!({"metadata": {"annotations": {"gpu-share": "mps-10"}}, "spec": {"containers": []}}),
            false,
            Some(("container_not_found", "the pod has no containers")),
        ),
        // A non-string annotation value is not an annotation the webhook can read.
        (
            json!({"metadata": {"annotations": {"gpu-share": 5}}, "spec": {"containers": []}}),
            true,
            None,
        ),
        (
            json!({"metadata": {"annotations": {"gpu-share": "exclusive"}}, "spec": {"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "x"}}}]}}),
            false,
            Some(("conflicting_limits", "already sets nvidia.com/gpu: x")),
        ),
        (
            json!({"metadata": {"annotations": {"gpu-share.io/request": "exclusive"}}, "spec": "x"}),
            false,
            Some((
                "request_without_gpu_share",
                "written by the gpu-share webhook",
            )),
        ),
    ];
    for (object, allowed, denial) in cases {
        let mut r = base.clone();
        r["request"]["object"] = object.clone();
        let (status, response) =
            post(dev_state(), "/mutate", serde_json::to_vec(&r).unwrap()).await;
        assert_eq!(status, 200, "{object}: {response}");
        let resp = &response["response"];
        assert_eq!(resp["uid"], base["request"]["uid"], "{object}");
        assert_eq!(resp["allowed"], allowed, "{object}: {resp}");
        assert!(resp.get("patch").is_none(), "{object}: {resp}");
        match denial {
            None => assert!(resp.get("status").is_none(), "{object}: {resp}"),
            Some((reason, fragment)) => {
                assert_eq!(resp["status"]["code"], 403, "{object}: {resp}");
                assert_eq!(
                    resp["auditAnnotations"]["denied"], reason,
                    "{object}: {resp}"
                );
                let message = resp["status"]["message"].as_str().unwrap();
                assert!(message.starts_with("gpu-share: "), "{object}: {message}");
                assert!(message.contains(fragment), "{object}: {message}");
            }
        }
    }
}

#[tokio::test]
async fn metrics_count_requests_and_denials() {
    let state = dev_state();
    let bad = fixture("admission/bad-profile.json");
    post(state.clone(), "/mutate", serde_json::to_vec(&bad).unwrap()).await;
    let text = state.metrics.encode();
    assert!(
        text.contains(r#"gpu_share_requests_total{endpoint="mutate",outcome="denied"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"gpu_share_admission_denials_total{reason="unknown_mig_profile"} 1"#),
        "{text}"
    );
}

#[tokio::test]
async fn unknown_paths_are_404() {
    let (status, response) = post(dev_state(), "/nope", b"{}".to_vec()).await;
    assert_eq!(status, 404);
    assert!(response["error"].as_str().unwrap().contains("/nope"));
}

/// A pod UPDATE as the API server sends it to `pod-annotations.gpu-share.io`.
fn update_review(old: Value, new: Value, username: &str) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "upd-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "p",
            "namespace": "ml",
            "operation": "UPDATE",
            "userInfo": {"username": username, "groups": ["system:authenticated"]},
            "object": {"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": "p", "namespace": "ml", "annotations": new},
                       "spec": {"containers": [{"name": "c", "image": "x"}]}},
            "oldObject": {"apiVersion": "v1", "kind": "Pod",
                          "metadata": {"name": "p", "namespace": "ml", "annotations": old},
                          "spec": {"containers": [{"name": "c", "image": "x"}]}}
        }
    })
}

#[tokio::test]
async fn updates_of_gpu_share_annotations_follow_the_rule() {
    const SCHEDULER: &str = "system:serviceaccount:gpu-share:gpu-share-scheduler";
    let admitted = json!({"gpu-share": "timeslice-90", "gpu-share.io/request": "timeslice-90"});
    let with = |k: &str, v: &str| {
        let mut a = admitted.clone();
        a[k] = json!(v);
        a
    };
    let cases = [
        // The rewrite the issue names: refused, from anyone.
        (
            with("gpu-share.io/request", "timeslice-1"),
            "alice",
            Some("fixed once a pod is admitted"),
        ),
        (
            with("gpu-share.io/request", "timeslice-1"),
            SCHEDULER,
            Some("fixed once a pod is admitted"),
        ),
        (
            json!({"gpu-share.io/request": "timeslice-90"}),
            "alice",
            Some("removes it"),
        ),
        (
            with("gpu-share.io/gpus", "0:900"),
            "alice",
            Some("only gpu-share itself"),
        ),
        (
            with("gpu-share.io/requeued-at", "1"),
            "alice",
            Some("only gpu-share itself"),
        ),
        // gpu-share's own later annotations, and everything else: allowed.
        (with("gpu-share.io/requeued-at", "1"), SCHEDULER, None),
        (with("gpu-share.io/gpus", "0:900"), SCHEDULER, None),
        (with("team", "ml"), "alice", None),
    ];
    for (new, user, denial) in cases {
        let r = update_review(admitted.clone(), new.clone(), user);
        let (status, response) =
            post(dev_state(), "/mutate", serde_json::to_vec(&r).unwrap()).await;
        assert_eq!(status, 200, "{response}");
        let resp = &response["response"];
        assert_eq!(resp["uid"], "upd-1");
        assert!(
            resp.get("patch").is_none(),
            "an UPDATE is never patched: {resp}"
        );
        match denial {
            None => assert_eq!(resp["allowed"], true, "{user} {new}: {resp}"),
            Some(words) => {
                assert_eq!(resp["allowed"], false, "{user} {new}: {resp}");
                let message = resp["status"]["message"].as_str().unwrap();
                assert!(message.contains(words), "{message}");
                assert_eq!(resp["auditAnnotations"]["denied"], "annotation_update");
            }
        }
    }
}

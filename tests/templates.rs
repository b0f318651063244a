//! `/validate`, the template check, driven through the router with the AdmissionReviews the
//! apiserver sends for workloads: a Deployment, a CronJob, an UPDATE, and a kind the policy adds.

mod common;

use common::*;
use gpu_share::cli::Role;
use gpu_share::policy::Policy;
use gpu_share::server::AppState;
use serde_json::{Value, json};

fn template(class: &str) -> Value {
    json!({"metadata": {"labels": {"app": "x"}, "annotations": {"gpu-share": class}},
           "spec": {"containers": [{"name": "main", "image": "x"}]}})
}

fn workload_review(
    group: &str,
    kind: &str,
    operation: &str,
    object: Value,
    old: Option<Value>,
) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "7d6b4f2e-0000-4000-8000-000000000001",
            "kind": {"group": group, "version": "v1", "kind": kind},
            "resource": {"group": group, "version": "v1", "resource": format!("{}s", kind.to_lowercase())},
            "name": "w", "namespace": "ml", "operation": operation,
            "userInfo": {"username": "alice"},
            "object": object, "oldObject": old,
        },
    })
}

fn deployment(class: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "w", "namespace": "ml"},
           "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "x"}}, "template": template(class)}})
}

async fn answer(state: AppState, review: &Value) -> Value {
    let (status, response) = post(state, "/validate", serde_json::to_vec(review).unwrap()).await;
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["kind"], "AdmissionReview");
    assert_eq!(response["response"]["uid"], review["request"]["uid"]);
    assert!(
        response["response"].get("patch").is_none(),
        "the template check never changes a workload: {response}"
    );
    response["response"].clone()
}

#[tokio::test]
async fn a_deployment_with_a_typo_is_refused_in_the_pod_webhooks_words() {
    let state = dev_state();
    let r = answer(
        state.clone(),
        &workload_review(
            "apps",
            "Deployment",
            "CREATE",
            deployment("mig-7g.79gb"),
            None,
        ),
    )
    .await;
    assert_eq!(r["allowed"], false);
    let message = r["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "gpu-share: spec.template: unknown MIG profile \"7g.79gb\" (did you mean 7g.80gb"
        ),
        "{message}"
    );
    assert_eq!(r["status"]["code"], 403);
    let text = state.metrics.encode();
    assert!(
        text.contains(r#"gpu_share_requests_total{endpoint="validate",outcome="denied"} 1"#),
        "{text}"
    );
}

#[tokio::test]
async fn a_good_template_and_an_unchanged_one_are_allowed() {
    let state = dev_state();
    let good = deployment("mig-1g.10gb");
    let r = answer(
        state.clone(),
        &workload_review("apps", "Deployment", "CREATE", good.clone(), None),
    )
    .await;
    assert_eq!(r["allowed"], true, "{r}");
    // An UPDATE into a bad template is refused; an UPDATE that leaves a bad one as it was is not.
    let bad = deployment("mps-250");
    let r = answer(
        state.clone(),
        &workload_review("apps", "Deployment", "UPDATE", bad.clone(), Some(good)),
    )
    .await;
    assert_eq!(r["allowed"], false, "{r}");
    let mut relabelled = bad.clone();
    relabelled["metadata"]["labels"] = json!({"rev": "2"});
    let r = answer(
        state,
        &workload_review("apps", "Deployment", "UPDATE", relabelled, Some(bad)),
    )
    .await;
    assert_eq!(r["allowed"], true, "{r}");
}

#[tokio::test]
async fn a_cronjob_is_refused_with_its_job_templates_path() {
    let cron = json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "w"},
        "spec": {"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": template("timeslice-0")}}}});
    let r = answer(
        dev_state(),
        &workload_review("batch", "CronJob", "CREATE", cron, None),
    )
    .await;
    assert_eq!(r["allowed"], false);
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("gpu-share: spec.jobTemplate.spec.template: "),
        "{r}"
    );
}

#[tokio::test]
async fn kinds_the_policy_adds_are_checked_and_others_pass() {
    let job = json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "w"},
        "spec": {"pytorchReplicaSpecs": {"Master": {"template": template("exclusive-1")},
                                         "Worker": {"template": template("exclusive-0")}}}});
    let review = workload_review("kubeflow.org", "PyTorchJob", "CREATE", job, None);
    // Not named by the policy: allowed unchecked (the pod webhook still checks its pods).
    let r = answer(dev_state(), &review).await;
    assert_eq!(r["allowed"], true, "{r}");
    let policy = Policy::from_yaml(
        "workloads:\n  - {group: kubeflow.org, version: v1, kind: PyTorchJob, templates: [spec.pytorchReplicaSpecs.*.template]}\n",
    )
    .unwrap();
    let r = answer(AppState::dev(Role::All, policy), &review).await;
    assert_eq!(r["allowed"], false, "{r}");
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("gpu-share: spec.pytorchReplicaSpecs.Worker.template: "),
        "{r}"
    );
}

#[tokio::test]
async fn deletes_subresources_and_garbage_never_block() {
    let state = dev_state();
    let mut review = workload_review(
        "apps",
        "Deployment",
        "DELETE",
        deployment("mig-7g.79gb"),
        None,
    );
    assert_eq!(answer(state.clone(), &review).await["allowed"], true);
    review["request"]["operation"] = json!("UPDATE");
    review["request"]["subResource"] = json!("scale");
    assert_eq!(answer(state.clone(), &review).await["allowed"], true);
    for object in [
        json!(null),
        json!(7),
        json!({"spec": []}),
        json!({"spec": {"template": []}}),
    ] {
        let r = answer(
            state.clone(),
            &workload_review("apps", "Deployment", "CREATE", object, None),
        )
        .await;
        assert_eq!(r["allowed"], true, "{r}");
    }
    let (status, body) = post(state, "/validate", b"{not json".to_vec()).await;
    assert_eq!(status, 400, "{body}");
}

/// `/mutate-templates`, the template's quantity: a Job CREATE gets `gpu-share.io/gpu-milli` in its
/// template's GPU container (a JSON Patch, nothing else), an UPDATE nothing, a bad template the
/// pod webhook's words.
#[tokio::test]
async fn a_job_gets_its_pods_quantity_in_its_template() {
    use base64::Engine;
    let state = dev_state();
    let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "w", "namespace": "ml"},
                     "spec": {"parallelism": 2, "template": template("mig-3g.40gb")}});
    let ask = |op: &str, object: &Value| {
        let state = state.clone();
        let review = workload_review("batch", "Job", op, object.clone(), None);
        async move {
            let (status, response) = post(
                state,
                "/mutate-templates",
                serde_json::to_vec(&review).unwrap(),
            )
            .await;
            assert_eq!(status, 200, "{response}");
            assert_eq!(response["response"]["uid"], review["request"]["uid"]);
            response["response"].clone()
        }
    };
    let r = ask("CREATE", &job).await;
    assert_eq!(r["allowed"], true, "{r}");
    assert_eq!(r["patchType"], "JSONPatch");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(r["patch"].as_str().unwrap())
        .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
    let mut patched = job.clone();
    json_patch::patch(&mut patched, &patch).unwrap();
    assert_eq!(
        patched["spec"]["template"]["spec"]["containers"][0]["resources"],
        json!({"limits": {"gpu-share.io/gpu-milli": "428"}})
    );
    // A second pass (reinvocation) writes nothing more.
    let again = ask("CREATE", &patched).await;
    assert_eq!(again["allowed"], true);
    assert!(again.get("patch").is_none(), "{again}");
    // An UPDATE (Kueue unsuspending the Job) is left alone.
    let update = ask("UPDATE", &job).await;
    assert!(update.get("patch").is_none(), "{update}");
    // A template the pod webhook would deny, denied in its words with the path.
    let mut bad = job.clone();
    bad["spec"]["template"] = template("mps-250");
    let r = ask("CREATE", &bad).await;
    assert_eq!(r["allowed"], false);
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("gpu-share: spec.template: "),
        "{r}"
    );
    let text = state.metrics.encode();
    assert!(
        text.contains(
            r#"gpu_share_requests_total{endpoint="mutate_templates",outcome="allowed"} 3"#
        ),
        "{text}"
    );
}

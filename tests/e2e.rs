//! End-to-end test against a real cluster with gpu-share installed (`kubectl apply -k manifests/...`).
//!
//! Ignored by default: run it with `KUBECONFIG=... cargo test --test e2e -- --ignored`. Without
//! `KUBECONFIG` it fails (a run that could not reach a cluster is never counted as a pass).
//!
//! What it checks, in a throwaway namespace `gpu-share-e2e-<time>` (deleted afterwards):
//! 1. both Deployments in namespace `gpu-share` are available;
//! 2. a pod without the annotation is admitted untouched (default scheduler, no gpu-share fields);
//! 3. a pod with a misspelled MIG profile is denied, and the message names the nearest profile;
//! 4. a pod annotated `gpu-share: <GPU_SHARE_E2E_CLASS>` (default `timeslice-50`) is mutated
//!    (scheduler, GPU resource, toleration, normalized request annotation);
//! 5. that pod is bound by the extender: `spec.nodeName` set and the `gpu-share.io/gpus`
//!    annotation written, and the rebuilt ledger (`gpu-share status`'s view) holds it on that node.
//!    With `GPU_SHARE_E2E_EXPECT=unschedulable` (a class the cluster cannot hold, e.g. `mps-75`
//!    where MPS replicas are smaller) the pod must stay Pending with a FailedScheduling event that
//!    explains it: the extender's reasons for the nodes of that class, or, on a cluster with no
//!    node of that class, kube-scheduler's node-affinity reason for every node (the webhook's
//!    affinity turns them away before the extender is asked).
//!
//! Other knobs: `GPU_SHARE_E2E_IMAGE` (default `registry.k8s.io/pause:3.10`),
//! `GPU_SHARE_E2E_TIMEOUT_SECONDS` (default 180), and `GPU_SHARE_E2E_READYZ`: comma-separated
//! `/readyz` URLs of gpu-share processes to wait for instead of the Deployments, for a cluster
//! where gpu-share runs outside pods (the control plane of `tests/cluster/up.sh`, which has no
//! kubelet; its `DIR/env` sets it).
//!
//! The namespace gets a `default` ServiceAccount if kube-controller-manager has not made one, and
//! its pods are deleted (grace period 0) before the namespace, so no GPU stays held by a
//! namespace that is still terminating.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::cluster::wait_for;
use gpu_share::policy::Policy;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, Namespace, Pod, ServiceAccount};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

const SYSTEM_NAMESPACE: &str = "gpu-share";
const SCHEDULER: &str = "gpu-share-scheduler";

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_string())
}

fn timeout() -> Duration {
    let s = env_or("GPU_SHARE_E2E_TIMEOUT_SECONDS", "180");
    Duration::from_secs(s.parse().expect("GPU_SHARE_E2E_TIMEOUT_SECONDS: seconds"))
}

fn pod(name: &str, annotations: BTreeMap<String, String>) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "main",
                "image": env_or("GPU_SHARE_E2E_IMAGE", "registry.k8s.io/pause:3.10"),
            }],
        },
    }))
    .expect("pod literal")
}

fn annotated(value: &str) -> BTreeMap<String, String> {
    BTreeMap::from([("gpu-share".to_string(), value.to_string())])
}

async fn deployments_available(client: &Client) -> Result<(), String> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    for name in ["gpu-share-webhook", SCHEDULER] {
        wait_for(&format!("Deployment {SYSTEM_NAMESPACE}/{name} available"), timeout(), || {
            let api = api.clone();
            async move {
                let d = api
                    .get_opt(name)
                    .await
                    .map_err(|e| format!("get Deployment {name}: {e}"))?
                    .ok_or_else(|| {
                        format!("Deployment {SYSTEM_NAMESPACE}/{name} not found: is gpu-share installed?")
                    })?;
                let available = d
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Available" && c.status == "True");
                Ok(available.then_some(()))
            }
        })
        .await?;
    }
    Ok(())
}

/// Phrases of the extender's filter reasons (`packing::Reason::message`).
const EXTENDER_REASONS: &[&str] = &[
    "node has no NVIDIA GPUs",
    "not in gpu-share's inventory",
    "GPU model is not one the pod allows",
    "MIG devices",
    "pod asks",
    "smaller than the request",
    "no free GPU replica",
    "budget of this node's GPUs is used up",
    "GPU memory budget",
    "fewer GPUs than the pod asks",
    "not enough free whole GPUs",
    "no single GPU has enough free share",
    "requested GPU resource",
    "not enough free CPU",
    "not enough free memory",
];

/// A FailedScheduling message that explains an unschedulable gpu-share pod, as kube-scheduler
/// groups it (`0/N nodes are available: ...`): the extender's reasons for the nodes of the pod's
/// class, or, on a cluster with no node of that class, kube-scheduler's node-affinity reason for
/// every node (the webhook's affinity turns them away before the extender is asked).
fn explains_unschedulable(message: &str) -> bool {
    let Some(total) = message
        .strip_prefix("0/")
        .and_then(|m| m.split_once(" nodes are available:"))
        .map(|(n, _)| n)
    else {
        return false;
    };
    EXTENDER_REASONS.iter().any(|r| message.contains(r))
        || message.contains(&format!(
            "available: {total} node(s) didn't match Pod's node affinity/selector"
        ))
}

fn ensure(cond: bool, msg: impl Into<String>) -> Result<(), String> {
    if cond { Ok(()) } else { Err(msg.into()) }
}

/// Waits until each `/readyz` URL answers 200.
async fn processes_ready(urls: &str) -> Result<(), String> {
    for url in urls.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        wait_for(&format!("{url} ready"), timeout(), || async move {
            let ok = std::process::Command::new("curl")
                .args(["-sf", "-o", "/dev/null", url])
                .status()
                .map_err(|e| format!("run curl: {e}"))?
                .success();
            Ok(ok.then_some(()))
        })
        .await?;
    }
    Ok(())
}

async fn scenario(client: &Client, ns: &str) -> Result<(), String> {
    match std::env::var("GPU_SHARE_E2E_READYZ") {
        Ok(urls) if !urls.is_empty() => processes_ready(&urls).await?,
        _ => deployments_available(client).await?,
    }
    // kube-controller-manager makes each namespace's `default` ServiceAccount; make it where
    // none runs (AlreadyExists is fine: it got there first).
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "default"}})).expect("literal");
    match accounts.create(&PostParams::default(), &account).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(format!("create ServiceAccount {ns}/default: {e}")),
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pp = PostParams::default();

    // 2. Untouched: no annotation, no mutation.
    let plain = pods
        .create(&pp, &pod("plain", BTreeMap::new()))
        .await
        .map_err(|e| format!("a pod without the annotation was refused: {e}"))?;
    let spec = plain.spec.as_ref().ok_or("plain pod without spec")?;
    ensure(
        spec.scheduler_name.as_deref() == Some("default-scheduler"),
        format!(
            "plain pod's scheduler was changed: {:?}",
            spec.scheduler_name
        ),
    )?;
    ensure(
        !plain
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key("gpu-share.io/request"),
        "plain pod was mutated",
    )?;

    // 3. Refusal in words.
    match pods
        .create(&pp, &pod("typo", annotated("mig-7g.79gb")))
        .await
    {
        Ok(_) => return Err("a pod with MIG profile 7g.79gb was admitted".into()),
        Err(kube::Error::Api(status)) => ensure(
            status.message.contains("7g.79gb") && status.message.contains("did you mean"),
            format!("denial without the nearest profile: {}", status.message),
        )?,
        Err(e) => return Err(format!("creating the typo pod failed unexpectedly: {e}")),
    }

    // 4. Mutation.
    let class = env_or("GPU_SHARE_E2E_CLASS", "timeslice-50");
    let created = pods
        .create(&pp, &pod("shared", annotated(&class)))
        .await
        .map_err(|e| format!("annotated pod ({class}) refused: {e}"))?;
    let spec = created.spec.as_ref().ok_or("shared pod without spec")?;
    ensure(
        spec.scheduler_name.as_deref() == Some(SCHEDULER),
        format!("scheduler not set: {:?}", spec.scheduler_name),
    )?;
    let limits = spec.containers[0]
        .resources
        .as_ref()
        .and_then(|r| r.limits.clone())
        .unwrap_or_default();
    ensure(
        limits.keys().any(|k| k.starts_with("nvidia.com/")),
        format!("no nvidia.com resource in the limits: {limits:?}"),
    )?;
    ensure(
        spec.tolerations
            .as_ref()
            .is_some_and(|t| t.iter().any(|t| t.key.as_deref() == Some("nvidia.com/gpu"))),
        "no nvidia.com/gpu toleration",
    )?;
    let request = created
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("gpu-share.io/request").cloned())
        .ok_or("no gpu-share.io/request annotation")?;
    tracing::info!(%request, "mutated");

    // 5. Scheduling.
    let expect_unschedulable = env_or("GPU_SHARE_E2E_EXPECT", "scheduled") == "unschedulable";
    if expect_unschedulable {
        let events: Api<Event> = Api::namespaced(client.clone(), ns);
        let message = wait_for("a FailedScheduling event for pod shared", timeout(), || {
            let events = events.clone();
            async move {
                let list = events
                    .list(&ListParams::default().fields("involvedObject.name=shared"))
                    .await
                    .map_err(|e| format!("list events: {e}"))?;
                Ok(list
                    .items
                    .into_iter()
                    .find(|e| e.reason.as_deref() == Some("FailedScheduling"))
                    .and_then(|e| e.message))
            }
        })
        .await?;
        let pod = pods.get("shared").await.map_err(|e| e.to_string())?;
        ensure(
            pod.spec.and_then(|s| s.node_name).is_none(),
            "pod expected unschedulable was bound",
        )?;
        return ensure(
            explains_unschedulable(&message),
            format!("FailedScheduling without gpu-share's reasons: {message}"),
        );
    }

    let (node, gpus) = wait_for("pod shared bound by the extender", timeout(), || {
        let pods = pods.clone();
        async move {
            let p = pods.get("shared").await.map_err(|e| e.to_string())?;
            let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
            let gpus = p
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("gpu-share.io/gpus").cloned());
            Ok(node.zip(gpus))
        }
    })
    .await?;
    ensure(!gpus.is_empty(), "empty gpu-share.io/gpus annotation")?;

    let status = gpu_share::status::from_cluster(
        &Policy::default_policy(),
        &gpu_share::status::ClusterAccess::default(),
    )
    .await
    .map_err(|e| e.to_string())?;
    // The namespace's GPUs are listed beside its quotas (it has none).
    let quotas = status.quotas.as_ref().map_err(|e| e.to_string())?;
    ensure(
        quotas
            .iter()
            .any(|u| u.namespace == ns && u.held_gpus > 0.0 && u.quotas.is_empty()),
        format!("status lists no GPUs held for {ns}: {quotas:?}"),
    )?;
    let reports = status.reports;
    let report = reports
        .iter()
        .find(|r| r.name == node)
        .ok_or_else(|| format!("status has no report for node {node}"))?;
    ensure(
        report
            .pods
            .iter()
            .any(|p| p.namespace == ns && p.name == "shared"),
        format!("the rebuilt ledger does not hold {ns}/shared on {node}"),
    )
}

#[test]
fn unschedulable_messages_as_kube_scheduler_writes_them() {
    // Both taken from a real kube-scheduler 1.37 (tests/cluster.rs).
    assert!(explains_unschedulable(
        "0/7 nodes are available: 2 MPS replicas on this node are smaller than the request, \
         5 node(s) didn't match Pod's node affinity/selector. preemption: 0/7 nodes are available: \
         2 No preemption victims found for incoming pod, 5 Preemption is not helpful for scheduling."
    ));
    assert!(explains_unschedulable(
        "0/7 nodes are available: 7 node(s) didn't match Pod's node affinity/selector."
    ));
    // Some nodes turned away by affinity, the rest for reasons that are not gpu-share's.
    assert!(!explains_unschedulable(
        "0/7 nodes are available: 2 Insufficient cpu, 5 node(s) didn't match Pod's node affinity/selector."
    ));
    assert!(!explains_unschedulable(
        "no nodes available to schedule pods"
    ));
}

#[tokio::test]
#[ignore = "needs a cluster with gpu-share installed: KUBECONFIG=... cargo test --test e2e -- --ignored"]
async fn installed_gpu_share_admits_mutates_and_binds() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    assert!(
        std::env::var_os("KUBECONFIG").is_some(),
        "KUBECONFIG is not set: this test needs a real cluster with gpu-share installed"
    );
    let client = Client::try_default()
        .await
        .expect("a Kubernetes client from KUBECONFIG");
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    // Milliseconds: two runs in one second (CI runs two in a row) must not meet in a namespace
    // the first one left terminating.
    let ns = format!("gpu-share-e2e-{stamp}");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let object: Namespace =
        serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace literal");
    namespaces
        .create(&PostParams::default(), &object)
        .await
        .expect("create the test namespace");

    let result = scenario(&client, &ns).await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    if let Err(e) = pods.delete_collection(&now, &ListParams::default()).await {
        tracing::warn!(namespace = %ns, error = %e, "could not delete the test pods");
    }
    if let Err(e) = namespaces.delete(&ns, &DeleteParams::default()).await {
        tracing::warn!(namespace = %ns, error = %e, "could not delete the test namespace");
    }
    if let Err(e) = result {
        panic!("{e}");
    }
}

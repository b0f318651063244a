//! Workloads as users write them, on a cluster whose pods run and finish: the scenarios of
//! NVIDIA's, Azure's and Scaleway's GPU-sharing guides, created with kubectl as Deployments, Jobs
//! and StatefulSets, on the control plane of `tests/cluster/up.sh` (kube-apiserver,
//! kube-controller-manager, kube-scheduler and gpu-share real; KWOK in place of the kubelets) with
//! the nodes of `tests/cluster/workload-nodes.yaml`.
//!
//! Run: `cargo test --test workloads -- --ignored` (`GPU_SHARE_WORKLOADS_CLUSTER_DIR=DIR` reuses
//! a cluster `up.sh DIR` started with those nodes; `GPU_SHARE_CLUSTER_POINTS="1 lifecycle"` runs
//! only the named points). `.ci/run` runs it.
//!
//! Each point is a named check that can fail, and after each step the ledger (`/v1/nodes`) must
//! equal what the API says (every bound, unfinished gpu-share pod held on its node, nothing else):
//! 1.-5. the guides' scenarios: a time-slicing Job, a MIG Deployment, a mixed MIG layout, an MPS
//!    StatefulSet and exclusive training beside shared pods;
//! lifecycles: a Failed pod, a drain, a Deployment scaled to 0, a MIG layout changed under its
//!    pods, a namespace deleted, a node deleted;
//! templates: workloads checked at `kubectl apply` (refused in the pod webhook's words with the
//!    template's path, `--dry-run=server`, UPDATEs, CronJobs, and a workload without gpu-share
//!    annotations never sent to gpu-share, admitted with the webhook down);
//! per-GPU sharing: a plain node shared per GPU, its reservations run by real `gpu-share reserve`
//!    processes (tests/workloads/per_gpu.rs);
//! MPS per GPU: MPS shares of unequal sizes beside time-sliced and exclusive ones on that node,
//!    in a `restricted` namespace, their reservations running MPS daemons and writing CDI devices
//!    (tests/workloads/per_gpu_mps.rs);
//! quotas: a ResourceQuota on requests.gpu-share.io/gpu-milli caps a namespace's GPUs in fractions,
//!    on device-plugin and per-GPU nodes (tests/workloads/quota.rs);
//! kueue: Kueue's own controller and webhooks admit pods and Jobs by that quantity, a
//!    ClusterQueue of 2 GPUs holding the ninth `timeslice-25`, with either mutating webhook first
//!    (tests/workloads/kueue.rs);
//! dra: nodes whose GPUs NVIDIA's DRA driver publishes, beside device-plugin ones: `exclusive-1`
//!    and `mig-1g.10gb` Deployments land there through kube-scheduler's DRA plugin, the ledger
//!    equals the claims, before and after the extender restarts, and full nodes and shares are
//!    refused in words (tests/workloads/dra.rs);
//! default spread: a Deployment's replicas over two alike nodes go where kube-scheduler's default
//!    topology spread would put them, gpu-share passing that one node (tests/workloads/spread.rs);
//! defragmentation plan: with `defrag.mode: plan`, an `exclusive-2` pod refused for scattered free
//!    GPUs is told which move of a Deployment's pod would make room, and nothing moves
//!    (tests/workloads/defrag.rs);
//! defragmentation moves: with `defrag.mode: on`, the same move refused by a PodDisruptionBudget
//!    is unwound with nothing left held; allowed, the pod is evicted through the Eviction API,
//!    its replacement lands on its held target and the waiting pod where room was made, and the
//!    audit log shows no pod deleted by gpu-share (tests/workloads/defrag.rs);
//! defragmentation restart: a plan under way when its extender is killed is unwound by the
//!    restarted one, with nothing left held (tests/workloads/defrag.rs).

mod common;
#[path = "workloads/defrag.rs"]
mod defrag;
#[path = "workloads/dra.rs"]
mod dra;
#[path = "workloads/kueue.rs"]
mod kueue;
#[path = "workloads/per_gpu.rs"]
mod per_gpu;
#[path = "workloads/per_gpu_mps.rs"]
mod per_gpu_mps;
#[path = "workloads/quota.rs"]
mod quota;
#[path = "workloads/spread.rs"]
mod spread;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::cluster::{Check, Cluster, ensure, failed_scheduling, pod_uid, point, wait_for};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

/// KWOK's annotation: a pod that carries it finishes (Succeeded) that long after it started.
const COMPLETE: &str = "pod-complete.stage.kwok.x-k8s.io/delay";
/// The same, ending Failed.
const FAIL: &str = "pod-fail.stage.kwok.x-k8s.io/delay";
const REQUEST: &str = "gpu-share.io/request";
/// How long a waiting pod may take to be bound once capacity is released: the issue's 5 s.
const REBIND: Duration = Duration::from_secs(5);

fn kubectl(c: &Cluster, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
    let out = c.kubectl(args, stdin);
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// `kubectl apply -f -` of one object, as a user applies a manifest.
fn apply(c: &Cluster, ns: &str, obj: &Value) -> Result<String, String> {
    kubectl(c, &["apply", "-n", ns, "-f", "-"], Some(&obj.to_string()))
}

/// A pod template as the guides write them: the gpu-share annotation (and any others), pinned to
/// one node by its hostname when `node` is given.
fn template(annotations: Value, node: Option<&str>, restart: &str) -> Value {
    let mut spec = json!({
        "restartPolicy": restart,
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0"}],
    });
    if let Some(node) = node {
        spec["nodeSelector"] = json!({"kubernetes.io/hostname": node});
    }
    json!({"metadata": {"labels": {"app": "gpu"}, "annotations": annotations}, "spec": spec})
}

fn deployment(name: &str, replicas: u32, template: Value) -> Value {
    let mut t = template;
    t["metadata"]["labels"] = json!({"app": name});
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": t},
    })
}

fn job(name: &str, completions: u32, parallelism: u32, template: Value) -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name},
        "spec": {"completions": completions, "parallelism": parallelism, "backoffLimit": 0,
                 "template": template},
    })
}

/// The namespace's pods, by name.
async fn pods_of(c: &Cluster, ns: &str) -> Result<BTreeMap<String, Pod>, String> {
    let api: Api<Pod> = Api::namespaced(c.client.clone(), ns);
    Ok(api
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("list pods in {ns}: {e}"))?
        .items
        .into_iter()
        .filter_map(|p| Some((p.metadata.name.clone()?, p)))
        .collect())
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// Reservation pods can run: the RuntimeClass they name exists, and the extender knows their
/// image (it runs outside a pod here, so it cannot read its own): restarted with it.
async fn reservations_can_run(c: &Cluster) -> Check {
    let _ = c.kubectl(
        &["apply", "-f", "-"],
        Some(r#"{"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"}"#),
    );
    c.stop("extender");
    c.start_process_with(
        "extender",
        &[("GPU_SHARE_RESERVATION_IMAGE", "gpu-share:test")],
    );
    c.wait_ready("EXTENDER_ADMIN", Duration::from_secs(60))
        .await?;
    Ok(())
}

fn node_of(p: &Pod) -> Option<&str> {
    p.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

/// The limits of a pod's first container (where the webhook writes the GPU).
fn limits_of(p: &Pod) -> BTreeMap<String, String> {
    p.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.resources.as_ref())
        .and_then(|r| r.limits.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|(k, q)| (k, q.0))
        .collect()
}

fn live(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none() && !matches!(phase(p), "Succeeded" | "Failed")
}

/// Waits until the namespace has exactly `running` pods Running and `pending` pods unbound (of
/// those not finished), returning the pending pods' names.
async fn wait_pods(
    c: &Cluster,
    ns: &str,
    running: usize,
    pending: usize,
) -> Result<Vec<String>, String> {
    wait_pods_within(c, ns, running, pending, Duration::from_secs(90)).await
}

/// [`wait_pods`] with a limit of its own.
async fn wait_pods_within(
    c: &Cluster,
    ns: &str,
    running: usize,
    pending: usize,
    limit: Duration,
) -> Result<Vec<String>, String> {
    let last = std::sync::Mutex::new(String::new());
    let result = wait_for(
        &format!("{running} pod(s) Running and {pending} Pending in {ns}"),
        limit,
        || async {
            let pods = pods_of(c, ns).await?;
            let live: Vec<&Pod> = pods.values().filter(|p| live(p)).collect();
            let run = live.iter().filter(|p| phase(p) == "Running").count();
            let waiting: Vec<String> = live
                .iter()
                .filter(|p| node_of(p).is_none())
                .filter_map(|p| p.metadata.name.clone())
                .collect();
            *last.lock().unwrap() = format!(
                "{run} Running, {} unbound, {} live",
                waiting.len(),
                live.len()
            );
            Ok(
                (run == running && waiting.len() == pending && live.len() == running + pending)
                    .then_some(waiting),
            )
        },
    )
    .await;
    result.map_err(|e| format!("{e} (last seen: {})", last.lock().unwrap()))
}

/// The ledger (`/v1/nodes`), per node: the pods it holds there and the units it counts.
fn ledger(c: &Cluster) -> Result<BTreeMap<String, Value>, String> {
    let nodes = c.admin_json("EXTENDER_ADMIN", "/v1/nodes")?;
    Ok(nodes
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| Some((n["name"].as_str()?.to_string(), n.clone())))
        .collect())
}

fn ledger_pods(n: &Value) -> BTreeSet<String> {
    n["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            format!(
                "{}/{}",
                p["namespace"].as_str().unwrap_or_default(),
                p["name"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

/// What the API says each node holds: its bound, unfinished gpu-share pods, and the units their
/// limits take of each nvidia.com resource.
struct ApiView {
    pods: BTreeMap<String, BTreeSet<String>>,
    units: BTreeMap<String, BTreeMap<String, u64>>,
    allocatable: BTreeMap<String, BTreeMap<String, u64>>,
}

async fn api_view(c: &Cluster) -> Result<ApiView, String> {
    let nodes = Api::<Node>::all(c.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("list nodes: {e}"))?;
    let mut view = ApiView {
        pods: BTreeMap::new(),
        units: BTreeMap::new(),
        allocatable: BTreeMap::new(),
    };
    for n in nodes.items {
        let name = n.metadata.name.clone().unwrap_or_default();
        view.allocatable
            .insert(name.clone(), common::cluster::nvidia_allocatable(&n));
        view.pods.insert(name.clone(), BTreeSet::new());
        view.units.insert(name, BTreeMap::new());
    }
    let pods = Api::<Pod>::all(c.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("list pods: {e}"))?;
    for p in pods.items {
        let Some(node) = node_of(&p).map(str::to_string) else {
            continue;
        };
        let gpu_share = p
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(REQUEST));
        if !gpu_share || !live(&p) || !view.pods.contains_key(&node) {
            continue;
        }
        let key = format!(
            "{}/{}",
            p.metadata.namespace.clone().unwrap_or_default(),
            p.metadata.name.clone().unwrap_or_default()
        );
        view.pods.get_mut(&node).unwrap().insert(key);
        let units = view.units.get_mut(&node).unwrap();
        for (k, q) in common::cluster::nvidia_limits(&p) {
            *units.entry(k).or_default() += q;
        }
    }
    Ok(view)
}

/// The ledger equals what the API says, and no node holds more than it advertises (by the
/// API's own count): polled until both hold, as the ledger follows the API's watch.
async fn ledger_is_the_api(c: &Cluster, step: &str) -> Check {
    let last = std::sync::Mutex::new(String::new());
    let r = wait_for(
        &format!("the ledger to equal the API after {step}"),
        Duration::from_secs(30),
        || async {
            let view = api_view(c).await?;
            let ledger = ledger(c)?;
            let mut diffs = Vec::new();
            for (node, pods) in &view.pods {
                // A DRA node's holdings are its claims (tests/workloads/dra.rs checks those).
                if ledger
                    .get(node)
                    .and_then(|n| n["kind"].as_str())
                    .is_some_and(|k| k.starts_with("DRA"))
                {
                    continue;
                }
                let held = ledger.get(node).map(ledger_pods).unwrap_or_default();
                if !ledger.contains_key(node) && !pods.is_empty() {
                    diffs.push(format!("{node}: not in the ledger, API has {pods:?}"));
                } else if held != *pods {
                    diffs.push(format!("{node}: ledger {held:?}, API {pods:?}"));
                }
                for (resource, used) in &view.units[node] {
                    let has = view.allocatable[node].get(resource).copied().unwrap_or(0);
                    // A MIG layout changed under its pods: their devices are gone from the
                    // node's allocatable while they still run. Held, not overcommitted.
                    let stale = resource.starts_with("nvidia.com/mig-") && has == 0;
                    if *used > has && !stale {
                        diffs.push(format!(
                            "{node}: {used} {resource} bound, {has} allocatable"
                        ));
                    }
                }
            }
            for node in ledger.keys() {
                if !view.pods.contains_key(node) {
                    diffs.push(format!("{node}: in the ledger, not in the API"));
                }
            }
            *last.lock().unwrap() = diffs.join("; ");
            Ok(diffs.is_empty().then_some(()))
        },
    )
    .await;
    r.map_err(|e| format!("{e}: {}", last.lock().unwrap()))
}

/// Marks pods to finish now (KWOK completes or fails them), as their work ends.
fn finish(c: &Cluster, ns: &str, pods: &[&str], how: &str) -> Check {
    for p in pods {
        kubectl(
            c,
            &["annotate", "-n", ns, "pod", p, &format!("{how}=0s")],
            None,
        )?;
    }
    Ok(())
}

async fn wait_phase(c: &Cluster, ns: &str, name: &str, want: &str) -> Check {
    let api: Api<Pod> = Api::namespaced(c.client.clone(), ns);
    wait_for(
        &format!("{ns}/{name} {want}"),
        Duration::from_secs(60),
        || async {
            let p = api.get(name).await.map_err(|e| e.to_string())?;
            Ok((phase(&p) == want).then_some(()))
        },
    )
    .await
}

/// Waits until `name` is bound, returning its node and how long it took from `since`.
async fn bound_after(
    c: &Cluster,
    ns: &str,
    name: &str,
    since: Instant,
) -> Result<(String, Duration), String> {
    let api: Api<Pod> = Api::namespaced(c.client.clone(), ns);
    let node = wait_for(
        &format!("{ns}/{name} bound"),
        Duration::from_secs(60),
        || async {
            let p = api.get(name).await.map_err(|e| e.to_string())?;
            Ok(node_of(&p).map(str::to_string))
        },
    )
    .await?;
    Ok((node, since.elapsed()))
}

/// Why a pod waits, in gpu-share's words: kube-scheduler's FailedScheduling message when it asked
/// the extender, and gpu-share's own `GpuShareUnschedulable` event when kube-scheduler's plugins
/// refused every node first (then the extender was never asked). Waits for the pod's refusal and
/// for gpu-share's word on it.
async fn why_waiting(c: &Cluster, ns: &str, name: &str) -> Result<String, String> {
    let text = why_waiting_in(c, ns, name).await?;
    eprintln!("cluster test:   {ns}/{name} waits: {text}");
    Ok(text)
}

async fn why_waiting_in(c: &Cluster, ns: &str, name: &str) -> Result<String, String> {
    let scheduler = failed_scheduling(c, ns, name).await?;
    let events: Api<Event> = Api::namespaced(c.client.clone(), ns);
    let uid = pod_uid(c, ns, name).await?;
    let field = format!("involvedObject.name={name},involvedObject.uid={uid}");
    wait_for(
        &format!("gpu-share's word on why {ns}/{name} waits"),
        Duration::from_secs(60),
        || async {
            let list = events
                .list(&ListParams::default().fields(&field))
                .await
                .map_err(|e| format!("list events: {e}"))?;
            let mut words: Vec<String> = list
                .items
                .into_iter()
                .filter(|e| {
                    matches!(
                        e.reason.as_deref(),
                        Some("FailedScheduling" | "GpuShareUnschedulable")
                    )
                })
                .filter_map(|e| e.message)
                .collect();
            words.push(scheduler.clone());
            let text = words.join(" | ");
            // The explainer's note, or a sentence only the extender's filter writes.
            let said = text.contains("gpu-share: ")
                || gpu_share::packing::Reason::all_messages().any(|w| text.contains(w));
            Ok(said.then_some(text))
        },
    )
    .await
}

async fn namespace(c: &Cluster, ns: &str) -> Check {
    c.namespace(ns, json!({})).await
}

// ---- 1. the AKS time-slicing walkthrough -------------------------------------------------------

async fn aks_time_slicing(c: &Cluster) -> Check {
    let ns = "aks-ts";
    namespace(c, ns).await?;
    // One A100 80GB time-sliced into 4 replicas; five pods, each a quarter of a GPU.
    apply(
        c,
        ns,
        &job(
            "samples-tf-mnist-demo",
            5,
            5,
            template(
                json!({"gpu-share": "timeslice-25"}),
                Some("aks-a100-ts4"),
                "OnFailure",
            ),
        ),
    )?;
    let waiting = wait_pods(c, ns, 4, 1).await?;
    let fifth = waiting[0].clone();
    let message = why_waiting(c, ns, &fifth).await?;
    ensure(
        message.contains("no free GPU replica on this node")
            || message.contains("time-slicing budget"),
        format!("the fifth pod's event does not give gpu-share's reason: {message}"),
    )?;
    ledger_is_the_api(c, "four of five Job pods bound").await?;
    let pods = pods_of(c, ns).await?;
    let first = pods
        .iter()
        .find(|(_, p)| node_of(p).is_some())
        .map(|(n, _)| n.clone())
        .ok_or("no bound Job pod")?;
    finish(c, ns, &[&first], COMPLETE)?;
    wait_phase(c, ns, &first, "Succeeded").await?;
    let (node, took) = bound_after(c, ns, &fifth, Instant::now()).await?;
    ensure(
        node == "aks-a100-ts4" && took <= REBIND,
        format!(
            "the fifth pod was bound to {node} {took:?} after the first completed (at most {REBIND:?})"
        ),
    )?;
    ledger_is_the_api(c, "the first Job pod completed").await?;
    let rest: Vec<String> = pods_of(c, ns)
        .await?
        .into_iter()
        .filter(|(_, p)| live(p))
        .map(|(n, _)| n)
        .collect();
    finish(
        c,
        ns,
        &rest.iter().map(String::as_str).collect::<Vec<_>>(),
        COMPLETE,
    )?;
    wait_for("Job complete", Duration::from_secs(60), || async {
        let out = kubectl(
            c,
            &[
                "get",
                "job",
                "-n",
                ns,
                "samples-tf-mnist-demo",
                "-o",
                "json",
            ],
            None,
        )?;
        let j: Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
        let done = j["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Complete" && c["status"] == "True");
        Ok((done && j["status"]["succeeded"] == 5).then_some(()))
    })
    .await?;
    ledger_is_the_api(c, "the Job completed").await?;
    ensure(
        ledger(c)?["aks-a100-ts4"]["pods"]
            .as_array()
            .is_some_and(|p| p.is_empty()),
        "the completed Job's pods are still held",
    )
}

// ---- 2. MIG all-1g.10gb, a Deployment ------------------------------------------------------------

async fn mig_deployment(c: &Cluster) -> Check {
    let ns = "mig-deploy";
    namespace(c, ns).await?;
    let t = || {
        template(
            json!({"gpu-share": "mig-1g.10gb"}),
            Some("a100-mig-1g"),
            "Always",
        )
    };
    apply(c, ns, &deployment("inference", 8, t()))?;
    let waiting = wait_pods(c, ns, 7, 1).await?;
    let message = why_waiting(c, ns, &waiting[0]).await?;
    ensure(
        message.contains("no free MIG device of the requested profile"),
        format!("the eighth replica's event does not give gpu-share's reason: {message}"),
    )?;
    // A controller's pod went through the webhook: generateName, owner, the MIG limit.
    let pods = pods_of(c, ns).await?;
    let p = pods.values().next().ok_or("no pod")?;
    let limits = limits_of(p);
    ensure(
        p.metadata.generate_name.is_some()
            && p.metadata
                .owner_references
                .as_ref()
                .is_some_and(|o| o.iter().any(|o| o.kind == "ReplicaSet"))
            && limits.get("nvidia.com/mig-1g.10gb").map(String::as_str) == Some("1"),
        format!("a ReplicaSet's pod was not mutated as a pod: {limits:?}"),
    )?;
    ledger_is_the_api(c, "seven of eight replicas bound").await?;
    kubectl(
        c,
        &["scale", "-n", ns, "deployment/inference", "--replicas=7"],
        None,
    )?;
    wait_pods(c, ns, 7, 0).await?;
    ledger_is_the_api(c, "scaled to 7").await?;
    let mig = &ledger(c)?["a100-mig-1g"]["mig"]["1g.10gb"];
    ensure(
        mig == "7/7",
        format!("the ledger counts {mig} 1g.10gb devices"),
    )
}

// ---- 3. a mixed MIG layout -----------------------------------------------------------------------

async fn mixed_layout(c: &Cluster) -> Check {
    let ns = "mig-layout";
    namespace(c, ns).await?;
    let t = |class: &str| {
        template(
            json!({"gpu-share": class}),
            Some("a100-mig-layout"),
            "Always",
        )
    };
    apply(c, ns, &deployment("small", 10, t("mig-1g.10gb")))?;
    wait_pods(c, ns, 10, 0).await?;
    apply(c, ns, &deployment("large", 5, t("mig-3g.40gb")))?;
    let waiting = wait_pods(c, ns, 14, 1).await?;
    let message = why_waiting(c, ns, &waiting[0]).await?;
    ensure(
        waiting[0].starts_with("large-")
            && message.contains("no free MIG device of the requested profile"),
        format!(
            "the fifth 3g.40gb pod ({}) waits for: {message}",
            waiting[0]
        ),
    )?;
    // Four 1g.10gb devices are free, and the 3g.40gb pod took none of them.
    let n = &ledger(c)?["a100-mig-layout"];
    ensure(
        n["mig"]["1g.10gb"] == "10/14" && n["mig"]["3g.40gb"] == "4/4",
        format!("the ledger's MIG devices: {}", n["mig"]),
    )?;
    ledger_is_the_api(c, "both profiles placed").await?;
    kubectl(
        c,
        &["scale", "-n", ns, "deployment/small", "--replicas=14"],
        None,
    )?;
    wait_pods(c, ns, 18, 1).await?;
    ledger_is_the_api(c, "1g.10gb filled").await?;
    kubectl(
        c,
        &["scale", "-n", ns, "deployment/large", "--replicas=4"],
        None,
    )?;
    wait_pods(c, ns, 18, 0).await?;
    ledger_is_the_api(c, "3g.40gb scaled to 4").await
}

// ---- 4. MPS, a StatefulSet -----------------------------------------------------------------------

async fn mps_statefulset(c: &Cluster) -> Check {
    let ns = "mps-sts";
    namespace(c, ns).await?;
    let mut t = template(
        json!({"gpu-share": "mps-25"}),
        Some("h100-mps-4x2"),
        "Always",
    );
    t["metadata"]["labels"] = json!({"app": "workers"});
    let sts = json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "workers"},
        "spec": {"replicas": 9, "serviceName": "workers", "podManagementPolicy": "Parallel",
                 "selector": {"matchLabels": {"app": "workers"}}, "template": t},
    });
    apply(c, ns, &sts)?;
    let waiting = wait_pods(c, ns, 8, 1).await?;
    let message = why_waiting(c, ns, &waiting[0]).await?;
    ensure(
        message.contains("no free GPU replica on this node"),
        format!("the ninth worker waits for: {message}"),
    )?;
    for (name, p) in pods_of(c, ns).await? {
        let spec = p.spec.as_ref().unwrap();
        let limits = limits_of(&p);
        // The shipped policy injects hostIPC for MPS (mps.hostIPC: true).
        ensure(
            spec.host_ipc == Some(true)
                && limits.get("nvidia.com/gpu").map(String::as_str) == Some("1"),
            format!(
                "worker {name}: hostIPC {:?}, limits {limits:?}",
                spec.host_ipc
            ),
        )?;
    }
    let n = &ledger(c)?["h100-mps-4x2"];
    ensure(
        n["slots"] == "8/8",
        format!("the ledger counts {} MPS replicas", n["slots"]),
    )?;
    ledger_is_the_api(c, "eight MPS workers").await?;
    // Or not, per policy: with mps.hostIPC false (NVIDIA's device-plugin MPS mounts the pipe
    // itself), the workers created after the policy changed get no hostIPC.
    kubectl(
        c,
        &["scale", "-n", ns, "statefulset/workers", "--replicas=4"],
        None,
    )?;
    wait_pods(c, ns, 4, 0).await?;
    let path = c.dir.join("policy/policy.yaml");
    let shipped = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
    let without = shipped.replace("  hostIPC: true", "  hostIPC: false");
    ensure(
        without != shipped,
        "the shipped policy has no mps.hostIPC: true to turn off",
    )?;
    std::fs::write(&path, &without).map_err(|e| e.to_string())?;
    let result = async {
        webhook_injects_host_ipc(c, ns, false).await?;
        kubectl(c, &["scale", "-n", ns, "statefulset/workers", "--replicas=9"], None)?;
        wait_pods(c, ns, 8, 1).await?;
        for (name, p) in pods_of(c, ns).await? {
            let ordinal: u32 = name.rsplit('-').next().and_then(|o| o.parse().ok()).unwrap_or(0);
            let ipc = p.spec.as_ref().and_then(|s| s.host_ipc);
            let want = if ordinal < 4 { Some(true) } else { None };
            ensure(
                ipc == want,
                format!("worker {name}: hostIPC {ipc:?}, expected {want:?} (created after mps.hostIPC: false: {})", ordinal >= 4),
            )?;
        }
        ledger_is_the_api(c, "workers recreated under mps.hostIPC: false").await
    }
    .await;
    std::fs::write(&path, &shipped).map_err(|e| e.to_string())?;
    webhook_injects_host_ipc(c, ns, true).await?;
    result
}

/// Waits until the webhook has reloaded a policy under which an `mps-25` pod gets hostIPC
/// (`inject`) or not: a pod created with `--dry-run=server` shows what it writes.
async fn webhook_injects_host_ipc(c: &Cluster, ns: &str, inject: bool) -> Check {
    let probe = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "policy-probe", "annotations": {"gpu-share": "mps-25"}},
        "spec": {"containers": [{"name": "c", "image": "x"}]}});
    wait_for(
        &format!("the webhook to reload a policy with mps.hostIPC: {inject}"),
        Duration::from_secs(60),
        || async {
            let out = kubectl(
                c,
                &[
                    "create",
                    "-n",
                    ns,
                    "--dry-run=server",
                    "-o",
                    "json",
                    "-f",
                    "-",
                ],
                Some(&probe.to_string()),
            )?;
            let p: Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
            Ok((p["spec"]["hostIPC"].as_bool().unwrap_or(false) == inject).then_some(()))
        },
    )
    .await
}

// ---- 5. exclusive training beside shared pods ----------------------------------------------------

async fn exclusive_training(c: &Cluster) -> Check {
    let r = training(c).await;
    if r.is_err() {
        // A trainer left waiting would take the whole GPUs of a node a later point adds.
        let _ = kubectl(
            c,
            &["-n", "training", "delete", "job", "train", "--wait=true"],
            None,
        );
    }
    r
}

async fn training(c: &Cluster) -> Check {
    let ns = "training";
    namespace(c, ns).await?;
    // Not pinned: whole GPUs only, so never a shared node, whatever is free there.
    apply(
        c,
        ns,
        &job(
            "train",
            3,
            3,
            template(json!({"gpu-share": "exclusive-2"}), None, "Never"),
        ),
    )?;
    let waiting = wait_pods(c, ns, 2, 1).await?;
    let message = why_waiting(c, ns, &waiting[0]).await?;
    ensure(
        message.contains("not enough free whole GPUs"),
        format!("the third trainer waits for: {message}"),
    )?;
    let pods = pods_of(c, ns).await?;
    let nodes: BTreeSet<&str> = pods.values().filter_map(node_of).collect();
    ensure(
        nodes == BTreeSet::from(["a100-plain-4"]),
        format!("exclusive pods landed on {nodes:?}"),
    )?;
    ledger_is_the_api(c, "two trainers bound").await?;
    let running: Vec<&str> = pods
        .iter()
        .filter(|(_, p)| node_of(p).is_some())
        .map(|(n, _)| n.as_str())
        .collect();
    finish(c, ns, &running[..1], COMPLETE)?;
    wait_phase(c, ns, running[0], "Succeeded").await?;
    let (node, took) = bound_after(c, ns, &waiting[0], Instant::now()).await?;
    ensure(
        node == "a100-plain-4" && took <= REBIND,
        format!("the third trainer was bound to {node} {took:?} after one finished"),
    )?;
    ledger_is_the_api(c, "a trainer finished").await
}

// ---- lifecycles ----------------------------------------------------------------------------------

/// A pod that fails releases its share at once, and a waiting pod of its class is bound.
async fn failed_pod(c: &Cluster) -> Check {
    let ns = "aks-ts";
    let pod = |name: &str| {
        let mut t = template(
            json!({"gpu-share": "timeslice-100"}),
            Some("aks-a100-ts4"),
            "Never",
        );
        t["metadata"]["name"] = json!(name);
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": t["metadata"], "spec": t["spec"]})
    };
    apply(c, ns, &pod("crashes"))?;
    wait_phase(c, ns, "crashes", "Running").await?;
    apply(c, ns, &pod("next"))?;
    let message = why_waiting(c, ns, "next").await?;
    ensure(
        message.contains("time-slicing budget") || message.contains("no free GPU replica"),
        format!("the next pod waits for: {message}"),
    )?;
    finish(c, ns, &["crashes"], FAIL)?;
    wait_phase(c, ns, "crashes", "Failed").await?;
    let (_, took) = bound_after(c, ns, "next", Instant::now()).await?;
    ensure(
        took <= REBIND,
        format!("the next pod was bound {took:?} after the failure"),
    )?;
    ledger_is_the_api(c, "a pod failed").await?;
    c.delete_pods(ns).await?;
    ledger_is_the_api(c, "the time-sliced pods deleted").await
}

/// `kubectl drain` evicts the node's gpu-share pods; their shares are released, the node is
/// cordoned and nothing new is bound there; uncordoned, the Deployment's pods come back.
async fn drain(c: &Cluster) -> Check {
    let ns = "mig-deploy";
    let out = kubectl(
        c,
        &[
            "drain",
            "a100-mig-1g",
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=120s",
        ],
        None,
    )?;
    ensure(
        out.contains("drained"),
        format!("kubectl drain said: {out}"),
    )?;
    // The ReplicaSet recreates them; pinned to the cordoned node, they wait.
    wait_pods(c, ns, 0, 7).await?;
    ledger_is_the_api(c, "the drain").await?;
    let n = &ledger(c)?["a100-mig-1g"];
    ensure(
        n["pods"].as_array().is_some_and(|p| p.is_empty()) && n["mig"]["1g.10gb"] == "0/7",
        format!("the drained node still holds {}", n["pods"]),
    )?;
    let node: Node = Api::all(c.client.clone())
        .get("a100-mig-1g")
        .await
        .map_err(|e| e.to_string())?;
    ensure(
        node.spec.and_then(|s| s.unschedulable) == Some(true),
        "the drained node is not cordoned",
    )?;
    kubectl(c, &["uncordon", "a100-mig-1g"], None)?;
    wait_pods(c, ns, 7, 0).await?;
    ledger_is_the_api(c, "uncordon").await
}

/// A Deployment scaled to 0 frees everything it held.
async fn scaled_to_zero(c: &Cluster) -> Check {
    let ns = "mig-deploy";
    kubectl(
        c,
        &["scale", "-n", ns, "deployment/inference", "--replicas=0"],
        None,
    )?;
    wait_pods(c, ns, 0, 0).await?;
    ledger_is_the_api(c, "scaled to 0").await?;
    let n = &ledger(c)?["a100-mig-1g"];
    ensure(
        n["mig"]["1g.10gb"] == "0/7",
        format!("scaled to 0, the node still counts {}", n["mig"]),
    )
}

/// mig-manager turns a100-mig-layout into all-3g.40gb (labels and allocatable follow) while two
/// 1g.10gb pods still hold devices: they stay in the ledger, new 3g.40gb pods take the new
/// devices of GPUs the old ones cannot be on, and wait for the rest until the old pods leave.
async fn mig_layout_change(c: &Cluster) -> Check {
    let ns = "mig-layout";
    kubectl(
        c,
        &["scale", "-n", ns, "deployment/large", "--replicas=0"],
        None,
    )?;
    kubectl(
        c,
        &["scale", "-n", ns, "deployment/small", "--replicas=2"],
        None,
    )?;
    wait_pods(c, ns, 2, 0).await?;
    let old: BTreeSet<String> = pods_of(c, ns).await?.into_keys().collect();
    let node = "a100-mig-layout";
    let mut labels = serde_json::Map::new();
    labels.insert("nvidia.com/mig.config".into(), json!("all-3g.40gb"));
    for (k, v) in [
        ("count", "8"),
        ("memory", "40192"),
        ("multiprocessors", "42"),
        ("slices.gi", "3"),
        ("slices.ci", "3"),
    ] {
        labels.insert(format!("nvidia.com/mig-3g.40gb.{k}"), json!(v));
        labels.insert(format!("nvidia.com/mig-1g.10gb.{k}"), Value::Null);
    }
    kubectl(
        c,
        &[
            "patch",
            "node",
            node,
            "--type=merge",
            "-p",
            &json!({"metadata": {"labels": labels}}).to_string(),
        ],
        None,
    )?;
    let resources = json!({"nvidia.com/mig-1g.10gb": null, "nvidia.com/mig-3g.40gb": "8"});
    kubectl(
        c,
        &[
            "patch",
            "node",
            node,
            "--subresource=status",
            "--type=merge",
            "-p",
            &json!({"status": {"capacity": resources, "allocatable": resources}}).to_string(),
        ],
        None,
    )?;
    wait_for(
        "the ledger to read the new layout",
        Duration::from_secs(30),
        || async { Ok((ledger(c)?[node]["mig"]["3g.40gb"] == "0/8").then_some(())) },
    )
    .await?;
    ledger_is_the_api(c, "the layout changed").await?;
    let held = ledger_pods(&ledger(c)?[node]);
    let expected: BTreeSet<String> = old.iter().map(|p| format!("{ns}/{p}")).collect();
    ensure(
        held == expected,
        format!("the old layout's pods are not kept: ledger {held:?}, API {expected:?}"),
    )?;
    // Two old devices may sit on two GPUs: the new devices of the other two (four) are offered.
    apply(
        c,
        ns,
        &deployment(
            "after",
            5,
            template(json!({"gpu-share": "mig-3g.40gb"}), Some(node), "Always"),
        ),
    )?;
    let waiting = wait_pods(c, ns, 6, 1).await?;
    let message = why_waiting(c, ns, &waiting[0]).await?;
    ensure(
        message.contains("MIG layout changed while pods still hold devices of the old one"),
        format!("the fifth new pod waits for: {message}"),
    )?;
    ledger_is_the_api(c, "new pods on the new layout").await?;
    kubectl(
        c,
        &["scale", "-n", ns, "deployment/small", "--replicas=0"],
        None,
    )?;
    let since = Instant::now();
    wait_pods(c, ns, 5, 0).await?;
    ensure(
        since.elapsed() <= Duration::from_secs(30),
        format!(
            "the last new pod waited {:?} after the old ones left",
            since.elapsed()
        ),
    )?;
    ledger_is_the_api(c, "the old layout's pods gone").await
}

/// A namespace deleted with its gpu-share pods frees their shares (kube-controller-manager
/// deletes them).
async fn namespace_deleted(c: &Cluster) -> Check {
    kubectl(
        c,
        &[
            "delete",
            "namespace",
            "mig-layout",
            "--wait=true",
            "--timeout=120s",
        ],
        None,
    )?;
    ledger_is_the_api(c, "namespace mig-layout deleted").await?;
    let n = &ledger(c)?["a100-mig-layout"];
    ensure(
        n["pods"].as_array().is_some_and(|p| p.is_empty()),
        format!("the deleted namespace's pods are still held: {}", n["pods"]),
    )
}

/// A node deleted under its pods: its holdings go with it, and the StatefulSet's pods, once
/// kube-controller-manager's pod GC has removed them, are recreated and wait.
async fn node_deleted(c: &Cluster) -> Check {
    let node = "h100-mps-4x2";
    kubectl(c, &["delete", "node", node, "--wait=true"], None)?;
    wait_for(
        "the ledger to drop the node",
        Duration::from_secs(30),
        || async { Ok((!ledger(c)?.contains_key(node)).then_some(())) },
    )
    .await?;
    ledger_is_the_api(c, "the node deleted").await?;
    // Pod GC deletes pods bound to a node that is gone, after its quarantine of 40 s and on its
    // 20 s period (then the StatefulSet recreates them): a minute or so, longer on a busy machine.
    wait_pods_within(c, "mps-sts", 0, 9, Duration::from_secs(240)).await?;
    ledger_is_the_api(c, "the orphaned pods collected").await
}

// ---- templates checked at apply time -------------------------------------------------------------

fn validate_requests(c: &Cluster) -> Result<f64, String> {
    let text = c.admin_text("WEBHOOK_ADMIN", "/metrics")?;
    Ok(text
        .lines()
        .filter(|l| {
            l.starts_with("gpu_share_requests_total{") && l.contains("endpoint=\"validate\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

async fn templates(c: &Cluster) -> Check {
    let ns = "templates";
    namespace(c, ns).await?;
    let t = |class: &str| template(json!({"gpu-share": class}), Some("a100-plain-4"), "Always");
    // A typo: refused at apply, in the pod webhook's words, with the template's path.
    let bad = deployment("typo", 3, t("mig-7g.79gb"));
    let err = apply(c, ns, &bad)
        .err()
        .ok_or("a Deployment asking mig-7g.79gb was admitted")?;
    ensure(
        err.contains("spec.template: unknown MIG profile \"7g.79gb\" (did you mean 7g.80gb"),
        format!("the refusal does not say what is wrong where: {err}"),
    )?;
    let err = kubectl(
        c,
        &["apply", "-n", ns, "--dry-run=server", "-f", "-"],
        Some(&bad.to_string()),
    )
    .err()
    .ok_or("--dry-run=server admitted the bad Deployment")?;
    ensure(
        err.contains("spec.template: unknown MIG profile"),
        err.clone(),
    )?;
    let cron = json!({
        "apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "nightly"},
        "spec": {"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": template(
            json!({"gpu-share": "timeslice-150"}), None, "OnFailure")}}},
    });
    let err = apply(c, ns, &cron)
        .err()
        .ok_or("a CronJob asking timeslice-150 was admitted")?;
    ensure(
        err.contains("spec.jobTemplate.spec.template: "),
        format!("the CronJob's refusal does not name its template: {err}"),
    )?;
    // A good one: admitted, and its template is as written (the pod webhook writes the pods).
    let before = validate_requests(c)?;
    let good = deployment("serve", 0, t("exclusive-1"));
    kubectl(
        c,
        &["apply", "-n", ns, "--dry-run=server", "-f", "-"],
        Some(&good.to_string()),
    )?;
    ensure(
        kubectl(c, &["get", "-n", ns, "deployment", "serve"], None).is_err(),
        "--dry-run=server created the Deployment",
    )?;
    apply(c, ns, &good)?;
    let stored: Value = serde_json::from_str(&kubectl(
        c,
        &["get", "-n", ns, "deployment", "serve", "-o", "json"],
        None,
    )?)
    .map_err(|e| e.to_string())?;
    ensure(
        stored["spec"]["template"]["metadata"]["annotations"]
            == json!({"gpu-share": "exclusive-1"})
            && stored["spec"]["template"]["spec"]
                .get("tolerations")
                .is_none()
            && stored["spec"]["template"]["spec"]["containers"][0].get("resources")
                == Some(&json!({})),
        format!("the template was changed: {}", stored["spec"]["template"]),
    )?;
    ensure(
        validate_requests(c)? > before,
        "the annotated Deployment never reached the template check",
    )?;
    // An UPDATE that breaks the annotation is refused; one that leaves the template alone is not.
    let err = kubectl(
        c,
        &[
            "patch",
            "-n",
            ns,
            "deployment",
            "serve",
            "--type=merge",
            "-p",
            r#"{"spec":{"template":{"metadata":{"annotations":{"gpu-share":"exclusive-two"}}}}}"#,
        ],
        None,
    )
    .err()
    .ok_or("an UPDATE to gpu-share: exclusive-two was admitted")?;
    ensure(
        err.contains("spec.template: "),
        format!("the UPDATE's refusal: {err}"),
    )?;
    kubectl(
        c,
        &["label", "-n", ns, "deployment", "serve", "tier=web"],
        None,
    )?;
    // No gpu-share annotation: never sent (the template check's requests do not move), and
    // admitted with the webhook down.
    let before = validate_requests(c)?;
    apply(
        c,
        ns,
        &deployment("plain", 0, template(json!({"team": "web"}), None, "Always")),
    )?;
    ensure(
        validate_requests(c)? == before,
        "a Deployment without gpu-share annotations was sent to the template check",
    )?;
    c.stop("webhook");
    let down = apply(
        c,
        ns,
        &deployment("plain-2", 0, template(json!({}), None, "Always")),
    );
    let annotated = apply(c, ns, &deployment("gpu-2", 0, t("mps-25")));
    c.start_process("webhook");
    c.wait_ready("WEBHOOK_ADMIN", Duration::from_secs(60))
        .await?;
    down.map_err(|e| format!("with the webhook down, a plain Deployment was refused: {e}"))?;
    annotated.map_err(|e| {
        format!(
            "with the webhook down, an annotated Deployment was refused (the check fails open): {e}"
        )
    })?;
    Ok(())
}

#[tokio::test]
#[ignore = "needs Go and a few minutes: cargo test --test workloads -- --ignored (CI runs it)"]
async fn workloads_on_a_cluster_whose_pods_run() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let c = Cluster::start_with(
        common::BIN,
        "GPU_SHARE_WORKLOADS_CLUSTER_DIR",
        Some("workload-nodes.yaml"),
    )
    .await;
    let mut failures = Vec::new();
    point(&mut failures, "templates checked at apply", templates(&c)).await;
    point(
        &mut failures,
        "1. AKS time-slicing Job",
        aks_time_slicing(&c),
    )
    .await;
    point(&mut failures, "2. MIG Deployment", mig_deployment(&c)).await;
    point(&mut failures, "3. mixed MIG layout", mixed_layout(&c)).await;
    point(&mut failures, "4. MPS StatefulSet", mps_statefulset(&c)).await;
    point(
        &mut failures,
        "5. exclusive training Job",
        exclusive_training(&c),
    )
    .await;
    point(&mut failures, "lifecycle: a Failed pod", failed_pod(&c)).await;
    point(&mut failures, "lifecycle: drain", drain(&c)).await;
    point(&mut failures, "lifecycle: scaled to 0", scaled_to_zero(&c)).await;
    point(
        &mut failures,
        "lifecycle: MIG layout changed",
        mig_layout_change(&c),
    )
    .await;
    point(
        &mut failures,
        "lifecycle: namespace deleted",
        namespace_deleted(&c),
    )
    .await;
    point(&mut failures, "lifecycle: node deleted", node_deleted(&c)).await;
    point(
        &mut failures,
        "per-GPU sharing",
        per_gpu::per_gpu_sharing(&c),
    )
    .await;
    point(&mut failures, "MPS per GPU", per_gpu_mps::per_gpu_mps(&c)).await;
    point(&mut failures, "quotas", quota::quotas(&c)).await;
    point(&mut failures, "kueue", kueue::kueue(&c)).await;
    point(&mut failures, "dra", dra::dra(&c)).await;
    point(&mut failures, "default spread", spread::default_spread(&c)).await;
    point(
        &mut failures,
        "defragmentation plan",
        defrag::defrag_plan(&c),
    )
    .await;
    point(
        &mut failures,
        "defragmentation moves",
        defrag::defrag_moves(&c),
    )
    .await;
    point(
        &mut failures,
        "defragmentation restart",
        defrag::defrag_restart(&c),
    )
    .await;
    assert!(
        failures.is_empty(),
        "{} point(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

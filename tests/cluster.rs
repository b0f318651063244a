//! gpu-share against a real control plane: kube-apiserver, etcd, kube-controller-manager and
//! kube-scheduler built from Kubernetes' own Go modules (tests/cluster/go.mod), KWOK in place of
//! the kubelets (pods run and finish), started by `tests/cluster/up.sh` with the shipped
//! manifests applied and gpu-share's webhook and extender running as local processes under the
//! shipped RBAC (see that script). Workloads (Deployments, Jobs, StatefulSets) are
//! tests/workloads.rs's.
//!
//! Run: `cargo test --test cluster -- --ignored` (builds the control plane on first use, into
//! ~/.cache/gpu-share; `GPU_SHARE_CLUSTER_DIR=DIR` reuses a cluster `up.sh DIR` started).
//! `.ci/run` runs it with `CI=true`; when run, it never skips: a cluster that does not come up
//! fails it.
//!
//! What it shows, each a named check that can fail:
//! 7. the shipped KubeSchedulerConfiguration, changed only in addresses, runs and takes its Lease;
//! 0. under the default policy a MIG pod asks for the form of the nodes that offer its profile
//!    (the later points run under `mig.strategy: mixed`);
//! 1. admission as documented for each class, refusals in words, matchConditions evaluated by
//!    the apiserver (webhook down: annotated pods refused, others admitted), gpu-share's own
//!    denial under Pod Security `baseline`;
//! 2. pods bound by the real kube-scheduler through the extender onto nodes of their class, and
//!    a pod that fits nowhere Pending with gpu-share's reasons grouped by kube-scheduler;
//! 3. no overcommit with 220 pods created at once, and at least 90% of the capacity bound;
//! 4. requeue: a pod waiting for capacity bound within 5 s of a holder's deletion, or of its
//!    finishing;
//! 5. preemption of pods of the preemptor's class only;
//! 6. an extender killed and restarted rebuilds the same ledger;
//! 8. the API server restarted under load: the ledger and the API agree afterwards;
//! 9. the nodes of tests/fixtures/nvidia/ (labelled by GFD's code, advertised by the device
//!    plugin's) read right and scheduled onto, under the mixed and the single MIG strategy;
//!    and the RBAC in manifests/ is enough (no 403 in any log), while a ClusterRole without
//!    `pods/binding create` fails a named check;
//! 10. under `enforcement.budgets: required`, a budgeted share goes only where its memory is held
//!     (gpu-share's sentence in the event where nothing holds it), and the pod says what holds it;
//! 11. the webhook keeps its own certificates (`--keep-certs`): the component's RBAC grants it
//!     just that, by name, and three minutes of renewals (a CA's too) refuse no pod
//!     (tests/cluster_points/keeper.rs).

mod common;
#[path = "cluster_points/keeper.rs"]
mod keeper;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::cluster::{Check, Cluster, ensure, failed_scheduling, point, wait_for};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

const SCHEDULER: &str = "gpu-share-scheduler";
const REQUEST: &str = "gpu-share.io/request";
const GPUS: &str = "gpu-share.io/gpus";

fn pod(name: &str, annotations: Value, spec: Value) -> Value {
    let mut p = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
        },
    });
    if let Value::Object(extra) = spec {
        for (k, v) in extra {
            p["spec"][k] = v;
        }
    }
    p
}

fn gpu_pod(name: &str, class: &str) -> Value {
    pod(name, json!({"gpu-share": class}), json!({}))
}

/// Creates a pod with kubectl, returning the object as admitted and the warnings the apiserver
/// sent back (kubectl prints them on stderr), or the refusal.
fn create(c: &Cluster, ns: &str, pod: &Value) -> Result<(Value, String), String> {
    let out = c.kubectl(
        &["create", "-n", ns, "-o", "json", "-f", "-"],
        Some(&pod.to_string()),
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        return Err(stderr);
    }
    let obj = serde_json::from_slice(&out.stdout).map_err(|e| format!("kubectl output: {e}"))?;
    Ok((obj, stderr))
}

fn annotation<'a>(p: &'a Value, key: &str) -> Option<&'a str> {
    p["metadata"]["annotations"][key].as_str()
}

fn limits(p: &Value) -> BTreeMap<String, String> {
    p["spec"]["containers"][0]["resources"]["limits"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

fn env_of(p: &Value) -> BTreeMap<String, String> {
    p["spec"]["containers"][0]["env"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| Some((e["name"].as_str()?.into(), e["value"].as_str()?.into())))
                .collect()
        })
        .unwrap_or_default()
}

fn has_toleration(p: &Value, key: &str) -> bool {
    p["spec"]["tolerations"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t["key"] == key))
}

/// The required node affinity's match expressions, as "key op values" strings.
fn affinity(p: &Value) -> Vec<String> {
    let terms = &p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    terms
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|t| {
            t["matchExpressions"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|e| {
            let values: Vec<&str> = e["values"]
                .as_array()
                .map(|v| v.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            format!(
                "{} {} [{}]",
                e["key"].as_str().unwrap_or(""),
                e["operator"].as_str().unwrap_or(""),
                values.join(",")
            )
        })
        .collect()
}

// ---- the manifests -------------------------------------------------------------------------------

/// up.sh applied every object of the self-signed overlay; the gpu-share namespace asks Pod
/// Security to warn at `restricted`, so a Deployment whose pods fell short would have drawn a
/// warning on that apply.
async fn manifests_apply_cleanly(c: &Cluster) -> Check {
    let out = c.kubectl(&["get", "namespace", "gpu-share", "-o", "json"], None);
    let ns: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    ensure(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/warn"] == "restricted",
        "namespace gpu-share does not ask Pod Security to warn at restricted",
    )?;
    let stderr =
        std::fs::read_to_string(c.dir.join("logs/apply.err")).map_err(|e| e.to_string())?;
    ensure(
        !stderr.contains("Warning"),
        format!("applying the manifests drew warnings: {stderr}"),
    )?;
    let applied =
        std::fs::read_to_string(c.dir.join("logs/apply.out")).map_err(|e| e.to_string())?;
    for object in [
        "deployment.apps/gpu-share-webhook",
        "deployment.apps/gpu-share-scheduler",
        "mutatingwebhookconfiguration.admissionregistration.k8s.io/gpu-share",
        "clusterrole.rbac.authorization.k8s.io/gpu-share-extender",
        "networkpolicy.networking.k8s.io/gpu-share-webhook",
        "networkpolicy.networking.k8s.io/gpu-share-scheduler",
    ] {
        ensure(
            applied.contains(object),
            format!("{object} was not applied: {applied}"),
        )?;
    }
    // The network policies as shipped, and narrowed as manifests/README.md shows, pass the API
    // server's validation (this cluster has no network plugin to enforce them).
    let file = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/manifests/base/networkpolicy.yaml"
    );
    let out = c.kubectl(&["apply", "--dry-run=server", "-f", file], None);
    ensure(
        out.status.success(),
        format!(
            "server-side dry run of {file}: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    )?;
    let out = c.kubectl(
        &[
            "get",
            "networkpolicy",
            "-n",
            "gpu-share",
            "gpu-share-webhook",
            "-o",
            "json",
        ],
        None,
    );
    let mut np: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    np["spec"]["ingress"][0]["from"] = json!([{"ipBlock": {"cidr": "10.0.0.0/16"}}]);
    let out = c.kubectl(
        &["apply", "--dry-run=server", "-f", "-"],
        Some(&np.to_string()),
    );
    ensure(
        out.status.success(),
        format!(
            "server-side dry run of the narrowed policy: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    )?;
    Ok(())
}

// ---- 7. the shipped scheduler configuration ---------------------------------------------------

async fn shipped_scheduler_config(c: &Cluster) -> Check {
    let shipped: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("manifests/base/scheduler-config.yaml"),
        )
        .map_err(|e| e.to_string())?,
    )
    .map_err(|e| format!("manifests/base/scheduler-config.yaml: {e}"))?;
    let running: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(c.dir.join("scheduler-config.yaml")).map_err(|e| e.to_string())?,
    )
    .map_err(|e| format!("the running scheduler's config: {e}"))?;
    // Only the kubeconfig, the extender's address and its CA may differ.
    let mut normalized = running.clone();
    normalized["clientConnection"]["kubeconfig"] =
        shipped["clientConnection"]["kubeconfig"].clone();
    normalized["extenders"][0]["urlPrefix"] = shipped["extenders"][0]["urlPrefix"].clone();
    normalized["extenders"][0]["tlsConfig"]["caFile"] =
        shipped["extenders"][0]["tlsConfig"]["caFile"].clone();
    ensure(
        normalized == shipped,
        "the running KubeSchedulerConfiguration differs from the shipped one beyond the kubeconfig, urlPrefix and caFile",
    )?;
    // kube-scheduler read it: it is the leader of the Lease the config names.
    let le = &shipped["leaderElection"];
    let (ns, name) = (
        le["resourceNamespace"].as_str().unwrap_or_default(),
        le["resourceName"].as_str().unwrap_or_default(),
    );
    let out = c.kubectl(
        &[
            "-n",
            ns,
            "get",
            "lease",
            name,
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ],
        None,
    );
    let holder = String::from_utf8_lossy(&out.stdout).trim().to_string();
    ensure(
        out.status.success() && !holder.is_empty(),
        format!(
            "Lease {ns}/{name} has no holder: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    )?;
    // client-go's leader election logs the line structured since 1.35, as text before
    // (docs/kubernetes-versions.md: the test runs on 1.30 too).
    let version = c
        .client
        .apiserver_version()
        .await
        .map_err(|e| format!("GET /version: {e}"))?;
    let minor: u32 = version
        .minor
        .trim_end_matches('+')
        .parse()
        .map_err(|e| format!("server minor {:?}: {e}", version.minor))?;
    let acquired = if minor >= 35 {
        format!("\"Successfully acquired lease\" lock=\"{ns}/{name}\"")
    } else {
        format!("] successfully acquired lease {ns}/{name}\n")
    };
    let log = c.log("kube-scheduler");
    ensure(
        log.contains(&acquired),
        "kube-scheduler's log does not say it acquired the configured Lease",
    )
}

// ---- 1. admission ------------------------------------------------------------------------------

async fn admission(c: &Cluster) -> Check {
    let ns = "admission";
    c.namespace(ns, json!({})).await?;

    // Untouched without the annotation.
    let (plain, _) = create(c, ns, &pod("plain", json!({}), json!({})))?;
    ensure(
        plain["spec"]["schedulerName"] == "default-scheduler"
            && annotation(&plain, REQUEST).is_none()
            && !has_toleration(&plain, "nvidia.com/gpu")
            && plain["spec"]["hostIPC"].is_null()
            && plain["spec"]["runtimeClassName"].is_null()
            && limits(&plain).is_empty()
            && affinity(&plain).is_empty(),
        format!(
            "a pod without the annotation was changed: {}",
            plain["spec"]
        ),
    )?;

    // No RuntimeClass "nvidia" yet (one left by an earlier run against this cluster is removed,
    // and the webhook restarted so that it does not answer from its cache): none set, and a
    // warning says so.
    let rc = c.kubectl(
        &[
            "delete",
            "runtimeclass",
            "nvidia",
            "--ignore-not-found",
            "-o",
            "name",
        ],
        None,
    );
    if !String::from_utf8_lossy(&rc.stdout).trim().is_empty() {
        c.stop("webhook");
        c.start_process("webhook");
        c.wait_ready("WEBHOOK_ADMIN", Duration::from_secs(60))
            .await?;
    }
    let (p, warnings) = create(c, ns, &gpu_pod("no-runtimeclass", "timeslice-50"))?;
    ensure(
        p["spec"]["runtimeClassName"].is_null()
            && warnings.contains("Warning:")
            && warnings.contains("RuntimeClass")
            && warnings.contains("nvidia"),
        format!(
            "without RuntimeClass nvidia: runtimeClassName {} and warnings {warnings:?}",
            p["spec"]["runtimeClassName"]
        ),
    )?;

    // A misspelled profile is refused with the nearest names.
    match create(c, ns, &gpu_pod("typo", "mig-7g.79gb")) {
        Ok(_) => return Err("a pod asking mig-7g.79gb was admitted".into()),
        Err(e) => ensure(
            e.contains("7g.79gb") && e.contains("did you mean") && e.contains("7g.80gb"),
            format!("the refusal does not name the nearest profile: {e}"),
        )?,
    }

    // The webhook down: the apiserver evaluates the shipped matchConditions, so only annotated
    // pods reach the (failing-closed) webhook.
    c.stop("webhook");
    let refused = create(c, ns, &gpu_pod("while-down", "mps-25"));
    let admitted = create(c, ns, &pod("plain-while-down", json!({}), json!({})));
    // A RuntimeClass now: the restarted webhook looks it up afresh.
    let rc = c.kubectl(
        &["apply", "-f", "-"],
        Some(
            &json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                    "metadata": {"name": "nvidia"}, "handler": "nvidia"})
            .to_string(),
        ),
    );
    c.start_process("webhook");
    c.wait_ready("WEBHOOK_ADMIN", Duration::from_secs(60))
        .await?;
    ensure(rc.status.success(), "create RuntimeClass nvidia")?;
    match refused {
        Ok(_) => return Err("an annotated pod was admitted while the webhook was down".into()),
        Err(e) => ensure(
            e.contains("failed calling webhook") && e.contains("pods.gpu-share.io"),
            format!("an annotated pod was refused, but not by the unreachable webhook: {e}"),
        )?,
    }
    ensure(
        admitted.is_ok(),
        format!(
            "a pod without the annotation was refused while the webhook was down: {:?}",
            admitted.err()
        ),
    )?;

    // Each class, mutated as documented.
    struct Want {
        class: &'static str,
        limit: (&'static str, &'static str),
        affinity: &'static [&'static str],
        env: &'static [(&'static str, &'static str)],
        host_ipc: bool,
    }
    let wants = [
        Want {
            class: "mig-1g.10gb",
            limit: ("nvidia.com/mig-1g.10gb", "1"),
            affinity: &[],
            env: &[("GPU_SHARE_CLASS", "mig-1g.10gb")],
            host_ipc: false,
        },
        Want {
            class: "mps-25",
            limit: ("nvidia.com/gpu", "1"),
            affinity: &[
                "nvidia.com/gpu.sharing-strategy In [mps]",
                "cloud.google.com/gke-gpu-sharing-strategy In [mps,MPS]",
            ],
            env: &[
                ("GPU_SHARE_CLASS", "mps-25"),
                ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25"),
            ],
            host_ipc: true,
        },
        Want {
            class: "timeslice-50",
            limit: ("nvidia.com/gpu", "1"),
            affinity: &[
                "nvidia.com/gpu.sharing-strategy In [time-slicing]",
                "cloud.google.com/gke-gpu-sharing-strategy In [time-sharing,TIME_SHARING]",
            ],
            env: &[("GPU_SHARE_CLASS", "timeslice-50")],
            host_ipc: false,
        },
        Want {
            class: "exclusive-2",
            limit: ("nvidia.com/gpu", "2"),
            affinity: &[
                "nvidia.com/gpu.sharing-strategy NotIn [mps,time-slicing]",
                "nvidia.com/gpu.slices.gi DoesNotExist []",
                "cloud.google.com/gke-gpu-sharing-strategy DoesNotExist []",
                "cloud.google.com/gke-gpu-partition-size DoesNotExist []",
            ],
            env: &[("GPU_SHARE_CLASS", "exclusive-2")],
            host_ipc: false,
        },
    ];
    for w in &wants {
        let name = format!("class-{}", w.class.replace('.', "-"));
        let (p, _) = create(c, ns, &gpu_pod(&name, w.class))
            .map_err(|e| format!("{}: refused: {e}", w.class))?;
        let lim = limits(&p);
        let env = env_of(&p);
        let aff = affinity(&p);
        let mut wrong = Vec::new();
        if lim.get(w.limit.0).map(String::as_str) != Some(w.limit.1) {
            wrong.push(format!("limits {lim:?}"));
        }
        if aff.iter().map(String::as_str).collect::<BTreeSet<_>>()
            != w.affinity.iter().copied().collect::<BTreeSet<_>>()
        {
            wrong.push(format!("affinity {aff:?}"));
        }
        if !w
            .env
            .iter()
            .all(|(k, v)| env.get(*k).map(String::as_str) == Some(*v))
            || !env.contains_key("GPU_SHARE_FRACTION")
        {
            wrong.push(format!("env {env:?}"));
        }
        if (p["spec"]["hostIPC"] == true) != w.host_ipc {
            wrong.push(format!("hostIPC {}", p["spec"]["hostIPC"]));
        }
        if !has_toleration(&p, "nvidia.com/gpu") {
            wrong.push("no nvidia.com/gpu toleration".into());
        }
        if p["spec"]["schedulerName"] != SCHEDULER {
            wrong.push(format!("schedulerName {}", p["spec"]["schedulerName"]));
        }
        if p["spec"]["runtimeClassName"] != "nvidia" {
            wrong.push(format!(
                "runtimeClassName {}",
                p["spec"]["runtimeClassName"]
            ));
        }
        if annotation(&p, REQUEST).is_none() {
            wrong.push(format!("no {REQUEST} annotation"));
        }
        ensure(
            wrong.is_empty(),
            format!("{} mutated wrongly: {}", w.class, wrong.join("; ")),
        )?;
    }

    // Pod Security baseline forbids hostIPC: gpu-share's own denial, before Pod Security's.
    let baseline = "baseline";
    c.namespace(
        baseline,
        json!({"pod-security.kubernetes.io/enforce": "baseline"}),
    )
    .await?;
    match create(c, baseline, &gpu_pod("mps-in-baseline", "mps-25")) {
        Ok(_) => return Err("an MPS pod with hostIPC was admitted under baseline".into()),
        Err(e) => ensure(
            e.contains("admission webhook \"pods.gpu-share.io\" denied the request")
                && e.contains("Pod Security level")
                && !e.contains("violates PodSecurity"),
            format!("the baseline refusal is not gpu-share's: {e}"),
        )?,
    }
    c.delete_pods(ns).await?;
    c.delete_pods(baseline).await
}

// ---- 2. scheduling -------------------------------------------------------------------------------

async fn bound(pods: &Api<Pod>, name: &str, limit: Duration) -> Result<(String, String), String> {
    wait_for(&format!("pod {name} bound"), limit, || {
        let pods = pods.clone();
        let name = name.to_string();
        async move {
            let p = pods.get(&name).await.map_err(|e| e.to_string())?;
            let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
            let gpus = p
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(GPUS).cloned());
            Ok(node.zip(gpus))
        }
    })
    .await
}

async fn scheduling(c: &Cluster) -> Check {
    let ns = "scheduling";
    c.namespace(ns, json!({})).await?;
    // The pods go whatever happened: later points count on the capacity.
    let result = scheduling_in(c, ns).await;
    let deleted = c.delete_pods(ns).await;
    result?;
    platform_nodes(c, ns).await.and(c.delete_pods(ns).await)?;
    deleted
}

async fn scheduling_in(c: &Cluster, ns: &str) -> Check {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), ns);
    let cases: &[(&str, &[&str])] = &[
        ("mig-1g.10gb", &["a100-mig-mixed"]),
        ("mig-3g.40gb", &["a100-mig-mixed"]),
        ("mig-1g.5gb", &["aks-a100-mig"]),
        ("mps-25", &["h100-mps-4", "l4-mps-2", "gke-t4-mps"]),
        ("mps-50", &["l4-mps-2"]),
        ("timeslice-50", &["l4-timeslice-4", "gke-l4-ts"]),
        ("exclusive-1", &["l40s-plain", "eks-t4-plain"]),
    ];
    for (class, _) in cases {
        create(
            c,
            ns,
            &gpu_pod(&format!("s-{}", class.replace('.', "-")), class),
        )
        .map_err(|e| format!("{class}: {e}"))?;
    }
    for (class, nodes) in cases {
        let name = format!("s-{}", class.replace('.', "-"));
        let (node, gpus) = bound(&pods, &name, Duration::from_secs(60)).await?;
        // MIG devices are the device plugin's to choose: no per-GPU model, an empty annotation.
        ensure(
            nodes.contains(&node.as_str()) && (class.starts_with("mig-") || !gpus.is_empty()),
            format!("{class} bound to {node} (gpus {gpus:?}); expected one of {nodes:?}"),
        )?;
    }

    // Fits nowhere: MPS replicas here are 25% and 50% of a GPU.
    create(c, ns, &gpu_pod("unfit", "mps-75"))?;
    let message = failed_scheduling(c, ns, "unfit").await?;
    let p = pods.get("unfit").await.map_err(|e| e.to_string())?;
    ensure(
        p.spec.and_then(|s| s.node_name).is_none(),
        "the unfit pod was bound",
    )?;
    let all = Api::<Node>::all(c.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?
        .items
        .len();
    ensure(
        message.starts_with(&format!("0/{all} nodes are available:"))
            && message.contains("3 MPS replicas on this node are smaller than the request"),
        format!("FailedScheduling does not group gpu-share's reasons: {message}"),
    )?;
    // `gpu-share status` read from the cluster lists it, with that reason.
    let text = status_from_cluster(c)?;
    ensure(
        text.contains("scheduling/unfit (mps-75) since ")
            && text.contains("3 MPS replicas on this node are smaller than the request"),
        format!("gpu-share status does not show the pending pod and its reason:\n{text}"),
    )?;
    kubectl_plugin(c, ns)
}

/// `gpu-share status` read straight from the cluster (its admin kubeconfig): the table, or what
/// went wrong.
fn status_from_cluster(c: &Cluster) -> Result<String, String> {
    let out = std::process::Command::new(common::BIN)
        .arg("status")
        .env("KUBECONFIG", c.dir.join("kubeconfig"))
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "gpu-share status failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `kubectl gpu-share status`: the binary on PATH as `kubectl-gpu_share` is a kubectl plugin,
/// reading the cluster with kubectl's current context, `--context` and `--namespace`.
fn kubectl_plugin(c: &Cluster, ns: &str) -> Check {
    let plugins = c.dir.join("plugins");
    std::fs::create_dir_all(&plugins).map_err(|e| e.to_string())?;
    let link = plugins.join("kubectl-gpu_share");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(common::BIN, &link).map_err(|e| e.to_string())?;
    let path = format!(
        "{}:{}",
        plugins.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let kubectl = |args: &[&str]| {
        std::process::Command::new(c.var("KUBECTL"))
            .args(args)
            .env("PATH", &path)
            .env("KUBECONFIG", c.dir.join("kubeconfig"))
            .output()
            .map_err(|e| e.to_string())
    };
    let out = kubectl(&[
        "gpu-share",
        "status",
        "-n",
        ns,
        "--context",
        "gpu-share-test",
    ])?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure(
        out.status.success()
            && text.starts_with("NODE")
            && text.contains(&format!("{ns}/unfit (mps-75)"))
            && text.contains("1 gpu-share pods pending"),
        format!(
            "kubectl gpu-share status -n {ns}:\n{text}{}",
            String::from_utf8_lossy(&out.stderr)
        ),
    )?;
    // Another namespace: the same nodes, none of this namespace's pods.
    let out = kubectl(&["gpu-share", "status", "--namespace", "default"])?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure(
        out.status.success()
            && text.contains("no gpu-share pod is pending")
            && !text.contains(&format!("{ns}/")),
        format!("kubectl gpu-share status --namespace default:\n{text}"),
    )?;
    let out = kubectl(&["gpu-share", "status", "--context", "nowhere"])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure(
        !out.status.success() && stderr.contains("--context nowhere"),
        format!("an unknown context is not named: {stderr}"),
    )?;
    // The simulator through the plugin too (files, no cluster).
    let fixture = |f: &str| format!("{}/tests/fixtures/{f}", env!("CARGO_MANIFEST_DIR"));
    let (nodes, pods) = (
        fixture("extender/nodes.yaml"),
        fixture("simulate/cluster-pods.yaml"),
    );
    let out = kubectl(&[
        "gpu-share",
        "simulate",
        "--nodes",
        &nodes,
        "--pods",
        &pods,
        "--seeds",
        "1..2",
    ])?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure(
        out.status.success() && text.contains("gpu-share"),
        format!(
            "kubectl gpu-share simulate:\n{text}{}",
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Each managed platform's kind of node takes the pods of its class, as admitted by the webhook
/// (GKE's labels in the node affinity) and placed by the extender: a pod pinned to the node by a
/// nodeSelector binds there, and a pod of a class the node cannot hold stays Pending with the
/// affinity as the reason. `/v1/nodes` says where each node's mode was read from.
async fn platform_nodes(c: &Cluster, ns: &str) -> Check {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), ns);
    let pinned = |name: &str, class: Option<&str>, node: &str| {
        let mut p = match class {
            Some(class) => gpu_pod(name, class),
            // The device plugin's own unit, with no gpu-share annotation (GKE's MIG partitions).
            None => {
                let mut p = pod(
                    name,
                    json!({}),
                    json!({
                        "schedulerName": SCHEDULER,
                        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    }),
                );
                p["spec"]["containers"][0]["resources"] =
                    json!({"limits": {"nvidia.com/gpu": "1"}});
                p
            }
        };
        p["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": node});
        p
    };
    let fits: &[(&str, Option<&str>, &str)] = &[
        ("p-gke-ts", Some("timeslice-50"), "gke-l4-ts"),
        ("p-gke-mps", Some("mps-25"), "gke-t4-mps"),
        ("p-gke-mig", None, "gke-a100-mig"),
        ("p-eks", Some("exclusive-1"), "eks-t4-plain"),
        ("p-aks", Some("mig-1g.5gb"), "aks-a100-mig"),
    ];
    for (name, class, node) in fits {
        create(c, ns, &pinned(name, *class, node))?;
    }
    for (name, class, node) in fits {
        let (on, _) = bound(&pods, name, Duration::from_secs(60))
            .await
            .map_err(|e| format!("{class:?} pinned to {node}: {e}"))?;
        ensure(on == *node, format!("{name} bound to {on}, not {node}"))?;
    }
    // Classes a node cannot hold: exclusive on GKE's shared and MIG nodes, mps on time-sharing.
    let misfits: &[(&str, &str, &str)] = &[
        ("m-gke-ts", "exclusive-1", "gke-l4-ts"),
        ("m-gke-mig", "exclusive-1", "gke-a100-mig"),
        ("m-gke-mps", "timeslice-25", "gke-t4-mps"),
    ];
    for (name, class, node) in misfits {
        create(c, ns, &pinned(name, Some(class), node))?;
    }
    for (name, class, node) in misfits {
        let message = failed_scheduling(c, ns, name).await?;
        ensure(
            message.contains("didn't match Pod's node affinity/selector"),
            format!("{class} pinned to {node}: {message}"),
        )?;
    }
    // A pending pod's request is fixed at admission: the API server refuses to rewrite it (the
    // webhook's UPDATE rule), from anyone; gpu-share's later annotations come only from the
    // extender's ServiceAccount; other annotations change freely.
    let scheduler_kubeconfig = std::path::Path::new(c.var("KUBECONFIG"))
        .parent()
        .map(|d| d.join("kubeconfigs/scheduler"))
        .ok_or("no cluster directory")?;
    let scheduler_kubeconfig = scheduler_kubeconfig.to_str().ok_or("path")?.to_string();
    let annotate = |as_scheduler: bool, kv: &str| {
        let mut args = vec!["annotate", "--overwrite", "-n", ns, "pod", "m-gke-ts", kv];
        if as_scheduler {
            args.extend(["--kubeconfig", scheduler_kubeconfig.as_str()]);
        }
        let out = c.kubectl(&args, None);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for (as_scheduler, kv, want) in [
        (
            false,
            "gpu-share.io/request=timeslice-1",
            "fixed once a pod is admitted",
        ),
        (
            false,
            "gpu-share=timeslice-1",
            "fixed once a pod is admitted",
        ),
        (
            false,
            "gpu-share.io/request-",
            "fixed once a pod is admitted",
        ),
        (
            true,
            "gpu-share.io/request=timeslice-1",
            "fixed once a pod is admitted",
        ),
        (false, "gpu-share.io/gpus=0:1", "only gpu-share itself"),
        (false, "gpu-share.io/requeued-at=1", "only gpu-share itself"),
    ] {
        let (ok, err) = annotate(as_scheduler, kv);
        ensure(
            !ok && err.contains("denied the request") && err.contains(want),
            format!(
                "kubectl annotate --overwrite {kv}{}: refused with {want:?}, got ok={ok}: {err}",
                if as_scheduler {
                    " as gpu-share-scheduler"
                } else {
                    ""
                }
            ),
        )?;
    }
    for (as_scheduler, kv) in [(true, "gpu-share.io/requeued-at=1"), (false, "team=ml")] {
        let (ok, err) = annotate(as_scheduler, kv);
        ensure(
            ok,
            format!("kubectl annotate {kv} (as_scheduler={as_scheduler}) refused: {err}"),
        )?;
    }
    let still: Value = serde_json::from_slice(
        &c.kubectl(&["get", "-n", ns, "pod", "m-gke-ts", "-o", "json"], None)
            .stdout,
    )
    .map_err(|e| e.to_string())?;
    ensure(
        annotation(&still, REQUEST) == Some("exclusive"),
        format!(
            "the request is unchanged after the refusals: {:?}",
            annotation(&still, REQUEST)
        ),
    )?;

    // kube-scheduler's own NodeAffinity turned these away (the extender never saw them); the
    // extender counts them as pending all the same, from the pod watch.
    let metrics = c.admin_text("EXTENDER_ADMIN", "/metrics")?;
    let sample = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    ensure(
        sample(r#"gpu_share_pending_pods{class="exclusive"}"#) >= 2.0
            && sample(r#"gpu_share_pending_pods{class="timeslice"}"#) >= 1.0
            && metrics.contains(r#"gpu_share_pending_oldest_seconds{class="exclusive"}"#),
        format!(
            "the misfits are pending by class in /metrics: {}",
            metrics
                .lines()
                .filter(|l| l.starts_with("gpu_share_pending"))
                .collect::<Vec<_>>()
                .join("; ")
        ),
    )?;
    let nodes = c.admin_json("EXTENDER_ADMIN", "/v1/nodes")?;
    let source = |name: &str| {
        nodes
            .as_array()
            .into_iter()
            .flatten()
            .find(|n| n["name"] == name)
            .map(|n| format!("{} {}", n["kind"].as_str().unwrap_or("?"), n["modeSource"]))
            .unwrap_or_else(|| format!("{name} missing"))
    };
    for (node, want) in [
        ("gke-l4-ts", "\"gke\""),
        ("gke-t4-mps", "\"gke\""),
        ("gke-a100-mig", "\"gke\""),
        ("eks-t4-plain", "\"instance-type\""),
        ("aks-a100-mig", "\"gfd\""),
        ("l40s-plain", "\"gfd\""),
    ] {
        let got = source(node);
        ensure(
            got.ends_with(want),
            format!("/v1/nodes: {node} is {got}, expected mode source {want}"),
        )?;
    }
    Ok(())
}

// ---- 3. no overcommit ----------------------------------------------------------------------------

/// What the API says is bound on each node, checked against the node's capacity. Returns the
/// share of the usable capacity bound, and a line per node.
async fn capacity_check(c: &Cluster) -> Result<(f64, Vec<String>), String> {
    let nodes: Api<Node> = Api::all(c.client.clone());
    let pods: Api<Pod> = Api::all(c.client.clone());
    let nodes = nodes
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    let pods = pods
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    let mut lines = Vec::new();
    let mut errors = Vec::new();
    let (mut weighted, mut total) = (0.0, 0.0);
    for node in &nodes.items {
        let name = node.metadata.name.clone().unwrap_or_default();
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let alloc: BTreeMap<String, i64> = node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, _)| k.starts_with("nvidia.com/"))
            .filter_map(|(k, v)| Some((k, v.0.parse().ok()?)))
            .collect();
        let capacity: i64 = alloc.values().sum();
        if capacity == 0 {
            continue;
        }
        let on_node: Vec<&Pod> = pods
            .items
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&name))
            .collect();
        let mut used: BTreeMap<String, i64> = BTreeMap::new();
        let mut per_gpu: BTreeMap<u32, (u32, u32)> = BTreeMap::new(); // index -> (pods, milli)
        let mut budget = 0u32;
        for p in &on_node {
            let v = serde_json::to_value(p).map_err(|e| e.to_string())?;
            for container in v["spec"]["containers"].as_array().into_iter().flatten() {
                for (k, q) in container["resources"]["limits"]
                    .as_object()
                    .into_iter()
                    .flatten()
                {
                    if k.starts_with("nvidia.com/") {
                        *used.entry(k.clone()).or_default() +=
                            q.as_str().and_then(|s| s.parse::<i64>().ok()).unwrap_or(0);
                    }
                }
            }
            if let Some(text) = annotation(&v, GPUS) {
                for part in text.split(',').filter(|s| !s.is_empty()) {
                    let (i, m) = part
                        .split_once(':')
                        .ok_or_else(|| format!("{GPUS} {text:?} on {name}"))?;
                    let (i, m): (u32, u32) = (
                        i.parse().map_err(|_| format!("{GPUS} {text:?}"))?,
                        m.parse().map_err(|_| format!("{GPUS} {text:?}"))?,
                    );
                    let e = per_gpu.entry(i).or_default();
                    e.0 += 1;
                    e.1 += m;
                }
            }
            if let Some(pct) = annotation(&v, REQUEST)
                .and_then(|r| r.split(',').next())
                .and_then(|r| r.strip_prefix("timeslice-"))
                .and_then(|p| p.parse::<u32>().ok())
            {
                budget += pct * 10;
            }
        }
        for (k, n) in &used {
            let cap = alloc.get(k).copied().unwrap_or(0);
            if *n > cap {
                errors.push(format!("{name}: {n} {k} bound, {cap} allocatable"));
            }
        }
        // GFD's labels, or GKE's (which count clients, not GPUs: the GPUs are the units over the
        // clients).
        let label = |k: &str| labels.get(k).map(String::as_str);
        let gke_sharing = label("cloud.google.com/gke-gpu-sharing-strategy")
            .map(|s| s.to_ascii_lowercase().replace('_', "-"));
        let sharing = match gke_sharing.as_deref() {
            Some("time-sharing") => Some("time-slicing"),
            Some("mps") => Some("mps"),
            Some(_) => Some("unknown"),
            None => label("nvidia.com/gpu.sharing-strategy"),
        };
        let replicas: u32 = label("nvidia.com/gpu.replicas")
            .or(label("cloud.google.com/gke-max-shared-clients-per-gpu"))
            .and_then(|s| s.parse().ok())
            .unwrap_or(1);
        let gpus: u32 = label("nvidia.com/gpu.count")
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| alloc.get("nvidia.com/gpu").map_or(0, |n| *n as u32) / replicas);
        let mig = labels.contains_key("nvidia.com/mig.strategy")
            || labels.contains_key("cloud.google.com/gke-gpu-partition-size");
        let mut fill = used.values().sum::<i64>() as f64 / capacity as f64;
        match sharing {
            Some("time-slicing") => {
                if budget > 1000 * gpus {
                    errors.push(format!(
                        "{name}: time-slicing budget {budget}/1000 of {gpus} GPUs"
                    ));
                }
                for (i, (_, milli)) in &per_gpu {
                    if *milli > 1000 {
                        errors.push(format!("{name}: GPU {i} holds {milli}/1000"));
                    }
                }
                fill = fill.max(budget as f64 / (1000 * gpus) as f64);
            }
            Some("mps") => {
                for (i, (n, _)) in &per_gpu {
                    if *n > replicas {
                        errors.push(format!("{name}: GPU {i} holds {n} of {replicas} replicas"));
                    }
                }
            }
            _ if !mig => {
                for (i, (n, milli)) in &per_gpu {
                    if *milli > 1000 || *n > 1 && *milli >= 1000 {
                        errors.push(format!("{name}: whole GPU {i} held {n} times ({milli})"));
                    }
                }
            }
            _ => {}
        }
        weighted += fill * capacity as f64;
        total += capacity as f64;
        lines.push(format!(
            "{name}: {} pods, used {used:?} of {alloc:?}, fill {:.0}%",
            on_node.len(),
            fill * 100.0
        ));
    }
    if !errors.is_empty() {
        return Err(format!("overcommitted: {}", errors.join("; ")));
    }
    Ok((if total > 0.0 { weighted / total } else { 0.0 }, lines))
}

async fn no_overcommit(c: &Cluster) -> Check {
    let ns = "fill";
    c.namespace(ns, json!({})).await?;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), ns);
    // 220 pods, more than every class's capacity: 66 slots in all.
    let mix: &[(&str, usize)] = &[
        ("mig-1g.10gb", 30),
        ("mig-3g.40gb", 15),
        ("mig-1g.5gb", 20),
        ("timeslice-25", 30),
        ("timeslice-50", 15),
        ("mps-50", 25),
        ("mps-25", 35),
        ("exclusive-1", 25),
        ("device", 25),
    ];
    let total: usize = mix.iter().map(|(_, n)| n).sum();
    let mut objects = Vec::new();
    for (class, n) in mix {
        for i in 0..*n {
            let name = format!("f-{}-{i}", class.replace('.', "-"));
            let p = if *class == "device" {
                // No annotation: plain device-plugin requests on the single-strategy MIG nodes
                // (GFD's, and GKE's partitioned one), scheduled by gpu-share's scheduler (the
                // extender accounts them as units).
                let mut p = pod(
                    &name,
                    json!({}),
                    json!({
                        "schedulerName": SCHEDULER,
                        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "nvidia.com/mig.strategy", "operator": "In", "values": ["single"]}]},
                            {"matchExpressions": [{"key": "cloud.google.com/gke-gpu-partition-size", "operator": "Exists"}]},
                        ]}}},
                        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    }),
                );
                p["spec"]["containers"][0]["resources"] =
                    json!({"limits": {"nvidia.com/gpu": "1"}});
                p
            } else {
                gpu_pod(&name, class)
            };
            objects.push(serde_json::from_value::<Pod>(p).map_err(|e| e.to_string())?);
        }
    }
    let created: Vec<Result<Pod, kube::Error>> = futures::stream::iter(objects)
        .map(|p| {
            let pods = pods.clone();
            async move { pods.create(&PostParams::default(), &p).await }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let refused: Vec<String> = created
        .iter()
        .filter_map(|r| r.as_ref().err().map(|e| e.to_string()))
        .collect();
    ensure(refused.is_empty(), format!("pods refused: {refused:?}"))?;

    // Settled: no new binding for 10 s (or 3 minutes in all).
    let start = Instant::now();
    let (mut last, mut since) = (usize::MAX, Instant::now());
    loop {
        let list = pods
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let n = list
            .items
            .iter()
            .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
            .count();
        if n != last {
            (last, since) = (n, Instant::now());
        }
        if since.elapsed() > Duration::from_secs(10) || start.elapsed() > Duration::from_secs(180) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (share, lines) = capacity_check(c).await?;
    for l in &lines {
        eprintln!("cluster test:   {l}");
    }
    eprintln!(
        "cluster test:   {last} of {total} pods bound, {:.1}% of the usable capacity, settled after {:.1} s",
        share * 100.0,
        start.elapsed().as_secs_f64()
    );
    ensure(
        share >= 0.9,
        format!(
            "only {:.1}% of the usable capacity bound ({last} pods)",
            share * 100.0
        ),
    )?;
    c.delete_pods(ns).await
}

// ---- 4. requeue ----------------------------------------------------------------------------------

/// The sum of the extender's series of `metric` whose labels contain `labels` (its /metrics).
fn extender_counter(c: &Cluster, metric: &str, labels: &str) -> Result<f64, String> {
    let text = c.admin_text("EXTENDER_ADMIN", "/metrics")?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with(metric) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// The extender's filter calls so far.
fn filter_calls(c: &Cluster) -> Result<f64, String> {
    extender_counter(c, "gpu_share_requests_total{", "endpoint=\"filter\"")
}

/// The time-sliced nodes (GFD's and GKE's), which the requeue point keeps, and their GPUs.
const TIME_SLICED: [&str; 2] = ["l4-timeslice-4", "gke-l4-ts"];
const TIME_SLICED_GPUS: usize = 3;

/// One requeue measurement: the time-sliced nodes' budget held by one pod per GPU, one more
/// waiting, then one holder deleted or (`finish`) finished; returns (filter calls per minute for
/// the waiting pod, seconds from the holder's leaving to the waiting pod's binding, or None if
/// not bound within `limit`).
async fn requeue_once(
    c: &Cluster,
    ns: &str,
    limit: Duration,
    finish: bool,
) -> Result<(f64, Option<f64>), String> {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), ns);
    for i in 0..TIME_SLICED_GPUS {
        let name = format!("hold-{i}");
        create(c, ns, &gpu_pod(&name, "timeslice-100"))?;
        bound(&pods, &name, Duration::from_secs(30)).await?;
    }
    create(c, ns, &gpu_pod("waiter", "timeslice-100"))?;
    let message = failed_scheduling(c, ns, "waiter").await?;
    ensure(
        message.contains("time-slicing budget"),
        format!("the waiting pod was not rejected for the budget: {message}"),
    )?;
    // Let the rejection settle, then count the retries of a pod nothing can place.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let window = Duration::from_secs(15);
    let before = filter_calls(c)?;
    tokio::time::sleep(window).await;
    let per_minute = (filter_calls(c)? - before) * 60.0 / window.as_secs_f64();

    // The holder leaves: deleted, or (on a cluster whose pods run) its work done.
    let start = Instant::now();
    if finish {
        let out = c.kubectl(
            &[
                "annotate",
                "-n",
                ns,
                "pod",
                "hold-0",
                "pod-complete.stage.kwok.x-k8s.io/delay=0s",
            ],
            None,
        );
        ensure(out.status.success(), "mark hold-0 to finish")?;
    } else {
        pods.delete(
            "hold-0",
            &kube::api::DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| format!("delete hold-0: {e}"))?;
    }
    let delay = match bound(&pods, "waiter", limit).await {
        Ok(_) => Some(start.elapsed().as_secs_f64()),
        Err(_) => None,
    };
    c.delete_pods(ns).await?;
    Ok((per_minute, delay))
}

/// Point 4, measured four ways: a pod rejected by the extender alone (the cluster cut down to the
/// time-sliced nodes) or also by in-tree plugins (every node), with the requeue nudge on and off
/// (on: a holder deleted, and one finished; off, kube-scheduler's own requeue: a holder deleted).
/// The assertion is on the shipped configuration (nudge on): bound within 5 s, with no hot loop.
async fn requeue(c: &Cluster) -> Check {
    let ns = "requeue";
    c.namespace(ns, json!({})).await?;
    let all = Api::<Node>::all(c.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    let others: Vec<String> = all
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .filter(|n| !TIME_SLICED.contains(&n.as_str()))
        .collect();
    let others: Vec<&str> = others.iter().map(String::as_str).collect();
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    let measured = requeue_runs(c, ns, &others, &mut rows, &mut failures).await;
    // Whatever happened, the cluster goes back to what the later points expect: every node
    // registered (nodes.py skips those that exist), the extender as up.sh started it, no pods.
    let registered = register_nodes(c, &others);
    c.stop("extender");
    c.start_process("extender");
    c.wait_ready("EXTENDER_ADMIN", Duration::from_secs(60))
        .await?;
    c.delete_pods(ns).await?;
    for r in &rows {
        eprintln!("cluster test:   {r}");
    }
    measured?;
    registered?;
    ensure(failures.is_empty(), failures.join("; "))
}

fn register_nodes(c: &Cluster, names: &[&str]) -> Check {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let status = std::process::Command::new("python3")
        .arg(root.join("tests/cluster/nodes.py"))
        .arg(&c.dir)
        .arg(root.join("tests/cluster/nodes.yaml"))
        .args(names)
        .status()
        .map_err(|e| e.to_string())?;
    ensure(status.success(), "register the nodes again")
}

fn requeue_nudges(c: &Cluster) -> Result<f64, String> {
    extender_counter(c, "gpu_share_requeue_nudges_total", "")
}

fn retried_first(c: &Cluster) -> Result<f64, String> {
    extender_counter(c, "gpu_share_requeue_retried_first_total", "")
}

async fn requeue_runs(
    c: &Cluster,
    ns: &str,
    others: &[&str],
    rows: &mut Vec<String>,
    failures: &mut Vec<String>,
) -> Check {
    for nudge in [true, false] {
        if !nudge {
            c.stop("extender");
            c.start_process_with("extender", &[("GPU_SHARE_REQUEUE_NUDGE", "false")]);
            c.wait_ready("EXTENDER_ADMIN", Duration::from_secs(60))
                .await?;
        }
        for extender_only in [false, true] {
            if extender_only {
                let out = c.kubectl(&[&["delete", "node"][..], others].concat(), None);
                ensure(out.status.success(), "delete the other nodes")?;
            }
            // Without the nudge, kube-scheduler's own requeue is measured once (a deleted
            // holder), as a baseline; the nudge is measured for both ways a holder leaves.
            for run in 0..if nudge { 2 } else { 1 } {
                let nudges = requeue_nudges(c)?;
                let first = retried_first(c)?;
                // Run 0: the holder is deleted; run 1: it finishes (Succeeded), as a Job's does.
                let (per_minute, delay) =
                    requeue_once(c, ns, Duration::from_secs(20), run == 1).await?;
                let nudged = requeue_nudges(c)? - nudges;
                let retried = retried_first(c)? - first;
                let case = if extender_only {
                    "rejected by the extender only"
                } else {
                    "rejected by in-tree plugins too"
                };
                let shown = delay.map_or("> 20 s".to_string(), |d| format!("{d:.2} s"));
                rows.push(format!(
                    "nudge {:3} | {case:31} | holder {:8} | bound after {shown:>8} | {per_minute:.1} filter calls/min while waiting | {nudged} nudged | {retried} retried first",
                    if nudge { "on" } else { "off" },
                    if run == 1 { "finished" } else { "deleted" }
                ));
                if nudge && !delay.is_some_and(|d| d <= 5.0) {
                    failures.push(format!("{case}, nudge on: bound after {shown}"));
                }
                // The waiting pod was marked waiting, and the mark was spent: a release nudged
                // it, or kube-scheduler's own retry bound it before the nudge (the extender
                // counts which). The nudge closes the race when the retry comes too early.
                if nudge && nudged + retried < 1.0 {
                    failures.push(format!(
                        "{case}, nudge on: the waiting pod was neither nudged nor bound while marked waiting"
                    ));
                }
                if !nudge && nudged > 0.0 {
                    failures.push(format!("{case}, nudge off: {nudged} nudges were sent"));
                }
                if per_minute > 30.0 {
                    failures.push(format!("{case}: {per_minute:.0} filter calls a minute for one waiting pod (a hot loop)"));
                }
            }
            if extender_only {
                register_nodes(c, others)?;
            }
        }
    }
    Ok(())
}

// ---- 5. preemption ---------------------------------------------------------------------------------

async fn preemption(c: &Cluster) -> Check {
    let ns = "preemption";
    c.namespace(ns, json!({})).await?;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), ns);
    let pc = c.kubectl(
        &["apply", "-f", "-"],
        Some(
            &json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                    "metadata": {"name": "gpu-share-test-high"}, "value": 1000000,
                    "description": "the cluster test's preemptor"})
            .to_string(),
        ),
    );
    ensure(
        pc.status.success(),
        "create PriorityClass gpu-share-test-high",
    )?;
    // Low-priority holders: every whole GPU of the unshared nodes (GFD's and the device-plugin-
    // only one), and every MPS replica of the MPS nodes (another class, which must be left alone).
    let whole = ["l40s-plain", "eks-t4-plain"];
    let mut low = vec![];
    for i in 0..3 {
        low.push((format!("low-exclusive-{i}"), "exclusive-1"));
    }
    for i in 0..4 {
        low.push((format!("low-mps50-{i}"), "mps-50"));
    }
    for i in 0..12 {
        low.push((format!("low-mps25-{i}"), "mps-25"));
    }
    for (name, class) in &low {
        create(c, ns, &gpu_pod(name, class))?;
    }
    for (name, _) in &low {
        bound(&pods, name, Duration::from_secs(60)).await?;
    }
    let mut high = gpu_pod("high", "exclusive-1");
    high["spec"]["priorityClassName"] = json!("gpu-share-test-high");
    create(c, ns, &high)?;
    let (node, _) = bound(&pods, "high", Duration::from_secs(60)).await?;
    ensure(
        whole.contains(&node.as_str()),
        format!("the preemptor was bound to {node}, not one of {whole:?}"),
    )?;
    let left: BTreeSet<String> = pods
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.name)
        .collect();
    let evicted: Vec<&String> = low
        .iter()
        .map(|(n, _)| n)
        .filter(|n| !left.contains(*n))
        .collect();
    ensure(
        evicted.len() == 1 && evicted[0].starts_with("low-exclusive-"),
        format!("preemption evicted {evicted:?}; expected exactly one whole-GPU pod"),
    )?;
    capacity_check(c).await?;
    Ok(())
}

// ---- 6. restart ------------------------------------------------------------------------------------

async fn restart(c: &Cluster) -> Check {
    // The ledger holds point 5's pods. Kill the extender outright and start it again.
    let before = c.admin_json("EXTENDER_ADMIN", "/v1/nodes")?;
    let held: usize = before
        .as_array()
        .map(|a| {
            a.iter()
                .map(|n| n["pods"].as_array().map_or(0, Vec::len))
                .sum()
        })
        .unwrap_or(0);
    ensure(held > 0, "the ledger holds no pods before the restart")?;
    c.kill("extender");
    c.start_process("extender");
    c.wait_ready("EXTENDER_ADMIN", Duration::from_secs(60))
        .await?;
    let after = c.admin_json("EXTENDER_ADMIN", "/v1/nodes")?;
    ensure(
        before == after,
        format!("the rebuilt ledger differs:\nbefore {before}\nafter  {after}"),
    )?;
    // Nothing allocated twice: pods that would need the held capacity stay Pending.
    let ns = "preemption";
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), ns);
    for (name, class) in [("after-exclusive", "exclusive-1"), ("after-mps", "mps-25")] {
        create(c, ns, &gpu_pod(name, class))?;
        failed_scheduling(c, ns, name).await?;
        let p = pods.get(name).await.map_err(|e| e.to_string())?;
        ensure(
            p.spec.and_then(|s| s.node_name).is_none(),
            format!("{name} was bound onto capacity the restarted extender holds ({held} pods)"),
        )?;
    }
    capacity_check(c).await?;
    c.delete_pods(ns).await
}

// ---- 8. the API server fails under load -----------------------------------------------------------

/// The GPU pods the ledger holds, as `namespace/name@node`, for one namespace.
fn ledger_pods(c: &Cluster, ns: &str) -> Result<BTreeSet<String>, String> {
    let nodes = c.admin_json("EXTENDER_ADMIN", "/v1/nodes")?;
    let mut held = BTreeSet::new();
    for n in nodes.as_array().into_iter().flatten() {
        for p in n["pods"].as_array().into_iter().flatten() {
            if p["namespace"] == ns {
                let key = format!(
                    "{ns}/{}@{}",
                    p["name"].as_str().unwrap_or_default(),
                    n["name"].as_str().unwrap_or_default()
                );
                if !held.insert(key.clone()) {
                    return Err(format!("the ledger holds {key} twice"));
                }
            }
        }
    }
    Ok(held)
}

/// The pods of a namespace the API has bound, as `namespace/name@node`.
async fn api_bound(c: &Cluster, ns: &str) -> Result<BTreeSet<String>, String> {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), ns);
    Ok(pods
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?
        .items
        .into_iter()
        .filter_map(|p| {
            let node = p.spec.as_ref()?.node_name.clone()?;
            Some(format!("{ns}/{}@{node}", p.metadata.name?))
        })
        .collect())
}

async fn apiserver_outage(c: &Cluster) -> Check {
    let ns = "outage";
    c.namespace(ns, json!({})).await?;
    // 30 pods, created one after another (retrying while the API is down): ten of each class,
    // more than the cluster holds of mig-1g.10gb (7) and as many as it holds of timeslice-25, so
    // binds, refusals and waiting pods all meet the outage.
    let classes = ["timeslice-25", "mps-25", "mig-1g.10gb"];
    let names: Vec<String> = (0..30).map(|i| format!("load-{i:02}")).collect();
    let creator = {
        let names = names.clone();
        let kubectl = c.var("KUBECTL").to_string();
        let kubeconfig = c.dir.join("kubeconfig");
        std::thread::spawn(move || -> Result<usize, String> {
            let mut retries = 0;
            for (i, name) in names.iter().enumerate() {
                let body = gpu_pod(name, classes[i % 3]).to_string();
                let deadline = Instant::now() + Duration::from_secs(90);
                loop {
                    let out = std::process::Command::new(&kubectl)
                        .args([
                            "--kubeconfig",
                            &kubeconfig.to_string_lossy(),
                            "--request-timeout",
                            "5s",
                            "create",
                            "-n",
                            ns,
                            "-f",
                            "-",
                        ])
                        .stdin(std::process::Stdio::piped())
                        .stdout(std::process::Stdio::null())
                        .stderr(std::process::Stdio::piped())
                        .spawn()
                        .and_then(|mut child| {
                            use std::io::Write;
                            child.stdin.take().unwrap().write_all(body.as_bytes())?;
                            child.wait_with_output()
                        })
                        .map_err(|e| e.to_string())?;
                    let err = String::from_utf8_lossy(&out.stderr);
                    if out.status.success() || err.contains("AlreadyExists") {
                        break;
                    }
                    if Instant::now() > deadline {
                        return Err(format!("creating {name}: {err}"));
                    }
                    retries += 1;
                    std::thread::sleep(Duration::from_millis(300));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Ok(retries)
        })
    };
    // The API server crashes in the middle of it (SIGKILL: in-flight binds, watches and
    // creations are cut), stays down for 6 s, and comes back.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    c.kill("kube-apiserver");
    tokio::time::sleep(Duration::from_secs(6)).await;
    c.start_process("kube-apiserver");
    let retries = tokio::task::spawn_blocking(move || creator.join())
        .await
        .map_err(|e| e.to_string())?
        .map_err(|_| "the pod creator panicked".to_string())??;
    ensure(
        retries > 0,
        "no creation met the outage: the API server was not down",
    )?;
    for process in ["kube-scheduler", "extender", "webhook"] {
        let pid = std::fs::read_to_string(c.dir.join("pids").join(format!("{process}.pid")))
            .unwrap_or_default();
        ensure(
            std::process::Command::new("kill")
                .args(["-0", pid.trim()])
                .status()
                .is_ok_and(|s| s.success()),
            format!(
                "{process} did not survive the API server's outage: {}",
                c.log(process)
            ),
        )?;
    }
    c.wait_ready("EXTENDER_ADMIN", Duration::from_secs(60))
        .await?;
    // Every pod ends bound or refused for capacity, the API never holds more than the nodes
    // have, and the ledger holds exactly what the API has bound: nothing twice, nothing leaked.
    // Each pod ends bound, or refused with a FailedScheduling event. Both are polled together:
    // right after the restart, the first reads may still show a pod as it was before its bind.
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), ns);
    let events: Api<Event> = Api::namespaced(c.client.clone(), ns);
    for name in &names {
        let settled = wait_for(
            &format!("{name} bound or refused"),
            Duration::from_secs(90),
            || {
                let (pods, events) = (pods.clone(), events.clone());
                let name = name.clone();
                async move {
                    let p = pods.get(&name).await.map_err(|e| e.to_string())?;
                    if let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) {
                        return Ok(Some(format!("bound to {node}")));
                    }
                    let uid = p.metadata.uid.unwrap_or_default();
                    let field = format!("involvedObject.name={name},involvedObject.uid={uid}");
                    let list = events
                        .list(&ListParams::default().fields(&field))
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok(list
                        .items
                        .into_iter()
                        .find(|e| e.reason.as_deref() == Some("FailedScheduling"))
                        .map(|e| format!("refused: {}", e.message.unwrap_or_default())))
                }
            },
        )
        .await;
        if let Err(e) = settled {
            let p = pods.get(name).await.map_err(|e| e.to_string())?;
            let lines = |process: &str| -> Vec<String> {
                c.log(process)
                    .lines()
                    .filter(|l| l.contains(name.as_str()))
                    .map(String::from)
                    .collect()
            };
            return Err(format!(
                "{e}\nnode {:?}, annotations {:?}\nstatus: {}\nkube-scheduler: {:?}\nextender: {:?}",
                p.spec.as_ref().and_then(|s| s.node_name.clone()),
                p.metadata.annotations,
                serde_json::to_string(&p.status).unwrap_or_default(),
                lines("kube-scheduler"),
                lines("extender")
            ));
        }
    }
    let (_, _) = capacity_check(c).await?;
    let bound_now = api_bound(c, ns).await?;
    ensure(
        bound_now.len() >= 20,
        format!("only {} of 30 pods bound after the outage", bound_now.len()),
    )?;
    wait_for(
        "the ledger to agree with the API",
        Duration::from_secs(150),
        || {
            let want = bound_now.clone();
            async move {
                let held = ledger_pods(c, ns)?;
                Ok((held == want).then_some(()))
            }
        },
    )
    .await
    .map_err(|e| {
        format!(
            "{e}: ledger {:?} vs API {:?}",
            ledger_pods(c, ns),
            bound_now
        )
    })?;
    c.delete_pods(ns).await?;
    wait_for(
        "the ledger to release every deleted pod",
        Duration::from_secs(60),
        || async move { Ok(ledger_pods(c, ns)?.is_empty().then_some(())) },
    )
    .await
    .map_err(|e| {
        let log = c.log("extender");
        let watch: Vec<&str> = log
            .lines()
            .filter(|l| !l.contains("/readyz") && !l.contains("/livez"))
            .rev()
            .take(60)
            .collect();
        format!(
            "{e}: ledger still holds {:?}\nextender's last lines (newest first):\n{}",
            ledger_pods(c, ns),
            watch.join("\n")
        )
    })?;
    tracing::info!(
        retries,
        bound = bound_now.len(),
        "API server outage: ledger and API agree"
    );
    Ok(())
}

// ---- 9. nodes as NVIDIA's own code labels them ------------------------------------------------------

/// What the fixture nodes are registered as: `nv-` and their name, so that none meets a node of
/// tests/cluster/nodes.yaml (both have an `l40s-plain`).
const NV: &str = "nv-";

/// Registers every node of tests/fixtures/nvidia/nodes.yaml (labels from GFD's code, allocatable
/// from the device plugin's) under its `nv-` name, as a kubelet would.
fn register_nvidia_nodes(c: &Cluster) -> Check {
    let mut items = Vec::new();
    for n in common::nvidia::nodes() {
        let mut v = serde_json::to_value(&n).map_err(|e| e.to_string())?;
        let name = format!("{NV}{}", n.metadata.name.as_deref().unwrap_or_default());
        v["metadata"]["name"] = json!(name);
        v["metadata"]["labels"]["kubernetes.io/hostname"] = json!(name);
        items.push(v);
    }
    let file = c.dir.join("nvidia-nodes.json");
    std::fs::write(
        &file,
        json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string(),
    )
    .map_err(|e| e.to_string())?;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let status = std::process::Command::new("python3")
        .arg(root.join("tests/cluster/nodes.py"))
        .arg(&c.dir)
        .arg(&file)
        .status()
        .map_err(|e| e.to_string())?;
    ensure(status.success(), "register NVIDIA's nodes")
}

/// The extender's `/v1/nodes` reports of the `nv-` nodes, by fixture name.
fn nvidia_reports(
    c: &Cluster,
) -> Result<BTreeMap<String, gpu_share::extender::report::NodeReport>, String> {
    let v = c.admin_json("EXTENDER_ADMIN", "/v1/nodes")?;
    let reports: Vec<gpu_share::extender::report::NodeReport> =
        serde_json::from_value(v).map_err(|e| format!("/v1/nodes: {e}"))?;
    Ok(reports
        .into_iter()
        .filter_map(|mut r| {
            r.name = r.name.strip_prefix(NV)?.to_string();
            Some((r.name.clone(), r))
        })
        .collect())
}

/// Asks the cluster's extender directly, as kube-scheduler does: over TLS with the CA and the
/// server name of the shipped scheduler configuration (the scheduler pod's own loopback CA). For what kube-scheduler's own resource
/// check hides: the extender's own answer about nodes that lack the pod's resource.
fn ask_extender(c: &Cluster, verb: &str, args: &Value) -> Result<Value, String> {
    let port = c
        .var("EXTENDER")
        .rsplit(':')
        .next()
        .ok_or("no extender port")?;
    let host = "gpu-share.gpu-share.svc";
    let mut child = std::process::Command::new("curl")
        .args(["-sS", "--fail-with-body", "--max-time", "10"])
        .args(["--cacert", c.var("EXTENDER_CA")])
        .args(["--resolve", &format!("{host}:{port}:127.0.0.1")])
        .args([
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            "@-",
        ])
        .arg(format!("https://{host}:{port}/scheduler/{verb}"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().ok_or("curl's stdin")?;
        stdin
            .write_all(args.to_string().as_bytes())
            .map_err(|e| e.to_string())?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "POST /scheduler/{verb}: {}{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("/scheduler/{verb}: {e}"))
}

/// The pod as the API holds it, as kube-scheduler would send it to the extender.
async fn pod_json(pods: &Api<Pod>, name: &str) -> Result<Value, String> {
    let p = pods
        .get(name)
        .await
        .map_err(|e| format!("get {name}: {e}"))?;
    serde_json::to_value(p).map_err(|e| e.to_string())
}

/// Asks the extender to filter, prioritize and preempt `pod` over `nodes`; checks that only
/// nodes of `passing` pass, each of them alone too, that every node listed in `lacking` is
/// refused (alone) as unresolvable with the resource named in words, gets no score, and is
/// offered no victims.
fn lacking_nodes_refused(
    c: &Cluster,
    pod: &Value,
    nodes: &[&str],
    passing: &[&str],
    lacking: &[&str],
    resource: &str,
) -> Check {
    let names: Vec<String> = nodes.iter().map(|n| format!("{NV}{n}")).collect();
    let filter = |names: &[String]| {
        ask_extender(
            c,
            "filter",
            &json!({"Pod": pod, "Nodes": null, "NodeNames": names}),
        )
    };
    let passed_by = |r: &Value| -> BTreeSet<String> {
        r["NodeNames"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect()
    };
    // Filter passes the best packed of the fitting nodes (packing.candidates: best) and names
    // reasons only when none fits: over every node, some of `passing` pass and nothing else;
    // each node alone passes, or is refused with the resource named.
    let r = filter(&names)?;
    let passed = passed_by(&r);
    let want: BTreeSet<String> = passing.iter().map(|n| format!("{NV}{n}")).collect();
    ensure(
        !passed.is_empty() && passed.is_subset(&want),
        format!("filter passed {passed:?}, expected some of {want:?}: {r}"),
    )?;
    for n in &want {
        let r = filter(std::slice::from_ref(n))?;
        ensure(
            passed_by(&r) == BTreeSet::from([n.clone()]),
            format!("filter did not pass {n} alone: {r}"),
        )?;
    }
    let words = format!("node does not advertise {resource}, the resource the pod's limits name");
    for n in lacking {
        let r = filter(&[format!("{NV}{n}")])?;
        let got = &r["FailedAndUnresolvableNodes"][format!("{NV}{n}")];
        ensure(
            got == &json!(words),
            format!("filter's reason for {n}: {got}, expected {words:?}"),
        )?;
    }
    let scores = ask_extender(
        c,
        "prioritize",
        &json!({"Pod": pod, "Nodes": null, "NodeNames": names}),
    )?;
    for e in scores.as_array().into_iter().flatten() {
        let host = e["Host"].as_str().unwrap_or_default();
        if lacking.iter().any(|n| host == format!("{NV}{n}")) {
            ensure(e["Score"] == 0, format!("prioritize scored {e}"))?;
        }
    }
    let victims: serde_json::Map<String, Value> = lacking
        .iter()
        .map(|n| {
            (
                format!("{NV}{n}"),
                json!({"Pods": [], "NumPDBViolations": 0}),
            )
        })
        .collect();
    let r = ask_extender(
        c,
        "preempt",
        &json!({"Pod": pod, "NodeNameToVictims": null, "NodeNameToMetaVictims": victims}),
    )?;
    ensure(
        r["NodeNameToMetaVictims"] == json!({}),
        format!("preempt offered nodes that lack {resource}: {r}"),
    )
}

/// Under the default policy (`mig.strategy: auto`) a MIG pod asks for what the nodes offering
/// its profile advertise. This cluster offers `1g.5gb` in both forms on purpose: as
/// nvidia.com/gpu on GFD's single-strategy A100 (14) and GKE's partitioned one (7), as
/// nvidia.com/mig-1g.5gb on the AKS pool (7). The pod asks for nvidia.com/gpu, the API server
/// hands kubectl the webhook's warning about the 7 it cannot reach, and kube-scheduler binds it
/// to a single-strategy node through the extender. The later points exercise both forms at
/// once (MIG pods on the mixed nodes, device-plugin units on the single ones), so they run under
/// `mig.strategy: mixed`, set here.
async fn mig_form_follows_the_nodes(c: &Cluster) -> Check {
    let ns = "mig-form";
    c.namespace(ns, json!({})).await?;
    let result = async {
        let (pod, warnings) = create(c, ns, &gpu_pod("auto-1g5", "mig-1g.5gb"))?;
        let limits = &pod["spec"]["containers"][0]["resources"]["limits"];
        ensure(
            limits["nvidia.com/gpu"] == "1" && limits.get("nvidia.com/mig-1g.5gb").is_none(),
            format!("mig-1g.5gb written as {limits}; expected nvidia.com/gpu"),
        )?;
        ensure(
            warnings.contains("21 devices")
                && warnings.contains("the 7 devices on mixed-strategy nodes"),
            format!("kubectl printed no warning about the other form's devices: {warnings:?}"),
        )?;
        let pods: Api<Pod> = Api::namespaced(c.client.clone(), ns);
        let (node, _) = bound(&pods, "auto-1g5", Duration::from_secs(60)).await?;
        ensure(
            ["a100-mig-single", "gke-a100-mig"].contains(&node.as_str()),
            format!("mig-1g.5gb bound to {node}; expected a single-strategy node"),
        )
    }
    .await;
    let deleted = c.delete_pods(ns).await;
    let mixed = std::fs::read_to_string(policy_path(c))
        .map_err(|e| e.to_string())?
        .replace("strategy: auto", "strategy: mixed");
    let set = set_policy(c, &mixed).await;
    result.and(deleted).and(set)
}

/// The policy file both gpu-share processes read (and reload every 5 s).
fn policy_path(c: &Cluster) -> std::path::PathBuf {
    c.dir.join("policy/policy.yaml")
}

/// The policy reloads each process has counted.
fn policy_reloads(c: &Cluster) -> Result<(f64, f64), String> {
    let count = |admin: &str| -> Result<f64, String> {
        Ok(c.admin_text(admin, "/metrics")?
            .lines()
            .filter(|l| l.starts_with("gpu_share_policy_reloads_total{") && l.contains("\"ok\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    };
    Ok((count("WEBHOOK_ADMIN")?, count("EXTENDER_ADMIN")?))
}

/// Writes the policy file as a ConfigMap update would (a whole new file, never half of one) and
/// waits until both the webhook and the extender have loaded it.
async fn set_policy(c: &Cluster, text: &str) -> Check {
    let before = policy_reloads(c)?;
    let path = policy_path(c);
    let tmp = path.with_extension("yaml.new");
    std::fs::write(&tmp, text).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, &path).map_err(|e| e.to_string())?;
    wait_for(
        "the webhook and the extender to reload the policy",
        Duration::from_secs(60),
        || async move {
            let now = policy_reloads(c)?;
            Ok((now.0 > before.0 && now.1 > before.1).then_some(()))
        },
    )
    .await
}

/// Waits until `/v1/nodes` shows whether each of `nodes` is out of reach as wanted.
async fn wait_unreached(c: &Cluster, nodes: &[(&str, bool)]) -> Check {
    wait_for(
        "/v1/nodes to read the nodes under the policy",
        Duration::from_secs(60),
        || async move {
            let reports = nvidia_reports(c)?;
            Ok(nodes
                .iter()
                .all(|(n, want)| {
                    reports
                        .get(*n)
                        .is_some_and(|r| r.unreached.is_some() == *want)
                })
                .then_some(()))
        },
    )
    .await
    .map_err(|e| {
        let reports = nvidia_reports(c).unwrap_or_default();
        let got: Vec<String> = nodes
            .iter()
            .map(|(n, _)| format!("{n}: {:?}", reports.get(*n).map(|r| &r.unreached)))
            .collect();
        format!("{e}: {}", got.join("; "))
    })
}

/// A pod of `class` (or any pod) pinned by a nodeSelector to the `nv-` node `node`.
fn pinned_pod(name: &str, class: &str, node: &str) -> Value {
    let mut p = gpu_pod(name, class);
    p["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": format!("{NV}{node}")});
    p
}

/// Waits until `name` is bound, and checks it is bound to the `nv-` node `node`.
async fn bound_to(c: &Cluster, pods: &Api<Pod>, name: &str, node: &str) -> Check {
    let ns = pods.namespace().unwrap_or_default().to_string();
    let (on, _) = match bound(pods, name, Duration::from_secs(60)).await {
        Ok(b) => b,
        Err(e) => {
            let why = failed_scheduling(c, &ns, name).await.unwrap_or_else(|e| e);
            return Err(format!("{e}: {why}"));
        }
    };
    ensure(
        on == format!("{NV}{node}"),
        format!("{name} bound to {on}, not {NV}{node}"),
    )
}

/// Point 10: what holds a share's memory, on the real control plane. Under
/// `enforcement.budgets: required` a budgeted time-sliced pod finds no node (the cluster's
/// drivers are R550, without per-container limits) and waits with gpu-share's sentence in its
/// event, while an MPS pod is bound (the device plugin's split holds it) and says so on the pod;
/// its container carries the budget as the toolkit's hook reads it. With the time-sliced node's
/// driver labelled r615 and the hook declared, the same pod is bound there, held by the driver.
async fn budgets_held(c: &Cluster) -> Check {
    let ns = "budgets";
    c.namespace(ns, json!({})).await?;
    let shipped = std::fs::read_to_string(policy_path(c)).map_err(|e| e.to_string())?;
    let result = budgets_held_in(c, ns, &shipped).await;
    let mut cleanup = vec![c.delete_pods(ns).await];
    let out = c.kubectl(
        &[
            "label",
            "node",
            "l4-timeslice-4",
            "--overwrite",
            "nvidia.com/cuda.driver-version.full=550.107.02",
            "nvidia.com/cuda.driver-version.major-",
        ],
        None,
    );
    cleanup.push(ensure(
        out.status.success(),
        format!(
            "label the node back: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    ));
    if std::fs::read_to_string(policy_path(c)).ok().as_deref() != Some(shipped.as_str()) {
        cleanup.push(set_policy(c, &shipped).await);
    }
    result?;
    cleanup.into_iter().collect()
}

async fn budgets_held_in(c: &Cluster, ns: &str, shipped: &str) -> Check {
    const HELD_BY: &str = "gpu-share.io/memory-held-by";
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), ns);
    ensure(
        shipped.contains("budgets: preferred"),
        "the shipped policy says budgets: preferred",
    )?;
    set_policy(
        c,
        &shipped.replace("budgets: preferred", "budgets: required"),
    )
    .await?;
    let budgeted = |name: &str, class: &str| {
        pod(
            name,
            json!({"gpu-share": class, "gpu-share/memory": "1Gi"}),
            json!({}),
        )
    };
    // Time-slicing holds no memory, and no node here has the driver's limits.
    let (ts, _) = create(c, ns, &budgeted("ts-required", "timeslice-25"))?;
    let env = env_of(&ts);
    for name in ["NVIDIA_GPU_MEMORY_REQUEST", "NVIDIA_GPU_MEMORY_LIMIT"] {
        ensure(
            env.get(name).map(String::as_str) == Some("1024"),
            format!("{name} in the container: {env:?}"),
        )?;
    }
    let why = failed_scheduling(c, ns, "ts-required").await?;
    ensure(
        why.contains("nothing on this node holds a share's memory"),
        format!("ts-required waits for the wrong reason: {why}"),
    )?;
    // The device plugin's MPS split holds an MPS share: bound, and said on the pod.
    create(c, ns, &budgeted("mps-required", "mps-25"))?;
    bound(&pods, "mps-required", Duration::from_secs(60)).await?;
    let mps = pod_json(&pods, "mps-required").await?;
    ensure(
        annotation(&mps, HELD_BY) == Some("device-plugin-mps"),
        format!("mps-required: {HELD_BY} {:?}", annotation(&mps, HELD_BY)),
    )?;
    // An r615 driver on the time-sliced node, the hook declared: held by the driver there (the
    // waiting pod goes first, so that the new one meets the node's room alone).
    let gone = c.kubectl(
        &[
            "delete",
            "pod",
            "-n",
            ns,
            "ts-required",
            "--grace-period=0",
            "--wait=true",
        ],
        None,
    );
    ensure(
        gone.status.success(),
        format!(
            "delete ts-required: {}",
            String::from_utf8_lossy(&gone.stderr)
        ),
    )?;
    let out = c.kubectl(
        &[
            "label",
            "node",
            "l4-timeslice-4",
            "--overwrite",
            "nvidia.com/cuda.driver-version.full=615.25.01",
            "nvidia.com/cuda.driver-version.major=615",
        ],
        None,
    );
    ensure(
        out.status.success(),
        format!("label the node: {}", String::from_utf8_lossy(&out.stderr)),
    )?;
    let hooked = shipped
        .replace("budgets: preferred", "budgets: required")
        .replace("memoryLimitHook: false", "memoryLimitHook: true");
    set_policy(c, &hooked).await?;
    wait_for(
        "/v1/nodes to read l4-timeslice-4 with the driver's limits",
        Duration::from_secs(60),
        || async move {
            let nodes = c.admin_json("EXTENDER_ADMIN", "/v1/nodes")?;
            Ok(nodes
                .as_array()
                .into_iter()
                .flatten()
                .any(|n| n["name"] == "l4-timeslice-4" && n["driverMemoryLimits"] == true)
                .then_some(()))
        },
    )
    .await?;
    create(c, ns, &budgeted("ts-held", "timeslice-25"))?;
    let (node, _) = bound(&pods, "ts-held", Duration::from_secs(60)).await?;
    let held = pod_json(&pods, "ts-held").await?;
    ensure(
        node == "l4-timeslice-4" && annotation(&held, HELD_BY) == Some("driver-limit"),
        format!(
            "ts-held bound to {node}, {HELD_BY} {:?}",
            annotation(&held, HELD_BY)
        ),
    )
}

/// Every node of tests/fixtures/nvidia/nodes.yaml (labels from GFD's code, allocatable from the
/// device plugin's) registered with the real kube-apiserver: the extender reads each right
/// (GPUs, resource, replicas, MIG devices, memory; fix 1: the A100 80GB single-strategy nodes
/// are 8 GPUs, not 14); it shows the nodes no pod of their class can use and warns about each
/// once (fix 2); kube-scheduler binds pods there through it, and it refuses nodes lacking the
/// pod's resource in words (fix 3). Then, under a policy whose MIG strategy is single and whose
/// time-sliced pods ask for `nvidia.com/gpu.shared` (a reload, read at once): a single-strategy
/// MIG pod binds to a node GFD alone labelled, as to one the MIG manager labelled (fix 4), and a
/// time-sliced pod to the renamed node. The shipped policy is restored and the nodes removed
/// whatever happened.
async fn nvidia_nodes(c: &Cluster) -> Check {
    let ns = "nvidia";
    c.namespace(ns, json!({})).await?;
    let shipped = std::fs::read_to_string(policy_path(c)).map_err(|e| e.to_string())?;
    let result = nvidia_nodes_in(c, ns, &shipped).await;
    let mut cleanup = Vec::new();
    if std::fs::read_to_string(policy_path(c)).ok().as_deref() != Some(shipped.as_str()) {
        cleanup.push(set_policy(c, &shipped).await);
    }
    cleanup.push(c.delete_pods(ns).await);
    let names: Vec<String> = common::nvidia::nodes()
        .iter()
        .map(|n| format!("{NV}{}", n.metadata.name.as_deref().unwrap_or_default()))
        .collect();
    let mut args = vec!["delete", "node", "--ignore-not-found", "--wait=false"];
    args.extend(names.iter().map(String::as_str));
    let out = c.kubectl(&args, None);
    cleanup.push(ensure(
        out.status.success(),
        format!("delete the nodes: {}", String::from_utf8_lossy(&out.stderr)),
    ));
    result?;
    cleanup.into_iter().collect()
}

async fn nvidia_nodes_in(c: &Cluster, ns: &str, shipped: &str) -> Check {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), ns);
    let fixtures = common::nvidia::nodes();
    register_nvidia_nodes(c)?;
    let reports = wait_for(
        "the extender to list NVIDIA's nodes",
        Duration::from_secs(60),
        || async move {
            let r = nvidia_reports(c)?;
            Ok((r.len() == common::nvidia::EXPECTED.len()).then_some(r))
        },
    )
    .await?;
    // Read right, each of them; under the shipped policy (mixed strategy, shared pods asking
    // for nvidia.com/gpu) the renamed and the single-strategy nodes are out of reach.
    for n in &fixtures {
        let name = n.metadata.name.as_deref().unwrap_or_default();
        let r = reports.get(name).ok_or_else(|| format!("{name} missing"))?;
        common::nvidia::check_report(r, n).map_err(|e| format!("/v1/nodes: {e}"))?;
        let want = name.ends_with("-rename") || common::nvidia::single(n);
        ensure(
            r.unreached.is_some() == want,
            format!("/v1/nodes: {name} unreached {:?}", r.unreached),
        )?;
    }
    // Warned about once, and listed as unusable by `gpu-share status`.
    let log = c.log("extender");
    let renamed = format!("{NV}h100-80gb-ts4-rename");
    let warned = log
        .lines()
        .filter(|l| l.contains(&renamed) && l.contains("no timeslice pod can use this node"))
        .count();
    ensure(
        warned == 1,
        format!("the extender warned about {renamed} {warned} times, not once"),
    )?;
    let text = status_from_cluster(c)?;
    ensure(
        text.contains(&format!(
            "unusable: {renamed}: no timeslice pod can use this node: they ask for nvidia.com/gpu"
        )),
        format!("gpu-share status does not show {renamed} as unusable:\n{text}"),
    )?;

    // Bound through the extender: a MIG pod on a mixed node GFD alone labelled, a time-sliced
    // pod on the node that advertises nvidia.com/gpu. The renamed node lacks it.
    for (name, class, node) in [
        (
            "mig-gfd",
            "mig-1g.10gb",
            "a100-80gb-mig-mixed-no-mig-config",
        ),
        ("ts", "timeslice-50", "h100-80gb-ts4"),
        ("ts-renamed", "timeslice-50", "h100-80gb-ts4-rename"),
        ("single", "mig-1g.10gb", "a100-80gb-mig-single-all-1g.10gb"),
    ] {
        create(c, ns, &pinned_pod(name, class, node)).map_err(|e| format!("{name}: {e}"))?;
    }
    bound_to(c, &pods, "mig-gfd", "a100-80gb-mig-mixed-no-mig-config").await?;
    bound_to(c, &pods, "ts", "h100-80gb-ts4").await?;
    // The renamed node has the time-slicing labels the pod's affinity asks for, and fails on
    // the resource; the single-strategy node fails on the mixed strategy's affinity first.
    for (name, reason) in [
        ("ts-renamed", "Insufficient nvidia.com/gpu"),
        ("single", "didn't match Pod's node affinity/selector"),
    ] {
        let message = failed_scheduling(c, ns, name).await?;
        ensure(message.contains(reason), format!("{name}: {message}"))?;
    }
    // kube-scheduler's own resource check turned those away before the extender; asked
    // directly, the extender refuses them too, in words.
    let ts = pod_json(&pods, "ts-renamed").await?;
    lacking_nodes_refused(
        c,
        &ts,
        &["h100-80gb-ts4", "h100-80gb-ts4-rename"],
        &["h100-80gb-ts4"],
        &["h100-80gb-ts4-rename"],
        "nvidia.com/gpu",
    )?;
    let mig = pod_json(&pods, "single").await?;
    lacking_nodes_refused(
        c,
        &mig,
        &[
            "a100-80gb-mig-single-all-1g.10gb",
            "h100-80gb-mig-single-all-1g.10gb",
            "a100-80gb-mig-mixed-all-1g.10gb",
        ],
        &["a100-80gb-mig-mixed-all-1g.10gb"],
        &[
            "a100-80gb-mig-single-all-1g.10gb",
            "h100-80gb-mig-single-all-1g.10gb",
        ],
        "nvidia.com/mig-1g.10gb",
    )?;

    // The single strategy, and time-sliced pods asking for nvidia.com/gpu.shared.
    let mut changed = shipped.replacen("strategy: mixed", "strategy: single", 1);
    changed = changed.replacen(
        "  shared: nvidia.com/gpu\n",
        "  shared: nvidia.com/gpu\n  timeslice: nvidia.com/gpu.shared\n",
        1,
    );
    ensure(
        changed.contains("strategy: single")
            && changed.contains("timeslice: nvidia.com/gpu.shared"),
        format!("the shipped policy's text changed shape:\n{shipped}"),
    )?;
    set_policy(c, &changed).await?;
    wait_unreached(
        c,
        &[
            ("h100-80gb-ts4-rename", false),
            ("h100-80gb-ts4", true),
            ("a100-80gb-mig-single-no-mig-config", false),
            ("a100-80gb-mig-single-all-1g.10gb", false),
            ("a100-80gb-mig-mixed-all-1g.10gb", true),
        ],
    )
    .await?;
    let single_nodes = [
        "a100-80gb-mig-single-no-mig-config",
        "a100-80gb-mig-single-all-1g.10gb",
    ];
    for (name, class, node) in [
        ("single-gfd", "mig-1g.10gb", single_nodes[0]),
        ("single-mig-manager", "mig-1g.10gb", single_nodes[1]),
        ("ts-shared", "timeslice-50", "h100-80gb-ts4-rename"),
        (
            "single-on-mixed",
            "mig-1g.10gb",
            "a100-80gb-mig-mixed-all-1g.10gb",
        ),
    ] {
        let (admitted, _) =
            create(c, ns, &pinned_pod(name, class, node)).map_err(|e| format!("{name}: {e}"))?;
        let want = if class.starts_with("mig-") {
            "nvidia.com/gpu"
        } else {
            "nvidia.com/gpu.shared"
        };
        ensure(
            limits(&admitted).get(want).map(String::as_str) == Some("1"),
            format!("{name}: limits {:?}, expected {want}: 1", limits(&admitted)),
        )?;
    }
    bound_to(c, &pods, "single-gfd", single_nodes[0]).await?;
    bound_to(c, &pods, "single-mig-manager", single_nodes[1]).await?;
    bound_to(c, &pods, "ts-shared", "h100-80gb-ts4-rename").await?;
    failed_scheduling(c, ns, "single-on-mixed").await?;
    let on_mixed = pod_json(&pods, "single-on-mixed").await?;
    lacking_nodes_refused(
        c,
        &on_mixed,
        &[single_nodes[0], "a100-80gb-mig-mixed-all-1g.10gb"],
        &[single_nodes[0]],
        &["a100-80gb-mig-mixed-all-1g.10gb"],
        "nvidia.com/gpu",
    )?;
    // Counted on the node's own model: a 1g.10gb device is 1/7 of an A100 80GB.
    let reports = nvidia_reports(c)?;
    for node in single_nodes {
        let r = reports.get(node).ok_or_else(|| format!("{node} missing"))?;
        ensure(
            r.gpus == 8
                && r.mig.get("1g.10gb").map(String::as_str) == Some("1/56")
                && (r.used_gpus - 1.0 / 7.0).abs() < 0.002,
            format!("/v1/nodes: {node}: {r:?}"),
        )?;
    }
    Ok(())
}

// ---- RBAC --------------------------------------------------------------------------------------------

/// Removes `pods/binding` from a ClusterRole's rules; returns the copy and whether it had it.
fn without_binding(role: &Value, name: &str) -> (Value, bool) {
    let mut cut = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [],
    });
    let mut had = false;
    for rule in role["rules"].as_array().into_iter().flatten() {
        let mut rule = rule.clone();
        if let Some(resources) = rule["resources"].as_array_mut() {
            let n = resources.len();
            resources.retain(|r| r != "pods/binding");
            had |= resources.len() != n;
            if resources.is_empty() {
                continue;
            }
        }
        cut["rules"].as_array_mut().unwrap().push(rule);
    }
    (cut, had)
}

/// An object as read from the API, without the fields the server sets, for `kubectl replace`.
fn for_replace(mut obj: Value) -> Value {
    if let Some(m) = obj["metadata"].as_object_mut() {
        for key in [
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "managedFields",
        ] {
            m.remove(key);
        }
    }
    obj
}

fn role_binding(name: &str, role: &str) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "gpu-share", "app.kubernetes.io/part-of": "gpu-share", "app.kubernetes.io/component": "scheduler"}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": "gpu-share-scheduler", "namespace": "gpu-share"}],
    })
}

/// The log check, with `pods/binding create` taken away: it must fail, naming the verb.
///
/// The extender shares the scheduler pod's ServiceAccount, which holds `pods/binding create`
/// twice: through the ClusterRole gpu-share-extender and through the built-in
/// system:kube-scheduler. Both grants go: gpu-share-extender is replaced by a copy without it,
/// and the binding to system:kube-scheduler is pointed at such a copy of that role. Then both are
/// restored as shipped.
async fn rbac_sees_a_missing_verb(c: &Cluster) -> Check {
    let ns = "rbac";
    c.namespace(ns, json!({})).await?;
    let get = |what: &[&str]| -> Result<Value, String> {
        let out = c.kubectl(&[&["get"][..], what, &["-o", "json"][..]].concat(), None);
        ensure(out.status.success(), format!("get {what:?}"))?;
        serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
    };
    let shipped_role = get(&["clusterrole", "gpu-share-extender"])?;
    let shipped_binding = get(&["clusterrolebinding", "gpu-share-scheduler:kube-scheduler"])?;
    let builtin = get(&["clusterrole", "system:kube-scheduler"])?;
    let (cut_role, had) = without_binding(&shipped_role, "gpu-share-extender");
    ensure(
        had,
        "the shipped ClusterRole gpu-share-extender grants pods/binding",
    )?;
    let copy = "gpu-share-test:kube-scheduler-without-binding";
    let (cut_builtin, _) = without_binding(&builtin, copy);
    let apply = |obj: &Value, verb: &str| -> Check {
        let out = c.kubectl(&[verb, "-f", "-"], Some(&obj.to_string()));
        ensure(
            out.status.success(),
            format!("kubectl {verb}: {}", String::from_utf8_lossy(&out.stderr)),
        )
    };
    let offsets = log_offsets(c);
    apply(&cut_builtin, "apply")?;
    let rebind = |role: &str| -> Check {
        let out = c.kubectl(
            &[
                "delete",
                "clusterrolebinding",
                "gpu-share-scheduler:kube-scheduler",
            ],
            None,
        );
        ensure(out.status.success(), "delete the ClusterRoleBinding")?;
        apply(
            &role_binding("gpu-share-scheduler:kube-scheduler", role),
            "create",
        )
    };
    rebind(copy)?;
    let mut role = cut_role;
    role["metadata"] = shipped_role["metadata"].clone();
    apply(&for_replace(role), "replace")?;
    tokio::time::sleep(Duration::from_secs(2)).await;

    create(c, ns, &gpu_pod("probe", "timeslice-25"))?;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), ns);
    let bound_anyway = bound(&pods, "probe", Duration::from_secs(15)).await.is_ok();
    let seen = forbidden_lines(c, &offsets, None);

    // Restore what shipped; the probe is then bound on kube-scheduler's retry.
    apply(&for_replace(shipped_role), "replace")?;
    rebind(
        shipped_binding["roleRef"]["name"]
            .as_str()
            .unwrap_or("system:kube-scheduler"),
    )?;
    let _ = c.kubectl(&["delete", "clusterrole", copy], None);

    ensure(!bound_anyway, "a pod was bound without pods/binding create")?;
    ensure(
        seen.iter().any(|l| l.contains("pods/binding")),
        format!("the 403 check did not see the missing pods/binding verb: {seen:?}"),
    )?;
    bound(&pods, "probe", Duration::from_secs(60))
        .await
        .map_err(|e| format!("after the shipped RBAC was restored: {e}"))?;
    c.delete_pods(ns).await
}

// ---- the logs ------------------------------------------------------------------------------------

/// Lines of gpu-share's and kube-scheduler's logs that show an API call refused by RBAC, from
/// byte `from` of each log on.
fn forbidden_lines(
    c: &Cluster,
    from: &BTreeMap<&'static str, usize>,
    to: Option<&BTreeMap<&'static str, usize>>,
) -> Vec<String> {
    let mut found = Vec::new();
    for name in ["webhook", "extender", "kube-scheduler"] {
        let log = c.log(name);
        let start = from.get(name).copied().unwrap_or(0).min(log.len());
        let end = to
            .and_then(|t| t.get(name).copied())
            .unwrap_or(log.len())
            .clamp(start, log.len());
        for line in log[start..end].lines() {
            let l = line.to_ascii_lowercase();
            // RBAC's own words ("pods/binding is forbidden: User ... cannot create ...") or the
            // status code as kube-rs and client-go print it.
            if l.contains("is forbidden: user")
                || l.contains("code: 403")
                || l.contains("\"code\":403")
                || l.contains("reason: \"forbidden\"")
            {
                found.push(format!(
                    "{name}: {}",
                    line.chars().take(400).collect::<String>()
                ));
            }
        }
    }
    found
}

fn log_offsets(c: &Cluster) -> BTreeMap<&'static str, usize> {
    ["webhook", "extender", "kube-scheduler"]
        .into_iter()
        .map(|n| (n, c.log(n).len()))
        .collect()
}

#[tokio::test]
#[ignore = "needs Go and a few minutes: cargo test --test cluster -- --ignored (CI runs it)"]
async fn gpu_share_on_a_real_control_plane() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let c = Cluster::start(common::BIN).await;
    let mut failures = Vec::new();

    point(
        &mut failures,
        "manifests apply without warnings",
        manifests_apply_cleanly(&c),
    )
    .await;
    point(
        &mut failures,
        "7. shipped scheduler config",
        shipped_scheduler_config(&c),
    )
    .await;
    point(
        &mut failures,
        "0. the MIG strategy follows the nodes",
        mig_form_follows_the_nodes(&c),
    )
    .await;
    point(&mut failures, "1. admission", admission(&c)).await;
    point(&mut failures, "2. scheduling", scheduling(&c)).await;
    point(&mut failures, "3. no overcommit", no_overcommit(&c)).await;
    point(&mut failures, "4. requeue", requeue(&c)).await;
    point(&mut failures, "5. preemption", preemption(&c)).await;
    point(&mut failures, "6. restart", restart(&c)).await;
    // A restarted API server refuses requests for a moment, until its RBAC caches have synced:
    // the 403 scan below skips the outage point's own lines.
    let before_outage = log_offsets(&c);
    point(
        &mut failures,
        "8. API server outage under load",
        apiserver_outage(&c),
    )
    .await;
    let after_outage = log_offsets(&c);
    point(
        &mut failures,
        "9. nodes as NVIDIA's own code labels them",
        nvidia_nodes(&c),
    )
    .await;

    point(
        &mut failures,
        "10. a share's memory held where the policy requires it",
        budgets_held(&c),
    )
    .await;
    point(
        &mut failures,
        "11. the webhook keeps its own certificates",
        keeper::keeps_its_certificates(&c),
    )
    .await;

    let mut forbidden = forbidden_lines(&c, &BTreeMap::new(), Some(&before_outage));
    forbidden.extend(forbidden_lines(&c, &after_outage, None));
    if !forbidden.is_empty() {
        failures.push(format!(
            "RBAC: the shipped roles were refused {} time(s): {}",
            forbidden.len(),
            forbidden.join("\n")
        ));
    }
    // Last, as it refuses the extender on purpose: the 403 check sees a missing verb.
    point(
        &mut failures,
        "RBAC: a ClusterRole without pods/binding create fails the 403 check",
        rbac_sees_a_missing_verb(&c),
    )
    .await;
    assert!(
        failures.is_empty(),
        "{} point(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

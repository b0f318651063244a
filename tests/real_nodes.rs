//! gpu-share's pods started by a real kubelet: the control plane of `tests/cluster/up.sh` with
//! two real nodes (`GPU_SHARE_CLUSTER_REAL_NODES`, tests/node/up.sh), each kubelet with
//! containerd 2 and runc, NVIDIA's container runtime in CDI mode as the `nvidia` handler, and the
//! stand-in GPU stack of tests/node/standin (NVIDIA's device plugin's answers, NVIDIA's CDI spec
//! forms, a stand-in `libnvidia-ml.so.1`) in place of GPUs:
//!   - `real-per-gpu`: A100 80GB x2 shared per GPU by gpu-share, the device plugin in its CDI
//!     strategy (containerd's own CDI support resolves what it allocates);
//!   - `real-mig`: A100 80GB x1 as 7x 1g.10gb, MIG mixed, the device plugin in its env strategy
//!     (NVIDIA's runtime resolves `NVIDIA_VISIBLE_DEVICES` from the CDI spec).
//!
//! Every container is `gpu-share.test/probe:1` (tests/node/probe): it prints its environment,
//! its device nodes and its mounts, so each point reads what the container was given from
//! inside it. No KWOK node is registered. The points run in the order 1, 2, 4, 5, 6, 3, 7: the
//! MPS points need the GPU the time-sliced share leaves (docs/real-nodes.md).
//!
//! Run: `cargo test --test real_nodes -- --ignored` (root; CI runs it; `.ci/run`).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::cluster::{Check, Cluster, ensure, point, wait_for};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

const NS: &str = "real-nodes";
const PER_GPU: &str = "real-per-gpu";
const MIG: &str = "real-mig";
const PROBE: &str = "gpu-share.test/probe:1";
const RESERVATIONS: &str = "gpu-share-reservations";

/// The stand-in GPUs of tests/node/nodes/NAME.json, by UUID: (minor, MIG device UUIDs).
fn standin_gpus(node: &str) -> BTreeMap<String, (u64, Vec<String>)> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/node/nodes")
        .join(format!("{node}.json"));
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("a node configuration"))
            .expect("JSON");
    config["plugin"]["standin"]["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .map(|g| {
            let minor = g["minor"].as_u64().or(g["index"].as_u64()).unwrap();
            let migs = g["mig"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| m["uuid"].as_str().unwrap().to_string())
                .collect();
            (g["uuid"].as_str().unwrap().to_string(), (minor, migs))
        })
        .collect()
}

/// What a probe container printed: its environment, its /dev entries, its mount points.
#[derive(Debug, Default)]
struct Probe {
    env: BTreeMap<String, String>,
    devices: Vec<String>,
    /// Mount point and file system type, as /proc/self/mounts lists them.
    mounts: Vec<(String, String)>,
}

impl Probe {
    fn parse(log: &str) -> Option<Probe> {
        let begin = log.find("probe: begin")?;
        let body = &log[begin..log[begin..].find("probe: end")? + begin];
        let mut p = Probe::default();
        let mut section = "";
        for line in body.lines() {
            if let Some(s) = line.strip_prefix("probe: ") {
                section = s;
                continue;
            }
            let line = line.trim_start();
            match section {
                "env" => {
                    if let Some((k, v)) = line.split_once('=') {
                        p.env.insert(k.to_string(), v.to_string());
                    }
                }
                // `ls -l /dev`: the name is the last field (before " -> " for a link).
                "devices" => {
                    let name = line.split(" -> ").next().unwrap_or_default();
                    if let Some(n) = name.split_whitespace().last()
                        && !line.starts_with("total")
                    {
                        p.devices.push(n.to_string());
                    }
                }
                "mounts" => {
                    let mut fields = line.split_whitespace().skip(1);
                    if let (Some(point), Some(fs)) = (fields.next(), fields.next()) {
                        p.mounts.push((point.to_string(), fs.to_string()));
                    }
                }
                _ => {}
            }
        }
        Some(p)
    }

    /// The stand-in GPUs (by UUID) whose device node and marker the container was given.
    fn gpus(&self) -> Vec<String> {
        self.env
            .iter()
            .filter_map(|(k, v)| {
                let minor = k.strip_prefix("GPU_SHARE_STANDIN_GPU_")?;
                self.devices
                    .contains(&format!("nvidia{minor}"))
                    .then(|| v.clone())
            })
            .collect()
    }

    /// The stand-in MIG devices (by UUID) the container was given.
    fn migs(&self) -> Vec<String> {
        self.env
            .iter()
            .filter(|(k, _)| k.starts_with("GPU_SHARE_STANDIN_MIG_"))
            .map(|(_, v)| v.clone())
            .collect()
    }
}

/// The probe's report of pod `ns/name`, once its container runs and has printed it.
async fn probe(c: &Cluster, ns: &str, name: &str) -> Result<Probe, String> {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), ns);
    wait_for(
        &format!("{ns}/{name} running under kubelet"),
        Duration::from_secs(120),
        || {
            let pods = pods.clone();
            async move {
                let p = pods.get(name).await.map_err(|e| e.to_string())?;
                let status = p.status.unwrap_or_default();
                // A per-GPU share waits in CreateContainerConfigError until its reservation
                // fills its ConfigMap; anything else a container waits in is a failure.
                if let Some(why) = status
                    .container_statuses
                    .iter()
                    .flatten()
                    .filter_map(|s| s.state.as_ref()?.waiting.as_ref()?.reason.clone())
                    .find(|r| r != "ContainerCreating" && r != "CreateContainerConfigError")
                {
                    return Err(format!("{ns}/{name}'s container waits: {why}"));
                }
                Ok((status.phase.as_deref() == Some("Running")).then_some(()))
            }
        },
    )
    .await?;
    wait_for(
        &format!("{ns}/{name}'s probe output"),
        Duration::from_secs(30),
        || async move {
            let out = c.kubectl(&["-n", ns, "logs", name], None);
            if !out.status.success() {
                return Err(format!(
                    "kubectl logs {ns}/{name}: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            Ok(Probe::parse(&String::from_utf8_lossy(&out.stdout)))
        },
    )
    .await
}

/// A first pod of `class` as docs/examples/first-pods writes it, the image replaced by the probe.
fn first_pod(class: &str, name: &str) -> Result<Pod, String> {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": {"gpu-share": class}},
        "spec": {"containers": [{
            "name": "main", "image": PROBE, "imagePullPolicy": "Never",
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        }]},
    }))
    .map_err(|e| e.to_string())
}

/// The env gpu-share wrote with a literal value, as the pod's spec holds it.
fn literal_env(p: &Pod) -> BTreeMap<String, String> {
    p.spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.env.iter().flatten())
        .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
        .collect()
}

/// Turns the policy's per-GPU form on for `timeslice` and `mps` (hot-reloaded; MPS clients run
/// as user 1000), reservations released 5 s after their last share.
async fn per_gpu_policy(c: &Cluster) -> Check {
    let reloads =
        |c: &Cluster| ["webhook", "extender"].map(|p| c.log(p).matches("policy reloaded").count());
    let before = reloads(c);
    let path = c.dir.join("policy/policy.yaml");
    let mut text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
    for (from, to) in [
        ("  timeslice: false\n", "  timeslice: true\n"),
        ("  mps: false\n", "  mps: true\n"),
        ("  # runAsUser: 1000\n", "  runAsUser: 1000\n"),
        ("  releaseAfterSeconds: 30\n", "  releaseAfterSeconds: 5\n"),
    ] {
        ensure(
            text.contains(from) || text.contains(to),
            format!("the policy file has no {from:?}"),
        )?;
        text = text.replacen(from, to, 1);
    }
    std::fs::write(&path, text).map_err(|e| e.to_string())?;
    // Both the webhook and the extender have read it again.
    wait_for(
        "the policy reloaded by the webhook and the extender",
        Duration::from_secs(60),
        || async move {
            let now = reloads(c);
            Ok((now[0] > before[0] && now[1] > before[1]).then_some(()))
        },
    )
    .await
}

/// 1. The first pod of each class the nodes offer runs, with the env, devices and runtime class
///    gpu-share wrote: `mig-1g.10gb` on the MIG node (a MIG device of its GPU), `exclusive-1`
///    and `timeslice-50` on the per-GPU node (a whole GPU each, the time-sliced one through its
///    reservation).
async fn first_pods(c: &Cluster) -> Check {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    let cases = [
        ("mig-1g.10gb", MIG),
        ("exclusive-1", PER_GPU),
        ("timeslice-50", PER_GPU),
    ];
    for (class, _) in cases {
        let name = format!("first-{}", class.replace('.', "-"));
        pods.create(&PostParams::default(), &first_pod(class, &name)?)
            .await
            .map_err(|e| format!("create a {class} pod: {e}"))?;
    }
    for (class, node) in cases {
        let name = format!("first-{}", class.replace('.', "-"));
        let report = probe(c, NS, &name).await?;
        let p = pods.get(&name).await.map_err(|e| e.to_string())?;
        let spec = p.spec.clone().unwrap_or_default();
        ensure(
            spec.node_name.as_deref() == Some(node),
            format!("{class}: on {:?}, not {node}", spec.node_name),
        )?;
        ensure(
            spec.runtime_class_name.as_deref() == Some("nvidia"),
            format!(
                "{class}: runtime class {:?}, not nvidia",
                spec.runtime_class_name
            ),
        )?;
        for (k, v) in literal_env(&p) {
            ensure(
                report.env.get(&k) == Some(&v),
                format!(
                    "{class}: {k}={v} written, {:?} in the container",
                    report.env.get(&k)
                ),
            )?;
        }
        let gpus = standin_gpus(node);
        if class.starts_with("mig-") {
            let migs = report.migs();
            ensure(
                migs.len() == 1 && gpus.values().any(|(_, m)| m.contains(&migs[0])),
                format!("{class}: MIG devices {migs:?} in the container, not one of {node}'s"),
            )?;
        } else {
            let seen = report.gpus();
            ensure(
                seen.len() == 1 && gpus.contains_key(&seen[0]),
                format!("{class}: GPUs {seen:?} in the container, not one of {node}'s"),
            )?;
        }
        eprintln!(
            "real nodes: {class} runs on {node}: GPUs {:?}, MIG {:?}",
            report.gpus(),
            report.migs()
        );
    }
    Ok(())
}

/// The reservation pods on the per-GPU node: (name, GPU UUID it published, when its container
/// started).
async fn reservations(c: &Cluster) -> Result<Vec<(String, String, String)>, String> {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), RESERVATIONS);
    let list = pods
        .list(&Default::default())
        .await
        .map_err(|e| e.to_string())?;
    Ok(list
        .items
        .into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(PER_GPU))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let uuid = p
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("gpu-share.io/gpu-uuid").cloned())
                .unwrap_or_default();
            let started = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref()?.first()?.state.clone())
                .and_then(|s| s.running?.started_at)
                .map(|t| t.0.to_string())
                .unwrap_or_default();
            (p.metadata.name.unwrap_or_default(), uuid, started)
        })
        .collect())
}

/// 2. The per-GPU share started only after its reservation pod ran, and sees the GPU its
///    ConfigMap names, which is the GPU the device plugin allocated to the reservation.
async fn share_follows_its_reservation(c: &Cluster) -> Check {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    let share = pods
        .get("first-timeslice-50")
        .await
        .map_err(|e| e.to_string())?;
    let report = probe(c, NS, "first-timeslice-50").await?;
    let configmap = share
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.env.iter().flatten())
        .find(|e| e.name == "NVIDIA_VISIBLE_DEVICES")
        .and_then(|e| e.value_from.as_ref()?.config_map_key_ref.clone())
        .ok_or("the share's NVIDIA_VISIBLE_DEVICES is not read from a ConfigMap")?;
    ensure(
        configmap.optional != Some(true),
        "the share's ConfigMap key is optional",
    )?;
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), NS);
    let named = cms
        .get(&configmap.name)
        .await
        .map_err(|e| e.to_string())?
        .data
        .and_then(|d| d.get(&configmap.key).cloned())
        .ok_or("the share's ConfigMap holds no GPU")?;
    let seen = report.gpus();
    ensure(
        seen == [named.clone()],
        format!("the share sees GPUs {seen:?}; its ConfigMap names {named}"),
    )?;
    let held = reservations(c).await?;
    let (name, uuid, started) = held
        .iter()
        .find(|(_, uuid, _)| *uuid == named)
        .ok_or(format!(
            "no reservation on {PER_GPU} published {named}: {held:?}"
        ))?;
    ensure(!uuid.is_empty(), "the reservation published no UUID")?;
    let share_started = share
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref()?.first()?.state.clone())
        .and_then(|s| s.running?.started_at)
        .map(|t| t.0.to_string())
        .unwrap_or_default();
    ensure(
        !started.is_empty() && share_started >= *started,
        format!(
            "the share started at {share_started}, its reservation {name} at {started}: before it"
        ),
    )?;
    eprintln!("real nodes: the share sees {named}, held by {name} (started {started})");
    Ok(())
}

/// 4. A share whose ConfigMap key is missing is not started: kubelet reports
///    `CreateContainerConfigError` and the container never runs. The pod references the key as
///    gpu-share writes it (non-optional), in a ConfigMap gpu-share has not filled.
async fn missing_key_never_starts(c: &Cluster) -> Check {
    // Only gpu-share writes a devices ConfigMap, except in a namespace opted out of the shipped
    // policies: the unfilled one is made there.
    let ns = "real-nodes-unfilled";
    c.namespace(ns, json!({"gpu-share.io/visible-devices": "allowed"}))
        .await?;
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), ns);
    let cm: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "gpu-share-devices-unfilled"}, "data": {}
    }))
    .map_err(|e| e.to_string())?;
    cms.create(&PostParams::default(), &cm)
        .await
        .map_err(|e| e.to_string())?;
    let share = Api::<Pod>::namespaced(c.client.clone(), NS)
        .get("first-timeslice-50")
        .await
        .map_err(|e| e.to_string())?;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), ns);
    let mut env: Value = serde_json::to_value(
        share.spec.as_ref().unwrap().containers[0]
            .env
            .clone()
            .unwrap_or_default(),
    )
    .map_err(|e| e.to_string())?;
    for e in env.as_array_mut().into_iter().flatten() {
        if let Some(r) = e.pointer_mut("/valueFrom/configMapKeyRef") {
            r["name"] = json!("gpu-share-devices-unfilled");
        }
    }
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "unfilled"},
        "spec": {
            "nodeName": PER_GPU, "runtimeClassName": "nvidia",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "main", "image": PROBE, "imagePullPolicy": "Never", "env": env}],
        },
    }))
    .map_err(|e| e.to_string())?;
    pods.create(&PostParams::default(), &pod)
        .await
        .map_err(|e| e.to_string())?;
    let why = wait_for(
        "kubelet's reason for not starting the share",
        Duration::from_secs(60),
        || {
            let pods = pods.clone();
            async move {
                let p = pods.get("unfilled").await.map_err(|e| e.to_string())?;
                let status = p.status.unwrap_or_default();
                ensure(
                    status.phase.as_deref() != Some("Running"),
                    "the share with no GPU runs",
                )?;
                Ok(status
                    .container_statuses
                    .iter()
                    .flatten()
                    .find_map(|s| s.state.as_ref()?.waiting.clone())
                    .filter(|w| w.reason.as_deref() != Some("ContainerCreating")))
            }
        },
    )
    .await?;
    ensure(
        why.reason.as_deref() == Some("CreateContainerConfigError"),
        format!("kubelet: {:?} ({:?})", why.reason, why.message),
    )?;
    // A while later it still never ran.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let p = pods.get("unfilled").await.map_err(|e| e.to_string())?;
    let status = p.status.unwrap_or_default();
    let ran =
        status.container_statuses.iter().flatten().any(|s| {
            s.restart_count > 0 || s.state.as_ref().is_some_and(|st| st.waiting.is_none())
        });
    ensure(!ran, "the share with no GPU started at some point")?;
    eprintln!("real nodes: kubelet: {:?}", why.message);
    pods.delete("unfilled", &DeleteParams::default())
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// What the node advertises of `resource` (allocatable).
async fn allocatable(c: &Cluster, node: &str, resource: &str) -> Result<u64, String> {
    let nodes: Api<Node> = Api::all(c.client.clone());
    let n = nodes.get(node).await.map_err(|e| e.to_string())?;
    let q = n
        .status
        .and_then(|s| s.allocatable)
        .and_then(|a| a.get(resource).map(|q| q.0.clone()))
        .ok_or(format!("{node} advertises no {resource}"))?;
    // Integers as the API server writes them: plain, or in thousands ("2k").
    match q.strip_suffix('k') {
        Some(k) => k.parse::<u64>().map(|k| k * 1000),
        None => q.parse(),
    }
    .map_err(|e| format!("{node}'s {resource} {q}: {e}"))
}

/// 5. kubelet admits `gpu-share.io/gpu-milli` against what the node advertises: a pod that
///    would overfill it is refused by kubelet itself (`OutOfgpu-share.io/gpu-milli`).
async fn kubelet_admits_gpu_milli(c: &Cluster) -> Check {
    let advertised = allocatable(c, PER_GPU, "gpu-share.io/gpu-milli").await?;
    let over = advertised + 1;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "overfill"},
        "spec": {
            "nodeName": PER_GPU, "restartPolicy": "Never",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "main", "image": PROBE, "imagePullPolicy": "Never",
                "resources": {"limits": {"gpu-share.io/gpu-milli": over.to_string()}}}],
        },
    }))
    .map_err(|e| e.to_string())?;
    pods.create(&PostParams::default(), &pod)
        .await
        .map_err(|e| e.to_string())?;
    let (reason, message) = wait_for(
        "kubelet's verdict on the overfilling pod",
        Duration::from_secs(60),
        || {
            let pods = pods.clone();
            async move {
                let p = pods.get("overfill").await.map_err(|e| e.to_string())?;
                let s = p.status.unwrap_or_default();
                ensure(
                    s.phase.as_deref() != Some("Running"),
                    "the overfilling pod runs",
                )?;
                Ok((s.phase.as_deref() == Some("Failed"))
                    .then(|| (s.reason.unwrap_or_default(), s.message.unwrap_or_default())))
            }
        },
    )
    .await?;
    ensure(
        reason == "OutOfgpu-share.io/gpu-milli",
        format!(
            "kubelet failed the pod with {reason:?} ({message}), not OutOfgpu-share.io/gpu-milli"
        ),
    )?;
    eprintln!("real nodes: {over} of {advertised} gpu-milli refused by kubelet: {message}");
    pods.delete("overfill", &DeleteParams::default())
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// 6. Deleting the share frees its GPU: its reservation is released (the policy's 5 s after the
///    last share), and the device plugin's GPU is free again for a whole-GPU pod.
async fn deleting_frees_the_gpu(c: &Cluster) -> Check {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    let before = wait_for(
        "the share's reservation, its GPU published",
        Duration::from_secs(60),
        || async move {
            let held = reservations(c).await?;
            Ok((!held.is_empty() && held.iter().all(|(_, u, _)| !u.is_empty())).then_some(held))
        },
    )
    .await?;
    pods.delete("first-timeslice-50", &DeleteParams::default())
        .await
        .map_err(|e| e.to_string())?;
    wait_for(
        "the share's reservation released",
        Duration::from_secs(90),
        || async move {
            let held = reservations(c).await?;
            Ok(held.is_empty().then_some(()))
        },
    )
    .await?;
    // The GPU is the device plugin's again: a second whole-GPU pod fits beside the first.
    pods.create(
        &PostParams::default(),
        &first_pod("exclusive-1", "second-exclusive")?,
    )
    .await
    .map_err(|e| e.to_string())?;
    let report = probe(c, NS, "second-exclusive").await?;
    let first = probe(c, NS, "first-exclusive-1").await?;
    ensure(
        report.gpus().len() == 1 && report.gpus() != first.gpus(),
        format!(
            "the second whole GPU {:?} is not the GPU the share's reservation held (the first exclusive pod has {:?})",
            report.gpus(),
            first.gpus()
        ),
    )?;
    let freed = before.iter().map(|(_, u, _)| u.clone()).collect::<Vec<_>>();
    ensure(
        freed == report.gpus(),
        format!(
            "the freed GPU {freed:?} is not the one the new pod got ({:?})",
            report.gpus()
        ),
    )?;
    // The GPU is left free for the MPS points.
    pods.delete("second-exclusive", &DeleteParams::default().grace_period(0))
        .await
        .map_err(|e| e.to_string())?;
    wait_for("second-exclusive gone", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move {
            Ok(pods
                .get_opt("second-exclusive")
                .await
                .map_err(|e| e.to_string())?
                .is_none()
                .then_some(()))
        }
    })
    .await
}

/// An MPS share as a restricted namespace runs it: user 1000 (the policy's `mps.runAsUser`).
fn mps_pod(name: &str) -> Result<Pod, String> {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": {"gpu-share": "mps-25"}},
        "spec": {
            "securityContext": {"runAsNonRoot": true, "runAsUser": 1000,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "main", "image": PROBE, "imagePullPolicy": "Never",
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
            }],
        },
    }))
    .map_err(|e| e.to_string())
}

/// The MPS reservation on the per-GPU node: (pod, UUID, container started at).
async fn mps_reservation(c: &Cluster) -> Result<Option<(Pod, String, String)>, String> {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), RESERVATIONS);
    let list = pods
        .list(&Default::default())
        .await
        .map_err(|e| e.to_string())?;
    Ok(list.items.into_iter().find_map(|p| {
        let a = p.metadata.annotations.clone().unwrap_or_default();
        if p.metadata.deletion_timestamp.is_some()
            || a.get("gpu-share.io/reserve-mps").map(String::as_str) != Some("true")
            || !a.contains_key("gpu-share.io/mps-pipe")
        {
            return None;
        }
        let uuid = a.get("gpu-share.io/gpu-uuid")?.clone();
        let started = p
            .status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .first()?
            .state
            .clone()?
            .running?
            .started_at?
            .0
            .to_string();
        Some((p, uuid, started))
    }))
}

/// When a pod's first container started.
fn started_at(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref()?.first()?.state.clone())
        .and_then(|s| s.running?.started_at)
        .map(|t| t.0.to_string())
        .unwrap_or_default()
}

/// What an MPS share must have been started with, read from inside it: its GPU, the CDI
/// device's pipe directory (mounted, and named by CUDA_MPS_PIPE_DIRECTORY), the daemon's
/// `/dev/shm` in place of the container's own, and its limits from its keys.
fn held_to_its_limits(name: &str, report: &Probe, uuid: &str) -> Check {
    ensure(
        report.gpus() == [uuid.to_string()],
        format!(
            "{name}: GPUs {:?} in the container, not {uuid}",
            report.gpus()
        ),
    )?;
    let pipe = report
        .env
        .get("CUDA_MPS_PIPE_DIRECTORY")
        .ok_or(format!("{name}: no CUDA_MPS_PIPE_DIRECTORY"))?;
    ensure(
        report.mounts.iter().any(|(m, _)| m == pipe),
        format!("{name}: the pipe directory {pipe} is not mounted"),
    )?;
    let shm = report.mounts.iter().rev().find(|(m, _)| m == "/dev/shm");
    ensure(
        shm.is_some_and(|(_, fs)| fs != "tmpfs"),
        format!("{name}: /dev/shm is the container's own ({shm:?}), not the daemon's"),
    )?;
    let pinned = report.env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
    ensure(
        pinned.map(String::as_str) == Some("0=20480M"),
        format!("{name}: pinned limit {pinned:?}, not 0=20480M (a quarter of 80 GiB)"),
    )?;
    let threads = report.env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
    ensure(
        threads.map(String::as_str) == Some("25"),
        format!("{name}: thread percentage {threads:?}, not 25"),
    )
}

/// The node's CDI spec of GPU `uuid`'s MPS device, as the reservation wrote it.
fn mps_spec_file(c: &Cluster, uuid: &str) -> std::path::PathBuf {
    c.dir
        .join("nodes")
        .join(PER_GPU)
        .join("mnt/run/cdi")
        .join(gpu_share::reservation::cdi::file_name(uuid))
}

/// 3. A per-GPU `mps` share gets `gpu-share.io/mps=<UUID>` resolved at container creation by
///    NVIDIA's runtime in CDI mode: the pipe, `/dev/shm` and `CUDA_MPS_PIPE_DIRECTORY`, with
///    the pinned limit and thread percentage from its keys.
async fn mps_share_gets_its_device(c: &Cluster) -> Check {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    pods.create(&PostParams::default(), &mps_pod("mps-share")?)
        .await
        .map_err(|e| format!("create an mps-25 pod: {e}"))?;
    let report = probe(c, NS, "mps-share").await?;
    let (reservation, uuid, _) = mps_reservation(c)
        .await?
        .ok_or("no MPS reservation with its pipe published")?;
    held_to_its_limits("mps-share", &report, &uuid)?;
    let share = pods.get("mps-share").await.map_err(|e| e.to_string())?;
    let cm = gpu_share::ledger::devices_configmap(share.spec.as_ref().unwrap())
        .ok_or("the MPS share reads no devices ConfigMap")?;
    let data = Api::<ConfigMap>::namespaced(c.client.clone(), NS)
        .get(&cm)
        .await
        .map_err(|e| e.to_string())?
        .data
        .unwrap_or_default();
    let named = data.get("NVIDIA_VISIBLE_DEVICES").cloned();
    ensure(
        named.as_deref() == Some(format!("gpu-share.io/mps={uuid}").as_str()),
        format!("the share's ConfigMap names {named:?}"),
    )?;
    let spec = mps_spec_file(c, &uuid);
    ensure(
        spec.exists(),
        format!("no CDI spec {} on the node", spec.display()),
    )?;
    eprintln!(
        "real nodes: mps-share on {uuid} (reservation {}), pipe {:?}",
        reservation.metadata.name.unwrap_or_default(),
        report.env.get("CUDA_MPS_PIPE_DIRECTORY")
    );
    Ok(())
}

/// 7. A reservation killed by kubelet (SIGKILL past its grace period: stopped first, so SIGTERM
///    does nothing) leaves nothing that lets a later share start without its limits: the next
///    share on the GPU starts only after a new reservation runs and writes the GPU's device
///    again, and is held to its limits.
async fn killed_reservation_leaves_no_way_around(c: &Cluster) -> Check {
    let (old, _, old_started) = mps_reservation(c)
        .await?
        .ok_or("no MPS reservation to kill")?;
    let old_name = old.metadata.name.clone().unwrap_or_default();
    let old_uid = old.metadata.uid.clone().unwrap_or_default();
    let id = old
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref()?.first()?.container_id.clone())
        .and_then(|id| id.strip_prefix("containerd://").map(str::to_string))
        .ok_or("the reservation's container has no ID")?;
    // Its process, through the node's CRI, stopped so that it cannot act on SIGTERM.
    let node = c.dir.join("nodes").join(PER_GPU);
    let bin = std::process::Command::new("bash")
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node/build.sh"))
        .output()
        .map_err(|e| e.to_string())?;
    let bin = String::from_utf8_lossy(&bin.stdout).trim().to_string();
    let inspect = std::process::Command::new("nsenter")
        .arg(format!("--mount={}", node.join("mnt.ns").display()))
        .arg("--")
        .arg(format!("{bin}/crictl"))
        .args([
            "--runtime-endpoint",
            "unix:///run/containerd/containerd.sock",
            "inspect",
            &id,
        ])
        .output()
        .map_err(|e| e.to_string())?;
    let info: Value =
        serde_json::from_slice(&inspect.stdout).map_err(|e| format!("crictl inspect {id}: {e}"))?;
    let pid = info["info"]["pid"]
        .as_i64()
        .ok_or(format!("crictl inspect {id}: no pid"))?;
    let stopped = std::process::Command::new("kill")
        .args(["-STOP", &pid.to_string()])
        .status()
        .map_err(|e| e.to_string())?;
    ensure(stopped.success(), format!("kill -STOP {pid}"))?;
    let reservations: Api<Pod> = Api::namespaced(c.client.clone(), RESERVATIONS);
    reservations
        .delete(&old_name, &DeleteParams::default().grace_period(2))
        .await
        .map_err(|e| e.to_string())?;
    // A later share, created at once.
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    pods.create(&PostParams::default(), &mps_pod("later-share")?)
        .await
        .map_err(|e| e.to_string())?;
    wait_for(
        &format!("{old_name} killed and gone"),
        Duration::from_secs(60),
        || {
            let reservations = reservations.clone();
            let old_uid = old_uid.clone();
            let old_name = old_name.clone();
            async move {
                let p = reservations
                    .get_opt(&old_name)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok((p.and_then(|p| p.metadata.uid) != Some(old_uid)).then_some(()))
            }
        },
    )
    .await?;
    let report = probe(c, NS, "later-share").await?;
    let (new, new_uuid, new_started) = mps_reservation(c)
        .await?
        .ok_or("no MPS reservation after the kill")?;
    ensure(
        new.metadata.uid.as_deref() != Some(old_uid.as_str()),
        "the killed reservation still serves the GPU",
    )?;
    let later = pods.get("later-share").await.map_err(|e| e.to_string())?;
    let later_started = started_at(&later);
    ensure(
        later_started >= new_started && new_started >= old_started,
        format!(
            "the later share started at {later_started}, before its new reservation ({new_started})"
        ),
    )?;
    held_to_its_limits("later-share", &report, &new_uuid)?;
    let spec = mps_spec_file(c, &new_uuid);
    let written = std::fs::metadata(&spec)
        .and_then(|m| m.modified())
        .map_err(|e| format!("{}: {e}", spec.display()))?
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs() as i64;
    let new_start = new
        .status
        .as_ref()
        .and_then(|s| s.start_time.clone())
        .map(|t| t.0.as_second())
        .ok_or("the new reservation has no start time")?;
    ensure(
        written + 1 >= new_start,
        format!(
            "the GPU's CDI device was last written at {written} s, before the new reservation started ({new_start} s)"
        ),
    )?;
    eprintln!(
        "real nodes: {old_name} killed; later-share started {later_started}, after {} ({new_started}) wrote the device again",
        new.metadata.name.unwrap_or_default()
    );
    Ok(())
}

#[tokio::test]
#[ignore = "needs root, Go and a few minutes: cargo test --test real_nodes -- --ignored (CI runs it)"]
async fn gpu_shares_pods_run_under_a_real_kubelet() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let c = Cluster::start_with_env(
        common::BIN,
        "GPU_SHARE_REAL_NODES_CLUSTER_DIR",
        None,
        &[
            ("GPU_SHARE_CLUSTER_NODES", "none"),
            ("GPU_SHARE_CLUSTER_REAL_NODES", "real-per-gpu real-mig"),
        ],
    )
    .await;
    c.namespace(NS, json!({})).await.expect("the namespace");
    per_gpu_policy(&c).await.expect("the per-GPU policy");
    let mut failures = Vec::new();
    point(
        &mut failures,
        "1. the first pod of each class runs",
        first_pods(&c),
    )
    .await;
    point(
        &mut failures,
        "2. a per-GPU share starts after its reservation, on its GPU",
        share_follows_its_reservation(&c),
    )
    .await;
    point(
        &mut failures,
        "4. a missing key stops the container from starting",
        missing_key_never_starts(&c),
    )
    .await;
    point(
        &mut failures,
        "5. kubelet admits gpu-milli against what is advertised",
        kubelet_admits_gpu_milli(&c),
    )
    .await;
    point(
        &mut failures,
        "6. deleting a share frees its GPU",
        deleting_frees_the_gpu(&c),
    )
    .await;
    point(
        &mut failures,
        "3. an MPS share gets its CDI device and its limits",
        mps_share_gets_its_device(&c),
    )
    .await;
    point(
        &mut failures,
        "7. a reservation killed past its grace leaves no way around the limits",
        killed_reservation_leaves_no_way_around(&c),
    )
    .await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

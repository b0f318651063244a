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
//! inside it. No KWOK node is registered. The points run in the order 1, 2, 4, 5, 6, 8, 3, 7:
//! the time-sliced share through its GPU's CDI device (8) and the MPS points need the GPU the
//! first time-sliced share leaves (docs/real-nodes.md).
//!
//! Run: `cargo test --test real_nodes -- --ignored` (root; CI runs it; `.ci/run`).

mod common;
#[path = "real_nodes/mps.rs"]
mod mps;
#[path = "real_nodes/per_gpu.rs"]
mod per_gpu;

use std::collections::BTreeMap;
use std::time::Duration;

use common::cluster::{Check, Cluster, ensure, point, wait_for};
use k8s_openapi::api::core::v1::{Node, Pod};
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
    edit_policy(
        c,
        &[
            ("  timeslice: false\n", "  timeslice: true\n"),
            ("  mps: false\n", "  mps: true\n"),
            ("  # runAsUser: 1000\n", "  runAsUser: 1000\n"),
            ("  releaseAfterSeconds: 30\n", "  releaseAfterSeconds: 5\n"),
        ],
    )
    .await
}

/// Edits the cluster's policy file (each `from` to its `to`, once) and waits until both the
/// webhook and the extender have read it again.
async fn edit_policy(c: &Cluster, edits: &[(&str, &str)]) -> Check {
    let reloads =
        |c: &Cluster| ["webhook", "extender"].map(|p| c.log(p).matches("policy reloaded").count());
    let before = reloads(c);
    let path = c.dir.join("policy/policy.yaml");
    let mut text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
    for (from, to) in edits {
        ensure(
            text.contains(from) || text.contains(to),
            format!("the policy file has no {from:?}"),
        )?;
        text = text.replacen(from, to, 1);
    }
    std::fs::write(&path, text).map_err(|e| e.to_string())?;
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

/// When a pod's first container started ("" before it runs), RFC 3339 in whole seconds.
fn started_at(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref()?.first()?.state.clone())
        .and_then(|s| s.running?.started_at)
        .map(|t| t.0.to_string())
        .unwrap_or_default()
}

/// The live reservation pods on the per-GPU node: (pod, the GPU UUID it published, or "", when
/// its container started, or "").
async fn reservations(c: &Cluster) -> Result<Vec<(Pod, String, String)>, String> {
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
            let started = started_at(&p);
            (p, uuid, started)
        })
        .collect())
}

/// The live reservation on the per-GPU node that published GPU `uuid`, and when its container
/// started.
async fn published(c: &Cluster, uuid: &str) -> Result<(Pod, String), String> {
    let held = reservations(c).await?;
    let names: Vec<_> = held
        .iter()
        .map(|(p, u, _)| (p.metadata.name.clone().unwrap_or_default(), u.clone()))
        .collect();
    held.into_iter()
        .find(|(_, u, _)| u == uuid)
        .map(|(p, _, started)| (p, started))
        .ok_or(format!(
            "no reservation on {PER_GPU} published {uuid}: {names:?}"
        ))
}

/// File `name` in the per-GPU node's CDI directory (`/var/run/cdi`, in its mount namespace).
fn node_cdi_file(c: &Cluster, name: &str) -> std::path::PathBuf {
    c.dir
        .join("nodes")
        .join(PER_GPU)
        .join("mnt/run/cdi")
        .join(name)
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
        per_gpu::share_follows_its_reservation(&c),
    )
    .await;
    point(
        &mut failures,
        "4. a missing key stops the container from starting",
        per_gpu::missing_key_never_starts(&c),
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
        per_gpu::deleting_frees_the_gpu(&c),
    )
    .await;
    point(
        &mut failures,
        "8. a time-sliced share takes its GPU's CDI device (perGpu.timesliceCdi)",
        per_gpu::timeslice_through_cdi_device(&c),
    )
    .await;
    point(
        &mut failures,
        "3. an MPS share gets its CDI device and its limits",
        mps::mps_share_gets_its_device(&c),
    )
    .await;
    point(
        &mut failures,
        "7. a reservation killed past its grace leaves no way around the limits",
        mps::killed_reservation_leaves_no_way_around(&c),
    )
    .await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

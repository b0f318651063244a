//! Per-GPU sharing on a plain A100 x4 node (labelled `gpu-share.io/sharing=per-gpu`), with the
//! policy's `perGpu.timeslice` on. The reservation pods run under the test's own kubelet for
//! them, [`common::reserve::Kubelet`].

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use common::reserve::{Kubelet, RESERVATIONS};

use super::*;

const NS: &str = "per-gpu";
const NODE: &str = "a100-per-gpu";
const GPU_MEMORY_MIB: u64 = 81920;
/// What NVML says of a GPU fallen off the bus (NVML_ERROR_GPU_IS_LOST, as nvml-wrapper words it),
/// which the stand-in NVML of a failing reservation answers.
const GPU_LOST: &str = "device fell off the bus";

/// What the API shows of the node's per-GPU sharing.
#[derive(Debug, Default)]
struct View {
    /// Per GPU index: the bound, live shares (name, thousandths, memory MiB).
    shares: BTreeMap<u32, Vec<(String, u32, u64)>>,
    /// Per GPU index: the reservation pod (name, uid, uuid if published, phase).
    reservations: BTreeMap<u32, (String, String, Option<String>, String)>,
    /// Exclusive pods bound to the node.
    whole: usize,
    /// Per share: its ConfigMap's UUID (None: no ConfigMap yet).
    filled: BTreeMap<String, Option<String>>,
}

impl View {
    /// The reservation pods' UIDs, by GPU index.
    fn reservation_uids(&self) -> BTreeMap<u32, String> {
        self.reservations
            .iter()
            .map(|(i, r)| (*i, r.1.clone()))
            .collect()
    }
}

async fn view(c: &Cluster) -> Result<View, String> {
    let mut v = View::default();
    for p in pods_of(c, NS).await?.values().filter(|p| live(p)) {
        if node_of(p) != Some(NODE) {
            continue;
        }
        let name = p.metadata.name.clone().unwrap_or_default();
        let ann = p.metadata.annotations.clone().unwrap_or_default();
        let request = ann.get(REQUEST).cloned().unwrap_or_default();
        if request.starts_with("exclusive") {
            v.whole += 1;
            continue;
        }
        let gpus = ann
            .get("gpu-share.io/gpus")
            .ok_or_else(|| format!("share {name} bound without gpu-share.io/gpus"))?;
        let (i, m) = gpus
            .split_once(':')
            .ok_or_else(|| format!("share {name}: gpus {gpus:?}"))?;
        let memory = request
            .split(',')
            .find_map(|t| t.strip_prefix("memory="))
            .and_then(|m| m.trim_end_matches("Mi").parse().ok())
            .unwrap_or(0);
        v.shares
            .entry(i.parse().map_err(|_| gpus.clone())?)
            .or_default()
            .push((name.clone(), m.parse().map_err(|_| gpus.clone())?, memory));
        let cm = gpu_share::ledger::devices_configmap(p.spec.as_ref().unwrap())
            .map(|d| d.configmap)
            .ok_or_else(|| {
                format!("share {name} reads NVIDIA_VISIBLE_DEVICES from no ConfigMap")
            })?;
        let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(c.client.clone(), NS);
        let found = cms
            .get_opt(&cm)
            .await
            .map_err(|e| format!("get {cm}: {e}"))?;
        v.filled.insert(
            name,
            found.and_then(|c| c.data?.get("NVIDIA_VISIBLE_DEVICES").cloned()),
        );
    }
    for p in pods_of(c, RESERVATIONS).await?.values() {
        if node_of(p) != Some(NODE) || p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let ann = p.metadata.annotations.clone().unwrap_or_default();
        let Some(i) = ann
            .get("gpu-share.io/reserve-gpu")
            .and_then(|i| i.parse().ok())
        else {
            continue;
        };
        v.reservations.insert(
            i,
            (
                p.metadata.name.clone().unwrap_or_default(),
                p.metadata.uid.clone().unwrap_or_default(),
                ann.get("gpu-share.io/gpu-uuid").cloned(),
                phase(p).to_string(),
            ),
        );
    }
    Ok(v)
}

/// Per GPU within 100% and its memory; no GPU both whole and shared beyond the node's four;
/// every shared GPU held by a reservation.
fn within_capacity(v: &View) -> Check {
    for (i, shares) in &v.shares {
        let milli: u32 = shares.iter().map(|s| s.1).sum();
        let memory: u64 = shares.iter().map(|s| s.2).sum();
        ensure(
            milli <= 1000 && memory <= GPU_MEMORY_MIB,
            format!("GPU {i} holds {milli}/1000 and {memory}/{GPU_MEMORY_MIB} MiB: {shares:?}"),
        )?;
    }
    let reserved: BTreeSet<u32> = v.reservations.keys().copied().collect();
    ensure(
        v.whole + reserved.len() <= 4,
        format!(
            "{} whole GPUs and reservations {reserved:?} on a 4-GPU node",
            v.whole
        ),
    )
}

/// Every share's ConfigMap holds the UUID its GPU's reservation published.
fn pointed_right(v: &View) -> Result<bool, String> {
    pointed_right_but(v, None)
}

/// [`pointed_right`], where `replaced` is a GPU whose reservation was replaced and the UUID the
/// old one held: its shares may read that UUID a moment longer (not yet settled, not wrong). The
/// controller evicts them one after another, each with its event first, so the step's first
/// event can come while the last of them still lives.
fn pointed_right_but(v: &View, replaced: Option<(u32, &str)>) -> Result<bool, String> {
    for (i, shares) in &v.shares {
        let Some((_, _, Some(uuid), _)) = v.reservations.get(i) else {
            return Ok(false);
        };
        for (name, ..) in shares {
            match v.filled.get(name) {
                Some(Some(u)) if u == uuid => {}
                Some(Some(u)) if replaced == Some((*i, u.as_str())) => return Ok(false),
                Some(Some(u)) => {
                    return Err(format!(
                        "{name} on GPU {i} reads {u}, its reservation holds {uuid}"
                    ));
                }
                _ => return Ok(false),
            }
        }
    }
    Ok(true)
}

/// Runs the kubelet until `settled` holds of the view, checking capacity at every step.
async fn settle(
    c: &Cluster,
    k: &mut Kubelet,
    what: &str,
    limit: Duration,
    settled: impl Fn(&View) -> Result<bool, String>,
) -> Result<View, String> {
    let start = Instant::now();
    loop {
        k.tick(c).await?;
        let v = view(c).await?;
        within_capacity(&v).map_err(|e| format!("{what}: {e}"))?;
        if settled(&v).map_err(|e| format!("{what}: {e}"))? {
            return Ok(v);
        }
        if start.elapsed() > limit {
            return Err(format!(
                "{what}: not within {} s; last seen {v:?}",
                limit.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// An event of `reason` on a pod of the namespace whose note contains `words`, the kubelet
/// running meanwhile.
async fn event_with(
    c: &Cluster,
    k: &mut Kubelet,
    reason: &str,
    words: &str,
) -> Result<String, String> {
    event_since(c, k, reason, words, step_start()).await
}

/// When a step begins, for [`event_since`]: events outlive their pods, so only those of this step
/// count (their timestamps are whole seconds, cut down: a second earlier).
fn step_start() -> std::time::SystemTime {
    std::time::SystemTime::now() - Duration::from_secs(1)
}

/// [`event_with`] for events created from `since` on (two events of one step are looked for
/// from the step's start: the second may be older than the moment the first was found).
async fn event_since(
    c: &Cluster,
    k: &mut Kubelet,
    reason: &str,
    words: &str,
    since: std::time::SystemTime,
) -> Result<String, String> {
    let events: Api<Event> = Api::namespaced(c.client.clone(), NS);
    let start = Instant::now();
    loop {
        k.tick(c).await?;
        let list = events
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("list events: {e}"))?;
        if let Some(m) = list
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter(|e| {
                e.metadata
                    .creation_timestamp
                    .as_ref()
                    .is_some_and(|t| std::time::SystemTime::from(t.0) >= since)
            })
            .filter_map(|e| e.message)
            .find(|m| m.contains(words))
        {
            return Ok(m);
        }
        if start.elapsed() > Duration::from_secs(60) {
            return Err(format!("no {reason} event saying {words:?} within 60 s"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn set_policy(c: &Cluster, per_gpu: bool) -> Check {
    let path = c.dir.join("policy/policy.yaml");
    let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
    let pairs = [
        ("  timeslice: false\n", "  timeslice: true\n"),
        ("  releaseAfterSeconds: 30\n", "  releaseAfterSeconds: 5\n"),
    ];
    let mut out = text.clone();
    for (off, on) in pairs {
        let (from, to) = if per_gpu { (off, on) } else { (on, off) };
        if out.contains(to) {
            continue;
        }
        ensure(
            out.contains(from),
            format!("the policy file has no {from:?}"),
        )?;
        out = out.replacen(from, to, 1);
    }
    std::fs::write(&path, out).map_err(|e| e.to_string())
}

/// The shipped ValidatingAdmissionPolicies: no pod chooses a GPU with NVIDIA_VISIBLE_DEVICES,
/// and no one but gpu-share writes a devices ConfigMap, except in a namespace opted out.
async fn visible_devices_policy(c: &Cluster) -> Check {
    let pod = |env: Value| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "chooser"},
               "spec": {"containers": [{"name": "main", "image": "cuda", "env": env}]}})
        .to_string()
    };
    let create = |ns: &str, obj: &str| {
        kubectl(
            c,
            &["create", "--dry-run=server", "-n", ns, "-f", "-"],
            Some(obj),
        )
    };
    let chooser = pod(json!([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "GPU-0a1b"}]));
    let refused = create(NS, &chooser).err().unwrap_or_default();
    ensure(
        refused.contains("gpu-share-visible-devices") && refused.contains("chooses GPUs"),
        format!("a pod setting NVIDIA_VISIBLE_DEVICES: {refused:?}"),
    )?;
    let prefixed = pod(json!([]));
    let prefixed = prefixed.replace(
        r#""env":[]"#,
        r#""envFrom":[{"prefix":"NVIDIA_","configMapRef":{"name":"x"}}]"#,
    );
    let refused = create(NS, &prefixed).err().unwrap_or_default();
    ensure(
        refused.contains("envFrom prefix that spells it"),
        format!("an envFrom prefix that can spell NVIDIA_VISIBLE_DEVICES: {refused:?}"),
    )?;
    ensure(
        create(
            NS,
            &pod(json!([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}])),
        )
        .is_ok(),
        "NVIDIA_VISIBLE_DEVICES=void (no GPU) passes",
    )?;
    // Read from a devices ConfigMap as gpu-share's webhook writes it: the UUID's key, or the
    // CDI device's (perGpu.timesliceCdi); any other key of it is refused.
    let reads = |key: &str| {
        pod(
            json!([{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {
            "name": "gpu-share-devices-0a1b", "key": key, "optional": false}}}]),
        )
    };
    for key in [
        gpu_share::request::DEVICES_KEY,
        gpu_share::request::CDI_DEVICE_KEY,
    ] {
        let created = create(NS, &reads(key));
        ensure(
            created.is_ok(),
            format!("a share reading key {key} of its devices ConfigMap: {created:?}"),
        )?;
    }
    let refused = create(NS, &reads("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"))
        .err()
        .unwrap_or_default();
    ensure(
        refused.contains("chooses GPUs"),
        format!("NVIDIA_VISIBLE_DEVICES from another key of a devices ConfigMap: {refused:?}"),
    )?;
    let cm = |name: &str, key: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
               "data": {key: "GPU-0a1b"}})
        .to_string()
    };
    let refused = create(NS, &cm("gpu-share-devices-mine", "x"))
        .err()
        .unwrap_or_default();
    ensure(
        refused.contains("only gpu-share writes them"),
        format!("a devices ConfigMap by the admin: {refused:?}"),
    )?;
    let refused = create(NS, &cm("mine", "NVIDIA_VISIBLE_DEVICES"))
        .err()
        .unwrap_or_default();
    ensure(
        refused.contains("a key NVIDIA_VISIBLE_DEVICES"),
        format!("a ConfigMap with a key NVIDIA_VISIBLE_DEVICES: {refused:?}"),
    )?;
    ensure(
        create(NS, &cm("mine", "other")).is_ok(),
        "any other ConfigMap passes",
    )?;
    c.namespace(
        "per-gpu-opted-out",
        json!({"gpu-share.io/visible-devices": "allowed"}),
    )
    .await?;
    ensure(
        create("per-gpu-opted-out", &chooser).is_ok(),
        "a namespace labelled gpu-share.io/visible-devices=allowed is exempt",
    )
}

fn share_deployment(replicas: u32) -> Value {
    let mut t = template(
        json!({"gpu-share": "timeslice-30", "gpu-share/memory": "25000Mi"}),
        Some(NODE),
        "Always",
    );
    t["spec"]["tolerations"] = json!([{"key": "nvidia.com/gpu", "operator": "Exists"}]);
    deployment("infer", replicas, t)
}

/// A bare share, as [`share_deployment`]'s pods.
fn share_pod(name: &str) -> Value {
    let mut p = share_deployment(1)["spec"]["template"].clone();
    p["apiVersion"] = json!("v1");
    p["kind"] = json!("Pod");
    p["metadata"]["name"] = json!(name);
    p["metadata"]["labels"] = json!({"app": "bare"});
    p
}

/// `/v1/nodes`, `gpu-share status` (read from the cluster) and the metrics show every shared GPU
/// with its reservation, the UUID it published and the shares bound to it, as the API does.
async fn shown(c: &Cluster, v: &View) -> Check {
    type Row = (Option<String>, String, Option<String>, Vec<String>);
    let mut expected: BTreeMap<u64, Row> = BTreeMap::new();
    for (i, (name, _, uuid, _)) in &v.reservations {
        let on = v.shares.get(i).into_iter().flatten();
        let mut shares: Vec<String> = on.map(|s| format!("{NS}/{}", s.0)).collect();
        shares.sort();
        expected.insert(
            u64::from(*i),
            (Some(name.clone()), "ready".into(), uuid.clone(), shares),
        );
    }
    let last = std::sync::Mutex::new(BTreeMap::new());
    let waited = wait_for(
        "/v1/nodes to show the shared GPUs",
        Duration::from_secs(20),
        || async {
            let nodes = ledger(c)?;
            let node = nodes
                .get(NODE)
                .ok_or("the node is missing from /v1/nodes")?;
            let mut reported: BTreeMap<u64, Row> = BTreeMap::new();
            for g in node["sharedGpus"].as_array().into_iter().flatten() {
                let text = |k: &str| g[k].as_str().map(str::to_string);
                let mut shares: Vec<String> = g["shares"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect();
                shares.sort();
                let row = (
                    text("reservation"),
                    text("state").unwrap_or_default(),
                    text("uuid"),
                    shares,
                );
                reported.insert(g["gpu"].as_u64().unwrap_or(u64::MAX), row);
            }
            let same = reported == expected;
            *last.lock().unwrap() = reported;
            Ok(same.then_some(()))
        },
    )
    .await;
    waited.map_err(|e| {
        format!(
            "{e}: /v1/nodes shows {:?}, the API {expected:?}",
            last.lock().unwrap()
        )
    })?;
    let out = Command::new(common::BIN)
        .arg("status")
        .env("KUBECONFIG", c.var("KUBECONFIG"))
        .output()
        .map_err(|e| e.to_string())?;
    let table = String::from_utf8_lossy(&out.stdout);
    for (i, (name, _, uuid, shares)) in &expected {
        let uuid = uuid.as_deref().unwrap_or("-");
        // The row of the shared GPUs' table (the node's row above lists the reservation too).
        let row = table
            .lines()
            .find(|l| l.split_whitespace().nth(2) == name.as_deref());
        ensure(
            out.status.success()
                && row.is_some_and(|r| {
                    r.starts_with(NODE)
                        && r.contains(&format!(" {i} "))
                        && r.contains(" ready ")
                        && r.contains(uuid)
                        && shares.iter().all(|s| r.contains(s.as_str()))
                }),
            format!(
                "gpu-share status does not show GPU {i} with {name:?}, {uuid} and {shares:?}:\n{table}{}",
                String::from_utf8_lossy(&out.stderr)
            ),
        )?;
    }
    let metrics = c.admin_text("EXTENDER_ADMIN", "/metrics")?;
    let ready = format!(
        r#"gpu_share_reservations{{state="ready"}} {}"#,
        expected.len()
    );
    ensure(
        metrics.contains(&ready),
        format!(
            "the metrics lack {ready:?}: {:?}",
            metrics
                .lines()
                .filter(|l| l.starts_with("gpu_share_reservations"))
                .collect::<Vec<_>>()
        ),
    )
}

/// The point, then what it changed put back, whether it passed or not: a point that fails
/// midway leaves no shares, reservations, node or policy behind for the next points to trip on.
pub async fn per_gpu_sharing(c: &Cluster) -> Check {
    let r = sharing(c).await;
    let put = put_back(c);
    r.and(put)
}

/// No shares, no reservations on the node, no node, the policy off. The namespace is gone
/// before a later run can want it again.
fn put_back(c: &Cluster) -> Check {
    common::reserve::remove_point(c, &[NS, "per-gpu-opted-out"], NODE)?;
    set_policy(c, false)
}

async fn sharing(c: &Cluster) -> Check {
    // What an earlier run against this cluster left: its workloads first (they would recreate
    // their pods), then their pods.
    let _ = c.kubectl(&["-n", NS, "delete", "deployment", "--all"], None);
    namespace(c, NS).await?;
    // The node, and a RuntimeClass nvidia (the reservation pods name the policy's).
    let nodes = std::env::var("CARGO_MANIFEST_DIR").unwrap() + "/tests/cluster/per-gpu-node.yaml";
    let out = Command::new("python3")
        .args([
            &format!("{}/tests/cluster/nodes.py", env!("CARGO_MANIFEST_DIR")),
            &c.dir.display().to_string(),
            &nodes,
        ])
        .output()
        .map_err(|e| e.to_string())?;
    ensure(
        out.status.success(),
        format!("nodes.py: {}", String::from_utf8_lossy(&out.stderr)),
    )?;
    // The policy on (hot-reloaded), and reservations able to run.
    set_policy(c, true)?;
    reservations_can_run(c).await?;
    let probe = |name: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "annotations": {"gpu-share": "timeslice-30"}},
               "spec": {"containers": [{"name": "main", "image": "cuda"}]}})
    };
    wait_for(
        "the webhook to take the per-GPU form",
        Duration::from_secs(30),
        || async {
            let out = kubectl(
                c,
                &[
                    "create",
                    "--dry-run=server",
                    "-n",
                    NS,
                    "-o",
                    "json",
                    "-f",
                    "-",
                ],
                Some(&probe("probe").to_string()),
            )?;
            Ok(out.contains("configMapKeyRef").then_some(()))
        },
    )
    .await?;
    let mut k = Kubelet::new(c)?;
    visible_devices_policy(c).await?;

    // Exclusive training first, then a burst of shares: 2 whole GPUs, 3 shares on each of the
    // other 2 (30% and 25,000 MiB each), 2 shares waiting.
    let mut train = template(json!({"gpu-share": "exclusive-1"}), Some(NODE), "Always");
    train["spec"]["tolerations"] = json!([{"key": "nvidia.com/gpu", "operator": "Exists"}]);
    apply(c, NS, &deployment("train", 2, train))?;
    wait_pods(c, NS, 2, 0).await?;
    apply(c, NS, &share_deployment(8))?;
    let v = settle(
        c,
        &mut k,
        "8 shares placed",
        Duration::from_secs(120),
        |v| Ok(v.shares.values().map(Vec::len).sum::<usize>() == 6),
    )
    .await?;
    ensure(
        v.whole == 2,
        format!("{} exclusive pods bound on {NODE}", v.whole),
    )?;
    ensure(
        v.shares.len() == 2 && v.shares.values().all(|s| s.len() == 3),
        format!("shares not packed 3 and 3: {:?}", v.shares),
    )?;
    let waiting = wait_pods(c, NS, 8, 2).await?;
    let why = why_waiting(c, NS, &waiting[0]).await?;
    let full = gpu_share::packing::Reason::NoGpuWithRoom.message();
    ensure(
        why.contains(&full),
        format!("a waiting share says {why:?}, not {full:?}"),
    )?;
    // Exclusive pods never get a reserved GPU: the device plugin (KWOK's allocatable) and the
    // ledger both count 2 + 2.
    let v = settle(
        c,
        &mut k,
        "every share pointed at its reservation's GPU",
        Duration::from_secs(60),
        pointed_right,
    )
    .await?;
    let held = v.reservation_uids();
    shown(c, &v).await?;

    // The extender killed, a share deleted meanwhile: the restarted one ends where it was, with
    // the same reservations.
    c.kill("extender");
    let victim = v.shares.values().next().unwrap()[0].0.clone();
    kubectl(
        c,
        &["-n", NS, "delete", "pod", &victim, "--wait=false"],
        None,
    )?;
    c.start_process_with(
        "extender",
        &[("GPU_SHARE_RESERVATION_IMAGE", "gpu-share:test")],
    );
    c.wait_ready("EXTENDER_ADMIN", Duration::from_secs(60))
        .await?;
    let v = settle(c, &mut k, "after a restart", Duration::from_secs(90), |v| {
        Ok(v.shares.values().map(Vec::len).sum::<usize>() == 6 && pointed_right(v)?)
    })
    .await?;
    let after = v.reservation_uids();
    ensure(
        after == held,
        format!("reservations changed over the restart: {held:?} -> {after:?}"),
    )?;

    // A reservation deleted by hand: created again; the device plugin may give it another GPU
    // (here always: a new UUID), so the shares started on the old one are evicted in words, and
    // their Deployment's new pods point at the new one.
    let (&gpu, (name, _, old, _)) = v.reservations.iter().next().unwrap();
    let old = old
        .clone()
        .ok_or("a settled reservation without its UUID")?;
    kubectl(
        c,
        &["-n", RESERVATIONS, "delete", "pod", name, "--wait=false"],
        None,
    )?;
    let note = event_with(c, &mut k, "GpuShareEvicted", "no longer holds").await?;
    ensure(
        note.contains(&format!("GPU {gpu} of node {NODE}")),
        format!("eviction says {note:?}"),
    )?;
    settle(
        c,
        &mut k,
        "after a reservation was deleted by hand",
        Duration::from_secs(120),
        |v| {
            Ok(v.shares.values().map(Vec::len).sum::<usize>() == 6
                && v.reservations
                    .get(&gpu)
                    .is_some_and(|r| Some(&r.1) != held.get(&gpu))
                && pointed_right_but(v, Some((gpu, &old)))?)
        },
    )
    .await?;

    // The last share leaving releases the reservations, after the grace (5 s here).
    kubectl(
        c,
        &["-n", NS, "scale", "deployment", "infer", "--replicas=0"],
        None,
    )?;
    settle(
        c,
        &mut k,
        "reservations released",
        Duration::from_secs(90),
        |v| Ok(v.shares.is_empty() && v.reservations.is_empty()),
    )
    .await?;

    // Moving and evicting. A bare share takes a GPU (A); with every other reservation kept from
    // starting, four more go to A and to the other shared GPU (B), whichever the packing picks,
    // at least two on B. One share leaves A, then B's reservation fails (NVML): its shares never
    // started, so all but one are re-pointed to A's room and read A's UUID, the last is evicted
    // in words, and the node is held off for shares a while, even though A has room again.
    apply(c, NS, &share_pod("bare-0"))?;
    let v = settle(
        c,
        &mut k,
        "a bare share pointed at its GPU",
        Duration::from_secs(60),
        |v| Ok(v.shares.len() == 1 && pointed_right(v)?),
    )
    .await?;
    let a = *v.shares.keys().next().unwrap();
    for i in (0..4).filter(|i| *i != a) {
        k.hold.insert(gpu_share::reservation::name(NODE, i));
    }
    for i in 1..5 {
        apply(c, NS, &share_pod(&format!("bare-{i}")))?;
    }
    let v = settle(
        c,
        &mut k,
        "five bare shares on two GPUs",
        Duration::from_secs(60),
        |v| Ok(v.shares.len() == 2 && v.shares.values().map(Vec::len).sum::<usize>() == 5),
    )
    .await?;
    let b = *v.shares.keys().find(|i| **i != a).unwrap();
    let on_b = v.shares[&b].len();
    // The shares that joined bare-0 on A, whose reservation knew its UUID, were pointed at it
    // at bind, not at the controller's next tick.
    let log = c.log("extender");
    for (name, ..) in v.shares[&a].iter().filter(|s| s.0 != "bare-0") {
        let line = log
            .lines()
            .filter(|l| l.contains("share pointed at its GPU at bind"))
            .find(|l| l.contains(&format!("\"{NS}/{name}\"")));
        ensure(
            line.is_some(),
            format!("{name} joined a held GPU but was not pointed at it at bind"),
        )?;
    }
    let on_a = v.shares[&a][0].0.clone();
    kubectl(c, &["-n", NS, "delete", "pod", &on_a, "--wait=false"], None)?;
    settle(
        c,
        &mut k,
        "a share left GPU A",
        Duration::from_secs(60),
        |v| Ok(v.shares.get(&a).map(Vec::len) == Some(5 - on_b - 1)),
    )
    .await?;
    let failing = gpu_share::reservation::name(NODE, b);
    let since = step_start();
    k.hold.remove(&failing);
    k.fail.insert(failing);
    let moved = format!("GPU {a} of the node");
    let note = event_since(c, &mut k, "GpuShareMoved", &moved, since).await?;
    ensure(note.contains(GPU_LOST), format!("the move says {note:?}"))?;
    let note = event_since(c, &mut k, "GpuShareEvicted", GPU_LOST, since).await?;
    ensure(
        note.contains(&format!("GPU {b} of node {NODE} cannot be held")),
        format!("eviction says {note:?}"),
    )?;
    settle(
        c,
        &mut k,
        "the moved share pointed at GPU A",
        Duration::from_secs(60),
        |v| {
            Ok(v.shares.len() == 1
                && v.shares.get(&a).map(Vec::len) == Some(3)
                && v.shares
                    .values()
                    .flatten()
                    .all(|s| s.0.starts_with("bare-"))
                && !v.reservations.contains_key(&b)
                && pointed_right(v)?)
        },
    )
    .await?;
    let on_a = view(c).await?.shares[&a][0].0.clone();
    kubectl(c, &["-n", NS, "delete", "pod", &on_a, "--wait=false"], None)?;
    apply(c, NS, &share_pod("bare-5"))?;
    let why = why_waiting(c, NS, "bare-5").await?;
    ensure(
        why.contains("a reservation of a GPU on this node failed"),
        format!("a new share waits for {why:?}"),
    )?;

    Ok(())
}

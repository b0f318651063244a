//! MPS per GPU (policy `perGpu.mps`) on the plain A100 x4 node shared per GPU, beside
//! time-sliced shares and an exclusive pod, in a namespace that enforces Pod Security's
//! `restricted` level. The reservations run under the test's kubelet for them
//! ([`common::reserve::Kubelet`]): real `gpu-share reserve --mps` processes against the stand-in
//! `nvidia-cuda-mps-control`, writing their GPU's CDI device from the fixtures' NVIDIA spec.
//! KWOK starts no container, so what a container would get is read from the API: its
//! environment (each limit a literal value or a ConfigMap key that is not optional, which
//! kubelet does not start a container without), its ConfigMap, its reservation and the CDI
//! device.

use std::collections::BTreeMap;
use std::process::Command;

use common::reserve::{Kubelet, RESERVATIONS, cdi_dir};
use k8s_openapi::api::core::v1::{ConfigMap, Container};

use super::*;

const NS: &str = "per-gpu-mps";
const NODE: &str = "a100-per-gpu";
const GPU_MEMORY_MIB: u64 = 81920;
const USER: i64 = 1000;

/// One bound share as the API shows it.
#[derive(Debug, Clone)]
struct Share {
    name: String,
    mps: bool,
    milli: u32,
    /// What it holds of its GPU's memory: its budget, else (MPS) its fraction of the GPU's.
    memory: u64,
    pod: Pod,
    /// Its devices ConfigMap's data, once filled.
    data: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default)]
struct View {
    shares: BTreeMap<u32, Vec<Share>>,
    /// Per GPU: the reservation's (name, UUID if published, runs MPS).
    reservations: BTreeMap<u32, (String, Option<String>, bool)>,
    whole: usize,
    unbound: Vec<String>,
}

async fn view(c: &Cluster) -> Result<View, String> {
    let mut v = View::default();
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), NS);
    for p in pods_of(c, NS).await?.into_values().filter(live) {
        let name = p.metadata.name.clone().unwrap_or_default();
        if node_of(&p) != Some(NODE) {
            v.unbound.push(name);
            continue;
        }
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
        let milli: u32 = m.parse().map_err(|_| gpus.clone())?;
        let mps = request.starts_with("mps-");
        let budget = request
            .split(',')
            .find_map(|t| t.strip_prefix("memory="))
            .and_then(|m| m.trim_end_matches("Mi").parse().ok());
        let memory = match (budget, mps) {
            (Some(b), _) => b,
            (None, true) => GPU_MEMORY_MIB * u64::from(milli) / 1000,
            (None, false) => 0,
        };
        let cm = gpu_share::ledger::devices_configmap(p.spec.as_ref().unwrap())
            .map(|d| d.configmap)
            .ok_or_else(|| format!("share {name} reads its GPU from no ConfigMap"))?;
        let data = cms
            .get_opt(&cm)
            .await
            .map_err(|e| format!("get {cm}: {e}"))?
            .and_then(|c| c.data);
        v.shares
            .entry(i.parse().map_err(|_| gpus.clone())?)
            .or_default()
            .push(Share {
                name,
                mps,
                milli,
                memory,
                pod: p,
                data,
            });
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
        let ready = ann.get("gpu-share.io/gpu-uuid").cloned().filter(|_| {
            ann.get("gpu-share.io/reserve-mps").map(String::as_str) != Some("true")
                || ann.contains_key("gpu-share.io/mps-pipe")
        });
        v.reservations.insert(
            i,
            (
                p.metadata.name.clone().unwrap_or_default(),
                ready,
                ann.get("gpu-share.io/reserve-mps").map(String::as_str) == Some("true"),
            ),
        );
    }
    Ok(v)
}

/// The view in a line: per GPU, its reservation and its shares.
fn summary(v: &View) -> String {
    let gpus: Vec<String> = v
        .shares
        .iter()
        .map(|(i, s)| {
            let names: Vec<String> = s
                .iter()
                .map(|s| {
                    format!(
                        "{} {}{}",
                        s.name,
                        s.milli,
                        if s.data.is_some() {
                            ""
                        } else {
                            " (no ConfigMap)"
                        }
                    )
                })
                .collect();
            format!("GPU {i} {:?}: {}", v.reservations.get(i), names.join(", "))
        })
        .collect();
    format!(
        "{}; {} exclusive; unbound {:?}",
        gpus.join("; "),
        v.whole,
        v.unbound
    )
}

/// Per GPU within 100% and its memory, one sharing class, and no more GPUs taken than the
/// node has.
fn within_capacity(v: &View) -> Check {
    for (i, shares) in &v.shares {
        let milli: u32 = shares.iter().map(|s| s.milli).sum();
        let memory: u64 = shares.iter().map(|s| s.memory).sum();
        let names = || shares.iter().map(|s| s.name.as_str()).collect::<Vec<_>>();
        ensure(
            milli <= 1000 && memory <= GPU_MEMORY_MIB,
            format!(
                "GPU {i} holds {milli}/1000 and {memory}/{GPU_MEMORY_MIB} MiB: {:?}",
                names()
            ),
        )?;
        ensure(
            shares.iter().all(|s| s.mps) || shares.iter().all(|s| !s.mps),
            format!("GPU {i} mixes MPS and time-sliced shares: {:?}", names()),
        )?;
    }
    ensure(
        v.whole + v.reservations.len() <= 4,
        format!(
            "{} whole GPUs and reservations {:?} on a 4-GPU node",
            v.whole, v.reservations
        ),
    )
}

/// Every share's ConfigMap filled from its GPU's ready reservation.
fn all_pointed(v: &View) -> bool {
    v.shares.iter().all(|(i, shares)| {
        matches!(v.reservations.get(i), Some((_, Some(_), _)))
            && shares.iter().all(|s| s.data.is_some())
    })
}

/// The policy: per-GPU form for both classes, the MPS user, a short release grace.
fn set_policy(c: &Cluster, on: bool) -> Check {
    let path = c.dir.join("policy/policy.yaml");
    let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
    let pairs = [
        ("  timeslice: false\n", "  timeslice: true\n"),
        ("  mps: false\n", "  mps: true\n"),
        ("  # runAsUser: 1000\n", "  runAsUser: 1000\n"),
        ("  releaseAfterSeconds: 30\n", "  releaseAfterSeconds: 5\n"),
    ];
    let mut out = text;
    for (off, to) in pairs {
        let (from, to) = if on { (off, to) } else { (to, off) };
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

/// A bare pod on the node that Pod Security's `restricted` level admits.
fn restricted_pod(name: &str, annotations: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "main",
                "image": "vllm/vllm-openai:v0.11.0",
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
            }],
        },
    })
}

/// The variables that hold a share, and the GPU it names.
const HELD_BY: [&str; 6] = [
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "NVIDIA_GPU_MEMORY_REQUEST",
    "NVIDIA_GPU_MEMORY_LIMIT",
    "CUDA_MPS_PIPE_DIRECTORY",
];

/// A container's variable: `Ok(Some(value))` a literal, `Ok(None)` a key of ConfigMap `cm`
/// that is not optional (its value is `key`); anything else is an error in words.
fn variable(c: &Container, name: &str, cm: &str) -> Result<Option<String>, String> {
    let e = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .ok_or_else(|| format!("no {name}"))?;
    if let Some(v) = &e.value {
        return Ok(Some(v.clone()));
    }
    let r = e
        .value_from
        .as_ref()
        .and_then(|f| f.config_map_key_ref.as_ref())
        .ok_or_else(|| format!("{name} is neither a value nor a ConfigMap key: {e:?}"))?;
    ensure(
        r.name == cm && r.key == name && r.optional != Some(true),
        format!("{name} reads {r:?}, not the key {name} of {cm}, not optional"),
    )?;
    Ok(None)
}

/// What each share carries and what it reads: MPS shares the CDI device of their GPU's daemon
/// and their pinned limit from their ConfigMap, their threads and the driver's limits as
/// values, the policy's user, the policy's runtime, no host namespaces or volumes; time-sliced
/// shares their GPU's UUID; every variable that holds a share a value or a key that is not
/// optional.
fn as_designed(v: &View, cdi: &std::path::Path) -> Check {
    for (i, shares) in &v.shares {
        let (reservation, uuid, mps_reservation) = v
            .reservations
            .get(i)
            .ok_or_else(|| format!("GPU {i} has shares and no reservation"))?;
        let uuid = uuid.as_deref().unwrap_or_default();
        for s in shares {
            let spec = s.pod.spec.as_ref().unwrap();
            let c = &spec.containers[0];
            let cm = gpu_share::ledger::devices_configmap(spec)
                .map(|d| d.configmap)
                .unwrap_or_default();
            let data = s.data.clone().unwrap_or_default();
            let ann = s.pod.metadata.annotations.clone().unwrap_or_default();
            let held = ann
                .get("gpu-share.io/memory-held-by")
                .cloned()
                .unwrap_or_default();
            for name in HELD_BY {
                if c.env.iter().flatten().any(|e| e.name == name) {
                    variable(c, name, &cm).map_err(|e| format!("{}: {e}", s.name))?;
                }
            }
            ensure(
                variable(c, "NVIDIA_VISIBLE_DEVICES", &cm)?.is_none(),
                format!("{}: its GPU is not read from its ConfigMap", s.name),
            )?;
            if s.mps {
                ensure(
                    *mps_reservation,
                    format!(
                        "{}: on GPU {i}, whose reservation {reservation} runs no MPS daemon",
                        s.name
                    ),
                )?;
                let percent = (s.milli / 10).to_string();
                ensure(
                    variable(c, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", &cm)? == Some(percent.clone())
                        && variable(c, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", &cm)?.is_none(),
                    format!(
                        "{}: threads not {percent} or the pinned limit not from its ConfigMap",
                        s.name
                    ),
                )?;
                let want = BTreeMap::from([
                    (
                        "NVIDIA_VISIBLE_DEVICES".to_string(),
                        format!("gpu-share.io/mps={uuid}"),
                    ),
                    (
                        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".to_string(),
                        format!("0={}M", s.memory),
                    ),
                ]);
                ensure(
                    data == want,
                    format!("{}: its ConfigMap holds {data:?}, not {want:?}", s.name),
                )?;
                let budget = ann.get(REQUEST).is_some_and(|r| r.contains("memory="));
                let limit = variable(c, "NVIDIA_GPU_MEMORY_LIMIT", &cm).ok().flatten();
                ensure(
                    limit == budget.then(|| s.memory.to_string()),
                    format!("{}: NVIDIA_GPU_MEMORY_LIMIT {limit:?}", s.name),
                )?;
                let user = c
                    .security_context
                    .as_ref()
                    .and_then(|s| s.run_as_user)
                    .or_else(|| spec.security_context.as_ref().and_then(|s| s.run_as_user));
                ensure(
                    user == Some(USER),
                    format!("{}: runs as {user:?}, not the policy's {USER}", s.name),
                )?;
                ensure(
                    spec.host_ipc != Some(true)
                        && spec.volumes.iter().flatten().all(|v| v.host_path.is_none())
                        && spec.runtime_class_name.as_deref() == Some("nvidia"),
                    format!(
                        "{}: hostIPC, a hostPath or a runtime other than nvidia: {spec:?}",
                        s.name
                    ),
                )?;
                ensure(
                    held == "gpu-share-mps",
                    format!("{}: memory held by {held:?}", s.name),
                )?;
            } else {
                ensure(
                    !*mps_reservation,
                    format!(
                        "{}: time-sliced on GPU {i}, whose reservation runs MPS",
                        s.name
                    ),
                )?;
                ensure(
                    data == BTreeMap::from([(
                        "NVIDIA_VISIBLE_DEVICES".to_string(),
                        uuid.to_string(),
                    )]),
                    format!("{}: its ConfigMap holds {data:?}, not {uuid}", s.name),
                )?;
                ensure(
                    held.starts_with("none: "),
                    format!("{}: memory held by {held:?}", s.name),
                )?;
            }
        }
        // The MPS GPU's device, as its reservation wrote it.
        if *mps_reservation {
            let path = device_of(v, *i, cdi)?;
            let device: Value = serde_json::from_slice(
                &std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?,
            )
            .map_err(|e| e.to_string())?;
            ensure(
                device["kind"] == "gpu-share.io/mps" && device["devices"][0]["name"] == uuid,
                format!("GPU {i}'s CDI device: {device}"),
            )?;
        }
    }
    Ok(())
}

/// Where the reservation of GPU `i` wrote its CDI device (in `cdi`), by its UUID.
fn device_of(v: &View, i: u32, cdi: &std::path::Path) -> Result<std::path::PathBuf, String> {
    let uuid = v
        .reservations
        .get(&i)
        .and_then(|r| r.1.clone())
        .ok_or_else(|| format!("GPU {i}'s reservation published no UUID"))?;
    Ok(cdi.join(format!("gpu-share.io-mps-{uuid}.json")))
}

/// The point, then what it changed put back, whether it passed or not (as per-GPU sharing's).
pub async fn per_gpu_mps(c: &Cluster) -> Check {
    let r = mps(c).await;
    let put = put_back(c);
    r.and(put)
}

/// No shares, no reservations on the node, no node, the policy off.
fn put_back(c: &Cluster) -> Check {
    common::reserve::remove_point(c, &[NS], NODE)?;
    set_policy(c, false)
}

async fn mps(c: &Cluster) -> Check {
    let _ = c.kubectl(&["delete", "namespace", NS, "--wait=true"], None);
    c.namespace(
        NS,
        json!({"pod-security.kubernetes.io/enforce": "restricted",
               "pod-security.kubernetes.io/enforce-version": "latest"}),
    )
    .await?;
    let nodes = format!(
        "{}/tests/cluster/per-gpu-node.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
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
    set_policy(c, true)?;
    reservations_can_run(c).await?;
    let dry_run = |obj: &Value| {
        kubectl(
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
            Some(&obj.to_string()),
        )
    };
    wait_for(
        // The webhook trusts a RuntimeClass lookup for a minute: an earlier point's may say
        // the class is missing.
        "the webhook to take the per-GPU MPS form, under the nvidia RuntimeClass",
        Duration::from_secs(90),
        || async {
            let out = dry_run(&restricted_pod("probe", json!({"gpu-share": "mps-25"})))?;
            Ok((out.contains("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
                && out.contains(r#""runtimeClassName": "nvidia""#))
            .then_some(()))
        },
    )
    .await?;
    // Refused in words: another user than the MPS server's; and the namespace does enforce
    // `restricted` (hostIPC, what the device plugin's MPS form needs, is refused).
    let mut other = restricted_pod("other-user", json!({"gpu-share": "mps-25"}));
    other["spec"]["securityContext"]["runAsUser"] = json!(2000);
    let refused = dry_run(&other).err().unwrap_or_default();
    ensure(
        refused.contains("serves user 1000"),
        format!("an MPS share running as 2000: {refused:?}"),
    )?;
    let mut ipc = restricted_pod("ipc", json!({}));
    ipc["spec"]["hostIPC"] = json!(true);
    let refused = dry_run(&ipc).err().unwrap_or_default();
    ensure(
        refused.contains("violates PodSecurity"),
        format!("a hostIPC pod in a restricted namespace: {refused:?}"),
    )?;

    let mut k = Kubelet::new(c)?;
    let pods = [
        ("train", json!({"gpu-share": "exclusive-1"})),
        (
            "ts-a",
            json!({"gpu-share": "timeslice-30", "gpu-share/memory": "25000Mi"}),
        ),
        (
            "ts-b",
            json!({"gpu-share": "timeslice-30", "gpu-share/memory": "25000Mi"}),
        ),
        (
            "mps-50",
            json!({"gpu-share": "mps-50", "gpu-share/memory": "40Gi"}),
        ),
        (
            "mps-25-a",
            json!({"gpu-share": "mps-25", "gpu-share/memory": "20Gi"}),
        ),
        (
            "mps-25-b",
            json!({"gpu-share": "mps-25", "gpu-share/memory": "20Gi"}),
        ),
        ("mps-25-fraction", json!({"gpu-share": "mps-25"})),
    ];
    for (name, annotations) in &pods {
        apply(c, NS, &restricted_pod(name, annotations.clone()))?;
    }
    let start = Instant::now();
    let v = loop {
        k.tick(c).await?;
        let v = view(c).await?;
        within_capacity(&v)?;
        let shares: usize = v.shares.values().map(Vec::len).sum();
        if shares == 6 && v.whole == 1 && all_pointed(&v) {
            break v;
        }
        if start.elapsed() > Duration::from_secs(120) {
            let mut why = Vec::new();
            for name in &v.unbound {
                why.push(format!("{name}: {}", why_waiting(c, NS, name).await?));
            }
            return Err(format!(
                "not every pod bound and pointed within 120 s: {}; waiting: {why:?}",
                summary(&v)
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    ensure(
        v.shares
            .values()
            .any(|s| s.iter().filter(|s| s.mps).count() >= 2),
        format!("no GPU holds MPS shares of unequal sizes: {:?}", v.shares),
    )?;
    let unequal = v.shares.values().any(|s| {
        let sizes: std::collections::BTreeSet<u32> =
            s.iter().filter(|s| s.mps).map(|s| s.milli).collect();
        sizes.len() > 1
    });
    ensure(
        unequal,
        format!("MPS shares of one size per GPU only: {:?}", v.shares),
    )?;
    as_designed(&v, &cdi_dir(c))?;

    // Released: the reservations quit their daemons and remove their CDI devices.
    kubectl(c, &["delete", "namespace", NS, "--timeout=120s"], None)?;
    let start = Instant::now();
    loop {
        k.tick(c).await?;
        let v = view(c).await?;
        let devices = std::fs::read_dir(cdi_dir(c))
            .map(|d| d.count())
            .unwrap_or(0);
        if v.reservations.is_empty() && devices == 0 {
            break;
        }
        ensure(
            start.elapsed() < Duration::from_secs(90),
            format!(
                "reservations {:?} or {devices} CDI devices left after the shares went",
                v.reservations
            ),
        )?;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

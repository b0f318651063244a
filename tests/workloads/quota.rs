//! Quotas that count fractions: every gpu-share pod carries its size in thousandths of a GPU
//! (`gpu-share.io/gpu-milli`), and a ResourceQuota on `requests.gpu-share.io/gpu-milli` caps a
//! namespace's GPUs through the API server's own quota admission. The pods carrying it are bound
//! as before (kube-scheduler ignores it on gpu-share's say-so, and every GPU node advertises its
//! GPUs in thousandths, patched by gpu-share, again after the node registers anew; kubelet's
//! part is read from its code: docs/quotas.md), on device-plugin nodes and on a node shared per
//! GPU alike.

use std::process::Command;

use super::*;

const NS: &str = "quota";
const QUOTA: &str = "gpus";
const MILLI: &str = "requests.gpu-share.io/gpu-milli";

fn bare(name: &str, request: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": {"gpu-share": request}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "vllm/vllm-openai:v0.11.0"}],
        },
    })
}

/// What the quota says it uses, as the quota controller counts it (`None`: not yet counted).
fn used(c: &Cluster) -> Result<Option<String>, String> {
    let out = kubectl(
        c,
        &["-n", NS, "get", "resourcequota", QUOTA, "-o", "json"],
        None,
    )?;
    let q: Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
    Ok(q["status"]["used"][MILLI].as_str().map(str::to_string))
}

async fn used_becomes(c: &Cluster, want: &str) -> Check {
    let last = std::sync::Mutex::new(None);
    wait_for(
        &format!("the quota to count {want}"),
        Duration::from_secs(60),
        || async {
            let u = used(c)?;
            *last.lock().unwrap() = u.clone();
            Ok((u.as_deref() == Some(want)).then_some(()))
        },
    )
    .await
    .map_err(|e| format!("{e}; it counts {:?}", last.lock().unwrap()))
}

/// The API server's quota admission refuses `obj` in its own words, naming the quantity.
fn refused(c: &Cluster, obj: &Value, requested: &str) -> Check {
    let e = apply(c, NS, obj).err().unwrap_or_default();
    ensure(
        e.contains("exceeded quota: gpus")
            && e.contains(&format!("requested: {MILLI}={requested}")),
        format!("{} over the quota: {e:?}", obj["metadata"]["name"]),
    )
}

pub(super) fn set_policy(c: &Cluster, pairs: &[(&str, &str)]) -> Check {
    let path = c.dir.join("policy/policy.yaml");
    let mut text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
    for (from, to) in pairs {
        if text.contains(to) {
            continue;
        }
        ensure(
            text.contains(from),
            format!("the policy file has no {from:?}"),
        )?;
        text = text.replacen(from, to, 1);
    }
    std::fs::write(&path, text).map_err(|e| e.to_string())
}

/// The webhook writes what the policy now says (it reloads the file): a dry run of an mps-25
/// pod carries the quantity, or not.
async fn webhook_writes(c: &Cluster, quantity: bool) -> Check {
    wait_for(
        "the webhook to take the policy",
        Duration::from_secs(30),
        || async {
            let out = kubectl(
                c,
                &[
                    "create",
                    "--dry-run=server",
                    "-n",
                    "default",
                    "-o",
                    "json",
                    "-f",
                    "-",
                ],
                Some(&bare("probe", "mps-25", "quota-mps").to_string()),
            )?;
            Ok((out.contains("gpu-share.io/gpu-milli") == quantity).then_some(()))
        },
    )
    .await
}

/// Registers the nodes of `file` (tests/cluster/).
pub(super) fn register(c: &Cluster, file: &str) -> Check {
    let out = Command::new("python3")
        .args([
            &format!("{}/tests/cluster/nodes.py", env!("CARGO_MANIFEST_DIR")),
            &c.dir.display().to_string(),
            &format!("{}/tests/cluster/{file}", env!("CARGO_MANIFEST_DIR")),
        ])
        .output()
        .map_err(|e| e.to_string())?;
    ensure(
        out.status.success(),
        format!("nodes.py {file}: {}", String::from_utf8_lossy(&out.stderr)),
    )
}

/// Nodes of the point's own (earlier points change or delete the shared ones): an MPS node
/// (4 replicas per GPU) and a time-sliced one (4 per GPU). MIG devices come from
/// `a100-mig-layout`, which an earlier point left cut into 3g.40gb.
const OWN_NODES: [&str; 4] = ["quota-mps", "quota-cpu", "a10-ts4x2", "a100-per-gpu"];

/// What `node` advertises of the quantity, capacity and allocatable (`None`: it does not).
pub(super) async fn advertised(
    c: &Cluster,
    node: &str,
) -> Result<(Option<String>, Option<String>), String> {
    let n = Api::<k8s_openapi::api::core::v1::Node>::all(c.client.clone())
        .get(node)
        .await
        .map_err(|e| format!("node {node}: {e}"))?;
    let status = n.status.unwrap_or_default();
    let read = |m: Option<
        BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >| { m.and_then(|m| m.get("gpu-share.io/gpu-milli").map(|q| q.0.clone())) };
    Ok((read(status.capacity), read(status.allocatable)))
}

/// The namespace's GPUs against its quota, as the extender serves them (`/v1/quotas`, which the
/// page draws) and as `gpu-share status` prints them from the cluster: held `held`, the quota
/// counting `counted` of 1.5.
async fn quota_shown(c: &Cluster, held: f64, counted: f64) -> Check {
    let last = std::sync::Mutex::new(String::new());
    wait_for(
        "/v1/quotas to show the namespace's quota",
        Duration::from_secs(30),
        || async {
            let text = c.admin_text("EXTENDER_ADMIN", "/v1/quotas")?;
            *last.lock().unwrap() = text.clone();
            let all: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
            let ns = all
                .as_array()
                .and_then(|a| a.iter().find(|u| u["namespace"] == NS))
                .cloned()
                .unwrap_or_default();
            let q = &ns["quotas"][0];
            Ok((ns["heldGpus"].as_f64() == Some(held)
                && q["name"] == QUOTA
                && q["usedGpus"].as_f64() == Some(counted)
                && q["hardGpus"] == 1.5)
                .then_some(()))
        },
    )
    .await
    .map_err(|e| format!("{e}: {}", last.lock().unwrap()))?;
    let out = Command::new(common::BIN)
        .args(["status", "--namespace", NS])
        .env("KUBECONFIG", c.var("KUBECONFIG"))
        .output()
        .map_err(|e| e.to_string())?;
    let table = String::from_utf8_lossy(&out.stdout);
    let row = table
        .lines()
        .find(|l| l.starts_with(&format!("{NS} ")))
        .map(|l| l.split_whitespace().collect::<Vec<_>>());
    let (held_f, counted_f) = (held, counted);
    let (held, counted) = (format!("{held:.2}"), format!("{counted:.2}"));
    let want = [NS, &held, QUOTA, &counted, "1.50"];
    ensure(
        out.status.success()
            && row
                .as_ref()
                .is_some_and(|r| r.len() == 6 && r[0] == want[0] && r[2..] == want[1..]),
        format!(
            "gpu-share status does not show {want:?}:\n{table}{}",
            String::from_utf8_lossy(&out.stderr)
        ),
    )?;
    let diff = ((held_f - counted_f) * 100.0).round() / 100.0;
    let note = format!("  {NS}: {diff} GPUs held by pods that carry no gpu-share.io/gpu-milli");
    ensure(
        diff == 0.0 || table.lines().any(|l| l.starts_with(&note)),
        format!(
            "gpu-share status does not say why {held} GPUs are held and {counted} counted:\n{table}{}",
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Every GPU node advertises its GPUs in thousandths (2000, which the API server writes `2k`; a
/// node registered anew, by its kubelet, included); a node without GPUs nothing.
async fn nodes_advertise(c: &Cluster) -> Check {
    for (node, gpus) in [("quota-mps", "2k"), ("a10-ts4x2", "2k")] {
        let last = std::sync::Mutex::new(None);
        wait_for(
            &format!("{node} to advertise gpu-share.io/gpu-milli {gpus}"),
            Duration::from_secs(30),
            || async {
                let a = advertised(c, node).await?;
                *last.lock().unwrap() = Some(a.clone());
                Ok((a == (Some(gpus.into()), Some(gpus.into()))).then_some(()))
            },
        )
        .await
        .map_err(|e| format!("{e}; it advertises {:?}", last.lock().unwrap()))?;
    }
    let cpu = advertised(c, "quota-cpu").await?;
    ensure(
        cpu == (None, None),
        format!("quota-cpu has no GPU and advertises {cpu:?}"),
    )
}

pub async fn quotas(c: &Cluster) -> Check {
    let _ = c.kubectl(&["delete", "namespace", NS, "--wait=true"], None);
    namespace(c, NS).await?;
    // The quantity on (the policy's default), per-GPU forms off (as an earlier run may have
    // left them).
    set_policy(
        c,
        &[
            ("gpuMilli: false\n", "gpuMilli: true\n"),
            ("  timeslice: true\n", "  timeslice: false\n"),
        ],
    )?;
    register(c, "quota-mps-node.yaml")?;
    register(c, "time-sliced-node.yaml")?;
    nodes_advertise(c).await?;
    // A kubelet that registers its node anew (a new Node object) advertises nothing of
    // gpu-share's: advertised again.
    kubectl(c, &["delete", "node", "quota-mps", "--wait=true"], None)?;
    register(c, "quota-mps-node.yaml")?;
    nodes_advertise(c).await?;
    apply(
        c,
        NS,
        &json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": QUOTA},
                "spec": {"hard": {MILLI: "1500"}}}),
    )?;
    used_becomes(c, "0").await?;
    // The webhook has the policy as an earlier point left it (its per-GPU forms off): MPS
    // pods in the device plugin's form, with the quantity.
    wait_for(
        "the webhook to write MPS pods in the device plugin's form",
        Duration::from_secs(30),
        || async {
            let out = kubectl(
                c,
                &[
                    "create",
                    "--dry-run=server",
                    "-n",
                    "default",
                    "-o",
                    "json",
                    "-f",
                    "-",
                ],
                Some(&bare("probe", "mps-25", "quota-mps").to_string()),
            )?;
            Ok(
                (out.contains(r#""nvidia.com/gpu": "1""#)
                    && out.contains("gpu-share.io/gpu-milli"))
                .then_some(()),
            )
        },
    )
    .await?;

    // Device-plugin nodes: 0.25 + 0.5 + 3/7 (428) of a GPU, each bound as before.
    for (name, request, node) in [
        ("mps", "mps-25", "quota-mps"),
        ("ts", "timeslice-50", "a10-ts4x2"),
        ("mig", "mig-3g.40gb", "a100-mig-layout"),
    ] {
        apply(c, NS, &bare(name, request, node))?;
    }
    wait_pods(c, NS, 3, 0).await?;
    let pods = pods_of(c, NS).await?;
    for (name, want) in [("mps", "250"), ("ts", "500"), ("mig", "428")] {
        let p = &pods[name];
        let requests = p
            .spec
            .as_ref()
            .and_then(|s| s.containers[0].resources.as_ref())
            .and_then(|r| r.requests.clone())
            .unwrap_or_default();
        ensure(
            limits_of(p)
                .get("gpu-share.io/gpu-milli")
                .map(String::as_str)
                == Some(want)
                && requests.get("gpu-share.io/gpu-milli").map(|q| q.0.as_str()) == Some(want),
            format!(
                "{name} carries {:?} / {requests:?}, not {want}",
                limits_of(p)
            ),
        )?;
    }
    used_becomes(c, "1178").await?;
    quota_shown(c, 1.18, 1.18).await?;
    // One more is refused at creation, in the API server's words; a Deployment's ReplicaSet says
    // the same in its events.
    refused(c, &bare("one-more", "timeslice-50", "a10-ts4x2"), "500")?;
    let mut t = bare("x", "timeslice-50", "a10-ts4x2");
    t["metadata"] =
        json!({"labels": {"app": "over"}, "annotations": {"gpu-share": "timeslice-50"}});
    if let Some(t) = t.as_object_mut() {
        t.remove("apiVersion");
        t.remove("kind");
    }
    apply(c, NS, &deployment("over", 1, t))?;
    let events: Api<Event> = Api::namespaced(c.client.clone(), NS);
    wait_for(
        "the ReplicaSet to say the quota refused its pod",
        Duration::from_secs(60),
        || async {
            let list = events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            Ok(list
                .items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("FailedCreate")
                        && e.message
                            .as_deref()
                            .is_some_and(|m| m.contains("exceeded quota: gpus"))
                })
                .then_some(()))
        },
    )
    .await?;
    kubectl(c, &["-n", NS, "delete", "deployment", "over"], None)?;

    // A node shared per GPU: a share in per-GPU form counts too (0.3).
    register(c, "per-gpu-node.yaml")?;
    let per_gpu = [
        ("  timeslice: false\n", "  timeslice: true\n"),
        ("  releaseAfterSeconds: 30\n", "  releaseAfterSeconds: 5\n"),
    ];
    set_policy(c, &per_gpu)?;
    // Reservations able to run, as the per-GPU point leaves them: this point may run alone.
    reservations_can_run(c).await?;
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
                    "default",
                    "-o",
                    "json",
                    "-f",
                    "-",
                ],
                Some(&bare("probe", "timeslice-30", "a100-per-gpu").to_string()),
            )?;
            Ok(out.contains("configMapKeyRef").then_some(()))
        },
    )
    .await?;
    apply(c, NS, &bare("per-gpu", "timeslice-30", "a100-per-gpu"))?;
    used_becomes(c, "1478").await?;
    quota_shown(c, 1.48, 1.48).await?;
    refused(c, &bare("one-more", "mps-25", "quota-mps"), "250")?;

    // Pods admitted before the quantity (here: with the policy's gpuMilli off) carry none: the
    // quota neither counts nor limits them.
    set_policy(c, &[("gpuMilli: true\n", "gpuMilli: false\n")])?;
    webhook_writes(c, false).await?;
    apply(c, NS, &bare("before-upgrade", "mps-25", "quota-mps"))?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    used_becomes(c, "1478").await?;
    // gpu-share holds it all the same, and says so.
    quota_shown(c, 1.73, 1.48).await?;
    set_policy(c, &[("gpuMilli: false\n", "gpuMilli: true\n")])?;
    webhook_writes(c, true).await?;

    // Put back: the share gone, its reservation (run by the test's kubelet for them) released
    // after the grace, the node and the policy as they were.
    kubectl(c, &["delete", "namespace", NS, "--timeout=120s"], None)?;
    let mut k = common::reserve::Kubelet::new(c)?;
    let start = Instant::now();
    loop {
        k.tick(c).await?;
        let left = pods_of(c, common::reserve::RESERVATIONS).await?;
        if left.values().all(|p| node_of(p) != Some("a100-per-gpu")) {
            break;
        }
        ensure(
            start.elapsed() < Duration::from_secs(90),
            "the per-GPU node's reservation was not released within 90 s",
        )?;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    set_policy(c, &per_gpu.map(|(off, on)| (on, off)))?;
    for node in OWN_NODES {
        kubectl(c, &["delete", "node", node, "--wait=false"], None)?;
    }
    Ok(())
}

//! Nodes whose GPUs NVIDIA's DRA driver publishes (tests/cluster/dra-nodes.yaml, with the
//! ResourceSlices of tests/fixtures/nvidia-dra/ that the driver's own code wrote), beside the
//! device-plugin nodes of the rest of the test, on Kubernetes 1.37 with no feature gate:
//! - the driver's DeviceClasses (its chart's) and gpu-share's MIG classes are applied;
//! - an `exclusive-1` Deployment and a `mig-1g.10gb` Deployment land there, their claims made
//!   and allocated by kube-scheduler's DRA plugin (KEP-5004 extended resources);
//! - the ledger equals the claims (`/v1/nodes` shows the claims, with no per-GPU choice);
//! - a full DRA node refuses the next replica in words;
//! - a restarted extender rebuilds the DRA allocations from the API;
//! - the quota quantity: DRA nodes advertise it, DRA pods carry it; `gpu-share status` read
//!   from the cluster shows the DRA nodes;
//! - two exclusive pods that may go to either kind of node land one on each (a device-plugin
//!   node beside the DRA ones), each counted once;
//! - a `timeslice-25` pod meant for a DRA node gets the refusal, in words;
//! - the opt-in: with a `nodeModes` rule that declares the ConsumableShares node `time-slicing`,
//!   `timeslice-25` pods take the driver's shares there (one of four per GPU, each claim's
//!   consumed capacity), the ledger equals the claims, and a full node, a share larger than one
//!   of the driver's and the node without the rule refuse in words.

use super::*;

const NS: &str = "dra";
const WHOLE: &str = "dra-h100-2gpu-whole";
const MIG: &str = "dra-h100-2gpu-mig";
/// 8x H100 shared by the driver's ConsumableShares (4 per GPU), labelled for the opt-in.
const SHARES: &str = "dra-h100-80gb-shares";
/// The namespace of the shares part.
const SHARES_NS: &str = "dra-shares";
/// The `nodeModes` rule that opts the shares node in, in place of the shipped `nodeModes: []`.
const NO_RULES: &str = "nodeModes: []";
const SHARES_RULE: &str = "nodeModes:\n- selector:\n    matchLabels:\n      gpu-share.test/dra-shares: \"on\"\n  sharing: time-slicing\n  replicas: 4";
/// A device-plugin node beside the DRA ones (tests/cluster/dra-nodes.yaml).
const BESIDE: &str = "dra-beside-plain-1";
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/nvidia-dra");

/// The claims allocated devices of the driver, per node: their names.
fn claims_by_node(c: &Cluster) -> Result<BTreeMap<String, BTreeSet<String>>, String> {
    let out = kubectl(c, &["get", "resourceclaims", "-A", "-o", "json"], None)?;
    let list: Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
    let mut by: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for claim in list["items"].as_array().into_iter().flatten() {
        let name = claim["metadata"]["name"].as_str().unwrap_or_default();
        let ns = claim["metadata"]["namespace"].as_str().unwrap_or_default();
        for r in claim["status"]["allocation"]["devices"]["results"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["driver"] == "gpu.nvidia.com")
        {
            if let Some(pool) = r["pool"].as_str() {
                by.entry(pool.to_string())
                    .or_default()
                    .insert(format!("{ns}/{name}"));
            }
        }
    }
    Ok(by)
}

/// The ledger's holdings on the DRA nodes are the claims, and nothing else: polled until so.
async fn ledger_is_the_claims(c: &Cluster, step: &str) -> Check {
    claims_held(c, NS, &[WHOLE, MIG], step).await
}

/// [`ledger_is_the_claims`] for `nodes`, whose pods are those of `ns`.
async fn claims_held(c: &Cluster, ns: &str, nodes: &[&str], step: &str) -> Check {
    let last = std::sync::Mutex::new(String::new());
    let r = wait_for(
        &format!("the ledger to equal the claims after {step}"),
        Duration::from_secs(30),
        || async {
            let claims = claims_by_node(c)?;
            let ledger = ledger(c)?;
            let mut diffs = Vec::new();
            // Each pod bound to a DRA node has its claim there, and only one.
            let pods = pods_of(c, ns).await?;
            for node in nodes.iter().copied() {
                let bound = pods
                    .values()
                    .filter(|p| live(p) && node_of(p) == Some(node))
                    .count();
                let claimed = claims.get(node).map_or(0, BTreeSet::len);
                if bound != claimed {
                    diffs.push(format!("{node}: {bound} pods bound, {claimed} claims"));
                }
            }
            for node in nodes.iter().copied() {
                let n = ledger
                    .get(node)
                    .ok_or(format!("{node} is not in the ledger"))?;
                let held = ledger_pods(n);
                let want = claims.get(node).cloned().unwrap_or_default();
                if held != want {
                    diffs.push(format!("{node}: ledger {held:?}, claims {want:?}"));
                }
                let shown: Vec<&Value> = n["pods"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|p| p["kind"] != "dra-claim" || p["model"] != "")
                    .collect();
                if !shown.is_empty() {
                    diffs.push(format!(
                        "{node}: holdings other than claims without a per-GPU choice: {shown:?}"
                    ));
                }
            }
            *last.lock().unwrap() = diffs.join("; ");
            Ok(diffs.is_empty().then_some(()))
        },
    )
    .await;
    r.map_err(|e| format!("{e}: {}", last.lock().unwrap()))
}

pub(super) async fn dra(c: &Cluster) -> Check {
    for classes in [
        format!("{FIXTURES}/deviceclasses.yaml"),
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/manifests/components/dra/deviceclasses.yaml"
        )
        .to_string(),
    ] {
        kubectl(c, &["apply", "-f", &classes], None)?;
    }
    super::quota::register(c, "dra-nodes.yaml")?;
    for node in [WHOLE, MIG, SHARES] {
        let _ = kubectl(
            c,
            &[
                "delete",
                "resourceslice",
                &format!("00000-gpu.nvidia.com-{node}"),
                "--ignore-not-found",
            ],
            None,
        );
        kubectl(
            c,
            &["create", "-f", &format!("{FIXTURES}/{node}.yaml")],
            None,
        )?;
    }
    wait_for(
        "the DRA nodes in the ledger",
        Duration::from_secs(30),
        || async {
            let l = ledger(c)?;
            let kinds: Vec<&str> = [WHOLE, MIG]
                .iter()
                .filter_map(|n| l.get(*n)?["kind"].as_str())
                .collect();
            Ok((kinds == ["DRA: whole", "DRA: mig mixed"]).then_some(()))
        },
    )
    .await?;
    let l = ledger(c)?;
    ensure(
        l[WHOLE]["gpus"] == 2 && l[MIG]["gpus"] == 2 && l[MIG]["mig"]["1g.10gb"] == "0/7",
        format!("the DRA nodes read as {} and {}", l[WHOLE], l[MIG]),
    )?;
    let mut result = served(c).await;
    if result.is_ok() {
        result = shares(c).await;
    }
    // Leave no DRA node and no rule behind for the points after this one.
    let restored = super::quota::set_policy(c, &[(SHARES_RULE, NO_RULES)]);
    let _ = kubectl(c, &["delete", "namespace", NS, "--wait=true"], None);
    let _ = kubectl(c, &["delete", "namespace", SHARES_NS, "--wait=true"], None);
    for node in [WHOLE, MIG, SHARES] {
        let _ = kubectl(
            c,
            &[
                "delete",
                "resourceslice",
                &format!("00000-gpu.nvidia.com-{node}"),
                "--ignore-not-found",
            ],
            None,
        );
        let _ = kubectl(c, &["delete", "node", node, "--ignore-not-found"], None);
    }
    let _ = kubectl(c, &["delete", "node", BESIDE, "--ignore-not-found"], None);
    result.and(restored)
}

async fn served(c: &Cluster) -> Check {
    namespace(c, NS).await?;
    apply(
        c,
        NS,
        &deployment(
            "train",
            2,
            template(json!({"gpu-share": "exclusive-1"}), Some(WHOLE), "Always"),
        ),
    )?;
    apply(
        c,
        NS,
        &deployment(
            "infer",
            7,
            template(json!({"gpu-share": "mig-1g.10gb"}), Some(MIG), "Always"),
        ),
    )?;
    wait_pods(c, NS, 9, 0).await?;
    // kube-scheduler's DRA plugin made and allocated each pod's claim (KEP-5004; the field is
    // newer than the Kubernetes types this crate builds with: read as JSON).
    let pods: Value =
        serde_json::from_str(&kubectl(c, &["get", "pods", "-n", NS, "-o", "json"], None)?)
            .map_err(|e| e.to_string())?;
    for p in pods["items"].as_array().into_iter().flatten() {
        let name = p["metadata"]["name"].as_str().unwrap_or("?");
        ensure(
            p["status"]["extendedResourceClaimStatus"]["resourceClaimName"].is_string(),
            format!("{name} has no extended resource claim: {}", p["status"]),
        )?;
        ensure(
            p["metadata"]["annotations"]["gpu-share.io/gpus"].is_null(),
            format!("{name} on a DRA node carries a per-GPU choice gpu-share did not make"),
        )?;
    }
    ledger_is_the_claims(c, "two exclusive-1 and seven mig-1g.10gb pods bound").await?;
    let l = ledger(c)?;
    ensure(
        l[WHOLE]["usedGpus"] == 2.0 && l[MIG]["mig"]["1g.10gb"] == "7/7",
        format!(
            "the ledger counts {} GPUs and {} 1g.10gb devices",
            l[WHOLE]["usedGpus"], l[MIG]["mig"]["1g.10gb"]
        ),
    )?;
    // The quota quantity counts DRA pods too: they carry it, and the DRA nodes advertise their
    // GPUs in thousandths (2000, written 2k), as any GPU node.
    for node in [WHOLE, MIG] {
        wait_for(
            &format!("{node} to advertise gpu-share.io/gpu-milli 2k"),
            Duration::from_secs(30),
            || async {
                let a = super::quota::advertised(c, node).await?;
                Ok((a == (Some("2k".into()), Some("2k".into()))).then_some(()))
            },
        )
        .await?;
    }
    for p in pods["items"].as_array().into_iter().flatten() {
        let milli = &p["spec"]["containers"][0]["resources"]["limits"]["gpu-share.io/gpu-milli"];
        ensure(
            milli.is_string(),
            format!(
                "{} carries no gpu-share.io/gpu-milli",
                p["metadata"]["name"].as_str().unwrap_or("?")
            ),
        )?;
    }
    // `gpu-share status`, read from the cluster alone, shows the DRA nodes and their claims.
    let out = std::process::Command::new(common::BIN)
        .arg("status")
        .env("KUBECONFIG", c.dir.join("kubeconfig"))
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure(
        out.status.success() && text.contains("DRA: whole") && text.contains("DRA: mig mixed"),
        format!(
            "gpu-share status does not show the DRA nodes:\n{text}{}",
            String::from_utf8_lossy(&out.stderr)
        ),
    )?;
    // Full: the next replica of each waits, in words.
    kubectl(
        c,
        &["scale", "-n", NS, "deployment/train", "--replicas=3"],
        None,
    )?;
    kubectl(
        c,
        &["scale", "-n", NS, "deployment/infer", "--replicas=8"],
        None,
    )?;
    let waiting = wait_pods(c, NS, 9, 2).await?;
    for w in &waiting {
        why_waiting(c, NS, w).await?;
    }
    // A restarted extender rebuilds the DRA allocations from the API.
    c.stop("extender");
    c.start_process("extender");
    c.wait_ready("EXTENDER_ADMIN", Duration::from_secs(60))
        .await?;
    ledger_is_the_claims(c, "the extender restarted").await?;
    let l = ledger(c)?;
    ensure(
        l[WHOLE]["usedGpus"] == 2.0 && l[MIG]["mig"]["1g.10gb"] == "7/7",
        format!(
            "after a restart the ledger counts {} GPUs and {} 1g.10gb devices",
            l[WHOLE]["usedGpus"], l[MIG]["mig"]["1g.10gb"]
        ),
    )?;
    // Room again: a replica gone, the waiting one takes its GPU.
    kubectl(
        c,
        &["scale", "-n", NS, "deployment/train", "--replicas=1"],
        None,
    )?;
    kubectl(
        c,
        &["scale", "-n", NS, "deployment/infer", "--replicas=7"],
        None,
    )?;
    wait_pods(c, NS, 8, 0).await?;
    ledger_is_the_claims(c, "scaled down").await?;
    // Mixed: two exclusive pods that may go to either kind of node (the DRA node has one GPU
    // free, the device-plugin node beside it one): one lands on each, each read right, and
    // neither counted twice.
    let mut either = template(json!({"gpu-share": "exclusive-1"}), None, "Always");
    either["spec"]["nodeSelector"] = json!({"gpu-share.test/pool": "mixed"});
    apply(c, NS, &deployment("either", 2, either))?;
    wait_pods(c, NS, 10, 0).await?;
    ledger_is_the_claims(c, "exclusive pods on either kind of node").await?;
    ledger_is_the_api(c, "exclusive pods on either kind of node").await?;
    let nodes: BTreeSet<String> = pods_of(c, NS)
        .await?
        .values()
        .filter(|p| {
            p.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("either-"))
        })
        .filter_map(|p| node_of(p).map(str::to_string))
        .collect();
    ensure(
        nodes == BTreeSet::from([WHOLE.to_string(), BESIDE.to_string()]),
        format!("the two pods went to {nodes:?}, not one to each kind of node"),
    )?;
    ensure(
        ledger(c)?[BESIDE]["pods"].as_array().map(Vec::len) == Some(1),
        "the device-plugin node's ledger does not hold its one pod",
    )?;
    kubectl(
        c,
        &["delete", "deployment", "-n", NS, "either", "--wait=true"],
        None,
    )?;
    // A share meant for a DRA node is refused there, in words.
    apply(
        c,
        NS,
        &json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "share", "annotations": {"gpu-share": "timeslice-25"}},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": WHOLE}, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "vllm/vllm-openai:v0.11.0"}]},
        }),
    )?;
    let words = why_waiting(c, NS, "share").await?;
    ensure(
        words.contains("time-sliced")
            || words.contains("sharing-strategy")
            || words.contains("affinity"),
        format!("the share's refusal on a DRA node: {words}"),
    )
}

/// A pod of `annotation` for the shares node pool (its label), in the shares namespace.
fn share_pod(name: &str, annotation: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": {"gpu-share": annotation}},
        "spec": {"nodeSelector": {"gpu-share.test/dra-shares": "on"}, "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "main", "image": "vllm/vllm-openai:v0.11.0"}]},
    })
}

/// Waits (up to 60 s) until the ledger shows the shares node as `kind`.
async fn shares_node_reads_as(c: &Cluster, kind: &str, step: &str) -> Check {
    wait_for(step, Duration::from_secs(60), || async {
        Ok((ledger(c)?.get(SHARES).and_then(|n| n["kind"].as_str()) == Some(kind)).then_some(()))
    })
    .await
}

/// The opt-in: a `nodeModes` rule declares the ConsumableShares node `time-slicing`; the webhook
/// then admits such nodes for timeslice pods, and the extender serves them one driver share each.
async fn shares(c: &Cluster) -> Check {
    namespace(c, SHARES_NS).await?;
    // Before the rule: the node's shares are not gpu-share's.
    shares_node_reads_as(
        c,
        "DRA: consumable shares x4",
        "the shares node in the ledger",
    )
    .await?;
    super::quota::set_policy(c, &[(NO_RULES, SHARES_RULE)])?;
    shares_node_reads_as(
        c,
        "DRA: consumable shares x4, time-sliced shares",
        "the extender to read the shares node under the rule",
    )
    .await?;
    wait_for(
        "the webhook to admit the declared nodes for timeslice pods",
        Duration::from_secs(60),
        || async {
            let out = kubectl(
                c,
                &["create", "--dry-run=server", "-n", SHARES_NS, "-o", "json", "-f", "-"],
                Some(&share_pod("probe", "timeslice-25").to_string()),
            )?;
            // The rule's term in the pod's required node affinity (its nodeSelector names the
            // label too).
            let pod: Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
            let terms = &pod["spec"]["affinity"]["nodeAffinity"]
                ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
            Ok(terms.to_string().contains("gpu-share.test/dra-shares").then_some(()))
        },
    )
    .await?;
    // A share larger than one of the driver's is refused in words.
    apply(c, SHARES_NS, &share_pod("half", "timeslice-50"))?;
    let words = why_waiting(c, SHARES_NS, "half").await?;
    ensure(
        words.contains("equal shares"),
        format!("a timeslice-50 pod on a node of quarter shares: {words}"),
    )?;
    kubectl(
        c,
        &["delete", "pod", "-n", SHARES_NS, "half", "--wait=true"],
        None,
    )?;
    // 32 quarter shares fill 8 GPUs of 4 shares each.
    let mut t = template(json!({"gpu-share": "timeslice-25"}), None, "Always");
    t["spec"]["nodeSelector"] = json!({"gpu-share.test/dra-shares": "on"});
    apply(c, SHARES_NS, &deployment("quarters", 32, t))?;
    wait_pods_within(c, SHARES_NS, 32, 0, Duration::from_secs(180)).await?;
    let claims: Value = serde_json::from_str(&kubectl(
        c,
        &["get", "resourceclaims", "-n", SHARES_NS, "-o", "json"],
        None,
    )?)
    .map_err(|e| e.to_string())?;
    let mut per_gpu: BTreeMap<String, u64> = BTreeMap::new();
    for claim in claims["items"].as_array().into_iter().flatten() {
        for r in claim["status"]["allocation"]["devices"]["results"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["driver"] == "gpu.nvidia.com")
        {
            let shares = r["consumedCapacity"]["shares"].as_str().unwrap_or("?");
            ensure(
                r["pool"] == SHARES && shares == "1",
                format!("a claim took {shares} share(s) on {}: {r}", r["pool"]),
            )?;
            *per_gpu
                .entry(r["device"].as_str().unwrap_or("?").to_string())
                .or_default() += 1;
        }
    }
    ensure(
        per_gpu.len() == 8 && per_gpu.values().all(|n| *n == 4),
        format!("the driver's shares taken per GPU: {per_gpu:?}"),
    )?;
    claims_held(c, SHARES_NS, &[SHARES], "32 quarter shares bound").await?;
    let l = ledger(c)?;
    ensure(
        l[SHARES]["usedGpus"] == 8.0,
        format!(
            "the ledger counts {} GPUs used by the shares",
            l[SHARES]["usedGpus"]
        ),
    )?;
    // Full: the next share waits, in words.
    kubectl(
        c,
        &[
            "scale",
            "-n",
            SHARES_NS,
            "deployment/quarters",
            "--replicas=33",
        ],
        None,
    )?;
    let waiting = wait_pods(c, SHARES_NS, 32, 1).await?;
    for w in &waiting {
        let words = why_waiting(c, SHARES_NS, w).await?;
        ensure(
            words.contains("no free GPU replica"),
            format!("the 33rd share on a full node: {words}"),
        )?;
    }
    // Room again: a replica gone, the waiting one takes its share.
    kubectl(
        c,
        &[
            "scale",
            "-n",
            SHARES_NS,
            "deployment/quarters",
            "--replicas=31",
        ],
        None,
    )?;
    wait_pods(c, SHARES_NS, 31, 0).await?;
    claims_held(c, SHARES_NS, &[SHARES], "scaled down").await?;
    // Without the rule, the node's shares are not gpu-share's again: the extender says so.
    super::quota::set_policy(c, &[(SHARES_RULE, NO_RULES)])?;
    shares_node_reads_as(
        c,
        "DRA: consumable shares x4",
        "the extender to read the shares node without the rule",
    )
    .await?;
    Ok(())
}

//! Kueue counts GPUs in fractions: its ClusterQueue covers `gpu-share.io/gpu-milli`, and Kueue's
//! own controller and webhooks (tests/cluster/kueue.sh: its manifests from its Go module, its
//! binary, under its ServiceAccount) admit gpu-share pods and Jobs by it. docs/quotas.md's examples,
//! as written: the Configuration fragment (kueue.sh merges it) and the queues (applied here).
//!
//! Both orders of the two mutating webhook configurations (the API server calls them in the
//! order of their names: gpu-share's first as shipped, Kueue's first under a name that sorts
//! before it): pods carry Kueue's gate and label and gpu-share's quantity, and Kueue sizes them
//! by it:
//! - pod integration: a ClusterQueue of 2 GPUs admits eight `timeslice-25` pods and holds the
//!   ninth (gated, its Workload "insufficient unused quota for gpu-share.io/gpu-milli"), on a node
//!   with room for twelve;
//! - Job integration: a Job of two `timeslice-25` pods is suspended with the quantity in its
//!   template (gpu-share's `job-templates` webhook), held while 0.25 GPUs are free, and admitted
//!   once 0.5 are: its pods bound, carrying the quantity, and finished.

use super::*;
use std::process::Command;

const NS: &str = "team-a";
const NODE: &str = "kueue-a100-ts4x3";
const QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
const MILLI: &str = "gpu-share.io/gpu-milli";

/// docs/quotas.md's YAML block marked `<!-- example: NAME -->`, as written.
fn quotas_block(name: &str) -> Result<String, String> {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/quotas.md"))
        .map_err(|e| e.to_string())?;
    let marker = format!("<!-- example: {name} -->\n```yaml\n");
    let start = page.find(&marker).ok_or_else(|| {
        format!("docs/quotas.md has no yaml block marked <!-- example: {name} -->")
    })? + marker.len();
    let len = page[start..]
        .find("\n```")
        .ok_or_else(|| format!("docs/quotas.md's block {name} does not end"))?;
    Ok(page[start..start + len].to_string())
}

/// tests/cluster/kueue.sh with `arg` (`--first`, `--remove` or none).
fn kueue_sh(c: &Cluster, arg: Option<&str>) -> Check {
    let mut cmd = Command::new("bash");
    cmd.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/cluster/kueue.sh"
    ))
    .arg(&c.dir);
    cmd.args(arg);
    let out = cmd.output().map_err(|e| e.to_string())?;
    ensure(
        out.status.success(),
        format!(
            "tests/cluster/kueue.sh {arg:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: NS},
                     "annotations": {"gpu-share": "timeslice-25"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "vllm/vllm-openai:v0.11.0"}],
        },
    })
}

fn kueue_job() -> Value {
    let mut j = job(
        "train",
        2,
        2,
        template(
            json!({"gpu-share": "timeslice-25", COMPLETE: "3s"}),
            Some(NODE),
            "Never",
        ),
    );
    j["metadata"]["labels"] = json!({QUEUE_LABEL: NS});
    j
}

fn get_json(c: &Cluster, args: &[&str]) -> Result<Value, String> {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&kubectl(c, &all, None)?).map_err(|e| e.to_string())
}

/// The namespace's Kueue Workloads, by the name of the pod or Job they stand for.
fn workloads(c: &Cluster) -> Result<BTreeMap<String, Value>, String> {
    let list = get_json(c, &["-n", NS, "get", "workloads.kueue.x-k8s.io"])?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| {
            let owner = w["metadata"]["ownerReferences"][0]["name"].as_str()?;
            Some((owner.to_string(), w.clone()))
        })
        .collect())
}

fn admitted(w: &Value) -> bool {
    w["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Admitted" && c["status"] == "True")
}

/// The words Kueue holds a Workload back with.
fn held_because(w: &Value) -> String {
    w["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "QuotaReserved")
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// What the ClusterQueue `gpus` counts of the quantity (`None`: nothing yet).
fn queue_uses(c: &Cluster) -> Result<Option<String>, String> {
    // Before docs/quotas.md's queues are applied (the first clear), there is none.
    let out = kubectl(
        c,
        &[
            "get",
            "clusterqueue",
            "gpus",
            "--ignore-not-found",
            "-o",
            "json",
        ],
        None,
    )?;
    if out.trim().is_empty() {
        return Ok(None);
    }
    let cq: Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
    Ok(cq["status"]["flavorsUsage"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|f| f["resources"].as_array().into_iter().flatten())
        .find(|r| r["name"] == MILLI)
        .and_then(|r| r["total"].as_str())
        .map(str::to_string))
}

fn milli_of(p: &Pod) -> Option<String> {
    limits_of(p).get(MILLI).cloned()
}

/// Waits until `want` holds of the namespace's pods and Workloads, saying what was seen last.
async fn until<F>(c: &Cluster, what: &str, want: F) -> Check
where
    F: Fn(&BTreeMap<String, Pod>, &BTreeMap<String, Value>) -> bool,
{
    let last = std::sync::Mutex::new(String::new());
    wait_for(what, Duration::from_secs(60), || async {
        let pods = pods_of(c, NS).await?;
        let wls = workloads(c)?;
        let seen: Vec<String> = pods
            .iter()
            .map(|(n, p)| format!("{n}: {} on {:?}", phase(p), node_of(p)))
            .chain(wls.iter().map(|(n, w)| {
                format!(
                    "workload of {n}: admitted {} {}",
                    admitted(w),
                    held_because(w)
                )
            }))
            .collect();
        *last.lock().unwrap() = seen.join("; ");
        Ok(want(&pods, &wls).then_some(()))
    })
    .await
    .map_err(|e| format!("{e}: {}", last.lock().unwrap()))
}

fn bound_to_node(p: Option<&Pod>) -> bool {
    p.is_some_and(|p| node_of(p) == Some(NODE) && live(p))
}

/// One run of the scenario, with the mutating configurations in the order kueue.sh set.
async fn scenario(c: &Cluster, first: &str) -> Check {
    // The order the API server calls them in: by name.
    let names = kubectl(
        c,
        &["get", "mutatingwebhookconfigurations", "-o", "name"],
        None,
    )?;
    let mut names: Vec<&str> = names.lines().collect();
    names.sort();
    let at = |n: &str| names.iter().position(|l| l.ends_with(&format!("/{n}")));
    let (g, k) = (
        at("gpu-share"),
        at("kueue-mutating-webhook-configuration").or(at("0-kueue-mutating-webhook-configuration")),
    );
    ensure(
        g.is_some() && k.is_some() && (first == "gpu-share") == (g < k),
        format!("{first} should be called first: {names:?}"),
    )?;
    kubectl(
        c,
        &["apply", "-f", "-"],
        Some(&quotas_block("kueue-queues")?),
    )?;

    // Pod integration: eight admitted, the ninth held by the queue (whichever Kueue left out:
    // pods created within the same second tie in its queue).
    let names: Vec<String> = (1..=9).map(|i| format!("p{i}")).collect();
    for n in &names {
        apply(c, NS, &pod(n))?;
    }
    let held_back = |pods: &BTreeMap<String, Pod>, wls: &BTreeMap<String, Value>| {
        let held: Vec<&String> = names
            .iter()
            .filter(|n| {
                wls.get(*n).is_some_and(|w| {
                    !admitted(w)
                        && held_because(w)
                            .contains(&format!("insufficient unused quota for {MILLI}"))
                }) && pods.get(*n).is_some_and(|p| node_of(p).is_none())
            })
            .collect();
        let bound = names.iter().filter(|n| bound_to_node(pods.get(*n))).count();
        (bound == 8 && held.len() == 1).then(|| held[0].clone())
    };
    until(
        c,
        "eight pods bound and the ninth held by Kueue",
        |pods, wls| held_back(pods, wls).is_some(),
    )
    .await?;
    let pods = pods_of(c, NS).await?;
    let ninth = held_back(&pods, &workloads(c)?).ok_or("the ninth pod is no longer held")?;
    for n in &names {
        let p = &pods[n];
        let labels = p.metadata.labels.clone().unwrap_or_default();
        ensure(
            milli_of(p).as_deref() == Some("250")
                && labels.get("kueue.x-k8s.io/managed").map(String::as_str) == Some("true"),
            format!(
                "{n} should carry gpu-share's quantity (250) and Kueue's label: limits {:?}, labels {labels:?}",
                limits_of(p)
            ),
        )?;
    }
    let gated = pods[&ninth]
        .spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.clone())
        .unwrap_or_default();
    ensure(
        gated.iter().any(|g| g.name == "kueue.x-k8s.io/admission"),
        format!("{ninth} should wait behind Kueue's scheduling gate: {gated:?}"),
    )?;
    queue_counts(c, "2k").await?;

    // Job integration: held while 0.25 GPUs are free, admitted once 0.5 are.
    apply(c, NS, &kueue_job())?;
    let j = get_json(c, &["-n", NS, "get", "job", "train"])?;
    let c0 = &j["spec"]["template"]["spec"]["containers"][0];
    ensure(
        j["spec"]["suspend"] == true && c0["resources"]["limits"][MILLI] == "250",
        format!(
            "the Job should be suspended by Kueue with the quantity in its template: suspend {}, resources {}",
            j["spec"]["suspend"], c0["resources"]
        ),
    )?;
    let running: Vec<&String> = names.iter().filter(|n| **n != ninth).collect();
    let (a, b, third) = (running[0], running[1], running[2]);
    let job_held = |wls: &BTreeMap<String, Value>| {
        wls.get("train").is_some_and(|w| {
            !admitted(w) && held_because(w).contains(&format!("quota for {MILLI}"))
        })
    };
    // One pod at a time, so that which of the ninth pod and the Job Kueue takes first never
    // depends on its queue's order: 0.25 GPUs free take the ninth pod only (a run at
    // ea0dcdc7 saw Kueue admit the Job first when both pods went at once).
    kubectl(c, &["-n", NS, "delete", "pod", a, "--wait=false"], None)?;
    until(
        c,
        &format!("{ninth} admitted and bound, the Job still held"),
        |pods, wls| bound_to_node(pods.get(&ninth)) && job_held(wls),
    )
    .await?;
    // Seven pods of 250 left: Kueue has counted the release, and 0.25 GPUs are free.
    kubectl(c, &["-n", NS, "delete", "pod", b, "--wait=false"], None)?;
    queue_counts(c, "1750").await?;
    until(
        c,
        "the Job still held while 0.25 GPUs are free",
        |_, wls| job_held(wls),
    )
    .await?;
    let w = &workloads(c)?["train"];
    let sized = &w["spec"]["podSets"][0];
    ensure(
        sized["count"] == 2
            && sized["template"]["spec"]["containers"][0]["resources"]["limits"][MILLI] == "250",
        format!("Kueue should size the Job as two pods of 250: {sized}"),
    )?;
    ensure(
        get_json(c, &["-n", NS, "get", "job", "train"])?["spec"]["suspend"] == true,
        "the Job should stay suspended while 0.25 GPUs are free",
    )?;
    kubectl(c, &["-n", NS, "delete", "pod", third, "--wait=false"], None)?;
    until(
        c,
        "the Job admitted, its two pods bound with the quantity",
        |pods, wls| {
            let runs: Vec<&Pod> = pods
                .iter()
                .filter(|(n, _)| n.starts_with("train-"))
                .map(|(_, p)| p)
                .collect();
            wls.get("train").is_some_and(admitted)
                && runs.len() == 2
                && runs
                    .iter()
                    .all(|p| node_of(p) == Some(NODE) && milli_of(p).as_deref() == Some("250"))
        },
    )
    .await?;
    ledger_is_the_api(c, "Kueue's pods and Job bound").await?;
    wait_for("the Job to complete", Duration::from_secs(60), || async {
        let j = get_json(c, &["-n", NS, "get", "job", "train"])?;
        let done = j["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Complete" && c["status"] == "True");
        Ok(done.then_some(()))
    })
    .await?;
    clear(c).await
}

/// The namespace's pods and Jobs gone, and Kueue's Workloads with them.
async fn clear(c: &Cluster) -> Check {
    kubectl(
        c,
        &["-n", NS, "delete", "jobs,pods", "--all", "--wait=false"],
        None,
    )?;
    until(c, "the namespace's pods and Workloads gone", |pods, wls| {
        pods.is_empty() && wls.is_empty()
    })
    .await?;
    queue_counts(c, "0").await
}

/// Waits for the ClusterQueue's status (Kueue writes it after admitting) to count `want`.
async fn queue_counts(c: &Cluster, want: &str) -> Check {
    let last = std::sync::Mutex::new(None);
    wait_for(
        &format!("ClusterQueue gpus to count {want} of {MILLI}"),
        Duration::from_secs(30),
        || async {
            let uses = queue_uses(c)?;
            *last.lock().unwrap() = uses.clone();
            Ok((uses.as_deref().unwrap_or("0") == want).then_some(()))
        },
    )
    .await
    .map_err(|e| format!("{e}; it counts {:?}", last.lock().unwrap()))
}

pub async fn kueue(c: &Cluster) -> Check {
    // The quantity on (the policy's default), per-GPU time-slicing off (as the quota point
    // leaves it; an earlier run may have left it on).
    super::quota::set_policy(
        c,
        &[
            ("gpuMilli: false\n", "gpuMilli: true\n"),
            ("  timeslice: true\n", "  timeslice: false\n"),
        ],
    )?;
    super::quota::register(c, "kueue-node.yaml")?;
    let run = async {
        kueue_sh(c, None)?;
        // Kueue runs before the namespace is cleared: its pods carry Kueue's finalizer.
        namespace(c, NS).await?;
        clear(c).await?;
        scenario(c, "gpu-share")
            .await
            .map_err(|e| format!("gpu-share's webhooks first: {e}"))?;
        kueue_sh(c, Some("--first"))?;
        scenario(c, "kueue")
            .await
            .map_err(|e| format!("Kueue's webhooks first: {e}"))
    }
    .await;
    // Kueue's webhooks go with it (its pod webhook fails closed for every namespace), and the
    // node; the namespace's objects first, while Kueue still removes its finalizers.
    let _ = clear(c).await;
    let removed = kueue_sh(c, Some("--remove"));
    let _ = c.kubectl(&["delete", "node", NODE, "--wait=false"], None);
    run.and(removed)
}

//! Defragmentation in plan mode (`defrag.mode: plan`): two plain nodes of two A100s each, one GPU
//! of each held, one of them by a Deployment's pod, and an `exclusive-2` pod waiting, refused by
//! kube-scheduler's own resource check (`Insufficient nvidia.com/gpu`). The waiting pod is told,
//! in an event, that moving the Deployment's pod to the other node would make room; nothing
//! moves. The nodes are tainted (`gpu-share.io/test=defrag`) so that only this point's pods land
//! there.

use super::*;

const NS: &str = "defrag";
const NODES: [&str; 2] = ["defrag-a", "defrag-b"];
/// The policy's `defrag` section, as shipped and as this point sets it.
const OFF: [(&str, &str); 2] = [
    ("  mode: plan\n", "  mode: off\n"),
    ("  namespaces: [defrag]\n", "  namespaces: []\n"),
];
const PLAN: [(&str, &str); 2] = [
    ("  mode: off\n", "  mode: plan\n"),
    ("  namespaces: []\n", "  namespaces: [defrag]\n"),
];

/// A pod template of `class` on the point's nodes (their pool, their taint), on `node` if given.
fn pool_template(class: &str, node: Option<&str>) -> Value {
    let mut t = template(json!({"gpu-share": class}), node, "Always");
    t["spec"]["nodeSelector"]["gpu-share.io/test-pool"] = json!("defrag");
    t["spec"]["tolerations"] =
        json!([{"key": "gpu-share.io/test", "value": "defrag", "effect": "NoSchedule"}]);
    t
}

/// A bare pod of `class` named `name` on the point's nodes.
fn bare(name: &str, class: &str, node: Option<&str>) -> Value {
    let mut p = pool_template(class, node);
    p["apiVersion"] = json!("v1");
    p["kind"] = json!("Pod");
    p["metadata"]["name"] = json!(name);
    p
}

/// The message of an event of `reason` on pod `name` that says `words`, within 90 s (the
/// controller weighs every 10 s; the margin is for a machine whose cores another build shares).
async fn event_on(c: &Cluster, name: &str, reason: &str, words: &str) -> Result<String, String> {
    let events: Api<Event> = Api::namespaced(c.client.clone(), NS);
    wait_for(
        &format!("a {reason} event on {name} saying {words:?}"),
        Duration::from_secs(90),
        || async {
            let list = events
                .list(&ListParams::default())
                .await
                .map_err(|e| format!("list events: {e}"))?;
            Ok(list
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some(reason))
                .filter(|e| e.involved_object.name.as_deref() == Some(name))
                .filter_map(|e| e.message)
                .find(|m| m.contains(words)))
        },
    )
    .await
}

pub async fn defrag_plan(c: &Cluster) -> Check {
    namespace(c, NS).await?;
    super::quota::set_policy(c, &PLAN)?;
    let result = plan_told(c).await;
    let restored = super::quota::set_policy(c, &OFF);
    let cleaned = kubectl(
        c,
        &[
            "-n",
            NS,
            "delete",
            "deployment,pod",
            "--all",
            "--wait=false",
        ],
        None,
    );
    // The point's own failure first, then the policy's restoring, then the cleanup's.
    result.and(restored).and(cleaned.map(|_| ()))
}

async fn plan_told(c: &Cluster) -> Check {
    // One GPU of each node held by a bare pod.
    for (i, node) in NODES.iter().enumerate() {
        apply(
            c,
            NS,
            &bare(&format!("held-{i}"), "exclusive-1", Some(node)),
        )?;
    }
    wait_pods(c, NS, 2, 0).await?;
    // A Deployment's pod takes a GPU of one of them; the bare pod beside it leaves.
    apply(
        c,
        NS,
        &deployment("mover", 1, pool_template("exclusive-1", None)),
    )?;
    wait_pods(c, NS, 3, 0).await?;
    let pods = pods_of(c, NS).await?;
    let (mover, p) = pods
        .iter()
        .find(|(n, _)| n.starts_with("mover-"))
        .ok_or("no pod of the Deployment")?;
    let from = node_of(p)
        .ok_or("the Deployment's pod has no node")?
        .to_string();
    let to = *NODES.iter().find(|n| **n != from).unwrap();
    let beside = if from == NODES[0] { "held-0" } else { "held-1" };
    kubectl(c, &["-n", NS, "delete", "pod", beside, "--wait=true"], None)?;
    wait_pods(c, NS, 2, 0).await?;
    ledger_is_the_api(c, "one GPU held on each node, one by a Deployment's pod").await?;
    // Two GPUs are free, one on each node: an exclusive-2 pod waits.
    apply(c, NS, &bare("big", "exclusive-2", None))?;
    wait_pods(c, NS, 2, 1).await?;
    let said = event_on(
        c,
        "big",
        "GpuShareDefragPlan",
        &format!("moving {NS}/{mover} from node {from} to {to} makes room on node {from}"),
    )
    .await?;
    ensure(
        said.contains("defrag.mode is plan, so nothing moves"),
        format!("the plan does not say that nothing moves: {said}"),
    )?;
    // Nothing moved: the Deployment's pod is where it was, the pod still waits.
    let pods = pods_of(c, NS).await?;
    ensure(
        pods.get(mover).and_then(node_of) == Some(from.as_str()),
        format!("{mover} left {from}"),
    )?;
    ensure(
        pods.get("big").is_some_and(|p| node_of(p).is_none()),
        "the waiting pod was bound",
    )?;
    ledger_is_the_api(c, "a plan said, nothing moved").await
}

//! A Deployment's replicas over nodes the packing ties: kube-scheduler's default topology spread
//! (`defaultingType: System`) would put each where its ReplicaSet has the fewest pods, and
//! gpu-share, which counts each ReplicaSet's pods per node, passes kube-scheduler that node
//! alone (`feasibleNodes=1` in kube-scheduler's own log), where it passed the whole tie before.
//!
//! The two nodes are alike (A100 80GB time-sliced into 4 replicas) and tainted so that no other
//! point's pods land there.

use super::*;
use gpu_share::extender::tie_break::tie_order;

const NS: &str = "spread";
const TWINS: [&str; 2] = ["spread-a", "spread-b"];

/// A `timeslice-25` pod on the twins (their pool, their taint), on `node` if given.
fn twin_template(node: Option<&str>) -> Value {
    let mut t = template(json!({"gpu-share": "timeslice-25"}), node, "Always");
    t["spec"]["nodeSelector"]["gpu-share.io/test-pool"] = json!("spread");
    t["spec"]["tolerations"] =
        json!([{"key": "gpu-share.io/test", "value": "spread", "effect": "NoSchedule"}]);
    t
}

/// kube-scheduler's own line for a pod it bound: `"Successfully bound pod to node" pod="ns/name"
/// node="..." evaluatedNodes=N feasibleNodes=M`.
fn bound_line(c: &Cluster, name: &str) -> Option<String> {
    let pod = format!("pod=\"{NS}/{name}\"");
    c.log("kube-scheduler")
        .lines()
        .find(|l| l.contains("\"Successfully bound pod to node\"") && l.contains(&pod))
        .map(str::to_string)
}

pub async fn default_spread(c: &Cluster) -> Check {
    namespace(c, NS).await?;
    let first = *TWINS.iter().min_by_key(|n| tie_order(n)).unwrap();
    let other = *TWINS.iter().find(|n| **n != first).unwrap();
    // One replica: the twins tie and hold none of its ReplicaSet's pods: the first in the fixed
    // order.
    apply(c, NS, &deployment("replicas", 1, twin_template(None)))?;
    wait_pods(c, NS, 1, 0).await?;
    let pods = pods_of(c, NS).await?;
    let (one, p) = pods.iter().next().unwrap();
    ensure(
        node_of(p) == Some(first),
        format!(
            "the first replica {one} went to {:?}, not {first}",
            node_of(p)
        ),
    )?;
    // A stranger of the same size on the other twin: the two are packed alike, and tie again.
    let mut stranger = twin_template(Some(other));
    stranger["metadata"]["name"] = json!("stranger");
    stranger["apiVersion"] = json!("v1");
    stranger["kind"] = json!("Pod");
    apply(c, NS, &stranger)?;
    wait_pods(c, NS, 2, 0).await?;
    ledger_is_the_api(c, "a replica and a stranger on the twins").await?;
    // A second replica: kube-scheduler's default spread prefers the twin without its sibling, and
    // that twin is the one node gpu-share passes.
    kubectl(
        c,
        &["-n", NS, "scale", "deployment/replicas", "--replicas=2"],
        None,
    )?;
    wait_pods(c, NS, 3, 0).await?;
    let pods = pods_of(c, NS).await?;
    let (second, p) = pods
        .iter()
        .find(|(n, _)| n.as_str() != one && n.as_str() != "stranger")
        .ok_or("no second replica")?;
    ensure(
        node_of(p) == Some(other),
        format!(
            "the second replica {second} went to {:?}, not {other}, where its ReplicaSet has no pod",
            node_of(p)
        ),
    )?;
    let line = wait_for(
        "kube-scheduler's line for the second replica",
        Duration::from_secs(10),
        || async { Ok(bound_line(c, second)) },
    )
    .await?;
    ensure(
        line.contains("feasibleNodes=1"),
        format!("gpu-share passed more than one node for {second}: {line}"),
    )?;
    ledger_is_the_api(c, "the replicas spread over the twins").await?;
    kubectl(
        c,
        &[
            "-n",
            NS,
            "delete",
            "deployment/replicas",
            "pod/stranger",
            "--wait=false",
        ],
        None,
    )?;
    Ok(())
}

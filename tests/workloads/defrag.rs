//! Defragmentation on two plain nodes of two A100s each, one GPU of each held, one of them by a
//! Deployment's pod, and an `exclusive-2` pod waiting, refused by kube-scheduler's own resource
//! check (`Insufficient nvidia.com/gpu`).
//!
//! - Plan mode (`defrag.mode: plan`): the waiting pod is told, in an event, that moving the
//!   Deployment's pod to the other node would make room; nothing moves.
//! - Moving (`defrag.mode: on`): with a PodDisruptionBudget that allows no disruption, the
//!   eviction is refused and the plan unwound, the waiting pod told why and nothing left held;
//!   with one that allows it, the Deployment's pod is evicted through the Eviction API, its
//!   replacement lands on the other node, and the waiting pod binds where room was made. The API
//!   server's audit log shows gpu-share's evictions and no pod deleted by it.
//!
//! - A plan that outlives its extender: on three more nodes, a Deployment's two pods hold one
//!   node's GPUs and an `exclusive-2` pod waits; with `movesAtOnce: 1` and
//!   kube-controller-manager stopped (so no replacement lands), one pod is evicted and the
//!   second waits for its replacement; the extender is then killed. The restarted one finds the
//!   plan written on the waiting pod, holds none of it, and unwinds it in words; nothing is left
//!   held, and once kube-controller-manager is back the waiting pod is placed.
//!
//! The nodes are tainted (`gpu-share.io/test=defrag`, `=defrag-restart`) so that only these
//! points' pods land there.

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
/// Moving, with a cooldown short enough for the point's second plan.
const ON: [(&str, &str); 3] = [
    ("  mode: off\n", "  mode: on\n"),
    ("  namespaces: []\n", "  namespaces: [defrag]\n"),
    ("  cooldownSeconds: 600\n", "  cooldownSeconds: 5\n"),
];
const ON_OFF: [(&str, &str); 3] = [
    ("  mode: on\n", "  mode: off\n"),
    ("  namespaces: [defrag]\n", "  namespaces: []\n"),
    ("  cooldownSeconds: 5\n", "  cooldownSeconds: 600\n"),
];
/// The Deployment the moving point moves.
const SHIFTER: &str = "shifter";
/// The identity gpu-share's extender (and kube-scheduler) act as (tests/cluster/up.sh).
const EXTENDER_USER: &str = "system:serviceaccount:gpu-share:gpu-share-scheduler";

/// A pod template of `class` on the point's nodes (their pool, their taint), on `node` if given.
fn pool_template(class: &str, node: Option<&str>) -> Value {
    in_pool("defrag", class, node)
}

/// A pod template of `class` on the nodes of test pool `pool` (tainted with its name).
fn in_pool(pool: &str, class: &str, node: Option<&str>) -> Value {
    let mut t = template(json!({"gpu-share": class}), node, "Always");
    t["spec"]["nodeSelector"]["gpu-share.io/test-pool"] = json!(pool);
    t["spec"]["tolerations"] =
        json!([{"key": "gpu-share.io/test", "value": pool, "effect": "NoSchedule"}]);
    t
}

/// A bare pod of `class` named `name` on the point's nodes.
fn bare(name: &str, class: &str, node: Option<&str>) -> Value {
    bare_in("defrag", name, class, node)
}

/// A bare pod of `class` named `name` on the nodes of test pool `pool`.
fn bare_in(pool: &str, name: &str, class: &str, node: Option<&str>) -> Value {
    let mut p = in_pool(pool, class, node);
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

/// The Deployment's pod, the node it is on and the other node, once the GPUs are scattered: one
/// free on each node, the Deployment's pod beside one of them.
/// `workload` names the Deployment (each point its own: a moved workload cools down).
async fn scatter(c: &Cluster, workload: &str) -> Result<(String, String, &'static str), String> {
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
        &deployment(workload, 1, pool_template("exclusive-1", None)),
    )?;
    wait_pods(c, NS, 3, 0).await?;
    let pods = pods_of(c, NS).await?;
    let (mover, p) = pods
        .iter()
        .find(|(n, _)| n.starts_with(&format!("{workload}-")))
        .ok_or("no pod of the Deployment")?;
    let from = node_of(p)
        .ok_or("the Deployment's pod has no node")?
        .to_string();
    let to = *NODES.iter().find(|n| **n != from).unwrap();
    let beside = if from == NODES[0] { "held-0" } else { "held-1" };
    kubectl(c, &["-n", NS, "delete", "pod", beside, "--wait=true"], None)?;
    wait_pods(c, NS, 2, 0).await?;
    ledger_is_the_api(c, "one GPU held on each node, one by a Deployment's pod").await?;
    Ok((mover.clone(), from, to))
}

async fn plan_told(c: &Cluster) -> Check {
    let (mover, from, to) = scatter(c, "mover").await?;
    let mover = &mover;
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

pub async fn defrag_moves(c: &Cluster) -> Check {
    namespace(c, NS).await?;
    // The plan point's events name pods of the same names: only this point's are read.
    kubectl(c, &["-n", NS, "delete", "events", "--all"], None)?;
    super::quota::set_policy(c, &ON)?;
    let result = moved(c).await;
    let restored = super::quota::set_policy(c, &ON_OFF);
    let cleaned = kubectl(
        c,
        &[
            "-n",
            NS,
            "delete",
            "deployment,pod,poddisruptionbudget",
            "--all",
            "--wait=false",
        ],
        None,
    );
    result.and(restored).and(cleaned.map(|_| ()))
}

/// The PodDisruptionBudget over the Deployment's pods, once the disruption controller has
/// counted it to allow `allowed` disruptions.
async fn budget(c: &Cluster, spec: Value, allowed: i64) -> Check {
    let pdb = json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": SHIFTER},
        "spec": spec,
    });
    kubectl(
        c,
        &["-n", NS, "delete", "pdb", SHIFTER, "--ignore-not-found"],
        None,
    )?;
    apply(c, NS, &pdb)?;
    wait_for(
        &format!("the budget to allow {allowed} disruption(s)"),
        Duration::from_secs(60),
        || async {
            let out = kubectl(c, &["-n", NS, "get", "pdb", SHIFTER, "-o", "json"], None)?;
            let v: Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
            let counted = v["status"]["observedGeneration"] == v["metadata"]["generation"]
                && v["status"]["expectedPods"].as_i64() == Some(1);
            Ok(
                (counted && v["status"]["disruptionsAllowed"].as_i64() == Some(allowed))
                    .then_some(()),
            )
        },
    )
    .await
}

/// The audit log's entries for pods of the point's namespace: `(verb, subresource, pod, user,
/// response code)`.
type Audited = (String, String, String, String, i64);

fn audited(c: &Cluster) -> Result<Vec<Audited>, String> {
    let text = std::fs::read_to_string(c.dir.join("logs/audit.log"))
        .map_err(|e| format!("the audit log: {e}"))?;
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["objectRef"]["namespace"] == NS && e["stage"] == "ResponseComplete")
        .map(|e| {
            let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (
                s(&e["verb"]),
                s(&e["objectRef"]["subresource"]),
                s(&e["objectRef"]["name"]),
                s(&e["user"]["username"]),
                e["responseStatus"]["code"].as_i64().unwrap_or_default(),
            )
        })
        .collect())
}

async fn moved(c: &Cluster) -> Check {
    let (mover, from, to) = scatter(c, SHIFTER).await?;
    // A budget that allows no disruption: the eviction is refused, the plan unwound.
    budget(
        c,
        json!({"minAvailable": 1, "selector": {"matchLabels": {"app": SHIFTER}}}),
        0,
    )
    .await?;
    apply(c, NS, &bare("big", "exclusive-2", None))?;
    wait_pods(c, NS, 2, 1).await?;
    let gave_up = event_on(c, "big", "GpuShareDefragGaveUp", "was refused").await?;
    ensure(
        gave_up.contains(&format!("the eviction of {NS}/{mover} was refused"))
            && gave_up.contains("its holds are released"),
        format!("the refusal is not said in words: {gave_up}"),
    )?;
    let pods = pods_of(c, NS).await?;
    ensure(
        pods.get(&mover).and_then(node_of) == Some(from.as_str()),
        format!("{mover} left {from} though its budget allowed no disruption"),
    )?;
    // Nothing held is left behind: the ledger is the API (a promise would be a pod it lacks).
    ledger_is_the_api(c, "an eviction refused, the plan unwound").await?;
    let annotated = pods
        .get("big")
        .and_then(|p| p.metadata.annotations.as_ref())
        .is_some_and(|a| a.contains_key("gpu-share.io/defrag-plan"));
    ensure(
        !annotated,
        "the unwound plan's annotation is still on the waiting pod",
    )?;

    // A budget that allows one disruption: a new waiting pod (weighed at once) has room made.
    kubectl(c, &["-n", NS, "delete", "pod", "big", "--wait=true"], None)?;
    budget(
        c,
        json!({"maxUnavailable": 1, "selector": {"matchLabels": {"app": SHIFTER}}}),
        1,
    )
    .await?;
    // Past the workload's cooldown (5 s) from the refusal.
    tokio::time::sleep(Duration::from_secs(6)).await;
    apply(c, NS, &bare("big-2", "exclusive-2", None))?;
    let done = event_on(c, "big-2", "GpuShareDefragDone", "placed on node").await?;
    ensure(
        done.contains(&format!("placed on node {from} after 1 move(s)")),
        format!("the waiting pod was not placed where room was made: {done}"),
    )?;
    let pods = pods_of(c, NS).await?;
    ensure(
        pods.get("big-2").and_then(node_of) == Some(from.as_str()),
        format!("big-2 is not on {from}"),
    )?;
    ensure(!pods.contains_key(&mover), format!("{mover} was not moved"))?;
    let replacement = pods
        .iter()
        .find(|(n, _)| n.starts_with(&format!("{SHIFTER}-")))
        .ok_or("the Deployment made no replacement")?;
    ensure(
        node_of(replacement.1) == Some(to),
        format!(
            "the replacement {} is not on {to}, where its room was held",
            replacement.0
        ),
    )?;
    let moved_event = event_on(c, &mover, "GpuShareDefragMoved", "evicted to make room").await?;
    ensure(
        moved_event.contains(&format!("for {NS}/big-2 on node {from}")),
        format!("the moved pod's event: {moved_event}"),
    )?;
    // The audit log: gpu-share evicted the pod through the Eviction API, refused (429) while
    // the budget allowed no disruption and done (201) once, and deleted no pod of the namespace.
    let log = audited(c)?;
    let ours: Vec<_> = log.iter().filter(|e| e.3 == EXTENDER_USER).collect();
    let evictions = |code: i64| {
        ours.iter()
            .filter(|e| e.0 == "create" && e.1 == "eviction" && e.2 == mover && e.4 == code)
            .count()
    };
    ensure(
        evictions(429) >= 1 && evictions(201) == 1,
        format!(
            "the audit log's evictions of {mover} by {EXTENDER_USER}: {} refused, {} done (expected at least 1 and exactly 1): {ours:?}",
            evictions(429),
            evictions(201)
        ),
    )?;
    let deletes: Vec<_> = ours.iter().filter(|e| e.0.starts_with("delete")).collect();
    ensure(
        deletes.is_empty(),
        format!("gpu-share deleted pods: {deletes:?}"),
    )?;
    ledger_is_the_api(c, "a pod moved, the waiting pod placed").await
}

/// The restart point's namespace, pool and nodes, and its Deployment.
const RESTART_NS: &str = "defrag-restart";
const RESTART_POOL: &str = "defrag-restart";
const RESTART_NODES: [&str; 3] = ["restart-a", "restart-b", "restart-c"];
const STEADY: &str = "steady";
/// Moving, one move under way at a time.
const ON_ONE_AT_ONCE: [(&str, &str); 4] = [
    ("  mode: off\n", "  mode: on\n"),
    ("  namespaces: []\n", "  namespaces: [defrag-restart]\n"),
    ("  cooldownSeconds: 600\n", "  cooldownSeconds: 5\n"),
    ("  movesAtOnce: 4\n", "  movesAtOnce: 1\n"),
];
const ON_ONE_AT_ONCE_OFF: [(&str, &str); 4] = [
    ("  mode: on\n", "  mode: off\n"),
    ("  namespaces: [defrag-restart]\n", "  namespaces: []\n"),
    ("  cooldownSeconds: 5\n", "  cooldownSeconds: 600\n"),
    ("  movesAtOnce: 1\n", "  movesAtOnce: 4\n"),
];

pub async fn defrag_restart(c: &Cluster) -> Check {
    c.namespace(RESTART_NS, json!({})).await?;
    super::quota::set_policy(c, &ON_ONE_AT_ONCE)?;
    let result = outlived(c).await;
    // kube-controller-manager runs again whatever happened (a second start of a running one
    // only fails to take its port, and exits).
    if !c.started("kube-controller-manager") {
        c.start_process("kube-controller-manager");
    }
    let restored = super::quota::set_policy(c, &ON_ONE_AT_ONCE_OFF);
    let cleaned = kubectl(
        c,
        &[
            "-n",
            RESTART_NS,
            "delete",
            "deployment,pod",
            "--all",
            "--wait=false",
        ],
        None,
    );
    result.and(restored).and(cleaned.map(|_| ()))
}

/// The events of `reason` on pod `name` in the restart point's namespace that say `words`,
/// within 90 s.
async fn restart_event(
    c: &Cluster,
    name: &str,
    reason: &str,
    words: &str,
) -> Result<String, String> {
    let events: Api<Event> = Api::namespaced(c.client.clone(), RESTART_NS);
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

async fn outlived(c: &Cluster) -> Check {
    let [a, b, cc] = RESTART_NODES;
    let ns = RESTART_NS;
    // One GPU of b and c held by bare pods, their other GPU filled for now: the Deployment's two
    // pods can only take a's.
    for (name, node) in [("held-b", b), ("held-c", cc), ("fill-b", b), ("fill-c", cc)] {
        apply(
            c,
            ns,
            &bare_in(RESTART_POOL, name, "exclusive-1", Some(node)),
        )?;
    }
    wait_pods(c, ns, 4, 0).await?;
    apply(
        c,
        ns,
        &deployment(STEADY, 2, in_pool(RESTART_POOL, "exclusive-1", None)),
    )?;
    wait_pods(c, ns, 6, 0).await?;
    for fill in ["fill-b", "fill-c"] {
        kubectl(c, &["-n", ns, "delete", "pod", fill, "--wait=true"], None)?;
    }
    wait_pods(c, ns, 4, 0).await?;
    let steady = |pods: &BTreeMap<String, Pod>| -> Vec<(String, Option<String>)> {
        pods.iter()
            .filter(|(n, p)| n.starts_with(&format!("{STEADY}-")) && live(p))
            .map(|(n, p)| (n.clone(), node_of(p).map(String::from)))
            .collect()
    };
    let on_a = steady(&pods_of(c, ns).await?);
    ensure(
        on_a.len() == 2 && on_a.iter().all(|(_, n)| n.as_deref() == Some(a)),
        format!("the Deployment's pods are not both on {a}: {on_a:?}"),
    )?;
    ledger_is_the_api(c, "two GPUs free, on b and c").await?;

    // No replacement will land while kube-controller-manager is stopped.
    c.stop("kube-controller-manager");
    apply(c, ns, &bare_in(RESTART_POOL, "big", "exclusive-2", None))?;
    let moving = restart_event(c, "big", "GpuShareDefragMoving", "makes room on node").await?;
    ensure(
        moving.contains(&format!("makes room on node {a}")),
        format!("the plan does not make room on {a}: {moving}"),
    )?;
    // One pod evicted; the second stays while the first one's replacement has not landed
    // (two of the controller's ticks, 10 s apart, pass).
    wait_for(
        "one of the Deployment's pods evicted",
        Duration::from_secs(60),
        || async { Ok((steady(&pods_of(c, ns).await?).len() == 1).then_some(())) },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(25)).await;
    let pods = pods_of(c, ns).await?;
    let left = steady(&pods);
    ensure(
        left.len() == 1 && left[0].1.as_deref() == Some(a),
        format!("with one move allowed under way and none landed, a second pod moved: {left:?}"),
    )?;
    let carries = |pods: &BTreeMap<String, Pod>| {
        pods.get("big")
            .and_then(|p| p.metadata.annotations.as_ref())
            .is_some_and(|a| a.contains_key("gpu-share.io/defrag-plan"))
    };
    ensure(
        carries(&pods) && pods.get("big").is_some_and(|p| node_of(p).is_none()),
        "the waiting pod does not carry its plan, or was bound",
    )?;

    // The extender dies in the middle of the plan; the restarted one unwinds it.
    c.kill("extender");
    c.start_process_with(
        "extender",
        &[("GPU_SHARE_RESERVATION_IMAGE", "gpu-share:test")],
    );
    c.wait_ready("EXTENDER_ADMIN", Duration::from_secs(60))
        .await?;
    let gave_up = restart_event(c, "big", "GpuShareDefragGaveUp", "no longer holds it").await?;
    ensure(
        gave_up.contains(&format!("to make room on node {a}")),
        format!("the unwound plan is not named: {gave_up}"),
    )?;
    wait_for(
        "the plan's annotation off the waiting pod",
        Duration::from_secs(30),
        || async { Ok((!carries(&pods_of(c, ns).await?)).then_some(())) },
    )
    .await?;
    // Nothing held is left behind: the ledger is the API (a promise would be a pod it lacks).
    ledger_is_the_api(c, "a plan outlived its extender and was unwound").await?;

    // kube-controller-manager back: the replacement is made, and the waiting pod is placed
    // (as things stand, or by a new plan).
    c.start_process("kube-controller-manager");
    wait_pods_within(c, ns, 5, 0, Duration::from_secs(180)).await?;
    ledger_is_the_api(c, "the waiting pod placed after the restart").await
}

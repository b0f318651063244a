//! The extender through its HTTP routes, with Go-shaped fixtures (tests/fixtures/extender, made by
//! make_fixtures.py) and the example nodes file: both node-cache modes, every verb, reasons,
//! readiness gating and concurrent binds.

mod common;

use std::sync::Arc;

use common::{fixture, post};
use gpu_share::cli::Role;
use gpu_share::extender::state::{ExtenderState, Mode};
use gpu_share::extender::tie_break::tie_order;
use gpu_share::policy::{Candidates, PackingPolicyName, Policy};
use gpu_share::server::{AppState, parse_nodes};
use serde_json::{Value, json};

fn nodes_yaml() -> String {
    std::fs::read_to_string(format!(
        "{}/tests/fixtures/extender/nodes.yaml",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

/// A `--dev` service with the example nodes loaded (as `--nodes` does), whose filter names every
/// fitting node and every other node's reason (`packing.candidates: all`), as these tests read.
fn state() -> AppState {
    state_with(every_fit())
}

/// The default policy with `packing.candidates: all`: filter names every fitting node and every
/// other node's reason, for the tests that read reasons beside a fitting node.
fn every_fit() -> Policy {
    let mut policy = Policy::default_policy();
    policy.packing.candidates = Candidates::All;
    policy
}

/// The same with a given policy.
fn state_with(policy: Policy) -> AppState {
    let state = AppState::dev(Role::All, policy);
    let nodes = parse_nodes(&nodes_yaml()).unwrap();
    let gpu = state
        .extender
        .as_ref()
        .unwrap()
        .learn_nodes(&nodes, &"nvidia.com/gpu".into());
    assert_eq!(gpu, 4);
    state
}

fn body(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

fn names(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn filter_in_node_names_mode_answers_with_node_names_and_reasons() {
    let s = state();
    let (status, r) = post(
        s,
        "/scheduler/filter",
        body(&fixture("extender/filter-names-mps.json")),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(r["Error"], "");
    assert_eq!(
        r["Nodes"],
        Value::Null,
        "NodeNames mode answers NodeNames only"
    );
    assert_eq!(names(&r["NodeNames"]), vec!["h100-mps"]);
    let un = &r["FailedAndUnresolvableNodes"];
    assert_eq!(
        un["h100-ts"],
        "node shares GPUs by time-slicing; pod asks MPS"
    );
    assert_eq!(un["l40s-plain"], "node does not share GPUs; pod asks MPS");
    assert_eq!(un["a100-mig"], "node does not share GPUs; pod asks MPS");
    assert_eq!(un["cpu-1"], "node has no NVIDIA GPUs");
    assert_eq!(r["FailedNodes"], json!({}));
}

/// A second time-slicing node like h100-ts (`h100-ts-b`), with the given taints.
fn twin_tainted(s: AppState, taints: Value) -> AppState {
    let mut nodes = parse_nodes(&nodes_yaml()).unwrap();
    nodes.retain(|n| n.metadata.name.as_deref() == Some("h100-ts"));
    nodes[0].metadata.name = Some("h100-ts-b".into());
    nodes[0].spec.get_or_insert_default().taints = serde_json::from_value(taints).unwrap();
    let learned = s
        .extender
        .as_ref()
        .unwrap()
        .learn_nodes(&nodes, &"nvidia.com/gpu".into());
    assert_eq!(learned, 1);
    s
}

/// `packing.candidates: best`: once a node fits, filter names only the fitting nodes of the best
/// packing score and no reasons; when none fits, every node with its reason, as `all`.
#[tokio::test]
async fn filter_passes_the_best_tier_and_names_reasons_only_when_nothing_fits() {
    // binpack: a node that already holds a share ranks above an empty one (gpu-share's measure
    // finds both leave nothing unusable for a mix of timeslice-25 pods alone).
    let best = || {
        let mut p = Policy::default_policy();
        p.packing.policy = PackingPolicyName::Binpack;
        p.packing.candidates = Candidates::Best;
        state_with(p)
    };
    let twin = |s: AppState| twin_tainted(s, json!([]));
    let (status, r) = post(
        best(),
        "/scheduler/filter",
        body(&fixture("extender/filter-names-mps.json")),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(names(&r["NodeNames"]), vec!["h100-mps"]);
    assert_eq!(r["FailedNodes"], json!({}));
    assert_eq!(r["FailedAndUnresolvableNodes"], json!({}));

    // Two nodes fit a timeslice pod; one already holds a share, so binpack ranks it best.
    let s = twin(best());
    let nodes = json!(["h100-ts", "h100-ts-b", "cpu-1"]);
    let ask = |uid: &str| json!({"Pod": ts_pod(uid, 25), "NodeNames": nodes.clone()});
    let (_, all_fit) = post(s.clone(), "/scheduler/filter", body(&ask("tier-0"))).await;
    let mut both = names(&all_fit["NodeNames"]);
    both.sort();
    assert_eq!(
        both,
        vec!["h100-ts", "h100-ts-b"],
        "empty alike nodes are one tier: {all_fit}"
    );
    assert_eq!(
        filter_and_bind(&s, &ts_pod("tier-0", 25), "h100-ts-b").await,
        ""
    );
    let (_, r) = post(s.clone(), "/scheduler/filter", body(&ask("tier-1"))).await;
    assert_eq!(names(&r["NodeNames"]), vec!["h100-ts-b"], "{r}");
    assert_eq!(r["FailedAndUnresolvableNodes"], json!({}), "{r}");
    // The same pod under `all`: both fitting nodes, and the CPU node's reason.
    let (_, r) = post(twin(state()), "/scheduler/filter", body(&ask("tier-1"))).await;
    let mut both = names(&r["NodeNames"]);
    both.sort();
    assert_eq!(both, vec!["h100-ts", "h100-ts-b"]);
    assert_eq!(
        r["FailedAndUnresolvableNodes"]["cpu-1"],
        "node has no NVIDIA GPUs"
    );

    // Nothing fits: every node with its reason.
    let (_, r) = post(
        best(),
        "/scheduler/filter",
        body(&json!({"Pod": mig_pod("tier-2", "7g.80gb", 0), "NodeNames": ["h100-ts", "cpu-1"]})),
    )
    .await;
    assert_eq!(r["NodeNames"], json!([]), "{r}");
    let un = &r["FailedAndUnresolvableNodes"];
    assert_eq!(un["cpu-1"], "node has no NVIDIA GPUs", "{r}");
    assert!(un["h100-ts"].is_string(), "{r}");
}

/// The default `packing.candidates: one`: of equally well packed nodes, the first in the fixed
/// order of names alone, unless the pod prefers something kube-scheduler's scores weigh, or the
/// tied nodes differ in their PreferNoSchedule taints; then the whole tier, as `best`.
#[tokio::test]
async fn filter_passes_one_node_of_a_tie_unless_kube_schedulers_scores_would_choose() {
    assert_eq!(Policy::default_policy().packing.candidates, Candidates::One);
    let twins = |taints: Value| twin_tainted(state_with(Policy::default_policy()), taints);
    let nodes = json!(["h100-ts", "h100-ts-b", "cpu-1"]);
    let first = ["h100-ts", "h100-ts-b"]
        .into_iter()
        .min_by_key(|n| tie_order(n))
        .unwrap();
    let filter = |s: AppState, pod: Value| {
        let nodes = nodes.clone();
        async move {
            let (status, r) = post(
                s,
                "/scheduler/filter",
                body(&json!({"Pod": pod, "NodeNames": nodes})),
            )
            .await;
            assert_eq!(status, 200);
            assert_eq!(r["FailedAndUnresolvableNodes"], json!({}), "{r}");
            let mut passed = names(&r["NodeNames"]);
            passed.sort();
            passed
        }
    };
    // Two empty alike nodes tie: the first of them in the fixed order.
    assert_eq!(
        filter(twins(json!([])), bare_ts_pod("one-0", 25)).await,
        vec![first]
    );
    // The same pod asked again gets the same node.
    let s = twins(json!([]));
    assert_eq!(
        filter(s.clone(), bare_ts_pod("one-1", 25)).await,
        vec![first]
    );
    assert_eq!(filter(s, bare_ts_pod("one-1", 25)).await, vec![first]);

    let both = vec!["h100-ts".to_string(), "h100-ts-b".to_string()];
    // A preference kube-scheduler weighs: the whole tier.
    let mut preferring = bare_ts_pod("one-2", 25);
    preferring["spec"]["affinity"] = json!({"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 10, "preference":
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}]}});
    assert_eq!(filter(twins(json!([])), preferring).await, both);
    // A Deployment's pod (the fixture's is its ReplicaSet's): kube-scheduler's default spread
    // weighs it, and filter ranks the tie as that spread scores it. With no sibling anywhere,
    // the twins rank alike: the first in the fixed order.
    let replica = ts_pod("one-3", 25);
    assert_eq!(
        replica["metadata"]["ownerReferences"][0]["kind"],
        "ReplicaSet"
    );
    assert_eq!(filter(twins(json!([])), replica).await, vec![first]);
    // A sibling on the first twin and a stranger of the same size on the other: packed alike,
    // so they still tie, and the default spread puts the next replica where it has none.
    let s = twins(json!([]));
    let other = if first == "h100-ts" {
        "h100-ts-b"
    } else {
        "h100-ts"
    };
    assert_eq!(filter_and_bind(&s, &ts_pod("sibling", 25), first).await, "");
    assert_eq!(
        filter_and_bind(&s, &bare_ts_pod("stranger", 25), other).await,
        ""
    );
    assert_eq!(filter(s.clone(), ts_pod("one-6", 25)).await, vec![other]);
    // A pod of another ReplicaSet has no sibling on either: the first again.
    let mut cousin = ts_pod("one-7", 25);
    cousin["metadata"]["ownerReferences"][0]["uid"] = json!("another-replicaset");
    assert_eq!(filter(s, cousin).await, vec![first]);
    // One twin tainted PreferNoSchedule: TaintToleration tells them apart, so both go on.
    let soft = json!([{"key": "spot", "value": "true", "effect": "PreferNoSchedule"}]);
    assert_eq!(
        filter(twins(soft.clone()), bare_ts_pod("one-4", 25)).await,
        both
    );
    // A NoSchedule taint is the in-tree filter's business (it ran before filter): one node.
    let hard = json!([{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]);
    assert_eq!(
        filter(twins(hard), bare_ts_pod("one-5", 25)).await,
        vec![first]
    );
}

#[tokio::test]
async fn filter_in_full_nodes_mode_echoes_the_node_objects() {
    let s = state();
    let req = fixture("extender/filter-nodes-timeslice.json");
    let (status, r) = post(s, "/scheduler/filter", body(&req)).await;
    assert_eq!(status, 200);
    assert_eq!(r["NodeNames"], Value::Null, "Nodes mode answers Nodes only");
    let items = r["Nodes"]["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    let sent = req["Nodes"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["metadata"]["name"] == "h100-ts")
        .unwrap();
    assert_eq!(&items[0], sent, "the node object comes back unchanged");
    assert_eq!(
        r["FailedAndUnresolvableNodes"]["h100-mps"],
        "node shares GPUs by MPS; pod asks time-slicing"
    );
}

#[tokio::test]
async fn mps_request_larger_than_replicas_is_unresolvable_in_words() {
    let s = state();
    let (_, r) = post(
        s,
        "/scheduler/filter",
        body(&fixture("extender/filter-names-mps50.json")),
    )
    .await;
    assert_eq!(names(&r["NodeNames"]), Vec::<String>::new());
    assert_eq!(
        r["FailedAndUnresolvableNodes"]["h100-mps"],
        "MPS replicas on this node are smaller than the request"
    );
}

#[tokio::test]
async fn lower_case_field_names_are_accepted() {
    let s = state();
    let mut req = fixture("extender/filter-names-mps.json");
    let obj = req.as_object_mut().unwrap();
    let pod = obj.remove("Pod").unwrap();
    let names_v = obj.remove("NodeNames").unwrap();
    let r = json!({"pod": pod, "nodes": null, "nodenames": names_v});
    let (status, r) = post(s, "/scheduler/filter", body(&r)).await;
    assert_eq!(status, 200);
    assert_eq!(names(&r["NodeNames"]), vec!["h100-mps"]);
}

#[tokio::test]
async fn prioritize_scores_every_node_within_0_to_10() {
    let s = state();
    let (status, r) = post(
        s,
        "/scheduler/prioritize",
        body(&fixture("extender/prioritize-names-mig.json")),
    )
    .await;
    assert_eq!(status, 200);
    let list = r.as_array().expect("a top-level array");
    assert_eq!(list.len(), 5);
    for e in list {
        let score = e["Score"].as_i64().unwrap();
        assert!((0..=10).contains(&score));
        let expected = if e["Host"] == "a100-mig" { 10 } else { 0 };
        assert_eq!(score, expected, "{e}");
    }
}

/// Filter (to cache the pod), then bind; returns the bind reply's Error.
async fn filter_and_bind(s: &AppState, pod: &Value, node: &str) -> String {
    let (_, _) = post(
        s.clone(),
        "/scheduler/filter",
        body(&json!({"Pod": pod, "Nodes": null, "NodeNames": [node]})),
    )
    .await;
    let (status, r) = post(
        s.clone(),
        "/scheduler/bind",
        body(&json!({
            "PodName": pod["metadata"]["name"],
            "PodNamespace": pod["metadata"]["namespace"],
            "PodUID": pod["metadata"]["uid"],
            "Node": node,
        })),
    )
    .await;
    assert_eq!(status, 200);
    r["Error"].as_str().unwrap().to_string()
}

fn mig_pod(uid: &str, profile: &str, priority: i32) -> Value {
    let mut p = fixture("extender/prioritize-names-mig.json")["Pod"].clone();
    p["metadata"]["uid"] = json!(uid);
    p["metadata"]["name"] = json!(format!("pod-{uid}"));
    p["metadata"]["annotations"]["gpu-share.io/request"] = json!(format!("mig-{profile}"));
    // The limits the webhook writes for the profile (the extender checks the two agree).
    let units = json!({format!("nvidia.com/mig-{profile}"): "1"});
    p["spec"]["containers"][0]["resources"] = json!({"limits": units, "requests": units});
    p["spec"]["priority"] = json!(priority);
    p
}

/// A timeslice pod of no controller (the fixture's belongs to a ReplicaSet).
fn bare_ts_pod(uid: &str, percent: u32) -> Value {
    let mut p = ts_pod(uid, percent);
    p["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("ownerReferences");
    p
}

fn ts_pod(uid: &str, percent: u32) -> Value {
    let mut p = fixture("extender/filter-nodes-timeslice.json")["Pod"].clone();
    p["metadata"]["uid"] = json!(uid);
    p["metadata"]["name"] = json!(format!("pod-{uid}"));
    p["metadata"]["annotations"]["gpu-share.io/request"] = json!(format!("timeslice-{percent}"));
    p
}

#[tokio::test]
async fn bind_records_then_a_full_profile_fails_resolvably() {
    let s = state();
    let bind = fixture("extender/bind.json");
    // Bind before the pod was seen: refused in words, never a guess.
    let (_, r) = post(s.clone(), "/scheduler/bind", body(&bind)).await;
    assert!(
        r["Error"].as_str().unwrap().contains("not seen in filter"),
        "{r}"
    );
    for i in 0..8 {
        assert_eq!(
            filter_and_bind(&s, &mig_pod(&format!("m{i}"), "3g.40gb", 0), "a100-mig").await,
            ""
        );
    }
    let err = filter_and_bind(&s, &mig_pod("m8", "3g.40gb", 0), "a100-mig").await;
    assert!(
        err.contains("no free MIG device of the requested profile"),
        "{err}"
    );
    let (_, r) = post(
        s.clone(),
        "/scheduler/filter",
        body(&fixture("extender/prioritize-names-mig.json")),
    )
    .await;
    assert_eq!(
        r["FailedNodes"]["a100-mig"],
        "no free MIG device of the requested profile"
    );
    // /v1/nodes shows the occupancy.
    let resp = tower::ServiceExt::oneshot(
        gpu_share::server::router(s.clone()),
        http::Request::get("/v1/nodes")
            .body(axum::body::Body::empty())
            .unwrap(),
    )
    .await
    .unwrap();
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    let nodes: Vec<gpu_share::extender::report::NodeReport> =
        serde_json::from_slice(&bytes).unwrap();
    let a100 = nodes.iter().find(|n| n.name == "a100-mig").unwrap();
    assert_eq!(a100.mig["3g.40gb"], "8/8");
    assert_eq!(a100.pods.len(), 8);
    assert_eq!(a100.pods[0].class, "mig-3g.40gb");
}

#[tokio::test]
async fn preempt_keeps_only_victims_of_the_pods_class() {
    let s = state();
    assert_eq!(
        filter_and_bind(&s, &mig_pod("victim-1g-a", "1g.10gb", 0), "a100-mig").await,
        ""
    );
    assert_eq!(
        filter_and_bind(&s, &mig_pod("victim-3g-a", "3g.40gb", 0), "a100-mig").await,
        ""
    );
    for i in 0..7 {
        assert_eq!(
            filter_and_bind(&s, &mig_pod(&format!("hi{i}"), "3g.40gb", 2000), "a100-mig").await,
            ""
        );
    }
    let (status, r) = post(
        s.clone(),
        "/scheduler/preempt",
        body(&fixture("extender/preempt-meta.json")),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        r,
        json!({"NodeNameToMetaVictims": {"a100-mig": {"Pods": [{"UID": "victim-3g-a"}], "NumPDBViolations": 0}}}),
        "the 1g victim does not make room for a 3g pod; h100-ts holds nothing of the class"
    );
    // The full-object form gets the Meta form back (another preemptor).
    let mut full = fixture("extender/preempt-full.json");
    full["Pod"]["metadata"]["uid"] = json!("e2e2e2e2-2222-4333-8444-555555555555");
    let (status, r) = post(s.clone(), "/scheduler/preempt", body(&full)).await;
    assert_eq!(status, 200);
    assert_eq!(
        r["NodeNameToMetaVictims"]["a100-mig"]["Pods"],
        json!([{"UID": "victim-3g-a"}])
    );
    // kube-scheduler deletes victims asynchronously and may ask again for the same pod before
    // the pod watch has shown the deletion: no further victims while the first are leaving.
    let (status, r) = post(
        s.clone(),
        "/scheduler/preempt",
        body(&fixture("extender/preempt-meta.json")),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        r,
        json!({"NodeNameToMetaVictims": {}}),
        "victims still leaving"
    );
    let ext = s.extender.as_ref().unwrap();
    assert!(
        ext.ledger()
            .victims_leaving("e1e1e1e1-2222-4333-8444-555555555555")
    );
    ext.release("victim-3g-a");
    assert!(
        !ext.ledger()
            .victims_leaving("e1e1e1e1-2222-4333-8444-555555555555")
    );
    // The ledger has seen the victim go, and kube-scheduler (whose cache saw it first, so that
    // its retry found no room here) asks again: the room is made, so no second victim.
    let (_, r) = post(
        s.clone(),
        "/scheduler/preempt",
        body(&fixture("extender/preempt-meta.json")),
    )
    .await;
    assert_eq!(r, json!({"NodeNameToMetaVictims": {}}), "room already made");
    // Once another pod has taken that room, a new preemption is a real one.
    assert_eq!(
        filter_and_bind(&s, &mig_pod("victim-3g-b", "3g.40gb", 0), "a100-mig").await,
        ""
    );
    let mut again = fixture("extender/preempt-meta.json");
    again["NodeNameToMetaVictims"]["a100-mig"]["Pods"] = json!([{"UID": "victim-3g-b"}]);
    let (_, r) = post(s.clone(), "/scheduler/preempt", body(&again)).await;
    assert_eq!(
        r["NodeNameToMetaVictims"]["a100-mig"]["Pods"],
        json!([{"UID": "victim-3g-b"}]),
        "{r}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_binds_to_one_node_never_overcommit() {
    let s = state();
    // h100-ts: 8 GPUs x 4 replicas; 30% each: the budget (8 GPUs) would allow 26, but a share
    // runs on one GPU and three fit each: 24.
    let pods: Vec<Value> = (0..64).map(|i| ts_pod(&format!("c{i}"), 30)).collect();
    for p in &pods {
        let (_, r) = post(
            s.clone(),
            "/scheduler/filter",
            body(&json!({"Pod": p, "Nodes": null, "NodeNames": ["h100-ts"]})),
        )
        .await;
        assert_eq!(names(&r["NodeNames"]), vec!["h100-ts"]);
    }
    let mut tasks = Vec::new();
    for p in pods {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let (_, r) = post(
                s,
                "/scheduler/bind",
                body(
                    &json!({"PodName": p["metadata"]["name"], "PodNamespace": "ml",
                             "PodUID": p["metadata"]["uid"], "Node": "h100-ts"}),
                ),
            )
            .await;
            r["Error"].as_str().unwrap().to_string()
        }));
    }
    let mut ok = 0;
    for t in tasks {
        let e = t.await.unwrap();
        if e.is_empty() {
            ok += 1;
        } else {
            assert!(e.contains("no single GPU has enough free share"), "{e}");
        }
    }
    assert_eq!(ok, 24);
    let ext = s.extender.as_ref().unwrap();
    let usage = ext
        .ledger()
        .with_node("h100-ts", |nl| nl.usage.clone())
        .unwrap();
    assert_eq!(usage.budget_milli, 7200);
    assert_eq!(usage.slots, 24);
    assert_eq!(usage.gpu_milli, vec![900; 8]);
}

#[tokio::test]
async fn bad_bodies_get_400_with_a_json_error() {
    let s = state();
    for path in [
        "/scheduler/filter",
        "/scheduler/prioritize",
        "/scheduler/bind",
        "/scheduler/preempt",
    ] {
        let (status, r) = post(s.clone(), path, b"not json".to_vec()).await;
        assert_eq!(status, 400, "{path}");
        assert!(r["error"].as_str().unwrap().contains("not JSON"), "{r}");
    }
    let (status, r) = post(s, "/scheduler/filter", br#"{"Pod": 3}"#.to_vec()).await;
    assert_eq!(status, 400);
    assert!(r["error"].as_str().unwrap().contains("ExtenderArgs"));
}

#[tokio::test]
async fn every_verb_refuses_until_the_caches_have_synced() {
    let mut st = AppState::dev(Role::Extender, Policy::default_policy());
    st.extender = Some(Arc::new(ExtenderState::new(
        Mode::Cluster,
        std::time::Duration::from_secs(60),
    )));
    let s = st;
    let (_, r) = post(
        s.clone(),
        "/scheduler/filter",
        body(&fixture("extender/filter-names-mps.json")),
    )
    .await;
    assert!(r["Error"].as_str().unwrap().contains("not synced"), "{r}");
    let (_, r) = post(
        s.clone(),
        "/scheduler/bind",
        body(&fixture("extender/bind.json")),
    )
    .await;
    assert!(r["Error"].as_str().unwrap().contains("not synced"), "{r}");
    let (status, _) = post(
        s.clone(),
        "/scheduler/prioritize",
        body(&fixture("extender/prioritize-names-mig.json")),
    )
    .await;
    assert_eq!(status, 503);
    let (status, _) = post(
        s,
        "/scheduler/preempt",
        body(&fixture("extender/preempt-meta.json")),
    )
    .await;
    assert_eq!(status, 503);
}

#[tokio::test]
async fn pods_without_gpu_demand_pass_every_node() {
    let s = state();
    let mut pod = fixture("extender/filter-names-mps.json")["Pod"].clone();
    pod["metadata"]["annotations"] = json!({});
    pod["spec"]["containers"][0]["resources"] = json!({});
    let (_, r) = post(
        s,
        "/scheduler/filter",
        body(&json!({"Pod": pod, "Nodes": null, "NodeNames": ["cpu-1", "h100-ts"]})),
    )
    .await;
    assert_eq!(names(&r["NodeNames"]), vec!["cpu-1", "h100-ts"]);
}

/// gpu-share's policy reads the pods' CPU requests: a node whose CPU a running pod has mostly
/// taken cannot feed its free GPUs, so the next pod scores higher where the CPU is.
#[tokio::test]
async fn prioritize_prefers_the_node_with_cpu_for_its_free_gpus() {
    let node = |name: &str| {
        json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-SHARED",
                "nvidia.com/gpu.count": "8",
                "nvidia.com/gpu.memory": "81559",
                "nvidia.com/gpu.replicas": "4",
                "nvidia.com/gpu.sharing-strategy": "time-slicing"}},
            "status": {"allocatable": {"cpu": "96", "memory": "1024Gi", "pods": "110",
                                       "nvidia.com/gpu": "32"}}
        })
    };
    let list =
        json!({"apiVersion": "v1", "kind": "NodeList", "items": [node("ts-a"), node("ts-b")]});
    let state = AppState::dev(Role::All, every_fit());
    let nodes = parse_nodes(&serde_json::to_string(&list).unwrap()).unwrap();
    assert_eq!(
        state
            .extender
            .as_ref()
            .unwrap()
            .learn_nodes(&nodes, &"nvidia.com/gpu".into()),
        2
    );
    let s = state;
    let with_cpu = |uid: &str, cpu: &str| {
        let mut p = ts_pod(uid, 50);
        p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = json!(cpu);
        p
    };
    // An 80-CPU pod takes half a GPU and most of ts-a's CPU.
    assert_eq!(
        filter_and_bind(&s, &with_cpu("big", "80"), "ts-a").await,
        ""
    );
    let small = with_cpu("small", "10");
    let hosts = json!(["ts-a", "ts-b"]);
    let (_, f) = post(
        s.clone(),
        "/scheduler/filter",
        body(&json!({"Pod": small, "Nodes": null, "NodeNames": hosts})),
    )
    .await;
    assert_eq!(names(&f["NodeNames"]), vec!["ts-a", "ts-b"], "{f}");
    let (status, r) = post(
        s,
        "/scheduler/prioritize",
        body(&json!({"Pod": small, "Nodes": null, "NodeNames": hosts})),
    )
    .await;
    assert_eq!(status, 200);
    let score = |host: &str| {
        r.as_array()
            .unwrap()
            .iter()
            .find(|e| e["Host"] == host)
            .and_then(|e| e["Score"].as_i64())
            .unwrap()
    };
    // ts-a has a half-free GPU the pod would fill, but 16 CPUs for 7.5 free GPUs; ts-b has the
    // CPU for all of its GPUs.
    assert!(score("ts-b") > score("ts-a"), "{r}");
}

/// The extender over nodes as GKE, EKS and AKS present them (tests/fixtures/extender/
/// platform-nodes.yaml): each class passes exactly the nodes that can hold it, and the others
/// say why in words.
#[tokio::test]
async fn platform_nodes_take_the_classes_they_can_hold() {
    let state = AppState::dev(Role::All, every_fit());
    let text = std::fs::read_to_string(format!(
        "{}/tests/fixtures/extender/platform-nodes.yaml",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let nodes = parse_nodes(&text).unwrap();
    let gpu = state
        .extender
        .as_ref()
        .unwrap()
        .learn_nodes(&nodes, &"nvidia.com/gpu".into());
    assert_eq!(gpu, 5);
    let s = state;
    let all = [
        "gke-l4-ts",
        "gke-h100-mps",
        "gke-a100-mig",
        "eks-g5",
        "aks-a100-mig",
    ];
    let cases: [(&str, &[&str]); 5] = [
        ("timeslice-25", &["gke-l4-ts"]),
        ("mps-33", &["gke-h100-mps"]),
        ("exclusive-2", &["eks-g5"]),
        // Under the default (mixed) strategy the pod asks for nvidia.com/mig-1g.5gb, which
        // GKE's partitioned node does not advertise (it advertises nvidia.com/gpu).
        ("mig-1g.5gb", &["aks-a100-mig"]),
        ("exclusive-8", &[]),
    ];
    for (i, (class, want)) in cases.iter().enumerate() {
        let mut pod = ts_pod(&format!("platform-{i}"), 25);
        pod["metadata"]["annotations"]["gpu-share.io/request"] = json!(class);
        // The limits the webhook writes for the class (the extender checks the two agree).
        let request = gpu_share::request::GpuRequest::parse_normalized(class).unwrap();
        let (resource, n) = Policy::default_policy().resource_for(&request);
        let units = json!({resource: n.to_string()});
        pod["spec"]["containers"][0]["resources"] = json!({"limits": units, "requests": units});
        let (status, r) = post(
            s.clone(),
            "/scheduler/filter",
            body(&json!({"Pod": pod, "Nodes": null, "NodeNames": all})),
        )
        .await;
        assert_eq!(status, 200, "{class}: {r}");
        let mut got = names(&r["NodeNames"]);
        got.sort();
        let mut want: Vec<String> = want.iter().map(|n| n.to_string()).collect();
        want.sort();
        assert_eq!(got, want, "{class}: {r}");
        let failed = r["FailedNodes"]
            .as_object()
            .into_iter()
            .flatten()
            .chain(
                r["FailedAndUnresolvableNodes"]
                    .as_object()
                    .into_iter()
                    .flatten(),
            )
            .count();
        assert_eq!(
            failed + got.len(),
            all.len(),
            "{class}: every node answered: {r}"
        );
    }
    // /v1/nodes says where each node's mode was read from.
    let report = gpu_share::status::reports_from(&Policy::default_policy(), &nodes, &[]);
    let source = |n: &str| {
        report.iter().find(|r| r.name == n).map(|r| {
            serde_json::to_value(r).unwrap()["modeSource"]
                .as_str()
                .unwrap()
                .to_string()
        })
    };
    assert_eq!(source("gke-l4-ts").as_deref(), Some("gke"));
    // No GFD label, but g5.12xlarge has 4 GPUs, as many as it advertises.
    assert_eq!(source("eks-g5").as_deref(), Some("instance-type"));
    assert_eq!(source("aks-a100-mig").as_deref(), Some("gfd"));
}

/// A time-slicing pod whose request was rewritten down to 1% while its limits hold more
/// replicas: accounted by its limits, in filter, in bind and in the rebuild, and said so.
#[tokio::test]
async fn a_request_the_limits_contradict_is_accounted_by_the_limits() {
    let s = state();
    let liar = |uid: &str, replicas: u32| {
        let mut p = ts_pod(uid, 1);
        let units = json!({"nvidia.com/gpu": replicas.to_string()});
        p["spec"]["containers"][0]["resources"] = json!({"limits": units, "requests": units});
        p
    };
    // 40 replicas fit nowhere: every node's reason says the request is not believed, and why.
    let names = ["a100-mig", "h100-ts", "h100-mps", "l40s-plain"];
    let (status, r) = post(
        s.clone(),
        "/scheduler/filter",
        body(&json!({"Pod": liar("big", 40), "NodeNames": names})),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    let reasons: Vec<String> = ["FailedNodes", "FailedAndUnresolvableNodes"]
        .iter()
        .flat_map(|k| r[k].as_object().into_iter().flatten())
        .map(|(_, v)| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(reasons.len(), 4, "{r}");
    for reason in &reasons {
        assert!(
            reason.contains("gpu-share.io/request \"timeslice-1\" is not believed")
                && reason.contains("nvidia.com/gpu: 40"),
            "{reason}"
        );
    }
    // Bound with two replicas: the ledger holds two slots, not 1% of one.
    assert_eq!(filter_and_bind(&s, &liar("two", 2), "h100-ts").await, "");
    let ext = s.extender.as_ref().unwrap();
    let held = ext.ledger().holding("two").unwrap();
    assert_eq!(
        held.demand.gpu,
        gpu_share::packing::GpuDemand::Units {
            resource: "nvidia.com/gpu".into(),
            count: 2
        }
    );
    assert_eq!(
        ext.ledger().with_node("h100-ts", |nl| nl.usage.slots),
        Some(2)
    );
    // The metric counts both pods.
    assert_eq!(ext.contradicted_pods(), 2);
    // The rebuild from the API reads the pod the same way.
    let mut bound: k8s_openapi::api::core::v1::Pod =
        serde_json::from_value(liar("two", 2)).unwrap();
    bound.spec.as_mut().unwrap().node_name = Some("h100-ts".into());
    let observed = gpu_share::ledger::observed_holding(&bound)
        .unwrap()
        .unwrap();
    assert_eq!(observed.demand.gpu, held.demand.gpu);
}

/// A pod pinned to a GPU model by a nodeSelector or a required node affinity on
/// nvidia.com/gpu.product: filter passes only nodes of that model (a node of another model says
/// why), and the workload gpu-share's policy learns keeps the pin on the pod's shape, as the
/// simulator keeps a trace's gpu_spec.
#[tokio::test]
async fn a_model_pinned_pod_fits_only_its_model_and_its_shape_keeps_the_pin() {
    let node = |name: &str, product: &str| {
        json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.count": "8",
                "nvidia.com/gpu.memory": "81559",
                "nvidia.com/gpu.sharing-strategy": "none"}},
            "status": {"allocatable": {"cpu": "96", "memory": "1024Gi", "pods": "110",
                                       "nvidia.com/gpu": "8"}}
        })
    };
    let list = json!({"apiVersion": "v1", "kind": "NodeList", "items": [
        node("a100", "NVIDIA-A100-SXM4-80GB"), node("h100", "NVIDIA-H100-80GB-HBM3")]});
    let state = AppState::dev(Role::All, every_fit());
    let ext = state.extender.clone().unwrap();
    let nodes = parse_nodes(&serde_json::to_string(&list).unwrap()).unwrap();
    assert_eq!(ext.learn_nodes(&nodes, &"nvidia.com/gpu".into()), 2);
    let exclusive = |uid: &str| {
        let mut p = ts_pod(uid, 25);
        p["metadata"]["annotations"]["gpu-share.io/request"] = json!("exclusive");
        p["spec"]["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": "1"}});
        p
    };
    let mut by_selector = exclusive("sel");
    by_selector["spec"]["nodeSelector"] =
        json!({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"});
    let mut by_affinity = exclusive("aff");
    by_affinity["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
        {"nodeSelectorTerms": [{"matchExpressions": [{"key": "nvidia.com/gpu.product",
            "operator": "In", "values": ["NVIDIA-A100-SXM4-80GB"]}]}]}}});
    for (pod, fits, other) in [
        (&by_selector, "h100", "a100"),
        (&by_affinity, "a100", "h100"),
    ] {
        let (status, r) = post(
            state.clone(),
            "/scheduler/filter",
            body(&json!({"Pod": pod, "Nodes": null, "NodeNames": ["a100", "h100"]})),
        )
        .await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(names(&r["NodeNames"]), vec![fits], "{r}");
        assert_eq!(
            r["FailedAndUnresolvableNodes"][other], "node's GPU model is not one the pod allows",
            "{r}"
        );
    }
    // The learnt workload: one pinned shape per model, and nothing unpinned.
    let workload = ext
        .scorer(gpu_share::packing::PackingPolicy::GpuShare)
        .workload
        .expect("a workload after two pods");
    let mut pins: Vec<Vec<String>> = workload
        .shapes
        .iter()
        .map(|(shape, _)| shape.models.clone())
        .collect();
    pins.sort();
    assert_eq!(
        pins,
        vec![
            vec!["NVIDIA-A100-SXM4-80GB".to_string()],
            vec!["NVIDIA-H100-80GB-HBM3".to_string()]
        ]
    );
}

/// A `--dev` service with the nodes generated from NVIDIA's own code
/// (tests/fixtures/nvidia/nodes.yaml).
fn nvidia_state(policy: Policy) -> AppState {
    let text = std::fs::read_to_string(format!(
        "{}/tests/fixtures/nvidia/nodes.yaml",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let reading = gpu_share::inventory::Reading::of(&policy);
    let state = AppState::dev(Role::All, policy);
    let nodes = parse_nodes(&text).unwrap();
    let gpu = state
        .extender
        .as_ref()
        .unwrap()
        .learn_nodes(&nodes, &reading);
    assert_eq!(gpu, nodes.len());
    state
}

/// Filter, prioritize and preempt never pass a node that does not advertise the resource the
/// pod's limits name, and filter says so in words: a mixed-strategy MIG pod and a
/// single-strategy node, a time-sliced pod and a node with `renameByDefault`.
#[tokio::test]
async fn nodes_that_do_not_advertise_the_pods_resource_are_refused_in_words() {
    let s = nvidia_state(every_fit());
    let mig = mig_pod("nv-mig", "1g.10gb", 0);
    let mig_nodes = json!([
        "a100-80gb-mig-single-all-1g.10gb",
        "a100-80gb-mig-mixed-all-1g.10gb",
        "h100-80gb-mig-single-all-1g.10gb"
    ]);
    let (status, r) = post(
        s.clone(),
        "/scheduler/filter",
        body(&json!({"Pod": mig, "Nodes": null, "NodeNames": mig_nodes})),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        names(&r["NodeNames"]),
        vec!["a100-80gb-mig-mixed-all-1g.10gb"]
    );
    let un = &r["FailedAndUnresolvableNodes"];
    for n in [
        "a100-80gb-mig-single-all-1g.10gb",
        "h100-80gb-mig-single-all-1g.10gb",
    ] {
        assert_eq!(
            un[n],
            "node does not advertise nvidia.com/mig-1g.10gb, the resource the pod's limits name",
            "{r}"
        );
    }
    assert_eq!(r["FailedNodes"], json!({}));
    let (status, r) = post(
        s.clone(),
        "/scheduler/prioritize",
        body(&json!({"Pod": mig, "Nodes": null, "NodeNames": mig_nodes})),
    )
    .await;
    assert_eq!(status, 200);
    for e in r.as_array().unwrap() {
        let fits = e["Host"] == "a100-80gb-mig-mixed-all-1g.10gb";
        assert_eq!(e["Score"].as_i64().unwrap() > 0, fits, "{e}");
    }

    let ts = ts_pod("nv-ts", 50);
    let ts_nodes = json!(["h100-80gb-ts4", "h100-80gb-ts4-rename"]);
    let (_, r) = post(
        s.clone(),
        "/scheduler/filter",
        body(&json!({"Pod": ts, "Nodes": null, "NodeNames": ts_nodes})),
    )
    .await;
    assert_eq!(names(&r["NodeNames"]), vec!["h100-80gb-ts4"]);
    assert_eq!(
        r["FailedAndUnresolvableNodes"]["h100-80gb-ts4-rename"],
        "node does not advertise nvidia.com/gpu, the resource the pod's limits name"
    );
    // Preemption offers no victims where the pod could never run.
    let (status, r) = post(
        s.clone(),
        "/scheduler/preempt",
        body(&json!({
            "Pod": ts,
            "NodeNameToVictims": null,
            "NodeNameToMetaVictims": {
                "h100-80gb-ts4-rename": {"Pods": [], "NumPDBViolations": 0},
                "a100-80gb-mig-single-all-1g.10gb": {"Pods": [], "NumPDBViolations": 0}
            }
        })),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(r["NodeNameToMetaVictims"], json!({}), "{r}");

    // With the policy asking time-sliced pods for nvidia.com/gpu.shared, the renamed node is
    // the one the pod's limits name.
    let mut policy = Policy::default_policy();
    policy.resources.timeslice = Some("nvidia.com/gpu.shared".to_string().try_into().unwrap());
    let s = nvidia_state(policy);
    let mut renamed = ts_pod("nv-ts-shared", 50);
    let units = json!({"nvidia.com/gpu.shared": "1"});
    renamed["spec"]["containers"][0]["resources"] = json!({"limits": units, "requests": units});
    let (_, r) = post(
        s,
        "/scheduler/filter",
        body(&json!({"Pod": renamed, "Nodes": null, "NodeNames": ts_nodes})),
    )
    .await;
    assert_eq!(names(&r["NodeNames"]), vec!["h100-80gb-ts4-rename"], "{r}");
}

//! The defragmentation controller over a cluster's state (pods recorded as the API shows them),
//! against an executor that serves pods and records events, annotations and evictions: in plan
//! mode, what a waiting pod is told, said once, and that nothing moves; moving (`mode: on`) is in
//! [`moving`].

mod moving;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::*;
use crate::cache::{NoRoom, NodeFacts};
use crate::cluster::reservation_api::CreateError;
use crate::extender::bind::{BindCallError, ReadBackError};
use crate::extender::executor::Fill;
use crate::extender::state::Mode;
use crate::inventory::GpuNode;
use crate::policy::Policy;
use crate::reservation::Template;

/// Serves the pods it holds (by `namespace/name`), records the events written, and writes
/// annotations on its pods and evicts them (refusing every eviction after `refuse_after`, as a
/// PodDisruptionBudget would), recording each call.
#[derive(Clone, Default)]
struct Fake {
    pods: Arc<Mutex<HashMap<String, Pod>>>,
    events: Arc<Mutex<Vec<String>>>,
    calls: Arc<Mutex<Vec<String>>>,
    /// Refuses every eviction after this many.
    refuse_after: Arc<Mutex<Option<usize>>>,
}

impl Fake {
    fn events(&self) -> Vec<String> {
        self.events.lock().unwrap().clone()
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    fn pod(&self, key: &str) -> Option<Pod> {
        self.pods.lock().unwrap().get(key).cloned()
    }

    fn put(&self, pod: Pod) {
        let key = format!(
            "{}/{}",
            pod.metadata.namespace.clone().unwrap(),
            pod.metadata.name.clone().unwrap()
        );
        self.pods.lock().unwrap().insert(key, pod);
    }
}

impl Executor for Fake {
    const ASKS_API: bool = true;

    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Pod, ReadBackError> {
        self.pod(&format!("{namespace}/{name}"))
            .ok_or(ReadBackError::Unanswered)
    }

    async fn bind_pod(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: &str,
        _: BTreeMap<String, String>,
    ) -> Result<(), BindCallError> {
        unreachable!("planning binds no pod")
    }

    async fn create_reservation(
        &self,
        _: &str,
        _: u32,
        _: bool,
        _: &Template,
    ) -> Result<Option<Pod>, CreateError> {
        unreachable!("planning creates no reservation")
    }

    async fn delete_reservation(&self, _: &str, _: &str) -> Result<(), kube::Error> {
        unreachable!("planning deletes nothing")
    }

    async fn fill(&self, _: &Fill) -> Result<crate::cluster::reservation_api::Fill, kube::Error> {
        unreachable!("planning fills nothing")
    }

    async fn annotate(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: Option<&str>,
    ) -> Result<(), kube::Error> {
        let at = format!("{namespace}/{name}");
        let word = if value.is_some() {
            "written"
        } else {
            "removed"
        };
        self.calls
            .lock()
            .unwrap()
            .push(format!("annotate {at} {key} {word}"));
        if let Some(pod) = self.pods.lock().unwrap().get_mut(&at) {
            let a = pod.metadata.annotations.get_or_insert_default();
            match value {
                Some(v) => a.insert(key.to_string(), v.to_string()),
                None => a.remove(key),
            };
        }
        Ok(())
    }

    async fn delete_share(&self, _: &Owner, _: &str) -> Result<(), kube::Error> {
        unreachable!("defragmentation deletes no pod")
    }

    async fn evict(
        &self,
        owner: &Owner,
    ) -> Result<crate::extender::executor::Evicted, kube::Error> {
        use crate::extender::executor::Evicted;
        let at = format!("{}/{}", owner.namespace, owner.name);
        let evictions = {
            let mut calls = self.calls.lock().unwrap();
            calls.push(format!("evict {at}"));
            calls.iter().filter(|c| c.starts_with("evict ")).count()
        };
        let past = self
            .refuse_after
            .lock()
            .unwrap()
            .is_some_and(|n| evictions > n);
        if past {
            return Ok(Evicted::Refused(
                "Cannot evict pod as it would violate the pod's disruption budget.".into(),
            ));
        }
        Ok(Evicted::Done)
    }

    async fn note(&self, owner: &Owner, _: bool, action: &str, reason: &str, note: &str) {
        self.events.lock().unwrap().push(format!(
            "{action} {reason} {}/{}: {note}",
            owner.namespace, owner.name
        ));
    }
}

/// A pod of namespace `ml` asking `gpus` whole GPUs: bound to GPUs `on` of `node`, or waiting
/// (no node); of a ReplicaSet's where `replica_set`; with `extra` merged into its spec.
fn pod(
    name: &str,
    gpus: u32,
    node: Option<&str>,
    on: &[u32],
    replica_set: bool,
    extra: Value,
) -> Pod {
    let owners = if replica_set {
        json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("{name}-rs"),
                "uid": format!("u-{name}-rs"), "controller": true}])
    } else {
        json!([])
    };
    let request = if gpus == 1 {
        "exclusive".to_string()
    } else {
        format!("exclusive-{gpus}")
    };
    let mut annotations = json!({"gpu-share.io/request": request});
    if node.is_some() {
        let model: Vec<String> = on.iter().map(|g| format!("{g}:1000")).collect();
        annotations["gpu-share.io/gpus"] = json!(model.join(","));
    }
    let mut spec = json!({
        "nodeName": node,
        "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]
    });
    if let (Value::Object(s), Value::Object(e)) = (&mut spec, extra) {
        s.extend(e);
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ml", "uid": format!("u-{name}"),
                     "ownerReferences": owners, "annotations": annotations},
        "spec": spec,
        "status": {"phase": if node.is_some() { "Running" } else { "Pending" }}
    }))
    .unwrap()
}

/// A fake serving `pods`.
fn serving(pods: Vec<Pod>) -> Fake {
    let fake = Fake::default();
    for p in pods {
        fake.put(p);
    }
    fake
}

/// Two nodes of four L40S, labelled `pool=<name>`. n0: GPU 0 held by `a` (a ReplicaSet's; `a_spec`
/// merged into its spec), GPU 1 free, GPUs 2 and 3 by bare pods. n1: GPU 0 free, the rest held
/// by bare pods. An `exclusive-2` pod `big` (`big_spec` merged into its spec) waits: no node has
/// two free GPUs, and moving `a` to n1's free GPU frees two on n0.
fn cluster(a_spec: Value, big_spec: Value) -> (ExtenderState, Fake) {
    cluster_tainted(a_spec, big_spec, &[])
}

/// [`cluster`], n1 with these taints.
fn cluster_tainted(a_spec: Value, big_spec: Value, n1_taints: &[Value]) -> (ExtenderState, Fake) {
    let ext = ExtenderState::new(Mode::Cluster, Duration::from_secs(60));
    for n in ["n0", "n1"] {
        let taints = if n == "n1" { n1_taints } else { &[] };
        let facts = NodeFacts {
            labels: BTreeMap::from([("pool".to_string(), n.to_string())]),
            hard_taints: taints
                .iter()
                .map(|t| serde_json::from_value(t.clone()).unwrap())
                .collect(),
            ..NodeFacts::default()
        };
        ext.apply_node(n, facts, Some(GpuNode::whole(n, "NVIDIA-L40S", 4, 46068)));
    }
    let mut pods = vec![
        pod("a", 1, Some("n0"), &[0], true, a_spec),
        pod("s2", 1, Some("n0"), &[2], false, json!({})),
        pod("s3", 1, Some("n0"), &[3], false, json!({})),
    ];
    for g in 1..4u32 {
        pods.push(pod(&format!("t{g}"), 1, Some("n1"), &[g], false, json!({})));
    }
    let big = pod("big", 2, None, &[], false, big_spec);
    for p in &pods {
        ext.observe_pod(p);
    }
    ext.mark_synced();
    ext.note_no_room(
        "u-big",
        NoRoom {
            namespace: "ml".into(),
            name: "big".into(),
            class: "exclusive",
        },
    );
    pods.push(big);
    (ext, serving(pods))
}

fn policy(namespaces: &[&str]) -> Policy {
    let mut p = Policy::default_policy();
    p.defrag.mode = DefragMode::Plan;
    p.defrag.namespaces = namespaces.iter().map(|n| n.to_string()).collect();
    p
}

async fn tick_once(ext: &ExtenderState, fake: &Fake, policy: &Policy, memory: &mut Memory) {
    tick_with(ext, fake, policy, &Metrics::new(), memory).await;
}

/// One tick over the pods waiting now, counted in `metrics`.
async fn tick_with(
    ext: &ExtenderState,
    fake: &Fake,
    policy: &Policy,
    metrics: &Metrics,
    memory: &mut Memory,
) {
    let waiting = ext.wanting_room();
    tick(fake, ext, policy, metrics, &waiting, memory).await;
}

/// The one event said: no plan, since `ml/a` has nowhere else to go.
fn told_a_stays(fake: &Fake) {
    let events = fake.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(
        events[0].contains("GpuShareNoDefragPlan")
            && events[0]
                .contains("no other node that takes it without breaking a free GPU (as ml/a)"),
        "{}",
        events[0]
    );
}

/// The waiting pod is told which move would make room, once; nothing moves.
#[tokio::test]
async fn a_waiting_pod_is_told_the_plan_once_and_nothing_moves() {
    let (ext, fake) = cluster(json!({}), json!({}));
    assert_eq!(ext.ledger().node_of("u-a").as_deref(), Some("n0"));
    let policy = policy(&["ml"]);
    let mut memory = Memory::default();
    tick_once(&ext, &fake, &policy, &mut memory).await;
    assert_eq!(
        fake.events(),
        [
            "Defragmentation GpuShareDefragPlan ml/big: moving ml/a from node n0 to n1 makes room on node n0 (GPU 0, 1); defrag.mode is plan, so nothing moves"
        ]
    );
    assert_eq!(ext.ledger().node_of("u-a").as_deref(), Some("n0"));
    // Posted on the node room would be made on, for /v1/nodes, the page and `gpu-share status`.
    let posted = "for ml/big: moving ml/a from node n0 to n1 makes room on node n0 (GPU 0, 1) (plan only: nothing moves)";
    assert_eq!(ext.plans.on("n0"), [posted]);
    assert!(ext.plans.on("n1").is_empty());
    // Weighed again (past its wait), the same plan is not said again.
    memory.weighed.clear();
    tick_once(&ext, &fake, &policy, &mut memory).await;
    assert_eq!(fake.events().len(), 1, "{:?}", fake.events());
}

/// Outside the namespaces opted in, the pod that would move stays, and the waiting pod is told
/// why no moves make room.
#[tokio::test]
async fn a_pod_not_opted_in_stays_and_the_waiting_pod_is_told_why() {
    let (ext, fake) = cluster(json!({}), json!({}));
    let mut memory = Memory::default();
    tick_once(&ext, &fake, &policy(&["other"]), &mut memory).await;
    let events = fake.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(
        events[0].starts_with("Defragmentation GpuShareNoDefragPlan ml/big: no defragmentation plan: no moves make room on any of the 2 node(s)"),
        "{}",
        events[0]
    );
    assert!(
        events[0].contains("neither their namespace nor their workload is opted in"),
        "{}",
        events[0]
    );
    assert!(ext.plans.on("n0").is_empty(), "no plan is posted");
}

/// The waiting pod's nodeSelector keeps it to n1, where no moves make room.
#[tokio::test]
async fn the_waiting_pods_node_constraints_hold() {
    let (ext, fake) = cluster(json!({}), json!({"nodeSelector": {"pool": "n1"}}));
    let mut memory = Memory::default();
    tick_once(&ext, &fake, &policy(&["ml"]), &mut memory).await;
    let events = fake.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(
        events[0].contains("no moves make room on any of the 1 node(s)"),
        "{}",
        events[0]
    );
}

/// A pod whose own nodeSelector keeps it on n0 is not planned onto n1: read after the first
/// plan, its target is excluded, and with no other the waiting pod is told so.
#[tokio::test]
async fn a_moved_pods_own_constraints_hold() {
    let (ext, fake) = cluster(json!({"nodeSelector": {"pool": "n0"}}), json!({}));
    let mut memory = Memory::default();
    tick_once(&ext, &fake, &policy(&["ml"]), &mut memory).await;
    told_a_stays(&fake);
}

/// A taint on n1 that `a` does not tolerate keeps it on n0, as kube-scheduler would; tolerated,
/// the plan moves it there.
#[tokio::test]
async fn a_taint_the_moved_pod_does_not_tolerate_keeps_it() {
    let taint = json!({"key": "team", "value": "vision", "effect": "NoSchedule"});
    let (ext, fake) = cluster_tainted(json!({}), json!({}), std::slice::from_ref(&taint));
    let mut memory = Memory::default();
    tick_once(&ext, &fake, &policy(&["ml"]), &mut memory).await;
    told_a_stays(&fake);
    let tolerates = json!({"tolerations": [{"key": "team", "operator": "Equal", "value": "vision", "effect": "NoSchedule"}]});
    let (ext, fake) = cluster_tainted(tolerates, json!({}), &[taint]);
    let mut memory = Memory::default();
    tick_once(&ext, &fake, &policy(&["ml"]), &mut memory).await;
    assert_eq!(
        fake.events(),
        [
            "Defragmentation GpuShareDefragPlan ml/big: moving ml/a from node n0 to n1 makes room on node n0 (GPU 0, 1); defrag.mode is plan, so nothing moves"
        ]
    );
}

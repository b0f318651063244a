//! Entry points for the fuzz targets in `fuzz/` and for `tests/fuzz_corpus.rs`, which replays
//! every corpus file through them in CI. Each takes arbitrary bytes, drives the service's own
//! code as it runs in production, and panics when a promise breaks:
//!
//! - no input panics, and the HTTP endpoints answer 200, 400, 404, 405, 413 or 503 with JSON;
//! - every patch the webhook sends applies to the pod it was sent for, and yields a Pod that
//!   parses, whose request annotation parses, and that the webhook then leaves alone;
//! - a parsed request writes itself in the normalized form and reads back the same;
//! - no sequence of binds and releases overcommits a node, and the ledger rebuilt from what the
//!   API would hold equals the live one.

use std::cell::RefCell;
use std::collections::BTreeMap;

use axum::body::Body;
use base64::Engine;
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

use crate::cli::Role;
use crate::inventory::{GpuNode, MigLayout, Sharing};
use crate::ledger::{Ledger, PodRef};
use crate::packing::{Demand, GpuDemand, PackingPolicy, Scorer};
use crate::policy::Policy;
use crate::request::{self, GpuRequest};
use crate::server::{AppState, router};

/// The example nodes the extender targets work on (those of `--dev --nodes`).
const NODES: &str = include_str!("../tests/fixtures/extender/nodes.yaml");

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    static STATE: RefCell<Option<AppState>> = const { RefCell::new(None) };
}

/// One shared dev service (webhook and extender, the example nodes), as `serve --dev` runs.
fn state() -> AppState {
    STATE.with(|s| {
        s.borrow_mut()
            .get_or_insert_with(|| {
                let state = AppState::dev(Role::All, Policy::default_policy());
                let nodes = crate::server::parse_nodes(NODES).expect("example nodes");
                if let Some(ext) = &state.extender {
                    ext.learn_nodes(&nodes, &"nvidia.com/gpu".into());
                }
                state
            })
            .clone()
    })
}

/// POSTs `body` to `path` on the dev service: status and body.
fn post(path: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let app = router(state());
    let req = http::Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_vec()))
        .expect("request");
    RUNTIME.with(|rt| {
        rt.block_on(async move {
            let resp = app.oneshot(req).await.expect("infallible");
            let status = resp.status().as_u16();
            let bytes = resp.into_body().collect().await.expect("body").to_bytes();
            (status, bytes.to_vec())
        })
    })
}

fn assert_answer(path: &str, status: u16, body: &[u8]) {
    assert!(
        matches!(status, 200 | 400 | 404 | 405 | 413 | 503),
        "{path}: HTTP {status}: {}",
        String::from_utf8_lossy(body)
    );
    let v: Result<Value, _> = serde_json::from_slice(body);
    assert!(
        v.is_ok(),
        "{path}: HTTP {status} with a body that is not JSON: {}",
        String::from_utf8_lossy(body)
    );
    if status != 200 {
        let v = v.unwrap_or_default();
        assert!(
            v["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{path}: HTTP {status} without a reason: {v}"
        );
    }
}

/// The annotation grammar: `key=value` lines as a pod's annotations, and the whole input as a
/// class, a memory quantity and a normalized request.
pub fn annotation(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = request::parse_class(&text);
    let _ = request::parse_memory_mib(&text);
    if let Ok(r) = GpuRequest::parse_normalized(&text) {
        assert_eq!(
            GpuRequest::parse_normalized(&r.normalized()).as_ref(),
            Ok(&r),
            "{text:?} does not read back from {:?}",
            r.normalized()
        );
    }
    let annotations: BTreeMap<String, String> = text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if let Ok(Some(a)) = request::from_annotations(&annotations) {
        let normalized = a.request.normalized();
        assert_eq!(
            GpuRequest::parse_normalized(&normalized).as_ref(),
            Ok(&a.request),
            "{annotations:?}: {normalized:?} does not read back"
        );
    }
}

/// `POST /mutate`: bytes in, AdmissionReview out; a patch applies and yields a valid pod.
pub fn admission(data: &[u8]) {
    let (status, body) = post("/mutate", data);
    assert_answer("/mutate", status, &body);
    if status != 200 {
        return;
    }
    let out: Value = serde_json::from_slice(&body).expect("JSON");
    let Some(patch) = out["response"]["patch"].as_str() else {
        return;
    };
    let review: Value = serde_json::from_slice(data).expect("a review the webhook patched parses");
    let mut pod = review["request"]["object"].clone();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .expect("the patch is base64");
    let ops: json_patch::Patch = serde_json::from_slice(&bytes).expect("the patch is a JSON Patch");
    json_patch::patch(&mut pod, &ops).unwrap_or_else(|e| {
        panic!(
            "the patch does not apply to its pod: {e}\npatch {}\npod {pod}",
            String::from_utf8_lossy(&bytes)
        )
    });
    let typed: k8s_openapi::api::core::v1::Pod = serde_json::from_value(pod.clone())
        .unwrap_or_else(|e| panic!("the patched pod is not a Pod: {e}\n{pod}"));
    let normalized = typed
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::request::ANNOTATION_REQUEST))
        .expect("a patched pod carries its normalized request");
    GpuRequest::parse_normalized(normalized)
        .unwrap_or_else(|e| panic!("the written request does not parse: {e}"));
    // The webhook leaves the pod it wrote alone (reinvocation, or a retried create).
    let mut again = review.clone();
    again["request"]["object"] = pod;
    let (status, body) = post("/mutate", &serde_json::to_vec(&again).expect("JSON"));
    assert_eq!(status, 200);
    let out: Value = serde_json::from_slice(&body).expect("JSON");
    assert!(
        out["response"]["patch"].is_null() || out["response"]["allowed"] == false,
        "the webhook patches its own output again: {out}"
    );
}

/// `POST /scheduler/<verb>` on the dev extender with the example nodes.
pub fn extender(verb: &str, data: &[u8]) {
    let path = format!("/scheduler/{verb}");
    let (status, body) = post(&path, data);
    assert_answer(&path, status, &body);
}

/// A policy file.
pub fn policy(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(p) = Policy::from_yaml(&text) {
        let _ = p.mig_table();
    }
}

/// The openb trace CSVs: the input as a node table and as a pod table.
pub fn openb(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = gpu_share_simulator::trace::parse_nodes_csv(&text);
    let _ = gpu_share_simulator::trace::parse_pods_csv(&text);
}

/// The simulator's Kubernetes-shaped inputs: a NodeList and a PodList.
pub fn kube_inputs(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = gpu_share_simulator::kube::parse_node_list(&text);
    let _ = gpu_share_simulator::kube::parse_pod_list(&text);
}

/// Four nodes, one of each kind (whole GPUs, time-slicing, MPS, MIG mixed): the ledger the `binds`
/// target and `tests/ledger_props.rs` work on.
pub fn ledger_nodes() -> Vec<GpuNode> {
    vec![
        GpuNode::whole("plain", "L40S", 4, 46068),
        GpuNode::shared("ts", "H100", 2, 81559, Sharing::TimeSlicing { replicas: 4 }),
        GpuNode::shared("mps", "H100", 2, 81559, Sharing::Mps { replicas: 4 }),
        GpuNode {
            gpus: 1,
            slots: 1,
            mig: MigLayout::Mixed {
                instances: [("1g.10gb".to_string(), 7), ("3g.40gb".to_string(), 2)].into(),
            },
            ..GpuNode::whole("mig", "A100", 1, 81920)
        },
    ]
}

/// A demand from two bytes.
fn demand_of(kind: u8, size: u8) -> GpuDemand {
    let pct = u32::from(size % 100) + 1;
    match kind % 5 {
        0 => GpuDemand::Whole {
            count: u32::from(size % 3) + 1,
        },
        1 => GpuDemand::Mps {
            milli: pct * 10,
            memory_mib: (size > 128).then_some(u64::from(size) * 200),
        },
        2 => GpuDemand::Timeslice {
            milli: pct * 10,
            memory_mib: (size > 128).then_some(u64::from(size) * 300),
        },
        3 => GpuDemand::Mig {
            profile: ["1g.10gb", "3g.40gb", "7g.80gb"][usize::from(size % 3)].to_string(),
            count: u32::from(size / 3 % 3) + 1,
        },
        _ => GpuDemand::Mig {
            profile: "1g.10gb".to_string(),
            count: 1,
        },
    }
}

/// Bytes as a sequence of binds, releases and restarts (4 bytes an operation) on a ledger of
/// four nodes, one of each kind: no node is ever overcommitted, and a ledger rebuilt from the
/// API's view equals the live one.
pub fn binds(data: &[u8]) {
    let nodes = ledger_nodes();
    let mut live = Ledger::rebuild(nodes.clone(), &[]);
    let scorer = Scorer::new(PackingPolicy::GpuShare);
    for op in data.chunks(4).take(256) {
        let [a, b, c, d] = [
            op[0],
            *op.get(1).unwrap_or(&0),
            *op.get(2).unwrap_or(&0),
            *op.get(3).unwrap_or(&0),
        ];
        let uid = format!("p{}", b % 32);
        match a % 8 {
            0..=4 => {
                let node = &nodes[usize::from(c) % nodes.len()].name;
                let pref = PodRef::new(uid.clone(), "ml", uid);
                let _ = live.hold(&scorer, node, pref, Demand::gpu(demand_of(a / 8, d)));
            }
            5 | 6 => {
                live.release(&uid);
            }
            _ => {
                let rebuilt = Ledger::rebuild(nodes.clone(), &live.observed());
                assert_eq!(
                    rebuilt.snapshot(),
                    live.snapshot(),
                    "the rebuilt ledger differs"
                );
                live = rebuilt;
            }
        }
        for nl in live.snapshot().values() {
            assert!(
                nl.within_capacity(),
                "overcommitted {}: {:?}",
                nl.node.name,
                nl.usage
            );
            let shared = matches!(
                nl.node.sharing,
                Sharing::TimeSlicing { .. } | Sharing::Mps { .. }
            );
            assert!(
                shared || nl.usage.gpu_milli.iter().all(|m| *m <= 1000),
                "a GPU over 100% on {}",
                nl.node.name
            );
        }
    }
}

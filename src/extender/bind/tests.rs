//! bind against kube's mock API service: what the ledger holds after each way the binding
//! call can end.
use super::*;
use crate::cluster::ClusterFacts;
use crate::inventory::GpuNode;
use crate::policy::Policy;
use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;
use serde_json::json;

use crate::cluster::mock::Handle;

fn pod() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ml", "uid": "u-1",
                     "annotations": {"gpu-share.io/request": "exclusive"}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))
    .unwrap()
}

/// A cluster-mode state with one 4-GPU node and the pod seen in filter.
fn cluster_state() -> (Context, Handle) {
    let (client, handle) = crate::cluster::mock::client();
    let mut state = Context::dev(Policy::default_policy());
    state.cluster = Some(ClusterFacts::new(client));
    let ext = ExtenderState::new(Mode::Cluster, std::time::Duration::from_secs(60));
    ext.mark_synced();
    ext.set_node("n1", Some(GpuNode::whole("n1", "NVIDIA-L40S", 4, 46068)));
    ext.remember_pod("u-1", Arc::new(ledger::BindPod::of(&pod())));
    state.extender = Some(Arc::new(ext));
    (state, handle)
}

fn args() -> ExtenderBindingArgs {
    ExtenderBindingArgs {
        pod_name: "p".into(),
        pod_namespace: "ml".into(),
        pod_uid: "u-1".into(),
        node: "n1".into(),
    }
}

fn respond(status: u16, body: Value) -> http::Response<kube::client::Body> {
    crate::cluster::mock::json(status, &body)
}

fn status(code: u16, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code})
}

fn pod_on(node: Option<&str>) -> Value {
    let mut p = serde_json::to_value(pod()).unwrap();
    p["spec"]["nodeName"] = json!(node);
    p
}

/// Runs bind while `api` answers the mock's requests; returns bind's result, what the
/// ledger holds for the pod afterwards, and the paths the API was asked for.
async fn bind_with<F, Fut>(api: F) -> (Result<(), BindError>, Option<String>, Vec<String>)
where
    F: FnOnce(Handle) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Vec<String>> + Send + 'static,
{
    let (state, handle) = cluster_state();
    let server = tokio::spawn(api(handle));
    let ext = state.extender.clone().unwrap();
    let result = bind(&state, &ext, &args()).await;
    drop(state);
    let paths = server.await.unwrap();
    (result, ext.ledger().node_of("u-1"), paths)
}

#[tokio::test]
async fn a_binding_the_api_accepts_is_held() {
    let (r, held, paths) = bind_with(|mut h| async move {
        let (req, send) = h.next_request().await.unwrap();
        send.send_response(respond(201, status(201, "")));
        vec![req.uri().path().to_string()]
    })
    .await;
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(held.as_deref(), Some("n1"));
    assert_eq!(paths, ["/api/v1/namespaces/ml/pods/p/binding"]);
}

#[tokio::test]
async fn a_refused_binding_is_released_without_reading_the_pod() {
    let (r, held, paths) = bind_with(|mut h| async move {
        let (req, send) = h.next_request().await.unwrap();
        send.send_response(respond(403, status(403, "pods \"p\" is forbidden")));
        let mut paths = vec![req.uri().path().to_string()];
        // Nothing more is asked (the stream ends when bind has dropped the client).
        if let Some((extra, _)) = h.next_request().await {
            paths.push(extra.uri().path().to_string());
        }
        paths
    })
    .await;
    assert!(r.unwrap_err().to_string().contains("forbidden"));
    assert_eq!(held, None, "nothing was bound: the reservation is released");
    assert_eq!(paths.len(), 1, "a 403 is definite: no read-back: {paths:?}");
}

/// bind when the binding call answers `code` with `message` and reading the pod back shows
/// it on `node`: bind's result and what the ledger holds.
async fn answered_then_read_back(
    code: u16,
    message: &'static str,
    node: Option<&'static str>,
) -> (Result<(), BindError>, Option<String>) {
    let (r, held, _) = bind_with(move |mut h| async move {
        let (_, send) = h.next_request().await.unwrap();
        send.send_response(respond(code, status(code, message)));
        let (get, send) = h.next_request().await.expect("a read-back");
        assert_eq!(get.method(), http::Method::GET);
        assert_eq!(get.uri().path(), "/api/v1/namespaces/ml/pods/p");
        send.send_response(respond(200, pod_on(node)));
        vec![]
    })
    .await;
    (r, held)
}

#[tokio::test]
async fn a_conflict_is_read_back() {
    // Already bound to this node (an earlier try that took): kept.
    let conflict = "pod p is already assigned to node";
    let (r, held) = answered_then_read_back(409, conflict, Some("n1")).await;
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(held.as_deref(), Some("n1"));
    // Bound elsewhere: released, the conflict in words.
    let (r, held) = answered_then_read_back(409, conflict, Some("n2")).await;
    assert!(r.unwrap_err().to_string().contains("already assigned"));
    assert_eq!(held, None);
}

#[tokio::test]
async fn a_server_error_is_read_back() {
    // The binding took all the same: the call's error is not the outcome.
    let (r, held) = answered_then_read_back(500, "etcdserver: request timed out", Some("n1")).await;
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(held.as_deref(), Some("n1"));
    // It did not: released, the error in words.
    let (r, held) = answered_then_read_back(503, "the server is shutting down", None).await;
    assert!(r.unwrap_err().to_string().contains("shutting down"));
    assert_eq!(held, None);
}

/// Neither the binding nor the read-back answered: the pod is in doubt and stays held (the
/// API may have bound it, and the watch may lag), a second bind of it is refused in words,
/// and reading it back later settles it by the API's answer.
async fn unsettled_then_read_back(later: Option<&'static str>) -> Option<String> {
    let (state, mut h) = cluster_state();
    let ext = state.extender.clone().unwrap();
    let api = tokio::spawn(async move {
        // Neither the binding nor the read is answered (until bind has given up on both).
        let (_, binding) = h.next_request().await.unwrap();
        let (_, read) = h.next_request().await.unwrap();
        // Read again in the background: a server error first (no answer yet), then the pod.
        let (_, send) = h
            .next_request()
            .await
            .expect("a read-back in the background");
        drop((binding, read));
        send.send_response(respond(500, status(500, "etcdserver: leader changed")));
        let (get, send) = h.next_request().await.expect("another read-back");
        assert_eq!(get.uri().path(), "/api/v1/namespaces/ml/pods/p");
        send.send_response(respond(200, pod_on(later)));
        h
    });
    let e = bind(&state, &ext, &args()).await.unwrap_err().to_string();
    assert!(
        e.contains("no answer within 3 s")
            && e.contains("could not be read back")
            && e.contains("stays held on n1"),
        "{e}"
    );
    assert_eq!(ext.ledger().node_of("u-1").as_deref(), Some("n1"));
    assert_eq!(ext.in_doubt("u-1").as_deref(), Some("n1"));
    let again = bind(&state, &ext, &args()).await.unwrap_err().to_string();
    assert!(
        again.contains("is in doubt") && again.contains("binding to n1 got no answer"),
        "{again}"
    );
    let _h = api.await.unwrap();
    for _ in 0..100 {
        if ext.in_doubt("u-1").is_none() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(ext.in_doubt("u-1"), None, "settled once the API answered");
    ext.ledger().node_of("u-1")
}

#[tokio::test(start_paused = true)]
async fn an_unanswered_binding_that_cannot_be_read_back_stays_held_until_the_api_answers() {
    assert_eq!(
        unsettled_then_read_back(None).await,
        None,
        "the API has the pod unbound: released"
    );
    assert_eq!(
        unsettled_then_read_back(Some("n1")).await.as_deref(),
        Some("n1"),
        "the binding took: kept"
    );
    assert_eq!(
        unsettled_then_read_back(Some("n2")).await,
        None,
        "bound elsewhere: released here"
    );
}

#[tokio::test(start_paused = true)]
async fn an_unanswered_binding_that_took_keeps_the_holding() {
    let (r, held, _) = bind_with(|mut h| async move {
        let (_, binding) = h.next_request().await.unwrap();
        let (_, send) = h.next_request().await.unwrap();
        send.send_response(respond(200, pod_on(Some("n1"))));
        drop(binding);
        vec![]
    })
    .await;
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(held.as_deref(), Some("n1"));
}

/// A `timeslice-30` share in per-GPU form, pointed at its devices ConfigMap.
fn per_gpu_share() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ml", "uid": "u-1",
            "annotations": {"gpu-share.io/request": "timeslice-30"}},
        "spec": {"containers": [{"name": "c",
            "resources": {"limits": {"gpu-share.io/shared-gpu": "1"}},
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef":
                {"name": "gpu-share-devices-a1", "key": "NVIDIA_VISIBLE_DEVICES"}}}]}]}
    }))
    .unwrap()
}

/// The chaos run's case: a share's bind creates its GPU's reservation, the API server takes
/// longer than bind waits, and the bind fails (the share released). The reservation pod
/// may exist, so its GPU stays held for it until the watch shows the pod or the assumption
/// lapses: no whole-GPU pod is given it meanwhile.
#[tokio::test(start_paused = true)]
async fn a_reservation_whose_create_got_no_answer_keeps_its_gpu_held() {
    let (client, mut h) = crate::cluster::mock::client();
    let mut state = Context::dev(Policy::default_policy());
    state.cluster = Some(ClusterFacts::new(client));
    state.reservations = Arc::new(crate::reservation::Template {
        image: "gpu-share:test".into(),
        ..Default::default()
    });
    let ext = ExtenderState::new(Mode::Cluster, std::time::Duration::from_secs(60));
    ext.mark_synced();
    let mut node = GpuNode::whole("n1", "NVIDIA-A100-SXM4-80GB", 2, 81920);
    node.sharing = crate::inventory::Sharing::PerGpu;
    ext.set_node("n1", Some(node));
    let share = per_gpu_share();
    ext.remember_pod("u-1", Arc::new(ledger::BindPod::of(&share)));
    let ext = Arc::new(ext);
    state.extender = Some(ext.clone());
    let server = tokio::spawn(async move {
        let (req, send) = h.next_request().await.unwrap();
        assert_eq!(
            req.uri().path(),
            "/api/v1/namespaces/gpu-share-reservations/pods"
        );
        // Answered after bind stopped waiting.
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        drop(send);
    });
    let e = bind(&state, &ext, &args()).await.unwrap_err().to_string();
    assert!(e.contains("was not created: no answer within 1.5 s"), "{e}");
    assert_eq!(ext.ledger().node_of("u-1"), None, "the share is released");
    let held = |ext: &ExtenderState| {
        ext.ledger()
            .with_node("n1", |nl| {
                (nl.usage.reserved.clone(), nl.usage.whole.clone())
            })
            .unwrap()
    };
    let (reserved, whole) = held(&ext);
    assert_eq!(reserved.iter().sum::<u32>(), 1, "{reserved:?}");
    let gpu = reserved.iter().position(|r| *r == 1).unwrap() as u32;
    // Two whole GPUs asked: one is all there is.
    let scorer = crate::packing::Scorer::new(crate::packing::PackingPolicy::Binpack);
    let mut b = ext.begin_bind("w", "n1", false);
    let placed = b.hold(
        &scorer,
        ledger::PodRef::new("w", "ml", "w"),
        crate::packing::Demand::gpu(crate::packing::GpuDemand::Whole { count: 2 }),
    );
    assert!(placed.is_err(), "{placed:?} with {whole:?}");
    b.abort();
    // The reservation's pod, shown by the watch, takes the stand-in's place.
    let t = crate::reservation::Template {
        image: "gpu-share:test".into(),
        ..Default::default()
    };
    let mut r = crate::reservation::pod("n1", gpu, false, &t);
    r["metadata"]["uid"] = json!("r-1");
    ext.observe_pod(&serde_json::from_value(r).unwrap());
    assert_eq!(ext.ledger().uids(), ["r-1"]);
    server.await.unwrap();
}

/// A share bound to a GPU whose reservation has published its UUID gets its devices
/// ConfigMap right after the binding, owned by the pod and naming that UUID; a share on a
/// GPU whose reservation is still starting gets none at bind (the controller fills it).
#[tokio::test]
async fn a_share_on_a_held_gpu_is_pointed_at_it_at_bind() {
    let uuid = "GPU-8a3f0c52-1c2d-4e5f-9a0b-123456789abc";
    for ready in [true, false] {
        let (client, mut h) = crate::cluster::mock::client();
        let mut state = Context::dev(Policy::default_policy());
        state.cluster = Some(ClusterFacts::new(client));
        let ext = ExtenderState::new(Mode::Cluster, std::time::Duration::from_secs(60));
        ext.mark_synced();
        let mut node = GpuNode::whole("n1", "NVIDIA-A100-SXM4-80GB", 4, 81920);
        node.sharing = crate::inventory::Sharing::PerGpu;
        ext.set_node("n1", Some(node));
        // GPU 2 held by a reservation, in the ledger and in the reservations' watch.
        let t = crate::reservation::Template {
            image: "gpu-share:test".into(),
            ..Default::default()
        };
        let mut r = crate::reservation::pod("n1", 2, false, &t);
        r["metadata"]["uid"] = json!("r-1");
        r["status"] = json!({"phase": "Running"});
        if ready {
            r["metadata"]["annotations"]["gpu-share.io/gpu-uuid"] = json!(uuid);
        }
        let r: Pod = serde_json::from_value(r).unwrap();
        ext.record(&ledger::observed_holding(&r).unwrap().unwrap());
        let (store, mut writer) = kube::runtime::reflector::store::<Pod>();
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(r));
        ext.reservations.watch(store);
        let share = per_gpu_share();
        ext.remember_pod("u-1", Arc::new(ledger::BindPod::of(&share)));
        let ext = Arc::new(ext);
        state.extender = Some(ext.clone());
        let server = tokio::spawn(async move {
            let (req, send) = h.next_request().await.unwrap();
            assert_eq!(req.uri().path(), "/api/v1/namespaces/ml/pods/p/binding");
            send.send_response(respond(201, status(201, "")));
            let (req, send) = h.next_request().await?;
            let path = req.uri().path().to_string();
            let body = req.into_body().collect_bytes().await.unwrap();
            let cm: Value = serde_json::from_slice(&body).unwrap();
            send.send_response(respond(201, cm.clone()));
            Some((path, cm))
        });
        bind(&state, &ext, &args()).await.unwrap();
        assert_eq!(
            ext.ledger().holding("u-1").unwrap().placement.gpus,
            [(2, 300)],
            "the share goes to the held GPU"
        );
        drop(state);
        drop(ext);
        let filled = server.await.unwrap();
        if !ready {
            assert_eq!(filled, None, "nothing to fill while the reservation starts");
            continue;
        }
        let (path, cm) = filled.expect("a ConfigMap created at bind");
        assert_eq!(path, "/api/v1/namespaces/ml/configmaps");
        assert_eq!(cm["metadata"]["name"], "gpu-share-devices-a1");
        assert_eq!(cm["data"]["NVIDIA_VISIBLE_DEVICES"], uuid);
        assert_eq!(cm["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(cm["immutable"], true);
    }
}

/// A failed binding call is read back unless the API refused it: a conflict, a server error or
/// no answer may have bound the pod all the same.
#[test]
fn only_a_refusal_is_not_read_back() {
    let api = |code| {
        BindCallError::Api(kube::Error::Api(
            kube::core::Status::failure("", "").with_code(code).boxed(),
        ))
    };
    for (why, read) in [
        (api(403), false),
        (api(404), false),
        (api(422), false),
        (api(409), true),
        (api(500), true),
        (api(503), true),
        (BindCallError::Unanswered, true),
    ] {
        assert_eq!(read_back_needed(&why), read, "{why}");
    }
}

/// `--dev` carries a decision out with no API: a share in per-GPU form is held and bound, no
/// reservation is decided (nothing would create it, and no stand-in waits for one), and a pod
/// filter never saw is refused in words rather than read.
#[tokio::test]
async fn dev_binds_without_an_api() {
    let state = Context::dev(Policy::default_policy());
    let ext = state.extender.clone().unwrap();
    let mut node = GpuNode::whole("n1", "NVIDIA-A100-SXM4-80GB", 2, 81920);
    node.sharing = crate::inventory::Sharing::PerGpu;
    ext.set_node("n1", Some(node));
    let e = bind(&state, &ext, &args()).await.unwrap_err().to_string();
    assert!(e.contains("was not seen in filter or prioritize"), "{e}");
    ext.remember_pod("u-1", Arc::new(ledger::BindPod::of(&per_gpu_share())));
    let decision = decide(
        &ext,
        &state.policy.current(),
        &state.reservations,
        &ext.remembered_pod("u-1").unwrap(),
        "n1",
        Dev::ASKS_API,
    )
    .unwrap();
    assert!(decision.create.is_none(), "no reservation without an API");
    decision.abort();
    bind(&state, &ext, &args()).await.unwrap();
    assert_eq!(ext.ledger().uids(), ["u-1"], "the share alone, no stand-in");
    assert_eq!(ext.ledger().node_of("u-1").as_deref(), Some("n1"));
}

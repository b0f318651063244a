//! `POST /scheduler/bind`: reserve on the node's ledger, bind through the API, and settle what
//! the ledger holds by how the binding call ended (accepted, refused, or unknown: read back, and
//! held in doubt while the read gets no answer either).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};

use super::Context;
use super::handlers::{BindPlan, HoldError, NOT_SYNCED, begin, hold_for_bind};
use super::state::{ExtenderState, Mode};
use super::wire::{self, ExtenderBindingArgs, ExtenderBindingResult};
use crate::cluster::reservation_api as api;
use crate::ledger;

pub async fn bind_handler(State(state): State<Context>, body: Bytes) -> Response {
    let start = Instant::now();
    let (ext, args) = match begin(&state, "bind", start, wire::parse_binding(&body)) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let error = match bind(&state, ext, &args).await {
        Ok(()) => String::new(),
        Err(e) => e.to_string(),
    };
    let outcome = if error.is_empty() { "ok" } else { "error" };
    state.metrics.observe("bind", outcome, start.elapsed());
    if !error.is_empty() {
        tracing::warn!(pod = %format!("{}/{}", args.pod_namespace, args.pod_name), node = %args.node, error = %error, "bind refused");
    }
    axum::Json(ExtenderBindingResult { error }).into_response()
}

/// Why a bind did not happen, in words (sent in the reply's `Error` field).
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("{NOT_SYNCED}")]
    NotSynced,
    #[error("bind request for {key:?} names no pod or no node")]
    NoPodOrNode { key: String },
    #[error("cannot read pod {key} to bind it: no answer within {} s", BIND_READBACK_TIMEOUT.as_secs())]
    ReadTimeout { key: String },
    #[error("cannot read pod {key} to bind it: {source}")]
    Read {
        key: String,
        #[source]
        source: kube::Error,
    },
    #[error("pod {key} has UID {found:?}, not {asked:?}: it was replaced")]
    Replaced {
        key: String,
        found: String,
        asked: String,
    },
    #[error("cannot resolve pod {key} (UID {uid}): it was not seen in filter or prioritize")]
    Unseen { key: String, uid: String },
    #[error(transparent)]
    Hold(#[from] HoldError),
    #[error(
        "cannot bind pod {key} to {node}: the reservation of its GPU {gpu} was not created: {source}"
    )]
    Reservation {
        key: String,
        node: String,
        gpu: u32,
        #[source]
        source: crate::cluster::reservation_api::CreateError,
    },
    #[error(
        "binding pod {key} to {node}: {source}, and the pod could not be read back ({read}): it stays held on {node} until the API shows whether the binding took"
    )]
    Unsettled {
        key: String,
        node: String,
        #[source]
        source: BindCallError,
        read: ReadBackError,
    },
    #[error(
        "pod {key} is in doubt: an earlier binding to {node} got no answer, and it stays held there until the API shows whether that binding took"
    )]
    InDoubt { key: String, node: String },
    #[error("binding pod {key} to {node} failed: {source}")]
    Failed {
        key: String,
        node: String,
        #[source]
        source: BindCallError,
    },
}

/// Why a pod could not be read back after a binding call that ended unknown.
#[derive(Debug, thiserror::Error)]
pub enum ReadBackError {
    #[error("no answer within {} s", BIND_READBACK_TIMEOUT.as_secs())]
    Unanswered,
    #[error(transparent)]
    Api(#[from] kube::Error),
}

/// How a binding call failed.
#[derive(Debug, thiserror::Error)]
pub enum BindCallError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("no answer within {} s", BIND_API_TIMEOUT.as_secs())]
    Unanswered,
}

async fn bind(
    state: &Context,
    ext: &ExtenderState,
    args: &ExtenderBindingArgs,
) -> Result<(), BindError> {
    if !ext.is_synced() {
        return Err(BindError::NotSynced);
    }
    let key = format!("{}/{}", args.pod_namespace, args.pod_name);
    if args.node.is_empty() || args.pod_name.is_empty() {
        return Err(BindError::NoPodOrNode { key });
    }
    if let Some(node) = ext.in_doubt(&args.pod_uid) {
        return Err(BindError::InDoubt { key, node });
    }
    // The API to bind through: none in `--dev`, where bind only records.
    let cluster = match (ext.mode(), &state.cluster) {
        (Mode::Cluster, Some(c)) => Some(c),
        _ => None,
    };
    let pod = match ext.seen_pod(&args.pod_uid) {
        Some(p) => p,
        None => match cluster {
            Some(c) => {
                let pod = tokio::time::timeout(
                    BIND_READBACK_TIMEOUT,
                    crate::cluster::binder::get_pod(
                        c.client(),
                        &args.pod_namespace,
                        &args.pod_name,
                    ),
                )
                .await
                .map_err(|_| BindError::ReadTimeout { key: key.clone() })?
                .map_err(|source| BindError::Read {
                    key: key.clone(),
                    source,
                })?;
                if !args.pod_uid.is_empty() && pod.metadata.uid.as_deref() != Some(&args.pod_uid) {
                    return Err(BindError::Replaced {
                        key,
                        found: pod.metadata.uid.unwrap_or_default(),
                        asked: args.pod_uid.clone(),
                    });
                }
                Arc::new(ledger::BindPod::of(&pod))
            }
            None => {
                return Err(BindError::Unseen {
                    key,
                    uid: args.pod_uid.clone(),
                });
            }
        },
    };
    let policy = state.policy.current();
    // Settled below: committed once the API has the binding, aborted when it failed. (An early
    // return reserved nothing.)
    let mut binding = ext.begin_bind(&args.pod_uid, &args.node, cluster.is_some());
    let (annotations, reservation) =
        match hold_for_bind(ext, &mut binding, &policy, &pod, &args.node)? {
            BindPlan::Plain => (BTreeMap::new(), None),
            BindPlan::Held {
                annotations,
                reservation,
            } => (annotations, reservation),
        };
    if let (Some(c), Some((gpu, mps))) = (cluster, reservation) {
        let mut template = (*state.reservations).clone();
        template.runtime_class = policy.policy.runtime_class_name.clone();
        // A time-sliced reservation writes its GPU's CDI device where the policy says so, or where
        // the share takes it (admitted while the policy said so).
        let takes = matches!(&pod.demand, Ok(Some(d)) if d.takes_cdi_device());
        template.cdi_device = !mps && (policy.policy.per_gpu.timeslice_cdi || takes);
        // Held for the reservation from before the create leaves: should this bind fail after
        // it, the reservation's pod exists, and its GPU must not look free until the watch
        // shows it.
        let scorer = ext.scorer(policy.policy.packing.policy.into());
        let on_its_way = match super::on_its_way::hold(
            ext,
            &scorer,
            &args.node,
            gpu,
            mps,
            template.cdi_device,
        ) {
            Ok(h) => h,
            Err(reason) => {
                binding.abort();
                return Err(BindError::Hold(HoldError::NoLongerFits {
                    node: args.node.clone(),
                    key,
                    reason,
                }));
            }
        };
        let created =
            crate::cluster::reservation_api::create(c.client(), &args.node, gpu, mps, &template)
                .await;
        on_its_way.settle(&created);
        if let Err(source) = created {
            binding.abort();
            return Err(BindError::Reservation {
                key,
                node: args.node.clone(),
                gpu,
                source,
            });
        }
    }
    if let Some(c) = cluster {
        let bound = tokio::time::timeout(
            BIND_API_TIMEOUT,
            crate::cluster::binder::bind_pod(
                c.client(),
                &args.pod_namespace,
                &args.pod_name,
                &args.pod_uid,
                &args.node,
                annotations,
            ),
        )
        .await;
        let failure = match bound {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some((BindOutcome::of(&e), BindCallError::Api(e))),
            Err(_) => Some((BindOutcome::Unknown, BindCallError::Unanswered)),
        };
        if let Some((outcome, why)) = failure {
            // A server error, a lost connection or no answer: the API may have bound the pod
            // all the same. Read it back rather than guess: releasing a binding that took
            // would free capacity a running pod holds.
            let read = match outcome {
                BindOutcome::Unknown => Some(
                    read_back(
                        c.client(),
                        &args.pod_namespace,
                        &args.pod_name,
                        &args.pod_uid,
                    )
                    .await,
                ),
                BindOutcome::Refused => None,
            };
            match read {
                Some(Ok(Some(n))) if n == args.node => {
                    tracing::warn!(pod = %key, node = %args.node, error = %why, "the binding call failed but the pod is bound there: kept");
                }
                // No answer to the read either: in doubt, held until the API answers.
                Some(Err(read)) => {
                    binding.doubt();
                    if let Some(ext) = state.extender.clone() {
                        resolve_later(ext, c.client().clone(), args, key.clone());
                    }
                    return Err(BindError::Unsettled {
                        key,
                        node: args.node.clone(),
                        source: why,
                        read,
                    });
                }
                _ => {
                    binding.abort();
                    return Err(BindError::Failed {
                        key,
                        node: args.node.clone(),
                        source: why,
                    });
                }
            }
        }
    }
    if binding.commit() {
        state.metrics.retried_first();
    }
    tracing::info!(pod = %key, node = %args.node, "bound");
    let per_gpu = matches!(&pod.demand, Ok(Some(d)) if d.devices.is_some());
    if let (Some(c), true) = (cluster, per_gpu) {
        fill_if_held(c.client(), ext, &args.pod_uid);
    }
    Ok(())
}

/// A share in per-GPU form bound to a GPU whose reservation has published its UUID gets its
/// devices ConfigMap at once, so kubelet starts its container without waiting for the
/// reservation controller's next tick. The controller fills whatever this does not (a share
/// whose reservation is still starting, a create that failed), and handles a ConfigMap of that
/// name that is not this one.
fn fill_if_held(client: &kube::Client, ext: &ExtenderState, uid: &str) {
    let Some(h) = ext.ledger().holding(uid) else {
        return;
    };
    let (Some(devices), [(gpu, _)]) = (h.demand.devices, h.placement.gpus.as_slice()) else {
        return;
    };
    let Some(reservation) = ext.reservations.ready(&h.node, *gpu) else {
        return;
    };
    let Some(uuid) = reservation.state.uuid().map(str::to_string) else {
        return;
    };
    let gpu_memory = ext
        .ledger()
        .with_node(&h.node, |nl| nl.node.gpu_memory_mib)
        .flatten();
    // What does not match (a share of the other class, an MPS share with no limit to give, a
    // share that takes a CDI device its reservation did not write) is the controller's to
    // handle, in words.
    let kind = crate::reservation::plan::ShareKind::of(&h.demand.gpu, &devices, gpu_memory);
    let Ok(through) = kind.through(&reservation.at(std::time::SystemTime::now())) else {
        return;
    };
    let to = crate::reservation::view::Pointing { uuid, through };
    let (configmap, reservation) = (devices.configmap, reservation.name);
    let owner = crate::reservation::view::Owner {
        namespace: h.pod.namespace,
        name: h.pod.name,
        uid: h.pod.uid,
    };
    let client = client.clone();
    tokio::spawn(async move {
        let pod = format!("{}/{}", owner.namespace, owner.name);
        match api::fill(&client, &configmap, &owner, &to, &reservation).await {
            Ok(api::Fill::Done) => {
                tracing::info!(pod, devices = %to.devices(), "share pointed at its GPU at bind")
            }
            Ok(api::Fill::Foreign(what)) => {
                tracing::warn!(
                    pod,
                    configmap,
                    what,
                    "a devices ConfigMap of that name exists; the reservation controller handles the share"
                )
            }
            Err(e) => {
                tracing::warn!(pod, error = %e, "cannot point the share at its GPU at bind; the reservation controller tries again")
            }
        }
    });
}

/// How long bind waits for the API server's answer to a binding: within kube-scheduler's 5 s
/// `httpTimeout` for the extender, with room to read the pod back.
pub const BIND_API_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);
/// How long reading a pod back after an unanswered binding may take.
const BIND_READBACK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// What a failed binding call says about the binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BindOutcome {
    /// The API refused it (a 4xx other than 409): nothing was bound.
    Refused,
    /// A server error, a transport error, no answer, or a conflict: it may be bound.
    Unknown,
}

impl BindOutcome {
    fn of(e: &kube::Error) -> Self {
        match e {
            // 409: already bound, perhaps by this very binding's earlier try that ended unknown:
            // read back which node.
            kube::Error::Api(s) if s.code == 409 => BindOutcome::Unknown,
            kube::Error::Api(s) if (400..500).contains(&s.code) => BindOutcome::Refused,
            _ => BindOutcome::Unknown,
        }
    }
}

/// Where the API has pod `uid`: the node it is bound to, `None` if unbound, gone or replaced;
/// `Err` when the API gave no answer.
async fn read_back(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    uid: &str,
) -> Result<Option<String>, ReadBackError> {
    let pod = match tokio::time::timeout(
        BIND_READBACK_TIMEOUT,
        crate::cluster::binder::get_pod(client, namespace, name),
    )
    .await
    {
        Err(_) => return Err(ReadBackError::Unanswered),
        Ok(Err(kube::Error::Api(s))) if s.code == 404 => return Ok(None),
        Ok(Err(e)) => return Err(e.into()),
        Ok(Ok(pod)) => pod,
    };
    if pod.metadata.uid.as_deref() != Some(uid) {
        return Ok(None);
    }
    Ok(pod.spec.and_then(|s| s.node_name).filter(|n| !n.is_empty()))
}

/// How often a pod in doubt is read again.
const DOUBT_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// Reads a pod in doubt back every second until the API answers (or its assumption is gone:
/// the watch recorded it, or it expired), and settles what the ledger holds by the answer.
fn resolve_later(
    ext: Arc<ExtenderState>,
    client: kube::Client,
    args: &ExtenderBindingArgs,
    key: String,
) {
    let (namespace, name, uid) = (
        args.pod_namespace.clone(),
        args.pod_name.clone(),
        args.pod_uid.clone(),
    );
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(DOUBT_RETRY).await;
            if ext.assumption(&uid).is_none() {
                ext.resolve(&uid, None);
                return;
            }
            if let Ok(bound) = read_back(&client, &namespace, &name, &uid).await {
                tracing::info!(pod = %key, bound = bound.as_deref().unwrap_or("nowhere"), "a binding in doubt is settled by reading the pod back");
                ext.resolve(&uid, bound.as_deref());
                return;
            }
        }
    });
}

#[cfg(test)]
mod tests {
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
        let (r, held) =
            answered_then_read_back(500, "etcdserver: request timed out", Some("n1")).await;
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
            ledger::PodRef {
                uid: "w".into(),
                namespace: "ml".into(),
                name: "w".into(),
                priority: 0,
                holder: ledger::Holder::Pod,
            },
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
            ext.ledger()
                .record(&ledger::observed_holding(&r).unwrap().unwrap());
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
}

//! What carries the extender's decisions out: the API server in a cluster ([`Api`]), nothing in
//! `--dev` ([`Dev`]). Bind ([`super::bind`]), the reservation controller
//! ([`super::reservation_controller`]), the defragmentation controller and the requeuer decide
//! over the cache and say what to do; an executor does it, bounded in time where the verb has a
//! deadline, and hands the answers back. A bind's calls go out together
//! ([`Executor::carry_out_bind`]: its reservation, the binding, and the pod read back where the
//! binding's outcome is unknown), so a bind leaves the cache once and comes back once. What an
//! answer means is the decision's to say.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::OnceLock;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::{Recorder, Reporter};
use serde_json::{Value, json};

use super::bind::calls::{BindAnswers, BindCalls, Ended, read_back_needed};
use super::bind::error::{BIND_API_TIMEOUT, BIND_READBACK_TIMEOUT, BindCallError, ReadBackError};
pub use crate::cluster::eviction::Evicted;
use crate::cluster::reservation_api::{self as api, CreateError};
use crate::reservation::Template;
use crate::reservation::view::{Owner, Pointing};

/// The annotation that nudges a pod waiting for GPU capacity back into kube-scheduler's queue:
/// an update of an unschedulable pod moves it out of the unschedulable queue (pods rejected by
/// an extender name no in-tree plugin, so any update requeues them), instead of waiting for the
/// 5-minute flush.
pub const ANNOTATION_REQUEUE: &str = "gpu-share.io/requeued-at";

/// Pointing a share at its GPU: its devices ConfigMap, whom it belongs to, and the reservation
/// whose GPU it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fill {
    pub configmap: String,
    pub owner: Owner,
    pub to: Pointing,
    pub reservation: String,
}

/// The I/O the extender's decisions need. A cluster's is the API server; `--dev`'s asks nothing
/// and binds at once.
pub trait Executor: Clone + Send + Sync + 'static {
    /// Whether there is an API to ask: a watch then shows what a binding did (the holding is
    /// assumed until it does), and a share's reservation is created. `--dev` has neither.
    const ASKS_API: bool;

    /// Reads a pod (a bind for a pod filter never saw, and reading back a binding whose outcome
    /// is unknown).
    fn get_pod(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Pod, ReadBackError>> + Send;

    /// Binds pod `uid` to `node`, writing `annotations` onto it.
    fn bind_pod(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        node: &str,
        annotations: BTreeMap<String, String>,
    ) -> impl Future<Output = Result<(), BindCallError>> + Send;

    /// Creates GPU `gpu`'s reservation on `node`: the pod as created, or `None` where it
    /// existed.
    fn create_reservation(
        &self,
        node: &str,
        gpu: u32,
        mps: bool,
        template: &Template,
    ) -> impl Future<Output = Result<Option<Pod>, CreateError>> + Send;

    /// Deletes reservation `name`, the pod `uid` (not a later one of the same name); one already
    /// gone is deleted.
    fn delete_reservation(
        &self,
        name: &str,
        uid: &str,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;

    /// Creates a share's devices ConfigMap, pointing it at its GPU.
    fn fill(&self, fill: &Fill) -> impl Future<Output = Result<api::Fill, kube::Error>> + Send;

    /// Writes annotation `key` on pod `namespace/name` (`None`: removes it).
    fn annotate(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: Option<&str>,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;

    /// Deletes share `owner` (this pod only), with a warning event saying why; one already gone
    /// is deleted. For a share that cannot run where it is (its reservation failed, its devices
    /// ConfigMap is foreign): a PodDisruptionBudget protects pods that run, and this one does not.
    fn delete_share(
        &self,
        owner: &Owner,
        why: &str,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;

    /// Evicts running pod `owner` (this pod only) through the Eviction API, so that its
    /// PodDisruptionBudgets hold: `Ok(Evicted::Refused)` with the API's words where a budget
    /// allows no disruption now (429); one already gone is evicted.
    fn evict(&self, owner: &Owner) -> impl Future<Output = Result<Evicted, kube::Error>> + Send;

    /// Records an event on pod `owner`, reporting `action` for `reason` (logged, not fatal,
    /// when it cannot be recorded).
    fn note(
        &self,
        owner: &Owner,
        warning: bool,
        action: &str,
        reason: &str,
        note: &str,
    ) -> impl Future<Output = ()> + Send;

    /// Carries a bind's calls out in their order: creates the reservation, binds the pod only
    /// once the create did not fail, and reads the pod back where the binding's outcome is
    /// unknown ([`read_back_needed`]).
    fn carry_out_bind(&self, calls: BindCalls) -> impl Future<Output = BindAnswers> + Send {
        async move {
            let created = match &calls.reservation {
                Some(r) => match self
                    .create_reservation(&calls.node, r.gpu, r.mps, &r.template)
                    .await
                {
                    Ok(pod) => Some(Box::new(pod)),
                    Err(error) => return BindAnswers::NotCreated { gpu: r.gpu, error },
                },
                None => None,
            };
            let BindCalls {
                namespace,
                name,
                uid,
                node,
                annotations,
                ..
            } = calls;
            let ended = match self
                .bind_pod(&namespace, &name, &uid, &node, annotations)
                .await
            {
                Ok(()) => Ended::Bound,
                Err(why) => {
                    let read = if read_back_needed(&why) {
                        Some(self.read_back(&namespace, &name, &uid).await)
                    } else {
                        None
                    };
                    Ended::Failed { why, read }
                }
            };
            BindAnswers::Tried { created, ended }
        }
    }

    /// Where the API has pod `uid`: the node it is bound to, `None` if unbound, gone or
    /// replaced; `Err` when the API gave no answer.
    fn read_back(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> impl Future<Output = Result<Option<String>, ReadBackError>> + Send {
        async move {
            let pod = match self.get_pod(namespace, name).await {
                Err(ReadBackError::Api(kube::Error::Api(s))) if s.code == 404 => return Ok(None),
                Err(e) => return Err(e),
                Ok(pod) => pod,
            };
            if pod.metadata.uid.as_deref() != Some(uid) {
                return Ok(None);
            }
            Ok(pod.spec.and_then(|s| s.node_name).filter(|n| !n.is_empty()))
        }
    }
}

/// The Binding object for a pod (with the pod's UID as a precondition, and the annotations the
/// API server copies onto the pod).
pub fn binding_body(
    namespace: &str,
    name: &str,
    uid: &str,
    node: &str,
    annotations: &BTreeMap<String, String>,
) -> Value {
    let mut metadata = json!({ "name": name, "namespace": namespace });
    if !uid.is_empty() {
        metadata["uid"] = json!(uid);
    }
    if !annotations.is_empty() {
        metadata["annotations"] = json!(annotations);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": metadata,
        "target": { "apiVersion": "v1", "kind": "Node", "name": node },
    })
}

/// The API server's executor, and the recorder of the events it writes (made at the first
/// event: a bind's executor, made per bind, writes none).
#[derive(Clone)]
pub struct Api {
    client: kube::Client,
    /// The client evictions go through: one that does not retry a 429
    /// ([`crate::cluster::eviction::client`]), where one was given.
    evictions: Option<kube::Client>,
    recorder: OnceLock<Recorder>,
}

impl Api {
    pub fn new(client: kube::Client) -> Self {
        Api {
            client,
            evictions: None,
            recorder: OnceLock::new(),
        }
    }

    /// Evictions go through `client` ([`crate::cluster::eviction::client`]).
    pub fn evicting_with(self, client: kube::Client) -> Self {
        Api {
            evictions: Some(client),
            ..self
        }
    }

    fn pods(&self, namespace: &str) -> kube::Api<Pod> {
        kube::Api::namespaced(self.client.clone(), namespace)
    }

    /// Events are reported as `gpu-share-scheduler`, instance `POD_NAME` (else the host name).
    fn recorder(&self) -> &Recorder {
        self.recorder
            .get_or_init(|| Recorder::new(self.client.clone(), reporter().clone()))
    }
}

/// Who writes the extender's events.
fn reporter() -> &'static Reporter {
    static REPORTER: OnceLock<Reporter> = OnceLock::new();
    REPORTER.get_or_init(|| Reporter {
        controller: "gpu-share-scheduler".into(),
        instance: std::env::var("POD_NAME")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok()),
    })
}

impl Executor for Api {
    const ASKS_API: bool = true;

    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Pod, ReadBackError> {
        let pods = self.pods(namespace);
        tokio::time::timeout(BIND_READBACK_TIMEOUT, pods.get(name))
            .await
            .map_err(|_| ReadBackError::Unanswered)?
            .map_err(ReadBackError::Api)
    }

    async fn bind_pod(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        node: &str,
        annotations: BTreeMap<String, String>,
    ) -> Result<(), BindCallError> {
        let body = binding_body(namespace, name, uid, node, &annotations);
        let pods = self.pods(namespace);
        let params = PostParams::default();
        let post = pods.create_subresource::<_, Value>("binding", name, &params, &body);
        tokio::time::timeout(BIND_API_TIMEOUT, post)
            .await
            .map_err(|_| BindCallError::Unanswered)?
            .map(drop)
            .map_err(BindCallError::Api)
    }

    async fn create_reservation(
        &self,
        node: &str,
        gpu: u32,
        mps: bool,
        template: &Template,
    ) -> Result<Option<Pod>, CreateError> {
        api::create(&self.client, node, gpu, mps, template).await
    }

    async fn delete_reservation(&self, name: &str, uid: &str) -> Result<(), kube::Error> {
        api::delete(&self.client, name, uid).await
    }

    async fn fill(&self, fill: &Fill) -> Result<api::Fill, kube::Error> {
        api::fill(
            &self.client,
            &fill.configmap,
            &fill.owner,
            &fill.to,
            &fill.reservation,
        )
        .await
    }

    async fn annotate(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: Option<&str>,
    ) -> Result<(), kube::Error> {
        let patch = json!({ "metadata": { "annotations": { key: value } } });
        self.pods(namespace)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(drop)
    }

    async fn delete_share(&self, owner: &Owner, why: &str) -> Result<(), kube::Error> {
        api::delete_share(self.recorder(), &self.client, owner, why).await
    }

    async fn evict(&self, owner: &Owner) -> Result<Evicted, kube::Error> {
        let client = self.evictions.as_ref().unwrap_or(&self.client);
        crate::cluster::eviction::evict(client, owner).await
    }

    async fn note(&self, owner: &Owner, warning: bool, action: &str, reason: &str, note: &str) {
        api::note(self.recorder(), owner, warning, action, reason, note).await
    }
}

/// `--dev`'s executor: no API. A bind holds capacity and is done; a pod filter never saw cannot
/// be read. It is never asked for the rest: without an API, bind decides no reservation, and no
/// reservation controller runs.
#[derive(Clone, Copy)]
pub struct Dev;

impl Executor for Dev {
    const ASKS_API: bool = false;

    async fn get_pod(&self, _: &str, _: &str) -> Result<Pod, ReadBackError> {
        Err(ReadBackError::NoApi)
    }

    async fn bind_pod(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: &str,
        _: BTreeMap<String, String>,
    ) -> Result<(), BindCallError> {
        Ok(())
    }

    async fn create_reservation(
        &self,
        _: &str,
        _: u32,
        _: bool,
        _: &Template,
    ) -> Result<Option<Pod>, CreateError> {
        Ok(None)
    }

    async fn delete_reservation(&self, _: &str, _: &str) -> Result<(), kube::Error> {
        Ok(())
    }

    async fn fill(&self, _: &Fill) -> Result<api::Fill, kube::Error> {
        Ok(api::Fill::Done)
    }

    async fn annotate(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: Option<&str>,
    ) -> Result<(), kube::Error> {
        Ok(())
    }

    async fn delete_share(&self, _: &Owner, _: &str) -> Result<(), kube::Error> {
        Ok(())
    }

    async fn evict(&self, _: &Owner) -> Result<Evicted, kube::Error> {
        // No pod runs in --dev, and no defragmentation controller.
        Ok(Evicted::Gone)
    }

    async fn note(&self, _: &Owner, _: bool, _: &str, _: &str, _: &str) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_binding_posts_the_binding_with_the_annotation() {
        let (client, mut handle) = crate::cluster::mock::client();
        let server = tokio::spawn(async move {
            let (req, send) = handle.next_request().await.expect("a request");
            assert_eq!(req.method(), http::Method::POST);
            assert_eq!(req.uri().path(), "/api/v1/namespaces/ml/pods/p/binding");
            let body = req.into_body().collect_bytes().await.unwrap();
            let v: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["kind"], "Binding");
            assert_eq!(v["metadata"]["uid"], "u-1");
            assert_eq!(v["metadata"]["annotations"]["gpu-share.io/gpus"], "1:250");
            assert_eq!(v["target"]["name"], "gpu-a");
            assert_eq!(v["target"]["kind"], "Node");
            send.send_response(crate::cluster::mock::text(
                201,
                br#"{"kind":"Status","apiVersion":"v1","status":"Success","code":201}"#.to_vec(),
            ));
        });
        Api::new(client)
            .bind_pod(
                "ml",
                "p",
                "u-1",
                "gpu-a",
                [("gpu-share.io/gpus".to_string(), "1:250".to_string())].into(),
            )
            .await
            .unwrap();
        server.await.unwrap();
    }

    #[tokio::test]
    async fn a_conflict_is_an_error() {
        let (client, mut handle) = crate::cluster::mock::client();
        let server = tokio::spawn(async move {
            let (_req, send) = handle.next_request().await.expect("a request");
            send.send_response(crate::cluster::mock::text(
                409,
                br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"pod p is already assigned to node \"gpu-b\"","reason":"Conflict","code":409}"#
                    .to_vec(),
            ));
        });
        let err = Api::new(client)
            .bind_pod("ml", "p", "u-1", "gpu-a", BTreeMap::new())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("already assigned"), "{err}");
        server.await.unwrap();
    }

    #[tokio::test]
    async fn a_nudge_patches_the_annotation() {
        let (client, mut handle) = crate::cluster::mock::client();
        let server = tokio::spawn(async move {
            let (req, send) = handle.next_request().await.expect("a request");
            assert_eq!(req.method(), http::Method::PATCH);
            assert_eq!(req.uri().path(), "/api/v1/namespaces/ml/pods/waiting");
            assert_eq!(
                req.headers()["content-type"],
                "application/merge-patch+json"
            );
            let body = req.into_body().collect_bytes().await.unwrap();
            let v: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["metadata"]["annotations"][ANNOTATION_REQUEUE], "t1");
            send.send_response(crate::cluster::mock::text(
                200,
                br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"waiting","namespace":"ml"}}"#
                    .to_vec(),
            ));
        });
        Api::new(client)
            .annotate("ml", "waiting", ANNOTATION_REQUEUE, Some("t1"))
            .await
            .unwrap();
        server.await.unwrap();
    }
}

//! What carries the extender's decisions out: the API server in a cluster ([`Api`]), nothing in
//! `--dev` ([`Dev`]). Bind ([`super::bind`]) and the reservation controller
//! ([`super::reservation_controller`]) decide over the cache and say what to do; an executor
//! does it, one request per call, bounded in time where the verb has a deadline. What an answer
//! means is the decision's to say.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::OnceLock;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::events::{Recorder, Reporter};

use super::bind::error::{BIND_API_TIMEOUT, BIND_READBACK_TIMEOUT, BindCallError, ReadBackError};
use crate::cluster::reservation_api::{self as api, CreateError};
use crate::reservation::Template;
use crate::reservation::view::{Owner, Pointing};

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

    /// Writes annotation `key` on pod `namespace/name`.
    fn annotate(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: &str,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;

    /// Evicts pod `owner` (this pod only), with a warning event saying why; one already gone is
    /// evicted.
    fn evict(
        &self,
        owner: &Owner,
        why: &str,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;

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
}

/// The API server's executor, and the recorder of the events it writes (made at the first
/// event: a bind's executor, made per bind, writes none).
#[derive(Clone)]
pub struct Api {
    client: kube::Client,
    recorder: OnceLock<Recorder>,
}

impl Api {
    pub fn new(client: kube::Client) -> Self {
        Api {
            client,
            recorder: OnceLock::new(),
        }
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
        tokio::time::timeout(
            BIND_READBACK_TIMEOUT,
            crate::cluster::binder::get_pod(&self.client, namespace, name),
        )
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
        tokio::time::timeout(
            BIND_API_TIMEOUT,
            crate::cluster::binder::bind_pod(&self.client, namespace, name, uid, node, annotations),
        )
        .await
        .map_err(|_| BindCallError::Unanswered)?
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
        value: &str,
    ) -> Result<(), kube::Error> {
        crate::cluster::binder::annotate(&self.client, namespace, name, key, value).await
    }

    async fn evict(&self, owner: &Owner, why: &str) -> Result<(), kube::Error> {
        api::evict(self.recorder(), &self.client, owner, why).await
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

    async fn annotate(&self, _: &str, _: &str, _: &str, _: &str) -> Result<(), kube::Error> {
        Ok(())
    }

    async fn evict(&self, _: &Owner, _: &str) -> Result<(), kube::Error> {
        Ok(())
    }

    async fn note(&self, _: &Owner, _: bool, _: &str, _: &str, _: &str) {}
}

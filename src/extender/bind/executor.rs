//! What carries bind's decision out: the API in a cluster, nothing in `--dev`. Each call is one
//! request, bounded in time; what its answer means is the decision's to say.

use std::collections::BTreeMap;
use std::future::Future;

use k8s_openapi::api::core::v1::Pod;

use super::decision::Fill;
use super::error::{BIND_API_TIMEOUT, BIND_READBACK_TIMEOUT, BindCallError, ReadBackError};
use crate::cluster::reservation_api::{self as api, CreateError};
use crate::reservation::Template;

/// The I/O a bind needs. A cluster's is the API server; `--dev`'s asks nothing and binds at
/// once.
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

    /// Creates GPU `gpu`'s reservation on `node`: the pod as created, or `None` where it
    /// existed.
    fn create_reservation(
        &self,
        node: &str,
        gpu: u32,
        mps: bool,
        template: &Template,
    ) -> impl Future<Output = Result<Option<Pod>, CreateError>> + Send;

    /// Binds pod `uid` to `node`, writing `annotations` onto it.
    fn bind_pod(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        node: &str,
        annotations: BTreeMap<String, String>,
    ) -> impl Future<Output = Result<(), BindCallError>> + Send;

    /// Points a share at its GPU (in the background: the bind's answer does not wait for it).
    fn fill(&self, fill: Fill);
}

/// The API server's executor.
#[derive(Clone)]
pub struct Api(pub kube::Client);

impl Executor for Api {
    const ASKS_API: bool = true;

    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Pod, ReadBackError> {
        tokio::time::timeout(
            BIND_READBACK_TIMEOUT,
            crate::cluster::binder::get_pod(&self.0, namespace, name),
        )
        .await
        .map_err(|_| ReadBackError::Unanswered)?
        .map_err(ReadBackError::Api)
    }

    async fn create_reservation(
        &self,
        node: &str,
        gpu: u32,
        mps: bool,
        template: &Template,
    ) -> Result<Option<Pod>, CreateError> {
        api::create(&self.0, node, gpu, mps, template).await
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
            crate::cluster::binder::bind_pod(&self.0, namespace, name, uid, node, annotations),
        )
        .await
        .map_err(|_| BindCallError::Unanswered)?
        .map_err(BindCallError::Api)
    }

    fn fill(&self, fill: Fill) {
        let client = self.0.clone();
        tokio::spawn(async move {
            let Fill {
                configmap,
                owner,
                to,
                reservation,
            } = fill;
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
}

/// `--dev`'s executor: no API. A bind holds capacity and is done; a pod filter never saw cannot
/// be read.
#[derive(Clone, Copy)]
pub struct Dev;

impl Executor for Dev {
    const ASKS_API: bool = false;

    async fn get_pod(&self, _: &str, _: &str) -> Result<Pod, ReadBackError> {
        Err(ReadBackError::NoApi)
    }

    async fn create_reservation(
        &self,
        _: &str,
        _: u32,
        _: bool,
        _: &Template,
    ) -> Result<Option<Pod>, CreateError> {
        // Never asked: without an API, bind decides no reservation.
        Ok(None)
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

    fn fill(&self, _: Fill) {}
}

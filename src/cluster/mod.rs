//! Kubernetes I/O: the facts the webhook needs (namespace labels, RuntimeClass existence), each
//! cached with moka so the webhook costs the API server at most one read per TTL.

pub mod certs;
pub mod dra;
pub mod eviction;
pub mod leadership;
#[cfg(test)]
pub mod mock;
pub mod quotas;
pub mod reservation_api;
pub mod skew;
pub mod watch;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::ListParams;
use kube::{Api, Client};
use moka::future::Cache;

use crate::inventory::{self, MigOffers, Reading};

/// How long namespace labels and RuntimeClass answers are trusted.
pub const NAMESPACE_TTL: Duration = Duration::from_secs(30);
pub const RUNTIME_CLASS_TTL: Duration = Duration::from_secs(60);
/// How long the nodes' MIG forms are trusted: a node pool changing its MIG strategy is seen by
/// new pods within this.
pub const MIG_OFFERS_TTL: Duration = Duration::from_secs(30);

/// Cached lookups against the API server.
#[derive(Clone)]
pub struct ClusterFacts {
    client: Client,
    namespaces: Cache<String, BTreeMap<String, String>>,
    runtime_classes: Cache<String, bool>,
    mig_offers: Cache<(), Arc<MigOffers>>,
}

impl ClusterFacts {
    pub fn new(client: Client) -> Self {
        ClusterFacts {
            client,
            namespaces: Cache::builder()
                .max_capacity(10_000)
                .time_to_live(NAMESPACE_TTL)
                .build(),
            runtime_classes: Cache::builder()
                .max_capacity(100)
                .time_to_live(RUNTIME_CLASS_TTL)
                .build(),
            mig_offers: Cache::builder()
                .max_capacity(1)
                .time_to_live(MIG_OFFERS_TTL)
                .build(),
        }
    }

    /// In which form the cluster's MIG nodes offer each profile (the nodes' part cached): the
    /// nodes GPU Feature Discovery labels with a MIG strategy, and GKE's partitioned ones, read
    /// with `reading`, and the pools `reading`'s `nodeModes` declare. Errors are not cached.
    pub async fn mig_offers(&self, reading: &Reading) -> Result<Arc<MigOffers>, Arc<kube::Error>> {
        let api: Api<Node> = Api::all(self.client.clone());
        let nodes_only = Reading {
            declared: Vec::new(),
            ..reading.clone()
        };
        let cached = self
            .mig_offers
            .try_get_with((), async move {
                let mut nodes = Vec::new();
                for label in [
                    inventory::LABEL_MIG_STRATEGY,
                    inventory::LABEL_GKE_PARTITION,
                ] {
                    nodes.extend(api.list(&ListParams::default().labels(label)).await?.items);
                }
                Ok(Arc::new(MigOffers::of_cluster(&nodes, &nodes_only)))
            })
            .await?;
        if reading.declared.is_empty() {
            return Ok(cached);
        }
        let mut offers = (*cached).clone();
        offers.declare(&reading.declared);
        Ok(Arc::new(offers))
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The labels of a namespace (cached). Errors are not cached.
    pub async fn namespace_labels(
        &self,
        name: &str,
    ) -> Result<BTreeMap<String, String>, Arc<kube::Error>> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let name = name.to_string();
        self.namespaces
            .try_get_with(name.clone(), async move {
                api.get(&name)
                    .await
                    .map(|ns| ns.metadata.labels.unwrap_or_default())
            })
            .await
    }

    /// Whether a RuntimeClass exists (cached): `Some(exists)`, or `None` when the lookup failed
    /// (not cached).
    pub async fn runtime_class(&self, name: &str) -> Option<bool> {
        if let Some(exists) = self.runtime_classes.get(name).await {
            return Some(exists);
        }
        let api: Api<RuntimeClass> = Api::all(self.client.clone());
        match api.get_opt(name).await {
            Ok(found) => {
                self.runtime_classes
                    .insert(name.to_string(), found.is_some())
                    .await;
                Some(found.is_some())
            }
            Err(e) => {
                tracing::warn!(error = %e, runtime_class = name, "cannot look up RuntimeClass");
                None
            }
        }
    }

    /// One cheap call that proves the API server answers (for readiness).
    pub async fn ping(&self) -> Result<(), kube::Error> {
        self.client.apiserver_version().await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::mock::{self as api, Handle};
    use http::Response;
    use kube::client::Body;

    fn mock() -> (ClusterFacts, Handle) {
        let (client, handle) = api::client();
        (ClusterFacts::new(client), handle)
    }

    fn json(status: u16, body: serde_json::Value) -> Response<Body> {
        api::json(status, &body)
    }

    #[tokio::test]
    async fn namespace_labels_are_read_once_then_cached() {
        let (facts, mut handle) = mock();
        let server = tokio::spawn(async move {
            let (req, send) = handle.next_request().await.expect("one request");
            assert_eq!(req.uri().path(), "/api/v1/namespaces/ml");
            send.send_response(json(
                200,
                serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": "ml", "labels": {"pod-security.kubernetes.io/enforce": "baseline"}}}),
            ));
            // No second request may arrive: the next call is served from the cache.
            let more =
                tokio::time::timeout(Duration::from_millis(200), handle.next_request()).await;
            assert!(
                more.is_err() || more.unwrap().is_none(),
                "the cache was bypassed"
            );
        });
        let labels = facts.namespace_labels("ml").await.unwrap();
        assert_eq!(labels["pod-security.kubernetes.io/enforce"], "baseline");
        let again = facts.namespace_labels("ml").await.unwrap();
        assert_eq!(again, labels);
        drop(facts);
        server.await.unwrap();
    }

    #[tokio::test]
    async fn runtime_class_missing_and_errors() {
        let (facts, mut handle) = mock();
        let server = tokio::spawn(async move {
            let (req, send) = handle.next_request().await.unwrap();
            assert_eq!(
                req.uri().path(),
                "/apis/node.k8s.io/v1/runtimeclasses/nvidia"
            );
            send.send_response(json(
                404,
                serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "message": "runtimeclasses.node.k8s.io \"nvidia\" not found", "reason": "NotFound", "code": 404}),
            ));
            let (_, send) = handle.next_request().await.unwrap();
            send.send_response(json(500, serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "boom", "reason": "InternalError", "code": 500})));
        });
        assert_eq!(facts.runtime_class("nvidia").await, Some(false));
        assert_eq!(facts.runtime_class("nvidia").await, Some(false), "cached");
        assert_eq!(
            facts.runtime_class("other").await,
            None,
            "a failed lookup is unknown"
        );
        server.await.unwrap();
    }
}

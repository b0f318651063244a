//! The Eviction API (`pods/eviction`): how defragmentation moves a running pod, so that every
//! PodDisruptionBudget over it holds. gpu-share never deletes a running pod to move it.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, EvictParams, Preconditions};
use kube::{Api, Client};

use crate::reservation::view::Owner;

/// How long one eviction may take before it counts as failed.
pub const EVICTION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// A client for evictions: the cluster's configuration, with no retries. The client's default
/// retries a 429 (up to 15 times, honouring `Retry-After`), and for an eviction a 429 is an
/// answer: a PodDisruptionBudget allows no disruption now, which the plan acts on at once.
pub async fn client() -> Result<Client, kube::Error> {
    let mut config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    config.default_retry = false;
    Client::try_from(config)
}

/// What the API answered an eviction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Evicted {
    /// Evicted: the pod is being deleted, and its controller makes a replacement.
    Done,
    /// Already gone (404), or another pod holds its name now (409, the UID precondition failed).
    Gone,
    /// Refused (429): a PodDisruptionBudget allows no disruption now. The API's words.
    Refused(String),
}

/// Evicts pod `owner` (this pod only: its UID is a precondition).
pub async fn evict(client: &Client, owner: &Owner) -> Result<Evicted, kube::Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &owner.namespace);
    let params = EvictParams {
        delete_options: Some(DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(owner.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        }),
        ..EvictParams::default()
    };
    let answer = tokio::time::timeout(EVICTION_TIMEOUT, api.evict(&owner.name, &params))
        .await
        .map_err(|_| {
            kube::Error::Service(
                format!(
                    "no answer to the eviction within {} s",
                    EVICTION_TIMEOUT.as_secs()
                )
                .into(),
            )
        })?;
    match answer {
        Ok(_) => Ok(Evicted::Done),
        Err(kube::Error::Api(s))
            if s.code == 404 || (s.code == 409 && s.message.contains("Precondition failed")) =>
        {
            Ok(Evicted::Gone)
        }
        Err(kube::Error::Api(s)) if s.code == 429 => Ok(Evicted::Refused(s.message)),
        Err(e) => Err(e),
    }
}

//! The Eviction API (`pods/eviction`): how defragmentation moves a running pod, so that every
//! PodDisruptionBudget over it holds. gpu-share never deletes a running pod to move it.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, EvictParams, Preconditions};
use kube::{Api, Client};

use crate::reservation::view::Owner;

/// What the API answered an eviction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Evicted {
    /// Evicted: the pod is being deleted, and its controller makes a replacement.
    Done,
    /// Already gone (404), or another pod holds its name now (the UID precondition failed, 409).
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
    match api.evict(&owner.name, &params).await {
        Ok(_) => Ok(Evicted::Done),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(Evicted::Gone),
        Err(kube::Error::Api(s)) if s.code == 429 => Ok(Evicted::Refused(s.message)),
        Err(e) => Err(e),
    }
}

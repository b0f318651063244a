//! The mutating admission webhook: a pure planner for pod CREATEs, a pure rule for UPDATEs of
//! gpu-share's annotations, and the AdmissionReview wire layer.
mod affinity;
pub mod devices;
pub mod guard;
pub mod limits;
mod patch;
pub mod plan;
pub mod review;
mod steps;
pub mod template;
pub mod workloads;

use std::sync::Arc;

use crate::cluster::ClusterFacts;
use crate::metrics::Metrics;
use crate::shared::PolicyStore;

/// What `/mutate` takes from the service's state (through axum's `FromRef`).
#[derive(Clone)]
pub struct Context {
    pub policy: Arc<PolicyStore>,
    /// `None` in `--dev` (no cluster): namespace labels and the RuntimeClass are unknown.
    pub cluster: Option<ClusterFacts>,
    pub metrics: Arc<Metrics>,
    /// The usernames that may write gpu-share's later annotations on admitted pods.
    pub annotation_writers: Arc<Vec<String>>,
    /// `--dev` only: the MIG forms of the `--nodes` file's nodes (a cluster's are read from it).
    pub dev_mig_offers: Option<Arc<crate::inventory::MigOffers>>,
}

//! The kube-scheduler extender: wire types, live state and the four verbs.

pub mod bind;
pub mod config;
pub mod defrag_controller;
pub mod dev;
pub mod dra;
pub mod executor;
pub mod explain;
pub mod handlers;
pub mod listed;
pub mod nudge;
mod online;
pub mod pending;
pub mod preempt;
pub mod report;
pub mod reservation_controller;
pub mod state;
pub mod sync;
pub mod tie_break;
pub mod wire;

use std::sync::Arc;

use crate::cluster::ClusterFacts;
use crate::metrics::Metrics;
use crate::shared::PolicyStore;

/// What the extender's handlers take from the service's state (through axum's `FromRef`).
#[derive(Clone)]
pub struct Context {
    /// `None` when the extender role is off: every verb answers 404.
    pub extender: Option<Arc<state::ExtenderState>>,
    pub policy: Arc<PolicyStore>,
    pub metrics: Arc<Metrics>,
    /// `None` in `--dev` (no cluster): bind holds capacity without an API call.
    pub cluster: Option<ClusterFacts>,
    /// What the reservation pods bind creates are made of.
    pub reservations: Arc<crate::reservation::Template>,
    /// The ResourceQuotas, as a watch keeps them (empty without a cluster).
    pub quotas: Arc<crate::cluster::quotas::Seen>,
}

impl Context {
    /// A context for `--dev` and tests: a fresh dev-mode state, the given policy, no cluster.
    pub fn dev(policy: crate::policy::Policy) -> Self {
        Context {
            extender: Some(Arc::new(state::ExtenderState::new(
                state::Mode::Dev,
                state::DEFAULT_ASSUME_TTL,
            ))),
            policy: Arc::new(PolicyStore::new(policy)),
            metrics: Arc::new(Metrics::new()),
            cluster: None,
            reservations: Arc::default(),
            quotas: Arc::default(),
        }
    }
}

//! What the service's parts share, below all of them: the policy as it is held (swapped
//! atomically on reload), readiness, the shutdown signal and the JSON error body. The webhook,
//! the extender and the cluster tasks import this module; `server` composes it into its routers'
//! state. Nothing here imports `server`, `admission`, `extender` or `cluster`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwap;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tokio::sync::watch;

use crate::mig::MigTable;
use crate::policy::Policy;

/// A policy with what is derived from it.
#[derive(Debug, Clone)]
pub struct LoadedPolicy {
    pub policy: Policy,
    pub mig: MigTable,
    /// The workload kinds whose templates the template check reads: Kubernetes' own, then the
    /// policy's.
    pub workload_kinds: Vec<crate::workloads::WorkloadKind>,
    /// How nodes are read under this policy (resource names, declared modes, MIG table).
    pub reading: crate::inventory::Reading,
}

impl LoadedPolicy {
    pub fn new(policy: Policy) -> Self {
        let mig = policy.mig_table();
        let workload_kinds = crate::workloads::all_kinds(&policy.workloads);
        let reading = crate::inventory::Reading::of(&policy);
        LoadedPolicy {
            policy,
            mig,
            workload_kinds,
            reading,
        }
    }
}

/// The current policy, swapped atomically on reload.
pub struct PolicyStore {
    current: ArcSwap<LoadedPolicy>,
    /// How many times the policy was replaced: what [`PolicyStore::changes`] watches.
    replaced: watch::Sender<u64>,
}

impl PolicyStore {
    pub fn new(policy: Policy) -> Self {
        PolicyStore {
            current: ArcSwap::from_pointee(LoadedPolicy::new(policy)),
            replaced: watch::Sender::new(0),
        }
    }

    pub fn current(&self) -> Arc<LoadedPolicy> {
        self.current.load_full()
    }

    pub fn replace(&self, policy: Policy) {
        self.current.store(Arc::new(LoadedPolicy::new(policy)));
        self.replaced.send_modify(|n| *n += 1);
    }

    /// Wakes on every later [`PolicyStore::replace`] (what is derived from the policy, such as
    /// how nodes are read, must be derived again).
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.replaced.subscribe()
    }
}

/// What `/readyz` waits for.
#[derive(Debug, Default)]
pub struct Readiness {
    pub certificate: AtomicBool,
    pub policy: AtomicBool,
    /// The API server answered (webhook) or the caches synced (extender); true in `--dev`.
    pub cluster: AtomicBool,
    /// Shutdown has begun: still serving, but no longer ready, so that the endpoints move on.
    pub draining: AtomicBool,
}

impl Readiness {
    pub fn all_ready() -> Self {
        Readiness {
            certificate: AtomicBool::new(true),
            policy: AtomicBool::new(true),
            cluster: AtomicBool::new(true),
            draining: AtomicBool::new(false),
        }
    }

    /// What is not ready yet, in words (empty when ready).
    pub fn missing(&self) -> Vec<&'static str> {
        let mut m = Vec::new();
        if !self.certificate.load(Ordering::Acquire) {
            m.push("certificate not loaded");
        }
        if !self.policy.load(Ordering::Acquire) {
            m.push("policy not loaded");
        }
        if !self.cluster.load(Ordering::Acquire) {
            m.push("Kubernetes API not reached or caches not synced");
        }
        if self.draining.load(Ordering::Acquire) {
            m.push("shutting down");
        }
        m
    }
}

/// A JSON error body: `{"error": "<what is wrong>"}`.
pub fn json_error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(serde_json::json!({ "error": message }))).into_response()
}

/// Resolves once shutdown has been asked for (or the sender is gone).
pub async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draining_is_not_ready() {
        let r = Readiness::all_ready();
        assert!(r.missing().is_empty());
        r.draining.store(true, Ordering::Release);
        assert_eq!(r.missing(), vec!["shutting down"]);
    }

    #[test]
    fn a_replaced_policy_is_the_current_one() {
        let store = PolicyStore::new(Policy::default_policy());
        let before = store.current();
        let mut changed = Policy::default_policy();
        changed.scheduler_name = "other-scheduler".into();
        store.replace(changed);
        assert_eq!(store.current().policy.scheduler_name, "other-scheduler");
        assert_ne!(
            before.policy.scheduler_name, "other-scheduler",
            "a reader keeps its copy"
        );
    }

    #[test]
    fn a_replacement_wakes_whoever_watches_for_changes() {
        let store = PolicyStore::new(Policy::default_policy());
        let mut changes = store.changes();
        assert!(!changes.has_changed().unwrap(), "nothing replaced yet");
        store.replace(Policy::default_policy());
        assert!(changes.has_changed().unwrap());
        changes.mark_unchanged();
        assert!(!changes.has_changed().unwrap());
    }
}

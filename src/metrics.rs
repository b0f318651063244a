//! Prometheus metrics (prometheus-client), served as text on the admin listener's `/metrics`.

use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    endpoint: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabels {
    endpoint: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    listener: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClosedLabels {
    listener: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabels {
    class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeGpuLabels {
    node: String,
    class: String,
    state: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeHolderLabels {
    node: String,
    holder: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabels {
    action: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

type HistogramFamily = Family<EndpointLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 100 us .. ~3.3 s
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

/// All of the service's metrics.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: HistogramFamily,
    denials: Family<ReasonLabels, Counter>,
    policy_reloads: Family<ResultLabels, Counter>,
    rejections: Family<ReasonLabels, Counter>,
    drift: Family<ResultLabels, Counter>,
    reservation_actions: Family<ActionLabels, Counter>,
    defrag_plans: Family<OutcomeLabels, Counter>,
    defrag_evictions: Family<OutcomeLabels, Counter>,
    defrag_given_up: Family<ReasonLabels, Counter>,
    defrag_gpus_freed: Counter,
    advertisements: Family<ResultLabels, Counter>,
    reservations: Family<StateLabels, Gauge>,
    requeues: Counter,
    retried_first: Counter,
    fragmented_milli: Gauge,
    held_pods: Gauge,
    gpu_nodes: Gauge,
    connections: Family<ListenerLabels, Gauge>,
    closed: Family<ClosedLabels, Counter>,
    node_gpus: Family<NodeGpuLabels, FloatGauge>,
    node_memory_held: Family<NodeHolderLabels, Gauge>,
    pending_pods: Family<ClassLabels, Gauge>,
    pending_oldest: Family<ClassLabels, FloatGauge>,
    ready: Gauge,
    contradicted: Gauge,
    /// Held while the scrape-time gauges are replaced and encoded, so two scrapes at once never
    /// see a half-replaced family.
    scrape: Mutex<()>,
}

/// The states a reservation pod can be in ([`crate::reservation::plan::ReservationState::word`]).
const RESERVATION_STATES: [&str; 4] = ["starting", "ready", "failed", "leaving"];

/// One node's GPUs of one class for [`Metrics::node_gpus`].
#[derive(Debug, Clone, PartialEq)]
pub struct NodeGpus<'a> {
    pub node: &'a str,
    pub class: &'a str,
    pub allocated: f64,
    pub free: f64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("gpu_share");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency: HistogramFamily = Family::new_with_constructor(latency_histogram);
        let denials = Family::<ReasonLabels, Counter>::default();
        let policy_reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "requests",
            "Requests by endpoint and outcome",
            requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Request latency by endpoint",
            latency.clone(),
        );
        registry.register(
            "admission_denials",
            "Admission denials by reason",
            denials.clone(),
        );
        registry.register(
            "policy_reloads",
            "Policy file reloads by result",
            policy_reloads.clone(),
        );
        let rejections = Family::<ReasonLabels, Counter>::default();
        let drift = Family::<ResultLabels, Counter>::default();
        let reservation_actions = Family::<ActionLabels, Counter>::default();
        registry.register(
            "reservation_actions",
            "Actions of the reservation controller (per-GPU sharing), by action and result",
            reservation_actions.clone(),
        );
        let defrag_plans = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "defrag_plans",
            "Defragmentation plans weighed for waiting pods, by outcome: planned, or why none (fits, no-node, no-room, over-limit, no-target)",
            defrag_plans.clone(),
        );
        let defrag_evictions = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "defrag_evictions",
            "Evictions defragmentation asked of the Eviction API to move pods, by outcome: evicted (a move), gone (the pod was gone already), refused (a PodDisruptionBudget allowed none), failed",
            defrag_evictions.clone(),
        );
        let defrag_given_up = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "defrag_plans_given_up",
            "Defragmentation plans under way given up, by why: lapsed, eviction-refused, eviction-failed, waiting-gone, orphaned (begun by a replica that no longer holds it), turned-off",
            defrag_given_up.clone(),
        );
        let defrag_gpus_freed = Counter::default();
        registry.register(
            "defrag_gpus_freed",
            "GPUs defragmentation made room on for the waiting pods it placed (the waiting pod's GPUs on its node)",
            defrag_gpus_freed.clone(),
        );
        let advertisements = Family::<ResultLabels, Counter>::default();
        registry.register(
            "node_advertisements",
            "Node status patches advertising gpu-share.io/gpu-milli on GPU nodes, by result",
            advertisements.clone(),
        );
        let reservations = Family::<StateLabels, Gauge>::default();
        registry.register(
            "reservations",
            "gpu-share's reservation pods (one per GPU shared per GPU), by state: starting, ready, failed, leaving",
            reservations.clone(),
        );
        for state in RESERVATION_STATES {
            reservations
                .get_or_create(&StateLabels {
                    state: state.into(),
                })
                .set(0);
        }
        let requeues = Counter::default();
        let retried_first = Counter::default();
        let fragmented_milli = Gauge::default();
        let held_pods = Gauge::default();
        let gpu_nodes = Gauge::default();
        registry.register(
            "extender_rejections",
            "Nodes rejected by the extender's filter, by reason",
            rejections.clone(),
        );
        registry.register(
            "ledger_drift",
            "Differences the periodic reconcile found between the ledger and the API, by kind",
            drift.clone(),
        );
        registry.register(
            "requeue_nudges",
            "Waiting pods nudged to requeue after capacity was released",
            requeues.clone(),
        );
        registry.register(
            "requeue_retried_first",
            "Waiting pods kube-scheduler retried and bound before a release nudged them",
            retried_first.clone(),
        );
        registry.register(
            "fragmented_gpu_milli",
            "Free GPU capacity (thousandths of a GPU) on nodes where the most common request of the last 1,000 pods no longer fits",
            fragmented_milli.clone(),
        );
        registry.register(
            "ledger_pods",
            "Pods holding GPU capacity in the ledger",
            held_pods.clone(),
        );
        registry.register(
            "ledger_nodes",
            "GPU nodes in the inventory",
            gpu_nodes.clone(),
        );
        let connections = Family::<ListenerLabels, Gauge>::default();
        let closed = Family::<ClosedLabels, Counter>::default();
        registry.register(
            "connections",
            "Open connections by listener",
            connections.clone(),
        );
        registry.register(
            "connections_closed",
            "Connections the service closed or refused, by listener and reason (idle, no_request, handshake_timeout, evicted, refused)",
            closed.clone(),
        );
        let node_gpus = Family::<NodeGpuLabels, FloatGauge>::default();
        let node_memory_held = Family::<NodeHolderLabels, Gauge>::default();
        registry.register(
            "node_memory_held",
            "What can hold a timeslice or mps share's memory to its budget on each GPU node, 1 per holder: driver-limit (the driver's per-container limits: r615 and later, with the toolkit's hook), device-plugin-mps (the device plugin's equal split), none",
            node_memory_held.clone(),
        );
        let pending_pods = Family::<ClassLabels, Gauge>::default();
        let pending_oldest = Family::<ClassLabels, FloatGauge>::default();
        let ready = Gauge::default();
        let contradicted = Gauge::default();
        registry.register(
            "contradicted_requests",
            "Pods whose gpu-share.io/request their nvidia.com limits contradict: accounted by their limits instead",
            contradicted.clone(),
        );
        registry.register(
            "node_gpus",
            "GPUs on each GPU node by the class of pod they take (exclusive, timeslice, mps, mig, shared for GPUs gpu-share shares per GPU), allocated and free; MIG devices count by compute share",
            node_gpus.clone(),
        );
        registry.register(
            "pending_pods",
            "gpu-share pods without a node yet, by class",
            pending_pods.clone(),
        );
        registry.register(
            "pending_oldest_seconds",
            "How long the oldest gpu-share pod without a node has waited, by class (since its creation)",
            pending_oldest.clone(),
        );
        registry.register(
            "ready",
            "1 when this process answers /readyz with 200 (certificates loaded; the extender's caches synced), else 0",
            ready.clone(),
        );
        // Series that exist from the start at 0, so `increase()` and `rate()` see the first
        // event and dashboards show a flat line rather than no data.
        for kind in ["phantom", "missing", "node"] {
            drift
                .get_or_create(&ResultLabels {
                    result: kind.into(),
                })
                .inc_by(0);
        }
        for listener in ["https", "admin"] {
            for reason in [
                "idle",
                "no_request",
                "handshake_timeout",
                "evicted",
                "refused",
            ] {
                closed
                    .get_or_create(&ClosedLabels {
                        listener: listener.into(),
                        reason: reason.into(),
                    })
                    .inc_by(0);
            }
        }
        Metrics {
            registry,
            node_gpus,
            node_memory_held,
            pending_pods,
            pending_oldest,
            ready,
            contradicted,
            scrape: Mutex::new(()),
            connections,
            closed,
            requests,
            latency,
            denials,
            policy_reloads,
            rejections,
            drift,
            reservation_actions,
            defrag_plans,
            defrag_evictions,
            defrag_given_up,
            defrag_gpus_freed,
            advertisements,
            reservations,
            requeues,
            retried_first,
            fragmented_milli,
            held_pods,
            gpu_nodes,
        }
    }

    /// Sets the reservation gauges from the states of every reservation pod (a state with none
    /// reads 0).
    pub fn reservations<'a>(&self, states: impl IntoIterator<Item = &'a str>) {
        let mut counts: std::collections::BTreeMap<&str, i64> =
            RESERVATION_STATES.iter().map(|s| (*s, 0)).collect();
        for s in states {
            *counts.entry(s).or_default() += 1;
        }
        for (state, n) in counts {
            self.reservations
                .get_or_create(&StateLabels {
                    state: state.into(),
                })
                .set(n);
        }
    }

    /// Counts a request and records its latency.
    pub fn observe(&self, endpoint: &str, outcome: &str, elapsed: Duration) {
        self.requests
            .get_or_create(&RequestLabels {
                endpoint: endpoint.into(),
                outcome: outcome.into(),
            })
            .inc();
        self.latency
            .get_or_create(&EndpointLabels {
                endpoint: endpoint.into(),
            })
            .observe(elapsed.as_secs_f64());
    }

    pub fn denial(&self, reason: &str) {
        self.denials
            .get_or_create(&ReasonLabels {
                reason: reason.into(),
            })
            .inc();
    }

    /// Counts `n` nodes rejected for `reason`.
    pub fn rejection(&self, reason: &str, n: u64) {
        self.rejections
            .get_or_create(&ReasonLabels {
                reason: reason.into(),
            })
            .inc_by(n);
    }

    /// Counts `n` ledger differences of `kind` found by reconcile.
    pub fn drift(&self, kind: &str, n: u64) {
        self.drift
            .get_or_create(&ResultLabels {
                result: kind.into(),
            })
            .inc_by(n);
    }

    /// Counts one node status patch advertising the quantity (`done`, `error`).
    pub fn advertisement(&self, result: &str) {
        self.advertisements
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    /// Counts one action of the reservation controller (`fill`, `delete`, `create`, `move`,
    /// `evict`) and how it ended (`done`, `error`).
    pub fn reservation_action(&self, action: &str, result: &str) {
        self.reservation_actions
            .get_or_create(&ActionLabels {
                action: action.into(),
                result: result.into(),
            })
            .inc();
    }

    /// Counts one plan weighed for a waiting pod by its outcome (`planned`, or why none:
    /// [`crate::defrag::NoPlan::label`]).
    pub fn defrag_plan(&self, outcome: &str) {
        self.defrag_plans
            .get_or_create(&OutcomeLabels {
                outcome: outcome.into(),
            })
            .inc();
    }

    /// Counts one eviction asked to move a pod, by its outcome (`evicted`, `gone`, `refused`,
    /// `failed`).
    pub fn defrag_eviction(&self, outcome: &str) {
        self.defrag_evictions
            .get_or_create(&OutcomeLabels {
                outcome: outcome.into(),
            })
            .inc();
    }

    /// Counts one plan under way given up, by why ([`crate::defrag::flight::GiveUp::label`]).
    pub fn defrag_given_up(&self, why: &str) {
        self.defrag_given_up
            .get_or_create(&ReasonLabels { reason: why.into() })
            .inc();
    }

    /// Counts the GPUs a plan made room on, once its waiting pod is placed.
    pub fn defrag_gpus_freed(&self, n: u64) {
        self.defrag_gpus_freed.inc_by(n);
    }

    pub fn requeued(&self, n: u64) {
        self.requeues.inc_by(n);
    }

    /// A waiting pod was bound before any release nudged it.
    pub fn retried_first(&self) {
        self.retried_first.inc();
    }

    /// Sets the ledger gauges (fragmented capacity in GPUs, held pods, GPU nodes).
    pub fn ledger(&self, fragmented_gpus: f64, pods: usize, nodes: usize) {
        self.fragmented_milli
            .set((fragmented_gpus * 1000.0).round() as i64);
        self.held_pods.set(pods as i64);
        self.gpu_nodes.set(nodes as i64);
    }

    /// Sets the open connections of a listener.
    pub fn connections(&self, listener: &str, open: i64) {
        self.connections
            .get_or_create(&ListenerLabels {
                listener: listener.into(),
            })
            .set(open);
    }

    /// Counts a connection the service closed or refused.
    pub fn connection_closed(&self, listener: &str, reason: &str) {
        self.closed
            .get_or_create(&ClosedLabels {
                listener: listener.into(),
                reason: reason.into(),
            })
            .inc();
    }

    pub fn policy_reload(&self, result: &str) {
        self.policy_reloads
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    /// Replaces the per-node GPU gauges (nodes gone since the last call disappear).
    pub fn node_gpus(&self, rows: &[NodeGpus<'_>]) {
        self.node_gpus.clear();
        for r in rows {
            for (state, v) in [("allocated", r.allocated), ("free", r.free)] {
                self.node_gpus
                    .get_or_create(&NodeGpuLabels {
                        node: r.node.into(),
                        class: r.class.into(),
                        state: state.into(),
                    })
                    .set(v);
            }
        }
    }

    /// Replaces the per-node gauges of what holds a share's memory: `(node, holders)`.
    pub fn node_memory_held(&self, rows: &[(&str, Vec<&str>)]) {
        self.node_memory_held.clear();
        for (node, holders) in rows {
            for h in holders {
                self.node_memory_held
                    .get_or_create(&NodeHolderLabels {
                        node: (*node).into(),
                        holder: (*h).into(),
                    })
                    .set(1);
            }
        }
    }

    /// Replaces the pending-pod gauges: `(class, pods, oldest wait in seconds)`; a class with
    /// none pending has no series.
    pub fn pending(&self, rows: &[(&str, usize, f64)]) {
        self.pending_pods.clear();
        self.pending_oldest.clear();
        for (class, pods, oldest) in rows {
            let labels = ClassLabels {
                class: (*class).into(),
            };
            self.pending_pods.get_or_create(&labels).set(*pods as i64);
            self.pending_oldest.get_or_create(&labels).set(*oldest);
        }
    }

    /// Sets how many pods have a request annotation their limits contradict.
    pub fn contradicted(&self, pods: usize) {
        self.contradicted.set(pods as i64);
    }

    pub fn ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    /// Taken around setting the scrape-time gauges and encoding them.
    pub fn scrape_lock(&self) -> MutexGuard<'_, ()> {
        crate::sync::lock(&self.scrape)
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "cannot encode metrics");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_counters_and_histograms() {
        let m = Metrics::new();
        m.observe("mutate", "allowed", Duration::from_millis(2));
        m.denial("unparsable");
        let text = m.encode();
        assert!(
            text.contains(r#"gpu_share_requests_total{endpoint="mutate",outcome="allowed"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"gpu_share_admission_denials_total{reason="unparsable"} 1"#),
            "{text}"
        );
        assert!(
            text.contains("gpu_share_request_duration_seconds_bucket"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }

    /// Every reservation state has a series from the start; each setting counts anew.
    #[test]
    fn reservations_by_state() {
        let m = Metrics::new();
        let text = m.encode();
        for state in RESERVATION_STATES {
            assert!(
                text.contains(&format!(r#"gpu_share_reservations{{state="{state}"}} 0"#)),
                "{text}"
            );
        }
        m.reservations(["ready", "ready", "failed"]);
        m.reservations(["ready", "ready", "starting"]);
        let text = m.encode();
        for (state, n) in [("ready", 2), ("starting", 1), ("failed", 0), ("leaving", 0)] {
            assert!(
                text.contains(&format!(r#"gpu_share_reservations{{state="{state}"}} {n}"#)),
                "{text}"
            );
        }
    }
}

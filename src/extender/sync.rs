//! The extender's state kept in step with the API: what a watch event and a reconcile do to it
//! (methods of [`ExtenderState`], tested without a cluster), and the tasks that feed them from
//! `cluster::watch`'s streams and lists: watches, reconcile, requeuer and cache maintenance.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::runtime::watcher::Event;
use tokio::sync::mpsc;
use tokio::sync::watch::Receiver;

use super::executor::{ANNOTATION_REQUEUE, Executor};
pub use super::listed::{Listed, list_compact};
use super::nudge::pods_to_nudge;
use super::state::{ExtenderState, Released};
use crate::cache::NodeFacts;
use crate::cluster::watch;
use crate::inventory;
use crate::ledger;
use crate::metrics::Metrics;
use crate::shared::{PolicyStore, Readiness, stopped};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};

/// Tracks a relist (Init .. InitDone) so objects gone during a dropped watch are removed.
#[derive(Debug, Default)]
pub struct Relist {
    seen: Option<HashSet<String>>,
    /// When the list began.
    from: Option<Instant>,
    /// Time spent recording listed objects (the rest of the list's duration is the API's).
    build: Duration,
}

impl Relist {
    fn begin(&mut self) {
        self.seen = Some(HashSet::new());
        self.from = Some(Instant::now());
        self.build = Duration::ZERO;
    }

    /// Logs how long the list took, apart from recording what it brought.
    fn done(&self, what: &'static str, seen: usize, ledger_pods: usize) {
        let Some(from) = self.from else { return };
        let total = from.elapsed();
        tracing::info!(
            what,
            listed = seen,
            ledger_pods,
            list_seconds = format!("{:.3}", total.saturating_sub(self.build).as_secs_f64()),
            build_seconds = format!("{:.3}", self.build.as_secs_f64()),
            "listed and recorded"
        );
    }
}

/// What a reconcile found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Drift {
    /// Held in the ledger, absent from the API (not a fresh bind): released.
    pub phantom: usize,
    /// In the API, missing or different in the ledger: recorded.
    pub missing: usize,
    /// Node inventories that differed: replaced.
    pub nodes: usize,
    /// The first pods repaired, in words (`phantom ml/a on n1`), for the log.
    pub pods: Vec<String>,
}

/// How many repaired pods a reconcile names in its log.
const DRIFT_NAMED: usize = 20;

impl Drift {
    fn name(&mut self, what: &str, h: Option<crate::ledger::Holding>) {
        if let (true, Some(h)) = (self.pods.len() < DRIFT_NAMED, h) {
            let (ns, name, node) = (h.pod.namespace, h.pod.name, h.node);
            self.pods.push(format!("{what} {ns}/{name} on {node}"));
        }
    }
}

impl ExtenderState {
    /// Applies one node event. Returns true when a full list has just completed.
    pub fn apply_node_event(
        &self,
        relist: &mut Relist,
        event: Event<Node>,
        reading: &inventory::Reading,
    ) -> bool {
        match event {
            Event::Init => {
                relist.begin();
                false
            }
            Event::InitApply(n) => {
                let started = Instant::now();
                self.apply_node_event(relist, Event::Apply(n), reading);
                relist.build += started.elapsed();
                false
            }
            Event::Apply(n) => {
                let name = n.metadata.name.clone().unwrap_or_default();
                self.touch_node(&name);
                if let Some(seen) = relist.seen.as_mut() {
                    seen.insert(name.clone());
                }
                let (facts, inventory) = NodeFacts::read(&n, reading);
                self.apply_node(&name, facts, inventory);
                false
            }
            Event::Delete(n) => {
                let name = n.metadata.name.as_deref().unwrap_or_default();
                self.touch_node(name);
                self.delete_node(name);
                false
            }
            Event::InitDone => {
                if let Some(seen) = relist.seen.take() {
                    relist.done("nodes", seen.len(), self.ledger().uids_len());
                    self.reset_nodes(&seen);
                }
                true
            }
        }
    }

    /// Applies one pod event. Returns true when a full list has just completed.
    pub fn apply_pod_event(&self, relist: &mut Relist, event: Event<Pod>) -> bool {
        match event {
            Event::Init => {
                relist.begin();
                false
            }
            Event::InitApply(p) => {
                let started = Instant::now();
                self.apply_pod_event(relist, Event::Apply(p));
                relist.build += started.elapsed();
                false
            }
            Event::Apply(p) => {
                if let (Some(seen), Some(uid)) = (relist.seen.as_mut(), p.metadata.uid.clone()) {
                    seen.insert(uid);
                }
                self.observe_pod(&p);
                false
            }
            Event::Delete(p) => {
                if let Some(uid) = &p.metadata.uid {
                    self.forget_pod(uid);
                }
                false
            }
            Event::InitDone => {
                if let (Some(seen), Some(from)) = (relist.seen.take(), relist.from) {
                    let dropped = self.retain_pods(&seen, from);
                    relist.done("pods", seen.len(), self.ledger().uids_len());
                    if dropped > 0 {
                        tracing::info!(dropped, "relist: released pods that are gone");
                    }
                }
                true
            }
        }
    }

    /// Compares the ledger with a list from the API, taken from `listed_at` on, and repairs it.
    /// Pods and nodes the watch changed after `listed_at` are left alone: the watch is newer than
    /// the list.
    pub fn reconcile_with(
        &self,
        nodes: &[Node],
        pods: &[Pod],
        reading: &inventory::Reading,
        listed_at: Instant,
    ) -> Drift {
        let mut listed = Listed::default();
        for n in nodes {
            listed.node(n, reading);
        }
        for p in pods {
            listed.pod(p);
        }
        self.reconcile(listed, listed_at)
    }

    /// [`ExtenderState::reconcile_with`] over what was kept of the lists.
    pub fn reconcile(&self, listed: Listed, listed_at: Instant) -> Drift {
        let mut drift = Drift::default();
        let newer = |uid: &str| self.touched_after(uid, listed_at);
        let node_newer = |name: &str| self.node_touched_after(name, listed_at);
        let Listed {
            nodes: mut inv,
            pods: expected,
            facts,
            ..
        } = listed;
        // The nodes' facts as the list read them (after a policy change, the only read under the
        // new one: whether a rule declares a DRA node time-sliced), unless a node's own event is
        // newer. Read before the inventories, which a DRA node's opt-in changes.
        for (name, f) in facts {
            if !node_newer(&name) {
                self.set_facts(&name, f);
            }
        }
        for name in self.ledger().node_names() {
            // The slice watch keeps DRA nodes: what the node list does not read as a GPU node
            // may be one.
            let listed = inv.remove(&name).or_else(|| self.dra_gpu_node(&name));
            if node_newer(&name) {
                continue;
            }
            match listed {
                Some(g) => {
                    let same = self
                        .ledger()
                        .with_node(&name, |nl| nl.node == g)
                        .unwrap_or(false);
                    if !same {
                        drift.nodes += 1;
                        self.set_node(&name, Some(g));
                    }
                }
                None => {
                    drift.nodes += 1;
                    self.set_node(&name, None);
                }
            }
        }
        for (name, g) in inv {
            if node_newer(&name) {
                continue;
            }
            drift.nodes += 1;
            self.set_node(&name, Some(g));
        }
        for uid in self.ledger().uids() {
            if !expected.contains_key(&uid) && !self.bound_after(&uid, listed_at) && !newer(&uid) {
                drift.phantom += 1;
                drift.name("phantom", self.ledger().holding(&uid));
                self.release(&uid);
            }
        }
        for (uid, o) in &expected {
            if newer(uid) {
                continue;
            }
            // The API shows it bound: no longer merely assumed.
            self.confirm(uid);
            if self.holds_as_listed(uid, o) {
                continue;
            }
            let before = self.ledger().holding(uid);
            // Recorded again: a holding missing, on another node or of another demand, or whose
            // GPUs are not the ones the bind annotation names (the annotation wins where it fits
            // the demand; where it does not, recording again changes nothing and is no drift).
            self.record(o);
            let after = self.ledger().holding(uid);
            if after != before {
                drift.missing += 1;
                drift.name("missing", after);
            }
        }
        drift
    }
}

/// Starts the node and pod watches; the extender becomes ready when both have listed. Each node
/// event is shown to `also_node` as well.
pub fn spawn_watches(
    client: Client,
    ext: Arc<ExtenderState>,
    policy: Arc<PolicyStore>,
    ready: Arc<Readiness>,
    also_node: impl Fn(&Event<Node>) + Send + 'static,
    shutdown: Receiver<bool>,
) {
    let nodes_synced = Arc::new(AtomicBool::new(false));
    let pods_synced = Arc::new(AtomicBool::new(false));
    let dra_synced = Arc::new(AtomicBool::new(false));
    super::dra::spawn_watches(
        client.clone(),
        ext.clone(),
        dra_synced.clone(),
        shutdown.clone(),
    );

    let node_stream = watch::node_events(client.clone());
    let e = ext.clone();
    let p = policy.clone();
    let mut relist = Relist::default();
    tokio::spawn(watch::drive(
        node_stream,
        nodes_synced.clone(),
        "nodes",
        shutdown.clone(),
        move |ev| {
            also_node(&ev);
            e.apply_node_event(&mut relist, ev, &p.current().reading)
        },
    ));

    let pod_stream = watch::pod_events(client);
    let e = ext.clone();
    let mut relist = Relist::default();
    tokio::spawn(watch::drive(
        pod_stream,
        pods_synced.clone(),
        "pods",
        shutdown.clone(),
        move |ev| e.apply_pod_event(&mut relist, ev),
    ));

    // Ready once both lists are complete.
    let mut shutdown = shutdown;
    tokio::spawn(async move {
        loop {
            if nodes_synced.load(Ordering::Acquire)
                && pods_synced.load(Ordering::Acquire)
                && dra_synced.load(Ordering::Acquire)
            {
                ext.mark_synced();
                ready.cluster.store(true, Ordering::Release);
                let (dra_nodes, dra_claims) = {
                    let dra = ext.dra();
                    (dra.nodes().len(), dra.claim_count())
                };
                tracing::info!(
                    nodes = ext.ledger().node_names().len(),
                    pods = ext.ledger().uids_len(),
                    dra_nodes,
                    dra_claims,
                    "extender ready: node, pod and DRA caches synced"
                );
                return;
            }
            tokio::select! {
                _ = stopped(&mut shutdown) => return,
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
    });
}

/// Lists nodes and pods every `every` and reconciles; and at once when the policy is replaced,
/// since how a node is read (resource names, MIG strategy and table, declared modes) comes from
/// the policy: every node is read again under the new one. Nodes that a new policy reads
/// differently are not drift, and are logged as re-read instead.
pub fn spawn_reconcile(
    client: Client,
    ext: Arc<ExtenderState>,
    policy: Arc<PolicyStore>,
    metrics: Arc<Metrics>,
    every: Duration,
    mut shutdown: Receiver<bool>,
) {
    let mut changes = policy.changes();
    tokio::spawn(async move {
        let mut reread = false;
        loop {
            if !reread {
                reread = tokio::select! {
                    _ = stopped(&mut shutdown) => return,
                    _ = tokio::time::sleep(every) => false,
                    Ok(()) = changes.changed() => true,
                };
            }
            ext.run_pending();
            if !ext.is_synced() {
                // The watches' first lists read nodes under the policy current then.
                reread = false;
                continue;
            }
            changes.mark_unchanged();
            let listed_at = Instant::now();
            let loaded = policy.current();
            match list_compact(&client, &loaded.reading).await {
                Ok(listed) => {
                    let (nodes, pods) = listed.counts();
                    let list_seconds = listed_at.elapsed().as_secs_f64();
                    let mut d = ext.reconcile(listed, listed_at);
                    ext.forget_touches_before(listed_at);
                    if reread {
                        tracing::info!(
                            nodes,
                            changed = d.nodes,
                            "policy replaced: every node read again under it"
                        );
                        d.nodes = 0;
                        reread = false;
                    }
                    metrics.drift("phantom", d.phantom as u64);
                    metrics.drift("missing", d.missing as u64);
                    metrics.drift("node", d.nodes as u64);
                    if d != Drift::default() {
                        tracing::warn!(
                            phantom = d.phantom,
                            missing = d.missing,
                            nodes = d.nodes,
                            pods = ?d.pods,
                            "reconcile repaired ledger drift"
                        );
                    } else {
                        tracing::info!(
                            nodes,
                            pods,
                            list_seconds = format!("{list_seconds:.3}"),
                            "reconcile: the ledger matches the API"
                        );
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reconcile: cannot list nodes or pods");
                    if reread {
                        // Nodes are still read under the old policy: try again soon, not a
                        // whole period later.
                        tokio::select! {
                            _ = stopped(&mut shutdown) => return,
                            _ = tokio::time::sleep(REREAD_RETRY) => {}
                        }
                    }
                }
            }
        }
    });
}

/// How soon a failed re-read after a policy change is tried again.
const REREAD_RETRY: Duration = Duration::from_secs(2);

/// Requeue: when capacity is released, nudge the pods waiting for it (debounced).
pub fn spawn_requeuer(
    client: Client,
    ext: Arc<ExtenderState>,
    metrics: Arc<Metrics>,
    mut released: mpsc::UnboundedReceiver<Released>,
    mut shutdown: Receiver<bool>,
) {
    let io = super::executor::Api::new(client);
    tokio::spawn(async move {
        loop {
            let first = tokio::select! {
                _ = stopped(&mut shutdown) => return,
                r = released.recv() => match r { Some(r) => r, None => return },
            };
            // Collect what else is released in the next moment.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let mut batch = vec![first];
            while let Ok(r) = released.try_recv() {
                batch.push(r);
            }
            let waiting = ext.no_room_pods();
            let chosen = pods_to_nudge(&waiting, &batch, 100);
            if chosen.is_empty() {
                continue;
            }
            let stamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| format!("{}.{:03}", d.as_secs(), d.subsec_millis()))
                .unwrap_or_default();
            let mut n = 0;
            for (uid, w) in chosen {
                ext.clear_no_room(&uid);
                match io
                    .annotate(&w.namespace, &w.name, ANNOTATION_REQUEUE, Some(&stamp))
                    .await
                {
                    Ok(()) => n += 1,
                    Err(e) => {
                        tracing::debug!(pod = %format!("{}/{}", w.namespace, w.name), error = %e, "cannot nudge waiting pod")
                    }
                }
            }
            metrics.requeued(n);
            tracing::info!(
                nudged = n,
                released = batch.len(),
                "requeued pods waiting for GPU capacity"
            );
        }
    });
}

/// Runs the caches' pending maintenance (expiries) every `every`.
pub fn spawn_maintenance(ext: Arc<ExtenderState>, every: Duration, mut shutdown: Receiver<bool>) {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stopped(&mut shutdown) => return,
                _ = tokio::time::sleep(every) => {}
            }
            ext.run_pending();
        }
    });
}

/// Explains the pods the watch queues ([`super::explain`]), one at a time, as events on them.
pub fn spawn_explainer(
    client: Client,
    ext: Arc<ExtenderState>,
    policy: Arc<PolicyStore>,
    mut pods: mpsc::Receiver<super::explain::Queued>,
    mut shutdown: Receiver<bool>,
) {
    let instance = std::env::var("POD_NAME")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok());
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: "gpu-share-scheduler".into(),
            instance,
        },
    );
    tokio::spawn(async move {
        loop {
            let pod = tokio::select! {
                _ = stopped(&mut shutdown) => return,
                p = pods.recv() => match p { Some(p) => p, None => return },
            };
            let (pod, attempt) = pod;
            // A GPU node with room may only mean the ledger has not seen binds kube-scheduler
            // already counted: weigh the pod again a little later, a few times.
            let requirement = policy.current().policy.enforcement.budgets;
            if !explain_one(&recorder, &ext, &pod, requirement).await
                && attempt < super::explain::RETRIES
            {
                let ext = ext.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(super::explain::RETRY_AFTER).await;
                    ext.explainer().send((pod, attempt + 1));
                });
            }
        }
    });
}

/// Weighs one pod and records why it waits; false when a GPU node seems to have room for it
/// (nothing recorded).
async fn explain_one(
    recorder: &Recorder,
    ext: &ExtenderState,
    pod: &Pod,
    requirement: crate::enforcement::Requirement,
) -> bool {
    let Ok(Some(mut demand)) = ledger::demand_of_pod(pod) else {
        return true;
    };
    // Weighed as filter weighs it: under `required`, a node that cannot hold it has no room.
    demand.enforcement = requirement;
    let Some(spec) = pod.spec.as_ref() else {
        return true;
    };
    let gpu_node = |n: &String| ext.ledger().with_node(n, |_| ()).is_some();
    let mut names = super::explain::candidates(&ext.nodes(), spec);
    names.retain(gpu_node);
    if names.is_empty()
        && matches!(
            demand.gpu,
            crate::packing::GpuDemand::Timeslice { .. } | crate::packing::GpuDemand::Mps { .. }
        )
    {
        // A share's affinity names GFD's sharing labels, which a DRA node never has: the DRA
        // nodes its nodeSelector picks are where it was meant to go, and their refusal says why.
        names = super::explain::selected_by_node_selector(&ext.nodes(), spec)
            .into_iter()
            .filter(|n| {
                ext.ledger()
                    .with_node(n, |nl| nl.node.mode_source == inventory::ModeSource::Dra)
                    .unwrap_or(false)
            })
            .collect();
    }
    let verdicts: Vec<(String, Result<(), crate::packing::Reason>)> = ext
        .ledger()
        .with_nodes_par(&names, |nl| {
            crate::packing::fit(&nl.node, &nl.usage, &demand)
        })
        .into_iter()
        .zip(names)
        .map(|(v, name)| (name, v.unwrap_or(Err(crate::packing::Reason::NotGpuNode))))
        .collect();
    let class = demand.gpu.class();
    let Some(note) = super::explain::explanation(class, &verdicts) else {
        return false;
    };
    let (Some(uid), Some(name), Some(namespace)) = (
        pod.metadata.uid.clone(),
        pod.metadata.name.clone(),
        pod.metadata.namespace.clone(),
    ) else {
        return true;
    };
    // Not marked waiting: kube-scheduler requeues a pod its own plugins refused when capacity
    // frees (its queueing hints), and a nudge would race a preemption it has already begun.
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(name.clone()),
        namespace: Some(namespace.clone()),
        uid: Some(uid),
        ..Default::default()
    };
    let event = KubeEvent {
        type_: EventType::Warning,
        reason: super::explain::EVENT_REASON.into(),
        note: Some(note.clone()),
        action: "Scheduling".into(),
        secondary: None,
    };
    match recorder.publish(&event, &reference).await {
        Ok(()) => {
            tracing::info!(pod = %format!("{namespace}/{name}"), note = %note, "explained a pending pod")
        }
        Err(e) => {
            tracing::warn!(pod = %format!("{namespace}/{name}"), error = %e, "cannot record why a pod waits")
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::watch::POD_FIELD_SELECTOR;
    use crate::extender::state::in_flight::Binding;
    use crate::extender::state::{Mode, NoRoom};
    use crate::inventory::GpuNode;
    use crate::policy::Policy;
    use futures::StreamExt;
    use kube::Api;
    use kube::runtime::watcher;
    use serde_json::json;

    fn ext() -> ExtenderState {
        let e = ExtenderState::new(Mode::Cluster, Duration::from_secs(60));
        e.set_node("n1", Some(GpuNode::whole("n1", "NVIDIA-L40S", 4, 46068)));
        e
    }

    fn pod(uid: &str, node: Option<&str>, phase: &str) -> serde_json::Value {
        json!({
            "metadata": {"name": format!("pod-{uid}"), "namespace": "ml", "uid": uid,
                         "annotations": {"gpu-share.io/request": "exclusive"}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                     "nodeName": node},
            "status": {"phase": phase}
        })
    }

    fn typed(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn pod_events_record_and_release() {
        let e = ext();
        let mut r = Relist::default();
        e.apply_pod_event(&mut r, Event::Apply(typed(pod("a", Some("n1"), "Running"))));
        e.apply_pod_event(&mut r, Event::Apply(typed(pod("b", Some("n1"), "Running"))));
        assert_eq!(e.ledger().uids(), vec!["a", "b"]);
        // Finished pods hold nothing; deleted pods are forgotten.
        e.apply_pod_event(
            &mut r,
            Event::Apply(typed(pod("a", Some("n1"), "Succeeded"))),
        );
        e.apply_pod_event(
            &mut r,
            Event::Delete(typed(pod("b", Some("n1"), "Running"))),
        );
        assert!(e.ledger().uids().is_empty());
        let slots = e.ledger().with_node("n1", |nl| nl.usage.slots).unwrap();
        assert_eq!(slots, 0);
    }

    #[test]
    fn relist_drops_what_disappeared_and_never_double_counts() {
        let e = ext();
        let mut r = Relist::default();
        for uid in ["a", "b"] {
            e.apply_pod_event(&mut r, Event::Apply(typed(pod(uid, Some("n1"), "Running"))));
        }
        // The watch dropped; b was deleted meanwhile; a is listed again.
        assert!(!e.apply_pod_event(&mut r, Event::Init));
        e.apply_pod_event(
            &mut r,
            Event::InitApply(typed(pod("a", Some("n1"), "Running"))),
        );
        assert!(e.apply_pod_event(&mut r, Event::InitDone));
        assert_eq!(e.ledger().uids(), vec!["a"]);
        assert_eq!(e.ledger().with_node("n1", |nl| nl.usage.slots), Some(1));
    }

    /// A bind of `uid` to n1 that has reserved a whole GPU, as bind does before calling the
    /// API: still in flight (keep it unsettled), or [`Binding::commit`] it.
    fn bind<'a>(e: &'a ExtenderState, uid: &str) -> Binding<'a> {
        let scorer = crate::packing::Scorer::new(crate::packing::PackingPolicy::Binpack);
        let pref = crate::ledger::PodRef::new(uid, "ml", format!("pod-{uid}"));
        let mut b = e.begin_bind(uid, "n1", true);
        b.hold(
            &scorer,
            pref,
            crate::packing::Demand::gpu(crate::packing::GpuDemand::Whole { count: 1 }),
        )
        .unwrap();
        b
    }

    /// A waiting pod that kube-scheduler retried and bound before a release nudged it counts as
    /// retried first, even when the watch shows it bound (and unmarks it) before the binding's
    /// answer comes back.
    #[test]
    fn a_waiting_pod_bound_before_its_nudge_counts_as_retried_first() {
        let e = ext();
        let mut r = Relist::default();
        e.note_no_room(
            "w",
            NoRoom {
                namespace: "ml".into(),
                name: "pod-w".into(),
                class: "whole",
            },
        );
        let b = bind(&e, "w");
        e.apply_pod_event(&mut r, Event::Apply(typed(pod("w", Some("n1"), "Pending"))));
        assert!(!e.has_no_room("w"), "the watch unmarks a bound pod");
        assert!(b.commit(), "it was waiting when its bind began");
        assert!(!bind(&e, "never-waited").commit());
    }

    #[test]
    fn a_fresh_bind_survives_a_relist_that_does_not_show_it_yet() {
        let e = ext();
        let mut r = Relist::default();
        // One bind is still in flight when the list begins, another completes after it began.
        let _in_flight = bind(&e, "in-flight");
        e.apply_pod_event(&mut r, Event::Init);
        bind(&e, "new").commit();
        e.apply_pod_event(&mut r, Event::InitDone);
        assert_eq!(e.ledger().uids(), vec!["in-flight", "new"]);
        // Once the API shows it bound, it is no longer merely assumed.
        e.apply_pod_event(
            &mut r,
            Event::Apply(typed(pod("new", Some("n1"), "Pending"))),
        );
        assert_eq!(e.assumption("new"), None);
        assert_eq!(e.ledger().with_node("n1", |nl| nl.usage.slots), Some(2));
    }

    #[test]
    fn a_bind_the_watch_never_showed_is_released_by_a_later_list_without_it() {
        // The API server went away: the extender bound a pod the watch never showed, and the
        // pod was deleted before the watch came back. The relist begun after the binding does
        // not have it, so it is gone: released, not held until the assume TTL runs out.
        let e = ext();
        bind(&e, "gone").commit();
        std::thread::sleep(Duration::from_millis(2));
        let mut r = Relist::default();
        e.apply_pod_event(&mut r, Event::Init);
        assert!(e.apply_pod_event(&mut r, Event::InitDone));
        assert!(e.ledger().uids().is_empty());
        assert_eq!(e.assumption("gone"), None);
        assert_eq!(e.ledger().with_node("n1", |nl| nl.usage.slots), Some(0));
        // The reconcile's list does the same.
        let nodes: Vec<Node> = vec![serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"nvidia.com/gpu.product": "NVIDIA-L40S", "nvidia.com/gpu.count": "4", "nvidia.com/gpu.memory": "46068"}},
            "status": {"allocatable": {"nvidia.com/gpu": "4"}}
        }))
        .unwrap()];
        bind(&e, "gone-too").commit();
        std::thread::sleep(Duration::from_millis(2));
        let listed_at = Instant::now();
        let d = e.reconcile_with(&nodes, &[], &"nvidia.com/gpu".into(), listed_at);
        assert_eq!(d.phantom, 1);
        assert!(e.ledger().uids().is_empty());
        // But not one bound after its list began.
        bind(&e, "late").commit();
        let d = e.reconcile_with(&nodes, &[], &"nvidia.com/gpu".into(), listed_at);
        assert_eq!(d.phantom, 0);
        assert_eq!(e.ledger().uids(), vec!["late"]);
    }

    /// The fault runner's slow-then-cut API: a bind committed, a reconcile's fresh list showed
    /// the pod bound (no longer merely assumed), then the lagging watch delivered the pod's older
    /// events, from before the binding. The holding stays until the pod finishes or goes: a
    /// pod's node is never unset, and releasing it gave its GPU to the next bind.
    #[test]
    fn an_older_unbound_event_after_a_list_showed_the_pod_bound_releases_nothing() {
        let e = ext();
        let nodes: Vec<Node> = vec![serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"nvidia.com/gpu.product": "NVIDIA-L40S", "nvidia.com/gpu.count": "4", "nvidia.com/gpu.memory": "46068"}},
            "status": {"allocatable": {"nvidia.com/gpu": "4"}}
        }))
        .unwrap()];
        bind(&e, "a").commit();
        let gpus = e.ledger().holding("a").unwrap().placement.gpus;
        let mut bound = pod("a", Some("n1"), "Pending");
        bound["metadata"]["annotations"]["gpu-share.io/gpus"] =
            json!(e.ledger().holding("a").unwrap().placement.gpus_text());
        let d = e.reconcile_with(
            &nodes,
            &[typed(bound.clone())],
            &"nvidia.com/gpu".into(),
            Instant::now(),
        );
        assert_eq!(d, Drift::default());
        assert_eq!(e.assumption("a"), None, "the list showed it bound");
        let mut r = Relist::default();
        e.apply_pod_event(&mut r, Event::Apply(typed(pod("a", None, "Pending"))));
        assert_eq!(e.ledger().uids(), vec!["a"]);
        assert_eq!(e.ledger().with_node("n1", |nl| nl.usage.slots), Some(1));
        // Its later events: bound, then finished, which frees the GPU.
        e.apply_pod_event(&mut r, Event::Apply(typed(bound)));
        assert_eq!(e.ledger().holding("a").unwrap().placement.gpus, gpus);
        e.apply_pod_event(
            &mut r,
            Event::Apply(typed(pod("a", Some("n1"), "Succeeded"))),
        );
        assert!(e.ledger().uids().is_empty());
    }

    #[test]
    fn node_events_build_and_prune_the_inventory() {
        let e = ExtenderState::new(Mode::Cluster, Duration::from_secs(60));
        let node = |name: &str, gpus: &str| -> Node {
            serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "NVIDIA-L40S", "nvidia.com/gpu.count": gpus}},
                "status": {"allocatable": {"nvidia.com/gpu": gpus}}
            }))
            .unwrap()
        };
        let cpu: Node = serde_json::from_value(
            json!({"metadata": {"name": "cpu"}, "status": {"allocatable": {"cpu": "4"}}}),
        )
        .unwrap();
        let mut r = Relist::default();
        e.apply_node_event(&mut r, Event::Init, &"nvidia.com/gpu".into());
        e.apply_node_event(
            &mut r,
            Event::InitApply(node("g1", "4")),
            &"nvidia.com/gpu".into(),
        );
        e.apply_node_event(
            &mut r,
            Event::InitApply(node("g2", "2")),
            &"nvidia.com/gpu".into(),
        );
        e.apply_node_event(&mut r, Event::InitApply(cpu), &"nvidia.com/gpu".into());
        assert!(e.apply_node_event(&mut r, Event::InitDone, &"nvidia.com/gpu".into()));
        assert_eq!(e.ledger().node_names(), vec!["g1", "g2"]);
        e.apply_node_event(
            &mut r,
            Event::Apply(node("g1", "8")),
            &"nvidia.com/gpu".into(),
        );
        assert_eq!(e.ledger().with_node("g1", |nl| nl.node.slots), Some(8));
        e.apply_node_event(&mut r, Event::Init, &"nvidia.com/gpu".into());
        e.apply_node_event(
            &mut r,
            Event::InitApply(node("g1", "8")),
            &"nvidia.com/gpu".into(),
        );
        e.apply_node_event(&mut r, Event::InitDone, &"nvidia.com/gpu".into());
        assert_eq!(e.ledger().node_names(), vec!["g1"]);
    }

    /// A relist forgets every node it did not show, with all it knew of it: a node without GPUs
    /// too, whose labels and taints a relist used to leave behind (it walked the ledger's nodes
    /// only, and filter kept reading the gone node's taints).
    #[test]
    fn a_relist_forgets_every_node_it_did_not_show_gpus_or_not() {
        let e = ExtenderState::new(Mode::Cluster, Duration::from_secs(60));
        let reading: inventory::Reading = "nvidia.com/gpu".into();
        let node = |v: serde_json::Value| -> Node { serde_json::from_value(v).unwrap() };
        let gpu = node(json!({
            "metadata": {"name": "g1", "labels": {"nvidia.com/gpu.product": "NVIDIA-L40S",
                                                   "nvidia.com/gpu.count": "4"}},
            "spec": {"unschedulable": true},
            "status": {"allocatable": {"nvidia.com/gpu": "4"}}
        }));
        let cpu = node(json!({
            "metadata": {"name": "cpu", "labels": {"pool": "web"}},
            "spec": {"taints": [{"key": "spot", "effect": "PreferNoSchedule"}]}
        }));
        let mut r = Relist::default();
        e.apply_node_event(&mut r, Event::Apply(gpu), &reading);
        e.apply_node_event(&mut r, Event::Apply(cpu), &reading);
        assert!(e.nodes().get("g1").is_some_and(|f| f.cordoned));
        assert_eq!(e.nodes().get("cpu").unwrap().soft_taints, ["spot="]);
        // A pod that tolerates everything (a cordon too) may go to either.
        let anywhere: k8s_openapi::api::core::v1::PodSpec = serde_json::from_value(
            json!({"containers": [], "tolerations": [{"operator": "Exists"}]}),
        )
        .unwrap();
        assert_eq!(
            super::super::explain::candidates(&e.nodes(), &anywhere),
            ["cpu", "g1"]
        );
        assert_eq!(
            super::super::explain::candidates(&e.nodes(), &Default::default()),
            ["cpu"],
            "a cordoned node is left out for a pod that does not tolerate its cordon"
        );
        // The watch was cut; both went meanwhile, and the relist shows another node only.
        e.apply_node_event(&mut r, Event::Init, &reading);
        let other = node(json!({"metadata": {"name": "other"}}));
        e.apply_node_event(&mut r, Event::InitApply(other), &reading);
        assert!(e.apply_node_event(&mut r, Event::InitDone, &reading));
        assert!(e.ledger().node_names().is_empty());
        assert!(!e.knows_node("cpu") && !e.knows_node("g1"));
        assert_eq!(
            super::super::explain::candidates(&e.nodes(), &anywhere),
            ["other"]
        );
        // A deletion forgets it as well.
        e.apply_node_event(
            &mut r,
            Event::Delete(node(json!({"metadata": {"name": "other"}}))),
            &reading,
        );
        assert!(e.nodes().is_empty());
    }

    #[test]
    fn reconcile_counts_and_repairs_drift() {
        let e = ext();
        let mut r = Relist::default();
        e.apply_pod_event(
            &mut r,
            Event::Apply(typed(pod("gone", Some("n1"), "Running"))),
        );
        let nodes: Vec<Node> = vec![serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"nvidia.com/gpu.product": "NVIDIA-L40S", "nvidia.com/gpu.count": "4", "nvidia.com/gpu.memory": "46068"}},
            "status": {"allocatable": {"nvidia.com/gpu": "4"}}
        }))
        .unwrap()];
        let pods = vec![typed(pod("missed", Some("n1"), "Running"))];
        let d = e.reconcile_with(&nodes, &pods, &"nvidia.com/gpu".into(), Instant::now());
        assert_eq!(d.phantom, 1);
        assert_eq!(d.missing, 1);
        assert_eq!(e.ledger().uids(), vec!["missed"]);
        let again = e.reconcile_with(&nodes, &pods, &"nvidia.com/gpu".into(), Instant::now());
        assert_eq!(again, Drift::default());

        // A list taken before the watch saw a new pod and a deletion is older than the watch:
        // it neither frees the new pod nor brings the deleted one back.
        let listed_at = Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(2));
        e.apply_pod_event(
            &mut r,
            Event::Apply(typed(pod("late", Some("n1"), "Running"))),
        );
        e.apply_pod_event(
            &mut r,
            Event::Delete(typed(pod("missed", Some("n1"), "Running"))),
        );
        let stale = e.reconcile_with(&nodes, &pods, &"nvidia.com/gpu".into(), listed_at);
        assert_eq!(stale, Drift::default());
        assert_eq!(e.ledger().uids(), vec!["late"]);
        // The next list, taken after both, agrees.
        let fresh = vec![typed(pod("late", Some("n1"), "Running"))];
        let d = e.reconcile_with(&nodes, &fresh, &"nvidia.com/gpu".into(), Instant::now());
        assert_eq!(d, Drift::default());
    }

    /// A holding on the right node with the right demand but other GPUs than its bind annotation
    /// names (a model left behind by a relist) is drift: the reconcile records the annotation's.
    /// An annotation that cannot be the demand's is not, however often it is listed.
    #[test]
    fn reconcile_repairs_a_holding_on_other_gpus_than_its_annotation() {
        let e = ext();
        let annotated = |uid: &str, gpus: &str| {
            let mut p = pod(uid, Some("n1"), "Running");
            p["metadata"]["annotations"]["gpu-share.io/gpus"] = json!(gpus);
            typed(p)
        };
        // The watch recorded it without its annotation: the model chose GPU 0.
        e.apply_pod_event(
            &mut Relist::default(),
            Event::Apply(typed(pod("a", Some("n1"), "Running"))),
        );
        assert_eq!(e.ledger().holding("a").unwrap().placement.gpus, [(0, 1000)]);
        let nodes: Vec<Node> = vec![serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"nvidia.com/gpu.product": "NVIDIA-L40S", "nvidia.com/gpu.count": "4", "nvidia.com/gpu.memory": "46068"}},
            "status": {"allocatable": {"nvidia.com/gpu": "4"}}
        }))
        .unwrap()];
        let listed =
            |pods: &[Pod]| e.reconcile_with(&nodes, pods, &"nvidia.com/gpu".into(), Instant::now());
        let d = listed(&[annotated("a", "2:1000")]);
        assert_eq!((d.phantom, d.missing, d.nodes), (0, 1, 0));
        assert_eq!(d.pods, ["missing ml/pod-a on n1"]);
        assert_eq!(e.ledger().holding("a").unwrap().placement.gpus, [(2, 1000)]);
        assert_eq!(listed(&[annotated("a", "2:1000")]), Drift::default());
        // Half a GPU for an exclusive pod is not its footprint: kept as modelled, no drift.
        let d = listed(&[annotated("a", "1:500")]);
        assert_eq!(d, Drift::default());
        assert_eq!(e.ledger().holding("a").unwrap().placement.gpus, [(2, 1000)]);
    }

    /// The watcher against kube's mock service: a list, a watch that adds a pod and then expires
    /// (410), a relist; the ledger ends with each pod once.
    #[tokio::test]
    async fn a_dropped_watch_resyncs_without_double_allocation() {
        let (client, mut handle) = crate::cluster::mock::client();
        let server = tokio::spawn(async move {
            let mut lists = 0;
            loop {
                let Some((req, send)) = handle.next_request().await else {
                    return;
                };
                let query = req.uri().query().unwrap_or_default().to_string();
                assert!(req.uri().path().ends_with("/api/v1/pods"), "{}", req.uri());
                assert!(query.contains("fieldSelector"), "{query}");
                let body = if query.contains("watch=true") {
                    if lists == 1 {
                        let added =
                            json!({"type": "ADDED", "object": pod("b", Some("n1"), "Running")});
                        let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": "too old resource version", "reason": "Expired", "code": 410}});
                        format!("{added}\n{gone}\n")
                    } else {
                        // Keep the second watch open until the test ends.
                        std::future::pending::<()>().await;
                        unreachable!()
                    }
                } else {
                    lists += 1;
                    let items = if lists == 1 {
                        vec![pod("a", Some("n1"), "Running")]
                    } else {
                        vec![
                            pod("a", Some("n1"), "Running"),
                            pod("b", Some("n1"), "Running"),
                        ]
                    };
                    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": format!("{}", 10 * lists)}, "items": items}).to_string()
                };
                send.send_response(crate::cluster::mock::text(200, body.into_bytes()));
            }
        });
        let e = ext();
        let mut stream = watcher::watcher(
            Api::<Pod>::all(client),
            watcher::Config::default().fields(POD_FIELD_SELECTOR),
        )
        .boxed();
        let mut relist = Relist::default();
        let mut lists_done = 0;
        let mut saw_b_before_relist = false;
        while lists_done < 2 {
            let next = tokio::time::timeout(Duration::from_secs(10), stream.next())
                .await
                .expect("the watcher makes progress");
            match next {
                Some(Ok(ev)) => {
                    if e.apply_pod_event(&mut relist, ev) {
                        lists_done += 1;
                    }
                    if lists_done == 1 && e.ledger().uids().len() == 2 {
                        saw_b_before_relist = true;
                    }
                }
                Some(Err(_)) => {}
                None => break,
            }
        }
        assert!(saw_b_before_relist, "the watch event fed the ledger");
        assert_eq!(e.ledger().uids(), vec!["a", "b"]);
        assert_eq!(e.ledger().with_node("n1", |nl| nl.usage.slots), Some(2));
        server.abort();
    }

    /// The reconcile's lists go a page at a time, following the continue token, and keep only
    /// holdings: a ledger that lost a pod gets it back, one holding a deleted pod releases it.
    #[tokio::test]
    async fn the_reconcile_lists_a_page_at_a_time() {
        let (client, mut handle) = crate::cluster::mock::client();
        let server = tokio::spawn(async move {
            let mut queries = Vec::new();
            while let Some((req, send)) = handle.next_request().await {
                if req.uri().path() == "/apis/resource.k8s.io/v1" {
                    // A cluster without DRA.
                    send.send_response(crate::cluster::mock::json(
                        404,
                        &json!({
                        "kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "reason": "NotFound", "code": 404}),
                    ));
                    continue;
                }
                let query = req.uri().query().unwrap_or_default().to_string();
                assert!(query.contains("limit=500"), "{query}");
                let page = |kind: &str, items: Vec<serde_json::Value>, next: &str| {
                    json!({"apiVersion": "v1", "kind": kind,
                           "metadata": {"resourceVersion": "7", "continue": next}, "items": items})
                };
                let body = if req.uri().path().ends_with("/api/v1/nodes") {
                    page(
                        "NodeList",
                        vec![json!({
                            "metadata": {"name": "n1", "labels": {"nvidia.com/gpu.product": "NVIDIA-L40S", "nvidia.com/gpu.count": "4", "nvidia.com/gpu.memory": "46068"}},
                            "status": {"allocatable": {"nvidia.com/gpu": "4"}}
                        })],
                        "",
                    )
                } else if query.contains("continue=page-2") {
                    page("PodList", vec![pod("c", Some("n1"), "Running")], "")
                } else {
                    assert!(query.contains("fieldSelector"), "{query}");
                    page("PodList", vec![pod("a", Some("n1"), "Running")], "page-2")
                };
                queries.push(format!("{}?{query}", req.uri().path()));
                send.send_response(crate::cluster::mock::text(
                    200,
                    body.to_string().into_bytes(),
                ));
            }
            queries
        });
        let e = ext();
        let mut r = Relist::default();
        for uid in ["a", "b"] {
            e.apply_pod_event(&mut r, Event::Apply(typed(pod(uid, Some("n1"), "Running"))));
        }
        let listed_at = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        let listed = list_compact(&client, &"nvidia.com/gpu".into())
            .await
            .unwrap();
        drop(client);
        let d = e.reconcile(listed, listed_at);
        assert_eq!((d.phantom, d.missing, d.nodes), (1, 1, 0));
        assert_eq!(e.ledger().uids(), vec!["a", "c"]);
        let queries = server.await.unwrap();
        assert_eq!(queries.len(), 3, "{queries:?}");
    }

    /// A replaced policy reads every node again at once, not a reconcile period later, and
    /// what the new policy reads differently is not counted as drift: a time-sliced node that
    /// advertises `nvidia.com/gpu.shared` is out of reach under the default policy and in reach
    /// once `resources.timeslice` names its resource.
    #[tokio::test]
    async fn a_replaced_policy_reads_every_node_again_at_once() {
        let node = json!({
            "metadata": {"name": "ts", "labels": {
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "2",
                "nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.replicas": "4",
                "nvidia.com/gpu.sharing-strategy": "time-slicing"}},
            "status": {"allocatable": {"nvidia.com/gpu.shared": "8"}}
        });
        let (client, mut handle) = crate::cluster::mock::client();
        let listed = node.clone();
        let server = tokio::spawn(async move {
            let mut lists = 0;
            while let Some((req, send)) = handle.next_request().await {
                if req.uri().path() == "/apis/resource.k8s.io/v1" {
                    send.send_response(crate::cluster::mock::json(
                        404,
                        &json!({
                        "kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "reason": "NotFound", "code": 404}),
                    ));
                    continue;
                }
                lists += 1;
                let (kind, items) = if req.uri().path().ends_with("/api/v1/nodes") {
                    ("NodeList", vec![listed.clone()])
                } else {
                    ("PodList", vec![])
                };
                let body = json!({"apiVersion": "v1", "kind": kind,
                                  "metadata": {"resourceVersion": "7"}, "items": items});
                send.send_response(crate::cluster::mock::json(200, &body));
            }
            lists
        });
        let policy = Arc::new(PolicyStore::new(Policy::default_policy()));
        let e = Arc::new(ExtenderState::new(Mode::Cluster, Duration::from_secs(60)));
        let read = |reading: &inventory::Reading| {
            inventory::read_node(&serde_json::from_value(node.clone()).unwrap(), reading).unwrap()
        };
        e.set_node("ts", Some(read(&policy.current().reading)));
        e.mark_synced();
        let unreached = || e.ledger().with_node("ts", |nl| nl.node.unreached.is_some());
        assert_eq!(
            unreached(),
            Some(true),
            "out of reach under the default policy"
        );

        let metrics = Arc::new(Metrics::new());
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        // A period far longer than the test: only the policy change can make it list.
        spawn_reconcile(
            client,
            e.clone(),
            policy.clone(),
            metrics.clone(),
            Duration::from_secs(3600),
            shutdown,
        );
        let mut renamed = Policy::default_policy();
        renamed.resources.timeslice = Some("nvidia.com/gpu.shared".to_string().try_into().unwrap());
        policy.replace(renamed);
        let deadline = Instant::now() + Duration::from_secs(30);
        while unreached() != Some(false) {
            assert!(Instant::now() < deadline, "the node was not read again");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            e.ledger().with_node("ts", |nl| nl.node.clone()),
            Some(read(&policy.current().reading))
        );
        let text = metrics.encode();
        assert!(
            text.contains(r#"gpu_share_ledger_drift_total{result="node"} 0"#),
            "a policy change is not drift: {text}"
        );
        stop.send(true).unwrap();
        let lists = tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("the reconcile task stops")
            .unwrap();
        assert_eq!(lists, 2, "one node list and one pod list");
    }

    /// A bind of a pod still marked waiting says so (kube-scheduler retried it before a release
    /// nudged it), and clears the mark; a bind of a pod that never waited does not.
    #[test]
    fn a_bind_tells_whether_the_pod_still_waited() {
        let e = ext();
        e.note_no_room(
            "waited",
            NoRoom {
                namespace: "ml".into(),
                name: "waited".into(),
                class: "exclusive",
            },
        );
        assert!(bind(&e, "waited").commit());
        assert!(!e.has_no_room("waited"));
        assert!(!bind(&e, "fresh").commit());
    }

    /// Requeue end to end: a pod rejected for capacity waits; when a holding of its class is
    /// released, the requeuer patches the waiting pod.
    #[tokio::test]
    async fn a_release_nudges_the_waiting_pod() {
        let (client, mut handle) = crate::cluster::mock::client();
        let e = Arc::new(ext());
        let mut r = Relist::default();
        e.apply_pod_event(
            &mut r,
            Event::Apply(typed(pod("holder", Some("n1"), "Running"))),
        );
        e.note_no_room(
            "waiter",
            NoRoom {
                namespace: "ml".into(),
                name: "pod-waiter".into(),
                class: "exclusive",
            },
        );
        let (_tx, rx) = tokio::sync::watch::channel(false);
        let metrics = Arc::new(Metrics::new());
        spawn_requeuer(
            client,
            e.clone(),
            metrics.clone(),
            e.subscribe_releases(),
            rx,
        );
        e.apply_pod_event(
            &mut r,
            Event::Delete(typed(pod("holder", Some("n1"), "Running"))),
        );
        let (req, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
            .await
            .expect("a nudge within the debounce")
            .expect("a request");
        assert_eq!(req.method(), http::Method::PATCH);
        assert_eq!(req.uri().path(), "/api/v1/namespaces/ml/pods/pod-waiter");
        send.send_response(crate::cluster::mock::text(
            200,
            json!({"metadata": {"name": "pod-waiter"}})
                .to_string()
                .into_bytes(),
        ));
        for _ in 0..50 {
            if metrics
                .encode()
                .contains("gpu_share_requeue_nudges_total 1")
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            metrics
                .encode()
                .contains("gpu_share_requeue_nudges_total 1")
        );
        assert!(!e.has_no_room("waiter"));
    }
}

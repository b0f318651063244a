//! Kubernetes reads of the extender: watches over nodes and pods that feed the ledger, the
//! periodic reconcile that counts and repairs drift, the requeuer and the gauges. Events are
//! applied by plain functions (tested without a cluster); the loops around them only stream.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::ListParams;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};

use crate::extender::state::{ExtenderState, Released, fragmented_gpus};
use crate::inventory;
use crate::ledger::{self, ObservedPod};
use crate::metrics::Metrics;
use crate::server::{PolicyStore, Readiness, stopped};

/// Pods that hold nothing are left out server-side (the API sends a delete when a pod leaves).
pub const POD_FIELD_SELECTOR: &str = "status.phase!=Succeeded,status.phase!=Failed";

/// Tracks a relist (Init .. InitDone) so objects gone during a dropped watch are removed.
#[derive(Debug, Default)]
pub struct Relist {
    seen: Option<HashSet<String>>,
}

/// Applies one node event. Returns true when a full list has just completed.
pub fn apply_node_event(
    ext: &ExtenderState,
    relist: &mut Relist,
    event: Event<Node>,
    shared: &str,
) -> bool {
    match event {
        Event::Init => {
            relist.seen = Some(HashSet::new());
            false
        }
        Event::InitApply(n) | Event::Apply(n) => {
            let name = n.metadata.name.clone().unwrap_or_default();
            if let Some(seen) = relist.seen.as_mut() {
                seen.insert(name.clone());
            }
            match inventory::from_node(&n, shared) {
                Some(inv) => ext.ledgers.upsert_node(inv),
                None => ext.ledgers.remove_node(&name),
            }
            false
        }
        Event::Delete(n) => {
            ext.ledgers
                .remove_node(n.metadata.name.as_deref().unwrap_or_default());
            false
        }
        Event::InitDone => {
            if let Some(seen) = relist.seen.take() {
                for name in ext.ledgers.node_names() {
                    if !seen.contains(&name) {
                        ext.ledgers.remove_node(&name);
                    }
                }
            }
            true
        }
    }
}

/// Applies one pod event. Returns true when a full list has just completed.
pub fn apply_pod_event(ext: &ExtenderState, relist: &mut Relist, event: Event<Pod>) -> bool {
    match event {
        Event::Init => {
            relist.seen = Some(HashSet::new());
            false
        }
        Event::InitApply(p) | Event::Apply(p) => {
            if let (Some(seen), Some(uid)) = (relist.seen.as_mut(), p.metadata.uid.clone()) {
                seen.insert(uid);
            }
            ext.observe_pod(&p);
            false
        }
        Event::Delete(p) => {
            if let Some(uid) = &p.metadata.uid {
                ext.forget_pod(uid);
            }
            false
        }
        Event::InitDone => {
            if let Some(seen) = relist.seen.take() {
                let dropped = ext.retain_pods(&seen);
                if dropped > 0 {
                    tracing::info!(dropped, "relist: released pods that are gone");
                }
            }
            true
        }
    }
}

/// Feeds a stream of events into the ledger until it ends or shutdown; marks `synced` after the
/// first complete list.
async fn drive<K, S, F>(
    mut stream: S,
    synced: Arc<AtomicBool>,
    what: &'static str,
    mut shutdown: watch::Receiver<bool>,
    mut apply: F,
) where
    S: Stream<Item = Result<Event<K>, watcher::Error>> + Unpin,
    F: FnMut(Event<K>) -> bool,
{
    loop {
        let next = tokio::select! {
            _ = stopped(&mut shutdown) => return,
            n = stream.next() => n,
        };
        match next {
            Some(Ok(ev)) => {
                if apply(ev) && !synced.swap(true, Ordering::AcqRel) {
                    tracing::info!(what, "cache synced");
                }
            }
            Some(Err(e)) => {
                tracing::warn!(what, error = %e, "watch error; kube-runtime retries with backoff")
            }
            None => return,
        }
    }
}

/// Starts the node and pod watches; the extender becomes ready when both have listed.
pub fn spawn_watches(
    client: Client,
    ext: Arc<ExtenderState>,
    policy: Arc<PolicyStore>,
    ready: Arc<Readiness>,
    shutdown: watch::Receiver<bool>,
) {
    use kube::runtime::WatchStreamExt;
    let nodes_synced = Arc::new(AtomicBool::new(false));
    let pods_synced = Arc::new(AtomicBool::new(false));

    let node_stream =
        watcher::watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .boxed();
    let e = ext.clone();
    let p = policy.clone();
    let mut relist = Relist::default();
    tokio::spawn(drive(
        node_stream,
        nodes_synced.clone(),
        "nodes",
        shutdown.clone(),
        move |ev| {
            let shared = p.current().policy.resources.shared.to_string();
            apply_node_event(&e, &mut relist, ev, &shared)
        },
    ));

    let pod_stream = watcher::watcher(
        Api::<Pod>::all(client),
        watcher::Config::default().fields(POD_FIELD_SELECTOR),
    )
    .default_backoff()
    .boxed();
    let e = ext.clone();
    let mut relist = Relist::default();
    tokio::spawn(drive(
        pod_stream,
        pods_synced.clone(),
        "pods",
        shutdown.clone(),
        move |ev| apply_pod_event(&e, &mut relist, ev),
    ));

    // Ready once both lists are complete.
    let mut shutdown = shutdown;
    tokio::spawn(async move {
        loop {
            if nodes_synced.load(Ordering::Acquire) && pods_synced.load(Ordering::Acquire) {
                ext.synced.store(true, Ordering::Release);
                ready.cluster.store(true, Ordering::Release);
                tracing::info!(
                    nodes = ext.ledgers.node_names().len(),
                    pods = ext.ledgers.uids().len(),
                    "extender ready: node and pod caches synced"
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

/// What a reconcile found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Drift {
    /// Held in the ledger, absent from the API (not a fresh bind): released.
    pub phantom: usize,
    /// In the API, missing or different in the ledger: recorded.
    pub missing: usize,
    /// Node inventories that differed: replaced.
    pub nodes: usize,
}

/// Compares the ledger with a fresh list from the API and repairs it.
pub fn reconcile_with(ext: &ExtenderState, nodes: &[Node], pods: &[Pod], shared: &str) -> Drift {
    let mut drift = Drift::default();
    let mut inv: HashMap<String, inventory::GpuNode> = HashMap::new();
    for n in nodes {
        if let Some(g) = inventory::from_node(n, shared) {
            inv.insert(g.name.clone(), g);
        }
    }
    for name in ext.ledgers.node_names() {
        match inv.remove(&name) {
            Some(g) => {
                let same = ext
                    .ledgers
                    .with_node(&name, |nl| nl.node == g)
                    .unwrap_or(false);
                if !same {
                    drift.nodes += 1;
                    ext.ledgers.upsert_node(g);
                }
            }
            None => {
                drift.nodes += 1;
                ext.ledgers.remove_node(&name);
            }
        }
    }
    for (_, g) in inv {
        drift.nodes += 1;
        ext.ledgers.upsert_node(g);
    }
    let expected: HashMap<String, ObservedPod> = pods
        .iter()
        .filter_map(|p| ledger::observed_holding(p).ok().flatten())
        .map(|o| (o.pod.uid.clone(), o))
        .collect();
    for uid in ext.ledgers.uids() {
        if !expected.contains_key(&uid) && !ext.assumed.contains_key(&uid) {
            drift.phantom += 1;
            ext.ledgers.release(&uid);
        }
    }
    for (uid, o) in &expected {
        let same = ext.ledgers.node_of(uid).as_deref() == Some(o.node.as_str())
            && ext
                .ledgers
                .with_node(&o.node, |nl| {
                    nl.holdings
                        .get(uid)
                        .map(|h| h.demand == o.demand)
                        .unwrap_or(false)
                })
                .unwrap_or(false);
        if !same {
            drift.missing += 1;
            ext.ledgers.record(o);
            ext.assumed.invalidate(uid);
        }
    }
    drift
}

/// Lists nodes and pods every `every` and reconciles.
pub fn spawn_reconcile(
    client: Client,
    ext: Arc<ExtenderState>,
    policy: Arc<PolicyStore>,
    metrics: Arc<Metrics>,
    every: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stopped(&mut shutdown) => return,
                _ = tokio::time::sleep(every) => {}
            }
            ext.run_pending();
            if !ext.is_synced() {
                continue;
            }
            let nodes = Api::<Node>::all(client.clone())
                .list(&ListParams::default())
                .await;
            let pods = Api::<Pod>::all(client.clone())
                .list(&ListParams::default().fields(POD_FIELD_SELECTOR))
                .await;
            match (nodes, pods) {
                (Ok(nodes), Ok(pods)) => {
                    let shared = policy.current().policy.resources.shared.to_string();
                    let d = reconcile_with(&ext, &nodes.items, &pods.items, &shared);
                    metrics.drift("phantom", d.phantom as u64);
                    metrics.drift("missing", d.missing as u64);
                    metrics.drift("node", d.nodes as u64);
                    if d != Drift::default() {
                        tracing::warn!(
                            phantom = d.phantom,
                            missing = d.missing,
                            nodes = d.nodes,
                            "reconcile repaired ledger drift"
                        );
                    } else {
                        tracing::debug!("reconcile: ledger matches the API");
                    }
                }
                (Err(e), _) | (_, Err(e)) => {
                    tracing::warn!(error = %e, "reconcile: cannot list nodes or pods")
                }
            }
        }
    });
}

/// Which waiting pods a release should nudge: those of the same class (direct device requests
/// match any class), oldest entries first, at most `limit`.
pub fn pods_to_nudge(
    waiting: &[(String, crate::extender::state::Waiting)],
    released: &[Released],
    limit: usize,
) -> Vec<(String, crate::extender::state::Waiting)> {
    waiting
        .iter()
        .filter(|(_, w)| {
            released
                .iter()
                .any(|r| r.class == w.class || r.class == "device" || w.class == "device")
        })
        .take(limit)
        .cloned()
        .collect()
}

/// Requeue: when capacity is released, nudge the pods waiting for it (debounced).
pub fn spawn_requeuer(
    client: Client,
    ext: Arc<ExtenderState>,
    metrics: Arc<Metrics>,
    mut released: mpsc::UnboundedReceiver<Released>,
    mut shutdown: watch::Receiver<bool>,
) {
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
            let waiting: Vec<_> = ext.waiting.iter().map(|(k, v)| ((*k).clone(), v)).collect();
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
                ext.waiting.invalidate(&uid);
                match super::binder::nudge(&client, &w.namespace, &w.name, &stamp).await {
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

/// Updates the ledger gauges every `every`.
pub fn spawn_gauges(
    ext: Arc<ExtenderState>,
    metrics: Arc<Metrics>,
    every: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    tokio::spawn(async move {
        loop {
            update_gauges(&ext, &metrics);
            tokio::select! {
                _ = stopped(&mut shutdown) => return,
                _ = tokio::time::sleep(every) => {}
            }
            ext.run_pending();
        }
    });
}

/// Computes the gauges once.
pub fn update_gauges(ext: &ExtenderState, metrics: &Metrics) {
    let nodes = ext.ledgers.snapshot();
    let common = ext
        .workload
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .most_common()
        .cloned();
    let frag = common.map_or(0.0, |d| fragmented_gpus(&nodes, &d));
    let pods: usize = nodes.iter().map(|n| n.holdings.len()).sum();
    metrics.ledger(frag, pods, nodes.len());
}

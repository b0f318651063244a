//! Kubernetes reads of the extender: watches over nodes and pods that feed the ledger, the
//! periodic reconcile that counts and repairs drift, the requeuer and the gauges. Events are
//! applied by plain functions (tested without a cluster); the loops around them only stream.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::ListParams;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};

use crate::extender::state::{ExtenderState, Released};
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

/// Applies one node event. Returns true when a full list has just completed.
pub fn apply_node_event(
    ext: &ExtenderState,
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
            apply_node_event(ext, relist, Event::Apply(n), reading);
            relist.build += started.elapsed();
            false
        }
        Event::Apply(n) => {
            let name = n.metadata.name.clone().unwrap_or_default();
            ext.touch(format!("node/{name}"));
            if let Some(seen) = relist.seen.as_mut() {
                seen.insert(name.clone());
            }
            match inventory::read_node(&n, reading) {
                Some(inv) => ext.ledgers.upsert_node(inv),
                None => ext.ledgers.remove_node(&name),
            }
            false
        }
        Event::Delete(n) => {
            let name = n.metadata.name.as_deref().unwrap_or_default();
            ext.touch(format!("node/{name}"));
            ext.ledgers.remove_node(name);
            false
        }
        Event::InitDone => {
            if let Some(seen) = relist.seen.take() {
                relist.done("nodes", seen.len(), ext.ledgers.uids_len());
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
            relist.begin();
            false
        }
        Event::InitApply(p) => {
            let started = Instant::now();
            apply_pod_event(ext, relist, Event::Apply(p));
            relist.build += started.elapsed();
            false
        }
        Event::Apply(p) => {
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
            if let (Some(seen), Some(from)) = (relist.seen.take(), relist.from) {
                let dropped = ext.retain_pods(&seen, from);
                relist.done("pods", seen.len(), ext.ledgers.uids_len());
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
            let reading = inventory::Reading::of(&p.current().policy);
            apply_node_event(&e, &mut relist, ev, &reading)
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
                    pods = ext.ledgers.uids_len(),
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

/// Compares the ledger with a list from the API, taken from `listed_at` on, and repairs it.
/// Pods and nodes the watch changed after `listed_at` are left alone: the watch is newer than
/// the list.
pub fn reconcile_with(
    ext: &ExtenderState,
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
    reconcile_listed(ext, listed, listed_at)
}

/// What a reconcile keeps of a list: GPU nodes' inventories and bound pods' holdings, not the
/// objects (a list of 150,000 pods is a few GB decoded; this is a few dozen MB).
#[derive(Debug, Default)]
pub struct Listed {
    nodes: HashMap<String, inventory::GpuNode>,
    pods: HashMap<String, ObservedPod>,
}

impl Listed {
    pub fn node(&mut self, n: &Node, reading: &inventory::Reading) {
        if let Some(g) = inventory::read_node(n, reading) {
            self.nodes.insert(g.name.clone(), g);
        }
    }

    pub fn pod(&mut self, p: &Pod) {
        if let Ok(Some(o)) = ledger::observed_holding(p) {
            self.pods.insert(o.pod.uid.clone(), o);
        }
    }

    /// The GPU nodes and the bound pods, pods ordered by UID.
    pub fn into_parts(self) -> (Vec<inventory::GpuNode>, Vec<ObservedPod>) {
        let mut pods: Vec<ObservedPod> = self.pods.into_values().collect();
        pods.sort_by(|a, b| a.pod.uid.cmp(&b.pod.uid));
        (self.nodes.into_values().collect(), pods)
    }

    /// How many GPU nodes and bound pods it holds.
    pub fn counts(&self) -> (usize, usize) {
        (self.nodes.len(), self.pods.len())
    }
}

/// [`reconcile_with`] over what was kept of the lists.
pub fn reconcile_listed(ext: &ExtenderState, listed: Listed, listed_at: Instant) -> Drift {
    let mut drift = Drift::default();
    let newer = |key: &str| ext.touched_after(key, listed_at);
    let node_newer = |name: &str| newer(&format!("node/{name}"));
    let Listed {
        nodes: mut inv,
        pods: expected,
    } = listed;
    for name in ext.ledgers.node_names() {
        let listed = inv.remove(&name);
        if node_newer(&name) {
            continue;
        }
        match listed {
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
    for (name, g) in inv {
        if node_newer(&name) {
            continue;
        }
        drift.nodes += 1;
        ext.ledgers.upsert_node(g);
    }
    for uid in ext.ledgers.uids() {
        if !expected.contains_key(&uid) && !ext.bound_after(&uid, listed_at) && !newer(&uid) {
            drift.phantom += 1;
            ext.assumed.invalidate(&uid);
            ext.ledgers.release(&uid);
        }
    }
    for (uid, o) in &expected {
        if newer(uid) {
            continue;
        }
        // The API shows it bound: no longer merely assumed.
        ext.assumed.invalidate(uid);
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
            let listed_at = Instant::now();
            let reading = inventory::Reading::of(&policy.current().policy);
            match list_compact(&client, &reading).await {
                Ok(listed) => {
                    let (nodes, pods) = listed.counts();
                    let list_seconds = listed_at.elapsed().as_secs_f64();
                    let d = reconcile_listed(&ext, listed, listed_at);
                    ext.forget_touches_before(listed_at);
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
                        tracing::info!(
                            nodes,
                            pods,
                            list_seconds = format!("{list_seconds:.3}"),
                            "reconcile: the ledger matches the API"
                        );
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reconcile: cannot list nodes or pods")
                }
            }
        }
    });
}

/// Objects a reconcile list asks for at once, as the watches' lists and client-go's pager do.
pub const LIST_PAGE: u32 = 500;

/// Lists nodes and pods a page at a time (one consistent snapshot each), keeping only what a
/// reconcile compares.
pub async fn list_compact(
    client: &Client,
    reading: &inventory::Reading,
) -> Result<Listed, kube::Error> {
    let mut listed = Listed::default();
    let nodes = Api::<Node>::all(client.clone());
    let mut lp = ListParams::default().limit(LIST_PAGE);
    loop {
        let page = nodes.list(&lp).await?;
        for n in &page.items {
            listed.node(n, reading);
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => lp = lp.continue_token(&token),
            None => break,
        }
    }
    let pods = Api::<Pod>::all(client.clone());
    let mut lp = ListParams::default()
        .fields(POD_FIELD_SELECTOR)
        .limit(LIST_PAGE);
    loop {
        let page = pods.list(&lp).await?;
        for p in &page.items {
            listed.pod(p);
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => lp = lp.continue_token(&token),
            None => break,
        }
    }
    Ok(listed)
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

/// Runs the caches' pending maintenance (expiries) every `every`.
pub fn spawn_maintenance(
    ext: Arc<ExtenderState>,
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
        }
    });
}

/// Computes the extender's gauges from the live state (at scrape time): fragmentation, held
/// pods, GPU nodes, each node's GPUs by class, and the pending pods by class. Each node is read
/// under its own lock, one at a time; nothing is copied.
pub fn update_gauges(ext: &ExtenderState, metrics: &Metrics, mig: &crate::mig::MigTable) {
    let common = crate::sync::lock(&ext.online).recent.most_common().cloned();
    let mut frag = 0.0;
    let mut pods = 0;
    let mut rows: Vec<(String, crate::extender::state::ClassGpus)> = Vec::new();
    let nodes = ext.ledgers.for_each_node(|nl| {
        if let Some(d) = &common {
            frag += crate::extender::state::fragmented_on(nl, d);
        }
        pods += nl.holdings.len();
        for c in crate::extender::state::gpus_by_class(nl, mig) {
            rows.push((nl.node.name.clone(), c));
        }
    });
    metrics.ledger(frag, pods, nodes);
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    let rows: Vec<crate::metrics::NodeGpus<'_>> = rows
        .iter()
        .map(|(node, c)| crate::metrics::NodeGpus {
            node,
            class: c.class,
            allocated: round(c.used),
            free: round((c.total - c.used).max(0.0)),
        })
        .collect();
    metrics.node_gpus(&rows);
    let pending: Vec<_> = ext
        .pending_by_class(std::time::SystemTime::now())
        .into_iter()
        .map(|p| (p.class, p.pods, p.oldest_seconds.round()))
        .collect();
    metrics.pending(&pending);
    metrics.contradicted(ext.contradicted_pods());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extender::state::{Assumed, Mode};
    use crate::inventory::GpuNode;
    use serde_json::json;

    fn ext() -> ExtenderState {
        let e = ExtenderState::new(Mode::Cluster, Duration::from_secs(60));
        e.ledgers
            .upsert_node(GpuNode::whole("n1", "NVIDIA-L40S", 4, 46068));
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
        apply_pod_event(
            &e,
            &mut r,
            Event::Apply(typed(pod("a", Some("n1"), "Running"))),
        );
        apply_pod_event(
            &e,
            &mut r,
            Event::Apply(typed(pod("b", Some("n1"), "Running"))),
        );
        assert_eq!(e.ledgers.uids(), vec!["a", "b"]);
        // Finished pods hold nothing; deleted pods are forgotten.
        apply_pod_event(
            &e,
            &mut r,
            Event::Apply(typed(pod("a", Some("n1"), "Succeeded"))),
        );
        apply_pod_event(
            &e,
            &mut r,
            Event::Delete(typed(pod("b", Some("n1"), "Running"))),
        );
        assert!(e.ledgers.uids().is_empty());
        let slots = e.ledgers.with_node("n1", |nl| nl.usage.slots).unwrap();
        assert_eq!(slots, 0);
    }

    #[test]
    fn relist_drops_what_disappeared_and_never_double_counts() {
        let e = ext();
        let mut r = Relist::default();
        for uid in ["a", "b"] {
            apply_pod_event(
                &e,
                &mut r,
                Event::Apply(typed(pod(uid, Some("n1"), "Running"))),
            );
        }
        // The watch dropped; b was deleted meanwhile; a is listed again.
        assert!(!apply_pod_event(&e, &mut r, Event::Init));
        apply_pod_event(
            &e,
            &mut r,
            Event::InitApply(typed(pod("a", Some("n1"), "Running"))),
        );
        assert!(apply_pod_event(&e, &mut r, Event::InitDone));
        assert_eq!(e.ledgers.uids(), vec!["a"]);
        assert_eq!(e.ledgers.with_node("n1", |nl| nl.usage.slots), Some(1));
    }

    /// Reserves a whole GPU of n1 for `uid`, as bind does before calling the API.
    fn reserve(e: &ExtenderState, uid: &str) {
        let scorer = crate::packing::Scorer::new(crate::packing::PackingPolicy::Binpack);
        let pref = crate::ledger::PodRef {
            uid: uid.into(),
            namespace: "ml".into(),
            name: format!("pod-{uid}"),
            priority: 0,
        };
        e.ledgers
            .reserve(
                &scorer,
                "n1",
                pref,
                crate::packing::Demand::gpu(crate::packing::GpuDemand::Whole { count: 1 }),
            )
            .unwrap();
    }

    fn assume(e: &ExtenderState, uid: &str, bound_at: Option<Instant>) {
        e.assumed.insert(
            uid.into(),
            Assumed {
                node: "n1".into(),
                bound_at,
            },
        );
    }

    #[test]
    fn a_fresh_bind_survives_a_relist_that_does_not_show_it_yet() {
        let e = ext();
        let mut r = Relist::default();
        // One bind is still in flight when the list begins, another completes after it began.
        reserve(&e, "in-flight");
        assume(&e, "in-flight", None);
        apply_pod_event(&e, &mut r, Event::Init);
        reserve(&e, "new");
        assume(&e, "new", Some(Instant::now()));
        apply_pod_event(&e, &mut r, Event::InitDone);
        assert_eq!(e.ledgers.uids(), vec!["in-flight", "new"]);
        // Once the API shows it bound, it is no longer merely assumed.
        apply_pod_event(
            &e,
            &mut r,
            Event::Apply(typed(pod("new", Some("n1"), "Pending"))),
        );
        assert!(!e.assumed.contains_key("new"));
        assert_eq!(e.ledgers.with_node("n1", |nl| nl.usage.slots), Some(2));
    }

    #[test]
    fn a_bind_the_watch_never_showed_is_released_by_a_later_list_without_it() {
        // The API server went away: the extender bound a pod the watch never showed, and the
        // pod was deleted before the watch came back. The relist begun after the binding does
        // not have it, so it is gone: released, not held until the assume TTL runs out.
        let e = ext();
        reserve(&e, "gone");
        assume(&e, "gone", Some(Instant::now()));
        std::thread::sleep(Duration::from_millis(2));
        let mut r = Relist::default();
        apply_pod_event(&e, &mut r, Event::Init);
        assert!(apply_pod_event(&e, &mut r, Event::InitDone));
        assert!(e.ledgers.uids().is_empty());
        assert!(!e.assumed.contains_key("gone"));
        assert_eq!(e.ledgers.with_node("n1", |nl| nl.usage.slots), Some(0));
        // The reconcile's list does the same.
        let nodes: Vec<Node> = vec![serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"nvidia.com/gpu.product": "NVIDIA-L40S", "nvidia.com/gpu.count": "4", "nvidia.com/gpu.memory": "46068"}},
            "status": {"allocatable": {"nvidia.com/gpu": "4"}}
        }))
        .unwrap()];
        reserve(&e, "gone-too");
        assume(&e, "gone-too", Some(Instant::now()));
        std::thread::sleep(Duration::from_millis(2));
        let listed_at = Instant::now();
        let d = reconcile_with(&e, &nodes, &[], &"nvidia.com/gpu".into(), listed_at);
        assert_eq!(d.phantom, 1);
        assert!(e.ledgers.uids().is_empty());
        // But not one bound after its list began.
        reserve(&e, "late");
        assume(&e, "late", Some(Instant::now()));
        let d = reconcile_with(&e, &nodes, &[], &"nvidia.com/gpu".into(), listed_at);
        assert_eq!(d.phantom, 0);
        assert_eq!(e.ledgers.uids(), vec!["late"]);
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
        apply_node_event(&e, &mut r, Event::Init, &"nvidia.com/gpu".into());
        apply_node_event(
            &e,
            &mut r,
            Event::InitApply(node("g1", "4")),
            &"nvidia.com/gpu".into(),
        );
        apply_node_event(
            &e,
            &mut r,
            Event::InitApply(node("g2", "2")),
            &"nvidia.com/gpu".into(),
        );
        apply_node_event(&e, &mut r, Event::InitApply(cpu), &"nvidia.com/gpu".into());
        assert!(apply_node_event(
            &e,
            &mut r,
            Event::InitDone,
            &"nvidia.com/gpu".into()
        ));
        assert_eq!(e.ledgers.node_names(), vec!["g1", "g2"]);
        apply_node_event(
            &e,
            &mut r,
            Event::Apply(node("g1", "8")),
            &"nvidia.com/gpu".into(),
        );
        assert_eq!(e.ledgers.with_node("g1", |nl| nl.node.slots), Some(8));
        apply_node_event(&e, &mut r, Event::Init, &"nvidia.com/gpu".into());
        apply_node_event(
            &e,
            &mut r,
            Event::InitApply(node("g1", "8")),
            &"nvidia.com/gpu".into(),
        );
        apply_node_event(&e, &mut r, Event::InitDone, &"nvidia.com/gpu".into());
        assert_eq!(e.ledgers.node_names(), vec!["g1"]);
    }

    #[test]
    fn reconcile_counts_and_repairs_drift() {
        let e = ext();
        let mut r = Relist::default();
        apply_pod_event(
            &e,
            &mut r,
            Event::Apply(typed(pod("gone", Some("n1"), "Running"))),
        );
        let nodes: Vec<Node> = vec![serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"nvidia.com/gpu.product": "NVIDIA-L40S", "nvidia.com/gpu.count": "4", "nvidia.com/gpu.memory": "46068"}},
            "status": {"allocatable": {"nvidia.com/gpu": "4"}}
        }))
        .unwrap()];
        let pods = vec![typed(pod("missed", Some("n1"), "Running"))];
        let d = reconcile_with(&e, &nodes, &pods, &"nvidia.com/gpu".into(), Instant::now());
        assert_eq!(d.phantom, 1);
        assert_eq!(d.missing, 1);
        assert_eq!(e.ledgers.uids(), vec!["missed"]);
        let again = reconcile_with(&e, &nodes, &pods, &"nvidia.com/gpu".into(), Instant::now());
        assert_eq!(again, Drift::default());

        // A list taken before the watch saw a new pod and a deletion is older than the watch:
        // it neither frees the new pod nor brings the deleted one back.
        let listed_at = Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(2));
        apply_pod_event(
            &e,
            &mut r,
            Event::Apply(typed(pod("late", Some("n1"), "Running"))),
        );
        apply_pod_event(
            &e,
            &mut r,
            Event::Delete(typed(pod("missed", Some("n1"), "Running"))),
        );
        let stale = reconcile_with(&e, &nodes, &pods, &"nvidia.com/gpu".into(), listed_at);
        assert_eq!(stale, Drift::default());
        assert_eq!(e.ledgers.uids(), vec!["late"]);
        // The next list, taken after both, agrees.
        let fresh = vec![typed(pod("late", Some("n1"), "Running"))];
        let d = reconcile_with(&e, &nodes, &fresh, &"nvidia.com/gpu".into(), Instant::now());
        assert_eq!(d, Drift::default());
    }

    #[test]
    fn nudges_go_to_pods_of_the_released_class() {
        use crate::extender::state::Waiting;
        let w = |c: &'static str| Waiting {
            namespace: "ml".into(),
            name: c.into(),
            class: c,
        };
        let waiting = vec![
            ("1".to_string(), w("mig")),
            ("2".to_string(), w("mps")),
            ("3".to_string(), w("device")),
        ];
        let released = vec![Released {
            node: "n".into(),
            class: "mig",
        }];
        let chosen: Vec<String> = pods_to_nudge(&waiting, &released, 10)
            .into_iter()
            .map(|(u, _)| u)
            .collect();
        assert_eq!(chosen, vec!["1", "3"]);
        assert_eq!(pods_to_nudge(&waiting, &released, 1).len(), 1);
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
                    if apply_pod_event(&e, &mut relist, ev) {
                        lists_done += 1;
                    }
                    if lists_done == 1 && e.ledgers.uids().len() == 2 {
                        saw_b_before_relist = true;
                    }
                }
                Some(Err(_)) => {}
                None => break,
            }
        }
        assert!(saw_b_before_relist, "the watch event fed the ledger");
        assert_eq!(e.ledgers.uids(), vec!["a", "b"]);
        assert_eq!(e.ledgers.with_node("n1", |nl| nl.usage.slots), Some(2));
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
            apply_pod_event(
                &e,
                &mut r,
                Event::Apply(typed(pod(uid, Some("n1"), "Running"))),
            );
        }
        let listed_at = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        let listed = list_compact(&client, &"nvidia.com/gpu".into())
            .await
            .unwrap();
        drop(client);
        let d = reconcile_listed(&e, listed, listed_at);
        assert_eq!((d.phantom, d.missing, d.nodes), (1, 1, 0));
        assert_eq!(e.ledgers.uids(), vec!["a", "c"]);
        let queries = server.await.unwrap();
        assert_eq!(queries.len(), 3, "{queries:?}");
    }

    /// Requeue end to end: a pod rejected for capacity waits; when a holding of its class is
    /// released, the requeuer patches the waiting pod.
    #[tokio::test]
    async fn a_release_nudges_the_waiting_pod() {
        let (client, mut handle) = crate::cluster::mock::client();
        let e = Arc::new(ext());
        let mut r = Relist::default();
        apply_pod_event(
            &e,
            &mut r,
            Event::Apply(typed(pod("holder", Some("n1"), "Running"))),
        );
        e.waiting.insert(
            "waiter".into(),
            crate::extender::state::Waiting {
                namespace: "ml".into(),
                name: "pod-waiter".into(),
                class: "exclusive",
            },
        );
        let (_tx, rx) = watch::channel(false);
        let metrics = Arc::new(Metrics::new());
        spawn_requeuer(
            client,
            e.clone(),
            metrics.clone(),
            e.subscribe_releases(),
            rx,
        );
        apply_pod_event(
            &e,
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
        assert!(!e.waiting.contains_key("waiter"));
    }
}

//! The advertiser: on the replica that leads (its kube-scheduler holds the Lease), every
//! [`TICK`] it compares what each GPU node of the ledger advertises of the quantity (from the
//! node watch, [`Seen`]) with [`advertise::capacity`], and patches the nodes' status where they
//! differ: a new node, a node its kubelet registered again (a new Node object advertises
//! nothing), a node whose GPUs changed. At most [`IN_FLIGHT`] patches at once; a node patched a
//! moment ago is not patched again while the watch catches up. While the policy's `gpuMilli` is
//! off, nothing is patched (and nothing advertised before is taken away).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher::Event;
use kube::{Api, Client};
use tokio::sync::watch::Receiver;

use super::advertise;
use crate::cluster::leadership::Leadership;
use crate::extender::state::ExtenderState;
use crate::metrics::Metrics;
use crate::shared::{PolicyStore, stopped};
use crate::sync::lock;

/// How often the advertiser compares.
pub const TICK: Duration = Duration::from_secs(2);
/// How many node patches are in flight at once.
pub const IN_FLIGHT: usize = 16;
/// How long a node patched is left alone while the watch catches up.
const PATCHED_FOR: Duration = Duration::from_secs(10);
/// How long one patch may take.
const PATCH_TIMEOUT: Duration = Duration::from_secs(10);

/// What each node advertises of the quantity, as the node watch last showed it.
#[derive(Default)]
pub struct Seen(Mutex<HashMap<String, u64>>);

impl Seen {
    /// Notes what a node event shows.
    pub fn observe(&self, event: &Event<Node>) {
        let mut seen = lock(&self.0);
        match event {
            Event::Apply(n) | Event::InitApply(n) => {
                let name = n.metadata.name.clone().unwrap_or_default();
                match advertise::advertised(n) {
                    Some(milli) => seen.insert(name, milli),
                    None => seen.remove(&name),
                };
            }
            Event::Delete(n) => {
                seen.remove(n.metadata.name.as_deref().unwrap_or_default());
            }
            Event::Init | Event::InitDone => {}
        }
    }

    /// What `node` advertises, as last seen.
    pub fn get(&self, node: &str) -> Option<u64> {
        lock(&self.0).get(node).copied()
    }
}

/// Starts the advertiser's loop.
pub fn spawn(
    client: Client,
    ext: Arc<ExtenderState>,
    policy: Arc<PolicyStore>,
    seen: Arc<Seen>,
    metrics: Arc<Metrics>,
    leadership: Leadership,
    mut shutdown: Receiver<bool>,
) {
    tokio::spawn(async move {
        let mut patched: HashMap<String, Instant> = HashMap::new();
        let mut leading = None;
        loop {
            tokio::select! {
                _ = stopped(&mut shutdown) => return,
                _ = tokio::time::sleep(TICK) => {}
            }
            if !policy.current().policy.gpu_milli || !ext.is_synced() {
                continue;
            }
            let Some(leads) = leadership
                .check(&client, &mut leading, "node advertiser")
                .await
            else {
                continue;
            };
            if !leads {
                continue;
            }
            let now = Instant::now();
            patched.retain(|_, at| now.duration_since(*at) < PATCHED_FOR);
            let mut desired = Vec::new();
            ext.ledger().for_each_node(|nl| {
                desired.push((nl.node.name.clone(), advertise::capacity(&nl.node)));
            });
            let due: Vec<(String, u64)> =
                advertise::due(desired.iter().map(|(n, m)| (n.as_str(), *m)), |n| {
                    seen.get(n)
                })
                .into_iter()
                .filter(|(n, _)| !patched.contains_key(n))
                .collect();
            if due.is_empty() {
                continue;
            }
            let started = Instant::now();
            let results: Vec<(String, u64, Result<(), PatchError>)> =
                futures::stream::iter(due.into_iter().map(|(node, milli)| {
                    let client = client.clone();
                    async move {
                        let r = patch(&client, &node, milli).await;
                        (node, milli, r)
                    }
                }))
                .buffer_unordered(IN_FLIGHT)
                .collect()
                .await;
            let (mut done, mut failed) = (0, 0);
            for (node, milli, r) in results {
                patched.insert(node.clone(), Instant::now());
                match r {
                    Ok(()) => {
                        done += 1;
                        metrics.advertisement("done");
                        tracing::debug!(node, milli, "node advertises gpu-share.io/gpu-milli");
                    }
                    Err(e) => {
                        failed += 1;
                        metrics.advertisement("error");
                        tracing::warn!(node, milli, error = %e, "cannot advertise gpu-share.io/gpu-milli on the node; tried again shortly");
                    }
                }
            }
            tracing::info!(
                nodes = done,
                failed,
                seconds = started.elapsed().as_secs_f64(),
                "GPU nodes advertise gpu-share.io/gpu-milli"
            );
        }
    });
}

/// Why a node's status was not patched.
#[derive(Debug, thiserror::Error)]
enum PatchError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("no answer within {} s", PATCH_TIMEOUT.as_secs())]
    Unanswered,
}

/// Patches `node`'s status to advertise `milli`.
async fn patch(client: &Client, node: &str, milli: u64) -> Result<(), PatchError> {
    let api: Api<Node> = Api::all(client.clone());
    let body = advertise::status_patch(milli);
    match tokio::time::timeout(
        PATCH_TIMEOUT,
        api.patch_status(node, &PatchParams::default(), &Patch::Merge(&body)),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.into()),
        Err(_) => Err(PatchError::Unanswered),
    }
}

//! The reservation controller. On the replica that leads (its kube-scheduler holds the Lease),
//! every [`TICK`] it weighs each GPU that gpu-share shares per GPU with
//! [`crate::reservation::plan`]: its reservation (from a watch of the reservations' namespace,
//! failed pods included), the shares the ledger holds on it, and their devices ConfigMaps (from
//! a watch of those alone). Then it carries the actions out: fills ConfigMaps, deletes released
//! or failed reservations, creates vanished ones again, re-points shares whose reservation failed
//! to another GPU gpu-share holds on the node, and evicts, with an event in words, what cannot
//! be re-pointed. Everything it reads comes from the API, so a restarted (or newly leading)
//! replica carries on where the last one stopped.
//!
//! As bind does, it decides over the cache and carries the decision out through an
//! [`Executor`]:
//! - [`gather`]: what it weighs each tick, read from the ledger and the watches;
//! - [`decision`]: what each action comes to now (the call, and what the ledger holds
//!   meanwhile), with no I/O;
//! - [`carry`]: the call, and the ledger settled by its answer.

mod carry;
pub mod decision;
pub mod gather;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::Client;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use tokio::sync::watch::Receiver;

use super::executor::{self, Executor};
use super::state::ExtenderState;
use crate::cluster::leadership::Leadership;
use crate::metrics::Metrics;
use crate::reservation::plan::{self, Action};
use crate::reservation::view::{DEVICES_SELECTOR, Filled, FilledByOwner};
use crate::reservation::{NAMESPACE, Template};
use crate::shared::{PolicyStore, stopped};
pub use carry::{ActionError, carry_out};
pub use decision::{Decided, Step, decide};
pub use gather::gather;

/// How often the controller weighs every shared GPU.
pub const TICK: Duration = Duration::from_secs(2);
/// How long shares in per-GPU form stay off a node after a reservation failed there.
pub const HOLD_OFF: Duration = Duration::from_secs(300);
/// How long an action done is not done again while the watches catch up with it.
const DONE_FOR: Duration = Duration::from_secs(15);

/// What the controller works with.
#[derive(Clone)]
struct Ctx {
    client: Client,
    ext: Arc<ExtenderState>,
    policy: Arc<PolicyStore>,
    template: Arc<Template>,
    metrics: Arc<Metrics>,
    io: executor::Api,
}

/// Starts the controller's watches and its loop.
pub fn spawn(
    client: Client,
    ext: Arc<ExtenderState>,
    policy: Arc<PolicyStore>,
    template: Arc<Template>,
    metrics: Arc<Metrics>,
    leadership: Leadership,
    shutdown: Receiver<bool>,
) {
    let reservations = crate::cluster::watch::reflect::<Pod>(
        kube::Api::namespaced(client.clone(), NAMESPACE),
        watcher::Config::default(),
        "reservations",
        shutdown.clone(),
    );
    ext.reservations.watch(reservations.clone());
    let configmaps = crate::cluster::watch::reflect::<ConfigMap>(
        kube::Api::all(client.clone()),
        watcher::Config::default().labels(DEVICES_SELECTOR),
        "devices configmaps",
        shutdown.clone(),
    );
    let ctx = Ctx {
        io: executor::Api::new(client.clone()),
        client,
        ext,
        policy,
        template,
        metrics,
    };
    tokio::spawn(run(ctx, reservations, configmaps, leadership, shutdown));
}

/// What the loop remembers between ticks.
#[derive(Default)]
struct Memory {
    /// Since when each reserved GPU has had no share.
    idle: HashMap<(String, u32), Instant>,
    /// Actions done lately, by key, while the watches catch up.
    done: HashMap<String, Instant>,
    leading: Option<bool>,
}

async fn run(
    ctx: Ctx,
    reservations: Store<Pod>,
    configmaps: Store<ConfigMap>,
    leadership: Leadership,
    mut shutdown: Receiver<bool>,
) {
    let mut memory = Memory::default();
    // Both watches have listed once.
    tokio::select! {
        _ = stopped(&mut shutdown) => return,
        _ = async {
            let _ = reservations.wait_until_ready().await;
            let _ = configmaps.wait_until_ready().await;
        } => {}
    }
    loop {
        tokio::select! {
            _ = stopped(&mut shutdown) => return,
            _ = tokio::time::sleep(TICK) => {}
        }
        if !ctx.ext.is_synced() {
            continue;
        }
        let Some(leading) = leadership
            .check(&ctx.client, &mut memory.leading, "reservation controller")
            .await
        else {
            continue;
        };
        if !leading {
            memory.idle.clear();
            continue;
        }
        let pods = ctx.ext.reservations.pods();
        let filled: FilledByOwner = configmaps
            .state()
            .iter()
            .filter_map(|c| Filled::of(c))
            .map(|f| (f.owner_uid.clone(), f))
            .collect();
        let now = Instant::now();
        memory
            .done
            .retain(|_, at| now.duration_since(*at) < DONE_FOR);
        let gpus = gather(ctx.ext.ledger(), &pods, &filled, &mut memory.idle, now);
        let policy = ctx.policy.current();
        let grace = Duration::from_secs(u64::from(policy.policy.per_gpu.release_after_seconds));
        for g in &gpus {
            let actions = plan::plan(g, grace);
            // A failed reservation: no new share is placed on its node while its shares are
            // moved or evicted (their replacements would land on it again).
            for a in &actions {
                if let Action::Delete {
                    why, failed: true, ..
                } = a
                {
                    ctx.ext
                        .hold_off(&g.node, Instant::now() + HOLD_OFF, why.clone());
                }
            }
            for action in actions {
                let key = key(&action);
                if memory.done.contains_key(&key) {
                    continue;
                }
                let decided = decide(&ctx.ext, &policy, &ctx.template, g, &gpus, action);
                if execute(&ctx.io, &ctx.metrics, g, decided).await {
                    memory.done.insert(key, Instant::now());
                }
            }
        }
    }
}

/// The key an action is remembered by.
fn key(a: &Action) -> String {
    match a {
        Action::Fill { share, .. } => format!("fill/{}", share.uid),
        Action::Delete { uid, .. } => format!("delete/{uid}"),
        Action::Recreate { node, gpu, .. } => format!("create/{node}/{gpu}"),
        Action::Move { share, .. } => format!("move/{}", share.uid),
        Action::Evict { share, .. } => format!("evict/{}", share.uid),
    }
}

/// Carries one decided action out through `io`; true when it is done (or needs no repeat soon).
pub async fn execute<E: Executor>(
    io: &E,
    metrics: &Metrics,
    gpu: &plan::Gpu,
    decided: Decided<'_>,
) -> bool {
    let step = match decided {
        Decided::Wait => return false,
        Decided::Skip(why) => {
            tracing::info!(node = %gpu.node, gpu = gpu.index, "{why}");
            return true;
        }
        Decided::Do(step) => step,
    };
    let kind = step.kind();
    match carry_out(io, *step).await {
        Ok(()) => {
            metrics.reservation_action(kind, "done");
            true
        }
        Err(e) => {
            let at = format!("GPU {} of node {}", gpu.index, gpu.node);
            tracing::warn!(action = kind, gpu = %at, error = %e, "reservation action failed; tried again next tick");
            metrics.reservation_action(kind, "error");
            false
        }
    }
}

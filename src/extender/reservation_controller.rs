//! The reservation controller. On the replica that leads (its kube-scheduler holds the Lease),
//! every [`TICK`] it weighs each GPU that gpu-share shares per GPU with
//! [`crate::reservation::plan`]: its reservation (from a watch of the reservations' namespace,
//! failed pods included), the shares the ledger holds on it, and their devices ConfigMaps (from
//! a watch of those alone). Then it carries the actions out: fills ConfigMaps, deletes released
//! or failed reservations, creates vanished ones again, re-points shares whose reservation failed
//! to another GPU gpu-share holds on the node, and evicts, with an event in words, what cannot
//! be re-pointed. Everything it reads comes from the API, so a restarted (or newly leading)
//! replica carries on where the last one stopped.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::watch::Receiver;

use super::state::ExtenderState;
use crate::cluster::reservation_api as api;
use crate::ledger::Ledger;
use crate::metrics::Metrics;
use crate::reservation::plan::{self, Action, ReservationState, Share, ShareKind};
use crate::reservation::view::{DEVICES_SELECTOR, Filled, FilledByOwner, Owner, ReservationPod};
use crate::reservation::{NAMESPACE, Template};
use crate::shared::{PolicyStore, stopped};

/// How often the controller weighs every shared GPU.
pub const TICK: Duration = Duration::from_secs(2);
/// How long shares in per-GPU form stay off a node after a reservation failed there.
pub const HOLD_OFF: Duration = Duration::from_secs(300);
/// How long an action done is not done again while the watches catch up with it.
const DONE_FOR: Duration = Duration::from_secs(15);

/// Where the controller learns whether its replica leads.
#[derive(Debug, Clone)]
pub struct Leadership {
    /// The Lease kube-scheduler's leader election holds (`namespace`, `name`).
    pub lease: (String, String),
    /// This host's name: the holder identity of a kube-scheduler on it begins with it.
    pub hostname: String,
}

impl Leadership {
    /// The Lease `namespace/name`, and this host's name.
    pub fn new(lease: &str) -> Self {
        let (namespace, name) = lease.split_once('/').unwrap_or(("gpu-share", lease));
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_default();
        Leadership {
            lease: (namespace.to_string(), name.to_string()),
            hostname,
        }
    }
}

/// What the controller works with.
#[derive(Clone)]
struct Ctx {
    client: Client,
    ext: Arc<ExtenderState>,
    policy: Arc<PolicyStore>,
    template: Arc<Template>,
    metrics: Arc<Metrics>,
    recorder: Recorder,
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
        Api::namespaced(client.clone(), NAMESPACE),
        watcher::Config::default(),
        "reservations",
        shutdown.clone(),
    );
    ext.reservations.watch(reservations.clone());
    let configmaps = crate::cluster::watch::reflect::<ConfigMap>(
        Api::all(client.clone()),
        watcher::Config::default().labels(DEVICES_SELECTOR),
        "devices configmaps",
        shutdown.clone(),
    );
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "gpu-share-scheduler".into(),
            instance: std::env::var("POD_NAME")
                .ok()
                .or_else(|| Some(leadership.hostname.clone())),
        },
    );
    let ctx = Ctx {
        client,
        ext,
        policy,
        template,
        metrics,
        recorder,
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
        let (ns, name) = &leadership.lease;
        let leading = match api::leads(&ctx.client, ns, name, &leadership.hostname).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, lease = %format!("{ns}/{name}"), "cannot read the leader Lease; reservations wait");
                continue;
            }
        };
        if memory.leading != Some(leading) {
            tracing::info!(
                leading,
                "reservation controller {}",
                if leading { "leads" } else { "follows" }
            );
            memory.leading = Some(leading);
        }
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
        let grace = Duration::from_secs(u64::from(
            ctx.policy.current().policy.per_gpu.release_after_seconds,
        ));
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
                        .ledger()
                        .hold_off(&g.node, Instant::now() + HOLD_OFF, why.clone());
                }
            }
            for action in actions {
                let key = key(&action);
                if memory.done.contains_key(&key) {
                    continue;
                }
                if execute(&ctx, g, &gpus, action).await {
                    memory.done.insert(key, Instant::now());
                }
            }
        }
    }
}

/// The shared GPUs: every GPU the ledger holds shares in per-GPU form on, or that a reservation
/// holds, with how long each reserved one has been idle (counted from its first idle tick).
fn gather(
    ledger: &Ledger,
    reservations: &[ReservationPod],
    filled: &FilledByOwner,
    idle: &mut HashMap<(String, u32), Instant>,
    now: Instant,
) -> Vec<plan::Gpu> {
    let mut gpus: BTreeMap<(String, u32), plan::Gpu> = BTreeMap::new();
    fn entry<'a>(
        gpus: &'a mut BTreeMap<(String, u32), plan::Gpu>,
        node: &str,
        index: u32,
    ) -> &'a mut plan::Gpu {
        gpus.entry((node.to_string(), index))
            .or_insert_with(|| plan::Gpu {
                node: node.to_string(),
                index,
                mps: false,
                reservation: None,
                shares: Vec::new(),
                idle_for: None,
            })
    }
    ledger.for_each_node(|nl| {
        for h in nl.holdings.values() {
            let Some(devices) = &h.demand.devices else {
                continue;
            };
            let kind = ShareKind::of(&h.demand.gpu, devices, nl.node.gpu_memory_mib);
            let configmap = &devices.configmap;
            for (i, _) in &h.placement.gpus {
                let g = entry(&mut gpus, &nl.node.name, *i);
                g.mps |= kind.is_mps();
                g.shares.push(Share {
                    namespace: h.pod.namespace.clone(),
                    name: h.pod.name.clone(),
                    uid: h.pod.uid.clone(),
                    configmap: configmap.clone(),
                    kind,
                    filled: filled
                        .get(&h.pod.uid)
                        .filter(|f| f.is_of(&h.pod.uid, configmap))
                        .map(|f| f.uuid.clone()),
                });
            }
        }
    });
    let wall = SystemTime::now();
    for r in reservations {
        let g = entry(&mut gpus, &r.node, r.gpu);
        g.mps |= r.mps;
        g.reservation = Some(r.at(wall));
    }
    for (k, g) in gpus.iter_mut() {
        if g.shares.is_empty() && g.reservation.is_some() {
            let since = *idle.entry(k.clone()).or_insert(now);
            g.idle_for = Some(now.duration_since(since));
        } else {
            idle.remove(k);
        }
    }
    idle.retain(|k, _| gpus.contains_key(k));
    gpus.into_values().collect()
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

fn owner(s: &Share) -> Owner {
    Owner {
        namespace: s.namespace.clone(),
        name: s.name.clone(),
        uid: s.uid.clone(),
    }
}

/// Why an action of the controller did not happen (tried again next tick).
#[derive(Debug, thiserror::Error)]
enum ActionError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error(transparent)]
    Create(#[from] api::CreateError),
}

/// Carries one action out; true when it is done (or needs no repeat soon).
async fn execute(ctx: &Ctx, gpu: &plan::Gpu, all: &[plan::Gpu], action: Action) -> bool {
    let at = format!("GPU {} of node {}", gpu.index, gpu.node);
    let kind = match &action {
        Action::Fill { .. } => "fill",
        Action::Delete { .. } => "delete",
        Action::Recreate { .. } => "create",
        Action::Move { .. } => "move",
        Action::Evict { .. } => "evict",
    };
    let result: Result<(), ActionError> = match action {
        Action::Fill { share, to } => {
            let reservation = gpu
                .reservation
                .as_ref()
                .map(|r| r.name.clone())
                .unwrap_or_default();
            match api::fill(
                &ctx.client,
                &share.configmap,
                &owner(&share),
                &to,
                &reservation,
            )
            .await
            {
                Ok(api::Fill::Done) => {
                    tracing::info!(pod = %format!("{}/{}", share.namespace, share.name), gpu = %at, devices = %to.devices(), "share pointed at its GPU");
                    Ok(())
                }
                Ok(api::Fill::Foreign(what)) => {
                    let why = format!(
                        "its devices ConfigMap {} already exists and {what}; it is immutable, so the pod cannot be pointed at {at} ({})",
                        share.configmap, to.uuid
                    );
                    evict(ctx, &share, &why).await
                }
                Err(e) => Err(e.into()),
            }
        }
        Action::Delete {
            reservation,
            uid,
            why,
            failed,
        } => {
            if !failed && has_shares(ctx.ext.ledger(), &gpu.node, gpu.index) {
                // A bind placed a share on it since this tick began: kept.
                return false;
            }
            let r = api::delete(&ctx.client, &reservation, &uid).await;
            if r.is_ok() {
                tracing::info!(reservation, why, "reservation deleted");
            }
            r.map_err(ActionError::from)
        }
        Action::Recreate {
            node,
            gpu: index,
            mps,
        } => {
            let policy = ctx.policy.current();
            let mut template = (*ctx.template).clone();
            template.runtime_class = policy.policy.runtime_class_name.clone();
            // Writing its GPU's CDI device where the policy says so, or where a share takes it.
            let takes = gpu
                .shares
                .iter()
                .any(|s| s.kind == ShareKind::Timeslice { cdi_device: true });
            template.cdi_device = !mps && (policy.policy.per_gpu.timeslice_cdi || takes);
            // Held from before the create leaves, and only while a share is still there: its
            // shares may have left since this tick began, and the GPU gone whole to a pod.
            let scorer = ctx.ext.scorer(policy.policy.packing.policy.into());
            let on_its_way = has_shares(ctx.ext.ledger(), &node, index)
                .then(|| {
                    super::on_its_way::hold(
                        &ctx.ext,
                        &scorer,
                        &node,
                        index,
                        mps,
                        template.cdi_device,
                    )
                    .ok()
                })
                .flatten();
            let Some(on_its_way) = on_its_way else {
                tracing::info!(
                    node,
                    gpu = index,
                    "reservation not created again: its shares left, or the GPU holds what a reservation cannot be beside"
                );
                return true;
            };
            let r = api::create(&ctx.client, &node, index, mps, &template).await;
            on_its_way.settle(&r);
            if r.is_ok() {
                tracing::info!(
                    node,
                    gpu = index,
                    "reservation created again: shares are bound to its GPU"
                );
            }
            r.map(|_| ()).map_err(ActionError::from)
        }
        Action::Move { share, why } => move_share(ctx, gpu, all, &share, &why).await,
        Action::Evict { share, why } => evict(ctx, &share, &why).await,
    };
    match result {
        Ok(()) => {
            ctx.metrics.reservation_action(kind, "done");
            true
        }
        Err(e) => {
            tracing::warn!(action = kind, gpu = %at, error = %e, "reservation action failed; tried again next tick");
            ctx.metrics.reservation_action(kind, "error");
            false
        }
    }
}

/// Evicts a share, with an event saying why.
async fn evict(ctx: &Ctx, share: &Share, why: &str) -> Result<(), ActionError> {
    api::evict(&ctx.recorder, &ctx.client, &owner(share), why).await?;
    tracing::warn!(pod = %format!("{}/{}", share.namespace, share.name), why, "share evicted");
    Ok(())
}

/// Whether the ledger holds a share in per-GPU form on GPU `index` of `node`.
fn has_shares(ledger: &Ledger, node: &str, index: u32) -> bool {
    ledger
        .with_node(node, |nl| {
            nl.holdings
                .values()
                .any(|h| h.demand.pointed() && h.placement.gpus.iter().any(|(i, _)| *i == index))
        })
        .unwrap_or(false)
}

/// Re-points a share whose reservation failed at another GPU of its node that a ready
/// reservation holds, chosen by the packing as at bind; evicts it when none has room.
async fn move_share(
    ctx: &Ctx,
    gpu: &plan::Gpu,
    all: &[plan::Gpu],
    share: &Share,
    why: &str,
) -> Result<(), ActionError> {
    let ready: Vec<u32> = all
        .iter()
        .filter(|g| g.node == gpu.node && g.index != gpu.index)
        .filter(|g| {
            g.reservation
                .as_ref()
                .is_some_and(|r| matches!(r.state, ReservationState::Ready { .. }))
        })
        .map(|g| g.index)
        .collect();
    let ledger = ctx.ext.ledger();
    let scorer = ctx
        .ext
        .scorer(ctx.policy.current().policy.packing.policy.into());
    let Some(gpus) = ledger.repoint(&scorer, &share.uid, &ready) else {
        let why = format!(
            "{why}; no other GPU gpu-share holds on node {} has room for it",
            gpu.node
        );
        return evict(ctx, share, &why).await;
    };
    let text = crate::packing::Placement {
        gpus: gpus.clone(),
        ..Default::default()
    }
    .gpus_text();
    let annotation = crate::ledger::ANNOTATION_GPUS;
    if let Err(e) = crate::cluster::binder::annotate(
        &ctx.client,
        &share.namespace,
        &share.name,
        annotation,
        &text,
    )
    .await
    {
        // The API still says the old GPU: so does the ledger.
        ledger.repoint(&scorer, &share.uid, &[gpu.index]);
        return Err(e.into());
    }
    let to = gpus.first().map_or(gpu.index, |(i, _)| *i);
    let note = format!("{why}; pointed at GPU {to} of the node instead");
    api::note(&ctx.recorder, &owner(share), false, api::EVENT_MOVED, &note).await;
    tracing::info!(pod = %format!("{}/{}", share.namespace, share.name), from = gpu.index, to, "share re-pointed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{GpuNode, Sharing};
    use crate::ledger::{ObservedPod, PodRef};
    use crate::packing::{Demand, GpuDemand};

    fn per_gpu_node() -> GpuNode {
        let mut n = GpuNode::whole("n1", "NVIDIA-A100-SXM4-80GB", 4, 81920);
        n.sharing = Sharing::PerGpu;
        n
    }

    fn share(uid: &str, gpu: u32, milli: u32) -> ObservedPod {
        ObservedPod {
            pod: PodRef::new(uid, "ml", format!("p-{uid}")),
            node: "n1".into(),
            demand: Demand {
                devices: Some(crate::packing::Devices {
                    configmap: format!("gpu-share-devices-{uid}"),
                    cdi_device: false,
                }),
                enforcement: crate::enforcement::Requirement::Off,
                driver_limit_mib: None,
                ..Demand::gpu(GpuDemand::Timeslice {
                    milli,
                    memory_mib: None,
                })
            },
            gpus: Some(vec![(gpu, milli)]),
        }
    }

    fn reservation(gpu: u32, state: ReservationState) -> ReservationPod {
        ReservationPod {
            name: crate::reservation::name("n1", gpu),
            uid: format!("r-{gpu}"),
            node: "n1".into(),
            gpu,
            mps: false,
            cdi_device: false,
            state,
            created: Some(SystemTime::now()),
        }
    }

    /// Shares and reservations meet per GPU; a share's ConfigMap counts only when it is the one
    /// its container reads, owned by it; idle time counts from the first idle tick.
    #[test]
    fn gather_meets_shares_and_reservations_per_gpu() {
        let ledger = Ledger::new();
        ledger.upsert_node(per_gpu_node());
        ledger.record(&share("a", 0, 300));
        ledger.record(&share("b", 0, 300));
        ledger.record(&share("c", 2, 500));
        let ready = |u: &str| ReservationState::Ready { uuid: u.into() };
        let pods = vec![
            reservation(0, ready("GPU-0")),
            reservation(1, ready("GPU-1")),
        ];
        let mut filled = FilledByOwner::new();
        let f = |uid: &str, name: &str| Filled {
            namespace: "ml".into(),
            name: name.into(),
            owner_uid: uid.into(),
            uuid: "GPU-0".into(),
            through: crate::reservation::view::Through::Uuid,
        };
        filled.insert("a".into(), f("a", "gpu-share-devices-a"));
        filled.insert("b".into(), f("b", "some-other-configmap"));
        let mut idle = HashMap::new();
        let t0 = Instant::now();
        let gpus = gather(&ledger, &pods, &filled, &mut idle, t0);
        assert_eq!(
            gpus.iter().map(|g| g.index).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        let g0 = &gpus[0];
        assert_eq!(g0.shares.len(), 2);
        let filled_of = |uid: &str| {
            g0.shares
                .iter()
                .find(|s| s.uid == uid)
                .unwrap()
                .filled
                .clone()
        };
        assert_eq!(filled_of("a").as_deref(), Some("GPU-0"));
        assert_eq!(
            filled_of("b"),
            None,
            "not the ConfigMap its container reads"
        );
        assert_eq!(g0.idle_for, None);
        assert_eq!(gpus[1].idle_for, Some(Duration::ZERO));
        assert!(gpus[2].reservation.is_none() && gpus[2].shares.len() == 1);
        // A later tick: idle since the first.
        let gpus = gather(
            &ledger,
            &pods,
            &filled,
            &mut idle,
            t0 + Duration::from_secs(31),
        );
        assert_eq!(gpus[1].idle_for, Some(Duration::from_secs(31)));
        assert_eq!(
            plan::plan(&gpus[1], Duration::from_secs(30)).len(),
            1,
            "released after the grace"
        );
        // A share arriving resets it.
        ledger.record(&share("d", 1, 100));
        let gpus = gather(
            &ledger,
            &pods,
            &filled,
            &mut idle,
            t0 + Duration::from_secs(32),
        );
        assert_eq!(gpus[1].idle_for, None);
        assert!(idle.is_empty());
    }

    /// A share moves only to one of the GPUs it is offered that has room for it, chosen by the
    /// packing (binpack: the fuller), and the ledger follows.
    #[test]
    fn a_share_is_repointed_only_where_it_fits() {
        let ledger = Ledger::new();
        ledger.upsert_node(per_gpu_node());
        ledger.record(&share("a", 0, 600));
        ledger.record(&share("b", 1, 500));
        ledger.record(&share("c", 3, 300));
        let scorer = crate::packing::Scorer::new(crate::packing::PackingPolicy::Binpack);
        assert_eq!(ledger.repoint(&scorer, "a", &[1]), None, "600 + 500 > 1000");
        assert_eq!(ledger.repoint(&scorer, "a", &[]), None, "nothing offered");
        assert_eq!(ledger.repoint(&scorer, "a", &[9]), None, "no such GPU");
        assert_eq!(
            ledger.repoint(&scorer, "a", &[1, 2, 3]),
            Some(vec![(3, 600)]),
            "GPU 3 (300 used) before the empty GPU 2; GPU 1 has no room"
        );
        ledger
            .with_node("n1", |nl| {
                assert_eq!(nl.usage.gpu_milli[0], 0);
                assert_eq!(nl.usage.gpu_milli[3], 900);
                assert!(nl.within_capacity());
            })
            .unwrap();
        assert!(has_shares(&ledger, "n1", 3) && !has_shares(&ledger, "n1", 0));
        // Put back (a failed patch): the ledger follows the API again.
        assert_eq!(ledger.repoint(&scorer, "a", &[0]), Some(vec![(0, 600)]));
        assert!(has_shares(&ledger, "n1", 0) && !has_shares(&ledger, "n1", 2));
        ledger
            .with_node("n1", |nl| assert_eq!(nl.usage.gpu_milli[3], 300))
            .unwrap();
    }
}

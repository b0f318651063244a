//! PURE over the ledger: what the reservation controller weighs each tick. Every GPU shared per
//! GPU meets its reservation, its shares and their devices ConfigMaps here, one
//! [`plan::Gpu`] each, for [`crate::reservation::plan`].

use std::collections::{BTreeMap, HashMap};
use std::time::{Instant, SystemTime};

use crate::extender::state::LedgerView;
use crate::reservation::plan::{self, Share, ShareKind};
use crate::reservation::view::{FilledByOwner, ReservationPod};

/// The shared GPUs: every GPU the ledger holds shares in per-GPU form on, or that a reservation
/// holds, with how long each reserved one has been idle (counted from its first idle tick).
pub fn gather(
    ledger: LedgerView<'_>,
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

/// Whether the ledger holds a share in per-GPU form on GPU `index` of `node`.
pub fn has_shares(ledger: LedgerView<'_>, node: &str, index: u32) -> bool {
    ledger
        .with_node(node, |nl| {
            nl.holdings
                .values()
                .any(|h| h.demand.pointed() && h.placement.gpus.iter().any(|(i, _)| *i == index))
        })
        .unwrap_or(false)
}

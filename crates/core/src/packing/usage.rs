//! Usage accounting: what is allocated on one node, what a placement adds to it, and adding or
//! removing a placement.

use std::collections::BTreeMap;

use serde::Serialize;

use super::demand::GPU_MILLI;
use crate::inventory::GpuNode;

/// What is allocated on one node.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub cpu_milli: u64,
    pub memory_mib: u64,
    /// Per full GPU, allocated thousandths (the per-GPU model; may exceed 1000 on a time-sliced
    /// node where the device plugin stacked replicas differently than modelled).
    pub gpu_milli: Vec<u32>,
    /// Units of the node's pool resource in use.
    pub slots: u32,
    /// Declared time-slicing budgets, thousandths of a GPU.
    pub budget_milli: u64,
    /// Declared GPU memory of mps/timeslice pods, MiB.
    pub gpu_memory_mib: u64,
    /// MIG devices in use per profile.
    pub mig: BTreeMap<String, u32>,
    /// Pods holding something here.
    pub pods: u32,
    /// Pods per GPU request kind ([`GpuDemand::tag`]): the `gpu-clustering` policy's view.
    pub tags: BTreeMap<u32, u32>,
    /// Per full GPU, the whole-GPU placements on it (exclusive pods, device-plugin units of an
    /// unshared node): a GPU held whole takes no share (the per-GPU model).
    pub whole: Vec<u32>,
    /// Per full GPU, the reservations holding it for shares ([`GpuDemand::ReservationPod`]): on a node
    /// gpu-share shares per GPU, a reserved GPU is shared even with no share on it yet (or
    /// still, during the release grace), so never free for whole-GPU pods.
    pub reserved: Vec<u32>,
    /// Per full GPU, the declared memory of the shares on it, MiB.
    pub gpu_memory: Vec<u64>,
    /// Per full GPU, the MPS shares and MPS reservations on it: a GPU whose MPS server serves
    /// shares takes no time-sliced one (a process that is no client of the server cannot open a
    /// context on a GPU in `EXCLUSIVE_PROCESS` mode), and the other way round.
    pub mps_holds: Vec<u32>,
    /// Per full GPU, the time-sliced shares and the reservations without MPS on it.
    pub plain_holds: Vec<u32>,
    /// Per full GPU, the time-sliced reservations on it that write no CDI device: a share that
    /// takes its GPU's device ([`Demand::takes_cdi_device`]) never goes there.
    pub without_device: Vec<u32>,
}

impl Usage {
    /// Empty usage for a node.
    pub fn empty(node: &GpuNode) -> Self {
        let n = node.gpus as usize;
        Usage {
            gpu_milli: vec![0; n],
            whole: vec![0; n],
            reserved: vec![0; n],
            gpu_memory: vec![0; n],
            mps_holds: vec![0; n],
            plain_holds: vec![0; n],
            without_device: vec![0; n],
            ..Usage::default()
        }
    }

    /// Whether GPU `i` is free: nothing on it and no reservation holding it (model).
    pub fn is_free(&self, i: usize) -> bool {
        self.gpu_milli.get(i).is_some_and(|m| *m == 0)
            && self.reserved.get(i).is_none_or(|r| *r == 0)
    }

    /// Whether `p` is a share on GPUs that reservations hold with no share on them yet (in
    /// their release grace, or just created).
    pub fn holds_for(&self, p: &Placement) -> bool {
        !p.gpus.is_empty()
            && p.shared
            && p.gpus.iter().all(|(i, _)| {
                let i = *i as usize;
                self.reserved.get(i).is_some_and(|r| *r > 0) && self.gpu_milli[i] == 0
            })
    }

    /// Whether a reservation pod holds GPU `i` (a share there brings no new one).
    pub fn is_reserved(&self, i: usize) -> bool {
        self.reserved.get(i).is_some_and(|r| *r > 0)
    }

    /// Whether GPU `i` can take shares: it is not held whole.
    pub fn is_shareable(&self, i: usize) -> bool {
        i < self.gpu_milli.len() && self.whole.get(i).is_none_or(|w| *w == 0)
    }

    /// Whether GPU `i` serves a share that takes its GPU's CDI device: no reservation on it
    /// writes none.
    pub fn serves_cdi_device(&self, i: usize) -> bool {
        self.without_device.get(i).is_none_or(|n| *n == 0)
    }

    /// Whether GPU `i` holds nothing of the other sharing class than `mps` says (MPS shares and
    /// time-sliced shares never share a GPU).
    pub fn class_ok(&self, i: usize, mps: bool) -> bool {
        let other = if mps {
            &self.plain_holds
        } else {
            &self.mps_holds
        };
        other.get(i).is_none_or(|n| *n == 0)
    }

    /// Whether GPU `i` takes a share (an MPS one when `mps`) of `milli` thousandths and
    /// `memory_mib` of declared memory on a node whose GPUs have `gpu_memory_mib` each (unknown:
    /// memory is not checked): it is not held whole nor by the other class, and neither its
    /// thousandths nor its memory pass the GPU's (the per-GPU model as enforced).
    pub fn takes_share(
        &self,
        i: usize,
        mps: bool,
        milli: u32,
        memory_mib: Option<u64>,
        gpu_memory_mib: Option<u64>,
    ) -> bool {
        self.is_shareable(i)
            && self.class_ok(i, mps)
            && self.gpu_milli[i].saturating_add(milli) <= GPU_MILLI
            && match (memory_mib, gpu_memory_mib) {
                (Some(want), Some(cap)) => {
                    let used = self.gpu_memory.get(i).copied().unwrap_or(0);
                    used.saturating_add(want) <= cap
                }
                _ => true,
            }
    }

    fn class_holds(&mut self, mps: bool) -> &mut Vec<u32> {
        if mps {
            &mut self.mps_holds
        } else {
            &mut self.plain_holds
        }
    }

    /// Full GPUs with nothing on them (model).
    pub fn free_gpus(&self) -> u32 {
        (0..self.gpu_milli.len())
            .filter(|i| self.is_free(*i))
            .count() as u32
    }

    /// Allocated thousandths over all full GPUs (model).
    pub fn allocated_milli(&self) -> u64 {
        self.gpu_milli
            .iter()
            .map(|m| u64::from((*m).min(GPU_MILLI)))
            .sum()
    }
}

/// What a placement adds to a node's [`Usage`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// Per-GPU model: (GPU index, thousandths).
    pub gpus: Vec<(u32, u32)>,
    pub slots: u32,
    pub budget_milli: u64,
    pub gpu_memory_mib: u64,
    pub mig: Option<(String, u32)>,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    /// The demand's [`GpuDemand::tag`].
    pub tag: Option<u32>,
    /// `gpus` is a share (mps/timeslice): its memory is the GPU's.
    pub shared: bool,
    /// `gpus` are whole GPUs (exclusive pods, units of an unshared node).
    pub whole: bool,
    /// A reservation holding this GPU for shares ([`GpuDemand::ReservationPod`]).
    pub reserve: Option<u32>,
    /// The reservation writes its GPU's CDI device ([`Usage::without_device`]).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub cdi_device: bool,
    /// The share, or the reservation, is an MPS one ([`Usage::mps_holds`]).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub mps: bool,
}

impl Placement {
    /// The per-GPU model as `index:milli` pairs, e.g. `0:250,3:1000` (the binding annotation).
    pub fn gpus_text(&self) -> String {
        self.gpus
            .iter()
            .map(|(i, m)| format!("{i}:{m}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Parses [`Placement::gpus_text`]; `None` if malformed.
    pub fn parse_gpus(text: &str) -> Option<Vec<(u32, u32)>> {
        if text.is_empty() {
            return Some(Vec::new());
        }
        text.split(',')
            .map(|p| {
                let (i, m) = p.split_once(':')?;
                Some((i.parse().ok()?, m.parse().ok()?))
            })
            .collect()
    }
}

/// Adds a placement to a node's usage.
pub fn apply(usage: &mut Usage, p: &Placement) {
    shift::<true>(usage, p);
}

/// Removes a placement that [`apply`] added.
pub fn unapply(usage: &mut Usage, p: &Placement) {
    shift::<false>(usage, p);
}

/// Adds (`ADD`) or removes a placement, field by field in one place, so that the two can never
/// disagree. Saturating both ways: a recorded pod may claim more than any node has (its spec is
/// not ours). Map entries that fall to zero are removed.
#[inline]
fn shift<const ADD: bool>(usage: &mut Usage, p: &Placement) {
    fn step<T: num_step::Step>(x: &mut T, by: T, add: bool) {
        *x = if add { x.up(by) } else { x.down(by) };
    }
    fn count<K: Ord + Clone>(
        map: &mut std::collections::BTreeMap<K, u32>,
        key: &K,
        by: u32,
        add: bool,
    ) {
        if add {
            let n = map.entry(key.clone()).or_default();
            *n = n.saturating_add(by);
        } else if let Some(n) = map.get_mut(key) {
            *n = n.saturating_sub(by);
            if *n == 0 {
                map.remove(key);
            }
        }
    }
    for (i, m) in &p.gpus {
        let i = *i as usize;
        if let Some(g) = usage.gpu_milli.get_mut(i) {
            step(g, *m, ADD);
        }
        if p.shared
            && let Some(g) = usage.gpu_memory.get_mut(i)
        {
            step(g, p.gpu_memory_mib, ADD);
        }
        if p.whole
            && let Some(w) = usage.whole.get_mut(i)
        {
            step(w, 1, ADD);
        }
        if p.shared
            && let Some(h) = usage.class_holds(p.mps).get_mut(i)
        {
            step(h, 1, ADD);
        }
    }
    if let Some(i) = p.reserve {
        if let Some(r) = usage.reserved.get_mut(i as usize) {
            step(r, 1, ADD);
        }
        if let Some(h) = usage.class_holds(p.mps).get_mut(i as usize) {
            step(h, 1, ADD);
        }
        if !p.mps
            && !p.cdi_device
            && let Some(w) = usage.without_device.get_mut(i as usize)
        {
            step(w, 1, ADD);
        }
    }
    step(&mut usage.slots, p.slots, ADD);
    step(&mut usage.budget_milli, p.budget_milli, ADD);
    step(&mut usage.gpu_memory_mib, p.gpu_memory_mib, ADD);
    if let Some((profile, n)) = &p.mig {
        count(&mut usage.mig, profile, *n, ADD);
    }
    step(&mut usage.cpu_milli, p.cpu_milli, ADD);
    step(&mut usage.memory_mib, p.memory_mib, ADD);
    step(&mut usage.pods, 1, ADD);
    if let Some(t) = p.tag {
        count(&mut usage.tags, &t, 1, ADD);
    }
}

/// Saturating steps for the usage counters' integer types.
mod num_step {
    pub trait Step: Copy {
        fn up(self, by: Self) -> Self;
        fn down(self, by: Self) -> Self;
    }
    macro_rules! step {
        ($($t:ty),*) => {$(
            impl Step for $t {
                #[inline]
                fn up(self, by: Self) -> Self { self.saturating_add(by) }
                #[inline]
                fn down(self, by: Self) -> Self { self.saturating_sub(by) }
            }
        )*};
    }
    step!(u32, u64);
}

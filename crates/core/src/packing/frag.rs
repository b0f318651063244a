//! PURE: the GPU fragmentation measure of the FGD paper (Weng et al., USENIX ATC'23), used by
//! the `fgd` and `gpu-share` scores and by the simulator's metrics.
//!
//! A *target workload* is a list of pod shapes with popularities. A node's fragmentation is the
//! expected amount of its idle GPU capacity (thousandths) that a pod drawn from the workload
//! could not use:
//! - the whole idle capacity when the shape cannot run there at all (it asks no GPU, the node
//!   lacks the CPU, the GPU model does not match, or too few GPUs have the share it needs);
//! - otherwise the idle capacity of the GPUs whose free share is smaller than the shape's.
//!
//! gpu-share's own policy scores with a variant, [`Measure::CpuCapped`], which also counts the
//! idle GPU capacity the node's free CPU cannot feed: the workload's GPU shapes ask, on average
//! and weighted by popularity, so many CPUs per GPU, so a node's free CPU feeds only so much of
//! its idle GPU capacity; the rest is *stranded* ([`Frag::stranded`]) and counts as fragments
//! too (a node with 8 free GPUs and 20 free CPUs, when pods ask 10 CPUs per GPU, strands 6
//! GPUs). On the paper's trace most pods that fail at full load fail for CPU on a node whose
//! GPUs are free, which the paper's measure does not see.
//!
//! The CPU is weighed against the mix, not shape by shape: a node with 96 CPUs for 8 GPUs feeds
//! them all when pods ask 16 and 8 CPUs per GPU half and half, though copies of the 16-CPU
//! shape alone would strand two. Counted shape by shape, a node was charged whenever one popular
//! shape could not fill it alone; against the mix, gpu-share is ahead of FGD on every trace and
//! variant of the benchmark, where shape by shape it trailed on the multi-GPU-heavy ones
//! (docs/packing.md).

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use serde::Serialize;

use super::demand::{Demand, GPU_MILLI, GpuDemand};
use super::usage::{Placement, Usage};
use crate::inventory::GpuNode;

/// One pod shape of a target workload (memory is ignored, as in the paper).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Shape {
    pub cpu_milli: u64,
    /// GPUs asked for (0 for CPU-only shapes).
    pub gpus: u32,
    /// Share needed on each of those GPUs, thousandths (1000 for whole GPUs).
    pub gpu_milli: u32,
    /// Allowed GPU models; empty means any.
    pub models: Vec<String>,
}

impl Shape {
    /// The shape of a demand on a per-GPU node; `None` for demands the measure does not model
    /// (MIG devices and device-plugin units).
    pub fn of(demand: &Demand) -> Option<Shape> {
        // MIG devices and device-plugin units are not shapes of the per-GPU model.
        if matches!(
            demand.gpu,
            GpuDemand::Mig { .. } | GpuDemand::Units { .. } | GpuDemand::ReservationPod { .. }
        ) {
            return None;
        }
        let (gpu_milli, gpus) = demand.gpu.per_gpu();
        Some(Shape {
            cpu_milli: demand.cpu_milli,
            gpus,
            gpu_milli,
            models: demand.models.clone(),
        })
    }
}

/// How a node's fragmentation counts the GPUs a fitting shape can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Measure {
    /// The paper's: a shape that fits once can use every GPU that has its share free.
    #[default]
    Fgd,
    /// gpu-share's: the paper's count, and the idle capacity the node's free CPU cannot feed
    /// at the CPU per GPU the workload's GPU shapes ask ([`Frag::stranded`]).
    CpuCapped,
}

/// A node's fragmentation in two parts, thousandths of a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Frag {
    /// The paper's: idle capacity the workload's shapes cannot use.
    pub fgd: f64,
    /// Under [`Measure::CpuCapped`], the idle capacity beyond what the node's free CPU feeds at
    /// the workload's CPU per GPU (0 under [`Measure::Fgd`], for nodes whose CPU is not
    /// tracked and for workloads without GPU shapes or asking no CPU).
    pub stranded: f64,
}

impl Frag {
    /// The fragmentation as one number: a GPU the CPU cannot feed is as idle as one too small.
    pub fn total(self) -> f64 {
        self.fgd + self.stranded
    }
}

/// Shapes with their popularities (summing to 1), most popular first.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TargetWorkload {
    pub shapes: Vec<(Shape, f64)>,
}

impl TargetWorkload {
    /// The most frequent shapes of `demands`, most frequent first, until they cover at least
    /// `coverage` (0..=1) of the demands; popularities renormalised over the kept shapes. Equal
    /// counts: more CPU, larger share, more GPUs first.
    pub fn typical<'a>(demands: impl IntoIterator<Item = &'a Demand>, coverage: f64) -> Self {
        let mut index: HashMap<Shape, usize> = HashMap::new();
        let mut counts: Vec<(Shape, u64)> = Vec::new();
        let mut total = 0u64;
        for d in demands {
            let Some(s) = Shape::of(d) else { continue };
            total += 1;
            match index.get(&s) {
                Some(i) => counts[*i].1 += 1,
                None => {
                    index.insert(s.clone(), counts.len());
                    counts.push((s, 1));
                }
            }
        }
        Self::from_counts(counts, total, coverage)
    }

    /// As [`TargetWorkload::typical`], from shape counts.
    pub fn from_counts(counts: Vec<(Shape, u64)>, total: u64, coverage: f64) -> Self {
        let weights = counts.into_iter().map(|(s, c)| (s, c as f64)).collect();
        Self::from_weights(weights, total as f64, coverage)
    }

    /// The heaviest shapes until they cover at least `coverage` (0..=1) of the total weight
    /// `total`, heaviest first, with popularities renormalised over the kept shapes. Equal
    /// weights: more CPU, larger share, more GPUs first (as the FGD simulator orders them).
    pub fn from_weights(mut weights: Vec<(Shape, f64)>, total: f64, coverage: f64) -> Self {
        if total <= 0.0 {
            return TargetWorkload::default();
        }
        weights.sort_by(|a, b| {
            b.1.total_cmp(&a.1).then_with(|| {
                (b.0.cpu_milli, b.0.gpu_milli, b.0.gpus, &b.0.models).cmp(&(
                    a.0.cpu_milli,
                    a.0.gpu_milli,
                    a.0.gpus,
                    &a.0.models,
                ))
            })
        });
        let want = coverage.clamp(0.0, 1.0) * total;
        let mut kept = 0.0;
        let mut shapes = Vec::new();
        for (s, w) in weights {
            if kept >= want && !shapes.is_empty() {
                break;
            }
            kept += w;
            shapes.push((s, w));
        }
        for (_, p) in &mut shapes {
            *p /= kept;
        }
        TargetWorkload { shapes }
    }

    pub fn is_empty(&self) -> bool {
        self.shapes.is_empty()
    }

    /// The node's fragmentation under `measure`, thousandths of a GPU, in its two parts, for
    /// CPU left `cpu_free` and the free share of each GPU.
    pub fn parts_by(
        &self,
        measure: Measure,
        product: Option<&str>,
        cpu_free: Option<u64>,
        gpu_free: &[u32],
    ) -> Frag {
        self.parts_held(measure, product, cpu_free, gpu_free, 0)
    }

    /// As [`TargetWorkload::parts_by`], where `held` of the GPUs with their whole share free are
    /// held for shares (reserved on a node gpu-share shares per GPU): shares fit them, whole-GPU
    /// shapes do not.
    pub fn parts_held(
        &self,
        measure: Measure,
        product: Option<&str>,
        cpu_free: Option<u64>,
        gpu_free: &[u32],
        held: usize,
    ) -> Frag {
        // The free shares, most first, and their prefix sums: the GPUs a shape fits are a
        // prefix.
        const STACK: usize = 32;
        let n = gpu_free.len();
        let (mut sorted_buf, mut prefix_buf) = ([0u32; STACK], [0u64; STACK + 1]);
        let (mut sorted_heap, mut prefix_heap) = (Vec::new(), Vec::new());
        let (sorted, prefix): (&mut [u32], &mut [u64]) = if n <= STACK {
            (&mut sorted_buf[..n], &mut prefix_buf[..=n])
        } else {
            sorted_heap.resize(n, 0);
            prefix_heap.resize(n + 1, 0);
            (&mut sorted_heap, &mut prefix_heap)
        };
        sorted.copy_from_slice(gpu_free);
        if n <= STACK {
            // Most first, by insertion: a node has a handful of GPUs (8 on the largest), where
            // this beats the library's sort and compiles the same wherever this module lands.
            for i in 1..n {
                let v = sorted[i];
                let mut j = i;
                while j > 0 && sorted[j - 1] < v {
                    sorted[j] = sorted[j - 1];
                    j -= 1;
                }
                sorted[j] = v;
            }
        } else {
            sorted.sort_unstable_by(|a, b| b.cmp(a));
        }
        for (i, f) in sorted.iter().enumerate() {
            prefix[i + 1] = prefix[i] + u64::from(*f);
        }
        let idle = prefix[n];
        if idle == 0 {
            return Frag::default();
        }
        let product = product.unwrap_or_default();
        let mut frag = Frag::default();
        // The CPU the GPU shapes ask per thousandth of GPU, weighted by popularity.
        let (mut cpu_asked, mut gpu_asked) = (0.0, 0.0);
        for (s, p) in &self.shapes {
            if s.gpus > 0 {
                cpu_asked += p * s.cpu_milli as f64;
                gpu_asked += p * f64::from(s.gpus) * f64::from(s.gpu_milli);
            }
            let lost = if s.gpus == 0
                || cpu_free.is_some_and(|c| c < s.cpu_milli)
                || (!s.models.is_empty() && !s.models.iter().any(|m| m == product))
            {
                idle
            } else {
                let mut fitting = sorted.partition_point(|f| *f >= s.gpu_milli);
                if s.gpu_milli >= GPU_MILLI {
                    // The held GPUs are among the wholly free ones, which sort first; each
                    // counts GPU_MILLI in the prefix like any other of them.
                    fitting = fitting.saturating_sub(held);
                }
                if fitting < s.gpus as usize {
                    idle
                } else {
                    idle - prefix[fitting]
                }
            };
            frag.fgd += p * lost as f64;
        }
        if let (Measure::CpuCapped, Some(cpu)) = (measure, cpu_free)
            && cpu_asked > 0.0
            && gpu_asked > 0.0
        {
            // The idle share the free CPU can feed at the workload's CPU per GPU; the rest is
            // stranded.
            let fed = cpu as f64 * gpu_asked / cpu_asked;
            frag.stranded = (idle as f64 - fed).max(0.0);
        }
        frag
    }

    /// The fragmentation of a node with this usage (per-GPU model; the paper's measure).
    pub fn node_frag(&self, node: &GpuNode, usage: &Usage) -> f64 {
        self.node_parts_by(Measure::Fgd, node, usage).total()
    }

    /// The fragmentation of a node with this usage under `measure`, in its two parts.
    pub fn node_parts_by(&self, measure: Measure, node: &GpuNode, usage: &Usage) -> Frag {
        self.frag_with(measure, node, usage, &[], 0, None)
    }

    /// The fragmentation of the node after a placement, under `measure`, in its two parts.
    pub fn parts_after(
        &self,
        measure: Measure,
        node: &GpuNode,
        usage: &Usage,
        p: &Placement,
    ) -> Frag {
        self.frag_with(measure, node, usage, &p.gpus, p.cpu_milli, p.reserve)
    }

    /// The fragmentation of a node with this usage plus `gpus` (index, thousandths),
    /// `cpu_milli` more and a reservation on GPU `reserve`.
    fn frag_with(
        &self,
        measure: Measure,
        node: &GpuNode,
        usage: &Usage,
        gpus: &[(u32, u32)],
        cpu_milli: u64,
        reserve: Option<u32>,
    ) -> Frag {
        let n = usage.gpu_milli.len();
        let mut buf = [0u32; 64];
        let mut heap = Vec::new();
        let free: &mut [u32] = if n <= buf.len() {
            &mut buf[..n]
        } else {
            heap.resize(n, 0);
            &mut heap
        };
        for (f, u) in free.iter_mut().zip(&usage.gpu_milli) {
            *f = GPU_MILLI.saturating_sub(*u);
        }
        for (i, m) in gpus {
            if let Some(f) = free.get_mut(*i as usize) {
                *f = f.saturating_sub(*m);
            }
        }
        let held = held_idle(usage, free, reserve);
        let cpu_free = node
            .cpu_milli
            .map(|c| c.saturating_sub(usage.cpu_milli.saturating_add(cpu_milli)));
        self.parts_held(measure, node.product.as_deref(), cpu_free, free, held)
    }
}

/// The GPUs with their whole share free (`free`) that a reservation holds for shares, counting a
/// new one on `reserve`.
fn held_idle(usage: &Usage, free: &[u32], reserve: Option<u32>) -> usize {
    free.iter()
        .enumerate()
        .filter(|(i, f)| {
            **f >= GPU_MILLI
                && (usage.reserved.get(*i).is_some_and(|r| *r > 0) || reserve == Some(*i as u32))
        })
        .count()
}

/// A node's fragmentation before a decision, remembered between decisions: it depends on the
/// node's free CPU and GPU shares and the target workload, not on the pod being placed, so a
/// node that did not change since the last decision needs only the "after" half of a score.
///
/// Keyed by what the measure reads (the workload, the measure, the node's GPU product and CPU,
/// and the usage), so a stale value is never returned whoever changed the node. The workload is
/// held weakly: its shapes go when the extender moves on to a newer one, while its address
/// stays reserved, so no later workload is mistaken for it.
///
/// Two entries, so that the values for a newer workload can be computed in the background
/// (see `ExtenderState::observe_demand`) while decisions still read the current one's.
#[derive(Debug, Clone, Default)]
pub struct FragMemo {
    slots: [Option<(MemoKey, Frag)>; 2],
    /// Which slot was written last (the other one is replaced first).
    last: usize,
}

#[derive(Debug, Clone)]
struct MemoKey {
    workload: Weak<TargetWorkload>,
    measure: Measure,
    product: Option<String>,
    cpu: (Option<u64>, u64),
    gpu_milli: [u32; MEMO_GPUS],
    gpus: usize,
    /// The reserved GPUs with nothing on them ([`held_idle`]).
    held: usize,
}

/// Nodes with more GPUs than this are not memoised.
const MEMO_GPUS: usize = 16;

/// The reserved GPUs with no share on them: what the measure reads of the reservations.
fn held_count(usage: &Usage) -> usize {
    (0..usage.gpu_milli.len())
        .filter(|i| usage.gpu_milli[*i] == 0 && usage.reserved.get(*i).is_some_and(|r| *r > 0))
        .count()
}

impl MemoKey {
    fn matches(
        &self,
        w: &Arc<TargetWorkload>,
        measure: Measure,
        node: &GpuNode,
        usage: &Usage,
    ) -> bool {
        std::ptr::eq(self.workload.as_ptr(), Arc::as_ptr(w))
            && self.measure == measure
            && self.cpu == (node.cpu_milli, usage.cpu_milli)
            && self.gpu_milli[..self.gpus] == usage.gpu_milli[..]
            && self.held == held_count(usage)
            && self.product.as_deref() == node.product.as_deref()
    }
}

impl FragMemo {
    /// `w.node_parts_by(measure, node, usage)`, from the memo when nothing it reads changed.
    pub fn node_frag(
        &mut self,
        w: &Arc<TargetWorkload>,
        measure: Measure,
        node: &GpuNode,
        usage: &Usage,
    ) -> Frag {
        for (k, v) in self.slots.iter().flatten() {
            if k.matches(w, measure, node, usage) {
                return *v;
            }
        }
        let value = w.node_parts_by(measure, node, usage);
        let n = usage.gpu_milli.len();
        if n > MEMO_GPUS {
            return value;
        }
        let mut gpu_milli = [0u32; MEMO_GPUS];
        gpu_milli[..n].copy_from_slice(&usage.gpu_milli);
        let key = MemoKey {
            workload: Arc::downgrade(w),
            measure,
            product: node.product.clone(),
            cpu: (node.cpu_milli, usage.cpu_milli),
            gpu_milli,
            gpus: n,
            held: held_count(usage),
        };
        // The slot of the same workload and measure (its value is stale), else the one not
        // written last.
        let same = self.slots.iter().position(|s| {
            s.as_ref().is_some_and(|(k, _)| {
                std::ptr::eq(k.workload.as_ptr(), Arc::as_ptr(w)) && k.measure == measure
            })
        });
        let slot = same.unwrap_or(1 - self.last);
        self.slots[slot] = Some((key, value));
        self.last = slot;
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(cpu: u64, gpus: u32, milli: u32) -> Shape {
        Shape {
            cpu_milli: cpu,
            gpus,
            gpu_milli: milli,
            models: vec![],
        }
    }

    #[test]
    fn frag_counts_what_each_shape_cannot_use() {
        let w = TargetWorkload {
            shapes: vec![(shape(1000, 1, 500), 0.5), (shape(1000, 2, 1000), 0.5)],
        };
        // GPUs free: 300, 1000. A 500 pod fits GPU 1 only: GPU 0's 300 is lost. A 2-GPU pod
        // cannot run: all 1300 are lost.
        let f = w
            .parts_by(Measure::Fgd, None, Some(8000), &[300, 1000])
            .total();
        assert!((f - (0.5 * 300.0 + 0.5 * 1300.0)).abs() < 1e-9);
        // Without the CPU for either shape, everything idle is fragment.
        let f = w
            .parts_by(Measure::Fgd, None, Some(500), &[300, 1000])
            .total();
        assert!((f - 1300.0).abs() < 1e-9);
        // A full node has no fragmentation.
        assert_eq!(
            w.parts_by(Measure::Fgd, None, Some(8000), &[0, 0]).total(),
            0.0
        );
    }

    #[test]
    fn cpu_capped_counts_the_gpus_the_cpu_cannot_feed() {
        let w = TargetWorkload {
            shapes: vec![(shape(10_000, 1, 1000), 1.0)],
        };
        let free = [1000u32; 8];
        // 20 CPUs feed two 10-CPU pods: the paper's measure loses nothing, the CPU-capped count
        // loses the other 6 GPUs.
        assert_eq!(
            w.parts_by(Measure::Fgd, None, Some(20_000), &free).total(),
            0.0
        );
        let parts = w.parts_by(Measure::CpuCapped, None, Some(20_000), &free);
        assert_eq!((parts.fgd, parts.stranded), (0.0, 6000.0));
        // With CPU for all eight, both agree.
        assert_eq!(
            w.parts_by(Measure::CpuCapped, None, Some(80_000), &free)
                .total(),
            0.0
        );
        // Without CPU accounting (a cluster node whose CPU is not tracked) too.
        assert_eq!(
            w.parts_by(Measure::CpuCapped, None, None, &free).total(),
            0.0
        );

        // A shared shape asks 1 CPU per half GPU: 2 CPUs feed 1000 of the 2800 free.
        let w = TargetWorkload {
            shapes: vec![(shape(1000, 1, 500), 1.0)],
        };
        let free = [300, 600, 900, 1000];
        let parts = w.parts_by(Measure::CpuCapped, None, Some(2000), &free);
        // The paper's 300 (GPU 0 is too small), and 1800 stranded for want of CPU.
        assert_eq!((parts.fgd, parts.stranded), (300.0, 1800.0));
        // The paper's measure strands nothing.
        let parts = w.parts_by(Measure::Fgd, None, Some(2000), &free);
        assert_eq!((parts.fgd, parts.stranded), (300.0, 0.0));
        // Never below the paper's measure.
        for cpu in [0, 500, 1000, 1500, 2500, 4000, 6000] {
            let f = w.parts_by(Measure::Fgd, None, Some(cpu), &free).total();
            let c = w
                .parts_by(Measure::CpuCapped, None, Some(cpu), &free)
                .total();
            assert!(c >= f, "cpu {cpu}: {c} < {f}");
        }
    }

    #[test]
    fn cpu_capped_weighs_the_cpu_against_the_mix() {
        // Half the pods ask 16 CPUs per GPU, half 8: 12 on average.
        let w = TargetWorkload {
            shapes: vec![(shape(16_000, 1, 1000), 0.5), (shape(8000, 1, 1000), 0.5)],
        };
        let free = [1000u32; 8];
        // 96 CPUs feed all eight GPUs, though copies of the 16-CPU shape alone would strand two.
        let parts = w.parts_by(Measure::CpuCapped, None, Some(96_000), &free);
        assert_eq!((parts.fgd, parts.stranded), (0.0, 0.0));
        // 72 CPUs feed six.
        let parts = w.parts_by(Measure::CpuCapped, None, Some(72_000), &free);
        assert_eq!((parts.fgd, parts.stranded), (0.0, 2000.0));
        // CPU-only shapes do not count in the CPU per GPU (they ask no GPU to feed); their
        // popularity still counts every idle GPU as lost, as in the paper.
        let mut with_cpu_only = w.clone();
        with_cpu_only.shapes = vec![
            (shape(16_000, 1, 1000), 0.25),
            (shape(8000, 1, 1000), 0.25),
            (shape(64_000, 0, 0), 0.5),
        ];
        let parts = with_cpu_only.parts_by(Measure::CpuCapped, None, Some(72_000), &free);
        assert_eq!((parts.fgd, parts.stranded), (4000.0, 2000.0));
        // No GPU shape, or GPU shapes asking no CPU: nothing is stranded.
        for shapes in [
            vec![(shape(4000, 0, 0), 1.0)],
            vec![(shape(0, 1, 1000), 1.0)],
        ] {
            let w = TargetWorkload { shapes };
            let parts = w.parts_by(Measure::CpuCapped, None, Some(0), &free);
            assert_eq!(parts.stranded, 0.0, "{:?}", w.shapes);
        }
    }

    #[test]
    fn memo_returns_the_measure_and_never_a_stale_one() {
        // Each step changes one input the measure reads, and the value with it: a memo that
        // missed that input in its key would return the step before's value.
        for m in [Measure::CpuCapped, Measure::Fgd] {
            let w = Arc::new(TargetWorkload {
                shapes: vec![(shape(10_000, 1, 500), 0.5), (shape(4000, 2, 1000), 0.5)],
            });
            let mut node = GpuNode::whole("n", "NVIDIA-A100-SXM4-80GB", 4, 81920);
            node.cpu_milli = Some(32_000);
            let mut usage = Usage::empty(&node);
            let mut memo = FragMemo::default();
            let mut last = None;
            let mut check = |w: &Arc<TargetWorkload>, n: &GpuNode, u: &Usage| {
                let want = w.node_parts_by(m, n, u);
                assert_ne!(last, Some(want), "{m:?}: the step must change the value");
                last = Some(want);
                assert_eq!(memo.node_frag(w, m, n, u), want, "{m:?} {u:?}");
                // Twice: the second comes from the memo.
                assert_eq!(memo.node_frag(w, m, n, u), want, "{m:?} {u:?}");
            };
            check(&w, &node, &usage);
            usage.gpu_milli[1] = 700;
            check(&w, &node, &usage);
            // A reservation on an idle GPU: the 2-GPU shape has one GPU fewer.
            usage.reserved[0] = 1;
            check(&w, &node, &usage);
            usage.cpu_milli = 25_000;
            check(&w, &node, &usage);
            node.cpu_milli = Some(64_000);
            check(&w, &node, &usage);
            let mut only_a100 = shape(1000, 1, 300);
            only_a100.models = vec!["NVIDIA-A100-SXM4-80GB".into()];
            let w2 = Arc::new(TargetWorkload {
                shapes: vec![(only_a100, 1.0)],
            });
            check(&w2, &node, &usage);
            node.product = Some("NVIDIA-H100-80GB-HBM3".into());
            check(&w2, &node, &usage);
            // Workloads dropped while a memo names them: a new one never takes their address.
            drop(w2);
            for milli in [1000, 200, 500] {
                let w3 = Arc::new(TargetWorkload {
                    shapes: vec![(shape(1000, 1, milli), 1.0)],
                });
                check(&w3, &node, &usage);
            }
        }
    }

    #[test]
    fn a_reserved_idle_gpu_takes_shares_but_no_whole_gpu_shape() {
        let w = TargetWorkload {
            shapes: vec![(shape(0, 1, 1000), 0.5), (shape(0, 1, 500), 0.5)],
        };
        let mut node = GpuNode::whole("n", "NVIDIA-A100-SXM4-80GB", 2, 81920);
        node.sharing = crate::inventory::Sharing::PerGpu;
        let mut usage = Usage::empty(&node);
        assert_eq!(w.node_frag(&node, &usage), 0.0);
        // GPU 0 reserved and empty: the whole shape loses its 1000, the half shape nothing.
        usage.reserved[0] = 1;
        assert!((w.node_frag(&node, &usage) - 500.0).abs() < 1e-9);
        // The same as a placement that reserves it.
        let p = Placement {
            reserve: Some(1),
            ..Placement::default()
        };
        let after = w.parts_after(Measure::Fgd, &node, &usage, &p).total();
        let mut reserved_both = usage.clone();
        super::super::usage::apply(&mut reserved_both, &p);
        assert_eq!(after, w.node_frag(&node, &reserved_both));
        assert!((after - 1000.0).abs() < 1e-9);
        // A share on the reserved GPU: it is no longer wholly free, and counts as any shared one.
        usage.gpu_milli[0] = 300;
        let shared = w.node_frag(&node, &usage);
        usage.reserved[0] = 0;
        assert_eq!(shared, w.node_frag(&node, &usage));
    }

    #[test]
    fn cpu_only_shapes_count_all_idle_gpus_and_models_must_match() {
        let mut g = shape(1000, 1, 1000);
        g.models = vec!["T4".into()];
        let w = TargetWorkload {
            shapes: vec![(shape(1000, 0, 0), 0.25), (g, 0.75)],
        };
        assert!((w.parts_by(Measure::Fgd, Some("T4"), None, &[1000]).total() - 250.0).abs() < 1e-9);
        assert!(
            (w.parts_by(Measure::Fgd, Some("V100"), None, &[1000])
                .total()
                - 1000.0)
                .abs()
                < 1e-9
        );
    }

    #[test]
    fn typical_keeps_the_most_frequent_shapes_up_to_the_coverage() {
        let d = |cpu: u64, milli: u32| Demand {
            cpu_milli: cpu,
            memory_mib: 7,
            gpu: GpuDemand::Timeslice {
                milli,
                memory_mib: None,
            },
            models: vec![],
            resources: vec![],
            devices: None,
            enforcement: crate::enforcement::Requirement::Off,
            driver_limit_mib: None,
        };
        let mut ds = vec![d(1000, 500); 6];
        ds.extend(vec![d(2000, 250); 3]);
        ds.push(d(3000, 100));
        let w = TargetWorkload::typical(&ds, 0.9);
        assert_eq!(w.shapes.len(), 2);
        assert_eq!(w.shapes[0].0, shape(1000, 1, 500));
        assert!((w.shapes[0].1 - 6.0 / 9.0).abs() < 1e-9);
        let all = TargetWorkload::typical(&ds, 1.0);
        assert_eq!(all.shapes.len(), 3);
        let sum: f64 = all.shapes.iter().map(|(_, p)| p).sum();
        assert!((sum - 1.0).abs() < 1e-9);
    }
}

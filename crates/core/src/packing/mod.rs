//! PURE: fit, place and score GPU demands on GPU nodes. The extender (filter, prioritize, bind,
//! preempt), the simulator and the benchmarks all call this module: there is one implementation.
//!
//! Two levels of truth live here:
//! - what the NVIDIA device plugin enforces, per node: MIG devices per profile, units of the
//!   node's pool resource (whole GPUs, replicas, single-strategy MIG devices), the declared
//!   time-slicing budget and memory. [`fit`] checks these, and the extender accounts them.
//! - a per-GPU model (`Usage::gpu_milli`): which GPU a share would land on. The device plugin
//!   picks the GPU itself, so in a cluster this is only a model (kept for scoring, the simulator
//!   and a future node agent); on [`Sharing::PerGpu`] nodes (the simulator's trace cluster) it is
//!   enforced, as in the FGD paper.

mod baselines;
mod demand;
mod fit;
pub mod frag;
mod held;
mod homes;
mod online_workload;
mod opening;
mod placements;
mod reason;
pub mod score;
mod usage;

use crate::inventory::GpuNode;

pub use baselines::{
    MAX_SPEC_CPU_MILLI, MAX_SPEC_GPU_MILLI, best_fit_score, dot_product_score,
    gpu_clustering_score, gpu_packing_score,
};
pub use demand::*;
pub use fit::*;
pub use frag::FragMemo;
pub use held::{memory_hold, share_of};
pub use homes::{Homes, SCARCITY_EXPONENT};
pub use online_workload::{OnlineWorkload, TYPICAL_COVERAGE, Workload};
pub use opening::{
    MPS_RESERVATION, PLAIN_RESERVATION, ReservationRequests, reservation_requests, reservation_room,
};
pub use placements::*;
pub use reason::Reason;
pub use score::{PackingPolicy, Scorer};
pub use usage::*;

/// Fits, then picks the placement the scorer likes best, reading (and keeping) the node's
/// fragmentation before the placement in `memo`: the node's own, kept between decisions, or a
/// fresh `FragMemo::default()`. Returns the placement and its score.
pub fn place(
    scorer: &Scorer,
    node: &GpuNode,
    usage: &Usage,
    demand: &Demand,
    memo: &mut FragMemo,
) -> Result<(Placement, f64), Reason> {
    fit(node, usage, demand)?;
    scorer
        .evaluate(node, usage, demand, memo)
        .ok_or(Reason::NoGpuWithRoom)
}

/// Integer extender scores 0..=10 from raw scores (higher is better): min-max scaled, so the
/// best node gets 10 and the worst 0; all equal get 10.
pub fn to_extender_scores(raw: &[f64]) -> Vec<i64> {
    let (lo, hi) = raw
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), s| {
            (lo.min(*s), hi.max(*s))
        });
    raw.iter()
        .map(|s| {
            if !(hi - lo).is_finite() || hi - lo < 1e-12 {
                10
            } else {
                (((s - lo) / (hi - lo)) * 10.0).round().clamp(0.0, 10.0) as i64
            }
        })
        .collect()
}

/// The fitting nodes (`Some`) that filter passes to kube-scheduler when the policy's
/// `packing.candidates` is `best`: those with the best packing score, every one of equals (to a
/// billionth of the score, so that nodes in the same state tie however their sums round).
/// kube-scheduler scores only the nodes filter passes, so its own plugins then choose among
/// equally well packed nodes; the node passed is the one the simulator's replay picks.
pub fn best_tier(raw: &[Option<f64>]) -> Vec<bool> {
    let best = raw
        .iter()
        .flatten()
        .copied()
        .fold(f64::NEG_INFINITY, f64::max);
    let slack = 1e-9 * best.abs().max(1.0);
    raw.iter()
        .map(|r| r.is_some_and(|s| s >= best - slack))
        .collect()
}

/// The top of the extender protocol's score range (`MaxExtenderPriority`).
pub const MAX_SCORE: i64 = 10;

/// Every node's prioritize score, 0..=10: the fitting nodes (`Some`) scaled by
/// [`to_extender_scores`], 0 for the others.
pub fn node_scores(raw: &[Option<f64>]) -> Vec<i64> {
    let fitting: Vec<f64> = raw.iter().flatten().copied().collect();
    let mut scaled = to_extender_scores(&fitting).into_iter();
    raw.iter()
        .map(|r| r.map_or(0, |_| scaled.next().unwrap_or(0)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{MigLayout, Sharing};

    #[test]
    fn the_best_tier_is_every_fitting_node_of_the_best_score() {
        let raw = [
            Some(1.0),
            None,
            Some(3.0),
            Some(1.0),
            Some(2.0),
            Some(3.0 + 1e-12),
            Some(2.99),
        ];
        // The two best tie (to a billionth); 2.99, within prioritize's top step, is not passed.
        assert_eq!(node_scores(&raw), vec![0, 0, 10, 0, 5, 10, 10]);
        assert_eq!(
            best_tier(&raw),
            vec![false, false, true, false, false, true, false]
        );
        // All alike: every fitting node is in the tier, and one that does not fit never is.
        assert_eq!(
            best_tier(&[Some(2.0), None, Some(2.0)]),
            vec![true, false, true]
        );
        assert_eq!(
            best_tier(&[Some(-4.0e6), Some(-4.0e6 - 1e-6), Some(-4.1e6)]),
            vec![true, true, false]
        );
        assert_eq!(best_tier(&[None, None]), vec![false, false]);
        assert_eq!(best_tier(&[Some(0.5)]), vec![true]);
    }

    #[test]
    fn mig_shares_follow_the_model_and_demands_print_as_annotations() {
        assert_eq!(mig_profile_milli("3g.40gb"), 428);
        assert_eq!(
            mig_profile_milli("1g.6gb"),
            250,
            "an A30 has 4 compute slices"
        );
        assert_eq!(mig_profile_milli("5g.99gb"), 714, "unknown: N of 7");
        let mig = GpuDemand::Mig {
            profile: "3g.40gb".into(),
            count: 2,
        };
        assert!((mig.gpus() - 0.856).abs() < 1e-9);
        assert_eq!(mig.to_string(), "mig-3g.40gb,count=2");
        assert_eq!(GpuDemand::Whole { count: 1 }.to_string(), "exclusive");
        let mps = GpuDemand::Mps {
            milli: 428,
            memory_mib: Some(40448),
        };
        assert_eq!(mps.to_string(), "mps-42.8,memory=40448Mi");
    }
    use crate::inventory::GpuNode;

    /// Under `enforcement.budgets: required` a share goes only where something holds its memory
    /// (the sentence says which gap, with no per-node value); under `preferred` anywhere it fits.
    #[test]
    fn required_enforcement_places_shares_only_where_their_memory_is_held() {
        use crate::enforcement::{Enforcement, Gap, MemoryLimits, Requirement};
        let with = |sharing: Sharing, limits: MemoryLimits| {
            let mut n = GpuNode::shared("n", "NVIDIA-A100-SXM4-80GB", 2, 81920, sharing);
            n.enforcement = Enforcement {
                driver: Some("615.25.01".into()),
                memory_limits: limits,
                timeslice_cdi: false,
            };
            n
        };
        // The budget the driver holds is the one the container carries for the toolkit's hook.
        let ts = |memory_mib: Option<u64>, enforcement: Requirement| Demand {
            enforcement,
            driver_limit_mib: memory_mib,
            ..Demand::gpu(GpuDemand::Timeslice {
                milli: 250,
                memory_mib,
            })
        };
        let old_ts = with(
            Sharing::TimeSlicing { replicas: 4 },
            MemoryLimits::DriverTooOld,
        );
        let new_ts = with(Sharing::TimeSlicing { replicas: 4 }, MemoryLimits::Applied);
        let old_mps = with(Sharing::Mps { replicas: 4 }, MemoryLimits::DriverTooOld);
        let fits = |n: &GpuNode, d: &Demand| fit(n, &Usage::empty(n), d);
        let required = ts(Some(20480), Requirement::Required);
        assert_eq!(
            fits(&old_ts, &required),
            Err(Reason::MemoryNotHeld(Gap::NoDriverLimits))
        );
        assert!(!Reason::MemoryNotHeld(Gap::NoDriverLimits).resolvable());
        assert!(fits(&new_ts, &required).is_ok());
        assert_eq!(
            fits(&new_ts, &ts(None, Requirement::Required)),
            Err(Reason::MemoryNotHeld(Gap::NoBudget))
        );
        // A budget in the request annotation without the hook's variables in the container
        // (a pod admitted under `off`, or before them) is no driver limit.
        let annotated_only = Demand {
            driver_limit_mib: None,
            ..required.clone()
        };
        assert_eq!(
            fits(&new_ts, &annotated_only),
            Err(Reason::MemoryNotHeld(Gap::NoBudget))
        );
        // The requirement is a share's: a node of another kind is refused for its kind.
        let mps_node = with(Sharing::Mps { replicas: 4 }, MemoryLimits::Applied);
        assert!(matches!(
            fits(&mps_node, &required),
            Err(Reason::SharingMismatch { .. })
        ));
        let units = Demand {
            enforcement: Requirement::Required,
            ..Demand::gpu(GpuDemand::Units {
                resource: "nvidia.com/gpu".into(),
                count: 1,
            })
        };
        assert!(
            fits(&old_ts, &units).is_ok(),
            "plain device-plugin pods are no shares"
        );
        assert!(fits(&old_ts, &ts(Some(20480), Requirement::Preferred)).is_ok());
        assert!(fits(&old_ts, &ts(None, Requirement::Off)).is_ok());
        // MPS: the device plugin's equal split holds it on any driver.
        let mps = Demand {
            enforcement: Requirement::Required,
            ..Demand::gpu(GpuDemand::Mps {
                milli: 250,
                memory_mib: None,
            })
        };
        assert!(fits(&old_mps, &mps).is_ok());
        let message = Reason::MemoryNotHeld(Gap::NoDriverLimits).message();
        assert!(
            Reason::all_messages().any(|m| m == message),
            "kube-scheduler's events are known to carry gpu-share's word: {message}"
        );
    }

    /// The case found on paper: a node of two A10s time-sliced 4 ways takes four `timeslice-40`
    /// shares (two per GPU); a fifth fits the node's pooled budget (2000) and a free replica, but
    /// no GPU has 400 thousandths left, so it is refused in words instead of modelled at 1200 on
    /// GPU 0; and what the node reports used is what its shares asked.
    #[test]
    fn a_time_sliced_node_never_models_a_gpu_past_its_whole() {
        let node = GpuNode::shared(
            "a10",
            "NVIDIA-A10",
            2,
            23028,
            Sharing::TimeSlicing { replicas: 4 },
        );
        let scorer = Scorer::new(PackingPolicy::GpuShare);
        let share = Demand::gpu(GpuDemand::Timeslice {
            milli: 400,
            memory_mib: None,
        });
        let mut usage = Usage::empty(&node);
        for _ in 0..4 {
            let (p, _) = place(&scorer, &node, &usage, &share, &mut FragMemo::default())
                .expect("two shares of 400 fit each GPU");
            apply(&mut usage, &p);
        }
        assert_eq!(usage.gpu_milli, vec![800, 800]);
        assert_eq!(
            place(&scorer, &node, &usage, &share, &mut FragMemo::default()).map(|_| ()),
            Err(Reason::NoGpuWithRoom)
        );
        assert_eq!(
            usage.allocated_milli(),
            1600,
            "four shares of 400 are 1.6 GPUs used"
        );
        // A unit asked of the device plugin directly is a replica (250): no GPU has it either.
        let unit = Demand::gpu(GpuDemand::Units {
            resource: "nvidia.com/gpu".into(),
            count: 1,
        });
        assert_eq!(
            place(&scorer, &node, &usage, &unit, &mut FragMemo::default()).map(|_| ()),
            Err(Reason::NoGpuWithRoom)
        );
        // One share of 200 still fits (a GPU at 1000 exactly).
        let small = Demand::gpu(GpuDemand::Timeslice {
            milli: 200,
            memory_mib: None,
        });
        let (p, _) = place(&scorer, &node, &usage, &small, &mut FragMemo::default()).unwrap();
        apply(&mut usage, &p);
        assert!(usage.gpu_milli.contains(&1000));
        // Declared memory counts per GPU too: 16 GiB fits the node's pool (2 x 22.5 GiB) but
        // not the GPU with room (8 GiB already declared there would pass its 22.5 GiB).
        let mut usage = Usage::empty(&node);
        let big = |gib: u64| {
            Demand::gpu(GpuDemand::Timeslice {
                milli: 100,
                memory_mib: Some(gib * 1024),
            })
        };
        for gib in [20, 8] {
            let (p, _) =
                place(&scorer, &node, &usage, &big(gib), &mut FragMemo::default()).unwrap();
            apply(&mut usage, &p);
        }
        assert_eq!(
            place(&scorer, &node, &usage, &big(16), &mut FragMemo::default()).map(|_| ()),
            Err(Reason::NoGpuWithMemory)
        );
    }

    /// Device-plugin units on a shared node fit exactly when the least-loaded placement the
    /// model gives them keeps every GPU within its whole: over every load of a 3-GPU node (any
    /// multiple of 100 thousandths per GPU) and every count, for time-slicing and MPS.
    #[test]
    fn units_fit_exactly_when_their_placement_keeps_every_gpu_whole() {
        for sharing in [
            Sharing::TimeSlicing { replicas: 4 },
            Sharing::Mps { replicas: 3 },
        ] {
            let node = GpuNode::shared("n", "H100", 3, 81559, sharing);
            for loads in 0..11u32.pow(3) {
                let mut usage = Usage::empty(&node);
                usage.gpu_milli = vec![loads % 11 * 100, loads / 11 % 11 * 100, loads / 121 * 100];
                for count in 1..=node.slots {
                    let demand = Demand::gpu(GpuDemand::Units {
                        resource: "nvidia.com/gpu".into(),
                        count,
                    });
                    let mut after = usage.gpu_milli.clone();
                    for (i, m) in &candidates(&node, &usage, &demand)[0].gpus {
                        after[*i as usize] += m;
                    }
                    let whole = after.iter().all(|m| *m <= GPU_MILLI);
                    let fits = fit_gpu(&node, &usage, &demand.gpu);
                    assert!(
                        fits.is_ok() == whole || fits == Err(Reason::BudgetUsedUp),
                        "{sharing:?} {:?} + {count}: fit {fits:?}, placed {after:?}",
                        usage.gpu_milli
                    );
                }
            }
        }
    }

    fn ts4() -> GpuNode {
        GpuNode::shared("ts", "H100", 2, 81559, Sharing::TimeSlicing { replicas: 4 })
    }

    fn mps4() -> GpuNode {
        GpuNode::shared("mps", "H100", 2, 81559, Sharing::Mps { replicas: 4 })
    }

    fn mig() -> GpuNode {
        GpuNode {
            gpus: 0,
            slots: 0,
            mig: MigLayout::Mixed {
                instances: [("1g.10gb".to_string(), 7), ("3g.40gb".to_string(), 2)]
                    .into_iter()
                    .collect(),
            },
            ..GpuNode::whole("mig", "A100", 0, 81920)
        }
    }

    fn ts(p: u32) -> Demand {
        Demand::gpu(GpuDemand::Timeslice {
            milli: p * 10,
            memory_mib: None,
        })
    }

    fn mps(p: u32) -> Demand {
        Demand::gpu(GpuDemand::Mps {
            milli: p * 10,
            memory_mib: None,
        })
    }

    fn add(node: &GpuNode, usage: &mut Usage, d: &Demand) -> Result<(), Reason> {
        let (p, _) = place(
            &Scorer::new(PackingPolicy::Binpack),
            node,
            usage,
            d,
            &mut FragMemo::default(),
        )?;
        apply(usage, &p);
        Ok(())
    }

    #[test]
    fn classes_never_mix() {
        let plain = GpuNode::whole("plain", "H100", 8, 81559);
        let empty = |n: &GpuNode| Usage::empty(n);
        assert!(fit(&plain, &empty(&plain), &ts(25)).is_err());
        assert!(fit(&plain, &empty(&plain), &mps(25)).is_err());
        assert!(fit(&ts4(), &empty(&ts4()), &mps(25)).is_err());
        assert!(fit(&mps4(), &empty(&mps4()), &ts(25)).is_err());
        let whole = Demand::gpu(GpuDemand::Whole { count: 1 });
        assert!(fit(&ts4(), &empty(&ts4()), &whole).is_err());
        assert!(fit(&mig(), &empty(&mig()), &whole).is_err());
        assert!(fit(&mig(), &empty(&mig()), &ts(25)).is_err());
        let m = Demand::gpu(GpuDemand::Mig {
            profile: "1g.10gb".into(),
            count: 1,
        });
        assert!(fit(&plain, &empty(&plain), &m).is_err());
        assert!(fit(&mig(), &empty(&mig()), &m).is_ok());
        assert_eq!(
            fit(&ts4(), &empty(&ts4()), &mps(25)).unwrap_err().message(),
            "node shares GPUs by time-slicing; pod asks MPS"
        );
    }

    #[test]
    fn mps_replica_must_be_large_enough() {
        let n = mps4();
        let u = Usage::empty(&n);
        assert_eq!(fit(&n, &u, &mps(50)), Err(Reason::MpsReplicaTooSmall));
        assert!(!Reason::MpsReplicaTooSmall.resolvable());
        assert!(fit(&n, &u, &mps(25)).is_ok());
        assert!(fit(&n, &u, &mps(10)).is_ok());
    }

    #[test]
    fn mps_fills_replicas_then_rejects_resolvably() {
        let n = mps4();
        let mut u = Usage::empty(&n);
        for _ in 0..8 {
            add(&n, &mut u, &mps(20)).unwrap();
        }
        assert_eq!(u.slots, 8);
        assert_eq!(add(&n, &mut u, &mps(20)), Err(Reason::NoFreeReplica));
        assert!(Reason::NoFreeReplica.resolvable());
        // The model puts 4 replicas of 250 on each GPU.
        assert_eq!(u.gpu_milli, vec![1000, 1000]);
    }

    #[test]
    fn timeslice_budget_is_bounded_by_gpus() {
        let n = ts4();
        let mut u = Usage::empty(&n);
        add(&n, &mut u, &ts(60)).unwrap();
        add(&n, &mut u, &ts(60)).unwrap();
        assert_eq!(u.budget_milli, 1200);
        // 800 of the pool's 2000 is left, but no GPU has 500 of it.
        assert_eq!(add(&n, &mut u, &ts(50)), Err(Reason::NoGpuWithRoom));
        add(&n, &mut u, &ts(40)).unwrap();
        add(&n, &mut u, &ts(40)).unwrap();
        assert_eq!(u.budget_milli, 2000);
        assert_eq!(add(&n, &mut u, &ts(10)), Err(Reason::BudgetUsedUp));
        // Replicas: 8 slots; budget is the binding limit here.
        assert_eq!(u.slots, 4);
    }

    #[test]
    fn timeslice_memory_budget() {
        let n = ts4();
        let mut u = Usage::empty(&n);
        let big = Demand::gpu(GpuDemand::Timeslice {
            milli: 10,
            memory_mib: Some(60_000),
        });
        add(&n, &mut u, &big).unwrap();
        add(&n, &mut u, &big).unwrap();
        assert_eq!(add(&n, &mut u, &big), Err(Reason::MemoryBudgetUsedUp));
        let huge = Demand::gpu(GpuDemand::Timeslice {
            milli: 10,
            memory_mib: Some(90_000),
        });
        assert_eq!(
            fit(&n, &Usage::empty(&n), &huge),
            Err(Reason::GpuMemoryTooSmall)
        );
    }

    #[test]
    fn mig_counts_per_profile() {
        let n = mig();
        let mut u = Usage::empty(&n);
        let big = Demand::gpu(GpuDemand::Mig {
            profile: "3g.40gb".into(),
            count: 1,
        });
        add(&n, &mut u, &big).unwrap();
        add(&n, &mut u, &big).unwrap();
        assert_eq!(add(&n, &mut u, &big), Err(Reason::MigProfileFull));
        let absent = Demand::gpu(GpuDemand::Mig {
            profile: "7g.80gb".into(),
            count: 1,
        });
        assert_eq!(fit(&n, &u, &absent), Err(Reason::MigProfileAbsent));
    }

    #[test]
    fn whole_gpus_and_unapply() {
        let n = GpuNode::whole("plain", "H100", 4, 81559);
        let mut u = Usage::empty(&n);
        let two = Demand::gpu(GpuDemand::Whole { count: 2 });
        let (p, _) = place(
            &Scorer::new(PackingPolicy::Binpack),
            &n,
            &u,
            &two,
            &mut FragMemo::default(),
        )
        .unwrap();
        apply(&mut u, &p);
        assert_eq!(u.gpu_milli, vec![1000, 1000, 0, 0]);
        add(&n, &mut u, &two).unwrap();
        assert_eq!(add(&n, &mut u, &two), Err(Reason::NoFreeGpus));
        unapply(&mut u, &p);
        assert_eq!(u.gpu_milli, vec![0, 0, 1000, 1000]);
        assert_eq!(u.slots, 2);
        let five = Demand::gpu(GpuDemand::Whole { count: 5 });
        assert_eq!(fit(&n, &u, &five), Err(Reason::TooFewGpus));
    }

    #[test]
    fn per_gpu_nodes_take_both_shapes() {
        let mut n = GpuNode::whole("trace", "G2", 2, 0);
        n.sharing = Sharing::PerGpu;
        n.gpu_memory_mib = None;
        let mut u = Usage::empty(&n);
        add(&n, &mut u, &ts(60)).unwrap();
        add(&n, &mut u, &ts(60)).unwrap();
        assert_eq!(u.gpu_milli, vec![600, 600]);
        assert_eq!(add(&n, &mut u, &ts(50)), Err(Reason::NoGpuWithRoom));
        add(&n, &mut u, &ts(40)).unwrap();
        assert_eq!(
            fit(&n, &u, &Demand::gpu(GpuDemand::Whole { count: 1 })),
            Err(Reason::NoFreeGpus)
        );
    }

    /// A share goes to a GPU a reservation holds already (here one idle in its release grace)
    /// rather than one that would need a new reservation, under every policy, with a workload
    /// known or not: the grace exists so that a GPU is not reserved again for every pod.
    #[test]
    fn shares_take_a_held_gpu_before_opening_another() {
        let mut n = GpuNode::whole("pg", "NVIDIA-A100-SXM4-80GB", 4, 81920);
        n.sharing = Sharing::PerGpu;
        let mut u = Usage::empty(&n);
        u.reserved[2] = 1;
        let share = ts(30);
        let seen = [share.clone(), Demand::gpu(GpuDemand::Whole { count: 1 })];
        let workload = std::sync::Arc::new(frag::TargetWorkload::typical(&seen, 1.0));
        for policy in [
            PackingPolicy::GpuShare,
            PackingPolicy::Fgd,
            PackingPolicy::Binpack,
            PackingPolicy::BestFit,
        ] {
            for scorer in [
                Scorer::new(policy),
                Scorer::with_workload(policy, workload.clone()),
            ] {
                let (p, _) = place(&scorer, &n, &u, &share, &mut FragMemo::default()).unwrap();
                assert_eq!(p.gpus, [(2, 300)], "{policy:?}");
            }
        }
    }

    /// A node gpu-share shares per GPU: each GPU is free, whole or shared. A reserved GPU is
    /// shared even with no share on it (the release grace), so whole-GPU pods never get it;
    /// shares never go to a GPU held whole; per GPU, shares stay within 100% and within the
    /// GPU's memory.
    #[test]
    fn per_gpu_nodes_keep_whole_and_shared_gpus_apart() {
        let mut n = GpuNode::whole("pg", "NVIDIA-A100-SXM4-80GB", 2, 81920);
        n.sharing = Sharing::PerGpu;
        let mut u = Usage::empty(&n);
        let reserve = |gpu| {
            Demand::gpu(GpuDemand::ReservationPod {
                gpu,
                mps: false,
                cdi_device: false,
            })
        };
        add(&n, &mut u, &reserve(0)).unwrap();
        assert_eq!(
            (u.reserved.clone(), u.gpu_milli.clone()),
            (vec![1, 0], vec![0, 0])
        );
        let whole = |count| Demand::gpu(GpuDemand::Whole { count });
        assert_eq!(fit(&n, &u, &whole(2)), Err(Reason::NoFreeGpus));
        add(&n, &mut u, &whole(1)).unwrap();
        assert_eq!(
            u.gpu_milli,
            vec![0, 1000],
            "the whole pod took the free GPU"
        );
        // Shares go to the reserved GPU, never to the whole one.
        let ts_mem = |p: u32, gib: u64| {
            Demand::gpu(GpuDemand::Timeslice {
                milli: p * 10,
                memory_mib: Some(gib * 1024),
            })
        };
        add(&n, &mut u, &ts_mem(30, 40)).unwrap();
        assert_eq!(u.gpu_milli, vec![300, 1000]);
        assert_eq!(u.gpu_memory, vec![40 * 1024, 0]);
        // Room in percent, none in memory; then none in percent.
        assert_eq!(fit(&n, &u, &ts_mem(30, 41)), Err(Reason::NoGpuWithMemory));
        assert!(Reason::NoGpuWithMemory.resolvable());
        add(&n, &mut u, &ts_mem(70, 40)).unwrap();
        assert_eq!(fit(&n, &u, &ts(1)), Err(Reason::NoGpuWithRoom));
        assert_eq!(u.whole, vec![0, 1]);
        // A reservation cannot hold a GPU held whole.
        assert_eq!(fit(&n, &u, &reserve(1)), Err(Reason::NoFreeGpus));
        assert_eq!(fit(&n, &u, &reserve(2)), Err(Reason::TooFewGpus));
        let plain = GpuNode::whole("plain", "H100", 8, 81559);
        assert_eq!(
            fit(&plain, &Usage::empty(&plain), &reserve(0))
                .unwrap_err()
                .message(),
            "node does not share GPUs; pod asks per-GPU sharing"
        );
    }

    /// A time-sliced share that takes its GPU's CDI device (`perGpu.timesliceCdi`) goes only to a
    /// GPU whose reservation writes the device, or to a free one (whose new reservation will);
    /// never beside a reservation that writes none, which a share of the bare UUID still takes.
    /// Where only such GPUs have room, the node says so in words.
    #[test]
    fn a_share_that_takes_its_gpus_cdi_device_never_goes_beside_a_reservation_without_it() {
        let mut n = GpuNode::whole("pg", "NVIDIA-A100-SXM4-80GB", 2, 81920);
        n.sharing = Sharing::PerGpu;
        let mut u = Usage::empty(&n);
        let scorer = Scorer::new(PackingPolicy::Binpack);
        let placed = |u: &mut Usage, d: &Demand| {
            let (p, _) = place(&scorer, &n, u, d, &mut FragMemo::default()).unwrap();
            apply(u, &p);
            p
        };
        let reserve = |gpu, cdi_device| {
            Demand::gpu(GpuDemand::ReservationPod {
                gpu,
                mps: false,
                cdi_device,
            })
        };
        let share = |p: u32, cdi_device: bool| Demand {
            devices: Some(Devices {
                configmap: "gpu-share-devices-x".into(),
                cdi_device,
            }),
            ..ts(p)
        };
        // GPU 0 held by a reservation without the device, a share of the bare UUID on it.
        let without = placed(&mut u, &reserve(0, false));
        add(&n, &mut u, &share(20, false)).unwrap();
        assert_eq!(u.without_device, vec![1, 0]);
        // The device's share goes to the free GPU, never beside them; a UUID share packs onto
        // the held GPU as before.
        let p = placed(&mut u, &share(20, true));
        assert_eq!(p.gpus, [(1, 200)]);
        assert_eq!(placed(&mut u, &share(20, false)).gpus, [(0, 200)]);
        // GPU 1 reserved with the device: the next device share packs beside the first.
        add(&n, &mut u, &reserve(1, true)).unwrap();
        assert_eq!(u.without_device, vec![1, 0]);
        assert_eq!(placed(&mut u, &share(70, true)).gpus, [(1, 700)]);
        // Room only on GPU 0: the device's share does not fit, in words; the UUID's does.
        assert_eq!(
            fit(&n, &u, &share(30, true)),
            Err(Reason::NoGpuWithCdiDevice)
        );
        assert!(Reason::NoGpuWithCdiDevice.resolvable());
        assert!(
            Reason::NoGpuWithCdiDevice
                .message()
                .contains("writes no CDI device")
        );
        assert_eq!(fit(&n, &u, &share(30, false)), Ok(()));
        assert!(candidates(&n, &u, &share(30, true)).is_empty());
        // Once GPU 0's reservation without the device goes, its GPU serves the device again.
        unapply(&mut u, &without);
        assert_eq!(u.without_device, vec![0, 0]);
        assert_eq!(fit(&n, &u, &share(30, true)), Ok(()));
    }

    /// A share that would open a GPU on a node shared per GPU brings the GPU's reservation pod;
    /// where the node's CPU (or memory) cannot hold it too, only a GPU a reservation already
    /// holds takes the share, and with none the node says why in words. The fit and the
    /// placement agree: fit passes only where a candidate is.
    #[test]
    fn a_share_opens_a_gpu_only_where_the_node_holds_its_reservation_too() {
        let mut n = GpuNode::whole("pg", "NVIDIA-A100-SXM4-80GB", 2, 81920);
        n.sharing = Sharing::PerGpu;
        n.cpu_milli = Some(8000);
        n.memory_mib = Some(65536);
        let scorer = Scorer::new(PackingPolicy::Binpack);
        let with_cpu = |d: Demand, cpu_milli: u64| Demand { cpu_milli, ..d };
        let mut u = Usage::empty(&n);
        let plain = PLAIN_RESERVATION;
        // The share leaves just its reservation's CPU: it opens GPU 0.
        let fits = with_cpu(ts(30), 8000 - plain.cpu_milli);
        assert_eq!(fit(&n, &u, &fits), Ok(()));
        // One millicore more and no GPU can be opened.
        let over = with_cpu(ts(30), 8000 - plain.cpu_milli + 1);
        assert_eq!(fit(&n, &u, &over), Err(Reason::NoRoomForReservation));
        assert!(candidates(&n, &u, &over).is_empty());
        assert!(Reason::NoRoomForReservation.resolvable());
        assert!(
            Reason::NoRoomForReservation
                .message()
                .contains("reservation pod")
        );
        // GPU 1 held by its reservation (in its grace, no share on it): the share goes there,
        // never to GPU 0, which it would have to open.
        let r = Demand {
            cpu_milli: plain.cpu_milli,
            memory_mib: plain.memory_mib,
            ..Demand::gpu(GpuDemand::ReservationPod {
                gpu: 1,
                mps: false,
                cdi_device: false,
            })
        };
        add(&n, &mut u, &r).unwrap();
        let over = with_cpu(ts(30), 8000 - plain.cpu_milli);
        assert_eq!(fit(&n, &u, &over), Ok(()));
        let (p, _) = place(&scorer, &n, &u, &over, &mut FragMemo::default()).unwrap();
        assert_eq!(p.gpus, [(1, 300)]);
        // An MPS share would open its GPU with the daemon's reservation, which asks more: the
        // time-sliced reservation on GPU 1 is of the other class, so nothing takes it.
        let mps_room = MPS_RESERVATION;
        let m = with_cpu(mps(30), 8000 - plain.cpu_milli - mps_room.cpu_milli + 1);
        assert_eq!(fit(&n, &u, &m), Err(Reason::NoRoomForReservation));
        let m = with_cpu(mps(30), 8000 - plain.cpu_milli - mps_room.cpu_milli);
        let (p, _) = place(&scorer, &n, &u, &m, &mut FragMemo::default()).unwrap();
        assert_eq!(p.gpus, [(0, 300)]);
        // Memory counts as CPU does.
        let big = Demand {
            memory_mib: 65536 - plain.memory_mib - mps_room.memory_mib + 1,
            ..mps(30)
        };
        assert_eq!(fit(&n, &u, &big), Err(Reason::NoRoomForReservation));
    }

    /// Per GPU, MPS shares of unequal sizes share a GPU (its own MPS daemon), within 100% and
    /// its memory, and never a GPU with time-sliced shares or a reservation without a daemon:
    /// a process that is no client of the GPU's MPS server cannot open a context there.
    #[test]
    fn per_gpu_mps_shares_take_unequal_sizes_and_never_a_time_sliced_gpu() {
        let mut n = GpuNode::whole("pg", "NVIDIA-A100-SXM4-80GB", 2, 81920);
        n.sharing = Sharing::PerGpu;
        let mut u = Usage::empty(&n);
        let mps = |p: u32, gib: u64| {
            Demand::gpu(GpuDemand::Mps {
                milli: p * 10,
                memory_mib: Some(gib * 1024),
            })
        };
        let ts_mem = |p: u32, gib: u64| {
            Demand::gpu(GpuDemand::Timeslice {
                milli: p * 10,
                memory_mib: Some(gib * 1024),
            })
        };
        let scorer = Scorer::new(PackingPolicy::Binpack);
        let placed = |u: &mut Usage, d: &Demand| {
            let (p, _) = place(&scorer, &n, u, d, &mut FragMemo::default()).unwrap();
            apply(u, &p);
            p
        };
        let a = placed(&mut u, &mps(25, 20));
        assert!(a.mps && a.shared && a.slots == 0, "{a:?}");
        let b = placed(&mut u, &mps(50, 40));
        assert_eq!(a.gpus[0].0, b.gpus[0].0, "packed on one GPU");
        let g = a.gpus[0].0 as usize;
        assert_eq!((u.gpu_milli[g], u.gpu_memory[g]), (750, 60 * 1024));
        assert_eq!(u.mps_holds[g], 2);
        // The time-sliced share goes to the other GPU, whatever room this one has.
        let t = placed(&mut u, &ts_mem(20, 10));
        assert_ne!(t.gpus[0].0 as usize, g);
        // Both GPUs now hold one class each: another time-sliced share that only the MPS GPU
        // has room for is refused for its class, in words.
        assert_eq!(fit(&n, &u, &ts_mem(90, 10)), Err(Reason::NoGpuWithRoom));
        assert_eq!(fit(&n, &u, &ts_mem(25, 10)), Ok(()));
        add(&n, &mut u, &ts_mem(75, 10)).unwrap();
        assert_eq!(fit(&n, &u, &ts_mem(25, 10)), Err(Reason::GpusOfOtherClass));
        assert!(
            Reason::GpusOfOtherClass
                .message()
                .contains("MPS shares and time-sliced shares never share a GPU")
        );
        // The MPS GPU still takes an MPS share within its room and memory.
        assert_eq!(fit(&n, &u, &mps(25, 20)), Ok(()));
        assert_eq!(fit(&n, &u, &mps(25, 21)), Err(Reason::NoGpuWithMemory));
        // Reservations: one with a daemon fits only a GPU of MPS shares, and the other way.
        let reserve = |gpu, mps| {
            Demand::gpu(GpuDemand::ReservationPod {
                gpu,
                mps,
                cdi_device: false,
            })
        };
        assert_eq!(fit(&n, &u, &reserve(g as u32, true)), Ok(()));
        assert_eq!(
            fit(&n, &u, &reserve(g as u32, false)),
            Err(Reason::NoFreeGpus)
        );
        // A share without a budget holds its fraction of the GPU's memory (its pinned limit).
        let unbudgeted = Demand::gpu(GpuDemand::Mps {
            milli: 250,
            memory_mib: None,
        });
        let c = placed(&mut u, &unbudgeted);
        assert_eq!(c.gpus[0].0 as usize, g);
        assert_eq!(u.gpu_memory[g], 80 * 1024);
        unapply(&mut u, &c);
        // Released, the GPU takes either class again.
        unapply(&mut u, &a);
        unapply(&mut u, &b);
        assert_eq!(u.mps_holds[g], 0);
        assert_eq!(fit(&n, &u, &reserve(g as u32, false)), Ok(()));
    }

    /// A share in per-GPU form (no device-plugin resource, pointed at its GPU by gpu-share)
    /// fits only a node shared per GPU; a share that asks the device plugin for a replica never
    /// fits one (the plugin would hand it a whole GPU).
    #[test]
    fn shares_fit_the_node_kind_their_form_asks_for() {
        let mut per_gpu = GpuNode::whole("pg", "NVIDIA-A100-SXM4-80GB", 2, 81920);
        per_gpu.sharing = Sharing::PerGpu;
        let sliced = GpuNode::shared(
            "ts",
            "NVIDIA-A100-SXM4-80GB",
            2,
            81920,
            Sharing::TimeSlicing { replicas: 4 },
        );
        let pointed = Demand {
            devices: Some(Devices {
                configmap: "gpu-share-devices-x".into(),
                cdi_device: false,
            }),
            enforcement: crate::enforcement::Requirement::Off,
            driver_limit_mib: None,
            ..ts(30)
        };
        let replica = Demand {
            resources: vec!["nvidia.com/gpu".into()],
            ..ts(30)
        };
        let fits = |n: &GpuNode, d: &Demand| fit(n, &Usage::empty(n), d);
        assert_eq!(fits(&per_gpu, &pointed), Ok(()));
        assert_eq!(
            fits(&sliced, &pointed).unwrap_err().message(),
            "node shares GPUs by time-slicing; pod asks a GPU shared per GPU"
        );
        assert_eq!(fits(&sliced, &replica), Ok(()));
        assert_eq!(
            fits(&per_gpu, &replica).unwrap_err().message(),
            "node shares GPUs per GPU; pod asks a replica from the device plugin"
        );
        // The simulator's demands name no resource and point nowhere: both kinds take them.
        assert_eq!(fits(&per_gpu, &ts(30)), Ok(()));
        assert_eq!(fits(&sliced, &ts(30)), Ok(()));
    }

    #[test]
    fn cpu_memory_and_model() {
        let mut n = GpuNode::whole("n", "V100M16", 1, 0);
        n.cpu_milli = Some(8000);
        n.memory_mib = Some(1000);
        let u = Usage::empty(&n);
        let mut d = Demand::gpu(GpuDemand::Whole { count: 1 });
        d.cpu_milli = 9000;
        assert_eq!(fit(&n, &u, &d), Err(Reason::Cpu));
        d.cpu_milli = 1000;
        d.memory_mib = 2000;
        assert_eq!(fit(&n, &u, &d), Err(Reason::Memory));
        d.memory_mib = 10;
        d.models = vec!["T4".into()];
        assert_eq!(fit(&n, &u, &d), Err(Reason::ModelNotAllowed));
        d.models = vec!["T4".into(), "V100M16".into()];
        assert!(fit(&n, &u, &d).is_ok());
    }

    #[test]
    fn units_count_against_the_pool() {
        let n = ts4();
        let mut u = Usage::empty(&n);
        let d = Demand::gpu(GpuDemand::Units {
            resource: "nvidia.com/gpu".into(),
            count: 3,
        });
        add(&n, &mut u, &d).unwrap();
        assert_eq!(u.slots, 3);
        assert_eq!(u.budget_milli, 750);
        let other = Demand::gpu(GpuDemand::Units {
            resource: "nvidia.com/gpu.shared".into(),
            count: 1,
        });
        assert_eq!(fit(&n, &u, &other), Err(Reason::ResourceAbsent));
    }

    #[test]
    fn extender_scores_are_scaled() {
        assert_eq!(to_extender_scores(&[0.2, 0.6, 1.0]), vec![0, 5, 10]);
        assert_eq!(to_extender_scores(&[0.5, 0.5]), vec![10, 10]);
        assert_eq!(to_extender_scores(&[]), Vec::<i64>::new());
    }

    #[test]
    fn gpus_text_round_trips() {
        let p = Placement {
            gpus: vec![(0, 250), (3, 1000)],
            ..Placement::default()
        };
        assert_eq!(p.gpus_text(), "0:250,3:1000");
        assert_eq!(Placement::parse_gpus("0:250,3:1000"), Some(p.gpus));
        assert_eq!(Placement::parse_gpus(""), Some(vec![]));
        assert_eq!(Placement::parse_gpus("x"), None);
    }
}

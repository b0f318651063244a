//! Holdings in flight: what the ledger holds for a call to the API from before the call leaves
//! until its answer settles it.
//! - A bind ([`Binding`]): the pod held on its node, shielded in a cluster by an assumption,
//!   then committed, aborted, or left in doubt until a read back says where the API has it.
//! - A reservation's create ([`OnItsWay`]): its GPU held by a stand-in
//!   ([`crate::ledger::Holder::StandIn`]), assumed like a bind, until the reservation's pod takes
//!   its place or the create is known to have made nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;

use super::{Assumed, ExtenderState};
use crate::cluster::reservation_api::CreateError;
use crate::ledger::{Holder, PodRef, stand_in_key};
use crate::packing::{Demand, GpuDemand, Reason, Scorer};
use crate::sync::lock;

/// A bind in progress: the holding it took, shielded in a cluster by an assumption until
/// the API shows the pod bound. Settled by [`Binding::commit`] or [`Binding::abort`]. Dropped
/// unsettled (its request cancelled while the binding call was in flight), the outcome is
/// unknown: the holding stays, and its assumption frees it after the assume TTL unless the API
/// shows the pod bound.
#[must_use = "settle a binding with commit or abort"]
pub struct Binding<'a> {
    ext: &'a ExtenderState,
    uid: String,
    node: String,
    assume: bool,
    held: bool,
    /// Whether the pod was marked waiting for a release when its bind began (the watch may
    /// show it bound, and unmark it, before the binding's answer comes back).
    was_waiting: bool,
    /// The promise the pod takes the room of: it replaces a pod a defragmentation plan moved
    /// ([`Binding::redeeming`]).
    promise: Option<String>,
}

impl Binding<'_> {
    /// The bind places the pod in the room promise `promise` holds on its node for it
    /// ([`crate::ledger::Ledger::redeem`]), rather than beside it.
    pub fn redeeming(self, promise: String) -> Self {
        Binding {
            promise: Some(promise),
            ..self
        }
    }

    /// Re-checks the fit and holds the demand on the node. In a cluster the pod is assumed
    /// there first: a watch event of the still-unbound pod in between must not free it. When
    /// nothing is held, there is nothing to shield and the assumption goes.
    pub fn hold(
        &mut self,
        scorer: &Scorer,
        pod: crate::ledger::PodRef,
        demand: Demand,
    ) -> Result<crate::packing::Placement, crate::packing::Reason> {
        if self.assume {
            self.ext.assume(
                &self.uid,
                Assumed {
                    node: self.node.clone(),
                    bound_at: None,
                },
            );
        }
        let placed = match &self.promise {
            Some(promise) => {
                let placed = self
                    .ext
                    .ledger
                    .redeem(scorer, &self.node, promise, pod, demand);
                if placed.is_ok() {
                    self.ext.note_redeemed(promise, &self.uid);
                }
                placed
            }
            None => self.ext.ledger.hold(scorer, &self.node, pod, demand),
        };
        self.held = placed.is_ok();
        if self.assume && !self.held {
            self.ext.confirm(&self.uid);
        }
        placed
    }

    /// The API bound the pod (or, in `--dev`, there is no API): the holding stays. A list begun
    /// from here on shows the pod unless it is gone; the pod no longer waits. Returns whether it
    /// was still waiting for a release to nudge it when its bind began (kube-scheduler retried
    /// it first).
    pub fn commit(self) -> bool {
        let ext = self.ext;
        let was_waiting = self.was_waiting;
        if self.assume && self.held {
            ext.assume(
                &self.uid,
                Assumed {
                    node: self.node.clone(),
                    bound_at: Some(Instant::now()),
                },
            );
        }
        lock(&ext.pods).bound(&self.uid);
        was_waiting
    }

    /// The outcome is unknown (no answer, and no read-back): the holding and its assumption
    /// stay, in doubt until [`ExtenderState::resolve`] learns where the API has the pod (freed
    /// now, it could be capacity a bound pod holds that the watch has not shown yet).
    pub fn doubt(self) {
        if self.held {
            lock(&self.ext.pods).doubt(&self.uid, &self.node);
        }
    }

    /// The binding failed: releases the holding this bind took, unless something confirmed
    /// it since (once the watch records the pod bound, it drops the assumption, and the holding
    /// is the pod's, not this bind's).
    pub fn abort(self) {
        if !self.held {
            return;
        }
        let ext = self.ext;
        let ours = !self.assume
            || ext
                .assumption(&self.uid)
                .is_some_and(|a| a.node == self.node && a.bound_at.is_none());
        if ours {
            ext.confirm(&self.uid);
            ext.ledger.release(&self.uid);
        }
    }
}

impl ExtenderState {
    /// Begins binding pod `uid` to `node`. In a cluster (`assume`), the holding bind takes is
    /// assumed until the API shows the pod there. Settle it with [`Binding::commit`] or
    /// [`Binding::abort`].
    pub fn begin_bind(&self, uid: &str, node: &str, assume: bool) -> Binding<'_> {
        Binding {
            ext: self,
            uid: uid.to_string(),
            node: node.to_string(),
            assume,
            held: false,
            was_waiting: self.has_no_room(uid),
            promise: None,
        }
    }

    /// The node an earlier bind of pod `uid` is in doubt on.
    pub fn in_doubt(&self, uid: &str) -> Option<String> {
        lock(&self.pods).in_doubt(uid).map(str::to_string)
    }

    /// What the API says of a pod in doubt: bound to `bound` (`None`: unbound, gone, replaced,
    /// or no answer for an assumption's lifetime). Bound there, the holding stays for the watch
    /// to record, its binding dated now (a list begun later shows the pod unless it is gone);
    /// otherwise it is released, unless the watch recorded the pod since.
    pub fn resolve(&self, uid: &str, bound: Option<&str>) {
        let Some(node) = lock(&self.pods).take_doubt(uid) else {
            return;
        };
        let ours = self
            .assumption(uid)
            .is_some_and(|a| a.node == node && a.bound_at.is_none());
        if ours && bound == Some(node.as_str()) {
            let bound_at = Some(Instant::now());
            self.assume(uid, Assumed { node, bound_at });
        } else if ours {
            self.confirm(uid);
            self.ledger.release(uid);
        }
    }
}

// ---- a reservation's create in flight ------------------------------------------------------
//
// Reservations on their way. A reservation holds its GPU in the ledger from before its create is
// sent, not from when the pod watch shows its pod. Bind creates a reservation and may then
// fail (the share is released, and the reservation pod exists all the same); the controller
// creates one for shares that may leave meanwhile; and a created pod reaches the watch a moment
// later, or, with a slow API server, many seconds later (a create that got no answer may still
// be made). Held only from the watch, the GPU would look free in between, and a whole-GPU pod
// could be given the GPU a reservation then runs on.
//
// The hold is a stand-in holding ([`crate::ledger::Holder::StandIn`]), assumed like a bind's: a
// reconcile keeps it, the reservation's pod takes its place when the API shows it, a refused
// create releases it, and otherwise it lapses with the assumption (the pod never appeared).

/// Numbers the stand-ins, so that two creates for one GPU (a bind and the controller) hold
/// apart.
static SERIAL: AtomicU64 = AtomicU64::new(0);

/// A GPU held for its reservation while the reservation's create is in flight.
pub struct OnItsWay<'a> {
    binding: Binding<'a>,
    ext: &'a ExtenderState,
    node: String,
    gpu: u32,
}

impl ExtenderState {
    /// Holds GPU `gpu` of `node` for its reservation, whose create is about to leave (running
    /// the GPU's MPS daemon when `mps`, writing its CDI device when `cdi_device`), checked as the
    /// reservation itself is: an error when the GPU is given whole or holds shares of the other
    /// class, and then nothing is to be created. Settle it with [`OnItsWay::settle`].
    pub fn begin_create(
        &self,
        scorer: &Scorer,
        node: &str,
        gpu: u32,
        mps: bool,
        cdi_device: bool,
    ) -> Result<OnItsWay<'_>, Reason> {
        let ext = self;
        let uid = stand_in_key(node, gpu, SERIAL.fetch_add(1, Ordering::Relaxed));
        let mut binding = ext.begin_bind(&uid, node, true);
        binding.hold(
            scorer,
            PodRef::new(
                uid.clone(),
                crate::reservation::NAMESPACE.to_string(),
                crate::reservation::name(node, gpu),
            )
            .held_by(Holder::StandIn),
            Demand::gpu(GpuDemand::ReservationPod {
                gpu,
                mps,
                cdi_device,
            }),
        )?;
        Ok(OnItsWay {
            binding,
            ext,
            node: node.to_string(),
            gpu,
        })
    }
}

impl OnItsWay<'_> {
    /// Settles the hold by what the create came to: released where the pod surely was not
    /// created, or where it existed and the ledger holds it already; otherwise kept (created,
    /// existing but not yet shown, or perhaps created) until the API shows the reservation's pod
    /// or the assumption lapses.
    pub fn settle(self, created: Result<&Option<Pod>, &CreateError>) {
        let release = match created {
            Err(e) => e.nothing_created(),
            Ok(None) => self.recorded(),
            Ok(Some(_)) => false,
        };
        if release {
            self.binding.abort();
        }
        // Otherwise the binding is left unsettled: an assumption's way of waiting for the API.
    }

    /// Whether the ledger holds the GPU's reservation itself (its pod, not a stand-in).
    fn recorded(&self) -> bool {
        self.ext
            .ledger()
            .with_node(&self.node, |nl| {
                nl.holdings.values().any(|h| {
                    h.pod.holder != Holder::StandIn
                        && matches!(h.demand.gpu, GpuDemand::ReservationPod { gpu, .. } if gpu == self.gpu)
                })
            })
            .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extender::state::Mode;
    use crate::inventory::{GpuNode, Sharing};
    use crate::ledger::ObservedPod;
    use crate::packing::PackingPolicy;
    use std::time::Duration;

    fn state(ttl: Duration) -> ExtenderState {
        let ext = ExtenderState::new(Mode::Cluster, ttl);
        ext.mark_synced();
        let mut n = GpuNode::whole("n1", "NVIDIA-A100-SXM4-80GB", 2, 81920);
        n.sharing = Sharing::PerGpu;
        ext.set_node("n1", Some(n));
        ext
    }

    fn whole_gpus(ext: &ExtenderState) -> Vec<u32> {
        ext.ledger()
            .with_node("n1", |nl| nl.usage.whole.clone())
            .unwrap()
    }

    /// Takes a whole GPU the way bind does: the GPU it was given, or why not.
    fn take_whole(ext: &ExtenderState, uid: &str) -> Result<Vec<u32>, Reason> {
        let scorer = Scorer::new(PackingPolicy::Binpack);
        let mut b = ext.begin_bind(uid, "n1", true);
        let p = b.hold(
            &scorer,
            PodRef::new(uid, "ml", uid),
            Demand::gpu(GpuDemand::Whole { count: 1 }),
        )?;
        b.commit();
        Ok(p.gpus.iter().map(|(i, _)| *i).collect())
    }

    fn reservation(uid: &str, gpu: u32) -> ObservedPod {
        ObservedPod {
            pod: PodRef::new(
                uid,
                crate::reservation::NAMESPACE,
                crate::reservation::name("n1", gpu),
            ),
            node: "n1".into(),
            demand: Demand::gpu(GpuDemand::ReservationPod {
                gpu,
                mps: false,
                cdi_device: false,
            }),
            gpus: None,
        }
    }

    /// The chaos run's case: a reservation created for GPU 1 whose pod the watch has not shown
    /// yet (its create unanswered, the bind that made it failed). No whole-GPU pod is given
    /// GPU 1 meanwhile; once the pod is recorded it holds the GPU in the stand-in's place.
    #[test]
    fn a_reservation_on_its_way_holds_its_gpu_until_its_pod_is_recorded() {
        let ext = state(Duration::from_secs(60));
        let scorer = Scorer::new(PackingPolicy::Binpack);
        let h = ext.begin_create(&scorer, "n1", 1, false, false).unwrap();
        h.settle(Err(&CreateError::Unanswered));
        assert_eq!(take_whole(&ext, "w0").unwrap(), [0], "GPU 1 is held");
        assert_eq!(
            take_whole(&ext, "w1"),
            Err(Reason::NoFreeGpus),
            "no GPU is free"
        );
        // A reconcile from a list that lacks the pod keeps the stand-in.
        let listed = ext.retain_pods(
            &["w0".to_string()].into_iter().collect(),
            std::time::Instant::now(),
        );
        assert_eq!(listed, 0, "nothing dropped");
        // The reservation's pod, recorded, takes the stand-in's place: one holding on GPU 1.
        ext.record(&reservation("r-uid", 1));
        let held: Vec<String> = ext.ledger().uids();
        assert_eq!(held, ["r-uid", "w0"], "the stand-in is gone");
        assert_eq!(
            ext.ledger()
                .with_node("n1", |nl| nl.usage.reserved.clone())
                .unwrap(),
            [0, 1]
        );
        assert_eq!(take_whole(&ext, "w1"), Err(Reason::NoFreeGpus));
        // Released with its pod, the GPU is free again.
        ext.forget_pod("r-uid");
        assert_eq!(take_whole(&ext, "w1").unwrap(), [1]);
    }

    /// A create the API refused made nothing: the GPU is free at once. One with no answer that
    /// never appears lapses with the assumption.
    #[test]
    fn a_refused_create_frees_the_gpu_and_a_lost_one_lapses() {
        let ext = state(Duration::from_millis(300));
        let scorer = Scorer::new(PackingPolicy::Binpack);
        ext.begin_create(&scorer, "n1", 0, false, false)
            .unwrap()
            .settle(Err(&CreateError::NoImage));
        assert!(ext.ledger().uids().is_empty(), "released");
        ext.begin_create(&scorer, "n1", 0, false, false)
            .unwrap()
            .settle(Err(&CreateError::Unanswered));
        assert_eq!(ext.ledger().uids().len(), 1, "held");
        std::thread::sleep(Duration::from_millis(400));
        ext.run_pending();
        assert!(ext.ledger().uids().is_empty(), "lapsed");
        assert_eq!(whole_gpus(&ext), [0, 0]);
    }

    /// A create that found the reservation existing keeps the stand-in only while the ledger
    /// has not recorded the reservation's pod (a racing create's, still on its way).
    #[test]
    fn an_existing_reservation_keeps_the_stand_in_only_until_recorded() {
        let ext = state(Duration::from_secs(60));
        let scorer = Scorer::new(PackingPolicy::Binpack);
        ext.begin_create(&scorer, "n1", 1, false, false)
            .unwrap()
            .settle(Ok(&None));
        assert_eq!(ext.ledger().uids().len(), 1, "kept: not recorded yet");
        ext.record(&reservation("r-uid", 1));
        ext.begin_create(&scorer, "n1", 1, false, false)
            .unwrap()
            .settle(Ok(&None));
        assert_eq!(ext.ledger().uids(), ["r-uid"], "released: recorded");
    }

    /// A GPU given whole takes no reservation: nothing is held, and nothing is to be created.
    #[test]
    fn a_gpu_given_whole_is_not_held_for_a_reservation() {
        let ext = state(Duration::from_secs(60));
        let scorer = Scorer::new(PackingPolicy::Binpack);
        take_whole(&ext, "w0").unwrap();
        take_whole(&ext, "w1").unwrap();
        assert!(ext.begin_create(&scorer, "n1", 1, false, false).is_err());
        assert_eq!(ext.ledger().uids(), ["w0", "w1"]);
    }
}

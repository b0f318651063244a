//! A bind in progress, from the holding it takes to its settling: committed, aborted, or
//! left in doubt until a read back says where the API has the pod.

use std::time::Instant;

use super::{Assumed, ExtenderState};
use crate::packing::{Demand, Scorer};
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
}

impl Binding<'_> {
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
        let placed = self.ext.ledger.hold(scorer, &self.node, pod, demand);
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

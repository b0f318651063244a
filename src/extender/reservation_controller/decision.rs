//! What the reservation controller decides over the cache for one action of
//! [`crate::reservation::plan`], with no I/O: the call to make and, where the ledger must move
//! before the API does, the ledger moved (a reservation's GPU held from before its create is
//! sent, a share re-pointed before its annotation is written). How each answer settles it is
//! here too ([`Move::settle`], [`crate::extender::state::in_flight::OnItsWay::settle`]);
//! [`super::carry`] makes the calls.

use crate::extender::executor::Fill;
use crate::extender::state::ExtenderState;
use crate::extender::state::in_flight::OnItsWay;
use crate::packing::{Placement, Scorer};
use crate::reservation::Template;
use crate::reservation::plan::{self, Action, ReservationState, Share, ShareKind};
use crate::reservation::view::Owner;
use crate::shared::LoadedPolicy;

use super::gather::has_shares;

/// What to do about one action now.
pub enum Decided<'a> {
    /// Nothing yet: weigh it again next tick (a bind placed a share on a GPU whose reservation
    /// was to go since this tick began).
    Wait,
    /// Nothing, and nothing to repeat: why, in words.
    Skip(&'static str),
    /// A call to make.
    Do(Box<Step<'a>>),
}

/// One call the controller makes, with what it holds in the ledger meanwhile.
pub enum Step<'a> {
    /// Point a share at its GPU (`at`: the GPU, in words, for what is said if it cannot be).
    Fill { fill: Fill, at: String },
    /// Delete a reservation (released, or failed).
    Delete {
        reservation: String,
        uid: String,
        why: String,
    },
    /// Create a GPU's reservation again, its GPU held from before the create is sent.
    Create {
        node: String,
        gpu: u32,
        mps: bool,
        template: Template,
        on_its_way: OnItsWay<'a>,
    },
    /// Point a share at another GPU of its node: the ledger holds it there already.
    Move(Move<'a>),
    /// Evict a share, with an event saying why.
    Evict { owner: Owner, why: String },
}

impl Step<'_> {
    /// The kind of call, as the metric labels it.
    pub fn kind(&self) -> &'static str {
        match self {
            Step::Fill { .. } => "fill",
            Step::Delete { .. } => "delete",
            Step::Create { .. } => "create",
            Step::Move(_) => "move",
            Step::Evict { .. } => "evict",
        }
    }
}

/// A share re-pointed in the ledger, its annotation still to write.
pub struct Move<'a> {
    ext: &'a ExtenderState,
    scorer: Scorer,
    pub owner: Owner,
    /// The GPU it leaves.
    pub from: u32,
    /// The GPUs it takes, as its `gpu-share.io/gpus` annotation says them.
    pub annotation: String,
    /// The event on it, in words.
    pub note: String,
}

impl Move<'_> {
    /// Settles the ledger by whether the annotation was written: if not, the API still says the
    /// old GPU, and so does the ledger again.
    pub fn settle(self, written: bool) {
        if !written {
            self.ext
                .repoint(&self.scorer, &self.owner.uid, &[self.from]);
        }
    }
}

/// Decides `action` for `gpu` (of `all` this tick's GPUs) over the cache, under `policy`, with
/// reservations made of `template`.
pub fn decide<'a>(
    ext: &'a ExtenderState,
    policy: &LoadedPolicy,
    template: &Template,
    gpu: &plan::Gpu,
    all: &[plan::Gpu],
    action: Action,
) -> Decided<'a> {
    let at = format!("GPU {} of node {}", gpu.index, gpu.node);
    match action {
        Action::Fill { share, to } => {
            let reservation = gpu
                .reservation
                .as_ref()
                .map(|r| r.name.clone())
                .unwrap_or_default();
            Decided::Do(Box::new(Step::Fill {
                fill: Fill {
                    configmap: share.configmap.clone(),
                    owner: owner(&share),
                    to,
                    reservation,
                },
                at,
            }))
        }
        Action::Delete {
            reservation,
            uid,
            why,
            failed,
        } => {
            if !failed && has_shares(ext.ledger(), &gpu.node, gpu.index) {
                return Decided::Wait;
            }
            Decided::Do(Box::new(Step::Delete {
                reservation,
                uid,
                why,
            }))
        }
        Action::Recreate {
            node,
            gpu: index,
            mps,
        } => recreate(ext, policy, template, gpu, node, index, mps),
        Action::Move { share, why } => move_share(ext, policy, gpu, all, &share, &why),
        Action::Evict { share, why } => Decided::Do(Box::new(Step::Evict {
            owner: owner(&share),
            why,
        })),
    }
}

/// Creates GPU `index`'s reservation again, held from before the create leaves, and only while
/// a share is still there: its shares may have left since this tick began, and the GPU gone
/// whole to a pod.
fn recreate<'a>(
    ext: &'a ExtenderState,
    policy: &LoadedPolicy,
    template: &Template,
    gpu: &plan::Gpu,
    node: String,
    index: u32,
    mps: bool,
) -> Decided<'a> {
    let mut template = template.clone();
    template.runtime_class = policy.policy.runtime_class_name.clone();
    // Writing its GPU's CDI device where the policy says so, or where a share takes it.
    let takes = gpu
        .shares
        .iter()
        .any(|s| s.kind == ShareKind::Timeslice { cdi_device: true });
    template.cdi_device = !mps && (policy.policy.per_gpu.timeslice_cdi || takes);
    let scorer = ext.scorer(policy.policy.packing.policy.into());
    let on_its_way = has_shares(ext.ledger(), &node, index)
        .then(|| {
            ext.begin_create(&scorer, &node, index, mps, template.cdi_device)
                .ok()
        })
        .flatten();
    match on_its_way {
        Some(on_its_way) => Decided::Do(Box::new(Step::Create {
            node,
            gpu: index,
            mps,
            template,
            on_its_way,
        })),
        None => Decided::Skip(
            "reservation not created again: its shares left, or the GPU holds what a reservation cannot be beside",
        ),
    }
}

/// Re-points a share whose reservation failed at another GPU of its node that a ready
/// reservation holds, chosen by the packing as at bind; evicts it when none has room.
fn move_share<'a>(
    ext: &'a ExtenderState,
    policy: &LoadedPolicy,
    gpu: &plan::Gpu,
    all: &[plan::Gpu],
    share: &Share,
    why: &str,
) -> Decided<'a> {
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
    let scorer = ext.scorer(policy.policy.packing.policy.into());
    let Some(gpus) = ext.repoint(&scorer, &share.uid, &ready) else {
        return Decided::Do(Box::new(Step::Evict {
            owner: owner(share),
            why: format!(
                "{why}; no other GPU gpu-share holds on node {} has room for it",
                gpu.node
            ),
        }));
    };
    let to = gpus.first().map_or(gpu.index, |(i, _)| *i);
    let annotation = Placement {
        gpus,
        ..Default::default()
    }
    .gpus_text();
    Decided::Do(Box::new(Step::Move(Move {
        ext,
        scorer,
        owner: owner(share),
        from: gpu.index,
        annotation,
        note: format!("{why}; pointed at GPU {to} of the node instead"),
    })))
}

/// Why a share whose devices ConfigMap exists, and is not the one gpu-share would write, is
/// evicted.
pub fn foreign(fill: &Fill, at: &str, what: &str) -> String {
    format!(
        "its devices ConfigMap {} already exists and {what}; it is immutable, so the pod cannot be pointed at {at} ({})",
        fill.configmap, fill.to.uuid
    )
}

/// The pod a share is.
fn owner(s: &Share) -> Owner {
    Owner {
        namespace: s.namespace.clone(),
        name: s.name.clone(),
        uid: s.uid.clone(),
    }
}

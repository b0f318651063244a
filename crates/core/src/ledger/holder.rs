//! PURE: who holds a share in the ledger: a holder's identity and priority ([`PodRef`]), what
//! kind of holder it is ([`Holder`]: a pod, a DRA claim, a reservation on its way), and the keys
//! of holdings that are not pods'.

use serde::Serialize;

use crate::defrag::mobility::Consent;

/// A holder's identity and priority: a pod's, or that of what holds in pods' stead ([`Holder`]).
/// `uid` is the ledger's key for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRef {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub priority: i32,
    /// What holds: a pod, unless said otherwise.
    #[serde(skip_serializing_if = "Holder::is_pod")]
    pub holder: Holder,
    /// The UID of the controller kube-scheduler's default topology spread spreads the pod's
    /// siblings by ([`spread_controller`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub controller: Option<String>,
    /// What the pod says of being moved to make room for a waiting one (its recreating
    /// controller, its `gpu-share.io/defrag` and `gpu-share.io/restart-cost` annotations, its
    /// phase), as the API last showed the bound pod ([`observed_holding`]); `None` where no
    /// controller recreates it, or not read yet ([`crate::defrag::mobility`]).
    #[serde(skip)]
    pub consent: Option<Box<Consent>>,
}

impl PodRef {
    /// A pod's identity, at priority 0, held by the pod itself, with no controller.
    pub fn new(
        uid: impl Into<String>,
        namespace: impl Into<String>,
        name: impl Into<String>,
    ) -> PodRef {
        PodRef {
            uid: uid.into(),
            namespace: namespace.into(),
            name: name.into(),
            priority: 0,
            holder: Holder::Pod,
            controller: None,
            consent: None,
        }
    }

    pub fn with_priority(self, priority: i32) -> PodRef {
        PodRef { priority, ..self }
    }

    pub fn held_by(self, holder: Holder) -> PodRef {
        PodRef { holder, ..self }
    }

    pub fn controlled_by(self, controller: Option<String>) -> PodRef {
        PodRef { controller, ..self }
    }

    pub fn consenting(self, consent: Option<Consent>) -> PodRef {
        PodRef {
            consent: consent.map(Box::new),
            ..self
        }
    }
}

/// What holds a share in the ledger. The kind is said here, never read from the key: a claim's
/// and a stand-in's keys are made so that no pod's UID is one ([`claim_key`], [`stand_in_key`]),
/// and nothing parses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Holder {
    /// A pod the API shows (or one bound here and not yet shown), keyed by its UID.
    #[default]
    Pod,
    /// A DRA ResourceClaim's allocation on a node whose GPUs NVIDIA's DRA driver publishes
    /// ([`crate::dra`]): it stands for the pods the claim is reserved for, which hold nothing
    /// themselves there ([`super::Ledger::sync_claims`]).
    Claim,
    /// A reservation pod whose create has been sent and which the API has not shown yet. The
    /// ledger holds its GPU from before the create leaves, so no whole-GPU pod is given a GPU a
    /// reservation is about to run on; the reservation itself, once recorded, takes its place
    /// ([`super::NodeLedger::record`]).
    StandIn,
    /// Room a defragmentation plan holds for the replacement of a pod it moves, on the move's
    /// target, from before the pod is evicted until the replacement's bind takes its place
    /// ([`super::Ledger::redeem`]) or the plan ends. The plan's controller releases it; a relist
    /// never does ([`super::Ledger::uids`]).
    Promise,
}

impl Holder {
    pub fn is_pod(&self) -> bool {
        *self == Holder::Pod
    }
}

/// The ledger's key for the holding of DRA claim `claim` (its UID) on `node`, of one `kind` of
/// its devices (`gpu`, `share-<i>`, `mig-<profile>`).
pub fn claim_key(claim: &str, node: &str, kind: &str) -> String {
    format!("dra-claim/{claim}/{node}/{kind}")
}

/// The ledger's key for the room defragmentation plan `plan` (its waiting pod's UID) holds for
/// the replacement of its move number `index`.
pub fn promise_key(plan: &str, index: usize) -> String {
    format!("defrag-promise/{plan}/{index}")
}

/// The ledger's key for stand-in number `serial` for a reservation of GPU `gpu` of `node`.
pub fn stand_in_key(node: &str, gpu: u32, serial: u64) -> String {
    format!("reservation-on-its-way/{node}/{gpu}/{serial}")
}

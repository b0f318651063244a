//! How a bind fails, in words, and how long each of its calls may take.

use crate::extender::handlers::NOT_SYNCED;
use crate::ledger;
use crate::packing::Reason;

/// Why a bind did not happen, in words (sent in the reply's `Error` field).
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("{NOT_SYNCED}")]
    NotSynced,
    #[error("bind request for {key:?} names no pod or no node")]
    NoPodOrNode { key: String },
    #[error("cannot read pod {key} to bind it: no answer within {} s", BIND_READBACK_TIMEOUT.as_secs())]
    ReadTimeout { key: String },
    #[error("cannot read pod {key} to bind it: {source}")]
    Read {
        key: String,
        #[source]
        source: kube::Error,
    },
    #[error("pod {key} has UID {found:?}, not {asked:?}: it was replaced")]
    Replaced {
        key: String,
        found: String,
        asked: String,
    },
    #[error("cannot resolve pod {key} (UID {uid}): it was not seen in filter or prioritize")]
    Unseen { key: String, uid: String },
    #[error(transparent)]
    Hold(#[from] HoldError),
    #[error(
        "cannot bind pod {key} to {node}: the reservation of its GPU {gpu} was not created: {source}"
    )]
    Reservation {
        key: String,
        node: String,
        gpu: u32,
        #[source]
        source: crate::cluster::reservation_api::CreateError,
    },
    #[error(
        "binding pod {key} to {node}: {source}, and the pod could not be read back ({read}): it stays held on {node} until the API shows whether the binding took"
    )]
    Unsettled {
        key: String,
        node: String,
        #[source]
        source: BindCallError,
        read: Box<ReadBackError>,
    },
    #[error(
        "pod {key} is in doubt: an earlier binding to {node} got no answer, and it stays held there until the API shows whether that binding took"
    )]
    InDoubt { key: String, node: String },
    #[error("binding pod {key} to {node} failed: {source}")]
    Failed {
        key: String,
        node: String,
        #[source]
        source: BindCallError,
    },
}

/// Why a pod could not be read back after a binding call that ended unknown.
#[derive(Debug, thiserror::Error)]
pub enum ReadBackError {
    #[error("no answer within {} s", BIND_READBACK_TIMEOUT.as_secs())]
    Unanswered,
    #[error("there is no API to read it from (--dev)")]
    NoApi,
    #[error(transparent)]
    Api(#[from] kube::Error),
}

/// How a binding call failed.
#[derive(Debug, thiserror::Error)]
pub enum BindCallError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("no answer within {} s", BIND_API_TIMEOUT.as_secs())]
    Unanswered,
}

/// How long bind waits for the API server's answer to a binding: within kube-scheduler's 5 s
/// `httpTimeout` for the extender, with room to read the pod back.
pub const BIND_API_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);
/// How long reading a pod back after an unanswered binding may take.
pub const BIND_READBACK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Why bind cannot hold a pod on its node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HoldError {
    #[error(transparent)]
    Demand(#[from] ledger::DemandError),
    #[error("node {node} can no longer hold pod {key}: {}", .reason.message())]
    NoLongerFits {
        node: String,
        key: String,
        reason: Reason,
    },
}

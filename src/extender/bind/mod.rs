//! `POST /scheduler/bind`: decide over the cache and hold the pod on its node
//! ([`decision`]), have an [`Executor`] carry the decision's calls out in one go (the API
//! server, or nothing in `--dev`), and settle the holding by how they ended (accepted, refused,
//! or unknown: read back, and held in doubt while the read gets no answer either).

pub mod calls;
pub mod decision;
pub mod error;

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};

use super::Context;
use super::executor::Fill;
pub use super::executor::{Api, Dev, Executor};
use super::handlers::begin;
use super::state::{ExtenderState, Mode};
use super::wire::{self, ExtenderBindingArgs, ExtenderBindingResult};
use crate::cluster::reservation_api as api;
use crate::ledger;
pub use calls::{BindAnswers, BindCalls, Ended, ReservationCall, read_back_needed};
pub use decision::{Decision, Settled, decide};
pub use error::{
    BIND_API_TIMEOUT, BIND_READBACK_TIMEOUT, BindCallError, BindError, HoldError, ReadBackError,
};

pub async fn bind_handler(State(state): State<Context>, body: Bytes) -> Response {
    let start = Instant::now();
    let (ext, args) = match begin(&state, "bind", start, wire::parse_binding(&body)) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let error = match bind(&state, ext, &args).await {
        Ok(()) => String::new(),
        Err(e) => e.to_string(),
    };
    let outcome = if error.is_empty() { "ok" } else { "error" };
    state.metrics.observe("bind", outcome, start.elapsed());
    if !error.is_empty() {
        tracing::warn!(pod = %format!("{}/{}", args.pod_namespace, args.pod_name), node = %args.node, error = %error, "bind refused");
    }
    axum::Json(ExtenderBindingResult { error }).into_response()
}

/// Binds as the context allows: through the API server in a cluster, in `--dev` without one.
async fn bind(
    state: &Context,
    ext: &ExtenderState,
    args: &ExtenderBindingArgs,
) -> Result<(), BindError> {
    match (ext.mode(), &state.cluster) {
        (Mode::Cluster, Some(c)) => run(state, ext, &Api::new(c.client().clone()), args).await,
        _ => run(state, ext, &Dev, args).await,
    }
}

/// Bind: decides over the cache ([`decide`], which holds the pod on the node), has `io` carry
/// the decision's calls out ([`Executor::carry_out_bind`]: the reservation it needs, the
/// binding, the pod read back where the binding's outcome is unknown), and settles the holding
/// by the answers.
pub async fn run<E: Executor>(
    state: &Context,
    ext: &ExtenderState,
    io: &E,
    args: &ExtenderBindingArgs,
) -> Result<(), BindError> {
    if !ext.is_synced() {
        return Err(BindError::NotSynced);
    }
    let key = format!("{}/{}", args.pod_namespace, args.pod_name);
    if args.node.is_empty() || args.pod_name.is_empty() {
        return Err(BindError::NoPodOrNode { key });
    }
    if let Some(node) = ext.in_doubt(&args.pod_uid) {
        return Err(BindError::InDoubt { key, node });
    }
    let pod = match ext.remembered_pod(&args.pod_uid) {
        Some(p) => p,
        None => {
            let pod = match io.get_pod(&args.pod_namespace, &args.pod_name).await {
                Ok(pod) => pod,
                Err(ReadBackError::NoApi) => {
                    return Err(BindError::Unseen {
                        key,
                        uid: args.pod_uid.clone(),
                    });
                }
                Err(ReadBackError::Unanswered) => return Err(BindError::ReadTimeout { key }),
                Err(ReadBackError::Api(source)) => return Err(BindError::Read { key, source }),
            };
            if !args.pod_uid.is_empty() && pod.metadata.uid.as_deref() != Some(&args.pod_uid) {
                return Err(BindError::Replaced {
                    key,
                    found: pod.metadata.uid.unwrap_or_default(),
                    asked: args.pod_uid.clone(),
                });
            }
            Arc::new(ledger::BindPod::of(&pod))
        }
    };
    let policy = state.policy.current();
    let decision = decide(
        ext,
        &policy,
        &state.reservations,
        &pod,
        &args.node,
        E::ASKS_API,
    )?;
    let calls = decision.calls(&args.pod_namespace, &args.pod_name, &args.pod_uid);
    let answers = io.carry_out_bind(calls).await;
    match decision.settle(answers) {
        Settled::Bound { retried_first } => {
            if retried_first {
                state.metrics.retried_first();
            }
            tracing::info!(pod = %key, node = %args.node, "bound");
            if let Some(fill) = decision::fill(ext, &pod.pod.uid) {
                fill_in_background(io.clone(), fill);
            }
            Ok(())
        }
        Settled::InDoubt(e) => {
            if let Some(ext) = state.extender.clone() {
                resolve_later(ext, io.clone(), args, key);
            }
            Err(e)
        }
        Settled::Failed(e) => Err(e),
    }
}

/// How often a pod in doubt is read again.
const DOUBT_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// Reads a pod in doubt back every second until the API answers (or its assumption is gone:
/// the watch recorded it, or it expired), and settles what the ledger holds by the answer.
fn resolve_later<E: Executor>(
    ext: Arc<ExtenderState>,
    io: E,
    args: &ExtenderBindingArgs,
    key: String,
) {
    let (namespace, name, uid) = (
        args.pod_namespace.clone(),
        args.pod_name.clone(),
        args.pod_uid.clone(),
    );
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(DOUBT_RETRY).await;
            if ext.assumption(&uid).is_none() {
                ext.resolve(&uid, None);
                return;
            }
            if let Ok(bound) = io.read_back(&namespace, &name, &uid).await {
                tracing::info!(pod = %key, bound = bound.as_deref().unwrap_or("nowhere"), "a binding in doubt is settled by reading the pod back");
                ext.resolve(&uid, bound.as_deref());
                return;
            }
        }
    });
}

#[cfg(test)]
mod tests;

/// Points a bound share at its GPU in the background: the bind's answer does not wait for it,
/// and the reservation controller fills whatever this does not.
fn fill_in_background<E: Executor>(io: E, fill: Fill) {
    tokio::spawn(async move {
        let pod = format!("{}/{}", fill.owner.namespace, fill.owner.name);
        match io.fill(&fill).await {
            Ok(api::Fill::Done) => {
                tracing::info!(pod, devices = %fill.to.devices(), "share pointed at its GPU at bind")
            }
            Ok(api::Fill::Foreign(what)) => {
                tracing::warn!(
                    pod,
                    configmap = fill.configmap,
                    what,
                    "a devices ConfigMap of that name exists; the reservation controller handles the share"
                )
            }
            Err(e) => {
                tracing::warn!(pod, error = %e, "cannot point the share at its GPU at bind; the reservation controller tries again")
            }
        }
    });
}

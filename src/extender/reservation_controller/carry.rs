//! Carries a [`Step`] out through an [`Executor`] and settles what the decision held by the
//! answer.

use crate::cluster::reservation_api::{self as api, CreateError};
use crate::extender::executor::Executor;
use crate::reservation::view::Owner;

use super::decision::{self, Step};

/// Why a call of the controller did not happen (tried again next tick).
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error(transparent)]
    Create(#[from] CreateError),
}

/// Makes `step`'s call through `io` and settles the ledger by its answer.
pub async fn carry_out<E: Executor>(io: &E, step: Step<'_>) -> Result<(), ActionError> {
    match step {
        Step::Fill { fill, at } => match io.fill(&fill).await? {
            api::Fill::Done => {
                tracing::info!(pod = %format!("{}/{}", fill.owner.namespace, fill.owner.name), gpu = %at, devices = %fill.to.devices(), "share pointed at its GPU");
                Ok(())
            }
            api::Fill::Foreign(what) => {
                delete_share(io, &fill.owner, &decision::foreign(&fill, &at, &what)).await
            }
        },
        Step::Delete {
            reservation,
            uid,
            why,
        } => {
            io.delete_reservation(&reservation, &uid).await?;
            tracing::info!(reservation, why, "reservation deleted");
            Ok(())
        }
        Step::Create {
            node,
            gpu,
            mps,
            template,
            on_its_way,
        } => {
            let created = io.create_reservation(&node, gpu, mps, &template).await;
            on_its_way.settle(created.as_ref());
            created?;
            tracing::info!(
                node,
                gpu,
                "reservation created again: shares are bound to its GPU"
            );
            Ok(())
        }
        Step::Move(m) => {
            let (owner, note, from) = (m.owner.clone(), m.note.clone(), m.from);
            let written = io
                .annotate(
                    &owner.namespace,
                    &owner.name,
                    crate::ledger::ANNOTATION_GPUS,
                    Some(&m.annotation),
                )
                .await;
            m.settle(written.is_ok());
            written?;
            io.note(&owner, false, api::ACTION, api::EVENT_MOVED, &note)
                .await;
            tracing::info!(pod = %format!("{}/{}", owner.namespace, owner.name), from, note, "share re-pointed");
            Ok(())
        }
        Step::Evict { owner, why } => delete_share(io, &owner, &why).await,
    }
}

/// Deletes a share that cannot run where it is, with an event saying why.
async fn delete_share<E: Executor>(io: &E, owner: &Owner, why: &str) -> Result<(), ActionError> {
    io.delete_share(owner, why).await?;
    tracing::warn!(pod = %format!("{}/{}", owner.namespace, owner.name), why, "share evicted");
    Ok(())
}

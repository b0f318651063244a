//! Each namespace's GPUs against its quotas, from the extender's live state: `GET /v1/quotas`
//! and the occupancy page's section.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::ResourceQuota;

use super::usage::{self, NamespaceUse};
use crate::extender::Context;
use crate::extender::state::ExtenderState;
use crate::shared::json_error;

/// What the ledger holds per namespace (gpu-share's reservations and their stand-ins left out)
/// beside `quotas`.
pub fn of(ext: &ExtenderState, quotas: &[ResourceQuota]) -> Vec<NamespaceUse> {
    let mut held: Vec<(String, f64)> = Vec::new();
    ext.ledger().for_each_node(|nl| {
        for h in nl.holdings.values() {
            if matches!(
                h.demand.gpu,
                crate::packing::GpuDemand::ReservationPod { .. }
            ) {
                continue;
            }
            held.push((h.pod.namespace.clone(), h.demand.gpu.gpus()));
        }
    });
    usage::by_namespace(held.iter().map(|(ns, g)| (ns.as_str(), *g)), quotas)
}

/// `GET /v1/quotas`: [`of`] as JSON.
pub async fn handler(State(state): State<Context>) -> Response {
    let Some(ext) = state.extender.as_deref() else {
        return json_error(
            StatusCode::NOT_FOUND,
            "extender role not enabled: /v1/quotas reads the extender's ledger",
        );
    };
    axum::Json(of(ext, &state.quotas.all())).into_response()
}

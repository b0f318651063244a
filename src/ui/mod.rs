//! The occupancy page on the admin listener: `/` (the page, [`page::render`]) and its assets
//! under `/ui/`, embedded in the binary (no CDN: clusters are often offline). The page is built
//! from the extender's live state: the same node reports as `/v1/nodes`, the pods waiting for a
//! node, and each namespace's GPUs against its quotas (as `/v1/quotas`).

pub mod page;

use std::time::SystemTime;

use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::extender::Context;
use crate::extender::report::{by_node, fragmented_on, report};
use crate::extender::state::ExtenderState;
use crate::shared::json_error;

/// The page's style sheet.
pub const STYLE: &str = include_str!("style.css");
/// The page's script: interaction only; the page works without it.
pub const SCRIPT: &str = include_str!("page.js");

/// What the page shows, read from the extender's state at `now`: every node's report (as
/// `/v1/nodes`, with its fragmented capacity for the most common request) and the waiting pods.
pub fn occupancy(
    ext: &ExtenderState,
    mig: &crate::mig::MigTable,
    quotas: &[k8s_openapi::api::core::v1::ResourceQuota],
    now: SystemTime,
) -> page::Occupancy {
    let reservations = by_node(ext.reservations.pods());
    let usual = ext.most_common_demand();
    let mut nodes = Vec::with_capacity(ext.ledger().node_count());
    ext.ledger().for_each_node(|nl| {
        let r = reservations.get(&nl.node.name).map(Vec::as_slice);
        let mut n = report(nl, mig, r.unwrap_or_default());
        n.fragmented_gpus = usual.as_ref().map(|d| fragmented_on(nl, d));
        nodes.push(n);
    });
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let pending = ext
        .pending_pods()
        .into_iter()
        .map(|u| page::Waiting {
            namespace: u.namespace,
            name: u.name,
            class: u.class.to_string(),
            waited: now.duration_since(u.since).unwrap_or_default(),
            reason: u.reason,
        })
        .collect();
    page::Occupancy {
        nodes,
        usual: usual.map(|d| d.gpu.to_string()),
        pending,
        quotas: crate::quota::report::of(ext, quotas),
    }
}

/// `GET /`: the page (the caller has checked who may see it).
pub async fn page_handler(
    State(state): State<Context>,
    Query(filter): Query<page::Filter>,
) -> Response {
    let Some(ext) = state.extender.as_deref() else {
        return json_error(
            StatusCode::NOT_FOUND,
            "extender role not enabled: the occupancy page shows the extender's ledger",
        );
    };
    let policy = state.policy.current();
    let html = page::render(
        &occupancy(ext, &policy.mig, &state.quotas.all(), SystemTime::now()),
        &filter,
    );
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        html,
    )
        .into_response()
}

/// `GET /ui/style.css`.
pub async fn style_handler() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response()
}

/// `GET /ui/page.js`.
pub async fn script_handler() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
        .into_response()
}

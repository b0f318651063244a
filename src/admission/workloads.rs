//! `POST /validate`: the template check's AdmissionReview handler. A workload CREATE or UPDATE
//! (a Deployment, a Job, a kind the policy names) is allowed unless one of its pod templates
//! would be denied by the pod webhook; the reply never carries a patch.

use std::time::Instant;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use tracing::{Instrument, field};

use super::Context;
use super::plan::{Decision, Facts, Needs, RuntimeClassState};
use super::review::{
    AdmissionRequest, AdmissionReviewIn, LOOKUP_TIMEOUT, look_up, read_review, respond,
};
use super::template::{Templates, kind_of};

/// `POST /validate`.
pub async fn validate(State(state): State<Context>, body: Bytes) -> Response {
    let started = Instant::now();
    let review = match read_review(&state, &body, "validate", started) {
        Ok(r) => r,
        Err(answered) => return *answered,
    };
    let req = &review.request;
    let kind = req
        .kind
        .as_ref()
        .map(|k| k.kind.as_str())
        .unwrap_or_default();
    let span = tracing::info_span!(
        "template_check",
        uid = %req.uid,
        namespace = %req.namespace.as_deref().unwrap_or_default(),
        kind = %kind,
        name = %req.name.as_deref().unwrap_or_default(),
        dry_run = req.dry_run.unwrap_or(false),
        decision = field::Empty
    );
    async move {
        let decision = decide(&state, &review).await;
        let outcome = match &decision {
            Decision::Deny(d) => {
                state.metrics.denial(d.reason.as_str());
                tracing::info!(reason = d.reason.as_str(), denial = %d.message, "template denied");
                "denied"
            }
            _ => "allowed",
        };
        tracing::Span::current().record("decision", outcome);
        state
            .metrics
            .observe("validate", outcome, started.elapsed());
        axum::Json(respond(&review, &decision)).into_response()
    }
    .instrument(span)
    .await
}

/// Whether the request writes a workload itself (CREATE or UPDATE, no subresource).
fn is_workload_write(req: &AdmissionRequest) -> bool {
    let no_sub = req.sub_resource.as_deref().is_none_or(str::is_empty);
    let write = matches!(req.operation.as_deref(), Some("CREATE" | "UPDATE"));
    no_sub && write && req.object.is_some()
}

async fn decide(state: &Context, review: &AdmissionReviewIn) -> Decision {
    let req = &review.request;
    if !is_workload_write(req) {
        return Decision::NotRequested;
    }
    let (Some(object), Some(gvk)) = (req.object.as_ref(), req.kind.as_ref()) else {
        return Decision::NotRequested;
    };
    let loaded = state.policy.current();
    let Some(kind) = kind_of(&loaded.workload_kinds, &gvk.group, &gvk.kind) else {
        // Sent by a webhook rule the policy does not back: let it through, and say so once per
        // request in the log (the pod webhook still checks its pods).
        tracing::warn!(
            group = %gvk.group,
            kind = %gvk.kind,
            "the template check was sent a kind the policy does not name (policy workloads); allowed unchecked"
        );
        return Decision::NotRequested;
    };
    let old = match req.operation.as_deref() {
        Some("UPDATE") => req.old_object.as_ref(),
        _ => None,
    };
    let templates = Templates::read(object, old, kind);
    if templates.is_empty() {
        return Decision::NotRequested;
    }
    let namespace = req.namespace.clone().unwrap_or_default();
    let needs = Needs {
        namespace_labels: templates.need_namespace_labels(&loaded.policy),
        runtime_class: false,
        // The form decides which GPU limits a template may already carry.
        mig_offers: loaded.policy.mig.strategy == crate::policy::MigStrategy::Auto,
        legacy_runtime_class: false,
    };
    let found = match look_up(
        state,
        needs,
        &namespace,
        &loaded,
        LOOKUP_TIMEOUT,
        "this workload's pods",
    )
    .await
    {
        Ok(found) => found,
        Err(denial) => return Decision::Deny(denial),
    };
    let facts = Facts {
        namespace: &namespace,
        namespace_labels: found.labels.as_ref(),
        // The template is checked, not changed: whether the RuntimeClass exists only decides
        // what the pod webhook writes into each pod.
        runtime_class: RuntimeClassState::Exists,
        // The template's pods are checked, not named: any uid names their ConfigMap alike.
        request_uid: "template",
        mig_offers: found.mig_offers.as_deref(),
        legacy_runtime_class: found.legacy_runtime_class,
    };
    match templates.check(&loaded.policy, &loaded.mig, &facts) {
        Some(denial) => Decision::Deny(denial),
        None => Decision::NotRequested,
    }
}

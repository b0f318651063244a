//! The workload webhooks' AdmissionReview handlers:
//! - `POST /validate`, the template check: a workload CREATE or UPDATE (a Deployment, a Job, a
//!   kind the policy names) is allowed unless one of its pod templates would be denied by the
//!   pod webhook; the reply never carries a patch;
//! - `POST /mutate-templates`, the template's quantity: a workload CREATE (Jobs, as shipped)
//!   gets `gpu-share.io/gpu-milli` in each template's GPU container, the value the pod webhook
//!   will write into its pods; a template the pod webhook would deny is denied in its words.

use std::time::Instant;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use tracing::{Instrument, field};

use super::Context;
use super::plan::{Decision, Facts, Mutation, Needs, RuntimeClassState};
use super::review::{
    AdmissionRequest, AdmissionReviewIn, LOOKUP_TIMEOUT, look_up, read_review, respond,
};
use super::template::{Quantities, Templates, kind_of};

/// `POST /validate`.
pub async fn validate(State(state): State<Context>, body: Bytes) -> Response {
    answer(state, body, Endpoint::Validate).await
}

/// `POST /mutate-templates`.
pub async fn mutate_templates(State(state): State<Context>, body: Bytes) -> Response {
    answer(state, body, Endpoint::Quantities).await
}

#[derive(Clone, Copy)]
enum Endpoint {
    Validate,
    Quantities,
}

impl Endpoint {
    fn label(self) -> &'static str {
        match self {
            Endpoint::Validate => "validate",
            Endpoint::Quantities => "mutate_templates",
        }
    }
}

async fn answer(state: Context, body: Bytes, endpoint: Endpoint) -> Response {
    let started = Instant::now();
    let review = match read_review(&state, &body, endpoint.label(), started) {
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
        "workload",
        endpoint = endpoint.label(),
        uid = %req.uid,
        namespace = %req.namespace.as_deref().unwrap_or_default(),
        kind = %kind,
        name = %req.name.as_deref().unwrap_or_default(),
        dry_run = req.dry_run.unwrap_or(false),
        decision = field::Empty
    );
    async move {
        let decision = decide(&state, &review, endpoint).await;
        let outcome = match &decision {
            Decision::Deny(d) => {
                state.metrics.denial(d.reason.as_str());
                tracing::info!(reason = d.reason.as_str(), denial = %d.message, "template denied");
                "denied"
            }
            Decision::Mutate(m) => {
                tracing::info!(ops = m.patch.len(), "quantity written into the templates");
                "allowed"
            }
            Decision::NotRequested => "allowed",
        };
        tracing::Span::current().record("decision", outcome);
        state
            .metrics
            .observe(endpoint.label(), outcome, started.elapsed());
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

async fn decide(state: &Context, review: &AdmissionReviewIn, endpoint: Endpoint) -> Decision {
    let req = &review.request;
    if !is_workload_write(req) {
        return Decision::NotRequested;
    }
    // The quantity is written when the workload is created: a template changed later (a
    // suspended Job's, by Kueue among others) keeps what it has, and its pods get theirs from
    // the pod webhook.
    if matches!(endpoint, Endpoint::Quantities) && req.operation.as_deref() != Some("CREATE") {
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
            endpoint = endpoint.label(),
            "a workload webhook was sent a kind the policy does not name (policy workloads); allowed unchanged"
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
        // Whether the RuntimeClass exists only decides what the pod webhook writes into each
        // pod, never the template's quantity.
        runtime_class: RuntimeClassState::Exists,
        // The template's pods are planned, not named: any uid names their ConfigMap alike.
        request_uid: "template",
        mig_offers: found.mig_offers.as_deref(),
        legacy_runtime_class: found.legacy_runtime_class,
    };
    match endpoint {
        Endpoint::Validate => match templates.check(&loaded.policy, &loaded.mig, &facts) {
            Some(denial) => Decision::Deny(denial),
            None => Decision::NotRequested,
        },
        Endpoint::Quantities => match templates.quantities(&loaded.policy, &loaded.mig, &facts) {
            Err(denial) => Decision::Deny(denial),
            Ok(Quantities {
                patch,
                request: Some(request),
            }) => Decision::Mutate(Mutation {
                request,
                patch,
                warnings: Vec::new(),
            }),
            Ok(_) => Decision::NotRequested,
        },
    }
}

//! AdmissionReview (admission.k8s.io/v1) in and out, and the `/mutate` handler.
//!
//! The response is our own type: the API documents `patch` as a base64 string, while
//! kube-core's `AdmissionResponse` serializes it as an array of numbers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::{Instrument, field};

use super::Context;
use super::plan::{self, Decision, Denial, Facts, Intake, RuntimeClassState};
use crate::inventory::MigOffers;
use crate::shared::json_error;

pub const KIND: &str = "AdmissionReview";

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq, Default)]
pub struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub kind: String,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq, Default)]
pub struct GroupVersionResource {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub resource: String,
}

/// The request half of an AdmissionReview: the fields gpu-share reads.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    pub uid: String,
    #[serde(default)]
    pub kind: Option<GroupVersionKind>,
    #[serde(default)]
    pub resource: Option<GroupVersionResource>,
    #[serde(default)]
    pub sub_resource: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub operation: Option<String>,
    #[serde(default)]
    pub object: Option<Value>,
    #[serde(default)]
    pub old_object: Option<Value>,
    #[serde(default)]
    pub user_info: Option<UserInfo>,
    #[serde(default)]
    pub dry_run: Option<bool>,
}

/// Who sent the request the API server is admitting.
#[derive(Debug, Clone, Deserialize, Default)]
pub struct UserInfo {
    #[serde(default)]
    pub username: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReviewIn {
    pub api_version: String,
    pub kind: String,
    pub request: AdmissionRequest,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Status {
    pub code: u16,
    pub message: String,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    pub uid: String,
    pub allowed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// Base64 of the RFC 6902 JSON Patch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub audit_annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReviewOut {
    pub api_version: String,
    pub kind: String,
    pub response: AdmissionResponse,
}

/// Why a body is not an AdmissionReview: a 400, the body is not well-formed.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("body is not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("body is not an AdmissionReview (kind {0:?})")]
    NotAdmissionReview(String),
    #[error("AdmissionReview apiVersion {0:?} is not admission.k8s.io/v1")]
    ApiVersion(String),
    #[error("AdmissionReview has no request")]
    NoRequest,
    #[error("AdmissionReview request is malformed: {0}")]
    Malformed(#[source] serde_json::Error),
}

impl ReviewError {
    /// The reply's status: the body is not well-formed.
    pub fn status(&self) -> axum::http::StatusCode {
        axum::http::StatusCode::BAD_REQUEST
    }
}

/// Reads a body as an AdmissionReview. An error here is a 400: the body is not well-formed.
pub fn parse_review(body: &[u8]) -> Result<AdmissionReviewIn, ReviewError> {
    let value: Value = serde_json::from_slice(body).map_err(ReviewError::NotJson)?;
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if kind != KIND {
        return Err(ReviewError::NotAdmissionReview(kind.to_string()));
    }
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !api_version.starts_with("admission.k8s.io/") {
        return Err(ReviewError::ApiVersion(api_version.to_string()));
    }
    if value.get("request").is_none_or(Value::is_null) {
        return Err(ReviewError::NoRequest);
    }
    serde_json::from_value(value).map_err(ReviewError::Malformed)
}

/// Whether this request is `operation` on a pod itself (no subresource), with its object.
fn is_pod_operation(req: &AdmissionRequest, operation: &str) -> bool {
    let is_pod = req
        .kind
        .as_ref()
        .is_none_or(|k| k.kind == "Pod" && k.group.is_empty())
        && req
            .resource
            .as_ref()
            .is_none_or(|r| r.resource == "pods" && r.group.is_empty());
    let no_sub = req.sub_resource.as_deref().is_none_or(str::is_empty);
    is_pod && no_sub && req.operation.as_deref() == Some(operation) && req.object.is_some()
}

/// Whether this request is a pod CREATE (the only thing gpu-share mutates).
pub fn is_pod_create(req: &AdmissionRequest) -> bool {
    is_pod_operation(req, "CREATE")
}

/// Whether this request is a pod UPDATE with both versions of the pod (the annotation rule).
pub fn is_pod_update(req: &AdmissionRequest) -> bool {
    is_pod_operation(req, "UPDATE") && req.old_object.is_some()
}

/// An UPDATE of a pod: refused if it touches gpu-share's annotations in a way
/// [`crate::admission::guard::check_update`] does not allow.
fn decide_update(state: &Context, req: &AdmissionRequest) -> Decision {
    let (Some(new), Some(old)) = (req.object.as_ref(), req.old_object.as_ref()) else {
        return Decision::NotRequested;
    };
    let username = req
        .user_info
        .as_ref()
        .and_then(|u| u.username.as_deref())
        .unwrap_or_default();
    match crate::admission::guard::check_update(
        &plan::annotations_of(old),
        &plan::annotations_of(new),
        username,
        &state.annotation_writers,
    ) {
        Ok(()) => Decision::NotRequested,
        Err(why) => Decision::Deny(Denial {
            reason: plan::DenialReason::AnnotationUpdate,
            message: format!("gpu-share: {why}"),
        }),
    }
}

/// Wraps a decision into the AdmissionReview the API server expects, echoing apiVersion, kind and uid.
pub fn respond(review: &AdmissionReviewIn, decision: &Decision) -> AdmissionReviewOut {
    let uid = review.request.uid.clone();
    let mut response = AdmissionResponse {
        uid,
        allowed: true,
        status: None,
        patch: None,
        patch_type: None,
        warnings: Vec::new(),
        audit_annotations: BTreeMap::new(),
    };
    match decision {
        Decision::NotRequested => {}
        Decision::Mutate(m) => {
            if !m.patch.is_empty() {
                let bytes = serde_json::to_vec(&m.patch).unwrap_or_default();
                response.patch = Some(base64::engine::general_purpose::STANDARD.encode(bytes));
                response.patch_type = Some("JSONPatch".to_string());
            }
            response.warnings = m.warnings.iter().map(|w| truncate(w, 256)).collect();
            response
                .audit_annotations
                .insert("request".to_string(), m.request.normalized());
        }
        Decision::Deny(Denial { reason, message }) => {
            response.allowed = false;
            response.status = Some(Status {
                code: 403,
                message: bounded_message(message),
                reason: "Forbidden".to_string(),
            });
            response
                .audit_annotations
                .insert("denied".to_string(), reason.as_str().to_string());
        }
    }
    AdmissionReviewOut {
        api_version: review.api_version.clone(),
        kind: KIND.to_string(),
        response,
    }
}

/// The most of a denial message sent back: whatever a pod holds, the answer stays small.
pub const MAX_DENIAL_MESSAGE: usize = 2048;

/// A denial message cut to [`MAX_DENIAL_MESSAGE`] bytes, saying so.
fn bounded_message(message: &str) -> String {
    if message.len() <= MAX_DENIAL_MESSAGE {
        return message.to_string();
    }
    let mut m = truncate(message, MAX_DENIAL_MESSAGE - 40);
    m.push_str(&format!(" ... ({} bytes cut)", message.len() - m.len()));
    m
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// Reads a body as an AdmissionReview, or answers it: a 400 in words, counted for `endpoint`.
pub(super) fn read_review(
    state: &Context,
    body: &[u8],
    endpoint: &'static str,
    started: Instant,
) -> Result<AdmissionReviewIn, Box<Response>> {
    parse_review(body).map_err(|e| {
        tracing::warn!(error = %e, "rejected a malformed admission request");
        state
            .metrics
            .observe(endpoint, "bad_request", started.elapsed());
        Box::new(json_error(e.status(), &e.to_string()))
    })
}

/// `POST /mutate`.
pub async fn mutate(State(state): State<Context>, body: Bytes) -> Response {
    let started = Instant::now();
    let review = match read_review(&state, &body, "mutate", started) {
        Ok(r) => r,
        Err(answered) => return *answered,
    };
    let req = &review.request;
    let namespace = req.namespace.clone().unwrap_or_default();
    let pod_name = req
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            req.object
                .as_ref()
                .and_then(|o| o.pointer("/metadata/generateName"))
                .and_then(Value::as_str)
                .map(|g| format!("{g}*"))
        })
        .unwrap_or_default();
    let span = tracing::info_span!(
        "admission",
        uid = %req.uid,
        namespace = %namespace,
        pod = %pod_name,
        dry_run = req.dry_run.unwrap_or(false),
        decision = field::Empty
    );
    async move {
        let decision = decide(&state, &review, &namespace).await;
        let (label, outcome) = match &decision {
            Decision::NotRequested => ("skipped", "allowed"),
            Decision::Mutate(_) => ("mutated", "allowed"),
            Decision::Deny(d) => {
                state.metrics.denial(d.reason.as_str());
                ("denied", "denied")
            }
        };
        tracing::Span::current().record("decision", label);
        match &decision {
            Decision::Deny(d) => {
                tracing::info!(reason = d.reason.as_str(), denial = %d.message, "denied")
            }
            Decision::Mutate(m) => {
                tracing::info!(request = %m.request.normalized(), ops = m.patch.len(), "mutated")
            }
            Decision::NotRequested => tracing::debug!("no gpu-share annotation"),
        }
        state.metrics.observe("mutate", outcome, started.elapsed());
        axum::Json(respond(&review, &decision)).into_response()
    }
    .instrument(span)
    .await
}

/// How long the webhook waits for each API read (Namespace, RuntimeClass): well inside the
/// webhook's 5 s `timeoutSeconds`, so that a slow API server gets an answer in words rather than
/// the apiserver's own timeout error.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

async fn decide(state: &Context, review: &AdmissionReviewIn, namespace: &str) -> Decision {
    decide_within(state, review, namespace, LOOKUP_TIMEOUT).await
}

async fn decide_within(
    state: &Context,
    review: &AdmissionReviewIn,
    namespace: &str,
    lookup_timeout: Duration,
) -> Decision {
    let req = &review.request;
    if is_pod_update(req) {
        return decide_update(state, req);
    }
    if !is_pod_create(req) {
        return Decision::NotRequested;
    }
    let Some(object) = req.object.as_ref() else {
        return Decision::NotRequested;
    };
    let intake = match Intake::read(object) {
        Ok(intake) => intake,
        Err(decided) => return decided,
    };
    let loaded = state.policy.current();
    let needs = intake.needs(&loaded.policy);
    let found = match look_up(state, needs, namespace, &loaded, lookup_timeout, "this pod").await {
        Ok(found) => found,
        Err(denial) => return Decision::Deny(denial),
    };
    let facts = Facts {
        namespace,
        namespace_labels: found.labels.as_ref(),
        runtime_class: found.runtime_class,
        request_uid: &req.uid,
        mig_offers: found.mig_offers.as_deref(),
        legacy_runtime_class: found.legacy_runtime_class,
    };
    intake.plan(&loaded.policy, &loaded.mig, &facts)
}

/// What [`look_up`] found.
pub(super) struct Found {
    pub labels: Option<BTreeMap<String, String>>,
    pub runtime_class: RuntimeClassState,
    pub mig_offers: Option<Arc<MigOffers>>,
    pub legacy_runtime_class: RuntimeClassState,
}

/// The cluster facts a plan needs (`needs`), read from the API within `lookup_timeout` each:
/// the namespace's labels, whether the policy's RuntimeClass exists, and in which form the
/// nodes offer MIG profiles. Labels the plan needs and cannot read deny in words; a
/// RuntimeClass that cannot be checked is `Unknown`; MIG forms that cannot be read are `None`
/// (the plan says so in a warning). Without a cluster (`--dev`), MIG forms are the `--nodes`
/// file's.
pub(super) async fn look_up<'a>(
    state: &'a Context,
    needs: plan::Needs,
    namespace: &str,
    loaded: &'a crate::shared::LoadedPolicy,
    lookup_timeout: Duration,
    subject: &str,
) -> Result<Found, Denial> {
    let runtime_class_name = loaded.policy.runtime_class_name.as_str();
    let Some(cluster) = &state.cluster else {
        return Ok(Found {
            labels: None,
            runtime_class: RuntimeClassState::Unknown,
            legacy_runtime_class: RuntimeClassState::Unknown,
            // No `--nodes` file: no node is known to offer any profile (the mixed form).
            mig_offers: needs
                .mig_offers
                .then(|| state.dev_mig_offers.clone().unwrap_or_default()),
        });
    };
    let mig_offers = async {
        if !needs.mig_offers {
            return None;
        }
        match tokio::time::timeout(lookup_timeout, cluster.mig_offers(&loaded.reading)).await {
            Ok(Ok(offers)) => Some(offers),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot read the nodes' MIG strategies");
                None
            }
            Err(_) => {
                tracing::warn!(
                    timeout_ms = lookup_timeout.as_millis() as u64,
                    "reading the nodes' MIG strategies timed out"
                );
                None
            }
        }
    };
    let labels = async {
        if !needs.namespace_labels {
            return Ok(None);
        }
        match tokio::time::timeout(lookup_timeout, cluster.namespace_labels(namespace)).await {
            Ok(Ok(l)) => Ok(Some(l)),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!(
                "the API server did not answer within {} ms",
                lookup_timeout.as_millis()
            )),
        }
    };
    // Whether a RuntimeClass exists, when the plan needs to know (`Unknown` otherwise, and when
    // the lookup fails or times out).
    let runtime_class_state = |wanted: bool, name: &'a str| async move {
        if !wanted {
            return RuntimeClassState::Unknown;
        }
        match tokio::time::timeout(lookup_timeout, cluster.runtime_class(name)).await {
            Ok(found) => found.into(),
            Err(_) => {
                tracing::warn!(
                    runtime_class = %name,
                    timeout_ms = lookup_timeout.as_millis() as u64,
                    "RuntimeClass lookup timed out"
                );
                RuntimeClassState::Unknown
            }
        }
    };
    let runtime_class = runtime_class_state(needs.runtime_class, runtime_class_name);
    let legacy_runtime_class = runtime_class_state(
        needs.legacy_runtime_class,
        super::devices::LEGACY_RUNTIME_CLASS,
    );
    let (labels, runtime_class, mig_offers, legacy_runtime_class) =
        tokio::join!(labels, runtime_class, mig_offers, legacy_runtime_class);
    match labels {
        Ok(labels) => Ok(Found {
            labels,
            runtime_class,
            mig_offers,
            legacy_runtime_class,
        }),
        Err(e) => {
            tracing::warn!(error = %e, namespace, "cannot read namespace labels");
            Err(Denial {
                reason: plan::DenialReason::NamespaceUnavailable,
                message: format!(
                    "gpu-share: cannot read the labels of namespace {namespace}, which the policy needs for {subject} ({e}); retry shortly"
                ),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_errors_are_in_words() {
        assert!(
            parse_review(b"not json")
                .unwrap_err()
                .to_string()
                .contains("not JSON")
        );
        assert!(
            parse_review(b"{}")
                .unwrap_err()
                .to_string()
                .contains("not an AdmissionReview")
        );
        assert!(
            parse_review(br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1"}"#)
                .unwrap_err()
                .to_string()
                .contains("no request")
        );
        assert!(parse_review(br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":5}}"#).unwrap_err().to_string().contains("malformed"));
        assert!(matches!(
            parse_review(br#"{"kind":"AdmissionReview","apiVersion":"v1","request":{"uid":"a"}}"#),
            Err(ReviewError::ApiVersion(v)) if v == "v1"
        ));
    }

    /// A webhook context whose API server accepts requests and never answers them.
    fn hanging_cluster() -> (Context, crate::cluster::mock::Handle) {
        use std::sync::Arc;
        let (client, handle) = crate::cluster::mock::client();
        let state = Context {
            policy: Arc::new(crate::shared::PolicyStore::new(
                crate::policy::Policy::default_policy(),
            )),
            cluster: Some(crate::cluster::ClusterFacts::new(client)),
            metrics: Arc::new(crate::metrics::Metrics::new()),
            annotation_writers: Arc::new(vec![crate::admission::guard::DEFAULT_WRITER.into()]),
            dev_mig_offers: None,
        };
        (state, handle)
    }

    fn create(annotations: Value, spec: Value) -> AdmissionReviewIn {
        let body = serde_json::json!({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1",
            "request": {"uid": "u", "operation": "CREATE", "namespace": "ml",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "object": {"metadata": {"name": "p", "namespace": "ml", "annotations": annotations},
                           "spec": spec}}});
        parse_review(&serde_json::to_vec(&body).unwrap()).unwrap()
    }

    fn containers() -> Value {
        serde_json::json!({"containers": [{"name": "main", "image": "x"}]})
    }

    const SHORT: Duration = Duration::from_millis(100);

    #[tokio::test]
    async fn a_hanging_api_server_denies_in_words_only_when_the_labels_matter() {
        let (state, _handle) = hanging_cluster();
        // MPS with hostIPC on (the default policy): the Pod Security level must be known.
        let review = create(serde_json::json!({"gpu-share": "mps-50"}), containers());
        let started = Instant::now();
        let decision = decide_within(&state, &review, "ml", SHORT).await;
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "waited too long"
        );
        let Decision::Deny(d) = decision else {
            panic!("expected a denial, got {decision:?}")
        };
        assert_eq!(d.reason, plan::DenialReason::NamespaceUnavailable);
        assert!(
            d.message.contains("did not answer within 100 ms"),
            "{}",
            d.message
        );

        // Time-slicing under a policy without selector rules: the labels are not needed, and
        // the RuntimeClass lookup gives up with a warning instead of hanging.
        let review = create(
            serde_json::json!({"gpu-share": "timeslice-50"}),
            containers(),
        );
        let decision = decide_within(&state, &review, "ml", SHORT).await;
        let Decision::Mutate(m) = decision else {
            panic!("expected a mutation, got {decision:?}")
        };
        assert!(
            m.warnings
                .iter()
                .any(|w| w.contains("could not check RuntimeClass")),
            "{:?}",
            m.warnings
        );
    }

    #[tokio::test]
    async fn no_lookup_when_the_pod_names_its_runtime_class() {
        let (state, mut handle) = hanging_cluster();
        let mut spec = containers();
        spec["runtimeClassName"] = serde_json::json!("custom");
        let review = create(serde_json::json!({"gpu-share": "exclusive"}), spec);
        let decision = decide_within(&state, &review, "ml", SHORT).await;
        assert!(matches!(decision, Decision::Mutate(_)), "{decision:?}");
        let asked = tokio::time::timeout(Duration::from_millis(50), handle.next_request()).await;
        assert!(
            asked.is_err(),
            "the API server was asked: {:?}",
            asked.ok().flatten().map(|(r, _)| r.uri().clone())
        );
    }

    #[test]
    fn deny_has_no_patch_and_echoes() {
        let review = parse_review(br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"u1"}}"#).unwrap();
        let d = Decision::Deny(Denial {
            reason: plan::DenialReason::Unparsable,
            message: "no".into(),
        });
        let out = serde_json::to_value(respond(&review, &d)).unwrap();
        assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(out["kind"], "AdmissionReview");
        assert_eq!(out["response"]["uid"], "u1");
        assert_eq!(out["response"]["allowed"], false);
        assert_eq!(out["response"]["status"]["code"], 403);
        assert!(out["response"].get("patch").is_none());
        assert!(out["response"].get("patchType").is_none());
    }
}

//! Shared helpers for the integration tests.
#![allow(dead_code)]

use std::sync::Once;

use axum::body::Body;
use base64::Engine;
use gpu_share::cli::Role;
use gpu_share::policy::Policy;
use gpu_share::server::{AppState, router};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;
use tower::ServiceExt;

static PROVIDER: Once = Once::new();

/// Installs the ring crypto provider once per test binary, as `main` does.
pub fn install_crypto() {
    PROVIDER.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

pub fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

pub fn dev_state() -> AppState {
    AppState::dev(Role::All, Policy::default_policy())
}

/// POSTs a body to the router and returns (status, JSON body).
pub async fn post(state: AppState, path: &str, body: Vec<u8>) -> (u16, Value) {
    let req = http::Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let resp = router(state).oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, value)
}

/// Decodes the base64 JSON Patch of an AdmissionReview response.
pub fn decode_patch(response: &Value) -> Option<json_patch::Patch> {
    let b64 = response["response"]["patch"].as_str()?;
    assert_eq!(
        response["response"]["patchType"], "JSONPatch",
        "patch without patchType"
    );
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("patch is base64");
    Some(serde_json::from_slice(&bytes).expect("patch is an RFC 6902 JSON Patch"))
}

/// Applies the response's patch to the request's object and returns the pod as JSON and typed.
pub fn apply(review: &Value, response: &Value) -> (Value, Pod) {
    let mut doc = review["request"]["object"].clone();
    if let Some(patch) = decode_patch(response) {
        json_patch::patch(&mut doc, &patch).expect("the patch applies to the object received");
    }
    let pod: Pod = serde_json::from_value(doc.clone()).expect("the patched object is a valid Pod");
    (doc, pod)
}

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_gpu-share");

/// Runs the binary, expects success, returns stdout (stderr in the failure message).
pub fn run_ok<S: AsRef<std::ffi::OsStr>>(args: impl IntoIterator<Item = S>) -> String {
    let out = std::process::Command::new(BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs the binary, expects failure, returns stderr.
pub fn run_err<S: AsRef<std::ffi::OsStr>>(args: impl IntoIterator<Item = S>) -> String {
    let out = std::process::Command::new(BIN).args(args).output().unwrap();
    assert!(
        !out.status.success(),
        "expected a failure, got: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stderr).unwrap()
}
pub mod cluster;
pub mod nvidia;
pub mod nvml;
pub mod reserve;
pub mod serve;

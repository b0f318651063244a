//! Kubernetes writes of the extender: the `pods/binding` subresource (with the per-GPU model as
//! an annotation, which the API server copies onto the pod) and the requeue nudge.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

/// The annotation that nudges a pod waiting for GPU capacity back into kube-scheduler's queue.
pub const ANNOTATION_REQUEUE: &str = "gpu-share.io/requeued-at";

/// The Binding object for a pod (with the pod's UID as a precondition).
pub fn binding_body(
    namespace: &str,
    name: &str,
    uid: &str,
    node: &str,
    annotations: &BTreeMap<String, String>,
) -> Value {
    let mut metadata = json!({ "name": name, "namespace": namespace });
    if !uid.is_empty() {
        metadata["uid"] = json!(uid);
    }
    if !annotations.is_empty() {
        metadata["annotations"] = json!(annotations);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": metadata,
        "target": { "apiVersion": "v1", "kind": "Node", "name": node },
    })
}

/// POSTs `pods/<name>/binding`.
pub async fn bind_pod(
    client: &Client,
    namespace: &str,
    name: &str,
    uid: &str,
    node: &str,
    annotations: BTreeMap<String, String>,
) -> Result<(), kube::Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let body = binding_body(namespace, name, uid, node, &annotations);
    let _: Value = api
        .create_subresource("binding", name, &PostParams::default(), &body)
        .await?;
    Ok(())
}

/// Reads one pod.
pub async fn get_pod(client: &Client, namespace: &str, name: &str) -> Result<Pod, kube::Error> {
    Api::<Pod>::namespaced(client.clone(), namespace)
        .get(name)
        .await
}

/// Touches a waiting pod's annotation: an update of an unschedulable pod moves it out of
/// kube-scheduler's unschedulable queue (pods rejected by an extender name no in-tree plugin,
/// so any update requeues them), instead of waiting for the 5-minute flush.
pub async fn nudge(
    client: &Client,
    namespace: &str,
    name: &str,
    stamp: &str,
) -> Result<(), kube::Error> {
    annotate(client, namespace, name, ANNOTATION_REQUEUE, stamp).await
}

/// Sets one annotation of a pod (a merge patch): the requeue nudge, and a share re-pointed at
/// another GPU (`gpu-share.io/gpus`).
pub async fn annotate(
    client: &Client,
    namespace: &str,
    name: &str,
    key: &str,
    value: &str,
) -> Result<(), kube::Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let patch = json!({ "metadata": { "annotations": { key: value } } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bind_posts_the_binding_with_the_annotation() {
        let (client, mut handle) = crate::cluster::mock::client();
        let server = tokio::spawn(async move {
            let (req, send) = handle.next_request().await.expect("a request");
            assert_eq!(req.method(), http::Method::POST);
            assert_eq!(req.uri().path(), "/api/v1/namespaces/ml/pods/p/binding");
            let body = req.into_body().collect_bytes().await.unwrap();
            let v: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["kind"], "Binding");
            assert_eq!(v["metadata"]["uid"], "u-1");
            assert_eq!(v["metadata"]["annotations"]["gpu-share.io/gpus"], "1:250");
            assert_eq!(v["target"]["name"], "gpu-a");
            assert_eq!(v["target"]["kind"], "Node");
            send.send_response(crate::cluster::mock::text(
                201,
                br#"{"kind":"Status","apiVersion":"v1","status":"Success","code":201}"#.to_vec(),
            ));
        });
        bind_pod(
            &client,
            "ml",
            "p",
            "u-1",
            "gpu-a",
            [("gpu-share.io/gpus".to_string(), "1:250".to_string())].into(),
        )
        .await
        .unwrap();
        server.await.unwrap();
    }

    #[tokio::test]
    async fn bind_conflict_is_an_error() {
        let (client, mut handle) = crate::cluster::mock::client();
        let server = tokio::spawn(async move {
            let (_req, send) = handle.next_request().await.expect("a request");
            send.send_response(
                crate::cluster::mock::text(409,
                        br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"pod p is already assigned to node \"gpu-b\"","reason":"Conflict","code":409}"#
                            .to_vec(),
                    ),
            );
        });
        let err = bind_pod(&client, "ml", "p", "u-1", "gpu-a", BTreeMap::new())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("already assigned"), "{err}");
        server.await.unwrap();
    }

    #[tokio::test]
    async fn nudge_patches_the_annotation() {
        let (client, mut handle) = crate::cluster::mock::client();
        let server = tokio::spawn(async move {
            let (req, send) = handle.next_request().await.expect("a request");
            assert_eq!(req.method(), http::Method::PATCH);
            assert_eq!(req.uri().path(), "/api/v1/namespaces/ml/pods/waiting");
            assert_eq!(
                req.headers()["content-type"],
                "application/merge-patch+json"
            );
            let body = req.into_body().collect_bytes().await.unwrap();
            let v: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["metadata"]["annotations"][ANNOTATION_REQUEUE], "t1");
            send.send_response(
                crate::cluster::mock::text(200,
                        br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"waiting","namespace":"ml"}}"#.to_vec(),
                    ),
            );
        });
        nudge(&client, "ml", "waiting", "t1").await.unwrap();
        server.await.unwrap();
    }
}

//! The gpu-share-scheduler's kube-scheduler against the cluster's API server, once at the
//! extender's start ([`crate::skew`]): the sidecar reads its own Pod for kube-scheduler's image
//! and the API server's `/version`, and where the skew policy does not hold it says so in an
//! error log line and a Warning event `KubeSchedulerVersionSkew` on its Pod (`kubectl describe`
//! shows it), rather than leave the cluster's GPU pods Pending with no word.

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client, Resource};

/// The event's reason.
pub const EVENT_REASON: &str = "KubeSchedulerVersionSkew";

/// The name of kube-scheduler's container in the shipped Deployment.
const CONTAINER: &str = "kube-scheduler";

/// Checks once, in the background; a pod it cannot read (outside a pod, or a name it cannot
/// resolve) is logged at debug and left alone.
pub fn spawn(client: Client) {
    tokio::spawn(async move {
        if let Err(why) = check(&client).await {
            tracing::debug!(%why, "kube-scheduler's version not checked against the API server's");
        }
    });
}

async fn check(client: &Client) -> Result<(), String> {
    let (Ok(name), Ok(namespace)) = (std::env::var("POD_NAME"), std::env::var("POD_NAMESPACE"))
    else {
        return Err("not in a pod (POD_NAME, POD_NAMESPACE unset)".into());
    };
    let pod = Api::<Pod>::namespaced(client.clone(), &namespace)
        .get(&name)
        .await
        .map_err(|e| format!("reading pod {namespace}/{name}: {e}"))?;
    let Some(image) = pod.spec.as_ref().and_then(|s| {
        s.containers
            .iter()
            .find(|c| c.name == CONTAINER)
            .and_then(|c| c.image.clone())
    }) else {
        return Err(format!(
            "pod {namespace}/{name} has no container {CONTAINER}"
        ));
    };
    let Some(scheduler) = crate::skew::image_version(&image) else {
        return Err(format!("{image}: its tag names no version"));
    };
    let info = client
        .apiserver_version()
        .await
        .map_err(|e| format!("reading the API server's version: {e}"))?;
    let Some(server) = crate::skew::parse(&info.git_version) else {
        return Err(format!("the API server's version {:?}", info.git_version));
    };
    let Some(sentence) = crate::skew::verdict(scheduler, server, &image, &info.git_version) else {
        tracing::info!(%image, server = %info.git_version, "kube-scheduler's version is within the skew policy");
        return Ok(());
    };
    tracing::error!(%image, server = %info.git_version, "{sentence}");
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "gpu-share-scheduler".into(),
            instance: Some(name.clone()),
        },
    );
    let reference: ObjectReference = pod.object_ref(&());
    let event = Event {
        type_: EventType::Warning,
        reason: EVENT_REASON.into(),
        note: Some(sentence.chars().take(1000).collect()),
        action: "CheckVersion".into(),
        secondary: None,
    };
    recorder
        .publish(&event, &reference)
        .await
        .map_err(|e| format!("recording the event: {e}"))
}

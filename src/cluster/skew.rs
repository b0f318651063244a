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

/// Why the versions were not compared (or the event not recorded).
#[derive(Debug, thiserror::Error)]
pub enum NotChecked {
    #[error("not in a pod (POD_NAME, POD_NAMESPACE unset)")]
    NotInAPod,
    #[error("reading pod {pod}: {source}")]
    Pod { pod: String, source: kube::Error },
    #[error("pod {0} has no container {CONTAINER}")]
    NoScheduler(String),
    #[error("{0}: its tag names no version")]
    NoVersion(String),
    #[error("reading the API server's version: {0}")]
    Server(kube::Error),
    #[error("the API server's version {0:?} is not understood")]
    ServerVersion(String),
    #[error("recording the event: {0}")]
    Event(kube::Error),
}

/// Checks once, in the background; a pod it cannot read (outside a pod, or a name it cannot
/// resolve) is logged at debug and left alone.
pub fn spawn(client: Client) {
    tokio::spawn(async move {
        if let Err(why) = check(&client).await {
            tracing::debug!(%why, "kube-scheduler's version not checked against the API server's");
        }
    });
}

async fn check(client: &Client) -> Result<(), NotChecked> {
    let (Ok(name), Ok(namespace)) = (std::env::var("POD_NAME"), std::env::var("POD_NAMESPACE"))
    else {
        return Err(NotChecked::NotInAPod);
    };
    let pod = Api::<Pod>::namespaced(client.clone(), &namespace)
        .get(&name)
        .await
        .map_err(|source| NotChecked::Pod {
            pod: format!("{namespace}/{name}"),
            source,
        })?;
    let Some(image) = pod.spec.as_ref().and_then(|s| {
        s.containers
            .iter()
            .find(|c| c.name == CONTAINER)
            .and_then(|c| c.image.clone())
    }) else {
        return Err(NotChecked::NoScheduler(format!("{namespace}/{name}")));
    };
    let Some(scheduler) = crate::skew::image_version(&image) else {
        return Err(NotChecked::NoVersion(image));
    };
    let info = client
        .apiserver_version()
        .await
        .map_err(NotChecked::Server)?;
    let Some(server) = crate::skew::parse(&info.git_version) else {
        return Err(NotChecked::ServerVersion(info.git_version));
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
        .map_err(NotChecked::Event)
}

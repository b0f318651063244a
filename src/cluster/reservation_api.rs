//! Kubernetes writes for reservations: creating a GPU's reservation pod and finding the image
//! it runs (gpu-share's own); and the reservation controller's writes: filling a share's devices
//! ConfigMap, evicting a share with an event in words, deleting a reservation,
//! and reading whether this replica leads.

use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Pod};
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::Store;
use kube::{Api, Client};

use super::ClusterFacts;
use crate::reservation::view::{Filled, Owner, Pointing, ReservationPod, devices_configmap};
use crate::reservation::{self, Template};

/// Why a reservation pod was not created.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error(
        "no image for reservation pods: set --reservation-image (GPU_SHARE_RESERVATION_IMAGE), or run gpu-share in a pod with POD_NAME and POD_NAMESPACE set"
    )]
    NoImage,
    #[error("{0}")]
    Api(#[from] kube::Error),
    #[error("no answer within {} s", CREATE_TIMEOUT.as_secs_f64())]
    Unanswered,
}

impl CreateError {
    /// Whether the pod surely was not created: no image, or the API refused it (4xx). A server
    /// error, a lost connection or no answer may have created it all the same.
    pub fn nothing_created(&self) -> bool {
        match self {
            CreateError::NoImage => true,
            CreateError::Api(kube::Error::Api(s)) => (400..500).contains(&s.code),
            CreateError::Api(_) | CreateError::Unanswered => false,
        }
    }
}

/// How long creating a reservation may take within a bind (kube-scheduler gives the extender
/// 5 s, of which the binding call itself needs up to 3).
pub const CREATE_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(1500);

/// Creates the reservation of GPU `gpu` on `node` (running the GPU's MPS daemon when `mps`);
/// one that exists already (a racing bind, or one still in its release grace) is the same
/// reservation. The pod as the API created it, or `None` where it existed.
pub async fn create(
    client: &Client,
    node: &str,
    gpu: u32,
    mps: bool,
    template: &Template,
) -> Result<Option<Pod>, CreateError> {
    if template.image.is_empty() {
        return Err(CreateError::NoImage);
    }
    let pod: Pod = serde_json::from_value(reservation::pod(node, gpu, mps, template))
        .expect("the reservation pod is a valid Pod (tested)");
    let api: Api<Pod> = Api::namespaced(client.clone(), reservation::NAMESPACE);
    match tokio::time::timeout(CREATE_TIMEOUT, api.create(&PostParams::default(), &pod)).await {
        Ok(Ok(created)) => {
            tracing::info!(node, gpu, "reservation created");
            Ok(Some(created))
        }
        Ok(Err(kube::Error::Api(s))) if s.code == 409 => Ok(None),
        Ok(Err(e)) => Err(CreateError::Api(e)),
        Err(_) => Err(CreateError::Unanswered),
    }
}

/// What filling a share's devices ConfigMap came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fill {
    /// Written now, or found as gpu-share writes it (an earlier pass whose answer was lost).
    Done,
    /// A ConfigMap of that name exists and is not this share's GPU (made by someone else, or
    /// for another GPU): it is immutable, so the share cannot be pointed at its GPU. What it is.
    Foreign(String),
}

/// Creates the devices ConfigMap of share `owner`, pointing it at `to`.
pub async fn fill(
    client: &Client,
    configmap: &str,
    owner: &Owner,
    to: &Pointing,
    reservation: &str,
) -> Result<Fill, kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &owner.namespace);
    let cm: ConfigMap =
        serde_json::from_value(devices_configmap(configmap, owner, to, reservation))
            .expect("the devices ConfigMap is a valid ConfigMap (tested)");
    match api.create(&PostParams::default(), &cm).await {
        Ok(_) => Ok(Fill::Done),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let found = api.get(configmap).await?;
            Ok(match Filled::of(&found) {
                Some(f) if f.is_of(&owner.uid, configmap) && f.says(to) => Fill::Done,
                Some(f) if f.owner_uid == owner.uid => {
                    Fill::Foreign(format!("it holds {:?}", f.uuid))
                }
                _ => Fill::Foreign("it was not written by gpu-share for this pod".into()),
            })
        }
        Err(e) => Err(e),
    }
}

/// The action the reservation controller's events report.
pub const ACTION: &str = "GpuReservation";
/// The reason of the events on shares gpu-share evicts.
pub const EVENT_EVICTED: &str = "GpuShareEvicted";
/// The reason of the events on shares gpu-share points at another GPU.
pub const EVENT_MOVED: &str = "GpuShareMoved";

/// Records an event on pod `owner` (logged, not fatal, when it cannot be recorded).
pub async fn note(
    recorder: &Recorder,
    owner: &Owner,
    warning: bool,
    action: &str,
    reason: &str,
    note: &str,
) {
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(owner.name.clone()),
        namespace: Some(owner.namespace.clone()),
        uid: Some(owner.uid.clone()),
        ..Default::default()
    };
    let event = Event {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: action.into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &reference).await {
        tracing::warn!(pod = %format!("{}/{}", owner.namespace, owner.name), error = %e, "cannot record an event");
    }
}

/// Deletes share `owner`: an event saying why, then the pod deleted (this pod only: its UID is a
/// precondition). One already gone is deleted.
pub async fn delete_share(
    recorder: &Recorder,
    client: &Client,
    owner: &Owner,
    why: &str,
) -> Result<(), kube::Error> {
    note(
        recorder,
        owner,
        true,
        ACTION,
        EVENT_EVICTED,
        &format!("gpu-share evicted the pod: {why}"),
    )
    .await;
    let api: Api<Pod> = Api::namespaced(client.clone(), &owner.namespace);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(owner.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&owner.name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Deletes reservation `name`, the pod `uid` (not a later one of the same name); one already
/// gone is deleted.
pub async fn delete(client: &Client, name: &str, uid: &str) -> Result<(), kube::Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), reservation::NAMESPACE);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// The reservation pods' image: the flag's, else this process's own container image, read from
/// its Pod (the container that runs `serve`). Empty when neither is known: binds that need a
/// reservation then fail in words ([`CreateError::NoImage`]).
pub async fn image(flag: Option<&str>, cluster: Option<&ClusterFacts>) -> String {
    if let Some(image) = flag.filter(|i| !i.is_empty()) {
        return image.to_string();
    }
    let (Some(c), Ok(name), Ok(namespace)) = (
        cluster,
        std::env::var("POD_NAME"),
        std::env::var("POD_NAMESPACE"),
    ) else {
        return String::new();
    };
    let api: Api<Pod> = Api::namespaced(c.client().clone(), &namespace);
    match api.get(&name).await {
        Ok(pod) => own_image(&pod).unwrap_or_default(),
        Err(e) => {
            tracing::warn!(error = %e, pod = %format!("{namespace}/{name}"), "cannot read this pod for the reservation image; set --reservation-image");
            String::new()
        }
    }
}

/// The image of the container that runs `gpu-share serve`.
pub fn own_image(pod: &Pod) -> Option<String> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| {
            c.args
                .iter()
                .chain(c.command.iter())
                .flatten()
                .any(|a| a == "serve")
        })
        .and_then(|c| c.image.clone())
}

/// The reservation pods as the controller's watch keeps them, for `/v1/nodes` and the metrics
/// (every replica watches; only the leader acts). Empty before the watch starts, and without a
/// cluster.
#[derive(Default)]
pub struct Seen(std::sync::OnceLock<Store<Pod>>);

impl Seen {
    /// Reads from `store` from now on (the first store given stays).
    pub fn watch(&self, store: Store<Pod>) {
        let _ = self.0.set(store);
    }

    /// Every reservation pod the watch holds, in whatever state.
    pub fn pods(&self) -> Vec<ReservationPod> {
        self.pods_where(|_| true)
    }

    /// The reservation of GPU `gpu` on `node` that is ready (its GPU's UUID published, and its
    /// MPS daemon's pipe where it runs one).
    pub fn ready(&self, node: &str, gpu: u32) -> Option<ReservationPod> {
        let on_node = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node);
        self.pods_where(on_node)
            .into_iter()
            .find(|r| r.gpu == gpu && r.state.uuid().is_some())
    }

    fn pods_where(&self, keep: impl Fn(&Pod) -> bool) -> Vec<ReservationPod> {
        let Some(store) = self.0.get() else {
            return Vec::new();
        };
        store
            .state()
            .iter()
            .filter(|p| keep(p))
            .filter_map(|p| ReservationPod::of(p))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::mock;

    fn template() -> Template {
        Template {
            image: "registry.example/gpu-share:1.2".into(),
            ..Template::default()
        }
    }

    /// The pod goes to the reservations' namespace, bound to its node; an existing one is the
    /// same reservation; a refusal comes back in the API's words.
    #[tokio::test]
    async fn create_posts_the_pod_and_takes_an_existing_one_as_it() {
        let (client, mut handle) = mock::client();
        let server = tokio::spawn(async move {
            for status in [201u16, 409, 403] {
                let (req, send) = handle.next_request().await.expect("a request");
                assert_eq!(req.method(), "POST");
                assert_eq!(
                    req.uri().path(),
                    "/api/v1/namespaces/gpu-share-reservations/pods"
                );
                let body = http_body_util::BodyExt::collect(req.into_body())
                    .await
                    .unwrap()
                    .to_bytes();
                let pod: serde_json::Value = serde_json::from_slice(&body).unwrap();
                assert_eq!(pod["metadata"]["name"], "gpu-share-n1-gpu-3");
                assert_eq!(pod["spec"]["nodeName"], "n1");
                assert_eq!(
                    pod["spec"]["containers"][0]["image"],
                    "registry.example/gpu-share:1.2"
                );
                let reply = if status == 201 {
                    pod
                } else {
                    serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "message": format!("status {status}"), "reason": "x", "code": status})
                };
                send.send_response(mock::json(status, &reply));
            }
        });
        let created = create(&client, "n1", 3, false, &template()).await.unwrap();
        assert_eq!(
            created.and_then(|p| p.metadata.name).as_deref(),
            Some("gpu-share-n1-gpu-3"),
            "the pod as created"
        );
        assert!(
            create(&client, "n1", 3, false, &template())
                .await
                .unwrap()
                .is_none(),
            "it existed"
        );
        let e = create(&client, "n1", 3, false, &template())
            .await
            .unwrap_err();
        assert!(e.nothing_created(), "a refusal creates nothing");
        let e = e.to_string();
        assert!(e.contains("status 403"), "{e}");
        server.await.unwrap();
        // Without an image nothing is sent.
        let e = create(&client, "n1", 3, false, &Template::default())
            .await
            .unwrap_err();
        assert!(matches!(e, CreateError::NoImage), "{e}");
        assert!(e.nothing_created());
        assert!(!CreateError::Unanswered.nothing_created(), "it may exist");
        assert_eq!(
            CreateError::Unanswered.to_string(),
            "no answer within 1.5 s"
        );
        assert!(e.to_string().contains("--reservation-image"));
    }

    #[test]
    fn the_own_image_is_the_serving_containers() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [
                {"name": "kube-scheduler", "image": "registry.k8s.io/kube-scheduler:v1.37.0"},
                {"name": "extender", "image": "gpu-share:9", "args": ["serve", "--role", "extender"]}
            ]}
        }))
        .unwrap();
        assert_eq!(own_image(&pod).as_deref(), Some("gpu-share:9"));
    }
}

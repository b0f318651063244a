//! PURE: what the reservation controller reads of the API and writes to it, as plain data.
//!
//! - A reservation pod's state ([`ReservationPod::of`]): the UUID it published, the error it
//!   wrote, or what kubelet says of it (a pod it refused because the device plugin had no GPU
//!   left, a container waiting on an image that cannot pull).
//! - The devices ConfigMap of a share ([`devices_configmap`]): the UUID of the share's GPU under
//!   the key its container reads, immutable, owned by the pod (so it goes when the pod goes),
//!   labelled so that the controller watches only these ([`DEVICES_SELECTOR`]).
//! - How one of those reads back ([`Filled::of`]).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use serde_json::{Value, json};

use super::model::{
    ANNOTATION_CDI_DEVICE, ANNOTATION_ERROR, ANNOTATION_GPU, ANNOTATION_MPS, ANNOTATION_MPS_DOWN,
    ANNOTATION_MPS_PIPE, ANNOTATION_UUID, GPU_CDI_KIND, MPS_CDI_KIND, MPS_PINNED_KEY, NAMESPACE,
    is_gpu_uuid,
};
pub use super::plan::{Pointing, Through};
use super::plan::{Reservation, ReservationState};
use crate::request::{CDI_DEVICE_KEY, DEVICES_KEY};

/// The label that tells devices ConfigMaps apart (with `app.kubernetes.io/name: gpu-share`).
pub const LABEL_DEVICES: (&str, &str) = ("app.kubernetes.io/component", "gpu-devices");
/// The label selector of the devices ConfigMaps.
pub const DEVICES_SELECTOR: &str =
    "app.kubernetes.io/name=gpu-share,app.kubernetes.io/component=gpu-devices";
/// On a devices ConfigMap: the reservation that holds the GPU it names (for people reading it).
pub const ANNOTATION_RESERVATION: &str = "gpu-share.io/reservation";

/// A reservation pod as the controller keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservationPod {
    pub name: String,
    pub uid: String,
    pub node: String,
    pub gpu: u32,
    /// It runs the GPU's MPS daemon ([`ANNOTATION_MPS`]).
    pub mps: bool,
    /// It writes the GPU's time-sliced CDI device ([`ANNOTATION_CDI_DEVICE`]).
    pub cdi_device: bool,
    pub state: ReservationState,
    pub created: Option<SystemTime>,
}

impl ReservationPod {
    /// A pod that is a reservation (in [`NAMESPACE`], bound, naming its GPU), in whatever phase.
    pub fn of(pod: &Pod) -> Option<ReservationPod> {
        let m = &pod.metadata;
        if m.namespace.as_deref() != Some(NAMESPACE) {
            return None;
        }
        let annotations = m.annotations.as_ref();
        let gpu = annotations?.get(ANNOTATION_GPU)?.trim().parse().ok()?;
        let mps = annotations?.get(ANNOTATION_MPS).map(|v| v.trim()) == Some("true");
        let cdi_device = annotations?.get(ANNOTATION_CDI_DEVICE).map(|v| v.trim()) == Some("true");
        let node = pod.spec.as_ref()?.node_name.clone()?;
        let name = m.name.clone()?;
        let state = state_of(pod, &name, mps);
        Some(ReservationPod {
            name,
            uid: m.uid.clone().unwrap_or_default(),
            node,
            gpu,
            mps,
            cdi_device,
            state,
            created: m.creation_timestamp.as_ref().map(|t| SystemTime::from(t.0)),
        })
    }

    /// As the plan weighs it at `now` (a pod whose creation time is unknown is new).
    pub fn at(&self, now: SystemTime) -> Reservation {
        Reservation {
            name: self.name.clone(),
            uid: self.uid.clone(),
            mps: self.mps,
            cdi_device: self.cdi_device,
            state: self.state.clone(),
            age: self
                .created
                .and_then(|c| now.duration_since(c).ok())
                .unwrap_or(Duration::ZERO),
        }
    }
}

/// What a reservation pod says of itself, most telling first: being deleted, the error it wrote,
/// a finished pod (kubelet refused it, or its process ended), the UUID it published (and, for
/// an MPS reservation, the pipe of its daemon, which it publishes once the daemon answers with
/// its defaults set and the GPU's CDI device is written), else starting (with why its container
/// waits, if kubelet says). An MPS daemon down after it was up ([`ANNOTATION_MPS_DOWN`]) leaves
/// the reservation ready: its GPU is closed to new contexts meanwhile, so a share pointed at it
/// waits for the daemon, not on another GPU.
fn state_of(pod: &Pod, name: &str, mps: bool) -> ReservationState {
    if pod.metadata.deletion_timestamp.is_some() {
        return ReservationState::Leaving;
    }
    let annotations = pod.metadata.annotations.as_ref();
    let annotation = |k: &str| {
        annotations
            .and_then(|a| a.get(k))
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    if let Some(error) = annotation(ANNOTATION_ERROR) {
        return ReservationState::Failed {
            why: format!("reservation {name} failed: {error}"),
        };
    }
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or_default();
    let containers = status
        .and_then(|s| s.container_statuses.as_deref())
        .unwrap_or_default();
    if phase == "Failed" || phase == "Succeeded" {
        let terminated = containers.iter().find_map(|c| {
            let t = c.state.as_ref()?.terminated.as_ref()?;
            let message = t
                .message
                .clone()
                .unwrap_or_else(|| format!("exit code {}", t.exit_code));
            Some(join(t.reason.as_deref(), Some(&message)))
        });
        let said = status.and_then(|s| {
            (s.reason.is_some() || s.message.is_some())
                .then(|| join(s.reason.as_deref(), s.message.as_deref()))
        });
        let why = said
            .or(terminated)
            .unwrap_or_else(|| "no reason given".into());
        return ReservationState::Failed {
            why: format!("reservation {name} ended ({phase}): {why}"),
        };
    }
    let daemon_up = !mps
        || annotation(ANNOTATION_MPS_PIPE).is_some()
        || annotation(ANNOTATION_MPS_DOWN).is_some();
    if let Some(uuid) = annotation(ANNOTATION_UUID).filter(|_| daemon_up) {
        return if is_gpu_uuid(&uuid) {
            ReservationState::Ready { uuid }
        } else {
            ReservationState::Failed {
                why: format!("reservation {name} published {uuid:?}, which is not a GPU UUID"),
            }
        };
    }
    let waiting = containers.iter().find_map(|c| {
        let w = c.state.as_ref()?.waiting.as_ref()?;
        w.reason
            .as_ref()
            .map(|_| join(w.reason.as_deref(), w.message.as_deref()))
    });
    ReservationState::Starting { waiting }
}

/// `reason: message`, either alone, or neither.
fn join(reason: Option<&str>, message: Option<&str>) -> String {
    match (reason, message.map(str::trim).filter(|m| !m.is_empty())) {
        (Some(r), Some(m)) => format!("{r}: {m}"),
        (Some(r), None) => r.to_string(),
        (None, Some(m)) => m.to_string(),
        (None, None) => String::new(),
    }
}

/// The pod a devices ConfigMap belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// The devices ConfigMap `configmap` of pod `owner`: what its container reads under
/// [`DEVICES_KEY`] or [`CDI_DEVICE_KEY`] (and, for an MPS share, [`MPS_PINNED_KEY`]), immutable (what a container
/// started with cannot change under it), owned by the pod so the garbage collector deletes it
/// with the pod.
pub fn devices_configmap(
    configmap: &str,
    owner: &Owner,
    to: &Pointing,
    reservation: &str,
) -> Value {
    let mut data = json!({to.key(): to.devices()});
    if let Through::MpsDevice { pinned_mib } = to.through {
        data[MPS_PINNED_KEY] = json!(format!("0={pinned_mib}M"));
    }
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": configmap,
            "namespace": owner.namespace,
            "labels": {
                "app.kubernetes.io/name": "gpu-share",
                LABEL_DEVICES.0: LABEL_DEVICES.1,
            },
            "annotations": {ANNOTATION_RESERVATION: reservation},
            "ownerReferences": [{
                "apiVersion": "v1",
                "kind": "Pod",
                "name": owner.name,
                "uid": owner.uid,
            }],
        },
        "immutable": true,
        "data": data,
    })
}

/// A devices ConfigMap as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filled {
    pub namespace: String,
    pub name: String,
    /// The pod it belongs to (its owner reference).
    pub owner_uid: String,
    /// The GPU its key names (the container that reads it sees this GPU).
    pub uuid: String,
    /// What names it (an MPS device's pinned limit 0 where it does not read).
    pub through: Through,
}

impl Filled {
    /// A ConfigMap owned by a pod, with the key; `None` for any other.
    pub fn of(cm: &ConfigMap) -> Option<Filled> {
        let owner_uid = cm
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.kind == "Pod" && o.api_version == "v1")?
            .uid
            .clone();
        let data = cm.data.as_ref()?;
        let device = |value: &str, kind: &str| {
            value
                .strip_prefix(kind)
                .and_then(|r| r.strip_prefix('='))
                .map(str::to_string)
        };
        let (uuid, through) = match (data.get(DEVICES_KEY), data.get(CDI_DEVICE_KEY)) {
            (None, Some(v)) => (device(v, GPU_CDI_KIND)?, Through::GpuDevice),
            (Some(v), None) => match device(v, MPS_CDI_KIND) {
                Some(uuid) => {
                    let pinned_mib = data
                        .get(MPS_PINNED_KEY)
                        .and_then(|v| v.strip_prefix("0="))
                        .and_then(|v| v.strip_suffix('M'))
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    (uuid, Through::MpsDevice { pinned_mib })
                }
                None => (v.clone(), Through::Uuid),
            },
            _ => return None,
        };
        Some(Filled {
            namespace: cm.metadata.namespace.clone()?,
            name: cm.metadata.name.clone()?,
            owner_uid,
            uuid,
            through,
        })
    }

    /// Whether it says what `to` says.
    pub fn says(&self, to: &Pointing) -> bool {
        self.uuid == to.uuid && self.through == to.through
    }

    /// Whether it is the ConfigMap `configmap` of pod `uid`: the one its container reads.
    pub fn is_of(&self, uid: &str, configmap: &str) -> bool {
        self.owner_uid == uid && self.name == configmap
    }
}

/// The devices ConfigMaps by the UID of the pod that owns them.
pub type FilledByOwner = BTreeMap<String, Filled>;

#[cfg(test)]
mod tests {
    use super::*;

    fn reservation(status: Value, annotations: Value, deleting: bool) -> Pod {
        let mut metadata = json!({
            "name": "gpu-share-n1-gpu-0",
            "namespace": NAMESPACE,
            "creationTimestamp": "2026-11-26T10:00:00Z",
            "annotations": annotations,
        });
        if deleting {
            metadata["deletionTimestamp"] = json!("2026-11-26T10:05:00Z");
        }
        serde_json::from_value(json!({
            "metadata": metadata,
            "spec": {"nodeName": "n1", "containers": [{"name": "reserve"}]},
            "status": status,
        }))
        .unwrap()
    }

    fn state(status: Value, annotations: Value) -> ReservationState {
        ReservationPod::of(&reservation(status, annotations, false))
            .unwrap()
            .state
    }

    #[test]
    fn a_reservation_reads_as_the_api_shows_it() {
        let gpu = json!({ANNOTATION_GPU: "0"});
        assert_eq!(
            state(json!({"phase": "Pending"}), gpu.clone()),
            ReservationState::Starting { waiting: None }
        );
        let pulling = json!({"phase": "Pending", "containerStatuses": [{
            "name": "reserve", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"x\""}}}]});
        assert_eq!(
            state(pulling, gpu.clone()),
            ReservationState::Starting {
                waiting: Some("ImagePullBackOff: Back-off pulling image \"x\"".into())
            }
        );
        let ready = json!({ANNOTATION_GPU: "0", ANNOTATION_UUID: "GPU-0a1b"});
        assert_eq!(
            state(json!({"phase": "Running"}), ready),
            ReservationState::Ready {
                uuid: "GPU-0a1b".into()
            }
        );
        // kubelet refused it: the device plugin had no GPU left.
        let refused = json!({"phase": "Failed", "reason": "UnexpectedAdmissionError",
            "message": "Allocate failed due to requested number of devices unavailable for nvidia.com/gpu. Requested: 1, Available: 0, which is unexpected"});
        let ReservationState::Failed { why } = state(refused, gpu.clone()) else {
            panic!()
        };
        assert!(
            why.contains("gpu-share-n1-gpu-0")
                && why.contains("UnexpectedAdmissionError: Allocate failed"),
            "{why}"
        );
        // Its own words come first.
        let said = json!({ANNOTATION_GPU: "0", ANNOTATION_ERROR: "NVML failed: driver not loaded"});
        let ReservationState::Failed { why } = state(json!({"phase": "Failed"}), said) else {
            panic!()
        };
        assert!(
            why.ends_with("failed: NVML failed: driver not loaded"),
            "{why}"
        );
        let bad = json!({ANNOTATION_GPU: "0", ANNOTATION_UUID: "all"});
        assert!(matches!(
            state(json!({"phase": "Running"}), bad),
            ReservationState::Failed { why } if why.contains("\"all\"")
        ));
        let r = ReservationPod::of(&reservation(json!({}), gpu.clone(), true)).unwrap();
        assert_eq!(r.state, ReservationState::Leaving);
        assert_eq!((r.node.as_str(), r.gpu), ("n1", 0));
        let at = r.created.unwrap() + Duration::from_secs(90);
        assert_eq!(r.at(at).age, Duration::from_secs(90));
    }

    #[test]
    fn only_reservations_in_their_namespace_read_as_reservations() {
        let mut p = reservation(json!({}), json!({ANNOTATION_GPU: "0"}), false);
        assert!(ReservationPod::of(&p).is_some());
        p.metadata.namespace = Some("ml".into());
        assert!(ReservationPod::of(&p).is_none());
        let unbound = reservation(json!({}), json!({ANNOTATION_GPU: "x"}), false);
        assert!(ReservationPod::of(&unbound).is_none());
    }

    #[test]
    fn a_devices_configmap_reads_back_as_written() {
        let owner = Owner {
            namespace: "ml".into(),
            name: "infer-0".into(),
            uid: "u-1".into(),
        };
        let to = Pointing {
            uuid: "GPU-0a1b".into(),
            through: Through::Uuid,
        };
        let v = devices_configmap("gpu-share-devices-abc", &owner, &to, "r");
        assert_eq!(v["immutable"], true);
        assert_eq!(v["data"], json!({DEVICES_KEY: "GPU-0a1b"}));
        let cm: ConfigMap = serde_json::from_value(v.clone()).unwrap();
        let f = Filled::of(&cm).unwrap();
        assert_eq!(f.uuid, "GPU-0a1b");
        assert!(f.says(&to));
        // An MPS share: the GPU's CDI device of gpu-share's own, and its pinned limit.
        let mps = Pointing {
            uuid: "GPU-0a1b".into(),
            through: Through::MpsDevice { pinned_mib: 20480 },
        };
        let m = devices_configmap("gpu-share-devices-abc", &owner, &mps, "r");
        assert_eq!(
            m["data"],
            json!({DEVICES_KEY: "gpu-share.io/mps=GPU-0a1b", MPS_PINNED_KEY: "0=20480M"})
        );
        let f = Filled::of(&serde_json::from_value(m).unwrap()).unwrap();
        assert_eq!(f.uuid, "GPU-0a1b");
        assert!(f.says(&mps) && !f.says(&to));
        assert!(f.is_of("u-1", "gpu-share-devices-abc"));
        // A time-sliced share that takes its GPU's CDI device: under its own key, nothing else.
        let cdi = Pointing {
            uuid: "GPU-0a1b".into(),
            through: Through::GpuDevice,
        };
        let c = devices_configmap("gpu-share-devices-abc", &owner, &cdi, "r");
        assert_eq!(
            c["data"],
            json!({CDI_DEVICE_KEY: "gpu-share.io/gpu=GPU-0a1b"})
        );
        let f = Filled::of(&serde_json::from_value(c).unwrap()).unwrap();
        assert_eq!(f.uuid, "GPU-0a1b");
        assert!(f.says(&cdi) && !f.says(&to) && !f.says(&mps));
        // Both keys, or a CDI key naming another kind, is not a ConfigMap gpu-share writes.
        let mut both = cm.clone();
        both.data
            .as_mut()
            .unwrap()
            .insert(CDI_DEVICE_KEY.into(), "gpu-share.io/gpu=GPU-0a1b".into());
        assert!(Filled::of(&both).is_none());
        let mut other = cm.clone();
        other.data = Some(
            [(CDI_DEVICE_KEY.to_string(), "nvidia.com/gpu=0".to_string())]
                .into_iter()
                .collect(),
        );
        assert!(Filled::of(&other).is_none());
        assert!(!f.is_of("u-1", "another"));
        // The selector names exactly the labels it carries.
        for term in DEVICES_SELECTOR.split(',') {
            let (k, val) = term.split_once('=').unwrap();
            assert_eq!(v["metadata"]["labels"][k], val, "{term}");
        }
        let mut unowned = cm.clone();
        unowned.metadata.owner_references = None;
        assert!(Filled::of(&unowned).is_none());
    }
}

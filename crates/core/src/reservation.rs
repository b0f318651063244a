//! PURE: reservation pods, gpu-share's hold on each GPU it shares on a node shared per GPU.
//!
//! A reservation asks NVIDIA's device plugin for one `nvidia.com/gpu` on its node (so the plugin
//! gives that GPU to no other pod), learns which GPU it got with NVML (`gpu-share reserve`), and
//! writes the GPU's UUID onto itself. Shares on that GPU read the UUID through their ConfigMap.
//! Reservations live in their own namespace ([`NAMESPACE`]), which only gpu-share writes to:
//! the ledger trusts a pod there that names the GPU it reserves ([`ANNOTATION_GPU`]), and no
//! pod elsewhere.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::nvidia::RESOURCE_GPU;

/// The namespace of the reservation pods (Pod Security `restricted`).
pub const NAMESPACE: &str = "gpu-share-reservations";
/// Their ServiceAccount: may read and patch pods, and create events, in [`NAMESPACE`] only.
pub const SERVICE_ACCOUNT: &str = "gpu-share-reserve";
/// Their PriorityClass: above every workload, so a reservation is never preempted for one.
pub const PRIORITY_CLASS: &str = "gpu-share-reservation";
/// On a reservation: the index (gpu-share's per-GPU model) of the GPU it holds.
pub const ANNOTATION_GPU: &str = "gpu-share.io/reserve-gpu";
/// On a reservation: the UUID of the GPU the device plugin gave it, written by the reservation.
pub const ANNOTATION_UUID: &str = "gpu-share.io/gpu-uuid";
/// On a reservation that runs its GPU's MPS daemon (`"true"`): its GPU takes MPS shares only.
pub const ANNOTATION_MPS: &str = "gpu-share.io/reserve-mps";
/// On a time-sliced reservation pod: it writes its GPU's CDI device `gpu-share.io/gpu=<UUID>`
/// ([`GPU_CDI_KIND`]) before it publishes the UUID (`"true"`).
pub const ANNOTATION_CDI_DEVICE: &str = "gpu-share.io/reserve-cdi-device";
/// The CDI kind of the device an MPS reservation writes for its GPU: `gpu-share.io/mps=<UUID>`
/// names the GPU with its MPS daemon's pipe and shared memory (a share's devices ConfigMap
/// holds this name where it would hold the UUID).
pub const MPS_CDI_KIND: &str = "gpu-share.io/mps";
/// The CDI kind of the device a reservation writes for its GPU in the time-sliced per-GPU form:
/// `gpu-share.io/gpu=<UUID>` names the GPU as NVIDIA's own CDI spec on the node describes it,
/// NVIDIA's hooks included, and nothing of gpu-share's.
pub const GPU_CDI_KIND: &str = "gpu-share.io/gpu";
/// The key of an MPS share's devices ConfigMap that holds its pinned device-memory limit, read
/// by its container as the variable of the same name (`0=<MiB>M`).
pub const MPS_PINNED_KEY: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";
/// Where the MPS reservations keep each GPU's pipe, log and shared-memory directories, on the
/// node: `<MPS_ROOT>/gpu-<index>` ([`mps_dir`]). `/run` is a tmpfs on the distributions GPU
/// nodes run, so nothing of it outlives a reboot.
pub const MPS_ROOT: &str = "/run/gpu-share/mps";
/// Where the nodes' CDI specs are; the MPS reservation writes its GPU's device there.
pub const CDI_DIR: &str = "/var/run/cdi";
/// Where NVIDIA's static CDI specs are, besides [`CDI_DIR`] (read only, in the pod at
/// `/host/etc/cdi`).
pub const CDI_STATIC_DIR: &str = "/etc/cdi";
/// [`CDI_STATIC_DIR`] inside the MPS reservation's container.
pub const CDI_STATIC_MOUNT: &str = "/host/etc/cdi";

/// On a reservation that failed: why, in words, written by the reservation.
pub const ANNOTATION_ERROR: &str = "gpu-share.io/reserve-error";
/// Written by the reservation (`--mps`) once its GPU's MPS daemon answers with its defaults set:
/// the daemon's pipe directory on the node. Removed while the daemon is down.
pub const ANNOTATION_MPS_PIPE: &str = "gpu-share.io/mps-pipe";
/// Written by the reservation (`--mps`) while its GPU's MPS daemon is down and being started
/// again (the GPU closed to new contexts meanwhile): why, in words. A daemon that cannot be
/// brought back is a failure ([`ANNOTATION_ERROR`]).
pub const ANNOTATION_MPS_DOWN: &str = "gpu-share.io/mps-down";
/// The label that tells reservations apart (with `app.kubernetes.io/name: gpu-share`).
pub const LABEL_COMPONENT: (&str, &str) = ("app.kubernetes.io/component", "reservation");
/// The label naming a reservation's node (a label value: hashed when the name is not one).
pub const LABEL_NODE: &str = "gpu-share.io/node";

/// The reservation of GPU `gpu` of `node`: the same name for the same GPU, so that two binds
/// (or two extenders) racing to create it meet on `AlreadyExists` instead of reserving twice.
pub fn name(node: &str, gpu: u32) -> String {
    // Node names are DNS subdomains, as pod names are.
    let plain = format!("gpu-share-{node}-gpu-{gpu}");
    if plain.len() <= 253 {
        return plain;
    }
    // A node name too long for a pod name with the prefix: keep its start, add a digest.
    let start = node[..node.len().min(40)].trim_end_matches(['.', '-']);
    format!("gpu-share-{start}-{}-gpu-{gpu}", digest(node))
}

/// A label-value form of a node name: itself when it is one, else a digest.
pub fn node_label(node: &str) -> String {
    if crate::nvidia::is_label_value(node) {
        node.to_string()
    } else {
        format!("h-{}", digest(node))
    }
}

fn digest(s: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, s.as_bytes());
    d.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// What the reservation pod is made of: the image (gpu-share's own), the RuntimeClass that
/// makes the runtime inject the driver (empty: none set), the pod's priority class, and
/// whether a time-sliced reservation writes its GPU's CDI device (the policy's
/// `perGpu.timesliceCdi`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pub image: String,
    pub runtime_class: String,
    pub priority_class: String,
    pub service_account: String,
    pub cdi_device: bool,
}

impl Default for Template {
    fn default() -> Self {
        Template {
            image: String::new(),
            runtime_class: "nvidia".to_string(),
            priority_class: PRIORITY_CLASS.to_string(),
            service_account: SERVICE_ACCOUNT.to_string(),
            cdi_device: false,
        }
    }
}

/// The node directory of the MPS daemon of GPU `gpu` (gpu-share's index): its `pipe`, `log` and
/// `shm` (the daemon's and its clients' `/dev/shm`).
pub fn mps_dir(gpu: u32) -> String {
    format!("{MPS_ROOT}/gpu-{gpu}")
}

/// The reservation pod of GPU `gpu` on `node`. Bound at creation (`nodeName`): gpu-share chose
/// the node, and the GPU on it; kubelet then admits it only if the device plugin has a GPU left.
/// It tolerates every taint (a GPU node's taints are for workloads), restarts never (a failure
/// is handled by gpu-share, which re-points or evicts the shares), and runs as Pod Security's
/// `restricted` level allows. With `mps`, it also runs the GPU's MPS daemon ([`mps_pod`]);
/// else, with the template's `cdi_device`, it writes the GPU's CDI device ([`cdi_device_pod`]).
pub fn pod(node: &str, gpu: u32, mps: bool, t: &Template) -> Value {
    let mut p = plain_pod(node, gpu, t);
    if mps {
        mps_pod(&mut p, gpu);
    } else if t.cdi_device {
        cdi_device_pod(&mut p);
    }
    p
}

/// What a time-sliced reservation that writes its GPU's CDI device `gpu-share.io/gpu=<UUID>`
/// adds: root (the node's CDI directory is root's), with no capability, and the node's CDI
/// directory it writes to and NVIDIA's static one it reads, as host paths. So the
/// reservations' namespace must allow `privileged` pods, as for MPS; the shares need no
/// privilege (the runtime injects the device).
fn cdi_device_pod(p: &mut Value) {
    p["metadata"]["annotations"][ANNOTATION_CDI_DEVICE] = json!("true");
    let spec = &mut p["spec"];
    spec["securityContext"] = json!({"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": false, "seccompProfile": {"type": "RuntimeDefault"}});
    spec["volumes"] = json!(cdi_volumes());
    let c = &mut spec["containers"][0];
    c["args"] = json!(["reserve", "--gpu-device"]);
    c["volumeMounts"] = json!(cdi_mounts());
}

/// The node's CDI directories as host paths: the one a reservation writes its device to, and
/// NVIDIA's static one it reads.
fn cdi_volumes() -> [Value; 2] {
    let host = |path: &str| json!({"path": path, "type": "DirectoryOrCreate"});
    [
        json!({"name": "cdi", "hostPath": host(CDI_DIR)}),
        json!({"name": "static-cdi", "hostPath": host(CDI_STATIC_DIR)}),
    ]
}

fn cdi_mounts() -> [Value; 2] {
    [
        json!({"name": "cdi", "mountPath": CDI_DIR}),
        json!({"name": "static-cdi", "mountPath": CDI_STATIC_MOUNT, "readOnly": true}),
    ]
}

/// What an MPS reservation adds, as NVIDIA's device plugin runs its MPS control daemon: root and
/// privileged (the GPU's compute mode is set through NVML; the daemon's pipe and the CDI spec
/// are the node's), the GPU's compute libraries (the daemon is a driver binary the runtime
/// mounts with them), and four host directories: the GPU's MPS directory, its `shm` as the
/// container's `/dev/shm` (the MPS server, which the daemon spawns here, and its clients share
/// it), the CDI spec directory it writes to, and NVIDIA's static one it reads. So the
/// reservations' namespace must allow `privileged` pods (the `per-gpu-mps` component, or the
/// chart's `perGpu.mps`); the shares themselves need no privilege (the runtime injects their
/// MPS mounts from the CDI spec).
fn mps_pod(p: &mut Value, gpu: u32) {
    let dir = mps_dir(gpu);
    p["metadata"]["annotations"][ANNOTATION_MPS] = json!("true");
    let spec = &mut p["spec"];
    spec["securityContext"] = json!({"runAsUser": 0, "runAsNonRoot": false, "seccompProfile": {"type": "RuntimeDefault"}});
    let host = |path: &str| json!({"path": path, "type": "DirectoryOrCreate"});
    let mut volumes = vec![
        json!({"name": "mps", "hostPath": host(&dir)}),
        json!({"name": "shm", "hostPath": host(&format!("{dir}/shm"))}),
    ];
    volumes.extend(cdi_volumes());
    spec["volumes"] = json!(volumes);
    let c = &mut spec["containers"][0];
    c["args"] = json!(["reserve", "--mps", "--mps-dir", dir]);
    c["securityContext"] = json!({"privileged": true, "readOnlyRootFilesystem": true});
    let mut mounts = vec![
        json!({"name": "mps", "mountPath": dir}),
        json!({"name": "shm", "mountPath": "/dev/shm"}),
    ];
    mounts.extend(cdi_mounts());
    c["volumeMounts"] = json!(mounts);
    if let Some(env) = c["env"].as_array_mut() {
        for e in env.iter_mut() {
            if e["name"] == "NVIDIA_DRIVER_CAPABILITIES" {
                e["value"] = json!("compute,utility");
            }
        }
    }
    c["resources"]["limits"]["cpu"] = json!("500m");
    c["resources"]["limits"]["memory"] = json!("256Mi");
    c["resources"]["requests"]["cpu"] =
        json!(format!("{}m", crate::packing::MPS_RESERVATION.cpu_milli));
    c["resources"]["requests"]["memory"] =
        json!(format!("{}Mi", crate::packing::MPS_RESERVATION.memory_mib));
}

fn plain_pod(node: &str, gpu: u32, t: &Template) -> Value {
    let mut spec = json!({
        "nodeName": node,
        "restartPolicy": "Never",
        "priorityClassName": t.priority_class,
        "serviceAccountName": t.service_account,
        "terminationGracePeriodSeconds": 5,
        "enableServiceLinks": false,
        "tolerations": [{"operator": "Exists"}],
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": 65532,
            "runAsGroup": 65532,
            "seccompProfile": {"type": "RuntimeDefault"}
        },
        "containers": [{
            "name": "reserve",
            "image": t.image,
            "args": ["reserve"],
            "env": [
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                // NVML only: no compute libraries are needed to read a UUID.
                {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"}
            ],
            "resources": {
                "limits": {RESOURCE_GPU: "1", "cpu": "50m", "memory": "32Mi"},
                "requests": {
                    RESOURCE_GPU: "1",
                    "cpu": format!("{}m", crate::packing::PLAIN_RESERVATION.cpu_milli),
                    "memory": format!("{}Mi", crate::packing::PLAIN_RESERVATION.memory_mib)
                }
            },
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "capabilities": {"drop": ["ALL"]}
            }
        }]
    });
    if !t.runtime_class.is_empty() {
        spec["runtimeClassName"] = json!(t.runtime_class);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name(node, gpu),
            "namespace": NAMESPACE,
            "labels": {
                "app.kubernetes.io/name": "gpu-share",
                LABEL_COMPONENT.0: LABEL_COMPONENT.1,
                LABEL_NODE: node_label(node),
            },
            "annotations": {ANNOTATION_GPU: gpu.to_string()},
        },
        "spec": spec,
    })
}

/// What a pod reserves, when it is a reservation (in [`NAMESPACE`], with [`ANNOTATION_GPU`]),
/// as the packing holds it: its GPU, whether it runs the GPU's MPS daemon ([`ANNOTATION_MPS`]),
/// and whether it writes the GPU's CDI device ([`ANNOTATION_CDI_DEVICE`]).
pub fn reserved_gpu(
    namespace: &str,
    annotations: Option<&BTreeMap<String, String>>,
) -> Option<crate::packing::GpuDemand> {
    if namespace != NAMESPACE {
        return None;
    }
    let annotations = annotations?;
    let gpu = annotations.get(ANNOTATION_GPU)?.trim().parse().ok()?;
    let says = |k: &str| annotations.get(k).map(|v| v.trim()) == Some("true");
    Some(crate::packing::GpuDemand::ReservationPod {
        gpu,
        mps: says(ANNOTATION_MPS),
        cdi_device: says(ANNOTATION_CDI_DEVICE),
    })
}

const HINT: &str = "the device plugin gives a reservation one nvidia.com/gpu, and the nvidia runtime \
                    (Container Toolkit) makes exactly that GPU visible to it";

/// Why a reservation holds no GPU it can name, in words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoGpu {
    #[error("NVML failed: {0}; {HINT}")]
    Nvml(String),
    #[error("NVML sees {} GPUs ({}), where exactly one was expected; {HINT}", .0.len(), .0.join(", "))]
    NotOne(Vec<String>),
    #[error("NVML gave {0:?}, which is not a GPU UUID (GPU-...)")]
    NotAUuid(String),
}

/// What the reservation agent found (the UUIDs NVML lists, or why NVML failed): the one GPU's
/// UUID, or why not.
pub fn one_gpu<E: std::fmt::Display>(found: Result<Vec<String>, E>) -> Result<String, NoGpu> {
    match found {
        Err(why) => Err(NoGpu::Nvml(why.to_string())),
        Ok(uuids) if uuids.len() == 1 => {
            let uuid = uuids.into_iter().next().unwrap_or_default();
            if is_gpu_uuid(&uuid) {
                Ok(uuid)
            } else {
                Err(NoGpu::NotAUuid(uuid))
            }
        }
        Ok(uuids) => Err(NoGpu::NotOne(uuids)),
    }
}

/// Whether `s` reads as an NVIDIA GPU UUID (`GPU-` and hex digits with dashes), which the
/// Container Toolkit takes in `NVIDIA_VISIBLE_DEVICES`. MIG devices (`MIG-...`) are not GPUs.
pub fn is_gpu_uuid(s: &str) -> bool {
    s.strip_prefix("GPU-").is_some_and(|rest| {
        !rest.is_empty()
            && rest.len() <= 64
            && rest.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_one_per_gpu_and_valid() {
        assert_eq!(name("gpu-node-3", 5), "gpu-share-gpu-node-3-gpu-5");
        assert_ne!(name("a", 1), name("a", 2));
        let long = format!("{}.example.com", "n".repeat(240));
        let n = name(&long, 0);
        assert!(n.len() <= 253 && n.ends_with("-gpu-0"), "{n}");
        assert_ne!(name(&long, 0), name(&format!("{long}x"), 0));
        assert_eq!(
            node_label("ip-10-0-1-2.ec2.internal"),
            "ip-10-0-1-2.ec2.internal"
        );
        assert!(node_label(&long).starts_with("h-"));
    }

    #[test]
    fn the_pod_holds_one_gpu_on_its_node_at_the_restricted_level() {
        let t = Template {
            image: "ghcr.io/x/gpu-share:1".into(),
            ..Template::default()
        };
        let p = pod("n1", 3, false, &t);
        assert_eq!(p["spec"]["nodeName"], "n1");
        assert_eq!(p["metadata"]["namespace"], NAMESPACE);
        assert_eq!(p["metadata"]["annotations"][ANNOTATION_GPU], "3");
        let c = &p["spec"]["containers"][0];
        assert_eq!(c["resources"]["limits"][RESOURCE_GPU], "1");
        assert_eq!(c["args"], json!(["reserve"]));
        assert_eq!(p["spec"]["runtimeClassName"], "nvidia");
        assert_eq!(p["spec"]["securityContext"]["runAsNonRoot"], true);
        assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
        // It parses as a Pod, and the ledger knows it for a reservation.
        let typed: k8s_openapi::api::core::v1::Pod = serde_json::from_value(p).unwrap();
        assert_eq!(
            reserved_gpu(NAMESPACE, typed.metadata.annotations.as_ref()),
            Some(crate::packing::GpuDemand::ReservationPod {
                gpu: 3,
                mps: false,
                cdi_device: false
            })
        );
        assert_eq!(
            reserved_gpu("default", typed.metadata.annotations.as_ref()),
            None
        );
        let none = Template {
            runtime_class: String::new(),
            ..t
        };
        assert!(
            pod("n1", 0, false, &none)["spec"]
                .get("runtimeClassName")
                .is_none()
        );
    }

    /// An MPS reservation runs the daemon as NVIDIA's device plugin runs its own (root,
    /// privileged, the compute libraries), with the GPU's MPS directory, its shared memory as
    /// the container's /dev/shm, and the node's CDI directories; the ledger reads its class.
    #[test]
    fn an_mps_reservation_mounts_its_gpus_directories_and_says_its_class() {
        let t = Template {
            image: "ghcr.io/x/gpu-share:1".into(),
            ..Template::default()
        };
        let p = pod("n1", 2, true, &t);
        assert_eq!(p["metadata"]["annotations"][ANNOTATION_MPS], "true");
        let c = &p["spec"]["containers"][0];
        assert_eq!(
            c["args"],
            json!(["reserve", "--mps", "--mps-dir", "/run/gpu-share/mps/gpu-2"])
        );
        assert_eq!(c["securityContext"]["privileged"], true);
        assert_eq!(p["spec"]["securityContext"]["runAsUser"], 0);
        let mounts: Vec<(String, String)> = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["name"].as_str().unwrap().into(),
                    m["mountPath"].as_str().unwrap().into(),
                )
            })
            .collect();
        let host = |name: &str| {
            p["spec"]["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == name)
                .unwrap()["hostPath"]["path"]
                .as_str()
                .unwrap()
                .to_string()
        };
        for (name, path) in &mounts {
            match name.as_str() {
                "mps" => assert_eq!(
                    (host(name).as_str(), path.as_str()),
                    ("/run/gpu-share/mps/gpu-2", "/run/gpu-share/mps/gpu-2")
                ),
                "shm" => assert_eq!(
                    (host(name).as_str(), path.as_str()),
                    ("/run/gpu-share/mps/gpu-2/shm", "/dev/shm")
                ),
                "cdi" => assert_eq!((host(name).as_str(), path.as_str()), (CDI_DIR, CDI_DIR)),
                "static-cdi" => assert_eq!(
                    (host(name).as_str(), path.as_str()),
                    (CDI_STATIC_DIR, CDI_STATIC_MOUNT)
                ),
                other => panic!("{other}"),
            }
        }
        assert_eq!(mounts.len(), 4);
        assert!(c["env"].to_string().contains("compute,utility"));
        let typed: k8s_openapi::api::core::v1::Pod = serde_json::from_value(p).unwrap();
        assert_eq!(
            reserved_gpu(NAMESPACE, typed.metadata.annotations.as_ref()),
            Some(crate::packing::GpuDemand::ReservationPod {
                gpu: 2,
                mps: true,
                cdi_device: false
            })
        );
    }

    #[test]
    fn a_reservation_that_writes_its_gpus_cdi_device_mounts_the_cdi_directories_only() {
        let t = Template {
            image: "ghcr.io/x/gpu-share:1".into(),
            cdi_device: true,
            ..Template::default()
        };
        let p = pod("n1", 2, false, &t);
        assert_eq!(p["metadata"]["annotations"][ANNOTATION_CDI_DEVICE], "true");
        assert!(p["metadata"]["annotations"][ANNOTATION_MPS].is_null());
        let c = &p["spec"]["containers"][0];
        assert_eq!(c["args"], json!(["reserve", "--gpu-device"]));
        // Root to write the node's CDI directory, but no privilege and no capability.
        assert_eq!(p["spec"]["securityContext"]["runAsUser"], 0);
        assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
        assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
        assert!(c["securityContext"]["privileged"].is_null());
        assert_eq!(c["env"][2]["value"], "utility");
        assert_eq!(
            p["spec"]["volumes"],
            json!([
                {"name": "cdi", "hostPath": {"path": CDI_DIR, "type": "DirectoryOrCreate"}},
                {"name": "static-cdi", "hostPath": {"path": CDI_STATIC_DIR, "type": "DirectoryOrCreate"}},
            ])
        );
        assert_eq!(
            c["volumeMounts"],
            json!([
                {"name": "cdi", "mountPath": CDI_DIR},
                {"name": "static-cdi", "mountPath": CDI_STATIC_MOUNT, "readOnly": true},
            ])
        );
        // An MPS reservation writes its own device whatever the template says.
        let m = pod("n1", 2, true, &t);
        assert!(m["metadata"]["annotations"][ANNOTATION_CDI_DEVICE].is_null());
        // Without the setting, the plain reservation: restricted, no host path.
        let plain = pod("n1", 2, false, &Template::default());
        assert!(plain["spec"]["volumes"].is_null());
        assert_eq!(plain["spec"]["securityContext"]["runAsNonRoot"], true);
        let typed: k8s_openapi::api::core::v1::Pod = serde_json::from_value(p).unwrap();
        assert_eq!(
            reserved_gpu(NAMESPACE, typed.metadata.annotations.as_ref()),
            Some(crate::packing::GpuDemand::ReservationPod {
                gpu: 2,
                mps: false,
                cdi_device: true
            })
        );
    }

    /// The packing counts a reservation's requests before it creates one: they are what the
    /// ledger reads from the pod, for each kind of reservation.
    #[test]
    fn the_requests_the_packing_counts_are_the_pods() {
        for (mps, cdi_device) in [(false, false), (false, true), (true, false)] {
            let t = Template {
                image: "gpu-share".into(),
                cdi_device,
                ..Template::default()
            };
            let created: k8s_openapi::api::core::v1::Pod =
                serde_json::from_value(pod("n1", 0, mps, &t)).unwrap();
            let held = crate::ledger::observed_holding(&created)
                .unwrap()
                .expect("a reservation holds its GPU");
            // The ledger reads a live pod's CPU (its memory request is counted in a trace's
            // replay only); the container asks both.
            let want = crate::packing::reservation_requests(mps);
            assert_eq!(
                held.demand.cpu_milli, want.cpu_milli,
                "mps {mps}, cdi device {cdi_device}"
            );
            let asked = &created.spec.as_ref().unwrap().containers[0]
                .resources
                .as_ref()
                .unwrap()
                .requests
                .as_ref()
                .unwrap()["memory"];
            assert_eq!(asked.0, format!("{}Mi", want.memory_mib));
        }
    }

    #[test]
    fn exactly_one_gpu_or_words() {
        let uuid = "GPU-5b3c7e0a-1f2d-4c8b-9e6a-0d1c2b3a4f5e";
        let ok = Ok::<_, NoGpu>(vec![uuid.into()]);
        assert_eq!(one_gpu(ok), Ok(uuid.to_string()));
        let none = Ok::<Vec<String>, NoGpu>(vec![]);
        let e = one_gpu(none).unwrap_err().to_string();
        assert!(
            e.contains("sees 0 GPUs") && e.contains("exactly one"),
            "{e}"
        );
        let two = Ok::<Vec<String>, NoGpu>(vec![uuid.into(), "GPU-1".into()]);
        let e = one_gpu(two).unwrap_err().to_string();
        assert!(e.contains("sees 2 GPUs"), "{e}");
        let e = one_gpu(Err("libnvidia-ml.so.1: cannot open"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("NVML failed: libnvidia-ml.so.1"), "{e}");
        let mig = Ok::<Vec<String>, NoGpu>(vec!["MIG-1234".into()]);
        assert_eq!(one_gpu(mig), Err(NoGpu::NotAUuid("MIG-1234".into())));
    }
}

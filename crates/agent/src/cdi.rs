//! PURE: the CDI devices a reservation writes for its GPU: `gpu-share.io/mps=<UUID>` for an MPS
//! reservation, `gpu-share.io/gpu=<UUID>` for a time-sliced one.
//!
//! A share in per-GPU form names it (alone) in `NVIDIA_VISIBLE_DEVICES`, and the `nvidia` runtime
//! in CDI or auto mode injects it: the GPU as NVIDIA's own CDI spec on the node describes it
//! (device nodes, driver libraries, NVIDIA's hooks, among them the Container Toolkit's
//! `apply-cuda-memory-limits` where the toolkit has it), plus the GPU's MPS pipe, its `/dev/shm`
//! (MPS clients share their server's) and `CUDA_MPS_PIPE_DIRECTORY`. So the share needs no
//! hostPath and no hostIPC: it runs under Pod Security's `restricted` level.
//!
//! Why one self-contained device, not `runtime.nvidia.com/gpu=<UUID>` beside a device of gpu-share's
//! own: the toolkit refuses its generated name together with any other CDI name
//! (`internal/modifier/cdi.go`, v1.17 to v1.20), and the container does not start. Why copy
//! NVIDIA's edits rather than discover the driver's files: NVIDIA's tooling (`nvidia-ctk cdi
//! generate`, the device plugin's CDI spec, the GPU Operator's) already wrote them for this
//! node's driver and toolkit; gpu-share reads them, and a node with none fails the reservation
//! in words.
//!
//! A name that no spec resolves fails the container's creation ("unresolvable CDI devices"):
//! a share never starts without its daemon's device.
//!
//! The time-sliced device, `gpu-share.io/gpu=<UUID>` ([`gpu_spec`]), is the same copy of NVIDIA's
//! edits for the GPU with nothing added: no daemon, no pipe. A share that names it gets the GPU
//! as NVIDIA's spec describes it, NVIDIA's hooks included: the toolkit's
//! `apply-cuda-memory-limits`, which NVIDIA's spec attaches to each GPU's device (with the GPU's
//! UUID), where the toolkit writes it. A name of gpu-share's kind, one per GPU whatever NVIDIA's
//! tooling on the node called it (by index in `nvidia-ctk cdi generate`'s spec, by UUID under a
//! vendor of its own in the device plugin's).

use serde_json::{Value, json};

use super::model::{GPU_CDI_KIND, MPS_CDI_KIND};

/// The oldest `cdiVersion` the device is written in: mounts with options (0.4.0) and device
/// names of any form (0.5.0); every toolkit from v1.17 reads it.
pub const MIN_CDI_VERSION: &str = "0.5.0";

/// The keys of `containerEdits` that add up (NVIDIA's spec-wide edits, then the device's), spelled
/// as the CDI spec spells them: the toolkit (from v1.19) writes `additionalGids` for a device
/// node not open to all (`/dev/dri/renderD128`, group `render`), and the container needs the
/// group to open it.
const LISTS: [&str; 5] = ["env", "deviceNodes", "mounts", "hooks", "additionalGids"];

/// The kinds of gpu-share's own devices, never read back as NVIDIA's.
const OWN_KINDS: [&str; 2] = [MPS_CDI_KIND, GPU_CDI_KIND];

/// Why no device could be written, in words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CdiError {
    #[error(
        "no NVIDIA CDI spec on the node describes GPU {uuid}{minor} (read: {read}); the device gpu-share writes for a share is made from NVIDIA's own: turn CDI on in the device plugin or the GPU Operator (the default from GPU Operator 25.10), or run `nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml`",
        minor = .minor.map(|m| format!(" (/dev/nvidia{m})")).unwrap_or_default()
    )]
    NoSpec {
        uuid: String,
        minor: Option<u32>,
        read: String,
    },
}

/// The file the MPS device is written to in the node's CDI directory: one per GPU, so that a
/// later reservation of the GPU replaces it (two files defining one device make it unresolvable).
pub fn file_name(uuid: &str) -> String {
    format!("gpu-share.io-mps-{uuid}.json")
}

/// The file the time-sliced device is written to, beside the MPS one ([`file_name`]): one per
/// GPU too, and never the MPS device's file (a GPU's reservation may change form).
pub fn gpu_file_name(uuid: &str) -> String {
    format!("gpu-share.io-gpu-{uuid}.json")
}

/// NVIDIA's edits for the GPU with `uuid` (device node `/dev/nvidia<minor>`), from the specs
/// read on the node (`(file, spec)`): the first device named by the UUID, or whose device nodes
/// hold the GPU's, in a spec of an NVIDIA kind (gpu-share's own devices are copies, never read
/// back); its spec-wide edits first. Also the spec's `cdiVersion`.
pub fn gpu_edits(
    specs: &[(String, Value)],
    uuid: &str,
    minor: Option<u32>,
) -> Result<(String, Value), CdiError> {
    let node = minor.map(|m| format!("/dev/nvidia{m}"));
    for (_, spec) in specs {
        let kind = spec["kind"].as_str().unwrap_or_default();
        let vendor = kind.split('/').next().unwrap_or_default();
        if OWN_KINDS.contains(&kind) || !vendor.split('.').any(|p| p == "nvidia") {
            continue;
        }
        let devices = spec["devices"].as_array().into_iter().flatten();
        let found = devices.clone().find(|d| d["name"] == uuid).or_else(|| {
            let node = node.as_deref()?;
            devices.clone().find(|d| {
                d["containerEdits"]["deviceNodes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|n| n["path"] == node)
            })
        });
        if let Some(device) = found {
            let mut edits = json!({});
            merge(&mut edits, &spec["containerEdits"]);
            merge(&mut edits, &device["containerEdits"]);
            let version = spec["cdiVersion"].as_str().unwrap_or(MIN_CDI_VERSION);
            return Ok((newer(version, MIN_CDI_VERSION).to_string(), edits));
        }
    }
    Err(CdiError::NoSpec {
        uuid: uuid.to_string(),
        minor,
        read: if specs.is_empty() {
            "no spec files".to_string()
        } else {
            specs
                .iter()
                .map(|(f, _)| f.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        },
    })
}

/// The spec of device `gpu-share.io/mps=<uuid>`: NVIDIA's `edits` for the GPU, the daemon's
/// `pipe` directory (mounted where it is on the node) and `shm` directory (as `/dev/shm`,
/// replacing the container's own), and `CUDA_MPS_PIPE_DIRECTORY`.
pub fn mps_spec(version: &str, edits: &Value, uuid: &str, pipe: &str, shm: &str) -> Value {
    let mut all = json!({});
    merge(&mut all, edits);
    let options = json!(["rbind", "rw", "nosuid", "nodev"]);
    let ours = json!({
        "env": [format!("CUDA_MPS_PIPE_DIRECTORY={pipe}")],
        "mounts": [
            {"hostPath": pipe, "containerPath": pipe, "options": options},
            {"hostPath": shm, "containerPath": "/dev/shm", "options": options},
        ],
    });
    // NVIDIA's edits never set these; were one to, gpu-share's wins.
    if let Some(mounts) = all.get_mut("mounts").and_then(Value::as_array_mut) {
        mounts.retain(|m| m["containerPath"] != "/dev/shm" && m["containerPath"] != pipe);
    }
    if let Some(env) = all.get_mut("env").and_then(Value::as_array_mut) {
        env.retain(|e| {
            !e.as_str()
                .is_some_and(|e| e.starts_with("CUDA_MPS_PIPE_DIRECTORY="))
        });
    }
    merge(&mut all, &ours);
    json!({
        "cdiVersion": version,
        "kind": MPS_CDI_KIND,
        "devices": [{"name": uuid, "containerEdits": all}],
    })
}

/// The spec of device `gpu-share.io/gpu=<uuid>`: NVIDIA's `edits` for the GPU ([`gpu_edits`]), as
/// they are. `version` is the one [`gpu_edits`] gives (NVIDIA's spec's, at least
/// [`MIN_CDI_VERSION`]): the edits need no newer one than the spec they come from.
pub fn gpu_spec(version: &str, edits: &Value, uuid: &str) -> Value {
    let mut all = json!({});
    merge(&mut all, edits);
    json!({
        "cdiVersion": version,
        "kind": GPU_CDI_KIND,
        "devices": [{"name": uuid, "containerEdits": all}],
    })
}

/// Appends `from`'s edits to `into`'s, list by list.
fn merge(into: &mut Value, from: &Value) {
    for key in LISTS {
        let Some(add) = from.get(key).and_then(Value::as_array) else {
            continue;
        };
        if add.is_empty() {
            continue;
        }
        let list = into
            .as_object_mut()
            .map(|o| o.entry(key).or_insert_with(|| json!([])));
        if let Some(Value::Array(list)) = list {
            list.extend(add.iter().cloned());
        }
    }
}

/// The later of two `major.minor.patch` versions.
fn newer<'a>(a: &'a str, b: &'a str) -> &'a str {
    let parse = |v: &str| -> Vec<u64> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    if parse(a) >= parse(b) { a } else { b }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: &str = "GPU-5b3c7e0a-1f2d-4c8b-9e6a-0d1c2b3a4f5e";

    /// As `nvidia-ctk cdi generate` writes it (index names), trimmed.
    fn nvidia_spec() -> Value {
        json!({
            "cdiVersion": "0.5.0",
            "kind": "nvidia.com/gpu",
            "devices": [
                {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}},
                {"name": "1", "containerEdits": {
                    "deviceNodes": [{"path": "/dev/nvidia1"}],
                    "hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook",
                               "args": ["nvidia-cdi-hook", "apply-cuda-memory-limits"]}]}},
                {"name": "all", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}, {"path": "/dev/nvidia1"}]}}
            ],
            "containerEdits": {
                "env": ["NVIDIA_VISIBLE_DEVICES=void"],
                "deviceNodes": [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}],
                "mounts": [{"hostPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",
                            "containerPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",
                            "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"]}]
            }
        })
    }

    #[test]
    fn the_gpus_edits_are_nvidias_spec_wide_ones_then_its_own() {
        let specs = vec![("/var/run/cdi/nvidia.yaml".to_string(), nvidia_spec())];
        let (version, edits) = gpu_edits(&specs, UUID, Some(1)).unwrap();
        assert_eq!(version, "0.5.0");
        let nodes: Vec<&str> = edits["deviceNodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["path"].as_str().unwrap())
            .collect();
        assert_eq!(nodes, ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia1"]);
        assert_eq!(edits["hooks"][0]["args"][1], "apply-cuda-memory-limits");
        // By name first (the device plugin's specs name GPUs by UUID).
        let mut by_name = nvidia_spec();
        by_name["kind"] = json!("k8s.device-plugin.nvidia.com/gpu");
        by_name["devices"][0]["name"] = json!(UUID);
        let (_, edits) = gpu_edits(&[("dp.json".into(), by_name)], UUID, Some(1)).unwrap();
        assert_eq!(edits["deviceNodes"][2]["path"], "/dev/nvidia0");
        // A newer spec keeps its version; an older one is raised to the oldest gpu-share writes.
        let mut newer = nvidia_spec();
        newer["cdiVersion"] = json!("0.8.0");
        assert_eq!(
            gpu_edits(&[("n".into(), newer)], UUID, Some(0)).unwrap().0,
            "0.8.0"
        );
        let mut older = nvidia_spec();
        older["cdiVersion"] = json!("0.3.0");
        assert_eq!(
            gpu_edits(&[("n".into(), older)], UUID, Some(0)).unwrap().0,
            "0.5.0"
        );
    }

    #[test]
    fn no_nvidia_spec_for_the_gpu_fails_in_words() {
        let specs = vec![("/var/run/cdi/nvidia.yaml".to_string(), nvidia_spec())];
        let e = gpu_edits(&specs, UUID, Some(7)).unwrap_err().to_string();
        assert!(
            e.contains(UUID) && e.contains("/dev/nvidia7") && e.contains("nvidia-ctk cdi generate"),
            "{e}"
        );
        // A spec of another vendor, or gpu-share's own, is not NVIDIA's.
        let mut other = nvidia_spec();
        other["kind"] = json!("example.com/gpu");
        let mut own = nvidia_spec();
        own["kind"] = json!(MPS_CDI_KIND);
        let mut own_gpu = nvidia_spec();
        own_gpu["kind"] = json!(GPU_CDI_KIND);
        assert!(
            gpu_edits(
                &[
                    ("o".into(), other),
                    ("g".into(), own),
                    ("t".into(), own_gpu)
                ],
                UUID,
                Some(1)
            )
            .is_err()
        );
        assert!(
            gpu_edits(&[], UUID, None)
                .unwrap_err()
                .to_string()
                .contains("no spec files")
        );
    }

    #[test]
    fn the_device_adds_the_pipe_the_shared_memory_and_the_variable() {
        let specs = vec![("n".to_string(), nvidia_spec())];
        let (version, edits) = gpu_edits(&specs, UUID, Some(1)).unwrap();
        let pipe = "/run/gpu-share/mps/gpu-1/pipe";
        let spec = mps_spec(&version, &edits, UUID, pipe, "/run/gpu-share/mps/gpu-1/shm");
        assert_eq!(spec["kind"], "gpu-share.io/mps");
        assert_eq!(spec["devices"][0]["name"], UUID);
        let e = &spec["devices"][0]["containerEdits"];
        let env: Vec<&str> = e["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert!(env.contains(&"CUDA_MPS_PIPE_DIRECTORY=/run/gpu-share/mps/gpu-1/pipe"));
        let mounts = e["mounts"].as_array().unwrap();
        let shm = mounts
            .iter()
            .find(|m| m["containerPath"] == "/dev/shm")
            .unwrap();
        assert_eq!(shm["hostPath"], "/run/gpu-share/mps/gpu-1/shm");
        assert!(mounts.iter().any(|m| m["hostPath"] == pipe));
        // NVIDIA's edits are all there: the GPU, the driver's files, the toolkit's hook.
        assert_eq!(e["deviceNodes"].as_array().unwrap().len(), 3);
        assert_eq!(e["hooks"][0]["args"][1], "apply-cuda-memory-limits");
        assert_eq!(
            file_name(UUID),
            "gpu-share.io-mps-GPU-5b3c7e0a-1f2d-4c8b-9e6a-0d1c2b3a4f5e.json"
        );
    }

    #[test]
    fn gpu_shares_own_devices_are_never_read_back_as_nvidias() {
        // gpu-share's devices come first in the node's directory listing; NVIDIA's after.
        let mut ours = json!({
            "cdiVersion": "0.5.0",
            "devices": [{"name": UUID, "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia9"}]}}],
        });
        let mut specs = Vec::new();
        for kind in [MPS_CDI_KIND, GPU_CDI_KIND] {
            ours["kind"] = json!(kind);
            specs.push((format!("{kind}.json"), ours.clone()));
        }
        specs.push(("nvidia.yaml".to_string(), nvidia_spec()));
        let (_, edits) = gpu_edits(&specs, UUID, Some(1)).unwrap();
        assert!(
            edits["deviceNodes"]
                .as_array()
                .unwrap()
                .iter()
                .all(|n| n["path"] != "/dev/nvidia9"),
            "{edits}"
        );
    }

    #[test]
    fn the_time_sliced_device_is_nvidias_edits_and_nothing_else() {
        let specs = vec![("n".to_string(), nvidia_spec())];
        let (version, edits) = gpu_edits(&specs, UUID, Some(1)).unwrap();
        let spec = gpu_spec(&version, &edits, UUID);
        assert_eq!(spec["cdiVersion"], "0.5.0");
        assert_eq!(spec["kind"], "gpu-share.io/gpu");
        assert_eq!(spec["devices"].as_array().unwrap().len(), 1);
        assert_eq!(spec["devices"][0]["name"], UUID);
        let e = &spec["devices"][0]["containerEdits"];
        assert_eq!(e, &edits);
        // The toolkit's hook is carried over; nothing of MPS is added.
        assert_eq!(e["hooks"][0]["args"][1], "apply-cuda-memory-limits");
        assert!(
            !e.to_string().contains("CUDA_MPS") && !e.to_string().contains("/dev/shm"),
            "{e}"
        );
        assert_eq!(
            gpu_file_name(UUID),
            "gpu-share.io-gpu-GPU-5b3c7e0a-1f2d-4c8b-9e6a-0d1c2b3a4f5e.json"
        );
        assert_ne!(gpu_file_name(UUID), file_name(UUID));
    }

    #[test]
    fn additional_groups_are_carried_as_the_cdi_spec_spells_them() {
        let mut spec = nvidia_spec();
        spec["cdiVersion"] = json!("0.7.0");
        spec["devices"][1]["containerEdits"]["deviceNodes"]
            .as_array_mut()
            .unwrap()
            .push(json!({"path": "/dev/dri/renderD129", "fileMode": 432, "gid": 992}));
        spec["devices"][1]["containerEdits"]["additionalGids"] = json!([992]);
        let (version, edits) = gpu_edits(&[("n".into(), spec)], UUID, Some(1)).unwrap();
        assert_eq!(version, "0.7.0");
        assert_eq!(edits["additionalGids"], json!([992]));
        for spec in [
            gpu_spec(&version, &edits, UUID),
            mps_spec(&version, &edits, UUID, "/p", "/s"),
        ] {
            assert_eq!(
                spec["devices"][0]["containerEdits"]["additionalGids"],
                json!([992])
            );
        }
    }
}

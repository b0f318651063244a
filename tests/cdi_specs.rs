//! The CDI devices a reservation writes (`gpu-share.io/mps=<UUID>`, `gpu-share.io/gpu=<UUID>`),
//! computed with the crate's own functions from NVIDIA's spec forms and compared with the files a
//! node's `/var/run/cdi` would hold, kept in `tests/fixtures/cdi/written/<case>/`. The Go test in
//! `tests/cdi/` loads those files, beside NVIDIA's, through the CDI library containerd, CRI-O and
//! NVIDIA's toolkit share. `GPU_SHARE_UPDATE_GOLDEN=1` rewrites them (then run the Go test).
//!
//! NVIDIA's forms (`tests/fixtures/cdi/nvidia/`) describe one node, two H100 GPUs (driver
//! 580.95.05; `/dev/nvidia0` with `/dev/dri/card1` and `renderD128`, `/dev/nvidia1` with `card2`
//! and `renderD129`), each as NVIDIA's tooling writes it (shaped from NVIDIA's sources, trimmed
//! to a representative set of driver files):
//! - `nvidia.yaml`: `nvidia-ctk cdi generate --device-name-strategy=index` of toolkit v1.17.8:
//!   kind `nvidia.com/gpu`, GPUs named by index, and `all`; device nodes by path alone; spec-wide
//!   control nodes, driver files and the `create-symlinks`, `enable-cuda-compat` and
//!   `update-ldcache` hooks through `/usr/bin/nvidia-cdi-hook`; per GPU its DRM links and `chmod`.
//! - `k8s.device-plugin.nvidia.com-gpu.json`: the device plugin's spec in its CDI strategy (its
//!   `internal/cdi`, on the toolkit's library of v1.20): kind `k8s.device-plugin.nvidia.com/gpu`,
//!   GPUs named by UUID, no `all`, one line of JSON as the CDI library writes it; device nodes with
//!   `hostPath` and the numbers, mode and group read from the node, `additionalGids` for the DRM
//!   nodes (so `cdiVersion` 0.7.0); hooks through `/usr/bin/nvidia-ctk hook`.
//! - `nvidia-memory-limits.yaml`: `nvidia-ctk cdi generate` of a toolkit with the memory-limit
//!   hook (v1.20.1): GPUs named by index and by UUID, and `all`; each GPU's device carries
//!   `nvidia-cdi-hook apply-cuda-memory-limits --driver-root "" --gpu-id <UUID>` (`createRuntime`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use gpu_share::reservation::{GPU_CDI_KIND, MPS_CDI_KIND, mps_dir};
use gpu_share_agent::cdi::{self, CdiError};
use serde_json::Value;

/// GPU 0 and GPU 1 of the node NVIDIA's fixtures describe.
const UUIDS: [&str; 2] = [
    "GPU-4b2e9d1c-7a35-4f08-b6d2-91e0c3a8f754",
    "GPU-a7c01f6e-2d94-4b3a-8e51-6f9d2b0c4e18",
];

/// One reservation's devices: NVIDIA's spec on the node, the GPU, and the minor number NVML gives.
struct Case {
    /// The folder of its written files, under `written/`.
    dir: &'static str,
    nvidia: &'static str,
    gpu: usize,
    minor: Option<u32>,
}

const CASES: [Case; 3] = [
    // Named by index only: the GPU is found by its device node.
    Case {
        dir: "nvidia-ctk",
        nvidia: "nvidia.yaml",
        gpu: 1,
        minor: Some(1),
    },
    // Named by UUID: found by name, the minor number unused.
    Case {
        dir: "device-plugin",
        nvidia: "k8s.device-plugin.nvidia.com-gpu.json",
        gpu: 0,
        minor: None,
    },
    // Named both ways, with the memory-limit hook: found by name.
    Case {
        dir: "memory-limits",
        nvidia: "nvidia-memory-limits.yaml",
        gpu: 1,
        minor: Some(1),
    },
];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cdi")
}

/// NVIDIA's spec `name`, read as the reservation reads the node's (`(path, spec)`).
fn nvidia_spec(name: &str) -> (String, Value) {
    let path = fixtures().join("nvidia").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let spec = if name.ends_with(".json") {
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    } else {
        serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    (format!("/var/run/cdi/{name}"), spec)
}

/// The files the case's reservation writes: (file name, spec).
fn written(case: &Case) -> Vec<(String, Value)> {
    let uuid = UUIDS[case.gpu];
    let specs = vec![nvidia_spec(case.nvidia)];
    let (version, edits) =
        cdi::gpu_edits(&specs, uuid, case.minor).unwrap_or_else(|e| panic!("{}: {e}", case.dir));
    let dir = mps_dir(case.gpu as u32);
    let mps = cdi::mps_spec(
        &version,
        &edits,
        uuid,
        &format!("{dir}/pipe"),
        &format!("{dir}/shm"),
    );
    vec![
        (cdi::file_name(uuid), mps),
        (
            cdi::gpu_file_name(uuid),
            cdi::gpu_spec(&version, &edits, uuid),
        ),
    ]
}

/// The device's edits in a spec gpu-share wrote (one device, named by the UUID).
fn device_edits<'a>(spec: &'a Value, uuid: &str) -> &'a Value {
    let devices = spec["devices"].as_array().expect("devices");
    assert_eq!(devices.len(), 1, "one device per file: {spec}");
    assert_eq!(devices[0]["name"], uuid);
    &devices[0]["containerEdits"]
}

fn strings<'a>(v: &'a Value, key: &str) -> Vec<&'a str> {
    v[key]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

fn node_paths(edits: &Value) -> Vec<&str> {
    edits["deviceNodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n["path"].as_str())
        .collect()
}

/// The hooks whose arguments hold `name` (an `nvidia-cdi-hook` subcommand).
fn hooks_named<'a>(edits: &'a Value, name: &str) -> Vec<&'a Value> {
    edits["hooks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|h| strings(h, "args").contains(&name))
        .collect()
}

#[test]
fn each_device_is_its_gpu_as_nvidia_describes_it() {
    for case in &CASES {
        let uuid = UUIDS[case.gpu];
        let other = UUIDS[1 - case.gpu];
        let files = written(case);
        let (nvidia_file, nvidia) = nvidia_spec(case.nvidia);
        for (file, spec) in &files {
            let what = format!("{} {file}", case.dir);
            // NVIDIA's version, never below the oldest gpu-share writes.
            let want = if nvidia["cdiVersion"] == "0.7.0" {
                "0.7.0"
            } else {
                cdi::MIN_CDI_VERSION
            };
            assert_eq!(spec["cdiVersion"], want, "{what}");
            let e = device_edits(spec, uuid);
            let nodes = node_paths(e);
            // NVIDIA's spec-wide control nodes, then the GPU's own: its node and its DRM nodes.
            let own = format!("/dev/nvidia{}", case.gpu);
            let foreign = format!("/dev/nvidia{}", 1 - case.gpu);
            for n in [
                "/dev/nvidiactl",
                "/dev/nvidia-uvm",
                "/dev/nvidia-uvm-tools",
                &own,
            ] {
                assert!(nodes.contains(&n), "{what}: {n} missing from {nodes:?}");
            }
            assert!(!nodes.contains(&foreign.as_str()), "{what}: {nodes:?}");
            let dri: Vec<_> = nodes
                .iter()
                .filter(|n| n.starts_with("/dev/dri/"))
                .collect();
            assert_eq!(dri.len(), 2, "{what}: {nodes:?}");
            // The driver's files and hooks come along.
            assert!(
                e["mounts"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|m| m["containerPath"]
                        == "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"),
                "{what}"
            );
            for h in ["create-symlinks", "update-ldcache", "enable-cuda-compat"] {
                assert!(!hooks_named(e, h).is_empty(), "{what}: no {h} hook");
            }
            // The memory-limit hook where NVIDIA's spec has it: this GPU's, not the other's.
            let limits = hooks_named(e, "apply-cuda-memory-limits");
            if nvidia.to_string().contains("apply-cuda-memory-limits") {
                assert_eq!(limits.len(), 1, "{what}: {limits:?}");
                assert_eq!(limits[0]["hookName"], "createRuntime", "{what}");
                let args = strings(limits[0], "args");
                assert_eq!(args[args.len() - 2..], ["--gpu-id", uuid], "{what}");
                assert!(!e.to_string().contains(other), "{what}");
            } else {
                assert!(limits.is_empty(), "{what}");
            }
            // The DRM nodes' groups, where NVIDIA's spec names them.
            let gids = &e["additionalGids"];
            if nvidia.to_string().contains("additionalGids") {
                assert_eq!(gids, &serde_json::json!([44, 992]), "{what}");
            } else {
                assert!(gids.is_null(), "{what}");
            }
        }
        let (mps, gpu) = (&files[0].1, &files[1].1);
        assert_eq!(mps["kind"], MPS_CDI_KIND);
        assert_eq!(gpu["kind"], GPU_CDI_KIND);
        // The time-sliced device is NVIDIA's edits, nothing added; the MPS one adds the daemon's.
        let (g, m) = (device_edits(gpu, uuid), device_edits(mps, uuid));
        let dir = mps_dir(case.gpu as u32);
        assert!(!g.to_string().contains("CUDA_MPS"), "{}", case.dir);
        assert!(
            strings(m, "env").contains(&format!("CUDA_MPS_PIPE_DIRECTORY={dir}/pipe").as_str())
        );
        let shm: Vec<_> = m["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x["containerPath"] == "/dev/shm")
            .collect();
        assert_eq!(shm.len(), 1, "{}", case.dir);
        assert_eq!(shm[0]["hostPath"], format!("{dir}/shm"));
        assert_eq!(m["deviceNodes"], g["deviceNodes"]);
        assert_eq!(m["hooks"], g["hooks"]);
        assert_eq!(
            m["mounts"].as_array().unwrap().len(),
            g["mounts"].as_array().unwrap().len() + 2
        );
        // gpu-share's own devices are never read back as NVIDIA's.
        let mut node = files.clone();
        node.push((nvidia_file.clone(), nvidia.clone()));
        let (_, again) = cdi::gpu_edits(&node, uuid, case.minor).unwrap();
        assert_eq!(&again, g, "{}", case.dir);
        assert_ne!(cdi::file_name(uuid), cdi::gpu_file_name(uuid));
    }
}

#[test]
fn a_gpu_nvidia_names_by_index_only_needs_its_minor_number() {
    let case = &CASES[0];
    let specs = vec![nvidia_spec(case.nvidia)];
    let e = cdi::gpu_edits(&specs, UUIDS[1], None).unwrap_err();
    assert!(matches!(e, CdiError::NoSpec { .. }));
    let words = e.to_string();
    assert!(
        words.contains(UUIDS[1]) && words.contains("/var/run/cdi/nvidia.yaml"),
        "{words}"
    );
    // Another minor number is another GPU.
    let (_, other) = cdi::gpu_edits(&specs, UUIDS[1], Some(0)).unwrap();
    assert!(node_paths(&other).contains(&"/dev/nvidia0"));
}

#[test]
fn the_written_specs_are_the_golden_files() {
    let update = std::env::var_os("GPU_SHARE_UPDATE_GOLDEN").is_some_and(|v| v == "1");
    let root = fixtures().join("written");
    let mut problems = Vec::new();
    let mut expected = BTreeSet::new();
    for case in &CASES {
        let dir = root.join(case.dir);
        for (name, spec) in written(case) {
            let path = dir.join(&name);
            expected.insert(path.clone());
            let text = serde_json::to_string_pretty(&spec).unwrap() + "\n";
            if update {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, &text).unwrap();
                continue;
            }
            let shown = format!("written/{}/{name}", case.dir);
            match std::fs::read_to_string(&path) {
                Err(e) => problems.push(format!("{shown}: no golden file ({e})")),
                Ok(golden) if golden == text => {}
                Ok(golden) => match serde_json::from_str::<Value>(&golden) {
                    Err(e) => problems.push(format!("{shown}: the golden file is not JSON ({e})")),
                    Ok(g) => {
                        let mut diffs = Vec::new();
                        differences("", &g, &spec, &mut diffs);
                        if diffs.is_empty() {
                            diffs.push("the same JSON, written differently".to_string());
                        }
                        let more = diffs.len().saturating_sub(12);
                        diffs.truncate(12);
                        if more > 0 {
                            diffs.push(format!("and {more} more"));
                        }
                        problems.push(format!("{shown}:\n    {}", diffs.join("\n    ")));
                    }
                },
            }
        }
    }
    // A golden file no case writes is stale.
    for entry in std::fs::read_dir(&root).into_iter().flatten().flatten() {
        for file in std::fs::read_dir(entry.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let path = file.path();
            if !expected.contains(&path) {
                if update {
                    std::fs::remove_file(&path).unwrap();
                } else {
                    let shown = path.strip_prefix(fixtures()).unwrap_or(&path);
                    problems.push(format!("{}: no case writes it", shown.display()));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "the specs gpu-share writes differ from the golden files in tests/fixtures/cdi/written \
         (if the change is meant, run with GPU_SHARE_UPDATE_GOLDEN=1, then the Go test in \
         tests/cdi):\n{}",
        problems.join("\n")
    );
}

/// Where `golden` and `computed` differ, in words, one line per place (`at` is the JSON path).
fn differences(at: &str, golden: &Value, computed: &Value, out: &mut Vec<String>) {
    let here = if at.is_empty() { "the spec" } else { at };
    match (golden, computed) {
        (Value::Object(g), Value::Object(c)) => {
            for (k, v) in g {
                let path = format!("{at}.{k}");
                match c.get(k) {
                    Some(w) => differences(&path, v, w, out),
                    None => out.push(format!(
                        "{path}: in the golden file ({v}), no longer written"
                    )),
                }
            }
            for (k, v) in c {
                if !g.contains_key(k) {
                    out.push(format!(
                        "{at}.{k}: now written ({v}), not in the golden file"
                    ));
                }
            }
        }
        (Value::Array(g), Value::Array(c)) => {
            for (i, (v, w)) in g.iter().zip(c).enumerate() {
                differences(&format!("{at}[{i}]"), v, w, out);
            }
            if g.len() != c.len() {
                out.push(format!(
                    "{here}: {} entries in the golden file, {} written",
                    g.len(),
                    c.len()
                ));
            }
        }
        (g, c) if g != c => out.push(format!("{here}: golden {g}, written {c}")),
        _ => {}
    }
}

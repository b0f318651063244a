//! `gpu-share reserve --mps`: the GPU's MPS control daemon, managed against a stand-in
//! `nvidia-cuda-mps-control` that records the commands it receives
//! (`tests/fixtures/mps/nvidia-cuda-mps-control`), NVML's compute mode through the stand-in
//! `libnvidia-ml.so.1` (tests/node/standin/nvml), and a stand-in Kubernetes API that records what the agent writes on its pod. Start,
//! defaults, the pipe published only once they are set, a health failure (the GPU closed to new
//! contexts at once, the pipe withdrawn and why said, the daemon started again), `quit` on
//! release, and a daemon that will not come back failing the reservation in words, the GPU
//! closed until the reservation goes.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path as UrlPath, State};
use axum::routing::{patch, post};
use serde_json::{Value, json};

const UUID: &str = "GPU-5b3c7e0a-6ac7-9aeb-27a6-4d200dab509e";

/// The pod annotations the agent wrote, in order.
type Patches = Arc<Mutex<Vec<Value>>>;

async fn fake_api() -> (String, Patches) {
    let patches: Patches = Arc::default();
    let app = Router::new()
        .route(
            "/api/v1/namespaces/{ns}/pods/{name}",
            patch(
                |State(p): State<Patches>,
                 UrlPath((ns, name)): UrlPath<(String, String)>,
                 body: axum::Json<Value>| async move {
                    p.lock()
                        .unwrap()
                        .push(body["metadata"]["annotations"].clone());
                    axum::Json(json!({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": name, "namespace": ns, "uid": "u-1"}}))
                },
            ),
        )
        .route(
            "/apis/events.k8s.io/v1/namespaces/{ns}/events",
            post(|body: axum::Json<Value>| async move { (axum::http::StatusCode::CREATED, body) }),
        )
        .with_state(patches.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), patches)
}

fn kubeconfig(dir: &Path, server: &str) -> PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: \"{server}\"}}\nusers:\n- name: u\n  user: {{token: t}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n"
        ),
    )
    .unwrap();
    path
}

struct Run {
    child: Child,
    dir: tempfile::TempDir,
}

impl Run {
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("mps.log")).unwrap_or_default()
    }
    fn modes(&self) -> Vec<String> {
        common::nvml::modes(&self.dir.path().join("nvml"), UUID)
    }
    fn pipe(&self) -> PathBuf {
        self.dir.path().join("mps").join(UUID).join("pipe")
    }
    fn shm(&self) -> String {
        self.dir
            .path()
            .join("mps")
            .join(UUID)
            .join("shm")
            .display()
            .to_string()
    }
    fn device(&self) -> PathBuf {
        self.dir
            .path()
            .join("cdi")
            .join(format!("gpu-share.io-mps-{UUID}.json"))
    }
    fn kill_daemon(&self) {
        let pid = std::fs::read_to_string(self.pipe().join("standin-daemon.pid")).unwrap();
        assert!(
            Command::new("kill")
                .arg(pid.trim())
                .status()
                .unwrap()
                .success()
        );
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Ok(pid) = std::fs::read_to_string(self.pipe().join("standin-daemon.pid")) {
            let _ = Command::new("kill").arg(pid.trim()).status();
        }
    }
}

/// NVIDIA's CDI specs as the node has them (one, for GPU 0).
fn nvidia_specs() -> String {
    format!("{}/tests/fixtures/mps/cdi", env!("CARGO_MANIFEST_DIR"))
}

fn start(server: &str) -> Run {
    start_with(server, &nvidia_specs())
}

fn start_with(server: &str, specs: &str) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let control = format!(
        "{}/tests/fixtures/mps/nvidia-cuda-mps-control",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut cmd = Command::new(common::BIN);
    cmd.args(["reserve", "--mps", "--mps-health-seconds", "1"]);
    common::nvml::give(
        &mut cmd,
        &dir.path().join("dev"),
        &dir.path().join("nvml"),
        common::nvml::Gpus::Visible(&[(0, UUID)]),
    );
    let child = cmd
        .args(["--mps-pinned-memory-mib", "40960", "--mps-restarts", "2"])
        .arg("--mps-control")
        .arg(&control)
        .arg("--mps-root")
        .arg(dir.path().join("mps"))
        .arg("--termination-log")
        .arg(dir.path().join("termination-log"))
        .arg("--cdi-dir")
        .arg(dir.path().join("cdi"))
        .arg("--cdi-specs")
        .arg(specs)
        .env("KUBECONFIG", kubeconfig(dir.path(), server))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("POD_NAME", "gpu-share-n1-gpu-0")
        .env("POD_NAMESPACE", "gpu-share-reservations")
        .env("MPS_STANDIN_LOG", dir.path().join("mps.log"))
        .env("RUST_LOG", "info")
        .spawn()
        .unwrap();
    Run { child, dir }
}

async fn until(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < limit, "{what} within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The agent's exit status, waited for without blocking the runtime that serves the stand-in
/// API (a minute: the release is a `quit` and an NVML call, seconds even beside a build).
async fn exited(child: &mut Child) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "still running");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn last(p: &Patches) -> Value {
    p.lock().unwrap().last().cloned().unwrap_or(Value::Null)
}

#[tokio::test]
async fn the_reservation_runs_its_gpus_mps_daemon_and_closes_the_gpu_when_it_fails() {
    let (server, patches) = fake_api().await;
    let mut run = start(&server);
    let pipe = run.pipe().display().to_string();
    // Started: the daemon on this GPU's own directories (after clearing what an earlier one
    // left), the defaults set and read back, the compute mode, and only then the pipe on the pod.
    until("the pipe published", Duration::from_secs(60), || {
        last(&patches)["gpu-share.io/mps-pipe"] == pipe.as_str()
    })
    .await;
    assert_eq!(last(&patches)["gpu-share.io/gpu-uuid"], UUID);
    assert_eq!(run.modes(), ["EXCLUSIVE_PROCESS"]);
    // The GPU's CDI device, written before the pipe was published: NVIDIA's edits for GPU 0,
    // the daemon's pipe, its shared memory as /dev/shm, and the pipe's variable.
    let device: Value =
        serde_json::from_slice(&std::fs::read(run.device()).expect("the CDI device")).unwrap();
    assert_eq!(device["kind"], "gpu-share.io/mps");
    assert_eq!(device["devices"][0]["name"], UUID);
    let edits = &device["devices"][0]["containerEdits"];
    assert!(
        edits["deviceNodes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["path"] == "/dev/nvidia0"),
        "{edits}"
    );
    assert!(
        edits["env"]
            .as_array()
            .unwrap()
            .contains(&json!(format!("CUDA_MPS_PIPE_DIRECTORY={pipe}"))),
        "{edits}"
    );
    let mounts = edits["mounts"].as_array().unwrap();
    assert!(mounts.iter().any(|m| m["hostPath"] == pipe.as_str()));
    assert!(
        mounts
            .iter()
            .any(|m| m["containerPath"] == "/dev/shm" && m["hostPath"] == run.shm().as_str()),
        "{edits}"
    );
    let log = run.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| !l.starts_with("get_") && !l.ends_with("(no daemon)"))
        .collect();
    assert!(log.starts_with("quit (no daemon)"), "{log}");
    assert_eq!(
        lines,
        [
            format!(
                "start visible={UUID} pipe={pipe} log={}",
                run.dir.path().join("mps").join(UUID).join("log").display()
            )
            .as_str(),
            "set_default_active_thread_percentage 100",
            format!("set_default_device_pinned_mem_limit {UUID} 40960M").as_str(),
        ],
        "{log}"
    );
    // Health: the daemon dies; the GPU takes no new context at once, the pod says why and
    // loses its pipe, and the daemon is started again with its defaults.
    run.kill_daemon();
    until("the GPU closed", Duration::from_secs(45), || {
        run.modes().contains(&"PROHIBITED".to_string())
    })
    .await;
    until("the daemon back", Duration::from_secs(60), || {
        let seen = patches.lock().unwrap().clone();
        let down = seen
            .iter()
            .position(|a| a["gpu-share.io/mps-down"].is_string());
        run.modes().len() == 3
            && down.is_some_and(|i| {
                seen[i + 1..]
                    .iter()
                    .any(|a| a["gpu-share.io/mps-pipe"] == pipe.as_str())
            })
    })
    .await;
    assert_eq!(run.log().matches("start visible=").count(), 2);
    let seen = patches.lock().unwrap().clone();
    let down = seen
        .iter()
        .find(|a| a["gpu-share.io/mps-down"].is_string())
        .expect("the failure written on the pod");
    assert!(
        down["gpu-share.io/mps-down"]
            .as_str()
            .unwrap()
            .contains("health check"),
        "{down}"
    );
    assert!(down["gpu-share.io/mps-pipe"].is_null(), "{down}");
    // Down and back is no failure of the reservation.
    assert!(
        seen.iter()
            .all(|a| a["gpu-share.io/reserve-error"].is_null())
    );
    assert!(last(&patches)["gpu-share.io/mps-down"].is_null());
    assert_eq!(
        run.modes(),
        ["EXCLUSIVE_PROCESS", "PROHIBITED", "EXCLUSIVE_PROCESS"]
    );
    // Release: quit, and the GPU back to any process.
    assert!(
        Command::new("kill")
            .args(["-TERM", &run.child.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
    let status = exited(&mut run.child).await;
    assert!(status.success(), "{status}");
    assert!(run.log().lines().any(|l| l == "quit"), "{}", run.log());
    assert_eq!(run.modes().last().map(String::as_str), Some("DEFAULT"));
    assert!(
        !run.device().exists(),
        "the CDI device goes with the reservation"
    );
}

/// A node where no NVIDIA CDI spec describes the GPU: the reservation fails in words (the
/// shares' device would not resolve), and its daemon is released.
#[tokio::test]
async fn no_nvidia_cdi_spec_fails_the_reservation_in_words() {
    let (server, patches) = fake_api().await;
    let empty = tempfile::tempdir().unwrap();
    let mut run = start_with(&server, &empty.path().display().to_string());
    let status = exited(&mut run.child).await;
    assert!(!status.success());
    let why = last(&patches)["gpu-share.io/reserve-error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        why.contains("no NVIDIA CDI spec") && why.contains("nvidia-ctk cdi generate"),
        "{why}"
    );
    assert!(last(&patches)["gpu-share.io/mps-pipe"].is_null());
    assert_eq!(run.modes().last().map(String::as_str), Some("DEFAULT"));
    assert!(run.log().lines().any(|l| l == "quit"), "{}", run.log());
}

#[tokio::test]
async fn a_daemon_that_will_not_come_back_fails_the_reservation_in_words() {
    let (server, patches) = fake_api().await;
    let mut run = start(&server);
    let pipe = run.pipe().display().to_string();
    until("the pipe published", Duration::from_secs(60), || {
        last(&patches)["gpu-share.io/mps-pipe"] == pipe.as_str()
    })
    .await;
    std::fs::write(run.dir.path().join("mps.log.refuse-start"), "").unwrap();
    run.kill_daemon();
    // Two tries, as told; then the failure on the pod, and the GPU closed meanwhile.
    until("the failure on the pod", Duration::from_secs(60), || {
        last(&patches)["gpu-share.io/reserve-error"].is_string()
    })
    .await;
    assert_eq!(
        run.log().matches("start refused").count(),
        2,
        "{}",
        run.log()
    );
    assert_eq!(run.modes().last().map(String::as_str), Some("PROHIBITED"));
    let why = std::fs::read_to_string(run.dir.path().join("termination-log")).unwrap();
    assert!(why.contains("MPS daemon"), "{why}");
    let end = last(&patches);
    assert!(end["gpu-share.io/mps-pipe"].is_null(), "{end}");
    assert!(
        run.child.try_wait().unwrap().is_none(),
        "it holds the GPU closed until it goes"
    );
    // The reservation goes: the GPU takes any process again, and the process says it failed.
    assert!(
        Command::new("kill")
            .args(["-TERM", &run.child.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
    let status = exited(&mut run.child).await;
    assert!(!status.success());
    assert_eq!(run.modes().last().map(String::as_str), Some("DEFAULT"));
    assert!(
        !run.device().exists(),
        "no device while no daemon serves it"
    );
}

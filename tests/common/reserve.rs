//! The one part of a node no process here plays: a kubelet that runs reservation pods (per-GPU
//! sharing). Each reservation pod KWOK marks Running gets a real `gpu-share reserve` process,
//! under the reserve ServiceAccount's own token, whose NVML is the stand-in `libnvidia-ml.so.1`
//! (tests/node/standin/nvml, [`super::nvml`]): one GPU with a made-up UUID per pod, or a GPU
//! fallen off the bus. A reservation that runs its GPU's MPS daemon (`--mps`) gets the stand-in
//! `nvidia-cuda-mps-control` (`tests/fixtures/mps`), NVIDIA's CDI spec of the fixtures, and
//! directories of the test's own for the daemon and the CDI device it writes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::process::{Child, Command, Stdio};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use super::cluster::Cluster;

/// The namespace gpu-share creates reservation pods in.
pub const RESERVATIONS: &str = "gpu-share-reservations";

/// The reservation pods' kubelet: a `gpu-share reserve` per Running reservation pod.
pub struct Kubelet {
    kubeconfig: String,
    agents: HashMap<String, Child>,
    /// Reservation pod names whose NVML fails.
    pub fail: BTreeSet<String>,
    /// Reservation pod names whose process is not started yet (they stay starting).
    pub hold: BTreeSet<String>,
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        for (_, a) in self.agents.drain() {
            stop(a);
        }
    }
}

/// Stops an agent as kubelet does: SIGTERM (an MPS reservation quits its daemon), then SIGKILL
/// after a grace of 5 s.
fn stop(mut a: Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &a.id().to_string()])
        .status();
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_secs(5) {
        if let Ok(Some(_)) = a.try_wait() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = a.kill();
    let _ = a.wait();
}

/// Where the MPS reservations' CDI devices are written (under the cluster's directory).
/// What a per-GPU point leaves, removed whether it passed or not: its namespaces, the
/// reservation pods bound to its node (a point that failed midway leaves them with no kubelet
/// left to stop them; one that passed has seen them released) and the node.
pub fn remove_point(c: &Cluster, namespaces: &[&str], node: &str) -> Result<(), String> {
    let kubectl = |args: &[&str]| {
        let out = c.kubectl(args, None);
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    };
    let mut delete = vec!["delete", "namespace"];
    delete.extend(namespaces);
    delete.extend(["--ignore-not-found", "--timeout=120s"]);
    kubectl(&delete)?;
    let on_node = format!("spec.nodeName={node}");
    kubectl(&[
        "-n",
        RESERVATIONS,
        "delete",
        "pods",
        "--field-selector",
        &on_node,
        "--force",
        "--grace-period=0",
    ])?;
    kubectl(&["delete", "node", node, "--ignore-not-found", "--wait=false"])
}

pub fn cdi_dir(c: &Cluster) -> std::path::PathBuf {
    c.dir.join("cdi")
}

/// The UUID the stand-in NVML gives reservation pod `uid`.
pub fn uuid_of(uid: &str) -> String {
    format!("GPU-{uid}")
}

impl Kubelet {
    pub fn new(c: &Cluster) -> Result<Kubelet, String> {
        let out = c.kubectl(
            &[
                "-n",
                RESERVATIONS,
                "create",
                "token",
                "gpu-share-reserve",
                "--duration",
                "2h",
            ],
            None,
        );
        if !out.status.success() {
            return Err(format!(
                "kubectl create token gpu-share-reserve: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let token = String::from_utf8_lossy(&out.stdout).into_owned();
        let base = std::fs::read_to_string(c.var("KUBECONFIG")).map_err(|e| e.to_string())?;
        // The admin kubeconfig's user, replaced by the ServiceAccount's token.
        let user = base
            .find("  - name: user")
            .ok_or("no user stanza in the kubeconfig")?;
        let text = format!(
            "{}  - name: user\n    user:\n      token: {}\n",
            &base[..user],
            token.trim()
        );
        let path = c.dir.join("kubeconfigs/reserve");
        std::fs::write(&path, text).map_err(|e| e.to_string())?;
        Ok(Kubelet {
            kubeconfig: path.display().to_string(),
            agents: HashMap::new(),
            fail: BTreeSet::new(),
            hold: BTreeSet::new(),
        })
    }

    /// Starts an agent for every Running reservation pod that has none; reaps those whose pod is
    /// gone.
    pub async fn tick(&mut self, c: &Cluster) -> Result<(), String> {
        let pods = Api::<Pod>::namespaced(c.client.clone(), RESERVATIONS)
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("list pods in {RESERVATIONS}: {e}"))?
            .items;
        let live: BTreeMap<String, &Pod> = pods
            .iter()
            .filter(|p| {
                p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    && p.metadata.deletion_timestamp.is_none()
            })
            .filter_map(|p| Some((p.metadata.uid.clone()?, p)))
            .collect();
        let gone: Vec<String> = self
            .agents
            .keys()
            .filter(|uid| !live.contains_key(*uid))
            .cloned()
            .collect();
        for uid in gone {
            if let Some(a) = self.agents.remove(&uid) {
                stop(a);
            }
        }
        for (uid, p) in live {
            if self.agents.contains_key(&uid) {
                continue;
            }
            let name = p.metadata.name.clone().unwrap_or_default();
            if self.hold.contains(&name) {
                continue;
            }
            let uuid = uuid_of(&uid);
            let visible = [(0, uuid.as_str())];
            let gpus = if self.fail.contains(&name) {
                // NVML_ERROR_GPU_IS_LOST.
                super::nvml::Gpus::Failing(15)
            } else {
                super::nvml::Gpus::Visible(&visible)
            };
            let mut cmd = Command::new(super::BIN);
            cmd.args(["reserve"]);
            let nvml = c.dir.join("nvml").join(&name);
            super::nvml::give(&mut cmd, &nvml.join("dev"), &nvml.join("log"), gpus);
            let mps = p
                .spec
                .as_ref()
                .and_then(|s| s.containers.first())
                .and_then(|c| c.args.as_ref())
                .is_some_and(|a| a.iter().any(|a| a == "--mps"));
            if mps {
                let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/mps");
                let logs = c.dir.join("logs");
                cmd.args(["--mps", "--mps-health-seconds", "1"])
                    .arg("--mps-dir")
                    .arg(c.dir.join("mps").join(&name))
                    .arg("--mps-control")
                    .arg(format!("{fixtures}/nvidia-cuda-mps-control"))
                    .arg("--cdi-dir")
                    .arg(cdi_dir(c))
                    .arg("--cdi-specs")
                    .arg(format!("{fixtures}/cdi"))
                    .env("MPS_STANDIN_LOG", logs.join(format!("reserve-{name}.mps")));
            }
            let child = cmd
                .env("KUBECONFIG", &self.kubeconfig)
                .env("POD_NAME", &name)
                .env("POD_NAMESPACE", RESERVATIONS)
                .arg("--termination-log")
                .arg(c.dir.join(format!("logs/reserve-{name}.term")))
                .stdout(Stdio::null())
                .stderr(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(c.dir.join(format!("logs/reserve-{name}.log")))
                        .map(Stdio::from)
                        .unwrap_or(Stdio::null()),
                )
                .spawn()
                .map_err(|e| format!("start gpu-share reserve: {e}"))?;
            self.agents.insert(uid, child);
        }
        Ok(())
    }
}

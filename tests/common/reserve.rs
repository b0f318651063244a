//! The one part of a node no process here plays: a kubelet that runs reservation pods (per-GPU
//! sharing). Each reservation pod KWOK marks Running gets a real `gpu-share reserve` process,
//! under the reserve ServiceAccount's own token, whose NVML is the test seam
//! (`GPU_SHARE_RESERVE_FAKE_NVML`): a made-up UUID per pod, or an error.

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
        for (_, mut a) in self.agents.drain() {
            let _ = a.kill();
            let _ = a.wait();
        }
    }
}

/// The UUID the seam gives reservation pod `uid`.
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
        self.agents.retain(|uid, a| {
            let keep = live.contains_key(uid);
            if !keep {
                let _ = a.kill();
                let _ = a.wait();
            }
            keep
        });
        for (uid, p) in live {
            if self.agents.contains_key(&uid) {
                continue;
            }
            let name = p.metadata.name.clone().unwrap_or_default();
            if self.hold.contains(&name) {
                continue;
            }
            let nvml = if self.fail.contains(&name) {
                "error:NVML_ERROR_GPU_IS_LOST (injected by the test)".to_string()
            } else {
                uuid_of(&uid)
            };
            let child = Command::new(super::BIN)
                .args(["reserve"])
                .env("KUBECONFIG", &self.kubeconfig)
                .env("POD_NAME", &name)
                .env("POD_NAMESPACE", RESERVATIONS)
                .env("GPU_SHARE_RESERVE_FAKE_NVML", nvml)
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

//! MPS per GPU under kubelet: a share's CDI device and limits (3), and a reservation killed
//! past its grace (7).

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

use super::*;

/// An MPS share as a restricted namespace runs it: user 1000 (the policy's `mps.runAsUser`).
fn mps_pod(name: &str) -> Result<Pod, String> {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": {"gpu-share": "mps-25"}},
        "spec": {
            "securityContext": {"runAsNonRoot": true, "runAsUser": 1000,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "main", "image": PROBE, "imagePullPolicy": "Never",
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
            }],
        },
    }))
    .map_err(|e| e.to_string())
}

/// The MPS reservation on the per-GPU node whose daemon's pipe is published: (pod, UUID,
/// container started at).
async fn mps_reservation(c: &Cluster) -> Result<Option<(Pod, String, String)>, String> {
    Ok(reservations(c).await?.into_iter().find(|(p, _, started)| {
        let a = p.metadata.annotations.clone().unwrap_or_default();
        a.get("gpu-share.io/reserve-mps").map(String::as_str) == Some("true")
            && a.contains_key("gpu-share.io/mps-pipe")
            && !started.is_empty()
    }))
}

/// What an MPS share must have been started with, read from inside it: its GPU, the CDI
/// device's pipe directory (mounted, and named by CUDA_MPS_PIPE_DIRECTORY), the daemon's
/// `/dev/shm` in place of the container's own, and its limits from its keys.
fn held_to_its_limits(name: &str, report: &Probe, uuid: &str) -> Check {
    ensure(
        report.gpus() == [uuid.to_string()],
        format!(
            "{name}: GPUs {:?} in the container, not {uuid}",
            report.gpus()
        ),
    )?;
    let pipe = report
        .env
        .get("CUDA_MPS_PIPE_DIRECTORY")
        .ok_or(format!("{name}: no CUDA_MPS_PIPE_DIRECTORY"))?;
    ensure(
        report.mounts.iter().any(|(m, _)| m == pipe),
        format!("{name}: the pipe directory {pipe} is not mounted"),
    )?;
    let shm = report.mounts.iter().rev().find(|(m, _)| m == "/dev/shm");
    ensure(
        shm.is_some_and(|(_, fs)| fs != "tmpfs"),
        format!("{name}: /dev/shm is the container's own ({shm:?}), not the daemon's"),
    )?;
    let pinned = report.env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
    ensure(
        pinned.map(String::as_str) == Some("0=20480M"),
        format!("{name}: pinned limit {pinned:?}, not 0=20480M (a quarter of 80 GiB)"),
    )?;
    let threads = report.env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
    ensure(
        threads.map(String::as_str) == Some("25"),
        format!("{name}: thread percentage {threads:?}, not 25"),
    )
}

/// The node's CDI spec of GPU `uuid`'s MPS device, as the reservation wrote it.
fn mps_spec_file(c: &Cluster, uuid: &str) -> std::path::PathBuf {
    node_cdi_file(c, &gpu_share_agent::cdi::file_name(uuid))
}

/// 3. A per-GPU `mps` share gets `gpu-share.io/mps=<UUID>` resolved at container creation by
///    NVIDIA's runtime in CDI mode: the pipe, `/dev/shm` and `CUDA_MPS_PIPE_DIRECTORY`, with
///    the pinned limit and thread percentage from its keys.
pub async fn mps_share_gets_its_device(c: &Cluster) -> Check {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    pods.create(&PostParams::default(), &mps_pod("mps-share")?)
        .await
        .map_err(|e| format!("create an mps-25 pod: {e}"))?;
    let report = probe(c, NS, "mps-share").await?;
    let (reservation, uuid, _) = mps_reservation(c)
        .await?
        .ok_or("no MPS reservation with its pipe published")?;
    held_to_its_limits("mps-share", &report, &uuid)?;
    let share = pods.get("mps-share").await.map_err(|e| e.to_string())?;
    let cm = gpu_share::ledger::devices_configmap(share.spec.as_ref().unwrap())
        .map(|d| d.configmap)
        .ok_or("the MPS share reads no devices ConfigMap")?;
    let data = Api::<ConfigMap>::namespaced(c.client.clone(), NS)
        .get(&cm)
        .await
        .map_err(|e| e.to_string())?
        .data
        .unwrap_or_default();
    let named = data.get("NVIDIA_VISIBLE_DEVICES").cloned();
    ensure(
        named.as_deref() == Some(format!("gpu-share.io/mps={uuid}").as_str()),
        format!("the share's ConfigMap names {named:?}"),
    )?;
    let spec = mps_spec_file(c, &uuid);
    ensure(
        spec.exists(),
        format!("no CDI spec {} on the node", spec.display()),
    )?;
    eprintln!(
        "real nodes: mps-share on {uuid} (reservation {}), pipe {:?}",
        reservation.metadata.name.unwrap_or_default(),
        report.env.get("CUDA_MPS_PIPE_DIRECTORY")
    );
    Ok(())
}

/// 7. A reservation killed by kubelet (SIGKILL past its grace period: stopped first, so SIGTERM
///    does nothing) leaves nothing that lets a later share start without its limits: the next
///    share on the GPU starts only after a new reservation runs and writes the GPU's device
///    again, and is held to its limits.
pub async fn killed_reservation_leaves_no_way_around(c: &Cluster) -> Check {
    let (old, _, old_started) = mps_reservation(c)
        .await?
        .ok_or("no MPS reservation to kill")?;
    let old_name = old.metadata.name.clone().unwrap_or_default();
    let old_uid = old.metadata.uid.clone().unwrap_or_default();
    let id = old
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref()?.first()?.container_id.clone())
        .and_then(|id| id.strip_prefix("containerd://").map(str::to_string))
        .ok_or("the reservation's container has no ID")?;
    // Its process, through the node's CRI, stopped so that it cannot act on SIGTERM.
    let node = c.dir.join("nodes").join(PER_GPU);
    let bin = std::process::Command::new("bash")
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node/build.sh"))
        .output()
        .map_err(|e| e.to_string())?;
    let bin = String::from_utf8_lossy(&bin.stdout).trim().to_string();
    let inspect = std::process::Command::new("nsenter")
        .arg(format!("--mount={}", node.join("mnt.ns").display()))
        .arg("--")
        .arg(format!("{bin}/crictl"))
        .args([
            "--runtime-endpoint",
            "unix:///run/containerd/containerd.sock",
            "inspect",
            &id,
        ])
        .output()
        .map_err(|e| e.to_string())?;
    let info: Value =
        serde_json::from_slice(&inspect.stdout).map_err(|e| format!("crictl inspect {id}: {e}"))?;
    let pid = info["info"]["pid"]
        .as_i64()
        .ok_or(format!("crictl inspect {id}: no pid"))?;
    let stopped = std::process::Command::new("kill")
        .args(["-STOP", &pid.to_string()])
        .status()
        .map_err(|e| e.to_string())?;
    ensure(stopped.success(), format!("kill -STOP {pid}"))?;
    let reservations: Api<Pod> = Api::namespaced(c.client.clone(), RESERVATIONS);
    reservations
        .delete(&old_name, &DeleteParams::default().grace_period(2))
        .await
        .map_err(|e| e.to_string())?;
    // A later share, created at once.
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    pods.create(&PostParams::default(), &mps_pod("later-share")?)
        .await
        .map_err(|e| e.to_string())?;
    wait_for(
        &format!("{old_name} killed and gone"),
        Duration::from_secs(60),
        || {
            let reservations = reservations.clone();
            let old_uid = old_uid.clone();
            let old_name = old_name.clone();
            async move {
                let p = reservations
                    .get_opt(&old_name)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok((p.and_then(|p| p.metadata.uid) != Some(old_uid)).then_some(()))
            }
        },
    )
    .await?;
    let report = probe(c, NS, "later-share").await?;
    let (new, new_uuid, new_started) = mps_reservation(c)
        .await?
        .ok_or("no MPS reservation after the kill")?;
    ensure(
        new.metadata.uid.as_deref() != Some(old_uid.as_str()),
        "the killed reservation still serves the GPU",
    )?;
    let later = pods.get("later-share").await.map_err(|e| e.to_string())?;
    let later_started = started_at(&later);
    ensure(
        later_started >= new_started && new_started >= old_started,
        format!(
            "the later share started at {later_started}, before its new reservation ({new_started})"
        ),
    )?;
    held_to_its_limits("later-share", &report, &new_uuid)?;
    let spec = mps_spec_file(c, &new_uuid);
    let written = std::fs::metadata(&spec)
        .and_then(|m| m.modified())
        .map_err(|e| format!("{}: {e}", spec.display()))?
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs() as i64;
    let new_start = new
        .status
        .as_ref()
        .and_then(|s| s.start_time.clone())
        .map(|t| t.0.as_second())
        .ok_or("the new reservation has no start time")?;
    ensure(
        written + 1 >= new_start,
        format!(
            "the GPU's CDI device was last written at {written} s, before the new reservation started ({new_start} s)"
        ),
    )?;
    eprintln!(
        "real nodes: {old_name} killed; later-share started {later_started}, after {} ({new_started}) wrote the device again",
        new.metadata.name.unwrap_or_default()
    );
    Ok(())
}

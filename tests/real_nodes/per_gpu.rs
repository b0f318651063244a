//! The per-GPU form under kubelet: a share starts after its reservation, on the GPU its
//! ConfigMap names (2); a share whose key is missing never starts (4); a deleted share frees its
//! GPU (6); a time-sliced share takes its GPU through the CDI device its reservation wrote (8).

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

use super::*;

/// 2. The per-GPU share started only after its reservation pod ran, and sees the GPU its
///    ConfigMap names, which is the GPU the device plugin allocated to the reservation.
pub async fn share_follows_its_reservation(c: &Cluster) -> Check {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    let report = probe(c, NS, "first-timeslice-50").await?;
    // Read once it runs, for its start time.
    let share = pods
        .get("first-timeslice-50")
        .await
        .map_err(|e| e.to_string())?;
    let configmap = share
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.env.iter().flatten())
        .find(|e| e.name == "NVIDIA_VISIBLE_DEVICES")
        .and_then(|e| e.value_from.as_ref()?.config_map_key_ref.clone())
        .ok_or("the share's NVIDIA_VISIBLE_DEVICES is not read from a ConfigMap")?;
    ensure(
        configmap.optional != Some(true),
        "the share's ConfigMap key is optional",
    )?;
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), NS);
    let named = cms
        .get(&configmap.name)
        .await
        .map_err(|e| e.to_string())?
        .data
        .and_then(|d| d.get(&configmap.key).cloned())
        .ok_or("the share's ConfigMap holds no GPU")?;
    let seen = report.gpus();
    ensure(
        seen == [named.clone()],
        format!("the share sees GPUs {seen:?}; its ConfigMap names {named}"),
    )?;
    let (reservation, started) = published(c, &named).await?;
    let name = reservation.metadata.name.clone().unwrap_or_default();
    let share_started = started_at(&share);
    ensure(
        !started.is_empty() && share_started >= started,
        format!(
            "the share started at {share_started}, its reservation {name} at {started}: before it"
        ),
    )?;
    eprintln!("real nodes: the share sees {named}, held by {name} (started {started})");
    Ok(())
}

/// 4. A share whose ConfigMap key is missing is not started: kubelet reports
///    `CreateContainerConfigError` and the container never runs. The pod references the key as
///    gpu-share writes it (non-optional), in a ConfigMap gpu-share has not filled.
pub async fn missing_key_never_starts(c: &Cluster) -> Check {
    // Only gpu-share writes a devices ConfigMap, except in a namespace opted out of the shipped
    // policies: the unfilled one is made there.
    let ns = "real-nodes-unfilled";
    c.namespace(ns, json!({"gpu-share.io/visible-devices": "allowed"}))
        .await?;
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), ns);
    let cm: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "gpu-share-devices-unfilled"}, "data": {}
    }))
    .map_err(|e| e.to_string())?;
    cms.create(&PostParams::default(), &cm)
        .await
        .map_err(|e| e.to_string())?;
    let share = Api::<Pod>::namespaced(c.client.clone(), NS)
        .get("first-timeslice-50")
        .await
        .map_err(|e| e.to_string())?;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), ns);
    let mut env: Value = serde_json::to_value(
        share.spec.as_ref().unwrap().containers[0]
            .env
            .clone()
            .unwrap_or_default(),
    )
    .map_err(|e| e.to_string())?;
    for e in env.as_array_mut().into_iter().flatten() {
        if let Some(r) = e.pointer_mut("/valueFrom/configMapKeyRef") {
            r["name"] = json!("gpu-share-devices-unfilled");
        }
    }
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "unfilled"},
        "spec": {
            "nodeName": PER_GPU, "runtimeClassName": "nvidia",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "main", "image": PROBE, "imagePullPolicy": "Never", "env": env}],
        },
    }))
    .map_err(|e| e.to_string())?;
    pods.create(&PostParams::default(), &pod)
        .await
        .map_err(|e| e.to_string())?;
    let why = wait_for(
        "kubelet's reason for not starting the share",
        Duration::from_secs(60),
        || {
            let pods = pods.clone();
            async move {
                let p = pods.get("unfilled").await.map_err(|e| e.to_string())?;
                let status = p.status.unwrap_or_default();
                ensure(
                    status.phase.as_deref() != Some("Running"),
                    "the share with no GPU runs",
                )?;
                Ok(status
                    .container_statuses
                    .iter()
                    .flatten()
                    .find_map(|s| s.state.as_ref()?.waiting.clone())
                    .filter(|w| w.reason.as_deref() != Some("ContainerCreating")))
            }
        },
    )
    .await?;
    ensure(
        why.reason.as_deref() == Some("CreateContainerConfigError"),
        format!("kubelet: {:?} ({:?})", why.reason, why.message),
    )?;
    // A while later it still never ran.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let p = pods.get("unfilled").await.map_err(|e| e.to_string())?;
    let status = p.status.unwrap_or_default();
    let ran =
        status.container_statuses.iter().flatten().any(|s| {
            s.restart_count > 0 || s.state.as_ref().is_some_and(|st| st.waiting.is_none())
        });
    ensure(!ran, "the share with no GPU started at some point")?;
    eprintln!("real nodes: kubelet: {:?}", why.message);
    pods.delete("unfilled", &DeleteParams::default())
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// 6. Deleting the share frees its GPU: its reservation is released (the policy's 5 s after the
///    last share), and the device plugin's GPU is free again for a whole-GPU pod.
pub async fn deleting_frees_the_gpu(c: &Cluster) -> Check {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    let before = wait_for(
        "the share's reservation, its GPU published",
        Duration::from_secs(60),
        || async move {
            let held = reservations(c).await?;
            Ok((!held.is_empty() && held.iter().all(|(_, u, _)| !u.is_empty())).then_some(held))
        },
    )
    .await?;
    pods.delete("first-timeslice-50", &DeleteParams::default())
        .await
        .map_err(|e| e.to_string())?;
    wait_for(
        "the share's reservation released",
        Duration::from_secs(90),
        || async move {
            let held = reservations(c).await?;
            Ok(held.is_empty().then_some(()))
        },
    )
    .await?;
    // The GPU is the device plugin's again: a second whole-GPU pod fits beside the first.
    pods.create(
        &PostParams::default(),
        &first_pod("exclusive-1", "second-exclusive")?,
    )
    .await
    .map_err(|e| e.to_string())?;
    let report = probe(c, NS, "second-exclusive").await?;
    let first = probe(c, NS, "first-exclusive-1").await?;
    ensure(
        report.gpus().len() == 1 && report.gpus() != first.gpus(),
        format!(
            "the second whole GPU {:?} is not the GPU the share's reservation held (the first exclusive pod has {:?})",
            report.gpus(),
            first.gpus()
        ),
    )?;
    let freed = before.iter().map(|(_, u, _)| u.clone()).collect::<Vec<_>>();
    ensure(
        freed == report.gpus(),
        format!(
            "the freed GPU {freed:?} is not the one the new pod got ({:?})",
            report.gpus()
        ),
    )?;
    // The GPU is left free for the MPS points.
    pods.delete("second-exclusive", &DeleteParams::default().grace_period(0))
        .await
        .map_err(|e| e.to_string())?;
    wait_for("second-exclusive gone", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move {
            Ok(pods
                .get_opt("second-exclusive")
                .await
                .map_err(|e| e.to_string())?
                .is_none()
                .then_some(()))
        }
    })
    .await
}

/// 8. With the policy's `perGpu.timesliceCdi`, a time-sliced share takes its GPU through the CDI
///    device its reservation wrote, `gpu-share.io/gpu=<UUID>`, resolved by NVIDIA's runtime in
///    CDI mode from the reservation's copy of NVIDIA's edits: it sees exactly that GPU, under
///    the policy's class. Deleting it releases the reservation, which removes the device's spec.
pub async fn timeslice_through_cdi_device(c: &Cluster) -> Check {
    edit_policy(c, &[("  timesliceCdi: false\n", "  timesliceCdi: true\n")]).await?;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    pods.create(
        &PostParams::default(),
        &first_pod("timeslice-50", "cdi-timeslice")?,
    )
    .await
    .map_err(|e| format!("create a timeslice-50 pod: {e}"))?;
    let report = probe(c, NS, "cdi-timeslice").await?;
    let share = pods.get("cdi-timeslice").await.map_err(|e| e.to_string())?;
    let spec = share.spec.clone().unwrap_or_default();
    ensure(
        spec.runtime_class_name.as_deref() == Some("nvidia"),
        format!("runtime class {:?}, not nvidia", spec.runtime_class_name),
    )?;
    let devices = gpu_share::ledger::devices_configmap(&spec)
        .ok_or("the share reads no devices ConfigMap")?;
    ensure(
        devices.cdi_device,
        "the share's NVIDIA_VISIBLE_DEVICES does not read the CDI device's key",
    )?;
    let data = Api::<ConfigMap>::namespaced(c.client.clone(), NS)
        .get(&devices.configmap)
        .await
        .map_err(|e| e.to_string())?
        .data
        .unwrap_or_default();
    let named = data
        .get(gpu_share::request::CDI_DEVICE_KEY)
        .cloned()
        .unwrap_or_default();
    let uuid = named
        .strip_prefix(gpu_share::reservation::GPU_CDI_KIND)
        .and_then(|n| n.strip_prefix('='))
        .ok_or(format!("the share's ConfigMap holds {data:?}"))?
        .to_string();
    ensure(
        !data.contains_key(gpu_share::request::DEVICES_KEY),
        format!("the share's ConfigMap also holds the bare UUID: {data:?}"),
    )?;
    let seen = report.gpus();
    ensure(
        seen == [uuid.clone()],
        format!("the share sees GPUs {seen:?}; its ConfigMap names {named}"),
    )?;
    let (reservation, _) = published(c, &uuid).await?;
    let annotations = reservation.metadata.annotations.clone().unwrap_or_default();
    ensure(
        annotations
            .get(gpu_share::reservation::ANNOTATION_CDI_DEVICE)
            .map(String::as_str)
            == Some("true"),
        format!("the reservation does not say it writes the device: {annotations:?}"),
    )?;
    let file = node_cdi_file(c, &gpu_share_agent::cdi::gpu_file_name(&uuid));
    let written: Value = serde_json::from_str(
        &std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?,
    )
    .map_err(|e| e.to_string())?;
    ensure(
        written["kind"] == gpu_share::reservation::GPU_CDI_KIND
            && written["devices"][0]["name"] == uuid.as_str(),
        format!("{} holds {written}", file.display()),
    )?;
    eprintln!(
        "real nodes: cdi-timeslice sees {uuid} through {named} ({})",
        file.display()
    );
    pods.delete("cdi-timeslice", &DeleteParams::default())
        .await
        .map_err(|e| e.to_string())?;
    wait_for(
        "the CDI share's reservation released and its device removed",
        Duration::from_secs(90),
        || {
            let file = file.clone();
            async move {
                let held = reservations(c).await?;
                Ok((held.is_empty() && !file.exists()).then_some(()))
            }
        },
    )
    .await
}

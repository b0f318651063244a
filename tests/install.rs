//! The README's quick start on the real control plane: `helm install` of the chart with only
//! `image.repository` set (no cert-manager, no certificate made beforehand, no local binary),
//! then a first pod of each class on each fixture set's nodes.
//!
//! `tests/cluster/up.sh` with `GPU_SHARE_CLUSTER_INSTALL=helm` installs the chart as a user
//! does, and runs the webhook and the extender as local processes with the installed
//! Deployments' own arguments (KWOK runs no containers), the webhooks called by URL. The
//! webhook keeps its own certificates there as in a pod: nothing but the chart gives it one.
//!
//! Then, one set at a time (tests/fixtures/nvidia/: the GPU Operator's defaults, the device
//! plugin chart's with and without GFD, the chart under the mixed strategy, GKE), the set's
//! nodes alone are registered, and a pod of each class that lands on some node of the set
//! (`LANDINGS`, which tests/node_sets.rs holds to the webhook's affinity and the extender's
//! fit) is admitted by the webhook and bound by kube-scheduler through the extender, onto one of
//! those nodes. Last, an extender beside a kube-scheduler newer than the API server names it, and
//! the tag to set, in a Warning event on its pod.
//!
//! Run: `cargo test --test install -- --ignored` (CI runs it; `.ci/run`).

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::cluster::{Check, Cluster, ensure, failed_scheduling, point, wait_for};
use common::nvidia::{LANDINGS, set};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

const NS: &str = "gpu-share";

/// The webhook made a CA and a serving certificate, and set every webhook's caBundle to it;
/// kube-scheduler's image is the API server's version.
async fn installed(c: &Cluster) -> Check {
    let secrets: Api<Secret> = Api::namespaced(c.client.clone(), NS);
    let ca = wait_for(
        "Secret gpu-share-ca, made by the webhook",
        Duration::from_secs(60),
        || {
            let secrets = secrets.clone();
            async move {
                let s = secrets
                    .get_opt("gpu-share-ca")
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(s.and_then(|s| s.data)
                    .and_then(|d| d.get("tls.crt").map(|b| b.0.clone())))
            }
        },
    )
    .await?;
    let serving = secrets
        .get_opt("gpu-share-tls")
        .await
        .map_err(|e| e.to_string())?
        .and_then(|s| s.data);
    ensure(
        serving.is_some_and(|d| d.contains_key("tls.crt") && d.contains_key("tls.key")),
        "Secret gpu-share-tls holds the serving certificate and key",
    )?;
    let ca = String::from_utf8_lossy(&ca).into_owned();
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(c.client.clone());
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(c.client.clone());
    let mutating_hooks = mutating
        .get("gpu-share")
        .await
        .map_err(|e| e.to_string())?
        .webhooks
        .unwrap_or_default()
        .into_iter()
        .map(|h| (h.name, h.client_config.ca_bundle));
    let validating_hooks = validating
        .get("gpu-share")
        .await
        .map_err(|e| e.to_string())?
        .webhooks
        .unwrap_or_default()
        .into_iter()
        .map(|h| (h.name, h.client_config.ca_bundle));
    let bundles: Vec<(String, Option<Vec<u8>>)> = mutating_hooks
        .chain(validating_hooks)
        .map(|(name, bundle)| (name, bundle.map(|b| b.0)))
        .collect();
    ensure(bundles.len() == 4, format!("4 webhooks, got {bundles:?}"))?;
    for (name, bundle) in &bundles {
        let pem = bundle
            .as_deref()
            .map(String::from_utf8_lossy)
            .unwrap_or_default();
        ensure(
            pem.contains(ca.trim()),
            format!("webhook {name}: its caBundle holds the CA of Secret gpu-share-ca"),
        )?;
    }

    let out = c.kubectl(&["version", "-o", "json"], None);
    let version: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    let server = version["serverVersion"]["gitVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let deployments: Api<Deployment> = Api::namespaced(c.client.clone(), NS);
    let scheduler = deployments
        .get("gpu-share-scheduler")
        .await
        .map_err(|e| e.to_string())?;
    let images: Vec<String> = scheduler
        .spec
        .and_then(|s| s.template.spec)
        .map(|s| s.containers.into_iter().filter_map(|c| c.image).collect())
        .unwrap_or_default();
    ensure(
        images.contains(&format!("registry.k8s.io/kube-scheduler:{server}"))
            && images.contains(&"registry.example.com/platform/gpu-share:0.1.0".to_string()),
        format!("the scheduler's images are kube-scheduler {server} and the image set: {images:?}"),
    )?;
    eprintln!("install: the webhook made its CA and serving certificate; kube-scheduler {server}");
    Ok(())
}

/// A pod's name for a class: `mig-1g.10gb` -> `first-mig-1g-10gb`.
fn pod_name(class: &str) -> String {
    format!("first-{}", class.replace('.', "-"))
}

/// The set's nodes alone, a first pod of each class they offer, each bound to a node it lands on.
async fn first_pods(c: &Cluster, file: &str, landings: &[(&str, &[&str])], i: usize) -> Check {
    let names: Vec<String> = set(file)
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    let out = std::process::Command::new("python3")
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cluster/nodes.py"))
        .arg(&c.dir)
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file))
        .output()
        .map_err(|e| e.to_string())?;
    ensure(
        out.status.success(),
        format!("register {file}: {}", String::from_utf8_lossy(&out.stderr)),
    )?;
    // A new webhook process: what it read of the earlier set's MIG nodes is gone.
    c.stop("webhook");
    c.start_process("webhook");
    c.wait_ready("WEBHOOK_ADMIN", Duration::from_secs(120))
        .await?;

    let ns = format!("first-pods-{i}");
    c.namespace(&ns, json!({})).await?;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    let offered: Vec<(&str, &[&str])> = landings
        .iter()
        .filter(|(_, nodes)| !nodes.is_empty())
        .copied()
        .collect();
    for (class, _) in &offered {
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name(class), "annotations": {"gpu-share": class}},
            "spec": {"containers": [{
                "name": "main", "image": "nvcr.io/nvidia/cuda:12.5.0-base-ubuntu22.04",
                "command": ["sleep", "infinity"],
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
            }]},
        }))
        .map_err(|e| e.to_string())?;
        let made = pods
            .create(&PostParams::default(), &pod)
            .await
            .map_err(|e| format!("{file}: create a {class} pod: {e}"))?;
        ensure(
            made.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("gpu-share.io/request")),
            format!("{file}: the {class} pod was admitted without gpu-share's mutation"),
        )?;
    }
    let bound = wait_for(
        &format!("{file}: every first pod bound"),
        Duration::from_secs(90),
        || {
            let pods = pods.clone();
            let offered = offered.clone();
            async move {
                let mut out = Vec::new();
                for (class, _) in &offered {
                    let p = pods
                        .get(&pod_name(class))
                        .await
                        .map_err(|e| e.to_string())?;
                    match p.spec.and_then(|s| s.node_name) {
                        Some(node) => out.push((*class, node)),
                        None => return Ok(None),
                    }
                }
                Ok(Some(out))
            }
        },
    )
    .await;
    let bound = match bound {
        Ok(b) => b,
        Err(e) => {
            let mut why = Vec::new();
            for (class, _) in &offered {
                let p = pods
                    .get(&pod_name(class))
                    .await
                    .map_err(|e| e.to_string())?;
                if p.spec.and_then(|s| s.node_name).is_none() {
                    let reason = failed_scheduling(c, &ns, &pod_name(class))
                        .await
                        .unwrap_or_else(|e| e);
                    why.push(format!("{class}: {reason}"));
                }
            }
            return Err(format!("{e}; pending: {}", why.join("; ")));
        }
    };
    for (class, node) in &bound {
        let want: BTreeSet<&str> = offered
            .iter()
            .find(|(c, _)| c == class)
            .map(|(_, n)| n.iter().copied().collect())
            .unwrap_or_default();
        ensure(
            want.contains(node.as_str()),
            format!("{file}: the {class} pod was bound to {node}, not one of {want:?}"),
        )?;
    }
    eprintln!(
        "install: {file}: {} first pods bound ({})",
        bound.len(),
        bound
            .iter()
            .map(|(c, n)| format!("{c} on {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );

    c.delete_pods(&ns).await?;
    let mut args = vec!["delete", "node", "--wait=true"];
    args.extend(names.iter().map(String::as_str));
    let out = c.kubectl(&args, None);
    ensure(
        out.status.success(),
        format!(
            "{file}: delete its nodes: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// A kube-scheduler newer than the API server is named, with the tag to set, in a Warning event
/// `KubeSchedulerVersionSkew` on the scheduler's pod: an extender started as the sidecar of a pod
/// of the installed Deployment's template whose kube-scheduler is v1.99.0.
async fn skew_named(c: &Cluster) -> Check {
    const SKEWED: &str = "gpu-share-scheduler-skewed";
    let deployments: Api<Deployment> = Api::namespaced(c.client.clone(), NS);
    let template = deployments
        .get("gpu-share-scheduler")
        .await
        .map_err(|e| e.to_string())?
        .spec
        .and_then(|s| s.template.spec)
        .ok_or("the scheduler Deployment has no pod template")?;
    let mut spec = serde_json::to_value(&template).map_err(|e| e.to_string())?;
    for container in spec["containers"].as_array_mut().into_iter().flatten() {
        if container["name"] == "kube-scheduler" {
            container["image"] = json!("registry.k8s.io/kube-scheduler:v1.99.0");
        }
    }
    // Never scheduled: the pod is there to be read.
    spec["nodeName"] = json!("no-such-node");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": SKEWED, "namespace": NS},
        "spec": spec,
    }))
    .map_err(|e| e.to_string())?;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    let _ = pods.delete(SKEWED, &Default::default()).await;
    pods.create(&PostParams::default(), &pod)
        .await
        .map_err(|e| format!("create pod {SKEWED}: {e}"))?;
    c.stop("extender");
    c.start_process_with("extender", &[("POD_NAME", SKEWED), ("POD_NAMESPACE", NS)]);
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(c.client.clone(), NS);
    let message = wait_for(
        "a KubeSchedulerVersionSkew event on the skewed scheduler pod",
        Duration::from_secs(60),
        || {
            let events = events.clone();
            async move {
                let list = events
                    .list(&kube::api::ListParams::default().fields(&format!(
                        "involvedObject.name={SKEWED},reason=KubeSchedulerVersionSkew"
                    )))
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(list.items.into_iter().find_map(|e| {
                    (e.type_.as_deref() == Some("Warning"))
                        .then_some(e.message)
                        .flatten()
                }))
            }
        },
    )
    .await;
    c.stop("extender");
    c.start_process("extender");
    let _ = pods.delete(SKEWED, &Default::default()).await;
    c.wait_ready("EXTENDER_ADMIN", Duration::from_secs(120))
        .await?;
    let message = message?;
    ensure(
        message.contains("v1.99.0") && message.contains("newer than the cluster's API server"),
        format!("the event says what is wrong and what to set: {message}"),
    )?;
    eprintln!("install: the skewed scheduler's event: {message}");
    Ok(())
}

#[tokio::test]
#[ignore = "needs Go and a few minutes: cargo test --test install -- --ignored (CI runs it)"]
async fn helm_install_with_only_the_image_set_binds_a_first_pod_of_each_class_on_every_set() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let c = Cluster::start_with_env(
        common::BIN,
        "GPU_SHARE_INSTALL_CLUSTER_DIR",
        None,
        &[
            ("GPU_SHARE_CLUSTER_INSTALL", "helm"),
            ("GPU_SHARE_CLUSTER_NODES", "none"),
        ],
    )
    .await;
    let mut failures = Vec::new();
    point(
        &mut failures,
        "the chart's certificates and scheduler",
        installed(&c),
    )
    .await;
    for (i, (file, landings)) in LANDINGS.iter().enumerate() {
        point(
            &mut failures,
            &format!("first pods on {file}"),
            first_pods(&c, file, landings, i),
        )
        .await;
    }
    point(
        &mut failures,
        "a kube-scheduler newer than the API server, named in an event",
        skew_named(&c),
    )
    .await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

//! Point 11: the webhook keeps its own certificates (`serve --keep-certs`, the kustomize
//! component keep-certs), on the real control plane: the component's RBAC grants the webhook's
//! ServiceAccount what the keeper does, by name, and nothing of others'; and a webhook process
//! keeping certificates of seconds (serving 60 s, CA 150 s) admits every pod sent to it through
//! three minutes of renewals, a CA's included, with no failed admission.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::common::cluster::{Check, Cluster, ensure, wait_for};

const NS: &str = "certs-keeper";
const CONFIG: &str = "gpu-share-keeper-test";
const WEBHOOK_SA: &str = "system:serviceaccount:gpu-share:gpu-share-webhook";

/// Kills the keeper's process however the point ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn can_i(c: &Cluster, verb: &str, what: &str) -> bool {
    let out = c.kubectl(
        &[
            "auth",
            "can-i",
            verb,
            what,
            "-n",
            "gpu-share",
            "--as",
            WEBHOOK_SA,
        ],
        None,
    );
    String::from_utf8_lossy(&out.stdout).trim() == "yes"
}

pub async fn keeps_its_certificates(c: &Cluster) -> Check {
    // The component's rights, by name.
    let rbac = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/manifests/components/keep-certs/rbac.yaml"
    );
    let out = c.kubectl(&["apply", "-f", rbac], None);
    ensure(
        out.status.success(),
        format!("apply {rbac}: {}", String::from_utf8_lossy(&out.stderr)),
    )?;
    for (verb, what) in [
        ("get", "secret/gpu-share-tls"),
        ("update", "secret/gpu-share-tls"),
        ("get", "secret/gpu-share-ca"),
        ("update", "secret/gpu-share-ca"),
        ("create", "secrets"),
        ("get", "mutatingwebhookconfiguration/gpu-share"),
        ("update", "mutatingwebhookconfiguration/gpu-share"),
        ("update", "validatingwebhookconfiguration/gpu-share"),
    ] {
        ensure(
            can_i(c, verb, what),
            format!("the webhook may not {verb} {what}"),
        )?;
    }
    for (verb, what) in [
        ("get", "secret/other"),
        ("update", "secret/other"),
        ("update", "mutatingwebhookconfiguration/other"),
        ("delete", "secret/gpu-share-tls"),
    ] {
        ensure(
            !can_i(c, verb, what),
            format!("the webhook may {verb} {what}"),
        )?;
    }

    // A webhook of the keeper's own, for one namespace.
    c.namespace(NS, json!({})).await?;
    let (port, admin) = (free_port(), free_port());
    let config = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": CONFIG},
        "webhooks": [{
            "name": "pods.keeper-test.gpu-share.io",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 5,
            "clientConfig": {"url": format!("https://127.0.0.1:{port}/mutate")},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NS}},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
        }],
    });
    let out = c.kubectl(&["apply", "-f", "-"], Some(&config.to_string()));
    ensure(
        out.status.success(),
        format!("apply {CONFIG}: {}", String::from_utf8_lossy(&out.stderr)),
    )?;
    let dir = c.dir.join("keeper");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let log =
        std::fs::File::create(c.dir.join("logs/keeper-test.log")).map_err(|e| e.to_string())?;
    let policy = c.dir.join("policy/policy.yaml");
    let child = Command::new(c.var("GPU_SHARE_BIN"))
        .args(["serve", "--role", "webhook"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
        .arg("--tls-cert")
        .arg(dir.join("tls.crt"))
        .arg("--tls-key")
        .arg(dir.join("tls.key"))
        .arg("--policy")
        .arg(&policy)
        .args(["--keep-certs", "--certs-namespace", "gpu-share"])
        .args([
            "--tls-secret",
            "keeper-test-tls",
            "--ca-secret",
            "keeper-test-ca",
        ])
        .args(["--webhook-configuration", CONFIG])
        .args([
            "--cert-validity-seconds",
            "60",
            "--ca-validity-seconds",
            "150",
        ])
        .args(["--cert-propagation-seconds", "20"])
        .env("KUBECONFIG", c.dir.join("kubeconfig"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("start the keeper's webhook: {e}"))?;
    let _running = Running(child);
    let log_tail = || {
        let text = std::fs::read_to_string(c.dir.join("logs/keeper-test.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    };
    c.wait_ready_at(
        &format!("http://127.0.0.1:{admin}"),
        Duration::from_secs(120),
    )
    .await
    .map_err(|e| format!("{e}; its log ends:\n{}", log_tail()))?;

    // Three minutes of pods, while the certificates turn over.
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    let secrets: Api<Secret> = Api::namespaced(c.client.clone(), "gpu-share");
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "keeper-probe", "annotations": {"gpu-share": "exclusive-1"}},
        "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]},
    }))
    .map_err(|e| e.to_string())?;
    let cert = |s: &Secret| {
        s.data
            .as_ref()
            .and_then(|d| d.get("tls.crt"))
            .map(|b| b.0.clone())
    };
    let (mut admitted, mut refused) = (0, Vec::new());
    let (mut cas, mut servings) = (Vec::new(), Vec::new());
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(180) {
        match pods.create(&dry, &pod).await {
            Ok(p)
                if p.metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key("gpu-share.io/request")) =>
            {
                admitted += 1
            }
            Ok(_) => refused.push("admitted without gpu-share's mutation".to_string()),
            Err(e) => refused.push(e.to_string()),
        }
        for (name, seen) in [
            ("keeper-test-ca", &mut cas),
            ("keeper-test-tls", &mut servings),
        ] {
            if let Ok(Some(s)) = secrets.get_opt(name).await
                && let Some(pem) = cert(&s)
                && !seen.contains(&pem)
            {
                seen.push(pem);
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    ensure(
        refused.is_empty(),
        format!(
            "{} of {} pods refused while the certificates turned over, e.g. {:?}",
            refused.len(),
            refused.len() + admitted,
            refused.first()
        ),
    )?;
    ensure(
        cas.len() >= 2 && servings.len() >= 4,
        format!(
            "{} CAs and {} serving certificates in three minutes: expected a CA renewal (at 100 s) and serving renewals every 40 s",
            cas.len(),
            servings.len()
        ),
    )?;
    wait_for(
        "nothing left of the point",
        Duration::from_secs(30),
        || async {
            for (kind, name) in [
                ("mutatingwebhookconfiguration", CONFIG),
                ("secret", "keeper-test-tls"),
                ("secret", "keeper-test-ca"),
            ] {
                let mut args = vec!["delete", kind, name, "--ignore-not-found"];
                if kind == "secret" {
                    args.extend(["-n", "gpu-share"]);
                }
                c.kubectl(&args, None);
            }
            Ok(Some(()))
        },
    )
    .await?;
    eprintln!(
        "point 11: {admitted} pods admitted, none refused, through {} CAs and {} serving certificates",
        cas.len(),
        servings.len()
    );
    Ok(())
}

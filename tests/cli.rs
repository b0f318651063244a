//! The binary itself: `check-policy`, `serve --dev` start-up, readiness, policy reload and
//! graceful shutdown on SIGTERM, and a clear failure without a cluster.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::serve::{free_port, http_get};
use common::{BIN, run_err, run_ok};

fn wait_for(addr: SocketAddr, path: &str, pred: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Some((200, body)) = http_get(addr, path)
            && pred(&body)
        {
            return body;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{path} never answered as expected");
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
    }
}

fn terminate(child: &mut Child) -> std::process::ExitStatus {
    let ok = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(ok.success());
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "did not stop after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn check_policy_prints_the_effective_policy_or_the_line() {
    let default = format!("{}/policies/default.yaml", env!("CARGO_MANIFEST_DIR"));
    let stdout = run_ok(["check-policy", &default]);
    assert!(
        stdout.contains("valid") && stdout.contains("schedulerName: gpu-share-scheduler"),
        "{stdout}"
    );

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        std::fs::read_to_string(&default)
            .unwrap()
            .replace("hostIPC: true", "hostIPC: sometimes"),
    )
    .unwrap();
    let stderr = run_err(["check-policy", bad.to_str().unwrap()]);
    assert!(stderr.contains("line"), "{stderr}");
    // The error names the file given, not a flag or `<input>`.
    assert!(stderr.contains(bad.to_str().unwrap()), "{stderr}");
    assert!(
        !stderr.contains("<input>") && !stderr.contains("--policy"),
        "{stderr}"
    );

    // docs/configuration.md's namespaces example is a whole policy file: the rest comes from the defaults,
    // and check-policy says which.
    let partial = dir.path().join("partial.yaml");
    std::fs::write(
        &partial,
        "namespaces:\n  - names: [research]\n    allowedClasses: [mig, mps]\n    maxGpusPerPod: 1\n",
    )
    .unwrap();
    let stdout = run_ok(["check-policy", partial.to_str().unwrap()]);
    assert!(
        stdout.contains("schedulerName: gpu-share-scheduler")
            && stdout.contains("Left out, so the embedded default's values: version, resources"),
        "{stdout}"
    );
    let empty = dir.path().join("empty-scheduler.yaml");
    std::fs::write(&empty, "schedulerName: \"\"\n").unwrap();
    let stdout = run_ok(["check-policy", empty.to_str().unwrap()]);
    assert!(
        stdout.contains("# warning: schedulerName is empty"),
        "{stdout}"
    );
}

#[test]
fn serve_dev_becomes_ready_reloads_policy_and_drains_on_sigterm() {
    let (listen, admin) = (free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    let default = std::fs::read_to_string(format!(
        "{}/policies/default.yaml",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    std::fs::write(&policy, &default).unwrap();
    let child = Command::new(BIN)
        .args([
            "serve",
            "--dev",
            "--listen",
            &listen.to_string(),
            "--admin-listen",
            &admin.to_string(),
        ])
        .args([
            "--policy",
            policy.to_str().unwrap(),
            "--policy-reload-seconds",
            "1",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut running = Running(child);
    wait_for(admin, "/readyz", |b| b == "ok\n");
    assert_eq!(http_get(admin, "/livez").unwrap().0, 200);

    // An invalid policy is refused and counted; a valid change is loaded.
    std::fs::write(&policy, "version: v2\n").unwrap();
    wait_for(admin, "/metrics", |m| {
        m.contains(r#"gpu_share_policy_reloads_total{result="invalid"} 1"#)
    });
    std::fs::write(
        &policy,
        default.replace("policy: gpu-share", "policy: binpack"),
    )
    .unwrap();
    wait_for(admin, "/metrics", |m| {
        m.contains(r#"gpu_share_policy_reloads_total{result="ok"} 1"#)
    });
    assert_eq!(
        http_get(admin, "/readyz").unwrap().0,
        200,
        "still ready after a bad reload"
    );

    let status = terminate(&mut running.0);
    assert!(status.success(), "graceful exit, got {status:?}");
}

#[test]
fn serve_without_cluster_or_dev_says_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let pair = gpu_share::certs::self_signed(&["localhost"]).unwrap();
    std::fs::write(dir.path().join("tls.crt"), pair.cert_pem).unwrap();
    std::fs::write(dir.path().join("tls.key"), pair.key_pem).unwrap();
    let out = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            &free_port().to_string(),
            "--admin-listen",
            &free_port().to_string(),
        ])
        .arg("--tls-cert")
        .arg(dir.path().join("tls.crt"))
        .arg("--tls-key")
        .arg(dir.path().join("tls.key"))
        .env("KUBECONFIG", dir.path().join("missing-kubeconfig"))
        .env("HOME", dir.path())
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no Kubernetes configuration found") && stderr.contains("--dev"),
        "{stderr}"
    );

    let out = Command::new(BIN)
        .args(["serve"])
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tls-cert is required"));

    let out = Command::new(BIN)
        .args([
            "serve",
            "--tls-cert",
            "/nonexistent.crt",
            "--tls-key",
            "/nonexistent.key",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--tls-cert: cannot read /nonexistent.crt")
    );
}

#[test]
fn status_reads_a_dev_extender_with_example_nodes() {
    let listen = free_port();
    let admin = free_port();
    let nodes = format!(
        "{}/tests/fixtures/extender/nodes.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let child = Command::new(BIN)
        .args([
            "serve",
            "--dev",
            "--nodes",
            &nodes,
            "--listen",
            &listen.to_string(),
            "--admin-listen",
            &admin.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _guard = Running(child);
    wait_for(admin, "/readyz", |b| b == "ok\n");
    for server in [format!("http://{admin}"), format!("https://{listen}")] {
        let mut args = vec!["status", "--server", &server];
        if server.starts_with("https") {
            args.push("--insecure");
        }
        let table = run_ok(&args);
        assert!(table.starts_with("NODE"), "{table}");
        for node in ["a100-mig", "h100-ts", "h100-mps", "l40s-plain"] {
            assert!(table.contains(node), "{table}");
        }
        assert!(!table.contains("cpu-1"), "{table}");
        assert!(table.contains("4 GPU nodes"), "{table}");
    }
    // kubectl's -o: wide has the mode's source and the resource; json and yaml the /v1/nodes
    // shape, the same reports either way.
    let server = format!("http://{admin}");
    let wide = run_ok(["status", "--server", &server, "-o", "wide"]);
    assert!(
        wide.starts_with("NODE") && wide.contains("SOURCE") && wide.contains("nvidia.com/gpu"),
        "{wide}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&run_ok(["status", "--server", &server, "-o", "json"])).unwrap();
    let yaml: serde_json::Value =
        serde_saphyr::from_str(&run_ok(["status", "--server", &server, "-o", "yaml"])).unwrap();
    assert_eq!(json, yaml);
    assert_eq!(json.as_array().map(Vec::len), Some(4), "{json}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&run_ok([
            "status", "--server", &server, "--json"
        ]))
        .unwrap(),
        json,
        "--json is -o json"
    );
    // --watch: the table, then again once a bind changes the ledger.
    let mut watch = Command::new(BIN)
        .args(["status", "--server", &server, "--watch"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let reader = {
        let lines = lines.clone();
        let out = watch.stdout.take().unwrap();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(l);
            }
        })
    };
    let tables = |lines: &[String]| lines.iter().filter(|l| l.starts_with("NODE ")).count();
    let deadline = Instant::now() + Duration::from_secs(20);
    while tables(&lines.lock().unwrap()) < 1 {
        assert!(Instant::now() < deadline, "no first table from --watch");
        std::thread::sleep(Duration::from_millis(100));
    }
    let bind = |uid: &str| {
        let pod = serde_json::json!({"Pod": {"metadata": {"name": "w", "namespace": "ml", "uid": uid,
            "annotations": {"gpu-share": "exclusive", "gpu-share.io/request": "exclusive"}},
            "spec": {"containers": [{"name": "c"}]}}, "NodeNames": ["l40s-plain"]});
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let f = common::serve::post(listen, "/scheduler/filter", pod.to_string().into_bytes()).await;
            assert_eq!(f.as_ref().map(|r| r.0), Ok(200), "{f:?}");
            let b = serde_json::json!({"PodName": "w", "PodNamespace": "ml", "PodUID": uid, "Node": "l40s-plain"});
            let r = common::serve::post(listen, "/scheduler/bind", b.to_string().into_bytes()).await;
            assert!(r.as_ref().is_ok_and(|r| r.1.contains("\"Error\":\"\"")), "{r:?}");
        });
    };
    bind("watch-1");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let seen = lines.lock().unwrap().clone();
        if tables(&seen) >= 2 {
            assert!(
                seen.iter().any(|l| l.contains("ml/w(exclusive)")),
                "{seen:?}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "--watch never printed the changed table: {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = watch.kill();
    let _ = watch.wait();
    let _ = reader.join();
    // Without --insecure or --ca the self-signed certificate is refused, in words that say so
    // and what to do; a server that is not there is told apart.
    let stderr = run_err(["status", "--server", &format!("https://{listen}")]);
    assert!(
        stderr.contains("certificate is not trusted") && stderr.contains("--ca"),
        "{stderr}"
    );
    drop(_guard);
    let stderr = run_err(["status", "--server", &format!("https://{listen}")]);
    assert!(
        stderr.contains("nothing is listening") && !stderr.contains("certificate"),
        "{stderr}"
    );
}

/// With no GPU nodes the totals read 0.00, never -0.00.
#[test]
fn status_of_no_gpu_nodes_prints_zero() {
    let table = gpu_share::status::render(&[]);
    assert!(
        table.contains("0 GPU nodes, 0 GPUs: 0.00 allocated, 0.00 free\n"),
        "{table}"
    );
    assert!(!table.contains("-0.00"), "{table}");
}

#[test]
fn certs_writes_a_ca_and_a_serving_certificate_for_the_service() {
    let dir = tempfile::tempdir().unwrap();
    let text = run_ok([
        "certs",
        "--namespace",
        "gpu-share",
        "--service",
        "gpu-share",
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    assert!(text.contains("caBundle:"), "{text}");
    assert!(text.contains("gpu-share.gpu-share.svc"), "{text}");
    let e = run_err([
        "certs",
        "--out",
        dir.path().to_str().unwrap(),
        "--days",
        "999999",
    ]);
    assert!(e.contains("999999") && e.contains("1..=3650"), "{e}");
    for f in ["ca.crt", "tls.crt", "tls.key"] {
        assert!(dir.path().join(f).exists(), "{f}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("tls.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let pem = std::fs::read_to_string(dir.path().join("tls.crt")).unwrap();
    let der = rustls::pki_types::pem::PemObject::from_pem_slice(pem.as_bytes())
        .map(|c: rustls::pki_types::CertificateDer<'static>| c.to_vec())
        .unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    let sans: Vec<String> = cert
        .subject_alternative_name()
        .unwrap()
        .unwrap()
        .value
        .general_names
        .iter()
        .map(|n| format!("{n}"))
        .collect();
    let joined = sans.join(" ");
    for name in [
        "gpu-share.gpu-share.svc",
        "gpu-share.gpu-share.svc.cluster.local",
        "localhost",
    ] {
        assert!(joined.contains(name), "{joined}");
    }
}

/// JSON logs: every line is one JSON object with one `message` key (a denial's text goes in
/// `denial`), so log pipelines keep both; the probes' bodies end with a newline.
#[tokio::test]
async fn json_log_lines_have_one_message_key() {
    let server = common::serve::DevServer::start(&["--log-format", "json"]);
    assert_eq!(
        http_get(server.admin, "/livez"),
        Some((200, "ok\n".to_string()))
    );
    assert_eq!(
        http_get(server.admin, "/readyz"),
        Some((200, "ok\n".to_string()))
    );
    // A denial: the annotation names a class that does not exist.
    let body = String::from_utf8(common::serve::mutate_body("deny-1"))
        .unwrap()
        .replace("timeslice-50", "timeslice-500");
    let (status, answer) = common::serve::post(server.https, "/mutate", body.into_bytes())
        .await
        .unwrap();
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("\"allowed\":false"), "{answer}");
    let deadline = Instant::now() + Duration::from_secs(5);
    let log = loop {
        let log = server.log_text();
        if log.contains("\"denied\"") || Instant::now() > deadline {
            break log;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let denied: Vec<&str> = log.lines().filter(|l| l.contains("\"denied\"")).collect();
    assert_eq!(denied.len(), 1, "{log}");
    assert!(denied[0].contains("\"denial\":"), "{}", denied[0]);
    for line in log.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(v.is_object(), "{line}");
        assert_eq!(line.matches("\"message\":").count(), 1, "{line}");
    }
}

/// `--version` names the crate version and the git revision the binary was built from.
#[test]
fn version_names_the_crate_version_and_git_revision() {
    let out = run_ok(["--version"]);
    let want = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let revision = std::env::var("GPU_SHARE_GIT_REVISION")
        .ok()
        .filter(|r| !r.is_empty())
        .unwrap_or(want);
    assert_eq!(
        out.trim(),
        format!("gpu-share {} ({revision})", env!("CARGO_PKG_VERSION"))
    );
}

/// `gpu-share reserve` that finds no single GPU fails in words, in its termination message,
/// before it needs the cluster: NVML (the stand-in library, loaded as the driver's is) sees two
/// GPUs, none, a GPU fallen off the bus, no driver; or the library is not there at all.
#[test]
fn reserve_without_exactly_one_gpu_fails_in_words() {
    use common::nvml::Gpus;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("termination-log");
    let two = [
        (0, "GPU-5b3c7e0a-1f2d-4c8b-9e6a-0d1c2b3a4f5e"),
        (1, "GPU-9f8e7d6c-1f2d-4c8b-9e6a-0d1c2b3a4f5e"),
    ];
    for (i, (gpus, words)) in [
        (Some(Gpus::Visible(&two)), "sees 2 GPUs"),
        (Some(Gpus::Visible(&[])), "sees 0 GPUs"),
        (
            Some(Gpus::Failing(15)),
            "device fell off the bus or has otherwise become inacessible",
        ),
        (Some(Gpus::NoDriver), "NVIDIA driver is not loaded"),
        (None, "cannot load or start NVML (libnvidia-ml.so.1)"),
    ]
    .into_iter()
    .enumerate()
    {
        let mut cmd = Command::new(BIN);
        cmd.args(["reserve", "--termination-log"])
            .arg(&log)
            .env("POD_NAME", "gpu-share-n1-gpu-0")
            .env("POD_NAMESPACE", "gpu-share-reservations")
            .env("KUBECONFIG", dir.path().join("absent"))
            .env_remove("KUBERNETES_SERVICE_HOST");
        if let Some(gpus) = gpus {
            let case = dir.path().join(i.to_string());
            common::nvml::give(&mut cmd, &case.join("dev"), &case.join("nvml"), gpus);
        }
        let out = cmd.output().unwrap();
        assert!(!out.status.success(), "{words}");
        let message = std::fs::read_to_string(&log).unwrap();
        assert!(message.contains(words), "{words}: {message}");
        assert!(
            message.contains("exactly") || message.contains("NVML failed"),
            "{message}"
        );
        std::fs::remove_file(&log).unwrap();
    }
}

//! The control plane of `tests/cluster/up.sh` from a test: start it (or reuse one a caller
//! started), talk to it with kube-rs and its own kubectl, stop and restart gpu-share's
//! processes, read their logs, and stop it again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{Value, json};

/// A running cluster of `tests/cluster/up.sh`.
pub struct Cluster {
    pub dir: PathBuf,
    pub env: BTreeMap<String, String>,
    pub client: kube::Client,
    /// Started here (and so stopped on drop), as opposed to handed in by GPU_SHARE_CLUSTER_DIR.
    owned: bool,
    _tmp: Option<tempfile::TempDir>,
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read_env(dir: &Path) -> Option<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(dir.join("env")).ok()?;
    Some(
        text.lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

impl Cluster {
    /// The cluster in `$GPU_SHARE_CLUSTER_DIR` when that names one up.sh started; otherwise a new
    /// one in a temporary directory, started with this test build's gpu-share binary and the
    /// nodes of tests/cluster/nodes.yaml.
    pub async fn start(bin: &str) -> Cluster {
        Cluster::start_with(bin, "GPU_SHARE_CLUSTER_DIR", None).await
    }

    /// [`Cluster::start`] with the cluster to reuse named by `reuse_var` and the nodes of
    /// `nodes` (a file of tests/cluster/, or up.sh's default).
    pub async fn start_with(bin: &str, reuse_var: &str, nodes: Option<&str>) -> Cluster {
        Cluster::start_with_env(bin, reuse_var, nodes, &[]).await
    }

    /// [`Cluster::start_with`], with up.sh given `env` too (e.g. its
    /// `GPU_SHARE_SCHEDULER_REPLICAS`).
    pub async fn start_with_env(
        bin: &str,
        reuse_var: &str,
        nodes: Option<&str>,
        env: &[(&str, &str)],
    ) -> Cluster {
        let (dir, owned, tmp) = match std::env::var(reuse_var) {
            Ok(d) if !d.is_empty() => (PathBuf::from(d), false, None),
            _ => {
                let tmp = tempfile::Builder::new()
                    .prefix("gpu-share-cluster-")
                    .tempdir()
                    .expect("a temporary directory");
                let dir = tmp.path().to_path_buf();
                let mut up = Command::new("bash");
                up.arg(repo().join("tests/cluster/up.sh"))
                    .arg(&dir)
                    .env("GPU_SHARE_BIN", bin)
                    .envs(env.iter().copied());
                if let Some(file) = nodes {
                    up.env(
                        "GPU_SHARE_CLUSTER_NODES",
                        repo().join("tests/cluster").join(file),
                    );
                }
                let status = up.status().expect("run tests/cluster/up.sh");
                if !status.success() {
                    let _ = Command::new("bash")
                        .arg(repo().join("tests/cluster/down.sh"))
                        .arg(&dir)
                        .status();
                    panic!(
                        "tests/cluster/up.sh {} failed ({status}); its output is above",
                        dir.display()
                    );
                }
                (dir, true, Some(tmp))
            }
        };
        let env = read_env(&dir).unwrap_or_else(|| {
            panic!(
                "{}/env is missing: is it a directory tests/cluster/up.sh started?",
                dir.display()
            )
        });
        let kubeconfig = Kubeconfig::read_from(dir.join("kubeconfig")).expect("DIR/kubeconfig");
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .expect("a client config from DIR/kubeconfig");
        let client = kube::Client::try_from(config).expect("a client");
        Cluster {
            dir,
            env,
            client,
            owned,
            _tmp: tmp,
        }
    }

    pub fn var(&self, key: &str) -> &str {
        self.env
            .get(key)
            .unwrap_or_else(|| panic!("{key} missing from {}/env", self.dir.display()))
    }

    /// Runs the cluster's own kubectl (the installed one is outside the version skew) with
    /// `stdin` as input.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = Command::new(self.var("KUBECTL"));
        cmd.args(args)
            .env("KUBECONFIG", self.var("KUBECONFIG"))
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("run kubectl");
        if let Some(input) = stdin {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .expect("write kubectl's stdin");
        }
        child.wait_with_output().expect("kubectl's output")
    }

    /// A namespace, with its `default` ServiceAccount (kube-controller-manager adds it too; made
    /// here so that a pod created at once does not race it). One left by an earlier run against
    /// the same cluster is reused, with these labels and without its pods.
    pub async fn namespace(&self, name: &str, labels: Value) -> Result<(), String> {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))
                .map_err(|e| e.to_string())?;
        match namespaces.create(&PostParams::default(), &ns).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {
                namespaces
                    .patch(
                        name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"labels": labels}})),
                    )
                    .await
                    .map_err(|e| format!("label namespace {name}: {e}"))?;
                self.delete_pods(name).await?;
            }
            Err(e) => return Err(format!("create namespace {name}: {e}")),
        }
        let sas: Api<ServiceAccount> = Api::namespaced(self.client.clone(), name);
        let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "default"}}))
            .map_err(|e| e.to_string())?;
        match sas.create(&PostParams::default(), &sa).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(format!("create ServiceAccount {name}/default: {e}")),
        }
    }

    /// Deletes every pod of a namespace at once (grace period 0) and waits until they are gone.
    /// The namespace stays, for the next run against the same cluster.
    pub async fn delete_pods(&self, ns: &str) -> Result<(), String> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        pods.delete_collection(&dp, &ListParams::default())
            .await
            .map_err(|e| format!("delete pods in {ns}: {e}"))?;
        wait_for(
            &format!("pods of {ns} gone"),
            Duration::from_secs(30),
            || {
                let pods = pods.clone();
                async move {
                    let n = pods
                        .list(&ListParams::default())
                        .await
                        .map_err(|e| e.to_string())?
                        .items
                        .len();
                    Ok((n == 0).then_some(()))
                }
            },
        )
        .await
    }

    fn pid_file(&self, name: &str) -> PathBuf {
        self.dir.join("pids").join(format!("{name}.pid"))
    }

    /// Whether a process up.sh started runs: its PID file is there ([`Cluster::stop`] and
    /// [`Cluster::kill`] take it away).
    pub fn started(&self, name: &str) -> bool {
        self.pid_file(name).exists()
    }

    /// Stops one process up.sh started (webhook, extender, kube-scheduler) and waits for it to exit.
    pub fn stop(&self, name: &str) {
        let path = self.pid_file(name);
        let Ok(pid) = std::fs::read_to_string(&path) else {
            return;
        };
        let pid = pid.trim().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let start = Instant::now();
        let mut killed = false;
        while Command::new("kill")
            .args(["-0", &pid])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            if start.elapsed() > Duration::from_secs(40) && !killed {
                let _ = Command::new("kill").args(["-KILL", &pid]).status();
                killed = true;
            }
            if start.elapsed() > Duration::from_secs(50) {
                panic!("{name} (PID {pid}) still there 10 s after SIGKILL");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = std::fs::remove_file(path);
    }

    /// Kills a process at once (SIGKILL: no drain, as a crash or an OOM kill).
    pub fn kill(&self, name: &str) {
        let path = self.pid_file(name);
        if let Ok(pid) = std::fs::read_to_string(&path) {
            let _ = Command::new("kill").args(["-KILL", pid.trim()]).status();
            std::thread::sleep(Duration::from_millis(200));
            let _ = std::fs::remove_file(path);
        }
    }

    /// Starts a process again with the command line up.sh gave it.
    pub fn start_process(&self, name: &str) {
        let status = Command::new("bash")
            .arg(self.dir.join("start").join(format!("{name}.sh")))
            .status()
            .expect("run the start script");
        assert!(status.success(), "start/{name}.sh failed");
    }

    /// Starts a process again with extra environment (its flags' `GPU_SHARE_*` fallbacks).
    pub fn start_process_with(&self, name: &str, env: &[(&str, &str)]) {
        let status = Command::new("bash")
            .arg(self.dir.join("start").join(format!("{name}.sh")))
            .envs(env.iter().copied())
            .status()
            .expect("run the start script");
        assert!(status.success(), "start/{name}.sh failed");
    }

    /// Waits until an admin listener's /readyz answers 200.
    pub async fn wait_ready(&self, admin_var: &str, limit: Duration) -> Result<(), String> {
        self.wait_ready_at(self.var(admin_var), limit).await
    }

    /// Waits for `/readyz` of the admin listener at `base` (`http://127.0.0.1:PORT`).
    pub async fn wait_ready_at(&self, base: &str, limit: Duration) -> Result<(), String> {
        let url = format!("{base}/readyz");
        wait_for(&format!("{url} ready"), limit, || {
            let url = url.clone();
            async move {
                let ok = Command::new("curl")
                    .args(["-sf", "-o", "/dev/null", &url])
                    .status()
                    .is_ok_and(|s| s.success());
                Ok(ok.then_some(()))
            }
        })
        .await
    }

    /// GET on an admin listener, parsed as JSON.
    pub fn admin_json(&self, admin_var: &str, path: &str) -> Result<Value, String> {
        let text = self.admin_text(admin_var, path)?;
        serde_json::from_str(&text).map_err(|e| format!("GET {path}: {e}"))
    }

    /// GET on an admin listener, as text.
    pub fn admin_text(&self, admin_var: &str, path: &str) -> Result<String, String> {
        let url = format!("{}{path}", self.var(admin_var));
        let out = Command::new("curl")
            .args(["-sf", &url])
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("GET {url} failed"));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// A process's log so far.
    pub fn log(&self, name: &str) -> String {
        std::fs::read(self.dir.join("logs").join(format!("{name}.log")))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.owned {
            let _ = Command::new("bash")
                .arg(repo().join("tests/cluster/down.sh"))
                .arg(&self.dir)
                .status();
            if std::env::var_os("GPU_SHARE_KEEP_CLUSTER_DIR").is_some()
                && let Some(tmp) = self._tmp.take()
            {
                eprintln!("cluster directory kept: {}", tmp.keep().display());
            }
        }
    }
}

/// Polls `probe` every 200 ms until it yields a value, or fails after `limit` naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut probe: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>, String>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = probe().await? {
            return Ok(v);
        }
        if start.elapsed() > limit {
            return Err(format!("timed out after {limit:?} waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The outcome of one named check: `Err` says in words what was seen.
pub type Check = Result<(), String>;

pub fn ensure(cond: bool, msg: impl Into<String>) -> Check {
    if cond { Ok(()) } else { Err(msg.into()) }
}

/// Runs one numbered point, printing its outcome; a failure is collected, not fatal, so one run
/// shows every point.
pub async fn point<F: std::future::Future<Output = Check>>(
    failures: &mut Vec<String>,
    name: &str,
    f: F,
) {
    // GPU_SHARE_CLUSTER_POINTS="8 6" runs only the points whose names start with those words
    // (for working on one point; CI runs them all).
    if let Ok(only) = std::env::var("GPU_SHARE_CLUSTER_POINTS")
        && !only
            .split_whitespace()
            .any(|p| name.starts_with(&format!("{p}.")) || name.starts_with(p))
    {
        eprintln!("cluster test: skip {name} (GPU_SHARE_CLUSTER_POINTS={only})");
        return;
    }
    let start = Instant::now();
    let result = f.await;
    let took = start.elapsed().as_secs_f64();
    match result {
        Ok(()) => eprintln!("cluster test: PASS {name} ({took:.1} s)"),
        Err(e) => {
            eprintln!("cluster test: FAIL {name} ({took:.1} s): {e}");
            failures.push(format!("{name}: {e}"));
        }
    }
}

/// A pod's UID (events name their pod by it too: they outlive pods, and tests reuse names).
pub async fn pod_uid(c: &Cluster, ns: &str, name: &str) -> Result<String, String> {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), ns);
    pods.get(name)
        .await
        .map_err(|e| format!("get pod {name}: {e}"))?
        .metadata
        .uid
        .ok_or_else(|| format!("pod {name} has no UID"))
}

/// The newest FailedScheduling event of this pod: matched by its UID too, as events outlive
/// their pods and these tests reuse pod names.
pub async fn failed_scheduling(c: &Cluster, ns: &str, name: &str) -> Result<String, String> {
    let uid = pod_uid(c, ns, name).await?;
    let events: Api<Event> = Api::namespaced(c.client.clone(), ns);
    wait_for(
        &format!("a FailedScheduling event for {name}"),
        Duration::from_secs(60),
        || {
            let events = events.clone();
            let field = format!("involvedObject.name={name},involvedObject.uid={uid}");
            async move {
                let list = events
                    .list(&ListParams::default().fields(&field))
                    .await
                    .map_err(|e| format!("list events: {e}"))?;
                Ok(list
                    .items
                    .into_iter()
                    .filter(|e| e.reason.as_deref() == Some("FailedScheduling"))
                    .filter_map(|e| e.message)
                    .next_back())
            }
        },
    )
    .await
}

/// A node's `nvidia.com/*` allocatable, as counts.
pub fn nvidia_allocatable(n: &Node) -> BTreeMap<String, u64> {
    n.status
        .as_ref()
        .and_then(|s| s.allocatable.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k.starts_with("nvidia.com/"))
        .map(|(k, q)| (k, q.0.parse().unwrap_or(0)))
        .collect()
}

/// A pod's `nvidia.com/*` limits, summed over its containers.
pub fn nvidia_limits(p: &Pod) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for c in p.spec.iter().flat_map(|s| s.containers.iter()) {
        let limits = c.resources.as_ref().and_then(|r| r.limits.clone());
        for (k, q) in limits.unwrap_or_default() {
            if k.starts_with("nvidia.com/") {
                *out.entry(k).or_default() += q.0.parse::<u64>().unwrap_or(0);
            }
        }
    }
    out
}

//! The faults, each injected and healed by the runner, with what it measured.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};

use super::churn::NS;
use super::{Shared, log_count};

/// The faults of the issue, each at least once per round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// The leader's kube-scheduler and extender SIGKILLed together (the pod lost).
    LeaderKilled,
    /// The leader's extender alone SIGKILLed (its container crashed).
    LeaderExtenderKilled,
    /// kube-apiserver stopped and started again (an upgrade).
    ApiServerRestarted,
    /// etcd stopped and started again.
    EtcdRestarted,
    /// The leader extender's API connection slowed past its bind timeout, then cut.
    ApiSlowThenCut,
    /// Every watch of both extenders answered "too old resource version" once.
    WatchExpired,
    /// The webhook SIGKILLed while pods are created.
    WebhookKilled,
    /// A rolling upgrade of the scheduler Deployment: each replica's kube-scheduler and
    /// extender stopped gracefully (SIGTERM) and started again, the follower first.
    RollingUpgrade,
}

pub const ALL: [Kind; 8] = [
    Kind::LeaderKilled,
    Kind::LeaderExtenderKilled,
    Kind::ApiServerRestarted,
    Kind::EtcdRestarted,
    Kind::ApiSlowThenCut,
    Kind::WatchExpired,
    Kind::WebhookKilled,
    Kind::RollingUpgrade,
];

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::LeaderKilled => "leader kube-scheduler+extender SIGKILLed",
            Kind::LeaderExtenderKilled => "leader extender SIGKILLed",
            Kind::ApiServerRestarted => "kube-apiserver restarted",
            Kind::EtcdRestarted => "etcd restarted",
            Kind::ApiSlowThenCut => "extender's API connection slowed, then cut",
            Kind::WatchExpired => "watches expired (410), relist",
            Kind::WebhookKilled => "webhook SIGKILLed during pod creation",
            Kind::RollingUpgrade => "rolling upgrade of both scheduler replicas",
        }
    }
}

/// One fault as injected: what, when (seconds into the run), and its measures in seconds or
/// counts.
#[derive(Debug, Clone)]
pub struct Record {
    pub kind: Kind,
    pub at: f64,
    pub detail: String,
    pub measures: BTreeMap<String, f64>,
}

/// The suffix of the replica whose kube-scheduler holds the Lease ("" or "-2"), and its
/// holder identity.
pub async fn leader(s: &Shared) -> Result<(String, String), String> {
    let api: Api<Lease> = Api::namespaced(s.c.client.clone(), "gpu-share");
    let lease = api
        .get("gpu-share-scheduler")
        .await
        .map_err(|e| format!("get Lease gpu-share/gpu-share-scheduler: {e}"))?;
    let holder = lease
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    let suffix = if holder.starts_with("gpu-share-scheduler-2_") {
        "-2"
    } else if holder.starts_with("gpu-share-scheduler-1_") {
        ""
    } else {
        return Err(format!(
            "the Lease is held by {holder:?}, no replica of ours"
        ));
    };
    Ok((suffix.to_string(), holder))
}

fn admin_var(suffix: &str) -> String {
    format!("EXTENDER_ADMIN{}", suffix.replace('-', "_"))
}

fn proxy_var(suffix: &str) -> String {
    format!("APIPROXY_CONTROL{}", suffix.replace('-', "_"))
}

/// GET on a proxy's control port.
fn proxy(s: &Shared, suffix: &str, path: &str) -> Result<Value, String> {
    let url = format!("{}{path}", s.c.var(&proxy_var(suffix)));
    let out = std::process::Command::new("curl")
        .args(["-sf", &url])
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("GET {url} failed"));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("GET {url}: {e}"))
}

/// Creates one bare pod per request, completing after a minute: pods waiting the moment a
/// fault strikes, so that the next bind can be timed.
async fn probes(s: &Shared, serial: &str) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(s.c.client.clone(), NS);
    let mut made = Vec::new();
    for (i, request) in ["mig-1g.10gb", "mps-25", "timeslice-25", "exclusive-1"]
        .iter()
        .enumerate()
    {
        let name = format!("probe-{serial}-{i}");
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "bare"},
                         "annotations": {"gpu-share": request,
                                         "pod-complete.stage.kwok.x-k8s.io/delay": "60s"}},
            "spec": {"containers": [{"name": "main", "image": "cuda"}],
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                     "restartPolicy": "Never", "terminationGracePeriodSeconds": 0}
        }))
        .expect("a Pod");
        if pods.create(&PostParams::default(), &pod).await.is_ok() {
            made.push(name);
        }
    }
    made
}

/// Seconds from `since` until some gpu-share pod of the churn is bound at or after `since_wall`
/// (PodScheduled turned True then; the API keeps whole seconds), within `limit`.
async fn next_bind(
    s: &Shared,
    since: Instant,
    since_wall: Timestamp,
    limit: Duration,
) -> Result<f64, String> {
    let pods: Api<Pod> = Api::namespaced(s.c.client.clone(), NS);
    loop {
        if let Ok(list) = pods.list(&Default::default()).await {
            let bound = list.items.iter().any(|p| {
                p.status
                    .as_ref()
                    .and_then(|st| st.conditions.as_ref())
                    .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
                    .is_some_and(|c| {
                        c.status == "True"
                            && c.last_transition_time
                                .as_ref()
                                .is_some_and(|t| t.0.as_second() >= since_wall.as_second())
                    })
            });
            if bound {
                return Ok(since.elapsed().as_secs_f64());
            }
        }
        if since.elapsed() > limit {
            return Err(format!("no pod bound within {limit:?}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the API server answers /readyz.
async fn api_ready(s: &Shared, limit: Duration) -> Result<(), String> {
    let start = Instant::now();
    while !s
        .c
        .kubectl(&["get", "--raw", "/readyz"], None)
        .status
        .success()
    {
        if start.elapsed() > limit {
            return Err(format!("kube-apiserver not ready within {limit:?}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// Keeps `names` down until released: the runner's kubelet does not restart them meanwhile.
fn hold(s: &Shared, names: &[String]) {
    s.held.lock().unwrap().extend(names.iter().cloned());
}

fn release(s: &Shared, names: &[String]) {
    let mut held = s.held.lock().unwrap();
    for n in names {
        held.remove(n);
    }
}

/// Stops a control-plane process (SIGTERM, SIGKILL after 40 s), keeps it down for `down`, starts
/// it again, and times the API's return and the first bind after it (with probes waiting):
/// (seconds from the stop until the API answered /readyz, seconds from then to the next bind).
async fn restart_control_plane(
    s: &Shared,
    name: &str,
    down: Duration,
    serial: &str,
) -> Result<(f64, f64), String> {
    let t0 = Instant::now();
    s.c.stop(name);
    tokio::time::sleep(down).await;
    s.c.start_process(name);
    api_ready(s, Duration::from_secs(120)).await?;
    let unavailable = t0.elapsed().as_secs_f64();
    let (t1, wall) = (Instant::now(), Timestamp::now());
    probes(s, serial).await;
    Ok((
        unavailable,
        next_bind(s, t1, wall, Duration::from_secs(90)).await?,
    ))
}

/// Sends SIGTERM to each of `names` at once, as kubelet stops a pod's containers, without
/// waiting.
fn terminate(s: &Shared, names: &[String]) {
    for n in names {
        if let Ok(pid) = std::fs::read_to_string(s.c.dir.join("pids").join(format!("{n}.pid"))) {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", pid.trim()])
                .status();
        }
    }
}

/// Waits until `names` (terminated) have exited, as kubelet waits out the grace period, then
/// SIGKILLs what is left; their PID files go, so that the runner's kubelet starts them again
/// once released.
async fn wait_exited(s: &Shared, names: &[String], grace: Duration) {
    let start = Instant::now();
    while names.iter().any(|n| s.alive(n) == Some(true)) && start.elapsed() < grace {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for n in names {
        s.c.kill(n);
    }
}

/// Waits until the Lease is held by someone other than `holder`: seconds since `since`.
async fn lease_moved(s: &Shared, holder: &str, since: Instant) -> Result<f64, String> {
    let api: Api<Lease> = Api::namespaced(s.c.client.clone(), "gpu-share");
    while since.elapsed() < Duration::from_secs(90) {
        if let Ok(l) = api.get("gpu-share-scheduler").await
            && let Some(h) = l.spec.and_then(|s| s.holder_identity)
            && !h.is_empty()
            && h != holder
        {
            return Ok(since.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err("the Lease did not change hands within 90 s".into())
}

/// Injects one fault, waits out its seeded hold, heals it, and measures.
pub async fn inject(
    s: &Shared,
    kind: Kind,
    rng: &mut ChaCha8Rng,
    serial: &str,
) -> Result<Record, String> {
    let at = s.started.elapsed().as_secs_f64();
    let mut m = BTreeMap::new();
    let detail;
    match kind {
        Kind::LeaderKilled => {
            let (suffix, holder) = leader(s).await?;
            let names = [
                format!("kube-scheduler{suffix}"),
                format!("extender{suffix}"),
            ];
            hold(s, &names);
            s.scrape_drift(&suffix);
            let (t0, wall) = (Instant::now(), Timestamp::now());
            for n in &names {
                s.c.kill(n);
            }
            probes(s, serial).await;
            let lease_s = lease_moved(s, &holder, t0).await?;
            let bound_s = next_bind(s, t0, wall, Duration::from_secs(90)).await?;
            m.insert("lease_taken_s".into(), lease_s);
            m.insert("failover_s".into(), bound_s);
            let down = Duration::from_secs(rng.random_range(5..=15));
            tokio::time::sleep(down).await;
            release(s, &names);
            s.c.wait_ready(&admin_var(&suffix), Duration::from_secs(90))
                .await?;
            detail = format!(
                "killed gpu-share-scheduler{}; Lease taken after {lease_s:.1} s, next pod bound after {bound_s:.1} s; the pair back after {} s more",
                if suffix.is_empty() { "-1" } else { "-2" },
                down.as_secs()
            );
        }
        Kind::LeaderExtenderKilled => {
            let (suffix, _) = leader(s).await?;
            let names = [format!("extender{suffix}")];
            hold(s, &names);
            s.scrape_drift(&suffix);
            for n in &names {
                s.c.kill(n);
            }
            probes(s, serial).await;
            // kubelet restarts a crashed container after 10 s the first time.
            tokio::time::sleep(Duration::from_secs(10)).await;
            let (t0, wall) = (Instant::now(), Timestamp::now());
            release(s, &names);
            s.c.wait_ready(&admin_var(&suffix), Duration::from_secs(90))
                .await?;
            m.insert("ready_s".into(), t0.elapsed().as_secs_f64());
            let bound_s = next_bind(s, t0, wall, Duration::from_secs(90)).await?;
            m.insert("first_bind_after_restart_s".into(), bound_s);
            detail = format!(
                "extender{suffix} down 10 s; ready {:.1} s after its restart, next pod bound after {bound_s:.1} s",
                m["ready_s"]
            );
        }
        Kind::ApiServerRestarted => {
            let (unavailable, bound_s) =
                restart_control_plane(s, "kube-apiserver", Duration::ZERO, serial).await?;
            m.insert("api_unavailable_s".into(), unavailable);
            m.insert("first_bind_after_ready_s".into(), bound_s);
            detail = format!(
                "kube-apiserver stopped (SIGTERM) and started: ready after {unavailable:.1} s, next pod bound {bound_s:.1} s later"
            );
        }
        Kind::EtcdRestarted => {
            let down = Duration::from_secs(rng.random_range(2..=6));
            let (unavailable, bound_s) = restart_control_plane(s, "etcd", down, serial).await?;
            m.insert("api_unavailable_s".into(), unavailable);
            m.insert("first_bind_after_ready_s".into(), bound_s);
            detail = format!(
                "etcd down {} s; the API ready again after {unavailable:.1} s, next pod bound {bound_s:.1} s later",
                down.as_secs()
            );
        }
        Kind::ApiSlowThenCut => {
            let (suffix, _) = leader(s).await?;
            let delay: f64 = rng.random_range(4.0..7.0);
            let slow = Duration::from_secs(rng.random_range(15..=25));
            let cut = Duration::from_secs(rng.random_range(5..=10));
            let log = format!("extender{suffix}");
            let kept = log_count(
                s,
                &log,
                "the binding call failed but the pod is bound there",
            );
            let failed = log_count(s, &log, "bind refused");
            proxy(s, &suffix, &format!("/mode?slow={delay:.1}"))?;
            probes(s, serial).await;
            tokio::time::sleep(slow).await;
            proxy(s, &suffix, "/mode?drop")?;
            tokio::time::sleep(cut).await;
            let stats = proxy(s, &suffix, "/mode?pass")?;
            m.insert(
                "binds_read_back_and_kept".into(),
                (log_count(
                    s,
                    &log,
                    "the binding call failed but the pod is bound there",
                ) - kept) as f64,
            );
            m.insert(
                "binds_failed".into(),
                (log_count(s, &log, "bind refused") - failed) as f64,
            );
            m.insert(
                "connections_dropped".into(),
                stats["dropped"].as_f64().unwrap_or(0.0),
            );
            detail = format!(
                "extender{suffix}'s API answers held {delay:.1} s for {} s (its bind timeout is 3 s), then every connection cut for {} s",
                slow.as_secs(),
                cut.as_secs()
            );
        }
        Kind::WatchExpired => {
            let mut expired = 0.0;
            let lists: Vec<usize> = ["extender", "extender-2"]
                .iter()
                .map(|n| log_count(s, n, "listed and recorded"))
                .collect();
            for suffix in ["", "-2"] {
                proxy(s, suffix, "/expire")?;
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
            for suffix in ["", "-2"] {
                expired += proxy(s, suffix, "/stats")?["watches_expired"]
                    .as_f64()
                    .unwrap_or(0.0);
                proxy(s, suffix, "/mode?pass")?;
            }
            let relists: usize = ["extender", "extender-2"]
                .iter()
                .zip(&lists)
                .map(|(n, before)| log_count(s, n, "listed and recorded") - before)
                .sum();
            m.insert("watches_expired_total".into(), expired);
            m.insert("relists".into(), relists as f64);
            if relists == 0 {
                return Err("watches expired, yet neither extender listed again".into());
            }
            detail = format!(
                "each extender's watches answered 410 Expired once; {relists} lists followed"
            );
        }
        Kind::RollingUpgrade => {
            let (leading, holder) = leader(s).await?;
            let following = if leading.is_empty() { "-2" } else { "" };
            let mut lease_s = 0.0;
            let mut bound_s = 0.0;
            let mut stopped_s = 0.0;
            for suffix in [following, leading.as_str()] {
                let names = [
                    format!("kube-scheduler{suffix}"),
                    format!("extender{suffix}"),
                ];
                hold(s, &names);
                s.scrape_drift(suffix);
                let (t0, wall) = (Instant::now(), Timestamp::now());
                terminate(s, &names);
                if suffix == leading {
                    probes(s, serial).await;
                    lease_s = lease_moved(s, &holder, t0).await?;
                    bound_s = next_bind(s, t0, wall, Duration::from_secs(90)).await?;
                }
                // The Deployment's terminationGracePeriodSeconds.
                wait_exited(s, &names, Duration::from_secs(30)).await;
                if suffix == leading {
                    stopped_s = t0.elapsed().as_secs_f64();
                }
                release(s, &names);
                s.c.wait_ready(&admin_var(suffix), Duration::from_secs(90))
                    .await?;
            }
            m.insert("lease_taken_s".into(), lease_s);
            m.insert("handover_s".into(), bound_s);
            m.insert("old_leader_gone_s".into(), stopped_s);
            detail = format!(
                "follower then leader stopped (SIGTERM) and started again; the Lease changed hands {lease_s:.1} s after the leader's SIGTERM, the next pod was bound after {bound_s:.1} s, the old leader's processes were gone after {stopped_s:.1} s"
            );
        }
        Kind::WebhookKilled => {
            let names = ["webhook".to_string()];
            hold(s, &names);
            s.c.kill("webhook");
            let pods: Api<Pod> = Api::namespaced(s.c.client.clone(), NS);
            let (mut refused, mut admitted_plain) = (0, 0);
            let mut words = String::new();
            for i in 0..4 {
                let pod: Pod = serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": format!("nowebhook-{serial}-{i}"), "labels": {"app": "bare"},
                                 "annotations": {"gpu-share": "timeslice-25"}},
                    "spec": {"containers": [{"name": "main", "image": "cuda"}],
                             "restartPolicy": "Never"}
                }))
                .expect("a Pod");
                match pods.create(&PostParams::default(), &pod).await {
                    Ok(_) => {
                        return Err(format!(
                            "an annotated pod was admitted while the webhook was down: nowebhook-{serial}-{i}"
                        ));
                    }
                    Err(kube::Error::Api(e)) => {
                        refused += 1;
                        words = e.message.clone();
                    }
                    Err(e) => return Err(format!("create while the webhook is down: {e}")),
                }
            }
            if !words.contains("pods.gpu-share.io") {
                return Err(format!(
                    "the refusal does not name the webhook in words: {words}"
                ));
            }
            for i in 0..2 {
                let pod: Pod = serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": format!("plain-{serial}-{i}"), "labels": {"app": "bare"}},
                    "spec": {"containers": [{"name": "main", "image": "busybox"}],
                             "restartPolicy": "Never",
                             "nodeSelector": {"kubernetes.io/hostname": "none"}}
                }))
                .expect("a Pod");
                match pods.create(&PostParams::default(), &pod).await {
                    Ok(_) => admitted_plain += 1,
                    Err(e) => {
                        return Err(format!(
                            "a pod without gpu-share's annotation was refused while the webhook was down: {e}"
                        ));
                    }
                }
            }
            tokio::time::sleep(Duration::from_secs(rng.random_range(3..=8))).await;
            release(s, &names);
            s.c.wait_ready("WEBHOOK_ADMIN", Duration::from_secs(60))
                .await?;
            m.insert("annotated_refused".into(), refused as f64);
            m.insert("plain_admitted".into(), admitted_plain as f64);
            let first: String = words.chars().take(160).collect();
            detail = format!(
                "{refused} annotated pods refused (\"{first}…\"), {admitted_plain} plain pods admitted"
            );
        }
    }
    Ok(Record {
        kind,
        at,
        detail,
        measures: m,
    })
}

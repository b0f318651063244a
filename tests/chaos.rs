//! The fault runner: gpu-share as shipped (two scheduler replicas electing a leader on the
//! shipped Lease, each kube-scheduler with its own extender, and the webhook) on the real control
//! plane of `tests/cluster/up.sh`, under a churn workload over every class, while faults chosen
//! by a seed strike: the leader's kube-scheduler and extender SIGKILLed together, the leader's
//! extender alone, kube-apiserver and etcd restarted, the extender's API connection slowed past
//! its bind timeout and cut (tests/cluster/apiproxy.py), its watches expired, the webhook killed
//! while pods are created, and a rolling upgrade of both scheduler replicas (SIGTERM, the
//! follower first): docs/upgrade.md's promise that no allocation is lost or doubled.
//!
//! Invariants, from the API alone: no node or GPU over capacity, per class (checked every
//! second, faults or not); nothing admitted unmutated; after each fault, once things settle,
//! every gpu-share pod bound or Pending with a reason, each extender's `/v1/nodes` equal to the
//! allocation the API implies, reservations matching their shares, and no hold of a
//! defragmentation plan outliving it (the policy moves the churn's pods: `defrag.mode: on`).
//!
//! Run: `cargo test --test chaos -- --ignored --nocapture` (one round of the seven faults, seed
//! 33; CI runs it). `GPU_SHARE_CHAOS_SEED=N|random`, `GPU_SHARE_CHAOS_SECONDS=S` (more rounds
//! until S seconds), `GPU_SHARE_CHAOS_REPORT=FILE` (the report as JSON),
//! `GPU_SHARE_CHAOS_FAULTS="etcd rolling"` (only the faults whose names hold those words),
//! `GPU_SHARE_CHAOS_CLUSTER_DIR=DIR` (a cluster `up.sh` started with
//! GPU_SHARE_SCHEDULER_REPLICAS=2 and tests/cluster/workload-nodes.yaml). `benches/faults.py`
//! runs it for an hour.

#[path = "chaos/churn.rs"]
mod churn;
mod common;
#[path = "chaos/faults.rs"]
mod faults;
#[path = "chaos/world.rs"]
mod world;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::reserve::Kubelet;
use k8s_openapi::jiff::Timestamp;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};

/// The seed CI runs with.
const CI_SEED: u64 = 33;
/// How long a reservation may hold a GPU with no share on it, or a share sit on a GPU no
/// reservation holds, before it counts: the policy's release grace (5 s here), the controller's
/// 2 s tick, and a leader failover (kube-scheduler's 15 s Lease and 2 s retry) while no
/// controller acts.
const RESERVATION_GRACE: Duration = Duration::from_secs(60);
/// A pod younger than this may be Pending without a reason yet (no scheduler has tried it).
const REASON_GRACE_SECONDS: i64 = 30;
/// How long things may take to settle after a fault healed.
const SETTLE: Duration = Duration::from_secs(150);
/// The processes a kubelet would restart: gpu-share's and the scheduler's containers, and
/// kube-controller-manager's static pod (like kube-scheduler, it exits when it loses its Lease).
const SUPERVISED: [&str; 6] = [
    "kube-controller-manager",
    "webhook",
    "extender",
    "extender-2",
    "kube-scheduler",
    "kube-scheduler-2",
];

/// kubelet's restart back-off: a container that exits by itself starts again at once the first
/// time, then after 10 s, 20 s and so on, up to kubelet's `crashLoopBackOff.maxContainerRestartPeriod`;
/// one that ran 10 minutes before it exited starts the count afresh. That maximum is 30 s here,
/// not the default 5 minutes: the runner strikes a fault every 15-40 s, and with 5 minutes a
/// scheduler replica that lost its Lease in one outage was still backing off when the next fault
/// killed the other (no leader for 90 s: the runner's own doing, not a finding).
#[derive(Debug, Default)]
struct CrashLoop {
    /// Exits since the count last started afresh.
    exits: u32,
    started: Option<Instant>,
    /// When it may start again, after an exit.
    due: Option<Instant>,
}

impl CrashLoop {
    const FIRST: Duration = Duration::from_secs(10);
    const MAX: Duration = Duration::from_secs(30);
    const RESET: Duration = Duration::from_secs(600);

    /// An exit at `now`: how long until it may start again.
    fn exited(&mut self, now: Instant) -> Duration {
        if self
            .started
            .is_some_and(|t| now.saturating_duration_since(t) >= Self::RESET)
        {
            self.exits = 0;
        }
        let delay = match self.exits {
            0 => Duration::ZERO,
            n => Self::FIRST
                .saturating_mul(1 << (n - 1).min(16))
                .min(Self::MAX),
        };
        self.exits += 1;
        self.due = Some(now + delay);
        delay
    }

    fn may_start(&self, now: Instant) -> bool {
        self.due.is_none_or(|d| now >= d)
    }

    fn start(&mut self, now: Instant) {
        self.started = Some(now);
        self.due = None;
    }
}

#[test]
fn the_runners_kubelet_backs_off_a_crash_loop_as_kubelet_does() {
    let t0 = Instant::now();
    let mut c = CrashLoop::default();
    let mut delays = Vec::new();
    let mut now = t0;
    for _ in 0..8 {
        c.start(now);
        now += Duration::from_secs(1);
        let d = c.exited(now);
        assert!(!c.may_start(now) || d.is_zero());
        delays.push(d.as_secs());
        now += d;
        assert!(c.may_start(now));
    }
    assert_eq!(delays, [0, 10, 20, 30, 30, 30, 30, 30]);
    // Ten minutes of running start the count afresh.
    c.start(now);
    assert_eq!(c.exited(now + CrashLoop::RESET), Duration::ZERO);
}

/// A pod's wait: created, bound (PodScheduled True), still there.
#[derive(Debug, Clone)]
pub struct Wait {
    created: Timestamp,
    bound: Option<Timestamp>,
    gone: bool,
}

/// What the runner's tasks share.
pub struct Shared {
    pub c: Cluster,
    pub started: Instant,
    /// Processes kept down by a fault: the runner's kubelet leaves them.
    pub held: Mutex<BTreeSet<String>>,
    paused: AtomicBool,
    stop: AtomicBool,
    /// Processes that exited without being killed, and when (seconds into the run).
    exits: Mutex<Vec<String>>,
    violations: Mutex<Vec<String>>,
    waits: Mutex<BTreeMap<String, Wait>>,
    counts: Mutex<churn::Counts>,
    /// `gpu_share_ledger_drift_total` by kind, summed over the extenders' lifetimes.
    drift: Mutex<BTreeMap<String, f64>>,
    capacity_checks: AtomicU64,
    /// The most shares the two-GPU node the device plugin time-slices (`a10-ts4x2`) held at once:
    /// at 4 its GPUs are full of `timeslice-40` shares and a fifth must wait.
    multi_gpu_time_sliced_most: AtomicU64,
    /// Since when each reservation mismatch (by UID) has been seen.
    mismatch_since: Mutex<BTreeMap<String, Instant>>,
    /// The runner's kubelet's back-off, per supervised process.
    crash_loops: Mutex<BTreeMap<&'static str, CrashLoop>>,
}

/// How many lines of a process's log contain `words`.
pub fn log_count(s: &Shared, name: &str, words: &str) -> usize {
    s.c.log(name).lines().filter(|l| l.contains(words)).count()
}

fn parse_drift(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter_map(|l| l.strip_prefix("gpu_share_ledger_drift_total{result=\""))
        .filter_map(|rest| {
            let (kind, value) = rest.split_once("\"} ")?;
            Some((kind.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

impl Shared {
    fn violation(&self, what: String) {
        let at = self.started.elapsed().as_secs_f64();
        eprintln!("fault runner: VIOLATION at {at:.0} s: {what}");
        self.violations
            .lock()
            .unwrap()
            .push(format!("{at:.0} s: {what}"));
    }

    /// Reads an extender's drift counters, before it is killed or at the end: what its process
    /// counted is added to the run's totals (a process that exits by itself takes its counts
    /// with it).
    pub fn scrape_drift(&self, suffix: &str) {
        let var = format!("EXTENDER_ADMIN{}", suffix.replace('-', "_"));
        if let Ok(text) = self.c.admin_text(&var, "/metrics") {
            let mut total = self.drift.lock().unwrap();
            for (k, v) in parse_drift(&text) {
                *total.entry(k).or_default() += v;
            }
        }
    }

    /// Whether a process of up.sh's runs (`None`: no PID file, so not started or stopped).
    pub fn alive(&self, name: &str) -> Option<bool> {
        let pid =
            std::fs::read_to_string(self.c.dir.join("pids").join(format!("{name}.pid"))).ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).ok();
        // A zombie (state Z, after the ')' of the name) has exited.
        Some(stat.is_some_and(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
        }))
    }

    fn start(&self, name: &str) {
        if name.starts_with("extender") {
            self.c
                .start_process_with(name, &[("GPU_SHARE_RESERVATION_IMAGE", "gpu-share:test")]);
        } else {
            self.c.start_process(name);
        }
    }

    /// The runner's kubelet: a container that exited is started again, with kubelet's back-off,
    /// unless a fault holds it.
    fn supervise(&self) {
        for name in SUPERVISED {
            if self.held.lock().unwrap().contains(name) {
                continue;
            }
            let now = Instant::now();
            let mut loops = self.crash_loops.lock().unwrap();
            let crash_loop = loops.entry(name).or_default();
            match self.alive(name) {
                Some(true) => continue,
                Some(false) => {
                    let at = self.started.elapsed().as_secs_f64();
                    let tail: String = self
                        .c
                        .log(name)
                        .lines()
                        .rev()
                        .take(3)
                        .collect::<Vec<_>>()
                        .join(" | ");
                    let delay = crash_loop.exited(now);
                    eprintln!(
                        "fault runner: {name} exited by itself at {at:.0} s, restarted in {} s: {tail}",
                        delay.as_secs()
                    );
                    self.exits.lock().unwrap().push(format!(
                        "{name} at {at:.0} s: {}",
                        tail.chars().take(400).collect::<String>()
                    ));
                    let _ =
                        std::fs::remove_file(self.c.dir.join("pids").join(format!("{name}.pid")));
                }
                None => {}
            }
            if crash_loop.may_start(now) {
                crash_loop.start(now);
                drop(loops);
                self.start(name);
            }
        }
    }

    fn record_waits(&self, w: &world::World) {
        let mut waits = self.waits.lock().unwrap();
        let present: BTreeSet<&str> = w.pods.iter().map(|p| p.uid.as_str()).collect();
        for p in w.pods.iter().filter(|p| p.namespace == churn::NS) {
            let (Some(created), Some(_)) = (p.created, &p.request) else {
                continue;
            };
            let e = waits.entry(p.uid.clone()).or_insert(Wait {
                created,
                bound: None,
                gone: false,
            });
            if let Some((status, _, Some(t))) = &p.scheduled
                && status == "True"
                && e.bound.is_none()
            {
                e.bound = Some(*t);
            }
        }
        for (uid, e) in waits.iter_mut() {
            e.gone = !present.contains(uid.as_str());
        }
    }

    /// A reservation without shares, or a share without its reservation, counts once it has
    /// lasted [`RESERVATION_GRACE`] (and again each grace after).
    fn check_reservations(&self, w: &world::World) {
        let now = Instant::now();
        let found = w.reservation_mismatches();
        let overdue: Vec<String> = {
            let mut since = self.mismatch_since.lock().unwrap();
            since.retain(|k, _| found.contains_key(k));
            found
                .into_iter()
                .filter_map(|(k, words)| {
                    let first = since.entry(k).or_insert(now);
                    (now - *first > RESERVATION_GRACE).then(|| {
                        *first = now;
                        format!("{words} for over {} s", RESERVATION_GRACE.as_secs())
                    })
                })
                .collect()
        };
        for words in overdue {
            self.violation(words);
        }
    }
}

/// Every second: the kubelet's part (containers restarted, reservation pods run), the capacity
/// invariants, and a churn step unless paused.
async fn background(s: Arc<Shared>, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x636875726e);
    let mut serial = 0u64;
    let mut kubelet = match Kubelet::new(&s.c) {
        Ok(k) => Some(k),
        Err(e) => {
            s.violation(format!("the reservation kubelet: {e}"));
            None
        }
    };
    let mut reported: BTreeSet<String> = BTreeSet::new();
    while !s.stop.load(Ordering::Relaxed) {
        s.supervise();
        if let Some(k) = kubelet.as_mut() {
            let _ = k.tick(&s.c).await;
        }
        if let Ok(w) = world::read(&s.c).await {
            for v in w.over_capacity().into_iter().chain(w.unmutated()) {
                if reported.insert(v.clone()) {
                    s.violation(v);
                }
            }
            s.check_reservations(&w);
            s.record_waits(&w);
            s.capacity_checks.fetch_add(1, Ordering::Relaxed);
            let on_a10 = w.bound().get("a10-ts4x2").map_or(0, Vec::len) as u64;
            s.multi_gpu_time_sliced_most
                .fetch_max(on_a10, Ordering::Relaxed);
        }
        if !s.paused.load(Ordering::Relaxed) {
            let mut counts = s.counts.lock().unwrap().clone();
            churn::step(&s.c, &mut rng, &mut serial, &mut counts).await;
            *s.counts.lock().unwrap() = counts;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The policy's defragmentation under churn: moving, in the churn's namespace, with plans that
/// lapse well within [`SETTLE`] (a plan under way holds its targets: after a settle, none may).
const DEFRAG: [(&str, &str); 4] = [
    ("  mode: off\n", "  mode: on\n"),
    ("  namespaces: []\n", "  namespaces: [chaos]\n"),
    ("  cooldownSeconds: 600\n", "  cooldownSeconds: 30\n"),
    ("  planTimeoutSeconds: 300\n", "  planTimeoutSeconds: 60\n"),
];

/// The policy file the local processes read (hot-reloaded): per-GPU time-slicing on or off, a 5
/// s release grace, and defragmentation moving pods ([`DEFRAG`]).
fn set_per_gpu(c: &Cluster, on: bool) -> Result<(), String> {
    let path = c.dir.join("policy/policy.yaml");
    let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
    let (from, to) = if on {
        ("  timeslice: false\n", "  timeslice: true\n")
    } else {
        ("  timeslice: true\n", "  timeslice: false\n")
    };
    let mut out = text.replacen(from, to, 1);
    out = out.replacen(
        "  releaseAfterSeconds: 30\n",
        "  releaseAfterSeconds: 5\n",
        1,
    );
    if !out.contains(to) || !out.contains("  releaseAfterSeconds: 5\n") {
        return Err(format!(
            "the policy file has no {from:?} or releaseAfterSeconds"
        ));
    }
    for (from, to) in DEFRAG {
        out = out.replacen(from, to, 1);
        if !out.contains(to) {
            return Err(format!("the policy file has no {from:?}"));
        }
    }
    if out != text {
        std::fs::write(&path, out).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Churn paused until both extenders are ready and equal the API, every gpu-share pod is bound
/// or Pending with a reason, and reservations match their shares: seconds taken, or what still
/// differed.
async fn settle(s: &Shared) -> Result<f64, String> {
    s.paused.store(true, Ordering::Relaxed);
    let start = Instant::now();
    let outcome = loop {
        let mut diffs = Vec::new();
        match world::read(&s.c).await {
            Ok(w) => {
                for var in ["EXTENDER_ADMIN", "EXTENDER_ADMIN_2"] {
                    match s.c.admin_json(var, "/v1/nodes") {
                        Ok(ledger) => {
                            diffs.extend(
                                w.ledger_differences(&ledger)
                                    .into_iter()
                                    .map(|d| format!("{var}: {d}")),
                            );
                            diffs.extend(
                                promises(&ledger)
                                    .into_iter()
                                    .map(|d| format!("{var}: a hold outlived its plan: {d}")),
                            );
                        }
                        Err(e) => diffs.push(format!("{var}: {e}")),
                    }
                }
                diffs.extend(w.unaccounted(&[churn::NS], REASON_GRACE_SECONDS));
                diffs.extend(w.reservation_mismatches().into_values());
            }
            Err(e) => diffs.push(e),
        }
        if diffs.is_empty() {
            break Ok(start.elapsed().as_secs_f64());
        }
        if start.elapsed().as_secs() / 30 != (start.elapsed().as_secs() + 1) / 30 {
            eprintln!(
                "fault runner:   not settled after {} s: {}",
                start.elapsed().as_secs(),
                diffs.join("; ")
            );
        }
        if start.elapsed() > SETTLE {
            break Err(format!(
                "not settled within {} s: {}",
                SETTLE.as_secs(),
                diffs.join("; ")
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    s.paused.store(false, Ordering::Relaxed);
    outcome
}

/// The holds defragmentation's plans keep for moved pods' replacements in an extender's
/// `/v1/nodes` (`room for the replacement of ns/name` on a node), with their nodes. Churn is
/// paused while a settle waits, and a plan lapses within [`DEFRAG`]'s timeout: none may remain.
fn promises(ledger: &Value) -> Vec<String> {
    ledger
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|n| {
            n["pods"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(move |p| {
                    let name = p["name"].as_str()?;
                    name.starts_with("room for the replacement of ")
                        .then(|| format!("{name} on {}", n["name"].as_str().unwrap_or_default()))
                })
        })
        .collect()
}

/// How many of defragmentation's events of each reason the churn's namespace saw.
async fn defrag_events(c: &Cluster) -> BTreeMap<String, usize> {
    let events: kube::Api<k8s_openapi::api::core::v1::Event> =
        kube::Api::namespaced(c.client.clone(), churn::NS);
    let mut out = BTreeMap::new();
    if let Ok(list) = events.list(&kube::api::ListParams::default()).await {
        for e in list.items {
            if let Some(r) = e.reason.filter(|r| r.starts_with("GpuShareDefrag")) {
                *out.entry(r).or_default() += e.count.unwrap_or(1).max(1) as usize;
            }
        }
    }
    out
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

async fn prepare(c: &Cluster) -> Result<(), String> {
    // What an earlier run against this cluster left: its workloads first (they would recreate
    // their pods), then their pods.
    let _ = c.kubectl(
        &[
            "-n",
            churn::NS,
            "delete",
            "deployment,job",
            "--all",
            "--timeout=60s",
        ],
        None,
    );
    c.namespace(churn::NS, json!({})).await?;
    // The per-GPU node, and a multi-GPU node the device plugin time-slices.
    for file in ["per-gpu-node.yaml", "time-sliced-node.yaml"] {
        let nodes = format!("{}/tests/cluster/{file}", env!("CARGO_MANIFEST_DIR"));
        let out = std::process::Command::new("python3")
            .arg(format!(
                "{}/tests/cluster/nodes.py",
                env!("CARGO_MANIFEST_DIR")
            ))
            .arg(&c.dir)
            .arg(&nodes)
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "nodes.py {file}: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    let _ = c.kubectl(
        &["apply", "-f", "-"],
        Some(r#"{"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"}"#),
    );
    set_per_gpu(c, true)?;
    churn::prepare(c).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs Go, root (unshare) and a few minutes: cargo test --test chaos -- --ignored (CI runs it)"]
async fn faults_on_the_real_control_plane_overcommit_nothing() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let seed = match std::env::var("GPU_SHARE_CHAOS_SEED").ok().as_deref() {
        None | Some("") => CI_SEED,
        Some("random") => rand::rng().random(),
        Some(n) => n.parse().expect("GPU_SHARE_CHAOS_SEED: a number or random"),
    };
    let seconds: u64 = std::env::var("GPU_SHARE_CHAOS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    eprintln!(
        "fault runner: seed {seed} (replay: GPU_SHARE_CHAOS_SEED={seed}), {}",
        if seconds == 0 {
            "one round of every fault".to_string()
        } else {
            format!("rounds for {seconds} s")
        }
    );
    let c = Cluster::start_with_env(
        common::BIN,
        "GPU_SHARE_CHAOS_CLUSTER_DIR",
        Some("workload-nodes.yaml"),
        &[("GPU_SHARE_SCHEDULER_REPLICAS", "2")],
    )
    .await;
    assert_eq!(
        c.env.get("SCHEDULER_REPLICAS").map(String::as_str),
        Some("2"),
        "the cluster must run two scheduler replicas (up.sh with GPU_SHARE_SCHEDULER_REPLICAS=2)"
    );
    prepare(&c)
        .await
        .expect("the churn's namespace, nodes and policy");
    // Proxies passing everything (a run against the same cluster may have stopped mid-fault).
    for var in ["APIPROXY_CONTROL", "APIPROXY_CONTROL_2"] {
        let url = format!("{}/mode?pass", c.var(var));
        let ok = std::process::Command::new("curl")
            .args(["-sf", "-o", "/dev/null", &url])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "GET {url} failed");
    }
    // Both extenders told the reservation image (they run outside a pod and cannot read it).
    for name in ["extender", "extender-2"] {
        c.stop(name);
        c.start_process_with(name, &[("GPU_SHARE_RESERVATION_IMAGE", "gpu-share:test")]);
    }
    for var in ["EXTENDER_ADMIN", "EXTENDER_ADMIN_2"] {
        c.wait_ready(var, Duration::from_secs(90))
            .await
            .expect("extenders ready");
    }
    let s = Arc::new(Shared {
        c,
        started: Instant::now(),
        held: Mutex::new(BTreeSet::new()),
        paused: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        exits: Mutex::new(Vec::new()),
        violations: Mutex::new(Vec::new()),
        waits: Mutex::new(BTreeMap::new()),
        counts: Mutex::new(churn::Counts::default()),
        drift: Mutex::new(BTreeMap::new()),
        capacity_checks: AtomicU64::new(0),
        multi_gpu_time_sliced_most: AtomicU64::new(0),
        mismatch_since: Mutex::new(BTreeMap::new()),
        crash_loops: Mutex::new(BTreeMap::new()),
    });
    let bg = tokio::spawn(background(s.clone(), seed));
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    tokio::time::sleep(Duration::from_secs(20)).await;
    let mut settles = Vec::new();
    match settle(&s).await {
        Ok(t) => settles.push(t),
        Err(e) => s.violation(format!("before any fault: {e}")),
    }
    let only = std::env::var("GPU_SHARE_CHAOS_FAULTS")
        .ok()
        .filter(|f| !f.trim().is_empty());
    let mut records = Vec::new();
    let mut serial = 0;
    let mut per_gpu = true;
    'rounds: loop {
        let mut order = faults::ALL.to_vec();
        order.shuffle(&mut rng);
        // GPU_SHARE_CHAOS_FAULTS="rolling etcd" runs only the faults whose names contain those
        // words (for working on one; CI runs them all).
        if let Some(only) = &only {
            order.retain(|k| only.split_whitespace().any(|w| k.name().contains(w)));
        }
        for kind in order {
            tokio::time::sleep(Duration::from_secs(rng.random_range(3..=10))).await;
            // Time-slicing alternates between the device plugin's replicas and the per-GPU
            // form, so both run under faults.
            per_gpu = !per_gpu;
            if let Err(e) = set_per_gpu(&s.c, per_gpu) {
                s.violation(e);
            }
            serial += 1;
            eprintln!(
                "fault runner: [{:.0} s] {} (time-slicing {})",
                s.started.elapsed().as_secs_f64(),
                kind.name(),
                if per_gpu {
                    "per GPU"
                } else {
                    "by the device plugin"
                }
            );
            match faults::inject(&s, kind, &mut rng, &serial.to_string()).await {
                Ok(r) => {
                    eprintln!("fault runner:   {}", r.detail);
                    records.push(r);
                }
                Err(e) => {
                    s.violation(format!("{}: {e}", kind.name()));
                    s.held.lock().unwrap().clear();
                }
            }
            match settle(&s).await {
                Ok(t) => {
                    eprintln!("fault runner:   settled after {t:.1} s, invariants hold");
                    settles.push(t);
                }
                Err(e) => s.violation(format!("after {}: {e}", kind.name())),
            }
        }
        if s.started.elapsed().as_secs() >= seconds {
            break 'rounds;
        }
    }
    for suffix in ["", "-2"] {
        s.scrape_drift(suffix);
    }
    s.stop.store(true, Ordering::Relaxed);
    let _ = bg.await;
    let mut report = report(&s, seed, &records, &settles);
    report["defragmentation_events"] = json!(defrag_events(&s.c).await);
    eprintln!(
        "fault runner: report {}",
        serde_json::to_string_pretty(&report).unwrap()
    );
    if let Ok(path) = std::env::var("GPU_SHARE_CHAOS_REPORT") {
        std::fs::write(&path, serde_json::to_string_pretty(&report).unwrap())
            .expect("write the report");
    }
    let violations = s.violations.lock().unwrap().clone();
    let injected: BTreeSet<faults::Kind> = records.iter().map(|r| r.kind).collect();
    assert!(
        violations.is_empty(),
        "seed {seed}: {} violation(s):\n{}",
        violations.len(),
        violations.join("\n")
    );
    assert_eq!(
        injected.len(),
        if only.is_some() {
            injected.len()
        } else {
            faults::ALL.len()
        },
        "seed {seed}: not every fault was injected: {injected:?}"
    );
    assert!(
        s.capacity_checks.load(Ordering::Relaxed) > 30,
        "too few capacity checks"
    );
}

fn report(s: &Shared, seed: u64, records: &[faults::Record], settles: &[f64]) -> Value {
    let waits = s.waits.lock().unwrap().clone();
    let mut waited: Vec<f64> = waits
        .values()
        .filter_map(|w| Some((w.bound?.as_second() - w.created.as_second()) as f64))
        .collect();
    waited.sort_by(f64::total_cmp);
    let never: usize = waits
        .values()
        .filter(|w| w.bound.is_none() && w.gone)
        .count();
    let pending: usize = waits
        .values()
        .filter(|w| w.bound.is_none() && !w.gone)
        .count();
    let mut by_kind: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
    for r in records {
        by_kind.entry(r.kind.name()).or_default().push(json!({
            "at_s": (r.at * 10.0).round() / 10.0,
            "detail": r.detail,
            "measures": r.measures,
        }));
    }
    let measured = |key: &str| -> Vec<f64> {
        records
            .iter()
            .filter_map(|r| r.measures.get(key).copied())
            .collect()
    };
    let counts = s.counts.lock().unwrap().clone();
    json!({
        "seed": seed,
        "seconds": s.started.elapsed().as_secs(),
        "faults_injected": records.len(),
        "faults": by_kind,
        "failover_s": measured("failover_s"),
        "handover_s": measured("handover_s"),
        "checks": {
            "capacity_checks": s.capacity_checks.load(Ordering::Relaxed),
            "settled_checks": settles.len(),
            "settle_s_max": settles.iter().copied().fold(0.0, f64::max),
            "multi_gpu_time_sliced_most_pods": s.multi_gpu_time_sliced_most.load(Ordering::Relaxed),
        },
        "pods": {
            "bound": waited.len(),
            "wait_s_p50": percentile(&waited, 0.5),
            "wait_s_p95": percentile(&waited, 0.95),
            "wait_s_max": waited.last().copied().unwrap_or(0.0),
            "waited_over_5s": waited.iter().filter(|w| **w > 5.0).count(),
            "waited_over_30s": waited.iter().filter(|w| **w > 30.0).count(),
            "deleted_before_bound": never,
            "pending_at_end": pending,
        },
        "churn": {
            "scaled": counts.scaled, "jobs": counts.jobs,
            "bare_created": counts.bare_created, "bare_deleted": counts.bare_deleted,
            "refused": counts.refused,
        },
        "drift": *s.drift.lock().unwrap(),
        "unexpected_exits": *s.exits.lock().unwrap(),
        "violations": *s.violations.lock().unwrap(),
    })
}

//! The load generator behind `benches/run.sh`: HTTPS clients shaped like gpu-share's callers.
//!
//! ```text
//! load nodes --count 5000 --out nodes.json
//! load fill --url https://127.0.0.1:8443 --nodes nodes.json --pods 150000
//! load rate --url https://127.0.0.1:8443/mutate --body a.json --body b.json --rate 2000 --duration 20
//! load closed --url https://127.0.0.1:8443/mutate --body a.json --connections 8 --duration 10
//! load extender --url https://127.0.0.1:8443 --nodes nodes.json --verb prioritize --requests 2000
//! ```
//!
//! Every command prints one JSON object on stdout. Latency is measured client-side from the
//! moment a request was due (fixed-rate runs: its slot in the schedule, so a stalled server is
//! charged for the requests that waited behind it) to the end of the reply; the server's own
//! time comes from its `Server-Timing` header when it sends one. Connections use HTTP/2 by
//! default, as kube-apiserver's webhook client and kube-scheduler's extender client do.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Parser, Subcommand};
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use serde_json::{Value, json};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Clone)]
struct Conn {
    /// HTTP/1.1 instead of HTTP/2.
    #[arg(long)]
    http1: bool,
    /// Connections (requests are spread over them).
    #[arg(long, default_value_t = 8)]
    connections: usize,
}

#[derive(Subcommand)]
enum Command {
    /// Writes a NodeList of GPU nodes: 60% time-slicing x4, 20% MPS x4, 10% MIG mixed A100
    /// (7x 1g.10gb per GPU), 10% plain L40S, 8 GPUs each.
    Nodes {
        #[arg(long, default_value_t = 5000)]
        count: usize,
        #[arg(long)]
        out: PathBuf,
    },
    /// Binds pods through the extender's wire (a filter over 16 random nodes, then a bind to
    /// the first that fits), until `pods` are bound or nothing fits.
    Fill {
        #[arg(long)]
        url: String,
        #[arg(long)]
        nodes: PathBuf,
        #[arg(long, default_value_t = 150_000)]
        pods: usize,
        #[command(flatten)]
        conn: Conn,
    },
    /// Posts the bodies round-robin at a fixed rate.
    Rate {
        #[arg(long)]
        url: String,
        #[arg(long, required = true)]
        body: Vec<PathBuf>,
        #[arg(long)]
        rate: f64,
        #[arg(long, default_value_t = 20.0)]
        duration: f64,
        #[arg(long, default_value_t = 2.0)]
        warmup: f64,
        #[command(flatten)]
        conn: Conn,
    },
    /// Posts the bodies back to back on every connection: the most the server answers.
    Closed {
        #[arg(long)]
        url: String,
        #[arg(long, required = true)]
        body: Vec<PathBuf>,
        #[arg(long, default_value_t = 10.0)]
        duration: f64,
        #[arg(long, default_value_t = 2.0)]
        warmup: f64,
        #[command(flatten)]
        conn: Conn,
    },
    /// kube-scheduler's calls: filter or prioritize with every node's name (`nodeCacheCapable`),
    /// one at a time on one kept-alive connection, each for a new pod of a mix of classes.
    Extender {
        #[arg(long)]
        url: String,
        #[arg(long)]
        nodes: PathBuf,
        #[arg(long, default_value = "prioritize")]
        verb: String,
        #[arg(long, default_value_t = 2000)]
        requests: usize,
        #[arg(long)]
        http1: bool,
    },
}

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let out = rt.block_on(async move {
        match cli.command {
            Command::Nodes { count, out } => write_nodes(count, &out),
            Command::Fill {
                url,
                nodes,
                pods,
                conn,
            } => fill(&url, &nodes, pods, &conn).await,
            Command::Rate {
                url,
                body,
                rate,
                duration,
                warmup,
                conn,
            } => fixed_rate(&url, &bodies(&body), rate, duration, warmup, &conn).await,
            Command::Closed {
                url,
                body,
                duration,
                warmup,
                conn,
            } => closed(&url, &bodies(&body), duration, warmup, &conn).await,
            Command::Extender {
                url,
                nodes,
                verb,
                requests,
                http1,
            } => extender(&url, &nodes, &verb, requests, http1).await,
        }
    });
    match out {
        Ok(v) => println!("{v}"),
        Err(e) => {
            eprintln!("load: {e}");
            std::process::exit(1);
        }
    }
}

fn bodies(paths: &[PathBuf]) -> Vec<Bytes> {
    paths
        .iter()
        .map(|p| Bytes::from(std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))))
        .collect()
}

// ---- nodes --------------------------------------------------------------------------------------

fn gpu_node(name: &str, labels: Value, alloc: Value) -> Value {
    let mut lab = json!({"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                         "nvidia.com/gpu.present": "true",
                         "nvidia.com/cuda.driver-version.full": "550.107.02"});
    for (k, v) in labels.as_object().unwrap() {
        lab[k] = v.clone();
    }
    let mut res = json!({"cpu": "128", "memory": "1056964608Ki", "pods": "110"});
    for (k, v) in alloc.as_object().unwrap() {
        res[k] = v.clone();
    }
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": lab},
           "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
           "status": {"capacity": res.clone(), "allocatable": res}})
}

fn node_list(count: usize) -> Value {
    let items: Vec<Value> = (0..count)
        .map(|i| {
            let slot = i % 10;
            if slot < 6 {
                gpu_node(
                    &format!("ts-{i:05}"),
                    json!({"nvidia.com/gpu.product": "NVIDIA-L4-SHARED", "nvidia.com/gpu.count": "8",
                           "nvidia.com/gpu.memory": "23034", "nvidia.com/gpu.replicas": "4",
                           "nvidia.com/gpu.sharing-strategy": "time-slicing"}),
                    json!({"nvidia.com/gpu": "32"}),
                )
            } else if slot < 8 {
                gpu_node(
                    &format!("mps-{i:05}"),
                    json!({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-SHARED", "nvidia.com/gpu.count": "8",
                           "nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.replicas": "4",
                           "nvidia.com/gpu.sharing-strategy": "mps"}),
                    json!({"nvidia.com/gpu": "32"}),
                )
            } else if slot < 9 {
                gpu_node(
                    &format!("mig-{i:05}"),
                    json!({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "8",
                           "nvidia.com/gpu.memory": "81920", "nvidia.com/gpu.replicas": "1",
                           "nvidia.com/gpu.sharing-strategy": "none", "nvidia.com/mig.capable": "true",
                           "nvidia.com/mig.strategy": "mixed", "nvidia.com/mig.config": "all-1g.10gb",
                           "nvidia.com/mig-1g.10gb.count": "56", "nvidia.com/mig-1g.10gb.memory": "9728"}),
                    json!({"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "56"}),
                )
            } else {
                gpu_node(
                    &format!("l40s-{i:05}"),
                    json!({"nvidia.com/gpu.product": "NVIDIA-L40S", "nvidia.com/gpu.count": "8",
                           "nvidia.com/gpu.memory": "46068", "nvidia.com/gpu.replicas": "1",
                           "nvidia.com/gpu.sharing-strategy": "none"}),
                    json!({"nvidia.com/gpu": "8"}),
                )
            }
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "NodeList", "items": items})
}

fn write_nodes(count: usize, out: &PathBuf) -> Result<Value, String> {
    let list = node_list(count);
    std::fs::write(out, serde_json::to_vec(&list).unwrap()).map_err(|e| e.to_string())?;
    Ok(json!({"nodes": count, "out": out}))
}

fn node_names(path: &PathBuf) -> Result<Vec<String>, String> {
    let list: Value = serde_json::from_slice(
        &std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?,
    )
    .map_err(|e| e.to_string())?;
    Ok(list["items"]
        .as_array()
        .ok_or("not a NodeList")?
        .iter()
        .filter_map(|n| n["metadata"]["name"].as_str().map(String::from))
        .collect())
}

// ---- pods ---------------------------------------------------------------------------------------

/// The classes pods ask, each with its weight: mostly quarter GPUs, in proportion to what the
/// node mix of [`node_list`] holds when full (per 10 nodes: 6 time-sliced and 2 MPS nodes of
/// 32 replicas, 1 of 56 MIG 1g devices, 1 of 8 whole GPUs: about 160,000 pods on 5,000 nodes),
/// with a few larger shares.
const CLASSES: &[(&str, u32)] = &[
    ("timeslice-25", 56),
    ("timeslice-50", 2),
    ("timeslice-100", 1),
    ("mps-25", 18),
    ("mps-50", 1),
    ("mig-1g.10gb", 18),
    ("exclusive-1", 2),
];

fn class_of(i: usize) -> &'static str {
    let total: u32 = CLASSES.iter().map(|c| c.1).sum();
    let mut x = (i as u64).wrapping_mul(2_654_435_761) as u32 % total;
    for (c, w) in CLASSES {
        if x < *w {
            return c;
        }
        x -= w;
    }
    CLASSES[0].0
}

fn pod(uid: &str, class: &str) -> Value {
    json!({"metadata": {"name": uid, "namespace": "bench", "uid": uid,
            "annotations": {"gpu-share": class, "gpu-share.io/request": class}},
           "spec": {"schedulerName": "gpu-share-scheduler", "priority": 0,
                    "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                    "resources": {"requests": {"cpu": "1"}}}]}})
}

// ---- connections --------------------------------------------------------------------------------

/// One kept-alive connection, HTTP/1.1 or HTTP/2.
enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

struct Reply {
    status: u16,
    body: Bytes,
    /// The server's `handle` time from `Server-Timing`, in ms.
    server_ms: Option<f64>,
}

impl Sender {
    async fn connect(addr: SocketAddr, http1: bool) -> Result<Sender, String> {
        let mut config = rustls::ClientConfig::builder()
            .dangerous()
            .with_custom_certificate_verifier(gpu_share::status::NoVerify::ring())
            .with_no_client_auth();
        config.alpn_protocols = vec![if http1 {
            b"http/1.1".to_vec()
        } else {
            b"h2".to_vec()
        }];
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        tcp.set_nodelay(true).map_err(|e| e.to_string())?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        let io = TokioIo::new(tls);
        if http1 {
            let (s, c) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(c);
            Ok(Sender::H1(s))
        } else {
            let (s, c) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(c);
            Ok(Sender::H2(s))
        }
    }

    async fn post(&mut self, path: &str, body: Bytes) -> Result<Reply, String> {
        let req = http::Request::post(format!("https://localhost{path}"))
            .header("content-type", "application/json")
            .body(Full::new(body))
            .unwrap();
        let resp = match self {
            Sender::H1(s) => {
                s.ready().await.map_err(|e| e.to_string())?;
                s.send_request(req).await
            }
            Sender::H2(s) => {
                s.ready().await.map_err(|e| e.to_string())?;
                s.send_request(req).await
            }
        }
        .map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let server_ms = resp
            .headers()
            .get("server-timing")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.split(',')
                    .find_map(|part| part.trim().strip_prefix("handle;dur="))
                    .and_then(|d| d.parse().ok())
            });
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok(Reply {
            status,
            body,
            server_ms,
        })
    }
}

fn split_url(url: &str) -> Result<(SocketAddr, String), String> {
    let rest = url
        .strip_prefix("https://")
        .ok_or_else(|| format!("{url}: https:// only"))?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let addr = host
        .parse()
        .map_err(|e| format!("{url}: {e} (use an IP:port)"))?;
    Ok((addr, format!("/{path}")))
}

// ---- statistics ---------------------------------------------------------------------------------

struct Stats {
    client: Histogram<u64>,
    server: Histogram<u64>,
    errors: u64,
    first_error: Option<String>,
}

impl Stats {
    fn new() -> Stats {
        Stats {
            client: Histogram::new_with_bounds(1, 60_000_000, 3).unwrap(),
            server: Histogram::new_with_bounds(1, 60_000_000, 3).unwrap(),
            errors: 0,
            first_error: None,
        }
    }

    fn record(&mut self, took: Duration, reply: Result<Reply, String>) {
        match reply {
            Ok(r) if r.status == 200 => {
                self.client
                    .saturating_record(took.as_micros().max(1) as u64);
                if let Some(ms) = r.server_ms {
                    self.server.saturating_record(((ms * 1000.0) as u64).max(1));
                }
            }
            Ok(r) => self.error(format!(
                "HTTP {}: {}",
                r.status,
                String::from_utf8_lossy(&r.body)
            )),
            Err(e) => self.error(e),
        }
    }

    fn error(&mut self, e: String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(e);
        }
    }

    fn merge(&mut self, other: Stats) {
        self.client.add(&other.client).unwrap();
        self.server.add(&other.server).unwrap();
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }

    fn json(&self, seconds: f64) -> Value {
        let ms = |h: &Histogram<u64>, q: f64| {
            if h.is_empty() {
                Value::Null
            } else {
                json!((h.value_at_quantile(q) as f64 / 1000.0 * 1000.0).round() / 1000.0)
            }
        };
        json!({
            "requests": self.client.len(),
            "errors": self.errors,
            "first_error": self.first_error,
            "seconds": seconds,
            "throughput": (self.client.len() as f64 / seconds).round(),
            "p50_ms": ms(&self.client, 0.5),
            "p99_ms": ms(&self.client, 0.99),
            "p999_ms": ms(&self.client, 0.999),
            "max_ms": ms(&self.client, 1.0),
            "server_p50_ms": ms(&self.server, 0.5),
            "server_p99_ms": ms(&self.server, 0.99),
            "server_p999_ms": ms(&self.server, 0.999),
        })
    }
}

// ---- fixed rate and closed loop ------------------------------------------------------------------

async fn fixed_rate(
    url: &str,
    bodies: &[Bytes],
    rate: f64,
    duration: f64,
    warmup: f64,
    conn: &Conn,
) -> Result<Value, String> {
    let (addr, path) = split_url(url)?;
    let n = conn.connections.max(1);
    let total = ((duration + warmup) * rate) as usize;
    let warm = (warmup * rate) as usize;
    let start = tokio::time::Instant::now() + Duration::from_millis(200);
    let mut tasks = Vec::new();
    for c in 0..n {
        let mut sender = Sender::connect(addr, conn.http1).await?;
        let bodies = bodies.to_vec();
        let path = path.clone();
        tasks.push(tokio::spawn(async move {
            let mut stats = Stats::new();
            // This connection's share of the schedule: every n-th request, each at its slot.
            for i in (c..total).step_by(n) {
                let due = start + Duration::from_secs_f64(i as f64 / rate);
                tokio::time::sleep_until(due).await;
                let reply = sender.post(&path, bodies[i % bodies.len()].clone()).await;
                if i >= warm {
                    stats.record(due.elapsed(), reply);
                }
            }
            stats
        }));
    }
    let mut stats = Stats::new();
    for t in tasks {
        stats.merge(t.await.map_err(|e| e.to_string())?);
    }
    let mut v = stats.json(duration);
    v["rate"] = json!(rate);
    v["connections"] = json!(n);
    Ok(v)
}

async fn closed(
    url: &str,
    bodies: &[Bytes],
    duration: f64,
    warmup: f64,
    conn: &Conn,
) -> Result<Value, String> {
    let (addr, path) = split_url(url)?;
    let n = conn.connections.max(1);
    let begin = Instant::now() + Duration::from_secs_f64(warmup);
    let end = begin + Duration::from_secs_f64(duration);
    let mut tasks = Vec::new();
    for c in 0..n {
        let mut sender = Sender::connect(addr, conn.http1).await?;
        let bodies = bodies.to_vec();
        let path = path.clone();
        tasks.push(tokio::spawn(async move {
            let mut stats = Stats::new();
            let mut i = c;
            while Instant::now() < end {
                let t = Instant::now();
                let reply = sender.post(&path, bodies[i % bodies.len()].clone()).await;
                if t >= begin {
                    stats.record(t.elapsed(), reply);
                }
                i += 1;
            }
            stats
        }));
    }
    let mut stats = Stats::new();
    for t in tasks {
        stats.merge(t.await.map_err(|e| e.to_string())?);
    }
    let mut v = stats.json(duration);
    v["connections"] = json!(n);
    Ok(v)
}

// ---- the extender ------------------------------------------------------------------------------

async fn fill(url: &str, nodes: &PathBuf, pods: usize, conn: &Conn) -> Result<Value, String> {
    let (addr, _) = split_url(url)?;
    let names = Arc::new(node_names(nodes)?);
    let n = conn.connections.max(1);
    let started = Instant::now();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let bound = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..n {
        let mut sender = Sender::connect(addr, conn.http1).await?;
        let (names, next, bound) = (names.clone(), next.clone(), bound.clone());
        tasks.push(tokio::spawn(async move {
            let mut refused = 0usize;
            let mut streak = 0usize;
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if bound.load(std::sync::atomic::Ordering::Relaxed) >= pods || streak > 200 {
                    return Ok::<usize, String>(refused);
                }
                let uid = format!("fill-{i:07}");
                let pod = pod(&uid, class_of(i));
                let mut x = (i as u64)
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                let pick: Vec<&String> = (0..16)
                    .map(|_| {
                        x = x
                            .wrapping_mul(6_364_136_223_846_793_005)
                            .wrapping_add(1_442_695_040_888_963_407);
                        &names[(x >> 33) as usize % names.len()]
                    })
                    .collect();
                let filter = json!({"Pod": pod, "NodeNames": pick});
                let r = sender
                    .post(
                        "/scheduler/filter",
                        Bytes::from(serde_json::to_vec(&filter).unwrap()),
                    )
                    .await?;
                let v: Value = serde_json::from_slice(&r.body).map_err(|e| e.to_string())?;
                let Some(node) = v["NodeNames"]
                    .as_array()
                    .and_then(|a| a.first())
                    .and_then(Value::as_str)
                else {
                    refused += 1;
                    streak += 1;
                    continue;
                };
                let bind =
                    json!({"PodName": uid, "PodNamespace": "bench", "PodUID": uid, "Node": node});
                let r = sender
                    .post(
                        "/scheduler/bind",
                        Bytes::from(serde_json::to_vec(&bind).unwrap()),
                    )
                    .await?;
                let v: Value = serde_json::from_slice(&r.body).map_err(|e| e.to_string())?;
                if v["Error"].as_str().unwrap_or_default().is_empty() {
                    bound.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    streak = 0;
                } else {
                    refused += 1;
                }
            }
        }));
    }
    let mut refused = 0;
    for t in tasks {
        refused += t.await.map_err(|e| e.to_string())??;
    }
    let seconds = started.elapsed().as_secs_f64();
    let bound = bound.load(std::sync::atomic::Ordering::Relaxed);
    Ok(
        json!({"bound": bound, "refused": refused, "seconds": seconds,
              "binds_per_second": (bound as f64 / seconds).round()}),
    )
}

async fn extender(
    url: &str,
    nodes: &PathBuf,
    verb: &str,
    requests: usize,
    http1: bool,
) -> Result<Value, String> {
    let (addr, _) = split_url(url)?;
    let names = node_names(nodes)?;
    let path = format!("/scheduler/{verb}");
    // Distinct pods, so each call is a pod the extender has not seen, as in a scheduling cycle.
    let bodies: Vec<Bytes> = (0..64)
        .map(|i| {
            let uid = format!("probe-{verb}-{i:03}");
            Bytes::from(
                serde_json::to_vec(&json!({"Pod": pod(&uid, class_of(i * 7 + 3)), "Nodes": null, "NodeNames": names}))
                    .unwrap(),
            )
        })
        .collect();
    let body_bytes = bodies[0].len();
    let mut sender = Sender::connect(addr, http1).await?;
    let mut stats = Stats::new();
    for i in 0..requests.min(100) {
        let _ = sender.post(&path, bodies[i % bodies.len()].clone()).await;
    }
    let started = Instant::now();
    let mut reply_bytes = 0;
    for i in 0..requests {
        let t = Instant::now();
        let r = sender.post(&path, bodies[i % bodies.len()].clone()).await;
        if let Ok(r) = &r {
            reply_bytes = r.body.len();
        }
        stats.record(t.elapsed(), r);
    }
    let mut v = stats.json(started.elapsed().as_secs_f64());
    v["verb"] = json!(verb);
    v["nodes"] = json!(names.len());
    v["request_bytes"] = json!(body_bytes);
    v["reply_bytes"] = json!(reply_bytes);
    Ok(v)
}

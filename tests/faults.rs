//! Faults under load against a real `gpu-share serve --dev` process: concurrent binds over
//! HTTP, SIGTERM while requests are in flight, certificate rotation while serving.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::serve::*;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Ten copies of the example H100 node with 8 GPUs time-sliced 4 ways, as a JSON NodeList.
fn ten_timesliced_nodes(dir: &std::path::Path) -> std::path::PathBuf {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/extender/nodes.yaml"
    ))
    .unwrap();
    let list: Value = serde_saphyr::from_str(&text).unwrap();
    let template = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["metadata"]["name"] == "h100-ts")
        .unwrap()
        .clone();
    let items: Vec<Value> = (0..10)
        .map(|i| {
            let mut n = template.clone();
            n["metadata"]["name"] = format!("ts-{i}").into();
            n["metadata"]["labels"]["kubernetes.io/hostname"] = format!("ts-{i}").into();
            n
        })
        .collect();
    let path = dir.join("nodes.json");
    std::fs::write(
        &path,
        serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "NodeList", "items": items}))
            .unwrap(),
    )
    .unwrap();
    path
}

fn ts_pod(uid: &str, percent: u32) -> Value {
    json!({"metadata": {"name": uid, "namespace": "ml", "uid": uid,
            "annotations": {"gpu-share.io/request": format!("timeslice-{percent}")}},
           "spec": {"containers": [{"name": "c", "image": "x"}]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_concurrent_binds_across_ten_nodes_never_overcommit() {
    let _g = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let nodes = ten_timesliced_nodes(dir.path());
    let s = DevServer::start(&["--nodes", nodes.to_str().unwrap()]);
    let names: Vec<String> = (0..10).map(|i| format!("ts-{i}")).collect();
    // 1,000 pods asking 30% each: every node's budget (8 GPUs) would take 26 of them, but a share
    // runs on one GPU and three fit each: 24 a node, 240 in all.
    let pods: Vec<Value> = (0..1000).map(|i| ts_pod(&format!("p{i:04}"), 30)).collect();
    let sem = Arc::new(tokio::sync::Semaphore::new(64));
    let mut tasks = Vec::new();
    for (i, pod) in pods.into_iter().enumerate() {
        let (https, sem) = (s.https, sem.clone());
        let node = names[i % 10].clone();
        let names = names.clone();
        tasks.push(tokio::spawn(async move {
            let _p = sem.acquire().await.unwrap();
            let filter = json!({"Pod": pod, "NodeNames": names});
            let (status, _) = post(
                https,
                "/scheduler/filter",
                serde_json::to_vec(&filter).unwrap(),
            )
            .await
            .unwrap();
            assert_eq!(status, 200);
            let bind = json!({"PodName": pod["metadata"]["name"], "PodNamespace": "ml",
                              "PodUID": pod["metadata"]["uid"], "Node": node});
            let (status, text) = post(https, "/scheduler/bind", serde_json::to_vec(&bind).unwrap())
                .await
                .unwrap();
            assert_eq!(status, 200, "{text}");
            let r: Value = serde_json::from_str(&text).unwrap();
            let error = r["Error"].as_str().unwrap_or_default().to_string();
            (
                pod["metadata"]["uid"].as_str().unwrap().to_string(),
                node,
                error,
            )
        }));
    }
    let mut bound: BTreeMap<String, String> = BTreeMap::new();
    for t in tasks {
        let (uid, node, error) = t.await.unwrap();
        if error.is_empty() {
            bound.insert(uid, node);
        } else {
            assert!(
                error.contains("no single GPU has enough free share"),
                "{error}"
            );
        }
    }
    assert_eq!(
        bound.len(),
        240,
        "every node holds exactly what its GPUs hold"
    );
    // The ledger as the service reports it: each success held once, where it was bound.
    let (status, text) = http_get(s.admin, "/v1/nodes").unwrap();
    assert_eq!(status, 200, "{text}");
    let reports: Vec<Value> = serde_json::from_str(&text).unwrap();
    let mut held: BTreeMap<String, String> = BTreeMap::new();
    for r in &reports {
        let node = r["name"].as_str().unwrap();
        // Time-slicing: the device plugin's replicas (slots) and the node's GPU-time budget bound
        // it, and in the model no GPU passes its whole.
        let mut milli = 0u64;
        let mut per_gpu: BTreeMap<u32, u64> = BTreeMap::new();
        for p in r["pods"].as_array().unwrap() {
            let name = p["name"].as_str().unwrap().to_string();
            assert!(
                held.insert(name.clone(), node.to_string()).is_none(),
                "{name} held twice"
            );
            for part in p["model"].as_str().unwrap().split(',') {
                let (gpu, m) = part.split_once(':').unwrap();
                let m = m.parse::<u64>().unwrap();
                milli += m;
                *per_gpu.entry(gpu.parse().unwrap()).or_default() += m;
            }
        }
        assert!(
            per_gpu.values().all(|m| *m <= 1000),
            "{node}: a GPU past its whole: {per_gpu:?}"
        );
        let gpus = r["gpus"].as_u64().unwrap();
        assert!(
            milli <= gpus * 1000,
            "{node} holds {milli} milli of {gpus} GPUs"
        );
        let (used, total) = r["slots"].as_str().unwrap().split_once('/').unwrap();
        assert!(
            used.parse::<u32>().unwrap() <= total.parse::<u32>().unwrap(),
            "{node}: {r}"
        );
        assert!(r["usedGpus"].as_f64().unwrap() <= r["gpus"].as_f64().unwrap());
    }
    assert_eq!(held, bound, "the ledger holds exactly the successful binds");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_under_load_finishes_in_flight_requests_and_exits_0() {
    let _g = SERIAL.lock().await;
    // 5 s of drain (still serving, not ready), then up to 5 s for in-flight requests.
    let mut s = DevServer::start(&["--shutdown-grace-seconds", "10"]);
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicUsize::new(0));
    let mut load = Vec::new();
    for _ in 0..8 {
        let (https, stop, ok) = (s.https, stop.clone(), ok.clone());
        load.push(tokio::spawn(async move {
            let mut failures = Vec::new();
            let mut refused = 0;
            while !stop.load(Ordering::Relaxed) {
                match post(https, "/mutate", mutate_body("load")).await {
                    Ok((200, _)) => {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    // After the drain: no listener, the connection is refused outright (or,
                    // if it was waiting in the accept queue when the listener closed, reset
                    // before the TLS handshake: no request was sent on it either way).
                    Err(e)
                        if e.starts_with("connect:")
                            && (e.contains("refused") || e.contains("reset")) =>
                    {
                        refused += 1;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    other => failures.push(format!("{other:?}")),
                }
            }
            (failures, refused)
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = ok.load(Ordering::Relaxed);
    assert!(before > 0, "no load before SIGTERM");
    let t = Instant::now();
    std::process::Command::new("kill")
        .args(["-TERM", &s.pid().to_string()])
        .status()
        .unwrap();
    // A request whose body takes 2 s to arrive, started 4 s into the 5 s drain: it is in flight
    // when the listener closes, and still answered.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        http_get(s.admin, "/readyz").map(|r| r.0),
        Some(503),
        "not ready while draining"
    );
    let mut c = tls_connect(s.https, false).await.unwrap();
    let body = mutate_body("slow");
    c.write_all(
        format!(
            "POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let (first, rest) = body.split_at(body.len() / 2);
    c.write_all(first).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    c.write_all(rest).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 4096];
        while let Ok(n) = c.read(&mut buf).await {
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&buf[..n]);
            if answer.windows(4).any(|w| w == b"\r\n\r\n") && answer.ends_with(b"}") {
                break;
            }
        }
    })
    .await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "the in-flight request got: {answer:?}"
    );
    // The first SIGTERM is the only one: a second would abort.
    let status = s.wait_exit(Duration::from_secs(15));
    stop.store(true, Ordering::Relaxed);
    let mut refused = 0;
    for l in load {
        let (failures, r) = l.await.unwrap();
        assert!(
            failures.is_empty(),
            "requests failed other than by refusal: {failures:?}"
        );
        refused += r;
    }
    assert!(status.success(), "exit status {status:?}: {}", s.log_text());
    assert!(
        refused > 0,
        "new connections after the drain were not refused"
    );
    assert!(
        t.elapsed() < Duration::from_secs(12),
        "shutdown took {:?}",
        t.elapsed()
    );
    eprintln!(
        "{} requests answered under load, {refused} refused after the drain, exit in {:?}",
        ok.load(Ordering::Relaxed),
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn certificate_rotation_under_load_fails_no_request() {
    let _g = SERIAL.lock().await;
    let pairs: Vec<_> = (0..4)
        .map(|_| gpu_share::certs::self_signed(&["localhost"]).unwrap())
        .collect();
    let mut secret = SecretDir::new(&pairs[0]);
    let files = secret.files(None);
    let s = DevServer::start(&[
        "--tls-cert",
        files.cert.to_str().unwrap(),
        "--tls-key",
        files.key.to_str().unwrap(),
    ]);
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = Vec::new();
    for _ in 0..4 {
        let (https, stop) = (s.https, stop.clone());
        load.push(tokio::spawn(async move {
            let mut failures = Vec::new();
            let mut leaves = BTreeSet::new();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                match tls_connect(https, false).await {
                    Ok(tls) => {
                        let leaf = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
                        leaves.insert(leaf);
                        drop(tls);
                        match post(https, "/mutate", mutate_body("rot")).await {
                            Ok((200, _)) => n += 1,
                            other => failures.push(format!("{other:?}")),
                        }
                    }
                    Err(e) => failures.push(format!("handshake: {e}")),
                }
            }
            (failures, leaves, n)
        }));
    }
    // A kept-alive HTTP/2 connection stays up across every rotation.
    let mut h2 = h2_client::<http_body_util::Full<bytes::Bytes>>(s.https)
        .await
        .unwrap();
    let mut h2_ok = 0;
    for pair in &pairs[1..] {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        secret.publish(pair);
        let r = h2
            .send_request(
                http::Request::post("https://localhost/mutate")
                    .body(http_body_util::Full::new(bytes::Bytes::from(mutate_body(
                        "h2",
                    ))))
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        h2_ok += 1;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut leaves = BTreeSet::new();
    let mut total = 0;
    for l in load {
        let (failures, l, n) = l.await.unwrap();
        assert!(failures.is_empty(), "{failures:?}");
        leaves.extend(l);
        total += n;
    }
    assert_eq!(h2_ok, 3);
    assert_eq!(leaves.len(), 4, "every rotated certificate was served");
    eprintln!("{total} requests across 3 rotations, 0 failed");
}

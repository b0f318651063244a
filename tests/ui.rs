//! The occupancy page in a real browser: `serve --dev` with the example cluster, pods of every
//! class bound through the extender (and two that fit nowhere), then headless Chromium
//! (tests/ui/browser.mjs, playwright-core driving Debian's /usr/bin/chromium) opens the page. The
//! nodes and pods it shows, read from the DOM, must be `/v1/nodes`'s; the class filter must
//! narrow the nodes to those of the class (with JavaScript and without: the form alone), and
//! typing a node name narrow them as one types; a
//! waiting pod must show its reason; the page must log no console error. The screenshot goes to
//! target/ui/occupancy.png.
//!
//! Needs Chromium and tests/ui's node modules, which `.ci/run` installs (its stage "occupancy
//! page in headless Chromium" runs this test by name):
//! `apt-get install chromium && (cd tests/ui && npm ci) && cargo test --test ui -- --ignored`.

mod common;

use std::collections::BTreeSet;
use std::process::Command;

use common::serve::*;
use serde_json::{Value, json};

/// Pods of every class, and two that fit no node of the example cluster.
const PODS: [(&str, &str, &str); 12] = [
    ("ml", "train-a", "mig-3g.40gb"),
    ("ml", "train-b", "mig-1g.10gb"),
    ("ml", "small", "mig-1g.10gb"),
    ("web", "infer-1", "timeslice-50"),
    ("web", "infer-2", "timeslice-25"),
    ("web", "infer-3", "timeslice-25"),
    ("ml", "mps-1", "mps-25"),
    ("ml", "bert", "exclusive"),
    ("ml", "llama", "exclusive-2"),
    ("web", "embed", "timeslice-10"),
    ("ml", "mps-big", "mps-50"),
    ("ml", "huge", "exclusive-8"),
];
const NODES: [&str; 4] = ["a100-mig", "h100-ts", "h100-mps", "l40s-plain"];

async fn bind_all(s: &DevServer) -> BTreeSet<String> {
    let mut waiting = BTreeSet::new();
    for (i, (ns, name, request)) in PODS.iter().enumerate() {
        let uid = format!("uid-{i}");
        let pod = json!({"metadata": {"name": name, "namespace": ns, "uid": uid,
            "annotations": {"gpu-share": request, "gpu-share.io/request": request}},
            "spec": {"containers": [{"name": "c"}]}});
        let body = json!({"Pod": pod, "NodeNames": NODES})
            .to_string()
            .into_bytes();
        let (status, text) = post(s.https, "/scheduler/filter", body).await.unwrap();
        assert_eq!(status, 200, "{text}");
        let answer: Value = serde_json::from_str(&text).unwrap();
        let Some(node) = answer["NodeNames"].as_array().and_then(|n| n.first()) else {
            waiting.insert(format!("{ns}/{name}"));
            continue;
        };
        let bind = json!({"PodName": name, "PodNamespace": ns, "PodUID": uid, "Node": node});
        let (status, text) = post(s.https, "/scheduler/bind", bind.to_string().into_bytes())
            .await
            .unwrap();
        assert!(
            status == 200 && text.contains("\"Error\":\"\""),
            "bind {name}: {text}"
        );
    }
    waiting
}

#[test]
#[ignore = "needs Chromium and tests/ui's node modules: .ci/run installs them and runs it"]
fn the_occupancy_page_shows_the_ledger_in_a_real_browser() {
    let root = env!("CARGO_MANIFEST_DIR");
    let s = DevServer::start(&[
        "--nodes",
        &format!("{root}/tests/fixtures/extender/nodes.yaml"),
    ]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let waiting = runtime.block_on(bind_all(&s));
    assert_eq!(
        waiting,
        BTreeSet::from(["ml/huge".to_string(), "ml/mps-big".to_string()]),
        "the example cluster holds all but these"
    );

    // What the ledger holds: node -> pods.
    let (status, text) = http_get(s.admin, "/v1/nodes").unwrap();
    assert_eq!(status, 200, "{text}");
    let reports: Value = serde_json::from_str(&text).unwrap();
    let mut ledger: BTreeSet<(String, String)> = BTreeSet::new();
    let mut nodes: Vec<String> = Vec::new();
    let mut mig_nodes: Vec<String> = Vec::new();
    for n in reports.as_array().unwrap() {
        let name = n["name"].as_str().unwrap().to_string();
        for p in n["pods"].as_array().unwrap() {
            ledger.insert((
                name.clone(),
                format!(
                    "{}/{}",
                    p["namespace"].as_str().unwrap(),
                    p["name"].as_str().unwrap()
                ),
            ));
        }
        if n["classes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["class"] == "mig")
        {
            mig_nodes.push(name.clone());
        }
        nodes.push(name);
    }
    nodes.sort();
    mig_nodes.sort();
    assert_eq!(ledger.len(), PODS.len() - 2);

    let shot = format!("{root}/target/ui/occupancy.png");
    std::fs::create_dir_all(format!("{root}/target/ui")).unwrap();
    let url = format!("http://{}/", s.admin);
    let out = Command::new("node")
        .arg(format!("{root}/tests/ui/browser.mjs"))
        .args([&url, &shot])
        .output()
        .expect("node (Node.js) on PATH");
    assert!(
        out.status.success(),
        "browser.mjs failed (is Chromium installed, and tests/ui's node modules? see this file's header):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap().to_string())
            .collect()
    };

    // The nodes and pods drawn are the ledger's.
    assert_eq!(strings(&seen["all"]["nodes"]), nodes);
    let drawn: BTreeSet<(String, String)> = seen["all"]["pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p[0].as_str().unwrap().to_string(),
                p[1].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(drawn, ledger);
    // The waiting pods, each with its reason in words.
    let pending = seen["all"]["pending"].as_array().unwrap();
    let waiting_shown: BTreeSet<String> = pending
        .iter()
        .map(|p| p["pod"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(waiting_shown, waiting);
    let huge = pending.iter().find(|p| p["pod"] == "ml/huge").unwrap();
    assert!(
        huge["reason"]
            .as_str()
            .unwrap()
            .contains("node has fewer GPUs than the pod asks"),
        "{huge}"
    );
    // The class filter, and narrowing as one types.
    assert!(mig_nodes.len() < nodes.len());
    assert_eq!(strings(&seen["mig"]["nodes"]), mig_nodes);
    assert_eq!(
        strings(&seen["mig_without_js"]),
        mig_nodes,
        "the form works without JavaScript"
    );
    let typed: Vec<String> = nodes
        .iter()
        .filter(|n| n.contains("h100"))
        .cloned()
        .collect();
    assert_eq!(strings(&seen["typed"]["nodes"]), typed);
    // No console errors.
    assert_eq!(seen["errors"], json!([]), "console errors");
    let size = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
    assert!(size > 10_000, "a screenshot at {shot} ({size} bytes)");
    eprintln!("ui test: screenshot of the occupancy page: {shot}");
}

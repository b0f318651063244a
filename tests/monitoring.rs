//! The shipped monitoring agrees with the service: every `gpu_share_*` name an alert
//! (manifests/components/monitoring/rules.yaml) or a dashboard panel (dashboard.json) queries is
//! one a running `serve --dev` exports (has a sample of) once it has handled requests; any other name is on an
//! explicit list. The PrometheusRule carries the rule file's groups, and every alert has a
//! summary, a description and a runbook in docs/alerts.md. (promtool checks and tests the rules in
//! CI: .ci/run.)

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::serve::*;
use serde_json::{Value, json};

/// Names from outside gpu-share: Prometheus's own `up`, and kube-state-metrics.
const OTHER_NAMES: &[&str] = &["up", "kube_deployment_status_replicas_available"];

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn yaml(path: &str) -> Value {
    serde_saphyr::from_str(&read(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The metric names a PromQL expression selects (functions, aggregations, keywords, label
/// matchers, label lists and ranges set aside).
fn metric_names(expr: &str) -> BTreeSet<String> {
    // Strings, label matchers and ranges out first (they hold names that are not metrics).
    let mut plain = String::new();
    let mut chars = expr.chars().peekable();
    let mut depth: Option<char> = None;
    while let Some(c) = chars.next() {
        match (depth, c) {
            (None, '"') => {
                while let Some(d) = chars.next() {
                    if d == '\\' {
                        chars.next();
                    } else if d == '"' {
                        break;
                    }
                }
                plain.push(' ');
            }
            (None, '{') => depth = Some('}'),
            (None, '[') => depth = Some(']'),
            (Some(end), d) if d == end => {
                depth = None;
                plain.push(' ');
            }
            (Some(_), _) => {}
            (None, c) => plain.push(c),
        }
    }
    let tokens: Vec<(usize, String)> = {
        let mut out = Vec::new();
        let b = plain.as_bytes();
        let mut i = 0;
        while i < b.len() {
            let c = b[i] as char;
            if c.is_ascii_alphabetic() || c == '_' || c == ':' {
                let start = i;
                while i < b.len()
                    && ((b[i] as char).is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b':')
                {
                    i += 1;
                }
                out.push((i, plain[start..i].to_string()));
            } else if c.is_ascii_digit() || c == '.' {
                // Numbers, 1e3 included: not names.
                while i < b.len() && ((b[i] as char).is_ascii_alphanumeric() || b[i] == b'.') {
                    i += 1;
                }
            } else {
                i += 1;
            }
        }
        out
    };
    // Aggregations may have their `by (...)` before the parenthesis: never names either.
    const KEYWORDS: &[&str] = &[
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "inf",
        "nan",
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
        "group",
    ];
    const LABEL_LISTS: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let mut names = BTreeSet::new();
    let mut in_label_list = false;
    for (end, t) in tokens {
        let next = plain[end..].trim_start().chars().next();
        if LABEL_LISTS.contains(&t.as_str()) {
            // `by (a, b)` holds label names up to its `)`; `by ()` holds none.
            let rest = plain[end..].trim_start();
            in_label_list = rest.starts_with('(') && !rest[1..].trim_start().starts_with(')');
            continue;
        }
        if in_label_list {
            if plain[end..].trim_start().starts_with(')') {
                in_label_list = false;
            }
            continue;
        }
        if next == Some('(') || KEYWORDS.contains(&t.to_lowercase().as_str()) {
            continue;
        }
        names.insert(t);
    }
    names
}

#[test]
fn metric_names_are_read_from_promql() {
    let n = metric_names(
        r#"histogram_quantile(0.99, sum by (le, endpoint) (rate(a_bucket{job="x",le="+Inf"}[5m]))) > 2.5 and max(b) / 1e3 or absent(up{job="y"} == 1) or vector(0) or sum by () (c) + on() d"#,
    );
    assert_eq!(
        n,
        ["a_bucket", "b", "c", "d", "up"]
            .into_iter()
            .map(String::from)
            .collect::<BTreeSet<_>>()
    );
}

struct Alert {
    name: String,
    expr: String,
    annotations: BTreeMap<String, String>,
}

fn alerts(groups: &Value) -> Vec<Alert> {
    groups["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .map(|r| Alert {
            name: r["alert"].as_str().expect("every rule is an alert").into(),
            expr: r["expr"].as_str().expect("expr").into(),
            annotations: serde_json::from_value(r["annotations"].clone()).expect("annotations"),
        })
        .collect()
}

fn dashboard_exprs(dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    // Panels, and the panels of collapsed rows.
    let panels = dashboard["panels"].as_array().expect("panels");
    let nested = panels
        .iter()
        .flat_map(|p| p["panels"].as_array().into_iter().flatten());
    for p in panels.iter().chain(nested) {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push((
                p["title"].as_str().unwrap_or_default().to_string(),
                t["expr"].as_str().expect("a target's expr").to_string(),
            ));
        }
    }
    out
}

#[test]
fn the_prometheus_rule_carries_the_rule_file() {
    let rules = yaml("manifests/components/monitoring/rules.yaml");
    let pr = yaml("manifests/components/monitoring/prometheusrule.yaml");
    assert_eq!(pr["kind"], "PrometheusRule");
    assert_eq!(
        pr["spec"], rules,
        "prometheusrule.yaml's spec must be rules.yaml's groups"
    );
}

#[test]
fn every_alert_has_a_summary_a_description_and_a_runbook() {
    let doc = read("docs/alerts.md");
    let all = alerts(&yaml("manifests/components/monitoring/rules.yaml"));
    assert!(all.len() >= 10, "{} alerts", all.len());
    for a in &all {
        for key in ["summary", "description", "runbook_url"] {
            assert!(
                a.annotations.get(key).is_some_and(|v| !v.trim().is_empty()),
                "{}: no {key}",
                a.name
            );
        }
        let anchor = a.name.to_lowercase();
        assert_eq!(
            a.annotations["runbook_url"],
            format!("https://github.com/gpu-share/gpu-share/blob/main/docs/alerts.md#{anchor}"),
            "{}",
            a.name
        );
        assert!(
            doc.lines().any(|l| l.trim() == format!("## {}", a.name)),
            "docs/alerts.md has no '## {}' runbook",
            a.name
        );
    }
}

/// The sample names in the text exposition.
fn exported(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l[..l.find(['{', ' ']).unwrap_or(l.len())].to_string())
        .collect()
}

#[tokio::test]
async fn every_name_the_alerts_and_the_dashboard_query_is_exported() {
    let nodes = format!(
        "{}/tests/fixtures/extender/nodes.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let s = DevServer::start(&["--nodes", &nodes]);
    // Requests of every kind: an admission and a denial, a filter that fits and one that fits
    // nowhere (pending), prioritize, bind and preempt.
    let (status, _) = post(s.https, "/mutate", mutate_body("m1")).await.unwrap();
    assert_eq!(status, 200);
    let mut bad: Value = serde_json::from_slice(&mutate_body("m2")).unwrap();
    bad["request"]["object"]["metadata"]["annotations"]["gpu-share"] = json!("timeslice-500");
    let (status, text) = post(s.https, "/mutate", serde_json::to_vec(&bad).unwrap())
        .await
        .unwrap();
    assert!(
        status == 200 && text.contains("\"allowed\":false"),
        "{text}"
    );
    let fixture = |name: &str| -> Value { common::fixture(&format!("extender/{name}")) };
    let mut filter = fixture("filter-names-mps.json");
    let (status, text) = post(
        s.https,
        "/scheduler/filter",
        serde_json::to_vec(&filter).unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{text}");
    let pod = filter["Pod"].clone();
    let bind = json!({"PodName": pod["metadata"]["name"], "PodNamespace": "ml",
                      "PodUID": pod["metadata"]["uid"], "Node": "h100-mps"});
    let (status, text) = post(
        s.https,
        "/scheduler/bind",
        serde_json::to_vec(&bind).unwrap(),
    )
    .await
    .unwrap();
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert!(
        status == 200 && answer["Error"] == "",
        "the bind holds: {text}"
    );
    filter["Pod"]["metadata"]["uid"] = json!("waits-1");
    filter["Pod"]["metadata"]["name"] = json!("waits");
    filter["Pod"]["metadata"]["annotations"] = json!({"gpu-share.io/request": "exclusive-8"});
    let units = json!({"nvidia.com/gpu": "8"});
    filter["Pod"]["spec"]["containers"][0]["resources"] =
        json!({"limits": units, "requests": units});
    let (status, text) = post(
        s.https,
        "/scheduler/filter",
        serde_json::to_vec(&filter).unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("FailedNodes"), "{text}");
    for (path, f) in [
        ("/scheduler/prioritize", "prioritize-names-mig.json"),
        ("/scheduler/preempt", "preempt-meta.json"),
    ] {
        let (status, text) = post(s.https, path, serde_json::to_vec(&fixture(f)).unwrap())
            .await
            .unwrap();
        assert_eq!(status, 200, "{path}: {text}");
    }

    let (status, text) = http_get(s.admin, "/metrics").unwrap();
    assert_eq!(status, 200);
    let samples = exported(&text);
    // The scrape-time gauges carry this server's state.
    assert!(
        text.contains(r#"gpu_share_pending_pods{class="exclusive"} 1"#),
        "the pod no node fits is pending:\n{text}"
    );
    assert!(text.contains("gpu_share_ready 1"), "{text}");
    assert!(
        text.contains(r#"gpu_share_node_gpus{node="h100-mps",class="mps",state="allocated"} 0.25"#),
        "the bound mps-25 pod holds a quarter of an MPS GPU:\n{text}"
    );

    let rules = alerts(&yaml("manifests/components/monitoring/rules.yaml"));
    let dashboard: Value =
        serde_json::from_str(&read("manifests/components/monitoring/dashboard.json")).unwrap();
    let mut queried: Vec<(String, String)> = rules
        .iter()
        .map(|a| (format!("alert {}", a.name), a.expr.clone()))
        .collect();
    queried.extend(
        dashboard_exprs(&dashboard)
            .into_iter()
            .map(|(t, e)| (format!("panel {t}"), e)),
    );
    let mut gpu_share_names = BTreeSet::new();
    for (whose, expr) in &queried {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{whose}: no metric in {expr}");
        for n in names {
            if n.starts_with("gpu_share_") {
                assert!(
                    samples.contains(&n),
                    "{whose}: {n} has no sample in /metrics after requests of every kind:\n{text}"
                );
                gpu_share_names.insert(n);
            } else {
                assert!(
                    OTHER_NAMES.contains(&n.as_str()),
                    "{whose}: {n} is neither gpu-share's nor on the list of other names"
                );
            }
        }
    }
    // The dashboard covers what an operator asks of it.
    let titles: Vec<&str> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["title"].as_str())
        .collect();
    for want in [
        "Decisions by verb and outcome",
        "Latency p50 and p99 by endpoint",
        "Admission denials by reason",
        "Filter rejections by reason",
        "GPUs allocated and free by class",
        "GPUs by node",
        "Fragmented GPUs",
        "Requeue nudges",
        "Ledger size",
        "Ledger drift",
    ] {
        assert!(titles.contains(&want), "no panel {want:?} in {titles:?}");
    }
    assert!(gpu_share_names.len() >= 12, "{gpu_share_names:?}");
}

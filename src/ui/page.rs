//! PURE: the occupancy page as HTML, from what `/v1/nodes` reports (the same reports, not a
//! second computation) and the pods waiting for a node. The page is a server-rendered table that
//! works without JavaScript: the filters are a GET form, and long node lists come in pages.
//! `page.js` only adds interaction (a filter applies as it changes).

use std::collections::BTreeMap;
use std::time::Duration;

use maud::{DOCTYPE, Markup, PreEscaped, html};
use serde::Deserialize;

use crate::extender::report::NodeReport;

/// What the page shows.
#[derive(Debug, Clone, Default)]
pub struct Occupancy {
    /// Every GPU node, by name.
    pub nodes: Vec<NodeReport>,
    /// The most common request, which the fragmentation figure is measured against.
    pub usual: Option<String>,
    /// gpu-share pods waiting for a node, longest waiting first.
    pub pending: Vec<Waiting>,
    /// Each namespace's GPUs against its quotas on `gpu-share.io/gpu-milli`.
    pub quotas: Vec<crate::quota::usage::NamespaceUse>,
}

/// A gpu-share pod waiting for a node.
#[derive(Debug, Clone, PartialEq)]
pub struct Waiting {
    pub namespace: String,
    pub name: String,
    pub class: String,
    pub waited: Duration,
    pub reason: Option<String>,
}

/// The page's filters and page, from its query string (`/?class=mig&model=A100&page=2`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Filter {
    /// A class of GPU or pod: `exclusive`, `timeslice`, `mps`, `mig`, `shared` (per GPU),
    /// `device`, `reservation`.
    pub class: String,
    /// Part of the GPU product (`A100`, `H100-80GB`), any case.
    pub model: String,
    /// A namespace whose pods the node holds (and whose pods wait).
    pub namespace: String,
    /// Part of the node's name.
    pub node: String,
    /// The page of nodes, from 1.
    pub page: usize,
    /// Nodes per page ([`PER_PAGE`] when 0; at most [`MAX_PER_PAGE`]).
    pub per: usize,
}

/// Nodes per page unless asked otherwise.
pub const PER_PAGE: usize = 100;
/// The most nodes one page draws.
pub const MAX_PER_PAGE: usize = 5000;
/// The classes the filter offers, in the order the page lists them.
pub const CLASSES: [&str; 7] = [
    "exclusive",
    "timeslice",
    "mps",
    "mig",
    "shared",
    "device",
    "reservation",
];

impl Filter {
    fn per(&self) -> usize {
        match self.per {
            0 => PER_PAGE,
            n => n.min(MAX_PER_PAGE),
        }
    }

    fn is_empty(&self) -> bool {
        self.class.is_empty()
            && self.model.is_empty()
            && self.namespace.is_empty()
            && self.node.is_empty()
    }

    /// Whether node `n` is in view.
    pub fn keeps(&self, n: &NodeReport) -> bool {
        let has = |needle: &str, hay: &str| hay.to_lowercase().contains(&needle.to_lowercase());
        (self.node.is_empty() || has(&self.node, &n.name))
            && (self.model.is_empty() || n.product.as_deref().is_some_and(|p| has(&self.model, p)))
            && (self.namespace.is_empty() || n.pods.iter().any(|p| p.namespace == self.namespace))
            && (self.class.is_empty()
                || n.classes
                    .iter()
                    .any(|c| c.class == self.class && c.total > 0.0)
                || n.pods.iter().any(|p| p.kind == self.class))
    }

    /// The query string of this filter at `page`.
    fn query(&self, page: usize) -> String {
        let mut parts = Vec::new();
        for (k, v) in [
            ("class", &self.class),
            ("model", &self.model),
            ("namespace", &self.namespace),
            ("node", &self.node),
        ] {
            if !v.is_empty() {
                parts.push(format!("{k}={}", encode(v)));
            }
        }
        if self.per != 0 {
            parts.push(format!("per={}", self.per()));
        }
        parts.push(format!("page={page}"));
        format!("?{}", parts.join("&"))
    }
}

/// Percent-encodes a query value.
fn encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The page.
pub fn render(o: &Occupancy, f: &Filter) -> String {
    let shown: Vec<&NodeReport> = o.nodes.iter().filter(|n| f.keeps(n)).collect();
    let per = f.per();
    let pages = shown.len().div_ceil(per).max(1);
    let page = f.page.clamp(1, pages);
    let first = (page - 1) * per;
    let on_page = &shown[first.min(shown.len())..(first + per).min(shown.len())];
    let pending: Vec<&Waiting> = o
        .pending
        .iter()
        .filter(|w| f.namespace.is_empty() || w.namespace == f.namespace)
        .filter(|w| f.class.is_empty() || w.class == f.class)
        .collect();
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "gpu-share: GPU occupancy" }
                // No icon to fetch (a 404 would be a console error).
                link rel="icon" href="data:,";
                link rel="stylesheet" href="/ui/style.css";
                script src="/ui/page.js" defer {}
            }
            body {
                header {
                    h1 { "GPU occupancy" }
                    p.lead {
                        (o.nodes.len()) " GPU nodes, "
                        (o.nodes.iter().map(|n| u64::from(n.gpus)).sum::<u64>()) " GPUs. "
                        "Read-only; the same ledger as " a href="/v1/nodes" { "/v1/nodes" } "."
                    }
                }
                (filters(o, f))
                (summary(&shown, o.usual.as_deref(), f))
                (waiting(&pending))
                (quotas(&o.quotas, f))
                section #nodes {
                    h2 { "Nodes" }
                    p.count #node-count {
                        @if shown.is_empty() {
                            "No node matches."
                        } @else {
                            "Nodes " (first + 1) "–" (first + on_page.len()) " of " (shown.len())
                            @if !f.is_empty() { " (filtered from " (o.nodes.len()) ")" }
                        }
                    }
                    (pager(f, page, pages))
                    @for n in on_page { (node(n)) }
                    (pager(f, page, pages))
                }
                (legend())
            }
        }
    };
    markup.into_string()
}

fn filters(o: &Occupancy, f: &Filter) -> Markup {
    let mut models: Vec<&str> = o
        .nodes
        .iter()
        .filter_map(|n| n.product.as_deref())
        .collect();
    models.sort_unstable();
    models.dedup();
    html! {
        form #filters method="get" action="/" {
            label { "Class "
                select name="class" {
                    option value="" selected[f.class.is_empty()] { "any" }
                    @for c in CLASSES {
                        option value=(c) selected[f.class == c] { (c) }
                    }
                }
            }
            label { "Model " input name="model" list="models" value=(f.model) placeholder="A100"; }
            datalist #models { @for m in &models { option value=(m) {} } }
            label { "Namespace " input name="namespace" value=(f.namespace); }
            label { "Node " input name="node" value=(f.node); }
            @if f.per != 0 { input type="hidden" name="per" value=(f.per()); }
            button type="submit" { "Filter" }
            " " a href="/" { "clear" }
        }
    }
}

/// GPUs allocated and free by class and by model, and the fragmentation figure, over the
/// nodes in view.
fn summary(nodes: &[&NodeReport], usual: Option<&str>, f: &Filter) -> Markup {
    let mut by_class: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    let mut by_model: BTreeMap<&str, (usize, u64, f64, f64)> = BTreeMap::new();
    for n in nodes {
        let m = by_model
            .entry(n.product.as_deref().unwrap_or("unknown"))
            .or_default();
        m.0 += 1;
        m.1 += u64::from(n.gpus);
        for c in &n.classes {
            let e = by_class.entry(c.class.as_str()).or_default();
            e.0 += c.total;
            e.1 += c.used;
            m.2 += c.total;
            m.3 += c.used;
        }
    }
    let mut fragmented: Vec<(&str, f64)> = nodes
        .iter()
        .filter_map(|n| Some((n.name.as_str(), n.fragmented_gpus.filter(|g| *g > 0.0)?)))
        .collect();
    fragmented.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    // + 0.0: an empty f64 sum is -0.0.
    let total_frag: f64 = fragmented.iter().map(|(_, g)| g).sum::<f64>() + 0.0;
    html! {
        section #summary {
            h2 { "Summary" @if !f.is_empty() { " (nodes in view)" } }
            div.tables {
                table #by-class {
                    caption { "By class" }
                    thead { tr { th { "class" } th.n { "GPUs" } th.n { "allocated" } th.n { "free" } } }
                    tbody {
                        @for (c, (total, used)) in &by_class {
                            tr data-class=(c) {
                                td { span class={"swatch c-" (c)} {} (c) }
                                td.n { (gpus(*total)) } td.n { (gpus(*used)) }
                                td.n { (gpus((total - used).max(0.0))) }
                            }
                        }
                    }
                }
                table #by-model {
                    caption { "By model" }
                    thead { tr { th { "model" } th.n { "nodes" } th.n { "GPUs" } th.n { "allocated" } th.n { "free" } } }
                    tbody {
                        @for (m, (count, physical, total, used)) in &by_model {
                            tr { td { (m) } td.n { (count) } td.n { (physical) }
                                 td.n { (gpus(*used)) } td.n { (gpus((total - used).max(0.0))) } }
                        }
                    }
                }
            }
            p #fragmentation {
                @match usual {
                    None => "No request seen yet: fragmentation is measured against the most common one.",
                    Some(u) if fragmented.is_empty() => {
                        "No free GPU capacity is out of the usual pod's reach (" code { (u) } ")."
                    }
                    Some(u) => {
                        strong { (gpus(total_frag)) " GPUs" }
                        " free that the usual pod (" code { (u) } ") can no longer use, on "
                        (fragmented.len()) " nodes: "
                        @for (i, (name, g)) in fragmented.iter().take(20).enumerate() {
                            @if i > 0 { ", " }
                            a href=(format!("/?node={}", encode(name))) { (name) } " (" (gpus(*g)) ")"
                        }
                        @if fragmented.len() > 20 { ", …" }
                        "."
                    }
                }
            }
        }
    }
}

fn waiting(pending: &[&Waiting]) -> Markup {
    html! {
        section #pending {
            h2 { "Waiting for a node" }
            @if pending.is_empty() {
                p { "No gpu-share pod is waiting." }
            } @else {
                table {
                    thead { tr { th { "pod" } th { "class" } th.n { "waiting" } th { "last reason" } } }
                    tbody {
                        @for w in pending {
                            tr data-pod=(format!("{}/{}", w.namespace, w.name)) {
                                td { (w.namespace) "/" (w.name) }
                                td { span class={"swatch c-" (w.class)} {} (w.class) }
                                td.n { (age(w.waited)) }
                                td.reason { (w.reason.as_deref().unwrap_or("not tried by the scheduler yet")) }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Each namespace's GPUs: what gpu-share holds for it, and each quota on the quantity, what it
/// counts against what it allows (the namespace filter applies).
fn quotas(all: &[crate::quota::usage::NamespaceUse], f: &Filter) -> Markup {
    let shown: Vec<_> = all
        .iter()
        .filter(|u| f.namespace.is_empty() || u.namespace == f.namespace)
        .collect();
    html! {
        section #quotas {
            h2 { "Namespaces and their quotas" }
            @if shown.is_empty() {
                p { "No namespace holds GPUs or has a quota on gpu-share.io/gpu-milli." }
            } @else {
                table {
                    thead { tr { th { "namespace" } th.n { "pods" } th.n { "held" } th { "quota" } th.n { "counted" } th.n { "allowed" } th { "note" } } }
                    tbody {
                        @for u in &shown {
                            @let rows = u.quotas.len().max(1);
                            tr data-namespace=(u.namespace) {
                                td rowspan=(rows) { (u.namespace) }
                                td.n rowspan=(rows) { (u.pods) }
                                td.n rowspan=(rows) { (gpus(u.held_gpus)) }
                                @match u.quotas.first() {
                                    Some(q) => {
                                        td { (q.name) }
                                        td.n { (q.used_gpus.map_or("-".to_string(), gpus)) }
                                        td.n { (gpus(q.hard_gpus)) }
                                    }
                                    None => { td { "none" } td.n { "-" } td.n { "-" } }
                                }
                                td.reason rowspan=(rows) { (u.note().unwrap_or_default()) }
                            }
                            @for q in u.quotas.iter().skip(1) {
                                tr data-namespace=(u.namespace) {
                                    td { (q.name) }
                                    td.n { (q.used_gpus.map_or("-".to_string(), gpus)) }
                                    td.n { (gpus(q.hard_gpus)) }
                                }
                            }
                        }
                    }
                }
                p.count { "In GPUs. Counted: the ResourceQuota's own count of requests.gpu-share.io/gpu-milli (pods waiting included); held: what gpu-share holds for the namespace's bound pods." }
            }
        }
    }
}

/// One node: what it is, then each of its GPUs cut into what holds it.
fn node(n: &NodeReport) -> Markup {
    let full = n
        .classes
        .iter()
        .find(|c| c.class != "mig")
        .map_or(0, |c| c.total.round() as u32);
    let classes: Vec<&str> = n.classes.iter().map(|c| c.class.as_str()).collect();
    html! {
        article.node data-node=(n.name) data-classes=(classes.join(" ")) data-model=(n.product.as_deref().unwrap_or("")) {
            h3 { (n.name) }
            p.facts {
                span.kind { (n.kind) } " · "
                span.product { (n.product.as_deref().unwrap_or("unknown product")) } " · "
                "mode read from " span.source { (format!("{:?}", n.mode_source).to_lowercase()) } " · "
                (gpus(n.used_gpus)) " of " (n.gpus) " GPUs allocated"
                @if let Some(g) = n.fragmented_gpus.filter(|g| *g > 0.0) {
                    " · " span.frag { (gpus(g)) " GPUs fragmented" }
                }
            }
            @if let Some(why) = &n.unreached { p.warn { "Unusable: " (why) } }
            @if let Some(why) = &n.per_gpu_refused { p.warn { "Not shared per GPU: " (why) } }
            @for plan in &n.defrag_plans { p.plan { "Defragmentation plan: " (plan) } }
            @if !n.enforcement.is_empty() { p.enforcement { "Shares' memory held by: " (n.enforcement) } }
            div.gpus {
                @for i in 0..full { (gpu(n, i)) }
                @for (profile, counts) in &n.mig { (mig(n, profile, counts)) }
            }
        }
    }
}

/// GPU `i` of a node's full GPUs: a bar cut into the shares the per-GPU model places on it.
fn gpu(n: &NodeReport, i: u32) -> Markup {
    let reservation = n.shared_gpus.iter().find(|g| g.gpu == i);
    let mut used = 0u32;
    let mut segments = Vec::new();
    for p in &n.pods {
        for (g, milli) in parse_model(&p.model) {
            if g == i && milli > 0 {
                used += milli;
                segments.push((p, milli));
            }
        }
    }
    html! {
        div.gpu data-gpu=(i) {
            div.label {
                "GPU " (i)
                @if let Some(r) = reservation {
                    " · " span.reservation data-state=(r.state) title=(r.detail.as_deref().unwrap_or("")) {
                        (r.reservation.as_deref().unwrap_or("no reservation")) " (" (r.state) ")"
                        @if let Some(u) = &r.uuid { " " code.uuid { (u) } }
                    }
                }
            }
            div.bar {
                @for (p, milli) in &segments {
                    span class={"seg c-" (p.kind)} style=(format!("width:{:.1}%", f64::from(*milli.min(&1000)) / 10.0))
                        data-pod=(format!("{}/{}", p.namespace, p.name))
                        title=(format!("{}/{}: {} ({} of GPU {})", p.namespace, p.name, p.class, pct(*milli), i)) {
                        (p.namespace) "/" (p.name)
                    }
                }
                @if used < 1000 {
                    span.seg.free style=(format!("width:{:.1}%", f64::from(1000 - used) / 10.0)) title=(format!("free: {}", pct(1000 - used))) {}
                }
            }
        }
    }
}

/// A node's MIG devices of one profile: a cell each, held ones labelled with their pod.
fn mig(n: &NodeReport, profile: &str, counts: &str) -> Markup {
    let total: usize = counts
        .split_once('/')
        .and_then(|(_, t)| t.parse().ok())
        .unwrap_or(0);
    let class = format!("mig-{profile}");
    let mut holders: Vec<String> = Vec::new();
    for p in n.pods.iter().filter(|p| p.kind == "mig") {
        let (name, count) = match p.class.split_once(",count=") {
            Some((c, k)) => (c, k.parse().unwrap_or(1)),
            None => (p.class.as_str(), 1),
        };
        if name == class {
            for _ in 0..count {
                holders.push(format!("{}/{}", p.namespace, p.name));
            }
        }
    }
    html! {
        div.mig data-profile=(profile) {
            div.label { "MIG " (profile) " · " (counts) }
            div.cells {
                @for k in 0..total.max(holders.len()) {
                    @if let Some(h) = holders.get(k) {
                        span.cell.c-mig data-pod=(h) title=(format!("{h}: {class}")) { (h) }
                    } @else {
                        span.cell.free title="free" {}
                    }
                }
            }
        }
    }
}

fn pager(f: &Filter, page: usize, pages: usize) -> Markup {
    html! {
        @if pages > 1 {
            nav.pager {
                @if page > 1 { a rel="prev" href=(f.query(page - 1)) { "← previous" } " " }
                "page " (page) " of " (pages)
                @if page < pages { " " a rel="next" href=(f.query(page + 1)) { "next →" } }
            }
        }
    }
}

fn legend() -> Markup {
    html! {
        footer {
            p.legend {
                @for c in CLASSES { span class={"swatch c-" (c)} {} (c) " " }
                span.swatch.free {} "free"
            }
            p { "Hover a share for its request. " (PreEscaped("Filters work without JavaScript.")) }
        }
    }
}

/// `0:300,1:1000` as (GPU, thousandths) pairs; nothing for an empty or unreadable model.
fn parse_model(model: &str) -> Vec<(u32, u32)> {
    model
        .split(',')
        .filter_map(|t| {
            let (g, m) = t.trim().split_once(':')?;
            Some((g.parse().ok()?, m.parse().ok()?))
        })
        .collect()
}

fn gpus(x: f64) -> String {
    let s = format!("{x:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn pct(milli: u32) -> String {
    format!("{}%", gpus(f64::from(milli) / 10.0))
}

/// A wait as people say it: `45 s`, `12 min`, `3 h 5 min`, `2 d 4 h`.
fn age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min", s / 60),
        3600..86400 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86400, s % 86400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;

    /// The example cluster's nodes with a pod of each class bound through the ledger.
    fn example() -> Occupancy {
        let nodes =
            crate::server::parse_nodes(include_str!("../../tests/fixtures/extender/nodes.yaml"))
                .unwrap();
        let pod = |name: &str, ns: &str, request: &str, node: &str, gpus: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": ns, "uid": format!("u-{name}"),
                    "annotations": {"gpu-share.io/request": request, "gpu-share.io/gpus": gpus}},
                "spec": {"containers": [{"name": "c"}], "nodeName": node},
                "status": {"phase": "Running"}
            }))
            .unwrap()
        };
        let pods = [
            pod("trainer", "ml", "mig-3g.40gb", "a100-mig", ""),
            pod("infer<x>", "web", "timeslice-50", "h100-ts", "0:500"),
        ];
        let mut reports =
            crate::status::reports_from(&crate::policy::Policy::default_policy(), &nodes, &pods);
        reports.sort_by(|a, b| a.name.cmp(&b.name));
        Occupancy {
            nodes: reports,
            usual: Some("timeslice-50".into()),
            pending: vec![Waiting {
                namespace: "ml".into(),
                name: "big".into(),
                class: "mps".into(),
                waited: Duration::from_secs(125),
                reason: Some("0/4 nodes fit: 1 <no> MPS replica".into()),
            }],
            quotas: crate::quota::usage::by_namespace(
                [("ml", 0.43), ("web", 0.5)],
                &[serde_json::from_value(serde_json::json!({
                    "metadata": {"name": "gpus<q>", "namespace": "ml"},
                    "spec": {"hard": {"requests.gpu-share.io/gpu-milli": "1500"}},
                    "status": {"used": {"requests.gpu-share.io/gpu-milli": "428"}},
                }))
                .unwrap()],
            ),
        }
    }

    /// Each namespace with what gpu-share holds for it and its quota in GPUs; a namespace
    /// without a quota says none; the namespace filter applies; names are text.
    #[test]
    fn namespaces_show_their_quotas_in_gpus() {
        let o = example();
        let html = render(&o, &Filter::default());
        let section =
            &html[html.find("id=\"quotas\"").unwrap()..html.find("id=\"nodes\"").unwrap()];
        assert!(section.contains("data-namespace=\"ml\""), "{section}");
        assert!(section.contains("gpus&lt;q&gt;"), "{section}");
        assert!(
            section.contains(">0.43<") && section.contains(">1.5<"),
            "{section}"
        );
        assert!(section.contains(">none<"), "web has no quota: {section}");
        let ml = render(
            &o,
            &Filter {
                namespace: "ml".into(),
                ..Default::default()
            },
        );
        let section = &ml[ml.find("id=\"quotas\"").unwrap()..ml.find("id=\"nodes\"").unwrap()];
        assert!(!section.contains("data-namespace=\"web\""), "{section}");
    }

    fn nodes_of(html: &str) -> Vec<String> {
        html.split("data-node=\"")
            .skip(1)
            .map(|s| s[..s.find('"').unwrap()].to_string())
            .collect()
    }

    #[test]
    fn every_node_and_pod_is_drawn_and_names_are_escaped() {
        let o = example();
        let html = render(&o, &Filter::default());
        let names: Vec<String> = o.nodes.iter().map(|n| n.name.clone()).collect();
        assert_eq!(nodes_of(&html), names);
        assert!(html.contains("data-pod=\"ml/trainer\""), "{html}");
        assert!(html.contains("data-pod=\"web/infer&lt;x&gt;\""), "{html}");
        assert!(
            !html.contains("infer<x>"),
            "a pod name is text, never markup"
        );
        assert!(
            html.contains("1 &lt;no&gt; MPS replica"),
            "the pending pod's reason"
        );
        assert!(html.contains("2 min"), "how long it waited");
        assert!(
            html.contains("width:50.0%"),
            "a 50% share is half its GPU's bar"
        );
    }

    #[test]
    fn filters_narrow_the_nodes_and_pages_split_them() {
        let o = example();
        let mig = render(
            &o,
            &Filter {
                class: "mig".into(),
                ..Default::default()
            },
        );
        let with_mig: Vec<String> = o
            .nodes
            .iter()
            .filter(|n| !n.mig.is_empty())
            .map(|n| n.name.clone())
            .collect();
        assert!(!with_mig.is_empty());
        assert_eq!(nodes_of(&mig), with_mig);
        let web = render(
            &o,
            &Filter {
                namespace: "web".into(),
                ..Default::default()
            },
        );
        assert_eq!(nodes_of(&web), ["h100-ts"]);
        assert!(
            web.contains("No gpu-share pod is waiting."),
            "ml's pod is filtered out"
        );
        let second = render(
            &o,
            &Filter {
                per: 1,
                page: 2,
                ..Default::default()
            },
        );
        assert_eq!(nodes_of(&second), [o.nodes[1].name.clone()]);
        assert!(second.contains("rel=\"next\"") && second.contains("rel=\"prev\""));
        assert!(second.contains(&format!("page 2 of {}", o.nodes.len())));
        let none = render(
            &o,
            &Filter {
                node: "nowhere".into(),
                ..Default::default()
            },
        );
        assert!(none.contains("No node matches."));
    }

    /// A GPU shared per GPU shows its reservation, its state and the UUID it holds.
    #[test]
    fn a_reserved_gpu_shows_its_reservation_and_uuid() {
        let mut o = example();
        let n = o.nodes.iter_mut().find(|n| n.name == "l40s-plain").unwrap();
        n.shared_gpus
            .push(crate::extender::report::SharedGpuReport {
                gpu: 3,
                reservation: Some("gpu-share-l40s-plain-gpu-3".into()),
                state: "ready".into(),
                uuid: Some("GPU-8a3f0c52-1c2d-4e5f-9a0b-123456789abc".into()),
                detail: None,
                shares: vec![],
            });
        let html = render(&o, &Filter::default());
        let l40s = html.split("data-node=\"l40s-plain\"").nth(1).unwrap();
        let gpu3 = l40s.split("data-gpu=\"3\"").nth(1).unwrap();
        assert!(
            gpu3.contains("gpu-share-l40s-plain-gpu-3 (ready)"),
            "{gpu3}"
        );
        assert!(gpu3.contains("GPU-8a3f0c52-1c2d-4e5f-9a0b-123456789abc"));
    }

    #[test]
    fn waits_read_as_people_say_them() {
        assert_eq!(age(Duration::from_secs(45)), "45 s");
        assert_eq!(age(Duration::from_secs(3 * 3600 + 300)), "3 h 5 min");
        assert_eq!(age(Duration::from_secs(2 * 86400 + 4 * 3600)), "2 d 4 h");
        assert_eq!(parse_model("0:300,1:1000"), [(0, 300), (1, 1000)]);
        assert_eq!(encode("a b/ü"), "a%20b%2F%C3%BC");
    }
}

//! The `gpu-share status` output: the table, the wide table, JSON and YAML.

use crate::extender::report::NodeReport;
use crate::quota::usage::NamespaceUse;

/// `gpu-share status -o`: kubectl's output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// The table.
    Table,
    /// The table with more columns: where the mode was read from, the resource and replicas,
    /// GPU memory, and the GPUs shared per GPU.
    Wide,
    /// The `/v1/nodes` shape as JSON.
    Json,
    /// The `/v1/nodes` shape as YAML.
    Yaml,
}

impl Output {
    pub fn is_table(self) -> bool {
        matches!(self, Output::Table | Output::Wide)
    }
}

/// How often `gpu-share status --watch` reads the ledger again.
pub const WATCH_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// The reports (and, read from the cluster, the pending pods; and each namespace's GPUs against
/// its quotas, or why they could not be read) in `output`'s format. JSON and YAML carry the
/// reports alone, as `/v1/nodes` does; YAML as one document (`---` first, so a watch's documents
/// stay apart).
pub fn format(
    reports: &[NodeReport],
    pending: Option<&[PendingPod]>,
    quotas: Option<&Result<Vec<NamespaceUse>, QuotasUnreadable>>,
    output: Output,
) -> String {
    let after = || {
        let quotas = match quotas {
            Some(Ok(q)) => render_quotas(q),
            Some(Err(why)) => format!("quotas: {why}\n"),
            None => String::new(),
        };
        pending.map(render_pending).unwrap_or_default() + &quotas
    };
    match output {
        Output::Table => render(reports) + &after(),
        Output::Wide => render_wide(reports) + &after(),
        Output::Json => serde_json::to_string_pretty(reports).unwrap_or_default() + "\n",
        Output::Yaml => format!(
            "---\n{}",
            serde_saphyr::to_string(&reports)
                .unwrap_or_else(|e| format!("# cannot write YAML: {e}\n"))
        ),
    }
}

/// A node's kind, and whether it is cordoned (kubectl's `SchedulingDisabled`).
fn kind(r: &NodeReport) -> String {
    if r.cordoned {
        format!("{}, cordoned", r.kind)
    } else {
        r.kind.clone()
    }
}

/// The table with more columns.
pub fn render_wide(reports: &[NodeReport]) -> String {
    let mut rows = vec![
        [
            "NODE", "KIND", "SOURCE", "PRODUCT", "GPUS", "MEMORY", "RESOURCE", "REPLICAS", "USED",
            "FREE", "SLOTS", "MIG", "PODS",
        ]
        .map(String::from),
    ];
    for r in reports {
        rows.push([
            r.name.clone(),
            kind(r),
            format!("{:?}", r.mode_source).to_lowercase(),
            r.product.clone().unwrap_or_else(|| "-".into()),
            r.gpus.to_string(),
            r.gpu_memory_mib
                .map_or_else(|| "-".into(), |m| format!("{m}Mi")),
            if r.resource.is_empty() {
                "-".into()
            } else {
                r.resource.clone()
            },
            r.replicas.to_string(),
            format!("{:.2}", r.used_gpus),
            format!("{:.2}", r.free_gpus),
            r.slots.clone(),
            mig_column(r),
            pods_column(r),
        ]);
    }
    with_footer(&rows, reports)
}

fn mig_column(r: &NodeReport) -> String {
    let mig = r
        .mig
        .iter()
        .map(|(p, c)| format!("{p}:{c}"))
        .collect::<Vec<_>>()
        .join(" ");
    if mig.is_empty() {
        "-".into()
    } else {
        format!("{mig} (={:.2} GPUs)", r.mig_gpus)
    }
}

fn pods_column(r: &NodeReport) -> String {
    let pods = r
        .pods
        .iter()
        .map(|p| format!("{}/{}({})", p.namespace, p.name, p.class))
        .collect::<Vec<_>>()
        .join(" ");
    if pods.is_empty() { "-".into() } else { pods }
}

/// Why nodes cannot be used, or are not shared per GPU though asked; what holds a share's
/// memory on each; the defragmentation plans that would make room on each.
fn notes(reports: &[NodeReport]) -> String {
    let mut out = String::new();
    for r in reports {
        if !r.enforcement.is_empty() {
            out.push_str(&format!("memory held: {}: {}\n", r.name, r.enforcement));
        }
        if let Some(why) = &r.unreached {
            out.push_str(&format!("unusable: {}: {why}\n", r.name));
        }
        if let Some(why) = &r.per_gpu_refused {
            out.push_str(&format!("not shared per GPU: {}: {why}\n", r.name));
        }
        for plan in &r.defrag_plans {
            out.push_str(&format!("defragmentation plan: {}: {plan}\n", r.name));
        }
    }
    out
}

/// Renders the reports as a table.
pub fn render(reports: &[NodeReport]) -> String {
    let mut rows = vec![[
        "NODE".to_string(),
        "KIND".to_string(),
        "PRODUCT".to_string(),
        "GPUS".to_string(),
        "USED".to_string(),
        "FREE".to_string(),
        "SLOTS".to_string(),
        "MIG".to_string(),
        "PODS".to_string(),
    ]];
    for r in reports {
        rows.push([
            r.name.clone(),
            kind(r),
            r.product.clone().unwrap_or_else(|| "-".into()),
            r.gpus.to_string(),
            format!("{:.2}", r.used_gpus),
            format!("{:.2}", r.free_gpus),
            r.slots.clone(),
            mig_column(r),
            pods_column(r),
        ]);
    }
    with_footer(&rows, reports)
}

/// The table, then the totals, the notes on nodes and the GPUs shared per GPU.
fn with_footer<const N: usize>(rows: &[[String; N]], reports: &[NodeReport]) -> String {
    table(rows) + &totals(reports) + &notes(reports) + &shared_gpus(reports)
}

/// Rows as aligned columns, two spaces apart; the last column is not padded.
fn table<const N: usize>(rows: &[[String; N]]) -> String {
    let widths: Vec<usize> = (0..N)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i + 1 == N {
                    c.clone()
                } else {
                    format!("{c:<w$}", w = widths[i])
                }
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// The GPUs gpu-share shares per GPU, each with its reservation, its UUID and its shares, then
/// why any reservation failed or waits; nothing when there are none.
fn shared_gpus(reports: &[NodeReport]) -> String {
    let mut rows = vec![[
        "NODE".to_string(),
        "GPU".to_string(),
        "RESERVATION".to_string(),
        "STATE".to_string(),
        "UUID".to_string(),
        "SHARES".to_string(),
    ]];
    let mut notes = String::new();
    for r in reports {
        for g in &r.shared_gpus {
            rows.push([
                r.name.clone(),
                g.gpu.to_string(),
                g.reservation.clone().unwrap_or_else(|| "-".into()),
                g.state.clone(),
                g.uuid.clone().unwrap_or_else(|| "-".into()),
                if g.shares.is_empty() {
                    "-".into()
                } else {
                    g.shares.join(" ")
                },
            ]);
            if let Some(d) = &g.detail {
                notes.push_str(&format!("{} GPU {}: {d}\n", r.name, g.gpu));
            }
        }
    }
    if rows.len() == 1 {
        return String::new();
    }
    format!("\nGPUs shared per GPU:\n{}{notes}", table(&rows))
}

/// The last line of the table: physical GPUs, then use and free room in GPUs, with the MIG
/// devices' worth apart (MIG devices that leave slices unused make used + free less than the
/// GPUs).
fn totals(reports: &[NodeReport]) -> String {
    let gpus: u64 = reports.iter().map(|r| u64::from(r.gpus)).sum();
    // + 0.0: an empty f64 sum is -0.0, which would print as -0.00.
    let used: f64 = reports.iter().map(|r| r.used_gpus).sum::<f64>() + 0.0;
    let free: f64 = reports.iter().map(|r| r.free_gpus).sum::<f64>() + 0.0;
    let mig: f64 = reports.iter().map(|r| r.mig_gpus).sum::<f64>() + 0.0;
    let mig = if mig > 0.0 {
        format!("; MIG devices count by compute share, {mig:.2} GPUs of them in all")
    } else {
        String::new()
    };
    let unusable: u64 = reports
        .iter()
        .filter(|r| r.unreached.is_some())
        .map(|r| u64::from(r.gpus))
        .sum();
    let unusable = if unusable > 0 {
        format!("; {unusable} GPUs on nodes no pod of their class can use (below)")
    } else {
        String::new()
    };
    format!(
        "{} GPU nodes, {gpus} GPUs: {used:.2} allocated, {free:.2} free{mig}{unusable}\n",
        reports.len()
    )
}

/// The pending pods under the node table: one line per pod, its reason after it.
pub fn render_pending(pending: &[PendingPod]) -> String {
    if pending.is_empty() {
        return "no gpu-share pod is pending\n".to_string();
    }
    let mut out = format!("{} gpu-share pods pending:\n", pending.len());
    for p in pending {
        let since = p
            .since
            .as_deref()
            .map(|s| format!(" since {s}"))
            .unwrap_or_default();
        out.push_str(&format!(
            "  {}/{} ({}){since}: {}\n",
            p.namespace, p.name, p.class, p.reason
        ));
    }
    out
}

/// Each namespace's GPUs under the pending pods: what gpu-share holds for it, and each of its
/// quotas on the quantity, counted against allowed, in GPUs; a note where the counts differ.
pub fn render_quotas(quotas: &[NamespaceUse]) -> String {
    if quotas.is_empty() {
        return "no namespace holds GPUs or has a quota on gpu-share.io/gpu-milli\n".to_string();
    }
    let g = |x: f64| format!("{x:.2}");
    let mut rows =
        vec![["NAMESPACE", "PODS", "HELD", "QUOTA", "COUNTED", "ALLOWED"].map(String::from)];
    let mut notes = Vec::new();
    for u in quotas {
        let first = u.quotas.first();
        rows.push([
            u.namespace.clone(),
            u.pods.to_string(),
            g(u.held_gpus),
            first.map_or("-".into(), |q| q.name.clone()),
            first.and_then(|q| q.used_gpus).map_or("-".into(), g),
            first.map_or("-".into(), |q| g(q.hard_gpus)),
        ]);
        for q in u.quotas.iter().skip(1) {
            rows.push([
                String::new(),
                String::new(),
                String::new(),
                q.name.clone(),
                q.used_gpus.map_or("-".into(), g),
                g(q.hard_gpus),
            ]);
        }
        if let Some(n) = u.note() {
            notes.push(format!("  {}: {n}\n", u.namespace));
        }
    }
    let mut out = format!(
        "GPUs per namespace (held: gpu-share's ledger; counted and allowed: ResourceQuotas on requests.gpu-share.io/gpu-milli):\n{}",
        table(&rows)
    );
    for n in notes {
        out.push_str(&n);
    }
    out
}

/// Why the ResourceQuotas could not be listed (said under the table; the rest stands).
#[derive(Debug, thiserror::Error)]
#[error("cannot list ResourceQuotas: {0}")]
pub struct QuotasUnreadable(#[source] pub kube::Error);

/// A gpu-share pod no node has taken yet, with kube-scheduler's last word on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingPod {
    pub namespace: String,
    pub name: String,
    /// The normalized request (`gpu-share.io/request`), else the `gpu-share` annotation.
    pub class: String,
    /// When the pod was last found unschedulable (the PodScheduled condition's transition).
    pub since: Option<String>,
    /// The condition's message (kube-scheduler's FailedScheduling text, gpu-share's reasons in
    /// it), or its reason, or that the scheduler has not tried yet.
    pub reason: String,
}

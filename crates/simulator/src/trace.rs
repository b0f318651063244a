//! PURE: reading the openb trace (Alibaba cluster-trace-gpu-v2023) into the packing core's types.
//!
//! Nodes (`sn,cpu_milli,memory_mib,gpu,model`) become per-GPU nodes ([`Sharing::PerGpu`]) that
//! account CPU and memory. Pods (`name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]`)
//! become demands: a share below 1000 of one GPU is a shared-GPU request
//! ([`GpuDemand::Timeslice`]), whole GPUs are exclusive ([`GpuDemand::Whole`]), no GPU is a
//! CPU-only pod; `gpu_spec` (`A|B`) lists the allowed models.

use thiserror::Error;

use crate::inventory::{GpuNode, MAX_GPUS_PER_NODE, MigLayout, Sharing};
use crate::packing::{self, Demand, GPU_MILLI, GpuDemand};

/// One pod of a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracePod {
    pub name: String,
    pub demand: Demand,
}

impl TracePod {
    /// Thousandths of GPU the pod asks for in total.
    pub fn gpu_milli(&self) -> u64 {
        gpu_request_milli(&self.demand)
    }
}

/// Thousandths of GPU a demand asks for in total. A MIG device counts by its compute slices
/// (`3g.40gb` is 3/7 of a GPU).
pub fn gpu_request_milli(d: &Demand) -> u64 {
    d.gpu.milli()
}

/// A node's GPU capacity in thousandths: its full GPUs plus its MIG devices by compute share.
pub fn node_capacity_milli(n: &GpuNode) -> u64 {
    let mig: u64 = match &n.mig {
        MigLayout::None => 0,
        MigLayout::Single { profile, .. } => {
            u64::from(n.slots) * u64::from(packing::mig_profile_milli(profile))
        }
        MigLayout::Mixed { instances } => instances
            .iter()
            .map(|(p, c)| u64::from(*c) * u64::from(packing::mig_profile_milli(p)))
            .sum(),
    };
    u64::from(n.gpus) * u64::from(GPU_MILLI) + mig
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum TraceError {
    #[error("line {line}: {message}")]
    Row { line: u64, message: String },
    #[error("missing column {0:?} in the header")]
    Column(&'static str),
    #[error("{0}")]
    Csv(String),
    #[error("no rows")]
    Empty,
}

fn columns(headers: &csv::StringRecord, wanted: &[&'static str]) -> Result<Vec<usize>, TraceError> {
    wanted
        .iter()
        .map(|w| {
            headers
                .iter()
                .position(|h| h.trim() == *w)
                .ok_or(TraceError::Column(w))
        })
        .collect()
}

fn field<T: std::str::FromStr>(
    rec: &csv::StringRecord,
    idx: usize,
    name: &str,
    line: u64,
) -> Result<T, TraceError> {
    let raw = rec.get(idx).unwrap_or("").trim();
    raw.parse().map_err(|_| TraceError::Row {
        line,
        message: format!("{name} {raw:?} is not a non-negative integer"),
    })
}

/// A CSV reader over `text` and its header row.
fn open(text: &str) -> Result<(csv::Reader<&[u8]>, csv::StringRecord), TraceError> {
    let mut r = csv::ReaderBuilder::new()
        .flexible(true)
        .from_reader(text.as_bytes());
    let headers = r
        .headers()
        .map_err(|e| TraceError::Csv(e.to_string()))?
        .clone();
    Ok((r, headers))
}

/// A trace node: `gpus` GPUs of `model`, placed per GPU, with CPU and memory accounted.
pub fn trace_node(name: &str, cpu_milli: u64, memory_mib: u64, gpus: u32, model: &str) -> GpuNode {
    GpuNode {
        product: (!model.is_empty()).then(|| model.to_string()),
        gpu_memory_mib: None,
        sharing: Sharing::PerGpu,
        slots: 0,
        cpu_milli: Some(cpu_milli),
        memory_mib: Some(memory_mib),
        ..GpuNode::whole(name, model, gpus, 0)
    }
}

/// Parses an openb node CSV.
pub fn parse_nodes_csv(text: &str) -> Result<Vec<GpuNode>, TraceError> {
    let (mut r, headers) = open(text)?;
    let c = columns(&headers, &["sn", "cpu_milli", "memory_mib", "gpu", "model"])?;
    let mut out = Vec::new();
    for rec in r.records() {
        let rec = rec.map_err(|e| TraceError::Csv(e.to_string()))?;
        let line = rec.position().map_or(0, |p| p.line());
        let name = rec.get(c[0]).unwrap_or("").trim();
        if name.is_empty() {
            return Err(TraceError::Row {
                line,
                message: "empty node name".into(),
            });
        }
        let gpus: u32 = field(&rec, c[3], "gpu", line)?;
        if gpus > MAX_GPUS_PER_NODE {
            return Err(TraceError::Row {
                line,
                message: format!(
                    "{gpus} GPUs on one node is more than gpu-share models ({MAX_GPUS_PER_NODE})"
                ),
            });
        }
        out.push(trace_node(
            name,
            field(&rec, c[1], "cpu_milli", line)?,
            field(&rec, c[2], "memory_mib", line)?,
            gpus,
            rec.get(c[4]).unwrap_or("").trim(),
        ));
    }
    if out.is_empty() {
        return Err(TraceError::Empty);
    }
    Ok(out)
}

/// Parses an openb pod CSV (the `gpu_spec` column is optional).
pub fn parse_pods_csv(text: &str) -> Result<Vec<TracePod>, TraceError> {
    let (mut r, headers) = open(text)?;
    let c = columns(
        &headers,
        &["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"],
    )?;
    let spec = headers.iter().position(|h| h.trim() == "gpu_spec");
    let mut out = Vec::new();
    for rec in r.records() {
        let rec = rec.map_err(|e| TraceError::Csv(e.to_string()))?;
        let line = rec.position().map_or(0, |p| p.line());
        let name = rec.get(c[0]).unwrap_or("").trim().to_string();
        if name.is_empty() {
            return Err(TraceError::Row {
                line,
                message: "empty pod name".into(),
            });
        }
        let num_gpu: u32 = field(&rec, c[3], "num_gpu", line)?;
        let gpu_milli: u32 = field::<u32>(&rec, c[4], "gpu_milli", line)?.min(GPU_MILLI);
        let gpu = match (num_gpu, gpu_milli) {
            (0, _) | (_, 0) => GpuDemand::None,
            (1, m) if m < GPU_MILLI => GpuDemand::Timeslice {
                milli: m,
                memory_mib: None,
            },
            (n, GPU_MILLI) => GpuDemand::Whole { count: n },
            (n, m) => {
                return Err(TraceError::Row {
                    line,
                    message: format!(
                        "{n} GPUs with a share of {m}/1000 each: shares below 1000 are for one GPU"
                    ),
                });
            }
        };
        let models = spec
            .and_then(|i| rec.get(i))
            .map(|s| {
                s.split('|')
                    .map(str::trim)
                    .filter(|m| !m.is_empty())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default();
        out.push(TracePod {
            name,
            demand: Demand {
                cpu_milli: field(&rec, c[1], "cpu_milli", line)?,
                memory_mib: field(&rec, c[2], "memory_mib", line)?,
                gpu,
                models,
                resources: Vec::new(),
                devices: None,
                enforcement: crate::enforcement::Requirement::Off,
                driver_limit_mib: None,
            },
        });
    }
    if out.is_empty() {
        return Err(TraceError::Empty);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_and_pods_from_openb_csv() {
        let nodes = parse_nodes_csv(
            "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\nn1,96000,393216,8,G2\n",
        )
        .unwrap();
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[1].gpus, 8);
        assert_eq!(nodes[1].product.as_deref(), Some("G2"));
        assert_eq!(nodes[0].cpu_milli, Some(64000));
        assert_eq!(nodes[0].sharing, Sharing::PerGpu);

        let pods = parse_pods_csv(
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\n\
             a,12000,16384,1,1000,,LS\n\
             b,6000,12288,1,460,V100M16|V100M32,LS\n\
             c,4000,100,0,0,,BE\n\
             d,88000,1000,8,1000,,LS\n",
        )
        .unwrap();
        assert_eq!(pods[0].demand.gpu, GpuDemand::Whole { count: 1 });
        assert_eq!(
            pods[1].demand.gpu,
            GpuDemand::Timeslice {
                milli: 460,
                memory_mib: None
            }
        );
        assert_eq!(pods[1].demand.models, vec!["V100M16", "V100M32"]);
        assert_eq!(pods[2].demand.gpu, GpuDemand::None);
        assert_eq!(pods[3].gpu_milli(), 8000);
        assert_eq!(pods[1].gpu_milli(), 460);
    }

    #[test]
    fn multigpu_files_have_five_columns() {
        let pods =
            parse_pods_csv("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,10,2,1000\n")
                .unwrap();
        assert_eq!(pods[0].demand.gpu, GpuDemand::Whole { count: 2 });
        assert!(pods[0].demand.models.is_empty());
    }

    #[test]
    fn bad_rows_say_where_and_why() {
        let e = parse_pods_csv("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,x,10,1,10\n")
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "line 2: cpu_milli \"x\" is not a non-negative integer"
        );
        let e = parse_pods_csv("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,10,2,500\n")
            .unwrap_err();
        assert!(e.to_string().contains("shares below 1000 are for one GPU"));
        assert_eq!(
            parse_nodes_csv("sn,cpu_milli,gpu\n").unwrap_err(),
            TraceError::Column("memory_mib")
        );
    }
}

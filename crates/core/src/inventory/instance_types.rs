//! PURE: the physical GPUs of the three clouds' GPU instance types (`instance_types.tsv`, from
//! the vendors' documentation), for nodes whose GPUs no label describes. NVIDIA's device plugin
//! advertises a time-sliced or MPS GPU's replicas as `nvidia.com/gpu`; without GPU Feature
//! Discovery's labels nothing else says so, and an `exclusive-2` pod could get two replicas of
//! one GPU. The instance type (`node.kubernetes.io/instance-type`, kubelet's, from the cloud
//! provider) gives the count, so capacity above it is known to be shared.

use std::collections::HashMap;
use std::sync::OnceLock;

/// The well-known label kubelet sets from the cloud provider.
pub const LABEL_INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";

const TABLE: &str = include_str!("instance_types.tsv");

/// One instance type's GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceGpus {
    pub cloud: &'static str,
    pub gpus: u32,
    /// The model as the vendor names it (`NVIDIA L4`), not GFD's product label.
    pub model: &'static str,
}

fn table() -> &'static HashMap<&'static str, InstanceGpus> {
    static TABLE_MAP: OnceLock<HashMap<&'static str, InstanceGpus>> = OnceLock::new();
    TABLE_MAP.get_or_init(|| {
        TABLE
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(|l| {
                let mut f = l.split('\t');
                let (cloud, name, gpus, model) = (f.next()?, f.next()?, f.next()?, f.next()?);
                Some((
                    name,
                    InstanceGpus {
                        cloud,
                        gpus: gpus.parse().ok()?,
                        model,
                    },
                ))
            })
            .collect()
    })
}

/// The GPUs of an instance type, if the table has it.
pub fn lookup(instance_type: &str) -> Option<InstanceGpus> {
    table().get(instance_type.trim()).copied()
}

/// What a node that advertises `advertised` units of `nvidia.com/gpu` on an instance type of
/// `physical` GPUs has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advertised {
    /// Whole GPUs (some may be unhealthy or not yet advertised: fewer than the type has).
    Whole,
    /// Each GPU advertised `replicas` times: shared by the device plugin.
    Replicas(u32),
    /// A count that is no multiple of the GPUs: nothing can be said.
    Unknown,
}

pub fn advertised(advertised: u32, physical: u32) -> Advertised {
    if physical == 0 {
        Advertised::Unknown
    } else if advertised <= physical {
        Advertised::Whole
    } else if advertised.is_multiple_of(physical) {
        Advertised::Replicas(advertised / physical)
    } else {
        Advertised::Unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_reads_each_cloud() {
        assert_eq!(lookup("g6.12xlarge").map(|t| t.gpus), Some(4));
        assert_eq!(lookup("g5.xlarge").map(|t| t.gpus), Some(1));
        assert_eq!(
            lookup("p5.48xlarge").map(|t| (t.cloud, t.gpus)),
            Some(("aws", 8))
        );
        assert_eq!(
            lookup("Standard_NC24ads_A100_v4").map(|t| (t.cloud, t.gpus)),
            Some(("azure", 1))
        );
        assert_eq!(
            lookup("a2-highgpu-4g").map(|t| (t.cloud, t.gpus)),
            Some(("gcp", 4))
        );
        // Fractional vGPU types and unknown names are not in it.
        assert_eq!(lookup("g6f.large"), None);
        assert_eq!(lookup("m5.large"), None);
        // Every row parsed.
        let rows = TABLE
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .count();
        assert_eq!(table().len(), rows);
        assert!(rows > 100, "{rows}");
    }

    #[test]
    fn capacity_above_the_count_is_replicas() {
        assert_eq!(advertised(4, 4), Advertised::Whole);
        assert_eq!(advertised(3, 4), Advertised::Whole);
        assert_eq!(advertised(16, 4), Advertised::Replicas(4));
        assert_eq!(advertised(10, 4), Advertised::Unknown);
        assert_eq!(advertised(1, 0), Advertised::Unknown);
    }
}

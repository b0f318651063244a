//! ResourceClaims (`resource.k8s.io/v1`) as far as gpu-share reads them: which devices of
//! driver `gpu.nvidia.com` a claim was allocated, on which node, and for which pods.

use serde::Deserialize;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The annotation kube-scheduler puts on the claims it makes for extended resources backed by
/// DRA (KEP-5004).
pub const EXTENDED_RESOURCE_CLAIM: &str = "resource.kubernetes.io/extended-resource-claim";

/// One ResourceClaim (the parts gpu-share reads).
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(default)]
pub struct ResourceClaim {
    pub metadata: ObjectMeta,
    pub status: ClaimStatus,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub struct ClaimStatus {
    pub allocation: Option<Allocation>,
    pub reserved_for: Vec<Consumer>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(default)]
pub struct Allocation {
    pub devices: AllocatedDevices,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(default)]
pub struct AllocatedDevices {
    pub results: Vec<AllocationResult>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub struct AllocationResult {
    pub request: String,
    pub driver: String,
    pub pool: String,
    pub device: String,
    /// Set for a device many claims share (KEP-5075).
    #[serde(rename = "shareID")]
    pub share_id: Option<String>,
    pub consumed_capacity: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub struct Consumer {
    pub api_group: Option<String>,
    pub resource: String,
    pub name: String,
    pub uid: String,
}

/// One device of the driver allocated to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedDevice {
    /// The driver's pool: the node.
    pub pool: String,
    pub device: String,
    /// The shares the allocation consumed of a device shared by consumable capacity
    /// (`consumedCapacity.shares`), when it says.
    pub shares: Option<u64>,
}

/// What a claim holds of driver `gpu.nvidia.com`'s devices, read once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// Made by kube-scheduler for a pod's extended resource (KEP-5004).
    pub extended: bool,
    /// The node (the driver names its pool after the node) and device of each result.
    pub devices: Vec<ClaimedDevice>,
    /// The pods it is reserved for, and the pod that owns it (a KEP-5004 claim's), by UID.
    pub pods: Vec<String>,
}

impl Claim {
    /// `None` for a claim with no device of the driver allocated (pending, or another driver's).
    pub fn read(c: &ResourceClaim) -> Option<Claim> {
        let allocation = c.status.allocation.as_ref()?;
        let devices: Vec<ClaimedDevice> = allocation
            .devices
            .results
            .iter()
            .filter(|r| r.driver == crate::nvidia::DRA_DRIVER)
            .map(|r| ClaimedDevice {
                pool: r.pool.clone(),
                device: r.device.clone(),
                shares: r
                    .consumed_capacity
                    .get("shares")
                    .and_then(|q| crate::inventory::quantity_count(q)),
            })
            .collect();
        let uid = c.metadata.uid.clone().filter(|u| !u.is_empty())?;
        if devices.is_empty() {
            return None;
        }
        let mut pods: Vec<String> = c
            .status
            .reserved_for
            .iter()
            .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or("").is_empty())
            .map(|r| r.uid.clone())
            .chain(
                c.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .filter(|o| o.kind == "Pod" && o.controller == Some(true))
                    .map(|o| o.uid.clone()),
            )
            .filter(|u| !u.is_empty())
            .collect();
        pods.sort();
        pods.dedup();
        Some(Claim {
            uid,
            namespace: c.metadata.namespace.clone().unwrap_or_default(),
            name: c.metadata.name.clone().unwrap_or_default(),
            extended: c
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(EXTENDED_RESOURCE_CLAIM))
                .is_some_and(|v| v == "true"),
            devices,
            pods,
        })
    }

    /// The nodes its devices are on.
    pub fn nodes(&self) -> std::collections::BTreeSet<&str> {
        self.devices.iter().map(|d| d.pool.as_str()).collect()
    }
}

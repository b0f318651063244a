//! One node's devices as NVIDIA's DRA driver publishes them ([`DraNode`]), and the
//! [`GpuNode`] the extender packs onto: whole GPUs through KEP-5004's `nvidia.com/gpu`, static
//! MIG devices through gpu-share's DeviceClasses (`nvidia.com/mig-<profile>`).

use std::collections::BTreeMap;

use serde::Serialize;

use super::slice::{Device, ResourceSlice};
use crate::inventory::{GpuNode, MigLayout, ModeSource, RESOURCE_GPU, Sharing};

/// What a device is, by the driver's `type` attribute.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Kind {
    /// A whole GPU (`type: gpu`).
    Gpu {
        /// The NVML minor number in its name, `gpu-<minor>`.
        minor: u32,
    },
    /// A static MIG device (`type: mig`) of `profile`, cut from the GPU `parent` (a UUID).
    Mig {
        profile: String,
        parent: Option<String>,
    },
}

/// One device gpu-share can account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DraDevice {
    pub name: String,
    #[serde(flatten)]
    pub kind: Kind,
    pub uuid: Option<String>,
    /// `capacity.memory`, MiB.
    pub memory_mib: Option<u64>,
    /// KEP-5075 consumable capacity (the driver's ConsumableShares): how many claims may share
    /// the device (`capacity.shares`), or `Some(0)` when they share it by memory alone.
    pub shares: Option<u64>,
}

/// A node's devices, read from the driver's slices for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DraNode {
    pub node: String,
    /// `productName`, e.g. `NVIDIA H100 80GB HBM3`.
    pub product: Option<String>,
    /// `driverVersion`, e.g. `550.54.15`.
    pub driver_version: Option<String>,
    /// Whether a `nodeModes` rule of the policy declares the node `time-slicing` (the node's
    /// labels, [`crate::inventory::declared_mode`]): the opt-in for gpu-share's time-sliced
    /// shares to take the driver's consumable shares here.
    pub shares_declared: bool,
    /// By device name.
    pub devices: BTreeMap<String, DraDevice>,
    /// Devices gpu-share does not account (VFIO passthrough, an unknown `type`), by name.
    pub other: Vec<String>,
}

impl DraNode {
    /// The node's devices from every slice of driver `gpu.nvidia.com` in its pool (named after
    /// the node), at the pool's newest generation: older generations are being replaced.
    /// `None` when no slice of the driver names the node.
    pub fn from_slices<'a>(
        node: &str,
        slices: impl IntoIterator<Item = &'a ResourceSlice>,
    ) -> Option<DraNode> {
        let ours: Vec<&ResourceSlice> = slices
            .into_iter()
            .filter(|s| {
                s.spec.driver == crate::nvidia::DRA_DRIVER
                    && s.spec.node_name.as_deref() == Some(node)
                    && s.metadata.deletion_timestamp.is_none()
            })
            .collect();
        let newest = ours.iter().map(|s| s.spec.pool.generation).max()?;
        let mut out = DraNode {
            node: node.to_string(),
            product: None,
            driver_version: None,
            shares_declared: false,
            devices: BTreeMap::new(),
            other: Vec::new(),
        };
        for s in ours.iter().filter(|s| s.spec.pool.generation == newest) {
            for d in &s.spec.devices {
                if out.product.is_none() {
                    out.product = d.text("productName").map(str::to_string);
                }
                if out.driver_version.is_none() {
                    out.driver_version = d.text("driverVersion").map(str::to_string);
                }
                match read_device(d) {
                    Some(dev) => {
                        out.devices.insert(dev.name.clone(), dev);
                    }
                    None => out.other.push(d.name.clone()),
                }
            }
        }
        out.other.sort();
        Some(out)
    }

    /// The whole GPUs, by minor number: their index in the packing model is their place here.
    pub fn gpus(&self) -> Vec<&DraDevice> {
        let mut v: Vec<&DraDevice> = self
            .devices
            .values()
            .filter(|d| matches!(d.kind, Kind::Gpu { .. }))
            .collect();
        v.sort_by_key(|d| match d.kind {
            Kind::Gpu { minor } => minor,
            Kind::Mig { .. } => u32::MAX,
        });
        v
    }

    /// The index of whole GPU `device` in the packing model.
    pub fn gpu_index(&self, device: &str) -> Option<u32> {
        self.gpus()
            .iter()
            .position(|d| d.name == device)
            .map(|i| i as u32)
    }

    /// MIG devices per profile.
    pub fn mig_instances(&self) -> BTreeMap<String, u32> {
        let mut m = BTreeMap::new();
        for d in self.devices.values() {
            if let Kind::Mig { profile, .. } = &d.kind {
                *m.entry(profile.clone()).or_insert(0) += 1;
            }
        }
        m
    }

    /// Physical GPUs: the whole ones and the parents the MIG devices are cut from.
    pub fn physical_gpus(&self) -> u32 {
        let parents: std::collections::BTreeSet<&str> = self
            .devices
            .values()
            .filter_map(|d| match &d.kind {
                Kind::Mig { parent, .. } => Some(parent.as_deref().unwrap_or(d.name.as_str())),
                Kind::Gpu { .. } => None,
            })
            .collect();
        self.gpus().len() as u32 + parents.len() as u32
    }

    /// Whether any device takes many claims by consumable capacity (KEP-5075).
    pub fn publishes_shares(&self) -> bool {
        self.devices.values().any(|d| d.shares.is_some())
    }

    /// The node as the extender packs onto it. Whole GPUs are reached through KEP-5004 (the
    /// driver's DeviceClass `gpu.nvidia.com` maps `nvidia.com/gpu`), MIG devices through
    /// gpu-share's DeviceClasses (one per profile, `nvidia.com/mig-<profile>`): those are the
    /// resources it "advertises". Its GPUs are never shared by a device plugin.
    pub fn gpu_node(&self) -> GpuNode {
        let gpus = self.gpus();
        let whole = gpus.len() as u32;
        let product = self.product.as_deref().map(gfd_product);
        let instances = self.mig_instances();
        let has_mig = !instances.is_empty();
        let mut advertised = Vec::new();
        if whole > 0 {
            advertised.push(RESOURCE_GPU.to_string());
        }
        let mut mig_memory_mib = BTreeMap::new();
        for d in self.devices.values() {
            if let (Kind::Mig { profile, .. }, Some(mib)) = (&d.kind, d.memory_mib) {
                mig_memory_mib.entry(profile.clone()).or_insert(mib);
            }
        }
        advertised.extend(instances.keys().map(|p| crate::mig::resource_name(p)));
        advertised.sort();
        // Devices many claims share by consumable capacity (the driver's ConsumableShares): a
        // claim takes a share there, never a whole device. Shown as the shares per device (by
        // memory alone: 1). gpu-share's time-sliced shares take them where the policy declares
        // the node time-slicing (`shares_declared`), nothing else (`packing::fit`).
        let sharing = match self.devices.values().filter_map(|d| d.shares).max() {
            Some(n) => Sharing::TimeSlicing {
                replicas: u32::try_from(n).unwrap_or(u32::MAX).max(1),
            },
            None => Sharing::None,
        };
        GpuNode {
            name: self.node.clone(),
            product,
            gpus: whole,
            gpu_memory_mib: gpus.iter().filter_map(|d| d.memory_mib).min(),
            sharing,
            slots: whole.saturating_mul(sharing.replicas()),
            pool_resource: RESOURCE_GPU.to_string(),
            mig: if instances.is_empty() {
                MigLayout::None
            } else {
                MigLayout::Mixed { instances }
            },
            cpu_milli: None,
            memory_mib: None,
            mode_source: ModeSource::Dra,
            labelled_gpus: has_mig.then(|| self.physical_gpus()),
            mig_memory_mib,
            advertised,
            unreached: None,
            per_gpu_refused: None,
            shares_declared: self.shares_declared && sharing != Sharing::None,
            // The driver's own version; its claims hold no share's memory (MPS, which would, is
            // refused beside consumable shares by the driver itself).
            enforcement: crate::enforcement::Enforcement {
                driver: self.driver_version.clone(),
                memory_limits: crate::enforcement::MemoryLimits::DraDriver,
                timeslice_cdi: false,
            },
        }
    }
}

/// GFD's form of a product name (`nvidia.com/gpu.product`): spaces become dashes.
pub fn gfd_product(name: &str) -> String {
    name.trim().replace(' ', "-")
}

fn read_device(d: &Device) -> Option<DraDevice> {
    let kind = match d.text("type")? {
        "gpu" => Kind::Gpu {
            minor: d.name.strip_prefix("gpu-")?.parse().ok()?,
        },
        "mig" => Kind::Mig {
            profile: d.text("profile")?.to_string(),
            parent: d.text("parentUUID").map(str::to_string),
        },
        _ => return None,
    };
    let shared = d.allow_multiple_allocations == Some(true);
    Some(DraDevice {
        name: d.name.clone(),
        kind,
        uuid: d.text("uuid").map(str::to_string),
        memory_mib: d.capacity_count("memory").map(|b| b >> 20),
        shares: shared.then(|| d.capacity_count("shares").unwrap_or(0)),
    })
}

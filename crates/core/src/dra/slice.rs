//! NVIDIA's DRA driver's ResourceSlices (`resource.k8s.io/v1`), as far as gpu-share reads them:
//! the devices of driver `gpu.nvidia.com`, their attributes and capacities. The types are
//! gpu-share's own (k8s-openapi's oldest supported Kubernetes has no `resource.k8s.io/v1`);
//! unknown fields are ignored, so a newer API or driver adds what it likes.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

/// One ResourceSlice (the parts gpu-share reads).
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(default)]
pub struct ResourceSlice {
    pub metadata: ObjectMeta,
    pub spec: SliceSpec,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub struct SliceSpec {
    pub driver: String,
    pub node_name: Option<String>,
    pub pool: Pool,
    pub devices: Vec<Device>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub struct Pool {
    pub name: String,
    pub generation: i64,
    pub resource_slice_count: i64,
}

/// One device of a slice.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub struct Device {
    pub name: String,
    pub attributes: BTreeMap<String, Attribute>,
    pub capacity: BTreeMap<String, Capacity>,
    /// KEP-5075: many claims may each take part of the device (the driver's ConsumableShares).
    pub allow_multiple_allocations: Option<bool>,
    /// Taints a health check put on the device (the driver's NVMLDeviceHealthCheck).
    pub taints: Vec<serde_json::Value>,
}

/// A device attribute: exactly one of its fields is set.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(default)]
pub struct Attribute {
    pub string: Option<String>,
    pub int: Option<i64>,
    pub bool: Option<bool>,
    pub version: Option<String>,
}

/// A device capacity: a quantity, and how much one claim may consume of it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub struct Capacity {
    pub value: String,
    pub request_policy: Option<serde_json::Value>,
}

impl Device {
    /// An attribute of the driver's domain: written bare (`type`) or qualified
    /// (`gpu.nvidia.com/type`).
    pub fn attribute(&self, key: &str) -> Option<&Attribute> {
        self.attributes.get(key).or_else(|| {
            self.attributes
                .get(&format!("{}/{key}", crate::nvidia::DRA_DRIVER))
        })
    }

    /// A string (or version) attribute's value.
    pub fn text(&self, key: &str) -> Option<&str> {
        let a = self.attribute(key)?;
        a.string.as_deref().or(a.version.as_deref())
    }

    /// A capacity's quantity in bytes (`memory`), or as a count (`shares`).
    pub fn capacity_count(&self, key: &str) -> Option<u64> {
        let q = &self.capacity.get(key)?.value;
        crate::inventory::quantity_count(q)
    }
}

//! The policy's extended resource names: what each class of shared pod asks for.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::nvidia::RESOURCE_GPU;

/// A rule of the policy file's fields that a value breaks, in words naming the field path
/// (`nodeModes[0]: ...`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Violation(pub String);

fn default_shared() -> ResourceName {
    ResourceName(RESOURCE_GPU.to_string())
}

/// An extended resource name such as `nvidia.com/gpu` (validated: `<domain>/<name>`, name at
/// most 63 characters, not in the `kubernetes.io` domain).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ResourceName(String);

impl ResourceName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for ResourceName {
    type Error = Violation;
    fn try_from(s: String) -> Result<Self, Violation> {
        let Some((domain, name)) = s.split_once('/') else {
            return Err(Violation(format!(
                "resource name {s:?} must look like <domain>/<name>, e.g. nvidia.com/gpu"
            )));
        };
        let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        if domain.is_empty() || !domain.chars().all(ok_char) || domain.ends_with("kubernetes.io") {
            return Err(Violation(format!(
                "resource name {s:?}: {domain:?} is not an extended-resource domain"
            )));
        }
        if name.is_empty() || name.len() > 63 || !name.chars().all(ok_char) {
            return Err(Violation(format!(
                "resource name {s:?}: the part after / must be 1-63 characters of [A-Za-z0-9._-]"
            )));
        }
        Ok(ResourceName(s))
    }
}

impl From<ResourceName> for String {
    fn from(r: ResourceName) -> String {
        r.0
    }
}

impl fmt::Display for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourcesPolicy {
    /// Resource that mps and timeslice pods ask for (`nvidia.com/gpu`, or e.g. `nvidia.com/gpu.shared`
    /// when the device plugin runs with `renameByDefault: true`).
    #[serde(default = "default_shared")]
    pub shared: ResourceName,
    /// What timeslice pods ask for, when not `shared`: a cluster whose time-sliced nodes
    /// advertise another name than its MPS nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeslice: Option<ResourceName>,
    /// What mps pods ask for, when not `shared`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<ResourceName>,
}

impl ResourcesPolicy {
    pub fn timeslice_resource(&self) -> &ResourceName {
        self.timeslice.as_ref().unwrap_or(&self.shared)
    }

    pub fn mps_resource(&self) -> &ResourceName {
        self.mps.as_ref().unwrap_or(&self.shared)
    }
}

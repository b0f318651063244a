//! Reading what holds a share's budget on a node from its labels and the policy (PURE).

use std::collections::BTreeMap;

use super::model::{Enforcement, MIN_DRIVER_FOR_MEMORY_LIMITS, MemoryLimits};

/// GPU Feature Discovery's driver labels: the full version, and the major alone (the older
/// `nvidia.com/cuda.driver.*` names are deprecated, still read).
const LABEL_DRIVER_FULL: &str = "nvidia.com/cuda.driver-version.full";
const LABEL_DRIVER_MAJOR: &str = "nvidia.com/cuda.driver-version.major";
const LABEL_DRIVER_MAJOR_OLD: &str = "nvidia.com/cuda.driver.major";

/// What the policy says about the nodes' toolkits, for [`read`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnforcementReading {
    /// `enforcement.memoryLimitHook`: the toolkits apply the driver's memory limits.
    pub memory_limit_hook: bool,
    /// `perGpu.timesliceCdi`: a time-sliced share in per-GPU form gets its GPU through the CDI
    /// device its reservation writes, NVIDIA's hooks included.
    pub timeslice_cdi: bool,
}

/// The major of a driver version (`615.25.01`, `615`); `None` if it is not one.
pub fn driver_major(version: &str) -> Option<u32> {
    let major = version.trim().split('.').next()?;
    if major.is_empty() || !major.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    major.parse().ok().filter(|m| *m > 0)
}

/// What one `nodeModes` rule that applies to the node declares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Declared {
    pub driver_version: Option<String>,
    pub memory_limit_hook: Option<bool>,
}

/// What can hold a share's budget on the node with `labels`: the driver's version from GPU
/// Feature Discovery (else the first rule for the node that declares one, `declared` being the
/// `nodeModes` rules whose selector matches it, in order), and whether the toolkit applies the
/// driver's memory limits (the first such rule that says, else the policy's
/// `enforcement.memoryLimitHook`).
pub fn read(
    labels: &BTreeMap<String, String>,
    policy: &EnforcementReading,
    declared: &[Declared],
) -> Enforcement {
    let matching = || declared.iter();
    let labelled = [
        LABEL_DRIVER_FULL,
        LABEL_DRIVER_MAJOR,
        LABEL_DRIVER_MAJOR_OLD,
    ]
    .iter()
    .find_map(|k| labels.get(*k).filter(|v| driver_major(v).is_some()))
    .cloned();
    let driver = labelled.or_else(|| matching().find_map(|m| m.driver_version.clone()));
    let hook = matching()
        .find_map(|m| m.memory_limit_hook)
        .unwrap_or(policy.memory_limit_hook);
    let memory_limits = match driver.as_deref().and_then(driver_major) {
        None => MemoryLimits::DriverUnknown,
        Some(m) if m < MIN_DRIVER_FOR_MEMORY_LIMITS => MemoryLimits::DriverTooOld,
        Some(_) if hook => MemoryLimits::Applied,
        Some(_) if matching().any(|m| m.memory_limit_hook == Some(false)) => {
            MemoryLimits::DeclaredOff
        }
        Some(_) => MemoryLimits::HookNotDeclared,
    };
    Enforcement {
        driver,
        memory_limits,
        timeslice_cdi: policy.timeslice_cdi,
    }
}

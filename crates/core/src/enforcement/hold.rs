//! Which mechanism holds a share's memory on a node, or why none does.

use super::model::{
    Gap, Hold, Holder, MIN_DRIVER_FOR_MEMORY_LIMITS, MemoryLimits, NodeFacts, NodeSharing, Share,
};

/// What holds `share`'s memory on the node: for a share, the driver's limit where it applies
/// and the share has a budget, else the device plugin's MPS split on an MPS node; else why
/// nothing does. MIG devices and whole GPUs hold themselves.
pub fn memory_hold(node: NodeFacts<'_>, share: Share) -> Hold {
    let driver = node.enforcement.driver.as_deref();
    // A time-sliced share in per-GPU form gets its GPU under the legacy runtime, which runs no
    // CDI hook, unless the policy gives it its GPU's CDI device; an MPS one always through its
    // GPU's CDI device, NVIDIA's edits with the hook.
    let legacy = matches!(share, Share::Timeslice { .. })
        && node.sharing == NodeSharing::PerGpu
        && !node.enforcement.timeslice_cdi;
    let driver_limit = |budget: Option<u64>| -> Result<Holder, (Gap, String)> {
        if node.all_mig {
            return Err((
                Gap::Mig,
                "the driver's memory limits do not apply to MIG devices".to_string(),
            ));
        }
        let limits = match node.enforcement.memory_limits {
            MemoryLimits::Applied if legacy => MemoryLimits::NotThroughPerGpuForm,
            l => l,
        };
        match limits.why_not(driver) {
            Some(why) => Err((Gap::NoDriverLimits, why)),
            None if budget.is_none() => Err((
                Gap::NoBudget,
                "the share has no memory budget (gpu-share/memory), which the driver's limit needs"
                    .to_string(),
            )),
            None => Ok(Holder::DriverLimit),
        }
    };
    let not_held = |gap: Gap, why: String| Hold::NotHeld { gap, why };
    match share {
        Share::Nothing => Hold::Nothing,
        Share::Mig => Hold::Held(Holder::Hardware),
        Share::Whole => Hold::Held(Holder::WholeGpu),
        Share::Timeslice { memory_mib } => match driver_limit(memory_mib) {
            Ok(h) => Hold::Held(h),
            Err((gap, why)) => not_held(gap, format!("time-slicing holds no memory, and {why}")),
        },
        Share::Mps { memory_mib } => match (driver_limit(memory_mib), node.sharing) {
            (Ok(h), _) => Hold::Held(h),
            (Err(_), NodeSharing::Mps { .. }) => Hold::Held(Holder::DevicePluginMps),
            (Err(_), NodeSharing::PerGpu) => Hold::Held(Holder::GpuShareMps),
            (Err((gap, why)), _) => {
                not_held(gap, format!("no MPS server holds it here, and {why}"))
            }
        },
        Share::Units => match node.sharing {
            NodeSharing::Mps { .. } => Hold::Held(Holder::DevicePluginMps),
            NodeSharing::TimeSlicing => not_held(
                Gap::NoDriverLimits,
                "a time-sliced replica asked for directly has no budget, and time-slicing holds no memory"
                    .to_string(),
            ),
            NodeSharing::Unshared | NodeSharing::PerGpu => Hold::Held(Holder::WholeGpu),
        },
    }
}

/// One line per node for `/v1/nodes`, `gpu-share status` and the page: what holds a share's
/// memory there.
pub fn summary(node: NodeFacts<'_>) -> String {
    let e = node.enforcement;
    let driver = e.driver.as_deref().unwrap_or("unknown");
    let limits = match e.memory_limits {
        _ if node.all_mig => format!("no driver limits (MIG devices; driver {driver})"),
        MemoryLimits::Applied if node.sharing == NodeSharing::PerGpu && e.timeslice_cdi => {
            format!(
                "driver limits (driver {driver}; time-sliced shares through their GPU's CDI device)"
            )
        }
        MemoryLimits::Applied if node.sharing == NodeSharing::PerGpu => format!(
            "driver limits for mps shares (driver {driver}; time-sliced shares: not through the per-GPU form)"
        ),
        MemoryLimits::Applied => format!("driver limits (driver {driver})"),
        MemoryLimits::HookNotDeclared => {
            format!("no driver limits (driver {driver}; the toolkit's hook not declared)")
        }
        MemoryLimits::DriverTooOld => {
            format!("no driver limits (driver {driver} < r{MIN_DRIVER_FOR_MEMORY_LIMITS})")
        }
        MemoryLimits::DeclaredOff => "no driver limits (declared off)".to_string(),
        MemoryLimits::GkeStack => format!("no driver limits (driver {driver}; GKE's stack)"),
        MemoryLimits::NotThroughPerGpuForm => {
            format!("no driver limits (driver {driver}; not through the per-GPU form)")
        }
        MemoryLimits::DriverUnknown => "no driver limits (driver unknown)".to_string(),
        MemoryLimits::DraDriver => format!("no driver limits (driver {driver}; DRA shares)"),
    };
    let mps = match node.sharing {
        NodeSharing::Mps { replicas } => {
            format!("; mps: the device plugin's equal split (1/{replicas})")
        }
        NodeSharing::PerGpu => {
            "; mps: gpu-share's daemon per GPU (each client's own limits)".to_string()
        }
        _ => String::new(),
    };
    format!("{limits}{mps}")
}

//! The policy file's `enforcement` section (PURE).

use serde::{Deserialize, Serialize};

/// The policy file's `enforcement` section: what holds a share to its budget inside the GPU
/// ([`crate::enforcement`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnforcementPolicy {
    /// What a `timeslice` or `mps` share needs of its node: `required` (only nodes that hold
    /// its memory to its budget), `preferred` (any node; the bind says on the pod where nothing
    /// holds it) or `off`.
    #[serde(default)]
    pub budgets: crate::enforcement::Requirement,
    /// Whether the GPU nodes' Container Toolkit applies the driver's per-container memory limits
    /// (the CDI hook `apply-cuda-memory-limits`, GPU Operator 26.7.1 or later). gpu-share cannot
    /// see the toolkit, and the hook skips a limit it cannot apply: say so only where it runs.
    #[serde(default)]
    pub memory_limit_hook: bool,
}

impl Default for EnforcementPolicy {
    fn default() -> Self {
        EnforcementPolicy {
            budgets: crate::enforcement::Requirement::Preferred,
            memory_limit_hook: false,
        }
    }
}

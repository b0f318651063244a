//! The policy file's `packing` section (PURE): how the extender scores nodes, and which of the
//! fitting nodes its filter passes on.

use serde::{Deserialize, Serialize};

/// Node packing policy names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum PackingPolicyName {
    Binpack,
    Spread,
    #[default]
    GpuShare,
}

/// The policy file's `packing` section (the scorer's policy is [`crate::packing::PackingPolicy`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PackingSection {
    #[serde(default)]
    pub policy: PackingPolicyName,
    #[serde(default)]
    pub candidates: Candidates,
}

impl Default for PackingSection {
    fn default() -> Self {
        PackingSection {
            policy: PackingPolicyName::GpuShare,
            candidates: Candidates::One,
        }
    }
}

/// Which of the fitting nodes the extender's filter passes on to kube-scheduler. Under `one`
/// and `best`, the nodes that do not fit are named with their reasons only when none fits (the
/// reasons kube-scheduler reports on a Pending pod).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Candidates {
    /// One node of the best packing score: the first of the tied nodes in a fixed order of node
    /// names, as the simulator's replay breaks ties, so kube-scheduler scores nothing and skips
    /// prioritize. The whole tier, as under `best`, when kube-scheduler's scores would tell the
    /// tied nodes apart by what the pod or the nodes ask (preferred affinity, soft topology
    /// spread, a controller-owned pod's default spread, differing `PreferNoSchedule` taints;
    /// the extender's `tie_break`).
    #[default]
    One,
    /// The fitting nodes with the best packing score ([`crate::packing::best_tier`]):
    /// kube-scheduler's own scores choose among equally well packed nodes, and it scores only
    /// those.
    Best,
    /// Every fitting node, every other node with its reason: kube-scheduler's own scores weigh
    /// against the packing's on every node (for a profile whose score plugins must see every
    /// node, or a second extender after gpu-share's that needs the reasons).
    All,
}

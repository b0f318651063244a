//! PURE: in which form the cluster's nodes offer each MIG profile, so that a MIG pod asks for
//! what the nodes that have its profile advertise (the policy's `mig.strategy: auto`).
//!
//! The device plugin offers a MIG device in one of two forms, per node: under the mixed strategy
//! as `nvidia.com/mig-<profile>`, under the single strategy (the GPU Operator's default, and
//! GKE's partitions) as `nvidia.com/gpu`. A pod asks for exactly one resource name, so it can
//! only ever run on nodes of one form. Where both forms offer a profile, the form with more
//! devices of it wins (ties: mixed, whose resource name says the profile), and the pod is told
//! how many devices of the other form it cannot use.

use std::collections::BTreeMap;

use super::node::{GpuNode, MigLayout};
use crate::policy::MigStrategy;

/// Devices of each profile, per form, over a set of nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigOffers {
    single: BTreeMap<String, u32>,
    mixed: BTreeMap<String, u32>,
}

/// The form a MIG pod is written in, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigForm {
    pub strategy: MigStrategy,
    /// Devices of the profile offered in the other form, which the pod cannot use (0: none).
    pub other_form_devices: u32,
}

impl MigOffers {
    /// What `nodes` offer: a single-strategy node its devices of its one profile, a mixed one
    /// each profile it advertises.
    pub fn of<'a>(nodes: impl IntoIterator<Item = &'a GpuNode>) -> Self {
        let mut offers = MigOffers::default();
        for n in nodes {
            match &n.mig {
                MigLayout::None => {}
                MigLayout::Single { profile, .. } => {
                    *offers.single.entry(profile.clone()).or_default() += n.slots;
                }
                MigLayout::Mixed { instances } => {
                    for (profile, count) in instances {
                        *offers.mixed.entry(profile.clone()).or_default() += count;
                    }
                }
            }
        }
        offers
    }

    /// Devices of `profile` offered in `strategy`'s form (`auto` counts both).
    pub fn devices(&self, profile: &str, strategy: MigStrategy) -> u32 {
        let single = self.single.get(profile).copied().unwrap_or(0);
        let mixed = self.mixed.get(profile).copied().unwrap_or(0);
        match strategy {
            MigStrategy::Single => single,
            MigStrategy::Mixed => mixed,
            MigStrategy::Auto => single + mixed,
        }
    }

    /// The form a pod of `profile` is written in: the one with more of its devices (ties and
    /// no offer at all: mixed).
    pub fn form(&self, profile: &str) -> MigForm {
        let single = self.devices(profile, MigStrategy::Single);
        let mixed = self.devices(profile, MigStrategy::Mixed);
        if single > mixed {
            MigForm {
                strategy: MigStrategy::Single,
                other_form_devices: mixed,
            }
        } else {
            MigForm {
                strategy: MigStrategy::Mixed,
                other_form_devices: single,
            }
        }
    }

    /// Whether any node offers a MIG device.
    pub fn is_empty(&self) -> bool {
        self.single.is_empty() && self.mixed.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn single(name: &str, profile: &str, devices: u32) -> GpuNode {
        GpuNode {
            gpus: 0,
            slots: devices,
            mig: MigLayout::Single {
                profile: profile.to_string(),
                per_gpu: 7,
            },
            ..GpuNode::whole(name, "A100", 0, 81920)
        }
    }

    fn mixed(name: &str, instances: &[(&str, u32)]) -> GpuNode {
        GpuNode {
            gpus: 0,
            slots: 0,
            mig: MigLayout::Mixed {
                instances: instances.iter().map(|(p, n)| (p.to_string(), *n)).collect(),
            },
            ..GpuNode::whole(name, "A100", 0, 81920)
        }
    }

    #[test]
    fn the_form_with_more_devices_of_the_profile_wins() {
        let nodes = [
            single("s1", "1g.10gb", 56),
            mixed("m1", &[("1g.10gb", 14), ("3g.40gb", 4)]),
            single("s2", "3g.40gb", 2),
        ];
        let o = MigOffers::of(&nodes);
        assert_eq!(
            o.form("1g.10gb"),
            MigForm {
                strategy: MigStrategy::Single,
                other_form_devices: 14
            }
        );
        assert_eq!(
            o.form("3g.40gb"),
            MigForm {
                strategy: MigStrategy::Mixed,
                other_form_devices: 2
            }
        );
        assert_eq!(o.devices("1g.10gb", MigStrategy::Auto), 70);
        // Offered nowhere, or as much in both forms: mixed.
        assert_eq!(o.form("7g.80gb").strategy, MigStrategy::Mixed);
        let tie = MigOffers::of(&[single("s", "2g.20gb", 3), mixed("m", &[("2g.20gb", 3)])]);
        assert_eq!(tie.form("2g.20gb").strategy, MigStrategy::Mixed);
        assert!(MigOffers::of(&[GpuNode::whole("plain", "L40S", 4, 46068)]).is_empty());
    }
}

//! PURE: in which form the cluster's nodes offer each MIG profile, so that a MIG pod asks for
//! what the nodes that have its profile advertise (the policy's `mig.strategy: auto`).
//!
//! The device plugin offers a MIG device in one of two forms, per node: under the mixed strategy
//! as `nvidia.com/mig-<profile>`, under the single strategy (the GPU Operator's default, and
//! GKE's partitions) as `nvidia.com/gpu`. A pod asks for exactly one resource name, so it can
//! only ever run on nodes of one form. In order:
//! 1. where nodes offer the profile, the form with more devices of it wins (ties: mixed, whose
//!    resource name says the profile), and the pod is told how many devices of the other form,
//!    and which declared pool, it cannot use;
//! 2. where none does, but the policy's `nodeModes` declare a pool of the profile (a pool scaled
//!    to zero, a MIG config not yet applied, a managed platform's MIG pool without GPU Feature
//!    Discovery), the single form: what such a rule declares;
//! 3. else the strategy the cluster's GPU nodes are labelled with (`nvidia.com/mig.strategy`,
//!    which GFD writes on every GPU node under either strategy, MIG or not), a guess;
//! 4. else mixed, a guess.
//!
//! A guess is said in a warning, with the pod's way to choose: `gpu-share/mig-strategy`.

use std::collections::{BTreeMap, BTreeSet};

use super::node::{GpuNode, MigLayout};
use crate::policy::MigStrategy;

/// Devices of each profile, per form, over a set of nodes; the profiles the policy's pools
/// declare; and how many GPU nodes are labelled with each MIG strategy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigOffers {
    single: BTreeMap<String, u32>,
    mixed: BTreeMap<String, u32>,
    declared: BTreeSet<String>,
    labelled_single: u32,
    labelled_mixed: u32,
}

/// What a MIG pod's form rests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormBasis {
    /// Nodes offer the profile.
    Offered,
    /// No node offers it; a `nodeModes` rule declares a pool of it.
    Declared,
    /// Neither: the MIG strategy `nodes` GPU nodes are labelled with.
    Labelled { nodes: u32 },
    /// Nothing says.
    Nothing,
}

/// The form a MIG pod is written in, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigForm {
    pub strategy: MigStrategy,
    /// Devices of the profile offered in the other form, which the pod cannot use (0: none).
    pub other_form_devices: u32,
    /// A declared pool of the profile (single form) the pod cannot use: it was written mixed.
    pub declared_pool_left_out: bool,
    pub basis: FormBasis,
}

impl MigForm {
    /// Whether the form is a guess: nothing offers or declares the profile.
    pub fn guessed(&self) -> bool {
        matches!(self.basis, FormBasis::Labelled { .. } | FormBasis::Nothing)
    }
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

    /// Counts GPU nodes by the MIG strategy they are labelled with (`nvidia.com/mig.strategy`).
    pub fn label_strategies<'a>(&mut self, labelled: impl IntoIterator<Item = &'a str>) {
        for strategy in labelled {
            match strategy {
                "single" => self.labelled_single += 1,
                "mixed" => self.labelled_mixed += 1,
                _ => {}
            }
        }
    }

    /// Adds the profiles the policy's `nodeModes` rules declare (single-strategy pools).
    pub fn declare(&mut self, modes: &[crate::policy::NodeMode]) {
        self.declared
            .extend(modes.iter().filter_map(|m| m.mig_profile.clone()));
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

    /// The form a pod of `profile` is written in (the module's order).
    pub fn form(&self, profile: &str) -> MigForm {
        let single = self.devices(profile, MigStrategy::Single);
        let mixed = self.devices(profile, MigStrategy::Mixed);
        let declared = self.declared.contains(profile);
        let form = |strategy, other_form_devices, basis| MigForm {
            strategy,
            other_form_devices,
            declared_pool_left_out: declared && strategy == MigStrategy::Mixed,
            basis,
        };
        if single > mixed {
            form(MigStrategy::Single, mixed, FormBasis::Offered)
        } else if mixed > 0 {
            form(MigStrategy::Mixed, single, FormBasis::Offered)
        } else if declared {
            form(MigStrategy::Single, 0, FormBasis::Declared)
        } else if self.labelled_single > self.labelled_mixed {
            form(
                MigStrategy::Single,
                0,
                FormBasis::Labelled {
                    nodes: self.labelled_single,
                },
            )
        } else if self.labelled_mixed > 0 {
            form(
                MigStrategy::Mixed,
                0,
                FormBasis::Labelled {
                    nodes: self.labelled_mixed,
                },
            )
        } else {
            form(MigStrategy::Mixed, 0, FormBasis::Nothing)
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
        let f = o.form("1g.10gb");
        assert_eq!(
            (f.strategy, f.other_form_devices, f.basis),
            (MigStrategy::Single, 14, FormBasis::Offered)
        );
        let f = o.form("3g.40gb");
        assert_eq!(
            (f.strategy, f.other_form_devices, f.basis),
            (MigStrategy::Mixed, 2, FormBasis::Offered)
        );
        assert_eq!(o.devices("1g.10gb", MigStrategy::Auto), 70);
        // Offered nowhere, or as much in both forms: mixed.
        assert_eq!(o.form("7g.80gb").strategy, MigStrategy::Mixed);
        let tie = MigOffers::of(&[single("s", "2g.20gb", 3), mixed("m", &[("2g.20gb", 3)])]);
        assert_eq!(tie.form("2g.20gb").strategy, MigStrategy::Mixed);
        assert!(MigOffers::of(&[GpuNode::whole("plain", "L40S", 4, 46068)]).is_empty());
    }

    /// A profile no node offers: a declared pool's single form, else the strategy the GPU
    /// nodes are labelled with, else mixed; the last two are guesses. Offered devices win over a
    /// declared pool, which is then said to be left out.
    #[test]
    fn a_profile_no_node_offers_takes_the_declared_or_labelled_form() {
        let mut o = MigOffers::of(&[mixed("m", &[("1g.10gb", 7)])]);
        let f = o.form("3g.40gb");
        assert_eq!(
            (f.strategy, f.basis),
            (MigStrategy::Mixed, FormBasis::Nothing)
        );
        assert!(f.guessed());
        o.labelled_single = 3;
        o.labelled_mixed = 1;
        let f = o.form("3g.40gb");
        assert_eq!(
            (f.strategy, f.basis),
            (MigStrategy::Single, FormBasis::Labelled { nodes: 3 })
        );
        assert!(f.guessed());
        let rule: crate::policy::NodeMode = serde_json::from_value(serde_json::json!({
            "selector": {"matchLabels": {"agentpool": "mig"}}, "migProfile": "3g.40gb"
        }))
        .unwrap();
        let also: crate::policy::NodeMode = serde_json::from_value(serde_json::json!({
            "selector": {"matchLabels": {"agentpool": "mig1g"}}, "migProfile": "1g.10gb"
        }))
        .unwrap();
        o.declare(&[rule, also]);
        let f = o.form("3g.40gb");
        assert_eq!(
            (f.strategy, f.basis),
            (MigStrategy::Single, FormBasis::Declared)
        );
        assert!(!f.guessed() && !f.declared_pool_left_out);
        // Mixed nodes offer 1g.10gb: they win, and the declared pool is left out.
        let f = o.form("1g.10gb");
        assert_eq!(
            (f.strategy, f.basis),
            (MigStrategy::Mixed, FormBasis::Offered)
        );
        assert!(f.declared_pool_left_out);
    }
}

//! The policy file's `defrag` section (PURE): whether the extender plans moves of running pods
//! to make room for a pod that waits because the free capacity is scattered, which pods may
//! move, and how many at once.

use serde::{Deserialize, Serialize};

use super::resources::Violation;

fn moves_per_gpu() -> u32 {
    2
}

fn moves_at_once() -> u32 {
    4
}

fn cooldown_seconds() -> u32 {
    600
}

fn plan_timeout_seconds() -> u32 {
    300
}

/// What the extender does for a pod that waits because the free capacity is scattered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum DefragMode {
    /// Nothing.
    #[default]
    Off,
    /// Tells each waiting pod in an event what moving would make room for it, or why no moves
    /// would, shows the plans (`/v1/nodes`, `gpu-share status`, the page), and moves nothing.
    Plan,
    /// Carries the plans out: the targets and the freed room held first, each pod evicted
    /// through the Eviction API (so PodDisruptionBudgets hold), its replacement steered to its
    /// held target, the room given to the waiting pod.
    On,
}

/// The policy file's `defrag` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DefragPolicy {
    #[serde(default)]
    pub mode: DefragMode,
    /// Namespaces whose pods of a ReplicaSet, StatefulSet or Job may move. Elsewhere a pod opts
    /// in with the annotation `gpu-share.io/defrag: allow` (on its workload's pod template);
    /// any pod opts out with `gpu-share.io/defrag: never`. A moved pod restarts.
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// At most this many moves in a plan for each GPU the waiting pod asks (a share asks one).
    #[serde(default = "moves_per_gpu")]
    pub moves_per_gpu: u32,
    /// (`on`) At most this many moves under way at once over every plan: pods evicted whose
    /// replacement has not landed on its held target. A plan's further moves wait for earlier
    /// ones to land, and no plan begins while this many are under way.
    #[serde(default = "moves_at_once")]
    pub moves_at_once: u32,
    /// A workload that had a pod moved, or an eviction refused, is left alone this long.
    #[serde(default = "cooldown_seconds")]
    pub cooldown_seconds: u32,
    /// A plan under way that has not placed its waiting pod this long after it began is given
    /// up, and its holds released.
    #[serde(default = "plan_timeout_seconds")]
    pub plan_timeout_seconds: u32,
}

impl Default for DefragPolicy {
    fn default() -> Self {
        DefragPolicy {
            mode: DefragMode::Off,
            namespaces: Vec::new(),
            moves_per_gpu: moves_per_gpu(),
            moves_at_once: moves_at_once(),
            cooldown_seconds: cooldown_seconds(),
            plan_timeout_seconds: plan_timeout_seconds(),
        }
    }
}

impl DefragPolicy {
    pub(super) fn validate(&self) -> Result<(), Violation> {
        if self.moves_per_gpu == 0 || self.moves_at_once == 0 {
            return Err(Violation(
                "defrag.movesPerGpu and defrag.movesAtOnce must be 1 or more (defrag.mode: off turns planning off)".into(),
            ));
        }
        if self.plan_timeout_seconds < 30 {
            return Err(Violation(
                "defrag.planTimeoutSeconds must be 30 or more: a moved pod's replacement needs time to be created and placed".into(),
            ));
        }
        if let Some(ns) = self.namespaces.iter().find(|n| !is_dns_label(n)) {
            return Err(Violation(format!(
                "defrag.namespaces: {ns:?} is not a namespace name (a DNS label: lowercase letters, digits and '-', at most 63)"
            )));
        }
        Ok(())
    }
}

/// Whether `s` is a DNS-1123 label, as a namespace's name is.
fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;

    #[test]
    fn a_section_naming_the_mode_alone_takes_the_defaults() {
        let p = Policy::from_yaml("defrag:\n  mode: plan\n  namespaces: [ml, team-b]\n").unwrap();
        assert_eq!(
            p.defrag,
            DefragPolicy {
                mode: DefragMode::Plan,
                namespaces: vec!["ml".into(), "team-b".into()],
                ..DefragPolicy::default()
            }
        );
        assert_eq!((p.defrag.moves_per_gpu, p.defrag.moves_at_once), (2, 4));
        assert_eq!(
            (p.defrag.cooldown_seconds, p.defrag.plan_timeout_seconds),
            (600, 300)
        );
        let on = Policy::from_yaml("defrag: {mode: on, cooldownSeconds: 60}").unwrap();
        assert_eq!(
            (on.defrag.mode, on.defrag.cooldown_seconds),
            (DefragMode::On, 60)
        );
        assert_eq!(
            Policy::default_policy().defrag,
            DefragPolicy::default(),
            "the embedded default is off, with the same limits"
        );
    }

    #[test]
    fn bad_values_are_refused_in_words() {
        for (yaml, words) in [
            ("defrag: {movesPerGpu: 0}", "must be 1 or more"),
            ("defrag: {movesAtOnce: 0}", "must be 1 or more"),
            ("defrag: {namespaces: [ML]}", "is not a namespace name"),
            ("defrag: {namespaces: ['']}", "is not a namespace name"),
            ("defrag: {mode: yes}", "unknown variant"),
            ("defrag: {mode: plan, cooldown: 5}", "unknown field"),
            ("defrag: {planTimeoutSeconds: 5}", "must be 30 or more"),
        ] {
            let e = Policy::from_yaml(yaml).unwrap_err().to_string();
            assert!(e.contains(words), "{yaml}: {e}");
        }
    }
}

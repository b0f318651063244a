//! Which pods a release nudges: filter marks a pod that no node it was offered has room for
//! ([`crate::cache::NoRoom`], in the pod's entry), and when a holding of that class is released
//! the requeuer (`super::sync::spawn_requeuer`) nudges it back into kube-scheduler's queue; its
//! bind or its nudge unmarks it.

use crate::cache::NoRoom;

/// A released holding (sent to the requeuer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    pub node: String,
    pub class: &'static str,
}

/// The classes whose release frees whole GPUs ([`crate::packing::GpuDemand::class`]): an
/// exclusive pod's, device units asked for directly, and a reservation's. On a node gpu-share
/// shares per GPU, a freed GPU takes a pod of any class (shares of either sharing class, or a
/// whole-GPU pod), so their release may end any pod's wait.
const FREES_WHOLE_GPUS: [&str; 3] = ["exclusive", "device", "reservation"];

/// Which waiting pods a release should nudge: those of the same class, and any pod where the
/// release freed whole GPUs (direct device requests match any class), in `waiting`'s order (the
/// longest marked first), at
/// most `limit`.
pub fn pods_to_nudge(
    waiting: &[(String, NoRoom)],
    released: &[Released],
    limit: usize,
) -> Vec<(String, NoRoom)> {
    waiting
        .iter()
        .filter(|(_, w)| {
            released.iter().any(|r| {
                r.class == w.class || FREES_WHOLE_GPUS.contains(&r.class) || w.class == "device"
            })
        })
        .take(limit)
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod of `class` waiting, named after it.
    fn w(class: &'static str) -> NoRoom {
        NoRoom {
            namespace: "ml".into(),
            name: class.into(),
            class,
        }
    }

    #[test]
    fn nudges_go_to_pods_of_the_released_class() {
        let waiting = vec![
            ("1".to_string(), w("mig")),
            ("2".to_string(), w("mps")),
            ("3".to_string(), w("device")),
        ];
        let released = vec![Released {
            node: "n".into(),
            class: "mig",
        }];
        let chosen: Vec<String> = pods_to_nudge(&waiting, &released, 10)
            .into_iter()
            .map(|(u, _)| u)
            .collect();
        assert_eq!(chosen, vec!["1", "3"]);
        assert_eq!(pods_to_nudge(&waiting, &released, 1).len(), 1);
    }

    /// A released reservation (or exclusive pod) frees its whole GPU, which a share of either
    /// sharing class may take on a node shared per GPU: every waiting pod is nudged. (An MPS
    /// share waiting behind a time-sliced reservation was left in kube-scheduler's unschedulable
    /// queue when it went: only the extender rejects a per-GPU share.)
    #[test]
    fn a_freed_whole_gpu_nudges_every_class() {
        let waiting = vec![
            ("1".to_string(), w("mps")),
            ("2".to_string(), w("timeslice")),
            ("3".to_string(), w("exclusive")),
        ];
        for class in ["reservation", "exclusive", "device"] {
            let released = [Released {
                node: "n".into(),
                class,
            }];
            assert_eq!(
                pods_to_nudge(&waiting, &released, 10).len(),
                3,
                "a released {class}"
            );
        }
        let share = [Released {
            node: "n".into(),
            class: "timeslice",
        }];
        let chosen: Vec<String> = pods_to_nudge(&waiting, &share, 10)
            .into_iter()
            .map(|(u, _)| u)
            .collect();
        assert_eq!(chosen, vec!["2"]);
    }
}

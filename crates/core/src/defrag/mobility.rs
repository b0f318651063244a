//! PURE: whether a running pod may move to make room, read from the pod alone and the
//! namespaces the policy opts in.

use k8s_openapi::api::core::v1::Pod;

use super::model::{Mobility, Movable, Pinned};

/// A pod's (or its workload's pod template's) word on being moved: `allow` opts it in outside
/// the namespaces the policy opts in, `never` opts it out anywhere.
pub const ANNOTATION_DEFRAG: &str = "gpu-share.io/defrag";
/// What a restart costs the pod's workload, in moves (1 to [`MAX_RESTART_COST`]; 1 when not
/// given): a plan moving fewer, cheaper pods is preferred.
pub const ANNOTATION_RESTART_COST: &str = "gpu-share.io/restart-cost";
/// The most a restart may be said to cost.
pub const MAX_RESTART_COST: u32 = 100;

/// The kinds of controller that recreate a pod evicted from its node.
const RECREATING_KINDS: [&str; 3] = ["ReplicaSet", "StatefulSet", "Job"];

/// The pod's controller, if it is one that recreates the pod: `namespace/Kind/name` (its
/// workload, which the cooldown counts by) and the controller's UID (which its replacement
/// carries).
pub fn recreating_controller(pod: &Pod) -> Option<(String, String)> {
    let owner = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))?;
    RECREATING_KINDS.contains(&owner.kind.as_str()).then(|| {
        (
            format!(
                "{}/{}/{}",
                pod.metadata.namespace.as_deref().unwrap_or_default(),
                owner.kind,
                owner.name
            ),
            owner.uid.clone(),
        )
    })
}

/// A restart cost annotation that is not a whole number from 1 to [`MAX_RESTART_COST`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("gpu-share.io/restart-cost: {0:?} is not a whole number from 1 to 100")]
pub struct BadRestartCost(pub String);

/// A restart's cost as the annotation says it, or why it cannot be read.
pub fn restart_cost(pod: &Pod) -> Result<u32, BadRestartCost> {
    let Some(text) = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_RESTART_COST))
    else {
        return Ok(1);
    };
    match text.trim().parse::<u32>() {
        Ok(n) if (1..=MAX_RESTART_COST).contains(&n) => Ok(n),
        _ => Err(BadRestartCost(text.clone())),
    }
}

/// A pod's word on being moved, as its [`ANNOTATION_DEFRAG`] says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Word {
    #[default]
    Unsaid,
    Allow,
    Never,
}

/// What a pod a controller recreates says of moving it, read once from the pod and kept with
/// its holding ([`crate::ledger::PodRef::consent`]), so the planner weighs it without the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consent {
    /// Its workload: `namespace/Kind/name` of the controller that recreates it.
    pub workload: String,
    pub word: Word,
    /// What its restart costs, or the annotation that cannot be read.
    pub restart_cost: Result<u32, BadRestartCost>,
    /// Running and not being deleted, as the API last showed it.
    pub settled: bool,
}

impl Consent {
    /// What `pod` says, or `None` where no controller recreates it.
    pub fn of(pod: &Pod) -> Option<Consent> {
        let (workload, _) = recreating_controller(pod)?;
        let word = match pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_DEFRAG))
            .map(|w| w.trim())
        {
            Some("allow") => Word::Allow,
            Some("never") => Word::Never,
            _ => Word::Unsaid,
        };
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        Some(Consent {
            workload,
            word,
            restart_cost: restart_cost(pod),
            settled: running && pod.metadata.deletion_timestamp.is_none(),
        })
    }
}

/// Whether a pod may move, and if not why, from what it says (`consent`, `None` where no
/// controller recreates it), its namespace and priority: a controller that recreates it first;
/// then not opted out (`never`); then opted in, by its namespace (`namespaces`) or its own
/// `allow`; then its workload's cooldown (`cooling`); then settled (running, not leaving). A
/// restart cost that cannot be read pins the pod as not opted in: a limit that cannot be read is
/// not taken as the cheapest.
pub fn mobility_of(
    consent: Option<&Consent>,
    namespace: &str,
    priority: i32,
    namespaces: &[String],
    cooling: impl Fn(&str) -> bool,
) -> Mobility {
    let Some(c) = consent else {
        return Mobility::Pinned(Pinned::NoController);
    };
    if c.word == Word::Never {
        return Mobility::Pinned(Pinned::OptedOut);
    }
    let opted_in = c.word == Word::Allow || namespaces.iter().any(|n| n == namespace);
    let Ok(restart_cost) = c.restart_cost.clone() else {
        return Mobility::Pinned(Pinned::NotOptedIn);
    };
    if !opted_in {
        return Mobility::Pinned(Pinned::NotOptedIn);
    }
    if cooling(&c.workload) {
        return Mobility::Pinned(Pinned::CoolingDown);
    }
    if !c.settled {
        return Mobility::Pinned(Pinned::Unsettled);
    }
    Mobility::Movable(Movable {
        priority,
        restart_cost,
        workload: c.workload.clone(),
    })
}

/// [`mobility_of`] read from the pod itself.
pub fn mobility(pod: &Pod, namespaces: &[String], cooling: impl Fn(&str) -> bool) -> Mobility {
    mobility_of(
        Consent::of(pod).as_ref(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0),
        namespaces,
        cooling,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(owner: Option<&str>, annotations: serde_json::Value, phase: &str) -> Pod {
        let owners = match owner {
            Some(kind) => json!([{"apiVersion": "apps/v1", "kind": kind, "name": "w",
                                   "uid": "u-w", "controller": true}]),
            None => json!([]),
        };
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "team", "uid": "u-p",
                         "ownerReferences": owners, "annotations": annotations},
            "spec": {"containers": [], "priority": 5},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    fn never(_: &str) -> bool {
        false
    }

    #[test]
    fn a_controllers_pod_in_an_opted_in_namespace_moves() {
        let p = pod(Some("ReplicaSet"), json!({}), "Running");
        assert_eq!(
            mobility(&p, &["team".into()], never),
            Mobility::Movable(Movable {
                priority: 5,
                restart_cost: 1,
                workload: "team/ReplicaSet/w".into()
            })
        );
        assert_eq!(
            recreating_controller(&p),
            Some(("team/ReplicaSet/w".into(), "u-w".into()))
        );
    }

    #[test]
    fn each_reason_to_stay_is_read() {
        let ns = ["team".to_string()];
        let cases = [
            (pod(None, json!({}), "Running"), Pinned::NoController),
            (
                pod(Some("DaemonSet"), json!({}), "Running"),
                Pinned::NoController,
            ),
            (
                pod(Some("ReplicaSet"), json!({}), "Running"),
                Pinned::NotOptedIn,
            ),
            (
                pod(
                    Some("Job"),
                    json!({"gpu-share.io/defrag": "never"}),
                    "Running",
                ),
                Pinned::OptedOut,
            ),
            (
                pod(
                    Some("StatefulSet"),
                    json!({"gpu-share.io/defrag": "allow"}),
                    "Pending",
                ),
                Pinned::Unsettled,
            ),
            (
                pod(
                    Some("ReplicaSet"),
                    json!({"gpu-share.io/defrag": "allow", "gpu-share.io/restart-cost": "0"}),
                    "Running",
                ),
                Pinned::NotOptedIn,
            ),
        ];
        for (i, (p, want)) in cases.iter().enumerate() {
            // Outside the opted-in namespaces, except where the case says otherwise.
            assert_eq!(mobility(p, &[], never), Mobility::Pinned(*want), "case {i}");
        }
        let p = pod(Some("ReplicaSet"), json!({}), "Running");
        assert_eq!(
            mobility(&p, &ns, |w| w == "team/ReplicaSet/w"),
            Mobility::Pinned(Pinned::CoolingDown)
        );
    }

    #[test]
    fn the_annotation_opts_in_and_weighs_the_restart() {
        let p = pod(
            Some("Job"),
            json!({"gpu-share.io/defrag": "allow", "gpu-share.io/restart-cost": "3"}),
            "Running",
        );
        match mobility(&p, &[], never) {
            Mobility::Movable(m) => {
                assert_eq!((m.restart_cost, m.workload.as_str()), (3, "team/Job/w"))
            }
            other => panic!("{other:?}"),
        }
        let bad = pod(
            Some("Job"),
            json!({"gpu-share.io/restart-cost": "lots"}),
            "Running",
        );
        let e = restart_cost(&bad).unwrap_err();
        assert_eq!(e, BadRestartCost("lots".into()));
        assert!(e.to_string().contains("whole number from 1 to 100"), "{e}");
    }
}

//! PURE: which of the best-packed nodes filter passes on under `packing.candidates: one`.
//!
//! The packing's best tier is often many nodes: a placement that fragments nothing (a whole
//! GPU, a node's first share) scores the same on every node where it fits. Passing them all
//! leaves kube-scheduler to run its Score plugins over each and ask prioritize about each.
//! Among nodes its scores would rank alike, that work chooses nothing, so filter passes one: the
//! first of the tier in a fixed order of node names, as the simulator's replay (and the FGD
//! paper's) breaks ties by the first node of a fixed permutation. kube-scheduler skips scoring
//! a pod that one node fits.
//!
//! Where kube-scheduler's scores *would* tell the tied nodes apart by what the pod or the nodes
//! ask for, the whole tier goes on, and those scores choose, as under `best`:
//! - the pod prefers (preferred node affinity, preferred pod affinity or anti-affinity, a
//!   topology spread constraint with `whenUnsatisfiable: ScheduleAnyway`);
//! - the pod belongs to a ReplicaSet, StatefulSet or ReplicationController, whose pods
//!   kube-scheduler's default topology spread (`defaultingType: System`) spreads over hosts and
//!   zones;
//! - the tied nodes differ in their `PreferNoSchedule` taints.
//!
//! What one node leaves out: kube-scheduler's resource scores (MostAllocated as shipped,
//! balanced allocation) and image locality among equally well packed nodes, and the preferred
//! terms of pods already running toward this one (inter-pod affinity's symmetric half).

use std::hash::Hasher;

use k8s_openapi::api::core::v1::Pod;

/// Why kube-scheduler's own scores should choose among the tied nodes, read from the pod alone
/// (`None`: nothing of the pod's for them to weigh).
pub fn pod_preference(pod: &Pod) -> Option<&'static str> {
    if pod.metadata.owner_references.iter().flatten().any(|o| {
        o.controller == Some(true)
            && matches!(
                o.kind.as_str(),
                "ReplicaSet" | "StatefulSet" | "ReplicationController"
            )
    }) {
        return Some("default topology spread (controller-owned pod)");
    }
    let spec = pod.spec.as_ref()?;
    if let Some(a) = &spec.affinity {
        let preferred = [
            (
                a.node_affinity.as_ref().map_or(0, |n| {
                    terms(&n.preferred_during_scheduling_ignored_during_execution)
                }),
                "preferred node affinity",
            ),
            (
                a.pod_affinity.as_ref().map_or(0, |p| {
                    terms(&p.preferred_during_scheduling_ignored_during_execution)
                }),
                "preferred pod affinity",
            ),
            (
                a.pod_anti_affinity.as_ref().map_or(0, |p| {
                    terms(&p.preferred_during_scheduling_ignored_during_execution)
                }),
                "preferred pod anti-affinity",
            ),
        ];
        if let Some((_, why)) = preferred.into_iter().find(|(n, _)| *n > 0) {
            return Some(why);
        }
    }
    let soft_spread = spec
        .topology_spread_constraints
        .iter()
        .flatten()
        .any(|c| c.when_unsatisfiable == "ScheduleAnyway");
    if soft_spread {
        return Some("topology spread (ScheduleAnyway)");
    }
    None
}

/// How many terms an optional list holds.
fn terms<T>(list: &Option<Vec<T>>) -> usize {
    list.as_ref().map_or(0, Vec::len)
}

/// The node's place in the fixed order ties are broken by: the FNV-1a hash of its name (a
/// specified hash, so every replica and every release orders nodes alike; nodes named in
/// sequence land spread over the order, as in the replay's random permutation).
pub fn tie_order(name: &str) -> u64 {
    let mut h = fnv::FnvHasher::default();
    h.write(name.as_bytes());
    h.finish()
}

/// What filter passes of the best tier (`tier[i]`: node `names[i]` is in it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pass {
    /// This node alone.
    One(usize),
    /// The whole tier, and why kube-scheduler's scores choose among it.
    Tier(&'static str),
}

/// One node of the tier (the first in [`tie_order`]), unless the pod prefers something
/// kube-scheduler's scores weigh (`preference`, from [`pod_preference`]) or the tied nodes differ
/// in their [`crate::cache::node::soft_taints`] (`taints_of`). A tier of one is passed as one.
pub fn pick<'a>(
    names: &[String],
    tier: &[bool],
    preference: Option<&'static str>,
    taints_of: impl Fn(&str) -> Option<&'a [String]>,
) -> Pass {
    let mut members = names.iter().zip(tier).enumerate().filter(|(_, (_, t))| **t);
    let Some((first, (first_name, _))) = members.next() else {
        return Pass::Tier("no node in the tier");
    };
    let mut rest = members.peekable();
    if rest.peek().is_none() {
        return Pass::One(first);
    }
    if let Some(why) = preference {
        return Pass::Tier(why);
    }
    let taints = taints_of(first_name);
    let mut best = (tie_order(first_name), first);
    for (i, (name, _)) in rest {
        if taints_of(name) != taints {
            return Pass::Tier("the tied nodes differ in PreferNoSchedule taints");
        }
        let key = (tie_order(name), i);
        if key < best {
            best = key;
        }
    }
    Pass::One(best.1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).unwrap()
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("gpu-{i}")).collect()
    }

    #[test]
    fn one_node_of_the_tier_first_in_the_fixed_order() {
        let names = names(6);
        let tier = [true, false, true, true, false, true];
        let want = [0usize, 2, 3, 5]
            .into_iter()
            .min_by_key(|i| tie_order(&names[*i]))
            .unwrap();
        assert_eq!(pick(&names, &tier, None, |_| None), Pass::One(want));
        // The order is the names', not the positions': the same nodes sent in another order give
        // the same node.
        let mut reversed = names.clone();
        reversed.reverse();
        let mut rtier = tier;
        rtier.reverse();
        match pick(&reversed, &rtier, None, |_| None) {
            Pass::One(i) => assert_eq!(reversed[i], names[want]),
            other => panic!("{other:?}"),
        }
        // A tier of one is that node, whatever the pod prefers.
        assert_eq!(
            pick(
                &names,
                &[false, false, false, true, false, false],
                Some("x"),
                |_| None
            ),
            Pass::One(3)
        );
        // The hash is FNV-1a 64 (its published test vector), so every release orders alike.
        assert_eq!(tie_order("a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn the_whole_tier_when_the_pod_prefers_or_the_taints_differ() {
        let names = names(3);
        let tier = [true, true, true];
        assert_eq!(
            pick(&names, &tier, Some("preferred node affinity"), |_| None),
            Pass::Tier("preferred node affinity")
        );
        let tainted = vec!["dedicated=gpu".to_string()];
        let differ = pick(&names, &tier, None, |n| {
            (n == "gpu-1").then_some(tainted.as_slice())
        });
        assert!(matches!(differ, Pass::Tier(_)), "{differ:?}");
        // Every tied node alike tainted: one node.
        let alike = pick(&names, &tier, None, |_| Some(tainted.as_slice()));
        assert!(matches!(alike, Pass::One(_)), "{alike:?}");
        // A tainted node outside the tier does not matter.
        let outside = pick(&names, &[true, false, true], None, |n| {
            (n == "gpu-1").then_some(tainted.as_slice())
        });
        assert!(matches!(outside, Pass::One(_)), "{outside:?}");
    }

    #[test]
    fn what_a_pod_prefers_is_read_from_its_spec_and_owner() {
        assert_eq!(pod_preference(&pod(json!({"containers": []}))), None);
        let required_only = pod(json!({"containers": [], "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "k", "operator": "Exists"}]}]}}}}));
        assert_eq!(pod_preference(&required_only), None);
        let preferred = pod(json!({"containers": [], "affinity": {"nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference":
                {"matchExpressions": [{"key": "k", "operator": "Exists"}]}}]}}}));
        assert_eq!(pod_preference(&preferred), Some("preferred node affinity"));
        let apart = pod(json!({"containers": [], "affinity": {"podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "podAffinityTerm":
                {"topologyKey": "kubernetes.io/hostname"}}]}}}));
        assert_eq!(pod_preference(&apart), Some("preferred pod anti-affinity"));
        let together = pod(json!({"containers": [], "affinity": {"podAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "podAffinityTerm":
                {"topologyKey": "zone"}}]}}}));
        assert_eq!(pod_preference(&together), Some("preferred pod affinity"));
        let empty_list = pod(json!({"containers": [], "affinity": {"nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": []}}}));
        assert_eq!(pod_preference(&empty_list), None);
        let hard_spread = pod(json!({"containers": [], "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]}));
        assert_eq!(pod_preference(&hard_spread), None);
        let soft_spread = pod(json!({"containers": [], "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}]}));
        assert!(pod_preference(&soft_spread).is_some());
        let owned = |kind: &str| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "p", "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": kind, "name": "o", "uid": "u",
                 "controller": true}]}, "spec": {"containers": []}}))
            .unwrap()
        };
        assert!(pod_preference(&owned("ReplicaSet")).is_some());
        assert!(pod_preference(&owned("StatefulSet")).is_some());
        // A Job's pods are not spread by default.
        assert_eq!(pod_preference(&owned("Job")), None);
    }
}

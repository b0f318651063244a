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
//! A pod of a ReplicaSet (a Deployment's), StatefulSet or ReplicationController is spread by
//! kube-scheduler's default topology spread (`defaultingType: System`: hosts with `maxSkew` 3,
//! zones with 5, both `ScheduleAnyway`). The ledger counts each such controller's pods per node,
//! so filter ranks the tier as that plugin's score would ([`spread_scores`]) and passes one node
//! of the best rank, the first in the fixed order.
//!
//! Where kube-scheduler's scores *would* tell the tied nodes apart by what the pod or the nodes
//! ask for, the whole tier goes on, and those scores choose, as under `best`:
//! - the pod prefers (preferred node affinity, preferred pod affinity or anti-affinity, a
//!   topology spread constraint with `whenUnsatisfiable: ScheduleAnyway`, which replaces the
//!   default spread);
//! - the tied nodes differ in their `PreferNoSchedule` taints.
//!
//! What one node leaves out: kube-scheduler's resource scores (MostAllocated as shipped,
//! balanced allocation) and image locality among equally well packed nodes, and the preferred
//! terms of pods already running toward this one (inter-pod affinity's symmetric half).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hasher;

use k8s_openapi::api::core::v1::Pod;

/// The node label kube-scheduler's default spread over hosts reads.
pub const HOSTNAME: &str = "kubernetes.io/hostname";
/// The node label its spread over zones reads.
pub const ZONE: &str = "topology.kubernetes.io/zone";

/// What kube-scheduler's scores weigh among the tied nodes for a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Preference {
    /// Its default topology spread of this controller's pods (its UID,
    /// [`crate::ledger::spread_controller`]): filter ranks the tier by it.
    Spread(String),
    /// Something filter does not rank: the whole tier goes on, and why.
    Scores(&'static str),
}

/// What kube-scheduler's own scores weigh among the tied nodes, read from the pod alone
/// (`None`: nothing of the pod's for them to weigh).
pub fn pod_preference(pod: &Pod) -> Option<Preference> {
    if let Some(why) = spec_preference(pod) {
        return Some(Preference::Scores(why));
    }
    crate::ledger::spread_controller(pod).map(Preference::Spread)
}

/// What the pod's spec asks kube-scheduler's scores to weigh.
fn spec_preference(pod: &Pod) -> Option<&'static str> {
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

/// kube-scheduler's PodTopologySpread score, before normalizing (lower is preferred), for each
/// node of the tier (`tier`: the nodes filter would pass under `best`, which kube-scheduler
/// then scores), under the system default constraints, as its `Score` computes it: per
/// constraint whose label the node has, `count × ln(domains + 2) + maxSkew − 1`, summed and
/// rounded. `count` is the controller's pods on the node (hosts; kube-scheduler counts the pods
/// of the pod's owner there) or in the node's zone (zones, counted on every node); `domains` is
/// the tier's nodes (hosts) or the tier's zone values, a node without the label counting as the
/// empty value. `counts`: the controller's pods per node
/// ([`crate::ledger::Ledger::spread_counts`]); `labels_of`: a node's labels.
pub fn spread_scores<'a>(
    tier: &[&str],
    counts: &HashMap<String, u32>,
    labels_of: impl Fn(&str) -> Option<&'a BTreeMap<String, String>>,
) -> Vec<f64> {
    // Each tier node's labels read once: whether it has a hostname, and its zone (borrowed, no
    // String per node of a tier of thousands).
    let read: Vec<(bool, Option<&str>)> = tier
        .iter()
        .map(|node| {
            labels_of(node).map_or((false, None), |l| {
                (l.contains_key(HOSTNAME), l.get(ZONE).map(String::as_str))
            })
        })
        .collect();
    let zones_in_tier: std::collections::HashSet<&str> =
        read.iter().map(|(_, z)| z.unwrap_or("")).collect();
    let mut per_zone: HashMap<&str, u32> = HashMap::new();
    if read.iter().any(|(_, z)| z.is_some()) {
        for (node, n) in counts {
            let z = labels_of(node)
                .and_then(|l| l.get(ZONE))
                .map_or("", String::as_str);
            if zones_in_tier.contains(z) {
                *per_zone.entry(z).or_default() += n;
            }
        }
    }
    let host_weight = (tier.len() as f64 + 2.0).ln();
    let zone_weight = (zones_in_tier.len() as f64 + 2.0).ln();
    tier.iter()
        .zip(&read)
        .map(|(node, (has_host, zone))| {
            let mut score = 0.0;
            if *has_host {
                let on_node = counts.get(*node).copied().unwrap_or(0);
                score += f64::from(on_node) * host_weight + f64::from(HOST_MAX_SKEW - 1);
            }
            if let Some(z) = zone {
                let in_zone = per_zone.get(z).copied().unwrap_or(0);
                score += f64::from(in_zone) * zone_weight + f64::from(ZONE_MAX_SKEW - 1);
            }
            // Go's math.Round and Rust's round both round half away from zero.
            score.round()
        })
        .collect()
}

/// The system default constraints' `maxSkew`: hosts, then zones.
const HOST_MAX_SKEW: u32 = 3;
const ZONE_MAX_SKEW: u32 = 5;

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

/// One node of the tier (the first in [`tie_order`]; for a spread pod, the first of the best
/// spread rank, `spread`: each tier member's [`spread_scores`] in the tier's order), unless the
/// pod prefers something else kube-scheduler's scores weigh (`preference`) or the tied nodes
/// differ in their [`crate::cache::node::soft_taints`] (`taints_of`). A tier of one is passed as
/// one.
pub fn pick<'a>(
    names: &[String],
    tier: &[bool],
    preference: Option<&Preference>,
    taints_of: impl Fn(&str) -> Option<&'a [String]>,
    spread: Option<&[f64]>,
) -> Pass {
    let mut members = names.iter().zip(tier).enumerate().filter(|(_, (_, t))| **t);
    let Some((first, (first_name, _))) = members.next() else {
        return Pass::Tier("no node in the tier");
    };
    let mut rest = members.peekable();
    if rest.peek().is_none() {
        return Pass::One(first);
    }
    if let Some(Preference::Scores(why)) = preference {
        return Pass::Tier(why);
    }
    // Ranked by spread (when the pod is spread), then by the fixed order.
    let rank = |k: usize, name: &str| {
        let s = spread.and_then(|s| s.get(k)).copied().unwrap_or(0.0);
        (s, tie_order(name))
    };
    let taints = taints_of(first_name);
    let mut best = (rank(0, first_name), first);
    for (k, (i, (name, _))) in rest.enumerate() {
        if taints_of(name) != taints {
            return Pass::Tier("the tied nodes differ in PreferNoSchedule taints");
        }
        let key = (rank(k + 1, name), i);
        let ((score, order), at) = key;
        let ((best_score, best_order), best_at) = best;
        if score
            .total_cmp(&best_score)
            .then((order, at).cmp(&(best_order, best_at)))
            .is_lt()
        {
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
        assert_eq!(pick(&names, &tier, None, |_| None, None), Pass::One(want));
        // The order is the names', not the positions': the same nodes sent in another order give
        // the same node.
        let mut reversed = names.clone();
        reversed.reverse();
        let mut rtier = tier;
        rtier.reverse();
        match pick(&reversed, &rtier, None, |_| None, None) {
            Pass::One(i) => assert_eq!(reversed[i], names[want]),
            other => panic!("{other:?}"),
        }
        // A tier of one is that node, whatever the pod prefers.
        assert_eq!(
            pick(
                &names,
                &[false, false, false, true, false, false],
                Some(&Preference::Scores("x")),
                |_| None,
                None
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
            pick(
                &names,
                &tier,
                Some(&Preference::Scores("preferred node affinity")),
                |_| None,
                None
            ),
            Pass::Tier("preferred node affinity")
        );
        let tainted = vec!["dedicated=gpu".to_string()];
        let differ = pick(
            &names,
            &tier,
            None,
            |n| (n == "gpu-1").then_some(tainted.as_slice()),
            None,
        );
        assert!(matches!(differ, Pass::Tier(_)), "{differ:?}");
        // Every tied node alike tainted: one node.
        let alike = pick(&names, &tier, None, |_| Some(tainted.as_slice()), None);
        assert!(matches!(alike, Pass::One(_)), "{alike:?}");
        // A tainted node outside the tier does not matter.
        let outside = pick(
            &names,
            &[true, false, true],
            None,
            |n| (n == "gpu-1").then_some(tainted.as_slice()),
            None,
        );
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
        assert_eq!(
            pod_preference(&preferred),
            Some(Preference::Scores("preferred node affinity"))
        );
        let apart = pod(json!({"containers": [], "affinity": {"podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "podAffinityTerm":
                {"topologyKey": "kubernetes.io/hostname"}}]}}}));
        assert_eq!(
            pod_preference(&apart),
            Some(Preference::Scores("preferred pod anti-affinity"))
        );
        let together = pod(json!({"containers": [], "affinity": {"podAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "podAffinityTerm":
                {"topologyKey": "zone"}}]}}}));
        assert_eq!(
            pod_preference(&together),
            Some(Preference::Scores("preferred pod affinity"))
        );
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
        assert_eq!(
            pod_preference(&owned("ReplicaSet")),
            Some(Preference::Spread("u".into()))
        );
        assert_eq!(
            pod_preference(&owned("StatefulSet")),
            Some(Preference::Spread("u".into()))
        );
        // A Job's pods are not spread by default.
        assert_eq!(pod_preference(&owned("Job")), None);
    }

    /// A spread pod's node is the one kube-scheduler's PodTopologySpread scores best: fewest of
    /// its controller's pods on the node, then in its zone, each weighed by how many hosts and
    /// zones the tier spans; the fixed order among equals.
    #[test]
    fn a_spread_pod_goes_where_the_default_spread_scores_best() {
        let labels = |host: &str, zone: Option<&str>| -> BTreeMap<String, String> {
            let mut l = BTreeMap::from([(HOSTNAME.to_string(), host.to_string())]);
            if let Some(z) = zone {
                l.insert(ZONE.to_string(), z.to_string());
            }
            l
        };
        // Hosts only: the node with the fewest pods of the controller.
        let nodes: BTreeMap<String, BTreeMap<String, String>> = (0..4)
            .map(|i| (format!("gpu-{i}"), labels(&format!("gpu-{i}"), None)))
            .collect();
        let names: Vec<String> = nodes.keys().cloned().collect();
        let tier: Vec<&str> = names.iter().map(String::as_str).collect();
        let counts = HashMap::from([
            ("gpu-0".to_string(), 2),
            ("gpu-1".to_string(), 1),
            ("gpu-3".to_string(), 1),
        ]);
        let scores = spread_scores(&tier, &counts, |n| nodes.get(n));
        // Four hosts weigh ln(6) each pod; no zone label, no zone term; rounded as
        // kube-scheduler rounds.
        let w = 6f64.ln();
        assert_eq!(
            scores,
            [
                (2.0 * w + 2.0).round(),
                (w + 2.0).round(),
                2.0,
                (w + 2.0).round()
            ]
        );
        assert_eq!(scores, [6.0, 4.0, 2.0, 4.0]);
        let spread = Preference::Spread("rs".into());
        assert_eq!(
            pick(&names, &[true; 4], Some(&spread), |_| None, Some(&scores)),
            Pass::One(2)
        );
        // Equal scores: the fixed order, as for any pod.
        let even = spread_scores(&tier, &HashMap::new(), |n| nodes.get(n));
        assert_eq!(
            pick(&names, &[true; 4], Some(&spread), |_| None, Some(&even)),
            pick(&names, &[true; 4], None, |_| None, None)
        );
        // Zones: a zone holding the controller's pods on nodes outside the tier weighs against
        // its empty nodes in the tier.
        let mut zoned: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for (n, z) in [("a-0", "a"), ("a-1", "a"), ("b-0", "b"), ("b-1", "b")] {
            zoned.insert(n.to_string(), labels(n, Some(z)));
        }
        let counts = HashMap::from([("a-1".to_string(), 3), ("b-1".to_string(), 1)]);
        // a-1 and b-1 are full (not in the tier): a-0 and b-0 hold none of the pods.
        let tier = ["a-0", "b-0"];
        let scores = spread_scores(&tier, &counts, |n| zoned.get(n));
        // Two hosts and two zones in the tier: both weigh ln(4).
        let zone_w = 4f64.ln();
        assert_eq!(
            scores,
            [
                (2.0 + 3.0 * zone_w + 4.0).round(),
                (2.0 + zone_w + 4.0).round()
            ]
        );
        assert_eq!(scores, [10.0, 7.0]);
        // A node without the zone label has no zone term (and its empty value is a domain of
        // the tier's): kube-scheduler prefers it to a zoned node holding none of the pods.
        let mut mixed = zoned.clone();
        mixed.insert("bare".into(), labels("bare", None));
        let scores = spread_scores(&["a-0", "bare"], &HashMap::new(), |n| mixed.get(n));
        assert_eq!(scores, [6.0, 2.0]);
        let names: Vec<String> = tier.iter().map(|n| n.to_string()).collect();
        assert_eq!(
            pick(
                &names,
                &[true, true],
                Some(&spread),
                |_| None,
                Some(&scores)
            ),
            Pass::One(1)
        );
    }
}

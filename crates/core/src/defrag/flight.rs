//! PURE: a plan under way (`defrag.mode: on`). Its targets and the freed room are held before
//! anything moves; then each pod is evicted, its replacement (known by its controller and pod
//! template) is steered to its held target, and the freed room goes to the waiting pod. What a
//! plan under way is, what it says it is on the waiting pod (so that a restarted extender knows
//! to unwind it), and how it ends, with no I/O.

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

use super::mobility::recreating_controller;
use super::model::Plan;

/// The annotation a plan under way writes on its waiting pod: [`Record`] as JSON. A replica
/// that finds it on a waiting pod and holds no such plan (it restarted, or leads since) unwinds
/// it: the holds were its predecessor's, and are gone with it.
pub const ANNOTATION_PLAN: &str = "gpu-share.io/defrag-plan";

/// The labels a controller's pods carry for their pod template: a ReplicaSet's
/// (`pod-template-hash`) and a StatefulSet's (`controller-revision-hash`). A replacement
/// carries the one its moved pod carried.
pub const TEMPLATE_LABELS: [&str; 2] = ["pod-template-hash", "controller-revision-hash"];

/// Who a pod is, by its UID and `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodId {
    pub uid: String,
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for PodId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// How a pod's replacement is known: its controller's UID and the pod template's hash label,
/// where its controller writes one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Lineage {
    pub controller: String,
    pub template: Option<String>,
}

impl Lineage {
    /// The lineage of `pod`, where a controller that recreates pods owns it.
    pub fn of(pod: &Pod) -> Option<Lineage> {
        let (_, controller) = recreating_controller(pod)?;
        let labels = pod.metadata.labels.as_ref();
        let template = TEMPLATE_LABELS
            .iter()
            .find_map(|l| labels.and_then(|m| m.get(*l)).cloned());
        Some(Lineage {
            controller,
            template,
        })
    }
}

/// Where one move stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Leg {
    /// Its target is held; the pod is not evicted yet.
    Held,
    /// Evicted: its replacement is awaited on the held target.
    Evicted,
    /// Its replacement was placed on the target (or came to no bind: see [`Flight::tick`]).
    Landed,
}

/// A plan under way for one waiting pod.
#[derive(Debug, Clone, PartialEq)]
pub struct Flight {
    pub waiting: PodId,
    pub plan: Plan,
    /// Each move's pod's lineage, in the plan's order.
    pub lineages: Vec<Lineage>,
    pub legs: Vec<Leg>,
    /// The pod that took each move's promise, once one did (its bind may still fail: the
    /// promise is held again if the pod is not held on the target, [`Leg::Landed`] once it is).
    pub redeemed: Vec<Option<String>>,
    /// Seconds since the Unix epoch: when it began, and when it lapses unfinished.
    pub started: u64,
    pub deadline: u64,
    /// Whether the waiting pod has been placed.
    pub placed: bool,
}

/// What the waiting pod's annotation says of its plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// The node room is made on.
    pub node: String,
    /// The pods moved, `namespace/name`.
    pub moves: Vec<String>,
    pub started: u64,
    pub deadline: u64,
}

/// How a plan under way ends short of placing its waiting pod, in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GiveUp {
    /// Not done by its deadline.
    Lapsed { seconds: u64 },
    /// An eviction was refused (a PodDisruptionBudget: the API's 429), with the API's words.
    Refused { pod: String, why: String },
    /// An eviction failed otherwise.
    Failed { pod: String, why: String },
    /// The waiting pod is gone, or was placed elsewhere before the room was made.
    WaitingGone,
    /// Begun by a replica that no longer holds it (restarted, or another leads now), as the
    /// waiting pod's annotation records it (`None`: one that cannot be read).
    Orphaned { plan: Option<Record> },
    /// `defrag.mode` is no longer `on`.
    TurnedOff,
}

impl GiveUp {
    /// The metric's label.
    pub fn label(&self) -> &'static str {
        match self {
            GiveUp::Lapsed { .. } => "lapsed",
            GiveUp::Refused { .. } => "eviction-refused",
            GiveUp::Failed { .. } => "eviction-failed",
            GiveUp::WaitingGone => "waiting-gone",
            GiveUp::Orphaned { .. } => "orphaned",
            GiveUp::TurnedOff => "turned-off",
        }
    }
}

impl std::fmt::Display for GiveUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GiveUp::Lapsed { seconds } => {
                write!(f, "not done within {seconds} s (defrag.planTimeoutSeconds)")
            }
            GiveUp::Refused { pod, why } => write!(
                f,
                "the eviction of {pod} was refused ({why}): its PodDisruptionBudget allows no disruption now; its workload is left alone for the cooldown"
            ),
            GiveUp::Failed { pod, why } => write!(f, "the eviction of {pod} failed ({why})"),
            GiveUp::WaitingGone => f.write_str("the waiting pod is gone or placed elsewhere"),
            GiveUp::Orphaned { plan } => {
                f.write_str(
                    "begun by a gpu-share replica that no longer holds it (restarted, or no longer leading)",
                )?;
                if let Some(r) = plan {
                    write!(
                        f,
                        ": moving {} to make room on node {}",
                        r.moves.join(", "),
                        r.node
                    )?;
                }
                f.write_str("; its holds went with it")
            }
            GiveUp::TurnedOff => f.write_str("defrag.mode is no longer on"),
        }
    }
}

/// What a plan under way does next, after [`Flight::tick`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Still under way.
    Wait,
    /// The waiting pod is placed and every replacement landed: done.
    Done,
    /// The waiting pod is placed, and the deadline came before some replacements did (their
    /// controller made none, or scaled down): done, and their promises released.
    DoneWithout,
    /// Given up.
    GiveUp(GiveUp),
}

impl Flight {
    /// A plan begun at `now` (seconds since the epoch), lapsing after `timeout` seconds;
    /// `lineages` in the plan's order of moves.
    pub fn begin(
        waiting: PodId,
        plan: Plan,
        lineages: Vec<Lineage>,
        now: u64,
        timeout: u64,
    ) -> Flight {
        let legs = vec![Leg::Held; plan.moves.len()];
        let redeemed = vec![None; plan.moves.len()];
        Flight {
            waiting,
            plan,
            lineages,
            legs,
            redeemed,
            started: now,
            deadline: now + timeout,
            placed: false,
        }
    }

    /// What the waiting pod's annotation says.
    pub fn record(&self) -> Record {
        Record {
            node: self.plan.node.clone(),
            moves: self.plan.moves.iter().map(|m| m.key.clone()).collect(),
            started: self.started,
            deadline: self.deadline,
        }
    }

    /// The move a pending pod of `lineage` (not the moved pod itself, `uid`) is the replacement
    /// of: the first move of that lineage, evicted, whose promise no pod has taken (or `uid`
    /// has). Any pending pod of the same controller and template takes the room just as well
    /// (it is the same demand); a move not evicted yet offers none, as its pod still runs.
    pub fn replaced_by(&self, lineage: &Lineage, uid: &str) -> Option<usize> {
        (0..self.legs.len()).find(|&i| {
            self.legs[i] == Leg::Evicted
                && self.redeemed[i].as_deref().is_none_or(|r| r == uid)
                && self.lineages.get(i) == Some(lineage)
                && self.plan.moves[i].id != uid
        })
    }

    /// How many moves are under way: evicted, their replacement not landed yet
    /// (`defrag.movesAtOnce` bounds these over every plan).
    pub fn moves_under_way(&self) -> usize {
        self.legs.iter().filter(|l| **l == Leg::Evicted).count()
    }

    /// The next move to evict, in the plan's order: the first whose pod still runs.
    pub fn next_eviction(&self) -> Option<usize> {
        self.legs.iter().position(|l| *l == Leg::Held)
    }

    /// Where the plan stands at `now`: `waiting` is whether the waiting pod still exists and
    /// waits (`None`: bound, `Some(true)`: waits, `Some(false)`: gone), and `bound_on` the node
    /// it is bound to, if bound.
    pub fn tick(&mut self, now: u64, waiting: Option<bool>, bound_on: Option<&str>) -> Next {
        match (waiting, bound_on) {
            // Placed, then gone (finished, deleted): the plan did its work.
            (Some(false), _) if self.placed => {}
            (Some(false), _) => return Next::GiveUp(GiveUp::WaitingGone),
            (None, Some(node)) if node != self.plan.node && !self.placed => {
                return Next::GiveUp(GiveUp::WaitingGone);
            }
            (None, _) => self.placed = true,
            _ => {}
        }
        let landed = self.legs.iter().all(|l| *l == Leg::Landed);
        if self.placed && landed {
            return Next::Done;
        }
        if now >= self.deadline {
            if self.placed {
                return Next::DoneWithout;
            }
            return Next::GiveUp(GiveUp::Lapsed {
                seconds: self.deadline.saturating_sub(self.started),
            });
        }
        Next::Wait
    }

    /// The plan and where it stands, in words (`gpu-share status`, `/v1/nodes`, the page).
    pub fn words(&self) -> String {
        let evicted = self.legs.iter().filter(|l| **l != Leg::Held).count();
        let landed = self.legs.iter().filter(|l| **l == Leg::Landed).count();
        let n = self.legs.len();
        format!(
            "for {}: {} (under way: {evicted} of {n} evicted, {landed} of {n} replacements placed{})",
            self.waiting,
            self.plan,
            if self.placed {
                ", the waiting pod placed"
            } else {
                ""
            }
        )
    }
}

/// The plan a waiting pod's annotation records, if it carries one that can be read.
pub fn recorded(pod: &Pod) -> Option<Record> {
    let text = pod.metadata.annotations.as_ref()?.get(ANNOTATION_PLAN)?;
    serde_json::from_str(text).ok()
}

/// Whether a waiting pod carries a plan annotation at all (one that cannot be read is unwound
/// as one that can).
pub fn carries_plan(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(ANNOTATION_PLAN))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::defrag::{Cost, Move};
    use crate::packing::{Demand, Placement};

    fn plan(moves: usize) -> Plan {
        Plan {
            node: "n0".into(),
            placement: Placement::default(),
            moves: (0..moves)
                .map(|i| Move {
                    id: format!("m{i}"),
                    key: format!("ml/m{i}"),
                    workload: "ml/ReplicaSet/rs".into(),
                    from: "n0".into(),
                    to: "n1".into(),
                    demand: Demand::gpu(crate::packing::GpuDemand::None),
                    placement: Placement::default(),
                })
                .collect(),
            releases: vec![],
            cost: Cost::default(),
        }
    }

    fn lineage(c: &str, t: Option<&str>) -> Lineage {
        Lineage {
            controller: c.into(),
            template: t.map(String::from),
        }
    }

    fn flight(moves: usize) -> Flight {
        Flight::begin(
            PodId {
                uid: "w".into(),
                namespace: "ml".into(),
                name: "wait".into(),
            },
            plan(moves),
            (0..moves).map(|_| lineage("rs-uid", Some("abc"))).collect(),
            1000,
            300,
        )
    }

    #[test]
    fn a_replacement_is_known_by_its_controller_and_template_not_its_name() {
        let mut f = flight(2);
        let l = lineage("rs-uid", Some("abc"));
        // Nothing evicted yet: no pod replaces anything.
        assert_eq!(f.replaced_by(&l, "new-1"), None);
        f.legs = vec![Leg::Evicted; 2];
        assert_eq!(f.replaced_by(&l, "new-1"), Some(0));
        // The moved pod itself is not its own replacement.
        assert_eq!(f.replaced_by(&l, "m0"), Some(1));
        assert_eq!(f.replaced_by(&lineage("rs-uid", Some("def")), "x"), None);
        assert_eq!(f.replaced_by(&lineage("other", Some("abc")), "x"), None);
        f.legs[0] = Leg::Landed;
        assert_eq!(f.replaced_by(&l, "new-2"), Some(1));
        f.legs[1] = Leg::Landed;
        assert_eq!(f.replaced_by(&l, "new-3"), None);
        // A promise taken is not offered to a second pod, unless its pod's bind comes again.
        let mut g = flight(2);
        g.legs = vec![Leg::Evicted; 2];
        g.redeemed[0] = Some("new-1".into());
        assert_eq!(g.replaced_by(&l, "new-2"), Some(1));
        assert_eq!(g.replaced_by(&l, "new-1"), Some(0));
    }

    /// Moves are evicted in the plan's order; only those evicted and not landed are under way.
    #[test]
    fn moves_are_evicted_in_order_and_under_way_until_landed() {
        let mut f = flight(3);
        assert_eq!((f.next_eviction(), f.moves_under_way()), (Some(0), 0));
        f.legs[0] = Leg::Evicted;
        assert_eq!((f.next_eviction(), f.moves_under_way()), (Some(1), 1));
        f.legs[1] = Leg::Evicted;
        f.legs[0] = Leg::Landed;
        assert_eq!((f.next_eviction(), f.moves_under_way()), (Some(2), 1));
        f.legs[2] = Leg::Evicted;
        assert_eq!((f.next_eviction(), f.moves_under_way()), (None, 2));
    }

    #[test]
    fn a_plan_is_done_once_its_pod_is_placed_and_every_replacement_landed() {
        let mut f = flight(1);
        assert_eq!(f.tick(1010, Some(true), None), Next::Wait);
        assert_eq!(f.tick(1020, None, Some("n0")), Next::Wait);
        assert!(f.placed);
        f.legs[0] = Leg::Landed;
        assert_eq!(f.tick(1030, None, Some("n0")), Next::Done);
    }

    #[test]
    fn a_plan_lapses_at_its_deadline_unless_its_pod_was_placed() {
        let mut f = flight(1);
        assert_eq!(
            f.tick(1300, Some(true), None),
            Next::GiveUp(GiveUp::Lapsed { seconds: 300 })
        );
        let mut g = flight(1);
        assert_eq!(g.tick(1100, None, Some("n0")), Next::Wait);
        assert_eq!(g.tick(1300, None, Some("n0")), Next::DoneWithout);
        // Placed, then gone (it finished): the plan ends as done, not given up.
        let mut h = flight(1);
        assert_eq!(h.tick(1100, None, Some("n0")), Next::Wait);
        assert_eq!(h.tick(1110, Some(false), None), Next::Wait);
        h.legs[0] = Leg::Landed;
        assert_eq!(h.tick(1120, Some(false), None), Next::Done);
    }

    #[test]
    fn a_waiting_pod_gone_or_placed_elsewhere_gives_the_plan_up() {
        let mut f = flight(1);
        assert_eq!(
            f.tick(1010, Some(false), None),
            Next::GiveUp(GiveUp::WaitingGone)
        );
        let mut g = flight(1);
        assert_eq!(
            g.tick(1010, None, Some("n7")),
            Next::GiveUp(GiveUp::WaitingGone)
        );
    }

    #[test]
    fn the_record_reads_back_from_the_annotation() {
        let f = flight(2);
        let mut pod = Pod::default();
        pod.metadata.annotations = Some(
            [(
                ANNOTATION_PLAN.to_string(),
                serde_json::to_string(&f.record()).unwrap(),
            )]
            .into(),
        );
        assert_eq!(recorded(&pod), Some(f.record()));
        assert!(carries_plan(&pod));
        pod.metadata.annotations = Some([(ANNOTATION_PLAN.to_string(), "{".to_string())].into());
        assert_eq!(recorded(&pod), None);
        assert!(carries_plan(&pod));
    }

    #[test]
    fn a_lineage_takes_the_template_label_its_controller_writes() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
        let mut pod = Pod::default();
        pod.metadata.namespace = Some("ml".into());
        pod.metadata.owner_references = Some(vec![OwnerReference {
            kind: "StatefulSet".into(),
            name: "s".into(),
            uid: "ss-uid".into(),
            controller: Some(true),
            ..Default::default()
        }]);
        pod.metadata.labels =
            Some([("controller-revision-hash".to_string(), "s-7d".to_string())].into());
        assert_eq!(Lineage::of(&pod), Some(lineage("ss-uid", Some("s-7d"))));
        pod.metadata.owner_references.as_mut().unwrap()[0].kind = "DaemonSet".into();
        assert_eq!(Lineage::of(&pod), None);
    }
}

//! PURE: who holds what on each node during a replay, and defragmentation carried out on it:
//! when a pod fits nowhere, the core's plan ([`crate::defrag::plan`]) moves the pods it names
//! (every trace pod may move: the trace says nothing of controllers) and the pod is placed
//! where room was made. Pods leave too ([`Residents::depart`], the replay with departures).

use std::collections::{HashMap, HashSet};

use crate::defrag::{self, Guest, Limits, Mobility, Movable, Resident, Site, Waiting};
use crate::inventory::{GpuNode, Sharing};
use crate::packing::{self, Demand, Placement, Scorer, Usage};

/// What defragmentation did over one replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Moved {
    /// Pods refused by the packing for which a plan was sought.
    pub sought: u64,
    /// Of those, the pods placed once the plan's moves were made.
    pub placed: u64,
    /// Pods moved, over all plans.
    pub moves: u64,
    /// GPUs the placed pods asked for (a share asks one): the room the moves made.
    pub gpus_freed: u64,
}

/// Applies a placement to a node's usage with the reservations it opens, and returns them; or
/// `None`, and applies nothing, when they do not fit.
pub type PlaceFn<'a> =
    &'a dyn Fn(&GpuNode, &mut Usage, &Placement) -> Option<Vec<(Demand, Placement)>>;

/// The residents of every node, kept beside the replay's usages.
#[derive(Debug, Clone)]
pub struct Residents {
    limits: Limits,
    nodes: Vec<Vec<Resident>>,
    /// Which node each pod is on, by its id.
    at: HashMap<String, usize>,
    /// The next resident's number (trace pods repeat when the trace is inflated).
    next: u64,
    /// Counts the changes to the nodes: a demand no plan made room for is not planned again
    /// until something changed (`no_plan`: the count it failed at).
    version: u64,
    no_plan: HashMap<Demand, u64>,
    pub moved: Moved,
}

impl Residents {
    pub fn new(nodes: usize, limits: Limits) -> Residents {
        Residents {
            limits,
            nodes: vec![Vec::new(); nodes],
            at: HashMap::new(),
            next: 0,
            version: 0,
            no_plan: HashMap::new(),
            moved: Moved::default(),
        }
    }

    fn resident(&mut self, pod: usize, demand: &Demand, placement: &Placement) -> Resident {
        self.next += 1;
        Resident {
            id: format!("pod-{}", self.next),
            key: format!("pod {pod}"),
            demand: demand.clone(),
            placement: placement.clone(),
            mobility: Mobility::Movable(Movable {
                priority: 0,
                restart_cost: 1,
                workload: format!("pod {pod}"),
            }),
        }
    }

    /// Pod `pod` of the trace placed on node `node`, with the reservations its placement
    /// opened: its id.
    pub fn placed(
        &mut self,
        node: usize,
        pod: usize,
        demand: &Demand,
        placement: &Placement,
        reservations: &[(Demand, Placement)],
    ) -> String {
        let r = self.resident(pod, demand, placement);
        let id = r.id.clone();
        self.version += 1;
        push_reservations(&mut self.nodes[node], node, reservations);
        self.nodes[node].push(r);
        self.at.insert(id.clone(), node);
        id
    }

    /// The demands of the pods running now (reservations left out).
    pub fn running(&self) -> impl Iterator<Item = &Demand> {
        self.nodes
            .iter()
            .flatten()
            .filter(|r| r.mobility != Mobility::Reservation)
            .map(|r| &r.demand)
    }

    /// Pod `id` leaves: its holding is taken off its node's usage, and on a node shared per
    /// GPU, the reservation of each GPU it leaves with no share (released at once: the
    /// controller's grace is not modelled). The node, or `None` for an unknown pod.
    pub fn depart(&mut self, id: &str, nodes: &[GpuNode], usages: &mut [Usage]) -> Option<usize> {
        let n = self.at.remove(id)?;
        self.version += 1;
        let here = &mut self.nodes[n];
        let k = here.iter().position(|r| r.id == id)?;
        let gone = here.remove(k);
        packing::unapply(&mut usages[n], &gone.placement);
        if nodes[n].sharing == Sharing::PerGpu {
            for (g, _) in &gone.placement.gpus {
                let shared = here.iter().any(|r| {
                    r.mobility != Mobility::Reservation
                        && r.placement.shared
                        && r.placement.gpus.iter().any(|(j, _)| j == g)
                });
                if !shared
                    && let Some(k) = here.iter().position(|r| {
                        r.mobility == Mobility::Reservation && r.placement.reserve == Some(*g)
                    })
                {
                    let r = here.remove(k);
                    packing::unapply(&mut usages[n], &r.placement);
                }
            }
        }
        Some(n)
    }

    /// Makes room for `demand` (trace pod `pod`) by the moves the plan names, and places it:
    /// the nodes whose usage changed and the pod's id, or `None` (nothing changed) when there
    /// is no plan or the plan does not carry out (a reservation the pod's placement opens finds
    /// no room). `place` applies each placement with the reservations it opens.
    pub fn make_room(
        &mut self,
        scorer: &Scorer,
        nodes: &[GpuNode],
        usages: &mut [Usage],
        pod: usize,
        demand: &Demand,
        place: PlaceFn,
    ) -> Option<(Vec<usize>, String)> {
        self.moved.sought += 1;
        if self.no_plan.get(demand) == Some(&self.version) {
            return None;
        }
        let plan = {
            let sites: Vec<Site> = nodes
                .iter()
                .zip(usages.iter())
                .zip(&self.nodes)
                .map(|((node, usage), residents)| Site {
                    node,
                    usage,
                    residents,
                })
                .collect();
            defrag::plan(
                scorer,
                &sites,
                &Waiting {
                    demand,
                    priority: 0,
                },
                &self.limits,
                |_: Guest, _: &str| true,
            )
        };
        let plan = match plan {
            Ok(plan) => plan,
            Err(why) => {
                tracing::debug!(pod, demand = %demand.gpu, why = %why, "no plan");
                self.no_plan.insert(demand.clone(), self.version);
                return None;
            }
        };
        let index = |name: &str| nodes.iter().position(|n| n.name == name);
        let source = index(&plan.node)?;
        // Carried out on copies of the nodes it touches, kept only if the pod is placed at
        // the end.
        let mut touched: Vec<usize> = vec![source];
        let mut usage: Vec<Usage> = vec![usages[source].clone()];
        let mut lists: Vec<Vec<Resident>> = vec![self.nodes[source].clone()];
        let gone: HashSet<&str> = plan
            .releases
            .iter()
            .chain(plan.moves.iter().map(|m| &m.id))
            .map(String::as_str)
            .collect();
        let mut carried: Vec<Resident> = Vec::new();
        let mut kept = Vec::with_capacity(lists[0].len());
        for r in lists[0].drain(..) {
            if gone.contains(r.id.as_str()) {
                packing::unapply(&mut usage[0], &r.placement);
                if r.mobility != Mobility::Reservation {
                    carried.push(r);
                }
            } else {
                kept.push(r);
            }
        }
        lists[0] = kept;
        for m in &plan.moves {
            let t = index(&m.to)?;
            let k = match touched.iter().position(|i| *i == t) {
                Some(k) => k,
                None => {
                    touched.push(t);
                    usage.push(usages[t].clone());
                    lists.push(self.nodes[t].clone());
                    touched.len() - 1
                }
            };
            let opened = place(&nodes[t], &mut usage[k], &m.placement)?;
            let mut r = carried.iter().find(|r| r.id == m.id)?.clone();
            r.placement = m.placement.clone();
            push_reservations(&mut lists[k], t, &opened);
            lists[k].push(r);
        }
        let opened = place(&nodes[source], &mut usage[0], &plan.placement)?;
        push_reservations(&mut lists[0], source, &opened);
        let r = self.resident(pod, demand, &plan.placement);
        let id = r.id.clone();
        lists[0].push(r);
        for ((n, u), list) in touched.iter().zip(usage).zip(lists) {
            usages[*n] = u;
            for r in &list {
                if r.mobility != Mobility::Reservation {
                    self.at.insert(r.id.clone(), *n);
                }
            }
            self.nodes[*n] = list;
        }
        self.version += 1;
        self.moved.placed += 1;
        self.moved.moves += plan.moves.len() as u64;
        self.moved.gpus_freed += u64::from(defrag::room::gpus_asked(&demand.gpu));
        Some((touched, id))
    }
}

fn push_reservations(here: &mut Vec<Resident>, node: usize, opened: &[(Demand, Placement)]) {
    for (d, p) in opened {
        here.push(Resident {
            id: format!("reserve-{node}-{}", p.reserve.unwrap_or(u32::MAX)),
            key: String::new(),
            demand: d.clone(),
            placement: p.clone(),
            mobility: Mobility::Reservation,
        });
    }
}

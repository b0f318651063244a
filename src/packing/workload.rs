//! The workloads scores are measured against: the most recent demands (the fragmentation
//! gauge's window), and the workload `gpu-share` learns online, handing out target workloads.

use std::collections::{HashMap, VecDeque};

use super::demand::Demand;
use super::frag::{Shape, TargetWorkload};

/// The most recent demands (a window, most recent last): the extender's fragmentation gauge
/// measures against the most common of them.
#[derive(Debug, Clone)]
pub struct Workload {
    capacity: usize,
    window: VecDeque<Demand>,
    counts: HashMap<Demand, u32>,
}

impl Workload {
    pub fn new(capacity: usize) -> Self {
        Workload {
            capacity: capacity.max(1),
            window: VecDeque::new(),
            counts: HashMap::new(),
        }
    }

    /// Records one decision's demand.
    pub fn observe(&mut self, demand: &Demand) {
        if self.window.len() == self.capacity
            && let Some(old) = self.window.pop_front()
            && let Some(c) = self.counts.get_mut(&old)
        {
            *c -= 1;
            if *c == 0 {
                self.counts.remove(&old);
            }
        }
        self.window.push_back(demand.clone());
        *self.counts.entry(demand.clone()).or_default() += 1;
    }

    /// The most common demand (ties: the most recent of them).
    pub fn most_common(&self) -> Option<&Demand> {
        let best = self.counts.values().copied().max()?;
        self.window
            .iter()
            .rev()
            .find(|d| self.counts.get(*d) == Some(&best))
    }
}

/// The workload seen so far, as `gpu-share` learns it online: every demand observed counts
/// (it never knows the pods still to come). [`OnlineWorkload::observe`] hands out a new target
/// workload now and then (after 1, 2, 4, ... observations, then every 1,024), so scores that
/// depend on it stay stable between refreshes and can be cached.
#[derive(Debug, Clone, Default)]
pub struct OnlineWorkload {
    index: HashMap<Shape, usize>,
    counts: Vec<(Shape, u64)>,
    total: u64,
}

/// The share of the demands the typical shapes cover (as in the FGD paper).
pub const TYPICAL_COVERAGE: f64 = 0.95;

impl OnlineWorkload {
    /// Counts one demand; returns the refreshed target workload when one is due.
    pub fn observe(&mut self, demand: &Demand) -> Option<TargetWorkload> {
        let shape = Shape::of(demand)?;
        self.total += 1;
        match self.index.get(&shape) {
            Some(i) => self.counts[*i].1 += 1,
            None => {
                self.index.insert(shape.clone(), self.counts.len());
                self.counts.push((shape, 1));
            }
        }
        let t = self.total;
        let due = (t >= 1 && t.is_power_of_two()) || (t > 1024 && t.is_multiple_of(1024));
        due.then(|| self.target())
    }

    /// The target workload from everything observed so far.
    pub fn target(&self) -> TargetWorkload {
        TargetWorkload::from_counts(self.counts.clone(), self.total, TYPICAL_COVERAGE)
    }

    pub fn total(&self) -> u64 {
        self.total
    }
}

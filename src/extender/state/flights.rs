//! Defragmentation's plans under way (`defrag.mode: on`), as the extender's state holds them:
//! each move's target held by a promise ([`crate::ledger::Holder::Promise`]) and the node room is
//! made on fenced for the waiting pod ([`crate::ledger::Ledger::fence`]) from before anything is
//! evicted; filter and bind steer a moved pod's replacement to its promise
//! ([`ExtenderState::steer`]); the controller ends each plan, and whatever it still holds goes
//! with it ([`ExtenderState::end_flight`]).

use std::time::{Duration, Instant};

use super::ExtenderState;
use crate::defrag::flight::{Flight, Leg};
use crate::ledger::{BindPod, Holder, PodRef, promise_key};
use crate::packing::{Reason, Scorer};
use crate::sync::lock;

/// Where a pod is steered: it replaces a pod a plan moved, and its room is held on `node`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Steer {
    pub node: String,
    /// The promise's key in the ledger.
    pub promise: String,
}

impl ExtenderState {
    /// Where `pod` is steered, if it replaces a pod a plan under way moved (known by its
    /// controller and pod template, [`Flight::replaced_by`]).
    /// A plan's waiting pod is never steered (its room is its own plan's).
    pub fn steer(&self, pod: &BindPod) -> Option<Steer> {
        let lineage = pod.lineage.as_ref()?;
        let flights = lock(&self.flights);
        if flights.iter().any(|f| f.waiting.uid == pod.pod.uid) {
            return None;
        }
        flights.iter().find_map(|f| {
            let i = f.replaced_by(lineage, &pod.pod.uid)?;
            Some(Steer {
                node: f.plan.moves[i].to.clone(),
                promise: promise_key(&f.waiting.uid, i),
            })
        })
    }

    /// Begins `flight`: holds each move's target (a promise of the move's demand, placed on the
    /// target by the packing) and fences the node room is made on for the waiting pod until the plan lapses
    /// (`timeout`). Should a target no longer take its move, nothing is held and the reason is
    /// returned with the move's pod.
    pub fn begin_flight(
        &self,
        scorer: &Scorer,
        flight: Flight,
        timeout: Duration,
    ) -> Result<(), (String, Reason)> {
        let plan = &flight.plan;
        let waiting = &flight.waiting;
        let mut held: Vec<String> = Vec::new();
        for (i, m) in plan.moves.iter().enumerate() {
            let key = promise_key(&waiting.uid, i);
            if let Err(why) = self.promise(scorer, &flight, i) {
                for k in held {
                    self.ledger.release(&k);
                }
                return Err((m.key.clone(), why));
            }
            held.push(key);
        }
        self.ledger.fence(
            &plan.node,
            &waiting.uid,
            Instant::now() + timeout,
            flight.words(),
        );
        lock(&self.flights).push(flight);
        Ok(())
    }

    /// The plans under way (copies: the controller acts on them without the lock).
    pub fn flights(&self) -> Vec<Flight> {
        lock(&self.flights).clone()
    }

    /// How many moves of the plans under way have not landed.
    pub fn moves_under_way(&self) -> usize {
        lock(&self.flights)
            .iter()
            .map(Flight::moves_under_way)
            .sum()
    }

    /// Changes the plan under way for waiting pod `uid`, if there is one.
    pub fn with_flight<R>(&self, uid: &str, f: impl FnOnce(&mut Flight) -> R) -> Option<R> {
        lock(&self.flights)
            .iter_mut()
            .find(|fl| fl.waiting.uid == uid)
            .map(f)
    }

    /// Holds move `i`'s promise of `flight` on its target.
    fn promise(&self, scorer: &Scorer, flight: &Flight, i: usize) -> Result<(), Reason> {
        let m = &flight.plan.moves[i];
        let promise = PodRef::new(
            promise_key(&flight.waiting.uid, i),
            flight.waiting.namespace.clone(),
            format!("room for the replacement of {}", m.key),
        )
        .with_priority(i32::MAX)
        .held_by(Holder::Promise);
        self.ledger
            .hold(scorer, &m.to, promise, m.demand.clone())
            .map(drop)
    }

    /// Pod `uid`'s bind took promise `promise` (its bind may still fail).
    pub fn note_redeemed(&self, promise: &str, uid: &str) {
        for f in lock(&self.flights).iter_mut() {
            for i in 0..f.legs.len() {
                if promise_key(&f.waiting.uid, i) == promise {
                    f.redeemed[i] = Some(uid.to_string());
                }
            }
        }
    }

    /// Marks the moves of plans under way whose replacement is held on its target, having taken
    /// its promise, as landed; returns how many it marked. A promise gone with no pod held in
    /// its place (the pod's bind failed after taking it, or its assumption lapsed) is held again,
    /// and offered to the next replacement.
    pub fn note_landings(&self, scorer: &Scorer) -> usize {
        let mut flights = lock(&self.flights);
        let mut landed = 0;
        for f in flights.iter_mut() {
            for i in 0..f.legs.len() {
                if f.legs[i] != Leg::Evicted
                    || self
                        .ledger
                        .node_of(&promise_key(&f.waiting.uid, i))
                        .is_some()
                {
                    continue;
                }
                let to = &f.plan.moves[i].to;
                let held = f.redeemed[i]
                    .as_deref()
                    .and_then(|uid| self.ledger.node_of(uid))
                    .is_some_and(|at| at == *to);
                if held {
                    f.legs[i] = Leg::Landed;
                    landed += 1;
                    continue;
                }
                f.redeemed[i] = None;
                if let Err(why) = self.promise(scorer, f, i) {
                    tracing::info!(waiting = %f.waiting, moved = %f.plan.moves[i].key, node = %to, reason = %why.message(), "a promise taken by a bind that did not last could not be held again; its replacement goes where filter finds room");
                }
            }
        }
        landed
    }

    /// Lifts the fence of waiting pod `uid`'s plan (the pod is placed).
    pub fn lift_fence(&self, uid: &str) {
        let node = lock(&self.flights)
            .iter()
            .find(|f| f.waiting.uid == uid)
            .map(|f| f.plan.node.clone());
        if let Some(node) = node {
            self.ledger.unfence(&node, uid);
        }
    }

    /// Ends waiting pod `uid`'s plan: the promises it still holds are released and its fence
    /// lifted. Returns the plan, if one was under way.
    pub fn end_flight(&self, uid: &str) -> Option<Flight> {
        let flight = {
            let mut flights = lock(&self.flights);
            let i = flights.iter().position(|f| f.waiting.uid == uid)?;
            flights.remove(i)
        };
        for i in 0..flight.legs.len() {
            self.ledger.release(&promise_key(uid, i));
        }
        self.ledger.unfence(&flight.plan.node, uid);
        Some(flight)
    }
}

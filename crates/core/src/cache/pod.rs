//! PURE: what the extender knows of each pod beyond its holding, one [`PodEntry`] per pod:
//! - the pod as filter or prioritize read it, kept for its bind (a [`BindPod`]);
//! - the pods filter found no room for, to nudge when a holding of their class is released;
//! - the assumption of a bind not yet shown by the API, and the doubt of a bind whose outcome is
//!   unknown;
//! - when the watch last changed the pod, whether it waits for a node and whether its limits
//!   contradict its request.
//!
//! Time is passed in (`now`), so the table is tested without a clock.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::ledger::BindPod;

/// The most pods without a node the table tracks (beyond it new ones are not counted), and the
/// most pods it counts as contradicted.
pub const UNSCHEDULED_CAP: usize = 100_000;

/// How long a pod read in filter or prioritize is kept for its bind.
pub const MEMO_TTL: Duration = Duration::from_secs(600);

/// The memory the pods kept for bind may take (by [`BindPod::size`]): about 100,000 ordinary
/// pods. Past it the oldest go, down to three quarters of it; bind then reads the pod from the
/// API.
pub const MEMO_BYTES: u64 = 64 << 20;

/// How long a pod stays marked as finding no room unless filter finds it none again.
pub const NO_ROOM_TTL: Duration = Duration::from_secs(900);

/// A pod filter found no room for on any node it was offered (for capacity, not for its
/// labels or taints): it is nudged back into kube-scheduler's queue when a holding of its class
/// is released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoRoom {
    pub namespace: String,
    pub name: String,
    pub class: &'static str,
}

/// A pod as filter or prioritize read it, kept for its bind.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Memo {
    pod: Arc<BindPod>,
    /// When it was read (it lives [`MEMO_TTL`] from then).
    at: Instant,
    /// What it takes in memory ([`BindPod::size`] and its key).
    bytes: u64,
}

/// What kube-scheduler's PodScheduled message says of a pod no node has the GPU resources for
/// (its NodeResourcesFit plugin: `Insufficient nvidia.com/gpu`, or the quantity gpu-share
/// advertises, `Insufficient gpu-share.io/gpu-milli`).
pub const KUBE_SCHEDULER_SHORT: [&str; 2] = [
    "Insufficient nvidia.com/",
    "Insufficient gpu-share.io/gpu-milli",
];

/// A pod that waits for GPU room ([`Pods::wanting_room`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanting {
    pub uid: String,
    pub namespace: String,
    pub name: String,
}

/// A gpu-share pod without a node yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unscheduled {
    pub namespace: String,
    pub name: String,
    pub class: &'static str,
    /// Since when it waits: the pod's creation (from the API), or the first filter that found
    /// it no node (`--dev`).
    pub since: SystemTime,
    /// Why, as the scheduler last said (the pod's PodScheduled condition), or as gpu-share's
    /// filter found (`--dev`); at most `REASON_MAX` bytes (`extender::pending`).
    pub reason: Option<String>,
}

/// A pod this extender bound (or is binding) that the API has not shown bound yet: its holding
/// in the ledger is the bind's, shielded from a watch event older than it, until it lapses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assumed {
    pub node: String,
    /// When the API accepted the binding; `None` while the bind call is in flight.
    pub bound_at: Option<Instant>,
}

/// What the extender knows of one pod's bind. An entry with nothing in it is dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodEntry {
    /// The pod as filter or prioritize last read it, for its bind.
    memo: Option<Memo>,
    /// Filter found it no room, until when.
    no_room: Option<(NoRoom, Instant)>,
    /// Assumed, and until when.
    assumed: Option<(Assumed, Instant)>,
    /// The node its bind's outcome is unknown on (no answer and no read back), until a read
    /// back resolves it.
    in_doubt: Option<String>,
    /// When the watch (or a relist) last changed it: a reconcile working from an older list
    /// leaves it alone.
    touched: Option<Instant>,
    /// A gpu-share pod waiting for a node.
    unscheduled: Option<Unscheduled>,
    /// Its limits contradict its `gpu-share.io/request` (it is accounted by its limits).
    contradicted: bool,
}

impl PodEntry {
    fn is_empty(&self) -> bool {
        self.memo.is_none()
            && self.no_room.is_none()
            && self.assumed.is_none()
            && self.in_doubt.is_none()
            && self.touched.is_none()
            && self.unscheduled.is_none()
            && !self.contradicted
    }
}

/// Every pod kept for its bind, with no room, with a bind in progress, assumed, in doubt,
/// recently changed, waiting for a node or contradicted, by UID.
#[derive(Debug)]
pub struct Pods {
    by_uid: HashMap<String, PodEntry>,
    /// How long an assumption lives unless the API shows the pod.
    assume_ttl: Duration,
    /// What the kept pods take in memory, in all ([`MEMO_BYTES`] at most).
    memo_bytes: u64,
    /// How many entries have `unscheduled`, how many are `contradicted` and how many have
    /// `no_room` (each capped at [`UNSCHEDULED_CAP`]).
    unscheduled: usize,
    contradicted: usize,
    no_room: usize,
}

impl Pods {
    pub fn new(assume_ttl: Duration) -> Self {
        Pods {
            by_uid: HashMap::new(),
            assume_ttl,
            memo_bytes: 0,
            unscheduled: 0,
            contradicted: 0,
            no_room: 0,
        }
    }

    /// Keeps pod `uid` as filter or prioritize read it at `now`, for its bind. Returns whether
    /// it is new: none was kept (first seen, or its last reading lapsed or went). Past
    /// [`MEMO_BYTES`] the oldest readings go.
    pub fn remember(&mut self, uid: &str, pod: Arc<BindPod>, now: Instant) -> bool {
        let bytes = u64::from(pod.size()).saturating_add(uid.len() as u64 + 64);
        let was = self.entry(uid).memo.replace(Memo {
            pod,
            at: now,
            bytes,
        });
        let new = was.as_ref().is_none_or(|m| m.at + MEMO_TTL <= now);
        self.memo_bytes = self.memo_bytes + bytes - was.map_or(0, |m| m.bytes);
        if self.memo_bytes > MEMO_BYTES {
            self.shed_memos(MEMO_BYTES / 4 * 3);
        }
        new
    }

    /// Pod `uid` as filter or prioritize read it, unless that lapsed before `now`.
    pub fn remembered(&self, uid: &str, now: Instant) -> Option<Arc<BindPod>> {
        let m = self.by_uid.get(uid)?.memo.as_ref()?;
        (m.at + MEMO_TTL > now).then(|| m.pod.clone())
    }

    /// What the pods kept for bind take in memory.
    #[cfg(test)]
    pub fn memo_bytes(&self) -> u64 {
        self.memo_bytes
    }

    /// How many pods are kept for bind.
    #[cfg(test)]
    pub fn memos(&self) -> usize {
        self.by_uid.values().filter(|e| e.memo.is_some()).count()
    }

    fn forget_memo(&mut self, uid: &str) {
        if let Some(m) = self.by_uid.get_mut(uid).and_then(|e| e.memo.take()) {
            self.memo_bytes -= m.bytes;
            self.tidy(uid);
        }
    }

    /// Drops the oldest readings until the rest take at most `bytes`.
    fn shed_memos(&mut self, bytes: u64) {
        let mut kept: Vec<(Instant, String)> = self
            .by_uid
            .iter()
            .filter_map(|(uid, e)| e.memo.as_ref().map(|m| (m.at, uid.clone())))
            .collect();
        kept.sort_unstable();
        for (_, uid) in kept {
            if self.memo_bytes <= bytes {
                break;
            }
            self.forget_memo(&uid);
        }
    }

    /// Marks pod `uid` as finding no room, until [`NO_ROOM_TTL`] from `now`.
    pub fn note_no_room(&mut self, uid: &str, who: NoRoom, now: Instant) {
        let until = now + NO_ROOM_TTL;
        if let Some(was) = self.by_uid.get_mut(uid).and_then(|e| e.no_room.as_mut()) {
            *was = (who, until);
        } else if self.no_room < UNSCHEDULED_CAP {
            self.no_room += 1;
            self.entry(uid).no_room = Some((who, until));
        }
    }

    /// Whether pod `uid` found no room (and that has not lapsed by `now`).
    pub fn has_no_room(&self, uid: &str, now: Instant) -> bool {
        self.by_uid
            .get(uid)
            .and_then(|e| e.no_room.as_ref())
            .is_some_and(|(_, until)| *until > now)
    }

    /// The pods that found no room, by UID, the longest marked first.
    pub fn no_room(&self, now: Instant) -> Vec<(String, NoRoom)> {
        let mut out: Vec<(Instant, &String, &NoRoom)> = self
            .by_uid
            .iter()
            .filter_map(|(uid, e)| {
                let (who, until) = e.no_room.as_ref()?;
                (*until > now).then_some((*until, uid, who))
            })
            .collect();
        out.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        out.into_iter()
            .map(|(_, uid, who)| (uid.clone(), who.clone()))
            .collect()
    }

    /// The pods that wait for GPU room, the longest waiting first: filter found them none, or
    /// kube-scheduler's own resource check found no node with the `nvidia.com/*` resources they
    /// ask (a device plugin's whole GPUs, replicas or MIG devices), as their PodScheduled
    /// condition says ([`KUBE_SCHEDULER_SHORT`]).
    pub fn wanting_room(&self, now: Instant) -> Vec<Wanting> {
        let mut out: Vec<(Option<SystemTime>, Wanting)> = self
            .by_uid
            .iter()
            .filter_map(|(uid, e)| {
                let no_room = e
                    .no_room
                    .as_ref()
                    .filter(|(_, until)| *until > now)
                    .map(|(who, _)| who);
                let short = e.unscheduled.as_ref().filter(|u| {
                    u.reason
                        .as_deref()
                        .is_some_and(|r| KUBE_SCHEDULER_SHORT.iter().any(|s| r.contains(s)))
                });
                let (namespace, name) = match (no_room, short) {
                    (Some(w), _) => (&w.namespace, &w.name),
                    (None, Some(u)) => (&u.namespace, &u.name),
                    (None, None) => return None,
                };
                Some((
                    e.unscheduled.as_ref().map(|u| u.since),
                    Wanting {
                        uid: uid.clone(),
                        namespace: namespace.clone(),
                        name: name.clone(),
                    },
                ))
            })
            .collect();
        // Those whose wait is known first, oldest first; then by UID.
        out.sort_by(|(a, wa), (b, wb)| (a.is_none(), a, &wa.uid).cmp(&(b.is_none(), b, &wb.uid)));
        out.into_iter().map(|(_, w)| w).collect()
    }

    /// Pod `uid` was nudged, bound or given a node: it waits for room no more.
    pub fn clear_no_room(&mut self, uid: &str) {
        if let Some(e) = self.by_uid.get_mut(uid)
            && e.no_room.take().is_some()
        {
            self.no_room -= 1;
            self.tidy(uid);
        }
    }

    /// The API accepted pod `uid`'s binding: it waits for no room and no node, and its bind
    /// needs its reading no more.
    pub fn bound(&mut self, uid: &str) {
        self.clear_no_room(uid);
        self.forget_memo(uid);
        self.clear_unscheduled(uid);
    }

    /// The API deleted pod `uid` (`now`): everything but the change goes.
    pub fn forget(&mut self, uid: &str, now: Instant) {
        self.bound(uid);
        self.note_contradicted(uid, false);
        self.forget_assumption(uid);
        self.touch(uid, now);
    }

    /// Drops the readings and the marks of no room that lapsed before `now`.
    pub fn expire(&mut self, now: Instant) {
        let lapsed: Vec<(String, bool, bool)> = self
            .by_uid
            .iter()
            .filter_map(|(uid, e)| {
                let memo = e.memo.as_ref().is_some_and(|m| m.at + MEMO_TTL <= now);
                let room = e.no_room.as_ref().is_some_and(|(_, until)| *until <= now);
                (memo || room).then(|| (uid.clone(), memo, room))
            })
            .collect();
        for (uid, memo, room) in lapsed {
            if memo {
                self.forget_memo(&uid);
            }
            if room {
                self.clear_no_room(&uid);
            }
        }
    }

    fn entry(&mut self, uid: &str) -> &mut PodEntry {
        if !self.by_uid.contains_key(uid) {
            self.by_uid.insert(uid.to_string(), PodEntry::default());
        }
        self.by_uid.get_mut(uid).expect("inserted above")
    }

    /// Drops `uid`'s entry if nothing is left in it.
    fn tidy(&mut self, uid: &str) {
        if self.by_uid.get(uid).is_some_and(PodEntry::is_empty) {
            self.by_uid.remove(uid);
        }
    }

    /// Assumes pod `uid` on `node` (again): it lives for the assume TTL from `now`.
    pub fn assume(&mut self, uid: &str, assumed: Assumed, now: Instant) {
        let until = now + self.assume_ttl;
        self.entry(uid).assumed = Some((assumed, until));
    }

    /// The assumption of pod `uid`, unless it lapsed before `now`.
    pub fn assumption(&self, uid: &str, now: Instant) -> Option<&Assumed> {
        self.by_uid
            .get(uid)?
            .assumed
            .as_ref()
            .filter(|(_, until)| *until > now)
            .map(|(a, _)| a)
    }

    /// The API showed the pod (or it went): no longer assumed.
    pub fn forget_assumption(&mut self, uid: &str) {
        if let Some(e) = self.by_uid.get_mut(uid) {
            e.assumed = None;
        }
        self.tidy(uid);
    }

    /// Removes the assumptions that lapsed before `now`: the pods and the nodes they were
    /// assumed on, by UID.
    pub fn lapse(&mut self, now: Instant) -> Vec<(String, Assumed)> {
        let mut lapsed = Vec::new();
        for (uid, e) in &mut self.by_uid {
            if e.assumed.as_ref().is_some_and(|(_, until)| *until <= now)
                && let Some((a, _)) = e.assumed.take()
            {
                lapsed.push((uid.clone(), a));
            }
        }
        for (uid, _) in &lapsed {
            self.tidy(uid);
        }
        lapsed.sort_by(|a, b| a.0.cmp(&b.0));
        lapsed
    }

    /// Pod `uid`'s bind to `node` ended without an answer.
    pub fn doubt(&mut self, uid: &str, node: &str) {
        self.entry(uid).in_doubt = Some(node.to_string());
    }

    /// The node pod `uid`'s bind is in doubt on.
    pub fn in_doubt(&self, uid: &str) -> Option<&str> {
        self.by_uid.get(uid)?.in_doubt.as_deref()
    }

    /// Ends pod `uid`'s doubt: the node it was on.
    pub fn take_doubt(&mut self, uid: &str) -> Option<String> {
        let node = self.by_uid.get_mut(uid)?.in_doubt.take();
        self.tidy(uid);
        node
    }

    /// The watch changed pod `uid` at `now`.
    pub fn touch(&mut self, uid: &str, now: Instant) {
        self.entry(uid).touched = Some(now);
    }

    /// Whether the watch changed pod `uid` after `t`.
    pub fn touched_after(&self, uid: &str, t: Instant) -> bool {
        self.by_uid
            .get(uid)
            .and_then(|e| e.touched)
            .is_some_and(|at| at > t)
    }

    /// Forgets the changes made before `t` (only lists begun before `t` need them). Returns how
    /// many pods' changes are still remembered.
    pub fn forget_touches_before(&mut self, t: Instant) -> usize {
        let mut kept = 0;
        self.by_uid.retain(|_, e| {
            if e.touched.is_some_and(|at| at < t) {
                e.touched = None;
            }
            kept += usize::from(e.touched.is_some());
            !e.is_empty()
        });
        if self.by_uid.capacity() > 4 * self.by_uid.len().max(1024) {
            self.by_uid.shrink_to_fit();
        }
        kept
    }

    /// Counts pod `uid` as waiting for a node: keeps the earlier `since` of a pod already
    /// counted, and its last reason when this one gives none.
    pub fn note_unscheduled(&mut self, uid: &str, pending: Unscheduled) {
        if let Some(e) = self.by_uid.get_mut(uid)
            && let Some(was) = e.unscheduled.as_mut()
        {
            let since = was.since.min(pending.since);
            let reason = pending.reason.or_else(|| was.reason.take());
            *was = Unscheduled {
                since,
                reason,
                ..pending
            };
            return;
        }
        if self.unscheduled < UNSCHEDULED_CAP {
            self.unscheduled += 1;
            self.entry(uid).unscheduled = Some(pending);
        }
    }

    /// Pod `uid` has a node, is gone, or no longer waits.
    pub fn clear_unscheduled(&mut self, uid: &str) {
        if let Some(e) = self.by_uid.get_mut(uid)
            && e.unscheduled.take().is_some()
        {
            self.unscheduled -= 1;
            self.tidy(uid);
        }
    }

    /// The pods waiting for a node, in no order.
    pub fn unscheduled(&self) -> impl Iterator<Item = &Unscheduled> {
        self.by_uid.values().filter_map(|e| e.unscheduled.as_ref())
    }

    /// Records whether pod `uid`'s request is contradicted by its limits.
    pub fn note_contradicted(&mut self, uid: &str, contradicted: bool) {
        let was = self.by_uid.get(uid).is_some_and(|e| e.contradicted);
        if was == contradicted || (contradicted && self.contradicted >= UNSCHEDULED_CAP) {
            return;
        }
        if contradicted {
            self.contradicted += 1;
            self.entry(uid).contradicted = true;
        } else if let Some(e) = self.by_uid.get_mut(uid) {
            e.contradicted = false;
            self.contradicted -= 1;
            self.tidy(uid);
        }
    }

    /// How many pods known now have a request their limits contradict.
    pub fn contradicted(&self) -> usize {
        self.contradicted
    }

    /// After a relist begun at `listed_from` that showed the pods `listed`: a pod it did not
    /// show, and the watch has not changed since, no longer waits nor contradicts.
    pub fn retain_listed(&mut self, listed: &HashSet<String>, listed_from: Instant) {
        let gone: Vec<String> = self
            .by_uid
            .iter()
            .filter(|(uid, e)| {
                (e.unscheduled.is_some() || e.contradicted)
                    && !listed.contains(*uid)
                    && e.touched.is_none_or(|at| at <= listed_from)
            })
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in gone {
            self.clear_unscheduled(&uid);
            self.note_contradicted(&uid, false);
        }
    }

    /// How many pods have an entry.
    pub fn len(&self) -> usize {
        self.by_uid.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_uid.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(node: &str, bound_at: Option<Instant>) -> Assumed {
        Assumed {
            node: node.into(),
            bound_at,
        }
    }

    #[test]
    fn an_assumption_lives_its_ttl_from_its_last_assume() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut pods = Pods::new(10 * s);
        pods.assume("a", at("n1", None), t0);
        assert_eq!(pods.assumption("a", t0 + 9 * s), Some(&at("n1", None)));
        // Bound: assumed again, dated, and its lifetime starts over.
        pods.assume("a", at("n1", Some(t0 + 5 * s)), t0 + 5 * s);
        assert!(pods.assumption("a", t0 + 14 * s).is_some());
        assert!(pods.lapse(t0 + 14 * s).is_empty());
        assert_eq!(pods.assumption("a", t0 + 15 * s), None, "lapsed when read");
        assert_eq!(
            pods.lapse(t0 + 15 * s),
            [("a".to_string(), at("n1", Some(t0 + 5 * s)))]
        );
        assert!(pods.is_empty(), "nothing left in the entry");
    }

    #[test]
    fn one_entry_holds_a_pods_assumption_doubt_and_change() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut pods = Pods::new(10 * s);
        pods.assume("a", at("n1", None), t0);
        pods.doubt("a", "n1");
        pods.touch("a", t0 + s);
        assert_eq!(pods.len(), 1);
        assert_eq!(pods.in_doubt("a"), Some("n1"));
        // The assumption lapses; the doubt stays until resolved, the change until forgotten.
        pods.lapse(t0 + 20 * s);
        assert_eq!(pods.in_doubt("a"), Some("n1"));
        assert!(pods.touched_after("a", t0));
        assert!(!pods.touched_after("a", t0 + s));
        assert_eq!(pods.take_doubt("a").as_deref(), Some("n1"));
        assert_eq!(pods.take_doubt("a"), None);
        assert_eq!(pods.forget_touches_before(t0 + 2 * s), 0);
        assert!(pods.is_empty());
    }

    fn waiting(name: &str, at: u64, reason: Option<&str>) -> Unscheduled {
        Unscheduled {
            namespace: "ml".into(),
            name: name.into(),
            class: "mps",
            since: SystemTime::UNIX_EPOCH + Duration::from_secs(at),
            reason: reason.map(str::to_string),
        }
    }

    #[test]
    fn a_waiting_pod_keeps_its_first_wait_and_last_word_until_it_goes() {
        let t0 = Instant::now();
        let mut pods = Pods::new(Duration::from_secs(10));
        pods.note_unscheduled("a", waiting("a", 10, Some("0/3 nodes fit")));
        pods.note_unscheduled("a", waiting("a", 20, None));
        pods.note_contradicted("b", true);
        pods.note_contradicted("b", true);
        pods.note_unscheduled("c", waiting("c", 5, None));
        pods.touch("c", t0 + Duration::from_secs(2));
        assert_eq!(
            pods.unscheduled()
                .find(|u| u.name == "a")
                .map(|u| (u.since, u.reason.clone())),
            Some((
                SystemTime::UNIX_EPOCH + Duration::from_secs(10),
                Some("0/3 nodes fit".into())
            ))
        );
        assert_eq!(pods.contradicted(), 1);
        // A relist begun at t0 + 1 s shows none of them; c changed after it began and stays.
        pods.retain_listed(&HashSet::new(), t0 + Duration::from_secs(1));
        let left: Vec<&str> = pods.unscheduled().map(|u| u.name.as_str()).collect();
        assert_eq!(left, ["c"]);
        assert_eq!(pods.contradicted(), 0);
        pods.clear_unscheduled("c");
        pods.forget_touches_before(t0 + Duration::from_secs(3));
        assert!(pods.is_empty());
    }

    #[test]
    fn a_reconcile_forgets_the_changes_older_than_its_list() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut pods = Pods::new(10 * s);
        for i in 0..10_000 {
            pods.touch(&format!("uid-{i}"), t0);
        }
        pods.touch("uid-late", t0 + 2 * s);
        pods.assume("kept", at("n1", None), t0);
        pods.touch("kept", t0);
        assert!(pods.touched_after("uid-1", t0 - s));
        assert_eq!(pods.forget_touches_before(t0 + s), 1);
        assert!(pods.touched_after("uid-late", t0 + s));
        assert!(!pods.touched_after("uid-1", t0 - s));
        assert_eq!(pods.len(), 2, "the late change and the assumed pod");
    }

    fn kept(uid: &str, reason_bytes: usize) -> Arc<BindPod> {
        Arc::new(BindPod {
            pod: crate::ledger::PodRef::new(uid, "ml", uid),
            key: format!("ml/{uid}"),
            demand: Err(crate::ledger::DemandError::BadRequestAnnotation(
                format!("ml/{uid}"),
                "x".repeat(reason_bytes),
            )),
            lineage: None,
        })
    }

    #[test]
    fn a_reading_is_kept_for_bind_until_it_lapses_binds_or_goes() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut pods = Pods::new(10 * s);
        assert!(pods.remember("a", kept("a", 10), t0), "first seen");
        assert!(!pods.remember("a", kept("a", 10), t0 + s), "seen again");
        assert_eq!(
            pods.remembered("a", t0 + MEMO_TTL).map(|p| p.key.clone()),
            Some("ml/a".to_string()),
            "its lifetime counts from its last reading"
        );
        assert_eq!(pods.remembered("a", t0 + s + MEMO_TTL), None);
        assert!(
            pods.remember("a", kept("a", 10), t0 + s + MEMO_TTL),
            "a lapsed reading is new again"
        );
        pods.expire(t0 + 2 * s + 2 * MEMO_TTL);
        assert!(pods.is_empty(), "expired: nothing left");
        assert_eq!(pods.memo_bytes(), 0);

        pods.remember("b", kept("b", 10), t0);
        pods.note_no_room(
            "b",
            NoRoom {
                namespace: "ml".into(),
                name: "b".into(),
                class: "mps",
            },
            t0,
        );
        pods.bound("b");
        assert_eq!(pods.remembered("b", t0), None, "bound: not kept");
        assert!(!pods.has_no_room("b", t0));
        pods.remember("c", kept("c", 10), t0);
        pods.assume("c", at("n1", None), t0);
        pods.forget("c", t0 + s);
        assert_eq!(pods.remembered("c", t0 + s), None);
        assert_eq!(pods.assumption("c", t0 + s), None);
        assert!(pods.touched_after("c", t0), "a deletion is a change");
        assert_eq!(pods.memo_bytes(), 0);
    }

    /// The pods kept for bind are bounded by bytes, not by count: 128 MiB of pods (each with a
    /// 64 KiB reason) leave at most MEMO_BYTES held, the oldest gone and the newest kept.
    #[test]
    fn the_readings_are_bounded_by_bytes_the_oldest_going_first() {
        let t0 = Instant::now();
        let mut pods = Pods::new(Duration::from_secs(60));
        let reason = 64 << 10;
        for i in 0..2048u64 {
            let uid = format!("u{i}");
            let pod = kept(&uid, reason);
            assert!(pod.size() as usize > reason, "size counts the reason");
            pods.remember(&uid, pod, t0 + Duration::from_millis(i));
            assert!(
                pods.memo_bytes() <= MEMO_BYTES,
                "{} held",
                pods.memo_bytes()
            );
        }
        let held = pods.memo_bytes();
        assert!(
            held > MEMO_BYTES / 2,
            "filled to its budget, not emptied: {held}"
        );
        let n = pods.memos();
        assert!(n < 2048 && n > 512, "{n} kept");
        let now = t0 + Duration::from_secs(3);
        assert!(
            pods.remembered("u2047", now).is_some(),
            "the newest is kept"
        );
        assert!(pods.remembered("u0", now).is_none(), "the oldest went");
        let oldest_kept = (0..2048)
            .find(|i| pods.remembered(&format!("u{i}"), now).is_some())
            .unwrap();
        assert!(
            (oldest_kept..2048).all(|i| pods.remembered(&format!("u{i}"), now).is_some()),
            "every reading newer than the oldest kept is kept"
        );
    }

    fn no_room(name: &str) -> NoRoom {
        NoRoom {
            namespace: "ml".into(),
            name: name.into(),
            class: "timeslice",
        }
    }

    #[test]
    fn a_pod_with_no_room_is_listed_longest_first_until_it_lapses() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut pods = Pods::new(10 * s);
        pods.note_no_room("late", no_room("late"), t0 + 2 * s);
        pods.note_no_room("early", no_room("early"), t0);
        pods.note_no_room("again", no_room("again"), t0 + s);
        let order: Vec<String> = pods
            .no_room(t0 + 3 * s)
            .into_iter()
            .map(|(u, _)| u)
            .collect();
        assert_eq!(order, ["early", "again", "late"]);
        // Found no room again: marked anew, so it lasts longer.
        pods.note_no_room("early", no_room("early"), t0 + 3 * s);
        assert!(!pods.has_no_room("again", t0 + s + NO_ROOM_TTL));
        assert!(pods.has_no_room("early", t0 + s + NO_ROOM_TTL));
        let left: Vec<String> = pods
            .no_room(t0 + 2 * s + NO_ROOM_TTL)
            .into_iter()
            .map(|(u, _)| u)
            .collect();
        assert_eq!(left, ["early"]);
        pods.clear_no_room("early");
        pods.expire(t0 + 3 * s + NO_ROOM_TTL);
        assert!(pods.is_empty(), "the others lapsed");
        assert!(pods.no_room(t0).is_empty());
    }

    /// Pods wanting room: those filter found none for, and those kube-scheduler's resource
    /// check refused for a GPU resource, the longest waiting first; not those waiting for
    /// anything else.
    #[test]
    fn pods_wanting_room_are_the_refused_for_gpus() {
        let t0 = Instant::now();
        let epoch = SystemTime::UNIX_EPOCH;
        let s = Duration::from_secs(1);
        let mut pods = Pods::new(10 * s);
        let waiting = |name: &str, since: u64, reason: &str| Unscheduled {
            namespace: "ml".into(),
            name: name.into(),
            class: "exclusive",
            since: epoch + Duration::from_secs(since),
            reason: Some(reason.into()),
        };
        pods.note_unscheduled(
            "short",
            waiting(
                "short",
                20,
                "0/4 nodes are available: 2 Insufficient nvidia.com/gpu, 2 node(s) had untolerated taint",
            ),
        );
        pods.note_unscheduled(
            "cpu",
            waiting("cpu", 5, "0/4 nodes are available: 4 Insufficient cpu"),
        );
        pods.note_unscheduled(
            "milli",
            waiting(
                "milli",
                30,
                "0/4 nodes are available: 4 Insufficient gpu-share.io/gpu-milli",
            ),
        );
        pods.note_unscheduled("filtered", waiting("filtered", 10, "gpu-share: no room"));
        pods.note_no_room("filtered", no_room("filtered"), t0);
        // Filter found no room for a pod the watch has not shown waiting (`--dev`): last.
        pods.note_no_room("dev", no_room("dev"), t0);
        let order: Vec<String> = pods
            .wanting_room(t0 + s)
            .into_iter()
            .map(|w| format!("{}/{}", w.uid, w.name))
            .collect();
        assert_eq!(
            order,
            ["filtered/filtered", "short/short", "milli/milli", "dev/dev"]
        );
        // The filter's mark lapses; kube-scheduler's word lasts while the pod waits.
        let later: Vec<String> = pods
            .wanting_room(t0 + 2 * NO_ROOM_TTL)
            .into_iter()
            .map(|w| w.uid)
            .collect();
        assert_eq!(later, ["short", "milli"]);
    }
}

//! The latest defragmentation plan for each waiting pod, as the controller posts them (on the
//! replica that leads), for `/v1/nodes`, `gpu-share status` and the page. A leaf: the extender's
//! state holds it, and it reads nothing of the state.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::cache::Wanting;
use crate::sync::lock;

/// The latest plan for each waiting pod (by UID): the node room would be made on, and the plan
/// in words, for `/v1/nodes`, `gpu-share status` and the page.
#[derive(Debug, Default)]
pub struct Board {
    plans: Mutex<BTreeMap<String, (String, String)>>,
}

impl Board {
    /// Posts `uid`'s plan (in place of its last).
    pub fn post(&self, uid: &str, node: &str, words: String) {
        lock(&self.plans).insert(uid.to_string(), (node.to_string(), words));
    }

    /// Takes down `uid`'s plan, if it has one.
    pub fn take_down(&self, uid: &str) {
        lock(&self.plans).remove(uid);
    }

    /// Keeps the plans of the pods `waiting` only.
    pub fn keep_only(&self, waiting: &[Wanting]) {
        lock(&self.plans).retain(|uid, _| waiting.iter().any(|w| w.uid == *uid));
    }

    /// Takes every plan down (defragmentation turned off, or this replica no longer leads).
    pub fn clear(&self) {
        lock(&self.plans).clear();
    }

    /// The plans that would make room on `node`, in words.
    pub fn on(&self, node: &str) -> Vec<String> {
        lock(&self.plans)
            .values()
            .filter(|(n, _)| n == node)
            .map(|(_, w)| w.clone())
            .collect()
    }
}

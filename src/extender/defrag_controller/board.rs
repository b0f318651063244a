//! The latest defragmentation plan for each waiting pod, as the controller posts them (on the
//! replica that leads), for `/v1/nodes`, `gpu-share status` and the page. A leaf: the extender's
//! state holds it, and it reads nothing of the state.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

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

    /// Keeps the plans of the pods still waiting (`waiting`: their UIDs) only.
    pub fn keep_only(&self, waiting: &HashSet<&str>) {
        lock(&self.plans).retain(|uid, _| waiting.contains(uid.as_str()));
    }

    /// Takes every plan down (defragmentation turned off, or this replica no longer leads).
    pub fn clear(&self) {
        lock(&self.plans).clear();
    }

    /// The plans that would make room on `node`, in words.
    pub fn on(&self, node: &str) -> Vec<String> {
        self.by_node().remove(node).unwrap_or_default()
    }

    /// Every plan, in words, by the node it would make room on (read once for `/v1/nodes`).
    pub fn by_node(&self) -> HashMap<String, Vec<String>> {
        let mut out: HashMap<String, Vec<String>> = HashMap::new();
        for (node, words) in lock(&self.plans).values() {
            out.entry(node.clone()).or_default().push(words.clone());
        }
        out
    }
}

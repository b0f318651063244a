//! PURE: which node holds each holding, and how many pods of each spread controller each node
//! holds (kube-scheduler's default topology spread counts them, [`super::Ledger::spread_counts`]).

use std::collections::HashMap;

use super::holder::{Holder, PodRef};

/// Where one holding is.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    node: String,
    holder: Holder,
    controller: Option<String>,
}

/// The ledger's index: by holding key, and by spread controller. Changed through
/// [`Index::insert`] and [`Index::remove`] alone, so the two agree.
#[derive(Debug, Default, Clone)]
pub(super) struct Index {
    by_key: HashMap<String, Entry>,
    /// Controller UID -> node -> how many of its pods the node holds.
    by_controller: HashMap<String, HashMap<String, u32>>,
}

impl Index {
    /// The node holding `uid`, and what holds.
    pub fn get(&self, uid: &str) -> Option<(&str, Holder)> {
        self.by_key.get(uid).map(|e| (e.node.as_str(), e.holder))
    }

    /// Records that `node` holds `pod` (in place of where it was).
    pub fn insert(&mut self, node: &str, pod: &PodRef) {
        self.remove(&pod.uid);
        if let Some(c) = &pod.controller {
            *self
                .by_controller
                .entry(c.clone())
                .or_default()
                .entry(node.to_string())
                .or_default() += 1;
        }
        self.by_key.insert(
            pod.uid.clone(),
            Entry {
                node: node.to_string(),
                holder: pod.holder,
                controller: pod.controller.clone(),
            },
        );
    }

    /// Forgets `uid`: the node that held it, and what held.
    pub fn remove(&mut self, uid: &str) -> Option<(String, Holder)> {
        let e = self.by_key.remove(uid)?;
        if let Some(c) = &e.controller
            && let Some(nodes) = self.by_controller.get_mut(c)
        {
            if let Some(n) = nodes.get_mut(&e.node) {
                *n -= 1;
                if *n == 0 {
                    nodes.remove(&e.node);
                }
            }
            if nodes.is_empty() {
                self.by_controller.remove(c);
            }
        }
        Some((e.node, e.holder))
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Every holding's key, with what holds.
    pub fn keys(&self) -> impl Iterator<Item = (&String, Holder)> {
        self.by_key.iter().map(|(k, e)| (k, e.holder))
    }

    /// How many pods of `controller` each node holds (nodes holding none left out).
    pub fn spread_counts(&self, controller: &str) -> HashMap<String, u32> {
        self.by_controller
            .get(controller)
            .cloned()
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, controller: Option<&str>) -> PodRef {
        PodRef::new(uid, "ml", uid).controlled_by(controller.map(str::to_string))
    }

    #[test]
    fn counts_follow_inserts_moves_and_removes() {
        let mut i = Index::default();
        i.insert("n1", &pod("a", Some("rs")));
        i.insert("n1", &pod("b", Some("rs")));
        i.insert("n2", &pod("c", Some("rs")));
        i.insert("n2", &pod("d", None));
        i.insert("n2", &pod("e", Some("other")));
        let counts = |i: &Index| {
            let mut v: Vec<(String, u32)> = i.spread_counts("rs").into_iter().collect();
            v.sort();
            v
        };
        assert_eq!(counts(&i), [("n1".into(), 2), ("n2".into(), 1)]);
        // Recorded again on another node: moved, not counted twice.
        i.insert("n2", &pod("a", Some("rs")));
        assert_eq!(counts(&i), [("n1".into(), 1), ("n2".into(), 2)]);
        assert_eq!(i.remove("b"), Some(("n1".into(), Holder::Pod)));
        assert_eq!(counts(&i), [("n2".into(), 2)]);
        i.remove("a");
        i.remove("c");
        assert!(i.spread_counts("rs").is_empty());
        assert!(!i.by_controller.contains_key("rs"), "no empty entry left");
        assert_eq!(i.spread_counts("other"), HashMap::from([("n2".into(), 1)]));
        assert_eq!(i.len(), 2);
    }
}

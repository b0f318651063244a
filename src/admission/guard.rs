//! PURE: the rule for pod UPDATEs that touch gpu-share's annotations. A pod's request is fixed
//! at admission: the webhook planned the pod by it and the extender accounts the pod by
//! `gpu-share.io/request`, so changing it later would let a pod run as one request while it is
//! counted as another. The annotations gpu-share writes after admission (`gpu-share.io/gpus` at
//! bind, `gpu-share.io/requeued-at` on requeue) come from gpu-share's own ServiceAccounts only.

use std::collections::{BTreeMap, BTreeSet};

use crate::request::{ANNOTATION, ANNOTATION_REQUEST};

/// The ServiceAccount that writes gpu-share's later annotations in the shipped manifests (the
/// extender, in the scheduler pod).
pub const DEFAULT_WRITER: &str = "system:serviceaccount:gpu-share:gpu-share-scheduler";

/// Whether an annotation key is one of gpu-share's: `gpu-share`, `gpu-share/*`, `gpu-share.io/*`.
pub fn is_gpu_share_key(key: &str) -> bool {
    key == ANNOTATION || key.starts_with("gpu-share/") || key.starts_with("gpu-share.io/")
}

/// The keys fixed at admission for everyone: what the user asked (`gpu-share`, `gpu-share/*`)
/// and what the webhook made of it (`gpu-share.io/request`).
fn fixed_at_admission(key: &str) -> bool {
    key == ANNOTATION || key.starts_with("gpu-share/") || key == ANNOTATION_REQUEST
}

/// How an update treats one annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change<'a> {
    Added(&'a str),
    Changed(&'a str, &'a str),
    Removed(&'a str),
}

impl std::fmt::Display for Change<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Change::Added(v) => write!(f, "adds it as {v:?}"),
            Change::Changed(o, n) => write!(f, "changes it from {o:?} to {n:?}"),
            Change::Removed(o) => write!(f, "removes it (it is {o:?})"),
        }
    }
}

/// An UPDATE that changes gpu-share's annotations as it may not: the keys fixed at admission it
/// changes, and those only gpu-share writes that someone else changes; said in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateRefused {
    /// Each key with the change (`gpu-share (the update changes "a" to "b")`).
    pub fixed: Vec<String>,
    pub not_writer: Vec<String>,
    pub username: String,
    pub writers: Vec<String>,
}

impl std::fmt::Display for UpdateRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut reasons = Vec::new();
        if !self.fixed.is_empty() {
            reasons.push(format!(
                "gpu-share's request annotations are fixed once a pod is admitted: the webhook set the pod up by them and the scheduler accounts it by them, so changing them would let the pod run as one request and be counted as another. This update touches {}. Delete the pod and create it again with the request you want",
                self.fixed.join(", ")
            ));
        }
        if !self.not_writer.is_empty() {
            reasons.push(format!(
                "only gpu-share itself ({}) writes its gpu-share.io/ annotations after admission, and {:?} is not it. This update touches {}",
                if self.writers.is_empty() {
                    "no identity configured".to_string()
                } else {
                    self.writers.join(", ")
                },
                self.username,
                self.not_writer.join(", ")
            ));
        }
        f.write_str(&reasons.join(". "))
    }
}

impl std::error::Error for UpdateRefused {}

/// Decides an UPDATE of a pod from its annotations before and after and the requester's
/// username: `Err` with the reasons in words if it changes what it may not.
pub fn check_update(
    old: &BTreeMap<String, String>,
    new: &BTreeMap<String, String>,
    username: &str,
    writers: &[String],
) -> Result<(), UpdateRefused> {
    let keys: BTreeSet<&str> = old
        .keys()
        .chain(new.keys())
        .map(String::as_str)
        .filter(|k| is_gpu_share_key(k))
        .collect();
    let mut fixed = Vec::new();
    let mut not_writer = Vec::new();
    for key in keys {
        let change = match (old.get(key), new.get(key)) {
            (Some(o), Some(n)) if o == n => continue,
            (Some(o), Some(n)) => Change::Changed(o, n),
            (None, Some(n)) => Change::Added(n),
            (Some(o), None) => Change::Removed(o),
            (None, None) => continue,
        };
        if fixed_at_admission(key) {
            fixed.push(format!("{key} (the update {change})"));
        } else if !writers.iter().any(|w| w == username) {
            not_writer.push(format!("{key} (the update {change})"));
        }
    }
    if fixed.is_empty() && not_writer.is_empty() {
        return Ok(());
    }
    Err(UpdateRefused {
        fixed,
        not_writer,
        username: username.to_string(),
        writers: writers.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const USER: &str = "alice@example.com";

    fn writers() -> Vec<String> {
        vec![DEFAULT_WRITER.to_string()]
    }

    fn admitted() -> BTreeMap<String, String> {
        map(&[
            ("gpu-share", "timeslice-90"),
            ("gpu-share/memory", "20Gi"),
            ("gpu-share.io/request", "timeslice-90"),
            ("team", "ml"),
        ])
    }

    #[test]
    fn request_annotations_are_fixed_for_everyone() {
        let old = admitted();
        for (key, new_value) in [
            ("gpu-share.io/request", Some("timeslice-1")),
            ("gpu-share.io/request", None),
            ("gpu-share", Some("timeslice-1")),
            ("gpu-share", None),
            ("gpu-share/memory", Some("1Gi")),
            ("gpu-share/memory", None),
            ("gpu-share/count", Some("2")),
        ] {
            let mut new = old.clone();
            match new_value {
                Some(v) => new.insert(key.to_string(), v.to_string()),
                None => new.remove(key),
            };
            for user in [USER, DEFAULT_WRITER] {
                let e = check_update(&old, &new, user, &writers())
                    .expect_err(&format!("{user} changing {key} to {new_value:?}"))
                    .to_string();
                assert!(e.contains("fixed once a pod is admitted"), "{e}");
                assert!(e.contains(key), "{e}");
                assert!(e.contains("Delete the pod and create it again"), "{e}");
            }
        }
    }

    #[test]
    fn adding_a_request_to_a_running_pod_is_refused() {
        let old = map(&[("team", "ml")]);
        let new = map(&[("team", "ml"), ("gpu-share.io/request", "timeslice-1")]);
        let e = check_update(&old, &new, USER, &writers())
            .unwrap_err()
            .to_string();
        assert!(e.contains("adds it as \"timeslice-1\""), "{e}");
    }

    #[test]
    fn later_annotations_come_from_gpu_share_only() {
        let old = admitted();
        for key in [
            "gpu-share.io/gpus",
            "gpu-share.io/requeued-at",
            "gpu-share.io/other",
        ] {
            let mut new = old.clone();
            new.insert(key.to_string(), "0:500".to_string());
            assert_eq!(
                check_update(&old, &new, DEFAULT_WRITER, &writers()),
                Ok(()),
                "{key} by gpu-share"
            );
            let e = check_update(&old, &new, USER, &writers())
                .unwrap_err()
                .to_string();
            assert!(e.contains("only gpu-share itself"), "{e}");
            assert!(e.contains(DEFAULT_WRITER) && e.contains(USER), "{e}");
            // Changed and removed by a user, too.
            let mut changed = new.clone();
            changed.insert(key.to_string(), "0:100".to_string());
            assert!(check_update(&new, &changed, USER, &writers()).is_err());
            assert!(check_update(&new, &old, USER, &writers()).is_err());
            assert_eq!(check_update(&new, &old, DEFAULT_WRITER, &writers()), Ok(()));
        }
    }

    #[test]
    fn other_annotations_and_unchanged_ones_pass() {
        let old = admitted();
        let mut new = old.clone();
        new.insert("team".to_string(), "infra".to_string());
        new.insert("note".to_string(), "x".to_string());
        // Keys that only look like gpu-share's are not gpu-share's.
        new.insert("gpu-share-notes".to_string(), "x".to_string());
        new.insert("example.com/gpu-share".to_string(), "x".to_string());
        assert_eq!(check_update(&old, &new, USER, &writers()), Ok(()));
        assert_eq!(check_update(&old, &old, USER, &[]), Ok(()));
    }

    #[test]
    fn both_kinds_of_refusal_are_told_together() {
        let old = admitted();
        let mut new = old.clone();
        new.insert(
            "gpu-share.io/request".to_string(),
            "timeslice-1".to_string(),
        );
        new.insert("gpu-share.io/gpus".to_string(), "0:10".to_string());
        let e = check_update(&old, &new, USER, &writers())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("fixed once") && e.contains("only gpu-share itself"),
            "{e}"
        );
    }
}

//! The template check (PURE): a workload's pod templates go through the pod planner at
//! `kubectl apply`, so that a template the pod webhook would deny is refused when the workload
//! is written, not pod by pod by its controller.
//!
//! A workload kind names the paths of its pod templates ([`WorkloadKind`]): the built-in
//! controllers' ([`builtin_kinds`]) and those the policy adds (`workloads`). Each template found
//! is read as the pod its controller would create (its metadata and spec) and planned with the
//! same policy and namespace facts as a pod; a denial is returned with the template's path. The
//! template is never changed: the pod webhook still writes the pods.

use serde_json::{Value, json};

use super::plan::{Decision, Denial, Facts, Intake};
use crate::mig::MigTable;
use crate::policy::Policy;
use crate::workloads::WorkloadKind;

/// The kind of an admission request among `kinds`, matched by group and kind (any version the
/// API server converts to, as the webhook's `matchPolicy: Equivalent` sends).
pub fn kind_of<'a>(kinds: &'a [WorkloadKind], group: &str, kind: &str) -> Option<&'a WorkloadKind> {
    kinds.iter().find(|k| k.group == group && k.kind == kind)
}

/// Every template found at `path` in `object`, with its concrete path (`*` replaced by the map
/// key or `[index]`), in document order.
pub fn templates_at<'a>(object: &'a Value, path: &str) -> Vec<(String, &'a Value)> {
    let mut found = Vec::new();
    let segments: Vec<&str> = path.split('.').collect();
    walk(object, &segments, String::new(), &mut found);
    found
}

fn walk<'a>(v: &'a Value, rest: &[&str], at: String, out: &mut Vec<(String, &'a Value)>) {
    let Some((first, rest)) = rest.split_first() else {
        if v.is_object() {
            out.push((at, v));
        }
        return;
    };
    let join = |at: &str, key: &str| {
        if at.is_empty() {
            key.to_string()
        } else {
            format!("{at}.{key}")
        }
    };
    match (*first, v) {
        ("*", Value::Object(m)) => {
            for (k, child) in m {
                walk(child, rest, join(&at, k), out);
            }
        }
        ("*", Value::Array(items)) => {
            for (i, child) in items.iter().enumerate() {
                walk(child, rest, format!("{at}[{i}]"), out);
            }
        }
        (key, Value::Object(m)) => {
            if let Some(child) = m.get(key) {
                walk(child, rest, join(&at, key), out);
            }
        }
        _ => {}
    }
}

/// The pod a controller creates from a template: its metadata and spec.
pub fn pod_of(template: &Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": template.get("metadata").cloned().unwrap_or_else(|| json!({})),
        "spec": template.get("spec").cloned().unwrap_or(Value::Null),
    })
}

/// A workload's templates that carry a gpu-share request, read as pods: the ones to plan. On
/// an UPDATE (`old` given), a template equal to the old object's at the same path is left out:
/// what was admitted stays admitted, so a controller's write to a workload whose template it
/// does not change is never refused.
#[derive(Debug, Clone)]
pub struct Templates {
    /// (path, the intake), or (path, the decision already made without the cluster).
    pub read: Vec<(String, Result<Intake, Decision>)>,
}

impl Templates {
    pub fn read(object: &Value, old: Option<&Value>, kind: &WorkloadKind) -> Templates {
        let mut read = Vec::new();
        for path in &kind.templates {
            for (at, template) in templates_at(object, path) {
                let unchanged = old.is_some_and(|old| {
                    templates_at(old, path)
                        .iter()
                        .any(|(p, t)| *p == at && *t == template)
                });
                if unchanged {
                    continue;
                }
                match Intake::read(&pod_of(template)) {
                    Err(Decision::NotRequested) => {}
                    outcome => read.push((at, outcome)),
                }
            }
        }
        Templates { read }
    }

    /// Whether any template asks for gpu-share.
    pub fn is_empty(&self) -> bool {
        self.read.is_empty()
    }

    /// Whether planning these templates needs the namespace's labels (the only cluster fact a
    /// check reads: whether the RuntimeClass exists only changes what the pod webhook writes).
    pub fn need_namespace_labels(&self, policy: &Policy) -> bool {
        self.read
            .iter()
            .any(|(_, r)| r.as_ref().is_ok_and(|i| i.needs(policy).namespace_labels))
    }

    /// The first template the pod webhook would deny, with its path in the message; `None`
    /// when every one would be admitted. The plan's patch and warnings are dropped: the
    /// template is checked, not changed.
    pub fn check(&self, policy: &Policy, mig: &MigTable, facts: &Facts<'_>) -> Option<Denial> {
        for (at, r) in &self.read {
            let decision = match r {
                Ok(intake) => intake.plan(policy, mig, facts),
                Err(decided) => decided.clone(),
            };
            if let Decision::Deny(d) = decision {
                return Some(at_path(at, d));
            }
        }
        None
    }
}

/// A pod denial said of the template at `at`: `gpu-share: spec.template: <why>`.
fn at_path(at: &str, d: Denial) -> Denial {
    let why = d
        .message
        .strip_prefix("gpu-share: ")
        .unwrap_or(&d.message)
        .to_string();
    Denial {
        reason: d.reason,
        message: format!("gpu-share: {at}: {why}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::plan::{DenialReason, RuntimeClassState};
    use crate::workloads::{builtin_kinds, check_template_path as check_path};

    fn facts() -> Facts<'static> {
        Facts {
            namespace: "ml",
            namespace_labels: None,
            runtime_class: RuntimeClassState::Exists,
            request_uid: "0b5e7a4c-2d1f-4e8a-9c3b-5a6d7e8f9012",
            mig_offers: None,
            legacy_runtime_class: RuntimeClassState::Unknown,
        }
    }

    fn template(annotations: Value) -> Value {
        json!({
            "metadata": {"labels": {"app": "x"}, "annotations": annotations},
            "spec": {"containers": [{"name": "main", "image": "x"}]},
        })
    }

    fn deployment(annotations: Value) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
               "spec": {"replicas": 3, "template": template(annotations)}})
    }

    fn check(object: &Value, old: Option<&Value>, kind: &WorkloadKind) -> Option<Denial> {
        let policy = Policy::default_policy();
        Templates::read(object, old, kind).check(&policy, &MigTable::default(), &facts())
    }

    fn builtin(kind: &str) -> WorkloadKind {
        builtin_kinds()
            .into_iter()
            .find(|k| k.kind == kind)
            .unwrap()
    }

    #[test]
    fn a_bad_profile_is_refused_with_the_template_path_and_the_pod_words() {
        let d = check(
            &deployment(json!({"gpu-share": "mig-7g.79gb"})),
            None,
            &builtin("Deployment"),
        )
        .expect("denied");
        assert_eq!(d.reason, DenialReason::UnknownMigProfile);
        assert!(
            d.message.starts_with(
                "gpu-share: spec.template: unknown MIG profile \"7g.79gb\" (did you mean 7g.80gb"
            ),
            "{}",
            d.message
        );
    }

    #[test]
    fn a_good_template_passes_and_one_without_gpu_share_is_not_read() {
        assert_eq!(
            check(
                &deployment(json!({"gpu-share": "mig-1g.10gb"})),
                None,
                &builtin("Deployment")
            ),
            None
        );
        let plain = deployment(json!({"team": "a"}));
        assert!(Templates::read(&plain, None, &builtin("Deployment")).is_empty());
    }

    #[test]
    fn a_cronjob_template_is_under_its_job_template() {
        let cron = json!({"spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {
            "template": template(json!({"gpu-share": "timeslice-250"}))}}}});
        let d = check(&cron, None, &builtin("CronJob")).expect("denied");
        assert!(
            d.message
                .starts_with("gpu-share: spec.jobTemplate.spec.template: "),
            "{}",
            d.message
        );
        assert_eq!(d.reason, DenialReason::Unparsable);
    }

    #[test]
    fn an_update_is_refused_only_when_it_changes_a_template_into_a_bad_one() {
        let good = deployment(json!({"gpu-share": "mps-25"}));
        let bad = deployment(json!({"gpu-share": "mps-250"}));
        let kind = builtin("Deployment");
        assert!(check(&bad, Some(&good), &kind).is_some());
        // The same bad template, unchanged (a controller writing the workload's metadata).
        let mut relabelled = bad.clone();
        relabelled["metadata"]["labels"] = json!({"rev": "2"});
        assert_eq!(check(&relabelled, Some(&bad), &kind), None);
        assert_eq!(check(&good, Some(&bad), &kind), None);
    }

    #[test]
    fn the_namespace_rule_applies_to_templates_as_to_pods() {
        let mut policy = Policy::default_policy();
        policy.namespaces =
            serde_json::from_value(json!([{"names": ["ml"], "allowedClasses": ["mig"]}])).unwrap();
        let t = Templates::read(
            &deployment(json!({"gpu-share": "exclusive-1"})),
            None,
            &builtin("Deployment"),
        );
        let d = t.check(&policy, &MigTable::default(), &facts()).unwrap();
        assert_eq!(d.reason, DenialReason::ClassForbidden);
        assert!(
            d.message.starts_with("gpu-share: spec.template: "),
            "{}",
            d.message
        );
    }

    #[test]
    fn wildcards_walk_maps_and_lists_and_name_each_template() {
        let pytorch = WorkloadKind {
            group: "kubeflow.org".into(),
            version: "v1".into(),
            kind: "PyTorchJob".into(),
            templates: vec!["spec.pytorchReplicaSpecs.*.template".into()],
        };
        let job = json!({"spec": {"pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "template": template(json!({"gpu-share": "exclusive-1"}))},
            "Worker": {"replicas": 4, "template": template(json!({"gpu-share": "mig-9g.1gb"}))},
        }}});
        let d = check(&job, None, &pytorch).expect("denied");
        assert!(
            d.message.starts_with(
                "gpu-share: spec.pytorchReplicaSpecs.Worker.template: unknown MIG profile"
            ),
            "{}",
            d.message
        );
        let ray = json!({"spec": {"workerGroupSpecs": [
            {"template": template(json!({}))},
            {"template": template(json!({"gpu-share": "mps-0"}))},
        ]}});
        let found = templates_at(&ray, "spec.workerGroupSpecs.*.template");
        let paths: Vec<&str> = found.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "spec.workerGroupSpecs[0].template",
                "spec.workerGroupSpecs[1].template"
            ]
        );
    }

    #[test]
    fn malformed_objects_never_panic_and_find_no_template() {
        for v in [
            json!(null),
            json!([]),
            json!({"spec": 3}),
            json!({"spec": {"template": "x"}}),
            json!({"spec": {"template": {"metadata": 7, "spec": []}}}),
        ] {
            let t = Templates::read(&v, Some(&json!(1)), &builtin("Deployment"));
            let _ = t.check(&Policy::default_policy(), &MigTable::default(), &facts());
        }
        // A template whose annotations ask for gpu-share but whose spec is not a pod spec is
        // denied in words, with its path.
        let broken = json!({"spec": {"template": {"metadata": {"annotations": {"gpu-share": "mps-25"}},
                                                  "spec": {"containers": "x"}}}});
        let d = check(&broken, None, &builtin("Deployment")).expect("denied");
        assert!(
            d.message.starts_with("gpu-share: spec.template: "),
            "{}",
            d.message
        );
    }

    #[test]
    fn policy_paths_are_checked() {
        assert!(check_path("spec.template").is_ok());
        assert!(check_path("spec.replicaSpecs.*.template").is_ok());
        assert!(check_path("").is_err());
        assert!(check_path("spec..template").is_err());
        assert!(check_path("spec.workers[0].template").is_err());
        assert!(check_path("spec.replicaSpecs.*").is_err());
    }
}

//! The template check and the template's quantity (PURE): a workload's pod templates go
//! through the pod planner when the workload is written.
//!
//! A workload kind names the paths of its pod templates ([`WorkloadKind`]): the built-in
//! controllers' ([`builtin_kinds`]) and those the policy adds (`workloads`). Each template found
//! is read as the pod its controller would create (its metadata and spec) and planned with the
//! same policy and namespace facts as a pod:
//! - the check ([`Templates::check`], `POST /validate`): a template the pod webhook would deny
//!   is refused at `kubectl apply` with the template's path, not pod by pod by its controller;
//! - the quantity ([`Templates::quantities`], `POST /mutate-templates`, Jobs as shipped): the
//!   `gpu-share.io/gpu-milli` its pods will carry is written into the template, so that what
//!   counts a workload by its template (Kueue) counts it as the quota will. Nothing else of the
//!   template changes: the pod webhook still writes the pods.

use serde_json::{Value, json};

use super::patch::PatchBuilder;
use super::plan::{Decision, Denial, DenialReason, Facts, Intake};
use crate::mig::MigTable;
use crate::policy::Policy;
use crate::request::RESOURCE_GPU_MILLI;
use crate::workloads::WorkloadKind;

/// The kind of an admission request among `kinds`, matched by group and kind (any version the
/// API server converts to, as the webhook's `matchPolicy: Equivalent` sends).
pub fn kind_of<'a>(kinds: &'a [WorkloadKind], group: &str, kind: &str) -> Option<&'a WorkloadKind> {
    kinds.iter().find(|k| k.group == group && k.kind == kind)
}

/// Every template found at `path` in `object`, with its concrete path (`*` replaced by the map
/// key or `[index]`), in document order.
pub fn templates_at<'a>(object: &'a Value, path: &str) -> Vec<(String, &'a Value)> {
    found_at(object, path)
        .into_iter()
        .map(|f| (f.at, f.template))
        .collect()
}

/// A template found: its path as said in messages, its JSON Pointer tokens, the template.
struct Found<'a> {
    at: String,
    tokens: Vec<String>,
    template: &'a Value,
}

fn found_at<'a>(object: &'a Value, path: &str) -> Vec<Found<'a>> {
    let mut found = Vec::new();
    let segments: Vec<&str> = path.split('.').collect();
    walk(object, &segments, String::new(), Vec::new(), &mut found);
    found
}

fn walk<'a>(
    v: &'a Value,
    rest: &[&str],
    at: String,
    tokens: Vec<String>,
    out: &mut Vec<Found<'a>>,
) {
    let Some((first, rest)) = rest.split_first() else {
        if v.is_object() {
            out.push(Found {
                at,
                tokens,
                template: v,
            });
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
    let deeper = |token: String| {
        let mut t = tokens.clone();
        t.push(token);
        t
    };
    match (*first, v) {
        ("*", Value::Object(m)) => {
            for (k, child) in m {
                walk(child, rest, join(&at, k), deeper(k.clone()), out);
            }
        }
        ("*", Value::Array(items)) => {
            for (i, child) in items.iter().enumerate() {
                walk(
                    child,
                    rest,
                    format!("{at}[{i}]"),
                    deeper(i.to_string()),
                    out,
                );
            }
        }
        (key, Value::Object(m)) => {
            if let Some(child) = m.get(key) {
                walk(child, rest, join(&at, key), deeper(key.to_string()), out);
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
    read: Vec<Read>,
}

/// One template that asks for gpu-share.
#[derive(Debug, Clone)]
struct Read {
    /// Its path, as messages say it (`spec.template`).
    at: String,
    /// Its JSON Pointer tokens in the workload.
    tokens: Vec<String>,
    template: Value,
    /// The intake, or the decision already made without the cluster.
    outcome: Result<Intake, Decision>,
}

impl Templates {
    pub fn read(object: &Value, old: Option<&Value>, kind: &WorkloadKind) -> Templates {
        let mut read = Vec::new();
        for path in &kind.templates {
            for f in found_at(object, path) {
                let unchanged = old.is_some_and(|old| {
                    templates_at(old, path)
                        .iter()
                        .any(|(p, t)| *p == f.at && *t == f.template)
                });
                if unchanged {
                    continue;
                }
                match Intake::read(&pod_of(f.template)) {
                    Err(Decision::NotRequested) => {}
                    outcome => read.push(Read {
                        at: f.at,
                        tokens: f.tokens,
                        template: f.template.clone(),
                        outcome,
                    }),
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
        self.read.iter().any(|r| {
            r.outcome
                .as_ref()
                .is_ok_and(|i| i.needs(policy).namespace_labels)
        })
    }

    /// The first template the pod webhook would deny, with its path in the message; `None`
    /// when every one would be admitted. The plan's patch and warnings are dropped: the
    /// template is checked, not changed.
    pub fn check(&self, policy: &Policy, mig: &MigTable, facts: &Facts<'_>) -> Option<Denial> {
        for r in &self.read {
            if let Decision::Deny(d) = r.plan(policy, mig, facts) {
                return Some(at_path(&r.at, d));
            }
        }
        None
    }

    /// The quantity each template's pods will carry (`gpu-share.io/gpu-milli`), written into
    /// the template's containers where the pod webhook will write it into each pod, as a JSON
    /// Patch of the workload: a tool that counts a workload by its template before any pod
    /// exists (Kueue's Job integration) then counts what the namespace's quota will. Nothing
    /// else of the template changes (the pod webhook still writes the pods). A template the pod
    /// webhook would deny is denied here, with its path, as [`Templates::check`] does.
    pub fn quantities(
        &self,
        policy: &Policy,
        mig: &MigTable,
        facts: &Facts<'_>,
    ) -> Result<Quantities, Denial> {
        let mut b = PatchBuilder::default();
        let mut request = None;
        for r in &self.read {
            let m = match r.plan(policy, mig, facts) {
                Decision::Deny(d) => return Err(at_path(&r.at, d)),
                Decision::NotRequested => continue,
                Decision::Mutate(m) => m,
            };
            let mut pod = pod_of(&r.template);
            if let Err(e) = json_patch::patch(&mut pod, &m.patch) {
                return Err(at_path(
                    &r.at,
                    Denial::new(
                        DenialReason::NotAPod,
                        format!(
                            "gpu-share: the pod webhook's own patch does not apply to this template ({e})"
                        ),
                    ),
                ));
            }
            for list in ["containers", "initContainers"] {
                let planned = pod["spec"][list].as_array().into_iter().flatten();
                for (i, c) in planned.enumerate() {
                    let Some(q) = c["resources"]["limits"].get(RESOURCE_GPU_MILLI) else {
                        continue;
                    };
                    let index = i.to_string();
                    let mut at: Vec<&str> = r.tokens.iter().map(String::as_str).collect();
                    at.extend(["spec", list, &index]);
                    add_limit(&mut b, &at, &r.template["spec"][list][i], q);
                }
            }
            request.get_or_insert(m.request);
        }
        Ok(Quantities {
            patch: b.ops,
            request,
        })
    }
}

impl Read {
    fn plan(&self, policy: &Policy, mig: &MigTable, facts: &Facts<'_>) -> Decision {
        match &self.outcome {
            Ok(intake) => intake.plan(policy, mig, facts),
            Err(decided) => decided.clone(),
        }
    }
}

/// What [`Templates::quantities`] writes: the patch, and the first template's request.
#[derive(Debug, Clone, PartialEq)]
pub struct Quantities {
    pub patch: Vec<json_patch::PatchOperation>,
    pub request: Option<crate::request::GpuRequest>,
}

/// Adds `limits[gpu-share.io/gpu-milli] = q` to the container at `at` (`container` as the
/// template has it), creating `resources` and `limits` where it has none; nothing where it
/// already carries the quantity (the pod webhook refuses a value other than its own).
fn add_limit(b: &mut PatchBuilder, at: &[&str], container: &Value, q: &Value) {
    let resources = &container["resources"];
    if resources["limits"].get(RESOURCE_GPU_MILLI).is_some() {
        return;
    }
    let one = || json!({ RESOURCE_GPU_MILLI: q });
    if !resources.is_object() {
        b.add(&[at, &["resources"]].concat(), json!({ "limits": one() }));
    } else if !resources["limits"].is_object() {
        b.add(&[at, &["resources", "limits"]].concat(), one());
    } else {
        b.add(
            &[at, &["resources", "limits", RESOURCE_GPU_MILLI]].concat(),
            q.clone(),
        );
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

    /// A kind the policy adds: Kubeflow's PyTorchJob, its templates under a map of roles.
    fn pytorch_job() -> WorkloadKind {
        WorkloadKind {
            group: "kubeflow.org".into(),
            version: "v1".into(),
            kind: "PyTorchJob".into(),
            templates: vec!["spec.pytorchReplicaSpecs.*.template".into()],
        }
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
        let pytorch = pytorch_job();
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

    /// The workload with the quantity patch applied, and the patch.
    fn with_quantities(object: &Value, kind: &WorkloadKind, policy: &Policy) -> (Value, usize) {
        let q = Templates::read(object, None, kind)
            .quantities(policy, &MigTable::default(), &facts())
            .expect("admitted");
        let mut out = object.clone();
        json_patch::patch(&mut out, &q.patch).expect("the patch applies");
        (out, q.patch.len())
    }

    fn job(template: Value) -> Value {
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
               "spec": {"parallelism": 2, "template": template}})
    }

    #[test]
    fn a_job_template_gets_the_quantity_its_pods_will_carry_and_nothing_else() {
        let policy = Policy::default_policy();
        for (request, milli) in [
            ("timeslice-25", "250"),
            ("mps-50", "500"),
            ("exclusive-2", "2000"),
            ("mig-3g.40gb", "428"),
        ] {
            let object = job(template(json!({"gpu-share": request})));
            let (out, ops) = with_quantities(&object, &builtin("Job"), &policy);
            assert_eq!(ops, 1, "{request}");
            let c = &out["spec"]["template"]["spec"]["containers"][0];
            assert_eq!(
                c["resources"]["limits"][RESOURCE_GPU_MILLI],
                json!(milli),
                "{request}"
            );
            // Nothing else changed: the pod webhook still writes the pods.
            let mut back = out.clone();
            back["spec"]["template"]["spec"]["containers"][0]
                .as_object_mut()
                .unwrap()
                .remove("resources");
            assert_eq!(back, object, "{request}");
            // The pod the Job controller makes from it is admitted, and the pod webhook adds
            // no second quantity.
            let pod = pod_of(&out["spec"]["template"]);
            let Decision::Mutate(m) =
                super::super::plan::plan(&pod, &policy, &MigTable::default(), &facts())
            else {
                panic!("{request}: the pod is not admitted");
            };
            let mut planned = pod.clone();
            json_patch::patch(&mut planned, &m.patch).unwrap();
            assert_eq!(
                planned["spec"]["containers"][0]["resources"]["limits"][RESOURCE_GPU_MILLI],
                json!(milli)
            );
            let again = Templates::read(&out, None, &builtin("Job"))
                .quantities(&policy, &MigTable::default(), &facts())
                .unwrap();
            assert!(
                again.patch.is_empty(),
                "{request}: a second pass writes nothing"
            );
        }
    }

    #[test]
    fn the_quantity_goes_where_the_template_has_resources_or_not_and_to_the_named_container() {
        let policy = Policy::default_policy();
        let mut t = template(json!({"gpu-share": "mps-25", "gpu-share/container": "worker"}));
        t["spec"]["containers"] = json!([
            {"name": "sidecar", "image": "x"},
            {"name": "worker", "image": "x", "resources": {"requests": {"cpu": "1"}}},
        ]);
        let (out, _) = with_quantities(&job(t.clone()), &builtin("Job"), &policy);
        let cs = &out["spec"]["template"]["spec"]["containers"];
        assert_eq!(cs[0].get("resources"), None);
        assert_eq!(cs[1]["resources"]["requests"], json!({"cpu": "1"}));
        assert_eq!(
            cs[1]["resources"]["limits"],
            json!({RESOURCE_GPU_MILLI: "250"})
        );
        t["spec"]["containers"][1]["resources"]["limits"] = json!({"memory": "1Gi"});
        let (out, _) = with_quantities(&job(t), &builtin("Job"), &policy);
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"][1]["resources"]["limits"],
            json!({"memory": "1Gi", RESOURCE_GPU_MILLI: "250"})
        );
    }

    #[test]
    fn every_template_of_a_kind_gets_its_own_quantity_by_its_path() {
        let policy = Policy::default_policy();
        let cron = json!({"spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {
            "template": template(json!({"gpu-share": "exclusive-1"}))}}}});
        let (out, _) = with_quantities(&cron, &builtin("CronJob"), &policy);
        assert_eq!(
            out["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
                [RESOURCE_GPU_MILLI],
            json!("1000")
        );
        let pytorch = pytorch_job();
        let job = json!({"spec": {"pytorchReplicaSpecs": {
            "Master": {"template": template(json!({"gpu-share": "exclusive-1"}))},
            "Worker": {"template": template(json!({"gpu-share": "mps-30"}))},
            "Plain": {"template": template(json!({}))},
        }}});
        let (out, ops) = with_quantities(&job, &pytorch, &policy);
        assert_eq!(ops, 2);
        let milli = |role: &str| {
            out["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]["containers"][0]
                ["resources"]["limits"][RESOURCE_GPU_MILLI]
                .clone()
        };
        assert_eq!(milli("Master"), json!("1000"));
        assert_eq!(milli("Worker"), json!("300"));
        assert_eq!(milli("Plain"), Value::Null);
    }

    #[test]
    fn no_quantity_where_the_pods_get_none_and_a_denial_where_they_would_be_denied() {
        let mut off = Policy::default_policy();
        off.gpu_milli = false;
        let object = job(template(json!({"gpu-share": "mps-25"})));
        let (_, ops) = with_quantities(&object, &builtin("Job"), &off);
        assert_eq!(ops, 0);
        // A scheduler of the template's own: its pods get none either.
        let mut own = template(json!({"gpu-share": "mps-25"}));
        own["spec"]["schedulerName"] = json!("volcano");
        let (_, ops) = with_quantities(&job(own), &builtin("Job"), &Policy::default_policy());
        assert_eq!(ops, 0);
        let d = Templates::read(
            &job(template(json!({"gpu-share": "mig-9g.1gb"}))),
            None,
            &builtin("Job"),
        )
        .quantities(&Policy::default_policy(), &MigTable::default(), &facts())
        .expect_err("denied");
        assert_eq!(d.reason, DenialReason::UnknownMigProfile);
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

//! Workload kinds (PURE): Kubernetes' own controllers and those a policy names, with the paths of
//! their pod templates, which the template check reads (`admission::template`).

use serde::{Deserialize, Serialize};

/// Why the policy's `workloads` cannot be used, in words naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct WorkloadsError(pub String);

/// A workload kind and where its pod templates are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkloadKind {
    /// The API group ("" for the core group).
    #[serde(default)]
    pub group: String,
    pub version: String,
    pub kind: String,
    /// Paths of the pod templates (`PodTemplateSpec`s): field names joined by `.`, where `*`
    /// stands for every value of a map or every element of a list, e.g.
    /// `spec.pytorchReplicaSpecs.*.template`.
    pub templates: Vec<String>,
}

/// The controllers Kubernetes ships, and where each keeps its pod template.
pub fn builtin_kinds() -> Vec<WorkloadKind> {
    let kind = |group: &str, kind: &str, path: &str| WorkloadKind {
        group: group.to_string(),
        version: "v1".to_string(),
        kind: kind.to_string(),
        templates: vec![path.to_string()],
    };
    vec![
        kind("apps", "Deployment", "spec.template"),
        kind("apps", "ReplicaSet", "spec.template"),
        kind("apps", "StatefulSet", "spec.template"),
        kind("apps", "DaemonSet", "spec.template"),
        kind("batch", "Job", "spec.template"),
        kind("batch", "CronJob", "spec.jobTemplate.spec.template"),
    ]
}

/// Every workload kind whose templates the template check reads: Kubernetes' own controllers,
/// then the policy's (`extra`).
pub fn all_kinds(extra: &[WorkloadKind]) -> Vec<WorkloadKind> {
    let mut kinds = builtin_kinds();
    kinds.extend(extra.iter().cloned());
    kinds
}

/// Why a template path in the policy cannot be used.
pub fn check_template_path(path: &str) -> Result<(), WorkloadsError> {
    if path.is_empty() {
        return Err(WorkloadsError("is empty".to_string()));
    }
    for segment in path.split('.') {
        if segment.is_empty() {
            return Err(WorkloadsError(format!("{path:?} has an empty field name")));
        }
        if segment
            .chars()
            .any(|c| c.is_whitespace() || c == '[' || c == ']')
        {
            return Err(WorkloadsError(format!(
                "{path:?}: field {segment:?} may not hold spaces or brackets (write * for every element of a list)"
            )));
        }
    }
    if path.ends_with('*') {
        return Err(WorkloadsError(format!(
            "{path:?} ends in *: name the template field itself, e.g. {path}.template"
        )));
    }
    Ok(())
}

/// Checks the policy's `workloads`: each names a kind and valid template paths, and none is
/// listed twice or is one of Kubernetes' own.
pub fn validate(workloads: &[WorkloadKind]) -> Result<(), WorkloadsError> {
    let builtins = builtin_kinds();
    for (i, w) in workloads.iter().enumerate() {
        if w.kind.is_empty() || w.version.is_empty() {
            return Err(WorkloadsError(format!(
                "workloads[{i}]: give the kind's version and kind, e.g. {{group: kubeflow.org, version: v1, kind: PyTorchJob}}"
            )));
        }
        if w.templates.is_empty() {
            return Err(WorkloadsError(format!(
                "workloads[{i}].templates: name at least one path of a pod template, e.g. spec.template"
            )));
        }
        for (j, path) in w.templates.iter().enumerate() {
            check_template_path(path)
                .map_err(|e| WorkloadsError(format!("workloads[{i}].templates[{j}]: {e}")))?;
        }
        let same = |b: &WorkloadKind| b.group == w.group && b.kind == w.kind;
        if builtins.iter().any(same) {
            return Err(WorkloadsError(format!(
                "workloads[{i}]: {} {:?} is one of Kubernetes' own controllers, which gpu-share reads without being told",
                w.kind, w.group
            )));
        }
        if workloads[..i].iter().any(same) {
            return Err(WorkloadsError(format!(
                "workloads[{i}]: {} {:?} is already listed",
                w.kind, w.group
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(group: &str, kind: &str, templates: &[&str]) -> WorkloadKind {
        WorkloadKind {
            group: group.into(),
            version: "v1".into(),
            kind: kind.into(),
            templates: templates.iter().map(|t| t.to_string()).collect(),
        }
    }

    #[test]
    fn the_policys_kinds_are_checked_in_words() {
        let pytorch = kind(
            "kubeflow.org",
            "PyTorchJob",
            &["spec.pytorchReplicaSpecs.*.template"],
        );
        assert_eq!(validate(std::slice::from_ref(&pytorch)), Ok(()));
        let twice = validate(&[pytorch.clone(), pytorch.clone()]).unwrap_err();
        assert!(twice.0.starts_with("workloads[1]: PyTorchJob"), "{twice}");
        let builtin = validate(&[kind("apps", "Deployment", &["spec.template"])]).unwrap_err();
        assert!(builtin.0.contains("without being told"), "{builtin}");
        let none = validate(&[kind("ray.io", "RayCluster", &[])]).unwrap_err();
        assert!(none.0.starts_with("workloads[0].templates:"), "{none}");
        let bad = validate(&[kind(
            "ray.io",
            "RayCluster",
            &["spec.workerGroupSpecs[0].template"],
        )])
        .unwrap_err();
        assert!(bad.0.starts_with("workloads[0].templates[0]: "), "{bad}");
        let mut unnamed = pytorch;
        unnamed.kind.clear();
        assert!(validate(&[unnamed]).is_err());
    }

    /// The examples `policies/default.yaml` gives in its comments are valid policy.
    #[test]
    fn the_default_policys_examples_load() {
        let text = include_str!("../../../policies/default.yaml");
        let examples: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("# Workload kinds whose pod templates"))
            .filter_map(|l| l.strip_prefix("#   "))
            .collect();
        assert!(examples.len() >= 6, "{examples:?}");
        let yaml = format!(
            "workloads:\n{}",
            examples
                .iter()
                .map(|l| format!("  {l}\n"))
                .collect::<String>()
        );
        let policy =
            crate::policy::Policy::from_yaml(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
        assert_eq!(policy.workloads.len(), 6);
        assert_eq!(
            all_kinds(&policy.workloads).len(),
            builtin_kinds().len() + 6
        );
    }
}

//! PURE: the fields a policy file may set, by path, and which of them a file left out (they take
//! the embedded default's values; `check-policy` and the service's log name them).

/// The fields whose default is to be unset (the embedded default leaves them out too).
pub const UNSET_BY_DEFAULT: &[&str] = &["resources.timeslice", "resources.mps", "mps.runAsUser"];

/// The fields a policy file may set, by path, parents before their children (a test holds it
/// to the fields [`super::Policy`] has).
pub(super) const FIELDS: &[&str] = &[
    "version",
    "resources",
    "resources.shared",
    "resources.timeslice",
    "resources.mps",
    "mig",
    "mig.strategy",
    "mig.models",
    "tolerations",
    "runtimeClassName",
    "schedulerName",
    "nodeAffinity",
    "workloadEnv",
    "gpuMilli",
    "mps",
    "mps.hostIPC",
    "mps.activeThreadPercentage",
    "mps.runAsUser",
    "packing",
    "packing.policy",
    "packing.candidates",
    "perGpu",
    "perGpu.timeslice",
    "perGpu.mps",
    "perGpu.timesliceCdi",
    "perGpu.releaseAfterSeconds",
    "namespaces",
    "nodeModes",
    "enforcement",
    "enforcement.budgets",
    "enforcement.memoryLimitHook",
    "workloads",
    "defrag",
    "defrag.mode",
    "defrag.namespaces",
    "defrag.movesPerGpu",
    "defrag.movesAtOnce",
    "defrag.cooldownSeconds",
    "defrag.planTimeoutSeconds",
];

/// Whether the parsed file `value` holds the field at `path` (`mps.hostIPC`).
pub(super) fn present(value: &serde_json::Value, path: &str) -> bool {
    let mut v = value;
    for key in path.split('.') {
        match v.get(key) {
            Some(next) => v = next,
            None => return false,
        }
    }
    true
}

/// The fields the file `value` leaves out: a section left out whole is named, not its fields.
pub(super) fn left_out(value: &serde_json::Value) -> Vec<&'static str> {
    let mut defaulted: Vec<&'static str> = Vec::new();
    for f in FIELDS {
        let parent_defaulted = defaulted
            .iter()
            .any(|d| f.strip_prefix(d).is_some_and(|rest| rest.starts_with('.')));
        if !parent_defaulted && !present(value, f) {
            defaulted.push(f);
        }
    }
    defaulted
}

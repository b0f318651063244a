use std::collections::BTreeMap;

use super::*;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn hook(on: bool) -> EnforcementReading {
    EnforcementReading {
        memory_limit_hook: on,
        timeslice_cdi: false,
    }
}

fn ts(memory_mib: Option<u64>) -> Share {
    Share::Timeslice { memory_mib }
}

fn mps(memory_mib: Option<u64>) -> Share {
    Share::Mps { memory_mib }
}

fn node(sharing: NodeSharing, e: &Enforcement) -> NodeFacts<'_> {
    NodeFacts {
        enforcement: e,
        sharing,
        all_mig: false,
    }
}

fn rule(driver: Option<&str>, hook: Option<bool>) -> Declared {
    Declared {
        driver_version: driver.map(str::to_string),
        memory_limit_hook: hook,
    }
}

fn gap(h: Hold) -> (Gap, String) {
    match h {
        Hold::NotHeld { gap, why } => (gap, why),
        other => panic!("held: {other:?}"),
    }
}

#[test]
fn the_driver_version_comes_from_gfd_then_the_policy() {
    let r = read(
        &labels(&[
            ("nvidia.com/cuda.driver-version.full", "615.25.01"),
            ("nvidia.com/cuda.driver-version.major", "615"),
        ]),
        &hook(true),
        &[],
    );
    assert_eq!(r.driver.as_deref(), Some("615.25.01"));
    assert_eq!(r.memory_limits, MemoryLimits::Applied);
    // The deprecated label alone, an old driver.
    let r = read(
        &labels(&[("nvidia.com/cuda.driver.major", "550")]),
        &hook(true),
        &[],
    );
    assert_eq!(
        (r.driver.as_deref(), r.memory_limits),
        (Some("550"), MemoryLimits::DriverTooOld)
    );
    // No label: unknown, unless a rule for the node declares it.
    assert_eq!(
        read(&labels(&[]), &hook(true), &[]).memory_limits,
        MemoryLimits::DriverUnknown
    );
    let rules = [
        rule(None, None),
        rule(Some("620.10"), None),
        rule(Some("700"), None),
    ];
    let r = read(&labels(&[("pool", "a100")]), &hook(true), &rules);
    assert_eq!(
        (r.driver.as_deref(), r.memory_limits),
        (Some("620.10"), MemoryLimits::Applied)
    );
    // GFD's label wins over the declaration.
    let r = read(
        &labels(&[
            ("pool", "a100"),
            ("nvidia.com/cuda.driver-version.major", "580"),
        ]),
        &hook(true),
        &rules,
    );
    assert_eq!(r.memory_limits, MemoryLimits::DriverTooOld);
    // A label that is no version is no version.
    let r = read(
        &labels(&[("nvidia.com/cuda.driver-version.major", "latest")]),
        &hook(true),
        &[],
    );
    assert_eq!(r.memory_limits, MemoryLimits::DriverUnknown);
}

#[test]
fn the_hook_is_the_policys_word_cluster_wide_or_per_pool() {
    let new = labels(&[
        ("nvidia.com/cuda.driver-version.major", "615"),
        ("pool", "x"),
    ]);
    assert_eq!(
        read(&new, &hook(false), &[]).memory_limits,
        MemoryLimits::HookNotDeclared
    );
    // The first rule that says wins over the cluster-wide word.
    let off = [
        rule(None, None),
        rule(None, Some(false)),
        rule(None, Some(true)),
    ];
    assert_eq!(
        read(&new, &hook(true), &off).memory_limits,
        MemoryLimits::DeclaredOff
    );
    let on = [rule(None, Some(true)), rule(None, Some(false))];
    assert_eq!(
        read(&new, &hook(false), &on).memory_limits,
        MemoryLimits::Applied
    );
    assert_eq!(
        read(&new, &hook(true), &[]).memory_limits,
        MemoryLimits::Applied
    );
}

#[test]
fn what_holds_a_share_by_class_and_node() {
    let applied = Enforcement {
        driver: Some("615.25.01".into()),
        memory_limits: MemoryLimits::Applied,
        timeslice_cdi: false,
    };
    let old = Enforcement {
        driver: Some("580.95.05".into()),
        memory_limits: MemoryLimits::DriverTooOld,
        timeslice_cdi: false,
    };
    let ts4 = NodeSharing::TimeSlicing;
    let mps4 = NodeSharing::Mps { replicas: 4 };
    // Time-slicing: only the driver's limit, and only for a share with a budget.
    assert_eq!(
        memory_hold(node(ts4, &applied), ts(Some(20480))),
        Hold::Held(Holder::DriverLimit)
    );
    let (g, why) = gap(memory_hold(node(ts4, &applied), ts(None)));
    assert_eq!(g, Gap::NoBudget);
    assert!(why.contains("gpu-share/memory"), "{why}");
    let (g, why) = gap(memory_hold(node(ts4, &old), ts(Some(20480))));
    assert_eq!(g, Gap::NoDriverLimits);
    assert!(why.contains("580.95.05") && why.contains("r615"), "{why}");
    let (_, why) = gap(memory_hold(node(ts4, &Enforcement::default()), ts(Some(1))));
    assert!(why.contains("unknown"), "{why}");
    // MPS: the driver's exact limit where it applies, else the device plugin's equal split.
    assert_eq!(
        memory_hold(node(mps4, &applied), mps(Some(20480))),
        Hold::Held(Holder::DriverLimit)
    );
    assert_eq!(
        memory_hold(node(mps4, &old), mps(Some(20480))),
        Hold::Held(Holder::DevicePluginMps)
    );
    assert_eq!(
        memory_hold(node(mps4, &applied), mps(None)),
        Hold::Held(Holder::DevicePluginMps)
    );
    assert_eq!(
        memory_hold(node(mps4, &old), Share::Units),
        Hold::Held(Holder::DevicePluginMps)
    );
    assert_eq!(
        gap(memory_hold(node(ts4, &applied), Share::Units)).0,
        Gap::NoDriverLimits
    );
    // Per GPU: an MPS share through its GPU's CDI device (the driver's limit where it applies,
    // else gpu-share's daemon and the client's own limits); a time-sliced one under the legacy
    // runtime, which no driver limit reaches.
    let per_gpu = node(NodeSharing::PerGpu, &old);
    assert_eq!(
        memory_hold(per_gpu, mps(Some(1024))),
        Hold::Held(Holder::GpuShareMps)
    );
    assert_eq!(
        memory_hold(per_gpu, mps(None)),
        Hold::Held(Holder::GpuShareMps)
    );
    let per_gpu_new = node(NodeSharing::PerGpu, &applied);
    assert_eq!(
        memory_hold(per_gpu_new, mps(Some(1024))),
        Hold::Held(Holder::DriverLimit)
    );
    let (g, why) = gap(memory_hold(per_gpu_new, ts(Some(1024))));
    assert_eq!(g, Gap::NoDriverLimits);
    assert!(why.contains("legacy runtime"), "{why}");
    assert!(summary(per_gpu_new).contains("time-sliced shares: not through the per-GPU form"));
    // With perGpu.timesliceCdi, a time-sliced share gets its GPU's CDI device, NVIDIA's hooks
    // with it: the driver's limit holds it (on a node whose driver and toolkit apply it).
    let through_cdi = Enforcement {
        timeslice_cdi: true,
        ..applied.clone()
    };
    let per_gpu_cdi = node(NodeSharing::PerGpu, &through_cdi);
    assert_eq!(
        memory_hold(per_gpu_cdi, ts(Some(1024))),
        Hold::Held(Holder::DriverLimit)
    );
    assert_eq!(gap(memory_hold(per_gpu_cdi, ts(None))).0, Gap::NoBudget);
    let old_cdi = Enforcement {
        timeslice_cdi: true,
        ..old.clone()
    };
    assert_eq!(
        gap(memory_hold(
            node(NodeSharing::PerGpu, &old_cdi),
            ts(Some(1024))
        ))
        .0,
        Gap::NoDriverLimits
    );
    assert!(summary(per_gpu_cdi).contains("time-sliced shares through their GPU's CDI device"));
    assert!(
        summary(per_gpu).ends_with("mps: gpu-share's daemon per GPU (each client's own limits)")
    );
    // MIG devices and whole GPUs hold themselves; on an all-MIG node the driver's limits apply
    // to nothing.
    let mig = NodeFacts {
        all_mig: true,
        ..node(NodeSharing::TimeSlicing, &applied)
    };
    assert_eq!(memory_hold(mig, Share::Mig), Hold::Held(Holder::Hardware));
    assert_eq!(gap(memory_hold(mig, ts(Some(1024)))).0, Gap::Mig);
    assert_eq!(
        memory_hold(node(NodeSharing::Unshared, &old), Share::Whole),
        Hold::Held(Holder::WholeGpu)
    );
    assert_eq!(memory_hold(node(ts4, &old), Share::Nothing), Hold::Nothing);
    // The bind annotation says which, or why none.
    assert_eq!(
        Hold::Held(Holder::DriverLimit).annotation().as_deref(),
        Some("driver-limit")
    );
    assert!(
        memory_hold(node(ts4, &old), ts(None))
            .annotation()
            .unwrap()
            .starts_with("none: time-slicing holds no memory")
    );
}

#[test]
fn the_summary_says_what_holds_memory_in_words() {
    let old = Enforcement {
        driver: Some("580.95.05".into()),
        memory_limits: MemoryLimits::DriverTooOld,
        timeslice_cdi: false,
    };
    assert_eq!(
        summary(node(NodeSharing::Mps { replicas: 4 }, &old)),
        "no driver limits (driver 580.95.05 < r615); mps: the device plugin's equal split (1/4)"
    );
    let applied = Enforcement {
        driver: Some("615.25.01".into()),
        memory_limits: MemoryLimits::Applied,
        timeslice_cdi: false,
    };
    assert_eq!(
        summary(node(NodeSharing::TimeSlicing, &applied)),
        "driver limits (driver 615.25.01)"
    );
}

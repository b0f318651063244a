//! Nodes exactly as NVIDIA's own code labels them: `tests/fixtures/nvidia/nodes.yaml` holds
//! nodes whose labels come from GPU Feature Discovery's labelers and whose allocatable comes from
//! the device plugin's resource managers (k8s-device-plugin v0.20.0 over go-nvml's mock GPUs;
//! `tests/fixtures/nvidia/generate.sh`). gpu-share must read every one of them right, and the
//! hand-written fixtures must agree with what that code writes.

mod common;

use std::collections::BTreeMap;

use common::nvidia::{self, EXPECTED, gpu_limits, labels, nodes as nvidia_nodes};
use gpu_share::extender::report::NodeReport;
use gpu_share::inventory::{self, GpuNode, MigLayout, Reading};
use gpu_share::packing::{self, Demand, GpuDemand, Reason, Usage};
use gpu_share::policy::{MigStrategy, Policy};
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;

fn read(path: &str) -> String {
    let path = format!("{}/{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn node(name: &str) -> Node {
    nvidia_nodes()
        .into_iter()
        .find(|n| n.metadata.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no fixture node {name}"))
}

fn allocatable(n: &Node) -> BTreeMap<String, String> {
    n.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .map(|a| a.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect())
        .unwrap_or_default()
}

fn reports(policy: &Policy) -> BTreeMap<String, NodeReport> {
    gpu_share::status::reports_from(policy, &nvidia_nodes(), &[])
        .into_iter()
        .map(|r| (r.name.clone(), r))
        .collect()
}

/// `/v1/nodes` (the same reports `gpu-share status` prints) reads every generated node right:
/// GPUs, the pool's resource, units and replicas, MIG devices per profile, and memory as GFD
/// labels it (a full GPU's, or on a single-strategy node the MIG device's).
#[test]
fn v1_nodes_reads_every_fixture_from_nvidias_code_right() {
    let nodes = nvidia_nodes();
    let reports = reports(&Policy::default_policy());
    assert_eq!(reports.len(), EXPECTED.len(), "{:?}", reports.keys());
    for n in &nodes {
        let name = n.metadata.name.as_deref().unwrap();
        let r = &reports[name];
        nvidia::check_report(r, n).unwrap_or_else(|e| panic!("{e}: {r:?}"));
        // Under the default policy (shared pods ask for nvidia.com/gpu, MIG pods for what the
        // nodes offering their profile advertise) the renamed shared nodes are the ones no pod
        // of their class can use.
        assert_eq!(
            r.unreached.is_some(),
            name.ends_with("-rename"),
            "{name}: {:?}",
            r.unreached
        );
    }
    // Under a policy that says mixed, the single-strategy nodes are unreached too.
    let mut mixed = Policy::default_policy();
    mixed.mig.strategy = MigStrategy::Mixed;
    for r in &gpu_share::status::reports_from(&mixed, &nodes, &[]) {
        let n = node(&r.name);
        assert_eq!(
            r.unreached.is_some(),
            r.name.ends_with("-rename") || nvidia::single(&n),
            "{}: {:?}",
            r.name,
            r.unreached
        );
    }
    let table = gpu_share::status::render(&reports.into_values().collect::<Vec<_>>());
    let gpus: u32 = EXPECTED.iter().map(|e| e.1).sum();
    assert!(
        table.contains(&format!("{} GPU nodes, {gpus} GPUs: ", EXPECTED.len())),
        "{table}"
    );
}

/// Point 1: MIG geometry is the node's model's. An A100 80GB under the single strategy holds
/// seven `1g.10gb` per GPU, not the A100 40GB's four: 56 devices are 8 GPUs, not 14, in
/// `/v1/nodes`, in `gpu-share status` totals and in a simulated NodeList.
#[test]
fn single_strategy_mig_is_counted_on_the_nodes_own_model() {
    let reading = Reading::default();
    for (name, gpus) in [
        ("a100-80gb-mig-single-all-1g.10gb", 8),
        ("a100-80gb-x1-mig-single-all-1g.10gb", 1),
        ("a100-40gb-mig-single-all-1g.5gb", 8),
        ("a100-80gb-mig-single-all-3g.40gb", 8),
        ("h100-80gb-mig-single-all-1g.10gb", 8),
    ] {
        let g = inventory::read_node(&node(name), &reading).unwrap();
        assert_eq!(g.physical_gpus(), gpus, "{name}: {:?}", g.mig);
    }
    // A policy model replaces the built-in one of the same name, and is found first.
    let mut policy = Policy::default_policy();
    let mut a100 = gpu_share::mig::builtin_models()
        .into_iter()
        .find(|m| m.model == "A100-80GB")
        .unwrap();
    for p in &mut a100.profiles {
        if p.name == "1g.10gb" {
            p.max = 4;
        }
    }
    policy.mig.models.push(a100);
    let g = inventory::read_node(
        &node("a100-80gb-mig-single-all-1g.10gb"),
        &Reading::of(&policy),
    )
    .unwrap();
    assert_eq!(g.physical_gpus(), 14, "the policy's model says 4 per GPU");

    let reports = reports(&Policy::default_policy());
    assert_eq!(reports["a100-80gb-mig-single-all-1g.10gb"].gpus, 8);
    let only = gpu_share::status::render(&[reports["a100-80gb-mig-single-all-1g.10gb"].clone()]);
    assert!(only.contains("1 GPU nodes, 8 GPUs: "), "{only}");

    let text = read(nvidia::NODES);
    let simulated = gpu_share_simulator::kube::parse_node_list(&text).unwrap();
    let s = simulated
        .iter()
        .find(|c| c.node.name == "a100-80gb-mig-single-all-1g.10gb")
        .unwrap();
    assert_eq!(s.physical_gpus, 8);
}

fn ts_demand(resource: &str) -> Demand {
    Demand {
        resources: vec![resource.to_string()],
        devices: None,
        enforcement: gpu_share::enforcement::Requirement::Off,
        driver_limit_mib: None,
        ..Demand::gpu(GpuDemand::Timeslice {
            milli: 500,
            memory_mib: None,
        })
    }
}

/// Point 2: a time-sliced (or MPS) node with `renameByDefault: true` is read by the name it
/// advertises, `nvidia.com/gpu.shared`: its GPUs and replicas, never 0. When the pods of its
/// class ask for another name, it is shown as unusable and refused for good (no preemption
/// invited); the policy's per-class names serve a cluster that mixes both kinds.
#[test]
fn renamed_shared_nodes_are_read_by_the_name_they_advertise() {
    let renamed = node("h100-80gb-ts4-rename");
    let plain = node("h100-80gb-ts4");
    let mps = node("h100-80gb-mps4");
    let default = Reading::of(&Policy::default_policy());
    let g = inventory::read_node(&renamed, &default).unwrap();
    assert_eq!(
        (
            g.gpus,
            g.slots,
            g.sharing.replicas(),
            g.pool_resource.as_str()
        ),
        (8, 32, 4, "nvidia.com/gpu.shared")
    );
    let why = g
        .unreached
        .as_ref()
        .expect("timeslice pods ask for nvidia.com/gpu")
        .sentence();
    assert!(
        why.contains("no timeslice pod can use this node")
            && why.contains("they ask for nvidia.com/gpu,")
            && why.contains("advertises nvidia.com/gpu.shared"),
        "{why}"
    );
    // The pod's resource is not there: refused in words, and not something preemption frees.
    let refused = packing::fit(&g, &Usage::empty(&g), &ts_demand("nvidia.com/gpu")).unwrap_err();
    assert_eq!(
        refused,
        Reason::ResourceNotAdvertised {
            resource: "nvidia.com/gpu".into()
        }
    );
    assert!(!refused.resolvable());
    assert_eq!(
        refused.message(),
        "node does not advertise nvidia.com/gpu, the resource the pod's limits name"
    );

    // Per class: the time-sliced nodes renamed, the MPS ones not.
    let mut policy = Policy::default_policy();
    policy.resources.timeslice = Some("nvidia.com/gpu.shared".to_string().try_into().unwrap());
    let per_class = Reading::of(&policy);
    let g = inventory::read_node(&renamed, &per_class).unwrap();
    assert_eq!(g.unreached, None);
    assert!(packing::fit(&g, &Usage::empty(&g), &ts_demand("nvidia.com/gpu.shared")).is_ok());
    let m = inventory::read_node(&mps, &per_class).unwrap();
    assert_eq!(
        (m.unreached, m.pool_resource.as_str(), m.slots),
        (None, "nvidia.com/gpu", 32)
    );
    // A time-sliced node that was not renamed is then the unusable one, with its replicas.
    let p = inventory::read_node(&plain, &per_class).unwrap();
    assert_eq!(
        (p.gpus, p.slots, p.pool_resource.as_str()),
        (8, 32, "nvidia.com/gpu")
    );
    assert!(p.unreached.is_some());

    // The webhook asks each class for its own name.
    let mps_pod =
        policy.resource_for(&gpu_share::request::GpuRequest::parse_normalized("mps-25").unwrap());
    let ts_pod = policy
        .resource_for(&gpu_share::request::GpuRequest::parse_normalized("timeslice-50").unwrap());
    assert_eq!(
        (mps_pod.0.as_str(), ts_pod.0.as_str()),
        ("nvidia.com/gpu", "nvidia.com/gpu.shared")
    );
    assert!(
        policy
            .managed_resources()
            .contains(&"nvidia.com/gpu.shared".to_string())
    );
}

/// Point 3: a node that does not advertise the resource the pod's limits name never fits, with
/// the reason in words: a single-strategy node for `nvidia.com/mig-1g.10gb`, an all-MIG mixed
/// node for `nvidia.com/gpu`.
#[test]
fn nodes_without_the_pods_resource_never_fit() {
    let reading = Reading::default();
    let single = inventory::read_node(&node("a100-80gb-mig-single-all-1g.10gb"), &reading).unwrap();
    let mixed = inventory::read_node(&node("a100-80gb-mig-mixed-all-1g.10gb"), &reading).unwrap();
    let mig = |resource: &str| Demand {
        resources: vec![resource.to_string()],
        devices: None,
        enforcement: gpu_share::enforcement::Requirement::Off,
        driver_limit_mib: None,
        ..Demand::gpu(GpuDemand::Mig {
            profile: "1g.10gb".into(),
            count: 1,
        })
    };
    let u = Usage::default();
    assert!(packing::fit(&mixed, &u, &mig("nvidia.com/mig-1g.10gb")).is_ok());
    assert_eq!(
        packing::fit(&single, &u, &mig("nvidia.com/mig-1g.10gb"))
            .unwrap_err()
            .message(),
        "node does not advertise nvidia.com/mig-1g.10gb, the resource the pod's limits name"
    );
    assert!(packing::fit(&single, &u, &mig("nvidia.com/gpu")).is_ok());
    assert_eq!(
        packing::fit(&mixed, &u, &mig("nvidia.com/gpu")).unwrap_err(),
        Reason::ResourceNotAdvertised {
            resource: "nvidia.com/gpu".into()
        }
    );
    // The mixed node's one full GPU is advertised: an exclusive pod fits it.
    let one_full = inventory::read_node(&node("a100-80gb-mig-mixed-7mig-1full"), &reading).unwrap();
    let whole = Demand {
        resources: vec!["nvidia.com/gpu".into()],
        devices: None,
        enforcement: gpu_share::enforcement::Requirement::Off,
        driver_limit_mib: None,
        ..Demand::gpu(GpuDemand::Whole { count: 1 })
    };
    assert!(packing::fit(&one_full, &Usage::empty(&one_full), &whole).is_ok());
    assert!(packing::fit(&mixed, &Usage::empty(&mixed), &whole).is_err());
}

fn planned_pod(policy: &Policy, annotation: &str) -> Pod {
    planned_with(policy, annotation, None).0
}

/// The pod as the webhook writes it, with its warnings, given the nodes' MIG forms.
fn planned_with(
    policy: &Policy,
    annotation: &str,
    offers: Option<&inventory::MigOffers>,
) -> (Pod, Vec<String>) {
    nvidia::plan_pod(policy, json!({"gpu-share": annotation}), offers)
        .unwrap_or_else(|d| panic!("{d}"))
}

/// The GPU Operator's default MIG strategy is single, gpu-share's was mixed: with both defaults
/// a `mig-1g.10gb` pod asked for nvidia.com/mig-1g.10gb on nodes that advertise nvidia.com/gpu,
/// and waited for ever. Under the default policy (`auto`) a MIG pod asks for what the nodes
/// offering its profile advertise, on a cluster of either strategy and on one of both (the form
/// with more devices of the profile, with a warning that names the others); every such pod then
/// fits a node that offers it.
#[test]
fn mig_pods_ask_for_what_the_nodes_offering_their_profile_advertise() {
    let policy = Policy::default_policy();
    assert_eq!(policy.mig.strategy, MigStrategy::Auto);
    let reading = Reading::of(&policy);
    let read = |names: &[&str]| -> Vec<GpuNode> {
        names
            .iter()
            .map(|n| inventory::read_node(&node(n), &reading).unwrap())
            .collect()
    };
    let fits_some = |pod: &Pod, nodes: &[GpuNode]| {
        let demand = gpu_share::ledger::demand_of_pod(pod).unwrap().unwrap();
        nodes
            .iter()
            .any(|g| packing::fit(g, &Usage::empty(g), &demand).is_ok())
    };
    // A cluster of the GPU Operator's defaults: single-strategy MIG nodes only.
    let single = read(&[
        "a100-80gb-mig-single-all-1g.10gb",
        "h100-80gb-mig-single-all-1g.10gb",
    ]);
    let offers = inventory::MigOffers::of(&single);
    let (pod, warnings) = planned_with(&policy, "mig-1g.10gb", Some(&offers));
    assert_eq!(
        gpu_limits(&pod).get("nvidia.com/gpu").map(String::as_str),
        Some("1")
    );
    assert!(warnings.iter().all(|w| !w.contains("MIG")), "{warnings:?}");
    assert!(
        fits_some(&pod, &single),
        "the pod fits a single-strategy node"
    );
    // A cluster of mixed nodes only: the profile's own resource.
    let mixed = read(&[
        "a100-80gb-mig-mixed-all-1g.10gb",
        "a100-80gb-mig-mixed-3g-4x1g",
    ]);
    let offers = inventory::MigOffers::of(&mixed);
    let (pod, _) = planned_with(&policy, "mig-1g.10gb", Some(&offers));
    assert_eq!(
        gpu_limits(&pod)
            .get("nvidia.com/mig-1g.10gb")
            .map(String::as_str),
        Some("1")
    );
    assert!(fits_some(&pod, &mixed));
    // Both: two single-strategy pools of 1g.10gb (112 devices) beside a mixed node of seven
    // and one of 3g.20gb. 1g.10gb is asked as nvidia.com/gpu, with a warning that counts the
    // seven it cannot reach; 3g.20gb, offered in the mixed form only, as its own resource.
    let both = read(&[
        "a100-80gb-mig-single-all-1g.10gb",
        "h100-80gb-mig-single-all-1g.10gb",
        "a100-80gb-x1-mig-mixed-all-1g.10gb",
        "a100-40gb-mig-mixed-all-3g.20gb",
    ]);
    let offers = inventory::MigOffers::of(&both);
    assert_eq!(
        (
            offers.devices("1g.10gb", MigStrategy::Single),
            offers.devices("1g.10gb", MigStrategy::Mixed)
        ),
        (112, 7)
    );
    let (pod, warnings) = planned_with(&policy, "mig-1g.10gb", Some(&offers));
    assert_eq!(
        gpu_limits(&pod).get("nvidia.com/gpu").map(String::as_str),
        Some("1")
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("112 devices")
                && w.contains("the 7 devices on mixed-strategy nodes")),
        "{warnings:?}"
    );
    assert!(fits_some(&pod, &both));
    let (pod, warnings) = planned_with(&policy, "mig-3g.20gb", Some(&offers));
    assert_eq!(
        gpu_limits(&pod)
            .get("nvidia.com/mig-3g.20gb")
            .map(String::as_str),
        Some("1")
    );
    assert!(
        warnings.iter().all(|w| !w.contains("MIG strategies")),
        "{warnings:?}"
    );
    assert!(fits_some(&pod, &both));
    // Every generated node: for each profile, the form with more devices, and a pod that fits.
    let all: Vec<GpuNode> = nvidia_nodes()
        .iter()
        .filter_map(|n| inventory::read_node(n, &reading))
        .collect();
    let offers = inventory::MigOffers::of(&all);
    for profile in ["1g.5gb", "1g.10gb", "3g.20gb", "3g.40gb"] {
        let single = offers.devices(profile, MigStrategy::Single);
        let mixed = offers.devices(profile, MigStrategy::Mixed);
        let (pod, _) = planned_with(&policy, &format!("mig-{profile}"), Some(&offers));
        let want = if single > mixed {
            "nvidia.com/gpu".to_string()
        } else {
            gpu_share::mig::resource_name(profile)
        };
        assert!(
            gpu_limits(&pod).contains_key(&want),
            "{profile}: {single} single, {mixed} mixed"
        );
        assert!(fits_some(&pod, &all), "{profile}");
    }
    // Nodes unknown (no cluster, or their read failed): the mixed form, said in a warning.
    let (pod, warnings) = planned_with(&policy, "mig-1g.10gb", None);
    assert!(gpu_limits(&pod).contains_key("nvidia.com/mig-1g.10gb"));
    assert!(
        warnings.iter().any(|w| w.contains("could not be read")),
        "{warnings:?}"
    );
    // A policy that names a strategy is followed whatever the nodes say.
    let mut named = policy.clone();
    named.mig.strategy = MigStrategy::Mixed;
    let offers = inventory::MigOffers::of(&single);
    let (pod, warnings) = planned_with(&named, "mig-1g.10gb", Some(&offers));
    assert!(gpu_limits(&pod).contains_key("nvidia.com/mig-1g.10gb"));
    assert!(warnings.is_empty(), "{warnings:?}");
}

/// Point 4: under the single strategy a MIG pod's affinity selects nodes by what GFD writes (the
/// product `<model>-MIG-<profile>`), so a node no MIG manager labelled is reachable; the MIG
/// manager's `nvidia.com/mig.config` still works; other profiles and mixed nodes stay out.
#[test]
fn single_strategy_mig_pods_reach_nodes_gfd_alone_labelled() {
    let mut policy = Policy::default_policy();
    policy.mig.strategy = MigStrategy::Single;
    let pod = planned_pod(&policy, "mig-1g.10gb");
    let spec = pod.spec.as_ref().unwrap();
    let selects = |name: &str| {
        let n = node(name);
        gpu_share::extender::explain::selects(spec, name, &labels(&n))
    };
    for name in [
        "a100-80gb-mig-single-no-mig-config",
        "a100-80gb-mig-single-all-1g.10gb",
        "a100-80gb-x1-mig-single-all-1g.10gb",
        "h100-80gb-mig-single-all-1g.10gb",
    ] {
        assert!(selects(name), "{name} should be selected");
    }
    for name in [
        "a100-80gb-mig-single-all-3g.40gb",
        "a100-40gb-mig-single-all-1g.5gb",
        "a100-80gb-mig-mixed-no-mig-config",
        "h100-80gb-ts4",
        "a100-80gb-plain",
    ] {
        assert!(!selects(name), "{name} should not be selected");
    }
    // The MIG manager's label alone (a node whose product label is missing) still selects.
    let mut by_mig_manager = labels(&node("a100-80gb-mig-single-all-1g.10gb"));
    by_mig_manager.remove("nvidia.com/gpu.product");
    assert!(gpu_share::extender::explain::selects(
        spec,
        "m",
        &by_mig_manager
    ));
    // The limit is nvidia.com/gpu, which the GFD-only node advertises.
    let g = inventory::read_node(
        &node("a100-80gb-mig-single-no-mig-config"),
        &Reading::of(&policy),
    )
    .unwrap();
    let demand = gpu_share::ledger::demand_of_pod(&pod).unwrap().unwrap();
    assert_eq!(demand.resources, vec!["nvidia.com/gpu".to_string()]);
    assert!(packing::fit(&g, &Usage::default(), &demand).is_ok());
}

/// What GFD and the device plugin write, as rules: checked on the generated nodes (so the rules
/// are NVIDIA's) and then on every hand-written node fixture of the project.
fn nvidia_rules(
    name: &str,
    labels: &BTreeMap<String, String>,
    alloc: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut broken = Vec::new();
    let l = |k: &str| labels.get(k).map(String::as_str);
    let has_gfd = l("nvidia.com/gpu.product").is_some() && l("nvidia.com/gpu.count").is_some();
    // The device plugin never registers a resource it has no device for: absent, not "0".
    for (k, v) in alloc {
        if k.starts_with("nvidia.com/") && inventory::quantity_count(v) == Some(0) {
            broken.push(format!(
                "{name}: {k} is 0 (the device plugin registers no empty resource)"
            ));
        }
    }
    if !has_gfd {
        return broken;
    }
    let strategy = l("nvidia.com/mig.strategy");
    let product = l("nvidia.com/gpu.product").unwrap_or_default();
    let any_mig = alloc.keys().any(|k| k.starts_with("nvidia.com/mig-"));
    if strategy == Some("mixed") && any_mig && !alloc.contains_key("nvidia.com/gpu") {
        // Every GPU in MIG mode: GFD labels the full GPUs without sharing.
        if l("nvidia.com/gpu.replicas") != Some("0") {
            broken.push(format!(
                "{name}: an all-MIG mixed node has nvidia.com/gpu.replicas 0"
            ));
        }
    }
    if strategy == Some("single") {
        if !product.contains("-MIG-") {
            broken.push(format!(
                "{name}: a single-strategy product is <model>-MIG-<profile>"
            ));
        }
        if l("nvidia.com/gpu.count") != alloc.get("nvidia.com/gpu").map(String::as_str) {
            broken.push(format!(
                "{name}: gpu.count counts the MIG devices under the single strategy"
            ));
        }
    }
    for (k, v) in labels {
        if let Some(profile) = k
            .strip_prefix("nvidia.com/mig-")
            .and_then(|p| p.strip_suffix(".count"))
            && alloc.get(&format!("nvidia.com/mig-{profile}")) != Some(v)
        {
            broken.push(format!("{name}: {k}={v} disagrees with the allocatable"));
        }
    }
    let sharing = l("nvidia.com/gpu.sharing-strategy");
    if matches!(sharing, Some("time-slicing" | "mps")) {
        let renamed = alloc.contains_key("nvidia.com/gpu.shared");
        if renamed == product.ends_with("-SHARED") {
            broken.push(format!(
                "{name}: a shared product ends in -SHARED exactly when not renamed (renameByDefault)"
            ));
        }
    }
    broken
}

/// Point 5: the hand-written node fixtures agree with NVIDIA's output: rules read off the
/// generated nodes (an all-MIG mixed node has `gpu.replicas: 0` and no `nvidia.com/gpu`, no
/// resource is registered at 0, ...), which every generated node obeys.
#[test]
fn hand_written_node_fixtures_agree_with_nvidias_output() {
    for n in nvidia_nodes() {
        let name = n.metadata.name.clone().unwrap();
        let broken = nvidia_rules(&name, &labels(&n), &allocatable(&n));
        assert!(
            broken.is_empty(),
            "the rules must hold on NVIDIA's own output: {broken:?}"
        );
    }
    let mut checked = 0;
    let mut broken = Vec::new();
    for file in [
        "tests/fixtures/extender/nodes.yaml",
        "tests/fixtures/extender/platform-nodes.yaml",
        "tests/cluster/nodes.yaml",
        "tests/cluster/workload-nodes.yaml",
    ] {
        for n in gpu_share::server::parse_nodes(&read(file)).unwrap() {
            let name = format!("{file}: {}", n.metadata.name.clone().unwrap_or_default());
            broken.extend(nvidia_rules(&name, &labels(&n), &allocatable(&n)));
            checked += 1;
        }
    }
    assert!(checked > 10, "{checked}");
    assert!(broken.is_empty(), "{broken:#?}");
}

/// The generated file is what the generator writes: a NodeList, deterministic (no timestamp
/// label), every node carrying its provenance.
#[test]
fn the_generated_nodes_say_where_they_come_from() {
    let text = read(nvidia::NODES);
    assert!(
        text.starts_with("# Generated by tests/fixtures/nvidia/generate.sh"),
        "{}",
        &text[..80]
    );
    for n in nvidia_nodes() {
        let ann = n.metadata.annotations.clone().unwrap_or_default();
        assert!(ann["gpu-share.io/fixture-source"].contains("k8s-device-plugin v0.20.0"));
        assert!(!labels(&n).contains_key("nvidia.com/gfd.timestamp"));
        let g: Option<GpuNode> = inventory::read_node(&n, &Reading::default());
        let g = g.unwrap();
        assert!(matches!(g.mode_source, inventory::ModeSource::Gfd));
        if let MigLayout::Single { per_gpu, .. } = g.mig {
            assert!(per_gpu >= 2, "{}", g.name);
        }
    }
}

/// Nodes whose mode only the policy's `nodeModes` declares (EKS and AKS node groups without GPU
/// Feature Discovery) are reachable by the pods of that mode: their node affinity takes the
/// rule's labels as an alternative to GFD's. So is a node group scaled to zero, whose template
/// node (what the cluster autoscaler simulates) carries only the group's own labels: without
/// the alternative no pod of the class ever matched it, and the group never scaled up.
#[test]
fn declared_node_groups_are_reachable_even_scaled_to_zero() {
    let policy = Policy::from_yaml(&gpu_share::policy::DEFAULT_POLICY_YAML.replace(
        "nodeModes: []",
        "nodeModes:\n  - selector: {matchLabels: {eks.amazonaws.com/nodegroup: gpu-ts}}\n    sharing: time-slicing\n    replicas: 4\n  - selector:\n      matchExpressions: [{key: agentpool, operator: In, values: [mps1, mps2]}]\n    sharing: mps\n    replicas: 2\n  - selector: {matchLabels: {agentpool: a100mig}}\n    migProfile: 1g.10gb\n",
    ))
    .unwrap();
    let template = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .chain([("kubernetes.io/os".to_string(), "linux".to_string())])
            .collect()
    };
    let selects = |pod: &Pod, labels: &BTreeMap<String, String>| {
        gpu_share::extender::explain::selects(pod.spec.as_ref().unwrap(), "n", labels)
    };
    let ts_group = template(&[("eks.amazonaws.com/nodegroup", "gpu-ts")]);
    let mps_group = template(&[("agentpool", "mps2")]);
    let mig_group = template(&[("agentpool", "a100mig")]);
    let other = template(&[("eks.amazonaws.com/nodegroup", "cpu")]);

    let ts = planned_pod(&policy, "timeslice-25");
    assert!(selects(&ts, &ts_group), "the time-sliced group's template");
    assert!(!selects(&ts, &mps_group) && !selects(&ts, &other));
    // GFD's own label still selects, as before.
    assert!(selects(
        &ts,
        &template(&[("nvidia.com/gpu.sharing-strategy", "time-slicing")])
    ));
    let mps = planned_pod(&policy, "mps-50");
    assert!(selects(&mps, &mps_group) && !selects(&mps, &ts_group));
    // MIG pods of the declared profile (and no other), under the default `mig.strategy: auto`
    // with no node of the pool up: the declared pool says the single strategy's form, so the pod
    // asks for nvidia.com/gpu, reaches the template, and says nothing is a guess.
    assert_eq!(policy.mig.strategy, MigStrategy::Auto);
    let no_nodes = inventory::MigOffers::of_cluster(&[], &Reading::of(&policy));
    let (mig, warnings) = planned_with(&policy, "mig-1g.10gb", Some(&no_nodes));
    assert!(selects(&mig, &mig_group), "{:?}", mig.spec);
    assert_eq!(gpu_limits(&mig)["nvidia.com/gpu"], "1");
    assert!(warnings.is_empty(), "{warnings:?}");
    // A profile nothing declares nor offers: a guess (mixed), said so, with the way to choose.
    let (guessed, warnings) = planned_with(&policy, "mig-3g.40gb", Some(&no_nodes));
    assert_eq!(gpu_limits(&guessed)["nvidia.com/mig-3g.40gb"], "1");
    assert!(!gpu_limits(&guessed).contains_key("nvidia.com/gpu"));
    assert!(
        warnings.len() == 1
            && warnings[0].contains("a guess")
            && warnings[0].contains("gpu-share/mig-strategy"),
        "{warnings:?}"
    );
    // The same policy under the single strategy reaches the pool too.
    let mut single = policy.clone();
    single.mig.strategy = MigStrategy::Single;
    assert!(selects(&planned_pod(&single, "mig-1g.10gb"), &mig_group));
    assert!(!selects(&planned_pod(&single, "mig-3g.40gb"), &mig_group));
    // Whole GPUs match a template no rule declares shared or MIG, and none that one does:
    // those groups' nvidia.com/gpu are replicas or MIG devices (an autoscaler would otherwise
    // grow them for a whole-GPU pod the extender then refuses there).
    let exclusive = planned_pod(&policy, "exclusive");
    assert!(selects(&exclusive, &other));
    for group in [&ts_group, &mps_group, &mig_group] {
        assert!(!selects(&exclusive, group), "{group:?}");
    }
    // Without the rules, the time-sliced group's template matches no timeslice pod.
    let bare = Policy::default_policy();
    assert!(!selects(&planned_pod(&bare, "timeslice-25"), &ts_group));
}

/// What holds a share's memory on each generated node, as GFD labels its driver: the mock's
/// 550.54.15 has no per-container limits (the device plugin's MPS split still holds an MPS
/// share); the same labels with an r615 driver, under a policy that declares the toolkit's hook,
/// have them on every node whose GPUs are not all MIG devices, and a budgeted share is held by
/// them there.
#[test]
fn the_enforcement_each_generated_node_reads_as_follows_its_driver() {
    use gpu_share::enforcement::{Hold, Holder, MemoryLimits};
    let policy = Policy::default_policy();
    let hook = Policy::load("enforcement:\n  memoryLimitHook: true\n", "p.yaml")
        .unwrap()
        .policy;
    let mut labelled = 0;
    for n in nvidia_nodes() {
        let name = n.metadata.name.clone().unwrap();
        let has_driver = labels(&n).contains_key("nvidia.com/cuda.driver-version.major");
        let old = inventory::read_node(&n, &Reading::of(&policy)).unwrap();
        let mut new_node = n.clone();
        for (k, v) in new_node.metadata.labels.as_mut().unwrap().iter_mut() {
            match k.as_str() {
                "nvidia.com/cuda.driver-version.full" => *v = "615.25.01".into(),
                "nvidia.com/cuda.driver-version.major" | "nvidia.com/cuda.driver.major" => {
                    *v = "615".into()
                }
                _ => {}
            }
        }
        let new = inventory::read_node(&new_node, &Reading::of(&hook)).unwrap();
        let budgeted = Demand {
            driver_limit_mib: Some(1024),
            ..Demand::gpu(GpuDemand::Timeslice {
                milli: 250,
                memory_mib: Some(1024),
            })
        };
        if !has_driver {
            assert_eq!(
                old.enforcement.memory_limits,
                MemoryLimits::DriverUnknown,
                "{name}"
            );
            continue;
        }
        labelled += 1;
        assert_eq!(
            old.enforcement.driver.as_deref(),
            Some("550.54.15"),
            "{name}"
        );
        assert_eq!(
            old.enforcement.memory_limits,
            MemoryLimits::DriverTooOld,
            "{name}"
        );
        assert!(
            matches!(packing::memory_hold(&old, &budgeted), Hold::NotHeld { .. }),
            "{name}"
        );
        let mps = Demand {
            driver_limit_mib: Some(1024),
            ..Demand::gpu(GpuDemand::Mps {
                milli: 250,
                memory_mib: Some(1024),
            })
        };
        if matches!(old.sharing, inventory::Sharing::Mps { .. }) {
            assert_eq!(
                packing::memory_hold(&old, &mps),
                Hold::Held(Holder::DevicePluginMps),
                "{name}"
            );
        }
        assert_eq!(
            new.enforcement.memory_limits,
            MemoryLimits::Applied,
            "{name}"
        );
        let all_mig = new.gpus == 0 && new.mig != MigLayout::None;
        assert_eq!(
            packing::memory_hold(&new, &budgeted) == Hold::Held(Holder::DriverLimit),
            !all_mig,
            "{name}: {:?}",
            packing::memory_hold(&new, &budgeted)
        );
        let report = &gpu_share::status::reports_from(&hook, &[new_node], &[])[0];
        assert_eq!(report.driver_memory_limits, !all_mig, "{name}");
        assert!(
            report.enforcement.contains("615"),
            "{name}: {}",
            report.enforcement
        );
    }
    assert!(
        labelled >= 10,
        "only {labelled} fixtures carry GFD's driver labels"
    );
}

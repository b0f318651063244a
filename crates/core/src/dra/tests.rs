//! The DRA room over ResourceSlices that NVIDIA's DRA driver's own code publishes
//! (`tests/fixtures/nvidia-dra/`, generated from the driver's kubelet plugin over a mock NVML).

use std::collections::BTreeMap;

use super::*;
use crate::inventory::{MigLayout, ModeSource, Sharing};
use crate::ledger::{Holder, Ledger, ObservedPod, PodRef};
use crate::packing::{Demand, GpuDemand, PackingPolicy, Reason, Scorer};

/// The driver's slices for one node (`tests/fixtures/nvidia-dra/<name>.yaml`).
fn fixture(name: &str) -> Vec<ResourceSlice> {
    macro_rules! fixtures {
        ($($n:literal),*) => {
            match name {
                $($n => include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/nvidia-dra/", $n, ".yaml")),)*
                other => panic!("no fixture {other}"),
            }
        };
    }
    let text = fixtures!(
        "dra-h100-80gb-whole",
        "dra-h100-80gb-mig",
        "dra-h100-80gb-shares",
        "dra-h100-2gpu-whole",
        "dra-h100-2gpu-mig"
    );
    crate::documents::objects(text)
        .unwrap()
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect()
}

fn view_of(names: &[&str]) -> DraView {
    let mut v = DraView::default();
    for n in names {
        for s in fixture(n) {
            v.apply_slice(s);
        }
    }
    v
}

/// A claim as kube-scheduler writes one for a pod's extended resource (KEP-5004).
fn claim(uid: &str, pod_uid: &str, node: &str, devices: &[&str]) -> ResourceClaim {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("p-{uid}-extended-resources-x"), "namespace": "ml", "uid": uid,
            "annotations": {claim::EXTENDED_RESOURCE_CLAIM: "true"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": pod_uid, "controller": true}]},
        "spec": {"devices": {"requests": [{"name": "container-0-request-0",
            "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": devices.len()}}]}},
        "status": {
            "allocation": {"devices": {"results": devices.iter().map(|d| serde_json::json!(
                {"request": "container-0-request-0", "driver": DRIVER, "pool": node, "device": d})).collect::<Vec<_>>()},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": pod_uid}]
        }
    }))
    .unwrap()
}

#[test]
fn whole_gpus_are_read_with_model_and_memory() {
    let v = view_of(&["dra-h100-80gb-whole"]);
    let g = v.gpu_node("dra-h100-80gb-whole", false).unwrap();
    assert_eq!(g.mode_source, ModeSource::Dra);
    assert_eq!(g.product.as_deref(), Some("NVIDIA-H100-80GB-HBM3"));
    assert_eq!((g.gpus, g.slots, g.physical_gpus()), (8, 8, 8));
    assert_eq!(g.gpu_memory_mib, Some(81920));
    assert_eq!(g.sharing, Sharing::None);
    assert_eq!(g.mig, MigLayout::None);
    assert_eq!(g.advertised, vec!["nvidia.com/gpu".to_string()]);
    assert_eq!(g.kind(), "whole");
    let d = v.node("dra-h100-80gb-whole", false).unwrap();
    let names: Vec<&str> = d.gpus().iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"
        ]
    );
    assert!(
        d.gpus()
            .iter()
            .all(|d| d.uuid.as_deref().is_some_and(|u| u.starts_with("GPU-")))
    );
    // A node no slice names is not a DRA node; neither is one of another driver.
    assert_eq!(v.gpu_node("elsewhere", false), None);
}

#[test]
fn static_mig_devices_are_read_by_profile_and_parent() {
    let v = view_of(&["dra-h100-80gb-mig", "dra-h100-2gpu-mig"]);
    let g = v.gpu_node("dra-h100-2gpu-mig", false).unwrap();
    assert_eq!(g.gpus, 0);
    assert_eq!(
        g.mig,
        MigLayout::Mixed {
            instances: BTreeMap::from([("1g.10gb".into(), 7), ("2g.20gb".into(), 3)])
        }
    );
    assert_eq!(g.physical_gpus(), 2);
    assert_eq!(g.mig_memory_mib.get("1g.10gb"), Some(&10240));
    assert_eq!(
        g.advertised,
        vec![
            "nvidia.com/mig-1g.10gb".to_string(),
            "nvidia.com/mig-2g.20gb".to_string()
        ]
    );
    let d = v.node("dra-h100-2gpu-mig", false).unwrap();
    let parents: std::collections::BTreeSet<_> = d
        .devices
        .values()
        .filter_map(|d| match &d.kind {
            Kind::Mig { parent, .. } => parent.clone(),
            Kind::Gpu { .. } => None,
        })
        .collect();
    assert_eq!(parents.len(), 2);
    let big = v.gpu_node("dra-h100-80gb-mig", false).unwrap();
    assert_eq!(big.physical_gpus(), 8);
    assert!(big.mig_devices() > 8);
}

#[test]
fn consumable_shares_are_read_where_the_driver_publishes_them() {
    let v = view_of(&["dra-h100-80gb-shares", "dra-h100-80gb-whole"]);
    let shared = v.node("dra-h100-80gb-shares", false).unwrap();
    assert!(shared.publishes_shares());
    assert!(shared.devices.values().all(|d| d.shares == Some(4)));
    assert!(
        !v.node("dra-h100-80gb-whole", false)
            .unwrap()
            .publishes_shares()
    );
    // A claim there takes a share, never the GPU: no gpu-share pod is placed there, in words.
    let g = v.gpu_node("dra-h100-80gb-shares", false).unwrap();
    assert_eq!(g.kind(), "consumable shares x4");
    let usage = crate::packing::Usage::empty(&g);
    for gpu in [
        GpuDemand::Whole { count: 1 },
        GpuDemand::Units {
            resource: "nvidia.com/gpu".into(),
            count: 1,
        },
    ] {
        let r = crate::packing::fit(&g, &usage, &Demand::gpu(gpu)).unwrap_err();
        assert_eq!(r, Reason::DraSharedDevices);
        assert!(r.message().contains("ConsumableShares"), "{}", r.message());
    }
    let share = Demand::gpu(GpuDemand::Timeslice {
        milli: 250,
        memory_mib: None,
    });
    assert_eq!(
        crate::packing::fit(&g, &usage, &share),
        Err(Reason::DraNoShares)
    );
}

#[test]
fn the_newest_pool_generation_wins_and_a_deleted_slice_goes() {
    let mut v = view_of(&["dra-h100-2gpu-whole"]);
    let mut newer = fixture("dra-h100-2gpu-whole").remove(0);
    newer.metadata.name = Some("00001-gpu.nvidia.com-dra-h100-2gpu-whole".into());
    newer.spec.pool.generation = 2;
    newer.spec.devices.truncate(1);
    v.apply_slice(newer);
    assert_eq!(v.gpu_node("dra-h100-2gpu-whole", false).unwrap().gpus, 1);
    assert_eq!(
        v.remove_slice("00001-gpu.nvidia.com-dra-h100-2gpu-whole")
            .as_deref(),
        Some("dra-h100-2gpu-whole")
    );
    assert_eq!(v.gpu_node("dra-h100-2gpu-whole", false).unwrap().gpus, 2);
}

/// The ledger counts what the claims give: the GPUs DRA chose, and MIG devices per profile; the
/// pods the claims stand for hold nothing of their own, whatever order the events come in.
#[test]
fn the_ledger_equals_the_claims() {
    let node = "dra-h100-2gpu-whole";
    let mut v = view_of(&[node]);
    let ledger = Ledger::new();
    ledger.upsert_node(v.gpu_node(node, false).unwrap());
    // The pod is seen bound before its claim: it holds by its demand meanwhile.
    let pod = ObservedPod {
        pod: PodRef::new("pod-a", "ml", "p"),
        node: node.into(),
        demand: Demand::gpu(GpuDemand::Units {
            resource: "nvidia.com/gpu".into(),
            count: 1,
        }),
        gpus: None,
    };
    ledger.record(&pod);
    assert_eq!(ledger.with_node(node, |nl| nl.usage.free_gpus()), Some(1));
    let c = claim("c-1", "pod-a", node, &["gpu-1"]);
    v.apply_claim("c-1", Claim::read(&c));
    ledger.sync_claims(node, &v.holdings(node), &v.covered_on(node));
    let held = ledger.snapshot().remove(node).unwrap();
    assert_eq!(held.holdings.len(), 1, "{:?}", held.holdings.keys());
    let h = held.holdings.values().next().unwrap();
    assert_eq!(h.pod.holder, Holder::Claim);
    assert_eq!(h.placement.gpus, vec![(1, 1000)], "the GPU DRA chose");
    assert_eq!(held.usage.free_gpus(), 1);
    // The pod's watch event again: still nothing of its own.
    ledger.record(&pod);
    assert_eq!(ledger.with_node(node, |nl| nl.holdings.len()), Some(1));
    assert_eq!(ledger.uids(), Vec::<String>::new(), "no pod of its own");
    // The claim goes (its pod finished): the GPU is free.
    v.apply_claim("c-1", None);
    ledger.sync_claims(node, &v.holdings(node), &v.covered_on(node));
    assert_eq!(ledger.with_node(node, |nl| nl.usage.free_gpus()), Some(2));
    assert!(!ledger.claimed("pod-a"));
}

#[test]
fn a_claims_mig_devices_count_per_profile_and_a_full_node_refuses_in_words() {
    let node = "dra-h100-2gpu-mig";
    let mut v = view_of(&[node]);
    let d = v.node(node, false).unwrap();
    let ones: Vec<&str> = d
        .devices
        .values()
        .filter(|d| matches!(&d.kind, Kind::Mig { profile, .. } if profile == "1g.10gb"))
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(ones.len(), 7);
    let ledger = Ledger::new();
    ledger.upsert_node(v.gpu_node(node, false).unwrap());
    for (i, dev) in ones.iter().enumerate() {
        let uid = format!("c-{i}");
        v.apply_claim(
            &uid,
            Claim::read(&claim(&uid, &format!("pod-{i}"), node, &[dev])),
        );
    }
    ledger.sync_claims(node, &v.holdings(node), &v.covered_on(node));
    let nl = ledger.snapshot().remove(node).unwrap();
    assert_eq!(nl.usage.mig.get("1g.10gb"), Some(&7));
    let demand = Demand {
        resources: vec!["nvidia.com/mig-1g.10gb".into()],
        ..Demand::gpu(GpuDemand::Mig {
            profile: "1g.10gb".into(),
            count: 1,
        })
    };
    assert_eq!(
        crate::packing::fit(&nl.node, &nl.usage, &demand),
        Err(Reason::MigProfileFull)
    );
    let other = Demand {
        resources: vec!["nvidia.com/mig-2g.20gb".into()],
        ..Demand::gpu(GpuDemand::Mig {
            profile: "2g.20gb".into(),
            count: 1,
        })
    };
    assert!(crate::packing::fit(&nl.node, &nl.usage, &other).is_ok());
}

#[test]
fn exclusive_pods_fit_free_gpus_and_a_full_node_says_so() {
    let node = "dra-h100-2gpu-whole";
    let mut v = view_of(&[node]);
    let ledger = Ledger::new();
    ledger.upsert_node(v.gpu_node(node, false).unwrap());
    let scorer = Scorer::new(PackingPolicy::Binpack);
    let one = Demand {
        resources: vec!["nvidia.com/gpu".into()],
        ..Demand::gpu(GpuDemand::Whole { count: 1 })
    };
    for (i, dev) in ["gpu-0", "gpu-1"].iter().enumerate() {
        let nl = ledger.snapshot().remove(node).unwrap();
        assert!(crate::packing::fit(&nl.node, &nl.usage, &one).is_ok());
        let uid = format!("c-{i}");
        v.apply_claim(
            &uid,
            Claim::read(&claim(&uid, &format!("pod-{i}"), node, &[dev])),
        );
        ledger.sync_claims(node, &v.holdings(node), &v.covered_on(node));
    }
    let nl = ledger.snapshot().remove(node).unwrap();
    let refused = crate::packing::fit(&nl.node, &nl.usage, &one).unwrap_err();
    assert_eq!(refused, Reason::NoFreeGpus);
    assert_eq!(refused.message(), "not enough free whole GPUs");
    // Bind of a pod its claim already stands for holds nothing more.
    let placed = ledger.hold(&scorer, node, PodRef::new("pod-0", "ml", "p"), one);
    assert_eq!(placed, Ok(crate::packing::Placement::default()));
}

#[test]
fn shares_and_the_single_mig_form_are_refused_on_dra_nodes_in_words() {
    let v = view_of(&["dra-h100-80gb-whole", "dra-h100-2gpu-mig"]);
    let g = v.gpu_node("dra-h100-80gb-whole", false).unwrap();
    let usage = crate::packing::Usage::empty(&g);
    for gpu in [
        GpuDemand::Timeslice {
            milli: 250,
            memory_mib: None,
        },
        GpuDemand::Mps {
            milli: 250,
            memory_mib: None,
        },
    ] {
        let mps = matches!(gpu, GpuDemand::Mps { .. });
        let r = crate::packing::fit(&g, &usage, &Demand::gpu(gpu)).unwrap_err();
        assert_eq!(
            r,
            if mps {
                Reason::DraMps
            } else {
                Reason::DraNoShares
            }
        );
        assert!(r.message().contains("DRA driver"), "{}", r.message());
    }
    let mig = v.gpu_node("dra-h100-2gpu-mig", false).unwrap();
    let single = Demand {
        resources: vec!["nvidia.com/gpu".into()],
        ..Demand::gpu(GpuDemand::Mig {
            profile: "1g.10gb".into(),
            count: 1,
        })
    };
    // There nvidia.com/gpu is the driver's whole GPU class: a MIG pod must ask by profile.
    let r = crate::packing::fit(&mig, &crate::packing::Usage::empty(&mig), &single).unwrap_err();
    assert_eq!(r, Reason::DraMigForm);
    assert!(
        r.message().contains("nvidia.com/mig-<profile>"),
        "{}",
        r.message()
    );
}

#[test]
fn claims_of_other_drivers_and_pending_claims_hold_nothing() {
    let mut c = claim("c", "p", "n", &["gpu-0"]);
    assert!(Claim::read(&c).is_some_and(|c| c.extended && c.pods == ["p"]));
    c.status.allocation.as_mut().unwrap().devices.results[0].driver = "other.example.com".into();
    assert_eq!(Claim::read(&c), None);
    c.status.allocation = None;
    assert_eq!(Claim::read(&c), None);
}

#[test]
fn gpu_share_ships_a_device_class_per_mig_profile() {
    let (name, cel, resource) = mig_device_class("1g.10gb+me");
    assert_eq!(name, "mig-1g.10gb.me.gpu-share.io");
    assert_eq!(resource, "nvidia.com/mig-1g.10gb.me");
    assert!(cel.contains("profile == '1g.10gb+me'"), "{cel}");
}

/// The opt-in: a `nodeModes` rule that declares a ConsumableShares node `time-slicing` lets
/// time-sliced shares take the driver's shares there: up to one share (a quarter of a GPU at
/// `--consumable-shares=4`) each, as many as the GPUs have shares, counted by the claims' own
/// consumed shares once they are allocated; larger shares, MPS shares and shares whose memory
/// the policy requires held are refused in words.
#[test]
fn declared_consumable_shares_take_time_sliced_shares() {
    let node = "dra-h100-80gb-shares";
    let mut v = view_of(&[node, "dra-h100-80gb-whole"]);
    // Undeclared, the node's shares are not gpu-share's; declaring a node without consumable
    // shares changes nothing.
    assert!(!v.gpu_node(node, false).unwrap().shares_declared);
    assert!(
        !v.gpu_node("dra-h100-80gb-whole", true)
            .unwrap()
            .shares_declared
    );
    let g = v.gpu_node(node, true).unwrap();
    assert!(g.shares_declared);
    assert_eq!(g.kind(), "consumable shares x4, time-sliced shares");
    assert_eq!(g.enforcement.driver.as_deref(), Some("550.54.15"));
    let share = |milli: u32| {
        Demand::gpu(GpuDemand::Timeslice {
            milli,
            memory_mib: None,
        })
    };
    let usage = crate::packing::Usage::empty(&g);
    assert_eq!(crate::packing::fit(&g, &usage, &share(250)), Ok(()));
    assert_eq!(crate::packing::fit(&g, &usage, &share(100)), Ok(()));
    let big = crate::packing::fit(&g, &usage, &share(500)).unwrap_err();
    assert_eq!(big, Reason::DraShareTooSmall);
    assert!(big.message().contains("equal shares"), "{}", big.message());
    let memory = Demand::gpu(GpuDemand::Timeslice {
        milli: 250,
        memory_mib: Some(30 * 1024),
    });
    assert_eq!(
        crate::packing::fit(&g, &usage, &memory),
        Err(Reason::ReplicaMemoryTooSmall)
    );
    let mps = Demand::gpu(GpuDemand::Mps {
        milli: 250,
        memory_mib: None,
    });
    assert_eq!(crate::packing::fit(&g, &usage, &mps), Err(Reason::DraMps));
    // Nothing there holds a share's memory: a policy that requires it refuses the node.
    let required = Demand {
        enforcement: crate::enforcement::Requirement::Required,
        ..share(250)
    };
    let r = crate::packing::fit(&g, &usage, &required).unwrap_err();
    assert!(
        matches!(r, Reason::MemoryNotHeld(_)) && r.message().contains("budget enforcement"),
        "{r:?}"
    );

    // 32 claims (8 GPUs x 4 shares), one share each, fill the node; the ledger holds each where
    // DRA put it, and the next share waits in words.
    let ledger = Ledger::default();
    ledger.upsert_node(g.clone());
    let gpus: Vec<String> = v
        .node(node, true)
        .unwrap()
        .gpus()
        .iter()
        .map(|d| d.name.clone())
        .collect();
    let mut n = 0;
    for gpu in &gpus {
        for _ in 0..4 {
            let mut c = claim(&format!("c{n}"), &format!("pod-{n}"), node, &[gpu]);
            c.status.allocation.as_mut().unwrap().devices.results[0]
                .consumed_capacity
                .insert("shares".into(), "1".into());
            v.apply_claim(&format!("c{n}"), Claim::read(&c));
            n += 1;
        }
    }
    ledger.sync_claims(node, &v.holdings(node), &v.covered_on(node));
    let full = ledger
        .with_node(node, |nl| {
            crate::packing::fit(&nl.node, &nl.usage, &share(250))
        })
        .unwrap();
    assert_eq!(full, Err(Reason::NoFreeReplica));
    let used: Vec<u32> = ledger
        .with_node(node, |nl| nl.usage.gpu_milli.clone())
        .unwrap();
    assert_eq!(used, vec![1000; 8]);
    // One claim gone, one share free again on its GPU.
    v.apply_claim("c5", None);
    ledger.sync_claims(node, &v.holdings(node), &v.covered_on(node));
    let used: Vec<u32> = ledger
        .with_node(node, |nl| nl.usage.gpu_milli.clone())
        .unwrap();
    assert_eq!(used, vec![1000, 750, 1000, 1000, 1000, 1000, 1000, 1000]);
    assert_eq!(
        ledger
            .with_node(node, |nl| crate::packing::fit(
                &nl.node,
                &nl.usage,
                &share(250)
            ))
            .unwrap(),
        Ok(())
    );
    // A claim that consumed two shares holds half its GPU.
    let mut two = claim("two", "pod-two", node, &[&gpus[1]]);
    two.status.allocation.as_mut().unwrap().devices.results[0]
        .consumed_capacity
        .insert("shares".into(), "2".into());
    v.apply_claim("c4", None);
    v.apply_claim("two", Claim::read(&two));
    ledger.sync_claims(node, &v.holdings(node), &v.covered_on(node));
    let used: Vec<u32> = ledger
        .with_node(node, |nl| nl.usage.gpu_milli.clone())
        .unwrap();
    assert_eq!(used[1], 1000);
    // Undeclared again (the rule removed, or the node's labels changed): refused in words.
    let g = v.gpu_node(node, false).unwrap();
    assert_eq!(
        crate::packing::fit(&g, &crate::packing::Usage::empty(&g), &share(250)),
        Err(Reason::DraNoShares)
    );
}

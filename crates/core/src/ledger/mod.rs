//! Who holds what on which node, at the granularity the device plugin enforces (see
//! [`crate::packing`]). A pod's holding is derived from the pod alone (its `gpu-share.io/request`
//! annotation or its `nvidia.com/*` limits, `spec.nodeName`, and the `gpu-share.io/gpus` model
//! annotation written at bind), so a restarted replica rebuilds the same ledger from the API.
//! - [`holder`]: who holds, a pod or what holds in pods' stead, with its identity (pure);
//! - [`pod_read`]: reading a pod's demand and holding (pure);
//! - [`node`]: one node's ledger and preemption on it (pure);
//! - [`cluster`]: [`Ledger`], the cluster's, with a lock per node and a listener on release.

mod cluster;
mod holder;
mod index;
mod node;
mod pod_read;

pub use cluster::*;
pub use holder::*;
pub use node::*;
pub use pod_read::*;

#[cfg(test)]
mod tests {
    use super::node::*;
    use super::pod_read::*;
    use super::*;
    use crate::inventory::Sharing;
    use crate::inventory::{self, GpuNode};
    use crate::packing::{Demand, GpuDemand, Reason, Scorer};
    use k8s_openapi::api::core::v1::Pod;

    /// The limit the driver holds a share to is the one its container carries for the
    /// toolkit's hook, both variables literal numbers; the request annotation's budget is not.
    #[test]
    fn the_driver_limit_is_read_from_the_containers_env() {
        let pod = |env: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "ml", "uid": "u",
                             "annotations": {"gpu-share.io/request": "timeslice-25,memory=1024Mi"}},
                "spec": {"containers": [{"name": "c", "image": "x", "env": env,
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}))
            .unwrap()
        };
        let limit = |env| demand_of_pod(&pod(env)).unwrap().unwrap().driver_limit_mib;
        let both = |r: &str, l: &str| {
            serde_json::json!([{"name": "NVIDIA_GPU_MEMORY_REQUEST", "value": r},
                               {"name": "NVIDIA_GPU_MEMORY_LIMIT", "value": l}])
        };
        assert_eq!(limit(both("1024", "1024")), Some(1024));
        assert_eq!(limit(serde_json::json!([])), None, "the annotation alone");
        assert_eq!(
            limit(serde_json::json!([{"name": "NVIDIA_GPU_MEMORY_LIMIT", "value": "1024"}])),
            None,
            "the hook skips a container without the request"
        );
        assert_eq!(limit(both("2048", "1024")), None, "the hook refuses it");
        assert_eq!(limit(both("1Gi", "1024")), None);
        let from_key = serde_json::json!([
            {"name": "NVIDIA_GPU_MEMORY_REQUEST", "value": "1024"},
            {"name": "NVIDIA_GPU_MEMORY_LIMIT", "valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}}}]);
        assert_eq!(limit(from_key), None);
    }

    fn pinned(spec: serde_json::Value) -> Vec<String> {
        let mut spec = spec;
        spec["containers"] = serde_json::json!([{"name": "c", "image": "x",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]);
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ml", "uid": "u"}, "spec": spec}))
        .unwrap();
        let models = pod_models(&pod);
        assert_eq!(
            demand_of_pod(&pod).unwrap().unwrap().models,
            models,
            "the demand carries them"
        );
        models
    }

    fn term(key: &str, op: &str, values: &[&str]) -> serde_json::Value {
        serde_json::json!({"matchExpressions": [{"key": key, "operator": op, "values": values}]})
    }

    fn required(terms: Vec<serde_json::Value>) -> serde_json::Value {
        serde_json::json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": terms}}})
    }

    /// The model a pod is pinned to, as the inventory names nodes' models: from a nodeSelector or
    /// a required node affinity on nvidia.com/gpu.product (or GKE's accelerator label).
    #[test]
    fn a_pods_model_constraint_is_read_from_its_selector_and_required_affinity() {
        const P: &str = "nvidia.com/gpu.product";
        assert!(pinned(serde_json::json!({})).is_empty());
        assert_eq!(
            pinned(serde_json::json!({"nodeSelector": {P: "NVIDIA-A100-SXM4-80GB-SHARED"}})),
            ["NVIDIA-A100-SXM4-80GB"]
        );
        assert_eq!(
            pinned(
                serde_json::json!({"nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-l4"}})
            ),
            ["nvidia-l4"]
        );
        // Terms are alternatives: the union when every term pins the model.
        let two = required(vec![
            term(P, "In", &["Tesla-T4", "NVIDIA-L4"]),
            term(P, "In", &["NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "Tesla-T4"]),
        ]);
        assert_eq!(
            pinned(serde_json::json!({"affinity": two})),
            ["Tesla-T4", "NVIDIA-L4", "NVIDIA-A100-SXM4-40GB"]
        );
        // A term that does not pin it, or pins it only by NotIn, lets the pod run anywhere.
        let open = required(vec![
            term(P, "In", &["Tesla-T4"]),
            term("nvidia.com/gpu.sharing-strategy", "In", &["mps"]),
        ]);
        assert!(pinned(serde_json::json!({"affinity": open})).is_empty());
        let not_in = required(vec![term(P, "NotIn", &["Tesla-T4"])]);
        assert!(pinned(serde_json::json!({"affinity": not_in})).is_empty());
        // With both, the pod needs both.
        let both = serde_json::json!({
            "nodeSelector": {P: "Tesla-T4"},
            "affinity": required(vec![term(P, "In", &["Tesla-T4", "NVIDIA-L4"])]),
        });
        assert_eq!(pinned(both), ["Tesla-T4"]);
    }

    /// The slim copy the bind cache keeps reads the same: demand (GPU and CPU), identity and key.
    #[test]
    fn bind_pod_keeps_what_bind_reads() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "p", "namespace": "ml", "uid": "u-1",
                "labels": {"app": "x"},
                "annotations": {
                    "gpu-share": "mps-25", "gpu-share/memory": "8Gi",
                    "gpu-share.io/request": "mps-25,memory=8192Mi",
                    "kubectl.kubernetes.io/last-applied-configuration": "x".repeat(10_000),
                },
                "managedFields": [{"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1",
                                   "fieldsV1": {"f:metadata": {}}}],
            },
            "spec": {
                "priority": 7,
                "overhead": {"cpu": "250m"},
                "initContainers": [
                    {"name": "init", "image": "i", "resources": {"requests": {"cpu": "4"}}},
                    {"name": "sidecar", "image": "s", "restartPolicy": "Always",
                     "resources": {"requests": {"cpu": "500m"}}},
                ],
                "containers": [{
                    "name": "main", "image": "m",
                    "env": [{"name": "A", "value": "1"}],
                    "resources": {"requests": {"cpu": "2"}, "limits": {"nvidia.com/gpu": "1", "cpu": "3"}},
                }],
                "volumes": [{"name": "v", "emptyDir": {}}],
            },
            "status": {"phase": "Pending"},
        }))
        .unwrap();
        let kept = BindPod::of(&pod);
        assert_eq!(kept.demand, demand_of_pod(&pod));
        assert!(kept.demand.as_ref().unwrap().is_some());
        assert_eq!(kept.pod, pod_ref(&pod));
        assert_eq!(kept.key, pod_key(&pod));
        let full = serde_json::to_vec(&pod).unwrap().len();
        assert!(
            (kept.size() as usize) * 10 < full,
            "{} vs {full}",
            kept.size()
        );
        // A bad request is kept as its reason, counted in the size.
        let mut bad = pod.clone();
        bad.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("gpu-share.io/request".into(), "x".repeat(100_000));
        let kept = BindPod::of(&bad);
        assert!(kept.demand.is_err());
        assert!(kept.size() > 100_000, "{}", kept.size());
    }
    use crate::packing::PackingPolicy;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    fn pref(uid: &str) -> PodRef {
        PodRef::new(uid, "ml", uid)
    }

    #[test]
    fn demand_from_annotation_and_from_limits() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "a", "namespace": "ml", "uid": "u1",
                "annotations": {"gpu-share.io/request": "mps-25,memory=12288Mi"}},
            "spec": {"containers": [{"name": "c"}]}
        }));
        assert_eq!(
            demand_of_pod(&p).unwrap().unwrap().gpu,
            GpuDemand::Mps {
                milli: 250,
                memory_mib: Some(12288)
            }
        );
        let p = pod(serde_json::json!({
            "metadata": {"name": "b", "namespace": "ml"},
            "spec": {"containers": [
                {"name": "c", "resources": {"limits": {"nvidia.com/mig-1g.10gb.me": "1"}}},
                {"name": "d", "resources": {"limits": {"nvidia.com/mig-1g.10gb.me": "2"}}}
            ]}
        }));
        assert_eq!(
            demand_of_pod(&p).unwrap().unwrap().gpu,
            GpuDemand::Mig {
                profile: "1g.10gb+me".into(),
                count: 3
            }
        );
        let p = pod(serde_json::json!({
            "metadata": {"name": "c", "namespace": "ml"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "1"}}}]}
        }));
        assert_eq!(demand_of_pod(&p).unwrap(), None);
        let p = pod(serde_json::json!({
            "metadata": {"name": "d", "namespace": "ml"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {
                "nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "1"}}}]}
        }));
        assert!(matches!(demand_of_pod(&p), Err(DemandError::Mixed(..))));
    }

    #[test]
    fn cpu_request_counts_as_kube_scheduler_does() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "a", "namespace": "ml",
                "annotations": {"gpu-share.io/request": "timeslice-50"}},
            "spec": {
                "containers": [
                    {"name": "c", "resources": {"requests": {"cpu": "1500m"}}},
                    // No request: the limit is the request.
                    {"name": "d", "resources": {"limits": {"cpu": "2"}}},
                    {"name": "e"}
                ],
                "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "3"}}}],
                "overhead": {"cpu": "250m"}
            }
        }));
        // max(1.5 + 2, 3) + 0.25.
        assert_eq!(demand_of_pod(&p).unwrap().unwrap().cpu_milli, 3750);
        let mut spec = p.spec.clone().unwrap();
        spec.init_containers = None;
        spec.overhead = None;
        assert_eq!(pod_cpu_milli(&spec), 3500);
        // A larger init container wins.
        let p = pod(serde_json::json!({
            "metadata": {"name": "b", "namespace": "ml"},
            "spec": {
                "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "4"}}}]
            }
        }));
        assert_eq!(demand_of_pod(&p).unwrap().unwrap().cpu_milli, 4000);
    }

    fn requested(request: &str, limits: serde_json::Value) -> Pod {
        pod(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ml", "uid": "u1",
                         "annotations": {"gpu-share.io/request": request}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}
        }))
    }

    #[test]
    fn a_request_its_limits_agree_with_is_believed() {
        for (request, limits, want) in [
            (
                "timeslice-50",
                serde_json::json!({"nvidia.com/gpu": "1"}),
                GpuDemand::Timeslice {
                    milli: 500,
                    memory_mib: None,
                },
            ),
            (
                "mps-25",
                serde_json::json!({"nvidia.com/gpu.shared": "1"}),
                GpuDemand::Mps {
                    milli: 250,
                    memory_mib: None,
                },
            ),
            (
                "exclusive-2",
                serde_json::json!({"nvidia.com/gpu": "2"}),
                GpuDemand::Whole { count: 2 },
            ),
            (
                "mig-1g.10gb,count=2",
                serde_json::json!({"nvidia.com/mig-1g.10gb": "2"}),
                GpuDemand::Mig {
                    profile: "1g.10gb".into(),
                    count: 2,
                },
            ),
            // The single strategy: a MIG device is a unit of nvidia.com/gpu.
            (
                "mig-3g.40gb",
                serde_json::json!({"nvidia.com/gpu": "1"}),
                GpuDemand::Mig {
                    profile: "3g.40gb".into(),
                    count: 1,
                },
            ),
            // No nvidia.com limit: nothing to check against (no device either).
            (
                "timeslice-90",
                serde_json::json!({"cpu": "1"}),
                GpuDemand::Timeslice {
                    milli: 900,
                    memory_mib: None,
                },
            ),
        ] {
            let p = requested(request, limits);
            assert_eq!(request_contradiction(&p), None, "{request}");
            assert_eq!(gpu_demand_of_pod(&p).unwrap(), Some(want), "{request}");
        }
    }

    /// The webhook writes limits into the main containers; an init container's own GPU use
    /// neither contradicts the request nor makes it unaccountable.
    #[test]
    fn an_init_containers_gpu_does_not_contradict_the_request() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ml",
                         "annotations": {"gpu-share.io/request": "mig-1g.10gb"}},
            "spec": {
                "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}],
                "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
            }
        }));
        assert_eq!(request_contradiction(&p), None);
        assert_eq!(
            gpu_demand_of_pod(&p).unwrap(),
            Some(GpuDemand::Mig {
                profile: "1g.10gb".into(),
                count: 1
            })
        );
    }

    #[test]
    fn a_request_its_limits_contradict_is_accounted_by_the_limits() {
        for (request, limits, want) in [
            // Rewritten down from timeslice-90 on a pod holding two replicas.
            (
                "timeslice-1",
                serde_json::json!({"nvidia.com/gpu": "2"}),
                GpuDemand::Units {
                    resource: "nvidia.com/gpu".into(),
                    count: 2,
                },
            ),
            (
                "exclusive",
                serde_json::json!({"nvidia.com/gpu": "4"}),
                GpuDemand::Units {
                    resource: "nvidia.com/gpu".into(),
                    count: 4,
                },
            ),
            (
                "mig-1g.10gb",
                serde_json::json!({"nvidia.com/mig-3g.40gb": "1"}),
                GpuDemand::Mig {
                    profile: "3g.40gb".into(),
                    count: 1,
                },
            ),
            (
                "mig-1g.10gb",
                serde_json::json!({"nvidia.com/mig-1g.10gb": "3"}),
                GpuDemand::Mig {
                    profile: "1g.10gb".into(),
                    count: 3,
                },
            ),
            (
                "mps-25",
                serde_json::json!({"nvidia.com/mig-1g.10gb": "1"}),
                GpuDemand::Mig {
                    profile: "1g.10gb".into(),
                    count: 1,
                },
            ),
        ] {
            let p = requested(request, limits.clone());
            let why = request_contradiction(&p).unwrap_or_else(|| panic!("{request} {limits}"));
            assert!(
                why.contains("is not believed") && why.contains("accounts it by its limits"),
                "{why}"
            );
            assert_eq!(
                gpu_demand_of_pod(&p).unwrap(),
                Some(want),
                "{request} {limits}"
            );
            // The rebuild reads the same.
            let mut bound = p.clone();
            bound.spec.as_mut().unwrap().node_name = Some("n1".into());
            let o = observed_holding(&bound).unwrap().unwrap();
            assert_eq!(Some(o.demand.gpu), gpu_demand_of_pod(&p).unwrap());
        }
        // Two kinds of GPU resource: contradicted, and the limits alone are refused in words.
        let p = requested(
            "timeslice-50",
            serde_json::json!({"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "1"}),
        );
        assert!(request_contradiction(&p).is_some());
        assert!(matches!(gpu_demand_of_pod(&p), Err(DemandError::Mixed(..))));
    }

    #[test]
    fn observed_holding_needs_a_node_and_a_live_phase() {
        let base = serde_json::json!({
            "metadata": {"name": "a", "namespace": "ml", "uid": "u1",
                "annotations": {"gpu-share.io/request": "timeslice-50", "gpu-share.io/gpus": "1:500"}},
            "spec": {"containers": [{"name": "c"}], "nodeName": "n1", "priority": 7},
            "status": {"phase": "Running"}
        });
        let o = observed_holding(&pod(base.clone())).unwrap().unwrap();
        assert_eq!(o.node, "n1");
        assert_eq!(o.gpus, Some(vec![(1, 500)]));
        assert_eq!(o.pod.priority, 7);
        let mut done = base.clone();
        done["status"]["phase"] = "Succeeded".into();
        assert_eq!(observed_holding(&pod(done)).unwrap(), None);
        let mut pending = base;
        pending["spec"]["nodeName"] = serde_json::Value::Null;
        assert_eq!(observed_holding(&pod(pending)).unwrap(), None);
    }

    /// A reservation in gpu-share's namespace holds its GPU for shares; the same pod anywhere
    /// else is accounted by its limits (a whole GPU).
    #[test]
    fn reservations_are_trusted_in_their_namespace_only() {
        let t = crate::reservation::Template {
            image: "gpu-share:test".into(),
            ..Default::default()
        };
        let mut p = crate::reservation::pod("n1", 2, false, &t);
        p["metadata"]["uid"] = "r1".into();
        p["status"] = serde_json::json!({"phase": "Running"});
        let o = observed_holding(&pod(p.clone())).unwrap().unwrap();
        assert_eq!(
            o.demand.gpu,
            GpuDemand::ReservationPod {
                gpu: 2,
                mps: false,
                cdi_device: false
            }
        );
        assert_eq!((o.node.as_str(), o.gpus.clone()), ("n1", None));
        let mut n = GpuNode::whole("n1", "NVIDIA-A100-SXM4-80GB", 4, 81920);
        n.sharing = crate::inventory::Sharing::PerGpu;
        let ledger = Ledger::rebuild([n], &[o]);
        ledger.with_node("n1", |nl| assert_eq!(nl.usage.reserved, vec![0, 0, 1, 0]));
        let mut elsewhere = p;
        elsewhere["metadata"]["namespace"] = "ml".into();
        let o = observed_holding(&pod(elsewhere)).unwrap().unwrap();
        assert!(
            matches!(o.demand.gpu, GpuDemand::Units { count: 1, .. }),
            "{:?}",
            o.demand.gpu
        );
    }

    /// A gpu-share pod bound with no `gpu-share.io/gpus` went around the extender; one the
    /// extender bound (MIG: an empty annotation), a pod without gpu-share's request, a pending
    /// and a finished pod did not.
    #[test]
    fn pods_bound_around_the_extender_are_told_apart() {
        let base = serde_json::json!({
            "metadata": {"name": "a", "namespace": "ml", "uid": "u1",
                "annotations": {"gpu-share.io/request": "timeslice-50"}},
            "spec": {"containers": [{"name": "c",
                "resources": {"limits": {"nvidia.com/gpu.shared": "1"}}}], "nodeName": "n1"},
            "status": {"phase": "Running"}
        });
        assert_eq!(
            bound_without_extender(&pod(base.clone())),
            Some(vec!["nvidia.com/gpu.shared".to_string()])
        );
        // A pod in per-GPU form asks no device; the unit that brings it to the extender is named.
        let mut per_gpu = base.clone();
        per_gpu["spec"]["containers"][0]["resources"]["limits"] =
            serde_json::json!({"gpu-share.io/shared-gpu": "1"});
        assert_eq!(
            bound_without_extender(&pod(per_gpu)),
            Some(vec!["gpu-share.io/shared-gpu".to_string()])
        );
        for (path, value) in [
            (
                "/metadata/annotations/gpu-share.io~1gpus",
                serde_json::json!(""),
            ),
            ("/metadata/annotations", serde_json::json!({})),
            ("/spec/nodeName", serde_json::Value::Null),
            ("/status/phase", serde_json::json!("Succeeded")),
        ] {
            let mut p = base.clone();
            let (parent, key) = path.rsplit_once('/').unwrap();
            p.pointer_mut(parent).unwrap()[key.replace("~1", "/")] = value;
            assert_eq!(bound_without_extender(&pod(p)), None, "{path}");
        }
    }

    #[test]
    fn reserve_record_release_and_rebuild() {
        let n = GpuNode::shared("n1", "H100", 2, 81559, Sharing::TimeSlicing { replicas: 4 });
        let l = Ledger::new();
        l.upsert_node(n.clone());
        let scorer = Scorer::new(PackingPolicy::Binpack);
        let d = Demand::gpu(GpuDemand::Timeslice {
            milli: 600,
            memory_mib: None,
        });
        let p1 = l.hold(&scorer, "n1", pref("a"), d.clone()).unwrap();
        let p2 = l.hold(&scorer, "n1", pref("b"), d.clone()).unwrap();
        assert_ne!(
            p1.gpus[0].0, p2.gpus[0].0,
            "second 60% goes to the other GPU"
        );
        // A third 60% fits the node's budget (1.8 of 2 GPUs), but no GPU has 600 left: it is
        // refused, never stacked past a GPU's whole.
        assert_eq!(
            l.hold(&scorer, "n1", pref("c"), d.clone()),
            Err(Reason::NoGpuWithRoom)
        );
        let small = Demand::gpu(GpuDemand::Timeslice {
            milli: 400,
            memory_mib: None,
        });
        l.hold(&scorer, "n1", pref("c"), small.clone()).unwrap();
        l.hold(&scorer, "n1", pref("e"), small.clone()).unwrap();
        assert_eq!(
            l.hold(&scorer, "n1", pref("d"), d.clone()),
            Err(Reason::BudgetUsedUp)
        );
        // Idempotent.
        assert_eq!(l.hold(&scorer, "n1", pref("a"), d.clone()).unwrap(), p1);
        // Rebuild from what the API would show.
        let observed: Vec<ObservedPod> = ["a", "b", "c", "e"]
            .iter()
            .map(|u| {
                let h = l.holding(u).unwrap();
                ObservedPod {
                    pod: h.pod.clone(),
                    node: h.node.clone(),
                    demand: h.demand.clone(),
                    gpus: Some(h.placement.gpus.clone()),
                }
            })
            .collect();
        let rebuilt = Ledger::rebuild([n.clone()], &observed);
        assert_eq!(rebuilt.snapshot(), l.snapshot());
        l.release("a");
        assert!(l.hold(&scorer, "n1", pref("d"), d).is_ok());
        assert_eq!(l.with_node("n1", |nl| nl.within_capacity()), Some(true));
        assert_eq!(
            l.with_node("n1", |nl| nl.usage.gpu_milli.clone()),
            Some(vec![1000, 1000])
        );
    }

    #[test]
    fn recorded_pods_keep_their_bound_demand_and_their_units() {
        let l = Ledger::new();
        l.upsert_node(GpuNode::whole("n", "H100", 2, 81559));
        let observed = |uid: &str, count: u32, gpus: Option<Vec<(u32, u32)>>| ObservedPod {
            pod: pref(uid),
            node: "n".into(),
            demand: Demand::gpu(GpuDemand::Whole { count }),
            gpus,
        };
        l.record(&observed("a", 2, None));
        assert_eq!(l.with_node("n", |nl| nl.usage.slots), Some(2));
        // Editing the annotation of a running pod does not shrink what it holds.
        l.record(&observed("a", 1, None));
        assert_eq!(l.with_node("n", |nl| nl.usage.slots), Some(2));
        assert_eq!(
            l.holding("a").unwrap().demand.gpu,
            GpuDemand::Whole { count: 2 }
        );
        // A pod running where the model has no free GPU still holds its units.
        l.record(&observed("b", 1, None));
        assert_eq!(l.with_node("n", |nl| nl.usage.slots), Some(3));
        assert_eq!(l.with_node("n", |nl| nl.within_capacity()), Some(false));
        // A bind annotation naming one GPU twice is not believed.
        l.upsert_node(GpuNode::whole("m", "H100", 2, 81559));
        l.record(&ObservedPod {
            node: "m".into(),
            ..observed("c", 2, Some(vec![(0, 1000), (0, 1000)]))
        });
        assert_eq!(
            l.with_node("m", |nl| nl.usage.gpu_milli.clone()),
            Some(vec![1000, 1000])
        );
    }

    /// Which bind annotations the ledger believes: the demand's own footprint (a time-slicing
    /// share's thousandths exactly, an MPS share's at least, whole GPUs whole) or as much as the
    /// model's choice; never a GPU the node lacks, an empty share, or a GPU over full.
    #[test]
    fn a_bind_annotation_is_believed_only_as_the_demands_footprint_or_the_models_choice() {
        let ts = GpuDemand::Timeslice {
            milli: 250,
            memory_mib: None,
        };
        let mps = GpuDemand::Mps {
            milli: 250,
            memory_mib: None,
        };
        let whole = GpuDemand::Whole { count: 2 };
        // (annotation, demand, the model's thousandths, believed)
        type Case<'a> = (&'a [(u32, u32)], &'a GpuDemand, u32, bool);
        let cases: [Case; 16] = [
            (&[(1, 250)], &ts, 0, true),
            (&[(1, 600)], &ts, 0, false),
            (&[(1, 600)], &ts, 600, true),
            (&[(0, 125), (1, 125)], &ts, 0, false),
            (&[(1, 250)], &mps, 0, true),
            (&[(1, 500)], &mps, 0, true),
            (&[(1, 100)], &mps, 0, false),
            (&[(1, 100)], &mps, 100, true),
            (&[(0, 1000), (1, 1000)], &whole, 0, true),
            (&[(0, 1000)], &whole, 0, false),
            (&[(0, 1000), (1, 500)], &whole, 0, false),
            (&[(0, 1000), (1, 500)], &whole, 1500, true),
            (&[(4, 250)], &ts, 250, false),
            (&[(1, 0)], &ts, 0, false),
            (&[(0, 1000), (0, 1000)], &whole, 2000, false),
            (&[], &ts, 0, false),
        ];
        for (gpus, demand, model, believed) in cases {
            assert_eq!(
                annotation_fits(gpus, demand, 4, model),
                believed,
                "{gpus:?} for {demand:?} (model {model})"
            );
        }
    }

    /// A running share recorded where the model has no room (holdings the API no longer has are
    /// still held, say, until a reconcile releases them) keeps the GPU its bind annotation
    /// names: the model shows that GPU over full, and no next pod is given it as free.
    #[test]
    fn a_share_recorded_without_room_keeps_its_annotated_gpu() {
        let l = Ledger::new();
        let mut n = GpuNode::whole("n", "NVIDIA-A100-SXM4-80GB", 2, 81920);
        n.sharing = crate::inventory::Sharing::PerGpu;
        l.upsert_node(n);
        let share = |uid: &str, milli: u32, gpus: Vec<(u32, u32)>| ObservedPod {
            pod: pref(uid),
            node: "n".into(),
            demand: Demand::gpu(GpuDemand::Timeslice {
                milli,
                memory_mib: None,
            }),
            gpus: Some(gpus),
        };
        // GPU 1 whole, GPU 0 full of shares: the model has no room for one more share.
        l.record(&ObservedPod {
            node: "n".into(),
            ..ObservedPod {
                pod: pref("whole"),
                node: "n".into(),
                demand: Demand::gpu(GpuDemand::Whole { count: 1 }),
                gpus: Some(vec![(1, 1000)]),
            }
        });
        l.record(&share("a", 500, vec![(0, 500)]));
        l.record(&share("b", 500, vec![(0, 500)]));
        l.record(&share("late", 250, vec![(0, 250)]));
        assert_eq!(l.holding("late").unwrap().placement.gpus, vec![(0, 250)]);
        assert_eq!(
            l.with_node("n", |nl| nl.usage.gpu_milli.clone()),
            Some(vec![1250, 1000])
        );
        // A share's annotation that is not its thousandths is not believed where there is no
        // room either.
        l.record(&share("wrong", 250, vec![(0, 600)]));
        assert_eq!(l.holding("wrong").unwrap().placement.gpus, vec![]);
        assert_eq!(
            l.with_node("n", |nl| nl.usage.gpu_milli.clone()),
            Some(vec![1250, 1000])
        );
        l.release("wrong");
        // Once the stale holding goes, the GPU is exactly as full as the API says.
        l.release("a");
        assert_eq!(
            l.with_node("n", |nl| nl.usage.gpu_milli.clone()),
            Some(vec![750, 1000])
        );
        // A whole GPU the same, where no GPU is free; an annotation that is not the demand's
        // (half a GPU for a whole one) is not believed.
        let whole = |uid: &str, gpus: Vec<(u32, u32)>| ObservedPod {
            pod: pref(uid),
            node: "n".into(),
            demand: Demand::gpu(GpuDemand::Whole { count: 1 }),
            gpus: Some(gpus),
        };
        l.record(&whole("second", vec![(1, 1000)]));
        assert_eq!(l.holding("second").unwrap().placement.gpus, vec![(1, 1000)]);
        l.release("whole");
        l.release("second");
        l.record(&whole("half", vec![(1, 500)]));
        assert_ne!(l.holding("half").unwrap().placement.gpus, vec![(1, 500)]);
    }

    /// The long fault run's case: on a node of the device plugin, every GPU held in the model (one
    /// by a pod that is gone, not yet released), an exclusive pod recorded with its bind
    /// annotation keeps that GPU. The model's own choice there is no GPU at all, which once won
    /// and left the pod held with no GPU until it went.
    #[test]
    fn an_exclusive_pod_recorded_where_the_model_has_no_free_gpu_keeps_its_annotated_gpu() {
        let l = Ledger::new();
        l.upsert_node(GpuNode::whole("plain", "NVIDIA-A100-SXM4-80GB", 4, 81920));
        let whole = |uid: &str, gpus: Option<Vec<(u32, u32)>>| ObservedPod {
            pod: pref(uid),
            node: "plain".into(),
            demand: Demand::gpu(GpuDemand::Whole { count: 1 }),
            gpus,
        };
        for (uid, gpu) in [("a", 0), ("b", 1), ("gone", 2)] {
            l.record(&whole(uid, Some(vec![(gpu, 1000)])));
        }
        // A pod recorded without its annotation takes the last free GPU in the model.
        l.record(&whole("c", None));
        assert_eq!(l.holding("c").unwrap().placement.gpus, [(3, 1000)]);
        l.record(&whole("new", Some(vec![(2, 1000)])));
        assert_eq!(l.holding("new").unwrap().placement.gpus, [(2, 1000)]);
        // Once the gone pod is released, GPU 2 is the new pod's alone.
        l.release("gone");
        assert_eq!(
            l.with_node("plain", |nl| nl.usage.gpu_milli.clone()),
            Some(vec![1000; 4])
        );
        assert!(l.with_node("plain", |nl| nl.within_capacity()).unwrap());
    }

    #[test]
    fn a_huge_recorded_unit_count_is_bounded_by_the_node() {
        let mut nl = NodeLedger::new(GpuNode::shared(
            "ts",
            "H100",
            2,
            81559,
            Sharing::TimeSlicing { replicas: 4 },
        ));
        nl.record(&ObservedPod {
            pod: pref("x"),
            node: "ts".into(),
            demand: Demand::gpu(GpuDemand::Units {
                resource: "nvidia.com/gpu".into(),
                count: u32::MAX,
            }),
            gpus: None,
        });
        let h = nl.holdings.get("x").unwrap();
        assert_eq!(
            h.placement.gpus.len(),
            8,
            "one modelled replica per unit the node has"
        );
        assert_eq!(nl.usage.slots, u32::MAX);
    }

    #[test]
    fn pods_on_unknown_nodes_wait_for_the_node() {
        let l = Ledger::new();
        let o = ObservedPod {
            pod: pref("x"),
            node: "later".into(),
            demand: Demand::gpu(GpuDemand::Whole { count: 1 }),
            gpus: None,
        };
        l.record(&o);
        assert_eq!(l.uids(), vec!["x".to_string()]);
        l.upsert_node(GpuNode::whole("later", "H100", 2, 81559));
        assert_eq!(l.with_node("later", |nl| nl.usage.slots), Some(1));
        assert_eq!(l.unplaced(), 0);
        l.remove_node("later");
        assert_eq!(l.unplaced(), 1);
        assert_eq!(l.uids(), vec!["x".to_string()]);
    }

    #[test]
    fn preemption_keeps_only_victims_that_make_room() {
        let mut nl = NodeLedger::new(GpuNode {
            gpus: 0,
            slots: 0,
            mig: inventory::MigLayout::Mixed {
                instances: [("1g.10gb".to_string(), 2), ("3g.40gb".to_string(), 1)].into(),
            },
            ..GpuNode::whole("m", "A100", 0, 81920)
        });
        let scorer = Scorer::new(PackingPolicy::Binpack);
        let small = Demand::gpu(GpuDemand::Mig {
            profile: "1g.10gb".into(),
            count: 1,
        });
        let big = Demand::gpu(GpuDemand::Mig {
            profile: "3g.40gb".into(),
            count: 1,
        });
        let with_prio = |uid: &str, p: i32| pref(uid).with_priority(p);
        nl.hold(&scorer, with_prio("s1", 5), small.clone()).unwrap();
        nl.hold(&scorer, with_prio("s2", 1), small.clone()).unwrap();
        nl.hold(&scorer, with_prio("b1", 3), big.clone()).unwrap();
        // The scheduler offered s1 and b1 for a 1g pod: only one 1g victim is needed, and b1
        // (another profile) does not help. s2 has the lowest priority but was not offered; the
        // offered s1 comes first.
        let v = plan_victims(&nl, &small, 10, &["s1".into(), "b1".into()]).unwrap();
        assert_eq!(v, vec!["s1".to_string()]);
        // Offered nothing useful: the lowest-priority 1g holder is added.
        let v = plan_victims(&nl, &small, 10, &["b1".into()]).unwrap();
        assert_eq!(v, vec!["s2".to_string()]);
        // A 3g pod of priority 2 cannot evict b1 (priority 3) unless offered.
        assert_eq!(plan_victims(&nl, &big, 2, &["s2".into()]), None);
        assert_eq!(
            plan_victims(&nl, &big, 2, &["b1".into()]),
            Some(vec!["b1".to_string()])
        );
    }

    /// mig-manager turns an A100 x2 from all-1g.10gb into all-3g.40gb while one pod still holds
    /// a 1g.10gb device: the pod stays held, new 3g.40gb pods take the new devices of the GPU it
    /// cannot be on, and none the GPU it may still occupy, until it leaves.
    #[test]
    fn a_mig_layout_changed_under_a_pod_keeps_its_gpu_taken() {
        let mixed = |profile: &str, n: u32| GpuNode {
            gpus: 0,
            slots: 0,
            mig: inventory::MigLayout::Mixed {
                instances: [(profile.to_string(), n)].into(),
            },
            labelled_gpus: Some(2),
            ..GpuNode::whole("m", "NVIDIA-A100-SXM4-80GB", 0, 81920)
        };
        let scorer = Scorer::new(PackingPolicy::Binpack);
        let mig = |profile: &str| {
            Demand::gpu(GpuDemand::Mig {
                profile: profile.into(),
                count: 1,
            })
        };
        let mut nl = NodeLedger::new(mixed("1g.10gb", 14));
        nl.hold(&scorer, pref("old"), mig("1g.10gb")).unwrap();
        nl.set_node(mixed("3g.40gb", 4));
        assert_eq!(nl.holdings.len(), 1, "the pod on the old layout is kept");
        assert_eq!(crate::packing::stale_mig_devices(&nl.node, &nl.usage), 1);
        let important = |uid: &str| pref(uid).with_priority(20);
        nl.hold(&scorer, important("new1"), mig("3g.40gb")).unwrap();
        nl.hold(&scorer, important("new2"), mig("3g.40gb")).unwrap();
        assert_eq!(
            nl.hold(&scorer, pref("new3"), mig("3g.40gb")),
            Err(Reason::MigLayoutChanged)
        );
        assert!(Reason::MigLayoutChanged.resolvable());
        // Preemption sees that the old pod's device is what stands in the way (the new pods
        // outrank the preemptor).
        assert_eq!(
            plan_victims(&nl, &mig("3g.40gb"), 10, &[]),
            Some(vec!["old".to_string()])
        );
        nl.release("old");
        nl.hold(&scorer, pref("new3"), mig("3g.40gb")).unwrap();
        nl.hold(&scorer, pref("new4"), mig("3g.40gb")).unwrap();
        assert_eq!(
            nl.hold(&scorer, pref("new5"), mig("3g.40gb")),
            Err(Reason::MigProfileFull)
        );
    }

    #[test]
    fn set_node_keeps_holdings() {
        let mut nl = NodeLedger::new(GpuNode::whole("n", "H100", 2, 81559));
        nl.hold(
            &Scorer::new(PackingPolicy::Binpack),
            pref("a"),
            Demand::gpu(GpuDemand::Whole { count: 1 }),
        )
        .unwrap();
        nl.set_node(GpuNode::whole("n", "H100", 4, 81559));
        assert_eq!(nl.usage.slots, 1);
        assert_eq!(nl.usage.gpu_milli.len(), 4);
        assert_eq!(nl.holdings.len(), 1);
    }
}

//! The churn workload: Deployments scaled up and down, Jobs whose pods finish, bare pods created
//! and deleted, over every class (MIG, MPS, time-slicing, exclusive; time-slicing in the
//! per-GPU form while the policy has it on), each step drawn from the run's seed.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};

use super::common::cluster::Cluster;

/// The namespace of the churn.
pub const NS: &str = "chaos";
/// KWOK's stage: a pod with this annotation completes after the delay.
const COMPLETE: &str = "pod-complete.stage.kwok.x-k8s.io/delay";

/// The requests the churn makes, each a class the cluster's nodes serve.
pub const REQUESTS: [&str; 6] = [
    "mig-1g.10gb",
    "mps-25",
    "mig-3g.40gb",
    "timeslice-25",
    "timeslice-40",
    "exclusive-1",
];

/// The Deployments: name, request, largest replica count (beyond what fits, so some wait), and
/// the node they are pinned to, if any. `a10` asks the two-GPU time-sliced node
/// (tests/cluster/time-sliced-node.yaml) for up to six `timeslice-40` shares where four fit
/// (two per GPU): its pool's budget (2000) would take five.
const DEPLOYMENTS: [(&str, &str, u32, Option<&str>); 5] = [
    ("mig", "mig-1g.10gb", 14, None),
    ("mps", "mps-25", 10, None),
    ("shares", "timeslice-25", 12, None),
    ("train", "exclusive-1", 5, None),
    ("a10", "timeslice-40", 6, Some("a10-ts4x2")),
];

/// What one churn step did, for the report.
#[derive(Debug, Default, Clone)]
pub struct Counts {
    pub scaled: u32,
    pub jobs: u32,
    pub bare_created: u32,
    pub bare_deleted: u32,
    /// Creations the API refused, by the first words of why.
    pub refused: BTreeMap<String, u32>,
}

fn template(request: &str, complete_after: Option<u32>) -> Value {
    let mut annotations = json!({ "gpu-share": request });
    if let Some(s) = complete_after {
        annotations[COMPLETE] = json!(format!("{s}s"));
    }
    json!({
        "metadata": {"labels": {"app": "chaos"}, "annotations": annotations},
        "spec": {
            "containers": [{"name": "main", "image": "cuda"}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "terminationGracePeriodSeconds": 0
        }
    })
}

/// Creates the Deployments at 0 replicas.
pub async fn prepare(c: &Cluster) -> Result<(), String> {
    let api: Api<Deployment> = Api::namespaced(c.client.clone(), NS);
    for (name, request, _, node) in DEPLOYMENTS {
        let mut t = template(request, None);
        t["metadata"]["labels"]["app"] = json!(name);
        if let Some(node) = node {
            t["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": node});
        }
        let d: Deployment = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}}, "template": t}
        }))
        .map_err(|e| e.to_string())?;
        match api.create(&PostParams::default(), &d).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(format!("create Deployment {name}: {e}")),
        }
    }
    Ok(())
}

fn refused(counts: &mut Counts, e: &kube::Error) {
    let words: String = e.to_string().chars().take(80).collect();
    *counts.refused.entry(words).or_default() += 1;
}

/// One step: a few actions drawn from `rng`. API errors are counted, not fatal: faults make them.
pub async fn step(c: &Cluster, rng: &mut ChaCha8Rng, serial: &mut u64, counts: &mut Counts) {
    let deployments: Api<Deployment> = Api::namespaced(c.client.clone(), NS);
    let jobs: Api<Job> = Api::namespaced(c.client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    if rng.random_bool(0.35) {
        let (name, _, max, _) = DEPLOYMENTS[rng.random_range(0..DEPLOYMENTS.len())];
        let replicas = rng.random_range(0..=max);
        match deployments
            .patch_scale(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": replicas}})),
            )
            .await
        {
            Ok(_) => counts.scaled += 1,
            Err(e) => refused(counts, &e),
        }
    }
    if rng.random_bool(0.25) {
        *serial += 1;
        let request = REQUESTS[rng.random_range(0..REQUESTS.len())];
        let completions = rng.random_range(1..=4);
        let t = template(request, Some(rng.random_range(2..=8)));
        let mut t = t;
        t["spec"]["restartPolicy"] = json!("Never");
        let job: Job = serde_json::from_value(json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": format!("job-{serial}")},
            "spec": {"completions": completions, "parallelism": rng.random_range(1..=2),
                     "backoffLimit": 2, "template": t}
        }))
        .expect("a Job");
        match jobs.create(&PostParams::default(), &job).await {
            Ok(_) => counts.jobs += 1,
            Err(e) => refused(counts, &e),
        }
    }
    if rng.random_bool(0.45) {
        *serial += 1;
        let request = REQUESTS[rng.random_range(0..REQUESTS.len())];
        let finish = rng.random_bool(0.5).then(|| rng.random_range(5..=20));
        let mut t = template(request, finish);
        t["metadata"]["name"] = json!(format!("bare-{serial}"));
        t["metadata"]["labels"]["app"] = json!("bare");
        t["spec"]["restartPolicy"] = json!("Never");
        let pod: Pod = serde_json::from_value(t).expect("a Pod");
        match pods.create(&PostParams::default(), &pod).await {
            Ok(_) => counts.bare_created += 1,
            Err(e) => refused(counts, &e),
        }
    }
    // Bare pods deleted: one drawn at random now and then, and the finished ones; Jobs done.
    let now = rng.random_bool(0.35);
    if let Ok(list) = pods.list(&ListParams::default().labels("app=bare")).await {
        let names: Vec<(String, bool)> = list
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|p| {
                let done = p
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.as_deref())
                    .is_some_and(|ph| ph == "Succeeded" || ph == "Failed");
                (p.metadata.name.clone().unwrap_or_default(), done)
            })
            .collect();
        let pick = (now && !names.is_empty()).then(|| rng.random_range(0..names.len()));
        for (i, (name, done)) in names.iter().enumerate() {
            if *done || Some(i) == pick {
                let dp = DeleteParams {
                    grace_period_seconds: Some(0),
                    ..DeleteParams::default()
                };
                if pods.delete(name, &dp).await.is_ok() {
                    counts.bare_deleted += 1;
                }
            }
        }
    }
    if let Ok(list) = jobs.list(&ListParams::default()).await {
        for j in list.items {
            let done = j.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .flatten()
                    .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
            });
            if done {
                let _ = jobs
                    .delete(
                        &j.metadata.name.unwrap_or_default(),
                        &DeleteParams::background(),
                    )
                    .await;
            }
        }
    }
}

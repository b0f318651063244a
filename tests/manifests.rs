//! The manifests agree with the service: the scheduler configuration (parsed with the service's
//! own types) calls the verbs, path and port `serve` serves, manages exactly the resource names
//! the policy can inject, and the policy ConfigMap is the embedded default policy.

mod common;

use gpu_share::extender::config::KubeSchedulerConfiguration;
use gpu_share::policy::Policy;
use serde_json::Value;

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn config() -> KubeSchedulerConfiguration {
    KubeSchedulerConfiguration::from_yaml(&read("manifests/base/scheduler-config.yaml")).unwrap()
}

/// The `args` of a container in a Deployment manifest.
fn container_args(file: &str, container: &str) -> Vec<String> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(&read(file)).unwrap();
    for d in docs {
        if d["kind"] != "Deployment" {
            continue;
        }
        for c in d["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
        {
            if c["name"] == container {
                return c["args"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| a.as_str().unwrap().to_string())
                    .collect();
            }
        }
    }
    panic!("no container {container} in {file}");
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .map(|i| args[i + 1].clone())
}

#[test]
fn scheduler_configuration_is_valid() {
    let c = config();
    assert_eq!(c.validate(), Vec::<String>::new());
    // Swapped: the per-GPU unit must be ignored by kube-scheduler, a device plugin's never.
    let mut swapped = config();
    for r in &mut swapped.extenders[0].managed_resources {
        if r.name == "gpu-share.io/shared-gpu" || r.name == "nvidia.com/gpu" {
            r.ignored_by_scheduler = !r.ignored_by_scheduler;
        }
    }
    let errors = swapped.validate();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors[0].contains("gpu-share.io/shared-gpu is advertised by no node")
            || errors[1].contains("gpu-share.io/shared-gpu is advertised by no node"),
        "{errors:?}"
    );
    assert_eq!(c.extenders.len(), 1);
    let e = &c.extenders[0];
    assert!(e.node_cache_capable);
    assert!(!e.ignorable);
    assert!(e.weight >= 10, "packing must be able to dominate");
    let p = &c.profiles[0];
    assert_eq!(p.percentage_of_nodes_to_score, Some(100));
    assert_eq!(
        p.scheduler_name,
        Policy::default_policy().scheduler_name,
        "the webhook sets this schedulerName"
    );
}

#[tokio::test]
async fn extender_verbs_url_and_port_match_what_serve_serves() {
    common::install_crypto();
    let c = config();
    let e = &c.extenders[0];
    let url: http::Uri = e.url_prefix.parse().unwrap();
    assert_eq!(url.scheme_str(), Some("https"));
    let sidecar = container_args("manifests/base/scheduler-deployment.yaml", "extender");
    assert_eq!(flag(&sidecar, "--role").as_deref(), Some("extender"));
    let listen: std::net::SocketAddr = flag(&sidecar, "--listen").unwrap().parse().unwrap();
    assert!(
        listen.ip().is_loopback(),
        "the extender listens on loopback"
    );
    assert_eq!(url.host(), Some(listen.ip().to_string().as_str()));
    assert_eq!(url.port_u16(), Some(listen.port()));
    let state = common::dev_state();
    for verb in [
        &e.filter_verb,
        &e.prioritize_verb,
        &e.bind_verb,
        &e.preempt_verb,
    ] {
        assert!(!verb.is_empty());
        let path = format!("{}/{}", url.path().trim_end_matches('/'), verb);
        let (status, body) = common::post(state.clone(), &path, b"{}".to_vec()).await;
        assert_ne!(status, 404, "{path} is not served: {body}");
    }
    let tls = e.tls_config.as_ref().unwrap();
    assert!(
        tls.ca_file
            .as_deref()
            .unwrap()
            .starts_with("/etc/gpu-share/tls/")
    );
    let cert = flag(&sidecar, "--tls-cert").unwrap();
    assert!(cert.starts_with("/etc/gpu-share/tls/"), "{cert}");
}

/// The shipped managedResources are every name NVIDIA's device plugin advertises for the
/// built-in MIG tables: the default policy's names and `nvidia.com/gpu.shared`. So whatever the
/// policy's strategy and resource names, its pods reach the extender with no edit here.
#[test]
fn managed_resources_are_every_name_the_device_plugin_advertises() {
    let c = config();
    let mut listed: Vec<String> = c.extenders[0]
        .managed_resources
        .iter()
        .map(|r| r.name.clone())
        .collect();
    listed.sort();
    let mut names = Policy::default_policy().managed_resources();
    names.push("nvidia.com/gpu.shared".to_string());
    names.sort();
    assert_eq!(listed, names);
    let shared = || "nvidia.com/gpu.shared".to_string().try_into().unwrap();
    let mut single = Policy::default_policy();
    single.mig.strategy = gpu_share::policy::MigStrategy::Single;
    let mut renamed = Policy::default_policy();
    renamed.resources.timeslice = Some(shared());
    renamed.resources.mps = Some(shared());
    let mut all_renamed = Policy::default_policy();
    all_renamed.resources.shared = shared();
    for policy in [single, renamed, all_renamed] {
        for name in policy.managed_resources() {
            assert!(listed.contains(&name), "{name} is not in managedResources");
        }
    }
}

#[test]
fn policy_configmap_is_the_default_policy() {
    assert_eq!(
        read("manifests/base/policy.yaml"),
        read("policies/default.yaml"),
        "manifests/base/policy.yaml must be a byte-for-byte copy of policies/default.yaml"
    );
}

#[test]
fn webhook_deployment_runs_the_webhook_role_with_the_policy_file() {
    let args = container_args("manifests/base/webhook-deployment.yaml", "webhook");
    assert_eq!(flag(&args, "--role").as_deref(), Some("webhook"));
    assert_eq!(
        flag(&args, "--policy").as_deref(),
        Some("/etc/gpu-share/policy/policy.yaml")
    );
}

/// The apiserver only calls the webhook for pods that pass its matchConditions: they must let
/// through both the annotation that asks for a GPU and the one only the webhook may write (the
/// scheduler trusts it), or a pod could bring a forged `gpu-share.io/request` unseen.
#[test]
fn webhook_match_condition_names_both_annotations() {
    use gpu_share::request::{ANNOTATION, ANNOTATION_REQUEST};
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&read("manifests/base/mutatingwebhookconfiguration.yaml"))
            .unwrap();
    let mwc = docs
        .iter()
        .find(|d| d["kind"] == "MutatingWebhookConfiguration")
        .expect("a MutatingWebhookConfiguration");
    let hooks = mwc["webhooks"].as_array().unwrap();
    assert_eq!(hooks.len(), 3);
    let create = hooks
        .iter()
        .find(|h| h["name"] == "pods.gpu-share.io")
        .expect("the CREATE webhook");
    let conditions = create["matchConditions"].as_array().unwrap();
    assert_eq!(conditions.len(), 1, "conditions are ANDed: keep one");
    let expr = conditions[0]["expression"].as_str().unwrap();
    for name in [ANNOTATION, ANNOTATION_REQUEST] {
        assert!(
            expr.contains(&format!("'{name}' in object.metadata.annotations")),
            "matchCondition does not test annotation {name}: {expr}"
        );
    }
    assert!(
        expr.contains(" || "),
        "either annotation must be enough: {expr}"
    );
    // The UPDATE webhook: called for a change to any gpu-share annotation, compared with the
    // pod before the update (the control-plane test shows the API server evaluating it).
    let update = hooks
        .iter()
        .find(|h| h["name"] == "pod-annotations.gpu-share.io")
        .expect("the UPDATE webhook");
    assert_eq!(update["rules"][0]["operations"][0], "UPDATE");
    let conditions = update["matchConditions"].as_array().unwrap();
    assert_eq!(conditions.len(), 1, "conditions are ANDed: keep one");
    let expr = conditions[0]["expression"].as_str().unwrap();
    for part in [
        "k == 'gpu-share'",
        "k.startsWith('gpu-share/')",
        "k.startsWith('gpu-share.io/')",
        "oldObject.metadata.annotations",
    ] {
        assert!(
            expr.contains(part),
            "the UPDATE condition lacks {part}: {expr}"
        );
    }
    // The Job webhook: called for a Job whose pod template carries either annotation.
    let jobs = hooks
        .iter()
        .find(|h| h["name"] == "job-templates.gpu-share.io")
        .expect("the Job template webhook");
    assert_eq!(jobs["rules"][0]["resources"][0], "jobs");
    assert_eq!(jobs["clientConfig"]["service"]["path"], "/mutate-templates");
    let expr = jobs["matchConditions"][0]["expression"].as_str().unwrap();
    for name in [ANNOTATION, ANNOTATION_REQUEST] {
        assert!(
            expr.contains(&format!(
                "'{name}' in object.spec.template.metadata.annotations"
            )),
            "the Job condition does not test annotation {name}: {expr}"
        );
    }
}

/// The image the manifests run is the one this crate's version builds (Dockerfile), and the
/// Dockerfile's example tag says so too.
#[test]
fn image_tag_is_the_crate_version() {
    let kustomization: serde_json::Value =
        serde_saphyr::from_str(&read("manifests/base/kustomization.yaml")).unwrap();
    let image = kustomization["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "gpu-share")
        .expect("an images entry for gpu-share");
    assert_eq!(
        image["newTag"].as_str(),
        Some(env!("CARGO_PKG_VERSION")),
        "manifests/base/kustomization.yaml tags gpu-share {}; Cargo.toml is at {}",
        image["newTag"],
        env!("CARGO_PKG_VERSION")
    );
    // The example pushes to the user's registry (REGISTRY/gpu-share:<version>).
    let dockerfile = read("Dockerfile");
    let tag = format!("/gpu-share:{} ", env!("CARGO_PKG_VERSION"));
    assert!(
        dockerfile.contains(&tag),
        "the Dockerfile's example tags the image gpu-share:{}",
        env!("CARGO_PKG_VERSION")
    );
}

/// The template check is sent exactly the kinds gpu-share reads without being told
/// (`builtin_kinds`), and its matchCondition looks at each kind's template annotations, both the
/// one that asks for a GPU and the one only the webhook may write.
#[test]
fn template_check_covers_the_builtin_kinds_and_their_template_annotations() {
    use gpu_share::request::{ANNOTATION, ANNOTATION_REQUEST};
    use gpu_share::workloads::builtin_kinds;
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&read("manifests/base/validatingwebhookconfiguration.yaml"))
            .unwrap();
    let vwc = docs
        .iter()
        .find(|d| d["kind"] == "ValidatingWebhookConfiguration")
        .expect("a ValidatingWebhookConfiguration");
    let hooks = vwc["webhooks"].as_array().unwrap();
    assert_eq!(hooks.len(), 1);
    let hook = &hooks[0];
    assert_eq!(hook["failurePolicy"], "Ignore");
    let mut sent: Vec<(String, String)> = Vec::new();
    for rule in hook["rules"].as_array().unwrap() {
        assert_eq!(rule["apiVersions"], serde_json::json!(["v1"]));
        for g in rule["apiGroups"].as_array().unwrap() {
            for r in rule["resources"].as_array().unwrap() {
                sent.push((g.as_str().unwrap().into(), r.as_str().unwrap().into()));
            }
        }
    }
    sent.sort();
    let mut known: Vec<(String, String)> = builtin_kinds()
        .iter()
        .map(|k| (k.group.clone(), format!("{}s", k.kind.to_lowercase())))
        .collect();
    known.sort();
    assert_eq!(sent, known);
    let conditions = hook["matchConditions"].as_array().unwrap();
    assert_eq!(conditions.len(), 1, "conditions are ANDed: keep one");
    let expr = conditions[0]["expression"].as_str().unwrap();
    for kind in builtin_kinds() {
        for path in &kind.templates {
            for name in [ANNOTATION, ANNOTATION_REQUEST] {
                let test = format!("'{name}' in object.{path}.metadata.annotations");
                assert!(
                    expr.contains(&test),
                    "{} not sent when {test}: {expr}",
                    kind.kind
                );
            }
        }
    }
}

/// The DeviceClasses gpu-share ships for DRA node pools (`manifests/components/dra`, and the
/// chart's copy under `dra.migDeviceClasses`): one per MIG profile of the built-in tables, each
/// selecting the DRA driver's static MIG devices of that profile and mapping the device plugin's
/// mixed-strategy name, so a MIG pod's limits are the same on either kind of node.
#[test]
fn dra_device_classes_are_one_per_builtin_mig_profile() {
    let want: Vec<Value> = gpu_share::mig::MigTable::default()
        .profile_names()
        .iter()
        .map(|p| {
            let (name, cel, resource) = gpu_share::dra::mig_device_class(p);
            serde_json::json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": cel}}], "extendedResourceName": resource},
            })
        })
        .collect();
    let got = gpu_share::documents::objects(&read("manifests/components/dra/deviceclasses.yaml"))
        .unwrap();
    if std::env::var_os("GPU_SHARE_WRITE_DEVICE_CLASSES").is_some() {
        for w in &want {
            println!("DEVICECLASS {w}");
        }
    }
    assert_eq!(
        got, want,
        "regenerate with GPU_SHARE_WRITE_DEVICE_CLASSES=1 (prints them)"
    );
    let chart = read("charts/gpu-share/files/dra-deviceclasses.yaml");
    assert_eq!(
        chart,
        read("manifests/components/dra/deviceclasses.yaml"),
        "the chart's copy is the component's"
    );
}

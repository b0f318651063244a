//! The part of kube-scheduler's `KubeSchedulerConfiguration` (kubescheduler.config.k8s.io/v1)
//! that wires the extender, with the checks kube-scheduler's `validateExtenders` makes. The
//! manifests' scheduler configuration is parsed with these types in a test, so its verbs, URL and
//! resource names cannot drift from what `serve` serves and the policy injects.

use std::collections::HashSet;

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeSchedulerConfiguration {
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub profiles: Vec<Profile>,
    #[serde(default)]
    pub extenders: Vec<Extender>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Profile {
    pub scheduler_name: String,
    #[serde(default)]
    pub percentage_of_nodes_to_score: Option<i32>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Extender {
    pub url_prefix: String,
    #[serde(default)]
    pub filter_verb: String,
    #[serde(default)]
    pub prioritize_verb: String,
    #[serde(default)]
    pub weight: i64,
    #[serde(default)]
    pub bind_verb: String,
    #[serde(default)]
    pub preempt_verb: String,
    #[serde(default, rename = "enableHTTPS")]
    pub enable_https: bool,
    #[serde(default)]
    pub tls_config: Option<TlsConfig>,
    #[serde(default)]
    pub http_timeout: Option<String>,
    #[serde(default)]
    pub node_cache_capable: bool,
    #[serde(default)]
    pub managed_resources: Vec<ManagedResource>,
    #[serde(default)]
    pub ignorable: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsConfig {
    #[serde(default)]
    pub insecure: bool,
    #[serde(default)]
    pub server_name: Option<String>,
    #[serde(default)]
    pub ca_file: Option<String>,
    #[serde(default)]
    pub ca_data: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagedResource {
    pub name: String,
    #[serde(default)]
    pub ignored_by_scheduler: bool,
}

impl KubeSchedulerConfiguration {
    pub fn from_yaml(text: &str) -> Result<Self, serde_saphyr::Error> {
        serde_saphyr::from_str(text)
    }

    /// kube-scheduler's own checks, plus gpu-share's: HTTPS needs a CA (otherwise the scheduler
    /// skips verification), and nothing the device plugin advertises is ignoredByScheduler.
    pub fn validate(&self) -> Vec<String> {
        let mut errors = Vec::new();
        if self.api_version != "kubescheduler.config.k8s.io/v1" {
            errors.push(format!(
                "apiVersion {} is not kubescheduler.config.k8s.io/v1",
                self.api_version
            ));
        }
        if self.kind != "KubeSchedulerConfiguration" {
            errors.push(format!(
                "kind {} is not KubeSchedulerConfiguration",
                self.kind
            ));
        }
        let binders = self
            .extenders
            .iter()
            .filter(|e| !e.bind_verb.is_empty())
            .count();
        if binders > 1 {
            errors.push("only one extender may set bindVerb".into());
        }
        for (i, e) in self.extenders.iter().enumerate() {
            if !e.prioritize_verb.is_empty() && e.weight <= 0 {
                errors.push(format!(
                    "extenders[{i}]: weight must be > 0 with a prioritizeVerb"
                ));
            }
            let mut seen = HashSet::new();
            for r in &e.managed_resources {
                if !seen.insert(&r.name) {
                    errors.push(format!(
                        "extenders[{i}]: duplicate managed resource {}",
                        r.name
                    ));
                }
                if !r.name.contains('/') || r.name.starts_with("kubernetes.io/") {
                    errors.push(format!(
                        "extenders[{i}]: {} is not an extended resource name",
                        r.name
                    ));
                }
                if (r.name == crate::request::RESOURCE_SHARE
                    || r.name == crate::request::RESOURCE_GPU_MILLI)
                    && !r.ignored_by_scheduler
                {
                    errors.push(format!("extenders[{i}]: {} is advertised by no node and must be ignoredByScheduler", r.name));
                }
                if r.ignored_by_scheduler && r.name.starts_with("nvidia.com/") {
                    errors.push(format!("extenders[{i}]: {} is advertised by the device plugin and must not be ignoredByScheduler", r.name));
                }
            }
            if e.enable_https {
                match &e.tls_config {
                    Some(t) if t.insecure => errors.push(format!("extenders[{i}]: tlsConfig.insecure must be false")),
                    Some(t) if t.ca_file.is_none() && t.ca_data.is_none() => errors.push(format!("extenders[{i}]: HTTPS without caFile/caData makes kube-scheduler skip verification")),
                    None => errors.push(format!("extenders[{i}]: HTTPS without tlsConfig makes kube-scheduler skip verification")),
                    _ => {}
                }
            }
        }
        errors
    }
}

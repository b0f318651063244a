//! Which replica acts: the one whose kube-scheduler holds the leader Lease. The reservation
//! controller, the node advertiser and the defragmentation controller each ask every tick, and
//! say when the answer changes.

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};

/// Where a replica learns whether it leads.
#[derive(Debug, Clone)]
pub struct Leadership {
    /// The Lease kube-scheduler's leader election holds (`namespace`, `name`).
    pub lease: (String, String),
    /// This host's name: the holder identity of a kube-scheduler on it begins with it.
    pub hostname: String,
}

impl Leadership {
    /// The Lease `namespace/name`, and this host's name.
    pub fn new(lease: &str) -> Self {
        let (namespace, name) = lease.split_once('/').unwrap_or(("gpu-share", lease));
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_default();
        Leadership {
            lease: (namespace.to_string(), name.to_string()),
            hostname,
        }
    }

    /// Whether this replica leads now, for `what` (the task that asks, as the log names it):
    /// `None` when the Lease cannot be read (a warning says `what` waits). A change from `seen`
    /// (the last answer) is said once, and kept there.
    pub async fn check(
        &self,
        client: &Client,
        seen: &mut Option<bool>,
        what: &str,
    ) -> Option<bool> {
        let (ns, name) = &self.lease;
        let leading = match leads(client, ns, name, &self.hostname).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, lease = %format!("{ns}/{name}"), "cannot read the leader Lease; the {what} waits");
                return None;
            }
        };
        if *seen != Some(leading) {
            tracing::info!(
                leading,
                "the {what} {}",
                if leading { "leads" } else { "follows" }
            );
            *seen = Some(leading);
        }
        Some(leading)
    }
}

/// Whether this replica leads: the Lease's holder is this host's kube-scheduler (its identity
/// is `<hostname>_<uuid>`; the extender runs in the same pod, so the same hostname). No Lease
/// (leader election off, one replica) means it leads.
pub async fn leads(
    client: &Client,
    namespace: &str,
    name: &str,
    hostname: &str,
) -> Result<bool, kube::Error> {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    Ok(match api.get_opt(name).await? {
        None => true,
        Some(lease) => lease
            .spec
            .and_then(|s| s.holder_identity)
            .is_some_and(|h| h == hostname || h.starts_with(&format!("{hostname}_"))),
    })
}

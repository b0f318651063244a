//! PURE: each namespace's GPUs against its quotas, for `gpu-share status`, `/v1/quotas` and the
//! occupancy page. Two counts, in GPUs, side by side:
//! - what the namespace's ResourceQuotas on [`QUOTA_RESOURCE`] allow and count (the quota
//!   controller's `status.used`: every pod of the namespace that carries the quantity, bound or
//!   waiting);
//! - what gpu-share holds for the namespace's bound pods (the ledger, whatever they carry).
//!
//! Where the ledger holds more than the quota counts, pods run that carry no quantity (admitted
//! before the upgrade, or with `gpuMilli` off): they are neither counted nor limited until
//! recreated. Where the quota counts more, pods that carry it wait for a node.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceQuota;
use serde::{Deserialize, Serialize};

use crate::request::RESOURCE_GPU_MILLI;

/// The key a ResourceQuota caps the quantity by (an extended resource is capped by its
/// requests only).
pub const QUOTA_RESOURCE: &str = "requests.gpu-share.io/gpu-milli";

/// One ResourceQuota's cap on the quantity, and what it counts now, in GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QuotaUse {
    pub name: String,
    pub hard_gpus: f64,
    /// What the quota controller counts (`None`: it has not counted yet).
    pub used_gpus: Option<f64>,
}

/// One namespace: what gpu-share holds for it, and its quotas on the quantity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceUse {
    pub namespace: String,
    /// GPUs the ledger holds for the namespace's bound pods.
    pub held_gpus: f64,
    /// How many of its pods hold them.
    pub pods: u32,
    pub quotas: Vec<QuotaUse>,
}

impl NamespaceUse {
    /// What a reader should know, in words: pods that carry no quantity, or pods counted that
    /// wait. `None` when the two counts agree (or there is no quota).
    pub fn note(&self) -> Option<String> {
        let counted = self
            .quotas
            .iter()
            .filter_map(|q| q.used_gpus)
            .reduce(f64::max)?;
        let diff = round(self.held_gpus - counted);
        if diff > 0.0 {
            Some(format!(
                "{diff} GPUs held by pods that carry no {RESOURCE_GPU_MILLI} (admitted before it, or with the policy's gpuMilli off): not counted by the quota until recreated"
            ))
        } else if diff < 0.0 {
            Some(format!(
                "{} GPUs counted for pods that wait for a node",
                -diff
            ))
        } else {
            None
        }
    }

    /// The largest share of a quota in use (counted over hard), for the page's bar.
    pub fn fullest(&self) -> Option<f64> {
        self.quotas
            .iter()
            .filter(|q| q.hard_gpus > 0.0)
            .map(|q| q.used_gpus.unwrap_or(0.0) / q.hard_gpus)
            .reduce(f64::max)
    }
}

/// Thousandths as GPUs, to two places.
fn gpus(milli: u64) -> f64 {
    round(milli as f64 / 1000.0)
}

fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The cap a ResourceQuota puts on the quantity, and its namespace; `None` when it caps
/// something else.
pub fn quota_use(q: &ResourceQuota) -> Option<(String, QuotaUse)> {
    let count =
        |m: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>| {
            m.and_then(|m| m.get(QUOTA_RESOURCE))
                .and_then(|v| crate::inventory::quantity_count(&v.0))
        };
    let hard = count(q.spec.as_ref().and_then(|s| s.hard.as_ref()))?;
    let used = count(q.status.as_ref().and_then(|s| s.used.as_ref()));
    Some((
        q.metadata.namespace.clone().unwrap_or_default(),
        QuotaUse {
            name: q.metadata.name.clone().unwrap_or_default(),
            hard_gpus: gpus(hard),
            used_gpus: used.map(gpus),
        },
    ))
}

/// Every namespace that holds GPUs or has a quota on the quantity: `held` is each bound pod's
/// namespace and size in GPUs (gpu-share's reservations left out by the caller), `quotas` the
/// ResourceQuotas as listed. Sorted by namespace, each namespace's quotas by name.
pub fn by_namespace<'a>(
    held: impl IntoIterator<Item = (&'a str, f64)>,
    quotas: &[ResourceQuota],
) -> Vec<NamespaceUse> {
    fn slot<'m>(out: &'m mut BTreeMap<String, NamespaceUse>, ns: &str) -> &'m mut NamespaceUse {
        out.entry(ns.to_string()).or_insert_with(|| NamespaceUse {
            namespace: ns.to_string(),
            held_gpus: 0.0,
            pods: 0,
            quotas: Vec::new(),
        })
    }
    let mut out: BTreeMap<String, NamespaceUse> = BTreeMap::new();
    for (ns, g) in held {
        let u = slot(&mut out, ns);
        u.held_gpus += g;
        u.pods += 1;
    }
    for q in quotas {
        if let Some((ns, use_)) = quota_use(q) {
            slot(&mut out, &ns).quotas.push(use_);
        }
    }
    out.into_values()
        .map(|mut u| {
            u.held_gpus = round(u.held_gpus);
            u.quotas.sort_by(|a, b| a.name.cmp(&b.name));
            u
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn quota(
        ns: &str,
        name: &str,
        hard: serde_json::Value,
        used: serde_json::Value,
    ) -> ResourceQuota {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"hard": hard},
            "status": {"hard": hard, "used": used},
        }))
        .unwrap()
    }

    /// A namespace's quota on the quantity in GPUs beside what gpu-share holds for it; quotas on
    /// other things are left out; a namespace with GPUs and no quota is listed too.
    #[test]
    fn namespaces_with_their_quotas_in_gpus() {
        let quotas = [
            quota(
                "team-a",
                "gpus",
                json!({QUOTA_RESOURCE: "1500"}),
                json!({QUOTA_RESOURCE: "1178"}),
            ),
            quota(
                "team-a",
                "cpu",
                json!({"requests.cpu": "10"}),
                json!({"requests.cpu": "2"}),
            ),
            quota("team-c", "gpus", json!({QUOTA_RESOURCE: "2k"}), json!({})),
        ];
        let held = [
            ("team-a", 0.25),
            ("team-a", 0.5),
            ("team-a", 0.43),
            ("team-b", 2.0),
        ];
        let out = by_namespace(held, &quotas);
        assert_eq!(
            out.iter().map(|u| u.namespace.as_str()).collect::<Vec<_>>(),
            ["team-a", "team-b", "team-c"]
        );
        assert_eq!(out[0].held_gpus, 1.18);
        assert_eq!(out[0].pods, 3);
        assert_eq!(
            out[0].quotas,
            [QuotaUse {
                name: "gpus".into(),
                hard_gpus: 1.5,
                used_gpus: Some(1.18)
            }]
        );
        assert_eq!(out[0].note(), None, "the counts agree");
        assert_eq!(out[0].fullest().map(|f| (f * 100.0).round()), Some(79.0));
        assert!(out[1].quotas.is_empty());
        assert_eq!(out[1].note(), None, "no quota");
        assert_eq!(out[2].quotas[0].hard_gpus, 2.0);
        assert_eq!(out[2].quotas[0].used_gpus, None, "not counted yet");
    }

    /// Pods without the quantity are held and not counted; pods counted and waiting the other
    /// way round: each said in words.
    #[test]
    fn counts_that_differ_are_explained() {
        let q = [quota(
            "ml",
            "gpus",
            json!({QUOTA_RESOURCE: "4000"}),
            json!({QUOTA_RESOURCE: "1000"}),
        )];
        let out = by_namespace([("ml", 1.0), ("ml", 0.25)], &q);
        let note = out[0].note().unwrap();
        assert!(
            note.starts_with("0.25 GPUs held by pods that carry no gpu-share.io/gpu-milli"),
            "{note}"
        );
        let out = by_namespace([("ml", 0.5)], &q);
        assert_eq!(
            out[0].note().as_deref(),
            Some("0.5 GPUs counted for pods that wait for a node")
        );
    }
}

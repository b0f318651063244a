//! The types of `k8s.io/kube-scheduler/extender/v1`, exactly as kube-scheduler marshals them: the
//! Go types have no JSON tags, so the wire names are the Go field names (PascalCase, with `PodUID`,
//! `UID`, `NumPDBViolations`), nothing is omitted (absent values are `null`), and incoming names
//! match case-insensitively, as Go's decoder does. Embedded Pods and Nodes are ordinary
//! Kubernetes JSON from the scheduler's informer cache, usually without `apiVersion`/`kind`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Filter and prioritize request. `Nodes` is set when the extender is not `nodeCacheCapable`,
/// `NodeNames` when it is; the other is `null`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderArgs {
    pub pod: Option<Pod>,
    pub nodes: Option<NodeList>,
    pub node_names: Option<Vec<String>>,
}

/// A `v1.NodeList`; items are kept as received so a filter reply can echo them unchanged.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct NodeList {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub items: Vec<Value>,
}

fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Value>, D::Error> {
    Ok(Option::<Vec<Value>>::deserialize(d)?.unwrap_or_default())
}

/// Filter reply.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderFilterResult {
    pub nodes: Option<NodeList>,
    pub node_names: Option<Vec<String>>,
    pub failed_nodes: Option<NodeReasons>,
    pub failed_and_unresolvable_nodes: Option<NodeReasons>,
    pub error: String,
}

impl PartialEq for NodeList {
    fn eq(&self, other: &Self) -> bool {
        self.items == other.items
    }
}

/// Go's `map[string]string` of node name to reason, kept as a list: filter fills it node by node
/// (thousands of them), and a sorted map would cost more than the list it serializes the same as.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeReasons(pub Vec<(String, std::borrow::Cow<'static, str>)>);

impl NodeReasons {
    pub fn with_capacity(n: usize) -> Self {
        NodeReasons(Vec::with_capacity(n))
    }

    pub fn push(&mut self, node: String, reason: std::borrow::Cow<'static, str>) {
        self.0.push((node, reason));
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The reason given for a node.
    pub fn get(&self, node: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n == node)
            .map(|(_, r)| r.as_ref())
    }
}

impl<const N: usize> From<[(String, String); N]> for NodeReasons {
    fn from(pairs: [(String, String); N]) -> Self {
        NodeReasons(pairs.into_iter().map(|(n, r)| (n, r.into())).collect())
    }
}

impl Serialize for NodeReasons {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(n, r)| (n, r)))
    }
}

impl<'de> Deserialize<'de> for NodeReasons {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = BTreeMap::<String, String>::deserialize(d)?;
        Ok(NodeReasons(
            map.into_iter().map(|(n, r)| (n, r.into())).collect(),
        ))
    }
}

/// One prioritize score; the reply is a top-level array of these.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct HostPriority {
    pub host: String,
    pub score: i64,
}

/// Bind request.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderBindingArgs {
    #[serde(default)]
    pub pod_name: String,
    #[serde(default)]
    pub pod_namespace: String,
    #[serde(rename = "PodUID", default)]
    pub pod_uid: String,
    #[serde(default)]
    pub node: String,
}

/// Bind reply.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderBindingResult {
    pub error: String,
}

/// Preempt request: `NodeNameToVictims` when not `nodeCacheCapable`, `NodeNameToMetaVictims`
/// when it is.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderPreemptionArgs {
    pub pod: Option<Pod>,
    pub node_name_to_victims: Option<BTreeMap<String, Option<Victims>>>,
    pub node_name_to_meta_victims: Option<BTreeMap<String, Option<MetaVictims>>>,
}

/// Preempt reply: always the Meta form.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderPreemptionResult {
    pub node_name_to_meta_victims: Option<BTreeMap<String, MetaVictims>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Victims {
    pub pods: Option<Vec<Option<Pod>>>,
    #[serde(rename = "NumPDBViolations", default)]
    pub num_pdb_violations: i64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct MetaVictims {
    pub pods: Option<Vec<Option<MetaPod>>>,
    #[serde(rename = "NumPDBViolations", default)]
    pub num_pdb_violations: i64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct MetaPod {
    #[serde(rename = "UID", default)]
    pub uid: String,
}

/// Renames object keys that match one of `names` case-insensitively to that exact name (Go's
/// decoder prefers an exact match, then takes a case-insensitive one).
fn canonicalize(v: &mut Value, names: &[&str]) {
    let Value::Object(map) = v else { return };
    for name in names {
        if map.contains_key(*name) {
            continue;
        }
        if let Some(k) = map.keys().find(|k| k.eq_ignore_ascii_case(name)).cloned()
            && let Some(val) = map.remove(&k)
        {
            map.insert((*name).to_string(), val);
        }
    }
}

fn canonicalize_victims(v: &mut Value, meta: bool) {
    let Value::Object(map) = v else { return };
    for victims in map.values_mut() {
        canonicalize(victims, &["Pods", "NumPDBViolations"]);
        if meta && let Some(Value::Array(pods)) = victims.get_mut("Pods") {
            for p in pods {
                canonicalize(p, &["UID"]);
            }
        }
    }
}

/// Why a body could not be read (the reply is HTTP 400 with this text).
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("body is not JSON: {0}")]
    NotJson(serde_json::Error),
    #[error("body is not a JSON object")]
    NotObject,
    #[error("body is not {what}: {source}")]
    Shape {
        what: &'static str,
        source: serde_json::Error,
    },
}

fn parse_value(body: &[u8]) -> Result<Value, WireError> {
    let v: Value = serde_json::from_slice(body).map_err(WireError::NotJson)?;
    if !v.is_object() {
        return Err(WireError::NotObject);
    }
    Ok(v)
}

fn shape<T: serde::de::DeserializeOwned>(v: Value, what: &'static str) -> Result<T, WireError> {
    serde_json::from_value(v).map_err(|source| WireError::Shape { what, source })
}

/// Reads a filter/prioritize body.
pub fn parse_args(body: &[u8]) -> Result<ExtenderArgs, WireError> {
    // Fast path: kube-scheduler's own body (exact Go field names) straight into the struct,
    // without the intermediate tree. Anything else, or a body where that finds no pod or no
    // nodes (another spelling of the keys), takes the case-insensitive path below.
    if let Ok(a) = serde_json::from_slice::<ExtenderArgs>(body)
        && a.pod.is_some()
        && (a.nodes.is_some() || a.node_names.is_some())
    {
        return Ok(a);
    }
    let mut v = parse_value(body)?;
    canonicalize(&mut v, &["Pod", "Nodes", "NodeNames"]);
    shape(v, "ExtenderArgs")
}

/// Reads a bind body.
pub fn parse_binding(body: &[u8]) -> Result<ExtenderBindingArgs, WireError> {
    let mut v = parse_value(body)?;
    canonicalize(&mut v, &["PodName", "PodNamespace", "PodUID", "Node"]);
    shape(v, "ExtenderBindingArgs")
}

/// Reads a preempt body.
pub fn parse_preemption(body: &[u8]) -> Result<ExtenderPreemptionArgs, WireError> {
    let mut v = parse_value(body)?;
    canonicalize(
        &mut v,
        &["Pod", "NodeNameToVictims", "NodeNameToMetaVictims"],
    );
    if let Some(x) = v.get_mut("NodeNameToVictims") {
        canonicalize_victims(x, false);
    }
    if let Some(x) = v.get_mut("NodeNameToMetaVictims") {
        canonicalize_victims(x, true);
    }
    shape(v, "ExtenderPreemptionArgs")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_shaped_filter_args_with_nulls() {
        let body = br#"{"Pod":{"metadata":{"name":"p","namespace":"ml","uid":"u-1"},"spec":{"containers":[{"name":"c"}]},"status":{}},"Nodes":null,"NodeNames":["a","b"]}"#;
        let a = parse_args(body).unwrap();
        assert_eq!(a.node_names.unwrap(), vec!["a", "b"]);
        assert!(a.nodes.is_none());
        assert_eq!(a.pod.unwrap().metadata.uid.as_deref(), Some("u-1"));
    }

    #[test]
    fn lower_case_names_decode_like_go() {
        let body = br#"{"pod":{"metadata":{"name":"p"}},"nodes":{"items":[{"metadata":{"name":"a"}}]},"nodenames":null}"#;
        let a = parse_args(body).unwrap();
        assert_eq!(a.nodes.unwrap().items.len(), 1);
        // Exact and other spellings mixed: the exact key wins, the others are still read.
        let body = br#"{"Pod":{"metadata":{"name":"exact"}},"pod":{"metadata":{"name":"other"}},"Nodes":null,"nodeNames":["a"]}"#;
        let a = parse_args(body).unwrap();
        assert_eq!(a.pod.unwrap().metadata.name.as_deref(), Some("exact"));
        assert_eq!(a.node_names.unwrap(), vec!["a"]);
        let b = parse_binding(br#"{"podName":"p","podNamespace":"ml","podUID":"u","node":"a"}"#)
            .unwrap();
        assert_eq!(b.pod_uid, "u");
        assert_eq!(b.node, "a");
        let p = parse_preemption(
            br#"{"pod":null,"nodeNameToMetaVictims":{"a":{"pods":[{"uid":"v"}],"numPDBViolations":1}}}"#,
        )
        .unwrap();
        let mv = p.node_name_to_meta_victims.unwrap();
        let a = mv["a"].as_ref().unwrap();
        assert_eq!(a.pods.as_ref().unwrap()[0].as_ref().unwrap().uid, "v");
        assert_eq!(a.num_pdb_violations, 1);
    }

    #[test]
    fn replies_use_go_field_names() {
        let r = ExtenderFilterResult {
            node_names: Some(vec!["a".into()]),
            failed_nodes: Some([("b".to_string(), "x".to_string())].into()),
            failed_and_unresolvable_nodes: Some(NodeReasons::default()),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"Nodes":null,"NodeNames":["a"],"FailedNodes":{"b":"x"},"FailedAndUnresolvableNodes":{},"Error":""}"#
        );
        assert_eq!(
            serde_json::to_string(&[HostPriority {
                host: "a".into(),
                score: 10
            }])
            .unwrap(),
            r#"[{"Host":"a","Score":10}]"#
        );
        let p = ExtenderPreemptionResult {
            node_name_to_meta_victims: Some(
                [(
                    "b".to_string(),
                    MetaVictims {
                        pods: Some(vec![Some(MetaPod { uid: "v".into() })]),
                        num_pdb_violations: 0,
                    },
                )]
                .into(),
            ),
        };
        assert_eq!(
            serde_json::to_string(&p).unwrap(),
            r#"{"NodeNameToMetaVictims":{"b":{"Pods":[{"UID":"v"}],"NumPDBViolations":0}}}"#
        );
        assert_eq!(
            serde_json::to_string(&ExtenderBindingResult::default()).unwrap(),
            r#"{"Error":""}"#
        );
    }

    #[test]
    fn bad_bodies_say_why() {
        assert!(matches!(parse_args(b"nope"), Err(WireError::NotJson(_))));
        assert!(matches!(parse_args(b"[1]"), Err(WireError::NotObject)));
        assert!(matches!(
            parse_args(br#"{"NodeNames": 3}"#),
            Err(WireError::Shape { .. })
        ));
    }
}

//! PURE: Kubernetes objects from a file's text, the way `kubectl` writes them: one JSON object,
//! a JSON array, a YAML stream (`---`-separated), or a `List` (`items`), in any combination.
//! The extender's `--nodes` file and the simulator's node and pod inputs read through this.

use serde::de::DeserializeOwned;
use serde_json::Value;

/// Why a file's text is not the objects asked for.
#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    #[error("not YAML or JSON: {0}")]
    Syntax(#[source] Box<serde_saphyr::Error>),
    /// `what` names the object: its `metadata.name`, quoted, or its position.
    #[error("{what} is not a {kind}: {source}")]
    NotA {
        what: String,
        kind: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

/// The objects in `text`: streams, arrays and `items` lists flattened; empty documents dropped.
pub fn objects(text: &str) -> Result<Vec<Value>, DocumentError> {
    let docs: Vec<Value> = match serde_json::from_str::<Value>(text) {
        Ok(v) => vec![v],
        Err(_) => serde_saphyr::from_multiple_with_options::<Value>(text, yaml_options(text.len()))
            .map_err(|e| DocumentError::Syntax(Box::new(e)))?,
    };
    let mut out = Vec::new();
    for d in docs {
        match d {
            Value::Null => {}
            Value::Array(items) => out.extend(items),
            Value::Object(mut o) if o.get("items").is_some_and(Value::is_array) => {
                if let Some(Value::Array(items)) = o.remove("items") {
                    out.extend(items);
                }
            }
            other => out.push(other),
        }
    }
    Ok(out)
}

/// The YAML parser's limits for an input of `len` bytes. Its defaults (250,000 nodes, 1,024
/// documents, 64 MiB of scalars) stop short of what `kubectl get nodes -o yaml` prints for a
/// 5,000-node cluster, so the counts scale with the input, which is already in memory: a YAML
/// node or document takes at least a byte. The limits on aliases and anchors (what makes a
/// small YAML expand without bound) stay as they are.
fn yaml_options(len: usize) -> serde_saphyr::Options {
    let mut b = serde_saphyr::Budget::default();
    b.max_reader_input_bytes = b.max_reader_input_bytes.map(|m| m.max(len));
    b.max_events = b.max_events.max(len.saturating_mul(2));
    b.max_nodes = b.max_nodes.max(len);
    b.max_documents = b.max_documents.max(len / 8);
    b.max_total_scalar_bytes = b.max_total_scalar_bytes.max(len);
    let mut o = serde_saphyr::Options::default();
    o.budget = Some(b);
    o
}

/// The objects in `text` as `T`; an object that is not one is named (by `metadata.name`, else
/// its position) in the error, with `kind`.
pub fn typed<T: DeserializeOwned>(text: &str, kind: &'static str) -> Result<Vec<T>, DocumentError> {
    objects(text)?
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            let what = v
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .map_or_else(|| format!("item {i}"), |n| format!("{n:?}"));
            serde_json::from_value(v).map_err(|source| DocumentError::NotA { what, kind, source })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;

    /// A YAML NodeList the size of a 5,000-node cluster's `kubectl get nodes -o yaml` (over the
    /// parser's default 250,000 nodes), and a `---` stream of 5,000 documents (over its default
    /// 1,024), both read.
    #[test]
    fn a_large_cluster_in_yaml_is_read() {
        let node = |i: usize| {
            let labels: String = (0..40)
                .map(|k| format!("        example.com/label-{k}: value-{k}\n"))
                .collect();
            format!(
                "  metadata:\n    name: gpu-{i}\n    labels:\n{labels}        nvidia.com/gpu.product: NVIDIA-L4\n        nvidia.com/gpu.count: \"8\"\n  status:\n    allocatable:\n      nvidia.com/gpu: \"8\"\n"
            )
        };
        let list: String = (0..5000)
            .map(|i| format!("- apiVersion: v1\n  kind: Node\n{}", node(i)))
            .collect();
        let text = format!("apiVersion: v1\nkind: List\nitems:\n{list}");
        let nodes: Vec<Node> = typed(&text, "Node").unwrap();
        assert_eq!(nodes.len(), 5000);
        let stream: String = (0..5000)
            .map(|i| {
                let body: String = node(i).lines().map(|l| format!("{}\n", &l[2..])).collect();
                format!("---\napiVersion: v1\nkind: Node\n{body}")
            })
            .collect();
        assert_eq!(objects(&stream).unwrap().len(), 5000);
        // Alias expansion stays bounded.
        let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        for l in 1..9 {
            let prev = (b'a' + l - 1) as char;
            let cur = (b'a' + l) as char;
            bomb += &format!(
                "{cur}: &{cur} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
            );
        }
        assert!(objects(&bomb).is_err());
    }

    #[test]
    fn streams_lists_and_arrays_flatten() {
        let yaml = "kind: List\nitems: [{metadata: {name: a}}, {metadata: {name: b}}]\n---\n---\nmetadata: {name: c}\n";
        let names: Vec<String> = typed::<Node>(yaml, "Node")
            .unwrap()
            .into_iter()
            .map(|n| n.metadata.name.unwrap())
            .collect();
        assert_eq!(names, ["a", "b", "c"]);
        let json = r#"[{"metadata": {"name": "x"}}, {"metadata": {"name": "y"}}]"#;
        assert_eq!(typed::<Node>(json, "Node").unwrap().len(), 2);
        let e = typed::<Node>("- metadata: {name: bad}\n  spec: 3\n", "Node")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("\"bad\" is not a Node"), "{e}");
        assert!(
            objects("{unclosed")
                .unwrap_err()
                .to_string()
                .contains("not YAML or JSON")
        );
    }
}

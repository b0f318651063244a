//! PURE: Kubernetes objects from a file's text, the way `kubectl` writes them: one JSON object,
//! a JSON array, a YAML stream (`---`-separated), or a `List` (`items`), in any combination.
//! The extender's `--nodes` file and the simulator's node and pod inputs read through this.

use serde::de::DeserializeOwned;
use serde_json::Value;

/// The objects in `text`: streams, arrays and `items` lists flattened; empty documents dropped.
pub fn objects(text: &str) -> Result<Vec<Value>, String> {
    let docs: Vec<Value> = match serde_json::from_str::<Value>(text) {
        Ok(v) => vec![v],
        Err(_) => serde_saphyr::from_multiple::<Value>(text)
            .map_err(|e| format!("not YAML or JSON: {e}"))?,
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

/// The objects in `text` as `T`; an object that is not one is named (by `metadata.name`, else
/// its position) in the error, with `kind`.
pub fn typed<T: DeserializeOwned>(text: &str, kind: &str) -> Result<Vec<T>, String> {
    objects(text)?
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            let what = v
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .map_or_else(|| format!("item {i}"), |n| format!("{n:?}"));
            serde_json::from_value(v).map_err(|e| format!("{what} is not a {kind}: {e}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;

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
        let e = typed::<Node>("- metadata: {name: bad}\n  spec: 3\n", "Node").unwrap_err();
        assert!(e.starts_with("\"bad\" is not a Node"), "{e}");
        assert!(
            objects("{unclosed")
                .unwrap_err()
                .contains("not YAML or JSON")
        );
    }
}

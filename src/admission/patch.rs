//! A JSON Patch being built: `add` operations at JSON Pointer paths.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation};
use serde_json::Value;

#[derive(Default)]
/// The operations of a patch, in order.
pub(super) struct PatchBuilder {
    pub(super) ops: Vec<PatchOperation>,
    /// Arrays this patch created (their paths): a later append goes to their end, never
    /// replaces them.
    created: Vec<PointerBuf>,
}

impl PatchBuilder {
    /// Adds `value` at the path of `tokens` (an `add` on an existing member replaces it).
    pub(super) fn add(&mut self, tokens: &[&str], value: Value) {
        self.ops.push(PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(tokens.iter().copied()),
            value,
        }));
    }

    /// Appends `items` to the array at `tokens`: created whole where neither the object
    /// (`exists`) nor an earlier step of this patch has it, else one `add .../-` per item (two
    /// steps that each created the array would leave only the second's items).
    pub(super) fn append(&mut self, tokens: &[&str], exists: bool, items: Vec<Value>) {
        if items.is_empty() {
            return;
        }
        let path = PointerBuf::from_tokens(tokens.iter().copied());
        if !exists && !self.created.contains(&path) {
            self.created.push(path);
            self.add(tokens, Value::Array(items));
        } else {
            for item in items {
                self.add(&[tokens, &["-"]].concat(), item);
            }
        }
    }
}

//! A JSON Patch being built: `add` operations at JSON Pointer paths.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation};
use serde_json::Value;

#[derive(Default)]
/// The operations of a patch, in order.
pub(super) struct PatchBuilder {
    pub(super) ops: Vec<PatchOperation>,
}

impl PatchBuilder {
    /// Adds `value` at the path of `tokens` (an `add` on an existing member replaces it).
    pub(super) fn add(&mut self, tokens: &[&str], value: Value) {
        self.ops.push(PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(tokens.iter().copied()),
            value,
        }));
    }
}

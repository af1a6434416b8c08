//! Usage accounting across the model calls of a run, per model id.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::Usage;

/// Tokens used by a run: the total and the split per model id.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "wasm-core", derive(tsify::Tsify))]
#[serde(rename_all = "camelCase")]
pub struct RunUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    #[cfg_attr(feature = "wasm-core", tsify(type = "Record<string, Usage>"))]
    pub by_model: BTreeMap<String, Usage>,
}

impl RunUsage {
    pub fn record(&mut self, model_id: &str, usage: Usage) {
        self.input_tokens += usage.input_tokens;
        self.output_tokens += usage.output_tokens;
        self.by_model.entry(model_id.to_string()).or_default().add(usage);
    }
}

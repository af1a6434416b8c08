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
    /// Adds one model call's counts, saturating as [`Usage::add`] does.
    pub fn record(&mut self, model_id: &str, usage: Usage) {
        self.input_tokens = self.input_tokens.saturating_add(usage.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(usage.output_tokens);
        self.by_model.entry(model_id.to_string()).or_default().add(usage);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_total_saturates_instead_of_wrapping() {
        let mut run = RunUsage::default();
        run.record("a", Usage { input_tokens: u64::MAX - 1, output_tokens: 1 });
        run.record("b", Usage { input_tokens: 3, output_tokens: 1 });
        assert_eq!((run.input_tokens, run.output_tokens), (u64::MAX, 2));
        assert_eq!(run.by_model["b"].input_tokens, 3);
    }
}

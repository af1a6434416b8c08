//! Usage accounting across the model calls of a run, per model id.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use serde::{Deserialize, Serialize};

use crate::model::Usage;

/// Tokens used by a run: the total and the split per model id. Every model call the run made
/// counts: its own turns, and the forge judge's reviews of its `forge_tool` calls (under the
/// judge's model id).
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

    /// Adds every model's counts of `other` (the calls a run's tools made for it).
    pub fn merge(&mut self, other: RunUsage) {
        for (model_id, usage) in other.by_model {
            self.record(&model_id, usage);
        }
    }
}

/// Where a run's tool calls record the model calls they make for it (the forge's judge, for a
/// `forge_tool` call): shared, as the calls of a step run at once while the run's state is
/// only read. The run adds what was recorded to its [`RunUsage`] once the step's calls end.
#[derive(Debug, Clone, Default)]
pub struct UsageRecorder(Rc<RefCell<RunUsage>>);

impl UsageRecorder {
    /// Records one model call's counts under `model_id`.
    pub fn record(&self, model_id: &str, usage: Usage) {
        self.0.borrow_mut().record(model_id, usage);
    }

    /// What was recorded so far, leaving the recorder empty.
    pub fn take(&self) -> RunUsage {
        self.0.take()
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

    #[test]
    fn merging_what_calls_recorded_adds_it_per_model() {
        let mut run = RunUsage::default();
        run.record("main", Usage { input_tokens: 10, output_tokens: 2 });
        let recorder = UsageRecorder::default();
        recorder.record("judge", Usage { input_tokens: 1200, output_tokens: 150 });
        recorder.record("main", Usage { input_tokens: 1, output_tokens: 1 });
        run.merge(recorder.take());
        assert_eq!((run.input_tokens, run.output_tokens), (1211, 153));
        assert_eq!(run.by_model["judge"], Usage { input_tokens: 1200, output_tokens: 150 });
        assert_eq!(run.by_model["main"], Usage { input_tokens: 11, output_tokens: 3 });
        assert_eq!(recorder.take(), RunUsage::default());
    }
}

//! Agent configuration and its defaults.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::ToolChoice;

use super::history::HistoryLimits;

/// How an agent runs. Deserialized from the TS `createAgent` options (camelCase).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AgentConfig {
    /// System instructions, sent first in every model call.
    pub instructions: String,
    /// Most model turns in one run.
    pub max_turns: u32,
    /// Most tool calls across all turns of one run.
    pub max_steps: u32,
    /// Most tool calls of one step executing at once.
    pub max_parallel_tools: usize,
    /// Largest serialized tool result passed back to the model.
    pub max_result_bytes: usize,
    /// JSON Schema the final answer must match; the loop re-prompts when it does not.
    pub returns: Option<Value>,
    /// Re-prompts allowed for a final answer that fails `returns`.
    pub max_output_retries: u32,
    pub temperature: Option<f64>,
    pub max_tokens: Option<u32>,
    /// Whether the model may, must or must not call a tool; absent is the provider's `auto`.
    pub tool_choice: Option<ToolChoice>,
    /// After the run's first tool call, later turns go back to `auto` (default `true`): a
    /// `required` choice kept for every turn would never let the model answer.
    pub reset_tool_choice: bool,
    /// How much of each session's conversation is kept (default: 8 MiB of JSON, any count).
    pub session_history: HistoryLimits,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            instructions: String::new(),
            max_turns: 30,
            max_steps: 30,
            max_parallel_tools: 8,
            max_result_bytes: 64 * 1024,
            returns: None,
            max_output_retries: 2,
            temperature: None,
            max_tokens: None,
            tool_choice: None,
            reset_tool_choice: true,
            session_history: HistoryLimits::default(),
        }
    }
}

impl AgentConfig {
    /// Rejects settings that would make every run fail.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_turns == 0 {
            return Err("maxTurns must be at least 1".into());
        }
        if self.max_parallel_tools == 0 {
            return Err("maxParallelTools must be at least 1".into());
        }
        if self.max_result_bytes == 0 {
            return Err("maxResultBytes must be at least 1".into());
        }
        // Providers refuse these, each with its own message, on every turn.
        if self.temperature.is_some_and(|t| !(t.is_finite() && t >= 0.0)) {
            return Err("temperature must be a finite number, 0 or more".into());
        }
        if self.max_tokens == Some(0) {
            return Err("maxTokens must be at least 1".into());
        }
        if matches!(&self.tool_choice, Some(ToolChoice::Tool(name)) if name.is_empty()) {
            return Err("toolChoice { tool } must name a tool".into());
        }
        self.session_history.validate()
    }
}

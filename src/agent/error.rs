//! Why a run failed. Tool failures are not here: they become results the model sees.

use crate::model::ModelError;
use crate::store::StoreError;

use super::events::ErrorInfo;

/// A run-ending failure, with a stable [`AgentError::code`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AgentError {
    /// `calls_not_run`: tool calls the model asked for on the last turn, left unexecuted
    /// because no turn was left to give the model their results.
    #[error("the run used all {max} model turns without a final answer{}", not_run(*calls_not_run))]
    MaxTurnsExceeded { max: u32, calls_not_run: u32 },
    /// `calls_not_run`: the calls of the answer that would have passed `max`, none of them run
    /// (a step runs whole or not at all); `ran`: the calls run before it.
    #[error("the run asked for more than {max} tool calls: {ran} ran, and {} of its last answer {} not run", calls(*calls_not_run), if *calls_not_run == 1 { "was" } else { "were" })]
    MaxStepsExceeded { max: u32, ran: u32, calls_not_run: u32 },
    #[error("the final answer does not match the `returns` schema after {attempts} attempts: {reason}")]
    StructuredOutputInvalid { attempts: u32, reason: String },
    #[error("model call failed: {0}")]
    Model(ModelError),
    #[error("the run was aborted")]
    Aborted,
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    #[error("cannot resume: {0}")]
    InvalidResume(String),
    #[error("run state could not be encoded or decoded: {0}")]
    InvalidState(String),
    #[error("store failed: {0}")]
    Store(StoreError),
    #[error("the host's check of the final answer failed: {0}")]
    OutputCheck(String),
}

impl AgentError {
    /// Stable machine-readable code (mirrored by the TS error classes).
    pub fn code(&self) -> String {
        match self {
            Self::MaxTurnsExceeded { .. } => "max_turns_exceeded".into(),
            Self::MaxStepsExceeded { .. } => "max_steps_exceeded".into(),
            Self::StructuredOutputInvalid { .. } => "structured_output_invalid".into(),
            Self::Model(e) => e.code.clone(),
            Self::Aborted => "aborted".into(),
            Self::InvalidConfig(_) => "invalid_config".into(),
            Self::InvalidResume(_) => "invalid_resume".into(),
            Self::InvalidState(_) => "invalid_state".into(),
            Self::Store(e) => e.code.clone(),
            Self::OutputCheck(_) => "output_check_failed".into(),
        }
    }

    pub fn info(&self) -> ErrorInfo {
        let status = match self {
            Self::Model(e) => e.status,
            _ => None,
        };
        ErrorInfo { code: self.code(), message: self.to_string(), status }
    }
}

/// `n` tool calls, in words, for the max-steps message.
fn calls(n: u32) -> String {
    if n == 1 {
        "the 1 tool call".into()
    } else {
        format!("the {n} tool calls")
    }
}

/// The part of the max-turns message about calls left unexecuted: a caller must know a
/// side-effecting call (a refund) did not happen.
fn not_run(calls: u32) -> String {
    match calls {
        0 => String::new(),
        1 => "; the 1 tool call its last answer asked for was not run (no turn was left for its result)".into(),
        n => format!("; the {n} tool calls its last answer asked for were not run (no turn was left for their results)"),
    }
}

impl From<ModelError> for AgentError {
    fn from(e: ModelError) -> Self {
        if e.is_abort() {
            Self::Aborted
        } else {
            Self::Model(e)
        }
    }
}

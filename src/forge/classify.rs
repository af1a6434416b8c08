//! Rejection categories (spec scope item 8) and the rule that picks one: the evidence a
//! rejected forge gathered is classified most specific first — `schema_extra_field`,
//! `shape_check`, `syntax_error`, `parse_error`, `judge_correctness`, then `other`.

use serde::{Deserialize, Serialize};

/// Why a forge was rejected (the TS `RejectionCategory`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "wasm-core", derive(tsify::Tsify))]
#[serde(rename_all = "snake_case")]
pub enum RejectionCategory {
    SchemaExtraField,
    ShapeCheck,
    SyntaxError,
    ParseError,
    JudgeCorrectness,
    Other,
}

impl RejectionCategory {
    /// Every category, most specific first.
    pub const ALL: [RejectionCategory; 6] =
        [Self::SchemaExtraField, Self::ShapeCheck, Self::SyntaxError, Self::ParseError, Self::JudgeCorrectness, Self::Other];

    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SchemaExtraField => "schema_extra_field",
            Self::ShapeCheck => "shape_check",
            Self::SyntaxError => "syntax_error",
            Self::ParseError => "parse_error",
            Self::JudgeCorrectness => "judge_correctness",
            Self::Other => "other",
        }
    }
}

/// What a rejected attempt showed. Several facts can hold at once; [`classify`] picks one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Evidence {
    /// A test input has a field the declared input schema forbids (`additionalProperties: false`).
    pub extra_field: bool,
    /// The request's shape is unusable (empty schemas, too few tests, empty test inputs).
    pub shape: bool,
    /// The sandbox refused the code (status `rejected`) or reported a syntax error.
    pub syntax: bool,
    /// The request could not be parsed or normalized.
    pub parse: bool,
    /// The judge rejected the tool for correctness.
    pub judge_correctness: bool,
}

/// The most specific category the evidence supports.
pub fn classify(e: &Evidence) -> RejectionCategory {
    if e.extra_field {
        RejectionCategory::SchemaExtraField
    } else if e.shape {
        RejectionCategory::ShapeCheck
    } else if e.syntax {
        RejectionCategory::SyntaxError
    } else if e.parse {
        RejectionCategory::ParseError
    } else if e.judge_correctness {
        RejectionCategory::JudgeCorrectness
    } else {
        RejectionCategory::Other
    }
}

/// Whether an execution error reads as a syntax error: the sandbox's `sandbox_rejected` code
/// (static validation failed) or a `SyntaxError` message.
pub fn is_syntax_error(error: &str) -> bool {
    let lower = error.to_ascii_lowercase();
    lower.starts_with("sandbox_rejected") || lower.contains("syntaxerror") || lower.contains("syntax error") || lower.contains("unexpected token")
}

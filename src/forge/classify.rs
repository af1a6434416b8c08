//! Rejection categories (spec scope item 8) and the rule that picks one: the evidence a
//! rejected forge gathered is classified most specific first — `schema_extra_field`,
//! `shape_check`, `syntax_error`, `parse_error`, `judge_correctness`, then `other`.
//! `schema_extra_field` is a field the schemas do not declare where it broke something: a test
//! input's against a closed input schema (before anything runs), or a failed test's output
//! field that the output schema forbids or the expected output does not have.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::testing::{extra_output_fields, TestResult};

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
    /// A test input has a field the declared input schema forbids (`additionalProperties: false`),
    /// or a test failed on an output field the output schema does not declare.
    pub extra_field: bool,
    /// The request's shape is unusable (empty schemas, too few tests, empty test inputs).
    pub shape: bool,
    /// The sandbox refused the code (status `rejected`) or reported a syntax error.
    pub syntax: bool,
    /// The request could not be parsed or normalized, or the judge's answer held no verdict
    /// that could be read.
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

/// Whether a forge test failed on a field its output has and its output schema does not
/// declare (see [`extra_output_fields`]): `schema_extra_field`, as an undeclared test input
/// field against a closed input schema is.
pub(crate) fn shows_extra_output_field(output_schema: &Value, test: &TestResult) -> bool {
    !test.passed && test.actual_output.as_ref().is_some_and(|actual| !extra_output_fields(output_schema, actual, test.expected_output.as_ref()).is_empty())
}

/// Whether a forge-test failure shows that the code does not parse as a sandbox script: the
/// sandbox refused it before running with `syntax` or `module_syntax`. Its other refusals (a
/// blocked name such as `eval`, an API the tool may not use, code too large or too deeply
/// nested) are policy, not syntax, and so is a `SyntaxError` the code throws while running
/// (`JSON.parse` of bad text): those are `other`.
pub fn is_syntax_error(error: &str) -> bool {
    error.strip_prefix("sandbox_rejected: ").is_some_and(|refusal| refusal.starts_with("syntax:") || refusal.starts_with("module_syntax:"))
}

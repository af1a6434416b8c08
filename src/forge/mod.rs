//! Emergent tools, part one: the forge (issue 4, DESIGN decision 6). A model asks for a tool
//! with `forge_tool`; the forge normalizes the request, infers missing schemas, checks its
//! shape, builds it (compose pipeline or sandboxed code), runs every test, and has a judge
//! review it. Only a verified tool reaches the registry (`crate::registry`).

mod classify;
mod compose;
mod infer;
mod judge;
mod meta_tool;
mod pipeline;
mod prompt;
mod request;
mod sandboxed;
mod shape;
mod stats;
mod testing;

pub use classify::{classify, is_syntax_error, Evidence, RejectionCategory};
pub use compose::{
    denied_without_approval, ComposeBuildError, ComposeHandler, PipelineBudget, MAX_COMPOSE_DEPTH, MAX_COMPOSE_STEPS, MAX_PIPELINE_DATA_BYTES,
    MAX_PIPELINE_STEPS,
};
pub use infer::{infer_object_schema, infer_schemas, lacks_properties};
pub use judge::{
    ask as ask_judge, check_coherent, parse_verdict, review_prompt, verdict_schema, JudgeError, JudgeUsage, Judged, ReviewKind, Verdict, APPROVAL_MIN_SCORE,
    CORRECTNESS_REJECTION_BELOW, REASONING_MAX_CHARS,
};
pub use meta_tool::ForgeToolHandler;
pub use pipeline::{Admission, Checked, Forge, ForgeResult, Kept, Rejection, Verified};
pub use prompt::{forge_tool_advertised_schema, forge_tool_definition, forge_tool_description, FORGE_TOOL_DESCRIPTION, FORGE_TOOL_EXAMPLE, FORGE_TOOL_NAME};
pub use request::{
    normalize, scope_label, ComposeStep, ForgeOrigin, ForgeRequest, ForgeTestCase, Implementation, NormalizeError, MAX_SCOPE_CHARS, TEST_CASE_KEYS,
};
pub(crate) use request::{snake_name, type_name};
pub use sandboxed::{effective_allowlist, failure_code, SandboxToolHandler, UNAVAILABLE_CODE};
pub use shape::{
    oversized_request_text, shape_check, ShapeIssues, MAX_DESCRIPTION_CHARS, MAX_REQUEST_BYTES, MAX_REQUEST_TEXT_BYTES, MAX_SCHEMA_BYTES, MAX_TEST_CASES,
    MIN_TEST_CASES,
};
pub use stats::{ForgeStats, ForgeStatsAggregator};
pub use testing::{failure_reason as test_failure_reason, outputs_equal, run_test, run_tests, TestResult, NUMBER_TOLERANCE};

pub(crate) use crate::tools::shorten;

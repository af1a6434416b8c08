//! The shape check (spec scope item 3): cheap structural checks that run before anything is
//! built or judged, so a malformed request never costs a judge call. Empty schema properties,
//! fewer than [`MIN_TEST_CASES`] or more than [`MAX_TEST_CASES`] test cases and test cases with
//! empty input are `shape_check` rejections; a test input with a field the declared input schema forbids
//! (`additionalProperties: false`) is `schema_extra_field`.

use serde_json::Value;

use super::classify::Evidence;
use super::infer::lacks_properties;
use super::request::ForgeRequest;

/// Fewest test cases a forge request must carry.
pub const MIN_TEST_CASES: usize = 2;

/// Most test cases a forge request may carry: every one runs (in the sandbox, each up to its
/// deadline) and goes into the judge's prompt.
pub const MAX_TEST_CASES: usize = 32;

/// A failed shape check: the reason (all problems found) and the evidence for classification.
#[derive(Debug, Clone, PartialEq)]
pub struct ShapeIssues {
    pub reasons: Vec<String>,
    pub evidence: Evidence,
}

/// Checks `request` (after schema inference). `Ok` when it may proceed to build.
pub fn shape_check(request: &ForgeRequest) -> Result<(), ShapeIssues> {
    let mut reasons = vec![];
    let mut evidence = Evidence::default();
    if lacks_properties(&request.input_schema) {
        evidence.shape = true;
        reasons.push("inputSchema has no properties: declare each input field under `properties`".to_string());
    }
    if lacks_properties(&request.output_schema) {
        evidence.shape = true;
        reasons.push("outputSchema has no properties: declare the output fields (or a non-object `type`)".to_string());
    }
    if request.test_cases.len() < MIN_TEST_CASES {
        evidence.shape = true;
        reasons.push(format!("{} test case(s) given; at least {MIN_TEST_CASES} are required", request.test_cases.len()));
    }
    if request.test_cases.len() > MAX_TEST_CASES {
        evidence.shape = true;
        reasons.push(format!("{} test cases given; at most {MAX_TEST_CASES} are run: keep the ones that tell the most", request.test_cases.len()));
    }
    for (i, case) in request.test_cases.iter().enumerate() {
        let empty = match &case.input {
            Value::Null => true,
            Value::Object(m) => m.is_empty(),
            _ => false,
        };
        if empty {
            evidence.shape = true;
            reasons.push(format!("test case {i} has an empty input"));
        }
    }
    let closed = request.input_schema.get("additionalProperties") == Some(&Value::Bool(false));
    if closed {
        let declared = request.input_schema.get("properties").and_then(Value::as_object);
        for (i, case) in request.test_cases.iter().enumerate() {
            let Some(input) = case.input.as_object() else { continue };
            for key in input.keys() {
                if !declared.is_some_and(|d| d.contains_key(key)) {
                    evidence.extra_field = true;
                    reasons.push(format!("test case {i} input has field `{key}`, which inputSchema does not declare (additionalProperties is false)"));
                }
            }
        }
    }
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(ShapeIssues { reasons, evidence })
    }
}

//! Forge-time tests (spec scope item 5). Every test case runs — none is skipped after a
//! failure — through the same path as a real call ([`crate::tools::invoke`]: input schema,
//! handler, output schema). A test passes only if execution succeeds, the output matches
//! `outputSchema`, and, when `expectedOutput` is given, the output equals it.
//!
//! **Equality rule** ([`outputs_equal`]): structural JSON equality where
//! - numbers compare as `f64` with a relative tolerance of 1e-9 (`|a-b| <= 1e-9 * max(|a|,|b|,1)`),
//!   so `2` equals `2.0` and `0.1 + 0.2` equals `0.3`;
//! - objects must have exactly the same keys: an extra key in the actual output is a failure,
//!   as is a missing one (key order is irrelevant);
//! - arrays compare element-wise in order and must have the same length;
//! - strings, booleans and null compare exactly (no trimming, no case folding, no coercion
//!   between `"1"` and `1`).

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::agent::Environment;
use crate::tools::{invoke_keeping_output, CallContext, Tool};

use super::request::ForgeTestCase;
use super::shape::{is_closed, undeclared_fields};

/// Relative tolerance for number comparison.
pub const NUMBER_TOLERANCE: f64 = 1e-9;

/// One test's outcome (the TS `TestResult`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "wasm-core", derive(tsify::Tsify))]
#[serde(rename_all = "camelCase")]
pub struct TestResult {
    pub index: u32,
    pub passed: bool,
    pub input: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_output: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actual_output: Option<Value>,
    /// `code: message` of the failure, or why the output did not match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub duration_ms: f64,
}

fn numbers_equal(a: f64, b: f64) -> bool {
    a == b || (a - b).abs() <= NUMBER_TOLERANCE * a.abs().max(b.abs()).max(1.0)
}

/// Whether `actual` equals `expected` under the rule in the module docs.
pub fn outputs_equal(expected: &Value, actual: &Value) -> bool {
    match (expected, actual) {
        (Value::Number(a), Value::Number(b)) => match (a.as_f64(), b.as_f64()) {
            (Some(x), Some(y)) => numbers_equal(x, y),
            _ => a == b,
        },
        (Value::Array(a), Value::Array(b)) => a.len() == b.len() && a.iter().zip(b).all(|(x, y)| outputs_equal(x, y)),
        (Value::Object(a), Value::Object(b)) => a.len() == b.len() && a.iter().all(|(k, x)| b.get(k).is_some_and(|y| outputs_equal(x, y))),
        (a, b) => a == b,
    }
}

/// When a tool returned a bare value (or an array) where its output schema wants an object,
/// says so with the object's shape, for the model's retry and for whoever reads the reason:
/// code returning `7` next to an `expectedOutput` of `{"count": 5}` was the local model's most
/// common failure in the real-model bench, and `7 is not of type "object"` alone does not say
/// what to return instead.
fn object_hint(tool: &Tool, actual: &Value) -> Option<String> {
    let schema = tool.output_schema()?.source();
    let properties = schema.get("properties")?.as_object().filter(|p| !p.is_empty())?;
    if actual.is_object() || schema.get("type").and_then(Value::as_str) != Some("object") {
        return None;
    }
    let shape = properties.keys().map(|k| format!("{}: …", Value::String(k.clone()))).collect::<Vec<_>>().join(", ");
    Some(format!("execute returned {} but must return an object {{{shape}}}", compact(actual)))
}

/// The fields of a failed test's `actual` output that the test failed on by being there, as
/// paths (`slug`, `meta.extra`): the output schema does not declare them, and it forbids them
/// (`additionalProperties: false`) or the `expected` output has no such key
/// (`schema_extra_field`, the most common mistake of forged code: a field more than the schema
/// promises). Read in nested objects too, where the schema declares the object field.
pub(crate) fn extra_output_fields(schema: &Value, actual: &Value, expected: Option<&Value>) -> Vec<String> {
    let mut found = vec![];
    collect_extra_fields(schema, actual, expected, "", &mut found);
    found
}

fn collect_extra_fields(schema: &Value, actual: &Value, expected: Option<&Value>, path: &str, found: &mut Vec<String>) {
    let closed = is_closed(schema);
    for key in undeclared_fields(schema, actual) {
        if closed || expected.and_then(Value::as_object).is_some_and(|e| !e.contains_key(key)) {
            found.push(format!("{path}{key}"));
        }
    }
    let (Some(declared), Some(object)) = (schema.get("properties").and_then(Value::as_object), actual.as_object()) else { return };
    for (key, field_schema) in declared {
        // Below a field the expected output leaves out, only a closed schema says what is extra.
        if let Some(value) = object.get(key).filter(|v| v.is_object()) {
            collect_extra_fields(field_schema, value, expected.and_then(|e| e.get(key)), &format!("{path}{key}."), found);
        }
    }
}

/// Runs one test case against `tool`.
pub async fn run_test(tool: &Tool, index: usize, case: &ForgeTestCase, ctx: &CallContext, env: &dyn Environment) -> TestResult {
    let started = env.elapsed_ms();
    let outcome = invoke_keeping_output(tool, case.input.clone(), ctx).await;
    let duration_ms = env.elapsed_ms() - started;
    let (passed, actual_output, error) = match outcome {
        Err((failure, Some(actual))) => {
            let error = match object_hint(tool, &actual) {
                Some(hint) => format!("{failure} ({hint})"),
                None => failure.to_string(),
            };
            (false, Some(actual), Some(error))
        }
        Err((failure, None)) => (false, None, Some(failure.to_string())),
        Ok(actual) => match &case.expected_output {
            Some(expected) if !outputs_equal(expected, &actual) => {
                let mut error = format!("expected {} but got {}", compact(expected), compact(&actual));
                let schema = tool.output_schema().map_or(&Value::Null, |s| s.source());
                let extra = extra_output_fields(schema, &actual, Some(expected));
                if !extra.is_empty() {
                    let fields = extra.iter().map(|k| format!("`{}`", super::shorten(k, 64))).collect::<Vec<_>>().join(", ");
                    let _ = write!(error, " (outputSchema does not declare {fields})");
                }
                (false, Some(actual), Some(error))
            }
            _ => (true, Some(actual), None),
        },
    };
    TestResult { index: index as u32, passed, input: case.input.clone(), expected_output: case.expected_output.clone(), actual_output, error, duration_ms }
}

/// Most JSON a forge's tests may return in all, kept in their results (twice what one sandbox
/// execution may return). Results are held whole, copied into events, the forge's answer and
/// the judge's evidence: 32 tests of 4 MiB each grew the core's memory, which never shrinks,
/// by ~380 MB for one forge.
pub const MAX_TEST_OUTPUT_BYTES: usize = 8 << 20;

/// Runs every test case, concurrently (test cases are independent calls; a sandbox pool runs
/// them on its workers side by side), and returns the results in case order. A test whose
/// output would take the tests past [`MAX_TEST_OUTPUT_BYTES`] fails, its output not kept.
pub async fn run_tests(tool: &Tool, cases: &[ForgeTestCase], ctx: &CallContext, env: &dyn Environment) -> Vec<TestResult> {
    let kept = std::cell::Cell::new(0usize);
    let kept = &kept;
    let tests = cases.iter().enumerate().map(|(i, case)| async move {
        let mut result = run_test(tool, i, case, ctx, env).await;
        if let Some(output) = &result.actual_output {
            let size = crate::tools::json_len(output);
            if kept.get() + size > MAX_TEST_OUTPUT_BYTES {
                result.passed = false;
                result.actual_output = None;
                result.error = Some(format!(
                    "the test returned {size} bytes of JSON, past the {MAX_TEST_OUTPUT_BYTES} bytes a forge's tests may return in all; test with smaller inputs"
                ));
            } else {
                kept.set(kept.get() + size);
            }
        }
        result
    });
    futures::future::join_all(tests).await
}

/// A short JSON rendering for reasons (long values are cut).
pub(crate) fn compact(v: &Value) -> String {
    super::shorten(&v.to_string(), 200)
}

/// Longest quote of one test's error in a rejection reason (the reason is persisted in the
/// audit trail and sent to the model; 32 tests may fail).
const MAX_TEST_ERROR_CHARS: usize = 400;

/// The reason listing every failing case, or `None` when all passed.
pub fn failure_reason(results: &[TestResult]) -> Option<String> {
    let failing: Vec<String> = results
        .iter()
        .filter(|r| !r.passed)
        .map(|r| format!("test {} (input {}): {}", r.index, compact(&r.input), super::shorten(r.error.as_deref().unwrap_or("failed"), MAX_TEST_ERROR_CHARS)))
        .collect();
    (!failing.is_empty()).then(|| format!("{} of {} tests failed: {}", failing.len(), results.len(), failing.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_use_relative_tolerance_and_objects_are_exact() {
        assert!(outputs_equal(&json!(2), &json!(2.0)));
        assert!(outputs_equal(&json!(0.3), &json!(0.1 + 0.2)));
        assert!(!outputs_equal(&json!(1.0), &json!(1.001)));
        // Absolute below 1 (as the README says): a float error next to 0 passes, and so does
        // any difference smaller than 1e-9 between tiny numbers.
        assert!(outputs_equal(&json!(0), &json!(1.2e-16)));
        assert!(outputs_equal(&json!(1e-10), &json!(5e-10)));
        assert!(outputs_equal(&json!({"a":1,"b":[1,2]}), &json!({"b":[1.0,2],"a":1})));
        assert!(!outputs_equal(&json!({"a":1}), &json!({"a":1,"extra":true})));
        assert!(!outputs_equal(&json!({"a":1,"b":2}), &json!({"a":1})));
        assert!(!outputs_equal(&json!("1"), &json!(1)));
        assert!(!outputs_equal(&json!([1, 2]), &json!([2, 1])));
    }
}

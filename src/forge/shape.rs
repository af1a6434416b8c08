//! The shape check (spec scope item 3): cheap structural checks that run before anything is
//! built or judged, so a malformed request never costs a judge call. A request over the size
//! limits ([`MAX_DESCRIPTION_CHARS`], [`MAX_SCHEMA_BYTES`], [`MAX_REQUEST_BYTES`]), empty schema
//! properties, fewer than [`MIN_TEST_CASES`] or more than [`MAX_TEST_CASES`] test cases and test
//! cases with empty input are `shape_check` rejections; a test input with a field the declared
//! input schema forbids (`additionalProperties: false`, the field neither under `properties`
//! nor matching a `patternProperties` pattern) is `schema_extra_field`.

use serde_json::Value;

use super::classify::Evidence;
use super::compose::MAX_COMPOSE_STEPS;
use super::infer::lacks_properties;
use super::prompt::FORGE_TOOL_NAME;
use super::request::{ForgeRequest, Implementation};
use crate::tools::{json_len, nesting_depth, CompiledSchema, SchemaAuthor, MAX_VALUE_DEPTH};

/// Fewest test cases a forge request must carry.
pub const MIN_TEST_CASES: usize = 2;

/// Most test cases a forge request may carry: every one runs (in the sandbox, each up to its
/// deadline) and goes into the judge's prompt.
pub const MAX_TEST_CASES: usize = 32;

/// Longest description: it is sent with the tool on every model turn that offers it.
pub const MAX_DESCRIPTION_CHARS: usize = 4096;

/// Largest input or output schema, as JSON: sent on every turn (the input schema), quoted in
/// the judge's prompt, kept in every version.
pub const MAX_SCHEMA_BYTES: usize = 32 * 1024;

/// Largest request as a whole, as JSON (code, test inputs and expected outputs included). A
/// model's request is bounded by its token budget; `agent.forge` and `import` are not.
pub const MAX_REQUEST_BYTES: usize = 512 * 1024;

/// Longest JSON text of a request that is read at all (bytes, or UTF-16 units for a value the
/// host passes): parsed, text of many small values takes 15–30 times its length in the core's
/// memory, which never shrinks, only to be refused by [`MAX_REQUEST_BYTES`]. Four times that
/// leaves room for whitespace and for schemas sent as escaped JSON text.
pub const MAX_REQUEST_TEXT_BYTES: usize = 4 * MAX_REQUEST_BYTES;

/// Why a request whose JSON text is `len` long is refused unread (`shape_check`), if it is.
pub fn oversized_request_text(len: usize) -> Option<String> {
    (len > MAX_REQUEST_TEXT_BYTES).then(|| {
        format!(
            "the request is {len} characters of JSON text; at most {MAX_REQUEST_TEXT_BYTES} are read (and at most {MAX_REQUEST_BYTES} bytes once normalized)"
        )
    })
}

/// Most problems listed in one rejection.
const MAX_REASONS: usize = 10;

/// A failed shape check: the reason (all problems found) and the evidence for classification.
#[derive(Debug, Clone, PartialEq)]
pub struct ShapeIssues {
    pub reasons: Vec<String>,
    pub evidence: Evidence,
}

/// How a schema without properties reads in a reason: one not given at all, or given as `{}`
/// (normalization cannot tell them apart), is said to be missing or empty, and not inferred
/// from the test cases' `field` either.
fn missing_or_empty(schema: &Value, field: &str) -> String {
    match schema.as_object().is_some_and(|m| m.is_empty()) {
        true => format!("is missing or empty (and no test case's `{field}` had fields to infer it from)"),
        false => "has no properties".to_string(),
    }
}

/// Checks `request` (after schema inference). `Ok` when it may proceed to build.
pub fn shape_check(request: &ForgeRequest) -> Result<(), ShapeIssues> {
    let mut reasons = vec![];
    let mut evidence = Evidence::default();
    if let Some(reason) = oversized(request).or_else(|| unsound_pipeline(request)) {
        return Err(ShapeIssues { reasons: vec![reason], evidence: Evidence { shape: true, ..Default::default() } });
    }
    if let Some(kind) = non_object_type(&request.input_schema) {
        // Every test would fail on it, and no model could call the tool: its arguments are a
        // JSON object (the rule host tools are held to when they are defined).
        evidence.shape = true;
        reasons.push(format!(
            "inputSchema has type {kind}: a tool's arguments are a JSON object, so declare `\"type\": \"object\"` with each input field under `properties`"
        ));
    } else if lacks_properties(&request.input_schema) {
        evidence.shape = true;
        reasons.push(format!("inputSchema {}: declare each input field under `properties`", missing_or_empty(&request.input_schema, "input")));
    }
    if lacks_properties(&request.output_schema) {
        evidence.shape = true;
        reasons
            .push(format!("outputSchema {}: declare the output fields (or a non-object `type`)", missing_or_empty(&request.output_schema, "expectedOutput")));
    }
    if request.test_cases.len() < MIN_TEST_CASES {
        evidence.shape = true;
        reasons.push(format!("{} test case(s) given; at least {MIN_TEST_CASES} are required", request.test_cases.len()));
    }
    if request.test_cases.len() > MAX_TEST_CASES {
        evidence.shape = true;
        reasons.push(format!("{} test cases given; at most {MAX_TEST_CASES} are run: keep the ones that tell the most", request.test_cases.len()));
        return Err(ShapeIssues { reasons, evidence });
    }
    for (i, case) in request.test_cases.iter().enumerate() {
        let empty = match &case.input {
            Value::Null => true,
            Value::Object(m) => m.is_empty(),
            Value::Array(a) => a.is_empty(),
            Value::String(s) => s.is_empty(),
            _ => false,
        };
        if empty {
            evidence.shape = true;
            reasons.push(format!("test case {i} has an empty input"));
        }
    }
    if is_closed(&request.input_schema) {
        for (i, case) in request.test_cases.iter().enumerate() {
            for key in undeclared_fields(&request.input_schema, &case.input) {
                evidence.extra_field = true;
                let key = super::shorten(key, 64);
                reasons.push(format!("test case {i} input has field `{key}`, which inputSchema does not declare (additionalProperties is false)"));
            }
        }
    }
    if reasons.is_empty() {
        Ok(())
    } else {
        if reasons.len() > MAX_REASONS {
            let more = reasons.len() - MAX_REASONS;
            reasons.truncate(MAX_REASONS);
            reasons.push(format!("… and {more} more"));
        }
        Err(ShapeIssues { reasons, evidence })
    }
}

/// The `type` of a schema that rules objects out, as JSON text (`None` when it allows them).
fn non_object_type(schema: &Value) -> Option<String> {
    let kind = schema.get("type")?;
    let allows_object = match kind {
        Value::String(t) => t == "object",
        Value::Array(types) => types.iter().any(|t| t == "object"),
        _ => false,
    };
    (!allows_object).then(|| super::shorten(&kind.to_string(), 64))
}

/// Whether `schema` forbids fields it does not declare (`additionalProperties: false`).
pub(crate) fn is_closed(schema: &Value) -> bool {
    schema.get("additionalProperties") == Some(&Value::Bool(false))
}

/// The top-level fields of `value` (an object; nothing otherwise) that object `schema` does not
/// declare: not under `properties`, matching no `patternProperties` pattern, and no
/// `additionalProperties` schema taking them (a map declares every key). Test inputs against
/// the input schema and test outputs against the output schema are read by this one rule.
pub(crate) fn undeclared_fields<'v>(schema: &Value, value: &'v Value) -> Vec<&'v String> {
    let Some(object) = value.as_object() else { return vec![] };
    if schema.get("additionalProperties").is_some_and(Value::is_object) {
        return vec![];
    }
    let declared = schema.get("properties").and_then(Value::as_object);
    let patterns = key_patterns(schema);
    let matches_pattern = |key: &String| patterns.iter().any(|p| p.check(&Value::String(key.clone())).is_ok());
    object.keys().filter(|key| !declared.is_some_and(|d| d.contains_key(*key)) && !matches_pattern(key)).collect()
}

/// The schema's `patternProperties` patterns, compiled as JSON Schema compiles them (ECMA-262
/// regexes, with its own engine), as schemas a key must match: a key one of them matches is
/// declared. A pattern that does not compile matches nothing here; building the tool then
/// reports the schema as invalid.
fn key_patterns(schema: &Value) -> Vec<CompiledSchema> {
    let Some(patterns) = schema.get("patternProperties").and_then(Value::as_object) else { return vec![] };
    let compile = |p: &String| CompiledSchema::compile_by(&serde_json::json!({ "type": "string", "pattern": p }), SchemaAuthor::Untrusted).ok();
    patterns.keys().filter_map(compile).collect()
}

/// Why `request`'s pipeline cannot be forged, if it cannot: more than [`MAX_COMPOSE_STEPS`]
/// steps, or a step calling `forge_tool`. A pipeline that forged would run the new tool's
/// tests, which could call the pipeline again: recursion that no depth or step limit sees,
/// since tests start afresh.
fn unsound_pipeline(request: &ForgeRequest) -> Option<String> {
    let Implementation::Compose { steps } = &request.implementation else { return None };
    if steps.len() > MAX_COMPOSE_STEPS {
        return Some(format!("the pipeline has {} steps; at most {MAX_COMPOSE_STEPS} are allowed", steps.len()));
    }
    let forging = steps.iter().find(|s| s.tool == FORGE_TOOL_NAME)?;
    Some(format!("step `{}` calls {FORGE_TOOL_NAME}; a pipeline cannot forge tools", super::shorten(&forging.name, 64)))
}

/// Why `request` is too large to consider at all, if it is.
fn oversized(request: &ForgeRequest) -> Option<String> {
    let description = request.description.chars().count();
    if description > MAX_DESCRIPTION_CHARS {
        return Some(format!("the description is {description} characters; at most {MAX_DESCRIPTION_CHARS}: say in a sentence or two what the tool does"));
    }
    for (what, schema) in [("inputSchema", &request.input_schema), ("outputSchema", &request.output_schema)] {
        let bytes = json_len(schema);
        if bytes > MAX_SCHEMA_BYTES {
            return Some(format!("{what} is {bytes} bytes of JSON; at most {MAX_SCHEMA_BYTES}"));
        }
    }
    let values = [&request.input_schema, &request.output_schema]
        .into_iter()
        .chain(request.test_cases.iter().flat_map(|c| std::iter::once(&c.input).chain(&c.expected_output)));
    let steps = match &request.implementation {
        Implementation::Compose { steps } => steps.as_slice(),
        Implementation::Sandbox { .. } => &[],
    };
    // A mapping that is not an object is a string, or refused by the build before it is read.
    let mappings = steps.iter().filter_map(|s| s.input_mapping.as_object()).flat_map(|m| m.values());
    if values.chain(mappings).any(|v| nesting_depth(v) > MAX_VALUE_DEPTH) {
        return Some(format!("a schema, test value or input mapping nests more than {MAX_VALUE_DEPTH} levels deep"));
    }
    let bytes = json_len(request);
    (bytes > MAX_REQUEST_BYTES).then(|| format!("the request is {bytes} bytes of JSON; at most {MAX_REQUEST_BYTES} (code, schemas and test cases together)"))
}

//! Forge requests: the typed shapes of `npm/src/emergent/types.ts` (`ForgeRequest`,
//! `ComposeStep`, `Implementation`, `ForgeTestCase`) and [`normalize`], which turns the messy
//! arguments small models actually produce into a typed request (spec scope item 1).
//!
//! Accepted messiness: the whole request as a JSON string; stringified JSON schemas; snake_case
//! keys; `parameters` for `inputSchema`; mode synonyms (`js`, `javascript`, `code`, `script`
//! → sandbox; `pipeline`, `chain`, `steps` → compose); the implementation given flat (`code` or
//! `steps` at the top level), as a string, or as its mode's name beside them; a compose step's
//! arguments under a synonym of `inputMapping` (`args`, `params`, `inputs`, `with`…, in any
//! case; arguments under a key not read are refused, never replaced by `$prev`), its name
//! given as a number (`"id": 1` is step `1`); `testCases` given
//! as `tests`/`test_cases`/`examples`, as an object (one case, or a map of cases) or a JSON
//! string, a case without an input key being the fields beside its expected output
//! (`{ "text": "Hi", "expected": … }`); a schema's property given as its type's name
//! (`"text": "string"`); `expected`, `output`, `expected_output`, `expectedResult`,
//! `expected_result`, `result` or any key saying `expect` for `expectedOutput`, and an expected
//! object or array given as JSON text where the output schema declares one; missing optional
//! fields; a name with spaces or punctuation (`"Count Vowels"` → `Count_Vowels`); the request,
//! a JSON field or the sandbox code inside a Markdown code fence (```` ```json ````,
//! ```` ```js ````).

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::shorten;
use crate::js_json::well_formed;

/// A step of a compose pipeline: run `tool` with arguments built from `input_mapping`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "wasm-core", derive(tsify::Tsify))]
#[serde(rename_all = "camelCase")]
pub struct ComposeStep {
    pub name: String,
    pub tool: String,
    /// An object of arguments, or a string that is exactly one reference (`"$input"`), whose
    /// value is the arguments (see [`super::ComposeHandler`]; other values are refused when built).
    #[cfg_attr(feature = "wasm-core", tsify(type = "Record<string, unknown> | string"))]
    pub input_mapping: Value,
}

/// How a forged tool runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "wasm-core", derive(tsify::Tsify))]
#[serde(tag = "mode", rename_all = "lowercase")]
pub enum Implementation {
    /// A pipeline over registered tools, run in the core.
    Compose { steps: Vec<ComposeStep> },
    /// JavaScript defining `execute(input)`, run in the sandbox. `code` is `None` only in a
    /// redacted export.
    Sandbox {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        allowlist: Vec<String>,
    },
}

impl Implementation {
    /// `compose` or `sandbox`.
    pub fn mode(&self) -> &'static str {
        match self {
            Self::Compose { .. } => "compose",
            Self::Sandbox { .. } => "sandbox",
        }
    }
}

/// One test case: an input and, optionally, the exact expected output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "wasm-core", derive(tsify::Tsify))]
#[serde(rename_all = "camelCase")]
pub struct ForgeTestCase {
    pub input: Value,
    /// `Some(Null)` expects `null`: read back as written, not as no expectation (serde would
    /// read a `null` field as `None`, and a stored tool would then hash, test and export
    /// differently after a reload).
    #[serde(default, deserialize_with = "expected_as_written", skip_serializing_if = "Option::is_none")]
    pub expected_output: Option<Value>,
}

/// A present `expectedOutput` field, `null` included.
fn expected_as_written<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(deserializer).map(Some)
}

/// A typed forge request (after normalization).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "wasm-core", derive(tsify::Tsify))]
#[serde(rename_all = "camelCase")]
pub struct ForgeRequest {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    pub output_schema: Value,
    pub implementation: Implementation,
    pub test_cases: Vec<ForgeTestCase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
}

/// Who asked for a forge: every attempt is tagged with these (spec scope item 1).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ForgeOrigin {
    pub agent_id: String,
    pub session_id: String,
    /// Optional label grouping attempts (a task id); the request's `scope` wins when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// Run the forge belongs to (empty outside a run); events carry it.
    #[serde(default)]
    pub run_id: String,
    /// The run id the forge's own calls (its judge, host tools in its tests) carry, by which
    /// the host finds their abort signal: the run's, or one the host gave a direct forge. Not
    /// recorded: it names an operation in flight, not where the tool came from.
    #[serde(skip)]
    pub calls_run_id: String,
    /// For an imported tool: where its package says it came from (agent, session, tier,
    /// version). The package's word, not checked: its content hash covers the tool, not this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imported_from: Option<String>,
}

/// The request could not be turned into a [`ForgeRequest`] (category `parse_error`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct NormalizeError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, NormalizeError> {
    Err(NormalizeError(msg.into()))
}

/// The request as JSON: argument text that is not JSON arrives as a string
/// (`ToolHandler::accepts_raw_arguments`), and JSON text is parsed.
fn request_value(raw: &Value) -> Result<Cow<'_, Value>, NormalizeError> {
    json_text(raw).map_err(|e| NormalizeError(format!("the arguments are not valid JSON ({e}): {}", shorten(raw.as_str().unwrap_or_default(), 120))))
}

/// The request inside a wrapper: some models send `{ "request": {...} }` or `{ "tool": {...} }`.
fn unwrapped(outer: &Value) -> &Value {
    match outer {
        Value::Object(m) if m.len() == 1 && matches!(pick(m, &["request", "tool", "forge"]), Some(Value::Object(_))) => {
            m.values().next().unwrap_or(&Value::Null)
        }
        other => other,
    }
}

/// The tool name a request gives, under any of its synonyms, made snake_case.
fn name_of(obj: &Map<String, Value>) -> Option<String> {
    match pick(obj, &["name", "toolName", "tool_name"]) {
        Some(Value::String(n)) => Some(snake_name(n)),
        _ => None,
    }
}

/// The scope label a request gives, made a label.
fn scope_of(obj: &Map<String, Value>) -> Option<String> {
    match pick(obj, &["scope"]) {
        Some(Value::String(s)) => Some(scope_label(s)),
        _ => None,
    }
}

/// The name and scope label a request gives, read as [`normalize`] reads them, for a request
/// that does not normalize: its rejection is still counted under its name and scope.
pub(crate) fn attempt_labels(raw: &Value) -> (Option<String>, Option<String>) {
    let Ok(outer) = request_value(raw) else { return (None, None) };
    let Value::Object(obj) = unwrapped(&outer) else { return (None, None) };
    // Cut as a tool name is long: a name too long to forge is still counted, under its start.
    (name_of(obj).map(|n| n.chars().take(64).collect()), scope_of(obj))
}

/// The first present (non-null) value among `keys`.
fn pick<'a>(obj: &'a Map<String, Value>, keys: &[&str]) -> Option<&'a Value> {
    pick_present(obj, keys).filter(|v| !v.is_null())
}

/// The first value among `keys`, null included.
fn pick_present<'a>(obj: &'a Map<String, Value>, keys: &[&str]) -> Option<&'a Value> {
    keys.iter().find_map(|k| obj.get(*k))
}

/// A value that may be JSON text: parsed when it is a string holding an object or array, in a
/// code fence or not (borrowed as it is otherwise: requests carry whole schemas and code).
fn json_text(v: &Value) -> Result<Cow<'_, Value>, serde_json::Error> {
    if let Value::String(s) = v {
        let t = crate::agent::unfenced(s).unwrap_or(s.trim());
        if t.starts_with('{') || t.starts_with('[') {
            return serde_json::from_str(&well_formed(t)).map(Cow::Owned);
        }
    }
    Ok(Cow::Borrowed(v))
}

/// [`json_text`] for a field of the request.
fn unstringify(v: &Value) -> Result<Cow<'_, Value>, NormalizeError> {
    json_text(v).map_err(|e| NormalizeError(format!("a field holds JSON text that does not parse: {e}")))
}

fn schema_field(obj: &Map<String, Value>, keys: &[&str], what: &str) -> Result<Value, NormalizeError> {
    match pick(obj, keys) {
        None => Ok(Value::Object(Map::new())),
        Some(v) => match unstringify(v)?.into_owned() {
            Value::Object(mut m) => {
                // A field given as its type's name (`"properties": {"text": "string"}`), as small
                // models write it: that type's schema.
                if let Some(Value::Object(properties)) = m.get_mut("properties") {
                    for field in properties.values_mut() {
                        if let Value::String(t) = field {
                            *field = serde_json::json!({ "type": std::mem::take(t) });
                        }
                    }
                }
                Ok(Value::Object(m))
            }
            other => err(format!("{what} must be a JSON Schema object, got {}", type_name(&other))),
        },
    }
}

/// The JSON Schema type of a value, for error messages and for schema inference. Every number
/// is a `number`: JavaScript has no integers, and a test's `3` and a tool's `3.0000000000000004`
/// are equal by the tests' own rule, so an inferred `integer` (from whole-number samples) would
/// refuse what the tests accept and every later call with a fraction.
pub(crate) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Maps mode names models use to `compose` / `sandbox`.
fn canonical_mode(mode: &str) -> Option<&'static str> {
    match mode.trim().to_ascii_lowercase().as_str() {
        "sandbox" | "js" | "javascript" | "code" | "script" | "function" | "ts" | "typescript" => Some("sandbox"),
        "compose" | "pipeline" | "chain" | "steps" | "composition" | "workflow" => Some("compose"),
        _ => None,
    }
}

fn implementation(obj: &Map<String, Value>) -> Result<Implementation, NormalizeError> {
    let imp = match pick(obj, &["implementation", "impl"]) {
        Some(v) => match unstringify(v)?.into_owned() {
            Value::Object(m) => m,
            // A bare code string, or one word: the mode's name (`"implementation": "sandbox"`),
            // the code or steps beside it (read as code, "compose" made a sandbox tool whose
            // code was the word; no code defining `execute` is one word).
            Value::String(text) => {
                let mut m = Map::new();
                m.insert("mode".into(), Value::String("sandbox".into()));
                let key = if text.trim().bytes().all(|b| b.is_ascii_alphabetic()) { "mode" } else { "code" };
                m.insert(key.into(), Value::String(text));
                m
            }
            other => return err(format!("implementation must be an object, got {}", type_name(&other))),
        },
        // Flat: code / steps at the top level.
        None => obj.clone(),
    };
    let code = pick(&imp, &["code", "source", "js"]).or_else(|| pick(obj, &["code"]));
    let steps = pick(&imp, &["steps", "pipeline"]).or_else(|| pick(obj, &["steps"]));
    let declared = pick(&imp, &["mode", "type", "kind"]).or_else(|| pick(obj, &["mode"]));
    let mode = match declared {
        Some(Value::String(m)) => match canonical_mode(m) {
            Some(m) => m,
            None => return err(format!("unknown implementation mode `{m}`: use `sandbox` (JavaScript code) or `compose` (steps over existing tools)")),
        },
        Some(other) => return err(format!("implementation mode must be a string, got {}", type_name(other))),
        None if code.is_some() => "sandbox",
        None if steps.is_some() => "compose",
        None => return err("missing implementation: give `implementation: { mode: \"sandbox\", code }` or `{ mode: \"compose\", steps }`"),
    };
    if mode == "sandbox" {
        let code = match code {
            // Code in a fence would not parse: the fence goes, the code stays as written.
            Some(Value::String(c)) if !c.trim().is_empty() => crate::agent::unfenced(c).map_or_else(|| c.clone(), str::to_string),
            Some(Value::String(_)) | None => return err("sandbox implementation needs `code` defining `function execute(input)`"),
            Some(other) => return err(format!("`code` must be a string, got {}", type_name(other))),
        };
        let allowlist = match pick(&imp, &["allowlist", "allowedApis", "allow"]) {
            None => vec![],
            Some(Value::Array(a)) => a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect(),
            Some(Value::String(s)) => s.split(',').map(|p| p.trim().to_string()).filter(|p| !p.is_empty()).collect(),
            Some(other) => return err(format!("`allowlist` must be an array of strings, got {}", type_name(other))),
        };
        return Ok(Implementation::Sandbox { code: Some(code), allowlist });
    }
    let steps = steps.map(unstringify).transpose()?;
    let steps: &[Value] = match steps.as_deref() {
        Some(Value::Array(a)) => a,
        Some(other) => return err(format!("compose `steps` must be an array, got {}", type_name(other))),
        None => &[],
    };
    // Names the request gives, so that a step it leaves unnamed is not given one of them: a bare
    // step and one named `step1` after it were refused as two steps named `step1`.
    let given: std::collections::HashSet<String> = steps.iter().filter_map(Value::as_object).filter_map(step_name).collect();
    let mut out = Vec::with_capacity(steps.len());
    for (i, step) in steps.iter().enumerate() {
        let Value::Object(s) = step else { return err(format!("compose step {i} must be an object")) };
        let tool = match pick(s, &STEP_TOOL_KEYS) {
            Some(Value::String(t)) => t.clone(),
            _ => return err(format!("compose step {i} needs a `tool` name")),
        };
        let name = step_name(s).unwrap_or_else(|| {
            let mut name = format!("step{}", i + 1);
            // Only this step's default starts `step{i+1}_`: no other default can take it.
            let mut n = 2;
            while given.contains(&name) {
                name = format!("step{}_{n}", i + 1);
                n += 1;
            }
            name
        });
        if name.contains(is_line_or_control) {
            return err(format!(
                "compose step {i} is named {}, which holds a line break or another control character: name steps with text on one line",
                shorten(&Value::from(name.as_str()).to_string(), 80)
            ));
        }
        let input_mapping = match step_mapping(s).map(unstringify).transpose()?.map(Cow::into_owned) {
            // A string is one whole reference (`"$input"`); the build reads it.
            Some(m @ (Value::Object(_) | Value::String(_))) => m,
            // Steps listed without mappings (`[{ "tool": "a" }, { "tool": "b" }]`) are a
            // chain: each step takes what the one before returned, the first the input. Unless
            // the step holds arguments under a key not read as its mapping: taking `$prev`
            // instead, it would run on whatever came before (the caller's own `to` for an
            // email, in place of the fixed recipient the model wrote).
            None => match s.iter().find(|(k, v)| !is_step_field(k) && holds_arguments(v)) {
                Some((key, _)) => {
                    return err(format!(
                        "compose step {i} (`{}`) gives `{}`, which is not read as the step's arguments: put them under `inputMapping` (`\"inputMapping\": {{ … }}`); a step without `inputMapping` takes `$prev`",
                        shorten(&tool, 64),
                        shorten(key, 64)
                    ))
                }
                None => Value::String("$prev".into()),
            },
            Some(other) => {
                return err(format!("compose step {i} `inputMapping` must be an object or one reference such as \"$input\", got {}", type_name(&other)))
            }
        };
        out.push(ComposeStep { name, tool, input_mapping });
    }
    Ok(Implementation::Compose { steps: out })
}

/// Keys naming a compose step's tool.
const STEP_TOOL_KEYS: [&str; 4] = ["tool", "toolName", "tool_name", "use"];

/// Keys naming a compose step.
const STEP_NAME_KEYS: [&str; 2] = ["name", "id"];

/// Keys a compose step's arguments may sit under, as models name them (the first one holding
/// a value is read; a key differing only in case, `InputMapping`, is read as well).
const STEP_MAPPING_KEYS: [&str; 12] =
    ["inputMapping", "input_mapping", "input", "args", "arguments", "mapping", "inputs", "inputMap", "input_map", "params", "parameters", "with"];

/// Keys of a compose step that say something about it to a reader and hold no arguments.
const STEP_NOTE_KEYS: [&str; 10] = ["description", "desc", "comment", "comments", "note", "notes", "title", "label", "purpose", "reason"];

/// The name a compose step gives: text, or a number's text (`"id": 1` is step `1`, as
/// `$steps.1` reads it).
fn step_name(s: &Map<String, Value>) -> Option<String> {
    match pick(s, &STEP_NAME_KEYS) {
        Some(Value::String(n)) if !n.is_empty() => Some(n.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    }
}

/// Whether `c` breaks a line or controls the terminal: a step name holding one could write
/// lines of its own wherever the name is shown (the judge's review prompt, reasons, logs).
fn is_line_or_control(c: char) -> bool {
    c.is_control() || matches!(c, '\u{2028}' | '\u{2029}')
}

/// A compose step's mapping: the first of [`STEP_MAPPING_KEYS`] holding a value, written as
/// listed, or failing that in another case.
fn step_mapping(s: &Map<String, Value>) -> Option<&Value> {
    let given = |v: &&Value| !v.is_null();
    STEP_MAPPING_KEYS
        .iter()
        .filter_map(|k| s.get(*k))
        .find(given)
        .or_else(|| STEP_MAPPING_KEYS.iter().find_map(|k| s.iter().filter(|(key, _)| key.eq_ignore_ascii_case(k)).map(|(_, v)| v).find(given)))
}

/// Whether a compose step's key is one of its known fields (tool, name, mapping, a note), in
/// any case.
fn is_step_field(key: &str) -> bool {
    STEP_TOOL_KEYS.iter().chain(&STEP_NAME_KEYS).chain(&STEP_MAPPING_KEYS).chain(&STEP_NOTE_KEYS).any(|k| key.eq_ignore_ascii_case(k))
}

/// Whether a value beside a step's known fields looks like the step's arguments: an object (as
/// JSON text too, as a mapping may be given), or text with a reference (`"Summary:
/// $input.summary"`), alone or in an array.
fn holds_arguments(v: &Value) -> bool {
    match v {
        Value::Object(_) => true,
        Value::String(s) => super::compose::has_reference(s) || matches!(json_text(v).as_deref(), Ok(Value::Object(_))),
        Value::Array(items) => items.iter().any(holds_arguments),
        _ => false,
    }
}

fn test_case(v: &Value, i: usize, structured_output: bool) -> Result<ForgeTestCase, NormalizeError> {
    let c = unstringify(v)?;
    let Value::Object(c) = &*c else { return err(format!("test case {i} must be an object with `input`")) };
    let input = match pick(c, &TEST_INPUT_KEYS) {
        Some(v) => unstringify(v)?.into_owned(),
        // An input key given as `null`: no input (refused as empty).
        None if TEST_INPUT_KEYS.iter().any(|k| c.contains_key(*k)) => Value::Object(Map::new()),
        // No input key: the input is the fields written beside the expected output (`{ "text":
        // "Hi", "expected": … }`, or a map of cases `{ "a": { "text": "Hi" } }`), as small models
        // write cases; read as `{}`, they were refused as empty though the model had given them.
        None => Value::Object(c.iter().filter(|(k, _)| !names_expected_output(k)).map(|(k, v)| (k.clone(), v.clone())).collect()),
    };
    // `get`, not `pick`: a null under one of these is an expected null output.
    let expected = pick_present(c, &EXPECTED_OUTPUT_KEYS).or_else(|| c.iter().find(|(k, _)| names_expected_output(k)).map(|(_, v)| v));
    let expected_output = match expected {
        // `"{\"slug\":\"a\"}"` where the output is an object: small models stringify nested
        // JSON, and such a string could never equal an object or array output. A tool whose
        // output is text keeps its expected text as written.
        Some(text @ Value::String(_)) if structured_output => Some(unstringify(text)?.into_owned()),
        other => other.cloned(),
    };
    Ok(ForgeTestCase { input, expected_output })
}

/// Whether `schema` declares an object or array output (and no text), so that an expected
/// output given as JSON text means the value it spells.
fn declares_structured_output(schema: &Value) -> bool {
    let structured = |t: &Value| matches!(t.as_str(), Some("object" | "array"));
    match schema.get("type") {
        Some(Value::Array(types)) => types.iter().any(structured) && !types.iter().any(|t| t == "string"),
        Some(t) => structured(t),
        None => schema.get("properties").is_some_and(Value::is_object) || schema.get("items").is_some_and(Value::is_object),
    }
}

/// Keys a request's test cases may sit under (the first present one is read).
pub const TEST_CASE_KEYS: [&str; 4] = ["testCases", "test_cases", "tests", "examples"];

/// Where a test case gives its expected output, as models name it. Failing these, a key that
/// says `expect` (`expectation`, `expectedValue`) is read; one named otherwise is not seen, and
/// the test then checks the output schema only.
const EXPECTED_OUTPUT_KEYS: [&str; 7] = ["expectedOutput", "expected_output", "expected", "output", "expectedResult", "expected_result", "result"];

/// Whether a test case's key gives its expected output: one of [`EXPECTED_OUTPUT_KEYS`] or a
/// key saying `expect`.
fn names_expected_output(key: &str) -> bool {
    EXPECTED_OUTPUT_KEYS.contains(&key) || key.to_ascii_lowercase().contains("expect")
}

/// Where a test case keeps its input (a single case given as an object is told from a map of
/// named cases by one of these keys).
const TEST_INPUT_KEYS: [&str; 4] = ["input", "args", "arguments", "inputs"];

fn test_cases(obj: &Map<String, Value>, output_schema: &Value) -> Result<Vec<ForgeTestCase>, NormalizeError> {
    let Some(raw) = pick(obj, &TEST_CASE_KEYS) else { return Ok(vec![]) };
    let raw = unstringify(raw)?;
    let structured = declares_structured_output(output_schema);
    match &*raw {
        Value::Array(a) => a.iter().enumerate().map(|(i, v)| test_case(v, i, structured)).collect(),
        Value::Object(m) if TEST_INPUT_KEYS.iter().any(|k| m.contains_key(*k)) => Ok(vec![test_case(&raw, 0, structured)?]),
        // A map of named cases: { "case1": { input, expected }, ... }.
        Value::Object(m) => m.values().enumerate().map(|(i, v)| test_case(v, i, structured)).collect(),
        other => err(format!("testCases must be an array, got {}", type_name(other))),
    }
}

/// A name as small models write it ("Count Vowels", "word-count.v2", "programming language")
/// made a tool name: runs of spaces and punctuation become one `_`, trimmed at the ends. A name
/// that is already valid is kept as is; one with nothing usable stays empty and is rejected by
/// the caller. Letters and digits outside ASCII are kept, so the name stays invalid and is
/// refused: dropped, they would make `tool_日本` and `tool_中国` (or `café` and `cafè`) one
/// tool, each forge a new version over a tool it has nothing to do with.
pub(crate) fn snake_name(raw: &str) -> String {
    let raw = raw.trim();
    if crate::tools::is_valid_tool_name(raw) {
        return raw.to_string();
    }
    let mut out = String::new();
    for c in raw.chars() {
        if c.is_alphanumeric() || c == '_' || c == '-' {
            out.push(c);
        } else if !out.ends_with('_') {
            out.push('_');
        }
    }
    // Not cut to length: two long names differing at the end would become one tool.
    out.trim_matches('_').to_string()
}

/// Longest scope label kept (it tags events, audit entries and provenance).
pub const MAX_SCOPE_CHARS: usize = 128;

/// A scope label as recorded: cut to [`MAX_SCOPE_CHARS`].
pub fn scope_label(scope: &str) -> String {
    shorten(scope, MAX_SCOPE_CHARS)
}

/// Normalizes raw forge arguments (an object or JSON text) into a [`ForgeRequest`].
pub fn normalize(raw: &Value) -> Result<ForgeRequest, NormalizeError> {
    let outer = request_value(raw)?;
    let raw = unwrapped(&outer);
    let Value::Object(obj) = raw else { return err(format!("forge arguments must be a JSON object, got {}", type_name(raw))) };
    let Some(name) = name_of(obj) else { return err("missing `name`: give the new tool a snake_case name") };
    if !crate::tools::is_valid_tool_name(&name) {
        // The name as given: the rewritten one may be empty or differ from what the model wrote.
        let given = pick(obj, &["name", "toolName", "tool_name"]).and_then(Value::as_str).unwrap_or(&name);
        return err(format!("tool name `{}` must be ASCII letters, digits, `_` or `-`, at most 64 characters", crate::tools::shorten(given.trim(), 80)));
    }
    // Left out, it is empty (small models forget it; the judge still reads the code). Given as
    // something else, it is a mistake to be told of, as a name or code of the wrong type is.
    let description = match pick(obj, &["description", "desc"]) {
        Some(Value::String(d)) => d.clone(),
        None => String::new(),
        Some(other) => return err(format!("`description` must be text saying what the tool does, got {}", type_name(other))),
    };
    let input_schema = schema_field(obj, &["inputSchema", "input_schema", "parameters", "input"], "inputSchema")?;
    let output_schema = schema_field(obj, &["outputSchema", "output_schema", "returns", "output"], "outputSchema")?;
    let implementation = implementation(obj)?;
    let test_cases = test_cases(obj, &output_schema)?;
    let scope = scope_of(obj);
    Ok(ForgeRequest { name, description, input_schema, output_schema, implementation, test_cases, scope })
}

#[cfg(test)]
mod tests {
    use super::ForgeTestCase;
    use serde_json::{json, Value};

    #[test]
    fn an_expected_null_output_reads_back_as_written() {
        let case: ForgeTestCase = serde_json::from_value(json!({ "input": { "a": 1 }, "expectedOutput": null })).unwrap();
        assert_eq!(case.expected_output, Some(Value::Null));
        let stored = serde_json::to_value(&case).unwrap();
        assert_eq!(stored, json!({ "input": { "a": 1 }, "expectedOutput": null }));
        assert_eq!(serde_json::from_value::<ForgeTestCase>(stored).unwrap(), case, "a stored test case reads back the same");
        let none: ForgeTestCase = serde_json::from_value(json!({ "input": {} })).unwrap();
        assert_eq!(none.expected_output, None);
    }
}

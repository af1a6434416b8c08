//! Structured final answers: find the JSON in a model's text and check it against `returns`.
//!
//! Small models wrap JSON in prose or code fences; we accept that, but not broken JSON.

use serde_json::Value;

use crate::js_json::well_formed;
use crate::tools::CompiledSchema;

/// Most positions in prose where [`json_values`] tries to parse an embedded value. A try at
/// a brace of quoted code fails within a few characters, but one can read to the end of the
/// text, so a long text full of braces must not turn the search quadratic; a judge quoting a
/// few hundred lines of code before its verdict still fits.
const MAX_EMBEDDED_TRIES: usize = 512;

/// Every JSON value `text` offers, in the order a reader would find them: the whole text;
/// each fenced code block; then each object or array embedded in prose, left to right. A
/// value's insides are not offered again, and the scan stops at a value cut off by the end of
/// the text: broken JSON yields nothing, not the fragments inside it. Prose such as
/// "returns `{ slug }`" before the real value is skipped.
pub fn json_values(text: &str) -> Vec<Value> {
    let text = well_formed(text);
    let trimmed = text.trim();
    if let Ok(v) = serde_json::from_str::<Value>(trimmed) {
        return vec![v];
    }
    let mut found = Vec::new();
    let mut rest = trimmed;
    while let Some((body, after)) = next_fenced_block(rest) {
        if let Ok(v) = serde_json::from_str::<Value>(body.trim()) {
            found.push(v);
        }
        rest = after;
    }
    for v in embedded_in(trimmed) {
        if !found.contains(&v) {
            found.push(v);
        }
    }
    found
}

/// The body of the first fenced code block in `text` (after its info string, such as `json`)
/// and the text after its closing fence.
fn next_fenced_block(text: &str) -> Option<(&str, &str)> {
    let after = &text[text.find("```")? + 3..];
    let body_start = after.find('\n').map(|i| i + 1).unwrap_or(0);
    let end = after[body_start..].find("```")?;
    Some((&after[body_start..body_start + end], &after[body_start + end + 3..]))
}

/// `text` without the code fence around all of it (```` ```js … ``` ````), as small models
/// write code and JSON where a plain string is asked for; `None` when it is not one block.
/// The block closes at the text's end, not at the first fence after it: JSON may hold fenced
/// code in its strings.
pub(crate) fn unfenced(text: &str) -> Option<&str> {
    let inner = text.trim().strip_prefix("```")?.strip_suffix("```")?;
    Some(inner.split_once('\n').map_or(inner, |(_info, body)| body).trim()).filter(|body| !body.is_empty())
}

/// Each object or array embedded in `text`, left to right, once per occurrence (a value
/// written twice is here twice; [`json_values`] offers it once): a value's insides are not
/// offered again, and the scan stops at a value cut off by the end of the text.
pub fn embedded_values(text: &str) -> Vec<Value> {
    embedded_in(&well_formed(text))
}

/// [`embedded_values`] of text already [`well_formed`] (as [`json_values`] has it).
fn embedded_in(text: &str) -> Vec<Value> {
    let mut found = Vec::new();
    let mut at = 0;
    for _ in 0..MAX_EMBEDDED_TRIES {
        let Some(offset) = text[at..].find(['{', '[']) else { break };
        let start = at + offset;
        let mut values = serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
        match values.next() {
            Some(Ok(v)) => {
                at = start + values.byte_offset();
                found.push(v);
            }
            Some(Err(e)) if e.is_eof() => break,
            _ => at = start + 1,
        }
    }
    found
}

/// The first JSON value in `text` (see [`json_values`]).
pub fn extract_json(text: &str) -> Option<Value> {
    json_values(text).into_iter().next()
}

/// The host's own check of a final answer the `returns` schema accepted (a Standard Schema's
/// refinements, in the TS bindings), for the run `run_id`.
#[async_trait::async_trait(?Send)]
pub trait OutputCheck {
    async fn check(&self, value: &Value, run_id: &str) -> Result<(), OutputRefusal>;
}

/// Why an answer did not pass.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputRefusal {
    /// The answer is wrong: the model is asked again with the reason, as for a schema
    /// violation, and it counts against `maxOutputRetries`.
    Refused(String),
    /// The check itself failed (a host bug): asking the model again cannot help, so the run
    /// ends with `output_check_failed`.
    Failed(String),
}

/// Checks a final answer against the `returns` schema: the first JSON value in the text that
/// matches it (prose may quote an example first).
pub fn check_final_answer(text: &str, schema: &CompiledSchema) -> Result<Value, String> {
    let mut first_violation = None;
    for value in json_values(text) {
        match schema.check(&value) {
            Ok(()) => return Ok(value),
            Err(violation) => {
                first_violation.get_or_insert(violation);
            }
        }
    }
    Err(first_violation.unwrap_or_else(|| "the answer contains no valid JSON value".to_string()))
}

/// Whether `text` is one JSON value and nothing else (a lone fenced block counts). An answer cut
/// off at the token limit is taken only so: a value found in cut-off prose may be an example
/// the model quoted on its way to the answer it never finished.
pub fn is_whole_json(text: &str) -> bool {
    let body = unfenced(text).unwrap_or(text).trim();
    serde_json::from_str::<serde::de::IgnoredAny>(&well_formed(body)).is_ok()
}

/// Why an answer cut off at the token limit was not taken (see [`is_whole_json`]).
pub const ANSWER_CUT_OFF: &str =
    "the answer was cut off at the token limit (finish reason `length`) before its JSON value was complete; reply with only the JSON value, shorter";

/// The system-prompt addition that tells the model about `returns`.
pub fn returns_instruction(schema: &Value) -> String {
    format!(
        "When you give your final answer, reply with only a JSON value (no prose) that matches this JSON Schema:\n{}",
        serde_json::to_string(schema).unwrap_or_default()
    )
}

/// The reminder sent when the final answer did not validate.
pub fn returns_reminder(reason: &str) -> String {
    format!("Your answer is not valid: {reason}. Reply again with only a JSON value that matches the required schema.")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unfences_only_a_text_that_is_one_fenced_block() {
        assert_eq!(unfenced("```js\nfunction execute(input) { return {}; }\n```\n"), Some("function execute(input) { return {}; }"));
        assert_eq!(unfenced("  ```\n{\"a\":1}\n```"), Some("{\"a\":1}"));
        // A fence that does not close, text after it, or none at all: left as written.
        assert_eq!(unfenced("```js\nfunction execute(input) {}"), None);
        assert_eq!(unfenced("```js\nf()\n```\nand more"), None);
        assert_eq!(unfenced("function execute(input) { return '```'; }"), None);
        assert_eq!(unfenced("``````"), None);
    }

    #[test]
    fn a_whole_json_answer_is_the_value_alone_or_one_fenced_block() {
        assert!(is_whole_json(" {\"a\":1}\n"));
        assert!(is_whole_json("```json\n[1, 2]\n```"));
        assert!(!is_whole_json("Shape: {\"city\":\"Example\"}. Answer: {\"city\":\"Par"));
        assert!(!is_whole_json("{\"city\":\"Par"));
        assert!(!is_whole_json(""));
    }

    #[test]
    fn finds_json_in_prose_and_fences() {
        assert_eq!(extract_json("{\"a\":1}"), Some(json!({"a":1})));
        assert_eq!(extract_json("Here:\n```json\n{\"a\":2}\n```\nDone."), Some(json!({"a":2})));
        assert_eq!(extract_json("The answer is {\"a\":3}."), Some(json!({"a":3})));
        assert_eq!(extract_json("{\"a\":"), None);
    }

    #[test]
    fn a_lone_surrogate_escape_in_the_answer_reads_as_a_replacement_character() {
        // A model's answer cut inside an emoji, whole, fenced and in prose.
        for text in [r#"{"title":"Party \ud83c"}"#, "```json\n{\"title\":\"Party \\ud83c\"}\n```", r#"Here: {"title":"Party \ud83c"}."#] {
            assert_eq!(extract_json(text), Some(json!({"title":"Party \u{fffd}"})), "{text}");
            assert_eq!(embedded_values(text).len(), 1, "{text}");
        }
        assert!(is_whole_json(r#"{"title":"\udf0d"}"#));
    }

    #[test]
    fn skips_quoted_code_and_prose_braces_but_not_broken_json() {
        let text = "The tool returns `{ slug }`:\n```js\nfunction execute(input) { return { slug: 1 }; }\n```\nVerdict: {\"approved\":true} and {\"b\":[1]}";
        assert_eq!(json_values(text), vec![json!({"approved":true}), json!({"b":[1]})]);
        // A value's insides are not offered on their own; a value cut off ends the scan.
        assert_eq!(json_values("x {\"a\":{\"b\":1}} y"), vec![json!({"a":{"b":1}})]);
        assert_eq!(json_values("x {\"a\":{\"b\":1}, \"c\":"), Vec::<Value>::new());
        // Two fenced blocks: both are offered, in order.
        assert_eq!(json_values("```\n[1]\n```\n```json\n{\"z\":0}\n```"), vec![json!([1]), json!({"z":0})]);
    }
}

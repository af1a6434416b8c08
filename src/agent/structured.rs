//! Structured final answers: find the JSON in a model's text and check it against `returns`.
//!
//! Small models wrap JSON in prose or code fences; we accept that, but not broken JSON.

use serde_json::Value;

use crate::tools::CompiledSchema;

/// Extracts the first JSON value from `text`: the whole text, a fenced block, or the span from
/// the first `{`/`[` to its last matching closer.
pub fn extract_json(text: &str) -> Option<Value> {
    let trimmed = text.trim();
    if let Ok(v) = serde_json::from_str::<Value>(trimmed) {
        return Some(v);
    }
    if let Some(start) = trimmed.find("```") {
        let after = &trimmed[start + 3..];
        let body_start = after.find('\n').map(|i| i + 1).unwrap_or(0);
        if let Some(end) = after[body_start..].find("```") {
            if let Ok(v) = serde_json::from_str::<Value>(after[body_start..body_start + end].trim()) {
                return Some(v);
            }
        }
    }
    for (open, close) in [('{', '}'), ('[', ']')] {
        if let (Some(s), Some(e)) = (trimmed.find(open), trimmed.rfind(close)) {
            if s < e {
                if let Ok(v) = serde_json::from_str::<Value>(&trimmed[s..=e]) {
                    return Some(v);
                }
            }
        }
    }
    None
}

/// Checks a final answer against the `returns` schema.
pub fn check_final_answer(text: &str, schema: &CompiledSchema) -> Result<Value, String> {
    let value = extract_json(text).ok_or_else(|| "the answer contains no valid JSON value".to_string())?;
    schema.check(&value)?;
    Ok(value)
}

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
    fn finds_json_in_prose_and_fences() {
        assert_eq!(extract_json("{\"a\":1}"), Some(json!({"a":1})));
        assert_eq!(extract_json("Here:\n```json\n{\"a\":2}\n```\nDone."), Some(json!({"a":2})));
        assert_eq!(extract_json("The answer is {\"a\":3}."), Some(json!({"a":3})));
        assert_eq!(extract_json("{\"a\":"), None);
    }
}

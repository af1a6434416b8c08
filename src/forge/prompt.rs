//! Prompting (spec scope item 10): the `forge_tool` description, the JSON Schema of its
//! arguments and one worked example, written for small (0.5B) models: short sentences, one
//! complete request to imitate, and the rules the shape check enforces spelled out. The schema
//! shown to the model is strict, but arguments are not checked against it: schemas may arrive
//! as strings, the implementation flat, fields under synonyms, and [`super::normalize`]
//! repairs those or rejects them with a category.

use serde_json::Value;

use crate::model::ToolDefinition;

/// The meta-tool's name.
pub const FORGE_TOOL_NAME: &str = "forge_tool";

/// A complete, correct request (sandbox mode) the model can imitate. Its test cases give inputs
/// only: small models imitate the example, and when it carried expected outputs the 0.5B model
/// wrote its own, computed wrong (`{"sum":130}` for 4+8+15+16+23+42, 68.88 °C for 212 °F), so
/// correct code was rejected; without them its tests run the code on each input and the judge
/// reads the outputs. The description still asks for `expectedOutput` where the model is
/// certain of it (bench/RESULTS.md, real model).
pub const FORGE_TOOL_EXAMPLE: &str = r#"{"name":"slugify","description":"Turn text into a URL slug","inputSchema":{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]},"outputSchema":{"type":"object","properties":{"slug":{"type":"string"}},"required":["slug"]},"implementation":{"mode":"sandbox","code":"function execute(input) { return { slug: input.text.toLowerCase().replace(/[^a-z0-9]+/g, '-').replace(/^-|-$/g, '') }; }"},"testCases":[{"input":{"text":"Hello World!"}},{"input":{"text":"Rust & Wasm"}}]}"#;

/// The description the model sees.
pub const FORGE_TOOL_DESCRIPTION: &str = concat!(
    "Create a new tool when no existing tool fits. The new tool is tested and reviewed, then you can call it by its name in your next step.\n",
    "Give: name (snake_case), description, inputSchema and outputSchema (JSON Schema objects with properties), ",
    "implementation, and at least 2 testCases with non-empty input. The tests run your code on each input and show the outputs to a reviewer. Add expectedOutput to a test case only when you are certain of the exact result.\n",
    "implementation is either {\"mode\":\"sandbox\",\"code\":\"function execute(input) { ... return {...}; }\"} (plain JavaScript, no imports, no network) ",
    "or {\"mode\":\"compose\",\"steps\":[{\"name\":\"a\",\"tool\":\"existing_tool\",\"inputMapping\":{\"field\":\"$input.field\"}}]} ",
    "where values may use $input.x, $prev.x or $steps.a.x (never ${input.x}).\n",
    "execute must return an object with the keys of outputSchema (return { count: n }, never a bare number or string).\n",
    "If the result says success:false, read reason and category, fix the request and call forge_tool again.\n",
    "Example: "
);

/// The full description including the worked example.
pub fn forge_tool_description() -> String {
    format!("{FORGE_TOOL_DESCRIPTION}{FORGE_TOOL_EXAMPLE}")
}

/// The schema of `forge_tool` arguments as shown to the model: one concrete type per field
/// and the nested shape spelled out, in the order of the worked example. Chat templates that
/// render a call skeleton from the parameters (ours for the local Qwen model does) turn this
/// into `{"name": <string>, ..., "implementation": {"mode": "sandbox", "code": <string>},
/// "testCases": [{"input": <object>}]}`. `outputSchema` is required here (not by the forge, which
/// infers one from expected outputs): a server constraining the call to this schema lets a
/// model skip an optional field, and with no expected outputs to infer from, the forge then
/// fails its shape check. When the model was shown
/// a permissive schema (union types, as normalization accepts) every field rendered as `<value>`
/// and the 0.5B model wrote `"testCases": [["input": 212], ...]`, which the server cannot
/// parse (HTTP 500). Arguments are not validated against it: the forge normalizes them.
pub fn forge_tool_advertised_schema() -> Value {
    // Kept as text and parsed when needed: the same value built with `json!` costs several KB of
    // wasm, and the size budget is tight. The test below checks it parses.
    serde_json::from_str(FORGE_TOOL_ADVERTISED_SCHEMA).unwrap_or_default()
}

/// The text of [`forge_tool_advertised_schema`] (key order is the worked example's).
const FORGE_TOOL_ADVERTISED_SCHEMA: &str = r#"{"type":"object","properties":{"name":{"type":"string","description":"snake_case name of the new tool (not forge_tool)"},"description":{"type":"string","description":"what the tool does, one sentence"},"inputSchema":{"type":"object","properties":{"type":{"type":"string","enum":["object"]},"properties":{"type":"object"}},"description":"JSON Schema of the input: {\"type\":\"object\",\"properties\":{...}}"},"outputSchema":{"type":"object","properties":{"type":{"type":"string","enum":["object"]},"properties":{"type":"object"}},"description":"JSON Schema of the output"},"implementation":{"type":"object","description":"{\"mode\":\"sandbox\",\"code\":\"function execute(input) {...}\"} or {\"mode\":\"compose\",\"steps\":[...]}","properties":{"mode":{"type":"string","enum":["sandbox","compose"]},"code":{"type":"string"}}},"testCases":{"type":"array","description":"at least 2 test cases: [{\"input\":{...}}, {\"input\":{...}}]; a case may also give \"expectedOutput\":{...} when you are certain of it","minItems":2,"items":{"type":"object","properties":{"input":{"type":"object"}}}}},"required":["name","description","inputSchema","outputSchema","implementation","testCases"]}"#;

/// The tool definition offered to the model (the advertised schema; see
/// [`forge_tool_advertised_schema`]).
pub fn forge_tool_definition() -> ToolDefinition {
    ToolDefinition { name: FORGE_TOOL_NAME.into(), description: forge_tool_description(), input_schema: forge_tool_advertised_schema() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_advertised_schema_parses_in_the_worked_examples_order() {
        let schema = forge_tool_advertised_schema();
        let keys: Vec<&str> = schema["properties"].as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, ["name", "description", "inputSchema", "outputSchema", "implementation", "testCases"]);
        assert_eq!(schema["properties"]["testCases"]["minItems"], json!(2));
        assert_eq!(schema["required"], json!(["name", "description", "inputSchema", "outputSchema", "implementation", "testCases"]));
    }

    #[test]
    fn the_description_warns_off_template_literal_references() {
        // Small models write JavaScript's `${input.x}`, which the build refuses: they are told first.
        assert!(FORGE_TOOL_DESCRIPTION.contains("$input.x, $prev.x or $steps.a.x (never ${input.x})"));
    }
}

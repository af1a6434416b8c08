//! One tool call, end to end: parse the model's raw arguments, validate them against the input
//! schema, run the handler, bound and check the result. Every failure becomes a
//! [`ToolFailure`] the model can read; nothing here aborts the run.

use serde_json::Value;

use super::{CallContext, Tool, ToolFailure, ToolSet};

/// Bounds applied to every tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecutionLimits {
    /// Largest serialized result (bytes of JSON) passed back to the model.
    pub max_result_bytes: usize,
}

impl Default for ExecutionLimits {
    fn default() -> Self {
        Self { max_result_bytes: 64 * 1024 }
    }
}

/// Outcome of one call: the parsed arguments (when they parsed) and the result.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutcome {
    pub arguments: Option<Value>,
    pub result: Result<Value, ToolFailure>,
}

/// Parses arguments text the way models actually produce it: JSON, possibly empty.
pub(crate) fn parse_arguments(raw: &str) -> Result<Value, ToolFailure> {
    let trimmed = raw.trim();
    if trimmed.is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    let too_deep = || ToolFailure::new("invalid_arguments", format!("arguments nest more than {} levels deep", super::MAX_VALUE_DEPTH));
    let args: Value = serde_json::from_str(trimmed).map_err(|e| match super::is_too_deep(&e) {
        true => too_deep(),
        false => ToolFailure::new("invalid_arguments", format!("arguments are not valid JSON ({e})")),
    })?;
    if super::nesting_depth(&args) > super::MAX_VALUE_DEPTH {
        return Err(too_deep());
    }
    Ok(args)
}

/// Whether `tool` gets `raw_arguments` as they are, a JSON string, without their being parsed
/// (see [`ToolHandler::raw_arguments_past`](super::ToolHandler::raw_arguments_past)).
pub fn takes_unparsed(tool: &Tool, raw_arguments: &str) -> bool {
    let handler = tool.handler();
    handler.accepts_raw_arguments() && handler.raw_arguments_past().is_some_and(|max| raw_arguments.len() > max)
}

/// Runs the call `name(raw_arguments)` against `tools`.
pub async fn execute_call(tools: &ToolSet, name: &str, raw_arguments: &str, ctx: &CallContext, limits: ExecutionLimits) -> ToolOutcome {
    let Some(tool) = tools.get(name) else {
        let known: Vec<&str> = tools.names().collect();
        return ToolOutcome {
            arguments: None,
            // The name is the model's: quoted in part (it goes back into the conversation).
            result: Err(ToolFailure::new("unknown_tool", format!("no tool named `{}`; available tools: {}", super::shorten(name, 80), known.join(", ")))),
        };
    };
    let parsed = (!takes_unparsed(tool, raw_arguments)).then(|| parse_arguments(raw_arguments));
    let args = match parsed {
        Some(Ok(args)) => args,
        Some(Err(failure)) if !tool.handler().accepts_raw_arguments() => return ToolOutcome { arguments: None, result: Err(failure) },
        _ => Value::String(raw_arguments.to_string()),
    };
    let result = invoke(tool, args.clone(), ctx).await.and_then(|output| {
        let size = super::json_len(&output);
        if size > limits.max_result_bytes {
            return Err(super::result_too_large(name, &format!("{size} bytes of JSON"), limits.max_result_bytes));
        }
        Ok(output)
    });
    ToolOutcome { arguments: Some(args), result }
}

/// Runs `tool` with already-parsed `args`: validates them against the input schema, runs the
/// handler and checks the output against the output schema (an invalid output is never a
/// success). Used by the executor, compose pipelines and forge tests.
pub async fn invoke(tool: &Tool, args: Value, ctx: &CallContext) -> Result<Value, ToolFailure> {
    invoke_keeping_output(tool, args, ctx).await.map_err(|(failure, _)| failure)
}

/// [`invoke`], except that an `invalid_output` failure comes with the output that violated
/// the schema: forge tests report what the code returned, not only that it was wrong.
pub async fn invoke_keeping_output(tool: &Tool, args: Value, ctx: &CallContext) -> Result<Value, (ToolFailure, Option<Value>)> {
    let name = &tool.name;
    if let Err(violations) = tool.input_schema().check(&args) {
        return Err((ToolFailure::new("invalid_arguments", format!("arguments do not match the input schema of `{name}`: {violations}")), None));
    }
    let output = tool.handler().call(args, ctx).await.map_err(|failure| (failure, None))?;
    match output_violations(tool, &output) {
        Some(failure) => Err((failure, Some(output))),
        None => Ok(output),
    }
}

/// `output` when it matches `tool`'s output schema (or it has none); otherwise an
/// `invalid_output` failure.
pub fn check_output(tool: &Tool, output: Value) -> Result<Value, ToolFailure> {
    match output_violations(tool, &output) {
        Some(failure) => Err(failure),
        None => Ok(output),
    }
}

fn output_violations(tool: &Tool, output: &Value) -> Option<ToolFailure> {
    let violations = tool.output_schema()?.check(output).err()?;
    Some(ToolFailure::new("invalid_output", format!("`{}` returned output that violates its output schema: {violations}", tool.name)))
}

//! The `forge_tool` meta-tool: the [`ToolHandler`] through which the agent loop lets the model
//! forge. It runs the registry's forge for the calling session and returns the outcome as the
//! tool result — `{success: true, name, tier, version, ...}` or `{success: false, reason,
//! category}` — never a [`ToolFailure`] for a bad request, so the model can read why and retry.

use std::rc::Weak;

use async_trait::async_trait;
use serde_json::{json, Value};

use crate::registry::Registry;
use crate::tools::{json_len, shorten, CallContext, ToolFailure, ToolHandler};

use super::pipeline::ForgeResult;

/// Forges through a registry (held weakly: the registry owns the tool sets that hold this).
#[derive(Debug, Clone)]
pub struct ForgeToolHandler {
    registry: Weak<Registry>,
}

impl ForgeToolHandler {
    pub fn new(registry: Weak<Registry>) -> Self {
        Self { registry }
    }
}

#[async_trait(?Send)]
impl ToolHandler for ForgeToolHandler {
    fn accepts_raw_arguments(&self) -> bool {
        true
    }

    fn raw_arguments_past(&self) -> Option<usize> {
        Some(super::MAX_REQUEST_TEXT_BYTES)
    }

    fn may_need_approval(&self) -> bool {
        false
    }

    async fn call(&self, args: Value, ctx: &CallContext) -> Result<Value, ToolFailure> {
        // Only a run's own step forges: never a pipeline's step or a test (a pipeline step naming forge_tool is refused by shape_check as well).
        if ctx.trial || ctx.depth > 0 {
            return Err(ToolFailure::new("denied", "forge_tool can only be called by the model in a run, not from a pipeline or a test"));
        }
        let Some(registry) = self.registry.upgrade() else {
            return Err(ToolFailure::new("execution_failed", "the tool registry is gone"));
        };
        // An abort that cut the forge short (the judge's request aborted with the run, say) is
        // no verdict on the request: nothing is recorded, and the model is not told to fix it.
        let Some(result) = registry.forge_for_call(&args, ctx).await else {
            return Err(ToolFailure::new(
                "aborted",
                "the run was aborted while this forge was checked: nothing was registered or counted; call forge_tool again with the same request",
            ));
        };
        let mut answer = match (&result.tool, result.success) {
            (Some(tool), true) => json!({
                "success": true,
                "name": tool.name,
                "tier": tool.tier,
                "version": tool.version,
                "message": if result.unchanged {
                    format!("Tool `{}` already exists exactly as requested, so nothing was forged again. Call it by name in your next step.", tool.name)
                } else {
                    format!("Tool `{}` is ready. Call it by name in your next step.", tool.name)
                },
                "inputSchema": tool.input_schema,
            }),
            _ => rejection_answer(&result),
        };
        if let Some(limit) = ctx.result_limit {
            fit_result(&mut answer, limit);
        }
        Ok(answer)
    }
}

/// A rejection as the model reads it: the reason meant for it where the host's is not (a judge
/// provider's error), and the hint to fix the request only where the reason is about it.
fn rejection_answer(result: &ForgeResult) -> Value {
    let for_model = result.reason.as_ref().and_then(|r| r.for_model());
    let mut answer = json!({
        "success": false,
        "reason": for_model.or(result.reason.as_deref()),
        "category": result.category,
    });
    if for_model.is_none() {
        answer["hint"] = json!("Fix the request according to the reason and call forge_tool again.");
    }
    answer
}

/// Shortens a `forge_tool` result past the run's `maxResultBytes` so the model still reads
/// what happened: refused as `result_too_large`, a forged tool would look like a failure (and
/// be forged again), a rejection would lose its reason and category. A success drops its
/// `inputSchema` (the next turn's tool definition carries it); a rejection cuts its reason,
/// whose start says how many tests failed. A limit too small even for that is left to refuse it.
fn fit_result(answer: &mut Value, limit: usize) {
    let over = |answer: &Value| json_len(answer).saturating_sub(limit);
    if over(answer) == 0 {
        return;
    }
    let Some(fields) = answer.as_object_mut() else { return };
    fields.remove("inputSchema");
    let Some(reason) = fields.get("reason").and_then(Value::as_str).map(str::to_owned) else { return };
    let mut chars = reason.chars().count();
    // Escapes make a character count for several bytes: cut again until the result fits.
    while over(answer) > 0 && chars > 0 {
        chars = chars.saturating_sub(over(answer).max(1));
        answer["reason"] = Value::String(shorten(&reason, chars));
    }
}

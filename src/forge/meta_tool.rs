//! The `forge_tool` meta-tool: the [`ToolHandler`] through which the agent loop lets the model
//! forge. It runs the registry's forge for the calling session and returns the outcome as the
//! tool result — `{success: true, name, tier, version, ...}` or `{success: false, reason,
//! category}` — never a [`ToolFailure`] for a bad request, so the model can read why and retry.

use std::rc::Weak;

use async_trait::async_trait;
use serde_json::{json, Value};

use crate::registry::Registry;
use crate::tools::{CallContext, ToolFailure, ToolHandler};

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

    async fn call(&self, args: Value, ctx: &CallContext) -> Result<Value, ToolFailure> {
        // Only a run's own step forges: never a pipeline's step or a test (a pipeline step naming forge_tool is refused by shape_check as well).
        if ctx.trial || ctx.depth > 0 {
            return Err(ToolFailure::new("denied", "forge_tool can only be called by the model in a run, not from a pipeline or a test"));
        }
        let Some(registry) = self.registry.upgrade() else {
            return Err(ToolFailure::new("execution_failed", "the tool registry is gone"));
        };
        let result = registry.forge_for_call(&args, ctx).await;
        Ok(match (&result.tool, result.success) {
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
            _ => json!({
                "success": false,
                "reason": result.reason,
                "category": result.category,
                "hint": "Fix the request according to the reason and call forge_tool again.",
            }),
        })
    }
}

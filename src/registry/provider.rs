//! The registry as the agent's per-turn tool provider, and the call-counting wrapper every
//! registered tool runs through (stats: calls, success rate, average latency; agent/shared
//! stats written in batches every `statsFlushEvery` calls and at session end).

use std::rc::{Rc, Weak};

use async_trait::async_trait;
use serde_json::Value;

use crate::agent::ToolProvider;
use crate::forge::UNAVAILABLE_CODE;
use crate::tools::{check_output, CallContext, Tool, ToolFailure, ToolHandler, ToolSet};

use super::{Registry, Tier};

/// Runs a registered tool and counts the call. The wrapping tool checks the input; the output
/// is checked here, once, so an output that violates the schema counts as a failure.
struct TrackedHandler {
    inner: Tool,
    registry: Weak<Registry>,
    tier: Tier,
    session: String,
    /// The content hash of the version built: a promotion may move the tool while it runs.
    hash: String,
}

#[async_trait(?Send)]
impl ToolHandler for TrackedHandler {
    async fn call(&self, args: Value, ctx: &CallContext) -> Result<Value, ToolFailure> {
        // Trials (forge tests, promotion re-runs) are counted nowhere, so they skip the clock.
        let registry = if ctx.trial { None } else { self.registry.upgrade() };
        // A run's tools are built once per turn: a version demoted, rolled back or replaced
        // while the model answered must not run at the tier it no longer holds.
        if registry.as_ref().is_some_and(|r| r.state.borrow().holder(self.tier, &self.session, &self.inner.name, &self.hash).is_none()) {
            return Err(ToolFailure::new("denied", format!("`{}` was demoted, rolled back or replaced since this turn began: it is not run", self.inner.name)));
        }
        let started = registry.as_ref().map(|r| r.env().elapsed_ms()).unwrap_or(0.0);
        let result = match self.inner.handler().call(args, ctx).await {
            Ok(output) => check_output(&self.inner, output),
            Err(failure) => Err(failure),
        };
        // A call the sandbox turned away (its queue full, its workers gone) ran none of the
        // tool's code: counted, it would lower the tool's success rate for the host's load.
        let registry = registry.filter(|_| !result.as_ref().is_err_and(|f| f.code == UNAVAILABLE_CODE));
        if let Some(registry) = registry {
            let latency = registry.env().elapsed_ms() - started;
            if registry.record_call(self.tier, &self.session, &self.inner.name, &self.hash, result.is_ok(), latency) {
                // Best effort: failed stats writes stay dirty and are retried at the next flush.
                let _ = registry.flush_stats().await;
            }
            // The call that reaches the threshold promotes the tool (its outcome is in the
            // events and the audit trail; the caller gets its result either way, without
            // waiting for the review when the host can run it in the background).
            if self.tier == Tier::Session && result.is_ok() && registry.auto_promotion_due(&self.inner.name, &self.session) {
                registry.promote_automatically(&self.inner.name, &self.session, &ctx.run_id).await;
            }
        }
        result
    }
}

/// Wraps a built forged tool so its calls are counted for (`tier`, `session`). The wrapper
/// has no output schema of its own: [`TrackedHandler`] checks the output (one check per call).
pub(super) fn tracked(inner: Tool, registry: Weak<Registry>, tier: Tier, session: &str, hash: &str) -> Option<Tool> {
    let input = inner.input_schema().source().clone();
    let name = inner.name.clone();
    let description = inner.description.clone();
    let handler = Rc::new(TrackedHandler { inner, registry, tier, session: session.to_string(), hash: hash.to_string() });
    Tool::new_by(crate::tools::SchemaAuthor::Untrusted, name, description, &input, None, handler).ok()
}

impl ToolProvider for Registry {
    /// The agent's own tools are the host tools; the registry adds its tiers and `forge_tool`.
    fn tools(&self, session_id: &str, host: &ToolSet) -> ToolSet {
        let known: Vec<String> = self.host_tool_names();
        if !known.iter().map(String::as_str).eq(host.names()) {
            self.set_host_tools(host.clone());
        }
        self.tool_set(session_id)
    }
}

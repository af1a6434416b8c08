//! Sandbox mode (spec scope item 4): a forged tool whose handler runs model-written JavaScript
//! through a [`SandboxRunner`] (in wasm, the Worker-hosted sandbox of DESIGN decision 2). The
//! request's allowlist is intersected with the configured `allowedSandboxAPIs`, so a model can
//! only narrow, never widen, what its code may reach.

use std::rc::Rc;

use async_trait::async_trait;
use serde_json::Value;

use crate::sandbox::{refused_api, SandboxRequest, SandboxRunner, SandboxStatus};
use crate::tools::{CallContext, ToolFailure, ToolHandler};

/// Runs one forged tool's code in the sandbox.
pub struct SandboxToolHandler {
    runner: Rc<dyn SandboxRunner>,
    code: String,
    allowlist: Vec<String>,
    /// The agent's `allowedSandboxAPIs`, to explain a refusal the request cannot fix.
    allowed: Vec<String>,
}

impl std::fmt::Debug for SandboxToolHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxToolHandler").field("allowlist", &self.allowlist).finish_non_exhaustive()
    }
}

/// `requested ∩ allowed`, in the order requested, without duplicates.
pub fn effective_allowlist(requested: &[String], allowed: &[String]) -> Vec<String> {
    let mut out: Vec<String> = vec![];
    for api in requested {
        if allowed.contains(api) && !out.contains(api) {
            out.push(api.clone());
        }
    }
    out
}

impl SandboxToolHandler {
    /// A handler for `code`, allowed the APIs in both `requested` and `allowed`.
    pub fn new(runner: Rc<dyn SandboxRunner>, code: impl Into<String>, requested: &[String], allowed: &[String]) -> Self {
        Self { runner, code: code.into(), allowlist: effective_allowlist(requested, allowed), allowed: allowed.to_vec() }
    }

    /// The sandbox tells code that uses an API outside its request's allowlist to add it; when
    /// the agent does not allow that API at all, adding it cannot help (the allowlist is
    /// intersected with `allowedSandboxAPIs`), so the message says that instead.
    fn explain_refusal(&self, code: &str, message: String) -> String {
        let api = (code == "not_allowlisted").then(|| refused_api(&message)).flatten();
        match api {
            Some(api) if !self.allowed.iter().any(|a| a == api) => {
                format!("'{api}' is not available to this agent's forged tools (allowedSandboxAPIs does not include it): write the tool without it")
            }
            _ => message,
        }
    }

    /// The APIs this tool's code may use.
    pub fn allowlist(&self) -> &[String] {
        &self.allowlist
    }
}

/// The sandbox's error codes for an execution it never started: its queue was full, its
/// workers failed to start, or it was closed.
const SANDBOX_UNAVAILABLE: [&str; 3] = ["queue_full", "worker_start", "closed"];

/// The [`ToolFailure`] code of a call the sandbox could not run ([`SANDBOX_UNAVAILABLE`]).
pub const UNAVAILABLE_CODE: &str = "sandbox_unavailable";

/// The [`ToolFailure`] code for a non-`ok` sandbox status.
pub fn failure_code(status: SandboxStatus) -> &'static str {
    match status {
        SandboxStatus::Ok => "ok",
        SandboxStatus::Error => "execution_failed",
        SandboxStatus::Timeout => "sandbox_timeout",
        SandboxStatus::Memory => "sandbox_memory",
        SandboxStatus::Rejected => "sandbox_rejected",
    }
}

#[async_trait(?Send)]
impl ToolHandler for SandboxToolHandler {
    async fn call(&self, args: Value, _ctx: &CallContext) -> Result<Value, ToolFailure> {
        let request = SandboxRequest { code: self.code.clone(), input: args, allowlist: self.allowlist.clone() };
        let result = self.runner.execute(&request).await;
        match result.status {
            SandboxStatus::Ok => Ok(result.output.unwrap_or(Value::Null)),
            status => {
                // The sandbox could not run the code at all (full queue, workers that would not
                // start, a closed pool): said apart from a failure of the code, which callers
                // and the forge's tests must not blame on it.
                let unavailable = status == SandboxStatus::Error && result.error.as_ref().is_some_and(|e| SANDBOX_UNAVAILABLE.contains(&e.code.as_str()));
                let message = result
                    .error
                    .map(|e| format!("{}: {}", e.code, self.explain_refusal(&e.code, e.message)))
                    .unwrap_or_else(|| format!("sandbox execution ended with status {status:?}"));
                Err(ToolFailure::new(if unavailable { UNAVAILABLE_CODE } else { failure_code(status) }, message))
            }
        }
    }
}

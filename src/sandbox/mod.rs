//! The sandbox boundary: the [`SandboxRunner`] trait through which the core runs forged
//! JavaScript, and its request/result types (mirroring `createSandbox().execute()` in TS).
//!
//! In wasm the runner is the TS sandbox host (a Worker pool, DESIGN decision 2); natively the
//! Boa runner (feature `sandbox`) runs in-process for tests.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The message of the `not_allowlisted` refusal: code uses the host API `api`, which its
/// request's allowlist does not grant. Written here, beside [`refused_api`], which reads it back.
pub fn not_allowlisted_message(api: &str) -> String {
    format!("'{api}' is used but not in the request's allowlist (add \"{api}\" to allowlist)")
}

/// The API a [`not_allowlisted_message`] names (the core explains a refusal the request
/// cannot fix, when the agent does not allow that API at all).
pub fn refused_api(message: &str) -> Option<&str> {
    message.strip_prefix('\'')?.split('\'').next()
}

/// One execution of model-written code.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxRequest {
    /// Source defining `function execute(input)` (sync or async).
    pub code: String,
    pub input: Value,
    /// Opt-in host APIs (`fetch`, `crypto`); empty by default.
    #[serde(default)]
    pub allowlist: Vec<String>,
}

/// How an execution ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxStatus {
    Ok,
    Error,
    Timeout,
    Memory,
    Rejected,
}

/// Error detail of a non-`ok` execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxFailure {
    pub code: String,
    pub message: String,
}

/// The result of one execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxResult {
    pub status: SandboxStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<SandboxFailure>,
    #[serde(default)]
    pub logs: Vec<String>,
    #[serde(default)]
    pub duration_ms: f64,
}

/// Runs untrusted code. Never fails as a call: every outcome is a [`SandboxResult`].
#[async_trait(?Send)]
pub trait SandboxRunner {
    async fn execute(&self, request: &SandboxRequest) -> SandboxResult;
}

#[cfg(feature = "sandbox")]
pub mod boa;

//! Shared helpers for the sandbox test files (Boa runner in-process).
#![allow(dead_code)]

use crucible::sandbox::boa::{BoaRunner, SandboxLimits};
use crucible::sandbox::{SandboxRequest, SandboxResult, SandboxRunner, SandboxStatus};
use serde_json::{json, Value};

pub fn runner() -> BoaRunner {
    // Smaller CPU budgets than production: debug-build Boa is ~20x slower.
    BoaRunner::new(SandboxLimits { timeout_ms: 2_000, loop_iteration_limit: 1_000_000, max_jobs: 5_000, ..SandboxLimits::default() })
}

pub fn request(code: &str, input: Value) -> SandboxRequest {
    SandboxRequest { code: code.into(), input, allowlist: vec![] }
}

pub fn run(runner: &BoaRunner, code: &str, input: Value) -> SandboxResult {
    futures::executor::block_on(runner.execute(&request(code, input)))
}

pub fn run_with(runner: &BoaRunner, code: &str, input: Value, allowlist: &[&str]) -> SandboxResult {
    let mut req = request(code, input);
    req.allowlist = allowlist.iter().map(|s| s.to_string()).collect();
    futures::executor::block_on(runner.execute(&req))
}

#[track_caller]
pub fn assert_ok(result: &SandboxResult, expected: Value) {
    assert_eq!(result.status, SandboxStatus::Ok, "result: {result:?}");
    assert_eq!(result.output.as_ref(), Some(&expected), "result: {result:?}");
}

#[track_caller]
pub fn assert_status(result: &SandboxResult, status: SandboxStatus, code: &str) {
    assert_eq!(result.status, status, "result: {result:?}");
    let got = result.error.as_ref().map(|e| e.code.as_str()).unwrap_or("");
    assert_eq!(got, code, "result: {result:?}");
}

/// A probe that must succeed after any attack: the realm still serves clean executions.
#[track_caller]
pub fn assert_still_healthy(runner: &BoaRunner) {
    let r = run(runner, "function execute(i){ return { n: i.n + 1, clean: Object.keys(Object.prototype).length === 0 && [].polluted === undefined && ({}).polluted === undefined }; }", json!({"n": 1}));
    assert_ok(&r, json!({"n": 2, "clean": true}));
}

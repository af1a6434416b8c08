//! [`BoaRunner`]: validates, runs `execute(input)` in the hardened realm, drives its promise
//! under the job budget and deadline, converts the result, and maps every outcome to a
//! [`SandboxResult`]. Host errors reach the guest only as fresh guest errors; guest errors
//! leave only as sanitised strings read without running guest code.

use std::{cell::RefCell, rc::Rc};

use async_trait::async_trait;
use boa_engine::{
    builtins::promise::PromiseState, object::builtins::JsPromise, property::PropertyKey, Context, EngineError, JsError, JsString, JsValue, RuntimeLimitError,
    Script, Source,
};
use serde_json::Value;

use super::{
    clock::now_ms,
    convert::{from_json, to_json, Caps},
    host_api::{sanitize, ExecState, FetchHost, HostLimits, HostState, NoFetch},
    jobs::Stop,
    realm::{HardenedRealm, RealmLimits},
    validate::{validate, SourceLimits},
};
use crate::sandbox::{SandboxFailure, SandboxRequest, SandboxResult, SandboxRunner, SandboxStatus};

/// Every limit of the runner. `Default` matches `createSandbox()` defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SandboxLimits {
    /// Wall clock for one execution, async work included (checked between jobs here; the
    /// Worker host preempts synchronous code).
    pub timeout_ms: u64,
    /// Memory budget; `ArrayBuffer` allocations are capped at a quarter of it.
    pub memory_bytes: u64,
    /// Promise jobs per execution.
    pub max_jobs: u64,
    /// Boa's loop-iteration limit (per loop, per call frame).
    pub loop_iteration_limit: u64,
    pub recursion_limit: usize,
    pub stack_size_limit: usize,
    pub max_output_bytes: usize,
    pub max_output_nodes: usize,
    pub max_output_depth: usize,
    pub max_input_depth: usize,
    pub max_log_entries: usize,
    pub max_log_bytes: usize,
    pub max_source_bytes: usize,
    pub max_nesting: usize,
    pub max_operator_chain: usize,
    /// Weighted operators, keywords and brackets one expression or statement may nest (see
    /// `validate::SourceLimits`).
    pub max_expression_nesting: usize,
    pub max_fetches: u32,
    pub max_fetch_body_bytes: usize,
    /// Reuse one frozen realm across executions (default) or build a fresh one per call.
    pub reuse_realm: bool,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        Self {
            timeout_ms: 5_000,
            memory_bytes: 128 << 20,
            max_jobs: 100_000,
            loop_iteration_limit: 50_000_000,
            recursion_limit: 400,
            stack_size_limit: 64 * 1024,
            max_output_bytes: 4 << 20,
            max_output_nodes: 200_000,
            max_output_depth: 64,
            max_input_depth: 64,
            max_log_entries: 200,
            max_log_bytes: 32 * 1024,
            max_source_bytes: 256 * 1024,
            max_nesting: 64,
            max_operator_chain: 512,
            // In the Worker the engine's frames live on V8's stack, whose room varies with how far
            // V8 has tiered the code up: 300 nested `new` or 380 `b=` around 60 brackets could
            // overflow it (measured), 256 with the weights below kept a margin.
            max_expression_nesting: 256,
            max_fetches: 16,
            max_fetch_body_bytes: 4 << 20,
            reuse_realm: true,
        }
    }
}

/// The in-process Boa runner (natively for tests; inside the sandbox Worker in wasm).
pub struct BoaRunner {
    limits: SandboxLimits,
    fetch_host: Rc<dyn FetchHost>,
    realm: RefCell<Option<HardenedRealm>>,
}

impl std::fmt::Debug for BoaRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoaRunner").field("limits", &self.limits).finish_non_exhaustive()
    }
}

struct Outcome {
    status: SandboxStatus,
    output: Option<Value>,
    error: Option<SandboxFailure>,
    /// The realm must be rebuilt (a limit fired mid-execution).
    discard_realm: bool,
}

impl Outcome {
    fn ok(output: Value) -> Self {
        Self { status: SandboxStatus::Ok, output: Some(output), error: None, discard_realm: false }
    }
    fn fail(status: SandboxStatus, code: &str, message: impl Into<String>) -> Self {
        Self { status, output: None, error: Some(SandboxFailure { code: code.into(), message: sanitize(&message.into(), 2_000) }), discard_realm: false }
    }
    fn discarding(mut self) -> Self {
        self.discard_realm = true;
        self
    }
}

impl BoaRunner {
    /// A runner without `fetch` (requests that allowlist it get a refusing host).
    pub fn new(limits: SandboxLimits) -> Self {
        Self::with_fetch_host(limits, Rc::new(NoFetch))
    }

    pub fn with_fetch_host(limits: SandboxLimits, fetch_host: Rc<dyn FetchHost>) -> Self {
        Self { limits, fetch_host, realm: RefCell::new(None) }
    }

    pub fn limits(&self) -> &SandboxLimits {
        &self.limits
    }

    /// Builds the realm now so the first execution does not pay for it.
    pub fn warm(&self) -> Result<(), String> {
        let mut slot = self.realm.try_borrow_mut().map_err(|_| "runner is busy".to_string())?;
        if slot.is_none() {
            *slot = Some(self.build_realm().map_err(|e| e.to_string())?);
        }
        Ok(())
    }

    /// Objects frozen when the realm was built (0 before it is built).
    pub fn frozen_objects(&self) -> usize {
        self.realm.borrow().as_ref().map_or(0, |r| r.frozen_objects)
    }

    fn build_realm(&self) -> Result<HardenedRealm, JsError> {
        let l = &self.limits;
        let host = Rc::new(HostState {
            exec: RefCell::new(ExecState::default()),
            limits: HostLimits {
                max_log_entries: l.max_log_entries,
                max_log_bytes: l.max_log_bytes,
                max_fetches: l.max_fetches,
                max_fetch_body_bytes: l.max_fetch_body_bytes,
                max_fetch_request_bytes: 1 << 20,
            },
            fetch_host: self.fetch_host.clone(),
            make_response: RefCell::new(None),
        });
        HardenedRealm::build(
            RealmLimits {
                max_buffer_size: (l.memory_bytes / 4).min(256 << 20),
                loop_iteration_limit: l.loop_iteration_limit,
                recursion_limit: l.recursion_limit,
                stack_size_limit: l.stack_size_limit,
            },
            host,
        )
    }

    // Holding the realm's borrow across awaits is the point: it is the one-execution-at-a-time
    // guard, and `try_borrow_mut` turns a concurrent call into a `busy` result, never a panic.
    #[allow(clippy::await_holding_refcell_ref)]
    async fn run(&self, request: &SandboxRequest, logs: &mut Vec<String>) -> Outcome {
        let l = &self.limits;
        let source_limits = SourceLimits {
            max_source_bytes: l.max_source_bytes,
            max_nesting: l.max_nesting,
            max_operator_chain: l.max_operator_chain,
            max_expression_nesting: l.max_expression_nesting,
        };
        let Ok(mut slot) = self.realm.try_borrow_mut() else {
            return Outcome::fail(SandboxStatus::Error, "busy", "the runner executes one request at a time");
        };
        if slot.is_none() || !l.reuse_realm {
            match self.build_realm() {
                Ok(realm) => *slot = Some(realm),
                Err(e) => return Outcome::fail(SandboxStatus::Error, "internal", format!("realm build failed: {e}")),
            }
        }
        let realm = slot.as_mut().expect("realm was just built");
        // Code seen before was validated (validation depends on the allowlist too: cached
        // entries are keyed by both).
        let key = cache_key(request);
        if !realm.compiled.iter().any(|(k, _)| *k == key) {
            if let Err(rejection) = validate(&request.code, &request.allowlist, &source_limits) {
                return Outcome::fail(SandboxStatus::Rejected, rejection.code, rejection.message);
            }
        }
        realm.executor.clear();
        *realm.host.exec.borrow_mut() = ExecState {
            allow_fetch: request.allowlist.iter().any(|a| a == "fetch"),
            allow_crypto: request.allowlist.iter().any(|a| a == "crypto"),
            ..ExecState::default()
        };
        let deadline = now_ms() + l.timeout_ms as f64;
        let outcome = self.run_in(realm, request, deadline).await;
        realm.executor.clear();
        logs.append(&mut realm.host.exec.borrow_mut().logs);
        if outcome.discard_realm {
            *slot = None;
        }
        outcome
    }

    async fn run_in(&self, realm: &mut HardenedRealm, request: &SandboxRequest, deadline: f64) -> Outcome {
        let l = &self.limits;
        let key = cache_key(request);
        let cached = realm.compiled.iter().position(|(k, _)| *k == key);
        let factory = match cached {
            Some(i) => {
                let entry = realm.compiled.remove(i);
                let factory = entry.1.clone();
                realm.compiled.push(entry);
                factory
            }
            None => {
                let context = &mut realm.context;
                // The code becomes the body of a strict function: its declarations are locals.
                let wrapped =
                    format!("(function (fetch, crypto) {{ 'use strict';\n{}\n;return typeof execute === 'function' ? execute : undefined; }})", request.code);
                let script = match Script::parse(Source::from_bytes(&wrapped), None, context) {
                    Ok(s) => s,
                    Err(e) => return Outcome::fail(SandboxStatus::Rejected, "syntax", describe_error(&e, context)),
                };
                let factory = match script.evaluate(context) {
                    Ok(v) => v,
                    Err(e) => return error_outcome(e, context),
                };
                let Some(factory) = factory.as_callable() else {
                    return Outcome::fail(SandboxStatus::Error, "internal", "wrapper did not produce a function");
                };
                if let Err(e) = factory.set_integrity_level(boa_engine::object::IntegrityLevel::Frozen, context) {
                    return error_outcome(e, context);
                }
                if realm.compiled.len() >= COMPILED_CACHE {
                    realm.compiled.remove(0);
                }
                realm.compiled.push((key, factory.clone()));
                factory
            }
        };
        let context = &mut realm.context;
        let fetch: JsValue = if request.allowlist.iter().any(|a| a == "fetch") { realm.fetch.clone().into() } else { JsValue::undefined() };
        let crypto: JsValue = if request.allowlist.iter().any(|a| a == "crypto") { realm.crypto.clone().into() } else { JsValue::undefined() };
        let execute = match factory.call(&JsValue::undefined(), &[fetch, crypto], context) {
            Ok(v) => v,
            Err(e) => return error_outcome(e, context),
        };
        let Some(execute) = execute.as_callable() else {
            return Outcome::fail(SandboxStatus::Error, "no_execute", "the code must define function execute(input)");
        };
        let input = match from_json(&request.input, l.max_input_depth, context) {
            Ok(v) => v,
            Err(e) => return Outcome::fail(SandboxStatus::Error, "input", describe_error(&e, context)),
        };
        let returned = match execute.call(&JsValue::undefined(), &[input], context) {
            Ok(v) => v,
            Err(e) => return error_outcome(e, context),
        };
        // Only a genuine Promise is awaited; a thenable result is plain data (never `then`).
        let promise = returned.as_object().and_then(|o| JsPromise::from_object(o.clone()).ok());
        let value = match promise {
            None => returned,
            Some(promise) => {
                let executor = realm.executor.clone();
                match executor.drive(&promise, context, l.max_jobs, deadline).await {
                    Ok(()) => {}
                    Err(Stop::Budget(n)) => return Outcome::fail(SandboxStatus::Timeout, "job_budget", format!("more than {n} promise jobs ran")).discarding(),
                    Err(Stop::Deadline) => {
                        return Outcome::fail(SandboxStatus::Timeout, "deadline", format!("execution exceeded {} ms", l.timeout_ms)).discarding()
                    }
                    Err(Stop::Stalled) => return Outcome::fail(SandboxStatus::Error, "never_settled", "execute() returned a promise that can never settle"),
                    Err(Stop::Error(e)) => return error_outcome(e, context).discarding(),
                }
                match promise.state() {
                    PromiseState::Fulfilled(v) => v,
                    PromiseState::Rejected(reason) => return Outcome::fail(SandboxStatus::Error, "runtime_error", describe_value(&reason, context)),
                    PromiseState::Pending => unreachable!("drive returns only when settled"),
                }
            }
        };
        let caps = Caps { max_depth: l.max_output_depth, max_nodes: l.max_output_nodes, max_bytes: l.max_output_bytes };
        match to_json(&value, caps, context) {
            Ok(output) => Outcome::ok(output),
            Err(e) => Outcome::fail(SandboxStatus::Error, "output", format!("return value is not plain JSON data: {e}")),
        }
    }
}

/// Wrapper functions kept per realm.
const COMPILED_CACHE: usize = 32;

/// The compiled-code cache key: the allowlist as JSON (which holds no raw newline), a newline,
/// the code. A plain join was ambiguous: allowlist `["fetch\nfoo"]` with code `X` made the
/// key of allowlist `["fetch"]` with code `"foo\nX"`, which would then skip validation.
fn cache_key(request: &SandboxRequest) -> String {
    let mut key = serde_json::to_string(&request.allowlist).unwrap_or_default();
    key.push('\n');
    key.push_str(&request.code);
    key
}

/// Maps a thrown error: engine limits become `timeout`/`error` with their own codes.
fn error_outcome(error: JsError, context: &mut Context) -> Outcome {
    let message = describe_error(&error, context);
    // The engine's limits are told apart by their kind, not their text: an error message can
    // carry guest text (a property name), which must not pass for a limit.
    if let Some(EngineError::RuntimeLimit(limit)) = error.as_engine() {
        return match limit {
            RuntimeLimitError::LoopIteration => Outcome::fail(SandboxStatus::Timeout, "loop_limit", message),
            RuntimeLimitError::Recursion | RuntimeLimitError::StackSize => Outcome::fail(SandboxStatus::Error, "stack_overflow", message),
        }
        .discarding();
    }
    if error.as_opaque().is_none() && message.contains("string compilation") {
        return Outcome::fail(SandboxStatus::Error, "compile_denied", message);
    }
    Outcome::fail(SandboxStatus::Error, "runtime_error", message)
}

/// Describes an error without running guest code.
fn describe_error(error: &JsError, context: &mut Context) -> String {
    if let Some(native) = error.as_native() {
        return format!("{}: {}", native.kind(), native.message());
    }
    match error.as_opaque() {
        Some(value) => describe_value(&value.clone(), context),
        None => error.to_string(),
    }
}

/// Reads `name`/`message` own data properties of a thrown object, or prints a primitive.
fn describe_value(value: &JsValue, _context: &mut Context) -> String {
    if let Some(obj) = value.as_object() {
        if obj.is::<boa_engine::builtins::proxy::Proxy>() {
            return "a Proxy was thrown".into();
        }
        let own_string = |o: &boa_engine::JsObject, key: &str| -> Option<String> {
            let key: PropertyKey = JsString::from(key).into();
            let desc = o.borrow().properties().get(&key)?;
            desc.value().and_then(|v| v.as_string()).map(|s| s.to_std_string_lossy())
        };
        let read = |key: &str| -> Option<String> {
            // Own data property first, then up the prototype chain (bounded), where the
            // intrinsic error prototypes are recognised by identity (their `name` is tamed).
            let mut current = Some(obj.clone());
            for _ in 0..16 {
                let o = current?;
                if let Some(v) = own_string(&o, key) {
                    return Some(v);
                }
                if key == "name" {
                    if let Some(n) = intrinsic_error_name(&o, _context) {
                        return Some(n.into());
                    }
                }
                current = o.prototype();
            }
            None
        };
        let name = read("name").unwrap_or_else(|| "Error".into());
        return match read("message") {
            Some(m) => format!("{name}: {m}"),
            None => format!("uncaught {name}"),
        };
    }
    if let Some(s) = value.as_string() {
        return format!("uncaught: {}", s.to_std_string_lossy());
    }
    if let Some(n) = value.as_number() {
        return format!("uncaught: {n}");
    }
    format!("uncaught {}", value.type_of())
}

#[async_trait(?Send)]
impl SandboxRunner for BoaRunner {
    async fn execute(&self, request: &SandboxRequest) -> SandboxResult {
        let start = now_ms();
        let mut logs = Vec::new();
        let outcome = self.run(request, &mut logs).await;
        SandboxResult { status: outcome.status, output: outcome.output, error: outcome.error, logs, duration_ms: now_ms() - start }
    }
}

fn intrinsic_error_name(proto: &boa_engine::JsObject, context: &Context) -> Option<&'static str> {
    let c = context.intrinsics().constructors();
    let table = [
        (c.error().prototype(), "Error"),
        (c.type_error().prototype(), "TypeError"),
        (c.range_error().prototype(), "RangeError"),
        (c.syntax_error().prototype(), "SyntaxError"),
        (c.reference_error().prototype(), "ReferenceError"),
        (c.eval_error().prototype(), "EvalError"),
        (c.uri_error().prototype(), "URIError"),
        (c.aggregate_error().prototype(), "AggregateError"),
    ];
    table.into_iter().find(|(p, _)| boa_engine::JsObject::equals(p, proto)).map(|(_, n)| n)
}

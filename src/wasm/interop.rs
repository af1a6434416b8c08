//! Every JS ⇄ Rust conversion of the core artifact in one place: serde values, errors, and the
//! adapters implementing the core's traits over JS objects (model, tools, clock, abort).

use std::rc::Rc;

use async_trait::async_trait;
use js_sys::{Function, Object, Promise, Reflect};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

use crate::agent::{CancelSignal, Environment};
use crate::guard::OnDrop;
use crate::model::{CallInfo, ChunkSink, Model, ModelChunk, ModelError, ModelRequest};
use crate::sandbox::{SandboxFailure, SandboxRequest, SandboxResult, SandboxRunner, SandboxStatus};
use crate::store::{BatchOp, Store, StoreError, StoreLock};
use crate::tools::{CallContext, Nesting, ToolFailure, ToolHandler};

/// Longest error message copied from a JS exception (host errors can be huge).
const MAX_ERROR_MESSAGE: usize = 2000;

// Values cross the boundary as JSON text: `serde_json` on this side, the engine's native
// `JSON.parse`/`JSON.stringify` on the other. Walking an object field by field from wasm
// (serde-wasm-bindgen) costs a boundary call and a string decode per key and value, which made
// conversions the largest cost of forging and calling tools (measured: bench/forge.bench.ts).

#[wasm_bindgen]
extern "C" {
    // The engine's JSON, declared here so text crosses in one call each way (js_sys's
    // bindings hand back a `JsString` that then needs a second call to copy out). `parse`
    // only ever reads serde_json's output, which is valid JSON, so for the texts of everyday
    // values it skips the exception wrapper (a measurable share of every tool call). A long
    // text goes through `json_parse_caught` instead: past the engine's longest string
    // (2^29 - 24 units in V8), or with the engine out of memory, `JSON.parse` throws, and a
    // throw escaping the core would poison this instance.
    #[wasm_bindgen(js_namespace = JSON, js_name = parse)]
    fn json_parse(text: &str) -> JsValue;
    #[wasm_bindgen(js_namespace = JSON, js_name = parse, catch)]
    fn json_parse_caught(text: &str) -> Result<JsValue, JsValue>;
    #[wasm_bindgen(js_namespace = JSON, js_name = stringify, catch)]
    fn json_stringify(value: &JsValue) -> Result<Option<String>, JsValue>;
    // Node, browsers and workers all have it; a host without one gets `Date.now()` instead
    // (see `JsEnvironment::elapsed_ms`).
    #[wasm_bindgen(js_namespace = performance, js_name = now, catch)]
    fn performance_now() -> Result<f64, JsValue>;

    /// The host's `callTool(name, argsJson, runId, callId, sessionId)` (see [`JsTool`]).
    type HostCallTool;
    // The arguments cross as JSON text inside the call itself, not as an object parsed in a
    // call of their own.
    #[wasm_bindgen(method, js_name = call, catch)]
    fn call(
        this: &HostCallTool,
        context: &JsValue,
        name: &JsValue,
        args_json: &str,
        run_id: &JsValue,
        call_id: &JsValue,
        session_id: &JsValue,
    ) -> Result<JsValue, JsValue>;
    // The text left in JS, for values worth measuring before they are copied in.
    #[wasm_bindgen(js_namespace = JSON, js_name = stringify, catch)]
    fn json_stringify_js(value: &JsValue) -> Result<JsValue, JsValue>;
}

/// Rust → JS with JSON semantics (maps become plain objects).
pub(crate) fn to_js<T: Serialize + ?Sized>(value: &T) -> Result<JsValue, JsValue> {
    let text = serde_json::to_string(value).map_err(|e| error_object("internal", &format!("serialization failed: {e}")))?;
    if text.len() < UNCAUGHT_PARSE_BYTES {
        return Ok(json_parse(&text));
    }
    json_parse_caught(&text)
        .map_err(|e| error_object("internal", &format!("the engine could not read a value of {} bytes of JSON: {}", text.len(), describe_thrown(&e).1)))
}

/// Longest JSON text [`to_js`] hands to `JSON.parse` without the exception wrapper: far below
/// the engine's longest string, and above the values of everyday calls, so only the rare huge
/// value (a session history of many large tool results) pays for the wrapper.
const UNCAUGHT_PARSE_BYTES: usize = 1 << 20;

/// JS → Rust with `JSON.stringify` semantics: `undefined` is `null`, `toJSON` is honoured,
/// object fields that are `undefined` or functions are left out. A value with no JSON form
/// (a function, a `BigInt`, a cycle) is an error.
pub(crate) fn decode<T: DeserializeOwned>(value: &JsValue) -> Result<T, String> {
    let text = if value.is_undefined() {
        "null".to_string()
    } else {
        json_stringify(value).map_err(|e| unwritable(&e))?.ok_or_else(|| "the value has no JSON form".to_string())?
    };
    serde_json::from_str(&crate::js_json::well_formed(&text)).map_err(|e| e.to_string())
}

/// Why [`decode_bounded`] read no value.
pub(crate) enum Unread {
    /// Its JSON text is this many UTF-16 units, past the bound: left in JS.
    TooLong(usize),
    /// It has no JSON form (a cycle, a `BigInt`), or its text did not parse.
    Unreadable(String),
}

/// [`decode`] of a value whose JSON text is measured before it is copied in, and refused past
/// `max_units` UTF-16 units: wasm memory never shrinks, so a 500 MB forge request, refused as
/// too large only once read, would keep this instance (every agent of the process) that large
/// for good. Costs a second call across the boundary, so the values that are small by nature
/// (options, chunks) go through [`decode`].
pub(crate) fn decode_bounded<T: DeserializeOwned>(value: &JsValue, max_units: usize) -> Result<T, Unread> {
    if value.is_undefined() {
        return decode(value).map_err(Unread::Unreadable);
    }
    let text = json_stringify_js(value).map_err(|e| Unread::Unreadable(unwritable(&e)))?;
    let text = text.dyn_ref::<js_sys::JsString>().ok_or_else(|| Unread::Unreadable("the value has no JSON form".to_string()))?;
    let units = text.length() as usize;
    if units > max_units {
        return Err(Unread::TooLong(units));
    }
    serde_json::from_str(&crate::js_json::well_formed(&String::from(text))).map_err(|e| Unread::Unreadable(e.to_string()))
}

/// Why `JSON.stringify` refused a value, in words. The engine says "Maximum call stack size
/// exceeded" for a value nested past its own depth limit, which reads like this instance's
/// stack overflowing, and "Invalid string length" for one too large for a string.
fn unwritable(thrown: &JsValue) -> String {
    let message = describe_thrown(thrown).1;
    if !thrown.is_instance_of::<js_sys::RangeError>() {
        return message;
    }
    if message.contains("call stack") {
        "the value nests too deeply to be read as JSON".to_string()
    } else if message.contains("string length") {
        "the value is too large to be read as JSON".to_string()
    } else {
        message
    }
}

/// JS → Rust for arguments of the exported API (`what` names the argument in the error).
pub(crate) fn from_js<T: DeserializeOwned>(value: JsValue, what: &str) -> Result<T, JsValue> {
    from_js_as(value, what, "invalid_config")
}

/// [`from_js`] failing with `code`: a method's argument (`invalid_argument`), or a tool call's
/// arguments (`invalid_arguments`, the code of the call's failure), rather than an option.
pub(crate) fn from_js_as<T: DeserializeOwned>(value: JsValue, what: &str, code: &str) -> Result<T, JsValue> {
    decode(&value).map_err(|e| {
        // serde_json's own words name a limit the caller never set, at a column of text it never wrote.
        let e = if e.starts_with("recursion limit exceeded") { TOO_DEEP.to_string() } else { e };
        error_object(code, &format!("{what}: {e}"))
    })
}

/// Why a value nested past what the core reads is refused: a JSON Schema reaches it at ~60
/// levels of `properties`.
const TOO_DEEP: &str =
    "nests arrays and objects more than 127 levels deep (as JSON), past what the core reads; a JSON Schema does at about 60 levels of `properties`";

/// [`from_js_as`] for a value the host already wrote with `JSON.stringify` (and measured:
/// `MAX_UNITS_INTO_CORE` in npm/src/agent/json-into-core.ts).
pub(crate) fn from_json_text<T: DeserializeOwned>(text: &str, what: &str, code: &str) -> Result<T, JsValue> {
    serde_json::from_str(&crate::js_json::well_formed(text)).map_err(|e| error_object(code, &format!("{what}: {e}")))
}

/// A plain `{ code, message }` object; the TS layer turns it into a typed error class.
pub(crate) fn error_object(code: &str, message: &str) -> JsValue {
    let obj = Object::new();
    let _ = Reflect::set(&obj, &"code".into(), &code.into());
    let _ = Reflect::set(&obj, &"message".into(), &message.into());
    obj.into()
}

fn bounded(mut s: String) -> String {
    if s.len() > MAX_ERROR_MESSAGE {
        let mut cut = MAX_ERROR_MESSAGE;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

fn string_field(obj: &JsValue, name: &str) -> Option<String> {
    Reflect::get(obj, &name.into()).ok().and_then(|v| v.as_string())
}

/// `(code, message, status)` of a thrown JS value, whatever it is.
fn describe_thrown(err: &JsValue) -> (Option<String>, String, Option<u16>) {
    let code = string_field(err, "code");
    let message = string_field(err, "message").or_else(|| err.as_string()).unwrap_or_else(|| "unknown error".into());
    let status = Reflect::get(err, &"status".into()).ok().and_then(|v| v.as_f64()).map(|n| n as u16);
    (code, bounded(message), status)
}

/// Awaits `value` as `await` would: a native promise directly, anything else through
/// `Promise.resolve` (thenables are adopted, plain values settle at once).
async fn await_promise(value: JsValue) -> Result<JsValue, JsValue> {
    let promise = match value.dyn_into::<Promise>() {
        Ok(promise) => promise,
        Err(other) => Promise::resolve(&other),
    };
    JsFuture::from(promise).await
}

/// The JS side of a model: `{ id: string, stream(request, runId): AsyncIterator<ModelChunk> }`.
pub(crate) struct JsModel {
    id: String,
    target: JsValue,
    stream: Function,
}

impl JsModel {
    pub(crate) fn new(target: JsValue) -> Result<Self, JsValue> {
        let id = string_field(&target, "id").ok_or_else(|| error_object("invalid_config", "model.id must be a string"))?;
        let stream =
            Reflect::get(&target, &"stream".into())?.dyn_into::<Function>().map_err(|_| error_object("invalid_config", "model.stream must be a function"))?;
        Ok(Self { id, target, stream })
    }
}

#[async_trait(?Send)]
impl Model for JsModel {
    fn id(&self) -> String {
        self.id.clone()
    }

    async fn stream(&self, request: &ModelRequest, call: &CallInfo, sink: &mut dyn ChunkSink) -> Result<(), ModelError> {
        let to_model_error = |e: JsValue| {
            let (code, message, status) = describe_thrown(&e);
            ModelError::from_provider(code, message, status)
        };
        let js_request = to_js(request).map_err(to_model_error)?;
        let iterator = self.stream.call2(&self.target, &js_request, &JsValue::from_str(&call.run_id)).map_err(to_model_error)?;
        let next = method_of(&iterator, "next").ok_or_else(|| ModelError::new("provider_protocol", "model.stream did not return an async iterator"))?;
        let (done_key, value_key) = (JsValue::from_str("done"), JsValue::from_str("value"));
        // A stream dropped before its end (the forge or run awaiting it was aborted, or the
        // answer outgrew its bounds) is closed: `iterator.return()` lets the provider cancel
        // its response body instead of reading on. A rejection of that call is nobody's.
        let closing = iterator.clone();
        let mut open = OnDrop::new(move || {
            if let Some(Ok(returned)) = method_of(&closing, "return").map(|close| close.call0(&closing)) {
                then_quietly(&returned, &JsValue::UNDEFINED);
            }
        });
        loop {
            let step = await_promise(next.call0(&iterator).map_err(to_model_error)?).await.map_err(to_model_error)?;
            if Reflect::get(&step, &done_key).ok().and_then(|d| d.as_bool()).unwrap_or(false) {
                open.disarm();
                return Ok(());
            }
            let value = Reflect::get(&step, &value_key).map_err(to_model_error)?;
            let chunk: ModelChunk = decode(&value).map_err(|e| ModelError::new("provider_protocol", format!("malformed model chunk: {e}")))?;
            sink.chunk(&chunk);
            if sink.stopped() {
                // `open` is dropped unfinished: the provider is told to stop reading.
                return Ok(());
            }
        }
    }
}

/// `target[name]` when it is a function.
pub(crate) fn method_of(target: &JsValue, name: &str) -> Option<Function> {
    Reflect::get(target, &name.into()).ok().and_then(|f| f.dyn_into::<Function>().ok())
}

/// `promise.then(on_fulfilled)` with a rejection swallowed: whoever would have handled it is
/// gone. A value that is not a promise is left alone.
fn then_quietly(promise: &JsValue, on_fulfilled: &JsValue) {
    if let Some(then) = method_of(promise, "then") {
        IGNORE.with(|ignore| {
            let _ = then.call2(promise, on_fulfilled, ignore.as_ref());
        });
    }
}

thread_local! {
    /// A handler that ignores its argument, made once for every rejection swallowed.
    static IGNORE: Closure<dyn FnMut(JsValue)> = Closure::new(|_: JsValue| {});
}

/// The host's check of a final answer: `checkOutput(value, runId)` gives nothing when it
/// passes and the reason (a string) when the answer is wrong, or a promise of either; what it
/// throws is its own failure, not the model's.
pub(crate) struct JsOutputCheck(pub(crate) Function);

#[async_trait(?Send)]
impl crate::agent::OutputCheck for JsOutputCheck {
    async fn check(&self, value: &Value, run_id: &str) -> Result<(), crate::agent::OutputRefusal> {
        use crate::agent::OutputRefusal;
        let js_value = to_js(value).map_err(|e| OutputRefusal::Failed(describe_thrown(&e).1))?;
        let verdict = match self.0.call2(&JsValue::NULL, &js_value, &JsValue::from_str(run_id)) {
            Ok(returned) => await_promise(returned).await,
            Err(thrown) => Err(thrown),
        };
        match verdict {
            Ok(v) if v.is_undefined() || v.is_null() => Ok(()),
            Ok(v) => Err(OutputRefusal::Refused(v.as_string().unwrap_or_else(|| "the answer was refused by the host's check".into()))),
            Err(thrown) => Err(OutputRefusal::Failed(describe_thrown(&thrown).1)),
        }
    }
}

/// Whether a host tool's calls wait for a human decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ApprovalMode {
    Never,
    Always,
    /// Ask the TS predicate: `checkApproval(name, args) => boolean | Promise<boolean>`.
    Predicate,
}

/// A host tool: the TS side's `callTool(name, argsJson, runId, callId, sessionId)`, which
/// returns the JSON text of the tool's value (or `undefined`), or a native `Promise` of it. The
/// host bounds that text (16 Mi UTF-16 units) before it returns it: what it returns is copied
/// into this instance's memory, which never shrinks.
pub(crate) struct JsTool {
    call_tool: Rc<Function>,
    approval: ApprovalMode,
    check_approval: Rc<Function>,
    /// The tool's name as a JS string, made once (each new JS string is a UTF-8 decode across
    /// the boundary).
    js_name: JsValue,
    ids: Rc<JsCallIds>,
}

impl JsTool {
    pub(crate) fn new(name: &str, call_tool: Rc<Function>, approval: ApprovalMode, check_approval: Rc<Function>, ids: Rc<JsCallIds>) -> Self {
        Self { call_tool, approval, check_approval, js_name: JsValue::from_str(name), ids }
    }
}

/// The run, call and session ids last passed to a host tool, as JS strings, shared by an
/// agent's host tools: they repeat from call to call, and the steps of one pipeline call pass
/// the same call id to different tools, so each is decoded across the boundary once.
#[derive(Default)]
pub(crate) struct JsCallIds {
    run: JsStringCache,
    call: JsStringCache,
    session: JsStringCache,
}

/// The JS string of the last Rust string asked for.
#[derive(Default)]
struct JsStringCache(std::cell::RefCell<Option<(String, JsValue)>>);

impl JsStringCache {
    fn get(&self, s: &str) -> JsValue {
        let mut last = self.0.borrow_mut();
        if let Some((text, value)) = last.as_mut() {
            if text != s {
                // A new id most calls (call ids): the text's buffer is reused.
                text.clear();
                text.push_str(s);
                *value = JsValue::from_str(s);
            }
            return value.clone();
        }
        let value = JsValue::from_str(s);
        *last = Some((s.to_string(), value.clone()));
        value
    }
}

/// How many bytes of a host tool's JSON text (`JSON.stringify`) may stand for one byte of the
/// JSON the executor measures at most, rounded up (see `JsTool::call`).
const HOST_TEXT_PER_JSON_BYTE: usize = 6;

thread_local! {
    /// The nesting of the host tool running on this stack right now (inside its call).
    static HOST_TOOL_NESTING: std::cell::RefCell<Nesting> = std::cell::RefCell::default();
}

/// What a direct tool call made now continues (see `Registry::call_as`): the nesting of the
/// host tool running on this stack, when it calls back into the agent before its first await.
/// Without it, a host tool calling a forged pipeline over itself recursed until the JS stack
/// ran out, and the `RangeError` unwound through the core's frames without their cleanup.
pub(crate) fn host_tool_nesting() -> Nesting {
    HOST_TOOL_NESTING.with(|n| n.borrow().clone())
}

#[async_trait(?Send)]
impl ToolHandler for JsTool {
    async fn call(&self, args: Value, ctx: &CallContext) -> Result<Value, ToolFailure> {
        // The host's own codes that mean what they say here: its abort, a Standard Schema
        // refusing the arguments or the result (see `tool()`), a result past the bound the
        // host enforces (see `MAX_UNITS_INTO_CORE` in agent.ts), and a call back into the
        // agent past its bound on calls waiting (`too_many_calls`, which then fails every
        // call it is nested in alike); anything else failed executing.
        let failure = |e: JsValue| {
            let (code, message, _) = describe_thrown(&e);
            let code = code.filter(|c| matches!(c.as_str(), "aborted" | "invalid_arguments" | "invalid_output" | "result_too_large" | "too_many_calls"));
            ToolFailure::new(code.unwrap_or_else(|| "execution_failed".into()), message)
        };
        let args_json = serde_json::to_string(&args).map_err(|e| ToolFailure::new("execution_failed", format!("the arguments could not be written: {e}")))?;
        let ids = &self.ids;
        let (run, call, session) = (ids.run.get(&ctx.run_id), ids.call.get(&ctx.call_id), ids.session.get(&ctx.session_id));
        let outer = HOST_TOOL_NESTING.with(|n| n.replace(ctx.nesting()));
        let returned = self.call_tool.unchecked_ref::<HostCallTool>().call(&JsValue::NULL, &self.js_name, &args_json, &run, &call, &session);
        HOST_TOOL_NESTING.with(|n| *n.borrow_mut() = outer);
        let returned = returned.map_err(failure)?;
        // A synchronous tool's text is read in the call that also tells it is text: no promise
        // round trip, and no other question across the boundary (each is a call out to JS).
        let text = match returned.as_string() {
            Some(text) => text,
            None => {
                let settled = match returned.dyn_into::<Promise>() {
                    Ok(promise) => JsFuture::from(promise).await.map_err(failure)?,
                    Err(value) => value,
                };
                match settled.as_string() {
                    Some(text) => text,
                    None if settled.is_undefined() => return Ok(Value::Null),
                    None => return Err(ToolFailure::new("execution_failed", "the host returned something other than JSON text")),
                }
            }
        };
        // Refused before it is parsed, where parsing would take many times its length in memory
        // that never shrinks, only for the executor to refuse it (see `execute_call`). The
        // host's text is at most 5.25 times the JSON the executor measures, so past six times
        // the limit it is past the limit: JS writes numbers below 1e21 in full, and serde_json
        // writes 1e20 back in 4 characters for its 21; a lone surrogate's escape is six bytes
        // for U+FFFD's three; everything else is written alike.
        if let Some(limit) = ctx.result_limit.filter(|limit| text.len() / HOST_TEXT_PER_JSON_BYTE > *limit) {
            let name = self.js_name.as_string().unwrap_or_default();
            return Err(crate::tools::result_too_large(&name, &format!("{} bytes of JSON text", text.len()), limit));
        }
        serde_json::from_str(&crate::js_json::well_formed(&text)).map_err(|e| match crate::tools::is_too_deep(&e) {
            true => ToolFailure::new("execution_failed", "the tool's result nests arrays and objects more than 127 levels deep"),
            false => ToolFailure::new("execution_failed", format!("the host returned malformed JSON text: {e}")),
        })
    }

    async fn approval_arguments(&self, args: &Value) -> Option<Value> {
        let js_args = to_js(args).ok()?;
        // `checkApproval(name, args, true)`: the arguments `execute` gets, or `undefined` when
        // they are the model's (a tool without a Standard Schema) or cannot be shown as JSON.
        let shown = self.check_approval.call3(&JsValue::NULL, &self.js_name, &js_args, &JsValue::TRUE).ok()?;
        let shown = await_promise(shown).await.ok()?;
        if shown.is_undefined() || shown.is_null() {
            return None;
        }
        decode::<Value>(&shown).ok()
    }

    fn may_need_approval(&self) -> bool {
        !matches!(self.approval, ApprovalMode::Never)
    }

    async fn needs_approval(&self, args: &Value) -> bool {
        match self.approval {
            ApprovalMode::Never => false,
            ApprovalMode::Always => true,
            // A predicate that throws or returns garbage asks for approval: fail closed.
            ApprovalMode::Predicate => {
                let Ok(js_args) = to_js(args) else { return true };
                match self.check_approval.call2(&JsValue::NULL, &self.js_name, &js_args) {
                    Ok(v) => await_promise(v).await.ok().and_then(|v| v.as_bool()).unwrap_or(true),
                    Err(_) => true,
                }
            }
        }
    }
}

/// A TS `Store` (`get`, `put`, `delete`, `scan`, `batch`, each returning a promise).
pub(crate) struct JsStore {
    target: JsValue,
    /// The host's number for this JS store object: agents given the same object share it (each
    /// agent has a `JsStore` of its own around it). See [`Store::data_key`].
    data_key: usize,
}

impl JsStore {
    pub(crate) fn new(target: JsValue, data_key: usize) -> Result<Self, JsValue> {
        for method in ["get", "put", "delete", "scan", "batch"] {
            if !Reflect::get(&target, &method.into()).map(|f| f.is_function()).unwrap_or(false) {
                return Err(error_object("invalid_config", &format!("store.{method} must be a function")));
            }
        }
        Ok(Self { target, data_key })
    }

    /// The store's method `name`, when it has one.
    fn method(&self, name: &str) -> Option<Function> {
        method_of(&self.target, name)
    }

    async fn call(&self, method: &str, args: &[JsValue]) -> Result<JsValue, StoreError> {
        let f = self.method(method).ok_or_else(|| StoreError::new("store_error", format!("store.{method} is not a function")))?;
        self.apply(&f, args).await
    }

    async fn apply(&self, f: &Function, args: &[JsValue]) -> Result<JsValue, StoreError> {
        let array = js_sys::Array::new();
        for a in args {
            array.push(a);
        }
        let returned = f.apply(&self.target, &array).map_err(to_store_error)?;
        await_promise(returned).await.map_err(to_store_error)
    }
}

/// The store failure codes the package defines (its `CrucibleErrorCode`, which types the codes
/// events carry): a store of the host's own throwing another is `store_error`.
const STORE_CODES: [&str; 4] = ["store_error", "store_quota", "store_blocked", "store_corrupt"];

fn to_store_error(e: JsValue) -> StoreError {
    let (code, message, _) = describe_thrown(&e);
    StoreError::new(code.filter(|c| STORE_CODES.contains(&c.as_str())).unwrap_or_else(|| "store_error".into()), message)
}

fn store_encoding_error(e: JsValue) -> StoreError {
    let (_, message, _) = describe_thrown(&e);
    StoreError::new("store_error", message)
}

#[async_trait(?Send)]
impl Store for JsStore {
    async fn get(&self, key: &str) -> Result<Option<Value>, StoreError> {
        let v = self.call("get", &[key.into()]).await?;
        if v.is_undefined() || v.is_null() {
            return Ok(None);
        }
        decode(&v).map(Some).map_err(|e| StoreError::new("store_corrupt", e))
    }

    async fn put(&self, key: &str, value: Value) -> Result<(), StoreError> {
        let js_value = to_js(&value).map_err(store_encoding_error)?;
        // Not held while the store answers: a write an abort left out may wait a long time.
        drop(value);
        self.call("put", &[key.into(), js_value]).await.map(|_| ())
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.call("delete", &[key.into()]).await.map(|_| ())
    }

    async fn scan(&self, prefix: &str) -> Result<Vec<(String, Value)>, StoreError> {
        let v = self.call("scan", &[prefix.into()]).await?;
        decode(&v).map_err(|e| StoreError::new("store_corrupt", e))
    }

    async fn batch(&self, ops: Vec<BatchOp>) -> Result<(), StoreError> {
        self.call("batch", &[to_js(&ops).map_err(store_encoding_error)?]).await.map(|_| ())
    }

    /// The TS store's optional `lock(name) => Promise<release>` (`indexedDbStore`: Web Locks).
    async fn lock(&self, name: &str) -> Result<Option<StoreLock>, StoreError> {
        let Some(lock) = self.method("lock") else { return Ok(None) };
        let returned = lock.call1(&self.target, &name.into()).map_err(to_store_error)?;
        let granted_to = Promise::resolve(&returned);
        // If the wait is dropped (the flush holding it was abandoned with its caller), the lock
        // is released as soon as it is granted: a Web Lock nobody releases would block every
        // later holder, in every tab.
        let pending = granted_to.clone();
        let mut request = OnDrop::new(move || {
            let release_when_granted = Closure::once_into_js(|release: JsValue| {
                if let Some(release) = release.dyn_ref::<Function>() {
                    let _ = release.call0(&JsValue::NULL);
                }
            });
            then_quietly(&pending, &release_when_granted);
        });
        let release = JsFuture::from(granted_to).await.map_err(to_store_error);
        request.disarm();
        let release = release?;
        Ok(Some(StoreLock::new(move || {
            if let Some(release) = release.dyn_ref::<Function>() {
                let _ = release.call0(&JsValue::NULL);
            }
        })))
    }

    /// The TS store's optional `tryLock(name) => Promise<release | undefined>`: the lock is
    /// held when it is not given; when it is, it is given back at once.
    async fn lock_held(&self, name: &str) -> Result<bool, StoreError> {
        let Some(try_lock) = self.method("tryLock") else { return Ok(false) };
        let returned = try_lock.call1(&self.target, &name.into()).map_err(to_store_error)?;
        let release = await_promise(returned).await.map_err(to_store_error)?;
        match release.dyn_ref::<Function>() {
            Some(release) => {
                release.call0(&JsValue::NULL).map_err(to_store_error)?;
                Ok(false)
            }
            None => Ok(true),
        }
    }

    fn data_key(&self) -> usize {
        self.data_key
    }
}

/// Timestamps from `Date.now()`, durations from `performance.now()`; ids from a counter plus a random salt per instance (ids must not
/// collide across page reloads and processes sharing one store: a pending approval's record
/// is keyed by its id). 64 random bits: with 24, two of a few thousand restarts would likely
/// share a salt.
pub(crate) struct JsEnvironment {
    counter: std::cell::Cell<u64>,
    salt: String,
}

impl JsEnvironment {
    pub(crate) fn new() -> Self {
        let word = || (js_sys::Math::random() * 4_294_967_296.0) as u32;
        Self { counter: std::cell::Cell::new(0), salt: format!("{:08x}{:08x}", word(), word()) }
    }
}

impl Environment for JsEnvironment {
    fn now_ms(&self) -> f64 {
        js_sys::Date::now()
    }

    fn elapsed_ms(&self) -> f64 {
        performance_now().unwrap_or_else(|_| js_sys::Date::now())
    }

    fn new_id(&self, prefix: &str) -> String {
        let n = self.counter.get() + 1;
        self.counter.set(n);
        // Pushed, not `format!`ted: its machinery for three pieces was 2% of a direct compose
        // call (profiled); one integer's `to_string` is the cheap part.
        let digits = n.to_string();
        let mut id = String::with_capacity(prefix.len() + 1 + self.salt.len() + digits.len());
        id.push_str(prefix);
        id.push('_');
        id.push_str(&self.salt);
        id.push_str(&digits);
        id
    }

    /// On the JS microtask queue: the task goes on after the call that spawned it returned.
    fn spawn_local(&self, task: crate::agent::LocalTask) -> Result<(), crate::agent::LocalTask> {
        wasm_bindgen_futures::spawn_local(task);
        Ok(())
    }
}

/// The run's `AbortSignal`: polled between turns, awaited beside a step's tool calls.
pub(crate) struct JsAbortSignal(pub(crate) web_sys::AbortSignal);

/// Removes the `abort` listener when the wait is dropped (the calls finished first), so a
/// long-lived signal does not collect one listener per step, and settles the wait's promise:
/// a `JsFuture` frees its two callbacks only when its promise settles, so one left pending for
/// good (a signal never aborted) kept them, and what they hold, for every wait of every turn.
struct AbortListener {
    signal: web_sys::AbortSignal,
    /// The promise's `resolve`.
    listener: Function,
}

impl Drop for AbortListener {
    fn drop(&mut self) {
        let _ = self.signal.remove_event_listener_with_callback("abort", &self.listener);
        let _ = self.listener.call0(&JsValue::UNDEFINED);
    }
}

impl CancelSignal for JsAbortSignal {
    fn is_cancelled(&self) -> bool {
        self.0.aborted()
    }

    fn cancelled(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + '_>> {
        if self.0.aborted() {
            return Box::pin(std::future::ready(()));
        }
        let mut resolve_on_abort: Option<Function> = None;
        // The executor runs synchronously, so `resolve` is known when `new` returns.
        let promise = Promise::new(&mut |resolve, _reject| resolve_on_abort = Some(resolve));
        let guard = resolve_on_abort.and_then(|listener| {
            self.0.add_event_listener_with_callback("abort", &listener).ok()?;
            Some(AbortListener { signal: self.0.clone(), listener })
        });
        Box::pin(async move {
            match guard {
                Some(_listening) => {
                    let _ = JsFuture::from(promise).await;
                }
                // No listener could be added: the loop's checks between turns still stop it.
                None => std::future::pending::<()>().await,
            }
        })
    }
}

/// The symbol under which `createSandbox()` offers its JSON fast path (`npm/src/sandbox`):
/// `(requestJson) => { result: Promise<string>, cancel() }`. The request and the result cross
/// as the JSON text the Worker reads and writes anyway, instead of being parsed into objects
/// and stringified again on each side, and no `AbortController` is made per execution.
const EXECUTE_JSON: &str = "crucible.sandbox.executeJson";

/// The TS sandbox host (`createSandbox()`): `{ execute(request, { signal }) =>
/// Promise<SandboxResult> }`, and our own pool's JSON fast path when it has one. Forged code
/// runs there, in a Worker, never in this instance (DESIGN decision 2).
pub(crate) struct JsSandbox {
    target: JsValue,
    execute: Function,
    execute_json: Option<Function>,
}

impl JsSandbox {
    pub(crate) fn new(target: JsValue) -> Result<Self, JsValue> {
        let execute = Reflect::get(&target, &"execute".into())?
            .dyn_into::<Function>()
            .map_err(|_| error_object("invalid_config", "sandbox.execute must be a function"))?;
        let execute_json = Reflect::get(&target, &js_sys::Symbol::for_(EXECUTE_JSON)).ok().and_then(|f| f.dyn_into::<Function>().ok());
        Ok(Self { target, execute, execute_json })
    }

    /// Starts `request` on the host: the promise of its result, and what cancels it if the
    /// core stops waiting (the host frees its Worker instead of running on to the deadline).
    fn start(&self, request: &SandboxRequest) -> Result<(JsValue, OnDrop), JsValue> {
        if let Some(execute_json) = &self.execute_json {
            let text = serde_json::to_string(request).map_err(|e| JsValue::from_str(&e.to_string()))?;
            let handle = execute_json.call1(&self.target, &JsValue::from_str(&text))?;
            let cancel = method_of(&handle, "cancel").ok_or_else(|| JsValue::from_str("the sandbox's JSON fast path returned no { result, cancel } handle"))?;
            let target = handle.clone();
            let guard = OnDrop::new(move || drop(cancel.call0(&target)));
            return Ok((Reflect::get(&handle, &"result".into())?, guard));
        }
        let js_request = to_js(request)?;
        let options = Object::new();
        let guard = match web_sys::AbortController::new() {
            Ok(controller) => {
                Reflect::set(&options, &"signal".into(), &controller.signal())?;
                OnDrop::new(move || controller.abort())
            }
            Err(_) => OnDrop::none(),
        };
        Ok((self.execute.call2(&self.target, &js_request, &options)?, guard))
    }
}

#[async_trait(?Send)]
impl SandboxRunner for JsSandbox {
    async fn execute(&self, request: &SandboxRequest) -> SandboxResult {
        let failed = |e: JsValue| {
            let (_, message, _) = describe_thrown(&e);
            SandboxResult {
                status: SandboxStatus::Error,
                output: None,
                error: Some(SandboxFailure { code: "sandbox_host".into(), message }),
                logs: vec![],
                duration_ms: 0.0,
            }
        };
        let malformed = |e: String| failed(JsValue::from_str(&format!("malformed sandbox result: {e}")));
        let (returned, mut cancel) = match self.start(request) {
            Ok(started) => started,
            Err(e) => return failed(e),
        };
        let settled = await_promise(returned).await;
        cancel.disarm();
        match settled {
            Ok(v) => match v.as_string() {
                // The fast path's result is the Worker's JSON text.
                Some(text) if self.execute_json.is_some() => serde_json::from_str(&text).unwrap_or_else(|e| malformed(e.to_string())),
                _ => decode(&v).unwrap_or_else(malformed),
            },
            Err(e) => failed(e),
        }
    }
}

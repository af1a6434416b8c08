//! Exports of the emergent-capabilities API on `CoreAgent`: forge, registry calls, promotion,
//! approvals, export/import. Each method only converts values and delegates to
//! [`crate::registry::Registry`].

use std::rc::Rc;

use js_sys::{Function, Promise};
use serde_json::Value;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use crate::agent::{unless_cancelled, AgentEvent, CancelSignal, Environment, EventSink};
use crate::forge::MAX_REQUEST_TEXT_BYTES;
use crate::registry::{oversized_package, EmergentConfig, ImportOptions, Judges, Registry, RegistryDeps, RegistryError, Tier};
use crate::store::{MemoryStore, Store};
use crate::tools::ToolSet;

use super::core::{registry_error, CoreAgent};
use super::interop::{
    decode_bounded, error_object, from_js, from_js_as, from_json_text, host_tool_nesting, method_of, to_js, JsAbortSignal, JsModel, JsSandbox, Unread,
};

/// Forwards registry events to the TS listener. `is_observed(runId)` is asked first: turning
/// an event into a JS object costs more than the question, and forges emit five.
struct JsEventSink {
    listener: Function,
    is_observed: Option<Function>,
}

impl EventSink for JsEventSink {
    fn emit(&mut self, event: AgentEvent) {
        if let Some(is_observed) = &self.is_observed {
            if is_observed.call1(&JsValue::NULL, &event.run_id.as_str().into()).ok().and_then(|v| v.as_bool()) == Some(false) {
                return;
            }
        }
        if let Ok(js) = to_js(&event) {
            let _ = self.listener.call1(&JsValue::NULL, &js);
        }
    }
}

fn field(obj: &JsValue, name: &str) -> Option<JsValue> {
    js_sys::Reflect::get(obj, &name.into()).ok().filter(|v| !v.is_undefined() && !v.is_null())
}

/// Builds the registry from the TS `emergent` object (see `CoreAgent::create`).
pub(super) async fn load_registry(
    emergent: JsValue,
    store: Option<Rc<dyn Store>>,
    env: Rc<dyn Environment>,
    agent_id: &str,
    host_tools: ToolSet,
) -> Result<Rc<Registry>, JsValue> {
    let config: EmergentConfig = match field(&emergent, "config") {
        Some(c) => from_js(c, "emergent")?,
        None => EmergentConfig::default(),
    };
    let judge = field(&emergent, "judge").map(JsModel::new).transpose()?.map(|m| Rc::new(m) as _);
    let promotion_judge = field(&emergent, "promotionJudge").map(JsModel::new).transpose()?.map(|m| Rc::new(m) as _);
    let sandbox = field(&emergent, "sandbox").map(JsSandbox::new).transpose()?.map(|s| Rc::new(s) as _);
    // Without a store the registry still works, for this process only.
    let store = store.unwrap_or_else(|| Rc::new(MemoryStore::new()));
    let deps = RegistryDeps { store, env, sandbox, judges: Judges { judge, promotion_judge } };
    let registry = Registry::load(config, deps, agent_id).await.map_err(registry_error)?;
    if let Some(listener) = method_of(&emergent, "onEvent") {
        let is_observed = method_of(&emergent, "isObserved");
        registry.set_event_sink(Box::new(JsEventSink { listener, is_observed }));
    }
    registry.set_host_tools(host_tools);
    if let Some(run_id) = field(&emergent, "backgroundRunId").and_then(|id| id.as_string()) {
        registry.set_background_run_id(&run_id);
    }
    Ok(registry)
}

/// `future`'s value as JSON text when it is ready at once (a call that never waits: a
/// sandbox-free pipeline of synchronous host tools), its error thrown; otherwise a promise of
/// its value, which continues in the microtask queue. Polling first with a no-op waker is
/// sound: every poll registers the current waker, and the queue polls again with a real one.
fn text_now_or_promise(future: impl std::future::Future<Output = Result<Value, JsValue>> + 'static) -> Result<JsValue, JsValue> {
    let mut future = Box::pin(future);
    match future.as_mut().poll(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
        // Text, not an object: the host parses it where it makes the call's promise, so a
        // call that finished costs no calls out to JS for JSON.parse and Promise.resolve.
        std::task::Poll::Ready(Ok(value)) => {
            serde_json::to_string(&value).map(|text| JsValue::from_str(&text)).map_err(|e| error_object("internal", &e.to_string()))
        }
        std::task::Poll::Ready(Err(error)) => Err(error),
        std::task::Poll::Pending => Ok(future_to_promise(async move { to_js(&future.await?) }).into()),
    }
}

fn aborted(what: &str) -> JsValue {
    error_object("aborted", &format!("{what} was aborted"))
}

/// Why a cancellable operation (`what`) recorded nothing: the agent closed under it, or its
/// signal aborted it.
fn stopped(registry: &Registry, what: &str) -> JsValue {
    if registry.is_closed() {
        registry_error(RegistryError::Closed)
    } else {
        aborted(what)
    }
}

/// A promise of what a registry operation returns (as JSON), rejected with its error.
fn registry_promise<T: serde::Serialize>(operation: impl std::future::Future<Output = Result<T, RegistryError>> + 'static) -> Promise {
    future_to_promise(async move { to_js(&operation.await.map_err(registry_error)?) })
}

/// A promise that settles with `undefined` once a registry operation is done.
fn registry_done(operation: impl std::future::Future<Output = Result<(), RegistryError>> + 'static) -> Promise {
    future_to_promise(async move { operation.await.map(|()| JsValue::UNDEFINED).map_err(registry_error) })
}

fn parse_tier(tier: &str) -> Result<Tier, JsValue> {
    serde_json::from_value(Value::String(tier.to_string()))
        .map_err(|_| error_object("invalid_argument", &format!("unknown tier `{tier}`: use session, agent or shared")))
}

#[wasm_bindgen]
impl CoreAgent {
    fn registry(&self) -> Result<Rc<Registry>, JsValue> {
        self.registry.clone().ok_or_else(|| {
            error_object("emergent_disabled", "emergent capabilities are not enabled for this agent (createAgent({ emergent: { enabled: true } }))")
        })
    }

    /// Forges a tool. Resolves with a ForgeResult; never rejects for a bad request, not even
    /// one with no JSON form. `scope` labels the attempt.
    ///
    /// `signal` aborts it while the request is checked, tested and judged (its sandbox
    /// executions aborted, its judge's stream closed): nothing is recorded and the promise
    /// rejects with `aborted`. Once the verdict is in, the forge finishes. Its judge and the
    /// host tools its tests call get `calls_run_id` as their run id (the TS side maps it to
    /// `signal` for them).
    pub fn forge(
        &self,
        request: JsValue,
        session_id: String,
        scope: Option<String>,
        signal: Option<web_sys::AbortSignal>,
        calls_run_id: String,
    ) -> Result<Promise, JsValue> {
        let registry = self.registry()?;
        let request = decode_bounded::<Value>(&request, MAX_REQUEST_TEXT_BYTES);
        Ok(future_to_promise(async move {
            let signal = signal.map(JsAbortSignal);
            let result = match request {
                Ok(request) => {
                    let cancel = signal.as_ref().map(|s| s as &dyn CancelSignal);
                    registry.forge_cancellable(&request, &session_id, scope, cancel, &calls_run_id).await.ok_or_else(|| stopped(&registry, "the forge"))?
                }
                Err(Unread::Unreadable(problem)) => registry.reject_unreadable(&problem, &session_id, scope).await,
                Err(Unread::TooLong(units)) => registry.reject_oversized(units, &session_id, scope).await,
            };
            to_js(&result)
        }))
    }

    /// Calls a registered (forged) tool by name as the session sees it. `args_json`: the
    /// arguments' JSON text (`JSON.stringify` on the host; `undefined` reads as `null`).
    /// Returns the result's JSON text when the call finished at once (it throws its error when
    /// it failed at once), else a promise of the result.
    #[wasm_bindgen(js_name = callTool, unchecked_return_type = "string | Promise<unknown>")]
    /// `signal` aborts the call (a sandboxed tool's execution with it) and rejects with
    /// `aborted`. Host tools it reaches (a pipeline's steps) get `run_id` as their run id
    /// (`undefined`: none).
    pub fn call_tool(
        &self,
        name: String,
        args_json: Option<String>,
        session_id: String,
        signal: Option<web_sys::AbortSignal>,
        run_id: Option<String>,
    ) -> Result<JsValue, JsValue> {
        let registry = self.registry()?;
        let args: Value = from_json_text(args_json.as_deref().unwrap_or("null"), "arguments", "invalid_arguments")?;
        let nesting = host_tool_nesting();
        text_now_or_promise(async move {
            let signal = signal.map(JsAbortSignal);
            let call = registry.call_as(&name, args, &session_id, run_id.as_deref().unwrap_or(""), nesting);
            match unless_cancelled(signal.as_ref().map(|s| s as &dyn CancelSignal), call).await {
                Some(Ok(v)) => Ok(v),
                Some(Err(failure)) => Err(error_object(&failure.code, &failure.message)),
                None => Err(aborted("the tool call")),
            }
        })
    }

    /// The forged tools a session sees (ToolInfo[]).
    #[wasm_bindgen(js_name = listTools)]
    pub fn list_tools(&self, session_id: String) -> Result<JsValue, JsValue> {
        to_js(&self.registry()?.list(&session_id))
    }

    /// ForgeStats snapshot.
    #[wasm_bindgen(js_name = forgeStats)]
    pub fn forge_stats(&self) -> Result<JsValue, JsValue> {
        to_js(&self.registry()?.stats())
    }

    /// Asks to promote a tool to `tier`; shared promotions wait for `approve`. `signal` stops
    /// the review (tests re-run, panel): the promise rejects with `aborted` and nothing is
    /// recorded. Its judge and the host tools its tests call get `calls_run_id` as their run
    /// id (the TS side maps it to `signal` for them).
    #[wasm_bindgen(js_name = requestPromotion)]
    pub fn request_promotion(
        &self,
        name: String,
        tier: String,
        session_id: String,
        signal: Option<web_sys::AbortSignal>,
        calls_run_id: String,
    ) -> Result<Promise, JsValue> {
        let registry = self.registry()?;
        let tier = parse_tier(&tier)?;
        Ok(registry_promise(async move {
            let signal = signal.map(JsAbortSignal);
            let cancel = signal.as_ref().map(|s| s as &dyn CancelSignal);
            match registry.request_promotion_cancellable(&name, tier, &session_id, cancel, &calls_run_id).await {
                // Stopped by `close()`: `closed`, as a forge or import is, not an abort a caller
                // would retry.
                Err(RegistryError::Aborted(_)) if registry.is_closed() => Err(RegistryError::Closed),
                other => other,
            }
        }))
    }

    /// Re-reads the shared tier (another agent on the same store changed it).
    #[wasm_bindgen(js_name = reloadShared)]
    pub fn reload_shared(&self) -> Result<Promise, JsValue> {
        let registry = self.registry()?;
        Ok(registry_done(async move { registry.reload_shared().await }))
    }

    pub fn approve(&self, approval_id: String) -> Result<Promise, JsValue> {
        let registry = self.registry()?;
        Ok(registry_promise(async move { registry.approve(&approval_id).await }))
    }

    pub fn deny(&self, approval_id: String, reason: String) -> Result<Promise, JsValue> {
        let registry = self.registry()?;
        Ok(registry_done(async move { registry.deny(&approval_id, &reason).await }))
    }

    pub fn demote(&self, name: String, session_id: String) -> Result<Promise, JsValue> {
        let registry = self.registry()?;
        Ok(registry_promise(async move { registry.demote(&name, &session_id).await }))
    }

    pub fn rollback(&self, name: String, version: u32, session_id: String) -> Result<Promise, JsValue> {
        let registry = self.registry()?;
        Ok(registry_promise(async move { registry.rollback(&name, version, &session_id).await }))
    }

    /// A portable YAML package (`crucible.tool.v1`).
    #[wasm_bindgen(js_name = exportTool)]
    pub fn export_tool(&self, name: String, session_id: String) -> Result<String, JsValue> {
        self.registry()?.export(&name, &session_id).map_err(registry_error)
    }

    /// Imports a package into the session tier after re-verifying it (hash, tests, judge);
    /// `options`: `{ testCases? }` for a package that carries none.
    #[wasm_bindgen(js_name = importTool)]
    /// `signal` stops it while its tests and judge run: the promise rejects with `aborted` and
    /// nothing is recorded; its judge and its tests' host tools get `calls_run_id` as run id.
    pub fn import_tool(
        &self,
        package: js_sys::JsString,
        session_id: String,
        options: JsValue,
        signal: Option<web_sys::AbortSignal>,
        calls_run_id: String,
    ) -> Result<Promise, JsValue> {
        let registry = self.registry()?;
        let options: ImportOptions = if options.is_undefined() { ImportOptions::default() } else { from_js_as(options, "import options", "invalid_argument")? };
        // Measured before it is copied in, as forge requests are (see `decode_bounded`).
        if let Some(refused) = oversized_package(package.length() as usize) {
            return Ok(registry_promise(async move { Err::<(), _>(registry.refuse_import(refused, "", &session_id).await) }));
        }
        let package = String::from(package);
        Ok(future_to_promise(async move {
            let signal = signal.map(JsAbortSignal);
            let cancel = signal.as_ref().map(|s| s as &dyn CancelSignal);
            match registry.import_cancellable(&package, &session_id, &options, cancel, &calls_run_id).await {
                Ok(Some(result)) => to_js(&result),
                Ok(None) => Err(stopped(&registry, "the import")),
                Err(error) => Err(registry_error(error)),
            }
        }))
    }

    #[wasm_bindgen(js_name = pendingApprovals)]
    pub fn pending_approvals(&self) -> Result<JsValue, JsValue> {
        to_js(&self.registry()?.pending_approvals())
    }

    pub fn audit(&self) -> Result<JsValue, JsValue> {
        to_js(&self.registry()?.audit_trail())
    }

    /// Writes buffered tool stats to the store.
    #[wasm_bindgen(js_name = flushStats)]
    pub fn flush_stats(&self) -> Result<Promise, JsValue> {
        let registry = self.registry()?;
        Ok(registry_done(async move { registry.flush_stats().await }))
    }

    /// Resolves once no background work (an automatic promotion) is in flight.
    pub fn settled(&self) -> Result<Promise, JsValue> {
        let registry = self.registry()?;
        Ok(future_to_promise(async move {
            registry.settled().await;
            Ok(JsValue::UNDEFINED)
        }))
    }

    /// Stops all writes to the store, and resolves once those already out have ended.
    #[wasm_bindgen(js_name = closeWrites)]
    pub fn close_writes(&self) -> Result<Promise, JsValue> {
        let registry = self.registry()?;
        Ok(future_to_promise(async move {
            registry.close_writes().await;
            Ok(JsValue::UNDEFINED)
        }))
    }

    /// Aborts the background work in flight and starts none after (the agent is closing).
    #[wasm_bindgen(js_name = stopBackground)]
    pub fn stop_background(&self) -> Result<(), JsValue> {
        self.registry()?.stop_background();
        Ok(())
    }

    /// Whether emergent capabilities are enabled.
    #[wasm_bindgen(getter, js_name = emergentEnabled)]
    pub fn emergent_enabled(&self) -> bool {
        self.registry.is_some()
    }
}

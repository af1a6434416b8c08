//! Exports of the core artifact: `CoreAgent`, the wasm face of [`crate::agent::Agent`].

use std::rc::Rc;

use js_sys::{Function, Promise};
use serde::Deserialize;
use serde_json::Value;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use crate::agent::{Agent, AgentConfig, AgentError, AgentEvent, ApprovalDecision, Environment, RunOptions, RunState};
use crate::registry::{Registry, RegistryError};
use crate::store::Store;
use crate::tools::{is_valid_tool_name, Tool, ToolSet};

use super::emergent::load_registry;
use super::interop::{error_object, from_js, to_js, ApprovalMode, JsAbortSignal, JsCallIds, JsEnvironment, JsModel, JsOutputCheck, JsStore, JsTool};

#[wasm_bindgen(typescript_custom_section)]
const EVENT_TYPES: &'static str = r#"
/** Any JSON value. */
export type Value = null | boolean | number | string | Value[] | { [key: string]: Value };
/** An event of a run: the body, tagged by `type`, plus the run id and run path. */
export type AgentEvent = EventBody & { runId: string; runPath: string[] };
"#;

/// `{ code, message }` of a registry failure.
pub(crate) fn registry_error(e: RegistryError) -> JsValue {
    error_object(e.code(), &e.to_string())
}

/// An agent error as the TS layer's typed error object.
fn agent_error(e: AgentError) -> JsValue {
    error_object(&e.code(), &e.to_string())
}

/// A host tool's public contract, as the TS layer passes it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HostToolSpec {
    name: String,
    #[serde(default)]
    description: String,
    input_schema: Value,
    #[serde(default)]
    output_schema: Option<Value>,
    /// `true`, `false` or `"predicate"` (ask the TS side per call).
    #[serde(default)]
    needs_approval: Value,
}

/// Options of the core agent beyond [`AgentConfig`].
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct HostOptions {
    #[serde(default)]
    agent_id: Option<String>,
    /// The host's number for the store object (the same for every agent given it).
    #[serde(default)]
    store_id: usize,
}

// Talc instead of dlmalloc, the wasm default: 2,972 B smaller gzipped, which the core's size
// budget needs; forge and call latency did not change measurably.
#[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
#[global_allocator]
static ALLOCATOR: talc::wasm::WasmDynamicTalc = talc::wasm::new_wasm_dynamic_allocator();

/// The agent core. Built by the TS `createAgent`; not meant to be used directly.
#[wasm_bindgen]
#[derive(Debug)]
pub struct CoreAgent {
    pub(super) agent: Rc<Agent>,
    pub(super) registry: Option<Rc<Registry>>,
}

/// `free()` from JS (the TS `agent.close()`, once its writes ended or it gave up waiting for
/// them): the registry's work still in flight holds it alive, but must not write into records
/// a new agent of the same id may now own, nor go on holding the store's turns waiting for a
/// store that does not answer.
impl Drop for CoreAgent {
    fn drop(&mut self) {
        if let Some(registry) = &self.registry {
            registry.let_go();
        }
    }
}

#[wasm_bindgen]
impl CoreAgent {
    /// `config`: AgentConfig (camelCase); `model`: `{ id, stream(request, runId) }`;
    /// `tools`: `[{ name, description, inputSchema, outputSchema? }]`;
    /// `call_tool`: `(name, argsJson, runId, callId, sessionId) => jsonText | undefined | Promise<…>`
    /// (the JSON text of the result; a native
    /// promise: other thenables are adopted on the TS side).
    /// Builds the agent. `check_approval`: `(name, args) => boolean | Promise<boolean>` for
    /// predicate tools, and `(name, args, true) => shownArgs | undefined | Promise<…>` for the
    /// arguments a human deciding on a call is shown (those `execute` gets); `store`: a TS
    /// `Store` or `undefined`; `host`: `{ agentId }`;
    /// `emergent`: `undefined`, or `{ config, judge?, promotionJudge?, sandbox?, onEvent,
    /// backgroundRunId? }` where judges are model adapters, `sandbox` is `{ execute(request) }`,
    /// `onEvent` receives the registry's events (forge stages, promotions, approvals) and
    /// `backgroundRunId` is the run id of background work's judge and host tool calls.
    #[allow(clippy::too_many_arguments)]
    pub async fn create(
        config: JsValue,
        model: JsValue,
        tools: JsValue,
        call_tool: Function,
        check_approval: Function,
        store: JsValue,
        host: JsValue,
        emergent: JsValue,
        check_output: Option<Function>,
    ) -> Result<CoreAgent, JsValue> {
        let config: AgentConfig = from_js(config, "agent options")?;
        let host: HostOptions = if host.is_undefined() { HostOptions::default() } else { from_js(host, "agent options")? };
        let agent_id = host.agent_id.unwrap_or_else(|| "default".into());
        if !crate::store::is_valid_agent_id(&agent_id) {
            return Err(error_object(
                "invalid_config",
                &format!("agentId {agent_id:?} must be 1 to 128 characters without `/` (it names the agent's records)"),
            ));
        }
        let check_approval = Rc::new(check_approval);
        let specs: Vec<HostToolSpec> = from_js(tools, "tools")?;
        let call_tool = Rc::new(call_tool);
        let ids = Rc::new(JsCallIds::default());
        let mut set = ToolSet::new();
        for spec in specs {
            if !is_valid_tool_name(&spec.name) {
                return Err(error_object("invalid_config", &format!("tool name `{}` must match ^[A-Za-z0-9_-]{{1,64}}$", spec.name)));
            }
            if set.contains(&spec.name) {
                return Err(error_object("invalid_config", &format!("two tools are named `{}`", spec.name)));
            }
            // A model takes `Refund` and `refund` for one tool (the registry folds them alike).
            if let Some(other) = set.names().find(|n| crate::registry::same_tool_name(n, &spec.name)) {
                return Err(error_object(
                    "invalid_config",
                    &format!("tools `{other}` and `{}` differ only in case or `-` vs `_`: a model takes them for one tool", spec.name),
                ));
            }
            let approval = match &spec.needs_approval {
                Value::Bool(true) => ApprovalMode::Always,
                Value::String(s) if s == "predicate" => ApprovalMode::Predicate,
                _ => ApprovalMode::Never,
            };
            let handler = Rc::new(JsTool::new(&spec.name, call_tool.clone(), approval, check_approval.clone(), ids.clone()));
            let tool = Tool::new(&spec.name, spec.description, &spec.input_schema, spec.output_schema.as_ref(), handler)
                .map_err(|e| error_object("invalid_config", &format!("tool `{}`: {e}", spec.name)))?;
            set.insert(tool);
        }
        let env: Rc<dyn Environment> = Rc::new(JsEnvironment::new());
        let store: Option<Rc<dyn Store>> = if store.is_undefined() || store.is_null() { None } else { Some(Rc::new(JsStore::new(store, host.store_id)?)) };
        let mut agent = Agent::new(config, Rc::new(JsModel::new(model)?), set.clone(), env.clone()).map_err(agent_error)?;
        if let Some(store) = &store {
            agent = agent.with_store(store.clone(), agent_id.clone());
        }
        if let Some(check) = check_output {
            agent = agent.with_output_check(Rc::new(JsOutputCheck(check)));
        }
        let registry = if emergent.is_undefined() || emergent.is_null() { None } else { Some(load_registry(emergent, store, env, &agent_id, set).await?) };
        if let Some(registry) = &registry {
            // Checked once loaded: only the loaded config says whether `forge_tool` is offered.
            if let Err(reason) = registry.refuse_reserved_host_tools() {
                registry.close();
                return Err(error_object("invalid_config", &reason));
            }
            agent.set_tool_provider(Some(registry.clone()));
        }
        Ok(CoreAgent { agent: Rc::new(agent), registry })
    }

    /// Runs `input`, its forge attempts tagged with `scope`; calls `on_event(event)` for every
    /// event; resolves with the run output or rejects with `{ code, message }`.
    pub fn run(
        &self,
        input: String,
        run_id: String,
        session_id: Option<String>,
        scope: Option<String>,
        on_event: Function,
        signal: Option<web_sys::AbortSignal>,
    ) -> Promise {
        let agent = self.agent.clone();
        future_to_promise(async move {
            let mut emit = |event: AgentEvent| {
                if let Ok(js) = to_js(&event) {
                    // A throwing listener must not break the run.
                    let _ = on_event.call1(&JsValue::NULL, &js);
                }
            };
            let options = RunOptions { session_id, cancel: signal.map(|s| Rc::new(JsAbortSignal(s)) as _), parent_path: vec![], run_id: Some(run_id), scope };
            match agent.run(&input, options, &mut emit).await {
                Ok(out) => to_js(&out),
                Err(e) => Err(agent_error(e)),
            }
        })
    }

    /// Continues a paused or interrupted run. `state`: the run's state object, or `undefined`
    /// to load it from the store by `run_id`; `decisions`: `[{ id, approved, reason? }]`.
    pub fn resume(&self, run_id: String, state: JsValue, decisions: JsValue, on_event: Function, signal: Option<web_sys::AbortSignal>) -> Promise {
        let agent = self.agent.clone();
        future_to_promise(async move {
            let decisions: Vec<ApprovalDecision> = if decisions.is_undefined() { vec![] } else { from_js(decisions, "approvals")? };
            let mut emit = |event: AgentEvent| {
                if let Ok(js) = to_js(&event) {
                    let _ = on_event.call1(&JsValue::NULL, &js);
                }
            };
            let cancel = signal.map(|s| Rc::new(JsAbortSignal(s)) as _);
            let result = if state.is_undefined() || state.is_null() {
                agent.resume(&run_id, &decisions, cancel, &mut emit).await
            } else {
                let state: RunState = from_js(state, "state")?;
                // The host waits for the events of `run_id`: the state's run under another id
                // would run unseen (its approved calls included) and end without a final event.
                if state.run_id != run_id {
                    let wrong = format!("the state given is of run `{}`, not of `{run_id}`: pass the paused RunResult as it came", state.run_id);
                    return Err(agent_error(AgentError::InvalidResume(wrong)));
                }
                agent.resume_state(state, &decisions, cancel, &mut emit).await
            };
            match result {
                Ok(out) => to_js(&out),
                Err(e) => Err(agent_error(e)),
            }
        })
    }

    /// The runs whose state the store holds (StoredRun[]).
    #[wasm_bindgen(js_name = storedRuns)]
    pub fn stored_runs(&self) -> Promise {
        let agent = self.agent.clone();
        future_to_promise(async move {
            let runs = agent.stored_runs().await.map_err(agent_error)?;
            to_js(&runs)
        })
    }

    /// Deletes a run's stored state; resolves `true` when there was one.
    #[wasm_bindgen(js_name = discardRun)]
    pub fn discard_run(&self, run_id: String) -> Promise {
        let agent = self.agent.clone();
        future_to_promise(async move {
            let discarded = agent.discard_run(&run_id).await.map_err(agent_error)?;
            Ok(JsValue::from_bool(discarded))
        })
    }

    /// The conversation of a session so far (JSON messages).
    pub fn history(&self, session_id: String) -> Result<JsValue, JsValue> {
        to_js(&self.agent.history(&session_id))
    }

    /// Forgets a session's conversation and discards its session-tier tools.
    #[wasm_bindgen(js_name = endSession)]
    pub fn end_session(&self, session_id: String) -> Promise {
        self.agent.end_session(&session_id);
        let registry = self.registry.clone();
        future_to_promise(async move {
            if let Some(registry) = registry {
                registry.end_session(&session_id).await.map_err(registry_error)?;
            }
            Ok(JsValue::UNDEFINED)
        })
    }

    /// Names of the tools the model is offered.
    #[wasm_bindgen(js_name = toolNames)]
    pub fn tool_names(&self) -> Vec<String> {
        self.agent.tools().names().map(str::to_string).collect()
    }
}
